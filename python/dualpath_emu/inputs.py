"""Reading user-supplied files and echoing user-supplied values, within fixed bounds.

Every file a user names is opened through :func:`open_input`: only a regular file is read (a FIFO, a device
such as ``/dev/zero``, a directory or a socket is refused before a byte is read), and never more than a stated
number of bytes (:data:`MAX_SCENARIO_BYTES`, :data:`MAX_TRACE_BYTES`, :data:`MAX_LINE_BYTES`). Error messages
quote values through :func:`shorten`, so a 100,000-character value makes a one-line error."""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import BinaryIO, Final

from dualpath_emu.errors import UsageError

__all__ = [
    "MAX_LINE_BYTES", "MAX_SCENARIO_BYTES", "MAX_TRACE_BYTES", "open_input", "read_input", "short_repr", "shorten",
    "too_long_number",
]  # fmt: skip

MAX_SCENARIO_BYTES: Final = 1 << 20
MAX_TRACE_BYTES: Final = 256 << 20
"""The largest trace file read (a 4,096-agent trajectory file is about 10 MB); what it holds is kept in memory."""
MAX_LINE_BYTES: Final = 16 << 20  # The longest line of a trace file.

_SHORT: Final = 60


def shorten(text: str, limit: int = _SHORT) -> str:
    """``text`` itself if at most ``limit`` characters, else its start, an ellipsis and its length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def short_repr(value: object, limit: int = _SHORT) -> str:
    """``repr(value)``, shortened like :func:`shorten`; an integer with many digits is described, not printed."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        digits = len(str(abs(value))) if value.bit_length() < 14_000 else None  # str() of >4,300 digits raises
        size = f"{digits:,} digits" if digits is not None else f"{value.bit_length():,} bits"
        return f"{'-' if value < 0 else ''}an integer of {size}"
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}… ({len(value):,} characters)"
    return shorten(repr(value), limit)


def too_long_number(error: ValueError) -> str:
    """What a parser's ``ValueError`` for an over-long integer means, in words."""
    digits = re.search(r"value has (\d+) digits", str(error))
    count = f" ({int(digits.group(1)):,} digits)" if digits else ""
    return f"an integer of more than {sys.get_int_max_str_digits():,} digits{count}"


def open_input(path: str | Path, *, what: str, limit_bytes: int) -> BinaryIO:
    """``path`` opened if a regular file of at most ``limit_bytes`` (checked on the descriptor, no FIFO wait)."""
    source = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"{shorten(source, 200)}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{shorten(source, 200)}: is a directory, expected {what}") from None
    except (OSError, ValueError) as error:  # ValueError: a path with a NUL byte
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise UsageError(f"{shorten(source, 200)}: cannot read: {shorten(reason, 200)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _file_kind(info.st_mode)
            raise UsageError(f"{shorten(source, 200)}: is {kind}, not a regular file: expected {what}")
        if info.st_size > limit_bytes:
            raise UsageError(
                f"{shorten(source, 200)}: {info.st_size:,} bytes, more than the {limit_bytes:,} bytes read from {what}"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str | Path, *, what: str, limit_bytes: int) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit_bytes``; see :func:`open_input`)."""
    with open_input(path, what=what, limit_bytes=limit_bytes) as file:
        try:
            data = file.read(limit_bytes + 1)
        except OSError as error:
            raise UsageError(f"{shorten(str(path), 200)}: cannot read: {error.strerror or error}") from None
    if len(data) > limit_bytes:  # it grew after the check
        raise UsageError(f"{shorten(str(path), 200)}: more than the {limit_bytes:,} bytes read from {what}")
    return data


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"
