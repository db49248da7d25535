"""The policy contract (docs/policies.md): one scheduler's decisions as methods that take a read-only view and return
decisions. The scheduler checks every decision (:mod:`~dualpath_emu.cluster.policies.checks`) and applies it: a policy
never changes what it is shown. It may keep its own state (a round robin's turn); given the same views in the same
order it must decide the same (no clock, no global random numbers), so a seed replays a run."""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from dualpath_emu.cluster.policies.view import (
    DecodeAssignment, DecodeRoute, DecodeView, PrefillAssignment, PrefillView, ReadDecision, ReadSide, ReadView, Request,
    RouteView,
)  # fmt: skip

__all__ = ["Policy"]


@dataclass
class Policy(ABC):
    """Subclass and define :meth:`assign_prefill` and :meth:`assign_decode`; :meth:`route_decode` and :meth:`read_side`
    have DualPath's rules (§6.2, §6.3) unless overridden. ``read_both_sides`` is the system's ``dual_path``: whether a
    read may go through the decode node."""

    read_both_sides: bool = False
    promises: ClassVar[frozenset[str]] = frozenset()
    """The paper's rules this policy keeps, which ``dualpath-emu check`` holds it to (:mod:`dualpath_emu.testing`):
    ``fifo``, ``overload``, ``read_side``, ``high_water``. A subclass inherits them: override to drop one you change."""

    def prefill_tokens(self, request: Request) -> int:
        """What a request adds to a PE's ``tok`` (the scheduler keeps the loads with it)."""
        return request.new_tokens

    def decode_tokens(self, request: Request) -> int:
        """What a request adds to a DE's ``tok`` and its group's load (its KV in HBM while it decodes)."""
        return request.prompt_tokens + request.gen_tokens

    @abstractmethod
    def assign_prefill(self, view: PrefillView) -> Sequence[PrefillAssignment]:
        """Requests of ``view.queue`` to PEs of ``view.engines``; what is left waits for the next fetch. The loads in
        the view do not change within the call: count your own assignments."""

    def route_decode(self, view: RouteView) -> Sequence[DecodeRoute]:
        """Phase 1 (§6.2): each waiting request, in order, to the group with the least load (ties: the group routed
        to least recently, then the lowest node)."""
        if not view.queue or not view.groups:
            return []
        heap = [(g.load, g.given, g.node) for g in view.groups]  # the least (load, given, node) at the top
        heapq.heapify(heap)
        stamp = view.stamp
        out: list[DecodeRoute] = []
        for request in view.queue:
            load, _, target = heap[0]
            stamp += 1
            heapq.heapreplace(heap, (load + self.decode_tokens(request), stamp, target))
            out.append(DecodeRoute(request, target))
        return out

    @abstractmethod
    def assign_decode(self, view: DecodeView) -> Sequence[DecodeAssignment]:
        """Phase 2: requests from the head of the group's private queue to its DEs, while they fit in their HBM."""

    def read_side(self, view: ReadView) -> ReadDecision:
        """The side that reads the request's hit KV (§6.3): the node with the shorter read queue; on a tie the DE, whose
        storage NIC a single-path system leaves idle [our choice: the paper names no tie rule; breaking ties towards the
        PE piles light-load reads on the fewer prefill nodes]. PE-only systems read on the PE."""
        side: ReadSide = "pe"
        if self.read_both_sides and view.read_q.get(view.de_node, 0) <= view.read_q.get(view.pe_node, 0):
            side = "de"
        return self.failover(view, side)

    def failover(self, view: ReadView, side: ReadSide) -> ReadSide:
        """The second path as failover: a side whose storage NIC is down reads nothing while the other can."""
        health = view.health
        if self.read_both_sides and not health.all_up:
            mine, theirs = (view.pe_node, view.de_node) if side == "pe" else (view.de_node, view.pe_node)
            if not health.can_read(mine) and health.can_read(theirs):
                return "de" if side == "pe" else "pe"
        return side
