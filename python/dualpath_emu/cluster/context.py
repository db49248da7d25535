"""The context the cluster's actors of one process are built with (:class:`Cluster`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dualpath_emu.cluster.config import ClusterConfig, Derived
from dualpath_emu.cluster.ledger import Ledger
from dualpath_emu.cluster.metrics import Metrics
from dualpath_emu.cluster.policies import Policy
from dualpath_emu.cluster.systems import System
from dualpath_emu.cluster.topology import Topology

__all__ = ["Cluster"]


@dataclass
class Cluster:
    """What the actors of one process are built with: the run's settings (read only, the same in every
    process) and this process's own metrics and ledger. No actor learns another's state through it: that
    comes in messages (:mod:`~dualpath_emu.cluster.messages`), so any actor can be placed in any process."""

    config: ClusterConfig
    system: System
    derived: Derived
    topology: Topology
    metrics: Metrics
    policy: Policy
    plane: Ledger
    _group_names: dict[tuple[str, int], str] = field(default_factory=dict, repr=False, compare=False)

    def group_name(self, role: str, node: int) -> str:
        """The actor that hosts ``node``'s engines (prefill groups may span nodes)."""
        try:
            return self._group_names[(role, node)]  # asked for at every message to a group
        except KeyError:
            name = f"pe{node - node % self.config.prefill_ep_nodes}" if role == "pe" else f"de{node}"
            self._group_names[(role, node)] = name
            return name
