"""A scheduling policy of your own: the least-loaded prefill engine, and reads kept on the prefill side.

DualPath's scheduler (paper §6.1, Algorithm 1) sorts the prefill engines (PEs) into classes by their node's
storage read queue before it picks the least-loaded one; this policy skips the classes and keeps the rest:
requests leave the queue in order (FIFO), each to the PE with the fewest tokens queued, and no PE takes more
once it holds over β tokens. Its read side is a threshold instead of DualPath's shorter queue (§6.3): a hit is
read by the PE's own storage NIC until that node's read queue holds more than α tokens, then by the DE's, so
the second path carries only the overflow. Decode engines stay DualPath's (inherited).

    dualpath-emu run ds660b-2p4d-offline --set workload.max_rounds=20 --system dualpath,dualpath_emu.examples.custom_policy:least-loaded
    dualpath-emu check dualpath_emu.examples.custom_policy:least-loaded

The command line finds the system in ``SYSTEMS`` by its name (``...:LeastLoadedPolicy`` would wrap the class)."""

from dataclasses import dataclass
from typing import ClassVar

from dualpath_emu.cluster.policies import DualPathPolicy, PrefillAssignment, PrefillView, ReadSide, ReadView
from dualpath_emu.cluster.systems import System


@dataclass
class LeastLoadedPolicy(DualPathPolicy):
    """Least-loaded PE first, whatever its node's read queue; reads on the PE side up to α."""

    # DualPath's rules this policy keeps, which `dualpath-emu check` holds it to: not the shorter-queue read side.
    promises: ClassVar[frozenset[str]] = frozenset({"fifo", "overload", "high_water"})

    def assign_prefill(self, view: PrefillView) -> list[PrefillAssignment]:
        """Called when prefill engines fetch work. ``view.queue``: the waiting requests, oldest first;
        ``view.engines``: every prefill engine that is up, with its load ``tok`` (tokens queued) and ``node``;
        ``view.read_q``: each node's storage read queue in tokens (ignored here). The view does not change
        while you decide: count your own assignments."""
        tok = {e.id: e.tok for e in view.engines}
        out: list[PrefillAssignment] = []
        for request in view.queue:
            ready = [engine for engine, load in tok.items() if load <= self.beta_tokens]
            if not ready:
                break  # every PE holds over β tokens: the rest waits for the next fetch
            engine = min(ready, key=lambda e: (tok[e], e))  # ties: the lowest id (runs repeat exactly)
            tok[engine] += self.prefill_tokens(request)  # so that the next request sees this one
            out.append(PrefillAssignment(request, engine))
        return out

    def read_side(self, view: ReadView) -> ReadSide:
        """Called once per request as it gets its DE: ``"pe"`` or ``"de"``, the node whose storage NIC reads its
        hit. ``view.read_q`` holds each node's read queue (tokens), ``view.health`` what faults left of the NICs."""
        side: ReadSide = "de" if view.read_q.get(view.pe_node, 0) > self.alpha_tokens else "pe"
        return self.failover(view, side)  # the other side while this one's storage NIC is down


SYSTEMS = [
    System(
        "least-loaded",
        "least-loaded PEs, reads on the PE side up to α",
        layerwise=True,
        dual_path=True,
        scheduler=LeastLoadedPolicy,
    )
]
