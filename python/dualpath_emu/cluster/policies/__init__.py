"""Scheduling policies (paper §6; docs/policies.md): one per module, registered by name in :data:`POLICIES`.

A policy sees a read-only view (:mod:`.view`) and returns decisions, which the scheduler checks (:mod:`.checks`) and
applies; :mod:`.base` is the contract, :mod:`.dualpath` DualPath's Algorithm 1 and two-level DE selection,
:mod:`.round_robin` the paper's Basic. A system names a built-in policy by its key here or gives its own class."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from dualpath_emu.cluster.policies.base import Policy
from dualpath_emu.cluster.policies.checks import PolicyError, check_decode, check_prefill, check_read_side, check_routes
from dualpath_emu.cluster.policies.dualpath import DE_HIGH_TOKEN_FACTOR, AffinityPolicy, DualPathPolicy, SplitPolicy
from dualpath_emu.cluster.policies.round_robin import RoundRobinPolicy
from dualpath_emu.cluster.policies.view import (
    DecodeAssignment, DecodeRoute, DecodeView, EngineState, GroupState, Health, PrefillAssignment, PrefillView,
    QueueView, ReadDecision, ReadSide, ReadView, Request, RouteView, Split,
)  # fmt: skip

__all__ = [
    "DE_HIGH_TOKEN_FACTOR", "POLICIES", "AffinityPolicy", "DecodeAssignment", "DecodeRoute", "DecodeView", "DualPathPolicy",
    "EngineState", "GroupState", "Health", "Policy", "PolicyError", "PrefillAssignment", "PrefillView", "QueueView",
    "ReadDecision", "ReadSide", "ReadView", "Request", "RoundRobinPolicy", "RouteView", "Split", "SplitPolicy",
    "check_decode", "check_prefill",
    "check_read_side", "check_routes",
]  # fmt: skip

POLICIES: Final[Mapping[str, type[Policy]]] = MappingProxyType(
    {
        "dualpath": DualPathPolicy,
        "round_robin": RoundRobinPolicy,
        "dualpath_affinity": AffinityPolicy,
        "dualpath_split": SplitPolicy,
    }
)
"""The built-in policies by the name a :class:`~dualpath_emu.cluster.systems.System`'s ``scheduler`` gives."""
