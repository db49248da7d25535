"""Bad input never crashes, hangs or aborts (issue 13 §5).

Every bad input gets one line naming the file, the key or line and what was expected, exit status 2 and no
traceback; every accepted input is one the core takes, and limits are checked up front. The corpus in
``tests/data/bad_inputs`` (each file with its expected error in ``expected.json``) is what fuzzing and review
found; the Hypothesis tests at the end run the fuzz target (``tests/input_fuzz.py``, also ``make fuzz``) at
the test profile's depth.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from dualpath_emu._core import Core
from dualpath_emu.cli import main
from dualpath_emu.cluster.scenario import LIMITS, load_cluster_scenario
from dualpath_emu.config import ScenarioError, load_toml
from dualpath_emu.errors import InvalidArgumentError, StateError
from dualpath_emu.inputs import MAX_SCENARIO_BYTES, short_repr, shorten
from dualpath_emu.workload import TraceError, load_trace
from tests.input_fuzz import check_cli, check_scenario, check_trace, scenario_documents, trace_documents

CORPUS = Path(__file__).resolve().parent / "data" / "bad_inputs"
EXPECTED: dict[str, str] = json.loads((CORPUS / "expected.json").read_text(encoding="utf-8"))
SMALL = """kind = "cluster"
systems = ["dualpath"]
[deployment]
model = "ds27b"
pe_nodes = 1
de_nodes = 1
prefill_ep_nodes = 1
decode_ep_nodes = 1
[workload]
agents = 2
max_rounds = 2
"""


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI, expect exit status 2 and one error line on stderr, and return that line."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("dualpath-emu: error: "), captured.err[:500]
    assert "Traceback" not in captured.err + captured.out
    return captured.err.removeprefix("dualpath-emu: error: ").rstrip("\n")


def test_every_corpus_file_has_an_expected_error() -> None:
    files = {p.name for p in CORPUS.iterdir() if p.suffix in (".toml", ".jsonl")}
    assert files == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_corpus_input_gets_one_line_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    # Copied, so that the file the message names is the one the test made (and the corpus stays read-only).
    for other in CORPUS.iterdir():
        shutil.copy(other, tmp_path / other.name)
    path = tmp_path / name
    command = ["validate", str(path)] if path.suffix == ".toml" else ["trace", "stats", str(path)]
    line = error_line(capsys, command)
    assert line.startswith(f"{path}"), line
    assert EXPECTED[name] in line, line
    assert len(line) < 400, line


# ------------------------------------------------------------------------------- files that are not files


def test_non_regular_files_are_refused_before_a_byte_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result: list[str] = []

    def refuse() -> None:  # in a thread: if opening the FIFO blocked, the test would time out, not hang
        result.append(error_line(capsys, ["validate", str(fifo)]))
        result.append(error_line(capsys, ["trace", "stats", str(fifo)]))
        result.append(error_line(capsys, ["validate", "/dev/zero"]))
        result.append(error_line(capsys, ["trace", "stats", "/dev/zero"]))
        result.append(error_line(capsys, ["run", str(tmp_path)]))

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "reading a FIFO or /dev/zero hung"
    assert result == [
        f"{fifo}: is a FIFO (named pipe), not a regular file: expected a scenario TOML file",
        f"{fifo}: is a FIFO (named pipe), not a regular file: expected a trace file (JSON Lines)",
        "/dev/zero: is a device, not a regular file: expected a scenario TOML file",
        "/dev/zero: is a device, not a regular file: expected a trace file (JSON Lines)",
        f"{tmp_path}: is a directory, not a regular file: expected a scenario TOML file",
    ]


def test_a_scenario_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_bytes(b"# " + b"x" * MAX_SCENARIO_BYTES + b"\n")
    with pytest.raises(ScenarioError, match=r"big.toml: 1,048,579 bytes, more than the 1,048,576 bytes read"):
        load_toml(path)


def test_a_trace_line_over_the_line_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dualpath_emu.workload.trajectory as trajectory

    monkeypatch.setattr(trajectory, "MAX_LINE_BYTES", 100)
    path = tmp_path / "t.jsonl"
    path.write_text('{"format": "dualpath-emu-trajectories", "version": 1}\n{"id": "' + "a" * 200 + '"}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:2: a line longer than 100 bytes"):
        load_trace(path)


# ------------------------------------------------------------------------------- long values


def test_a_100k_character_value_is_not_echoed_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    long = "x" * 100_000
    cases = {
        "value.toml": f'kind = "cluster"\n[deployment]\nmodel = "{long}"\n',
        "key.toml": f'kind = "cluster"\n{long} = 1\n',
        "app.toml": f'app = "{long}"\n',
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        line = error_line(capsys, ["validate", str(tmp_path / name)])
        assert "(100,000 characters)" in line and len(line) < 500, line[:500]
    trace = tmp_path / "t.jsonl"
    header = '{"format": "dualpath-emu-trajectories", "version": 1}\n'
    trace.write_text(header + f'{{"id": "{long}", "rounds": [[1, 1]]}}\n' * 2)
    line = error_line(capsys, ["trace", "stats", str(trace)])
    assert line.startswith(f"{trace}:3: duplicate id 'xxx") and "(100,000 characters)" in line and len(line) < 500
    trace.write_text(header + f'{{"id": "a", "{long}": 1}}\n')
    assert "(100,000 characters)" in error_line(capsys, ["trace", "stats", str(trace)])


def test_command_line_numbers_are_bounded_and_never_echoed_whole(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(SMALL)
    huge = "9" * 5_000
    assert "invalid int value" in error_line(capsys, ["run", str(scenario), "--agents", huge])
    assert len(error_line(capsys, ["run", str(scenario), "--agents", huge])) < 1_100
    assert error_line(capsys, ["run", str(scenario), "--agents", "1000000"]) == (
        "--agents: expected an integer in [1, 100000], got 1000000"
    )
    assert error_line(capsys, ["run", str(scenario), "--seed", "9" * 40]) == (
        "--seed: expected an integer in [0, 9223372036854775807], got an integer of 40 digits"
    )
    out = str(tmp_path / "t.jsonl")
    assert error_line(capsys, ["trace", "gen", "--dataset", "64k", "--agents", "1000000", "--out", out]) == (
        "--agents: expected an integer in [1, 100000], got 1000000"
    )
    assert error_line(capsys, ["trace", "gen", "--dataset", "64k", "--base", "10000000", "--out", out]) == (
        "trace gen: n_base: expected an integer in [1, 100000], got 10000000"
    )
    assert error_line(capsys, ["trace", "gen", "--dataset", "32k", "--first-append", "40000", "--out", out]) == (
        "trace gen: first_append: expected an integer below 32k's MaxLen 32768, got 40000"
    )
    mooncake = CORPUS.parent / "mooncake" / "synthetic_trace.jsonl"
    line = error_line(capsys, ["trace", "import", str(mooncake), "--out", out, "--block-tokens", "1" + "0" * 400])
    assert line == "--block-tokens: expected an integer in [1, 1000000000], got an integer of 401 digits"
    run = "run.toml"  # the overrides are checked before the file is read
    assert error_line(capsys, ["launch", run, "--time-scale", "1e-300"]) == (
        "--time-scale: expected a number in [1e-6, 1e6], got 1e-300"
    )
    assert error_line(capsys, ["launch", run, "--seed", "-1"]).startswith("--seed: expected an integer")


def test_short_repr_describes_what_it_does_not_print() -> None:
    assert short_repr("abc") == "'abc'"
    assert short_repr("z" * 61) == repr("z" * 60) + "… (61 characters)"
    assert short_repr(10**200) == "an integer of 201 digits"
    assert short_repr(-(10**200)) == "-an integer of 201 digits"
    assert shorten("y" * 61) == "y" * 60 + "… (61 characters)"


# ------------------------------------------------------------------------------- accepted input runs


def test_the_limits_are_wide_enough_for_the_paper_and_each_edge_is_accepted(tmp_path: Path) -> None:
    """The documented limits themselves load (and the core takes what they give): a bound is a bound, not a
    value just beyond what works."""
    edges = SMALL.replace("[workload]", """[hardware]
gpus = 16
snics = 16
cnic_bytes_per_s = 1e12
snic_bytes_per_s = 1e6
host_dram_bytes_per_s = 1e14
[storage]
read_bytes_per_s = 1e16
write_bytes_per_s = 1e6
read_latency_s = 10
queue_depth = 65536
[scheduling]
fetch_period_s = 60
alpha_read_s = 3600
pipeline_stages = 1024
[workload]""")  # fmt: skip
    path = tmp_path / "edges.toml"
    path.write_text(edges)
    check_scenario(path.read_bytes(), tmp_path)
    scenario = load_cluster_scenario(path)
    assert scenario.config.node.gpus == LIMITS.max_gpus
    assert LIMITS.max_nodes >= 144 and LIMITS.max_agents >= 4096  # the paper's largest deployment and runs


def test_a_run_at_the_slowest_accepted_rates_ends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slow = SMALL.replace("[workload]", """[hardware]
cnic_bytes_per_s = 1e6
snic_bytes_per_s = 1e6
host_dram_bytes_per_s = 1e6
[storage]
read_latency_s = 10
write_latency_s = 10
[roofline]
gemm_efficiency = 0.001
[workload]""")  # fmt: skip
    path = tmp_path / "slow.toml"
    path.write_text(slow)
    assert main(["run", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert 1e3 < summary["systems"]["dualpath"]["jct_s"] < 1e8  # long in emulated time, yet it ends


# ------------------------------------------------------------------------------- the core's own limits


def test_the_core_rejects_extreme_rates_naming_the_argument() -> None:
    core = Core()
    for rate, message in [(1e308, "rate_bytes_per_s: a rate in"), (0.5, "rate_bytes_per_s: a rate in")]:
        with pytest.raises(InvalidArgumentError, match=message):
            core.add_port(f"p{rate}", rate)
    with pytest.raises(InvalidArgumentError, match="peak_bytes_per_s"):
        core.add_port("peak", 1e9, peak_bytes_per_s=1e300, burst_bytes=1e6)
    with pytest.raises(InvalidArgumentError, match="burst_bytes"):
        core.add_port("burst", 1e9, peak_bytes_per_s=2e9, burst_bytes=1e300)
    with pytest.raises(InvalidArgumentError, match="time_scale"):
        Core(clock="wall", time_scale=1e-300)
    assert core.port_count == 0


def test_work_that_would_end_past_2_63_ns_is_an_error_not_silence() -> None:
    core = Core()
    port = core.add_port("slow", 1.0)
    core.submit_transfers([([port], 0, 2**64 - 1, 1)])
    with pytest.raises(StateError, match=r"2\^63 ns .*\"slow\""):
        core.run_until_idle()
    assert core.pending() == 1


def test_sampling_every_nanosecond_over_a_long_idle_span_stays_bounded() -> None:
    core = Core(sample_interval_ns=1)
    port = core.add_port("p", 1e9)
    core.add_timers([(10**18, 1)])
    core.run_until_idle()
    core.submit_transfers([([port], 0, 10**9, 2)])
    core.run_until_idle()
    series = core.utilisation(port)
    interval = core.sample_interval_ns
    assert interval is not None and len(series) <= 65_536 and interval >= 10**18 // 65_536
    assert abs(sum(series) * 1e9 * interval / 1e9 - 1e9) < 1.0  # every byte is still counted


# ------------------------------------------------------------------------------- the fuzz target


_FUZZ = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@_FUZZ
@given(data=scenario_documents())
def test_fuzz_scenario_loaders(fuzz_dir: Path, data: bytes) -> None:
    check_scenario(data, fuzz_dir)
    check_cli(["validate", str(fuzz_dir / "scenario.toml")])


@_FUZZ
@given(data=trace_documents())
def test_fuzz_trace_loaders(fuzz_dir: Path, data: bytes) -> None:
    check_trace(data, fuzz_dir)
    check_cli(["trace", "stats", str(fuzz_dir / "trace.jsonl")])
