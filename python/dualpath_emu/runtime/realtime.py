"""An asyncio event loop on the wall clock, optionally scaled, paced by the core (issue 3).

:class:`RealTimeLoop` is the real-time twin of :class:`~dualpath_emu.runtime.VirtualTimeLoop`: the same
actors and the same core work (:class:`~dualpath_emu.runtime.core_work.LocalCoreWork`: ``transfer``, ``io``,
``core_timer`` as futures), but time is the wall clock of a ``Core(clock="wall", time_scale=s)``:

* ``time()`` is the core's clock reading, ``clock_ns() / 1e9``, so loop timers, actor event times and core
  completions are on one clock. With ``time_scale`` 2.0 the emulated cluster runs twice as fast as real
  time: ``asyncio.sleep(1.0)`` takes half a wall second, and so does a transfer the model says takes 1 s.
* The core's pacer thread sleeps until the next core event is due and then makes the core's
  ``wakeup_fd()`` readable; the loop watches it with ``add_reader`` and delivers what completed
  (``core.poll()``). Nothing polls on a timer.
* Requests are submitted at the loop's next iteration, one call per kind for all requests made in the
  meantime (they start at the submission, a few microseconds of wall time after they were made).

Unlike virtual time, runs do not repeat exactly: when things happen depends on the machine.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

from dualpath_emu._core import Core
from dualpath_emu.runtime.lag import LagStats
from dualpath_emu.runtime.core_work import LocalCoreWork

__all__ = ["RealTimeLoop", "run_realtime"]

_T = TypeVar("_T")


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


class RealTimeLoop(LocalCoreWork, asyncio.SelectorEventLoop):
    """An asyncio event loop on the (scaled) wall clock of ``core``.

    ``core`` must use the wall clock (``Core(clock="wall", time_scale=...)``); without one the loop makes
    ``Core(clock="wall", time_scale=time_scale)``. Use it as a loop factory or through :func:`run_realtime`.
    """

    def __init__(self, core: Core | None = None, *, time_scale: float | None = None) -> None:
        if core is None:
            core = Core(clock="wall", time_scale=1.0 if time_scale is None else time_scale)
        scale = core.time_scale
        super().__init__(_ScaledSelector(scale or 1.0))  # first: a loop that raises below must close cleanly
        if scale is None:
            self.close()
            raise ValueError("a RealTimeLoop needs a wall-clock core: Core(clock='wall', time_scale=...)")
        if time_scale is not None and time_scale != scale:
            self.close()
            raise ValueError(f"time_scale {time_scale} differs from the core's time_scale {scale}")
        self._init_local_core_work(core)
        self._time_scale = scale
        self._wakeup_fd = core.wakeup_fd()
        self.delivery_lag = LagStats()
        """How late (core ns) each completion reaches its waiter after its modelled end."""
        self.add_reader(self._wakeup_fd, self._on_wakeup)

    @property
    def time_scale(self) -> float:
        """Emulated seconds per wall second."""
        return self._time_scale

    @property
    def now_ns(self) -> int:
        """The core's clock now, in integer nanoseconds."""
        return self._core.clock_ns()

    def time(self) -> float:
        """The core's clock now, in seconds."""
        return self._core.clock_ns() / 1e9

    def _work_requested(self) -> None:
        self.call_soon(self.flush)

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

    def close(self) -> None:
        if not self.is_closed() and hasattr(self, "_wakeup_fd"):
            self.remove_reader(self._wakeup_fd)
        super().close()


def run_realtime(main: Coroutine[Any, Any, _T], core: Core | None = None, *, time_scale: float | None = None) -> _T:
    """Run ``main`` to completion on a new :class:`RealTimeLoop`; return its result."""
    with asyncio.Runner(loop_factory=lambda: RealTimeLoop(core, time_scale=time_scale)) as runner:
        return runner.run(main)
