"""What the scheduler refuses of a policy's answer, for every policy (built-in ones too): a :class:`PolicyError`
naming the policy, the method and the value. Each check is a function of the answer and the view, so a test kit
(:mod:`dualpath_emu.testing`) checks a policy alone with the same rules the scheduler applies."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from dualpath_emu.cluster.policies.view import (
    DecodeAssignment, DecodeRoute, DecodeView, PrefillAssignment, PrefillView, ReadView, Request, RouteView, Split,
)  # fmt: skip
from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.errors import UsageError
from dualpath_emu.inputs import short_repr

__all__ = ["PolicyError", "check_decode", "check_prefill", "check_read_side", "check_routes"]


class PolicyError(UsageError):
    """A policy answered what the scheduler cannot use, or never assigned waiting work (named)."""


def _items(policy: object, method: str, answer: object, kind: type) -> Sequence[object]:
    if not isinstance(answer, (list, tuple)):
        raise PolicyError(f"{_name(policy, method)} returned {short_repr(answer)}; expected a list of "
                          f"{kind.__name__}")  # fmt: skip
    return answer


def _name(policy: object, method: str) -> str:
    return f"policy {type(policy).__name__}.{method}"


def _requests(policy: object, method: str, answer: object, kind: type, queue: Sequence[Request]) -> list[Request]:
    """The requests of ``answer`` (a list of ``kind``), each waiting in ``queue`` and named once."""
    items = _items(policy, method, answer, kind)
    if not items:
        return []
    # Most answers take the head of the queue in order: checked in one pass over what was taken.
    head = [getattr(item, "request", None) for item in items]
    if all(type(i) is kind for i in items):
        matched = 0
        for r, h in zip(queue, head):
            if r is not h:
                break
            matched += 1
        if matched == len(head):
            return head  # type: ignore[return-value]
    waiting = {r.id for r in queue}
    seen: set[int] = set()
    out = []
    for i, item in enumerate(items):
        request = getattr(item, "request", None)
        if type(item) is not kind or not isinstance(request, Request):
            raise PolicyError(f"{_name(policy, method)} returned {short_repr(item)} at [{i}]; expected a "
                              f"{kind.__name__}")  # fmt: skip
        if request.id in seen:
            raise PolicyError(f"{_name(policy, method)} assigned request {request.id} twice")
        if request.id not in waiting:
            raise PolicyError(f"{_name(policy, method)} assigned request {request.id}, which was not waiting in the "
                              "queue it was shown")  # fmt: skip
        seen.add(request.id)
        out.append(request)
    return out


def _engine(policy: object, method: str, request: Request, engine: object, known: Collection[int]) -> None:
    if type(engine) is not int or engine not in known:
        shown = ", ".join(map(str, sorted(known))) or "none"
        raise PolicyError(f"{_name(policy, method)} assigned request {request.id} to engine {short_repr(engine)}, "
                          f"not one that is up among those it was shown ({shown})")  # fmt: skip


def check_prefill(policy: object, answer: object, view: PrefillView) -> Sequence[PrefillAssignment]:
    """``answer`` to :meth:`~dualpath_emu.cluster.policies.base.Policy.assign_prefill`: waiting requests, once each, to
    PEs that are up."""
    requests = _requests(policy, "assign_prefill", answer, PrefillAssignment, view.queue)
    if requests:
        known = {e.id for e in view.engines}
        for request, a in zip(requests, answer, strict=True):  # type: ignore[call-overload]
            _engine(policy, "assign_prefill", request, a.engine, known)
    return answer  # type: ignore[return-value]


def check_routes(policy: object, answer: object, view: RouteView) -> Sequence[DecodeRoute]:
    """``answer`` to :meth:`~dualpath_emu.cluster.policies.base.Policy.route_decode`: waiting requests, once each, to
    decode groups that are up."""
    requests = _requests(policy, "route_decode", answer, DecodeRoute, view.queue)
    if requests:
        groups = {g.node for g in view.groups}
        for request, route in zip(requests, answer, strict=True):  # type: ignore[call-overload]
            if type(route.group) is not int or route.group not in groups:
                shown = ", ".join(map(str, sorted(groups))) or "none"
                raise PolicyError(f"{_name(policy, 'route_decode')} routed request {request.id} to group "
                                  f"{short_repr(route.group)}, not a decode group that is up ({shown})")  # fmt: skip
    return answer  # type: ignore[return-value]


def check_decode(policy: object, answer: object, view: DecodeView) -> Sequence[DecodeAssignment]:
    """``answer`` to :meth:`~dualpath_emu.cluster.policies.base.Policy.assign_decode`: requests of the group's queue,
    once each, to its DEs, none over its free HBM."""
    requests = _requests(policy, "assign_decode", answer, DecodeAssignment, view.queue)
    if requests:
        free = {e.id: e.free_hbm_bytes for e in view.engines}
        for request, a in zip(requests, answer, strict=True):  # type: ignore[call-overload]
            _engine(policy, "assign_decode", request, a.engine, free)
            free[a.engine] -= request.hbm_bytes
            if free[a.engine] < 0:
                raise PolicyError(f"{_name(policy, 'assign_decode')} assigned request {request.id} "
                                  f"({request.hbm_bytes} B of KV) to engine {a.engine}, which has "
                                  f"{free[a.engine] + request.hbm_bytes} B of HBM free")  # fmt: skip
    return answer  # type: ignore[return-value]


def check_read_side(policy: object, answer: object, view: ReadView, dual_path: bool) -> None:
    """``answer`` to :meth:`~dualpath_emu.cluster.policies.base.Policy.read_side`: ``"pe"``, or ``"de"`` or a
    :class:`Split` in a system whose reads may go through the decode node (a split: of a hit the DRAM pool holds no
    part of, the decode side's tokens in (0, hit), the prefill side's whole blocks)."""
    if answer == "pe" or (answer == "de" and dual_path):
        return
    if isinstance(answer, Split) and dual_path:
        request, de = view.request, answer.de_tokens
        hit = request.hit_tokens
        why = ("the DRAM pool holds part of its hit (read whole)" if request.pooled
               else f"de_tokens must be an int in (0, {hit})" if type(de) is not int or not 0 < de < hit
               else f"the prefill side's {hit - de} tokens are not whole Full Blocks of {BLOCK_TOKENS}"
               if (hit - de) % BLOCK_TOKENS else "")  # fmt: skip
        if not why:
            return
        raise PolicyError(f"{_name(policy, 'read_side')} returned {short_repr(answer)} for request {request.id}: {why}")
    expected = "'pe' or 'de'" if dual_path else "'pe' (the system's reads do not go through the decode node)"
    raise PolicyError(f"{_name(policy, 'read_side')} returned {short_repr(answer)} for request {view.request.id}; "
                      f"expected {expected}")  # fmt: skip
