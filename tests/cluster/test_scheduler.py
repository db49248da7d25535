"""The scheduling policies (``dualpath_emu.cluster.scheduler``): Algorithm 1, the two-level DE selection and the
read side on hand-made cases; properties of the prefill dispatch over several PE groups (whatever the order in
which groups fetch, the tokens each group is given stay within a bound of each other); and a Hypothesis state
machine of random arrivals, fetches by any group, completions and load reports checking: no PE above β is
given work; prefill assignment keeps FIFO order; when requests are left waiting every PE of every group is
over β (saturation is shared); the chosen read side had the shorter queue; no DE is given a request that does
not fit its free HBM.
"""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dualpath_emu.cluster.policies import DualPathPolicy, Engine, Policy, PrefillDispatch, Request, RoundRobinPolicy


def req(id: int, new: int = 100, hit: int = 1000, gen: int = 10, hbm: int = 1) -> Request:
    return Request(id, new + hit, new, hit, gen, hbm, id)


def test_algorithm_1_prefers_short_read_queues_then_least_loaded() -> None:
    policy = DualPathPolicy(alpha_tokens=500, beta_tokens=1000)
    group = [
        Engine(0, node=0, tok=300),
        Engine(1, node=0, tok=100),
        Engine(2, node=1, tok=0),
        Engine(3, node=1, tok=2000),
    ]
    read_q = {0: 100, 1: 900}  # node 0 is C2 (read_q <= alpha), node 1 is C3
    queue = deque([req(1, new=400), req(2, new=400), req(3, new=400), req(4, new=400)])
    out = policy.assign_prefill(queue, group, read_q)
    # C2 = {0, 1} first, least tok first: 1 (100 -> 500), 0 (300 -> 700), 1 (500 -> 900), then 0 (700 -> 1100).
    assert [(a.request.id, a.engine) for a in out] == [(1, 1), (2, 0), (3, 1), (4, 0)]
    assert not queue
    more = deque([req(5, new=10), req(6, new=10)])
    out = policy.assign_prefill(more, group, read_q)
    # Engine 0 is now overloaded (1100 > β), 1 (900) is still C2; then C3 only if C2 is empty.
    assert [(a.request.id, a.engine) for a in out] == [(5, 1), (6, 1)]


def test_algorithm_1_stops_when_every_pe_is_overloaded() -> None:
    policy = DualPathPolicy(alpha_tokens=0, beta_tokens=50)
    group = [Engine(0, node=0, tok=60), Engine(1, node=0, tok=51)]
    queue = deque([req(1)])
    assert policy.assign_prefill(queue, group, {}) == []
    assert len(queue) == 1


def test_decode_selection_two_levels_and_high_token_threshold() -> None:
    policy = DualPathPolicy()
    private = {0: deque[Request](), 1: deque[Request]()}
    loads = {0: 5000, 1: 1000}
    global_queue = deque([req(1, new=0, hit=900, gen=100, hbm=10), req(2, new=0, hit=900, gen=100, hbm=10)])
    group = [
        Engine(10, node=2, tok=0, seq=3, free_hbm_bytes=100),
        Engine(11, node=2, tok=1000, seq=0, free_hbm_bytes=5),
    ]
    out = policy.assign_decode(global_queue, private, loads, 1, group)
    # Phase 1: both go to group 1 (1000 < 5000, then 2000 < 5000). Phase 2: engine 11 lacks HBM (5 < 10), so
    # engine 10 takes both.
    assert [(a.request.id, a.engine) for a in out] == [(1, 10), (2, 10)]
    assert loads == {0: 5000, 1: 3000}
    assert group[0].free_hbm_bytes == 80 and group[0].seq == 5


def test_decode_prefers_low_token_engines_by_fewest_requests() -> None:
    policy = DualPathPolicy()
    group = [
        Engine(0, node=2, tok=5000, seq=1, free_hbm_bytes=100),
        Engine(1, node=2, tok=0, seq=9, free_hbm_bytes=100),
    ]
    private = {0: deque([req(1, new=0, hit=90, gen=10)])}
    out = policy.assign_decode(deque(), private, {0: 5000}, 0, group)
    # Z = 1.05 * (100 + 5000) / 2 = 2677.5: engine 0 would be high-token (5100 > Z); engine 1 is low.
    assert [a.engine for a in out] == [1]


def test_read_side_is_the_shorter_queue_and_counts_the_read() -> None:
    policy = DualPathPolicy()
    read_q = {0: 500, 2: 100}
    assert policy.read_side(req(1, hit=1000), pe_node=0, de_node=2, read_q=read_q) == "de"
    assert read_q == {0: 500, 2: 1100}
    assert policy.read_side(req(2, hit=10), pe_node=0, de_node=2, read_q=read_q) == "pe"
    assert policy.read_side(req(3, hit=10), pe_node=0, de_node=2, read_q={0: 7, 2: 7}) == "de"  # a tie: DE
    assert RoundRobinPolicy().read_side(req(3), pe_node=0, de_node=2, read_q={0: 9, 2: 0}) == "pe"
    # Round robin with both paths: the sides take turns, whatever the queues.
    rr = RoundRobinPolicy(read_both_sides=True)
    sides = [rr.read_side(req(4 + i), pe_node=0, de_node=2, read_q={0: 0, 2: 9}) for i in range(4)]
    assert sides == ["pe", "de", "pe", "de"]


def test_round_robin_takes_turns_across_groups() -> None:
    groups = {"pe0": [Engine(0, node=0), Engine(1, node=0)], "pe1": [Engine(10, node=1), Engine(11, node=1)]}
    dispatch = PrefillDispatch(RoundRobinPolicy(), groups)
    dispatch.submit([req(i) for i in range(5)])
    assert [x.engine for x in dispatch.fetch({})] == [0, 1, 10, 11, 0]  # whoever fetched
    dispatch.submit([req(5)])
    assert [x.engine for x in dispatch.fetch({})] == [1]


def test_one_fetch_balances_every_group_and_prefers_short_read_queues() -> None:
    # beta is far above what is queued (as in the paper: seconds of compute per GPU), so a fetch over its
    # own group only would have taken all eight requests to the fetching group.
    groups = {"pe0": [Engine(0, node=0), Engine(1, node=0)], "pe1": [Engine(10, node=1), Engine(11, node=1)]}
    dispatch = PrefillDispatch(DualPathPolicy(alpha_tokens=500, beta_tokens=10**9), groups)
    dispatch.submit([req(i, new=100) for i in range(8)])
    assert sorted(dispatch.group_of(a.engine) for a in dispatch.fetch({})) == ["pe0"] * 4 + ["pe1"] * 4
    # Node 1's read queue over alpha: its PEs are C3 and get nothing while node 0's (C2) have room.
    dispatch.submit([req(i, new=100) for i in range(8, 12)])
    assert {a.engine for a in dispatch.fetch({0: 0, 1: 501})} == {0, 1}


def test_a_submit_wakes_one_group_in_turn_and_a_finishing_pe_its_own() -> None:
    groups = {"pe0": [Engine(0, node=0)], "pe8": [Engine(8, node=1)], "pe16": [Engine(16, node=2)]}
    dispatch = PrefillDispatch(DualPathPolicy(alpha_tokens=0, beta_tokens=99), groups)
    assert [dispatch.submit([req(i)]) for i in range(4)] == ["pe0", "pe8", "pe16", "pe0"]
    out = dispatch.fetch({})
    assert len(out) == 3 and len(dispatch.queue) == 1  # 100 > 99: one each, the fourth waits
    assert dispatch.done(out[0].request, out[0].engine) == dispatch.group_of(out[0].engine)
    assert [a.request.id for a in dispatch.fetch({})] == [3]
    assert dispatch.done(out[1].request, out[1].engine) is None  # nothing waits: nobody to wake


def test_ties_go_to_the_engine_or_group_served_least_recently() -> None:
    """An idle cluster: each request finishes before the next arrives, so every PE has tok_e = 0 at each
    arrival. Ties broken by lowest id would send them all to PE 0 (node 0 reads everything)."""
    groups = {"pe0": [Engine(0, node=0), Engine(1, node=0)], "pe1": [Engine(10, node=1), Engine(11, node=1)]}
    dispatch = PrefillDispatch(DualPathPolicy(alpha_tokens=10**9, beta_tokens=10**9), groups)
    chosen = []
    for i in range(8):
        dispatch.submit([req(i)])
        (a,) = dispatch.fetch({})
        chosen.append(a.engine)
        dispatch.done(a.request, a.engine)
    assert chosen == [0, 1, 10, 11, 0, 1, 10, 11]
    # Decode phase 1: equal group loads go to the group routed least recently.
    policy = DualPathPolicy()
    private = {4: deque[Request](), 5: deque[Request]()}
    loads = {4: 0, 5: 0}
    targets = []
    for i in range(4):
        policy.route_decode(deque([req(i)]), private, loads)
        target = 4 if private[4] else 5
        targets.append(target)
        loads[target] -= policy.decode_tokens(private[target].popleft())  # it finished
    assert targets == [4, 5, 4, 5]


GROUP_NAMES = ("pe0", "pe1", "pe2")


@given(
    policy_kind=st.sampled_from(["dualpath", "round_robin"]),
    gpus=st.integers(1, 4),
    groups=st.integers(2, 3),
    batches=st.lists(st.lists(st.integers(1, 3000), min_size=1, max_size=20), min_size=1, max_size=12),
)
def test_tokens_given_to_each_group_stay_within_a_bound_under_saturation(
    policy_kind: str, gpus: int, groups: int, batches: list[list[int]]
) -> None:
    """Requests arrive in batches and a group fetches after each (a fetch carries no group: it assigns over
    every PE); nothing finishes (saturation). The tokens each group was given differ by at most one request
    per PE of a group (DualPath: the least-loaded PE of the whole cluster takes the next request; round
    robin: counts differ by one per PE)."""
    layout = {GROUP_NAMES[g]: [Engine(g * 10 + i, node=g) for i in range(gpus)] for g in range(groups)}
    policy: Policy = (
        DualPathPolicy(alpha_tokens=10**12, beta_tokens=10**12) if policy_kind == "dualpath" else RoundRobinPolicy()
    )
    dispatch = PrefillDispatch(policy, layout)
    given_tokens = dict.fromkeys(layout, 0)
    given_count = dict.fromkeys(layout, 0)
    rid = 0
    biggest = 0
    for sizes in batches:
        dispatch.submit([req(rid + i, new=n) for i, n in enumerate(sizes)])
        rid += len(sizes)
        biggest = max(biggest, *sizes)
        for a in dispatch.fetch({}):
            given_tokens[dispatch.group_of(a.engine)] += a.request.new_tokens
            given_count[dispatch.group_of(a.engine)] += 1
    assert not dispatch.queue
    if policy_kind == "dualpath":
        assert max(given_tokens.values()) - min(given_tokens.values()) <= gpus * biggest
    else:
        assert max(given_count.values()) - min(given_count.values()) <= gpus


def test_round_robin_takes_turns() -> None:
    policy = RoundRobinPolicy()
    group = [Engine(0, node=0), Engine(1, node=0), Engine(2, node=0)]
    out = policy.assign_prefill(deque([req(i) for i in range(5)]), group, {})
    assert [a.engine for a in out] == [0, 1, 2, 0, 1]
    out = policy.assign_prefill(deque([req(5)]), group, {})
    assert [a.engine for a in out] == [2]


# --- the state machine --------------------------------------------------------------------------------

PE_NODES, DE_NODES, GPUS = (0, 1), (2, 3), 2
HBM = 6_000


class SchedulerMachine(RuleBasedStateMachine):
    policy: Policy
    checks_loads = True

    @initialize(alpha=st.integers(0, 3000), beta=st.integers(1, 3000))
    def setup(self, alpha: int, beta: int) -> None:
        self.policy = self.make_policy(alpha, beta)
        self.beta = beta
        self.pe_groups = {n: [Engine(n * 10 + g, node=n) for g in range(GPUS)] for n in PE_NODES}
        self.dispatch = PrefillDispatch(self.policy, {f"pe{n}": self.pe_groups[n] for n in PE_NODES})
        self.de_groups = {n: [Engine(n * 10 + g, node=n, free_hbm_bytes=HBM) for g in range(GPUS)] for n in DE_NODES}
        self.read_q: dict[int, int] = {n: 0 for n in PE_NODES + DE_NODES}
        self.decode_queue: deque[Request] = deque()
        self.private: dict[int, deque[Request]] = {n: deque() for n in DE_NODES}
        self.group_loads = {n: 0 for n in DE_NODES}
        self.next_id = 0
        self.last_prefill_id = -1
        self.pe_of: dict[int, int] = {}
        self.running_pe: list[tuple[int, Request]] = []
        self.running_de: list[tuple[int, Request]] = []

    def make_policy(self, alpha: int, beta: int) -> Policy:
        return DualPathPolicy(alpha_tokens=alpha, beta_tokens=beta)

    @rule(
        requests=st.lists(
            st.tuples(st.integers(1, 2000), st.integers(0, 5000), st.integers(1, 50), st.integers(500, 5000)),
            min_size=1,
            max_size=6,
        )
    )
    def arrive(self, requests: list[tuple[int, int, int, int]]) -> None:
        for new, hit, gen, hbm in requests:
            self.dispatch.submit([Request(self.next_id, new + hit, new, hit, gen, hbm, self.next_id)])
            self.next_id += 1

    @rule()
    def pe_fetch(self) -> None:
        # Which group fetches does not matter: the dispatch assigns over every PE.
        before = list(self.dispatch.queue)
        toks = {e.id: e.tok for e in self.dispatch.engines}
        out = self.dispatch.fetch(self.read_q)
        assert [a.request for a in out] == before[: len(out)], "prefill assignment is FIFO"
        for a in out:
            assert a.request.id > self.last_prefill_id
            self.last_prefill_id = a.request.id
            if self.checks_loads:
                assert toks[a.engine] <= self.beta, "a PE above beta was given work"
            toks[a.engine] += self.policy.prefill_tokens(a.request)
            self.pe_of[a.request.id] = a.engine
            self.running_pe.append((a.engine, a.request))
            self.decode_queue.append(a.request)
        if self.checks_loads and self.dispatch.queue:
            over = [e.tok > self.beta for e in self.dispatch.engines]
            assert all(over), "requests wait while a PE of some group is at or below beta"

    @rule(node=st.sampled_from(DE_NODES))
    def de_fetch(self, node: int) -> None:
        group = self.de_groups[node]
        free = {e.id: e.free_hbm_bytes for e in group}
        out = self.policy.assign_decode(self.decode_queue, self.private, self.group_loads, node, group)
        for a in out:
            assert free[a.engine] >= a.request.hbm_bytes, "a DE was given a request that does not fit its HBM"
            free[a.engine] -= a.request.hbm_bytes
            pe_node = self.pe_of[a.request.id] // 10
            q_pe, q_de = self.read_q[pe_node], self.read_q[node]
            side = self.policy.read_side(a.request, pe_node, node, self.read_q)
            if self.policy.read_both_sides and isinstance(self.policy, DualPathPolicy):
                assert (q_pe, q_de)[side == "de"] <= (q_pe, q_de)[side == "pe"], "the read side had the longer queue"
            elif self.policy.read_both_sides:
                assert side in ("pe", "de")
            else:
                assert side == "pe"
            self.running_de.append((a.engine, a.request))

    @precondition(lambda self: bool(self.running_pe))
    @rule(index=st.integers(0, 10**6))
    def prefill_done(self, index: int) -> None:
        engine_id, request = self.running_pe.pop(index % len(self.running_pe))
        wake = self.dispatch.done(request, engine_id)
        assert wake == (f"pe{engine_id // 10}" if self.dispatch.queue else None)

    @precondition(lambda self: bool(self.running_de))
    @rule(index=st.integers(0, 10**6))
    def decode_done(self, index: int) -> None:
        engine_id, request = self.running_de.pop(index % len(self.running_de))
        node = engine_id // 10
        engine = self.de_groups[node][engine_id % 10]
        engine.tok -= self.policy.decode_tokens(request)
        engine.seq -= 1
        engine.free_hbm_bytes += request.hbm_bytes
        self.group_loads[node] -= self.policy.decode_tokens(request)

    @rule(node=st.sampled_from(PE_NODES + DE_NODES), drained=st.integers(0, 5000))
    def reads_progress(self, node: int, drained: int) -> None:
        self.read_q[node] = max(0, self.read_q[node] - drained)

    @invariant()
    def hbm_never_negative(self) -> None:
        if hasattr(self, "de_groups"):
            assert all(e.free_hbm_bytes >= 0 for g in self.de_groups.values() for e in g)


class RoundRobinMachine(SchedulerMachine):
    checks_loads = False

    def make_policy(self, alpha: int, beta: int) -> Policy:
        return RoundRobinPolicy(read_both_sides=alpha % 2 == 0)


TestDualPathScheduler = SchedulerMachine.TestCase
TestRoundRobinScheduler = RoundRobinMachine.TestCase


@given(
    groups=st.integers(1, 12),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 11), st.integers(1, 4)), min_size=1, max_size=60),
)
def test_phase_1_over_a_heap_of_groups_chooses_as_the_scan_does(
    groups: int, steps: list[tuple[bool, int, int]]
) -> None:
    """The scheduler's GroupLoads keep the decode groups in a heap: the same targets as a scan of a plain
    dict, through arrivals and completions (loads freed outside the policy) in any order."""
    from dualpath_emu.cluster.policies import GroupLoads

    scan, heap = DualPathPolicy(), DualPathPolicy()
    plain, tracked = {g: 0 for g in range(groups)}, GroupLoads({g: 0 for g in range(groups)})
    queues = {name: {g: deque[Request]() for g in range(groups)} for name in ("scan", "heap")}
    routed: dict[str, list[tuple[int, Request]]] = {"scan": [], "heap": []}
    next_id = 0
    for arrive, pick, count in steps:
        if arrive or not routed["scan"]:
            batch = [req(next_id + i, new=100 * (1 + (next_id + i) % 7), hit=0, gen=10) for i in range(count)]
            next_id += count
            for name, policy, loads in (("scan", scan, plain), ("heap", heap, tracked)):
                policy.route_decode(deque(batch), queues[name], loads)
                for g, q in queues[name].items():
                    while q:
                        routed[name].append((g, q.popleft()))
            assert routed["scan"] == routed["heap"]
        else:  # a routed request finishes: its group's load drops outside the policy
            for name, policy, loads in (("scan", scan, plain), ("heap", heap, tracked)):
                g, request = routed[name].pop(pick % len(routed[name]))
                loads[g] -= policy.decode_tokens(request)
    assert plain == dict(tracked)
