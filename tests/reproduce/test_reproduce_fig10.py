"""``dualpath-emu reproduce fig10`` (online serving, the SLO edge): the bracket search on synthetic outcomes,
the steady-state window, and the ``--quick`` variant end to end (files written, orderings kept)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dualpath_emu.cluster.metrics import Metrics
from dualpath_emu.reproduce.fig10 import (
    SLO_TPOT_S,
    SLO_TTFT_S,
    Point,
    Search,
    main,
    trajectory_s,
    window_bounds_ns,
    window_stats,
)


def _point(rate: float, ttft_mean: float, tpot_mean: float = 0.015) -> Point:
    ttft = {"p50": ttft_mean, "p90": ttft_mean, "p99": ttft_mean, "mean": ttft_mean}
    tpot = {"p50": tpot_mean, "p90": tpot_mean, "p99": tpot_mean, "mean": tpot_mean}
    return Point("ds660b", "basic", rate, 10, 0, 0.0, 1.0, 10, ttft, ttft, tpot, ttft, tpot, 100, 1.0, 1.0, 0.1)


def _drive(search: Search, edge: float) -> None:
    """Run ``search`` against a system whose TTFT crosses the SLO exactly at ``edge`` APS."""
    while rates := search.next_rates():
        search.add([_point(r, SLO_TTFT_S * r / edge) for r in rates])


@pytest.mark.parametrize("edge", [0.05, 0.37, 1.0, 2.9])
def test_search_brackets_the_edge_to_its_resolution(edge: float) -> None:
    search = Search("ds660b", "basic", guess=0.5, cap=10.0, resolution=0.15, growth=1.5, k=2, max_steps=12)
    _drive(search, edge)
    hi = search.hi
    assert hi is not None and search.lo <= edge < hi
    assert hi / search.lo - 1.0 <= 0.15
    assert not search.censored


def test_search_stops_at_the_cap_and_reports_a_censored_edge() -> None:
    search = Search("ds27b", "oracle", guess=1.0, cap=3.0, resolution=0.1, growth=2.0, k=2, max_steps=12)
    _drive(search, 100.0)
    assert search.censored and search.lo == 3.0 and search.hi is None


def test_tpot_over_the_slo_misses_it_and_a_met_rate_above_a_missed_one_is_ignored() -> None:
    assert not _point(0.1, 0.5, SLO_TPOT_S * 1.01).meets_slo()
    assert _point(0.1, SLO_TTFT_S, SLO_TPOT_S).meets_slo()
    search = Search("ds660b", "basic", guess=0.5, cap=10.0, resolution=0.15, growth=1.5, k=2, max_steps=5)
    search.add([_point(0.4, 1.0), _point(0.5, 5.0), _point(0.6, 3.0)])  # 0.6 met: noise above a miss
    assert (search.lo, search.hi) == (0.4, 0.5)


def test_a_ttft_search_ignores_the_tpot_that_fails_the_slo_search_at_every_rate() -> None:
    slo = Search("ds660b", "basic", guess=0.5, cap=10.0, resolution=0.15, growth=1.5, k=2, max_steps=5)
    ttft = Search(
        "ds660b", "basic", guess=0.5, cap=10.0, resolution=0.15, growth=1.5, k=2, max_steps=5, criterion="ttft"
    )
    slow_decode = [_point(0.4, 1.0, SLO_TPOT_S * 1.3), _point(0.5, 5.0, SLO_TPOT_S * 1.3)]
    slo.add(slow_decode)
    ttft.add(slow_decode)
    assert (slo.lo, slo.hi) == (0.0, 0.4)
    assert (ttft.lo, ttft.hi) == (0.4, 0.5)


def test_the_window_is_the_last_half_of_the_agents_arrival_period() -> None:
    m = Metrics()
    # agent, arrival (s), first token after (s); agents 0..2 arrive at 0, 10, 20 s; agent 0 has a second turn.
    for rid, (agent, t, ttft) in enumerate([(0, 0, 1.0), (1, 10, 2.0), (0, 12, 3.0), (2, 20, 4.0), (1, 25, 9.0)]):
        m.arrive(rid, agent, int(t * 1e9), 100, 0, 1)
        m.first_token_ns[rid] = int((t + ttft) * 1e9)
    start, end = window_bounds_ns(m)
    assert (start, end) == (10_000_000_000, 20_000_000_000)
    n, ttft_s, _, _ = window_stats(m, start, end)
    assert n == 3 and ttft_s["mean"] == pytest.approx(3.0)
    for rid in range(len(m)):
        m.done_ns[rid] = m.first_token_ns[rid] + 1_000_000_000
    # agents 1 and 2 arrive in the window: 10 → 35 s and 20 → 25 s
    assert trajectory_s(m, start, end) == pytest.approx((25.0 + 5.0) / 2)


def test_window_ttst_is_second_token_minus_first() -> None:
    m = Metrics()
    # Arrival, first and second token (s): TTST 0.05 s and 0.01 s, whatever the TTFT (1 s and 3 s).
    for rid, (t, first, second) in enumerate([(0.0, 1.0, 1.05), (5.0, 8.0, 8.01)]):
        m.arrive(rid, rid, int(t * 1e9), 100, 0, 4)
        m.first_token_ns[rid], m.second_token_ns[rid] = int(first * 1e9), int(second * 1e9)
    _, ttft, ttst, _ = window_stats(m, 0, 10_000_000_000)
    assert ttft["mean"] == pytest.approx(2.0)
    assert ttst["mean"] == pytest.approx(0.03) and ttst["p99"] == pytest.approx(0.05)
    assert m.ttst_s() == pytest.approx([0.05, 0.01])


@pytest.mark.processes
def test_quick_variant_finds_ordered_edges_and_writes_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--quick", "--json", "--out", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["experiment"] == "fig10"
    for suffix in ("csv", "png", "json"):
        assert (tmp_path / f"fig10.{suffix}").stat().st_size > 0
    assert json.loads((tmp_path / "fig10.json").read_text())["checks"] == report["checks"]
    assert report["checks"] and all(report["checks"].values()), report["checks"]
    edges = {(r["model"], r["system"]): r["edge_aps"] for r in report["rows"] if r["kind"] == "edge"}
    assert len(edges) == 6
    for model in ("ds660b", "ds27b"):
        basic, dualpath, oracle = (edges[model, s] for s in ("basic", "dualpath", "oracle"))
        assert 0 < basic <= dualpath <= oracle
    runs = [r for r in report["rows"] if r["kind"] == "run"]
    assert all(r["window_requests"] > 0 and r["ttft_s_mean"] > 0 for r in runs)
    # TTST (the hand-off and a decode step) is milliseconds, below the TTFT (which includes the prefill).
    assert all(0 < r["ttst_ms_mean"] < 1e3 * r["ttft_s_mean"] for r in runs)
    assert any(c["what"].startswith("ds27b: DualPath TTST / Basic's") or c["what"].startswith("ds660b: DualPath TTST")
               for c in report["comparisons"])  # fmt: skip
    with (tmp_path / "fig10.csv").open() as f:
        assert len(list(csv.DictReader(f))) == len(report["rows"])
    for c in report["comparisons"]:
        assert c["emulator"] == c["emulator"] and c["paper"] > 0


def test_a_point_is_cached_as_json_and_a_wrong_shape_is_refused() -> None:
    from dualpath_emu.reproduce.fig10 import POINTS

    point = _point(0.5, 1.25)
    value = json.loads(json.dumps(POINTS.encode(point)))
    assert POINTS.decode(value, None) == point
    for bad in ({**value, "ttft_s": [1.0]}, {**value, "turns": "100"}, {k: v for k, v in value.items() if k != "rate"}):
        with pytest.raises((TypeError, ValueError)):
            POINTS.decode(bad, None)
