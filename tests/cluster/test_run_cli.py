"""`dualpath-emu run` and `dualpath-emu validate`: cluster scenarios (every packaged file, bad files with
their exact messages, the built-in default equal to its file), and a run of a tiny scenario with its table,
its JSON summary and the files of --out.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dualpath_emu.cli import main
from dualpath_emu.cluster.catalog import TESTBED_NODE
from dualpath_emu.cluster.config import ClusterConfig, KvHbmSpec, KvPoolSpec, KvTierSpec
from dualpath_emu.cluster.outputs import CSV_COLUMNS
from dualpath_emu.cluster.roofline import RooflineParams
from dualpath_emu.cluster.run import Progress, run_system
from dualpath_emu.cluster.run_cli import _progress_bars
from dualpath_emu.cluster.scenario import BUILT_IN, DEFAULT, DEFAULT_SYSTEMS, load_cluster_scenario
from dualpath_emu.cluster.topology import NetworkSpec, StorageSpec
from dualpath_emu.config import ScenarioError
from dualpath_emu.scenarios import FOLDER
from dualpath_emu.workload.generator import GeneratorParams

SCENARIOS = FOLDER  # the scenario files that ship in the package
CLUSTER_FILES = sorted(SCENARIOS.glob("*.toml"))

# A DS 27B 1P1D cluster, 8 agents of the 32K dataset cut to their first 6 rounds: a run takes well under a
# second per system.
TINY = """\
kind = "cluster"
name = "tiny"
seed = 3

[deployment]
model = "ds27b"
pe_nodes = 1
de_nodes = 1
prefill_ep_nodes = 1
decode_ep_nodes = 1

[workload]
dataset = "32k"
agents = 8
max_rounds = 6
"""
TINY_TURNS = 8 * 6

SYSTEM_KEYS = {
    "jct_s", "complete", "incomplete", "turns", "turns_planned", "turns_done", "turns_not_run", "agents", "failed_requests", "failed_agents", "redispatches", "ttft_s", "ttst_s", "tpot_s", "snic_read_bytes", "snic_util",
    "cnic_util", "dram_util", "gpu_util", "working_set_bytes", "utilisation_sample_s", "snic_max_over_mean",
    "event_log_sha256", "wall_s",
    "events", "core_events", "core_stats",
}  # fmt: skip


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------- scenarios


def test_scenario_files_exist() -> None:
    names = {p.stem for p in CLUSTER_FILES}
    assert {"ds660b-2p4d-offline", "ds660b-2p4d-online", "ds27b-1p1d-offline", "ds27b-1p1d-online",
            "qwen32b-1p2d-offline"} <= names  # fmt: skip


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.name)
def test_every_cluster_scenario_file_validates(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = load_cluster_scenario(path)
    assert scenario.name == path.stem
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert out == f"{path}: OK: cluster scenario {scenario.name!r}: {scenario.describe()}\n"


def test_the_run_scenario_is_told_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dualpath_emu.cluster.live import prepare_live
    from dualpath_emu.cluster.systems import SYSTEMS
    from tests.cluster.test_live import small_config, work

    prepare_live(small_config(), SYSTEMS["dualpath"], work(2, 1), run_dir=tmp_path)  # a live run's run.toml
    path = tmp_path / "run.toml"
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: OK: run scenario for `dualpath-emu launch` (app 'cluster'")
    with pytest.raises(ScenarioError, match=r"actor-runtime scenario \(it has key 'app'\).*dualpath-emu launch"):
        load_cluster_scenario(path)


def test_the_built_in_default_equals_its_file() -> None:
    from_file = load_cluster_scenario(SCENARIOS / "ds660b-2p4d-offline.toml")
    assert dataclasses.replace(from_file, source=BUILT_IN) == DEFAULT
    assert DEFAULT.systems == ("basic", "dualpath", "oracle") and DEFAULT.config.mode == "offline"


def test_a_minimal_file_has_every_default(tmp_path: Path) -> None:
    scenario = load_cluster_scenario(write(tmp_path, 'kind = "cluster"\n', "minimal.toml"))
    assert scenario.config == ClusterConfig()
    assert scenario.generator == GeneratorParams()
    assert (scenario.name, scenario.seed, scenario.systems, scenario.trace, scenario.max_rounds) == (
        "minimal", 0, DEFAULT_SYSTEMS, None, 0)  # fmt: skip


EVERY_KEY = """\
kind = "cluster"
name = "every-key"
seed = 9
order_seed = 4
message_delay_s = 0.001
systems = ["dualpath"]
[deployment]
model = "ds27b"
pe_nodes = 3
de_nodes = 2
prefill_ep_nodes = 3
decode_ep_nodes = 2
dram_buffer_bytes = 40_000_000_000
[hardware]
gpu = "h200"
gpus = 4
cnic_bytes_per_s = 25e9
snic_bytes_per_s = 40e9
snics = 2
host_dram_bytes_per_s = 400e9
[storage]
read_bytes_per_s = 1e11
write_bytes_per_s = 5e10
read_latency_s = 0.001
write_latency_s = 0.002
queue_depth = 8
[kv.store]
capacity_bytes = 1_000_000_000_000
eviction = "ttl"
ttl_s = 300.0
[kv.pool]
bytes_per_node = 2_000_000_000
eviction = "ttl"
ttl_s = 30.0
systems = ["dualpath"]
[kv.hbm]
systems = ["dualpath"]
ttl_s = 60.0
eviction = "ttl"
[network]
isolation = false
[network.cnic_vl]
max_vls = 4
high_limit = 0
vlarb_high = ""
vlarb_low = "0:1,2:1"
[[network.background]]
ports = ["de.snic.rx"]
rate_bytes_per_s = 1e9
at_s = 5.0
duration_s = 10.0
period_s = 2.0
on_s = 1.0
lane = 3
[[network.bucket]]
ports = ["pe.snic.rx"]
sustained_bytes_per_s = 1e9
burst_bytes = 1e9
[roofline]
gemm_efficiency = 0.5
attention_efficiency = 0.4
memory_efficiency = 0.7
overhead_s_per_layer = 0.002
a2a_fixed_s = 1e-4
[roofline.decode]
memory_efficiency = 0.75
overhead_s_per_layer = 0.0001
[workload]
dataset = "32k"
agents = 3
max_rounds = 2
mode = "online"
arrival_rate = 0.5
[workload.generator]
base_trajectories = 50
reading = "per-turn"
append_sigma = 0.5
gen_sigma = 0.5
first_round_sigma = 0.2
total_min_fraction = 0.2
first_append = 2
[workload.tool_wait]
dist = "lognormal"
mean_s = 2.0
sigma = 0.5
[scheduling]
alpha_read_s = 2.0
beta_compute_s = 4.0
attention_quota_s = 0.2
attention_quota_per = "layer"
fetch_period_s = 0.01
hit_block_aligned = false
de_hbm_reserve_fraction = 0.2
pe_hbm_reserve_fraction = 0.2
pipeline_stages = 6
max_redispatches = 5
read_timeout_s = 12.5
stall_timeout_s = 1800
[[faults]]
kind = "degrade"
target = "n0.snic"
at_s = 1.0
factor = 0.5
"""


def test_every_config_field_has_a_key(tmp_path: Path) -> None:
    # Each key above differs from its default, so a field left at its default has no key.
    scenario = load_cluster_scenario(write(tmp_path, EVERY_KEY))
    default = ClusterConfig()
    for f in dataclasses.fields(ClusterConfig):
        value, base = getattr(scenario.config, f.name), getattr(default, f.name)
        if isinstance(base, (type(TESTBED_NODE), StorageSpec, RooflineParams, KvTierSpec, KvPoolSpec, KvHbmSpec,
                             NetworkSpec)):  # fmt: skip
            for sub in dataclasses.fields(base):
                if (f.name, sub.name) == ("kv_pool", "write"):
                    continue  # a pool over a bounded store (above) writes through: its own file below
                assert getattr(value, sub.name) != getattr(base, sub.name), f"{f.name}.{sub.name} has no key"
        else:
            assert value != base, f"{f.name} has no key"
    back = load_cluster_scenario(write(tmp_path, 'kind = "cluster"\n[kv.pool]\nwrite = "back"\n'))
    assert back.config.kv_pool.write != default.kv_pool.write
    for f in dataclasses.fields(GeneratorParams):
        assert getattr(scenario.generator, f.name) != getattr(GeneratorParams(), f.name), f.name
    assert (scenario.name, scenario.seed, scenario.systems, scenario.max_rounds) == ("every-key", 9, ("dualpath",), 2)
    # [roofline]'s keys set both engines, [roofline.decode] overrides the decode engines' own
    prefill, decode = scenario.config.prefill_roofline, scenario.config.decode_roofline
    assert (prefill.memory_efficiency, prefill.overhead_s_per_layer, prefill.a2a_fixed_s) == (0.7, 0.002, 1e-4)
    assert (decode.memory_efficiency, decode.overhead_s_per_layer, decode.a2a_fixed_s) == (0.75, 0.0001, 1e-4)
    assert decode.gemm_efficiency == prefill.gemm_efficiency == 0.5


BAD = [
    ('kind = "cluster"\nagent = 3\n',
     "unknown key 'agent' (known keys here: backend, catalog, deployment, faults, gpus, hardware, host, kind, kv, message_delay_s, models, name, network, nics, order_seed, random_faults, roofline, scheduling, "
     "seed, storage, systems, workload)"),
    ('kind = "cluster"\n[workload]\nagents = "many"\n',
     "key 'workload.agents': expected an integer in [1, 100000], got the string 'many'"),
    ('kind = "cluster"\n[workload]\nagents = 0\n', "key 'workload.agents': expected an integer in [1, 100000], got 0"),
    ('kind = "cluster"\n[scheduling]\nattention_quota_per = "pass"\n',
     "key 'scheduling.attention_quota_per': expected one of 'forward', 'layer', got the string 'pass'"),
    ('kind = "cluster"\n[deployment]\npe_nodes = 2.0\n',
     "key 'deployment.pe_nodes': expected an integer in [1, 255], got 2.0"),
    ('kind = "cluster"\n[deployment]\nprefill_ep_nodes = 3\n',
     "key 'deployment.prefill_ep_nodes': expected a divisor of pe_nodes = 2, got 3"),
    ('kind = "cluster"\n[deployment]\nprefill_ep_nodes = 1\n',
     "key 'deployment.prefill_ep_nodes': expected at least 2 node(s) of 8 h800, so that every GPU holds its "
     "share of ds660b's weights, got 1 (ds660b at ep_degree=8 needs 99.7 GB of weights per GPU, more than "
     "the h800's 85.9 GB of HBM)"),
    ('kind = "cluster"\n[deployment]\nmodel = "gpt5"\n',
     "key 'deployment.model': expected one of 'ds660b', 'ds27b', 'qwen32b', got the string 'gpt5'"),
    ('kind = "cluster"\n[hardware]\ngpu = "b200"\n',
     "key 'hardware.gpu': expected one of 'h800', 'h100', 'h200', 'h20', got the string 'b200'"),
    ('kind = "cluster"\nsystems = ["basic", "fast"]\n',
     "key 'systems': expected names of systems (basic, basic+layerwise, basic+layerwise+dualpath, dualpath, "
     "oracle, sglmc, dualpath+retention, dualpath-split) or module:Name, file.py:Name, each once, got the string 'fast'"),
    ('kind = "cluster"\n[workload]\ndataset = "128k"\n',
     "key 'workload.dataset': expected one of '32k', '48k', '64k', got the string '128k'"),
    ('kind = "cluster"\n[workload]\nmode = "batch"\n',
     "key 'workload.mode': expected one of 'offline', 'online', got the string 'batch'"),
    ('kind = "cluster"\n[workload]\narrival_rate = 0\n',
     "key 'workload.arrival_rate': expected a number in [0.001, 1e6], got 0"),
    ('kind = "cluster"\n[roofline]\ngemm_efficiency = 1.5\n',
     "key 'roofline.gemm_efficiency': expected a number in [0.001, 1], got 1.5"),
    ('kind = "cluster"\n[deployment]\ndram_buffer_bytes = 1000\n',
     "key 'deployment.dram_buffer_bytes': expected at least 2.6 GB of KV for a 64k request (65536 tokens), "
     "got 1000"),
    ('kind = "cluster"\n[workload]\ndataset = "32k"\ntrace = "t.jsonl"\n',
     "key 'workload.trace': expected either dataset or trace, not both, got the string 't.jsonl'"),
    ('[workload]\nagents = 3\n', "missing key 'kind' (one of 'cluster')"),
    ('kind = "cluster"\ndeployment = 3\n', "key 'deployment': expected a table, got 3"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_a_bad_file_exits_2_naming_file_key_and_expected_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = write(tmp_path, text)
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dualpath-emu: error: {path}: {message}\n"


def test_a_missing_trace_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, 'kind = "cluster"\n[workload]\ntrace = "nowhere.jsonl"\n')
    with pytest.raises(ScenarioError) as error:
        load_cluster_scenario(path)
    assert str(error.value) == f"{path}: key 'workload.trace': {tmp_path / 'nowhere.jsonl'}: no such file"


def test_a_trace_workload(tmp_path: Path) -> None:
    assert main(["trace", "gen", "--dataset", "32k", "--agents", "5", "--out", str(tmp_path / "t.jsonl")]) == 0
    scenario = load_cluster_scenario(write(tmp_path, 'kind = "cluster"\n[workload]\ntrace = "t.jsonl"\n'))
    assert scenario.config.agents == 5 and len(scenario.trajectories()) == 5
    with pytest.raises(ScenarioError, match=r"--agents: expected at most 5"):
        scenario.with_overrides(agents=6)
    assert len(scenario.with_overrides(agents=2).trajectories()) == 2


# --------------------------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Path]:
    """One `run --json --out` of the tiny scenario with every default system: (scenario, summary, out dir)."""
    folder = tmp_path_factory.mktemp("tiny")
    scenario = write(folder, TINY, "tiny.toml")
    out = folder / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["run", str(scenario), "--json", "--out", str(out), "--trace"]) == 0
    return scenario, json.loads(stdout.getvalue()), out


def test_json_summary_has_the_required_keys(tiny_run: tuple[Path, dict[str, Any], Path]) -> None:
    _, summary, _ = tiny_run
    assert summary["scenario"] == "tiny" and summary["seed"] == 3
    assert list(summary["systems"]) == list(DEFAULT_SYSTEMS)
    for name, system in summary["systems"].items():
        assert SYSTEM_KEYS <= set(system), name
        for key in ("ttft_s", "ttst_s", "tpot_s"):
            assert {"p50", "p90", "p99"} <= set(system[key])
        for key in ("snic_read_bytes", "snic_util", "cnic_util", "dram_util", "gpu_util"):
            assert set(system[key]) == {"pe", "de"}
        for role in ("pe", "de"):
            # Per direction, each a run mean and the p99 of 1-second samples, fractions of capacity.
            for util in (*system["snic_util"][role].values(), *system["cnic_util"][role].values(),
                         system["dram_util"][role], system["gpu_util"][role]):  # fmt: skip
                assert set(util) == {"mean", "p99"} and all(0.0 <= v <= 1.0 + 1e-9 for v in util.values()), name
            assert set(system["snic_util"][role]) == {"rx", "tx"} and set(system["cnic_util"][role]) == {"tx", "rx"}
            assert system["gpu_util"][role]["mean"] > 0, name  # every system computes
        working_set = system["working_set_bytes"]
        assert set(working_set) == {"mean", "max"} and 0 < working_set["mean"] <= working_set["max"]
        assert system["core_events"] > 0 and system["core_events"] == system["core_stats"]["queue_events"]
        assert system["turns"] == TINY_TURNS and system["agents"] == 8 and system["complete"]
        assert len(system["event_log_sha256"]) == 64
    basic, dualpath = summary["systems"]["basic"], summary["systems"]["dualpath"]
    # Basic reads on the prefill side only; DualPath reads on the decode side too (here all of it: 1P1D).
    assert basic["snic_util"]["pe"]["rx"]["mean"] > 0 and basic["snic_util"]["de"]["rx"]["mean"] == 0
    assert dualpath["snic_util"]["de"]["rx"]["mean"] > 0
    # Decode nodes write back every completed Full Block: their storage NICs transmit.
    assert basic["snic_util"]["de"]["tx"]["mean"] > 0 and basic["snic_util"]["de"]["tx"]["p99"] > 0
    speedup = summary["speedup_vs_basic"]
    assert speedup["basic"] == 1.0
    assert speedup["oracle"] == pytest.approx(
        summary["systems"]["basic"]["jct_s"] / summary["systems"]["oracle"]["jct_s"]
    )
    assert summary["systems"]["basic"]["snic_read_bytes"]["de"] == 0


def test_out_files_are_well_formed(tiny_run: tuple[Path, dict[str, Any], Path]) -> None:
    _, summary, out = tiny_run
    assert json.loads((out / "summary.json").read_text()) == summary
    with open(out / "requests.csv", newline="") as file:
        rows = list(csv.reader(file))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) - 1 == TINY_TURNS * len(DEFAULT_SYSTEMS)
    by_system = {name: [r for r in rows[1:] if r[0] == name] for name in DEFAULT_SYSTEMS}
    for name, system_rows in by_system.items():
        assert len(system_rows) == TINY_TURNS
        for row in system_rows:
            record = dict(zip(CSV_COLUMNS, row))
            assert float(record["arrive_s"]) <= float(record["first_token_s"]) <= float(record["done_s"])
            assert record["read_side"] in {"pe", "de", "none"}
    assert {r[10] for r in by_system["basic"]} <= {"pe", "none"}
    assert {r[10] for r in by_system["oracle"]} == {"none"}
    for row in rows[1:]:
        record = dict(zip(CSV_COLUMNS, row))
        first, second = float(record["first_token_s"]), float(record["second_token_s"])
        assert float(record["ttft_s"]) == pytest.approx(first - float(record["arrive_s"]), abs=2e-9)
        # TTST is second − first token, not from arrival (which would add the TTFT).
        assert float(record["ttst_s"]) == pytest.approx(second - first, abs=2e-9)
        assert float(record["tpot_s"]) > 0 or int(record["gen"]) <= 2


@pytest.mark.parametrize("png", ["jct.png", "utilisation.png", "latency-cdf.png"])
def test_plots_are_written_and_drawn(tiny_run: tuple[Path, dict[str, Any], Path], png: str) -> None:
    from matplotlib.image import imread

    _, _, out = tiny_run
    data = (out / png).read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, png
    pixels = imread(out / png)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 400
    assert (pixels[..., :3] < 0.9).mean() > 0.01, "lines, text and axes, not a blank canvas"


def test_trace_is_a_perfetto_object_with_named_tracks_that_nest(tiny_run: tuple[Path, dict[str, Any], Path]) -> None:
    _, _, out = tiny_run
    for name in DEFAULT_SYSTEMS:
        trace = json.loads(gzip.decompress((out / f"trace-{name}.json.gz").read_bytes()))
        assert set(trace) == {"traceEvents"}
        events: list[dict[str, Any]] = trace["traceEvents"]
        processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        assert set(processes.values()) == {f"requests ({name})", "storage (3fs)", "n0 (prefill)", "n1 (decode)"}
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
        assert len(threads) == 2 * 8 and set(threads.values()) == {f"gpu{g}" for g in range(8)}
        assert {e["pid"] for e in events} <= set(processes), "every event in a named process"
        # Thread slices (the GPUs' work) nest: on each thread, none overlaps another in part.
        slices = [e for e in events if e["ph"] == "X"]
        assert {(e["pid"], e["tid"]) for e in slices} <= set(threads)
        assert {e["name"] for e in slices} == {"prefill pass", "decode"}
        for track in {(e["pid"], e["tid"]) for e in slices}:
            # As Perfetto reads them: whole nanoseconds, truncated.
            ns = sorted((int(e["ts"] * 1000), int(e["dur"] * 1000)) for e in slices if (e["pid"], e["tid"]) == track)
            stack: list[int] = []
            for start, dur in sorted(ns, key=lambda s: (s[0], -s[1])):
                while stack and stack[-1] <= start:
                    stack.pop()
                assert not stack or start + dur <= stack[-1], f"{name}: {track} slices overlap in part"
                stack.append(start + dur)
        # Async slices (requests, transfers, I/Os): a begin and a later end per (pid, cat, id), one slice each.
        spans: dict[tuple[int, str, Any], list[dict[str, Any]]] = {}
        for e in events:
            if e["ph"] in "be":
                spans.setdefault((e["pid"], e["cat"], e["id"]), []).append(e)
        assert spans
        for key, pair in spans.items():
            assert [e["ph"] for e in pair] == ["b", "e"] and pair[0]["ts"] <= pair[1]["ts"], key
            assert pair[0]["name"] == pair[1]["name"], key
        names = {e["name"] for e in events if e["ph"] == "b"}
        phases = {"request", "waiting", "read KV", "prefill", "hand-off", "decode"}
        assert {"request", "prefill", "hand-off", "decode"} <= names
        paths = names - phases
        assert all("→" in n and "18446744073709551615" not in n for n in paths), paths  # named by their path
        if name != "oracle":  # Oracle moves no KV
            assert any(
                n.startswith("read 3fs.read → n0.snic.rx") or n.startswith("read 3fs.read → n1.snic.rx") for n in paths
            )
            assert any(e["ph"] == "C" and e["name"] == "n1.snic.tx" for e in events), name  # write-backs


def test_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write(tmp_path, TINY)
    assert main(["run", str(scenario), "--system", "basic", "--system", "dualpath"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny (")  # the header line
    for text in ("JCT", "vs", "TTFT (s)", "TPOT (ms)", "SNIC rx %", "CNIC PE %", "CNIC DE %", "tx/rx", "GPU %",
                 "max/mean", "events", "basic", "dualpath"):  # fmt: skip
        assert text in out, text
    assert max(len(line) for line in out.splitlines()[1:]) <= 100  # the table fits 100 columns
    assert "oracle" not in out
    assert "1.00×" in out  # basic against itself


def test_system_selection_and_seed_override(
    tiny_run: tuple[Path, dict[str, Any], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    scenario, summary, _ = tiny_run
    assert main(["run", str(scenario), "--json", "--system", "oracle", "--system", "dualpath", "--seed", "3"]) == 0
    selected = json.loads(capsys.readouterr().out)
    assert list(selected["systems"]) == ["oracle", "dualpath"]
    assert selected["speedup_vs_basic"] == {"oracle": None, "dualpath": None}
    # Same seed, same workload: the same run, byte for byte.
    for name in ("oracle", "dualpath"):
        assert selected["systems"][name]["event_log_sha256"] == summary["systems"][name]["event_log_sha256"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--system", "fast"], "--system: expected names of systems (basic, basic+layerwise, "
                               "basic+layerwise+dualpath, dualpath, oracle, sglmc, dualpath+retention, dualpath-split) or module:Name, file.py:Name, each "
                               "once, got 'fast'"),
        (["--agents", "0"], "--agents: expected an integer in [1, 100000], got 0"),
        (["--seed", "-1"], "--seed: expected an integer in [0, 9223372036854775807], got -1"),
    ],
)  # fmt: skip
def test_bad_run_options_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["run", str(write(tmp_path, TINY)), *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"dualpath-emu: error: {message}\n"


def test_progress_is_reported_and_changes_nothing(tmp_path: Path) -> None:
    scenario = load_cluster_scenario(write(tmp_path, TINY))
    work = scenario.trajectories()
    calls: list[Progress] = []
    plain = run_system(scenario.config, "dualpath", work, seed=3)
    watched = run_system(
        scenario.config, "dualpath", work, seed=3, progress=calls.append, progress_interval_s=0.0, sample_interval_s=1.0
    )
    assert watched.event_log_sha256 == plain.event_log_sha256 and watched.jct_s == plain.jct_s
    assert calls and calls[-1].turns_done == calls[-1].turns_total == TINY_TURNS
    assert [c.turns_done for c in calls] == sorted(c.turns_done for c in calls)
    assert set(watched.snic_timeline) == {"pe", "de"}
    assert len(watched.snic_timeline["pe"]) >= int(watched.jct_s)
    assert all(0.0 <= u <= 1.0 + 1e-9 for u in watched.snic_timeline["pe"] + watched.snic_timeline["de"])


def test_progress_bars_draw_on_a_terminal() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    with _progress_bars(console, True) as track:
        update = track("dualpath")
        assert update is not None
        update(Progress("dualpath", 5, 10, 12.0, 0.1))
    assert "dualpath" in buffer.getvalue() and "5/10" in buffer.getvalue()
    with _progress_bars(console, False) as track:
        assert track("dualpath") is None


def test_the_lane_demo_is_still_reachable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "lanes"]) == 0
    assert "All-to-all burst latency" in capsys.readouterr().out


def test_trace_needs_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "ds27b-1p1d-offline", "--agents", "2", "--trace"]) == 2
    assert "--trace writes a Perfetto trace per system into the --out folder" in capsys.readouterr().err


def test_the_table_fits_an_80_column_terminal_by_leaving_columns_out(
    tiny_run: tuple[Path, dict[str, Any], Path],
) -> None:
    from rich.console import Console

    from dualpath_emu.cluster.run import run_system
    from dualpath_emu.cluster.run_cli import _table

    scenario_path, _, _ = tiny_run
    scenario = load_cluster_scenario(scenario_path)
    results = {"dualpath": run_system(scenario.config, "dualpath", scenario.trajectories(), seed=scenario.seed)}
    for width, wide in ((80, False), (150, True)):
        console = Console(width=width, record=True, file=io.StringIO())
        console.print(_table(scenario, results, width))
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= width and "…" not in text
        assert ("CNIC PE %" in text) is wide and ("narrow terminal" in text) is not wide


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "workload.agents=-3",
            "dualpath-emu: error: --set workload.agents: expected an integer in [1, 100000], got -3",
        ),
        ("hardware.gpu=b200", "dualpath-emu: error: --set hardware.gpu: expected one of"),
        ("deployment.pe_nodez=2", "dualpath-emu: error: --set deployment.pe_nodez: no such key (known keys here:"),
    ],
)
def test_a_bad_set_value_is_named_as_given_not_by_the_packaged_file(
    setting: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "ds27b-1p1d-offline", "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and ".toml" not in err
