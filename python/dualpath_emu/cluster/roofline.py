"""The roofline compute model: how long one GPU takes for a prefill forward pass, and an EP group for a decode step.

Each layer is attention and the weight GEMMs, each ``max(FLOPs / (peak × efficiency), bytes / (HBM bandwidth ×
memory efficiency))``; a decode step adds per MoE layer DeepEP's dispatch and combine. The model, the defaults of
:class:`RooflineParams` and why: docs/compute-model.md."""

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
        return self.attention_s + self.other_s

    @property
    def total_s(self) -> float:
        return self.layers * self.per_layer_s


def roofline_s(flops: float, peak_flops_per_s: float, compute_efficiency: float, hbm_bytes: float,
               hbm_bytes_per_s: float, memory_efficiency: float) -> float:  # fmt: skip
    """``max(flops / (peak × compute efficiency), bytes / (bandwidth × memory efficiency))``."""
    return max(flops / (peak_flops_per_s * compute_efficiency), hbm_bytes / (hbm_bytes_per_s * memory_efficiency))


@dataclass(frozen=True)
class Roofline:
    """The compute model of one ``gpu`` running ``model`` at EP degree ``ep_degree`` (weights must fit)."""

    gpu: GpuSpec
    model: ModelSpec
    ep_degree: int = 1
    params: RooflineParams = field(default_factory=RooflineParams)
    gpus_per_node: int = 8
    """GPUs of one node: an EP group of ``ep_degree`` GPUs spans ``ep_degree / gpus_per_node`` nodes."""
    cnic_bytes_per_s: float = 50e9  # Each GPU's compute NIC, which a decode step's all-to-all to other nodes crosses.
    _by_batch: dict[int, tuple[float, float]] = field(default_factory=dict, init=False, repr=False, compare=False)
    """Per decode batch size: one layer's weight GEMMs and one MoE layer's all-to-all."""

    def __post_init__(self) -> None:
        weights = self.model.weight_bytes_per_gpu(self.ep_degree)
        if weights > self.gpu.hbm_bytes:
            raise InvalidArgumentError(
                f"{self.model.name} at ep_degree={self.ep_degree} needs {weights / 1e9:.1f} GB of weights per "
                f"GPU, more than the {self.gpu.name}'s {self.gpu.hbm_bytes / 1e9:.1f} GB of HBM"
            )

    def attention_s_from(self, flops: float, hbm_bytes: float) -> float:
        """Attention time of one layer for the summed :meth:`attention_cost` of a batch."""
        g, p = self.gpu, self.params
        return roofline_s(flops, g.bf16_flops_per_s, p.attention_efficiency, hbm_bytes, g.hbm_bytes_per_s,
                          p.memory_efficiency)  # fmt: skip

    def _other_s(self, tokens: int) -> float:
        """The weight GEMMs of one layer for ``tokens`` tokens."""
        m, p = self.model, self.params
        return roofline_s(m.gemm_flops_per_token * tokens / m.layers, self.gpu.peak_flops_per_s(m.gemm_dtype),
                          p.gemm_efficiency, m.weight_bytes_per_gpu(self.ep_degree) / m.layers,
                          self.gpu.hbm_bytes_per_s, p.memory_efficiency)  # fmt: skip

    def attention_cost(self, cached_tokens: int, new_tokens: int) -> tuple[float, float]:
        """One request's attention FLOPs and HBM bytes per layer (a batch's time: :meth:`attention_s_from` of sums)."""
        m = self.model
        bytes_per_key = m.kv_bytes_per_token_layer + m.indexer_kv_bytes_per_token_layer
        return m.attention_flops_per_layer(cached_tokens, new_tokens), (cached_tokens + new_tokens) * bytes_per_key

    def attention_s_per_layer(self, batch: Sequence[tuple[int, int]]) -> float:
        """Attention time of one layer for a prefill batch of ``(cached_tokens, new_tokens)`` requests."""
        m = self.model
        bytes_per_key = m.kv_bytes_per_token_layer + m.indexer_kv_bytes_per_token_layer
        flops = sum(m.attention_flops_per_layer(cached, new) for cached, new in batch)
        hbm_bytes = sum((cached + new) * bytes_per_key for cached, new in batch)
        return self.attention_s_from(flops, hbm_bytes)

    def prefill(self, batch: Sequence[tuple[int, int]]) -> LayerTimes:
        """Per-layer times of a prefill forward over ``(cached_tokens, new_tokens)`` requests (none: 0)."""
        tokens = sum(new for _, new in batch)
        if tokens == 0:
            return LayerTimes(0.0, 0.0, self.model.layers)
        other_s = self._other_s(tokens) + self.fixed_s_per_layer
        return LayerTimes(self.attention_s_per_layer(batch), other_s, self.model.layers)

    @functools.cached_property
    def fixed_s_per_layer(self) -> float:
        """Per layer: the overhead and the fixed part of the MoE layers' all-to-all (averaged over layers)."""
        m, p = self.model, self.params
        a2a_s = p.a2a_fixed_s * m.moe_layers / m.layers if self.ep_degree > 1 else 0.0
        return p.overhead_s_per_layer + a2a_s

    @functools.cached_property
    def a2a_remote_bytes_per_token(self) -> float:
        """Decode all-to-all bytes one token sends to and gets back from other nodes per MoE layer."""
        m = self.model
        if m.moe_layers == 0 or self.ep_degree <= 1:
            return 0.0
        nodes = max(1, self.ep_degree // self.gpus_per_node)
        return (m.a2a_dispatch_bytes_per_token_layer + m.a2a_combine_bytes_per_token_layer) * (nodes - 1) / nodes

    def a2a_s(self, tokens: int) -> float:
        """One MoE layer's decode dispatch + combine for a GPU with ``tokens`` tokens (module docstring)."""
        m = self.model
        if m.moe_layers == 0 or self.ep_degree <= 1 or tokens == 0:
            return 0.0
        per_token = m.a2a_dispatch_bytes_per_token_layer + m.a2a_combine_bytes_per_token_layer
        remote = tokens * self.a2a_remote_bytes_per_token
        local = tokens * per_token * (min(self.gpus_per_node, self.ep_degree) - 1) / self.ep_degree
        return self.params.a2a_fixed_s + max(remote / self.cnic_bytes_per_s, local / self.gpu.nvlink_bytes_per_s)

    def ep_decode_step_s(self, batches: Sequence[tuple[int, int]]) -> float:
        """One decode step of GPUs stepping together, given each one's ``(batch_size, context_tokens)``."""
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
        """:meth:`decode_step`'s attention of one layer from precomputed constants, the same float to the bit."""
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
        """The constants :meth:`ep_decode_step_s` prices a step from, for the core (the same float to the bit)."""
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
        """One GPU's decode step alone: :meth:`ep_decode_step_s` of one batch."""
        return self.ep_decode_step_s(((batch_size, context_tokens),))

    def decode_step(self, batch_size: int, context_tokens: int) -> LayerTimes:
        """Per-layer times of one decode step: ``batch_size`` requests, ``context_tokens`` keys in all."""
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
        return LayerTimes(self.attention_s_from(flops, hbm_bytes), self._other_s(batch_size), m.layers)
