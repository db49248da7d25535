"""The engine contract: state machines fed inputs with the time, giving outputs (docs/architecture.md; the sans-I/O
pattern of h11 and quinn-proto).

An :class:`Engine` is stepped by a driver. Its inputs (each with ``now_ns``) are a message (:meth:`Engine.receive`),
the end of data-plane work or a timer (the ``then`` it gave with the request) and :meth:`Engine.start`. Its
outputs go to an :class:`Outbox` (messages to other engines by name, typed observations :class:`Observed`) and a
:class:`DataPlane` (transfers, storage I/O, forward passes, timers and decode stepping, each with its ``then``;
``None``: nobody waits). Both only queue: nothing an engine asks for happens before its handler returns, so an
engine knows nothing of asyncio, processes or which plane it has, and a test steps it by hand. The drivers:
:mod:`dualpath_emu.runtime.virtual` and :mod:`dualpath_emu.runtime.engine_actor` (live)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeAlias, TypeVar

from dualpath_emu.messages import Message

__all__ = [
    "DataPlane", "DecodeReport", "Engine", "Extents", "extents_of", "flat_extents", "Hop", "Observed", "Outbox", "Then", "UnhandledInputError",
    "Watch", "forward_bytes", "on", "seeded_random", "watching",
]  # fmt: skip

Then: TypeAlias = Callable[[int], None]
"""What to call, with the time in ns, when a request to the data plane ends (or a timer fires)."""

DecodeReport: TypeAlias = Callable[[int, list[tuple[int, int]], list[tuple[int, int, int, int, int]]], None]
"""``report(now, ended, spans)`` of a decode node stepped by the data plane (:meth:`DataPlane.decode_node`)."""

Hop: TypeAlias = tuple[tuple[int, ...], int, int]
"""A transfer along a path of port ids: ``(path, lane, size_bytes)`` (per layer, in a forward pass)."""

Extents: TypeAlias = tuple[tuple[int, int, int], ...]
"""Which stored objects a storage I/O moves, as ``(context, first block, blocks)`` runs (the cluster's Full
Blocks). A modelled data plane ignores them; one that moves real bytes (the host backend) reads and writes
exactly those."""


def flat_extents(extents: Extents) -> tuple[int, ...]:
    """``extents`` as one flat tuple of ``(context, first, blocks)`` triples (a message's or a frame's field)."""
    return tuple(x for extent in extents for x in extent)


def extents_of(flat: Sequence[int]) -> Extents:
    """The extents a flat run of triples holds (:func:`flat_extents` undone)."""
    return tuple((flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat) - 2, 3))


_F = TypeVar("_F", bound=Callable[..., None])
_HopLike: TypeAlias = tuple[Sequence[int], int, int]
"""``(path, lane, size_bytes)``: a :data:`Hop`, or a ``LayerTransfer``."""
_ON_ATTR = "__engine_inputs__"


class DataPlane(Protocol):
    """What moves bytes and keeps time for engines (docs/architecture.md, "One data-plane contract")."""

    def transfer(self, path: tuple[int, ...], lane: int, size_bytes: int, then: Then | None) -> None:
        """Move ``size_bytes`` on ``lane`` along ``path`` (port ids), starting now."""

    def io(self, storage_node: int, kind: str, lane: int, size_bytes: int, extents: Extents, then: Then | None) -> None:
        """A storage ``"read"`` or ``"write"`` on ``storage_node``, queued now."""

    def forward(
        self, n_layers: int, ranks: Sequence[tuple[Hop | None, int, Hop | None]], ffn_ns: int,
        collectives: Sequence[Hop], then: Then,
    ) -> None:  # fmt: skip
        """A forward pass of ``n_layers`` layers over ``ranks``, expanded by the core (``core/src/forward.rs``)."""

    def timer(self, at_ns: int, then: Then) -> None:
        """Call ``then`` at ``at_ns`` (now, if that is past)."""

    def clock_ns(self) -> int:
        """The data plane's clock (for measurements around engines, never for their decisions)."""

    def set_port_factor(self, port: int, factor: float) -> None:
        """A fault: ``port``'s rates × ``factor`` from now on (1 as specified, 0 down: ``Core.set_port_factor``)."""

    def set_port_latency(self, port: int, extra_ns: int) -> None:
        """A fault: ``extra_ns`` added to what starts crossing ``port`` from now on (``Core.set_port_latency``)."""

    def decode_node(self, report: DecodeReport, **spec: Any) -> int:
        """Add a node's decode GPUs, stepped by the plane; ``report(now, ended, spans)`` when some requests ended."""
        ...

    def decode_join(
        self, node: int, gpu: int, rid: int, prompt: int, gen: int, produced: int, stored_blocks: int, context: int
    ) -> None:
        """Request ``rid`` joins GPU ``gpu`` of decode node ``node`` (a handle) now."""

    def decode_bytes(self, node: int) -> dict[str, Any] | None:
        """What decode node ``node`` moved on its own so far (as of its last report; ``None`` before)."""
        ...

    def decode_reset(self, node: int) -> None:
        """An engine crash: decode node ``node`` drops every request now; the spans it closes come with a report."""

    def discard(self, extents: Extents) -> None:
        """The stored blocks of ``extents`` are no longer kept (a bounded store evicted them): a plane that holds
        real blocks drops them now; one that models the bytes has nothing to drop."""

    def pool(self, node: int, op: str, extents: Extents) -> None:
        """The DRAM pool on node ``node`` now holds (``"put"``), no longer holds (``"drop"``) or serves (``"read"``)
        the Full Blocks of ``extents``: a plane that holds real blocks keeps them in that node's memory and checks
        them as they are dropped or read; one that models the bytes has nothing to keep (the bytes a read moves
        are a transfer's)."""


class Observed(Protocol):
    """A typed record of what an engine observed: logged as ``kind`` and ``summary()``, its fields checked."""

    @property
    def kind(self) -> str: ...

    def summary(self) -> str: ...


@dataclass(frozen=True)
class Watch:
    """Who, beside the event log, is told of an engine's observations as they are made: per record type a
    ``callback(now_ns, record)`` (a run's metrics, the end of its workload); the types in ``unlogged`` (the
    measurements) never go into the event log, watched or not, so the log and its hash are the decisions'.
    A driver holds one; :func:`watching` joins several."""

    callbacks: Mapping[type, Callable[[int, Any], None]] = field(default_factory=dict)
    unlogged: AbstractSet[type] = frozenset()


def watching(*watches: Watch) -> Watch:
    """One :class:`Watch` that tells each of ``watches`` of what it watches, in the order given."""
    callbacks: dict[type, list[Callable[[int, Any], None]]] = {}
    for watch in watches:
        for kind, callback in watch.callbacks.items():
            callbacks.setdefault(kind, []).append(callback)

    def chain(each: list[Callable[[int, Any], None]]) -> Callable[[int, Any], None]:
        if len(each) == 1:
            return each[0]

        def tell(now_ns: int, record: Any) -> None:
            for callback in each:
                callback(now_ns, record)

        return tell

    return Watch({k: chain(v) for k, v in callbacks.items()}, frozenset().union(*(w.unlogged for w in watches)))


class Outbox(Protocol):
    """Where an engine's messages and observations go (one per engine: it knows the sender's name)."""

    def send(self, recipient: str, msg: Message) -> None:
        """Send ``msg`` to the engine called ``recipient``; delivered after the current input is handled."""

    def observe(self, record: Observed) -> None:
        """Add ``record`` to the run's observations at the current time: the event log, and the driver's
        :class:`Watch` (a measurement only there)."""


class UnhandledInputError(TypeError):
    """An engine got a message type it has no handler for."""


def on(*message_types: type[Message]) -> Callable[[_F], _F]:
    """Mark an :class:`Engine` method as the handler of ``message_types``: ``method(now_ns, msg, sender)``."""

    def mark(method: _F) -> _F:
        setattr(method, _ON_ATTR, getattr(method, _ON_ATTR, ()) + message_types)
        return method

    return mark


class Engine:
    """Base of engines: a name, an :class:`Outbox` (``self.out``) and handlers by message type (:func:`on`)."""

    _inputs: ClassVar[dict[type[Message], str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = {t: name for name, value in cls.__dict__.items() for t in getattr(value, _ON_ATTR, ())}
        cls._inputs = {**cls._inputs, **own}

    def __init__(self, name: str, out: Outbox) -> None:
        self.name = name
        self.out = out
        self._bound: dict[type[Message], Callable[[int, Any, str], None]] = {}
        """The handlers :meth:`receive` has looked up, by message type (the virtual driver calls them directly)."""

    def start(self, now_ns: int) -> None:
        """The run starts (engines are started in assembly order, before any message is delivered)."""

    def receive(self, now_ns: int, msg: Message, sender: str) -> None:
        """Handle message ``msg`` from ``sender`` at ``now_ns``."""
        try:
            handler = self._bound[type(msg)]
        except KeyError:
            handler = self._bind(type(msg))
        handler(now_ns, msg, sender)

    def _bind(self, message_type: type[Message]) -> Callable[[int, Any, str], None]:
        for cls in message_type.__mro__:
            name = self._inputs.get(cls)
            if name is not None:
                handler: Callable[[int, Any, str], None] = getattr(self, name)
                self._bound[message_type] = handler
                return handler
        raise UnhandledInputError(f"engine {self.name!r} has no handler for {message_type.__qualname__}")


def seeded_random(seed: int, stream: str) -> random.Random:
    """The random stream ``stream`` of ``seed``: the same in every process (SHA-256 of ``"<seed>/<stream>"``)."""
    digest = hashlib.sha256(f"{seed}/{stream}".encode()).digest()
    return random.Random(int.from_bytes(digest[:16], "big"))


def forward_bytes(
    n_layers: int, ranks: Iterable[tuple[_HopLike | None, int, _HopLike | None]], collectives: Iterable[_HopLike]
) -> int:
    """Every byte a forward pass moves (each rank's loads and stores and the collectives, in every layer)."""
    size = sum(hop[2] for rank in ranks for hop in (rank[0], rank[2]) if hop is not None)
    return n_layers * (size + sum(c[2] for c in collectives))
