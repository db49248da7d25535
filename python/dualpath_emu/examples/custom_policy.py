"""A scheduling policy of your own: each request to the least-loaded prefill engine, read queues ignored.

DualPath's scheduler (paper §6.1, Algorithm 1) sorts the prefill engines (PEs) into classes by their node's
storage read queue before it picks the least-loaded one; this policy skips the classes and keeps the rest:
requests leave the queue in order (FIFO), each to the PE with the fewest tokens queued, and no PE takes more
once it holds over β tokens. Decode engines and the read side stay DualPath's (inherited).

    dualpath-emu run --system dualpath_emu.examples.custom_policy:least-loaded --agents 16
    dualpath-emu run ds27b-1p1d-offline --system dualpath --system path/to/your_copy.py:least-loaded

The command line finds the system in ``SYSTEMS`` by its name (``...:LeastLoadedPolicy`` would wrap the class)."""

from collections import deque
from dataclasses import dataclass

from dualpath_emu.cluster.policies import DualPathPolicy, Engine, PrefillAssignment, Request
from dualpath_emu.cluster.systems import System


@dataclass
class LeastLoadedPolicy(DualPathPolicy):
    """Least-loaded PE first, whatever its node's read queue."""

    def assign_prefill(
        self, queue: deque[Request], engines: list[Engine], read_q: dict[int, int]
    ) -> list[PrefillAssignment]:
        """Called when prefill engines fetch work: ``queue`` holds the waiting requests (take from the left),
        ``engines`` every prefill engine of the cluster with its load ``tok`` (tokens queued) and its
        ``node``, ``read_q`` each node's storage read queue in tokens (ignored here)."""
        out: list[PrefillAssignment] = []
        while queue:
            ready = [e for e in engines if e.tok <= self.beta_tokens]
            if not ready:
                break  # every PE holds over β tokens: the rest waits for the next fetch
            engine = min(ready, key=lambda e: (e.tok, e.id))  # ties: the lowest id (runs repeat exactly)
            request = queue.popleft()
            engine.tok += self.prefill_tokens(request)  # so that the next request sees this one
            engine.seq += 1
            out.append(PrefillAssignment(request, engine.id))
        return out


SYSTEMS = [
    System(
        "least-loaded",
        "DualPath with least-loaded PEs, read queues ignored",
        layerwise=True,
        dual_path=True,
        scheduler=LeastLoadedPolicy,
    )
]
