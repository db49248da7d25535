"""Engine crashes (issue 26): a prefill or decode engine loses its state and comes back empty; its requests are
dispatched again (their hit KV read again, the rest computed again), a request lost too often ends as failed
with its reason, policies see which engines are down, and the checker outside the engines proves every
admitted request ended exactly once and every pool was emptied."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from dualpath_emu.cluster.faults import Fault, RandomFaults
from dualpath_emu.cluster.metrics import Metrics
from dualpath_emu.cluster.observations import Failed, Redispatched, parse
from dualpath_emu.cluster.policies import DualPathPolicy, PrefillAssignment, PrefillView
from dualpath_emu.cluster.run import run_system
from dualpath_emu.cluster.scenario import load_cluster_scenario
from dualpath_emu.cluster.recovery import CrashRecovery
from dualpath_emu.cluster.systems import System

from tests.cluster.test_faults import CONFIG, scenario, with_faults, work

NS = 1_000_000_000


def held_at(metrics: Metrics, t_ns: int, node_of: str) -> int:
    """Requests scheduled on a DE (``de``) or PE (``pe``) before ``t_ns`` that had not ended by then."""
    return sum(1 for rid, done in enumerate(metrics.done_ns) if metrics.scheduled_de_ns[rid] < t_ns < done)


@pytest.mark.parametrize("system", ["basic", "dualpath"])
@pytest.mark.fifo_only  # compares with a reference run or exact times (docs/testing.md)
def test_a_decode_engine_crash_redispatches_what_it_held_and_the_run_ends(system: str) -> None:
    trajectories = work()
    plain = run_system(CONFIG, system, trajectories)
    crashed = run_system(with_faults(Fault("crash", "de1", 1.0, restart_s=3.0)), system, trajectories)
    in_flight = held_at(plain.metrics, 1 * NS, "de")
    assert in_flight > 10  # the crash comes while the decode engines hold many requests
    # Every request the engine held (the same as without the crash up to it) is dispatched again once, and
    # ends: nothing fails, nothing is lost, every pool is empty at the end (else run_system raises).
    assert crashed.redispatches == in_flight and crashed.failed_requests == 0
    assert crashed.turns == plain.turns and crashed.metrics.turns_done == plain.turns
    assert crashed.jct_s > plain.jct_s + 2.0  # nothing decodes for 3 s, and the lost work is done again
    # Their hit KV is read again: more bytes over the storage NICs than without the crash.
    assert sum(crashed.snic_read_bytes.values()) > sum(plain.snic_read_bytes.values())
    [fault] = crashed.extra["faults"]
    assert (fault["kind"], fault["target"], fault["start_s"], fault["end_s"]) == ("crash", "de1", 1.0, 4.0)
    assert fault["redispatched"] == in_flight and fault["turns_per_s_during"] == 0.0 and fault["failed"] == 0


@pytest.mark.parametrize("system", ["basic", "dualpath"])
@pytest.mark.fifo_only  # compares with a reference run or exact times (docs/testing.md)
def test_a_prefill_engine_crash_drops_its_requests_at_their_decode_engine_and_redispatches_them(system: str) -> None:
    trajectories = work()
    plain = run_system(CONFIG, system, trajectories)
    crashed = run_system(with_faults(Fault("crash", "pe0", 0.2, restart_s=2.0)), system, trajectories)
    prefilling = sum(1 for rid, first in enumerate(plain.metrics.first_token_ns)
                     if 0 <= plain.metrics.scheduled_pe_ns[rid] < 0.2 * NS < first)  # fmt: skip
    assert prefilling > 0 and crashed.redispatches == prefilling and crashed.failed_requests == 0
    assert crashed.metrics.turns_done == plain.turns
    assert crashed.jct_s > plain.jct_s


def test_a_request_lost_too_often_ends_failed_with_its_reason_and_its_agent_stops(tmp_path: Path) -> None:
    # The decode engine crashes every 0.3 s for 0.1 s: what it takes in never finishes there.
    crashes = tuple(Fault("crash", "de1", 0.5 + 0.3 * k, restart_s=0.1) for k in range(40))
    trajectories = work(agents=6, rounds=3)
    result = run_system(with_faults(*crashes), "dualpath", trajectories)
    metrics = result.metrics
    assert result.failed_requests > 0
    failed = [rid for rid, t in enumerate(metrics.failed_ns) if t >= 0]
    assert all(metrics.redispatches[rid] == CONFIG.max_redispatches and metrics.done_ns[rid] == -1 for rid in failed)
    # A failed turn ends its agent's trajectory: its later turns are never submitted.
    for rid in failed:
        agent = metrics.agent[rid]
        assert not [r for r in range(rid + 1, len(metrics)) if metrics.agent[r] == agent]
    assert metrics.turns_done + result.failed_requests == result.turns < sum(len(t) for t in trajectories)
    summary = result.summary()
    assert summary["failed_requests"] == len(failed) and summary["redispatches"] == len(metrics.redispatch_ns)
    assert sum(f["failed"] for f in summary["faults"]) >= len(failed)


def test_failed_and_redispatched_are_event_log_lines_read_back_the_same() -> None:
    for record in (Failed(7, "lost to 4 engine crashes (the last of de3)"), Redispatched(7, 2, "pe0")):
        assert parse(record.kind, record.summary()) == record


def test_a_users_policy_sees_which_engines_are_down() -> None:
    seen: list[tuple[int, frozenset[str], int]] = []

    @dataclasses.dataclass
    class Watching(DualPathPolicy):
        def assign_prefill(self, view: PrefillView) -> Sequence[PrefillAssignment]:
            seen.append((len(view.queue), view.health.groups_down, len(view.engines)))
            return super().assign_prefill(view)

    config = dataclasses.replace(CONFIG, pe_nodes=2, de_nodes=1)
    config = with_faults(Fault("crash", "pe1", 0.5, restart_s=2.0), config=config)
    system = System("watching", "DualPath, watching", layerwise=True, dual_path=True, scheduler=Watching)
    run_system(config, system, work())
    down = [engines for _, state, engines in seen if state == {"pe1"}]
    up = [engines for _, state, engines in seen if not state]
    # While pe1 is down the policy is offered only pe0's PEs, and is told why.
    assert down and set(down) == {8} and set(up) == {16}


def test_crashes_read_from_a_scenario_and_drawn_from_the_seed(tmp_path: Path) -> None:
    s = load_cluster_scenario(scenario(tmp_path, '[[faults]]\nkind = "crash"\ntarget = "de1"\nat_s = 1\nrestart_s = 3\n'
                                                  '[random_faults]\ncrash_per_node_hour = 600\nrestart_s = 2\n'))  # fmt: skip
    assert s.config.faults.faults == (Fault("crash", "de1", 1.0, restart_s=3.0),)
    assert s.config.faults.random == RandomFaults(
        {"down": 0.0, "degrade": 0.0, "latency": 0.0, "crash": 600.0}, 60.0, 0.5, 0.001, 2.0
    )
    assert "de1 crashes at 1 s, back 3 s later" in s.describe()
    random = with_faults(random=RandomFaults({"crash": 1800.0}, 60.0, restart_s=1.0))
    a, b = (run_system(random, "dualpath", work(), seed=5) for _ in range(2))
    assert a.event_log_sha256 == b.event_log_sha256 and a.extra["faults"] == b.extra["faults"]
    assert {f["target"] for f in a.extra["faults"]} <= {"pe0", "de1"} and a.extra["faults"]


# --- reads given up on a dead storage NIC ---------------------------------------------------------------------

TWO_PREFILL = dataclasses.replace(CONFIG, pe_nodes=2, prefill_ep_nodes=1, read_timeout_s=5.0)


def test_basic_gives_up_reads_stalled_on_a_dead_storage_nic_and_dispatches_them_again() -> None:
    # Prefill node 0's storage NIC dies at 1 s and stays dead (to the end of the run): Basic reads only there
    # and on pe1, in turn. Each read stalled 5 s on the dead NIC is given up and its request dispatched again:
    # the run ends long before the NIC would be back, every request done or failed with its reason.
    trajectories = work()
    dead = with_faults(Fault("down", "n0.snic", 1.0, None), config=TWO_PREFILL)
    result = run_system(dead, "basic", trajectories)
    m = result.metrics
    assert result.redispatches > 0 and m.turns_done > 0
    assert m.turns_done + result.failed_requests == result.turns
    assert result.jct_s < 200.0
    failed = [rid for rid, t in enumerate(m.failed_ns) if t >= 0]
    assert all(m.redispatches[rid] == TWO_PREFILL.max_redispatches for rid in failed)
    # DualPath reads on the decode side instead: nothing is given up.
    dual = run_system(dead, "dualpath", trajectories)
    assert dual.redispatches == 0 and dual.failed_requests == 0 and dual.metrics.turns_done == dual.turns


def test_a_read_that_is_only_slow_is_never_given_up() -> None:
    # Storage at 1% of its rate for the whole run: reads take long, but the NIC is up: none is given up.
    trajectories = work(agents=8, rounds=2)
    config = with_faults(
        Fault("degrade", "n0.snic", 0.0, None, 0.01), config=dataclasses.replace(CONFIG, read_timeout_s=0.5)
    )
    result = run_system(config, "basic", trajectories)
    assert result.redispatches == 0 and result.metrics.turns_done == result.turns


def test_a_storage_nic_back_up_makes_slow_reads_slow_again_not_lost() -> None:
    # n0's storage NIC is dead for 1 s (less than the timeout), then runs at 0.01% of its rate for the rest of the run: reads
    # take far longer than the 2 s timeout, but on a NIC that is up: none is given up (the engine group heard
    # the NIC come back).
    trajectories = work()
    config = with_faults(Fault("down", "n0.snic", 0.5, 1.0), Fault("degrade", "n0.snic", 1.5, None, 1e-4),
                         config=dataclasses.replace(TWO_PREFILL, read_timeout_s=2.0))  # fmt: skip
    result = run_system(config, "basic", trajectories)
    m = result.metrics
    slowest = max(done - start for start, done in zip(m.read_start_ns, m.read_done_ns) if start >= 0 and done >= 0)
    assert slowest > 2 * NS  # reads did take longer than the timeout
    assert result.redispatches == 0 and result.metrics.turns_done == result.turns


def test_only_a_storage_nic_may_stay_down_to_the_end(tmp_path: Path) -> None:
    s = load_cluster_scenario(scenario(tmp_path, '[[faults]]\nkind = "down"\ntarget = "n0.snic.rx"\nat_s = 1\n'
                                                  "[scheduling]\nread_timeout_s = 10\nmax_redispatches = 1\n"))  # fmt: skip
    assert s.config.faults.faults == (Fault("down", "n0.snic.rx", 1.0, None),)
    assert (s.config.read_timeout_s, s.config.max_redispatches) == (10.0, 1)


# --- a process that died, restarted in its place (a live run's --restart-crashed, emulated) ---------------------


@pytest.mark.parametrize(("target", "system"), [("de1", "basic"), ("de1", "dualpath"), ("pe0", "dualpath")])
def test_an_engine_restarted_in_place_of_a_dead_process_loses_what_the_scheduler_sent_it(
    monkeypatch: pytest.MonkeyPatch, target: str, system: str
) -> None:
    # A process that dies says nothing: here the crashed engine tells nobody what it lost, and what is sent to it
    # while it is dead is lost too. The new process announces itself (Lost "restarted") and the scheduler counts
    # as lost everything it had sent the dead one. Every request still ends exactly once, every pool is empty at
    # the end (the new process announces its pools again), or run_system raises.
    from dualpath_emu.cluster.decode import DecodeGroup
    from dualpath_emu.cluster.engines import EngineGroup
    from dualpath_emu.cluster.prefill import PrefillGroup

    def silent_when_dead(original: Callable[..., None]) -> Callable[..., None]:
        def lose(self: EngineGroup, lost: object, why: str, *kept: object) -> None:
            if why not in ("crash", "down"):  # a live engine still answers a drop
                original(self, lost, why, *kept)

        return lose

    def restart_as_new_process(self: EngineGroup, now: int, msg: object, sender: str) -> None:
        self._down = False
        self.restarted = True
        self.start(now)

    for cls in (DecodeGroup, PrefillGroup):
        monkeypatch.setattr(cls, "_lose", silent_when_dead(cls._lose))
        monkeypatch.setattr(cls, "on_restart", restart_as_new_process)
    trajectories = work()
    plain = run_system(CONFIG, system, trajectories)
    result = run_system(with_faults(Fault("crash", target, 1.0, restart_s=2.0)), system, trajectories)
    assert result.redispatches > 0 and result.failed_requests == 0
    assert result.metrics.turns_done == plain.turns


# --- a process killed between two sends of one handler (issue 26) -------------------------------------------


class _Without:
    """An engine's outbox that loses every message of one type (what a process killed between two sends of one
    handler did not send: ZeroMQ's I/O thread sends after the process decided to)."""

    def __init__(self, out: object, lost: type) -> None:
        self._out, self._lost = out, lost
        self.dropped: list[object] = []

    def send(self, to: str, msg: object) -> None:
        if isinstance(msg, self._lost):
            self.dropped.append(msg)
        else:
            self._out.send(to, msg)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._out, name)


def _killed_between_sends(
    monkeypatch: pytest.MonkeyPatch, cls: type, handler: str, lost: type, at_ns: int
) -> list[object]:
    """The first time ``cls.handler`` sends a ``lost`` message from ``at_ns`` on, that message does not leave,
    the engine's process dies right after (it says nothing of what it loses; what is sent to it while dead is
    lost) and is started again 2 s later as a new process (Lost "restarted"). Returns the messages lost."""
    from dualpath_emu.cluster.engines import EngineGroup
    from dualpath_emu.cluster.messages import Crash

    fired: list[object] = []
    original = getattr(cls, handler)

    def split(self: EngineGroup, now: int, *args: object) -> None:
        if fired or now < at_ns:
            original(self, now, *args)
            return
        out = self.out
        without = self.out = _Without(out, lost)  # type: ignore[assignment]
        try:
            original(self, now, *args)
        finally:
            self.out = out
        if without.dropped:
            fired.extend(without.dropped)
            self.on_crash(now, Crash(), "test")  # type: ignore[attr-defined]
            self.plane.timer(now + 2 * NS, lambda at: restart(self, at))

    def restart(self: EngineGroup, now: int) -> None:
        self._down = False
        self.restarted = True
        self.start(now)

    def silent_when_dead(original: Callable[..., None]) -> Callable[..., None]:
        def lose(self: EngineGroup, lost: object, why: str, *kept: object) -> None:
            if why not in ("crash", "down"):
                original(self, lost, why, *kept)

        return lose

    monkeypatch.setattr(cls, handler, split)
    monkeypatch.setattr(cls, "_lose", silent_when_dead(cls._lose))  # type: ignore[attr-defined]
    return fired


def _spy(monkeypatch: pytest.MonkeyPatch, handler: str) -> list[Any]:
    """The messages the scheduler's crash recovery's ``handler`` is given, as it handles them."""
    seen: list[Any] = []
    original = getattr(CrashRecovery, handler)

    def spy(self: CrashRecovery, now: int, msg: Any, sender: str) -> None:
        seen.append(msg)
        original(self, now, msg, sender)

    monkeypatch.setattr(CrashRecovery, handler, spy)
    return seen


@pytest.mark.parametrize("system", ["basic", "dualpath"])
@pytest.mark.parametrize("lost", ["PrefillDone", "KvReady"])
def test_a_prefill_process_killed_between_its_kv_ready_and_its_prefill_done_ends_each_request_once(
    monkeypatch: pytest.MonkeyPatch, system: str, lost: str
) -> None:
    # KvReady left, PrefillDone did not: the decode group decodes the requests; the scheduler, told the prefill
    # group was restarted, asks the decode groups, which keep them (they are not dispatched again: they would end
    # twice). PrefillDone left, KvReady did not: the decode group drops them when asked, and they are dispatched
    # again (else it waits for ever for their KV). Every request ends once, every pool is empty (or run_system
    # raises).
    from dualpath_emu.cluster import messages
    from dualpath_emu.cluster.prefill import PrefillGroup

    trajectories = work()
    plain = run_system(CONFIG, system, trajectories)
    fired = _killed_between_sends(monkeypatch, PrefillGroup, "_finish", getattr(messages, lost), NS)
    answers: list[messages.Lost] = _spy(monkeypatch, "_dropped_from")
    result = run_system(CONFIG, system, trajectories)
    [message] = fired
    split = set(message.rids)  # type: ignore[attr-defined]
    # The decode groups kept the requests whose KV had come (not dispatched again: those not ended by the
    # restart are kept), and dropped those whose KV never would (dispatched again).
    if lost == "PrefillDone":
        assert any(a.kept for a in answers)
        assert not any(result.metrics.redispatches[rid] > 0 for rid in split)
    else:
        assert split <= {rid for a in answers for rid in a.rids}
        assert all(result.metrics.redispatches[rid] == 1 for rid in split)
    assert result.failed_requests == 0 and result.metrics.turns_done == plain.turns == result.turns
    assert sum(1 for t in result.metrics.done_ns if t >= 0) == plain.turns


@pytest.mark.parametrize("system", ["basic", "dualpath"])
@pytest.mark.parametrize("lost", ["TurnDone", "DecodeDone"])
def test_a_decode_process_killed_between_its_decode_done_and_its_turn_done_ends_each_request_once(
    monkeypatch: pytest.MonkeyPatch, system: str, lost: str
) -> None:
    # DecodeDone left, TurnDone did not: the scheduler, told the decode group was restarted, asks the client,
    # which had not ended those turns: the scheduler sends their TurnDone (else the client waits for ever).
    # TurnDone left, DecodeDone did not: the client had ended them: they are not dispatched again (else they
    # end twice).
    from dualpath_emu.cluster import messages
    from dualpath_emu.cluster.decode import DecodeGroup

    trajectories = work()
    plain = run_system(CONFIG, system, trajectories)
    fired = _killed_between_sends(monkeypatch, DecodeGroup, "_report_done", getattr(messages, lost), NS)
    answers: list[messages.TurnsEnded] = _spy(monkeypatch, "turns_ended")
    result = run_system(CONFIG, system, trajectories)
    [message] = fired
    split = set(message.rids)  # type: ignore[attr-defined]
    # The client was asked once: it had not ended the turns whose TurnDone was lost (the scheduler told it),
    # and had ended those whose DecodeDone was lost (they were not dispatched again).
    [answer] = answers
    assert split <= set(answer.asked)
    if lost == "TurnDone":
        assert not split & set(answer.ended)
    else:
        assert split <= set(answer.ended)
    assert not any(result.metrics.redispatches[rid] > 0 for rid in split)
    assert result.failed_requests == 0 and result.metrics.turns_done == plain.turns == result.turns
    assert sum(1 for t in result.metrics.done_ns if t >= 0) == plain.turns
