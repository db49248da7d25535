"""The settings of one cluster run: deployment, hardware, model, workload and the parameters the paper leaves
open (paper-facts §10), each with a documented default.

:class:`ClusterConfig` is plain data; :mod:`dualpath_emu.cluster.scenario` reads it from a TOML file and
:func:`derived` turns it into the numbers the actors use (α, β, HBM budgets, the roofline)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from dualpath_emu.cluster.catalog import DEFAULT_GPU, GPUS, MODELS, TESTBED_NODE, GpuSpec, ModelSpec, NodeSpec
from dualpath_emu.cluster.faults import FaultPlan
from dualpath_emu.cluster.roofline import Roofline, RooflineParams
from dualpath_emu.cluster.topology import NetworkSpec, StorageSpec
from dualpath_emu.workload.waits import ToolWait

__all__ = [
    "BLOCK_TOKENS",
    "POOL_BYTES_PER_NODE",
    "ClusterConfig",
    "Derived",
    "KvHbmSpec",
    "KvPoolSpec",
    "KvTierSpec",
    "WRITE_BACK",
    "WRITE_POLICIES",
    "derived",
]

BLOCK_TOKENS: Final = 64  # Tokens per Full Block (§4.1): storage reads and writes whole blocks.


@dataclass(frozen=True)
class KvTierSpec:
    """A KV tier's size and eviction (:mod:`~dualpath_emu.cluster.kv_cache`): ``capacity_bytes`` 0 is unbounded
    (the paper's storage, which never fills); ``eviction`` a name in ``kv_cache.EVICTIONS``; ``ttl_s`` how long
    ``"ttl"`` keeps an idle context."""

    capacity_bytes: int = 0
    eviction: str = "lru"
    ttl_s: float = 0.0

    @property
    def bounded(self) -> bool:
        return self.capacity_bytes > 0


POOL_BYTES_PER_NODE: Final = 1_500_000_000_000
"""SGL(MC)'s Mooncake DRAM pool per node in the paper's runs (§7.1: 1.5 TB)."""


WRITE_POLICIES: Final = ("through", "back")
"""A DRAM pool's write policy (``[kv.pool] write``)."""
WRITE_BACK: Final = "back"


@dataclass(frozen=True)
class KvPoolSpec:
    """The DRAM pool (``[kv.pool]``, :mod:`~dualpath_emu.cluster.kv_cache`): every node's ``bytes_per_node`` of host
    DRAM together, a Mooncake-store pool reachable over the compute network, used by the systems that keep KV in
    it (``System.pool``, as ``sglmc``) and by those named in ``systems``. ``write``: ``"through"``, a turn's blocks go
    on to storage as they are made (as without a pool); ``"back"``, they stay in the pool and reach storage only
    when it evicts them (or has no room for them)."""

    bytes_per_node: int = POOL_BYTES_PER_NODE
    eviction: str = "lru"
    ttl_s: float = 0.0
    systems: tuple[str, ...] = ()
    write: str = "through"

    def tier(self, nodes: int) -> KvTierSpec:
        """The pool as one tier of ``nodes`` nodes' DRAM."""
        return KvTierSpec(self.bytes_per_node * nodes, self.eviction, self.ttl_s)

    @property
    def write_back(self) -> bool:
        return self.write == WRITE_BACK


@dataclass(frozen=True)
class KvHbmSpec:
    """Decode HBM kept across turns (``[kv.hbm]``): ``systems`` whose decode GPUs keep KV besides those that always
    do (``System.retain``, as ``dualpath+retention``); ``eviction``: which kept context a decode GPU drops when its
    running requests need the room (``kv_cache`` policies, a user's too); ``ttl_s``: kept KV not taken over within
    this long is dropped (0: kept until its room is needed)."""

    systems: tuple[str, ...] = ()
    ttl_s: float = 0.0
    eviction: str = "lru"


@dataclass(frozen=True)
class ClusterConfig:
    """One deployment and workload. Defaults: the paper's DS 660B 2P4D offline setting on the 64K dataset."""

    model: ModelSpec = MODELS["ds660b"]
    """The model (:mod:`~dualpath_emu.cluster.catalog`: ``catalog.model("ds27b")``, or a user's entry)."""
    gpu: GpuSpec = GPUS[DEFAULT_GPU]
    node: NodeSpec = TESTBED_NODE
    pe_nodes: int = 2
    de_nodes: int = 4
    prefill_ep_nodes: int = 2
    """Nodes per prefill EP group, whose DP-attention ranks run each layer in lock step (§6.4)."""
    decode_ep_nodes: int = 4
    """Nodes per decode EP group: sets the weights per DE GPU and the MoE all-to-all of a decode step; a
    node's DE GPUs step together (:meth:`~dualpath_emu.cluster.roofline.Roofline.ep_decode_step_s`)."""
    storage: StorageSpec = field(default_factory=StorageSpec)
    kv_store: KvTierSpec = field(default_factory=KvTierSpec)
    """The storage cluster as a KV tier: unbounded by default (the paper's), else evicting (``[kv.store]``)."""
    kv_pool: KvPoolSpec = field(default_factory=KvPoolSpec)
    """The DRAM pool of the systems that keep KV in one (``[kv.pool]``; none by default)."""
    kv_hbm: KvHbmSpec = field(default_factory=KvHbmSpec)
    """Which systems' decode GPUs keep KV in HBM across turns besides those that always do (``[kv.hbm]``)."""
    network: NetworkSpec = field(default_factory=NetworkSpec)
    """The compute NICs' lanes and other traffic (``[network]``; the paper's isolation, nothing else, by default)."""
    prefill_roofline: RooflineParams = field(default_factory=RooflineParams)
    """The prefill engines' compute (:mod:`~dualpath_emu.cluster.roofline`; its speed and overhead calibrated)."""
    decode_roofline: RooflineParams = field(default_factory=RooflineParams)
    """The decode engines' compute (never fitted)."""
    # --- workload ---
    dataset: str = "64k"
    agents: int = 64
    mode: Literal["offline", "online"] = "offline"
    arrival_rate: float = 0.1  # Online: agents per second (Poisson, §7.4).
    tool_wait: ToolWait = field(default_factory=ToolWait)
    """The wait before an agent's next turn where its trajectory gives none; none by default (§8.2)."""
    faults: FaultPlan = field(default_factory=FaultPlan)
    """What fails when (:mod:`~dualpath_emu.cluster.faults`); none by default."""
    # --- scheduling (§6, A.4) ---
    alpha_read_s: float = 3.0  # α = tokens a node reads from storage in this many seconds (A.4).
    beta_compute_s: float = 5.0  # β = tokens one GPU prefills in this many seconds (A.4).
    attention_quota_s: float = 0.3
    """Attention-time quota of a PE forward batch (A.4: 300 ms), per :attr:`attention_quota_per`."""
    attention_quota_per: Literal["forward", "layer"] = "forward"
    """What the quota bounds: a forward pass's attention over all its layers, or each layer's (the paper does
    not say, paper-facts §7.5). Per forward DualPath comes within 9% of Oracle and 1.84× Basic (DS 660B 2P4D,
    64K, 1,024 agents), as the paper's ≈10% and 1.80×; per layer, passes run up to 18 s, the DRAM buffers
    bind and DualPath stays 38% behind Oracle."""
    fetch_period_s: float = 0.005  # How often an engine group may fetch work [not found in the paper].
    hit_block_aligned: bool = True
    """Hits are whole Full Blocks (storage holds Full Blocks): the partial last block is recomputed [not found]."""
    de_hbm_reserve_fraction: float = 0.1
    """Fraction of a DE GPU's free HBM (after weights) kept for activations and fragmentation [assumed]."""
    dram_buffer_bytes: int = 80_000_000_000
    """Host DRAM per node for the PE or DE buffer: 80 GB for the DeepSeek models, 320 GB for Qwen (§7.1)."""
    pe_hbm_reserve_fraction: float = 0.1
    """The same on a PE GPU; without layerwise prefill a batch's whole KV must fit the rest [assumed]."""
    max_redispatches: int = 3
    """Times a request may be lost (a crash, a read given up) and dispatched again; one loss more fails it."""
    read_timeout_s: float = 30.0
    """A hit read stalled this long on a storage NIC that is down is given up and its request dispatched again."""
    stall_timeout_s: float = 3600.0
    """A run whose requests in flight make no progress for this long in emulated time is stopped with an error
    (:mod:`~dualpath_emu.cluster.stall`). 0: never [our choice: an hour, beyond any read_timeout_s]."""
    pipeline_stages: int = 8
    """Stages of the layerwise pipeline per forward pass, each loading, computing and storing its layers' KV as
    one step (0: one per layer, the paper's granularity). 8 instead of 61 change DS 660B 2P4D's offline JCT by
    +0.9% and online TTFT p50 by +2.5%, and run 1.8× faster [our choice]."""
    order_seed: int | None = None
    """Virtual time: deliver the inputs due at one instant in an order drawn from this seed (None: FIFO), as a live
    run's interleavings can (docs/testing-your-scheduler.md); messages of one sender to one engine stay in order."""
    message_delay_s: float = 0.0
    """Virtual time, with ``order_seed``: delay each message between engines by up to this long (uniform, drawn from
    the order seed), as a live run's network can; per sender and recipient still in order."""


@dataclass(frozen=True)
class Derived:
    """Numbers the actors use, computed once from a :class:`ClusterConfig`."""

    model: ModelSpec
    gpu: GpuSpec
    prefill: Roofline
    decode: Roofline
    kv_bytes_per_token: int
    alpha_tokens: int
    beta_tokens: int
    pe_hbm_kv_bytes: int  # HBM a PE GPU has for KV (non-layerwise batches).
    de_hbm_kv_bytes: int  # HBM a DE GPU has for KV.
    stages: int
    layer_attention_quota_s: float
    """The attention quota as one layer's share (the roofline gives one layer's attention time)."""


def derived(config: ClusterConfig) -> Derived:
    """The derived numbers of ``config`` (α, β, HBM budgets, rooflines)."""
    m, g = config.model, config.gpu
    gpus = config.node.gpus
    cnic = config.node.cnic_bytes_per_s
    prefill = Roofline(g, m, config.prefill_ep_nodes * gpus, config.prefill_roofline, gpus, cnic)
    decode = Roofline(g, m, config.decode_ep_nodes * gpus, config.decode_roofline, gpus, cnic)
    kv = m.kv_bytes_per_token
    # α: a node's storage NIC(s) for alpha_read_s, in tokens of KV.
    alpha = int(config.alpha_read_s * config.node.snic_bytes_per_s * config.node.snics / kv)
    # β: tokens one GPU prefills in beta_compute_s, at a typical batch (Table 1's 32K context, 429-token append),
    # without the fixed per-layer costs (per pass, not per token).
    typical = prefill.prefill([(32_768, 429)])
    per_token_s = (typical.total_s - typical.layers * prefill.fixed_s_per_layer) / 429
    beta = int(config.beta_compute_s / per_token_s)

    def kv_budget(roofline: Roofline, reserve: float) -> int:
        free = g.hbm_bytes - m.weight_bytes_per_gpu(roofline.ep_degree)
        return int(max(0.0, free) * (1.0 - reserve))

    stages = config.pipeline_stages or m.layers
    return Derived(
        model=m, gpu=g, prefill=prefill, decode=decode, kv_bytes_per_token=kv, alpha_tokens=alpha, beta_tokens=beta,
        pe_hbm_kv_bytes=kv_budget(prefill, config.pe_hbm_reserve_fraction),
        de_hbm_kv_bytes=kv_budget(decode, config.de_hbm_reserve_fraction), stages=min(stages, m.layers),
        layer_attention_quota_s=config.attention_quota_s / (m.layers if config.attention_quota_per == "forward" else 1),
    )  # fmt: skip
