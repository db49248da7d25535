"""A Hypothesis state machine for a policy alone (no cluster, no core): requests arrive, engine groups fetch, prefills
and decodes finish and read queues drain in any order, as the scheduler would see them; every answer the policy gives
is checked with :mod:`~dualpath_emu.testing.invariants`. Subclass it for your policy::

    class TestMyPolicy(PolicyMachine):
        def make_policy(self, alpha_tokens: int, beta_tokens: int) -> Policy:
            return MyPolicy(alpha_tokens=alpha_tokens, beta_tokens=beta_tokens)

    TestMyPolicyMachine = TestMyPolicy.TestCase"""

from __future__ import annotations

from collections import deque

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dualpath_emu.cluster.policies import (
    DecodeView, EngineState, GroupState, Health, Policy, PrefillView, ReadView, Request, RouteView, Split,
)  # fmt: skip
from dualpath_emu.testing.invariants import check_decode_call, check_prefill_call, check_read_call, check_route_call
from dualpath_emu.testing.strategies import KV_BYTES_PER_TOKEN

__all__ = ["PolicyMachine"]

PE_NODES, DE_NODES, GPUS = (0, 1), (2, 3), 2
HBM = 4_000_000  # per DE: a few requests of the machine's sizes, so HBM runs out


class PolicyMachine(RuleBasedStateMachine):
    """Scheduler bookkeeping around one policy: two prefill nodes and two decode nodes of :data:`GPUS` engines each
    (engine id = node × 10 + GPU), storage NICs that go down and come back."""

    dual_path = True

    def make_policy(self, alpha_tokens: int, beta_tokens: int) -> Policy:
        """The policy under test (fresh for each run of the machine)."""
        raise NotImplementedError("subclass PolicyMachine and return your policy from make_policy")

    @initialize(alpha=st.integers(0, 30_000), beta=st.integers(1, 30_000))
    def setup(self, alpha: int, beta: int) -> None:
        self.policy = self.make_policy(alpha, beta)
        self.pe = {n * 10 + g: EngineState(n * 10 + g, n) for n in PE_NODES for g in range(GPUS)}
        self.de = {n * 10 + g: EngineState(n * 10 + g, n, free_hbm_bytes=HBM) for n in DE_NODES for g in range(GPUS)}
        self.read_q = {n: 0 for n in PE_NODES + DE_NODES}
        self.factors: dict[str, float] = {}
        self.queue: deque[Request] = deque()
        self.decode_queue: deque[Request] = deque()
        self.private: dict[int, deque[Request]] = {n: deque() for n in DE_NODES}
        self.loads = {n: 0 for n in DE_NODES}
        self.given: dict[int, int] = {}
        self.stamp = 0
        self.next_id = 0
        self.pe_of: dict[int, int] = {}
        self.prefilling: list[Request] = []
        self.decoding: list[tuple[int, Request]] = []

    @property
    def health(self) -> Health:
        return Health(self.factors)

    def _set(self, table: dict[int, EngineState], engine: int, tokens: int, requests: int, hbm: int = 0,
             given: int | None = None) -> None:  # fmt: skip
        e = table[engine]
        table[engine] = EngineState(e.id, e.node, e.tok + tokens, e.seq + requests, e.free_hbm_bytes - hbm,
                                    e.given if given is None else given)  # fmt: skip

    @rule(new=st.integers(1, 20_000), hit=st.integers(0, 20_000), gen=st.integers(1, 500))
    def arrive(self, new: int, hit: int, gen: int) -> None:
        """A request joins the global queue (one a rule: a failure shrinks to the requests it needs)."""
        rid = self.next_id
        self.next_id += 1
        self.queue.append(Request(rid, new + hit, new, hit, gen, (new + hit + gen) * KV_BYTES_PER_TOKEN, rid))

    @rule(count=st.integers(2, 6), new=st.integers(1, 20_000), hit=st.integers(0, 20_000), gen=st.integers(1, 500))
    def burst(self, count: int, new: int, hit: int, gen: int) -> None:
        """``count`` requests of one size join the queue at once (what loads a fetch with several)."""
        for _ in range(count):
            self.arrive(new, hit, gen)

    @rule()
    def prefill_fetch(self) -> None:
        view = PrefillView(tuple(self.queue), tuple(self.pe.values()), dict(self.read_q), self.health, self.stamp)
        assigned = check_prefill_call(self.policy, view, self.policy.assign_prefill(view))
        taken = {a.request.id for a in assigned}
        self.queue = deque(r for r in self.queue if r.id not in taken)
        for a in assigned:
            self.stamp += 1
            self._set(self.pe, a.engine, self.policy.prefill_tokens(a.request), 1, given=self.stamp)
            self.pe_of[a.request.id] = a.engine
            self.prefilling.append(a.request)
            self.decode_queue.append(a.request)
        self._route()

    def _route(self) -> None:
        groups = tuple(GroupState(n, load, self.given.get(n, 0)) for n, load in self.loads.items())
        view = RouteView(tuple(self.decode_queue), groups, self.health, self.stamp)
        routes = check_route_call(self.policy, view, self.policy.route_decode(view))
        taken = {r.request.id for r in routes}
        self.decode_queue = deque(r for r in self.decode_queue if r.id not in taken)
        for route in routes:
            self.private[route.group].append(route.request)
            self.loads[route.group] += self.policy.decode_tokens(route.request)
            self.stamp += 1
            self.given[route.group] = self.stamp

    @rule(node=st.sampled_from(DE_NODES))
    def decode_fetch(self, node: int) -> None:
        self._route()
        engines = tuple(e for e in self.de.values() if e.node == node)
        view = DecodeView(node, tuple(self.private[node]), engines, self.health)
        assigned = check_decode_call(self.policy, view, self.policy.assign_decode(view))
        taken = {a.request.id for a in assigned}
        self.private[node] = deque(r for r in self.private[node] if r.id not in taken)
        for a in assigned:
            r = a.request
            self._set(self.de, a.engine, self.policy.decode_tokens(r), 1, r.hbm_bytes)
            self.decoding.append((a.engine, r))
            if r.hit_tokens:
                pe_node = self.pe_of[r.id] // 10
                read = ReadView(r, pe_node, node, dict(self.read_q), self.health)
                side = self.policy.read_side(read)
                check_read_call(self.policy, read, side, self.dual_path)
                if isinstance(side, Split):
                    self.read_q[node] += side.de_tokens
                    self.read_q[pe_node] += r.hit_tokens - side.de_tokens
                else:
                    self.read_q[node if side == "de" else pe_node] += r.hit_tokens

    @precondition(lambda self: bool(self.prefilling))
    @rule(index=st.integers(0, 1_000))
    def prefill_done(self, index: int) -> None:
        request = self.prefilling.pop(index % len(self.prefilling))
        self._set(self.pe, self.pe_of[request.id], -self.policy.prefill_tokens(request), -1)

    @precondition(lambda self: bool(self.decoding))
    @rule(index=st.integers(0, 1_000))
    def decode_done(self, index: int) -> None:
        engine, request = self.decoding.pop(index % len(self.decoding))
        tokens = self.policy.decode_tokens(request)
        self._set(self.de, engine, -tokens, -1, -request.hbm_bytes)
        self.loads[engine // 10] -= tokens

    @rule(node=st.sampled_from(PE_NODES + DE_NODES), drained=st.integers(0, 50_000))
    def reads_progress(self, node: int, drained: int) -> None:
        self.read_q[node] = max(0, self.read_q[node] - drained)

    @rule(node=st.sampled_from(PE_NODES + DE_NODES), factor=st.sampled_from([0.0, 0.5, 1.0]))
    def storage_nic(self, node: int, factor: float) -> None:
        if factor == 1.0:
            self.factors.pop(f"n{node}.snic.rx", None)
        else:
            self.factors[f"n{node}.snic.rx"] = factor

    @invariant()
    def hbm_never_negative(self) -> None:
        if hasattr(self, "de"):
            assert all(e.free_hbm_bytes >= 0 for e in self.de.values()), "a DE's free HBM went below zero"
