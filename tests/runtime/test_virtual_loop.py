"""The virtual-time asyncio loop (``dualpath_emu.runtime.virtual_loop``): asyncio's sleeps, timeouts and
timers on the core's clock without waiting for it, core transfers, storage I/O and timers delivered to
their waiters at the exact nanosecond, the documented tie order, batching of submissions, clear errors for
a deadlock or a completion nobody awaits, and identical event logs on repeated runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, TypeVar, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_emu._core import Core
from dualpath_emu.errors import UnknownNameError
from dualpath_emu.runtime import Completion, DeadlockError, UnexpectedCompletionError, VirtualTimeLoop, run

GB = 1_000_000_000
MS = 1_000_000

_T = TypeVar("_T")


def port_core(rate: float = 50 * GB) -> tuple[Core, int]:
    core = Core()
    return core, core.add_port("port", rate)


def vloop() -> VirtualTimeLoop:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)
    return loop


class CountingCore:
    """A stand-in for a Core that counts the calls the loop makes through the FFI boundary."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.calls: dict[str, int] = {"submit_transfers": 0, "submit_ios": 0, "add_timers": 0, "advance": 0}

    def _count(self, name: str) -> None:
        self.calls[name] += 1

    def submit_transfers(self, transfers: Iterable[tuple[Sequence[int], int, int, int]]) -> int:
        self._count("submit_transfers")
        return self.core.submit_transfers(transfers)

    def submit_ios(self, ios: Iterable[tuple[int, str, int, int, int]]) -> int:
        self._count("submit_ios")
        return self.core.submit_ios(ios)

    def add_timers(self, timers: Iterable[tuple[int, int]]) -> int:
        self._count("add_timers")
        return self.core.add_timers(timers)

    def advance_until(self, t_ns: int) -> list[tuple[str, int, int, int, int, int]]:
        self._count("advance")
        return self.core.advance_until(t_ns)

    @property
    def now_ns(self) -> int:
        return self.core.now_ns

    def next_event_ns(self) -> int | None:
        return self.core.next_event_ns()


def run_counting(main: Coroutine[Any, Any, _T], counting: CountingCore) -> _T:
    return run(main, cast(Core, counting))


# ---------------------------------------------------------------------------------------------------------
# asyncio's own timing, in virtual time.


def test_sleep_3000_s_takes_no_wall_time() -> None:
    core, _ = port_core()

    async def main() -> float:
        await asyncio.sleep(3000)
        return vloop().time()

    started = time.perf_counter()
    assert run(main(), core) == 3000.0
    assert time.perf_counter() - started < 0.5
    assert core.now_ns == 3000 * GB


def test_wait_for_times_out_at_virtual_5_s() -> None:
    core, _ = port_core()

    async def main() -> float:
        loop = vloop()
        never: asyncio.Future[None] = loop.create_future()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(never, timeout=5)
        assert never.cancelled()
        return loop.time()

    assert run(main(), core) == 5.0
    assert core.now_ns == 5 * GB


def test_timeout_context_call_at_and_call_later() -> None:
    core, _ = port_core()
    fired: list[tuple[str, int]] = []

    async def main() -> None:
        loop = vloop()
        loop.call_later(1.5, lambda: fired.append(("later", loop.now_ns)))
        loop.call_at(0.25, lambda: fired.append(("at", loop.now_ns)))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(2):
                await asyncio.sleep(10)
        fired.append(("timeout", loop.now_ns))

    run(main(), core)
    assert fired == [("at", 250 * MS), ("later", 1500 * MS), ("timeout", 2 * GB)]


def test_float_deadlines_round_to_the_nearest_ns() -> None:
    core, _ = port_core()

    async def main() -> list[int]:
        loop = vloop()
        woke: list[int] = []
        await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)  # 0.1 + 0.2 == 0.30000000000000004 in floats: still 300 ms
        woke.append(loop.now_ns)
        await asyncio.sleep(1.4e-9)  # rounds down to 1 ns
        woke.append(loop.now_ns)
        await asyncio.sleep(1.6e-9)  # rounds up to 2 ns
        woke.append(loop.now_ns)
        await asyncio.sleep(0)
        woke.append(loop.now_ns)
        return woke

    assert run(main(), core) == [300 * MS, 300 * MS + 1, 300 * MS + 3, 300 * MS + 3]


@given(st.lists(st.floats(min_value=0.0, max_value=10_000.0, allow_nan=False), min_size=1, max_size=20))
def test_timers_fire_at_their_nanosecond_without_spinning(delays: list[float]) -> None:
    counting = CountingCore(Core())

    async def main() -> list[tuple[float, int]]:
        loop = vloop()
        woke: list[tuple[float, int]] = []
        for delay in delays:
            deadline = loop.time() + delay
            await asyncio.sleep(delay)
            woke.append((deadline, loop.now_ns))
        return woke

    woke = run_counting(main(), counting)
    for deadline, now_ns in woke:
        # Fired at the nanosecond nearest its deadline (half a ns either way, plus float noise).
        assert abs(now_ns - deadline * 1e9) <= 0.5 + deadline * 1e-6
    # One jump per sleep at most: the loop never asks the core to advance without reaching a timer.
    assert counting.calls["advance"] <= len(delays)


def test_to_thread_runs_inline_in_zero_virtual_time() -> None:
    core, _ = port_core()

    async def main() -> tuple[int, int]:
        await asyncio.sleep(1)
        result = await asyncio.to_thread(sum, [1, 2, 3])
        return result, vloop().now_ns

    assert run(main(), core) == (6, GB)


# ---------------------------------------------------------------------------------------------------------
# Core work delivered to its waiters.


def test_one_transfer_resolves_at_20_ms_with_its_completion() -> None:
    core, port = port_core()

    async def main() -> tuple[Completion, int]:
        loop = vloop()
        completion = await loop.plane.transfer([port], 0, GB)
        return completion, loop.now_ns

    completion, now_ns = run(main(), core)
    assert completion == ("transfer", 1, 0, 20 * MS, GB, 0)
    assert (completion.kind, completion.end_ns) == ("transfer", 20 * MS)
    assert now_ns == 20 * MS


def test_two_concurrent_transfers_share_the_port_in_one_submission() -> None:
    counting = CountingCore(Core())
    port = counting.core.add_port("port", 50 * GB)

    async def one(lane: int) -> tuple[Completion, float]:
        completion = await vloop().plane.transfer([port], lane, GB)
        return completion, vloop().time()

    async def main() -> list[tuple[Completion, float]]:
        return list(await asyncio.gather(one(0), one(0)))

    results = run_counting(main(), counting)
    assert results == [
        (("transfer", 1, 0, 40 * MS, GB, 0), 0.04),
        (("transfer", 2, 0, 40 * MS, GB, 0), 0.04),
    ]
    # Both requests were made in the same loop iteration: one FFI call carried them.
    assert counting.calls["submit_transfers"] == 1


def test_sleep_and_transfer_interleave_and_tie_order() -> None:
    core, port = port_core()
    log: list[tuple[int, str]] = []

    async def sleeper() -> None:
        loop = vloop()
        await asyncio.sleep(0.01)
        log.append((loop.now_ns, "slept 10 ms"))
        await asyncio.sleep(0.01)  # due at 20 ms, the instant the transfer completes
        log.append((loop.now_ns, "slept 20 ms"))
        await asyncio.sleep(0.01)
        log.append((loop.now_ns, "slept 30 ms"))

    async def mover() -> None:
        loop = vloop()
        await loop.plane.transfer([port], 0, GB)
        log.append((loop.now_ns, "moved 1 GB"))

    async def main() -> None:
        await asyncio.gather(sleeper(), mover())

    run(main(), core)
    # At 20 ms a core completion and an asyncio timer tie: the completion's waiter runs first.
    assert log == [
        (10 * MS, "slept 10 ms"),
        (20 * MS, "moved 1 GB"),
        (20 * MS, "slept 20 ms"),
        (30 * MS, "slept 30 ms"),
    ]


def test_storage_read_and_core_timer() -> None:
    core = Core()
    cluster = core.add_port("3fs", 1000 * GB)
    snic = core.add_port("node0.snic", 50 * GB)
    core.configure_storage(read_port=cluster, write_port=cluster, read_latency_ns=MS, write_latency_ns=2 * MS)
    node = core.add_storage_node("node0", read_path=[snic], write_path=[snic], queue_depth=1)

    async def main() -> tuple[Completion, Completion, int]:
        loop = vloop()
        read = loop.plane.io(node, "read", 0, GB)
        tick = loop.plane.core_timer(5 * MS)
        return await read, await tick, loop.now_ns

    read, tick, now_ns = run(main(), core)
    # 1 ms latency, then 1 GB at 50 GB/s.
    assert read == ("read", 1, 0, 21 * MS, GB, 0)
    assert tick == ("timer", 2, 5 * MS, 5 * MS, 0, 0)  # a timer starts and ends at its instant
    assert now_ns == 21 * MS


def test_detached_work_moves_its_bytes_without_waking_the_loop() -> None:
    """A detached transfer and I/O share the ports like any work and are counted, but the loop never wakes
    for their ends: the only clock jumps are the awaited transfer's and the timer's."""
    counting = CountingCore(Core())
    core = counting.core
    cluster = core.add_port("3fs", 1000 * GB)
    snic = core.add_port("node0.snic", 50 * GB)
    core.configure_storage(read_port=cluster, write_port=cluster, read_latency_ns=MS, write_latency_ns=MS)
    node = core.add_storage_node("node0", read_path=[snic], write_path=[snic], queue_depth=4)

    async def main() -> tuple[Completion, int]:
        loop = vloop()
        loop.plane.transfer_detached([snic], 0, GB // 2)  # shares the SNIC with the awaited GB
        loop.plane.io_detached(node, "write", 0, GB // 10)
        done = await loop.plane.transfer([snic], 0, GB)
        await asyncio.sleep(1.0)
        return done, loop.now_ns

    done, now_ns = run_counting(main(), counting)
    assert done.end_ns == 32 * MS  # last of the SNIC's 1.6 GB at 50 GB/s, not 20 ms alone
    assert now_ns == 1032 * MS
    assert counting.calls["advance"] == 2
    completed = core.port_counters(snic)["completed_bytes"]
    assert isinstance(completed, list) and completed[0] == GB + GB // 2 + GB // 10
    assert core.pending() == 0


def test_flush_submits_at_the_request_instant() -> None:
    core, port = port_core()

    async def main() -> tuple[int, int, Completion]:
        loop = vloop()
        await asyncio.sleep(0.5)
        waiter = loop.plane.transfer([port], 0, GB)
        before = len(core.in_flight())  # still batched in the loop
        loop.plane.flush()
        return before, len(core.in_flight()), await waiter

    assert run(main(), core) == (0, 1, ("transfer", 1, 500 * MS, 520 * MS, GB, 0))


def test_a_bad_request_fails_alone() -> None:
    core, port = port_core()

    async def main() -> list[Completion | BaseException]:
        loop = vloop()
        good = loop.plane.transfer([port], 0, GB)
        bad_port = loop.plane.transfer([port + 7], 0, GB)
        bad_node = loop.plane.io(3, "read", 0, GB)
        return list(await asyncio.gather(good, bad_port, bad_node, return_exceptions=True))

    good, bad_port, bad_node = run(main(), core)
    assert isinstance(good, tuple)
    assert good == ("transfer", 1, 0, 20 * MS, GB, 0)
    assert isinstance(bad_port, UnknownNameError)
    assert isinstance(bad_node, UnknownNameError)


def test_a_waiter_that_gave_up_does_not_break_the_loop() -> None:
    core, port = port_core()

    async def main() -> int:
        loop = vloop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(loop.plane.transfer([port], 0, GB), timeout=0.005)
        assert loop.now_ns == 5 * MS
        await asyncio.sleep(0.1)  # the transfer still completes at 20 ms; nobody is told
        return loop.now_ns

    assert run(main(), core) == 105 * MS
    assert core.pending() == 0


def test_direct_submissions_with_expect() -> None:
    core, port = port_core()

    async def main() -> Completion:
        loop = vloop()
        tag = loop.plane.new_tag()
        waiter = loop.plane.expect(tag)
        core.submit_transfers([([port], 0, GB // 2, tag)])
        with pytest.raises(ValueError, match="already awaited"):
            loop.plane.expect(tag)
        return await waiter

    assert run(main(), core) == ("transfer", 1, 0, 10 * MS, GB // 2, 0)


# ---------------------------------------------------------------------------------------------------------
# Errors instead of hangs.


def test_deadlock_raises_a_clear_error() -> None:
    core, _ = port_core()

    async def main() -> None:
        await vloop().create_future()

    expected = r"deadlock at virtual time 0 ns: nothing is ready.*Task-\d+ \(.*main\)"
    with pytest.raises(DeadlockError, match=expected):
        run(main(), core)


def test_deadlock_after_work_reports_the_time() -> None:
    core, port = port_core()

    async def main() -> None:
        loop = vloop()
        await loop.plane.transfer([port], 0, GB)
        await asyncio.sleep(1)
        await asyncio.Event().wait()

    with pytest.raises(DeadlockError, match=r"deadlock at virtual time 1020000000 ns"):
        run(main(), core)


def test_a_completion_nobody_awaits_is_an_error() -> None:
    core, _ = port_core()

    async def main() -> None:
        core.add_timers([(MS, 999)])
        await asyncio.sleep(1)

    with pytest.raises(UnexpectedCompletionError, match=r"tags \[999\] at 1000000 ns"):
        run(main(), core)


# ---------------------------------------------------------------------------------------------------------
# Determinism.


def run_program() -> list[tuple[int, str]]:
    """Several coroutines mixing sleeps, transfers on two lanes and core timers; returns every step."""
    log: list[tuple[int, str]] = []
    core = Core()
    fabric = core.add_port("fabric", 50 * GB)
    nic = core.add_port("nic", 20 * GB)

    async def worker(name: str, path: list[int], lane: int, sizes: list[int], pause: float) -> None:
        loop = vloop()
        for size in sizes:
            completion = await loop.plane.transfer(path, lane, size)
            log.append((loop.now_ns, f"{name} moved {size} B from {completion.start_ns} ns"))
            await asyncio.sleep(pause)
            log.append((loop.now_ns, f"{name} paused"))

    async def ticker() -> None:
        loop = vloop()
        for i in range(5):
            await loop.plane.core_timer(loop.now_ns + 7 * MS)
            log.append((loop.now_ns, f"tick {i}"))

    async def main() -> None:
        await asyncio.gather(
            worker("a", [fabric], 0, [GB, GB // 3, 2 * GB], 0.003),
            worker("b", [fabric, nic], 0, [GB // 2, GB], 0.0),
            worker("c", [nic], 1, [GB // 7] * 4, 0.011),
            ticker(),
        )
        log.append((vloop().now_ns, "done"))

    run(main(), core)
    return log


def test_two_runs_give_identical_event_logs() -> None:
    first = run_program()
    second = run_program()
    assert first == second
    # The log is a real interleaving: every worker step and tick is there, in time order.
    assert len(first) == 2 * (3 + 2 + 4) + 5 + 1
    assert [t for t, _ in first] == sorted(t for t, _ in first)
    assert first[-1][1] == "done"
    assert {event.split()[0] for _, event in first} == {"a", "b", "c", "tick", "done"}
