"""Fig. 13 of the paper (§7.5): load balance of storage NICs and of attention across a prefill group.

Offline DS 660B 2P4D on the 64K dataset with 1,024 agents (the ablation's setting), two systems that both
read on either side and differ only in the scheduler: ``basic+layerwise+dualpath`` (round robin) and
``dualpath`` (Algorithm 1 and the two-level DE choice).

* **Storage-NIC balance**: max/mean of the bytes read by each storage NIC. The paper measures it over the
  storage NICs of three machines in a short window; the emulator over every node's storage NIC and the whole
  run (``snic_max_over_mean`` of ``dualpath-emu run``). Paper: round robin 1.53, DualPath 1.18 (±0.1).
* **Attention balance**: per prefill forward pass, the max/mean attention time over the GPUs of its EP group
  (an idle GPU counts as 0: it waits at the DP barrier), averaged over the passes that start in the first 5%
  of the run. Paper: ≤ 1.06 for DualPath during the first 5% (target ≤ 1.1); later the group is under-loaded
  and the ratio means little (the paper does not show it).

``--quick`` (the storage-bound miniature): 256 agents, first 40 rounds; checks that round robin is less
balanced than DualPath's scheduler (higher storage-NIC max/mean)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce.common import (
    Cell,
    CellResult,
    Comparison,
    Report,
    deployment,
    experiment_main,
    run_cells,
    within,
)
from dualpath_emu.reproduce.plots import SYSTEM_COLORS, panels, save

__all__ = ["PAPER_SNIC_MAX_OVER_MEAN", "early_attention_balance", "main"]

SYSTEMS: Final = {"basic+layerwise+dualpath": "round robin", "dualpath": "DualPath"}
PAPER_SNIC_MAX_OVER_MEAN: Final = {"basic+layerwise+dualpath": 1.53, "dualpath": 1.18}  # [exact §7.5]
EARLY_FRACTION: Final = 0.05


def early_attention_balance(result: CellResult, fraction: float = EARLY_FRACTION) -> float:
    """Mean max/mean attention over the forward passes starting in the first ``fraction`` of the run."""
    early = [b for t, b in result.attention_balance if t <= fraction]
    return sum(early) / len(early) if early else float("nan")


def build(args: argparse.Namespace) -> Report:
    agents, rounds = (256, 40) if args.quick else (1024, 0)
    config = deployment("ds660b", quick=args.quick, agents=agents)
    cells = [Cell({"agents": agents}, config, system, max_rounds=rounds) for system in SYSTEMS]
    results = run_cells(cells, args.jobs, quiet=args.quiet, cache=args.cache, dask=args.dask)
    rows: list[dict[str, Any]] = []
    comparisons: list[Comparison] = []
    for r in results:
        balance = r.summary["snic_max_over_mean"]
        attention = early_attention_balance(r)
        rows.append({"system": r.cell.system, "scheduler": SYSTEMS[r.cell.system], "agents": agents,
                     "jct_s": round(r.jct_s, 1), "snic_max_over_mean": round(balance, 3),
                     "attention_max_over_mean_first_5pct": round(attention, 3),
                     "forwards_first_5pct": sum(1 for t, _ in r.attention_balance if t <= EARLY_FRACTION)})  # fmt: skip
        comparisons.append(within(f"storage-NIC max/mean, {SYSTEMS[r.cell.system]}",
                                  PAPER_SNIC_MAX_OVER_MEAN[r.cell.system], balance, abs_=0.1))  # fmt: skip
        if r.cell.system == "dualpath":
            ok = attention <= 1.1
            comparisons.append(Comparison("attention max/mean, first 5%, DualPath", 1.06, attention, "≤ 1.1", ok))
    by_system = {r.cell.system: r for r in results}
    less_balanced = (by_system["basic+layerwise+dualpath"].summary["snic_max_over_mean"]
                     > by_system["dualpath"].summary["snic_max_over_mean"])  # fmt: skip
    notes = ["Storage-NIC max/mean here: every node's storage NIC over the whole run (paper: three machines, a "
             "short window)."]  # fmt: skip
    return Report("fig13", "storage-NIC and attention balance: round robin vs DualPath's scheduler", rows,
                  comparisons, notes, lambda path: plot(path, results),
                  {"round robin is less balanced than DualPath (storage-NIC max/mean)": less_balanced})  # fmt: skip


def plot(path: Path, results: Sequence[CellResult]) -> None:
    fig, (left, right) = panels(2, width=5.0, height=3.6)
    names = [SYSTEMS[r.cell.system] for r in results]
    left.bar([i - 0.2 for i in range(len(results))], [PAPER_SNIC_MAX_OVER_MEAN[r.cell.system] for r in results],
             width=0.4, label="paper")  # fmt: skip
    left.bar([i + 0.2 for i in range(len(results))], [r.summary["snic_max_over_mean"] for r in results], width=0.4,
             label="emulator")  # fmt: skip
    left.set_xticks(range(len(results)), names)
    left.set_ylabel("storage-NIC traffic max/mean")
    left.legend(fontsize=7)
    for r in results:
        points = [(t * 100, b) for t, b in r.attention_balance if t <= 0.3]
        if points:
            right.plot(
                *zip(*points), ".", markersize=2, color=SYSTEM_COLORS.get(r.cell.system), label=SYSTEMS[r.cell.system]
            )
    right.axvline(EARLY_FRACTION * 100, color="k", linewidth=0.8, linestyle="--")
    right.set_xlabel("progress (% of the JCT)")
    right.set_ylabel("attention max/mean per forward")
    right.legend(fontsize=7)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    return experiment_main("fig13", help_description(__doc__), build, argv)
