"""The context the cluster's engines of one process are built with (:class:`Cluster`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dualpath_emu.cluster.config import ClusterConfig, Derived
from dualpath_emu.cluster.identity import GroupId
from dualpath_emu.cluster.ledger import Booking, Ledger, ProbingLedger
from dualpath_emu.cluster.policies import Policy
from dualpath_emu.cluster.systems import System
from dualpath_emu.cluster.topology import Topology
from dualpath_emu.runtime.engine import DataPlane

__all__ = ["Cluster"]


@dataclass
class Cluster:
    """What the engines of one process are built with: the run's settings (read only, the same in every
    process) and this process's booking of every byte asked for. What engines measure they observe through their
    outbox (:mod:`~dualpath_emu.cluster.observations`), not here. No engine learns another's state through it:
    that comes in messages (:mod:`~dualpath_emu.cluster.messages`), so any engine can be placed in any process."""

    config: ClusterConfig
    system: System
    derived: Derived
    topology: Topology
    policy: Policy
    booking: Booking = field(default_factory=Booking)
    _group_names: dict[tuple[str, int], str] = field(default_factory=dict, repr=False, compare=False)

    def ledger(self, plane: DataPlane) -> Ledger:
        """An engine's door to ``plane``, booking into this process's :attr:`booking`."""
        cls = ProbingLedger if self.booking.probe else Ledger
        return cls(plane, self.topology, self.booking)

    def group_name(self, role: str, node: int) -> str:
        """The engine that hosts ``node``'s engines (prefill groups may span nodes)."""
        try:
            return self._group_names[(role, node)]  # asked for at every message to a group
        except KeyError:
            group = GroupId("pe", node - node % self.config.prefill_ep_nodes) if role == "pe" else GroupId("de", node)
            name = group.name
            self._group_names[(role, node)] = name
            return name
