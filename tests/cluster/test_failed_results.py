"""A run whose requests failed is never shown as a whole result (issue 34): its failures are in the summary,
the table, requests.csv, the replicates and the sweeps; no speedup is computed against it; a warning says so
and the command exits with status 3.

The cases are small DS 27B 1P1D runs in which storage NICs die for good: Basic reads every hit through the
prefill node's storage NIC, so with that NIC dead (read timeout 1 s, 3 redispatches) each agent's first turn
with a hit fails and its agent stops; DualPath reads on the decode side and finishes everything; with both
storage NICs dead every system that reads fails.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from dualpath_emu import api
from dualpath_emu.cli import main
from dualpath_emu.cluster.run_cli import EXIT_INCOMPLETE

PE_NIC_DEAD = ['faults=[{kind="down",target="n0.snic",at_s=0.0}]']
BOTH_NICS_DEAD = ['faults=[{kind="down",target="n0.snic",at_s=0.0},{kind="down",target="n1.snic",at_s=0.0}]']
SMALL = ["workload.max_rounds=3", "scheduling.read_timeout_s=1.0"]


def _overrides(settings: list[str]) -> dict[str, object]:
    from dualpath_emu.cluster.run_cli import parse_settings

    return parse_settings([*SMALL, *settings])


def _run(settings: list[str], systems: list[str], agents: int = 4, seed: int = 0) -> api.RunResult:
    scenario = api.load_scenario("ds27b-1p1d-offline", agents=agents, seed=seed, overrides=_overrides(settings))
    return api.run(scenario, systems=systems)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _sets(settings: list[str]) -> list[str]:
    return [arg for setting in [*SMALL, *settings] for arg in ("--set", setting)]


def test_a_system_that_failed_its_agents_is_not_a_result_nor_faster() -> None:
    result = _run(PE_NIC_DEAD, ["basic", "dualpath", "oracle"])
    basic, dualpath = result.results["basic"], result.results["dualpath"]
    assert not basic.complete and basic.failed_requests == basic.failed_agents == 4
    # Every planned turn is accounted for: finished, failed, or never submitted (its agent had failed).
    assert basic.turns_planned == 12 and basic.turns_done + basic.failed_requests + basic.turns_not_run == 12
    assert basic.turns_done < 12 and basic.turns_not_run > 0
    assert dualpath.complete and result.results["oracle"].complete
    # The JCT runs to the last failure: a run that gave up did not end before it did.
    last_failure_s = max(t for t in basic.metrics.failed_ns if t >= 0) / 1e9
    assert basic.jct_s >= last_failure_s - min(basic.metrics.arrive_ns) / 1e9
    summary = result.summary
    assert summary["complete"] is False
    assert summary["systems"]["basic"]["complete"] is False and summary["systems"]["dualpath"]["complete"] is True
    assert "basic failed 4 request(s) of 4 agent(s)" in summary["systems"]["basic"]["incomplete"]
    # No speedup against a run that did not finish the work, and the reason instead.
    assert summary["speedup_vs_basic"] == {"basic": None, "dualpath": None, "oracle": None}
    assert set(summary["no_speedup_vs_basic"]) == {"basic", "dualpath", "oracle"}
    assert all("basic failed" in why for why in summary["no_speedup_vs_basic"].values())
    assert result.speedup() == {"basic": None, "dualpath": None, "oracle": None}
    assert not result.complete and set(result.incomplete) == {"basic"}
    rows = [row for row in result.rows() if row["system"] == "basic"]
    assert sum(row["failed_s"] is not None for row in rows) == 4
    assert all(row["done_s"] is None for row in rows if row["failed_s"] is not None)
    assert all(row["redispatches"] == 3 for row in rows if row["failed_s"] is not None)


def test_a_complete_run_keeps_its_speedups_and_says_it_is_complete() -> None:
    result = _run([], ["basic", "dualpath"])
    assert result.complete and result.incomplete == {}
    assert result.summary["no_speedup_vs_basic"] == {}
    ratio = result.speedup()["dualpath"]
    assert ratio is not None and ratio == pytest.approx(result.summary["speedup_vs_basic"]["dualpath"])
    figures = result.summary["systems"]["dualpath"]
    assert figures["turns_done"] == figures["turns_planned"] == figures["turns"] == 12
    assert (figures["failed_requests"], figures["failed_agents"], figures["turns_not_run"]) == (0, 0, 0)


def test_the_table_shows_failures_warns_and_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = _cli(["run", "ds27b-1p1d-offline", "--agents", "4", *_sets(PE_NIC_DEAD)], capsys)
    assert status == EXIT_INCOMPLETE == 3
    assert "failed" in out and "req/agt" in out
    basic_row = next(line for line in out.splitlines() if line.startswith("basic "))
    dualpath_row = next(line for line in out.splitlines() if line.startswith("dualpath "))
    assert "*" in basic_row and "4/4" in basic_row and "×" not in basic_row
    assert "×" not in dualpath_row  # no speedup over a Basic that did not finish
    assert "* requests failed" in out
    assert err.count("warning") == 1 and "basic failed 4 request(s)" in err


def test_json_output_stays_json_and_the_exit_status_still_says_it(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = _cli(["run", "ds27b-1p1d-offline", "--agents", "4", "--json", *_sets(PE_NIC_DEAD)], capsys)
    assert status == 3
    document = json.loads(out)
    assert document["complete"] is False and document["systems"]["basic"]["failed_requests"] == 4
    assert "warning" in err


def test_when_every_system_fails_nothing_reads_as_a_result(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "ds27b-1p1d-offline", "--agents", "4", "--system", "basic", "--system", "dualpath",
            *_sets(BOTH_NICS_DEAD)]  # fmt: skip
    status, out, err = _cli(argv, capsys)
    assert status == 3 and err.count("warning") == 2
    for name in ("basic", "dualpath"):
        row = next(line for line in out.splitlines() if line.startswith(f"{name} "))
        jct = row.split()[1]
        assert jct.endswith("*") and float(jct.rstrip("*")) > 0  # how long it ran, marked, never 0.0
        assert "×" not in row


def test_random_faults_that_fail_requests_give_no_speedup() -> None:
    # Engine crashes at random with no redispatch allowed: every request a crash catches fails.
    crashes = ["random_faults.crash_per_node_hour=3600.0", "random_faults.restart_s=1.0",
               "scheduling.max_redispatches=0"]  # fmt: skip
    result = _run(crashes, ["basic", "dualpath"], agents=8)
    failed = {name: r.failed_requests for name, r in result.results.items()}
    assert any(failed.values()), failed
    for name, ratio in result.speedup().items():
        assert ratio is None, (name, ratio)
    assert set(result.summary["no_speedup_vs_basic"]) == {"basic", "dualpath"}


def test_replicates_pair_a_speedup_only_where_every_seed_finished(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "ds27b-1p1d-offline", "--agents", "4", "--seeds", "2", "--json", *_sets(PE_NIC_DEAD)]
    status, out, err = _cli(argv, capsys)
    assert status == 3 and err.count("warning") == 2 and "seed 0: basic failed" in err
    replicates = json.loads(out)["replicates"]
    assert replicates["speedup_vs_basic"]["dualpath"] is None
    assert replicates["no_speedup_vs_basic"]["dualpath"].startswith("seed 0: basic failed")
    assert replicates["incomplete_seeds"] == {"basic": [0, 1]}
    assert replicates["systems"]["basic"]["failed_requests"]["mean"] == 4.0
    status, out, _ = _cli(argv[: -len(_sets(PE_NIC_DEAD)) - 1] + _sets(PE_NIC_DEAD), capsys)  # the table
    assert status == 3
    assert next(line for line in out.splitlines() if line.strip().startswith("basic")).count("*") == 1


def test_requests_csv_and_compare_name_the_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    failed, plain = tmp_path / "failed", tmp_path / "plain"
    assert main(["run", "ds27b-1p1d-offline", "--agents", "4", "--quiet", "--out", str(failed),
                 "--system", "basic", *_sets(PE_NIC_DEAD)]) == 3  # fmt: skip
    assert main(["run", "ds27b-1p1d-offline", "--agents", "4", "--quiet", "--out", str(plain),
                 "--system", "basic", *_sets([])]) == 0  # fmt: skip
    rows = list(csv.DictReader(io.StringIO((failed / "requests.csv").read_text())))
    assert sum(row["failed_s"] != "" for row in rows) == 4
    capsys.readouterr()
    assert main(["compare", str(plain), str(failed)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "finished every turn" in line)
    assert row.split()[-4:-2] == ["yes", "no"]
    assert "failed requests" in out


def test_a_sweep_marks_the_points_that_failed_and_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", "ds27b-1p1d-offline", "--agents", "4", "--jobs", "1", "--out", str(tmp_path / "out"),
            "--system", "basic", "--system", "dualpath", "--set", "scheduling.read_timeout_s=1.0,2.0",
            "--set", "workload.max_rounds=3", "--set", PE_NIC_DEAD[0]]  # fmt: skip
    status, out, err = _cli(argv, capsys)
    assert status == 3 and err.count("warning: ") == 2 and "scheduling.read_timeout_s=1.0" in err
    rows = list(csv.DictReader(io.StringIO((tmp_path / "out" / "sweep.csv").read_text())))
    assert sorted((row["system"], row["complete"], row["failed_requests"]) for row in rows) == [
        ("basic", "False", "4"), ("basic", "False", "4"), ("dualpath", "True", "0"), ("dualpath", "True", "0")
    ]  # fmt: skip
    table = [line for line in out.splitlines() if line.split()[1:2] in (["basic"], ["dualpath"])]
    assert len(table) == 4 and all("×" not in line for line in table)  # no point has a Basic that finished
    assert all(("*" in line) == ("basic" in line) for line in table)
