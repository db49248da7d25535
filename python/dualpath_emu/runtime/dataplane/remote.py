"""The data plane of a process without the core: its work runs in the data-plane service, on the service's
clock (see the package, :mod:`dualpath_emu.runtime.dataplane`; the wire format is :mod:`.protocol`)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import zmq

from dualpath_emu._core import UNREPORTED_TAG
from dualpath_emu.runtime.core_work import CoreLayout, CoreWork
from dualpath_emu.runtime.dataplane import protocol
from dualpath_emu.runtime.dataplane.clock_sync import ClockCheck, ClockSync, handshake
from dualpath_emu.runtime.dataplane.protocol import BYE_TIMEOUT_S, CONNECT_TIMEOUT_S, HEARTBEAT_INTERVAL_S
from dualpath_emu.runtime.dataplane.protocol import HEARTBEAT_TIMEOUT_S, KINDS_TO_REMOTE, MAX_REQUESTS_PER_MESSAGE
from dualpath_emu.runtime.dataplane.protocol import NOBLOCK, PROTOCOL_VERSION, RECEIVE_BATCH, SYNC_ROUNDS, U32_MAX
from dualpath_emu.runtime.dataplane.protocol import Backlog, DataPlaneError, DataPlaneKeys, DataPlaneLost
from dualpath_emu.runtime.dataplane.protocol import DetachedRequestError, FrameError, RefusedError, array
from dualpath_emu.runtime.dataplane.protocol import bounded_str, check_endpoint, decode_frame, error_from_service
from dualpath_emu.runtime.dataplane.protocol import fd_of, finite_float, short, socket_options, uint
from dualpath_emu.runtime.lag import LagStats
from dualpath_emu.runtime.realtime import RealTimeLoop

__all__ = ["RemoteDataPlane", "run_remote"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


def _plain_forward(forward: tuple[Any, ...]) -> list[Any]:
    """A forward request with every sequence as a list (msgpack packs lists and tuples only)."""

    def layer(transfer: Any) -> Any:
        return None if transfer is None else [list(transfer[0]), transfer[1], transfer[2]]

    n_layers, ranks, ffn_ns, collectives, load_window, tag = forward
    return [
        n_layers, [[layer(r[0]), r[1], layer(r[2])] for r in ranks], ffn_ns, [layer(c) for c in collectives],
        load_window, tag,
    ]  # fmt: skip


class RemoteDataPlane(CoreWork):
    """A data plane whose core work runs in the data-plane service at ``endpoint``, on the service's clock.
    Construction connects, says hello as ``name`` and measures the clock offset (blocking, at most
    ``connect_timeout_s``: :class:`RefusedError`, :class:`DataPlaneLost`); ``layout`` is then the service's.
    ``keys``: a CURVE client of ``peer_name`` (else ``insecure`` allows ``tcp://``); ``incarnation`` > 0: started in
    place of a process that died. Bind it to a loop (:meth:`new_loop`), run the program through :meth:`run` (a lost
    data plane ends it) and :meth:`say_bye` when its actors are done."""

    def __init__(
        self, endpoint: str, name: str, *, time_scale: float = 1.0, keys: DataPlaneKeys | None = None,
        peer_name: str = "dataplane", insecure: bool = False, connect_timeout_s: float = CONNECT_TIMEOUT_S,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S, heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        sync_rounds: int = SYNC_ROUNDS, incarnation: int = 0,
    ) -> None:  # fmt: skip
        self._heartbeat_handle: asyncio.TimerHandle | None = None
        self.incarnation = incarnation
        """Which incarnation of its process this is (said at hello: a later one replaces a dead one)."""
        self._stop_callbacks: list[Callable[[str], None]] = []
        self.stop_reason: str | None = None
        """Why the service asked this process to stop (the run is complete), once it has."""
        self._fd: int | None = None
        self._socket: zmq.Socket[Any] | None = None
        self._context: zmq.Context[Any] | None = None
        super().__init__()
        if not 0 < heartbeat_interval_s < heartbeat_timeout_s:
            raise ValueError("expected 0 < heartbeat_interval_s < heartbeat_timeout_s")
        check_endpoint(endpoint, keys, insecure)
        self._decode_moved: dict[int, dict[str, Any]] = {}
        """Decode node (its tag) -> what it moved on its own, as of its last report."""
        self.endpoint = endpoint
        self.name = name
        self._time_scale = time_scale
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.delivery_lag = LagStats()
        self.counters: dict[str, int] = {"batches": 0, "requests": 0, "completions": 0, "refused": 0, "rejected": 0}
        self.failure: DataPlaneError | None = None  # Why the data plane was lost (then :meth:`run` raises it).
        self._failed: asyncio.Future[None] | None = None
        self._clock_check = ClockCheck()
        self._seq = 0
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._batch_requested_ns = 0
        self._recheck_due = False
        self._backlog: Backlog[bytes] = Backlog()
        self._context = zmq.Context()
        socket = self._socket = self._context.socket(zmq.DEALER)
        try:
            socket_options(socket, 200)
            if keys is not None:
                keys.make_client(socket, peer_name)
            socket.connect(endpoint)
            self.sync, self.layout = self._handshake(connect_timeout_s, sync_rounds)
        except BaseException:
            self._close_socket()
            raise
        self._base_ns = self.sync.clock_ns
        self._ref_ns = self.sync.local_ns
        self._last_heard_s = time.monotonic()

    def new_loop(self) -> RealTimeLoop:
        """A :class:`~dualpath_emu.runtime.realtime.RealTimeLoop` on the service's clock, this plane bound."""
        loop = RealTimeLoop(self.clock_ns, self._time_scale)
        self.bind(loop)
        return loop

    def _bound(self) -> None:
        loop = self.loop
        self._failed = loop.create_future()
        if self.failure is not None:
            self._failed.set_result(None)
        if self._socket is not None:
            self._fd = fd_of(self._socket)
            loop.add_reader(self._fd, self._on_readable)
            self._heartbeat_handle = loop.call_later(self.heartbeat_interval_s * self._time_scale, self._heartbeat)

    def _handshake(self, timeout_s: float, rounds: int) -> tuple[ClockSync, CoreLayout]:
        socket = self._socket
        assert socket is not None
        deadline = time.monotonic() + timeout_s

        def receive(what: str) -> list[Any]:
            while True:
                left_ms = (deadline - time.monotonic()) * 1000
                if left_ms <= 0 or not socket.poll(max(1, int(left_ms)), zmq.POLLIN):
                    raise DataPlaneLost(
                        f"no {what} from the data plane at {self.endpoint} within {timeout_s} s: is it running?"
                    )
                try:
                    message = decode_frame(socket.recv(), KINDS_TO_REMOTE)
                except FrameError as error:
                    self._reject(str(error))
                    continue
                if message[1] == "stop" and len(message) == 3 and type(message[2]) is str:
                    self.stop_reason = self.stop_reason or message[2]  # the run is complete already (a late process)
                    continue
                return message

        hello = [PROTOCOL_VERSION, "hello", self.name, os.getpid(), float(self._time_scale)]
        socket.send(msgpack.packb(hello + [self.incarnation] if self.incarnation else hello))
        while True:
            message = receive("welcome")
            if message[1] == "refused":
                raise RefusedError(
                    f"the data plane at {self.endpoint} refused {self.name!r}: {message[2] if len(message) > 2 else '?'}"
                )
            if message[1] == "welcome":
                break
        try:
            array(message, "welcome", 8, 8)
            time_scale = finite_float(message[4], "welcome.time_scale")
            layout_map = message[5]
            if type(layout_map) is not dict or type(layout_map.get("ports")) is not dict:
                raise FrameError("welcome.layout: expected a map with ports and storage_nodes")
            layout = CoreLayout(
                {bounded_str(k, "port name"): uint(v, "port id", U32_MAX) for k, v in layout_map["ports"].items()},
                {bounded_str(k, "node name"): uint(v, "node id", U32_MAX) for k, v in dict(layout_map.get("storage_nodes", {})).items()},
            )  # fmt: skip
        except (FrameError, AttributeError, TypeError) as error:
            raise DataPlaneError(f"a malformed welcome from the data plane at {self.endpoint}: {error}") from None
        if not math.isclose(time_scale, self._time_scale, rel_tol=1e-12):
            raise RefusedError(f"the data plane runs at time_scale {time_scale}, this process at {self._time_scale}")

        def ping(seq: int, t0: int) -> int:
            socket.send(msgpack.packb([PROTOCOL_VERSION, "ping", seq, t0]))
            while True:
                pong = receive("answer to a clock ping")
                if pong[1] == "pong" and len(pong) == 5 and pong[2] == seq:
                    return uint(pong[4], "pong.clock_ns")

        sync = handshake(ping, rounds, self._time_scale)
        self._seq = max(rounds, 1)
        return sync, layout

    @property
    def time_scale(self) -> float:
        """Emulated seconds per wall second (the service's)."""
        return self._time_scale

    def clock_ns(self) -> int:
        """The service's core clock now, as measured at connect (see the module docstring)."""
        return self._base_ns + int((time.monotonic_ns() - self._ref_ns) * self._time_scale)

    def decode_bytes(self, node: int) -> dict[str, Any] | None:
        """What decode node ``node`` moved on its own, as its last report said (``None`` before one came)."""
        return self._decode_moved.get(node)

    def set_port_factor(self, port: int, factor: float) -> None:
        """A fault: ``port``'s rates × ``factor`` from now on, in the service's core, after earlier work."""
        self.flush()
        self._send(msgpack.packb([PROTOCOL_VERSION, "fault", self._next_seq(), port, "factor", float(factor)]))

    def set_port_latency(self, port: int, extra_ns: int) -> None:
        """A fault: ``extra_ns`` added to what starts crossing ``port`` from now on, in the service's core."""
        self.flush()
        self._send(msgpack.packb([PROTOCOL_VERSION, "fault", self._next_seq(), port, "latency", int(extra_ns)]))

    def decode_reset(self, node: int) -> None:
        """An engine crash: decode node ``node`` drops every request in the service's core, after earlier work."""
        if node not in self._decode_reports:
            raise LookupError(f"decode_reset: decode node {node} was never added through this data plane")
        self.flush()
        self._send(msgpack.packb([PROTOCOL_VERSION, "fault", self._next_seq(), None, "decode_reset", int(node)]))

    def _work_requested(self) -> None:
        self._batch_requested_ns = self.clock_ns()
        self.loop.call_soon(self.flush)

    def _submit_batch(
        self, transfers: list[Any], forwards: list[Any], ios: list[Any], timers: list[Any], decode_nodes: list[Any],
        joins: list[Any],
    ) -> None:  # fmt: skip
        requested_ns = self._batch_requested_ns
        self.counters["batches"] += 1
        self.counters["requests"] += (
            len(transfers) + len(forwards) + len(ios) + len(timers) + len(decode_nodes) + len(joins)
        )
        limit = MAX_REQUESTS_PER_MESSAGE
        largest = max(len(transfers), len(forwards), len(ios), len(timers), len(joins), 1)
        for start in range(0, largest, limit):
            end = start + limit
            message = [
                PROTOCOL_VERSION, "submit", self._next_seq(), requested_ns,
                transfers[start:end], forwards[start:end], ios[start:end], timers[start:end],
                decode_nodes if start == 0 else [], joins[start:end],  # the nodes before any join that names them
            ]  # fmt: skip
            try:
                payload = msgpack.packb(message)
            except TypeError:  # a path given as another sequence (a range, say): make every sequence a list
                message[5] = [_plain_forward(f) for f in forwards[start:end]]
                message[4] = [[list(t[0]), t[1], t[2], t[3]] for t in transfers[start:end]]
                payload = msgpack.packb(message)
            self._send(payload)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, payload: bytes) -> None:
        if self._socket is None:
            return
        if len(payload) > protocol.MAX_FRAME_BYTES:  # the service's socket would drop the connection: say why
            self._fatal(DataPlaneError(
                f"{self.name!r} has a message of {len(payload):,} bytes for the data plane, more than its frames "
                f"take ({protocol.MAX_FRAME_BYTES:,} bytes)"
            ))  # fmt: skip
            return
        if self._backlog or not self._send_queued(payload):
            self._keep(payload)
        if not self._recheck_due:  # a send may consume the descriptor's edge: look again next iteration
            self._recheck_due = True
            self.loop.call_soon(self._on_readable)

    def _keep(self, payload: bytes) -> None:
        """Put ``payload`` at the end of the backlog; past its bounds the run fails (later requests dropped)."""
        if not self._backlog.keep(payload, len(payload)):
            self._fatal(DataPlaneError(
                f"{len(self._backlog):,} messages ({self._backlog.size_bytes:,} bytes) of {self.name!r} wait for the data "
                f"plane at {self.endpoint}, which does not take them: stuck or far slower than the run"
            ))  # fmt: skip

    def _drain_backlog(self) -> None:
        self._backlog.drain(self._send_queued)

    def _send_queued(self, payload: bytes) -> bool:
        if self._socket is None:
            return False
        try:
            self._socket.send(payload, NOBLOCK)
        except zmq.Again:
            self.loop.call_later(0.001 * self._time_scale, self._drain_backlog)
            return False
        return True

    def _reject(self, reason: str) -> None:
        self.counters["rejected"] += 1
        _log.warning("remote data plane %r: rejected a frame from %s: %s", self.name, self.endpoint, reason)

    def _on_readable(self) -> None:
        self._recheck_due = False
        socket = self._socket
        if socket is None:
            return
        recv = socket.recv
        for _ in range(RECEIVE_BATCH):
            try:
                frame = recv(NOBLOCK)
            except zmq.Again:
                return
            self._last_heard_s = time.monotonic()
            try:
                self._on_message(decode_frame(frame, KINDS_TO_REMOTE))
            except FrameError as error:
                self._reject(str(error))
        self.loop.call_soon(self._on_readable)  # more may be queued: let others run first

    def _on_message(self, message: list[Any]) -> None:
        kind = message[1]
        if kind == "done":
            array(message, "done", 6, 6)
            completions = array(message[3], "done.completions", MAX_REQUESTS_PER_MESSAGE)
            errors = array(message[4], "done.errors", MAX_REQUESTS_PER_MESSAGE * 4)
            decoded = array(message[5], "done.decoded", MAX_REQUESTS_PER_MESSAGE)
            for entry in errors:
                tag, type_name, text = array(entry, "done.errors[]", 3, 3)
                self.counters["refused"] += 1
                error = error_from_service(
                    bounded_str(type_name, "error type"), bounded_str(text, "error text", 100_000)
                )
                if tag == UNREPORTED_TAG or tag in self._decode_reports:  # nobody but the run can be told
                    what = "a detached request" if tag == UNREPORTED_TAG else "a decode node"
                    self._fatal(DetachedRequestError(f"the data plane refused {what}: {type(error).__name__}: {error}"))
                else:
                    self._refused(uint(tag, "error tag"), error)
            if completions:
                now = self.clock_ns()
                add = self.delivery_lag.add
                for completion in completions:
                    if type(completion) is not list or len(completion) != 6:
                        raise FrameError(
                            f"done.completions: expected [kind, tag, start, end, size, lane], got {short(completion)}"
                        )
                    add(now - completion[3])
                self.counters["completions"] += len(completions)
                try:
                    self._deliver(completions)
                except Exception as error:  # UnexpectedCompletionError: nobody awaits a tag
                    self._fatal(DataPlaneError(str(error)))
            for entry in decoded:
                tag, ended, spans, moved = array(entry, "done.decoded[]", 4, 4)
                if tag not in self._decode_reports:
                    raise FrameError(
                        f"done.decoded: a report of decode node {short(tag)}, which this process never added"
                    )
                self._decode_moved[tag] = moved
                self._decoded(
                    tag, array(ended, "done.decoded[].ended", U32_MAX), array(spans, "done.decoded[].spans", U32_MAX)
                )
        elif kind == "pong":
            array(message, "pong", 5, 5)
            t1 = time.monotonic_ns()
            seq, t0 = uint(message[2], "pong.seq"), uint(message[3], "pong.t0")
            self._clock_check.add(self.sync, t0, t1, uint(message[4], "pong.clock_ns"))
            self._resolve(seq, None)
        elif kind in ("stats", "bye"):
            seq = uint(message[2], f"{kind}.seq")
            self._resolve(seq, message[3] if kind == "stats" and len(message) > 3 else None)
        elif kind == "stop":
            reason = bounded_str(message[2], "stop.reason", 100_000) if len(message) > 2 else "stop"
            if self.stop_reason is None:
                self.stop_reason = reason
                for callback in self._stop_callbacks:
                    self.loop.call_soon(callback, reason)
        elif kind == "fatal":
            self._fatal(
                DataPlaneError(
                    f"the data plane at {self.endpoint} failed: {bounded_str(message[2], 'reason', 100_000)}"
                )
            )
        else:  # welcome or refused after the handshake
            raise FrameError(f"an unexpected {kind!r} after the handshake")

    def _resolve(self, seq: int, value: Any) -> None:
        future = self._replies.pop(seq, None)
        if future is not None and not future.done():
            future.set_result(value)

    def _heartbeat(self) -> None:
        self._heartbeat_handle = None
        if self._socket is None or self.failure is not None:
            return
        self._on_readable()  # what arrived while the loop was busy counts as heard
        silent = time.monotonic() - self._last_heard_s
        if silent > self.heartbeat_timeout_s:
            self._fatal(DataPlaneLost(
                f"no word from the data plane at {self.endpoint} for {silent:.1f} s (heartbeat timeout "
                f"{self.heartbeat_timeout_s} s): it is stopped, hung or gone"
            ))  # fmt: skip
            return
        self._send(msgpack.packb([PROTOCOL_VERSION, "ping", self._next_seq(), time.monotonic_ns()]))
        self._heartbeat_handle = self.loop.call_later(self.heartbeat_interval_s * self._time_scale, self._heartbeat)

    def _fatal(self, error: DataPlaneError) -> None:
        if self.failure is None:
            _log.error("%s", error)
            self.failure = error
            if self._failed is not None and not self._failed.done():
                self._failed.set_result(None)

    async def run(self, main: Awaitable[_T]) -> _T:
        """``main``'s result; if the data plane is lost first, ``main`` is cancelled and the error raised."""
        assert self._failed is not None, "bind the plane to its loop first (new_loop)"
        task = asyncio.ensure_future(main)
        waiting: set[asyncio.Future[Any]] = {task, self._failed}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert self.failure is not None
        raise self.failure

    def when_stop_requested(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` in the loop when the service says the run is complete (at once if it did)."""
        self._stop_callbacks.append(callback)
        if self.stop_reason is not None:
            self.loop.call_soon(callback, self.stop_reason)

    async def _request(self, kind: str, timeout_s: float, *fields: Any) -> Any:
        seq = self._next_seq()
        future: asyncio.Future[Any] = self.loop.create_future()
        self._replies[seq] = future
        self._send(msgpack.packb([PROTOCOL_VERSION, kind, seq, *fields]))
        try:
            return await asyncio.wait_for(future, timeout_s * self._time_scale)
        finally:
            self._replies.pop(seq, None)

    async def stats(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """The service's :meth:`DataPlaneService.report` (``timeout_s`` wall seconds; :class:`TimeoutError`)."""
        self.flush()
        report: dict[str, Any] = await self._request("stats", timeout_s)
        return report

    async def say_bye(self, timeout_s: float = BYE_TIMEOUT_S, *, run_complete: bool = False) -> bool:
        """Submit what is queued and say bye (``run_complete``: others told to stop); True if answered in time."""
        self.flush()
        if self._socket is None or self.failure is not None:
            return False
        try:
            await self._request("bye", timeout_s, run_complete)
        except TimeoutError:
            return False
        return True

    async def finish(self, run_complete: bool) -> None:
        """Submit what is still queued and say bye (:meth:`say_bye`)."""
        await self.say_bye(run_complete=run_complete)

    def report(self) -> dict[str, Any]:
        """This process's side: the clock handshake, the later clock checks, delivery lags, counters."""
        return {
            "endpoint": self.endpoint, "rtt_ns": self.sync.rtt_ns,
            "offset_uncertainty_ns": self.sync.offset_uncertainty_ns, "sync_rounds": self.sync.rounds,
            "clock_check": self._clock_check.summary(), "delivery_lag_ns": self.delivery_lag.summary(),
            "delivery_lag": self.delivery_lag.to_wire(), "counters": dict(self.counters),
            "failure": str(self.failure) if self.failure is not None else None,
        }  # fmt: skip

    def _close_socket(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._context is not None:
            self._context.term()
            self._context = None

    def close(self) -> None:
        """Stop the heartbeat, close the socket (idempotent; the loop stays open)."""
        if self._heartbeat_handle is not None:
            self._heartbeat_handle.cancel()
            self._heartbeat_handle = None
        loop = getattr(self, "loop", None)
        if self._fd is not None and loop is not None and not loop.is_closed():
            loop.remove_reader(self._fd)
        self._fd = None
        self._close_socket()


def run_remote(main: Awaitable[_T], plane: RemoteDataPlane) -> _T:
    """Run ``main`` on a new loop on ``plane``'s clock (a lost data plane raises); close both after."""
    loop = plane.new_loop()
    try:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            return runner.run(plane.run(main))
    finally:
        plane.close()
