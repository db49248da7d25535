"""The ZeroMQ transport (``dualpath_emu.runtime.zmq_transport``): two actor systems in one process, on
``ipc://`` endpoints under a private temporary directory or on ``tcp://127.0.0.1`` with the run's CURVE keys
(and once without, ``insecure=True``), exchange tells exactly once and in order (an answer is a tell back);
a tell for an actor the remote system does not host is rejected and counted, one for a stopped actor dropped;
malformed, truncated, unknown-type and wrong-version frames sent by a raw socket to a live actor are rejected
and counted, and the actor still hears what follows; a backed-up connection fails a tell and loses nothing it
accepted; what comes back on a connection a process opened is rejected; the paper's largest ``Submit`` (49,152
turns) crosses. Every wait is bounded.
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
from dualpath_emu.runtime.actors import Actor, ActorSystem
from dualpath_emu.runtime.zmq_transport import BacklogFullError, ZmqActorSystem

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


class Echo(Actor):
    """Keeps the notes it is told; answers a Ping with a Pong, a Count with the notes so far (as tells back)."""

    def __init__(self, system: ActorSystem, name: str) -> None:
        super().__init__(system, name)
        self.notes: list[tuple[str, int]] = []

    def receive(self, now_ns: int, msg: Message, sender: str) -> None:
        if isinstance(msg, (Note, Blob)):
            self.notes.append((sender, msg.seq))
        elif isinstance(msg, Ping):
            self.system.tell(sender, Pong(msg.seq), sender=self.name)
        elif isinstance(msg, Count):
            self.system.tell(sender, Pong(len(self.notes)), sender=self.name)
        elif isinstance(msg, Fail):
            raise ValueError("bad value")


class Asker(Actor):
    """Keeps what it is told, for :func:`request`."""

    def __init__(self, system: ActorSystem, name: str = "asker") -> None:
        super().__init__(system, name)
        self.got: asyncio.Queue[tuple[str, Message]] = asyncio.Queue()

    def receive(self, now_ns: int, msg: Message, sender: str) -> None:
        self.got.put_nowait((sender, msg))


async def request(system: ActorSystem, asker: Asker, recipient: str, msg: Message) -> Message:
    """Tell ``msg`` to ``recipient`` as ``asker`` and return what ``recipient`` tells it next."""
    system.tell(recipient, msg, sender=asker.name)
    sender, answer = await asyncio.wait_for(asker.got.get(), WAIT_S)
    assert sender == recipient
    return answer


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def registry() -> MessageRegistry:
    reg = MessageRegistry()
    for cls in (Ping, Pong, Note, Blob, Count, Fail):
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
    """System A (process ``a``) hosts ``asker``, system B (``b``) hosts ``echo``; each knows where the other's
    actors are."""
    bind_a, bind_b = endpoints(transport, ipc_dir)
    options_a, options_b = security(transport, ipc_dir)
    a = ZmqActorSystem(Codec(registry()), bind=bind_a, **options_a)
    b = ZmqActorSystem(Codec(registry()), bind=bind_b, **options_b)
    async with a, b:
        a.add_route("echo", b.endpoint, "b")
        b.add_route("asker", a.endpoint, "a")
        yield a, b


@pytest.mark.parametrize("transport", [*TRANSPORTS, "tcp-insecure"])
def test_tells_cross_between_two_systems_exactly_once_and_in_order(transport: str, ipc_dir: str) -> None:
    async def main() -> None:
        async with two_systems(transport, ipc_dir) as (a, b):
            if transport.startswith("tcp"):
                assert a.endpoint.startswith("tcp://127.0.0.1:") and not a.endpoint.endswith(":*")
            echo = Echo(b, "echo")
            asker = Asker(a)
            echo.start()
            asker.start()
            for seq in range(200):
                a.tell("echo", Note(seq))
            # FIFO per connection: the count after the notes sees all of them.
            assert await request(a, asker, "echo", Count()) == Pong(200)
            assert echo.notes == [("main", seq) for seq in range(200)]  # exactly once, in order
            for i in range(50):
                a.tell("echo", Ping(i), sender="asker")
            pongs = [await asyncio.wait_for(asker.got.get(), WAIT_S) for _ in range(50)]
            assert pongs == [("echo", Pong(i)) for i in range(50)]  # B's answers, in order too
            assert a.rejected == 0 and b.rejected == 0 and a.denied == 0 and b.denied == 0
            assert [event.kind for event in b.events].count("deliver") == 200 + 1 + 50
            assert [event.kind for event in a.events].count("deliver") == 1 + 50

    run_bounded(main)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_tell_for_no_actor_there_is_rejected_and_one_for_a_stopped_actor_dropped(
    transport: str, ipc_dir: str
) -> None:
    async def main() -> None:
        async with two_systems(transport, ipc_dir) as (a, b):
            echo = Echo(b, "echo")
            echo.start()
            a.add_route("ghost", b.endpoint, "b")
            a.tell("ghost", Note(1))
            await until(lambda: b.rejected == 1)
            echo.stop()
            a.tell("echo", Note(2))
            await until(lambda: b.dropped == 1)
            assert echo.notes == [] and [e.kind for e in b.events].count("drop") == 1

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
            asker = Asker(a)
            echo.start()
            asker.start()
            for seq in range(count):
                a.tell("echo", Blob(seq, pad))
            assert a._dealers[b.endpoint].backlog  # the slow path is exercised
            assert await request(a, asker, "echo", Count()) == Pong(count)
            assert echo.notes == [("main", seq) for seq in range(count)]

    run_bounded(main)


def _wire(name: str, version: int, fields: list[Any]) -> list[Any]:
    return [1, name, version, fields]


def test_bad_frames_are_rejected_counted_and_the_actor_still_hears_what_follows(
    ipc_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    codec = Codec(registry())
    good = codec.encode_envelope(Envelope("raw", "echo", 1, Note(1)))
    bad_frames: list[list[bytes]] = [
        [b"tell", b"\xc1\xff\x00garbage"],  # malformed msgpack (0xc1 is never used)
        [b"tell", good[: len(good) // 2]],  # a valid frame, truncated
        [b"tell", msgpack.packb(_wire("envelope", 2, ["raw", "echo", 2, _wire("zt.Unknown", 1, [])]))],
        [b"tell", msgpack.packb(_wire("envelope", 2, ["raw", "echo", 3, _wire("zt.Note", 2, [3])]))],
        [b"tell", msgpack.packb(_wire("envelope", 9, ["raw", "echo", 4, _wire("zt.Note", 1, [4])]))],
        [b"tell", msgpack.packb(_wire("zt.Note", 1, [5]))],  # a message, not an envelope
        [b"ask", good],  # a kind that is no more (nothing is answered)
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
                # The valid tell after the bad frames arrives (FIFO on the connection: all were seen).
                await raw.send_multipart([b"tell", good])
                await until(lambda: echo.notes == [("raw", 1)])
            finally:
                raw.close(linger=0)
                context.term()
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
        system.stop_all()
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
            asker = Asker(sender)
            echo.start()
            asker.start()
            for seq in range(20):
                sender.tell("echo", Note(seq))
                assert await request(sender, asker, "echo", Ping(seq)) == Pong(seq)
            assert echo.notes == [("main", seq) for seq in range(20)]

    run_bounded(main)


# --- a connection whose peer does not keep up ----------------------------------------------------------


def test_a_backed_up_connection_fails_a_tell_and_loses_nothing_it_accepted(
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
                # The peer reads now: every accepted tell, in order.
                seqs: list[int] = []
                while len(seqs) < accepted:
                    _, kind, data = await asyncio.wait_for(peer.recv_multipart(), WAIT_S)
                    envelope = codec.decode_envelope(data)
                    assert kind == b"tell" and isinstance(envelope.body, Blob)
                    seqs.append(envelope.body.seq)
                assert seqs == list(range(accepted))
                assert not await peer.poll(100)  # and nothing else
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
    return Submit(
        tuple(Turn(base + i, 70_000 + i % 1000, 66_000 + i % 1000, 1 + i % 600, i) for i in range(SUBMIT_TURNS))
    )


def cluster_codec() -> Codec:
    from dualpath_emu.cluster.messages import cluster_registry

    reg = cluster_registry()
    reg.register(Pong)
    return Codec(reg)


def test_the_largest_submit_encodes_and_decodes() -> None:
    codec = cluster_codec()
    submit = largest_submit()
    envelope = Envelope("client", "scheduler", 1, submit)
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
        def receive(self, now_ns: int, msg: Message, sender: str) -> None:
            assert msg == submit and isinstance(msg, Submit)
            self.system.tell(sender, Pong(len(msg.turns)), sender=self.name)

    submit = largest_submit()

    async def main() -> None:
        bind_a, bind_b = endpoints(transport, ipc_dir)
        options_a, options_b = security(transport, ipc_dir)
        async with (
            ZmqActorSystem(cluster_codec(), bind=bind_a, **options_a) as a,
            ZmqActorSystem(cluster_codec(), bind=bind_b, **options_b) as b,
        ):
            Intake(b, "scheduler").start()
            asker = Asker(a)
            asker.start()
            a.add_route("scheduler", b.endpoint, "b")
            b.add_route("asker", a.endpoint, "a")
            a.tell("scheduler", submit, sender="asker")
            assert await asyncio.wait_for(asker.got.get(), 4 * WAIT_S) == ("scheduler", Pong(SUBMIT_TURNS))
            assert a.rejected == b.rejected == 0

    run_bounded(main, limit_s=60.0)


def test_in_a_named_run_an_envelope_speaks_only_for_its_own_process(ipc_dir: str) -> None:
    """Over ipc (no keys) a same-user process could connect and declare any sender. In a named run each DEALER
    connects as its process: an envelope naming another process's actor is rejected, whoever sends it."""
    codec = Codec(registry())
    forged = codec.encode_envelope(Envelope("asker", "echo", 1, Note(99)))

    async def main() -> None:
        a = ZmqActorSystem(Codec(registry()), bind=f"ipc://{ipc_dir}/a", name="a")
        b = ZmqActorSystem(Codec(registry()), bind=f"ipc://{ipc_dir}/b", name="b")
        async with a, b:
            a.add_route("echo", b.endpoint, "b")
            b.add_route("asker", a.endpoint, "a")
            echo = Echo(b, "echo")
            asker = Asker(a)
            echo.start()
            asker.start()
            a.tell("echo", Note(1), sender="asker")  # the real one: delivered
            assert await request(a, asker, "echo", Count()) == Pong(1)
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
            assert await request(a, asker, "echo", Count()) == Pong(1)  # no forged note got in
            assert echo.notes == [("asker", 1)]
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
    as_a = [("asker", 1), ("main", 2), ("stranger", 3), ("", 4), ("a", 5), ("b", 6), ("echo", 7), ("other", 8)]
    # Under a name no process of the run has, or none: even main is refused.
    as_nobody = [(b"x", "main", 9), (b"dataplane", "main", 10), (None, "main", 11), (b"echo", "asker", 12)]

    async def main() -> None:
        async with (
            ZmqActorSystem(Codec(registry()), bind=bind_a, name="a", **{k: v for k, v in options_a.items() if k != "name"}) as a,
            ZmqActorSystem(Codec(registry()), bind=bind_b, name="b", **{k: v for k, v in options_b.items() if k != "name"}) as b,
        ):  # fmt: skip
            b.add_route("asker", a.endpoint, "a")
            a.add_route("echo", b.endpoint, "b")
            echo = Echo(b, "echo")
            asker = Asker(a)
            echo.start()
            asker.start()
            context = zmq.asyncio.Context()
            try:
                raw = _raw_process(context, b"a", keys)  # (context.destroy closes whatever a failure left open)
                raw.connect(b.endpoint)
                for sender, seq in as_a:
                    await raw.send_multipart([b"tell", codec.encode_envelope(Envelope(sender, "echo", seq, Note(seq)))])
                await until(lambda: b.rejected == 6)
                raw.close(linger=0)
                assert echo.notes == [("asker", 1), ("main", 2)]
                for routing_id, sender, seq in as_nobody:
                    raw = _raw_process(context, routing_id, keys)
                    raw.connect(b.endpoint)
                    await raw.send_multipart([b"tell", codec.encode_envelope(Envelope(sender, "echo", seq, Note(seq)))])
                    await until(lambda: b.rejected == 6 + 1 + as_nobody.index((routing_id, sender, seq)))
                    raw.close(linger=0)
            finally:
                context.destroy(linger=0)
            assert echo.notes == [("asker", 1), ("main", 2)]
            assert b.rejected == 6 + len(as_nobody)
            # The run's own processes still talk (a's real connection, under its name, now that the raw one is gone).
            a.tell("echo", Note(100), sender="asker")
            assert await request(a, asker, "echo", Count()) == Pong(3)
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
def test_what_comes_back_on_a_connection_a_process_opened_is_rejected(transport: str, ipc_dir: str) -> None:
    """Nothing is ever sent back over a connection (a DEALER): a peer that does (here one posing as process b, on
    the connection a opened to it) reaches no actor."""
    codec = Codec(registry())
    keys = RunKeys.generate(Path(ipc_dir) / "keys", ["a", "b"]) if transport == "tcp-curve" else None

    async def main() -> None:
        context = zmq.asyncio.Context()
        peer = context.socket(zmq.ROUTER)
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
                asker = Asker(a)
                asker.start()
                a.add_route("echo", endpoint, "b")
                a.tell("echo", Ping(1), sender="asker")
                identity, kind, data, *_ = await asyncio.wait_for(peer.recv_multipart(), WAIT_S)
                assert kind == b"tell"
                back = Envelope("echo", "asker", 50, Pong(1))
                for frames in ([b"tell", codec.encode_envelope(back)], [b"reply", codec.encode_envelope(back)]):
                    await peer.send_multipart([identity, *frames])
                await until(lambda: a.rejected == 2)
                assert asker.got.empty()
        finally:
            peer.close(linger=0)
            if keys is not None:
                authenticator.stop()
            context.destroy(linger=0)

    run_bounded(main)
