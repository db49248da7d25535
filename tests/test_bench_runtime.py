"""Smoke tests of the actor runtime's benchmarks (``dualpath_emu.bench_runtime``) with tiny counts.

Each benchmark function checks that every message arrived exactly once and in order (it raises
``BenchError`` otherwise); these tests run them in process, over ZeroMQ in one process and across two
processes, and check that the rates are positive numbers. No timing thresholds.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from dualpath_emu.bench_runtime import (
    BenchError,
    Collector,
    Counter,
    Query,
    Result,
    Tally,
    Tick,
    bench_dataplane,
    bench_dataplane_handshake,
    bench_inproc_tells,
    bench_zmq_one_process,
    bench_zmq_two_processes,
    check_tally,
    main,
)
from dualpath_emu.messages import Message
from dualpath_emu.runtime.actors import ActorSystem

N = 2_000


def assert_rate(result: Result, messages: int) -> None:
    assert result.messages == messages
    assert result.wall_s > 0 and math.isfinite(result.rate) and result.rate > 0


def test_in_process_tells_arrive_exactly_once() -> None:
    tells = bench_inproc_tells(N, burst=64)  # a burst that does not divide N
    assert_rate(tells, N)
    assert 2 * N <= tells.events < 2 * N + 20  # tell and deliver, and a few starts and stops


def test_zmq_in_one_process_arrives_exactly_once() -> None:
    result = bench_zmq_one_process(N)
    assert_rate(result, N)
    assert 90 <= result.envelope_bytes <= 110


@pytest.mark.processes
def test_zmq_across_two_processes_arrives_exactly_once() -> None:
    result = bench_zmq_two_processes(N)
    assert_rate(result, N)
    assert 90 <= result.envelope_bytes <= 110


@pytest.mark.processes
def test_the_data_plane_benchmark_completes_every_request_and_records_lags() -> None:
    result = bench_dataplane(2_000, batch=50, window=400)
    assert result.requests == 2_000 and result.wall_s > 0 and result.rate > 0 and result.cpu_s >= 0
    assert (
        result.delivery_lag_ns["count"] == 2_000
        and result.delivery_lag_ns["p99_ns"] >= result.delivery_lag_ns["p50_ns"]
    )
    assert result.submission_lag_ns["count"] == 40 and result.rtt_ns > 0
    assert bench_dataplane_handshake() > 0  # tcp loopback


@pytest.mark.processes
def test_a_child_that_cannot_serve_is_reported_with_its_output() -> None:
    with pytest.raises(BenchError, match=r"exited with status 1(.|\n)*No such file or directory"):
        bench_zmq_two_processes(10, serve_endpoint="ipc:///nonexistent-dualpath-bench-dir/counter")


def test_the_checks_catch_lost_duplicated_and_reordered_messages() -> None:
    assert check_tally(Tally(3, 3, 0), 3, "ok") == Tally(3, 3, 0)
    for wrong in (Tally(2, 1, 0), Tally(4, 3, 0), Tally(3, 4, 0), Tally(3, 3, 2)):
        with pytest.raises(BenchError, match="^seen: "):
            check_tally(wrong, 3, "seen")
    with pytest.raises(BenchError, match="expected a Tally"):
        check_tally(None, 3, "seen")

    system = ActorSystem()
    Counter(system, "counter")
    collector = Collector(system)

    async def reordered() -> Message | None:
        system.actor("counter").start()
        collector.start()
        for seq in (0, 2, 1):
            system.tell("counter", Tick(seq, b""))
        system.tell("counter", Query(), sender=collector.name)
        return await collector.next_tally(5.0)

    assert asyncio.run(system.run(reordered())) == Tally(3, 3, 2)


@pytest.mark.processes
def test_main_prints_bench_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tells", "500", "--repeats", "2", "--zmq", "500", "--dataplane", "0"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("BENCH ")]
    names = [fields[1] for fields in lines]
    assert names == [
        "actor_inproc_msgs_per_s",
        "actor_inproc_tell_events_per_msg",
        "zmq_ipc_msgs_per_s",
        "zmq_ipc_one_process_msgs_per_s",
    ]
    assert all(float(fields[2]) > 0 for fields in lines if not fields[1].endswith("_wall_s"))
    assert lines[2][3:] == ["msgs/s", "(100", "B/msg)"]


def test_main_reports_a_failure_and_exits_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    # The serving side alone, on an endpoint it cannot bind: an error line and status 1.
    assert main(["--serve", "ipc:///nonexistent-dualpath-bench-dir/counter"]) == 1
    assert "bench_runtime: error: ZMQError" in capsys.readouterr().err


def test_the_cluster_benchmark_prints_its_bench_lines(capsys: pytest.CaptureFixture[str]) -> None:
    from dualpath_emu import bench_cluster

    argv = ["--agents", "4", "--rounds", "2", "--systems", "oracle", "--repeat", "2", "--label", "_tiny"]
    assert bench_cluster.main(argv) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("BENCH ")]
    names = [fields[1] for fields in lines]
    assert names == [
        "cluster_tiny_oracle_turns_per_s",
        "cluster_tiny_oracle_emulated_s_per_wall_s",
        "cluster_tiny_oracle_wall_s",
        "cluster_tiny_oracle_cpu_us_per_turn",
        "cluster_tiny_oracle_turns_per_cpu_s",
        "cluster_tiny_oracle_jct_s",
        "cluster_tiny_peak_rss_mib",
    ]
    assert all(float(fields[2]) > 0 for fields in lines if not fields[1].endswith("_wall_s"))


def test_the_cluster_benchmark_compares_cluster_sizes_in_one_run(capsys: pytest.CaptureFixture[str]) -> None:
    from dualpath_emu import bench_cluster

    argv = ["--agents", "4", "--rounds", "1", "--systems", "dualpath", "--repeat", "1", "--clusters", "2P4D,4p8d"]
    assert bench_cluster.main(argv) == 0
    out = capsys.readouterr().out
    lines = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith("BENCH ")}
    assert "cluster_2p4d_dualpath_cpu_us_per_turn" in lines and "cluster_4p8d_dualpath_cpu_us_per_turn" in lines
    assert "cluster 4p8d dualpath: 8 agents" in out.replace("_", " ")  # the same load per prefill node
    ratio = lines["cluster_cost_ratio_4p8d_vs_2p4d_dualpath"]
    cost = {size: float(lines[f"cluster_{size}_dualpath_cpu_us_per_turn"][2]) for size in ("2p4d", "4p8d")}
    assert ratio[3] == "x" and float(ratio[2]) == pytest.approx(cost["4p8d"] / cost["2p4d"], rel=0.02, abs=0.01)
    with pytest.raises(SystemExit):
        bench_cluster.main(["--clusters", "2P"])


def test_the_cluster_benchmark_stops_a_run_at_its_cpu_budget_and_says_how_far_it_got(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dualpath_emu import bench_cluster

    argv = ["--agents", "256", "--rounds", "0", "--systems", "dualpath", "--repeat", "1", "--cpu-budget-s", "0.5"]
    assert bench_cluster.main(argv) == 1  # not finished: the status says so
    out = capsys.readouterr().out
    lines = {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("BENCH ")}
    assert lines["cluster_dualpath_finished"] == "0"
    assert 0 < int(lines["cluster_dualpath_turns_done"]) and float(lines["cluster_dualpath_cpu_us_per_turn_so_far"]) > 0
    assert "stopped after" in out and "(--cpu-budget-s)" in out
    with pytest.raises(SystemExit):
        bench_cluster.main(["--cpu-budget-s", "0"])
