"""What a policy sees and what it returns (docs/policies.md): read-only, typed views of the scheduler's state, and
decisions the scheduler checks (:mod:`~dualpath_emu.cluster.policies.checks`) before it applies them.

A view is valid for the call it is passed to: its queues and read queues are the scheduler's own, seen through
read-only wrappers (no copy per call), so keep what you need, not the view. Every record is a frozen dataclass a
test can build by hand: ``PrefillView(queue=(Request(...),), engines=(EngineState(...),), read_q={0: 0})``."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, overload

from dualpath_emu.messages import fast_frozen_init

__all__ = [
    "DecodeAssignment", "DecodeRoute", "DecodeView", "EngineState", "GroupState", "Health", "PrefillAssignment",
    "PrefillView", "QueueView", "ReadDecision", "ReadSide", "ReadView", "Request", "RouteView", "Split",
]  # fmt: skip

ReadSide = Literal["pe", "de"]
"""Which node's storage NIC reads a request's hit KV: its prefill engine's (``"pe"``) or its decode engine's."""


@dataclass(frozen=True, slots=True)
class Split:
    """A hit read on both sides (§6.1's open question): the decode node's storage NIC reads its last ``de_tokens``
    tokens, the prefill node's the rest, whole Full Blocks from the start; each part takes its own path into the PE
    GPU's HBM, layer by layer (PE-read's from the PE buffer, DE-read's from the DE buffer)."""

    de_tokens: int


ReadDecision = ReadSide | Split
"""What :meth:`~dualpath_emu.cluster.policies.base.Policy.read_side` answers: one side, or a :class:`Split`."""


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Request:
    """A request waiting for an engine: hit + new tokens (``prompt_tokens``), the tokens it will generate, the DE HBM
    its KV takes while it decodes, ``context``, the agent whose token stream its hit begins, and where its hit is:
    ``pooled``, the ``(node, tokens)`` runs of it that the nodes' DRAM pool holds, in order from its start (read from
    those nodes over the compute network; empty without a pool); the rest, ``stored_tokens``, is read from storage."""

    id: int
    prompt_tokens: int
    new_tokens: int
    hit_tokens: int
    gen_tokens: int
    hbm_bytes: int
    context: int
    pooled: tuple[tuple[int, int], ...] = ()

    @property
    def pooled_tokens(self) -> int:
        """Hit tokens the DRAM pool holds."""
        return sum(tokens for _, tokens in self.pooled) if self.pooled else 0

    @property
    def stored_tokens(self) -> int:
        """Hit tokens read from storage (over a storage NIC: what a read queue counts)."""
        return self.hit_tokens - self.pooled_tokens if self.pooled else self.hit_tokens


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class EngineState:
    """One engine (a GPU) as the scheduler knows it: ``tok`` tokens assigned and not yet done (a PE's to prefill, a
    DE's KV while it decodes), ``seq`` their requests, ``free_hbm_bytes`` (DEs; 0 for PEs) and ``given``, the
    scheduler's assignment count when it was last given work (0: never; what a tie rule "least recently" needs)."""

    id: int
    node: int
    tok: int = 0
    seq: int = 0
    free_hbm_bytes: int = 0
    given: int = 0


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class GroupState:
    """A decode group (one decode node's engines) for phase 1: ``load`` is ``Σ tok_e`` of its DEs and what was
    routed to it and not yet assigned a DE; ``given`` as for :class:`EngineState`."""

    node: int
    load: int
    given: int = 0


class Health:
    """What faults leave of the cluster, as the scheduler last heard (read-only: the scheduler keeps it current).

    Ports are named as in the topology (``n3.snic.rx``); engine groups as the cluster names them (``pe0`` a prefill
    group, ``de3`` a decode node's engines)."""

    __slots__ = ("_factors", "_groups_down")

    def __init__(self, factors: Mapping[str, float] | None = None, groups_down: frozenset[str] = frozenset()) -> None:
        self._factors: Mapping[str, float] = MappingProxyType(dict(factors or {}))
        self._groups_down: frozenset[str] | set[str] = groups_down

    @classmethod
    def _live(cls, factors: dict[str, float], groups_down: set[str]) -> Health:
        """A view over the scheduler's own (changing) state."""
        health = cls()
        health._factors, health._groups_down = MappingProxyType(factors), groups_down
        return health

    @property
    def all_up(self) -> bool:
        """No port is down or degraded."""
        return not self._factors

    def factor(self, port: str) -> float:
        """What is left of ``port``'s rates (1 as specified, 0 down)."""
        return self._factors.get(port, 1.0)

    def up(self, port: str) -> bool:
        return self._factors.get(port, 1.0) > 0.0

    def can_read(self, node: int) -> bool:
        """Node ``node``'s storage NIC can bring KV in (its receive side is not down)."""
        return self.up(f"n{node}.snic.rx")

    def engine_up(self, group: str) -> bool:
        """Engine group ``group`` is up (not crashed, or back)."""
        return group not in self._groups_down

    @property
    def groups_down(self) -> frozenset[str]:
        return frozenset(self._groups_down)

    def __repr__(self) -> str:
        return f"Health(factors={dict(self._factors)}, groups_down={sorted(self._groups_down)})"


class QueueView(Sequence[Request]):
    """A queue of requests, read-only, oldest first: the scheduler's own deque without a copy."""

    __slots__ = ("_items",)

    def __init__(self, items: deque[Request] | Sequence[Request] = ()) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items)

    @overload
    def __getitem__(self, index: int) -> Request: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Request]: ...
    def __getitem__(self, index: int | slice) -> Request | Sequence[Request]:
        if isinstance(index, slice):
            return tuple(self._items)[index]
        return self._items[index]

    def __repr__(self) -> str:
        return f"QueueView({[r.id for r in self._items]})"


_NO_HEALTH = Health()
_NONE_KEPT: Mapping[int, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PrefillView:
    """A prefill fetch: the global FIFO of requests waiting for a PE, every PE that is up (id order) and each node's
    storage read queue in tokens (``read_q``, every node of the cluster)."""

    queue: Sequence[Request]
    engines: Sequence[EngineState]
    read_q: Mapping[int, int]
    health: Health = field(default=_NO_HEALTH)
    stamp: int = 0
    """The scheduler's assignment count so far: the next assignment is ``stamp + 1`` (see :attr:`EngineState.given`)."""


@dataclass(frozen=True, slots=True)
class RouteView:
    """Phase 1 of the DE selection (§6.2): requests that have a PE and wait for a decode group, oldest first, and the
    decode groups that are up (node order); ``kept``: per context whose KV a decode GPU keeps in HBM across turns,
    that GPU's node (empty unless the system retains KV)."""

    queue: Sequence[Request]
    groups: Sequence[GroupState]
    health: Health = field(default=_NO_HEALTH)
    stamp: int = 0
    kept: Mapping[int, int] = field(default_factory=lambda: _NONE_KEPT)


@dataclass(frozen=True, slots=True)
class DecodeView:
    """Phase 2 for decode group ``group`` (a decode node): its private queue, oldest first, and its DEs; ``kept``: per
    context whose KV a decode GPU keeps in HBM across turns, that DE's id (a request given it loads its hit from
    there)."""

    group: int
    queue: Sequence[Request]
    engines: Sequence[EngineState]
    health: Health = field(default=_NO_HEALTH)
    kept: Mapping[int, int] = field(default_factory=lambda: _NONE_KEPT)


@dataclass(frozen=True, slots=True)
class ReadView:
    """Where ``request``'s hit KV is read, once it has a PE on node ``pe_node`` and a DE on node ``de_node``."""

    request: Request
    pe_node: int
    de_node: int
    read_q: Mapping[int, int]
    health: Health = field(default=_NO_HEALTH)


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class PrefillAssignment:
    """``request`` (from :attr:`PrefillView.queue`) to PE ``engine`` (an :attr:`EngineState.id`)."""

    request: Request
    engine: int


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class DecodeRoute:
    """``request`` (from :attr:`RouteView.queue`) to decode group ``group`` (a :attr:`GroupState.node`)."""

    request: Request
    group: int


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class DecodeAssignment:
    """``request`` (from :attr:`DecodeView.queue`) to DE ``engine`` of the group."""

    request: Request
    engine: int
