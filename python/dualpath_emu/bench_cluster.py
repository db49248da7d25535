"""`make bench`, cluster: how fast the emulated cluster runs (issue 4 §7).

Runs the DS 660B 2P4D offline setting (ClusterConfig defaults) on the 64K dataset with ``--agents`` agents
(default 256) replaying their first ``--rounds`` rounds (default 40; 0 = whole trajectories), ``--repeat``
times per system (default 2; the fastest run counts: this shared machine's wall clock varies by ±25%), and
prints per system::

    BENCH cluster<label>_<system>_turns_per_s <agent turns per wall second>
    BENCH cluster<label>_<system>_emulated_s_per_wall_s <emulated seconds (JCT) per wall second>
    BENCH cluster<label>_<system>_wall_s <wall seconds of the fastest run>
    BENCH cluster<label>_<system>_cpu_us_per_turn <CPU microseconds per agent turn, that run>
    BENCH cluster<label>_<system>_turns_per_cpu_s <agent turns per CPU second, that run>

and, at the end, ``BENCH cluster<label>_peak_rss_mib`` (the process's peak resident memory, all runs
included). Wall time is measured around :func:`~dualpath_emu.cluster.run.run_system` only (not the workload
generation). Goals (issue 4): ≥ 10,000 turns/s, ≥ 100× real time, peak RSS < 1 GiB; DESIGN §8: the 1,024-agent
run (``--agents 1024 --rounds 0 --label _1024``, ≈160,000 turns) in ≤ 60 s.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.run import run_system
from dualpath_emu.workload.generator import generate
from dualpath_emu.workload.trajectory import Trajectory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dualpath_emu.bench_cluster", description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=40, help="rounds per agent (0: whole trajectories)")
    parser.add_argument("--systems", nargs="+", default=["basic", "dualpath", "oracle"])
    parser.add_argument("--repeat", type=int, default=2, help="runs per system; the fastest counts")
    parser.add_argument("--label", default="", help="inserted after 'cluster' in the BENCH names")
    args = parser.parse_args(argv)
    work = generate("64k", agents=args.agents, seed=0)
    if args.rounds:
        work = [Trajectory.from_rounds(t.id, list(zip(t.append, t.gen))[: args.rounds]) for t in work]
    config = ClusterConfig(agents=args.agents)
    name = f"cluster{args.label}"
    for system in args.systems:
        runs = []
        for _ in range(max(1, args.repeat)):
            cpu_started = time.process_time()
            result = run_system(config, system, work)
            runs.append((result, time.process_time() - cpu_started))
        result, cpu_s = min(runs, key=lambda run: run[0].wall_s)
        print(f"cluster {system}: {result.turns} turns, JCT {result.jct_s:.1f} s emulated in {result.wall_s:.2f} s wall")
        print(f"BENCH {name}_{system}_turns_per_s {result.turns / result.wall_s:.0f} turns/s")
        print(f"BENCH {name}_{system}_emulated_s_per_wall_s {result.jct_s / result.wall_s:.1f} x")
        print(f"BENCH {name}_{system}_wall_s {result.wall_s:.2f} s")
        # CPU time (this process, the run only): steadier than wall time on a shared machine (issue 15's goal: ≤ 100).
        print(f"BENCH {name}_{system}_cpu_us_per_turn {1e6 * cpu_s / result.turns:.0f} us")
        print(f"BENCH {name}_{system}_turns_per_cpu_s {result.turns / cpu_s:.0f} turns/s")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"BENCH {name}_peak_rss_mib {peak_kib / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
