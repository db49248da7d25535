"""Run scenarios: which application, which seed, which clock, and which actors live in which process.

A run scenario is a TOML file (see ``python/dualpath_emu/scenarios/pipeline.toml``, which ships in the package
and runs by name: ``dualpath-emu launch pipeline``)::

    app = "pipeline"       # the application (dualpath_emu.runtime.app.APPLICATIONS)
    seed = 1               # every random stream of the run derives from it
    mode = "virtual"       # "virtual": one process, virtual clock, deterministic event log
                           # "realtime": wall clock, one OS process per [[process]], ZeroMQ between them
    latency_s = 0.0002     # delivery latency of a message between actors of one process; 0..10
    time_scale = 1.0       # realtime: emulated seconds per wall second; 1e-6..1e6
    transport = "ipc"      # realtime: "ipc" (one host) or "tcp"
    host = "127.0.0.1"     # tcp: the address the processes bind (loopback unless told otherwise)
    timeout_s = 120.0      # realtime: wall seconds after which the launcher gives up and stops everything;
                           # at most 1e6

    [pipeline]             # the application's own keys
    jobs = 200

    [[process]]            # realtime: each actor in exactly one process (default: all in one)
    name = "source"
    actors = ["source"]
    endpoint = "tcp://10.0.0.2:5555"   # optional: where this process binds (multi-host by hand)

Every key has the default shown; unknown keys and bad values are :class:`~dualpath_emu.config.ScenarioError`\\ s
naming the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from dualpath_emu.config import ScenarioError, Table, format_bound, load_toml
from dualpath_emu.inputs import short_repr
from dualpath_emu.runtime.app import Application, application_class

__all__ = ["MODES", "TRANSPORTS", "ProcessSpec", "RunScenario", "load_run_scenario"]

MODES: Final = ("virtual", "realtime")
TRANSPORTS: Final = ("ipc", "tcp")
MAX_SEED: Final = 2**63 - 1
MAX_LATENCY_S: Final = 10.0
TIME_SCALE: Final = (1e-6, 1e6)
"""The range of ``time_scale`` (the core's wall clock accepts the same)."""
MAX_TIMEOUT_S: Final = 1e6


@dataclass(frozen=True)
class ProcessSpec:
    """One OS process of a real-time run: its name, its actors and, optionally, its fixed endpoint."""

    name: str
    actors: tuple[str, ...]
    endpoint: str | None = None


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

    def with_overrides(
        self, *, seed: int | None = None, mode: str | None = None, time_scale: float | None = None
    ) -> RunScenario:
        """A copy with command-line overrides applied (``None`` keeps the file's value)."""
        low, high = TIME_SCALE
        if time_scale is not None and not low <= time_scale <= high:
            raise ScenarioError(
                f"--time-scale: expected a number in [{format_bound(low)}, {format_bound(high)}], got {time_scale}"
            )
        if seed is not None and not 0 <= seed <= MAX_SEED:
            raise ScenarioError(f"--seed: expected an integer in [0, {MAX_SEED}], got {short_repr(seed)}")
        return replace(
            self,
            seed=self.seed if seed is None else seed,
            mode=self.mode if mode is None else mode,
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


def load_run_scenario(path: str | Path) -> RunScenario:
    """Read and check the run scenario in ``path``."""
    top = load_toml(path)
    app_name = top.get_str("app")
    app = application_class(app_name, top.source)(top.table(app_name))
    seed = top.get_int("seed", 0, min=0, max=MAX_SEED)
    mode = top.get_str("mode", "virtual", choices=MODES)
    latency_s = top.get_float("latency_s", 0.0002, min=0.0, max=MAX_LATENCY_S)
    time_scale = top.get_float("time_scale", 1.0, min=TIME_SCALE[0], max=TIME_SCALE[1])
    transport = top.get_str("transport", "ipc", choices=TRANSPORTS)
    host = top.get_str("host", "127.0.0.1")
    timeout_s = top.get_float("timeout_s", 120.0, min=0.0, max=MAX_TIMEOUT_S, min_exclusive=True)
    processes = _processes(top, app)
    top.finish()
    return RunScenario(
        top.source, app, seed, mode, latency_s, time_scale, transport, host, timeout_s, processes
    )


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
        hosted = table.get_str_list("actors", non_empty=True)
        for actor in hosted:
            if actor not in actors:
                raise table.error("actors", f"names of the application's actors ({', '.join(actors)})", actor)
            if actor in placed:
                raise table.error("actors", f"actors not already in process {placed[actor]!r}", actor)
            placed[actor] = name
        endpoint = table.get_str("endpoint", "") or None
        if endpoint is not None and not endpoint.startswith(("ipc://", "tcp://")):
            raise table.error("endpoint", "an ipc:// or tcp:// address", endpoint)
        table.finish()
        specs.append(ProcessSpec(name, tuple(hosted), endpoint))
    missing = [a for a in actors if a not in placed]
    if missing:
        raise ScenarioError(f"{top.source}: key 'process': actor {missing[0]!r} is in no process")
    return tuple(specs)
