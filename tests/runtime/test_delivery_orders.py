"""The virtual driver's other delivery orders (``runtime/virtual.py``'s ``order_seed`` and ``message_delay_ns``):
off, a run is first in first out as always; on, the inputs of one instant come in a seeded random order, and
messages between engines late by up to the bound, yet each (sender, recipient) pair's in the order sent, as over
ZeroMQ -- and a whole cluster still runs to its end with its invariants checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from dualpath_emu._core import Core
from dualpath_emu.cluster.run import run_system
from dualpath_emu.messages import Message
from dualpath_emu.runtime.engine import Engine, Outbox, on
from dualpath_emu.runtime.virtual import DeadlockError, NoProgressError, ProgressWatch, VirtualDriver

from tests.cluster.test_cluster import small_config, trajectories

SENDERS = ("a", "b", "c")
NOTES = 4  # each sender's notes to each recipient, at the run's start


@dataclass(frozen=True, slots=True)
class Note(Message):
    WIRE_NAME: ClassVar[str] = "test.order.Note"
    VERSION: ClassVar[int] = 1
    origin: str
    seq: int
    sent_ns: int


class Sender(Engine):
    """At the start: ``NOTES`` notes to ``sink`` and to ``relay``, a timer at 0; again when its timer fires."""

    def __init__(self, name: str, out: Outbox, driver: VirtualDriver, log: list[tuple[int, str, str, int]]) -> None:
        super().__init__(name, out)
        self.driver, self.log, self.seq = driver, log, 0

    def burst(self, now: int) -> None:
        for _ in range(NOTES):
            for recipient in ("sink", "relay"):
                self.out.send(recipient, Note(self.name, self.seq, now))
            self.seq += 1

    def start(self, now_ns: int) -> None:
        self.burst(now_ns)
        self.driver.plane.timer(now_ns, lambda now: self.log.append((now, "timer", self.name, 0)))
        self.driver.plane.timer(now_ns + 1_000_000, self.burst)


class Relay(Engine):
    """Passes each note on to ``sink`` at once (what it sends while the instant is delivered)."""

    @on(Note)
    def on_note(self, now_ns: int, msg: Note, sender: str) -> None:
        self.out.send("sink", Note(f"relay<{msg.origin}", msg.seq, now_ns))


class Sink(Engine):
    """Records ``(now, sender, origin, seq)`` of every note."""

    def __init__(self, name: str, out: Outbox, log: list[tuple[int, str, str, int]]) -> None:
        super().__init__(name, out)
        self.log = log

    @on(Note)
    def on_note(self, now_ns: int, msg: Note, sender: str) -> None:
        assert msg.origin.startswith(sender) or sender == "main"
        assert now_ns >= msg.sent_ns
        self.log.append((now_ns, sender, msg.origin, msg.seq))


def notes_run(order_seed: int | None, message_delay_ns: int = 0) -> list[tuple[int, str, str, int]]:
    """Three senders, a relay and a sink; what the sink saw (and when each sender's timer fired), in order."""
    driver = VirtualDriver(Core(), order_seed=order_seed, message_delay_ns=message_delay_ns)
    log: list[tuple[int, str, str, int]] = []
    for name in SENDERS:
        driver.add(Sender(name, driver.outbox(name), driver, log))
    driver.add(Relay("relay", driver.outbox("relay")))
    driver.add(Sink("sink", driver.outbox("sink"), log))
    for seq in range(NOTES):
        driver.send("sink", Note("main", seq, 0))
    expected = len(SENDERS) * (1 + 2 * 2 * NOTES) + NOTES
    driver.run(lambda: len(log) == expected)
    assert len(log) == expected
    return log


def assert_pairs_in_order(log: list[tuple[int, str, str, int]]) -> None:
    """Each (sender, origin) pair's notes arrive in the order sent, each burst's all of them."""
    seen: dict[tuple[str, str], list[int]] = {}
    for _, sender, origin, seq in log:
        if sender != "timer":
            seen.setdefault((sender, origin), []).append(seq)
    assert all(seqs == sorted(seqs) for seqs in seen.values()), seen
    assert {len(seqs) for pair, seqs in seen.items() if pair != ("main", "main")} == {2 * NOTES}


def test_without_an_order_seed_the_inputs_of_an_instant_come_first_in_first_out() -> None:
    log = notes_run(None)
    first = [(sender, origin, seq) for now, sender, origin, seq in log if now == 0]
    # main's first (sent before the run), then each sender's notes as it sent them at its start, the relay's passes
    # (sent while those were delivered), and the timers last (the core's completions come when nothing is due).
    assert first == [
        *(("main", "main", seq) for seq in range(NOTES)),
        *((name, name, seq) for name in SENDERS for seq in range(NOTES)),
        *(("relay", f"relay<{name}", seq) for name in SENDERS for seq in range(NOTES)),
        *(("timer", name, 0) for name in SENDERS),
    ]
    assert log == notes_run(None)


def test_an_order_seed_draws_other_orders_that_keep_each_pair_in_order() -> None:
    orders = set()
    for seed in range(20):
        log = notes_run(seed)
        assert log == notes_run(seed)  # the driver's own random stream: the same seed, the same order
        assert_pairs_in_order(log)
        assert {now for now, *_ in log} == {0, 1_000_000}  # no message is late without a delay
        orders.add(tuple(log))
    assert len(orders) >= 10
    # Some seed delivers a relayed note before a direct one and a timer before a note: the instant interleaves.
    assert any(
        min(i for i, e in enumerate(log) if e[1] == "relay") < max(i for i, e in enumerate(log) if e[1] in SENDERS)
        for log in map(list, orders)
    )
    assert any(
        min(i for i, e in enumerate(log) if e[1] == "timer") < max(i for i, e in enumerate(log) if e[1] in SENDERS)
        for log in map(list, orders)
    )


@pytest.mark.parametrize("delay_ns", [1, 1_000, 300_000, 5_000_000])
def test_delayed_messages_arrive_within_the_bound_each_pair_in_order(delay_ns: int) -> None:
    late = set()
    for seed in range(8):
        log = notes_run(seed, delay_ns)
        assert log == notes_run(seed, delay_ns)
        assert_pairs_in_order(log)
        for now, sender, origin, _ in log:
            burst_ns = 0 if now < 1_000_000 else 1_000_000
            if sender == "main":  # from outside the engines: not delayed
                assert now == 0
            elif sender == "relay":  # sent when the sender's note arrived, up to the bound after the burst
                assert burst_ns <= now <= burst_ns + 2 * delay_ns
            elif sender != "timer":
                assert burst_ns <= now <= burst_ns + delay_ns
                late.add(now - burst_ns)
    assert len(late) > 1 and max(late) > 0


def test_a_delay_needs_an_order_seed() -> None:
    with pytest.raises(ValueError, match="message_delay_ns"):
        VirtualDriver(Core(), message_delay_ns=10)
    with pytest.raises(ValueError, match="message_delay_ns"):
        VirtualDriver(Core(), order_seed=1, message_delay_ns=-1)


def test_a_run_with_messages_in_flight_is_not_done() -> None:
    # done() is true from the start, but the sink's notes are on their way: the run ends when they arrived.
    driver = VirtualDriver(Core(), order_seed=3, message_delay_ns=50_000)
    log: list[tuple[int, str, str, int]] = []
    driver.add(Relay("relay", driver.outbox("relay")))
    driver.add(Sink("sink", driver.outbox("sink"), log))
    out = driver.outbox("a")
    driver.add(Engine("a", out))
    for seq in range(5):
        out.send("relay", Note("a", seq, 0))
    driver.run(lambda: True)
    assert [seq for *_, seq in log] == list(range(5)) and 0 < driver.now_ns <= 100_000


class Idle(Engine):
    """Asks for nothing."""


class Ticker(Engine):
    """A timer every microsecond, for ever."""

    def __init__(self, name: str, out: Outbox, driver: VirtualDriver) -> None:
        super().__init__(name, out)
        self.driver = driver

    def start(self, now_ns: int) -> None:
        self.driver.plane.timer(now_ns + 1_000, self.start)


@pytest.mark.parametrize("delay_ns", [0, 10_000])
def test_a_deadlock_and_no_progress_are_still_found(delay_ns: int) -> None:
    driver = VirtualDriver(Core(), order_seed=5, message_delay_ns=delay_ns)
    driver.add(Idle("idle", driver.outbox("idle")))
    with pytest.raises(DeadlockError):
        driver.run(lambda: False)
    driver = VirtualDriver(Core(), order_seed=5, message_delay_ns=delay_ns)
    driver.add(Ticker("ticker", driver.outbox("ticker"), driver))
    watch = ProgressWatch(limit_ns=50_000, every_ns=10_000, last_progress_ns=lambda: 0,
                          describe=lambda now, last: f"none since {last}")  # fmt: skip
    with pytest.raises(NoProgressError, match="none since 0"):
        driver.run(lambda: False, watch)


# --- whole cluster runs -----------------------------------------------------------------------------------------


def test_no_order_seed_is_the_default_run_event_for_event() -> None:
    defaults = VirtualDriver.__init__.__kwdefaults__ or {}
    if defaults.get("order_seed") is not None:
        pytest.skip("the session runs with --order-seed (tests/conftest.py)")
    config, work = small_config(), trajectories()
    plain = run_system(config, "dualpath", work)
    assert run_system(config, "dualpath", work, order_seed=None, message_delay_ns=0).event_log_sha256 == (
        plain.event_log_sha256
    )


@pytest.mark.parametrize("system", ["basic", "dualpath"])
def test_an_order_seed_repeats_and_other_seeds_differ(system: str) -> None:
    config, work = small_config(), trajectories()
    runs = {seed: run_system(config, system, work, order_seed=seed) for seed in (1, 2, 3)}
    assert run_system(config, system, work, order_seed=1).event_log_sha256 == runs[1].event_log_sha256
    assert len({run.event_log_sha256 for run in runs.values()}) > 1
    assert all(run.metrics.turns_done == run.turns for run in runs.values())


@pytest.mark.parametrize("delay_ns", [200_000, 2_000_000])
@pytest.mark.parametrize("system", ["basic", "dualpath", "oracle"])
def test_a_cluster_with_delayed_messages_does_every_request(system: str, delay_ns: int) -> None:
    config, work = small_config(), trajectories()
    for seed in (1, 2):
        # run_system checks the event log's invariants and that every request ended once (a failure raises).
        result = run_system(config, system, work, order_seed=seed, message_delay_ns=delay_ns)
        assert result.incomplete is None and result.metrics.turns_done == result.turns > 0
        assert run_system(config, system, work, order_seed=seed, message_delay_ns=delay_ns).event_log_sha256 == (
            result.event_log_sha256
        )
