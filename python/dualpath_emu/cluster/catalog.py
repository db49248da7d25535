"""The model, GPU and NIC catalog: every number the emulator uses of a model or a piece of hardware, and its source.

The packaged entries are data (``catalog.toml``), a scenario adds its own in the same form; :meth:`ModelArch.spec`
derives the :class:`ModelSpec` the engines use (KV bytes per token, parameters, FLOPs per token, all-to-all bytes,
weight bytes per GPU) from a Hugging Face config's fields. The formulas, their sources and checks against published
figures: docs/compute-model.md."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final, Literal, TypeVar, cast

from dualpath_emu.config import ScenarioError, Table, format_bound, load_toml
from dualpath_emu.errors import InvalidArgumentError, UnknownNameError

__all__ = [
    "ATTENTIONS", "DEFAULT_GPU", "GPUS", "KIND", "MODELS", "NICS", "PACKAGED", "PACKAGED_FILE", "TESTBED_NODE",
    "Attention", "Catalog", "GemmDtype", "GpuSpec", "ModelArch", "ModelSpec", "NicSpec", "NodeSpec", "ParamCounts",
    "gpu", "model", "read_entries",
]  # fmt: skip

GemmDtype = Literal["bf16", "fp8", "fp4"]
"""The number format a model's weights are stored and its GEMMs run in (:meth:`GpuSpec.peak_flops_per_s`)."""
GEMM_DTYPES: Final[tuple[GemmDtype, ...]] = ("bf16", "fp8", "fp4")
WEIGHT_BYTES_PER_PARAM: Final[Mapping[str, float]] = MappingProxyType({"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625})
KvDtype = Literal["bf16", "fp16", "fp8"]
KV_DTYPES: Final[tuple[KvDtype, ...]] = ("bf16", "fp16", "fp8")
Attention = Literal["mha", "gqa", "mla"]
ATTENTIONS: Final[tuple[Attention, ...]] = ("mha", "gqa", "mla")
KIND: Final = "catalog"  # What a catalog file says at its top: ``kind = "catalog"``.

_GIB: Final = 1 << 30
_T = TypeVar("_T")


# --------------------------------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GpuSpec:
    """One GPU kind: dense tensor-core peaks, HBM capacity and bandwidth, NVLink all-to-all rate."""

    name: str
    description: str
    source: str
    bf16_flops_per_s: float  # Dense BF16 tensor FLOP/s (no 2:4 sparsity); attention runs at this peak.
    fp8_flops_per_s: float  # Dense FP8 tensor FLOP/s; 0: no FP8 tensor cores.
    hbm_bytes: int
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    """What an MoE all-to-all reaches between the GPUs of one node (a decode step's intra-node part)."""
    fp4_flops_per_s: float = 0.0  # Dense FP4 tensor FLOP/s; 0: no FP4 tensor cores.

    def peak_flops_per_s(self, dtype: GemmDtype) -> float:
        """The dense peak for ``dtype`` (0 if the GPU has none)."""
        return {"bf16": self.bf16_flops_per_s, "fp8": self.fp8_flops_per_s, "fp4": self.fp4_flops_per_s}[dtype]


@dataclass(frozen=True)
class NicSpec:
    """One NIC kind: its line rate in bytes per second, each way."""

    name: str
    description: str
    source: str
    bytes_per_s: float


# --------------------------------------------------------------------------------------------------- node


@dataclass(frozen=True)
class NodeSpec:
    """One node of the testbed: GPUs, NICs, host memory bandwidth (no PCIe: the CNIC binds, §5.1)."""

    gpus: int
    cnic_bytes_per_s: float  # Per compute NIC; there is one per GPU.
    snic_bytes_per_s: float
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


@dataclass(frozen=True)
class ModelArch:
    """A transformer's architecture, by the Hugging Face config's field names; 0 where one does not apply."""

    attention: Attention
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    vocab_size: int
    weight_dtype: GemmDtype
    kv_dtype: KvDtype
    tie_word_embeddings: bool = False
    # MHA / GQA
    num_key_value_heads: int = 0
    head_dim: int = 0
    attention_bias: bool = False  # Biases on the Q, K and V projections (Qwen2).
    # MLA
    q_lora_rank: int = 0
    """0: no low-rank Q compression (ds27b, App. A.2), for the main attention and the indexer alike."""
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # sparse attention (DSA)
    index_topk: int = 0  # Keys the main attention attends to at most; 0: dense attention.
    index_n_heads: int = 0
    index_head_dim: int = 0
    # FFN
    intermediate_size: int = 0
    """The dense FFN's width (every layer of a dense model, the first ``first_k_dense_replace`` of an MoE)."""
    first_k_dense_replace: int = 0
    n_routed_experts: int = 0
    num_experts_per_tok: int = 0
    n_shared_experts: int = 0
    moe_intermediate_size: int = 0

    @property
    def kv_heads(self) -> int:
        """MHA/GQA: the KV heads (MHA: one per query head)."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def dims_per_head(self) -> int:
        """MHA/GQA: the head dimension (``hidden_size / num_attention_heads`` where not given)."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def moe_layers(self) -> int:
        return self.num_hidden_layers - self.first_k_dense_replace if self.n_routed_experts else 0

    def param_counts(self) -> ParamCounts:
        """Parameters, counted per projection; norms ignored."""
        h, heads, layers = self.hidden_size, self.num_attention_heads, self.num_hidden_layers
        if self.attention == "mla":
            qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
            q_in = self.q_lora_rank or h
            q = h * heads * qk_dim if not self.q_lora_rank else h * q_in + q_in * heads * qk_dim
            attn = (q + h * (self.kv_lora_rank + self.qk_rope_head_dim)  # kv_a: latent + shared RoPE key
                    + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)  # kv_b
                    + heads * self.v_head_dim * h)  # o_proj  # fmt: skip
        else:
            q_in = h
            q_dim, kv_dim = heads * self.dims_per_head, self.kv_heads * self.dims_per_head
            bias = self.attention_bias
            attn = (h * q_dim + bias * q_dim) + 2 * (h * kv_dim + bias * kv_dim) + q_dim * h
        indexer = 0
        if self.index_topk:
            indexer = q_in * self.index_n_heads * self.index_head_dim + h * self.index_head_dim + h * self.index_n_heads
        moe_layers = self.moe_layers
        dense_layers = layers - moe_layers
        expert = 3 * h * self.moe_intermediate_size
        router = h * self.n_routed_experts
        embedding = self.vocab_size * h
        # The output head has the embedding's shape and is in every count; the input table only in the total.
        common = layers * (attn + indexer) + dense_layers * 3 * h * self.intermediate_size + embedding
        routed = moe_layers * self.n_routed_experts * expert
        total = common + routed + moe_layers * (self.n_shared_experts * expert + router)
        total += 0 if self.tie_word_embeddings else embedding
        active = common + moe_layers * ((self.num_experts_per_tok + self.n_shared_experts) * expert + router)
        return ParamCounts(total=total, active=active, routed_experts=routed, embedding=embedding)

    def kv_bytes_per_token_layer(self) -> int:
        """KV bytes of one token in one layer (module docstring)."""
        if self.attention == "mla":
            if self.kv_dtype == "fp8":  # FlashMLA's layout
                return _fp8_with_scales_bytes(self.kv_lora_rank) + 2 * self.qk_rope_head_dim
            return 2 * (self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.kv_heads * self.dims_per_head * (1 if self.kv_dtype == "fp8" else 2)

    def spec(self, name: str, description: str = "", source: str = "", *, total_params: float = 0.0,
             active_params: float = 0.0, kv_bytes_per_token_layer: int = 0) -> ModelSpec:  # fmt: skip
        """The :class:`ModelSpec` of this architecture; a non-zero keyword overrides the derived number."""
        counts = self.param_counts()
        heads, k = self.num_attention_heads, self.num_experts_per_tok
        if self.attention == "mla":
            per_key = 2 * heads * (self.kv_lora_rank + self.qk_rope_head_dim) + 2 * heads * self.kv_lora_rank
        else:
            per_key = 2 * (2 * heads * self.dims_per_head)  # QK^T, and again for the weighted sum of V
        kv_dtype = "fp8 (latent) + bf16 (rope)" if self.attention == "mla" and self.kv_dtype == "fp8" else self.kv_dtype
        sparse, moe = bool(self.index_topk), bool(self.n_routed_experts)
        # The indexer's key cache: FP8 keys and one FP32 scale.
        return ModelSpec(
            name=name, description=description or name, source=source, layers=self.num_hidden_layers,
            moe_layers=self.moe_layers, hidden=self.hidden_size, attention=self.attention,
            attention_flops_per_key_layer=per_key, sparse_top_k=self.index_topk or None,
            indexer_flops_per_key_layer=2 * self.index_n_heads * self.index_head_dim if sparse else 0,
            kv_bytes_per_token_layer=kv_bytes_per_token_layer or self.kv_bytes_per_token_layer(), kv_dtype=kv_dtype,
            indexer_kv_bytes_per_token_layer=self.index_head_dim + 4 if sparse else 0,
            active_params=active_params or float(counts.active), total_params=total_params or float(counts.total),
            routed_expert_params=float(counts.routed_experts),
            weight_bytes_per_param=WEIGHT_BYTES_PER_PARAM[self.weight_dtype], gemm_dtype=self.weight_dtype,
            activated_experts=k if moe else 0,
            a2a_dispatch_bytes_per_token_layer=k * _fp8_with_scales_bytes(self.hidden_size) if moe else 0,
            a2a_combine_bytes_per_token_layer=k * 2 * self.hidden_size if moe else 0, arch=self,
        )  # fmt: skip


def _fp8_with_scales_bytes(channels: int) -> int:
    """Bytes of ``channels`` values in FP8 with one FP32 scale per 128 (DeepSeek's fine-grained quantisation)."""
    return channels + channels // 128 * 4


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of one model, derived from its architecture."""

    total: int
    active: int  # Per token, input embedding excluded (see :attr:`ModelSpec.active_params`).
    routed_experts: int
    embedding: int  # One vocabulary × hidden table.


@dataclass(frozen=True)
class ModelSpec:
    """The numbers the emulator needs of one model; see the module docstring for every formula."""

    name: str
    description: str
    source: str
    layers: int
    moe_layers: int  # Layers with an MoE FFN (the others are dense); 0 for a dense model.
    hidden: int
    attention: Attention
    attention_flops_per_key_layer: int  # Main-attention FLOPs for one query token and one attended key, in one layer.
    sparse_top_k: int | None  # DSA: keys the main attention attends to at most; None for full attention.
    indexer_flops_per_key_layer: int
    """DSA lightning indexer FLOPs per query token and scored key, in one layer; 0 without DSA."""
    kv_bytes_per_token_layer: int
    kv_dtype: str
    indexer_kv_bytes_per_token_layer: int
    """DSA indexer key cache per token per layer (not part of the KV above); 0 without DSA."""
    active_params: float  # Weights one token multiplies through (input embedding excluded).
    total_params: float
    routed_expert_params: float
    weight_bytes_per_param: float
    gemm_dtype: GemmDtype
    activated_experts: int  # Routed experts per token (shared ones excluded); 0 for a dense model.
    a2a_dispatch_bytes_per_token_layer: int
    """MoE dispatch bytes per token per MoE layer, all its routed experts together (an upper bound)."""
    a2a_combine_bytes_per_token_layer: int
    """MoE combine bytes per token per MoE layer, all its routed experts together (an upper bound)."""
    arch: ModelArch | None = None  # The architecture these numbers were derived from (None: given directly).

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all layers (the indexer cache excluded)."""
        return self.kv_bytes_per_token_layer * self.layers

    @property
    def gemm_flops_per_token(self) -> float:
        """The weight GEMMs of one token through the whole model: 2 FLOPs per active parameter."""
        return 2.0 * self.active_params

    def attention_flops_per_layer(self, cached_tokens: int, new_tokens: int) -> int:
        """Attention FLOPs in one layer for ``new_tokens`` after ``cached_tokens`` (token i attends ``cached + i``)."""
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
        """Weight bytes one GPU holds (a decode step streams): all but the routed experts, plus a 1/EP share of them."""
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


# --------------------------------------------------------------------------------------------------- reading

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
_MAX_DIM: Final = 1 << 16
"""The largest head count, head dimension, rank or expert count accepted (far above any model's)."""
_MAX_WIDTH: Final = 1 << 22  # The largest hidden or FFN width accepted.
_MAX_PARAMS: Final = 1e16


@dataclass(frozen=True)
class Catalog:
    """Models, GPUs and NICs by name, and where each was defined; an unknown name lists the known ones."""

    models: Mapping[str, ModelSpec] = field(default_factory=dict)
    gpus: Mapping[str, GpuSpec] = field(default_factory=dict)
    nics: Mapping[str, NicSpec] = field(default_factory=dict)
    origin: Mapping[str, str] = field(default_factory=dict)

    def model(self, name: str) -> ModelSpec:
        return _lookup(self.models, name, "model")

    def gpu(self, name: str) -> GpuSpec:
        return _lookup(self.gpus, name, "GPU")

    def nic(self, name: str) -> NicSpec:
        return _lookup(self.nics, name, "NIC")

    def with_entries(self, top: Table) -> Catalog:
        """This catalog and ``top``'s own entries (:func:`read_entries`); a name defined twice is an error."""
        new = read_entries(top)
        merged: dict[str, dict[str, object]] = {"models": dict(self.models), "gpus": dict(self.gpus),
                                                "nics": dict(self.nics)}  # fmt: skip
        origin = dict(self.origin)
        for kind, entries in new.items():
            for name, spec in entries.items():
                key = f"{kind}.{name}"
                if key in origin:
                    raise ScenarioError(
                        f"{top.where(key)}: {key} is already defined in {origin[key]}; give yours another name"
                    )
                merged[kind][name] = spec
                origin[key] = top.source
        return Catalog(MappingProxyType(cast(dict[str, ModelSpec], merged["models"])),
                       MappingProxyType(cast(dict[str, GpuSpec], merged["gpus"])),
                       MappingProxyType(cast(dict[str, NicSpec], merged["nics"])),
                       MappingProxyType(origin))  # fmt: skip

    def with_file(self, path: str | Path) -> Catalog:
        """This catalog and the entries of the catalog file ``path`` (``kind = "catalog"``)."""
        top = load_toml(path)
        top.get_str("kind", choices=(KIND,))
        out = self.with_entries(top)
        top.finish()
        return out


def _lookup(entries: Mapping[str, _T], name: str, what: str) -> _T:
    try:
        return entries[name]
    except KeyError:
        raise UnknownNameError(f"unknown {what} {name!r}; known: {', '.join(entries)}") from None


def read_entries(top: Table) -> dict[str, dict[str, object]]:
    """The checked catalog entries of ``top``'s ``[models.*]``, ``[gpus.*]`` and ``[nics.*]`` tables."""
    out: dict[str, dict[str, object]] = {}
    for kind, read in (("models", _read_model), ("gpus", _read_gpu), ("nics", _read_nic)):
        tables = top.table(kind)
        entries: dict[str, object] = {}
        for name in tables.keys():
            if not _NAME.fullmatch(name):
                raise tables.error(
                    name, "a name of letters, digits and . _ + - (at most 64, starting with a letter or digit)"
                )
            entry = tables.table(name, required=True)
            entries[name] = read(entry, name)
            entry.finish()
        tables.finish()
        out[kind] = entries
    return out


def _read_gpu(t: Table, name: str) -> GpuSpec:
    peak = (1e9, 1e18)
    return GpuSpec(
        name=name, description=t.get_str("description", ""), source=t.get_str("source", ""),
        bf16_flops_per_s=t.get_float("bf16_flops_per_s", min=peak[0], max=peak[1]),
        fp8_flops_per_s=_rate_or_zero(t, "fp8_flops_per_s", peak),
        fp4_flops_per_s=_rate_or_zero(t, "fp4_flops_per_s", peak),
        hbm_bytes=int(t.get_float("hbm_gib", min=0.0, max=1 << 20, min_exclusive=True) * _GIB),
        hbm_bytes_per_s=t.get_float("hbm_bytes_per_s", min=1e9, max=1e15),
        nvlink_bytes_per_s=t.get_float("nvlink_bytes_per_s", min=1e6, max=1e14),
    )  # fmt: skip


def _rate_or_zero(t: Table, key: str, bounds: tuple[float, float]) -> float:
    """An optional rate: 0 (none, the default) or a number within ``bounds``."""
    value = t.get_float(key, 0.0, min=0.0, max=bounds[1])
    if 0.0 < value < bounds[0]:
        raise t.error(key, f"0 (none) or a number in [{format_bound(bounds[0])}, {format_bound(bounds[1])}]", value)
    return value


def _read_nic(t: Table, name: str) -> NicSpec:
    return NicSpec(
        name=name, description=t.get_str("description", ""), source=t.get_str("source", ""),
        bytes_per_s=t.get_float("bytes_per_s", min=1e6, max=1e12),
    )  # fmt: skip


# The keys each attention kind or FFN kind uses; given for another kind, they are an error (not ignored).
_GQA_KEYS: Final = ("num_key_value_heads", "head_dim", "attention_bias")
_MLA_KEYS: Final = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_SPARSE_KEYS: Final = ("index_n_heads", "index_head_dim")
_MOE_KEYS: Final = ("first_k_dense_replace", "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size")


def _read_model(t: Table, name: str) -> ModelSpec:
    attention = cast(Attention, t.get_str("attention", choices=ATTENTIONS))
    layers = t.get_int("num_hidden_layers", min=1, max=1024)
    heads = t.get_int("num_attention_heads", min=1, max=_MAX_DIM)
    hidden = t.get_int("hidden_size", min=1, max=_MAX_WIDTH)
    top_k = t.get_int("index_topk", 0, min=0, max=1 << 30)
    experts = t.get_int("n_routed_experts", 0, min=0, max=_MAX_DIM)

    def unused(keys: tuple[str, ...], why: str) -> None:
        """Keys of another kind of model are refused, not ignored."""
        for key in keys:
            if key in t:
                raise ScenarioError(f"{t.where(key)} is not used: {why}; remove it")

    kv_heads = head_dim = q_lora = kv_lora = nope = rope = v_dim = 0
    if attention == "mla":
        unused(_GQA_KEYS, f'attention = "mla" has no {", ".join(_GQA_KEYS)}')
        q_lora = t.get_int("q_lora_rank", 0, min=0, max=_MAX_DIM)
        kv_lora, nope, rope, v_dim = (t.get_int(key, min=1, max=_MAX_DIM) for key in _MLA_KEYS[1:])
    else:
        unused(_MLA_KEYS, f'{_MLA_KEYS[0]} and the other MLA keys are for attention = "mla"')
        if attention == "gqa":
            kv_heads = t.get_int("num_key_value_heads", min=1, max=heads)
            if heads % kv_heads:
                raise t.error("num_key_value_heads", f"a divisor of num_attention_heads = {heads}", kv_heads)
        else:  # MHA: one KV head per query head
            t.get_int("num_key_value_heads", heads, min=heads, max=heads)
        head_dim = t.get_int("head_dim", 0, min=0, max=_MAX_DIM)
        if head_dim == 0 and hidden % heads:
            raise t.error("head_dim", f"the head dimension: hidden_size = {hidden} is no multiple of "
                          f"num_attention_heads = {heads}")  # fmt: skip
    bias = t.get_bool("attention_bias", False)
    if top_k:
        index_heads, index_dim = (t.get_int(key, min=1, max=_MAX_DIM) for key in _SPARSE_KEYS)
    else:
        unused(_SPARSE_KEYS, "the indexer keys are for sparse attention (index_topk > 0)")
        index_heads = index_dim = 0
    first_dense = per_token = shared = moe_width = 0
    if experts:
        first_dense = t.get_int("first_k_dense_replace", 0, min=0, max=layers - 1)
        per_token = t.get_int("num_experts_per_tok", min=1, max=experts)
        shared = t.get_int("n_shared_experts", 0, min=0, max=_MAX_DIM)
        moe_width = t.get_int("moe_intermediate_size", min=1, max=_MAX_WIDTH)
    else:
        unused(_MOE_KEYS, "the MoE keys are for a model with experts (n_routed_experts > 0)")
    if first_dense or not experts:
        intermediate = t.get_int("intermediate_size", min=1, max=_MAX_WIDTH)
    else:
        unused(("intermediate_size",), "every layer is MoE (first_k_dense_replace = 0)")
        intermediate = 0
    arch = ModelArch(
        attention=attention, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        vocab_size=t.get_int("vocab_size", min=1, max=1 << 24),
        weight_dtype=cast(GemmDtype, t.get_str("weight_dtype", choices=GEMM_DTYPES)),
        kv_dtype=cast(KvDtype, t.get_str("kv_dtype", choices=KV_DTYPES)),
        tie_word_embeddings=t.get_bool("tie_word_embeddings", False),
        num_key_value_heads=kv_heads, head_dim=head_dim, attention_bias=bias,
        q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v_dim,
        index_topk=top_k, index_n_heads=index_heads, index_head_dim=index_dim,
        intermediate_size=intermediate, first_k_dense_replace=first_dense, n_routed_experts=experts,
        num_experts_per_tok=per_token, n_shared_experts=shared, moe_intermediate_size=moe_width,
    )  # fmt: skip
    spec = arch.spec(
        name, t.get_str("description", ""), t.get_str("source", ""),
        total_params=t.get_float("total_params", 0.0, min=0.0, max=_MAX_PARAMS),
        active_params=t.get_float("active_params", 0.0, min=0.0, max=_MAX_PARAMS),
        kv_bytes_per_token_layer=t.get_int("kv_bytes_per_token_layer", 0, min=0, max=1 << 24),
    )  # fmt: skip
    if spec.active_params > spec.total_params:
        raise t.error("active_params", f"at most the total parameters ({spec.total_params:.4g})", spec.active_params)
    if spec.routed_expert_params > spec.total_params:
        raise t.error("total_params", f"at least the routed experts' parameters ({spec.routed_expert_params:.4g})",
                      spec.total_params)  # fmt: skip
    return spec


PACKAGED_FILE: Final = Path(__file__).with_name("catalog.toml")
PACKAGED: Final = Catalog().with_file(PACKAGED_FILE)  # The packaged catalog (``catalog.toml``).
MODELS: Final = PACKAGED.models
GPUS: Final = PACKAGED.gpus
NICS: Final = PACKAGED.nics
DEFAULT_GPU: Final = "h800"  # The paper does not name its Hopper SKU (§7.1); DeepSeek runs H800s [assumed].


def model(name: str) -> ModelSpec:
    """The packaged model called ``name``."""
    return PACKAGED.model(name)


def gpu(name: str) -> GpuSpec:
    """The packaged GPU called ``name``."""
    return PACKAGED.gpu(name)
