"""The cluster as an application of the real-time runtime: the same actors as in virtual time, placed in OS
processes, paced by the data-plane service's core in wall-clock time (``dualpath-emu run --mode realtime``).

A real-time cluster run is a run scenario (:mod:`dualpath_emu.runtime.scenario`) with ``app = "cluster"``,
written by :func:`run_live` into the run's directory with the cluster's description beside it: its
``[cluster]`` table says ``description = "cluster.json"`` -- the :class:`~dualpath_emu.cluster.config.ClusterConfig`,
the system (its flags and where its policy class lives), the seed -- and ``trajectories.jsonl`` holds the
workload (:func:`~dualpath_emu.workload.trajectory.write_trajectories`). So the processes need nothing but the run
directory (on several hosts, a copy of it) and, for a user's policy, its module or file at the same place.
Every process reads the same description and so builds the same configuration; only the client's process
reads the trajectories. **Placements** (:data:`PLACEMENTS`): ``groups`` (the default: the
scheduler, the client, each prefill group and each decode group in its own process), ``roles`` (the client
and the scheduler together, every prefill group in one process, every decode group in another) and
``single`` (every actor in one process, on its own core: no data-plane service). In a run split over
processes the actors share nothing: each process keeps its own metrics, ledger and event log, written when
it stops (:meth:`ClusterApplication.write_part`); the data-plane service writes the core's report
(:meth:`ClusterApplication.service_report`); :func:`collect` merges and checks them all.

**A process that dies** (``restart_crashed``, ``dualpath-emu run --restart-crashed``): an engine group's process
(:func:`restartable`) is started again in its place by the launcher, and its engine groups start as
``restarted`` (they tell the scheduler, which dispatches again what it had sent the dead one). :func:`collect`
reads every incarnation's files: what each dead one observed (its event log, written as it went, cut where it
died) counts; its metrics and ledger died with it, so the bytes check counts, for it, what the data-plane
service tallied it asked for (``replaced`` in the service's report). An end the dead one observed but never
told anyone of (it died between the two) is void when the scheduler dispatched the request again afterwards.
``restarts`` in the result says which processes were restarted and when.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import fnmatch
import importlib
import inspect
import json
import os
import secrets
import shutil
import time
import shlex
import sys
import tomllib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from dualpath_emu._core import Core
from dualpath_emu.cluster.assemble import build_engine, engine_names, prefill_groups
from dualpath_emu.cluster.client import Client
from dualpath_emu.cluster.catalog import GpuSpec, ModelArch, ModelSpec, NodeSpec
from dualpath_emu.cluster.config import BLOCK_TOKENS, ClusterConfig, derived
from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.core_report import CoreReport
from dualpath_emu.cluster.faults import fault_summary, fault_windows, plan_from_wire
from dualpath_emu.cluster.invariants import EventLogChecker, InvariantError, check_core_bytes
from dualpath_emu.host.paths import PathStats
from dualpath_emu.cluster.live_metrics import LiveMetrics
from dualpath_emu.cluster.messages import Start, cluster_registry
from dualpath_emu.cluster.observations import Ended, Redispatched, parse as parse_observation
from dualpath_emu.cluster.metrics import Metrics
from dualpath_emu.cluster.run import (
    SAMPLE_INTERVAL_S,
    LostRequestsError,
    Progress,
    SystemResult,
    build_result,
    run_system,
)
from dualpath_emu.cluster.roofline import RooflineParams
from dualpath_emu.cluster.systems import System
from dualpath_emu.cluster.topology import StorageSpec, Topology, build_topology
from dualpath_emu.cluster.user_systems import SystemLoader
from dualpath_emu.config import ScenarioError, Table
from dualpath_emu.messages import MessageRegistry
from dualpath_emu.runtime.actors import Actor, ActorSystem
from dualpath_emu.runtime.app import SERVICE_REPORT, Application, Backend, PlaneRequest, Registry
from dualpath_emu.runtime.core_work import CoreWork
from dualpath_emu.runtime.engine_actor import EngineActor
from dualpath_emu.runtime.launcher import OWNER_FILE, RESTARTS_SUFFIX
from dualpath_emu.runtime.node import MODEL
from dualpath_emu.runtime.eventlog import EventLogWriter, read_events
from dualpath_emu.runtime.lag import LagStats
from dualpath_emu.runtime.scenario import (
    DATAPLANE_PROCESS,
    RunDescription,
    RunScenario,
    incarnation_stem,
    load_run_scenario,
)
from dualpath_emu.runtime.security import RunKeys
from dualpath_emu.workload.trajectory import Trajectory, read_trajectories, write_trajectories
from dualpath_emu.workload.waits import ToolWait

if TYPE_CHECKING:  # the host backend imports the cluster
    from dualpath_emu.host.plane import HostDataPlane

__all__ = [
    "HOST",
    "PLACEMENTS",
    "SERVICE_REPORT",
    "ClusterApplication",
    "collect",
    "placement",
    "read_part",
    "registry",
    "run_scenario_text",
    "write_run",
]

PLACEMENTS: Final = ("groups", "roles", "single")
METRICS_PORT_FILE: Final = "metrics.port"
"""Where a live run with metrics writes the port its Prometheus endpoint listens on."""
POLL_S: Final = 1.0
PROGRESS_FILE: Final = "progress.json"
"""Where a live run's client process says how far the run is (:meth:`ClusterApplication._report_progress`)."""
PROGRESS_S: Final = 0.5
"""How often (wall seconds) the live metrics ask the data plane for its ports and read queues."""


DESCRIPTION: Final = "cluster.json"
STORAGE_DIR: Final = "storage"
"""Host backend: the KV blocks' directory in the run directory (removed when the run ends)."""
DEFAULT_BYTE_SCALE: Final = 1e-3
TRAJECTORIES: Final = "trajectories.jsonl"


def config_to_wire(config: ClusterConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_from_wire(data: Mapping[str, Any]) -> ClusterConfig:
    """The inverse of :func:`config_to_wire` (every field, nested specs included)."""
    fields = dict(data)
    fields["node"] = NodeSpec(**fields["node"])
    fields["faults"] = plan_from_wire(fields["faults"])
    fields["gpu"] = GpuSpec(**fields["gpu"])
    model = dict(fields["model"])
    model["arch"] = None if model["arch"] is None else ModelArch(**model["arch"])
    fields["model"] = ModelSpec(**model)
    fields["storage"] = StorageSpec(**fields["storage"])
    fields["prefill_roofline"] = RooflineParams(**fields["prefill_roofline"])
    fields["decode_roofline"] = RooflineParams(**fields["decode_roofline"])
    wait = dict(fields["tool_wait"])
    fields["tool_wait"] = ToolWait(**{**wait, "samples": tuple(wait["samples"])})
    return ClusterConfig(**fields)


def system_to_wire(system: System) -> dict[str, Any]:
    """A system as data; a user's policy class by its module (or file) and name, which every process of the
    run must be able to load."""
    scheduler = system.scheduler
    policy: dict[str, str] | str
    if isinstance(scheduler, str):
        policy = scheduler
    else:
        if "<locals>" in scheduler.__qualname__:
            raise ValueError(
                f"system {system.name!r}: its policy {scheduler.__qualname__} is defined inside a function; a "
                "real-time run loads it again in every process, so define it at the top level of a module or file"
            )
        policy = {"module": scheduler.__module__, "file": inspect.getsourcefile(scheduler) or "",
                  "name": scheduler.__qualname__}  # fmt: skip
    return {"name": system.name, "description": system.description, "layerwise": system.layerwise,
            "dual_path": system.dual_path, "oracle": system.oracle, "scheduler": policy}  # fmt: skip


def system_from_wire(data: Mapping[str, Any]) -> System:
    policy = data["scheduler"]
    scheduler: Any = policy
    if not isinstance(policy, str):
        module_name, name = policy["module"], policy["name"]
        try:
            scheduler = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):  # a module loaded from a file: load the file again
            loader = SystemLoader(Path("/"), "the run's description")
            scheduler = loader.load(f"{policy['file']}:{name}").scheduler
    return System(data["name"], data["description"], layerwise=data["layerwise"], dual_path=data["dual_path"],
                  scheduler=scheduler, oracle=data["oracle"])  # fmt: skip


class ClusterApplication(Application):
    """The cluster's actors for the real-time runtime (see the module). ``config`` is the ``[cluster]``
    table of the run scenario."""

    name = "cluster"

    def __init__(self, config: Table) -> None:
        description = config.get_str("description", DESCRIPTION)
        self.metrics_port = config.get_int("metrics_port", -1, min=-1, max=65_535)
        self.byte_scale = config.get_float("byte_scale", DEFAULT_BYTE_SCALE, min=0.0, max=1.0, min_exclusive=True)
        """Host backend: real bytes per modelled byte."""
        self.storage_dir = config.get_str("storage_dir", "")
        self.transfer_engine = config.get_str("transfer_engine", "zmq", choices=("zmq", "mooncake"))
        """Host backend: where the KV blocks live (a shared mount across hosts); default the run's ``storage``."""
        config.finish()
        folder = Path(config.source).parent
        path = folder / description
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            self.config = config_from_wire(data["config"])
            self.system = system_from_wire(data["system"])
            self.seed = int(data["seed"])
            self.agents = int(data["agents"])
            self.turns_planned = int(data["turns"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ScenarioError(f"{config.source}: key {config.key_path('description')!r}: cannot read {path}: "
                                f"{type(error).__name__}: {error}") from None  # fmt: skip
        self.trajectories_path = folder / TRAJECTORIES
        self.derived = derived(self.config)
        self.sample_interval_ns = round(SAMPLE_INTERVAL_S * 1e9)
        # Port ids and rates only: a scratch core numbers the ports as the data plane's does.
        self._scratch = Core()
        self.topology = self._build(self._scratch)
        self._cluster: Cluster | None = None
        self._client: Client | None = None
        self._finished: asyncio.Event | None = None
        self._plane: CoreWork | None = None
        """This process's data plane: its engines'."""
        self._host: HostDataPlane | None = None
        """This process's host data plane (host backend only)."""

    def _build(self, core: Core) -> Topology:
        c = self.config
        return build_topology(core, c.node, c.pe_nodes, c.de_nodes, c.storage)

    # --- the Application interface -------------------------------------------------------------------

    def registry(self) -> MessageRegistry:
        return cluster_registry()

    def prefill_groups(self) -> list[list[int]]:
        return prefill_groups(self.config)

    def actor_names(self) -> list[str]:
        return engine_names(self.config)

    @staticmethod
    def actor_names_of(c: ClusterConfig) -> list[str]:
        """The cluster's actors: one per engine (:func:`~dualpath_emu.cluster.assemble.engine_names`)."""
        return engine_names(c)

    @property
    def driver_actor(self) -> str:
        return "client"

    def core_options(self) -> dict[str, Any]:
        return {"sample_interval_ns": self.sample_interval_ns}

    def build_core(self, core: Core) -> None:
        self._build(core)

    def _context(self) -> Cluster:
        if self._cluster is None:
            metrics = Metrics(sample_interval_ns=self.sample_interval_ns)
            policy = self.system.policy(self.derived.alpha_tokens, self.derived.beta_tokens)
            self._cluster = Cluster(self.config, self.system, self.derived, self.topology, metrics, policy)
        return self._cluster

    def create_actor(self, system: ActorSystem, name: str) -> Actor:
        """The actor around engine ``name`` (:mod:`~dualpath_emu.cluster.assemble`), whose data plane is the
        system's (the process's)."""
        cluster = self._context()
        self._plane = system.data_plane
        actor = EngineActor(system, name, lambda out, plane: build_engine(
            name, cluster, out, plane, trajectories=lambda: read_trajectories(self.trajectories_path).trajectories,
            seed=self.seed))  # fmt: skip
        if isinstance(actor.engine, Client):
            self._client = actor.engine
            self._finished = finished = asyncio.Event()
            actor.engine.on_finished = finished.set
        return actor

    async def drive(self, system: ActorSystem) -> dict[str, Any]:
        client, finished, plane = self._client, self._finished, self._plane
        assert client is not None and finished is not None and plane is not None, (
            "the driver runs in the client's process"
        )
        poller: asyncio.Task[None] | None = None
        live: LiveMetrics | None = None
        if self.metrics_port >= 0:
            live = LiveMetrics()
            port = live.serve(self.metrics_port)
            folder = Path(self.trajectories_path).parent
            _write_private(folder / METRICS_PORT_FILE, f"{port}\n".encode())
            print(f"live metrics: http://127.0.0.1:{port}/metrics", flush=True)
            client.observer = live
            poller = asyncio.get_running_loop().create_task(self._poll(plane, live), name="live-metrics")
        start_ns = system.now_ns()
        reporter = asyncio.get_running_loop().create_task(self._report_progress(system, start_ns), name="progress")
        try:
            system.tell("client", Start())
            await finished.wait()
        finally:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
            if poller is not None:
                poller.cancel()
                await asyncio.gather(poller, return_exceptions=True)
            if live is not None:
                live.close()
        plane.flush()  # the last instant's work (block write-backs) goes to the data plane
        await asyncio.sleep(0)
        return {"turns": len(self._context().metrics), "start_ns": start_ns, "end_ns": system.now_ns()}

    async def _report_progress(self, system: ActorSystem, start_ns: int) -> None:
        """Write how far the run is to ``progress.json`` in the run directory every :data:`PROGRESS_S` of wall
        time (turns done, of all, and emulated seconds), for the launching command's progress line."""
        folder = Path(self.trajectories_path).parent
        metrics = self._context().metrics
        total = sum(len(t) for t in read_trajectories(self.trajectories_path).trajectories)
        every_s = PROGRESS_S * getattr(asyncio.get_running_loop(), "time_scale", 1.0)  # in loop seconds
        while True:
            report = {"turns_done": metrics.turns_done, "turns_total": total,
                      "emulated_s": (system.now_ns() - start_ns) / 1e9}  # fmt: skip
            _write_private(folder / f"{PROGRESS_FILE}.tmp", json.dumps(report).encode())
            os.replace(folder / f"{PROGRESS_FILE}.tmp", folder / PROGRESS_FILE)  # whole, never half written
            await asyncio.sleep(every_s)

    async def _poll(self, plane: CoreWork, live: LiveMetrics) -> None:
        """Feed the live metrics the data plane's ports and read queues, every :data:`POLL_S` of wall time."""
        scratch = self._scratch
        rates = {scratch.port_name(p): scratch.port_rate(p) for p in range(scratch.port_count)}
        every_s = POLL_S * getattr(asyncio.get_running_loop(), "time_scale", 1.0)  # in loop seconds
        while True:
            report = await plane.stats()
            ports = [(name, rates.get(name, 0.0), float(sum(c["fluid_bytes"]))) for name, c in report["ports"].items()]
            live.data_plane(
                report["clock_ns"], ports, [(name, q["read_bytes"]) for name, q in report["storage"].items()]
            )
            await asyncio.sleep(every_s)

    # --- the parts of a run split over processes ----------------------------------------------------

    def write_part(self, path: Path) -> None:
        """This process's share of the run: its metrics and what its ledger booked (msgpack, user-only)."""
        cluster = self._cluster
        booked: list[tuple[int, int, int, int]] = []
        metrics: dict[str, Any] | None = None
        if cluster is not None:
            transfers = cluster.booking.transfers
            booked = [
                (port, lane, size, transfers[(port, lane)]) for (port, lane), size in cluster.booking.bytes.items()
            ]
            metrics = cluster.metrics.to_wire()
        part: dict[str, Any] = {"metrics": metrics, "booked": booked}
        if self._host is not None:
            part["host"] = self._host_part()
        _write_private(path, msgpack.packb(part))

    def _host_part(self) -> dict[str, Any]:
        """A host process's share: its local core's report, the real work's bytes per (port, lane), what its
        files and channel moved."""
        host = self._host
        assert host is not None
        host.core.poll()
        return {
            "core": CoreReport.of(host.core, self.topology, host.core.now_ns).to_wire(),
            "moved": [[port, lane, size] for (port, lane), size in host.moved.items()],
            "store": host.store.stats() if host.store is not None else None,
            "channel": host.channel.stats.to_wire(),
            "measured": {what: stats.to_wire() for what, stats in host.measured.items()},
            "failure": repr(host.failure) if host.failure is not None else None,
            "transfer_engine_listening": host.channel.listening,
        }

    def host_plane(
        self, core: Core, process: str, scenario: RunScenario, description: RunDescription, keys: RunKeys | None,
        run_dir: Path,
    ) -> HostDataPlane:  # fmt: skip
        """The host backend's data plane for ``process`` (:mod:`dualpath_emu.host`) on ``core`` (the process's own
        wall-clock core, built by :meth:`build_core`): it drives the storage and NIC I/O of the nodes whose engine
        groups it hosts (:data:`HOST`)."""
        from dualpath_emu.host.plane import HostDataPlane
        from dualpath_emu.host.storage import BlockStore
        from dualpath_emu.host.transport import ByteChannel

        plan = self.host_plan(scenario)
        folder = Path(self.storage_dir) if self.storage_dir else Path(run_dir) / STORAGE_DIR
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        drives = process in plan.process_of_node
        store = BlockStore(folder, max(1, round(plan.block_bytes * plan.byte_scale))) if drives else None
        peers = dict(description.data_endpoints)  # itself too: its nodes may send to each other (one process)
        # Mooncake's engine has no authentication: only processes whose nodes move KV start one (not the
        # scheduler's or the client's, whose channel carries the end-of-run stop alone).
        engine = self.transfer_engine if drives else "zmq"
        channel = ByteChannel(process, description.data_endpoints[process], peers, keys, engine=engine)
        self._host = HostDataPlane(core, plan, process, channel, store)
        return self._host

    def host_plan(self, scenario: Any) -> Any:
        """Which process drives which node's I/O (the one hosting its engine group), every port's node and
        rate, the Full Block size: what :class:`~dualpath_emu.host.plane.HostDataPlane` needs of the cluster."""
        from dualpath_emu.host.plane import HostPlan

        process_of = {actor: spec.name for spec in scenario.processes for actor in spec.actors}
        group_of: dict[int, str] = {}
        for group in self.prefill_groups():
            for node in group:
                group_of[node] = f"pe{group[0]}"
        for n in self.topology.de_nodes:
            group_of[n.index] = f"de{n.index}"
        scratch = self._scratch
        rates = {p: scratch.port_rate(p) for p in range(scratch.port_count)}
        owners = tuple(process_of[group_of[n.index]] for n in self.topology.nodes)
        return HostPlan(self.topology, owners, rates, BLOCK_TOKENS * self.derived.kv_bytes_per_token, self.byte_scale)

    def service_report(self, core: Core) -> dict[str, Any]:
        """The core's report (:class:`CoreReport`), written by the data-plane service once it has drained."""
        core.poll()  # drained: nothing completes, but the core's time catches up with its wall clock
        return CoreReport.of(core, self.topology, core.now_ns).to_wire()


def _host_plane(request: PlaneRequest) -> HostDataPlane:
    """The host backend's plane of a process: its own wall-clock core, every process's core on one clock (the
    launcher's origin on the hosts' real-time clock), moving real bytes (:meth:`ClusterApplication.host_plane`)."""
    app, scenario, description = request.app, request.scenario, request.description
    if not isinstance(app, ClusterApplication):
        raise ScenarioError(f'application {app.name!r} has no host backend (backend = "host")')
    origin = description.clock_origin_ns if description.clock_origin_ns is not None else time.time_ns()
    elapsed = max(0, time.time_ns() - origin)
    core = Core(clock="wall", time_scale=scenario.time_scale, wall_elapsed_ns=elapsed, **app.core_options())
    app.build_core(core)
    return app.host_plane(core, request.process, scenario, description, request.keys, request.run_dir)


HOST: Final = Backend("host", _host_plane, shares_core=False)
"""The host backend (:mod:`dualpath_emu.host`): each process drives its own core and moves real bytes."""


def registry() -> Registry:
    """What a live run may name: the cluster application, the model backend (the runtime's) and the host backend."""
    return Registry({ClusterApplication.name: ClusterApplication}, {MODEL.name: MODEL, HOST.name: HOST})


def read_part(path: Path) -> tuple[Metrics | None, dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """A process's share written by :meth:`ClusterApplication.write_part`: metrics, bytes and transfers booked."""
    data = msgpack.unpackb(path.read_bytes(), strict_map_key=False)
    metrics = Metrics.from_wire(data["metrics"]) if data["metrics"] is not None else None
    booked = {(port, lane): size for port, lane, size, _ in data["booked"]}
    transfers = {(port, lane): count for port, lane, _, count in data["booked"]}
    return metrics, booked, transfers


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def placement(app_actors: Sequence[str], kind: str) -> list[tuple[str, list[str]]]:
    """The processes of placement ``kind`` (:data:`PLACEMENTS`): ``(process name, its actors)`` each."""
    pe = [a for a in app_actors if a.startswith("pe")]
    de = [a for a in app_actors if a.startswith("de")]
    faults = [a for a in app_actors if a == "faults"]  # the fault injector, beside the scheduler it tells
    if kind == "groups":
        return [("scheduler", ["scheduler", *faults]), ("client", ["client"]), *((a, [a]) for a in pe + de)]
    if kind == "roles":
        return [("front", ["client", "scheduler", *faults]), ("prefill", pe), ("decode", de)]
    if kind == "single":
        return [("main", list(app_actors))]
    raise ValueError(f"placement: expected one of {', '.join(PLACEMENTS)}, got {kind!r}")


def restartable(processes: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """The processes of a placement that ``--restart-crashed`` starts again if they die: those that host only
    engine groups (``pe0``, ``de2``; a placement's ``prefill`` and ``decode``). The client's, the scheduler's
    (with the fault injector) and the data plane hold the run's state: their death ends the run."""
    return [name for name, actors in processes
            if actors and all(a.startswith(("pe", "de")) and a[2:].isdigit() for a in actors)]  # fmt: skip


def _check_restart(backend: str, processes: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    from dualpath_emu.errors import UsageError

    if backend == "host":
        raise UsageError("--restart-crashed: the host backend's processes own real bytes (files, channels) that a "
                         "restarted process could not take over; use the model backend")  # fmt: skip
    names = restartable(processes)
    if not names:
        raise UsageError("--restart-crashed: this placement has no process of engine groups alone to start again "
                         "(placement single: one process, the run's own); use groups or roles")  # fmt: skip
    return names


def run_scenario_text(
    *,
    seed: int,
    time_scale: float,
    transport: str,
    host: str,
    timeout_s: float,
    processes: Sequence[tuple[str, Sequence[str]]],
    metrics_port: int = -1,
    endpoints: Mapping[str, str] | None = None,
    dataplane_endpoint: str | None = None,
    backend: str = "model",
    byte_scale: float = DEFAULT_BYTE_SCALE,
    storage_dir: str = "",
    transfer_engine: str = "zmq",
    data_endpoints: Mapping[str, str] | None = None,
    restart_crashed: Sequence[str] = (),
) -> str:
    """The run scenario of one real-time cluster run (TOML text); the cluster is in :data:`DESCRIPTION`.
    ``endpoints`` (process name -> endpoint) and ``dataplane_endpoint`` fix where processes bind (a run
    started by hand on several hosts); by default the launcher picks them."""

    def q(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [
        'app = "cluster"', f"seed = {seed}", 'mode = "realtime"', "latency_s = 0.0", f"time_scale = {time_scale!r}",
        f"transport = {q(transport)}", f"host = {q(host)}", f"timeout_s = {timeout_s!r}", f"backend = {q(backend)}",
        *([f"dataplane_endpoint = {q(dataplane_endpoint)}"] if dataplane_endpoint else []),
        *(["restart_crashed = [" + ", ".join(q(n) for n in restart_crashed) + "]"] if restart_crashed else []), "",
        "[cluster]", f"description = {q(DESCRIPTION)}", f"metrics_port = {metrics_port}",
        *([f"byte_scale = {byte_scale!r}", f"storage_dir = {q(storage_dir)}", f"transfer_engine = {q(transfer_engine)}"]
          if backend == "host" else []), "",
    ]  # fmt: skip
    for name, actors in processes:
        lines += ["[[process]]", f"name = {q(name)}", "actors = [" + ", ".join(q(a) for a in actors) + "]"]
        if endpoints and name in endpoints:
            lines.append(f"endpoint = {q(endpoints[name])}")
        if data_endpoints and name in data_endpoints:
            lines.append(f"data_endpoint = {q(data_endpoints[name])}")
        lines.append("")
    text = "\n".join(lines)
    tomllib.loads(text)  # what we write must read back
    return text


def collect(run: RunScenario, run_dir: Path, wall_s: float) -> tuple[SystemResult, Metrics]:
    """Merge and check the parts of a finished real-time run ``run`` in ``run_dir``: the processes' metrics and
    ledgers, their event logs (merged in time order: every admitted request ended exactly once across
    processes, no pool over capacity) and the core's report (every byte booked by some process's ledger is
    what the data plane moved, per port and lane). Raises :class:`LostRequestsError` or
    :class:`InvariantError`; returns the run's :class:`SystemResult` and merged metrics."""
    app = run.app
    assert isinstance(app, ClusterApplication)
    processes = [p.name for p in run.processes]
    last = {name: last_incarnation(run_dir, name) for name in processes}
    parts, booked, transfers = [], Counter[tuple[int, int]](), Counter[tuple[int, int]]()
    for name in processes:
        metrics, by_port, counts = read_part(run_dir / f"{incarnation_stem(name, last[name])}.part")
        if metrics is not None:
            parts.append(metrics)
        booked.update(by_port)
        transfers.update(counts)
    if any(last.values()):  # what each dead incarnation asked the core to move, as the data plane tallied it
        service = json.loads((run_dir / f"{DATAPLANE_PROCESS}.json").read_text())
        for replaced in service["report"].get("replaced", []):
            for port, lane, size, count in replaced["booked"]:
                booked[(port, lane)] += size
                transfers[(port, lane)] += count
    merged = Metrics.merge(parts)
    host: dict[str, Any] | None = None
    if run.backend_name == "host":
        report, host = _host_report(run_dir, processes, app)
    else:
        report = CoreReport.from_wire(json.loads((run_dir / SERVICE_REPORT).read_text()))
    system = app.system.name
    lost = merged.unfinished()
    if lost:
        raise LostRequestsError(f"{system}: {len(lost)} admitted request(s) never ended, e.g. {lost[:5]}")
    checker, writer = EventLogChecker(), EventLogWriter()
    logs = [(run_dir / f"{incarnation_stem(name, i)}.events", i < last[name]) for name in processes
            for i in range(last[name] + 1)]  # fmt: skip
    logs = [(log, dead) for log, dead in logs if not dead or log.exists()]  # (one that died at once wrote none)
    events, voided = _merged_events([log for log, _ in logs], {i for i, (_, dead) in enumerate(logs) if dead})
    checker.feed(events, 0)
    writer.write_numbered(events, 0)
    violations = checker.finish() + check_core_bytes(report, booked, transfers)
    if host is not None:
        violations += host.pop("violations")
    if violations:
        raise InvariantError(f"{system}: " + "; ".join(violations))
    end_ns = max(max(merged.done_ns, default=0), max(merged.failed_ns, default=0))  # a failed request ends too
    driver = json.loads((run_dir / f"{run.driver_process.name}.json").read_text())  # (never restarted)
    start_ns = int((driver.get("summary") or {}).get("start_ns", min(merged.arrive_ns, default=0)))
    result = build_result(system, report, merged, app.config, app.topology, app.agents, writer.sha256(), wall_s,
                          len(events), end_ns, start_ns, turns_planned=app.turns_planned)  # fmt: skip
    result.extra["emulated_start_s"] = start_ns / 1e9
    result.spec = app.system
    result.extra.update(_timeliness(run_dir, processes, last))
    if any(last.values()):
        result.extra["restarts"] = _restarts(run_dir, processes, last, start_ns)
        result.extra["ends_lost_with_restart"] = voided
    if app.config.faults.any:
        windows = fault_windows(
            [(t - start_ns, parse_observation(kind, summary)) for t, _, _, kind, summary in events if kind == "fault"]
        )
        done = [t - start_ns if t >= 0 else t for t in merged.done_ns]
        result.extra.update(fault_summary(windows, done, end_ns - start_ns,  # (past 1,000 windows: added up)
                                          [t - start_ns for t in merged.redispatch_ns],
                                          [t - start_ns if t >= 0 else t for t in merged.failed_ns],
                                          [t - start_ns for t in merged.read_moved_ns]))  # fmt: skip
    if host is not None:
        result.extra["host"] = host
    return result, merged


def _host_report(run_dir: Path, processes: Sequence[str], app: ClusterApplication) -> tuple[CoreReport, dict[str, Any]]:
    """A host-backend run's report: every process's local core (the modelled work: H2D, D2H, timers) plus
    the real work it did, per port and lane; and what the real bytes were (read back verified, sent and
    received verified, per kind), with the violations found (a mismatch, a failed write-back)."""
    reports, moved = [], Counter[tuple[int, int]]()
    store: Counter[str] = Counter()
    channel: Counter[str] = Counter()
    violations: list[str] = []
    direct: set[str] = set()
    strides: set[int] = set()
    measured: dict[str, PathStats] = {}
    listening: dict[str, list[str]] = {}
    for name in processes:
        part = msgpack.unpackb((run_dir / f"{name}.part").read_bytes(), strict_map_key=False).get("host")
        if part is None:
            violations.append(f"process {name!r} wrote no host part")
            continue
        if part.get("transfer_engine_listening"):
            listening[name] = list(part["transfer_engine_listening"])
        reports.append(CoreReport.from_wire(part["core"]))
        moved.update({(port, lane): size for port, lane, size in part["moved"]})
        channel.update(part["channel"])
        for what, stats in part["measured"].items():
            measured.setdefault(what, PathStats()).merge(PathStats.from_wire(stats))
        if part["store"] is not None:
            stats = part["store"]
            direct.add("O_DIRECT" if stats["direct_io"] else f"buffered ({stats['direct_io_reason']})")
            strides.add(int(stats["stride"]))
            store.update({k: v for k, v in stats.items() if isinstance(v, int) and not isinstance(v, bool)})
        if part["failure"]:
            violations.append(f"process {name!r}: real work failed: {part['failure']}")
    if store["mismatched_blocks"]:
        violations.append(f"{store['mismatched_blocks']} block(s) read back differed from what was written")
    if channel["mismatched_bytes"]:
        violations.append(f"{channel['mismatched_bytes']} byte(s) arrived differing from what was sent")
    first = reports[0]
    ports = []
    for i, port in enumerate(first.ports):
        lanes = len(port.completed_bytes)
        done = [
            sum(r.ports[i].completed_bytes[lane] for r in reports) + moved.get((i, lane), 0) for lane in range(lanes)
        ]
        flowed = [sum(r.ports[i].fluid_bytes[lane] for r in reports) + moved.get((i, lane), 0) for lane in range(lanes)]
        ports.append(dataclasses.replace(port, completed_bytes=done, fluid_bytes=flowed))
    stats = {key: sum(r.stats.get(key, 0) for r in reports) for key in first.stats}  # (Counter's sum drops zeros)
    report = dataclasses.replace(first, ports=ports, stats=stats, now_ns=max(r.now_ns for r in reports),
                                 until_ns=max(r.until_ns for r in reports))  # fmt: skip
    summary = {
        "byte_scale": app.byte_scale,
        "transfer_engine": app.transfer_engine,
        # Mooncake's engine lets any peer that reaches it read and write the registered memory: say so, and where.
        "transfer_engine_unauthenticated": app.transfer_engine == "mooncake",
        "transfer_engine_listening": listening,
        "storage_io": sorted(direct),
        "block_stride": max(strides, default=0),
        "gpu_copies": "modelled (no GPU): H2D and D2H run on each process's core",
        "blocks_written": store["blocks_written"], "blocks_read": store["blocks_read"],
        "bytes_written": store["bytes_written"], "bytes_read": store["bytes_read"],
        "verified_read_bytes": store["verified_bytes"], "mismatched_blocks": store["mismatched_blocks"],
        "read_retries": store["retries"], "seeded_blocks": store["seeded_blocks"],
        "network_bytes_sent": channel["sent_bytes"], "network_bytes_verified": channel["verified_bytes"],
        "network_bytes_mismatched": channel["mismatched_bytes"], "rejected_frames": channel["rejected"],
        "real_bytes_by_kind": _real_bytes_by_kind(measured),
        "paths": {what: stats.summary() for what, stats in sorted(measured.items())},
        "violations": violations,
    }  # fmt: skip
    return report, summary


def _real_bytes_by_kind(measured: Mapping[str, PathStats]) -> dict[str, int]:
    """Real bytes by what moved them: the network (every transfer kind), storage reads, write-backs."""
    out = Counter[str]()
    for kind, stats in measured.items():
        what = "read" if kind.startswith("storage read") else "write" if kind == "write-back" else "network"
        if stats.real_bytes:
            out[what] += stats.real_bytes
    return dict(out)


def last_incarnation(run_dir: Path, name: str) -> int:
    """The last incarnation of process ``name`` whose files are in ``run_dir``: 0, or N when it was started
    again N times in place of one that died (its files ``<name>.N.*``; every one that started left an event
    log, its output or its results)."""
    last = 0
    for n in range(1, 1 << 16):
        stem = incarnation_stem(name, n)
        if not any((run_dir / f"{stem}{suffix}").exists() for suffix in (".events", ".json", ".out")):
            break
        last = n
    return last


def _restarts(run_dir: Path, processes: Sequence[str], last: Mapping[str, int], start_ns: int) -> list[dict[str, Any]]:
    """Which processes were started again in place of one that died, and when: the launcher's record (how the
    dead one ended, wall seconds from the launch) with the emulated time, from the run's start, of the dead
    one's last event and of the new one's first."""
    out = []
    for name in processes:
        if not last[name]:
            continue
        records = {}
        path = run_dir / f"{name}{RESTARTS_SUFFIX}"
        if path.exists():  # (a run started by hand whose launcher's record was not gathered has none)
            records = {r["incarnation"]: r for r in json.loads(path.read_text())}
        for n in range(1, last[name] + 1):
            dead = list(_events_of(run_dir / f"{incarnation_stem(name, n - 1)}.events"))
            new = _events_of(run_dir / f"{incarnation_stem(name, n)}.events")
            first = next(iter(new), None)
            out.append({"process": name, "incarnation": n, **{k: v for k, v in records.get(n, {}).items()
                                                                if k not in ("process", "incarnation")},
                        "dead_last_event_s": (dead[-1].t_ns - start_ns) / 1e9 if dead else None,
                        "restarted_s": (first.t_ns - start_ns) / 1e9 if first is not None else None})  # fmt: skip
    return out


def _events_of(path: Path) -> list[Any]:
    return list(read_events(path)) if path.exists() else []


def _timeliness(run_dir: Path, processes: Sequence[str], last: Mapping[str, int] | None = None) -> dict[str, Any]:
    """How close to its model the run kept: the delivery lag of every completion (all processes merged),
    the data plane's submission lag, the clock handshakes' round trips and offset bounds, and each process's
    CPU time (the one near its wall time is the run's bottleneck)."""

    def seconds(stats: LagStats) -> dict[str, float]:
        return {"p50": stats.quantile(0.5) / 1e9, "p99": stats.quantile(0.99) / 1e9, "max": stats.max / 1e9,
                "count": stats.count}  # fmt: skip

    delivery = LagStats()
    rtt, uncertainty, drift = [], [], []
    cpu_s: dict[str, float] = {}
    for name in processes:
        data = json.loads((run_dir / f"{incarnation_stem(name, (last or {}).get(name, 0))}.json").read_text())
        delivery.merge(LagStats.from_wire(data["delivery_lag"]))
        if "cpu_s" in data:  # (a run directory written before processes reported it has none)
            cpu_s[name] = data["cpu_s"]
        remote = data.get("dataplane")
        if remote:
            rtt.append(remote["rtt_ns"])
            uncertainty.append(remote["offset_uncertainty_ns"])
            drift.append(abs(remote["clock_check"]["max_abs_error_ns"]))
    out: dict[str, Any] = {"delivery_lag_s": seconds(delivery), "process_cpu_s": cpu_s}
    service = run_dir / f"{DATAPLANE_PROCESS}.json"
    if service.exists():
        data = json.loads(service.read_text())
        if "cpu_s" in data:
            cpu_s[DATAPLANE_PROCESS] = data["cpu_s"]
        out["submission_lag_s"] = seconds(LagStats.from_wire(data["report"]["submission_lag"]))
    if rtt:
        out["clock_sync"] = {"rtt_s_max": max(rtt) / 1e9, "offset_uncertainty_s_max": max(uncertainty) / 1e9,
                             "clock_check_s_max": max(drift) / 1e9}  # fmt: skip
    return out


_ENDED_KIND: Final = Ended(0).kind
_REDISPATCH_KIND: Final = Redispatched(0, 0, "").kind


def _merged_events(
    logs: Sequence[Path], dead: frozenset[int] | set[int] = frozenset()
) -> tuple[list[tuple[int, int, str, str, str]], int]:
    """Every process's events in one stream: by time, then by process (in placement order), then by its
    own order; and how many ends were void. ``dead``: the indices of the logs of processes that died (their
    last line may be cut: skipped). An end such a process observed is void when its request was dispatched
    again after it: the process died before it told anyone (the scheduler took the request for lost)."""
    keyed: list[tuple[int, int, int, str, str, str]] = []
    for index, log in enumerate(logs):
        for t, seq, actor, kind, summary in read_events(log):
            keyed.append((t, index, seq, actor, kind, summary))
    keyed.sort(key=lambda e: (e[0], e[1], e[2]))
    voided = 0
    if dead:
        again: set[int] = set()  # requests dispatched again later than the line at hand
        void: set[int] = set()
        for position in range(len(keyed) - 1, -1, -1):
            _, index, _, _, kind, summary = keyed[position]
            if kind == _REDISPATCH_KIND:
                record = parse_observation(kind, summary)
                assert isinstance(record, Redispatched)
                again.add(record.rid)
            elif kind == _ENDED_KIND and index in dead:
                ended = parse_observation(kind, summary)
                assert isinstance(ended, Ended)
                if ended.rid in again:
                    void.add(position)
        keyed = [e for position, e in enumerate(keyed) if position not in void]
        voided = len(void)
    return [(t, i, actor, kind, summary) for i, (t, _, _, actor, kind, summary) in enumerate(keyed)], voided


def run_live(
    config: ClusterConfig,
    system: System,
    trajectories: Sequence[Trajectory],
    *,
    run_dir: Path,
    seed: int = 0,
    time_scale: float = 1.0,
    placement_kind: str = "groups",
    transport: str = "ipc",
    host: str = "127.0.0.1",
    timeout_s: float = 86_400.0,
    metrics_port: int = -1,
    on_start: Callable[[str, int], None] | None = None,
    backend: str = "model",
    byte_scale: float = DEFAULT_BYTE_SCALE,
    storage_dir: str = "",
    transfer_engine: str = "zmq",
    progress: Callable[[Progress], None] | None = None,
    restart_crashed: bool = False,
) -> SystemResult:
    """Run ``system`` on ``config`` with ``trajectories`` live: write the run's description into ``run_dir``
    (user-only), start its processes, wait for them, then merge and check their parts (:func:`collect`).
    ``metrics_port`` ≥ 0 serves live Prometheus metrics from the client's process on 127.0.0.1 (0: a free
    port, written to ``run_dir/metrics.port``; :mod:`~dualpath_emu.cluster.live_metrics`); ``on_start(name,
    pid)`` is called as each process starts. ``backend="host"`` moves real bytes (:mod:`dualpath_emu.host`):
    ``byte_scale`` real bytes per modelled byte, KV blocks in ``storage_dir`` (default: the run directory's
    ``storage``, removed at the end). ``progress`` is called a few times a second with how far the run is (what
    the client's process last wrote to ``progress.json``). ``restart_crashed``: an engine group's process that
    dies is started again in its place (:func:`restartable`; see the module). Raises
    :class:`~dualpath_emu.runtime.launcher.LaunchError` if a process fails or stops answering."""
    from dualpath_emu.runtime.launcher import LaunchError, launch, mark_owner, sweep_orphans

    processes = placement(ClusterApplication.actor_names_of(config), placement_kind)
    restart = _check_restart(backend, processes) if restart_crashed else []

    given = storage_dir
    storage_dir = run_storage(storage_dir)
    _write_description(run_dir, config, system, trajectories, seed)
    if backend == "host":
        # The KV blocks of runs whose launcher was killed (SIGKILL skips the clean-up below): removed here,
        # where this run's would be; then this run's folder, marked as this launcher's.
        if given:
            sweep_orphans("run-*", Path(given))
        else:
            sweep_orphans(STORAGE_DIR, run_dir)
            sweep_orphans(f"{LIVE_TEMP_PREFIX}*/{STORAGE_DIR}")
        blocks = Path(storage_dir) if storage_dir else run_dir / STORAGE_DIR
        blocks.mkdir(mode=0o700, parents=True, exist_ok=True)
        mark_owner(blocks)
    text = run_scenario_text(
        seed=seed, time_scale=time_scale, transport=transport, host=host, timeout_s=timeout_s,
        processes=processes, metrics_port=metrics_port, backend=backend, byte_scale=byte_scale,
        storage_dir=storage_dir, transfer_engine=transfer_engine, restart_crashed=restart,
    )  # fmt: skip
    path = run_dir / RUN_SCENARIO
    _write_private(path, text.encode())
    run = load_run_scenario(path, registry())
    app = run.app
    assert isinstance(app, ClusterApplication)
    started = time.perf_counter()
    (run_dir / PROGRESS_FILE).unlink(missing_ok=True)  # an earlier run's, in a run directory used again

    def tick() -> None:
        if progress is None:
            return
        try:
            report = json.loads((run_dir / PROGRESS_FILE).read_text())
        except (OSError, ValueError):  # not written yet
            return
        progress(Progress(system.name, int(report["turns_done"]), int(report["turns_total"]),
                          float(report["emulated_s"]), time.perf_counter() - started))  # fmt: skip

    try:
        launched = launch(run, run_dir=run_dir, on_start=on_start, on_tick=tick if progress is not None else None)
        result, _ = collect(run, run_dir, launched.wall_s)
    except LaunchError as error:
        # Measured now: the clean-up below removes the blocks that filled the disk, and then it looks fine.
        blocks_dir = (Path(given) if given else run_dir / STORAGE_DIR) if backend == "host" else None
        error.full_disk = full_disk(run_dir, blocks_dir, str(error))
        raise
    finally:
        if backend == "host":
            _remove_blocks(Path(storage_dir) if storage_dir else run_dir / STORAGE_DIR)
    if backend == "host":  # what the model says of the same run, kind by kind (measured vs modelled)
        model = run_system(config, system, trajectories, seed=seed, probe_paths=True)
        compare_with_model(result, model)
    result.extra.update({
        "mode": "realtime",
        "time_scale": time_scale,
        "placement": placement_kind,
        "transport": transport,
        "backend": backend,
        "processes": len(run.processes) + (launched.dataplane is not None),
        "process_actors": {**({DATAPLANE_PROCESS: []} if launched.dataplane is not None else {}),
                           **{p.name: list(p.actors) for p in run.processes}},
    })  # fmt: skip
    result.wall_s = launched.wall_s
    return result


RUN_SCENARIO: Final = "run.toml"


MODELLED_ON_HOST: Final = ("H2D", "D2H")
"""The kinds of transfer a host run models (on each process's core) instead of moving."""


def compare_with_model(result: SystemResult, model: SystemResult) -> None:
    """Put the model's figures (a virtual-time run of the same cluster, system and workload, probed by kind)
    next to a host run's measurements: its JCT, and per kind of data movement its count and mean seconds."""
    host = result.extra["host"]
    host["model_jct_s"] = model.jct_s
    modelled = model.extra.get("paths", {})
    for kind in sorted(set(host["paths"]) | set(modelled)):
        row = host["paths"].setdefault(kind, {"count": 0})
        theirs = modelled.get(kind)
        row["model_count"] = theirs["count"] if theirs else 0
        row["model_mean_s"] = theirs["mean_s"] if theirs else None
        row["model_max_s"] = theirs["max_s"] if theirs else None
        if kind in MODELLED_ON_HOST:
            row["modelled_on_host"] = True  # no GPU copies: the host runs them on its core, as the model


LIVE_TEMP_PREFIX: Final = "dualpath-emu-live-"
"""The temporary run directory of a live run given none (``dualpath-emu run --mode realtime``)."""
FULL_DISK_BYTES: Final = 1 << 20
"""A live run that failed with less than this free in its run directory (or its KV storage directory) is reported
as a full disk."""
_OUT_OF_SPACE: Final = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


def full_disk(run_dir: Path, blocks_dir: Path | None, message: str) -> str | None:
    """Why a failed live run stopped, if a disk was full: its run directory or its KV storage directory with less
    than :data:`FULL_DISK_BYTES` free, or a process whose output (in ``message``) says it found no space."""
    for what, folder in (("the run directory", run_dir), ("the KV storage directory", blocks_dir)):
        if folder is None:
            continue
        try:
            free = shutil.disk_usage(folder).free
        except OSError:  # not there (yet, or any more)
            continue
        if free < FULL_DISK_BYTES:
            return f"{what} {folder} is full ({free:,} bytes left)"
    said = next((text for text in _OUT_OF_SPACE if text in message), None)
    if said is not None:
        where = f"the KV storage directory {blocks_dir}" if blocks_dir is not None else f"the run directory {run_dir}"
        return f"a process ran out of space ({said}) writing to {where} or its run directory"
    return None


def run_storage(storage_dir: str) -> str:
    """The run's own folder under a given ``storage_dir`` (``run-<random>``), so that runs sharing the
    directory never read or delete each other's blocks; "" (the run directory's ``storage``) stays so."""
    return str(Path(storage_dir) / f"run-{secrets.token_hex(8)}") if storage_dir else ""


def _remove_blocks(folder: Path) -> None:
    """Remove a host run's KV block files (and the folder, if that empties it): only the run's own folder's.
    A folder that cannot be cleaned (read-only, gone) is said, not an error: the run's results stand."""
    try:
        for path in folder.glob("ctx-*.kv"):
            path.unlink(missing_ok=True)
        (folder / OWNER_FILE).unlink(missing_ok=True)
        folder.rmdir()
    except FileNotFoundError:
        pass
    except OSError as error:
        if error.errno != errno.ENOTEMPTY:  # something else is in it: not ours to remove
            print(f"dualpath-emu: warning: could not remove the run's KV blocks in {folder}: "
                  f"{error.strerror or error}", file=sys.stderr, flush=True)  # fmt: skip


def _write_description(
    run_dir: Path, config: ClusterConfig, system: System, trajectories: Sequence[Trajectory], seed: int
) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)
    description = {"config": config_to_wire(config), "system": system_to_wire(system), "seed": seed,
                   "agents": len(trajectories), "turns": sum(len(t) for t in trajectories)}  # fmt: skip
    _write_private(run_dir / DESCRIPTION, json.dumps(description, indent=1).encode())
    write_trajectories(run_dir / TRAJECTORIES, trajectories)
    os.chmod(run_dir / TRAJECTORIES, 0o600)


def write_run(
    config: ClusterConfig, system: System, trajectories: Sequence[Trajectory], *, run_dir: Path, seed: int = 0,
    placement_kind: str = "groups", **options: Any,
) -> Path:  # fmt: skip
    """Write a live run of the model backend into ``run_dir`` without starting it: the description, the trajectories
    and the run scenario (``run.toml``, :func:`run_scenario_text` with ``options``: ``time_scale``, ``transport``,
    ``host``, ``timeout_s``, ...), which ``dualpath-emu launch run.toml --run-dir DIR`` starts on this host and
    ``dualpath-emu collect DIR`` then checks. Returns the run scenario's path."""
    processes = placement(ClusterApplication.actor_names_of(config), placement_kind)
    _write_description(run_dir, config, system, trajectories, seed)
    settings: dict[str, Any] = {"time_scale": 1.0, "transport": "ipc", "host": "127.0.0.1", "timeout_s": 86_400.0}
    text = run_scenario_text(seed=seed, processes=processes, **{**settings, **options})
    path = run_dir / RUN_SCENARIO
    _write_private(path, text.encode())
    return path


def host_of(process: str, hosts: Sequence[tuple[str, str]], default: str) -> str:
    """The host a process runs on: the first ``(pattern, host)`` whose shell-style pattern matches its name."""
    for pattern, host in hosts:
        if fnmatch.fnmatchcase(process, pattern):
            return host
    return default


def prepare_live(
    config: ClusterConfig,
    system: System,
    trajectories: Sequence[Trajectory],
    *,
    run_dir: Path,
    seed: int = 0,
    time_scale: float = 1.0,
    placement_kind: str = "groups",
    hosts: Sequence[tuple[str, str]] = (),
    default_host: str = "127.0.0.1",
    port_base: int = 47_100,
    timeout_s: float = 86_400.0,
    backend: str = "model",
    byte_scale: float = DEFAULT_BYTE_SCALE,
    storage_dir: str = "",
    transfer_engine: str = "zmq",
    restart_crashed: bool = False,
) -> list[tuple[str, str, str]]:
    """Write a live run to be started by hand, on one host or several: the description, the run scenario
    with every process's tcp endpoint (its host by :func:`host_of`, ports from ``port_base``: the data plane's
    first) and the run's CURVE keys. Returns ``(host, process, command)`` in start order: the data plane
    first, the client's process last. Copy ``run_dir`` to every host (keeping its modes), run each host's
    commands there, then gather every host's ``*.part``, ``*.events`` and ``*.json`` files into one copy and
    run ``dualpath-emu collect DIR``. On the host backend (``backend="host"``) there is no data plane: each
    process also gets a byte channel endpoint (ports from ``port_base + 50``), and ``storage_dir`` must be a
    directory every host mounts (the KV blocks one host writes, another reads). ``restart_crashed`` is written
    into the run (``launch --only`` then starts an engine group's process again if it dies)."""
    from dualpath_emu.runtime.launcher import prepare

    host = backend == "host"
    if host and not storage_dir:
        raise ValueError("a host-backend run started by hand needs [host] storage_dir: a directory every host "
                         "mounts (the KV blocks one host writes, another reads)")  # fmt: skip
    storage_dir = run_storage(storage_dir)
    processes = placement(ClusterApplication.actor_names_of(config), placement_kind)
    restart = _check_restart(backend, processes) if restart_crashed else []
    names = ([] if host else [DATAPLANE_PROCESS]) + [name for name, _ in processes]
    for pattern, _ in hosts:  # a pattern that names no process would leave it on the default host unsaid
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            from dualpath_emu.errors import UsageError

            raise UsageError(f"--process-host {pattern[:100]!r}: matches no process of this run (its "
                             f"processes: {', '.join(names)}; patterns are shell-style and case-sensitive)")  # fmt: skip
    _write_description(run_dir, config, system, trajectories, seed)
    endpoints = {name: f"tcp://{host_of(name, hosts, default_host)}:{port_base + i}" for i, name in enumerate(names)}
    data = {name: f"tcp://{host_of(name, hosts, default_host)}:{port_base + 50 + i}" for i, name in enumerate(names)}
    text = run_scenario_text(
        seed=seed, time_scale=time_scale, transport="tcp", host=default_host, timeout_s=timeout_s,
        processes=processes, endpoints=endpoints, dataplane_endpoint=None if host else endpoints[DATAPLANE_PROCESS],
        backend=backend, byte_scale=byte_scale, storage_dir=storage_dir, transfer_engine=transfer_engine,
        data_endpoints=data if host else None, restart_crashed=restart,
    )  # fmt: skip
    _write_private(run_dir / RUN_SCENARIO, text.encode())
    commands = prepare(load_run_scenario(run_dir / RUN_SCENARIO, registry()), run_dir)
    out = []
    for command in commands:
        words = shlex.split(command)
        name = words[words.index("--process") + 1]
        out.append((host_of(name, hosts, default_host), name, command))
    return out


def host_commands(run_dir: Path, commands: Sequence[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """One command per host for :func:`prepare_live`'s processes: ``dualpath-emu launch ... --only`` starts
    and watches that host's share (:func:`~dualpath_emu.runtime.launcher.launch_host`). In start order: the
    hosts without the data plane first, the client's host last."""
    by_host: dict[str, list[str]] = {}
    for host, name, _ in commands:
        by_host.setdefault(host, []).append(name)
    order = sorted(by_host, key=lambda h: ("client" in by_host[h], DATAPLANE_PROCESS in by_host[h]))
    scenario = shlex.quote(str(run_dir / RUN_SCENARIO))
    return [(host, f"dualpath-emu launch {scenario} --run-dir {shlex.quote(str(run_dir))} --only "
                   f"{','.join(by_host[host])}") for host in order]  # fmt: skip


def collect_dir(run_dir: Path) -> tuple[SystemResult, ClusterApplication]:
    """:func:`collect` for a run started by hand (:func:`prepare_live`) whose processes' files have been
    gathered into ``run_dir``."""
    run = load_run_scenario(run_dir / RUN_SCENARIO, registry())
    app = run.app
    if not isinstance(app, ClusterApplication):
        raise ScenarioError(f"{run_dir / RUN_SCENARIO}: not a live cluster run (app {app.name!r})")
    names = [p.name for p in run.processes]
    stems = [incarnation_stem(n, last_incarnation(run_dir, n)) for n in names]
    missing = [n for n in stems if not (run_dir / f"{n}.part").exists() or not (run_dir / f"{n}.json").exists()]
    if missing:
        raise ScenarioError(f"{run_dir}: no part of process(es) {', '.join(missing)} (gather every host's *.part, "
                            "*.events and *.json files here)")  # fmt: skip
    wall_s = max(json.loads((run_dir / f"{n}.json").read_text())["wall_s"] for n in stems)
    result, _ = collect(run, run_dir, wall_s)
    service: dict[str, list[str]] = {DATAPLANE_PROCESS: []} if run.uses_dataplane else {}
    result.extra.update({"mode": "realtime", "time_scale": run.time_scale, "placement": "by hand",
                         "backend": run.backend_name, "processes": len(names) + len(service),
                         "process_actors": {**service, **{p.name: list(p.actors) for p in run.processes}}})  # fmt: skip
    if run.backend_name == "host":  # the run is over: its KV blocks go (in the shared directory, only its files)
        _remove_blocks(Path(app.storage_dir) if app.storage_dir else run_dir / STORAGE_DIR)
    return result, app
