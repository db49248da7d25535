"""The engine that makes a run's background traffic (``[[network.background]]``,
:class:`~dualpath_emu.cluster.topology.BackgroundTraffic`): traffic the cluster's engines do not make -- a checkpoint
loaded through the decode nodes' storage NICs, a bulk copy on a compute NIC -- competing with theirs for the ports it
crosses. Each burst is one transfer per target port, from the traffic's own source port (``bg<i>.<port>``, whose rate
caps it) through the target, on the traffic's lane; nobody waits for it. The policies do not see it (only what it
does to the ports they read). It is in the cluster only when there is background traffic, so a run without any is
unchanged, event for event."""

from __future__ import annotations

from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.engines import NS, ClusterEngine
from dualpath_emu.cluster.messages import Start
from dualpath_emu.runtime.engine import DataPlane, Outbox, on

__all__ = ["BACKGROUND", "BackgroundLoad"]

BACKGROUND = "background"
"""The engine's name."""


class BackgroundLoad(ClusterEngine):
    """Starts each burst of the run's background traffic at its time (see the module)."""

    def __init__(self, cluster: Cluster, out: Outbox, plane: DataPlane) -> None:
        super().__init__(BACKGROUND, cluster, out, plane)
        self.traffic = cluster.config.network.background
        self.bursts = 0
        """Bursts started so far (a transfer per target port each)."""

    @on(Start)
    def on_start(self, now_ns: int, msg: Start, sender: str) -> None:
        """The client started the run: the traffic is timed from now (0 in virtual time)."""
        for traffic, ports in zip(self.traffic, self.cluster.topology.background, strict=True):
            for start_s, length_s in traffic.bursts():
                size = round(traffic.rate_bytes_per_s * length_s)
                if size <= 0:
                    continue
                paths = [(source, target) for source, target in ports]

                def burst(
                    now: int, paths: list[tuple[int, int]] = paths, size: int = size, lane: int = traffic.lane
                ) -> None:
                    self.bursts += 1
                    for path in paths:
                        self.plane.transfer(path, lane, size)

                self.plane.timer(now_ns + round(start_s * NS), burst)
