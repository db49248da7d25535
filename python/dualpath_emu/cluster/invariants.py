"""Invariants of a cluster run, checked from outside the system (as FoundationDB's and TigerBeetle's simulators do).
From the engines' observations (:class:`EventLogChecker`; a live run's from its merged event logs): time never goes
backwards and events are numbered without a gap; every admitted request ends exactly once (ended or failed), and nothing
ends that was not admitted; no pool is ever over its capacity or below zero, and every pool is empty at the end; a KV
tier holds each context's blocks as a prefix, stored and evicted at its ends, never more than its capacity, and no hit
is found in it beyond what it holds; what a DRAM pool that writes back lacks of a hit was written back to storage
before. From the core's byte counters at the end (:func:`check_core_bytes`): every byte
accounted per port and lane."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from dualpath_emu.cluster.core_report import CoreReport
from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.observations import (
    Admitted, Ended, Failed, HitFound, KvEvicted, KvStored, KvTaken, KvTier, KvWritePolicy, KvWritten, PoolCapacity,
    PoolGive, PoolTake, parse,
)  # fmt: skip
from dualpath_emu.runtime.engine import Observed

__all__ = ["EventLogChecker", "InvariantError", "check_core_bytes"]

MAX_REPORTED: Final = 20
_UNSEEN, _ADMITTED, _ENDED = 0, 1, 2


class InvariantError(AssertionError):
    """A run broke an invariant; the message lists the violations."""


class EventLogChecker:
    """Feed it every event in order (:meth:`feed`), then call :meth:`finish` for the end-of-run checks."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self._last_t = 0
        self._next_seq = 0
        self._state = bytearray()
        """Per request id (in admission order): 0 unseen, 1 admitted, 2 ended; ids far beyond go to ``_sparse``."""
        self._sparse: dict[int, int] = {}
        self._pools: dict[str, list[int]] = {}  # name -> [capacity, used]
        self.events = 0
        self._tiers: dict[str, list[int]] = {}  # name -> [capacity in blocks, blocks held]
        self._held: dict[tuple[str, int], int] = {}  # (tier, context) -> its blocks [0, n) held
        self._writes_back: set[str] = set()  # Tiers whose blocks reach storage only as they write them back.
        self._in_storage: dict[int, list[list[int]]] = {}
        """Per context, the blocks written back to storage, as sorted disjoint ``[first, end)`` runs."""
        self._handlers: dict[type, Callable[[int, Any], None]] = {
            PoolTake: self._pool, PoolGive: self._pool, Admitted: self._admit, Ended: self._ended, Failed: self._ended,
            PoolCapacity: self._capacity, KvTier: self._kv_tier, KvStored: self._kv_stored,
            KvEvicted: self._kv_evicted, KvTaken: self._kv_taken, HitFound: self._hit_found,
            KvWritePolicy: self._kv_write_policy, KvWritten: self._kv_written,
        }  # fmt: skip
        """What each record type checks (the others only take their place in time and number)."""

    def _violate(self, text: str) -> None:
        if len(self.violations) < MAX_REPORTED:
            self.violations.append(text)

    def feed(self, events: Iterable[tuple[int, int, str, str, str]], first_seq: int | None = None) -> None:
        """Check the event log's lines in order (numbered from ``first_seq`` if given)."""
        for index, (t_ns, seq, _, kind, summary) in enumerate(events):
            if first_seq is not None:
                seq = first_seq + index
            try:
                record: Observed | None = parse(kind, summary)
            except ValueError:
                record = None
            self._check(t_ns, seq, record)

    def feed_observed(self, records: Iterable[tuple[int, str, Observed]], first_seq: int) -> None:
        """Check observations ``(t_ns, engine, record)`` in order, numbered from ``first_seq``."""
        events = iter(records)
        first = next(events, None)
        if first is None:
            return
        self._check(first[0], first_seq, first[2])
        handlers, last_t, seq = self._handlers, self._last_t, first_seq
        for t_ns, _, record in events:
            seq += 1
            if t_ns < last_t:
                self._violate(f"time went back from {last_t} to {t_ns} ns at event {seq}")
            last_t = t_ns
            handler = handlers.get(type(record))
            if handler is not None:
                handler(seq, record)
        self.events += seq - first_seq
        self._last_t, self._next_seq = last_t, seq + 1

    def _check(self, t_ns: int, seq: int, record: Observed | None) -> None:
        self.events += 1
        if t_ns < self._last_t:
            self._violate(f"time went back from {self._last_t} to {t_ns} ns at event {seq}")
        if seq != self._next_seq:
            self._violate(f"event {seq} where {self._next_seq} was expected")
        self._last_t, self._next_seq = t_ns, seq + 1
        handler = self._handlers.get(type(record))
        if handler is not None:
            handler(seq, record)

    def _pool(self, seq: int, record: PoolTake | PoolGive) -> None:
        pool = self._pools.get(record.pool)
        if pool is None:
            self._violate(f"{record.kind} on pool {record.pool} before its capacity was given (event {seq})")
            return
        pool[1] += record.size if type(record) is PoolTake else -record.size
        if pool[1] > pool[0]:
            self._violate(f"{record.pool} over capacity: {pool[1]} > {pool[0]} B (event {seq}, r{record.rid})")
        elif pool[1] < 0:
            self._violate(f"{record.pool} below zero: {pool[1]} B (event {seq}, r{record.rid})")

    def _admit(self, seq: int, record: Admitted) -> None:
        rid = record.rid
        if self._get(rid):
            self._violate(f"request {rid} admitted twice (event {seq})")
        else:
            self._set(rid, _ADMITTED)

    def _ended(self, seq: int, record: Ended | Failed) -> None:
        rid = record.rid
        state = self._get(rid)
        if state == _UNSEEN:
            self._violate(f"request {rid} ended but was never admitted (event {seq})")
        elif state == _ENDED:
            self._violate(f"request {rid} ended twice (event {seq})")
        else:
            self._set(rid, _ENDED)

    def _capacity(self, seq: int, record: PoolCapacity) -> None:
        self._pools[record.pool] = [record.size, 0]

    def _kv_tier(self, seq: int, record: KvTier) -> None:
        self._tiers[record.tier] = [record.capacity // record.block_bytes, 0]

    def _kv_stored(self, seq: int, record: KvStored) -> None:
        tier = self._tiers.get(record.tier)
        if tier is None:
            self._violate(f"blocks stored in KV tier {record.tier} before its capacity was given (event {seq})")
            return
        key = (record.tier, record.context)
        held = self._held.get(key, 0)
        if record.first != held or record.blocks <= 0:
            self._violate(f"{record.tier}: context {record.context} stored blocks {record.first}+{record.blocks} "
                          f"after holding [0, {held}) (event {seq}): a context's blocks are a prefix")  # fmt: skip
        self._held[key] = record.first + record.blocks
        tier[1] += record.blocks
        if tier[1] > tier[0]:
            self._violate(f"KV tier {record.tier} over capacity: {tier[1]} > {tier[0]} blocks (event {seq})")

    def _kv_evicted(self, seq: int, record: KvEvicted) -> None:
        key = (record.tier, record.context)
        held = self._held.get(key, 0)
        if record.first + record.blocks != held or record.blocks <= 0 or record.first < 0:
            self._violate(f"{record.tier}: context {record.context} evicted blocks {record.first}+{record.blocks} "
                          f"while holding [0, {held}) (event {seq}): only a tail it holds can go")  # fmt: skip
        if record.first > 0:
            self._held[key] = record.first
        else:
            self._held.pop(key, None)
        tier = self._tiers.get(record.tier)
        if tier is not None:
            tier[1] -= record.blocks

    def _kv_taken(self, seq: int, record: KvTaken) -> None:
        key = (record.tier, record.context)
        held = self._held.pop(key, 0)
        if record.blocks != held or held <= 0:
            self._violate(f"{record.tier}: context {record.context}'s {record.blocks} blocks taken by a request while "
                          f"it held [0, {held}) (event {seq}): a tier hands over what it holds, whole")  # fmt: skip
        tier = self._tiers.get(record.tier)
        if tier is not None:
            tier[1] -= held

    def _hit_found(self, seq: int, record: HitFound) -> None:
        held = self._held.get((record.tier, record.context), 0)
        if record.tokens // BLOCK_TOKENS > held or record.tokens < 0 or record.recomputed < 0:
            self._violate(f"request {record.rid} found {record.tokens} hit tokens of context {record.context} in "
                          f"{record.tier}, which holds {held} blocks of it (event {seq})")  # fmt: skip
        if record.tier in self._writes_back and record.recomputed > 0:
            # What a tier that writes back lacks is read from storage: it must have been written back there.
            first, end = record.tokens // BLOCK_TOKENS, (record.tokens + record.recomputed) // BLOCK_TOKENS
            covered = next((hi for lo, hi in self._in_storage.get(record.context, ()) if lo <= first < hi), first)
            if covered < end:
                self._violate(f"request {record.rid} reads blocks {first}-{end - 1} of context {record.context} from "
                              f"storage, which was never given blocks {covered}-{end - 1} of it (event {seq}): "
                              f"{record.tier} dropped them without writing them back")  # fmt: skip

    def _kv_write_policy(self, seq: int, record: KvWritePolicy) -> None:
        if record.write == "back":
            self._writes_back.add(record.tier)

    def _kv_written(self, seq: int, record: KvWritten) -> None:
        if record.tier not in self._writes_back or record.blocks <= 0 or record.first < 0:
            self._violate(f"{record.tier} wrote back blocks {record.first}+{record.blocks} of context {record.context} "
                          f"(event {seq}), {'a tier that writes through' if record.tier not in self._writes_back else 'no blocks'}")  # fmt: skip
            return
        runs = self._in_storage.setdefault(record.context, [])
        lo, hi = record.first, record.first + record.blocks
        if any(r[0] < hi and lo < r[1] for r in runs):  # a block's KV never changes: one write is all it needs
            self._violate(f"{record.tier} wrote back blocks {lo}+{record.blocks} of context {record.context} "
                          f"(event {seq}), some of which storage held already")  # fmt: skip
        kept = [r for r in runs if r[1] < lo or r[0] > hi]  # the runs it neither overlaps nor touches
        for r in runs:
            if not (r[1] < lo or r[0] > hi):
                lo, hi = min(lo, r[0]), max(hi, r[1])
        kept.append([lo, hi])
        kept.sort()
        self._in_storage[record.context] = kept

    def _get(self, rid: int) -> int:
        state = self._state
        return state[rid] if 0 <= rid < len(state) else self._sparse.get(rid, _UNSEEN)

    def _set(self, rid: int, value: int) -> None:
        state = self._state
        if 0 <= rid < len(state):
            state[rid] = value
        elif 0 <= rid < 2 * len(state) + 4096:  # the next ids: grow
            state.extend(bytes(rid + 1 - len(state)))
            state[rid] = value
        else:
            self._sparse[rid] = value

    def finish(self) -> list[str]:
        """The end-of-run checks; returns every violation found (up to :data:`MAX_REPORTED`)."""
        count = self._state.count(_ADMITTED) + sum(1 for v in self._sparse.values() if v == _ADMITTED)
        if count:
            never: list[int] = []
            at = self._state.find(_ADMITTED)
            while at >= 0 and len(never) < 5:
                never.append(at)
                at = self._state.find(_ADMITTED, at + 1)
            never = sorted([*never, *(r for r, v in self._sparse.items() if v == _ADMITTED)])[:5]
            self._violate(f"{count} admitted request(s) never ended, e.g. {never}")
        for name, (_, used) in sorted(self._pools.items()):
            if used != 0:
                self._violate(f"{name} still holds {used} B at the end")
        return self.violations


def check_core_bytes(
    report: CoreReport, booked: Mapping[tuple[int, int], int], transfers: Mapping[tuple[int, int], int]
) -> list[str]:
    """Every byte accounted: per port and lane, finished transfers' bytes equal the engines' requests."""
    out: list[str] = []
    for port, counters in enumerate(report.ports):
        for lane, (flowed, done) in enumerate(zip(counters.fluid_bytes, counters.completed_bytes)):
            key = (port, lane)
            want = booked.get(key, 0)
            if done != want:
                out.append(f"port {counters.name} lane {lane}: {done} B finished, {want} B asked for")
            slack = transfers.get(key, 0) * counters.capacity * 1e-9 + 1e-6 * done + 1.0
            if abs(flowed - done) > slack:
                out.append(f"port {counters.name} lane {lane}: {flowed:.0f} B flowed, {done} B finished")
    return out
