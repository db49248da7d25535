"""A run that stops making progress is stopped (its clock may go on for ever: fault timers, random faults).

Progress is what the requests in flight do: one admitted, its hit read, its prefill started, a token, an end,
or a transfer or storage I/O finished in the core. With requests in flight and none of that for ``[scheduling]
stall_timeout_s`` of emulated time, the run stops with :class:`~dualpath_emu.runtime.virtual.NoProgressError`,
saying when progress stopped, how many requests were in flight and which faults acted. With none in flight
(every agent in a tool call) no time without progress counts."""

from __future__ import annotations

from dualpath_emu._core import Core
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.engines import NS
from dualpath_emu.cluster.faults import FaultWatch
from dualpath_emu.cluster.metrics import Metrics
from dualpath_emu.runtime.virtual import ProgressWatch

__all__ = ["progress_watch"]


def progress_watch(
    config: ClusterConfig, metrics: Metrics, core: Core, faults: FaultWatch | None, name: str
) -> ProgressWatch | None:
    """The watch for a virtual run of ``config`` on ``core``, its progress in ``metrics`` and the faults acting in
    ``faults`` (both derived from the engines' observations; None: ``stall_timeout_s`` is 0)."""
    limit_s = config.stall_timeout_s
    if limit_s <= 0:
        return None
    seen_key: list[tuple[int, int, int]] = [(0, 0, 0)]  # (admitted, done, transfers and I/Os finished) when last asked
    seen_ns = [0]  # when they last grew

    def in_flight() -> int:
        return len(metrics) - metrics.turns_done - metrics.failures

    def last_request_ns() -> int:
        columns = (metrics.arrive_ns, metrics.read_done_ns, metrics.prefill_start_ns, metrics.first_token_ns,
                   metrics.second_token_ns, metrics.failed_ns)  # fmt: skip
        return max(0, *(max(c, default=0) for c in columns))

    def last_progress_ns() -> int | None:
        # Asked every limit / 8 of emulated time: counters that grew since mean progress then (at most limit / 8
        # late, and no scan of the requests in a busy run); else the latest progress time of any request.
        key = (len(metrics), metrics.turns_done, int(core.stats()["finished"]))
        if key != seen_key[0]:
            seen_key[0], seen_ns[0] = key, core.now_ns
            return seen_ns[0]
        if in_flight() == 0:
            return None
        return max(seen_ns[0], last_request_ns())

    def describe(now_ns: int, last_ns: int) -> str:
        acting = faults.acting() if faults is not None else []
        said = (
            f"faults acting: {'; '.join(acting[:5])}{' …' if len(acting) > 5 else ''}" if acting else "no fault acting"
        )
        return (f"{name}: no progress for over {limit_s:g} s of emulated time (stall_timeout_s): {in_flight():,} "
                f"request(s) in flight; none admitted, read, prefilled, given a token or ended since "
                f"{last_request_ns() / NS:,.3f} s, and no transfer or I/O finished since {last_ns / NS:,.0f} s or "
                f"before; {said}; stopped at {now_ns / NS:,.3f} s")  # fmt: skip

    limit_ns = round(limit_s * NS)
    return ProgressWatch(limit_ns, max(1, limit_ns // 8), last_progress_ns, describe)
