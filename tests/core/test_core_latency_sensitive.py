"""Latency-sensitive transfers through the binding (``Core.submit_transfers(...,
latency_sensitive_outstanding_bytes=N)``): the FIFO wait behind the bulk data queued on their lane, the
cases of core/tests/fifo.rs."""

from __future__ import annotations

import inspect

import pytest

from dualpath_emu._core import Arbitration, Core
from dualpath_emu.errors import InvalidArgumentError, UnknownNameError

GB = 1e9
US = 1_000
MS = 1_000_000
MB = 1_000_000


def loaded(lane: int) -> tuple[Core, int]:
    """A 50 GB/s port with one 1 GB flow on ``lane``, 1 ms old (950 MB left)."""
    core = Core()
    p = core.add_port("cnic", 50 * GB)
    core.submit_transfers([([p], lane, 1_000_000_000, 1)])
    core.advance_to(MS)
    return core, p


def ends(core: Core) -> dict[int, tuple[int, int]]:
    return {tag: (start, end) for _kind, tag, start, end, _size, _lane in core.run_until_idle()}


def test_the_default_is_an_ordinary_transfer() -> None:
    default = inspect.signature(Core.submit_transfers).parameters["latency_sensitive_outstanding_bytes"].default
    assert default == 0
    core, p = loaded(0)
    core.submit_transfers([([p], 0, MB, 7)])
    assert ends(core)[7] == (MS, MS + 40 * US)  # half the port at once


def test_it_waits_the_capped_backlog_over_the_lane_rate_and_counts_from_its_submission() -> None:
    core, p = loaded(0)
    assert core.submit_transfers([([p], 0, MB, 7)], latency_sensitive_outstanding_bytes=MB) == 1
    assert core.pending() == 2
    # 1 MB of the bulk flow ahead at 50 GB/s (20 µs), then 1 MB at 25 GB/s (40 µs).
    assert ends(core)[7] == (MS, MS + 60 * US)


def test_another_lane_or_an_empty_one_adds_no_wait() -> None:
    core, p = loaded(2)
    core.submit_transfers([([p], 0, MB, 7)], latency_sensitive_outstanding_bytes=MB)
    assert ends(core)[7] == (MS, MS + 40 * US)
    empty = Core()
    q = empty.add_port("cnic", 50 * GB, arbitration=Arbitration.paper())
    empty.submit_transfers([([q], 0, MB, 7), ([q], 0, MB, 8)], latency_sensitive_outstanding_bytes=16 * MB)
    assert ends(empty) == {7: (0, 40 * US), 8: (0, 40 * US)}  # one batch does not queue behind itself


def test_a_flow_near_its_end_queues_only_its_remaining_bytes() -> None:
    core = Core()
    p = core.add_port("cnic", 50 * GB)
    core.submit_transfers([([p], 0, 10 * MB, 1)])
    core.advance_to(196 * US)  # 200 kB left: 4 µs
    core.submit_transfers([([p], 0, MB, 7)], latency_sensitive_outstanding_bytes=16 * MB)
    assert ends(core) == {1: (0, 200 * US), 7: (196 * US, 220 * US)}


def test_bad_arguments_name_themselves_and_change_nothing() -> None:
    core, p = loaded(0)
    with pytest.raises(InvalidArgumentError, match="latency_sensitive_outstanding_bytes: an integer"):
        core.submit_transfers([([p], 0, MB, 7)], latency_sensitive_outstanding_bytes=-1)
    with pytest.raises(UnknownNameError, match=r"transfers\[1\]\.path"):
        core.submit_transfers([([p], 0, MB, 7), ([9], 0, MB, 8)], latency_sensitive_outstanding_bytes=MB)
    assert core.pending() == 1
