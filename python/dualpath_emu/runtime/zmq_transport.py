"""The ZeroMQ transport: actors of several :class:`ActorSystem`\\ s talk over ``ipc://`` or ``tcp://``.

A :class:`ZmqActorSystem` is an actor system on a real-time loop that owns one ROUTER endpoint (``bind``, by default
``tcp://127.0.0.1:*``) and one DEALER per remote endpoint, reaching other systems' actors through a static address
book. Only tells travel, FIFO per pair of systems, exactly once while both ends live (the frames: docs/wire.md).

**Security** (docs/live.md): with ``keys`` and ``name`` CURVE both ways and a ZAP handler admitting the run's keys
only; a process speaks only as itself (a sender neither :data:`~dualpath_emu.runtime.actors.MAIN` nor one of its
actors is rejected); without keys only private ``ipc://`` unless ``insecure=True``. **Bounds**: ``HWM`` messages per
peer, frames up to the codec's limit plus :data:`FRAME_OVERHEAD_BYTES`, then a backlog of ``BACKLOG_MESSAGES`` and
``BACKLOG_BYTES`` beyond which a tell raises :class:`BacklogFullError` (nothing accepted is dropped). A frame the
receiver cannot accept is dropped, counted (``transport.rejected``), logged boundedly and recorded as a ``rejected``
event of actor ``transport``. **Incarnations**: with ``restart_crashed`` a request meant for a process that died is
dropped (``transport.stale``). **Durable event log**: events reach the sink before any message to another process
leaves, so a process killed at any moment has written every observation a message it sent could have told."""

from __future__ import annotations

import asyncio
import time
import logging
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import ClassVar, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import zmq
import zmq.asyncio

from dualpath_emu.errors import SecurityError
from dualpath_emu.messages import Codec, Envelope, Message, MessageError
from dualpath_emu.runtime.actors import MAIN, ActorError, ActorSystem, _describe
from dualpath_emu.runtime.core_work import CoreWork
from dualpath_emu.runtime.security import BoundedLog, RunAuthenticator, RunKeys, check_private_ipc, is_wildcard
from dualpath_emu.runtime.security import start_authenticator

__all__ = ["BACKLOG_BYTES", "BACKLOG_MESSAGES", "DEFAULT_BIND", "HWM", "BacklogFullError", "ZmqActorSystem"]

DEFAULT_BIND: Final = "tcp://127.0.0.1:*"
"""Where a :class:`ZmqActorSystem` binds unless told otherwise: loopback, a free port."""

TRANSPORT_ACTOR: Final = "transport"  # The actor name of the transport's own events (``rejected``).

REJECTED_COUNTER: Final = "transport.rejected"
DENIED_COUNTER: Final = "transport.denied"
SEND_FAILED_COUNTER: Final = "transport.send_failed"

KIND_TELL: Final = b"tell"

HWM: Final = 10_000
"""The high-water marks (messages per peer) of every socket: ~1 MB per peer and direction."""

BACKLOG_MESSAGES: Final = 1_000_000
"""The most messages a connection holds in this process beyond ZeroMQ's queue (see Bounds)."""

BACKLOG_BYTES: Final = 256 << 20
"""The most frame bytes a connection holds beyond ZeroMQ's queue (a message alone always fits)."""

FRAME_OVERHEAD_BYTES: Final = 1024
"""``MAXMSGSIZE`` is the codec's ``max_frame_bytes`` plus this (CURVE adds 33 bytes a frame)."""

RECEIVE_BATCH: Final = 256  # At most this many messages are taken from a socket before the loop runs others.

RECEIVE_BATCH_BYTES: Final = 4 << 20
"""... and at most about this many bytes (a batch of long frames is held whole until it is handled)."""

REJECTIONS_LOGGED: Final = 100  # Rejected frames and failed sends logged and recorded one by one before summaries.

STALE_COUNTER: Final = "transport.stale"
MSG_IDS_PER_INCARNATION: Final = 10**12
"""Incarnation ``n`` of a process numbers its messages from ``n × 10**12 + 1`` (see Incarnations)."""
_NO_KNOWLEDGE: Final = b"\x80"
"""The knowledge frame of a system that knows of no restarted process (an empty msgpack map)."""
MAX_KNOWLEDGE_BYTES: Final = 64 << 10

_log = logging.getLogger(__name__)


class BacklogFullError(ActorError):
    """A tell to a remote actor whose connection's backlog is full: nothing was sent (the peer is gone or stuck)."""


class ZmqActorSystem(ActorSystem):
    """An actor system on a real-time loop reaching other systems' actors over ZeroMQ (see the module): ``bind`` its
    ROUTER endpoint, ``address_book`` remote actor -> endpoint, ``peers`` endpoint -> process, ``keys`` as process
    ``name``. Use ``async with`` inside the loop; :class:`SecurityError` for an endpoint the rules refuse."""

    def __init__(
        self, codec: Codec, *, bind: str = DEFAULT_BIND, address_book: Mapping[str, str] | None = None,
        peers: Mapping[str, str] | None = None, keys: RunKeys | None = None, name: str | None = None,
        insecure: bool = False, latency_s: float = 0.0, failure_events: int = 20, data_plane: CoreWork | None = None,
        incarnation: int | None = None,
    ) -> None:  # fmt: skip
        super().__init__(latency_s=latency_s, failure_events=failure_events, data_plane=data_plane)
        if incarnation is not None and (name is None or incarnation < 0):
            raise ValueError("incarnation= needs name= (this process's name in the run) and is 0, 1, 2, …")
        if keys is not None:
            if name is None:
                raise SecurityError("a ZmqActorSystem with keys needs name=, this process's name in the run")
            if name != keys.own:
                keys = keys.as_process(name)
            for process in (peers or {}).values():
                keys.public_key(process)  # SecurityError for a process that is not in the run
        self.codec = codec
        self.keys = keys
        self.name = name
        self.insecure = insecure
        self.bind_address = bind
        self.address_book: dict[str, str] = {}
        self.peers: dict[str, str] = dict(peers or {})
        self._check_endpoint(bind, "bind")
        for actor, endpoint in (address_book or {}).items():
            self.add_route(actor, endpoint)
        self._counters: dict[str, int] = {REJECTED_COUNTER: 0, SEND_FAILED_COUNTER: 0}
        self._endpoint: str | None = None
        self._context: zmq.asyncio.Context | None = None
        self._authenticator: RunAuthenticator | None = None
        self._denied = 0
        self._router: _Channel | None = None
        self._dealers: dict[str, _Channel] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._senders: dict[bytes, frozenset[str]] | None = None
        """Named: each process of the run (its routing id) -> the senders it may name (built when first needed)."""
        who = self._who()
        self._rejections = BoundedLog(_log, f"{who}: rejected a frame", first=REJECTIONS_LOGGED)
        self._send_failures = BoundedLog(_log, f"{who}: a ZeroMQ send failed", first=REJECTIONS_LOGGED)
        self._closed = False
        self.last_delivery_ns = time.monotonic_ns()
        """The wall clock (monotonic) when a message from another system last arrived here."""
        self.incarnation = incarnation
        """This process's incarnation (see Incarnations in the module); ``None``: requests are not tagged."""
        self._knowledge: dict[str, int] = {}
        """Actors of other processes -> the incarnation of their process this one has heard of (nonzero only)."""
        self._knowledge_frames: dict[str, bytes] = {}  # sender -> its requests' third frame
        self._last_tag: tuple[bytes, dict[str, int]] = (_NO_KNOWLEDGE, {})
        if incarnation is not None:
            self._counters[STALE_COUNTER] = 0
            if incarnation > 0:
                self._next_msg_id = incarnation * MSG_IDS_PER_INCARNATION + 1
        self._unsynced = False
        """An actor recorded something that the event sink has not been handed (see Durable event log)."""

    @property
    def rejected(self) -> int:
        """How many frames were rejected (the ``transport.rejected`` counter)."""
        return self._counters[REJECTED_COUNTER]

    @property
    def denied(self) -> int:
        """How many handshakes the ZAP handler denied (with keys; the ``transport.denied`` counter)."""
        authenticator = self._authenticator
        return authenticator.denied if authenticator is not None else self._denied

    @property
    def counters(self) -> dict[str, int]:
        """The counters ``transport.rejected``, ``transport.denied`` and ``transport.send_failed``."""
        return {**self._counters, DENIED_COUNTER: self.denied}

    @property
    def endpoint(self) -> str:
        """The endpoint actually bound (a ``*`` port resolved); only after :meth:`open`."""
        if self._endpoint is None:
            raise RuntimeError("the transport is not open")
        return self._endpoint

    def add_route(self, actor: str, endpoint: str, process: str | None = None) -> None:
        """Route messages for the remote ``actor`` to ``endpoint``, the endpoint of ``process``."""
        if process is not None:
            if self.keys is not None:
                self.keys.public_key(process)
            self.peers[endpoint] = process
        self._check_endpoint(endpoint, "connect")
        self.address_book[actor] = endpoint
        self._senders = None  # who may send as whom changed

    def _sender_sets(self) -> dict[bytes, frozenset[str]]:
        """Each other process of the run (its routing id) -> the senders it may name: ``main`` and its actors."""
        processes = set(self.peers.values()) | set(self.keys.names if self.keys is not None else ())
        processes.discard(self.name)  # this process's requests never come over the wire
        actors: dict[str, set[str]] = {process: {MAIN} for process in processes}
        for actor, endpoint in self.address_book.items():
            process = self.peers.get(endpoint)
            if process in actors and actor not in self._actors:
                actors[process].add(actor)
        self._senders = {process.encode(): frozenset(names) for process, names in actors.items()}
        return self._senders

    def _whose(self, actor: str) -> str:
        """Whose actor ``actor`` is, for a rejection's reason."""
        if actor in self._actors:
            return "an actor of this process"
        process = self.peers.get(self.address_book.get(actor, ""))
        return f"an actor of process {process!r}" if process is not None else "no actor of the run"

    def _who(self) -> str:
        return f"process {self.name!r}" if self.name is not None else (self._endpoint or self.bind_address)

    def _check_endpoint(self, endpoint: str, role: str) -> None:
        """Refuse what the security rules refuse (see the module): for a bind or a connection (``role``)."""
        if self.keys is not None:
            if role == "connect" and endpoint not in self.peers:
                raise SecurityError(
                    f"{endpoint}: which process of the run is it? With keys, give it in peers= (endpoint -> "
                    "process name) or add_route(actor, endpoint, process): the connection needs its public key"
                )
            return
        if self.insecure:
            return
        if endpoint.startswith("tcp://"):
            raise SecurityError(
                f"{endpoint}: a tcp:// endpoint without keys would let any local process send messages that actors "
                "act on; give keys=RunKeys.load(...) and name=, use ipc:// in a private directory, or pass "
                "insecure=True"
            )
        if endpoint.startswith("ipc://"):
            check_private_ipc(endpoint)

    def record(self, actor: str, kind: str, summary: str) -> None:
        self._unsynced = True
        super().record(actor, kind, summary)

    def _sync_events(self) -> None:
        """Before a message leaves for another process: hand the event sink what was recorded."""
        if self._unsynced and self._sink is not None:
            self._unsynced = False
            self.flush_events()

    def _merge(self, known: Mapping[str, int]) -> None:
        """Learn the newer incarnations in ``known`` (see Incarnations in the module)."""
        for actor, incarnation in known.items():
            if incarnation > self._knowledge.get(actor, 0) and actor not in self._actors:
                self._knowledge[actor] = incarnation
                self._knowledge_frames.clear()
                ActorSystem.record(self, TRANSPORT_ACTOR, "incarnation", f"{actor} is incarnation {incarnation}")

    def _read_knowledge(self, frame: bytes | None) -> dict[str, int]:
        """The knowledge a request's third frame carries (``None``: untagged); :class:`MessageError` if bad."""
        if frame is None or frame == _NO_KNOWLEDGE:
            return {}
        last = self._last_tag
        if frame == last[0]:
            return last[1]
        if len(frame) > MAX_KNOWLEDGE_BYTES:
            raise MessageError(f"an incarnation frame of {len(frame)} bytes")
        try:
            known = msgpack.unpackb(frame)
        except Exception as error:
            raise MessageError(f"a malformed incarnation frame: {type(error).__name__}") from None
        if type(known) is not dict or not all(
            type(k) is str and type(v) is int and 0 <= v < MSG_IDS_PER_INCARNATION for k, v in known.items()
        ):
            raise MessageError("an incarnation frame that is not a map of actor names to incarnations")
        self._last_tag = (frame, known)
        return known

    def _frames(self, kind: bytes, data: bytes, sender: str) -> list[bytes]:
        """A request's frames, with incarnations what ``sender`` knows of them as the third."""
        incarnation = self.incarnation
        if incarnation is None:
            return [kind, data]
        frame = self._knowledge_frames.get(sender)
        if frame is None:
            known = dict(self._knowledge)
            if incarnation > 0 and sender in self._actors:
                known[sender] = incarnation
            frame = self._knowledge_frames[sender] = msgpack.packb(known) if known else _NO_KNOWLEDGE
        return [kind, data, frame]

    async def open(self) -> None:
        """Bind the ROUTER socket and start receiving (inside the running, real-time loop)."""
        if self._context is not None or self._closed:
            raise RuntimeError("the transport is already open (or closed)")
        self.loop  # bind the system to this loop
        self._context = zmq.asyncio.Context()
        try:
            if self.keys is not None:
                # Before the bind: a CURVE server with no ZAP handler would admit any key (were ZAP_ENFORCE_DOMAIN
                # not set); this one admits the run's keys only.
                self._authenticator = start_authenticator(self._context, self.keys)
            socket = self._socket(zmq.ROUTER)
            socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full or vanished peer is an error, not a silent drop
            if self.keys is not None:
                self.keys.make_server(socket)
            router = self._router = _Channel(socket, self._send_failed)
            socket.bind(self.bind_address)
        except BaseException:
            self._close_sockets()
            raise
        endpoint = socket.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(endpoint, bytes)
        self._endpoint = endpoint.decode()
        who = self._who()
        self._rejections.what = f"{who}: rejected a frame at {self._endpoint}"
        secured = "" if self.keys is not None else ", without keys: anyone who can reach it can send messages"
        if self.bind_address.startswith("tcp://") and is_wildcard(self.bind_address):
            _log.warning("%s: listening on all interfaces (%s)%s", who, self._endpoint, secured)
        elif self.keys is None and self.insecure and not self.bind_address.startswith(("ipc://", "inproc://")):
            _log.warning("%s: listening on %s without keys (insecure=True)", who, self._endpoint)
        self._tasks.append(self.loop.create_task(router.receive(self._on_request, self._reject), name="zmq:router"))

    async def close(self) -> None:
        """Stop receiving and close every socket (pending sends are discarded). Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks, self._tasks = self._tasks, []
        channels = [*self._dealers.values(), *([self._router] if self._router is not None else [])]
        tasks += [channel.drain for channel in channels if channel.drain is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._close_sockets()
        for bounded in (self._rejections, self._send_failures):
            bounded.flush()

    def _close_sockets(self) -> None:
        for channel in [*self._dealers.values(), *([self._router] if self._router is not None else [])]:
            channel.close()
        self._dealers.clear()
        self._router = None
        if self._authenticator is not None:  # after the sockets it admitted peers to, before the context
            self._authenticator.stop()
            self._denied = self._authenticator.denied
            self._authenticator = None
        if self._context is not None:
            self._context.term()
            self._context = None

    async def __aenter__(self) -> ZmqActorSystem:
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()
        await self.close()

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        assert self._context is not None
        socket = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, HWM)
        socket.setsockopt(zmq.RCVHWM, HWM)
        # A longer inbound frame closes its connection before it is allocated (see Bounds in the module).
        socket.setsockopt(zmq.MAXMSGSIZE, self.codec.max_frame_bytes + FRAME_OVERHEAD_BYTES)
        return socket

    def _is_remote(self, recipient: str) -> bool:
        return recipient not in self._actors and recipient in self.address_book

    def tell(self, recipient: str, msg: Message, *, sender: str = MAIN) -> None:
        """Send ``msg`` to a local or remote ``recipient`` and return at once.

        Raises :class:`BacklogFullError` (nothing sent) when the remote recipient's connection is backed up
        beyond its bound (see Bounds in the module)."""
        if not self._is_remote(recipient):
            super().tell(recipient, msg, sender=sender)
            return
        envelope = Envelope(sender, recipient, self._new_msg_id(), msg)
        data = self.codec.encode_envelope(envelope)  # MessageError at the sender for an invalid message
        endpoint = self.address_book[recipient]
        dealer = self._dealer(endpoint)
        self._sync_events()
        if not dealer.post(self._frames(KIND_TELL, data, sender), self.loop):
            raise BacklogFullError(
                f"tell #{envelope.msg_id} to {recipient!r}: the connection to {self._peer_label(endpoint)} holds "
                f"{len(dealer.backlog):,} messages ({dealer.backlog_bytes:,} bytes) beyond ZeroMQ's queue of "
                f"{HWM:,}: its peer is gone, stuck or far too slow; nothing was sent"
            )
        if self.record_messages:  # (the transport's own line: not an observation)
            ActorSystem.record(self, sender, "tell", _describe(envelope))

    def _peer_label(self, endpoint: str) -> str:
        process = self.peers.get(endpoint)
        return f"process {process!r} at {endpoint}" if process is not None else endpoint

    def _dealer(self, endpoint: str) -> _Channel:
        dealer = self._dealers.get(endpoint)
        if dealer is None:
            if self._context is None:
                raise RuntimeError("the transport is not open")
            socket = self._socket(zmq.DEALER)
            if self.keys is not None:
                self.keys.make_client(socket, self.peers[endpoint])
            if self.name is not None:  # the peer's ROUTER knows this connection as this process (see _on_request)
                socket.setsockopt(zmq.ROUTING_ID, self.name.encode())
            socket.connect(endpoint)
            dealer = self._dealers[endpoint] = _Channel(socket, self._send_failed)
            receiver = dealer.receive(self._on_dealer, self._reject)
            self._tasks.append(self.loop.create_task(receiver, name=f"zmq:{endpoint}"))
        return dealer

    def _send_failed(self, error: zmq.ZMQError) -> None:
        self._counters[SEND_FAILED_COUNTER] += 1
        self._send_failures.note(str(error))

    def _reject(self, reason: str) -> None:
        self._counters[REJECTED_COUNTER] += 1
        text = self._rejections.note(reason)
        if text is not None:  # the first ones and the power-of-ten summaries only: bounded under a flood
            self.record(TRANSPORT_ACTOR, "rejected", text)

    def _on_request(self, frames: list[bytes]) -> None:
        identity, rest = frames[0], frames[1:]
        senders: frozenset[str] | None = None
        if self.name is not None:
            # Before decoding: a stranger's connection costs one look-up (see Security in the module).
            senders = (self._senders if self._senders is not None else self._sender_sets()).get(identity)
            if senders is None:
                self._reject(f"a connection under routing id {identity[:64]!r}, which no process of the run has")
                return
        tag: bytes | None = None
        if self.incarnation is not None and len(rest) == 3:
            tag = rest.pop()
        if len(rest) != 2 or rest[0] != KIND_TELL:
            kind = f" of kind {rest[0][:16]!r}" if rest else ""
            self._reject(f"expected frames [tell, envelope], got {len(rest)} frame(s){kind}")
            return
        try:
            envelope = self.codec.decode_envelope(rest[1])
        except MessageError as error:
            self._reject(str(error))
            return
        if senders is not None and envelope.sender not in senders:
            # A process speaks only for itself: an actor of another process, of this one, or of none would have
            # this one act on what no process of the run said (turns done, NICs down, a run stopped).
            self._reject(f"sender {envelope.sender[:64]!r} ({self._whose(envelope.sender)}) in a request from "
                         f"process {identity.decode(errors='replace')!r}: {_describe(envelope)[:200]}")  # fmt: skip
            return
        summary = _describe(envelope)
        if self.incarnation is not None:
            try:
                known = self._read_knowledge(tag)
            except MessageError as error:
                self._reject(str(error))
                return
            if known.get(envelope.recipient, 0) < self.incarnation:
                # Sent to an incarnation of this process that died: lost with it (see Incarnations).
                self._counters[STALE_COUNTER] += 1
                self._drop(envelope, summary)
                return
        else:
            known = {}
        target = self._actors.get(envelope.recipient)
        if target is None:
            self._reject(f"no actor {envelope.recipient!r} here ({summary})")
            return
        if known and not target.stopped and any(v > self._knowledge.get(k, 0) and k not in self._actors
                                                for k, v in known.items()):  # fmt: skip
            self._merge(known)  # handled here, now: this process knows it from now on (see Incarnations)
        self.last_delivery_ns = time.monotonic_ns()
        self._deliver(target, envelope, summary)

    def _on_dealer(self, frames: list[bytes]) -> None:
        self._reject(f"{len(frames)} frame(s) on a connection this process opened (nothing is sent back on one)")


class _Channel:
    """One socket of the transport: sends keep their order without awaiting (at once, else into a bounded backlog a task
    drains); receives come in batches; flags go as plain ints (pyzmq's enums cost more)."""

    __slots__ = ("socket", "sync", "backlog", "backlog_bytes", "drain", "recheck_due", "on_send_error")

    _SEND_MORE: ClassVar[int] = int(zmq.SNDMORE | zmq.NOBLOCK)
    _NOBLOCK: ClassVar[int] = int(zmq.NOBLOCK)

    def __init__(self, socket: zmq.asyncio.Socket, on_send_error: Callable[[zmq.ZMQError], None]) -> None:
        self.socket = socket
        self.sync: zmq.Socket[bytes] = zmq.Socket.shadow(socket.underlying)  # same socket, blocking API
        self.backlog: deque[list[bytes]] = deque()
        self.backlog_bytes = 0
        self.drain: asyncio.Task[None] | None = None
        self.recheck_due = False
        self.on_send_error = on_send_error

    def post(self, frames: list[bytes], loop: asyncio.AbstractEventLoop) -> bool:
        """Send ``frames`` now or queue them after the backlog; False (nothing queued) if the backlog is full."""
        if not self.backlog:
            try:
                # send_multipart(frames, NOBLOCK), frame by frame. ZeroMQ checks the high-water mark (and a
                # ROUTER the peer) on a message's first frame: Again or an error leaves nothing queued.
                send, last = self.sync.send, len(frames) - 1
                for index in range(last):
                    send(frames[index], self._SEND_MORE)
                send(frames[last], self._NOBLOCK)
                return True
            except zmq.Again:
                pass  # the peer's queue is full (or not there yet): keep the order through the backlog
            except zmq.ZMQError as error:
                self.on_send_error(error)
                return True
            finally:
                self._recheck_soon(loop)
        size = sum(len(frame) for frame in frames)
        if self.backlog and (len(self.backlog) >= BACKLOG_MESSAGES or self.backlog_bytes + size > BACKLOG_BYTES):
            return False
        self.backlog.append(frames)
        self.backlog_bytes += size
        if self.drain is None:
            self.drain = loop.create_task(self._drain(), name="zmq:drain")
        return True

    def _recheck_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        # The socket's file descriptor is edge-triggered, and a send may consume the edge that was to wake the
        # pending recv of `receive` (a message that arrived meanwhile would then wait for the next edge,
        # perhaps forever). Reading EVENTS through the asyncio socket makes pyzmq look again, as its own sends
        # do. Once per loop iteration, after the sends made in it, is enough: pyzmq only schedules its handler
        # for a later iteration when it finds something, and reading EVENTS costs more than the send.
        if not self.recheck_due:
            self.recheck_due = True
            loop.call_soon(self._recheck)

    def _recheck(self) -> None:
        self.recheck_due = False
        if not self.socket.closed:
            self.socket.get(zmq.EVENTS)

    async def _drain(self) -> None:
        # Non-blocking sends while the socket takes them (as `post` does: a future per message would cost more
        # than the message), one awaited send when it does not, which waits until it does.
        send, send_more, noblock = self.sync.send, self._SEND_MORE, self._NOBLOCK
        loop = asyncio.get_running_loop()
        try:
            while self.backlog:
                frames = self.backlog[0]
                try:
                    last = len(frames) - 1
                    for index in range(last):
                        send(frames[index], send_more)
                    send(frames[last], noblock)
                    self._recheck_soon(loop)
                except zmq.Again:
                    try:
                        await self.socket.send_multipart(frames)
                    except zmq.ZMQError as error:
                        self.on_send_error(error)
                except zmq.ZMQError as error:
                    self.on_send_error(error)
                self.backlog.popleft()
                self.backlog_bytes -= sum(len(frame) for frame in frames)
        finally:
            self.drain = None

    def close(self) -> None:
        """Close the socket (``linger=0``)."""
        self.socket.close(linger=0)

    async def receive(self, handle: Callable[[list[bytes]], None], reject: Callable[[str], None]) -> None:
        recv, noblock = self.sync.recv, self._NOBLOCK
        while True:
            batch = [await self.socket.recv_multipart()]
            size = sum(len(frame) for frame in batch[0])
            while len(batch) < RECEIVE_BATCH and size < RECEIVE_BATCH_BYTES:
                # recv_multipart(NOBLOCK), frame by frame; a message's frames arrive together, so only its
                # first can be missing.
                try:
                    frame = recv(noblock, copy=False)
                except zmq.Again:
                    break
                frames = [frame.bytes]
                while frame.more:
                    frame = recv(noblock, copy=False)
                    frames.append(frame.bytes)
                size += len(frames[-1])
                batch.append(frames)
            for frames in batch:
                try:
                    handle(frames)
                except Exception as error:  # never let one frame end the receiver
                    reject(f"{type(error).__name__}: {error}")
            batch.clear()
            await asyncio.sleep(0)  # let the actors run between batches
