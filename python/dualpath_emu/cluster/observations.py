"""What the cluster's engines observe as they decide, as typed records: an engine hands each to its outbox
(``out.observe(Admitted(rid))``); the event log writes it as one canonical line (its ``kind`` and
``summary()``), the invariant checker (:class:`~dualpath_emu.cluster.invariants.EventLogChecker`) reads the
fields, and :func:`parse` turns a live run's text line back into the record."""

from __future__ import annotations

from typing import Final, NamedTuple, TypeAlias

__all__ = [
    "Admitted", "Assigned", "Ended", "Failed", "FaultChanged", "Redispatched", "HitRead", "LINE_FORMATS", "Observation",
    "PoolCapacity", "PoolGive", "PoolTake", "Prefilled", "parse",
]  # fmt: skip


class Admitted(NamedTuple):
    """The client admitted request ``rid`` (an agent's turn)."""

    rid: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class Assigned(NamedTuple):
    """The scheduler put request ``rid`` on PE ``pe`` and DE ``de``, its hit read on ``side``."""

    rid: int
    pe: int
    de: int
    side: str

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class HitRead(NamedTuple):
    """Request ``rid``'s hit KV was read from storage into node ``node``'s DRAM buffer."""

    rid: int
    node: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class Prefilled(NamedTuple):
    """Request ``rid``'s prefill is done (its first token)."""

    rid: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class Ended(NamedTuple):
    """Request ``rid`` has all its tokens."""

    rid: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class Failed(NamedTuple):
    """Request ``rid`` ended as failed (an end, as :class:`Ended` is), for ``reason``."""

    rid: int
    reason: str

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class Redispatched(NamedTuple):
    """Request ``rid`` was lost to an engine crash (of ``engine``) and queued again, for the ``attempt``-th time."""

    rid: int
    attempt: int
    engine: str

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class PoolCapacity(NamedTuple):
    """Pool ``pool`` (a DRAM buffer, a GPU's HBM for KV) holds ``size`` bytes; said before its first grant."""

    pool: str
    size: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class PoolTake(NamedTuple):
    """Request ``rid`` was granted ``size`` bytes of ``pool``."""

    pool: str
    rid: int
    size: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class PoolGive(NamedTuple):
    """Request ``rid`` gave ``size`` bytes of ``pool`` back."""

    pool: str
    rid: int
    size: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class FaultChanged(NamedTuple):
    """A fault of kind ``fault`` on ``target`` began or ended (``phase``), doing ``factor`` and ``latency_ns``."""

    phase: str
    fault: str
    target: str
    factor: float
    latency_ns: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


Observation: TypeAlias = (Admitted | Assigned | HitRead | Prefilled | Ended | PoolCapacity | PoolTake | PoolGive
                          | FaultChanged | Failed | Redispatched)  # fmt: skip

_FORMATS: Final[dict[type, tuple[str, str]]] = {
    Admitted: ("admit", "r%s"), Assigned: ("assign", "r%s pe%s de%s %s"), HitRead: ("read", "r%s n%s"),
    Prefilled: ("prefilled", "r%s"), Ended: ("end", "r%s"), PoolCapacity: ("capacity", "%s %s"),
    PoolTake: ("take", "%s %s %s"), PoolGive: ("give", "%s %s %s"), FaultChanged: ("fault", "%s %s %s x%r +%sns"),
    Failed: ("failed", "r%s %s"), Redispatched: ("redispatch", "r%s %s %s"),
}  # fmt: skip
"""Per record type, its log ``kind`` and the ``%`` format of its ``summary`` (:func:`parse` reads it)."""

LINE_FORMATS: Final[dict[type, str]] = {
    cls: f"%d\t%d\t%s\t{kind}\t{summary}\n" for cls, (kind, summary) in _FORMATS.items()
}
"""Per record type, the ``%`` format of its whole event-log line over ``(t_ns, seq, engine, *fields)``: one
formatting per record in :meth:`~dualpath_emu.runtime.eventlog.EventLogWriter.write_observed`."""


def _format(record: Observation) -> str:
    return _FORMATS[type(record)][1] % record


def _rid(text: str) -> int:
    if not text.startswith("r"):
        raise ValueError(f"expected r<id>, got {text!r}")
    return int(text[1:])


def parse(kind: str, summary: str) -> Observation:
    """The record a log line's ``kind`` and ``summary`` fields hold (``ValueError`` if they hold none)."""
    words = summary.split(" ")
    try:
        if kind == "admit":
            return Admitted(_rid(summary))
        if kind == "end":
            return Ended(_rid(summary))
        if kind == "prefilled":
            return Prefilled(_rid(summary))
        if kind == "read" and len(words) == 2 and words[1].startswith("n"):
            return HitRead(_rid(words[0]), int(words[1][1:]))
        if kind == "assign" and len(words) == 4 and words[1].startswith("pe") and words[2].startswith("de"):
            return Assigned(_rid(words[0]), int(words[1][2:]), int(words[2][2:]), words[3])
        if kind == "capacity":
            pool, size = summary.rsplit(" ", 1)
            return PoolCapacity(pool, int(size))
        if kind == "fault" and len(words) == 5 and words[3].startswith("x") and words[4].startswith("+"):
            return FaultChanged(words[0], words[1], words[2], float(words[3][1:]), int(words[4][1:-2]))
        if kind == "failed" and len(words) >= 2:
            return Failed(_rid(words[0]), summary[len(words[0]) + 1 :])
        if kind == "redispatch" and len(words) == 3:
            return Redispatched(_rid(words[0]), int(words[1]), words[2])
        if kind in ("take", "give"):
            pool, rid, size = summary.rsplit(" ", 2)
            return (PoolTake if kind == "take" else PoolGive)(pool, int(rid), int(size))
    except ValueError:
        pass
    raise ValueError(f"not an observation of the cluster: {kind} {summary!r}")
