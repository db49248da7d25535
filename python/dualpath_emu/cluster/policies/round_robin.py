"""Round robin (the paper's Basic, Fig. 13): PEs, decode groups, DEs and, with both read paths, read sides in turn,
with no load limit; a DE is skipped while the request does not fit its free HBM."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from dualpath_emu.cluster.policies.base import Policy
from dualpath_emu.cluster.policies.view import (
    DecodeAssignment, DecodeRoute, DecodeView, PrefillAssignment, PrefillView, ReadSide, ReadView, RouteView,
)  # fmt: skip

__all__ = ["RoundRobinPolicy"]


@dataclass
class RoundRobinPolicy(Policy):
    """Round robin: ``read_both_sides`` alternates the read side too."""

    promises: ClassVar[frozenset[str]] = frozenset({"fifo"})
    _pe_turn: int = 0
    _group_turn: int = 0
    _next_de: dict[int, int] = field(default_factory=dict)
    _read_turn: int = 0

    def assign_prefill(self, view: PrefillView) -> Sequence[PrefillAssignment]:
        """Requests go to the PEs in turn across the whole cluster (node by node), one each."""
        engines = view.engines
        if not engines:
            return []
        turn = self._pe_turn
        out = []
        for request in view.queue:
            out.append(PrefillAssignment(request, engines[turn % len(engines)].id))
            turn += 1
        self._pe_turn = turn % len(engines)
        return out

    def route_decode(self, view: RouteView) -> Sequence[DecodeRoute]:
        groups = sorted(g.node for g in view.groups)
        if not groups:
            return []
        turn = self._group_turn
        out = []
        for request in view.queue:
            out.append(DecodeRoute(request, groups[turn % len(groups)]))
            turn += 1
        self._group_turn = turn % len(groups)
        return out

    def assign_decode(self, view: DecodeView) -> Sequence[DecodeAssignment]:
        engines = view.engines
        out: list[DecodeAssignment] = []
        if not engines:
            return out
        free = [e.free_hbm_bytes for e in engines]
        next_engine = self._next_de.get(view.group, 0)
        for request in view.queue:
            for step in range(len(engines)):
                i = (next_engine + step) % len(engines)
                if free[i] >= request.hbm_bytes:
                    next_engine = (i + 1) % len(engines)
                    break
            else:
                break  # no DE of the group has room: wait
            free[i] -= request.hbm_bytes
            out.append(DecodeAssignment(request, engines[i].id))
        self._next_de[view.group] = next_engine
        return out

    def read_side(self, view: ReadView) -> ReadSide:
        side: ReadSide = "pe"
        if self.read_both_sides:
            side = "de" if self._read_turn % 2 else "pe"
            self._read_turn += 1
        return self.failover(view, side)
