"""The prefill engines of one EP group (one engine per group; one PE per GPU, DP attention, §4, §6.4):
reads on the PE side, layerwise prefill, batching under the attention quota, the forward pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.engines import NS, EngineGroup, inter_node_a2a_bytes, join, read_hit, stored_tokens
from dualpath_emu.cluster.identity import GroupId
from dualpath_emu.cluster.ledger import Hop
from dualpath_emu.cluster.messages import (
    Crash, Drop, Health, HitReady, KvReady, Lost, Prefill, PrefillDone, PrefillTask, ReadDone, ReadHere, ReadMoved,
)  # fmt: skip
from dualpath_emu.cluster.observations import ForwardPass, HitRead, PrefillPass, PrefillStarted, Prefilled, ReadStarted
from dualpath_emu.cluster.pool import Pool
from dualpath_emu.cluster.topology import KV_LANE
from dualpath_emu.runtime.engine import DataPlane, Outbox, Then, on

__all__ = ["PrefillGroup"]


@dataclass(slots=True)
class _PrefillItem:
    rid: int
    hit: int
    new: int
    context: int
    done_new: int = 0
    pe_ready: bool = False  # The hit KV is where the PE reads it (PE buffer, or nothing to read).
    de_ready: bool = False  # The DE side is ready: its buffer is allocated (and, DE-read, the hit KV is in it).
    buffered: int = 0  # Bytes of the PE buffer this request holds.
    de_node: int = 0
    de_gpu: int = 0
    read_on_de: bool = False
    in_hbm: bool = False  # Non-layerwise: the request's hit KV is in this GPU's HBM (copied before its first chunk).
    attempt: int = 0  # Which read of its hit counts: a failover or a drop makes the reads begun before it stale.
    reading: bool = False  # This side's current read has started (its buffer is held).
    started_elsewhere: bool = False
    """A read moved here had started on the decode side (which observed its start)."""
    dropped: bool = False  # The scheduler dropped it (its decode engine crashed) while a forward pass had it.
    pooled: tuple[int, ...] = ()  # Where the DRAM pool holds the hit's start (PrefillTask.pooled).
    kept: bool = False  # The hit is in the DE's HBM, kept from the last turn: loaded from there (PrefillTask.kept).
    de_part: int = 0  # A split read: the hit's last tokens, read on the decode side (PrefillTask.de_part).

    @property
    def stored(self) -> int:
        """Hit tokens read from storage (a read queue's count): :func:`stored_tokens`."""
        return stored_tokens(self.hit, self.pooled, self.kept)

    @property
    def read_here(self) -> int:
        """Hit tokens this side reads from storage (counted in its node's read queue)."""
        return 0 if self.read_on_de else self.stored - self.de_part

    @property
    def de_reads(self) -> bool:
        """Whether the decode side reads (part of) the hit: its notice then says it has (``HitReady.read``)."""
        return self.read_on_de or self.de_part > 0

    @property
    def ready(self) -> bool:
        return self.pe_ready and self.de_ready

    @property
    def cached(self) -> int:
        return self.hit + self.done_new

    @property
    def remaining(self) -> int:
        return self.new - self.done_new


class PrefillGroup(EngineGroup):
    """The PEs of one EP group (one or more nodes; one PE per GPU, DP attention, §6.4)."""

    def __init__(
        self, cluster: Cluster, nodes: Sequence[int], out: Outbox, plane: DataPlane, restarted: bool = False
    ) -> None:
        super().__init__(GroupId("pe", nodes[0]).name, cluster, nodes, out, plane, restarted)
        gpus = cluster.config.node.gpus
        self.gpus = [(n, g) for n in nodes for g in range(gpus)]
        self.queues: dict[tuple[int, int], list[_PrefillItem]] = {key: [] for key in self.gpus}
        self.items: dict[int, tuple[tuple[int, int], _PrefillItem]] = {}
        self._early_hits: set[int] = set()
        """Requests whose :class:`HitReady` came before their :class:`Prefill` (real time: the senders race)."""
        self._early_read_here: dict[int, bool] = {}
        """Requests whose :class:`ReadHere` came before their :class:`Prefill` (its ``started``): the decode node's
        storage NIC went down and the decode group moved the read here before the scheduler's task arrived."""
        self._passing = False
        """A forward pass, or the pull wait after it, is in progress: the pass's end looks for work again."""
        self._kick_due = False
        d = cluster.derived
        self._kv = d.kv_bytes_per_token
        self._a2a = inter_node_a2a_bytes(d.model, len(nodes))
        buffer = cluster.config.dram_buffer_bytes
        self.buffers = {n: Pool(out, f"n{n}.buffer", buffer) for n in nodes}
        # After a pass the group pulls before it batches again (its PrefillDone frees its PEs' load, and the
        # scheduler answers the prefill and decode fetches, each at most a fetch period later). Without this
        # wait the next pass starts at once with only the GPUs that still had work, and the refilled ones sit
        # out a whole pass (DS 660B 2P4D: 7.6 of 16 GPUs busy per pass, a 24% longer JCT; Fig. 13 right).
        self._pull_wait_ns = round((2 * cluster.config.fetch_period_s + 1e-6) * NS)
        self._snic_down: set[int] = set()
        """Nodes of this group whose storage NIC cannot bring KV in (a fault has it down)."""

    def pools(self) -> list[Pool]:
        return list(self.buffers.values())

    @on(Prefill)
    def on_prefill(self, now: int, msg: Prefill, sender: str) -> None:
        if self._down:  # a dead engine takes nothing: the scheduler dispatches these again
            self._lose([(t.rid, t.pe_node, self._pending_read(stored_tokens(t.hit, t.pooled, t.kept) - t.de_part,
                                                              t.read_on_de, False)) for t in msg.tasks], "down")  # fmt: skip
            return
        for task in msg.tasks:
            self._add(now, task)

    # --- crashes (issue 26) --------------------------------------------------------------------------

    def _pending_read(self, hit: int, read_on_de: bool, done: bool) -> int:
        """Hit tokens counted in this side's read queue whose read has not ended."""
        return hit if hit > 0 and not read_on_de and not done and not self.cluster.system.oracle else 0

    def _lose(self, lost: list[tuple[int, int, int]], why: str) -> None:
        """Tell the scheduler these ``(rid, node, pending read tokens)`` are no longer here."""
        reads = [(node, tokens) for _, node, tokens in lost if tokens]
        self.out.send("scheduler", Lost(tuple(rid for rid, _, _ in lost), why, tuple(n for n, _ in reads),
                                        tuple(t for _, t in reads)))  # fmt: skip

    @on(Crash)
    def on_crash(self, now: int, msg: Crash, sender: str) -> None:
        """This engine crashes: every request it holds, its buffers and what its GPUs were doing are gone."""
        if self._down:
            return
        self._down = True
        self._epoch += 1
        lost = []
        for rid, ((node, _), item) in self.items.items():
            item.attempt += 1  # its read under way, if any, is stale
            lost.append((rid, node, self._pending_read(item.read_here, item.read_on_de, item.pe_ready)))
        self.items.clear()
        for queue in self.queues.values():
            queue.clear()
        self._early_hits.clear()
        self._early_read_here.clear()
        self._passing = self._kick_due = False
        for pool in self.pools():
            pool.reset(now)
        self._lose(lost, "crash")

    @on(Drop)
    def on_drop(self, now: int, msg: Drop, sender: str) -> None:
        """The scheduler drops these requests (their decode engine crashed): free what they hold here."""
        self._lose([self._drop(now, rid) for rid in msg.rids], "dropped")

    def _drop(self, now: int, rid: int) -> tuple[int, int, int]:
        """Forget request ``rid`` here (its buffer freed, its read or pass ignored); returns its :meth:`_lose` entry."""
        self._early_hits.discard(rid)
        self._early_read_here.pop(rid, None)
        entry = self.items.pop(rid, None)
        if entry is None:
            return rid, 0, 0
        (node, gpu), item = entry
        self.queues[(node, gpu)].remove(item)
        lost = (rid, node, self._pending_read(item.read_here, item.read_on_de, item.pe_ready))
        item.attempt += 1
        item.dropped, item.reading = True, False
        if item.buffered:
            if not self.buffers[node].cancel(now, rid):  # granted: held (read under way or done)
                self.buffers[node].release(now, rid, item.buffered)
            item.buffered = 0
        return lost

    def _add(self, now: int, msg: PrefillTask) -> None:
        item = _PrefillItem(msg.rid, msg.hit, msg.prompt - msg.hit, msg.context, de_node=msg.de_node,
                            de_gpu=msg.de_gpu, read_on_de=msg.read_on_de, pooled=msg.pooled, kept=msg.kept,
                            de_part=msg.de_part)  # fmt: skip
        key = (msg.pe_node, msg.pe_gpu)
        self.queues[key].append(item)
        self.items[msg.rid] = (key, item)
        if msg.rid in self._early_hits:
            self._early_hits.discard(msg.rid)
            item.de_ready = True
        started = self._early_read_here.pop(msg.rid, None)
        if started is not None and item.de_reads:  # the decode group moved its read (or part) here already
            item.read_on_de, item.de_part, item.started_elsewhere, item.de_ready = False, 0, started, False
        system = self.cluster.system
        if system.oracle:
            item.de_ready = True
            self._pe_ready(now, item)
        elif msg.hit == 0 or item.read_on_de:
            self._pe_ready(now, item)
        elif msg.pe_node in self._snic_down and system.dual_path:
            # Assigned here before the scheduler heard that this storage NIC is down (its Health and this
            # task raced): the read goes to the decode side, as on_health moves the reads already here.
            moved = item.read_here
            item.read_on_de, item.de_part = True, 0
            self.out.send("scheduler", ReadMoved(msg.pe_node, msg.de_node, moved))
            self.out.send(self.cluster.group_name("de", msg.de_node), ReadHere(msg.rid, False))
            self._pe_ready(now, item)
        else:
            self._read_here(now, msg.pe_node, item)

    def _read_here(self, now: int, node: int, item: _PrefillItem, first: int = 0) -> None:
        """Hold the PE buffer for the hit (a split's part here; from token ``first`` on, a range added to what it
        holds), then read it (:meth:`_read`)."""
        size = (item.hit - item.de_part - first) * self._kv
        item.buffered += size
        attempt = item.attempt
        self.buffers[node].acquire(now, item.rid, size, lambda now: self._read(now, node, item, attempt, size, first))

    def _read(self, now: int, node: int, item: _PrefillItem, attempt: int, size: int, first: int = 0) -> None:
        """PE-read (§4, Fig. 4a steps 1-2): the hit KV (a split's part), storage → PE SNIC → PE DRAM buffer."""
        if attempt != item.attempt:  # moved to the DE side before it could start: the buffer is not needed
            self.buffers[node].release(now, item.rid, size)
            return
        item.reading = True
        if not item.started_elsewhere:
            self.out.observe(ReadStarted(item.rid))
        if self._timeout_ns:
            self.plane.timer(now + self._timeout_ns, lambda now: self._check_read(now, node, item, attempt))

        tokens = item.hit - first if first else item.read_here  # what this read counts in the read queue

        def finished(now: int) -> None:
            if attempt != item.attempt:  # the port came back: the late bytes are dropped (buffer freed at the move)
                return
            item.reading = False
            self.out.observe(HitRead(item.rid, node))
            self.out.send("scheduler", ReadDone(node, tokens))
            self._pe_ready(now, item)

        key = self.items[item.rid][0]
        read_hit(self.plane, self.cluster.topology, now, node, key[1], item.context, item.hit - item.de_part,
                 item.pooled, self._kv, finished, first)  # fmt: skip

    def _check_read(self, now: int, node: int, item: _PrefillItem, attempt: int) -> None:
        """``read_timeout_s`` after a read started: give it up if stalled on a dead storage NIC, else look later."""
        if attempt != item.attempt or not item.reading:
            return  # done, moved or dropped
        if node not in self._snic_down:
            self.plane.timer(now + self._timeout_ns, lambda now: self._check_read(now, node, item, attempt))
            return
        self._lose([self._drop(now, item.rid)], "timeout")  # its late bytes, if the NIC comes back, are dropped

    def _pe_ready(self, now: int, item: _PrefillItem) -> None:
        item.pe_ready = True
        if item.ready:
            self._work_ready(now)

    @on(Health)
    def on_health(self, now: int, msg: Health, sender: str) -> None:
        """A storage NIC of this group went down: its pending reads move to the DE side (single-path: wait)."""
        for port, factor in zip(msg.ports, msg.factors):
            for n in self.nodes:
                if port == f"n{n}.snic.rx":
                    (self._snic_down.add if factor == 0.0 else self._snic_down.discard)(n)
        system = self.cluster.system
        if not system.dual_path or system.oracle or self._down:
            return
        down = {n for port, factor in zip(msg.ports, msg.factors) for n in self.nodes
                if factor == 0.0 and port == f"n{n}.snic.rx"}  # fmt: skip
        for (node, _), item in list(self.items.values()):
            if node in down and not item.read_on_de and item.hit > 0 and not item.pe_ready:
                started = item.reading or item.started_elsewhere
                moved = item.read_here
                item.attempt += 1  # the read under way (or waiting for its buffer) is stale from now
                item.read_on_de, item.de_part, item.started_elsewhere = True, 0, False  # (a split: the whole hit)
                if item.reading:  # abandoned: its buffer is free now (one still awaited, when granted)
                    self.buffers[node].release(now, item.rid, item.buffered)
                item.reading, item.buffered = False, 0
                item.de_ready = False  # until the decode group has read it
                self.out.send("scheduler", ReadMoved(node, item.de_node, moved))
                self.out.send(self.cluster.group_name("de", item.de_node), ReadHere(item.rid, started))
                self._pe_ready(now, item)

    @on(ReadHere)
    def on_read_here(self, now: int, msg: ReadHere, sender: str) -> None:
        """The decode node's storage NIC went down before this request's hit was read there: read it here."""
        if self._down:
            return  # the request was lost here (or will be, by the work that comes for it)
        entry = self.items.get(msg.rid)
        if entry is None:
            self._early_read_here[msg.rid] = msg.started  # its Prefill is on its way (real time: they race)
            return
        if not entry[1].de_reads:
            return  # a race in real time: it reads here already
        (node, _), item = entry
        if item.de_part and item.pe_ready and not item.read_on_de:  # a split whose part here is read: add the rest
            first, item.de_part = item.hit - item.de_part, 0
            item.pe_ready = item.de_ready = False
            self._read_here(now, node, item, first)
            return
        item.attempt += 1
        if item.buffered:  # a split's part here under way, or waiting for its buffer: read the whole hit instead
            if not self.buffers[node].cancel(now, item.rid):
                self.buffers[node].release(now, item.rid, item.buffered)
            item.buffered, item.reading = 0, False
        item.read_on_de, item.de_part, item.started_elsewhere = False, 0, msg.started
        item.pe_ready = item.de_ready = False  # the hit is to be read here; the DE's buffer notice comes again
        self._read_here(now, node, item)

    @on(HitReady)
    def on_hit_ready(self, now: int, msg: HitReady, sender: str) -> None:
        if self._down:
            return
        entry = self.items.get(msg.rid)
        if entry is None:
            self._early_hits.add(msg.rid)
            return
        item = entry[1]
        if msg.read != item.de_reads:
            return  # a notice from before a failover moved the read: not the one this read waits for
        item.de_ready = True
        if item.ready:
            self._work_ready(now)

    def _work_ready(self, now: int) -> None:
        """A request became ready: batch once this instant's inputs are in, unless a pass runs."""
        if not self._passing and not self._kick_due:
            self._kick_due = True
            self.plane.timer(now, self._kick)

    # --- batching (§6.4) -----------------------------------------------------------------------------

    def _batch(self, key: tuple[int, int]) -> list[tuple[_PrefillItem, int]]:
        """FIFO packing of ready requests within the quota; the one that would exceed it is chunked to fit."""
        queue = self.queues[key]
        if not queue:
            return []  # every GPU of the group is asked at every kick
        quota = self.cluster.derived.layer_attention_quota_s
        roofline = self.cluster.derived.prefill
        layerwise = self.cluster.system.layerwise or self.cluster.system.oracle
        hbm_left = self.cluster.derived.pe_hbm_kv_bytes
        batch: list[tuple[_PrefillItem, int]] = []
        flops = hbm = 0.0
        for item in queue:
            if not item.ready:
                break  # FIFO: a request waiting for its read holds back the ones behind it
            if not layerwise:
                need = (item.hit + item.new) * self._kv
                if need > hbm_left:
                    if not batch and need > self.cluster.derived.pe_hbm_kv_bytes:
                        raise ValueError(f"request {item.rid}'s KV does not fit a PE's HBM without layerwise prefill")
                    break
                hbm_left -= need
            f, b = roofline.attention_cost(item.cached, item.remaining)
            if roofline.attention_s_from(flops + f, hbm + b) <= quota or not batch and item.remaining == 1:
                batch.append((item, item.remaining))
                flops, hbm = flops + f, hbm + b
                continue
            low, high = 0, item.remaining  # the largest chunk in [0, remaining) that fits
            while high - low > 1:
                mid = (low + high) // 2
                f, b = roofline.attention_cost(item.cached, mid)
                if roofline.attention_s_from(flops + f, hbm + b) <= quota:
                    low = mid
                else:
                    high = mid
            if low == 0 and not batch:
                low = 1  # always make progress
            if low > 0:
                batch.append((item, low))
            break
        return batch

    def _kick(self, now: int) -> None:
        """Start a forward pass over what is ready, if anything is."""
        self._kick_due = False
        if self._passing or self._down:
            return
        batches = {key: self._batch(key) for key in self.gpus}
        if any(batches.values()):
            self._passing = True
            self._forward(now, batches)

    def _forward(self, now: int, batches: dict[tuple[int, int], list[tuple[_PrefillItem, int]]]) -> None:
        cluster = self.cluster
        system, d, topo, observe = cluster.system, cluster.derived, cluster.topology, self.out.observe
        plane = self.plane
        stages = d.stages
        layers = d.model.layers
        # Compute times per GPU; the DP barrier makes every layer as slow as the slowest GPU's attention.
        ffn_s = 0.0
        ranks: list[tuple[Hop | None, int, Hop | None]] = []
        collectives: list[Hop] = []
        post: list[tuple[int, int, _PrefillItem, int]] = []
        pre: list[tuple[tuple[int, ...], int]] = []
        attention_s: list[float] = []
        for (node, gpu), batch in batches.items():
            if not batch:
                attention_s.append(0.0)
                continue
            shape = [(item.cached, chunk) for item, chunk in batch]
            times = d.prefill.prefill(shape)
            attention_s.append(times.attention_s)
            attn_ns = round(times.attention_s * layers / stages * NS)
            ffn_s = max(ffn_s, times.other_s)
            tokens = sum(chunk for _, chunk in batch)
            for item, chunk in batch:
                if item.done_new == 0:
                    observe(PrefillStarted(item.rid))
                miss_bytes = chunk * self._kv
                if system.oracle:
                    ranks.append((None, attn_ns, None))
                    continue
                if system.layerwise:
                    load = None
                    first = item.done_new == 0 and item.hit > 0  # the hit KV streams in with the first chunk
                    if first:
                        path = (topo.gpu_to_gpu(item.de_node, item.de_gpu, node, gpu) if item.kept
                                else topo.buffer_to_gpu(item.de_node, item.de_gpu, node, gpu) if item.read_on_de
                                else topo.h2d(node, gpu))  # fmt: skip
                        load = (path, KV_LANE, (item.hit - item.de_part) * self._kv // stages)
                    # The DE needs the full KV (PE-read) or the miss only (DE-read, it holds the hit); a split's
                    # DE part is in its buffer already.
                    here = (item.hit - item.de_part) * self._kv if not item.read_on_de and item.done_new == 0 else 0
                    sent = miss_bytes + here
                    store = (topo.gpu_to_buffer(node, gpu, item.de_node, item.de_gpu), KV_LANE, sent // stages)
                    ranks.append((load, attn_ns, store))
                    if first and item.de_part:  # a split's DE part: a second load stream, from the DE buffer
                        path = topo.buffer_to_gpu(item.de_node, item.de_gpu, node, gpu)
                        ranks.append(((path, KV_LANE, item.de_part * self._kv // stages), 0, None))
                else:
                    ranks.append((None, attn_ns, None))
                    if not item.in_hbm and item.hit > 0:
                        item.in_hbm = True
                        pre.append((topo.h2d(node, gpu), item.hit * self._kv))
                    last = item.done_new + chunk == item.new
                    if last:  # the whole prompt KV goes to the DE buffer after the pass
                        post.append((node, gpu, item, (item.hit + item.new) * self._kv))
            if self._a2a:  # model traffic: Oracle has it too. To the same GPU of the next node of the group.
                peer_node = self.nodes[(self.nodes.index(node) + 1) % len(self.nodes)]
                peer_gpu = gpu
                collectives.append((topo.gpu_to_gpu(node, gpu, peer_node, peer_gpu), topo.model_lane,
                                    int(self._a2a * tokens * layers / stages)))  # fmt: skip
        observe(ForwardPass(tuple(attention_s)))
        ffn_ns = round(ffn_s * layers / stages * NS)

        epoch = self._epoch

        def run_pass(started: int) -> None:
            if epoch == self._epoch:  # not crashed while its hit KV was copied in
                plane.forward(
                    stages, ranks, ffn_ns, collectives, lambda now: self._passed(now, started, batches, post, epoch)
                )

        if pre:  # without layerwise prefill, the hit KV is copied into HBM before the pass
            done = join(len(pre), run_pass)
            for path, size in pre:
                plane.transfer(path, KV_LANE, size, done)
        else:
            run_pass(now)

    def _passed(self, now: int, started: int, batches: dict[tuple[int, int], list[tuple[_PrefillItem, int]]],
                post: list[tuple[int, int, _PrefillItem, int]], epoch: int) -> None:  # fmt: skip
        if epoch != self._epoch:
            return  # the engine crashed during the pass: its results are gone
        gpus = self.cluster.config.node.gpus  # the GPUs with work in this pass were busy for it (gpu_util)
        work = tuple((n * gpus + g, len(b), sum(t for _, t in b)) for (n, g), b in batches.items() if b)
        self.out.observe(PrefillPass(started, now, work))
        if post:  # without layerwise prefill, the whole prompt KV goes to the DE buffer after the pass
            topo = self.cluster.topology
            done = join(len(post), lambda now: self._finish(now, batches) if epoch == self._epoch else None)
            for node, gpu, item, size in post:
                self.plane.transfer(topo.gpu_to_buffer(node, gpu, item.de_node, item.de_gpu), KV_LANE, size, done)
        else:
            self._finish(now, batches)

    def _finish(self, now: int, batches: dict[tuple[int, int], list[tuple[_PrefillItem, int]]]) -> None:
        """The pass is over: first tokens out, buffers free; look for work after the pull wait."""
        finished: list[int] = []
        kv_ready: dict[str, list[int]] = {}
        for (node, gpu), batch in batches.items():
            queue = self.queues[(node, gpu)]
            for item, chunk in batch:
                if item.dropped:
                    continue  # its decode engine crashed during the pass: what it computed is not wanted
                if item.buffered:  # the hit KV is in HBM now: the PE buffer is free again
                    self.buffers[node].release(now, item.rid, item.buffered)
                    item.buffered = 0
                item.done_new += chunk
                if item.done_new == item.new:
                    queue.remove(item)
                    del self.items[item.rid]
                    self.out.observe(Prefilled(item.rid))
                    kv_ready.setdefault(self.cluster.group_name("de", item.de_node), []).append(item.rid)
                    finished.append(item.rid)
        for group, rids in kv_ready.items():
            self.out.send(group, KvReady(tuple(rids), now))
        if finished:
            self.out.send("scheduler", PrefillDone(tuple(finished)))
        epoch = self._epoch
        self.plane.timer(now + self._pull_wait_ns, lambda now: self._pulled(now) if epoch == self._epoch else None)

    def _pulled(self, now: int) -> None:
        self._passing = False
        self._kick(now)
