"""The data-plane core through its binding, ``dualpath_emu._core.Core``: hand-solvable cases with exact
nanosecond times (the cases of core/tests/dataplane.rs), the wall clock, and bad arguments, each of which
must raise the right ``dualpath_emu.errors`` class with a message that names the argument.
"""

from __future__ import annotations

import asyncio
import json
import math
import select
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dualpath_emu._core import UNREPORTED_TAG, Arbitration, Core
from dualpath_emu.runtime.core_work import Completion as Done  # the completion tuple with its fields named
from dualpath_emu.errors import ConfigError, CoreError, CoreIOError, InvalidArgumentError, StateError, UnknownNameError

GB = 1e9
MS = 1_000_000


def by_tag(completions: Iterable[tuple[str, int, int, int, int, int]]) -> dict[int, Done]:
    out: dict[int, Done] = {}
    for c in completions:
        d = Done(*c)
        assert d.tag not in out, f"tag {d.tag} completed twice"
        out[d.tag] = d
    return out


def run(core: Core) -> dict[int, Done]:
    return by_tag(core.run_until_idle())


def completed_bytes(core: Core, port: int) -> list[int]:
    value = core.port_counters(port)["completed_bytes"]
    assert isinstance(value, list)
    return [int(x) for x in value]


# ---------------------------------------------------------------------------------------------------
# Hand-solvable cases: exact completion times.


def test_one_transfer_takes_size_over_rate() -> None:
    core = Core()
    p = core.add_port("snic", 50 * GB)
    assert core.submit_transfers([([p], 0, 1_000_000_000, 7)]) == 1
    done = core.run_until_idle()
    # The completion tuple: (kind, tag, start_ns, end_ns, size_bytes, lane), plain Python types.
    assert done == [("transfer", 7, 0, 20 * MS, 1_000_000_000, 0)]
    assert [type(x) for x in done[0]] == [str, int, int, int, int, int]
    assert core.now_ns == 20 * MS


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 8])
def test_n_equal_transfers_share_and_finish_together(n: int) -> None:
    # n x 1 GB through 50 GB/s: each gets 50/n GB/s, all end at n * 20 ms. The exact end is a whole number
    # of nanoseconds, so the core's rounding up to the next nanosecond must not add one.
    core = Core()
    p = core.add_port("cnic", 50 * GB)
    core.submit_transfers([([p], 0, 1_000_000_000, tag) for tag in range(n)])
    assert core.flow_rate([p], 0) == pytest.approx(50 * GB / n, rel=1e-12)
    done = run(core)
    assert sorted(done) == list(range(n))
    assert {d.end_ns for d in done.values()} == {n * 20 * MS}


def test_two_hop_bottleneck_and_work_conservation_on_the_wide_hop() -> None:
    core = Core()
    wide = core.add_port("wide", 100 * GB)
    narrow = core.add_port("narrow", 10 * GB)
    core.submit_transfers([([wide, narrow], 0, 1_000_000_000, 1), ([wide], 0, 1_000_000_000, 2)])
    assert core.flow_rate([wide, narrow], 0) == 10 * GB
    # The flow held back by the narrow hop leaves 90 GB/s of the wide port to the other flow.
    assert core.flow_rate([wide], 0) == 90 * GB
    assert core.lane_rates(wide)[0] == 100 * GB
    assert core.lane_rates(narrow)[0] == 10 * GB
    assert core.flow_rate([narrow], 0) is None  # no transfer runs on exactly that path
    done = run(core)
    assert done[1].end_ns == 100 * MS
    assert done[2].end_ns == 11_111_112  # ceil(1e9 / 90e9 s) in ns
    assert core.pending() == 0


def test_strict_priority_burst_preempts_the_low_lane() -> None:
    core = Core()
    p = core.add_port("cnic", GB, arbitration=Arbitration.strict_priority([0], [1]))
    core.submit_transfers([([p], 1, 1_000_000_000, 1)])
    assert core.advance_to(500 * MS) == []
    core.submit_transfers([([p], 0, 100_000_000, 2)])
    assert core.flow_rate([p], 1) == 0.0
    assert core.flow_rate([p], 0) == GB
    done = run(core)
    assert done[2] == Done("transfer", 2, 500 * MS, 600 * MS, 100_000_000, 0)
    assert done[1] == Done("transfer", 1, 0, 1100 * MS, 1_000_000_000, 1)


def test_paper_lanes_leave_the_kv_lane_a_trickle_and_conserve_work() -> None:
    # App. A.1: 240 high packets (960 KiB) per low packet; in the low table VL0 (3 packets) and VL2
    # (1 packet) take turns, so the KV lane keeps 1/241 * 1/4 = 1/964 of the port.
    core = Core()
    p = core.add_port("cnic", GB, arbitration=Arbitration.paper())
    core.submit_transfers([([p], 2, 1_000_000_000, 1)])
    core.advance_to(500 * MS)
    core.submit_transfers([([p], 0, 100_000_000, 2)])
    kv = core.flow_rate([p], 2)
    assert kv is not None and abs(kv - GB / 964) < 1.0
    done = run(core)
    # 100 MB at 963/964 of 1 GB/s.
    assert done[2].end_ns == 500 * MS + math.ceil(0.1 * 964 / 963 * 1e9)
    # Work conserving: 1.1 GB through a 1 GB/s port ends at 1.1 s, to within the rounding of each step.
    assert abs(done[1].end_ns - 1100 * MS) <= 2
    assert done[1].lane == 2


def test_zero_byte_transfer_completes_now_without_touching_the_port() -> None:
    core = Core()
    p = core.add_port("p", GB)
    core.advance_to(5)
    core.submit_transfers([([p], 4, 0, 3)])
    assert core.pending() == 1
    assert core.in_flight() == []
    assert run(core)[3] == Done("transfer", 3, 5, 5, 0, 4)
    assert core.now_ns == 5
    assert core.port_counters(p)["busy_s"] == 0.0


def test_timers_fire_at_their_time_in_submission_order() -> None:
    core = Core()
    core.advance_to(10)
    assert core.add_timers([(30, 1), (20, 2), (20, 3), (10, 4)]) == 4  # at == now is allowed
    assert core.pending() == 4
    assert core.next_event_ns() == 10
    assert core.advance_to(20) == [("timer", 4, 10, 10, 0, 0), ("timer", 2, 20, 20, 0, 0), ("timer", 3, 20, 20, 0, 0)]
    assert core.pending() == 1
    assert core.run_until_idle() == [("timer", 1, 30, 30, 0, 0)]
    assert core.next_event_ns() is None


@dataclass
class Storage:
    core: Core
    cluster: int
    snic_rx: int
    dram: int
    snic_tx: int
    node: int


def storage(queue_depth: int) -> Storage:
    core = Core()
    cluster = core.add_port("3fs", 1000 * GB)
    snic_rx = core.add_port("node0.snic.rx", 50 * GB)
    dram = core.add_port("node0.dram", 500 * GB)
    snic_tx = core.add_port("node0.snic.tx", 50 * GB)
    core.configure_storage(read_port=cluster, write_port=cluster, read_latency_ns=MS, write_latency_ns=2 * MS)
    node = core.add_storage_node(
        "node0", read_path=[snic_rx, dram], write_path=[dram, snic_tx], queue_depth=queue_depth
    )
    return Storage(core, cluster, snic_rx, dram, snic_tx, node)


def queue_of(core: Core, node: int) -> tuple[int, int, int, int, int]:
    q = core.storage_queue(node)
    assert set(q) == {"read_bytes", "read_requests", "write_bytes", "write_requests", "in_flight"}
    return (q["read_bytes"], q["read_requests"], q["write_bytes"], q["write_requests"], q["in_flight"])


def test_storage_read_waits_latency_queue_and_bandwidth() -> None:
    s = storage(queue_depth=1)
    core = s.core
    assert core.storage_node_id("node0") == s.node
    assert core.storage_node_count == 1 and core.storage_node_name(s.node) == "node0"
    with pytest.raises(UnknownNameError, match="storage node"):
        core.storage_node_name(1)
    assert core.submit_ios([(s.node, "read", 2, 1_000_000_000, 1), (s.node, "read", 2, 500_000_000, 2)]) == 2
    assert queue_of(core, s.node) == (1_500_000_000, 2, 0, 0, 1)
    assert core.pending() == 2
    # During the latency nothing moves yet.
    assert core.advance_to(MS // 2) == []
    assert core.in_flight() == []
    # 1 ms latency + 1 GB at 50 GB/s (the SNIC is the bottleneck).
    assert core.advance_to(21 * MS) == [("read", 1, 0, 21 * MS, 1_000_000_000, 2)]
    assert queue_of(core, s.node) == (500_000_000, 1, 0, 0, 1)
    # The second read queued behind the first (depth 1): its latency starts at 21 ms.
    assert core.run_until_idle() == [("read", 2, 0, 32 * MS, 500_000_000, 2)]
    assert queue_of(core, s.node) == (0, 0, 0, 0, 0)

    assert core.submit_ios([(s.node, "write", 2, 50_000_000, 3)]) == 1
    assert queue_of(core, s.node) == (0, 0, 50_000_000, 1, 1)
    assert core.run_until_idle() == [("write", 3, 32 * MS, 35 * MS, 50_000_000, 2)]  # 2 ms + 1 ms
    assert queue_of(core, s.node) == (0, 0, 0, 0, 0)
    assert core.pending() == 0
    # Reads cross cluster -> SNIC rx -> DRAM; writes DRAM -> SNIC tx -> cluster.
    assert completed_bytes(core, s.snic_rx)[2] == 1_500_000_000
    assert completed_bytes(core, s.snic_tx)[2] == 50_000_000
    assert completed_bytes(core, s.dram)[2] == 1_550_000_000
    assert completed_bytes(core, s.cluster)[2] == 1_550_000_000


def test_storage_queue_depth_two_runs_reads_side_by_side() -> None:
    s = storage(queue_depth=2)
    core = s.core
    core.submit_ios([(s.node, "read", 0, 1_000_000_000, tag) for tag in range(3)])
    assert queue_of(core, s.node) == (3_000_000_000, 3, 0, 0, 2)
    core.advance_to(MS)  # both in flight share the 50 GB/s SNIC
    assert core.flow_rate([s.cluster, s.snic_rx, s.dram], 0) == 25 * GB
    done = run(core)
    assert done[0].end_ns == done[1].end_ns == 41 * MS
    assert done[2].end_ns == 41 * MS + MS + 20 * MS


def test_token_bucket_runs_at_peak_until_dry() -> None:
    core = Core()
    p = core.add_port("shaped", GB, peak_bytes_per_s=2 * GB, burst_bytes=1e8)
    assert core.capacity(p) == 2 * GB
    assert core.port_rate(p) == GB
    core.submit_transfers([([p], 0, 1_000_000_000, 1)])
    assert core.flow_rate([p], 0) == 2 * GB
    # Tokens drain at (2 - 1) GB/s: dry after 0.1 s having sent 0.2 GB; the remaining 0.8 GB at 1 GB/s.
    assert core.advance_to(200 * MS) == []
    assert core.flow_rate([p], 0) == GB
    assert core.capacity(p) == GB
    assert run(core)[1].end_ns == 900 * MS


def test_counters_and_utilisation_samples_add_up() -> None:
    core = Core(sample_interval_ns=10 * MS)
    p = core.add_port("p", GB)
    core.submit_transfers([([p], 3, 25_000_000, 1)])
    run(core)
    core.advance_to(50 * MS)
    k = core.port_counters(p)
    assert set(k) == {"fluid_bytes", "completed_bytes", "busy_s"}
    fluid = k["fluid_bytes"]
    assert isinstance(fluid, list) and len(fluid) == 16
    assert completed_bytes(core, p) == [0, 0, 0, 25_000_000] + [0] * 12
    assert fluid[3] == pytest.approx(25e6, abs=1.0)
    assert k["busy_s"] == pytest.approx(0.025, abs=1e-9)
    # One sample per interval up to now (50 ms): full, full, half, then idle.
    assert core.utilisation(p) == pytest.approx([1.0, 1.0, 0.5, 0.0, 0.0], abs=1e-6)
    assert core.utilisation(p, 3) == pytest.approx([1.0, 1.0, 0.5, 0.0, 0.0], abs=1e-6)
    assert core.utilisation(p, 0) == [0.0] * 5  # a lane that never carried traffic


def test_utilisation_splits_by_lane() -> None:
    core = Core(sample_interval_ns=10 * MS)
    p = core.add_port("p", GB)
    core.submit_transfers([([p], 0, 10_000_000, 1), ([p], 1, 20_000_000, 2)])
    done = run(core)
    assert (done[1].end_ns, done[2].end_ns) == (20 * MS, 30 * MS)
    assert core.utilisation(p) == pytest.approx([1.0, 1.0, 1.0], abs=1e-6)
    assert core.utilisation(p, 0) == pytest.approx([0.5, 0.5, 0.0], abs=1e-6)
    assert core.utilisation(p, 1) == pytest.approx([0.5, 0.5, 1.0], abs=1e-6)


def test_write_trace_is_json_with_counter_events_and_spans(tmp_path: Path) -> None:
    core = Core(sample_interval_ns=10 * MS, record_spans=True)
    p = core.add_port("p", GB)
    core.add_port("idle", GB)
    core.submit_transfers([([p], 3, 25_000_000, 1)])
    run(core)
    out = tmp_path / "trace.json"
    core.write_trace(str(out))
    events: Any = json.loads(out.read_text())["traceEvents"]
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} == {"p", "idle"}  # a process per name prefix
    counters = [e for e in events if e["ph"] == "C" and e["name"] == "p"]
    assert [e["ts"] for e in counters] == pytest.approx([0.0, 10_000.0, 20_000.0])
    assert [e["args"]["lane3"] for e in counters] == pytest.approx([1.0, 1.0, 0.5], abs=1e-6)
    begin, end = (e for e in events if e["ph"] in "be")
    assert (begin["ph"], end["ph"], begin["name"], end["name"]) == ("b", "e", "p", "p")  # named by its path
    assert begin["id"] == end["id"] and begin["cat"] == end["cat"] == "transfer"
    assert end["ts"] - begin["ts"] == pytest.approx(25_000.0)
    assert begin["args"] == {"bytes": 25_000_000, "lane": 3}


def test_write_trace_places_ports_in_given_processes_and_adds_extra_events(tmp_path: Path) -> None:
    core = Core(sample_interval_ns=10 * MS, record_spans=True)
    a, b = core.add_port("a.tx", GB), core.add_port("b.rx", GB)
    core.submit_transfers([([a, b], 0, 1_000_000, UNREPORTED_TAG)])  # nobody waits: still traced, by path
    run(core)
    out = tmp_path / "trace.json"
    extra = json.dumps({"name": "process_name", "ph": "M", "pid": 7, "args": {"name": "sender"}})
    core.write_trace(str(out), port_pids=[7, 8], extra_events=[extra])
    events = json.loads(out.read_text())["traceEvents"]
    assert [e["args"]["name"] for e in events if e["ph"] == "M"] == ["sender"]  # the caller names them
    assert {(e["name"], e["pid"]) for e in events if e["ph"] in "be"} == {("a.tx → b.rx", 7)}
    assert {e["pid"] for e in events if e["ph"] == "C"} == {7, 8}
    with pytest.raises(InvalidArgumentError, match=r"extra_events\[0\]: a JSON object"):
        core.write_trace(str(out), extra_events=["[1, 2]"])
    with pytest.raises(InvalidArgumentError, match="port_pids"):
        core.write_trace(str(out), port_pids=[1])


def test_utilisation_mean_and_quantile_over_ports() -> None:
    core = Core(sample_interval_ns=10 * MS)
    p, q = core.add_port("p", GB), core.add_port("q", GB)
    core.submit_transfers([([p], 0, 25_000_000, 1)])
    run(core)
    core.advance_to(40 * MS)
    assert core.utilisation_mean([p, q], 40 * MS) == pytest.approx([0.5, 0.5, 0.25, 0.0], abs=1e-6)
    # Of the 8 (port, interval) samples, two are 1.0: the p75 is 0.5 (nearest rank 6), the p90 1.0.
    assert core.utilisation_quantile([p, q], 0.75, 40 * MS) == pytest.approx(0.5, abs=1e-6)
    assert core.utilisation_quantile([p, q], 0.9, 40 * MS) == pytest.approx(1.0, abs=1e-6)
    assert core.utilisation_quantile([], 0.99, 40 * MS) == 0.0
    with pytest.raises(InvalidArgumentError, match="until_ns"):
        core.utilisation_mean([p], 50 * MS)
    unsampled = Core()
    port = unsampled.add_port("p", GB)
    with pytest.raises(StateError, match="sampling is off"):
        unsampled.utilisation_quantile([port], 0.5, 0)


def test_write_trace_without_sampling_or_spans_is_still_json(tmp_path: Path) -> None:
    core = Core()
    p = core.add_port("p", GB)
    core.submit_transfers([([p], 0, 1_000, 1)])
    run(core)
    out = tmp_path / "trace.json"
    core.write_trace(str(out))
    events = json.loads(out.read_text())["traceEvents"]
    assert events and all(e["ph"] == "M" for e in events)


def test_write_trace_to_a_missing_directory_is_an_io_error_naming_the_path(tmp_path: Path) -> None:
    core = Core()
    bad = tmp_path / "no-such-dir" / "trace.json"
    with pytest.raises(CoreIOError) as info:
        core.write_trace(str(bad))
    assert str(info.value).startswith(str(bad))


def test_step_returns_each_batch_then_none() -> None:
    core = Core()
    p = core.add_port("p", GB)
    assert core.step() is None  # idle from the start
    core.submit_transfers([([p], 0, 10_000_000, 1), ([p], 0, 30_000_000, 2)])
    core.add_timers([(5 * MS, 9)])
    expected = [
        (5 * MS, [("timer", 9, 5 * MS, 5 * MS, 0, 0)]),
        # Sharing 1 GB/s: 10 MB at 0.5 GB/s ends at 20 ms, then the other's last 20 MB alone by 40 ms.
        (20 * MS, [("transfer", 1, 0, 20 * MS, 10_000_000, 0)]),
        (40 * MS, [("transfer", 2, 0, 40 * MS, 30_000_000, 0)]),
    ]
    for pending, (t, completions) in zip([3, 2, 1], expected):
        assert core.pending() == pending
        assert core.next_event_ns() == t
        assert core.step() == (t, completions)
        assert core.now_ns == t
    assert core.pending() == 0
    assert core.step() is None
    assert core.now_ns == 40 * MS


def test_in_flight_lists_groups_with_their_per_transfer_rate() -> None:
    core = Core()
    wide = core.add_port("wide", 100 * GB)
    narrow = core.add_port("narrow", 10 * GB)
    core.submit_transfers(
        [([wide, narrow], 0, 1_000_000_000, 1), ([wide, narrow], 0, 1_000_000_000, 2), ([wide], 1, 10**9, 3)]
    )
    assert sorted(core.in_flight()) == [([0], 1, 1, 90 * GB), ([0, 1], 0, 2, 5 * GB)]
    run(core)
    assert core.in_flight() == []


def test_stats_count_the_cores_work() -> None:
    core = Core()
    keys = {
        "transfer_events",
        "queue_events",
        "port_recomputes",
        "skipped_recomputes",
        "non_converged",
        "overload_repairs",
        "finished",
        "forwards",
        "forward_transfers",
        "forward_delays",
        "forward_instant_steps",
        "spans_dropped",
    }
    assert core.stats() == dict.fromkeys(keys, 0)
    p = core.add_port("p", GB)
    core.submit_transfers([([p], 0, 1_000, 1)])
    run(core)
    stats = core.stats()
    assert set(stats) == keys
    assert stats["transfer_events"] == 2  # submitted + finished
    assert stats["finished"] == 1
    assert stats["queue_events"] >= 1
    assert stats["non_converged"] == 0


def test_ports_by_name_and_id() -> None:
    core = Core()
    a = core.add_port("a", GB)
    b = core.add_port("b", 2 * GB)
    assert (a, b, core.port_count) == (0, 1, 2)
    assert core.port_id("b") == b
    assert core.port_name(a) == "a"
    assert core.port_rate(b) == 2 * GB


def test_advance_to_now_is_a_no_op_and_returns_completions_in_order() -> None:
    core = Core()
    p = core.add_port("p", GB)
    assert core.advance_to(0) == []
    core.submit_transfers([([p], 0, 2_000_000, 1), ([p], 1, 1_000_000, 2)])
    # Lanes 0 and 1 share 1 GB/s: tag 2 ends at 2 ms, tag 1 at 3 ms.
    assert [Done(*c).tag for c in core.advance_to(10 * MS)] == [2, 1]
    assert core.now_ns == 10 * MS
    assert core.take_completions() == []


# ---------------------------------------------------------------------------------------------------
# Bad arguments: the exception class, and a message that starts with the argument it is about.


@dataclass
class World:
    core: Core
    plain: int
    paper: int
    node: int


@pytest.fixture
def world() -> World:
    core = Core()
    plain = core.add_port("plain", GB)
    paper = core.add_port("paper", GB, arbitration=Arbitration.paper())
    core.configure_storage(read_port=plain, write_port=plain, read_latency_ns=0, write_latency_ns=0)
    node = core.add_storage_node("node0", read_path=[paper], write_path=[paper], queue_depth=1)
    return World(core, plain, paper, node)


def transfer(w: Any, item: object) -> Callable[[], object]:
    """Submit a good transfer, then `item`: the bad one is element 1."""
    return lambda: w.core.submit_transfers([([w.plain], 0, 1, 100), item])


# `w` is Any: these calls pass wrong types on purpose.
BAD: list[tuple[str, Callable[[Any], Callable[[], object]], type[CoreError], str]] = [
    ("negative size", lambda w: transfer(w, ([w.plain], 0, -1, 1)), InvalidArgumentError, "transfers[1].size_bytes:"),
    ("size too big", lambda w: transfer(w, ([w.plain], 0, 2**64, 1)), InvalidArgumentError, "transfers[1].size_bytes:"),
    ("float size", lambda w: transfer(w, ([w.plain], 0, 1.5, 1)), InvalidArgumentError, "transfers[1].size_bytes:"),
    ("str size", lambda w: transfer(w, ([w.plain], 0, "x", 1)), InvalidArgumentError, "transfers[1].size_bytes:"),
    ("None size", lambda w: transfer(w, ([w.plain], 0, None, 1)), InvalidArgumentError, "transfers[1].size_bytes:"),
    ("negative tag", lambda w: transfer(w, ([w.plain], 0, 1, -1)), InvalidArgumentError, "transfers[1].tag:"),
    ("str tag", lambda w: transfer(w, ([w.plain], 0, 1, "x")), InvalidArgumentError, "transfers[1].tag:"),
    ("empty path", lambda w: transfer(w, ([], 0, 1, 1)), InvalidArgumentError, "transfers[1].path:"),
    ("path not a sequence", lambda w: transfer(w, (5, 0, 1, 1)), InvalidArgumentError, "transfers[1].path:"),
    ("str port in path", lambda w: transfer(w, (["a"], 0, 1, 1)), InvalidArgumentError, "transfers[1].path[0]:"),
    ("negative port", lambda w: transfer(w, ([w.plain, -1], 0, 1, 1)), InvalidArgumentError, "transfers[1].path[1]:"),
    ("unknown port", lambda w: transfer(w, ([w.plain, 99], 0, 1, 1)), UnknownNameError, "transfers[1].path"),
    ("port twice", lambda w: transfer(w, ([w.plain, w.paper, w.plain], 0, 1, 1)), InvalidArgumentError, "transfers[1].path:"),
    ("lane 16", lambda w: transfer(w, ([w.plain], 16, 1, 1)), InvalidArgumentError, "transfers[1].lane:"),
    ("lane -1", lambda w: transfer(w, ([w.plain], -1, 1, 1)), InvalidArgumentError, "transfers[1].lane:"),
    ("float lane", lambda w: transfer(w, ([w.plain], 1.0, 1, 1)), InvalidArgumentError, "transfers[1].lane:"),
    # The default arbitration is fair over lanes 0..15, so lane 15 has no weight on a plain port.
    ("lane 15 on a plain port", lambda w: transfer(w, ([w.plain], 15, 1, 1)), InvalidArgumentError, "transfers[1].lane:"),
    ("lane 5 on a paper port", lambda w: transfer(w, ([w.plain, w.paper], 5, 1, 1)), InvalidArgumentError, "transfers[1].lane:"),
    ("3 fields", lambda w: transfer(w, ([w.plain], 0, 1)), InvalidArgumentError, "transfers[1]:"),
    ("5 fields", lambda w: transfer(w, ([w.plain], 0, 1, 1, 1)), InvalidArgumentError, "transfers[1]:"),
    ("not a tuple", lambda w: transfer(w, 7), InvalidArgumentError, "transfers[1]:"),
    ("transfers not iterable", lambda w: lambda: w.core.submit_transfers(7), InvalidArgumentError, "transfers:"),
    ("io: unknown node", lambda w: lambda: w.core.submit_ios([(9, "read", 0, 1, 1)]), UnknownNameError, "ios[0].node"),
    ("io: bad kind", lambda w: lambda: w.core.submit_ios([(w.node, "erase", 0, 1, 1)]), InvalidArgumentError, "ios[0].kind:"),
    ("io: lane unserved", lambda w: lambda: w.core.submit_ios([(w.node, "read", 5, 1, 1)]), InvalidArgumentError, "ios[0].lane:"),
    ("io: negative size", lambda w: lambda: w.core.submit_ios([(w.node, "read", 0, -1, 1)]), InvalidArgumentError, "ios[0].size_bytes:"),
    ("io: 4 fields", lambda w: lambda: w.core.submit_ios([(w.node, "read", 0, 1)]), InvalidArgumentError, "ios[0]:"),
    ("timer: 3 fields", lambda w: lambda: w.core.add_timers([(1, 2, 3)]), InvalidArgumentError, "timers[0]:"),
    ("timer: float time", lambda w: lambda: w.core.add_timers([(1.5, 1)]), InvalidArgumentError, "timers[0].at_ns:"),
    ("timer: negative tag", lambda w: lambda: w.core.add_timers([(1, -1)]), InvalidArgumentError, "timers[0].tag:"),
    ("rate 0", lambda w: lambda: w.core.add_port("q", 0.0), InvalidArgumentError, "rate_bytes_per_s:"),
    ("rate < 0", lambda w: lambda: w.core.add_port("q", -1.0), InvalidArgumentError, "rate_bytes_per_s:"),
    ("rate NaN", lambda w: lambda: w.core.add_port("q", math.nan), InvalidArgumentError, "rate_bytes_per_s:"),
    ("rate inf", lambda w: lambda: w.core.add_port("q", math.inf), InvalidArgumentError, "rate_bytes_per_s:"),
    ("peak < rate", lambda w: lambda: w.core.add_port("q", GB, peak_bytes_per_s=1.0), InvalidArgumentError, "peak_bytes_per_s:"),
    ("burst < 0", lambda w: lambda: w.core.add_port("q", GB, burst_bytes=-1.0), InvalidArgumentError, "burst_bytes:"),
    ("mtu 0", lambda w: lambda: w.core.add_port("q", GB, mtu_bytes=0), InvalidArgumentError, "mtu_bytes:"),
    ("empty port name", lambda w: lambda: w.core.add_port("", GB), InvalidArgumentError, "name:"),
    ("duplicate port name", lambda w: lambda: w.core.add_port("plain", GB), InvalidArgumentError, "name: a new port name, \"plain\" already exists"),
    ("unknown port name", lambda w: lambda: w.core.port_id("nope"), UnknownNameError, "unknown port"),
    ("unknown port id", lambda w: lambda: w.core.port_counters(99), UnknownNameError, "unknown port"),
    ("negative port id", lambda w: lambda: w.core.port_rate(-1), InvalidArgumentError, "port:"),
    ("unknown node", lambda w: lambda: w.core.storage_queue(9), UnknownNameError, "unknown storage node"),
    ("unknown node name", lambda w: lambda: w.core.storage_node_id("x"), UnknownNameError, "unknown storage node"),
    ("storage twice", lambda w: lambda: w.core.configure_storage(read_port=0, write_port=0, read_latency_ns=0, write_latency_ns=0), StateError, "the storage cluster is already configured"),
    ("queue depth 0", lambda w: lambda: w.core.add_storage_node("n", read_path=[0], write_path=[0], queue_depth=0), InvalidArgumentError, "queue_depth:"),
    ("node name twice", lambda w: lambda: w.core.add_storage_node("node0", read_path=[0], write_path=[0], queue_depth=1), InvalidArgumentError, "name:"),
    ("node on unknown port", lambda w: lambda: w.core.add_storage_node("n", read_path=[99], write_path=[0], queue_depth=1), UnknownNameError, "unknown port"),
    ("advance_to < 0", lambda w: lambda: w.core.advance_to(-1), InvalidArgumentError, "t_ns:"),
    ("advance_to float", lambda w: lambda: w.core.advance_to(1.5), InvalidArgumentError, "t_ns:"),
    ("flow_rate lane 16", lambda w: lambda: w.core.flow_rate([0], 16), InvalidArgumentError, "lane:"),
    ("utilisation without sampling", lambda w: lambda: w.core.utilisation(0), StateError, "sampling is off"),
    ("poll on a virtual core", lambda w: lambda: w.core.poll(), StateError, "poll is for the wall clock"),
    ("wakeup_fd on a virtual core", lambda w: lambda: w.core.wakeup_fd(), StateError, "a virtual-clock core"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "cls", "prefix"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_argument_raises_its_class_naming_the_argument(
    world: World, call: Callable[[Any], Callable[[], object]], cls: type[CoreError], prefix: str
) -> None:
    with pytest.raises(cls) as info:
        call(world)()
    assert type(info.value) is cls
    assert str(info.value).startswith(prefix), str(info.value)
    # Nothing rejected was accepted (the good transfer before a bad one included).
    assert world.core.pending() == 0
    assert world.core.run_until_idle() == []


def test_advance_to_the_past_and_timers_in_the_past_are_rejected(world: World) -> None:
    core = world.core
    core.advance_to(10)
    with pytest.raises(InvalidArgumentError) as info:
        core.advance_to(5)
    assert str(info.value).startswith("t_ns: a time >= now (10 ns), got 5")
    with pytest.raises(InvalidArgumentError) as info:
        core.add_timers([(20, 1), (9, 2)])
    assert str(info.value).startswith("timers[1].at_ns: a time >= now (10 ns), got 9")
    assert core.pending() == 0
    assert core.now_ns == 10


@pytest.mark.parametrize(
    ("kwargs", "cls", "prefix"),
    [
        ({"clock": "sundial"}, InvalidArgumentError, "clock:"),
        ({"clock": "wall", "time_scale": 0.0}, InvalidArgumentError, "time_scale:"),
        ({"clock": "wall", "time_scale": -1.0}, InvalidArgumentError, "time_scale:"),
        ({"clock": "wall", "time_scale": math.nan}, InvalidArgumentError, "time_scale:"),
        ({"clock": "wall", "time_scale": math.inf}, InvalidArgumentError, "time_scale:"),
        ({"sample_interval_ns": -1}, InvalidArgumentError, "sample_interval_ns:"),
        ({"sample_interval_ns": 1.5}, InvalidArgumentError, "sample_interval_ns:"),
    ],
)
def test_bad_core_settings(kwargs: dict[str, Any], cls: type[CoreError], prefix: str) -> None:
    with pytest.raises(cls) as info:
        Core(**kwargs)
    assert str(info.value).startswith(prefix), str(info.value)


@pytest.mark.parametrize("method", ["advance_to", "step", "run_until_idle"])
def test_virtual_clock_methods_on_a_wall_core_are_state_errors(method: str) -> None:
    core = Core(clock="wall")
    args = (10,) if method == "advance_to" else ()
    with pytest.raises(StateError) as info:
        getattr(core, method)(*args)
    assert "wall-clock core uses poll()" in str(info.value)


def test_errors_are_catchable_as_builtins() -> None:
    core = Core()
    with pytest.raises(ValueError):
        core.add_port("p", 0.0)
    with pytest.raises(LookupError):
        core.port_id("p")
    with pytest.raises(RuntimeError):
        core.poll()
    with pytest.raises(ValueError):
        Arbitration.parse(0, 0, "0:1", "")
    with pytest.raises(OSError):
        core.write_trace("/nonexistent-dir/trace.json")


# ---------------------------------------------------------------------------------------------------
# Atomic batches: a bad element anywhere leaves the core as it was.

BAD_THIRD: list[tuple[str, object]] = [
    ("unknown port", ([99], 0, 1_000, 12)),
    ("unserved lane", ([0], 15, 1_000, 12)),
    ("lane 16", ([0], 16, 1_000, 12)),
    ("negative size", ([0], 0, -1, 12)),
    ("arity", ([0], 0, 1_000)),
    ("empty path", ([], 0, 1_000, 12)),
]


@pytest.mark.parametrize("bad", [b for _, b in BAD_THIRD], ids=[name for name, _ in BAD_THIRD])
def test_a_bad_third_transfer_leaves_the_core_unchanged(bad: Any) -> None:
    core = Core()
    p = core.add_port("p", GB)
    core.submit_transfers([([p], 0, 5_000, 1)])
    with pytest.raises(CoreError):
        core.submit_transfers([([p], 0, 1_000, 10), ([p], 1, 0, 11), bad, ([p], 0, 1_000, 13)])
    assert core.pending() == 1
    assert core.in_flight() == [([p], 0, 1, GB)]
    assert core.run_until_idle() == [("transfer", 1, 0, 5_000, 5_000, 0)]
    assert completed_bytes(core, p)[0] == 5_000
    assert core.stats()["transfer_events"] == 2


def test_a_bad_third_io_or_timer_leaves_the_core_unchanged(world: World) -> None:
    core, node = world.core, world.node
    with pytest.raises(InvalidArgumentError):
        core.submit_ios([(node, "read", 0, 1_000, 1), (node, "write", 0, 1_000, 2), (node, "read", 9, 1_000, 3)])
    assert core.storage_queue(node) == {
        "read_bytes": 0,
        "read_requests": 0,
        "write_bytes": 0,
        "write_requests": 0,
        "in_flight": 0,
    }
    with pytest.raises(InvalidArgumentError):
        core.add_timers([(1, 1), (2, 2), (3, -3)])
    assert core.pending() == 0
    assert core.next_event_ns() is None
    assert core.run_until_idle() == []


# ---------------------------------------------------------------------------------------------------
# Wall clock. Waits are bounded; time tolerances are generous because CI machines are noisy, but a
# completion must never come early.

WALL_WAIT_LIMIT_S = 5.0
# How late the wake-up may be. A loaded 2-core runner can delay a thread wake-up by tens of ms; this is
# still well below the error of an unscaled clock (10x) in the scaled test.
WALL_LATE_S = 0.2


def wait_for_completions(core: Core, fd: int) -> tuple[list[tuple[str, int, int, int, int, int]], int]:
    """select() on the wake-up descriptor and poll until something completes; also counts the wake-ups."""
    deadline = time.monotonic() + WALL_WAIT_LIMIT_S
    wakeups = 0
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([fd], [], [], left)
        if readable:
            wakeups += 1
            done = core.poll()
            if done:
                return done, wakeups
    pytest.fail(f"no completion within {WALL_WAIT_LIMIT_S} s")


@pytest.mark.parametrize("time_scale", [1.0, 10.0])
def test_wall_clock_transfer_completes_on_time_and_not_early(time_scale: float) -> None:
    # 50 ms of wall time either way: 50 MB at 1 GB/s unscaled, or 500 MB (500 ms of core time) at 10x.
    size = int(50_000_000 * time_scale)
    core_ns = int(50 * MS * time_scale)
    core = Core(clock="wall", time_scale=time_scale)
    p = core.add_port("p", GB)
    fd = core.wakeup_fd()
    t0 = time.monotonic()
    core.submit_transfers([([p], 0, size, 1)])
    assert core.poll() == []  # not done yet
    assert core.pending() == 1
    done, wakeups = wait_for_completions(core, fd)
    waited_s = time.monotonic() - t0
    assert wakeups == 1, "the descriptor became readable before anything was due"
    (d,) = by_tag(done).values()
    assert (d.kind, d.tag, d.size_bytes, d.lane) == ("transfer", 1, size, 0)
    # In core time the transfer takes exactly size / rate from its submission.
    assert d.end_ns - d.start_ns == core_ns
    assert 0 <= d.start_ns <= core_ns  # submitted right after the core was made
    # Never early in wall time; late by at most the tolerance.
    assert waited_s >= 0.050 - 0.001
    assert waited_s <= 0.050 + WALL_LATE_S
    assert d.end_ns <= core.now_ns <= d.end_ns + int(WALL_LATE_S * 1e9 * time_scale)
    assert core.pending() == 0
    # Nothing more is due: the descriptor stays quiet.
    assert select.select([fd], [], [], 0.05)[0] == []
    assert core.poll() == []


def test_wall_clock_integrates_with_asyncio_add_reader() -> None:
    core = Core(clock="wall")
    p = core.add_port("p", GB)
    fd = core.wakeup_fd()
    seen: list[Done] = []

    async def main() -> float:
        loop = asyncio.get_running_loop()
        all_done: asyncio.Future[None] = loop.create_future()

        def on_wakeup() -> None:
            seen.extend(Done(*c) for c in core.poll())
            if core.pending() == 0 and not all_done.done():
                all_done.set_result(None)

        loop.add_reader(fd, on_wakeup)
        try:
            t0 = loop.time()
            core.submit_transfers([([p], 0, 20_000_000, 1), ([p], 1, 20_000_000, 2)])  # both end at 40 ms
            core.add_timers([(core.now_ns + 10 * MS, 3)])
            await asyncio.wait_for(all_done, WALL_WAIT_LIMIT_S)
            return loop.time() - t0
        finally:
            loop.remove_reader(fd)

    waited_s = asyncio.run(main())
    assert [(d.kind, d.tag) for d in seen[:1]] == [("timer", 3)]
    assert sorted((d.kind, d.tag) for d in seen[1:]) == [("transfer", 1), ("transfer", 2)]
    timer, *transfers = seen
    assert timer.end_ns - timer.start_ns == 0
    # Work conserving: 40 MB through 1 GB/s ends 40 ms after the first byte started (to within the
    # nanosecond rounding of each rate change: the two may start a few µs apart on the wall clock).
    busy_ns = max(d.end_ns for d in transfers) - min(d.start_ns for d in transfers)
    assert abs(busy_ns - 40 * MS) <= 2, busy_ns
    assert 0.040 - 0.001 <= waited_s <= 0.040 + WALL_LATE_S


def test_wall_clock_follows_the_scaled_wall_time() -> None:
    core = Core(clock="wall", time_scale=10.0)
    t0 = time.monotonic()
    time.sleep(0.02)
    core.poll()
    elapsed_s = time.monotonic() - t0
    # At least the 20 ms slept (x10), at most what really elapsed since (the core was made before t0).
    assert 200 * MS <= core.now_ns
    assert core.now_ns <= (elapsed_s + WALL_LATE_S) * 10 * 1e9


def test_wall_clock_timer_batch_is_atomic() -> None:
    # A wall-clock core's `now_ns` only moves when the core catches up with the wall clock (on a
    # submission or poll). The batch check compares each timer with that stale time; then each accepted
    # timer catches up and may find the next one in the past. The whole batch must still be all or none,
    # and the error must name the element.
    core = Core(clock="wall")
    time.sleep(0.01)  # the wall clock moves on; core.now_ns is still 0
    assert core.now_ns == 0
    with pytest.raises(InvalidArgumentError) as info:
        core.add_timers([(10**15, 1), (1, 2)])
    named = str(info.value).split(":")[0]
    # (what the message names, timers accepted from the rejected batch)
    assert (named, core.pending()) == ("timers[1].at_ns", 0), str(info.value)


def test_wall_clock_batch_starts_at_one_instant() -> None:
    # "Start many transfers now": one batch is one submission, so its transfers share a start time, as
    # on the virtual clock. (The core catches up with the wall clock per element instead.)
    core = Core(clock="wall")
    p = core.add_port("p", GB)
    core.submit_transfers([([p], 0, 1_000_000, tag) for tag in range(3)])
    done, _ = wait_for_completions(core, core.wakeup_fd())
    while core.pending():
        done += wait_for_completions(core, core.wakeup_fd())[0]
    starts = {Done(*c).start_ns for c in done}
    assert len(starts) == 1, sorted(starts)
