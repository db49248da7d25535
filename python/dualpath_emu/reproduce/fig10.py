"""Fig. 10 of the paper (§7.4): online serving. The largest agent arrival rate (APS, agents per second) each system
sustains within the SLO (TTFT <= 4 s, TPOT <= 50 ms), and TTFT / TTST / TPOT against the rate. TTST is the paper's: the
time from the first to the second token (the PE → DE hand-off, the H2D copy and the first decode step, paper-facts
§3.3), not from arrival.

**Setup.** Agents arrive as a Poisson process at rate APS; each replays its 64K trajectory from round 0 (zero tool
latency, paper-facts §3.3; the paper does not say which trace it uses online). Basic, DualPath and Oracle on DS 660B
2P4D and DS 27B 1P1D (:func:`~dualpath_emu.reproduce.common.deployment`). Paper (paper-facts §8.3):
largest SLO-meeting APS DualPath / Basic = **2.25×** (DS 660B) and **1.67×** (DS 27B), ±20%; edges read from the figure
≈ 0.20 / 0.45 APS (DS 660B Basic / DualPath) and ≈ 0.30 / 0.50 (DS 27B), at ±20% (our tolerance:
absolute throughput rests on hardware figures the paper does not give, paper-facts §10); DualPath's TPOT and TTST within
10% of Basic's at Basic's edge rate ("DualPath ≈ Basic", no extra decode cost).

**The steady-state window** (our choice). A run at rate λ admits ``N = λ × D`` agents, so arrivals last ``D`` emulated
seconds whatever the rate (:attr:`Variant.arrival_s`); the statistics are over the requests that *arrive* in ``[D/2,
D]``, after the ramp-up and before the drain (whole-run statistics are kept as ``run_ttft_*``). That window is steady
only if ``D/2`` exceeds a trajectory's duration (≈ 900-1,000 s for DS 660B near its edge, 550-650 s for DS 27B: the
``trajectory_s_mean`` column). The full variant cannot afford that on a 2-core machine: ``D`` = 1,500 s (DS 660B) and
300 s (DS 27B) put its window in the late ramp, with fewer agents, more of them in their first (prefill-heavy,
read-light) rounds, so edges are biased upward and DualPath's advantage, which grows with the share of reads, is if
anything understated. ``--duration-scale`` lengthens ``D`` at proportional cost.

**The statistic** is the window's **mean** TTFT and TPOT (``--slo-stat``: p50/p90/p99 instead): the paper plots a
central value of a time window and states no percentile. TPOT per request is (last token − second token) / (tokens − 2).
DS 660B's TPOT is over 50 ms at every rate under the one-factor calibration (:mod:`~dualpath_emu.reproduce.calibrate`),
so its SLO edges are 0; each DualPath and Basic search therefore has a twin on the **TTFT half alone**, reported beside
the SLO's as what the prefill side sustains.

**The search** per (model, system) keeps a bracket: ``lo``, the largest rate measured to meet the SLO below ``hi``, the
smallest measured to miss it, on a geometric scale. The first step measures :attr:`Variant.rates_per_step` rates around
a guess (from pilot runs), spread by ``√growth``; while nothing missed (met), the next step multiplies the largest met
(divides the smallest missed) rate by ``growth``, ``growth²`` …; once bracketed, each step splits ``[lo, hi]``
geometrically into :attr:`Variant.refine_rates_per_step` + 1 parts. It stops when ``hi / lo − 1 ≤ resolution``, when
``lo`` reaches the cap (a censored edge, "at least"), or after :attr:`Variant.max_steps`. The **edge** is ``lo``. Oracle
only has to show it is at least DualPath's: it is measured once at its cap, and searches down (resolution 0.5) only if
that misses. Runs are deterministic, but the outcome need not be monotone near the edge: a met rate above ``hi`` is kept
in the rows and ignored by the bracket. Each step's runs, of all searches, run in parallel through :func:`measure` (the
window needs per-request timestamps, which stay in the worker); afterwards DualPath runs at Basic's edge rate, if not
yet measured there, for the TPOT comparison.

``--quick``: the storage-bound miniature (:data:`~dualpath_emu.reproduce.common.QUICK_NODE`, uncalibrated), 12 rounds
per agent, arrivals over 40 s (DS 660B) / 30 s (DS 27B), growth 2, resolution 0.35, at most 3 steps; its checks are the
orderings (DualPath's edge ≥ Basic's, Oracle's ≥ DualPath's, within one resolution step), positive edges, and DualPath's
TPOT within 10% of Basic's at Basic's edge rate.

Measured: EVALUATION.md (fig10), from ``docs/evaluation/fig10.json``."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from dualpath_emu.cluster.config import KvTierSpec
from dualpath_emu.cluster.metrics import Metrics, percentiles
from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce.common import (
    SYSTEMS,
    Cell,
    Comparison,
    Report,
    dataclass_codec,
    deployment,
    experiment_main,
    run_parallel,
    within,
)
from dualpath_emu.reproduce.plots import SYSTEM_COLORS, save
from dualpath_emu.workload.waits import ToolWait

__all__ = [
    "FULL", "MODELS", "PAPER_EDGE_APS", "PAPER_RATIO", "QUICK", "SLO_TPOT_S", "SLO_TTFT_S", "SYSTEMS", "POINTS",
    "Point", "Search", "Variant", "main", "measure", "measure_all", "trajectory_s", "window_bounds_ns",
    "window_stats",
]  # fmt: skip

Stats = dict[str, float]  # p50, p90, p99 and mean.

MODELS: Final = ("ds660b", "ds27b")
SLO_TTFT_S: Final = 4.0
SLO_TPOT_S: Final = 0.050
STATS: Final = ("mean", "p50", "p90", "p99")
PAPER_RATIO: Final[Mapping[str, float]] = MappingProxyType({"ds660b": 2.25, "ds27b": 1.67})
"""Largest SLO-meeting APS, DualPath / Basic [exact §7.4]."""
PAPER_MEAN_RATIO: Final = 1.96  # The arithmetic mean of the two ratios [derived].
PAPER_EDGE_APS: Final[Mapping[tuple[str, str], float]] = MappingProxyType(
    {("ds660b", "basic"): 0.20, ("ds660b", "dualpath"): 0.45, ("ds27b", "basic"): 0.30, ("ds27b", "dualpath"): 0.50}
)
"""APS at the SLO edge, read from Fig. 10 [fig~]."""
RATIO_TOLERANCE: Final = 0.20
TPOT_TOLERANCE: Final = 0.10
WINDOW_FRACTION: Final = 0.5  # The window is the last half of the arrival period.


def _by_system(values: Mapping[str, tuple[float, float, float]]) -> Mapping[tuple[str, str], float]:
    """Per (model, system): ``values[model]`` holds Basic's, DualPath's and Oracle's."""
    return MappingProxyType({(m, s): v for m, per_system in values.items() for s, v in zip(SYSTEMS, per_system)})


@dataclass(frozen=True)
class Variant:
    """The size of the experiment: run length, workload cut, and the search's parameters."""

    arrival_s: Mapping[str, float]
    """Per model: D, the emulated seconds over which agents arrive (a run at rate λ admits round(λ·D) agents)."""
    max_rounds: int  # > 0: each agent replays only its first rounds.
    quick_node: bool
    guess: Mapping[tuple[str, str], float]  # First guess of the edge per (model, system), from pilot runs.
    cap: Mapping[tuple[str, str], float]
    """Per (model, system): the largest rate a search measures; a guess at the cap is measured alone."""
    resolution: float  # Relative width of the final bracket: stop when hi / lo - 1 <= resolution.
    oracle_resolution: float
    growth: float  # Bracketing factor per rate (and the first step's spread, √growth around the guess).
    rates_per_step: int  # Rates per search in the first and the bracketing steps.
    refine_rates_per_step: int  # Rates per search in the steps that split a bracket (1: bisection).
    max_steps: int
    min_agents: int
    label: str

    def agents(self, model: str, rate: float) -> int:
        return max(self.min_agents, round(rate * self.arrival_s[model]))

    def search(self, model: str, system: str, **options: Any) -> Search:
        """The bracket search for (``model``, ``system``) with this variant's settings."""
        key = (model, system)
        return Search(model, system, guess=self.guess[key], cap=self.cap[key],
                      resolution=self.oracle_resolution if system == "oracle" else self.resolution,
                      growth=self.growth, k=self.rates_per_step, max_steps=self.max_steps,
                      refine_k=self.refine_rates_per_step, **options)  # fmt: skip


FULL: Final = Variant(
    arrival_s=MappingProxyType({"ds660b": 1500.0, "ds27b": 300.0}), max_rounds=0, quick_node=False,
    guess=_by_system({"ds660b": (0.2, 0.4, 0.6), "ds27b": (1.5, 2.5, 5.0)}),
    cap=_by_system({"ds660b": (1.0, 1.0, 0.6), "ds27b": (5.0, 5.0, 5.0)}),
    resolution=0.15, oracle_resolution=0.5, growth=1.3, rates_per_step=2, refine_rates_per_step=1, max_steps=5,
    min_agents=16, label="full",
)  # fmt: skip
QUICK: Final = Variant(
    arrival_s=MappingProxyType({"ds660b": 40.0, "ds27b": 30.0}), max_rounds=12, quick_node=True,
    guess=_by_system({"ds660b": (6.0, 9.0, 10.0), "ds27b": (12.0, 20.0, 24.0)}),
    cap=_by_system({"ds660b": (12.0, 12.0, 10.0), "ds27b": (24.0, 24.0, 24.0)}),
    resolution=0.35, oracle_resolution=0.35, growth=2.0, rates_per_step=2, refine_rates_per_step=2, max_steps=3,
    min_agents=8, label="quick",
)  # fmt: skip


# --------------------------------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class Point:
    """One run's figures (plain data), latencies in seconds: ``p50``, ``p90``, ``p99``, ``mean`` over the window."""

    model: str
    system: str
    rate: float
    agents: int
    step: int
    window_start_s: float
    window_end_s: float
    window_requests: int
    ttft_s: dict[str, float]
    ttst_s: dict[str, float]  # Second token − first token.
    tpot_s: dict[str, float]
    run_ttft_s: dict[str, float]  # Over the whole run (ramp and drain included).
    run_tpot_s: dict[str, float]
    turns: int
    end_s: float  # Emulated seconds until the last request ended.
    trajectory_s: float
    """Mean time from an agent's arrival to its last turn's end, over the window's agents (Fig. 11)."""
    wall_s: float

    def meets_slo(self, stat: str = "mean") -> bool:
        return self.meets_ttft(stat) and self.tpot_s[stat] <= SLO_TPOT_S

    def meets_ttft(self, stat: str = "mean") -> bool:
        """The SLO's TTFT half alone (TTFT ≤ 4 s)."""
        return self.window_requests > 0 and self.ttft_s[stat] <= SLO_TTFT_S


def window_bounds_ns(m: Metrics, fraction: float = WINDOW_FRACTION) -> tuple[int, int]:
    """The steady-state window: the last ``fraction`` of the agents' arrival period (first turns' arrivals)."""
    seen: set[int] = set()
    first, last = -1, -1
    for agent, t in zip(m.agent, m.arrive_ns):  # request ids are in arrival order: an agent's first is its arrival
        if agent not in seen:
            seen.add(agent)
            first = t if first < 0 else first
            last = t
    if last < 0:
        return 0, 0
    return round(last - (last - first) * fraction), last


def window_stats(m: Metrics, start_ns: int, end_ns: int) -> tuple[int, Stats, Stats, Stats]:
    """Requests arriving in ``[start_ns, end_ns]``: their number and TTFT, TTST, TPOT percentiles."""
    ttft, ttst, tpot = [], [], []
    for a, f, s, d, g in zip(m.arrive_ns, m.first_token_ns, m.second_token_ns, m.done_ns, m.gen):
        if not start_ns <= a <= end_ns:
            continue
        if f >= 0:
            ttft.append((f - a) / 1e9)
        if s >= 0 and f >= 0:
            ttst.append((s - f) / 1e9)
            if d >= 0 and g > 2:
                tpot.append((d - s) / (g - 2) / 1e9)
    return (len(ttft), percentiles(ttft).as_dict(), percentiles(ttst).as_dict(), percentiles(tpot).as_dict())


def trajectory_s(m: Metrics, start_ns: int, end_ns: int) -> float:
    """Mean seconds from arrival to the last turn's end of the agents whose first turn arrives in the window."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for agent, a, d in zip(m.agent, m.arrive_ns, m.done_ns):
        first.setdefault(agent, a)
        last[agent] = d
    spans = [(last[agent] - a) / 1e9 for agent, a in first.items() if start_ns <= a <= end_ns and last[agent] >= 0]
    return sum(spans) / len(spans) if spans else 0.0


def measure(cell: Cell) -> Point:
    """Run one cell (in whichever process) and reduce it to a :class:`Point`."""
    from dualpath_emu.cluster.run import run_system  # the worker's import

    result = run_system(cell.config, cell.system, cell.trajectories(), seed=cell.seed)
    m = result.metrics
    start, end = window_bounds_ns(m)
    n, ttft, ttst, tpot = window_stats(m, start, end)
    return Point(
        model=cell.labels["model"], system=cell.system, rate=cell.config.arrival_rate, agents=cell.config.agents,
        step=cell.labels["step"], window_start_s=start / 1e9, window_end_s=end / 1e9, window_requests=n,
        ttft_s=ttft, ttst_s=ttst, tpot_s=tpot, run_ttft_s=result.ttft_s, run_tpot_s=result.tpot_s,
        turns=result.turns, end_s=max(m.done_ns, default=0) / 1e9, trajectory_s=trajectory_s(m, start, end),
        wall_s=result.wall_s,
    )  # fmt: skip


POINTS: Final = dataclass_codec(Point)  # How :func:`measure`'s points are cached (JSON).


def measure_all(cells: Sequence[Cell], jobs: int, *, quiet: bool = False, stat: str = "mean",
                cache: Path | None = None, dask: str | None = None) -> list[Point]:  # fmt: skip
    """:func:`measure` for every cell, as :func:`~dualpath_emu.reproduce.common.run_parallel` runs them."""

    def report(cell: Cell, p: Point, done: int, elapsed: float, cached: bool) -> None:
        if not quiet:
            verdict = "meets" if p.meets_slo(stat) else "misses"
            print(f"  [{done}/{len(cells)}] {p.model} {p.system} {p.rate:g} APS ({p.agents} agents): TTFT {stat} "
                  f"{p.ttft_s[stat]:.2f} s, TPOT {p.tpot_s[stat] * 1e3:.1f} ms: {verdict} the SLO "
                  f"({'from the cache' if cached else f'{p.wall_s:.0f} s wall'}; {elapsed:.0f} s so far)",
                  file=sys.stderr, flush=True)  # fmt: skip

    points = run_parallel(measure, cells, jobs, report=report, cache=cache, codec=POINTS, dask=dask)
    return [replace(p, step=c.labels["step"]) for p, c in zip(points, cells)]  # a cached point's own step


# --------------------------------------------------------------------------------------------------- search


def _round_rate(rate: float) -> float:
    """Rates on a 3-significant-digit grid (readable rows, repeatable runs)."""
    return float(f"{rate:.3g}")


@dataclass
class Search:
    """The bracket search for one (model, system)'s edge (see the module docstring)."""

    model: str
    system: str
    guess: float
    cap: float
    resolution: float
    growth: float
    k: int
    max_steps: int
    stat: str = "mean"
    refine_k: int = 2
    criterion: str = "slo"
    """"slo": TTFT and TPOT; "ttft": the TTFT half alone (where decoding alone misses the SLO at every rate)."""
    tool_wait: ToolWait = field(default_factory=ToolWait)
    """The agents' wait before each turn after their first (none in the paper's runs; ``reproduce toolwaits``)."""
    kv_store: KvTierSpec = field(default_factory=KvTierSpec)
    """The store as a KV tier (unbounded in the paper's runs; ``reproduce kvstore``)."""
    points: list[Point] = field(default_factory=list)
    steps: int = 0

    def meets(self, p: Point) -> bool:
        return p.meets_slo(self.stat) if self.criterion == "slo" else p.meets_ttft(self.stat)

    @property
    def lo(self) -> float:
        """The largest rate measured to meet the SLO below :attr:`hi` (0: none)."""
        hi = self.hi
        met = [p.rate for p in self.points if self.meets(p) and (hi is None or p.rate < hi)]
        return max(met, default=0.0)

    @property
    def hi(self) -> float | None:
        """The smallest rate measured to miss the SLO (None: none)."""
        return min((p.rate for p in self.points if not self.meets(p)), default=None)

    @property
    def edge_text(self) -> str:
        """The edge and the bracket's top, for notes and rows: ``0.4 (< 0.46)``."""
        return f"{self.lo:g}" + (f" (< {self.hi:g})" if self.hi is not None else " (censored: >= cap)")

    @property
    def censored(self) -> bool:
        """The edge is at least the cap: every rate up to it met the SLO."""
        return self.hi is None and self.lo >= self.cap

    @property
    def done(self) -> bool:
        lo, hi = self.lo, self.hi
        if self.steps >= self.max_steps or self.censored:
            return True
        return lo > 0 and hi is not None and hi / lo - 1.0 <= self.resolution

    def next_rates(self) -> list[float]:
        """The rates of the next step (none when done)."""
        if self.done:
            return []
        lo, hi, g, k = self.lo, self.hi, self.growth, self.k
        if not self.points and self.guess >= self.cap:
            rates = [self.cap]
        elif not self.points:
            rates = [min(self.cap, self.guess * g ** (j - (k - 1) / 2)) for j in range(k)]
        elif hi is None:
            rates = [min(self.cap, lo * g ** (j + 1)) for j in range(k)]
        elif lo == 0.0:
            rates = [hi / g ** (j + 1) for j in range(k)]
        else:
            k = self.refine_k
            rates = [lo * (hi / lo) ** ((j + 1) / (k + 1)) for j in range(k)]
        measured = {p.rate for p in self.points}
        out = sorted({r for r in map(_round_rate, rates) if r > 0 and r not in measured})
        if not out:  # the grid is finer than the bracket: nothing new to measure
            self.steps = self.max_steps
        return out

    def add(self, points: Sequence[Point]) -> None:
        self.points.extend(points)
        self.steps += 1

    def measured_at(self, rate: float) -> Point | None:
        return next((p for p in self.points if p.rate == rate), None)


def _cell(variant: Variant, model: str, system: str, rate: float, step: int, tool_wait: ToolWait = ToolWait(),
          kv_store: KvTierSpec = KvTierSpec()) -> Cell:  # fmt: skip
    config = deployment(model, quick=variant.quick_node, mode="online", arrival_rate=rate,
                        agents=variant.agents(model, rate), dataset="64k", tool_wait=tool_wait, kv_store=kv_store)  # fmt: skip
    return Cell({"model": model, "step": step}, config, system, max_rounds=variant.max_rounds)


def run_searches(searches: Sequence[Search], variant: Variant, jobs: int, *, quiet: bool = False,
                 cache: Path | None = None, dask: str | None = None) -> None:  # fmt: skip
    """Advance every search step by step, each step's runs of all searches in one parallel batch."""
    step = 0
    while True:
        plan = [(s, rate) for s in searches for rate in s.next_rates()]
        if not plan:
            return
        runs = list(dict.fromkeys((s.model, s.system, s.tool_wait, s.kv_store, rate) for s, rate in plan))
        if not quiet:
            print(f"step {step + 1}: {len(runs)} runs", file=sys.stderr, flush=True)
        cells = [_cell(variant, model, system, rate, step, wait, kv) for model, system, wait, kv, rate in runs]
        stat = searches[0].stat if searches else "mean"
        measured = measure_all(cells, jobs, quiet=quiet, stat=stat, cache=cache, dask=dask)
        by_run = dict(zip(runs, measured))
        for s in searches:
            mine = [by_run[s.model, s.system, s.tool_wait, s.kv_store, rate] for owner, rate in plan if owner is s]
            if mine:
                s.add(mine)
        step += 1


# --------------------------------------------------------------------------------------------------- report


def _stat_row(prefix: str, values: Mapping[str, float], scale: float = 1.0, digits: int = 4) -> dict[str, float]:
    return {f"{prefix}_{k}": round(values[k] * scale, digits) for k in STATS}


def point_row(p: Point, stat: str) -> dict[str, Any]:
    return {
        "kind": "run", "model": p.model, "system": p.system, "rate_aps": p.rate, "agents": p.agents,
        "step": p.step, "turns": p.turns, "window_start_s": round(p.window_start_s, 1),
        "window_end_s": round(p.window_end_s, 1), "window_requests": p.window_requests,
        **_stat_row("ttft_s", p.ttft_s), **_stat_row("ttst_ms", p.ttst_s, 1e3, 3),
        **_stat_row("tpot_ms", p.tpot_s, 1e3, 3), "run_ttft_s_mean": round(p.run_ttft_s["mean"], 4),
        "run_ttft_s_p99": round(p.run_ttft_s["p99"], 4), "run_tpot_ms_mean": round(p.run_tpot_s["mean"] * 1e3, 3),
        "meets_slo": p.meets_slo(stat), "trajectory_s_mean": round(p.trajectory_s, 1), "end_s": round(p.end_s, 1),
        "wall_s": round(p.wall_s, 2),
    }  # fmt: skip


def edge_row(s: Search) -> dict[str, Any]:
    return {"kind": "edge", "model": s.model, "system": s.system, "edge_aps": s.lo,
            "bracket_hi_aps": s.hi if s.hi is not None else "", "censored": s.censored, "runs": len(s.points),
            "slo_stat": s.stat, "criterion": s.criterion}  # fmt: skip


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def build(args: argparse.Namespace) -> Report:
    variant = QUICK if args.quick else FULL
    if args.resolution is not None:
        coarser = max(args.resolution, variant.oracle_resolution)
        variant = replace(variant, resolution=args.resolution, oracle_resolution=coarser)
    if args.duration_scale != 1.0:
        scaled = {m: d * args.duration_scale for m, d in variant.arrival_s.items()}
        variant = replace(variant, arrival_s=MappingProxyType(scaled))
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"fig10: --models: unknown model {m!r} (expected some of {', '.join(MODELS)})")
    stat = args.slo_stat
    searches = {(model, system): variant.search(model, system, stat=stat) for model in models for system in SYSTEMS}
    # The TTFT half alone, for DualPath and Basic: where decoding misses the TPOT SLO at every rate (DS 660B
    # under the one-factor calibration) it still shows how far each system's prefill side carries.
    ttft_searches = {
        key: replace(searches[key], criterion="ttft", points=[], steps=0) for key in searches if key[1] != "oracle"
    }
    every = [*searches.values(), *ttft_searches.values()]
    run_searches(every, variant, args.jobs, quiet=args.quiet, cache=args.cache, dask=args.dask)

    # TPOT at a common rate: Basic's edge (DualPath measured there if it was not already).
    extra: list[tuple[str, Cell]] = []
    for model in models:
        rate = searches[model, "basic"].lo
        if rate > 0 and searches[model, "dualpath"].measured_at(rate) is None:
            extra.append((model, _cell(variant, model, "dualpath", rate, variant.max_steps)))
    if extra and not args.quiet:
        print(f"TPOT at Basic's edge: {len(extra)} runs", file=sys.stderr, flush=True)
    cells = [c for _, c in extra]
    measured = measure_all(cells, args.jobs, quiet=args.quiet, stat=stat, cache=args.cache, dask=args.dask)
    extra_points = {model: p for (model, _), p in zip(extra, measured)}

    rows: list[dict[str, Any]] = []
    for s in searches.values():
        rows.extend(point_row(p, stat) for p in sorted(s.points, key=lambda p: p.rate))
    rows.extend({**point_row(p, stat), "step": "tpot"} for p in extra_points.values())
    rows.extend(edge_row(s) for s in searches.values())
    rows.extend(point_row(p, stat) for s in ttft_searches.values() for p in sorted(s.points, key=lambda p: p.rate)
                if searches[s.model, s.system].measured_at(p.rate) is None)  # fmt: skip
    rows.extend(edge_row(s) for s in ttft_searches.values())

    comparisons: list[Comparison] = []
    checks: dict[str, bool] = {}
    tpot_ratio: dict[str, float] = {}
    ratios: list[float] = []
    for model in models:
        basic, dual, oracle = (searches[model, system] for system in SYSTEMS)
        ratio = _ratio(dual.lo, basic.lo)
        ratios.append(ratio)
        comparisons.append(within(f"{model}: largest SLO-meeting APS, DualPath / Basic", PAPER_RATIO[model], ratio,
                                  rel=RATIO_TOLERANCE))  # fmt: skip
        for s in (basic, dual):
            comparisons.append(within(f"{model}: {s.system} SLO edge (APS)", PAPER_EDGE_APS[model, s.system], s.lo,
                                      rel=RATIO_TOLERANCE))  # fmt: skip
        b_point = basic.measured_at(basic.lo)
        d_point = dual.measured_at(basic.lo) or extra_points.get(model)
        if b_point is not None and d_point is not None:
            tpot_ratio[model] = _ratio(d_point.tpot_s[stat], b_point.tpot_s[stat])
            comparisons.append(within(f"{model}: DualPath TPOT / Basic's at {basic.lo:g} APS", 1.0, tpot_ratio[model],
                                      rel=TPOT_TOLERANCE))  # fmt: skip
            ttst_ratio = _ratio(d_point.ttst_s[stat], b_point.ttst_s[stat])
            comparisons.append(
                within(f"{model}: DualPath TTST / Basic's at {basic.lo:g} APS", 1.0, ttst_ratio, rel=TPOT_TOLERANCE)
            )
        ttft_basic, ttft_dual = ttft_searches[model, "basic"], ttft_searches[model, "dualpath"]
        comparisons.append(within(f"{model}: largest APS meeting TTFT <= {SLO_TTFT_S:g} s alone, DualPath / Basic "
                                  "(not the SLO)", PAPER_RATIO[model], _ratio(ttft_dual.lo, ttft_basic.lo),
                                  rel=RATIO_TOLERANCE))  # fmt: skip
        checks[f"{model}: every edge > 0"] = all(s.lo > 0 for s in (basic, dual, oracle))
        checks[f"{model}: DualPath's edge >= Basic's (within one resolution step)"] = (
            dual.lo * (1.0 + dual.resolution) >= basic.lo and basic.lo > 0
        )
        checks[f"{model}: Oracle's edge >= DualPath's (within one resolution step)"] = (
            oracle.lo * (1.0 + dual.resolution) >= dual.lo and dual.lo > 0
        )
        checks[f"{model}: DualPath's TPOT within 10% of Basic's at Basic's edge"] = (
            model in tpot_ratio and abs(tpot_ratio[model] - 1.0) <= TPOT_TOLERANCE
        )
    if len(ratios) == len(MODELS):
        mean_ratio = sum(ratios) / len(ratios)
        comparisons.append(
            within("mean of the two DualPath / Basic ratios", PAPER_MEAN_RATIO, mean_ratio, rel=RATIO_TOLERANCE)
        )

    notes = [
        f"SLO: TTFT <= {SLO_TTFT_S:g} s and TPOT <= {SLO_TPOT_S * 1e3:g} ms on the {stat} over each run's window "
        f"(requests arriving in the last {WINDOW_FRACTION:.0%} of the arrival period; arrivals over "
        + ", ".join(f"{m} {variant.arrival_s[m]:g} s" for m in models)
        + ").",
        "Edges (APS; lo = largest measured rate meeting the SLO, hi = smallest missing it): "
        + "; ".join(f"{s.model} {s.system} {s.edge_text}" for s in searches.values()),
        "TTFT-alone edges (APS): " + "; ".join(f"{s.model} {s.system} {s.edge_text}" for s in ttft_searches.values()),
    ]
    if args.quick:
        notes.append("Quick variant: storage-bound miniature, 12 rounds per agent, short arrival periods; its edges "
                     "are not the paper's, only the orderings are checked.")  # fmt: skip
    points = {key: list(s.points) for key, s in searches.items()}
    for key, s in ttft_searches.items():
        points[key] += [p for p in s.points if searches[key].measured_at(p.rate) is None]
    for model, p in extra_points.items():
        points[model, "dualpath"].append(p)
    edges = {key: s.lo for key, s in searches.items()}
    return Report("fig10", f"online serving: TTFT/TTST/TPOT vs arrival rate and the SLO edge ({variant.label})", rows,
                  comparisons, notes, lambda path: plot(path, models, points, edges, stat), checks)  # fmt: skip


def plot(path: Path, models: Sequence[str], points: Mapping[tuple[str, str], Sequence[Point]],
         edges: Mapping[tuple[str, str], float], stat: str) -> None:  # fmt: skip
    """Per model (rows): TTFT (s), TTST (second − first token, ms) and TPOT (ms) (the SLO statistic, band
    p50-p90) vs APS per system; the SLO lines, each system's edge dotted. Like the paper's, TTST and TPOT
    leave out the points whose TTFT is over the SLO (the paper's omitted points miss it by TTFT; ours may
    miss it by TPOT alone, which then shows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(len(models), 3, figsize=(13, 3.4 * len(models)), squeeze=False)
    for row, model in enumerate(models):
        for col, (metric, unit, scale, slo) in enumerate(
            (("ttft_s", "s", 1.0, SLO_TTFT_S), ("ttst_s", "ms", 1e3, None), ("tpot_s", "ms", 1e3, SLO_TPOT_S * 1e3))
        ):
            ax = axes[row][col]
            top = 0.0
            for system in SYSTEMS:
                pts = sorted(points.get((model, system), ()), key=lambda p: p.rate)
                if col > 0:
                    pts = [p for p in pts if p.meets_ttft(stat)]
                if not pts:
                    continue
                x = [p.rate for p in pts]
                y = [getattr(p, metric)[stat] * scale for p in pts]
                ax.plot(x, y, marker="o", ms=3, color=SYSTEM_COLORS[system], label=system)
                low = [getattr(p, metric)["p50"] * scale for p in pts]
                high = [getattr(p, metric)["p90"] * scale for p in pts]
                ax.fill_between(x, low, high, color=SYSTEM_COLORS[system], alpha=0.12)
                top = max(top, *y)
                edge = edges.get((model, system), 0.0)
                if edge > 0:
                    ax.axvline(edge, color=SYSTEM_COLORS[system], ls=":", lw=1)
            if slo is not None:
                ax.axhline(slo, color="black", ls="--", lw=1, label="SLO")
            if col < 2:
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
            else:
                ax.set_ylim(0, max(slo or 0.0, top) * 1.1 or None)
            ax.set_xlabel("arrival rate (agents/s)")
            ax.set_ylabel(f"{metric.split('_')[0].upper()} {stat} ({unit})")
            ax.set_title(f"{model}: {metric.split('_')[0].upper()}")
            if col == 0:
                ax.legend(fontsize=7)
    save(fig, path)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slo-stat", choices=STATS, default="mean", help="the window statistic checked against the SLO (default: mean)"
    )
    parser.add_argument("--resolution", type=_positive, default=None,
                        help="relative width at which a search stops (default: 0.15 full, 0.35 quick)")  # fmt: skip
    parser.add_argument("--duration-scale", type=_positive, default=1.0,
                        help="multiply each model's arrival period (and so the agents per run)")  # fmt: skip
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")


def main(argv: list[str] | None = None) -> int:
    return experiment_main("fig10", help_description(__doc__), build, argv, configure=_configure)
