"""Run scenarios: which application, which seed, which backend, and which actors live in which process.

A run scenario is the TOML file a live run is started from (``run.toml``; ``dualpath-emu launch run.toml``). Every
key, its default and its range: docs/wire.md ("Run scenarios"); unknown keys and bad values are
:class:`~dualpath_emu.config.ScenarioError`\\ s naming the file and the key. A run of more than one process on a
backend whose processes share a core gets one more, the data-plane service (:data:`DATAPLANE_PROCESS`). The
launcher writes the run description, ``run.json`` (:class:`RunDescription`), which every process reads."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, TypeGuard

from dualpath_emu.config import ScenarioError, Table, format_bound, load_toml
from dualpath_emu.inputs import short_repr
from dualpath_emu.runtime.app import Application, Backend, Registry

__all__ = [
    "DATAPLANE_PROCESS", "MODES", "RUN_DESCRIPTION", "TRANSPORTS", "INCARNATION_OPTION", "check_overrides",
    "ProcessSpec", "RunDescription", "RunScenario", "incarnation_stem", "load_run_scenario"
]  # fmt: skip

MODES: Final = ("realtime",)
TRANSPORTS: Final = ("ipc", "tcp")
MAX_SEED: Final = 2**63 - 1
MAX_LATENCY_S: Final = 10.0
TIME_SCALE: Final = (1e-6, 1e6)  # The range of ``time_scale`` (the core's wall clock accepts the same).
MAX_TIMEOUT_S: Final = 1e6
WATCH_TIMEOUT_S: Final = (0.1, 3600.0)  # The range of ``heartbeat_timeout_s`` and ``hang_timeout_s``.
DATAPLANE_PROCESS: Final = "dataplane"
"""The name of a real-time run's data-plane process (no ``[[process]]`` may take it)."""
RUN_DESCRIPTION: Final = "run.json"  # The run description's file name in the run directory.
INCARNATION_OPTION: Final = "--incarnation"
"""The node's option that says which incarnation of its process it is: 0 (the first, the default) or, for a
process started again in place of one that died (``restart_crashed``), 1, 2, … Its files then carry the
suffix ``.<n>`` (:func:`incarnation_stem`)."""


def incarnation_stem(process: str, incarnation: int) -> str:
    """The stem of incarnation ``incarnation`` of ``process``'s files: ``de2``, then ``de2.1``, …"""
    return process if incarnation == 0 else f"{process}.{incarnation}"


@dataclass(frozen=True)
class ProcessSpec:
    """One OS process of a real-time run: its name, actors and, optionally, fixed endpoints."""

    name: str
    actors: tuple[str, ...]
    endpoint: str | None = None
    data_endpoint: str | None = None


@dataclass(frozen=True)
class RunScenario:
    source: str
    app: Application
    seed: int
    mode: str
    latency_s: float
    time_scale: float
    transport: str
    host: str
    timeout_s: float
    processes: tuple[ProcessSpec, ...]
    heartbeat_timeout_s: float = 5.0
    hang_timeout_s: float = 3.0
    dataplane_endpoint: str | None = None
    backend: Backend | None = None
    """How each process gets its data plane (from the registry; ``None``: the model backend)."""
    restart_crashed: tuple[str, ...] = ()
    """The processes started again in their place if they die before the run is complete."""
    busy_timeout_s: float = 600.0
    """How long one piece of work may hold a process's loop before the launcher ends the run (docs/live.md)."""

    def with_overrides(self, *, seed: int | None = None, time_scale: float | None = None) -> RunScenario:
        """A copy with command-line overrides applied (``None`` keeps the file's value; see :func:`check_overrides`)."""
        check_overrides(seed=seed, time_scale=time_scale)
        return replace(
            self,
            seed=self.seed if seed is None else seed,
            time_scale=self.time_scale if time_scale is None else time_scale,
        )

    def process(self, name: str) -> ProcessSpec:
        for spec in self.processes:
            if spec.name == name:
                return spec
        known = ", ".join(repr(p.name) for p in self.processes)
        raise ScenarioError(f"{self.source}: no process named {name!r} (processes: {known})")

    @property
    def driver_process(self) -> ProcessSpec:
        """The process that hosts the application's driver actor (and so runs its driver)."""
        driver = self.app.driver_actor
        return next(p for p in self.processes if driver in p.actors)

    @property
    def backend_name(self) -> str:
        """The backend's name (``"model"`` when none was given)."""
        return "model" if self.backend is None else self.backend.name

    @property
    def shares_core(self) -> bool:
        """Whether the run's processes share one modelled core (:attr:`Backend.shares_core`)."""
        return self.backend is None or self.backend.shares_core

    @property
    def uses_dataplane(self) -> bool:
        """Whether a real-time run of this has a data-plane process (several processes sharing one core)."""
        return len(self.processes) > 1 and self.shares_core


def check_overrides(*, seed: int | None = None, time_scale: float | None = None) -> None:
    """Refuse a command line's ``--seed`` or ``--time-scale`` out of range, before any file is read."""
    low, high = TIME_SCALE
    if time_scale is not None and not low <= time_scale <= high:
        raise ScenarioError(
            f"--time-scale: expected a number in [{format_bound(low)}, {format_bound(high)}], got {time_scale}"
        )
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise ScenarioError(f"--seed: expected an integer in [0, {MAX_SEED}], got {short_repr(seed)}")


def load_run_scenario(path: str | Path, registry: Registry) -> RunScenario:
    """Read and check the run scenario in ``path``; its application and backend are ``registry``'s."""
    top = load_toml(path)
    app_name = top.get_str("app")
    app_class = registry.application(app_name, top.source)
    # The run's own keys first: a bad one is named whatever the application's table holds.
    seed = top.get_int("seed", 0, min=0, max=MAX_SEED)
    mode = top.get_str("mode", "realtime", choices=MODES)
    latency_s = top.get_float("latency_s", 0.0002, min=0.0, max=MAX_LATENCY_S)
    time_scale = top.get_float("time_scale", 1.0, min=TIME_SCALE[0], max=TIME_SCALE[1])
    transport = top.get_str("transport", "ipc", choices=TRANSPORTS)
    host = top.get_str("host", "127.0.0.1")
    timeout_s = top.get_float("timeout_s", 120.0, min=0.0, max=MAX_TIMEOUT_S, min_exclusive=True)
    low, high = WATCH_TIMEOUT_S
    heartbeat_timeout_s = top.get_float("heartbeat_timeout_s", 5.0, min=low, max=high)
    hang_timeout_s = top.get_float("hang_timeout_s", 3.0, min=low, max=high)
    busy_timeout_s = top.get_float("busy_timeout_s", 600.0, min=1.0, max=MAX_TIMEOUT_S)
    dataplane_endpoint = _endpoint(top, "dataplane_endpoint")
    backend = registry.backend(top.get_str("backend", "model"), top.source)
    app = app_class(top.table(app_name))
    processes = _processes(top, app)
    restart = top.get_str_list("restart_crashed", [])
    names = [p.name for p in processes]
    driver = next(p.name for p in processes if app.driver_actor in p.actors)
    for name in restart:
        if name not in names or name == driver or restart.count(name) > 1:
            raise top.error("restart_crashed", f"names of processes other than the driver's ({driver!r}), each once "
                            f"(processes: {', '.join(names)})", name)  # fmt: skip
    top.finish()
    return RunScenario(
        top.source, app, seed, mode, latency_s, time_scale, transport, host, timeout_s, processes,
        heartbeat_timeout_s, hang_timeout_s, dataplane_endpoint, backend, tuple(restart), busy_timeout_s,
    )  # fmt: skip


def _endpoint(table: Table, key: str) -> str | None:
    """The optional endpoint at ``key`` (``None`` if not given): an ipc:// or tcp:// address."""
    endpoint = table.get_str(key, "") or None
    if endpoint is not None and not endpoint.startswith(("ipc://", "tcp://")):
        raise table.error(key, "an ipc:// or tcp:// address", endpoint)
    return endpoint


def _processes(top: Table, app: Application) -> tuple[ProcessSpec, ...]:
    actors = app.actor_names()
    tables = top.tables("process")
    if not tables:
        return (ProcessSpec("main", tuple(actors)),)
    placed: dict[str, str] = {}
    specs: list[ProcessSpec] = []
    for table in tables:
        name = table.get_str("name")
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise table.error("name", "a non-empty name of letters, digits, '-' and '_'", name)
        if any(spec.name == name for spec in specs):
            raise table.error("name", "a name no other process has", name)
        if name == DATAPLANE_PROCESS:
            raise table.error("name", f"a name other than {DATAPLANE_PROCESS!r} (the data plane's)", name)
        hosted = table.get_str_list("actors", non_empty=True)
        for actor in hosted:
            if actor not in actors:
                raise table.error("actors", f"names of the application's actors ({', '.join(actors)})", actor)
            if actor in placed:
                raise table.error("actors", f"actors not already in process {placed[actor]!r}", actor)
            placed[actor] = name
        endpoint, data_endpoint = _endpoint(table, "endpoint"), _endpoint(table, "data_endpoint")
        table.finish()
        specs.append(ProcessSpec(name, tuple(hosted), endpoint, data_endpoint))
    missing = [a for a in actors if a not in placed]
    if missing:
        raise ScenarioError(f"{top.source}: key 'process': actor {missing[0]!r} is in no process")
    return tuple(specs)


@dataclass(frozen=True)
class RunDescription:
    """What every process of a real-time run reads from ``<run_dir>/run.json``."""

    scenario: str
    seed: int
    time_scale: float
    endpoints: dict[str, str]
    dataplane_endpoint: str | None
    requesters: tuple[str, ...]
    heartbeat_timeout_s: float
    keys: str | None = None
    data_endpoints: dict[str, str] = field(default_factory=dict)
    """Host backend: where each process's byte channel binds (empty on the model backend)."""
    clock_origin_ns: int | None = None
    """Host backend: the ``time.time_ns()`` reading that is time 0 of every process's core: on one host the
    processes share its clock; across hosts their real-time clocks must agree (NTP), and their offset is an
    error of the run's times (the model backend measures offsets to its data plane instead)."""
    version: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "scenario": self.scenario,
            "seed": self.seed,
            "time_scale": self.time_scale,
            "endpoints": dict(self.endpoints),
            "dataplane": None if self.dataplane_endpoint is None else {
                "process": DATAPLANE_PROCESS, "endpoint": self.dataplane_endpoint, "requesters": list(self.requesters),
            },
            "heartbeat_timeout_s": self.heartbeat_timeout_s,
            "keys": self.keys,
            "data_endpoints": dict(self.data_endpoints),
            "clock_origin_ns": self.clock_origin_ns,
        }  # fmt: skip

    def write(self, run_dir: Path) -> Path:
        """Write ``run_dir/run.json``, readable by its owner only (0600); return its path."""
        path = Path(run_dir) / RUN_DESCRIPTION
        data = (json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n").encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
            os.write(fd, data)
        finally:
            os.close(fd)
        return path

    @classmethod
    def read(cls, run_dir: Path) -> RunDescription:
        """Read and check ``run_dir/run.json`` (a :class:`ScenarioError` naming the file if it is bad)."""
        path = Path(run_dir) / RUN_DESCRIPTION
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ScenarioError(
                f"{path}: no run description (the launcher writes it; for a run started by hand, write it with "
                "`dualpath-emu launch SCENARIO --prepare --run-dir DIR`, or `dualpath-emu run ... --prepare DIR`)"
            ) from None
        except (OSError, ValueError) as error:
            raise ScenarioError(f"{path}: not a readable JSON run description ({error})") from None
        return cls.from_json(data, str(path))

    @classmethod
    def from_json(cls, data: object, source: str) -> RunDescription:
        def bad(key: str, expected: str) -> ScenarioError:
            return ScenarioError(f"{source}: key {key!r}: expected {expected}")

        if not isinstance(data, dict):
            raise ScenarioError(f"{source}: expected a JSON object")
        if data.get("version") != 1:
            raise bad("version", "1")
        scenario, seed, time_scale = data.get("scenario"), data.get("seed"), data.get("time_scale")
        if not isinstance(scenario, str):
            raise bad("scenario", "a string")
        if type(seed) is not int or not 0 <= seed <= MAX_SEED:
            raise bad("seed", f"an integer in [0, {MAX_SEED}]")
        if not _number_in(time_scale, *TIME_SCALE):
            raise bad("time_scale", "a number in [1e-6, 1e6]")
        endpoints = data.get("endpoints")
        if not _endpoint_map(endpoints):
            raise bad("endpoints", "an object of process name -> ipc:// or tcp:// endpoint")
        dataplane = data.get("dataplane")
        endpoint: str | None = None
        requesters: tuple[str, ...] = ()
        if dataplane is not None:
            if not isinstance(dataplane, dict):
                raise bad("dataplane", "an object or null")
            endpoint, names = dataplane.get("endpoint"), dataplane.get("requesters")
            if not isinstance(endpoint, str) or not endpoint.startswith(("ipc://", "tcp://")):
                raise bad("dataplane.endpoint", "an ipc:// or tcp:// endpoint")
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise bad("dataplane.requesters", "a list of process names")
            requesters = tuple(names)
        heartbeat = data.get("heartbeat_timeout_s")
        if not _number_in(heartbeat, *WATCH_TIMEOUT_S):
            raise bad("heartbeat_timeout_s", "a number in [0.1, 3600]")
        keys = data.get("keys")
        if keys is not None and not isinstance(keys, str):
            raise bad("keys", "a path or null")
        data_endpoints = data.get("data_endpoints", {})
        if not _endpoint_map(data_endpoints):
            raise bad("data_endpoints", "an object of process name -> ipc:// or tcp:// endpoint")
        origin = data.get("clock_origin_ns")
        if origin is not None and (type(origin) is not int or origin < 0):
            raise bad("clock_origin_ns", "a non-negative integer or null")
        return cls(scenario, seed, float(time_scale), dict(endpoints), endpoint, requesters, float(heartbeat), keys,
                   dict(data_endpoints), origin)  # fmt: skip


def _number_in(value: object, low: float, high: float) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


def _endpoint_map(value: object) -> TypeGuard[dict[str, str]]:
    """Whether ``value`` is a JSON object of process name -> ipc:// or tcp:// endpoint."""
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) and v.startswith(("ipc://", "tcp://")) for k, v in value.items()
    )
