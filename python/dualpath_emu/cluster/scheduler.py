"""The central request scheduler (§6): the engine that keeps the global queues and the engines' loads, and
runs the system's policy (:mod:`~dualpath_emu.cluster.policies`) when an engine group fetches work.

The policies' names are re-exported here, where code written against earlier versions imports them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.engines import ClusterEngine
from dualpath_emu.cluster.messages import (
    DecodeDone,
    DecodeTask,
    Expect,
    Fetch,
    Health,
    Prefill,
    PrefillDone,
    PrefillTask,
    ReadDone,
    ReadMoved,
    Submit,
)
from dualpath_emu.cluster.observations import Assigned
from dualpath_emu.cluster.policies import (
    DE_HIGH_TOKEN_FACTOR,
    DecodeAssignment,
    DualPathPolicy,
    Engine,
    GroupLoads,
    Policy,
    PrefillAssignment,
    PrefillDispatch,
    ReadSide,
    Request,
    RoundRobinPolicy,
    check_assignments,
)
from dualpath_emu.runtime.engine import DataPlane, Outbox, on

__all__ = [
    "DE_HIGH_TOKEN_FACTOR", "DecodeAssignment", "DualPathPolicy", "Engine", "Policy", "PrefillAssignment",
    "PrefillDispatch", "ReadSide", "Request", "RoundRobinPolicy", "Scheduler",
]  # fmt: skip

@dataclass(slots=True)
class _Pull:
    """A group's standing fetch (:class:`Fetch`) and when it was last served."""

    nodes: tuple[int, ...]
    period_ns: int
    prefill: bool
    """Whether the group hosts PEs (a fetch then runs Algorithm 1 over every PE)."""
    last_ns: int = -(10**18)
    timer: bool = False
    """Set while the next serving waits for the period to pass."""


class Scheduler(ClusterEngine):
    """The central request scheduler (§6): global queues, engine loads as the engines report them on every
    fetch (here kept in step with assignments and completions), and the :class:`Policy` of the system."""

    def __init__(self, cluster: Cluster, out: Outbox, plane: DataPlane) -> None:
        super().__init__("scheduler", cluster, out, plane)
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
        self.group_loads = GroupLoads({n: 0 for n in self.de_engines})
        self.requests: dict[int, Request] = {}
        self.pe_of: dict[int, int] = {}
        self.de_of: dict[int, int] = {}
        self._pulls: dict[str, _Pull] = {}
        self._wanted: set[str] = set()
        """Groups with work waiting whose standing fetch has not come yet (real time: it races the work)."""
        self._decoded: set[int] = set()
        """Requests whose DecodeDone came before their PrefillDone (real time only)."""
        self._gpus = gpus
        self._kv = cluster.derived.kv_bytes_per_token
        # The groups' names by node, looked up at every message to a group and every decode notification.
        self._pe_group = {node: cluster.group_name("pe", node) for node in self.pe_engines}
        self._de_group = {node: cluster.group_name("de", node) for node in self.de_engines}
        self._check_policy = not isinstance(cluster.system.scheduler, str)
        """A user's policy: what it returns is checked (the built-in ones' is tested)."""

    def waiting(self) -> tuple[int, int]:
        """Requests waiting for a PE, and for a DE (the global decode queue and every group's private one)."""
        return len(self.prefill.queue), len(self.decode_queue) + sum(len(q) for q in self.private.values())

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
        requests = []
        for turn in msg.turns:
            hbm = (turn.prompt + turn.gen) * self._kv
            request = Request(turn.rid, turn.prompt, turn.prompt - turn.hit, turn.hit, turn.gen, hbm, turn.context)
            if hbm > capacity:
                raise ValueError(f"request {turn.rid} needs {hbm} B of DE HBM, more than a DE GPU has for KV")
            self.requests[turn.rid] = request
            requests.append(request)
        self._notify_group(now, self.prefill.submit(requests))

    @on(Fetch)
    def on_fetch(self, now: int, msg: Fetch, sender: str) -> None:
        self._pulls[sender] = _Pull(msg.nodes, msg.period_ns, any(node in self.pe_engines for node in msg.nodes))
        if sender in self._wanted:
            self._wanted.discard(sender)
            self._notify_group(now, sender)

    def _serve_later(self, now: int, name: str) -> None:
        self._pulls[name].timer = False
        self._serve(now, name)

    def _serve(self, now: int, name: str) -> None:
        """A fetch of group ``name``: what its leader's pull would get now."""
        pull = self._pulls[name]
        pull.last_ns = now
        again = False
        if pull.prefill:
            self._fetch_prefill(now)  # over every PE: what is left waits until a PE finishes (PrefillDone)
        for node in pull.nodes:
            if node not in self.pe_engines:
                assigned, more = self._fetch_decode(now, node)
                again = again or bool(assigned and more)
        if again:
            self._notify_group(now, name)

    def _fetch_prefill(self, now: int) -> None:
        waiting = {r.id for r in self.prefill.queue} if self._check_policy else None
        assigned = self.prefill.fetch(self.read_q)
        if waiting is not None:
            check_assignments(self.policy, "assign_prefill", assigned, PrefillAssignment, waiting, [self.prefill.queue],
                              {e.id for e in self.prefill.engines})  # fmt: skip
        if not assigned:
            return
        pe_of, queue, scheduled_pe = self.pe_of, self.decode_queue, self.cluster.metrics.scheduled_pe
        for a in assigned:
            request = a.request
            pe_of[request.id] = a.engine
            queue.append(request)
            scheduled_pe(request.id, now)
        self.policy.route_decode(queue, self.private, self.group_loads)
        self._notify_decode(now)

    def _fetch_decode(self, now: int, node: int) -> tuple[int, bool]:
        waiting = {r.id for q in (self.decode_queue, self.private[node]) for r in q} if self._check_policy else None
        assigned = self.policy.assign_decode(
            self.decode_queue, self.private, self.group_loads, node, self.de_engines[node]
        )
        if waiting is not None:
            check_assignments(self.policy, "assign_decode", assigned, DecodeAssignment, waiting,
                              [self.decode_queue, *self.private.values()], {e.id for e in self.de_engines[node]})  # fmt: skip
        if not assigned:
            return 0, bool(self.private[node])
        gpus, oracle = self._gpus, self.cluster.system.oracle
        policy, read_q, pe_of, de_of, pe_group = self.policy, self.read_q, self.pe_of, self.de_of, self._pe_group
        scheduled_de, observe = self.cluster.metrics.scheduled_de, self.out.observe
        prefill: dict[str, list[PrefillTask]] = {}
        expect: list[DecodeTask] = []
        for a in assigned:
            r, de = a.request, a.engine
            rid = r.id
            pe = pe_of[rid]
            pe_node, pe_gpu, de_gpu = pe // gpus, pe % gpus, de % gpus
            de_of[rid] = de
            read_on_de = False
            if not oracle and r.hit_tokens > 0:
                read_on_de = policy.read_side(r, pe_node, node, read_q) == "de"
            scheduled_de(rid, now, pe, de, read_on_de)
            observe(Assigned(rid, pe, de, "de" if read_on_de else "pe"))
            prefill.setdefault(pe_group[pe_node], []).append(
                PrefillTask(rid, r.prompt_tokens, r.hit_tokens, r.gen_tokens, pe_node, pe_gpu, node, de_gpu, read_on_de,
                            r.context)
            )
            expect.append(DecodeTask(rid, r.prompt_tokens, r.hit_tokens, r.gen_tokens, node, de_gpu, pe_node, read_on_de,
                                     r.context))
        for group, tasks in prefill.items():
            self.out.send(group, Prefill(tuple(tasks)))
        self.out.send(self._de_group[node], Expect(tuple(expect)))
        return len(assigned), bool(self.private[node])

    @on(Health)
    def on_health(self, now: int, msg: Health, sender: str) -> None:
        """Faults changed some ports (:mod:`~dualpath_emu.cluster.faults`): the policy sees it from now on."""
        for port, factor in zip(msg.ports, msg.factors):
            self.policy.health.set(port, factor)

    @on(ReadMoved)
    def on_read_moved(self, now: int, msg: ReadMoved, sender: str) -> None:
        """A read moved to the other side (failover): its tokens leave one read queue for the other."""
        self.read_q[msg.from_node] -= msg.tokens
        self.read_q[msg.to_node] += msg.tokens

    @on(ReadDone)
    def on_read_done(self, now: int, msg: ReadDone, sender: str) -> None:
        self.read_q[msg.node] -= msg.tokens

    @on(PrefillDone)
    def on_prefill_done(self, now: int, msg: PrefillDone, sender: str) -> None:
        wake = None
        for rid in msg.rids:
            wake = self.prefill.done(self.requests[rid], self.pe_of.pop(rid)) or wake
            if rid in self._decoded:  # its DecodeDone came first (see on_decode_done)
                self._decoded.discard(rid)
                del self.requests[rid]
        if wake is not None:
            self._notify_group(now, wake)

    @on(DecodeDone)
    def on_decode_done(self, now: int, msg: DecodeDone, sender: str) -> None:
        gpus, nodes = self._gpus, set()
        for rid in msg.rids:
            if rid in self.pe_of:
                # A one-token turn ends as its KV arrives, and in real time the decode group's DecodeDone can
                # overtake the prefill group's PrefillDone: keep the request until that comes too.
                request = self.requests[rid]
                self._decoded.add(rid)
            else:
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
                self._notify_group(now, self._de_group[node])
