"""The exceptions of dualpath-emu.

The core's errors are created in Rust (``dualpath_emu._core``) with ``__module__ == "dualpath_emu.errors"``
and re-exported here, their stable home. Each subclass also derives from the built-in exception a caller
would expect, so ``except ValueError`` catches a bad argument."""

import errno

from dualpath_emu._core import ConfigError, CoreError, CoreIOError, InvalidArgumentError, StateError, UnknownNameError

__all__ = [
    "ConfigError", "CoreError", "CoreIOError", "BackendUnavailable", "InvalidArgumentError", "NoProgressError",
    "SecurityError", "StateError", "UnknownNameError", "UsageError", "disk_error",
]  # fmt: skip


class UsageError(Exception):
    """Bad command-line input: the CLI prints the message on one line and exits with status 2."""


class BackendUnavailable(UsageError):
    """What a backend needs is missing here: one line saying what to install, exit status 2."""


class SecurityError(UsageError):
    """A run's keys are missing, unreadable or too open, or a ZeroMQ endpoint would be open to others."""


class NoProgressError(RuntimeError):
    """A run that made no progress for ``stall_timeout_s`` emulated, stopped: one line, exit status 1."""


_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def disk_error(error: BaseException) -> UsageError | None:
    """A full or read-only file system met while writing, as a one-line :class:`UsageError`; else None."""
    if isinstance(error, OSError) and error.errno in _DISK_ERRNOS:
        where = f"{error.filename}: " if error.filename else ""
        return UsageError(f"{where}cannot write: {error.strerror or error}")
    return None
