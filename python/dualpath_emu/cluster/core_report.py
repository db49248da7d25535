"""What a run's results need from the data-plane core, as plain data (:class:`CoreReport`): read from the run's
own core in virtual time, written by the data-plane service's process in real time; either way the figures of
:class:`~dualpath_emu.cluster.run.SystemResult` are computed from it by the same code."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dualpath_emu._core import Core
from dualpath_emu.cluster.topology import Topology

__all__ = ["PORT_KINDS", "ROLES", "CoreReport", "PortReport", "ports_of"]

ROLES = ("pe", "de")
PORT_KINDS = ("snic.rx", "snic.tx", "cnic.tx", "cnic.rx", "dram")


def ports_of(topology: Topology, role: str, kind: str) -> list[int]:
    """The ports of ``kind`` (one of :data:`PORT_KINDS`) of every node of ``role``."""
    nodes = [n for n in topology.nodes if n.role == role]
    if kind == "snic.rx":
        return [n.snic_rx for n in nodes]
    if kind == "snic.tx":
        return [n.snic_tx for n in nodes]
    if kind == "dram":
        return [n.dram for n in nodes]
    if kind == "cnic.tx":
        return [p for n in nodes for p in n.cnic_tx]
    if kind == "cnic.rx":
        return [p for n in nodes for p in n.cnic_rx]
    raise ValueError(f"unknown port kind {kind!r}")


@dataclass(frozen=True)
class PortReport:
    """One port's totals: per lane the bytes that flowed (its rates' integral) and that finished."""

    name: str
    rate: float
    capacity: float
    fluid_bytes: list[float]
    completed_bytes: list[int]


@dataclass(frozen=True)
class CoreReport:
    """Every port's totals, utilisation p99 and timeline per (port kind, role), the core's counters and clock."""

    ports: list[PortReport]
    p99: dict[str, dict[str, float]]
    timelines: dict[str, dict[str, list[float]]]
    stats: dict[str, int]
    now_ns: int
    until_ns: int
    sample_interval_ns: int | None

    @classmethod
    def of(cls, core: Core, topology: Topology | None, until_ns: int) -> CoreReport:
        """Read the report from ``core`` (utilisation samples before ``until_ns``, per role of ``topology``)."""
        ports = []
        for port in range(core.port_count):
            counters = core.port_counters(port)
            fluid, completed = counters["fluid_bytes"], counters["completed_bytes"]
            assert isinstance(fluid, list) and isinstance(completed, list)
            ports.append(PortReport(core.port_name(port), core.port_rate(port), core.capacity(port),
                                    [float(b) for b in fluid], [int(b) for b in completed]))  # fmt: skip
        p99: dict[str, dict[str, float]] = {}
        timelines: dict[str, dict[str, list[float]]] = {}
        for kind in PORT_KINDS if topology is not None else ():
            assert topology is not None
            # At the interval the core samples at now (widened on long runs: the series stay within its budget).
            p99[kind] = {
                role: core.utilisation_quantile(ports_of(topology, role, kind), 0.99, until_ns) for role in ROLES
            }
            timelines[kind] = {role: core.utilisation_mean(ports_of(topology, role, kind), until_ns) for role in ROLES}
        return cls(ports, p99, timelines, dict(core.stats()), core.now_ns, until_ns, core.sample_interval_ns)

    def to_wire(self) -> dict[str, Any]:
        """As JSON-able data (:meth:`from_wire` rebuilds it)."""
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> CoreReport:
        return cls(**{**data, "ports": [PortReport(**p) for p in data["ports"]]})

    def kv_bytes(self, port: int, lane: int) -> float:
        return self.ports[port].fluid_bytes[lane]

    def port_bytes(self, port: int) -> float:
        return float(sum(self.ports[port].fluid_bytes))
