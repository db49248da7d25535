"""The network in a scenario (``[network]``, :class:`~dualpath_emu.cluster.topology.NetworkSpec`): isolation off, the
compute NICs' VL tables, and background traffic the engines do not make."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpath_emu.cli import main
from dualpath_emu.cluster.catalog import MODELS, TESTBED_NODE
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.run import run_system
from dualpath_emu.cluster.scenario import load_cluster_scenario
from dualpath_emu._core import Core
from dualpath_emu.cluster.topology import (
    KV_LANE, MODEL_LANE, BackgroundTraffic, NetworkSpec, TokenBucket, VlTables, build_topology,
)  # fmt: skip
from dualpath_emu.config import ScenarioError
from dualpath_emu.workload.generator import generate
from dualpath_emu.workload.trajectory import Trajectory

# Storage-bound, with slow compute NICs and a prefill EP group over two nodes: its collectives cross the network.
NODE = dataclasses.replace(TESTBED_NODE, snic_bytes_per_s=0.3e9, cnic_bytes_per_s=2e9)
CONFIG = ClusterConfig(model=MODELS["ds27b"], node=NODE, pe_nodes=2, de_nodes=2, prefill_ep_nodes=2,
                       decode_ep_nodes=2)  # fmt: skip


def work(agents: int = 24, rounds: int = 6) -> list[Trajectory]:
    out = []
    for t in generate("32k", agents=agents, seed=0):
        pairs = list(zip(t.append, t.gen))[10 : 10 + rounds] or list(zip(t.append, t.gen))[:rounds]
        out.append(Trajectory.from_rounds(t.id, pairs))
    return out


def network(**kwargs: object) -> ClusterConfig:
    return dataclasses.replace(CONFIG, network=NetworkSpec(**kwargs))  # type: ignore[arg-type]


def test_isolation_off_puts_the_collectives_in_the_kv_lane_and_the_paper_tables_are_the_default() -> None:
    trajectories = work()
    paper = run_system(CONFIG, "dualpath", trajectories)
    shared = run_system(network(isolation=False), "dualpath", trajectories)
    fair = run_system(network(cnic_vl=VlTables(4, 0, "", "0:1,2:1")), "dualpath", trajectories)
    # KV and the collectives compete on the compute NICs: the runs differ (which way depends on the load and the
    # delivery order: reproduce network measures it), and each finishes every turn.
    assert shared.event_log_sha256 != paper.event_log_sha256 != fair.event_log_sha256
    assert shared.complete and fair.complete and shared.turns_done == fair.turns_done == paper.turns_done
    assert build_topology(Core(), NODE, 1, 1, CONFIG.storage, NetworkSpec(isolation=False)).model_lane == KV_LANE
    assert build_topology(Core(), NODE, 1, 1, CONFIG.storage).model_lane == MODEL_LANE


def test_background_traffic_on_the_decode_nodes_storage_nics_slows_dualpath_and_leaves_basic_alone() -> None:
    trajectories = work()
    config = dataclasses.replace(CONFIG, pe_nodes=1, de_nodes=2, prefill_ep_nodes=1, decode_ep_nodes=1)
    load = NetworkSpec(background=(BackgroundTraffic(("n1.snic.rx", "n2.snic.rx"), 0.25e9, 0.0, 30.0),))
    loaded = dataclasses.replace(config, network=load)
    basic, basic_loaded = run_system(config, "basic", trajectories), run_system(loaded, "basic", trajectories)
    dual, dual_loaded = run_system(config, "dualpath", trajectories), run_system(loaded, "dualpath", trajectories)
    # Basic reads on the prefill side only: the decode nodes' storage NICs are not on its way (event for event in
    # FIFO delivery: the test below; a shuffled order shuffles the background's own inputs in too).
    assert basic_loaded.jct_s == pytest.approx(basic.jct_s, rel=0.02)
    # DualPath's read-side choice does not see the load (only the read queues): its decode-side reads slow down.
    assert dual_loaded.jct_s > dual.jct_s * 1.05
    # The KV metrics count the engines' bytes, not the background's; the ports' utilisation counts both.
    assert basic_loaded.snic_read_bytes == pytest.approx(basic.snic_read_bytes, rel=1e-9)
    assert basic_loaded.snic_util["de"]["rx"]["mean"] > basic.snic_util["de"]["rx"]["mean"] == 0
    assert BackgroundTraffic(("x",), 1.0, 1.0, 5.0, 2.0, 0.5).bursts() == [(1.0, 0.5), (3.0, 0.5), (5.0, 0.5)]


@pytest.mark.fifo_only
def test_background_traffic_off_a_systems_path_leaves_its_run_as_it_was_event_for_event() -> None:
    trajectories = work()
    config = dataclasses.replace(CONFIG, pe_nodes=1, de_nodes=2, prefill_ep_nodes=1, decode_ep_nodes=1)
    load = NetworkSpec(background=(BackgroundTraffic(("n1.snic.rx", "n2.snic.rx"), 0.25e9, 0.0, 30.0),))
    loaded = dataclasses.replace(config, network=load)
    basic = run_system(config, "basic", trajectories)
    assert run_system(loaded, "basic", trajectories).event_log_sha256 == basic.event_log_sha256
    # Bursts: 0.5 s of every 2 s for 10 s move what 2.5 s without a pause do (before the workload ends, 13.8 s
    # here: a burst due after it is not started); the same run length, so the same mean utilisation.
    utilisation = []
    for traffic in (BackgroundTraffic(("n1.snic.rx",), 0.25e9, 0.0, 10.0, 2.0, 0.5),
                    BackgroundTraffic(("n1.snic.rx",), 0.25e9, 0.0, 2.5)):  # fmt: skip
        run = run_system(dataclasses.replace(config, network=NetworkSpec(background=(traffic,))), "basic", trajectories)
        assert run.jct_s == basic.jct_s
        utilisation.append(run.snic_util["de"]["rx"]["mean"])
    assert utilisation[0] == pytest.approx(utilisation[1], rel=1e-9) and utilisation[0] > 0


def test_a_token_bucket_lets_a_port_run_at_its_own_rate_for_its_burst_then_at_the_sustained_rate() -> None:
    trajectories = work()
    config = dataclasses.replace(CONFIG, pe_nodes=1, de_nodes=2, prefill_ep_nodes=1, decode_ep_nodes=1)
    rate = NODE.snic_bytes_per_s * NODE.snics
    plain = run_system(config, "basic", trajectories)  # storage-bound: Basic reads on n0's storage NIC alone

    def bucket(burst: float) -> float:
        net = NetworkSpec(buckets=(TokenBucket(("n0.snic.rx",), rate / 2, burst),))
        return run_system(dataclasses.replace(config, network=net), "basic", trajectories).jct_s

    # A burst larger than everything read changes nothing; a small one halves the port: the JCT nearly doubles.
    assert bucket(1e13) == plain.jct_s
    assert 1.6 * plain.jct_s < bucket(1e6) < 1.9 * plain.jct_s
    assert plain.jct_s < bucket(1e9) < bucket(1e6)


def test_a_scenario_writes_the_network_and_a_bad_key_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.toml"
    head = ('kind = "cluster"\n[deployment]\nmodel = "ds27b"\npe_nodes = 1\nde_nodes = 2\nprefill_ep_nodes = 1\n'
            "decode_ep_nodes = 1\n[workload]\nagents = 4\nmax_rounds = 2\n")  # fmt: skip
    path.write_text(head + '[network]\nisolation = false\n[network.cnic_vl]\nmax_vls = 4\nhigh_limit = 0\n'
                    'vlarb_high = ""\nvlarb_low = "0:1,2:1"\n[[network.background]]\nports = ["de.snic.rx", "n0.cnic.tx"]\n'
                    "rate_bytes_per_s = 1e9\nduration_s = 10\nperiod_s = 2\non_s = 0.5\n")  # fmt: skip
    net = load_cluster_scenario(path).config.network
    assert not net.isolation and net.cnic_vl == VlTables(4, 0, "", "0:1,2:1")
    ports = ("n1.snic.rx", "n2.snic.rx", *(f"n0.cnic{g}.tx" for g in range(TESTBED_NODE.gpus)))
    assert net.background == (BackgroundTraffic(ports, 1e9, 0.0, 10.0, 2.0, 0.5),)
    assert main(["run", str(path), "--system", "dualpath"]) == 0
    capsys.readouterr()
    for bad, where in [
        ('[[network.background]]\nports = ["de.snic.tx2"]\nrate_bytes_per_s = 1e9\nduration_s = 1\n', "ports"),
        ('[[network.background]]\nports = ["n7.snic.rx"]\nrate_bytes_per_s = 1e9\nduration_s = 1\n', "ports"),
        ('[[network.background]]\nports = ["n1.dram"]\nrate_bytes_per_s = 1e9\n', "duration_s"),
        ('[network.cnic_vl]\nmax_vls = 4\nhigh_limit = 0\nvlarb_high = ""\nvlarb_low = "9:x"\n', "vlarb_low"),
        ('[[network.bucket]]\nports = ["n0.snic.rx"]\nsustained_bytes_per_s = 1e15\nburst_bytes = 1e9\n', "sustained"),
        (
            '[[network.bucket]]\nports = ["pe.snic.rx"]\nsustained_bytes_per_s = 1e9\nburst_bytes = 1e9\n'
            '[[network.bucket]]\nports = ["n0.snic.rx"]\nsustained_bytes_per_s = 1e9\nburst_bytes = 1e9\n',
            "one bucket",
        ),
    ]:
        path.write_text(head + bad)
        assert main(["run", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"network." in err and where in err and err.count("\n") == 1, err
    path.write_text('kind = "cluster"\nbackend = "host"\n[[network.background]]\nports = ["n1.snic.rx"]\n'
                    "rate_bytes_per_s = 1e9\nduration_s = 1\n")  # fmt: skip
    with pytest.raises(ScenarioError, match="modelled only"):
        load_cluster_scenario(path)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    isolation=st.booleans(), equal_vls=st.booleans(), system=st.sampled_from(["basic", "dualpath", "oracle"]),
    ports=st.lists(st.sampled_from(["n0.snic.rx", "n2.snic.rx", "n3.snic.tx", "n1.cnic0.tx", "n2.cnic3.rx", "n0.dram",
                                    "3fs.read"]), min_size=0, max_size=3, unique=True),
    rate=st.sampled_from([1e6, 1e8, 5e9]), period=st.sampled_from([0.0, 1.0, 3.0]),
    bucket=st.sampled_from([None, "n0.snic.rx", "n2.cnic0.rx"]), burst=st.sampled_from([1e3, 1e8]),
)  # fmt: skip
def test_any_lanes_background_and_bucket_lose_no_request_and_account_every_byte(
    isolation: bool, equal_vls: bool, system: str, ports: list[str], rate: float, period: float,
    bucket: str | None, burst: float,
) -> None:  # fmt: skip
    background = (BackgroundTraffic(tuple(ports), rate, 0.5, 5.0, period, period / 2),) if ports else ()
    buckets = (TokenBucket((bucket,), 1e8, burst),) if bucket else ()
    net = NetworkSpec(isolation, VlTables(4, 0, "", "0:1,2:1") if equal_vls else None, background, buckets)
    result = run_system(dataclasses.replace(CONFIG, network=net), system, work(8, 3))  # raises on a broken invariant
    assert result.complete and result.turns_done == result.turns
    assert all(v >= -1e-3 for v in (*result.snic_read_bytes.values(), *result.snic_write_bytes.values()))
