"""Split reads (issue 38; the paper's §6.1 leaves it open): a long hit read on both sides at once against DualPath's
whole reads, offline on the 64K dataset, DS 660B 2P4D and DS 27B 1P1D at 512 to 4,096 agents.

``dualpath-split`` is DualPath with one change: a hit of at least 16 Full Blocks may be divided so that both sides'
read queues end as level as whole blocks allow, the prefill node's storage NIC reading its first blocks and the
decode node's the rest, each part loaded into the PE's HBM on its own path, layer by layer. Reported: JCT, TTFT p50
and p99, the share of requests split, each side's storage reads, and the compute NICs' load (a split's decode part
crosses the compute network as a DE-read does).

``--quick``: the storage-bound miniature, 128 and 256 agents × 40 rounds."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce.common import Cell, CellResult, Report, deployment, experiment_main, run_cells
from dualpath_emu.reproduce.plots import panels, save

__all__ = ["main"]

SYSTEMS: Final = ("dualpath", "dualpath-split")
AGENTS: Final = {"ds660b": (512, 1024, 2048, 4096), "ds27b": (512, 1024, 2048, 4096)}


def cells(quick: bool) -> list[Cell]:
    plan = [(m, a) for m in AGENTS for a in ((128, 256) if quick else AGENTS[m])]
    rounds = 40 if quick else 0
    return [Cell({"model": m, "agents": a}, deployment(m, quick=quick, dataset="64k", agents=a), system,
                 max_rounds=rounds) for m, a in plan for system in SYSTEMS]  # fmt: skip


def build(args: argparse.Namespace) -> Report:
    options = {"quiet": args.quiet, "cache": args.cache, "dask": args.dask}
    results = run_cells(cells(args.quick), args.jobs, **options)
    rows = [_row(r) for r in results]
    by = {(row["model"], row["agents"], row["system"]): row for row in rows}
    pairs = [(by[(m, a, "dualpath")], by[(m, a, "dualpath-split")]) for m, a, s in by if s == "dualpath"]
    for whole, split in pairs:
        split["vs_whole"] = round(split["jct_s"] / whole["jct_s"], 4)
        whole["vs_whole"] = 1.0
    checks = {
        "every request ended in every run": all(row["failed"] == 0 for row in rows),
        "split runs read as much from storage as whole ones (every hit byte once)": all(
            abs(s["storage_read_gb"] - w["storage_read_gb"]) <= 0.01 * w["storage_read_gb"] + 0.1 for w, s in pairs
        ),
        "dualpath-split splits some reads in every run": all(s["split_share"] > 0 for _, s in pairs),
    }
    best = min(pairs, key=lambda p: p[1]["vs_whole"])
    worst = max(pairs, key=lambda p: p[1]["vs_whole"])
    notes = [
        "vs_whole: dualpath-split's JCT over DualPath's at the same point.",
        f"Best: {best[1]['model']} at {best[1]['agents']:,} agents, {best[1]['vs_whole']:.3f}; worst: "
        f"{worst[1]['model']} at {worst[1]['agents']:,} agents, {worst[1]['vs_whole']:.3f}.",
        "split_share: the requests whose hit was read on both sides. storage_read_gb: every hit byte read, both "
        "sides together (the same as DualPath's: a split moves reads, it adds none). read_de_share: the decode "
        "side's share of them.",
        "cnic_pe_rx_util: the prefill nodes' compute NICs receiving (a split's decode part and a DE-read's hit "
        "cross them once, as the PE layer KV loads from the PE's own buffer do, H2D through the NIC, §5.1).",
    ]
    title = "split reads against whole reads: DualPath, DS 660B 2P4D and DS 27B 1P1D offline, 64K"
    return Report("split", title, rows, [], notes, lambda path: plot(path, rows), checks)


def _row(r: CellResult) -> dict[str, Any]:
    s = r.summary
    read = s["snic_read_bytes"]
    total = read["pe"] + read["de"]
    return {
        "model": r.cell.labels["model"], "agents": r.cell.labels["agents"], "system": r.cell.system,
        "jct_s": round(r.jct_s, 1), "vs_whole": 0.0,
        "ttft_p50_s": round(s["ttft_s"]["p50"], 3), "ttft_p99_s": round(s["ttft_s"]["p99"], 3),
        "split_share": round(s.get("split_reads", 0) / s["turns"], 3) if s["turns"] else 0.0,
        "storage_read_gb": round(total / 1e9, 1), "read_de_share": round(read["de"] / total, 3) if total else 0.0,
        "cnic_pe_rx_util": round(s["cnic_util"]["pe"]["rx"]["mean"], 3),
        "snic_util_pe": round(s["snic_util"]["pe"]["rx"]["mean"], 3),
        "snic_util_de": round(s["snic_util"]["de"]["rx"]["mean"], 3),
        "failed": s.get("failed_requests", 0),
    }  # fmt: skip


def plot(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """JCT against agents per model, whole and split reads."""
    models = sorted({row["model"] for row in rows})
    fig, axes = panels(len(models), width=4.2, height=3.2)
    for ax, model in zip(axes, models, strict=True):
        for system, style in (("dualpath", "o-"), ("dualpath-split", "s--")):
            points = sorted((row["agents"], row["jct_s"]) for row in rows if row["model"] == model
                            and row["system"] == system)  # fmt: skip
            ax.plot([a for a, _ in points], [j for _, j in points], style, label=system)
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("agents")
        ax.set_ylabel("JCT (s)")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    return experiment_main("split", help_description(__doc__), build, argv)
