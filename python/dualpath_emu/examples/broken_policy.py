"""A policy that looks right and is not: decode requests packed onto the decode engine with the most free HBM.

The idea is sound (fill one DE's HBM before waking another), and on the packaged scenarios it runs and gives
plausible numbers. The bug is one a read-only view invites: ``view.engines`` shows each DE's free HBM as it
was when the fetch began, and this policy never counts the requests it has already placed in the same call.
Two requests that each fit, but not together, go to the same DE. ``dualpath-emu check`` finds it in seconds
and shrinks it to two requests and one DE (docs/testing-your-scheduler.md walks through it):

    dualpath-emu check dualpath_emu.examples.broken_policy:most-free-hbm

The fix is three lines: keep a copy of the free HBM and subtract each placed request (see ``fixed``)."""

from dataclasses import dataclass
from typing import ClassVar

from dualpath_emu.cluster.policies import DecodeAssignment, DecodeView, DualPathPolicy
from dualpath_emu.cluster.systems import System


@dataclass
class MostFreeHbmPolicy(DualPathPolicy):
    """DualPath, with each decode request on the DE of its group with the most free HBM."""

    # Choosing DEs by free HBM drops DualPath's high-token mark Z (§6.2): say so, and check holds it to the rest.
    promises: ClassVar[frozenset[str]] = DualPathPolicy.promises - {"high_water"}

    def assign_decode(self, view: DecodeView) -> list[DecodeAssignment]:
        out: list[DecodeAssignment] = []
        for request in view.queue:  # in order (FIFO)
            fits = [e for e in view.engines if e.free_hbm_bytes >= request.hbm_bytes]
            if not fits:
                break  # the head waits for room
            engine = max(fits, key=lambda e: (e.free_hbm_bytes, -e.id))
            out.append(DecodeAssignment(request, engine.id))  # BUG: engine's free HBM is not reduced
        return out


@dataclass
class FixedMostFreeHbmPolicy(MostFreeHbmPolicy):
    """The same choice, counting the HBM this call has already given away."""

    def assign_decode(self, view: DecodeView) -> list[DecodeAssignment]:
        free = {e.id: e.free_hbm_bytes for e in view.engines}
        out: list[DecodeAssignment] = []
        for request in view.queue:
            fits = [e for e in free if free[e] >= request.hbm_bytes]
            if not fits:
                break
            engine = max(fits, key=lambda e: (free[e], -e))
            free[engine] -= request.hbm_bytes
            out.append(DecodeAssignment(request, engine))
        return out


SYSTEMS = [
    System(
        "most-free-hbm", "DualPath, decode on the DE with the most free HBM (broken)", True, True, MostFreeHbmPolicy
    ),
    System("fixed", "DualPath, decode on the DE with the most free HBM", True, True, FixedMostFreeHbmPolicy),
]
