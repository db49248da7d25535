"""The host backend's data plane: the same ``data_plane`` interface the actors use everywhere, moving real
bytes (issue 16).

A :class:`HostDataPlane` is a process's own wall-clock core (:class:`~dualpath_emu.runtime.realtime.WallClockCore`)
whose work is real where the host has the hardware and modelled where it does not:

* **storage I/O** (``io``): the Full Blocks the request names (its extents) are read from and written to real
  files (:class:`~dualpath_emu.host.storage.BlockStore`), every block read verified; paced per node by its
  storage NIC's :class:`~dualpath_emu._core.PacketPort` (rx for reads, tx for writes) one block per chunk,
  in modelled bytes at the modelled rate (the same times, and no real byte to round up to);
* **transfers between nodes** (a PE's layer KV to a DE buffer, a DE buffer's hit KV to a PE under DE-read,
  the MoE all-to-all between nodes): real bytes between the node processes (:class:`~dualpath_emu.host.transport.ByteChannel`),
  paced by the sending GPU's compute-NIC port with the paper's virtual-lane arbitration, so the model's lane
  pre-empts KV bytes;
* **transfers inside a node** (H2D, D2H: DRAM ↔ HBM through the GPU's CNIC) and every **timer**: on the
  process's own wall-clock core, as in a real-time run (no GPU copies here: the summary says they are
  modelled);
* a **forward pass** runs its layers here, piece by piece, with the core's rules (``core/src/forward.rs``):
  each rank's loads stream one after another (at most ``load_window`` layers ahead), a rank's attention of
  layer ℓ waits for its load ℓ and for layer ℓ−1, the shared phase (compute and collectives) starts when
  every rank's attention is done and ends the layer, stores follow each attention one at a time.

**Bytes are scaled** by ``byte_scale`` (e.g. 1/1000): a transfer of S modelled bytes moves round(S × scale)
real bytes (at least one), and every network pacer runs at its port's rate × scale, so a transfer takes the
time the model gives it unless the host cannot keep up -- which is what the run measures. A storage block's
real size is the scaled Full Block (at least one byte) rounded up to O_DIRECT's unit (512 bytes or 4 KiB).

Everything a process was asked to move is counted per (port, lane) in modelled bytes (:attr:`HostDataPlane.moved`),
so the run's byte check is the same as the model's: every byte the actors booked was moved.

**Faults** (issue 26) reach every node's process (:attr:`HostDataPlane.ports_per_process`: the fault injector
sends :class:`~dualpath_emu.cluster.messages.PortFault` to every engine group, whose plane is this) and act on
real bytes where this process paces them:

* a **storage NIC** port's pacer (``snic.rx`` for reads, ``snic.tx`` for write-backs) runs at the port's rate ×
  its factor; the storage cluster's ports (``3fs.read``, ``3fs.write``: ``slow_storage``, target ``storage``)
  belong to no node and act on every node's storage pacer of their direction the same way (the lower factor
  holds where both have one); factor 0 pauses the pacer: queued I/Os wait, none is lost, they go on when it
  is back;
* and at factor 0 the node's storage is unreachable for real: each node reaches the storage through its own
  views (:class:`~dualpath_emu.host.storage.StorageView`, one per direction of its storage NIC), and the view
  of a port at 0 is taken away, so that every open of a block file through it fails with ENOENT from the
  kernel, in that node's process alone. An I/O that starts meanwhile tries its storage until the view is back
  (``BlockStore.reach``), one in flight waits for it and tries again; none fails, none reports a block read
  back wrong, and a read the engine gives up (``read_timeout_s``) completes when the view is back, its
  completion ignored. An I/O error where no fault holds the port down fails the run, saying so;
* a **compute NIC**'s ``tx`` port: its sending pacer, the same way; its ``rx`` port: the chunks that arrive
  through it are let in by a pacer of the receiving process at its rate × factor (paused at 0), and a transfer
  completes when its last chunk is let in (the bytes themselves cross the socket as they are sent);
* **latency**: every real transfer, storage I/O and modelled copy this process starts waits the latency on its
  path's ports (their sum, as the core adds it up) before it starts, but for a forward pass's own per-layer
  transfers, as in the model;
* the process's own core gets each port's factor too (its modelled copies, H2D and D2H, slow as the model's).

A ``n<i>.dram`` port's factor acts on the modelled copies only: real bytes are not paced by DRAM. At the end of
a process's run every fault is cleared, so what they hold back drains (:meth:`HostDataPlane.finish`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dualpath_emu._core import UNREPORTED_TAG, Arbitration, Core
from dualpath_emu.cluster.paths import PathStats, io_kind, port_nodes, transfer_kind
from dualpath_emu.cluster.topology import Topology
from dualpath_emu.host.pacing import BURST_S, Grant, Pacer
from dualpath_emu.host.storage import BlockStore, HostStorageError, StorageView
from dualpath_emu.host.transport import ByteChannel
from dualpath_emu.runtime.core_work import Completion, Extents, clear_faults, forward_bytes
from dualpath_emu.runtime.dataplane import DataPlaneError
from dualpath_emu.runtime.realtime import WallClockCore

__all__ = ["HostDataError", "HostDataPlane", "HostPlan"]

STORAGE_BURST_S = 5e-3
"""A storage NIC's bucket (see :meth:`HostDataPlane._pacer`): a read after idle gets up to 5 ms of bytes at once, where
1 ms made reads three to six times slower than the model's on this machine (ten small reads for one)."""
DRAIN_QUIET_S = 0.2
"""At the end, a process stops once its own work is done and no peer's bytes came for this long (wall)."""
DRAIN_MAX_S = 10.0
NET_CHUNK_BYTES = 16 << 10
"""Real bytes per network chunk: a model-lane chunk waits behind at most one KV chunk being granted."""


@dataclass(frozen=True)
class HostPlan:
    """What a host process needs to know of the cluster: its topology, the process that drives each node's
    I/O, every port's modelled rate, and the storage block size (modelled bytes of one Full Block)."""

    topology: Topology
    process_of_node: tuple[str, ...]
    port_rate: Mapping[int, float]
    block_bytes: int
    byte_scale: float

    @property
    def port_node(self) -> Mapping[int, int]:
        """The node of each node port."""
        return port_nodes(self.topology)

    def node_of_storage(self, storage_node: int) -> int:
        """The node whose storage node is ``storage_node``."""
        for node in self.topology.nodes:
            if node.storage_node == storage_node:
                return node.index
        raise LookupError(f"no node has storage node {storage_node}")


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
    extents: list[list[int]]
    """The ``[context, first block, blocks]`` runs not issued yet."""
    done: asyncio.Future[None]
    port: int
    """Its node's storage NIC port (rx for a read, tx for a write-back)."""
    view: StorageView | None = None
    """The way its node reaches the storage in that direction (taken away while the port is down)."""
    running: list[asyncio.Future[Any]] = field(default_factory=list)


class HostDataPlane(WallClockCore):
    """A live process's data plane that moves real bytes (see the module docstring)."""

    steps_decode = False
    """Decode batches step in the engines (``cluster/decode_steps.py``): their write-backs and all-to-all are
    real bytes here, which the core's stepping would only model."""

    ports_per_process = True
    """Each process paces its own nodes' ports (real bytes): a fault must reach every node's process -- the
    fault injector sends :class:`~dualpath_emu.cluster.messages.PortFault` to the engine groups, whose handler
    calls :meth:`set_port_factor` and :meth:`set_port_latency` here -- rather than the plane of the injector's
    process alone."""

    def __init__(self, core: Core, plan: HostPlan, process: str, channel: ByteChannel, store: BlockStore | None) -> None:
        super().__init__(core)
        self.plan = plan
        self.process = process
        self.channel = channel
        channel.send = self._send_job
        self.store = store
        self.moved: dict[tuple[int, int], int] = {}
        """Modelled bytes of the real work done, per (port, lane) (the local core counts the modelled work):
        together, what the actors asked for, checked against their ledgers."""
        self.measured: dict[str, PathStats] = {}
        """Per kind of work (storage read per side, write-back, PE→DE, DE→PE, all-to-all, forward pass): what
        it took, next to what the model gives the same work unloaded."""
        self._pacers: dict[int, Pacer] = {}
        self._jobs: dict[int, _Job] = {}
        self._ios: dict[int, _StorageIo] = {}
        self._next_id = 1
        self._detached: set[asyncio.Task[Any]] = set()
        self.own_nodes = frozenset(i for i, owner in enumerate(plan.process_of_node) if owner == process)
        self.failure: BaseException | None = None
        self._main: asyncio.Future[Any] | None = None
        # Faults (issue 26; see the module docstring).
        self._factors: dict[int, float] = {}
        """Ports a fault scales now: what it leaves of their rates (absent: 1)."""
        self._latencies: dict[int, int] = {}
        """Ports a fault adds latency to now: how much (ns; absent: 0)."""
        topology = plan.topology
        self._storage_of: dict[int, int] = {}
        """A storage NIC port -> the storage cluster's port of the same direction (their factors combine)."""
        for node in topology.nodes:
            self._storage_of[node.snic_rx] = topology.storage_read
            self._storage_of[node.snic_tx] = topology.storage_write
        self._own_rx = frozenset(p for n in self.own_nodes for p in topology.nodes[n].cnic_rx)
        self._write_ports = frozenset(n.snic_tx for n in topology.nodes)
        self._admission: dict[int, Pacer] = {}
        """A compute NIC rx port's pacer of arriving chunks, made when a fault first slows it."""
        self._admitting: dict[int, Callable[[], None]] = {}
        """Arriving jobs held until their last chunk is let in: what completes each."""
        self._forward_hop = False
        """Set while a forward pass asks for one of its per-layer transfers (which waits out no latency)."""
        channel.admit = self._admit
        self._views: dict[int, StorageView] = {}
        """This process's nodes' storage NIC ports -> the view each reaches the storage through (made once)."""
        if store is not None:
            for n in sorted(self.own_nodes):
                node = topology.nodes[n]
                self._views[node.snic_rx] = store.view(f"n{n}.snic.rx")
                self._views[node.snic_tx] = store.view(f"n{n}.snic.tx")

    # --- the data-plane interface ----------------------------------------------------------------------

    def decode_reset(self, node: int) -> None:
        """Not here: this plane steps no decode node (:attr:`steps_decode`); an engine's own stepping
        (``DecodeSteps.reset``) drops its requests."""
        raise NotImplementedError(
            "the host backend steps no decode node (steps_decode is False): an engine crash resets the engine's "
            "own stepping (DecodeSteps.reset), not the data plane's"
        )

    def set_port_factor(self, port: int, factor: float) -> None:
        """A fault: ``port``'s rates × ``factor`` from now on (1: as specified; 0: down), on this process's core
        (its modelled copies) and on the pacer of ``port`` here, if this process has one (see the module
        docstring): what was due at the old rate is granted first, and nothing queued is lost."""
        if not 0.0 <= factor <= 1.0:
            raise ValueError(f"factor: expected a number in [0, 1], got {factor}")
        if self._factors.get(port, 1.0) == factor:
            return
        super().set_port_factor(port, factor)  # the core's modelled work (and a check of the port)
        if factor == 1.0:
            del self._factors[port]
        else:
            self._factors[port] = factor
        self._repace()

    def set_port_latency(self, port: int, extra_ns: int) -> None:
        """A fault: ``extra_ns`` added to what starts crossing ``port`` from now on (0: none), waited here before
        the work starts (this process's core gets none: it would add it to a forward pass's copies too)."""
        if extra_ns < 0 or not 0 <= port < len(self.plan.port_rate):
            raise ValueError(f"a latency of {extra_ns} ns on port {port}: expected >= 0 on a port of the cluster")
        if extra_ns:
            self._latencies[port] = extra_ns
        else:
            self._latencies.pop(port, None)

    def clear_faults(self) -> None:
        """End every fault (a run's end: what they hold back then drains, and every byte is accounted)."""
        self._factors.clear()
        self._latencies.clear()
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
        """Whether a fault acts on a storage write path now (a storage NIC's tx port, the storage cluster's
        write port): a write-back of another process may then land late, and a read of its blocks waits for it
        rather than give up after its usual patience (``BlockStore.read``'s ``held``)."""
        write = self.plan.topology.storage_write
        return any(p == write or p in self._write_ports for p in (*self._factors, *self._latencies))

    def _latency_ns(self, path: Sequence[int]) -> int:
        """What latency faults add to work along ``path`` now (0 without any)."""
        latencies = self._latencies
        return sum(latencies.get(p, 0) for p in path) if latencies else 0

    def _queue_transfer(self, path: Sequence[int], lane: int, size_bytes: int, tag: int) -> int:
        path = tuple(path)
        nodes = {self.plan.port_node.get(p, -1) for p in path}
        delay_ns = 0 if self._forward_hop else self._latency_ns(path)
        if len(nodes) == 1 and -1 not in nodes:  # inside one node: modelled on this process's core
            if delay_ns:  # a latency fault: submitted that much later
                submit = super()._queue_transfer
                self.loop.call_later(delay_ns / 1e9, submit, path, lane, size_bytes, tag)
                return tag
            return super()._queue_transfer(path, lane, size_bytes, tag)
        self._start(tag, "transfer", lane, size_bytes, self._network(path, lane, size_bytes, delay_ns), path,
                    (transfer_kind(self.plan.topology, path), self._real(size_bytes),
                     size_bytes / min(self.plan.port_rate[p] for p in path)))  # fmt: skip
        return tag

    def _queue_io(self, node: int, kind: str, lane: int, size_bytes: int, tag: int, extents: Extents = ()) -> int:
        topology = self.plan.topology
        index = self.plan.node_of_storage(node)
        if index not in self.own_nodes:
            raise ValueError(f"process {self.process!r} does not drive node {index}'s storage I/O")
        ports = topology.nodes[index]
        port = ports.snic_rx if kind == "read" else ports.snic_tx
        path = topology.storage_io_path(index, kind)
        real = sum(n for _, _, n in extents) * (self.store.stride if self.store is not None else 0)
        delay_ns = self._latency_ns(path)
        self._start(tag, kind, lane, size_bytes, self._storage(port, kind, lane, size_bytes, extents, delay_ns), path,
                    (io_kind(topology, index, kind), real,
                     size_bytes / min(self.plan.port_rate[p] for p in path)))  # fmt: skip
        return tag

    def forward(
        self,
        n_layers: int,
        ranks: Iterable[Any],
        *,
        ffn_ns: int = 0,
        collectives: Iterable[Any] = (),
        load_window: int = 0,
    ) -> asyncio.Future[Completion]:
        tag = self.new_tag()
        future = self.expect(tag)
        ranks, collectives = tuple(ranks), tuple(collectives)
        size = forward_bytes(n_layers, ranks, collectives)
        self._start(tag, "forward", 0, size, self._forward(n_layers, ranks, ffn_ns, collectives, load_window), (),
                    ("forward pass", 0, 0.0))  # fmt: skip
        return future

    async def run(self, main: Any) -> Any:
        """Run ``main`` (the process's actors) with the byte channel open; then finish this process's real
        work (write-backs) and keep answering peers until the channel has been quiet a while."""
        await self.channel.open()
        task = self._main = asyncio.ensure_future(main)
        try:
            return await task
        except asyncio.CancelledError:
            if self.failure is None:
                raise
            raise HostDataError(f"process {self.process!r}: the host data plane failed: "
                                f"{type(self.failure).__name__}: {self.failure}") from self.failure
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
        """This process's actors are done: its faults end (what they hold back drains); the driver's, its run
        complete, tells every other process to stop (what the data-plane service does on the model backend)."""
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

    def _start(self, tag: int, kind: str, lane: int, size: int, work: Any, path: tuple[int, ...],
               what: tuple[str, int, float]) -> None:  # fmt: skip
        """Run ``work`` (a coroutine); when it is done, count its bytes on ``path`` (a forward's pieces count
        their own), add it to the measurements of its kind (``what``: the kind, its real bytes and the seconds the
        model gives it on an idle path) and report it under ``tag`` (unless detached)."""
        start = self.clock_ns()

        async def run() -> None:
            try:
                await work
            except Exception as error:
                if tag == UNREPORTED_TAG:
                    self._fail(error)
                else:
                    self._refused(tag, error)
                return
            self._book(path, lane, size)
            end = self.clock_ns()
            self.measured.setdefault(what[0], PathStats()).add(size, what[1], (end - start) / 1e9, what[2])
            if tag != UNREPORTED_TAG:
                self._deliver([(kind, tag, start, end, size, lane)])

        task = self.loop.create_task(run())
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)

    def _fail(self, error: BaseException) -> None:
        """Real work nobody waits for failed (a write-back, a chunk a pacer could not send): end this process's
        run with the error rather than let the actors wait for what will never come."""
        if self.failure is None:
            self.failure = error
        if self._main is not None and not self._main.done():
            self._main.cancel()

    def _book(self, path: tuple[int, ...], lane: int, size: int) -> None:
        for port in path:
            self.moved[(port, lane)] = self.moved.get((port, lane), 0) + size

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

    async def _network(self, path: tuple[int, ...], lane: int, size: int, delay_ns: int = 0) -> None:
        plan = self.plan
        source, dest = plan.port_node[path[0]], plan.port_node[path[-1]]
        real = self._real(size)
        # The sending NIC: the path's compute-NIC port on the source node (paced there, with its lanes); the
        # receiving one, whose faults the destination's process applies to what arrives.
        port = next(p for p in path if p in plan.topology.nodes[source].cnic_tx)
        rx = next((p for p in path if p in plan.topology.nodes[dest].cnic_rx), -1)
        if delay_ns:
            await _until(self.clock_ns, self.clock_ns() + delay_ns)
        if source in self.own_nodes:
            await self.channel.push(plan.process_of_node[dest], real, lane, port, rx)
        elif dest in self.own_nodes:
            await self.channel.pull(plan.process_of_node[source], real, lane, port, rx)
        else:
            raise ValueError(f"process {self.process!r} drives neither end of a transfer from node {source} to node "
                             f"{dest}")  # fmt: skip

    def _send_job(self, dest: str, job: int, nbytes: int, lane: int, ack: bool, port: int) -> None:
        """The channel's pacer hook: queue a job's chunks on the sending GPU's CNIC ``port``."""
        if self.plan.port_node.get(port, -1) not in self.own_nodes:
            raise ValueError(f"process {self.process!r} was asked to send on port {port}, not one of its nodes'")
        ident = self._new_id()
        self._jobs[ident] = _Job(dest, job, ack)
        self._pacer(port, NET_CHUNK_BYTES, Arbitration.paper(), self.plan.byte_scale).enqueue(lane, nbytes, ident)

    def _admit(self, rx: int, lane: int, nbytes: int, then: Callable[[], None] | None) -> bool:
        """The channel's hook for a chunk arriving through compute NIC port ``rx``: False (let in now) unless a
        fault slows or stops the port, or chunks held before are still waiting; then it waits its turn in the
        port's pacer here, and ``then`` (a job's last chunk) runs when it is let in."""
        pacer = self._admission.get(rx)
        if (pacer is None or not pacer.port.queued_messages()) and self._factors.get(rx, 1.0) == 1.0:
            return False
        if rx not in self._own_rx:
            raise ValueError(f"process {self.process!r}: a chunk came in through port {rx}, not one of its nodes'")
        if pacer is None:
            rate = self.plan.port_rate[rx] * self.plan.byte_scale
            pacer = self._admission[rx] = Pacer(rate, NET_CHUNK_BYTES, self.clock_ns, self._on_admitted,
                                                arbitration=Arbitration.paper(), on_error=self._fail)  # fmt: skip
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

    # --- storage ---------------------------------------------------------------------------------------

    async def _storage(self, port: int, kind: str, lane: int, size: int, extents: Extents, delay_ns: int = 0) -> None:
        if self.store is None:
            raise RuntimeError(f"process {self.process!r} has no block store for its storage I/O")
        if delay_ns:  # a latency fault on its path: it starts that much later
            await _until(self.clock_ns, self.clock_ns() + delay_ns)
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
            io.done.set_exception(HostDataError(f"process {self.process!r}: {what} on node "
                                                f"{self.plan.port_node[io.port]}'s storage failed ({why}): {error}"))
            return
        except Exception as error:
            io.done.set_exception(error)
            return
        bad = sum(r.mismatched_blocks for r in results)
        if bad:
            io.done.set_exception(HostDataError(f"process {self.process!r}: {bad} block(s) read back wrong"))
        else:
            io.done.set_result(None)

    # --- forward passes --------------------------------------------------------------------------------

    async def _forward(self, n_layers: int, ranks: Sequence[Any], ffn_ns: int, collectives: Sequence[Any],
                       load_window: int) -> None:  # fmt: skip
        """A forward pass with the core's rules (see the module docstring), its compute timed from deadlines:
        each phase ends at its start + its time, the start being when what it waits for ended (a real
        transfer's end, the layer before's deadline). A wake-up late by the loop's timer resolution (about a
        millisecond) so delays that phase only; the lateness does not add up over a pass's layers."""
        loop = self.loop
        clock = self.clock_ns
        layer_done = [loop.create_future() for _ in range(n_layers)]
        loads: list[list[asyncio.Future[int]]] = [[loop.create_future() for _ in range(n_layers)] for _ in ranks]

        def move(hop: Any) -> Any:
            path, lane, size = hop
            if size <= 0:
                return _done(loop)
            self._forward_hop = True  # a forward pass's own transfers wait out no latency fault (the model's)
            try:
                return self.transfer(path, lane, size)
            finally:
                self._forward_hop = False

        async def load_stream(r: int, hop: Any) -> None:
            for layer in range(n_layers):
                if load_window and layer >= load_window:
                    await layer_done[layer - load_window]
                await move(hop)
                loads[r][layer].set_result(clock())

        async def store_stream(hop: Any, queue: asyncio.Queue[int | None]) -> None:
            while (start_ns := await queue.get()) is not None:
                await _until(clock, start_ns)
                await move(hop)

        start_ns = clock()
        streams: list[asyncio.Task[None]] = []
        stores: list[asyncio.Queue[int | None] | None] = []
        for r, (load, _attn, store) in enumerate(ranks):
            if load is not None and load[2] > 0:
                streams.append(loop.create_task(load_stream(r, load)))
            else:
                for f in loads[r]:
                    f.set_result(start_ns)
            if store is not None:
                queue: asyncio.Queue[int | None] = asyncio.Queue()
                stores.append(queue)
                streams.append(loop.create_task(store_stream(store, queue)))
            else:
                stores.append(None)
        try:
            previous = start_ns  # when the layer before ended (its deadline, or its collectives' real end)
            for layer in range(n_layers):
                shared = previous
                for r, rank in enumerate(ranks):  # rank r's attention: after its load and the layer before
                    attention_end = max(previous, await loads[r][layer]) + rank[1]
                    stream = stores[r]
                    if stream is not None:
                        stream.put_nowait(attention_end)
                    shared = max(shared, attention_end)
                await _until(clock, shared)  # every rank's attention is done: the shared phase
                if collectives:
                    await asyncio.gather(*(move(c) for c in collectives))
                await _until(clock, shared + ffn_ns)
                previous = max(shared + ffn_ns, clock())
                layer_done[layer].set_result(None)
            for stream in stores:
                if stream is not None:
                    stream.put_nowait(None)
            await asyncio.gather(*streams)
        finally:
            for task in streams:
                task.cancel()


async def _until(clock: Callable[[], int], at_ns: int) -> None:
    """Sleep until ``clock`` (the loop's) reads ``at_ns`` (at once if it already does)."""
    delay = at_ns - clock()
    if delay > 0:
        await asyncio.sleep(delay / 1e9)


class HostDataError(DataPlaneError):
    """Real bytes came back wrong: a block read did not match what was written."""


def _done(loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    future: asyncio.Future[None] = loop.create_future()
    future.set_result(None)
    return future
