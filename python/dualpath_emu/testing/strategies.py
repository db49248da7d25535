"""Hypothesis strategies for testing a scheduling policy (docs/testing-your-scheduler.md): the views a policy is shown,
and whole small clusters -- deployment, workload with tool waits, fault schedule and delivery order -- as a
:class:`ClusterCase` that :func:`~dualpath_emu.testing.cluster.run_case` runs in virtual time.

Every strategy shrinks towards the small and the plain: fewer nodes, agents, rounds and tokens, no faults, no tool
waits, FIFO delivery."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import assume
from hypothesis import strategies as st

from dualpath_emu.cluster.faults import engine_group_names
from dualpath_emu.cluster.policies import (
    DecodeView, EngineState, GroupState, Health, PrefillView, ReadView, Request, RouteView,
)  # fmt: skip

__all__ = [
    "ClusterCase", "FaultCase", "cluster_cases", "decode_views", "engine_states", "fault_schedules", "health",
    "prefill_views", "read_views", "requests", "route_views", "trajectories",
]  # fmt: skip

KV_BYTES_PER_TOKEN = 100  # what the views' ``hbm_bytes`` assume (any positive number would do)


@st.composite
def requests(draw: st.DrawFn, ids: st.SearchStrategy[int] | None = None, max_tokens: int = 20_000) -> Request:
    """A waiting request: ``new`` ≥ 1 tokens, a hit, a generation length and the DE HBM its KV takes."""
    rid = draw(ids if ids is not None else st.integers(0, 10_000))
    new = draw(st.integers(1, max_tokens))
    hit = draw(st.integers(0, max_tokens))
    gen = draw(st.integers(1, 2_000))
    return Request(rid, new + hit, new, hit, gen, (new + hit + gen) * KV_BYTES_PER_TOKEN, rid)


def _queue(draw: st.DrawFn, max_size: int) -> tuple[Request, ...]:
    size = draw(st.integers(0, max_size))
    ids = draw(st.lists(st.integers(0, 10_000), min_size=size, max_size=size, unique=True))
    return tuple(draw(requests(st.just(rid))) for rid in ids)


@st.composite
def engine_states(draw: st.DrawFn, id: int, node: int, decode: bool = False) -> EngineState:
    """An engine's load: tokens and requests in flight, free HBM for a DE, when it was last given work."""
    seq = draw(st.integers(0, 8))
    tok = draw(st.integers(0, 60_000)) if seq else 0
    free = draw(st.integers(0, 8_000_000)) if decode else 0
    return EngineState(id, node, tok, seq, free, draw(st.integers(0, 50)))


@st.composite
def health(draw: st.DrawFn, nodes: int = 4) -> Health:
    """What faults leave: usually everything up, sometimes a storage NIC down or degraded."""
    factors = {}
    for node in range(nodes):
        factor = draw(st.sampled_from([1.0, 1.0, 1.0, 0.0, 0.5]))
        if factor != 1.0:
            factors[f"n{node}.snic.rx"] = factor
    return Health(factors)


@st.composite
def prefill_views(draw: st.DrawFn, max_queue: int = 12, max_nodes: int = 3, max_gpus: int = 4) -> PrefillView:
    """A prefill fetch: a queue, the PEs of 1..``max_nodes`` nodes (id = node × 8 + GPU) and their read queues."""
    nodes = draw(st.integers(1, max_nodes))
    gpus = draw(st.integers(1, max_gpus))
    engines = tuple(draw(engine_states(n * 8 + g, n)) for n in range(nodes) for g in range(gpus))
    read_q = {n: draw(st.integers(0, 200_000)) for n in range(nodes)}
    stamp = max((e.given for e in engines), default=0)
    return PrefillView(_queue(draw, max_queue), engines, read_q, draw(health(nodes)), stamp)


@st.composite
def route_views(draw: st.DrawFn, max_queue: int = 12, max_groups: int = 4) -> RouteView:
    """Phase 1: requests that have a PE, and the decode groups (nodes 10, 11, ...) with their loads; some requests'
    contexts kept in HBM on a group's node (or on a node that is down)."""
    groups = tuple(GroupState(10 + g, draw(st.integers(0, 500_000)), draw(st.integers(0, 50)))
                   for g in range(draw(st.integers(1, max_groups))))  # fmt: skip
    queue = _queue(draw, max_queue)
    kept = {r.context: draw(st.integers(10, 10 + len(groups))) for r in queue if draw(st.booleans())}
    return RouteView(queue, groups, Health(), max(g.given for g in groups), kept)


@st.composite
def decode_views(draw: st.DrawFn, max_queue: int = 8, max_gpus: int = 4) -> DecodeView:
    """Phase 2: a decode group's private queue and its DEs (node 10), HBM often tight; some requests' contexts
    kept in HBM on one of them (or on a DE of another group)."""
    gpus = draw(st.integers(1, max_gpus))
    queue = _queue(draw, max_queue)
    kept = {r.context: draw(st.integers(80, 80 + gpus)) for r in queue if draw(st.booleans())}
    return DecodeView(10, queue, tuple(draw(engine_states(80 + g, 10, decode=True)) for g in range(gpus)),
                      Health(), kept)  # fmt: skip


@st.composite
def read_views(draw: st.DrawFn) -> ReadView:
    """A read side to choose: the request's PE on node 0, its DE on node 1, their read queues and health."""
    request = draw(requests())
    read_q = {0: draw(st.integers(0, 200_000)), 1: draw(st.integers(0, 200_000))}
    return ReadView(request, 0, 1, read_q, draw(health(2)))


# --- whole small clusters -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultCase:
    """One fault of a schedule: as a scenario's ``[[faults]]`` entry."""

    kind: str  # "down" (a storage NIC) or "crash" (an engine group)
    target: str
    at_s: float
    duration_s: float  # down: how long; crash: restart_s


@dataclass(frozen=True)
class ClusterCase:
    """A whole small cluster to run in virtual time: everything ``check`` draws, shrinks and writes as a scenario."""

    pe_nodes: int
    de_nodes: int
    gpus: int
    de_hbm_reserve_fraction: float
    rounds: tuple[tuple[tuple[int, int], ...], ...]
    """Per agent, its rounds as ``(append, gen)`` tokens."""
    waits_s: tuple[tuple[float, ...], ...]
    """Per agent, the tool wait before each round (seconds; the first is its start)."""
    faults: tuple[FaultCase, ...] = ()
    seed: int = 0
    order_seed: int | None = None
    message_delay_s: float = 0.0
    store_blocks: int = 0
    """The store's capacity as a KV tier, in Full Blocks (0: unbounded, the paper's)."""
    eviction: str = "lru"
    ttl_s: float = 0.0
    pool_blocks: int = 0
    """A DRAM pool per node, in Full Blocks, that the checked system keeps KV in (0: none but a system's own)."""
    pool_write: str = "through"
    """The pool's write policy (``"back"`` only over an unbounded store)."""

    @property
    def requests(self) -> int:
        return sum(len(r) for r in self.rounds)


@st.composite
def trajectories(draw: st.DrawFn, max_agents: int = 6, max_rounds: int = 4, max_append: int = 24_000,
                 tool_waits: bool = True) -> tuple[tuple[tuple[tuple[int, int], ...], ...], tuple[tuple[float, ...], ...]]:  # fmt: skip
    """Agents' rounds ``(append, gen)`` and tool waits before each (``tool_waits``: drawn; else none)."""
    agents = draw(st.integers(1, max_agents))
    rounds, waits = [], []
    for _ in range(agents):
        n = draw(st.integers(1, max_rounds))
        rounds.append(tuple((draw(st.integers(1, max_append)), draw(st.integers(1, 300))) for _ in range(n)))
        wait = st.sampled_from([0.0, 0.0, 0.05, 0.5, 2.0]) if tool_waits else st.just(0.0)
        waits.append(tuple(draw(wait) for _ in range(n)))
    return tuple(rounds), tuple(waits)


@st.composite
def fault_schedules(draw: st.DrawFn, pe_nodes: int, de_nodes: int, max_faults: int = 2) -> tuple[FaultCase, ...]:
    """0..``max_faults`` faults in the first seconds: a storage NIC down for a while, or an engine group crashing."""
    faults = []
    for _ in range(draw(st.integers(0, max_faults))):
        at = draw(st.sampled_from([0.05, 0.2, 0.5, 1.0, 2.0]))
        if draw(st.booleans()):
            node = draw(st.integers(0, pe_nodes + de_nodes - 1))
            faults.append(FaultCase("down", f"n{node}.snic", at, draw(st.sampled_from([0.5, 2.0]))))
        else:
            group = draw(st.sampled_from(engine_group_names(pe_nodes, de_nodes, 1)))
            faults.append(FaultCase("crash", group, at, draw(st.sampled_from([0.2, 1.0]))))
    return tuple(faults)


@st.composite
def cluster_cases(draw: st.DrawFn, faults: bool = True, orders: bool = True, tool_waits: bool = True,
                  max_agents: int = 6, stores: bool = True) -> ClusterCase:  # fmt: skip
    """A small cluster (1..2 prefill and decode nodes of 1..4 GPUs, DE HBM from roomy to one request per GPU), a
    workload, a fault schedule, a delivery order and (``stores``) a store that is unbounded half the time, else
    from a few blocks to ample, with an eviction policy, and a DRAM pool half the time (writing back half the time
    over an unbounded store)."""
    pe_nodes, de_nodes = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    gpus = draw(st.integers(1, 4))
    reserve = draw(st.sampled_from([0.1, 0.9, 0.98, 0.99]))
    rounds, waits = draw(trajectories(max_agents=max_agents, tool_waits=tool_waits))
    schedule = draw(fault_schedules(pe_nodes, de_nodes)) if faults else ()
    order_seed = draw(st.none() | st.integers(1, 2**16)) if orders else None
    delay = draw(st.sampled_from([0.0, 0.0001, 0.002])) if order_seed is not None else 0.0
    store_blocks = draw(st.sampled_from([0, 0, 0, 3, 40, 400, 4_000])) if stores else 0
    eviction = draw(st.sampled_from(["lru", "ttl", "tool_wait"])) if store_blocks else "lru"
    ttl_s = draw(st.sampled_from([0.1, 1.0, 30.0])) if eviction == "ttl" else 0.0
    pool_blocks = draw(st.sampled_from([0, 0, 0, 2, 20, 200, 2_000])) if stores else 0
    pool_write = draw(st.sampled_from(["through", "back"])) if pool_blocks and not store_blocks else "through"
    case = ClusterCase(pe_nodes, de_nodes, gpus, reserve, rounds, waits, schedule, draw(st.integers(0, 3)),
                       order_seed, delay, store_blocks, eviction, ttl_s, pool_blocks, pool_write)  # fmt: skip
    from dualpath_emu.testing.cluster import case_fits  # (the cluster model, imported when a case is drawn)

    assume(case_fits(case))  # as a scenario is refused whose longest request's KV fits no DE GPU
    return case
