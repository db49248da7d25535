"""The scheduling policies (``dualpath_emu.cluster.policies``) on hand-made views: Algorithm 1, the two-level DE
selection, the read side and their tie rules; the scheduler's prefill dispatch over several PE groups in whole runs;
and the package's own test kit (``dualpath_emu.testing``) run on the built-in policies: the policy state machine and
view strategies with every invariant the policy promises."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_emu.cluster.policies import (
    POLICIES, AffinityPolicy, SplitPolicy, DecodeAssignment, DecodeView, DualPathPolicy, EngineState, GroupState, Health, Policy, PolicyError, PrefillAssignment,
    PrefillView, ReadView, Request, RoundRobinPolicy, RouteView, check_decode, check_prefill, check_read_side,
)  # fmt: skip
from dualpath_emu.testing import (
    PolicyMachine, check_decode_call, check_prefill_call, check_read_call, check_route_call, decode_views,
    prefill_views, read_views, route_views,
)  # fmt: skip


def req(id: int, new: int = 100, hit: int = 1000, gen: int = 10, hbm: int = 1) -> Request:
    return Request(id, new + hit, new, hit, gen, hbm, id)


def pe(id: int, node: int, tok: int = 0, seq: int = 0, given: int = 0) -> EngineState:
    return EngineState(id, node, tok, seq, 0, given)


def prefill(policy: Policy, queue: Sequence[Request], engines: Sequence[EngineState], read_q: dict[int, int],
            stamp: int = 0) -> list[tuple[int, int]]:  # fmt: skip
    view = PrefillView(tuple(queue), tuple(engines), read_q, Health(), stamp)
    return [(a.request.id, a.engine) for a in check_prefill_call(policy, view, policy.assign_prefill(view))]


def test_algorithm_1_prefers_short_read_queues_then_least_loaded() -> None:
    policy = DualPathPolicy(alpha_tokens=500, beta_tokens=1000)
    engines = [pe(0, 0, tok=300), pe(1, 0, tok=100), pe(2, 1), pe(3, 1, tok=2000)]
    read_q = {0: 100, 1: 900}  # node 0 is C2 (read_q <= alpha), node 1 is C3
    queue = [req(1, new=400), req(2, new=400), req(3, new=400), req(4, new=400)]
    # C2 = {0, 1} first, least tok first: 1 (100 -> 500), 0 (300 -> 700), 1 (500 -> 900), then 0 (700 -> 1100).
    assert prefill(policy, queue, engines, read_q) == [(1, 1), (2, 0), (3, 1), (4, 0)]
    # With those loads engine 0 is overloaded (1100 > β), 1 (900) is still C2; C3 only when C2 is empty.
    loaded = [pe(0, 0, tok=1100), pe(1, 0, tok=900), pe(2, 1), pe(3, 1, tok=2000)]
    assert prefill(policy, [req(5, new=10), req(6, new=10)], loaded, read_q) == [(5, 1), (6, 1)]


def test_algorithm_1_stops_when_every_pe_is_overloaded() -> None:
    policy = DualPathPolicy(alpha_tokens=0, beta_tokens=50)
    assert prefill(policy, [req(1)], [pe(0, 0, tok=60, seq=1), pe(1, 0, tok=51, seq=1)], {}) == []


def test_one_fetch_balances_every_group_and_prefers_short_read_queues() -> None:
    # beta is far above what is queued (as in the paper: seconds of compute per GPU), so a fetch over its own
    # group only would have taken all eight requests to the fetching group.
    policy = DualPathPolicy(alpha_tokens=500, beta_tokens=10**9)
    engines = [pe(0, 0), pe(1, 0), pe(10, 1), pe(11, 1)]
    nodes = [engine // 10 for _, engine in prefill(policy, [req(i, new=100) for i in range(8)], engines, {})]
    assert sorted(nodes) == [0] * 4 + [1] * 4
    # Node 1's read queue over alpha: its PEs are C3 and get nothing while node 0's (C2) have room.
    assert {e for _, e in prefill(policy, [req(i) for i in range(8, 12)], engines, {0: 0, 1: 501})} == {0, 1}


def test_ties_go_to_the_engine_or_group_served_least_recently() -> None:
    """An idle cluster: each request finishes before the next arrives, so every PE has tok_e = 0 at each arrival.
    Ties broken by the lowest id would send them all to PE 0 (node 0 reads everything)."""
    policy = DualPathPolicy(alpha_tokens=10**9, beta_tokens=10**9)
    given = {0: 0, 1: 0, 10: 0, 11: 0}
    chosen = []
    for stamp in range(8):
        engines = [pe(i, i // 10, given=g) for i, g in given.items()]
        [(_, engine)] = prefill(policy, [req(stamp)], engines, {}, stamp)
        given[engine] = stamp + 1  # what the scheduler stamps; the request then finishes
        chosen.append(engine)
    assert chosen == [0, 1, 10, 11, 0, 1, 10, 11]
    # Decode phase 1: equal group loads go to the group routed least recently.
    targets, routed = [], {4: 0, 5: 0}
    for stamp in range(4):
        view = RouteView((req(stamp),), tuple(GroupState(g, 0, routed[g]) for g in routed), Health(), stamp)
        [route] = check_route_call(policy, view, policy.route_decode(view))
        routed[route.group] = stamp + 1
        targets.append(route.group)
    assert targets == [4, 5, 4, 5]


def test_decode_selection_two_levels_and_high_token_threshold() -> None:
    policy = DualPathPolicy()
    queue = (req(1, new=0, hit=900, gen=100, hbm=10), req(2, new=0, hit=900, gen=100, hbm=10))
    route = RouteView(queue, (GroupState(0, 5000), GroupState(1, 1000)))
    # Phase 1: both go to group 1 (1000 < 5000, then 2000 < 5000).
    assert [(r.request.id, r.group) for r in policy.route_decode(route)] == [(1, 1), (2, 1)]
    engines = (EngineState(10, 2, 0, 3, 100), EngineState(11, 2, 1000, 0, 5))
    view = DecodeView(1, queue, engines)
    # Phase 2: engine 11 lacks HBM (5 < 10), so engine 10 takes both.
    assert [(a.request.id, a.engine) for a in check_decode_call(policy, view, policy.assign_decode(view))] == [
        (1, 10), (2, 10),
    ]  # fmt: skip


def test_decode_prefers_low_token_engines_by_fewest_requests() -> None:
    policy = DualPathPolicy()
    engines = (EngineState(0, 2, 5000, 1, 100), EngineState(1, 2, 0, 9, 100))
    view = DecodeView(0, (req(1, new=0, hit=90, gen=10),), engines)
    # Z = 1.05 * (100 + 5000) / 2 = 2677.5: engine 0 would be high-token (5100 > Z); engine 1 is low.
    assert [a.engine for a in policy.assign_decode(view)] == [1]


def test_read_side_is_the_shorter_queue_with_ties_to_the_de() -> None:
    policy = DualPathPolicy()
    assert policy.read_side(ReadView(req(1), 0, 2, {0: 500, 2: 100})) == "de"
    assert policy.read_side(ReadView(req(2), 0, 2, {0: 500, 2: 1100})) == "pe"
    assert policy.read_side(ReadView(req(3), 0, 2, {0: 7, 2: 7})) == "de"  # a tie: DE
    # The second path as failover: the DE's storage NIC is down, the PE's is not.
    assert policy.read_side(ReadView(req(4), 0, 2, {0: 500, 2: 0}, Health({"n2.snic.rx": 0.0}))) == "pe"
    assert RoundRobinPolicy().read_side(ReadView(req(3), 0, 2, {0: 9, 2: 0})) == "pe"
    # Round robin with both paths: the sides take turns, whatever the queues.
    rr = RoundRobinPolicy(read_both_sides=True)
    assert [rr.read_side(ReadView(req(4 + i), 0, 2, {0: 0, 2: 9})) for i in range(4)] == ["pe", "de", "pe", "de"]


def test_round_robin_takes_turns() -> None:
    policy = RoundRobinPolicy()
    engines = [pe(0, 0), pe(1, 0), pe(2, 0)]
    assert [e for _, e in prefill(policy, [req(i) for i in range(5)], engines, {})] == [0, 1, 2, 0, 1]
    assert [e for _, e in prefill(policy, [req(5)], engines, {})] == [2]


def test_affinity_sends_a_request_to_the_group_and_the_de_that_keep_its_kv() -> None:
    policy = AffinityPolicy()
    queue = (req(1, new=0, hit=900, gen=100, hbm=10), req(2, new=0, hit=900, gen=100, hbm=10), req(3, hbm=10))
    groups = (GroupState(0, 5000), GroupState(1, 1000))
    # Context 1 is kept on node 0 (the busier group), context 3 on a node that is down: DualPath's rule for it.
    route = RouteView(queue, groups, kept={1: 0, 3: 7})
    assert [(r.request.id, r.group) for r in check_route_call(policy, route, policy.route_decode(route))] == [
        (1, 0), (2, 1), (3, 1),
    ]  # fmt: skip
    assert [r.group for r in DualPathPolicy().route_decode(route)] == [1, 1, 1]  # no affinity: kept is ignored
    engines = (EngineState(10, 2, 0, 0, 100), EngineState(11, 2, 9000, 5, 15))
    view = DecodeView(1, queue, engines, kept={1: 11, 2: 11})
    # Request 1 goes to DE 11, which keeps it, though DualPath would choose 10; DE 11 has no room left for
    # request 2 (15 - 10 < 10), which goes where DualPath sends it.
    assert [(a.request.id, a.engine) for a in check_decode_call(policy, view, policy.assign_decode(view))] == [
        (1, 11), (2, 10), (3, 10),
    ]  # fmt: skip


def test_the_registry_names_the_built_in_policies() -> None:
    assert POLICIES == {"dualpath": DualPathPolicy, "round_robin": RoundRobinPolicy,
                        "dualpath_affinity": AffinityPolicy, "dualpath_split": SplitPolicy}  # fmt: skip
    assert DualPathPolicy.promises == {"fifo", "overload", "read_side", "high_water"}
    assert AffinityPolicy.promises == {"fifo", "overload", "read_side"}
    assert RoundRobinPolicy.promises == {"fifo"} and Policy.promises == frozenset()


# --- what the scheduler refuses, for every policy ------------------------------------------------------------


def test_an_impossible_answer_is_a_policy_error_naming_the_policy_the_method_and_the_value() -> None:
    policy = DualPathPolicy()
    view = PrefillView((req(1), req(2)), (pe(0, 0), pe(1, 0)), {0: 0})
    cases = [
        ("nothing", "returned 'nothing'; expected a list of PrefillAssignment"),
        ([PrefillAssignment(req(9), 0)], "assigned request 9, which was not waiting in the queue it was shown"),
        ([PrefillAssignment(req(1), 0), PrefillAssignment(req(1), 1)], "assigned request 1 twice"),
        ([PrefillAssignment(req(1), 7)], "assigned request 1 to engine 7, not one that is up among those it was shown (0, 1)"),
        ([(req(1), 0)], "returned (Request(id=1"),
    ]  # fmt: skip
    for answer, expected in cases:
        with pytest.raises(PolicyError, match="^policy DualPathPolicy.assign_prefill ") as error:
            check_prefill(policy, answer, view)
        assert expected in str(error.value), (answer, str(error.value))
    decode = DecodeView(3, (req(1, hbm=60), req(2, hbm=60)), (EngineState(30, 3, free_hbm_bytes=100),))
    with pytest.raises(
        PolicyError, match="assigned request 2 \\(60 B of KV\\) to engine 30, which has 40 B of HBM free"
    ):
        check_decode(policy, [DecodeAssignment(decode.queue[0], 30), DecodeAssignment(decode.queue[1], 30)], decode)
    with pytest.raises(PolicyError, match="returned 'de' for request 1; expected 'pe' \\(the system's reads do not go"):
        check_read_side(policy, "de", ReadView(req(1), 0, 1, {}), dual_path=False)


# --- the kit on the built-in policies ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(POLICIES))
@given(data=st.data())
def test_built_in_policies_keep_their_promises_on_any_view(name: str, data: st.DataObject) -> None:
    policy = POLICIES[name](read_both_sides=True)
    if isinstance(policy, DualPathPolicy):
        policy = type(policy)(alpha_tokens=data.draw(st.integers(0, 100_000)),
                              beta_tokens=data.draw(st.integers(1, 100_000)))  # fmt: skip
    view = data.draw(prefill_views())
    check_prefill_call(policy, view, policy.assign_prefill(view))
    route = data.draw(route_views())
    check_route_call(policy, route, policy.route_decode(route))
    decode = data.draw(decode_views())
    check_decode_call(policy, decode, policy.assign_decode(decode))
    read = data.draw(read_views())
    check_read_call(policy, read, policy.read_side(read))


class DualPathMachine(PolicyMachine):
    def make_policy(self, alpha_tokens: int, beta_tokens: int) -> Policy:
        return DualPathPolicy(alpha_tokens=alpha_tokens, beta_tokens=beta_tokens)


class AffinityMachine(PolicyMachine):
    def make_policy(self, alpha_tokens: int, beta_tokens: int) -> Policy:
        return AffinityPolicy(alpha_tokens=alpha_tokens, beta_tokens=beta_tokens)


class RoundRobinMachine(PolicyMachine):
    def make_policy(self, alpha_tokens: int, beta_tokens: int) -> Policy:
        return RoundRobinPolicy(read_both_sides=alpha_tokens % 2 == 0)


TestDualPathScheduler = DualPathMachine.TestCase
TestRoundRobinScheduler = RoundRobinMachine.TestCase
TestAffinityScheduler = AffinityMachine.TestCase
