"""The ``--quick`` variants of ``dualpath-emu reproduce`` (issue 5): each runs end to end, writes its CSV,
PNG and JSON, and the orderings the paper's results rest on hold on the storage-bound miniature (Oracle ≤
DualPath ≤ Basic, Basic's decode-node storage NICs idle, the ablation ladder monotone, round robin less
balanced than DualPath's scheduler). The experiments
that are not cluster runs (``table1``, ``isolation``, ``fig10``) have their own tests.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from dualpath_emu.cli import main as cli_main
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.reproduce import EXPERIMENTS
from dualpath_emu.reproduce.common import Cell, deployment, run_cells, run_parallel

QUICK = (
    "fig7",
    "fig8",
    "fig9",
    "fig12",
    "fig13",
    "toolwaits",
    "kvstore",
    "sglmc",
    "retention",
    "faults",
    "network",
    "split",
)


def run_quick(name: str, out: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    module = importlib.import_module(EXPERIMENTS[name])
    assert module.main(["--quick", "--json", "--jobs", "2", "--out", str(out)]) == 0
    report: dict[str, object] = json.loads(capsys.readouterr().out)
    return report


@pytest.mark.processes
@pytest.mark.parametrize("name", QUICK)
def test_quick_variant_runs_writes_its_files_and_keeps_the_orderings(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = run_quick(name, tmp_path, capsys)
    assert report["experiment"] == name
    for suffix in ("csv", "png", "json"):
        assert (tmp_path / f"{name}.{suffix}").stat().st_size > 0
    assert report["rows"], "no rows"
    checks = report["checks"]
    assert isinstance(checks, dict) and checks
    failed = [check for check, ok in checks.items() if not ok]
    assert not failed, f"{name}: {failed}"
    for c in report["comparisons"]:  # type: ignore[attr-defined]
        assert c["emulator"] == c["emulator"] and c["paper"] > 0  # no NaN, a paper value to compare with


def test_reproduce_lists_every_experiment_and_passes_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(EXPERIMENTS) >= {"table1", "fig7", "fig8", "fig9", "fig10", "fig12", "fig13", "isolation", "calibrate"}
    assert cli_main(["reproduce", "fig7", "--jobs", "0"]) == 2
    assert "--jobs: expected an integer in [1, 256]" in capsys.readouterr().err


@pytest.mark.processes
def test_calibrate_quick_converges_and_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    from dualpath_emu.reproduce.calibrate import CALIBRATION_FILE

    before = CALIBRATION_FILE.read_bytes() if CALIBRATION_FILE.exists() else None
    assert cli_main(["calibrate", "--quick", "--json", "--jobs", "2", "--write"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["checks"] == {"every fit converged": True}
    assert {row["parameter"] for row in report["rows"]} == {"prefill_speed+overhead", "snic_bytes_per_s"}
    after = CALIBRATION_FILE.read_bytes() if CALIBRATION_FILE.exists() else None
    assert after == before, "--quick must never overwrite the calibration"


_calls: list[str] = []


def _counting_worker(cell: Cell) -> dict[str, object]:
    _calls.append(cell.system)
    return {"system": cell.system, "agents": cell.config.agents}


def test_cache_reuses_a_run_under_other_labels_and_never_across_different_runs(tmp_path: Path) -> None:
    config = deployment("ds27b", quick=True, agents=4)
    first = [Cell({"fig": 7}, config, "basic"), Cell({"fig": 7}, config, "dualpath")]
    _calls.clear()
    assert run_parallel(_counting_worker, first, cache=tmp_path) == [
        {"system": "basic", "agents": 4},
        {"system": "dualpath", "agents": 4},
    ]
    assert _calls == ["basic", "dualpath"] and len(list(tmp_path.glob("*.json"))) == 2
    # The same runs under another experiment's labels come from the cache; a different run does not.
    again = [Cell({"part": "ablation"}, config, "dualpath"), Cell({}, replace(config, agents=5), "dualpath"),
             Cell({}, config, "dualpath", seed=1)]  # fmt: skip
    _calls.clear()
    results = run_parallel(_counting_worker, again, cache=tmp_path)
    assert _calls == ["dualpath", "dualpath"]  # agents=5 and seed=1 ran; the relabelled one did not
    assert results[0] == {"system": "dualpath", "agents": 4} and results[1]["agents"] == 5
    _calls.clear()
    run_parallel(_counting_worker, first)  # no cache: always runs
    assert _calls == ["basic", "dualpath"]


def test_run_cells_gives_a_cached_result_the_asking_cells_labels(tmp_path: Path) -> None:
    config = deployment("ds27b", quick=True, agents=4)
    (fresh,) = run_cells([Cell({"fig": 7}, config, "oracle", max_rounds=2)], quiet=True, cache=tmp_path)
    (cached,) = run_cells([Cell({"fig": 12}, config, "oracle", max_rounds=2)], quiet=True, cache=tmp_path)
    assert cached.summary == fresh.summary and cached.cell.labels == {"fig": 12}
    assert cached == replace(fresh, cell=cached.cell)  # every figure as computed: the balance's tuples too
    assert isinstance(cached.attention_balance[0], tuple)
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]  # JSON data, no pickle
    assert record["format"] == 1 and record["worker"] == "dualpath_emu.reproduce.common.run_cell"
    assert "cell" not in record["result"] and record["result"]["summary"]["jct_s"] == fresh.jct_s


def test_markdown_renders_a_report_and_rejects_what_is_not_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dualpath_emu.reproduce.markdown import main as markdown_main

    report = {
        "experiment": "fig7", "title": "offline JCT", "wall_s": 90.0, "rows": [],
        "comparisons": [
            {"what": "best speedup", "paper": 1.87, "emulator": 1.5, "target": "±10%", "met": False, "ratio": 0.802},
            {"what": "JCT (s)", "paper": 5400.0, "emulator": 5202.4, "target": "context", "met": None, "ratio": 0.963},
        ],
        "checks": {"oracle <= dualpath <= basic": True}, "notes": ["a note"],
    }  # fmt: skip
    path = tmp_path / "fig7_ds660b.json"
    path.write_text(json.dumps(report))
    (tmp_path / "fig7_ds660b.png").write_bytes(b"png")
    assert markdown_main([str(path), "--image-dir", "docs/evaluation"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### fig7: offline JCT\n") and "![fig7](docs/evaluation/fig7_ds660b.png)" in out
    assert "| best speedup | 1.87 | 1.5 | 0.80 | ±10% | **no** |" in out
    assert "| JCT (s) | 5,400 | 5,202 | 0.96 | context | – |" in out
    assert "- check: oracle <= dualpath <= basic: ok" in out and "- a note" in out and "1.5 min" in out
    # fig7's rows: the model in the heading, every JCT in a table (DualPath's ratios to Basic and Oracle).
    row = {"model": "qwen32b", "dataset": "32k", "agents": 512}
    report["rows"] = [
        {**row, "system": s, "jct_s": jct} for s, jct in (("basic", 3000.0), ("dualpath", 2000.0), ("oracle", 1600.0))
    ]
    path.write_text(json.dumps(report))
    assert markdown_main([str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### fig7 (qwen32b): offline JCT\n")
    assert "| 32k | 512 | 3,000 | 2,000 | 1,600 | 1.50× | 1.25 |" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert markdown_main([str(bad)]) == 2
    assert "bad.json: not a report" in capsys.readouterr().err


def test_markdown_into_replaces_only_the_marked_part(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dualpath_emu.reproduce.markdown import BEGIN, END
    from dualpath_emu.reproduce.markdown import main as markdown_main

    report = tmp_path / "fig13.json"
    report.write_text(json.dumps({"experiment": "fig13", "title": "balance", "wall_s": 6.0, "comparisons": []}))
    doc = tmp_path / "EVALUATION.md"
    doc.write_text(f"# Evaluation\nprose\n{BEGIN}\nold tables\n{END}\nmore prose\n")
    assert markdown_main([str(report), "--into", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith(f"# Evaluation\nprose\n{BEGIN}\n\n### fig13: balance\n") and text.endswith(
        f"{END}\nmore prose\n"
    )
    assert "old tables" not in text
    assert markdown_main([str(report), "--into", str(doc)]) == 0 and doc.read_text() == text  # idempotent
    (tmp_path / "plain.md").write_text("no markers\n")
    assert markdown_main([str(report), "--into", str(tmp_path / "plain.md")]) == 2
    assert "expected a line <!-- reproduce:begin -->" in capsys.readouterr().err


def test_a_fit_brackets_a_parameter_that_binds_only_past_a_knee(monkeypatch: pytest.MonkeyPatch) -> None:
    """Like Basic against its storage-NIC rate: flat near the start (another bottleneck binds), then ∝ 1/x.
    Fixed-point steps alone stall on the flat part; the fit must find the knee's far side."""
    import argparse

    from dualpath_emu.reproduce import calibrate

    knee = 30.0

    def jct(x: float) -> float:
        return 2720.0 * max(1.0, knee / x)

    class Fake:
        def __init__(self, x: float) -> None:
            self.jct_s = jct(x)

    def fake_run_cells(cells: list[Cell], jobs: int, **_: object) -> list[Fake]:
        return [Fake(cell.labels["value"]) for cell in cells]

    monkeypatch.setattr(calibrate, "run_cells", fake_run_cells)
    history: list[dict[str, object]] = []
    config = deployment("ds27b", quick=True, agents=4)
    x, fitted_jct = calibrate._fit("rate", "basic", 2900.0, 50.0, (50.0 / 16, 50.0), lambda _: config, 0,
                                   argparse.Namespace(quiet=True, cache=None, dask=None), history)  # fmt: skip
    assert abs(fitted_jct / 2900.0 - 1) <= calibrate.TOLERANCE
    assert abs(x - knee * 2720.0 / 2900.0) / x < 0.03
    assert len(history) <= calibrate.MAX_ITERATIONS


def test_the_prefill_fit_solves_both_oracle_points_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model of the two points with the coupling measured on DS 660B (2026-12-01): at 4,096 agents the JCT is
    throughput, (2,274 s + 252 s per ms of overhead) / speed; at 512 agents 370 s / speed plus 160 s per ms.
    Fitted one after the other the two drift apart; together they land on the solution."""
    import argparse

    from dualpath_emu.reproduce import calibrate

    def jct(agents: int, speed: float, overhead_ms: float) -> float:
        return (2274.0 + 252.0 * overhead_ms) / speed if agents == 4096 else 370.0 / speed + 160.0 * overhead_ms

    class Fake:
        def __init__(self, jct_s: float) -> None:
            self.jct_s = jct_s

    def fake_run_cells(cells: list[Cell], jobs: int, **_: object) -> list[Fake]:
        return [Fake(jct(c.config.agents, c.labels["speed"], c.labels["overhead_ms"])) for c in cells]

    monkeypatch.setattr(calibrate, "run_cells", fake_run_cells)
    history: list[dict[str, object]] = []
    targets = {("oracle", 4096): 9400.0, ("oracle", 512): 2000.0}

    def config(n: int, **_: float) -> ClusterConfig:
        return deployment("ds660b", quick=True, agents=n)

    speed, overhead_s, jcts = calibrate._fit_prefill(
        targets, 0.25, 2e-3, config, 0, argparse.Namespace(quiet=True, cache=None, dask=None, jobs=2), history
    )
    for key, target in targets.items():
        assert abs(jcts[key] / target - 1) <= calibrate.TOLERANCE, key
    assert speed == pytest.approx(0.434, rel=0.03) and overhead_s == pytest.approx(7.2e-3, rel=0.05)
    assert len(history) <= 2 * (3 + calibrate.MAX_ITERATIONS)


def test_reproduce_list_names_every_experiment_and_fig7_quick_keeps_to_the_model_asked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dualpath_emu.reproduce.fig7 import cells

    assert cli_main(["reproduce", "--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(EXPERIMENTS)
    assert cli_main(["reproduce"]) == 2 and "reproduce --list" in capsys.readouterr().err
    assert {c.labels["model"] for c in cells(True, ["ds27b"])} == {"ds27b"}
    assert {c.labels["model"] for c in cells(True)} == {"ds660b", "ds27b"}
    assert {c.labels["model"] for c in cells(False)} == {"ds660b", "ds27b", "qwen32b"}
