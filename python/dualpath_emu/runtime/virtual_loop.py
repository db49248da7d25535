"""An asyncio event loop whose clock is the core's virtual clock (issue 3).

:class:`VirtualTimeLoop` runs every ready callback; only when nothing is ready does it jump the core's
clock to the next event (the earliest asyncio timer or core event), deliver what completed there and go
on. ``asyncio.sleep``, ``wait_for``, ``asyncio.timeout`` and ``call_later`` therefore work in virtual time,
and a 3,000-second emulated run takes as long as its callbacks, not 3,000 seconds. Nothing here reads the
wall clock.

**When the clock moves.** asyncio asks its selector to wait (``select(timeout)``, ``timeout`` the time to
its first timer or None) only when no callback is ready. The loop's selector then never sleeps: it polls
the real file descriptors without blocking (the loop's self-pipe, which carries signals; real descriptors
are looked at only at one idle moment in 16, and always before a deadlock is declared), and if none is
ready it calls ``core.advance_until(t)`` with ``t`` the nanosecond of that timer: the core handles its
events up to ``t`` but stops at the first instant where something completed (its internal events -- rate
changes, the pieces of a forward pass -- never wake Python); the loop resolves the futures of the
completions returned, and returns. When there is no timer and the core has no event while a coroutine
still waits, that coroutine waits for something that can never happen: :class:`DeadlockError` is raised
out of ``run_until_complete`` instead of hanging. Everything else is asyncio's own loop: the loop uses
asyncio's public interface (a selector, ``time()``) and sets one attribute of it, the clock resolution.

**Timer rounding.** asyncio keeps deadlines as float seconds; the clock counts integer nanoseconds and
``time()`` is ``now_ns / 1e9``. A timer with deadline ``when`` fires at the first nanosecond ``n`` with
``when < n / 1e9 + 0.5e-9`` (asyncio's own test, with the loop's clock resolution set to half a
nanosecond): ``when`` rounded to the nearest nanosecond, so float sums such as ``0.02 + 0.02`` land on
the nanosecond they mean.

**Tie order at one instant** (fixed, so runs repeat): (1) callbacks already ready run first, since the
clock never moves while anything is ready; (2) then core completions, in the core's completion order;
(3) then asyncio timers due at that nanosecond, in asyncio's heap order (by deadline; equal deadlines in
an order fixed by the sequence of timer operations, not necessarily FIFO).

**Core work**: the loop's data plane (:attr:`VirtualTimeLoop.plane`, a
:class:`~dualpath_emu.runtime.core_work.LocalCoreWork` bound to it): :meth:`~CoreWork.transfer`,
:meth:`~CoreWork.io` and :meth:`~CoreWork.core_timer` return futures resolved with the :class:`Completion`.
Requests are batched until the loop is next idle, then submitted in one call per kind. The clock does not
move while callbacks are ready, so each request still starts at the instant it was made. In virtual time the
core's clock is the loop's, so this loop drives its plane's core; the loop is still not the data plane, which
is handed to whoever moves bytes.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar, TypeVarTuple, Unpack

from dualpath_emu._core import Core
from dualpath_emu.errors import StateError
from dualpath_emu.runtime.core_work import Completion, LocalCoreWork, UnexpectedCompletionError

__all__ = [
    "Completion",
    "DeadlockError",
    "UnexpectedCompletionError",
    "VirtualTimeLoop",
    "run",
]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

_CLOCK_RESOLUTION_S = 0.5e-9
"""asyncio's timer resolution here: a deadline fires at its nearest nanosecond (see the module docstring)."""
_U64_MAX = 2**64 - 1  # advance_until's "no limit"
_END_NS = 2**63 - 1  # the last time the core's clock reaches (END_NS in the core)
_MAX_STALLS = 10_000
"""Consecutive advances that neither move the clock nor complete anything before the loop calls the core
stuck (a core that keeps reporting an event "now" without handling it)."""
_POLL_EVERY = 16
"""Real descriptors are polled at one idle moment in this many (and always before a deadlock is declared)."""


class DeadlockError(RuntimeError):
    """The loop has nothing ready, no timer and no core event, yet a coroutine still waits."""


class _VirtualSelector(selectors.SelectSelector):
    """The loop's selector: polls real descriptors without blocking, then lets the loop move the clock.

    asyncio calls ``select(timeout)`` once per iteration: ``0`` while callbacks are ready, else the time to its
    first timer (``None``: it has none). That is the only place virtual time can move."""

    def __init__(self) -> None:
        super().__init__()
        self._advance: Callable[[float | None], None] | None = None
        self._should_poll: Callable[[], bool] = lambda: True
        self._pending_events: list[tuple[selectors.SelectorKey, int]] = []

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self._pending_events:  # found ready while checking for a deadlock
            events, self._pending_events = self._pending_events, []
            return events
        if timeout == 0 or self._advance is None:
            # Callbacks are ready: run them first. Real descriptors wait until the virtual world is idle.
            return []
        # Real descriptors (the loop's self-pipe, for signals and other threads) are only ever polled, and
        # only at some idle moments: the wall clock does not pass here.
        if self._should_poll():
            events = super().select(0)
            if events:
                return events
        # asyncio asked to wait: nothing is ready, so virtual time moves to the next event.
        self._advance(timeout)
        return []

    def poll(self) -> bool:
        """Whether a real descriptor is ready now (its events are then handed out by the next select)."""
        self._pending_events = super().select(0)
        return bool(self._pending_events)


class _VirtualCore(LocalCoreWork):
    """The virtual-time loop's data plane: its clock is the loop's (no FFI call per reading)."""

    def clock_ns(self) -> int:
        return self.loop.clock_ns()  # type: ignore[attr-defined, no-any-return]  # a VirtualTimeLoop


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop on the virtual clock of ``core`` (a ``Core(clock="virtual")``).

    Use it as a loop factory, e.g. ``asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(core))``, or
    through :func:`run`. While it runs, submit work to the core through :attr:`plane` (or with its
    ``new_tag`` and ``expect``), so that every completion reaches its waiter.
    """

    def __init__(self, core: Core) -> None:
        selector = self._virtual_selector = _VirtualSelector()
        super().__init__(selector)
        self._core = core
        self.plane: LocalCoreWork = _VirtualCore(core)
        """The data plane on this loop's core."""
        self.plane.bind(self)
        # asyncio fires a timer once ``when < time() + _clock_resolution``: half a nanosecond rounds a deadline
        # to the nearest nanosecond (the one attribute of asyncio's own this loop sets).
        self._clock_resolution = _CLOCK_RESOLUTION_S
        self._stalls = 0
        # The clock, kept here so that reading it costs no FFI call; only _advance moves the core's clock
        # while the loop runs (run_forever re-reads it, in case other code moved it between runs).
        self._now = core.now_ns
        self._idle_count = 0
        selector._advance = self._advance
        selector._should_poll = self._should_poll

    # --- the clock -----------------------------------------------------------------------------------

    @property
    def now_ns(self) -> int:
        """The virtual time in integer nanoseconds."""
        return self._now

    def clock_ns(self) -> int:
        """The virtual time in integer nanoseconds."""
        return self._now

    def time(self) -> float:
        """The virtual time in seconds: ``core.now_ns / 1e9``."""
        return self._now / 1e9

    def run_forever(self) -> None:
        self._now = self._core.now_ns
        super().run_forever()

    # --- moving the clock ----------------------------------------------------------------------------

    def _timer_fire_ns(self, timeout_s: float, now_ns: int) -> int:
        """The first nanosecond ``n >= now_ns`` at which asyncio fires its first timer, ``timeout_s`` from now.

        asyncio fires it when ``when < n / 1e9 + resolution`` (its test, with ``time() == n / 1e9``). ``when`` is
        known here as ``now + timeout``, a float sum as asyncio's own: if the estimate is a nanosecond early,
        asyncio asks to wait again, with a timeout under a nanosecond, and the clock moves one more.
        """
        if timeout_s < self._clock_resolution:
            return now_ns  # due now: asyncio fires it after this wait
        when = now_ns / 1e9 + timeout_s
        if not math.isfinite(when) or when * 1e9 >= _END_NS:
            # Bad input (a rate or delay that sends emulated time past the core's clock), not a bug.
            raise StateError(
                f"a timer at {when:.6g} s of emulated time is past the end of the virtual clock (2^63 ns, about "
                "292 years): rates too low, or delays too long?"
            )
        resolution = self._clock_resolution
        n = max(now_ns, math.floor(when * 1e9 - 0.5) + 1)  # almost always exact; the loops fix float edges
        while not when < n / 1e9 + resolution:
            n += 1
        while n > now_ns and when < (n - 1) / 1e9 + resolution:
            n -= 1
        return n

    def _should_poll(self) -> bool:
        """Whether this idle moment polls the real descriptors: one in every POLL_EVERY (a select() call
        costs as much as the rest of a clock jump), and always before a deadlock is declared."""
        self._idle_count += 1
        return self._idle_count % _POLL_EVERY == 0

    def _advance(self, timeout_s: float | None) -> None:
        """Nothing is ready: jump to the next timer (``timeout_s`` away; ``None``: none) or core event, and
        deliver the core's completions."""
        plane = self.plane
        if plane._requested:
            plane.flush()
        core = self._core
        now = self._now = core.now_ns
        if timeout_s is not None:
            # Up to the next timer, but no further than the first core completion: the core's internal
            # events (rate changes, the pieces of a forward pass) need no Python.
            fire_ns = self._timer_fire_ns(timeout_s, now)
            timer_ns: int | None = fire_ns
            completions = core.advance_until(fire_ns)
        else:
            if core.next_event_ns() is None:
                if self._virtual_selector.poll():
                    return  # a real descriptor is ready (a signal, another thread): handle it first
                raise DeadlockError(self._deadlock_message(now))
            timer_ns = None
            completions = core.advance_until(_U64_MAX)
        self._now = core.now_ns
        if self._now == now and not completions and timer_ns != now:  # (a timer due now fires next: no stall)
            self._stalls += 1
            if self._stalls > _MAX_STALLS:
                raise RuntimeError(f"the core reports an event at {now} ns but handles none there")
        else:
            self._stalls = 0
        plane._deliver(completions)

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
        if self.is_closed():
            raise RuntimeError("Event loop is closed")
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
