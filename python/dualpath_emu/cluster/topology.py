"""The cluster's data plane on the core: ports for every NIC, DRAM and the storage cluster, and the paths of every
data movement of the paper's §4 (docs/architecture.md, "The cluster model").

Per node (prefill nodes first): a storage NIC, a port each way (``n<i>.snic.rx``, ``.tx``); host DRAM (``n<i>.dram``,
both directions: §4.2's M); per GPU a compute NIC each way (``n<i>.cnic<g>.tx`` reads host memory or HBM, ``.rx``
writes them) with the paper's virtual lanes (A.1: model traffic on VL0, KV on VL2). The storage cluster is a port each
way (``3fs.read``, ``3fs.write``) with a per-I/O latency and a queue per node. The compute fabric is non-blocking, and
PCIe is no port: every GPU byte passes the GPU's own CNIC (§5.1), slower than a PCIe Gen5 ×16 link.

A scenario's ``[network]`` (:class:`NetworkSpec`) changes the compute NICs' lanes: isolation off (model traffic in the
KV's lane, as a fabric without QoS), or the VL tables an operator writes; and adds background traffic, a source port
per target whose rate caps it (``bg<i>.<port>``), that the engines do not make."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from dualpath_emu._core import Arbitration, Core
from dualpath_emu.cluster.catalog import NodeSpec

__all__ = [
    "KV_LANE", "MODEL_LANE", "BackgroundTraffic", "NetworkSpec", "NodePorts", "StorageSpec", "TokenBucket", "Topology",
    "VlTables",
    "build_topology", "port_names",
]  # fmt: skip

MODEL_LANE: Final = 0  # VL0: inference traffic (MoE dispatch/combine), high priority (paper A.1).
KV_LANE: Final = 2  # VL2: KV-cache traffic, low priority (paper A.1).


@dataclass(frozen=True)
class StorageSpec:
    """The 3FS-like storage cluster (bandwidth None: the storage NICs' together; per-node I/O queue depth)."""

    read_bytes_per_s: float | None = None
    write_bytes_per_s: float | None = None
    read_latency_s: float = 200e-6
    write_latency_s: float = 200e-6
    queue_depth: int = 64


@dataclass(frozen=True)
class VlTables:
    """A compute NIC's virtual-lane arbitration as an operator writes it (InfiniBand's ``qos_max_vls``,
    ``qos_high_limit``, ``qos_vlarb_high``, ``qos_vlarb_low``: ``"vl:weight,..."``), for ``Arbitration.parse``."""

    max_vls: int
    high_limit: int
    vlarb_high: str
    vlarb_low: str

    def arbitration(self) -> Arbitration:
        return Arbitration.parse(self.max_vls, self.high_limit, self.vlarb_high, self.vlarb_low)


@dataclass(frozen=True)
class BackgroundTraffic:
    """Traffic the engines do not make (``[[network.background]]``), e.g. a checkpoint loaded through the decode
    nodes' storage NICs: up to ``rate_bytes_per_s`` through each of ``ports`` (port names, as a fault names them) on
    ``lane``, from ``at_s`` for ``duration_s``; with ``period_s`` > 0, only the first ``on_s`` of each period."""

    ports: tuple[str, ...]
    rate_bytes_per_s: float
    at_s: float = 0.0
    duration_s: float = 60.0
    period_s: float = 0.0
    on_s: float = 0.0
    lane: int = KV_LANE

    def bursts(self) -> list[tuple[float, float]]:
        """Each burst's ``(start s, length s)``."""
        if self.period_s <= 0:
            return [(self.at_s, self.duration_s)]
        out, start, end = [], self.at_s, self.at_s + self.duration_s
        while start < end:
            out.append((start, min(self.on_s, end - start)))
            start += self.period_s
        return out


@dataclass(frozen=True)
class TokenBucket:
    """A token bucket on ``ports`` (``[[network.bucket]]``): each runs at its own rate (the line rate) while it has
    tokens, and at ``sustained_bytes_per_s`` once ``burst_bytes`` more than that have gone (a policer, or a NIC's
    burst credit)."""

    ports: tuple[str, ...]
    sustained_bytes_per_s: float
    burst_bytes: float


@dataclass(frozen=True)
class NetworkSpec:
    """The network's QoS and other traffic (``[network]``): ``isolation`` False puts model traffic in the KV's lane
    (one lane, no priority: a fabric without QoS); ``cnic_vl`` the compute NICs' VL tables (None: the paper's,
    App. A.1); ``background``: traffic the engines do not make; ``buckets``: token buckets on ports."""

    isolation: bool = True
    cnic_vl: VlTables | None = None
    background: tuple[BackgroundTraffic, ...] = ()
    buckets: tuple[TokenBucket, ...] = ()


@dataclass(frozen=True)
class NodePorts:
    index: int
    role: str  # ``"pe"`` or ``"de"``.
    snic_rx: int
    snic_tx: int
    dram: int
    cnic_tx: tuple[int, ...]
    cnic_rx: tuple[int, ...]
    storage_node: int


@dataclass(frozen=True)
class Topology:
    nodes: tuple[NodePorts, ...]
    storage_read: int
    storage_write: int
    model_lane: int = MODEL_LANE
    """The lane model traffic (collectives, the MoE all-to-all) takes: the KV's with isolation off."""
    background: tuple[tuple[tuple[int, int], ...], ...] = field(default=())
    """Per background traffic, ``(source port, target port)`` per target (:class:`BackgroundTraffic`)."""

    @property
    def pe_nodes(self) -> Sequence[NodePorts]:
        return [n for n in self.nodes if n.role == "pe"]

    @property
    def de_nodes(self) -> Sequence[NodePorts]:
        return [n for n in self.nodes if n.role == "de"]

    # --- paths (§4) ----------------------------------------------------------------------------------

    def h2d(self, node: int, gpu: int) -> tuple[int, ...]:
        """Host DRAM → HBM through the GPU's CNIC (loopback RDMA write, §5.1)."""
        n = self.nodes[node]
        return (n.dram, n.cnic_tx[gpu], n.cnic_rx[gpu])

    def d2h(self, node: int, gpu: int) -> tuple[int, ...]:
        """HBM → host DRAM through the GPU's CNIC."""
        n = self.nodes[node]
        return (n.cnic_tx[gpu], n.cnic_rx[gpu], n.dram)

    def gpu_to_buffer(self, node: int, gpu: int, to_node: int, to_gpu: int) -> tuple[int, ...]:
        """One GPU's HBM → another node's DRAM buffer, through both GPUs' CNICs (PE → DE buffer)."""
        src, dst = self.nodes[node], self.nodes[to_node]
        return (src.cnic_tx[gpu], dst.cnic_rx[to_gpu], dst.dram)

    def buffer_to_gpu(self, node: int, gpu: int, to_node: int, to_gpu: int) -> tuple[int, ...]:
        """A node's DRAM buffer → another node's GPU HBM, through both CNICs (DE buffer → PE, DE-read)."""
        src, dst = self.nodes[node], self.nodes[to_node]
        return (src.dram, src.cnic_tx[gpu], dst.cnic_rx[to_gpu])

    def buffer_to_buffer(self, node: int, gpu: int, to_node: int, to_gpu: int) -> tuple[int, ...]:
        """A node's DRAM → another node's DRAM, through the two GPUs' CNICs (a DRAM pool's blocks to a buffer)."""
        src, dst = self.nodes[node], self.nodes[to_node]
        return (src.dram, src.cnic_tx[gpu], dst.cnic_rx[to_gpu], dst.dram)

    def storage_io_path(self, node: int, kind: str) -> tuple[int, ...]:
        """The ports a storage I/O of ``node`` crosses (a read: storage → SNIC → DRAM; a write the other way)."""
        n = self.nodes[node]
        return (self.storage_read, n.snic_rx, n.dram) if kind == "read" else (n.dram, n.snic_tx, self.storage_write)

    def gpu_to_gpu(self, node: int, gpu: int, to_node: int, to_gpu: int) -> tuple[int, ...]:
        """HBM → HBM over the compute network (MoE dispatch/combine)."""
        return (self.nodes[node].cnic_tx[gpu], self.nodes[to_node].cnic_rx[to_gpu])


def build_topology(core: Core, node: NodeSpec, pe_nodes: int, de_nodes: int, storage: StorageSpec,
                   network: NetworkSpec = NetworkSpec()) -> Topology:  # fmt: skip
    """Add the cluster's ports and storage to ``core``; prefill nodes are 0 … pe_nodes-1, then decode nodes."""
    paper = network.cnic_vl.arbitration() if network.cnic_vl is not None else Arbitration.paper()
    buckets = {name: bucket for bucket in network.buckets for name in bucket.ports}

    def add_port(name: str, rate: float, arbitration: Arbitration | None = None) -> int:
        bucket = buckets.get(name)
        if bucket is None:
            return core.add_port(name, rate, arbitration=arbitration)
        if not bucket.sustained_bytes_per_s < rate:
            raise ValueError(f"port {name}: expected a sustained rate under the port's own {rate:g} B/s, got "
                             f"{bucket.sustained_bytes_per_s:g}")  # fmt: skip
        return core.add_port(name, bucket.sustained_bytes_per_s, peak_bytes_per_s=rate,
                             burst_bytes=bucket.burst_bytes, arbitration=arbitration)  # fmt: skip

    count = pe_nodes + de_nodes
    storage_read = add_port("3fs.read", storage.read_bytes_per_s or count * node.snic_bytes_per_s * node.snics)
    storage_write = add_port("3fs.write", storage.write_bytes_per_s or count * node.snic_bytes_per_s * node.snics)
    core.configure_storage(read_port=storage_read, write_port=storage_write,
                           read_latency_ns=round(storage.read_latency_s * 1e9),
                           write_latency_ns=round(storage.write_latency_s * 1e9))  # fmt: skip
    nodes: list[NodePorts] = []
    for i in range(count):
        role = "pe" if i < pe_nodes else "de"
        prefix = f"n{i}"
        snic_rx = add_port(f"{prefix}.snic.rx", node.snic_bytes_per_s * node.snics)
        snic_tx = add_port(f"{prefix}.snic.tx", node.snic_bytes_per_s * node.snics)
        dram = add_port(f"{prefix}.dram", node.host_dram_bytes_per_s)
        cnic_tx = tuple(add_port(f"{prefix}.cnic{g}.tx", node.cnic_bytes_per_s, paper) for g in range(node.gpus))
        cnic_rx = tuple(add_port(f"{prefix}.cnic{g}.rx", node.cnic_bytes_per_s, paper) for g in range(node.gpus))
        # The read path follows the storage cluster's own port (configure_storage).
        storage_node = core.add_storage_node(
            prefix, read_path=[snic_rx, dram], write_path=[dram, snic_tx], queue_depth=storage.queue_depth
        )
        nodes.append(NodePorts(i, role, snic_rx, snic_tx, dram, cnic_tx, cnic_rx, storage_node))
    topology = Topology(tuple(nodes), storage_read, storage_write, MODEL_LANE if network.isolation else KV_LANE)
    if not network.background:
        return topology
    names = port_names(topology)
    background = tuple(
        tuple((core.add_port(f"bg{i}.{name}", traffic.rate_bytes_per_s), names[name]) for name in traffic.ports)
        for i, traffic in enumerate(network.background)
    )
    return dataclasses.replace(topology, background=background)


def port_names(topology: Topology) -> dict[str, int]:
    """Every port of ``topology`` by its name (as :func:`build_topology` names them)."""
    out = {"3fs.read": topology.storage_read, "3fs.write": topology.storage_write}
    for n in topology.nodes:
        out.update({f"n{n.index}.snic.rx": n.snic_rx, f"n{n.index}.snic.tx": n.snic_tx, f"n{n.index}.dram": n.dram})
        for g, (tx, rx) in enumerate(zip(n.cnic_tx, n.cnic_rx, strict=True)):
            out.update({f"n{n.index}.cnic{g}.tx": tx, f"n{n.index}.cnic{g}.rx": rx})
    return out
