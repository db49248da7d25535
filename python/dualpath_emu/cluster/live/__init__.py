"""A live run of the cluster (``dualpath-emu run --mode realtime``; docs/live.md): the same actors as in virtual time,
placed in OS processes (:mod:`.placement`), paced in wall-clock time.

The run's directory holds all that its processes need (:mod:`.wire`): ``run.toml`` (the run scenario, ``app =
"cluster"``), ``cluster.json`` (the configuration, the system, the seed) and ``trajectories.jsonl`` (the workload, read
by the client's process alone); on several hosts, a copy of it. :mod:`.app` holds the application the processes run,
:mod:`.launch` writes and starts a run, :mod:`.collect` merges and checks what its processes wrote, :mod:`.host` is the
cluster's side of the host backend and :mod:`.metrics` the live Prometheus metrics."""

from dualpath_emu.cluster.live.app import ClusterApplication, registry
from dualpath_emu.cluster.live.collect import collect, collect_dir
from dualpath_emu.cluster.live.host import HOST
from dualpath_emu.cluster.live.launch import (
    FULL_DISK_BYTES,
    LIVE_TEMP_PREFIX,
    LiveOptions,
    host_commands,
    prepare_live,
    run_live,
    write_run,
)
from dualpath_emu.cluster.live.placement import PLACEMENTS, placement, restartable
from dualpath_emu.cluster.live.wire import config_from_wire, config_to_wire, system_from_wire, system_to_wire

__all__ = [
    "FULL_DISK_BYTES", "HOST", "LIVE_TEMP_PREFIX", "PLACEMENTS", "ClusterApplication", "LiveOptions", "collect",
    "collect_dir", "config_from_wire", "config_to_wire", "host_commands", "placement", "prepare_live", "registry",
    "restartable", "run_live", "system_from_wire", "system_to_wire", "write_run",
]  # fmt: skip
