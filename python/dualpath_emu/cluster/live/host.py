"""The cluster's side of the host backend (:mod:`dualpath_emu.host`, which knows nothing of the cluster): each
process's :class:`~dualpath_emu.host.plane.HostDataPlane` built from the cluster's topology, its share of the
run's report, and the merged report of every share with the model's figures beside it."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from dualpath_emu._core import Core
from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.core_report import CoreReport
from dualpath_emu.cluster.identity import GroupId
from dualpath_emu.cluster.run import SystemResult
from dualpath_emu.cluster.systems import with_tiers
from dualpath_emu.cluster.topology import Topology
from dualpath_emu.config import ScenarioError
from dualpath_emu.host.paths import PathStats, real_bytes_by_kind
from dualpath_emu.runtime.app import Backend, PlaneRequest

if TYPE_CHECKING:
    from dualpath_emu.cluster.live.app import ClusterApplication
    from dualpath_emu.host.plane import HostDataPlane, HostPlan
    from dualpath_emu.runtime.scenario import RunScenario

__all__ = ["HOST", "compare_with_model", "host_part", "host_report"]

MODELLED_ON_HOST: Final = ("H2D", "D2H")
"""The kinds of transfer a host run models (on each process's core) instead of moving."""


def host_plane(request: PlaneRequest) -> HostDataPlane:
    """The host backend's plane of a process: its own core, moving its nodes' real bytes."""
    from dualpath_emu.cluster.live.app import STORAGE_DIR, ClusterApplication
    from dualpath_emu.host.plane import HostDataPlane
    from dualpath_emu.host.storage import BlockStore
    from dualpath_emu.host.transport import ByteChannel

    app, scenario, description = request.app, request.scenario, request.description
    if not isinstance(app, ClusterApplication):
        raise ScenarioError(f'application {app.name!r} has no host backend (backend = "host")')
    if app.config.network.background:
        from dualpath_emu.cluster.scenario import NO_HOST_BACKGROUND

        raise ScenarioError(f"[[network.background]]: {NO_HOST_BACKGROUND}")
    origin = description.clock_origin_ns if description.clock_origin_ns is not None else time.time_ns()
    elapsed = max(0, time.time_ns() - origin)
    core = Core(clock="wall", time_scale=scenario.time_scale, wall_elapsed_ns=elapsed, **app.core_options())
    app.build_core(core)
    plan = host_plan(app, scenario)
    folder = Path(app.storage_dir) if app.storage_dir else Path(request.run_dir) / STORAGE_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    drives = request.process in plan.process_of_node
    # Every process has the store: its nodes' reads and writes, or the scheduler's evictions (a bounded store).
    store = BlockStore(folder, max(1, round(plan.block_bytes * plan.byte_scale)))
    peers = dict(description.data_endpoints)  # itself too: its nodes may send to each other (one process)
    # Mooncake's engine has no authentication: only processes whose nodes move KV start one (not the
    # scheduler's or the client's, whose channel carries the end-of-run stop alone).
    engine = app.transfer_engine if drives else "zmq"
    channel = ByteChannel(request.process, description.data_endpoints[request.process], peers, request.keys,
                          engine=engine)  # fmt: skip
    app.host = HostDataPlane(core, plan, request.process, channel, store)
    return app.host


HOST: Final = Backend("host", host_plane, shares_core=False)
"""The host backend: each process drives its own core and moves real bytes."""


def host_plan(app: ClusterApplication, scenario: RunScenario) -> HostPlan:
    """What :class:`~dualpath_emu.host.plane.HostDataPlane` needs of the cluster, as plain data."""
    from dualpath_emu.host.plane import HostPlan

    process_of = {actor: spec.name for spec in scenario.processes for actor in spec.actors}
    group_of: dict[int, str] = {}
    for group in app.prefill_groups():
        for node in group:
            group_of[node] = GroupId("pe", group[0]).name
    for n in app.topology.de_nodes:
        group_of[n.index] = GroupId("de", n.index).name
    rates = {p: app.scratch.port_rate(p) for p in range(app.scratch.port_count)}
    owners = tuple(process_of[group_of[n.index]] for n in app.topology.nodes)
    block_bytes = BLOCK_TOKENS * app.derived.kv_bytes_per_token
    pooled = with_tiers(app.system, app.config).pool
    pool_blocks = app.config.kv_pool.tier(len(app.topology.nodes)).capacity_bytes // block_bytes if pooled else 0
    vl = app.config.network.cnic_vl
    cnic_vl = (vl.max_vls, vl.high_limit, vl.vlarb_high, vl.vlarb_low) if vl is not None else None
    return HostPlan(app.topology, owners, rates, block_bytes, app.byte_scale, pool_blocks, cnic_vl)


def host_part(host: HostDataPlane, topology: Topology) -> dict[str, Any]:
    """A host process's share of the run: its core's report, the real bytes per (port, lane), its files and channel."""
    host.core.poll()
    return {
        "core": CoreReport.of(host.core, topology, host.core.now_ns).to_wire(),
        "moved": [[port, lane, size] for (port, lane), size in host.moved.items()],
        "store": host.store.stats() if host.store is not None else None,
        "pool": host.dram_pool.stats() if host.dram_pool is not None else None,
        "channel": host.channel.stats.to_wire(),
        "measured": {what: stats.to_wire() for what, stats in host.measured.items()},
        "failure": repr(host.failure) if host.failure is not None else None,
        "transfer_engine_listening": host.channel.listening,
    }


def host_report(run_dir: Path, processes: Sequence[str], app: ClusterApplication) -> tuple[CoreReport, dict[str, Any]]:
    """A host run's report: each process's core, the real work per port and lane, the real bytes by kind."""
    reports, moved = [], Counter[tuple[int, int]]()
    store: Counter[str] = Counter()
    channel: Counter[str] = Counter()
    pool: Counter[str] = Counter()
    pool_peaks: list[int] = []
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
        if part.get("pool") is not None:
            pool.update({k: v for k, v in part["pool"].items() if k not in ("peak_blocks", "stride")})
            pool_peaks.append(int(part["pool"]["peak_blocks"]) * int(part["pool"]["stride"]))
        if part["failure"]:
            violations.append(f"process {name!r}: real work failed: {part['failure']}")
    if store["mismatched_blocks"]:
        violations.append(f"{store['mismatched_blocks']} block(s) read back differed from what was written")
    if pool["mismatched_blocks"]:
        violations.append(
            f"{pool['mismatched_blocks']} block(s) dropped or read from the DRAM pool were missing or wrong"
        )
    if channel["mismatched_bytes"]:
        violations.append(f"{channel['mismatched_bytes']} byte(s) arrived differing from what was sent")
    first = reports[0]
    ports = []
    for i, port in enumerate(first.ports):
        lanes = range(len(port.completed_bytes))
        done = [sum(r.ports[i].completed_bytes[lane] for r in reports) + moved.get((i, lane), 0) for lane in lanes]
        flowed = [sum(r.ports[i].fluid_bytes[lane] for r in reports) + moved.get((i, lane), 0) for lane in lanes]
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
        "discarded_blocks": store["discarded_blocks"],
        "network_bytes_sent": channel["sent_bytes"], "network_bytes_verified": channel["verified_bytes"],
        "network_bytes_mismatched": channel["mismatched_bytes"], "rejected_frames": channel["rejected"],
        "real_bytes_by_kind": real_bytes_by_kind(measured),
        **({"dram_pool": {
            "blocks_put": pool["put_blocks"], "blocks_dropped": pool["dropped_blocks"],
            "blocks_read_checked": pool["read_blocks"], "mismatched_blocks": pool["mismatched_blocks"],
            "blocks_held_at_end": pool["held_blocks"], "peak_block_bytes": sum(pool_peaks),
            "memory_bytes": pool["peak_memory_bytes"],
        }} if pool_peaks else {}),
        "paths": {what: stats.summary() for what, stats in sorted(measured.items())},
        "violations": violations,
    }  # fmt: skip
    return report, summary


def compare_with_model(result: SystemResult, model: SystemResult) -> None:
    """The model's figures (a virtual run, probed by kind) next to a host run's: JCT, count and mean per kind."""
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
