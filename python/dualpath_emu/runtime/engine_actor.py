"""The live driver's shell: an asyncio actor around an engine (docs/architecture.md).

In a live run (``--mode realtime``, the host backend) each engine runs in an :class:`EngineActor` of its process's actor
system (:mod:`~dualpath_emu.runtime.zmq_transport` carries its messages between processes). The actor only translates: a
message it is told becomes :meth:`~dualpath_emu.runtime.engine.Engine.receive` with the loop's clock; the engine's
outbox is the actor system's ``tell`` and ``record`` (an observation as its log line's fields); its data plane is the
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

    def __init__(self, plane: CoreWork, fail: Callable[[Exception], None]) -> None:
        self.plane = plane
        self._fail = fail

    def _guard(self, then: Then) -> Callable[[], None]:
        clock, fail = self.plane.clock_ns, self._fail

        def done() -> None:
            try:
                then(clock())
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
        clock, fail = self.plane.clock_ns, self._fail

        def reported(ended: list[tuple[int, int]], spans: list[tuple[int, int, int, int, int]]) -> None:
            try:
                report(clock(), ended, spans)
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


class _ActorOutbox:
    __slots__ = ("_system", "_name")

    def __init__(self, system: ActorSystem, name: str) -> None:
        self._system, self._name = system, name

    def send(self, recipient: str, msg: Message) -> None:
        self._system.tell(recipient, msg, sender=self._name)

    def observe(self, record: Observed) -> None:
        self._system.record(self._name, record.kind, record.summary())


class EngineActor(Actor):
    """The actor ``name`` in ``system`` around the engine ``build(outbox, plane)`` makes."""

    def __init__(self, system: ActorSystem, name: str, build: Callable[[Outbox, DataPlane], Engine]) -> None:
        super().__init__(system, name)
        self.data_plane = LiveDataPlane(system.data_plane, self._fail)
        self.engine = build(_ActorOutbox(system, name), self.data_plane)
        self.receive = self.engine.receive  # type: ignore[method-assign]  # the actor's receive is its engine's

    def _fail(self, error: Exception) -> None:
        self.system.fail(self, error)

    def started(self) -> None:
        self.engine.start(self.system.now_ns())
