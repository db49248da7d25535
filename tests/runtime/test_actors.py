"""The live driver's actors (``dualpath_emu.runtime.actors``, ``engine_actor``): a message reaches its actor's
``receive`` after the delivery latency, in send order per sender, and waits for the actor's start; an engine in
an ``EngineActor`` starts before it hears of anything, sends through the system and records its observations; a
failing actor (or a failing callback) ends the run with ``ActorFailure`` carrying the last events; a stopped
actor's messages are dropped and counted; unknown and reserved names are errors; the event sink gets every event
once, in order. Over ZeroMQ (ipc, and tcp with the run's keys) the same: FIFO per sender across systems, a failing
actor ends its system's run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest

from dualpath_emu.messages import Codec, Message, MessageRegistry
from dualpath_emu.runtime.actors import MAIN, Actor, ActorFailure, ActorSystem, UnknownActorError
from dualpath_emu.runtime.core_work import CoreWork
from dualpath_emu.runtime.engine import DataPlane, Engine, Outbox, on
from dualpath_emu.runtime.engine_actor import EngineActor
from dualpath_emu.runtime.security import RunKeys
from dualpath_emu.runtime.zmq_transport import ZmqActorSystem

MS = 1_000_000
WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class Ping(Message):
    WIRE_NAME: ClassVar[str] = "test.Ping"
    VERSION: ClassVar[int] = 1
    seq: int


@dataclass(frozen=True, slots=True)
class Boom(Message):
    WIRE_NAME: ClassVar[str] = "test.Boom"
    VERSION: ClassVar[int] = 1
    text: str


class Inbox(Actor):
    """Keeps what it receives, with the sender and the time; raises on Boom."""

    def __init__(self, system: ActorSystem, name: str) -> None:
        super().__init__(system, name)
        self.seen: list[tuple[str, int, int]] = []

    def receive(self, now_ns: int, msg: Message, sender: str) -> None:
        if isinstance(msg, Boom):
            raise ValueError(msg.text)
        assert isinstance(msg, Ping)
        self.seen.append((sender, msg.seq, now_ns))


async def until(condition: Callable[[], bool]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.001)


def test_tells_arrive_after_the_latency_in_send_order_per_sender() -> None:
    system = ActorSystem(latency_s=0.002)
    inbox = Inbox(system, "inbox")
    Inbox(system, "other")

    async def main() -> None:
        for actor in system.actors:
            actor.start()
        for i in range(50):
            system.tell("inbox", Ping(i), sender="other")
            system.tell("inbox", Ping(100 + i))
            if i % 7 == 0:
                await asyncio.sleep(0.001)
        await until(lambda: len(inbox.seen) == 100)

    asyncio.run(system.run(main()))
    assert [seq for who, seq, _ in inbox.seen if who == "other"] == list(range(50))
    assert [seq for who, seq, _ in inbox.seen if who == MAIN] == list(range(100, 150))
    tells = {e.summary: e.t_ns for e in system.events if e.kind == "tell"}
    delivered = {e.summary: e.t_ns for e in system.events if e.kind == "deliver"}
    assert tells.keys() == delivered.keys() and len(tells) == 100
    assert all(
        delivered[s] - tells[s] >= 2 * MS - 100_000 for s in tells
    )  # (a real loop's timer may fire a hair early)
    events = system.events
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.kind for e in events][:2] == ["start", "start"] and events[-1].kind == "stop"


def test_a_message_waits_for_its_actors_start_and_a_stopped_actor_drops_what_comes() -> None:
    system = ActorSystem()
    inbox = Inbox(system, "inbox")

    async def main() -> None:
        system.tell("inbox", Ping(1))
        await asyncio.sleep(0.01)
        assert inbox.seen == []  # not started: it waits
        inbox.start()
        assert [seq for _, seq, _ in inbox.seen] == [1]
        inbox.stop()
        system.tell("inbox", Ping(2))
        await asyncio.sleep(0.01)

    asyncio.run(system.run(main()))
    assert [seq for _, seq, _ in inbox.seen] == [1] and system.dropped == 1
    assert [e.kind for e in system.events if e.actor == "inbox"] == ["start", "deliver", "stop", "drop"]
    with pytest.raises(RuntimeError, match="cannot be started again"):
        inbox.start()


def test_a_failing_actor_ends_the_run_with_the_last_events() -> None:
    system = ActorSystem(failure_events=4)
    inbox = Inbox(system, "inbox")
    other = Inbox(system, "other")
    finished = False

    async def main() -> None:
        nonlocal finished
        inbox.start()
        other.start()
        system.tell("inbox", Ping(1))
        system.tell("inbox", Boom("kaput"))
        await asyncio.sleep(100)  # cancelled by the failure
        finished = True

    with pytest.raises(ActorFailure) as info:
        asyncio.run(system.run(main()))
    failure = info.value
    assert failure.actor == "inbox" and type(failure.error) is ValueError and str(failure.error) == "kaput"
    assert failure.__cause__ is failure.error and system.failure is failure
    assert len(failure.events) == 4 and failure.events[-1][2:4] == ("inbox", "failure")
    assert "Boom main->inbox: ValueError: kaput" in failure.events[-1].summary
    assert not finished and inbox.stopped and other.stopped


def test_a_failing_callback_ends_the_run_too() -> None:
    system = ActorSystem()
    inbox = Inbox(system, "inbox")

    async def main() -> None:
        inbox.start()
        asyncio.get_running_loop().call_soon(system.fail, inbox, RuntimeError("the plane refused it"))
        await asyncio.sleep(100)

    with pytest.raises(ActorFailure, match="RuntimeError: the plane refused it"):
        asyncio.run(system.run(main()))


def test_names_are_checked() -> None:
    system = ActorSystem()
    Inbox(system, "inbox")
    with pytest.raises(ValueError, match="already registered"):
        Inbox(system, "inbox")
    for bad in ("", MAIN):
        with pytest.raises(ValueError, match="non-empty and not 'main'"):
            Inbox(system, bad)
    with pytest.raises(UnknownActorError, match="no actor named 'ghost'"):
        system.tell("ghost", Ping(0))
    with pytest.raises(UnknownActorError):
        system.actor("ghost")
    with pytest.raises(RuntimeError, match="given no data plane"):
        system.data_plane


def test_the_event_sink_receives_every_event_once_in_order() -> None:
    system = ActorSystem()
    inbox = Inbox(system, "inbox")
    chunks: list[tuple[int, list[tuple[int, int, str, str, str]]]] = []
    system.set_event_sink(lambda events, first: chunks.append((first, list(events))), chunk=10)

    async def main() -> None:
        inbox.start()
        for i in range(30):
            system.tell("inbox", Ping(i))
            await asyncio.sleep(0)
        await until(lambda: len(inbox.seen) == 30)

    asyncio.run(system.run(main()))
    system.flush_events()
    numbered = [(first + i, e) for first, events in chunks for i, e in enumerate(events)]
    assert [n for n, _ in numbered] == list(range(system.event_count))
    assert len(chunks) > 3 and system.events == []
    kinds = [e[3] for _, e in numbered]
    assert kinds.count("tell") == kinds.count("deliver") == 30


# --- an engine in its actor ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """An observation of the test engine."""

    seq: int
    kind: ClassVar[str] = "seen"

    def summary(self) -> str:
        return f"ping {self.seq}"


class Echo(Engine):
    """Records its start, observes each Ping and passes it on to ``inbox``, one more."""

    def __init__(self, name: str, out: Outbox) -> None:
        super().__init__(name, out)
        self.log: list[tuple[str, int, str]] = []

    def start(self, now_ns: int) -> None:
        self.log.append(("start", now_ns, ""))

    @on(Ping)
    def on_ping(self, now_ns: int, msg: Ping, sender: str) -> None:
        self.log.append(("ping", now_ns, sender))
        self.out.observe(Seen(msg.seq))
        self.out.send("inbox", Ping(msg.seq + 1))


def test_an_engine_actor_starts_its_engine_first_and_carries_its_outputs() -> None:
    system = ActorSystem(data_plane=cast(CoreWork, object()))  # (the engine asks nothing of it)
    engines: list[Echo] = []

    def build(out: Outbox, plane: DataPlane) -> Echo:
        engines.append(Echo("echo", out))
        return engines[0]

    echo = EngineActor(system, "echo", build)
    inbox = Inbox(system, "inbox")

    async def main() -> None:
        inbox.start()
        system.tell("echo", Ping(1), sender="inbox")  # before its start: it waits
        await asyncio.sleep(0.01)
        echo.start()
        await until(lambda: len(inbox.seen) == 1)

    asyncio.run(system.run(main()))
    [engine] = engines
    assert [(what, sender) for what, _, sender in engine.log] == [("start", ""), ("ping", "inbox")]
    assert [(who, seq) for who, seq, _ in inbox.seen] == [("echo", 2)]
    assert [(e.actor, e.kind, e.summary) for e in system.events if e.kind == "seen"] == [("echo", "seen", "ping 1")]


# --- over ZeroMQ ----------------------------------------------------------------------------------------------


def two_systems(tmp_path: Path, transport: str) -> tuple[ZmqActorSystem, ZmqActorSystem]:
    """A server hosting the actors and a client that sends to them, over ``transport``."""
    registry = MessageRegistry()
    for cls in (Ping, Boom):
        registry.register(cls)
    options: dict[str, Any]
    if transport == "tcp":  # loopback with the run's CURVE keys
        keys = RunKeys.generate(tmp_path / "keys", ["server", "client"])
        options = {"bind": "tcp://127.0.0.1:*", "keys": keys}
        return (ZmqActorSystem(Codec(registry), name="server", **options),
                ZmqActorSystem(Codec(registry), name="client", **options))  # fmt: skip
    folder = tmp_path / "s"
    folder.mkdir(mode=0o700)
    return (ZmqActorSystem(Codec(registry), bind=f"ipc://{folder}/server"),
            ZmqActorSystem(Codec(registry), bind=f"ipc://{folder}/client"))  # fmt: skip


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_over_zeromq_tells_arrive_once_in_order_and_a_failure_ends_the_run(tmp_path: Path, transport: str) -> None:
    server, client = two_systems(tmp_path, transport)
    inbox = Inbox(server, "inbox")

    async def main() -> None:
        async with server, client:
            client.add_route("inbox", server.endpoint, "server")
            inbox.start()

            async def drive() -> None:
                for i in range(200):
                    client.tell("inbox", Ping(i))
                await until(lambda: len(inbox.seen) == 200)
                client.tell("inbox", Boom("over the wire"))
                await asyncio.sleep(WAIT_S)  # cancelled by the failure

            await server.run(drive())

    with pytest.raises(ActorFailure, match="ValueError: over the wire"):
        asyncio.run(asyncio.wait_for(main(), 4 * WAIT_S))
    assert [seq for _, seq, _ in inbox.seen] == list(range(200))
    assert {who for who, _, _ in inbox.seen} == {MAIN}
    assert server.rejected == 0 and [e.kind for e in server.events].count("deliver") == 201
