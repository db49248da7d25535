"""Real bytes at a port's rate, lane by lane: :class:`Pacer` drives a core :class:`~dualpath_emu._core.PacketPort`
(token bucket + the virtual-lane arbiter) from an asyncio task.

Callers enqueue messages (``tag``, lane, bytes); the pacer wakes when the bucket allows the next chunk (the loop's
timers round that to about a millisecond), asks the port for every chunk granted at that instant (one core call per
wake-up) and hands them to ``on_grants`` in grant order, for the caller to move. So a high-lane chunk enqueued behind
low-lane ones goes next, as on an InfiniBand port with VL arbitration (without an arbitration, one FIFO). A late wake-up
grants, a bucket (:data:`BURST_S` of the rate) at a time, what on-time ones would have: no rate is lost, and an idle
port gains at most one bucket of credit. :meth:`Pacer.set_rate` (a fault) grants what was due at the old rate first,
then refills at the new one; rate 0 pauses it (what is queued waits, nothing is lost)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dualpath_emu._core import Arbitration, PacketPort

__all__ = ["BURST_S", "Grant", "Pacer"]

BURST_S = 1e-3  # How long of its rate a pacer's bucket holds.

Grant = tuple[int, int, int, bool]  # A chunk granted: ``(tag, lane, bytes, last chunk of its message)``.


class Pacer:
    """A port that lets real bytes through at ``rate_bytes_per_s`` (see the module docstring).

    ``clock_ns`` is the loop's clock (the core's, in emulated nanoseconds); ``on_grants`` receives each wake-up's
    grants. Start it with :meth:`start` on the running loop; :meth:`stop` cancels its task."""

    def __init__(
        self,
        rate_bytes_per_s: float,
        chunk_bytes: int,
        clock_ns: Callable[[], int],
        on_grants: Callable[[list[Grant]], None],
        *,
        arbitration: Arbitration | None = None,
        burst_s: float = BURST_S,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        burst = max(float(chunk_bytes), rate_bytes_per_s * burst_s)
        self._chunk_bytes, self._burst_s = chunk_bytes, burst_s
        self._step_ns = max(1, int(burst / rate_bytes_per_s * 1e9))
        self.rate_bytes_per_s = rate_bytes_per_s
        """The rate it was made with (:meth:`set_rate` changes the port's, not this)."""
        self.port = PacketPort(rate_bytes_per_s, arbitration=arbitration, chunk_bytes=chunk_bytes, burst_bytes=burst)
        self._clock_ns = clock_ns
        self._on_grants = on_grants
        self._on_error = on_error
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._due_ns: int | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if self.port.queued_messages():
            self._wake_at(self._clock_ns())

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._due_ns, self._loop = None, None, None

    def enqueue(self, lane: int, size_bytes: int, tag: int) -> None:
        """Queue a message of ``size_bytes`` on ``lane``; its chunks reach ``on_grants`` as the port allows."""
        self.port.enqueue(lane, size_bytes, tag)
        at = self.port.next_grant_ns(self._clock_ns())
        if at is not None:
            self._wake_at(at)

    def set_rate(self, rate_bytes_per_s: float) -> None:
        """Pace at ``rate_bytes_per_s`` from now on (0: paused); what was due grants first, earned tokens kept."""
        port = self.port
        if rate_bytes_per_s == port.rate_bytes_per_s:
            return
        late = self._due_ns is not None and self._due_ns <= self._clock_ns()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if late:
            self._tick()  # grant what the old rate allowed until now (and drop the wake-up it arms: see below)
            if self._timer is not None:
                self._timer.cancel()
        self._timer, self._due_ns = None, None
        now = self._clock_ns()
        if rate_bytes_per_s > 0:  # the bucket holds burst_s of the new rate (a degraded port's burst is smaller)
            burst = max(float(self._chunk_bytes), rate_bytes_per_s * self._burst_s)
            port.set_rate(now, rate_bytes_per_s, burst)
            self._step_ns = max(1, int(burst / rate_bytes_per_s * 1e9))
            at = port.next_grant_ns(now)
            if at is not None:
                self._wake_at(at)
        else:
            port.set_rate(now, 0.0)  # paused: its tokens stay as they are

    def _wake_at(self, at_ns: int) -> None:
        """Have :meth:`_tick` run at ``at_ns`` (or sooner, if it is due sooner already)."""
        loop = self._loop
        if loop is None or (self._due_ns is not None and self._due_ns <= at_ns):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._due_ns = at_ns
        delay = (at_ns - self._clock_ns()) / 1e9
        # Loop timers, not a task per sleep: a wake-up costs one callback.
        self._timer = loop.call_soon(self._tick) if delay <= 0 else loop.call_at(loop.time() + delay, self._tick)

    def _tick(self) -> None:
        due, now = self._due_ns, self._clock_ns()
        self._timer, self._due_ns = None, None
        # Late (the loop's timers round up to about a millisecond): grant what on-time wake-ups would have,
        # a bucket's worth at a time from when it was due, so lateness loses no rate and an idle port
        # gains no more credit than its bucket holds.
        grants: list[Grant] = []
        if due is not None:
            while due < now:
                grants += self.port.grant(due)
                due += self._step_ns
        grants += self.port.grant(now)
        if grants:
            try:
                self._on_grants(grants)
            except Exception as error:  # a loop callback: the loop would only log it
                if self._on_error is None:
                    raise
                self._on_error(error)
                return
        at = self.port.next_grant_ns(self._clock_ns())
        if at is not None:
            self._wake_at(at)
