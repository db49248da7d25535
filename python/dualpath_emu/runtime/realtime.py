"""Live time: an asyncio event loop on a data plane's clock, and a live process's own core (issues 3, 24).

:class:`RealTimeLoop` is the event loop of every live process: asyncio's loop whose ``time()`` is a clock it is
given (a wall-clock core's, or the data-plane service's as measured at connect), scaled by ``time_scale`` (2.0:
the cluster runs twice as fast as real time, ``asyncio.sleep(1.0)`` takes half a wall second). Loop timers,
actor events and core completions are so on one clock. :class:`WallClockCore` is the data plane of a process
that owns a wall-clock core: the core's pacer thread makes ``wakeup_fd()`` readable when an event is due, the
plane watches it with ``add_reader`` and delivers what completed; requests are submitted at the loop's next
iteration. Unlike virtual time, runs do not repeat exactly."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from dualpath_emu._core import Core
from dualpath_emu.runtime.core_work import LocalCoreWork, clear_faults
from dualpath_emu.runtime.lag import LagStats

__all__ = ["DRAIN_POLL_S", "RealTimeLoop", "WallClockCore", "run_realtime"]

_T = TypeVar("_T")

DRAIN_POLL_S = 0.01  # How often (loop seconds) a process that owns its core looks whether the core has drained.


class _ScaledSelector(selectors.DefaultSelector):
    """Waits ``timeout / time_scale`` wall seconds for a timeout of ``timeout`` loop seconds."""

    def __init__(self, time_scale: float) -> None:
        super().__init__()
        self._time_scale = time_scale

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            timeout /= self._time_scale
        events: list[tuple[selectors.SelectorKey, int]] = super().select(timeout)
        return events


class RealTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop on clock ``clock_ns`` (integer ns), ``time_scale`` times the wall clock's pace."""

    def __init__(self, clock_ns: Callable[[], int], time_scale: float) -> None:
        super().__init__(_ScaledSelector(time_scale))  # first: a loop that raises below must close cleanly
        if not time_scale > 0:
            self.close()
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.clock_ns = clock_ns
        self._time_scale = time_scale

    @property
    def time_scale(self) -> float:
        """Emulated seconds per wall second."""
        return self._time_scale

    def time(self) -> float:
        """The clock now, in seconds."""
        return self.clock_ns() / 1e9


class WallClockCore(LocalCoreWork):
    """The data plane of a process that owns a wall-clock ``core`` (see the module); a plain ``Core()`` is not one."""

    def __init__(self, core: Core) -> None:
        scale = core.time_scale
        if scale is None:
            raise ValueError("a live process needs a wall-clock core: Core(clock='wall', time_scale=...)")
        super().__init__(core)
        self.time_scale = scale  # Emulated seconds per wall second (the core's).
        self.delivery_lag = LagStats()  # How late (core ns) each completion reaches its waiter after its modelled end.
        self._wakeup_fd: int | None = None

    def new_loop(self) -> RealTimeLoop:
        """A :class:`RealTimeLoop` on this core's clock, with this plane bound to it."""
        loop = RealTimeLoop(self.clock_ns, self.time_scale)
        self.bind(loop)
        return loop

    def _bound(self) -> None:
        self._wakeup_fd = self._core.wakeup_fd()
        self.loop.add_reader(self._wakeup_fd, self._on_wakeup)

    def _work_requested(self) -> None:
        self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Submit the work requested so far and deliver what the core completed meanwhile."""
        super().flush()
        self._deliver_timed(self._core.take_completions())

    def _on_wakeup(self) -> None:
        self._deliver_timed(self._core.poll())

    def _deliver_timed(self, completions: list[tuple[str, int, int, int, int, int]]) -> None:
        if completions:
            now, lag = self._core.clock_ns(), self.delivery_lag
            for completion in completions:
                lag.add(now - completion[3])  # delivered now, due at its end
            self._deliver(completions)

    async def finish(self, run_complete: bool) -> None:
        """Submit what is queued; the run complete, wait until the core has no work left (all accounted)."""
        self.flush()
        if run_complete:
            clear_faults(self._core)  # the run is over, its faults with it
        while run_complete and self._core.pending():
            await asyncio.sleep(DRAIN_POLL_S)

    def close(self) -> None:
        """Stop watching the core (the loop stays open)."""
        if self._wakeup_fd is not None:
            if not self.loop.is_closed():
                self.loop.remove_reader(self._wakeup_fd)
            self._wakeup_fd = None


def run_realtime(
    main: Callable[[WallClockCore], Coroutine[Any, Any, _T]], core: Core | None = None, *, time_scale: float = 1.0
) -> _T:
    """Run ``main(plane)`` on a new :class:`RealTimeLoop` over ``core`` (its :class:`WallClockCore`)."""
    plane = WallClockCore(core if core is not None else Core(clock="wall", time_scale=time_scale))
    loop = plane.new_loop()
    try:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            return runner.run(main(plane))
    finally:
        plane.close()
