"""The kinds of data movement of DualPath (paper §4), named alike for every backend, and what a run measures of each
(:class:`PathStats`), so a host run's real transfers sit next to the model's figures: ``storage read (PE)``, ``storage
read (DE)``, ``write-back``, ``PE→DE``, ``DE→PE``, ``all-to-all``, ``H2D``, ``D2H`` and ``forward pass``. Named from a
:class:`Layout` (the cluster's ``Topology`` is one), so the host backend needs nothing of the cluster's code."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Layout", "NodeLayout", "PathStats", "io_kind", "port_nodes", "real_bytes_by_kind", "transfer_kind"]


class NodeLayout(Protocol):
    """One node's ports and storage node, by id (the cluster's ``NodePorts``)."""

    @property
    def index(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def snic_rx(self) -> int: ...
    @property
    def snic_tx(self) -> int: ...
    @property
    def dram(self) -> int: ...
    @property
    def cnic_tx(self) -> tuple[int, ...]: ...
    @property
    def cnic_rx(self) -> tuple[int, ...]: ...
    @property
    def storage_node(self) -> int: ...


class Layout(Protocol):
    """Every node's ports and the storage cluster's (the cluster's ``Topology``)."""

    @property
    def nodes(self) -> Sequence[NodeLayout]: ...
    @property
    def storage_read(self) -> int: ...
    @property
    def storage_write(self) -> int: ...


def transfer_kind(topology: Layout, path: tuple[int, ...]) -> str:
    """The kind of a transfer along ``path`` (port ids of ``topology``)."""
    nodes = port_nodes(topology)
    first, last = nodes.get(path[0]), nodes.get(path[-1])
    if first is None or last is None:
        return "other"
    if first == last:
        return "H2D" if path[0] == topology.nodes[first].dram else "D2H"
    if path[0] == topology.nodes[first].dram and path[-1] == topology.nodes[last].dram:
        return "pool read"
    roles = topology.nodes[first].role, topology.nodes[last].role
    return "all-to-all" if roles[0] == roles[1] else f"{roles[0].upper()}→{roles[1].upper()}"


def io_kind(topology: Layout, node: int, kind: str) -> str:
    """The kind of a storage I/O (``"read"`` or ``"write"``) of cluster node ``node``."""
    return f"storage read ({topology.nodes[node].role.upper()})" if kind == "read" else "write-back"


_NODES_OF: dict[int, dict[int, int]] = {}


def port_nodes(topology: Layout) -> dict[int, int]:
    """The node of each of ``topology``'s node ports (the storage cluster's are nobody's)."""
    nodes = _NODES_OF.get(id(topology))
    if nodes is None:
        nodes = {}
        for n in topology.nodes:
            for port in (n.snic_rx, n.snic_tx, n.dram, *n.cnic_tx, *n.cnic_rx):
                nodes[port] = n.index
        _NODES_OF[id(topology)] = nodes
    return nodes


@dataclass
class PathStats:
    """What a run measured of one kind of data movement: count, bytes, seconds, and the model's idle time."""

    count: int = 0
    modelled_bytes: int = 0
    real_bytes: int = 0
    seconds: float = 0.0
    max_seconds: float = 0.0
    idle_seconds: float = 0.0

    def add(self, modelled: int, real: int, seconds: float, idle_seconds: float = 0.0) -> None:
        self.count += 1
        self.modelled_bytes += modelled
        self.real_bytes += real
        self.seconds += seconds
        self.max_seconds = max(self.max_seconds, seconds)
        self.idle_seconds += idle_seconds

    def merge(self, other: PathStats) -> None:
        self.count += other.count
        self.modelled_bytes += other.modelled_bytes
        self.real_bytes += other.real_bytes
        self.seconds += other.seconds
        self.max_seconds = max(self.max_seconds, other.max_seconds)
        self.idle_seconds += other.idle_seconds

    def to_wire(self) -> dict[str, float]:
        return dict(self.__dict__)

    @classmethod
    def from_wire(cls, data: dict[str, float]) -> PathStats:
        return cls(int(data["count"]), int(data["modelled_bytes"]), int(data["real_bytes"]), float(data["seconds"]),
                   float(data["max_seconds"]), float(data.get("idle_seconds", 0.0)))  # fmt: skip

    def summary(self) -> dict[str, float]:
        """Per operation: mean and max seconds, mean modelled bytes; the real bytes' rate while moving."""
        count = self.count or 1
        return {
            "count": self.count, "mean_s": self.seconds / count, "max_s": self.max_seconds,
            "idle_mean_s": self.idle_seconds / count,
            "mean_modelled_bytes": self.modelled_bytes / count, "real_bytes": self.real_bytes,
            "real_bytes_per_s": self.real_bytes / self.seconds if self.seconds else 0.0,
        }  # fmt: skip


def real_bytes_by_kind(measured: Mapping[str, PathStats]) -> dict[str, int]:
    """Real bytes by what moved them: the network (every transfer kind), storage reads, write-backs."""
    out = Counter[str]()
    for kind, stats in measured.items():
        what = "read" if kind.startswith("storage read") else "write" if kind == "write-back" else "network"
        if stats.real_bytes:
            out[what] += stats.real_bytes
    return dict(out)
