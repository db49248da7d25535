"""Split reads (``dualpath-split``, issue 38; the paper's §6.1 open question): a long hit read on both sides at once,
the prefill side's first blocks and the decode side's rest, each part on its own path into the PE's HBM."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.faults import Fault, FaultPlan
from dualpath_emu.cluster.policies import Health, PolicyError, ReadView, Request, Split, SplitPolicy, check_read_side
from dualpath_emu.cluster.policies.dualpath import MIN_SPLIT_TOKENS
from dualpath_emu.cluster.run import run_system
from dualpath_emu.cluster.scheduler import Scheduler
from tests.cluster.test_cluster import small_config, trajectories


def req(hit: int, pooled: tuple[tuple[int, int], ...] = ()) -> Request:
    return Request(1, hit + 100, 100, hit, 10, 1, 1, pooled)


def test_the_split_policy_levels_the_read_queues_in_whole_blocks() -> None:
    policy = SplitPolicy()
    hit = 64 * BLOCK_TOKENS
    # Equal queues: half each (the prefill side's part whole blocks from the start).
    assert policy.read_side(ReadView(req(hit), 0, 2, {0: 0, 2: 0})) == Split(hit // 2)
    # The prefill side 1,280 tokens behind: it reads 20 blocks fewer, so both end together.
    assert policy.read_side(ReadView(req(hit), 0, 2, {0: 1280, 2: 0})) == Split(hit // 2 + 640)
    # Far behind on one side: the other reads it all (as DualPath's rule: the shorter queue).
    assert policy.read_side(ReadView(req(hit), 0, 2, {0: 10 * hit, 2: 0})) == "de"
    assert policy.read_side(ReadView(req(hit), 0, 2, {0: 0, 2: 10 * hit})) == "pe"
    # A short hit, one the DRAM pool holds part of, or a storage NIC down: read whole, as DualPath's.
    assert policy.read_side(ReadView(req(MIN_SPLIT_TOKENS - 1), 0, 2, {})) == "de"
    assert policy.read_side(ReadView(req(hit, ((5, 64),)), 0, 2, {})) == "de"
    assert policy.read_side(ReadView(req(hit), 0, 2, {}, Health({"n2.snic.rx": 0.0}))) == "pe"


@pytest.mark.parametrize(
    ("answer", "why"),
    [(Split(0), r"in \(0, 4096\)"), (Split(4096), r"in \(0, 4096\)"), (Split(100), "not whole Full Blocks"),
     (Split(True), "an int"), (Split(2048), "")],
)  # fmt: skip
def test_a_split_is_checked(answer: Split, why: str) -> None:
    view = ReadView(req(4096), 0, 2, {})
    if not why:
        check_read_side("p", answer, view, True)
        with pytest.raises(PolicyError, match="expected 'pe'"):
            check_read_side("p", answer, view, False)  # a single-path system reads on the prefill side only
        with pytest.raises(PolicyError, match="DRAM pool holds part"):
            check_read_side("p", answer, ReadView(req(4096, ((5, 64),)), 0, 2, {}), True)
        return
    with pytest.raises(PolicyError, match=why):
        check_read_side("p", answer, view, True)


def test_split_reads_read_every_hit_byte_once_on_both_sides() -> None:
    config, work = small_config(), trajectories()
    whole = run_system(config, "dualpath", work)
    split = run_system(config, "dualpath-split", work)
    assert split.complete and split.turns_done == whole.turns_done
    sides = [split.metrics.read_on_de[i] for i in range(len(split.metrics))]
    assert sides.count(2) > 10 and sides.count(0) and sides.count(1)  # split, prefill-side and decode-side reads
    # Every hit byte read once, whichever side reads which part.
    assert sum(split.snic_read_bytes.values()) == pytest.approx(sum(whole.snic_read_bytes.values()), rel=1e-6)
    assert split.snic_read_bytes["pe"] > whole.snic_read_bytes["pe"]  # the prefill side takes part of long hits


@pytest.mark.fifo_only
def test_on_the_storage_bound_cluster_splitting_long_hits_shortens_the_run() -> None:
    config, work = small_config(), trajectories()
    assert run_system(config, "dualpath-split", work).jct_s < 0.97 * run_system(config, "dualpath", work).jct_s


def flickers(target: str) -> tuple[Fault, ...]:
    """A storage NIC down for 50 ms every 0.7 s: split reads in flight lose one side, with either part read."""
    return tuple(Fault("down", target, 0.2 + 0.7 * i, 0.05) for i in range(12))


@pytest.mark.parametrize(
    "faults",
    [flickers("n0.snic"), flickers("n1.snic"), flickers("n2.snic"), (Fault("down", "n0.snic", 0.5, 2.0),),
     (Fault("crash", "de1", 1.0, restart_s=1.0),), (Fault("crash", "pe0", 1.0, restart_s=1.0),)],
)  # fmt: skip
def test_a_split_read_survives_either_sides_storage_nic_going_down_and_crashes(
    faults: tuple[Fault, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A side whose storage NIC goes down hands its part to the other (read whole there if its own part is still
    # under way, else only the part it lacks); a crash loses the request, dispatched again. The flickering NICs
    # take every one of those paths (seen by hand: 12 moves from each side, with and without the part read).
    # Every invariant is checked by the run; the read queues must drain to zero, every part counted once.
    schedulers: list[Scheduler] = []
    init = Scheduler.__init__

    def keep(self: Scheduler, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        schedulers.append(self)

    monkeypatch.setattr(Scheduler, "__init__", keep)
    config = dataclasses.replace(small_config(), faults=FaultPlan(faults))
    result = run_system(config, "dualpath-split", trajectories())
    assert result.turns_done + result.failed_requests == result.turns and result.turns_done > 0
    assert set(schedulers[0].read_q.values()) <= {0}
