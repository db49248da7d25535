"""Per-request timestamps of a cluster run and the figures computed from them (paper §7: JCT, TTFT, TTST,
TPOT, Fig. 12's TTFT breakdown); the GPUs' busy time (:class:`BusyTime`) and the KV working set.

Request ids are 0, 1, 2, … in arrival order, so every column is a flat array indexed by id; a time not reached
yet is -1. Latencies (paper-facts §3.3): TTFT = first token − arrival; **TTST = second token − first token**
(the PE → DE hand-off, H2D and the first decode step); TPOT = (last token − second token) / (tokens − 2)."""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy

from dualpath_emu.cluster.observations import (
    MEASUREMENTS, Arrival, Assigned, Completion, DecodeSegment, Failed, ForwardPass, HitFound, HitRead, KvEvicted,
    KvStored, KvTaken, KvTier, KvWritePolicy, KvWritten, PrefillChosen, PrefillPass, PrefillStarted, ReadRerouted,
    ReadStarted, Redispatched,
)  # fmt: skip
from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.kv_cache import HBM, POOL, STORE
from dualpath_emu.runtime.engine import Watch

__all__ = ["BusyTime", "KvTierStats", "Metrics", "Percentiles", "percentiles", "quantile"]

NS = 1_000_000_000

_UNSET = -1


def _column(typecode: str = "q") -> array[int]:
    """A column: times in int64 nanoseconds; counts and ids in int32 (``"i"``), flags in int8 (``"b"``)."""
    return array(typecode)


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float
    mean: float

    def as_dict(self) -> dict[str, float]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "mean": self.mean}


def percentiles(values: Sequence[float]) -> Percentiles:
    """Nearest-rank percentiles (0 for an empty list)."""
    if not values:
        return Percentiles(0.0, 0.0, 0.0, 0.0)
    ordered = sorted(values)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[min(n - 1, max(0, -(-int(q * n * 1000) // 1000) - 1))]

    return Percentiles(rank(0.5), rank(0.9), rank(0.99), sum(ordered) / n)


def quantile(values: Iterable[float], count: int, q: float) -> float:
    """The ``q``-quantile of ``count`` values ≥ 0 (unstored ones zeros), keeping the top ``count × (1 − q)``."""
    if count <= 0:
        return 0.0
    rank = min(count, max(1, -(-int(q * count * 1000) // 1000)))  # as percentiles(): ceil(q·n), clamped
    top = heapq.nlargest(count - rank + 1, values)
    return top[-1] if len(top) == count - rank + 1 else 0.0


def _int_array(values: numpy.ndarray) -> array[int]:
    """A numpy array of indices as an ``array("q")``: 8 bytes an element, and plain ints when indexed."""
    out = array("q")
    out.frombytes(values.astype(numpy.int64).tobytes())
    return out


SAMPLE_BUDGET = 1 << 20
"""Busy-time bins all units of a :class:`BusyTime` hold together, at most: as the core's utilisation samples
(``SAMPLE_BUDGET`` in core/src/network.rs), so memory is bounded by the cluster's size, not emulated time."""
MAX_SAMPLES_PER_UNIT = 1 << 16
MIN_SAMPLES_PER_UNIT = 256


class BusyTime:
    """How long each unit (a GPU, by its global index) is busy, in total and per sampling interval (with
    ``keep_spans`` also the intervals themselves, for the trace); :meth:`utilisation` gives the same statistics
    as the ports' (``Core.utilisation_*``). As in the core, the bins stay within :data:`SAMPLE_BUDGET`: on a long
    run the interval doubles, adjacent bins merging (``interval_ns`` is the one in use; totals stay exact)."""

    def __init__(self, interval_ns: int, keep_spans: bool = False) -> None:
        if interval_ns <= 0:
            raise ValueError(f"interval_ns: expected an integer > 0, got {interval_ns}")
        self.interval_ns = interval_ns
        self.busy_ns: dict[int, array[int]] = {}
        """Busy nanoseconds per sampling interval, per unit (only units that were ever busy)."""
        self.spans: list[tuple[int, int, int, str, tuple[tuple[str, int], ...]]] | None = [] if keep_spans else None
        """``(unit, start_ns, end_ns, what, args)`` per interval, if kept."""
        self._cap = MAX_SAMPLES_PER_UNIT  # Bins per unit at most, for the units there are now.

    def _new_unit(self, unit: int) -> array[int]:
        self.busy_ns[unit] = array("q")
        self._rebalance()  # a smaller share for each unit already there
        return self.busy_ns[unit]

    def _rebalance(self) -> None:
        """The cap for the units there are, and the bins widened to fit it."""
        self._cap = min(MAX_SAMPLES_PER_UNIT, max(MIN_SAMPLES_PER_UNIT, SAMPLE_BUDGET // max(1, len(self.busy_ns))))
        self._widen(max(map(len, self.busy_ns.values()), default=0))

    def _widen(self, length: int) -> None:
        """Double the interval (merging adjacent bins of every unit) until ``length`` bins fit the cap."""
        factor = 1
        while -(-length // factor) > self._cap:
            factor *= 2
        if factor == 1:
            return
        for unit, bins in self.busy_ns.items():
            values = numpy.frombuffer(bins, dtype=numpy.int64) if bins else numpy.zeros(0, dtype=numpy.int64)
            padded = numpy.zeros(-(-len(values) // factor) * factor, dtype=numpy.int64)
            padded[: len(values)] = values
            self.busy_ns[unit] = _int_array(padded.reshape(-1, factor).sum(axis=1))
        self.interval_ns *= factor

    def add(
        self, unit: int, start_ns: int, end_ns: int, what: str = "busy", args: tuple[tuple[str, int], ...] = ()
    ) -> None:
        """``unit`` was busy over [start_ns, end_ns) doing ``what`` (e.g. ``prefill pass``)."""
        if end_ns <= start_ns:
            return
        bins = self.busy_ns.get(unit)
        if bins is None:
            bins = self._new_unit(unit)
        step = self.interval_ns
        last = (end_ns - 1) // step
        if last >= self._cap:  # a long run: wider bins, never more of them
            self._widen(last + 1)
            bins, step = self.busy_ns[unit], self.interval_ns
            last = (end_ns - 1) // step
        if len(bins) <= last:
            bins.extend(itertools.repeat(0, last + 1 - len(bins)))
        k = start_ns // step
        if k == last:  # most spans are shorter than an interval: within one
            bins[k] += end_ns - start_ns
        else:
            t = start_ns
            while t < end_ns:
                k = t // step
                edge = min((k + 1) * step, end_ns)
                bins[k] += edge - t
                t = edge
        if self.spans is not None:
            self.spans.append((unit, start_ns, end_ns, what, args))

    def timeline(self, units: Sequence[int], until_ns: int) -> list[float]:
        """Per sampling interval before ``until_ns``, the mean busy fraction of ``units``."""
        intervals = -(-until_ns // self.interval_ns)
        total = [0.0] * intervals
        for unit in units:
            for k, busy in enumerate(self.busy_ns.get(unit, ())[:intervals]):
                total[k] += busy / self._covered(k, until_ns)
        return [t / len(units) for t in total] if units else total

    def utilisation(self, units: Sequence[int], until_ns: int, q: float = 0.99, since_ns: int = 0) -> dict[str, float]:
        """``{"mean": busy share over [since_ns, until_ns], "p99": over every (unit, interval)}``."""
        intervals = -(-until_ns // self.interval_ns)
        first = min(intervals, since_ns // self.interval_ns)
        busy = sum(sum(self.busy_ns.get(u, ())[first:intervals]) for u in units)
        span = until_ns - since_ns
        mean = busy / (len(units) * span) if units and span > 0 else 0.0
        fractions = (b / self._covered(first + k, until_ns)
                     for u in units for k, b in enumerate(self.busy_ns.get(u, ())[first:intervals]))  # fmt: skip
        return {"mean": mean, "p99": quantile(fractions, len(units) * (intervals - first), q)}

    def _covered(self, k: int, until_ns: int) -> int:
        """The part of interval ``k`` before ``until_ns`` (the last one may be partial)."""
        return max(1, min(self.interval_ns, until_ns - k * self.interval_ns))


READ_SIDES: Final = ("pe", "de", "split")
"""Where a request's hit is read (``Assigned.side``), as :attr:`Metrics.read_on_de` numbers them."""


@dataclass
class KvTierStats:
    """What a bounded KV tier held and dropped over a run (:mod:`~dualpath_emu.cluster.kv_cache`), in blocks."""

    capacity_bytes: int
    block_bytes: int
    held_blocks: int = 0
    peak_blocks: int = 0
    stored_blocks: int = 0
    evicted_blocks: int = 0
    evictions: int = 0
    taken_blocks: int = 0
    """Blocks handed over to a running request (decode HBM kept across turns: the next turn on the same GPU)."""
    write_back: bool = False
    """The tier writes blocks to storage only when it drops them or has no room (a DRAM pool, ``write = "back"``)."""
    written_blocks: int = 0
    written_backs: int = 0
    """Blocks it wrote back to storage, in how many writes."""
    asked_tokens: int = 0
    """Hit tokens requests asked of it (their context so far) and, of those, ``found_tokens``; the rest recomputed."""
    found_tokens: int = 0
    tier: str = STORE
    interval_ns: int = NS
    fill: array[int] = field(default_factory=lambda: array("q"))
    """Per ``interval_ns`` of the run, the most blocks held in it (the working set the tier kept over time)."""

    def held(self, t_ns: int, blocks: int) -> None:
        """The tier holds ``blocks`` more (fewer, negative) blocks from ``t_ns`` on."""
        self.held_blocks += blocks
        k, fill = t_ns // self.interval_ns, self.fill
        if len(fill) <= k:
            fill.extend([self.held_blocks - blocks] * (k + 1 - len(fill)))
        fill[k] = max(fill[k], self.held_blocks)

    def summary(self) -> dict[str, float | int]:
        """``summary.json``'s ``kv.<tier>``: bytes, counts and the share of asked hit tokens found. What the store
        lacks is computed again; what the DRAM pool lacks is read from storage (``missed_tokens``)."""
        b = self.block_bytes
        missed = "recomputed_tokens" if self.tier == STORE else "missed_tokens"
        taken = {"taken_bytes": self.taken_blocks * b} if self.tier == HBM else {}
        if self.write_back:
            taken = {"written_back_bytes": self.written_blocks * b, "write_backs": self.written_backs}
        return {**taken,
            "capacity_bytes": self.capacity_bytes, "peak_bytes": self.peak_blocks * b, "end_bytes": self.held_blocks * b,
            "stored_bytes": self.stored_blocks * b, "evicted_bytes": self.evicted_blocks * b,
            "evictions": self.evictions, "hit_tokens_asked": self.asked_tokens, "hit_tokens_found": self.found_tokens,
            "found_bytes": self.found_tokens * b // BLOCK_TOKENS, missed: self.asked_tokens - self.found_tokens,
            "found_rate": self.found_tokens / self.asked_tokens if self.asked_tokens else 1.0,
        }  # fmt: skip


class Metrics:
    """Timestamps (ns) per request, filled as it moves; ``gpu_busy``: the PE and DE GPUs' busy time."""

    def __init__(self, sample_interval_ns: int = NS, keep_spans: bool = False) -> None:
        self.agent = _column("i")
        self.prompt = _column("i")
        self.hit = _column("i")
        self.gen = _column("i")
        self.arrive_ns = _column()
        self.scheduled_pe_ns = _column()
        self.scheduled_de_ns = _column()
        self.read_start_ns = _column()
        self.read_done_ns = _column()
        self.prefill_start_ns = _column()
        self.first_token_ns = _column()
        self.second_token_ns = _column()
        self.done_ns = _column()
        self.failed_ns = _column()
        """When a request ended as failed (lost to more engine crashes than the scheduler redispatches)."""
        self.redispatches = _column("i")
        """How many times a request was lost to an engine crash and dispatched again (unset: never)."""
        self.pe = _column("i")
        self.de = _column("i")
        self.read_on_de = _column("b")
        """Per request, where its hit was read: an index of :data:`READ_SIDES` (0 the PE, 1 the DE, 2 both)."""
        self.forward_ns = _column()  # Start of each prefill forward pass (all groups, in start order).
        self.redispatch_ns = _column()  # When each redispatch after an engine crash happened (:meth:`redispatched`).
        self.read_moved_ns = _column()
        """When each read moved to the other side, its storage NIC down (the second path as failover)."""
        self.forward_attention_balance: array[float] = array("d")
        """Per forward pass: max/mean attention time over its group's GPUs (an idle GPU counts 0), Fig. 13."""
        self.gpu_busy = {role: BusyTime(sample_interval_ns, keep_spans) for role in ("pe", "de")}
        self._interval_ns = sample_interval_ns
        self.recomputed = _column("i")
        """Per request, hit tokens a bounded KV tier no longer held at dispatch (computed again; ``hit`` is what
        was found)."""
        self.kv: dict[str, KvTierStats] = {}
        """Per bounded KV tier, what it held and dropped (none: every tier unbounded, as in the paper)."""
        self.turns_done = 0
        """Requests ended (:meth:`ended`): how far a run is, without a scan of ``done_ns``."""
        self.failures = 0  # Requests ended as failed (:meth:`failed`), without a scan of ``failed_ns``.
        # the appends of what :meth:`arrive` leaves unset in a row
        self._unset_appends = tuple(c.append for c in (
            self.scheduled_pe_ns, self.scheduled_de_ns, self.read_start_ns, self.read_done_ns, self.prefill_start_ns,
            self.first_token_ns, self.second_token_ns, self.done_ns, self.failed_ns, self.redispatches, self.pe, self.de,
            self.read_on_de,
        ))  # fmt: skip

    def __len__(self) -> int:
        return len(self.arrive_ns)

    def arrive(self, rid: int, agent: int, t_ns: int, prompt: int, hit: int, gen: int) -> None:
        if rid != len(self.arrive_ns):
            raise ValueError(f"request ids must come in order: got {rid}, expected {len(self.arrive_ns)}")
        self.agent.append(agent)
        self.prompt.append(prompt)
        self.hit.append(hit)
        self.gen.append(gen)
        self.arrive_ns.append(t_ns)
        self.recomputed.append(0)
        for append in self._unset_appends:
            append(_UNSET)

    # --- derived from the engines' observations (the run's Watch) ----------------------------------------

    @classmethod
    def observed(cls) -> tuple[type, ...]:
        """The observation types the metrics are derived from (:meth:`watch`'s)."""
        return tuple(cls().watch().callbacks)

    @classmethod
    def replay(cls, observed: Iterable[tuple[int, Any]], sample_interval_ns: int = NS) -> Metrics:
        """The metrics of ``observed`` ``(t_ns, record)`` (several processes' observations: arrivals first, in the
        order given, then the rest in time order, so that each request's come after its arrival whatever the
        processes' clocks)."""
        metrics = cls(sample_interval_ns=sample_interval_ns)
        callbacks = metrics.watch().callbacks
        records = list(observed)
        for t_ns, record in [r for r in records if type(r[1]) is Arrival]:
            callbacks[Arrival](t_ns, record)
        for t_ns, record in sorted((r for r in records if type(r[1]) is not Arrival), key=lambda r: r[0]):
            callbacks[type(record)](t_ns, record)
        return metrics

    def watch(self) -> Watch:
        """What these metrics are derived from: per observation type, the column it fills (the measurements and
        a few of the event log's records). A driver holding it tells the metrics as the engines observe."""
        return Watch({
            Arrival: self._arrival, PrefillChosen: self._prefill_chosen, Assigned: self._assigned,
            ReadStarted: self._read_started, HitRead: self._hit_read, PrefillStarted: self._prefill_started,
            Completion: self._completion, Failed: self._failed, Redispatched: self._redispatched,
            ReadRerouted: self._read_rerouted, ForwardPass: self._forward_pass, PrefillPass: self._prefill_pass,
            DecodeSegment: self._decode_segment, KvTier: self._kv_tier, KvStored: self._kv_stored,
            KvEvicted: self._kv_evicted, KvTaken: self._kv_taken, HitFound: self._hit_found,
            KvWritePolicy: self._kv_write_policy, KvWritten: self._kv_written,
        }, MEASUREMENTS)  # fmt: skip

    def _arrival(self, t_ns: int, r: Arrival) -> None:
        self.arrive(r.rid, r.agent, t_ns, r.prompt, r.hit, r.gen)

    def _prefill_chosen(self, t_ns: int, r: PrefillChosen) -> None:
        self.scheduled_pe_ns[r.rid] = t_ns

    def _assigned(self, t_ns: int, r: Assigned) -> None:
        rid = r.rid
        self.scheduled_de_ns[rid] = t_ns
        self.pe[rid], self.de[rid], self.read_on_de[rid] = r.pe, r.de, READ_SIDES.index(r.side)

    def _read_started(self, t_ns: int, r: ReadStarted) -> None:
        self.read_start_ns[r.rid] = t_ns

    def _hit_read(self, t_ns: int, r: HitRead) -> None:
        self.read_done_ns[r.rid] = t_ns

    def _prefill_started(self, t_ns: int, r: PrefillStarted) -> None:
        rid = r.rid
        if self.prefill_start_ns[rid] == _UNSET:  # its first ever (not a redispatched request's later one)
            self.prefill_start_ns[rid] = t_ns

    def _completion(self, t_ns: int, r: Completion) -> None:
        self.ended(r.rid, r.first_ns, r.second_ns, r.done_ns)

    def _failed(self, t_ns: int, r: Failed) -> None:
        self.failed(r.rid, t_ns)

    def _redispatched(self, t_ns: int, r: Redispatched) -> None:
        """Queued again after an engine crash: counted, and waiting for engines again (its placement unset)."""
        rid = r.rid
        self.redispatches[rid] = max(self.redispatches[rid], 0) + 1
        self.redispatch_ns.append(t_ns)
        self.scheduled_pe_ns[rid] = self.scheduled_de_ns[rid] = _UNSET

    def _read_rerouted(self, t_ns: int, r: ReadRerouted) -> None:
        self.read_moved_ns.append(t_ns)

    def _forward_pass(self, t_ns: int, r: ForwardPass) -> None:
        attention_s = r.attention_s
        mean = sum(attention_s) / len(attention_s)
        self.forward_ns.append(t_ns)
        self.forward_attention_balance.append(max(attention_s) / mean if mean > 0 else 1.0)

    def _prefill_pass(self, t_ns: int, r: PrefillPass) -> None:
        busy, start, end = self.gpu_busy["pe"], r.start_ns, r.end_ns
        for gpu, requests, tokens in r.gpus:
            args = (("requests", requests), ("tokens", tokens)) if busy.spans is not None else ()
            busy.add(gpu, start, end, "prefill pass", args)

    def _decode_segment(self, t_ns: int, r: DecodeSegment) -> None:
        busy = self.gpu_busy["de"]
        args = (("batch", r.batch), ("step_ns", r.step_ns)) if busy.spans is not None else ()
        busy.add(r.gpu, r.start_ns, r.end_ns, "decode", args)

    def _kv_tier(self, t_ns: int, r: KvTier) -> None:
        self.kv[r.tier] = KvTierStats(r.capacity, r.block_bytes, tier=r.tier, interval_ns=self._interval_ns)

    def _kv_stored(self, t_ns: int, r: KvStored) -> None:
        tier = self.kv[r.tier]
        tier.held(t_ns, r.blocks)
        tier.stored_blocks += r.blocks
        tier.peak_blocks = max(tier.peak_blocks, tier.held_blocks)

    def _kv_evicted(self, t_ns: int, r: KvEvicted) -> None:
        tier = self.kv[r.tier]
        tier.held(t_ns, -r.blocks)
        tier.evicted_blocks += r.blocks
        tier.evictions += 1

    def _kv_write_policy(self, t_ns: int, r: KvWritePolicy) -> None:
        self.kv[r.tier].write_back = r.write == "back"

    def _kv_written(self, t_ns: int, r: KvWritten) -> None:
        tier = self.kv[r.tier]
        tier.written_blocks += r.blocks
        tier.written_backs += 1

    def _kv_taken(self, t_ns: int, r: KvTaken) -> None:
        tier = self.kv[r.tier]
        tier.held(t_ns, -r.blocks)
        tier.taken_blocks += r.blocks

    def _hit_found(self, t_ns: int, r: HitFound) -> None:
        tier = self.kv[r.tier]
        tier.asked_tokens += r.tokens + r.recomputed
        tier.found_tokens += r.tokens
        rid = r.rid
        if r.tier == HBM:  # decode HBM kept across turns: where a hit was loaded from, not whether it was found
            return
        if r.tier != STORE:  # the DRAM pool, asked first: an unbounded store holds what it lacks
            if STORE in self.kv:
                self.hit[rid], self.recomputed[rid] = r.tokens, r.recomputed
        elif POOL in self.kv:  # a bounded store after the pool: the hit is what either holds
            self.hit[rid], self.recomputed[rid] = max(self.hit[rid], r.tokens), min(self.recomputed[rid], r.recomputed)
        else:
            self.hit[rid], self.recomputed[rid] = r.tokens, r.recomputed

    def ended(self, rid: int, first_ns: int, second_ns: int, done_ns: int) -> None:
        """Request ``rid``'s token times (``second_ns`` < 0: it had no second); it is done."""
        if self.done_ns[rid] != _UNSET:
            raise RuntimeError(f"request {rid} ended twice")
        self.first_token_ns[rid] = first_ns
        if second_ns >= 0:
            self.second_token_ns[rid] = second_ns
        self.done_ns[rid] = done_ns
        self.turns_done += 1

    def failed(self, rid: int, t_ns: int) -> None:
        """Request ``rid`` ended as failed at ``t_ns``."""
        if self.done_ns[rid] != _UNSET or self.failed_ns[rid] != _UNSET:
            raise RuntimeError(f"request {rid} ended twice")
        self.failed_ns[rid] = t_ns
        self.failures += 1

    # --- figures -------------------------------------------------------------------------------------

    def waiting(self) -> tuple[int, int]:
        """Requests open and waiting for a prefill engine, and those with one waiting for a decode engine."""
        prefill = decode = 0
        failed = self.failed_ns
        for rid, (pe_ns, de_ns, done) in enumerate(zip(self.scheduled_pe_ns, self.scheduled_de_ns, self.done_ns)):
            if done != _UNSET or (rid < len(failed) and failed[rid] != _UNSET):
                continue
            if pe_ns == _UNSET:
                prefill += 1
            elif de_ns == _UNSET:
                decode += 1
        return prefill, decode

    def unfinished(self) -> list[int]:
        """Requests admitted but not ended (done or failed)."""
        failed = self.failed_ns
        return [
            rid for rid, t in enumerate(self.done_ns) if t == _UNSET and (rid >= len(failed) or failed[rid] == _UNSET)
        ]

    def failed_count(self) -> int:
        return len(self.failed_ns) - self.failed_ns.count(_UNSET)

    def done_count(self) -> int:
        """Requests that ended with their last token (a scan: for results, not progress)."""
        return len(self.done_ns) - self.done_ns.count(_UNSET)

    def failed_agents(self) -> int:
        """Agents with at least one failed request."""
        agent = self.agent
        return len({agent[rid] for rid, t in enumerate(self.failed_ns) if t != _UNSET})

    def ttft_s(self) -> list[float]:
        return [(f - a) / 1e9 for a, f in zip(self.arrive_ns, self.first_token_ns) if f != _UNSET]

    def ttst_s(self) -> list[float]:
        """Per request with a second token: second token − first token (not from arrival: paper-facts §3.3)."""
        return [(s - f) / 1e9 for f, s in zip(self.first_token_ns, self.second_token_ns) if s != _UNSET]

    def tpot_s(self) -> list[float]:
        """Per request with at least 3 tokens: (last token − second token) / (tokens − 2)."""
        out = []
        for second, done, gen in zip(self.second_token_ns, self.done_ns, self.gen):
            if second != _UNSET and done != _UNSET and gen > 2:
                out.append((done - second) / (gen - 2) / 1e9)
        return out

    def jct_s(self) -> float:
        """Job completion time: first arrival to the last request's end, failed requests' ends included."""
        last = max(max(self.done_ns, default=_UNSET), max(self.failed_ns, default=_UNSET))
        return (last - min(self.arrive_ns)) / 1e9 if last != _UNSET else 0.0

    def working_set_bytes(self, kv_bytes_per_token: int, end_ns: int, since_ns: int = 0) -> dict[str, float]:
        """The KV bytes of the live trajectories over [since_ns, end_ns]: time-weighted ``mean`` and ``max``."""
        # Three streams in time order, merged as they are read (not a list of every change): arrivals, ends,
        # then each agent's departure at its last end. At one instant growth comes before departures; among
        # growths the order does not matter (a context only grows).
        arrive, done, agent_of, prompt, gen = self.arrive_ns, self.done_ns, self.agent, self.prompt, self.gen
        arrive_np, done_np = numpy.frombuffer(arrive, dtype=numpy.int64), numpy.frombuffer(done, dtype=numpy.int64)
        arrivals: Sequence[int] = range(len(arrive))
        if len(arrive) > 1 and bool((numpy.diff(arrive_np) < 0).any()):  # a merged run's ids out of time order
            arrivals = _int_array(numpy.argsort(arrive_np, kind="stable"))
        ended = numpy.flatnonzero(done_np != _UNSET)
        ends = _int_array(ended[numpy.argsort(done_np[ended], kind="stable")])
        last_end: dict[int, int] = {}
        for k in ends:  # in time order: the last one seen is the agent's last end
            last_end[agent_of[k]] = done[k]
        departures = sorted((t, a) for a, t in last_end.items())
        never = 1 << 63
        tokens: dict[int, int] = {}
        live = peak = 0
        area = 0.0
        previous = 0
        n_arrivals, n_ends, n_departures = len(arrivals), len(ends), len(departures)
        i = j = d = 0
        next_arrival = arrive[arrivals[0]] if n_arrivals else never
        next_end = done[ends[0]] if n_ends else never
        next_departure = departures[0][0] if n_departures else never
        t = min(next_arrival, next_end, next_departure)
        while t != never and t <= end_ns:
            area += live * (t - previous)
            previous = t
            if next_arrival == t:
                k = arrivals[i]
                agent, context = agent_of[k], prompt[k]
                i += 1
                next_arrival = arrive[arrivals[i]] if i < n_arrivals else never
            elif next_end == t:
                k = ends[j]
                agent, context = agent_of[k], prompt[k] + gen[k]
                j += 1
                next_end = done[ends[j]] if j < n_ends else never
            else:
                agent, context = departures[d][1], -1
                d += 1
                next_departure = departures[d][0] if d < n_departures else never
            held = tokens.get(agent, 0)
            if context < 0:
                live -= held
                tokens[agent] = 0
            elif context > held:
                live += context - held
                tokens[agent] = context
            following = min(next_arrival, next_end, next_departure)
            if following != t:
                peak = max(peak, live)  # what is held after an instant, not during its changes
            t = following
        area += live * max(0, end_ns - previous)
        mean = area / (end_ns - since_ns) if end_ns > since_ns else 0.0
        return {"mean": mean * kv_bytes_per_token, "max": float(peak * kv_bytes_per_token)}
