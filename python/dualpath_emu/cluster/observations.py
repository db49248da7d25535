"""What the cluster's engines observe as they decide, as typed records: an engine hands each to its outbox
(``out.observe(Admitted(rid))``); the event log writes it as one canonical line (its ``kind`` and
``summary()``), the invariant checker (:class:`~dualpath_emu.cluster.invariants.EventLogChecker`) reads the
fields, and :func:`parse` turns a live run's text line back into the record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple, TypeAlias

__all__ = [
    "Admitted", "Arrival", "Assigned", "Completion", "DecodeSegment", "Ended", "Failed", "FaultChanged", "FaultPlanned", "ForwardPass",
    "HitFound", "HitRead", "KvEvicted", "KvStored", "KvTaken", "KvTier", "KvWritePolicy", "KvWritten", "LINE_FORMATS", "MEASUREMENTS", "Measurement", "Observation", "PoolCapacity", "PoolGive", "PoolTake",
    "PrefillChosen", "PrefillPass", "PrefillStarted", "Prefilled", "ReadRerouted", "ReadStarted", "Redispatched",
    "WorkloadEnded", "from_wire", "parse", "to_wire",
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


class KvTier(NamedTuple):
    """KV tier ``tier`` holds up to ``capacity`` bytes of Full Blocks of ``block_bytes`` each; said before its first
    block (only for a bounded tier: an unbounded one is the paper's storage, and says nothing)."""

    tier: str
    capacity: int
    block_bytes: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class KvStored(NamedTuple):
    """Tier ``tier`` now holds blocks ``[first, first + blocks)`` of ``context`` too (after its ``[0, first)``)."""

    tier: str
    context: int
    first: int
    blocks: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class KvEvicted(NamedTuple):
    """Tier ``tier`` dropped blocks ``[first, first + blocks)`` of ``context``, its tail (it keeps ``[0, first)``)."""

    tier: str
    context: int
    first: int
    blocks: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class KvWritePolicy(NamedTuple):
    """Tier ``tier`` writes its blocks to storage as ``write`` says (said after its :class:`KvTier`, only for a
    DRAM pool that writes back: ``"back"``, blocks reach storage when it evicts them, :class:`KvWritten`)."""

    tier: str
    write: str

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class KvWritten(NamedTuple):
    """Tier ``tier`` wrote blocks ``[first, first + blocks)`` of ``context``, held on node ``node``, to storage (a
    write-back: it dropped them, or had no room for them), where later reads find them."""

    tier: str
    node: int
    context: int
    first: int
    blocks: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class KvTaken(NamedTuple):
    """Tier ``tier``'s ``blocks`` blocks of ``context`` became a running request's KV (decode HBM kept across turns,
    taken over by the context's next turn on the same GPU): the tier holds none of it any more."""

    tier: str
    context: int
    blocks: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class HitFound(NamedTuple):
    """Request ``rid`` of ``context`` found ``tokens`` of its hit in tier ``tier`` at dispatch; ``recomputed`` more
    were its context's but were not there: its prefill computes them again."""

    rid: int
    context: int
    tier: str
    tokens: int
    recomputed: int

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


# --- measurements: what the metrics are derived from, never in the event log (its lines and hashes stay) ---


class Arrival(NamedTuple):
    """The client admitted request ``rid`` of agent ``agent``: ``prompt`` tokens, ``hit`` of them cached, ``gen``
    to generate (a measurement: with :class:`Admitted`, which the event log keeps)."""

    rid: int
    agent: int
    prompt: int
    hit: int
    gen: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class Completion(NamedTuple):
    """Request ``rid`` ended, as its client saw it: its token times (``second_ns`` < 0: it had no second)."""

    rid: int
    first_ns: int
    second_ns: int
    done_ns: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class PrefillChosen(NamedTuple):
    """The scheduler gave request ``rid`` a prefill engine (its decode engine comes with :class:`Assigned`)."""

    rid: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class ReadStarted(NamedTuple):
    """Request ``rid``'s hit KV began to be read from storage (it ends with :class:`HitRead`)."""

    rid: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class ReadRerouted(NamedTuple):
    """A read of ``tokens`` moved from node ``from_node`` to ``to_node``, the other side, its storage NIC down (the
    second path as failover), as the scheduler learnt."""

    from_node: int
    to_node: int
    tokens: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class PrefillStarted(NamedTuple):
    """Request ``rid``'s first prefill chunk went into a forward pass."""

    rid: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class ForwardPass(NamedTuple):
    """A prefill forward pass started, with these attention times per GPU of its group (Fig. 13's balance)."""

    attention_s: tuple[float, ...]

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _FORMATS[type(self)][1] % (len(self.attention_s),)


class PrefillPass(NamedTuple):
    """A prefill pass ran over [``start_ns``, ``end_ns``) (its engine's times: a live process observes it a little
    later); ``gpus``: ``(gpu, requests, tokens)`` of each GPU with work in it (global GPU index)."""

    start_ns: int
    end_ns: int
    gpus: tuple[tuple[int, int, int], ...]

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _FORMATS[type(self)][1] % (self.start_ns, self.end_ns, len(self.gpus))


class DecodeSegment(NamedTuple):
    """Decode GPU ``gpu`` (global index) stepped a batch of ``batch`` requests, ``step_ns`` a step, over
    [``start_ns``, ``end_ns``)."""

    gpu: int
    start_ns: int
    end_ns: int
    batch: int
    step_ns: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class FaultPlanned(NamedTuple):
    """The next :class:`FaultChanged` start, of ``fault`` on ``target``, is the fault planned ``at_ns`` after the
    run's start (its schedule's time) to last ``duration_ns`` (-1: to the run's end; a crash: until its engine is
    back): what a stalled run's error says of the faults acting."""

    fault: str
    target: str
    at_ns: int
    duration_ns: int

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return _format(self)


class WorkloadEnded(NamedTuple):
    """The client has nothing more to submit and no request open: the run is over (a driver stops here)."""

    @property
    def kind(self) -> str:
        return _FORMATS[type(self)][0]

    def summary(self) -> str:
        return ""


Observation: TypeAlias = (Admitted | Assigned | HitRead | Prefilled | Ended | PoolCapacity | PoolTake | PoolGive
                          | FaultChanged | Failed | Redispatched | KvTier | KvStored | KvEvicted | KvTaken | HitFound
                          | KvWritePolicy | KvWritten)  # fmt: skip
"""What the event log keeps."""
Measurement: TypeAlias = (Arrival | Completion | PrefillChosen | ReadStarted | ReadRerouted | PrefillStarted
                          | ForwardPass | PrefillPass | DecodeSegment | FaultPlanned | WorkloadEnded)  # fmt: skip
"""What only the run's watchers see (the metrics, the end of the run): never written to the event log."""

_FORMATS: Final[dict[type, tuple[str, str]]] = {
    Admitted: ("admit", "r%s"), Assigned: ("assign", "r%s pe%s de%s %s"), HitRead: ("read", "r%s n%s"),
    Prefilled: ("prefilled", "r%s"), Ended: ("end", "r%s"), PoolCapacity: ("capacity", "%s %s"),
    PoolTake: ("take", "%s %s %s"), PoolGive: ("give", "%s %s %s"), FaultChanged: ("fault", "%s %s %s x%r +%sns"),
    Failed: ("failed", "r%s %s"), Redispatched: ("redispatch", "r%s %s %s"), KvTier: ("kv_tier", "%s %s %s"),
    KvStored: ("kv_store", "%s c%s %s+%s"), KvEvicted: ("kv_evict", "%s c%s %s+%s"), KvTaken: ("kv_take", "%s c%s %s"),
    HitFound: ("hit", "r%s c%s %s %s -%s"), KvWritePolicy: ("kv_write_policy", "%s %s"),
    KvWritten: ("kv_write", "%s n%s c%s %s+%s"),
}  # fmt: skip
_FORMATS.update({
    Arrival: ("arrival", "r%s a%s %s %s %s"), Completion: ("completion", "r%s %s %s %s"),
    PrefillChosen: ("prefill_chosen", "r%s"), ReadStarted: ("read_start", "r%s"), ReadRerouted: ("read_rerouted", "n%s n%s %s"),
    PrefillStarted: ("prefill_start", "r%s"), ForwardPass: ("forward", "%s gpus"),
    PrefillPass: ("prefill_pass", "%s-%s, %s gpus"), DecodeSegment: ("decode_segment", "gpu%s %s-%s b%s %sns"),
    FaultPlanned: ("fault_planned", "%s %s at %sns for %sns"), WorkloadEnded: ("workload_end", ""),
})  # fmt: skip

MEASUREMENTS: Final[frozenset[type]] = frozenset(
    (Arrival, Completion, PrefillChosen, ReadStarted, ReadRerouted, PrefillStarted, ForwardPass, PrefillPass,
     DecodeSegment, FaultPlanned, WorkloadEnded)
)  # fmt: skip
"""The :data:`Measurement` record types: a driver hands them to the run's watchers only, never to the event log."""
"""Per record type, its log ``kind`` and the ``%`` format of its ``summary`` (:func:`parse` reads it)."""

LINE_FORMATS: Final[dict[type, str]] = {
    cls: f"%d\t%d\t%s\t{kind}\t{summary}\n" for cls, (kind, summary) in _FORMATS.items() if cls not in MEASUREMENTS
}
"""Per record type, the ``%`` format of its whole event-log line over ``(t_ns, seq, engine, *fields)``: one
formatting per record in :meth:`~dualpath_emu.runtime.eventlog.EventLogWriter.write_observed`."""


_BY_KIND: Final[dict[str, type]] = {kind: cls for cls, (kind, _) in _FORMATS.items()}


def to_wire(t_ns: int, record: Observation | Measurement) -> list[object]:
    """``record`` observed at ``t_ns`` as msgpack-able data: ``[kind, t_ns, *fields]`` (:func:`from_wire`)."""
    return [record.kind, t_ns, *record]


def from_wire(data: Sequence[Any]) -> tuple[int, Observation | Measurement]:
    """The ``(t_ns, record)`` :func:`to_wire` made (msgpack's lists back to the records' tuples)."""
    kind, t_ns, *fields = data
    record: Observation | Measurement = _BY_KIND[kind](*(_tuples(f) for f in fields))
    return int(t_ns), record


def _tuples(value: object) -> object:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _format(record: Observation | Measurement) -> str:
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
        if kind == "kv_tier" and len(words) == 3:
            return KvTier(words[0], int(words[1]), int(words[2]))
        if kind in ("kv_store", "kv_evict") and len(words) == 3 and words[1].startswith("c") and "+" in words[2]:
            first, blocks = words[2].split("+")
            return (KvStored if kind == "kv_store" else KvEvicted)(words[0], int(words[1][1:]), int(first), int(blocks))
        if kind == "kv_write_policy" and len(words) == 2:
            return KvWritePolicy(words[0], words[1])
        if kind == "kv_write" and len(words) == 4 and words[1].startswith("n") and words[2].startswith("c"):
            first, blocks = words[3].split("+")
            return KvWritten(words[0], int(words[1][1:]), int(words[2][1:]), int(first), int(blocks))
        if kind == "kv_take" and len(words) == 3 and words[1].startswith("c"):
            return KvTaken(words[0], int(words[1][1:]), int(words[2]))
        if kind == "hit" and len(words) == 5 and words[1].startswith("c") and words[4].startswith("-"):
            return HitFound(_rid(words[0]), int(words[1][1:]), words[2], int(words[3]), int(words[4][1:]))
        if kind in ("take", "give"):
            pool, rid, size = summary.rsplit(" ", 2)
            return (PoolTake if kind == "take" else PoolGive)(pool, int(rid), int(size))
    except ValueError:
        pass
    raise ValueError(f"not an observation of the cluster: {kind} {summary!r}")
