"""An asyncio event loop whose clock is the core's virtual clock (DESIGN.md §3, issue 3).

:class:`VirtualTimeLoop` runs every ready callback; only when nothing is ready does it jump the core's
clock to the next event (the earliest asyncio timer or core event), deliver what completed there and go
on. ``asyncio.sleep``, ``wait_for``, ``asyncio.timeout`` and ``call_later`` therefore work in virtual time,
and a 3,000-second emulated run takes as long as its callbacks, not 3,000 seconds. Nothing here reads the
wall clock.

**When the clock moves.** asyncio's ``_run_once`` asks its selector to wait (``select(timeout)`` with
``timeout`` None or > 0) only when no callback is ready. The loop's selector then never sleeps: it polls
the real file descriptors without blocking (the loop's self-pipe, which carries signals; real descriptors
are looked at only at these idle moments), and if none is ready it calls
``core.advance_to(t)`` with ``t`` the earliest of the first asyncio timer's firing time and
``core.next_event_ns()``, resolves the futures of the completions returned, and returns. When there is no
timer and the core has no event while a coroutine still waits, that coroutine waits for something that
can never happen: :class:`DeadlockError` is raised out of ``run_until_complete`` instead of hanging.

**Timer rounding.** asyncio keeps deadlines as float seconds; the clock counts integer nanoseconds and
``time()`` is ``now_ns / 1e9``. A timer with deadline ``when`` fires at the first nanosecond ``n`` with
``when < n / 1e9 + 0.5e-9`` (asyncio's own test, with the loop's clock resolution fixed at half a
nanosecond): ``when`` rounded to the nearest nanosecond, so float sums such as ``0.02 + 0.02`` land on
the nanosecond they mean. The selector computes that ``n`` with the same float expression asyncio uses,
so a timer always fires at the instant the loop jumps to for it (the loop never spins), and never
earlier. Exact to the nanosecond while time is below about 10^6 s (float spacing there is still well
under half a nanosecond); beyond that, deterministic but possibly a nanosecond off.

**Tie order at one instant** (fixed, so runs repeat): (1) callbacks already ready run first, since the
clock never moves while anything is ready; (2) then core completions, in the core's completion order;
(3) then asyncio timers due at that nanosecond, in asyncio's heap order (by deadline; equal deadlines in
an order fixed by the sequence of timer operations, not necessarily FIFO).

**Core work.** :meth:`VirtualTimeLoop.transfer`, :meth:`~VirtualTimeLoop.io` and
:meth:`~VirtualTimeLoop.core_timer` return futures resolved with the :class:`Completion`. Tags come from
a per-loop counter. Requests are batched until the loop is next idle, then submitted in one
``submit_transfers``, one ``submit_ios`` and one ``add_timers`` call (in that order). The clock does not
move while callbacks are ready, so each request still starts at the instant it was made; code that reads
the core's state directly (``in_flight``, ``storage_queue``) should call :meth:`~VirtualTimeLoop.flush`
first. Work submitted to the
core by other code must take its tag from :meth:`~VirtualTimeLoop.new_tag` and register it with
:meth:`~VirtualTimeLoop.expect`; a completion with a tag the loop does not know is an error.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Executor
from typing import Any, NamedTuple, TypeVar, TypeVarTuple, Unpack, cast

from dualpath_emu._core import Core

__all__ = [
    "Completion",
    "DeadlockError",
    "UnexpectedCompletionError",
    "VirtualTimeLoop",
    "run",
]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

# asyncio fires a timer when `when < time() + _clock_resolution`; half a nanosecond makes that "when
# rounded to the nearest nanosecond" (see the module docstring).
_CLOCK_RESOLUTION_S = 0.5e-9
_U64_MAX = 2**64 - 1
# Consecutive advances that neither move the clock nor complete anything nor fire a timer before the loop
# calls the core stuck (a core that keeps reporting an event "now" without handling it).
_MAX_STALLS = 10_000


class Completion(NamedTuple):
    """What the core reports when work ends: ``(kind, tag, start_ns, end_ns, size_bytes, lane)``.

    ``kind`` is ``"transfer"``, ``"read"``, ``"write"`` or ``"timer"``. A plain tuple compares equal.
    """

    kind: str
    tag: int
    start_ns: int
    end_ns: int
    size_bytes: int
    lane: int


class DeadlockError(RuntimeError):
    """The loop has nothing ready, no timer and no core event, yet a coroutine still waits."""


class UnexpectedCompletionError(RuntimeError):
    """The core completed work whose tag the loop was never told about (see ``VirtualTimeLoop.expect``)."""


class _VirtualSelector(selectors.SelectSelector):
    """The loop's selector: polls real descriptors without blocking, then lets the loop move the clock."""

    def __init__(self) -> None:
        super().__init__()
        self._advance: Callable[[], None] | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout == 0 or self._advance is None:
            # Callbacks are ready: run them first. Real descriptors wait until the virtual world is idle.
            return []
        # Real descriptors (the loop's self-pipe, for signals and other threads) are only ever polled: the
        # wall clock does not pass here.
        events = super().select(0)
        if events:
            return events
        # asyncio asked to wait: nothing is ready, so virtual time moves to the next event.
        self._advance()
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop on the virtual clock of ``core`` (a ``Core(clock="virtual")``).

    Use it as a loop factory, e.g. ``asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(core))``, or
    through :func:`run`. While it runs, submit work to the core through the loop (or with
    :meth:`new_tag` and :meth:`expect`), so that every completion reaches its waiter.
    """

    def __init__(self, core: Core) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        self._core = core
        self._clock_resolution = _CLOCK_RESOLUTION_S
        # asyncio's timer heap (a list of TimerHandle, earliest first); present in every CPython since 3.4.
        scheduled = getattr(self, "_scheduled", None)
        if not isinstance(scheduled, list):  # pragma: no cover - a future CPython without the heap
            raise RuntimeError("VirtualTimeLoop needs asyncio's BaseEventLoop._scheduled timer heap")
        self._next_tag = 1
        self._waiters: dict[int, asyncio.Future[Completion]] = {}
        self._pending_transfers: list[tuple[Sequence[int], int, int, int]] = []
        self._pending_ios: list[tuple[int, str, int, int, int]] = []
        self._pending_timers: list[tuple[int, int]] = []
        self._stalls = 0
        selector._advance = self._advance

    # --- the clock -----------------------------------------------------------------------------------

    @property
    def core(self) -> Core:
        """The core whose clock this loop runs on."""
        return self._core

    @property
    def now_ns(self) -> int:
        """The virtual time in integer nanoseconds."""
        return self._core.now_ns

    def time(self) -> float:
        """The virtual time in seconds: ``core.now_ns / 1e9``."""
        return self._core.now_ns / 1e9

    # --- core work -----------------------------------------------------------------------------------

    def new_tag(self) -> int:
        """A tag no other work of this loop uses (1, 2, 3, … in request order)."""
        tag = self._next_tag
        self._next_tag += 1
        return tag

    def expect(self, tag: int) -> asyncio.Future[Completion]:
        """A future resolved with the completion of ``tag``, for work submitted to the core directly."""
        if tag in self._waiters:
            raise ValueError(f"tag {tag} is already awaited")
        future: asyncio.Future[Completion] = self.create_future()
        self._waiters[tag] = future
        return future

    def transfer(self, path: Sequence[int], lane: int, size_bytes: int) -> asyncio.Future[Completion]:
        """Start a transfer of ``size_bytes`` on ``lane`` along ``path`` (port ids) now.

        The future resolves with its completion, or fails with the core's error for a bad argument.
        Cancelling the future does not stop the transfer: the core has no cancellation.
        """
        tag = self.new_tag()
        self._pending_transfers.append((tuple(path), lane, size_bytes, tag))
        return self.expect(tag)

    def io(self, node: int, kind: str, lane: int, size_bytes: int) -> asyncio.Future[Completion]:
        """Queue a storage I/O (``kind`` ``"read"`` or ``"write"``) on storage node ``node`` now."""
        tag = self.new_tag()
        self._pending_ios.append((node, kind, lane, size_bytes, tag))
        return self.expect(tag)

    def core_timer(self, at_ns: int) -> asyncio.Future[Completion]:
        """A timer in the core's event queue, completing at ``at_ns`` (a ``"timer"`` completion)."""
        tag = self.new_tag()
        self._pending_timers.append((at_ns, tag))
        return self.expect(tag)

    def flush(self) -> None:
        """Submit the work requested so far; the loop does this itself before it looks at the core."""
        if self._pending_transfers:
            transfers, self._pending_transfers = self._pending_transfers, []
            self._submit(self._core.submit_transfers, transfers, lambda t: t[3])
        if self._pending_ios:
            ios, self._pending_ios = self._pending_ios, []
            self._submit(self._core.submit_ios, ios, lambda t: t[4])
        if self._pending_timers:
            timers, self._pending_timers = self._pending_timers, []
            self._submit(self._core.add_timers, timers, lambda t: t[1])

    def _submit(self, submit: Callable[[list[_T]], int], batch: list[_T], tag_of: Callable[[_T], int]) -> None:
        try:
            submit(batch)
        except Exception:
            # The core checks a whole batch before accepting any of it, so nothing was submitted: retry one
            # at a time and give each bad request's error to its own future.
            for item in batch:
                try:
                    submit([item])
                except Exception as error:
                    future = self._waiters.pop(tag_of(item))
                    if not future.done():
                        future.set_exception(error)

    # --- moving the clock ----------------------------------------------------------------------------

    def _timer_fire_ns(self, when: float, now_ns: int) -> int:
        """The first nanosecond ``n >= now_ns`` at which asyncio fires a timer due at ``when`` seconds."""
        resolution = self._clock_resolution

        def fires(n: int) -> bool:  # asyncio's test in _run_once, with time() == n / 1e9
            return when < n / 1e9 + resolution

        if not math.isfinite(when) or when * 1e9 > _U64_MAX:
            raise OverflowError(f"a timer at {when} s is beyond the virtual clock's range")
        n = max(now_ns, math.floor(when * 1e9 - 0.5) + 1)
        while not fires(n):
            n += 1
        while n > now_ns and fires(n - 1):
            n -= 1
        return n

    def _advance(self) -> None:
        """Nothing is ready: jump to the next timer or core event and deliver the core's completions."""
        self.flush()
        core = self._core
        now = core.now_ns
        scheduled = cast("list[asyncio.TimerHandle]", getattr(self, "_scheduled"))
        timer_ns = self._timer_fire_ns(scheduled[0].when(), now) if scheduled else None
        core_ns = core.next_event_ns()
        if timer_ns is None and core_ns is None:
            raise DeadlockError(self._deadlock_message(now))
        target = min(t for t in (timer_ns, core_ns) if t is not None)
        completions = core.advance_to(target)
        if target == now and not completions and timer_ns != target:
            self._stalls += 1
            if self._stalls > _MAX_STALLS:
                raise RuntimeError(f"the core reports an event at {now} ns but handles none there")
        else:
            self._stalls = 0
        self._deliver(completions)

    def _deliver(self, completions: list[tuple[str, int, int, int, int, int]]) -> None:
        unknown: list[int] = []
        for raw in completions:
            future = self._waiters.pop(raw[1], None)
            if future is None:
                unknown.append(raw[1])
            elif not future.done():  # a waiter may have given up (cancelled, e.g. by wait_for)
                future.set_result(Completion._make(raw))
        if unknown:
            raise UnexpectedCompletionError(
                f"the core completed work with tags {unknown} at {self._core.now_ns} ns that nobody awaits; "
                "submit through the loop or register the tag with VirtualTimeLoop.expect"
            )

    def _deadlock_message(self, now_ns: int) -> str:
        tasks = sorted(asyncio.all_tasks(self), key=lambda task: task.get_name())
        waiting = ", ".join(
            f"{task.get_name()} ({getattr(task.get_coro(), '__qualname__', '?')})" for task in tasks[:5]
        )
        more = f" and {len(tasks) - 5} more" if len(tasks) > 5 else ""
        return (
            f"deadlock at virtual time {now_ns} ns: nothing is ready, no timer is scheduled and the core has "
            f"no pending event, yet {len(tasks)} task(s) still wait for something that can never happen: "
            f"{waiting}{more}"
        )

    # --- threads have no place in virtual time --------------------------------------------------------

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[Unpack[_Ts]], _T], *args: Unpack[_Ts]
    ) -> asyncio.Future[_T]:
        """Run ``func`` at once, in this thread, taking no virtual time, and return its finished future.

        A thread pool would let the wall clock decide when its result arrives; inline it is deterministic
        (and ``asyncio.to_thread``, ``getaddrinfo`` and the shutdown of the default executor still work).
        """
        self._check_closed()  # type: ignore[attr-defined]  # BaseEventLoop's own check, not in typeshed
        future: asyncio.Future[_T] = self.create_future()
        try:
            future.set_result(func(*args))
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as error:
            future.set_exception(error)
        return future


def run(main: Coroutine[Any, Any, _T], core: Core) -> _T:
    """Run ``main`` to completion on a new :class:`VirtualTimeLoop` over ``core``; return its result."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(core)) as runner:
        return runner.run(main)
