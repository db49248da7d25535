"""The invariants a scheduling policy and a whole run are held to, as reusable checks (docs/testing-your-scheduler.md).

Each is named in :data:`INVARIANTS`. ``contract`` and the run-level ones hold for every policy; the paper's rules hold
for a policy that promises them (:attr:`Policy.promises`: DualPath's scheduler promises all four, round robin FIFO, a
subclass inherits its base's promises). A policy-level check takes a policy, a view and the policy's answer and raises
:class:`Violation`; :func:`checked` wraps a policy class so that every decision it makes in a whole run is checked."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from dualpath_emu.cluster.policies import (
    DE_HIGH_TOKEN_FACTOR, DecodeAssignment, DecodeRoute, DecodeView, Policy, PolicyError, PrefillAssignment,
    PrefillView, ReadView, RouteView, check_decode, check_prefill, check_read_side, check_routes,
)  # fmt: skip

__all__ = [
    "INVARIANTS", "PAPER_RULES", "Violation", "check_decode_call", "check_prefill_call", "check_read_call",
    "check_route_call", "checked", "promises",
]  # fmt: skip

INVARIANTS: Final[Mapping[str, str]] = {
    "contract": "every decision names a waiting request once, an engine or group that is up, none over its free HBM, "
    "and a read side the system has",
    "fifo": "requests leave each queue in order: a prefill or decode fetch takes a prefix of its queue",
    "overload": "no work to a PE above β; requests wait for a PE only while every PE is above β (Algorithm 1)",
    "read_side": "a hit is read on the side with the shorter read queue, unless that side's storage NIC is down",
    "high_water": "a DE goes above the high-token mark Z only when no DE with room stays at or below it (§6.2)",
    "liveness": "no request waits while an idle engine has room for it, and no run stops or stalls with work left",
    "conservation": "every admitted request ends exactly once, every pool empties, every byte is accounted",
    "determinism": "the same scenario and seeds give the same event log, byte for byte",
    "no_error": "neither the policy nor the emulator raises an exception",
}  # fmt: skip
"""Every invariant by name, with what it says."""

PAPER_RULES: Final = frozenset({"fifo", "overload", "read_side", "high_water"})
"""The invariants a policy holds only if it promises them."""


class Violation(AssertionError):
    """A policy or a run broke invariant ``invariant`` (a key of :data:`INVARIANTS`); the message says how."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant
        self.detail = message


def promises(policy: Policy | type[Policy]) -> frozenset[str]:
    """The paper's rules ``policy`` promises (its class's ``promises``, inherited)."""
    return policy.promises & PAPER_RULES


def _contract(check: Callable[..., Any], *args: Any) -> Any:
    try:
        return check(*args)
    except PolicyError as error:
        raise Violation("contract", str(error)) from None


def _prefix(what: str, queue: Sequence[Any], taken: Sequence[Any]) -> None:
    for i, request in enumerate(taken):
        if i >= len(queue) or queue[i].id != request.id:
            order = [r.id for r in taken]
            raise Violation("fifo", f"{what} took requests {order} from a queue whose head was "
                                    f"{[r.id for r in list(queue)[: len(taken) + 1]]}")  # fmt: skip


def check_prefill_call(policy: Policy, view: PrefillView, answer: object) -> Sequence[PrefillAssignment]:
    """``answer`` to ``assign_prefill(view)``: the contract, liveness, and the rules ``policy`` promises."""
    assigned = _contract(check_prefill, policy, answer, view)
    rules = promises(policy)
    if "fifo" in rules:
        _prefix(f"{type(policy).__name__}.assign_prefill", view.queue, [a.request for a in assigned])
    tok = {e.id: e.tok for e in view.engines}
    beta = getattr(policy, "beta_tokens", None)
    for a in assigned:
        if "overload" in rules and beta is not None and tok[a.engine] > beta:
            raise Violation("overload", f"{type(policy).__name__}.assign_prefill gave request {a.request.id} to PE "
                                        f"{a.engine}, which held {tok[a.engine]} tokens > β = {beta}")  # fmt: skip
        tok[a.engine] += policy.prefill_tokens(a.request)
    if len(assigned) < len(view.queue):
        idle = [e for e, t in tok.items() if t == 0]
        if idle:
            raise Violation("liveness", f"{type(policy).__name__}.assign_prefill left {len(view.queue) - len(assigned)} "
                                        f"request(s) waiting while PE {idle[0]} had no work")  # fmt: skip
        if "overload" in rules and beta is not None:
            room = [e for e, t in tok.items() if t <= beta]
            if room:
                raise Violation("overload", f"{type(policy).__name__}.assign_prefill left requests waiting while PE "
                                            f"{room[0]} held {tok[room[0]]} tokens ≤ β = {beta}")  # fmt: skip
    return assigned  # type: ignore[no-any-return]


def check_route_call(policy: Policy, view: RouteView, answer: object) -> Sequence[DecodeRoute]:
    """``answer`` to ``route_decode(view)``: the contract and FIFO (if promised)."""
    routes = _contract(check_routes, policy, answer, view)
    if "fifo" in promises(policy):
        _prefix(f"{type(policy).__name__}.route_decode", view.queue, [r.request for r in routes])
    return routes  # type: ignore[no-any-return]


def check_decode_call(policy: Policy, view: DecodeView, answer: object) -> Sequence[DecodeAssignment]:
    """``answer`` to ``assign_decode(view)``: the contract, liveness, FIFO and the high-water mark (if promised)."""
    assigned = _contract(check_decode, policy, answer, view)
    rules, name = promises(policy), f"{type(policy).__name__}.assign_decode"
    if "fifo" in rules:
        _prefix(name, view.queue, [a.request for a in assigned])
    state = {e.id: [e.tok, e.free_hbm_bytes, e.seq] for e in view.engines}
    z = None
    if "high_water" in rules and view.engines:
        free, fitting = sum(e.free_hbm_bytes for e in view.engines), 0
        for request in view.queue:
            if request.hbm_bytes > free:
                break
            free -= request.hbm_bytes
            fitting += policy.decode_tokens(request)
        factor = getattr(policy, "high_token_factor", DE_HIGH_TOKEN_FACTOR)
        z = factor * (fitting + sum(e.tok for e in view.engines)) / len(view.engines)
    for a in assigned:
        tokens, need = policy.decode_tokens(a.request), a.request.hbm_bytes
        if z is not None and state[a.engine][0] + tokens > z:
            low = [e for e, (tok, free_, _) in state.items() if free_ >= need and tok + tokens <= z]
            if low:
                raise Violation("high_water", f"{name} gave request {a.request.id} to DE {a.engine} ({state[a.engine][0]} "
                                              f"+ {tokens} tokens > Z = {z:.0f}) while DE {low[0]} stayed below Z")  # fmt: skip
        state[a.engine][0] += tokens
        state[a.engine][1] -= need
        state[a.engine][2] += 1
    left = list(view.queue)[len(assigned) :] if "fifo" in rules else None
    taken = {a.request.id for a in assigned}
    waiting = left if left is not None else [r for r in view.queue if r.id not in taken]
    if waiting:
        head = waiting[0]
        idle = [e for e, (tok, free_, seq) in state.items() if seq == 0 and free_ >= head.hbm_bytes]
        if idle:
            raise Violation("liveness", f"{name} left request {head.id} ({head.hbm_bytes} B of KV) waiting while DE "
                                        f"{idle[0]} had no request and room for it")  # fmt: skip
    return assigned  # type: ignore[no-any-return]


def check_read_call(policy: Policy, view: ReadView, answer: object, dual_path: bool = True) -> None:
    """``answer`` to ``read_side(view)``: the contract and the shorter queue (if promised)."""
    _contract(check_read_side, policy, answer, view, dual_path)
    if "read_side" not in promises(policy) or not policy.read_both_sides or not dual_path:
        return
    health = view.health
    if not (health.can_read(view.pe_node) and health.can_read(view.de_node)):
        return  # failover decides
    q_pe, q_de = view.read_q.get(view.pe_node, 0), view.read_q.get(view.de_node, 0)
    mine, other = (q_pe, q_de) if answer == "pe" else (q_de, q_pe)
    if mine > other:
        raise Violation("read_side", f"{type(policy).__name__}.read_side read request {view.request.id} on the "
                                     f"{answer.upper() if isinstance(answer, str) else answer} side, whose read queue "
                                     f"held {mine} tokens, while the other held {other}")  # fmt: skip


def checked(cls: type[Policy], dual_path: bool = True) -> type[Policy]:
    """A subclass of ``cls`` whose every decision is checked (:class:`Violation` at the first broken invariant), under
    ``cls``'s own name: what ``dualpath-emu check`` runs whole clusters with."""

    def assign_prefill(self: Policy, view: PrefillView) -> Sequence[PrefillAssignment]:
        return check_prefill_call(self, view, cls.assign_prefill(self, view))

    def route_decode(self: Policy, view: RouteView) -> Sequence[DecodeRoute]:
        return check_route_call(self, view, cls.route_decode(self, view))

    def assign_decode(self: Policy, view: DecodeView) -> Sequence[DecodeAssignment]:
        return check_decode_call(self, view, cls.assign_decode(self, view))

    def read_side(self: Policy, view: ReadView) -> Any:
        answer = cls.read_side(self, view)
        check_read_call(self, view, answer, dual_path)
        return answer

    namespace = {"assign_prefill": assign_prefill, "route_decode": route_decode, "assign_decode": assign_decode,
                 "read_side": read_side, "__module__": cls.__module__, "__qualname__": cls.__qualname__}  # fmt: skip
    return type(cls.__name__, (cls,), namespace)
