"""The roofline compute model: how long one GPU takes for a prefill forward pass or a decode step.

Each layer is two parts, and each part is a roofline::

    time = max(FLOPs / (peak × compute efficiency), HBM bytes / (HBM bandwidth × memory efficiency))

* **attention** -- the main attention plus, for DSA, the lightning indexer. FLOPs from
  :meth:`ModelSpec.attention_flops_per_layer` (exact causal sums), charged at the GPU's *BF16* peak (FlashMLA
  and FlashAttention compute in BF16; V3.2's indexer runs in FP8, so this overstates its time by up to 2×);
  bytes = the KV and indexer-key bytes read.
* **other** -- every weight GEMM of the layer (projections, FFN or experts, the router, the output head
  spread over the layers): ``2 × active_params / layers`` FLOPs per token at the model's GEMM dtype peak;
  bytes = the GPU's weights divided by the layers (:meth:`ModelSpec.weight_bytes_per_gpu` at the engine's
  EP degree: DP attention, routed experts sharded over ``ep_degree`` GPUs, each GPU's GEMM work equal to its
  own tokens' on average).

A forward pass is ``layers × (attention + other)``; :class:`LayerTimes` keeps the two per-layer parts so an
engine can pipeline per-layer KV loads against per-layer compute (DESIGN §4), and the scheduler's 300 ms
attention quota (§6.4, paper-facts §7.5) reads :meth:`Roofline.attention_s_per_layer`. A prefill layer's
"other" part also carries ``overhead_s_per_layer`` and, for an MoE layer, the fixed part of its dispatch and
combine (``a2a_fixed_s``); their bytes are model traffic the prefill engine sends on the data plane
(bandwidth-bound at prefill sizes, DeepEP's normal kernels).

**A decode step of an EP group** (:meth:`Roofline.ep_decode_step_s`): with DP attention and expert
parallelism every GPU of the group steps together. A step is, per layer, the slowest rank's attention plus
the weight GEMMs at the largest rank's batch plus ``overhead_s_per_layer``, and per MoE layer a dispatch and a
combine: ``a2a_fixed_s`` plus the larger of the bytes to other nodes over the compute NIC and the bytes to the
node's other GPUs over NVLink (the GPU's ``nvlink_bytes_per_s``). DeepEP's low-latency kernels send a token to each
of its ``k`` experts separately (no node dedupe), so a GPU's batch of ``b`` tokens moves
``b × (dispatch + combine bytes) × (ep_nodes − 1) / ep_nodes`` over its NIC. With ``a2a_fixed_s`` = 87 µs
(42 µs dispatch + 45 µs combine) this gives DeepEP's published H800 / CX7 numbers (128 tokens, top-8,
hidden 7,168: EP16 118 + 195 µs, EP32 155 + 273 µs, EP8 77 + 114 µs) within 2% (EP16, EP32) and 12% (EP8).
Not modelled: the two micro-batches production engines overlap to hide part of the all-to-all, expert load
imbalance beyond the largest rank's batch, and stragglers on other nodes of the group (a decode actor sees
its own node's GPUs only).

Every factor is a :class:`RooflineParams` field, one set for prefill and one for decode
(:class:`~dualpath_emu.cluster.config.ClusterConfig`); the defaults and why:

``gemm_efficiency = 0.6``
    DeepGEMM's FP8 GEMMs reach 1,350-1,550 TFLOP/s on an H800 (68-78% of the 1,979 dense peak) for large
    shapes; MoE grouped GEMMs with uneven expert loads and the element-wise work the model folds in
    (norms, RoPE, routing, quantisation) bring a whole layer lower. An assumption, not a measurement.
``attention_efficiency = 0.6``
    FlashMLA's sparse prefill kernel reaches 640 TFLOP/s on an H800 (65% of the 989 BF16 peak); its dense
    decode kernel 660 TFLOP/s when compute-bound; FlashAttention-3 ~75% on an H100. 0.6 leaves room for
    the indexer's top-k selection and short sequences.
``memory_efficiency = 0.8``
    FlashMLA decode streams KV at up to 3,000 GB/s of the H800's 3,350 (90%); weight streaming in
    small-batch GEMMs is typically lower. Decode is memory-bound on weights + KV, so this sets TPOT.
``overhead_s_per_layer = 0``
    A fixed cost per layer (launches, DP-attention synchronisation, norms). The pure roofline gains little
    per-token throughput from batching (V3.2 with 30K context + 300 new tokens: ~6% from batch 1 to 20),
    whereas the paper's Fig. 3 (right) shows ≈3×, which a roofline alone cannot give; ≈2 ms per layer
    would. 0 by default; the calibration fits prefill's (:mod:`dualpath_emu.reproduce.calibrate`). Decode
    runs as CUDA graphs and keeps 0.
``a2a_fixed_s = 87e-6``
    The fixed latency of one MoE layer's dispatch plus combine (DeepEP, above); 0 for a dense model, whose
    layers have none. Prefill uses DeepEP's normal kernels, which publish bandwidths only; we assume the same
    fixed part.
"""

from __future__ import annotations

import functools

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dualpath_emu.cluster.catalog import GpuSpec, ModelSpec
from dualpath_emu.errors import InvalidArgumentError

__all__ = ["LayerTimes", "Roofline", "RooflineParams", "roofline_s"]


@dataclass(frozen=True)
class RooflineParams:
    """The roofline's efficiency factors and overhead; the module docstring gives each default's reason."""

    gemm_efficiency: float = 0.6
    attention_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    overhead_s_per_layer: float = 0.0
    a2a_fixed_s: float = 87e-6

    def __post_init__(self) -> None:
        for name in ("gemm_efficiency", "attention_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise InvalidArgumentError(f"{name}: must be in (0, 1], got {value}")
        for name in ("overhead_s_per_layer", "a2a_fixed_s"):
            value = getattr(self, name)
            if not value >= 0.0:
                raise InvalidArgumentError(f"{name}: must be >= 0, got {value}")


@dataclass(frozen=True)
class LayerTimes:
    """Per-layer times of one forward pass (every layer alike) and the layer count."""

    attention_s: float
    other_s: float
    layers: int

    @property
    def per_layer_s(self) -> float:
        """One layer: attention, then the rest."""
        return self.attention_s + self.other_s

    @property
    def total_s(self) -> float:
        """The whole forward pass."""
        return self.layers * self.per_layer_s


def roofline_s(
    flops: float,
    peak_flops_per_s: float,
    compute_efficiency: float,
    hbm_bytes: float,
    hbm_bytes_per_s: float,
    memory_efficiency: float,
) -> float:
    """``max(flops / (peak × compute efficiency), bytes / (bandwidth × memory efficiency))``."""
    return max(flops / (peak_flops_per_s * compute_efficiency), hbm_bytes / (hbm_bytes_per_s * memory_efficiency))


@dataclass(frozen=True)
class Roofline:
    """The compute model of one GPU of kind ``gpu`` running ``model`` in an engine with EP degree ``ep_degree``.

    Raises :class:`~dualpath_emu.errors.InvalidArgumentError` when the GPU's share of the weights does not
    fit its HBM (e.g. DS 660B needs ``ep_degree >= 16`` on 80 GiB GPUs).
    """

    gpu: GpuSpec
    model: ModelSpec
    ep_degree: int = 1
    params: RooflineParams = field(default_factory=RooflineParams)
    gpus_per_node: int = 8
    """GPUs of one node: an EP group of ``ep_degree`` GPUs spans ``ep_degree / gpus_per_node`` nodes."""
    cnic_bytes_per_s: float = 50e9
    """Each GPU's compute NIC, which a decode step's all-to-all to other nodes crosses."""
    _by_batch: dict[int, tuple[float, float]] = field(default_factory=dict, init=False, repr=False, compare=False)
    """Per decode batch size: one layer's weight GEMMs and one MoE layer's all-to-all (they depend on nothing
    else, and a decode group asks at every change of its batches)."""

    def __post_init__(self) -> None:
        weights = self.model.weight_bytes_per_gpu(self.ep_degree)
        if weights > self.gpu.hbm_bytes:
            raise InvalidArgumentError(
                f"{self.model.name} at ep_degree={self.ep_degree} needs {weights / 1e9:.1f} GB of weights per "
                f"GPU, more than the {self.gpu.name}'s {self.gpu.hbm_bytes / 1e9:.1f} GB of HBM"
            )

    def _attention_s(self, flops: float, hbm_bytes: float) -> float:
        p = self.params
        return roofline_s(
            flops,
            self.gpu.bf16_flops_per_s,
            p.attention_efficiency,
            hbm_bytes,
            self.gpu.hbm_bytes_per_s,
            p.memory_efficiency,
        )

    def _other_s(self, tokens: int) -> float:
        """The weight GEMMs of one layer for ``tokens`` tokens."""
        m, p = self.model, self.params
        return roofline_s(
            m.gemm_flops_per_token * tokens / m.layers,
            self.gpu.peak_flops_per_s(m.gemm_dtype),
            p.gemm_efficiency,
            m.weight_bytes_per_gpu(self.ep_degree) / m.layers,
            self.gpu.hbm_bytes_per_s,
            p.memory_efficiency,
        )

    def attention_cost(self, cached_tokens: int, new_tokens: int) -> tuple[float, float]:
        """One request's attention FLOPs and HBM bytes per layer; a batch's time is
        :meth:`attention_s_from` of their sums (what :meth:`attention_s_per_layer` computes)."""
        m = self.model
        bytes_per_key = m.kv_bytes_per_token_layer + m.indexer_kv_bytes_per_token_layer
        return m.attention_flops_per_layer(cached_tokens, new_tokens), (cached_tokens + new_tokens) * bytes_per_key

    def attention_s_from(self, flops: float, hbm_bytes: float) -> float:
        """Attention time of one layer for the summed :meth:`attention_cost` of a batch."""
        return self._attention_s(flops, hbm_bytes)

    def attention_s_per_layer(self, batch: Sequence[tuple[int, int]]) -> float:
        """Attention time of one layer for a prefill batch of ``(cached_tokens, new_tokens)`` requests.

        Bytes read: each request's ``cached + new`` KV and indexer keys once (an upper bound for DSA, whose
        main attention reads only the selected keys; prefill is compute-bound either way). An empty batch
        takes no time.
        """
        m = self.model
        bytes_per_key = m.kv_bytes_per_token_layer + m.indexer_kv_bytes_per_token_layer
        flops = sum(m.attention_flops_per_layer(cached, new) for cached, new in batch)
        hbm_bytes = sum((cached + new) * bytes_per_key for cached, new in batch)
        return self._attention_s(flops, hbm_bytes)

    def prefill(self, batch: Sequence[tuple[int, int]]) -> LayerTimes:
        """Per-layer times of a prefill forward over ``(cached_tokens, new_tokens)`` requests.

        An empty batch (no new tokens) takes no time.
        """
        tokens = sum(new for _, new in batch)
        if tokens == 0:
            return LayerTimes(0.0, 0.0, self.model.layers)
        other_s = self._other_s(tokens) + self.fixed_s_per_layer
        return LayerTimes(self.attention_s_per_layer(batch), other_s, self.model.layers)

    @functools.cached_property
    def fixed_s_per_layer(self) -> float:
        """Per layer (averaged over the layers, as :class:`LayerTimes` has every layer alike): the overhead
        and the fixed part of the MoE layers' all-to-all."""
        m, p = self.model, self.params
        a2a_s = p.a2a_fixed_s * m.moe_layers / m.layers if self.ep_degree > 1 else 0.0
        return p.overhead_s_per_layer + a2a_s

    @functools.cached_property
    def a2a_remote_bytes_per_token(self) -> float:
        """Decode all-to-all bytes one token sends to and gets back from other nodes per MoE layer (DeepEP's
        low-latency layout: to each of its experts separately); 0 for a dense model or a one-node group."""
        m = self.model
        if m.moe_layers == 0 or self.ep_degree <= 1:
            return 0.0
        nodes = max(1, self.ep_degree // self.gpus_per_node)
        return (m.a2a_dispatch_bytes_per_token_layer + m.a2a_combine_bytes_per_token_layer) * (nodes - 1) / nodes

    def a2a_s(self, tokens: int) -> float:
        """One MoE layer's decode dispatch + combine for a GPU with ``tokens`` tokens (module docstring);
        0 for a dense model or an EP group of one GPU."""
        m = self.model
        if m.moe_layers == 0 or self.ep_degree <= 1 or tokens == 0:
            return 0.0
        per_token = m.a2a_dispatch_bytes_per_token_layer + m.a2a_combine_bytes_per_token_layer
        remote = tokens * self.a2a_remote_bytes_per_token
        local = tokens * per_token * (min(self.gpus_per_node, self.ep_degree) - 1) / self.ep_degree
        return self.params.a2a_fixed_s + max(remote / self.cnic_bytes_per_s, local / self.gpu.nvlink_bytes_per_s)

    def ep_decode_step_s(self, batches: Sequence[tuple[int, int]]) -> float:
        """One decode step of GPUs that step together (an EP group's), given each one's ``(batch_size,
        context_tokens)`` (as :meth:`decode_step`): per layer the slowest rank's attention, the weight GEMMs
        at the largest batch and the overhead; per MoE layer the all-to-all (:meth:`a2a_s`) at the largest
        batch. GPUs with an empty batch still step (DP ranks run the MoE layers together). No GPU with a
        request: 0."""
        attention = self._decode_attention_s
        slowest, largest = 0.0, 0
        for size, context in batches:
            if size:
                slowest = max(slowest, attention(size, context))
                largest = max(largest, size)
        if largest == 0:
            return 0.0
        terms = self._by_batch.get(largest)
        if terms is None:
            terms = self._by_batch[largest] = (self._other_s(largest), self.a2a_s(largest))
        other, a2a = terms
        m = self.model
        return m.layers * (slowest + other + self.params.overhead_s_per_layer) + m.moe_layers * a2a

    @functools.cached_property
    def _decode_attention_s(self) -> Callable[[int, int], float]:
        """One layer's decode attention for ``(batch_size, context_tokens)`` (:meth:`decode_step`'s), as a
        function of precomputed constants: a decode group asks for it at every change of its batches. The
        same operations in the same order as :meth:`decode_step`, so the same float to the last bit."""
        m, p, g = self.model, self.params, self.gpu
        top_k = m.sparse_top_k
        fk, ik = m.attention_flops_per_key_layer, m.indexer_flops_per_key_layer
        kb, ib = m.kv_bytes_per_token_layer, m.indexer_kv_bytes_per_token_layer
        attention_flops_per_s = g.bf16_flops_per_s * p.attention_efficiency
        bytes_per_s = g.hbm_bytes_per_s * p.memory_efficiency

        def attention_s(batch_size: int, context_tokens: int) -> float:
            attended = context_tokens if top_k is None else min(context_tokens, batch_size * top_k)
            return max((fk * attended + ik * context_tokens) / attention_flops_per_s,
                       (kb * attended + ib * context_tokens) / bytes_per_s)  # fmt: skip

        return attention_s

    def decode_pricing(self) -> dict[str, float | int | bool | None]:
        """The constants :meth:`ep_decode_step_s` prices a step from, for the core's decode stepping
        (``core/src/decode.rs`` does the same operations in the same order: the same float to the bit)."""
        m, p, g = self.model, self.params, self.gpu
        return {
            "layers": m.layers, "moe_layers": m.moe_layers, "overhead_s_per_layer": p.overhead_s_per_layer,
            "sparse_top_k": m.sparse_top_k,
            "attention_flops_per_key": m.attention_flops_per_key_layer,
            "indexer_flops_per_key": m.indexer_flops_per_key_layer,
            "kv_bytes_per_key": m.kv_bytes_per_token_layer,
            "indexer_bytes_per_key": m.indexer_kv_bytes_per_token_layer,
            "attention_flops_per_s": g.bf16_flops_per_s * p.attention_efficiency,
            "attention_bytes_per_s": g.hbm_bytes_per_s * p.memory_efficiency,
            "gemm_flops_per_token": m.gemm_flops_per_token, "gemm_peak_flops_per_s": g.peak_flops_per_s(m.gemm_dtype),
            "gemm_efficiency": p.gemm_efficiency, "weight_bytes": m.weight_bytes_per_gpu(self.ep_degree),
            "hbm_bytes_per_s": g.hbm_bytes_per_s, "memory_efficiency": p.memory_efficiency,
            "a2a": m.moe_layers > 0 and self.ep_degree > 1, "a2a_fixed_s": p.a2a_fixed_s,
            "a2a_bytes_per_token_layer": m.a2a_dispatch_bytes_per_token_layer + m.a2a_combine_bytes_per_token_layer,
            "a2a_remote_bytes_per_token": self.a2a_remote_bytes_per_token,
            "a2a_local_peers": min(self.gpus_per_node, self.ep_degree) - 1, "ep_degree": self.ep_degree,
            "cnic_bytes_per_s": self.cnic_bytes_per_s, "nvlink_bytes_per_s": self.gpu.nvlink_bytes_per_s,
        }  # fmt: skip

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        """One GPU's decode step alone (``decode_step(...).total_s`` plus the per-layer overhead and the MoE
        layers' all-to-all): :meth:`ep_decode_step_s` of one batch."""
        return self.ep_decode_step_s(((batch_size, context_tokens),))

    def decode_step(self, batch_size: int, context_tokens: int) -> LayerTimes:
        """Per-layer times of one decode step: ``batch_size`` requests, ``context_tokens`` keys in all.

        ``context_tokens`` sums each request's context including the token being decoded. Attention reads
        every request's KV (GQA), or, with DSA, each request's top-k keys -- counted as
        ``min(context_tokens, batch_size × top_k)``, exact when every context is at least ``top_k`` and an
        upper bound otherwise -- plus every indexer key. An empty batch takes no time.
        """
        if batch_size < 0 or context_tokens < batch_size:
            raise InvalidArgumentError(
                f"need 0 <= batch_size <= context_tokens, got batch_size={batch_size}, context_tokens={context_tokens}"
            )
        m = self.model
        if batch_size == 0:
            return LayerTimes(0.0, 0.0, m.layers)
        attended = context_tokens if m.sparse_top_k is None else min(context_tokens, batch_size * m.sparse_top_k)
        flops = m.attention_flops_per_key_layer * attended + m.indexer_flops_per_key_layer * context_tokens
        hbm_bytes = m.kv_bytes_per_token_layer * attended + m.indexer_kv_bytes_per_token_layer * context_tokens
        return LayerTimes(self._attention_s(flops, hbm_bytes), self._other_s(batch_size), m.layers)
