"""The cluster as an application of the real-time runtime: the same actors as in virtual time, placed in OS
processes, paced by the data-plane service's core in wall-clock time. Every process builds the same
configuration from the run's description (:data:`DESCRIPTION`); each keeps its own ledger, event log and tape
of the observations the run's metrics are derived from, written when it stops (:meth:`ClusterApplication.write_part`)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from dualpath_emu._core import Core
from dualpath_emu.cluster.assemble import build_engine, engine_names, prefill_groups
from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.core_report import CoreReport
from dualpath_emu.cluster.config import derived
from dualpath_emu.cluster.live.host import HOST, host_part
from dualpath_emu.cluster.live.metrics import LiveMetrics
from dualpath_emu.cluster.live.wire import config_from_wire, system_from_wire, write_private
from dualpath_emu.cluster.messages import Start, cluster_registry
from dualpath_emu.cluster.metrics import Metrics
from dualpath_emu.cluster.observations import MEASUREMENTS, Arrival, Completion, WorkloadEnded, to_wire
from dualpath_emu.cluster.run import SAMPLE_INTERVAL_S
from dualpath_emu.cluster.systems import with_tiers
from dualpath_emu.cluster.topology import Topology, build_topology
from dualpath_emu.config import ScenarioError, Table
from dualpath_emu.messages import MessageRegistry
from dualpath_emu.runtime.actors import Actor, ActorSystem
from dualpath_emu.runtime.app import Application, Registry
from dualpath_emu.runtime.core_work import CoreWork
from dualpath_emu.runtime.engine import Watch, watching
from dualpath_emu.runtime.engine_actor import EngineActor
from dualpath_emu.runtime.node import MODEL
from dualpath_emu.workload.trajectory import read_trajectories

if TYPE_CHECKING:
    from dualpath_emu.host.plane import HostDataPlane

__all__ = ["DESCRIPTION", "RUN_SCENARIO", "ClusterApplication", "registry"]

DESCRIPTION: Final = "cluster.json"
"""The run's description: the cluster's configuration, the system, the seed (:mod:`.wire`)."""
TRAJECTORIES: Final = "trajectories.jsonl"
RUN_SCENARIO: Final = "run.toml"
STORAGE_DIR: Final = "storage"
"""Host backend: the KV blocks' directory in the run directory (removed when the run ends)."""
DEFAULT_BYTE_SCALE: Final = 1e-3
METRICS_PORT_FILE: Final = "metrics.port"
"""Where a live run with metrics writes the port its Prometheus endpoint listens on."""
PROGRESS_FILE: Final = "progress.json"
"""Where the client's process says how far the run is, every :data:`PROGRESS_S` of wall time."""
PROGRESS_S: Final = 0.5
POLL_S: Final = 1.0  # How often (wall seconds) the live metrics ask the data plane for its ports and read queues.


class ClusterApplication(Application):
    """The cluster's actors for the real-time runtime. ``config`` is the run scenario's ``[cluster]`` table."""

    name = "cluster"

    def __init__(self, config: Table) -> None:
        description = config.get_str("description", DESCRIPTION)
        self.metrics_port = config.get_int("metrics_port", -1, min=-1, max=65_535)
        self.byte_scale = config.get_float("byte_scale", DEFAULT_BYTE_SCALE, min=0.0, max=1.0, min_exclusive=True)
        """Host backend: real bytes per modelled byte."""
        self.storage_dir = config.get_str("storage_dir", "")
        """Host backend: where the KV blocks live (a shared mount across hosts); default the run's ``storage``."""
        self.transfer_engine = config.get_str("transfer_engine", "zmq", choices=("zmq", "mooncake"))
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
        self.run_dir = folder
        self.trajectories_path = folder / TRAJECTORIES
        self.derived = derived(self.config)
        self.sample_interval_ns = round(SAMPLE_INTERVAL_S * 1e9)
        # Port ids and rates only: a scratch core numbers the ports as the data plane's does.
        self.scratch = Core()
        self.topology = self._build(self.scratch)
        self._cluster: Cluster | None = None
        self._tape: list[tuple[int, Any]] = []
        """What this process's engines observed that the run's metrics are derived from, ``(t_ns, record)`` in the
        order observed: its part (:meth:`write_part`); the collector replays every process's into one
        :class:`Metrics`."""
        self._watched: set[int] = set()  # The actor systems (by id) whose watch keeps the tape.
        self._plane: CoreWork | None = None  # This process's data plane: its engines'.
        self.host: HostDataPlane | None = None  # This process's host data plane (host backend only; :mod:`.host`).

    def _build(self, core: Core) -> Topology:
        c = self.config
        return build_topology(core, c.node, c.pe_nodes, c.de_nodes, c.storage, c.network)

    # --- the Application interface -------------------------------------------------------------------

    def registry(self) -> MessageRegistry:
        return cluster_registry()

    def prefill_groups(self) -> list[list[int]]:
        return prefill_groups(self.config)

    def actor_names(self) -> list[str]:
        return engine_names(self.config)

    @property
    def driver_actor(self) -> str:
        return "client"

    def core_options(self) -> dict[str, Any]:
        return {"sample_interval_ns": self.sample_interval_ns}

    def build_core(self, core: Core) -> None:
        self._build(core)

    def _context(self) -> Cluster:
        if self._cluster is None:
            policy = self.system.policy(self.derived.alpha_tokens, self.derived.beta_tokens)
            system = with_tiers(self.system, self.config)
            self._cluster = Cluster(self.config, system, self.derived, self.topology, policy)
        return self._cluster

    def create_actor(self, system: ActorSystem, name: str, *, restarted: bool = False) -> Actor:
        """The actor around engine ``name``, whose data plane is the process's (``restarted``: see the base)."""
        cluster = self._context()
        self._plane = system.data_plane
        if id(system) not in self._watched:  # the process's observations the metrics need go on its tape
            self._watched.add(id(system))
            keep = self._tape.append
            system.watch = watching(system.watch, Watch(
                {kind: lambda now, record: keep((now, record)) for kind in Metrics.observed()}, MEASUREMENTS
            ))  # fmt: skip
        return EngineActor(system, name, lambda out, plane: build_engine(
            name, cluster, out, plane, trajectories=lambda: read_trajectories(self.trajectories_path).trajectories,
            seed=self.seed, restarted=restarted))  # fmt: skip

    async def drive(self, system: ActorSystem) -> dict[str, Any]:
        plane = self._plane
        assert plane is not None, "the driver runs in the client's process"
        finished = asyncio.Event()
        counts = {Arrival: 0, Completion: 0}

        def count(_now: int, record: Any) -> None:
            counts[type(record)] += 1

        watches = [Watch({WorkloadEnded: lambda _now, _record: finished.set(), Arrival: count, Completion: count})]
        tasks: list[asyncio.Task[None]] = []
        live: LiveMetrics | None = None
        loop = asyncio.get_running_loop()
        if self.metrics_port >= 0:
            live = LiveMetrics()
            port = live.serve(self.metrics_port)
            write_private(self.run_dir / METRICS_PORT_FILE, f"{port}\n".encode())
            print(f"live metrics: http://127.0.0.1:{port}/metrics", flush=True)
            watches.append(live.watch())
            tasks.append(loop.create_task(self._poll(plane, live), name="live-metrics"))
        system.watch = watching(system.watch, *watches)  # the client's observations: where the run is
        start_ns = system.now_ns()
        tasks.append(loop.create_task(self._report_progress(system, start_ns, counts), name="progress"))
        try:
            system.tell("client", Start())
            await finished.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if live is not None:
                live.close()
        plane.flush()  # the last instant's work (block write-backs) goes to the data plane
        await asyncio.sleep(0)
        return {"turns": counts[Arrival], "start_ns": start_ns, "end_ns": system.now_ns()}

    async def _report_progress(self, system: ActorSystem, start_ns: int, counts: dict[type, int]) -> None:
        """Write how far the run is to :data:`PROGRESS_FILE`, for the launching command's progress line."""
        total = sum(len(t) for t in read_trajectories(self.trajectories_path).trajectories)
        every_s = PROGRESS_S * getattr(asyncio.get_running_loop(), "time_scale", 1.0)  # in loop seconds
        temporary = self.run_dir / f"{PROGRESS_FILE}.tmp"
        while True:
            report = {"turns_done": counts[Completion], "turns_total": total,
                      "emulated_s": (system.now_ns() - start_ns) / 1e9}  # fmt: skip
            write_private(temporary, json.dumps(report).encode())
            os.replace(temporary, self.run_dir / PROGRESS_FILE)  # whole, never half written
            await asyncio.sleep(every_s)

    async def _poll(self, plane: CoreWork, live: LiveMetrics) -> None:
        """Feed the live metrics the data plane's ports and read queues, every :data:`POLL_S` of wall time."""
        scratch = self.scratch
        rates = {scratch.port_name(p): scratch.port_rate(p) for p in range(scratch.port_count)}
        every_s = POLL_S * getattr(asyncio.get_running_loop(), "time_scale", 1.0)  # in loop seconds
        while True:
            report = await plane.stats()
            ports = [(name, rates.get(name, 0.0), float(sum(c["fluid_bytes"]))) for name, c in report["ports"].items()]
            live.data_plane(
                report["clock_ns"], ports, [(name, q["read_bytes"]) for name, q in report["storage"].items()]
            )
            await asyncio.sleep(every_s)

    def write_part(self, path: Path) -> None:
        """This process's share of the run: what its engines observed for the metrics (its tape) and what its ledger
        booked (msgpack, user-only)."""
        cluster = self._cluster
        booked: list[tuple[int, int, int, int]] = []
        if cluster is not None:
            transfers = cluster.booking.transfers
            booked = [
                (port, lane, size, transfers[(port, lane)]) for (port, lane), size in cluster.booking.bytes.items()
            ]
        part: dict[str, Any] = {"observed": [to_wire(now, record) for now, record in self._tape], "booked": booked}
        if self.host is not None:
            part["host"] = host_part(self.host, self.topology)
        write_private(path, msgpack.packb(part))

    def service_report(self, core: Core) -> dict[str, Any]:
        """The core's report (:class:`CoreReport`), written by the data-plane service once it has drained."""
        core.poll()  # drained: nothing completes, but the core's time catches up with its wall clock
        return CoreReport.of(core, self.topology, core.now_ns).to_wire()


def registry() -> Registry:
    """What a live run may name: the cluster application, the model backend (the runtime's) and the host backend."""
    return Registry({ClusterApplication.name: ClusterApplication}, {MODEL.name: MODEL, HOST.name: HOST})
