"""The stepping of one node's decode GPUs: continuous batches, stepped as their EP group steps, and the
persistence of every completed Full Block (§4) -- the mechanics under a decode group
(:mod:`~dualpath_emu.cluster.decode`), which makes the decisions around them.

The GPUs that step together -- a node's DE GPUs for an MoE model (DP attention and expert parallelism: every
rank of the EP group runs each MoE layer's dispatch and combine together), each GPU alone for a dense model
(DP only) -- form a *step group*. A group steps its batches as one event per *segment*: the step time is
computed from every GPU's batch when one changes (:meth:`~dualpath_emu.cluster.roofline.Roofline.ep_decode_step_s`:
the slowest rank's attention, the largest batch's GEMMs and all-to-all), and the group sleeps until the next
request finishes; a request that arrives mid-step joins at the step's end (a step in flight is not
restarted). So a request costs a few events however many tokens it generates, and accounting
for a segment touches only the requests that finish or complete a Full Block in it (kept in heaps by the
step at which they do), not the whole batch.

What a decision needs is reported to a :class:`DecodeListener` (the decode group): a request has all its tokens
(:meth:`~DecodeListener.decoded`), a segment's end is accounted (:meth:`~DecodeListener.stepped`). Everything else
-- step times, second-token times, block write-backs, the all-to-all bytes, the GPUs' busy spans -- happens here.

Two implementations of the same rules: :class:`CoreDecodeSteps` hands the stepping to the data plane's core
(``core/src/decode.rs``, through ``DataPlane.decode_node``: virtual time, a one-process live run, the live
data-plane service), :class:`DecodeSteps` does it in Python on the plain data plane (the host backend, whose
write-backs are real bytes; runs that probe every write-back; and the reference the core is tested against,
event for event).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any, Protocol

from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.engines import NS
from dualpath_emu.cluster.ledger import Booking, Ledger
from dualpath_emu.cluster.topology import KV_LANE, MODEL_LANE

__all__ = ["CoreDecodeSteps", "DecodeListener", "DecodeSteps", "DecodingRequest"]


class DecodeListener(Protocol):
    """What :class:`DecodeSteps` tells its decode group."""

    def decoded(self, now: int, request: DecodingRequest) -> None:
        """``request`` has all its tokens (its ``second_token_ns`` is set, if it had a second)."""

    def stepped(self, now: int) -> None:
        """A segment's end was accounted: what ended in it has been told to :meth:`decoded`."""


@dataclass(eq=False, slots=True)
class DecodingRequest:
    """A request on a DE GPU: its prompt KV is in HBM; it decodes until it has ``gen`` tokens."""

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
    batch: dict[int, DecodingRequest] = field(default_factory=dict)
    """The requests decoding here, by join order."""
    base: int = 0
    """The sum of ``prompt + offset`` over the batch: its context is ``base + len(batch) * steps`` tokens."""
    finishing: list[tuple[int, int, DecodingRequest]] = field(default_factory=list)
    """A heap of ``(steps at which it has all its tokens, seq, request)``."""
    next_block: list[tuple[int, int, DecodingRequest]] = field(default_factory=list)
    """A heap of ``(steps at which its next Full Block is complete, seq, request)``."""
    fresh: list[DecodingRequest] = field(default_factory=list)
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
    pending: list[DecodingRequest] = field(default_factory=list)
    """Requests that arrived during a step: they join when it ends."""


class DecodeSteps:
    """The decode GPUs of node ``node`` (``gpus`` of them), stepping together if ``together`` (see the module).

    ``step_s`` prices a step of a group from each busy GPU's ``(batch size, context tokens)``;
    ``a2a_bytes_per_token`` are the MoE all-to-all bytes a decoded token sends over ``a2a_paths[gpu]``;
    ``d2h_paths[gpu]`` is where a GPU's completed blocks leave HBM on their way to storage (unless not
    ``write_back``: the Oracle reads nothing back). Requests go through ``plane``; ``busy_span(gpu unit, start,
    end, batch size, step)`` is told of every span a GPU steps one batch size."""

    def __init__(
        self,
        node: int,
        gpus: int,
        *,
        together: bool,
        step_s: Callable[[Sequence[tuple[int, int]]], float],
        kv_bytes_per_token: int,
        a2a_bytes_per_token: float,
        a2a_paths: Sequence[tuple[int, ...]],
        d2h_paths: Sequence[tuple[int, ...]],
        write_back: bool,
        plane: Ledger,
        listener: DecodeListener,
        busy_span: Callable[[int, int, int, int, int], None],
    ) -> None:  # fmt: skip
        self.node = node
        self.gpus = [_DecodeGpu(node, g) for g in range(gpus)]
        self._group_of = [_StepGroup(self.gpus)] * gpus if together else [_StepGroup([g]) for g in self.gpus]
        """Each GPU's step group."""
        self._step_s = step_s
        self._kv = kv_bytes_per_token
        self._a2a = a2a_bytes_per_token
        self._a2a_paths = list(a2a_paths)
        self._d2h_paths = list(d2h_paths)
        self._write_back = write_back
        self.plane = plane
        self._listener = listener
        self._busy_span = busy_span

    def join(self, now: int, request: DecodingRequest) -> None:
        """``request``'s prompt KV is in its GPU's HBM: it joins its GPU's batch at its group's next step
        boundary (at once if the group is idle); a request whose one token came from the prefill ends now."""
        if request.produced >= request.gen:
            _end_at_once(now, request, self._persist, self._listener)
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

    def reset(self, now: int) -> int:
        """The node's engine crashed (its HBM is lost, it restarts empty): every request is dropped, decoding
        or waiting to join, without a word to the listener; every group's wake-up is called off; every GPU's
        busy span is closed at ``now`` (told to ``busy_span``); the all-to-all tokens not yet charged are
        dropped (they never crossed a port). What was moved stays moved. After it, requests join as on a new
        node. Returns the number of requests dropped (``core/src/decode.rs``'s ``DecodeNode::reset``)."""
        dropped = 0
        for group in {id(group): group for group in self._group_of}.values():  # each group once
            dropped += len(group.pending)
            group.steps, group.segment_start_ns, group.step_ns = 0, now, 0
            group.timer = group.timer_steps = 0  # a wake-up already set is stale: ``timers`` keeps counting
            group.pending.clear()
        for gpu in self.gpus:
            dropped += len(gpu.batch)
            if gpu.busy_since_ns >= 0:
                unit = gpu.node * len(self.gpus) + gpu.gpu
                self._busy_span(unit, gpu.busy_since_ns, now, gpu.busy_batch, gpu.busy_step_ns)
            gpu.batch.clear()
            gpu.finishing.clear()
            gpu.next_block.clear()
            gpu.fresh.clear()
            gpu.base = gpu.joined = gpu.busy_batch = gpu.busy_step_ns = gpu.a2a_tokens = 0
            gpu.busy_since_ns = -1
        return dropped

    def _add(self, group: _StepGroup, request: DecodingRequest) -> None:
        gpu = self.gpus[request.gpu]
        request.seq, gpu.joined = gpu.joined, gpu.joined + 1
        request.offset = request.produced - group.steps
        gpu.batch[request.seq] = request
        gpu.base += request.prompt + request.offset
        heappush(gpu.finishing, (request.gen - request.offset, request.seq, request))
        gpu.fresh.append(request)


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
            self._busy_span(unit, gpu.busy_since_ns, now, gpu.busy_batch, gpu.busy_step_ns)
            gpu.busy_since_ns = -1
        if gpu.busy_since_ns < 0 and size and step_ns:
            gpu.busy_since_ns, gpu.busy_batch, gpu.busy_step_ns = now, size, step_ns

    def _segment_end(self, now: int, group: _StepGroup, number: int) -> None:
        if group.timer != number:
            return  # called off
        group.timer = 0
        self._at_step_end(now, group)
        self._listener.stepped(now)

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
        finished: list[DecodingRequest] = []
        finishing = gpu.finishing
        while finishing and finishing[0][0] <= done:
            r = heappop(finishing)[2]
            tokens -= r.offset + done - r.gen  # steps past its last token: a request ends early
            finished.append(r)
        finished.sort(key=lambda r: r.seq)
        for r in finished:
            del batch[r.seq]
            gpu.base -= r.prompt + r.offset
            self._listener.decoded(now, r)
        gpu.a2a_tokens += tokens
        if self._a2a and gpu.a2a_tokens > 0 and (changed or finished):
            # The steps' MoE dispatch/combine over the network, charged when this GPU's batch changes (after
            # the steps, like the block write-backs; not at every step of its group, which would cost a
            # transfer per GPU per segment): it loads the compute NICs the KV traffic shares, while the step
            # time has its own latency model (roofline.ep_decode_step_s).
            self.plane.transfer(self._a2a_paths[gpu.gpu], MODEL_LANE, int(self._a2a * gpu.a2a_tokens))
            gpu.a2a_tokens = 0
        self._persist(gpu.gpu, written)

    def _persist(self, gpu: int, written: list[tuple[int, int, int]]) -> None:
        """Write back the Full Blocks completed on ``gpu`` (charged once per segment, not per block)."""
        if written and self._write_back:
            _write_back(self.plane, self.node, self._d2h_paths[gpu], self._kv, written)

    def _store_blocks(self, steps: int, r: DecodingRequest, written: list[tuple[int, int, int]]) -> None:
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


def _write_back(plane: Ledger, node: int, d2h_path: tuple[int, ...], kv_bytes_per_token: int,
                written: list[tuple[int, int, int]]) -> None:  # fmt: skip
    """Write back completed Full Blocks (``written``: which, as ``(context, first block, blocks)``): HBM → DRAM
    through the GPU's CNIC, then DRAM → SNIC → storage (§4), once for all of them."""
    size = sum(blocks for _, _, blocks in written) * BLOCK_TOKENS * kv_bytes_per_token
    plane.transfer(d2h_path, KV_LANE, size)
    plane.io(node, "write", KV_LANE, size, tuple(written))


def _end_at_once(
    now: int, request: DecodingRequest, persist: Callable[[int, list[tuple[int, int, int]]], None],
    listener: DecodeListener,
) -> None:  # fmt: skip
    """A request whose one token came from the prefill takes no step: its prompt's last Full Blocks are written
    back and it ends."""
    full = (request.prompt + request.produced) // BLOCK_TOKENS
    if full > request.stored_blocks:
        persist(request.gpu, [(request.context, request.stored_blocks, full - request.stored_blocks)])
    request.stored_blocks = full
    listener.decoded(now, request)


class CoreDecodeSteps:
    """:class:`DecodeSteps` run by the data plane's core (``core/src/decode.rs``, the same rules; in process or
    behind the data-plane service): a request joins there, the core steps, writes back and charges the
    all-to-all itself, and reports only the requests that ended (with their GPUs' busy spans). The bytes it
    moved on its own are booked in ``booking`` when the run's byte check asks. Takes the same arguments as
    :class:`DecodeSteps`, plus the pricing (``Roofline.decode_pricing``) and the booking."""

    def __init__(
        self,
        node: int,
        gpus: int,
        *,
        pricing: dict[str, float | int | bool | None],
        together: bool,
        kv_bytes_per_token: int,
        a2a_bytes_per_token: float,
        a2a_paths: Sequence[tuple[int, ...]],
        d2h_paths: Sequence[tuple[int, ...]],
        storage: tuple[int, tuple[int, ...]] | None,
        plane: Ledger,
        booking: Booking,
        listener: DecodeListener,
        busy_span: Callable[[int, int, int, int, int], None],
    ) -> None:  # fmt: skip
        self.node = node
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
            a2a_bytes_per_token=a2a_bytes_per_token, a2a_paths=self._a2a_paths, a2a_lane=MODEL_LANE,
            d2h_paths=self._d2h_paths, storage_node=storage[0] if storage is not None else None, kv_lane=KV_LANE,
            first_unit=node * gpus,
        )  # fmt: skip
        booking.add_source(self._book)

    def join(self, now: int, request: DecodingRequest) -> None:
        """As :meth:`DecodeSteps.join`."""
        if request.produced >= request.gen:
            _end_at_once(now, request, self._persist, self._listener)
            return
        self._requests[request.rid] = request
        self.plane.decode_join(self._id, request.gpu, request.rid, request.prompt, request.gen, request.produced,
                               request.stored_blocks, request.context)  # fmt: skip

    def reset(self, now: int) -> int:
        """As :meth:`DecodeSteps.reset`, in the plane's core (``DataPlane.decode_reset``, after what was asked
        for before; the busy spans it closes come with the node's next report). Returns the number of
        requests dropped: those joined and not reported ended."""
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

    def _persist(self, gpu: int, written: list[tuple[int, int, int]]) -> None:
        if written and self._storage is not None:
            _write_back(self.plane, self.node, self._d2h_paths[gpu], self._kv, written)

    def _book(self, booking: Booking) -> None:
        """Book what the core moved on its own since the last time."""
        moved, last = self.plane.decode_bytes(self._id), self._booked
        if moved is None:
            return  # nothing known yet
        for kind, paths, lane in (("d2h", self._d2h_paths, KV_LANE), ("a2a", self._a2a_paths, MODEL_LANE)):
            for path, (size, count), (old_size, old_count) in zip(paths, moved[kind], last[kind], strict=True):
                if count > old_count:
                    booking.book(path, lane, size - old_size, count - old_count)
        (size, count), (old_size, old_count) = moved["written"], last["written"]
        if count > old_count and self._storage is not None:
            booking.book(self._storage[1], KV_LANE, size - old_size, count - old_count)
        self._booked = moved
