"""Replicates (``run --seeds``) and ``compare``: means with 95% intervals over seeds, two runs side by side."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
from pathlib import Path

import pytest

from dualpath_emu.cli import main
from dualpath_emu.cluster.replicates import estimate, parse_seeds
from dualpath_emu.errors import UsageError

SMALL = ["ds27b-1p1d-offline", "--agents", "4", "--set", "workload.max_rounds=3"]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


def test_the_interval_is_students_t_over_the_values() -> None:
    values = [10.0, 12.0, 11.0, 13.0, 9.0]
    e = estimate(values)
    half = 2.776 * statistics.stdev(values) / len(values) ** 0.5  # t(0.975, 4)
    assert e.mean == pytest.approx(11.0) and (e.low, e.high) == pytest.approx((11.0 - half, 11.0 + half))
    one = estimate([3.0])
    assert (one.mean, one.low, one.high) == (3.0, 3.0, 3.0) and one.text() == "3"
    assert estimate([2.0, 2.0]).text() == "2 ± 0"


def test_seeds_are_a_count_from_the_scenarios_seed_or_a_list() -> None:
    assert parse_seeds("3", 5) == [5, 6, 7]
    assert parse_seeds("0,3,7", 5) == [0, 3, 7]
    for bad in ("0", "x", "1,1", "-1,2", "2000"):
        with pytest.raises(UsageError, match="--seeds"):
            parse_seeds(bad, 0)


def test_run_seeds_reports_each_figure_over_the_seeds_and_the_paired_speedup(tmp_path: Path) -> None:
    status, out, _ = run_cli(["run", *SMALL, "--seeds", "3", "--json"])
    assert status == 0
    document = json.loads(out)
    replicates = document["replicates"]
    assert replicates["seeds"] == [0, 1, 2] and set(replicates["systems"]) == {"basic", "dualpath", "oracle"}
    jct = replicates["systems"]["dualpath"]["jct_s"]
    assert len(jct["values"]) == 3 and jct["ci95"][0] <= jct["mean"] <= jct["ci95"][1]
    # Each seed is the run that seed gives alone.
    status, alone, _ = run_cli(["run", *SMALL, "--seed", "1", "--json"])
    assert json.loads(alone)["systems"]["dualpath"]["jct_s"] == jct["values"][1]
    speedup = replicates["speedup_vs_basic"]["dualpath"]["values"]
    assert speedup == pytest.approx(
        [b / d for b, d in zip(replicates["systems"]["basic"]["jct_s"]["values"], jct["values"])]
    )
    status, table, _ = run_cli(["run", *SMALL, "--seeds", "0,5", "--system", "dualpath", "--out", str(tmp_path / "a")])
    assert status == 0 and "2 seeds (0, 5)" in table and "±" in table
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["replicates"]["seeds"] == [0, 5]


def test_seeds_are_refused_live() -> None:
    status, _, err = run_cli(["run", *SMALL, "--seeds", "2", "--mode", "realtime"])
    assert status == 2 and "--seeds runs replicates in virtual time" in err


def test_compare_puts_two_runs_side_by_side(tmp_path: Path) -> None:
    assert run_cli(["run", *SMALL, "--system", "basic", "--system", "dualpath", "--out", str(tmp_path / "a")])[0] == 0
    assert run_cli(["run", *SMALL, "--system", "dualpath", "--seeds", "2", "--out", str(tmp_path / "b"),
                    "--set", "workload.tool_wait.dist=constant", "--set", "workload.tool_wait.mean_s=1"])[0] == 0  # fmt: skip
    status, out, _ = run_cli(["compare", str(tmp_path / "a"), str(tmp_path / "b" / "summary.json")])
    assert status == 0
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("dualpath")]
    assert rows and all(row[-1] == "-" for row in rows), "one side has no interval: no overlap verdict"
    assert "basic" not in out.split("B vs A")[1], "only the systems both runs have"
    assert any("JCT" in line and "+" in line for line in out.splitlines()), "the waits lengthen the run"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run's output, for the tests below (compare only reads it)."""
    folder = tmp_path_factory.mktemp("good")
    assert run_cli(["run", *SMALL, "--system", "dualpath", "--out", str(folder)])[0] == 0
    return folder


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "no such file"),
        ("garbage", "not a readable summary.json"),
        ("no systems", "not a dualpath-emu summary"),
    ],
)
def test_compare_refuses_what_is_no_summary(good: Path, tmp_path: Path, setup: str, message: str) -> None:
    bad = tmp_path / "bad.json"
    if setup == "garbage":
        bad.write_text("{nope")
    elif setup == "no systems":
        bad.write_text("{}")
    status, _, err = run_cli(["compare", str(good), str(bad)])
    assert status == 2 and message in err and "Traceback" not in err
