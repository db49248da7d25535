"""The cluster's actors: client, scheduler, prefill engine groups, decode engine groups (paper §4, §6).

Message flow of one turn (DESIGN.md §5; every hop a typed message, every byte a core transfer or I/O):

1. ``client`` → ``scheduler``: :class:`Submit` (the agent's next turn: prompt, hit, gen tokens).
2. The scheduler queues it and tells an engine group that work is waiting (:class:`WorkPending`);
   groups *pull*: a group sends :class:`Fetch` (with its report) at most once per ``fetch_period_s``. A
   prefill fetch runs Algorithm 1 over every PE of the cluster (``PrefillDispatch``: run over the fetching
   group alone, the first group to pull took nearly all the work); the assigned requests join the decode
   queue and are routed to a decode group at once (phase 1 of §6.2, which the next decode fetch would do
   anyway), and that group is told. A decode fetch runs phase 2 and picks the read side (§6.3). The
   scheduler then tells the prefill group :class:`Prefill` and the decode group :class:`Expect`; a decode
   fetch that got work and left more is answered with another :class:`WorkPending`.
3. The reading side's group reads the hit KV from storage into its node's DRAM buffer (a core I/O over the
   storage NIC); a DE-side read then tells the prefill group :class:`HitReady`. Either side tells the
   scheduler :class:`ReadDone` (its ``read_q`` shrinks).
4. The prefill group batches ready requests per GPU under the attention quota (binary-search chunking,
   §6.4; after a pass it first lets its pull be answered, see ``_forward_loop``) and runs one forward pass
   over all its GPUs (one core call: per-layer loads into HBM, attention,
   the DP barrier, MoE phase with its all-to-all on the high lane, per-layer stores to the DE buffer).
   Without layerwise prefill the hit KV is copied into HBM first and the KV sent to the DE after the pass.
   A request whose last chunk is done has its first token: :class:`KvReady` to the decode group,
   :class:`PrefillDone` to the scheduler.
5. The decode group copies the prompt KV into HBM (H2D) and adds the request to its GPU's continuous batch;
   decode steps persist every completed 64-token block (DRAM → SNIC → storage). When the request has all
   its tokens: :class:`DecodeDone` to the scheduler and :class:`TurnDone` to the client, which submits the
   agent's next turn at once (zero tool latency, §3.2).

A decode GPU steps its whole batch as one event per *segment*: the step time is computed from the batch when
it changes (a request joins or finishes), and the GPU sleeps until the next request finishes or a new one
joins; a joining request makes the GPU account the steps done so far. So a request costs a few events
however many tokens it generates (DESIGN.md §8), and accounting for a segment touches only the requests
that finish or complete a Full Block in it (kept in heaps by the step at which they do), not the whole batch.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from heapq import heappop, heappush
from typing import ClassVar

from dualpath_emu.cluster.catalog import ModelSpec
from dualpath_emu.cluster.config import BLOCK_TOKENS, ClusterConfig, Derived
from dualpath_emu.cluster.metrics import Metrics
from dualpath_emu.cluster.scheduler import Engine, Policy, PrefillDispatch, Request
from dualpath_emu.cluster.systems import System
from dualpath_emu.cluster.topology import KV_LANE, MODEL_LANE, Topology
from dualpath_emu.messages import Message, MessageRegistry
from dualpath_emu.runtime.actors import Actor, ActorSystem, handles
from dualpath_emu.runtime.core_work import Completion
from dualpath_emu.workload.trajectory import Trajectory

__all__ = ["ClientActor", "DecodeGroup", "PrefillGroup", "SchedulerActor", "cluster_registry"]

NS = 1_000_000_000


# --------------------------------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Turn(Message):
    """One agent turn as the scheduler sees it: request ``rid`` with ``prompt`` tokens of which ``hit`` are
    in storage, generating ``gen``."""

    WIRE_NAME: ClassVar[str] = "cluster.Turn"
    VERSION: ClassVar[int] = 1
    rid: int
    prompt: int
    hit: int
    gen: int


@dataclass(frozen=True, slots=True)
class Submit(Message):
    """New turns, in arrival order (those the client submits at one instant travel together)."""

    WIRE_NAME: ClassVar[str] = "cluster.Submit"
    VERSION: ClassVar[int] = 2
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class WorkPending(Message):
    WIRE_NAME: ClassVar[str] = "cluster.WorkPending"
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class Fetch(Message):
    """A group's pull: one fetch for each of its nodes (the scheduler's groups are nodes, §6.1)."""

    WIRE_NAME: ClassVar[str] = "cluster.Fetch"
    VERSION: ClassVar[int] = 1
    nodes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PrefillTask(Message):
    """Compute request ``rid`` on PE GPU ``pe_gpu`` of ``pe_node``; its KV goes to ``de_node``/``de_gpu``."""

    WIRE_NAME: ClassVar[str] = "cluster.PrefillTask"
    VERSION: ClassVar[int] = 1
    rid: int
    prompt: int
    hit: int
    gen: int
    pe_node: int
    pe_gpu: int
    de_node: int
    de_gpu: int
    read_on_de: bool


@dataclass(frozen=True, slots=True)
class Prefill(Message):
    """To a prefill group: the tasks one decode fetch assigned to its GPUs, in assignment order."""

    WIRE_NAME: ClassVar[str] = "cluster.Prefill"
    VERSION: ClassVar[int] = 2
    tasks: tuple[PrefillTask, ...]


@dataclass(frozen=True, slots=True)
class DecodeTask(Message):
    """Request ``rid`` will decode on ``de_gpu`` of ``de_node``; read its hit KV there if ``read_on_de``."""

    WIRE_NAME: ClassVar[str] = "cluster.DecodeTask"
    VERSION: ClassVar[int] = 1
    rid: int
    prompt: int
    hit: int
    gen: int
    de_node: int
    de_gpu: int
    pe_node: int
    read_on_de: bool


@dataclass(frozen=True, slots=True)
class Expect(Message):
    """To a decode group: the tasks one decode fetch assigned to its GPUs, in assignment order."""

    WIRE_NAME: ClassVar[str] = "cluster.Expect"
    VERSION: ClassVar[int] = 2
    tasks: tuple[DecodeTask, ...]


@dataclass(frozen=True, slots=True)
class HitReady(Message):
    WIRE_NAME: ClassVar[str] = "cluster.HitReady"
    VERSION: ClassVar[int] = 1
    rid: int


@dataclass(frozen=True, slots=True)
class ReadDone(Message):
    WIRE_NAME: ClassVar[str] = "cluster.ReadDone"
    VERSION: ClassVar[int] = 1
    node: int
    tokens: int


@dataclass(frozen=True, slots=True)
class KvReady(Message):
    """To a decode group: these requests' prompt KV is in its DE buffer (from one forward pass)."""

    WIRE_NAME: ClassVar[str] = "cluster.KvReady"
    VERSION: ClassVar[int] = 2
    rids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PrefillDone(Message):
    """To the scheduler: these requests left their PEs (one forward pass)."""

    WIRE_NAME: ClassVar[str] = "cluster.PrefillDone"
    VERSION: ClassVar[int] = 2
    rids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DecodeDone(Message):
    """To the scheduler: these requests left their DEs (at one instant)."""

    WIRE_NAME: ClassVar[str] = "cluster.DecodeDone"
    VERSION: ClassVar[int] = 2
    rids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TurnDone(Message):
    """To the client: these turns are done (at one instant)."""

    WIRE_NAME: ClassVar[str] = "cluster.TurnDone"
    VERSION: ClassVar[int] = 2
    rids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Start(Message):
    WIRE_NAME: ClassVar[str] = "cluster.Start"
    VERSION: ClassVar[int] = 1


def cluster_registry() -> MessageRegistry:
    """Every message type of the cluster."""
    registry = MessageRegistry()
    for cls in (Turn, Submit, WorkPending, Fetch, PrefillTask, Prefill, DecodeTask, Expect, HitReady, ReadDone,
                KvReady, PrefillDone, DecodeDone, TurnDone, Start):  # fmt: skip
        registry.register(cls)
    return registry


# --------------------------------------------------------------------------------------------------- context


@dataclass
class Cluster:
    """What every actor of one run shares (in one process): settings, data plane, metrics, request table."""

    config: ClusterConfig
    system: System
    derived: Derived
    topology: Topology
    metrics: Metrics
    policy: Policy
    plane: Ledger

    def group_name(self, role: str, node: int) -> str:
        """The actor that hosts ``node``'s engines (prefill groups may span nodes)."""
        if role == "pe":
            first = node - node % self.config.prefill_ep_nodes
            return f"pe{first}"
        return f"de{node}"


_Hop = tuple[tuple[int, ...], int, int]
"""A per-layer transfer of a forward pass: ``(path, lane, bytes per layer)``."""


class Ledger:
    """The cluster's door to the data plane: forwards each request to the running loop's core work and
    books its bytes per (port, lane), so that the run can check that the core moved exactly what the
    actors asked for (every byte accounted, :func:`~dualpath_emu.cluster.invariants.check_ledger`)."""

    def __init__(self, system: ActorSystem, topology: Topology) -> None:
        self._system = system
        self._topology = topology
        self._by_path: dict[tuple[tuple[int, ...], int], list[int]] = {}
        """``[bytes, transfers]`` per ``(path, lane)``: a run has few distinct paths, so booking costs one
        dict update per transfer; the per-port totals are summed when asked for."""

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
        return self._system.data_plane.transfer(path, lane, size)

    def transfer_detached(self, path: tuple[int, ...], lane: int, size: int) -> None:
        """A transfer nobody waits for (write-backs, decode all-to-all): booked, never reported."""
        self._book(path, lane, size)
        self._system.data_plane.transfer_detached(path, lane, size)

    def io(self, node: int, kind: str, lane: int, size: int) -> asyncio.Future[Completion]:
        return self._system.data_plane.io(self._book_io(node, kind, lane, size), kind, lane, size)

    def io_detached(self, node: int, kind: str, lane: int, size: int) -> None:
        """A storage I/O nobody waits for (block write-backs): booked, never reported."""
        self._system.data_plane.io_detached(self._book_io(node, kind, lane, size), kind, lane, size)

    def _book_io(self, node: int, kind: str, lane: int, size: int) -> int:
        """Book a storage I/O of ``node``; return its storage node."""
        n = self._topology.nodes[node]
        if kind == "read":
            self._book((self._topology.storage_read, n.snic_rx, n.dram), lane, size)
        else:
            self._book((n.dram, n.snic_tx, self._topology.storage_write), lane, size)
        return n.storage_node

    def forward(
        self,
        n_layers: int,
        ranks: Sequence[tuple[_Hop | None, int, _Hop | None]],
        *,
        ffn_ns: int,
        collectives: Sequence[_Hop],
    ) -> asyncio.Future[Completion]:
        for load, _, store in ranks:
            for hop in (load, store):
                if hop is not None:
                    self._book(hop[0], hop[1], hop[2] * n_layers, n_layers)
        for path, lane, size in collectives:
            self._book(path, lane, size * n_layers, n_layers)
        return self._system.data_plane.forward(n_layers, ranks, ffn_ns=ffn_ns, collectives=collectives)


def _then(actor: Actor, future: asyncio.Future[Completion], callback: Callable[[], None]) -> None:
    """Call ``callback`` when ``future`` is done (cheaper than a task per I/O); an error fails the run."""

    def done(f: asyncio.Future[Completion]) -> None:
        try:
            f.result()
            callback()
        except Exception as error:
            actor.system.fail(actor, error)

    future.add_done_callback(done)


class Pool:
    """A capacity in bytes handed out in FIFO order (a node's DRAM buffer, a GPU's HBM for KV).

    :meth:`acquire` calls ``then`` once the bytes are granted (at once if they fit and nobody waits);
    :meth:`release` returns them and grants waiters in order. Grants and returns are recorded as ``take`` and
    ``give`` events (``<pool> <rid> <bytes>``) after a ``capacity`` event, so the invariant checker can verify
    from the event log alone that no pool is ever over its capacity.
    """

    def __init__(self, actor: Actor, name: str, capacity: int) -> None:
        self.actor, self.name, self.capacity, self.free = actor, name, capacity, capacity
        self._waiting: deque[tuple[int, int, Callable[[], None]]] = deque()
        self._announced = False

    def acquire(self, rid: int, size: int, then: Callable[[], None]) -> None:
        if not self._announced:  # the first use, inside the running loop
            self._announced = True
            self.actor.system.record(self.actor.name, "capacity", f"{self.name} {self.capacity}")
        if size > self.capacity:
            raise ValueError(f"request {rid} needs {size} B of {self.name}, whose capacity is {self.capacity} B")
        if not self._waiting and size <= self.free:
            self._take(rid, size)
            then()
        else:
            self._waiting.append((rid, size, then))

    def release(self, rid: int, size: int) -> None:
        self.free += size
        self.actor.system.record(self.actor.name, "give", f"{self.name} {rid} {size}")
        while self._waiting and self._waiting[0][1] <= self.free:
            waiter, wanted, then = self._waiting.popleft()
            self._take(waiter, wanted)
            then()

    def _take(self, rid: int, size: int) -> None:
        self.free -= size
        self.actor.system.record(self.actor.name, "take", f"{self.name} {rid} {size}")


# --------------------------------------------------------------------------------------------------- client


class ClientActor(Actor):
    """Replays trajectories. Agent trajectories (§3.2): offline all agents at t = 0, online Poisson arrivals;
    a turn is submitted as soon as the previous one of its agent is done (zero tool latency). Imported
    request traces with arrival times (Mooncake) are replayed open loop: each turn at its own time. Hit
    lengths are the trajectory's (same-trajectory hits only for agents, §3.4), rounded down to whole Full
    Blocks if configured."""

    def __init__(self, system: ActorSystem, cluster: Cluster, trajectories: Sequence[Trajectory]) -> None:
        super().__init__(system, "client")
        self.cluster = cluster
        self.trajectories = trajectories
        self._next_turn = [0] * len(trajectories)
        self._open = [len(t) for t in trajectories]
        """Turns of each trajectory not done yet."""
        self._hits: list[tuple[int, ...] | None] = [None] * len(trajectories)
        self._agent_of: dict[int, int] = {}
        self._next_rid = 0
        self._outbox: list[Turn] = []
        """Turns submitted at this instant, sent as one :class:`Submit` by :meth:`_send_turns`."""
        self.remaining = len(trajectories)
        self.finished = asyncio.Event()

    @handles(Start)
    def on_start(self, msg: Start) -> None:
        if not self.trajectories:
            self.finished.set()
            return
        timed = [a for a, t in enumerate(self.trajectories) if t.arrival_s is not None]
        closed = [a for a, t in enumerate(self.trajectories) if t.arrival_s is None]
        if timed:
            self.system.spawn(self, self._replay(timed), "replay")
        if self.cluster.config.mode == "offline":
            for agent in closed:
                self._submit_next(agent)
            self._send_turns()
        elif closed:
            self.system.spawn(self, self._arrivals(closed), "arrivals")

    async def _arrivals(self, agents: Sequence[int]) -> None:
        rng, rate = self.random, self.cluster.config.arrival_rate
        for index, agent in enumerate(agents):
            if index:
                await asyncio.sleep(rng.expovariate(rate))
            self._submit_next(agent)
            self._send_turns()

    async def _replay(self, agents: Sequence[int]) -> None:
        """Open loop: every turn of the timed trajectories at its arrival time, in time order."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        turns = sorted(
            (t_s, agent, turn)
            for agent in agents
            for turn, t_s in enumerate(self.trajectories[agent].arrival_s or ())
        )
        for t_s, agent, turn in turns:
            delay = start + t_s - loop.time()
            if delay > 0:
                self._send_turns()
                await asyncio.sleep(delay)
            self._submit(agent, turn)
        self._send_turns()

    def _submit_next(self, agent: int) -> None:
        turn = self._next_turn[agent]
        self._next_turn[agent] = turn + 1
        self._submit(agent, turn)

    def _submit(self, agent: int, turn: int) -> None:
        trajectory = self.trajectories[agent]
        hits = self._hits[agent]
        if hits is None:  # computed once per agent (it sums the trajectory's rounds)
            hits = self._hits[agent] = trajectory.hits()
        hit, append, gen = hits[turn], trajectory.append[turn], trajectory.gen[turn]
        prompt = hit + append
        if self.cluster.config.hit_block_aligned:
            hit = hit // BLOCK_TOKENS * BLOCK_TOKENS
        rid = self._next_rid
        self._next_rid += 1
        self._agent_of[rid] = agent
        self.cluster.metrics.arrive(rid, agent, self.system.now_ns(), prompt, hit, gen)
        self.system.record(self.name, "admit", f"r{rid}")
        self._outbox.append(Turn(rid, prompt, hit, gen))

    def _send_turns(self) -> None:
        if self._outbox:
            self.tell("scheduler", Submit(tuple(self._outbox)))
            self._outbox.clear()

    @handles(TurnDone)
    def on_turn_done(self, msg: TurnDone) -> None:
        for rid in msg.rids:
            agent = self._agent_of.pop(rid)
            self._open[agent] -= 1
            trajectory = self.trajectories[agent]
            if trajectory.arrival_s is None and self._next_turn[agent] < len(trajectory):
                self._submit_next(agent)
            elif self._open[agent] == 0:
                self.remaining -= 1
                if self.remaining == 0:
                    self.finished.set()
        self._send_turns()


# --------------------------------------------------------------------------------------------------- scheduler


class SchedulerActor(Actor):
    """The central request scheduler (§6): global queues, engine loads as the engines report them on every
    fetch (here kept in step with assignments and completions), and the :class:`Policy` of the system."""

    def __init__(self, system: ActorSystem, cluster: Cluster) -> None:
        super().__init__(system, "scheduler")
        self.cluster = cluster
        self.policy = cluster.policy
        gpus, topo = cluster.config.node.gpus, cluster.topology
        self.pe_engines = {n.index: [Engine(n.index * gpus + g, n.index) for g in range(gpus)] for n in topo.pe_nodes}
        pe_groups: dict[str, list[Engine]] = {}
        for node, engines in self.pe_engines.items():
            pe_groups.setdefault(cluster.group_name("pe", node), []).extend(engines)
        self.prefill = PrefillDispatch(self.policy, pe_groups)
        self.de_engines = {
            n.index: [Engine(n.index * gpus + g, n.index, free_hbm_bytes=cluster.derived.de_hbm_kv_bytes)
                      for g in range(gpus)]
            for n in topo.de_nodes
        }  # fmt: skip
        self.read_q: dict[int, int] = {n.index: 0 for n in topo.nodes}
        self.decode_queue: deque[Request] = deque()
        self.private: dict[int, deque[Request]] = {n: deque() for n in self.de_engines}
        self.group_loads: dict[int, int] = {n: 0 for n in self.de_engines}
        self.requests: dict[int, Request] = {}
        self.pe_of: dict[int, int] = {}
        self.de_of: dict[int, int] = {}
        self._notified: set[str] = set()
        self._gpus = gpus
        self._kv = cluster.derived.kv_bytes_per_token

    def _notify_decode(self) -> None:
        """Tell every decode group with a non-empty private queue."""
        for node, queue in self.private.items():
            if queue:
                self._notify_group(self.cluster.group_name("de", node))

    def _notify_group(self, name: str) -> None:
        if name not in self._notified:
            self._notified.add(name)
            self.tell(name, WorkPending())

    @handles(Submit)
    def on_submit(self, msg: Submit) -> None:
        capacity = self.cluster.derived.de_hbm_kv_bytes
        requests = []
        for turn in msg.turns:
            hbm = (turn.prompt + turn.gen) * self._kv
            request = Request(turn.rid, turn.prompt, turn.prompt - turn.hit, turn.hit, turn.gen, hbm)
            if hbm > capacity:
                raise ValueError(f"request {turn.rid} needs {hbm} B of DE HBM, more than a DE GPU has for KV")
            self.requests[turn.rid] = request
            requests.append(request)
        self._notify_group(self.prefill.submit(requests))

    @handles(Fetch)
    def on_fetch(self, msg: Fetch) -> None:
        sender = self.envelope.sender if self.envelope is not None else ""
        self._notified.discard(sender)
        again = False
        if any(node in self.pe_engines for node in msg.nodes):
            self._fetch_prefill()  # over every PE: what is left waits until a PE finishes (PrefillDone)
        for node in msg.nodes:
            if node not in self.pe_engines:
                assigned, more = self._fetch_decode(node)
                again = again or bool(assigned and more)
        if again:
            self._notify_group(sender)

    def _fetch_prefill(self) -> None:
        assigned = self.prefill.fetch(self.read_q)
        now = self.system.now_ns()
        for a in assigned:
            self.pe_of[a.request.id] = a.engine
            self.decode_queue.append(a.request)
            self.cluster.metrics.scheduled_pe(a.request.id, now)
        if assigned:
            self.policy.route_decode(self.decode_queue, self.private, self.group_loads)
            self._notify_decode()

    def _fetch_decode(self, node: int) -> tuple[int, bool]:
        assigned = self.policy.assign_decode(
            self.decode_queue, self.private, self.group_loads, node, self.de_engines[node]
        )
        gpus, oracle, now = self._gpus, self.cluster.system.oracle, self.system.now_ns()
        prefill: dict[str, list[PrefillTask]] = {}
        expect: list[DecodeTask] = []
        for a in assigned:
            r = a.request
            pe = self.pe_of[r.id]
            pe_node, pe_gpu, de_gpu = pe // gpus, pe % gpus, a.engine % gpus
            self.de_of[r.id] = a.engine
            read_on_de = False
            if not oracle and r.hit_tokens > 0:
                read_on_de = self.policy.read_side(r, pe_node, node, self.read_q) == "de"
            self.cluster.metrics.scheduled_de(r.id, now, pe, a.engine, read_on_de)
            self.system.record(self.name, "assign", f"r{r.id} pe{pe} de{a.engine} {'de' if read_on_de else 'pe'}")
            prefill.setdefault(self.cluster.group_name("pe", pe_node), []).append(
                PrefillTask(r.id, r.prompt_tokens, r.hit_tokens, r.gen_tokens, pe_node, pe_gpu, node, de_gpu, read_on_de)
            )
            expect.append(DecodeTask(r.id, r.prompt_tokens, r.hit_tokens, r.gen_tokens, node, de_gpu, pe_node, read_on_de))
        for group, tasks in prefill.items():
            self.tell(group, Prefill(tuple(tasks)))
        if expect:
            self.tell(self.cluster.group_name("de", node), Expect(tuple(expect)))
        return len(assigned), bool(self.private[node])

    @handles(ReadDone)
    def on_read_done(self, msg: ReadDone) -> None:
        self.read_q[msg.node] -= msg.tokens

    @handles(PrefillDone)
    def on_prefill_done(self, msg: PrefillDone) -> None:
        wake = None
        for rid in msg.rids:
            wake = self.prefill.done(self.requests[rid], self.pe_of.pop(rid)) or wake
        if wake is not None:
            self._notify_group(wake)

    @handles(DecodeDone)
    def on_decode_done(self, msg: DecodeDone) -> None:
        gpus, nodes = self._gpus, set()
        for rid in msg.rids:
            request = self.requests.pop(rid)
            de = self.de_of.pop(rid)
            node = de // gpus
            engine = self.de_engines[node][de % gpus]
            tokens = self.policy.decode_tokens(request)
            engine.tok -= tokens
            engine.seq -= 1
            engine.free_hbm_bytes += request.hbm_bytes
            self.group_loads[node] -= tokens
            nodes.add(node)
        for node in sorted(nodes):
            if self.private[node]:
                self._notify_group(self.cluster.group_name("de", node))


class _GroupActor(Actor):
    """An engine group's leader: pulls work from the scheduler at most once per fetch period (§6.1)."""

    def __init__(self, system: ActorSystem, name: str, cluster: Cluster, nodes: Sequence[int]) -> None:
        super().__init__(system, name)
        self.cluster = cluster
        self.nodes = list(nodes)
        self._fetch_due = False
        self._last_fetch_ns = -(10**18)
        self._period_ns = round(cluster.config.fetch_period_s * NS)

    @handles(WorkPending)
    def on_work_pending(self, msg: WorkPending) -> None:
        if self._fetch_due:
            return
        self._fetch_due = True
        wait_ns = self._last_fetch_ns + self._period_ns - self.system.now_ns()
        if wait_ns > 0:
            self.system.loop.call_later(wait_ns / NS, self._fetch)
        else:
            self._fetch()

    def _fetch(self) -> None:
        self._fetch_due = False
        self._last_fetch_ns = self.system.now_ns()
        self.tell("scheduler", Fetch(tuple(self.nodes)))


# --------------------------------------------------------------------------------------------------- prefill


@dataclass
class _PrefillItem:
    rid: int
    hit: int
    new: int
    done_new: int = 0
    pe_ready: bool = False
    """The hit KV is where the PE reads it (PE buffer, or nothing to read)."""
    de_ready: bool = False
    """The DE side is ready: its buffer is allocated (and, DE-read, the hit KV is in it)."""
    buffered: int = 0
    """Bytes of the PE buffer this request holds."""
    de_node: int = 0
    de_gpu: int = 0
    read_on_de: bool = False
    in_hbm: bool = False
    """Non-layerwise: the request's hit KV is in this GPU's HBM (copied before its first chunk)."""

    @property
    def ready(self) -> bool:
        return self.pe_ready and self.de_ready

    @property
    def cached(self) -> int:
        return self.hit + self.done_new

    @property
    def remaining(self) -> int:
        return self.new - self.done_new


def _inter_node_a2a_bytes(model: ModelSpec, nodes: int) -> float:
    """MoE dispatch + combine bytes per token per layer (averaged over all layers) that cross the compute
    network, for an EP group spread over ``nodes`` nodes.

    As DeepEP does, a token goes once to each *remote node* that hosts one of its ``k`` experts and is spread
    within the node over NVLink (which no port models); the combine comes back the same way. With experts
    evenly over the nodes, a token reaches on average ``(nodes - 1) × (1 - (1 - 1/nodes)^k)`` remote nodes
    [derived]. One node: no network traffic at all."""
    k = model.activated_experts
    if nodes <= 1 or k == 0:
        return 0.0
    per_expert = (model.a2a_dispatch_bytes_per_token_layer + model.a2a_combine_bytes_per_token_layer) / k
    remote_nodes = (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** k)
    return per_expert * remote_nodes * model.moe_layers / model.layers


class PrefillGroup(_GroupActor):
    """The PEs of one EP group (one or more nodes; one PE per GPU, DP attention, §6.4)."""

    def __init__(self, system: ActorSystem, cluster: Cluster, nodes: Sequence[int]) -> None:
        super().__init__(system, f"pe{nodes[0]}", cluster, nodes)
        gpus = cluster.config.node.gpus
        self.gpus = [(n, g) for n in nodes for g in range(gpus)]
        self.queues: dict[tuple[int, int], list[_PrefillItem]] = {key: [] for key in self.gpus}
        self.items: dict[int, tuple[tuple[int, int], _PrefillItem]] = {}
        self._work = asyncio.Event()
        self._loop_started = False
        d = cluster.derived
        self._kv = d.kv_bytes_per_token
        self._a2a = _inter_node_a2a_bytes(d.model, len(nodes))
        buffer = cluster.config.dram_buffer_bytes
        self.buffers = {n: Pool(self, f"n{n}.buffer", buffer) for n in nodes}

    def _ensure_loop(self) -> None:
        if not self._loop_started:
            self._loop_started = True
            self.system.spawn(self, self._forward_loop(), "forward")

    @handles(Prefill)
    def on_prefill(self, msg: Prefill) -> None:
        self._ensure_loop()
        for task in msg.tasks:
            self._add(task)

    def _add(self, msg: PrefillTask) -> None:
        new = msg.prompt - msg.hit
        item = _PrefillItem(msg.rid, msg.hit, new, de_node=msg.de_node, de_gpu=msg.de_gpu, read_on_de=msg.read_on_de)
        key = (msg.pe_node, msg.pe_gpu)
        self.queues[key].append(item)
        self.items[msg.rid] = (key, item)
        if self.cluster.system.oracle:
            item.de_ready = True
            self._pe_ready(item)
        elif msg.hit == 0 or msg.read_on_de:
            self._pe_ready(item)
        else:
            item.buffered = msg.hit * self._kv
            self.buffers[msg.pe_node].acquire(msg.rid, item.buffered, lambda: self._read(msg.pe_node, item))

    def _read(self, node: int, item: _PrefillItem) -> None:
        """PE-read (§4, Fig. 4a steps 1-2): the hit KV, storage → PE SNIC → PE DRAM buffer."""
        metrics = self.cluster.metrics
        metrics.read_start(item.rid, self.system.now_ns())
        done = self.cluster.plane.io(node, "read", KV_LANE, item.hit * self._kv)

        def finished() -> None:
            metrics.read_done(item.rid, self.system.now_ns())
            self.system.record(self.name, "read", f"r{item.rid} n{node}")
            self.tell("scheduler", ReadDone(node, item.hit))
            self._pe_ready(item)

        _then(self, done, finished)

    def _pe_ready(self, item: _PrefillItem) -> None:
        item.pe_ready = True
        if item.ready:
            self._work.set()

    @handles(HitReady)
    def on_hit_ready(self, msg: HitReady) -> None:
        item = self.items[msg.rid][1]
        item.de_ready = True
        if item.ready:
            self._work.set()

    # --- batching (§6.4) -----------------------------------------------------------------------------

    def _batch(self, key: tuple[int, int]) -> list[tuple[_PrefillItem, int]]:
        """FIFO packing of ready requests while the attention time stays within the quota; the
        request that would exceed it is chunked to what fits (binary search on its new tokens). Attention
        FLOPs and bytes add up over a batch, so each candidate costs one roofline evaluation."""
        quota = self.cluster.derived.layer_attention_quota_s
        roofline = self.cluster.derived.prefill
        layerwise = self.cluster.system.layerwise or self.cluster.system.oracle
        hbm_left = self.cluster.derived.pe_hbm_kv_bytes
        batch: list[tuple[_PrefillItem, int]] = []
        flops = hbm = 0.0
        for item in self.queues[key]:
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

    async def _forward_loop(self) -> None:
        # After a pass the group pulls before it batches again: the pass's PrefillDone frees its PEs' load
        # (tok_e ≤ β again), the scheduler answers the group's fetch and the decode fetch that follows (each
        # at most one fetch period later) with new requests, and only then is the next batch formed. Without
        # this wait the next pass starts at the same instant with only the GPUs that still had queued work,
        # and the refilled ones sit out a whole pass: measured on DS 660B 2P4D (Oracle, 32K, 2,048 agents),
        # 7.6 of 16 GPUs busy per pass on average and a 24% longer JCT at 1,024 agents, against the
        # balanced passes the paper measures (Fig. 13 right).
        pull_wait_s = 2 * self.cluster.config.fetch_period_s + 1e-6
        while True:
            batches = {key: self._batch(key) for key in self.gpus}
            if not any(batches.values()):
                self._work.clear()
                await self._work.wait()
                continue
            await self._forward(batches)
            await asyncio.sleep(pull_wait_s)

    async def _forward(self, batches: dict[tuple[int, int], list[tuple[_PrefillItem, int]]]) -> None:
        cluster = self.cluster
        system, d, topo, metrics = cluster.system, cluster.derived, cluster.topology, cluster.metrics
        plane = cluster.plane
        now = self.system.now_ns()
        stages = d.stages
        layers = d.model.layers
        # Compute times per GPU; the DP barrier makes every layer as slow as the slowest GPU's attention.
        ffn_s = 0.0
        ranks: list[tuple[_Hop | None, int, _Hop | None]] = []
        collectives: list[_Hop] = []
        post: list[tuple[int, int, _PrefillItem, int]] = []
        pre: list[asyncio.Future[Completion]] = []
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
                metrics.prefill_start(item.rid, now)
                miss_bytes = chunk * self._kv
                if system.oracle:
                    ranks.append((None, attn_ns, None))
                    continue
                if system.layerwise:
                    load = None
                    if item.done_new == 0 and item.hit > 0:  # the hit KV streams in with the first chunk
                        path = (topo.buffer_to_gpu(item.de_node, item.de_gpu, node, gpu) if item.read_on_de
                                else topo.h2d(node, gpu))  # fmt: skip
                        load = (path, KV_LANE, item.hit * self._kv // stages)
                    # The DE needs the full KV (PE-read) or the miss only (DE-read, it holds the hit).
                    sent = miss_bytes + (item.hit * self._kv if not item.read_on_de and item.done_new == 0 else 0)
                    store = (topo.gpu_to_buffer(node, gpu, item.de_node, item.de_gpu), KV_LANE, sent // stages)
                    ranks.append((load, attn_ns, store))
                else:
                    ranks.append((None, attn_ns, None))
                    if not item.in_hbm and item.hit > 0:
                        item.in_hbm = True
                        pre.append(plane.transfer(topo.h2d(node, gpu), KV_LANE, item.hit * self._kv))
                    last = item.done_new + chunk == item.new
                    if last:  # the whole prompt KV goes to the DE buffer after the pass
                        post.append((node, gpu, item, (item.hit + item.new) * self._kv))
            if self._a2a:  # model traffic: Oracle has it too. To the same GPU of the next node of the group.
                peer_node = self.nodes[(self.nodes.index(node) + 1) % len(self.nodes)]
                peer_gpu = gpu
                collectives.append((topo.gpu_to_gpu(node, gpu, peer_node, peer_gpu), MODEL_LANE,
                                    int(self._a2a * tokens * layers / stages)))  # fmt: skip
        metrics.forward(now, attention_s)
        if pre:
            await asyncio.gather(*pre)
        ffn_ns = round(ffn_s * layers / stages * NS)
        started = self.system.now_ns()
        await plane.forward(stages, ranks, ffn_ns=ffn_ns, collectives=collectives)
        gpus = cluster.config.node.gpus  # the GPUs with work in this pass were busy for it (gpu_util)
        metrics.prefill_pass(started, self.system.now_ns(), [(n * gpus + g, b) for (n, g), b in batches.items() if b])
        sends: list[asyncio.Future[Completion]] = []
        for node, gpu, item, size in post:
            sends.append(plane.transfer(topo.gpu_to_buffer(node, gpu, item.de_node, item.de_gpu), KV_LANE, size))
        if sends:
            await asyncio.gather(*sends)
        end = self.system.now_ns()
        finished: list[int] = []
        kv_ready: dict[str, list[int]] = {}
        for (node, gpu), batch in batches.items():
            queue = self.queues[(node, gpu)]
            for item, chunk in batch:
                if item.buffered:  # the hit KV is in HBM now: the PE buffer is free again
                    self.buffers[node].release(item.rid, item.buffered)
                    item.buffered = 0
                item.done_new += chunk
                if item.done_new == item.new:
                    queue.remove(item)
                    del self.items[item.rid]
                    metrics.first_token(item.rid, end)
                    self.system.record(self.name, "prefilled", f"r{item.rid}")
                    kv_ready.setdefault(cluster.group_name("de", item.de_node), []).append(item.rid)
                    finished.append(item.rid)
        for group, rids in kv_ready.items():
            self.tell(group, KvReady(tuple(rids)))
        if finished:
            self.tell("scheduler", PrefillDone(tuple(finished)))


# --------------------------------------------------------------------------------------------------- decode


@dataclass(eq=False)
class _DecodeRequest:
    rid: int
    prompt: int
    gen: int
    gpu: int
    stored_blocks: int
    """Full Blocks of this request's KV in storage (the hit's at first)."""
    produced: int = 1
    """Tokens out when it joins its GPU's batch: the first came from the prefill."""
    offset: int = 0
    """In a batch, it has produced ``offset`` + its GPU's step count tokens (it leaves the batch at ``gen``)."""
    seq: int = 0
    """Its place in its GPU's join order (requests that finish together end in this order)."""


@dataclass
class _DecodeGpu:
    """One DE GPU's continuous batch, stepped in segments (see the module docstring).

    A segment's steps are applied to the batch as a whole: every request's output count follows from
    ``steps`` (this GPU's steps so far) and its own ``offset``, so that accounting for a segment costs
    O(log n) per request that finishes or completes a Full Block, not O(n) for the whole batch."""

    node: int
    gpu: int
    batch: dict[int, _DecodeRequest] = field(default_factory=dict)
    """The requests decoding here, by join order."""
    steps: int = 0
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
    segment_start_ns: int = 0
    step_ns: int = 0
    timer: asyncio.TimerHandle | None = None
    busy_since_ns: int = -1
    """Start of the current segment with a non-empty batch (reported as busy time when it ends), or -1."""
    busy_batch: int = 0


class DecodeGroup(_GroupActor):
    """The DEs of one node (one per GPU): continuous batching, the DE buffer, H2D before decode, and the
    persistence of every completed Full Block (§4)."""

    def __init__(self, system: ActorSystem, cluster: Cluster, node: int) -> None:
        super().__init__(system, f"de{node}", cluster, [node])
        self.node = node
        gpus = cluster.config.node.gpus
        self.gpus = [_DecodeGpu(node, g) for g in range(gpus)]
        self.expected: dict[int, DecodeTask] = {}
        self._done: list[int] = []
        """Requests finished at this instant, reported together by :meth:`_report_done`."""
        self._kv = cluster.derived.kv_bytes_per_token
        self.buffer = Pool(self, f"n{node}.buffer", cluster.config.dram_buffer_bytes)
        hbm = cluster.derived.de_hbm_kv_bytes
        self.hbm = [Pool(self, f"n{node}.gpu{g}.hbm", hbm) for g in range(gpus)]
        # The decode EP group: decode_ep_nodes consecutive decode nodes; its MoE all-to-all crosses the
        # network to the next node of the group (model traffic, high lane).
        ep = cluster.config.decode_ep_nodes
        de_nodes = [n.index for n in cluster.topology.de_nodes]
        first = de_nodes[(de_nodes.index(node) // ep) * ep]
        group = de_nodes[de_nodes.index(first) : de_nodes.index(first) + ep]
        self._a2a_peer = group[(group.index(node) + 1) % len(group)]
        self._a2a = _inter_node_a2a_bytes(cluster.derived.model, len(group)) * cluster.derived.model.layers
        """MoE all-to-all bytes per decoded token (all layers) that cross the network."""

    @handles(Expect)
    def on_expect(self, msg: Expect) -> None:
        for task in msg.tasks:
            self._expect(task)

    def _expect(self, msg: DecodeTask) -> None:
        self.expected[msg.rid] = msg
        if self.cluster.system.oracle:
            return
        # The DE buffer holds the whole prompt KV until it goes to HBM (§4): hit (read here or sent by the
        # PE) and miss (sent by the PE layer by layer).
        self.buffer.acquire(msg.rid, msg.prompt * self._kv, lambda: self._buffer_ready(msg))

    def _buffer_ready(self, msg: DecodeTask) -> None:
        if msg.read_on_de:
            self._read(msg)
        else:
            self.tell(self.cluster.group_name("pe", msg.pe_node), HitReady(msg.rid))

    def _read(self, msg: DecodeTask) -> None:
        """DE-read (§4, Fig. 4b steps 1-2): the hit KV, storage → DE SNIC → DE DRAM buffer; then the PE
        streams it layer by layer from there."""
        metrics = self.cluster.metrics
        metrics.read_start(msg.rid, self.system.now_ns())
        done = self.cluster.plane.io(self.node, "read", KV_LANE, msg.hit * self._kv)

        def finished() -> None:
            metrics.read_done(msg.rid, self.system.now_ns())
            self.system.record(self.name, "read", f"r{msg.rid} n{self.node}")
            self.tell("scheduler", ReadDone(self.node, msg.hit))
            self.tell(self.cluster.group_name("pe", msg.pe_node), HitReady(msg.rid))

        _then(self, done, finished)

    @handles(KvReady)
    def on_kv_ready(self, msg: KvReady) -> None:
        for rid in msg.rids:
            task = self.expected.pop(rid)
            request = _DecodeRequest(rid, task.prompt, task.gen, task.de_gpu, task.hit // BLOCK_TOKENS)
            # HBM for the whole sequence (prompt + output), held until the request ends; the scheduler only
            # assigns requests that fit (§6.2), so this never waits.
            self.hbm[task.de_gpu].acquire(rid, (task.prompt + task.gen) * self._kv, partial(self._h2d, request))
        self._report_done()

    def _h2d(self, request: _DecodeRequest) -> None:
        if self.cluster.system.oracle:
            self._join(request)
            return
        # The prompt KV: DE buffer → HBM (one H2D, §4); then the buffer is free.
        size = request.prompt * self._kv
        done = self.cluster.plane.transfer(self.cluster.topology.h2d(self.node, request.gpu), KV_LANE, size)

        def copied() -> None:
            self.buffer.release(request.rid, size)
            self._join(request)
            self._report_done()

        _then(self, done, copied)

    def _join(self, request: _DecodeRequest) -> None:
        if request.produced >= request.gen:  # its one token came from the prefill: no step to take
            full = (request.prompt + request.produced) // BLOCK_TOKENS
            self._persist(request.gpu, full - request.stored_blocks)
            request.stored_blocks = full
            self._finish(request)
            return
        gpu = self.gpus[request.gpu]
        self._account(gpu, self.system.now_ns())
        request.seq, gpu.joined = gpu.joined, gpu.joined + 1
        request.offset = request.produced - gpu.steps
        gpu.batch[request.seq] = request
        gpu.base += request.prompt + request.offset
        heappush(gpu.finishing, (request.gen - request.offset, request.seq, request))
        gpu.fresh.append(request)
        self._next_segment(gpu)

    def _finish(self, request: _DecodeRequest) -> None:
        self.hbm[request.gpu].release(request.rid, (request.prompt + request.gen) * self._kv)
        self.system.record(self.name, "end", f"r{request.rid}")
        self.cluster.metrics.done(request.rid, self.system.now_ns())
        self._done.append(request.rid)

    def _report_done(self) -> None:
        """Tell the scheduler and the client which requests finished (called where requests can finish)."""
        if self._done:
            rids = tuple(self._done)
            self._done.clear()
            self.tell("scheduler", DecodeDone(rids))
            self.tell("client", TurnDone(rids))

    def _next_segment(self, gpu: _DecodeGpu) -> None:
        """Start a segment: the step time of the batch as it is now, and a timer for when its first request
        finishes (a request joining earlier ends the segment sooner)."""
        if gpu.timer is not None:
            gpu.timer.cancel()
            gpu.timer = None
        now = self.system.now_ns()
        if gpu.busy_since_ns >= 0:  # the segment that ends here kept the GPU busy (gpu_util)
            unit = gpu.node * len(self.gpus) + gpu.gpu
            self.cluster.metrics.decode_segment(unit, gpu.busy_since_ns, now, gpu.busy_batch, gpu.step_ns)
        gpu.busy_since_ns, gpu.busy_batch = (now, len(gpu.batch)) if gpu.batch else (-1, 0)
        if not gpu.batch:
            gpu.step_ns = 0
            return
        context = gpu.base + len(gpu.batch) * gpu.steps
        step_s = self.cluster.derived.decode.decode_step(len(gpu.batch), context).total_s
        gpu.step_ns = max(1, round(step_s * NS))
        gpu.segment_start_ns = now
        steps = gpu.finishing[0][0] - gpu.steps
        gpu.timer = self.system.loop.call_later(steps * gpu.step_ns / NS, self._segment_end, gpu)

    def _segment_end(self, gpu: _DecodeGpu) -> None:
        gpu.timer = None
        try:
            self._account(gpu, self.system.now_ns())
            self._next_segment(gpu)
            self._report_done()
        except Exception as error:  # a callback: fail the run rather than lose the error
            self.system.fail(self, error)

    def _account(self, gpu: _DecodeGpu, now: int) -> None:
        """Apply the steps done since the segment started: tokens, second-token times, persisted blocks,
        finished requests."""
        if not gpu.batch or gpu.step_ns == 0:
            return
        steps = (now - gpu.segment_start_ns) // gpu.step_ns
        if steps <= 0:
            return
        metrics, batch = self.cluster.metrics, gpu.batch
        done = gpu.steps = gpu.steps + steps
        tokens = steps * len(batch)
        blocks = 0
        for r in gpu.fresh:
            metrics.second_token(r.rid, gpu.segment_start_ns + gpu.step_ns)
            blocks += self._store_blocks(gpu, r)
        gpu.fresh.clear()
        next_block = gpu.next_block
        while next_block and next_block[0][0] <= done:
            r = heappop(next_block)[2]
            if batch.get(r.seq) is r:
                blocks += self._store_blocks(gpu, r)
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
            self._finish(r)
        gpu.segment_start_ns += steps * gpu.step_ns
        if self._a2a and tokens > 0:
            # The steps' MoE dispatch/combine over the network, charged once per segment (after it, like the
            # block write-backs): it loads the compute NICs the KV traffic shares, the step times stay the
            # roofline's.
            topo = self.cluster.topology
            path = topo.gpu_to_gpu(self.node, gpu.gpu, self._a2a_peer, gpu.gpu)
            self.cluster.plane.transfer_detached(path, MODEL_LANE, int(self._a2a * tokens))
        self._persist(gpu.gpu, blocks)

    def _persist(self, gpu: int, blocks: int) -> None:
        """Write back completed Full Blocks: HBM → DRAM through the CNIC, then DRAM → SNIC → storage (§4),
        charged once per segment, not per block."""
        if blocks > 0 and not self.cluster.system.oracle:
            size = blocks * BLOCK_TOKENS * self._kv
            plane = self.cluster.plane
            plane.transfer_detached(self.cluster.topology.d2h(self.node, gpu), KV_LANE, size)
            plane.io_detached(self.node, "write", KV_LANE, size)

    @staticmethod
    def _store_blocks(gpu: _DecodeGpu, r: _DecodeRequest) -> int:
        """The Full Blocks ``r`` has completed since they were last counted; schedule its next one."""
        produced = min(r.gen, r.offset + gpu.steps)
        full = (r.prompt + produced) // BLOCK_TOKENS
        blocks = full - r.stored_blocks
        r.stored_blocks = full
        if produced < r.gen:
            heappush(gpu.next_block, ((full + 1) * BLOCK_TOKENS - r.prompt - r.offset, r.seq, r))
        return blocks
