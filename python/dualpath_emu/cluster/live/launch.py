"""Starting a live run: its directory written (the description, the trajectories, the run scenario
``run.toml``), its processes launched on this host (:func:`run_live`) or prepared to be started by hand on
several (:func:`prepare_live`), then collected (:mod:`.collect`)."""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import json
import os
import shlex
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dualpath_emu.cluster.assemble import engine_names
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.live.app import (
    DEFAULT_BYTE_SCALE,
    DESCRIPTION,
    PROGRESS_FILE,
    RUN_SCENARIO,
    STORAGE_DIR,
    TRAJECTORIES,
    ClusterApplication,
    registry,
)
from dualpath_emu.cluster.live.collect import collect, describe
from dualpath_emu.cluster.live.host import compare_with_model
from dualpath_emu.cluster.live.placement import check_restart, host_of, placement
from dualpath_emu.cluster.live.wire import config_to_wire, system_to_wire, toml_text, write_private
from dualpath_emu.cluster.run import Progress, SystemResult, run_system
from dualpath_emu.cluster.systems import System
from dualpath_emu.errors import UsageError
from dualpath_emu.host.storage import remove_blocks, run_storage
from dualpath_emu.runtime.scenario import DATAPLANE_PROCESS, load_run_scenario
from dualpath_emu.workload.trajectory import Trajectory, write_trajectories

__all__ = [
    "FULL_DISK_BYTES", "LIVE_TEMP_PREFIX", "LiveOptions", "full_disk", "host_commands", "prepare_live", "run_live",
    "write_run",
]  # fmt: skip

LIVE_TEMP_PREFIX: Final = "dualpath-emu-live-"
"""The temporary run directory of a live run given none (``dualpath-emu run --mode realtime``)."""
FULL_DISK_BYTES: Final = 1 << 20
"""A failed live run with less than this free in its run or KV directory is reported as a full disk."""
_OUT_OF_SPACE: Final = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


@dataclass(frozen=True)
class LiveOptions:
    """How a live run runs (``dualpath-emu run --mode realtime``'s options)."""

    time_scale: float = 1.0
    placement_kind: str = "groups"
    transport: str = "ipc"
    host: str = "127.0.0.1"
    """The address to bind; in a run prepared by hand, the host of a process no ``hosts`` pattern names."""
    timeout_s: float = 86_400.0
    metrics_port: int = -1
    """≥ 0: live Prometheus metrics on 127.0.0.1 from the client's process (0: a free port; :mod:`.metrics`)."""
    backend: str = "model"  # ``"host"`` moves real bytes (:mod:`dualpath_emu.host`).
    byte_scale: float = DEFAULT_BYTE_SCALE  # Host backend: real bytes per modelled byte.
    storage_dir: str = ""
    """Host backend: where the KV blocks go (default: the run directory's ``storage``, removed at the end)."""
    transfer_engine: str = "zmq"
    restart_crashed: bool = False
    """An engine group's process that dies is started again in its place (:func:`.placement.restartable`)."""
    hosts: Sequence[tuple[str, str]] = ()
    """By hand: ``(pattern, host)``, each process on the host of the first pattern matching its name."""
    port_base: int = 47_100
    """By hand: the processes' tcp ports from here (the data plane's first; byte channels from ``+ 50``)."""


def _options(options: LiveOptions | None, settings: Mapping[str, Any]) -> LiveOptions:
    return dataclasses.replace(options or LiveOptions(), **settings)


def run_scenario(
    options: LiveOptions, seed: int, processes: Sequence[tuple[str, Sequence[str]]], restart: Sequence[str] = (),
    endpoints: Mapping[str, str] | None = None, data_endpoints: Mapping[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The run scenario of one live cluster run, as data; ``endpoints`` fix where processes bind."""
    o, host = options, options.backend == "host"
    top: dict[str, Any] = {"app": "cluster", "seed": seed, "mode": "realtime", "latency_s": 0.0,
                           "time_scale": o.time_scale, "transport": o.transport, "host": o.host,
                           "timeout_s": o.timeout_s, "backend": o.backend}  # fmt: skip
    if endpoints and DATAPLANE_PROCESS in endpoints:
        top["dataplane_endpoint"] = endpoints[DATAPLANE_PROCESS]
    if restart:
        top["restart_crashed"] = list(restart)
    top["cluster"] = {"description": DESCRIPTION, "metrics_port": o.metrics_port}
    if host:
        top["cluster"] |= {"byte_scale": o.byte_scale, "storage_dir": o.storage_dir,
                           "transfer_engine": o.transfer_engine}  # fmt: skip
    top["process"] = [{"name": name, "actors": list(actors),
                       **({"endpoint": endpoints[name]} if endpoints and name in endpoints else {}),
                       **({"data_endpoint": data_endpoints[name]} if data_endpoints and name in data_endpoints else {})}
                      for name, actors in processes]  # fmt: skip
    return top


def _write(
    run_dir: Path, config: ClusterConfig, system: System, trajectories: Sequence[Trajectory], seed: int,
    scenario: Mapping[str, Any] | None = None,
) -> None:  # fmt: skip
    """The run directory (user-only): the description, the trajectories and, given, the run scenario."""
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)
    description = {"config": config_to_wire(config), "system": system_to_wire(system), "seed": seed,
                   "agents": len(trajectories), "turns": sum(len(t) for t in trajectories)}  # fmt: skip
    write_private(run_dir / DESCRIPTION, json.dumps(description, indent=1).encode())
    write_trajectories(run_dir / TRAJECTORIES, trajectories)
    os.chmod(run_dir / TRAJECTORIES, 0o600)
    if scenario is not None:
        write_private(run_dir / RUN_SCENARIO, toml_text(scenario).encode())


def write_run(
    config: ClusterConfig, system: System, trajectories: Sequence[Trajectory], *, run_dir: Path, seed: int = 0,
    options: LiveOptions | None = None, **settings: Any,
) -> Path:  # fmt: skip
    """Write a live run of the model backend into ``run_dir`` without starting it; returns ``run.toml``."""
    o = _options(options, settings)
    processes = placement(engine_names(config), o.placement_kind)
    restart = check_restart(o.backend, processes) if o.restart_crashed else []
    _write(run_dir, config, system, trajectories, seed, run_scenario(o, seed, processes, restart))
    return run_dir / RUN_SCENARIO


def prepare_live(
    config: ClusterConfig, system: System, trajectories: Sequence[Trajectory], *, run_dir: Path, seed: int = 0,
    options: LiveOptions | None = None, **settings: Any,
) -> list[tuple[str, str, str]]:  # fmt: skip
    """Write a live run to be started by hand, on one host or several (docs/live.md, Several hosts): the run scenario
    with every process's tcp endpoint (its host by :func:`~.placement.host_of`) and the run's CURVE keys. Returns
    ``(host, process, command)`` in start order: the data plane first, the client's process last. On the host backend
    each process also gets a byte channel endpoint, and ``storage_dir`` must be a directory every host mounts."""
    from dualpath_emu.runtime.run_setup import prepare

    o = _options(options, settings)
    host = o.backend == "host"
    if host and not o.storage_dir:
        raise ValueError("a host-backend run started by hand needs [host] storage_dir: a directory every host "
                         "mounts (the KV blocks one host writes, another reads)")  # fmt: skip
    o = dataclasses.replace(o, storage_dir=run_storage(o.storage_dir), transport="tcp", metrics_port=-1)
    processes = placement(engine_names(config), o.placement_kind)
    restart = check_restart(o.backend, processes) if o.restart_crashed else []
    names = ([] if host else [DATAPLANE_PROCESS]) + [name for name, _ in processes]
    for pattern, _ in o.hosts:  # a pattern that names no process would leave it on the default host unsaid
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise UsageError(f"--process-host {pattern[:100]!r}: matches no process of this run (its "
                             f"processes: {', '.join(names)}; patterns are shell-style and case-sensitive)")  # fmt: skip

    def endpoints(first: int) -> dict[str, str]:
        return {name: f"tcp://{host_of(name, o.hosts, o.host)}:{first + i}" for i, name in enumerate(names)}

    scenario = run_scenario(o, seed, processes, restart, endpoints(o.port_base),
                            endpoints(o.port_base + 50) if host else None)  # fmt: skip
    _write(run_dir, config, system, trajectories, seed, scenario)
    out = []
    for command in prepare(load_run_scenario(run_dir / RUN_SCENARIO, registry()), run_dir):
        words = shlex.split(command)
        name = words[words.index("--process") + 1]
        out.append((host_of(name, o.hosts, o.host), name, command))
    return out


def host_commands(run_dir: Path, commands: Sequence[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """One command per host for :func:`prepare_live`'s processes, in start order (the client's host last)."""
    by_host: dict[str, list[str]] = {}
    for host, name, _ in commands:
        by_host.setdefault(host, []).append(name)
    order = sorted(by_host, key=lambda h: ("client" in by_host[h], DATAPLANE_PROCESS in by_host[h]))
    scenario = shlex.quote(str(run_dir / RUN_SCENARIO))
    return [(host, f"dualpath-emu launch {scenario} --run-dir {shlex.quote(str(run_dir))} --only "
                   f"{','.join(by_host[host])}") for host in order]  # fmt: skip


def run_live(
    config: ClusterConfig, system: System, trajectories: Sequence[Trajectory], *, run_dir: Path, seed: int = 0,
    options: LiveOptions | None = None, on_start: Callable[[str, int], None] | None = None,
    progress: Callable[[Progress], None] | None = None, **settings: Any,
) -> SystemResult:  # fmt: skip
    """Run ``system`` on ``config`` live (``options``, or ``settings``: :class:`LiveOptions` fields): write ``run_dir``,
    start and await the processes, merge and check their parts."""
    from dualpath_emu.runtime.launcher import LaunchError, launch, mark_owner, sweep_orphans

    o = _options(options, settings)
    processes = placement(engine_names(config), o.placement_kind)
    restart = check_restart(o.backend, processes) if o.restart_crashed else []
    host, given = o.backend == "host", o.storage_dir
    o = dataclasses.replace(o, storage_dir=run_storage(given))
    blocks = Path(o.storage_dir) if o.storage_dir else run_dir / STORAGE_DIR
    _write(run_dir, config, system, trajectories, seed, run_scenario(o, seed, processes, restart))
    if host:
        # The KV blocks of runs whose launcher was killed (SIGKILL skips the clean-up below): removed here,
        # where this run's would be; then this run's folder, marked as this launcher's.
        if given:
            sweep_orphans("run-*", Path(given))
        else:
            sweep_orphans(STORAGE_DIR, run_dir)
            sweep_orphans(f"{LIVE_TEMP_PREFIX}*/{STORAGE_DIR}")
        blocks.mkdir(mode=0o700, parents=True, exist_ok=True)
        mark_owner(blocks)
    run = load_run_scenario(run_dir / RUN_SCENARIO, registry())
    assert isinstance(run.app, ClusterApplication)
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
        error.full_disk = full_disk(run_dir, (Path(given) if given else blocks) if host else None, str(error))
        raise
    finally:
        if host:
            remove_blocks(blocks)
    if host:  # what the model says of the same run, kind by kind (measured vs modelled)
        compare_with_model(result, run_system(config, system, trajectories, seed=seed, probe_paths=True))
    result.extra.update(describe(run, o.placement_kind, transport=o.transport))
    result.wall_s = launched.wall_s
    return result


def full_disk(run_dir: Path, blocks_dir: Path | None, message: str) -> str | None:
    """Why a failed live run stopped, if a disk was full (its run or KV directory, or a process said so)."""
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
