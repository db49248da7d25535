"""SGL(MC) against Basic and DualPath (issue 37; the paper's §7.1 baseline): KV kept in the nodes' DRAM pool, at the
paper's size and at smaller ones.

The paper's SGLang baseline, SGL(MC), holds KV in a Mooncake store of 1.5 TB of DRAM per node over 3FS: a hit the
pool holds is read from the node that holds it over the compute network, the rest from storage on the prefill side
(it has no second path). Here each system runs DS 660B 2P4D offline on the 64K dataset (512 agents, their whole
trajectories), SGL(MC) with the paper's pool (9 TB over six nodes) and with pools of 0.5×, 0.25× and 0.1× the peak
working set of the unbounded run, each written through to storage (the paper's) and written back on eviction.
Reported: the JCT, the share of hit tokens the pool held, the bytes read from storage on each side and written to
it, the bytes the pool served, TTFT and TPOT.

Caveat, as the paper's: the stacks differ. The paper judged a comparison with SGL(MC) unfair (another engine, its own
scheduler and kernels) and shows none for DeepSeek. Here SGL(MC) is the emulator's own engines with SGL(MC)'s data
path (layerwise loading, PE-side reads, round-robin engines) and a pool; what differs is only where the KV lives.

``--quick``: DS 660B on the storage-bound miniature, 128 agents × 40 rounds."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from dualpath_emu.cluster.config import KvPoolSpec
from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce.common import Cell, CellResult, Report, deployment, experiment_main, run_cells
from dualpath_emu.reproduce.plots import panels, save

__all__ = ["main"]

FRACTIONS: Final = (0.5, 0.25, 0.1)
"""Pool sizes as fractions of the unbounded run's peak working set (every node's DRAM together)."""
PAPER: Final = "1.5 TB/node"


def base(quick: bool) -> tuple[Any, int]:
    """The deployment and the rounds each agent replays (0: all)."""
    if quick:
        return deployment("ds660b", quick=True, dataset="64k", agents=128), 40
    return deployment("ds660b", dataset="64k", agents=512), 0


def first_cells(quick: bool) -> list[Cell]:
    """Basic and DualPath (storage only), SGL(MC) with the paper's pool, and DualPath given that pool too."""
    config, rounds = base(quick)
    pooled = dataclasses.replace(config, kv_pool=KvPoolSpec(systems=("dualpath",)))
    return [*(Cell({"pool": "-" if system != "sglmc" else PAPER}, config, system, max_rounds=rounds)
              for system in ("basic", "dualpath", "sglmc")),
            Cell({"pool": PAPER}, pooled, "dualpath", max_rounds=rounds)]  # fmt: skip


def smaller_cells(quick: bool, peak_bytes: float) -> list[Cell]:
    """SGL(MC) with pools of :data:`FRACTIONS` of ``peak_bytes`` written through, then every SGL(MC) pool (the
    paper's too) written back."""
    config, rounds = base(quick)
    nodes = config.pe_nodes + config.de_nodes
    sizes = [(PAPER, KvPoolSpec())] + [(f"{f:g}x", KvPoolSpec(max(1, int(f * peak_bytes / nodes)))) for f in FRACTIONS]
    return [Cell({"pool": label, "write": write}, dataclasses.replace(config, kv_pool=dataclasses.replace(pool, write=write)),
                 "sglmc", max_rounds=rounds)
            for write in ("through", "back") for label, pool in sizes if (write, label) != ("through", PAPER)]  # fmt: skip


def build(args: argparse.Namespace) -> Report:
    options = {"quiet": args.quiet, "cache": args.cache, "dask": args.dask}
    first = run_cells(first_cells(args.quick), args.jobs, **options)
    peak = next(r for r in first if r.cell.system == "basic").summary["working_set_bytes"]["max"]
    results = first + run_cells(smaller_cells(args.quick, peak), args.jobs, **options)
    rows = [_row(r) for r in results]
    by = {(row["system"], row["pool"]): row for row in rows if row["write"] != "back"}
    back = {row["pool"]: row for row in rows if row["write"] == "back"}
    basic, dual, paper = by[("basic", "-")], by[("dualpath", "-")], by[("sglmc", PAPER)]
    dual_pool = by[("dualpath", PAPER)]
    sizes = [by[("sglmc", f"{f:g}x")] for f in FRACTIONS]
    ladder = [paper, *sizes]
    checks = {
        "with the paper's pool SGL(MC) holds every hit and reads nothing from storage": (
            paper["pool_found"] == 1.0 and paper["storage_read_gb"] == 0.0
        ),
        "a smaller pool holds fewer hits and reads more from storage": all(
            b["pool_found"] <= a["pool_found"] and b["storage_read_gb"] >= a["storage_read_gb"]
            for a, b in zip(ladder, ladder[1:])
        ),
        "SGL(MC) reads on the prefill side only": all(row["snic_read_de_gb"] == 0.0 for row in ladder),
        "with the paper's pool SGL(MC) beats Basic": paper["jct_s"] < basic["jct_s"],
        "given the same pool, DualPath reads nothing from storage either": (
            dual_pool["pool_found"] == 1.0 and dual_pool["storage_read_gb"] == 0.0
        ),
        "every request ended in every run": all(row["failed"] == 0 for row in rows),
        "written back, the paper's pool writes nothing to storage": back[PAPER]["storage_write_gb"] == 0.0,
        "written back, every pool writes less to storage than written through": all(
            back[row["pool"]]["storage_write_gb"] < row["storage_write_gb"] for row in ladder
        ),
        "written back, every storage write is a write-back of what the pool dropped": all(
            abs(row["storage_write_gb"] - row["written_back_gb"]) <= 0.1 for row in back.values()
        ),
    }
    notes = [
        f"Pool sizes: the paper's 1.5 TB per node (9 TB on 2P4D), then fractions of the unbounded Basic run's peak "
        f"working set ({peak / 1e9:,.1f} GB), every node's DRAM together.",
        "pool_found: the share of the hit tokens (each turn's context so far) the pool held at dispatch; the rest was "
        "read from storage (unbounded, as the paper's 3FS). pool_served_gb: the KV the pool sent to the reading "
        "side, over the compute network from the decode node that wrote it (none when it is that node itself).",
        "storage_read_gb: bytes read through the storage NICs, prefill side (PE) and decode side (DE); "
        "storage_write_gb: bytes written to storage (the decode nodes' write-backs).",
        "write: 'through', every turn's Full Blocks go on to storage as they are made (the paper's SGL(MC), Mooncake "
        "over 3FS); 'back', they stay in the pool and reach storage only when it drops them or has no room for them "
        "(written_back_gb).",
        f"JCT against SGL(MC) with the paper's pool: Basic {basic['jct_s'] / paper['jct_s']:.2f}, DualPath "
        f"{dual['jct_s'] / paper['jct_s']:.2f}, DualPath with the same pool {dual_pool['jct_s'] / paper['jct_s']:.2f}.",
        "A pool's hits cross the prefill GPU's compute NIC twice, into the PE buffer and then into HBM (H2D goes "
        "through the NIC, §5.1), where a DE-side read crosses it once; so a pool that holds everything does not "
        "make SGL(MC) I/O-free, and reading part of the hit from storage spreads the load over both NICs.",
        "The paper shows no SGL(MC) numbers for DeepSeek (SGLang did not run DS 27B; the comparison was judged "
        "unfair); these rows are the emulator's own, with its engines and only SGL(MC)'s data path and pool.",
    ]
    return Report("sglmc", "SGL(MC)'s DRAM pool against Basic and DualPath: DS 660B 2P4D offline, 64K", rows, [],
                  notes, lambda path: plot(path, rows), checks)  # fmt: skip


def _row(r: CellResult) -> dict[str, Any]:
    s = r.summary
    pool = s.get("kv", {}).get("pool")
    read = s["snic_read_bytes"]
    written = s["snic_write_bytes"]
    return {
        "system": r.cell.system, "pool": r.cell.labels["pool"], "write": r.cell.labels.get("write", "through"),
        "pool_gb": round(pool["capacity_bytes"] / 1e9, 1) if pool else 0.0,
        "working_set_max_gb": round(s["working_set_bytes"]["max"] / 1e9, 1),
        "pool_found": round(pool["found_rate"], 4) if pool else 0.0,
        "pool_served_gb": round(pool["found_bytes"] / 1e9, 1) if pool else 0.0,
        "storage_read_gb": round((read["pe"] + read["de"]) / 1e9, 1),
        "snic_read_de_gb": round(read["de"] / 1e9, 1), "evicted_gb": round(pool["evicted_bytes"] / 1e9, 1) if pool else 0.0,
        "storage_write_gb": round((written["pe"] + written["de"]) / 1e9, 1),
        "written_back_gb": round(pool.get("written_back_bytes", 0) / 1e9, 1) if pool else 0.0,
        "ttft_p50_s": round(s["ttft_s"]["p50"], 3), "ttft_p99_s": round(s["ttft_s"]["p99"], 3),
        "tpot_p50_ms": round(1e3 * s["tpot_s"]["p50"], 1), "failed": s.get("failed_requests", 0),
        "jct_s": round(r.jct_s, 1),
    }  # fmt: skip


def plot(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """JCT and bytes read from storage against SGL(MC)'s pool size, Basic and DualPath as lines."""
    fig, (left, right) = panels(2, width=4.6, height=3.4)
    for write, style in (("through", "o-"), ("back", "s--")):
        pools = [row for row in rows if row["system"] == "sglmc" and row["write"] == write]
        xs = [row["pool"] for row in pools]
        label = f"sglmc, written {write}"
        left.plot(xs, [row["jct_s"] for row in pools], style, color="tab:green", label=label)
        right.plot(xs, [row["storage_read_gb"] for row in pools], style, color="tab:green", label=f"{label}: read")
        right.plot(xs, [row["storage_write_gb"] for row in pools], style, color="tab:olive", label=f"{label}: written")
    for row in rows:
        if row["system"] != "sglmc":
            color = "tab:blue" if row["system"] == "basic" else "tab:red"
            pooled = row["pool"] != "-"
            style, label = (":", f"{row['system']} + the paper's pool") if pooled else ("--", row["system"])
            left.axhline(row["jct_s"], color=color, linestyle=style, label=label)
            right.axhline(row["storage_read_gb"], color=color, linestyle=style, label=label)
    left.set_xlabel("SGL(MC) pool (of the peak working set)")
    left.set_ylabel("JCT (s)")
    left.set_ylim(bottom=0)
    right.set_xlabel("SGL(MC) pool (of the peak working set)")
    right.set_ylabel("storage (GB)")
    right.legend(fontsize=6)
    right.set_ylim(bottom=0)
    left.legend(fontsize=7)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    return experiment_main("sglmc", help_description(__doc__), build, argv)
