"""The network's what-ifs at cluster scale (issue 38; the paper tests neither): virtual-lane isolation on and off, and
other traffic on the decode nodes' storage NICs.

1. **Isolation** (App. A.5 asks it of one NIC; ``reproduce isolation`` answers there): DualPath on DS 660B 2P4D
   offline, 64K, 512 agents, with the paper's VL tables (model traffic on VL0 strictly before KV on VL2), with the two
   lanes weighted equally (``[network.cnic_vl]``), and with isolation off (``[network] isolation = false``: the
   collectives and the all-to-all in the KV's lane); then each again with the prefill nodes' compute NICs loaded by
   other KV-lane traffic (a bulk copy at 80% of each NIC). Reported: JCT, TTFT (and its prefill part, which waits for
   the prefill's collectives), TPOT, and the compute NICs' load.
2. **A checkpoint load on the decode nodes' storage NICs** (model weights read through them while the cluster
   serves, ``[[network.background]]``): Basic and DualPath under a load of 0, 25% and 50% of each decode node's
   storage NIC for the whole run, and 50% in bursts (15 s of each minute). DualPath chooses the read side by read
   queues (tokens), which the load does not change: how much does it lose?

``--quick``: the storage-bound miniature, 128 agents × 40 rounds."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from dualpath_emu.cluster.topology import BackgroundTraffic, NetworkSpec, VlTables
from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce.common import Cell, CellResult, Report, deployment, experiment_main, run_cells
from dualpath_emu.reproduce.plots import panels, save

__all__ = ["main"]

LANES: Final = {
    "paper VLs": NetworkSpec(),
    "equal VLs": NetworkSpec(cnic_vl=VlTables(4, 0, "", "0:1,2:1")),
    "isolation off": NetworkSpec(isolation=False),
}
"""The compute NICs' lanes: App. A.1's tables, the two lanes weighted equally, one lane for everything."""
CNIC_LOAD: Final = 0.8
"""The other traffic on the prefill nodes' compute NICs in the loaded lane rows, as a share of each NIC."""
LOADS: Final = (0.0, 0.25, 0.5)
"""Background load on each decode node's storage NIC, as a share of its bandwidth."""
BURST: Final = (60.0, 15.0)
"""The bursty load's period and time on (s)."""


def base(quick: bool) -> tuple[Any, int]:
    """The deployment and the rounds each agent replays (0: all)."""
    if quick:
        return deployment("ds660b", quick=True, dataset="64k", agents=128), 40
    return deployment("ds660b", dataset="64k", agents=512), 0


def lane_cells(quick: bool) -> list[Cell]:
    config, rounds = base(quick)
    pe_cnics = tuple(f"n{n}.cnic{g}.tx" for n in range(config.pe_nodes) for g in range(config.node.gpus))
    copy = BackgroundTraffic(pe_cnics, CNIC_LOAD * config.node.cnic_bytes_per_s, 0.0, 20_000.0)
    out = []
    for loaded in (False, True):
        for name, network in LANES.items():
            network = dataclasses.replace(network, background=(copy,)) if loaded else network
            out.append(Cell({"part": "lanes", "network": name, "load": f"{CNIC_LOAD:.0%} PE CNIC" if loaded else ""},
                            dataclasses.replace(config, network=network), "dualpath", max_rounds=rounds))  # fmt: skip
    return out


def load_cells(quick: bool) -> list[Cell]:
    config, rounds = base(quick)
    snic = config.node.snic_bytes_per_s * config.node.snics
    horizon = 20_000.0  # longer than any run: the load lasts to its end (a burst due after it never starts)
    out = []
    for system in ("basic", "dualpath"):
        for share, bursty in [(s, False) for s in LOADS] + [(LOADS[-1], True)]:
            background: tuple[BackgroundTraffic, ...] = ()
            if share:
                period, on = BURST if bursty else (0.0, 0.0)
                background = (BackgroundTraffic(("de.snic.rx",), share * snic, 0.0, horizon, period, on),)
            label = f"{share:.0%}" + (f" ({BURST[1]:g} s of {BURST[0]:g})" if bursty else "")
            network = NetworkSpec(background=_expand(background, config))
            out.append(Cell({"part": "load", "network": "paper VLs", "load": label},
                            dataclasses.replace(config, network=network), system, max_rounds=rounds))  # fmt: skip
    return out


def _expand(background: tuple[BackgroundTraffic, ...], config: Any) -> tuple[BackgroundTraffic, ...]:
    """``de.snic.rx`` as the decode nodes' ports (what a scenario's reader does)."""
    ports = tuple(f"n{n}.snic.rx" for n in range(config.pe_nodes, config.pe_nodes + config.de_nodes))
    return tuple(dataclasses.replace(b, ports=ports) for b in background)


def build(args: argparse.Namespace) -> Report:
    options = {"quiet": args.quiet, "cache": args.cache, "dask": args.dask}
    results = run_cells(lane_cells(args.quick) + load_cells(args.quick), args.jobs, **options)
    rows = [_row(r) for r in results]
    lanes = {row["network"]: row for row in rows if row["part"] == "lanes" and not row["load"]}
    loaded = {row["network"]: row for row in rows if row["part"] == "lanes" and row["load"]}
    load = {(row["system"], row["load"]): row for row in rows if row["part"] == "load"}
    full = f"{LOADS[-1]:.0%}"
    checks = {
        "the lanes change the run (isolation off and equal VLs are runs of their own)": (
            len({row["jct_s"] for row in lanes.values()}) == len(lanes)
        ),
        "a load on the decode nodes' storage NICs leaves Basic as it was": all(
            load[("basic", label)]["jct_s"] == load[("basic", "0%")]["jct_s"]
            for (system, label) in load
            if system == "basic"
        ),
        "other traffic on the prefill nodes' compute NICs lengthens the prefill, whatever the lanes": all(
            loaded[name]["ttft_prefill_s"] > lanes[name]["ttft_prefill_s"] for name in LANES
        ),
        "as the decode side's storage NICs are loaded, DualPath reads more on the prefill side": (
            load[("dualpath", "0%")]["read_de_share"]
            > load[("dualpath", "25%")]["read_de_share"]
            > load[("dualpath", full)]["read_de_share"]
        ),
        "every request ended in every run": all(row["failed"] == 0 for row in rows),
    }
    dual0, dual_full = load[("dualpath", "0%")], load[("dualpath", full)]
    paper, off = loaded["paper VLs"], loaded["isolation off"]
    notes = [
        f"With the prefill nodes' compute NICs {CNIC_LOAD:.0%} loaded, TTFT's prefill part is {paper['ttft_prefill_s']:g} s "
        f"with the paper's VLs and {off['ttft_prefill_s']:g} s with isolation off; JCT {paper['jct_s']:,.0f} s and "
        f"{off['jct_s']:,.0f} s.",
        "Part lanes: DualPath with the paper's VL tables (App. A.1: VL0 strictly before VL2), with VL0 and VL2 "
        'weighted equally (network.cnic_vl\'s vlarb_low = "0:1,2:1"), and with isolation off (network.isolation = '
        "false: the collectives and the all-to-all in the KV's lane, flows sharing it max-min).",
        "ttft_prefill_s: TTFT's prefill part (mean), which waits for the prefill's collectives between layers; a decode "
        "step is priced from the model (its all-to-all loads the NICs, but a slower one does not lengthen the step), "
        "so TPOT does not see the lanes.",
        "The model is fluid: within one lane the flows share the port max-min, the mildest way to share it. A real "
        "NIC serves one lane's work requests in order, and a collective then waits behind queued KV (reproduce "
        "isolation: 5.3x the fluid bound on one NIC): isolation off costs at least what these rows show.",
        "Part load: a checkpoint read through every decode node's storage NIC (traffic the engines do not make) at "
        f"the share of its bandwidth shown, for the whole run or {BURST[1]:g} s of each {BURST[0]:g} s.",
        f"DualPath's JCT under {full} of load: {dual_full['jct_s'] / dual0['jct_s']:.2f}x its unloaded one; its "
        f"decode-side share of reads: {dual0['read_de_share']:.0%} unloaded, {dual_full['read_de_share']:.0%} loaded "
        "(its read-side choice weighs read queues in tokens, which the load does not touch).",
        "cnic_pe_tx_util: mean utilisation of the prefill nodes' compute NICs (sending).",
    ]
    title = "the network's what-ifs: isolation on and off, a checkpoint load on the decode nodes' storage NICs (DS 660B 2P4D)"
    return Report("network", title, rows, [], notes, lambda path: plot(path, rows), checks)


def _row(r: CellResult) -> dict[str, Any]:
    s = r.summary
    read = s["snic_read_bytes"]
    total = read["pe"] + read["de"]
    return {
        "part": r.cell.labels["part"], "network": r.cell.labels["network"], "load": r.cell.labels["load"],
        "system": r.cell.system, "jct_s": round(r.jct_s, 1),
        "ttft_p50_s": round(s["ttft_s"]["p50"], 3), "ttft_p99_s": round(s["ttft_s"]["p99"], 3),
        "ttft_prefill_s": round(r.ttft_breakdown_s.get("prefill", 0.0), 3),
        "tpot_p50_ms": round(1e3 * s["tpot_s"]["p50"], 2),
        "cnic_pe_tx_util": round(s["cnic_util"]["pe"]["tx"]["mean"], 3),
        "snic_de_rx_util": round(s["snic_util"]["de"]["rx"]["mean"], 3),
        "read_de_share": round(read["de"] / total, 3) if total else 0.0,
        "failed": s.get("failed_requests", 0),
    }  # fmt: skip


def plot(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Left: JCT and TTFT's prefill part per lane setting. Right: JCT against the load, Basic and DualPath."""
    fig, (left, right) = panels(2, width=4.6, height=3.4)
    twin = left.twinx()
    for k, (loaded, color, style) in enumerate(((False, "tab:red", "o--"), (True, "darkred", "s-"))):
        lanes = [row for row in rows if row["part"] == "lanes" and bool(row["load"]) == loaded]
        xs = [i + (k - 0.5) * 0.38 for i in range(len(lanes))]
        label = f"{CNIC_LOAD:.0%} other traffic on PE CNICs" if loaded else "no other traffic"
        left.bar(xs, [row["jct_s"] for row in lanes], width=0.36, color=color, label=f"JCT, {label}")
        twin.plot(range(len(lanes)), [row["ttft_prefill_s"] for row in lanes], style, color="black",
                  label=f"TTFT prefill, {label}")  # fmt: skip
    left.set_xticks(range(len(LANES)), list(LANES))
    left.set_ylabel("DualPath JCT (s)")
    left.set_ylim(bottom=0)
    twin.set_ylabel("TTFT: prefill part (s)")
    twin.set_ylim(bottom=0)
    left.legend(fontsize=6, loc="lower left")
    twin.legend(fontsize=6, loc="lower right")
    for system, color in (("basic", "tab:blue"), ("dualpath", "tab:red")):
        points = [row for row in rows if row["part"] == "load" and row["system"] == system]
        right.plot([row["load"] for row in points], [row["jct_s"] for row in points], "o-", color=color, label=system)
    right.set_xlabel("load on each decode node's storage NIC")
    right.set_ylabel("JCT (s)")
    right.set_ylim(bottom=0)
    right.legend(fontsize=7)
    for label in right.get_xticklabels():
        label.set_fontsize(7)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    return experiment_main("network", help_description(__doc__), build, argv)
