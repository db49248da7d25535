"""Scheduling policies (paper §6, Algorithm 1; paper-facts §7): pure decisions, no actors, no clock.

The scheduler keeps the queues and asks a :class:`Policy` what to do when an engine group fetches work (§6.1).
Deterministic: ties go to the lowest engine id, queues are FIFO, nothing iterates over a set.

**Prefill** (:meth:`Policy.assign_prefill`): over *every* PE of the cluster, each with its group's last report
(:class:`PrefillDispatch`), whichever group pulls (over the fetching group alone, the first to pull took nearly all the
work). :class:`DualPathPolicy` runs Algorithm 1: PEs are classified by their load ``tok_e`` and their node's read queue
``read_q`` (tokens) -- C1 overloaded (``tok_e > β``, given nothing), C2 ``read_q ≤ α``, C3 ``read_q > α`` -- and the
head of the global FIFO goes to the least-loaded PE of C2, else of C3 (ties: the PE given work least recently), whose
``tok_e`` grows, until both classes are empty. :class:`RoundRobinPolicy` gives requests to the PEs in turn, with no load
limit.

**Decode** (:meth:`Policy.assign_decode`, §6.2): phase 1 drains the global queue into per-group private queues, each
request to the group with the smallest ``Σ tok_e``. Phase 2 finds the prefix ``R`` of the group's private queue that
fits its free HBM, computes ``Z = 1.05 × (Σ_{r∈R} len_r + Σ_e tok_e) / |E|`` and pops requests in order: among DEs with
room, those staying at or below ``Z`` are preferred (fewest requests ``seq_e``), else the least-loaded; the fetch ends
when no DE has room for the head. Round robin gives each request to the group's next DE with room.

**Read side** (:meth:`Policy.read_side`, §6.3): a request's whole hit is read on one side, for DualPath the node with
the shorter read queue, which then grows by the hit tokens (so one fetch does not send everything to one side; the paper
does not say whether it updates ``read_q`` within a fetch); PE-only systems read on the PE."""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from dualpath_emu.errors import UsageError
from dualpath_emu.inputs import short_repr
from dualpath_emu.messages import fast_frozen_init

__all__ = [
    "DE_HIGH_TOKEN_FACTOR", "PrefillDispatch", "DecodeAssignment", "DualPathPolicy", "Engine", "GroupLoads", "Policy",
    "PolicyError", "PortHealth", "PrefillAssignment", "ReadSide", "Request", "RoundRobinPolicy", "check_assignments",
]  # fmt: skip

DE_HIGH_TOKEN_FACTOR: Final = 1.05  # The 1.05 of the decode high-token threshold Z (§6.2; not explained in the paper).

ReadSide = Literal["pe", "de"]


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Request:
    """What the scheduler knows of a request: hit + new tokens, its DE HBM, its agent's ``context``."""

    id: int
    prompt_tokens: int
    new_tokens: int
    hit_tokens: int
    gen_tokens: int
    hbm_bytes: int
    context: int


@dataclass(slots=True)
class Engine:
    """One engine as its last report shows it (``tok``, ``seq``, node, free HBM), updated within a fetch."""

    id: int
    node: int
    tok: int = 0
    seq: int = 0
    free_hbm_bytes: int = 0
    given: int = 0
    """The policy's assignment count when this PE was last given work (0: never). Ties in ``tok_e`` go to the
    PE given work least recently [our choice: with ties to the lowest id, a lightly loaded cluster sent nearly
    every request, and its read, to the first node]."""


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class PrefillAssignment:
    request: Request
    engine: int


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class DecodeAssignment:
    request: Request
    engine: int


class PortHealth:
    """What faults leave of the cluster's ports and engines, as the scheduler last heard (:attr:`Policy.health`)."""

    __slots__ = ("_factors", "engines_down")

    def __init__(self) -> None:
        self._factors: dict[str, float] = {}
        self.engines_down: set[str] = set()  # Engine groups down after a crash (``pe0``, ``de3``), until they are back.

    def set_engine(self, engine: str, up: bool) -> None:
        if up:
            self.engines_down.discard(engine)
        else:
            self.engines_down.add(engine)

    def engine_up(self, engine: str) -> bool:
        """Engine group ``engine`` (``pe0``: a prefill EP group, ``de3``: a decode node's engines) is up."""
        return engine not in self.engines_down

    def set(self, port: str, factor: float) -> None:
        if factor == 1.0:
            self._factors.pop(port, None)
        else:
            self._factors[port] = factor

    @property
    def all_up(self) -> bool:
        """No port is down or degraded."""
        return not self._factors

    def factor(self, port: str) -> float:
        """What is left of ``port``'s rates (1 as specified, 0 down), ports named as in the topology."""
        return self._factors.get(port, 1.0)

    def up(self, port: str) -> bool:
        return self._factors.get(port, 1.0) > 0.0

    def can_read(self, node: int) -> bool:
        """Node ``node``'s storage NIC can bring KV in (its receive side is not down)."""
        return self.up(f"n{node}.snic.rx")


@dataclass
class Policy(ABC):
    """One scheduler's decisions: subclasses choose engines, the read side is here (``read_both_sides``)."""

    read_both_sides: bool = False
    health: PortHealth = field(default_factory=PortHealth, repr=False, compare=False)
    """The ports' state as faults leave it (the scheduler keeps it current): read it to react to faults."""
    _given: int = field(default=0, repr=False)
    """Assignments made so far (stamps :attr:`Engine.given` and the decode groups' turns)."""
    _group_given: dict[int, int] = field(default_factory=dict, repr=False)
    """Decode group -> :attr:`_given` when it was last routed a request (ties in phase 1, as for PEs)."""
    _group_heap: list[tuple[int, int, int]] = field(default_factory=list, repr=False, compare=False)
    _group_heap_of: GroupLoads | None = field(default=None, repr=False, compare=False)

    def prefill_tokens(self, request: Request) -> int:
        """What a request adds to a PE's ``tok_e``."""
        return request.new_tokens

    def decode_tokens(self, request: Request) -> int:
        """What a request adds to a DE's ``tok_e`` (its KV in HBM while it decodes)."""
        return request.prompt_tokens + request.gen_tokens

    def prefill_load_changed(self, engine: Engine) -> None:
        """PE ``engine``'s load changed outside :meth:`assign_prefill` (it finished work)."""

    @abstractmethod
    def assign_prefill(
        self, queue: deque[Request], engines: list[Engine], read_q: dict[int, int]
    ) -> list[PrefillAssignment]:
        """Assign queued requests (FIFO) to PEs: ``engines`` every PE in id order; ``read_q`` node -> tokens."""

    def assign_decode(
        self, global_queue: deque[Request], private_queues: dict[int, deque[Request]], group_loads: dict[int, int],
        group_id: int, group: list[Engine],
    ) -> list[DecodeAssignment]:  # fmt: skip
        """Phase 1 (route the global queue to groups), then phase 2 for group ``group_id`` (:meth:`_assign_group`)."""
        self._drain_to_groups(global_queue, private_queues, group_loads)
        return self._assign_group(private_queues[group_id], group_id, group)

    @abstractmethod
    def _assign_group(self, queue: deque[Request], group_id: int, group: list[Engine]) -> list[DecodeAssignment]:
        """Phase 2: requests from the head of a group's private queue to its DEs, while they fit."""

    def _give_prefill(self, engine: Engine, request: Request) -> PrefillAssignment:
        """Assign ``request`` to PE ``engine``, updating its load as its next report would show it."""
        engine.tok += self.prefill_tokens(request)
        engine.seq += 1
        self._given += 1
        engine.given = self._given
        return PrefillAssignment(request, engine.id)

    def _give_decode(self, engine: Engine, request: Request) -> DecodeAssignment:
        """Assign ``request`` to DE ``engine``: its load, its request count and its free HBM."""
        engine.tok += self.decode_tokens(request)
        engine.seq += 1
        engine.free_hbm_bytes -= request.hbm_bytes
        return DecodeAssignment(request, engine.id)

    def read_side(self, request: Request, pe_node: int, de_node: int, read_q: dict[int, int]) -> ReadSide:
        """The side that reads the request's hit KV (§6.3: the node with the shorter read queue; on a tie the DE, whose
        storage NIC a single-path system leaves idle [our choice: the paper names no tie rule; breaking ties towards the
        PE piles light-load reads on the fewer prefill nodes]); adds its hit tokens to that node's ``read_q``."""
        side: ReadSide = "pe"
        if self.read_both_sides and read_q.get(de_node, 0) <= read_q.get(pe_node, 0):
            side = "de"
        return self._count_read(request, side, pe_node, de_node, read_q)

    def _count_read(
        self, request: Request, side: ReadSide, pe_node: int, de_node: int, read_q: dict[int, int]
    ) -> ReadSide:
        if self.read_both_sides and not self.health.all_up:
            # The second path as failover: a side whose storage NIC is down reads nothing while the other can.
            other: ReadSide = "de" if side == "pe" else "pe"
            mine, theirs = (pe_node, de_node) if side == "pe" else (de_node, pe_node)
            if not self.health.can_read(mine) and self.health.can_read(theirs):
                side = other
        node = pe_node if side == "pe" else de_node
        read_q[node] = read_q.get(node, 0) + request.hit_tokens
        return side

    def route_decode(
        self, global_queue: deque[Request], private_queues: dict[int, deque[Request]], group_loads: dict[int, int]
    ) -> None:
        """Phase 1 of the DE selection, as soon as requests join the global queue (the next fetch would do it)."""
        self._drain_to_groups(global_queue, private_queues, group_loads)

    def _drain_to_groups(
        self, global_queue: deque[Request], private_queues: dict[int, deque[Request]], group_loads: dict[int, int]
    ) -> None:
        """Phase 1: each queued request to the group with the least ``Σ tok_e``, updating ``group_loads``."""
        if isinstance(group_loads, GroupLoads):
            self._drain_by_heap(global_queue, private_queues, group_loads)
            return
        while global_queue:
            request = global_queue.popleft()
            target = min(group_loads, key=lambda g: (group_loads[g], self._group_given.get(g, 0), g))
            private_queues[target].append(request)
            group_loads[target] += self.decode_tokens(request)
            self._given += 1
            self._group_given[target] = self._given

    def _drain_by_heap(
        self, global_queue: deque[Request], private_queues: dict[int, deque[Request]], group_loads: GroupLoads
    ) -> None:
        """:meth:`_drain_to_groups` with the groups in a heap by ``(load, routed, id)``: same choices, O(log n)."""
        heap = self._group_heap
        if self._group_heap_of is not group_loads:
            self._group_heap_of, heap = group_loads, []
            self._group_heap = heap
            group_loads.changed.update(group_loads)
        given = self._group_given
        for g in group_loads.changed:
            heapq.heappush(heap, (group_loads[g], given.get(g, 0), g))
        group_loads.changed.clear()
        while global_queue:
            load, turn, target = heap[0]
            if group_loads[target] != load or given.get(target, 0) != turn:
                heapq.heappop(heap)  # stale
                continue
            request = global_queue.popleft()
            private_queues[target].append(request)
            group_loads[target] = load + self.decode_tokens(request)
            self._given += 1
            given[target] = self._given
            heapq.heappush(heap, (group_loads[target], self._given, target))
        group_loads.changed.clear()
        if len(heap) > 4 * len(group_loads) + 16:  # mostly stale entries: rebuild from the loads as they are
            heap[:] = [(load, given.get(g, 0), g) for g, load in group_loads.items()]
            heapq.heapify(heap)


@dataclass
class DualPathPolicy(Policy):
    """DualPath's scheduler (§6): ``alpha_tokens`` (α) and ``beta_tokens`` (β) from the hardware (A.4)."""

    alpha_tokens: int = 0
    beta_tokens: int = 0
    read_both_sides: bool = True
    high_token_factor: float = DE_HIGH_TOKEN_FACTOR

    _pe_index: _PrefillIndex | None = field(default=None, repr=False, compare=False)

    def assign_prefill(
        self, queue: deque[Request], engines: list[Engine], read_q: dict[int, int]
    ) -> list[PrefillAssignment]:
        # Algorithm 1 picks the least (tok_e, given, id) over C2, else over C3; a node's PEs share its read
        # queue, so that is the least of the qualifying nodes' least PEs: O(nodes + log PEs) per request.
        index = self._pe_index
        if index is None or index.engines is not engines or index.count != len(engines):
            index = self._pe_index = _PrefillIndex(engines)
        out: list[PrefillAssignment] = []
        alpha, beta, nodes, least = self.alpha_tokens, self.beta_tokens, index.nodes, index.least
        while queue:
            best = best_c3 = None
            for node, heap in nodes:
                head = heap[0] if heap else None
                if head is not None and (head[0] != head[3].tok or head[1] != head[3].given):
                    head = least(heap)  # stale: pop to the current least (checked here, not by a call per node)
                if head is None or head[0] > beta:
                    continue  # C1: every PE of the node is overloaded
                if read_q.get(node, 0) <= alpha:
                    if best is None or head < best:
                        best = head
                elif best_c3 is None or head < best_c3:
                    best_c3 = head
            chosen = best if best is not None else best_c3
            if chosen is None:
                break  # every PE is overloaded: the rest waits until one finishes work
            engine = chosen[3]
            out.append(self._give_prefill(engine, queue.popleft()))
            index.changed(engine)
        return out

    def prefill_load_changed(self, engine: Engine) -> None:
        if self._pe_index is not None:
            self._pe_index.changed(engine)

    def _assign_group(self, queue: deque[Request], group_id: int, group: list[Engine]) -> list[DecodeAssignment]:
        if not queue or not group:
            return []
        # Z from the prefix R of the queue that fits in the group's free HBM (no fragmentation assumed).
        free = sum(e.free_hbm_bytes for e in group)
        fitting_tokens = 0
        for request in queue:
            if request.hbm_bytes > free:
                break
            free -= request.hbm_bytes
            fitting_tokens += self.decode_tokens(request)
        z = self.high_token_factor * (fitting_tokens + sum(e.tok for e in group)) / len(group)
        out: list[DecodeAssignment] = []
        while queue:
            request = queue[0]
            tokens, need = self.decode_tokens(request), request.hbm_bytes
            # Among the DEs with room, the least (seq, tok, id) of those staying at or below Z, else the least
            # (tok, id) of all: one pass, no lists (the keys end in the unique id, so the choice is that of min).
            low: Engine | None = None
            least: Engine | None = None
            for e in group:
                if e.free_hbm_bytes < need:
                    continue
                if least is None or (e.tok, e.id) < (least.tok, least.id):
                    least = e
                if e.tok + tokens <= z and (low is None or (e.seq, e.tok, e.id) < (low.seq, low.tok, low.id)):
                    low = e
            if least is None:
                break  # no DE of the group has room for the head
            queue.popleft()
            out.append(self._give_decode(low if low is not None else least, request))
        return out


@dataclass
class RoundRobinPolicy(Policy):
    """Round robin (the paper's Basic, Fig. 13): PEs and DEs in turn; ``read_both_sides``: read sides too."""

    _pe_turn: int = 0
    _next_de: dict[int, int] = field(default_factory=dict)
    _read_turn: int = 0

    def read_side(self, request: Request, pe_node: int, de_node: int, read_q: dict[int, int]) -> ReadSide:
        side: ReadSide = "pe"
        if self.read_both_sides:
            side = "de" if self._read_turn % 2 else "pe"
            self._read_turn += 1
        return self._count_read(request, side, pe_node, de_node, read_q)

    def _drain_to_groups(
        self, global_queue: deque[Request], private_queues: dict[int, deque[Request]], group_loads: dict[int, int]
    ) -> None:
        # Groups in turn too: each request to the next group.
        groups = sorted(private_queues)
        turn = self._next_de.get(-1, 0)
        while global_queue:
            request = global_queue.popleft()
            target = groups[turn % len(groups)]
            turn += 1
            private_queues[target].append(request)
            group_loads[target] += self.decode_tokens(request)
        self._next_de[-1] = turn % len(groups)

    def assign_prefill(
        self, queue: deque[Request], engines: list[Engine], read_q: dict[int, int]
    ) -> list[PrefillAssignment]:
        """Requests go to the PEs in turn across the whole cluster (node by node), one each."""
        out: list[PrefillAssignment] = []
        if not engines:
            return out
        turn = self._pe_turn
        while queue:
            engine = engines[turn % len(engines)]
            turn += 1
            out.append(self._give_prefill(engine, queue.popleft()))
        self._pe_turn = turn % len(engines)
        return out

    def _assign_group(self, queue: deque[Request], group_id: int, group: list[Engine]) -> list[DecodeAssignment]:
        out: list[DecodeAssignment] = []
        if not group:
            return out
        next_engine = self._next_de.get(group_id, 0)
        while queue:
            request = queue[0]
            for step in range(len(group)):
                engine = group[(next_engine + step) % len(group)]
                if engine.free_hbm_bytes >= request.hbm_bytes:
                    next_engine = (next_engine + step + 1) % len(group)
                    break
            else:
                break  # no DE of the group has room: wait
            queue.popleft()
            out.append(self._give_decode(engine, request))
        self._next_de[group_id] = next_engine
        return out


class GroupLoads(dict[int, int]):
    """The decode groups' loads for phase 1, noting which changed since the policy looked (for its heap)."""

    def __init__(self, loads: dict[int, int] | None = None) -> None:
        super().__init__(loads or {})
        self.changed: set[int] = set(self)

    def __setitem__(self, group: int, load: int) -> None:
        super().__setitem__(group, load)
        self.changed.add(group)


_Entry = tuple[int, int, int, Engine]
"""A PE in :class:`_PrefillIndex`: ``(tok, given, id, engine)`` as it was when pushed."""


class _PrefillIndex:
    """The PEs by node, each node's in a heap by ``(tok_e, given, id)`` (stale entries dropped)."""

    def __init__(self, engines: list[Engine]) -> None:
        self.engines = engines
        self.count = len(engines)
        members: dict[int, list[Engine]] = {}
        for e in engines:
            members.setdefault(e.node, []).append(e)
        self._members = members
        self.nodes: list[tuple[int, list[_Entry]]] = [(node, self._heap(m)) for node, m in members.items()]
        self._heap_of = {e.id: heap for node, heap in self.nodes for e in members[node]}

    @staticmethod
    def _heap(engines: list[Engine]) -> list[_Entry]:
        heap = [(e.tok, e.given, e.id, e) for e in engines]
        heapq.heapify(heap)
        return heap

    @staticmethod
    def least(heap: list[_Entry]) -> _Entry | None:
        """The current least entry of a node's heap (None: the heap is empty)."""
        while heap:
            head = heap[0]
            e = head[3]
            if head[0] == e.tok and head[1] == e.given:
                return head
            heapq.heappop(heap)
        return None

    def changed(self, engine: Engine) -> None:
        heap = self._heap_of[engine.id]
        heapq.heappush(heap, (engine.tok, engine.given, engine.id, engine))
        members = self._members[engine.node]
        if len(heap) > 4 * len(members):  # mostly stale entries: rebuild from the engines as they are
            heap[:] = self._heap(members)


class PrefillDispatch:
    """The prefill side of the scheduler (§6.1–6.2): the global FIFO and every PE's load, by group."""

    def __init__(self, policy: Policy, groups: dict[str, list[Engine]]) -> None:
        self.policy = policy
        self.queue: deque[Request] = deque()
        self.engines = sorted((e for members in groups.values() for e in members), key=lambda e: e.id)
        self._group_of = {e.id: name for name, members in groups.items() for e in members}
        self._by_id = {e.id: e for e in self.engines}
        self._groups = list(groups)  # in the order given (the cluster gives them node by node)
        self._wake_turn = 0

    def group_of(self, engine: int) -> str:
        """The group that hosts PE ``engine``."""
        return self._group_of[engine]

    def submit(self, requests: Sequence[Request]) -> str:
        """Queue ``requests`` (FIFO); returns the group to tell that work is waiting."""
        self.queue.extend(requests)
        group = self._groups[self._wake_turn]
        self._wake_turn = (self._wake_turn + 1) % len(self._groups)
        return group

    def fetch(self, read_q: dict[int, int]) -> list[PrefillAssignment]:
        """A PE group fetched: assign from the head of the queue over every PE (the policy's rule)."""
        return self.policy.assign_prefill(self.queue, self.engines, read_q)

    def done(self, request: Request, engine: int) -> str | None:
        """``request`` left PE ``engine``; returns the group to wake if requests wait."""
        e = self._by_id[engine]
        e.tok -= self.policy.prefill_tokens(request)
        e.seq -= 1
        self.policy.prefill_load_changed(e)
        return self._group_of[engine] if self.queue else None


class PolicyError(UsageError):
    """A user's policy answered what the scheduler cannot use, or never assigned waiting work (named)."""


def check_assignments(policy: Policy, method: str, assigned: object, kind: type, waiting: set[int],
                      queues: Iterable[deque[Request]], engine_ids: set[int]) -> None:  # fmt: skip
    """Refuse what a user's policy returned unless each item assigns a waiting request once, to a known engine."""
    name = f"policy {type(policy).__name__}.{method}"
    if not isinstance(assigned, list):
        raise PolicyError(
            f"{name} returned {short_repr(assigned)}; expected a list of {kind.__name__}(request, engine)"
        )
    left = {r.id for queue in queues for r in queue}
    seen: set[int] = set()
    for i, a in enumerate(assigned):
        if not isinstance(a, kind) or not isinstance(a.request, Request):  # type: ignore[attr-defined]
            raise PolicyError(f"{name} returned {short_repr(a)} at [{i}]; expected a {kind.__name__}(request, engine)")
        rid, engine = a.request.id, a.engine  # type: ignore[attr-defined]
        if rid not in waiting:
            raise PolicyError(f"{name} assigned request {rid}, which was not waiting in the queue it was given")
        if rid in seen:
            raise PolicyError(f"{name} assigned request {rid} twice")
        if rid in left:
            raise PolicyError(f"{name} assigned request {rid} but left it in the queue (take it with queue.popleft())")
        if engine not in engine_ids:
            raise PolicyError(f"{name} assigned request {rid} to engine {short_repr(engine)}, not one of the engines it "
                              f"was given ({', '.join(map(str, sorted(engine_ids)))})")  # fmt: skip
        seen.add(rid)
