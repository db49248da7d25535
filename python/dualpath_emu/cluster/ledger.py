"""The cluster's door to the data plane, which books every byte it is asked to move (:class:`Ledger`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from dualpath_emu.cluster.paths import PathStats, io_kind, transfer_kind
from dualpath_emu.cluster.topology import Topology
from dualpath_emu.runtime.core_work import Completion, CoreWork, Extents, forward_bytes
from dualpath_emu.runtime.actors import ActorSystem

__all__ = ["Hop", "Ledger", "ProbingLedger"]

Hop = tuple[tuple[int, ...], int, int]
"""A per-layer transfer of a forward pass: ``(path, lane, bytes per layer)``."""


class Ledger:
    """The cluster's door to the data plane: forwards each request to the running loop's core work and
    books its bytes per (port, lane), so that the run can check that the core moved exactly what the
    actors asked for (every byte accounted, :func:`~dualpath_emu.cluster.invariants.check_ledger`)."""

    def __init__(self, system: ActorSystem, topology: Topology) -> None:
        self._system = system
        self._topology = topology
        self._work: CoreWork | None = None
        """The running loop's core work, found on first use (a run's loop does not change)."""
        self._by_path: dict[tuple[tuple[int, ...], int], list[int]] = {}
        """``[bytes, transfers]`` per ``(path, lane)``: a run has few distinct paths, so booking costs one
        dict update per transfer; the per-port totals are summed when asked for."""

    def _plane(self) -> CoreWork:
        work = self._work
        if work is None:
            work = self._work = self._system.data_plane
        return work

    def _book(self, path: tuple[int, ...], lane: int, size: int, count: int = 1) -> None:
        tally = self._by_path.get((path, lane))
        if tally is None:
            self._by_path[(path, lane)] = [size, count]
        else:
            tally[0] += size
            tally[1] += count

    def _per_port(self, field: int) -> dict[tuple[int, int], int]:
        totals: dict[tuple[int, int], int] = {}
        for (path, lane), tally in self._by_path.items():
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

    def transfer(self, path: tuple[int, ...], lane: int, size: int) -> asyncio.Future[Completion]:
        self._book(path, lane, size)
        return self._plane().transfer(path, lane, size)

    def transfer_then(self, path: tuple[int, ...], lane: int, size: int, done: Callable[[], None],
                      failed: Callable[[Exception], None]) -> None:  # fmt: skip
        """A transfer whose end calls ``done()`` (``failed(error)`` if refused), without a future."""
        self._book(path, lane, size)
        self._plane().transfer_then(path, lane, size, done, failed)

    def io_then(self, node: int, kind: str, lane: int, size: int, done: Callable[[], None],
                failed: Callable[[Exception], None], extents: Extents = ()) -> None:  # fmt: skip
        """A storage I/O whose end calls ``done()`` (``failed(error)`` if refused), without a future;
        ``extents`` say which Full Blocks it moves (:data:`~dualpath_emu.cluster.engines.Extents`)."""
        self._plane().io_then(self._book_io(node, kind, lane, size), kind, lane, size, done, failed, extents)

    def transfer_detached(self, path: tuple[int, ...], lane: int, size: int) -> None:
        """A transfer nobody waits for (write-backs, decode all-to-all): booked, never reported."""
        self._book(path, lane, size)
        self._plane().transfer_detached(path, lane, size)

    def io(self, node: int, kind: str, lane: int, size: int, extents: Extents = ()) -> asyncio.Future[Completion]:
        return self._plane().io(self._book_io(node, kind, lane, size), kind, lane, size, extents)

    def io_detached(self, node: int, kind: str, lane: int, size: int, extents: Extents = ()) -> None:
        """A storage I/O nobody waits for (block write-backs): booked, never reported."""
        self._plane().io_detached(self._book_io(node, kind, lane, size), kind, lane, size, extents)

    def _book_io(self, node: int, kind: str, lane: int, size: int) -> int:
        """Book a storage I/O of ``node``; return its storage node."""
        self._book(self._topology.storage_io_path(node, kind), lane, size)
        return self._topology.nodes[node].storage_node

    def forward(
        self,
        n_layers: int,
        ranks: Sequence[tuple[Hop | None, int, Hop | None]],
        *,
        ffn_ns: int,
        collectives: Sequence[Hop],
    ) -> asyncio.Future[Completion]:
        for load, _, store in ranks:
            for hop in (load, store):
                if hop is not None:
                    self._book(hop[0], hop[1], hop[2] * n_layers, n_layers)
        for path, lane, size in collectives:
            self._book(path, lane, size * n_layers, n_layers)
        return self._plane().forward(n_layers, ranks, ffn_ns=ffn_ns, collectives=collectives)


class ProbingLedger(Ledger):
    """A :class:`Ledger` that also times every data movement by kind (:mod:`~dualpath_emu.cluster.paths`):
    the model's figures for the kinds of transfer a host-backend run measures on real bytes. Detached work
    (write-backs, the decode all-to-all) is asked to report its end, which moves nothing differently: the
    core times a transfer the same whoever waits for it, and only this probe hears of it. (A forward pass's
    per-layer transfers are the core's, inside the pass: the probe times the pass.)"""

    def __init__(self, system: ActorSystem, topology: Topology) -> None:
        super().__init__(system, topology)
        self.measured: dict[str, PathStats] = {}

    def _timed(self, kind: str, size: int, then: Callable[[], None] | None = None) -> Callable[[], None]:
        start = self._system.now_ns()

        def done() -> None:
            self.measured.setdefault(kind, PathStats()).add(size, 0, (self._system.now_ns() - start) / 1e9)
            if then is not None:
                then()

        return done

    def _timed_future(self, kind: str, size: int, future: asyncio.Future[Completion]) -> asyncio.Future[Completion]:
        done = self._timed(kind, size)
        future.add_done_callback(lambda f: done() if not f.cancelled() and f.exception() is None else None)
        return future

    def transfer(self, path: tuple[int, ...], lane: int, size: int) -> asyncio.Future[Completion]:
        return self._timed_future(transfer_kind(self._topology, path), size, super().transfer(path, lane, size))

    def transfer_then(self, path: tuple[int, ...], lane: int, size: int, done: Callable[[], None],
                      failed: Callable[[Exception], None]) -> None:  # fmt: skip
        super().transfer_then(path, lane, size, self._timed(transfer_kind(self._topology, path), size, done), failed)

    def transfer_detached(self, path: tuple[int, ...], lane: int, size: int) -> None:
        super().transfer_then(path, lane, size, self._timed(transfer_kind(self._topology, path), size),
                              self._detached_failed)  # fmt: skip

    def io_then(self, node: int, kind: str, lane: int, size: int, done: Callable[[], None],
                failed: Callable[[Exception], None], extents: Extents = ()) -> None:  # fmt: skip
        super().io_then(node, kind, lane, size, self._timed(io_kind(self._topology, node, kind), size, done), failed,
                        extents)  # fmt: skip

    def io(self, node: int, kind: str, lane: int, size: int, extents: Extents = ()) -> asyncio.Future[Completion]:
        return self._timed_future(io_kind(self._topology, node, kind), size, super().io(node, kind, lane, size, extents))

    def io_detached(self, node: int, kind: str, lane: int, size: int, extents: Extents = ()) -> None:
        super().io_then(node, kind, lane, size, self._timed(io_kind(self._topology, node, kind), size),
                        self._detached_failed, extents)  # fmt: skip

    def _detached_failed(self, error: Exception) -> None:
        raise error  # as a detached request's refusal would: the run fails with it

    def forward(
        self,
        n_layers: int,
        ranks: Sequence[tuple[Hop | None, int, Hop | None]],
        *,
        ffn_ns: int,
        collectives: Sequence[Hop],
    ) -> asyncio.Future[Completion]:
        size = forward_bytes(n_layers, ranks, collectives)
        return self._timed_future("forward pass", size, super().forward(n_layers, ranks, ffn_ns=ffn_ns,
                                                                        collectives=collectives))  # fmt: skip
