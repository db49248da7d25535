"""The decode engines of one node (one engine per node; one DE per GPU, §4): the DE buffer, H2D before
decode, continuous batching and the persistence of every completed Full Block.

The GPUs that step together -- a node's DE GPUs for an MoE model (DP attention and expert parallelism: every
rank of the EP group runs each MoE layer's dispatch and combine together), each GPU alone for a dense model
(DP only) -- form a *step group*. A group steps its batches as one event per *segment*: the step time is
computed from every GPU's batch when one changes (:meth:`~dualpath_emu.cluster.roofline.Roofline.ep_decode_step_s`:
the slowest rank's attention, the largest batch's GEMMs and all-to-all), and the group sleeps until the next
request finishes; a request that arrives mid-step joins at the step's end (a step in flight is not
restarted). So a request costs a few events however many tokens it generates (DESIGN.md §8), and accounting
for a segment touches only the requests that finish or complete a Full Block in it (kept in heaps by the
step at which they do), not the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from heapq import heappop, heappush

from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.engines import NS, EngineGroup, hit_extents
from dualpath_emu.cluster.messages import DecodeDone, DecodeTask, Expect, HitReady, KvReady, ReadDone, TurnDone
from dualpath_emu.cluster.observations import Ended, HitRead
from dualpath_emu.cluster.pool import Pool
from dualpath_emu.cluster.topology import KV_LANE, MODEL_LANE
from dualpath_emu.runtime.engine import DataPlane, Outbox, on

__all__ = ["DecodeGroup"]

@dataclass(eq=False, slots=True)
class _DecodeRequest:
    rid: int
    prompt: int
    gen: int
    gpu: int
    stored_blocks: int
    """Full Blocks of this request's KV in storage (the hit's at first)."""
    context: int
    """The token stream its KV extends (see :class:`~dualpath_emu.cluster.messages.Turn`)."""
    produced: int = 1
    """Tokens out when it joins its GPU's batch: the first came from the prefill."""
    offset: int = 0
    """In a batch, it has produced ``offset`` + its step group's step count tokens (it leaves the batch at ``gen``)."""
    seq: int = 0
    """Its place in its GPU's join order (requests that finish together end in this order)."""
    first_token_ns: int = -1
    """When the prefill produced its first token (from :class:`KvReady`)."""
    second_token_ns: int = -1
    """When its first decode step produced its second token (-1 until then)."""


@dataclass(slots=True)
class _DecodeGpu:
    """One DE GPU's continuous batch, stepped with its step group (see the module docstring).

    Every request's output count follows from its group's ``steps`` and its own ``offset``, so that
    accounting for a segment costs O(log n) per request that finishes or completes a Full Block, not O(n)
    for the whole batch."""

    node: int
    gpu: int
    batch: dict[int, _DecodeRequest] = field(default_factory=dict)
    """The requests decoding here, by join order."""
    base: int = 0
    """The sum of ``prompt + offset`` over the batch: its context is ``base + len(batch) * steps`` tokens."""
    finishing: list[tuple[int, int, _DecodeRequest]] = field(default_factory=list)
    """A heap of ``(steps at which it has all its tokens, seq, request)``."""
    next_block: list[tuple[int, int, _DecodeRequest]] = field(default_factory=list)
    """A heap of ``(steps at which its next Full Block is complete, seq, request)``."""
    fresh: list[_DecodeRequest] = field(default_factory=list)
    """Requests that joined since the last step: their second token and their prompt's last blocks come
    with the next step."""
    joined: int = 0
    busy_since_ns: int = -1
    """Start of this GPU's current span with a non-empty batch of one size (reported as busy time when the
    size changes), or -1."""
    busy_batch: int = 0
    busy_step_ns: int = 0
    a2a_tokens: int = 0
    """Tokens decoded since this GPU's all-to-all bytes were last charged to the network."""


@dataclass(slots=True)
class _StepGroup:
    """GPUs that step together, and their common step clock."""

    gpus: list[_DecodeGpu]
    steps: int = 0
    segment_start_ns: int = 0
    """When the step in flight started (every step of a segment is ``step_ns`` long)."""
    step_ns: int = 0
    """0: no GPU of the group has a request (no step in flight)."""
    timer: int = 0
    """The number of the group's live wake-up (0: none); a wake-up with another number was called off."""
    timers: int = 0
    """Wake-ups set so far."""
    timer_steps: int = 0
    """The group's step count at which the live wake-up comes."""
    pending: list[_DecodeRequest] = field(default_factory=list)
    """Requests that arrived during a step: they join when it ends."""


class DecodeGroup(EngineGroup):
    """The DEs of one node (one per GPU): continuous batching, the DE buffer, H2D before decode, and the
    persistence of every completed Full Block (§4)."""

    def __init__(self, cluster: Cluster, node: int, out: Outbox, plane: DataPlane) -> None:
        super().__init__(f"de{node}", cluster, [node], out, plane)
        self.node = node
        gpus = cluster.config.node.gpus
        self.gpus = [_DecodeGpu(node, g) for g in range(gpus)]
        d = cluster.derived
        # An MoE model's DE GPUs step together (EP); a dense model's each alone (DP only).
        together = d.model.moe_layers > 0 and d.decode.ep_degree > 1
        self._group_of = [_StepGroup(self.gpus)] * gpus if together else [_StepGroup([g]) for g in self.gpus]
        """Each GPU's step group."""
        self.expected: dict[int, DecodeTask] = {}
        self._early_kv: dict[int, int] = {}
        """First-token times of requests whose :class:`KvReady` came before their :class:`Expect` (real time
        only: the prefill and the scheduler race)."""
        self._done: list[_DecodeRequest] = []
        """Requests finished at this instant, reported together by :meth:`_report_done`."""
        self._kv = cluster.derived.kv_bytes_per_token
        self._step_s = cluster.derived.decode.ep_decode_step_s
        self.buffer = Pool(out, f"n{node}.buffer", cluster.config.dram_buffer_bytes)
        hbm = cluster.derived.de_hbm_kv_bytes
        self.hbm = [Pool(out, f"n{node}.gpu{g}.hbm", hbm) for g in range(gpus)]
        # The decode EP group: decode_ep_nodes consecutive decode nodes; its MoE all-to-all crosses the
        # network to the next node of the group (model traffic, high lane).
        ep = cluster.config.decode_ep_nodes
        de_nodes = [n.index for n in cluster.topology.de_nodes]
        first = de_nodes[(de_nodes.index(node) // ep) * ep]
        group = de_nodes[de_nodes.index(first) : de_nodes.index(first) + ep]
        self._a2a_peer = group[(group.index(node) + 1) % len(group)]
        self._a2a = d.decode.a2a_remote_bytes_per_token * d.model.moe_layers
        """MoE all-to-all bytes per decoded token (all layers) that cross the network."""

    @on(Expect)
    def on_expect(self, now: int, msg: Expect, sender: str) -> None:
        for task in msg.tasks:
            self._expect(now, task)

    def _expect(self, now: int, msg: DecodeTask) -> None:
        self.expected[msg.rid] = msg
        early = self._early_kv.pop(msg.rid, None)
        if early is not None:  # Oracle: the prefill group was done before the scheduler's Expect came
            self._kv_ready(now, msg.rid, early)
            self._report_done(now)
            return
        if self.cluster.system.oracle:
            return
        # The DE buffer holds the whole prompt KV until it goes to HBM (§4): hit (read here or sent by the
        # PE) and miss (sent by the PE layer by layer).
        self.buffer.acquire(now, msg.rid, msg.prompt * self._kv, lambda now: self._buffer_ready(now, msg))

    def _buffer_ready(self, now: int, msg: DecodeTask) -> None:
        if msg.read_on_de:
            self._read(now, msg)
        else:
            self.out.send(self.cluster.group_name("pe", msg.pe_node), HitReady(msg.rid))

    def _read(self, now: int, msg: DecodeTask) -> None:
        """DE-read (§4, Fig. 4b steps 1-2): the hit KV, storage → DE SNIC → DE DRAM buffer; then the PE
        streams it layer by layer from there."""
        metrics = self.cluster.metrics
        metrics.read_start(msg.rid, now)

        def finished(now: int) -> None:
            metrics.read_done(msg.rid, now)
            self.out.observe(HitRead(msg.rid, self.node))
            self.out.send("scheduler", ReadDone(self.node, msg.hit))
            self.out.send(self.cluster.group_name("pe", msg.pe_node), HitReady(msg.rid))

        self.plane.io(self.node, "read", KV_LANE, msg.hit * self._kv, hit_extents(msg.context, msg.hit), finished)

    @on(KvReady)
    def on_kv_ready(self, now: int, msg: KvReady, sender: str) -> None:
        for rid in msg.rids:
            if rid in self.expected:
                self._kv_ready(now, rid, msg.first_token_ns)
            else:  # the two senders raced (real time, Oracle: nothing to wait for on this side)
                self._early_kv[rid] = msg.first_token_ns
        self._report_done(now)

    def _kv_ready(self, now: int, rid: int, first_token_ns: int) -> None:
        task = self.expected.pop(rid)
        request = _DecodeRequest(
            rid, task.prompt, task.gen, task.de_gpu, task.hit // BLOCK_TOKENS, task.context, first_token_ns=first_token_ns
        )
        # HBM for the whole sequence (prompt + output), held until the request ends; the scheduler only
        # assigns requests that fit (§6.2), so this never waits.
        self.hbm[task.de_gpu].acquire(now, rid, (task.prompt + task.gen) * self._kv, partial(self._h2d, request))

    def _h2d(self, request: _DecodeRequest, now: int) -> None:
        if self.cluster.system.oracle:
            self._join(now, request)
            return
        # The prompt KV: DE buffer → HBM (one H2D, §4); then the buffer is free.
        size = request.prompt * self._kv

        def copied(now: int) -> None:
            self.buffer.release(now, request.rid, size)
            self._join(now, request)
            self._report_done(now)

        self.plane.transfer(self.cluster.topology.h2d(self.node, request.gpu), KV_LANE, size, copied)

    def _join(self, now: int, request: _DecodeRequest) -> None:
        if request.produced >= request.gen:  # its one token came from the prefill: no step to take
            full = (request.prompt + request.produced) // BLOCK_TOKENS
            if full > request.stored_blocks:
                self._persist(request.gpu, [(request.context, request.stored_blocks, full - request.stored_blocks)])
            request.stored_blocks = full
            self._finish(now, request)
            return
        group = self._group_of[request.gpu]
        group.pending.append(request)
        if group.step_ns == 0:  # the group is idle: the request starts a step now
            self._at_step_end(now, group)
            return
        # A step is in flight: the request joins when it ends.
        boundary = group.steps + (now - group.segment_start_ns) // group.step_ns + 1
        if boundary < group.timer_steps:
            self._set_timer(now, group, boundary)

    def _add(self, group: _StepGroup, request: _DecodeRequest) -> None:
        gpu = self.gpus[request.gpu]
        request.seq, gpu.joined = gpu.joined, gpu.joined + 1
        request.offset = request.produced - group.steps
        gpu.batch[request.seq] = request
        gpu.base += request.prompt + request.offset
        heappush(gpu.finishing, (request.gen - request.offset, request.seq, request))
        gpu.fresh.append(request)

    def _finish(self, now: int, request: _DecodeRequest) -> None:
        self.hbm[request.gpu].release(now, request.rid, (request.prompt + request.gen) * self._kv)
        self.out.observe(Ended(request.rid))
        self._done.append(request)

    def _report_done(self, now: int) -> None:
        """Tell the scheduler and the client which requests finished (called where requests can finish)."""
        if self._done:
            done = self._done
            self._done = []
            rids = tuple(r.rid for r in done)
            self.out.send("scheduler", DecodeDone(rids))
            first, second = tuple(r.first_token_ns for r in done), tuple(r.second_token_ns for r in done)
            self.out.send("client", TurnDone(rids, first, second, now))

    def _at_step_end(self, now: int, group: _StepGroup) -> None:
        """A step boundary (or an idle group's first request): account the steps done, let the waiting
        requests join, start the next segment."""
        self._account(group, now)
        for request in group.pending:
            self._add(group, request)
        group.pending.clear()
        self._next_segment(group, now)

    def _next_segment(self, group: _StepGroup, now: int) -> None:
        """Start a segment: the step time of the batches as they are now, and a timer for when the first
        request finishes (a request arriving earlier brings it forward to the step's end)."""
        group.timer = 0
        busy = [g for g in group.gpus if g.batch]
        if busy:
            step_s = self._step_s([(len(g.batch), g.base + len(g.batch) * group.steps) for g in busy])
            group.step_ns = max(1, round(step_s * NS))
        else:
            group.step_ns = 0
        group.segment_start_ns = now
        for gpu in group.gpus:
            if len(gpu.batch) != gpu.busy_batch or gpu.busy_since_ns < 0:  # else _busy has nothing to do
                self._busy(gpu, now, group.step_ns)
        if busy:
            self._set_timer(now, group, min(g.finishing[0][0] for g in busy))

    def _set_timer(self, now: int, group: _StepGroup, steps: int) -> None:
        """Wake the group when it has done ``steps`` steps (counted from the segment's start); a wake-up set
        before is called off."""
        group.timer_steps = steps
        group.timers += 1
        group.timer = number = group.timers
        at_ns = group.segment_start_ns + (steps - group.steps) * group.step_ns
        self.plane.timer(at_ns, lambda now: self._segment_end(now, group, number))

    def _busy(self, gpu: _DecodeGpu, now: int, step_ns: int) -> None:
        """Close ``gpu``'s busy span if its batch size changed (gpu_util; a span's step is its first, as the
        step changes with every request of the group), open the next one."""
        size = len(gpu.batch)
        if gpu.busy_since_ns >= 0 and size != gpu.busy_batch:
            unit = gpu.node * len(self.gpus) + gpu.gpu
            self.cluster.metrics.decode_segment(unit, gpu.busy_since_ns, now, gpu.busy_batch, gpu.busy_step_ns)
            gpu.busy_since_ns = -1
        if gpu.busy_since_ns < 0 and size and step_ns:
            gpu.busy_since_ns, gpu.busy_batch, gpu.busy_step_ns = now, size, step_ns

    def _segment_end(self, now: int, group: _StepGroup, number: int) -> None:
        if group.timer != number:
            return  # called off
        group.timer = 0
        self._at_step_end(now, group)
        self._report_done(now)

    def _account(self, group: _StepGroup, now: int) -> None:
        """Apply the steps done since the segment started: tokens, second-token times, persisted blocks,
        finished requests."""
        if group.step_ns == 0:
            return
        steps = (now - group.segment_start_ns) // group.step_ns
        if steps <= 0:
            return
        done = group.steps = group.steps + steps
        second_token_ns = group.segment_start_ns + group.step_ns
        group.segment_start_ns += steps * group.step_ns
        for gpu in group.gpus:
            batch = gpu.batch
            if not batch:
                continue
            if (gpu.fresh or (gpu.finishing and gpu.finishing[0][0] <= done)
                    or (gpu.next_block and gpu.next_block[0][0] <= done)):  # fmt: skip
                self._account_gpu(now, gpu, steps, done, second_token_ns)
            else:  # nothing of this GPU's is due: only its all-to-all bytes grow (what _account_gpu would do)
                gpu.a2a_tokens += steps * len(batch)

    def _account_gpu(self, now: int, gpu: _DecodeGpu, steps: int, done: int, second_token_ns: int) -> None:
        batch = gpu.batch
        tokens = steps * len(batch)
        changed = bool(gpu.fresh)
        written: list[tuple[int, int, int]] = []
        for r in gpu.fresh:
            r.second_token_ns = second_token_ns
            self._store_blocks(done, r, written)
        gpu.fresh.clear()
        next_block = gpu.next_block
        while next_block and next_block[0][0] <= done:
            r = heappop(next_block)[2]
            if batch.get(r.seq) is r:
                self._store_blocks(done, r, written)
        finished: list[_DecodeRequest] = []
        finishing = gpu.finishing
        while finishing and finishing[0][0] <= done:
            r = heappop(finishing)[2]
            tokens -= r.offset + done - r.gen  # steps past its last token: a request ends early
            finished.append(r)
        finished.sort(key=lambda r: r.seq)
        for r in finished:
            del batch[r.seq]
            gpu.base -= r.prompt + r.offset
            self._finish(now, r)
        gpu.a2a_tokens += tokens
        if self._a2a and gpu.a2a_tokens > 0 and (changed or finished):
            # The steps' MoE dispatch/combine over the network, charged when this GPU's batch changes (after
            # the steps, like the block write-backs; not at every step of its group, which would cost a
            # transfer per GPU per segment): it loads the compute NICs the KV traffic shares, while the step
            # time has its own latency model (roofline.ep_decode_step_s).
            topo = self.cluster.topology
            path = topo.gpu_to_gpu(self.node, gpu.gpu, self._a2a_peer, gpu.gpu)
            self.plane.transfer(path, MODEL_LANE, int(self._a2a * gpu.a2a_tokens))
            gpu.a2a_tokens = 0
        self._persist(gpu.gpu, written)

    def _persist(self, gpu: int, written: list[tuple[int, int, int]]) -> None:
        """Write back completed Full Blocks (``written``: which, as ``(context, first block, blocks)``): HBM →
        DRAM through the CNIC, then DRAM → SNIC → storage (§4), charged once per segment, not per block."""
        if written and not self.cluster.system.oracle:
            size = sum(blocks for _, _, blocks in written) * BLOCK_TOKENS * self._kv
            self.plane.transfer(self.cluster.topology.d2h(self.node, gpu), KV_LANE, size)
            self.plane.io(self.node, "write", KV_LANE, size, tuple(written))

    def _store_blocks(self, steps: int, r: _DecodeRequest, written: list[tuple[int, int, int]]) -> None:
        """Add the Full Blocks ``r`` has completed since they were last counted to ``written`` (its group has
        done ``steps`` steps); schedule its next one."""
        gpu = self.gpus[r.gpu]
        produced = min(r.gen, r.offset + steps)
        full = (r.prompt + produced) // BLOCK_TOKENS
        blocks = full - r.stored_blocks
        if blocks > 0:
            written.append((r.context, r.stored_blocks, blocks))
        r.stored_blocks = full
        if produced < r.gen:
            heappush(gpu.next_block, ((full + 1) * BLOCK_TOKENS - r.prompt - r.offset, r.seq, r))
