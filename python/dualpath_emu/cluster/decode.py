"""The decode engines of one node (one engine per node; one DE per GPU, §4): the DE buffer, reads on the DE
side, H2D before decode, HBM for each request until it ends, and telling the scheduler and the client what
ended (:class:`DecodeGroup`); and the GPUs' stepping under it (:class:`DecodeSteps`).

The data plane's core steps the GPUs (``core/src/decode.rs``, through ``DataPlane.decode_node``, on every
plane). The GPUs that step together -- a node's DE GPUs for an MoE model (DP attention and expert
parallelism), each GPU alone for a dense model -- form a *step group*, stepped as one event per *segment* (the
step priced from every GPU's batch when one changes, ``Roofline.decode_pricing``), so a request costs a few
events however many tokens it generates. The core starts the block write-backs and the all-to-all itself and
reports only what a decision needs: a request has all its tokens, a segment's end is accounted."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.engines import EngineGroup, read_hit, stored_tokens
from dualpath_emu.cluster.identity import GroupId
from dualpath_emu.cluster.ledger import Booking, Ledger
from dualpath_emu.cluster.messages import (
    Crash, DecodeDone, DecodeTask, Drop, Expect, Health, HitReady, KvReady, Lost, ReadDone, ReadHere, ReadMoved,
    PoolChange, TurnDone,
)  # fmt: skip
from dualpath_emu.cluster.observations import DecodeSegment, Ended, HitRead, ReadStarted
from dualpath_emu.cluster.pool import Pool
from dualpath_emu.cluster.topology import KV_LANE, MODEL_LANE
from dualpath_emu.runtime.engine import DataPlane, Outbox, extents_of, on

__all__ = ["DecodeGroup", "DecodeListener", "DecodeSteps", "DecodingRequest"]


class DecodeListener(Protocol):
    """What :class:`DecodeSteps` tells its group: a request has all its tokens; a segment's end was accounted."""

    def decoded(self, now: int, request: DecodingRequest) -> None: ...

    def stepped(self, now: int) -> None: ...


@dataclass(eq=False, slots=True)
class DecodingRequest:
    """A request on a DE GPU: its prompt KV is in HBM; it decodes until it has ``gen`` tokens."""

    rid: int
    prompt: int
    gen: int
    gpu: int
    stored_blocks: int  # Full Blocks of this request's KV in storage (the hit's at first).
    context: int  # The token stream its KV extends (see :class:`~dualpath_emu.cluster.messages.Turn`).
    produced: int = 1  # Tokens out when it joins its GPU's batch: the first came from the prefill.
    first_token_ns: int = -1  # When the prefill produced its first token (from :class:`KvReady`).
    second_token_ns: int = -1  # When its first decode step produced its second token (-1 until then).


class DecodeSteps:
    """The decode GPUs of node ``node`` (``gpus`` of them, stepping together if ``together``), stepped by the data
    plane's core, which writes back (unless ``storage`` is None: the Oracle; to the node's DRAM alone unless
    ``write_through``: a DRAM pool that writes back on eviction) and charges the all-to-all itself
    (``a2a_bytes_per_token`` over ``a2a_paths[gpu]``), and reports the requests that ended, with their GPUs'
    busy spans (``busy_span(gpu unit, start, end, batch size, step)``). What it moved is booked in ``booking``."""

    def __init__(
        self, node: int, gpus: int, *, pricing: dict[str, float | int | bool | None], together: bool,
        kv_bytes_per_token: int, a2a_bytes_per_token: float, a2a_paths: Sequence[tuple[int, ...]],
        d2h_paths: Sequence[tuple[int, ...]], storage: tuple[int, tuple[int, ...]] | None, plane: Ledger,
        booking: Booking, listener: DecodeListener, busy_span: Callable[[int, int, int, int, int], None],
        write_through: bool = True, model_lane: int = MODEL_LANE,
    ) -> None:  # fmt: skip
        self.node = node
        self._write_through = write_through
        self._model_lane = model_lane
        self._kv = kv_bytes_per_token
        self._d2h_paths = list(d2h_paths)
        self._a2a_paths = list(a2a_paths)
        self._storage = storage
        self.plane = plane
        self._listener = listener
        self._busy_span = busy_span
        self._requests: dict[int, DecodingRequest] = {}
        self._booked: dict[str, Any] = {"d2h": [(0, 0)] * gpus, "a2a": [(0, 0)] * gpus, "written": (0, 0)}
        """What :meth:`_book` booked so far: ``Core.decode_bytes`` as it was then."""
        self._id = plane.decode_node(
            self._report, gpus=gpus, together=together, pricing=pricing, kv_bytes_per_token=kv_bytes_per_token,
            a2a_bytes_per_token=a2a_bytes_per_token, a2a_paths=self._a2a_paths, a2a_lane=model_lane,
            d2h_paths=self._d2h_paths, storage_node=storage[0] if storage is not None else None, kv_lane=KV_LANE,
            first_unit=node * gpus, **({} if write_through else {"write_through": False}),
        )  # fmt: skip
        booking.add_source(self._book)

    def join(self, now: int, request: DecodingRequest) -> None:
        """``request``'s prompt KV is in HBM: it joins its GPU's batch at the next step (one-token requests end now)."""
        if request.produced >= request.gen:  # no step: its last Full Blocks are written back, it ends
            full = (request.prompt + request.produced) // BLOCK_TOKENS
            if full > request.stored_blocks and self._storage is not None:
                self._write_back(request.gpu, [(request.context, request.stored_blocks, full - request.stored_blocks)])
            request.stored_blocks = full
            self._listener.decoded(now, request)
            return
        self._requests[request.rid] = request
        self.plane.decode_join(self._id, request.gpu, request.rid, request.prompt, request.gen, request.produced,
                               request.stored_blocks, request.context)  # fmt: skip

    def reset(self, now: int) -> int:
        """The node's engine crashed: every request is dropped in the core, unreported; returns how many."""
        self.plane.decode_reset(self._id)
        dropped = len(self._requests)
        self._requests.clear()
        return dropped

    def _report(self, now: int, ended: list[tuple[int, int]], spans: list[tuple[int, int, int, int, int]]) -> None:
        for span in spans:
            self._busy_span(*span)
        listener, requests = self._listener, self._requests
        for rid, second_token_ns in ended:
            request = requests.pop(rid, None)
            if request is None:
                continue  # it ended before a reset, which dropped it: its engine never heard of it
            request.second_token_ns = second_token_ns
            listener.decoded(now, request)
        listener.stepped(now)

    def _write_back(self, gpu: int, written: list[tuple[int, int, int]]) -> None:
        """Write back completed Full Blocks: HBM → DRAM through the GPU's CNIC, then DRAM → SNIC → storage (§4; a
        DRAM pool that writes back keeps them in DRAM)."""
        size = sum(blocks for _, _, blocks in written) * BLOCK_TOKENS * self._kv
        self.plane.transfer(self._d2h_paths[gpu], KV_LANE, size)
        if self._write_through:
            self.plane.io(self.node, "write", KV_LANE, size, tuple(written))

    def _book(self, booking: Booking) -> None:
        """Book what the core moved on its own since the last time."""
        moved, last = self.plane.decode_bytes(self._id), self._booked
        if moved is None:
            return  # nothing known yet
        for kind, paths, lane in (("d2h", self._d2h_paths, KV_LANE), ("a2a", self._a2a_paths, self._model_lane)):
            for path, (size, count), (old_size, old_count) in zip(paths, moved[kind], last[kind], strict=True):
                if count > old_count:
                    booking.book(path, lane, size - old_size, count - old_count)
        (size, count), (old_size, old_count) = moved["written"], last["written"]
        if count > old_count and self._storage is not None:
            booking.book(self._storage[1], KV_LANE, size - old_size, count - old_count)
        self._booked = moved


class DecodeGroup(EngineGroup):
    """The DEs of one node: continuous batching, the DE buffer, H2D before decode, block persistence (§4)."""

    def __init__(self, cluster: Cluster, node: int, out: Outbox, plane: DataPlane, restarted: bool = False) -> None:
        super().__init__(GroupId("de", node).name, cluster, [node], out, plane, restarted)
        self.node = node
        gpus = cluster.config.node.gpus
        d, topo = cluster.derived, cluster.topology
        self.expected: dict[int, DecodeTask] = {}
        self._buffered: set[int] = set()
        """Expected requests whose buffer is held (a failover's read can start at once)."""
        self._started_elsewhere: set[int] = set()
        """Requests whose read moved here after it had started on the other side (which wrote its start)."""
        self._reading: dict[int, int] = {}
        """Requests whose hit is being read here now: the read's number (another read's completion is ignored)."""
        self._reads = 0  # Reads started here so far (their numbers).
        self._read_done: set[int] = set()  # Requests whose hit was read here (until they leave).
        self._early_kv: dict[int, int] = {}
        """First-token times of requests whose :class:`KvReady` came before their :class:`Expect` (real time)."""
        self._early_read_here: dict[int, bool] = {}
        """Requests whose :class:`ReadHere` came before their :class:`Expect` (its ``started``; real time)."""
        self._done: list[DecodingRequest] = []
        """Requests finished at this instant, reported together by :meth:`_report_done`."""
        self._in_hbm: dict[int, int] = {}
        """Requests whose KV is in (or on its way to) a GPU's HBM, until they end, and the prefill node of each."""
        self._snic_down = False  # This node's storage NIC cannot bring KV in (a fault has it down).
        self._kv = cluster.derived.kv_bytes_per_token
        self.buffer = Pool(out, f"n{node}.buffer", cluster.config.dram_buffer_bytes)
        hbm = cluster.derived.de_hbm_kv_bytes
        self.hbm = [Pool(out, f"n{node}.gpu{g}.hbm", hbm) for g in range(gpus)]
        # The decode EP group: decode_ep_nodes consecutive decode nodes; its MoE all-to-all crosses the
        # network to the next node of the group (model traffic, high lane).
        ep = cluster.config.decode_ep_nodes
        de_nodes = [n.index for n in cluster.topology.de_nodes]
        first = de_nodes[(de_nodes.index(node) // ep) * ep]
        group = de_nodes[de_nodes.index(first) : de_nodes.index(first) + ep]
        peer = group[(group.index(node) + 1) % len(group)]
        # An MoE model's DE GPUs step together (EP); a dense model's each alone (DP only).
        together = d.model.moe_layers > 0 and d.decode.ep_degree > 1
        # MoE all-to-all bytes per decoded token (all layers) that cross the network.
        a2a = d.decode.a2a_remote_bytes_per_token * d.model.moe_layers
        a2a_paths = [topo.gpu_to_gpu(node, g, peer, g) for g in range(gpus)]
        d2h_paths = [topo.d2h(node, g) for g in range(gpus)]
        write = (topo.nodes[node].storage_node, topo.storage_io_path(node, "write"))
        self.steps = DecodeSteps(
            node, gpus, pricing=d.decode.decode_pricing(), together=together, kv_bytes_per_token=self._kv,
            a2a_bytes_per_token=a2a, a2a_paths=a2a_paths, d2h_paths=d2h_paths,
            storage=write if not cluster.system.oracle else None, plane=self.plane, booking=cluster.booking,
            listener=self, busy_span=lambda *span: out.observe(DecodeSegment(*span)),
            write_through=not (cluster.system.pool and cluster.config.kv_pool.write_back), model_lane=topo.model_lane,
        )  # fmt: skip

    def pools(self) -> list[Pool]:
        return [self.buffer, *self.hbm]

    @on(Expect)
    def on_expect(self, now: int, msg: Expect, sender: str) -> None:
        if self._down:  # a dead engine takes nothing: the scheduler dispatches these again
            self._lose([(t.rid, self._pending_read(t, False)) for t in msg.tasks], "down")
            return
        for task in msg.tasks:
            self._expect(now, task)

    # --- crashes (issue 26) --------------------------------------------------------------------------

    def _pending_read(self, task: DecodeTask, done: bool) -> int:
        """Hit tokens counted in this node's read queue whose read has not ended."""
        return _read_here(task) if task.hit > 0 and not done and not self.cluster.system.oracle else 0

    def _lose(self, lost: list[tuple[int, int]], why: str, kept: tuple[int, ...] = ()) -> None:
        """Tell the scheduler these ``(rid, pending read tokens)`` are no longer here (and these are ``kept``)."""
        reads = [tokens for _, tokens in lost if tokens]
        self.out.send(
            "scheduler", Lost(tuple(rid for rid, _ in lost), why, (self.node,) * len(reads), tuple(reads), kept)
        )

    @on(Crash)
    def on_crash(self, now: int, msg: Crash, sender: str) -> None:
        """This node's engines crash: every request they hold and what their GPUs were doing are gone."""
        if self._down:
            return
        self._report_done(now)  # what ended before the crash ended
        self._down = True
        self._epoch += 1
        lost = [(rid, self._pending_read(task, rid in self._read_done)) for rid, task in self.expected.items()]
        lost += [(rid, 0) for rid in sorted(self._in_hbm)]
        lost += [(rid, 0) for rid in self._early_kv]
        for state in (self.expected, self._early_kv, self._early_read_here):
            state.clear()
        for ids in (self._buffered, self._started_elsewhere, self._reading, self._read_done, self._in_hbm):
            ids.clear()
        self.steps.reset(now)
        for pool in self.pools():
            pool.reset(now)
        self._lose(lost, "crash")

    @on(PoolChange)
    def on_pool_change(self, now: int, msg: PoolChange, sender: str) -> None:
        """The DRAM pool's blocks on this node changed: what it dropped leaves its DRAM (its dirty blocks written to
        storage first, DRAM → SNIC → storage), what it holds now is there. The pool is not the engine's (a Mooncake
        store runs beside it): a crash loses none of it, and a crashed engine's node goes on writing back."""
        if msg.drop:
            self.plane.pool(self.node, "drop", extents_of(msg.drop))
        if msg.write:
            extents = extents_of(msg.write)
            size = sum(blocks for _, _, blocks in extents) * BLOCK_TOKENS * self._kv
            self.plane.io(self.node, "write", KV_LANE, size, extents)
        if msg.put:
            self.plane.pool(self.node, "put", extents_of(msg.put))

    @on(Drop)
    def on_drop(self, now: int, msg: Drop, sender: str) -> None:
        """The scheduler drops these requests (their prefill engine crashed): free what they hold here."""
        if msg.from_nodes:
            nodes = set(msg.from_nodes)
            rids = tuple(rid for rid, task in self.expected.items() if task.pe_node in nodes)
            kept = tuple(sorted(rid for rid, node in self._in_hbm.items() if node in nodes))
            self._lose(self._drop(now, rids), "dropped from", kept)
            return
        self._lose(self._drop(now, msg.rids), "dropped")

    def _drop(self, now: int, rids: tuple[int, ...]) -> list[tuple[int, int]]:
        lost = []
        for rid in rids:
            self._early_kv.pop(rid, None)
            self._early_read_here.pop(rid, None)
            task = self.expected.pop(rid, None)
            if task is None:
                lost.append((rid, 0))
                continue
            lost.append((rid, self._pending_read(task, rid in self._read_done)))
            if rid in self._buffered:
                self.buffer.release(now, rid, _buffered(task) * self._kv)
            else:
                self.buffer.cancel(now, rid)
            self._reading.pop(rid, None)  # its completion, if under way, is ignored
            for ids in (self._buffered, self._started_elsewhere, self._read_done):
                ids.discard(rid)
        return lost

    def _expect(self, now: int, msg: DecodeTask) -> None:
        started = self._early_read_here.pop(msg.rid, None)
        system = self.cluster.system
        if started is not None and not msg.read_on_de:  # the prefill group moved the read (or its part) here already
            msg = dataclasses.replace(msg, read_on_de=True, de_part=0)
            if started:
                self._started_elsewhere.add(msg.rid)
        elif _read_here(msg) and not msg.kept and self._snic_down and system.dual_path and not system.oracle:
            # Assigned here before the scheduler heard that this storage NIC is down: read on the prefill side.
            self.out.send("scheduler", ReadMoved(self.node, msg.pe_node, _read_here(msg)))
            msg = dataclasses.replace(msg, read_on_de=False, de_part=0)
            self.out.send(self.cluster.group_name("pe", msg.pe_node), ReadHere(msg.rid, False))
        self.expected[msg.rid] = msg
        early = self._early_kv.pop(msg.rid, None)
        if early is not None:  # Oracle: the prefill group was done before the scheduler's Expect came
            self._kv_ready(now, msg.rid, early)
            self._report_done(now)
            return
        if self.cluster.system.oracle:
            return
        # The DE buffer holds the whole prompt KV until it goes to HBM (§4): hit (read here or sent by the
        # PE) and miss (sent by the PE layer by layer); a hit kept in HBM stays there.
        self.buffer.acquire(now, msg.rid, _buffered(msg) * self._kv, lambda now: self._buffer_ready(now, msg.rid))

    def _buffer_ready(self, now: int, rid: int) -> None:
        msg = self.expected[rid]  # as it is now: a failover may have moved its read here meanwhile
        self._buffered.add(rid)
        if msg.kept:  # the hit is in this DE's HBM: the PE may load it now
            self._read_done.add(rid)
            self.out.send(self.cluster.group_name("pe", msg.pe_node), HitReady(msg.rid, True))
        elif msg.read_on_de or msg.de_part:
            self._read(now, msg)
        else:
            self.out.send(self.cluster.group_name("pe", msg.pe_node), HitReady(msg.rid, False))

    @on(ReadHere)
    def on_read_here(self, now: int, msg: ReadHere, sender: str) -> None:
        """The prefill node's storage NIC went down before this request's hit was read there: read it here."""
        if self._down:
            return  # the request was lost here (or will be, by the work that comes for it)
        task = self.expected.get(msg.rid)
        if task is None:
            self._early_read_here[msg.rid] = msg.started  # its Expect is on its way (real time: they race)
            return
        if task.read_on_de:
            return  # read here already
        if task.de_part and msg.rid in self._read_done:  # a split whose part here is read: read the rest too
            self._read_done.discard(msg.rid)
            first = task.hit - task.de_part
            task = self.expected[msg.rid] = dataclasses.replace(task, read_on_de=True, de_part=0)
            self._read(now, task, until=first)
            return
        self._reading.pop(msg.rid, None)  # a split's part here under way: the whole hit is read instead
        task = self.expected[msg.rid] = dataclasses.replace(task, read_on_de=True, de_part=0)
        if msg.started:
            self._started_elsewhere.add(msg.rid)
        if msg.rid in self._buffered:
            self._read(now, task)

    @on(Health)
    def on_health(self, now: int, msg: Health, sender: str) -> None:
        """This node's storage NIC went down: the hits still to read here move to the prefill side (failover)."""
        for port, factor in zip(msg.ports, msg.factors):
            if port == f"n{self.node}.snic.rx":
                self._snic_down = factor == 0.0
        if self._down or not any(
            port == f"n{self.node}.snic.rx" and factor == 0.0 for port, factor in zip(msg.ports, msg.factors)
        ):
            return
        for rid, task in list(self.expected.items()):
            if not _read_here(task) or task.kept or rid in self._read_done:
                continue
            started = rid in self._reading
            if started:
                del self._reading[rid]  # its completion is ignored
            self.expected[rid] = dataclasses.replace(task, read_on_de=False, de_part=0)
            self.out.send("scheduler", ReadMoved(self.node, task.pe_node, _read_here(task)))
            self.out.send(
                self.cluster.group_name("pe", task.pe_node), ReadHere(rid, started or rid in self._started_elsewhere)
            )
            self._started_elsewhere.discard(rid)
            if rid in self._buffered:  # the PE may send the KV as soon as it has read the hit
                self.out.send(self.cluster.group_name("pe", task.pe_node), HitReady(rid, False))

    def _read(self, now: int, msg: DecodeTask, until: int = 0) -> None:
        """DE-read (§4, Fig. 4b steps 1-2): storage → DE SNIC → DE DRAM buffer, which the PE streams layer by layer
        (a split: the hit's last ``de_part`` tokens; ``until`` > 0: its first ``until`` tokens, the rest read here
        already, when the prefill side's part moved here)."""
        if not msg.de_part and not until and msg.rid not in self._started_elsewhere:  # (a split's: the PE's start)
            self.out.observe(ReadStarted(msg.rid))
        self._started_elsewhere.discard(msg.rid)
        self._reads += 1
        number = self._reading[msg.rid] = self._reads
        if self._timeout_ns:
            self.plane.timer(now + self._timeout_ns, lambda at: self._check_read(at, msg.rid, number))

        tokens = until or _read_here(msg)

        def finished(now: int) -> None:
            if self._reading.get(msg.rid) != number:
                return  # moved, dropped or given up meanwhile, or the engine crashed: the late bytes are dropped
            del self._reading[msg.rid]
            self._read_done.add(msg.rid)
            self.out.observe(HitRead(msg.rid, self.node))
            self.out.send("scheduler", ReadDone(self.node, tokens))
            self.out.send(self.cluster.group_name("pe", msg.pe_node), HitReady(msg.rid, True))

        first = msg.hit - msg.de_part if msg.de_part else 0
        read_hit(self.plane, self.cluster.topology, now, self.node, msg.de_gpu, msg.context, until or msg.hit,
                 msg.pooled, self._kv, finished, first)  # fmt: skip

    def _check_read(self, now: int, rid: int, number: int) -> None:
        """``read_timeout_s`` after a read started here: give it up if stalled on a dead NIC, else look later."""
        if self._reading.get(rid) != number:
            return  # done, moved or dropped (or a later read of the request)
        if not self._snic_down:
            self.plane.timer(now + self._timeout_ns, lambda at: self._check_read(at, rid, number))
            return
        self._lose(self._drop(now, (rid,)), "timeout")  # its late bytes, if the NIC comes back, are dropped

    @on(KvReady)
    def on_kv_ready(self, now: int, msg: KvReady, sender: str) -> None:
        if self._down:
            return  # lost here (at the crash, or by its Expect since)
        for rid in msg.rids:
            if rid in self.expected:
                self._kv_ready(now, rid, msg.first_token_ns)
            else:  # the two senders raced (real time, Oracle: nothing to wait for on this side)
                self._early_kv[rid] = msg.first_token_ns
        self._report_done(now)

    def _kv_ready(self, now: int, rid: int, first_token_ns: int) -> None:
        task = self.expected.pop(rid)
        self._buffered.discard(rid)
        self._read_done.discard(rid)
        self._in_hbm[rid] = task.pe_node
        blocks = task.hit // BLOCK_TOKENS
        request = DecodingRequest(
            rid, task.prompt, task.gen, task.de_gpu, blocks, task.context, first_token_ns=first_token_ns
        )
        # HBM for the whole sequence (prompt + output), held until the request ends; the scheduler only
        # assigns requests that fit (§6.2), so this never waits.
        size = _buffered(task) * self._kv
        self.hbm[task.de_gpu].acquire(now, rid, (task.prompt + task.gen) * self._kv, partial(self._h2d, request, size))

    def _h2d(self, request: DecodingRequest, size: int, now: int) -> None:
        if self.cluster.system.oracle:
            self.steps.join(now, request)
            return
        # The prompt KV: DE buffer → HBM (one H2D, §4); then the buffer is free.
        epoch = self._epoch

        def copied(now: int) -> None:
            if epoch != self._epoch:
                return  # this engine crashed during the copy
            self.buffer.release(now, request.rid, size)
            self.steps.join(now, request)
            self._report_done(now)

        self.plane.transfer(self.cluster.topology.h2d(self.node, request.gpu), KV_LANE, size, copied)

    def decoded(self, now: int, request: DecodingRequest) -> None:
        """``request`` has all its tokens: its HBM is free; it is reported with the others of this instant."""
        self.hbm[request.gpu].release(now, request.rid, (request.prompt + request.gen) * self._kv)
        self._in_hbm.pop(request.rid, None)
        self.out.observe(Ended(request.rid))
        self._done.append(request)

    def stepped(self, now: int) -> None:
        """A segment's end was accounted: report what ended in it."""
        self._report_done(now)

    def _report_done(self, now: int) -> None:
        """Tell the scheduler and the client which requests finished (called where requests can finish)."""
        if self._done:
            done = self._done
            self._done = []
            rids = tuple(r.rid for r in done)
            first, second = tuple(r.first_token_ns for r in done), tuple(r.second_token_ns for r in done)
            self.out.send("scheduler", DecodeDone(rids, first, second, now))
            self.out.send("client", TurnDone(rids, first, second, now))


def _stored(task: DecodeTask) -> int:
    """Hit tokens of ``task`` read from storage (a read queue's count): :func:`stored_tokens`."""
    return stored_tokens(task.hit, task.pooled, task.kept)


def _read_here(task: DecodeTask) -> int:
    """Hit tokens of ``task`` this node reads from storage: a split's part, a DE-read's whole, else none."""
    return task.de_part if task.de_part else _stored(task) if task.read_on_de else 0


def _buffered(task: DecodeTask) -> int:
    """Tokens of ``task``'s KV that pass through the DE buffer: its prompt's, but for a hit kept in HBM."""
    return task.prompt - task.hit if task.kept else task.prompt
