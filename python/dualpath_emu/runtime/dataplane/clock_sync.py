"""The remote plane's clock: the handshake that measures its offset to the service's clock, and the later
checks of that estimate (see "One clock" in :mod:`dualpath_emu.runtime.dataplane`). Sans-I/O: the caller
sends and receives the pings."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ClockCheck", "ClockSync", "handshake"]


@dataclass
class ClockSync:
    """A clock handshake's result: the service's ``clock_ns`` at the local ``local_ns`` (mid round trip)."""

    clock_ns: int
    local_ns: int
    rtt_ns: int
    rounds: int
    time_scale: float

    @property
    def offset_uncertainty_ns(self) -> int:
        """± this many emulated ns: half the round trip, scaled."""
        return math.ceil(self.rtt_ns / 2 * self.time_scale)


def handshake(ping: Callable[[int, int], int], rounds: int, time_scale: float) -> ClockSync:
    """Ping ``rounds`` times and keep the sample with the smallest round trip (read at its midpoint)."""
    best: ClockSync | None = None
    for seq in range(1, max(rounds, 1) + 1):
        t0 = time.monotonic_ns()
        clock_ns = ping(seq, t0)
        t1 = time.monotonic_ns()
        if best is None or t1 - t0 < best.rtt_ns:
            best = ClockSync(clock_ns, (t0 + t1) // 2, t1 - t0, rounds, time_scale)
    assert best is not None
    return best


class ClockCheck:
    """Later samples of the service's clock against the remote's estimate: across hosts, the drift."""

    __slots__ = ("samples", "max_abs_error_ns", "last_error_ns", "last_rtt_ns", "last_after_ns")

    def __init__(self) -> None:
        self.samples = 0
        self.max_abs_error_ns = 0
        self.last_error_ns = 0
        self.last_rtt_ns = 0
        self.last_after_ns = 0  # Emulated ns from the handshake to the last sample.

    def add(self, sync: ClockSync, t0: int, t1: int, clock_ns: int) -> None:
        """A ping sent at ``t0``, answered at ``t1`` with ``clock_ns``; kept if its round trip ≤ 2 × handshake's."""
        rtt = t1 - t0
        if not 0 <= rtt <= 2 * sync.rtt_ns + 50_000:
            return
        after = int(((t0 + t1) // 2 - sync.local_ns) * sync.time_scale)
        self.samples += 1
        self.last_error_ns = clock_ns - (sync.clock_ns + after)
        self.last_rtt_ns = rtt
        self.last_after_ns = max(1, after)
        self.max_abs_error_ns = max(self.max_abs_error_ns, abs(self.last_error_ns))

    def summary(self) -> dict[str, int | float]:
        """The samples' count, largest and last disagreement, last round trip and implied drift."""
        return {
            "samples": self.samples, "max_abs_error_ns": self.max_abs_error_ns, "last_error_ns": self.last_error_ns,
            "last_rtt_ns": self.last_rtt_ns,
            "drift_ppm": round(self.last_error_ns / self.last_after_ns * 1e6, 3) if self.last_after_ns else 0.0,
        }  # fmt: skip
