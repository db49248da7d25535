"""The ZeroMQ transport (``dualpath_emu.runtime.zmq_transport``): two actor systems in one process, on
``ipc://`` endpoints under a temporary directory or ``tcp://127.0.0.1``, exchange tells and asks exactly
once; remote exceptions reach the asker; malformed, truncated, unknown-type and wrong-version frames sent by a
raw socket to a live actor are rejected and counted, and the actor still answers. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import msgpack  # type: ignore[import-untyped]
import pytest
import zmq
import zmq.asyncio

from dualpath_emu.messages import Codec, Envelope, Message, MessageRegistry
from dualpath_emu.runtime import zmq_transport
from dualpath_emu.runtime import (
    Actor,
    ActorStoppedError,
    ActorSystem,
    RemoteError,
    UnknownActorError,
    ZmqActorSystem,
    handles,
)

_T = TypeVar("_T")

WAIT_S = 5.0
"""The bound on every wait (a healthy run needs milliseconds)."""


@dataclass(frozen=True, slots=True)
class Ping(Message):
    WIRE_NAME: ClassVar[str] = "zt.Ping"
    VERSION: ClassVar[int] = 1
    seq: int


@dataclass(frozen=True, slots=True)
class Pong(Message):
    WIRE_NAME: ClassVar[str] = "zt.Pong"
    VERSION: ClassVar[int] = 1
    seq: int


@dataclass(frozen=True, slots=True)
class Note(Message):
    WIRE_NAME: ClassVar[str] = "zt.Note"
    VERSION: ClassVar[int] = 1
    seq: int


@dataclass(frozen=True, slots=True)
class Blob(Message):
    WIRE_NAME: ClassVar[str] = "zt.Blob"
    VERSION: ClassVar[int] = 1
    seq: int
    pad: str


@dataclass(frozen=True, slots=True)
class Count(Message):
    WIRE_NAME: ClassVar[str] = "zt.Count"
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class Fail(Message):
    WIRE_NAME: ClassVar[str] = "zt.Fail"
    VERSION: ClassVar[int] = 1
    kind: str


@dataclass(frozen=True, slots=True)
class Nothing(Message):
    WIRE_NAME: ClassVar[str] = "zt.Nothing"
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class Relay(Message):
    WIRE_NAME: ClassVar[str] = "zt.Relay"
    VERSION: ClassVar[int] = 1
    to: str
    seq: int


class Custom(Exception):
    pass


class Echo(Actor):
    def __init__(self, system: ActorSystem, name: str) -> None:
        super().__init__(system, name)
        self.notes: list[tuple[str, int]] = []

    @handles(Ping)
    async def on_ping(self, msg: Ping) -> Pong:
        return Pong(msg.seq)

    @handles(Note)
    async def on_note(self, msg: Note) -> None:
        assert self.envelope is not None
        self.notes.append((self.envelope.sender, msg.seq))

    @handles(Blob)
    async def on_blob(self, msg: Blob) -> None:
        assert self.envelope is not None
        self.notes.append((self.envelope.sender, msg.seq))

    @handles(Count)
    async def on_count(self, msg: Count) -> Pong:
        return Pong(len(self.notes))

    @handles(Nothing)
    async def on_nothing(self, msg: Nothing) -> None:
        return None

    @handles(Fail)
    async def on_fail(self, msg: Fail) -> None:
        if msg.kind == "builtin":
            raise ValueError("bad value")
        raise Custom("custom failure")


class Relayer(Actor):
    """Asks another (remote) actor from within a handler."""

    @handles(Relay)
    async def on_relay(self, msg: Relay) -> Message | None:
        return await self.ask(msg.to, Ping(msg.seq), timeout_s=WAIT_S)


def registry() -> MessageRegistry:
    reg = MessageRegistry()
    for cls in (Ping, Pong, Note, Blob, Count, Fail, Nothing, Relay):
        reg.register(cls)
    return reg


@pytest.fixture
def ipc_dir() -> Iterator[str]:
    # A short path: ipc:// paths are limited to ~107 bytes.
    path = tempfile.mkdtemp(prefix="dpz")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_bounded(main: Callable[[], Coroutine[Any, Any, _T]], limit_s: float = 20.0) -> _T:
    async def bounded() -> _T:
        return await asyncio.wait_for(main(), limit_s)

    return asyncio.run(bounded())


@asynccontextmanager
async def two_systems(bind_a: str, bind_b: str) -> AsyncIterator[tuple[ZmqActorSystem, ZmqActorSystem]]:
    """System A hosts ``relay``, system B hosts ``echo``; each knows where the other's actors are."""
    a = ZmqActorSystem(Codec(registry()), bind=bind_a)
    b = ZmqActorSystem(Codec(registry()), bind=bind_b)
    async with a, b:
        a.add_route("echo", b.endpoint)
        b.add_route("relay", a.endpoint)
        yield a, b


def endpoints(transport: str, ipc_dir: str) -> tuple[str, str]:
    if transport == "ipc":
        return f"ipc://{ipc_dir}/a", f"ipc://{ipc_dir}/b"
    return "tcp://127.0.0.1:*", "tcp://127.0.0.1:*"


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_tell_and_ask_across_two_systems_exactly_once(transport: str, ipc_dir: str) -> None:
    async def main() -> None:
        async with two_systems(*endpoints(transport, ipc_dir)) as (a, b):
            if transport == "tcp":
                assert a.endpoint.startswith("tcp://127.0.0.1:") and not a.endpoint.endswith(":*")
            echo = Echo(b, "echo")
            relay = Relayer(a, "relay")
            echo.start()
            relay.start()
            for seq in range(200):
                a.tell("echo", Note(seq))
            # FIFO per connection: the ask after the tells sees all of them.
            assert await a.ask("echo", Count(), timeout_s=WAIT_S) == Pong(200)
            assert echo.notes == [("main", seq) for seq in range(200)]  # exactly once, in order
            pongs = await asyncio.gather(*(a.ask("echo", Ping(i), timeout_s=WAIT_S) for i in range(50)))
            assert pongs == [Pong(i) for i in range(50)]
            # An actor of A asks an actor of B from its handler; B's main asks A's actor.
            assert await b.ask("relay", Relay("echo", 7), timeout_s=WAIT_S) == Pong(7)
            assert await a.ask("echo", Nothing(), timeout_s=WAIT_S) is None
            assert a.rejected == 0 and b.rejected == 0
            kinds_b = [event.kind for event in b.events]
            assert kinds_b.count("deliver") == 200 + 1 + 50 + 1 + 1  # + the relay's Ping
            answers = [event for event in a.events if event.kind == "answer"]
            assert len(answers) == 1 + 50 + 1 + 1  # asks of A's main and relay's ask

    run_bounded(main)


def test_remote_exceptions_reach_the_asker(ipc_dir: str) -> None:
    async def main() -> None:
        async with two_systems(*endpoints("ipc", ipc_dir)) as (a, b):
            echo = Echo(b, "echo")
            echo.start()
            with pytest.raises(ValueError, match="^bad value$"):
                await a.ask("echo", Fail("builtin"), timeout_s=WAIT_S)
            with pytest.raises(RemoteError) as info:
                await a.ask("echo", Fail("custom"), timeout_s=WAIT_S)
            assert (info.value.type_name, info.value.text) == ("Custom", "custom failure")
            # The callee keeps running.
            assert await a.ask("echo", Ping(1), timeout_s=WAIT_S) == Pong(1)
            # An ask for a name the remote system does not host.
            a.add_route("ghost", b.endpoint)
            with pytest.raises(UnknownActorError):
                await a.ask("ghost", Ping(2), timeout_s=WAIT_S)
            assert b.rejected == 1
            # An ask to a remote actor that is stopped.
            echo.stop()
            with pytest.raises(ActorStoppedError):
                await a.ask("echo", Ping(3), timeout_s=WAIT_S)

    run_bounded(main)


def test_a_remote_actor_stopping_fails_the_pending_ask(ipc_dir: str) -> None:
    class Slow(Actor):
        @handles(Ping)
        async def on_ping(self, msg: Ping) -> Pong:
            await asyncio.sleep(WAIT_S)
            return Pong(msg.seq)

    async def main() -> None:
        async with two_systems(*endpoints("ipc", ipc_dir)) as (a, b):
            slow = Slow(b, "echo")
            slow.start()
            ask = asyncio.ensure_future(a.ask("echo", Ping(1), timeout_s=WAIT_S))
            for _ in range(500):  # until the ask is being handled
                if any(event.kind == "handle" for event in b.events):
                    break
                await asyncio.sleep(0.01)
            slow.stop()
            with pytest.raises(ActorStoppedError):
                await ask

    run_bounded(main)


def test_a_full_peer_queue_keeps_order_and_loses_nothing(ipc_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zmq_transport, "HWM", 4)
    count = 2000
    pad = "x" * 1000  # 2 MB in all: more than the socket buffers hold, so sends queue in the backlog

    async def main() -> None:
        async with two_systems(*endpoints("ipc", ipc_dir)) as (a, b):
            echo = Echo(b, "echo")
            echo.start()
            for seq in range(count):
                a.tell("echo", Blob(seq, pad))
            assert a._dealers[b.endpoint].backlog  # the slow path is exercised
            assert await a.ask("echo", Count(), timeout_s=WAIT_S) == Pong(count)
            assert echo.notes == [("main", seq) for seq in range(count)]

    run_bounded(main)


def _wire(name: str, version: int, fields: list[Any]) -> list[Any]:
    return [1, name, version, fields]


def test_bad_frames_are_rejected_counted_and_the_actor_still_answers(
    ipc_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    codec = Codec(registry())
    good = codec.encode_envelope(Envelope("raw", "echo", 1, None, Ping(1)))
    bad_frames: list[list[bytes]] = [
        [b"ask", b"\xc1\xff\x00garbage"],  # malformed msgpack (0xc1 is never used)
        [b"ask", good[: len(good) // 2]],  # a valid frame, truncated
        [b"ask", msgpack.packb(_wire("envelope", 1, ["raw", "echo", 2, None, _wire("zt.Unknown", 1, [])]))],
        [b"ask", msgpack.packb(_wire("envelope", 1, ["raw", "echo", 3, None, _wire("zt.Ping", 2, [3])]))],
        [b"ask", msgpack.packb(_wire("envelope", 9, ["raw", "echo", 4, None, _wire("zt.Ping", 1, [4])]))],
        [b"tell", msgpack.packb(_wire("zt.Ping", 1, [5]))],  # a message, not an envelope
        [b"shout", good],  # an unknown frame kind
        [good],  # one frame only
    ]

    async def main() -> None:
        system = ZmqActorSystem(Codec(registry()), bind=f"ipc://{ipc_dir}/live")
        async with system:
            echo = Echo(system, "echo")
            echo.start()
            context = zmq.asyncio.Context()
            raw = context.socket(zmq.DEALER)
            raw.setsockopt(zmq.LINGER, 0)
            try:
                raw.connect(system.endpoint)
                for frames in bad_frames:
                    await raw.send_multipart(frames)
                # The valid ask after the bad frames is answered (FIFO on the connection: all were seen).
                await raw.send_multipart([b"ask", good])
                kind, data = await asyncio.wait_for(raw.recv_multipart(), WAIT_S)
            finally:
                raw.close(linger=0)
                context.term()
            assert kind == b"reply"
            reply = codec.decode_envelope(data)
            assert (reply.sender, reply.recipient, reply.reply_to, reply.body) == ("echo", "raw", 1, Pong(1))
            assert system.rejected == len(bad_frames)
            assert system.counters["transport.rejected"] == len(bad_frames)
            rejected = [event for event in system.events if event.kind == "rejected"]
            assert len(rejected) == len(bad_frames) and {event.actor for event in rejected} == {"transport"}
            summaries = " | ".join(event.summary for event in rejected)
            for needle in ("malformed", "unknown message type", "version 2", "version 9", "expected an envelope"):
                assert needle in summaries
            assert not echo.stopped
            assert system.failure is None

    with caplog.at_level(logging.WARNING, logger="dualpath_emu.runtime.zmq_transport"):
        run_bounded(main)
    assert len([r for r in caplog.records if "rejected a frame" in r.getMessage()]) == len(bad_frames)


def test_refuses_the_virtual_time_loop_and_binds_loopback_by_default() -> None:
    from dualpath_emu._core import Core
    from dualpath_emu.runtime import run

    system = ZmqActorSystem(Codec(registry()))
    assert system.bind_address == "tcp://127.0.0.1:*"

    async def main() -> None:
        with pytest.raises(RuntimeError, match="real-time loop"):
            await system.open()

    run(main(), Core())


# --- the same ping-pong on both transports -----------------------------------------------------------


@asynccontextmanager
async def ping_pong_systems(transport: str, ipc_dir: str) -> AsyncIterator[tuple[ActorSystem, ActorSystem]]:
    """The system that sends and the one that hosts ``echo``: one in-process system, or two over ZeroMQ."""
    if transport == "inproc":
        system = ActorSystem()
        yield system, system
        await system.shutdown()
        return
    async with two_systems(*endpoints("ipc", ipc_dir)) as pair:
        yield pair


@pytest.fixture(params=["inproc", "zmq"])
def transport(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


def test_ping_pong_on_every_transport(transport: str, ipc_dir: str) -> None:
    async def main() -> None:
        async with ping_pong_systems(transport, ipc_dir) as (sender, host):
            echo = Echo(host, "echo")
            echo.start()
            for seq in range(20):
                sender.tell("echo", Note(seq))
                assert await sender.ask("echo", Ping(seq), timeout_s=WAIT_S) == Pong(seq)
            assert echo.notes == [("main", seq) for seq in range(20)]

    run_bounded(main)
