"""Tool waits online (issue 25; the paper's §8.2 question): what an agent's wait between its turns does to the KV
working set and the latency of DualPath on DS 660B 2P4D.

The paper's runs send an agent's next turn the moment the previous one ends; real tool calls and thinking would grow the
working set, the KV storage must keep for agents that are alive. Here agents arrive online (0.1 and 0.45 APS: the
paper's Fig. 11 rates) over 1,500 emulated seconds (as in ``reproduce fig10``), each waits a lognormal time (sigma 1) of
mean 0, 5 or 30 s before every turn after its first (:mod:`dualpath_emu.workload.waits`: common random numbers), and the
run reports the working set (peak and time-weighted mean), TTFT, TPOT and the JCT. The peak is the figure to read: it is
what storage must hold, and it grows with the wait; the whole-run mean falls, as the waits stretch the run's tail far
more than its busy middle. The hit rate does not move: hits come from the agent's own context and storage keeps
everything (§3.4).

**The SLO edge** with waits: for each mean wait, :mod:`~dualpath_emu.reproduce.fig10`'s bracket search finds the largest
arrival rate at which DualPath meets the SLO (mean TTFT ≤ 4 s and TPOT ≤ 50 ms over the steady window), with fig10's
full settings (its zero-wait edge is the paper's 0.45 APS setting).

``--quick``: DS 660B on the storage-bound miniature, 0.5 APS over 200 s, agents' first 20 rounds, waits of mean 0 and 30
s, and the edge searches of fig10's quick variant; checks that the peak working set grows with the wait."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce import fig10
from dualpath_emu.reproduce.common import Cell, CellResult, Report, deployment, experiment_main, run_cells
from dualpath_emu.reproduce.plots import panels, save
from dualpath_emu.workload.waits import ToolWait

__all__ = ["main"]

RATES: Final = (0.1, 0.45)
WAITS_S: Final = (0.0, 5.0, 30.0)
ARRIVAL_S: Final = 1500.0
SIGMA: Final = 1.0


def cells(quick: bool) -> list[Cell]:
    rates, waits, arrival_s, rounds = ((0.5,), (0.0, 30.0), 200.0, 20) if quick else (RATES, WAITS_S, ARRIVAL_S, 0)
    out = []
    for rate in rates:
        agents = max(8, round(rate * arrival_s))
        for wait in waits:
            config = deployment("ds660b", quick=quick, agents=agents, mode="online", arrival_rate=rate,
                                tool_wait=ToolWait("lognormal", wait, SIGMA))  # fmt: skip
            out.append(Cell({"rate": rate, "wait_s": wait}, config, "dualpath", max_rounds=rounds))
    return out


def build(args: argparse.Namespace) -> Report:
    results = run_cells(cells(args.quick), args.jobs, quiet=args.quiet, cache=args.cache, dask=args.dask)
    rows: list[dict[str, Any]] = []
    for r in results:
        s = r.summary
        rows.append({
            "aps": r.cell.labels["rate"], "wait_mean_s": r.cell.labels["wait_s"], "agents": r.cell.config.agents,
            "working_set_max_gb": round(s["working_set_bytes"]["max"] / 1e9, 1),
            "working_set_mean_gb": round(s["working_set_bytes"]["mean"] / 1e9, 1),
            "hit_rate": round(s["hit_rate"], 3),
            "ttft_p50_s": round(s["ttft_s"]["p50"], 3), "ttft_p99_s": round(s["ttft_s"]["p99"], 3),
            "tpot_p50_ms": round(1e3 * s["tpot_s"]["p50"], 1), "jct_s": round(r.jct_s, 1), "slo_edge_aps": "",
        })  # fmt: skip
    searches = edge_searches(args.quick)
    fig10.run_searches(searches, fig10.QUICK if args.quick else fig10.FULL, args.jobs, quiet=args.quiet,
                       cache=args.cache, dask=args.dask)  # fmt: skip
    for search in searches:
        rows.append({**dict.fromkeys(rows[0], ""), "aps": "edge", "wait_mean_s": search.tool_wait.mean_s,
                     "slo_edge_aps": search.edge_text})  # fmt: skip
    checks: dict[str, bool] = {"DualPath has an SLO edge at every wait": all(s.lo > 0 for s in searches)}
    by_wait = sorted((row for row in rows if row["aps"] != "edge"), key=lambda row: row["wait_mean_s"])
    for rate in sorted({row["aps"] for row in by_wait}):
        peaks = [row["working_set_max_gb"] for row in by_wait if row["aps"] == rate]
        grows = all(b > a for a, b in zip(peaks, peaks[1:]))
        checks[f"the peak working set grows with the wait at {rate:g} APS"] = grows
    notes = [
        "The paper runs with zero wait and gives no figure for waits; the rows are the emulator's own.",
        "Read the peak working set: the whole-run mean falls as the waits stretch the run's tail.",
        "Hit rates do not change: hits are the agent's own context and storage keeps everything (§3.4).",
        "Rows 'edge': DualPath's SLO edge, the largest APS meeting mean TTFT <= 4 s and TPOT <= 50 ms "
        "(fig10's search), and the next rate measured, which misses it.",
    ]
    return Report("toolwaits", "tool waits online: working set and latency, DualPath on DS 660B 2P4D", rows, [],
                  notes, lambda path: plot(path, results), checks)  # fmt: skip


def edge_searches(quick: bool) -> list[fig10.Search]:
    """fig10's bracket search for DualPath's SLO edge, one per mean wait."""
    variant = fig10.QUICK if quick else fig10.FULL
    waits = (0.0, 30.0) if quick else WAITS_S
    return [variant.search("ds660b", "dualpath", tool_wait=ToolWait("lognormal", w, SIGMA) if w else ToolWait())
            for w in waits]  # fmt: skip


def plot(path: Path, results: Sequence[CellResult]) -> None:
    fig, (left, right) = panels(2, width=4.6, height=3.4)
    for rate in sorted({r.cell.labels["rate"] for r in results}):
        mine = sorted((r for r in results if r.cell.labels["rate"] == rate), key=lambda r: r.cell.labels["wait_s"])
        waits = [r.cell.labels["wait_s"] for r in mine]
        left.plot(waits, [r.summary["working_set_bytes"]["max"] / 1e9 for r in mine], "o-", label=f"{rate:g} APS")
        right.plot(waits, [r.summary["ttft_s"]["p99"] for r in mine], "o-", label=f"{rate:g} APS")
    left.set_xlabel("mean tool wait (s)")
    left.set_ylabel("working set, peak (GB)")
    right.set_xlabel("mean tool wait (s)")
    right.set_ylabel("TTFT p99 (s)")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    return experiment_main("toolwaits", help_description(__doc__), build, argv)
