"""The cluster end to end on small, storage-bound configurations (storage NICs slowed down so that a few dozen
agents saturate them): every admitted request ends exactly once; Oracle ≤ DualPath < Basic in JCT; Basic's
decode-node storage NICs read nothing while DualPath reads on both sides; runs repeat byte for byte.
"""

from __future__ import annotations

import dataclasses

import pytest

from dualpath_emu.cluster.catalog import MODELS
from dualpath_emu.cluster.catalog import TESTBED_NODE
from dualpath_emu.cluster.config import ClusterConfig, derived
from dualpath_emu.cluster.roofline import RooflineParams
from dualpath_emu.cluster.run import SystemResult, run_system
from dualpath_emu.cluster.systems import SYSTEMS
from dualpath_emu.workload.generator import generate
from dualpath_emu.workload.trajectory import Trajectory

AGENTS, ROUNDS = 24, 6


def small_config() -> ClusterConfig:
    # A 1P2D DS 27B cluster whose storage NICs are 170x slower than the testbed's: reads are the bottleneck, and
    # the systems' JCTs differ by 17-60% (Basic 13.8 s, DualPath 8.5 s, Oracle 7.3 s): more than real time's noise.
    # (At 0.8 GB/s, before the decode EP group stepped together, they were 5.4 / 3.9 / 3.4 s; with it the decode
    # binds there: 8.0 / 7.5 / 7.3 s.)
    node = dataclasses.replace(TESTBED_NODE, snic_bytes_per_s=0.3e9)
    return ClusterConfig(
        model=MODELS["ds27b"], node=node, pe_nodes=1, de_nodes=2, prefill_ep_nodes=1, decode_ep_nodes=1
    )


def trajectories(seed: int = 0) -> list[Trajectory]:
    # Later rounds (long contexts, high hit rates) are where the reads are.
    out = []
    for t in generate("32k", agents=AGENTS, seed=seed):
        rounds = list(zip(t.append, t.gen))[10 : 10 + ROUNDS] or list(zip(t.append, t.gen))[:ROUNDS]
        out.append(Trajectory.from_rounds(t.id, rounds))
    return out


@pytest.fixture(
    scope="module",
    params=["virtual", *(pytest.param(p, marks=pytest.mark.processes) for p in ("realtime-ipc", "realtime-tcp"))],
)
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, SystemResult]:
    # The same cluster in virtual time and live (one OS process per engine group, the data plane, over ipc and
    # over tcp with CURVE keys; time scale 2): what these tests check holds for both.
    config, work = small_config(), trajectories()
    systems = ("basic", "dualpath", "oracle")
    if request.param == "virtual":
        return {name: run_system(config, name, work) for name in systems}
    from dualpath_emu.cluster.live import run_live

    transport = request.param.split("-")[1]
    return {name: run_live(config, SYSTEMS[name], work, run_dir=tmp_path_factory.mktemp(name), time_scale=2.0,
                           transport=transport) for name in systems}  # fmt: skip


def test_every_request_ends_once_in_every_system(results: dict[str, SystemResult]) -> None:
    turns = sum(len(t) for t in trajectories())
    for result in results.values():
        assert result.turns == turns and result.complete
        m = result.metrics
        assert all(t >= 0 for t in m.done_ns)
        assert all(a <= f <= d for a, f, d in zip(m.arrive_ns, m.first_token_ns, m.done_ns))


def test_oracle_dualpath_basic_ordering(results: dict[str, SystemResult]) -> None:
    jct = {name: r.jct_s for name, r in results.items()}
    assert jct["oracle"] <= jct["dualpath"] < jct["basic"], jct


def test_read_sides(results: dict[str, SystemResult]) -> None:
    basic, dual, oracle = results["basic"], results["dualpath"], results["oracle"]
    assert basic.snic_read_bytes["de"] == 0 and basic.snic_read_bytes["pe"] > 0
    assert dual.snic_read_bytes["de"] > 0 and dual.snic_read_bytes["pe"] > 0
    assert oracle.snic_read_bytes == {"pe": 0.0, "de": 0.0}
    # Every hit byte is read exactly once, whichever side reads it.
    hit_bytes = sum(basic.metrics.hit) * 19_680  # ds27b: 656 B/token/layer x 30 layers
    assert basic.snic_read_bytes["pe"] == pytest.approx(hit_bytes, rel=1e-6)
    assert sum(dual.snic_read_bytes.values()) == pytest.approx(hit_bytes, rel=1e-6)


def test_runs_repeat_and_depend_on_the_seed() -> None:
    config, work = small_config(), trajectories()
    first = run_system(config, "dualpath", work, seed=1)
    again = run_system(config, "dualpath", work, seed=1)
    assert first.event_log_sha256 == again.event_log_sha256
    assert first.jct_s == again.jct_s
    other = run_system(config, "dualpath", trajectories(seed=5), seed=1)
    assert other.event_log_sha256 != first.event_log_sha256


def test_every_registered_system_runs() -> None:
    config, work = small_config(), trajectories()[:6]
    for name in SYSTEMS:
        assert run_system(config, name, work).turns == sum(len(t) for t in work)


def test_invariant_checker_catches_each_kind_of_violation() -> None:
    from dualpath_emu.cluster.invariants import EventLogChecker
    from dualpath_emu.cluster.observations import parse

    def check(events: list[tuple[int, str, str]]) -> list[str]:
        """The violations, the same whether the checker reads a log's lines or the engines' records (in chunks)."""
        lines = EventLogChecker()
        lines.feed((t, i, "a", kind, summary) for i, (t, kind, summary) in enumerate(events))
        records, typed = EventLogChecker(), [(t, "a", parse(kind, summary)) for t, kind, summary in events]
        split = min(2, len(typed))
        records.feed_observed(typed[:split], 0)
        records.feed_observed(typed[split:], split)
        violations = lines.finish()
        assert records.finish() == violations and records.events == lines.events == len(events)
        return violations

    ok = [
        (0, "admit", "r0"),
        (1, "capacity", "hbm 10"),
        (2, "take", "hbm 0 10"),
        (3, "give", "hbm 0 10"),
        (4, "end", "r0"),
    ]
    assert check(ok) == []
    assert check(ok[:4]) == ["1 admitted request(s) never ended, e.g. [0]"]
    assert check([*ok, (5, "end", "r0")]) == ["request 0 ended twice (event 5)"]
    assert check([(0, "end", "r3")]) == ["request 3 ended but was never admitted (event 0)"]
    assert check([(0, "admit", "r0"), (1, "admit", "r0")])[0] == "request 0 admitted twice (event 1)"
    far = [(0, "admit", "r0"), (1, "admit", "r9000000"), (2, "end", "r0")]  # an id far ahead: kept aside
    assert check(far) == ["1 admitted request(s) never ended, e.g. [9000000]"]
    assert check([*far, (3, "end", "r9000000")]) == []
    assert check([*far, (3, "end", "r9000000"), (4, "end", "r9000000")]) == ["request 9000000 ended twice (event 4)"]
    over = [(0, "capacity", "hbm 10"), (1, "take", "hbm 0 8"), (2, "take", "hbm 1 8")]
    assert check(over)[0] == "hbm over capacity: 16 > 10 B (event 2, r1)"
    assert check([(5, "admit", "r0"), (4, "end", "r0")])[0] == "time went back from 5 to 4 ns at event 1"
    late = [(0, "admit", "r0"), (1, "admit", "r1"), (3, "end", "r0"), (2, "end", "r1")]  # in the second chunk
    assert check(late) == ["time went back from 3 to 2 ns at event 3"]
    gap = EventLogChecker()  # chunks numbered with a gap between them
    gap.feed_observed([(0, "a", parse("admit", "r0")), (1, "a", parse("end", "r0"))], 0)
    gap.feed_observed([], 2)
    gap.feed_observed([(2, "a", parse("admit", "r1")), (3, "a", parse("end", "r1"))], 3)
    assert gap.finish() == ["event 3 where 2 was expected"] and gap.events == 4


def test_every_byte_is_accounted_against_the_ledger() -> None:
    from dualpath_emu._core import Core
    from dualpath_emu.cluster.core_report import CoreReport
    from dualpath_emu.cluster.invariants import check_core_bytes

    core = Core()
    port = core.add_port("p", 1e9)
    core.submit_transfers([([port], 2, 1000, 1)])
    core.run_until_idle()
    report = CoreReport.of(core, None, core.now_ns)
    assert check_core_bytes(report, {(port, 2): 1000}, {(port, 2): 1}) == []
    assert check_core_bytes(report, {(port, 2): 999}, {(port, 2): 1}) == [
        "port p lane 2: 1000 B finished, 999 B asked for"
    ]


def test_mooncake_requests_replay_open_loop_at_their_timestamps() -> None:
    from pathlib import Path

    from dualpath_emu.workload.mooncake import read_mooncake

    work = read_mooncake(Path(__file__).parents[1] / "data" / "mooncake" / "conversation_trace.jsonl")[:60]
    result = run_system(small_config(), "dualpath", work)
    m = result.metrics
    arrivals = sorted(t for trajectory in work for t in trajectory.arrival_s or ())
    assert result.turns == len(arrivals)
    assert sorted(t / 1e9 for t in m.arrive_ns) == pytest.approx(arrivals, abs=1e-9)


def test_moe_all_to_all_crosses_the_network_once_per_remote_node() -> None:
    from dualpath_emu.cluster.engines import inter_node_a2a_bytes as _inter_node_a2a_bytes
    from dualpath_emu.cluster.catalog import model

    v32, qwen = model("ds660b"), model("qwen32b")
    assert _inter_node_a2a_bytes(v32, 1) == 0.0 and _inter_node_a2a_bytes(qwen, 4) == 0.0
    per_expert = (v32.a2a_dispatch_bytes_per_token_layer + v32.a2a_combine_bytes_per_token_layer) / 8
    # Two nodes: a token's 8 experts miss the other node with probability 1/2^8.
    two = _inter_node_a2a_bytes(v32, 2)
    assert two == pytest.approx(per_expert * (1 - 0.5**8) * v32.moe_layers / v32.layers)
    assert two < _inter_node_a2a_bytes(v32, 4) < per_expert * 3  # at most one copy per remote node


@pytest.mark.parametrize("system", ["basic", "dualpath"])
def test_a_two_node_prefill_group_uses_both_nodes(system: str) -> None:
    config = dataclasses.replace(small_config(), pe_nodes=2, prefill_ep_nodes=2)
    result = run_system(config, system, trajectories())
    gpus = config.node.gpus
    nodes = {pe // gpus for pe in result.metrics.pe}
    assert nodes == {0, 1}
    if system == "basic":  # round robin: every PE of both nodes, evenly
        per_pe = [list(result.metrics.pe).count(pe) for pe in range(2 * gpus)]
        assert max(per_pe) - min(per_pe) <= 1


def test_cluster_messages_have_a_wire_format() -> None:
    # The cluster's actors exchange objects in one process; over ZeroMQ they would be encoded: every message
    # type registers (its fields are codec types) and round-trips.
    from dualpath_emu.cluster.messages import Fetch, Prefill, PrefillTask, Submit, Turn, TurnDone, cluster_registry
    from dualpath_emu.messages import Codec, Envelope

    codec = Codec(cluster_registry())
    tasks = (PrefillTask(7, 33_000, 32_768, 176, 0, 3, 2, 5, True, 4), PrefillTask(8, 900, 0, 12, 1, 0, 3, 1, False, 5))
    for body in (
        Fetch((0, 1), 5_000_000),
        Prefill(tasks),
        Submit((Turn(7, 33_000, 32_768, 176, 3),)),
        TurnDone((7, 8), (10, 11), (12, -1), 99),
    ):
        envelope = Envelope("scheduler", "pe0", 1, body)
        assert codec.decode_envelope(codec.encode_envelope(envelope)) == envelope


def test_a_prefill_group_pulls_before_its_next_pass_so_refilled_gpus_join_it() -> None:
    # DS 660B's 16-GPU prefill group, loaded (1,024 agents' first rounds): when a pass ends, the scheduler
    # refills the PEs it freed; the next pass must include them. Started at once instead, it ran with only
    # the GPUs that still had queued work and the refilled ones sat out a whole pass (median attention
    # max/mean ≈ 2.0, half the group idle); with the pull it is ≈ 1.3.
    # The decode all-to-all's fixed latency left out: with it the decode GPUs bind these ten rounds, the
    # prefill is not loaded, and passes of few requests over 16 GPUs are unbalanced whatever the pull does.
    config = ClusterConfig(model=MODELS["ds660b"], pe_nodes=2, de_nodes=4, prefill_ep_nodes=2, decode_ep_nodes=4,
                           agents=1024, dataset="32k", decode_roofline=RooflineParams(a2a_fixed_s=0.0))  # fmt: skip
    work = [Trajectory.from_rounds(t.id, list(zip(t.append, t.gen))[:10]) for t in generate("32k", 1024, seed=0)]
    result = run_system(config, "oracle", work)
    m, span = result.metrics, result.jct_s * 1e9
    loaded = sorted(b for t, b in zip(m.forward_ns, m.forward_attention_balance) if 0.2 * span <= t <= 0.6 * span)
    assert len(loaded) > 20
    assert loaded[len(loaded) // 2] <= 1.5


@pytest.mark.parametrize("system", ["basic", "dualpath"])
def test_decode_persists_exactly_the_full_blocks_each_request_completes(system: str) -> None:
    # Every 64-token block a request completes (its prompt's tail included) is written back once: the
    # storage writes add up to sum((prompt + gen) // 64 - hit // 64) blocks, whatever the batch did. Turns
    # with one output token (it comes from the prefill: the request never steps) and long generations that
    # cross many blocks inside one segment are both here. The write-backs are seen, with the blocks they name,
    # by a plane that moves storage I/O itself (as the host backend does).
    from dualpath_emu.cluster.config import BLOCK_TOKENS, derived
    from tests.runtime.test_virtual import StoragePlane

    work = [
        Trajectory.from_rounds(f"a{i}", [(700 + 37 * i, 1), (90, 300 + 61 * i), (5, 1), (2000, 17 + i), (64, 1)])
        for i in range(12)
    ]
    config = small_config()
    kv_block = BLOCK_TOKENS * derived(config).kv_bytes_per_token
    result = run_system(config, system, work, plane="storage", planes={"storage": StoragePlane})
    written = [(size, extents) for kind, size, extents in StoragePlane.moved if kind == "write"]
    blocks_of: dict[int, list[int]] = {}
    for size, extents in written:
        assert sum(n for _, _, n in extents) * kv_block == size  # the extents name exactly the blocks written
        for context, first, n in extents:
            blocks_of.setdefault(context, []).extend(range(first, first + n))
    m = result.metrics
    blocks = sum((p + g) // BLOCK_TOKENS - h // BLOCK_TOKENS for p, h, g in zip(m.prompt, m.hit, m.gen))
    assert sum(size for size, _ in written) == blocks * kv_block
    # Each agent's stream is written once, block after block from 0: what a later turn's hit reads exists.
    assert sorted(blocks_of) == list(range(len(work)))
    for context, stored in blocks_of.items():
        assert sorted(stored) == list(range(len(stored))), context


@pytest.mark.parametrize(
    ("model", "prefill_ep_nodes", "decode_ep_nodes"),
    [("ds27b", 1, 1), ("ds660b", 2, 4)],
    ids=["ds27b-4p8d-4-groups", "ds660b-4p8d-2-ep16-groups"],
)
@pytest.mark.parametrize("system", ["dualpath", "basic+layerwise+dualpath"])
def test_prefill_groups_share_the_work(model: str, prefill_ep_nodes: int, decode_ep_nodes: int, system: str) -> None:
    """4P8D with several prefill groups: each group's share of the requests is within 10% of the mean (before
    the fix, the first group to pull took 89-98% of them)."""
    config = ClusterConfig(
        model=MODELS[model], pe_nodes=4, de_nodes=8, prefill_ep_nodes=prefill_ep_nodes, decode_ep_nodes=decode_ep_nodes
    )
    work = [
        Trajectory.from_rounds(t.id, (list(zip(t.append, t.gen))[20:26] or list(zip(t.append, t.gen))[:6]))
        for t in generate("64k", agents=160)
    ]
    result = run_system(config, system, work)
    gpus = config.node.gpus
    shares = [0] * (4 // prefill_ep_nodes)
    for pe in result.metrics.pe:
        shares[pe // gpus // prefill_ep_nodes] += 1
    mean = sum(shares) / len(shares)
    assert all(abs(share - mean) <= 0.1 * mean for share in shares), shares


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, -1
    for start, end in sorted(intervals):
        start = max(start, reach)
        if end > start:
            total += end - start
        reach = max(reach, end)
    return total


@pytest.mark.fifo_only  # compares with a reference run or exact times (docs/testing.md)
def test_decode_gpus_are_busy_exactly_while_they_hold_requests(results: dict[str, SystemResult]) -> None:
    # A decode GPU steps a non-empty batch from a request's join (after the first token) to its last token:
    # its busy time lies between the union of its requests' [second token, end] and of [first token, end].
    # Live, the end is stamped by the client once the news has crossed from the data plane's core, where the
    # GPU stepped, through the decode group's process: up to a few lags later (20 ms of emulated time here).
    config = small_config()
    for name, result in results.items():
        m, busy = result.metrics, result.metrics.gpu_busy["de"]
        crossing_ns = 0 if result.extra.get("mode") != "realtime" else 20_000_000
        for gpu in {de for de in m.de}:
            mine = [rid for rid in range(len(m)) if m.de[rid] == gpu and m.gen[rid] > 1]
            low = _union_ns([(m.second_token_ns[r], m.done_ns[r] - crossing_ns) for r in mine])
            high = _union_ns([(m.first_token_ns[r], m.done_ns[r]) for r in mine])
            assert low <= sum(busy.busy_ns.get(gpu, ())) <= high, (name, gpu)
        units = [n * config.node.gpus + g for n in range(1, 3) for g in range(config.node.gpus)]
        # The run's span: from the client's start (0 in virtual time; live, the clock starts earlier).
        span_ns = max(m.done_ns) - round(result.extra.get("emulated_start_s", 0.0) * 1e9)
        assert result.gpu_util["de"]["mean"] == pytest.approx(
            sum(sum(busy.busy_ns.get(u, ())) for u in units) / (len(units) * span_ns), rel=1e-9
        )


def test_prefill_gpus_are_busy_only_in_passes_with_their_requests(results: dict[str, SystemResult]) -> None:
    # A PE GPU is busy in a pass only with work of a request between that request's prefill start and its
    # first token: its busy time is more than nothing and at most the union of those spans.
    for name, result in results.items():
        m, busy = result.metrics, result.metrics.gpu_busy["pe"]
        for gpu in {pe for pe in m.pe}:
            spans = [(m.prefill_start_ns[r], m.first_token_ns[r]) for r in range(len(m)) if m.pe[r] == gpu]
            assert 0 < sum(busy.busy_ns.get(gpu, ())) <= _union_ns(spans), (name, gpu)
        assert 0 < result.gpu_util["pe"]["mean"] <= result.gpu_util["pe"]["p99"] <= 1.0 + 1e-9


def test_the_working_set_is_the_live_trajectories_context(results: dict[str, SystemResult]) -> None:
    # Offline, every agent arrives at 0 with its first prompt and holds its context until its last turn ends:
    # the peak is at least every agent's first prompt (all live at 0+) and at most every final context.
    kv = derived(small_config()).kv_bytes_per_token
    for result in results.values():
        m = result.metrics
        first: dict[int, int] = {}
        final: dict[int, int] = {}
        for rid in range(len(m)):
            first.setdefault(m.agent[rid], m.prompt[rid])
            final[m.agent[rid]] = m.prompt[rid] + m.gen[rid]
        ws = result.working_set_bytes
        assert sum(first.values()) * kv <= ws["max"] <= sum(final.values()) * kv
        assert 0 < ws["mean"] < ws["max"]


@pytest.mark.parametrize(("model", "together"), [("ds27b", True), ("qwen32b", False)])
def test_the_gpus_of_an_ep_group_decode_in_lock_step(model: str, together: bool) -> None:
    # Two requests on two GPUs of one decode node, one with 60x the other's context. An MoE model's DE GPUs
    # step together (the EP group's dispatch and combine), so the short request decodes at the long one's
    # pace; a dense model's GPUs (DP only) step alone, and the short one is faster.
    config = ClusterConfig(model=MODELS[model], pe_nodes=1, de_nodes=1, prefill_ep_nodes=1, decode_ep_nodes=1, agents=2)
    work = [Trajectory.from_rounds("long", [(60_000, 400)]), Trajectory.from_rounds("short", [(1_000, 400)])]
    m = run_system(config, "oracle", work).metrics
    assert m.de[0] != m.de[1]
    tpot = [(m.done_ns[r] - m.second_token_ns[r]) / (m.gen[r] - 2) for r in range(2)]
    ratio = tpot[0] / tpot[1]
    assert (ratio < 1.01) if together else (ratio > 1.1), ratio
