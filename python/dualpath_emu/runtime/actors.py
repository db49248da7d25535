"""Actors: mailboxes, handlers chosen by message type, ``tell`` and ``ask`` (issue 3).

An :class:`ActorSystem` owns the actors of one run (there is no global registry: pass the system in). An
:class:`Actor` has a name, a mailbox and a task that handles one envelope at a time; its handlers are
``async`` methods marked with :func:`handles` (nothing checks a handler's parameter annotation against
the types it is marked for)::

    class Echo(Actor):
        @handles(Ping)
        async def on_ping(self, msg: Ping) -> Pong:
            return Pong(msg.seq)

    system = ActorSystem(latency_s=0.001)
    echo = Echo(system, "echo")

    async def main() -> Pong | None:
        echo.start()
        return await system.ask("echo", Ping(1), timeout_s=1.0)   # a reply at t = 2 ms

    result = dualpath_emu.runtime.run(system.run(main()), core)

**Delivery.** In-process, messages are passed as objects (never encoded). :meth:`ActorSystem.tell` and
:meth:`~ActorSystem.ask` wrap the message in an :class:`~dualpath_emu.messages.Envelope` with a ``msg_id``
from the system's counter (1, 2, 3, … in send order) and put it into the recipient's mailbox
``latency_s`` of loop time later (``call_soon`` when 0, else ``call_later``: on a
:class:`~dualpath_emu.runtime.VirtualTimeLoop` that is virtual time). Replies travel back with the same
latency. Since the latency is one constant, arrivals come in send order: deliveries are FIFO per system,
so per sender. (asyncio's timer heap alone does not order equal deadlines, so what is sent at one instant
travels as one batch with one loop callback, and each callback takes the oldest batch.)

**Handlers.** The handler for a message is the one marked for its type or, failing that, for the nearest
base class in the type's MRO. A subclass may override a base class's handler for a type. An ``async``
handler may ``await`` (sleeps, core transfers, asks to other actors); the actor handles nothing else
meanwhile, so an actor that asks itself, or two actors that ask each other, wait forever (on a
``VirtualTimeLoop`` that ends in ``DeadlockError`` unless the ask has a timeout). A plain (``def``) handler
cannot wait and costs less: a tell that arrives while its actor idles with an empty mailbox is handled on
the spot, without a task switch (the same order as through the mailbox: arrivals are handled in arrival
order, one at a time). The return value (a ``Message`` or ``None``) is the reply to an ask (anything else
gives the asker a ``TypeError``) and is ignored for a tell.

**Failure semantics** (as in pykka):

* an exception raised by a handler for an **ask** is given to the asker (the same exception object, so the
  same type and message); the callee keeps running;
* an exception raised by a handler for a **tell** fails the whole run: the system records a ``failure``
  event, stops every actor, and :meth:`ActorSystem.run` raises :class:`ActorFailure` with the actor's name,
  the exception and the last events (``system.failure`` holds it too);
* a message with no handler: an ask gets :class:`UnhandledMessageError`; a tell is counted
  (``system.unhandled``), recorded as ``unhandled`` and the actor keeps running;
* :meth:`Actor.stop` is immediate: the actor stops at once (a running handler is cancelled, unless the
  actor stops itself from within it, in which case that handler finishes), every ask to it that has not
  been answered yet -- in flight, in its mailbox or being handled -- fails with :class:`ActorStoppedError`,
  and a later ask raises it at once. Tells still in its mailbox, and tells sent to it afterwards, are
  dropped, counted (``system.dropped``) and recorded as ``drop``; they do not raise (a sender may race a
  shutdown). A stopped actor cannot be started again;
* an ask with ``timeout_s`` raises :class:`TimeoutError` after that much loop time; a reply arriving later
  is recorded as ``late`` and dropped.

A name that was never registered is an error for both tell and ask (:class:`UnknownActorError`). Code
outside any actor sends as :data:`MAIN` (``"main"``, a name no actor may take). :meth:`ActorSystem.run`
stops every actor when its ``main`` ends, whichever way.

**Events.** The system appends one ``(t_ns, seq, actor, kind, summary)`` tuple to :attr:`ActorSystem.events`
for each start, stop, send (``tell``/``ask``), ``deliver`` (into a mailbox), ``handle`` (a handler starts),
``reply``, ``answer`` (a reply reaches its asker), ``error`` (a handler raised for an ask), ``unhandled``,
``drop``, ``timeout``, ``late`` and ``failure``; actors may add their own with
:meth:`ActorSystem.record`. ``seq`` counts events from 0; ``t_ns`` is the loop's clock in nanoseconds.
Summaries hold names, message ids, type names and, for ``error`` and ``failure``, the exception's text
(no ``id()``, no addresses, no set order), so two runs of the same program give the same list as long as
its exceptions' texts are deterministic too.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar, Final, NamedTuple, TypeVar

from dualpath_emu.messages import Envelope, Message
from dualpath_emu.runtime.core_work import CoreWork
from dualpath_emu.runtime.engine import seeded_random

__all__ = [
    "MAIN",
    "Actor",
    "ActorError",
    "ActorFailure",
    "ActorStoppedError",
    "ActorSystem",
    "Event",
    "UnhandledMessageError",
    "UnknownActorError",
    "handles",
]

MAIN: Final = "main"
"""The sender name of tells and asks made by code outside any actor (``ActorSystem.tell``/``ask``)."""

DEFAULT_FAILURE_EVENTS: Final = 20
"""How many of the last events an :class:`ActorFailure` carries by default."""

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Awaitable[Message | None] | Message | None])

_HANDLES_ATTR: Final = "__actor_handles__"


class Event(NamedTuple):
    """One record of the system's event list; a plain tuple compares equal."""

    t_ns: int
    seq: int
    actor: str
    kind: str
    summary: str


class ActorError(Exception):
    """Base of the actor runtime's errors."""


class ActorStoppedError(ActorError):
    """An ask to an actor that is stopped, or that stopped before it answered."""

    def __init__(self, actor: str, detail: str = "") -> None:
        super().__init__(f"actor {actor!r} is stopped{detail}")
        self.actor = actor


class UnknownActorError(ActorError, LookupError):
    """A tell or ask to a name no actor of this system has."""

    def __init__(self, actor: str) -> None:
        super().__init__(f"no actor named {actor!r} in this actor system")
        self.actor = actor


class UnhandledMessageError(ActorError, TypeError):
    """An ask whose message type the recipient has no handler for."""

    def __init__(self, actor: str, message_type: type[Message]) -> None:
        super().__init__(f"actor {actor!r} has no handler for {message_type.__qualname__}")
        self.actor = actor
        self.message_type = message_type


class ActorFailure(ActorError):
    """A handler raised while handling a tell: the run is over. Carries what a report needs.

    ``actor`` is the failing actor's name, ``error`` the exception (also ``__cause__``), ``events`` the
    last events up to and including the ``failure`` event.
    """

    def __init__(self, actor: str, error: BaseException, events: tuple[Event, ...]) -> None:
        lines = "\n".join(f"  {e.t_ns} {e.seq} {e.actor} {e.kind} {e.summary}" for e in events)
        super().__init__(
            f"actor {actor!r} failed: {type(error).__name__}: {error}\nlast {len(events)} events:\n{lines}"
        )
        self.actor = actor
        self.error = error
        self.events = events
        self.__cause__ = error


def handles(*message_types: type[Message]) -> Callable[[_F], _F]:
    """Mark a method of an :class:`Actor` subclass (``async`` or plain) as the handler of ``message_types``.

    May be stacked; the method is returned unchanged. The class refuses, when it is created, two handlers
    of its own for one type.
    """
    if not message_types:
        raise TypeError("handles() needs at least one message type")
    for message_type in message_types:
        if not (isinstance(message_type, type) and issubclass(message_type, Message)):
            raise TypeError(f"handles() takes Message subclasses, got {message_type!r}")

    def mark(method: _F) -> _F:
        previous: tuple[type[Message], ...] = getattr(method, _HANDLES_ATTR, ())
        setattr(method, _HANDLES_ATTR, previous + message_types)
        return method

    return mark


class _Request(NamedTuple):
    """A message in flight or in a mailbox, and whether an asker waits for its answer."""

    envelope: Envelope
    is_ask: bool
    summary_or_none: str | None
    """The event-log summary, if it was made already (it is only made when it is recorded)."""

    @property
    def summary(self) -> str:
        return self.summary_or_none or _describe(self.envelope)


class _Reply(NamedTuple):
    """A reply in flight to an asker: the result or the exception, passed as objects."""

    sender: str
    recipient: str
    msg_id: int
    reply_to: int
    result: Message | None
    error: BaseException | None


class _Pending(NamedTuple):
    future: asyncio.Future[Message | None]
    recipient: str


class ActorSystem:
    """The actors of one run, their deliveries, message ids and event record.

    ``latency_s`` is the delivery latency of every message and reply, in loop (so virtual) seconds;
    ``failure_events`` how many of the last events an :class:`ActorFailure` carries; ``seed`` the seed of
    the run's random streams (:meth:`random`); ``record_messages`` whether every message's life is
    recorded (see the attribute); ``data_plane`` what its actors move bytes through (:attr:`data_plane`).
    The system binds to the running event loop when it is first used.
    """

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        failure_events: int = DEFAULT_FAILURE_EVENTS,
        seed: int = 0,
        record_messages: bool = True,
        data_plane: CoreWork | None = None,
    ) -> None:
        if not latency_s >= 0.0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self._latency_s = latency_s
        self.seed = seed
        """The run's seed: every random stream of :meth:`random` derives from it."""
        self._data_plane = data_plane
        self.record_messages = record_messages
        """Whether the life of every message is recorded (``tell``/``ask``, ``deliver``, ``handle``,
        ``reply``, ``answer``). Off, only the actors' own events and the exceptional ones (``drop``,
        ``timeout``, ``late``, ``unhandled``, ``error``, ``failure``, ``start``, ``stop``) are: a long run
        whose actors record what they decide then keeps a log a tenth of the size."""
        self.failure_events = failure_events
        # Events as plain tuples, appended on the hot paths; `events` turns them into Event as read.
        self._log: list[tuple[int, int, str, str, str]] = []
        self._events: list[Event] = []
        # With an event sink, the log is handed over in chunks: `_log_base` events came before `_log`, whose
        # tuples number their seq from 0 (the sink and `events` add the base).
        self._log_base = 0
        self._sink: Callable[[list[tuple[int, int, str, str, str]], int], None] | None = None
        self._sink_chunk = 0
        self.dropped = 0
        """Tells dropped because their recipient was stopped."""
        self.unhandled = 0
        """Tells whose recipient had no handler for them."""
        self.failure: ActorFailure | None = None
        self._actors: dict[str, Actor] = {}
        self._next_msg_id = 1
        # Batches of items in flight, one per send instant, oldest first; each has one loop callback.
        self._in_flight: deque[list[_Request | _Reply]] = deque()
        self._open_batch: list[_Request | _Reply] | None = None
        self._open_batch_ns = -1
        self._clock: Callable[[], int] | None = None
        self._pending: dict[int, _Pending] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main_task: asyncio.Task[Any] | None = None

    @property
    def latency_s(self) -> float:
        """The delivery latency of every message and reply (fixed: FIFO delivery relies on it)."""
        return self._latency_s

    # --- the loop and the record ---------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the system runs on (the running loop when first used)."""
        if self._loop is None:
            self._bind()
            assert self._loop is not None
        return self._loop

    def _bind(self) -> Callable[[], int]:
        """Bind to the running loop; return the clock in nanoseconds."""
        loop = self._loop = asyncio.get_running_loop()
        # The project's loops (virtual time's, live time's) keep their clock in integer nanoseconds.
        clock: Callable[[], int] | None = getattr(loop, "clock_ns", None)
        if clock is None:
            clock = lambda: round(loop.time() * 1e9)  # noqa: E731
        self._clock = clock
        return clock

    def now_ns(self) -> int:
        """The loop's clock in nanoseconds (exact on the project's loops)."""
        clock = self._clock
        return (clock if clock is not None else self._bind())()

    @property
    def data_plane(self) -> CoreWork:
        """The data plane this system's actors move bytes through (``transfer``, ``forward``, ``io``,
        ``core_timer``, ...), handed to the system (``ActorSystem(data_plane=...)``): a core in this process,
        the run's data-plane service, or the host backend; actor code does not know which."""
        if self._data_plane is None:
            raise RuntimeError("this actor system was given no data plane (ActorSystem(data_plane=...))")
        return self._data_plane

    def random(self, stream: str) -> random.Random:
        """The random stream called ``stream`` (e.g. an actor's name), seeded from :attr:`seed` and the name.

        The same seed and name give the same sequence in every process and under every
        ``PYTHONHASHSEED`` (the derivation is SHA-256, not ``hash()``); each call returns a new generator
        at the stream's start.
        """
        return seeded_random(self.seed, stream)

    @property
    def events(self) -> list[Event]:
        """Every event so far, oldest first (read it; :meth:`record` adds to it). With an event sink, only
        the events not handed to the sink yet."""
        log, events, base = self._log, self._events, self._log_base
        if len(events) < len(log):
            events.extend(Event(t, seq + base, a, k, m) for t, seq, a, k, m in log[len(events) :])
        return events

    @property
    def event_count(self) -> int:
        """How many events were recorded (without converting them), those handed to a sink included."""
        return self._log_base + len(self._log)

    def raw_events(self) -> list[tuple[int, int, str, str, str]]:
        """The events as plain ``(t_ns, seq, actor, kind, summary)`` tuples (no copy: do not modify); without
        an event sink, every event."""
        if self._log_base:
            raise RuntimeError("the events went to the event sink; raw_events() holds only the rest")
        return self._log

    def set_event_sink(
        self, sink: Callable[[list[tuple[int, int, str, str, str]], int], None], chunk: int = 1 << 16
    ) -> None:
        """Hand the events to ``sink(events, first_seq)`` in chunks of about ``chunk`` instead of keeping them
        all (a long run records millions); :meth:`flush_events` hands over the rest. The tuples' own ``seq``
        counts from 0 within a chunk: ``first_seq + index`` is the event's number."""
        self._sink = sink
        self._sink_chunk = chunk

    def flush_events(self) -> None:
        """Hand every event not handed over yet to the sink (nothing without one)."""
        sink = self._sink
        if sink is None or not self._log:
            return
        log, base = self._log, self._log_base
        self._log, self._events = [], []
        self._log_base = base + len(log)
        sink(log, base)

    def fail(self, actor: Actor, error: Exception) -> None:
        """Fail the run as a failing tell does, from code of ``actor`` outside a handler (a callback)."""
        self._fail(actor, None, error)

    def record(self, actor: str, kind: str, summary: str) -> None:
        """Append an event at the current time (actors may record their own events too)."""
        log = self._log
        log.append((self.now_ns(), len(log), actor, kind, summary))

    def last_events(self, n: int) -> tuple[Event, ...]:
        """The last ``n`` events."""
        return tuple(_new_tuple(Event, raw) for raw in self._log[-n:]) if n > 0 else ()

    # --- actors --------------------------------------------------------------------------------------

    def actor(self, name: str) -> Actor:
        """The actor called ``name``; :class:`UnknownActorError` if there is none."""
        try:
            return self._actors[name]
        except KeyError:
            raise UnknownActorError(name) from None

    @property
    def actors(self) -> tuple[Actor, ...]:
        """The actors in registration order."""
        return tuple(self._actors.values())

    def _register(self, actor: Actor) -> None:
        if not actor.name or actor.name == MAIN:
            raise ValueError(f"an actor's name must be non-empty and not {MAIN!r}, got {actor.name!r}")
        if actor.name in self._actors:
            raise ValueError(f"an actor named {actor.name!r} is already registered in this system")
        self._actors[actor.name] = actor

    # --- sending -------------------------------------------------------------------------------------

    def tell(self, recipient: str, msg: Message, *, sender: str = MAIN) -> None:
        """Send ``msg`` to ``recipient`` and return at once (dropped and counted if it is stopped)."""
        # The hottest path of a run: what record(), _new_msg_id() and _describe() do, inlined.
        target = self._actors.get(recipient)
        if target is None:
            raise UnknownActorError(recipient)
        msg_id = self._next_msg_id
        self._next_msg_id = msg_id + 1
        envelope = _new_tuple(Envelope, (sender, recipient, msg_id, None, msg))  # Envelope(...) without its frame
        clock = self._clock
        now = clock() if clock is not None else self._bind()()
        summary = None
        if self.record_messages:
            summary = f"#{msg_id} {type(msg).__qualname__} {sender}->{recipient}"
            log = self._log
            log.append((now, len(log), sender, "tell", summary))
        if target._stopped:
            self._drop(envelope, summary or _describe(envelope))
            return
        self._send(_new_tuple(_Request, (envelope, False, summary)), now)

    async def ask(
        self, recipient: str, msg: Message, *, timeout_s: float | None = None, sender: str = MAIN
    ) -> Message | None:
        """Send ``msg`` to ``recipient`` and return its handler's return value.

        Raises the handler's exception, :class:`UnhandledMessageError`, :class:`ActorStoppedError` (the
        recipient is or becomes stopped before answering) or :class:`TimeoutError` after ``timeout_s``.
        """
        target = self.actor(recipient)
        if target.stopped:
            raise ActorStoppedError(recipient)
        envelope = Envelope(sender, recipient, self._new_msg_id(), None, msg)
        summary = _describe(envelope)
        if self.record_messages:
            self.record(sender, "ask", summary)
        future: asyncio.Future[Message | None] = self.loop.create_future()
        self._pending[envelope.msg_id] = _Pending(future, recipient)
        self._send(_Request(envelope, True, summary), self.now_ns())
        return await self._await_reply(sender, envelope.msg_id, future, timeout_s)

    async def _await_reply(
        self, sender: str, msg_id: int, future: asyncio.Future[Message | None], timeout_s: float | None
    ) -> Message | None:
        """Wait for the answer to ask `msg_id`, at most `timeout_s` of loop time; forget the ask after."""
        try:
            if timeout_s is None:
                return await future
            try:
                return await asyncio.wait_for(future, timeout_s)
            except TimeoutError:
                self.record(sender, "timeout", f"#{msg_id} after {timeout_s} s")
                raise
        finally:
            self._pending.pop(msg_id, None)

    def _new_msg_id(self) -> int:
        msg_id = self._next_msg_id
        self._next_msg_id += 1
        return msg_id

    def _send(self, item: _Request | _Reply, now: int) -> None:
        # One constant latency, so arrivals come in send order. Items sent at one instant (`now`) travel as
        # one batch with one loop callback (asyncio would not order equal timer deadlines; each firing takes
        # the oldest batch, and batches are due in the order they were opened).
        batch = self._open_batch
        if batch is not None and self._open_batch_ns == now:
            batch.append(item)
            return
        batch = self._open_batch = [item]
        self._open_batch_ns = now
        self._in_flight.append(batch)
        if self._latency_s == 0.0:
            self.loop.call_soon(self._arrive_batch)
        else:
            self.loop.call_later(self._latency_s, self._arrive_batch)

    def _arrive_batch(self) -> None:
        if self._sink is not None and len(self._log) >= self._sink_chunk:
            self.flush_events()
        batch = self._in_flight.popleft()
        if batch is self._open_batch:
            self._open_batch = None  # what is sent from now on is due later
        actors, log, now, record = self._actors, self._log, self.now_ns(), self.record_messages
        for item in batch:
            if isinstance(item, _Reply):
                self._answer(item)
                continue
            envelope = item.envelope
            target = actors[envelope.recipient]
            if target._stopped:
                if not item.is_ask:
                    self._drop(envelope, item.summary)
                continue  # an ask: its asker was told when the actor stopped
            if record:
                log.append((now, len(log), envelope.recipient, "deliver", item.summary))
            mailbox = target._mailbox
            if mailbox._waiter is not None and not mailbox.items and not item.is_ask:
                # Its task idles with nothing queued: a plain handler runs here, without a task switch.
                handler = target._handler_for(type(envelope.body))
                if handler is not None and handler[1]:  # handled here, inlined: the hottest path of a run
                    if record:
                        log.append((self.now_ns(), len(log), target.name, "handle", item.summary))
                    target.envelope = envelope
                    try:
                        handler[0](envelope.body)
                    except Exception as error:
                        self._fail(target, envelope, error)
                    finally:
                        target.envelope = None
                    continue
            mailbox.put_nowait(item)

    def _answer(self, reply: _Reply) -> None:
        pending = self._pending.pop(reply.reply_to, None)
        if pending is None or pending.future.done():
            self.record(reply.recipient, "late", f"#{reply.msg_id} re #{reply.reply_to} from {reply.sender}")
            return
        what = type(reply.error).__name__ if reply.error is not None else _type_name(reply.result)
        if self.record_messages:
            self.record(reply.recipient, "answer", f"#{reply.msg_id} re #{reply.reply_to} {what} from {reply.sender}")
        if reply.error is not None:
            pending.future.set_exception(reply.error)
        else:
            pending.future.set_result(reply.result)

    def _reply(self, request: Envelope, result: Message | None, error: BaseException | None) -> None:
        reply = _Reply(request.recipient, request.sender, self._new_msg_id(), request.msg_id, result, error)
        if error is None:
            if self.record_messages:
                self.record(request.recipient, "reply", f"#{reply.msg_id} re #{request.msg_id} {_type_name(result)}")
        else:
            summary = f"#{reply.msg_id} re #{request.msg_id} {type(error).__name__}: {error}"
            self.record(request.recipient, "error", summary)
        self._send(reply, self.now_ns())

    def _drop(self, envelope: Envelope, summary: str) -> None:
        self.dropped += 1
        self.record(envelope.recipient, "drop", summary)

    # --- handling ------------------------------------------------------------------------------------

    async def _handle(self, actor: Actor, request: _Request) -> None:
        envelope, is_ask, _ = request
        if self.record_messages:
            log = self._log
            log.append((self.now_ns(), len(log), actor.name, "handle", request.summary))
        handler = actor._handler_for(type(envelope.body))
        if handler is None:
            if is_ask:
                self._reply(envelope, None, UnhandledMessageError(actor.name, type(envelope.body)))
            else:
                self.unhandled += 1
                self.record(actor.name, "unhandled", request.summary)
            return
        method, plain = handler
        actor.envelope = envelope
        try:
            result = method(envelope.body) if plain else await method(envelope.body)
        except Exception as error:
            if is_ask:
                self._reply(envelope, None, error)
            else:
                self._fail(actor, envelope, error)
            return
        finally:
            actor.envelope = None
        if is_ask and actor.stopped:
            return  # stopped from within its own handler: the asker already got ActorStoppedError
        if is_ask:
            if result is not None and not isinstance(result, Message):
                wrong = TypeError(f"handler of {actor.name!r} returned {_type_name(result)}, not a Message or None")
                self._reply(envelope, None, wrong)
            else:
                self._reply(envelope, result, None)

    def _fail(self, actor: Actor, envelope: Envelope | None, error: Exception) -> None:
        where = _describe(envelope) if envelope is not None else "runtime"
        self.record(actor.name, "failure", f"{where}: {type(error).__name__}: {error}")
        if self.failure is None:
            self.failure = ActorFailure(actor.name, error, self.last_events(self.failure_events))
        if self._main_task is not None:
            self._main_task.cancel()
        self.stop_all()

    def _fail_pending(self, name: str) -> None:
        for msg_id, pending in list(self._pending.items()):
            if pending.recipient == name and not pending.future.done():
                del self._pending[msg_id]
                pending.future.set_exception(ActorStoppedError(name, f" (ask #{msg_id} was not answered)"))

    # --- running -------------------------------------------------------------------------------------

    def stop_all(self) -> None:
        """Stop every actor, in registration order."""
        for actor in list(self._actors.values()):
            actor.stop()

    async def run(self, main: Coroutine[Any, Any, _T]) -> _T:
        """Run ``main`` as the run's driver; stop every actor when it ends; return its result.

        If a handler fails while handling a tell, ``main`` is cancelled and :class:`ActorFailure` raised.
        """
        if self.failure is not None:
            main.close()
            raise self.failure
        task = self.loop.create_task(main, name=MAIN)
        self._main_task = task
        try:
            result = await task
        except BaseException:
            if self.failure is not None:
                raise self.failure  # its __cause__ is the handler's exception
            raise
        finally:
            self._main_task = None
            await self.shutdown()
        if self.failure is not None:
            raise self.failure
        return result

    async def shutdown(self) -> None:
        """Stop every actor and wait until their tasks have ended."""
        self.stop_all()
        current = asyncio.current_task()
        tasks = [actor._task for actor in self._actors.values() if actor._task is not None]
        tasks = [task for task in tasks if task is not current]
        await asyncio.gather(*tasks, return_exceptions=True)


class Actor:
    """Base class of actors: a name in one :class:`ActorSystem`, a mailbox and handlers (see :func:`handles`).

    Creating an actor registers it; :meth:`start` (inside the running loop) starts its task. Messages sent
    before that wait in the mailbox. ``envelope`` is the envelope being handled (``None`` between messages).
    """

    _handlers: ClassVar[dict[type[Message], str]] = {}
    _resolved: ClassVar[dict[type[Message], tuple[str, bool] | None]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own: dict[type[Message], str] = {}
        for attribute, value in cls.__dict__.items():  # definition order
            message_types: tuple[type[Message], ...] = getattr(value, _HANDLES_ATTR, ())
            if not message_types:
                continue
            for message_type in message_types:
                if message_type in own and own[message_type] != attribute:
                    raise TypeError(
                        f"{cls.__qualname__}: {own[message_type]} and {attribute} both handle "
                        f"{message_type.__qualname__}"
                    )
                own[message_type] = attribute
        cls._handlers = {**cls._handlers, **own}
        cls._resolved = {}  # message type -> (handler attribute, plain) or None, filled as types arrive

    def __init__(self, system: ActorSystem, name: str) -> None:
        self.system = system
        self.name = name
        self.envelope: Envelope | None = None
        self._mailbox = _Mailbox()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._random: random.Random | None = None
        self._bound: dict[type[Message], tuple[Callable[[Message], Any], bool] | None] = {}
        system._register(self)

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called (or the system failed)."""
        return self._stopped

    def _handler_for(self, message_type: type[Message]) -> tuple[Callable[[Message], Any], bool] | None:
        """The bound handler for ``message_type`` and whether it is plain (not ``async``), or None."""
        try:
            return self._bound[message_type]  # made once per type: a run delivers millions of messages
        except KeyError:
            handler = self._bound[message_type] = self._resolve_handler(message_type)
            return handler

    def _resolve_handler(self, message_type: type[Message]) -> tuple[Callable[[Message], Any], bool] | None:
        cls = type(self)
        try:
            resolved = cls._resolved[message_type]
        except KeyError:
            attribute = _resolve(cls._handlers, message_type)
            plain = attribute is not None and not inspect.iscoroutinefunction(getattr(cls, attribute))
            resolved = cls._resolved[message_type] = (attribute, plain) if attribute is not None else None
        if resolved is None:
            return None
        return getattr(self, resolved[0]), resolved[1]

    # --- life --------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start handling the mailbox (call inside the running loop)."""
        if self._stopped:
            raise ActorStoppedError(self.name, " and cannot be started again")
        if self._task is not None:
            raise RuntimeError(f"actor {self.name!r} is already started")
        self.system.record(self.name, "start", type(self).__qualname__)
        self._task = self.system.loop.create_task(self._run(), name=f"actor:{self.name}")

    def stop(self) -> None:
        """Stop now (see the module docstring): fail its unanswered asks, drop its queued tells."""
        if self._stopped:
            return
        self._stopped = True
        self.system.record(self.name, "stop", f"{self._mailbox.qsize()} queued")
        self.system._fail_pending(self.name)
        while not self._mailbox.empty():
            request = self._mailbox.get_nowait()
            if not request.is_ask:
                self.system._drop(request.envelope, request.summary)
        current = asyncio.current_task()
        task = self._task
        if task is not None and task is not current and not task.done():
            task.cancel()

    async def _run(self) -> None:
        mailbox, handle = self._mailbox, self.system._handle
        try:
            while not self._stopped:
                items = mailbox.items
                request = items.popleft() if items else await mailbox.get()
                await handle(self, request)
        except Exception as error:  # a fault of the runtime itself: fail the run rather than hide it
            self.system._fail(self, None, error)

    # --- sending -----------------------------------------------------------------------------------

    @property
    def random(self) -> random.Random:
        """This actor's random stream (``system.random(name)``, made on first use): the only randomness an
        actor should use, so that a run repeats from its seed."""
        rng = self._random
        if rng is None:
            rng = self._random = self.system.random(self.name)
        return rng

    def tell(self, recipient: str, msg: Message) -> None:
        """Send ``msg`` to ``recipient`` from this actor, fire and forget."""
        self.system.tell(recipient, msg, sender=self.name)

    async def ask(self, recipient: str, msg: Message, *, timeout_s: float | None = None) -> Message | None:
        """Ask ``recipient`` from this actor (see :meth:`ActorSystem.ask`)."""
        return await self.system.ask(recipient, msg, timeout_s=timeout_s, sender=self.name)


def _resolve(handlers: dict[type[Message], str], message_type: type[Message]) -> str | None:
    """The handler attribute for ``message_type``: the one for the nearest class in its MRO."""
    for cls in message_type.__mro__:
        attribute = handlers.get(cls)
        if attribute is not None:
            return attribute
    return None


class _Mailbox:
    """An actor's queue: a deque and at most one waiting getter (an ``asyncio.Queue`` costs more per item)."""

    __slots__ = ("items", "_waiter")

    def __init__(self) -> None:
        self.items: deque[_Request] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: _Request) -> None:
        self.items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> _Request:
        while not self.items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter
        return self.items.popleft()

    def get_nowait(self) -> _Request:
        return self.items.popleft()

    def qsize(self) -> int:
        return len(self.items)

    def empty(self) -> bool:
        return not self.items


_new_tuple: Final = tuple.__new__
"""Makes a named tuple (an Event, an Envelope) from a tuple of its fields in C: ``Envelope(...)`` runs
NamedTuple's Python-level ``__new__``, and these are made several times per message."""


def _type_name(value: object) -> str:
    return "None" if value is None else type(value).__qualname__


def _describe(envelope: Envelope) -> str:
    return f"#{envelope.msg_id} {type(envelope.body).__qualname__} {envelope.sender}->{envelope.recipient}"
