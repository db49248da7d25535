"""The cluster live (``run_live``, ``dualpath-emu run --mode realtime``): the same actors as in virtual time,
placed in OS processes, paced by the data-plane service's core in wall-clock time. Every admitted request
ends exactly once across processes and every byte a process booked is what the data plane moved (checked by
``collect``, which raises otherwise); the figures agree with virtual time within the lag a real clock adds.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dualpath_emu.cluster.catalog import MODELS
from dualpath_emu.cluster.catalog import TESTBED_NODE
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.live import LiveOptions, placement, run_live, system_from_wire, system_to_wire
from dualpath_emu.cluster.run import SystemResult, run_system
from dualpath_emu.cluster.systems import SYSTEMS
from dualpath_emu.runtime.launcher import LaunchError
from dualpath_emu.workload.generator import generate
from dualpath_emu.workload.trajectory import Trajectory

pytestmark = pytest.mark.processes  # live runs: all but a few tests here start a run's processes

TIME_SCALE = 4.0
"""Emulated seconds per wall second in these tests: a run of ~4.3 emulated seconds takes about one."""
TIMEOUT_S = 120.0
"""Every live run here takes seconds: one that hangs fails in two minutes ("did not complete within
timeout_s"), not at run_live's default of a day."""
LIVE = LiveOptions(time_scale=TIME_SCALE, timeout_s=TIMEOUT_S)


def small_config() -> ClusterConfig:
    # A storage-bound 1P2D DS 27B cluster: storage NICs 100x slower than the testbed's (Basic takes 1.8x as
    # long as DualPath).
    node = dataclasses.replace(TESTBED_NODE, snic_bytes_per_s=0.5e9)
    return ClusterConfig(
        model=MODELS["ds27b"], node=node, pe_nodes=1, de_nodes=2, prefill_ep_nodes=1, decode_ep_nodes=1
    )


def work(agents: int = 24, rounds: int = 6) -> list[Trajectory]:
    out = []
    for t in generate("32k", agents=agents, seed=0):
        out.append(Trajectory.from_rounds(t.id, list(zip(t.append, t.gen))[10 : 10 + rounds]))
    return out


def live(tmp_path: Path, system: str = "dualpath", **options: object) -> SystemResult:
    return run_live(small_config(), SYSTEMS[system], work(), run_dir=tmp_path / "run", options=LIVE, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def virtual() -> SystemResult:
    return run_system(small_config(), "dualpath", work())


@pytest.mark.parametrize(
    ("placement_kind", "transport"), [("groups", "ipc"), ("groups", "tcp"), ("roles", "ipc"), ("single", "ipc")]
)
def test_the_cluster_runs_live_in_every_placement(
    tmp_path: Path, virtual: SystemResult, placement_kind: str, transport: str
) -> None:
    result = live(tmp_path, placement_kind=placement_kind, transport=transport)
    assert result.turns == virtual.turns and result.complete and result.agents == virtual.agents
    assert result.extra["mode"] == "realtime" and result.extra["placement"] == placement_kind
    processes = placement(["client", "scheduler", "pe0", "de1", "de2"], placement_kind)
    with_dataplane = len(processes) > 1
    assert result.extra["processes"] == len(processes) + with_dataplane
    assert ("dataplane" in result.extra["process_actors"]) == with_dataplane
    cpu_s = result.extra["process_cpu_s"]  # which process works hardest (the bottleneck is near its wall time)
    assert set(cpu_s) == {name for name, _ in processes} | ({"dataplane"} if with_dataplane else set())
    assert all(0 < s < 10 * result.wall_s for s in cpu_s.values())
    lag = result.extra["delivery_lag_s"]
    assert lag["count"] > 0 and 0 <= lag["p50"] <= lag["p99"] <= lag["max"]
    if with_dataplane:
        assert result.extra["clock_sync"]["rtt_s_max"] > 0 and result.extra["submission_lag_s"]["count"] > 0
    # Storage-bound: the reads take most of the run, so lags of a few emulated milliseconds move little.
    assert result.jct_s == pytest.approx(virtual.jct_s, rel=0.25)
    # The same reads; which side reads depends on the read queues when each decision is made, so on timing.
    total = sum(result.snic_read_bytes.values())
    assert total == pytest.approx(sum(virtual.snic_read_bytes.values()), rel=1e-9)
    assert result.snic_read_bytes["de"] > 0 and result.snic_read_bytes["pe"] > 0


def test_basic_reads_on_the_prefill_side_only_live_too(tmp_path: Path) -> None:
    result = live(tmp_path, system="basic")
    assert result.snic_read_bytes["de"] == 0 and result.snic_read_bytes["pe"] > 0


def test_a_users_policy_travels_by_its_module(tmp_path: Path) -> None:
    from dualpath_emu.cluster.user_systems import SystemLoader

    here = Path(__file__).resolve().parents[2] / "python" / "dualpath_emu" / "examples"
    system = SystemLoader(here, "test").load("custom_policy.py:least-loaded")
    again = system_from_wire(system_to_wire(system))
    assert again.name == system.name and again.scheduler.__qualname__ == system.scheduler.__qualname__  # type: ignore[union-attr]


def _pids_of(run_dir: Path) -> list[int]:
    pids = []
    for name in os.listdir(run_dir):
        if name.endswith(".pid"):
            pids.append(int((run_dir / name).read_text()))
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize(
    ("victim", "how"),
    [("pe0", "kill"), ("dataplane", "kill"), ("de1", "stop"), ("scheduler", "stop"), ("client", "stop")],
)
def test_a_killed_or_stopped_process_ends_the_run_naming_it_and_leaves_none_behind(
    tmp_path: Path, victim: str, how: str
) -> None:
    pids: dict[str, int] = {}
    started = threading.Event()

    def on_start(name: str, pid: int) -> None:
        pids[name] = pid
        if name == victim:
            started.set()

    def strike() -> None:
        started.wait(30)
        ready = tmp_path / "run" / f"{victim}.ready"
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:  # up and beating (a slow start is not a hang)
            time.sleep(0.02)
        time.sleep(0.5)  # the run is under way
        os.kill(pids[victim], signal.SIGKILL if how == "kill" else signal.SIGSTOP)

    threading.Thread(target=strike, daemon=True).start()
    begun = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        run_live(small_config(), SYSTEMS["basic"], work(), run_dir=tmp_path / "run", options=LIVE, time_scale=1.0,
                 on_start=on_start)  # fmt: skip
    assert f"'{victim}'" in str(caught.value)
    assert ("killed by SIGKILL" if how == "kill" else "stopped answering") in str(caught.value)
    assert time.monotonic() - begun < 20
    assert pids and not [name for name, pid in pids.items() if _alive(pid)]
    assert (tmp_path / "run" / f"{victim}.out").exists()  # every process's log is kept


def test_live_metrics_are_served_while_the_run_goes_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    scraped: list[str] = []

    def scrape() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (run_dir / "metrics.port").exists():
            time.sleep(0.05)
        port = int((run_dir / "metrics.port").read_text())
        time.sleep(2.5)  # two polls of the data plane
        scraped.append(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())

    thread = threading.Thread(target=scrape, daemon=True)
    thread.start()
    reports: list[Any] = []
    result = run_live(small_config(), SYSTEMS["basic"], work(), run_dir=run_dir, options=LIVE, time_scale=1.0, metrics_port=0,
                      progress=reports.append)  # fmt: skip
    thread.join(10)
    # The launching side heard how far the run was, from the client's process, while it went on.
    assert reports and all(r.system == "basic" and r.turns_total == result.turns for r in reports)
    assert [r.turns_done for r in reports] == sorted(r.turns_done for r in reports) and reports[
        0
    ].turns_done < result.turns
    assert scraped, "the endpoint was not reachable during the run"
    text = scraped[0]
    done = float(next(line.split()[1] for line in text.splitlines() if line.startswith("dualpath_turns_done_total")))
    assert 0 < done < result.turns  # scraped while the run went on
    assert 'dualpath_port_utilisation{port="n0.snic.rx"}' in text
    assert "dualpath_ttft_seconds_bucket" in text and 'dualpath_read_queue_bytes{node="n0"}' in text


def test_run_mode_realtime_prints_the_live_summary(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from dualpath_emu.cli import main

    argv = ["run", "ds27b-1p1d-offline", "--mode", "realtime", "--agents", "4", "--set", "workload.max_rounds=2",
            "--system", "dualpath", "--time-scale", "5", "--placement", "roles", "--json", "--timeout", "120"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)["systems"]["dualpath"]
    assert summary["mode"] == "realtime" and summary["processes"] == 4 and summary["placement"] == "roles"
    assert summary["turns"] == 8 and summary["complete"]
    assert {"p50", "p99", "max", "count"} <= set(summary["delivery_lag_s"])


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("--time-scale", "0", "--time-scale: expected a number in"), ("--metrics-port", "70000", "--metrics-port"),
     ("--timeout", "-1", "--timeout")],
)  # fmt: skip
def test_bad_live_options_are_usage_errors(
    capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    from dualpath_emu.cli import main

    assert main(["run", "ds27b-1p1d-offline", "--mode", "realtime", "--agents", "2", option, value]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_run_started_by_hand_on_two_hosts_is_collected_from_their_files(
    tmp_path: Path, virtual: SystemResult
) -> None:
    # Two "hosts" on this machine: loopback addresses 127.0.0.1 and 127.0.0.2, each with its own copy of the
    # run directory (nothing shared but the network), CURVE keys on every tcp socket.
    import shutil

    from tests.by_hand import gather_parts, launch_per_host

    from dualpath_emu.cluster.live import collect_dir, host_commands, prepare_live

    host_a, host_b = tmp_path / "a", tmp_path / "b"
    commands = prepare_live(small_config(), SYSTEMS["dualpath"], work(), run_dir=host_a, options=LIVE,
                            hosts=[("pe*", "127.0.0.2"), ("de*", "127.0.0.2")], port_base=47_300)  # fmt: skip
    assert [name for _, name, _ in commands][0] == "dataplane" and commands[-1][1] == "client"
    assert {name for host, name, _ in commands if host == "127.0.0.2"} == {"pe0", "de1", "de2"}
    assert (host_a / "keys").stat().st_mode & 0o077 == 0
    shutil.copytree(host_a, host_b)
    per_host = host_commands(host_a, commands)
    assert [host for host, _ in per_host] == ["127.0.0.2", "127.0.0.1"]  # the client's host last
    for _, command in per_host:
        words = command.split()
        assert words[:2] == ["dualpath-emu", "launch"] and "tcp://" not in command  # endpoints are in the files
    codes = launch_per_host(per_host, {"127.0.0.1": host_a, "127.0.0.2": host_b}, timeout_s=60)
    assert codes == [0] * len(per_host)
    gather_parts(host_b, host_a, ("pe0", "de1", "de2"))
    result, _ = collect_dir(host_a)  # every request ended once, every byte accounted, or it raises
    # Started by hand, the client does not wait for the other host's processes: its first turns may wait for
    # them, so the JCT is only roughly virtual time's.
    assert result.turns == virtual.turns and result.agents == virtual.agents == 24
    assert result.jct_s == pytest.approx(virtual.jct_s, rel=0.6)


def test_prepare_prints_each_hosts_commands_and_collect_names_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dualpath_emu.cli import main

    run_dir = tmp_path / "run"
    argv = ["run", "ds27b-1p1d-offline", "--mode", "realtime", "--agents", "2", "--system", "dualpath",
            "--prepare", str(run_dir), "--process-host", "de*=10.0.0.2"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"[10.0.0.2] dualpath-emu node {run_dir}/run.toml --process de1 --run-dir {run_dir}" in out
    assert "--process client" in out.splitlines()[-1]  # the driver's process last
    assert main(["collect", str(run_dir)]) == 2
    assert "no part of process(es) scheduler, client, pe0, de1" in capsys.readouterr().err
    assert main(["run", "ds27b-1p1d-offline", "--prepare", str(tmp_path / "x")]) == 2
    assert "add --mode realtime" in capsys.readouterr().err
    # A pattern that names no process (case matters, as in the names) is refused, not silently ignored.
    for pattern in ("DE*", "de9", "pe0 "):
        argv = ["run", "ds27b-1p1d-offline", "--mode", "realtime", "--agents", "2", "--system", "dualpath",
                "--prepare", str(tmp_path / "refused"), "--process-host", f"{pattern}=10.0.0.2"]  # fmt: skip
        assert main(argv) == 2
        assert f"--process-host {pattern!r}: matches no process of this run" in capsys.readouterr().err
        assert not (tmp_path / "refused" / "cluster.json").exists()


def test_launch_only_refuses_a_process_the_run_does_not_have(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dualpath_emu.cli import main

    run_dir = tmp_path / "run"
    argv = ["run", "ds27b-1p1d-offline", "--mode", "realtime", "--agents", "2", "--system", "dualpath",
            "--prepare", str(run_dir)]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["launch", str(run_dir / "run.toml"), "--run-dir", str(run_dir), "--only", "pe0,nosuch"]) == 2
    err = capsys.readouterr().err
    assert "no process 'nosuch' in this run" in err and "Traceback" not in err


@pytest.mark.parametrize("placement_kind", ["groups", "single"])
def test_a_fault_works_live_through_the_data_plane(tmp_path: Path, placement_kind: str) -> None:
    # Prefill node 0's storage NIC down from 0.5 s to 2.5 s of a ~4 s run: the data-plane service (or the one
    # process's own core) takes it, DualPath reads on the decode side meanwhile, and the run ends with every
    # request ended once and every byte accounted (collect raises otherwise).
    from dualpath_emu.cluster.faults import Fault, FaultPlan

    config = dataclasses.replace(small_config(), faults=FaultPlan((Fault("down", "n0.snic", 0.5, 2.0),)))
    result = run_live(config, SYSTEMS["dualpath"], work(), run_dir=tmp_path / "run", options=LIVE,
                      placement_kind=placement_kind)  # fmt: skip
    assert result.turns == sum(len(t) for t in work()) and result.complete
    [fault] = result.extra["faults"]
    assert (fault["kind"], fault["target"]) == ("down", "n0.snic")
    assert fault["end_s"] - fault["start_s"] == pytest.approx(2.0, abs=0.2)
    m = result.metrics
    start_ns = round(result.extra["emulated_start_s"] * 1e9)
    during = [r for r in range(len(m)) if 0.6e9 < m.scheduled_de_ns[r] - start_ns < 2.4e9 and m.hit[r] > 0]
    assert during and all(m.read_on_de[r] == 1 for r in during)


@pytest.mark.parametrize("placement_kind", ["groups", "single"])
def test_an_engine_crash_works_live(tmp_path: Path, placement_kind: str) -> None:
    # Decode node 1's engines crash at 2 s (mid-run: they hold requests then) and are back 1 s later, in a live run (each group its own process,
    # or one process): what they held is dispatched again, and every request ends once, every pool empty and
    # every byte accounted (collect raises otherwise).
    from dualpath_emu.cluster.faults import Fault, FaultPlan

    config = dataclasses.replace(small_config(), faults=FaultPlan((Fault("crash", "de1", 2.0, restart_s=1.0),)))
    result = run_live(config, SYSTEMS["dualpath"], work(), run_dir=tmp_path / "run", options=LIVE,
                      placement_kind=placement_kind)  # fmt: skip
    assert result.turns == sum(len(t) for t in work()) and result.complete
    assert result.redispatches > 0 and result.failed_requests == 0
    [fault] = result.extra["faults"]
    assert (fault["kind"], fault["target"]) == ("crash", "de1") and fault["redispatched"] == result.redispatches
    assert fault["end_s"] - fault["start_s"] == pytest.approx(1.0, abs=0.2)


def test_a_bounded_store_evicts_and_recomputes_live_as_in_virtual_time(tmp_path: Path) -> None:
    # The store's index is the scheduler's state, its figures replayed from the processes' observations: a live
    # run of a store a quarter of the working set evicts, computes the lost hits again and ends every request.
    from dualpath_emu.cluster.config import KvTierSpec

    config = small_config()
    plain = run_system(config, "dualpath", work())
    config = dataclasses.replace(config, kv_store=KvTierSpec(int(plain.working_set_bytes["max"] / 4), "tool_wait"))
    expected = run_system(config, "dualpath", work()).extra["kv"]["store"]
    result = run_live(config, SYSTEMS["dualpath"], work(), run_dir=tmp_path / "run", options=LIVE)
    kv = result.extra["kv"]["store"]
    assert result.complete and result.turns_done == plain.turns_done
    assert kv["evictions"] > 0 and 0 < kv["recomputed_tokens"] and kv["peak_bytes"] <= kv["capacity_bytes"]
    assert kv["stored_bytes"] - kv["evicted_bytes"] == kv["end_bytes"]
    assert kv["hit_tokens_asked"] == expected["hit_tokens_asked"]  # the same turns asked for the same contexts
    assert abs(kv["found_rate"] - expected["found_rate"]) < 0.1, (kv, expected)


def test_sglmc_reads_its_pool_live_as_in_virtual_time(tmp_path: Path) -> None:
    # The DRAM pool's index is the scheduler's state too, and its hits cross from the decode nodes that hold them
    # to the prefill node over the compute network: a pool a quarter of the working set evicts and reads the rest
    # from storage, as in virtual time.
    from dualpath_emu.cluster.config import KvPoolSpec

    config = small_config()
    plain = run_system(config, "sglmc", work())
    pool = int(plain.working_set_bytes["max"] / 4 / 3)  # three nodes' DRAM together
    config = dataclasses.replace(config, kv_pool=KvPoolSpec(pool))
    expected = run_system(config, "sglmc", work()).extra["kv"]["pool"]
    result = run_live(config, SYSTEMS["sglmc"], work(), run_dir=tmp_path / "run", options=LIVE)
    kv = result.extra["kv"]["pool"]
    assert result.complete and result.turns_done == plain.turns_done and set(result.extra["kv"]) == {"pool"}
    assert kv["evictions"] > 0 and kv["missed_tokens"] > 0 and kv["peak_bytes"] <= kv["capacity_bytes"]
    assert kv["hit_tokens_asked"] == expected["hit_tokens_asked"]
    assert abs(kv["found_rate"] - expected["found_rate"]) < 0.1, (kv, expected)
    assert result.snic_read_bytes["pe"] > 0 and result.snic_read_bytes["de"] == 0


def test_retention_keeps_kv_in_decode_hbm_live_as_in_virtual_time(tmp_path: Path) -> None:
    # What the decode GPUs keep is the scheduler's state; a kept hit crosses from the decode GPU's HBM to the
    # prefill GPU layer by layer, and nothing is read from storage for it.
    expected = run_system(small_config(), "dualpath+retention", work()).extra["kv"]["hbm"]
    result = run_live(small_config(), SYSTEMS["dualpath+retention"], work(), run_dir=tmp_path / "run", options=LIVE)
    kv = result.extra["kv"]["hbm"]
    assert result.complete and result.turns == sum(len(t) for t in work())
    assert kv["hit_tokens_asked"] == expected["hit_tokens_asked"] and kv["taken_bytes"] > 0
    assert abs(kv["found_rate"] - expected["found_rate"]) < 0.1, (kv, expected)
    assert sum(result.snic_read_bytes.values()) < (1 - kv["found_rate"] + 0.1) * kv["hit_tokens_asked"] * 19680


def test_background_traffic_and_isolation_off_run_live_as_in_virtual_time(tmp_path: Path) -> None:
    # The background traffic's engine runs beside the scheduler; its bursts cross the decode nodes' storage NICs in
    # the data-plane service's core, as in virtual time: DualPath slows down by about as much.
    from dualpath_emu.cluster.topology import BackgroundTraffic, NetworkSpec

    load = NetworkSpec(isolation=False, background=(BackgroundTraffic(("n1.snic.rx", "n2.snic.rx"), 0.4e9, 0.0, 6.0),))
    config = dataclasses.replace(small_config(), network=load)
    plain = run_system(small_config(), "dualpath", work())
    expected = run_system(config, "dualpath", work())
    result = run_live(config, SYSTEMS["dualpath"], work(), run_dir=tmp_path / "run", options=LIVE)
    assert result.complete and result.turns_done == plain.turns_done
    assert expected.jct_s > plain.jct_s * 1.05 and result.jct_s > plain.jct_s * 1.05
    assert result.snic_read_bytes["de"] == pytest.approx(expected.snic_read_bytes["de"], rel=0.25)


def test_split_reads_run_live_as_in_virtual_time(tmp_path: Path) -> None:
    # Each part of a split hit is read by its own side's process and loaded from its own buffer: the live run
    # finishes every turn and reads what virtual time reads, on both sides.
    expected = run_system(small_config(), "dualpath-split", work())
    result = run_live(small_config(), SYSTEMS["dualpath-split"], work(), run_dir=tmp_path / "run", options=LIVE)
    assert result.complete and result.turns_done == expected.turns_done
    assert sum(result.snic_read_bytes.values()) == pytest.approx(sum(expected.snic_read_bytes.values()), rel=1e-6)
    assert result.snic_read_bytes["pe"] > 0 and result.snic_read_bytes["de"] > 0
