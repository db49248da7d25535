"""What the cluster's engines share: their settings and data plane (:class:`ClusterEngine`), the pull of work from the
scheduler (:class:`EngineGroup`), the hit's Full Blocks and the MoE all-to-all volume that crosses the network."""

from __future__ import annotations

from collections.abc import Sequence

from dualpath_emu.cluster.catalog import ModelSpec
from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.ledger import Ledger
from dualpath_emu.cluster.messages import Fetch, Lost, Restart
from dualpath_emu.cluster.pool import Pool
from dualpath_emu.cluster.topology import KV_LANE, Topology
from dualpath_emu.runtime.engine import DataPlane, Engine, Extents, Outbox, Then, on

__all__ = [
    "NS",
    "ClusterEngine",
    "EngineGroup",
    "hit_extents",
    "inter_node_a2a_bytes",
    "join",
    "read_hit",
    "stored_tokens",
]

NS = 1_000_000_000


def hit_extents(context: int, hit: int, first: int = 0) -> Extents:
    """The Full Blocks of a hit of ``hit`` tokens of ``context`` (its whole blocks), from block ``first`` on."""
    blocks = hit // BLOCK_TOKENS - first
    return ((context, first, blocks),) if blocks > 0 else ()


def stored_tokens(hit: int, pooled: Sequence[int], kept: bool) -> int:
    """Of a hit of ``hit`` tokens, those read from storage (what a read queue counts): none if kept in the decode
    GPU's HBM, else those the DRAM pool does not hold (``pooled``: ``node, tokens`` pairs, flat)."""
    if kept:
        return 0
    return hit - sum(pooled[1::2]) if pooled else hit


def read_hit(plane: Ledger, topology: Topology, now: int, node: int, gpu: int, context: int, hit: int,
             pooled: Sequence[int], kv_bytes: int, then: Then, first: int = 0) -> None:  # fmt: skip
    """Bring a hit of ``hit`` tokens of ``context`` into ``node``'s DRAM (its PE or DE buffer), then ``then``: the
    runs the DRAM pool holds (``pooled``: ``node, tokens`` pairs, flat, one per run of blocks in block order) from
    the nodes holding them, one transfer per node over the compute network through GPU ``gpu``'s CNICs at both ends
    (a run on ``node`` itself is there already; the pool serves each node's blocks), and the rest from storage
    through ``node``'s storage NIC (§4, Fig. 4 steps 1-2). ``first``: a split read's part from that token on (a
    whole block's start; nothing pooled)."""
    tokens_of: dict[int, int] = {}  # source -> its tokens, in the order of its first run
    blocks_of: dict[int, list[tuple[int, int, int]]] = {}  # source -> its runs' Full Blocks
    start = block = 0
    for i in range(0, len(pooled), 2):
        source, end = pooled[i], start + pooled[i + 1]
        tokens_of[source] = tokens_of.get(source, 0) + pooled[i + 1]
        last = end // BLOCK_TOKENS
        if last > block:
            blocks_of.setdefault(source, []).append((context, block, last - block))
        start, block = end, last
    moves: list[tuple[tuple[int, ...], int]] = []
    for source, tokens in tokens_of.items():
        if source in blocks_of:
            plane.pool(source, "read", tuple(blocks_of[source]))
        if source != node:
            moves.append((topology.buffer_to_buffer(source, gpu, node, gpu), tokens * kv_bytes))
    start = max(start, first)
    stored = hit - start
    if not moves and stored <= 0:
        plane.timer(now, then)  # the pool on this node holds it all
        return
    done = join(len(moves) + (stored > 0), then)
    for path, size in moves:
        plane.transfer(path, KV_LANE, size, done)
    if stored > 0:
        plane.io(node, "read", KV_LANE, stored * kv_bytes, hit_extents(context, hit, start // BLOCK_TOKENS), done)


def join(count: int, then: Then) -> Then:
    """A ``then`` for each of ``count`` pieces of work that calls ``then`` when the last of them is done."""
    if count == 1:
        return then
    left = [count]

    def one(now: int) -> None:
        left[0] -= 1
        if left[0] == 0:
            then(now)

    return one


class ClusterEngine(Engine):
    """What every engine has: the run's settings (:class:`Cluster`) and a :class:`Ledger` over its data plane."""

    def __init__(self, name: str, cluster: Cluster, out: Outbox, plane: DataPlane) -> None:
        super().__init__(name, out)
        self.cluster = cluster
        self.plane = cluster.ledger(plane)


class EngineGroup(ClusterEngine):
    """An engine group's leader: pulls work at most once per fetch period (§6.1) through its standing :class:`Fetch`."""

    def __init__(
        self, name: str, cluster: Cluster, nodes: Sequence[int], out: Outbox, plane: DataPlane, restarted: bool = False
    ) -> None:
        super().__init__(name, cluster, out, plane)
        self.nodes = list(nodes)
        self._down = False  # Crashed and not restarted yet: work that comes is lost.
        self._epoch = 0
        """Crashes so far: what the data plane completes for an earlier epoch belongs to a crashed engine."""
        self._timeout_ns = round(cluster.config.read_timeout_s * NS) if cluster.config.faults.any else 0
        """How long a hit read may stall on a dead storage NIC before it is given up (0: no faults, no timers)."""
        self.restarted = restarted
        """A new process in place of one that died (``--restart-crashed``): it starts by saying so."""

    def start(self, now_ns: int) -> None:
        if self.restarted:
            # The scheduler knows what it had sent the dead process: all of it is lost. Its pools start empty
            # (announced again: the invariant checker counts them from zero).
            self.out.send("scheduler", Lost((), "restarted"))
            for pool in self.pools():
                pool.announce()
        self.out.send("scheduler", Fetch(tuple(self.nodes), round(self.cluster.config.fetch_period_s * NS)))

    @on(Restart)
    def on_restart(self, now: int, msg: Restart, sender: str) -> None:
        """Back after a crash, empty: fetch work again."""
        if self._down:
            self._down = False
            self.start(now)

    def pools(self) -> list[Pool]:
        """The DRAM buffers and HBM pools this engine holds (what a crash empties)."""
        return []


def inter_node_a2a_bytes(model: ModelSpec, nodes: int) -> float:
    """MoE dispatch + combine bytes per token per layer (averaged over all layers) that cross the compute
    network, for an EP group over ``nodes`` nodes. As DeepEP does, a token goes once to each remote node that
    hosts one of its ``k`` experts (spread within it over NVLink): on average ``(nodes - 1) × (1 - (1 -
    1/nodes)^k)`` remote nodes with experts evenly spread [derived]."""
    k = model.activated_experts
    if nodes <= 1 or k == 0:
        return 0.0
    per_expert = (model.a2a_dispatch_bytes_per_token_layer + model.a2a_combine_bytes_per_token_layer) / k
    remote_nodes = (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** k)
    return per_expert * remote_nodes * model.moe_layers / model.layers
