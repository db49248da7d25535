"""The ``dualpath-emu`` command line.

Bad input (usage, scenario, core arguments) is reported on one line, ``dualpath-emu: error: ...`` (at most
about 1,000 characters, whatever value it quotes), with exit status 2 and no traceback; anything else that
escapes is a bug and keeps its traceback."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from dualpath_emu import __version__
from dualpath_emu.errors import CoreError, NoProgressError, UsageError

PROG = "dualpath-emu"


class _ArgumentParser(argparse.ArgumentParser):
    """Raises :class:`UsageError` instead of printing usage and exiting, so ``main`` reports it uniformly."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _lazy(module: str, function: str) -> Callable[[argparse.Namespace], int]:
    """A command whose module (the cluster, zmq, ...) is imported only when it runs."""

    def command(args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(module), function)(args))

    return command


def _cmd_launch(args: argparse.Namespace) -> int:
    from dualpath_emu.cluster.live import registry  # the applications and backends a live run may name
    from dualpath_emu.runtime.launch_cli import launch_command  # imports zmq: only when asked for

    return launch_command(args, registry())


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from dualpath_emu.reproduce import EXPERIMENTS, SUMMARIES

    if args.list or args.name is None:
        if args.name is None and not args.list:
            raise UsageError("reproduce: name an experiment (`dualpath-emu reproduce --list` lists them)")
        for name in EXPERIMENTS:
            print(f"{name:<10} {SUMMARIES[name]}")
        return 0
    experiment = importlib.import_module(EXPERIMENTS[args.name])  # only the one asked for
    return int(experiment.main(list(args.options)))


def _cmd_keys(args: argparse.Namespace) -> int:
    from dualpath_emu.runtime.security import PUBLIC_SUFFIX, SECRET_SUFFIX, RunKeys  # imports zmq: only when asked

    keys = RunKeys.generate(args.directory, args.process)
    print(
        f"wrote the CURVE keys of {len(keys.names)} processes ({', '.join(keys.names)}) to {args.directory} "
        f"(mode 0700): NAME{PUBLIC_SUFFIX} (public) and NAME{SECRET_SUFFIX} (secret, 0600) for each. Copy the "
        "directory to every host of the run, keeping its modes (e.g. scp -rp); each process loads its own."
    )
    return 0


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"{PROG} {__version__}")
    return 0


def _scenario_options(parser: argparse.ArgumentParser, default_systems: str) -> None:
    """The scenario and the overrides that ``run`` and ``sweep`` share."""
    parser.add_argument("scenario", nargs="?", help="cluster scenario: a TOML file or a packaged scenario's name "
                        "(default: the built-in ds660b-2p4d-offline)")  # fmt: skip
    parser.add_argument("--system", action="append", metavar="SPEC",
                        help="run this system: a built-in one's name, or your own as file.py:Name or module:Name "
                             f"(repeat, or separate by commas, for several; default: {default_systems})")  # fmt: skip
    parser.add_argument("--agents", type=int, metavar="N", help="override the scenario's agent count")
    parser.add_argument("--seed", type=int, metavar="S", help="override the scenario's seed")


def _command(commands: Any, name: str, func: Callable[[argparse.Namespace], int], help: str,
             description: str) -> argparse.ArgumentParser:  # fmt: skip
    """A subcommand that runs ``func``."""
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help, description=description)
    parser.set_defaults(func=func)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; each subcommand sets ``func`` to the function that runs it."""
    parser = _ArgumentParser(
        prog=PROG,
        description="Emulate a prefill/decode-disaggregated LLM inference cluster that loads KV-cache over two "
        "paths (DualPath, arXiv 2602.21548). `dualpath-emu COMMAND --help` describes each command.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = _command(commands, "run", _lazy("dualpath_emu.cluster.run_cli", "run_command"),
                   "run a cluster scenario (the built-in DS 660B 2P4D one by default) for each of its systems",
                   "Run a cluster scenario in virtual time for each system (default: basic, dualpath, oracle) and "
                   "print a table: JCT, speedup vs basic, TTFT/TPOT, storage- and compute-NIC utilisation on "
                   "prefill vs decode nodes, wall time. --out DIR also writes summary.json, requests.csv, plots "
                   "and traces. --list shows the packaged scenarios.")  # fmt: skip
    _scenario_options(run, "the scenario's systems")
    run.add_argument("--seeds", metavar="N|LIST",
                     help="replicates: run every system on N seeds (the scenario's seed and the N - 1 after it) or "
                          "on a list such as 0,3,7, and print each figure's mean with its 95%% confidence interval "
                          "(virtual time)")  # fmt: skip
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="set a scenario key by its dotted path, VALUE as in TOML (a bare word is a string), "
                          "e.g. workload.max_rounds=4 (repeat for several)")  # fmt: skip
    run.add_argument("--faults", type=Path, metavar="FILE",
                     help='add the faults of FILE (kind = "faults"; [[faults]] and [random_faults] as in a scenario) '
                          "to the scenario's (virtual time)")  # fmt: skip
    run.add_argument("--list", action="store_true", help="list the packaged scenarios and exit")
    run.add_argument("--out", type=Path, metavar="DIR", help="write summary.json, requests.csv and plots here")
    run.add_argument("--trace", action="store_true",
                     help="with --out: also a Perfetto trace per system, trace-<system>.json.gz (every transfer "
                          "and GPU span; costs memory and time on long runs)")  # fmt: skip
    run.add_argument("--json", action="store_true", help="print the summary as JSON (and nothing else) on stdout")
    run.add_argument("--quiet", action="store_true", help="no header line, no progress bars")
    live = run.add_argument_group("real time (--mode realtime: the same actors live, as OS processes)")
    live.add_argument("--backend", choices=("model", "host"), default=None,
                      help="model (the scenario's default): the core times every byte; host: move real bytes (KV "
                           "blocks in files, KV between processes over sockets), live")  # fmt: skip
    live.add_argument("--byte-scale", type=float, metavar="F", default=None,
                      help="host backend: real bytes per modelled byte (default the scenario's, 0.001)")  # fmt: skip
    live.add_argument("--mode", choices=("virtual", "realtime"), default=None,
                      help="virtual (default): one process, virtual clock, deterministic; realtime: wall clock, "
                           "one OS process per engine group, a data-plane service owning every port")  # fmt: skip
    live.add_argument("--time-scale", type=float, metavar="S", default=1.0,
                      help="realtime: emulated seconds per wall second (default 1)")  # fmt: skip
    live.add_argument("--placement", choices=("groups", "roles", "single"), default="groups",
                      help="realtime: groups (default: scheduler, client, each prefill and decode group its own "
                           "process), roles (front end, prefill, decode), single (one process)")  # fmt: skip
    live.add_argument("--transport", choices=("ipc", "tcp"), default="ipc",
                      help="realtime: ipc (default; sockets in a private directory) or tcp "
                           "(CURVE-authenticated)")  # fmt: skip
    live.add_argument("--host", default="127.0.0.1", help="realtime, tcp: the address to bind (default loopback)")
    live.add_argument("--run-dir", type=Path, metavar="DIR",
                      help="realtime: keep the run's description, keys, logs and parts here (default: under --out, "
                           "else a temporary directory)")  # fmt: skip
    live.add_argument("--metrics-port", type=int, metavar="PORT",
                      help="realtime: serve live Prometheus metrics on 127.0.0.1:PORT (0: a free port, "
                           "printed)")  # fmt: skip
    live.add_argument("--timeout", type=float, metavar="S", default=86_400.0,
                      help="realtime: wall seconds after which the run is stopped (default one day)")  # fmt: skip
    live.add_argument("--prepare", type=Path, metavar="DIR",
                      help="realtime, several hosts: write the run (description, tcp endpoints, CURVE keys) into "
                           "DIR and print each host's commands instead of running it; then "
                           "`dualpath-emu collect DIR`")  # fmt: skip
    live.add_argument("--process-host", action="append", metavar="PATTERN=HOST",
                      help="--prepare: run the processes whose names match PATTERN (shell style: 'pe*', 'de*', "
                           "'dataplane', 'client', 'scheduler') on HOST; the rest on --host (repeat for "
                           "several)")  # fmt: skip
    live.add_argument("--port-base", type=int, default=47_100, metavar="PORT",
                      help="--prepare: the data plane listens on PORT, the other processes on the next "
                           "ports")  # fmt: skip
    live.add_argument("--restart-crashed", action="store_true",
                      help="realtime: an engine group's process (a prefill group peN, a decode node's engines deN) "
                           "that dies before the run is complete is started again in its place (at most 3 times "
                           "each) and the run goes on, its work dispatched again; recorded with --prepare. Without "
                           "it, or when the client, the scheduler or the data plane dies, the run ends")  # fmt: skip

    sweep = _command(commands, "sweep", _lazy("dualpath_emu.sweep", "sweep_command"),
                     "run a cluster scenario over a grid of settings (local processes or a Dask cluster), resumable",
                     "Run a cluster scenario at every point of a grid (the cartesian product of the --set values) "
                     "for each system, in local processes (--jobs) or on a Dask cluster (--dask). Writes "
                     "sweep.csv, sweep.json and sweep.png into --out and prints a table; every run is kept in the "
                     "run cache (JSON, safe to share), so the same command again resumes and reuses the runs "
                     "already done.")  # fmt: skip
    _scenario_options(sweep, "the scenario's")
    sweep.add_argument("--set", action="append", metavar="KEY=V1,V2,...",
                       help="sweep a scenario key over these values (each read as TOML; commas inside brackets or "
                            "quotes do not split), e.g. workload.agents=32,64,128; one value: a fixed override "
                            "(repeat for several keys: their cartesian product)")  # fmt: skip
    sweep.add_argument("--systems", help=argparse.SUPPRESS)  # the old spelling of --system A,B
    sweep.add_argument("--out", type=Path, metavar="DIR", required=True,
                       help="write sweep.csv, sweep.json and sweep.png here (and the run cache, "
                            "DIR/cache)")  # fmt: skip
    where = sweep.add_mutually_exclusive_group()
    where.add_argument("--jobs", type=int, metavar="N", help="local processes for the runs (default: CPUs)")
    where.add_argument("--dask", metavar="ADDRESS",
                       help="run on the workers of the Dask cluster whose scheduler is at ADDRESS (tcp://host:8786, "
                            "tls://host:8786: reach it over a trusted network or TLS); needs pip install "
                            "'dualpath-emu[dask]'")  # fmt: skip
    sweep.add_argument("--cache", type=Path, metavar="DIR",
                       help="the run cache (default: DIR/cache under --out): finished runs are reused "
                            "from it")  # fmt: skip
    sweep.add_argument("--json", action="store_true", help="print sweep.json (and nothing else) on stdout")
    sweep.add_argument("--quiet", action="store_true", help="no header line, no progress lines")

    check = _command(commands, "check", _lazy("dualpath_emu.testing.check", "check_command"),
                     "property-test a scheduling policy: alone, then in whole small clusters with faults and "
                     "delivery orders",
                     "Check a system's policy against the invariants (docs/testing-your-scheduler.md): first the "
                     "policy alone in a state machine of arrivals, fetches and completions, then whole small clusters "
                     "in virtual time under random workloads with tool waits, fault schedules and delivery orders. "
                     "Every decision is checked (the contract, the paper's rules the policy promises, liveness), and "
                     "every run for conservation and determinism. On a failure: the invariant, the smallest case "
                     "Hypothesis shrank it to, a scenario file beside the policy's file and the command that "
                     "replays it; exit status 1. Loading the policy runs its code.")  # fmt: skip
    check.add_argument("spec", metavar="SPEC",
                       help="the system to check: a built-in one's name, or your own as file.py:Name or module:Name "
                            "(a System, a Policy subclass, or a name in the module's SYSTEMS)")  # fmt: skip
    check.add_argument(
        "--budget",
        default="60s",
        metavar="TIME",
        help="how long to search, e.g. 60s or 2m (default 60s; a quarter for the policy alone)",
    )
    check.add_argument(
        "--examples", type=int, metavar="N", help="instead of --budget: N state-machine runs and N whole clusters"
    )
    check.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="the search's seed (default 0): the same seed and budget or examples search the same cases",
    )
    check.add_argument(
        "--phase",
        choices=("all", "policy", "cluster"),
        default="all",
        help="policy: the policy alone only; cluster: whole clusters only (default: both)",
    )
    check.add_argument(
        "--replay",
        type=Path,
        metavar="FILE.toml",
        help="run this scenario (one a failed check wrote) with every decision checked, and report",
    )
    check.add_argument(
        "--reproduce",
        metavar="VERSION:BLOB",
        help="replay one failing run of the policy alone, as a failed check printed it",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")

    collect = _command(commands, "collect", _lazy("dualpath_emu.cluster.run_cli", "collect_command"),
                       "merge and check a live run started by hand (run --prepare) and print its results",
                       "Merge the parts of a live run started by hand on one or several hosts (`run --mode "
                       "realtime --prepare DIR`): gather every host's *.part, *.events and *.json files into DIR "
                       "first. Checks that every admitted request ended exactly once and every byte is accounted, "
                       "then prints the table (or --json).")  # fmt: skip
    collect.add_argument("run_dir", metavar="DIR", type=Path, help="the prepared run directory, every part gathered")
    collect.add_argument("--json", action="store_true", help="print the summary as JSON")
    collect.add_argument("--out", type=Path, metavar="DIR", help="also write summary.json, requests.csv and plots here")

    compare = _command(commands, "compare", _lazy("dualpath_emu.cluster.run_cli", "compare_command"),
                       "print two runs' figures side by side (their summary.json files)",
                       "Read two runs' summary.json (the folders of `run --out`, or the files) and print each "
                       "system's JCT, TTFT, TPOT, working set and speedup side by side with the difference and, "
                       "where both runs have replicates (--seeds), whether their 95%% intervals overlap.")  # fmt: skip
    compare.add_argument("first", metavar="A", type=Path, help="a run's --out folder or its summary.json")
    compare.add_argument("second", metavar="B", type=Path, help="another run's --out folder or its summary.json")

    validate = _command(commands, "validate", _lazy("dualpath_emu.cluster.run_cli", "validate_command"),
                        "check a scenario (cluster or run scenario)",
                        "Check a scenario file, or a packaged scenario by name, without running it: one OK line, "
                        "or one line naming the file, the key and what was expected (exit status 2). The systems "
                        "it names as file.py:Name or module:Name are imported to be checked: that runs their code, "
                        "as `run` would, so validate only scenarios whose policy files you trust.")  # fmt: skip
    validate.add_argument("file", metavar="SCENARIO", help="scenario TOML file, or a packaged scenario's name")

    demo = _command(commands, "demo", _lazy("dualpath_emu.demo", "main"),
                    "small demonstrations of the data plane",
                    "Small demonstrations of the data plane, printed as tables.")  # fmt: skip
    demo.add_argument("name", choices=("lanes",), help="lanes: virtual-lane isolation on one compute NIC")

    launch = _command(commands, "launch", _cmd_launch,
                      "start a live run's processes from its run scenario (run.toml), one OS process per "
                      "[[process]]",
                      "Start a live run from its run scenario (the run.toml that `run --mode realtime --prepare "
                      "DIR` writes): each [[process]] is an OS process, over ZeroMQ, with the data-plane service "
                      "beside them. Prints the summary and, last, the SHA-256 of the event log; `collect DIR` "
                      "merges and checks the cluster's parts.")  # fmt: skip
    launch.add_argument("scenario", help="the run scenario's TOML file (a live run's run.toml)")
    launch.add_argument("--seed", type=int, help="override the scenario's seed")
    launch.add_argument("--time-scale", type=float, help="emulated seconds per wall second")
    launch.add_argument("--event-log", type=Path, help="write the canonical event log to this file")
    launch.add_argument("--run-dir", type=Path, help="keep each process's output, log and results here")
    launch.add_argument("--json", action="store_true", help="print the result as JSON")
    launch.add_argument("--only", metavar="NAME,NAME", help="several hosts: start only these processes of "
                        "a run written with --prepare into --run-dir (this host's share) and watch them")  # fmt: skip
    launch.add_argument("--prepare", action="store_true",
                        help="only write the run description (run.json) into --run-dir and print the command that "
                             "starts each process (for processes started by hand, e.g. on several hosts)")  # fmt: skip

    node = commands.add_parser("node", add_help=False, help="run one process of a real-time run (started by "
                               "`launch`, or by hand on another host)")  # fmt: skip
    node.add_argument("arguments", nargs="*", help="see `dualpath-emu node --help`")

    keys = _command(commands, "keys", _cmd_keys,
                    "make the CURVE keys of a real-time run's processes (for runs on several hosts)",
                    "Write a new CURVE key pair for each process of a real-time run into DIR (created, or empty; "
                    "made 0700, secret files 0600): the ZeroMQ transport admits only these keys. Copy DIR to every "
                    "host of the run.")  # fmt: skip
    keys.add_argument("directory", metavar="DIR", type=Path, help="the directory for the keys (new or empty)")
    keys.add_argument("--process", action="append", required=True, metavar="NAME",
                      help="a process of the run, as its [[process]] is named (repeat for each)")  # fmt: skip

    from dualpath_emu.reproduce import EXPERIMENTS  # names only; each experiment's module loads when it runs

    reproduce = _command(commands, "reproduce", _cmd_reproduce,
                         "reproduce one of the paper's experiments",
                         "Run one of the paper's experiments and print the paper's values beside the emulator's. "
                         "Options after NAME: --quick (the small variant), --out DIR (CSV, PNG, JSON), --jobs N "
                         "(processes), --json; `dualpath-emu reproduce NAME --help` lists them.")  # fmt: skip
    names = tuple(EXPERIMENTS)
    reproduce.add_argument("name", metavar="NAME", nargs="?", choices=names, help=f"one of {', '.join(names)}")
    reproduce.add_argument("--list", action="store_true", help="list the experiments and exit")
    reproduce.add_argument("options", nargs=argparse.REMAINDER, help="the experiment's options")

    calibrate = commands.add_parser("calibrate", add_help=False,  # --help goes to the experiment's own parser
                                    help="fit the hardware parameters the paper does not give on Basic and Oracle "
                                         "runs (= `reproduce calibrate`; --write saves the fit)")  # fmt: skip
    calibrate.add_argument("options", nargs="*", help="see `dualpath-emu calibrate --help`")

    host = _command(commands, "calibrate-host", _lazy("dualpath_emu.host.calibrate", "calibrate_command"),
                    "measure this machine's disk and network through the host backend's I/O paths; print them as a "
                    "hardware table for a scenario",
                    "Measure this machine's disk (O_DIRECT block writes and verified reads) and its byte channel "
                    "between processes (unpaced, verified), and print them as [hardware] and [storage] tables with "
                    "the largest byte_scale a host-backend run of the paper's nodes keeps to its model "
                    "here.")  # fmt: skip
    host.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), metavar="DIR",
                      help="where to measure the disk (default the temporary directory; give the mount the KV "
                           "blocks will live on)")  # fmt: skip
    host.add_argument("--size-mib", type=int, default=256, metavar="N", help="MiB written and read, and sent (256)")
    host.add_argument("--out", type=Path, metavar="FILE", help="write the tables here instead of printing them")

    trace = _command(commands, "trace", _lazy("dualpath_emu.workload.trace_cli", "trace_command"),
                     "workload traces: summarise, generate (Table 2 datasets), import Mooncake",
                     "Workload traces: summarise a trajectory file or a Mooncake trace, generate trajectories "
                     "shaped like the paper's datasets (Table 2), or convert a Mooncake trace into a trajectory "
                     "file.")  # fmt: skip
    traces = trace.add_subparsers(dest="trace_command", metavar="TRACE_COMMAND")
    stats = traces.add_parser("stats", help="summarise a trajectory file or a Mooncake trace",
                              description="Summarise a trajectory file or a Mooncake trace: counts, per-turn "
                                          "prompt, hit, append and generation lengths, the prefix-hit fraction "
                                          "and, for agent trajectories, the columns of the paper's Table 2.")  # fmt: skip
    stats.add_argument("file", type=Path, help="trace file (JSONL)")
    stats.add_argument("--json", action="store_true", help="print the statistics as JSON")
    gen = traces.add_parser("gen", help="generate agent trajectories shaped like one of the paper's datasets",
                            description="Generate agent trajectories shaped like one of the paper's datasets "
                                        "(Table 2) and write them as a trajectory file (JSONL).")  # fmt: skip
    gen.add_argument("--dataset", required=True, help="32k, 48k or 64k (MaxLen of Table 2)")
    gen.add_argument("--agents", type=int, help="number of agents (default: the base trajectories)")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    gen.add_argument("--base", type=int, help="base trajectories per dataset (default 500)")
    gen.add_argument("--reading", help="per-trajectory (default) or per-turn: which reading of Table 2 to match")
    gen.add_argument("--first-append", type=int, help="tokens of the extra agents' synthetic first round (default 1)")
    gen.add_argument("--out", type=Path, required=True, help="output trajectory file")
    imported = traces.add_parser("import", help="convert a Mooncake request trace to a trajectory file",
                                 description="Convert a Mooncake request trace (JSONL) to a trajectory file: "
                                             "requests grouped into sessions (a request whose prefix blocks extend "
                                             "an earlier one's joins its session), each request's hit the longest "
                                             "run of prefix blocks seen before; says how many sessions it found.")  # fmt: skip
    imported.add_argument("file", type=Path, help="Mooncake trace (JSONL)")
    imported.add_argument("--out", type=Path, required=True, help="output trajectory file")
    imported.add_argument("--block-tokens", type=int, help="tokens per hash block (default 512)")
    imported.add_argument("--no-sessions", action="store_true",
                          help="one single-turn trajectory per request instead of sessions")  # fmt: skip

    catalog = _command(commands, "catalog", _lazy("dualpath_emu.cluster.catalog_cli", "catalog_command"),
                       "list the models, GPUs and NICs a scenario can name",
                       "List the models, GPUs and NICs a scenario can name (the packaged catalog, and with FILE "
                       "those a scenario or catalog file adds), with their derived numbers and sources. A scenario "
                       "defines its own in [models.NAME], [gpus.NAME] and [nics.NAME] tables or in catalog files "
                       'it includes (catalog = ["mine.toml"]); docs/scenario-reference.md lists every '
                       "key.")  # fmt: skip
    catalog.add_argument("file", nargs="?", default=None, metavar="FILE",
                         help='a scenario (file or packaged name) or a catalog file (kind = "catalog")')  # fmt: skip
    catalog.add_argument("--json", action="store_true", help="print the entries as JSON")

    version = _command(commands, "version", _cmd_version,
                       "print the version",
                       "Print the version.")  # fmt: skip
    return parser


_MAX_ERROR_CHARS = 1_000


def _one_line(message: str) -> str:
    """An error message as one line of at most about 1,000 characters, whatever value it quotes."""
    line = " ".join(message.split("\n"))
    if len(line) <= _MAX_ERROR_CHARS:
        return line
    return f"{line[:_MAX_ERROR_CHARS]}… ({len(line):,} characters)"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["node"]:  # its own parser: every argument after "node" is its own
        from dualpath_emu.cluster.live import registry
        from dualpath_emu.runtime import node

        return node.main(argv[1:], registry())
    if argv[:1] == ["calibrate"]:  # = `reproduce calibrate`: every argument after it is the experiment's
        argv = ["reproduce", *argv]
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError(f"a command is required; see {PROG} --help")
        return int(args.func(args))
    except (UsageError, CoreError) as e:
        print(f"{PROG}: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except NoProgressError as e:  # the run failed, not the input: status 1, as a live run that fails
        print(f"{PROG}: error: {_one_line(str(e))}", file=sys.stderr)
        return 1
    except SystemExit as e:  # --help and --version
        return e.code if isinstance(e.code, int) else 0
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as other Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the interpreter's final flush is silent
        return 141


if __name__ == "__main__":
    sys.exit(main())
