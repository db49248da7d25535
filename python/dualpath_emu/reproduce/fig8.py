"""Fig. 8 of the paper (§7.3): the prefill/decode ratio on DS 27B — 1P1D, 2P1D and 1P2D, offline.

DS 27B fits one node per engine group (EP8), so the P/D ratio is the number of prefill and decode nodes. The paper gives
the mean speedup over its points, 1.64×, and the best, 2.46× (1P2D: Basic ≈8,300 s vs DualPath ≈3,400 s), but not the
agent counts or context of the figure's points [not found]: we run the 64K dataset with 512, 1,024 and 2,048 agents per
ratio (3 × 3 points × Basic / DualPath / Oracle), and compare the mean and best DualPath/Basic speedup (±15%).

``--quick`` (the storage-bound miniature): 128 and 256 agents × 40 rounds per ratio; checks Oracle ≤ DualPath ≤ Basic at
every point."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Final

from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce.common import (
    Cell,
    Report,
    SYSTEMS,
    deployment,
    experiment_main,
    jct_by,
    run_cells,
    systems_ordered,
    within,
)
from dualpath_emu.reproduce.plots import jct_panel, panels, save

__all__ = ["RATIOS", "main"]

RATIOS: Final = {"1P1D": (1, 1), "2P1D": (2, 1), "1P2D": (1, 2)}
PAPER_MEAN_SPEEDUP: Final = 1.64  # [exact §7.3]
PAPER_BEST_SPEEDUP: Final = 2.46  # [exact §7.3], at 1P2D


def build(args: argparse.Namespace) -> Report:
    agents, rounds = ((128, 256), 40) if args.quick else ((512, 1024, 2048), 0)
    cells = [Cell({"ratio": ratio, "agents": a}, deployment("ds27b", quick=args.quick, pe_nodes=p, de_nodes=d,
                                                            agents=a), system, max_rounds=rounds)
             for ratio, (p, d) in RATIOS.items() for a in agents for system in SYSTEMS]  # fmt: skip
    results = run_cells(cells, args.jobs, quiet=args.quiet, cache=args.cache, dask=args.dask)
    jct = jct_by(results, "ratio", "agents")
    speedups = {key: v["basic"] / v["dualpath"] for key, v in jct.items()}
    rows: list[dict[str, Any]] = [
        {"ratio": r.cell.labels["ratio"], "agents": r.cell.labels["agents"], "system": r.cell.system,
         "jct_s": round(r.jct_s, 1), "speedup_vs_basic": round(jct[(r.cell.labels["ratio"], r.cell.labels["agents"])]["basic"] / r.jct_s, 3)}
        for r in results
    ]  # fmt: skip
    comparisons = [
        within("mean DualPath/Basic speedup", PAPER_MEAN_SPEEDUP, sum(speedups.values()) / len(speedups), rel=0.15),
        within("best DualPath/Basic speedup", PAPER_BEST_SPEEDUP, max(speedups.values()), rel=0.15),
    ]
    ordered = systems_ordered(jct)
    notes = ["Quick variant: small runs, the speedups are not the paper's."] if args.quick else []
    checks = {"oracle <= dualpath <= basic at every point (oracle within 2%)": ordered}
    return Report("fig8", "P/D ratio on DS 27B (1P1D, 2P1D, 1P2D), offline JCT", rows, comparisons, notes,
                  lambda path: plot(path, jct), checks)  # fmt: skip


def plot(path: Path, jct: dict[tuple[str, int], dict[str, float]]) -> None:
    fig, axes = panels(len(RATIOS))
    for ax, ratio in zip(axes, RATIOS):
        agents = sorted(a for r, a in jct if r == ratio)
        series = {s: [(a, jct[(ratio, a)][s]) for a in agents] for s in SYSTEMS}
        jct_panel(ax, series, title=f"DS 27B {ratio}", xlabel="agents")
    axes[0].legend(fontsize=7)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    return experiment_main("fig8", help_description(__doc__), build, argv)
