"""The ZeroMQ transport (issue 3): actors of several :class:`ActorSystem`\\ s talk over ``ipc://`` or ``tcp://``.

A :class:`ZmqActorSystem` is an :class:`~dualpath_emu.runtime.ActorSystem` for a real-time asyncio loop
(not the :class:`~dualpath_emu.runtime.VirtualTimeLoop`) that also owns one ZeroMQ endpoint. Its own actors
are reached in-process as usual; an actor of another system is reached through a static address book
(actor name -> endpoint)::

    registry = MessageRegistry(); registry.register(Ping); registry.register(Pong)
    async with ZmqActorSystem(Codec(registry), bind="ipc:///tmp/run/a.sock",
                              address_book={"echo": "ipc:///tmp/run/b.sock"}) as system:
        pong = await system.ask("echo", Ping(1), timeout_s=1.0)

``bind`` defaults to ``tcp://127.0.0.1:*`` (loopback, a free port; :attr:`ZmqActorSystem.endpoint` is the
address actually bound): nothing listens beyond the host unless the caller binds elsewhere.
:func:`register_transport_messages` adds the transport's own message types (:class:`ErrorReply`,
:class:`NoneReply`) to the codec's registry; the system calls it on construction.

Sockets and wire format
-----------------------
Each system binds one ``ROUTER`` socket and opens one ``DEALER`` per remote endpoint it sends to (lazily,
on first use). Every ZeroMQ message is two frames ``[kind, envelope]``:

* ``kind`` is ``b"tell"`` or ``b"ask"`` (DEALER -> ROUTER: a request) or ``b"reply"`` (ROUTER -> the
  asking DEALER, through the identity the ask came from);
* ``envelope`` is :meth:`Codec.encode_envelope` of the :class:`~dualpath_emu.messages.Envelope`. A request
  carries the sender's ``msg_id`` and ``reply_to = None``; a reply carries the replier's own ``msg_id`` and
  ``reply_to`` = the ask's ``msg_id``. The body of a reply is the handler's return value, :class:`NoneReply`
  when it returned ``None``, or :class:`ErrorReply` ``(type_name, text)`` when the ask failed.

An :class:`ErrorReply` is rebuilt at the asker as: the builtin exception of that name with the text as its
only argument (``ValueError("bad")`` arrives as ``ValueError("bad")``); :class:`ActorStoppedError` and
:class:`UnknownActorError` as themselves (same text, ``actor`` set); anything else as :class:`RemoteError`
(``type_name`` and ``text`` kept). Tracebacks do not travel.

Delivery is FIFO per (sending system, receiving system) pair -- one DEALER-ROUTER connection -- and
exactly once while both ends live: nothing is retried. ``tell`` never blocks: a frame goes to the socket at
once (non-blocking) or, when the peer's queue is full (``HWM`` messages), into an in-order backlog that a
task drains. The ROUTER is ``ROUTER_MANDATORY``, so a reply it cannot route is logged rather than
silently lost. A receiver takes up to ``RECEIVE_BATCH`` queued frames per wake-up. An ask whose remote recipient stops before
answering gets :class:`ActorStoppedError` (if the actor stopped itself, the handler's own answer still
follows, and the asker drops it as ``late``); one whose recipient's process is gone waits for its
``timeout_s`` (give one to every remote ask).

Rejection
---------
A frame the receiving side cannot accept -- not two frames, an unknown ``kind``, bytes
:meth:`Codec.decode_envelope` refuses (malformed or truncated msgpack, unknown message type, wrong
version, bad fields: any :class:`MessageError`), a request for an actor this system does not host, a reply
to nothing -- is dropped, logged (``logging`` at WARNING, logger ``dualpath_emu.runtime.zmq_transport``),
counted (:attr:`ZmqActorSystem.rejected`, the ``transport.rejected`` counter of :attr:`~ZmqActorSystem.counters`)
and recorded as a ``rejected`` event of actor ``transport``. An ask for an unknown actor is also answered
with :class:`UnknownActorError` (its sender waits for nothing). No actor is disturbed.

Events: a remote send records ``tell``/``ask`` like an in-process one; arrival records ``deliver``; the
callee records ``reply``/``error``; the asker records ``answer``/``late``. Times are the real loop's clock,
so (unlike in virtual time) the record is not reproducible run to run.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar, Final

import zmq
import zmq.asyncio

from dualpath_emu.messages import Codec, Envelope, Message, MessageError, MessageRegistry
from dualpath_emu.runtime.actors import (
    MAIN,
    Actor,
    ActorError,
    ActorStoppedError,
    ActorSystem,
    UnknownActorError,
    _describe,
    _Pending,
    _Reply,
    _Request,
)
from dualpath_emu.runtime.virtual_loop import VirtualTimeLoop

__all__ = [
    "DEFAULT_BIND",
    "ErrorReply",
    "NoneReply",
    "RemoteError",
    "ZmqActorSystem",
    "error_from_wire",
    "error_to_wire",
    "register_transport_messages",
]

DEFAULT_BIND: Final = "tcp://127.0.0.1:*"
"""Where a :class:`ZmqActorSystem` binds unless told otherwise: loopback, a free port."""

TRANSPORT_ACTOR: Final = "transport"
"""The actor name of the transport's own events (``rejected``)."""

REJECTED_COUNTER: Final = "transport.rejected"

KIND_TELL: Final = b"tell"
KIND_ASK: Final = b"ask"
KIND_REPLY: Final = b"reply"

HWM: Final = 100_000
"""The send and receive high-water marks (messages queued per peer) of every socket."""

RECEIVE_BATCH: Final = 256
"""At most this many messages are taken from a socket before the loop runs others."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ErrorReply(Message):
    """The wire form of an exception that answers an ask: its class name and its text."""

    WIRE_NAME: ClassVar[str] = "runtime.ErrorReply"
    VERSION: ClassVar[int] = 1

    type_name: str
    text: str


@dataclass(frozen=True, slots=True)
class NoneReply(Message):
    """The wire form of a handler's ``None`` answering an ask."""

    WIRE_NAME: ClassVar[str] = "runtime.NoneReply"
    VERSION: ClassVar[int] = 1


class RemoteError(ActorError):
    """An exception raised by a remote handler for an ask, of a type that is not rebuilt (see the module)."""

    def __init__(self, type_name: str, text: str) -> None:
        super().__init__(f"{type_name}: {text}")
        self.type_name = type_name
        self.text = text


def register_transport_messages(registry: MessageRegistry) -> None:
    """Register :class:`ErrorReply` and :class:`NoneReply` in ``registry`` (once; later calls do nothing)."""
    for cls in (ErrorReply, NoneReply):
        if cls not in registry:
            registry.register(cls)


def error_to_wire(error: BaseException) -> ErrorReply:
    """The :class:`ErrorReply` of ``error``."""
    if isinstance(error, RemoteError):
        return ErrorReply(error.type_name, error.text)
    return ErrorReply(type(error).__name__, str(error))


def error_from_wire(reply: ErrorReply, sender: str) -> Exception:
    """The exception an :class:`ErrorReply` from actor ``sender`` is rebuilt as (see the module docstring)."""
    name, text = reply.type_name, reply.text
    if name in (ActorStoppedError.__name__, UnknownActorError.__name__):
        cls: type[ActorError] = ActorStoppedError if name == ActorStoppedError.__name__ else UnknownActorError
        rebuilt = cls.__new__(cls)
        Exception.__init__(rebuilt, text)
        rebuilt.actor = sender  # type: ignore[attr-defined]  # both classes set it in __init__
        return rebuilt
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        try:
            return builtin(text)
        except Exception:  # a builtin whose constructor takes other arguments (UnicodeDecodeError)
            pass
    return RemoteError(name, text)


class _RemoteAsk:
    """An ask that arrived over the wire and is not answered yet: where its answer goes."""

    __slots__ = ("envelope", "identity")

    def __init__(self, envelope: Envelope, identity: bytes) -> None:
        self.envelope = envelope
        self.identity = identity


class ZmqActorSystem(ActorSystem):
    """An actor system on a real-time loop that reaches the actors of other systems over ZeroMQ.

    ``codec`` encodes and decodes envelopes (the transport's message types are registered in its registry);
    ``bind`` is the endpoint of this system's ROUTER (``ipc://path`` or ``tcp://host:port``, ``*`` for a free
    port; default loopback); ``address_book`` maps the names of remote actors to their systems' endpoints
    (:meth:`add_route` adds more). Use ``async with`` (or :meth:`open` and :meth:`close`) inside the loop.
    """

    def __init__(
        self,
        codec: Codec,
        *,
        bind: str = DEFAULT_BIND,
        address_book: Mapping[str, str] | None = None,
        latency_s: float = 0.0,
        failure_events: int = 20,
        seed: int = 0,
    ) -> None:
        super().__init__(latency_s=latency_s, failure_events=failure_events, seed=seed)
        register_transport_messages(codec._registry)
        self.codec = codec
        self.bind_address = bind
        self.address_book: dict[str, str] = dict(address_book or {})
        self.counters: dict[str, int] = {REJECTED_COUNTER: 0}
        self._endpoint: str | None = None
        self._context: zmq.asyncio.Context | None = None
        self._router: _Channel | None = None
        self._dealers: dict[str, _Channel] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._remote_asks: dict[int, _RemoteAsk] = {}  # id(request envelope) -> route of its answer
        self._closed = False

    # --- life ----------------------------------------------------------------------------------------

    @property
    def rejected(self) -> int:
        """How many frames were rejected (the ``transport.rejected`` counter)."""
        return self.counters[REJECTED_COUNTER]

    @property
    def endpoint(self) -> str:
        """The endpoint actually bound (a ``*`` port resolved); only after :meth:`open`."""
        if self._endpoint is None:
            raise RuntimeError("the transport is not open")
        return self._endpoint

    def add_route(self, actor: str, endpoint: str) -> None:
        """Route messages for the remote ``actor`` to ``endpoint``."""
        self.address_book[actor] = endpoint

    async def open(self) -> None:
        """Bind the ROUTER socket and start receiving (inside the running, real-time loop)."""
        if self._context is not None or self._closed:
            raise RuntimeError("the transport is already open (or closed)")
        if isinstance(asyncio.get_running_loop(), VirtualTimeLoop):
            raise RuntimeError("the ZeroMQ transport runs on a real-time loop, not a VirtualTimeLoop")
        self.loop  # bind the system to this loop
        self._context = zmq.asyncio.Context()
        socket = self._socket(zmq.ROUTER)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full or vanished peer is an error, not a silent drop
        router = self._router = _Channel(socket)
        try:
            socket.bind(self.bind_address)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        endpoint = socket.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(endpoint, bytes)
        self._endpoint = endpoint.decode()
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

    def _close_sockets(self) -> None:
        for channel in [*self._dealers.values(), *([self._router] if self._router is not None else [])]:
            channel.socket.close(linger=0)
        self._dealers.clear()
        self._router = None
        if self._context is not None:
            self._context.term()
            self._context = None

    async def __aenter__(self) -> ZmqActorSystem:
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()
        await self.close()

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        assert self._context is not None
        socket = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, HWM)
        socket.setsockopt(zmq.RCVHWM, HWM)
        return socket

    # --- sending -------------------------------------------------------------------------------------

    def _is_remote(self, recipient: str) -> bool:
        return recipient not in self._actors and recipient in self.address_book

    def tell(self, recipient: str, msg: Message, *, sender: str = MAIN) -> None:
        """Send ``msg`` to a local or remote ``recipient`` and return at once."""
        if not self._is_remote(recipient):
            super().tell(recipient, msg, sender=sender)
            return
        envelope = Envelope(sender, recipient, self._new_msg_id(), None, msg)
        data = self.codec.encode_envelope(envelope)  # MessageError at the sender for an invalid message
        dealer = self._dealer(self.address_book[recipient])
        self.record(sender, "tell", _describe(envelope))
        dealer.post([KIND_TELL, data], self.loop)

    async def ask(
        self, recipient: str, msg: Message, *, timeout_s: float | None = None, sender: str = MAIN
    ) -> Message | None:
        """Ask a local or remote ``recipient`` (see :meth:`ActorSystem.ask`; remote errors per the module)."""
        if not self._is_remote(recipient):
            return await super().ask(recipient, msg, timeout_s=timeout_s, sender=sender)
        envelope = Envelope(sender, recipient, self._new_msg_id(), None, msg)
        data = self.codec.encode_envelope(envelope)
        dealer = self._dealer(self.address_book[recipient])
        self.record(sender, "ask", _describe(envelope))
        future: asyncio.Future[Message | None] = self.loop.create_future()
        self._pending[envelope.msg_id] = _Pending(future, recipient)
        dealer.post([KIND_ASK, data], self.loop)
        return await self._await_reply(sender, envelope.msg_id, future, timeout_s)

    def _dealer(self, endpoint: str) -> _Channel:
        dealer = self._dealers.get(endpoint)
        if dealer is None:
            if self._context is None:
                raise RuntimeError("the transport is not open")
            socket = self._socket(zmq.DEALER)
            socket.connect(endpoint)
            dealer = self._dealers[endpoint] = _Channel(socket)
            receiver = dealer.receive(self._on_reply, self._reject)
            self._tasks.append(self.loop.create_task(receiver, name=f"zmq:{endpoint}"))
        return dealer

    # --- answering asks that came over the wire ------------------------------------------------------

    def _reply(self, request: Envelope, result: Message | None, error: BaseException | None) -> None:
        route = self._remote_asks.pop(id(request), None)
        if route is None or route.envelope is not request:
            super()._reply(request, result, error)
            return
        body: Message
        msg_id = self._new_msg_id()
        if error is None:
            body = NoneReply() if result is None else result
            self.record(request.recipient, "reply", f"#{msg_id} re #{request.msg_id} {_type_name(result)}")
        else:
            body = error_to_wire(error)
            summary = f"#{msg_id} re #{request.msg_id} {type(error).__name__}: {error}"
            self.record(request.recipient, "error", summary)
        envelope = Envelope(request.recipient, request.sender, msg_id, request.msg_id, body)
        try:
            data = self.codec.encode_envelope(envelope)
        except MessageError as encode_error:  # e.g. a reply type the codec does not know
            envelope = Envelope(request.recipient, request.sender, msg_id, request.msg_id, error_to_wire(encode_error))
            data = self.codec.encode_envelope(envelope)
        if self._router is not None:
            self._router.post([route.identity, KIND_REPLY, data], self.loop)

    def _fail_pending(self, name: str) -> None:
        super()._fail_pending(name)
        actor = self._actors.get(name)
        handling = actor.envelope if actor is not None else None
        for route in list(self._remote_asks.values()):
            if route.envelope.recipient == name:
                detail = f" (ask #{route.envelope.msg_id} was not answered)"
                self._reply(route.envelope, None, ActorStoppedError(name, detail))
                if route.envelope is handling:
                    # Its handler may still answer (an actor that stops itself finishes the handler): that
                    # answer goes to the asker too, which drops it as late, as in-process. (Without the route
                    # it would be taken for an ask of this system's own with the same msg_id.)
                    self._remote_asks[id(handling)] = route

    async def _handle(self, actor: Actor, request: _Request) -> None:
        try:
            await super()._handle(actor, request)
        finally:
            if request.is_ask:  # the route of an ask its handler did not answer (see _fail_pending)
                self._remote_asks.pop(id(request.envelope), None)

    # --- receiving -----------------------------------------------------------------------------------

    def _reject(self, reason: str) -> None:
        self.counters[REJECTED_COUNTER] += 1
        _log.warning("rejected a frame at %s: %s", self._endpoint, reason)
        self.record(TRANSPORT_ACTOR, "rejected", reason)

    def _on_request(self, frames: list[bytes]) -> None:
        identity, rest = frames[0], frames[1:]
        if len(rest) != 2 or rest[0] not in (KIND_TELL, KIND_ASK):
            kind = f" of kind {rest[0][:16]!r}" if rest else ""
            self._reject(f"expected frames [tell|ask, envelope], got {len(rest)} frame(s){kind}")
            return
        is_ask = rest[0] == KIND_ASK
        try:
            envelope = self.codec.decode_envelope(rest[1])
        except MessageError as error:
            self._reject(str(error))
            return
        if envelope.reply_to is not None:
            self._reject(f"a request with reply_to #{envelope.reply_to}")
            return
        summary = _describe(envelope)
        target = self._actors.get(envelope.recipient)
        if target is None:
            self._reject(f"no actor {envelope.recipient!r} here ({summary})")
            if is_ask:
                self._remote_asks[id(envelope)] = _RemoteAsk(envelope, identity)
                self._reply(envelope, None, UnknownActorError(envelope.recipient))
            return
        if target.stopped:
            if is_ask:
                self._remote_asks[id(envelope)] = _RemoteAsk(envelope, identity)
                self._reply(envelope, None, ActorStoppedError(envelope.recipient))
            else:
                self._drop(envelope, summary)
            return
        if is_ask:
            self._remote_asks[id(envelope)] = _RemoteAsk(envelope, identity)
        self.record(envelope.recipient, "deliver", summary)
        target._mailbox.put_nowait(_Request(envelope, is_ask, summary))

    def _on_reply(self, frames: list[bytes]) -> None:
        if len(frames) != 2 or frames[0] != KIND_REPLY:
            self._reject(f"expected frames [reply, envelope], got {len(frames)} frame(s)")
            return
        try:
            envelope = self.codec.decode_envelope(frames[1])
        except MessageError as decode_error:
            self._reject(str(decode_error))
            return
        if envelope.reply_to is None:
            self._reject(f"a reply without reply_to ({_describe(envelope)})")
            return
        body = envelope.body
        result: Message | None = body
        failure: Exception | None = None
        if isinstance(body, NoneReply):
            result = None
        elif isinstance(body, ErrorReply):
            result, failure = None, error_from_wire(body, envelope.sender)
        self._answer(_Reply(envelope.sender, envelope.recipient, envelope.msg_id, envelope.reply_to, result, failure))


def _type_name(value: object) -> str:
    return "None" if value is None else type(value).__qualname__


class _Channel:
    """One socket of the transport. Sends keep their order without awaiting: at once while the socket takes
    them, else into a backlog that a task drains; receiving takes what is queued in batches (pyzmq's
    per-message futures cost far more than the messages).

    On the per-message paths, flags go to pyzmq as plain ints and frames one by one, as ``send_multipart``
    and ``recv_multipart`` would: their flag-enum arithmetic (``zmq.SNDMORE | flags``) and ``RCVMORE``
    look-ups (an enum conversion in every ``getsockopt``) cost more than the send or receive itself."""

    __slots__ = ("socket", "sync", "backlog", "drain", "recheck_due")

    _SEND_MORE: ClassVar[int] = int(zmq.SNDMORE | zmq.NOBLOCK)
    _NOBLOCK: ClassVar[int] = int(zmq.NOBLOCK)

    def __init__(self, socket: zmq.asyncio.Socket) -> None:
        self.socket = socket
        self.sync: zmq.Socket[bytes] = zmq.Socket.shadow(socket.underlying)  # same socket, blocking API
        self.backlog: deque[list[bytes]] = deque()
        self.drain: asyncio.Task[None] | None = None
        self.recheck_due = False

    def post(self, frames: list[bytes], loop: asyncio.AbstractEventLoop) -> None:
        if not self.backlog:
            try:
                # send_multipart(frames, NOBLOCK), frame by frame. ZeroMQ checks the high-water mark (and a
                # ROUTER the peer) on a message's first frame: Again or an error leaves nothing queued.
                send, last = self.sync.send, len(frames) - 1
                for index in range(last):
                    send(frames[index], self._SEND_MORE)
                send(frames[last], self._NOBLOCK)
                return
            except zmq.Again:
                pass  # the peer's queue is full (or not there yet): keep the order through the backlog
            except zmq.ZMQError as error:
                _log.warning("a ZeroMQ send failed: %s", error)
                return
            finally:
                # The socket's file descriptor is edge-triggered, and a send may consume the edge that was to
                # wake the pending recv of `receive` (a message that arrived meanwhile would then wait for the
                # next edge, perhaps forever). Reading EVENTS through the asyncio socket makes pyzmq look again,
                # as its own sends do. Once per loop iteration, after the sends made in it, is enough: pyzmq
                # only schedules its handler for a later iteration when it finds something, and reading EVENTS
                # costs more than the send.
                if not self.recheck_due:
                    self.recheck_due = True
                    loop.call_soon(self._recheck)
        self.backlog.append(frames)
        if self.drain is None:
            self.drain = loop.create_task(self._drain(), name="zmq:drain")

    def _recheck(self) -> None:
        self.recheck_due = False
        if not self.socket.closed:
            self.socket.get(zmq.EVENTS)

    async def _drain(self) -> None:
        try:
            while self.backlog:
                try:
                    await self.socket.send_multipart(self.backlog[0])
                except zmq.ZMQError as error:
                    _log.warning("a ZeroMQ send failed: %s", error)
                self.backlog.popleft()
        finally:
            self.drain = None

    async def receive(self, handle: Callable[[list[bytes]], None], reject: Callable[[str], None]) -> None:
        recv, noblock = self.sync.recv, self._NOBLOCK
        while True:
            batch = [await self.socket.recv_multipart()]
            while len(batch) < RECEIVE_BATCH:
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
                batch.append(frames)
            for frames in batch:
                try:
                    handle(frames)
                except Exception as error:  # never let one frame end the receiver
                    reject(f"{type(error).__name__}: {error}")
            await asyncio.sleep(0)  # let the actors run between batches
