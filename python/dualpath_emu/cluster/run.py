"""Running one system on one cluster configuration in virtual time, and its results (paper §7).

:func:`run_system` builds the core (ports per :mod:`~dualpath_emu.cluster.topology`), the actors (client,
scheduler, one prefill group per EP group, one decode group per node), runs until every agent's last turn is
done, checks that every admitted request ended exactly once, and returns a :class:`SystemResult`: JCT,
TTFT/TTST/TPOT percentiles, storage- and compute-NIC bytes and utilisation on prefill vs decode nodes, the
storage-NIC max/mean, the event log's SHA-256, wall time and event counts.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualpath_emu._core import Core
from dualpath_emu.cluster.actors import (
    Cluster,
    ClientActor,
    DecodeGroup,
    Ledger,
    PrefillGroup,
    SchedulerActor,
    Start,
)
from dualpath_emu.cluster.config import ClusterConfig, derived
from dualpath_emu.cluster.invariants import EventLogChecker, InvariantError, check_core_bytes
from dualpath_emu.cluster.metrics import Metrics, percentiles
from dualpath_emu.cluster.systems import SYSTEMS
from dualpath_emu.cluster.topology import KV_LANE, Topology, build_topology
from dualpath_emu.runtime.actors import ActorSystem
from dualpath_emu.runtime.eventlog import EventLogWriter
from dualpath_emu.runtime.virtual_loop import run as run_virtual
from dualpath_emu.workload.trajectory import Trajectory

__all__ = ["LostRequestsError", "Progress", "SystemResult", "run_system"]


class LostRequestsError(RuntimeError):
    """A run ended with admitted requests that never finished (a bug: every request ends exactly once)."""


@dataclass(frozen=True)
class Progress:
    """How far a run is: turns done of all, emulated and wall seconds so far."""

    system: str
    turns_done: int
    turns_total: int
    emulated_s: float
    wall_s: float


@dataclass
class SystemResult:
    system: str
    jct_s: float
    turns: int
    agents: int
    lost_requests: int
    ttft_s: dict[str, float]
    ttst_s: dict[str, float]
    tpot_s: dict[str, float]
    snic_read_bytes: dict[str, float]
    snic_util: dict[str, float]
    cnic_util: dict[str, float]
    snic_max_over_mean: float
    event_log_sha256: str
    wall_s: float
    events: int
    core_events: int
    metrics: Metrics = field(repr=False)
    extra: dict[str, Any] = field(default_factory=dict)
    snic_timeline: dict[str, list[float]] = field(default_factory=dict, repr=False)
    """With ``sample_interval_s``: the storage NICs' mean utilisation (reads) per sample on prefill (``pe``) and
    decode (``de``) nodes; empty otherwise."""
    sample_interval_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The JSON-able summary (``summary.json``'s ``systems.<name>``)."""
        return {
            "jct_s": self.jct_s,
            "turns": self.turns,
            "agents": self.agents,
            "lost_requests": self.lost_requests,
            "ttft_s": self.ttft_s,
            "ttst_s": self.ttst_s,
            "tpot_s": self.tpot_s,
            "snic_read_bytes": self.snic_read_bytes,
            "snic_util": self.snic_util,
            "cnic_util": self.cnic_util,
            "snic_max_over_mean": self.snic_max_over_mean,
            "event_log_sha256": self.event_log_sha256,
            "wall_s": self.wall_s,
            "events": self.events,
            "core_events": self.core_events,
            **self.extra,
        }


def run_system(
    config: ClusterConfig,
    system_name: str,
    trajectories: Sequence[Trajectory],
    *,
    seed: int = 0,
    record_messages: bool = False,
    progress: Callable[[Progress], None] | None = None,
    progress_interval_s: float = 0.25,
    sample_interval_s: float | None = None,
    trace_path: str | Path | None = None,
) -> SystemResult:
    """Run ``trajectories`` on ``config`` with the system called ``system_name`` in virtual time.

    The event log holds the actors' decisions and milestones (admission, scheduling, reads, first token,
    end, buffer and HBM grants); ``record_messages`` adds the life of every message (several times longer).

    ``progress`` is called with a :class:`Progress` at most every ``progress_interval_s`` of wall time while
    the run goes on (from the event sink, so it costs nothing in between), and once at the end.
    ``sample_interval_s`` makes the core sample port utilisation (:attr:`SystemResult.snic_timeline`);
    ``trace_path`` records every transfer as a span and writes a Chrome/Perfetto trace there (memory grows
    with the run). Neither changes the run's results or its event log.
    """
    system = SYSTEMS[system_name]
    d = derived(config)
    core = Core(
        sample_interval_ns=None if sample_interval_s is None else max(1, round(sample_interval_s * 1e9)),
        record_spans=trace_path is not None,
    )
    topology = build_topology(core, config.node, config.pe_nodes, config.de_nodes, config.storage)
    metrics = Metrics()
    actors = ActorSystem(seed=seed, record_messages=record_messages)
    gpus = config.node.gpus
    pe_order = tuple(n.index * gpus + g for n in topology.pe_nodes for g in range(gpus))
    ledger = Ledger(actors, topology)
    cluster = Cluster(config, system, d, topology, metrics, system.policy(d.alpha_tokens, d.beta_tokens, pe_order), ledger)
    writer = EventLogWriter()
    checker = EventLogChecker()

    def sink(events: list[tuple[int, int, str, str, str]], first: int) -> None:
        writer.write_numbered(events, first)
        checker.feed(events, first)

    actors.set_event_sink(sink)
    report = None
    if progress is not None:  # smaller chunks: the sink is where progress is looked at
        report = _Reporter(system_name, progress, progress_interval_s, metrics, core, trajectories)
        actors.set_event_sink(report.wrap(sink), chunk=4096)
    client = ClientActor(actors, cluster, trajectories)
    SchedulerActor(actors, cluster)
    ep = config.prefill_ep_nodes
    pe_nodes = [n.index for n in topology.pe_nodes]
    for first in range(0, len(pe_nodes), ep):
        PrefillGroup(actors, cluster, pe_nodes[first : first + ep])
    for node in topology.de_nodes:
        DecodeGroup(actors, cluster, node.index)

    async def main() -> None:
        for actor in actors.actors:
            actor.start()
        actors.tell("client", Start())
        await client.finished.wait()
        actors.data_plane.flush()  # work asked for in the last instant (block write-backs) reaches the core

    started = time.perf_counter()
    # A run allocates millions of short-lived objects and creates almost no cycles: what exists now
    # (trajectories, topology, metrics arrays) is frozen out of the cyclic collector, and it runs 30 times
    # less often (collections took 4% of a 4,096-agent run, then 2%).
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(20_000, 10, 10)
    try:
        run_virtual(actors.run(main()), core)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    wall_s = time.perf_counter() - started
    actors.flush_events()
    if report is not None:
        report.now()
    lost = metrics.unfinished()
    if lost:
        raise LostRequestsError(f"{system_name}: {len(lost)} admitted request(s) never ended, e.g. {lost[:5]}")
    end_ns = core.now_ns
    core.run_until_idle()  # the last block write-backs, so that every byte is accounted
    violations = checker.finish() + check_core_bytes(core, ledger.bytes, ledger.transfers)
    if violations:
        raise InvariantError(f"{system_name}: " + "; ".join(violations))
    result = _result(system_name, core, cluster, trajectories, actors, writer.sha256(), wall_s, end_ns)
    if sample_interval_s is not None:
        result.snic_timeline = _snic_timeline(core, topology)
        # The core widens its interval on long runs so that samples stay bounded: report the one it used.
        result.sample_interval_s = (core.sample_interval_ns or 0) / 1e9
    if trace_path is not None:
        core.write_trace(str(trace_path))
    return result


def _result(
    name: str,
    core: Core,
    cluster: Cluster,
    trajectories: Sequence[Trajectory],
    actors: ActorSystem,
    sha256: str,
    wall_s: float,
    end_ns: int,
) -> SystemResult:
    metrics, topology = cluster.metrics, cluster.topology
    end_s = end_ns / 1e9 or 1e-9

    def kv_bytes(port: int) -> float:
        return float(core.port_counters(port)["fluid_bytes"][KV_LANE])  # type: ignore[index]

    def total_bytes(port: int) -> float:
        return float(sum(core.port_counters(port)["fluid_bytes"]))  # type: ignore[arg-type]

    snic = {role: [kv_bytes(n.snic_rx) for n in topology.nodes if n.role == role] for role in ("pe", "de")}
    snic_cap = cluster.config.node.snic_bytes_per_s * cluster.config.node.snics
    cnic = {
        role: [total_bytes(p) for n in topology.nodes if n.role == role for p in (*n.cnic_tx, *n.cnic_rx)]
        for role in ("pe", "de")
    }
    cnic_cap = cluster.config.node.cnic_bytes_per_s
    every_snic = snic["pe"] + snic["de"]
    mean = sum(every_snic) / len(every_snic) if every_snic else 0.0
    stats = core.stats()
    return SystemResult(
        system=name,
        jct_s=metrics.jct_s(),
        turns=len(metrics),
        agents=len(trajectories),
        lost_requests=0,
        ttft_s=percentiles(metrics.ttft_s()).as_dict(),
        ttst_s=percentiles(metrics.ttst_s()).as_dict(),
        tpot_s=percentiles(metrics.tpot_s()).as_dict(),
        snic_read_bytes={role: sum(v) for role, v in snic.items()},
        snic_util={role: sum(v) / (len(v) * snic_cap * end_s) if v else 0.0 for role, v in snic.items()},
        cnic_util={role: sum(v) / (len(v) * cnic_cap * end_s) if v else 0.0 for role, v in cnic.items()},
        snic_max_over_mean=max(every_snic) / mean if mean > 0 else 0.0,
        event_log_sha256=sha256,
        wall_s=wall_s,
        events=actors.event_count,
        core_events=int(stats.get("events", 0)),
        metrics=metrics,
    )


class _Reporter:
    """Calls a progress callback from the event sink, at most every ``interval_s`` of wall time."""

    def __init__(
        self, system: str, callback: Callable[[Progress], None], interval_s: float, metrics: Metrics, core: Core,
        trajectories: Sequence[Trajectory],
    ) -> None:
        self.system, self.callback, self.interval_s = system, callback, interval_s
        self.metrics, self.core = metrics, core
        self.total = sum(len(t) for t in trajectories)
        self.started = time.perf_counter()
        self.next_s = self.started + interval_s

    def wrap(
        self, sink: Callable[[list[tuple[int, int, str, str, str]], int], None]
    ) -> Callable[[list[tuple[int, int, str, str, str]], int], None]:
        def reporting(events: list[tuple[int, int, str, str, str]], first: int) -> None:
            sink(events, first)
            if time.perf_counter() >= self.next_s:
                self.now()

        return reporting

    def now(self) -> None:
        """Report now."""
        wall = time.perf_counter()
        self.next_s = wall + self.interval_s
        done = self.metrics.done_ns
        turns_done = len(done) - done.count(-1)  # a C loop over the column: cheap at a few calls per second
        self.callback(Progress(self.system, turns_done, self.total, self.core.now_ns / 1e9, wall - self.started))


def _snic_timeline(core: Core, topology: Topology) -> dict[str, list[float]]:
    """Mean storage-NIC read utilisation per sample over the prefill and the decode nodes."""
    out: dict[str, list[float]] = {}
    for role in ("pe", "de"):
        series = [core.utilisation(n.snic_rx) for n in topology.nodes if n.role == role]
        width = max((len(s) for s in series), default=0)
        out[role] = [sum(s[i] if i < len(s) else 0.0 for s in series) / len(series) for i in range(width)]
    return out
