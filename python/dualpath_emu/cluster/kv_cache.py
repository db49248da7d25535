"""Where the KV lives: a tier's index of the Full Blocks it holds, by context (an agent's token stream), with a
capacity and an eviction policy (docs/kv-cache.md).

A tier holds, per context, a prefix of its blocks: ``[0, blocks)`` (a context's KV only grows, and a later turn's
hit is a prefix of it). A full tier drops a context's blocks from the tail, the context chosen by its
:class:`Eviction` policy; a context with a request in flight is pinned (its blocks are being read or written) and
never chosen. A request's hit is what the tier holds of it when it is dispatched: the tokens beyond are computed
again by the prefill engine. A DRAM pool may write back (``[kv.pool] write = "back"``): the blocks a turn made stay
in the pool, *dirty*, and go to storage only when the pool drops them or has no room for them, so storage holds
every block the pool lacks. An index that places blocks tells the nodes what they hold (``on_node``): the blocks
each node's DRAM now holds, those it drops and those it writes back, which its decode engine's data plane applies
(real memory on the host backend). The index belongs to the scheduler, which dispatches (engine state, as in a live run);
it tells the run what happens through its observations (:class:`~dualpath_emu.cluster.observations.KvTier`,
``KvStored``, ``KvEvicted``, ``HitFound``), which the invariant checker follows block by block.

Bookkeeping is per context and per block count, never per token: a lookup, a store and an eviction are O(1)
but for the policy's choice (LRU: the least recently used context that is not pinned)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Callable, Container, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar, Final

from dualpath_emu.cluster.config import BLOCK_TOKENS, KvTierSpec
from dualpath_emu.cluster.observations import HitFound, KvEvicted, KvStored, KvTaken, KvTier, KvWritePolicy, KvWritten
from dualpath_emu.errors import UsageError
from dualpath_emu.runtime.engine import Extents, Observed

__all__ = [
    "EVICTIONS", "HBM", "POOL", "STORE", "HbmRetention", "Eviction", "EvictionError", "KvIndex", "LruEviction", "ToolWaitEviction", "TtlEviction", "make_eviction", "per_node",
]  # fmt: skip

STORE: Final = "store"
"""The storage cluster's tier (3FS)."""
HBM: Final = "hbm"
"""The decode GPUs' HBM, kept across turns (:class:`HbmRetention`)."""
POOL: Final = "pool"
"""The nodes' DRAM pool (a Mooncake store): blocks live on the node that wrote them, read over the compute network."""


class EvictionError(UsageError, ValueError):
    """An eviction policy answered what the index cannot use, or raised: one line naming it (exit 2)."""


class Eviction(ABC):
    """Which context a full tier drops blocks of. The index tells it each use of a context (a lookup, a store),
    each context whose agent has no turn to come and each context it no longer holds, and asks it for a victim,
    giving what it may not choose (the pinned contexts); it checks the answer (a context it holds, not pinned)."""

    name: ClassVar[str]

    def __init__(self, spec: KvTierSpec) -> None:
        """Made with its tier's settings (``spec.ttl_s`` and the like)."""
        self.spec = spec

    @abstractmethod
    def used(self, context: int, now_ns: int) -> None:
        """``context`` was looked up or stored at ``now_ns`` (the index holds blocks of it)."""

    def finished(self, context: int) -> None:
        """``context``'s agent has no turn to come."""

    @abstractmethod
    def dropped(self, context: int) -> None:
        """The index holds no block of ``context`` any more."""

    @abstractmethod
    def victim(self, pinned: Container[int]) -> int | None:
        """The context to drop blocks of next, not one of ``pinned`` (None: none can go)."""

    def expires_ns(self, last_use_ns: int) -> int | None:
        """When a context last used at ``last_use_ns`` goes whatever the pressure (None: never)."""
        return None


class LruEviction(Eviction):
    """The least recently used context first (a lookup or a store is a use)."""

    name = "lru"

    def __init__(self, spec: KvTierSpec) -> None:
        super().__init__(spec)
        self._order: OrderedDict[int, None] = OrderedDict()

    def used(self, context: int, now_ns: int) -> None:
        self._order[context] = None
        self._order.move_to_end(context)

    def dropped(self, context: int) -> None:
        self._order.pop(context, None)

    def victim(self, pinned: Container[int]) -> int | None:
        # Pinned contexts were used when their request was submitted: they gather at the recent end.
        return next((c for c in self._order if c not in pinned), None)


class TtlEviction(LruEviction):
    """A context idle for ``ttl_s`` goes, full or not (a time to live, as an API's prompt cache keeps a prefix
    for minutes); under pressure before that, the least recently used."""

    name = "ttl"

    def __init__(self, spec: KvTierSpec) -> None:
        super().__init__(spec)
        if not spec.ttl_s > 0:
            raise ValueError(f"eviction 'ttl' needs ttl_s > 0, got {spec.ttl_s}")
        self._ttl_ns = max(1, round(spec.ttl_s * 1e9))

    def expires_ns(self, last_use_ns: int) -> int | None:
        return last_use_ns + self._ttl_ns


class ToolWaitEviction(Eviction):
    """Keep the contexts of agents that will come back (waiting for a tool): a done agent's context goes first,
    the least recently used of those; only then a waiting agent's (as a time to live that pins KV through tool
    calls would, without its clock)."""

    name = "tool_wait"

    def __init__(self, spec: KvTierSpec) -> None:
        super().__init__(spec)
        self._done: OrderedDict[int, None] = OrderedDict()
        self._waiting: OrderedDict[int, None] = OrderedDict()

    def used(self, context: int, now_ns: int) -> None:
        order = self._done if context in self._done else self._waiting
        order[context] = None
        order.move_to_end(context)

    def finished(self, context: int) -> None:
        if self._waiting.pop(context, 0) is None:
            self._done[context] = None

    def dropped(self, context: int) -> None:
        self._done.pop(context, None)
        self._waiting.pop(context, None)

    def victim(self, pinned: Container[int]) -> int | None:
        for order in (self._done, self._waiting):
            for context in order:
                if context not in pinned:
                    return context
        return None


EVICTIONS: Final[Mapping[str, Callable[[KvTierSpec], Eviction]]] = {
    LruEviction.name: LruEviction, TtlEviction.name: TtlEviction, ToolWaitEviction.name: ToolWaitEviction,
}  # fmt: skip
"""The eviction policies by name (a scenario's ``eviction``)."""


def make_eviction(spec: KvTierSpec) -> Eviction:
    """The eviction policy ``spec`` names: a built-in one (:data:`EVICTIONS`) or a user's class by ``module:Name``
    or ``/absolute/file.py:Name`` (a scenario resolves a relative file against its folder), made with ``spec``."""
    name = spec.eviction
    if name in EVICTIONS:
        return EVICTIONS[name](spec)
    from dualpath_emu.cluster.user_systems import SystemLoader  # (user code: only when named)

    cls = SystemLoader(Path("/"), "kv eviction").load_class(name, Eviction)
    try:
        made = cls(spec)
    except Exception as error:  # the user's code: say whose, in one line
        raise EvictionError(f"kv eviction {name!r}: making it raised {type(error).__name__}: {error}") from None
    return _Guarded(made, name)


class _Guarded(Eviction):
    """A user's eviction policy, each call's exception turned into an :class:`EvictionError` naming it (the
    built-in ones are called directly)."""

    def __init__(self, inner: Eviction, spec: str) -> None:
        super().__init__(inner.spec)
        self.inner, self.name = inner, spec  # type: ignore[misc]  # (a ClassVar elsewhere: this instance's)

    def _call(self, method: str, *args: object) -> object:
        try:
            return getattr(self.inner, method)(*args)
        except Exception as error:
            raise EvictionError(
                f"kv eviction {self.name!r}: {method}() raised {type(error).__name__}: {error}"
            ) from None

    def used(self, context: int, now_ns: int) -> None:
        self._call("used", context, now_ns)

    def finished(self, context: int) -> None:
        self._call("finished", context)

    def dropped(self, context: int) -> None:
        self._call("dropped", context)

    def victim(self, pinned: Container[int]) -> int | None:
        return self._call("victim", pinned)  # type: ignore[return-value]  # checked by the index

    def expires_ns(self, last_use_ns: int) -> int | None:
        return self._call("expires_ns", last_use_ns)  # type: ignore[return-value]


class KvIndex:
    """One tier's index (see the module): ``find`` at dispatch, ``pin`` while a request is in flight, ``store``
    as its KV is complete, ``expire`` when a time to live may have run out. For an index that places blocks,
    ``on_node(node, put, drop, write)`` says what changed on ``node``: the blocks it holds now, those it no longer
    holds, and (``write_back``: the tier writes back) the dirty ones it must write to storage now."""

    def __init__(
        self, tier: str, spec: KvTierSpec, block_bytes: int, observe: Callable[[Observed], None],
        eviction: Eviction | None = None, discard: Callable[[Extents], None] | None = None, placed: bool = False,
        on_node: Callable[[int, Extents, Extents, Extents], None] | None = None, write_back: bool = False,
    ) -> None:  # fmt: skip
        if (write_back or on_node is not None) and not placed:
            raise ValueError(f"{tier}: a tier that writes back must place its blocks (it writes them from their node)")
        if write_back and on_node is None:
            raise ValueError(f"{tier}: a tier that writes back needs on_node (who writes its blocks)")
        self.tier = tier
        self.capacity = spec.capacity_bytes
        self.block_bytes = block_bytes
        self.eviction = eviction if eviction is not None else make_eviction(spec)
        self._observe = observe
        self._discard = discard
        """Where evicted blocks go: the data plane, which drops them if it holds real ones (the host backend)."""
        self.blocks: dict[int, int] = {}
        """Per context, the blocks ``[0, n)`` held."""
        self.used_bytes = 0
        self._pins: Counter[int] = Counter()
        self._promised: dict[int, int] = {}
        """Per pinned context, the blocks its requests in flight will have when they end (written through as made)."""
        self._promised_node: dict[int, int] = {}
        """Per pinned context, the node its request in flight writes its blocks on, once known (:meth:`placed`)."""
        self._last_use: dict[int, int] = {}
        self._runs: dict[int, list[list[int]]] | None = {} if placed else None
        """``placed``: per context, where its blocks are, as ``[end block, node, dirty]`` runs in block order (a
        store places what it adds on the node that wrote it; ``dirty`` 1: not in storage, written back when dropped)."""
        self._write_back = write_back
        self._on_node = on_node
        self._ttl_ns = max(1, round(spec.ttl_s * 1e9)) if spec.ttl_s > 0 else 0
        """A time to live whatever the eviction policy (``ttl_s`` > 0): an idle context goes when it runs out."""
        self._in_storage_to: dict[int, int] = {}
        """A tier that writes back: per context, the block below which every block it does not hold is in storage
        (written back when dropped, or when there was no room for it): stored again, such a block is clean."""
        self._promised_clean: dict[int, int] = {}
        """Per pinned context, the blocks below which its request in flight found its KV in storage (read, not made)."""

    def start(self) -> None:
        """Say the tier's capacity (before its first block), and that it writes back if it does."""
        self._observe(KvTier(self.tier, self.capacity, self.block_bytes))
        if self._write_back:
            self._observe(KvWritePolicy(self.tier, "back"))

    def find(self, rid: int, context: int, hit: int, now_ns: int) -> int:
        """The tokens of request ``rid``'s hit of ``hit`` tokens of ``context`` held here (the rest is computed
        again); a use of the context. A request of the context still in flight here has written its blocks through
        as it made them (its end may not have reached the scheduler yet, as in a live run): they are held first (by
        an index that places blocks, once :meth:`placed` named their node)."""
        promised = self._promised.get(context, 0)
        if promised > self.blocks.get(context, 0):
            node = self._promised_node.get(context, -1)
            if self._runs is None or node >= 0:  # (a pool holds them once it knows their node)
                self.store(context, promised, now_ns, node=node, clean=self._promised_clean.get(context, 0))
        held = self.blocks.get(context, 0)
        found = hit if held >= hit // BLOCK_TOKENS else held * BLOCK_TOKENS  # a whole context: its partial block too
        if held:
            self._use(context, now_ns)
        if hit:
            self._observe(HitFound(rid, context, self.tier, found, hit - found))
        return found

    def pin(self, context: int, blocks: int = 0, clean: int = 0) -> None:
        """A request of ``context`` is in flight, to end with ``blocks`` Full Blocks of it, the first ``clean`` of
        them found in storage: its blocks stay."""
        self._pins[context] += 1
        if blocks > self._promised.get(context, 0):
            self._promised[context] = blocks
        # (two in flight: the fewer, so that no block made by either counts as in storage)
        self._promised_clean[context] = min(clean, self._promised_clean.get(context, clean))

    def placed(self, context: int, node: int) -> None:
        """The request of pinned ``context`` in flight writes its blocks on ``node`` (its decode node)."""
        if context in self._pins:
            self._promised_node[context] = node

    def unpin(self, context: int) -> None:
        pins = self._pins
        pins[context] -= 1
        if pins[context] <= 0:
            del pins[context]
            self._promised.pop(context, None)
            self._promised_node.pop(context, None)
            self._promised_clean.pop(context, None)

    def where(self, context: int, tokens: int) -> tuple[int, ...]:
        """Where the first ``tokens`` tokens of ``context`` (what :meth:`find` found) are: ``node, tokens`` pairs,
        flat, one per run of blocks on one node, in block order (a partial last block counts with the last block's
        node; :func:`per_node` adds them up by node); empty for an index that does not place."""
        held = self._runs.get(context) if self._runs is not None else None
        if not held or tokens <= 0:
            return ()
        out: list[int] = []
        start = 0
        for end, node, _ in held:
            stop = min(end * BLOCK_TOKENS, tokens)
            if stop <= start:
                break
            if out and out[-2] == node:
                out[-1] += stop - start
            else:
                out += (node, stop - start)
            start = stop
        if start < tokens:  # the partial block of a context held whole
            out[-1] += tokens - start
        return tuple(out)

    def store(self, context: int, blocks: int, now_ns: int, last: bool = False, node: int = -1, clean: int = 0) -> None:
        """``context``'s KV now has ``blocks`` Full Blocks (the new ones made by ``node``, which an index that places
        blocks must be told; written through as they were made, or, by a tier that writes back, only the first
        ``clean`` in storage): hold them, evicting others' as the capacity needs (what does not fit is not held, and
        written back if dirty); ``last``: its agent is done."""
        if node < 0 and self._runs is not None:
            raise ValueError(f"{self.tier}: blocks of context {context} stored without the node that holds them")
        held = self.blocks.get(context, 0)
        if blocks > held:
            if self._write_back:
                clean = max(clean, self._in_storage_to.get(context, 0))
            room = (self.capacity - self.used_bytes) // self.block_bytes
            while room < blocks - held and self._evict(context, blocks - held - room):
                room = (self.capacity - self.used_bytes) // self.block_bytes
            kept = max(0, min(blocks - held, room))
            if kept > 0:
                self.blocks[context] = held + kept
                self.used_bytes += kept * self.block_bytes
                if self._runs is not None:
                    runs = self._runs.setdefault(context, [])
                    self._place(runs, held, held + kept, node, clean)
                self._observe(KvStored(self.tier, context, held, kept))
            first_dirty = max(held + kept, clean)
            write: Extents = ()
            if self._write_back and blocks > first_dirty:  # made here, and no room: to storage now
                write = self._written(node, context, first_dirty, blocks - first_dirty)
                self._in_storage_to[context] = blocks
            if self._on_node is not None and (kept > 0 or write):
                self._on_node(node, ((context, held, kept),) if kept > 0 else (), (), write)
        if self.blocks.get(context):
            self._use(context, now_ns)
            if last:
                self.eviction.finished(context)

    def _place(self, runs: list[list[int]], start: int, end: int, node: int, clean: int) -> None:
        """Add blocks ``[start, end)`` on ``node`` to a context's ``runs``, those from ``clean`` on dirty if the
        tier writes back."""
        dirty_from = clean if self._write_back else end
        for lo, hi, dirty in ((start, min(end, dirty_from), 0), (max(start, dirty_from), end, 1)):
            if hi <= lo:
                continue
            if runs and runs[-1][1] == node and runs[-1][2] == dirty:
                runs[-1][0] = hi
            else:
                runs.append([hi, node, dirty])

    def _written(self, node: int, context: int, first: int, blocks: int) -> Extents:
        """Dirty blocks written back from ``node``: observed, and the extent to write."""
        self._observe(KvWritten(self.tier, node, context, first, blocks))
        return ((context, first, blocks),)

    def expire(self, context: int, now_ns: int) -> None:
        """A time to live of ``context`` may have run out at ``now_ns``: drop it if so (and not pinned)."""
        expiry = self.next_expiry_ns(context)
        if expiry is not None and expiry <= now_ns and context not in self._pins and self.blocks.get(context):
            self._drop(context, self.blocks[context])

    def next_expiry_ns(self, context: int) -> int | None:
        """When ``context`` expires if not used again (None: never): its tier's ``ttl_s`` or its eviction policy's
        time to live, whichever comes first."""
        last = self._last_use.get(context)
        if last is None:
            return None
        expiry = self.eviction.expires_ns(last)
        if self._ttl_ns:
            own = last + self._ttl_ns
            expiry = own if expiry is None else min(expiry, own)
        return expiry

    def _use(self, context: int, now_ns: int) -> None:
        self._last_use[context] = now_ns
        self.eviction.used(context, now_ns)

    def _evict(self, storing: int, need: int) -> bool:
        """Drop up to ``need`` blocks from the tail of the policy's victim (never ``storing`` or a pinned context);
        False: none can go."""
        pinned = _Pinned(self._pins, storing)
        victim = self.eviction.victim(pinned)
        if victim is None:
            return False
        if type(victim) is not int or victim in pinned or not self.blocks.get(victim):
            held = type(victim) is int and self.blocks.get(victim)
            raise EvictionError(f"eviction {self.eviction.name!r} chose context {victim!r}, which the {self.tier} "
                                f"tier {'may not drop (in use)' if held else 'holds no block of'}")  # fmt: skip
        self._drop(victim, min(need, self.blocks[victim]))
        return True

    def _drop(self, context: int, blocks: int) -> None:
        held = self.blocks[context]
        left = held - blocks
        self.used_bytes -= blocks * self.block_bytes
        self._observe(KvEvicted(self.tier, context, left, blocks))
        if self._discard is not None:
            self._discard(((context, left, blocks),))
        if self._runs is not None:
            runs = self._runs[context]
            if self._write_back:  # what it drops is in storage from now on, written back here if it was dirty
                self._in_storage_to[context] = max(held, self._in_storage_to.get(context, 0))
            if self._on_node is not None:  # each node drops its part, writing its dirty blocks to storage first
                start = 0
                for end, node, dirty in runs:
                    lo = max(start, left)
                    if end > lo:
                        written = self._written(node, context, lo, end - lo) if dirty else ()
                        self._on_node(node, (), ((context, lo, end - lo),), written)
                    start = end
            while len(runs) > 1 and runs[-2][0] >= left:
                runs.pop()
            runs[-1][0] = left
        if left:
            self.blocks[context] = left
        else:
            if self._runs is not None:
                del self._runs[context]
            del self.blocks[context]
            self._last_use.pop(context, None)
            self.eviction.dropped(context)


def per_node(runs: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """:meth:`KvIndex.where`'s runs as ``(node, tokens)`` per node, in the order of each node's first block."""
    out: dict[int, int] = {}
    for i in range(0, len(runs), 2):
        out[runs[i]] = out.get(runs[i], 0) + runs[i + 1]
    return tuple(out.items())


class _Pinned:
    """What an eviction may not choose: the pinned contexts and the one being stored."""

    __slots__ = ("_pins", "_storing")

    def __init__(self, pins: Counter[int], storing: int) -> None:
        self._pins, self._storing = pins, storing

    def __contains__(self, context: object) -> bool:
        return context == self._storing or context in self._pins


class HbmRetention:
    """Decode GPUs keeping a context's KV in HBM after its turn (the scheduler's state, like the other tiers).

    When a turn ends, its context's KV (prompt and output, whole blocks) stays on the DE GPU that decoded it, in HBM
    the GPU's running requests do not need; when they need it, the GPU's :class:`Eviction` policy (``spec``'s: LRU by
    default, the least recently kept first) chooses what goes. A later
    turn of the context given that DE takes the KV over: its hit is already in that GPU's HBM, so nothing is read
    and only the new tokens' KV comes from the prefill engine. Given another DE, the kept copy is dropped (the hit is
    read as usual; storage has it, written through). A kept copy is never read from elsewhere, and nothing is kept
    for an agent's last turn. Observed as the tier ``hbm``: :class:`KvStored` when kept, :class:`KvEvicted` when
    dropped, :class:`KvTaken` when taken over, :class:`HitFound` at each assignment of a request with a hit."""

    def __init__(self, engines: int, gpus: int, hbm_bytes: int, block_bytes: int,
                 observe: Callable[[Observed], None], spec: KvTierSpec | None = None) -> None:  # fmt: skip
        self.spec = spec if spec is not None else KvTierSpec()
        self._evictions: dict[int, Eviction] = {}
        """Per DE, its eviction policy (one each: a GPU's HBM is its own)."""
        self.block_bytes = block_bytes
        self.capacity = engines * hbm_bytes
        self._observe = observe
        self.kept: dict[int, OrderedDict[int, int]] = {}
        """Per DE, the contexts it keeps and their blocks, least recently kept first."""
        self.on: dict[int, int] = {}
        """Per kept context, its DE (what a policy's ``DecodeView.kept`` shows, read-only)."""
        self.on_view: Mapping[int, int] = MappingProxyType(self.on)
        self.node_view: Mapping[int, int] = _NodeOf(self.on, gpus)
        """Per kept context, its DE's node (``RouteView.kept``)."""
        self.kept_bytes: Counter[int] = Counter()
        self._kept_at: dict[int, int] = {}  # Per kept context, when it was kept (its time to live's start).

    def start(self) -> None:
        self._observe(KvTier(HBM, self.capacity, self.block_bytes))

    def keep(self, context: int, tokens: int, de: int, room_bytes: int, now_ns: int = 0) -> bool:
        """A turn of ``context`` of ``tokens`` tokens ended on DE ``de`` at ``now_ns``, which has ``room_bytes`` of HBM
        no running request holds: keep its KV there if it fits, dropping that DE's least recently kept contexts as
        needed; True if kept."""
        self.drop(context)
        blocks = -(-tokens // BLOCK_TOKENS)
        size = blocks * self.block_bytes
        if blocks == 0 or size > room_bytes:
            return False
        self.make_room(de, room_bytes - size)
        self.kept.setdefault(de, OrderedDict())[context] = blocks
        self.on[context] = de
        self._kept_at[context] = now_ns
        self.kept_bytes[de] += size
        self._eviction(de).used(context, now_ns)
        self._observe(KvStored(HBM, context, 0, blocks))
        return True

    def _eviction(self, de: int) -> Eviction:
        eviction = self._evictions.get(de)
        if eviction is None:
            eviction = self._evictions[de] = make_eviction(self.spec)
        return eviction

    def expire(self, context: int, kept_ns: int, now_ns: int) -> None:
        """A time to live of ``context``'s KV kept at ``kept_ns`` ran out at ``now_ns``: drop it if it is that copy."""
        if self._kept_at.get(context) == kept_ns:
            self.drop(context)

    def make_room(self, de: int, room_bytes: int) -> None:
        """DE ``de`` may keep no more than ``room_bytes``: drop what its eviction policy chooses until it does."""
        kept = self.kept.get(de)
        while kept and self.kept_bytes[de] > room_bytes:
            eviction = self._eviction(de)
            victim = eviction.victim(())
            if type(victim) is not int or victim not in kept:
                raise EvictionError(f"eviction {eviction.name!r} chose context {victim!r}, which DE {de} does not "
                                    "keep in HBM")  # fmt: skip
            self.drop(victim)

    def take(self, rid: int, context: int, hit: int, de: int) -> bool:
        """Request ``rid`` (``hit`` tokens of ``context``) goes to DE ``de``: True if ``de`` keeps its context, which
        it takes over; a copy on another DE is dropped."""
        where = self.on.get(context)
        if where == de and hit <= self.kept[de][context] * BLOCK_TOKENS:
            if hit:
                self._observe(HitFound(rid, context, HBM, hit, 0))
            blocks = self.kept[de].pop(context)
            del self.on[context]
            del self._kept_at[context]
            self.kept_bytes[de] -= blocks * self.block_bytes
            self._eviction(de).dropped(context)
            self._observe(KvTaken(HBM, context, blocks))
            return True
        if where is not None:
            self.drop(context)
        if hit:
            self._observe(HitFound(rid, context, HBM, 0, hit))
        return False

    def drop(self, context: int) -> None:
        """Drop ``context``'s kept KV, if any DE keeps it."""
        de = self.on.pop(context, None)
        if de is not None:
            del self._kept_at[context]
            blocks = self.kept[de].pop(context)
            self.kept_bytes[de] -= blocks * self.block_bytes
            self._eviction(de).dropped(context)
            self._observe(KvEvicted(HBM, context, 0, blocks))

    def drop_engines(self, engines: Container[int]) -> None:
        """These DEs lost their HBM (their engine crashed or was started again): what they kept is gone."""
        for de in [de for de in self.kept if de in engines]:
            for context in list(self.kept[de]):
                self.drop(context)


class _NodeOf(Mapping[int, int]):
    """A read-only view of a context -> DE mapping as context -> the DE's node."""

    __slots__ = ("_on", "_gpus")

    def __init__(self, on: Mapping[int, int], gpus: int) -> None:
        self._on, self._gpus = on, gpus

    def __getitem__(self, context: int) -> int:
        return self._on[context] // self._gpus

    def __iter__(self) -> Iterator[int]:
        return iter(self._on)

    def __len__(self) -> int:
        return len(self._on)
