"""The hardware and model catalog: the one place for GPU, NIC, host and model numbers, each with its source.

Tags, as in ``paper-facts.md``: **[paper §x]** stated in the DualPath paper; **[datasheet]** the vendor's
public datasheet; **[config]** a public model config (Hugging Face ``config.json``); **[derived]** arithmetic
from those; **[assumed]** our choice where no source says.

**GPUs** (:data:`GPUS`, by name): dense (no 2:4 sparsity) BF16 and FP8 tensor FLOP/s, HBM capacity and
bandwidth. The paper says only "8 NVIDIA Hopper GPUs" per node (§7.1); :data:`DEFAULT_GPU` is the H800
[assumed: DeepSeek's own fleet, DeepSeek-V3 report §3.1]. HBM capacity is the datasheet's "GB" read as GiB
(HBM stacks are binary-sized: the H100's 80 GB is 5 stacks × 16 GiB); the driver exposes slightly less.

**Node** (:data:`TESTBED_NODE`): 8 GPUs, one 400 Gb/s compute NIC per GPU, one 400 Gb/s storage NIC, host
DRAM bandwidth ≈ 500 GB/s (all paper §4.2/§7.1); no PCIe link (not modelled: see :class:`NodeSpec`).

**Models** (:data:`MODELS`): ``ds660b`` (DeepSeek-V3.2), ``ds27b`` (the paper's down-scaled V3.2-like model,
App. A.2) and ``qwen32b`` (Qwen2.5-32B). Each is built from its architecture (:class:`DeepSeekArch`,
:class:`GqaArch`) so that every derived number can be traced to a config field:

* KV bytes per token per layer. MLA in FlashMLA's FP8 layout: ``kv_lora_rank`` FP8 bytes + one FP32 scale per
  128 of them + ``qk_rope_head_dim`` BF16 values = 512 + 16 + 128 = **656 B** (V3.2). The DSA indexer keeps a
  separate FP8 key cache (``index_head_dim`` + one FP32 scale = 132 B for V3.2) that is *not* counted in the
  KV bytes (as in paper-facts §2.2/§2.3) but is read by the indexer. GQA: K and V × KV heads × head dim ×
  2 B (FP16) = **4,096 B** (Qwen2.5-32B).
* Parameters, counted per projection from the config (norms ignored; Qwen's QKV biases counted). ``active_params``
  is what one token multiplies through: every attention, indexer, dense-FFN and activated-expert (routed +
  shared) weight, the router and the output head -- *not* the input embedding, which is a lookup. V3.2:
  37.5 B (DeepSeek publishes "37B activated"; our count with both embedding tables and without the V3.2
  indexer is 37.55 B), 671.9 B total (published 671 B, without the MTP module). Qwen2.5-32B: 32.0 B of
  32.76 B total (the model card says 32.5 B). ds27b: 4.29 B active of 27.2 B total [derived, see
  :data:`DS27B_ARCH` for the assumed dimensions].
* FLOPs per new token at context ``L`` (the number of keys it attends to, itself included) =
  ``2 × active_params`` (the GEMMs) + ``layers × attention FLOPs per layer``:

  - MLA with DSA (weights absorbed, attention in the 512-dim latent space): each attended key costs
    ``2 × heads × (kv_lora + rope)`` for the scores plus ``2 × heads × kv_lora`` for the values
    (278,528 FLOPs per key per layer for V3.2); the main attention attends to ``min(L, top_k)`` keys, and the
    lightning indexer scores all ``L`` keys at ``2 × index_heads × index_head_dim`` each (16,384 for V3.2;
    its per-head weighting and ReLU are ignored). The absorbed projections are weights, hence in
    ``active_params``.
  - GQA: full attention, ``2 × q_heads × head_dim`` for scores plus the same for values per key per layer
    (20,480 for Qwen2.5-32B), over all ``L`` keys.

  V3.2 at L = 32,721: 75.0 G (GEMMs) + 34.8 G (main attention) + 32.7 G (indexer) = 142.5 GFLOP, matching
  paper-facts §2.3's ≈142 G.
* MoE all-to-all bytes per token per MoE layer [assumed, DeepEP's formats]: dispatch sends the hidden state
  in FP8 with one FP32 scale per 128 channels to each of the ``activated`` routed experts; combine returns
  BF16 (2 B per channel) from each. Shared experts run locally (no traffic). Dense models: 0. These are upper
  bounds: copies to experts on the sender's own GPU (or, with DeepEP's node-level dedupe, its node) do not
  cross the network; a caller applies its EP layout.
* Weight bytes per GPU (:meth:`ModelSpec.weight_bytes_per_gpu`): every non-routed-expert weight plus the
  GPU's 1/EP share of the routed experts, at 1 B/param (FP8 checkpoint; its few BF16 tensors ignored) for
  DeepSeek, 2 B/param (BF16) for Qwen.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from dualpath_emu.errors import InvalidArgumentError, UnknownNameError

__all__ = [
    "DEFAULT_GPU",
    "DS27B_ARCH",
    "DS660B_ARCH",
    "GPUS",
    "MODELS",
    "QWEN32B_ARCH",
    "TESTBED_NODE",
    "AttentionKind",
    "DeepSeekArch",
    "GemmDtype",
    "GpuSpec",
    "GqaArch",
    "ModelSpec",
    "NodeSpec",
    "ParamCounts",
    "deepseek_model",
    "gpu",
    "gqa_model",
    "model",
]

GemmDtype = Literal["bf16", "fp8"]
"""The number format a model's weight GEMMs run in; selects the GPU's peak (:meth:`GpuSpec.peak_flops_per_s`)."""

_GIB: Final = 1 << 30
_TB: Final = 1e12


# --------------------------------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GpuSpec:
    """One GPU kind: dense tensor-core peaks, HBM capacity and bandwidth."""

    name: str
    bf16_flops_per_s: float
    """Dense BF16 tensor FLOP/s (no 2:4 sparsity)."""
    fp8_flops_per_s: float
    """Dense FP8 tensor FLOP/s (no 2:4 sparsity)."""
    hbm_bytes: int
    hbm_bytes_per_s: float
    source: str

    def peak_flops_per_s(self, dtype: GemmDtype) -> float:
        """The dense peak for ``dtype``."""
        return self.fp8_flops_per_s if dtype == "fp8" else self.bf16_flops_per_s


GPUS: Final[Mapping[str, GpuSpec]] = MappingProxyType(
    {
        # H800 SXM5: H100 SXM compute and memory, NVLink cut to 400 GB/s (irrelevant here) [datasheet].
        "h800": GpuSpec("H800 SXM5", 989.4e12, 1978.9e12, 80 * _GIB, 3.35 * _TB, "NVIDIA H800 datasheet"),
        "h100": GpuSpec("H100 SXM5", 989.4e12, 1978.9e12, 80 * _GIB, 3.35 * _TB, "NVIDIA H100 datasheet"),
        "h200": GpuSpec("H200 SXM", 989.4e12, 1978.9e12, 141 * _GIB, 4.8 * _TB, "NVIDIA H200 datasheet"),
        # H20: export-limited Hopper, ~15% of H100 compute, more and faster HBM [datasheet].
        "h20": GpuSpec("H20", 148e12, 296e12, 96 * _GIB, 4.0 * _TB, "NVIDIA H20 datasheet"),
    }
)
DEFAULT_GPU: Final = "h800"
"""The paper does not name its Hopper SKU (§7.1); DeepSeek runs H800s [assumed]."""


# --------------------------------------------------------------------------------------------------- node


@dataclass(frozen=True)
class NodeSpec:
    """One node of the testbed: GPUs, NICs, host memory bandwidth.

    No PCIe rate: PCIe is not modelled. A Gen5 ×16 link carries 63 GB/s each way (32 GT/s × 16 × 128/130 / 8
    [derived]), more than the 50 GB/s compute NIC every GPU byte crosses under the CNIC-centric rule (§5.1),
    so the CNIC is the binding port (:mod:`~dualpath_emu.cluster.topology`).
    """

    gpus: int
    cnic_bytes_per_s: float
    """Per compute NIC; there is one per GPU."""
    snic_bytes_per_s: float
    """Per storage NIC."""
    snics: int
    host_dram_bytes_per_s: float

    @property
    def cnics(self) -> int:
        """One compute NIC paired with each GPU (§7.1)."""
        return self.gpus


TESTBED_NODE: Final = NodeSpec(
    gpus=8,  # [paper §7.1]
    cnic_bytes_per_s=50e9,  # 400 Gb/s InfiniBand [paper §7.1]
    snic_bytes_per_s=50e9,  # 400 Gb/s, "Bs ≈ 50 GB/s" [paper §4.2, §7.1]
    snics=1,  # [paper §7.1]
    host_dram_bytes_per_s=500e9,  # "M ≈ 500 GB/s", an analysis value, not measured [paper §4.2]
)


# --------------------------------------------------------------------------------------------------- models


class AttentionKind(enum.Enum):
    """How a model attends: MLA with DeepSeek Sparse Attention (top-k keys chosen by an indexer), or GQA."""

    MLA_DSA = "mla-dsa"
    GQA = "gqa"


@dataclass(frozen=True)
class ModelSpec:
    """The numbers the emulator needs of one model; see the module docstring for every formula."""

    name: str
    description: str
    source: str
    layers: int
    moe_layers: int
    """Layers with an MoE FFN (the others are dense); 0 for a dense model."""
    hidden: int
    attention: AttentionKind
    attention_flops_per_key_layer: int
    """Main-attention FLOPs for one query token and one attended key, in one layer."""
    sparse_top_k: int | None
    """DSA: keys the main attention attends to at most; None for full attention."""
    indexer_flops_per_key_layer: int
    """DSA lightning indexer FLOPs per query token and scored key, in one layer; 0 without DSA."""
    kv_bytes_per_token_layer: int
    kv_dtype: str
    indexer_kv_bytes_per_token_layer: int
    """DSA indexer key cache per token per layer (not part of the KV above); 0 without DSA."""
    active_params: float
    """Weights one token multiplies through (input embedding excluded)."""
    total_params: float
    routed_expert_params: float
    weight_bytes_per_param: float
    gemm_dtype: GemmDtype
    activated_experts: int
    """Routed experts per token (shared ones excluded); 0 for a dense model."""
    a2a_dispatch_bytes_per_token_layer: int
    """MoE dispatch bytes per token per MoE layer, all its routed experts together (an upper bound)."""
    a2a_combine_bytes_per_token_layer: int
    """MoE combine bytes per token per MoE layer, all its routed experts together (an upper bound)."""

    def __post_init__(self) -> None:
        if (self.attention is AttentionKind.MLA_DSA) != (self.sparse_top_k is not None):
            raise InvalidArgumentError(f"{self.name}: sparse_top_k is set exactly for MLA_DSA models")

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all layers (the indexer cache excluded)."""
        return self.kv_bytes_per_token_layer * self.layers

    @property
    def gemm_flops_per_token(self) -> float:
        """The weight GEMMs of one token through the whole model: 2 FLOPs per active parameter."""
        return 2.0 * self.active_params

    def attended_keys(self, context_tokens: int) -> int:
        """Keys the main attention reads for a query with ``context_tokens`` keys before it (itself included)."""
        if self.sparse_top_k is None:
            return context_tokens
        return min(context_tokens, self.sparse_top_k)

    def attention_flops_per_layer(self, cached_tokens: int, new_tokens: int) -> int:
        """Attention FLOPs (main + indexer) in one layer for ``new_tokens`` queries after ``cached_tokens``.

        Causal and exact: the i-th new token (i = 1..new) attends over ``cached + i`` keys.
        """
        if cached_tokens < 0 or new_tokens < 0:
            raise InvalidArgumentError(f"token counts must be >= 0, got ({cached_tokens}, {new_tokens})")
        all_keys = _sum_capped(cached_tokens, new_tokens, None)
        main_keys = _sum_capped(cached_tokens, new_tokens, self.sparse_top_k)
        return self.attention_flops_per_key_layer * main_keys + self.indexer_flops_per_key_layer * all_keys

    def attention_flops_per_token(self, context_tokens: int) -> int:
        """Attention FLOPs (all layers) of one new token attending over ``context_tokens`` keys."""
        if context_tokens < 1:
            raise InvalidArgumentError(f"context_tokens must be >= 1, got {context_tokens}")
        return self.layers * self.attention_flops_per_layer(context_tokens - 1, 1)

    def flops_per_token(self, context_tokens: int) -> float:
        """Forward FLOPs of one new token attending over ``context_tokens`` keys: GEMMs + attention."""
        return self.gemm_flops_per_token + self.attention_flops_per_token(context_tokens)

    def weight_bytes_per_gpu(self, ep_degree: int = 1) -> float:
        """Weight bytes one GPU holds (and a decode step streams): everything but the routed experts, plus a
        1/``ep_degree`` share of those."""
        if ep_degree < 1:
            raise InvalidArgumentError(f"ep_degree must be >= 1, got {ep_degree}")
        shared = self.total_params - self.routed_expert_params
        return (shared + self.routed_expert_params / ep_degree) * self.weight_bytes_per_param


def _sum_capped(cached: int, new: int, cap: int | None) -> int:
    """Σ_{i=1..new} min(cached + i, cap) (no cap: Σ (cached + i)), in closed form."""
    if cap is None:
        return new * cached + new * (new + 1) // 2
    below = max(0, min(new, cap - cached))  # the first `below` positions are under the cap
    return below * cached + below * (below + 1) // 2 + (new - below) * cap


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of one model, derived from its architecture."""

    total: int
    active: int
    """Per token, input embedding excluded (see :attr:`ModelSpec.active_params`)."""
    routed_experts: int
    embedding: int
    """One vocabulary × hidden table."""


@dataclass(frozen=True)
class DeepSeekArch:
    """A DeepSeek-V3.2-style architecture (MLA + DSA + MoE), with the config's field names where it has them."""

    hidden_size: int
    num_hidden_layers: int
    first_k_dense_replace: int
    intermediate_size: int
    num_attention_heads: int
    q_lora_rank: int | None
    """None: no low-rank Q compression (ds27b, App. A.2), for the main attention and the indexer alike."""
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    vocab_size: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int

    def param_counts(self) -> ParamCounts:
        """Parameters, counted per projection; norms ignored."""
        h, heads = self.hidden_size, self.num_attention_heads
        qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        q_in = h if self.q_lora_rank is None else self.q_lora_rank
        q = h * heads * qk_dim if self.q_lora_rank is None else h * q_in + q_in * heads * qk_dim
        attn = (
            q
            + h * (self.kv_lora_rank + self.qk_rope_head_dim)  # kv_a: latent + shared RoPE key
            + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)  # kv_b
            + heads * self.v_head_dim * h  # o_proj
        )
        indexer = q_in * self.index_n_heads * self.index_head_dim + h * self.index_head_dim + h * self.index_n_heads
        dense_ffn = 3 * h * self.intermediate_size
        expert = 3 * h * self.moe_intermediate_size
        router = h * self.n_routed_experts
        moe_layers = self.num_hidden_layers - self.first_k_dense_replace
        embedding = self.vocab_size * h
        common = self.num_hidden_layers * (attn + indexer) + self.first_k_dense_replace * dense_ffn + embedding
        routed = moe_layers * self.n_routed_experts * expert
        total = common + routed + moe_layers * (self.n_shared_experts * expert + router) + embedding
        active = common + moe_layers * ((self.num_experts_per_tok + self.n_shared_experts) * expert + router)
        return ParamCounts(total=total, active=active, routed_experts=routed, embedding=embedding)


@dataclass(frozen=True)
class GqaArch:
    """A dense GQA transformer (Qwen2 family), with the config's field names."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool

    def param_counts(self) -> ParamCounts:
        """Parameters, counted per projection (QKV biases included, norms ignored)."""
        h = self.hidden_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attn = (h * q + q) + 2 * (h * kv + kv) + q * h
        layer = attn + 3 * h * self.intermediate_size
        embedding = self.vocab_size * h
        active = self.num_hidden_layers * layer + embedding  # the output head, same shape as the embedding
        total = active if self.tie_word_embeddings else active + embedding
        return ParamCounts(total=total, active=active, routed_experts=0, embedding=embedding)


DS660B_ARCH: Final = DeepSeekArch(
    # [config] deepseek-ai/DeepSeek-V3.2(-Exp) config.json
    hidden_size=7168,
    num_hidden_layers=61,
    first_k_dense_replace=3,
    intermediate_size=18432,
    num_attention_heads=128,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    n_routed_experts=256,
    n_shared_experts=1,
    num_experts_per_tok=8,
    moe_intermediate_size=2048,
    vocab_size=129280,
    index_n_heads=64,
    index_head_dim=128,
    index_topk=2048,
)

DS27B_ARCH: Final = DeepSeekArch(
    # [paper App. A.2] hidden, intermediate, layers, heads, experts, MoE intermediate, activated, shared,
    # dense layers, indexer heads/dim, top-k, no Q LoRA. [assumed, like V3.2] the MLA dims (kv_lora 512,
    # rope 64, nope 128, v 128) -- which also make its KV 656 B/token/layer -- and the vocabulary.
    hidden_size=2560,
    num_hidden_layers=30,
    first_k_dense_replace=1,
    intermediate_size=12288,
    num_attention_heads=32,
    q_lora_rank=None,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    n_routed_experts=72,
    n_shared_experts=2,
    num_experts_per_tok=6,
    moe_intermediate_size=1536,
    vocab_size=129280,
    index_n_heads=32,
    index_head_dim=64,
    index_topk=1024,
)

QWEN32B_ARCH: Final = GqaArch(
    # [config] Qwen/Qwen2.5-32B config.json
    hidden_size=5120,
    num_hidden_layers=64,
    intermediate_size=27648,
    num_attention_heads=40,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=152064,
    tie_word_embeddings=False,
)


def _fp8_with_scales_bytes(channels: int) -> int:
    """Bytes of ``channels`` values in FP8 with one FP32 scale per 128 (DeepSeek's fine-grained quantisation)."""
    return channels + channels // 128 * 4


def deepseek_model(name: str, description: str, source: str, arch: DeepSeekArch) -> ModelSpec:
    """The :class:`ModelSpec` of a DeepSeek-V3.2-style model: FP8 MLA KV, DSA, FP8 weights and GEMMs."""
    counts = arch.param_counts()
    heads, latent, rope = arch.num_attention_heads, arch.kv_lora_rank, arch.qk_rope_head_dim
    k = arch.num_experts_per_tok
    return ModelSpec(
        name=name,
        description=description,
        source=source,
        layers=arch.num_hidden_layers,
        moe_layers=arch.num_hidden_layers - arch.first_k_dense_replace,
        hidden=arch.hidden_size,
        attention=AttentionKind.MLA_DSA,
        attention_flops_per_key_layer=2 * heads * (latent + rope) + 2 * heads * latent,
        sparse_top_k=arch.index_topk,
        indexer_flops_per_key_layer=2 * arch.index_n_heads * arch.index_head_dim,
        kv_bytes_per_token_layer=_fp8_with_scales_bytes(latent) + 2 * rope,  # FlashMLA FP8 layout
        kv_dtype="fp8 (latent) + bf16 (rope)",
        indexer_kv_bytes_per_token_layer=arch.index_head_dim + 4,  # FP8 key + one FP32 scale
        active_params=float(counts.active),
        total_params=float(counts.total),
        routed_expert_params=float(counts.routed_experts),
        weight_bytes_per_param=1.0,
        gemm_dtype="fp8",
        activated_experts=k,
        a2a_dispatch_bytes_per_token_layer=k * _fp8_with_scales_bytes(arch.hidden_size),
        a2a_combine_bytes_per_token_layer=k * 2 * arch.hidden_size,
    )


def gqa_model(name: str, description: str, source: str, arch: GqaArch, kv_dtype_bytes: int) -> ModelSpec:
    """The :class:`ModelSpec` of a dense GQA model with BF16 weights and ``kv_dtype_bytes``-byte KV."""
    counts = arch.param_counts()
    per_key = 2 * arch.num_attention_heads * arch.head_dim  # QK^T, and again for the weighted sum of V
    return ModelSpec(
        name=name,
        description=description,
        source=source,
        layers=arch.num_hidden_layers,
        moe_layers=0,
        hidden=arch.hidden_size,
        attention=AttentionKind.GQA,
        attention_flops_per_key_layer=2 * per_key,
        sparse_top_k=None,
        indexer_flops_per_key_layer=0,
        kv_bytes_per_token_layer=2 * arch.num_key_value_heads * arch.head_dim * kv_dtype_bytes,
        kv_dtype={1: "fp8", 2: "fp16"}.get(kv_dtype_bytes, f"{kv_dtype_bytes} B"),
        indexer_kv_bytes_per_token_layer=0,
        active_params=float(counts.active),
        total_params=float(counts.total),
        routed_expert_params=0.0,
        weight_bytes_per_param=2.0,
        gemm_dtype="bf16",
        activated_experts=0,
        a2a_dispatch_bytes_per_token_layer=0,
        a2a_combine_bytes_per_token_layer=0,
    )


MODELS: Final[Mapping[str, ModelSpec]] = MappingProxyType(
    {
        "ds660b": deepseek_model(
            "ds660b", "DS 660B = DeepSeek-V3.2 (MLA + DSA, MoE)", "paper §7.2; DeepSeek-V3.2 config.json",
            DS660B_ARCH,
        ),
        "ds27b": deepseek_model(
            "ds27b", "DS 27B, the paper's down-scaled V3.2-like model", "paper App. A.2; MLA dims assumed as V3.2",
            DS27B_ARCH,
        ),
        "qwen32b": gqa_model(
            "qwen32b", "Qwen2.5-32B (dense, GQA), FP16 KV", "paper §7.2; Qwen2.5-32B config.json",
            QWEN32B_ARCH, kv_dtype_bytes=2,
        ),
    }
)


def gpu(name: str) -> GpuSpec:
    """The GPU called ``name``; :class:`~dualpath_emu.errors.UnknownNameError` lists the known ones."""
    try:
        return GPUS[name]
    except KeyError:
        raise UnknownNameError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}") from None


def model(name: str) -> ModelSpec:
    """The model called ``name``; :class:`~dualpath_emu.errors.UnknownNameError` lists the known ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise UnknownNameError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
