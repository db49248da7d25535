"""The live driver's actors: what carries an engine's inputs and outputs in a live process.

An :class:`ActorSystem` owns one process's actors (passed in, never global); an :class:`Actor` has a name and one
method, :meth:`Actor.receive`, called with the time the moment a message arrives (no mailboxes, tasks or replies:
an engine's handler never waits; SimPy's real-time mode). :meth:`ActorSystem.tell` delivers an
:class:`~dualpath_emu.messages.Envelope` ``latency_s`` of loop time later, as an object; what is sent at one
instant travels as one batch with one loop callback, so delivery is FIFO per system, and a message for an actor
not started yet waits for its start. An exception from ``receive`` (or :meth:`ActorSystem.fail`) fails the run
with :class:`ActorFailure`; messages to a stopped actor are dropped and counted. :attr:`ActorSystem.events`
holds ``(t_ns, seq, actor, kind, summary)`` per start, stop, tell, deliver, drop, failure and the actors' own
records, never an object's address. Code outside any actor sends as :data:`MAIN`."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

from dualpath_emu.messages import Envelope, Message
from dualpath_emu.runtime.core_work import CoreWork
from dualpath_emu.runtime.engine import Watch
from dualpath_emu.runtime.eventlog import Event

__all__ = ["MAIN", "Actor", "ActorError", "ActorFailure", "ActorSystem", "Event", "UnknownActorError"]

MAIN: Final = "main"  # The sender name of tells made by code outside any actor (``ActorSystem.tell``).

DEFAULT_FAILURE_EVENTS: Final = 20  # How many of the last events an :class:`ActorFailure` carries by default.

_T = TypeVar("_T")

_RawEvent = tuple[int, int, str, str, str]
_new_tuple: Final = tuple.__new__
"""Makes an Envelope from a tuple of its fields in C (NamedTuple's ``__new__`` is Python, once a message)."""


class ActorError(Exception):
    """Base of the actor runtime's errors."""


class UnknownActorError(ActorError, LookupError):
    """A tell to a name no actor of this system has."""

    def __init__(self, actor: str) -> None:
        super().__init__(f"no actor named {actor!r} in this actor system")
        self.actor = actor


class ActorFailure(ActorError):
    """An actor raised handling a message: the run is over (``actor``, ``error``, the last ``events``)."""

    def __init__(self, actor: str, error: BaseException, events: tuple[Event, ...]) -> None:
        lines = "\n".join(f"  {e.t_ns} {e.seq} {e.actor} {e.kind} {e.summary}" for e in events)
        super().__init__(
            f"actor {actor!r} failed: {type(error).__name__}: {error}\nlast {len(events)} events:\n{lines}"
        )
        self.actor = actor
        self.error = error
        self.events = events
        self.__cause__ = error


class Actor:
    """An actor: a name in one :class:`ActorSystem` and :meth:`receive`; messages to it wait for :meth:`start`."""

    def __init__(self, system: ActorSystem, name: str) -> None:
        self.system = system
        self.name = name
        self._started = False
        self._stopped = False
        self._waiting: deque[tuple[Envelope, str]] | None = deque()
        system._register(self)

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called (or the system failed)."""
        return self._stopped

    def receive(self, now_ns: int, msg: Message, sender: str) -> None:
        """Handle ``msg`` from ``sender`` (an actor, or :data:`MAIN`) at ``now_ns``; an exception fails the run."""
        raise NotImplementedError

    def start(self) -> None:
        """Start: handle the messages that came before, then each as it comes (call inside the running loop)."""
        if self._stopped:
            raise RuntimeError(f"actor {self.name!r} is stopped and cannot be started again")
        if self._started:
            raise RuntimeError(f"actor {self.name!r} is already started")
        self._started = True
        self.system.record(self.name, "start", type(self).__qualname__)
        self.started()
        waiting, self._waiting = self._waiting, None
        for envelope, summary in waiting or ():
            self.system._deliver(self, envelope, summary)

    def started(self) -> None:
        """Called by :meth:`start` before the messages that came before it are handled; nothing by default."""

    def stop(self) -> None:
        """Stop now: what comes for it from now on, and what waited for its start, is dropped."""
        if self._stopped:
            return
        self._stopped = True
        waiting, self._waiting = self._waiting or deque(), None
        self.system.record(self.name, "stop", f"{len(waiting)} queued")
        for envelope, summary in waiting:
            self.system._drop(envelope, summary)


class ActorSystem:
    """The actors of one process, their deliveries, message ids and event record, bound to the running loop when
    first used. ``latency_s``: every in-process message's delivery latency (loop seconds); ``failure_events``: the
    last events an :class:`ActorFailure` carries; ``record_messages``: record every ``tell`` and ``deliver`` (off:
    only the actors' own and exceptional events); ``data_plane``: what its actors move bytes through."""

    def __init__(
        self, *, latency_s: float = 0.0, failure_events: int = DEFAULT_FAILURE_EVENTS, record_messages: bool = True,
        data_plane: CoreWork | None = None,
    ) -> None:  # fmt: skip
        if not latency_s >= 0.0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self._latency_s = latency_s
        self._data_plane = data_plane
        self.record_messages = record_messages
        self.failure_events = failure_events
        # Events as plain tuples, appended on the hot paths; `events` turns them into Event as read. With an event
        # sink, the log is handed over in chunks: `_log_base` events came before `_log`, whose tuples number their
        # seq from 0 (the sink and `events` add the base).
        self._log: list[_RawEvent] = []
        self._events: list[Event] = []
        self._log_base = 0
        self._sink: Callable[[list[_RawEvent], int], None] | None = None
        self._sink_chunk = 0
        self.dropped = 0  # Messages dropped because their recipient was stopped.
        self.watch = Watch()
        """Who, beside the event record, is told of the engines' observations (:class:`~.engine.Watch`): set by
        the application before its actors start (a process's metrics part, the end of the workload)."""
        self.failure: ActorFailure | None = None
        self._actors: dict[str, Actor] = {}
        self._next_msg_id = 1
        # Batches of messages in flight, one per send instant, oldest first; each has one loop callback.
        self._in_flight: deque[list[tuple[Envelope, str]]] = deque()
        self._open_batch: list[tuple[Envelope, str]] | None = None
        self._open_batch_ns = -1
        self._clock: Callable[[], int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main_task: asyncio.Task[Any] | None = None

    @property
    def latency_s(self) -> float:
        """The delivery latency of every in-process message (fixed: FIFO delivery relies on it)."""
        return self._latency_s

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
        clock: Callable[[], int] | None = getattr(loop, "clock_ns", None)  # a RealTimeLoop's: integer ns
        if clock is None:
            clock = lambda: round(loop.time() * 1e9)  # noqa: E731
        self._clock = clock
        return clock

    def now_ns(self) -> int:
        """The loop's clock in nanoseconds."""
        clock = self._clock
        return (clock if clock is not None else self._bind())()

    @property
    def data_plane(self) -> CoreWork:
        """The data plane handed to the system, which its actors move bytes through (they do not know which)."""
        if self._data_plane is None:
            raise RuntimeError("this actor system was given no data plane (ActorSystem(data_plane=...))")
        return self._data_plane

    @property
    def events(self) -> list[Event]:
        """The events not handed to the event sink yet, oldest first (:meth:`record` adds to them)."""
        log, events, base = self._log, self._events, self._log_base
        if len(events) < len(log):
            events.extend(Event(t, seq + base, a, k, m) for t, seq, a, k, m in log[len(events) :])
        return events

    @property
    def event_count(self) -> int:
        """How many events were recorded (without converting them), those handed to a sink included."""
        return self._log_base + len(self._log)

    def raw_events(self) -> list[_RawEvent]:
        """The events as ``(t_ns, seq, actor, kind, summary)`` tuples (not copied: do not modify)."""
        if self._log_base:
            raise RuntimeError("the events went to the event sink; raw_events() holds only the rest")
        return self._log

    def set_event_sink(self, sink: Callable[[list[_RawEvent], int], None], chunk: int = 1 << 16) -> None:
        """Hand the events to ``sink(events, first_seq)`` in chunks of about ``chunk`` instead of keeping them."""
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

    def record(self, actor: str, kind: str, summary: str) -> None:
        """Append an event at the current time (actors record their own events too)."""
        log = self._log
        log.append((self.now_ns(), len(log), actor, kind, summary))

    def last_events(self, n: int) -> tuple[Event, ...]:
        """The last ``n`` events."""
        base = self._log_base
        return tuple(Event(t, seq + base, a, k, m) for t, seq, a, k, m in self._log[-n:]) if n > 0 else ()

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

    def _new_msg_id(self) -> int:
        msg_id = self._next_msg_id
        self._next_msg_id = msg_id + 1
        return msg_id

    def tell(self, recipient: str, msg: Message, *, sender: str = MAIN) -> None:
        """Send ``msg`` to ``recipient`` and return at once (dropped and counted if it is stopped)."""
        target = self._actors.get(recipient)
        if target is None:
            raise UnknownActorError(recipient)
        msg_id = self._next_msg_id
        self._next_msg_id = msg_id + 1
        envelope = _new_tuple(Envelope, (sender, recipient, msg_id, msg))
        clock = self._clock
        now = clock() if clock is not None else self._bind()()
        summary = ""  # made only when it is recorded
        if self.record_messages:
            summary = f"#{msg_id} {type(msg).__qualname__} {sender}->{recipient}"
            log = self._log
            log.append((now, len(log), sender, "tell", summary))
        if target._stopped:
            self._drop(envelope, summary)
            return
        # One constant latency, so arrivals come in send order. What is sent before the open batch arrives travels
        # with it: without latency, all of it (one loop callback per iteration, not per message: a live clock moves
        # between two tells); with, what was sent at its instant.
        batch = self._open_batch
        if batch is not None and (self._open_batch_ns == now or self._latency_s == 0.0):
            batch.append((envelope, summary))
            return
        batch = self._open_batch = [(envelope, summary)]
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
        # What _deliver does, inlined: the hottest path of a live process.
        actors, log, record, now = self._actors, self._log, self.record_messages, self.now_ns()
        for envelope, summary in batch:
            target = actors[envelope[1]]
            if target._stopped or target._waiting is not None:
                self._deliver(target, envelope, summary)
                continue
            if record:
                log.append((now, len(log), envelope[1], "deliver", summary))
            try:
                target.receive(now, envelope[3], envelope[0])
            except Exception as error:
                self._fail(target, summary or _describe(envelope), error)

    def _deliver(self, target: Actor, envelope: Envelope, summary: str) -> None:
        """``envelope`` has reached ``target``: it handles it now (or when it starts; dropped if stopped)."""
        if target._stopped:
            self._drop(envelope, summary)
            return
        if target._waiting is not None:
            target._waiting.append((envelope, summary))
            return
        now = self.now_ns()
        if self.record_messages:
            log = self._log
            log.append((now, len(log), target.name, "deliver", summary))
        try:
            target.receive(now, envelope.body, envelope.sender)
        except Exception as error:
            self._fail(target, summary or _describe(envelope), error)

    def _drop(self, envelope: Envelope, summary: str) -> None:
        self.dropped += 1
        self.record(envelope.recipient, "drop", summary or _describe(envelope))

    def fail(self, actor: Actor, error: Exception) -> None:
        """Fail the run as a failing handler does, from code of ``actor`` outside a handler (a callback)."""
        self._fail(actor, "runtime", error)

    def _fail(self, actor: Actor, where: str, error: Exception) -> None:
        self.record(actor.name, "failure", f"{where}: {type(error).__name__}: {error}")
        if self.failure is None:
            self.failure = ActorFailure(actor.name, error, self.last_events(self.failure_events))
        if self._main_task is not None:
            self._main_task.cancel()
        self.stop_all()

    def stop_all(self) -> None:
        """Stop every actor, in registration order."""
        for actor in list(self._actors.values()):
            actor.stop()

    async def run(self, main: Coroutine[Any, Any, _T]) -> _T:
        """Run ``main`` as the driver, then stop every actor; an actor's failure cancels it."""
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
            self.stop_all()
        if self.failure is not None:
            raise self.failure
        return result


def _describe(envelope: Envelope) -> str:
    """A message's summary in the event log: ``#id Type sender->recipient``."""
    return f"#{envelope.msg_id} {type(envelope.body).__qualname__} {envelope.sender}->{envelope.recipient}"
