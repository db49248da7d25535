"""Fig. 9 of the paper (§7.3): scaling the append length and the generation length (DS 660B 2P4D, 64K, 1,024 agents,
offline).

Every trajectory's appends (or generated lengths) are multiplied by a scale and the trajectory is cut again at the
dataset's maximum length (:func:`~dualpath_emu.workload.generator.scaled`), so longer appends mean fewer turns. Scales
1, 1.5, 2 and 3 (read off the figure [fig~]). Compared: DualPath/Basic speedup across the append scales, paper
1.82–1.99× (each within ±15% of that range); the paper's trends are checked too — the Basic–Oracle gap shrinks as
appends grow (more compute per byte read), and the JCT of every system falls with the scale (fewer turns).

``--quick`` (the storage-bound miniature): 192 agents × 40 rounds at scales 1 and 3 (appends only); checks Oracle ≤
DualPath ≤ Basic."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
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
)
from dualpath_emu.reproduce.plots import jct_panel, panels, save

__all__ = ["SCALES", "main"]

SCALES: Final = (1.0, 1.5, 2.0, 3.0)
PAPER_SPEEDUP_RANGE: Final = (1.82, 1.99)  # DualPath/Basic over the append scales [exact §7.3]


def build(args: argparse.Namespace) -> Report:
    agents, rounds = (192, 40) if args.quick else (1024, 0)
    plan = [("append", s) for s in ((1.0, 3.0) if args.quick else SCALES)]
    if not args.quick:
        plan += [("gen", s) for s in SCALES[1:]]  # scale 1 is the append series' first point
    config = deployment("ds660b", quick=args.quick, agents=agents)
    cells = [Cell({"knob": knob, "scale": scale}, config, system, max_rounds=rounds,
                  append_factor=scale if knob == "append" else 1.0, gen_factor=scale if knob == "gen" else 1.0)
             for knob, scale in plan for system in SYSTEMS]  # fmt: skip
    results = run_cells(cells, args.jobs, quiet=args.quiet, cache=args.cache, dask=args.dask)
    jct: dict[tuple[str, float], dict[str, float]] = jct_by(results, "knob", "scale")
    if ("append", 1.0) in jct and not args.quick:
        jct[("gen", 1.0)] = jct[("append", 1.0)]
    rows: list[dict[str, Any]] = [
        {"knob": knob, "scale": scale, **{f"{s}_jct_s": round(v[s], 1) for s in SYSTEMS},
         "speedup": round(v["basic"] / v["dualpath"], 3), "basic_over_oracle": round(v["basic"] / v["oracle"], 3)}
        for (knob, scale), v in sorted(jct.items())
    ]  # fmt: skip
    low, high = PAPER_SPEEDUP_RANGE
    comparisons = []
    for (knob, scale), v in sorted(jct.items()):
        if knob != "append":
            continue
        speedup = v["basic"] / v["dualpath"]
        paper = min(max(speedup, low), high)  # the nearest point of the paper's range
        ok = low * 0.85 <= speedup <= high * 1.15
        comparisons.append(
            Comparison(f"append ×{scale:g}: DualPath/Basic speedup", paper, speedup, "1.82-1.99 ±15%", ok)
        )
    append = [v for (knob, _), v in sorted(jct.items()) if knob == "append"]  # JCTs by growing append scale
    gaps = [v["basic"] / v["oracle"] for v in append]
    shrinking = all(b <= a * 1.02 for a, b in zip(gaps, gaps[1:]))
    ordered = systems_ordered(jct)
    checks = {"oracle <= dualpath <= basic (oracle within 2%)": ordered}
    if not args.quick:
        checks["the Basic-Oracle gap shrinks as appends grow"] = shrinking
        checks["every system's JCT falls as appends grow (fewer turns)"] = all(
            b[s] <= a[s] * 1.02 for a, b in zip(append, append[1:]) for s in SYSTEMS
        )
    notes = [f"Basic/Oracle JCT over the append scales: {', '.join(f'{g:.2f}' for g in gaps)}"]
    return Report("fig9", "append and generation scaling (DS 660B, 64K)", rows, [] if args.quick else comparisons,
                  notes, lambda path: plot(path, jct), checks)  # fmt: skip


def plot(path: Path, jct: Mapping[tuple[str, float], Mapping[str, float]]) -> None:
    """One panel per knob: JCT vs scale per system (the generation series starts at the append series' 1×)."""
    knobs = sorted({knob for knob, _ in jct})
    fig, axes = panels(len(knobs), width=5.0)
    for ax, knob in zip(axes, knobs):
        series = {s: [(scale, v[s]) for (k, scale), v in sorted(jct.items()) if k == knob] for s in SYSTEMS}
        jct_panel(ax, series, title=f"{knob} length scaling", xlabel="scale")
    axes[0].legend(fontsize=7)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    return experiment_main("fig9", help_description(__doc__), build, argv)
