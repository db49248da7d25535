"""The cluster's door to the data plane, which books every byte it is asked to move (:class:`Ledger`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dualpath_emu.host.paths import PathStats, io_kind, transfer_kind
from dualpath_emu.cluster.topology import Topology
from dualpath_emu.runtime.engine import DataPlane, DecodeReport, Extents, Hop, Then, forward_bytes

__all__ = ["Booking", "Hop", "Ledger", "ProbingLedger", "measure_spans"]


class Booking:
    """What one process's engines asked the data plane to move, per ``(path, lane)``; ``probe``: timed too."""

    def __init__(self, probe: bool = False) -> None:
        self.probe = probe
        self.by_path: dict[tuple[tuple[int, ...], int], list[int]] = {}
        """``[bytes, transfers]`` per ``(path, lane)`` (few distinct paths); per port summed when asked for."""
        self.measured: dict[str, PathStats] = {}
        """Probing: per kind of data movement (:mod:`~dualpath_emu.host.paths`), its count and times."""
        self._sources: list[Callable[[Booking], None]] = []

    def add_source(self, source: Callable[[Booking], None]) -> None:
        """``source(booking)`` books what moved without a request (the core's decode stepping) when totals are read."""
        self._sources.append(source)

    def book(self, path: tuple[int, ...], lane: int, size: int, count: int = 1) -> None:
        tally = self.by_path.get((path, lane))
        if tally is None:
            self.by_path[(path, lane)] = [size, count]
        else:
            tally[0] += size
            tally[1] += count

    def _per_port(self, field: int) -> dict[tuple[int, int], int]:
        for source in self._sources:
            source(self)
        totals: dict[tuple[int, int], int] = {}
        for (path, lane), tally in self.by_path.items():
            for port in path:
                totals[(port, lane)] = totals.get((port, lane), 0) + tally[field]
        return totals

    @property
    def bytes(self) -> dict[tuple[int, int], int]:
        """Bytes booked per ``(port, lane)``."""
        return self._per_port(0)

    @property
    def transfers(self) -> dict[tuple[int, int], int]:
        """Transfers booked per ``(port, lane)`` (a forward pass's per-layer transfers count one each)."""
        return self._per_port(1)


class Ledger:
    """An engine's data plane as the cluster uses it: books every byte, names storage by cluster node."""

    def __init__(self, plane: DataPlane, topology: Topology, booking: Booking) -> None:
        self._plane = plane
        self._topology = topology
        self._booking = booking
        self._book = booking.book

    def transfer(self, path: tuple[int, ...], lane: int, size: int, then: Then | None = None) -> None:
        """Move ``size`` bytes on ``lane`` along ``path``; ``then(now)`` when done (``None``: nobody waits)."""
        self._book(path, lane, size)
        self._plane.transfer(path, lane, size, then)

    def io(self, node: int, kind: str, lane: int, size: int, extents: Extents = (), then: Then | None = None) -> None:
        """A storage ``"read"`` or ``"write"`` of cluster node ``node``; ``extents``: the Full Blocks it moves."""
        self._book(self._topology.storage_io_path(node, kind), lane, size)
        self._plane.io(self._topology.nodes[node].storage_node, kind, lane, size, extents, then)

    def forward(self, n_layers: int, ranks: Sequence[tuple[Hop | None, int, Hop | None]], ffn_ns: int,
                collectives: Sequence[Hop], then: Then) -> None:  # fmt: skip
        for load, _, store in ranks:
            for hop in (load, store):
                if hop is not None:
                    self._book(hop[0], hop[1], hop[2] * n_layers, n_layers)
        for path, lane, size in collectives:
            self._book(path, lane, size * n_layers, n_layers)
        self._plane.forward(n_layers, ranks, ffn_ns, collectives, then)

    def timer(self, at_ns: int, then: Then) -> None:
        """Call ``then(now)`` at ``at_ns``."""
        self._plane.timer(at_ns, then)

    def set_port_factor(self, port: int, factor: float) -> None:
        """A fault on ``port`` (no bytes to book)."""
        self._plane.set_port_factor(port, factor)

    def set_port_latency(self, port: int, extra_ns: int) -> None:
        """A fault on ``port`` (no bytes to book)."""
        self._plane.set_port_latency(port, extra_ns)

    def decode_node(self, report: DecodeReport, **spec: Any) -> int:
        """Add a node's decode GPUs to the data plane; what they move on their own is booked from the core."""
        return self._plane.decode_node(report, **spec)

    def decode_join(
        self, node: int, gpu: int, rid: int, prompt: int, gen: int, produced: int, stored_blocks: int, context: int
    ) -> None:
        """Request ``rid`` joins GPU ``gpu`` of decode node ``node`` now."""
        self._plane.decode_join(node, gpu, rid, prompt, gen, produced, stored_blocks, context)

    def decode_bytes(self, node: int) -> dict[str, Any] | None:
        """What decode node ``node`` moved on its own so far."""
        return self._plane.decode_bytes(node)

    def decode_reset(self, node: int) -> None:
        """Decode node ``node`` drops every request now: an engine crash (no bytes to book)."""
        self._plane.decode_reset(node)

    def discard(self, extents: Extents) -> None:
        """Stored blocks a bounded store evicted (no bytes move: none to book)."""
        self._plane.discard(extents)

    def pool(self, node: int, op: str, extents: Extents) -> None:
        """A node's DRAM pool holds, drops or serves these blocks (the bytes a read moves are its transfer's)."""
        self._plane.pool(node, op, extents)


class ProbingLedger(Ledger):
    """A :class:`Ledger` that also times every forward pass (for a host-backend comparison); changes nothing."""

    def forward(self, n_layers: int, ranks: Sequence[tuple[Hop | None, int, Hop | None]], ffn_ns: int,
                collectives: Sequence[Hop], then: Then) -> None:  # fmt: skip
        size, measured = forward_bytes(n_layers, ranks, collectives), self._booking.measured
        start = self._plane.clock_ns()

        def done(now: int) -> None:
            measured.setdefault("forward pass", PathStats()).add(size, 0, (now - start) / 1e9)
            then(now)

        super().forward(n_layers, ranks, ffn_ns, collectives, done)


def measure_spans(
    booking: Booking, topology: Topology, spans: Sequence[tuple[str, list[int], int, int, int, int, int]]
) -> None:
    """Add the core's spans (every modelled transfer and storage I/O) to ``booking``'s measurements."""
    measured = booking.measured
    node_of = {n.storage_node: n.index for n in topology.nodes}
    for kind, path, storage_node, _lane, size, start, end in spans:
        if kind == "transfer":
            what = transfer_kind(topology, tuple(path))
        else:
            what = io_kind(topology, node_of[storage_node], kind)
        measured.setdefault(what, PathStats()).add(size, 0, (end - start) / 1e9)
