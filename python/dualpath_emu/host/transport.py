"""Real bytes between the processes of a host-backend run: :class:`ByteChannel`, over ZeroMQ.

Each process binds one ROUTER for KV bytes (apart from the actors' transport, so bulk data never queues in front of
their messages) and connects a DEALER to each peer. A transfer is a job of pattern-byte chunks the receiver checks:
a push completes at the source when its last chunk is acked, a pull at the destination when it arrives; the
``send`` hook paces chunks and the ``admit`` hook lets a port's chunks in. The frames: docs/wire.md ("The host
backend's byte channel"). Security as for the actors' transport; a frame that fails its checks is dropped and
counted (``rejected``)."""

from __future__ import annotations

import asyncio
import logging
import time
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import zmq
import zmq.asyncio

from dualpath_emu.errors import SecurityError
from dualpath_emu.runtime.dataplane.protocol import DataPlaneError
from dualpath_emu.runtime.security import RunKeys, check_private_ipc, start_authenticator

__all__ = ["ENGINES", "ByteChannel", "ChannelError", "ChannelStats", "PATTERN_BYTES", "pattern_region", "pattern_slice"]

ENGINES: Final = ("zmq", "mooncake")
"""What carries the bytes: ZeroMQ frames (default) or Mooncake's Transfer Engine (:mod:`dualpath_emu.host.mooncake`)."""

_log = logging.getLogger(__name__)

HWM: Final = 1024  # Messages a socket queues per peer each way (then a sender waits).
CLOSE_LINGER_MS: Final = 2000  # How long a closing channel keeps trying to deliver what it posted last.
PATTERN_BYTES: Final = 1 << 20  # The length of the byte pattern chunks are cut from (a chunk is at most this long).
_PATTERN: Final = bytes((i * 131 + (i >> 8) * 7 + 17) & 0xFF for i in range(2 * PATTERN_BYTES))


def pattern_start(job: int, offset: int) -> int:
    """Where in the pattern region the bytes a job carries at ``offset`` begin."""
    return (job * 4099 + offset) % PATTERN_BYTES


def pattern_slice(job: int, offset: int, nbytes: int) -> memoryview:
    """The bytes a job carries at ``offset``: deterministic, different for neighbouring jobs and offsets."""
    start = pattern_start(job, offset)
    return memoryview(_PATTERN)[start : start + nbytes]


def pattern_region() -> bytes:
    """The whole pattern region (twice :data:`PATTERN_BYTES`: any chunk is one slice of it)."""
    return _PATTERN


class ChannelError(DataPlaneError):
    """The byte channel cannot work (its endpoint cannot be bound, say)."""


@dataclass
class ChannelStats:
    """What a channel moved: bytes sent, received, verified and mismatched; frames rejected."""

    sent_bytes: int = 0
    received_bytes: int = 0
    verified_bytes: int = 0
    mismatched_bytes: int = 0
    rejected: int = 0
    jobs_sent: int = 0
    jobs_received: int = 0

    def to_wire(self) -> dict[str, int]:
        return dict(self.__dict__)


_Outgoing = tuple[int, int, int, bool, bool, tuple[int, int] | tuple[()]]
"""Mooncake: a chunk to write, ``(job, offset, nbytes, last, ack, (rx, lane) or ())``."""


@dataclass
class _Inbound:
    received: int = 0
    mismatched: int = 0


@dataclass
class ByteChannel:
    """This process's end of the host run's byte network (``name``, its ``bind`` endpoint, ``peers``' endpoints).
    ``send(dest, job, nbytes, lane, ack, port)`` paces a job's chunks through :meth:`send_chunk`; ``admit(rx, lane,
    nbytes, then)`` is offered each arriving chunk of a job naming its port ``rx``: False lets it in, True keeps it
    until ``then()``."""

    name: str
    bind: str
    peers: Mapping[str, str]
    keys: RunKeys | None = None
    send: Callable[[str, int, int, int, bool, int], None] | None = None
    admit: Callable[[int, int, int, Callable[[], None] | None], bool] | None = None
    stats: ChannelStats = field(default_factory=ChannelStats)
    _context: zmq.asyncio.Context | None = None
    _router: zmq.asyncio.Socket | None = None
    _dealers: dict[str, zmq.asyncio.Socket] = field(default_factory=dict)
    _inbound: dict[tuple[str, int, bool], _Inbound] = field(default_factory=dict)
    """Jobs arriving, by (sender, job, ack): a push's job is numbered by its sender, a pull's by us."""
    _outbound: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    """Our pushes, by job: done when acknowledged."""
    _pulls: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    """Our pulls, by job: done when their last chunk arrived."""
    _via: dict[int, tuple[int, int]] = field(default_factory=dict)
    """The receiving port and lane of our pushes and pulls that name one (``rx``), by job."""
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _next_job: int = 1
    _authenticator: Any = None
    engine: str = "zmq"
    """``"zmq"``: chunks in the channel's frames; ``"mooncake"``: by Mooncake's Transfer Engine."""
    _wire: Any = None
    _targets: dict[str, asyncio.Future[tuple[str, int]]] = field(default_factory=dict)
    """Mooncake: each peer's engine and the address of our slot in its receive region."""
    _slots: dict[str, int] = field(default_factory=dict)
    """Mooncake: the slot of our receive region each sending peer writes to."""
    _outgoing: dict[str, asyncio.Queue[_Outgoing]] = field(default_factory=dict)
    _executor: Any = None
    on_stop: Callable[[str], None] | None = None
    """Called with the reason when a peer says the run is complete (``stop``)."""
    on_port: Callable[[str, int, float], None] | None = None
    """Called with ``("factor" | "latency", port, value)`` when a peer's fault changed a port."""
    on_pool: Callable[[int, list[int]], None] | None = None
    """Called with ``(node, flat (context, first, blocks) triples)`` when a peer's engine reads our node's pool."""
    last_activity_s: float = field(default_factory=time.perf_counter)
    """When a frame last arrived (perf_counter seconds)."""

    async def open(self) -> None:
        """Bind the ROUTER and start receiving (on the running loop)."""
        self._check(self.bind)
        self._context = zmq.asyncio.Context()
        if self.keys is not None:
            self._authenticator = start_authenticator(self._context, self.keys)
        router = self._context.socket(zmq.ROUTER)
        self._tune(router)
        if self.keys is not None:
            self.keys.make_server(router)
        try:
            router.bind(self.bind)
        except zmq.ZMQError as error:
            router.close(linger=0)
            raise ChannelError(f"process {self.name!r}: cannot bind its byte channel at {self.bind}: {error}") from None
        self._router = router
        self._tasks.append(asyncio.get_running_loop().create_task(self._receive(), name="bytes:router"))
        if self.engine == "mooncake":
            from concurrent.futures import ThreadPoolExecutor

            from dualpath_emu.host.mooncake import MooncakeWire

            host = (
                self.bind.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
                if self.bind.startswith("tcp://")
                else "127.0.0.1"
            )
            self._wire = MooncakeWire(host)
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="mooncake")  # one: chunks stay in order

    @property
    def listening(self) -> list[str]:
        """Where this process's Mooncake Transfer Engine listens (``address:port``, read back): none without one."""
        return list(self._wire.listening) if self._wire is not None else []

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        for socket in self._dealers.values():
            socket.close(linger=CLOSE_LINGER_MS)  # what was posted last (a stop, an ack) still goes out
        if self._router is not None:
            self._router.close(linger=0)
        self._dealers.clear()
        self._router = None
        if self._authenticator is not None:
            self._authenticator.stop()
        if self._context is not None:
            self._context.term()
            self._context = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._wire is not None:
            self._wire.close()
        for pending in [*self._outbound.values(), *self._pulls.values()]:
            if not pending.done():
                pending.set_exception(ConnectionError(f"process {self.name!r}: the byte channel closed"))

    # --- jobs --------------------------------------------------------------------------------------------

    def push(self, dest: str, nbytes: int, lane: int, port: int, rx: int = -1) -> Awaitable[None]:
        """Send ``nbytes`` to process ``dest`` through ``port``, done when all are acked (``rx``: their port there)."""
        job = self._new_job()
        done = asyncio.get_running_loop().create_future()
        self._outbound[job] = done
        if rx >= 0:
            self._via[job] = (rx, lane)
        self._hand_over(dest, job, nbytes, lane, True, port)
        return done

    def pull(self, source: str, nbytes: int, lane: int, port: int, rx: int = -1) -> Awaitable[None]:
        """Have process ``source`` send ``nbytes`` here through its ``port``, done when the last arrived."""
        job = self._new_job()
        done = asyncio.get_running_loop().create_future()
        self._pulls[job] = done
        if rx >= 0:
            self._via[job] = (rx, lane)
        self._post(source, [msgpack.packb(["pull", job, nbytes, lane, port])])
        return done

    def send_chunk(self, dest: str, job: int, offset: int, nbytes: int, last: bool, ack: bool) -> None:
        """Send one chunk of a job (called by the pacer, in offset order)."""
        via = self._via.get(job, ()) if ack else ()  # a push's receiving port and lane (a pull's is the puller's)
        if ack and last:
            self._via.pop(job, None)
        if self._wire is not None:
            queue = self._outgoing.get(dest)
            if queue is None:
                queue = self._outgoing[dest] = asyncio.Queue()
                self._tasks.append(asyncio.get_running_loop().create_task(self._write_chunks(dest, queue)))
            queue.put_nowait((job, offset, nbytes, last, ack, via))
        else:
            header = msgpack.packb(["data", job, offset, last, ack, *via])
            self._post(dest, [header, pattern_slice(job, offset, nbytes)])
        self.stats.sent_bytes += nbytes
        if last:
            self.stats.jobs_sent += 1

    async def _write_chunks(self, dest: str, queue: asyncio.Queue[_Outgoing]) -> None:
        """Mooncake: write ``dest``'s chunks into its region, one after another, each followed by its header."""
        from dualpath_emu.host.mooncake import SLOT_BYTES

        target, base = await self._target(dest)
        loop = asyncio.get_running_loop()
        cursor = 0
        while True:
            job, offset, nbytes, last, ack, via = await queue.get()
            if cursor + nbytes > SLOT_BYTES:
                cursor = 0  # round the ring
            await loop.run_in_executor(
                self._executor, self._wire.write, target, base + cursor, pattern_start(job, offset), nbytes
            )
            self._post(dest, [msgpack.packb(["data", job, offset, last, ack, cursor, nbytes, *via])])
            cursor += nbytes

    def _target(self, peer: str) -> asyncio.Future[tuple[str, int]]:
        target = self._targets.get(peer)
        if target is None:
            target = self._targets[peer] = asyncio.get_running_loop().create_future()
            self._post(peer, [msgpack.packb(["mc-hello", self._wire.endpoint])])
        return target

    def stop_peers(self, reason: str) -> None:
        """Tell every other process of the run that it is complete (the driver's process, at its end)."""
        for peer in self.peers:
            if peer != self.name:
                self._post(peer, [msgpack.packb(["stop", reason])])

    def tell_peers(self, change: list[Any]) -> None:
        """Send a port's change to every other process, in order with what this process sends them after."""
        for peer in self.peers:
            if peer != self.name:
                self._post(peer, [msgpack.packb(change)])

    def send_pool(self, peer: str, node: int, flat: list[int]) -> None:
        """Tell ``peer`` that an engine here reads these blocks (flat triples) from its node ``node``'s DRAM pool."""
        self._post(peer, [msgpack.packb(["pool", node, flat])])

    def _new_job(self) -> int:
        job, self._next_job = self._next_job, self._next_job + 1
        return job

    def _hand_over(self, dest: str, job: int, nbytes: int, lane: int, ack: bool, port: int) -> None:
        if self.send is None:
            raise RuntimeError("the byte channel has no pacer (send=)")
        self.send(dest, job, nbytes, lane, ack, port)

    # --- sockets -----------------------------------------------------------------------------------------

    def _check(self, endpoint: str) -> None:
        if self.keys is None:
            if endpoint.startswith("tcp://"):
                raise SecurityError(f"{endpoint}: KV bytes over tcp:// need the run's keys (CURVE)")
            if endpoint.startswith("ipc://"):
                check_private_ipc(endpoint)

    @staticmethod
    def _tune(socket: zmq.asyncio.Socket) -> None:
        socket.setsockopt(zmq.SNDHWM, HWM)
        socket.setsockopt(zmq.RCVHWM, HWM)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, PATTERN_BYTES + 4096)

    def _dealer(self, peer: str) -> zmq.asyncio.Socket:
        socket = self._dealers.get(peer)
        if socket is None:
            endpoint = self.peers.get(peer)
            if endpoint is None or self._context is None:
                raise ConnectionError(f"process {self.name!r} has no byte route to {peer!r}")
            self._check(endpoint)
            socket = self._context.socket(zmq.DEALER)
            self._tune(socket)
            socket.setsockopt(zmq.IDENTITY, self.name.encode())
            if self.keys is not None:
                self.keys.make_client(socket, peer)
            socket.connect(endpoint)
            self._dealers[peer] = socket
        return socket

    def _post(self, peer: str, frames: list[Any]) -> None:
        # The asyncio socket sends at once, or, past the HWM, queues the send behind those waiting (in order).
        # Never with NOBLOCK: its Future would hold zmq.Again and the frame be lost, unsaid.
        sent = self._dealer(peer).send_multipart(frames, copy=False)
        typing.cast("asyncio.Future[Any]", sent).add_done_callback(self._sent)

    def _sent(self, future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:  # (cancelled: the socket closed)
            _log.warning("process %r: a byte frame was not sent: %s", self.name, future.exception())

    async def _receive(self) -> None:
        assert self._router is not None
        while True:
            frames = await self._router.recv_multipart(copy=False)
            self.last_activity_s = time.perf_counter()
            try:
                self._on_frames(bytes(frames[0].buffer).decode(), frames[1:])
            except (ValueError, TypeError, KeyError, msgpack.UnpackException) as error:
                self.stats.rejected += 1
                _log.warning("process %r: rejected a byte frame: %s: %s", self.name, type(error).__name__, error)

    def _on_frames(self, peer: str, frames: list[Any]) -> None:
        header = msgpack.unpackb(frames[0].buffer if hasattr(frames[0], "buffer") else frames[0])
        if not isinstance(header, list) or not header or not isinstance(header[0], str):
            raise ValueError("not a [kind, ...] header")
        kind = header[0]
        if kind == "data" and len(header) in (5, 7) and len(frames) == 2:
            _, job, offset, last, ack = header[:5]
            self._on_data(peer, int(job), int(offset), bool(last), bool(ack), frames[1], _via(header[5:]))
        elif kind == "data" and len(header) in (7, 9) and len(frames) == 1 and self._wire is not None:
            from dualpath_emu.host.mooncake import SLOT_BYTES

            _, job, offset, last, ack, cursor, nbytes = header[:7]
            if peer not in self._slots or not 0 <= cursor <= cursor + nbytes <= SLOT_BYTES:
                raise ValueError(f"a chunk from {peer!r} outside its slot")
            data = self._wire.received(self._slots[peer] * SLOT_BYTES + cursor, nbytes)
            self._on_data(peer, int(job), int(offset), bool(last), bool(ack), data, _via(header[7:]))
        elif kind == "stop" and len(header) == 2:
            if self.on_stop is not None:
                self.on_stop(str(header[1]))
        elif kind in ("factor", "latency") and len(header) == 3:
            port, value = header[1], header[2]
            if not isinstance(port, int) or isinstance(port, bool) or not isinstance(value, int | float):
                raise ValueError(f"bad port change {header!r}")
            if self.on_port is not None:
                self.on_port(kind, port, value)
        elif kind == "pool" and len(header) == 3:
            node, flat = header[1], header[2]
            if (not isinstance(node, int) or isinstance(node, bool) or not isinstance(flat, list) or len(flat) % 3
                    or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in flat)):  # fmt: skip
                raise ValueError(f"bad pool read {header!r}")
            if self.on_pool is not None:
                self.on_pool(node, flat)
        elif kind == "mc-hello" and len(header) == 2 and self._wire is not None:
            from dualpath_emu.host.mooncake import SLOT_BYTES, SLOTS

            slot = self._slots.get(peer)
            if slot is None:
                if len(self._slots) >= SLOTS:
                    raise ValueError(f"no Mooncake slot left for {peer!r} (at most {SLOTS} senders)")
                slot = self._slots[peer] = len(self._slots)
            self._post(peer, [msgpack.packb(["mc-slot", self._wire.endpoint, self._wire.receive + slot * SLOT_BYTES])])
        elif kind == "mc-slot" and len(header) == 3 and self._wire is not None:
            target = self._targets.get(peer)
            if target is None or target.done():
                raise ValueError(f"an unasked Mooncake slot from {peer!r}")
            target.set_result((str(header[1]), int(header[2])))
        elif kind == "ack" and len(header) == 4:
            pending = self._outbound.pop(int(header[1]))
            if not pending.done():
                pending.set_result(None)
        elif kind == "pull" and len(header) == 5:
            _, job, nbytes, lane, port = header
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (job, nbytes, lane, port)) or nbytes < 1:
                raise ValueError(f"bad pull {header!r}")
            self._hand_over(peer, job, nbytes, lane, False, port)
        else:
            raise ValueError(f"unknown frame {kind!r} ({len(header)} fields, {len(frames)} frames)")

    def _on_data(
        self, peer: str, job: int, offset: int, last: bool, ack: bool, payload: Any, via: tuple[int, int] | None
    ) -> None:
        if not ack and job not in self._pulls:
            raise ValueError(f"job {job} from {peer!r}: data nobody pulled")
        if not ack:
            via = self._via.get(job)  # a pull of ours: we said which port it comes in through
        data = payload.buffer if hasattr(payload, "buffer") else memoryview(payload)
        nbytes = len(data)
        key = (peer, job, ack)
        inbound = self._inbound.get(key)
        if inbound is None:
            inbound = self._inbound[key] = _Inbound()
        if offset != inbound.received:
            raise ValueError(f"job {job} from {peer!r}: chunk at {offset}, expected {inbound.received}")
        inbound.received += nbytes
        self.stats.received_bytes += nbytes
        if data == pattern_slice(job, offset, nbytes):
            self.stats.verified_bytes += nbytes
        else:
            inbound.mismatched += nbytes
            self.stats.mismatched_bytes += nbytes
        gate = self.admit if via is not None else None
        if not last:
            if gate is not None and via is not None:
                gate(via[0], via[1], nbytes, None)
            return
        del self._inbound[key]
        self.stats.jobs_received += 1
        if not ack:
            self._via.pop(job, None)

        def complete() -> None:
            if ack:
                self._post(peer, [msgpack.packb(["ack", job, inbound.received, inbound.mismatched])])
                return
            pending = self._pulls.pop(job, None)  # a pull of ours, answered
            if pending is not None and not pending.done():
                pending.set_result(None)

        if gate is None or via is None or not gate(via[0], via[1], nbytes, complete):
            complete()


def _via(fields: list[Any]) -> tuple[int, int] | None:
    """A data header's optional ``rx, lane`` (None when absent), checked."""
    if not fields:
        return None
    rx, lane = fields
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rx, lane)) or rx < 0 or not 0 <= lane < 16:
        raise ValueError(f"bad receiving port and lane {fields!r}")
    return rx, lane
