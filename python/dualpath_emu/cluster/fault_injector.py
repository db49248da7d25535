"""The engine that makes a run's faults happen (:mod:`~dualpath_emu.cluster.faults` says what they are): a timer at each
fault's start and end; each change goes to its data plane (``set_port_factor``/``set_port_latency``; the host backend's
passes it on to the run's other processes), the event log (:class:`~dualpath_emu.cluster.observations.FaultChanged`) and
the scheduler (:class:`~dualpath_emu.cluster.messages.Health`). It is in the cluster only when the plan has faults, so a
run without any is unchanged, event for event."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import cast

from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.engines import NS, ClusterEngine
from dualpath_emu.cluster.faults import MAX_TIME_S, Fault, Kind, engine_group_names, target_ports
from dualpath_emu.cluster.messages import Crash, Health, Restart, Start
from dualpath_emu.cluster.observations import FaultChanged, FaultPlanned
from dualpath_emu.cluster.topology import Topology, port_names
from dualpath_emu.runtime.engine import DataPlane, Outbox, on, seeded_random

__all__ = ["FaultInjector"]


@dataclass
class _Active:
    """The faults acting on one port now, the lowest factor and largest latency kept in two heaps."""

    faults: dict[int, tuple[float, int]] = field(default_factory=dict)
    _factors: list[tuple[float, int]] = field(default_factory=list)
    """(factor, fault number): a min-heap, with entries of ended faults not yet dropped."""
    _latencies: list[tuple[int, int]] = field(default_factory=list)
    """(-latency ns, fault number): a min-heap (the largest latency first), the same."""

    def add(self, number: int, effect: tuple[float, int]) -> None:
        self.faults[number] = effect
        heapq.heappush(self._factors, (effect[0], number))
        heapq.heappush(self._latencies, (-effect[1], number))

    def remove(self, number: int) -> None:
        if self.faults.pop(number, None) is None:
            return
        # Ended entries below the top stay until they reach it: rebuilt when they outnumber the live ones,
        # so the heaps stay within a constant of the faults acting.
        if len(self._factors) > 2 * len(self.faults) + 16:
            self._factors = [(f, n) for n, (f, _) in self.faults.items()]
            self._latencies = [(-ns, n) for n, (_, ns) in self.faults.items()]
            heapq.heapify(self._factors)
            heapq.heapify(self._latencies)

    def state(self) -> tuple[float, int]:
        if not self.faults:
            self._factors.clear()
            self._latencies.clear()
            return 1.0, 0
        factors, latencies, live = self._factors, self._latencies, self.faults
        while factors[0][1] not in live:
            heapq.heappop(factors)
        while latencies[0][1] not in live:
            heapq.heappop(latencies)
        return factors[0][0], -latencies[0][0]


class FaultInjector(ClusterEngine):
    """Makes a run's :class:`FaultPlan` happen (see the module)."""

    def __init__(self, cluster: Cluster, out: Outbox, plane: DataPlane, seed: int) -> None:
        super().__init__("faults", cluster, out, plane)
        self.plan = cluster.config.faults
        topology: Topology = cluster.topology
        self._gpus = cluster.config.node.gpus
        self._nodes = len(topology.nodes)
        self._pe_nodes = cluster.config.pe_nodes
        self._port_ids = port_names(topology)
        c = cluster.config
        engines = engine_group_names(c.pe_nodes, c.de_nodes, c.prefill_ep_nodes)
        for i, fault in enumerate(self.plan.faults):  # a plan built in Python skipped the reader's check
            if (
                (fault.target not in engines)
                if fault.kind == "crash"
                else target_ports(fault.target, self._nodes, self._gpus) is None
            ):
                raise ValueError(f"faults[{i}]: the cluster has no {'engine' if fault.kind == 'crash' else 'port, NIC or node'} "
                                 f"{fault.target!r} (spelled as the cluster names it: n1.snic, n0.cnic2.tx, de2)")  # fmt: skip
        self._active: dict[str, _Active] = {}
        self._next = 0
        self._rng = seeded_random(seed, "faults")
        self._origin = 0
        self._crashes: dict[str, int] = {}
        """Crashes acting on each engine now (one that overlaps another keeps the engine down longer)."""

    @on(Start)
    def on_start(self, now_ns: int, msg: Start, sender: str) -> None:
        """The client started the run: faults are timed from now (0 in virtual time)."""
        self._origin = now_ns
        for fault in self.plan.faults:
            self._schedule(fault, now_ns)
        random = self.plan.random
        if random is not None:
            for node in range(self._nodes):
                for kind, rate in random.per_node_hour.items():
                    if rate > 0:
                        self._draw(cast(Kind, kind), node, rate, now_ns)

    def _draw(self, kind: Kind, node: int, rate: float, after_ns: int) -> None:
        """The next random ``kind`` fault on ``node`` after ``after_ns`` (drawn in time order)."""
        random = self.plan.random
        assert random is not None
        per_s = rate / 3600.0
        if not per_s > 0.0:  # a rate too small to draw from (the reader refuses below MIN_RATE_PER_NODE_HOUR)
            return
        gap_s = self._rng.expovariate(per_s)
        at_s = (after_ns - self._origin) / NS + gap_s
        if kind == "crash":  # the engine that hosts the node's GPUs
            if not math.isfinite(at_s) or at_s > MAX_TIME_S:
                return
            role = "pe" if node < self._pe_nodes else "de"
            fault = Fault(kind, self.cluster.group_name(role, node), at_s, restart_s=random.restart_s)
        else:
            which = self._rng.randrange(self._gpus + 1)
            duration_s = self._rng.expovariate(1.0 / random.mean_duration_s)
            target = f"n{node}.snic" if which == self._gpus else f"n{node}.cnic{which}"
            if not math.isfinite(at_s) or at_s > MAX_TIME_S:
                return
            fault = Fault(kind, target, at_s, duration_s, random.factor if kind == "degrade" else 0.0,
                          random.latency_s if kind == "latency" else 0.0)  # fmt: skip

        def begin(now: int) -> None:
            self._begin(now, number, fault)
            self._draw(kind, node, rate, now)

        number = self._number()
        self.plane.timer(self._origin + round(at_s * NS), begin)

    def _number(self) -> int:
        self._next += 1
        return self._next

    def _schedule(self, fault: Fault, now_ns: int) -> None:
        number = self._number()
        self.plane.timer(now_ns + round(fault.at_s * NS), lambda now: self._begin(now, number, fault))

    def _begin(self, now: int, number: int, fault: Fault) -> None:
        if fault.kind == "crash":
            self._crash(now, number, fault)
            return
        factor = 0.0 if fault.kind == "down" else (fault.factor if fault.kind in ("degrade", "slow_storage") else 1.0)
        latency_ns = round(fault.latency_s * NS)
        duration_ns = -1 if fault.duration_s is None else max(1, round(fault.duration_s * NS))
        self.out.observe(FaultPlanned(fault.kind, fault.target, now - self._origin, duration_ns))
        self.out.observe(FaultChanged("start", fault.kind, fault.target, factor, latency_ns))
        self._apply(now, number, fault, (factor, latency_ns))
        if fault.duration_s is not None:
            self.plane.timer(now + duration_ns, lambda t: self._end(t, number, fault))

    def _crash(self, now: int, number: int, fault: Fault) -> None:
        """Engine ``fault.target`` crashes now and is back ``restart_s`` later (or after a later crash's)."""
        engine = fault.target
        restart_ns = max(1, round(fault.restart_s * NS))
        self.out.observe(FaultPlanned(fault.kind, engine, now - self._origin, restart_ns))
        self.out.observe(FaultChanged("start", "crash", engine, 0.0, 0))
        self._crashes[engine] = self._crashes.get(engine, 0) + 1
        if self._crashes[engine] == 1:
            self.out.send(engine, Crash())

        def restart(now: int) -> None:
            self.out.observe(FaultChanged("end", "crash", engine, 1.0, 0))
            self._crashes[engine] -= 1
            if self._crashes[engine] == 0:
                self.out.send(engine, Restart())

        self.plane.timer(now + restart_ns, restart)

    def _end(self, now: int, number: int, fault: Fault) -> None:
        self.out.observe(FaultChanged("end", fault.kind, fault.target, 1.0, 0))
        self._apply(now, number, fault, None)

    def _apply(self, now: int, number: int, fault: Fault, effect: tuple[float, int] | None) -> None:
        """Start (``effect``) or end (None) fault ``number``; tell the plane and the scheduler what changed."""
        ports = target_ports(fault.target, self._nodes, self._gpus)
        assert ports is not None  # checked when the plan was read
        changed: list[tuple[str, float]] = []
        for name in ports:
            active = self._active.setdefault(name, _Active())
            before = active.state()
            if effect is None:
                active.remove(number)
            else:
                active.add(number, effect)
            after = active.state()
            port = self._port_ids[name]
            if after[0] != before[0]:
                self.plane.set_port_factor(port, after[0])
                changed.append((name, after[0]))
            if after[1] != before[1]:
                self.plane.set_port_latency(port, after[1])
        if changed:
            health = Health(tuple(p for p, _ in changed), tuple(f for _, f in changed))
            self.out.send("scheduler", health)
            # The engine group of a node whose storage NIC changed moves or gives up its reads (failover).
            nodes = {int(p[1 : p.index(".")]) for p, f in changed if p.endswith(".snic.rx")}
            groups = {self.cluster.group_name("pe" if n < self._pe_nodes else "de", n) for n in nodes}
            for group in sorted(groups):
                self.out.send(group, health)
