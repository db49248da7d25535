"""``dualpath-emu sweep`` (issue 15): a grid run in local processes and on a Dask cluster of two workers that
the test starts, resumed through the run cache, and a cache that never unpickles or runs what it finds.

Every run is tiny (DS 27B 1P1D, a handful of agents, one or two rounds: tens of milliseconds), so the
cost is the processes: the Dask test's scheduler and workers take a few seconds to start.
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dualpath_emu.cli import main as cli_main
from dualpath_emu.reproduce.common import Cell, deployment, run_cells
from dualpath_emu.sweep import CSV_METRICS, parse_grid, split_values

SCENARIO = "ds27b-1p1d-offline"
GRID = ["--set", "workload.max_rounds=1,2", "--set", "workload.agents=4,8", "--systems", "basic,dualpath"]
"""2 × 2 points × 2 systems = 8 runs."""


def sweep(out: Path, *extra: str) -> list[str]:
    return ["sweep", SCENARIO, *GRID, "--out", str(out), *extra]


def deterministic(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of a sweep.json without what depends on the machine (wall time, who ran it)."""
    return [{**run, "summary": {k: v for k, v in run["summary"].items() if k != "wall_s"}, "ran_by": None}
            for run in document["runs"]]  # fmt: skip


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The grid, run once in two local processes (its own cache under out/cache)."""
    out = tmp_path_factory.mktemp("local")
    assert cli_main(sweep(out, "--jobs", "2", "--quiet")) == 0
    return out


def test_values_split_at_top_level_commas_only() -> None:
    assert split_values("1,2, 3") == ["1", "2", "3"]
    assert split_values("[1,2],[3],\"a,b\",'c,d',{x = 1, y = 2}") == [
        "[1,2]",
        "[3]",
        '"a,b"',
        "'c,d'",
        "{x = 1, y = 2}",
    ]
    assert split_values('"a\\",b",c') == ['"a\\",b"', "c"]
    grid = parse_grid(["workload.agents=4,8", 'systems=["basic"],["basic","oracle"]', "workload.mode=online"])
    assert grid == {"workload.agents": [4, 8], "systems": [["basic"], ["basic", "oracle"]], "workload.mode": ["online"]}


@pytest.mark.processes
def test_a_grid_runs_in_local_processes_and_writes_csv_json_and_png(
    local_sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = (local_sweep / "sweep.csv").read_text().splitlines()
    header, rows = lines[0].split(","), [line.split(",") for line in lines[1:]]
    assert header == ["workload.max_rounds", "workload.agents", "system", *CSV_METRICS]
    assert len(rows) == 8
    by_run = {(r[0], r[1], r[2]): dict(zip(header, r)) for r in rows}
    assert set(by_run) == {(m, a, s) for m in "12" for a in "48" for s in ("basic", "dualpath")}
    for (rounds, agents, _), row in by_run.items():  # each point ran its own settings
        assert int(row["turns"]) == int(rounds) * int(agents) and int(row["agents"]) == int(agents)
    assert float(by_run["2", "8", "basic"]["jct_s"]) > float(by_run["1", "8", "basic"]["jct_s"])  # a second round
    assert by_run["1", "8", "basic"]["jct_s"] != by_run["1", "8", "dualpath"]["jct_s"]
    document = json.loads((local_sweep / "sweep.json").read_text())
    assert document["scenario"] == SCENARIO and document["grid"] == {"workload.max_rounds": [1, 2],
                                                                      "workload.agents": [4, 8]}  # fmt: skip
    assert [run["point"] for run in document["runs"][:2]] == [{"workload.max_rounds": 1, "workload.agents": 4}] * 2
    assert all(run["ran_by"].startswith("pid ") for run in document["runs"])
    assert len({run["ran_by"] for run in document["runs"]}) == 2  # --jobs 2: two processes
    png = (local_sweep / "sweep.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert len(list((local_sweep / "cache").glob("*.json"))) == 8


@pytest.mark.processes
def test_the_same_command_again_reuses_every_run(
    local_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "again"
    shutil.copytree(local_sweep, out)
    before = (out / "sweep.json").read_text()
    (out / "sweep.json").unlink()
    assert cli_main(sweep(out, "--jobs", "2")) == 0
    captured = capsys.readouterr()
    assert "8 of 8 run(s) reused from the cache" in captured.out
    assert captured.err.count("from the cache") == 8  # every progress line
    assert "workload.max_rounds" in captured.out and "dualpath" in captured.out  # the table
    assert (out / "sweep.json").read_text() == before  # identical, wall times and all


@pytest.mark.processes
def test_a_hostile_cache_file_is_never_unpickled_or_run(
    local_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "hostile"
    shutil.copytree(local_sweep, out)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple[Any, tuple[str]]:
            return os.system, (f"touch {shlex.quote(str(marker))}",)

    payload = pickle.dumps(Payload())
    files = sorted((out / "cache").glob("*.json"))
    pickle.loads(payload)  # the payload works: unpickling it makes the marker
    assert marker.exists()
    marker.unlink()
    files[0].write_bytes(payload)  # in place of a result
    files[0].with_suffix(".pickle").write_bytes(payload)  # and where the old pickle cache kept it
    files[1].write_bytes(b"\x00\xffnot json")
    changes: list[dict[str, Any]] = [{"key": "0" * 64}, {"result": {"summary": [], "ran_by": 1}}, {"format": 0}]
    for path, change in zip(files[2:5], changes):
        path.write_text(json.dumps({**json.loads(path.read_text()), **change}))  # another run's, wrong shape, old
    assert cli_main(sweep(out, "--jobs", "1", "--json")) == 0
    captured = capsys.readouterr()
    assert not marker.exists()
    assert deterministic(json.loads(captured.out)) == deterministic(
        json.loads((local_sweep / "sweep.json").read_text())
    )
    for path, problem in zip(files, ("not a readable JSON file", "not a readable JSON file", "another run's key",
                                     "a result of the wrong shape", "not a cache file of format 1")):  # fmt: skip
        assert f"warning: ignoring the cache file {path} ({problem}" in captured.err, captured.err
        assert json.loads(path.read_text())["format"] == 1  # recomputed and rewritten as an ordinary cache file
    assert "3 of 8 run(s) reused" in captured.err


@pytest.mark.processes
def test_a_run_on_a_dask_cluster_of_two_workers_equals_the_local_one(
    local_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    distributed = pytest.importorskip("distributed", reason="Dask's distributed package is not installed")
    scheduler_file = tmp_path / "scheduler.json"
    common = ["--no-dashboard"]
    processes = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                   "--port", "0", "--scheduler-file", str(scheduler_file), *common],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            assert time.monotonic() < deadline and processes[0].poll() is None, "the scheduler did not start"
            time.sleep(0.1)
        for name in ("w1", "w2"):
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(scheduler_file),
                 "--nthreads", "1", "--nworkers", "1", "--name", name, *common],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip
        with distributed.Client(scheduler_file=str(scheduler_file), set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            address = client.scheduler.address
            workers = set(client.scheduler_info()["workers"])
        out = tmp_path / "dask"
        assert cli_main(sweep(out, "--dask", address, "--json", "--quiet")) == 0
        document = json.loads(capsys.readouterr().out)
        # reproduce's cells take the same road
        cell = Cell({"fig": 7}, deployment("ds27b", quick=True, agents=4), "oracle", max_rounds=1)
        (remote,) = run_cells([cell], quiet=True, dask=address, cache=tmp_path / "cells")
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert deterministic(document) == deterministic(json.loads((local_sweep / "sweep.json").read_text()))
    ran_by = {run["ran_by"] for run in document["runs"]}
    assert ran_by == {f"dask {worker}" for worker in workers} and len(ran_by) == 2  # both workers ran some
    (local,) = run_cells([cell], quiet=True)
    assert remote.cell == cell and remote.summary["event_log_sha256"] == local.summary["event_log_sha256"]
    assert remote.attention_balance == local.attention_balance and len(list((tmp_path / "cells").glob("*.json"))) == 1


def test_dask_without_distributed_is_a_one_line_usage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed → ImportError
    for argv in (sweep(tmp_path / "out", "--dask", "tcp://127.0.0.1:8786"),
                 ["reproduce", "fig7", "--quick", "--dask", "tcp://127.0.0.1:8786"]):  # fmt: skip
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "--dask needs Dask's distributed package" in err and "pip install 'dualpath-emu[dask]'" in err
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--set", "workload.max_rounds="], "expected one or more comma-separated values"),
        (["--set", "workload.max_rounds=1,,2"], "expected one or more comma-separated values"),
        (["--set", "workload.agents=4", "--set", "workload.agents=8"], "--set workload.agents: given twice"),
        (["--set", "workload.max_rounds=1", "--systems", "basic,nosuch"], "got 'nosuch'"),
        (["--set", "workload.max_rounds=1,lots"], "sweep point workload.max_rounds=lots: "),
        (["--set", "workload.max_rounds=1", "--set", "workload.agnets=4,8"], "--set workload.agnets: no such key"),
        (["--set", "workload.max_rounds=1", "--dask", "udp://127.0.0.1:1"], "expected a Dask scheduler's address"),
        (["--set", "workload.max_rounds=1", "--jobs", "0"], "--jobs: expected an integer in [1, 256]"),
    ],
)
def test_a_bad_grid_is_one_line_before_anything_runs(
    options: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["sweep", SCENARIO, *options, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dualpath-emu: error: ") and err.count("\n") == 1 and expected in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.processes
def test_a_scenario_file_of_ones_own_a_categorical_axis_and_one_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No swept key but a string one: a scenario file of the user's (given by a relative path) and a
    categorical plot; the cache is another folder."""
    (tmp_path / "mine.toml").write_text('kind = "cluster"\nsystems = ["oracle"]\n[deployment]\nmodel = "ds27b"\n'
                                        'pe_nodes = 1\nde_nodes = 1\nprefill_ep_nodes = 1\ndecode_ep_nodes = 1\n'
                                        '[workload]\nagents = 4\nmax_rounds = 1\n')  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert (
        cli_main(["sweep", "mine.toml", "--set", "hardware.gpu=h800,h20", "--out", "out", "--cache", "c", "--quiet"])
        == 0
    )
    rows = (tmp_path / "out" / "sweep.csv").read_text().splitlines()
    assert [r.split(",")[:2] for r in rows] == [["hardware.gpu", "system"], ["h800", "oracle"], ["h20", "oracle"]]
    assert len(list((tmp_path / "c").glob("*.json"))) == 2 and (tmp_path / "out" / "sweep.png").exists()
    capsys.readouterr()
    assert cli_main(["sweep", "mine.toml", "--out", "one", "--cache", "c", "--systems", "oracle"]) == 0
    assert len((tmp_path / "one" / "sweep.csv").read_text().splitlines()) == 2  # a sweep of one point
    assert "1 of 1 run(s) reused" in capsys.readouterr().out  # h800 is the file's own GPU: the same run
