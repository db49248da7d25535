"""What a run's results need from the data-plane core, as plain data (:class:`CoreReport`).

In virtual time the core is in the run's own process and the report is read from it when the run ends; in
real time the core lives in the data-plane service's process, which writes the report when it has drained,
and the launcher computes the results from it and the actors' merged metrics. Either way the figures of
:class:`~dualpath_emu.cluster.run.SystemResult` are computed from the same report, by the same code.
"""

from __future__ import annotations

import math
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


def _samples(core: Core, port: int, until_ns: int) -> tuple[list[float], int]:
    """A port's utilisation samples before ``until_ns`` and how many intervals that is, computed as
    ``Core.utilisation_mean`` and ``utilisation_quantile`` do, but at the interval the core uses now: those two
    count intervals at the interval first asked for, so once a long run has widened it their series grow with
    emulated time (and over-count each widened sample). Equal to theirs, bit for bit, on a run never widened."""
    interval = core.sample_interval_ns
    if interval is None:
        raise ValueError("the core samples no utilisation: create it with sample_interval_ns")
    intervals = -(-until_ns // interval)
    values = core.utilisation(port)[:intervals]  # bytes / (rate × interval), bounded by the core's budget
    now = core.now_ns
    if values and len(values) * interval > now:  # the last one ends after now: over the part before it
        rate = core.port_rate(port)
        last = len(values) - 1
        covered = max(1, now - last * interval)
        values[last] = values[last] * (rate * interval / 1e9) / (rate * covered / 1e9)
    return values, intervals


def _mean(series: list[tuple[list[float], int]]) -> list[float]:
    """Per interval, the mean over the ports (as ``Core.utilisation_mean``)."""
    total: list[float] = [0.0] * max((n for _, n in series), default=0)
    for values, _ in series:
        for k, u in enumerate(values):
            total[k] += u
    n = float(max(1, len(series)))
    return [t / n for t in total]


def _quantile(series: list[tuple[list[float], int]], q: float) -> float:
    """The nearest-rank ``q``-quantile over every (port, interval) (as ``Core.utilisation_quantile``)."""
    values = sorted(u for v, _ in series for u in v)
    total = sum(n for _, n in series)
    if total == 0:
        return 0.0
    zeros = total - len(values)  # intervals with no sample: idle
    rank = min(total, max(1, math.ceil(q * total)))
    return 0.0 if rank <= zeros else max(0.0, values[rank - zeros - 1])


@dataclass(frozen=True)
class PortReport:
    """One port's totals: per lane the bytes that flowed (the integral of its rates) and the bytes of the
    transfers that finished."""

    name: str
    rate: float
    capacity: float
    fluid_bytes: list[float]
    completed_bytes: list[int]


@dataclass(frozen=True)
class CoreReport:
    """Every port's totals, the utilisation p99 and timeline per (port kind, role) up to ``until_ns``, the
    core's counters, its clock and its sampling interval."""

    ports: list[PortReport]
    p99: dict[str, dict[str, float]]
    timelines: dict[str, dict[str, list[float]]]
    stats: dict[str, int]
    now_ns: int
    until_ns: int
    sample_interval_ns: int | None

    @classmethod
    def of(cls, core: Core, topology: Topology | None, until_ns: int) -> CoreReport:
        """Read the report from ``core`` (its utilisation samples before ``until_ns``; per role of
        ``topology``'s nodes, none without one)."""
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
            series = {role: [_samples(core, p, until_ns) for p in ports_of(topology, role, kind)] for role in ROLES}
            p99[kind] = {role: _quantile(s, 0.99) for role, s in series.items()}
            timelines[kind] = {role: _mean(s) for role, s in series.items()}
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
