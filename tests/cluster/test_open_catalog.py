"""The open catalog (issue 25): models, GPUs and NICs defined in a scenario's own tables or in catalog files it
includes, the packaged ones as data, ``dualpath-emu catalog``, and every field's errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dualpath_emu import api
from dualpath_emu.cli import main as cli_main
from dualpath_emu.cluster.catalog import GPUS, MODELS, PACKAGED, PACKAGED_FILE
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.live import config_from_wire, config_to_wire
from dualpath_emu.cluster.scenario import load_cluster_scenario
from dualpath_emu.config import ScenarioError

SMALL = {"workload.agents": 6, "workload.max_rounds": 2}


def packaged_entry(kind: str, name: str, new_name: str) -> str:
    """The packaged catalog's ``[kind.name]`` table, verbatim, renamed ``new_name``."""
    text = PACKAGED_FILE.read_text(encoding="utf-8")
    start = text.index(f"[{kind}.{name}]\n")
    end = text.find("\n[", start + 1)
    return text[start : len(text) if end < 0 else end].replace(f"[{kind}.{name}]", f"[{kind}.{new_name}]", 1) + "\n"


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def sha(scenario: api.ClusterScenario, system: str = "dualpath") -> str:
    return str(api.run(scenario, systems=[system]).summary["systems"][system]["event_log_sha256"])


# --- the packaged catalog is data -----------------------------------------------------------------------


def test_the_packaged_catalog_is_read_from_its_file_and_every_entry_names_its_source() -> None:
    assert PACKAGED.origin["models.ds660b"] == str(PACKAGED_FILE)
    assert set(MODELS) == {"ds660b", "ds27b", "qwen32b"} and set(GPUS) >= {"h800", "h100", "h200", "h20"}
    for entries in (PACKAGED.models, PACKAGED.gpus, PACKAGED.nics):
        for spec in entries.values():
            assert spec.source and spec.description, spec.name
    assert PACKAGED.nic("cx7-400g").bytes_per_s == 50e9


def test_a_user_copy_of_ds660b_on_a_user_h800_gives_the_built_in_event_log(tmp_path: Path) -> None:
    copy = write(tmp_path, 'kind = "cluster"\n\n[deployment]\nmodel = "my-ds660b"\n\n[hardware]\ngpu = "my-h800"\n'
                 'cnic = "my-nic"\n\n' + packaged_entry("models", "ds660b", "my-ds660b")
                 + packaged_entry("gpus", "h800", "my-h800") + packaged_entry("nics", "cx7-400g", "my-nic"))  # fmt: skip
    mine = load_cluster_scenario(copy, SMALL)
    built_in = api.load_scenario("ds660b-2p4d-offline", overrides=SMALL)
    assert mine.config.model.name == "my-ds660b" and mine.config.gpu.name == "my-h800"
    assert sha(mine) == sha(built_in)


def test_a_catalog_file_is_included_relative_to_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "cat").mkdir()
    write(tmp_path / "cat", 'kind = "catalog"\n\n' + packaged_entry("models", "ds27b", "twin"), "mine.toml")
    path = write(tmp_path, 'kind = "cluster"\ncatalog = "cat/mine.toml"\n\n[deployment]\nmodel = "twin"\npe_nodes = 1\n'
                 "de_nodes = 1\nprefill_ep_nodes = 1\ndecode_ep_nodes = 1\n")  # fmt: skip
    mine = load_cluster_scenario(path, SMALL)
    packaged = api.load_scenario("ds27b-1p1d-offline", overrides=SMALL)
    assert sha(mine, "basic") == sha(packaged, "basic")


def test_a_user_defined_model_and_gpu_run_end_to_end() -> None:
    scenario = api.load_scenario(
        "llama70b-b200-1p2d-offline", overrides={"workload.agents": 8, "workload.max_rounds": 3}
    )
    model = scenario.config.model
    assert (model.name, scenario.config.gpu.name, model.kv_bytes_per_token_layer) == ("llama3-70b", "b200", 2048)
    assert model.total_params == pytest.approx(70.6e9, rel=0.005)  # Meta's published 70.6 B
    assert scenario.config.node.cnic_bytes_per_s == 100e9
    result = api.run(scenario)
    assert result.systems == ["basic", "dualpath", "oracle"]
    for name in result.systems:
        figures = result.summary["systems"][name]
        assert (figures["turns"], figures["complete"]) == (8 * 3, True)
    json.dumps(result.summary)  # the model's spec is in summary.json's config


def test_a_user_model_survives_the_wire_of_a_live_run() -> None:
    config = api.load_scenario("llama70b-b200-1p2d-offline").config
    assert config_from_wire(json.loads(json.dumps(config_to_wire(config)))) == config
    assert config_from_wire(json.loads(json.dumps(config_to_wire(ClusterConfig())))) == ClusterConfig()


def test_set_can_pick_a_model_the_scenario_defines(tmp_path: Path) -> None:
    path = write(tmp_path, 'kind = "cluster"\n\n' + packaged_entry("models", "ds660b", "other"))
    assert load_cluster_scenario(path, {"deployment.model": "other"}).config.model.name == "other"
    with pytest.raises(
        ScenarioError, match=r"--set deployment.model: expected one of 'ds660b', 'ds27b', 'qwen32b', 'other'"
    ):
        load_cluster_scenario(path, {"deployment.model": "nope"}, what="--set")


# --- every field is checked ---------------------------------------------------------------------------------

GQA = """[models.m]
attention = "gqa"
hidden_size = 1024
num_hidden_layers = 4
num_attention_heads = 8
num_key_value_heads = 2
vocab_size = 1000
intermediate_size = 4096
weight_dtype = "bf16"
kv_dtype = "fp16"
"""


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (GQA.replace('attention = "gqa"', 'attention = "linear"'),
         r"key 'models.m.attention': expected one of 'mha', 'gqa', 'mla', got the string 'linear'"),
        (GQA + "kv_lora_rank = 512\n", r"key 'models.m.kv_lora_rank' is not used: .* attention = \"mla\"; remove it"),
        (GQA.replace("num_key_value_heads = 2", "num_key_value_heads = 3"),
         r"key 'models.m.num_key_value_heads': expected a divisor of num_attention_heads = 8, got 3"),
        (GQA.replace("num_key_value_heads = 2\n", ""), r"missing key 'models.m.num_key_value_heads'"),
        (GQA.replace("hidden_size = 1024", "hidden_size = 1001"), r"key 'models.m.head_dim': expected the head dimension"),
        (GQA + "index_n_heads = 4\n", r"'models.m.index_n_heads' is not used: .*index_topk > 0"),
        (GQA + "num_experts_per_tok = 2\n", r"'models.m.num_experts_per_tok' is not used: .*n_routed_experts > 0"),
        (GQA + "n_routed_experts = 8\nnum_experts_per_tok = 9\nmoe_intermediate_size = 512\nfirst_k_dense_replace = 1\n",
         r"key 'models.m.num_experts_per_tok': expected an integer in \[1, 8\], got 9"),
        (GQA + "n_routed_experts = 8\nnum_experts_per_tok = 2\nmoe_intermediate_size = 512\n",
         r"'models.m.intermediate_size' is not used: every layer is MoE"),
        (GQA + "layers = 4\n", r"unknown key 'models.m.layers'"),
        (GQA + "active_params = 1e12\n", r"key 'models.m.active_params': expected at most the total parameters"),
        (GQA.replace("weight_dtype = \"bf16\"", "weight_dtype = \"int4\""), r"key 'models.m.weight_dtype': expected one of 'bf16', 'fp8', 'fp4'"),
        (GQA.replace("[models.m]", "[models.ds660b]"),
         r"key 'models.ds660b': models.ds660b is already defined in .*catalog.toml; give yours another name"),
        (GQA.replace("[models.m]", '[models."a b"]'), r"key 'models.a b': expected a name of letters, digits"),
        ("[models]\nm = 3\n", r"key 'models.m': expected a table, got 3"),
        ('[gpus.g]\nbf16_flops_per_s = 1e15\nhbm_gib = 80\nhbm_bytes_per_s = 3e12\n', r"missing key 'gpus.g.nvlink_bytes_per_s'"),
        ('[gpus.g]\nbf16_flops_per_s = 1e15\nfp8_flops_per_s = 5\nhbm_gib = 80\nhbm_bytes_per_s = 3e12\nnvlink_bytes_per_s = 1e11\n',
         r"key 'gpus.g.fp8_flops_per_s': expected 0 \(none\) or a number in \[1e9, 1e18\], got 5"),
        ('[nics.n]\nbytes_per_s = 1e13\n', r"key 'nics.n.bytes_per_s': expected a number in \[1e6, 1e12\], got 10000000000000.0"),
        ('[hardware]\ncnic = "cx9"\n', r"key 'hardware.cnic': expected one of 'cx7-400g', 'cx6-200g', 'cx8-800g', got the string 'cx9'"),
        ('[hardware]\ncnic = "cx6-200g"\ncnic_bytes_per_s = 25e9\n', r"key 'hardware.cnic': expected either cnic or cnic_bytes_per_s"),
        ('[gpus.a100]\nbf16_flops_per_s = 312e12\nhbm_gib = 80\nhbm_bytes_per_s = 2.0e12\nnvlink_bytes_per_s = 1e11\n'
         '[hardware]\ngpu = "a100"\n', r"key 'hardware.gpu': expected a GPU with fp8 tensor cores for ds660b's weight_dtype = 'fp8', got the string 'a100'"),
        ('catalog = "missing.toml"\n', r"key 'catalog': .*missing.toml: no such file"),
        ("catalog = 3\n", r"key 'catalog': expected a string or a list of strings, got 3"),
    ],
)  # fmt: skip
def test_bad_catalog_entries_are_one_line_errors_naming_the_key(tmp_path: Path, table: str, message: str) -> None:
    path = write(tmp_path, 'kind = "cluster"\n' + table)
    with pytest.raises(ScenarioError, match=message):
        load_cluster_scenario(path)


def test_a_catalog_file_must_say_its_kind_and_may_not_clash_with_the_scenario(tmp_path: Path) -> None:
    write(tmp_path, GQA, "nokind.toml")
    with pytest.raises(ScenarioError, match=r"nokind.toml: missing key 'kind' \(one of 'catalog'\)"):
        load_cluster_scenario(write(tmp_path, 'kind = "cluster"\ncatalog = ["nokind.toml"]\n'))
    write(tmp_path, 'kind = "catalog"\n' + GQA, "mine.toml")
    clash = write(tmp_path, 'kind = "cluster"\ncatalog = ["mine.toml"]\n' + GQA)
    with pytest.raises(ScenarioError, match=r"models.m is already defined in .*mine.toml; give yours another name"):
        load_cluster_scenario(clash)


def test_the_cli_reports_a_bad_entry_on_one_line_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, 'kind = "cluster"\n' + GQA + "kv_lora_rank = 512\n")
    assert cli_main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "models.m.kv_lora_rank" in err and "Traceback" not in err


# --- dualpath-emu catalog -----------------------------------------------------------------------------------


def test_catalog_lists_the_packaged_entries_with_derived_numbers_and_sources(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["catalog"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"ds660b\s+MLA r512 top-2048\s+61/58\s+7,168\s+656\s+37\.5/671\.9\s+256/8\+1\s+fp8/fp8", out)
    assert re.search(r"qwen32b\s+GQA 40/8\s+64\s+5,120\s+4,096\s+32\.0/32\.8\s+-\s+bf16/fp16", out)
    assert re.search(r"h20\s+148\s+296\s+-\s+96\s+4\s+160", out)
    assert "cx7-400g" in out and "Qwen/Qwen2.5-32B config.json" in out


def test_catalog_of_a_scenario_adds_its_entries_and_says_where_they_are_defined(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["catalog", "llama70b-b200-1p2d-offline", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["models"]["llama3-70b"]["defined_in"].endswith("llama70b-b200-1p2d-offline.toml")
    assert data["models"]["llama3-70b"]["kv_bytes_per_token"] == 80 * 2048
    assert data["gpus"]["b200"]["fp4_flops_per_s"] == 9e15
    assert data["models"]["ds660b"]["defined_in"] == str(PACKAGED_FILE)
    assert cli_main(["catalog", "llama70b-b200-1p2d-offline"]) == 0
    assert "[defined in " in capsys.readouterr().out


def test_catalog_reads_a_catalog_file_and_refuses_a_bad_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, 'kind = "catalog"\n' + GQA, "c.toml")
    assert cli_main(["catalog", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"]["m"]["attention"] == "gqa"
    bad = write(tmp_path, 'kind = "catalog"\n' + GQA.replace("vocab_size = 1000\n", ""), "bad.toml")
    assert cli_main(["catalog", str(bad)]) == 2
    assert "missing key 'models.m.vocab_size'" in capsys.readouterr().err


# --- the scenario reference ---------------------------------------------------------------------------------


def test_the_scenario_reference_documents_every_key_the_reader_asks_for_with_its_default() -> None:
    import tomllib

    from dualpath_emu.cluster.scenario_reference import EXAMPLE, check

    assert check() == []
    assert tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))["kind"] == "cluster"  # the example is TOML


def test_the_committed_scenario_reference_is_the_generated_one() -> None:
    from dualpath_emu.cluster.scenario_reference import render

    page = Path(__file__).resolve().parents[2] / "docs" / "scenario-reference.md"
    assert page.read_text(encoding="utf-8") == render(), "run `make docs` and commit docs/scenario-reference.md"


def test_the_reference_check_sees_an_undocumented_key_and_a_wrong_default() -> None:
    from dualpath_emu.cluster.scenario_reference import EXAMPLE, check

    text = EXAMPLE.read_text(encoding="utf-8")
    changed = text.replace("\nseed = 0 ", "\nseed = 1 ").replace("\nsnics = 1 ", "\nsnacks = 1 ")
    assert changed.count("\n") == text.count("\n") and changed != text
    problems = check(changed)
    assert "seed: scenario_keys.toml says 1, the reader's default is 0" in problems
    assert any(p.startswith("hardware.snics: read by the scenario reader, missing") for p in problems)
    assert any(p.startswith("hardware.snacks: in scenario_keys.toml, not read") for p in problems)


@pytest.mark.processes
def test_a_reader_that_goes_away_ends_the_listing_quietly() -> None:
    # `dualpath-emu catalog --json | head -c 10`: no BrokenPipeError traceback, the status of a broken pipe.
    import subprocess
    import sys

    code = ("import os, sys\nr, w = os.pipe()\nos.close(r)\nos.dup2(w, 1)\nfrom dualpath_emu.cli import main\n"
            "rc = main(['catalog', '--json'])\nprint(f'rc={rc}', file=sys.stderr)\nsys.exit(rc)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (141, b"rc=141\n")
