"""`make bench`, cluster: how fast the emulated cluster runs (issues 4, 15 and 24).

Runs DS 660B 2P4D offline on the 64K dataset, ``--agents`` agents replaying their first ``--rounds`` rounds (0: whole
trajectories), ``--repeat`` times per system (the fastest run counts: this shared machine's wall clock varies by ±25%),
and prints ``BENCH cluster<label>_<system>_<figure>`` lines: ``turns_per_s``, ``emulated_s_per_wall_s``, ``wall_s``,
``cpu_us_per_turn``, ``turns_per_cpu_s`` and ``jct_s``, then ``cluster<label>_peak_rss_mib``. ``--clusters 2P4D,16P32D``
runs each size at the same load per prefill node and prints each further size's CPU time per turn against the first's
(``…_cost_ratio_<size>_vs_<first>``, issue 15: within 1.2×). Wall time is measured around
:func:`~dualpath_emu.cluster.run.run_system` only. Goals and measured figures: docs/performance.md.

A long run prints how far it is on stderr every minute. ``--cpu-budget-s S`` stops a run after S seconds of CPU and
reports how far it got (``BENCH …_finished 0``, ``…_turns_done``, ``…_cpu_us_per_turn_so_far``,
``…_peak_rss_mib_so_far``), exiting with status 1."""

from __future__ import annotations

import argparse
import re
import resource
import sys
import time

from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.run import Progress, run_system
from dualpath_emu.workload.generator import generate
from dualpath_emu.workload.trajectory import Trajectory


def _cluster_size(text: str) -> tuple[int, int]:
    """``"16P32D"`` → (16, 32)."""
    match = re.fullmatch(r"(\d+)P(\d+)D", text.strip().upper())
    if match is None or int(match[1]) < 1 or int(match[2]) < 1:
        raise argparse.ArgumentTypeError(f"expected a cluster size like 2P4D, got {text!r}")
    return int(match[1]), int(match[2])


class _OverBudget(Exception):
    def __init__(self, progress: Progress) -> None:
        super().__init__("over the CPU budget")
        self.progress = progress


class _Watch:
    """A run's progress callback: a line on stderr every wall minute; :class:`_OverBudget` past ``budget_s`` of CPU."""

    def __init__(self, cpu_started: float, budget_s: float | None) -> None:
        self.cpu_started, self.budget_s = cpu_started, budget_s
        self.next_line_s = 60.0

    def __call__(self, progress: Progress) -> None:
        cpu_s = time.process_time() - self.cpu_started
        if progress.wall_s >= self.next_line_s:
            self.next_line_s += 60.0
            print(f"  {progress.system}: {progress.turns_done:,} of {progress.turns_total:,} turns, "
                  f"{progress.emulated_s:.0f} s emulated, {cpu_s:.0f} s CPU", file=sys.stderr, flush=True)  # fmt: skip
        if self.budget_s is not None and cpu_s > self.budget_s:
            raise _OverBudget(progress)


def _report_unfinished(name: str, progress: Progress, cpu_s: float) -> None:
    """How far a run got within its CPU budget."""
    done = max(1, progress.turns_done)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"{name}: stopped after {cpu_s:.0f} s of CPU (--cpu-budget-s) with {progress.turns_done:,} of "
          f"{progress.turns_total:,} turns done, {progress.emulated_s:.0f} s emulated")  # fmt: skip
    print(f"BENCH {name}_finished 0")
    print(f"BENCH {name}_turns_done {progress.turns_done} turns")
    print(f"BENCH {name}_cpu_us_per_turn_so_far {1e6 * cpu_s / done:.0f} us")
    print(f"BENCH {name}_peak_rss_mib_so_far {peak_kib / 1024:.0f} MiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dualpath_emu.bench_cluster", description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=256, help="agents of the first cluster size")
    parser.add_argument("--rounds", type=int, default=40, help="rounds per agent (0: whole trajectories)")
    parser.add_argument("--systems", nargs="+", default=["basic", "dualpath", "oracle"])
    parser.add_argument("--repeat", type=int, default=2, help="runs per system; the fastest counts")
    parser.add_argument("--label", default="", help="inserted after 'cluster' in the BENCH names")
    parser.add_argument("--clusters", type=lambda v: [_cluster_size(c) for c in v.split(",")], default=None,
                        help="cluster sizes, e.g. 2P4D,16P32D (default: the configuration's, 2P4D, unnamed)")  # fmt: skip
    parser.add_argument("--cpu-budget-s", type=float, default=None,
                        help="stop a run after this much CPU and report how far it got (default: no limit)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.cpu_budget_s is not None and not args.cpu_budget_s > 0:
        parser.error(f"--cpu-budget-s: expected a number > 0, got {args.cpu_budget_s}")
    sizes: list[tuple[int, int] | None] = list(args.clusters) if args.clusters else [None]
    first_pe = sizes[0][0] if sizes[0] is not None else ClusterConfig().pe_nodes
    cost: dict[str, dict[str, float]] = {}
    for size in sizes:
        if size is None:
            config, tag = ClusterConfig(agents=args.agents), ""
        else:
            agents = args.agents * size[0] // first_pe  # the same load per node
            config, tag = ClusterConfig(agents=agents, pe_nodes=size[0], de_nodes=size[1]), f"_{size[0]}p{size[1]}d"
        work = generate("64k", agents=config.agents, seed=0)
        if args.rounds:
            work = [Trajectory.from_rounds(t.id, list(zip(t.append, t.gen))[: args.rounds]) for t in work]
        name = f"cluster{args.label}{tag}"
        for system in args.systems:
            runs = []
            for _ in range(max(1, args.repeat)):
                cpu_started = time.process_time()
                watch = _Watch(cpu_started, args.cpu_budget_s)
                try:
                    result = run_system(config, system, work, progress=watch, progress_interval_s=1.0)
                except _OverBudget as stopped:
                    _report_unfinished(f"{name}_{system}", stopped.progress, time.process_time() - cpu_started)
                    return 1
                runs.append((result, time.process_time() - cpu_started))
            result, cpu_s = min(runs, key=lambda run: run[0].wall_s)
            print(f"cluster{tag} {system}: {config.agents} agents, {result.turns} turns, JCT {result.jct_s:.1f} s "
                  f"emulated in {result.wall_s:.2f} s wall, {cpu_s:.2f} s CPU")  # fmt: skip
            print(f"BENCH {name}_{system}_turns_per_s {result.turns / result.wall_s:.0f} turns/s")
            print(f"BENCH {name}_{system}_emulated_s_per_wall_s {result.jct_s / result.wall_s:.1f} x")
            print(f"BENCH {name}_{system}_wall_s {result.wall_s:.2f} s")
            # CPU time (this process, the run only): steadier than wall time on a shared machine.
            print(f"BENCH {name}_{system}_cpu_us_per_turn {1e6 * cpu_s / result.turns:.0f} us")
            print(f"BENCH {name}_{system}_turns_per_cpu_s {result.turns / cpu_s:.0f} turns/s")
            print(f"BENCH {name}_{system}_jct_s {result.jct_s:.1f} s")
            cost.setdefault(tag, {})[system] = cpu_s / result.turns
    tags = list(cost)
    for tag in tags[1:]:
        for system in args.systems:
            ratio = cost[tag][system] / cost[tags[0]][system]
            print(f"BENCH cluster{args.label}_cost_ratio{tag}_vs{tags[0] or '_default'}_{system} {ratio:.2f} x")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"BENCH cluster{args.label}_peak_rss_mib {peak_kib / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
