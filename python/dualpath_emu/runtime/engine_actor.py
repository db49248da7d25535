"""The live driver's shell: an asyncio actor around an engine (docs/architecture.md).

In a live run (``--mode realtime``, the host backend) each engine runs in an :class:`EngineActor` of its process's actor
system (:mod:`~dualpath_emu.runtime.zmq_transport` carries its messages between processes). The actor only translates: a
message it is told becomes :meth:`~dualpath_emu.runtime.engine.Engine.receive` with the loop's clock; the engine's
outbox is the actor system's ``tell`` and ``record`` (an observation as its log line's fields) and its ``watch``
(told the time of the input being handled, as in virtual time); its data plane is the
process's (:class:`LiveDataPlane` over the data-plane service's remote core, a one-process run's own core, or the host
backend's real bytes), handed in. An exception in the engine fails the run as any actor's would."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from dualpath_emu.messages import Message
from dualpath_emu.runtime.actors import Actor, ActorSystem
from dualpath_emu.runtime.core_work import Completion, CoreWork
from dualpath_emu.runtime.engine import DataPlane, DecodeReport, Engine, Extents, Hop, Observed, Outbox, Then

__all__ = ["EngineActor", "LiveDataPlane"]


class LiveDataPlane:
    """The engines' :class:`~dualpath_emu.runtime.engine.DataPlane` over a live process's data plane
    (:class:`~dualpath_emu.runtime.core_work.CoreWork`, bound to the process's loop). ``then`` runs as a loop
    callback with the plane's clock; an error in it, or a request the core refuses, goes to ``fail``. Timers
    are the loop's own (a round trip to a remote data plane per timer would only add lag)."""

    def __init__(self, plane: CoreWork, fail: Callable[[Exception], None], input_at: _InputTime | None = None) -> None:
        self.plane = plane
        self._fail = fail
        self._input = input_at if input_at is not None else _InputTime()

    def _guard(self, then: Then) -> Callable[[], None]:
        clock, fail, input_at = self.plane.clock_ns, self._fail, self._input

        def done() -> None:
            try:
                now = input_at.now_ns = clock()
                then(now)
            except Exception as error:
                fail(error)

        return done

    def transfer(self, path: tuple[int, ...], lane: int, size_bytes: int, then: Then | None) -> None:
        if then is None:
            self.plane.transfer_detached(path, lane, size_bytes)
        else:
            self.plane.transfer_then(path, lane, size_bytes, self._guard(then), self._fail)

    def io(self, storage_node: int, kind: str, lane: int, size_bytes: int, extents: Extents, then: Then | None) -> None:
        if then is None:
            self.plane.io_detached(storage_node, kind, lane, size_bytes, extents)
        else:
            self.plane.io_then(storage_node, kind, lane, size_bytes, self._guard(then), self._fail, extents)

    def forward(
        self, n_layers: int, ranks: Sequence[tuple[Hop | None, int, Hop | None]], ffn_ns: int,
        collectives: Sequence[Hop], then: Then,
    ) -> None:  # fmt: skip
        done, fail = self._guard(then), self._fail

        def ended(future: asyncio.Future[Completion]) -> None:
            error = future.exception()
            if error is not None:
                fail(error)  # type: ignore[arg-type]  # a core error is an Exception
            else:
                done()

        self.plane.forward(n_layers, ranks, ffn_ns=ffn_ns, collectives=collectives).add_done_callback(ended)

    def timer(self, at_ns: int, then: Then) -> None:
        self.plane.loop.call_at(at_ns / 1e9, self._guard(then))  # the loop's time() is the plane's clock in seconds

    def clock_ns(self) -> int:
        return self.plane.clock_ns()

    def set_port_factor(self, port: int, factor: float) -> None:
        self.plane.set_port_factor(port, factor)

    def set_port_latency(self, port: int, extra_ns: int) -> None:
        self.plane.set_port_latency(port, extra_ns)

    def decode_node(self, report: DecodeReport, **spec: Any) -> int:
        clock, fail, input_at = self.plane.clock_ns, self._fail, self._input

        def reported(ended: list[tuple[int, int]], spans: list[tuple[int, int, int, int, int]]) -> None:
            try:
                now = input_at.now_ns = clock()
                report(now, ended, spans)
            except Exception as error:
                fail(error)

        return self.plane.decode_node(reported, spec)

    def decode_join(
        self, node: int, gpu: int, rid: int, prompt: int, gen: int, produced: int, stored_blocks: int, context: int
    ) -> None:
        self.plane.decode_join(node, gpu, rid, prompt, gen, produced, stored_blocks, context)

    def decode_bytes(self, node: int) -> dict[str, Any] | None:
        return self.plane.decode_bytes(node)

    def decode_reset(self, node: int) -> None:
        self.plane.decode_reset(node)

    def discard(self, extents: Extents) -> None:
        self.plane.discard(extents)

    def pool(self, node: int, op: str, extents: Extents) -> None:
        self.plane.pool(node, op, extents)


class _InputTime:
    """The time of the input an engine is handling (a message's, a completion's, a timer's): what its observations
    are measured at, as in virtual time, not the loop's clock a moment later when the handler observes."""

    __slots__ = ("now_ns",)

    def __init__(self) -> None:
        self.now_ns = 0


class _ActorOutbox:
    __slots__ = ("_system", "_name", "_input")

    def __init__(self, system: ActorSystem, name: str, input_at: _InputTime) -> None:
        self._system, self._name, self._input = system, name, input_at

    def send(self, recipient: str, msg: Message) -> None:
        self._system.tell(recipient, msg, sender=self._name)

    def observe(self, record: Observed) -> None:
        system = self._system
        watch = system.watch
        callback = watch.callbacks.get(type(record))
        if callback is not None:
            callback(self._input.now_ns, record)
        if type(record) in watch.unlogged:
            return
        system.record(self._name, record.kind, record.summary())


class EngineActor(Actor):
    """The actor ``name`` in ``system`` around the engine ``build(outbox, plane)`` makes."""

    def __init__(self, system: ActorSystem, name: str, build: Callable[[Outbox, DataPlane], Engine]) -> None:
        super().__init__(system, name)
        self._input = _InputTime()
        self.data_plane = LiveDataPlane(system.data_plane, self._fail, self._input)
        self.engine = build(_ActorOutbox(system, name, self._input), self.data_plane)

    def receive(self, now_ns: int, msg: Message, sender: str) -> None:
        self._input.now_ns = now_ns
        self.engine.receive(now_ns, msg, sender)

    def _fail(self, error: Exception) -> None:
        self.system.fail(self, error)

    def started(self) -> None:
        now = self._input.now_ns = self.system.now_ns()
        self.engine.start(now)
