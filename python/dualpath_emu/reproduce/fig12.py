"""Fig. 12 of the paper: the ablation ladder (right, §7.5) and the TTFT breakdown vs arrival rate (left, §7.4).

**Ablation** (offline, DS 660B 2P4D, 64K, 1,024 and 2,048 agents, averaged as in the paper): Basic → ``basic+layerwise``
(layerwise prefill) → ``basic+layerwise+dualpath`` (both read paths, round-robin engine choice; the paper does not say
how that step picks the read side, we take the shorter read queue as DualPath does) → ``dualpath`` (+ its scheduler).
Reported: each step's JCT reduction vs Basic, ``1 − JCT / JCT_basic``; paper 17.21% / 38.19% / 45.62% (±5 points).

**TTFT breakdown** (online, DS 660B, Basic and DualPath at several arrival rates): mean seconds of a turn's TTFT spent
in scheduling (arrival → both engines assigned), allocation (→ its read starts: buffers granted), reading (the storage
read) and prefill (→ first token); paper: DualPath's stays flat while Basic's queueing explodes with the rate (no
numbers, so no targets). Agents arrive over fig10's period (1,500 s for DS 660B: ``rate × 1,500`` agents, whole
trajectories), so the load at each rate is fig10's; the means are over the whole run, ramp and drain included.

``--quick`` (the storage-bound miniature): 192 agents × 40 rounds for the ladder, 48 agents × 20 rounds online at two
rates; checks that the ladder is monotone (each step's JCT at most the previous one's + 2%)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce.common import Cell, CellResult, Report, deployment, experiment_main, run_cells, within
from dualpath_emu.reproduce.fig10 import FULL
from dualpath_emu.reproduce.plots import panels, save

__all__ = ["LADDER", "PAPER_REDUCTION", "main"]

LADDER: Final = ("basic", "basic+layerwise", "basic+layerwise+dualpath", "dualpath")
PAPER_REDUCTION: Final = {"basic+layerwise": 0.1721, "basic+layerwise+dualpath": 0.3819, "dualpath": 0.4562}
"""JCT reduction vs Basic, averaged over 1,024 and 2,048 agents [exact §7.5]."""
RATES: Final = (0.1, 0.2, 0.3, 0.4, 0.5)
COMPONENTS: Final = ("scheduling", "allocation", "reading", "prefill")


def cells(quick: bool) -> tuple[list[Cell], list[Cell]]:
    agents, rounds = ((192,), 40) if quick else ((1024, 2048), 0)
    ladder = [Cell({"part": "ablation", "agents": a}, deployment("ds660b", quick=quick, agents=a), system,
                   max_rounds=rounds) for a in agents for system in LADDER]  # fmt: skip
    online_rounds, rates = (20, (0.2, 0.5)) if quick else (0, RATES)
    online_agents = {rate: 48 if quick else round(rate * FULL.arrival_s["ds660b"]) for rate in rates}
    online = [Cell({"part": "ttft", "rate": rate},
                   deployment("ds660b", mode="online", arrival_rate=rate, agents=online_agents[rate]), system,
                   max_rounds=online_rounds) for rate in rates for system in ("basic", "dualpath")]  # fmt: skip
    return ladder, online


def _by_agents(ladder: Sequence[CellResult]) -> list[dict[str, float]]:
    """Each agent count's JCT per step of the ladder."""
    by_agents: dict[int, dict[str, float]] = {}
    for r in ladder:
        by_agents.setdefault(r.cell.labels["agents"], {})[r.cell.system] = r.jct_s
    return list(by_agents.values())


def build(args: argparse.Namespace) -> Report:
    ladder_cells, online_cells = cells(args.quick)
    results = run_cells([*ladder_cells, *online_cells], args.jobs, quiet=args.quiet, cache=args.cache, dask=args.dask)
    ladder, online = results[: len(ladder_cells)], results[len(ladder_cells) :]
    jcts = _by_agents(ladder)
    reduction = {step: sum(1.0 - jct[step] / jct["basic"] for jct in jcts) / len(jcts) for step in LADDER[1:]}
    rows: list[dict[str, Any]] = []
    for r in ladder:
        rows.append({"part": "ablation", "agents": r.cell.labels["agents"], "system": r.cell.system,
                     "jct_s": round(r.jct_s, 1), "reduction_vs_basic": round(reduction.get(r.cell.system, 0.0), 4)})  # fmt: skip
    for r in online:
        rows.append({"part": "ttft", "rate": r.cell.labels["rate"], "system": r.cell.system,
                     "ttft_mean_s": round(r.summary["ttft_s"]["mean"], 3),
                     **{f"{c}_s": round(r.ttft_breakdown_s[c], 3) for c in COMPONENTS}})  # fmt: skip
    comparisons = [within(f"JCT reduction vs Basic: {step}", PAPER_REDUCTION[step], reduction[step], abs_=0.05)
                   for step in LADDER[1:]]  # fmt: skip
    monotone = all(jct[b] <= jct[a] * 1.02 for jct in jcts for a, b in zip(LADDER, LADDER[1:]))
    notes = ["Quick variant: far smaller than the paper's runs; its reductions are not the paper's."]
    return Report("fig12", "ablation ladder (JCT reduction vs Basic) and TTFT breakdown vs arrival rate", rows,
                  comparisons, notes if args.quick else [], lambda path: plot(path, ladder, online, reduction),
                  {"the ablation ladder is monotone (2% slack)": monotone})  # fmt: skip


def plot(path: Path, ladder: Sequence[CellResult], online: Sequence[CellResult], reduction: dict[str, float]) -> None:
    fig, (left_b, left_d, right) = panels(3, width=13 / 3, height=3.6)
    for ax, system in ((left_b, "basic"), (left_d, "dualpath")):
        points = sorted((r.cell.labels["rate"], r.ttft_breakdown_s) for r in online if r.cell.system == system)
        rates = [f"{rate:g}" for rate, _ in points]
        bottom = [0.0] * len(points)
        for component in COMPONENTS:
            values = [b[component] for _, b in points]
            ax.bar(rates, values, bottom=bottom, label=component)
            bottom = [x + y for x, y in zip(bottom, values)]
        ax.set_title(f"TTFT breakdown, {system}")
        ax.set_xlabel("arrival rate (agents/s)")
        ax.set_ylabel("mean seconds")
    left_b.legend(fontsize=7)
    steps = list(LADDER[1:])
    x = range(len(steps))
    right.bar([i - 0.2 for i in x], [PAPER_REDUCTION[s] * 100 for s in steps], width=0.4, label="paper")
    right.bar([i + 0.2 for i in x], [reduction[s] * 100 for s in steps], width=0.4, label="emulator")
    right.set_xticks(list(x), ["+layerwise", "+dual-path", "+scheduler"])
    right.set_ylabel("JCT reduction vs Basic (%)")
    right.set_title("ablation")
    right.legend(fontsize=7)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    return experiment_main("fig12", help_description(__doc__), build, argv)
