"""Faults (issue 26; the paper: "no systematic measurement of path degradation on faults"): what Basic and
DualPath do on DS 660B 2P4D, offline, 1,024 agents, when a prefill node's storage NIC goes down, when a decode
engine crashes, and under random fault schedules.

* **A storage NIC down.** Prefill node 0's storage NIC (``n0.snic``) is down for 20% of each system's own run
  without faults (from 30% to 50% of its JCT). Basic reads every hit through the prefill nodes' storage NICs:
  node 0's reads stall, are given up after ``read_timeout_s`` (30 s) and their requests dispatched again (to
  a prefill engine in turn: half of them on node 0 again). DualPath reads on the decode side while it is down
  (the second path as failover).
* **A decode engine crash.** The first decode node's engines (``de2``) crash at 30% of each system's own JCT
  and are back, empty, 60 s later: the requests they held are dispatched again (hit KV read again, the rest
  computed again).
* **Random schedules** at 0, 1 and 4 faults per node-hour (a quarter each ``down``, ``degrade`` to half the
  rate and ``latency`` of +1 ms, on a node's storage NIC or one of its compute NICs, lasting 30 s on average,
  and ``crash`` of the engine hosting the node's GPUs, back 60 s later), drawn from the run's seed
  (``[random_faults]``).

Each row: JCT, p99 TTFT, turns admitted, whether the run finished every turn (``complete``: a run whose
requests failed did not do the whole work) and the requests failed, requests dispatched again, the faults that
started and, for the outage and the crash, the turns finished per second before, during and after it.

``--quick``: the storage-bound miniature (quarter storage NICs), 96 agents of 20 rounds."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from dualpath_emu.cluster.faults import Fault, FaultPlan, RandomFaults
from dualpath_emu.cluster.identity import GroupId
from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce.common import Cell, CellResult, Report, deployment, experiment_main, run_cells
from dualpath_emu.reproduce.plots import SYSTEM_COLORS, panels, save

__all__ = ["main"]

SYSTEMS: Final = ("basic", "dualpath")
RATES: Final = (1.0, 4.0)  # Random faults per node-hour (0 is the run without faults).
OUTAGE: Final = (0.3, 0.2)
"""The storage NIC's outage: start and length, as fractions of the system's JCT without faults."""
CRASH_AT: Final = 0.3  # When the decode engine crashes, as a fraction of the system's JCT without faults.
RESTART_S: Final = 60.0  # How long a crashed engine is down (loading a 660B model's weights again takes about that).


def _random(rate: float) -> FaultPlan:
    quarter = rate / 4.0
    rates = {"down": quarter, "degrade": quarter, "latency": quarter, "crash": quarter}
    return FaultPlan(random=RandomFaults(rates, 30.0, 0.5, 0.001, RESTART_S))


def build(args: argparse.Namespace) -> Report:
    agents, rounds = (96, 20) if args.quick else (1024, 0)
    base = deployment("ds660b", quick=args.quick, agents=agents)
    cells = {system: Cell({"case": "none", "rate": 0.0}, base, system, max_rounds=rounds) for system in SYSTEMS}
    unfaulted = run_cells(list(cells.values()), args.jobs, quiet=args.quiet, cache=args.cache, dask=args.dask)
    plain = dict(zip(SYSTEMS, unfaulted))
    faulted: list[Cell] = []
    for system in SYSTEMS:
        jct = plain[system].jct_s
        down = Fault("down", "n0.snic", round(OUTAGE[0] * jct, 3), round(OUTAGE[1] * jct, 3))
        crash = Fault("crash", GroupId("de", base.pe_nodes).name, round(CRASH_AT * jct, 3), restart_s=RESTART_S)
        plans = [("n0.snic down", 0.0, FaultPlan((down,))), ("de crash", 0.0, FaultPlan((crash,)))]
        plans += [("random", rate, _random(rate)) for rate in RATES]
        faulted += [Cell({"case": case, "rate": rate}, dataclasses.replace(base, faults=plan), system,
                         max_rounds=rounds) for case, rate, plan in plans]  # fmt: skip
    results = list(plain.values()) + run_cells(faulted, args.jobs, quiet=args.quiet, cache=args.cache, dask=args.dask)
    rows = [_row(r, plain[r.cell.system]) for r in results]
    by = {(row["case"], row["rate"], row["system"]): row for row in rows}
    slowdown = {s: by[("n0.snic down", 0.0, s)]["jct_s"] / by[("none", 0.0, s)]["jct_s"] for s in SYSTEMS}
    crashed = {s: by[("de crash", 0.0, s)]["jct_s"] / by[("none", 0.0, s)]["jct_s"] for s in SYSTEMS}
    checks = {
        "without faults nothing is dispatched again or fails": all(
            row["failed"] == 0 and row["redispatched"] == 0 for row in rows if row["case"] == "none"),
        "DualPath loses no request to the outage (it reads on the decode side)": (
            by[("n0.snic down", 0.0, "dualpath")]["failed"] == 0
            and by[("n0.snic down", 0.0, "dualpath")]["redispatched"] == 0),
        "the decode engine crash dispatches its requests again": all(
            by[("de crash", 0.0, s)]["redispatched"] > 0 for s in SYSTEMS),
        # A run that failed requests took at least its JCT but did not finish its work: Basic failing requests
        # that DualPath finished is the outage hurting it more, whatever the partial JCTs say.
        "the outage slows Basic more than DualPath, or fails requests DualPath finishes": (
            slowdown["basic"] > slowdown["dualpath"] if by[("n0.snic down", 0.0, "basic")]["complete"]
            else by[("n0.snic down", 0.0, "dualpath")]["complete"]),
        "Basic's p99 TTFT grows more than DualPath's under the outage": (
            by[("n0.snic down", 0.0, "basic")]["ttft_p99_s"] / by[("none", 0.0, "basic")]["ttft_p99_s"]
            > by[("n0.snic down", 0.0, "dualpath")]["ttft_p99_s"] / by[("none", 0.0, "dualpath")]["ttft_p99_s"]
        ),
    }  # fmt: skip
    notes = [
        "The paper measures no faults; the rows are the emulator's own.",
        f"JCT under the outage vs without faults: Basic {slowdown['basic']:.3f}x, DualPath {slowdown['dualpath']:.3f}x; "
        f"Basic gave up {by[('n0.snic down', 0.0, 'basic')]['redispatched']} reads stalled on the dead NIC and "
        f"{by[('n0.snic down', 0.0, 'basic')]['failed']} requests failed (their agents stop, so it admits fewer "
        "turns).",
        f"JCT after the decode engine crash vs without faults: Basic {crashed['basic']:.3f}x, DualPath "
        f"{crashed['dualpath']:.3f}x; requests dispatched again: Basic {by[('de crash', 0.0, 'basic')]['redispatched']}, "
        f"DualPath {by[('de crash', 0.0, 'dualpath')]['redispatched']}.",
        "A transfer on a dead port stalls and resumes; a request fails only when lost (to an engine crash, or a "
        f"read given up after {base.read_timeout_s:g} s on a dead storage NIC) more than {base.max_redispatches} "
        "times.",
    ]
    return Report("faults", "faults: a prefill node's storage NIC down, a decode engine crash and random schedules, "
                  "Basic vs DualPath on DS 660B 2P4D", rows, [], notes, lambda path: plot(path, rows), checks)  # fmt: skip


def _row(r: CellResult, plain: CellResult) -> dict[str, Any]:
    s = r.summary
    faults = s.get("faults", [])
    case = r.cell.labels["case"]
    outage = faults[0] if case in ("n0.snic down", "de crash") and faults else None
    return {
        "case": case, "rate": r.cell.labels["rate"], "system": r.cell.system,
        "jct_s": round(r.jct_s, 1), "jct_vs_none": round(r.jct_s / plain.jct_s, 3),
        "ttft_p99_s": round(s["ttft_s"]["p99"], 3), "turns": s["turns"],
        "complete": s.get("complete", s.get("failed_requests", 0) == 0),  # else the JCT is not a whole workload's
        "failed": s.get("failed_requests", 0),
        "redispatched": s.get("redispatches", 0), "faults": len(faults),
        "turns_per_s_before": "" if outage is None else round(outage["turns_per_s_before"], 2),
        "turns_per_s_during": "" if outage is None else round(outage["turns_per_s_during"], 2),
        "turns_per_s_after": "" if outage is None else round(outage["turns_per_s_after"], 2),
    }  # fmt: skip


def plot(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    fig, (left, right) = panels(2, width=4.6, height=3.4)
    cases = ["none", "n0.snic down", "de crash", *(f"random {r:g}/h" for r in RATES)]
    for i, system in enumerate(SYSTEMS):
        mine = [row for row in rows if row["system"] == system]
        jct = [next(row["jct_vs_none"] for row in mine if _case(row) == case) for case in cases]
        ttft = [next(row["ttft_p99_s"] for row in mine if _case(row) == case) for case in cases]
        xs = [x + (i - 0.5) * 0.38 for x in range(len(cases))]
        left.bar(xs, jct, width=0.38, color=SYSTEM_COLORS[system], label=system)
        right.bar(xs, ttft, width=0.38, color=SYSTEM_COLORS[system], label=system)
    for ax, label in ((left, "JCT vs no faults"), (right, "TTFT p99 (s)")):
        ax.set_xticks(range(len(cases)), cases, rotation=20, fontsize=7)
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    save(fig, path)


def _case(row: dict[str, Any]) -> str:
    return f"random {row['rate']:g}/h" if row["case"] == "random" else str(row["case"])


def main(argv: list[str] | None = None) -> int:
    return experiment_main("faults", help_description(__doc__), build, argv)
