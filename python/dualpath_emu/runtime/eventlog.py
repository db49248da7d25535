"""The canonical event log: one line per actor-system event, ``<t_ns>\\t<seq>\\t<actor>\\t<kind>\\t<summary>\\n`` (UTF-8;
backslash, tab, CR and newline in a field escaped, so each event is one line: :func:`parse_line`), and its SHA-256.
Events hold no wall-clock time, address or hash-ordered collection, so in virtual time the same scenario and seed give
the same bytes whatever ``PYTHONHASHSEED`` is."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple

__all__ = ["Event", "EventLogWriter", "event_line", "event_log_sha256", "parse_line", "read_events", "write_event_log"]


class Event(NamedTuple):
    """One event of an actor system's or a run's record; a plain tuple compares equal."""

    t_ns: int
    seq: int
    actor: str
    kind: str
    summary: str


_ESCAPES: Final = str.maketrans({"\\": "\\\\", "\t": "\\t", "\r": "\\r", "\n": "\\n"})
_UNESCAPES: Final = {"\\": "\\", "t": "\t", "r": "\r", "n": "\n"}


def _escape(field: str) -> str:
    return field.translate(_ESCAPES)


def _unescape(field: str) -> str:
    if "\\" not in field:
        return field
    out: list[str] = []
    chars = iter(field)
    for c in chars:
        if c == "\\":
            nxt = next(chars, "")
            if nxt not in _UNESCAPES:
                raise ValueError(f"bad escape '\\{nxt}' in event log field {field!r}")
            out.append(_UNESCAPES[nxt])
        else:
            out.append(c)
    return "".join(out)


RawEvent = tuple[int, int, str, str, str]  # An event as a plain tuple (an :class:`Event` is one too).


def event_line(event: RawEvent) -> str:
    """The canonical line of ``event``, newline included."""
    t_ns, seq, actor, kind, summary = event
    line = f"{t_ns}\t{seq}\t{actor}\t{kind}\t{summary}\n"
    # Almost no field needs escaping: check the whole line once instead of escaping every field.
    if line.count("\t") == 4 and line.count("\n") == 1 and "\\" not in line and "\r" not in line:
        return line
    return f"{t_ns}\t{seq}\t{_escape(actor)}\t{_escape(kind)}\t{_escape(summary)}\n"


def parse_line(line: str) -> Event:
    """The event a canonical line holds (``ValueError`` if it is not one)."""
    fields = line.rstrip("\n").split("\t")
    if len(fields) != 5:
        raise ValueError(f"an event log line has 5 tab-separated fields, got {len(fields)}: {line!r}")
    return Event(int(fields[0]), int(fields[1]), _unescape(fields[2]), _unescape(fields[3]), _unescape(fields[4]))


class EventLogWriter:
    """Writes canonical lines to an optional file and hashes them as they go."""

    def __init__(self, path: Path | None = None, formats: Mapping[type, str] | None = None) -> None:
        self._formats = dict(formats or {})
        """Per record type, the ``%`` format of its whole line over ``(t_ns, seq, engine, *fields)``."""
        self._hash = hashlib.sha256()
        self._file = open(path, "w", encoding="utf-8", newline="\n") if path is not None else None  # noqa: SIM115
        self.lines = 0

    def write(self, events: Iterable[RawEvent]) -> None:
        for event in events:
            line = event_line(event)
            self._hash.update(line.encode())
            if self._file is not None:
                self._file.write(line)
            self.lines += 1

    def write_numbered(self, events: list[RawEvent], first_seq: int) -> None:
        """Write ``events`` numbered from ``first_seq``, one string per chunk (escaped only where needed)."""
        text = "".join([f"{t}\t{first_seq + i}\t{a}\t{k}\t{m}\n" for i, (t, _, a, k, m) in enumerate(events)])
        n = len(events)
        if text.count("\t") != 4 * n or text.count("\n") != n or "\\" in text or "\r" in text:
            text = "".join([event_line((t, first_seq + i, a, k, m)) for i, (t, _, a, k, m) in enumerate(events)])
        self._write_text(text, n)

    def _write_text(self, text: str, n: int) -> None:
        self._hash.update(text.encode())
        if self._file is not None:
            self._file.write(text)
        self.lines += n

    def write_observed(self, records: list[tuple[int, str, Any]], first_seq: int) -> None:
        """Write observations ``(t_ns, engine, record)`` as their ``kind`` and ``summary()``, from ``first_seq``."""
        formats = self._formats
        try:  # (t, seq, a) + r: a tuple concatenation is cheaper than unpacking r into a display
            text = "".join(
                [formats[type(r)] % ((t, seq, a) + r) for (t, a, r), seq in zip(records, itertools.count(first_seq))]
            )
        except KeyError:  # a record type without a format
            text = "".join(
                [f"{t}\t{first_seq + i}\t{a}\t{r.kind}\t{r.summary()}\n" for i, (t, a, r) in enumerate(records)]
            )
        n = len(records)
        if text.count("\t") != 4 * n or text.count("\n") != n or "\\" in text or "\r" in text:
            self.write_numbered([(t, 0, a, r.kind, r.summary()) for t, a, r in records], first_seq)
        else:
            self._write_text(text, n)

    def flush(self) -> None:
        """Hand what was written so far to the kernel (no fsync: a process killed after keeps the lines)."""
        if self._file is not None:
            self._file.flush()

    def sha256(self) -> str:
        """The hex digest of everything written so far."""
        return self._hash.hexdigest()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> EventLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_event_log(events: Iterable[RawEvent], path: Path | None) -> str:
    """Write ``events`` to ``path`` (if given) as canonical lines; return their SHA-256."""
    with EventLogWriter(path) as writer:
        writer.write(events)
        return writer.sha256()


def read_events(path: Path) -> Iterator[Event]:
    """The events of the log in ``path`` (a cut last line is skipped; any other bad line: ValueError)."""
    with open(path, encoding="utf-8", newline="\n") as file:
        for line in file:
            if not line.endswith("\n"):
                return
            yield parse_line(line)


def event_log_sha256(events: Iterable[RawEvent]) -> str:
    """The SHA-256 of the canonical lines of ``events``."""
    return write_event_log(events, None)
