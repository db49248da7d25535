"""Forward passes (one core call per pass, expanded by the core into per-layer transfers and delays)
through the binding, ``Core.submit_forwards``, and through the loops' ``forward``: hand-solved times, a
property against a reference computation, errors naming the part, and one FFI call per batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_emu._core import Arbitration, Core
from dualpath_emu.errors import InvalidArgumentError, UnknownNameError
from dualpath_emu.runtime.core_work import Completion, ForwardRank, LayerTransfer
from dualpath_emu.runtime.realtime import WallClockCore, run_realtime

GB = 1_000_000_000
MB = 1_000_000
MS = 1_000_000

_Transfer = tuple[Sequence[int], int, int]
_Rank = tuple[_Transfer | None, int, _Transfer | None]


def completed_bytes(core: Core, port: int) -> list[int]:
    value = core.port_counters(port)["completed_bytes"]
    assert isinstance(value, list)
    return [int(x) for x in value]


def two_rank_core(load1_bytes: int, store0_bytes: int | None = None) -> tuple[Core, list[_Rank]]:
    """3 layers' worth of ranks on 1 GB/s ports (1 MB takes 1 ms): rank 0 loads 1 MB and computes 3 ms,
    rank 1 loads ``load1_bytes`` and computes 1 ms; rank 0 optionally stores ``store0_bytes``."""
    core = Core()
    l0 = core.add_port("pe0.cnic.rx", GB)
    l1 = core.add_port("pe1.cnic.rx", GB)
    store: _Transfer | None = None
    if store0_bytes is not None:
        store = ([core.add_port("pe0.cnic.tx", GB)], 2, store0_bytes)
    ranks: list[_Rank] = [(([l0], 2, MB), 3 * MS, store), (([l1], 2, load1_bytes), MS, None)]
    return core, ranks


# ---------------------------------------------------------------------------------------------------------
# Through the binding: hand-solved times (the cases of core/tests/forward.rs).


def test_compute_bound_forward_is_one_completion_at_16_ms() -> None:
    # Layer 0: attention 1→4 and 2→3 ms, shared 4→6; layer 1: 6→9 and 6→7, shared 9→11; layer 2: 11→14
    # and 11→12, shared 14→16. Loads (1, 2, 3 and 2, 4, 6 ms) hide behind compute.
    core, ranks = two_rank_core(2 * MB)
    assert core.submit_forwards([(3, ranks, 2 * MS, [], 0, 7)]) == 1
    assert core.pending() == 1
    seen = []
    while (step := core.step()) is not None:
        seen.extend(step[1])
    assert seen == [("forward", 7, 0, 16 * MS, 9 * MB, 0)], "the per-layer pieces are internal"
    assert [type(x) for x in seen[0]] == [str, int, int, int, int, int]
    assert core.pending() == 0
    assert completed_bytes(core, 1) == [0, 0, 6 * MB] + [0] * 13
    stats = core.stats()
    assert (stats["forwards"], stats["forward_transfers"], stats["forward_delays"]) == (1, 6, 9)
    assert stats["forward_instant_steps"] == 0


def test_load_bound_forward_waits_for_the_slowest_rank() -> None:
    # Rank 1's 10 MB loads end at 10, 20, 30 ms: attention 10→11, shared 11→13; 20→21, 21→23; 30→31, 31→33.
    core, ranks = two_rank_core(10 * MB)
    core.submit_forwards([(3, ranks, 2 * MS, [], 0, 1)])
    assert core.run_until_idle() == [("forward", 1, 0, 33 * MS, 33 * MB, 0)]


def test_a_lagging_store_stream_sets_the_end() -> None:
    # Rank 0's 7 MB stores start at 4 ms and run one after another: 4→11, 11→18, 18→25.
    core, ranks = two_rank_core(2 * MB, store0_bytes=7 * MB)
    core.submit_forwards([(3, ranks, 2 * MS, [], 0, 1)])
    assert core.run_until_idle() == [("forward", 1, 0, 25 * MS, 30 * MB, 0)]


def test_load_window_one_serialises_loads_and_compute() -> None:
    core, ranks = two_rank_core(2 * MB)
    core.submit_forwards([(3, ranks, 2 * MS, [], 1, 1)])
    assert core.run_until_idle()[0][3] == 18 * MS


def test_a_collective_takes_the_cnic_from_kv_under_the_paper_arbitration() -> None:
    # KV keeps 1/964 of the compute NIC while the 9.63 MB collective runs: it takes 9.64 ms per layer.
    core = Core()
    cnic = core.add_port("pe0.cnic.tx", GB, arbitration=Arbitration.paper())
    core.submit_transfers([([cnic], 2, 10 * MB, 100)])
    core.submit_forwards([(2, [(None, MS, None)], 2 * MS, [([cnic], 0, 9_630_000)], 0, 1)])
    done = {c[1]: Completion(*c) for c in core.run_until_idle()}
    assert done[1].kind == "forward"
    assert done[1].end_ns == pytest.approx(21.28e6, abs=3)
    assert done[100].end_ns == pytest.approx(29.26e6, abs=3)  # work conserving: 29.26 MB at 1 GB/s
    assert completed_bytes(core, cnic)[:3] == [2 * 9_630_000, 0, 10 * MB]


def test_a_forward_that_takes_no_time_completes_at_its_instant() -> None:
    core = Core()
    p = core.add_port("p", GB)
    core.advance_to(5)
    rank: _Rank = (([p], 0, 0), 0, None)
    core.submit_forwards([(4, [rank, (None, 0, None)], 0, [([p], 1, 0)], 0, 3)])
    assert core.take_completions() == []
    assert core.next_event_ns() == 5
    assert core.advance_to(5) == [("forward", 3, 5, 5, 0, 0)]


def test_named_tuples_lists_and_generators_are_accepted() -> None:
    core = Core()
    p = core.add_port("p", GB)
    ranks = (ForwardRank(load=LayerTransfer([p], 2, MB), attn_ns=MS) for _ in range(2))
    collectives = [LayerTransfer(path=(p,), lane=0, size_bytes=0)]
    core.submit_forwards(iter([cast(Any, [2, ranks, MS, collectives, 0, 9])]))
    # Two loads share the port (2 ms each), then 1 ms attention + 1 ms shared, per layer (loads hidden).
    assert core.run_until_idle() == [("forward", 9, 0, 6 * MS, 4 * MB, 0)]


# ---------------------------------------------------------------------------------------------------------
# Errors: the whole batch is checked first; the message names the part.


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (
            (1, [(([9], 0, 1), 0, None)], 0, [], 0, 2),
            UnknownNameError,
            "forwards[1].ranks[0].load.path: unknown port 9",
        ),
        ((1, [(None, -1, None)], 0, [], 0, 2), InvalidArgumentError, "forwards[1].ranks[0].attn_ns: an integer in"),
        ((1, [(None, 0, ([0], 0, 1.5))], 0, [], 0, 2), InvalidArgumentError, "forwards[1].ranks[0].store.size_bytes"),
        ((1, [(None, 0, None)], 0, [([0], 16, 1)], 0, 2), InvalidArgumentError, "forwards[1].collectives[0].lane"),
        ((1, [(None, 0, None)], 0, [(["x"], 0, 1)], 0, 2), InvalidArgumentError, "forwards[1].collectives[0].path[0]"),
        ((1, [(None, 0, None)], 0, [([0], 0)], 0, 2), InvalidArgumentError, "forwards[1].collectives[0]: a tuple"),
        ((1, [(None, 0)], 0, [], 0, 2), InvalidArgumentError, "forwards[1].ranks[0]: a tuple (load, attn_ns, store)"),
        ((1, 5, 0, [], 0, 2), InvalidArgumentError, "forwards[1].ranks: a sequence"),
        ((0, [(None, 0, None)], 0, [], 0, 2), InvalidArgumentError, "forwards[1].n_layers: at least 1"),
        ((1, [], 0, [], 0, 2), InvalidArgumentError, "forwards[1].ranks: at least one rank"),
        ((1, [(None, 0, None)], 0, [], 0), InvalidArgumentError, "forwards[1]: a tuple (n_layers"),
        ((1, [(None, 0, None)], 0, [], -1, 2), InvalidArgumentError, "forwards[1].load_window"),
    ],
)
def test_a_bad_forward_rejects_the_batch_and_names_its_part(bad: Any, error: type[Exception], message: str) -> None:
    core = Core()
    p = core.add_port("p", GB)
    good: Any = (1, [(([p], 0, MB), MS, None)], 0, [], 0, 1)
    with pytest.raises(error) as info:
        core.submit_forwards([good, bad])
    assert str(info.value).startswith(message), str(info.value)
    assert core.pending() == 0
    assert core.stats()["forwards"] == 0
    with pytest.raises(InvalidArgumentError, match="^forwards: an iterable"):
        core.submit_forwards(3)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# A property: with every transfer alone on its own ports, the end is the reference's.


def reference_end(n_layers: int, ranks: list[tuple[int, int, int]], ffn_ns: int, collectives: list[int]) -> int:
    """Ranks as (load_ns, attn_ns, store_ns), collectives as durations; no load window."""
    layer_end = 0
    load_end = [0] * len(ranks)
    store_end = [0] * len(ranks)
    for _ in range(n_layers):
        shared_start = 0
        for r, (load_ns, attn_ns, store_ns) in enumerate(ranks):
            load_end[r] += load_ns
            attn_end = max(load_end[r], layer_end) + attn_ns
            shared_start = max(shared_start, attn_end)
            store_end[r] = max(store_end[r], attn_end) + store_ns
        layer_end = shared_start + max([ffn_ns, *collectives])
    return max([layer_end, *store_end])


durations = st.integers(0, 5_000)  # microseconds: with 1 GB/s ports, kB and ns stay whole


@given(
    n_layers=st.integers(1, 6),
    ranks=st.lists(st.tuples(st.none() | durations, durations, st.none() | durations), min_size=1, max_size=4),
    ffn_us=durations,
    collectives=st.lists(durations, max_size=3),
)
def test_a_forward_alone_on_its_ports_ends_when_the_reference_says(
    n_layers: int, ranks: list[tuple[int | None, int, int | None]], ffn_us: int, collectives: list[int]
) -> None:
    core = Core()
    ports = iter(core.add_port(f"p{i}", GB) for i in range(100))

    def own(us: int | None) -> _Transfer | None:
        return None if us is None else ([next(ports)], 2, us * 1000)  # us microseconds at 1 GB/s

    spec_ranks: list[_Rank] = [(own(load), attn * 1000, own(store)) for load, attn, store in ranks]
    spec_collectives = [([next(ports)], 0, us * 1000) for us in collectives]
    core.submit_forwards([(n_layers, spec_ranks, ffn_us * 1000, spec_collectives, 0, 1)])
    done = core.run_until_idle()
    want = reference_end(
        n_layers,
        [((load or 0) * 1000, attn * 1000, (store or 0) * 1000) for load, attn, store in ranks],
        ffn_us * 1000,
        [us * 1000 for us in collectives],
    )
    total = n_layers * 1000 * (sum((load or 0) + (store or 0) for load, _, store in ranks) + sum(collectives))
    assert done == [("forward", 1, 0, want, total, 0)]


# ---------------------------------------------------------------------------------------------------------
# Through the loops: ``forward`` is a future of the completion, submitted once per batch.


class CountingCore:
    """A stand-in for a Core that counts the loop's submissions through the FFI boundary."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.calls: dict[str, int] = {"submit_transfers": 0, "submit_forwards": 0}

    def submit_transfers(self, transfers: Iterable[tuple[Sequence[int], int, int, int]]) -> int:
        self.calls["submit_transfers"] += 1
        return self.core.submit_transfers(transfers)

    def submit_forwards(self, forwards: Iterable[Any]) -> int:
        self.calls["submit_forwards"] += 1
        return self.core.submit_forwards(forwards)

    def advance_until(self, t_ns: int) -> list[tuple[str, int, int, int, int, int]]:
        return self.core.advance_until(t_ns)

    @property
    def now_ns(self) -> int:
        return self.core.now_ns

    def next_event_ns(self) -> int | None:
        return self.core.next_event_ns()


def test_a_bad_forward_fails_alone_in_the_loop() -> None:
    core = Core(clock="wall", time_scale=100.0)
    p = core.add_port("p", GB)

    async def main(plane: WallClockCore) -> list[Completion | BaseException]:
        good = plane.forward(1, [ForwardRank(load=LayerTransfer([p], 0, MB), attn_ns=MS)])
        bad = plane.forward(1, [ForwardRank(store=LayerTransfer([p + 5], 0, MB))])
        return list(await asyncio.gather(good, bad, return_exceptions=True))

    good, bad = run_realtime(main, core)
    assert isinstance(good, Completion) and (good.kind, good.end_ns - good.start_ns, good.size_bytes) == (
        "forward",
        2 * MS,
        MB,
    )
    assert isinstance(bad, UnknownNameError)
    assert str(bad) == "forwards[0].ranks[0].store.path: unknown port 5"


def test_real_time_loop_forward() -> None:
    core = Core(clock="wall", time_scale=100.0)
    p = core.add_port("p", GB)

    async def main(plane: WallClockCore) -> Completion:
        return await plane.forward(3, [ForwardRank(load=LayerTransfer([p], 0, MB), attn_ns=MS)], ffn_ns=MS)

    done = run_realtime(main, core)
    # Load 0 (1 ms), then 1 ms attention and 1 ms shared per layer: 7 ms of core time.
    assert (done.kind, done.end_ns - done.start_ns, done.size_bytes) == ("forward", 7 * MS, 3 * MB)
