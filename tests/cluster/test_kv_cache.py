"""Where the KV lives (:mod:`dualpath_emu.cluster.kv_cache`): a bounded store's index and eviction policies alone,
then whole runs whose store is smaller than their working set (they evict, compute the lost hits again, lose no
request and pass every invariant), under random capacities, policies and faults."""

from __future__ import annotations

import csv
import gzip
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from dualpath_emu.cli import main
from dualpath_emu.cluster.config import BLOCK_TOKENS, KvPoolSpec, KvTierSpec
from dualpath_emu.cluster.faults import Fault
from dualpath_emu.cluster.invariants import EventLogChecker
from dualpath_emu.cluster.kv_cache import EvictionError, HbmRetention, KvIndex, LruEviction, per_node
from dualpath_emu.cluster.observations import HitFound, KvEvicted, KvStored, KvTaken, KvTier, KvWritePolicy, KvWritten
from dualpath_emu.cluster.run import run_system
from dualpath_emu.runtime.engine import Watch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cluster.test_faults import CONFIG, with_faults, work

BLOCK = 1000  # bytes a block, in the index's unit tests


def index(capacity_blocks: int, eviction: str = "lru", ttl_s: float = 0.0) -> tuple[KvIndex, list[Any]]:
    seen: list[Any] = []
    kv = KvIndex("store", KvTierSpec(capacity_blocks * BLOCK, eviction, ttl_s), BLOCK, seen.append)
    kv.start()
    return kv, seen


def checked(seen: list[Any]) -> list[str]:
    checker = EventLogChecker()
    checker.feed_observed([(0, "scheduler", r) for r in seen], 0)
    return checker.violations


def test_a_full_store_drops_the_tail_of_the_least_recently_used_context() -> None:
    kv, seen = index(10)
    kv.store(1, 4, now_ns=1)
    kv.store(2, 4, now_ns=2)
    assert kv.find(0, 1, 4 * BLOCK_TOKENS, now_ns=3) == 4 * BLOCK_TOKENS  # a use: context 1 is now the recent one
    kv.store(3, 5, now_ns=4)  # 3 blocks must go: context 2's last three
    assert kv.blocks == {1: 4, 2: 1, 3: 5} and kv.used_bytes == 10 * BLOCK
    assert KvEvicted("store", 2, 1, 3) in seen
    # Context 2's hit of 4 blocks: one is left, the rest is computed again.
    assert kv.find(1, 2, 4 * BLOCK_TOKENS, now_ns=5) == BLOCK_TOKENS
    assert seen[-1] == HitFound(1, 2, "store", BLOCK_TOKENS, 3 * BLOCK_TOKENS)
    assert seen[0] == KvTier("store", 10 * BLOCK, BLOCK) and checked(seen) == []


def test_a_whole_context_is_found_with_its_partial_last_block() -> None:
    kv, _ = index(10)
    kv.store(1, 2, now_ns=1)
    assert kv.find(0, 1, 2 * BLOCK_TOKENS + 10, now_ns=2) == 2 * BLOCK_TOKENS + 10
    assert kv.find(1, 7, 300, now_ns=2) == 0  # never stored


def test_a_pinned_context_is_never_evicted_and_what_does_not_fit_is_not_held() -> None:
    kv, seen = index(6)
    kv.store(1, 4, now_ns=1)
    kv.pin(1)  # a request of context 1 is in flight
    kv.store(2, 5, now_ns=2)  # only 2 blocks fit
    assert kv.blocks == {1: 4, 2: 2}
    kv.unpin(1)
    kv.store(2, 5, now_ns=3)  # now context 1 can give 3 blocks
    assert kv.blocks == {1: 1, 2: 5} and checked(seen) == []


def test_a_turn_whose_end_the_scheduler_has_not_heard_of_yet_has_written_its_blocks_through() -> None:
    # Live (or with shuffled delivery), the client can submit an agent's next turn before the scheduler hears that
    # the last one ended: the last one's blocks were written through as made, so the next finds them.
    kv, seen = index(100)
    kv.pin(1, blocks=6)  # turn 0 of context 1: 6 blocks when it ends
    assert kv.find(1, 1, 6 * BLOCK_TOKENS, now_ns=5) == 6 * BLOCK_TOKENS  # turn 1, before turn 0's end is heard of
    kv.pin(1, blocks=9)
    kv.unpin(1)  # turn 0's end arrives
    kv.store(1, 6, now_ns=6)  # nothing new
    kv.unpin(1)
    kv.store(1, 9, now_ns=7)
    assert kv.blocks == {1: 9} and checked(seen) == []


def test_tool_wait_drops_done_agents_contexts_before_waiting_ones() -> None:
    kv, _ = index(8, "tool_wait")
    kv.store(1, 4, now_ns=1)  # waiting for its tool
    kv.store(2, 4, now_ns=2, last=True)  # done: the more recent, yet it goes first
    kv.store(3, 4, now_ns=3)
    assert kv.blocks == {1: 4, 3: 4}
    lru, _ = index(8)
    lru.store(1, 4, now_ns=1)
    lru.store(2, 4, now_ns=2, last=True)
    lru.store(3, 4, now_ns=3)
    assert lru.blocks == {2: 4, 3: 4}


def test_ttl_drops_an_idle_context_when_its_time_runs_out_unless_used_or_pinned() -> None:
    kv, seen = index(100, "ttl", ttl_s=1.0)
    kv.store(1, 4, now_ns=0)
    kv.store(2, 4, now_ns=0)
    assert kv.next_expiry_ns(1) == 1_000_000_000
    kv.find(0, 2, 64, now_ns=500_000_000)  # used: its time starts again
    kv.pin(2)
    kv.expire(1, 999_999_999)  # too early
    assert kv.blocks == {1: 4, 2: 4}
    kv.expire(1, 1_000_000_000)
    kv.expire(2, 2_000_000_000)  # pinned: stays
    assert kv.blocks == {2: 4} and KvEvicted("store", 1, 0, 4) in seen and checked(seen) == []
    with pytest.raises(ValueError, match="ttl_s > 0"):
        index(10, "ttl")
    # A time to live holds with any policy (as decode HBM's does): tool_wait's context idle for 2 s goes.
    kv, seen = index(100, "tool_wait", ttl_s=2.0)
    kv.store(1, 4, now_ns=0)
    assert kv.next_expiry_ns(1) == 2_000_000_000
    kv.expire(1, 2_000_000_000)
    assert kv.blocks == {} and KvEvicted("store", 1, 0, 4) in seen
    assert index(100, "lru")[0].next_expiry_ns(1) is None  # none given: kept until its room is needed


def test_an_eviction_policy_that_names_a_pinned_context_is_refused() -> None:
    class Careless(LruEviction):
        def victim(self, pinned: Any) -> int | None:
            return 1

    seen: list[Any] = []
    kv = KvIndex("store", KvTierSpec(4 * BLOCK), BLOCK, seen.append, Careless(KvTierSpec()))
    kv.store(1, 4, now_ns=0)
    kv.pin(1)
    with pytest.raises(ValueError, match="chose context 1, which the store tier may not drop"):
        kv.store(2, 2, now_ns=1)


def test_the_checker_catches_a_tier_over_capacity_a_gap_and_a_hit_beyond_what_is_held() -> None:
    seen = [KvTier("store", 4 * BLOCK, BLOCK), KvStored("store", 1, 0, 3), KvStored("store", 2, 0, 2),
            KvStored("store", 1, 5, 1), KvEvicted("store", 2, 0, 1), HitFound(0, 2, "store", 2 * BLOCK_TOKENS, 0),
            HitFound(1, 1, "store", 6 * BLOCK_TOKENS + 7, 0)]  # fmt: skip
    violations = checked(seen)
    assert any("over capacity: 5 > 4 blocks" in v for v in violations)
    assert any("stored blocks 5+1 after holding [0, 3)" in v for v in violations)
    assert any("evicted blocks 0+1 while holding [0, 2)" in v for v in violations)
    assert any("request 0 found 128 hit tokens of context 2 in store, which holds 0 blocks" in v for v in violations)
    assert not any("request 1" in v for v in violations)  # context 1's 6 blocks and a partial one: all there


# --- whole runs ----------------------------------------------------------------------------------------------


def bounded(capacity: int, eviction: str = "lru", ttl_s: float = 0.0, config: Any = CONFIG) -> Any:
    return dataclasses.replace(config, kv_store=KvTierSpec(capacity, eviction, ttl_s))


def test_the_pool_places_blocks_on_the_node_that_wrote_them_and_evicts_from_the_tail() -> None:
    seen: list[Any] = []
    pool = KvIndex("pool", KvTierSpec(10 * BLOCK), BLOCK, seen.append, placed=True)
    pool.start()
    pool.store(1, 3, now_ns=1, node=4)  # a first turn decoded on node 4
    pool.store(1, 5, now_ns=2, node=5)  # the next on node 5: blocks 3-4 are there
    pool.store(1, 6, now_ns=3, node=4)
    assert per_node(pool.where(1, 6 * BLOCK_TOKENS)) == ((4, 4 * BLOCK_TOKENS), (5, 2 * BLOCK_TOKENS))
    assert per_node(pool.where(1, 4 * BLOCK_TOKENS)) == ((4, 3 * BLOCK_TOKENS), (5, BLOCK_TOKENS))
    partial = per_node(pool.where(1, 6 * BLOCK_TOKENS + 7))  # a partial last block: with the last block's node
    assert partial == ((4, 4 * BLOCK_TOKENS + 7), (5, 2 * BLOCK_TOKENS))
    # Run by run, in block order (what a reading engine takes from each node).
    assert pool.where(1, 6 * BLOCK_TOKENS + 7) == (4, 3 * BLOCK_TOKENS, 5, 2 * BLOCK_TOKENS, 4, BLOCK_TOKENS + 7)
    pool.store(2, 7, now_ns=4, node=0)  # 3 blocks must go: context 1's tail, blocks 3-5
    assert pool.blocks == {1: 3, 2: 7} and pool.where(1, 3 * BLOCK_TOKENS) == (4, 3 * BLOCK_TOKENS)
    assert KvIndex("store", KvTierSpec(10 * BLOCK), BLOCK, seen.append).where(1, 64) == ()  # a tier that does not place
    # A turn still in flight when the next one is found (its end not heard yet): the store holds the blocks it wrote
    # through, the pool only once the turn's end says which node holds them (found by dualpath-emu check).
    pool.pin(2, blocks=9)
    assert pool.find(5, 2, 9 * BLOCK_TOKENS, now_ns=5) == 7 * BLOCK_TOKENS and pool.blocks[2] == 7
    with pytest.raises(ValueError, match="without the node"):
        pool.store(2, 9, now_ns=6)
    pool.placed(2, node=3)  # its decode engine is known: the blocks it writes are on node 3
    assert pool.find(6, 2, 9 * BLOCK_TOKENS, now_ns=7) == 9 * BLOCK_TOKENS
    assert pool.where(2, 9 * BLOCK_TOKENS) == (0, 7 * BLOCK_TOKENS, 3, 2 * BLOCK_TOKENS)
    assert checked(seen) == []


def test_a_pool_that_writes_back_writes_its_dirty_blocks_from_their_node_when_it_drops_them_or_has_no_room() -> None:
    seen: list[Any] = []
    written: list[tuple[int, Any]] = []
    held: dict[int, set[tuple[int, int]]] = {}  # what each node's DRAM holds, as the pool tells it

    def on_node(node: int, put: Any, drop: Any, write: Any) -> None:
        mine = held.setdefault(node, set())
        for context, first, count in drop:
            assert {(context, b) for b in range(first, first + count)} <= mine  # a node drops only what it holds
            mine -= {(context, b) for b in range(first, first + count)}
        for context, first, count in put:
            mine |= {(context, b) for b in range(first, first + count)}
        if write:
            written.append((node, write))

    pool = KvIndex("pool", KvTierSpec(10 * BLOCK), BLOCK, seen.append, placed=True, on_node=on_node,
                   write_back=True)  # fmt: skip
    pool.start()
    pool.store(1, 4, now_ns=1, node=4)  # a first turn, decoded on node 4: the blocks it made are dirty
    pool.store(1, 6, now_ns=2, node=5, clean=5)  # the next, on node 5: read block 4 from storage (clean), made 5
    pool.store(2, 3, now_ns=3, node=0, clean=2)  # read blocks 0-1 from storage, made block 2
    assert written == []  # nothing has left the pool: nothing is written
    pool.store(3, 5, now_ns=4, node=1)  # 4 blocks must go: context 1's tail (blocks 2-5), the least recently used
    assert pool.blocks == {1: 2, 2: 3, 3: 5}
    assert written == [(4, ((1, 2, 2),)), (5, ((1, 5, 1),))]  # block 4 was clean: not written again
    # 6 more: context 1 goes (2 dirty blocks on node 4), then context 2 (block 2 dirty on node 0, blocks 0-1
    # clean), then one block of context 3.
    pool.store(4, 6, now_ns=5, node=2, clean=1)
    assert written[2:] == [(4, ((1, 0, 2),)), (0, ((2, 2, 1),)), (1, ((3, 4, 1),))]
    # A pinned context of 20 blocks, 2 of them read from storage: every other block goes, and the 10 that do not
    # fit are written from its node at once.
    pool.pin(5, blocks=20)
    pool.store(5, 20, now_ns=6, node=3, clean=2)
    assert pool.blocks == {5: 10}
    assert written[5:] == [(1, ((3, 0, 4),)), (2, ((4, 1, 5),)), (3, ((5, 10, 10),))]
    assert {n: h for n, h in held.items() if h} == {3: {(5, b) for b in range(10)}}  # the nodes hold what it does
    assert pool.where(5, 10 * BLOCK_TOKENS) == (3, 10 * BLOCK_TOKENS)
    assert [r for r in seen if isinstance(r, KvWritePolicy)] == [KvWritePolicy("pool", "back")]
    assert [(r.node, ((r.context, r.first, r.blocks),)) for r in seen if isinstance(r, KvWritten)] == written
    assert checked(seen) == []
    with pytest.raises(ValueError, match="must place"):
        KvIndex("store", KvTierSpec(BLOCK), BLOCK, seen.append, write_back=True)
    with pytest.raises(ValueError, match="needs on_node"):
        KvIndex("pool", KvTierSpec(BLOCK), BLOCK, seen.append, placed=True, write_back=True)


def test_a_pool_that_writes_back_writes_a_block_once_however_often_its_turn_is_stored() -> None:
    # A turn's blocks are stored when its next turn finds them first (its end not heard yet) and again at its end:
    # what did not fit was written the first time, and is clean the second (found by make test-orders).
    seen: list[Any] = []
    written: list[Any] = []
    pool = KvIndex("pool", KvTierSpec(4 * BLOCK), BLOCK, seen.append, placed=True, write_back=True,
                   on_node=lambda node, put, drop, write: written.extend(write))  # fmt: skip
    pool.start()
    pool.store(1, 10, now_ns=0, node=2)
    pool.store(1, 10, now_ns=1, node=2)
    assert written == [(1, 4, 6)] and pool.blocks == {1: 4}
    pool.store(2, 4, now_ns=2, node=3)  # context 1's 4 dirty blocks go to storage: all of it is there now
    pool.store(1, 12, now_ns=3, node=2, clean=0)  # stored again (read back, then 2 new blocks made): context 2
    # goes, then blocks 0-3 are held, clean, and only the 2 new ones are written: blocks 0-9 are in storage.
    assert written[1:] == [(1, 0, 4), (2, 0, 4), (1, 10, 2)]
    assert checked(seen) == []
    seen.append(KvWritten("pool", 2, 1, 3, 2))  # a block written twice: the checker says so
    assert any("some of which storage held already" in v for v in checked(seen))


def test_the_checker_catches_a_hit_read_from_storage_that_a_pool_writing_back_never_wrote() -> None:
    seen = [KvTier("pool", 10 * BLOCK, BLOCK), KvWritePolicy("pool", "back"), KvStored("pool", 1, 0, 4),
            KvEvicted("pool", 1, 1, 3), KvWritten("pool", 0, 1, 1, 2),  # block 3 dropped, never written
            HitFound(0, 1, "pool", BLOCK_TOKENS, 2 * BLOCK_TOKENS), HitFound(1, 1, "pool", BLOCK_TOKENS, 3 * BLOCK_TOKENS)]  # fmt: skip
    violations = checked(seen)
    assert len(violations) == 1 and "request 1 reads blocks 1-3 of context 1 from storage" in violations[0]
    assert "never given blocks 3-3" in violations[0]


def test_decode_hbm_keeps_a_context_until_its_room_is_needed_and_hands_it_to_the_next_turn_on_that_gpu() -> None:
    seen: list[Any] = []
    hbm = HbmRetention(engines=4, gpus=2, hbm_bytes=10 * BLOCK, block_bytes=BLOCK, observe=seen.append)
    hbm.start()
    hbm.keep(1, 3 * BLOCK_TOKENS + 5, de=2, room_bytes=10 * BLOCK)  # 4 blocks (the partial one too)
    hbm.keep(2, 3 * BLOCK_TOKENS, de=2, room_bytes=10 * BLOCK)
    assert dict(hbm.on_view) == {1: 2, 2: 2} and dict(hbm.node_view) == {1: 1, 2: 1}
    hbm.make_room(2, 5 * BLOCK)  # running requests need DE 2's HBM: the least recently kept goes first
    assert dict(hbm.on_view) == {2: 2} and KvEvicted("hbm", 1, 0, 4) in seen
    hbm.keep(3, 2 * BLOCK_TOKENS, de=3, room_bytes=BLOCK)  # no room at all: nothing kept
    assert 3 not in hbm.on_view
    assert hbm.take(7, 2, 3 * BLOCK_TOKENS, de=2)  # the next turn on the same DE takes it over
    assert seen[-2:] == [HitFound(7, 2, "hbm", 3 * BLOCK_TOKENS, 0), KvTaken("hbm", 2, 3)] and not hbm.on_view
    hbm.keep(2, 4 * BLOCK_TOKENS, de=2, room_bytes=10 * BLOCK)
    assert not hbm.take(8, 2, 4 * BLOCK_TOKENS, de=3)  # given another DE: the kept copy is dropped
    assert seen[-2:] == [KvEvicted("hbm", 2, 0, 4), HitFound(8, 2, "hbm", 0, 4 * BLOCK_TOKENS)]
    hbm.keep(5, BLOCK_TOKENS, de=1, room_bytes=10 * BLOCK)
    hbm.drop_engines(range(0, 2))  # node 0's engines crashed
    assert not hbm.on_view
    # A time to live drops a copy not taken over in time, not a later copy of the same context.
    assert hbm.keep(6, BLOCK_TOKENS, de=2, room_bytes=10 * BLOCK, now_ns=100)
    assert hbm.keep(6, 2 * BLOCK_TOKENS, de=3, room_bytes=10 * BLOCK, now_ns=200)
    hbm.expire(6, kept_ns=100, now_ns=150)
    assert dict(hbm.on_view) == {6: 3}
    hbm.expire(6, kept_ns=200, now_ns=250)
    assert not hbm.on_view and checked(seen) == []


@pytest.mark.fifo_only  # every later turn finds its KV only if its Submit never overtakes its last turn's end
def test_retention_with_affinity_loads_every_kept_hit_from_decode_hbm_and_reads_nothing() -> None:
    trajectories = work(16, 5)
    plain = run_system(CONFIG, "dualpath", trajectories)
    kept = run_system(CONFIG, "dualpath+retention", trajectories)
    hbm = kept.extra["kv"]["hbm"]
    assert kept.complete and kept.turns_done == plain.turns_done and set(kept.extra["kv"]) == {"hbm"}
    # Zero waits and room to spare: every later turn finds its KV on its DE, and nothing is read from storage.
    assert hbm["found_rate"] == 1.0 and hbm["taken_bytes"] > 0 and sum(kept.snic_read_bytes.values()) == 0
    assert kept.hit_rate == plain.hit_rate and sum(plain.snic_read_bytes.values()) > 0


def test_retention_with_little_hbm_to_spare_drops_kept_kv_and_reads_the_rest() -> None:
    # Most of the HBM reserved, more agents: contexts are dropped for running requests and their next turns read
    # their hits as DualPath does.
    tight, more = dataclasses.replace(CONFIG, de_hbm_reserve_fraction=0.99), work(48, 5)
    squeezed = run_system(tight, "dualpath+retention", more)
    hbm = squeezed.extra["kv"]["hbm"]
    assert squeezed.complete and hbm["evictions"] > 0 and 0 < hbm["found_rate"] < 1
    read = sum(run_system(tight, "dualpath", more).snic_read_bytes.values())
    assert 0 < sum(squeezed.snic_read_bytes.values()) < read


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reserve=st.sampled_from([0.1, 0.99]), wait_s=st.sampled_from([0.0, 2.0]),
    store_blocks=st.sampled_from([0, 300, 3_000]), crash=st.sampled_from(["", "de1", "pe0"]),
)  # fmt: skip
def test_any_retention_headroom_wait_store_and_crash_loses_no_request_and_holds_every_invariant(
    reserve: float, wait_s: float, store_blocks: int, crash: str
) -> None:
    from dualpath_emu.workload.waits import ToolWait

    block_bytes = BLOCK_TOKENS * CONFIG.model.kv_bytes_per_token
    config = dataclasses.replace(bounded(store_blocks * block_bytes), de_hbm_reserve_fraction=reserve,
                                 tool_wait=ToolWait("exponential", wait_s) if wait_s else ToolWait())  # fmt: skip
    if crash:
        config = with_faults(Fault("crash", crash, 1.0, restart_s=2.0), config=config)
    result = run_system(config, "dualpath+retention", work(24, 4))  # raises on a lost request or a broken invariant
    kv = result.extra["kv"]["hbm"]
    assert result.turns_done + result.failed_requests == result.turns
    assert kv["stored_bytes"] - kv["evicted_bytes"] - kv["taken_bytes"] == kv["end_bytes"]
    assert kv["hit_tokens_found"] + kv["missed_tokens"] == kv["hit_tokens_asked"]


def test_decode_hbm_drops_what_its_eviction_policy_chooses_a_users_too(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(
        "from dualpath_emu.cluster.kv_cache import LruEviction\n\n"
        "class Newest(LruEviction):\n    name = 'newest'\n\n"
        "    def victim(self, pinned):\n        return next((c for c in reversed(self._order) if c not in pinned), None)\n\n"
        "class Stranger(LruEviction):\n    name = 'stranger'\n\n    def victim(self, pinned):\n        return 999\n"
    )  # fmt: skip
    seen: list[Any] = []
    hbm = HbmRetention(4, 2, 10 * BLOCK, BLOCK, seen.append, KvTierSpec(0, f"{tmp_path}/mine.py:Newest"))
    hbm.start()
    for context in (1, 2, 3):
        hbm.keep(context, 3 * BLOCK_TOKENS, de=0, room_bytes=10 * BLOCK)
    hbm.make_room(0, 6 * BLOCK)  # the newest goes first, not the least recently kept
    assert dict(hbm.on_view) == {1: 0, 2: 0} and checked(seen) == []
    odd = HbmRetention(4, 2, 10 * BLOCK, BLOCK, seen.append, KvTierSpec(0, f"{tmp_path}/mine.py:Stranger"))
    odd.keep(1, BLOCK_TOKENS, de=0, room_bytes=10 * BLOCK)
    with pytest.raises(EvictionError, match="chose context 999, which DE 0 does not keep"):
        odd.make_room(0, 0)


def test_a_time_to_live_shorter_than_the_tool_waits_drops_kept_kv_before_its_next_turn() -> None:
    from dualpath_emu.cluster.config import KvHbmSpec
    from dualpath_emu.workload.waits import ToolWait

    config = dataclasses.replace(CONFIG, tool_wait=ToolWait("constant", 5.0))
    kept = run_system(config, "dualpath+retention", work(16, 4)).extra["kv"]["hbm"]
    short = run_system(dataclasses.replace(config, kv_hbm=KvHbmSpec(ttl_s=1.0)), "dualpath+retention", work(16, 4))
    hbm = short.extra["kv"]["hbm"]
    assert kept["found_rate"] == 1.0 and hbm["found_rate"] == 0.0 and hbm["evictions"] > 0
    assert short.complete and sum(short.snic_read_bytes.values()) > 0


def test_a_scenario_gives_any_layerwise_system_decode_retention(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.toml"
    path.write_text('kind = "cluster"\n[deployment]\nmodel = "ds27b"\npe_nodes = 1\nde_nodes = 1\nprefill_ep_nodes = 1\n'
                    'decode_ep_nodes = 1\n[workload]\nagents = 8\nmax_rounds = 3\n[kv.hbm]\nsystems = ["dualpath"]\n')  # fmt: skip
    assert main(["run", str(path), "--json", "--system", "dualpath,basic+layerwise+dualpath"]) == 0
    systems = json.loads(capsys.readouterr().out)["systems"]
    assert systems["dualpath"]["kv"]["hbm"]["found_rate"] > 0 and "kv" not in systems["basic+layerwise+dualpath"]
    assert main(["run", str(path), "--system", "basic"]) == 0  # not named: nothing to check
    capsys.readouterr()
    path.write_text(path.read_text().replace('["dualpath"]', '["basic"]'))  # basic is one of the default systems
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "s.toml: key 'kv.hbm.systems': expected systems with layerwise prefill" in err and err.count("\n") == 1
    path.write_text('systems = ["dualpath"]\n' + path.read_text())
    assert main(["run", str(path), "--system", "basic"]) == 2
    err = capsys.readouterr().err
    assert "--system 'basic': it has no layerwise prefill, which keeping KV in decode HBM" in err
    assert err.count("\n") == 1


def pooled(config: Any = CONFIG, bytes_per_node: int = 10**13, **pool: Any) -> Any:
    return dataclasses.replace(config, kv_pool=KvPoolSpec(bytes_per_node, **pool))


def test_sglmc_reads_its_hits_from_the_pool_and_from_storage_what_a_small_pool_lacks() -> None:
    trajectories = work(16, 5)
    basic = run_system(CONFIG, "basic", trajectories)
    ample = run_system(pooled(), "sglmc", trajectories)
    kv = ample.extra["kv"]["pool"]
    # Every hit is in the pool: nothing is read from storage, and no other tier is there to say anything.
    assert set(ample.extra["kv"]) == {"pool"} and kv["found_rate"] == 1.0 and kv["evictions"] == 0
    assert ample.snic_read_bytes == {"pe": 0, "de": 0} and basic.snic_read_bytes["pe"] > 0
    assert ample.hit_rate == basic.hit_rate and sum(ample.metrics.recomputed) == 0
    assert kv["found_bytes"] == kv["hit_tokens_found"] * CONFIG.model.kv_bytes_per_token
    small = run_system(pooled(bytes_per_node=int(basic.working_set_bytes["max"] / 8)), "sglmc", trajectories)
    kv = small.extra["kv"]["pool"]
    assert small.complete and small.turns_done == basic.turns_done
    assert kv["evictions"] > 0 and kv["peak_bytes"] <= kv["capacity_bytes"] and 0 < kv["found_rate"] < 1
    # What the pool lacks comes from storage (unbounded: nothing is computed again), on the prefill side only.
    assert small.hit_rate == basic.hit_rate and sum(small.metrics.recomputed) == 0
    stored = kv["missed_tokens"] * CONFIG.model.kv_bytes_per_token
    assert small.snic_read_bytes == pytest.approx({"pe": stored, "de": 0}, rel=0.01)
    # The pool's capacity is every node's together.
    assert kv["capacity_bytes"] == 2 * int(basic.working_set_bytes["max"] / 8)


def test_a_pool_that_writes_back_writes_to_storage_only_what_it_drops_and_reads_it_back_from_there() -> None:
    trajectories = work(16, 5)
    through = run_system(pooled(), "sglmc", trajectories)
    ample = run_system(pooled(write="back"), "sglmc", trajectories)
    # A pool that never drops anything writes nothing to storage; written through, every turn's blocks go there.
    assert through.snic_write_bytes["de"] > 0 and ample.snic_write_bytes == {"pe": 0, "de": 0}
    assert ample.extra["kv"]["pool"]["written_back_bytes"] == 0 and ample.extra["kv"]["pool"]["found_rate"] == 1.0
    assert "written_back_bytes" not in through.extra["kv"]["pool"]
    small = pooled(bytes_per_node=int(through.working_set_bytes["max"] / 8))
    through = run_system(small, "sglmc", trajectories)
    back = run_system(dataclasses.replace(small, kv_pool=dataclasses.replace(small.kv_pool, write="back")), "sglmc",
                      trajectories)  # fmt: skip
    kv = back.extra["kv"]["pool"]
    # A small pool drops blocks; those it made go to storage then, from the decode node holding them, and the hits
    # it lacks are read from there (the checker follows every block: none is read that was not written).
    assert back.complete and back.hit_rate == through.hit_rate and sum(back.metrics.recomputed) == 0
    assert kv["written_back_bytes"] > 0 and kv["write_backs"] > 0 and 0 < kv["found_rate"] < 1
    assert back.snic_write_bytes == pytest.approx({"pe": 0, "de": kv["written_back_bytes"]}, rel=1e-6)
    assert back.snic_write_bytes["de"] < through.snic_write_bytes["de"]  # the blocks read back were not written again
    assert back.snic_read_bytes["pe"] == pytest.approx(kv["missed_tokens"] * CONFIG.model.kv_bytes_per_token, rel=0.01)


def test_a_pool_over_a_bounded_store_finds_what_either_holds_and_recomputes_the_rest() -> None:
    trajectories = work(16, 5)
    plain = run_system(CONFIG, "dualpath", trajectories)
    cap = int(plain.working_set_bytes["max"] / 5)
    config = pooled(bounded(cap), bytes_per_node=cap // 4, systems=("dualpath",))
    result = run_system(config, "dualpath", trajectories)
    pool, store = result.extra["kv"]["pool"], result.extra["kv"]["store"]
    assert pool["hit_tokens_asked"] == store["hit_tokens_asked"] == sum(plain.metrics.hit)
    recomputed = sum(result.metrics.recomputed)
    assert 0 < recomputed <= min(pool["missed_tokens"], store["recomputed_tokens"])
    assert sum(result.metrics.hit) + recomputed == sum(plain.metrics.hit)
    assert run_system(config, "basic", trajectories).extra["kv"].keys() == {"store"}  # not given the pool


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool_blocks=st.integers(1, 3_000), store_blocks=st.integers(0, 3_000),
    eviction=st.sampled_from(["lru", "ttl", "tool_wait"]), system=st.sampled_from(["sglmc", "dualpath"]),
    crash=st.booleans(), write=st.sampled_from(["through", "back"]),
)  # fmt: skip
def test_any_pool_size_store_and_crash_loses_no_request_and_holds_every_invariant(
    pool_blocks: int, store_blocks: int, eviction: str, system: str, crash: bool, write: str
) -> None:
    block_bytes = BLOCK_TOKENS * CONFIG.model.kv_bytes_per_token
    if write == "back":
        store_blocks = 0  # (a bounded store takes no write-backs)
    config = pooled(bounded(store_blocks * block_bytes), pool_blocks * block_bytes // 2, eviction=eviction,
                    ttl_s=5.0 if eviction == "ttl" else 0.0, systems=("dualpath",), write=write)  # fmt: skip
    if crash:
        config = with_faults(Fault("crash", "de1", 1.0, restart_s=2.0), config=config)
    result = run_system(config, system, work(8, 4))  # raises on a lost request or a broken invariant
    kv = result.extra["kv"]["pool"]
    assert result.turns_done + result.failed_requests == result.turns
    assert kv["peak_bytes"] <= kv["capacity_bytes"] and kv["stored_bytes"] - kv["evicted_bytes"] == kv["end_bytes"]
    assert kv["hit_tokens_found"] + kv["missed_tokens"] == kv["hit_tokens_asked"]


def test_a_store_smaller_than_the_working_set_evicts_recomputes_and_loses_nothing() -> None:
    trajectories = work(16, 5)
    plain = run_system(CONFIG, "dualpath", trajectories)
    ample = run_system(bounded(10**13), "dualpath", trajectories)
    # Room for everything: the same run, event for event, but for the store's own records.
    assert ample.jct_s == plain.jct_s and ample.extra["kv"]["store"]["evictions"] == 0
    assert ample.extra["kv"]["store"]["found_rate"] == 1.0 and ample.hit_rate == plain.hit_rate
    tight = run_system(bounded(int(plain.working_set_bytes["max"] / 4)), "dualpath", trajectories)
    kv = tight.extra["kv"]["store"]
    assert tight.complete and tight.turns_done == plain.turns_done  # every request ended, none failed
    assert kv["evictions"] > 0 and kv["peak_bytes"] <= kv["capacity_bytes"]
    assert 0 < kv["recomputed_tokens"] == sum(tight.metrics.recomputed) and kv["found_rate"] < 1.0
    assert tight.hit_rate < plain.hit_rate and tight.jct_s > plain.jct_s
    # What was not found was prefilled: the prompt is hit plus new tokens either way.
    m = tight.metrics
    assert sum(m.hit) + kv["recomputed_tokens"] == sum(plain.metrics.hit)


def test_the_default_store_says_nothing_and_a_user_watch_sees_the_stores_records() -> None:
    seen: list[Any] = []
    keep = Watch({kind: lambda _t, r: seen.append(r) for kind in (KvTier, KvStored, KvEvicted, HitFound)})
    run_system(CONFIG, "dualpath", work(4, 3), watch=keep)
    assert seen == []
    run_system(bounded(10**8), "dualpath", work(4, 3), watch=keep)
    assert type(seen[0]) is KvTier and any(type(r) is KvEvicted for r in seen)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity_blocks=st.integers(1, 3_000), eviction=st.sampled_from(["lru", "ttl", "tool_wait"]),
    ttl_s=st.floats(0.5, 60.0), system=st.sampled_from(["basic", "dualpath"]), crash=st.booleans(),
)  # fmt: skip
def test_any_store_size_policy_and_crash_loses_no_request_and_holds_every_invariant(
    capacity_blocks: int, eviction: str, ttl_s: float, system: str, crash: bool
) -> None:
    block_bytes = BLOCK_TOKENS * CONFIG.model.kv_bytes_per_token
    config = bounded(capacity_blocks * block_bytes, eviction, ttl_s if eviction == "ttl" else 0.0)
    if crash:
        config = with_faults(Fault("crash", "de1", 1.0, restart_s=2.0), config=config)
    result = run_system(config, system, work(8, 4))  # raises on a lost request or a broken invariant
    kv = result.extra["kv"]["store"]
    assert result.turns_done + result.failed_requests == result.turns
    assert kv["peak_bytes"] <= kv["capacity_bytes"]
    assert kv["stored_bytes"] - kv["evicted_bytes"] == kv["end_bytes"]
    assert kv["hit_tokens_found"] + kv["recomputed_tokens"] == kv["hit_tokens_asked"]


def test_a_scenario_sizes_the_store_and_a_bad_key_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.toml"
    path.write_text('kind = "cluster"\n[deployment]\nmodel = "ds27b"\npe_nodes = 1\nde_nodes = 1\nprefill_ep_nodes = 1\n'
                    'decode_ep_nodes = 1\n[workload]\nagents = 8\nmax_rounds = 3\n'
                    '[kv.store]\ncapacity_bytes = 300_000_000\neviction = "tool_wait"\n')  # fmt: skip
    assert main(["run", str(path), "--json", "--system", "dualpath"]) == 0
    assert '"kv"' in capsys.readouterr().out
    assert main(["run", str(path), "--system", "dualpath", "--out", str(tmp_path / "out"), "--trace"]) == 0
    assert "dualpath: store of 0.3 GB (peak " in capsys.readouterr().out  # the table, then a line on the store
    assert (tmp_path / "out" / "kv.png").stat().st_size > 0  # what the store held over time
    with gzip.open(tmp_path / "out" / "trace-dualpath.json.gz") as file:
        events = json.load(file)["traceEvents"]
    held = [e["args"]["GB"] for e in events if e.get("ph") == "C" and e["name"] == "kv store held (GB)"]
    assert 0 < max(held) <= 0.3
    kv = json.loads((tmp_path / "out" / "summary.json").read_text())["systems"]["dualpath"]["kv"]["store"]
    with (tmp_path / "out" / "requests.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert sum(int(row["recomputed"]) for row in rows) == kv["recomputed_tokens"] > 0
    path.write_text('kind = "cluster"\n[kv.store]\ncapacity_bytes = 1000\neviction = "ttl"\n')
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "key 'kv.store.ttl_s': expected a time to live > 0 s with eviction = 'ttl'" in err and err.count("\n") == 1
    path.write_text('kind = "cluster"\n[kv.store]\ncapacity_bytes = 1000000000000\n[kv.pool]\nwrite = "back"\n')
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "key 'kv.pool.write': expected 'through' with a bounded [kv.store]" in err and err.count("\n") == 1
    path.write_text('kind = "cluster"\n[kv.pool]\nwrite = "around"\n')
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "kv.pool.write" in err and err.count("\n") == 1
    path.write_text('kind = "cluster"\n[kv.store]\neviction = "fifo"\n')
    assert main(["run", str(path)]) == 2
    assert "key 'kv.store.eviction': expected one of 'lru', 'ttl', 'tool_wait'" in capsys.readouterr().err


def test_check_draws_bounded_stores_and_pools_and_writes_them_into_the_scenarios_it_replays(tmp_path: Path) -> None:
    from dualpath_emu.cluster.scenario import load_cluster_scenario
    from dualpath_emu.testing import ClusterCase, write_case
    from dualpath_emu.testing.check import describe_case
    from dualpath_emu.testing.cluster import case_config

    case = ClusterCase(1, 1, 2, 0.1, (((3_000, 10), (500, 10)),), ((0.0, 0.5),), store_blocks=40, eviction="ttl",
                       ttl_s=1.0, pool_blocks=7)  # fmt: skip
    scenario, _ = write_case(case, "dualpath", tmp_path / "case.toml", "dualpath")
    config = load_cluster_scenario(scenario).config
    block_bytes = BLOCK_TOKENS * CONFIG.model.kv_bytes_per_token
    assert config.kv_store == case_config(case).kv_store == KvTierSpec(40 * block_bytes, "ttl", 1.0)
    assert config.kv_pool == case_config(case, "dualpath").kv_pool == KvPoolSpec(7 * block_bytes, systems=("dualpath",))
    assert describe_case(case)[-1] == "kv: store of 40 blocks (ttl), DRAM pool of 7 blocks per node, write-through"


def test_a_users_eviction_policy_is_named_by_its_file_and_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mine.py").write_text(
        "from dualpath_emu.cluster.kv_cache import LruEviction\n\n"
        "class Newest(LruEviction):\n"
        '    """The most recently used context first (a stack: the opposite of LRU)."""\n\n'
        '    name = "newest"\n\n'
        "    def victim(self, pinned):\n"
        "        return next((c for c in reversed(self._order) if c not in pinned), None)\n\n"
        "class NotOne:\n    pass\n"
    )  # fmt: skip
    head = ('kind = "cluster"\n[deployment]\nmodel = "ds27b"\npe_nodes = 1\nde_nodes = 1\nprefill_ep_nodes = 1\n'
            'decode_ep_nodes = 1\n[workload]\nagents = 8\nmax_rounds = 4\n[workload.tool_wait]\ndist = "exponential"\n'
            'mean_s = 5.0\n[kv.store]\ncapacity_bytes = 600_000_000\n')  # fmt: skip
    path = tmp_path / "s.toml"
    results = {}
    for eviction in ("lru", "mine.py:Newest"):
        path.write_text(head + f'eviction = "{eviction}"\n')
        assert main(["run", str(path), "--json", "--system", "dualpath"]) == 0
        results[eviction] = json.loads(capsys.readouterr().out)["systems"]["dualpath"]["kv"]["store"]
    assert results["lru"]["evictions"] > 0 and results["mine.py:Newest"] != results["lru"]
    (tmp_path / "bad.py").write_text(
        "from dualpath_emu.cluster.kv_cache import LruEviction\n\n"
        "class Raises(LruEviction):\n    def victim(self, pinned):\n        raise RuntimeError('oops')\n"
    )  # fmt: skip
    path.write_text(head + 'eviction = "bad.py:Raises"\n')
    assert main(["run", str(path), "--system", "dualpath"]) == 2  # a user's eviction that raises: one line, named
    err = capsys.readouterr().err
    assert "bad.py:Raises': victim() raised RuntimeError: oops" in err and "Traceback" not in err
    path.write_text(head + 'eviction = "mine.py:NotOne"\n')
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "key 'kv.store.eviction'" in err and "expected a subclass of Eviction called 'NotOne'" in err
    assert err.count("\n") == 1
