"""The cluster as an application of the real-time runtime: the same actors as in virtual time, placed in OS
processes, paced by the data-plane service's core in wall-clock time (``dualpath-emu run --mode realtime``).

A real-time cluster run is a run scenario (:mod:`dualpath_emu.runtime.scenario`) with ``app = "cluster"``,
written by :func:`write_run_scenario` into the run's directory; its ``[cluster]`` table names the cluster
scenario and what the command line changed::

    [cluster]
    scenario = "/abs/path/my.toml"     # a cluster scenario file, or a packaged one's name
    set = ["workload.max_rounds=4"]    # --set KEY=VALUE, as given
    system = "dualpath"                # one system per run
    agents = 0                         # --agents (0: the scenario's)
    seed = -1                          # --seed (-1: the scenario's)

Every process reads the same description and so builds the same configuration; only the client's process
generates (or reads) the trajectories. **Placements** (:data:`PLACEMENTS`): ``groups`` (the default: the
scheduler, the client, each prefill group and each decode group in its own process), ``roles`` (the client
and the scheduler together, every prefill group in one process, every decode group in another) and
``single`` (every actor in one process, on its own core: no data-plane service). In a run split over
processes the actors share nothing: each process keeps its own metrics, ledger and event log, written when
it stops (:meth:`ClusterApplication.write_part`); the data-plane service writes the core's report
(:meth:`ClusterApplication.service_report`); :func:`collect` merges and checks them all.
"""

from __future__ import annotations

import asyncio
import json
import os
import tomllib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from dualpath_emu._core import Core
from dualpath_emu.cluster.client import ClientActor
from dualpath_emu.cluster.config import derived
from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.core_report import CoreReport
from dualpath_emu.cluster.decode import DecodeGroup
from dualpath_emu.cluster.invariants import EventLogChecker, InvariantError, check_core_bytes
from dualpath_emu.cluster.ledger import Ledger
from dualpath_emu.cluster.messages import Start, cluster_registry
from dualpath_emu.cluster.metrics import Metrics
from dualpath_emu.cluster.prefill import PrefillGroup
from dualpath_emu.cluster.run import SAMPLE_INTERVAL_S, LostRequestsError, SystemResult, build_result
from dualpath_emu.cluster.scenario import ClusterScenario
from dualpath_emu.cluster.scheduler import SchedulerActor
from dualpath_emu.cluster.topology import Topology, build_topology
from dualpath_emu.config import Table
from dualpath_emu.messages import MessageRegistry
from dualpath_emu.runtime.actors import Actor, ActorSystem
from dualpath_emu.runtime.app import Application
from dualpath_emu.runtime.eventlog import EventLogWriter, parse_line

__all__ = ["PLACEMENTS", "SERVICE_REPORT", "ClusterApplication", "collect", "placement", "read_part", "run_scenario_text"]

PLACEMENTS: Final = ("groups", "roles", "single")
MAX_SETTINGS: Final = 1_000


def _load(spec: str, settings: Sequence[str], system: str, agents: int, seed: int | None) -> ClusterScenario:
    from dualpath_emu.cluster.run_cli import load_scenario, parse_settings

    return load_scenario(spec, parse_settings(settings)).with_overrides(
        systems=[system], agents=agents or None, seed=seed
    )


class ClusterApplication(Application):
    """The cluster's actors for the real-time runtime (see the module). ``config`` is the ``[cluster]``
    table of the run scenario."""

    name = "cluster"

    def __init__(self, config: Table) -> None:
        spec = config.get_str("scenario")
        settings = config.get_str_list("set", [])
        if len(settings) > MAX_SETTINGS:
            raise config.error("set", f"at most {MAX_SETTINGS} settings", settings)
        system = config.get_str("system")
        agents = config.get_int("agents", 0, min=0)
        seed = config.get_int("seed", -1, min=-1)
        config.finish()
        self.scenario = _load(spec, settings, system, agents, None if seed < 0 else seed)
        self.system = self.scenario.system(self.scenario.systems[0])
        self.config = self.scenario.config
        self.derived = derived(self.config)
        self.sample_interval_ns = round(SAMPLE_INTERVAL_S * 1e9)
        # Port ids only: a scratch core numbers the ports as the data plane's does.
        self.topology = self._build(Core())
        self._cluster: Cluster | None = None
        self._client: ClientActor | None = None

    def _build(self, core: Core) -> Topology:
        c = self.config
        return build_topology(core, c.node, c.pe_nodes, c.de_nodes, c.storage)

    # --- the Application interface -------------------------------------------------------------------

    def registry(self) -> MessageRegistry:
        return cluster_registry()

    def prefill_groups(self) -> list[list[int]]:
        ep = self.config.prefill_ep_nodes
        nodes = [n.index for n in self.topology.pe_nodes]
        return [nodes[first : first + ep] for first in range(0, len(nodes), ep)]

    def actor_names(self) -> list[str]:
        return self.actor_names_of(self.scenario)

    @staticmethod
    def actor_names_of(scenario: ClusterScenario) -> list[str]:
        """The cluster's actors: the client, the scheduler, a prefill group per EP group (named after its
        first node), a decode group per decode node."""
        c = scenario.config
        pe = [f"pe{first}" for first in range(0, c.pe_nodes, c.prefill_ep_nodes)]
        return ["client", "scheduler", *pe, *(f"de{c.pe_nodes + i}" for i in range(c.de_nodes))]

    @property
    def driver_actor(self) -> str:
        return "client"

    def core_options(self) -> dict[str, Any]:
        return {"sample_interval_ns": self.sample_interval_ns}

    def build_core(self, core: Core) -> None:
        self._build(core)

    def _context(self, system: ActorSystem) -> Cluster:
        if self._cluster is None:
            metrics = Metrics(sample_interval_ns=self.sample_interval_ns)
            policy = self.system.policy(self.derived.alpha_tokens, self.derived.beta_tokens)
            self._cluster = Cluster(self.config, self.system, self.derived, self.topology, metrics, policy,
                                    Ledger(system, self.topology))  # fmt: skip
        return self._cluster

    def create_actor(self, system: ActorSystem, name: str) -> Actor:
        cluster = self._context(system)
        if name == "client":
            self._client = ClientActor(system, cluster, self.scenario.trajectories())
            return self._client
        if name == "scheduler":
            return SchedulerActor(system, cluster)
        for group in self.prefill_groups():
            if name == f"pe{group[0]}":
                return PrefillGroup(system, cluster, group)
        if name.startswith("de") and name[2:].isdigit():
            return DecodeGroup(system, cluster, int(name[2:]))
        raise KeyError(f"the cluster has no actor {name!r}")

    async def drive(self, system: ActorSystem) -> dict[str, Any]:
        client = self._client
        assert client is not None, "the driver runs in the client's process"
        system.tell("client", Start())
        await client.finished.wait()
        system.data_plane.flush()  # the last instant's work (block write-backs) goes to the data plane
        await asyncio.sleep(0)
        return {"turns": len(self._context(system).metrics), "end_ns": system.now_ns()}

    # --- the parts of a run split over processes ----------------------------------------------------

    def write_part(self, path: Path) -> None:
        """This process's share of the run: its metrics and what its ledger booked (msgpack, user-only)."""
        cluster = self._cluster
        booked: list[tuple[int, int, int, int]] = []
        metrics: dict[str, Any] | None = None
        if cluster is not None:
            transfers = cluster.plane.transfers
            booked = [(port, lane, size, transfers[(port, lane)]) for (port, lane), size in cluster.plane.bytes.items()]
            metrics = cluster.metrics.to_wire()
        data = msgpack.packb({"metrics": metrics, "booked": booked})
        _write_private(path, data)

    def service_report(self, core: Core) -> dict[str, Any]:
        """The core's report (:class:`CoreReport`), written by the data-plane service once it has drained."""
        return CoreReport.of(core, self.topology, core.now_ns).to_wire()


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
    if kind == "groups":
        return [("scheduler", ["scheduler"]), ("client", ["client"]), *((a, [a]) for a in pe + de)]
    if kind == "roles":
        return [("front", ["client", "scheduler"]), ("prefill", pe), ("decode", de)]
    if kind == "single":
        return [("main", list(app_actors))]
    raise ValueError(f"placement: expected one of {', '.join(PLACEMENTS)}, got {kind!r}")


def run_scenario_text(
    *, scenario: str, settings: Sequence[str], system: str, agents: int, seed: int, time_scale: float,
    transport: str, host: str, timeout_s: float, processes: Sequence[tuple[str, Sequence[str]]],
) -> str:
    """The run scenario of one real-time cluster run (TOML text)."""
    def q(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [
        'app = "cluster"', f"seed = {seed}", 'mode = "realtime"', "latency_s = 0.0", f"time_scale = {time_scale!r}",
        f"transport = {q(transport)}", f"host = {q(host)}", f"timeout_s = {timeout_s!r}", "",
        "[cluster]", f"scenario = {q(scenario)}", "set = [" + ", ".join(q(s) for s in settings) + "]",
        f"system = {q(system)}", f"agents = {agents}", f"seed = {seed}", "",
    ]  # fmt: skip
    for name, actors in processes:
        lines += ["[[process]]", f"name = {q(name)}", "actors = [" + ", ".join(q(a) for a in actors) + "]", ""]
    text = "\n".join(lines)
    tomllib.loads(text)  # what we write must read back
    return text


SERVICE_REPORT: Final = "dataplane.report.json"
"""The file of the run directory the core's report is written to (by the data-plane service, or by the one
process of a ``single`` placement)."""


def collect(
    app: ClusterApplication, run_dir: Path, processes: Sequence[str], wall_s: float
) -> tuple[SystemResult, Metrics]:
    """Merge and check the parts of a finished real-time run in ``run_dir``: the processes' metrics and
    ledgers, their event logs (merged in time order: every admitted request ended exactly once across
    processes, no pool over capacity) and the core's report (every byte booked by some process's ledger is
    what the data plane moved, per port and lane). Raises :class:`LostRequestsError` or
    :class:`InvariantError`; returns the run's :class:`SystemResult` and merged metrics."""
    parts, booked, transfers = [], Counter[tuple[int, int]](), Counter[tuple[int, int]]()
    for name in processes:
        metrics, by_port, counts = read_part(run_dir / f"{name}.part")
        if metrics is not None:
            parts.append(metrics)
        booked.update(by_port)
        transfers.update(counts)
    merged = Metrics.merge(parts)
    report = CoreReport.from_wire(json.loads((run_dir / SERVICE_REPORT).read_text()))
    system = app.system.name
    lost = merged.unfinished()
    if lost:
        raise LostRequestsError(f"{system}: {len(lost)} admitted request(s) never ended, e.g. {lost[:5]}")
    checker, writer = EventLogChecker(), EventLogWriter()
    events = _merged_events([run_dir / f"{name}.events" for name in processes])
    checker.feed(events, 0)
    writer.write_numbered(events, 0)
    violations = checker.finish() + check_core_bytes(report, booked, transfers)
    if violations:
        raise InvariantError(f"{system}: " + "; ".join(violations))
    end_ns = max((t for t in merged.done_ns if t >= 0), default=0)
    result = build_result(system, report, merged, app.config, app.topology, app.config.agents, writer.sha256(),
                          wall_s, len(events), end_ns)  # fmt: skip
    result.spec = app.system
    return result, merged


def _merged_events(logs: Sequence[Path]) -> list[tuple[int, int, str, str, str]]:
    """Every process's events in one stream: by time, then by process (in placement order), then by its
    own order."""
    keyed: list[tuple[int, int, int, str, str, str]] = []
    for index, log in enumerate(logs):
        with open(log, encoding="utf-8") as file:
            for line in file:
                t, seq, actor, kind, summary = parse_line(line)
                keyed.append((t, index, seq, actor, kind, summary))
    keyed.sort(key=lambda e: (e[0], e[1], e[2]))
    return [(t, i, actor, kind, summary) for i, (t, _, _, actor, kind, summary) in enumerate(keyed)]


def scenario_reference(argument: str | Path | None) -> str:
    """How every process of a run finds the cluster scenario given on the command line: a packaged one by
    its name (the same on every host), a file by its absolute path."""
    from dualpath_emu.cluster.scenario import DEFAULT
    from dualpath_emu.scenarios import names as packaged

    if argument is None:
        return DEFAULT.name
    if str(argument) in packaged():
        return str(argument)
    return str(Path(argument).resolve())


def run_live(
    reference: str,
    settings: Sequence[str],
    scenario: ClusterScenario,
    system: str,
    *,
    run_dir: Path,
    time_scale: float = 1.0,
    placement_kind: str = "groups",
    transport: str = "ipc",
    host: str = "127.0.0.1",
    timeout_s: float = 86_400.0,
) -> SystemResult:
    """Run ``system`` of ``scenario`` (found by ``reference`` with ``settings``) live: write the run's
    description into ``run_dir`` (user-only), start its processes, wait for them, then merge and check
    their parts (:func:`collect`). Raises :class:`~dualpath_emu.runtime.launcher.LaunchError` if a process
    fails or stops answering."""
    from dualpath_emu.runtime.launcher import launch
    from dualpath_emu.runtime.scenario import load_run_scenario

    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)
    actors = ClusterApplication.actor_names_of(scenario)
    text = run_scenario_text(
        scenario=reference, settings=settings, system=system, agents=scenario.config.agents, seed=scenario.seed,
        time_scale=time_scale, transport=transport, host=host, timeout_s=timeout_s,
        processes=placement(actors, placement_kind),
    )  # fmt: skip
    path = run_dir / "run.toml"
    _write_private(path, text.encode())
    run = load_run_scenario(path)
    app = run.app
    assert isinstance(app, ClusterApplication)
    launched = launch(run, run_dir=run_dir)
    result, _ = collect(app, run_dir, [p.name for p in run.processes], launched.wall_s)
    result.extra.update({
        "mode": "realtime",
        "time_scale": time_scale,
        "placement": placement_kind,
        "transport": transport,
        "processes": {name: {"actors": list(spec.actors), "pid": launched.processes[name]["pid"]}
                      for name, spec in ((p.name, p) for p in run.processes)},
    })  # fmt: skip
    result.wall_s = launched.wall_s
    return result
