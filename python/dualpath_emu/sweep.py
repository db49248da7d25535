"""``dualpath-emu sweep`` (docs/sweeps.md): one cluster scenario over the cartesian grid of ``--set KEY=V1,V2,...``
values, every point × system one run of what ``dualpath-emu run SCENARIO --set ...`` would run, the whole grid
checked first. Runs go through :func:`~dualpath_emu.reproduce.common.run_parallel` (local processes or Dask, a worker
refusing a run that would differ from the client's) and its JSON run cache, so the same command resumes; ``--out``
gets ``sweep.csv``, ``sweep.json`` and ``sweep.png``."""

from __future__ import annotations

import argparse
import hashlib
import inspect
import itertools
import json
import math
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from dualpath_emu import __version__
from dualpath_emu.cluster.run_cli import load_scenario, parse_settings
from dualpath_emu.cluster.scenario import ClusterScenario
from dualpath_emu.cluster.user_systems import is_user_spec, system_specs
from dualpath_emu.config import ScenarioError
from dualpath_emu.errors import UsageError
from dualpath_emu.inputs import short_repr
from dualpath_emu.reproduce.common import (
    MAX_JOBS,
    check_dask_address,
    code_fingerprint,
    dataclass_codec,
    default_jobs,
    run_parallel,
    write_csv,
)

__all__ = [
    "SWEEP_RESULTS", "SweepMismatchError", "SweepResult", "SweepRun", "parse_grid", "plan", "run_point",
    "split_values", "sweep_command",
]  # fmt: skip

CSV_METRICS: Final = ("jct_s", "ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "tpot_mean_s", "tpot_p50_s",
                      "tpot_p99_s", "turns", "agents", "complete", "failed_requests", "snic_max_over_mean",
                      "wall_s")  # fmt: skip
"""The columns of ``sweep.csv`` after the swept keys and the system."""


# ------------------------------------------------------------------------------------------------ the grid


def split_values(text: str) -> list[str]:
    """``V1,V2,...`` split at the commas outside brackets, braces and quotes, each value stripped."""
    values: list[str] = []
    depth, quote, start, i = 0, "", 0, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1  # an escaped character inside a basic string
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            values.append(text[start:i].strip())
            start = i + 1
        i += 1
    values.append(text[start:].strip())
    return values


def parse_grid(settings: Sequence[str]) -> dict[str, list[object]]:
    """``--set KEY=V1,V2,...`` options as the grid: each key's values, read as TOML (a bare word as a string)."""
    grid: dict[str, list[object]] = {}
    for setting in settings:
        key, equals, text = setting.partition("=")
        key = key.strip()
        if not equals or not key:
            raise UsageError(f"--set {setting!r}: expected KEY=V1,V2,..., e.g. workload.max_rounds=1,2,4")
        if key in grid:
            raise UsageError(f"--set {key}: given twice; list all its values in one --set {key}=V1,V2,...")
        texts = split_values(text)
        if any(not t for t in texts):
            raise UsageError(f"--set {setting!r}: expected one or more comma-separated values, e.g. {key}=1,2 "
                             "(an empty value; a string value that is empty: \"\")")  # fmt: skip
        grid[key] = [parse_settings([f"{key}={t}"])[key] for t in texts]
    return grid


def _point_text(point: Mapping[str, object]) -> str:
    return " ".join(f"{k}={_show(v)}" for k, v in point.items()) or "(no --set)"


def _show(value: object) -> str:
    """A grid value as the command line wrote it (TOML-ish: strings bare, lists in brackets)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return f"[{','.join(_show(v) for v in value)}]"
    return str(value)


# ------------------------------------------------------------------------------------------------ the runs


class SweepMismatchError(UsageError):
    """A worker would run another dualpath-emu, or another scenario file, trace or system at the same path."""


@dataclass(frozen=True)
class SweepRun:
    """One system at one grid point: how to load the run in the worker, and what the client loaded (checked)."""

    labels: Mapping[str, Any]  # The point's values of the swept keys.
    scenario: str | None  # A packaged scenario's name, an absolute file path, or None (the built-in one).
    overrides: tuple[tuple[str, Any], ...]  # Every ``--set`` key's value at this point (fixed ones too).
    systems: tuple[str, ...] | None
    agents: int | None
    seed: int | None
    system: str
    fingerprint: str  # What the run's result depends on (:func:`_fingerprint`).
    code: str  # The client's :func:`~dualpath_emu.reproduce.common.code_fingerprint`.
    cost: float = 1.0

    def cache_key(self) -> str:
        return self.fingerprint

    def load(self) -> ClusterScenario:
        return load_scenario(self.scenario, dict(self.overrides), what="--set").with_overrides(
            systems=self.systems, agents=self.agents, seed=self.seed
        )


@dataclass(frozen=True)
class SweepResult:
    """A run's summary and who ran it (``pid N on HOST`` or ``dask ADDRESS``: metadata, not a result)."""

    summary: dict[str, Any]
    ran_by: str


SWEEP_RESULTS: Final = dataclass_codec(SweepResult)  # How a sweep's results are cached (JSON).


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fingerprint(scenario: ClusterScenario, system_name: str) -> str:
    """What a run depends on besides dualpath-emu's code (a trace and a user policy's file by their content)."""
    system = scenario.system(system_name)
    parts = [repr(scenario.config), repr(scenario.seed), repr(scenario.max_rounds), repr(scenario.generator),
             repr(system)]  # fmt: skip
    if scenario.trace is not None:
        parts.append(f"trace {_file_digest(scenario.trace)}")
    if isinstance(system.scheduler, type):
        source = inspect.getsourcefile(system.scheduler)
        parts.append(f"policy {_file_digest(Path(source)) if source else system.scheduler.__module__}")
    return "|".join(parts)


def _ran_by() -> str:
    distributed = sys.modules.get("distributed")  # only where Dask runs this (never imported here)
    if distributed is not None:
        try:
            return f"dask {distributed.get_worker().address}"
        except ValueError:  # not in a Dask worker
            pass
    return f"pid {os.getpid()} on {socket.gethostname()}"


def run_point(run: SweepRun) -> SweepResult:
    """Run one point's system in a worker, or :class:`SweepMismatchError` if it would run something else."""
    from dualpath_emu.cluster.run import run_system  # the worker's import

    where = _ran_by()
    if code_fingerprint(__name__) != run.code:
        raise SweepMismatchError(f"{where} runs another dualpath-emu than the client (another version or build): "
                                 "install the same one on every worker")  # fmt: skip
    scenario = run.load()
    if _fingerprint(scenario, run.system) != run.fingerprint:
        raise SweepMismatchError(f"{where}: point {_point_text(run.labels)}: the scenario, a trace or a user system "
                                 f"it loads here differs from the client's ({scenario.source}): put the same files "
                                 "at the same paths on every worker")  # fmt: skip
    result = run_system(scenario.config, scenario.system(run.system), scenario.trajectories(), seed=scenario.seed)
    return SweepResult(result.summary(), where)


# ------------------------------------------------------------------------------------------------ the command


def _systems_option(args: argparse.Namespace) -> tuple[str, ...] | None:
    """``--system`` (and the old ``--systems``), file specs made absolute (workers may start elsewhere), or None."""
    given = system_specs([*([args.systems] if args.systems is not None else []), *(args.system or [])])
    if not given:
        return None
    out: list[str] = []
    for spec in given:
        target, _, name = spec.rpartition(":")
        if is_user_spec(spec) and target.endswith(".py"):
            spec = f"{Path(target).resolve()}:{name}"
        out.append(spec)
    return tuple(out)


def _scenario_reference(argument: str | None) -> str | None:
    if argument is None or not Path(argument).exists():
        return argument  # the built-in scenario, or a packaged one by name (each worker has its own copy)
    return str(Path(argument).resolve())


def plan(args: argparse.Namespace) -> tuple[ClusterScenario, dict[str, list[object]], list[SweepRun]]:
    """The first point's scenario, the grid and every run, each point's scenario loaded and checked."""
    grid = parse_grid(args.set or ())
    swept = [k for k, values in grid.items() if len(values) > 1]
    systems = _systems_option(args)
    reference = _scenario_reference(args.scenario)
    code = code_fingerprint(__name__)
    first: ClusterScenario | None = None
    runs: list[SweepRun] = []
    for values in itertools.product(*grid.values()):
        point = dict(zip(grid, values))
        labels = {k: point[k] for k in swept}
        run = SweepRun(labels, reference, tuple(point.items()), systems, args.agents, args.seed, "", "", code)
        try:
            scenario = run.load()
        except ScenarioError as error:
            raise ScenarioError(f"sweep point {_point_text(point)}: {error}" if point else str(error)) from None
        first = first or scenario
        for name in scenario.systems:
            runs.append(SweepRun(labels, reference, run.overrides, systems, args.agents, args.seed, name,
                                 _fingerprint(scenario, name), code, float(scenario.config.agents)))  # fmt: skip
    assert first is not None  # the product of no keys is one point
    return first, grid, runs


def sweep_command(args: argparse.Namespace) -> int:
    """Runs ``dualpath-emu sweep``; returns the exit status."""
    jobs = default_jobs() if args.jobs is None else args.jobs
    if not 1 <= jobs <= MAX_JOBS:
        raise UsageError(f"--jobs: expected an integer in [1, {MAX_JOBS}], got {short_repr(jobs)}")
    if args.dask is not None:
        check_dask_address(args.dask)  # before anything runs
    scenario, grid, runs = plan(args)
    out: Path = args.out
    cache: Path = args.cache if args.cache is not None else out / "cache"
    from dualpath_emu.cluster.outputs import make_output_folder

    make_output_folder(out, "--out")
    swept = [k for k, values in grid.items() if len(values) > 1]
    points = math.prod(len(v) for v in grid.values())
    where = f"on the Dask cluster at {args.dask}" if args.dask else f"in {min(jobs, len(runs))} process(es)"
    if not (args.json or args.quiet):
        print(f"{scenario.name} ({scenario.source}): {points} point(s), {len(runs)} run(s) {where}", flush=True)
    reused = 0
    started = time.perf_counter()

    def report(run: SweepRun, result: SweepResult, done: int, elapsed: float, cached: bool) -> None:
        nonlocal reused
        reused += cached
        if not args.quiet:
            took = "from the cache" if cached else f"{result.summary['wall_s']:.1f} s wall"
            print(f"  [{done}/{len(runs)}] {_point_text(run.labels)} {run.system}: JCT "
                  f"{result.summary['jct_s']:,.1f} s ({took}; {elapsed:.0f} s so far)", file=sys.stderr, flush=True)  # fmt: skip

    results = run_parallel(run_point, runs, jobs, report=report, cache=cache, codec=SWEEP_RESULTS, dask=args.dask)
    wall_s = time.perf_counter() - started
    document = _document(scenario, args, grid, runs, results)
    rows = [_row(run, result) for run, result in zip(runs, results)]
    try:
        write_csv(out / "sweep.csv", rows)
        (out / "sweep.json").write_text(json.dumps(document, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        _plot(out / "sweep.png", scenario.name, swept, runs, results)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot write: {error.strerror or error}") from None
    reuse = f"{reused} of {len(runs)} run(s) reused from the cache {cache}"
    status = _warn_incomplete(runs, results)
    if args.json:
        print(json.dumps(document, indent=2, allow_nan=False))
        if not args.quiet:
            print(reuse, file=sys.stderr)
        return status
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a file or a pipe: no reason to wrap the table at 80 columns
        console = Console(width=max(console.width, 150))
    console.print(_table(scenario, swept, runs, results))
    console.print(f"{reuse}; {wall_s:.1f} s in all", highlight=False)
    console.print(f"wrote sweep.csv, sweep.json and sweep.png to {out}", highlight=False)
    return status


# --------------------------------------------------------------------------------------------- the outputs


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _document(scenario: ClusterScenario, args: argparse.Namespace, grid: Mapping[str, list[object]],
              runs: Sequence[SweepRun], results: Sequence[SweepResult]) -> dict[str, Any]:  # fmt: skip
    document: dict[str, Any] = {
        "scenario": scenario.name, "source": scenario.source, "version": __version__, "grid": dict(grid),
        "systems": list(dict.fromkeys(run.system for run in runs)), "agents": args.agents, "seed": args.seed,
        "runs": [{"point": dict(run.overrides), "system": run.system, "summary": result.summary,
                  "ran_by": result.ran_by} for run, result in zip(runs, results)],
    }  # fmt: skip
    return cast(dict[str, Any], _finite(document))


def _row(run: SweepRun, result: SweepResult) -> dict[str, Any]:
    s = result.summary
    metrics = {
        "jct_s": s["jct_s"], "ttft_mean_s": s["ttft_s"]["mean"], "ttft_p50_s": s["ttft_s"]["p50"],
        "ttft_p99_s": s["ttft_s"]["p99"], "tpot_mean_s": s["tpot_s"]["mean"], "tpot_p50_s": s["tpot_s"]["p50"],
        "tpot_p99_s": s["tpot_s"]["p99"], "turns": s["turns"], "agents": s["agents"],
        "complete": _complete(s), "failed_requests": s.get("failed_requests", 0),
        "snic_max_over_mean": s["snic_max_over_mean"], "wall_s": s["wall_s"],
    }  # fmt: skip
    assert tuple(metrics) == CSV_METRICS
    return {**{k: _show(v) for k, v in run.labels.items()}, "system": run.system, **metrics}


def _complete(summary: Mapping[str, Any]) -> bool:
    """Whether a run finished every turn of its workload (no request failed)."""
    return bool(summary.get("complete", summary.get("failed_requests", 0) == 0))


def _warn_incomplete(runs: Sequence[SweepRun], results: Sequence[SweepResult]) -> int:
    """One warning on stderr per run that failed requests; the exit status (3 if any did, as ``run``)."""
    from dualpath_emu.cluster.run_cli import EXIT_INCOMPLETE

    status = 0
    for run, result in zip(runs, results):
        if not _complete(result.summary):
            reason = result.summary.get("incomplete") or f"{run.system} failed requests"
            print(f"dualpath-emu: warning: {_point_text(run.labels)}: {reason}: its JCT and latencies cover only the "
                  "work that finished, and no speedup is given against it", file=sys.stderr)  # fmt: skip
            status = EXIT_INCOMPLETE
    return status


def _f(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def _table(
    scenario: ClusterScenario, swept: Sequence[str], runs: Sequence[SweepRun], results: Sequence[SweepResult]
) -> Any:
    from rich import box
    from rich.table import Table

    fixed = " ".join(f"{k}={_show(v)}" for k, v in runs[0].overrides if k not in swept) if runs else ""
    title = f"sweep of {scenario.name}" + (f" ({fixed})" if fixed else "")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False)
    failures = not all(_complete(result.summary) for result in results)
    for header in (*swept, "system", "JCT (s)", *(("failed",) if failures else ()), "vs basic", "TTFT (s)\nmean",
                   "TTFT (s)\np50/p99", "TPOT (ms)\np50/p99", "turns", "wall (s)"):  # fmt: skip
        table.add_column(header, justify="left" if header in (*swept, "system") else "right", no_wrap=True)
    if failures:
        table.caption = (
            "* requests failed: that run's JCT and latencies cover only the work that finished (no speedup against it)"
        )
        table.caption_justify = "left"
    # Basic's JCT per point, where it finished everything: a speedup compares runs that did the same work.
    basic = {repr(run.overrides): result.summary["jct_s"] for run, result in zip(runs, results)
             if run.system == "basic" and _complete(result.summary)}  # fmt: skip
    for run, result in zip(runs, results):
        s = result.summary
        base = basic.get(repr(run.overrides)) if _complete(s) else None
        table.add_row(
            *(_show(run.labels[k]) for k in swept), run.system, _f(s["jct_s"], 1) + ("" if _complete(s) else "*"),
            *((f"{s.get('failed_requests', 0):,}",) if failures else ()),
            f"{base / s['jct_s']:.2f}×" if base and s["jct_s"] > 0 else "-", _f(s["ttft_s"]["mean"]),
            f"{_f(s['ttft_s']['p50'])}/{_f(s['ttft_s']['p99'])}",
            f"{_f(1e3 * s['tpot_s']['p50'], 1)}/{_f(1e3 * s['tpot_s']['p99'], 1)}", f"{s['turns']:,}",
            _f(s["wall_s"], 1),
        )  # fmt: skip
    return table


def _plot(
    path: Path, name: str, swept: Sequence[str], runs: Sequence[SweepRun], results: Sequence[SweepResult]
) -> None:
    """JCT against the first swept key: a line per system and values of the other swept keys."""
    from dualpath_emu.reproduce.plots import panels, save, system_colours

    x_key = swept[0] if swept else ""
    values = [run.labels[x_key] if x_key else "all" for run in runs]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    xs = list(dict.fromkeys(_show(v) for v in values))
    at = [float(v) if numeric else float(xs.index(_show(v))) for v in values]
    lines: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for run, result, x in zip(runs, results, at):
        rest = " ".join(f"{k}={_show(run.labels[k])}" for k in swept[1:])
        lines.setdefault((run.system, rest), []).append((x, float(result.summary["jct_s"])))
    fig, (ax,) = panels(1, width=6.4, height=4.2)
    styles = ("o-", "s--", "^:", "D-.", "v-", "P--")
    others = list(dict.fromkeys(rest for _, rest in lines))
    colours = system_colours(system for system, _ in lines)
    for (system, rest), points in lines.items():
        label = f"{system} {rest}".strip()
        ax.plot(*zip(*sorted(points)), styles[others.index(rest) % len(styles)], color=colours[system], label=label)
    partial = [(x, float(r.summary["jct_s"])) for r, x in zip(results, at) if not _complete(r.summary)]
    if partial:  # a run that failed requests: its point is how long it ran, not a JCT of the whole workload
        ax.scatter(*zip(*partial), marker="x", s=80, color="tab:red", zorder=3, label="requests failed (partial)")
    if not numeric:
        ax.set_xticks(range(len(xs)), xs)
    elif len(xs) <= 12 and all(isinstance(v, int) for v in values):
        ax.set_xticks(sorted(set(values)))  # integers: no 1.2 or 1.4 between
    ax.set_xlabel(x_key)
    ax.set_ylabel("JCT (s)")
    ax.set_title(f"sweep of {name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    save(fig, path)
