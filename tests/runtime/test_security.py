"""Who may talk to a run's actors (``dualpath_emu.runtime.security`` and the transport's use of it, issue 14).

A run's keys are private on disk (directory 0700, files 0600) and refused when they are not; ``dualpath-emu
keys`` writes them and reports bad input on one line. Over tcp with CURVE, a process without the run's keys
-- a plain DEALER, or one with a key pair of its own -- cannot get a frame to an actor, nor even to the
transport's rejection path (ZAP refuses it in the handshake), and a client will not talk to a server that
lacks the run's key; without keys, tcp and ipc outside a private directory are refused unless insecure.
An authenticated peer's flood of junk leaves memory and the log bounded; a frame of exactly the codec's
limit still crosses CURVE, a longer one only drops its connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
import zmq
import zmq.asyncio

from dualpath_emu.cli import main as cli_main
from dualpath_emu.errors import SecurityError, UsageError
from dualpath_emu.messages import Codec, Envelope, Message, MessageRegistry
from dualpath_emu.runtime.actors import Actor, ActorSystem
from dualpath_emu.runtime.zmq_transport import ZmqActorSystem
from dualpath_emu.runtime.security import BoundedLog, RunKeys, check_private_ipc, is_wildcard

_T = TypeVar("_T")

WAIT_S = 5.0
LOGGER = "dualpath_emu.runtime.zmq_transport"


@dataclass(frozen=True, slots=True)
class Ping(Message):
    WIRE_NAME: ClassVar[str] = "sec.Ping"
    VERSION: ClassVar[int] = 1
    seq: int


@dataclass(frozen=True, slots=True)
class Pong(Message):
    WIRE_NAME: ClassVar[str] = "sec.Pong"
    VERSION: ClassVar[int] = 1
    seq: int


@dataclass(frozen=True, slots=True)
class Blob(Message):
    WIRE_NAME: ClassVar[str] = "sec.Blob"
    VERSION: ClassVar[int] = 1
    pad: str


class Echo(Actor):
    """Keeps what it is told."""

    def __init__(self, system: ActorSystem, name: str) -> None:
        super().__init__(system, name)
        self.seen: list[Message] = []

    def receive(self, now_ns: int, msg: Message, sender: str) -> None:
        self.seen.append(msg)


async def until(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def registry() -> MessageRegistry:
    reg = MessageRegistry()
    for cls in (Ping, Pong, Blob):
        reg.register(cls)
    return reg


def run_bounded(main: Callable[[], Coroutine[Any, Any, _T]], limit_s: float = 30.0) -> _T:
    async def bounded() -> _T:
        return await asyncio.wait_for(main(), limit_s)

    return asyncio.run(bounded())


@pytest.fixture
def private_dir() -> Iterator[Path]:
    path = tempfile.mkdtemp(prefix="dps")  # 0700, and short (ipc:// paths are limited to ~107 bytes)
    try:
        yield Path(path)
    finally:
        for root, dirs, files in os.walk(path, topdown=False):
            for name in files:
                os.unlink(os.path.join(root, name))
            for name in dirs:
                os.rmdir(os.path.join(root, name))
        os.rmdir(path)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# --- keys on disk ----------------------------------------------------------------------------------------


def test_generated_keys_are_private_and_load_back(private_dir: Path) -> None:
    directory = private_dir / "run" / "keys"
    keys = RunKeys.generate(directory, ["driver", "worker-1", "worker_2"])
    assert (keys.own, keys.names) == ("driver", ("driver", "worker-1", "worker_2"))
    assert mode(directory) == 0o700
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        f"{n}{suffix}" for n in keys.names for suffix in (".key", ".key_secret")
    )
    for path in directory.iterdir():
        assert mode(path) == 0o600, path
    loaded = RunKeys.load(directory, "worker-1")
    assert (loaded.own, loaded.names) == ("worker-1", keys.names)
    assert {loaded.public_key(n) for n in keys.names} == keys.public_keys()
    assert len({keys.public_key(n) for n in keys.names}) == 3 and all(len(k) == 40 for k in keys.public_keys())
    assert "key" not in repr(loaded).replace("RunKeys", "").replace("/keys", "")  # no key in the repr
    with pytest.raises(SecurityError, match="the secret key of process 'driver' is not loaded here"):
        loaded.as_process("driver")
    assert keys.as_process("worker_2").own == "worker_2"
    with pytest.raises(SecurityError, match=r"no public key for process 'ghost' \(the run's: driver, worker-1"):
        loaded.public_key("ghost")


@pytest.mark.parametrize(
    ("names", "error"),
    [
        ([], "at least one process name"),
        (["a", "a"], "'a' is given more than once"),
        (["a/b"], r"process name 'a/b': expected a non-empty name of letters, digits"),
        ([""], "process name '': expected"),
        ([".hidden"], "process name '.hidden'"),
        (["-x"], "does not begin with '-'"),
    ],
)
def test_generate_refuses_bad_names(private_dir: Path, names: list[str], error: str) -> None:
    with pytest.raises(SecurityError, match=error):
        RunKeys.generate(private_dir / "keys", names)
    assert not (private_dir / "keys").exists()


def test_generate_never_writes_over_another_runs_keys(private_dir: Path) -> None:
    directory = private_dir / "keys"
    first = RunKeys.generate(directory, ["a", "b"])
    with pytest.raises(SecurityError, match="not empty; a run's keys go in a new or empty directory"):
        RunKeys.generate(directory, ["a", "b"])
    assert RunKeys.load(directory, "a").public_keys() == first.public_keys()  # untouched
    empty = private_dir / "empty"
    empty.mkdir(mode=0o755)
    RunKeys.generate(empty, ["a"])  # an empty directory is fine, and made private
    assert mode(empty) == 0o700


def test_load_refuses_missing_open_or_broken_keys(private_dir: Path) -> None:
    directory = private_dir / "keys"
    with pytest.raises(SecurityError, match=r"keys: no such directory \(make a run's keys with `dualpath-emu keys"):
        RunKeys.load(directory, "a")
    RunKeys.generate(directory, ["a", "b"])
    with pytest.raises(SecurityError, match=r"c\.key_secret: no such file \(the secret key of process 'c'\)"):
        RunKeys.load(directory, "c")

    secret = directory / "a.key_secret"
    os.chmod(secret, 0o640)  # readable by the group
    with pytest.raises(
        SecurityError, match=r"a\.key_secret: the secret key .* is accessible by others \(mode 0640\); expe"
    ):
        RunKeys.load(directory, "a")
    os.chmod(secret, 0o604)  # readable by others
    with pytest.raises(SecurityError, match=r"accessible by others \(mode 0604\)"):
        RunKeys.load(directory, "a")
    os.chmod(secret, 0o600)

    os.chmod(directory, 0o755)
    with pytest.raises(SecurityError, match=r"the keys directory is accessible by others \(mode 0755\); expected 0700"):
        RunKeys.load(directory, "a")
    os.chmod(directory, 0o700)

    os.chmod(directory / "b.key", 0o666)  # someone else could swap in a key of theirs
    with pytest.raises(SecurityError, match=r"b\.key: the public key of process 'b' is accessible by others"):
        RunKeys.load(directory, "a")
    os.chmod(directory / "b.key", 0o600)

    (directory / "b.key").write_text('curve\n    public-key = "tooshort"\n')
    with pytest.raises(SecurityError, match=r"b\.key: its public key is not a 40-character Z85 CURVE key"):
        RunKeys.load(directory, "a")
    (directory / "b.key").write_text("nothing here\n")
    with pytest.raises(SecurityError, match=r"b\.key: not a ZeroMQ certificate"):
        RunKeys.load(directory, "a")
    (directory / "b.key").unlink()

    os.symlink(secret, directory / "c.key_secret")
    with pytest.raises(SecurityError, match=r"c\.key_secret: expected a regular file .* not a link"):
        RunKeys.load(directory, "c")
    assert RunKeys.load(directory, "a").names == ("a",)  # b's public key is gone: b is no longer in the run


def test_security_errors_are_usage_errors() -> None:
    assert issubclass(SecurityError, UsageError)


# --- the command line -----------------------------------------------------------------------------------


def test_the_keys_command_writes_a_runs_keys(private_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = private_dir / "keys"
    assert cli_main(["keys", str(directory), "--process", "driver", "--process", "worker"]) == 0
    out = capsys.readouterr().out
    assert f"wrote the CURVE keys of 2 processes (driver, worker) to {directory}" in out
    assert RunKeys.load(directory, "worker").names == ("driver", "worker")


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["keys"], "the following arguments are required: DIR, --process"),
        (["keys", "{dir}"], "the following arguments are required: --process"),
        (["keys", "{dir}", "--process", "a", "--process", "a"], "process name 'a' is given more than once"),
        (["keys", "{dir}", "--process", "a b"], "process name 'a b': expected a non-empty name"),
        (["keys", "{existing}", "--process", "a"], "not empty; a run's keys go in a new or empty directory"),
        (["keys", "{file}", "--process", "a"], "cannot write the keys"),
    ],
)
def test_the_keys_command_reports_bad_input_on_one_line(
    private_dir: Path, capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    (private_dir / "existing").mkdir()
    (private_dir / "existing" / "other").write_text("x")
    (private_dir / "file").write_text("x")
    paths = {"dir": private_dir / "new", "existing": private_dir / "existing", "file": private_dir / "file"}
    assert cli_main([arg.format(**paths) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dualpath-emu: error: ") and error in err and err.count("\n") == 1
    assert "Traceback" not in err


# --- endpoints -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "wildcard"),
    [
        ("0.0.0.0", True),
        ("*", True),
        ("::", True),
        ("[::]", True),
        ("0:0:0:0:0:0:0:0", True),
        ("", True),
        ("tcp://0.0.0.0:5555", True),
        ("tcp://*:*", True),
        ("tcp://[::]:7000", True),
        ("tcp://[::1]:7000", False),
        ("tcp://127.0.0.1:*", False),
        ("tcp://10.1.2.3:7000", False),
        ("tcp://eth0:7000", False),
        ("localhost", False),
        ("127.0.0.1", False),
        ("ipc:///tmp/0.0.0.0", False),
        ("inproc://*", False),
    ],
)
def test_is_wildcard(value: str, wildcard: bool) -> None:
    assert is_wildcard(value) is wildcard


def test_ipc_sockets_must_be_in_a_private_directory(private_dir: Path) -> None:
    check_private_ipc(f"ipc://{private_dir}/a.sock")  # 0700, the user's: fine
    shared = private_dir / "shared"
    shared.mkdir()
    for bits in (0o750, 0o705, 0o1777, 0o711):
        os.chmod(shared, bits)
        with pytest.raises(SecurityError, match=rf"directory {shared} is accessible by others \(mode {bits:04o}\)"):
            check_private_ipc(f"ipc://{shared}/a.sock")
    os.chmod(shared, 0o700)
    # /tmp itself: world-writable with the sticky bit, which does not stop others from taking the name first
    with pytest.raises(SecurityError, match=r"accessible by others \(mode 1777\)"):
        check_private_ipc("ipc:///tmp/a.sock")
    with pytest.raises(SecurityError, match="an abstract socket has no permissions"):
        check_private_ipc("ipc://@dualpath")
    check_private_ipc(f"ipc://{private_dir}/none/a.sock")  # not there: a bind fails, a connection waits
    (private_dir / "file").write_text("")
    with pytest.raises(SecurityError, match="cannot use the socket's directory"):
        check_private_ipc(f"ipc://{private_dir}/file/a.sock")
    # A directory above it that others may write to without the sticky bit: they could rename it away.
    inner = shared / "inner"
    inner.mkdir(mode=0o700)
    os.chmod(shared, 0o777)
    with pytest.raises(SecurityError, match=rf"{shared} \(above the socket's directory\) is writable by others"):
        check_private_ipc(f"ipc://{inner}/a.sock")
    os.chmod(shared, 0o1777)  # with the sticky bit it cannot
    check_private_ipc(f"ipc://{inner}/a.sock")
    os.chmod(shared, 0o700)


def test_the_transport_refuses_what_others_could_reach(private_dir: Path) -> None:
    codec = Codec(registry())
    with pytest.raises(SecurityError, match="a tcp:// endpoint without keys"):
        ZmqActorSystem(codec, bind="tcp://127.0.0.1:*")
    with pytest.raises(SecurityError, match=r"tcp://127\.0\.0\.1:7000: a tcp:// endpoint without keys"):
        ZmqActorSystem(codec, bind=f"ipc://{private_dir}/a", address_book={"x": "tcp://127.0.0.1:7000"})
    with pytest.raises(SecurityError, match="accessible by others"):
        ZmqActorSystem(codec, bind="ipc:///tmp/dualpath-test.sock")
    with pytest.raises(SecurityError, match="abstract socket"):
        ZmqActorSystem(codec, bind="ipc://@dualpath-test")
    system = ZmqActorSystem(codec, bind=f"ipc://{private_dir}/a")
    with pytest.raises(SecurityError, match="a tcp:// endpoint without keys"):
        system.add_route("x", "tcp://127.0.0.1:7000")
    ZmqActorSystem(codec, bind="tcp://127.0.0.1:*", address_book={"x": "ipc:///tmp/x"}, insecure=True)

    keys = RunKeys.generate(private_dir / "keys", ["a", "b"])
    with pytest.raises(SecurityError, match="needs name="):
        ZmqActorSystem(codec, keys=keys)
    with pytest.raises(SecurityError, match="the secret key of process 'c' is not loaded"):
        ZmqActorSystem(codec, keys=keys, name="c")
    with pytest.raises(SecurityError, match=r"tcp://127\.0\.0\.1:7000: which process of the run is it"):
        ZmqActorSystem(codec, keys=keys, name="a", address_book={"x": "tcp://127.0.0.1:7000"})
    with pytest.raises(SecurityError, match="no public key for process 'c'"):
        ZmqActorSystem(codec, keys=keys, name="a", peers={"tcp://127.0.0.1:7000": "c"})
    secured = ZmqActorSystem(
        codec, keys=keys, name="a", address_book={"x": "tcp://127.0.0.1:7000"}, peers={"tcp://127.0.0.1:7000": "b"}
    )
    assert secured.keys is not None and secured.keys.own == "a"
    with pytest.raises(SecurityError, match="no public key for process 'c'"):
        secured.add_route("y", "tcp://127.0.0.1:7001", "c")


def test_a_wildcard_bind_warns_once(private_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    keys = RunKeys.generate(private_dir / "keys", ["a"])

    async def main() -> None:
        async with ZmqActorSystem(Codec(registry()), bind="tcp://0.0.0.0:*", keys=keys, name="a") as system:
            assert system.endpoint.startswith("tcp://0.0.0.0:")

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run_bounded(main)
    warnings = [r.getMessage() for r in caplog.records if "listening on all interfaces" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("process 'a': listening on all interfaces (tcp://0.0.0.0:")


# --- who gets through ------------------------------------------------------------------------------------


def _raw_dealer(context: zmq.asyncio.Context, setup: Callable[[zmq.asyncio.Socket], None]) -> zmq.asyncio.Socket:
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    setup(socket)
    return socket


def test_a_process_without_the_runs_keys_cannot_reach_an_actor(private_dir: Path) -> None:
    keys = RunKeys.generate(private_dir / "keys", ["a", "b"])
    stranger = RunKeys.generate(private_dir / "stranger", ["a"])  # a key pair of its own, not the run's
    codec = Codec(registry())

    def plain(socket: zmq.asyncio.Socket) -> None:
        pass

    def own_key_pair(socket: zmq.asyncio.Socket) -> None:  # knows a's public key, but is not in the run
        socket.setsockopt(zmq.CURVE_SECRETKEY, stranger._secrets["a"])
        socket.setsockopt(zmq.CURVE_PUBLICKEY, stranger.public_key("a"))
        socket.setsockopt(zmq.CURVE_SERVERKEY, keys.public_key("a"))

    def run_key(socket: zmq.asyncio.Socket) -> None:  # process b: its key, its name
        keys.as_process("b").make_client(socket, "a")
        socket.setsockopt(zmq.ROUTING_ID, b"b")

    async def main() -> None:
        async with ZmqActorSystem(codec, bind="tcp://127.0.0.1:*", keys=keys, name="a") as system:
            echo = Echo(system, "echo")
            echo.start()
            context = zmq.asyncio.Context()
            try:
                for setup, seq in ((plain, 1), (own_key_pair, 2)):
                    raw = _raw_dealer(context, setup)
                    raw.connect(system.endpoint)
                    tell = codec.encode_envelope(Envelope("intruder", "echo", seq, Ping(seq)))
                    await raw.send_multipart([b"tell", tell])  # queued: the handshake never completes
                    await raw.send_multipart([b"junk"])
                    await asyncio.sleep(0.5)
                    raw.close(linger=0)
                    if setup is plain:  # a mechanism mismatch: libzmq drops it before asking ZAP
                        assert system.denied == 0
                assert echo.seen == []  # ... the actor never saw it ...
                assert system.rejected == 0  # ... nor did the transport: refused in the handshake
                assert system.denied >= 1  # the stranger's key (once per reconnection attempt)
                denied = system.denied
                # The same from a process of the run gets through (so the above is not a broken socket).
                raw = _raw_dealer(context, run_key)
                raw.connect(system.endpoint)
                await raw.send_multipart([b"tell", codec.encode_envelope(Envelope("main", "echo", 3, Ping(3)))])
                await until(lambda: echo.seen == [Ping(3)])
                raw.close(linger=0)
            finally:
                context.term()
        assert system.counters["transport.denied"] == denied  # kept after close

    run_bounded(main)


def test_a_client_will_not_talk_to_a_server_without_the_runs_key(private_dir: Path) -> None:
    keys = RunKeys.generate(private_dir / "keys", ["a", "b"])
    impostor_keys = RunKeys.generate(private_dir / "impostor", ["b"])

    async def main() -> None:
        context = zmq.asyncio.Context()
        impostor = context.socket(zmq.ROUTER)  # poses as b, with a key pair of its own, admitting anyone
        impostor.setsockopt(zmq.LINGER, 0)
        impostor.setsockopt(zmq.CURVE_SECRETKEY, impostor_keys._secrets["b"])
        impostor.setsockopt(zmq.CURVE_SERVER, 1)
        port = impostor.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
        try:
            async with ZmqActorSystem(
                Codec(registry()), bind="tcp://127.0.0.1:*", keys=keys, name="a", peers={endpoint: "b"}
            ) as a:
                a.add_route("echo", endpoint)
                a.tell("echo", Ping(1))  # accepted (queued); the handshake fails, so it never leaves
                assert not await impostor.poll(500)
        finally:
            impostor.close(linger=0)
            context.term()

    run_bounded(main)


# --- an authenticated peer's flood ------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


FLOOD_SMALL = 200_000
FLOOD_BIG = 20
BIG_BYTES = 1 << 20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="measures RSS through /proc")
def test_a_flood_of_junk_leaves_memory_and_the_log_bounded(private_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    keys = RunKeys.generate(private_dir / "keys", ["a", "b"])
    codec = Codec(registry())
    junk: list[list[bytes]] = [
        [b"tell", b"\xc1 not msgpack"],
        [b"ask", b"\x94\x01"],  # truncated
        [b"shout", b"x"],
        [b"one frame"],
    ]
    big = [b"tell", b"\xc1" + bytes(BIG_BYTES - 1)]  # under the frame limit: decoded, refused
    results: dict[str, float] = {}

    async def flood(raw: zmq.asyncio.Socket, system: ZmqActorSystem, small: int, bigs: int) -> None:
        sync: zmq.Socket[bytes] = zmq.Socket.shadow(raw.underlying)
        target = system.rejected + small + bigs
        for index in range(small + bigs):
            frames = junk[index % len(junk)] if index < small else big
            while True:
                try:
                    sync.send_multipart(frames, zmq.NOBLOCK)
                    break
                except zmq.Again:
                    await asyncio.sleep(0.001)  # the receiver pushes back: let it work
        deadline = time.monotonic() + 60.0
        while system.rejected < target:
            assert time.monotonic() < deadline, f"{system.rejected} of {target} rejected"
            await asyncio.sleep(0.01)

    async def main() -> None:
        async with ZmqActorSystem(codec, bind="tcp://127.0.0.1:*", keys=keys, name="a") as system:
            echo = Echo(system, "echo")
            echo.start()
            context = zmq.asyncio.Context()

            def as_b(s: zmq.asyncio.Socket) -> None:
                keys.as_process("b").make_client(s, "a")
                s.setsockopt(zmq.ROUTING_ID, b"b")

            raw = _raw_dealer(context, as_b)
            raw.connect(system.endpoint)
            try:
                await flood(raw, system, 50_000, 5)  # warm-up: queues and allocator pools at their size
                before = _rss_bytes()
                started = time.perf_counter()
                await flood(raw, system, FLOOD_SMALL, FLOOD_BIG)
                results["flood_s"] = time.perf_counter() - started
                results["growth"] = _rss_bytes() - before
                events = len(system.events)
                # Over the frame limit: libzmq drops the connection before allocating; nothing is rejected.
                rejected = system.rejected
                await raw.send_multipart([b"tell", bytes(codec.max_frame_bytes + 2048)])
                await asyncio.sleep(0.3)
                assert system.rejected == rejected
                # The actor still hears a process of the run (here the flooder, reconnected; a tell it had queued
                # behind the long frame may be lost with the connection: tell until one arrives).
                for seq in range(1, 6):
                    tell = codec.encode_envelope(Envelope("main", "echo", seq, Ping(seq)))
                    await raw.send_multipart([b"tell", tell])
                    try:
                        await until(lambda: bool(echo.seen), 1.0)
                        break
                    except AssertionError:
                        continue
            finally:
                raw.close(linger=0)
                context.term()
            assert echo.seen and all(isinstance(msg, Ping) for msg in echo.seen)
            assert system.rejected == 50_005 + FLOOD_SMALL + FLOOD_BIG
            results["events"] = events

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run_bounded(main, limit_s=120.0)
    print(f"flood of {FLOOD_SMALL:,} + {FLOOD_BIG} x {BIG_BYTES:,} B junk frames: {results['flood_s']:.2f} s, "
          f"RSS growth {results['growth'] / 1e6:.1f} MB, {len(caplog.records)} log records")  # fmt: skip
    assert results["growth"] < 40e6
    # 100 one by one, a summary per power of ten (1,000 ... 100,000), a few per 10 s, one at close
    rejections = [r for r in caplog.records if "rejected a frame" in r.getMessage()]
    assert 100 + 3 <= len(rejections) <= 100 + 3 + 2 + 12
    assert "250,025 " in rejections[-1].getMessage()  # the count in all, at close at the latest
    assert results["events"] < 150  # the transport's records of it: the first 100 and 3 summaries, + the actor's


def test_a_frame_of_exactly_the_limit_crosses_curve(private_dir: Path) -> None:
    keys = RunKeys.generate(private_dir / "keys", ["a", "b"])
    limit = 1 << 16

    def codec() -> Codec:
        return Codec(registry(), max_frame_bytes=limit)

    sizing = codec()
    pad = "x" * (limit - 100)
    while len(sizing.encode_envelope(Envelope("main", "echo", 1, Blob(pad)))) < limit:
        pad += "x"
    blob = Blob(pad)
    assert len(sizing.encode_envelope(Envelope("main", "echo", 1, blob))) == limit

    async def main() -> None:
        async with (
            ZmqActorSystem(codec(), bind="tcp://127.0.0.1:*", keys=keys, name="a") as a,
            ZmqActorSystem(codec(), bind="tcp://127.0.0.1:*", keys=keys, name="b") as b,
        ):
            echo = Echo(b, "echo")
            echo.start()
            a.add_route("echo", b.endpoint, "b")
            a.tell("echo", blob)
            await until(lambda: echo.seen == [blob])

    run_bounded(main)


# --- bounded logging -------------------------------------------------------------------------------------


def test_bounded_log_logs_the_first_then_powers_of_ten_and_every_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    logger = logging.getLogger("dualpath_emu.tests.bounded")
    bounded = BoundedLog(logger, "rejected", first=3, interval_s=10.0, detail_chars=20, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger=logger.name):
        recorded = [bounded.note(f"frame {i}") for i in range(1, 12)]  # 11 in all
        now[0] = 10.0
        assert bounded.note("frame 12") is None  # a time-based summary: logged, not recorded
        for i in range(13, 101):
            bounded.note(f"frame {i}")
        assert bounded.note("y" * 50) is None
        bounded.flush()
        bounded.flush()  # nothing new: no line
    assert recorded[:3] == ["frame 1", "frame 2", "frame 3"]
    assert recorded[9] is not None and recorded[9].startswith("10 so far, the first 3 logged one by one")
    assert [r for i, r in enumerate(recorded) if i not in (0, 1, 2, 9)] == [None] * 7
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:3] == ["rejected: frame 1", "rejected: frame 2", "rejected: frame 3"]
    assert lines[3] == "rejected: 10 so far, the first 3 logged one by one; the latest: frame 10"
    assert lines[4] == "rejected: 12 so far, the first 3 logged one by one; the latest: frame 12"
    assert lines[5] == "rejected: 100 so far, the first 3 logged one by one; the latest: frame 100"
    assert lines[6] == "rejected: 101 in all, the first 3 logged one by one"
    assert len(lines) == 7 and bounded.count == 101
