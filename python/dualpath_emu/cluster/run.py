"""Running one system on one cluster configuration in virtual time, and its results (paper §7).

:func:`run_system` builds the core and the engines, runs until every agent's last turn is done, checks that
every admitted request ended exactly once and the invariants held, and returns a :class:`SystemResult`."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dualpath_emu._core import Core
from dualpath_emu.cluster.assemble import build_engine, engine_names
from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.ledger import Booking, measure_spans
from dualpath_emu.cluster.messages import Start
from dualpath_emu.cluster.config import ClusterConfig, derived
from dualpath_emu.cluster.core_report import ROLES, CoreReport, ports_of
from dualpath_emu.cluster.invariants import EventLogChecker, InvariantError, check_core_bytes
from dualpath_emu.cluster.metrics import READ_SIDES, Metrics, percentiles
from dualpath_emu.cluster.observations import LINE_FORMATS, FaultChanged, FaultPlanned, WorkloadEnded
from dualpath_emu.cluster.policies import PolicyError
from dualpath_emu.cluster.systems import System, built_in, with_tiers
from dualpath_emu.cluster.topology import KV_LANE, Topology, build_topology
from dualpath_emu.cluster.trace import write_trace
from dualpath_emu.cluster.faults import FaultWatch, fault_summary
from dualpath_emu.cluster.stall import progress_watch
from dualpath_emu.runtime.core_work import clear_faults
from dualpath_emu.runtime.eventlog import EventLogWriter
from dualpath_emu.runtime.engine import Observed, Watch, watching
from dualpath_emu.runtime.virtual import PLANES, DeadlockError, EventSink, PlaneFactory, VirtualDriver
from dualpath_emu.workload.trajectory import Trajectory

__all__ = [
    "SAMPLE_INTERVAL_S", "LostRequestsError", "Progress", "SystemResult", "build_result", "run_system", "speedup",
]  # fmt: skip

SAMPLE_INTERVAL_S = 1.0
"""Port utilisation is sampled, and GPU busy time binned, every emulated second (the p99s, the plots)."""

Utilisation = dict[str, float]
"""``{"mean": fraction of capacity over the run, "p99": 99th percentile of the 1-second samples}``."""


def _stuck_policy(system: str, policy: object, metrics: Metrics, now_ns: int) -> PolicyError | None:
    """Why a run that can go no further stopped, if its policy left requests waiting (``None``: none wait)."""
    prefill, decode = metrics.waiting()
    if prefill or decode:
        return PolicyError(
            f"system {system!r}: policy {type(policy).__name__} left {prefill} request(s) waiting for a prefill "
            f"engine and {decode} for a decode engine at t = {now_ns / 1e9:.3f} s with nothing else in flight: it "
            "assigned them to no engine, so the run cannot go on (assign_prefill and assign_decode must assign work "
            "whenever an engine has room)"
        )
    return None


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
    """One system's run; utilisations per role: the run mean and p99 over every (port or GPU, sample)."""

    system: str
    jct_s: float  # From the first arrival to the last request's end, done or failed (§7.3's JCT when :attr:`complete`).
    turns: int  # Requests admitted (a turn that was never submitted, its agent having failed, is not one).
    agents: int
    ttft_s: dict[str, float]
    ttst_s: dict[str, float]
    tpot_s: dict[str, float]
    snic_read_bytes: dict[str, float]
    snic_util: dict[str, dict[str, Utilisation]]
    """Storage NICs per role and direction: ``rx`` reads (storage → node), ``tx`` writes (node → storage)."""
    cnic_util: dict[str, dict[str, Utilisation]]
    """Compute NICs per role and direction: ``tx`` reads host memory or HBM, ``rx`` writes them."""
    dram_util: dict[str, Utilisation]  # Host DRAM (one port for both directions) per role.
    gpu_util: dict[str, Utilisation]
    """Busy fraction per role: prefill GPUs in forward passes with work, decode GPUs stepping a batch."""
    working_set_bytes: dict[str, float]
    """KV bytes of the live trajectories over the run: time-weighted ``mean`` and ``max``."""
    snic_max_over_mean: float
    event_log_sha256: str
    wall_s: float
    events: int  # Actor events (the event log's records).
    core_events: int  # Events the core handled (its queue's live events).
    metrics: Metrics = field(repr=False)
    core_stats: dict[str, int] = field(default_factory=dict)  # Every counter of ``Core.stats()``.
    extra: dict[str, Any] = field(default_factory=dict)
    timelines: dict[str, dict[str, list[float]]] = field(default_factory=dict, repr=False)
    """Mean utilisation per sample over each role's ports (or GPUs), by port kind → ``{"pe": [...], "de": [...]}``."""
    sample_interval_s: float = SAMPLE_INTERVAL_S
    spec: System | None = field(default=None, repr=False)  # The system that ran (set by :func:`run_system`).
    failed_requests: int = 0  # Requests that ended as failed (lost more often than the scheduler dispatches again).
    redispatches: int = 0  # Times a request was lost to an engine crash and dispatched again.
    turns_planned: int = 0  # The workload's turns (every trajectory's, whole): what a complete run finishes.
    turns_done: int = 0  # Requests that ended with their last token.
    failed_agents: int = 0
    """Agents with a failed request: a closed-loop agent's later turns need its output, so they never run."""
    snic_write_bytes: dict[str, float] = field(default_factory=dict)
    """KV bytes written to storage through each role's storage NICs (the decode nodes' write-backs)."""

    @property
    def turns_not_run(self) -> int:
        """Turns of the workload never submitted, because their agent failed before them."""
        return max(0, self.turns_planned - self.turns)

    @property
    def complete(self) -> bool:
        """Whether the run finished every turn of its workload (no request failed, none left unsubmitted)."""
        return self.failed_requests == 0 and self.turns_done == self.turns_planned

    @property
    def incomplete(self) -> str | None:
        """Why the run is not a whole result (``None`` when :attr:`complete`): its figures cover what finished."""
        if self.complete:
            return None
        return (
            f"{self.system} failed {self.failed_requests:,} request(s) of {self.failed_agents:,} agent(s) "
            f"(of {self.agents:,}); {self.turns_done:,} of {self.turns_planned:,} turns finished"
        )

    @property
    def snic_timeline(self) -> dict[str, list[float]]:
        """The storage NICs' mean read utilisation per sample, ``pe`` and ``de`` (``timelines["snic.rx"]``)."""
        return self.timelines.get("snic.rx", {})

    @property
    def hit_rate(self) -> float:
        """The share of prompt tokens whose KV was loaded from storage (hits) rather than prefilled."""
        prompt = sum(self.metrics.prompt)
        return sum(self.metrics.hit) / prompt if prompt else 0.0

    def summary(self) -> dict[str, Any]:
        """The JSON-able summary (``summary.json``'s ``systems.<name>``): :data:`_SUMMARY_KEYS`, then :attr:`extra`."""
        attr = {"utilisation_sample_s": "sample_interval_s"}
        return {**{key: getattr(self, attr.get(key, key)) for key in _SUMMARY_KEYS}, **self.extra}


_SUMMARY_KEYS: Final = (
    "jct_s", "complete", "incomplete", "turns", "turns_planned", "turns_done", "turns_not_run", "agents",
    "failed_requests", "failed_agents", "redispatches", "hit_rate", "ttft_s", "ttst_s", "tpot_s", "snic_read_bytes",
    "snic_write_bytes", "snic_util", "cnic_util", "dram_util", "gpu_util", "working_set_bytes",
    "utilisation_sample_s", "snic_max_over_mean", "event_log_sha256", "wall_s", "events", "core_events", "core_stats",
)  # fmt: skip


def speedup(baseline: SystemResult, result: SystemResult) -> tuple[float | None, str | None]:
    """``baseline``'s JCT over ``result``'s, or ``None`` and why: neither run may have failed work."""
    for run in (baseline, result):
        if run.incomplete is not None:
            return None, f"{run.incomplete}: its JCT is not the whole workload's"
    if not result.jct_s > 0:
        return None, f"{result.system} has no JCT (no request)"
    return baseline.jct_s / result.jct_s, None


def run_system(
    config: ClusterConfig, system: str | System, trajectories: Sequence[Trajectory], *, seed: int = 0,
    progress: Callable[[Progress], None] | None = None, progress_interval_s: float = 0.25,
    sample_interval_s: float = SAMPLE_INTERVAL_S, trace_path: str | Path | None = None, probe_paths: bool = False,
    plane: str = "core", planes: Mapping[str, PlaneFactory] = PLANES, order_seed: int | None = None,
    message_delay_ns: int = 0, watch: Watch | None = None,
) -> SystemResult:  # fmt: skip
    """Run ``trajectories`` on ``config`` with ``system`` (a :class:`System` or a built-in name) in virtual time.
    ``progress`` gets a :class:`Progress` every ``progress_interval_s`` of wall time; ``sample_interval_s``: utilisation
    sampling; ``trace_path``: a Perfetto trace; ``probe_paths``: time every movement by kind; ``plane``: the data plane
    by name in ``planes``. None changes the event log. ``order_seed``, ``message_delay_ns``: :class:`VirtualDriver`'s
    (other interleavings of one instant's inputs, messages delayed; other event logs). ``watch``: told of the engines'
    observations as they are made (:mod:`~dualpath_emu.cluster.observations`: a checker of one's own), after the
    run's metrics."""
    if not sample_interval_s > 0:
        raise ValueError(f"sample_interval_s: expected a number > 0, got {sample_interval_s}")
    if order_seed is None and config.order_seed is not None:  # the scenario's (order_seed, message_delay_s)
        order_seed, message_delay_ns = config.order_seed, message_delay_ns or round(config.message_delay_s * 1e9)
    if isinstance(system, str):
        system = built_in(system)
    system = with_tiers(system, config)
    system_name = system.name
    d = derived(config)
    interval_ns = max(1, round(sample_interval_s * 1e9))
    core = Core(sample_interval_ns=interval_ns, record_spans=trace_path is not None or probe_paths)
    topology = build_topology(core, config.node, config.pe_nodes, config.de_nodes, config.storage, config.network)
    metrics = Metrics(sample_interval_ns=interval_ns, keep_spans=trace_path is not None)
    booking = Booking(probe=probe_paths)
    cluster = Cluster(config, system, d, topology, system.policy(d.alpha_tokens, d.beta_tokens), booking)
    # What the run reports is derived from what the engines observe: the metrics, the faults' windows (with what
    # the metrics count at each window's edges) and the workload's end, where the driver stops.
    faults = FaultWatch(lambda _t, _end: (len(metrics.redispatch_ns), metrics.failures, len(metrics.read_moved_ns)))
    ended: list[int] = []
    watch = watching(metrics.watch(), Watch({WorkloadEnded: lambda now, _: ended.append(now)}),
                     Watch({FaultChanged: faults.changed, FaultPlanned: faults.planned}),
                     *([] if watch is None else [watch]))  # fmt: skip
    writer = EventLogWriter(formats=LINE_FORMATS)
    checker = EventLogChecker()

    def sink(records: list[tuple[int, str, Observed]], first: int) -> None:
        writer.write_observed(records, first)
        checker.feed_observed(records, first)

    report = None
    if progress is not None:  # smaller chunks: the sink is where progress is looked at
        report = _Reporter(system_name, progress, progress_interval_s, metrics, core, trajectories)
        driver = VirtualDriver(
            core, sink=report.wrap(sink), chunk=4096, plane=planes[plane], order_seed=order_seed,
            message_delay_ns=message_delay_ns, watch=watch,
        )  # fmt: skip
    else:
        driver = VirtualDriver(
            core, sink=sink, plane=planes[plane], order_seed=order_seed, message_delay_ns=message_delay_ns,
            watch=watch,
        )  # fmt: skip
    for name in engine_names(config):
        driver.add(
            build_engine(name, cluster, driver.outbox(name), driver.plane, trajectories=lambda: trajectories, seed=seed)
        )
    driver.send("client", Start())

    started = time.perf_counter()
    # A run allocates millions of short-lived objects and creates almost no cycles: what exists now is frozen
    # out of the cyclic collector, and collections are rare (they took 3-4% of a run's CPU).
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(100_000, 50, 1000)
    try:
        driver.run(lambda: bool(ended), progress_watch(config, metrics, core, faults, system_name))
    except DeadlockError:
        stuck = _stuck_policy(system_name, cluster.policy, metrics, core.now_ns)
        if stuck is None:
            raise
        raise stuck from None
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    wall_s = time.perf_counter() - started
    if report is not None:
        report.now()
    lost = metrics.unfinished()
    if lost:
        raise LostRequestsError(f"{system_name}: {len(lost)} admitted request(s) never ended, e.g. {lost[:5]}")
    end_ns = core.now_ns
    if config.faults.any:
        clear_faults(core)  # the run is over, its faults with it: what they still hold back may finish
    driver.drain()  # the last block write-backs, so that every byte is accounted
    core_report = CoreReport.of(core, topology, min(end_ns, core.now_ns))
    violations = checker.finish() + check_core_bytes(core_report, booking.bytes, booking.transfers)
    if violations:
        raise InvariantError(f"{system_name}: " + "; ".join(violations))
    result = build_result(system_name, core_report, metrics, config, topology, len(trajectories), writer.sha256(),
                          wall_s, driver.event_count, end_ns, turns_planned=sum(len(t) for t in trajectories))  # fmt: skip
    result.spec = system
    result.extra.update({"mode": "virtual", "processes": 1})
    if config.faults.any:
        result.extra.update(fault_summary(faults.records, metrics.done_ns, end_ns, metrics.redispatch_ns,
                                          metrics.failed_ns, metrics.read_moved_ns))  # fmt: skip
    if probe_paths:
        measure_spans(booking, topology, core.spans())
        result.extra["paths"] = {kind: stats.summary() for kind, stats in sorted(booking.measured.items())}
    if trace_path is not None:
        write_trace(trace_path, core, config, topology, metrics, system_name, result.extra.get("faults", ()), end_ns)
    return result


def build_result(
    name: str, report: CoreReport, metrics: Metrics, config: ClusterConfig, topology: Topology, agents: int,
    sha256: str, wall_s: float, events: int, end_ns: int, start_ns: int = 0, *, turns_planned: int,
) -> SystemResult:  # fmt: skip
    """A run's :class:`SystemResult` from the core's report and the metrics, over [``start_ns``, ``end_ns``]."""
    end_s = (end_ns - start_ns) / 1e9 or 1e-9
    until_ns = min(end_ns, report.until_ns)

    def util(role: str, kind: str) -> Utilisation:
        """Bytes over capacity × the run (all that moved, the last write-backs included), and the p99."""
        ports = ports_of(topology, role, kind)
        capacity = sum(report.ports[p].rate for p in ports) * end_s
        mean = sum(report.port_bytes(p) for p in ports) / capacity if capacity > 0 else 0.0
        return {"mean": mean, "p99": report.p99[kind][role]}

    gpus = config.node.gpus
    gpu_units = {
        role: [n.index * gpus + g for n in topology.nodes if n.role == role for g in range(gpus)] for role in ROLES
    }
    timelines = {kind: dict(by_role) for kind, by_role in report.timelines.items()}
    timelines["gpu"] = {role: metrics.gpu_busy[role].timeline(gpu_units[role], until_ns) for role in ROLES}
    other: dict[int, float] = {}  # background traffic's bytes through each port it targets (not the engines' KV)
    for pairs in topology.background:
        for source, target in pairs:
            other[target] = other.get(target, 0.0) + report.kv_bytes(source, KV_LANE)
    snic = {role: [report.kv_bytes(p, KV_LANE) - other.get(p, 0.0) for p in ports_of(topology, role, "snic.rx")]
            for role in ROLES}  # fmt: skip
    every_snic = snic["pe"] + snic["de"]
    mean = sum(every_snic) / len(every_snic) if every_snic else 0.0
    result = SystemResult(
        system=name, jct_s=metrics.jct_s(), turns=len(metrics), agents=agents, failed_requests=metrics.failed_count(),
        failed_agents=metrics.failed_agents(), turns_planned=turns_planned, turns_done=metrics.done_count(),
        redispatches=len(metrics.redispatch_ns), ttft_s=percentiles(metrics.ttft_s()).as_dict(),
        ttst_s=percentiles(metrics.ttst_s()).as_dict(), tpot_s=percentiles(metrics.tpot_s()).as_dict(),
        snic_read_bytes={role: sum(v) for role, v in snic.items()},
        snic_write_bytes={role: sum(report.kv_bytes(p, KV_LANE) - other.get(p, 0.0) for p in ports_of(topology, role, "snic.tx"))
                          for role in ROLES},
        snic_util={role: {d: util(role, f"snic.{d}") for d in ("rx", "tx")} for role in ROLES},
        cnic_util={role: {d: util(role, f"cnic.{d}") for d in ("tx", "rx")} for role in ROLES},
        dram_util={role: util(role, "dram") for role in ROLES},
        gpu_util={r: metrics.gpu_busy[r].utilisation(gpu_units[r], until_ns, since_ns=start_ns) for r in ROLES},
        working_set_bytes=metrics.working_set_bytes(derived(config).kv_bytes_per_token, end_ns, since_ns=start_ns),
        snic_max_over_mean=max(every_snic) / mean if mean > 0 else 0.0, event_log_sha256=sha256, wall_s=wall_s,
        events=events, core_events=report.stats["queue_events"], core_stats=dict(report.stats), metrics=metrics,
        timelines=timelines, sample_interval_s=(report.sample_interval_ns or metrics.gpu_busy["pe"].interval_ns) / 1e9,
    )  # fmt: skip
    splits = metrics.read_on_de.count(READ_SIDES.index("split"))
    if splits:  # hits read on both sides (a split read, e.g. dualpath-split)
        result.extra["split_reads"] = splits
    if metrics.kv:  # a bounded KV tier: what it held, dropped and found
        result.extra["kv"] = {tier: stats.summary() for tier, stats in metrics.kv.items()}
    return result


class _Reporter:
    """Calls a progress callback from the event sink, at most every ``interval_s`` of wall time."""

    def __init__(self, system: str, callback: Callable[[Progress], None], interval_s: float, metrics: Metrics,
                 core: Core, trajectories: Sequence[Trajectory]) -> None:  # fmt: skip
        self.system, self.callback, self.interval_s = system, callback, interval_s
        self.metrics, self.core = metrics, core
        self.total = sum(len(t) for t in trajectories)
        self.started = time.perf_counter()
        self.next_s = self.started + interval_s

    def wrap(self, sink: EventSink) -> EventSink:
        def reporting(events: list[tuple[int, str, Observed]], first: int) -> None:
            sink(events, first)
            if time.perf_counter() >= self.next_s:
                self.now()

        return reporting

    def now(self) -> None:
        """Report now."""
        wall = time.perf_counter()
        self.next_s = wall + self.interval_s
        turns_done = self.metrics.turns_done  # a count, not a scan
        self.callback(Progress(self.system, turns_done, self.total, self.core.now_ns / 1e9, wall - self.started))
