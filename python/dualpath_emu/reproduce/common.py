"""What every experiment of ``dualpath-emu reproduce`` shares: runs (cells) in parallel processes, the comparison with
the paper, and the outputs (CSV, PNG, JSON, a printed table).

An experiment builds :class:`Cell` runs, runs them with :func:`run_cells`, and returns a :class:`Report` of CSV rows and
:class:`Comparison` with the paper; :func:`experiment_main` gives it the common command line (``--quick``, ``--out
DIR``, ``--jobs N`` or ``--dask ADDRESS``, ``--cache DIR``, ``--json``). Every run is deterministic from its seed, so
the number of processes, or where they run, changes the wall time, never a figure. ``dualpath-emu sweep`` runs its grids
through the same :func:`run_parallel`.

**The run cache holds data, never code.** Each result is one JSON file holding the cache's format version, the full key
(the worker, the code's fingerprint, the run) and the result; a file that does not parse, or holds another version, key
or shape, is ignored with a warning and the run computed again. Nothing in it is executed or unpickled, so a cache
folder may be shared as safely as a CSV file: the worst a hostile file can do is give wrong numbers for its own key.
(Dask's own wire does pickle tasks and results: reach its scheduler only over a network you trust, or over TLS.)"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import hashlib
import importlib
import json
import os
import secrets
import sys
import time
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Generic, Protocol, TypeVar

from dualpath_emu.cluster.catalog import MODELS, TESTBED_NODE
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.errors import UsageError
from dualpath_emu.inputs import MAX_TRACE_BYTES, read_input, short_repr
from dualpath_emu.workload.generator import DATASETS, generate, scaled
from dualpath_emu.workload.trajectory import Trajectory

__all__ = [
    "CACHE_FORMAT", "CELL_RESULTS", "Cell", "CellResult", "Codec", "Comparison", "Report", "Task",
    "check_dask_address", "dataclass_codec", "deployment", "experiment_main", "require_distributed", "run_cells",
    "run_parallel", "within",
]  # fmt: skip

SYSTEMS: Final = ("basic", "dualpath", "oracle")  # The systems of the paper's figures.

DEPLOYMENTS: dict[str, dict[str, Any]] = {
    # The paper's default deployments (§7.1, paper-facts §2.1); the packaged scenarios hold the same.
    "ds660b": dict(model="ds660b", pe_nodes=2, de_nodes=4, prefill_ep_nodes=2, decode_ep_nodes=4),
    "ds27b": dict(model="ds27b", pe_nodes=1, de_nodes=1, prefill_ep_nodes=1, decode_ep_nodes=1),
    "qwen32b": dict(
        model="qwen32b", pe_nodes=1, de_nodes=2, prefill_ep_nodes=1, decode_ep_nodes=1, dram_buffer_bytes=320 * 10**9
    ),
}


QUICK_NODE: Final = dataclasses.replace(TESTBED_NODE, snic_bytes_per_s=TESTBED_NODE.snic_bytes_per_s / 4)
"""The ``--quick`` node: storage NICs at a quarter of the testbed's, so that small runs are storage-bound."""


def deployment(model: str, *, quick: bool = False, calibrated: bool = True, **overrides: Any) -> ClusterConfig:
    """The paper's deployment of ``model`` with ``overrides`` (``quick``: miniature; ``calibrated``: fitted)."""
    base = {**DEPLOYMENTS[model], **({"node": QUICK_NODE} if quick else {})}
    fields = {**base, **overrides}
    config = ClusterConfig(**{**fields, "model": MODELS[fields["model"]]})
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
    max_rounds: int = 0  # > 0: each agent replays only its first ``max_rounds`` rounds (quick variants).
    append_factor: float = 1.0
    gen_factor: float = 1.0

    @property
    def cost(self) -> float:
        return float(self.config.agents)

    def cache_key(self) -> str:
        """Everything but the labels (the same run under another experiment's labels is reused)."""
        return repr(dataclasses.replace(self, labels={}))

    def trajectories(self) -> list[Trajectory]:
        """The config's dataset and agents, scaled and cut as the cell says."""
        c = self.config
        work = generate(c.dataset, c.agents, seed=self.seed)
        if self.append_factor != 1.0 or self.gen_factor != 1.0:
            max_len = DATASETS[c.dataset].max_len
            work = [
                scaled(t, append_factor=self.append_factor, gen_factor=self.gen_factor, max_len=max_len) for t in work
            ]
        if self.max_rounds:
            work = [Trajectory.from_rounds(t.id, list(zip(t.append, t.gen))[: self.max_rounds]) for t in work]
        return work


@dataclass(frozen=True)
class CellResult:
    """A cell's run: its summary and figures computed in the worker (only plain data crosses processes)."""

    cell: Cell
    summary: dict[str, Any]
    ttft_breakdown_s: dict[str, float]
    """Mean seconds per TTFT component (Fig. 12 left): ``scheduling``, ``allocation``, ``reading``, ``prefill``."""
    attention_balance: list[tuple[float, float]]
    """Per prefill pass: (start as a fraction of the JCT, max/mean attention over the group's GPUs), Fig. 13."""

    @property
    def jct_s(self) -> float:
        return float(self.summary["jct_s"])


def _mean_gap_s(start: Sequence[int], end: Sequence[int]) -> float:
    gaps = [(b - a) / 1e9 for a, b in zip(start, end) if a >= 0 and b >= 0]
    return sum(gaps) / len(gaps) if gaps else 0.0


def run_cell(cell: Cell) -> CellResult:
    """Run one cell (in whichever process)."""
    from dualpath_emu.cluster.run import run_system  # the worker's import

    result = run_system(cell.config, cell.system, cell.trajectories(), seed=cell.seed)
    m = result.metrics
    # Fig. 12's TTFT components: arrival → both engines known → the read starts → read done → first token.
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
D = TypeVar("D")


class Task(Protocol):
    """What :func:`run_parallel` hands a worker (picklable): labels, cost, ``cache_key()``."""

    @property
    def labels(self) -> Mapping[str, Any]: ...

    @property
    def cost(self) -> float: ...

    def cache_key(self) -> str: ...


C = TypeVar("C", bound=Task)


@functools.cache
def code_fingerprint(worker_module: str) -> str:
    """A digest of the code a result depends on (the package outside ``reproduce/``, the worker, the core)."""
    package = Path(__file__).resolve().parent.parent
    worker_file = Path(importlib.import_module(worker_module).__file__ or "").resolve()
    paths = [p for p in package.rglob("*.py") if "reproduce" not in p.relative_to(package).parts[:-1]]
    paths += [Path(__file__).resolve(), worker_file, *package.glob("_core*.so"), *package.glob("_core*.pyd")]
    digest = hashlib.sha256()
    for path in sorted(set(paths)):
        digest.update(str(path.relative_to(package) if path.is_relative_to(package) else path).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------- the cache

CACHE_FORMAT: Final = 1
"""The version of a cache file's layout: ``{"format": 1, "key": <sha256>, "worker": ..., "result": ...}``."""


@dataclass(frozen=True)
class Codec(Generic[C, T]):
    """How a worker's result is cached as JSON: ``encode(result)``, ``decode(value, task)``."""

    encode: Callable[[T], Any]
    decode: Callable[[Any, C], T]


PLAIN_JSON: Final[Codec[Any, Any]] = Codec(lambda result: result, lambda value, task: value)
"""For results that are JSON data already (dicts, lists, strings, numbers; tuples come back as lists)."""


def _check_typed(hint: Any, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as the type ``hint`` says: a :class:`TypeError` naming ``where`` if it is not."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint in (int, str, bool):
        if isinstance(value, hint) and (hint is bool or not isinstance(value, bool)):
            return value
    elif origin is dict and isinstance(value, dict):
        return {_check_typed(args[0], k, where): _check_typed(args[1], v, f"{where}[{k!r}]") for k, v in value.items()}
    elif origin is list and isinstance(value, list):
        return [_check_typed(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    elif origin is tuple and isinstance(value, list):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_check_typed(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) == len(args):
            return tuple(_check_typed(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    elif origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return _check_typed(option, value, where)
            except TypeError:
                continue
    elif hint is type(None) and value is None:
        return None
    raise TypeError(f"{where}: expected {hint}, got {short_repr(value)}")


def dataclass_codec(cls: type[D], *, task_field: str | None = None) -> Codec[Any, D]:
    """The :class:`Codec` of dataclass ``cls`` with JSON-able fields (checked when read back)."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name != task_field]  # type: ignore[arg-type]

    def encode(result: D) -> dict[str, Any]:
        return {name: getattr(result, name) for name in names}

    def decode(value: Any, task: Any) -> D:
        if not isinstance(value, dict) or sorted(value) != sorted(names):
            raise ValueError(f"expected a JSON object with the fields of {cls.__name__} ({', '.join(names)})")
        given = {name: _check_typed(hints[name], value[name], name) for name in names}
        return cls(**given, **({task_field: task} if task_field is not None else {}))

    return Codec(encode, decode)


def _cache_key(worker: Callable[[C], Any], task: C) -> str:
    text = f"{worker.__module__}.{worker.__qualname__}|{code_fingerprint(worker.__module__)}|{task.cache_key()}"
    return hashlib.sha256(text.encode()).hexdigest()


MAX_CACHE_BYTES: Final = MAX_TRACE_BYTES  # The largest run cache file read (a result is a summary, a few KB to MB).


def _cache_path(cache: Path, key: str) -> Path:
    return cache / f"{key[:32]}.json"


def _cache_warning(path: Path, problem: str) -> None:
    print(f"dualpath-emu: warning: ignoring the cache file {path} ({problem}); running it again",
          file=sys.stderr, flush=True)  # fmt: skip


def _cache_read(cache: Path, key: str, codec: Codec[C, T], task: C) -> tuple[T] | None:
    """The cached result of ``key`` (a 1-tuple: a result may be None), or None if absent or not ours."""
    path = _cache_path(cache, key)
    if not os.path.lexists(path):
        return None
    try:  # a shared folder may hold anything: a FIFO is not waited on, a link to /dev/zero not read
        data = json.loads(read_input(path, what="a run cache file", limit_bytes=MAX_CACHE_BYTES).decode("utf-8"))
    except UsageError as error:
        _cache_warning(path, str(error).removeprefix(f"{path}: "))
        return None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        _cache_warning(path, f"not a readable JSON file: {short_repr(str(error))}")
        return None
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        _cache_warning(path, f"not a cache file of format {CACHE_FORMAT}")
        return None
    if data.get("key") != key:
        _cache_warning(path, "another run's key")
        return None
    try:
        return (codec.decode(data.get("result"), task),)
    except (KeyError, TypeError, ValueError) as error:
        _cache_warning(path, f"a result of the wrong shape: {short_repr(str(error))}")
        return None


def _cache_write(cache: Path, key: str, worker: Callable[[C], Any], codec: Codec[C, T], result: T) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    path = _cache_path(cache, key)
    record = {"format": CACHE_FORMAT, "key": key, "worker": f"{worker.__module__}.{worker.__qualname__}",
              "result": codec.encode(result)}  # fmt: skip
    text = json.dumps(record) + "\n"
    # A new file of our own (O_EXCL: never through a link someone else left in a shared folder), then
    # renamed over the result: atomic, a reader never sees half a result.
    partial = path.with_suffix(f".{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    try:
        partial.replace(path)
    except OSError as error:  # e.g. a directory in its place: the result stands, only the cache misses it
        partial.unlink(missing_ok=True)
        _cache_warning(path, f"cannot replace it: {error.strerror or error}")


# ---------------------------------------------------------------------------------------------- the executors


def require_distributed(option: str = "--dask") -> types.ModuleType:
    """Dask's ``distributed`` package, or a :class:`UsageError` (one line) saying how to install it."""
    try:
        return importlib.import_module("distributed")
    except ImportError:
        raise UsageError(
            f"{option} needs Dask's distributed package, which is not installed: pip install 'dualpath-emu[dask]'"
        ) from None


def _in_processes(worker: Callable[[C], T], todo: Sequence[tuple[int, C]], jobs: int) -> Iterator[tuple[int, T]]:
    with ProcessPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
        futures = {pool.submit(worker, task): i for i, task in todo}
        for future in as_completed(futures):
            yield futures[future], future.result()


def check_dask_address(address: str, option: str = "--dask") -> None:
    """A :class:`UsageError` unless Dask's ``distributed`` is installed and ``address`` a scheduler's."""
    distributed = require_distributed(option)
    from distributed.comm.addressing import parse_address

    try:
        scheme, location = parse_address(address)
    except ValueError as error:
        raise UsageError(f"{option} {address!r}: {error}") from None
    if scheme not in ("tcp", "tls") or not location:
        raise UsageError(
            f"{option} {address!r}: expected a Dask scheduler's address, tcp://HOST:PORT or tls://HOST:PORT"
        )
    if scheme == "tls" and distributed.Security().get_connection_args("client")["ssl_context"] is None:
        raise UsageError(f"{option} {address}: TLS needs Dask's TLS settings: distributed.comm.tls.ca-file, "
                         ".client.cert and .client.key in Dask's configuration (e.g. the environment variables "
                         "DASK_DISTRIBUTED__COMM__TLS__CA_FILE, __CLIENT__CERT, __CLIENT__KEY)")  # fmt: skip


def _on_dask(address: str, worker: Callable[[C], T], todo: Sequence[tuple[int, C]]) -> Iterator[tuple[int, T]]:
    """Each task on the Dask cluster at ``address``, the largest first (TLS from Dask's configuration)."""
    check_dask_address(address)
    distributed = require_distributed()
    try:
        client = distributed.Client(address, set_as_default=False)
    except (OSError, TimeoutError) as error:
        raise UsageError(f"--dask {address}: cannot connect to a Dask scheduler there: {error}") from None
    with client:
        futures = {
            client.submit(worker, task, pure=False, priority=len(todo) - rank): i for rank, (i, task) in enumerate(todo)
        }
        try:
            for future in distributed.as_completed(futures, loop=client.loop):
                yield futures[future], future.result()
        finally:
            client.cancel(list(futures))  # what is left, if a run failed or the caller stopped


def run_parallel(worker: Callable[[C], T], cells: Sequence[C], jobs: int = 1, *,
                 report: Callable[[C, T, int, float, bool], None] | None = None, cache: Path | None = None,
                 codec: Codec[C, T] | None = None, dask: str | None = None) -> list[T]:  # fmt: skip
    """``worker(cell)`` for every cell in ``jobs`` local processes or on the Dask scheduler ``dask``, largest first,
    results in order; with ``cache`` each result is kept as JSON and reused."""
    started = time.perf_counter()
    results: dict[int, T] = {}
    coding: Codec[C, T] = PLAIN_JSON if codec is None else codec
    keys = [_cache_key(worker, cell) for cell in cells] if cache is not None else []

    def finished(i: int, result: T, fresh: bool) -> None:
        results[i] = result
        if cache is not None and fresh:
            _cache_write(cache, keys[i], worker, coding, result)
        if report is not None:
            report(cells[i], result, len(results), time.perf_counter() - started, not fresh)

    todo: list[int] = []
    for i, cell in enumerate(cells):
        hit = _cache_read(cache, keys[i], coding, cell) if cache is not None else None
        if hit is not None:
            finished(i, hit[0], fresh=False)
        else:
            todo.append(i)
    todo.sort(key=lambda i: -cells[i].cost)  # so that the last ones to start are short
    tasks = [(i, cells[i]) for i in todo]
    runs: Iterable[tuple[int, T]]
    if dask is not None:
        runs = _on_dask(dask, worker, tasks) if tasks else ()
    elif jobs <= 1 or len(tasks) <= 1:
        runs = ((i, worker(task)) for i, task in tasks)
    else:
        runs = _in_processes(worker, tasks, jobs)
    for i, result in runs:
        finished(i, result, fresh=True)
    return [results[i] for i in range(len(cells))]


CELL_RESULTS: Final[Codec[Cell, CellResult]] = dataclass_codec(CellResult, task_field="cell")
"""How :func:`run_cell`'s results are cached (the cell is the asking one's)."""


def run_cells(
    cells: Sequence[Cell], jobs: int = 1, *, quiet: bool = False, cache: Path | None = None, dask: str | None = None
) -> list[CellResult]:
    """:func:`run_cell` for every cell, as :func:`run_parallel` runs them."""

    def report(cell: Cell, result: CellResult, done: int, elapsed: float, cached: bool) -> None:
        if not quiet:
            labels = " ".join(f"{k}={v}" for k, v in cell.labels.items())
            took = "from the cache" if cached else f"{result.summary['wall_s']:.0f} s wall"
            failed = result.summary.get("failed_requests", 0)
            partial = f", {failed:,} request(s) failed: partial" if failed else ""
            print(f"  [{done}/{len(cells)}] {labels} {cell.system}: JCT {result.jct_s:,.0f} s{partial} "
                  f"({took}; {elapsed:.0f} s so far)", file=sys.stderr, flush=True)  # fmt: skip

    return run_parallel(run_cell, cells, jobs, report=report, cache=cache, codec=CELL_RESULTS, dask=dask)


def jct_by(results: Sequence[CellResult], *labels: str) -> dict[Any, dict[str, float]]:
    """Each system's JCT per point, the point keyed by the tuple of its ``labels``' values."""
    out: dict[Any, dict[str, float]] = {}
    for r in results:
        out.setdefault(tuple(r.cell.labels[k] for k in labels), {})[r.cell.system] = r.jct_s
    return out


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
    met: bool | None  # Whether the target is met; None where the paper's number is only context (no target).

    @property
    def ratio(self) -> float:
        return self.emulator / self.paper if self.paper else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ratio": self.ratio}


def within(
    what: str, paper: float, emulator: float, *, rel: float | None = None, abs_: float | None = None, unit: str = ""
) -> Comparison:
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
    plot: Callable[[Path], None] | None = None  # Draw the figure into the given PNG path.
    checks: dict[str, bool] = field(default_factory=dict)
    """Orderings the issue asks of the quick variant too (e.g. ``oracle <= dualpath <= basic``)."""
    wall_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"experiment": self.name, "title": self.title, "wall_s": self.wall_s, "rows": self.rows,
                "comparisons": [c.as_dict() for c in self.comparisons], "checks": self.checks,
                "notes": self.notes}  # fmt: skip


def _print_report(report: Report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"{report.name}: {report.title}")
    if not report.comparisons and report.rows:  # nothing of the paper's to set beside: the rows themselves
        for column in report.rows[0]:
            table.add_column(column, justify="right")
        for row in report.rows:
            table.add_row(*(str(row.get(column, "")) for column in report.rows[0]))
    else:
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


MAX_JOBS = 256  # The most processes an experiment starts (each runs one cell at a time).


def experiment_main(name: str, description: str, build: Callable[[argparse.Namespace], Report],
                    argv: list[str] | None = None, *,
                    configure: Callable[[argparse.ArgumentParser], None] | None = None) -> int:  # fmt: skip
    """The common command line (``--quick``, ``--out``, ``--jobs``/``--dask``, ``--cache``, ``--json``)."""
    parser = argparse.ArgumentParser(prog=f"dualpath-emu reproduce {name}", description=description)
    parser.add_argument("--quick", action="store_true", help="the small variant (minutes, for CI)")
    parser.add_argument("--out", metavar="DIR", type=Path, help=f"write {name}.csv, {name}.png and {name}.json here")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--jobs", type=int, default=default_jobs(), help="processes for the runs (default: CPUs)")
    where.add_argument("--dask", metavar="ADDRESS",
                       help="run on the workers of the Dask cluster whose scheduler is at ADDRESS (tcp://host:8786, "
                            "tls://host:8786); needs pip install 'dualpath-emu[dask]'")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the report as JSON (and nothing else)")
    parser.add_argument("--cache", metavar="DIR", type=Path,
                        help="keep each run's result in DIR and reuse it (same run, same code): resumes an "
                             "interrupted experiment, shares runs between experiments")  # fmt: skip
    if configure is not None:
        configure(parser)
    args = parser.parse_args(argv)
    if not 1 <= args.jobs <= MAX_JOBS:
        parser.error(f"--jobs: expected an integer in [1, {MAX_JOBS}], got {short_repr(args.jobs)}")
    if args.dask is not None:
        check_dask_address(args.dask)  # before any run: one line if the package is missing
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
