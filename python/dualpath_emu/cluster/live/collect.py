"""Collecting a finished live run: every process's part (its observations for the metrics, ledger, event log;
every incarnation of a process started again in place of a dead one) merged and checked, with how close to its
model the run kept (timeliness) and which processes were restarted.

An end a dead incarnation observed but never told anyone of (it died between the two) is void when the
scheduler dispatched the request again afterwards. The dead one's tape and ledger died with it, so the
bytes check counts, for it, what the data-plane service tallied it asked for (``replaced`` in its report)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from dualpath_emu.cluster.core_report import CoreReport
from dualpath_emu.cluster.faults import FaultWatch, fault_summary, sorted_counts
from dualpath_emu.cluster.invariants import EventLogChecker, InvariantError, check_core_bytes
from dualpath_emu.cluster.live.app import RUN_SCENARIO, STORAGE_DIR, ClusterApplication, registry
from dualpath_emu.cluster.live.host import host_report
from dualpath_emu.cluster.metrics import Metrics
from dualpath_emu.cluster.observations import Ended, Redispatched
from dualpath_emu.cluster.observations import from_wire as observation_from_wire
from dualpath_emu.cluster.observations import parse as parse_observation
from dualpath_emu.cluster.run import LostRequestsError, SystemResult, build_result
from dualpath_emu.config import ScenarioError
from dualpath_emu.host.storage import remove_blocks
from dualpath_emu.runtime.app import SERVICE_REPORT
from dualpath_emu.runtime.eventlog import EventLogWriter, read_events
from dualpath_emu.runtime.lag import LagStats
from dualpath_emu.runtime.launcher import RESTARTS_SUFFIX
from dualpath_emu.runtime.scenario import DATAPLANE_PROCESS, RunScenario, incarnation_stem, load_run_scenario

__all__ = ["collect", "collect_dir", "describe", "last_incarnation", "read_part"]


def read_part(path: Path) -> tuple[list[tuple[int, Any]], dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """A process's share (:meth:`~.app.ClusterApplication.write_part`): what its engines observed for the metrics
    ``(t_ns, record)``, bytes and transfers booked."""
    data = msgpack.unpackb(path.read_bytes(), strict_map_key=False)
    observed = [observation_from_wire(item) for item in data["observed"]]
    booked = {(port, lane): size for port, lane, size, _ in data["booked"]}
    transfers = {(port, lane): count for port, lane, _, count in data["booked"]}
    return observed, booked, transfers


def collect(run: RunScenario, run_dir: Path, wall_s: float) -> tuple[SystemResult, Metrics]:
    """Merge and check a finished live run's parts: requests end once, pools hold, every byte moved."""
    app = run.app
    assert isinstance(app, ClusterApplication)
    processes = [p.name for p in run.processes]
    last = {name: last_incarnation(run_dir, name) for name in processes}
    observed: list[tuple[int, Any]] = []
    booked, transfers = Counter[tuple[int, int]](), Counter[tuple[int, int]]()
    for name in processes:
        records, by_port, counts = read_part(run_dir / f"{incarnation_stem(name, last[name])}.part")
        observed += records
        booked.update(by_port)
        transfers.update(counts)
    if any(last.values()):  # what each dead incarnation asked the core to move, as the data plane tallied it
        service = json.loads((run_dir / f"{DATAPLANE_PROCESS}.json").read_text())
        for replaced in service["report"].get("replaced", []):
            for port, lane, size, count in replaced["booked"]:
                booked[(port, lane)] += size
                transfers[(port, lane)] += count
    merged = Metrics.replay(observed, app.sample_interval_ns)  # derived from what every process observed
    host: dict[str, Any] | None = None
    if run.backend_name == "host":
        report, host = host_report(run_dir, processes, app)
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
        done = [t - start_ns if t >= 0 else t for t in merged.done_ns]
        redispatch = [t - start_ns for t in merged.redispatch_ns]
        failed = [t - start_ns if t >= 0 else t for t in merged.failed_ns]
        moved = [t - start_ns for t in merged.read_moved_ns]
        faults = FaultWatch(sorted_counts(redispatch, failed, moved))  # the windows, as a virtual run builds them
        for t, _, _, kind, summary in events:
            if kind == "fault":
                faults.changed(t - start_ns, parse_observation(kind, summary))
        result.extra.update(fault_summary(faults.records, done, end_ns - start_ns, redispatch, failed, moved))
    if host is not None:
        result.extra["host"] = host
    return result, merged


def last_incarnation(run_dir: Path, name: str) -> int:
    """The last incarnation of process ``name`` whose files are in ``run_dir`` (0: never restarted)."""
    last = 0
    for n in range(1, 1 << 16):
        stem = incarnation_stem(name, n)
        if not any((run_dir / f"{stem}{suffix}").exists() for suffix in (".events", ".json", ".out")):
            break
        last = n
    return last


def _restarts(run_dir: Path, processes: Sequence[str], last: Mapping[str, int], start_ns: int) -> list[dict[str, Any]]:
    """Which processes were started again in place of one that died, and when (wall and emulated)."""
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
    """How close to its model the run kept: lags, clock handshakes and each process's CPU time."""

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


def collect_dir(run_dir: Path) -> tuple[SystemResult, ClusterApplication]:
    """:func:`collect` for a run started by hand whose processes' files were gathered in ``run_dir``."""
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
    result.extra.update(describe(run, "by hand"))
    if run.backend_name == "host":  # the run is over: its KV blocks go (in the shared directory, only its files)
        remove_blocks(Path(app.storage_dir) if app.storage_dir else run_dir / STORAGE_DIR)
    return result, app


def describe(run: RunScenario, placement: str, **more: str) -> dict[str, Any]:
    """How a live run ran, for its result's ``extra``: its processes and their actors."""
    service: dict[str, list[str]] = {DATAPLANE_PROCESS: []} if run.uses_dataplane else {}
    return {"mode": "realtime", "time_scale": run.time_scale, "placement": placement, **more,
            "backend": run.backend_name,
            "processes": len(run.processes) + len(service),
            "process_actors": {**service, **{p.name: list(p.actors) for p in run.processes}}}  # fmt: skip
