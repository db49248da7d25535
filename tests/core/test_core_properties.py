"""Properties of ``dualpath_emu._core.Core`` over random topologies and operation sequences: a property
test over batches of transfers and advances, and a stateful test that mixes transfers, storage I/O,
timers, advances and steps. The checkers sit outside the core and only read what it returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests import conftest
from dualpath_emu._core import Arbitration, Core

GB = 1e9
MS = 1_000_000
N_LANES = 16

_Completion = tuple[str, int, int, int, int, int]


def arbitration(kind: str) -> Arbitration | None:
    """Lanes 0..3 are served by every kind, so any transfer on them can finish."""
    return {"fair": Arbitration.fair(4), "paper": Arbitration.paper(), "default": None}[kind]


@dataclass
class Submit:
    path: list[int]  # indices into the topology, distinct
    lane: int
    size_bytes: int


@dataclass
class Advance:
    dt_ns: int


ports_st = st.lists(
    st.tuples(
        st.sampled_from([1.0, 10.0, 50.0]) | st.floats(1.0, 100.0), st.sampled_from(["fair", "paper", "default"])
    ),
    min_size=1,
    max_size=4,
)


def ops_st(n_ports: int) -> st.SearchStrategy[list[list[Submit] | Advance]]:
    submit = st.builds(
        Submit,
        path=st.permutations(range(n_ports)).flatmap(
            lambda order: st.integers(1, min(3, n_ports)).map(lambda k: order[:k])
        ),
        lane=st.integers(0, 3),
        size_bytes=st.integers(0, 50_000_000) | st.sampled_from([0, 1, 4096]),
    )
    batch = st.lists(submit, min_size=1, max_size=5)
    advance = st.builds(Advance, dt_ns=st.integers(0, 20 * MS) | st.sampled_from([0, 1]))
    return st.lists(batch | advance, min_size=1, max_size=25)


@dataclass
class Checker:
    """Reads every completion the core returns; checks order and uniqueness."""

    submitted: dict[int, tuple[int, int, int, list[int]]] = field(default_factory=dict)  # start, size, lane, path
    seen: dict[int, _Completion] = field(default_factory=dict)
    last_end_ns: int = 0

    def take(self, completions: Iterable[_Completion], now_ns: int) -> None:
        for c in completions:
            kind, tag, start_ns, end_ns, size_bytes, lane = c
            assert tag not in self.seen, f"tag {tag} completed twice: {self.seen[tag]} and {c}"
            assert tag in self.submitted, f"completion of a tag never submitted: {c}"
            assert end_ns >= self.last_end_ns, f"time went backwards: {c} after end {self.last_end_ns}"
            assert start_ns <= end_ns <= now_ns, (c, now_ns)
            self.seen[tag] = c
            self.last_end_ns = end_ns


@given(topology=ports_st, data=st.data())
def test_random_batches_complete_once_in_order_and_count_every_byte(
    topology: list[tuple[float, str]], data: st.DataObject
) -> None:
    core = Core()
    ports = [
        core.add_port(f"p{i}", gbps * GB, arbitration=arbitration(kind)) for i, (gbps, kind) in enumerate(topology)
    ]
    expected_bytes = [[0] * N_LANES for _ in ports]
    check = Checker()
    tag = 0
    for op in data.draw(ops_st(len(ports)), label="ops"):
        if isinstance(op, Advance):
            t = core.now_ns + op.dt_ns
            check.take(core.advance_to(t), t)
            assert core.now_ns == t
            continue
        items = []
        for s in op:
            path = [ports[i] for i in s.path]
            items.append((path, s.lane, s.size_bytes, tag))
            check.submitted[tag] = (core.now_ns, s.size_bytes, s.lane, path)
            for p in path:
                expected_bytes[p][s.lane] += s.size_bytes
            tag += 1
        assert core.submit_transfers(items) == len(items)
        # No transfer can ever go faster than the slowest port on its path (no port has a token bucket).
        for path, rate in [(g[0], g[3]) for g in core.in_flight()]:
            assert rate <= min(core.port_rate(p) for p in path) * (1 + 1e-9), (path, rate)
    check.take(core.run_until_idle(), core.now_ns)

    assert sorted(check.seen) == sorted(check.submitted), "every transfer ends exactly once"
    for t, (start_ns, size, lane, path) in check.submitted.items():
        kind, _, got_start, end_ns, got_size, got_lane = check.seen[t]
        assert (kind, got_start, got_size, got_lane) == ("transfer", start_ns, size, lane)
        slowest = min(core.port_rate(p) for p in path)
        assert end_ns - start_ns >= size / slowest * 1e9 - 1, (t, check.seen[t], slowest)
    for p in ports:
        got = core.port_counters(p)["completed_bytes"]
        assert got == expected_bytes[p], (p, got, expected_bytes[p])
    assert core.pending() == 0
    assert core.in_flight() == []
    assert core.next_event_ns() is None


class CoreMachine(RuleBasedStateMachine):
    """Transfers, storage I/Os, timers, advances and steps in any order on one virtual core."""

    @initialize(
        rates=st.lists(st.sampled_from([1.0, 10.0, 50.0]), min_size=3, max_size=3),
        depth=st.integers(1, 3),
        latency_ns=st.integers(0, 2 * MS),
    )
    def setup(self, rates: list[float], depth: int, latency_ns: int) -> None:
        self.core = Core()
        kinds = [Arbitration.paper(), Arbitration.fair(4), None]
        self.ports = [
            self.core.add_port(f"p{i}", r * GB, arbitration=a)
            for i, (r, a) in enumerate(zip(rates, kinds, strict=True))
        ]
        self.core.configure_storage(
            read_port=self.ports[0], write_port=self.ports[0], read_latency_ns=latency_ns, write_latency_ns=latency_ns
        )
        self.node = self.core.add_storage_node(
            "node0", read_path=[self.ports[1], self.ports[2]], write_path=[self.ports[2]], queue_depth=depth
        )
        self.check = Checker()
        self.next_tag = 0
        self.last_now_ns = 0

    def tags(self, n: int) -> list[int]:
        first = self.next_tag
        self.next_tag += n
        return list(range(first, first + n))

    @rule(
        transfers=st.lists(
            st.tuples(st.sets(st.integers(0, 2), min_size=1), st.integers(0, 3), st.integers(0, 20_000_000)),
            min_size=1,
            max_size=4,
        )
    )
    def submit_transfers(self, transfers: list[tuple[set[int], int, int]]) -> None:
        items = []
        for (path_ix, lane, size), tag in zip(transfers, self.tags(len(transfers)), strict=True):
            path = [self.ports[i] for i in sorted(path_ix)]
            items.append((path, lane, size, tag))
            self.check.submitted[tag] = (self.core.now_ns, size, lane, path)
        assert self.core.submit_transfers(items) == len(items)

    @rule(
        ios=st.lists(
            st.tuples(st.sampled_from(["read", "write"]), st.integers(0, 3), st.integers(0, 20_000_000)),
            min_size=1,
            max_size=3,
        )
    )
    def submit_ios(self, ios: list[tuple[str, int, int]]) -> None:
        items = []
        for (kind, lane, size), tag in zip(ios, self.tags(len(ios)), strict=True):
            items.append((self.node, kind, lane, size, tag))
            self.check.submitted[tag] = (self.core.now_ns, size, lane, [])
        assert self.core.submit_ios(items) == len(items)

    @rule(delays_ns=st.lists(st.integers(0, 30 * MS), min_size=1, max_size=3))
    def add_timers(self, delays_ns: list[int]) -> None:
        items = []
        for dt, tag in zip(delays_ns, self.tags(len(delays_ns)), strict=True):
            items.append((self.core.now_ns + dt, tag))
            self.check.submitted[tag] = (self.core.now_ns + dt, 0, 0, [])
        assert self.core.add_timers(items) == len(items)

    @rule(dt_ns=st.integers(0, 20 * MS))
    def advance(self, dt_ns: int) -> None:
        t = self.core.now_ns + dt_ns
        self.check.take(self.core.advance_to(t), t)
        assert self.core.now_ns == t

    @rule()
    def step(self) -> None:
        expected_t = self.core.next_event_ns()
        result = self.core.step()
        if result is None:
            assert expected_t is None and self.core.pending() == 0, "step() returned None with work pending"
            return
        t, completions = result
        assert t == expected_t == self.core.now_ns
        assert all(c[3] == t for c in completions), (t, completions)
        self.check.take(completions, t)

    @invariant()
    def pending_is_submitted_minus_completed(self) -> None:
        assert self.core.pending() == len(self.check.submitted) - len(self.check.seen)

    @invariant()
    def time_never_goes_backwards(self) -> None:
        assert self.core.now_ns >= self.last_now_ns
        self.last_now_ns = self.core.now_ns
        next_ns = self.core.next_event_ns()
        assert next_ns is None or next_ns >= self.core.now_ns

    def teardown(self) -> None:
        if not hasattr(self, "core"):
            return
        self.check.take(self.core.run_until_idle(), self.core.now_ns)
        assert sorted(self.check.seen) == sorted(self.check.submitted), "everything ends exactly once"
        for tag, (start_ns, size, lane, _) in self.check.submitted.items():
            kind, _, got_start, end_ns, got_size, got_lane = self.check.seen[tag]
            assert (got_start, got_size) == (start_ns, size), (tag, self.check.seen[tag])
            if kind != "timer":
                assert got_lane == lane
            else:
                assert end_ns == start_ns
        assert self.core.pending() == 0
        q = self.core.storage_queue(self.node)
        assert q == {"read_bytes": 0, "read_requests": 0, "write_bytes": 0, "write_requests": 0, "in_flight": 0}


TestCoreMachine = CoreMachine.TestCase


# ---------------------------------------------------------------------------------------------------
# The depth of the tests above is chosen by the environment (tests/conftest.py).


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "default"),
        ({"CI": "true"}, "ci"),
        ({"CI": "false"}, "default"),
        ({"CI": "true", conftest.PROFILE_ENV: "deep"}, "deep"),
        ({conftest.PROFILE_ENV: "ci"}, "ci"),
    ],
)
def test_the_hypothesis_profile_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(conftest.PROFILE_ENV, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert conftest._profile_name() == expected
    assert settings.get_profile("ci").derandomize
    assert settings.get_profile("ci").max_examples == settings.get_profile("default").max_examples
    assert settings.get_profile("deep").max_examples > settings.get_profile("default").max_examples


def test_an_unknown_hypothesis_profile_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(conftest.PROFILE_ENV, "thorough")
    with pytest.raises(ValueError, match=f"^{conftest.PROFILE_ENV}='thorough': expected one of default, ci, deep$"):
        conftest._profile_name()
