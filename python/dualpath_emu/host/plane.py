"""The host backend's data plane (docs/host-backend.md): the engines' data-plane interface, moving real bytes.

A :class:`HostDataPlane` is a process's own wall-clock core that hands out the work the host moves for real
(``Core.set_external``: every storage I/O, every transfer between nodes) and models the rest (compute, timers, H2D
and D2H), so everything runs by the core's one set of rules. It moves the bytes -- Full Blocks in files
(:class:`~dualpath_emu.host.storage.BlockStore`), KV between node processes
(:class:`~dualpath_emu.host.transport.ByteChannel`) -- each paced by its port's
:class:`~dualpath_emu.host.pacing.Pacer`, and tells the core when each ended (one call per batch). Network bytes are
scaled by ``byte_scale``; everything moved is counted per (port, lane) in modelled bytes (:attr:`HostDataPlane.moved`),
so the run's byte check is the model's. A port fault set on one process's plane is sent to every other; factor 0
pauses a pacer and, on a storage port, takes its node's storage view away; :meth:`HostDataPlane.finish` clears them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dualpath_emu._core import Arbitration, Core
from dualpath_emu.host.dram_pool import DramPool, DramPoolError
from dualpath_emu.host.pacing import BURST_S, Grant, Pacer
from dualpath_emu.host.paths import Layout, PathStats, io_kind, port_nodes, transfer_kind
from dualpath_emu.host.storage import BlockStore, HostStorageError, StorageView
from dualpath_emu.host.transport import ByteChannel
from dualpath_emu.runtime.core_work import Extents, clear_faults
from dualpath_emu.runtime.engine import extents_of, flat_extents
from dualpath_emu.runtime.dataplane.protocol import DataPlaneError
from dualpath_emu.runtime.realtime import WallClockCore

__all__ = ["HostDataError", "HostDataPlane", "HostPlan"]

STORAGE_BURST_S = 5e-3
"""A storage NIC's bucket (see :meth:`HostDataPlane._pacer`): a read after idle gets up to 5 ms of bytes at once, where
1 ms made reads three to six times slower than the model's on this machine (ten small reads for one)."""
DRAIN_QUIET_S = 0.2
"""At the end, a process stops once its own work is done and no peer's bytes came for this long (wall)."""
DRAIN_MAX_S = 10.0
POOL_WAIT_S = 5.0
"""How long a pool read waits for blocks its node was not told of yet (the index's put and the read come by two
routes) before they count as missing."""
NET_CHUNK_BYTES = 16 << 10
"""Real bytes per network chunk: a model-lane chunk waits behind at most one KV chunk being granted."""


@dataclass(frozen=True)
class HostPlan:
    """What a host process needs to know of the cluster, as plain data (the host imports no cluster)."""

    topology: Layout
    process_of_node: tuple[str, ...]
    port_rate: Mapping[int, float]
    block_bytes: int
    byte_scale: float
    pool_blocks: int = 0
    """The DRAM pool's capacity in Full Blocks, every node's together (0: the system keeps no KV in one)."""
    cnic_vl: tuple[int, int, str, str] | None = None
    """The compute NICs' VL tables (``Arbitration.parse``'s arguments; None: the paper's)."""

    def cnic_arbitration(self) -> Arbitration:
        return Arbitration.parse(*self.cnic_vl) if self.cnic_vl is not None else Arbitration.paper()

    @property
    def port_node(self) -> Mapping[int, int]:
        """The node of each node port."""
        return port_nodes(self.topology)


@dataclass
class _Job:
    """A network transfer this process sends: its chunks to ``dest``, the next one from ``offset`` on."""

    dest: str
    job: int
    ack: bool
    offset: int = 0


@dataclass
class _StorageIo:
    """A storage I/O being paced: its blocks are issued as the SNIC port grants their chunks."""

    kind: str
    extents: list[list[int]]  # The ``[context, first block, blocks]`` runs not issued yet.
    done: asyncio.Future[None]
    port: int  # Its node's storage NIC port (rx for a read, tx for a write-back).
    view: StorageView | None = None
    """The way its node reaches the storage in that direction (taken away while the port is down)."""
    running: list[asyncio.Future[Any]] = field(default_factory=list)


class HostDataPlane(WallClockCore):
    """A live process's data plane that moves real bytes (see the module docstring)."""

    def __init__(
        self, core: Core, plan: HostPlan, process: str, channel: ByteChannel, store: BlockStore | None
    ) -> None:
        super().__init__(core)
        self.plan = plan
        self.process = process
        self.channel = channel
        channel.send = self._send_job
        channel.admit = self._admit
        channel.on_port = self._peer_port
        channel.on_pool = self._pool_read_here
        self.store = store
        self._cnic_arbitration = plan.cnic_arbitration()
        self.dram_pool = (DramPool(store.contents, store.stride, plan.pool_blocks)
                          if store is not None and plan.pool_blocks else None)  # fmt: skip
        """The blocks this process's nodes hold in the DRAM pool, in real memory (a system with a pool)."""
        self.moved: dict[tuple[int, int], int] = {}
        """Modelled bytes of the real work done, per (port, lane), checked against the actors' ledgers."""
        self.measured: dict[str, PathStats] = {}
        """Per kind of work: what it took, next to what the model gives the same work unloaded."""
        self._pacers: dict[int, Pacer] = {}
        self._jobs: dict[int, _Job] = {}
        self._ios: dict[int, _StorageIo] = {}
        self._next_id = 1
        self._detached: set[asyncio.Task[Any]] = set()
        self._ended: list[int] = []
        """External work that ended, told to the core at the loop's next iteration (one call for all)."""
        self.own_nodes = frozenset(i for i, owner in enumerate(plan.process_of_node) if owner == process)
        self.failure: BaseException | None = None
        self._main: asyncio.Future[Any] | None = None
        # Faults (issue 26; see the module docstring).
        self._factors: dict[int, float] = {}  # Ports a fault scales now: what it leaves of their rates (absent: 1).
        self._latent: set[int] = set()  # Ports a fault adds latency to now (the core waits it out).
        topology = plan.topology
        self._storage_of: dict[int, int] = {}
        """A storage NIC port -> the storage cluster's port of the same direction (their factors combine)."""
        self._node_of_storage: dict[int, int] = {}
        for node in topology.nodes:
            self._storage_of[node.snic_rx] = topology.storage_read
            self._storage_of[node.snic_tx] = topology.storage_write
            self._node_of_storage[node.storage_node] = node.index
        self._own_rx = frozenset(p for n in self.own_nodes for p in topology.nodes[n].cnic_rx)
        self._write_ports = frozenset(n.snic_tx for n in topology.nodes)
        self._admission: dict[int, Pacer] = {}
        """A compute NIC rx port's pacer of arriving chunks, made when a fault first slows it."""
        self._admitting: dict[int, Callable[[], None]] = {}
        """Arriving jobs held until their last chunk is let in: what completes each."""
        self._views: dict[int, StorageView] = {}
        """This process's nodes' storage NIC ports -> the view each reaches the storage through (made once)."""
        if store is not None:
            for n in sorted(self.own_nodes):
                node = topology.nodes[n]
                self._views[node.snic_rx] = store.view(f"n{n}.snic.rx")
                self._views[node.snic_tx] = store.view(f"n{n}.snic.tx")
        # What the host moves: a transfer that leaves its node, every storage I/O (the core hands them out).
        port_node = plan.port_node
        core.set_external([port_node.get(p, -1) for p in range(core.port_count)], sorted(self._node_of_storage))

    # --- faults ----------------------------------------------------------------------------------------

    def set_port_factor(self, port: int, factor: float) -> None:
        """A fault: ``port``'s rates × ``factor`` from now on, here and in every other process (byte channel)."""
        self._set_factor(port, factor)
        self.channel.tell_peers(["factor", port, factor])

    def set_port_latency(self, port: int, extra_ns: int) -> None:
        """A fault: ``extra_ns`` added to what starts crossing ``port`` from now on, here and in every process."""
        self._set_latency(port, extra_ns)
        self.channel.tell_peers(["latency", port, extra_ns])

    def _peer_port(self, what: str, port: int, value: float) -> None:
        """Another process's fault injector changed ``port``: apply it here (a bad change is refused there)."""
        if what == "factor":
            self._set_factor(port, float(value))
        else:
            self._set_latency(port, int(value))

    def _set_factor(self, port: int, factor: float) -> None:
        """``port``'s factor on this process's core and its pacer here (nothing queued is lost)."""
        if not 0.0 <= factor <= 1.0:
            raise ValueError(f"factor: expected a number in [0, 1], got {factor}")
        if self._factors.get(port, 1.0) == factor:
            return
        super().set_port_factor(port, factor)
        if factor == 1.0:
            del self._factors[port]
        else:
            self._factors[port] = factor
        self._repace()

    def _set_latency(self, port: int, extra_ns: int) -> None:
        super().set_port_latency(port, extra_ns)
        if extra_ns:
            self._latent.add(port)
        else:
            self._latent.discard(port)

    def clear_faults(self) -> None:
        """End every fault (a run's end: what they hold back then drains, and every byte is accounted)."""
        self._factors.clear()
        self._latent.clear()
        self._repace()
        clear_faults(self._core)

    def _factor_of(self, port: int) -> float:
        """What faults leave of the rate of ``port``'s pacer (a storage NIC's combines the storage cluster's)."""
        factor = self._factors.get(port, 1.0)
        storage = self._storage_of.get(port)
        return factor if storage is None else min(factor, self._factors.get(storage, 1.0))

    def _repace(self) -> None:
        for pacers in (self._pacers, self._admission):
            for port, pacer in pacers.items():
                pacer.set_rate(pacer.rate_bytes_per_s * self._factor_of(port))
        store = self.store
        for port, view in self._views.items():  # a storage port down: its node's storage is unreachable
            assert store is not None
            if self._factor_of(port) == 0.0:
                store.take_away(view)
            else:
                store.give_back(view)

    def _writes_held(self) -> bool:
        """Whether a fault acts on a storage write path now (then a read waits for a late write-back)."""
        write = self.plan.topology.storage_write
        return any(p == write or p in self._write_ports for p in (*self._factors, *self._latent))

    # --- the work the core hands out -------------------------------------------------------------------

    def _queue_io(self, node: int, kind: str, lane: int, size_bytes: int, tag: int, extents: Extents = ()) -> int:
        self._pending_ios.append((node, kind, lane, size_bytes, tag, extents))
        self._queued()
        return tag

    def _deliver(self, completions: list[tuple[str, int, int, int, int, int]]) -> None:
        """What the core completed: external work starts here, a forward pass is measured, the rest delivered."""
        rest = [c for c in completions if c[0] != "external"]
        if len(rest) != len(completions):
            for work in self._core.take_external():
                self._start_external(*work)
        for kind, _tag, start, end, size, _lane in rest:
            if kind == "forward":
                self.measured.setdefault("forward pass", PathStats()).add(size, 0, (end - start) / 1e9)
        super()._deliver(rest)

    def _start_external(self, ident: int, kind: str, path: list[int], lane: int, size: int, storage_node: int,
                        extents: list[tuple[int, int, int]], start: int) -> None:  # fmt: skip
        """Move the real bytes of external work ``ident``, count and measure them by kind, and tell the core."""
        topology, rate = self.plan.topology, min(self.plan.port_rate[p] for p in path)
        if kind == "transfer":
            work = self._network(tuple(path), lane, size)
            what = (transfer_kind(topology, tuple(path)), self._real(size))
        else:
            node = self._node_of_storage[storage_node]
            if node not in self.own_nodes:
                self._fail(ValueError(f"process {self.process!r} does not drive node {node}'s storage I/O"))
                return
            ports = topology.nodes[node]
            port = ports.snic_rx if kind == "read" else ports.snic_tx
            work = self._storage(port, kind, lane, size, extents)
            what = (
                io_kind(topology, node, kind),
                sum(n for _, _, n in extents) * (self.store.stride if self.store else 0),
            )

        async def run() -> None:
            try:
                if size > 0:
                    await work
            except Exception as error:
                self._fail(error)
                return
            finally:
                work.close()
            for port in path:
                self.moved[(port, lane)] = self.moved.get((port, lane), 0) + size
            self.measured.setdefault(what[0], PathStats()).add(
                size, what[1], (self.clock_ns() - start) / 1e9, size / rate
            )
            if not self._ended:
                self.loop.call_soon(self._tell_ended)
            self._ended.append(ident)

        task = self.loop.create_task(run())
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)

    def _tell_ended(self) -> None:
        """Tell the core which external work ended (one call for all since the last); deliver what that completed."""
        ended, self._ended = self._ended, []
        self._core.complete_externals(ended)
        self._deliver_timed(self._core.take_completions())

    async def run(self, main: Any) -> Any:
        """Run ``main`` with the byte channel open; then finish the real work and answer peers until quiet."""
        await self.channel.open()
        task = self._main = asyncio.ensure_future(main)
        try:
            return await task
        except asyncio.CancelledError:
            if self.failure is None:
                raise
            raise HostDataError(
                f"process {self.process!r}: the host data plane failed: {type(self.failure).__name__}: {self.failure}"
            ) from self.failure
        finally:
            await self._drain()
            await self.channel.close()
            for pacer in self._pacers.values():
                pacer.stop()
            if self.store is not None:
                self.store.close()

    def when_stop_requested(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` when the driver's process says the run is complete (over the channel)."""
        self.channel.on_stop = callback

    async def finish(self, run_complete: bool) -> None:
        """The actors are done: faults end; the driver's process, its run complete, tells the others to stop."""
        self.clear_faults()
        self.flush()
        if run_complete:
            self.channel.stop_peers("the run is complete")

    async def _drain(self) -> None:
        self.clear_faults()  # (finish did, unless the run failed first)
        deadline = time.perf_counter() + DRAIN_MAX_S
        while time.perf_counter() < deadline:
            self.flush()
            quiet = time.perf_counter() - self.channel.last_activity_s
            if self.pending_work() == 0 and quiet >= DRAIN_QUIET_S:
                return
            await asyncio.sleep(0.01)

    def pending_work(self) -> int:
        """Real work in flight, detached included (a process waits for it before it stops)."""
        return len(self._detached) + len(self._jobs) + len(self._ios) + len(self._admitting) + self._core.pending()

    # --- running work ----------------------------------------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        """Real work failed: end this process's run with the error rather than let the actors wait for ever."""
        if self.failure is None:
            self.failure = error
        if self._main is not None and not self._main.done():
            self._main.cancel()

    def _real(self, size: int) -> int:
        return max(1, round(size * self.plan.byte_scale))

    def _pacer(self, port: int, chunk_bytes: int, arbitration: Arbitration | None, scale: float) -> Pacer:
        """``port``'s pacer, counting ``scale`` bytes per modelled byte (made on first use)."""
        pacer = self._pacers.get(port)
        if pacer is None:
            rate = self.plan.port_rate[port] * scale
            # Storage NICs take a longer bucket: fewer, larger file reads (each a thread hop and a syscall),
            # where a compute NIC's lanes want a short one.
            burst = BURST_S if arbitration is not None else STORAGE_BURST_S
            pacer = self._pacers[port] = Pacer(rate, chunk_bytes, self.clock_ns, self._on_grants, arbitration=arbitration,
                                               on_error=self._fail, burst_s=burst)  # fmt: skip
            pacer.start(self.loop)
            if (factor := self._factor_of(port)) != 1.0:  # made while a fault acts on its port
                pacer.set_rate(rate * factor)
        return pacer

    def _on_grants(self, grants: list[Grant]) -> None:
        """Chunks a port let through: send a network job's, issue a storage I/O's blocks."""
        ios: dict[int, list[int]] = {}  # storage I/O -> [chunks granted now, last]
        for tag, _lane, nbytes, last in grants:
            job = self._jobs.get(tag)
            if job is not None:
                self.channel.send_chunk(job.dest, job.job, job.offset, nbytes, last, job.ack)
                job.offset += nbytes
                if last:
                    del self._jobs[tag]
            else:
                granted = ios.setdefault(tag, [0, 0])
                granted[0] += 1
                granted[1] |= last
        for tag, (chunks, ended) in ios.items():  # one file operation per I/O and wake-up
            self._grant_io(tag, chunks, bool(ended))

    def _new_id(self) -> int:
        ident, self._next_id = self._next_id, self._next_id + 1
        return ident

    # --- network ---------------------------------------------------------------------------------------

    async def _network(self, path: tuple[int, ...], lane: int, size: int) -> None:
        plan = self.plan
        source, dest = plan.port_node[path[0]], plan.port_node[path[-1]]
        real = self._real(size)
        # The sending NIC: the path's compute-NIC port on the source node (paced there, with its lanes); the
        # receiving one, whose faults the destination's process applies to what arrives.
        port = next(p for p in path if p in plan.topology.nodes[source].cnic_tx)
        rx = next((p for p in path if p in plan.topology.nodes[dest].cnic_rx), -1)
        if source in self.own_nodes:
            await self.channel.push(plan.process_of_node[dest], real, lane, port, rx)
        elif dest in self.own_nodes:
            await self.channel.pull(plan.process_of_node[source], real, lane, port, rx)
        else:
            raise ValueError(
                f"process {self.process!r} drives neither end of a transfer from node {source} to node {dest}"
            )

    def _send_job(self, dest: str, job: int, nbytes: int, lane: int, ack: bool, port: int) -> None:
        """The channel's pacer hook: queue a job's chunks on the sending GPU's CNIC ``port``."""
        if self.plan.port_node.get(port, -1) not in self.own_nodes:
            raise ValueError(f"process {self.process!r} was asked to send on port {port}, not one of its nodes'")
        ident = self._new_id()
        self._jobs[ident] = _Job(dest, job, ack)
        self._pacer(port, NET_CHUNK_BYTES, self._cnic_arbitration, self.plan.byte_scale).enqueue(lane, nbytes, ident)

    def _admit(self, rx: int, lane: int, nbytes: int, then: Callable[[], None] | None) -> bool:
        """The channel's hook for a chunk arriving through port ``rx``: False lets it in now (see the module)."""
        pacer = self._admission.get(rx)
        if (pacer is None or not pacer.port.queued_messages()) and self._factors.get(rx, 1.0) == 1.0:
            return False
        if rx not in self._own_rx:
            raise ValueError(f"process {self.process!r}: a chunk came in through port {rx}, not one of its nodes'")
        if pacer is None:
            rate = self.plan.port_rate[rx] * self.plan.byte_scale
            pacer = self._admission[rx] = Pacer(rate, NET_CHUNK_BYTES, self.clock_ns, self._on_admitted,
                                                arbitration=self._cnic_arbitration, on_error=self._fail)  # fmt: skip
            pacer.start(self.loop)
            pacer.set_rate(rate * self._factor_of(rx))
        ident = self._new_id()
        if then is not None:
            self._admitting[ident] = then
        pacer.enqueue(lane if lane in (0, 1, 2, 3) else 2, max(1, nbytes), ident)
        return True

    def _on_admitted(self, grants: list[Grant]) -> None:
        """Chunks a compute NIC's rx pacer let in: a job whose last chunk it was completes."""
        for tag, _lane, _nbytes, last in grants:
            if last:
                then = self._admitting.pop(tag, None)
                if then is not None:
                    then()

    # --- the DRAM pool ---------------------------------------------------------------------------------

    def pool(self, node: int, op: str, extents: Extents) -> None:
        """Node ``node``'s share of the DRAM pool holds, drops or serves these blocks (:class:`DramPool`): here if it
        is this process's node; a read of another's is checked by the process holding it (over the byte channel)."""
        extents = tuple(e for e in extents if e[2] > 0)
        if not extents:
            return
        if node not in self.own_nodes:
            if op != "read":
                self._fail(ValueError(f"process {self.process!r} was asked to {op} blocks of node {node}'s DRAM pool, "
                                      "not one of its nodes'"))  # fmt: skip
                return
            self.channel.send_pool(self.plan.process_of_node[node], node, list(flat_extents(extents)))
            return
        pool = self.dram_pool
        if pool is None:
            self._fail(HostDataError(f"process {self.process!r} holds no DRAM pool (the system keeps no KV in one)"))
            return
        try:
            if op == "put":
                pool.put(node, extents)
            elif op == "drop":
                if bad := pool.drop(node, extents):
                    self._fail(HostDataError(f"process {self.process!r}: {bad} block(s) node {node}'s DRAM pool "
                                             "dropped were missing or wrong"))  # fmt: skip
            elif op == "read":
                self._pool_read(node, extents, time.perf_counter() + POOL_WAIT_S)
            else:
                raise ValueError(f"unknown DRAM pool operation {op!r}")
        except (DramPoolError, ValueError) as error:
            self._fail(HostDataError(f"process {self.process!r}: node {node}'s DRAM pool: {error}"))

    def _pool_read_here(self, node: int, flat: Sequence[int]) -> None:
        """A peer's engine reads these blocks (flat triples) from this process's node ``node``."""
        if node not in self.own_nodes:
            raise ValueError(f"a pool read of node {node}, not one of process {self.process!r}'s")
        self.pool(node, "read", extents_of(flat))

    def _pool_read(self, node: int, extents: Extents, deadline: float) -> None:
        """Check the blocks a read takes from ``node``; those not put there yet are waited for until ``deadline``."""
        pool = self.dram_pool
        assert pool is not None
        if pool.missing(node, extents) and time.perf_counter() < deadline:
            self.loop.call_later(0.005, self._pool_read, node, extents, deadline)
            return
        if bad := pool.read(node, extents):
            self._fail(HostDataError(f"process {self.process!r}: {bad} block(s) read from node {node}'s DRAM pool "
                                     "were missing or wrong"))  # fmt: skip

    # --- storage ---------------------------------------------------------------------------------------

    def discard(self, extents: Extents) -> None:
        """A bounded store evicted these blocks: their bytes leave the block files now (:meth:`BlockStore.discard`)."""
        if self.store is None:
            raise RuntimeError(f"process {self.process!r} has no block store to discard blocks from")
        self.store.discard(extents)

    async def _storage(self, port: int, kind: str, lane: int, size: int, extents: Sequence[Sequence[int]]) -> None:
        if self.store is None:
            raise RuntimeError(f"process {self.process!r} has no block store for its storage I/O")
        view = self._views.get(port)
        if view is not None and view.away and extents:  # its storage is unreachable: it tries until it is back
            await self.store.reach(view, extents[0][0], kind)
        # Paced in modelled bytes, a block per chunk: in real bytes an I/O under one (byte_scale 1e-9) took
        # 1 / (rate × scale) s, not size / rate; write-backs fell seconds behind, and reads gave up on them.
        pacer = self._pacer(port, self.plan.block_bytes, None, 1.0)
        io = _StorageIo(kind, [list(e) for e in extents], self.loop.create_future(), port, view)
        ident = self._new_id()
        self._ios[ident] = io
        pacer.enqueue(lane, max(1, size), ident)
        await io.done

    def _grant_io(self, ident: int, chunks: int, last: bool) -> None:
        """Granted chunks of a storage I/O: issue as many next blocks (all that remain with the last chunk)."""
        io = self._ios[ident]
        take = sum(n for _, _, n in io.extents) if last else chunks
        store = self.store
        assert store is not None
        while take > 0 and io.extents:
            context, first, n = io.extents[0]
            run = min(n, take)
            if io.kind == "read":
                op = store.read(context, first, run, held=self._writes_held, view=io.view)
            else:
                op = store.write(context, first, run, view=io.view)
            io.running.append(asyncio.ensure_future(op))
            take -= run
            if run == n:
                io.extents.pop(0)
            else:
                io.extents[0] = [context, first + run, n - run]
        if last:
            del self._ios[ident]
            self.loop.create_task(self._finish_io(io))

    async def _finish_io(self, io: _StorageIo) -> None:
        try:
            results = await asyncio.gather(*io.running)
        except HostStorageError as error:  # a real I/O error (a fault's unreachable storage waits: see the module)
            what = "a read" if io.kind == "read" else "a write-back"
            why = "no fault holds its storage NIC down" if self._factor_of(io.port) else "its storage NIC is down"
            io.done.set_exception(
                HostDataError(
                    f"process {self.process!r}: {what} on node "
                    f"{self.plan.port_node[io.port]}'s storage failed ({why}): {error}"
                )
            )
            return
        except Exception as error:
            io.done.set_exception(error)
            return
        bad = sum(r.mismatched_blocks for r in results)
        if bad:
            io.done.set_exception(HostDataError(f"process {self.process!r}: {bad} block(s) read back wrong"))
        else:
            io.done.set_result(None)


class HostDataError(DataPlaneError):
    """Real bytes came back wrong: a block read did not match what was written."""
