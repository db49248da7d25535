"""The one place a cluster is put together, for every driver and placement: :func:`engine_names` names the
engines of a configuration, :func:`build_engine` builds one from its name, the process's
:class:`~dualpath_emu.cluster.context.Cluster` and the outbox and data plane its driver hands it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dualpath_emu.cluster.background import BACKGROUND, BackgroundLoad
from dualpath_emu.cluster.client import Client
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.decode import DecodeGroup
from dualpath_emu.cluster.engines import ClusterEngine
from dualpath_emu.cluster.fault_injector import FaultInjector
from dualpath_emu.cluster.identity import GroupId
from dualpath_emu.cluster.prefill import PrefillGroup
from dualpath_emu.cluster.scheduler import Scheduler
from dualpath_emu.runtime.engine import DataPlane, Outbox
from dualpath_emu.workload.trajectory import Trajectory

__all__ = ["build_engine", "engine_names", "prefill_groups"]


def prefill_groups(config: ClusterConfig) -> list[list[int]]:
    """The prefill EP groups: ``prefill_ep_nodes`` consecutive prefill nodes each."""
    ep = config.prefill_ep_nodes
    return [list(range(first, min(first + ep, config.pe_nodes))) for first in range(0, config.pe_nodes, ep)]


def engine_names(config: ClusterConfig) -> list[str]:
    """The engines in start order: client, scheduler, a prefill group per EP group, a decode group per node."""
    pe = [GroupId("pe", group[0]).name for group in prefill_groups(config)]
    faults = ["faults"] if config.faults.any else []  # the fault injector, only where there are faults
    background = [BACKGROUND] if config.network.background else []  # only where there is background traffic
    de = [GroupId("de", config.pe_nodes + i).name for i in range(config.de_nodes)]
    return ["client", "scheduler", *pe, *de, *faults, *background]


def build_engine(name: str, cluster: Cluster, out: Outbox, plane: DataPlane, *,
                 trajectories: Callable[[], Sequence[Trajectory]], seed: int,
                 restarted: bool = False) -> ClusterEngine:  # fmt: skip
    """The engine called ``name`` (one of :func:`engine_names`); ``trajectories`` is asked for only by the client's;
    ``restarted``: an engine group's new process in place of one that died (it starts by saying so)."""
    if name == "client":
        return Client(cluster, trajectories(), seed, out, plane)
    if name == "scheduler":
        return Scheduler(cluster, out, plane)
    if name == "faults" and cluster.config.faults.any:
        return FaultInjector(cluster, out, plane, seed)
    if name == BACKGROUND and cluster.config.network.background:
        return BackgroundLoad(cluster, out, plane)
    group_id, config = GroupId.parse(name), cluster.config
    if group_id is not None and group_id.prefill:
        for group in prefill_groups(config):
            if group_id.node == group[0]:
                return PrefillGroup(cluster, group, out, plane, restarted=restarted)
    elif group_id is not None and config.pe_nodes <= group_id.node < config.pe_nodes + config.de_nodes:
        return DecodeGroup(cluster, group_id.node, out, plane, restarted=restarted)
    raise KeyError(f"the cluster has no engine {name!r}")
