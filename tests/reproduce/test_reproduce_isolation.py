"""The isolation experiment (paper §5): the quick variant end to end, and single points against the closed
forms of the fluid model and of the FIFO wait."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dualpath_emu.cluster.catalog import TESTBED_NODE, model
from dualpath_emu.reproduce import isolation, markdown

C = TESTBED_NODE.cnic_bytes_per_s
B = isolation.KV_BYTES_PER_S


def condition(name: str) -> isolation.Condition:
    return next(c for c in isolation.CONDITIONS if c.name == name)


def test_quick_run_meets_the_targets_and_writes_its_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert isolation.main(["--quick", "--json", "--out", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["experiment"] == "isolation"
    assert report["checks"] and all(report["checks"].values()), report["checks"]
    for suffix in ("csv", "png", "json"):
        assert (tmp_path / f"isolation.{suffix}").stat().st_size > 0
    with (tmp_path / "isolation.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(report["rows"]) == len(isolation.QUICK_BATCH_TOKENS) * len(isolation.CONDITIONS)
    by_condition: dict[str, list[float]] = {}
    for row in report["rows"]:
        by_condition.setdefault(row["condition"], []).append(row["slowdown"])
        assert row["latency_us"] > 0
    assert set(by_condition) == {c.name for c in isolation.CONDITIONS}
    assert all(s == 1.0 for s in by_condition["unloaded"])
    # Isolation: the dispatch's lane holds no KV and the KV lane keeps ~0.1% of the port.
    assert all(1.0 < s <= 1.01 for s in by_condition["isolated"])
    assert all(s == pytest.approx(C / (C - B), rel=1e-3) for s in by_condition["shared_lane_fluid"])
    assert all(s > f for s, f in zip(by_condition["shared_lane"], by_condition["shared_lane_fluid"]))
    met = {c["what"]: c["met"] for c in report["comparisons"]}
    assert [m for m in met.values() if m is not None] == [True] * 5
    # The Markdown of EVALUATION.md renders it.
    text = markdown.render(json.loads((tmp_path / "isolation.json").read_text()))
    assert "isolation" in text and "shared lane, FIFO / fluid only" in text


def test_unloaded_and_isolated_latency_is_the_bytes_over_the_nic_rate() -> None:
    unloaded = isolation.measure(condition("unloaded"), 1024)
    assert unloaded.bytes_per_peer == isolation.dispatch_bytes_per_peer(model("ds660b"), 1024, 2)
    assert unloaded.latency_ns == pytest.approx(unloaded.bytes_per_peer / C * 1e9, abs=2)
    isolated = isolation.measure(condition("isolated"), 1024)
    assert 1.0 < isolated.latency_ns / unloaded.latency_ns < 1.002  # the KV lane's ~0.1%, no FIFO wait


def test_the_fluid_model_alone_slows_the_shared_lane_by_at_most_c_over_c_minus_b() -> None:
    unloaded = isolation.measure(condition("unloaded"), isolation.A5_TOKENS).latency_ns
    fluid = isolation.measure(condition("shared_lane_fluid"), isolation.A5_TOKENS).latency_ns
    assert fluid / unloaded == pytest.approx(C / (C - B), rel=1e-3)


@pytest.mark.parametrize(("queue_depth", "kv_qps"), [(16, 4), (4, 4), (16, 2)])
def test_the_shared_lane_waits_out_the_kv_work_requests_then_shares_the_port(queue_depth: int, kv_qps: int) -> None:
    spec = model("ds660b")
    point = isolation.measure(condition("shared_lane"), isolation.A5_TOKENS, queue_depth=queue_depth, kv_qps=kv_qps)
    wait_ns = kv_qps * queue_depth * 64 * spec.kv_bytes_per_token_layer / B * 1e9
    assert isolation.fifo_wait_ns(spec, queue_depth, kv_qps) == pytest.approx(wait_ns)
    assert point.latency_ns == pytest.approx(wait_ns + point.bytes_per_peer / (C - B) * 1e9, abs=3)


def test_the_default_outstanding_bytes_are_sixteen_layer_blocks() -> None:
    assert isolation.outstanding_bytes(model("ds660b")) == 16 * 41_984


def test_dispatch_bytes_follow_the_deepep_layout() -> None:
    spec = model("ds660b")
    per_token = spec.a2a_dispatch_bytes_per_token_layer / spec.activated_experts
    assert per_token == 7168 + 7168 // 128 * 4  # FP8 hidden state with one FP32 scale per 128 channels
    assert isolation.dispatch_bytes_per_peer(spec, 1000, 2) == round(1000 * per_token * (1 - 0.5**8))


def test_the_assumptions_are_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert isolation.main(["--quick", "--json", "--queue-depth", "4", "--kv-qps", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert any("keeps 4 WRs" in note for note in report["notes"])
    with pytest.raises(SystemExit):
        isolation.main(["--quick", "--queue-depth", "0"])
    assert "expected an integer >= 1" in capsys.readouterr().err
