"""What every experiment of ``dualpath-emu reproduce`` shares: runs (cells) in parallel processes, the
side-by-side comparison with the paper, and the outputs (CSV, PNG, JSON, a printed table).

An experiment module builds a list of :class:`Cell` (one cluster run each), runs them with
:func:`run_cells`, turns the :class:`CellResult` into CSV rows and :class:`Comparison` (the paper's value, the
emulator's, their ratio, the issue's target and whether it is met) and returns a :class:`Report`;
:func:`experiment_main` gives it the common command line::

    dualpath-emu reproduce NAME [--quick] [--out DIR] [--jobs N] [--cache DIR] [--json]

``--quick`` runs the small variant (a few minutes in all, for CI), ``--out DIR`` writes ``NAME.csv``,
``NAME.png`` and ``NAME.json`` there, ``--jobs`` runs cells in that many processes (default: the CPUs this
process may use), ``--cache DIR`` keeps every run's result for reuse (:func:`run_parallel`). A cell's result depends only on the cell (every run is deterministic from its seed), so
the number of processes changes the wall time, never a figure.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import hashlib
import importlib
import json
import os
import pickle
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from dualpath_emu.cluster.catalog import TESTBED_NODE
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.inputs import short_repr
from dualpath_emu.workload.generator import DATASETS, generate, scaled
from dualpath_emu.workload.trajectory import Trajectory

__all__ = [
    "Cell",
    "CellResult",
    "Comparison",
    "Report",
    "deployment",
    "experiment_main",
    "run_cells",
    "run_parallel",
    "within",
]

DEPLOYMENTS: dict[str, dict[str, Any]] = {
    # The paper's default deployments (§7.1, paper-facts §2.1); the packaged scenarios (dualpath_emu/scenarios) hold the same.
    "ds660b": {"model": "ds660b", "pe_nodes": 2, "de_nodes": 4, "prefill_ep_nodes": 2, "decode_ep_nodes": 4},
    "ds27b": {"model": "ds27b", "pe_nodes": 1, "de_nodes": 1, "prefill_ep_nodes": 1, "decode_ep_nodes": 1},
    "qwen32b": {"model": "qwen32b", "pe_nodes": 1, "de_nodes": 2, "prefill_ep_nodes": 1, "decode_ep_nodes": 1,
                "dram_buffer_bytes": 320_000_000_000},  # fmt: skip
}


QUICK_NODE: Final = dataclasses.replace(TESTBED_NODE, snic_bytes_per_s=TESTBED_NODE.snic_bytes_per_s / 4)
"""The node of the ``--quick`` variants: storage NICs at a quarter of the testbed's 50 GB/s, so that a few
hundred agents' first rounds are storage-bound as the paper's thousands of whole trajectories are (the
orderings the quick variants check are those of a storage-bound cluster)."""


def deployment(model: str, *, quick: bool = False, calibrated: bool = True, **overrides: Any) -> ClusterConfig:
    """The paper's deployment of ``model`` (DS 660B 2P4D, DS 27B 1P1D, Qwen 32B 1P2D) with ``overrides``;
    ``quick``: on :data:`QUICK_NODE`; ``calibrated``: with the fitted hardware parameters of
    ``calibration.json`` (:mod:`~dualpath_emu.reproduce.calibrate`), where there is one and not ``quick``
    (the miniature keeps its own storage NICs)."""
    base = {**DEPLOYMENTS[model], **({"node": QUICK_NODE} if quick else {})}
    config = ClusterConfig(**{**base, **overrides})
    if calibrated and not quick:
        from dualpath_emu.reproduce.calibrate import apply, load

        fitted = load()
        if fitted is not None:
            config = apply(config, fitted)
    return config


@dataclass(frozen=True)
class Cell:
    """One cluster run of an experiment: ``labels`` say which point of the figure it is."""

    labels: Mapping[str, Any]
    config: ClusterConfig
    system: str
    seed: int = 0
    max_rounds: int = 0
    """> 0: each agent replays only its first ``max_rounds`` rounds (quick variants)."""
    append_factor: float = 1.0
    gen_factor: float = 1.0

    def trajectories(self) -> list[Trajectory]:
        """The workload: the config's dataset and agents, scaled and cut as the cell says."""
        c = self.config
        work = generate(c.dataset, c.agents, seed=self.seed)
        if self.append_factor != 1.0 or self.gen_factor != 1.0:
            max_len = DATASETS[c.dataset].max_len
            work = [scaled(t, append_factor=self.append_factor, gen_factor=self.gen_factor, max_len=max_len)
                    for t in work]  # fmt: skip
        if self.max_rounds:
            work = [Trajectory.from_rounds(t.id, list(zip(t.append, t.gen))[: self.max_rounds]) for t in work]
        return work


@dataclass(frozen=True)
class CellResult:
    """What a cell's run gave: the run's summary (``SystemResult.summary()``) and figures that need the
    per-request metrics, computed in the worker so that only plain data crosses processes."""

    cell: Cell
    summary: dict[str, Any]
    ttft_breakdown_s: dict[str, float]
    """Mean seconds per TTFT component (Fig. 12 left): ``scheduling``, ``allocation``, ``reading``, ``prefill``."""
    attention_balance: list[tuple[float, float]]
    """Per prefill forward pass: (start as a fraction of the JCT, max/mean attention time over the group's
    GPUs), Fig. 13 right."""

    @property
    def jct_s(self) -> float:
        return float(self.summary["jct_s"])


def _mean_gap_s(start: Sequence[int], end: Sequence[int]) -> float:
    gaps = [(b - a) / 1e9 for a, b in zip(start, end) if a >= 0 and b >= 0]
    return sum(gaps) / len(gaps) if gaps else 0.0


def run_cell(cell: Cell) -> CellResult:
    """Run one cell (in whichever process); raises what the run raises (lost requests, invariants)."""
    from dualpath_emu.cluster.run import run_system  # the worker's import

    result = run_system(cell.config, cell.system, cell.trajectories(), seed=cell.seed)
    m = result.metrics
    # Fig. 12's TTFT components: scheduling = arrival → assigned to a DE (both engines known), allocation =
    # → the read starts (buffers granted), reading = the read, prefill = read done (or assignment, without a
    # read) → first token.
    ready = [r if r >= 0 else s for r, s in zip(m.read_done_ns, m.scheduled_de_ns)]
    read_start = [r if r >= 0 else s for r, s in zip(m.read_start_ns, m.scheduled_de_ns)]
    breakdown = {
        "scheduling": _mean_gap_s(m.arrive_ns, m.scheduled_de_ns),
        "allocation": _mean_gap_s(m.scheduled_de_ns, read_start),
        "reading": _mean_gap_s(read_start, ready),
        "prefill": _mean_gap_s(ready, m.first_token_ns),
    }
    span_ns = max(1.0, result.jct_s * 1e9)
    first = min(m.arrive_ns) if len(m) else 0
    balance = [((t - first) / span_ns, b) for t, b in zip(m.forward_ns, m.forward_attention_balance)]
    return CellResult(cell, result.summary(), breakdown, balance)


T = TypeVar("T")


@functools.cache
def code_fingerprint(worker_module: str) -> str:
    """A digest of the code a run's result depends on: every Python file of the package outside
    ``reproduce/`` (the emulator), this module (cells, the default worker), ``worker_module``'s file and the
    native core. The other experiment modules only lay out and compare results, so editing them keeps the
    cache; any change to what runs invalidates it."""
    package = Path(__file__).resolve().parent.parent
    worker_file = Path(importlib.import_module(worker_module).__file__ or "").resolve()
    paths = [p for p in package.rglob("*.py") if "reproduce" not in p.relative_to(package).parts[:-1]]
    paths += [Path(__file__).resolve(), worker_file, *package.glob("_core*.so"), *package.glob("_core*.pyd")]
    digest = hashlib.sha256()
    for path in sorted(set(paths)):
        digest.update(str(path.relative_to(package) if path.is_relative_to(package) else path).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _cache_path(cache: Path, worker: Callable[[Cell], Any], cell: Cell) -> Path:
    # Labels only name a figure's point: the same run under other labels (another experiment's) is reused.
    key = f"{worker.__module__}.{worker.__qualname__}|{code_fingerprint(worker.__module__)}|{dataclasses.replace(cell, labels={})!r}"
    return cache / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.pickle"


def run_parallel(worker: Callable[[Cell], T], cells: Sequence[Cell], jobs: int = 1, *,
                 report: Callable[[Cell, T, float], None] | None = None, cache: Path | None = None) -> list[T]:  # fmt: skip
    """``worker(cell)`` for every cell, in up to ``jobs`` processes, largest runs (agents) first; results in
    the order of ``cells``. ``report(cell, result, seconds so far)`` after each. With ``cache`` (a folder),
    each result is also kept there and reused by a later call with the same worker, cell and code: an
    interrupted experiment resumes where it stopped, and experiments that share runs compute them once."""
    started = time.perf_counter()
    results: dict[int, T] = {}

    def finished(i: int, result: T, fresh: bool) -> None:
        results[i] = result
        if cache is not None and fresh:
            cache.mkdir(parents=True, exist_ok=True)
            path = _cache_path(cache, worker, cells[i])
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_bytes(pickle.dumps(result))
            partial.replace(path)  # atomic: a reader never sees half a result
        if report is not None:
            report(cells[i], result, time.perf_counter() - started)

    todo = []
    for i, cell in enumerate(cells):
        path = _cache_path(cache, worker, cell) if cache is not None else None
        if path is not None and path.exists():
            finished(i, pickle.loads(path.read_bytes()), fresh=False)
        else:
            todo.append(i)
    todo.sort(key=lambda i: -cells[i].config.agents)  # so that the last ones to start are short
    if jobs <= 1 or len(todo) <= 1:
        for i in todo:
            finished(i, worker(cells[i]), fresh=True)
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
            futures = {pool.submit(worker, cells[i]): i for i in todo}
            for future in as_completed(futures):
                finished(futures[future], future.result(), fresh=True)
    return [results[i] for i in range(len(cells))]


def run_cells(cells: Sequence[Cell], jobs: int = 1, *, quiet: bool = False,
              cache: Path | None = None) -> list[CellResult]:  # fmt: skip
    """Run ``cells`` (:func:`run_cell`) in up to ``jobs`` processes; results in the order of ``cells``."""
    done = 0

    def report(cell: Cell, result: CellResult, elapsed: float) -> None:
        nonlocal done
        done += 1
        if not quiet:
            labels = " ".join(f"{k}={v}" for k, v in cell.labels.items())
            print(f"  [{done}/{len(cells)}] {labels} {cell.system}: JCT {result.jct_s:,.0f} s "
                  f"({result.summary['wall_s']:.0f} s wall; {elapsed:.0f} s so far)", file=sys.stderr, flush=True)  # fmt: skip

    results = run_parallel(run_cell, cells, jobs, report=report, cache=cache)
    return [dataclasses.replace(r, cell=c) for r, c in zip(results, cells)]  # a cached result's own labels


def systems_ordered(jct: Mapping[Any, Mapping[str, float]], slack: float = 0.02) -> bool:
    """Oracle ≤ DualPath ≤ Basic in JCT at every point (Oracle within ``slack`` of DualPath: run noise)."""
    return all(v["oracle"] <= v["dualpath"] * (1 + slack) and v["dualpath"] <= v["basic"] for v in jct.values())


# --------------------------------------------------------------------------------------------------- comparing


@dataclass(frozen=True)
class Comparison:
    """One number of the paper beside the emulator's: ``target`` is the issue's tolerance in words."""

    what: str
    paper: float
    emulator: float
    target: str
    met: bool | None
    """Whether the target is met; None where the paper's number is only context (no target)."""

    @property
    def ratio(self) -> float:
        return self.emulator / self.paper if self.paper else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ratio": self.ratio}


def within(what: str, paper: float, emulator: float, *, rel: float | None = None, abs_: float | None = None,
           unit: str = "") -> Comparison:  # fmt: skip
    """A comparison whose target is ``paper`` ± ``rel`` (relative) or ± ``abs_`` (absolute, in ``unit``)."""
    if rel is not None:
        return Comparison(what, paper, emulator, f"±{rel:.0%}", abs(emulator / paper - 1.0) <= rel)
    if abs_ is not None:
        return Comparison(what, paper, emulator, f"±{abs_:g}{unit}", abs(emulator - paper) <= abs_)
    return Comparison(what, paper, emulator, "context", None)


@dataclass
class Report:
    """An experiment's outcome: CSV rows, comparisons with the paper, notes, and how to draw its figure."""

    name: str
    title: str
    rows: list[dict[str, Any]]
    comparisons: list[Comparison]
    notes: list[str] = field(default_factory=list)
    plot: Callable[[Path], None] | None = None
    """Draw the figure into the given PNG path."""
    checks: dict[str, bool] = field(default_factory=dict)
    """Orderings the issue asks of the quick variant too (e.g. ``oracle <= dualpath <= basic``)."""
    wall_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "experiment": self.name,
            "title": self.title,
            "wall_s": self.wall_s,
            "rows": self.rows,
            "comparisons": [c.as_dict() for c in self.comparisons],
            "checks": self.checks,
            "notes": self.notes,
        }


def _print_report(report: Report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"{report.name}: {report.title}")
    for column, justify in (("what", "left"), ("paper", "right"), ("emulator", "right"), ("ratio", "right"),
                            ("target", "left"), ("met", "left")):  # fmt: skip
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for c in report.comparisons:
        met = "-" if c.met is None else ("yes" if c.met else "NO")
        table.add_row(c.what, f"{c.paper:,.3g}", f"{c.emulator:,.3g}", f"{c.ratio:.2f}", c.target, met)
    console.print(table)
    for name, ok in report.checks.items():
        console.print(f"check {name}: {'ok' if ok else 'FAILED'}", highlight=False)
    for note in report.notes:
        console.print(note, highlight=False)
    console.print(f"wall time {report.wall_s:.0f} s", highlight=False)


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Rows as CSV, columns in first-seen order."""
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def default_jobs() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_MAX_JOBS = 256
"""The most processes an experiment starts (each runs one cell at a time)."""


def experiment_main(
    name: str,
    description: str,
    build: Callable[[argparse.Namespace], Report],
    argv: list[str] | None = None,
    *,
    configure: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """The common command line (``--quick``, ``--out``, ``--jobs``, ``--json``, and what ``configure`` adds);
    ``build(args)`` runs the experiment (``args.quiet``: print no progress)."""
    parser = argparse.ArgumentParser(prog=f"dualpath-emu reproduce {name}", description=description)
    parser.add_argument("--quick", action="store_true", help="the small variant (minutes, for CI)")
    parser.add_argument("--out", metavar="DIR", type=Path, help=f"write {name}.csv, {name}.png and {name}.json here")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="processes for the runs (default: CPUs)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (and nothing else)")
    parser.add_argument("--cache", metavar="DIR", type=Path,
                        help="keep each run's result in DIR and reuse it (same run, same code): resumes an "
                             "interrupted experiment, shares runs between experiments")  # fmt: skip
    if configure is not None:
        configure(parser)
    args = parser.parse_args(argv)
    if not 1 <= args.jobs <= _MAX_JOBS:
        parser.error(f"--jobs: expected an integer in [1, {_MAX_JOBS}], got {short_repr(args.jobs)}")
    args.quiet = args.json
    started = time.perf_counter()
    report = build(args)
    report.wall_s = time.perf_counter() - started
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_csv(args.out / f"{name}.csv", report.rows)
        (args.out / f"{name}.json").write_text(json.dumps(report.as_json(), indent=2) + "\n")
        if report.plot is not None:
            report.plot(args.out / f"{name}.png")
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        _print_report(report)
    return 0
