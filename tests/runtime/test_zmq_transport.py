"""The ZeroMQ transport (``dualpath_emu.runtime.zmq_transport``): two actor systems in one process, on
``ipc://`` endpoints under a private temporary directory or on ``tcp://127.0.0.1`` with the run's CURVE keys
(and once without, ``insecure=True``), exchange tells and asks exactly once; remote exceptions reach the
asker; malformed, truncated, unknown-type and wrong-version frames sent by a raw socket to a live actor are
rejected and counted, and the actor still answers; a backed-up connection fails a tell, holds an ask, loses
nothing it accepted; the paper's largest ``Submit`` (49,152 turns) crosses. Every wait is bounded.
(Who may connect at all: ``test_security``.)
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import msgpack  # type: ignore[import-untyped]
import pytest
import zmq
import zmq.asyncio

from dualpath_emu.errors import SecurityError
from dualpath_emu.messages import Codec, Envelope, Message, MessageRegistry
from dualpath_emu.runtime import zmq_transport
from dualpath_emu.runtime.security import RunKeys, start_authenticator
from dualpath_emu.runtime.actors import Actor, ActorStoppedError, ActorSystem, UnknownActorError, handles
from dualpath_emu.runtime.zmq_transport import BacklogFullError, RemoteError, ZmqActorSystem

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


TRANSPORTS = ("ipc", "tcp-curve")
"""How two systems are connected: ipc:// in a private directory, or tcp:// loopback with the run's keys."""


def endpoints(transport: str, ipc_dir: str) -> tuple[str, str]:
    if transport == "ipc":
        return f"ipc://{ipc_dir}/a", f"ipc://{ipc_dir}/b"
    return "tcp://127.0.0.1:*", "tcp://127.0.0.1:*"


def security(transport: str, ipc_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The security arguments of systems A and B: none (ipc), the run's keys (tcp-curve), or insecure."""
    if transport == "tcp-curve":
        keys = RunKeys.generate(Path(ipc_dir) / "keys", ["a", "b"])
        return {"keys": keys, "name": "a"}, {"keys": keys, "name": "b"}
    if transport == "tcp-insecure":
        return {"insecure": True}, {"insecure": True}
    return {}, {}


@asynccontextmanager
async def two_systems(transport: str, ipc_dir: str) -> AsyncIterator[tuple[ZmqActorSystem, ZmqActorSystem]]:
    """System A (process ``a``) hosts ``relay``, system B (``b``) hosts ``echo``; each knows where the other's
    actors are."""
    bind_a, bind_b = endpoints(transport, ipc_dir)
    options_a, options_b = security(transport, ipc_dir)
    a = ZmqActorSystem(Codec(registry()), bind=bind_a, **options_a)
    b = ZmqActorSystem(Codec(registry()), bind=bind_b, **options_b)
    async with a, b:
        a.add_route("echo", b.endpoint, "b")
        b.add_route("relay", a.endpoint, "a")
        yield a, b


@pytest.mark.parametrize("transport", [*TRANSPORTS, "tcp-insecure"])
def test_tell_and_ask_across_two_systems_exactly_once(transport: str, ipc_dir: str) -> None:
    async def main() -> None:
        async with two_systems(transport, ipc_dir) as (a, b):
            if transport.startswith("tcp"):
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
            assert a.rejected == 0 and b.rejected == 0 and a.denied == 0 and b.denied == 0
            kinds_b = [event.kind for event in b.events]
            assert kinds_b.count("deliver") == 200 + 1 + 50 + 1 + 1  # + the relay's Ping
            answers = [event for event in a.events if event.kind == "answer"]
            assert len(answers) == 1 + 50 + 1 + 1  # asks of A's main and relay's ask

    run_bounded(main)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_remote_exceptions_reach_the_asker(transport: str, ipc_dir: str) -> None:
    async def main() -> None:
        async with two_systems(transport, ipc_dir) as (a, b):
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


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_remote_actor_stopping_fails_the_pending_ask(transport: str, ipc_dir: str) -> None:
    class Slow(Actor):
        @handles(Ping)
        async def on_ping(self, msg: Ping) -> Pong:
            await asyncio.sleep(WAIT_S)
            return Pong(msg.seq)

    async def main() -> None:
        async with two_systems(transport, ipc_dir) as (a, b):
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


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_full_peer_queue_keeps_order_and_loses_nothing(
    transport: str, ipc_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zmq_transport, "HWM", 4)
    count = 2000
    pad = "x" * 1000  # 2 MB in all: more than the socket buffers hold, so sends queue in the backlog

    async def main() -> None:
        async with two_systems(transport, ipc_dir) as (a, b):
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


def test_binds_loopback_by_default() -> None:
    with pytest.raises(SecurityError, match=r"^tcp://127\.0\.0\.1:\*: a tcp:// endpoint without keys"):
        ZmqActorSystem(Codec(registry()))  # secure by default: loopback tcp needs keys, or insecure=True
    system = ZmqActorSystem(Codec(registry()), insecure=True)
    assert system.bind_address == "tcp://127.0.0.1:*"


# --- the same ping-pong on both transports -----------------------------------------------------------


@asynccontextmanager
async def ping_pong_systems(transport: str, ipc_dir: str) -> AsyncIterator[tuple[ActorSystem, ActorSystem]]:
    """The system that sends and the one that hosts ``echo``: one in-process system, or two over ZeroMQ."""
    if transport == "inproc":
        system = ActorSystem()
        yield system, system
        await system.shutdown()
        return
    async with two_systems(transport, ipc_dir) as pair:
        yield pair


@pytest.fixture(params=["inproc", *TRANSPORTS])
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


# --- a connection whose peer does not keep up ----------------------------------------------------------


def test_a_backed_up_connection_fails_a_tell_holds_an_ask_and_loses_nothing_it_accepted(
    ipc_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zmq_transport, "HWM", 4)
    monkeypatch.setattr(zmq_transport, "BACKLOG_MESSAGES", 10)
    pad = "x" * 100_000  # a few fill the socket buffers: then the backlog
    codec = Codec(registry())

    async def main() -> None:
        context = zmq.asyncio.Context()
        peer = context.socket(zmq.ROUTER)  # a peer that reads nothing until told to
        peer.setsockopt(zmq.LINGER, 0)
        peer.setsockopt(zmq.RCVHWM, 4)
        peer.bind(f"ipc://{ipc_dir}/slow")
        try:
            async with ZmqActorSystem(Codec(registry()), bind=f"ipc://{ipc_dir}/a") as a:
                a.add_route("echo", f"ipc://{ipc_dir}/slow")
                accepted = 0
                with pytest.raises(BacklogFullError, match=r"holds 10 messages .* nothing was sent"):
                    for seq in range(5_000):
                        a.tell("echo", Blob(seq, pad))
                        accepted += 1
                        await asyncio.sleep(0)  # the drain runs: it cannot send either
                assert 10 < accepted < 1_000
                assert [e.kind for e in a.events].count("tell") == accepted  # the refused one is not recorded
                with pytest.raises(TimeoutError, match="backlog stayed full"):
                    await a.ask("echo", Ping(1), timeout_s=0.2)  # waits for room, none comes, nothing sent
                waiting = asyncio.ensure_future(a.ask("echo", Ping(2), timeout_s=WAIT_S))
                await asyncio.sleep(0.05)
                assert not waiting.done()
                # The peer reads now: every accepted tell, in order, then the waiting ask (not the timed-out one).
                seqs: list[int] = []
                while True:
                    identity, kind, data = await asyncio.wait_for(peer.recv_multipart(), WAIT_S)
                    envelope = codec.decode_envelope(data)
                    if kind == b"ask":
                        break
                    assert isinstance(envelope.body, Blob)
                    seqs.append(envelope.body.seq)
                assert seqs == list(range(accepted))
                assert envelope.body == Ping(2)
                answer = Envelope("echo", envelope.sender, 1, envelope.msg_id, Pong(2))
                await peer.send_multipart([identity, b"reply", codec.encode_envelope(answer)])
                assert await asyncio.wait_for(waiting, WAIT_S) == Pong(2)
        finally:
            peer.close(linger=0)
            context.term()

    run_bounded(main)


# --- the paper's largest Submit ----------------------------------------------------------------------------

SUBMIT_TURNS = 49_152
"""The paper's largest run (48P96D): 49,152 agents, every one's first turn submitted at t = 0."""


def largest_submit() -> Message:
    from dualpath_emu.cluster.messages import Submit, Turn

    # Large values, so every field takes its longest msgpack form (rids of a long run, 64K-token prompts).
    base = 3_000_000_000
    return Submit(tuple(Turn(base + i, 70_000 + i % 1000, 66_000 + i % 1000, 1 + i % 600, i) for i in range(SUBMIT_TURNS)))


def cluster_codec() -> Codec:
    from dualpath_emu.cluster.messages import cluster_registry

    reg = cluster_registry()
    reg.register(Pong)
    return Codec(reg)


def test_the_largest_submit_encodes_and_decodes() -> None:
    codec = cluster_codec()
    submit = largest_submit()
    envelope = Envelope("client", "scheduler", 1, None, submit)
    started = time.perf_counter()
    data = codec.encode_envelope(envelope)
    encoded = time.perf_counter()
    assert codec.decode_envelope(data) == envelope
    decoded = time.perf_counter()
    print(f"Submit of {SUBMIT_TURNS} turns: {len(data):,} bytes, encode {encoded - started:.3f} s, "
          f"decode {decoded - encoded:.3f} s")  # fmt: skip
    assert len(data) < codec.max_frame_bytes / 8  # ample room below the limit


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_largest_submit_crosses_the_transport(transport: str, ipc_dir: str) -> None:
    from dualpath_emu.cluster.messages import Submit

    class Intake(Actor):
        @handles(Submit)
        async def on_submit(self, msg: Submit) -> Pong:
            assert msg == submit
            return Pong(len(msg.turns))

    submit = largest_submit()

    async def main() -> None:
        bind_a, bind_b = endpoints(transport, ipc_dir)
        options_a, options_b = security(transport, ipc_dir)
        async with (
            ZmqActorSystem(cluster_codec(), bind=bind_a, **options_a) as a,
            ZmqActorSystem(cluster_codec(), bind=bind_b, **options_b) as b,
        ):
            Intake(b, "scheduler").start()
            a.add_route("scheduler", b.endpoint, "b")
            assert await a.ask("scheduler", submit, timeout_s=4 * WAIT_S) == Pong(SUBMIT_TURNS)
            assert a.rejected == b.rejected == 0

    run_bounded(main, limit_s=60.0)


def test_in_a_named_run_an_envelope_speaks_only_for_its_own_process(ipc_dir: str) -> None:
    """Over ipc (no keys) a same-user process could connect and declare any sender. In a named run each DEALER
    connects as its process: an envelope naming another process's actor is rejected, whoever sends it."""
    codec = Codec(registry())
    forged = codec.encode_envelope(Envelope("relay", "echo", 1, None, Note(99)))

    async def main() -> None:
        a = ZmqActorSystem(Codec(registry()), bind=f"ipc://{ipc_dir}/a", name="a")
        b = ZmqActorSystem(Codec(registry()), bind=f"ipc://{ipc_dir}/b", name="b")
        async with a, b:
            a.add_route("echo", b.endpoint, "b")
            b.add_route("relay", a.endpoint, "a")
            echo = Echo(b, "echo")
            echo.start()
            a.tell("echo", Note(1), sender="relay")  # the real one: delivered
            assert await a.ask("echo", Count(), timeout_s=WAIT_S) == Pong(1)
            context = zmq.asyncio.Context()
            for routing_id in (None, b"x", b"a"):  # anonymous, another name, and a's own name while a is connected
                raw = context.socket(zmq.DEALER)
                raw.setsockopt(zmq.LINGER, 0)
                if routing_id is not None:
                    raw.setsockopt(zmq.ROUTING_ID, routing_id)
                raw.connect(b.endpoint)
                await raw.send_multipart([b"tell", forged])
                await asyncio.sleep(0.2)
                raw.close(linger=0)
            context.term()
            assert await a.ask("echo", Count(), timeout_s=WAIT_S) == Pong(1)  # no forged note got in
            assert echo.notes == [("relay", 1)]
            assert b.rejected == 2  # the one under a's name never got a connection: the ROUTER refused it

    run_bounded(main)


def _raw_process(context: zmq.asyncio.Context, routing_id: bytes | None, keys: RunKeys | None) -> zmq.asyncio.Socket:
    """A DEALER under ``routing_id`` (None: ZeroMQ's anonymous one) with, over tcp, process a's key."""
    raw = context.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        keys.as_process("a").make_client(raw, "b")
    if routing_id is not None:
        raw.setsockopt(zmq.ROUTING_ID, routing_id)
    return raw


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_process_sends_only_as_itself_and_only_processes_of_the_run_connect(
    transport: str, ipc_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 34: over ipc anyone of the user, over tcp anyone holding the run's keys, could connect and name any
    sender the address book did not know: a stranger's name, an empty one, a process's name, the receiving
    process's own actor. Each such request was delivered and acted on; now only ``main`` and the connection's own
    process's actors are, and only over a connection under a process of the run's name."""
    codec = Codec(registry())
    bind_a, bind_b = endpoints(transport, ipc_dir)
    options_a, options_b = security(transport, ipc_dir)
    keys: RunKeys | None = options_b.get("keys")
    # Under process a's name (a has not connected to b yet, so the name is free): what a may and may not say.
    as_a = [("relay", 1), ("main", 2), ("stranger", 3), ("", 4), ("a", 5), ("b", 6), ("echo", 7), ("other", 8)]
    # Under a name no process of the run has, or none: even main is refused.
    as_nobody = [(b"x", "main", 9), (b"dataplane", "main", 10), (None, "main", 11), (b"echo", "relay", 12)]

    async def main() -> None:
        async with (
            ZmqActorSystem(Codec(registry()), bind=bind_a, name="a", **{k: v for k, v in options_a.items() if k != "name"}) as a,
            ZmqActorSystem(Codec(registry()), bind=bind_b, name="b", **{k: v for k, v in options_b.items() if k != "name"}) as b,
        ):  # fmt: skip
            b.add_route("relay", a.endpoint, "a")
            a.add_route("echo", b.endpoint, "b")
            echo = Echo(b, "echo")
            echo.start()
            context = zmq.asyncio.Context()
            try:
                raw = _raw_process(context, b"a", keys)  # (context.destroy closes whatever a failure left open)
                raw.connect(b.endpoint)
                for sender, seq in as_a:
                    await raw.send_multipart([b"tell", codec.encode_envelope(Envelope(sender, "echo", seq, None, Note(seq)))])
                await raw.send_multipart([b"ask", codec.encode_envelope(Envelope("main", "echo", 99, None, Count()))])
                kind, data = await asyncio.wait_for(raw.recv_multipart(), WAIT_S)  # after the tells: FIFO
                assert kind == b"reply" and codec.decode_envelope(data).body == Pong(2)
                raw.close(linger=0)
                assert echo.notes == [("relay", 1), ("main", 2)]
                assert b.rejected == 6
                for routing_id, sender, seq in as_nobody:
                    raw = _raw_process(context, routing_id, keys)
                    raw.connect(b.endpoint)
                    await raw.send_multipart([b"ask", codec.encode_envelope(Envelope(sender, "echo", seq, None, Ping(seq)))])
                    assert not await raw.poll(300)  # no answer: not even "no such actor"
                    raw.close(linger=0)
            finally:
                context.destroy(linger=0)
            assert echo.notes == [("relay", 1), ("main", 2)]
            assert b.rejected == 6 + len(as_nobody)
            # The run's own processes still talk (a's real connection, under its name, now that the raw one is gone).
            a.tell("echo", Note(100), sender="relay")
            assert await a.ask("echo", Count(), timeout_s=WAIT_S) == Pong(3)
            assert b.rejected == 6 + len(as_nobody) and a.rejected == 0

    with caplog.at_level(logging.WARNING, logger="dualpath_emu.runtime.zmq_transport"):
        run_bounded(main)
    reasons = [r.getMessage() for r in caplog.records if "rejected a frame" in r.getMessage()]
    assert len(reasons) == 6 + len(as_nobody)  # each logged (under REJECTIONS_LOGGED: one by one)
    assert "sender 'stranger' (no actor of the run) in a request from process 'a'" in reasons[0]
    assert "sender 'echo' (an actor of this process)" in reasons[4]
    assert "sender 'other' (no actor of the run)" in reasons[5]
    assert "routing id b'x', which no process of the run has" in reasons[6]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_reply_must_come_from_the_actor_asked(transport: str, ipc_dir: str) -> None:
    """A reply naming another sender than the actor asked (here a peer that answers for an actor of another
    process) answers nothing; the real one does."""
    codec = Codec(registry())
    keys = RunKeys.generate(Path(ipc_dir) / "keys", ["a", "b", "c"]) if transport == "tcp-curve" else None

    async def main() -> None:
        context = zmq.asyncio.Context()
        peer = context.socket(zmq.ROUTER)  # poses as process b, answering for c's actor first
        peer.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            keys.as_process("b").make_server(peer)
            authenticator = start_authenticator(context, keys.as_process("b"))
            port = peer.bind_to_random_port("tcp://127.0.0.1")
            endpoint, options = f"tcp://127.0.0.1:{port}", {"keys": keys, "bind": "tcp://127.0.0.1:*"}
        else:
            endpoint, options = f"ipc://{ipc_dir}/b", {"bind": f"ipc://{ipc_dir}/a"}
            peer.bind(endpoint)
        try:
            async with ZmqActorSystem(Codec(registry()), name="a", **options) as a:  # type: ignore[arg-type]
                a.add_route("echo", endpoint, "b")
                a.add_route("other", endpoint.replace("/b", "/c") if keys is None else "tcp://127.0.0.1:1", "c")
                asking = asyncio.ensure_future(a.ask("echo", Ping(1), timeout_s=WAIT_S))
                identity, kind, data, *_ = await asyncio.wait_for(peer.recv_multipart(), WAIT_S)
                ask = codec.decode_envelope(data)
                for sender, recipient in (("other", "main"), ("stranger", "main"), ("echo", "nobody")):
                    forged = Envelope(sender, recipient, 50, ask.msg_id, Pong(666))
                    await peer.send_multipart([identity, b"reply", codec.encode_envelope(forged)])
                await peer.send_multipart([identity, b"reply", codec.encode_envelope(Envelope("echo", "main", 51, ask.msg_id, Pong(1)))])
                assert await asking == Pong(1)
                assert a.rejected == 3
        finally:
            peer.close(linger=0)
            if keys is not None:
                authenticator.stop()
            context.destroy(linger=0)

    run_bounded(main)
