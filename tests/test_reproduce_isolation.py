"""The isolation experiment (paper §5): the quick variant end to end, and single points against the fluid
model's closed forms."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dualpath_emu.cluster.catalog import TESTBED_NODE, model
from dualpath_emu.reproduce import isolation


def test_quick_run_meets_the_targets_and_writes_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert isolation.main(["--quick", "--json", "--out", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["experiment"] == "isolation"
    assert report["checks"] and all(report["checks"].values()), report["checks"]
    for suffix in ("csv", "png", "json"):
        assert (tmp_path / f"isolation.{suffix}").stat().st_size > 0
    with (tmp_path / "isolation.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(report["rows"])
    by_condition: dict[str, list[float]] = {}
    for row in report["rows"]:
        by_condition.setdefault(row["condition"], []).append(row["slowdown"])
        assert row["latency_us"] > 0
    assert set(by_condition) == {c.name for c in isolation.CONDITIONS}
    assert all(s == 1.0 for s in by_condition["unloaded"])
    # Isolation: the KV lane keeps ~0.1% of a saturated port, so the collective slows by about that.
    assert all(1.0 < s <= 1.1 for s in by_condition["isolated"])
    assert all(s >= 2.0 for s in by_condition["shared_lane"])
    assert all(1.9 <= s <= 2.1 for s in by_condition["no_priority"])
    met = {c["what"]: c["met"] for c in report["comparisons"]}
    assert [m for m in met.values() if m is not None] == [True, True]


def test_unloaded_latency_is_the_bytes_over_the_nic_rate() -> None:
    point = isolation.measure(isolation.CONDITIONS[0], 1024, 0)
    assert point.bytes_per_peer == isolation.dispatch_bytes_per_peer(model("ds660b"), 1024, 2)
    assert point.latency_ns == pytest.approx(point.bytes_per_peer / TESTBED_NODE.cnic_bytes_per_s * 1e9, abs=2)


@pytest.mark.parametrize("kv_flows", [1, 3])
def test_shared_lane_slowdown_is_the_flow_count(kv_flows: int) -> None:
    """One collective transfer among ``kv_flows`` KV transfers of the same lane gets 1/(kv_flows + 1)."""
    unloaded = isolation.measure(isolation.CONDITIONS[0], 256, 0).latency_ns
    shared = next(c for c in isolation.CONDITIONS if c.name == "shared_lane")
    loaded = isolation.measure(shared, 256, kv_flows).latency_ns
    assert loaded / unloaded == pytest.approx(kv_flows + 1, rel=1e-3)


def test_dispatch_bytes_follow_the_deepep_layout() -> None:
    spec = model("ds660b")
    per_token = spec.a2a_dispatch_bytes_per_token_layer / spec.activated_experts
    assert per_token == 7168 + 7168 // 128 * 4  # FP8 hidden state with one FP32 scale per 128 channels
    assert isolation.dispatch_bytes_per_peer(spec, 1000, 2) == round(1000 * per_token * (1 - 0.5**8))
