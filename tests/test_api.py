"""The Python API (dualpath_emu.api): loading scenarios with overrides, running systems (built-in, from a
file, or a System object), and the result: the summary of `run --json`, typed rows of requests.csv, and a
DataFrame when pandas is installed."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import dualpath_emu
from dualpath_emu import api
from dualpath_emu.cli import main
from dualpath_emu.cluster.scenario import DEFAULT
from dualpath_emu.config import ScenarioError

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_SPEC = f"{REPO / 'python' / 'dualpath_emu' / 'examples' / 'custom_policy.py'}:least-loaded"
SMALL = {"workload.dataset": "32k", "workload.agents": 8, "workload.max_rounds": 6, "seed": 3}
"""ds27b-1p1d-offline cut to a run of well under a second per system."""


@pytest.fixture(scope="module")
def result() -> api.RunResult:
    scenario = api.load_scenario("ds27b-1p1d-offline", overrides=SMALL, systems=["basic", "dualpath", EXAMPLE_SPEC])
    return api.run(scenario)


def without_wall(summary: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(summary))
    for system in out["systems"].values():
        del system["wall_s"]
    return out


# --------------------------------------------------------------------------------------------- scenarios


def test_load_by_name_path_or_default(tmp_path: Path) -> None:
    by_name = api.load_scenario("ds27b-1p1d-offline")
    assert by_name.name == "ds27b-1p1d-offline" and by_name.config.model.name == "ds27b"
    by_path = api.load_scenario(Path(by_name.source))
    assert by_path == by_name
    assert api.load_scenario() == DEFAULT
    assert "ds27b-1p1d-offline" in api.scenario_names() and "pipeline" not in api.scenario_names()


def test_overrides_set_any_key_and_are_checked_like_the_file() -> None:
    scenario = api.load_scenario(
        "ds27b-1p1d-offline", overrides={"deployment.pe_nodes": 2, "scheduling.alpha_read_s": 2.0,
                                         "workload.mode": "online"}, agents=4, seed=7)  # fmt: skip
    assert (scenario.config.pe_nodes, scenario.config.alpha_read_s, scenario.config.mode) == (2, 2.0, "online")
    assert (scenario.config.agents, scenario.seed) == (4, 7)
    default = api.load_scenario(overrides={"workload.agents": 3})  # the built-in default's file
    assert default.config.agents == 3 and default.name == DEFAULT.name
    source = api.load_scenario("ds27b-1p1d-offline").source
    with pytest.raises(ScenarioError) as error:
        api.load_scenario("ds27b-1p1d-offline", overrides={"deployment.pe_nodes": 0})
    assert str(error.value) == "override 'deployment.pe_nodes': expected an integer in [1, 255], got 0", source
    with pytest.raises(ScenarioError) as error:
        api.load_scenario("ds27b-1p1d-offline", overrides={"deployment.pe_nodez": 2})
    assert str(error.value).startswith("override 'deployment.pe_nodez': no such key (known keys here: ")
    with pytest.raises(ScenarioError) as error:
        api.load_scenario("ds27b-1p1d-offline", overrides={"kind.x": 1})
    assert str(error.value) == "override 'kind.x': key 'kind' is no table"
    with pytest.raises(ScenarioError) as error:
        api.load_scenario("no-such-scenario")
    assert str(error.value).startswith(
        "no-such-scenario: no such file, and no packaged scenario of that name (packaged: ds27b-1p1d-offline, "
    )


# --------------------------------------------------------------------------------------------- results


def test_the_summary_is_what_run_json_prints(result: api.RunResult, monkeypatch: pytest.MonkeyPatch) -> None:
    assert result.systems == ["basic", "dualpath", "least-loaded"]
    argv = ["run", "ds27b-1p1d-offline", "--json", "--system", "basic", "--system", "dualpath", "--system",
            EXAMPLE_SPEC, *(f"--set={key}={value}" for key, value in SMALL.items())]  # fmt: skip
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    assert without_wall(json.loads(stdout.getvalue())) == without_wall(result.summary)
    assert result.jct_s == {name: s["jct_s"] for name, s in result.summary["systems"].items()}
    assert result.speedup()["dualpath"] == pytest.approx(result.summary["speedup_vs_basic"]["dualpath"])
    assert result.speedup("dualpath")["dualpath"] == 1.0
    with pytest.raises(KeyError, match="no system 'oracle' in this run"):
        result.speedup("oracle")


def test_rows_are_requests_csv_typed(result: api.RunResult, tmp_path: Path) -> None:
    rows = result.rows()
    turns = {name: r.turns for name, r in result.results.items()}
    assert len(rows) == sum(turns.values())
    assert {name: sum(1 for row in rows if row["system"] == name) for name in turns} == turns
    first = rows[0]
    assert isinstance(first["rid"], int) and isinstance(first["arrive_s"], float) and first["read_side"] in {
        "pe", "de", "none"}  # fmt: skip
    assert all(isinstance(row["done_s"], float) and row["done_s"] >= row["arrive_s"] for row in rows)  # type: ignore[operator]
    assert {row["read_side"] for row in rows if row["system"] == "basic"} <= {"pe", "none"}
    text = result.requests_csv()
    assert text.splitlines()[0].split(",")[0] == "system" and len(text.splitlines()) == len(rows) + 1


def test_out_writes_what_the_command_line_writes(tmp_path: Path) -> None:
    scenario = api.load_scenario("ds27b-1p1d-offline", overrides=SMALL, systems=["dualpath"])
    done = api.run(scenario, out=tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"summary.json", "requests.csv", "jct.png", "utilisation.png",
                                                   "latency-cdf.png"}, "no trace unless asked for"  # fmt: skip
    assert json.loads((tmp_path / "summary.json").read_text()) == done.summary
    assert (tmp_path / "requests.csv").read_text() == done.requests_csv()
    traced = api.run(scenario, out=tmp_path / "traced", trace=True)
    assert (tmp_path / "traced" / "trace-dualpath.json.gz").exists()
    assert traced.summary["systems"]["dualpath"]["jct_s"] == done.summary["systems"]["dualpath"]["jct_s"]
    with pytest.raises(ValueError, match="give out=DIR"):
        api.run(scenario, trace=True)


def test_a_system_object_from_the_notebook() -> None:
    @dataclass
    class FirstPE(api.DualPathPolicy):
        """Every request to the first PE."""

        def assign_prefill(self, view: api.PrefillView) -> list[api.PrefillAssignment]:
            engine = min(e.id for e in view.engines)
            return [api.PrefillAssignment(request, engine) for request in view.queue]

    mine = api.System("first-pe", "every request to PE 0", layerwise=True, dual_path=True, scheduler=FirstPE)
    done = api.run(
        "ds27b-1p1d-offline", systems=[mine, "dualpath"], agents=4, seed=1
    )  # the whole trajectories of 4 agents
    assert done.systems == ["first-pe", "dualpath"]
    assert {row["pe"] for row in done.rows() if row["system"] == "first-pe"} == {0}
    with pytest.raises(ScenarioError, match="'basic', a built-in system's name"):
        api.run(
            "ds27b-1p1d-offline", systems=[api.System("basic", "", layerwise=True, dual_path=True, scheduler=FirstPE)]
        )
    with pytest.raises(ScenarioError, match="expected each system once: 'first-pe'"):
        api.load_scenario("ds27b-1p1d-offline", systems=[mine, mine])


def test_runs_repeat_exactly(result: api.RunResult) -> None:
    again = api.run(result.scenario)
    assert {n: r.event_log_sha256 for n, r in again.results.items()} == {
        n: r.event_log_sha256 for n, r in result.results.items()
    }
    assert again.rows() == result.rows()


# --------------------------------------------------------------------------------------------- pandas


def test_to_pandas(result: api.RunResult) -> None:
    pandas = pytest.importorskip("pandas")
    frame = result.to_pandas()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.columns) == list(result.rows()[0]) and len(frame) == len(result.rows())
    assert frame.groupby("system").size().to_dict() == {n: r.turns for n, r in result.results.items()}
    assert frame["done_s"].max() == pytest.approx(max(result.jct_s.values()))


def test_to_pandas_without_pandas_says_what_to_do(result: api.RunResult, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # what an interpreter without pandas sees
    with pytest.raises(
        ModuleNotFoundError, match=r"needs pandas, which dualpath-emu does not install: pip install pandas"
    ):
        result.to_pandas()
    assert len(result.rows()) > 0  # the rows need no pandas


# --------------------------------------------------------------------------------------------- the package


@pytest.mark.processes
def test_the_package_re_exports_the_api_lazily() -> None:
    assert dualpath_emu.run is api.run and dualpath_emu.load_scenario is api.load_scenario
    assert dualpath_emu.System is api.System
    code = "import sys, dualpath_emu; assert 'dualpath_emu.api' not in sys.modules; dualpath_emu.run; " \
           "assert 'dualpath_emu.api' in sys.modules"  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        dualpath_emu.nothing  # type: ignore[attr-defined]  # noqa: B018


# --------------------------------------------------------------------------------------------- the README


def _readme_block(heading: str) -> str:
    """The first ```python block of the README's section ``heading``."""
    text = (REPO / "README.md").read_text()
    section = text[text.index(f"\n## {heading}\n") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```", start)]


def test_the_readme_python_api_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pandas")
    monkeypatch.chdir(REPO)
    namespace: dict[str, Any] = {}
    exec(compile(_readme_block("Python API"), "README.md", "exec"), namespace)
    result: api.RunResult = namespace["result"]
    assert result.systems == ["basic", "dualpath", "least-loaded"]
    assert set(namespace["frame"]["system"]) == {"basic", "dualpath", "least-loaded"}


def test_the_readme_policy_example_is_the_example_file(tmp_path: Path) -> None:
    (tmp_path / "readme_policy.py").write_text(_readme_block("Write your own policy"), encoding="utf-8")
    # The README's scenario, smaller: the policy visibly differs from DualPath's (its reads stay on the PE side).
    scenario = api.load_scenario("ds660b-2p4d-offline", agents=48, overrides={"workload.max_rounds": 6})
    readme = api.run(scenario, systems=[f"{tmp_path / 'readme_policy.py'}:least-loaded"])
    example = api.run(scenario, systems=[EXAMPLE_SPEC, "dualpath"])
    mine, dualpath = example.results["least-loaded"], example.results["dualpath"]
    assert readme.results["least-loaded"].event_log_sha256 == mine.event_log_sha256
    assert mine.event_log_sha256 != dualpath.event_log_sha256
    assert mine.snic_read_bytes["de"] < 0.5 * mine.snic_read_bytes["pe"]
    assert dualpath.snic_read_bytes["de"] > dualpath.snic_read_bytes["pe"]
