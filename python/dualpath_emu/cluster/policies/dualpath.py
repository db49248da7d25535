"""DualPath's scheduler (paper §6, Algorithm 1; paper-facts §7).

**Prefill** (§6.1): over every PE that is up, whichever group fetches (over the fetching group alone, the first to
pull took nearly all the work). PEs are classified by their load ``tok_e`` and their node's read queue ``read_q``
(tokens) -- C1 overloaded (``tok_e > β``, given nothing), C2 ``read_q ≤ α``, C3 ``read_q > α`` -- and the head of the
global FIFO goes to the least-loaded PE of C2, else of C3 (ties: the PE given work least recently [our choice: with
ties to the lowest id, a lightly loaded cluster sent nearly every request, and its read, to the first node]), whose
``tok_e`` grows, until both classes are empty.

**Decode** (§6.2): phase 1 routes each request to the group with the smallest ``Σ tok_e``
(:meth:`~dualpath_emu.cluster.policies.base.Policy.route_decode`). Phase 2 finds the prefix ``R`` of the group's
private queue that fits its free HBM, computes ``Z = 1.05 × (Σ_{r∈R} len_r + Σ_e tok_e) / |E|`` and takes requests in
order: among DEs with room, those staying at or below ``Z`` are preferred (fewest requests ``seq_e``), else the
least-loaded; the fetch ends when no DE has room for the head.

**Read side** (§6.3): the node with the shorter read queue, whose queue the scheduler then grows by the hit tokens
(so one fetch does not send everything to one side; the paper does not say whether it updates ``read_q`` within a
fetch)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter
from typing import ClassVar, Final

from dualpath_emu.cluster.policies.base import Policy
from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.policies.view import (
    DecodeAssignment, DecodeRoute, DecodeView, PrefillAssignment, PrefillView, ReadDecision, ReadView, RouteView, Split,
)  # fmt: skip

__all__ = ["DE_HIGH_TOKEN_FACTOR", "MIN_SPLIT_TOKENS", "AffinityPolicy", "DualPathPolicy", "SplitPolicy"]

DE_HIGH_TOKEN_FACTOR: Final = 1.05  # The 1.05 of the decode high-token threshold Z (§6.2; not explained in the paper).


_NODE = attrgetter("node")


def _least(heaps: list[list[tuple[int, int, int]]], beta: int) -> list[tuple[int, int, int]] | None:
    """The heap whose least PE is the least of all, if it is at or below ``beta`` (C1 PEs take nothing)."""
    best = None
    for heap in heaps:
        if heap[0][0] <= beta and (best is None or heap[0] < best[0]):
            best = heap
    return best


@dataclass
class DualPathPolicy(Policy):
    """DualPath's scheduler (§6): ``alpha_tokens`` (α) and ``beta_tokens`` (β) from the hardware (A.4)."""

    alpha_tokens: int = 0
    beta_tokens: int = 0
    read_both_sides: bool = True
    high_token_factor: float = DE_HIGH_TOKEN_FACTOR
    affinity: bool = False
    """Session affinity: a request whose context a decode GPU keeps in HBM goes to that GPU's group and, if it has
    room, to that GPU (:class:`AffinityPolicy`)."""
    promises: ClassVar[frozenset[str]] = frozenset({"fifo", "overload", "read_side", "high_water"})

    def assign_prefill(self, view: PrefillView) -> Sequence[PrefillAssignment]:
        # Algorithm 1 picks the least (tok_e, given, id) over C2, else over C3. A node's PEs share its read queue, and
        # no read queue changes within a fetch, so each node is C2 or C3 for the whole call: the pick is the least of
        # the qualifying nodes' least PEs, a heap per node (O(PEs) per call, O(nodes + log PEs) per request).
        if not view.queue:
            return []
        alpha, beta, read_q, stamp = self.alpha_tokens, self.beta_tokens, view.read_q, view.stamp
        c2: list[list[tuple[int, int, int]]] = []
        c3: list[list[tuple[int, int, int]]] = []
        by_node: dict[int, list[tuple[int, int, int]]] = {}
        for node, engines in groupby(view.engines, _NODE):  # the scheduler shows them node by node
            heap = [(e.tok, e.given, e.id) for e in engines]
            if node in by_node:
                by_node[node] += heap
                heapq.heapify(by_node[node])
                continue
            heapq.heapify(heap)
            by_node[node] = heap
            (c2 if read_q.get(node, 0) <= alpha else c3).append(heap)
        out: list[PrefillAssignment] = []
        for request in view.queue:
            chosen = _least(c2, beta) or _least(c3, beta)
            if chosen is None:
                break  # every PE is overloaded: the rest waits until one finishes work
            tok, _, engine = chosen[0]
            stamp += 1
            heapq.heapreplace(chosen, (tok + self.prefill_tokens(request), stamp, engine))
            out.append(PrefillAssignment(request, engine))
        return out

    def assign_decode(self, view: DecodeView) -> Sequence[DecodeAssignment]:
        engines = view.engines
        if not view.queue or not engines:
            return []
        # Z from the prefix R of the queue that fits in the group's free HBM (no fragmentation assumed).
        free = sum(e.free_hbm_bytes for e in engines)
        fitting_tokens = 0
        for request in view.queue:
            if request.hbm_bytes > free:
                break
            free -= request.hbm_bytes
            fitting_tokens += self.decode_tokens(request)
        z = self.high_token_factor * (fitting_tokens + sum(e.tok for e in engines)) / len(engines)
        # (tok, seq, free HBM, id) of each DE as this call's assignments leave it.
        state = [[e.tok, e.seq, e.free_hbm_bytes, e.id] for e in engines]
        kept = view.kept if self.affinity else None
        by_id = {e[3]: e for e in state} if kept else {}
        out: list[DecodeAssignment] = []
        for request in view.queue:
            tokens, need = self.decode_tokens(request), request.hbm_bytes
            if kept:  # the DE that keeps its KV, if it has room
                mine = by_id.get(kept.get(request.context, -1))
                if mine is not None and mine[2] >= need:
                    mine[0] += tokens
                    mine[1] += 1
                    mine[2] -= need
                    out.append(DecodeAssignment(request, mine[3]))
                    continue
            # Among the DEs with room, the least (seq, tok, id) of those staying at or below Z, else the least
            # (tok, id) of all: one pass (the keys end in the unique id, so the choice is that of min).
            low: list[int] | None = None
            least: list[int] | None = None
            for e in state:
                if e[2] < need:
                    continue
                if least is None or (e[0], e[3]) < (least[0], least[3]):
                    least = e
                if e[0] + tokens <= z and (low is None or (e[1], e[0], e[3]) < (low[1], low[0], low[3])):
                    low = e
            if least is None:
                break  # no DE of the group has room for the head
            chosen = low if low is not None else least
            chosen[0] += tokens
            chosen[1] += 1
            chosen[2] -= need
            out.append(DecodeAssignment(request, chosen[3]))
        return out


@dataclass
class AffinityPolicy(DualPathPolicy):
    """DualPath's scheduler with session affinity (decode-side retention, ``dualpath+retention``): a request whose
    context a decode GPU keeps in HBM is routed to that GPU's group and given that GPU when it has room, whatever the
    loads (so the high-water rule is not promised); the rest as DualPath's."""

    affinity: bool = True
    promises: ClassVar[frozenset[str]] = frozenset({"fifo", "overload", "read_side"})

    def route_decode(self, view: RouteView) -> Sequence[DecodeRoute]:
        if not view.kept:
            return super().route_decode(view)
        loads = {g.node: [g.load, g.given] for g in view.groups}  # the least (load, given, node) for the rest
        stamp, kept = view.stamp, view.kept
        out: list[DecodeRoute] = []
        for request in view.queue:
            target = kept.get(request.context, -1)
            if target not in loads:
                target = min(loads, key=lambda node: (loads[node][0], loads[node][1], node))
            stamp += 1
            loads[target][0] += self.decode_tokens(request)
            loads[target][1] = stamp
            out.append(DecodeRoute(request, target))
        return out


MIN_SPLIT_TOKENS: Final = 16 * BLOCK_TOKENS
"""The smallest hit :class:`SplitPolicy` divides (16 Full Blocks): a smaller one is read whole, on one side."""


@dataclass
class SplitPolicy(DualPathPolicy):
    """DualPath's scheduler whose reads may be split (``dualpath-split``, §6.1's open question): a hit of at least
    :data:`MIN_SPLIT_TOKENS` is divided so that both sides' read queues, in tokens, end as level as whole blocks allow
    (the prefill side reads the first blocks, the decode side the rest); a hit the balance gives wholly to one side
    is read there, and a side whose storage NIC is down reads nothing (failover, as DualPath's). It promises what
    DualPath's does but the shorter-queue rule, which a split does not follow."""

    promises: ClassVar[frozenset[str]] = frozenset({"fifo", "overload", "high_water"})

    def read_side(self, view: ReadView) -> ReadDecision:
        side = super().read_side(view)
        request = view.request
        tokens = request.stored_tokens
        if not self.read_both_sides or request.pooled or tokens < MIN_SPLIT_TOKENS or not view.health.all_up:
            return side
        q_pe, q_de = view.read_q.get(view.pe_node, 0), view.read_q.get(view.de_node, 0)
        pe_tokens = (q_de + tokens - q_pe) // 2 // BLOCK_TOKENS * BLOCK_TOKENS  # both queues level, whole blocks
        if pe_tokens <= 0:
            return "de"
        if pe_tokens >= tokens - BLOCK_TOKENS // 2:
            return "pe"
        return Split(tokens - pe_tokens)
