"""`make bench`, live cluster: how close a real-time run stays to virtual time, and what it holds.

``--agreement``: a storage-bound DS 27B 1P1D cluster (``--agents`` agents, whole trajectories), each system in
virtual time and live at each ``--time-scales`` in the default placement: ``BENCH
live_agreement_<system>_x<scale>_{jct_drift_pct,ttft_p50_drift_pct,lag_p99_wall_ms}``. ``--capacity`` (default): DS
660B 2P4D with 256 and 1,024 agents and 4P8D with 2,048, each for its first ``--rounds`` rounds at time scale 1; a
cluster *holds* it when its delivery lag's p99 is at most 1 ms of wall time: ``BENCH
live_capacity_<deployment>_<agents>_{lag_p99_wall_ms,turns_per_wall_s}`` and ``live_capacity_largest_holding_x1``.
Real processes on this machine: the numbers are this machine's (docs/performance.md, docs/live.md)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.live import run_live
from dualpath_emu.cluster.run import SystemResult, run_system
from dualpath_emu.cluster.run_cli import load_scenario
from dualpath_emu.workload.generator import generate
from dualpath_emu.workload.trajectory import Trajectory

LAG_GOAL_WALL_S = 1e-3


def _live(config: ClusterConfig, system: str, work: list[Trajectory], scale: float, seed: int = 0) -> SystemResult:
    from dualpath_emu.cluster.systems import SYSTEMS

    with tempfile.TemporaryDirectory(prefix="dualpath-emu-bench-") as scratch:
        return run_live(config, SYSTEMS[system], work, run_dir=Path(scratch) / "run", seed=seed, time_scale=scale)


def _drift(live: float, virtual: float) -> float:
    return 100.0 * (live - virtual) / virtual if virtual else 0.0


def agreement(agents: int, scales: list[float], systems: list[str]) -> list[dict[str, object]]:
    scenario = load_scenario("ds27b-1p1d-offline").with_overrides(agents=agents)
    work = scenario.trajectories()
    rows: list[dict[str, object]] = []
    for system in systems:
        virtual = run_system(scenario.config, system, work, seed=scenario.seed)
        print(f"{system}: virtual JCT {virtual.jct_s:.2f} s, TTFT p50 {virtual.ttft_s['p50'] * 1e3:.1f} ms "
              f"({virtual.turns} turns, {virtual.wall_s:.1f} s wall)", flush=True)  # fmt: skip
        for scale in scales:
            live = _live(scenario.config, system, work, scale, scenario.seed)
            lag = live.extra["delivery_lag_s"]
            row = {
                "system": system, "time_scale": scale, "jct_virtual_s": virtual.jct_s, "jct_live_s": live.jct_s,
                "jct_drift_pct": _drift(live.jct_s, virtual.jct_s), "ttft_p50_virtual_s": virtual.ttft_s["p50"],
                "ttft_p50_live_s": live.ttft_s["p50"],
                "ttft_p50_drift_pct": _drift(live.ttft_s["p50"], virtual.ttft_s["p50"]),
                "lag_p50_wall_ms": 1e3 * lag["p50"] / scale, "lag_p99_wall_ms": 1e3 * lag["p99"] / scale,
                "wall_s": live.wall_s,
            }  # fmt: skip
            rows.append(row)
            tag = f"live_agreement_{system}_x{scale:g}"
            cpu = ", ".join(f"{name} {s:.1f}" for name, s in live.extra["process_cpu_s"].items())
            print(f"{system} x{scale:g}: JCT {live.jct_s:.2f} s ({row['jct_drift_pct']:+.1f}%), TTFT p50 "
                  f"{live.ttft_s['p50'] * 1e3:.1f} ms ({row['ttft_p50_drift_pct']:+.1f}%), lag p50/p99 "
                  f"{row['lag_p50_wall_ms']:.2f}/{row['lag_p99_wall_ms']:.2f} wall ms, {live.wall_s:.1f} s wall; "
                  f"CPU s by process: {cpu}")  # fmt: skip
            print(f"BENCH {tag}_jct_drift_pct {row['jct_drift_pct']:.2f} %")
            print(f"BENCH {tag}_ttft_p50_drift_pct {row['ttft_p50_drift_pct']:.2f} %")
            print(f"BENCH {tag}_lag_p99_wall_ms {row['lag_p99_wall_ms']:.3f} ms", flush=True)
    return rows


def capacity(rounds: int) -> str | None:
    largest: str | None = None
    for pe, de, agents in ((2, 4, 256), (2, 4, 1024), (4, 8, 2048)):
        config = dataclasses.replace(ClusterConfig(agents=agents), pe_nodes=pe, de_nodes=de)
        work = [Trajectory.from_rounds(t.id, list(zip(t.append, t.gen))[:rounds])
                for t in generate("64k", agents=agents, seed=0)]  # fmt: skip
        live = _live(config, "dualpath", work, 1.0)
        p99_s = live.extra["delivery_lag_s"]["p99"]
        name = f"{pe}p{de}d_{agents}"
        print(f"DS 660B {pe}P{de}D, {agents} agents x {rounds} rounds: {live.turns} turns, JCT {live.jct_s:.1f} s "
              f"in {live.wall_s:.1f} s wall, lag p99 {p99_s * 1e3:.2f} ms", flush=True)  # fmt: skip
        print(f"BENCH live_capacity_{name}_lag_p99_wall_ms {p99_s * 1e3:.3f} ms")
        print(f"BENCH live_capacity_{name}_turns_per_wall_s {live.turns / live.wall_s:.0f} turns/s", flush=True)
        if p99_s <= LAG_GOAL_WALL_S:
            largest = name
    print(f"BENCH live_capacity_largest_holding_x1 {largest or 'none'}")
    return largest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dualpath_emu.bench_live", description=__doc__.split("\n")[0])
    parser.add_argument("--agreement", action="store_true", help="virtual vs real time (minutes at time scale 1)")
    parser.add_argument("--capacity", action="store_true", help="the largest cluster that holds time scale 1")
    parser.add_argument("--agents", type=int, default=32, help="--agreement: agents of the DS 27B 1P1D run")
    parser.add_argument("--time-scales", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--systems", nargs="+", default=["dualpath", "basic"])
    parser.add_argument("--rounds", type=int, default=2, help="--capacity: rounds per agent")
    args = parser.parse_args(argv)
    if args.agreement:
        agreement(args.agents, args.time_scales, args.systems)
    if args.capacity or not args.agreement:
        capacity(args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
