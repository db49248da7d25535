"""A live run's process that really dies (issue 26): with ``--restart-crashed`` an engine group's process killed
mid-run is started again in its place and the run goes on (its work dispatched again); without it, or for a
process whose state is the run's, the run ends naming the process. The pieces: the launcher's restart, the
transport's incarnations (what was sent to the dead process is dropped), the data-plane service's replacement
of a dead requester, and ``collect`` reading every incarnation's files."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from dualpath_emu.cluster.live import run_live
from dualpath_emu.cluster.systems import SYSTEMS
from dualpath_emu.messages import Codec, Message, MessageRegistry
from dualpath_emu.runtime.actors import Actor
from dualpath_emu.runtime.node import TEST_DIE_ENV
from dualpath_emu.runtime.zmq_transport import ZmqActorSystem
from tests.cluster.test_live import TIME_SCALE, small_config, work

pytestmark = pytest.mark.processes  # live runs whose processes are killed and started again

KILL_AFTER_S = 4.0
"""When the test's victim kills itself: emulated seconds after its actors start (a third into the run or so:
reads, prefills and decodes of its requests under way)."""


def _die(monkeypatch: pytest.MonkeyPatch, run_dir: Path, victim: str) -> None:
    """``victim`` of the run in ``run_dir`` kills itself with SIGKILL mid-run (the node's test-only hook, at a
    point where what it had sent has left it: see TEST_DIE_ENV and docs/live.md on a death between two sends)."""
    monkeypatch.setenv(TEST_DIE_ENV, f"{run_dir.resolve()}|{victim}|{KILL_AFTER_S}")


@pytest.mark.parametrize(("victim", "system"), [("de1", "dualpath"), ("pe0", "basic")])
def test_an_engine_groups_process_killed_mid_run_is_started_again_and_the_run_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim: str, system: str
) -> None:
    trajectories = work()
    total = sum(len(t) for t in trajectories)
    pids: dict[str, list[int]] = {}
    run_dir = tmp_path / "run"
    _die(monkeypatch, run_dir, victim)
    begun = time.monotonic()
    result = run_live(
        small_config(), SYSTEMS[system], trajectories, run_dir=run_dir, time_scale=TIME_SCALE,
        placement_kind="groups", restart_crashed=True, timeout_s=60.0,
        on_start=lambda name, pid: pids.setdefault(name, []).append(pid),
    )  # fmt: skip
    assert time.monotonic() - begun < 40
    killed, restarted = pids[victim]  # the first process, and the one started in its place
    # Every admitted request ended exactly once (collect checks it across every incarnation's event log, and
    # every byte: the dead one's as the data plane tallied them), here all of them done.
    assert result.turns == total and result.complete and result.failed_requests == 0
    assert result.metrics.turns_done == total
    assert result.redispatches > 0  # what the dead process held was dispatched again
    [restart] = result.extra["restarts"]
    assert restart["process"] == victim and restart["incarnation"] == 1
    assert restart["dead_pid"] == killed and restart["ended"] == "was killed by SIGKILL"
    assert restart["pid"] == restarted
    assert 0 < restart["dead_last_event_s"] < restart["restarted_s"] < result.jct_s + result.extra["emulated_start_s"]
    assert result.summary()["restarts"] == result.extra["restarts"]  # what summary.json says
    # Each incarnation has its own files; the dead one's event log (written as it went) is kept and counted.
    assert (run_dir / f"{victim}.events").stat().st_size > 0 and (run_dir / f"{victim}.1.events").exists()
    assert not (run_dir / f"{victim}.part").exists() and (run_dir / f"{victim}.1.part").exists()
    service = json.loads((run_dir / "dataplane.json").read_text())["report"]
    [replaced] = service["replaced"]
    assert replaced["name"] == victim and replaced["incarnation"] == 0 and replaced["booked"]
    assert service["requesters"][victim]["incarnation"] == 1


def _pid_of(run_dir: Path, process: str, deadline_s: float = 30.0) -> int:
    """The pid of the live run's process ``process`` whose run directory is ``run_dir`` (from /proc)."""
    deadline = time.monotonic() + deadline_s
    wanted = [b"--process", process.encode(), b"--run-dir", str(run_dir).encode()]
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(argv[i : i + len(wanted)] == wanted for i in range(len(argv))):
                return int(entry)
        time.sleep(0.05)
    raise AssertionError(f"no process {process} under {run_dir}")


def _run_cli_and_kill(tmp_path: Path, victim: str, *options: str) -> subprocess.CompletedProcess[str]:
    """``dualpath-emu run`` live (the small cluster of test_live), killing ``victim`` with SIGKILL once
    the run is under way."""
    base = tmp_path / "runs"
    command = [
        sys.executable, "-m", "dualpath_emu.cli", "run", "ds27b-1p1d-offline", "--mode", "realtime",
        "--system", "basic",
        "--agents", "16", "--set", "workload.max_rounds=3", "--time-scale", "4",
        "--run-dir", str(base), "--quiet", "--timeout", "120", *options,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "python")}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as cli:
        run_dir = base / "basic"
        pid = _pid_of(run_dir, victim)
        deadline = time.monotonic() + 30
        while not (run_dir / "progress.json").exists() and time.monotonic() < deadline:  # the client is under way
            time.sleep(0.02)
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        out, err = cli.communicate(timeout=60)
    return subprocess.CompletedProcess(command, cli.returncode, out, err)


def test_without_the_option_a_killed_engine_groups_process_ends_the_run_naming_it(tmp_path: Path) -> None:
    done = _run_cli_and_kill(tmp_path, "de1")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("dualpath-emu: error: basic: process 'de1'") and "was killed by SIGKILL" in first
    assert "--restart-crashed" in done.stderr  # it says how the run could have gone on


@pytest.mark.parametrize(("victim", "advised"), [("pe0", True), ("scheduler", False)])
def test_a_restart_is_advised_only_for_a_process_it_would_have_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], victim: str, advised: bool
) -> None:
    """Issue 34: on the model plane, a dead engine group's process is advised --restart-crashed; the scheduler's
    (its state is the run's) is not. (The host backend, which refuses the option, is never advised it:
    tests/host/test_host_diagnosis.py.)"""
    from dualpath_emu.cli import main

    base = tmp_path / "runs"
    _die(monkeypatch, base / "basic", victim)
    status = main(["run", "ds27b-1p1d-offline", "--mode", "realtime", "--system", "basic", "--agents", "16",
                   "--set", "workload.max_rounds=3", "--time-scale", "4", "--run-dir", str(base), "--quiet",
                   "--timeout", "120"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 1 and f"process {victim!r}" in err and "was killed by SIGKILL" in err, err
    assert ("--restart-crashed would have started it again" in err) == advised


def test_with_the_option_a_process_whose_state_is_the_runs_still_ends_it_saying_so(tmp_path: Path) -> None:
    done = _run_cli_and_kill(tmp_path, "scheduler", "--restart-crashed")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("dualpath-emu: error: basic: process 'scheduler'") and "was killed by SIGKILL" in first
    assert "not one the run starts again" in first and "de1" in first


# --- the pieces ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Note(Message):
    WIRE_NAME: ClassVar[str] = "test.restart.Note"
    VERSION: ClassVar[int] = 1

    n: int


class Inbox(Actor):
    def __init__(self, system: ZmqActorSystem, name: str) -> None:
        super().__init__(system, name)
        self.notes: list[int] = []

    def receive(self, now_ns: int, msg: Message, sender: str) -> None:
        assert isinstance(msg, Note)
        self.notes.append(msg.n)


def _codec() -> Codec:
    registry = MessageRegistry()
    registry.register(Note)
    return Codec(registry)


def test_what_was_sent_to_a_dead_incarnation_is_dropped_and_what_follows_news_of_the_new_one_is_not(
    tmp_path: Path,
) -> None:
    # a keeps sending to b's actor; b dies (its socket closed) and a new b (incarnation 1) binds the same
    # endpoint: ZeroMQ hands it what a queued meanwhile, which it drops as stale; once a has handled a message
    # from the new b, what a sends is delivered.
    folder = tmp_path / "s"
    folder.mkdir(mode=0o700)
    a_at, b_at = f"ipc://{folder}/a", f"ipc://{folder}/b"

    def system(name: str, bind: str, incarnation: int, peer: str, peer_at: str, actor: str) -> ZmqActorSystem:
        return ZmqActorSystem(_codec(), bind=bind, name=name, incarnation=incarnation, address_book={actor: peer_at},
                              peers={peer_at: peer})  # fmt: skip

    async def main() -> tuple[list[int], list[int], int, int]:
        a = system("a", a_at, 0, "b", b_at, "inbox_b")
        await a.open()
        Inbox(a, "inbox_a").start()
        old = system("b", b_at, 0, "a", a_at, "inbox_a")
        await old.open()
        first = Inbox(old, "inbox_b")
        first.start()
        a.tell("inbox_b", Note(1), sender="inbox_a")
        await _until(lambda: first.notes == [1])
        await old.close()  # it dies
        for n in (2, 3):
            a.tell("inbox_b", Note(n), sender="inbox_a")  # queued for the dead one
        new = system("b", b_at, 1, "a", a_at, "inbox_a")
        await new.open()
        second = Inbox(new, "inbox_b")
        second.start()
        await _until(lambda: new.counters["transport.stale"] == 2)
        new.tell("inbox_a", Note(10), sender="inbox_b")  # news of the new incarnation
        await _until(lambda: a.actor("inbox_a").notes == [10])  # type: ignore[attr-defined]
        a.tell("inbox_b", Note(4), sender="inbox_a")
        await _until(lambda: second.notes == [4])
        stale, dropped = new.counters["transport.stale"], new.dropped
        await new.close()
        await a.close()
        return first.notes, second.notes, stale, dropped

    first, second, stale, dropped = asyncio.run(asyncio.wait_for(main(), 20))
    assert first == [1] and second == [4] and stale == dropped == 2


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_prepared_run_records_the_option_and_launch_only_restarts_over_tcp_with_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `run --prepare --restart-crashed` writes it into the run; `launch --only` (here every process on one host)
    # starts de1 again when it is killed: its new transport and data-plane link connect under its name with its
    # CURVE keys, and the gathered files collect into a complete run.
    from dualpath_emu.cluster.live import collect_dir, prepare_live, registry
    from dualpath_emu.runtime.scenario import load_run_scenario

    run_dir = tmp_path / "run"
    commands = prepare_live(small_config(), SYSTEMS["dualpath"], work(), run_dir=run_dir, time_scale=TIME_SCALE,
                            port_base=47_400, restart_crashed=True, timeout_s=120.0)  # fmt: skip
    assert load_run_scenario(run_dir / "run.toml", registry()).restart_crashed == ("pe0", "de1", "de2")
    names = ",".join(name for _, name, _ in commands)
    command = [sys.executable, "-m", "dualpath_emu.cli", "launch", str(run_dir / "run.toml"), "--run-dir", str(run_dir),
               "--only", names]  # fmt: skip
    _die(monkeypatch, run_dir, "de1")
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as launcher:
        pid = _pid_of(run_dir, "de1")
        _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, err
    assert f"process 'de1' (pid {pid}) was killed by SIGKILL before the run was complete; started it again" in err
    result, _ = collect_dir(run_dir)  # every request ended once, every byte accounted, or it raises
    assert result.turns == sum(len(t) for t in work()) and result.redispatches > 0
    [restart] = result.extra["restarts"]
    assert (restart["process"], restart["dead_pid"]) == ("de1", pid)


def test_the_live_guide_states_the_restart_limit() -> None:
    from dualpath_emu.runtime.launcher import MAX_RESTARTS

    guide = " ".join((Path(__file__).resolve().parents[2] / "docs" / "live.md").read_text().split())
    assert f"at most {MAX_RESTARTS} times per process" in guide and "--restart-crashed" in guide


def test_the_data_plane_replaces_a_dead_requester_with_its_next_incarnation(tmp_path: Path) -> None:
    # Incarnation 0 of "w" asks for a transfer and a storage read and goes silent (dead); incarnation 1 says hello
    # under its name and replaces it: the dead one's completions go nowhere, a hello that is not a later
    # incarnation is still refused, and the run drains on the new one's bye. The report tallies what the dead
    # one asked for, per port, as its ledger would have booked it.
    import msgpack  # type: ignore[import-untyped]
    import zmq

    from dualpath_emu.runtime.dataplane.protocol import PROTOCOL_VERSION as V
    from tests.runtime.test_dataplane import raw_peer, service

    folder = tmp_path / "d"
    folder.mkdir(mode=0o700)

    def ask(peer: zmq.Socket[bytes], message: list[object]) -> None:
        peer.send(msgpack.packb(message))

    def answers(peer: zmq.Socket[bytes], wait_s: float = 0.3) -> list[list[object]]:
        out = []
        while peer.poll(int(wait_s * 1000)):
            out.append(msgpack.unpackb(peer.recv()))
        return out

    storage = {0: ((2, 3), (3, 2))}  # test_dataplane's core: cluster = port 2, snic = port 3
    GB = 1_000_000_000
    with service(folder, requesters=["w"], replaceable=["w"], storage_paths=storage) as svc:
        with raw_peer(svc.endpoint) as dead, raw_peer(svc.endpoint) as new, raw_peer(svc.endpoint) as third:
            ask(dead, [V, "hello", "w", 1, 1.0])
            assert answers(dead)[0][1] == "welcome"
            ask(dead, [V, "submit", 1, 0, [[[0], 0, GB, 7]], [], [[0, "read", 0, GB, 8]], [], [], []])  # 1 s each
            ask(dead, [V, "ping", 2, 0])  # answered after the submission is taken (one connection keeps its order)
            assert [m[1] for m in answers(dead, 0.05)] == ["pong"]
            ask(new, [V, "hello", "w", 2, 1.0, 1])
            assert answers(new, 0.1)[0][1] == "welcome"
            ask(third, [V, "hello", "w", 3, 1.0, 1])  # not a later incarnation than the connected one
            assert answers(third, 0.1)[0][1] == "refused"
            time.sleep(1.2)  # the dead one's transfer and read complete meanwhile
            assert [m for m in answers(dead) + answers(new) if m[1] == "done"] == []
            ask(new, [V, "bye", 5, True])
            svc.join()
    assert svc.outcome == "drained" and svc.report is not None
    [replaced] = svc.report["replaced"]
    assert (replaced["name"], replaced["incarnation"], replaced["pid"]) == ("w", 0, 1)
    booked = {(port, lane): size for port, lane, size, _ in replaced["booked"]}
    assert booked == {(0, 0): GB, (2, 0): GB, (3, 0): GB}
    assert svc.report["requesters"]["w"]["incarnation"] == 1
    assert svc.report["counters"]["completions_dropped"] == 2


def test_an_end_a_dead_process_observed_but_never_told_is_void_when_its_request_was_dispatched_again(
    tmp_path: Path,
) -> None:
    # The dead incarnation observed r5's end (its log was written before its messages left) but died before the
    # messages left: the scheduler dispatched r5 again and it ended elsewhere. r6's end in the same log, which the
    # scheduler heard of, stands; so does a cut last line's absence (it is skipped).
    from dualpath_emu.cluster.live.collect import _merged_events
    from dualpath_emu.cluster.observations import Ended, Redispatched
    from dualpath_emu.runtime.eventlog import event_line

    def log(name: str, events: list[tuple[int, str, Ended | Redispatched]], cut: str = "") -> Path:
        path = tmp_path / name
        lines = [event_line((t, i, actor, r.kind, r.summary())) for i, (t, actor, r) in enumerate(events)]
        path.write_text("".join(lines) + cut)
        return path

    dead = log("de1.events", [(10, "de1", Ended(5)), (11, "de1", Ended(6))], cut="12\t2\tde1\tend\tr")
    scheduler = log("scheduler.events", [(20, "scheduler", Redispatched(5, 1, "de1"))])
    new = log("de2.events", [(30, "de2", Ended(5))])
    events, voided = _merged_events([dead, scheduler, new], {0})
    assert voided == 1
    assert [(t, kind, summary) for t, _, _, kind, summary in events] == [
        (11, Ended(6).kind, Ended(6).summary()),
        (20, Redispatched(5, 1, "de1").kind, Redispatched(5, 1, "de1").summary()),
        (30, Ended(5).kind, Ended(5).summary()),
    ]
    assert [seq for _, seq, _, _, _ in events] == [0, 1, 2]
    assert _merged_events([dead, scheduler, new])[1] == 0  # not a dead process's log: nothing is void
