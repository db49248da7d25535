"""`make bench`, actor runtime: message rates of the actor runtime, in process and over ZeroMQ, and the data plane's
request rate and lags (docs/performance.md has the numbers).

``python -m dualpath_emu.bench_runtime`` (``--help`` for the counts) prints ``BENCH <name> <value> <unit>`` lines;
rates are messages per wall second, every run checks that each message arrived exactly once and in order, and a
failure prints ``bench_runtime: error: ...`` and exits 1. ``actor_inproc_msgs_per_s`` (and
``actor_inproc_tell_events_per_msg``): tells to a ``counter`` actor of the same process in bursts, best of
``--repeats``; ``zmq_ipc_msgs_per_s``: ~100-byte envelopes over ``ipc://`` to a child process (``--serve``), and
``zmq_ipc_one_process_msgs_per_s`` with both systems on one loop; the data plane at time scale 1, a child
(``--serve-dataplane``) serving :data:`DATAPLANE_PORTS` fast ports: ``dataplane_requests_per_s``, its delivery lags
under load and light, its submission lag, and the clock handshake's round trip over ipc and tcp with CURVE."""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

from dualpath_emu._core import Core
from dualpath_emu.messages import Codec, Envelope, Message, MessageRegistry
from dualpath_emu.runtime.actors import MAIN, Actor, ActorSystem
from dualpath_emu.runtime.core_work import Completion
from dualpath_emu.runtime.zmq_transport import ZmqActorSystem
from dualpath_emu.runtime.dataplane.remote import RemoteDataPlane, run_remote
from dualpath_emu.runtime.dataplane.service import DataPlaneService, ServiceCore
from dualpath_emu.runtime.security import RunKeys

__all__ = [
    "BenchError", "Result", "Tally", "DataPlaneResult", "bench_dataplane", "bench_dataplane_handshake",
    "bench_inproc_tells", "bench_zmq_one_process", "bench_zmq_two_processes", "check_tally", "main"
]  # fmt: skip

ENVELOPE_BYTES: Final = 100  # The encoded envelope size the ZeroMQ benchmark aims its pad at.

YIELD_EVERY: Final = 1_000  # The ZeroMQ sender yields to the loop after this many tells.

READY_TIMEOUT_S: Final = 30.0  # How long the parent waits for the child's counter to answer before giving up.

TALLY_TIMEOUT_S: Final = 120.0
"""The bound on the wait for the final tally (every message must have been handled by then)."""

CHILD_LIFETIME_S: Final = 300.0
"""A serving child exits on its own after this long, should its parent vanish without stopping it."""

COUNTER: Final = "counter"
COLLECTOR: Final = "collector"

DATAPLANE_PORTS: Final = 16  # Ports of the data-plane benchmark's core (1 TB/s each): its transfers take nanoseconds.
DATAPLANE_REQUESTER: Final = "bench"


@dataclass(frozen=True, slots=True)
class Tick(Message):
    """One message of the stream: its position and a pad (empty in process)."""

    WIRE_NAME: ClassVar[str] = "bench.Tick"
    VERSION: ClassVar[int] = 1

    seq: int
    pad: bytes


@dataclass(frozen=True, slots=True)
class Query(Message):
    """Asks the counter to tell its :class:`Tally` to the query's sender."""

    WIRE_NAME: ClassVar[str] = "bench.Query"
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class Stop(Message):
    """Asks a serving child to tell its :class:`Tally` to the sender, then exit."""

    WIRE_NAME: ClassVar[str] = "bench.Stop"
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class Tally(Message):
    """What arrived: how many, the sum of their seqs, and how many came out of order (seq != position)."""

    WIRE_NAME: ClassVar[str] = "bench.Tally"
    VERSION: ClassVar[int] = 1

    count: int
    seq_sum: int
    out_of_order: int


def codec() -> Codec:
    """A codec for the benchmark's messages."""
    registry = MessageRegistry()
    for cls in (Tick, Query, Stop, Tally):
        registry.register(cls)
    return Codec(registry)


class Counter(Actor):
    """Counts ticks (expecting seqs 0, 1, 2, … in order) and tells its tally to whoever queries it."""

    def __init__(self, system: ActorSystem, name: str) -> None:
        super().__init__(system, name)
        self.count = 0
        self.seq_sum = 0
        self.out_of_order = 0
        self.stop_requested = asyncio.Event()

    def receive(self, now_ns: int, msg: Message, sender: str) -> None:
        if type(msg) is Tick:
            if msg.seq != self.count:
                self.out_of_order += 1
            self.count += 1
            self.seq_sum += msg.seq
            return
        self.system.tell(sender, Tally(self.count, self.seq_sum, self.out_of_order), sender=self.name)
        if isinstance(msg, Stop):  # exit a moment later, so the tally leaves the socket before it closes
            asyncio.get_running_loop().call_later(0.2, self.stop_requested.set)


class Collector(Actor):
    """Keeps the tallies it is told, in order, for the driver to await (:meth:`next_tally`)."""

    def __init__(self, system: ActorSystem, name: str = COLLECTOR) -> None:
        super().__init__(system, name)
        self.tallies: asyncio.Queue[Message] = asyncio.Queue()

    def receive(self, now_ns: int, msg: Message, sender: str) -> None:
        self.tallies.put_nowait(msg)

    async def next_tally(self, timeout_s: float, child: Child | None = None) -> Message:
        """The next tally told; while waiting, fail at once (not after ``timeout_s``) if the child exits."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return await asyncio.wait_for(self.tallies.get(), min(0.2, max(deadline - time.monotonic(), 0.0)))
            except TimeoutError:
                if child is not None:
                    child.check_alive()
                if time.monotonic() >= deadline:
                    raise


class BenchError(RuntimeError):
    """A benchmark run failed or found messages lost, duplicated or reordered."""


@dataclass(frozen=True)
class Result:
    """One timed run: ``messages`` messages in ``wall_s`` seconds."""

    messages: int
    wall_s: float
    events: int = 0  # Events the sending system recorded in the run (in process: all of them).
    envelope_bytes: int = 0  # The encoded envelope size of one message (ZeroMQ runs only).

    @property
    def rate(self) -> float:
        """Messages per second."""
        return self.messages / self.wall_s


def check_tally(tally: Message | None, count: int, what: str) -> Tally:
    """``tally`` if it shows ``count`` messages with seqs 0 … count-1, each once and in order."""
    if not isinstance(tally, Tally):
        raise BenchError(f"{what}: expected a Tally, got {tally!r}")
    expected = Tally(count, count * (count - 1) // 2, 0)
    if tally != expected:
        raise BenchError(
            f"{what}: {tally.count} messages arrived (expected {count}), seq sum {tally.seq_sum} "
            f"(expected {expected.seq_sum}), {tally.out_of_order} out of order"
        )
    return tally


def best_of(repeats: int, bench: Callable[[], Result]) -> Result:
    """The fastest of ``repeats`` runs of ``bench``."""
    return min((bench() for _ in range(max(repeats, 1))), key=lambda result: result.wall_s)


def bench_inproc_tells(count: int = 200_000, burst: int = 100) -> Result:
    """One run of the in-process tell benchmark (see the module docstring)."""
    system = ActorSystem()
    counter = Counter(system, COUNTER)
    collector = Collector(system)

    async def drive() -> Message:
        counter.start()
        collector.start()
        tell = system.tell
        for start in range(0, count, burst):
            for seq in range(start, min(start + burst, count)):
                tell(COUNTER, Tick(seq, b""))
            await asyncio.sleep(0)
        tell(COUNTER, Query(), sender=COLLECTOR)
        return await collector.next_tally(TALLY_TIMEOUT_S)

    gc.collect()  # start clean: an earlier run's garbage is not this run's cost
    start = time.perf_counter()
    tally = asyncio.run(system.run(drive()))
    wall_s = time.perf_counter() - start
    check_tally(tally, count, "in-process tells")
    return Result(count, wall_s, events=system.event_count)


def tick_pad(count: int, envelope_bytes: int = ENVELOPE_BYTES) -> bytes:
    """A pad that makes the envelope of a tick from the middle of a run ``envelope_bytes`` long."""
    bare = len(codec().encode_envelope(Envelope(MAIN, COUNTER, count // 2, Tick(count // 2, b""))))
    return b"x" * max(envelope_bytes - bare, 0)  # an empty and a short bin header are both 2 bytes


def envelope_size(count: int, pad: bytes) -> int:
    """The encoded size of the envelope of a tick from the middle of a run."""
    return len(codec().encode_envelope(Envelope(MAIN, COUNTER, count // 2, Tick(count // 2, pad))))


@dataclass(frozen=True)
class Child:
    """The serving child process, and the file its output goes to (for error messages)."""

    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        """The tail of the child's output, as the end of an error message ("" if there is none)."""
        try:
            text = self.log.read_text(errors="replace").strip()
        except OSError:
            return ""
        return f"; its output ends:\n{text[-2000:]}" if text else ""

    def check_alive(self) -> None:
        """Raise :class:`BenchError` if the child has exited."""
        if self.process.poll() is not None:
            raise BenchError(f"the serving child exited with status {self.process.returncode}{self.output()}")


async def wait_ready(system: ZmqActorSystem, collector: Collector, child: Child | None) -> None:
    """Query the counter until it tells its tally; fail if the child exits meanwhile."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        system.tell(COUNTER, Query(), sender=COLLECTOR)
        try:
            tally = await collector.next_tally(0.25, child)
        except TimeoutError:
            if time.monotonic() > deadline:
                output = child.output() if child is not None else ""
                raise BenchError(f"the counter did not answer within {READY_TIMEOUT_S} s{output}") from None
            continue
        check_tally(tally, 0, "the counter before the run")
        while not collector.tallies.empty():  # the answers to earlier queries that came late
            check_tally(collector.tallies.get_nowait(), 0, "the counter before the run")
        return


async def send_ticks(
    system: ZmqActorSystem, collector: Collector, count: int, pad: bytes, child: Child | None
) -> Tally:
    """Tell ``count`` ticks to the counter, then a query, and check the tally it tells."""
    tell = system.tell
    for seq in range(count):
        tell(COUNTER, Tick(seq, pad))
        if seq % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)
    tell(COUNTER, Query(), sender=COLLECTOR)
    deadline = time.monotonic() + TALLY_TIMEOUT_S
    while True:
        try:
            tally = await collector.next_tally(max(0.0, deadline - time.monotonic()), child)
        except TimeoutError:
            raise BenchError(f"the counter did not tell its tally within {TALLY_TIMEOUT_S} s") from None
        # A readiness query answered late (wait_ready sends one every 0.25 s until the first answer) was handled
        # before any tick, as the socket keeps order: its tally counts none. Under load it can come after the
        # drain there; the answer to this query counts the ticks.
        if not (count and isinstance(tally, Tally) and tally.count == 0):
            return check_tally(tally, count, "ZeroMQ tells")


def bench_zmq_two_processes(
    count: int = 200_000, envelope_bytes: int = ENVELOPE_BYTES, *, serve_endpoint: str | None = None
) -> Result:
    """One run of the two-process ZeroMQ benchmark (see the module docstring).

    The child binds ``serve_endpoint`` (default: ``ipc://`` in a new temporary directory)."""
    pad = tick_pad(count, envelope_bytes)
    directory = Path(tempfile.mkdtemp(prefix="dpb"))  # short: ipc:// paths are limited to ~107 bytes
    endpoint = serve_endpoint if serve_endpoint is not None else f"ipc://{directory}/counter"
    driver = f"ipc://{directory}/driver"
    child: Child | None = None
    try:
        child = _spawn_child(["--serve", endpoint, "--reply-to", driver], directory / "child.log")

        async def drive(child: Child) -> float:
            async with ZmqActorSystem(codec(), bind=driver, address_book={COUNTER: endpoint}) as system:
                collector = Collector(system)
                collector.start()
                await wait_ready(system, collector, child)
                start = time.perf_counter()
                await send_ticks(system, collector, count, pad, child)
                wall_s = time.perf_counter() - start
                system.tell(COUNTER, Stop(), sender=COLLECTOR)
                try:
                    final = await collector.next_tally(10.0, child)
                except TimeoutError:
                    raise BenchError(f"the serving child did not answer Stop{child.output()}") from None
                check_tally(final, count, "the child's final tally")
                return wall_s

        wall_s = asyncio.run(drive(child))
        _finish_child(child, "serving child", "Stop")
        return Result(count, wall_s, envelope_bytes=envelope_size(count, pad))
    finally:
        if child is not None:
            stop_child(child.process)
        shutil.rmtree(directory, ignore_errors=True)


def bench_zmq_one_process(count: int = 200_000, envelope_bytes: int = ENVELOPE_BYTES) -> Result:
    """One run of the one-process ZeroMQ benchmark (see the module docstring)."""
    pad = tick_pad(count, envelope_bytes)
    directory = Path(tempfile.mkdtemp(prefix="dpb"))
    try:

        async def drive() -> float:
            driver = f"ipc://{directory}/driver"
            async with ZmqActorSystem(
                codec(), bind=f"ipc://{directory}/counter", address_book={COLLECTOR: driver}
            ) as host:
                Counter(host, COUNTER).start()
                async with ZmqActorSystem(codec(), bind=driver, address_book={COUNTER: host.endpoint}) as system:
                    collector = Collector(system)
                    collector.start()
                    await wait_ready(system, collector, None)
                    start = time.perf_counter()
                    await send_ticks(system, collector, count, pad, None)
                    return time.perf_counter() - start

        wall_s = asyncio.run(drive())
        return Result(count, wall_s, envelope_bytes=envelope_size(count, pad))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def stop_child(child: subprocess.Popen[bytes]) -> None:
    """Make sure ``child`` has exited: terminate it, then kill it if it lingers; reap it either way."""
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


async def serve(endpoint: str, reply_to: str, lifetime_s: float) -> None:
    """The child's side: host the counter at ``endpoint`` until told to stop or ``lifetime_s`` passes."""
    async with ZmqActorSystem(codec(), bind=endpoint, address_book={COLLECTOR: reply_to}) as system:
        counter = Counter(system, COUNTER)
        counter.start()
        await asyncio.wait_for(counter.stop_requested.wait(), lifetime_s)


@dataclass(frozen=True)
class DataPlaneResult:
    """One data-plane run: ``requests`` in ``wall_s`` (``cpu_s`` of this process), the lags and the RTT."""

    requests: int
    wall_s: float
    cpu_s: float
    delivery_lag_ns: dict[str, int | float]
    submission_lag_ns: dict[str, int | float]
    rtt_ns: int

    @property
    def rate(self) -> float:
        return self.requests / self.wall_s


def serve_dataplane(endpoint: str, lifetime_s: float, keys_dir: Path | None = None) -> None:
    """The child's side: a data-plane service until its requester says bye (or ``lifetime_s`` passes)."""
    core = Core(clock="wall", time_scale=1.0)
    for i in range(DATAPLANE_PORTS):
        core.add_port(f"p{i}", 1e12)
    plane = ServiceCore(core)
    loop = plane.new_loop()
    keys = RunKeys.load(keys_dir, "dataplane") if keys_dir is not None else None
    service = DataPlaneService(plane, bind=endpoint, requesters=[DATAPLANE_REQUESTER], keys=keys)
    try:
        loop.run_until_complete(asyncio.wait_for(service.serve(), lifetime_s))
    finally:
        loop.close()


def _spawn_child(args: list[str], log: Path) -> Child:
    """``python -m dualpath_emu.bench_runtime ARGS``, its output into ``log``."""
    with log.open("wb") as log_file:
        process = subprocess.Popen([sys.executable, "-m", "dualpath_emu.bench_runtime", *args],
                                   stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)  # fmt: skip
    return Child(process, log)


def _dataplane_child(endpoint: str, directory: Path, keys_dir: Path | None = None) -> Child:
    keys = ["--keys", str(keys_dir)] if keys_dir is not None else []
    return _spawn_child(["--serve-dataplane", endpoint, *keys], directory / "dataplane.log")


def _finish_child(child: Child, what: str = "data-plane child", after: str = "bye") -> None:
    try:
        status = child.process.wait(timeout=10.0)
    except subprocess.TimeoutExpired:
        raise BenchError(f"the {what} did not exit after {after}{child.output()}") from None
    if status != 0:
        raise BenchError(f"the {what} exited with status {status}{child.output()}")


def bench_dataplane(requests: int = 200_000, batch: int = 100, window: int = 2_000) -> DataPlaneResult:
    """One run of the data-plane benchmark over ipc:// (see the module docstring)."""
    directory = Path(tempfile.mkdtemp(prefix="dpb"))
    endpoint = f"ipc://{directory}/dataplane"
    child: Child | None = None
    try:
        child = _dataplane_child(endpoint, directory)
        try:
            plane = RemoteDataPlane(endpoint, DATAPLANE_REQUESTER, connect_timeout_s=READY_TIMEOUT_S)
        except Exception as error:
            raise BenchError(f"could not connect to the data plane: {error}{child.output()}") from None
        ports = [plane.layout.port_id(f"p{i}") for i in range(DATAPLANE_PORTS)]

        async def drive() -> tuple[float, float, dict[str, Any]]:
            futures: deque[asyncio.Future[Completion]] = deque()
            transfer = plane.transfer
            gc.collect()
            start, cpu = time.perf_counter(), time.process_time()
            for first in range(0, requests, batch):
                for i in range(first, min(first + batch, requests)):
                    futures.append(transfer((ports[i % DATAPLANE_PORTS],), 0, 1_000))
                await asyncio.sleep(0)  # the loop sends this iteration's batch as one message
                while len(futures) > window:
                    await futures.popleft()
            while futures:
                await futures.popleft()
            wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
            stats = await plane.stats()
            if not await plane.say_bye():
                raise BenchError("the data plane did not answer bye")
            return wall_s, cpu_s, stats

        wall_s, cpu_s, stats = run_remote(drive(), plane)
        _finish_child(child)
        if stats["counters"]["requests"] != requests or stats["counters"]["completions"] != requests:
            raise BenchError(f"the data plane saw {stats['counters']} for {requests} requests")
        report = plane.report()
        return DataPlaneResult(
            requests, wall_s, cpu_s, report["delivery_lag_ns"], stats["submission_lag_ns"], report["rtt_ns"]
        )
    finally:
        if child is not None:
            stop_child(child.process)
        shutil.rmtree(directory, ignore_errors=True)


def bench_dataplane_handshake() -> int:
    """The clock handshake's best round trip (ns) to an idle data plane over tcp:// loopback, with CURVE keys."""
    directory = Path(tempfile.mkdtemp(prefix="dpb"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    child: Child | None = None
    try:
        keys_dir = directory / "keys"
        RunKeys.generate(keys_dir, ["dataplane", DATAPLANE_REQUESTER])
        child = _dataplane_child(endpoint, directory, keys_dir)
        plane = RemoteDataPlane(
            endpoint, DATAPLANE_REQUESTER, keys=RunKeys.load(keys_dir, DATAPLANE_REQUESTER),
            connect_timeout_s=READY_TIMEOUT_S,
        )  # fmt: skip

        async def bye() -> None:
            await plane.say_bye()

        run_remote(bye(), plane)
        _finish_child(child)
        rtt_ns: int = plane.sync.rtt_ns
        return rtt_ns
    finally:
        if child is not None:
            stop_child(child.process)
        shutil.rmtree(directory, ignore_errors=True)


def report(name: str, result: Result, unit: str = "msgs/s", note: str = "") -> None:
    print(f"BENCH {name} {result.rate:.0f} {unit}{note}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dualpath_emu.bench_runtime", description=__doc__.split("\n")[0])
    parser.add_argument("--tells", type=int, default=200_000, help="in-process tells per run")
    parser.add_argument("--burst", type=int, default=100, help="in-process tells between two yields to the loop")
    parser.add_argument("--repeats", type=int, default=3, help="in-process runs; the best is reported")
    parser.add_argument("--zmq", type=int, default=200_000, help="ZeroMQ tells per run (0 skips them)")
    parser.add_argument("--zmq-repeats", type=int, default=1, help="ZeroMQ runs; the best is reported")
    parser.add_argument("--dataplane", type=int, default=200_000, help="data-plane requests (0 skips them)")
    parser.add_argument("--dataplane-batch", type=int, default=100, help="data-plane requests per loop iteration")
    parser.add_argument("--dataplane-window", type=int, default=2_000, help="data-plane requests in flight at most")
    parser.add_argument("--serve", metavar="ENDPOINT", help="(internal) serve the counter at ENDPOINT")
    parser.add_argument("--reply-to", metavar="ENDPOINT", default="", help="(internal) the collector's endpoint")
    parser.add_argument("--serve-dataplane", metavar="ENDPOINT", help="(internal) serve a data plane at ENDPOINT")
    parser.add_argument("--keys", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--lifetime-s", type=float, default=CHILD_LIFETIME_S, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if (
        min(args.tells, args.burst, args.repeats, args.zmq_repeats, args.dataplane_batch) < 1
        or min(args.zmq, args.dataplane) < 0
        or args.dataplane_window < args.dataplane_batch
    ):
        parser.error("the counts must be at least 1 (--zmq and --dataplane at least 0, the window at least a batch)")
    try:
        if args.serve is not None:
            asyncio.run(serve(args.serve, args.reply_to, args.lifetime_s))
            return 0
        if args.serve_dataplane is not None:
            serve_dataplane(args.serve_dataplane, args.lifetime_s, args.keys)
            return 0
        tells = best_of(args.repeats, lambda: bench_inproc_tells(args.tells, args.burst))
        print(f"in-process tells: {tells.messages} in {tells.wall_s:.3f} s wall (best of {args.repeats})")
        report("actor_inproc_msgs_per_s", tells)
        print(f"BENCH actor_inproc_tell_events_per_msg {tells.events / tells.messages:.2f} events")
        if args.zmq > 0:
            two = best_of(args.zmq_repeats, lambda: bench_zmq_two_processes(args.zmq))
            print(f"ZeroMQ ipc, two processes: {two.messages} in {two.wall_s:.3f} s wall")
            report("zmq_ipc_msgs_per_s", two, note=f" ({two.envelope_bytes} B/msg)")
            one = best_of(args.zmq_repeats, lambda: bench_zmq_one_process(args.zmq))
            print(f"ZeroMQ ipc, one process: {one.messages} in {one.wall_s:.3f} s wall")
            report("zmq_ipc_one_process_msgs_per_s", one, note=f" ({one.envelope_bytes} B/msg)")
        if args.dataplane > 0:
            plane = bench_dataplane(args.dataplane, args.dataplane_batch, args.dataplane_window)
            print(
                f"data plane over ipc: {plane.requests} transfers in {plane.wall_s:.3f} s wall, {plane.cpu_s:.3f} s CPU "
                f"in the requesting process ({args.dataplane_batch} per batch, at most {args.dataplane_window} in flight)"
            )
            print(f"BENCH dataplane_requests_per_s {plane.rate:.0f} req/s")
            print(f"BENCH dataplane_delivery_lag_p50_us {plane.delivery_lag_ns['p50_ns'] / 1e3:.0f} us")
            print(f"BENCH dataplane_delivery_lag_p99_us {plane.delivery_lag_ns['p99_ns'] / 1e3:.0f} us")
            print(f"BENCH dataplane_submission_lag_p99_us {plane.submission_lag_ns['p99_ns'] / 1e3:.0f} us")
            print(f"BENCH dataplane_ipc_handshake_rtt_us {plane.rtt_ns / 1e3:.0f} us")
            light = bench_dataplane(max(args.dataplane // 10, 10), 10, 10)
            print(f"data plane over ipc, lightly loaded: {light.requests} transfers, {light.rate:.0f} req/s")
            print(f"BENCH dataplane_light_delivery_lag_p99_us {light.delivery_lag_ns['p99_ns'] / 1e3:.0f} us")
            tcp_rtt_ns = bench_dataplane_handshake()
            print(f"BENCH dataplane_tcp_handshake_rtt_us {tcp_rtt_ns / 1e3:.0f} us", flush=True)
    except BenchError as error:
        print(f"bench_runtime: error: {error}", file=sys.stderr, flush=True)
        return 1
    except Exception as error:  # a fault of the benchmark or the runtime: say so, with the traceback
        traceback.print_exc()
        print(f"bench_runtime: error: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
