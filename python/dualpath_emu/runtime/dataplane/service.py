"""The data-plane service: the process that owns a real-time run's only core and serves every other process's
requests to it (see the package, :mod:`dualpath_emu.runtime.dataplane`; the wire format is :mod:`.protocol`)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import zmq

from dualpath_emu._core import UNREPORTED_TAG, Core
from dualpath_emu.runtime.core_work import TAG_OF_DECODE_NODE, TAG_OF_FORWARD, TAG_OF_IO, TAG_OF_TIMER
from dualpath_emu.runtime.core_work import TAG_OF_TRANSFER, clear_faults, core_layout, core_state
from dualpath_emu.runtime.dataplane.protocol import CONNECT_TIMEOUT_S, DRAIN_CHECK_S, HEARTBEAT_INTERVAL_S
from dualpath_emu.runtime.dataplane.protocol import HEARTBEAT_TIMEOUT_S, MAX_REQUESTS_PER_MESSAGE, NOBLOCK
from dualpath_emu.runtime.dataplane.protocol import PROTOCOL_VERSION, RECEIVE_BATCH, REJECTIONS_LOGGED
from dualpath_emu.runtime.dataplane.protocol import SNDMORE_NOBLOCK, U32_MAX, Authenticator, Backlog
from dualpath_emu.runtime.dataplane.protocol import DataPlaneError, DataPlaneKeys, FrameError, RequesterLost
from dualpath_emu.runtime.dataplane.protocol import StartAuthenticator, array, bounded_str, check_endpoint
from dualpath_emu.runtime.dataplane.protocol import decode_frame, decode_submit, fd_of, finite_float, short
from dualpath_emu.runtime.dataplane.protocol import socket_options, uint
from dualpath_emu.runtime.lag import LagStats
from dualpath_emu.runtime.realtime import WallClockCore
from dualpath_emu.runtime.security import BoundedLog
from dualpath_emu.runtime.virtual import submit_batch

__all__ = ["DataPlaneService", "ServiceCore"]

_REJECTION_LOG: Final = 20
_log = logging.getLogger(__name__)


def _default_start_authenticator() -> StartAuthenticator:
    """:func:`dualpath_emu.runtime.security.start_authenticator` (it takes its own ``RunKeys``)."""
    module = importlib.import_module("dualpath_emu.runtime.security")
    start: StartAuthenticator = module.start_authenticator
    return start


def _booker(tallies: dict[Any, list[int]]) -> Callable[[Any, int, int, int], None]:
    """Adds ``[size, count]`` to ``tallies[(where, lane)]``."""

    def book(where: Any, lane: int, size: int, count: int) -> None:
        tally = tallies.setdefault((where, lane), [0, 0])
        tally[0] += size
        tally[1] += count

    return book


@dataclass
class _Requester:
    """A connected remote process, as the service sees it."""

    name: str
    identity: bytes
    pid: int
    last_heard_s: float
    inflight: set[int] = field(default_factory=set)
    completions: list[list[Any]] = field(default_factory=list)
    errors: list[list[Any]] = field(default_factory=list)
    decoded: list[list[Any]] = field(default_factory=list)
    decode_nodes: dict[int, int] = field(default_factory=dict)
    """Its decode nodes: its tag -> the node's id in the core."""
    submission_lag: LagStats = field(default_factory=LagStats)
    batches: int = 0
    requests: int = 0
    completed: int = 0
    refused: int = 0
    said_bye: bool = False
    touched: bool = False
    incarnation: int = 0
    gone: bool = False  # It died (replaced, or unreachable): nothing more is sent to it.
    booked: dict[tuple[tuple[int, ...], int], list[int]] | None = None
    """A replaceable requester's tally: ``[bytes, transfers]`` per ``(path, lane)`` it asked the core to move."""
    decode_specs: dict[int, dict[str, Any]] = field(default_factory=dict)
    """A replaceable requester's decode nodes' specs (their paths: what they move on their own), by core id."""


class ServiceCore(WallClockCore):
    """The service's core: completions for remote requesters go to the attached :class:`DataPlaneService`."""

    def __init__(self, core: Core) -> None:
        super().__init__(core)
        self._service: DataPlaneService | None = None

    def _deliver(self, completions: list[tuple[str, int, int, int, int, int]]) -> None:
        service = self._service
        if service is not None and completions:
            completions = service._route(completions)
        if completions:
            super()._deliver(completions)


class DataPlaneService:
    """The data-plane service of ``plane``'s core (see the package) on its loop, bound at ``bind`` by :meth:`serve`.
    ``requesters``: every process expected (``None``: any; drained once all that connected said bye); ``keys``: a
    CURVE server (else ``insecure`` allows ``tcp://``); heartbeats in wall seconds; ``replaceable``: processes a
    later incarnation may replace, ``storage_paths`` each storage node's read and write ports (for their tallies)."""

    def __init__(
        self, plane: ServiceCore, *, bind: str, requesters: Iterable[str] | None = None, name: str = "dataplane",
        keys: DataPlaneKeys | None = None, start_authenticator: StartAuthenticator | None = None,
        insecure: bool = False, heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S, connect_timeout_s: float = CONNECT_TIMEOUT_S,
        replaceable: Iterable[str] = (),
        storage_paths: Mapping[int, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
    ) -> None:  # fmt: skip
        if plane._service is not None:
            raise ValueError("this core already has a data-plane service")
        if not 0 < heartbeat_interval_s < heartbeat_timeout_s:
            raise ValueError("expected 0 < heartbeat_interval_s < heartbeat_timeout_s")
        check_endpoint(bind, keys, insecure)
        self.plane = plane
        self.core = plane.core
        self.bind_address = bind
        self.expected: tuple[str, ...] | None = None if requesters is None else tuple(requesters)
        self.name = name
        self._keys = keys
        self._start_authenticator = start_authenticator
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.counters: dict[str, int] = {
            "frames": 0, "rejected": 0, "batches": 0, "requests": 0, "completions": 0, "refused": 0,
            "messages_sent": 0, "send_failures": 0, "completions_dropped": 0,
        }  # fmt: skip
        self.rejections: deque[str] = deque(maxlen=_REJECTION_LOG)  # The reasons of the last rejected frames.
        self._rejection_log = BoundedLog(_log, "data plane: rejected a frame", first=REJECTIONS_LOGGED)
        self.submission_lag = LagStats()
        self._requesters: dict[bytes, _Requester] = {}
        self._by_name: dict[str, _Requester] = {}
        self._routes: dict[int, tuple[_Requester, int]] = {}
        self._decode_routes: dict[int, tuple[_Requester, int, int]] = {}
        """Core tag of a decode node's reports -> (its requester, the requester's tag, the node's id)."""
        self._touched: list[_Requester] = []
        self._layout = core_layout(self.core)
        self._context: zmq.Context[Any] | None = None
        self._socket: zmq.Socket[Any] | None = None
        self._authenticator: Authenticator | None = None
        self._endpoint: str | None = None
        self._done: asyncio.Future[str] | None = None
        self._backlog: Backlog[list[bytes]] = Backlog()
        self._recheck_due = False
        self._started_s = time.monotonic()
        self._drain_check: asyncio.TimerHandle | None = None
        self.failure: DataPlaneError | None = None
        self.run_complete_by: str | None = None
        """The requester that said its run is complete (then every other one was told to stop)."""
        self.replaceable = frozenset(replaceable)
        """Names whose process may die and be replaced by a later incarnation (see Restarted processes)."""
        self._storage_paths = dict(storage_paths or {})
        """Storage node (core id) -> the ports of its reads and of its writes, for the tallies."""
        self._replaced: list[_Requester] = []
        plane._service = self

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the service runs on (its plane's)."""
        return self.plane.loop

    @property
    def endpoint(self) -> str:
        """The endpoint actually bound (a ``*`` port resolved); after :meth:`open`."""
        if self._endpoint is None:
            raise RuntimeError("the data-plane service is not open")
        return self._endpoint

    def open(self) -> None:
        """Bind the ROUTER socket and start serving (inside the running loop, or before it runs)."""
        if self._context is not None:
            raise RuntimeError("the data-plane service is already open")
        context: zmq.Context[Any] = zmq.Context()
        self._context = context
        try:
            if self._keys is not None:
                start = self._start_authenticator or _default_start_authenticator()
                self._authenticator = start(context, self._keys)
            socket = self._socket = context.socket(zmq.ROUTER)
            socket_options(socket, 0)
            socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished peer is an error we count, not silence
            if self._keys is not None:
                self._keys.make_server(socket)
            socket.bind(self.bind_address)
        except BaseException:
            self.close()
            raise
        endpoint = socket.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(endpoint, bytes)
        self._endpoint = endpoint.decode()
        self._done = self.loop.create_future()
        self.loop.add_reader(fd_of(socket), self._on_readable)
        self._started_s = time.monotonic()
        self.loop.call_soon(self._on_readable)
        self._schedule_heartbeat()

    def close(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._drain_check is not None:
            self._drain_check.cancel()
            self._drain_check = None
        if self._socket is not None:
            if not self.loop.is_closed():
                self.loop.remove_reader(fd_of(self._socket))
            self._socket.close(linger=200)  # what we last sent (fatal, bye) still leaves
            self._socket = None
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None
        if self._context is not None:
            self._context.term()
            self._context = None
        self._rejection_log.flush()

    async def serve(self, stop: asyncio.Event | None = None) -> str:
        """Serve until drained (``"drained"``), stopped (``"stopped"``) or failed (raises)."""
        if self._context is None:
            self.open()
        assert self._done is not None
        stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            waiting: set[asyncio.Future[Any]] = {self._done} if stopper is None else {self._done, stopper}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if self._done.done():
                return self._done.result()
            return "stopped"
        finally:
            if stopper is not None:
                stopper.cancel()
            self.close()

    def _reject(self, reason: str, requester: _Requester | None = None) -> None:
        self.counters["rejected"] += 1
        who = f" from {requester.name!r}" if requester is not None else ""
        text = f"rejected a frame{who}: {reason}"
        self.rejections.append(text)
        self._rejection_log.note(f"{self._endpoint}{who}: {reason}")  # a flood is counted, not all logged

    def _on_readable(self) -> None:
        socket = self._socket
        if socket is None:
            return
        self._recheck_due = False
        recv = socket.recv
        handled = 0
        while handled < RECEIVE_BATCH:
            try:
                # recv_multipart(NOBLOCK), frame by frame (RCVMORE through getsockopt costs more than a frame)
                part = recv(NOBLOCK, copy=False)
                frames = [part.bytes]
                while part.more:
                    part = recv(NOBLOCK, copy=False)
                    frames.append(part.bytes)
            except zmq.Again:
                break
            except zmq.ZMQError as error:  # e.g. a frame over MAXMSGSIZE: ZeroMQ drops the peer's connection
                self._reject(f"receive failed: {error}")
                break
            handled += 1
            self.counters["frames"] += 1
            try:
                self._on_frames(frames)
            except FrameError as error:
                self._reject(str(error), self._requesters.get(frames[0]))
            except Exception as error:  # never let one frame end the service
                self._reject(f"{type(error).__name__}: {error}", self._requesters.get(frames[0]))
        completions = self.core.take_completions()  # what the submissions completed at once
        if completions:
            self.plane._deliver(completions)
        self._send_touched()
        if handled >= RECEIVE_BATCH:
            self.loop.call_soon(self._on_readable)

    def _on_frames(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            raise FrameError(f"expected one frame after the peer's identity, got {len(frames) - 1}")
        identity, frame = frames
        message = decode_frame(frame)
        kind = message[1]
        requester = self._requesters.get(identity)
        if kind == "hello":
            self._on_hello(identity, requester, message)
            return
        if requester is None:
            raise FrameError(f"a {kind!r} from a peer that has not said hello")
        requester.last_heard_s = time.monotonic()
        if kind == "submit":
            self._on_submit(requester, message)
        elif kind == "fault":
            self._on_fault(requester, message)
        elif kind == "ping":
            array(message, "ping", 4, 4)
            seq, t0 = uint(message[2], "ping.seq"), uint(message[3], "ping.t0")
            self._send(identity, [PROTOCOL_VERSION, "pong", seq, t0, self.core.clock_ns()])
        elif kind == "stats":
            array(message, "stats", 3, 3)
            self._send(identity, [PROTOCOL_VERSION, "stats", uint(message[2], "stats.seq"), self.report()])
        else:  # bye
            array(message, "bye", 4, 4)
            seq = uint(message[2], "bye.seq")
            if type(message[3]) is not bool:
                raise FrameError(f"bye.run_complete: expected true or false, got {short(message[3])}")
            requester.said_bye = True
            self._send(identity, [PROTOCOL_VERSION, "bye", seq])
            if message[3] and self.run_complete_by is None:
                self.run_complete_by = requester.name
                for other in self._requesters.values():
                    if not other.said_bye:
                        self._send(other.identity, [PROTOCOL_VERSION, "stop", f"{requester.name!r} completed the run"])
            self._check_drained()

    def _on_hello(self, identity: bytes, requester: _Requester | None, message: list[Any]) -> None:
        if type(message) is list and len(message) == 5:
            message = [*message, 0]
        array(message, "hello", 6, 6)
        name = bounded_str(message[2], "hello.name")
        pid = uint(message[3], "hello.pid", U32_MAX)
        time_scale = finite_float(message[4], "hello.time_scale")
        incarnation = uint(message[5], "hello.incarnation", U32_MAX)
        reason = None
        old = self._by_name.get(name)
        # (One that said bye may have died before it wrote its results: the new one's replace them, its tally counts.)
        replaces = old is not None and name in self.replaceable and incarnation > old.incarnation
        if requester is not None:
            reason = f"this connection already said hello as {requester.name!r}"
        elif not name:
            reason = "an empty name"
        elif self.expected is not None and name not in self.expected:
            reason = f"no process {name!r} is expected (expected: {', '.join(self.expected)})"
        elif old is not None and not old.said_bye and not replaces:
            reason = f"a process named {name!r} is already connected"
        elif not math.isclose(time_scale, self.plane.time_scale, rel_tol=1e-12):
            reason = f"time_scale {time_scale} differs from the data plane's {self.plane.time_scale}"
        if reason is not None:
            self._reject(f"hello refused: {reason}")
            self._send(identity, [PROTOCOL_VERSION, "refused", reason])
            return
        if replaces:
            assert old is not None
            self._replace(old, incarnation, pid)
        requester = _Requester(name, identity, pid, time.monotonic(), incarnation=incarnation)
        if name in self.replaceable:
            requester.booked = {}
        self._requesters[identity] = requester
        self._by_name[name] = requester
        layout = {"ports": dict(self._layout.ports), "storage_nodes": dict(self._layout.storage_nodes)}
        self._send(identity, [
            PROTOCOL_VERSION, "welcome", self.name, self.core.clock_ns(), self.plane.time_scale, layout,
            self.heartbeat_interval_s, self.heartbeat_timeout_s,
        ])  # fmt: skip
        if self.run_complete_by is not None:  # late: the run is over already
            self._send(identity, [PROTOCOL_VERSION, "stop", f"{self.run_complete_by!r} completed the run"])
        _log.info("data plane: %r (pid %d) connected", name, pid)

    def _gone(self, requester: _Requester, why: str) -> None:
        """Replaceable ``requester``'s process died: its decode nodes drop every request; it is sent nothing more."""
        if requester.gone:
            return
        requester.gone = True
        for node in requester.decode_nodes.values():
            self.core.decode_reset(node)
        _log.warning(
            "data plane: process %r (pid %d, incarnation %d) %s: its work is dropped; waiting for the "
            "process started in its place",
            requester.name,
            requester.pid,
            requester.incarnation,
            why,
        )

    def _replace(self, old: _Requester, incarnation: int, pid: int) -> None:
        """A new incarnation (pid ``pid``) of ``old``'s process said hello: ``old`` is dead."""
        self._gone(old, f"is replaced by incarnation {incarnation} (pid {pid})")
        self._requesters.pop(old.identity, None)  # its connection's frames are rejected from now on
        self._replaced.append(old)
        self.counters["replaced"] = self.counters.get("replaced", 0) + 1

    def _on_fault(self, requester: _Requester, message: list[Any]) -> None:
        """A ``fault`` frame: a port's factor or latency from now on, or a decode node's reset (an engine crash)."""
        array(message, "fault", 6, 6)
        uint(message[2], "fault.seq")
        what = bounded_str(message[4], "fault.what")
        if what == "decode_reset":
            if message[3] is not None:
                raise FrameError(f"fault.port: expected nil for a decode_reset, got {short(message[3])}")
            tag = uint(message[5], "fault.value")
            node = requester.decode_nodes.get(tag)
            if node is None:  # like a join naming it: the requester's run is told
                self._refuse(requester, UNREPORTED_TAG, ValueError(f"a decode_reset names decode node {tag}, which "
                                                                   "this process never added"))  # fmt: skip
                return
            self.core.decode_reset(node)  # the spans it closes are reported with the completions of this read
            return
        port = uint(message[3], "fault.port", self.core.port_count - 1)
        if what == "factor":
            factor = finite_float(message[5], "fault.value")
            if not 0.0 <= factor <= 1.0:
                raise FrameError(f"fault.value: expected a factor in [0, 1], got {short(message[5])}")
            self.core.set_port_factor(port, factor)
        elif what == "latency":
            self.core.set_port_latency(port, uint(message[5], "fault.value"))
        else:
            raise FrameError(f"fault.what: expected 'factor', 'latency' or 'decode_reset', got {short(what)}")

    def _on_submit(self, requester: _Requester, message: list[Any]) -> None:
        _, requested_ns, transfers, forwards, ios, timers, nodes, joins = decode_submit(message)
        # Tags must be new: not in flight for this requester (nor a decode node's), and not twice in this message.
        inflight, standing = requester.inflight, requester.decode_nodes
        seen: set[int] = set()
        for batch, tag_of in (
            (transfers, TAG_OF_TRANSFER), (forwards, TAG_OF_FORWARD), (ios, TAG_OF_IO), (timers, TAG_OF_TIMER),
            (nodes, TAG_OF_DECODE_NODE),
        ):  # fmt: skip
            for item in batch:
                tag = tag_of(item)
                if tag == UNREPORTED_TAG:
                    continue
                if tag in inflight or tag in standing or tag in seen:
                    raise FrameError(f"tag {tag} is already in flight")
                seen.add(tag)
        now_ns = self.core.clock_ns()
        lag = now_ns - requested_ns
        requester.submission_lag.add(lag)
        self.submission_lag.add(lag)
        requester.batches += 1
        self.counters["batches"] += 1
        count = len(transfers) + len(forwards) + len(ios) + len(timers) + len(nodes) + len(joins)
        requester.requests += count
        self.counters["requests"] += count
        if requester.booked is not None:
            self._tally(requester.booked, transfers, forwards, ios)
        routes, new_tag = self._routes, self.plane.new_tag

        def route(batch: list[Any], tag_at: int) -> list[Any]:  # the requester's tags -> the core's
            routed = []
            for item in batch:
                tag = item[tag_at]
                if tag != UNREPORTED_TAG:
                    core_tag = new_tag()
                    routes[core_tag] = (requester, tag)
                    inflight.add(tag)
                    item = (*item[:tag_at], core_tag, *item[tag_at + 1 :])
                routed.append(item)
            return routed

        def refused(core_tag: int, error: Exception) -> None:
            tag = UNREPORTED_TAG
            if core_tag != UNREPORTED_TAG:
                _, tag = routes.pop(core_tag)
                inflight.discard(tag)
            self._refuse(requester, tag, error)

        core = self.core
        submit_batch(core, route(transfers, 3), route(forwards, 5), route(ios, 4), route(timers, 1), [], refused)
        for tag, spec in nodes:  # before the joins that name them
            self._add_decode_node(requester, tag, spec)
        if joins:
            submit_batch(core, [], [], [], [], self._known_joins(requester, joins), refused)

    def _tally(
        self, booked: dict[tuple[tuple[int, ...], int], list[int]], transfers: list[Any], forwards: list[Any],
        ios: list[Any],
    ) -> None:  # fmt: skip
        """Book what a replaceable requester asked for as its ledger does (see Restarted processes)."""
        book = _booker(booked)
        for path, lane, size, _ in transfers:
            book(path, lane, size, 1)
        for n_layers, ranks, _, collectives, _, _ in forwards:
            for load, _, store in ranks:
                for hop in (load, store):
                    if hop is not None:
                        book(hop[0], hop[1], hop[2] * n_layers, n_layers)
            for path, lane, size in collectives:
                book(path, lane, size * n_layers, n_layers)
        for node, kind, lane, size, _ in ios:
            paths = self._storage_paths.get(node)
            if paths is not None:
                book(paths[0] if kind == "read" else paths[1], lane, size, 1)

    def _tallied(self, requester: _Requester) -> list[list[int]]:
        """``requester``'s tally: ``[port, lane, bytes, transfers]``, its decode nodes' own traffic included."""
        booked: dict[tuple[tuple[int, ...], int], list[int]] = {k: list(v) for k, v in (requester.booked or {}).items()}
        book = _booker(booked)
        for node, spec in requester.decode_specs.items():
            moved: dict[str, Any] = self.core.decode_bytes(node)
            for kind, paths, lane in (("d2h", spec.get("d2h_paths", ()), spec.get("kv_lane", 0)),
                                      ("a2a", spec.get("a2a_paths", ()), spec.get("a2a_lane", 0))):  # fmt: skip
                for path, (moved_bytes, moved_count) in zip(paths, moved[kind]):
                    if moved_count:
                        book(tuple(path), lane, moved_bytes, moved_count)
            written_bytes, written_count = moved["written"]
            storage = spec.get("storage_node")
            if written_count and storage is not None and storage in self._storage_paths:
                book(self._storage_paths[storage][1], spec.get("kv_lane", 0), written_bytes, written_count)
        ports: dict[tuple[int, int], list[int]] = {}
        by_port = _booker(ports)
        for (path, lane), (size, count) in booked.items():
            for port in path:
                by_port(port, lane, size, count)
        return [[port, lane, size, count] for (port, lane), (size, count) in sorted(ports.items())]

    def _add_decode_node(self, requester: _Requester, tag: int, spec: dict[str, Any]) -> None:
        core_tag = self.plane.new_tag()
        try:
            node = self.core.add_decode_node(report_tag=core_tag, **spec)
        except Exception as error:  # a bad spec: the core's error (or a keyword's type) goes back with its tag
            self._refuse(requester, tag, error)
            return
        requester.decode_nodes[tag] = node
        self._decode_routes[core_tag] = (requester, tag, node)
        if requester.booked is not None:
            requester.decode_specs[node] = spec

    def _known_joins(self, requester: _Requester, joins: list[tuple[int, ...]]) -> list[Any]:
        """``joins`` with the requester's node tags as the core's node ids; one naming no node of its is refused."""
        nodes, known = requester.decode_nodes, []
        for join in joins:
            node = nodes.get(join[0])
            if node is None:
                self._refuse(requester, UNREPORTED_TAG, ValueError(f"a join names decode node {join[0]}, which "
                                                                   "this process never added"))  # fmt: skip
            else:
                known.append((node, *join[1:]))
        return known

    def _refuse(self, requester: _Requester, tag: int, error: Exception) -> None:
        requester.refused += 1
        self.counters["refused"] += 1
        requester.errors.append([tag, type(error).__name__, str(error)])
        self._touch(requester)

    def _touch(self, requester: _Requester) -> None:
        if not requester.touched:
            requester.touched = True
            self._touched.append(requester)

    def _route(
        self, completions: list[tuple[str, int, int, int, int, int]]
    ) -> list[tuple[str, int, int, int, int, int]]:
        """Hand the completions of remote requests to their requesters; return the others."""
        routes, rest = self._routes, []
        for raw in completions:
            route = routes.pop(raw[1], None)
            if route is None:
                decode = self._decode_routes.get(raw[1])
                if decode is None:
                    rest.append(raw)
                else:  # a decode node's report: what ended, and what it moved so far
                    requester, tag, node = decode
                    requester.decoded.append([tag, *self.core.take_decoded(node), self.core.decode_bytes(node)])
                    self._touch(requester)
                continue
            requester, tag = route
            requester.inflight.discard(tag)
            requester.completed += 1
            requester.completions.append([raw[0], tag, raw[2], raw[3], raw[4], raw[5]])
            if not requester.touched:  # self._touch, inline: once per completion
                requester.touched = True
                self._touched.append(requester)
        self.counters["completions"] += len(completions) - len(rest)
        self._send_touched()
        if self._all_said_bye():
            self._check_drained()
        return rest

    def _send_touched(self) -> None:
        touched, self._touched = self._touched, []
        for requester in touched:
            requester.touched = False
            completions, errors, decoded = requester.completions, requester.errors, requester.decoded
            requester.completions, requester.errors, requester.decoded = [], [], []
            if requester.said_bye or requester.gone:
                self.counters["completions_dropped"] += len(completions)
                continue
            sent_ns = self.core.clock_ns()
            limit = MAX_REQUESTS_PER_MESSAGE
            for start in range(0, max(len(completions), len(decoded), 1), limit):
                end = start + limit
                self._send(requester.identity, [
                    PROTOCOL_VERSION, "done", sent_ns, completions[start:end], errors if start == 0 else [],
                    decoded[start:end],
                ])  # fmt: skip

    def _send(self, identity: bytes, message: list[Any]) -> None:
        payload = msgpack.packb(message, use_bin_type=True)
        frames = [identity, payload]
        if self._backlog:
            self._keep(frames)
        else:
            self._send_now(frames)

    def _keep(self, frames: list[bytes]) -> None:
        """Put ``frames`` at the end of the backlog; past its bounds the run fails and the frames are dropped."""
        if not self._backlog.keep(frames, len(frames[1])):
            self.counters["send_failures"] += 1
            if self.failure is None:
                stuck = self._requesters.get(self._backlog.items[0][0][0])
                self._fail(DataPlaneError(
                    f"data plane: {len(self._backlog):,} messages ({self._backlog.size_bytes:,} bytes) wait for "
                    f"process {stuck.name if stuck else '?'!r}, which does not take them: stuck, gone or far slower "
                    "than the run"
                ))  # fmt: skip

    def _send_now(self, frames: list[bytes]) -> bool:
        """Send at once; False (and the frames are kept) when the peer's queue is full."""
        socket = self._socket
        if socket is None:
            return True
        try:
            socket.send(frames[0], SNDMORE_NOBLOCK)
            socket.send(frames[1], NOBLOCK)
            self.counters["messages_sent"] += 1
        except zmq.Again:
            if frames[0] not in self._requesters:  # a refused peer that does not read: never hold its answers
                self.counters["send_failures"] += 1
                return True
            if not self._backlog or self._backlog.items[0][0] is not frames:
                self._keep(frames)
            self.loop.call_later(0.001 * self.plane.time_scale, self._drain_backlog)
            return False
        except zmq.ZMQError as error:  # EHOSTUNREACH: the peer is gone (ROUTER_MANDATORY)
            self.counters["send_failures"] += 1
            requester = self._requesters.get(frames[0])
            if requester is not None and requester.name in self.replaceable:
                self._gone(requester, "is unreachable (its process died)")
            else:
                _log.warning("data plane: a send failed: %s", error)
        finally:
            # The socket's descriptor is edge-triggered and a send may consume the edge that was to wake the
            # reader: look again at the next iteration (once, after every send of this one).
            if not self._recheck_due:
                self._recheck_due = True
                self.loop.call_soon(self._on_readable)
        return True

    def _drain_backlog(self) -> None:
        self._backlog.drain(self._send_now)

    def _schedule_heartbeat(self) -> None:
        self.loop.call_later(self.heartbeat_interval_s * self.plane.time_scale, self._heartbeat)

    def _heartbeat(self) -> None:
        if self._socket is None or self._done is None or self._done.done():
            return
        self._on_readable()  # what arrived while this loop was busy counts as heard
        now = time.monotonic()
        for requester in self._requesters.values():
            silent = now - requester.last_heard_s
            if requester.name in self.replaceable and not requester.said_bye and silent > self.heartbeat_timeout_s:
                # Its process died, or hangs (then its launcher ends the run): wait for the one started in its place.
                self._gone(requester, f"has not been heard from for {silent:.1f} s")
                if silent <= self.heartbeat_timeout_s + self.connect_timeout_s:
                    continue
            if not requester.said_bye and silent > self.heartbeat_timeout_s:
                self._fail(RequesterLost(
                    f"data plane: process {requester.name!r} (pid {requester.pid}) has not been heard from for "
                    f"{silent:.1f} s (heartbeat timeout {self.heartbeat_timeout_s} s): stopped, hung or gone"
                ))  # fmt: skip
                return
        if self.expected is not None and now - self._started_s > self.connect_timeout_s:
            missing = [name for name in self.expected if name not in self._by_name]
            if missing:
                self._fail(
                    DataPlaneError(f"data plane: processes {missing} did not connect within {self.connect_timeout_s} s")
                )
                return
        self._check_drained()
        self._schedule_heartbeat()

    def _fail(self, error: DataPlaneError) -> None:
        _log.error("%s", error)
        self.failure = error
        for requester in self._requesters.values():
            if not requester.said_bye and not requester.gone:
                self._send(requester.identity, [PROTOCOL_VERSION, "fatal", str(error)])
        if self._done is not None and not self._done.done():
            self._done.set_exception(error)

    def _all_said_bye(self) -> bool:
        if self.expected is not None:
            return all(name in self._by_name and self._by_name[name].said_bye for name in self.expected)
        return bool(self._requesters) and all(r.said_bye for r in self._requesters.values())

    def _check_drained(self) -> None:
        if self._done is None or self._done.done() or not self._all_said_bye():
            return
        clear_faults(self.core)  # the run is over, its faults with it: what they hold back may finish
        if self.core.pending() == 0:
            self._done.set_result("drained")
        elif self._drain_check is None:
            # Detached work ends without waking Python: look again shortly.
            def again() -> None:
                self._drain_check = None
                self._check_drained()

            self._drain_check = self.loop.call_later(DRAIN_CHECK_S * self.plane.time_scale, again)

    def report(self) -> dict[str, Any]:
        """What the run's checks and metrics read: ports, core stats, storage queues, lags, counters."""
        core = self.core
        state = core_state(core)
        return {
            "service": self.name,
            "clock_ns": state["clock_ns"],
            "time_scale": self.plane.time_scale,
            "pending": core.pending(),
            "ports": state["ports"],
            "core": core.stats(),
            "storage": state["storage"],
            "counters": dict(self.counters),
            "submission_lag_ns": self.submission_lag.summary(),
            "submission_lag": self.submission_lag.to_wire(),
            "requesters": {
                r.name: {
                    "pid": r.pid, "batches": r.batches, "requests": r.requests, "completed": r.completed,
                    "refused": r.refused, "in_flight": len(r.inflight), "said_bye": r.said_bye,
                    "incarnation": r.incarnation, "submission_lag_ns": r.submission_lag.summary(),
                }  # fmt: skip
                for r in self._requesters.values()
            },
            "replaced": [
                {"name": r.name, "incarnation": r.incarnation, "pid": r.pid, "batches": r.batches,
                 "requests": r.requests, "completed": r.completed, "in_flight": len(r.inflight),
                 "booked": self._tallied(r)}
                for r in self._replaced
            ],
            "rejections": list(self.rejections),
            "wall_s": round(time.monotonic() - self._started_s, 3),
        }  # fmt: skip
