"""The commands ``dualpath-emu run`` (each system of a cluster scenario on the same workload, in virtual time,
live, or over several seeds; one table, a row per system; ``--json``, ``--out DIR``: docs/running.md),
``compare``, ``collect`` (a live run started by hand) and ``validate`` (a cluster or run scenario: one ``OK``
line, or a one-line :class:`~dualpath_emu.config.ScenarioError`)."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from dualpath_emu.cluster.run import Progress as RunProgress
from dualpath_emu.cluster.run import SystemResult, run_system, speedup
from dualpath_emu.cluster.scenario import DEFAULT, ClusterScenario, load_cluster_scenario, scenario_from_table
from dualpath_emu.config import load_toml
from dualpath_emu.errors import UsageError, disk_error
from dualpath_emu.inputs import shorten, too_long_number
from dualpath_emu.scenarios import find as find_scenario
from dualpath_emu.scenarios import names as packaged_scenarios
from dualpath_emu.scenarios import path as packaged_scenario
from dualpath_emu.workload.trajectory import Trajectory

if TYPE_CHECKING:
    from dualpath_emu.cluster.live import LiveOptions

__all__ = ["compare_command", "list_command", "load_scenario", "parse_settings", "run_command", "validate_command"]


def load_scenario(
    scenario: str | Path | None, overrides: dict[str, object] | None = None, *, what: str = "override"
) -> ClusterScenario:
    """The scenario of ``scenario`` (file, packaged name or built-in), with ``overrides`` set by dotted path."""
    if scenario is None:
        return load_cluster_scenario(packaged_scenario(DEFAULT.name), overrides, what=what) if overrides else DEFAULT
    return load_cluster_scenario(find_scenario(scenario), overrides, what=what)


def parse_settings(settings: Sequence[str]) -> dict[str, object]:
    """``--set KEY=VALUE`` options as overrides: each VALUE read as a TOML value, else as a string."""
    out: dict[str, object] = {}
    for setting in settings:
        key, equals, text = setting.partition("=")
        if not equals or not key.strip():
            raise UsageError(f"--set {setting!r}: expected KEY=VALUE, e.g. workload.max_rounds=4")
        try:
            document = tomllib.loads(f"value = {text}")
            if len(document) != 1:  # 'a=1\nb=2' would set b silently
                raise UsageError(
                    f"--set {shorten(key.strip(), 200)}: expected one TOML value, got several lines of keys"
                )
            value: object = document["value"]
        except tomllib.TOMLDecodeError:
            value = text  # a bare word: the string itself
        except RecursionError:  # the same refusals as load_toml gives a file
            raise UsageError(f"--set {shorten(key.strip(), 200)}: not a valid TOML value: nested too deeply") from None
        except ValueError as error:  # an integer of more than 4,300 digits
            raise UsageError(
                f"--set {shorten(key.strip(), 200)}: not a valid TOML value: {too_long_number(error)}"
            ) from None
        out[key.strip()] = value
    return out


def run_command(args: argparse.Namespace) -> int:
    """Runs ``dualpath-emu run``; returns the exit status."""
    if args.list:
        return list_command()
    from dualpath_emu.cluster.user_systems import system_specs

    scenario = load_scenario(args.scenario, parse_settings(args.set or ()), what="--set").with_overrides(
        systems=system_specs(args.system) if args.system else None,
        agents=args.agents,
        seed=args.seed,
        backend=args.backend,
        byte_scale=args.byte_scale,
        faults=args.faults,
    )
    args.mode = getattr(args, "mode", None)
    if scenario.backend == "host":
        if args.mode == "virtual":
            raise UsageError("--backend host moves real bytes in real time: it cannot run with --mode virtual")
        args.mode = "realtime"  # real bytes take real time
        for fault in scenario.config.faults.faults:  # (only a storage NIC may stay down: the reader checks)
            node = int(fault.target[1:].split(".")[0]) if fault.target.startswith("n") else -1
            if (fault.kind == "down" and fault.duration_s is None and not fault.target.endswith(".rx")
                    and node >= scenario.config.pe_nodes):  # fmt: skip
                raise UsageError(
                    f"--backend host: the fault on {fault.target} at {fault.at_s:g} s has no duration_s: on real storage "
                    "the decode node's write-backs it would hold back for ever are read by later turns, which would "
                    "wait for them for ever; give it a duration_s (or take down only the NIC's rx side)"
                )
    elif args.mode is None:
        args.mode = "virtual"
    out: Path | None = args.out
    if args.trace and out is None:
        raise UsageError("--trace writes a Perfetto trace per system into the --out folder: add --out DIR")
    if out is not None:
        from dualpath_emu.cluster.outputs import make_output_folder

        make_output_folder(out, "--out")
    console = Console()
    if not console.is_terminal:  # a file or a pipe: no reason to wrap the table at 80 columns
        console = Console(width=max(console.width, 150))
    show_progress = not (args.quiet or args.json) and console.is_terminal
    if not args.json and not args.quiet:
        console.print(f"[bold]{scenario.name}[/] ({scenario.source}): {scenario.describe()}")
    results: dict[str, SystemResult] = {}
    if args.seeds is not None:
        if args.mode == "realtime":
            raise UsageError("--seeds runs replicates in virtual time: leave out --mode realtime (and --backend host)")
        return _run_replicates(args, scenario, console, show_progress, out)
    if args.mode != "realtime" and (args.prepare is not None or args.process_host or args.metrics_port is not None):
        raise UsageError("--prepare, --process-host and --metrics-port are for live runs: add --mode realtime")
    if args.mode != "realtime" and getattr(args, "restart_crashed", False):
        raise UsageError("--restart-crashed starts a live run's dead processes again: add --mode realtime")
    if args.mode == "realtime":
        from dualpath_emu.runtime.launcher import LaunchInterrupted

        if args.prepare is not None and args.out is not None:
            raise UsageError("--prepare writes a run to start by hand: its results come from `dualpath-emu collect`")
        try:
            results = _run_realtime(args, scenario, console)
            if args.prepare is not None:
                return 0
        except LaunchInterrupted as error:
            print(f"dualpath-emu: {error}", file=sys.stderr)
            return 130
        except LiveRunFailed as error:
            print(f"dualpath-emu: error: {error}", file=sys.stderr)
            return 1
    else:
        results = _run_virtual(args, scenario, console, show_progress, out)
    from dualpath_emu.cluster.outputs import summary, write_outputs  # after the runs: plots pull in matplotlib

    written: list[str] = []
    if out is not None:
        written = write_outputs(out, "--out", scenario, results)
    if args.json:
        print(json.dumps(summary(scenario, results), indent=2, allow_nan=False))
        return warn_incomplete(results)
    console.print(_table(scenario, results, console.width))
    for line in kv_lines(results):
        console.print(line, highlight=False)
    for name, result in results.items():
        if "host" in result.extra:
            console.print(_host_table(name, result))
    if out is not None:
        traces = " and trace-<system>.json.gz" if args.mode == "virtual" and args.trace else ""
        console.print(f"wrote {', '.join(written)}{traces} to {out}")
    return warn_incomplete(results)


EXIT_INCOMPLETE = 3
"""The exit status of a run that ended but whose requests failed (results shown, not whole)."""


def warn_incomplete(results: Mapping[str, SystemResult], where: str = "") -> int:
    """Warn of each system that failed requests; return :data:`EXIT_INCOMPLETE` if any did, else 0."""
    status = 0
    for result in results.values():
        if result.incomplete is not None:
            print(f"dualpath-emu: warning: {where}{result.incomplete}: its JCT and latencies cover only the work that "
                  "finished, and no speedup is given against it", file=sys.stderr)  # fmt: skip
            status = EXIT_INCOMPLETE
    return status


def _run_virtual(
    args: argparse.Namespace, scenario: ClusterScenario, console: Console, show_progress: bool, out: Path | None
) -> dict[str, SystemResult]:
    trajectories = scenario.trajectories()
    results: dict[str, SystemResult] = {}
    with _progress_bars(console, show_progress) as track:
        for name in scenario.systems:
            results[name] = run_system(
                scenario.config, scenario.system(name), trajectories, seed=scenario.seed, progress=track(name),
                trace_path=_trace_file(out, name) if out is not None and args.trace else None,
            )  # fmt: skip
    return results


def _run_replicates(
    args: argparse.Namespace, scenario: ClusterScenario, console: Console, show_progress: bool, out: Path | None
) -> int:
    """``run --seeds``: every system on each seed; the means with their 95% intervals (:mod:`.replicates`)."""
    from dualpath_emu.cluster.outputs import summary
    from dualpath_emu.cluster.replicates import parse_seeds, replicate_summary

    seeds = parse_seeds(args.seeds, scenario.seed)
    runs: dict[int, dict[str, SystemResult]] = {}
    started = time.perf_counter()
    with _progress_bars(console, show_progress) as track:
        for seed in seeds:
            one = scenario.with_overrides(seed=seed)
            trajectories = one.trajectories()
            runs[seed] = {
                name: run_system(one.config, one.system(name), trajectories, seed=seed, progress=track(f"{name} seed {seed}"))
                for name in one.systems
            }  # fmt: skip
    wall_s = time.perf_counter() - started
    first = scenario.with_overrides(seed=seeds[0])
    document = summary(first, runs[seeds[0]])
    document["replicates"] = replicate_summary(seeds, runs)
    document["replicates"]["wall_s"] = wall_s
    if out is not None:
        (out / "summary.json").write_text(json.dumps(document, indent=2, allow_nan=False))
    status = max(warn_incomplete(one_seed, f"seed {seed}: ") for seed, one_seed in runs.items())
    if args.json:
        print(json.dumps(document, indent=2, allow_nan=False))
        return status
    console.print(_replicates_table(scenario, document["replicates"]))
    console.print(f"{len(seeds)} seeds ({', '.join(map(str, seeds))}) in {wall_s:.1f} s; mean ± half the 95% "
                  "interval (Student's t over the seeds; the speedup paired by seed)", highlight=False)  # fmt: skip
    if out is not None:
        console.print(f"wrote summary.json (every seed's figures under 'replicates') to {out}")
    return status


def _replicates_table(scenario: ClusterScenario, replicates: dict[str, Any]) -> Table:
    from dualpath_emu.cluster.replicates import Estimate

    est = Estimate.from_json

    table = Table(title=f"{scenario.name}: {scenario.workload()}, {len(replicates['seeds'])} seeds",
                  title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False)  # fmt: skip
    incomplete = replicates.get("incomplete_seeds", {})
    headers = ["system", "JCT (s)", "failed", "vs basic"] if incomplete else ["system", "JCT (s)", "vs basic"]
    for header in (*headers, "TTFT p50 (s)", "TTFT p99 (s)", "TPOT p50 (ms)"):
        table.add_column(header, justify="left" if header == "system" else "right", no_wrap=True)
    if incomplete:
        table.caption = ("* requests failed on seeds " + "; ".join(f"{n}: {', '.join(map(str, s))}" for n, s in incomplete.items())
                         + ": those runs' JCT and latencies cover only the work that finished (no speedup against them)")  # fmt: skip
        table.caption_justify = "left"
    for name, figures in replicates["systems"].items():
        speedup = replicates["speedup_vs_basic"].get(name)
        failed = [f"{est(figures['failed_requests']).text()}"] if incomplete else []
        table.add_row(
            name, est(figures["jct_s"]).text() + ("*" if name in incomplete else ""), *failed,
            "-" if speedup is None else est(speedup).text() + "×",
            est(figures["ttft_p50_s"]).text(), est(figures["ttft_p99_s"]).text(),
            est(figures["tpot_p50_s"]).text(unit=1e-3),
        )  # fmt: skip
    return table


def compare_command(args: argparse.Namespace) -> int:
    """Runs ``dualpath-emu compare A B``: two runs' figures side by side (:func:`.replicates.compare_summaries`)."""
    from dualpath_emu.cluster.replicates import compare_summaries

    rows = compare_summaries(args.first, args.second)
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 120))
    table = Table(title=f"A: {args.first}, B: {args.second}", title_justify="left", box=box.SIMPLE_HEAD,
                  padding=(0, 1), show_edge=False)  # fmt: skip
    for header in ("system", "figure", "A", "B", "B vs A", "overlap"):
        table.add_column(header, justify="left" if header in ("system", "figure") else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    return 0


class LiveRunFailed(RuntimeError):
    """A live run failed (a process crashed or stopped answering, or a check found a loss)."""


def _run_realtime(args: argparse.Namespace, scenario: ClusterScenario, console: Console) -> dict[str, SystemResult]:
    """Each system live, one after the other, with a progress bar (to a file or pipe, a line every 10 s)."""
    from dualpath_emu.runtime.scenario import TIME_SCALE

    low, high = TIME_SCALE
    if not low <= args.time_scale <= high:
        raise UsageError(f"--time-scale: expected a number in [{low:g}, {high:g}], got {args.time_scale}")
    if not args.timeout > 0:
        raise UsageError(f"--timeout: expected a number of seconds > 0, got {args.timeout}")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65_535:
        raise UsageError(f"--metrics-port: expected a port in [0, 65535], got {args.metrics_port}")
    if args.metrics_port:
        _check_port_free(args.metrics_port)
    if scenario.backend == "host" and scenario.transfer_engine == "mooncake":
        from dualpath_emu.host.mooncake import check_available

        check_available()  # before any process starts: one line saying what to install
    trajectories = scenario.trajectories()
    if args.prepare is not None:
        _prepare(args, scenario, trajectories, console)
        return {}
    base: Path | None = args.run_dir if args.run_dir is not None else (args.out / "realtime" if args.out else None)
    if base is not None:
        from dualpath_emu.cluster.outputs import make_output_folder

        make_output_folder(base, "--run-dir" if args.run_dir is not None else "--out")
    results: dict[str, SystemResult] = {}
    shown = not (args.quiet or args.json)
    with _progress_bars(console, shown and console.is_terminal) as track:
        for name in scenario.systems:
            update = track(name) if console.is_terminal else (_progress_lines(console, name) if shown else None)
            results[name] = _run_live_system(args, scenario, console, trajectories, base, name, update)
    return results


def _check_port_free(port: int) -> None:
    """Refuse a metrics port another program holds here, before any process starts (the client's would fail)."""
    import socket

    with socket.socket(socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            raise UsageError(
                f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}: {error.strerror or error}"
            ) from None


def _progress_lines(console: Console, name: str, every_s: float = 10.0) -> Callable[[RunProgress], None]:
    """Where no progress bar can be drawn (output to a file or a pipe): a line every ``every_s`` wall seconds."""
    last = 0.0

    def update(p: RunProgress) -> None:
        nonlocal last
        if p.wall_s - last >= every_s:
            last = p.wall_s
            console.print(f"{name}: {p.turns_done:,} of {p.turns_total:,} turns, t = {p.emulated_s:,.0f} s emulated, "
                          f"{p.wall_s:,.0f} s wall", highlight=False)  # fmt: skip

    return update


def _run_live_system(
    args: argparse.Namespace, scenario: ClusterScenario, console: Console, trajectories: list[Trajectory],
    base: Path | None, name: str, progress: Callable[[RunProgress], None] | None,
) -> SystemResult:  # fmt: skip
    """One system live (see :func:`_run_realtime`)."""
    import shutil
    import tempfile

    from dualpath_emu.cluster.invariants import InvariantError
    from dualpath_emu.cluster.live import FULL_DISK_BYTES, LIVE_TEMP_PREFIX, run_live
    from dualpath_emu.cluster.run import LostRequestsError
    from dualpath_emu.runtime.launcher import OWNER_FILE, LaunchError, LaunchInterrupted, mark_owner, sweep_orphans

    if base is None:
        # Marked as this launcher's until the run is over: if it is killed (SIGKILL skips every clean-up), the
        # next live run here removes the folder (a failed run's is unmarked below and kept for its logs).
        sweep_orphans(f"{LIVE_TEMP_PREFIX}*")
        run_dir = Path(tempfile.mkdtemp(prefix=LIVE_TEMP_PREFIX))
        mark_owner(run_dir)
    else:
        run_dir = base / name
    outcome = "failed"  # or "refused" (nothing ran: the temporary folder goes) or "done"
    if not (args.quiet or args.json):
        backend = f", host backend (real bytes × {scenario.byte_scale:g})" if scenario.backend == "host" else ""
        console.print(f"{name}: live, {args.placement} placement, time scale {args.time_scale:g}{backend}, "
                      f"run directory {run_dir}")  # fmt: skip
        if args.metrics_port:
            console.print(f"  live metrics: http://127.0.0.1:{args.metrics_port}/metrics")
        elif args.metrics_port == 0:
            console.print(f"  live metrics: on the port written to {run_dir}/metrics.port")
    try:
        result = run_live(scenario.config, scenario.system(name), trajectories, run_dir=run_dir, seed=scenario.seed,
                          options=_live_options(args, scenario), progress=progress)  # fmt: skip
        outcome = "done"
    except LaunchInterrupted:
        raise  # Ctrl-C or a signal: the command ends with 130, not as a failed run
    except (LaunchError, LostRequestsError, InvariantError) as error:
        # A process that finds its disk full cannot even write why (its output is there too): say it here. The
        # run measured it before its clean-up freed space (a host run's blocks); else measure now.
        full = error.full_disk if isinstance(error, LaunchError) else None
        if isinstance(error, LaunchError) and full is None and shutil.disk_usage(run_dir).free < FULL_DISK_BYTES:
            full = f"the run directory {run_dir} is full ({shutil.disk_usage(run_dir).free:,} bytes left)"
        if full is not None:
            raise UsageError(f"{name}: {full}: the run stopped; free space and run it again") from None
        # Every process's output, event log and part stay in the run directory for a post-mortem.
        raise LiveRunFailed(
            f"{name}: {error}{_restart_hint(args, scenario, error)}\nthe run's logs are in {run_dir}"
        ) from None
    except OSError as error:  # the run directory filled up or went read-only under the launcher
        disk = disk_error(error)
        if disk is None:
            raise
        raise disk from None
    except UsageError:
        outcome = "refused"  # before any process ran (a bad --host, an option the backend refuses)
        raise
    finally:
        if base is None and outcome != "failed":
            shutil.rmtree(run_dir, ignore_errors=True)
        elif base is None:
            (run_dir / OWNER_FILE).unlink(missing_ok=True)  # kept for its logs: the user's now, never swept
    return result


def _live_options(args: argparse.Namespace, scenario: ClusterScenario) -> LiveOptions:
    """The live run's options from the command line and the scenario."""
    from dualpath_emu.cluster.live import LiveOptions

    return LiveOptions(
        time_scale=args.time_scale, placement_kind=args.placement, transport=args.transport, host=args.host,
        timeout_s=args.timeout, metrics_port=-1 if args.metrics_port is None else args.metrics_port,
        backend=scenario.backend, byte_scale=scenario.byte_scale, storage_dir=scenario.storage_dir,
        transfer_engine=scenario.transfer_engine, restart_crashed=getattr(args, "restart_crashed", False),
    )  # fmt: skip


def _restart_hint(args: argparse.Namespace, scenario: ClusterScenario, error: Exception) -> str:
    """Advice to run with ``--restart-crashed``, only where it would have helped."""
    from dualpath_emu.runtime.launcher import LaunchError

    if scenario.backend == "host" or getattr(args, "restart_crashed", False):
        return ""
    if not isinstance(error, LaunchError) or error.died is None:
        return ""
    from dualpath_emu.cluster.assemble import engine_names
    from dualpath_emu.cluster.live import placement, restartable

    processes = placement(engine_names(scenario.config), args.placement)
    if error.died not in restartable(processes):
        return ""
    return "\n(--restart-crashed would have started it again in its place, and the run gone on)"


def _prepare(
    args: argparse.Namespace, scenario: ClusterScenario, trajectories: list[Trajectory], console: Console
) -> None:
    from dualpath_emu.cluster.live import host_commands, prepare_live

    if len(scenario.systems) != 1:
        raise UsageError(
            f"--prepare writes one run: give one --system (the scenario has {', '.join(scenario.systems)})"
        )
    hosts: list[tuple[str, str]] = []
    for given in args.process_host or ():
        pattern, equals, host = given.partition("=")
        if not equals or not pattern or not host:
            raise UsageError(f"--process-host {given!r}: expected PATTERN=HOST, e.g. 'pe*=10.0.0.2'")
        hosts.append((pattern, host))
    if not 1024 <= args.port_base <= 65_535 - 1024:
        raise UsageError(f"--port-base: expected a port in [1024, 64511], got {args.port_base}")
    name = scenario.systems[0]
    if scenario.backend == "host" and not scenario.storage_dir:
        raise UsageError(
            "--prepare with --backend host: set [host] storage_dir (e.g. --set host.storage_dir=/mnt/kv) "
            "to a directory every host mounts: the KV blocks one host writes, another reads"
        )
    options = dataclasses.replace(_live_options(args, scenario), hosts=tuple(hosts), port_base=args.port_base)
    commands = prepare_live(scenario.config, scenario.system(name), trajectories, run_dir=args.prepare,
                            seed=scenario.seed, options=options)  # fmt: skip
    console.print(f"wrote the live run of {name} to {args.prepare}. Copy it to every host, at the same path (scp -rp "
                  "keeps the modes the keys need); on each host run its command, in this order; then gather every "
                  f"host's *.part, *.events and *.json files into one copy and run `dualpath-emu collect "
                  f"{args.prepare}`:", highlight=False)  # fmt: skip
    for host, command in host_commands(args.prepare, commands):
        console.print(f"  [{host}] {command}", markup=False, highlight=False, soft_wrap=True)
    console.print("(or start each process by hand, the data plane first and the client last:)", highlight=False)
    for host, process, command in commands:
        console.print(f"  [{host}] {command}", markup=False, highlight=False, soft_wrap=True)


def collect_command(args: argparse.Namespace) -> int:
    """Runs ``dualpath-emu collect DIR``."""
    from dualpath_emu.cluster.invariants import InvariantError
    from dualpath_emu.cluster.live import collect_dir
    from dualpath_emu.cluster.run import LostRequestsError
    from dualpath_emu.cluster.scenario import ClusterScenario

    _check_gathered(args.run_dir)
    try:
        result, app = collect_dir(args.run_dir)
    except (LostRequestsError, InvariantError) as error:
        print(f"dualpath-emu: error: {error}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError) as error:
        # Each file parsed above: what is left is content that parses but is not what a process wrote.
        raise UsageError(f"{args.run_dir}: a gathered file is damaged or from another run "
                         f"({type(error).__name__}: {shorten(str(error), 200)}); gather every process's files again") from None  # fmt: skip
    scenario = ClusterScenario(
        name=args.run_dir.name, config=app.config, systems=(result.system,), seed=app.seed, source=str(args.run_dir)
    )
    from dualpath_emu.cluster.outputs import summary, write_outputs

    results = {result.system: result}
    if args.out is not None:
        write_outputs(args.out, "--out", scenario, results)
    if args.json:
        print(json.dumps(summary(scenario, results), indent=2, allow_nan=False))
    else:
        Console(width=150).print(_table(scenario, results))
    return warn_incomplete(results)


GATHERED: dict[str, str] = {".part": "msgpack", ".json": "json", ".events": "events", ".toml": "toml", ".jsonl": "text"}
"""What ``collect`` reads from a run directory, by file suffix: how each is checked before it is used."""


def _check_gathered(run_dir: Path) -> None:
    """Each file ``collect`` may read in ``run_dir`` is a regular file that parses, or a one-line error."""
    import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

    from dualpath_emu.inputs import open_input
    from dualpath_emu.runtime.eventlog import parse_line

    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: expected the folder of a prepared run (`run --prepare DIR`)")
    for path in sorted(run_dir.iterdir()):
        kind = GATHERED.get(path.suffix)
        if kind is None:
            continue
        try:
            with open_input(path, what="a file a run's process wrote", limit_bytes=MAX_GATHERED_BYTES) as file:
                if kind == "msgpack":
                    msgpack.unpackb(file.read(), strict_map_key=False)
                elif kind == "json":
                    json.loads(file.read())
                elif kind == "toml":
                    tomllib.loads(file.read().decode("utf-8"))
                else:  # line by line: a long run's event log is large
                    with io.TextIOWrapper(file, encoding="utf-8") as text:
                        for line in text:
                            if kind == "events":
                                parse_line(line)
        except OSError as error:
            raise UsageError(f"{path}: cannot read: {error.strerror or error}") from None
        except (ValueError, RecursionError) as error:  # decode, JSON, TOML and msgpack errors are ValueErrors
            raise UsageError(f"{path}: damaged ({shorten(str(error), 200)}); copy it again from its host") from None


MAX_GATHERED_BYTES = 1 << 34
"""The largest file ``collect`` reads (16 GiB: a long run's event log is large, but not without end)."""


def _trace_file(out: Path, system: str) -> Path:
    from dualpath_emu.cluster.outputs import trace_file

    return trace_file(out, system)


@contextmanager
def _progress_bars(console: Console, enabled: bool) -> Iterator[Callable[[str], Callable[[RunProgress], None] | None]]:
    """``track(system)`` gives the progress callback of one run (None when bars are off)."""
    if not enabled:
        yield lambda name: None
        return
    bars = Progress(
        TextColumn("{task.description:<26}"), BarColumn(), MofNCompleteColumn(), TextColumn("turns"),
        TextColumn("{task.fields[emulated]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        console=console,
    )  # fmt: skip
    with bars:

        def track(name: str) -> Callable[[RunProgress], None]:
            task = bars.add_task(name, total=None, emulated="")

            def update(p: RunProgress) -> None:
                bars.update(
                    task, completed=p.turns_done, total=p.turns_total, emulated=f"t = {p.emulated_s:,.0f} s emulated"
                )

            return update

        yield track


def _f(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}" if math.isfinite(value) else "-"


def _pair(a: float, b: float) -> str:
    """Two utilisations as percentages, ``a/b``."""
    return f"{100 * a:.0f}/{100 * b:.0f}"


TABLE_COLUMNS_FULL = 100  # Terminals narrower than this get the compact table (the figures that fit 80 columns).


def _table(scenario: ClusterScenario, results: dict[str, SystemResult], width: int = TABLE_COLUMNS_FULL) -> Table:
    """The results, a row per system; under :data:`TABLE_COLUMNS_FULL` columns, a compact table (captioned)."""
    compact = width < TABLE_COLUMNS_FULL
    # No vertical rules, one space between columns, utilisation in percent (run means): it fits 100 columns.
    table = Table(title=f"{scenario.name}: {scenario.workload()}", title_justify="left", box=box.SIMPLE_HEAD,
                  padding=0, show_edge=False,
                  caption="(a narrow terminal: the compute NICs, wall time and events/s are left out; widen it, or "
                          "see --json / --out)" if compact else None, caption_justify="left")  # fmt: skip
    failures = any(not r.complete for r in results.values())
    headers = ["system", "JCT\n(s)"]
    if failures:  # next to the JCT: a run that gave up on work must not read as a fast one
        headers.append("failed\nreq/agt")
    headers += ["vs\nbasic", "TTFT (s)\np50/p99", "TPOT (ms)\np50/p99", "SNIC rx %\nPE/DE"]
    if not compact:
        headers += ["CNIC PE %\ntx/rx", "CNIC DE %\ntx/rx"]
    headers += ["GPU %\nPE/DE", "SNIC\nmax/mean"]
    if not compact:
        headers += ["wall\n(s)", "events\n/ s"]
    for header in headers:
        table.add_column(header, justify="left" if header == "system" else "right", no_wrap=True)
    live = not compact and any("delivery_lag_s" in r.extra for r in results.values())
    if live:  # how late the processes saw what the model said (emulated ms)
        table.add_column("lag (ms)\np50/p99", justify="right", no_wrap=True)
    if failures:
        table.caption = ("* requests failed: the JCT is how long the run took, and it and the latencies cover only "
                         "the work that finished (no speedup against it; failed: requests/agents)"
                         + (f"\n{table.caption}" if table.caption else ""))  # fmt: skip
    basic = results.get("basic")
    for name, r in results.items():
        ratio = speedup(basic, r)[0] if basic is not None else None
        snic, cnic, gpu = r.snic_util, r.cnic_util, r.gpu_util
        cells = [
            name,
            _f(r.jct_s, 1) + ("*" if not r.complete else " " if failures else ""),
            *([f"{r.failed_requests:,}/{r.failed_agents:,}"] if failures else []),
            "-" if ratio is None else f"{ratio:.2f}×",
            f"{_f(r.ttft_s['p50'])}/{_f(r.ttft_s['p99'])}",
            f"{_f(1e3 * r.tpot_s['p50'], 1)}/{_f(1e3 * r.tpot_s['p99'], 1)}",
            _pair(snic["pe"]["rx"]["mean"], snic["de"]["rx"]["mean"]),
        ]
        if not compact:
            cells += [_pair(cnic["pe"]["tx"]["mean"], cnic["pe"]["rx"]["mean"]),
                      _pair(cnic["de"]["tx"]["mean"], cnic["de"]["rx"]["mean"])]  # fmt: skip
        cells += [_pair(gpu["pe"]["mean"], gpu["de"]["mean"]), _f(r.snic_max_over_mean)]
        if not compact:
            cells += [_f(r.wall_s, 1), f"{r.events / r.wall_s:,.0f}" if r.wall_s > 0 else "-"]
        if live:
            cells.append(_lag(r))
        table.add_row(*cells)
    return table


def kv_lines(results: dict[str, SystemResult]) -> list[str]:
    """Per system and bounded KV tier, one line: what it held and dropped, and the hits it lacked (the DRAM pool's
    were read from storage; the store's computed again)."""
    lines = []
    for name, result in results.items():
        for tier, kv in result.extra.get("kv", {}).items():
            lacked = (f"{kv['recomputed_tokens']:,} computed again" if "recomputed_tokens" in kv
                      else f"{kv['missed_tokens']:,} read from storage" if tier == "pool"
                      else f"{kv['missed_tokens']:,} read from the pool or storage")  # fmt: skip
            lines.append(
                f"{name}: {tier} of {kv['capacity_bytes'] / 1e9:,.1f} GB (peak {kv['peak_bytes'] / 1e9:,.1f}): found "
                f"{kv['found_rate']:.1%} of the hit tokens asked, {lacked}; "
                f"{kv['evictions']:,} evictions ({kv['evicted_bytes'] / 1e9:,.1f} GB)"
                + (f"; wrote back {kv['written_back_bytes'] / 1e9:,.1f} GB to storage" if "write_backs" in kv else "")
            )
    return lines


def _host_table(name: str, r: SystemResult) -> Table:
    """A host-backend run's real bytes, kind by kind, next to the model's figures for the same run."""
    host = r.extra["host"]
    mib = 1 << 20
    title = (f"{name} on real bytes (× {host['byte_scale']:g}; storage {', '.join(host['storage_io']) or '-'}; "
             f"{host['gpu_copies']}): JCT {r.jct_s:.1f} s, model {host['model_jct_s']:.1f} s; "
             f"read {host['verified_read_bytes'] / mib:,.1f} MiB verified, {host['mismatched_blocks']} bad block(s); "
             f"written {host['bytes_written'] / mib:,.1f} MiB; network {host['network_bytes_verified'] / mib:,.1f} MiB "
             "verified")  # fmt: skip
    if (pool := host.get("dram_pool")) is not None:  # the DRAM pool, real memory in the decode nodes' processes
        title += (f"; DRAM pool {pool['blocks_put']:,} blocks in, {pool['blocks_read_checked']:,} read and "
                  f"{pool['blocks_dropped']:,} dropped, checked ({pool['mismatched_blocks']} bad), at most "
                  f"{pool['peak_block_bytes'] / mib:,.1f} MiB held")  # fmt: skip
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False)
    if host.get("transfer_engine_unauthenticated"):  # never hidden: who else could reach the KV's memory
        bound = sorted({a for addresses in host.get("transfer_engine_listening", {}).values() for a in addresses})
        table.caption = (
            f"KV moved over Mooncake's transfer engine, which has no authentication: bound to {', '.join(bound) or '-'}"
        )
        table.caption_justify = "left"
    for header in ("kind", "count\nhost/model", "mean ms\nhost/model", "idle path\nms", "max ms\nhost/model",
                   "real MiB", "real MiB/s\nwhile moving"):  # fmt: skip
        table.add_column(header, justify="left" if header == "kind" else "right", no_wrap=True)
    for kind, row in host["paths"].items():
        count = row.get("count", 0)
        modelled = row.get("modelled_on_host", False)

        def ms(key: str, model_key: str, digits: int) -> str:
            model = row.get(model_key)
            mine = "modelled" if modelled else _f(1e3 * row[key], digits) if count else "-"
            return f"{mine}/{_f(1e3 * model, digits) if model is not None else '-'}"

        table.add_row(
            kind, f"{count}/{row.get('model_count', 0)}", ms("mean_s", "model_mean_s", 2),
            _f(1e3 * row["idle_mean_s"], 2) if count and row.get("idle_mean_s") else "-", ms("max_s", "model_max_s", 1),
            _f(row.get("real_bytes", 0) / mib, 1) if count else "-",
            _f(row.get("real_bytes_per_s", 0) / mib, 1) if row.get("real_bytes") else "-",
        )  # fmt: skip
    return table


def _lag(r: SystemResult) -> str:
    lag = r.extra.get("delivery_lag_s")
    return f"{1e3 * lag['p50']:.2f}/{1e3 * lag['p99']:.2f}" if lag else "-"


def list_command() -> int:
    """Runs ``dualpath-emu run --list``: one line per packaged scenario."""
    for name in packaged_scenarios():
        path = packaged_scenario(name)
        top = load_toml(path)
        if "app" in top and "kind" not in top:
            print(f"{name}: actor-runtime scenario for `dualpath-emu launch {name}` (app {top.get_str('app')!r})")
        else:
            print(f"{name}: {scenario_from_table(top, path).describe()}")
    return 0


def validate_command(args: argparse.Namespace) -> int:
    """Runs ``dualpath-emu validate SCENARIO``: one OK line, or a :class:`ScenarioError`."""
    path = find_scenario(args.file)
    top = load_toml(path)
    if "app" in top and "kind" not in top:
        from dualpath_emu.cluster.live import registry
        from dualpath_emu.runtime.scenario import load_run_scenario

        run = load_run_scenario(path, registry())
        print(f"{path}: OK: run scenario for `dualpath-emu launch` (app {run.app.name!r}, backend {run.backend_name}, "
              f"seed {run.seed}, {len(run.processes)} process(es))")  # fmt: skip
        return 0
    scenario = scenario_from_table(top, path)
    print(f"{path}: OK: cluster scenario {scenario.name!r}: {scenario.describe()}")
    return 0
