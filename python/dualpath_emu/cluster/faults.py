"""Faults: what fails, when and how badly (docs/faults.md); :mod:`~dualpath_emu.cluster.fault_injector` makes them
happen. A run's :class:`FaultPlan` is a list of :class:`Fault`\\ s (``[[faults]]``, ``--faults FILE``) and
optionally :class:`RandomFaults` drawn from the run's seed as it goes (``[random_faults]``), so one seed replays one
failure history. Kinds: ``down``, ``degrade``, ``latency``, ``slow_storage`` and ``crash``; faults on one port at
once combine (the lowest factor and the largest latency hold)."""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast

from dualpath_emu.cluster.identity import GroupId
from dualpath_emu.config import ScenarioError, Table, load_toml

__all__ = ["KINDS", "engine_group_names", "MAX_FAULT_WINDOWS", "MAX_TIME_S", "RANDOM_KINDS", "Counts", "Fault", "FaultPlan", "FaultWatch",
           "FaultRecords", "FaultTotals", "Kind", "RandomFaults", "FaultWindow", "fault_summary", "fault_tables", "fault_report",
           "load_fault_file", "read_fault_plan", "sorted_counts", "target_ports"]  # fmt: skip

Kind = Literal["down", "degrade", "latency", "slow_storage", "crash"]
KINDS: Final[tuple[Kind, ...]] = ("down", "degrade", "latency", "slow_storage", "crash")
RANDOM_KINDS: Final[tuple[Kind, ...]] = ("down", "degrade", "latency", "crash")
MAX_FAULTS: Final = 10_000  # Faults one plan may list (a schedule, not a trace: random ones are drawn as the run goes).
MAX_TIME_S: Final = 1e7  # Latest start and longest duration of a fault (116 days: far beyond any run).
MAX_RATE_PER_NODE_HOUR: Final = 3600.0
MIN_RATE_PER_NODE_HOUR: Final = 1e-6
"""A rate above 0 but below this is refused (one fault per 114 years of a node: none in any run)."""


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` on ``target`` from ``at_s`` for ``duration_s`` (None: to the end of the run)."""

    kind: Kind
    target: str
    at_s: float
    duration_s: float | None = None
    factor: float = 0.0  # What is left of the rates (``degrade``, ``slow_storage``; ``down`` is 0).
    latency_s: float = 0.0  # Added per operation (``latency``, ``slow_storage``).
    restart_s: float = 0.0  # ``crash``: how long the engine is down before it comes back empty.

    def describe(self) -> str:
        if self.kind == "crash":
            return f"{self.target} crashes at {self.at_s:g} s, back {self.restart_s:g} s later"
        span = "to the end" if self.duration_s is None else f"for {self.duration_s:g} s"
        what = {"down": "down", "degrade": f"at {self.factor:g} of its rate", "latency": f"+{self.latency_s * 1e3:g} ms",
                "slow_storage": f"at {self.factor:g}, +{self.latency_s * 1e3:g} ms"}[self.kind]  # fmt: skip
        return f"{self.target} {what} at {self.at_s:g} s {span}"


@dataclass(frozen=True)
class RandomFaults:
    """Faults drawn from the run's seed: per node-hour rates by kind, exponential durations."""

    per_node_hour: Mapping[str, float]
    mean_duration_s: float
    factor: float = 0.5  # What a random ``degrade`` leaves of the rates.
    latency_s: float = 0.001  # What a random ``latency`` fault adds.
    restart_s: float = 30.0  # How long a randomly crashed engine is down.


@dataclass(frozen=True)
class FaultPlan:
    """A run's faults: listed ones and random ones (none by default)."""

    faults: tuple[Fault, ...] = ()
    random: RandomFaults | None = None

    @property
    def any(self) -> bool:
        return bool(self.faults) or (self.random is not None and any(self.random.per_node_hour.values()))

    def plus(self, other: FaultPlan) -> FaultPlan:
        """This plan and ``other``'s faults (``other``'s random faults replace this one's, if it has any)."""
        return FaultPlan(self.faults + other.faults, other.random if other.random is not None else self.random)

    def describe(self) -> str:
        parts = [f.describe() for f in self.faults]
        if self.random is not None and any(self.random.per_node_hour.values()):
            rates = ", ".join(f"{k} {r:g}" for k, r in self.random.per_node_hour.items() if r)
            parts.append(f"random ({rates} per node-hour, mean {self.random.mean_duration_s:g} s)")
        return "; ".join(parts)


# --------------------------------------------------------------------------------------------------- targets

# One spelling per port, NIC and node, the topology's: ASCII digits (\\d matches any script's) without leading
# zeros, at most 9 (int() never meets an over-long one), lower case, nothing around it.
_N = r"(0|[1-9][0-9]{0,8})"
_NODE = re.compile(rf"n{_N}")
_NIC = re.compile(rf"n{_N}\.(snic|cnic{_N})")
_PORT = re.compile(rf"n{_N}\.(?:(snic|cnic{_N})\.(rx|tx)|dram)")
_STORAGE_NIC = re.compile(rf"n{_N}\.snic(\.rx|\.tx)?")


def target_ports(target: str, nodes: int, gpus: int) -> tuple[str, ...] | None:
    """The port names ``target`` stands for in this cluster (None: none; only the canonical spelling resolves)."""
    if target == "storage":
        return ("3fs.read", "3fs.write")
    if target in ("3fs.read", "3fs.write"):
        return (target,)

    def nic(node: int, which: str) -> tuple[str, ...]:
        return (f"n{node}.{which}.rx", f"n{node}.{which}.tx")

    def ok(node: str, gpu: str | None = None) -> bool:
        return int(node) < nodes and (gpu is None or int(gpu) < gpus)

    if (m := _NODE.fullmatch(target)) and ok(m[1]):
        node = int(m[1])
        return nic(node, "snic") + tuple(p for g in range(gpus) for p in nic(node, f"cnic{g}"))
    if (m := _NIC.fullmatch(target)) and ok(m[1], m[3]):
        return nic(int(m[1]), m[2])
    if (m := _PORT.fullmatch(target)) and ok(m[1], m[3]):
        return (f"n{int(m[1])}.{m[2]}.{m[4]}",) if m[2] else (f"n{int(m[1])}.dram",)
    return None


def _loose(text: str) -> str:
    """``text`` as someone may have meant it (NFKC, ASCII digits, lower case), for a hint only."""
    folded = unicodedata.normalize("NFKC", text).strip().strip(".").strip().lower()
    return re.sub(r"\d{1,18}", lambda m: str(int(m[0])), folded)


def _did_you_mean(target: str, known: Callable[[str], bool]) -> str:
    """`` (write it 'n1.snic')`` if a loose reading of ``target`` is a name ``known`` accepts, else ''."""
    guess = _loose(target[:200])
    return f" (write it {guess!r})" if guess != target and known(guess) else ""


def engine_group_names(pe_nodes: int, de_nodes: int, prefill_ep_nodes: int) -> tuple[str, ...]:
    """The engines a ``crash`` can take down: a prefill group per EP group, an engine per decode node."""
    return (*(GroupId("pe", n).name for n in range(0, pe_nodes, max(1, prefill_ep_nodes))),
            *(GroupId("de", pe_nodes + i).name for i in range(de_nodes)))  # fmt: skip


def _check_target(t: Table, kind: Kind, target: str, nodes: int, gpus: int, engines: Sequence[str]) -> str:
    """``target`` if it names what ``kind`` acts on here, else a :class:`ScenarioError` (with a spelling hint)."""
    if kind == "crash":
        if target not in engines:
            hint = _did_you_mean(target, lambda g: g in engines)
            raise t.error("target", f'an engine for kind = "crash": one of {", ".join(engines)}{hint}', target)
        return target
    if kind == "slow_storage" and target != "storage":
        hint = _did_you_mean(target, lambda g: g == "storage")
        raise t.error("target", f'the storage cluster, "storage", for kind = "slow_storage"{hint}', target)
    if target_ports(target, nodes, gpus) is None:
        hint = _did_you_mean(target, lambda g: target_ports(g, nodes, gpus) is not None)
        raise t.error(
            "target", f"a port (n0.snic.rx, n0.cnic0.tx, n0.dram, 3fs.read), a NIC (n0.snic, n0.cnic0), a node "
            f"(n0 … n{nodes - 1}) or storage; GPUs 0 … {gpus - 1}; ASCII digits, no leading zeros{hint}", target)  # fmt: skip
    return target


# --------------------------------------------------------------------------------------------------- reading


def fault_tables(top: Table) -> tuple[list[Table], Table | None]:
    """The ``[[faults]]`` and ``[random_faults]`` tables of ``top``, read by :func:`read_fault_plan` later."""
    entries = top.tables("faults")
    if len(entries) > MAX_FAULTS:
        raise top.error("faults", f"at most {MAX_FAULTS:,} faults", f"{len(entries):,} of them")
    random = top.table("random_faults")  # asked for even when absent: an error lists it among the known keys
    return entries, (random if "random_faults" in top else None)


def read_fault_plan(
    tables: tuple[list[Table], Table | None], nodes: int, gpus: int, engines: Sequence[str] = ()
) -> FaultPlan:
    """The faults of :func:`fault_tables`, checked against this cluster's nodes, GPUs and ``engines``."""
    entries, r = tables
    faults = []
    for t in entries:
        kind = cast(Kind, t.get_str("kind", choices=KINDS))
        target = _check_target(t, kind, t.get_str("target"), nodes, gpus, engines)
        at_s = t.get_float("at_s", min=0.0, max=MAX_TIME_S)
        if kind == "crash":
            if "duration_s" in t:
                raise t.error("duration_s", 'no duration for kind = "crash" (the engine is back restart_s later)')
            restart = t.get_float("restart_s", min=0.0, max=MAX_TIME_S, min_exclusive=True)
            t.finish()
            faults.append(Fault(kind, target, at_s, restart_s=restart))
            continue
        if "restart_s" in t:
            raise ScenarioError(f'{t.where("restart_s")} is only for kind = "crash"; remove it')
        duration = (
            t.get_float("duration_s", 0.0, min=0.0, max=MAX_TIME_S, min_exclusive=True) if "duration_s" in t else None
        )
        if kind == "down" and duration is None and not _storage_nic(target):
            raise t.error("duration_s", 'a duration for kind = "down" on this target (only a storage NIC may stay down '
                          "to the end of the run: reads stalled there are given up; what crosses another port would "
                          "wait for ever)")  # fmt: skip
        factor = _effect(t, "factor", kind in ("degrade", "slow_storage"), 1.0, 1.0, min_exclusive=True)
        latency = _effect(t, "latency_s", kind in ("latency", "slow_storage"), 0.0, 60.0)
        if kind == "slow_storage" and factor == 1.0 and latency == 0.0:
            raise t.error("factor", 'a factor below 1 or a latency_s above 0 for kind = "slow_storage"', factor)
        t.finish()
        faults.append(Fault(kind, target, at_s, duration, factor, latency))
    random = None
    if r is not None:
        rates: dict[str, float] = {kind: _rate(r, f"{kind}_per_node_hour") for kind in RANDOM_KINDS}
        random = RandomFaults(rates,
                              r.get_float("mean_duration_s", 60.0, min=0.001, max=MAX_TIME_S),
                              r.get_float("factor", 0.5, min=0.0, max=1.0, min_exclusive=True),
                              r.get_float("latency_s", 0.001, min=0.0, max=60.0, min_exclusive=True),
                              r.get_float("restart_s", 30.0, min=0.0, max=MAX_TIME_S, min_exclusive=True))  # fmt: skip
        r.finish()
    return FaultPlan(tuple(faults), random)


def _storage_nic(target: str) -> bool:
    """Whether ``target`` is a storage NIC or one of its directions (``n0.snic``, ``n0.snic.rx``)."""
    return _STORAGE_NIC.fullmatch(target) is not None


def _rate(t: Table, key: str) -> float:
    rate = t.get_float(key, 0.0, min=0.0, max=MAX_RATE_PER_NODE_HOUR)
    if 0.0 < rate < MIN_RATE_PER_NODE_HOUR:
        raise t.error(key, f"0 or a number in [{MIN_RATE_PER_NODE_HOUR:g}, {MAX_RATE_PER_NODE_HOUR:g}]", rate)
    return rate


def _effect(t: Table, key: str, used: bool, default: float, high: float, min_exclusive: bool = False) -> float:
    """A fault's ``factor`` or ``latency_s`` in [0, ``high``]; refused on a kind that does not use it (0 then)."""
    if not used:
        if key in t:
            raise ScenarioError(f"{t.where(key)} is not used by this kind of fault; remove it")
        return 0.0
    return t.get_float(key, default, min=0.0, max=high, min_exclusive=min_exclusive)


MAX_FAULT_WINDOWS: Final = 1000
"""Fault windows a run reports one by one; later ones are added up per kind and target (bounded)."""


@dataclass
class FaultWindow:
    """When one fault acted: from ``start_ns`` to ``end_ns`` (None: until the run ended)."""

    kind: str
    target: str
    start_ns: int
    end_ns: int | None = None


@dataclass
class FaultTotals:
    """The windows of one kind of fault on one target after the first :data:`MAX_FAULT_WINDOWS`, added up."""

    kind: str
    target: str
    windows: int = 0
    acted_ns: int = 0  # How long the windows that ended acted, together (overlapping ones each count).
    open: int = 0
    open_starts_ns: int = 0  # How many have not ended, and the sum of their starts (each acts to the run's end).
    counted: list[int] = field(default_factory=lambda: [0, 0, 0])
    """Redispatched, failed and reads moved while the ended ones acted."""
    open_counts: list[int] = field(default_factory=lambda: [0, 0, 0])
    """The same counters' values when the open ones started (their share is counted at the run's end)."""


Counts = Callable[[int, bool], Sequence[int]]
"""``counts(t_ns, end)``: the run's redispatches, failed requests and reads moved so far at ``t_ns`` (those at
``t_ns`` too if ``end``): what a window from ``a`` to ``b`` saw is ``counts(b, True) - counts(a, False)``."""


@dataclass
class _AddedUp:
    """An open window past the cap: only what its end needs to add it to its :class:`FaultTotals`."""

    totals: FaultTotals
    start_ns: int
    at: Sequence[int]


class FaultRecords:
    """A run's fault windows: the first ``cap`` one by one (:attr:`detailed`), the rest summed (:attr:`totals`)."""

    def __init__(self, counts: Counts, cap: int | None = None) -> None:
        self.detailed: list[FaultWindow] = []
        self.totals: dict[tuple[str, str], FaultTotals] = {}
        self._counts, self._cap = counts, MAX_FAULT_WINDOWS if cap is None else cap

    def start(self, kind: str, target: str, t_ns: int) -> FaultWindow | _AddedUp:
        """A window opens at ``t_ns``: pass what this returns to :meth:`end` when it ends."""
        if len(self.detailed) < self._cap:
            window = FaultWindow(kind, target, t_ns)
            self.detailed.append(window)
            return window
        totals = self.totals.get((kind, target))
        if totals is None:
            totals = self.totals[(kind, target)] = FaultTotals(kind, target)
        totals.windows += 1
        totals.open += 1
        totals.open_starts_ns += t_ns
        at = self._counts(t_ns, False)
        totals.open_counts = [o + a for o, a in zip(totals.open_counts, at)]
        return _AddedUp(totals, t_ns, at)

    def end(self, window: FaultWindow | _AddedUp, t_ns: int) -> None:
        if isinstance(window, FaultWindow):
            window.end_ns = t_ns
            return
        totals = window.totals
        totals.open -= 1
        totals.open_starts_ns -= window.start_ns
        totals.acted_ns += t_ns - window.start_ns
        now = self._counts(t_ns, True)
        totals.counted = [c + n - a for c, n, a in zip(totals.counted, now, window.at)]
        totals.open_counts = [o - a for o, a in zip(totals.open_counts, window.at)]


class FaultWatch:
    """A virtual run's faults as its engines observe them (:class:`~.observations.FaultChanged`, each start after
    its :class:`~.observations.FaultPlanned`): their windows in :attr:`records` (each with the redispatches,
    failures and moved reads ``counts`` has then) and those acting now (:meth:`acting`, what a stalled run's error
    names). Memory: the windows up to :data:`MAX_FAULT_WINDOWS`, then the faults acting."""

    def __init__(self, counts: Counts) -> None:
        self.records = FaultRecords(counts)
        self._open: dict[tuple[str, str], list[tuple[FaultWindow | _AddedUp, int, int]]] = {}
        self._planned: tuple[int, int] | None = None

    def planned(self, now_ns: int, record: Any) -> None:
        """A :class:`~.observations.FaultPlanned`: when the fault that starts next was planned, and for how long."""
        self._planned = (record.at_ns, record.duration_ns)

    def changed(self, now_ns: int, record: Any) -> None:
        """A :class:`~.observations.FaultChanged` at ``now_ns``: a window opens, or the oldest open one of its
        kind and target closes."""
        key = (record.fault, record.target)
        if record.phase == "start":
            window = self.records.start(record.fault, record.target, now_ns)
            at_ns, duration_ns = self._planned if self._planned is not None else (now_ns, -1)
            self._open.setdefault(key, []).append((window, at_ns, duration_ns))
            self._planned = None
            return
        open_ = self._open.get(key)
        if open_:
            self.records.end(open_.pop(0)[0], now_ns)
            if not open_:
                del self._open[key]

    def acting(self) -> list[str]:
        """The faults acting now, in words, in order of start (then of their words: one order, whichever order an
        instant's inputs came in, ``order_seed``)."""
        out = []
        for (kind, target), windows in self._open.items():
            for _, start, duration_ns in windows:  # (start: the schedule's time, from the run's start)
                span = ("to the end" if duration_ns < 0 else f"back {duration_ns / 1e9:g} s later" if kind == "crash"
                        else f"for {duration_ns / 1e9:g} s")  # fmt: skip
                out.append((start, f"{kind} {target} since {start / 1e9:,.3f} s, {span}"))
        return [text for _, text in sorted(out)]


def sorted_counts(
    redispatch_ns: Sequence[int] = (), failed_ns: Sequence[int] = (), read_moved_ns: Sequence[int] = ()
) -> Counts:
    """:data:`Counts` from the times of a run's redispatches, failures (-1: none) and reads moved."""
    columns = [sorted(redispatch_ns), sorted(t for t in failed_ns if t >= 0), sorted(read_moved_ns)]

    def counts(t_ns: int, end: bool) -> list[int]:
        find = bisect.bisect_right if end else bisect.bisect_left
        return [find(c, t_ns) for c in columns]

    return counts


def fault_summary(windows: FaultRecords | Iterable[FaultWindow], done_ns: Sequence[int], end_ns: int,
                  redispatch_ns: Sequence[int] = (), failed_ns: Sequence[int] = (),
                  read_moved_ns: Sequence[int] = ()) -> dict[str, Any]:  # fmt: skip
    """A run's ``faults`` (:func:`fault_report` of the first :data:`MAX_FAULT_WINDOWS` windows) and, if there
    were more, ``faults_aggregated``: per kind and target their windows, how long they acted together (to the
    run's end if open) and what they saw (each counted once per window it fell in). ``windows``: a run's
    :class:`FaultRecords`, or every window (an event log's: added up here)."""
    if not isinstance(windows, FaultRecords):
        records = FaultRecords(sorted_counts(redispatch_ns, failed_ns, read_moved_ns))
        for w in sorted(windows, key=lambda w: w.start_ns):
            window = records.start(w.kind, w.target, w.start_ns)
            if w.end_ns is not None:
                records.end(window, w.end_ns)
        windows = records
    out: dict[str, Any] = {
        "faults": fault_report(windows.detailed, done_ns, end_ns, redispatch_ns, failed_ns, read_moved_ns)
    }
    if windows.totals:
        at_end = sorted_counts(redispatch_ns, failed_ns, read_moved_ns)(end_ns, True) if any(
            t.open for t in windows.totals.values()) else [0, 0, 0]  # fmt: skip
        rows = []
        for t in sorted(windows.totals.values(), key=lambda t: (t.kind, t.target)):
            counted = [c + t.open * e - o for c, e, o in zip(t.counted, at_end, t.open_counts)]
            rows.append({"kind": t.kind, "target": t.target, "windows": t.windows,
                         "acted_s": (t.acted_ns + t.open * end_ns - t.open_starts_ns) / 1e9, "not_ended": t.open,
                         "redispatched": counted[0], "failed": counted[1], "reads_moved": counted[2]})  # fmt: skip
        out["faults_aggregated"] = {
            "windows": sum(r["windows"] for r in rows),
            "detailed": len(out["faults"]),
            "note": f"the faults after the first {len(out['faults']):,} are added up per kind and target, not listed",
            "by_kind_target": rows,
        }
    return out


def fault_report(windows: Iterable[FaultWindow], done_ns: Sequence[int], end_ns: int, redispatch_ns: Sequence[int] = (),
                 failed_ns: Sequence[int] = (), read_moved_ns: Sequence[int] = ()) -> list[dict[str, Any]]:  # fmt: skip
    """Per fault: turns finished per second before it (over as long as it lasted), during and after it (as long
    again), the time from its end until the rate over a window (its length, at most 30 s) is back to 90% of the
    rate before (None: not within the run, or nothing finished before), and, while it acted (both ends
    included), the reads moved to the other side, the requests dispatched again and those that failed."""
    done = sorted(t for t in done_ns if t >= 0)
    counts = sorted_counts(redispatch_ns, failed_ns, read_moved_ns)

    def rate(a: int, b: int) -> float:
        return (bisect.bisect_left(done, b) - bisect.bisect_left(done, a)) / ((b - a) / 1e9) if b > a else 0.0

    out = []
    for w in windows:
        kind, target, start, stop = w.kind, w.target, w.start_ns, w.end_ns
        stop_ns = end_ns if stop is None else min(stop, end_ns)
        length = max(1, stop_ns - start)
        before = rate(max(0, start - length), start)
        after = rate(stop_ns, min(end_ns, stop_ns + length))
        recovery = None
        if stop is not None and before > 0 and stop_ns < end_ns:
            window = min(length, 30 * 10**9)
            t = stop_ns
            while t + window <= end_ns:
                if rate(t, t + window) >= 0.9 * before:
                    recovery = (t - stop_ns) / 1e9
                    break
                t += max(window // 10, 10**8)
        redispatched, failed, moved = (b - a for b, a in zip(counts(stop_ns, True), counts(start, False)))
        out.append({"kind": kind, "target": target, "start_s": start / 1e9, "end_s": None if stop is None else stop / 1e9,
                    "turns_per_s_before": before, "turns_per_s_during": rate(start, stop_ns),
                    "turns_per_s_after": after, "recovery_s": recovery, "reads_moved": moved,
                    "redispatched": redispatched, "failed": failed})  # fmt: skip
    return out


KIND: Final = "faults"  # What a ``--faults`` file says at its top: ``kind = "faults"``.


def load_fault_file(path: str | Path, nodes: int, gpus: int, engines: Sequence[str] = ()) -> FaultPlan:
    """The fault plan of the file ``path`` (``kind = "faults"``, then ``[[faults]]`` and ``[random_faults]``)."""
    top = load_toml(path)
    top.get_str("kind", choices=(KIND,))
    tables = fault_tables(top)
    top.finish()
    return read_fault_plan(tables, nodes, gpus, engines)
