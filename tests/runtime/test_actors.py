"""The actor runtime (``dualpath_emu.runtime.actors``): its semantics, in process and over ZeroMQ.

Every test of the actor semantics takes the ``transport`` fixture and runs twice (see ``runtime_harness``):
an ask returns the reply (or ``None``), asks between actors, FIFO delivery per sender, ask timeouts and late
replies dropped, pykka's failure semantics (the callee's exception to the asker while the callee keeps
running, a handler's non-message answer as ``TypeError``, a failing tell ends the run with ``ActorFailure``,
asks to a stopped actor fail and never hang, an actor that stops itself in a handler fails the ask at once
and its later answer is dropped as late), unknown message types and unknown actors, and an answer that
arrives while the asker is busy is not lost.

* ``zmq-ipc``, ``zmq-tcp``: the actors live in one ``ZmqActorSystem`` and the test's driver sends from a
  second one over ``ipc://``, or over ``tcp://`` loopback with the run's CURVE keys, so every message of
  the driver is encoded and crosses ZeroMQ (real time, every wait bounded).
  Where the wire documentedly differs, the ZeroMQ behaviour is asserted: an exception of a type that is not
  a builtin (nor ``ActorStoppedError``/``UnknownActorError``) arrives as ``RemoteError`` with its type name
  and text (so ``UnhandledMessageError`` too), an ask to a routed name the server does not host gets
  ``UnknownActorError`` and the server counts it as rejected, and the callee records the answers that a
  stop sends for it.

In-process only (on a plain asyncio loop): the handler table's class checks, and the event sink.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

import pytest

from dualpath_emu.messages import Message
from dualpath_emu.runtime.actors import (
    Actor,
    ActorFailure,
    ActorStoppedError,
    ActorSystem,
    UnhandledMessageError,
    UnknownActorError,
    handles,
)
from dualpath_emu.runtime.zmq_transport import RemoteError
from tests.runtime_harness import TRANSPORTS, Transport, ZmqHarness

MS = 1_000_000
GB = 1_000_000_000

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Ping(Message):
    WIRE_NAME: ClassVar[str] = "Ping"
    VERSION: ClassVar[int] = 1
    seq: int


@dataclass(frozen=True, slots=True)
class Pong(Message):
    WIRE_NAME: ClassVar[str] = "Pong"
    VERSION: ClassVar[int] = 1
    seq: int


@dataclass(frozen=True, slots=True)
class Boom(Message):
    WIRE_NAME: ClassVar[str] = "Boom"
    VERSION: ClassVar[int] = 1
    text: str


@dataclass(frozen=True, slots=True)
class Crash(Message):
    WIRE_NAME: ClassVar[str] = "Crash"
    VERSION: ClassVar[int] = 1
    text: str


@dataclass(frozen=True, slots=True)
class Wrong(Message):
    WIRE_NAME: ClassVar[str] = "Wrong"
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class Nap(Message):
    WIRE_NAME: ClassVar[str] = "Nap"
    VERSION: ClassVar[int] = 1
    seconds: float


@dataclass(frozen=True, slots=True)
class Stray(Message):
    WIRE_NAME: ClassVar[str] = "Stray"
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class Quit(Message):
    WIRE_NAME: ClassVar[str] = "Quit"
    VERSION: ClassVar[int] = 1
    fail: bool


MESSAGES = (Ping, Pong, Boom, Crash, Wrong, Nap, Stray, Quit)
"""The message types of the semantic tests (registered on both ends of the ZeroMQ harness)."""


class Kaput(Exception):
    """An exception type that is not a builtin: over ZeroMQ it arrives as ``RemoteError``."""


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Transport]:
    chosen = Transport(request.param, MESSAGES, tmp_path_factory)
    yield chosen
    chosen.cleanup()


def run_system(system: ActorSystem, main: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run(system.run(main))


def kinds(system: ActorSystem) -> list[str]:
    return [e.kind for e in system.events]


class Echo(Actor):
    """Answers Ping with Pong, raises on Boom and Crash, answers Wrong with a non-message, sleeps on Nap;
    records what it got and what it raised."""

    def __init__(self, system: ActorSystem, name: str) -> None:
        super().__init__(system, name)
        self.seen: list[tuple[str, int]] = []
        self.raised: list[Exception] = []

    @handles(Ping)
    async def on_ping(self, msg: Ping) -> Pong:
        assert self.envelope is not None
        self.seen.append((self.envelope.sender, msg.seq))
        return Pong(msg.seq)

    @handles(Boom)
    async def on_boom(self, msg: Boom) -> None:
        error = ValueError(msg.text)
        self.raised.append(error)
        raise error

    @handles(Crash)
    async def on_crash(self, msg: Crash) -> None:
        error = Kaput(msg.text)
        self.raised.append(error)
        raise error

    @handles(Wrong)
    async def on_wrong(self, msg: Wrong) -> Message | None:
        return cast(Message, 42)  # not a Message: the asker gets a TypeError

    @handles(Nap)
    async def on_nap(self, msg: Nap) -> None:
        await asyncio.sleep(msg.seconds)


def test_ping_pong_ask_returns_the_reply_after_two_latencies(transport: Transport) -> None:
    h = transport.harness(latency_s=0.001)
    Echo(h.system, "echo")

    async def main() -> tuple[Message | None, int]:
        h.system.actor("echo").start()
        reply = await h.sender.ask("echo", Ping(7), timeout_s=h.timeout_s)
        return reply, h.system.now_ns()

    reply, t = h.run(main())
    assert reply == Pong(7)
    # The same record, split: the driver's system has the send and the answer, the server the rest.
    assert [(e.actor, e.kind) for e in h.sender.events] == [("main", "ask"), ("main", "answer")]
    assert [(e.actor, e.kind) for e in h.system.events] == [
        ("echo", "start"),
        ("echo", "deliver"),
        ("echo", "handle"),
        ("echo", "reply"),
        ("echo", "stop"),
    ]
    for system in (h.system, h.sender):
        assert [e.seq for e in system.events] == list(range(len(system.events)))
        assert all(a.t_ns <= b.t_ns for a, b in zip(system.events, system.events[1:]))


def test_ask_between_actors_and_zero_latency(transport: Transport) -> None:
    h = transport.harness()

    class Caller(Actor):
        @handles(Ping)
        async def on_ping(self, msg: Ping) -> Message | None:
            return await self.ask("echo", Ping(msg.seq + 1))

    echo = Echo(h.system, "echo")
    caller = Caller(h.system, "caller")

    async def main() -> tuple[Message | None, Message | None]:
        echo.start()
        caller.start()
        reply = await h.sender.ask("caller", Ping(1), timeout_s=h.timeout_s)
        return reply, await h.sender.ask("echo", Nap(0.0), timeout_s=h.timeout_s)

    # A handler's None answers an ask as None (NoneReply on the wire).
    assert h.run(main()) == (Pong(2), None)
    assert echo.seen == [("caller", 2)]


def test_tells_are_delivered_fifo_per_sender(transport: Transport) -> None:
    h = transport.harness(latency_s=0.0005)
    echo = Echo(h.system, "echo")
    # Pauses long enough in real time that the senders' runs overlap on a loaded machine too.
    pause_s = 0.002

    class Sender(Actor):
        @handles(Pong)
        async def on_go(self, msg: Pong) -> None:
            for i in range(50):
                self.tell("echo", Ping(msg.seq * 100 + i))
                if i % 7 == 0:
                    await asyncio.sleep(pause_s)

    Sender(h.system, "a")
    Sender(h.system, "b")

    async def main() -> None:
        for actor in h.system.actors:
            actor.start()
        h.sender.tell("a", Pong(1))
        h.sender.tell("b", Pong(2))
        for i in range(50):  # the driver is a third sender (over the wire for zmq-*)
            h.sender.tell("echo", Ping(300 + i))
            if i % 7 == 0:
                await asyncio.sleep(pause_s)
        await h.wait(until=lambda: len(echo.seen) == 150)

    h.run(main())
    assert len(echo.seen) == 150
    for sender, base in (("a", 100), ("b", 200), ("main", 300)):
        assert [seq for who, seq in echo.seen if who == sender] == [base + i for i in range(50)]

    # The senders' messages are interleaved (the test would not see a per-sender reordering otherwise).
    def span(sender: str) -> tuple[int, int]:
        indices = [i for i, (who, _) in enumerate(echo.seen) if who == sender]
        return indices[0], indices[-1]

    # (Over ZeroMQ the driver's messages could arrive as one late batch if the machine stalls, so only the
    # two actors, started by the same batch, must overlap there.)
    pairs = [("a", "b")]
    for x, y in pairs:
        (x0, x1), (y0, y1) = span(x), span(y)
        assert x0 < y1 and y0 < x1, f"{x} and {y} did not interleave: {echo.seen}"


def test_ask_times_out_and_a_late_reply_is_dropped(transport: Transport) -> None:
    h = transport.harness(latency_s=0.001)
    echo = Echo(h.system, "echo")
    # In real time, short ones: the nap still outlasts the timeout by far.
    nap_s, timeout_s = 0.2, 0.02

    async def main() -> int:
        echo.start()
        start = h.sender.now_ns()
        with pytest.raises(TimeoutError):
            await h.sender.ask("echo", Nap(nap_s), timeout_s=timeout_s)
        elapsed = h.sender.now_ns() - start
        await h.wait(until=lambda: "late" in kinds(h.sender))  # the reply comes (at 5.002 s), to nobody
        assert await h.sender.ask("echo", Ping(1), timeout_s=h.timeout_s) == Pong(1)  # still running
        return elapsed

    elapsed = h.run(main())
    assert elapsed >= round(timeout_s * 1e9) - 1_000  # (a real loop's timer may fire a clock tick early)
    nap_events = [e for e in h.sender.events if e.kind in ("ask", "timeout", "late") and "Ping" not in e.summary]
    sent, timed_out, late = nap_events
    assert (sent.kind, timed_out.kind, late.kind) == ("ask", "timeout", "late")
    assert late.t_ns - sent.t_ns >= round(nap_s * 1e9) - 1_000  # the late reply is the nap's
    assert late.summary.endswith(f"re #{sent.summary.split()[0][1:]} from echo")


def test_callee_exception_reaches_the_asker_and_the_callee_keeps_running(transport: Transport) -> None:
    h = transport.harness(latency_s=0.001)
    echo = Echo(h.system, "echo")

    async def main() -> Message | None:
        echo.start()
        # A builtin exception type: the same type and text on both transports.
        with pytest.raises(ValueError, match="^bad input$") as info:
            await h.sender.ask("echo", Boom("bad input"), timeout_s=h.timeout_s)
        assert type(info.value) is ValueError
        if not h.over_wire:
            assert info.value is echo.raised[0]  # in-process: the very exception object
        # Any other type: itself in-process, RemoteError (type name and text) over the wire.
        if h.over_wire:
            with pytest.raises(RemoteError, match="^Kaput: no luck$") as remote:
                await h.sender.ask("echo", Crash("no luck"), timeout_s=h.timeout_s)
            assert (remote.value.type_name, remote.value.text) == ("Kaput", "no luck")
        else:
            with pytest.raises(Kaput, match="^no luck$") as local:
                await h.sender.ask("echo", Crash("no luck"), timeout_s=h.timeout_s)
            assert local.value is echo.raised[1]
        # A handler that returns something other than a Message or None: a TypeError for the asker.
        with pytest.raises(TypeError, match="returned int, not a Message or None"):
            await h.sender.ask("echo", Wrong(), timeout_s=h.timeout_s)
        return await h.sender.ask("echo", Ping(3), timeout_s=h.timeout_s)

    assert h.run(main()) == Pong(3)
    assert h.system.failure is None
    assert kinds(h.system).count("error") == 3


def test_failing_tell_stops_the_run_with_actor_failure(transport: Transport) -> None:
    h = transport.harness(latency_s=0.001, failure_events=4)
    echo = Echo(h.system, "echo")
    other = Echo(h.system, "other")
    main_finished = False

    async def main() -> None:
        nonlocal main_finished
        echo.start()
        other.start()
        h.sender.tell("echo", Boom("kaput"))
        await asyncio.sleep(100)  # cancelled by the failure (over ZeroMQ: long before the run's limit)
        main_finished = True

    with pytest.raises(ActorFailure) as info:
        h.run(main())
    failure = info.value
    assert failure.actor == "echo"
    assert type(failure.error) is ValueError and str(failure.error) == "kaput"
    assert failure.error is echo.raised[0]  # the handler's own exception, in the callee's system
    assert failure.__cause__ is failure.error
    assert len(failure.events) == 4
    assert failure.events[-1][2:4] == ("echo", "failure")
    assert "'echo'" in str(failure) and "kaput" in str(failure) and "failure" in str(failure)
    assert not main_finished
    assert echo.stopped and other.stopped
    assert h.system.failure is failure


class PlainEcho(Actor):
    """Plain (not ``async``) handlers: answers Ping with Pong, raises on Boom; naps (async) on Nap."""

    def __init__(self, system: ActorSystem, name: str) -> None:
        super().__init__(system, name)
        self.seen: list[tuple[int, int]] = []
        """(seq, the loop's time in ns) of each Ping handled."""

    @handles(Ping)
    def on_ping(self, msg: Ping) -> Pong:
        assert self.envelope is not None and self.envelope.body is msg
        self.seen.append((msg.seq, self.system.now_ns()))
        return Pong(msg.seq)

    @handles(Boom)
    def on_boom(self, msg: Boom) -> None:
        raise ValueError(msg.text)

    @handles(Nap)
    async def on_nap(self, msg: Nap) -> None:
        await asyncio.sleep(msg.seconds)


def test_plain_handlers_answer_asks_wait_their_turn_and_fail_the_run(transport: Transport) -> None:
    """A plain handler answers an ask like an async one; tells to it while its actor naps in an async
    handler wait in the mailbox and are handled after the nap, in order; a plain handler raising for a tell
    fails the run."""
    h = transport.harness(latency_s=0.001, failure_events=4)
    echo = PlainEcho(h.system, "echo")
    nap_s = 0.05

    async def main() -> None:
        echo.start()
        assert await h.sender.ask("echo", Ping(1), timeout_s=h.timeout_s) == Pong(1)
        h.sender.tell("echo", Nap(nap_s))
        for seq in (2, 3, 4):
            h.sender.tell("echo", Ping(seq))
        await h.wait(until=lambda: len(echo.seen) == 4)
        h.sender.tell("echo", Ping(5))  # the actor idles: handled on arrival
        await h.wait(until=lambda: len(echo.seen) == 5)
        h.sender.tell("echo", Boom("plain kaput"))
        await asyncio.sleep(100)  # cancelled by the failure

    with pytest.raises(ActorFailure) as info:
        h.run(main())
    assert info.value.actor == "echo" and str(info.value.error) == "plain kaput"
    assert [seq for seq, _ in echo.seen] == [1, 2, 3, 4, 5]
    nap_end = echo.seen[1][1]
    assert nap_end - echo.seen[0][1] >= round(nap_s * 1e9) - 1_000_000


def test_asks_to_a_stopped_actor_fail_and_pending_ones_do_not_hang(transport: Transport) -> None:
    h = transport.harness(latency_s=0.001)
    echo = Echo(h.system, "echo")

    async def main() -> list[str]:
        echo.start()
        loop = asyncio.get_running_loop()

        def ask(msg: Message) -> asyncio.Task[Message | None]:
            return loop.create_task(h.sender.ask("echo", msg, timeout_s=h.timeout_s))

        # Three asks: one being handled (a long nap), one in the mailbox, one still in flight.
        handled = ask(Nap(60.0))
        await h.wait(until=lambda: kinds(h.system).count("handle") == 1)
        queued = ask(Ping(1))
        await h.wait(until=lambda: kinds(h.system).count("deliver") == 2)
        in_flight = ask(Ping(2))
        await asyncio.sleep(0)  # sent, not arrived
        h.sender.tell("echo", Ping(3))  # a tell in flight: dropped on arrival
        echo.stop()
        outcomes = []
        for task in (handled, queued, in_flight):
            # ActorStoppedError, not TimeoutError: none waits for the nap or for its timeout.
            with pytest.raises(ActorStoppedError, match="'echo' is stopped") as info:
                await task
            assert info.value.actor == "echo"
            outcomes.append(str(info.value))
        with pytest.raises(ActorStoppedError, match="'echo' is stopped"):
            await h.sender.ask("echo", Ping(4), timeout_s=h.timeout_s)
        h.sender.tell("echo", Ping(5))  # dropped and counted
        await h.wait(until=lambda: h.system.dropped == 2)
        return outcomes

    outcomes = h.run(main())
    assert len(outcomes) == 3
    assert echo.seen == []
    assert h.system.dropped == 2
    assert kinds(h.system).count("drop") == 2
    with pytest.raises(ActorStoppedError):
        echo.start()


def test_unknown_message_type_and_unknown_actor(transport: Transport) -> None:
    h = transport.harness(latency_s=0.001)
    echo = Echo(h.system, "echo")

    async def main() -> Message | None:
        echo.start()
        text = "actor 'echo' has no handler for Stray"
        if h.over_wire:  # not a builtin exception type: RemoteError with its name and text
            with pytest.raises(RemoteError) as remote:
                await h.sender.ask("echo", Stray(), timeout_s=h.timeout_s)
            assert (remote.value.type_name, remote.value.text) == ("UnhandledMessageError", text)
        else:
            with pytest.raises(UnhandledMessageError, match=f"^{text}$") as info:
                await h.sender.ask("echo", Stray(), timeout_s=h.timeout_s)
            assert info.value.message_type is Stray
        h.sender.tell("echo", Stray())  # counted, the actor keeps running
        # A name the sender knows nothing of: an error at the sender, for a tell and an ask.
        with pytest.raises(UnknownActorError, match="'nobody'"):
            h.sender.tell("nobody", Ping(1))
        with pytest.raises(UnknownActorError, match="'nobody'"):
            await h.sender.ask("nobody", Ping(1), timeout_s=h.timeout_s)
        if isinstance(h, ZmqHarness):
            # A name routed to the server, which does not host it: the ask is answered with
            # UnknownActorError, the tell is only rejected there; both are counted as rejected.
            h.client.add_route("ghost", h.server.endpoint)
            with pytest.raises(UnknownActorError, match="'ghost'") as unknown:
                await h.sender.ask("ghost", Ping(2), timeout_s=h.timeout_s)
            assert unknown.value.actor == "ghost"
            h.sender.tell("ghost", Ping(3))
        return await h.sender.ask("echo", Ping(9), timeout_s=h.timeout_s)  # after all of the above (FIFO)

    assert h.run(main()) == Pong(9)
    assert h.system.unhandled == 1
    assert h.system.failure is None
    assert kinds(h.system).count("unhandled") == 1
    assert echo.seen == [("main", 9)]
    if isinstance(h, ZmqHarness):
        assert h.server.rejected == 2 and h.client.rejected == 0
        assert [e.summary.split(" (")[0] for e in h.server.events if e.kind == "rejected"] == [
            "no actor 'ghost' here"
        ] * 2


def test_an_answer_that_arrives_while_the_asker_is_busy_is_not_lost(transport: Transport) -> None:
    h = transport.harness(latency_s=0.001)
    echo = Echo(h.system, "echo")
    other = Echo(h.system, "other")

    async def main() -> Message | None:
        echo.start()
        other.start()
        pending = asyncio.get_running_loop().create_task(h.sender.ask("echo", Nap(60.0), timeout_s=h.timeout_s))
        await h.wait(until=lambda: kinds(h.system).count("handle") == 1)
        echo.stop()  # answers the pending ask at once (ActorStoppedError)
        time.sleep(0.02)  # the loop is busy (blocked) while that answer reaches the asker's side
        h.sender.tell("other", Ping(1))  # and then it sends before it looks for the answer
        # (Over ZeroMQ this send once consumed the socket's wake-up, and the answer waited for the timeout.)
        with pytest.raises(ActorStoppedError, match="'echo' is stopped"):
            await pending
        return await h.sender.ask("other", Ping(2), timeout_s=h.timeout_s)

    assert h.run(main()) == Pong(2)
    assert other.seen == [("main", 1), ("main", 2)]


class Quitter(Actor):
    """Stops itself while handling Quit, then finishes the handler: raises if asked to, else answers."""

    def __init__(self, system: ActorSystem, name: str) -> None:
        super().__init__(system, name)
        self.finished = False

    @handles(Quit)
    async def on_quit(self, msg: Quit) -> Pong:
        self.stop()
        await asyncio.sleep(0.001)  # the handler goes on after the stop
        self.finished = True
        if msg.fail:
            raise ValueError("failed after stopping")
        return Pong(0)


def test_an_actor_stopping_itself_in_a_handler_fails_the_ask_and_its_late_answer_goes_nowhere(
    transport: Transport,
) -> None:
    h = transport.harness(latency_s=0.001)
    raiser = Quitter(h.system, "raiser")
    returner = Quitter(h.system, "returner")
    echo = Echo(h.system, "echo")

    async def main() -> None:
        for actor in h.system.actors:
            actor.start()
        # An ask of the hosting system's own, pending throughout. (Over ZeroMQ its msg_id is 1, as is the
        # driver's first ask's: each system counts from 1. The raiser's late answer must not be taken for it.)
        nap = asyncio.get_running_loop().create_task(h.system.ask("echo", Nap(60.0), timeout_s=100.0))
        for quitter, fail in ((raiser, True), (returner, False)):
            with pytest.raises(ActorStoppedError, match=f"'{quitter.name}' is stopped") as info:
                await h.sender.ask(quitter.name, Quit(fail), timeout_s=h.timeout_s)
            assert info.value.actor == quitter.name
            await h.wait(until=lambda: quitter.finished)
        # The raiser's error still travels to the asker, which drops it as late.
        await h.wait(until=lambda: "late" in kinds(h.sender))
        assert not nap.done()
        echo.stop()
        with pytest.raises(ActorStoppedError, match="'echo' is stopped"):
            await nap

    h.run(main())
    assert raiser.stopped and returner.stopped
    assert h.system.failure is None
    errors = [e.summary.split(": ", 1)[0].split()[-1] for e in h.system.events if e.kind == "error"]
    if h.over_wire:
        # Over ZeroMQ the callee answers the asks that its stop failed, so it records those answers too.
        assert errors == ["ActorStoppedError", "ValueError", "ActorStoppedError"]
    else:
        assert errors == ["ValueError"]  # the raiser's, after its stop
    # The raiser's own answer came after the ask had failed: the driver dropped it as late. (In-process the
    # stop fails the ask directly; over ZeroMQ its answer travels ahead of the late one on the connection.)
    answers = [(e.kind, e.summary.split(" from ")[-1]) for e in h.sender.events if e.kind in ("answer", "late")]
    if h.over_wire:
        assert answers == [("answer", "raiser"), ("late", "raiser"), ("answer", "returner")]
    else:
        assert answers == [("late", "raiser")]
    if isinstance(h, ZmqHarness):
        assert not h.server._remote_asks  # no route of an answered ask is left behind


def test_handler_table_inheritance_and_errors() -> None:
    class Base(Actor):
        @handles(Message)
        async def anything(self, msg: Message) -> Pong:
            return Pong(-1)

    class Derived(Base):
        @handles(Ping, Nap)
        async def on_ping(self, msg: Message) -> Pong:
            return Pong(1)

    assert Derived._handlers == {Message: "anything", Ping: "on_ping", Nap: "on_ping"}
    system = ActorSystem()
    derived = Derived(system, "d")

    async def main() -> tuple[Message | None, Message | None]:
        derived.start()
        return await system.ask("d", Ping(0)), await system.ask("d", Stray())

    assert run_system(system, main()) == (Pong(1), Pong(-1))

    with pytest.raises(TypeError, match="both handle Ping"):

        class Twice(Actor):
            @handles(Ping)
            async def a(self, msg: Ping) -> None: ...

            @handles(Ping)
            async def b(self, msg: Ping) -> None: ...

    with pytest.raises(ValueError, match="already registered"):
        Echo(system, "d")


# ---------------------------------------------------------------------------------------------------------
# The event sink (in-process).


def test_event_sink_receives_every_event_once_in_order() -> None:
    system = ActorSystem(latency_s=0.001)
    Echo(system, "echo")
    chunks: list[tuple[int, list[tuple[int, int, str, str, str]]]] = []
    system.set_event_sink(lambda events, first: chunks.append((first, list(events))), chunk=10)

    async def main() -> None:
        system.actor("echo").start()
        for i in range(30):
            await system.ask("echo", Ping(i), timeout_s=1.0)

    run_system(system, main())
    system.flush_events()
    numbered = [(first + i, e) for first, events in chunks for i, e in enumerate(events)]
    assert [n for n, _ in numbered] == list(range(system.event_count))
    assert len(chunks) > 3 and system.events == []
    kinds = [e[3] for _, e in numbered]
    assert kinds.count("ask") == 30 and kinds.count("answer") == 30
