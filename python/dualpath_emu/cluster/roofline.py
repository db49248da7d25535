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
  own tokens' on average). Prefill adds ``prefill_overhead_s_per_layer``.

A forward pass is ``layers × (attention + other)``; :class:`LayerTimes` keeps the two per-layer parts so an
engine can pipeline per-layer KV loads against per-layer compute (DESIGN §4), and the scheduler's 300 ms
attention quota (§6.4, paper-facts §7.5) reads :meth:`Roofline.attention_s_per_layer`. Not modelled here:
the MoE all-to-all (traffic on the high lane of the data plane, see the catalog's a2a bytes), activation
bytes, norms and other element-wise kernels (folded into the efficiencies), and kernel launch costs (see
``prefill_overhead_s_per_layer``).

Every factor is a :class:`RooflineParams` field; the defaults and why:

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
``prefill_overhead_s_per_layer = 0``
    A fixed cost per layer of a prefill forward (launches, DP-attention synchronisation). The pure
    roofline gains little per-token throughput from batching (V3.2 with 30K context + 300 new tokens: ~6%
    from batch 1 to 20), whereas the paper's Fig. 3 (right) shows ≈3×, which a roofline alone cannot give;
    ≈2 ms per layer would. Left at 0 until it is calibrated.
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
    prefill_overhead_s_per_layer: float = 0.0

    def __post_init__(self) -> None:
        for name in ("gemm_efficiency", "attention_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise InvalidArgumentError(f"{name}: must be in (0, 1], got {value}")
        overhead_s = self.prefill_overhead_s_per_layer
        if not overhead_s >= 0.0:
            raise InvalidArgumentError(f"prefill_overhead_s_per_layer: must be >= 0, got {overhead_s}")


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
    flops: float, peak_flops_per_s: float, compute_efficiency: float,
    hbm_bytes: float, hbm_bytes_per_s: float, memory_efficiency: float,
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
            flops, self.gpu.bf16_flops_per_s, p.attention_efficiency, hbm_bytes, self.gpu.hbm_bytes_per_s,
            p.memory_efficiency,
        )

    def _other_s(self, tokens: int) -> float:
        """The weight GEMMs of one layer for ``tokens`` tokens."""
        m, p = self.model, self.params
        return roofline_s(
            m.gemm_flops_per_token * tokens / m.layers, self.gpu.peak_flops_per_s(m.gemm_dtype), p.gemm_efficiency,
            m.weight_bytes_per_gpu(self.ep_degree) / m.layers, self.gpu.hbm_bytes_per_s, p.memory_efficiency,
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
        other_s = self._other_s(tokens) + self.params.prefill_overhead_s_per_layer
        return LayerTimes(self.attention_s_per_layer(batch), other_s, self.model.layers)

    @functools.cached_property
    def decode_step_s(self) -> Callable[[int, int], float]:
        """``decode_step(batch_size, context_tokens).total_s`` without the checks and the object, as a
        function of precomputed constants: a decode GPU asks for it at every change of its batch. The same
        operations in the same order, so the same float to the last bit."""
        m, p, g = self.model, self.params, self.gpu
        layers, top_k = m.layers, m.sparse_top_k
        fk, ik = m.attention_flops_per_key_layer, m.indexer_flops_per_key_layer
        kb, ib = m.kv_bytes_per_token_layer, m.indexer_kv_bytes_per_token_layer
        attention_flops_per_s = g.bf16_flops_per_s * p.attention_efficiency
        bytes_per_s = g.hbm_bytes_per_s * p.memory_efficiency
        gemm_flops, gemm_flops_per_s = m.gemm_flops_per_token, g.peak_flops_per_s(m.gemm_dtype) * p.gemm_efficiency
        weight_s = m.weight_bytes_per_gpu(self.ep_degree) / layers / bytes_per_s
        other_s: dict[int, float] = {}  # per batch size: the weight GEMMs depend on nothing else

        def step_s(batch_size: int, context_tokens: int) -> float:
            if batch_size == 0:
                return 0.0
            attended = context_tokens if top_k is None else min(context_tokens, batch_size * top_k)
            attention_s = max((fk * attended + ik * context_tokens) / attention_flops_per_s,
                              (kb * attended + ib * context_tokens) / bytes_per_s)  # fmt: skip
            other = other_s.get(batch_size)
            if other is None:
                other = other_s[batch_size] = max(gemm_flops * batch_size / layers / gemm_flops_per_s, weight_s)
            return layers * (attention_s + other)

        return step_s

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
