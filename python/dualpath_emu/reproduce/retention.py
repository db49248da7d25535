"""Keep near the decode engine, or read on the decode side (issue 37): DualPath with decode-side retention and
session affinity against DualPath, over HBM headroom and tool waits.

DualPath reads a later turn's hit from storage, on the decode side when its read queue is the shorter, and streams
it to the prefill engine. The alternative its peers take (SGLang's decode-side radix cache, Dynamo's session
affinity) keeps a session's KV in the decode GPU's HBM after its turn and sends the next turn there: the prefill
engine loads the hit from that GPU over the compute network, nothing is read from storage, and only the new
tokens' KV goes back. What it costs: HBM held between turns, which running requests take back when they need it,
and decode load bound to where the KV is. Here DualPath and ``dualpath+retention`` run DS 660B 2P4D online at the
paper's 0.45 APS for 1,500 emulated seconds (675 agents), with tool waits of mean 0, 5 and 30 s (lognormal, sigma
1) and the decode GPUs' HBM for KV at the paper's setting (10% reserved) and with 50% and 80% of it reserved.
Reported: the share of hit tokens found in HBM, what was read from storage, TTFT, TPOT and the JCT.

``--quick``: DS 660B on the storage-bound miniature, 1 APS over 200 s, agents' first 20 rounds, waits 0 and 30 s,
reserves 10% and 90%."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce.common import Cell, CellResult, Report, deployment, experiment_main, run_cells
from dualpath_emu.reproduce.plots import panels, save
from dualpath_emu.workload.waits import ToolWait

__all__ = ["main"]

SYSTEMS: Final = ("dualpath", "dualpath+retention")
SIGMA: Final = 1.0


def plan(quick: bool) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The tool waits (mean, s) and the decode HBM reserves (fractions) swept."""
    return ((0.0, 30.0), (0.1, 0.9)) if quick else ((0.0, 5.0, 30.0), (0.1, 0.5, 0.8))


def cells(quick: bool) -> list[Cell]:
    rate, arrival_s, rounds = (1.0, 200.0, 20) if quick else (0.45, 1500.0, 0)
    waits, reserves = plan(quick)
    out = []
    for wait in waits:
        for reserve in reserves:
            config = deployment("ds660b", quick=quick, agents=max(8, round(rate * arrival_s)), mode="online",
                                arrival_rate=rate, de_hbm_reserve_fraction=reserve,
                                tool_wait=ToolWait("lognormal", wait, SIGMA) if wait else ToolWait())  # fmt: skip
            for system in SYSTEMS:
                out.append(Cell({"wait_s": wait, "hbm_reserve": reserve}, config, system, max_rounds=rounds))
    return out


def build(args: argparse.Namespace) -> Report:
    results = run_cells(cells(args.quick), args.jobs, quiet=args.quiet, cache=args.cache, dask=args.dask)
    rows = [_row(r) for r in results]
    by = {(row["wait_mean_s"], row["hbm_reserve"], row["system"]): row for row in rows}
    waits, reserves = plan(args.quick)
    kept = [by[(w, r, "dualpath+retention")] for w in waits for r in reserves]
    checks = {
        "every request ended in every run": all(row["failed"] == 0 for row in rows),
        "retention reads less from storage than DualPath at every wait and headroom": all(
            by[(w, r, "dualpath+retention")]["storage_read_gb"] < by[(w, r, "dualpath")]["storage_read_gb"]
            for w in waits
            for r in reserves
        ),
        "less headroom keeps fewer hits in HBM": all(
            by[(w, b, "dualpath+retention")]["hbm_found"] <= by[(w, a, "dualpath+retention")]["hbm_found"]
            for w in waits
            for a, b in zip(reserves, reserves[1:])
        ),
        "retention finds some hits in HBM in every run": all(row["hbm_found"] > 0 for row in kept),
    }
    notes = [
        "hbm_found: the share of the hit tokens of requests given a decode engine that were in that engine's HBM, "
        "kept from the context's last turn; the rest was read as DualPath reads it. storage_read_gb: bytes read "
        "through the storage NICs, both sides. hbm_evicted_gb: kept KV dropped for running requests (or because "
        "the next turn went to another engine).",
        "hbm_reserve: the share of each decode GPU's free HBM (after weights) kept out of the KV budget "
        "(scheduling.de_hbm_reserve_fraction; the paper's setting is 0.1). It bounds running requests and kept KV "
        "alike, so DualPath runs at each reserve too.",
        "The paper has no such system; these rows are the emulator's own. Retention is DualPath's scheduler with "
        "session affinity (a request goes to the decode engine that keeps its KV when it has room, whatever the "
        "loads), so its decode balance is not DualPath's.",
        "Waits do not simply cost kept hits: a wait keeps a context longer, but it also spreads the same turns over "
        "more time, so fewer requests hold HBM at once; with little headroom the second wins (hbm_found rises "
        "with the wait at the 80% reserve).",
    ]
    return Report("retention", "keep near the decode engine or read on the decode side: DS 660B 2P4D at 0.45 APS",
                  rows, [], notes, lambda path: plot(path, rows, waits), checks)  # fmt: skip


def _row(r: CellResult) -> dict[str, Any]:
    s, labels = r.summary, r.cell.labels
    hbm = s.get("kv", {}).get("hbm")
    read = s["snic_read_bytes"]
    return {
        "wait_mean_s": labels["wait_s"], "hbm_reserve": labels["hbm_reserve"], "system": r.cell.system,
        "hbm_found": round(hbm["found_rate"], 4) if hbm else 0.0,
        "hbm_peak_gb": round(hbm["peak_bytes"] / 1e9, 1) if hbm else 0.0,
        "hbm_evicted_gb": round(hbm["evicted_bytes"] / 1e9, 1) if hbm else 0.0,
        "storage_read_gb": round((read["pe"] + read["de"]) / 1e9, 1),
        "ttft_p50_s": round(s["ttft_s"]["p50"], 3), "ttft_p99_s": round(s["ttft_s"]["p99"], 3),
        "tpot_p50_ms": round(1e3 * s["tpot_s"]["p50"], 1), "tpot_p99_ms": round(1e3 * s["tpot_s"]["p99"], 1),
        "failed": s.get("failed_requests", 0), "jct_s": round(r.jct_s, 1),
    }  # fmt: skip


def plot(path: Path, rows: Sequence[dict[str, Any]], waits: Sequence[float]) -> None:
    """Hits found in HBM and TTFT p99 against the HBM reserve, a line per wait (and DualPath's TTFT dashed)."""
    fig, (left, right) = panels(2, width=4.6, height=3.4)
    for wait in waits:
        mine = [row for row in rows if row["wait_mean_s"] == wait]
        kept = [row for row in mine if row["system"] == "dualpath+retention"]
        plain = [row for row in mine if row["system"] == "dualpath"]
        line = left.plot([row["hbm_reserve"] for row in kept], [row["hbm_found"] for row in kept], "o-",
                         label=f"wait {wait:g} s")[0]  # fmt: skip
        right.plot([row["hbm_reserve"] for row in kept], [row["ttft_p99_s"] for row in kept], "o-",
                   color=line.get_color(), label=f"retention, wait {wait:g} s")  # fmt: skip
        right.plot([row["hbm_reserve"] for row in plain], [row["ttft_p99_s"] for row in plain], "x--",
                   color=line.get_color(), label=f"dualpath, wait {wait:g} s")  # fmt: skip
    left.set_xlabel("decode HBM reserved (fraction)")
    left.set_ylabel("hit tokens found in decode HBM")
    left.set_ylim(0, 1.05)
    right.set_xlabel("decode HBM reserved (fraction)")
    right.set_ylabel("TTFT p99 (s)")
    right.set_ylim(bottom=0)
    left.legend(fontsize=7)
    right.legend(fontsize=6)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    return experiment_main("retention", help_description(__doc__), build, argv)
