"""`make bench`, cluster: how fast the emulated cluster runs (issue 4 §7).

Runs the DS 660B 2P4D offline setting (ClusterConfig defaults) on the 64K dataset with ``--agents`` agents
(default 256) replaying their first ``--rounds`` rounds (default 40; 0 = whole trajectories), once per
system, and prints per system::

    BENCH cluster_<system>_turns_per_s <agent turns per wall second>
    BENCH cluster_<system>_emulated_s_per_wall_s <emulated seconds (JCT) per wall second>

and, at the end, ``BENCH cluster_peak_rss_mib`` (the process's peak resident memory, all runs included).
Wall time is measured around :func:`~dualpath_emu.cluster.run.run_system` only (not the workload
generation). Goals: ≥ 10,000 turns/s, ≥ 100× real time, peak RSS < 1 GiB.
"""

from __future__ import annotations

import argparse
import resource
import sys

from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.run import run_system
from dualpath_emu.workload.generator import generate
from dualpath_emu.workload.trajectory import Trajectory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dualpath_emu.bench_cluster", description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=40, help="rounds per agent (0: whole trajectories)")
    parser.add_argument("--systems", nargs="+", default=["basic", "dualpath", "oracle"])
    args = parser.parse_args(argv)
    work = generate("64k", agents=args.agents, seed=0)
    if args.rounds:
        work = [Trajectory.from_rounds(t.id, list(zip(t.append, t.gen))[: args.rounds]) for t in work]
    config = ClusterConfig(agents=args.agents)
    for name in args.systems:
        result = run_system(config, name, work)
        print(f"cluster {name}: {result.turns} turns, JCT {result.jct_s:.1f} s emulated in {result.wall_s:.2f} s wall")
        print(f"BENCH cluster_{name}_turns_per_s {result.turns / result.wall_s:.0f} turns/s")
        print(f"BENCH cluster_{name}_emulated_s_per_wall_s {result.jct_s / result.wall_s:.1f} x")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"BENCH cluster_peak_rss_mib {peak_kib / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
