"""The figures of :mod:`dualpath_emu.cluster.metrics`: TTST from the first token, the memory-light quantile,
the GPUs' busy time per interval, the KV working set; on hand-made timestamps and against a sorted list."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_emu.cluster.metrics import BusyTime, Metrics, quantile

S = 1_000_000_000


def test_ttst_is_second_token_minus_first_not_from_arrival() -> None:
    m = Metrics()
    m.arrive(0, 0, 0, 100, 0, 5)
    m.first_token(0, 2 * S)  # TTFT 2 s
    m.second_token(0, 2 * S + 30_000_000)  # 30 ms later
    m.arrive(1, 1, S, 100, 0, 1)  # one token: no second token, no TTST
    m.first_token(1, 3 * S)
    assert m.ttft_s() == [2.0, 2.0]
    assert m.ttst_s() == pytest.approx([0.03])


@given(st.lists(st.floats(0.0, 1.0), max_size=60), st.integers(0, 40), st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]))
def test_quantile_is_the_nearest_rank_of_the_values_and_the_zeros(values: list[float], zeros: int, q: float) -> None:
    everything = sorted(values + [0.0] * zeros)
    n = len(everything)
    expected = everything[min(n - 1, max(0, -(-int(q * n * 1000) // 1000) - 1))] if n else 0.0
    assert quantile(iter(values), n, q) == expected


def test_busy_time_splits_intervals_across_samples() -> None:
    busy = BusyTime(S, keep_spans=True)
    busy.add(7, S // 2, 2 * S, "prefill pass", (("requests", 3),))  # half of second 0, all of second 1
    busy.add(7, 3 * S, 3 * S)  # empty: ignored
    busy.add(8, 0, S // 4, "decode")
    assert list(busy.busy_ns[7]) == [S // 2, S]
    assert busy.timeline([7, 8, 9], 3 * S) == pytest.approx([(0.5 + 0.25) / 3, 1 / 3, 0.0])
    util = busy.utilisation([7, 8, 9], 3 * S)
    # Busy 1.75 s of 3 GPUs × 3 s; the 9 (GPU, second) samples are 0.5, 1, 0.25 and six zeros: p99 = 1.
    assert util == pytest.approx({"mean": 1.75 / 9, "p99": 1.0})
    assert busy.utilisation([7, 8, 9], 3 * S, q=0.8)["p99"] == pytest.approx(0.5)
    assert busy.spans == [(7, S // 2, 2 * S, "prefill pass", (("requests", 3),)), (8, 0, S // 4, "decode", ())]


def test_a_partial_last_interval_is_relative_to_its_length() -> None:
    busy = BusyTime(S)
    busy.add(0, 0, S + S // 2)  # busy until the run's end at 1.5 s: the second sample is full, not half
    assert busy.timeline([0], S + S // 2) == pytest.approx([1.0, 1.0])
    assert busy.utilisation([0], S + S // 2) == pytest.approx({"mean": 1.0, "p99": 1.0})


def test_working_set_holds_each_trajectory_from_its_first_arrival_to_its_last_end() -> None:
    m = Metrics()
    kv = 10  # bytes per token
    # Agent 0: turn 0 arrives at 0 s (prompt 100), ends at 2 s (+20 generated); turn 1 arrives at 2 s
    # (prompt 150: the 120 of context, 30 appended), ends at 4 s (+10). Agent 1: one turn, 1-3 s, 50 + 50.
    for rid, (agent, arrive, prompt, gen, done) in enumerate(
        [(0, 0, 100, 20, 2), (1, 1, 50, 50, 3), (0, 2, 150, 10, 4)]
    ):
        m.arrive(rid, agent, arrive * S, prompt, prompt - 30 if prompt > 100 else 0, gen)
        m.done(rid, done * S)
    ws = m.working_set_bytes(kv, 5 * S)
    # Live tokens: [0,1) 100; [1,2) 100 + 50; [2,3) 150 (agent 0's context grows to 120, then its next prompt
    # is 150) + 50; [3,4) 150 (agent 1's last turn ended); [4,5) 0 (so did agent 0's).
    assert ws["max"] == 200 * kv
    assert ws["mean"] == pytest.approx((100 + 150 + 200 + 150 + 0) / 5 * kv)
    assert m.working_set_bytes(kv, 2 * S) == pytest.approx({"mean": (100 + 150) / 2 * kv, "max": 200 * kv})


def _working_set_by_sorting_every_change(m: Metrics, kv: int, end_ns: int, since_ns: int) -> dict[str, float]:
    """The working set as first written: every change in one sorted list (what the streaming merge replaces)."""
    changes: list[tuple[int, int, int]] = []
    last_end: dict[int, int] = {}
    for agent, arrive, prompt, gen, done in zip(m.agent, m.arrive_ns, m.prompt, m.gen, m.done_ns):
        changes.append((arrive, agent, prompt))
        if done != -1:
            changes.append((done, agent, prompt + gen))
            last_end[agent] = max(last_end.get(agent, done), done)
    changes.extend((t, agent, -1) for agent, t in last_end.items())
    changes.sort(key=lambda c: (c[0], c[2] < 0))
    tokens: dict[int, int] = {}
    live = peak = previous = 0
    area = 0.0
    for i, (t, agent, context) in enumerate(changes):
        if t > end_ns:
            break
        area += live * (t - previous)
        previous = t
        held = tokens.get(agent, 0)
        if context < 0:
            live -= held
            tokens[agent] = 0
        elif context > held:
            live += context - held
            tokens[agent] = context
        if i + 1 == len(changes) or changes[i + 1][0] != changes[i][0]:
            peak = max(peak, live)
    area += live * max(0, end_ns - previous)
    mean = area / (end_ns - since_ns) if end_ns > since_ns else 0.0
    return {"mean": mean * kv, "max": float(peak * kv)}


@given(
    turns=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 20), st.integers(1, 500), st.integers(1, 50), st.integers(-1, 25)),
        max_size=40,
    ),
    in_order=st.booleans(),
    end=st.integers(0, 30),
)
def test_the_streamed_working_set_is_the_sorted_one_to_the_bit(
    turns: list[tuple[int, int, int, int, int]], in_order: bool, end: int
) -> None:
    """Arrivals in id order (one process) or not (a merged run), ends at any time or never, ties at every
    instant, windows ending before, between and after the changes."""
    if in_order:
        turns = sorted(turns, key=lambda turn: turn[1])
    m = Metrics()
    for rid, (agent, arrive, prompt, gen, done) in enumerate(turns):
        m.arrive(rid, agent, arrive, prompt, 0, gen)
        if done >= 0:
            m.done(rid, max(arrive, done))
    since = min(m.arrive_ns, default=0)
    assert m.working_set_bytes(7, end, since_ns=since) == _working_set_by_sorting_every_change(m, 7, end, since)


def test_the_parts_of_a_run_split_over_processes_merge_into_its_metrics() -> None:
    # The client's process admits and ends requests; the scheduler's places them; an engine group's reads
    # and busy time: each part sets only its own columns, and the merge is what one process would have.
    import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

    client, scheduler, engine = Metrics(), Metrics(), Metrics()
    whole = Metrics()
    for rid in range(3):
        for m in (client, whole):
            m.arrive(rid, rid % 2, rid * S, 100, 64, 5)
            m.first_token(rid, rid * S + 10)
            m.second_token(rid, rid * S + 20)
            m.done(rid, rid * S + 90)
    for m in (scheduler, whole):
        m.scheduled_pe(2, 2 * S + 1)  # only request 2: rows 0 and 1 stay unset there
        m.scheduled_de(2, 2 * S + 2, pe=3, de=9, read_on_de=True)
    for m in (engine, whole):
        m.read_start(1, S + 3)
        m.read_done(1, S + 4)
        m.prefill_start(1, S + 5)
        m.forward(S + 5, [1.0, 3.0])
        m.prefill_pass(S + 5, S + 8, [(3, [(1, 16)])])
    parts = [Metrics.from_wire(msgpack.unpackb(msgpack.packb(p.to_wire()), strict_map_key=False))
             for p in (client, scheduler, engine)]  # fmt: skip
    merged = Metrics.merge(parts)
    for name in Metrics._COLUMNS:
        assert list(getattr(merged, name)) == list(getattr(whole, name)), name
    assert list(merged.forward_ns) == list(whole.forward_ns)
    assert list(merged.forward_attention_balance) == list(whole.forward_attention_balance)
    assert merged.gpu_busy["pe"].busy_ns == whole.gpu_busy["pe"].busy_ns
    assert merged.ttft_s() == whole.ttft_s() and merged.jct_s() == whole.jct_s()


def test_two_parts_that_disagree_on_a_time_are_refused() -> None:
    a, b = Metrics(), Metrics()
    a.scheduled_pe(0, 5)
    b.scheduled_pe(0, 6)
    with pytest.raises(ValueError, match="request 0: scheduled_pe_ns"):
        Metrics.merge([a, b])


def test_a_request_dispatched_again_keeps_its_last_read_and_first_prefill_across_processes() -> None:
    # Lost to a crash, a request may read its hit on another node's group and prefill in another group: the
    # merge keeps what one process keeps (the last read, the first prefill start).
    a, b = Metrics(), Metrics()
    a.read_start(0, 5)
    a.read_done(0, 7)
    a.prefill_start(0, 8)
    b.read_start(0, 20)
    b.read_done(0, 25)
    b.prefill_start(0, 26)
    merged = Metrics.merge([a, b])
    assert (merged.read_start_ns[0], merged.read_done_ns[0], merged.prefill_start_ns[0]) == (20, 25, 8)
