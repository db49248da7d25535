"""The virtual-time driver: engines stepped by a plain loop over the core's clock, no asyncio (docs/architecture.md).

:class:`VirtualDriver` holds a run's engines and one FIFO of inputs due now; when it is empty, the queued requests go
to the core in one call per kind and the core runs to the next completion, whose ``then`` joins the FIFO in the
core's order: a run repeats byte for byte from its seed. The plane is chosen by name from :data:`PLANES`. Nothing due,
nothing in the core and the run not done is a :class:`DeadlockError`; no progress for long, a :class:`NoProgressError`.
Off by default, ``order_seed`` delivers the inputs due at one instant in a seeded random order and ``message_delay_ns``
delays each message between engines by up to that much, as a live run may (each keeps every sender-recipient pair's
FIFO): interleavings the fixed order never reaches."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Protocol

from dualpath_emu._core import UNREPORTED_TAG, Core
from dualpath_emu.errors import NoProgressError
from dualpath_emu.messages import Message
from dualpath_emu.runtime.engine import DataPlane, DecodeReport, Engine, Extents, Hop, Observed, Then, Watch

__all__ = [
    "CoreDataPlane", "DeadlockError", "EventSink", "NoProgressError", "PLANES", "PlaneFactory", "ProgressWatch",
    "VirtualDriver", "VirtualPlane", "submit_batch",
]  # fmt: skip

_U64_MAX: Final = 2**64 - 1
_MAX_STALLS: Final = 10_000
"""Consecutive advances that neither move the clock nor complete anything before the core is called stuck."""

EventSink = Callable[[list[tuple[int, str, Observed]], int], None]
"""Takes a chunk of observations ``(t_ns, engine, record)`` and the number of the chunk's first."""


class DeadlockError(RuntimeError):
    """Nothing is due, the core has no event, and the run is not done."""


@dataclass
class ProgressWatch:
    """Stops a run without progress for ``limit_ns`` emulated (:class:`NoProgressError`), checked every ``every_ns``."""

    limit_ns: int
    every_ns: int
    last_progress_ns: Callable[[], int | None]
    describe: Callable[[int, int], str]


def submit_batch(
    core: Core, transfers: list[Any], forwards: list[Any], ios: list[Any], timers: list[Any], joins: list[Any],
    refused: Callable[[int, Exception], None] | None = None,
) -> None:  # fmt: skip
    """Submit one batch to a core here, one call per kind; ``refused(tag, error)`` for each refused, if given."""
    if refused is None:  # the virtual driver's hot path: a call per kind and nothing else
        if transfers:
            core.submit_transfers(transfers)
        if forwards:
            core.submit_forwards(forwards)
        if ios:
            core.submit_ios(ios)
        if timers:
            core.add_timers(timers)
        if joins:
            core.submit_decode_joins(joins)
    else:
        for submit, batch, tag_at in ((core.submit_transfers, transfers, 3), (core.submit_forwards, forwards, 5),
                                      (core.submit_ios, ios, 4), (core.add_timers, timers, 1),
                                      (core.submit_decode_joins, joins, None)):  # fmt: skip
            try:
                if batch:
                    submit(batch)
            except Exception:
                for item in batch:
                    try:
                        submit([item])
                    except Exception as error:
                        refused(UNREPORTED_TAG if tag_at is None else item[tag_at], error)


class CoreDataPlane:
    """The in-process core as an engine's data plane: one core call per kind (:meth:`flush`)."""

    __slots__ = ("core", "_dispatch", "_next_tag", "_waiters", "_standing", "_transfers", "_forwards", "_ios",
                 "_timers", "_joins")  # fmt: skip

    def __init__(self, core: Core, dispatch: Callable[[Then], None]) -> None:
        self.core = core
        self._dispatch = dispatch
        self._next_tag = 1
        self._waiters: dict[int, Then] = {}
        self._standing: dict[int, Then] = {}  # Tags that complete again and again (a decode node's reports).
        self._transfers: list[tuple[tuple[int, ...], int, int, int]] = []
        self._forwards: list[tuple[int, tuple[Any, ...], int, tuple[Hop, ...], int, int]] = []
        self._ios: list[tuple[int, str, int, int, int]] = []
        self._timers: list[tuple[int, int]] = []
        self._joins: list[tuple[int, int, int, int, int, int, int, int]] = []

    def _tag(self, then: Then | None) -> int:
        if then is None:
            return UNREPORTED_TAG
        tag = self._next_tag
        self._next_tag = tag + 1
        self._waiters[tag] = then
        return tag

    def transfer(self, path: tuple[int, ...], lane: int, size_bytes: int, then: Then | None) -> None:
        self._transfers.append((path, lane, size_bytes, self._tag(then)))

    def io(self, storage_node: int, kind: str, lane: int, size_bytes: int, extents: Extents, then: Then | None) -> None:
        self._ios.append((storage_node, kind, lane, size_bytes, self._tag(then)))

    def forward(
        self, n_layers: int, ranks: Sequence[tuple[Hop | None, int, Hop | None]], ffn_ns: int,
        collectives: Sequence[Hop], then: Then,
    ) -> None:  # fmt: skip
        self._forwards.append((n_layers, tuple(ranks), ffn_ns, tuple(collectives), 0, self._tag(then)))

    def timer(self, at_ns: int, then: Then) -> None:
        self._timers.append((at_ns, self._tag(then)))

    def clock_ns(self) -> int:
        return self.core.now_ns

    def set_port_factor(self, port: int, factor: float) -> None:
        self.flush()  # what was asked for before the fault starts before it
        self.core.set_port_factor(port, factor)

    def set_port_latency(self, port: int, extra_ns: int) -> None:
        self.flush()
        self.core.set_port_latency(port, extra_ns)

    def decode_node(self, report: DecodeReport, **spec: Any) -> int:
        """Add a node's decode GPUs to the core; ``report(now, ended, spans)`` whenever some of its requests ended."""
        core, tag = self.core, self._next_tag
        self._next_tag = tag + 1
        node = core.add_decode_node(report_tag=tag, **spec)
        self._standing[tag] = lambda now: report(now, *core.take_decoded(node))
        return node

    def decode_join(
        self, node: int, gpu: int, rid: int, prompt: int, gen: int, produced: int, stored_blocks: int, context: int
    ) -> None:
        """A request joins decode node ``node``'s GPU ``gpu`` now (submitted with the batch, after the timers)."""
        self._joins.append((node, gpu, rid, prompt, gen, produced, stored_blocks, context))

    def decode_bytes(self, node: int) -> dict[str, Any] | None:
        """The bytes decode node ``node`` moved on its own so far."""
        return self.core.decode_bytes(node)

    def decode_reset(self, node: int) -> None:
        """An engine crash: decode node ``node`` drops every request now; the spans' report is handed over now."""
        self.flush()  # what was asked for before the crash happens before it
        self.core.decode_reset(node)
        self.deliver(self.core.take_completions())

    def discard(self, extents: Extents) -> None:
        """Nothing to drop: the core models bytes, it stores none."""

    def pool(self, node: int, op: str, extents: Extents) -> None:
        """Nothing to keep: the core models bytes, it stores none."""

    @property
    def waiting(self) -> int:
        """Requests whose end someone waits for."""
        return len(self._waiters)

    def flush(self) -> None:
        """Submit what was queued (one call per kind, in the order transfers, forwards, I/O, timers, decode joins)."""
        transfers, forwards, ios, timers, joins = self._transfers, self._forwards, self._ios, self._timers, self._joins
        if transfers or forwards or ios or timers or joins:
            self._transfers, self._forwards, self._ios, self._timers, self._joins = [], [], [], [], []
            submit_batch(self.core, transfers, forwards, ios, timers, joins)

    def deliver(self, completions: list[tuple[str, int, int, int, int, int]]) -> None:
        """Hand each completion's ``then`` to the driver, in the core's order."""
        waiters, dispatch = self._waiters, self._dispatch
        for completion in completions:
            then = waiters.pop(completion[1], None)
            if then is None:
                then = self._standing.get(completion[1])
                if then is None:
                    raise RuntimeError(f"the core completed work with tag {completion[1]} that nobody asked for")
            dispatch(then)


class VirtualPlane(DataPlane, Protocol):
    """A data plane the virtual driver can run: a :class:`DataPlane` plus what the driver asks between inputs."""

    def flush(self) -> None:
        """Submit what was asked for to the core (the driver calls it when nothing is due)."""

    def deliver(self, completions: list[tuple[str, int, int, int, int, int]]) -> None:
        """Hand each of the core's completions' ``then`` to the driver's dispatch, in the core's order."""

    @property
    def waiting(self) -> int:
        """Requests whose end someone waits for (what a deadlock's error counts)."""
        ...


PlaneFactory = Callable[[Core, Callable[[Then], None]], VirtualPlane]
"""Makes a run's plane from its core and the driver's dispatch (``then`` callbacks go there)."""

PLANES: Mapping[str, PlaneFactory] = {"core": CoreDataPlane}
"""The virtual driver's planes by name (a run passes the registry in: a user's plane is one more entry)."""


def _handler(driver: VirtualDriver, sender: str, recipient: str, msg: Message) -> Callable[[int, Any, str], None]:
    try:
        handler = driver._handlers[recipient].get(type(msg))
    except KeyError:
        raise LookupError(f"engine {sender!r} sent {type(msg).__qualname__} to {recipient!r}, which is not an engine "
                          f"of this run") from None  # fmt: skip
    # None: the first of its type: receive binds the handler (or raises UnhandledInputError)
    return driver._receivers[recipient] if handler is None else handler


class _Outbox:
    """One engine's outbox in virtual time."""

    __slots__ = ("_driver", "_name")

    def __init__(self, driver: VirtualDriver, name: str) -> None:
        self._driver, self._name = driver, name

    def send(self, recipient: str, msg: Message) -> None:
        driver = self._driver
        try:
            handler = driver._handlers[recipient].get(type(msg))
        except KeyError:
            raise LookupError(f"engine {self._name!r} sent {type(msg).__qualname__} to {recipient!r}, which is not "
                              f"an engine of this run") from None  # fmt: skip
        if handler is None:  # the first of its type: receive binds the handler (or raises UnhandledInputError)
            handler = driver._receivers[recipient]
        driver._due.append((handler, msg, self._name))

    def observe(self, record: Observed) -> None:
        driver = self._driver
        callback = driver._callbacks.get(type(record))
        if callback is not None:
            callback(driver.now_ns, record)
        if type(record) in driver._unlogged:
            return
        log = driver._log
        log.append((driver.now_ns, self._name, record))
        if len(log) >= driver._chunk and driver._sink is not None:
            driver.flush_events()


class _ChannelOutbox(_Outbox):
    """An outbox whose messages name their recipient too (``order_seed``), and may be delayed (``message_delay_ns``)."""

    __slots__ = ()

    def send(self, recipient: str, msg: Message) -> None:
        driver = self._driver
        driver._post((_handler(driver, self._name, recipient, msg), msg, self._name, recipient))


def _check_progress(watch: ProgressWatch | None, now: int) -> int:
    """Raise :class:`NoProgressError` if ``watch`` saw no progress for its limit; the next time to look."""
    assert watch is not None
    last = watch.last_progress_ns()
    if last is not None and now - last >= watch.limit_ns:
        raise NoProgressError(watch.describe(now, last))
    return now + watch.every_ns


class VirtualDriver:
    """Runs engines over ``core`` in virtual time: :meth:`outbox`, :attr:`plane`, :meth:`add`, :meth:`run`.

    ``order_seed``: the inputs due at one instant are delivered in an order drawn from ``random.Random(order_seed)``
    (this driver's own), not first in first out, yet each sender's messages to one recipient in the order sent (as
    ZeroMQ keeps them; :meth:`send`'s sender is ``"main"``); each data-plane completion is a channel of its own.
    ``message_delay_ns`` (only with ``order_seed``, from the same stream): each message between engines arrives
    after a delay drawn uniformly from ``[0, message_delay_ns]`` ns, never before an earlier one of its pair (a core
    timer carries it; the run is done only once none is in flight). ``watch``: who else is told of the engines'
    observations as they are made (:class:`~dualpath_emu.runtime.engine.Watch`: a run's metrics)."""

    def __init__(
        self, core: Core, *, sink: EventSink | None = None, chunk: int = 65_536, plane: PlaneFactory = CoreDataPlane,
        order_seed: int | None = None, message_delay_ns: int = 0, watch: Watch = Watch(),
    ) -> None:  # fmt: skip
        if message_delay_ns < 0 or (message_delay_ns and order_seed is None):
            raise ValueError(f"message_delay_ns: expected 0, or a number of ns >= 0 with an order_seed, got "
                             f"{message_delay_ns} (order_seed={order_seed})")  # fmt: skip
        self._rng = None if order_seed is None else random.Random(order_seed)
        self._delay_ns = message_delay_ns
        self._flight: dict[tuple[str, str], deque[tuple[Any, ...]]] = {}
        """Per (sender, recipient), the delayed messages not yet due, in the order sent."""
        self._last_at: dict[tuple[str, str], int] = {}
        """Per (sender, recipient), when its last delayed message is due."""
        self._in_flight = 0
        self.core = core
        self.now_ns = core.now_ns
        self._due: deque[Any] = deque()
        self.plane = plane(core, self._due.append)
        self.engines: list[Engine] = []
        self._receivers: dict[str, Callable[[int, Message, str], None]] = {}
        self._handlers: dict[str, dict[type[Message], Callable[[int, Any, str], None]]] = {}
        """Per engine, the handlers its :meth:`~Engine.receive` has bound, by message type (a call less a message)."""
        self._log: list[tuple[int, str, Observed]] = []
        self._sink = sink
        self._chunk = chunk
        self._callbacks, self._unlogged = dict(watch.callbacks), watch.unlogged
        self._flushed = 0

    def outbox(self, name: str) -> _Outbox:
        """The outbox of the engine called ``name``."""
        return _Outbox(self, name) if self._rng is None else _ChannelOutbox(self, name)

    def add(self, engine: Engine) -> None:
        """Add ``engine`` (started, in the order added, when the run starts)."""
        if engine.name in self._receivers:
            raise ValueError(f"two engines are called {engine.name!r}")
        self.engines.append(engine)
        self._receivers[engine.name] = engine.receive
        # An engine whose class has its own receive gets every message through it.
        self._handlers[engine.name] = engine._bound if type(engine).receive is Engine.receive else {}

    def send(self, recipient: str, msg: Message, sender: str = "main") -> None:
        """Send ``msg`` to an engine from outside the engines (e.g. the run's start)."""
        handler = self._handlers[recipient].get(type(msg)) or self._receivers[recipient]
        self._due.append((handler, msg, sender, recipient))

    def _post(self, item: tuple[Any, ...]) -> None:
        """Queue message ``item`` ``(handler, msg, sender, recipient)`` from an engine, now or after its delay."""
        if not self._delay_ns:
            self._due.append(item)
            return
        assert self._rng is not None
        key = (item[2], item[3])
        at = max(self.now_ns + self._rng.randint(0, self._delay_ns), self._last_at.get(key, 0))
        self._last_at[key] = at
        self._flight.setdefault(key, deque()).append(item)
        self._in_flight += 1
        self.plane.timer(at, partial(self._arrive, key))

    def _arrive(self, key: tuple[str, str], now: int) -> None:
        """A timer of pair ``key`` fired: its first message in flight is due (its timers fire in time order, so the
        k-th to fire is the k-th message's, whatever the order of those due at one instant)."""
        self._due.append(self._flight[key].popleft())
        self._in_flight -= 1

    @property
    def event_count(self) -> int:
        """Observations recorded so far."""
        return self._flushed + len(self._log)

    @property
    def events(self) -> list[tuple[int, int, str, str, str]]:
        """The observations not yet handed to the sink, numbered, as the event log's fields."""
        base = self._flushed
        return [(t, base + i, a, r.kind, r.summary()) for i, (t, a, r) in enumerate(self._log)]

    def flush_events(self) -> None:
        """Hand the observations recorded so far to the sink."""
        if self._sink is not None and self._log:
            log, self._log = self._log, []
            self._sink(log, self._flushed)
            self._flushed += len(log)

    def run(self, done: Callable[[], bool], watch: ProgressWatch | None = None) -> None:
        """Start the engines, then step until ``done()`` is true once nothing is due or in flight (or ``watch`` stops
        it). Each instant's inputs go FIFO, or with ``order_seed`` in a drawn order (:meth:`_deliver_shuffled`)."""
        for engine in self.engines:
            engine.start(self.now_ns)
        deliver = self._deliver_fifo if self._rng is None else self._deliver_shuffled
        core, plane = self.core, self.plane
        stalls = 0
        check_ns = _U64_MAX if watch is None else self.now_ns + watch.every_ns
        while True:
            now = self.now_ns
            if now >= check_ns:
                check_ns = _check_progress(watch, now)
            deliver(now)
            if not self._in_flight and done():  # (delayed messages: none without message_delay_ns)
                break
            plane.flush()
            completions = core.advance_until(_U64_MAX)
            if completions:
                stalls = 0
                self.now_ns = core.now_ns
                plane.deliver(completions)
                continue
            if core.next_event_ns() is None:
                raise DeadlockError(
                    f"deadlock at virtual time {core.now_ns} ns: nothing is due and the core has no event, yet the "
                    f"run is not done ({plane.waiting} request(s) to the data plane still awaited)"
                )
            stalls += 1
            if stalls > _MAX_STALLS:
                raise RuntimeError(f"the core reports an event at {core.now_ns} ns but handles none there")
            self.now_ns = core.now_ns
        plane.flush()  # what the last instant asked for (block write-backs) reaches the core
        self.flush_events()

    def _deliver_fifo(self, now: int) -> None:
        """Deliver what is due at ``now``, and what that makes due, in the order it became due."""
        due = self._due
        popleft = due.popleft
        while due:
            item = popleft()
            if type(item) is tuple:
                item[0](now, item[1], item[2])
            else:
                item(now)

    def _deliver_shuffled(self, now: int) -> None:
        """Deliver what is due at ``now``, and what that makes due, in a random order that keeps each channel's:
        messages of one (sender, recipient) pair are one channel, each completion one of its own."""
        due, rng = self._due, self._rng
        assert rng is not None
        channels: dict[tuple[str, str], deque[tuple[Any, ...]]] = {}
        ready: list[Any] = []  # the channels with something due: a pair (its queue in channels), or a completion
        while True:
            while due:
                item = due.popleft()
                if type(item) is tuple:
                    key = (item[2], item[3])
                    queue = channels.get(key)
                    if queue is None:
                        channels[key] = deque((item,))
                        ready.append(key)
                    else:
                        queue.append(item)
                else:
                    ready.append(item)
            if not ready:
                return
            i = rng.randrange(len(ready))
            entry = ready[i]
            if type(entry) is tuple:
                queue = channels[entry]
                item = queue.popleft()
                if not queue:
                    del channels[entry]
                    ready[i] = ready[-1]
                    ready.pop()
                item[0](now, item[1], item[2])
            else:
                ready[i] = ready[-1]
                ready.pop()
                entry(now)

    def drain(self) -> None:
        """After :meth:`run`: let the core finish what is left (write-backs), through the plane, engines idle."""
        core, plane = self.core, self.plane
        while core.next_event_ns() is not None:
            completions = core.advance_until(_U64_MAX)
            if completions:
                plane.deliver(completions)
        self.now_ns = core.now_ns
