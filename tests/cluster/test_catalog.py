"""The catalog's model numbers against paper-facts §2, the roofline's arithmetic and monotonicity, Table 1 against
the paper's ranges, and ``dualpath-emu reproduce``."""

from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_emu.cli import main as cli_main
from dualpath_emu.cluster.catalog import GPUS, MODELS, TESTBED_NODE, GpuSpec, ModelSpec, gpu, model
from dualpath_emu.cluster.roofline import Roofline, RooflineParams
from dualpath_emu.errors import InvalidArgumentError, UnknownNameError
from dualpath_emu.reproduce import table1

DS660B = MODELS["ds660b"]
DS27B = MODELS["ds27b"]
QWEN = MODELS["qwen32b"]

# ------------------------------------------------------------------------------------------------ catalog


@pytest.mark.parametrize(
    ("name", "per_layer", "total", "indexer"),
    [("ds660b", 656, 40_016, 132), ("qwen32b", 4_096, 262_144, 0), ("ds27b", 656, 19_680, 68)],
)
def test_kv_bytes_per_token_match_paper_facts(name: str, per_layer: int, total: int, indexer: int) -> None:
    spec = model(name)
    assert spec.kv_bytes_per_token_layer == per_layer
    assert spec.kv_bytes_per_token == total
    assert spec.indexer_kv_bytes_per_token_layer == indexer


def test_model_shapes() -> None:
    assert (DS660B.layers, DS660B.moe_layers, DS660B.sparse_top_k) == (61, 58, 2048)
    assert DS660B.attention == "mla"
    assert (DS27B.layers, DS27B.moe_layers, DS27B.sparse_top_k) == (30, 29, 1024)
    assert (QWEN.layers, QWEN.moe_layers, QWEN.sparse_top_k, QWEN.attention) == (64, 0, None, "gqa")


def test_parameter_counts_match_published_figures() -> None:
    # The derivation that gives ds27b its numbers must reproduce what DeepSeek and Qwen publish.
    assert DS660B.arch is not None
    counts = DS660B.arch.param_counts()
    assert counts.total == pytest.approx(671e9, rel=0.01)
    assert counts.active == pytest.approx(37e9, rel=0.02)  # "37B activated"
    assert QWEN.total_params == pytest.approx(32.5e9, rel=0.015)
    assert DS27B.total_params == pytest.approx(27e9, rel=0.02)  # the name fits the assumed MLA dims
    assert DS27B.active_params < DS27B.total_params / 5
    assert QWEN.active_params < QWEN.total_params  # the input embedding is a lookup


def test_flops_per_token_v32_at_the_trace_mean_context() -> None:
    # paper-facts §2.3: ≈ 74 G (GEMMs) + 35 G (top-2048 main attention) + 33 G (indexer) ≈ 142 GFLOP.
    assert DS660B.flops_per_token(32_721) == pytest.approx(142e9, rel=0.15)
    assert DS660B.attention_flops_per_token(32_721) == 61 * (278_528 * 2048 + 16_384 * 32_721)


def test_dsa_main_attention_is_capped_at_top_k_and_gqa_is_not() -> None:
    k = DS660B.sparse_top_k
    assert k is not None
    below = DS660B.attention_flops_per_token(k) - DS660B.attention_flops_per_token(k - 1)
    above = DS660B.attention_flops_per_token(k + 2) - DS660B.attention_flops_per_token(k + 1)
    assert below == 61 * (278_528 + 16_384)
    assert above == 61 * 16_384  # only the indexer still grows
    step = QWEN.attention_flops_per_token(50_001) - QWEN.attention_flops_per_token(50_000)
    assert step == 64 * 4 * 40 * 128


@given(cached=st.integers(0, 5000), new=st.integers(0, 3000), which=st.sampled_from(["ds660b", "ds27b", "qwen32b"]))
def test_chunk_attention_flops_equal_the_causal_sum(cached: int, new: int, which: str) -> None:
    spec = model(which)
    expected = sum(spec.attention_flops_per_token(cached + i) for i in range(1, new + 1)) // spec.layers
    assert spec.attention_flops_per_layer(cached, new) == expected


def test_moe_all_to_all_bytes() -> None:
    # FP8 + an FP32 scale per 128 channels out, BF16 back, for each of the 8 routed experts.
    assert DS660B.a2a_dispatch_bytes_per_token_layer == 8 * (7168 + 56 * 4)
    assert DS660B.a2a_combine_bytes_per_token_layer == 8 * 7168 * 2
    assert (QWEN.a2a_dispatch_bytes_per_token_layer, QWEN.a2a_combine_bytes_per_token_layer) == (0, 0)


def test_gpus_and_node() -> None:
    assert set(GPUS) >= {"h800", "h100", "h200", "h20"}
    for spec in GPUS.values():
        assert spec.fp8_flops_per_s == pytest.approx(2 * spec.bf16_flops_per_s, rel=0.01)
    assert gpu("h200").hbm_bytes_per_s > gpu("h100").hbm_bytes_per_s
    assert gpu("h20").bf16_flops_per_s < gpu("h800").bf16_flops_per_s / 5
    assert (TESTBED_NODE.gpus, TESTBED_NODE.cnics, TESTBED_NODE.snics) == (8, 8, 1)
    assert TESTBED_NODE.cnic_bytes_per_s == TESTBED_NODE.snic_bytes_per_s == 50e9
    assert TESTBED_NODE.host_dram_bytes_per_s == 500e9


def test_unknown_names_are_lookup_errors() -> None:
    with pytest.raises(UnknownNameError, match="unknown GPU 'a100'; known: h800"):
        gpu("a100")
    with pytest.raises(LookupError, match="unknown model 'llama'"):
        model("llama")


# ------------------------------------------------------------------------------------------------ roofline

TOY_GPU = GpuSpec(
    "toy",
    "toy",
    "test",
    bf16_flops_per_s=1e12,
    fp8_flops_per_s=2e12,
    hbm_bytes=10**12,
    hbm_bytes_per_s=1e11,
    nvlink_bytes_per_s=160e9,
)


def toy_model(top_k: int | None = None) -> ModelSpec:
    return ModelSpec(
        name="toy",
        description="toy",
        source="test",
        layers=2,
        moe_layers=0,
        hidden=8,
        attention="gqa" if top_k is None else "mla",
        attention_flops_per_key_layer=1000,
        sparse_top_k=top_k,
        indexer_flops_per_key_layer=0 if top_k is None else 10,
        kv_bytes_per_token_layer=100,
        kv_dtype="fp16",
        indexer_kv_bytes_per_token_layer=0 if top_k is None else 10,
        active_params=1e6,
        total_params=1e6,
        routed_expert_params=0.0,
        weight_bytes_per_param=2.0,
        gemm_dtype="bf16",
        activated_experts=0,
        a2a_dispatch_bytes_per_token_layer=0,
        a2a_combine_bytes_per_token_layer=0,
    )


HALF = RooflineParams(gemm_efficiency=0.5, attention_efficiency=0.5, memory_efficiency=0.5)


def test_roofline_prefill_by_hand() -> None:
    times = Roofline(TOY_GPU, toy_model(), params=HALF).prefill([(3, 2)])
    # attention: 1000 × (4 + 5) FLOPs at 0.5 TFLOP/s = 18 ns; 5 keys × 100 B at 50 GB/s = 10 ns -> compute-bound
    assert times.attention_s == pytest.approx(1.8e-8, rel=1e-12)
    # other: 2 × 1e6 × 2 tokens / 2 layers = 2e6 FLOPs -> 4 µs; 2e6 B of weights / 2 layers at 50 GB/s -> 20 µs
    assert times.other_s == pytest.approx(2e-5, rel=1e-12)
    assert times.total_s == pytest.approx(2 * (1.8e-8 + 2e-5), rel=1e-12)


def test_roofline_decode_by_hand() -> None:
    gqa = Roofline(TOY_GPU, toy_model(), params=HALF).decode_step(batch_size=2, context_tokens=10)
    # 1000 × 10 FLOPs -> 20 ns; 10 keys × 100 B -> 20 ns; the weights as in prefill -> 20 µs
    assert gqa.attention_s == pytest.approx(2e-8, rel=1e-12)
    assert gqa.other_s == pytest.approx(2e-5, rel=1e-12)
    # DSA, top-4: min(20, 2 × 4) = 8 keys attended: 8,000 + 10 × 20 FLOPs -> 16.4 ns; 800 + 200 B -> 20 ns
    dsa = Roofline(TOY_GPU, toy_model(top_k=4), params=HALF).decode_step(batch_size=2, context_tokens=20)
    assert dsa.attention_s == pytest.approx(2e-8, rel=1e-12)
    overhead = RooflineParams(0.5, 0.5, 0.5, overhead_s_per_layer=1e-3)
    assert Roofline(TOY_GPU, toy_model(), params=overhead).prefill([(3, 2)]).other_s == pytest.approx(2e-5 + 1e-3)


def test_empty_batches_take_no_time() -> None:
    r = Roofline(TOY_GPU, toy_model())
    assert r.prefill([]).total_s == r.prefill([(100, 0)]).total_s == r.decode_step(0, 0).total_s == 0.0
    assert r.attention_s_per_layer([]) == 0.0


def test_roofline_rejects_bad_input() -> None:
    with pytest.raises(InvalidArgumentError, match="ds660b at ep_degree=8 needs"):
        Roofline(gpu("h800"), DS660B, ep_degree=8)
    Roofline(gpu("h800"), DS660B, ep_degree=16)
    with pytest.raises(ValueError, match="memory_efficiency: must be in"):
        RooflineParams(memory_efficiency=0.0)
    with pytest.raises(ValueError, match="batch_size"):
        Roofline(TOY_GPU, toy_model()).decode_step(batch_size=3, context_tokens=2)


ROOFLINES = {
    name: Roofline(gpu("h800"), model(name), ep_degree=ep)
    for name, ep in [("ds660b", 16), ("ds27b", 1), ("qwen32b", 1)]
}
requests = st.lists(st.tuples(st.integers(0, 70_000), st.integers(1, 4_000)), min_size=1, max_size=8)


@given(
    which=st.sampled_from(sorted(ROOFLINES)),
    batch=requests,
    more_new=st.integers(1, 2000),
    more_cached=st.integers(1, 20_000),
)
def test_prefill_time_grows_with_every_token(
    which: str, batch: list[tuple[int, int]], more_new: int, more_cached: int
) -> None:
    r = ROOFLINES[which]
    base = r.prefill(batch)
    (cached, new), rest = batch[0], batch[1:]
    assert r.prefill([(cached, new + more_new), *rest]).total_s >= base.total_s
    assert r.prefill([(cached + more_cached, new), *rest]).attention_s >= base.attention_s
    assert r.prefill([*batch, (cached, new)]).total_s > base.total_s
    assert r.attention_s_per_layer(batch) == base.attention_s


@given(
    which=st.sampled_from(sorted(ROOFLINES)),
    batch=st.integers(1, 256),
    mean_context=st.integers(1, 70_000),
    extra=st.integers(1, 100_000),
)
def test_decode_time_grows_with_batch_and_context(which: str, batch: int, mean_context: int, extra: int) -> None:
    r = ROOFLINES[which]
    base = r.decode_step(batch, batch * mean_context).total_s
    assert r.decode_step(batch, batch * mean_context + extra).total_s >= base
    assert r.decode_step(batch + 1, batch * mean_context + extra).total_s >= base


def test_v32_decode_is_memory_bound_and_prefill_compute_bound() -> None:
    r = ROOFLINES["ds660b"]
    decode = r.decode_step(32, 32 * 32_721)
    weight_read_s = DS660B.weight_bytes_per_gpu(16) / DS660B.layers / (gpu("h800").hbm_bytes_per_s * 0.8)
    assert decode.other_s == pytest.approx(weight_read_s)
    assert 0.005 < decode.total_s < 0.05  # a TPOT the paper's 50 ms SLO can hold
    prefill = r.prefill([(32_721, 429)] * 16)
    gemm_s = 16 * 429 * 2 * DS660B.active_params / 61 / (gpu("h800").fp8_flops_per_s * 0.6)
    # plus the MoE layers' fixed all-to-all latency, spread over the layers
    assert prefill.other_s == pytest.approx(gemm_s + 87e-6 * DS660B.moe_layers / DS660B.layers)


# DeepEP's low-latency kernels, H800 + CX7 400 Gb/s, 128 tokens, top-8, hidden 7,168 (its README), dispatch +
# combine in µs, by EP degree.
DEEPEP_LL_US = {8: 77 + 114, 16: 118 + 195, 32: 155 + 273}


@pytest.mark.parametrize(("ep", "tolerance"), [(8, 0.12), (16, 0.02), (32, 0.02)])
def test_decode_all_to_all_follows_deepep(ep: int, tolerance: float) -> None:
    # One MoE layer's dispatch + combine at 128 tokens per GPU: a2a_fixed_s plus the larger of the bytes to
    # other nodes over the 50 GB/s NIC and to the node's other GPUs over NVLink. Dispatch and combine are
    # modelled as one, so compare their sum.
    # (EP8 on H200s, where DS 660B's weights fit 8 GPUs; the NICs and NVLink are the same)
    r = Roofline(gpu("h800" if ep >= 16 else "h200"), DS660B, ep_degree=ep)
    measured_s = r.a2a_s(128)
    assert measured_s == pytest.approx(DEEPEP_LL_US[ep] * 1e-6, rel=tolerance)


def test_an_ep_group_steps_at_its_slowest_rank() -> None:
    r = ROOFLINES["ds660b"]
    alone = r.ep_decode_step_s([(8, 8 * 30_000)])
    assert alone == r.decode_step_s(8, 8 * 30_000)
    # one rank with a longer context and another with a larger batch: the step takes the worst of each
    mixed = r.ep_decode_step_s([(8, 8 * 30_000), (4, 4 * 60_000), (16, 16 * 1_000), (0, 0)])
    attention = max(r.decode_step(b, c).attention_s for b, c in [(8, 8 * 30_000), (4, 4 * 60_000), (16, 16_000)])
    expected = DS660B.layers * (attention + r.decode_step(16, 16_000).other_s) + DS660B.moe_layers * r.a2a_s(16)
    assert mixed == pytest.approx(expected, rel=1e-12)
    assert mixed > alone
    assert r.ep_decode_step_s([(0, 0), (0, 0)]) == 0.0
    # a dense model has no all-to-all
    assert ROOFLINES["qwen32b"].a2a_s(128) == 0.0
    step = ROOFLINES["qwen32b"].decode_step(4, 4 * 1000)
    assert ROOFLINES["qwen32b"].decode_step_s(4, 4 * 1000) == pytest.approx(step.total_s, rel=1e-12)


# ------------------------------------------------------------------------------------------------ Table 1


def test_table1_ends_within_ten_percent_of_the_paper() -> None:
    by_model = {row.model: row for row in table1.rows()}
    assert by_model["qwen32b"].ends_within_tolerance is True
    assert by_model["ds660b"].ends_within_tolerance is True
    assert by_model["ds27b"].paper_range is None and by_model["ds27b"].ends_within_tolerance is None
    for row in by_model.values():
        assert list(row.gb_per_pflop) == sorted(row.gb_per_pflop)  # more context, more bytes per FLOP


@pytest.mark.parametrize(
    ("name", "context", "reconstructed"),
    [
        ("ds660b", 16_384, 12.2),
        ("ds660b", 32_721, 21.6),
        ("ds660b", 65_536, 35.1),
        ("qwen32b", 16_384, 115.8),
        ("qwen32b", 65_536, 265.4),
    ],
)
def test_table1_close_to_the_public_config_reconstruction(name: str, context: int, reconstructed: float) -> None:
    value = table1.cache_compute_ratio_gb_per_pflop(model(name), context)
    assert value == pytest.approx(reconstructed, rel=0.02)


def test_reproduce_table1_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["reproduce", "table1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["experiment"] == "table1" and all(result["checks"].values())
    rows = {row["model"]: row for row in result["rows"]}
    assert rows["ds660b"]["contexts"] == [16_384, 32_721, 49_152, 65_536]
    assert rows["ds660b"]["paper_range"] == [13.0, 36.0]
    assert rows["ds660b"]["ends_within_tolerance"] is True
    assert rows["ds27b"]["paper_range"] is None
    assert [c["paper"] for c in result["comparisons"]] == [117.0, 267.0, 13.0, 36.0]
    assert all(c["met"] for c in result["comparisons"])


def test_reproduce_table1_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli_main(["reproduce", "table1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "13-36" in out and "117-267" in out and "no row" in out
    assert {p.name for p in tmp_path.iterdir()} == {"table1.csv", "table1.json", "table1.png"}


def test_reproduce_unknown_experiment_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["reproduce", "fig99"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'fig99'" in err and "Traceback" not in err


@pytest.mark.processes
def test_the_parser_does_not_import_the_experiments() -> None:
    code = (
        "import sys; from dualpath_emu.cli import build_parser; build_parser(); "
        "assert 'dualpath_emu.reproduce.table1' not in sys.modules; "
        "assert 'dualpath_emu.cluster.catalog' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@given(which=st.sampled_from(sorted(ROOFLINES)), batch=st.integers(0, 512), context=st.integers(0, 40_000_000))
def test_the_decode_engines_fast_step_time_is_decode_step_to_the_bit(which: str, batch: int, context: int) -> None:
    r = ROOFLINES[which]
    context = max(context, batch)
    step = r.decode_step(batch, context)
    m, overhead = r.model, r.params.overhead_s_per_layer
    expected = m.layers * (step.attention_s + step.other_s + overhead) + m.moe_layers * r.a2a_s(batch) if batch else 0.0
    assert r.decode_step_s(batch, context) == expected
