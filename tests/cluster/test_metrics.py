"""The figures of :mod:`dualpath_emu.cluster.metrics`: TTST from the first token, the memory-light quantile,
the GPUs' busy time per interval, the KV working set; on hand-made timestamps and against a sorted list."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_emu.cluster.metrics import BusyTime, Metrics, quantile
from dualpath_emu.cluster.observations import (
    Arrival, Assigned, Completion, DecodeSegment, Failed, ForwardPass, HitRead, PrefillChosen, PrefillPass,
    PrefillStarted, ReadRerouted, ReadStarted, Redispatched, from_wire, to_wire,
)  # fmt: skip

S = 1_000_000_000


def test_ttst_is_second_token_minus_first_not_from_arrival() -> None:
    m = Metrics()
    m.arrive(0, 0, 0, 100, 0, 5)
    m.ended(0, 2 * S, 2 * S + 30_000_000, 3 * S)  # TTFT 2 s; the second token 30 ms later
    m.arrive(1, 1, S, 100, 0, 1)  # one token: no second token, no TTST
    m.ended(1, 3 * S, -1, 3 * S)
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
        m.ended(rid, done * S, -1, done * S)
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
            m.ended(rid, max(arrive, done), -1, max(arrive, done))
    since = min(m.arrive_ns, default=0)
    assert m.working_set_bytes(7, end, since_ns=since) == _working_set_by_sorting_every_change(m, 7, end, since)


def _run_observed() -> list[tuple[str, int, Any]]:
    """A small run's observations ``(process, t_ns, record)``: the client's, the scheduler's and an engine
    group's, request 1 dispatched again after a crash (its read and prefill twice)."""
    out: list[tuple[str, int, Any]] = []
    for rid in range(3):
        out.append(("client", rid * S, Arrival(rid, rid % 2, 100, 64, 5)))
    out += [
        ("scheduler", S + 1, PrefillChosen(1)), ("scheduler", S + 2, Assigned(1, 3, 9, "de")),
        ("engine", S + 3, ReadStarted(1)), ("engine", S + 4, HitRead(1, 1)), ("engine", S + 5, PrefillStarted(1)),
        ("engine", S + 5, ForwardPass((1.0, 3.0))), ("engine", S + 8, PrefillPass(S + 5, S + 8, ((3, 1, 16),))),
        ("scheduler", S + 9, Redispatched(1, 1, "pe0")), ("scheduler", S + 10, PrefillChosen(1)),
        ("scheduler", S + 11, Assigned(1, 2, 8, "pe")), ("engine", S + 20, ReadStarted(1)),
        ("engine", S + 25, HitRead(1, 0)), ("engine", S + 26, PrefillStarted(1)),
        ("engine", S + 40, DecodeSegment(8, S + 30, S + 40, 2, 5)), ("scheduler", 2 * S + 1, Failed(2, "lost")),
        ("scheduler", 2 * S + 2, ReadRerouted(0, 1, 64)),
    ]  # fmt: skip
    for rid in (0, 1):
        out.append(("client", rid * S + 90 + S, Completion(rid, rid * S + 10 + S, rid * S + 20 + S, rid * S + 90 + S)))
    return sorted(out, key=lambda o: o[1])


def test_the_metrics_are_derived_from_what_the_engines_observe() -> None:
    m = Metrics()
    callbacks = m.watch().callbacks
    for _, t_ns, record in _run_observed():
        callbacks[type(record)](t_ns, record)
    assert list(m.arrive_ns) == [0, S, 2 * S]
    # Request 1: placed again after its redispatch, its last read and its first prefill start kept.
    assert (m.scheduled_pe_ns[1], m.scheduled_de_ns[1], m.pe[1], m.de[1], m.read_on_de[1]) == (S + 10, S + 11, 2, 8, 0)
    read, prefill = (m.read_start_ns[1], m.read_done_ns[1]), m.prefill_start_ns[1]
    assert (read, prefill, m.redispatches[1]) == ((S + 20, S + 25), S + 5, 1)
    assert (m.done_ns[1], m.failed_ns[2], m.turns_done, m.failures) == (2 * S + 90, 2 * S + 1, 2, 1)
    assert list(m.forward_attention_balance) == [1.5] and list(m.read_moved_ns) == [2 * S + 2]
    assert m.gpu_busy["pe"].busy_ns[3][1] == 3 and m.gpu_busy["de"].busy_ns[8][1] == 10
    assert m.waiting() == (0, 0) and m.unfinished() == []


def test_a_live_runs_processes_tapes_replay_into_the_metrics_one_process_would_have() -> None:
    # Each process keeps what it observed (its tape, sent as msgpack); the collector replays them all, whatever
    # order the parts come in and however far the processes' clocks are apart (arrivals first).
    import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

    observed = _run_observed()
    whole = Metrics.replay([(t, r) for _, t, r in observed])
    for order in (("engine", "scheduler", "client"), ("client", "engine", "scheduler")):
        tapes = [[to_wire(t, r) for p, t, r in observed if p == process] for process in order]
        parts = [from_wire(item) for tape in tapes for item in msgpack.unpackb(msgpack.packb(tape))]
        merged = Metrics.replay(parts)
        for name in ("arrive_ns", "scheduled_pe_ns", "scheduled_de_ns", "read_start_ns", "read_done_ns",
                     "prefill_start_ns", "first_token_ns", "second_token_ns", "done_ns", "failed_ns", "redispatches",
                     "pe", "de", "read_on_de", "forward_ns", "redispatch_ns", "read_moved_ns"):  # fmt: skip
            assert list(getattr(merged, name)) == list(getattr(whole, name)), name
        assert merged.gpu_busy["pe"].busy_ns == whole.gpu_busy["pe"].busy_ns
        assert merged.ttft_s() == whole.ttft_s() and merged.jct_s() == whole.jct_s()
    skewed = [(t - 5 * S if type(r) is not Arrival else t, r) for _, t, r in observed]  # an engine's clock behind
    behind = Metrics.replay(skewed)
    assert list(behind.done_ns) == [S + 90, 2 * S + 90, -1] and behind.read_start_ns[1] == S + 20 - 5 * S


def test_a_checker_of_ones_own_watches_every_observation_of_a_run() -> None:
    # A run's metrics come from the observations alone: a watch of one's own sees the same records, so it can
    # rebuild the metrics (or check anything else) with no other channel, and the event log never holds a
    # measurement.
    from tests.cluster.test_faults import CONFIG, with_faults, work

    from dualpath_emu.cluster.faults import Fault
    from dualpath_emu.cluster.observations import MEASUREMENTS, FaultChanged, Observation, WorkloadEnded
    from dualpath_emu.cluster.run import run_system
    from dualpath_emu.runtime.engine import Watch

    seen: list[tuple[int, Any]] = []
    keep = lambda now, record: seen.append((now, record))  # noqa: E731
    kinds = (*typing.get_args(Observation), *MEASUREMENTS)  # everything the engines observe
    config = with_faults(Fault("crash", "de1", 1.0, restart_s=2.0))
    result = run_system(config, "dualpath", work(), watch=Watch({kind: keep for kind in kinds}))
    rebuilt = Metrics.replay([(t, r) for t, r in seen if type(r) in Metrics.observed()])
    m = result.metrics
    for name in ("arrive_ns", "first_token_ns", "done_ns", "failed_ns", "read_start_ns", "prefill_start_ns", "de"):
        assert list(getattr(rebuilt, name)) == list(getattr(m, name)), name
    assert rebuilt.gpu_busy["pe"].busy_ns == m.gpu_busy["pe"].busy_ns and rebuilt.jct_s() == m.jct_s()
    assert sum(type(r) is Redispatched for _, r in seen) == result.redispatches > 0
    assert [type(r) for _, r in seen if type(r) is FaultChanged] == [FaultChanged, FaultChanged]
    assert type(seen[-1][1]) is WorkloadEnded and sum(type(r) is WorkloadEnded for _, r in seen) == 1
    assert result.events == sum(type(r) not in MEASUREMENTS for _, r in seen)
