"""The core's fault mechanics (issue 26): a port's rates scaled (degraded, or down: its transfers stall and
resume, keeping what they moved) and latency added to what starts crossing a port, with exact times."""

from __future__ import annotations

import pytest

from dualpath_emu._core import Core
from dualpath_emu.errors import CoreError
from dualpath_emu.runtime.core_work import Completion as Done

GB = 1_000_000_000
MS = 1_000_000


def ends(core: Core) -> dict[int, int]:
    return {Done(*c).tag: Done(*c).end_ns for c in core.run_until_idle()}


def test_a_down_port_stalls_its_transfer_which_resumes_where_it_stopped() -> None:
    core = Core()
    p = core.add_port("snic", 50 * GB)
    core.submit_transfers([([p], 0, GB, 1)])  # 20 ms alone
    core.advance_to(5 * MS)
    core.set_port_factor(p, 0.0)
    assert core.port_factor(p) == 0.0
    assert core.flow_rate([p], 0) == 0.0
    assert core.advance_to(105 * MS) == []  # down for 100 ms: nothing moves, nothing ends
    core.set_port_factor(p, 1.0)
    assert ends(core) == {1: 120 * MS}


def test_a_degraded_port_runs_at_its_share_and_a_bottleneck_moves() -> None:
    core = Core()
    a, b = core.add_port("a", 50 * GB), core.add_port("b", 40 * GB)
    core.set_port_factor(a, 0.5)  # 25 GB/s: now the bottleneck of the two-hop path
    core.submit_transfers([([a, b], 0, GB, 1)])
    assert core.flow_rate([a, b], 0) == pytest.approx(25 * GB, rel=1e-12)
    assert ends(core) == {1: 40 * MS}


def test_a_down_port_stalls_only_the_flows_that_cross_it() -> None:
    core = Core()
    a, b = core.add_port("a", 50 * GB), core.add_port("b", 50 * GB)
    core.set_port_factor(a, 0.0)
    core.submit_transfers([([a], 0, GB, 1), ([b], 0, GB, 2)])
    assert [Done(*c).tag for c in core.advance_to(30 * MS)] == [2]
    core.set_port_factor(a, 1.0)
    assert ends(core) == {1: 50 * MS}


def test_latency_delays_what_starts_crossing_the_port_and_counts_in_its_time() -> None:
    core = Core()
    p, q = core.add_port("p", 50 * GB), core.add_port("q", 50 * GB)
    core.set_port_latency(p, 3 * MS)
    core.set_port_latency(q, 2 * MS)
    core.submit_transfers([([p, q], 0, GB, 1), ([q], 0, GB, 2)])
    done = {Done(*c).tag: Done(*c) for c in core.run_until_idle()}
    # Tag 2 starts after 2 ms and has q alone until tag 1 starts at 5 ms; then they share it.
    assert done[1].start_ns == 0 and done[2].start_ns == 0
    assert done[2].end_ns == 39 * MS  # 3 ms alone (0.15 GB), then 0.85 GB at half the rate
    assert done[1].end_ns > done[2].end_ns
    core.set_port_latency(p, 0)
    core.set_port_latency(q, 0)
    start = core.now_ns
    core.submit_transfers([([p, q], 0, GB, 3)])
    assert ends(core) == {3: start + 20 * MS}


def test_latency_adds_to_a_storage_io() -> None:
    core = Core()
    read, write, snic = (
        core.add_port("storage.read", 100 * GB),
        core.add_port("storage.write", 100 * GB),
        core.add_port("snic", 50 * GB),
    )
    core.configure_storage(read_port=read, write_port=write, read_latency_ns=200_000, write_latency_ns=200_000)
    node = core.add_storage_node("n0", read_path=[snic], write_path=[snic], queue_depth=4)
    core.set_port_latency(snic, MS)
    core.submit_ios([(node, "read", 0, GB, 9)])
    assert ends(core) == {9: 200_000 + MS + 20 * MS}


@pytest.mark.parametrize("factor", [-0.1, 1.5, float("nan"), float("inf")])
def test_a_factor_outside_0_to_1_is_refused(factor: float) -> None:
    core = Core()
    p = core.add_port("p", GB)
    with pytest.raises(CoreError, match=r"factor: a number in \[0, 1\], got"):
        core.set_port_factor(p, factor)


def test_an_unknown_port_is_refused() -> None:
    core = Core()
    with pytest.raises(CoreError, match="unknown port"):
        core.set_port_factor(3, 0.5)
    with pytest.raises(CoreError, match="unknown port"):
        core.set_port_latency(3, 1)


def test_utilisation_is_read_at_the_widened_sample_interval_of_a_long_run() -> None:
    # 100 s of a busy port sampled every ms: more intervals than one series may hold (65,536), so the core
    # widens them to 2 ms. The mean series must come at that width, each sample a busy 100% (it came at 1 ms
    # and over-counted every widened sample as 200%).
    core = Core(sample_interval_ns=MS)
    p = core.add_port("p", GB)
    core.submit_transfers([([p], 0, 100 * GB, 1)])
    core.run_until_idle()
    assert core.sample_interval_ns == 2 * MS
    series = core.utilisation_mean([p], core.now_ns)
    assert len(series) == 50_000 and max(series) == pytest.approx(1.0) and min(series) == pytest.approx(1.0)
    assert core.utilisation_quantile([p], 0.99, core.now_ns) == pytest.approx(1.0)
