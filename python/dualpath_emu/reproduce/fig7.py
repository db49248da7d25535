"""Fig. 7 of the paper (§7.3): offline job completion time vs the number of agents, for each maximum context
length, on the three models, Basic / DualPath / Oracle.

Each point is one offline run of the paper's deployment: ``agents`` agents start at once and replay their
whole trajectories; JCT is from the first arrival to the last request's end. The full experiment is 4 agent
counts × 3 datasets × 3 systems per model (``--model`` picks models): DS 660B alone is 7.6 M agent turns.
``--quick`` runs DS 660B and DS 27B on the storage-bound miniature, 64K, 128 and 256 agents × 40 rounds, and
checks Oracle ≤ DualPath ≤ Basic and that Basic's decode-node storage NICs read nothing.

Compared with the paper (paper-facts §8.2; figure readings are approximate): DualPath/Basic speedup per agent
count on DS 660B 64K (±15%), its best speedup 1.87× (±10%), DualPath within 15% of Oracle, DS 27B's best
speedup 1.78× (±10%); the paper's absolute JCTs are listed as context (calibration fits them, issue 5)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce.common import (
    Cell,
    Comparison,
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

__all__ = ["PAPER_JCT_S", "main"]

AGENTS: Final = (512, 1024, 2048, 4096)
DATASETS: Final = ("32k", "48k", "64k")
MODELS: Final = ("ds660b", "ds27b", "qwen32b")

PAPER_JCT_S: Final[dict[tuple[str, str, int], dict[str, float]]] = {
    # (model, dataset, agents) -> system -> JCT in seconds, read off Fig. 7 [fig~, paper-facts §8.2]
    ("ds660b", "64k", 512): {"basic": 2900.0, "dualpath": 2100.0, "oracle": 2000.0},
    ("ds660b", "64k", 1024): {"basic": 5400.0, "dualpath": 3000.0},
    ("ds660b", "64k", 2048): {"basic": 10100.0, "dualpath": 5400.0},
    ("ds660b", "64k", 4096): {"basic": 19500.0, "dualpath": 10400.0, "oracle": 9400.0},
}
PAPER_BEST_SPEEDUP: Final = {"ds660b": 1.87, "ds27b": 1.78}  # [exact §7.3]


def cells(quick: bool, models: Sequence[str] | None = None) -> list[Cell]:
    """The runs of the figure: every model given (default: DS 660B and DS 27B quick, all three in full)."""
    if quick:
        plan = [(m, "64k", a) for m in (models or ("ds660b", "ds27b")) for a in (128, 256)]
        rounds = 40
    else:
        plan = [(m, d, a) for m in (models or MODELS) for d in DATASETS for a in AGENTS]
        rounds = 0
    return [Cell({"model": m, "dataset": d, "agents": a}, deployment(m, quick=quick, dataset=d, agents=a), system,
                 max_rounds=rounds) for m, d, a in plan for system in SYSTEMS]  # fmt: skip


def compare(jct: dict[tuple[str, str, int], dict[str, float]], *, best: bool = True) -> list[Comparison]:
    """The paper's numbers beside the emulator's, where the emulator ran the same point."""
    out: list[Comparison] = []
    for key, paper in PAPER_JCT_S.items():
        ours = jct.get(key)
        if ours is None:
            continue
        label = f"{key[0]} {key[1]} {key[2]} agents"
        for system, value in paper.items():
            out.append(within(f"{label}: {system} JCT (s)", value, ours[system]))
        if "dualpath" in paper:
            out.append(within(f"{label}: DualPath/Basic speedup", paper["basic"] / paper["dualpath"],
                              ours["basic"] / ours["dualpath"], rel=0.15))  # fmt: skip
        if "oracle" in paper:
            gap = ours["dualpath"] / ours["oracle"]
            out.append(Comparison(f"{label}: DualPath/Oracle JCT", paper["dualpath"] / paper["oracle"], gap, "≤ 1.15",
                                  gap <= 1.15))  # fmt: skip
    for model, paper_best in PAPER_BEST_SPEEDUP.items():
        speedups = [v["basic"] / v["dualpath"] for k, v in jct.items() if k[0] == model]
        if speedups and best:
            out.append(within(f"{model}: best DualPath/Basic speedup", paper_best, max(speedups), rel=0.10))
    return out


def build(args: argparse.Namespace) -> Report:
    results = run_cells(cells(args.quick, args.model), args.jobs, quiet=args.quiet, cache=args.cache, dask=args.dask)
    jct = jct_by(results, "model", "dataset", "agents")
    rows: list[dict[str, Any]] = []
    for r in results:
        s = r.summary
        paper = PAPER_JCT_S.get((r.cell.labels["model"], r.cell.labels["dataset"], r.cell.labels["agents"]), {})
        rows.append({
            **r.cell.labels, "system": r.cell.system, "rounds": r.cell.max_rounds or "all", "jct_s": round(s["jct_s"], 1),
            "paper_jct_s": paper.get(r.cell.system, ""), "turns": s["turns"],
            "speedup_vs_basic": round(jct[(r.cell.labels["model"], r.cell.labels["dataset"], r.cell.labels["agents"])]["basic"] / s["jct_s"], 3),
            "snic_util_pe": round(s["snic_util"]["pe"]["rx"]["mean"], 3),
            "snic_util_de": round(s["snic_util"]["de"]["rx"]["mean"], 3),
            "snic_read_bytes_de": s["snic_read_bytes"]["de"], "wall_s": round(s["wall_s"], 1),
        })  # fmt: skip
    ordered = systems_ordered(jct)
    basic_de_idle = all(r.summary["snic_read_bytes"]["de"] == 0 for r in results if r.cell.system == "basic")
    dualpath_both = all(r.summary["snic_read_bytes"]["de"] > 0 and r.summary["snic_read_bytes"]["pe"] > 0
                        for r in results if r.cell.system == "dualpath")  # fmt: skip
    notes = ["Quick variant: 128/256 agents, first 40 rounds; the paper's points are 512-4,096 whole trajectories."]
    checks = {"oracle <= dualpath <= basic (oracle within 2%)": ordered,
              "basic's decode-node storage NICs read nothing": basic_de_idle,
              "dualpath reads on both sides": dualpath_both}  # fmt: skip
    return Report("fig7", "offline JCT vs agents (Basic / DualPath / Oracle)", rows, compare(jct, best=not args.quick),
                  notes if args.quick else [], lambda path: plot(path, jct), checks)  # fmt: skip


def plot(path: Path, jct: dict[tuple[str, str, int], dict[str, float]]) -> None:
    """One panel per (model, dataset): JCT vs agents per system, the paper's readings as crosses."""
    keys = sorted({(k[0], k[1]) for k in jct}, key=lambda p: (MODELS.index(p[0]), p[1]))
    fig, axes = panels(len(keys))
    for ax, (model, dataset) in zip(axes, keys):
        agents = sorted(k[2] for k in jct if k[:2] == (model, dataset))
        series = {s: [(a, jct[(model, dataset, a)][s]) for a in agents] for s in SYSTEMS}
        paper = {s: [(a, PAPER_JCT_S[(model, dataset, a)][s]) for a in agents
                     if s in PAPER_JCT_S.get((model, dataset, a), {})] for s in SYSTEMS}  # fmt: skip
        jct_panel(ax, series, title=f"{model}, {dataset}", xlabel="agents", paper=paper, log_x=True)
    axes[0].legend(fontsize=7)
    save(fig, path)


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", choices=MODELS, help="only this model (repeat for several)")


def main(argv: list[str] | None = None) -> int:
    return experiment_main("fig7", help_description(__doc__), build, argv, configure=_configure)
