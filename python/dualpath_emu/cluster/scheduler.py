"""The central request scheduler (§6): keeps the global queues and the engines' loads, shows the system's policy
(:mod:`~dualpath_emu.cluster.policies`) a read-only view when a group fetches work, and checks and applies what it
decides."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType

from dualpath_emu.cluster.config import BLOCK_TOKENS, KvTierSpec
from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.engines import ClusterEngine
from dualpath_emu.cluster.kv_cache import POOL, STORE, HbmRetention, KvIndex, per_node
from dualpath_emu.cluster.messages import (
    DecodeDone, DecodeTask, Expect, Fetch, Health, Lost, Prefill, PrefillDone, PrefillTask, ReadDone, ReadMoved,
    PoolChange, Submit, TurnsEnded,
)  # fmt: skip
from dualpath_emu.cluster.observations import Assigned, PrefillChosen, ReadRerouted
from dualpath_emu.cluster.policies import (
    DecodeView, EngineState, GroupState, PrefillView, QueueView, ReadView, Request, RouteView, Split, check_decode,
    check_prefill, check_read_side, check_routes,
)  # fmt: skip
from dualpath_emu.cluster.policies import Health as HealthView
from dualpath_emu.cluster.recovery import CrashRecovery
from dualpath_emu.runtime.engine import DataPlane, Extents, Outbox, flat_extents, on

__all__ = ["Scheduler"]

_NONE: Mapping[int, int] = MappingProxyType({})


@dataclass(slots=True)
class _Pull:
    """A group's standing fetch (:class:`Fetch`) and when it was last served."""

    nodes: tuple[int, ...]
    period_ns: int
    prefill: bool  # Whether the group hosts PEs (a fetch then runs Algorithm 1 over every PE).
    last_ns: int = -(10**18)
    timer: bool = False  # Set while the next serving waits for the period to pass.


def _take(queue: deque[Request], taken: Sequence[Request]) -> None:
    """Remove ``taken`` (requests of ``queue``) from ``queue``: from its head when they are its head in order."""
    n = 0
    for request in taken:
        if not queue or queue[0] is not request:
            break
        queue.popleft()
        n += 1
    if n < len(taken):
        ids = {r.id for r in taken[n:]}
        kept = [r for r in queue if r.id not in ids]
        queue.clear()
        queue.extend(kept)


class Scheduler(ClusterEngine):
    """The central request scheduler (§6): global queues, engine loads and the system's policy."""

    def __init__(self, cluster: Cluster, out: Outbox, plane: DataPlane) -> None:
        super().__init__("scheduler", cluster, out, plane)
        self.policy = cluster.policy
        gpus, topo = cluster.config.node.gpus, cluster.topology
        self._gpus = gpus
        hbm = cluster.derived.de_hbm_kv_bytes
        # The engines' loads as the policy is shown them (frozen records, replaced when they change).
        self._pe: dict[int, EngineState] = {
            n.index * gpus + g: EngineState(n.index * gpus + g, n.index) for n in topo.pe_nodes for g in range(gpus)
        }
        self._de: dict[int, list[EngineState]] = {
            n.index: [EngineState(n.index * gpus + g, n.index, free_hbm_bytes=hbm) for g in range(gpus)]
            for n in topo.de_nodes
        }
        self._pe_group = {n.index: cluster.group_name("pe", n.index) for n in topo.pe_nodes}
        self._de_group = {node: cluster.group_name("de", node) for node in self._de}
        self._pe_group_of = {pe: self._pe_group[e.node] for pe, e in self._pe.items()}
        self._prefill_groups = list(dict.fromkeys(self._pe_group.values()))  # node by node
        self._wake_turn = 0
        self._pe_up: list[EngineState] = [self._pe[i] for i in sorted(self._pe)]
        """The PEs of the groups that are up, in id order: what the policy is shown (kept with :attr:`_pe`)."""
        self._pe_at: dict[int, int] = {e.id: i for i, e in enumerate(self._pe_up)}  # PE -> its place there
        self.prefill_queue: deque[Request] = deque()
        self.read_q: dict[int, int] = {n.index: 0 for n in topo.nodes}
        self.decode_queue: deque[Request] = deque()
        self.private: dict[int, deque[Request]] = {n: deque() for n in self._de}
        """The private queues of the decode groups that are up (:attr:`_private_of` has every group's)."""
        self.group_loads: dict[int, int] = {n: 0 for n in self._de}
        self._group_given: dict[int, int] = {}
        self._stamp = 0  # Assignments and routes so far (EngineState.given, GroupState.given).
        self.requests: dict[int, Request] = {}
        self.pe_of: dict[int, int] = {}
        self.de_of: dict[int, int] = {}
        self._factors: dict[str, float] = {}
        self._down: set[str] = set()  # Engine groups that crashed and have not fetched since.
        self._health = HealthView._live(self._factors, self._down)
        self._read_q_view = MappingProxyType(self.read_q)
        self._dual_path = cluster.system.dual_path
        self._pulls: dict[str, _Pull] = {}
        self._wanted: set[str] = set()
        """Groups with work waiting whose standing fetch has not come yet (real time: it races the work)."""
        self._decoded: set[int] = set()  # Requests whose DecodeDone came before their PrefillDone (real time only).
        self._kv = cluster.derived.kv_bytes_per_token
        self._private_of: dict[int, deque[Request]] = dict(self.private)
        """Every decode group's private queue, by node (``private`` lacks those of groups that are down)."""
        kv = cluster.config.kv_store
        self.kv = (KvIndex(STORE, kv, BLOCK_TOKENS * self._kv, out.observe, discard=self.plane.discard)
                   if kv.bounded else None)  # fmt: skip
        """Which Full Blocks of each context the storage tier holds, if it is bounded (:mod:`.kv_cache`)."""
        pool, system = cluster.config.kv_pool, cluster.system
        if kv.bounded and pool.write_back and system.pool:
            raise ValueError("[kv.pool] write = 'back' with a bounded [kv.store]: a store that evicts takes no "
                             "write-backs (not modelled)")  # fmt: skip
        self.pool = (KvIndex(POOL, pool.tier(len(topo.nodes)), BLOCK_TOKENS * self._kv, out.observe, placed=True,
                             on_node=self._pool_changed, write_back=pool.write_back) if system.pool else None)  # fmt: skip
        """Which Full Blocks of each context the nodes' DRAM pool holds, and where, if the system keeps KV in one."""
        kept = cluster.config.kv_hbm
        self.retention = (HbmRetention(sum(len(e) for e in self._de.values()), gpus, hbm, BLOCK_TOKENS * self._kv,
                                       out.observe, KvTierSpec(0, kept.eviction, kept.ttl_s))
                          if system.retain else None)  # fmt: skip
        """Which contexts the decode GPUs keep in HBM across turns, if the system retains KV."""
        self._hbm_ttl_ns = round(kept.ttl_s * 1e9)
        self._kept_nodes = self.retention.node_view if self.retention is not None else _NONE
        self._kept_des = self.retention.on_view if self.retention is not None else _NONE
        """What the policy's views show as kept in decode HBM (nothing without retention)."""
        self._tiered = self.kv is not None or self.pool is not None or self.retention is not None
        self._last: set[int] = set()  # Requests that are their agent's last turn (eviction; nothing kept after).
        self._pool_runs: dict[int, tuple[int, ...]] = {}
        """Per request in flight with a pooled hit, the pool's runs of it (:meth:`KvIndex.where`), for its tasks."""
        self.recovery = CrashRecovery(self)
        """Engine crashes (issue 26): requests taken back from a group that crashed and dispatched again."""

    # --- the engines' loads ------------------------------------------------------------------------------

    def _pe_load(self, pe: int, tokens: int, requests: int, given: int | None = None) -> None:
        e = self._pe[pe]
        self._pe[pe] = e = EngineState(
            e.id, e.node, e.tok + tokens, e.seq + requests, 0, e.given if given is None else given
        )
        at = self._pe_at.get(pe)
        if at is not None:
            self._pe_up[at] = e

    def _de_load(self, de: int, tokens: int, requests: int, hbm: int) -> None:
        node, gpu = divmod(de, self._gpus)
        engines = self._de[node]
        e = engines[gpu]
        engines[gpu] = EngineState(e.id, e.node, e.tok + tokens, e.seq + requests, e.free_hbm_bytes - hbm, e.given)

    def _pe_done(self, request: Request, pe: int) -> str | None:
        """``request`` left PE ``pe``; returns the group to wake if requests wait."""
        self._pe_load(pe, -self.policy.prefill_tokens(request), -1)
        return self._pe_group_of[pe] if self.prefill_queue else None

    def _notify_decode(self, now: int) -> None:
        """Make the fetch of every decode group with a non-empty private queue due."""
        de_group = self._de_group
        for node, queue in self.private.items():
            if queue:
                self._notify_group(now, de_group[node])

    def _notify_group(self, now: int, name: str) -> None:
        """Group ``name`` has work waiting: serve its fetch now, or once its period since the last has passed."""
        pull = self._pulls.get(name)
        if pull is None:
            self._wanted.add(name)
            return
        if pull.timer:
            return  # already due
        at_ns = pull.last_ns + pull.period_ns
        if at_ns > now:
            pull.timer = True
            self.plane.timer(at_ns, lambda now: self._serve_later(now, name))
        else:
            self._serve(now, name)

    @on(Submit)
    def on_submit(self, now: int, msg: Submit, sender: str) -> None:
        capacity = self.cluster.derived.de_hbm_kv_bytes
        kv, pool = self.kv, self.pool
        for turn in msg.turns:
            hbm = (turn.prompt + turn.gen) * self._kv
            hit = turn.hit
            pooled: tuple[tuple[int, int], ...] = ()
            if turn.last and self._tiered:  # (its end is the agent's: nothing of it is kept for later)
                self._last.add(turn.rid)
            if kv is not None or pool is not None:  # the hit is what a tier still holds; the rest is computed again
                context, blocks = turn.context, (turn.prompt + turn.gen) // BLOCK_TOKENS
                in_pool = 0
                if pool is not None:  # the nearest tier first: its blocks are read from the nodes holding them
                    in_pool = pool.find(turn.rid, context, hit, now)
                    pool.pin(context, blocks, hit // BLOCK_TOKENS)
                if kv is not None:
                    hit = max(in_pool, kv.find(turn.rid, context, hit, now))
                    kv.pin(context, blocks)
                if pool is not None and in_pool:
                    runs = pool.where(context, in_pool)
                    self._pool_runs[turn.rid] = runs  # (what its reads take from each node: the tasks carry it)
                    pooled = per_node(runs)
            request = Request(turn.rid, turn.prompt, turn.prompt - hit, hit, turn.gen, hbm, turn.context, pooled)
            if hbm > capacity:
                raise ValueError(f"request {turn.rid} needs {hbm} B of DE HBM, more than a DE GPU has for KV")
            self.requests[turn.rid] = request
            self.prefill_queue.append(request)
        group = self._prefill_groups[self._wake_turn]  # one prefill group in turn is told that work waits
        self._wake_turn = (self._wake_turn + 1) % len(self._prefill_groups)
        self._notify_group(now, group)

    @on(Fetch)
    def on_fetch(self, now: int, msg: Fetch, sender: str) -> None:
        self._pulls[sender] = _Pull(msg.nodes, msg.period_ns, any(node in self._pe_group for node in msg.nodes))
        if sender in self._down:  # back after a crash
            self.recovery.engine_up(now, sender)
        if sender in self._wanted:
            self._wanted.discard(sender)
            self._notify_group(now, sender)

    def _serve_later(self, now: int, name: str) -> None:
        pull = self._pulls.get(name)
        if pull is None:
            return  # the group crashed while its fetch waited for its period: it fetches again when it is back
        pull.timer = False
        self._serve(now, name)

    def _serve(self, now: int, name: str) -> None:
        """A fetch of group ``name``: what its leader's pull would get now."""
        pull = self._pulls[name]
        pull.last_ns = now
        again = False
        if pull.prefill:
            self._fetch_prefill(now)  # over every PE: what is left waits until a PE finishes (PrefillDone)
        for node in pull.nodes:
            if node not in self._pe_group:
                assigned, more = self._fetch_decode(now, node)
                again = again or bool(assigned and more)
        if again:
            self._notify_group(now, name)

    def _fetch_prefill(self, now: int) -> None:
        """Algorithm 1 over every PE that is up (the policy's rule), applied."""
        queue = self.prefill_queue
        if not queue:
            return
        view = PrefillView(QueueView(queue), tuple(self._pe_up), self._read_q_view, self._health,
                           self._stamp)  # fmt: skip
        assigned = check_prefill(self.policy, self.policy.assign_prefill(view), view)
        if not assigned:
            return
        _take(queue, [a.request for a in assigned])
        pe_of, decode_queue, observe = self.pe_of, self.decode_queue, self.out.observe
        prefill_tokens = self.policy.prefill_tokens
        for a in assigned:
            request = self.requests[a.request.id]
            self._stamp += 1
            self._pe_load(a.engine, prefill_tokens(request), 1, self._stamp)
            pe_of[request.id] = a.engine
            decode_queue.append(request)
            observe(PrefillChosen(request.id))
        self._route(now)

    def _route(self, now: int) -> None:
        """Phase 1, then the decode groups with work are told."""
        self._route_only()
        self._notify_decode(now)

    def _route_only(self) -> None:
        """Phase 1 of the DE selection: the global decode queue to the decode groups that are up (the policy's rule)."""
        queue = self.decode_queue
        if queue and self.private:  # (every decode group crashed: the queue waits for one to be back)
            given, loads = self._group_given, self.group_loads
            groups = tuple(GroupState(node, load, given.get(node, 0)) for node, load in loads.items())
            view = RouteView(QueueView(queue), groups, self._health, self._stamp, self._kept_nodes)
            routes = check_routes(self.policy, self.policy.route_decode(view), view)
            _take(queue, [r.request for r in routes])
            decode_tokens = self.policy.decode_tokens
            for route in routes:
                request = self.requests[route.request.id]
                self.private[route.group].append(request)
                loads[route.group] += decode_tokens(request)
                self._stamp += 1
                given[route.group] = self._stamp

    def _fetch_decode(self, now: int, node: int) -> tuple[int, bool]:
        self._route_only()
        queue = self.private[node]
        if not queue:
            return 0, False
        retention = self.retention
        view = DecodeView(node, QueueView(queue), tuple(self._de[node]), self._health, self._kept_des)
        policy = self.policy
        assigned = check_decode(policy, policy.assign_decode(view), view)
        if not assigned:
            return 0, bool(queue)
        _take(queue, [a.request for a in assigned])
        gpus, oracle, read_q, pe_of, de_of, pe_group = (
            self._gpus, self.cluster.system.oracle, self.read_q, self.pe_of, self.de_of, self._pe_group,
        )  # fmt: skip
        observe, decode_tokens = self.out.observe, policy.decode_tokens
        prefill: dict[str, list[PrefillTask]] = {}
        expect: list[DecodeTask] = []
        for a in assigned:
            de = a.engine
            r = self.requests[a.request.id]
            rid = r.id
            # (a hit a bounded store lost whole is computed again even if the DE kept it: its tokens are new now)
            kept = retention is not None and retention.take(rid, r.context, r.hit_tokens, de) and r.hit_tokens > 0
            self._de_load(de, decode_tokens(r), 1, r.hbm_bytes)
            pe = pe_of[rid]
            pe_node, pe_gpu, de_gpu = pe // gpus, pe % gpus, de % gpus
            if self.pool is not None:  # where this turn's blocks will be, should the next turn come first
                self.pool.placed(r.context, node)
            if retention is not None:  # what it keeps must leave the running requests their HBM
                retention.make_room(de, self._de[node][de_gpu].free_hbm_bytes)
            de_of[rid] = de
            read_on_de = False
            de_part = 0
            if kept:
                read_on_de = True  # its hit is in the DE's HBM: nothing to read
            elif not oracle and r.hit_tokens > 0:
                read = ReadView(r, pe_node, node, self._read_q_view, self._health)
                side = policy.read_side(read)
                check_read_side(policy, side, read, self._dual_path)
                if isinstance(side, Split):  # each side's part in its own read queue
                    de_part = side.de_tokens
                    read_q[node] = read_q.get(node, 0) + de_part
                    read_q[pe_node] = read_q.get(pe_node, 0) + r.stored_tokens - de_part
                else:
                    read_on_de = side == "de"
                    read_node = node if read_on_de else pe_node
                    read_q[read_node] = read_q.get(read_node, 0) + r.stored_tokens
            observe(Assigned(rid, pe, de, "split" if de_part else "de" if read_on_de else "pe"))
            prompt, hit, gen = r.prompt_tokens, r.hit_tokens, r.gen_tokens
            pooled = self._pool_runs.get(rid, ()) if not kept else ()  # the pool's runs, node by node in block order
            task = PrefillTask(
                rid, prompt, hit, gen, pe_node, pe_gpu, node, de_gpu, read_on_de, r.context, pooled, kept, de_part
            )
            prefill.setdefault(pe_group[pe_node], []).append(task)
            expect.append(DecodeTask(rid, prompt, hit, gen, node, de_gpu, pe_node, read_on_de, r.context, pooled, kept,
                                     de_part))  # fmt: skip
        for group, tasks in prefill.items():
            self.out.send(group, Prefill(tuple(tasks)))
        self.out.send(self._de_group[node], Expect(tuple(expect)))
        return len(assigned), bool(queue)

    @on(Health)
    def on_health(self, now: int, msg: Health, sender: str) -> None:
        """Faults changed some ports (:mod:`~dualpath_emu.cluster.faults`): the policy sees it from now on."""
        for port, factor in zip(msg.ports, msg.factors):
            if factor == 1.0:
                self._factors.pop(port, None)
            else:
                self._factors[port] = factor

    @on(ReadMoved)
    def on_read_moved(self, now: int, msg: ReadMoved, sender: str) -> None:
        """A read moved to the other side (failover): its tokens leave one read queue for the other."""
        self.read_q[msg.from_node] -= msg.tokens
        self.read_q[msg.to_node] += msg.tokens
        self.out.observe(ReadRerouted(msg.from_node, msg.to_node, msg.tokens))

    @on(ReadDone)
    def on_read_done(self, now: int, msg: ReadDone, sender: str) -> None:
        self.read_q[msg.node] -= msg.tokens

    @on(PrefillDone)
    def on_prefill_done(self, now: int, msg: PrefillDone, sender: str) -> None:
        wake = None
        for rid in msg.rids:
            pe = self.pe_of.pop(rid, None)
            if pe is None:
                continue  # lost to a crash of its decode engine while its last pass ran: dispatched again
            wake = self._pe_done(self.requests[rid], pe) or wake
            if rid in self._decoded:  # its DecodeDone came first (see on_decode_done)
                self._decoded.discard(rid)
                del self.requests[rid]
        if wake is not None:
            self._notify_group(now, wake)

    @on(DecodeDone)
    def on_decode_done(self, now: int, msg: DecodeDone, sender: str) -> None:
        self.recovery.decode_done(sender, msg)
        nodes = set()
        for rid in msg.rids:
            if rid not in self.de_of:
                raise RuntimeError(f"request {rid} ended on {sender}, where it was not (lost to a crash before)")
            if rid in self.pe_of:
                # A one-token turn ends as its KV arrives, and in real time the decode group's DecodeDone can
                # overtake the prefill group's PrefillDone: keep the request until that comes too.
                request = self.requests[rid]
                self._decoded.add(rid)
            else:
                request = self.requests.pop(rid)
            de = self.de_of.pop(rid)
            last = rid in self._last
            self._kv_ended(now, request, done=True, node=de // self._gpus)
            nodes.add(self._free_de(request, de))
            if self.retention is not None and not last:  # its KV stays in the DE's HBM while there is room
                node, gpu = divmod(de, self._gpus)
                tokens = request.prompt_tokens + request.gen_tokens
                kept = self.retention.keep(request.context, tokens, de, self._de[node][gpu].free_hbm_bytes, now)
                if kept and self._hbm_ttl_ns:  # a time to live: dropped then unless taken over
                    self.plane.timer(now + self._hbm_ttl_ns, partial(self.retention.expire, request.context, now))
        for node in sorted(nodes):
            if self.private[node]:
                self._notify_group(now, self._de_group[node])

    # --- where the KV lives (a bounded store) --------------------------------------------------------------

    def start(self, now_ns: int) -> None:
        for tier in (self.retention, self.pool, self.kv):
            if tier is not None:
                tier.start()

    def _kv_ended(self, now: int, request: Request, done: bool, node: int = -1) -> None:
        """``request`` ended (``done``: with all its tokens, its context's KV complete: held as the tiers can; the
        DRAM pool's on ``node``, the decode node that wrote it, if known)."""
        last = request.id in self._last
        self._last.discard(request.id)
        self._pool_runs.pop(request.id, None)
        if self.kv is None and self.pool is None:
            return
        context = request.context
        blocks = (request.prompt_tokens + request.gen_tokens) // BLOCK_TOKENS
        for tier in (self.pool, self.kv):
            if tier is None:
                continue
            tier.unpin(context)
            if done and (tier is self.kv or node >= 0):
                tier.store(context, blocks, now, last, node, request.hit_tokens // BLOCK_TOKENS)
            expiry = tier.next_expiry_ns(context)
            if expiry is not None:
                self.plane.timer(expiry, partial(tier.expire, context))

    def _pool_changed(self, node: int, put: Extents, drop: Extents, write: Extents) -> None:
        """The DRAM pool's blocks on decode node ``node`` changed: its decode group applies it (and writes back)."""
        self.out.send(self._de_group[node], PoolChange(flat_extents(put), flat_extents(drop), flat_extents(write)))

    # --- engine crashes (issue 26): the recovery component's ---------------------------------------------

    @on(Lost)
    def on_lost(self, now: int, msg: Lost, sender: str) -> None:
        """Engine group ``sender`` no longer holds these requests (:class:`Lost` says why)."""
        self.recovery.lost(now, msg, sender)

    @on(TurnsEnded)
    def on_turns_ended(self, now: int, msg: TurnsEnded, sender: str) -> None:
        """The client's answer about requests a dead decode group held."""
        self.recovery.turns_ended(now, msg, sender)

    def _free_de(self, request: Request, de: int) -> int:
        """``request`` left DE ``de`` (ended, or taken back): its load, slot and HBM are free; returns the DE's node."""
        node = de // self._gpus
        tokens = self.policy.decode_tokens(request)
        self._de_load(de, -tokens, -1, -request.hbm_bytes)
        if node in self.group_loads:  # (not while its group is down)
            self.group_loads[node] -= tokens
        return node

    def _wake_prefill(self, now: int) -> None:
        """Requests wait for a PE: serve the fetch of a prefill group that is up."""
        if self.prefill_queue:
            for name in self._pe_group.values():
                if name not in self._down:
                    self._notify_group(now, name)
                    return

    def _route_engines(self) -> None:
        """What the policy is offered: the PEs of the groups that are up."""
        down, group_of = self._down, self._pe_group_of
        self._pe_up = [self._pe[pe] for pe in sorted(self._pe) if group_of[pe] not in down]
        self._pe_at = {e.id: i for i, e in enumerate(self._pe_up)}
