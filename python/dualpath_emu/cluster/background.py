"""The engine that makes a run's background traffic (``[[network.background]]``,
:class:`~dualpath_emu.cluster.topology.BackgroundTraffic`): traffic the cluster's engines do not make -- a checkpoint
loaded through the decode nodes' storage NICs, a bulk copy on a compute NIC -- competing with theirs for the ports it
crosses. Each burst is one transfer per target port, from the traffic's own source port (``bg<i>.<port>``, whose rate
caps it) through the target, on the traffic's lane, in pieces of at most :data:`PIECE_S` (so that a load lasting
longer than the workload stops with it: a piece due after the run is not started); nobody waits for it. The policies
do not see it (only what it does to the ports they read). It is in the cluster only when there is background
traffic, so a run without any is unchanged, event for event."""

from __future__ import annotations

from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.engines import NS, ClusterEngine
from dualpath_emu.cluster.messages import Start
from dualpath_emu.runtime.engine import DataPlane, Outbox, on

__all__ = ["BACKGROUND", "PIECE_S", "BackgroundLoad"]

BACKGROUND = "background"
"""The engine's name."""
PIECE_S = 1.0
"""The longest transfer a burst is made of (s): a burst is pieces back to back, each started by a timer."""


class BackgroundLoad(ClusterEngine):
    """Starts each burst of the run's background traffic at its time (see the module)."""

    def __init__(self, cluster: Cluster, out: Outbox, plane: DataPlane) -> None:
        super().__init__(BACKGROUND, cluster, out, plane)
        self.traffic = cluster.config.network.background

    @on(Start)
    def on_start(self, now_ns: int, msg: Start, sender: str) -> None:
        """The client started the run: the traffic is timed from now (0 in virtual time)."""
        for traffic, ports in zip(self.traffic, self.cluster.topology.background, strict=True):
            paths = [(source, target) for source, target in ports]
            for start_s, length_s in traffic.bursts():
                self._piece(now_ns + round(start_s * NS), length_s, traffic.rate_bytes_per_s, traffic.lane, paths)

    def _piece(self, at_ns: int, left_s: float, rate: float, lane: int, paths: list[tuple[int, int]]) -> None:
        """At ``at_ns``, start the next piece of a burst with ``left_s`` to go (and time the one after it)."""
        size = round(rate * min(left_s, PIECE_S))
        if size <= 0:
            return

        def start(now: int) -> None:
            for path in paths:
                self.plane.transfer(path, lane, size)
            if left_s > PIECE_S:
                self._piece(at_ns + round(PIECE_S * NS), left_s - PIECE_S, rate, lane, paths)

        self.plane.timer(at_ns, start)
