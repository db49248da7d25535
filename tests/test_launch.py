"""Run scenarios end to end (``dualpath-emu launch``): the pipeline scenario in virtual time is deterministic
(same event-log SHA-256 on two runs and under PYTHONHASHSEED=0 and =random, a different one for another seed);
in real time across three OS processes over ZeroMQ every message is delivered exactly once; a crashed or
killed process, Ctrl-C and a killed launcher end the run with a clear report and leave no process behind; a
failing actor ends the run with a non-zero status, the seed and the last events; bad scenario files get
exit status 2 and a message naming the file and key.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dualpath_emu.cli import main as cli_main
from dualpath_emu.runtime.eventlog import parse_line
from dualpath_emu.runtime.launcher import check_delivery
from dualpath_emu.scenarios import FOLDER

REPO = Path(__file__).resolve().parent.parent
PIPELINE = FOLDER / "pipeline.toml"
WAIT_S = 60.0


def scenario(tmp_path: Path, name: str = "run.toml", **pipeline: object) -> Path:
    """The packaged pipeline.toml with some [pipeline] keys replaced (values are TOML literals)."""
    text = PIPELINE.read_text()
    for key, value in pipeline.items():
        text, n = re.subn(rf"(?m)^{key} = \S+", f"{key} = {value}", text)
        assert n == 1, key
    path = tmp_path / name
    path.write_text(text)
    return path


def dualpath_emu(*args: str, env: dict[str, str] | None = None, timeout: float = WAIT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dualpath_emu.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def sha_of(output: str) -> str:
    match = re.search(r"^event log sha256 ([0-9a-f]{64})$", output, re.M)
    assert match, output
    return match.group(1)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie does not count: it has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_until(condition: object, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# --- virtual time ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("hash_seed", ["0", "random"])
def test_virtual_pipeline_log_is_identical_across_runs_and_hash_seeds(tmp_path: Path, hash_seed: str) -> None:
    log = tmp_path / "events.log"
    first = dualpath_emu("launch", str(PIPELINE), "--event-log", str(log), env={"PYTHONHASHSEED": hash_seed})
    assert first.returncode == 0, first.stderr
    again = dualpath_emu("launch", str(PIPELINE), env={"PYTHONHASHSEED": "12345"})
    assert sha_of(first.stdout) == sha_of(again.stdout)
    other_seed = dualpath_emu("launch", str(PIPELINE), "--seed", "2")
    assert sha_of(other_seed.stdout) != sha_of(first.stdout)
    # The printed digest is the file's, and the file is the canonical log of a complete run.
    import hashlib

    assert hashlib.sha256(log.read_bytes()).hexdigest() == sha_of(first.stdout)
    events = [parse_line(line) for line in log.read_text().splitlines(keepends=True)]
    assert [e.seq for e in events] == list(range(len(events)))
    assert all(a.t_ns <= b.t_ns for a, b in zip(events, events[1:]))
    kinds = {e.kind for e in events}
    assert {"tell", "ask", "deliver", "handle", "reply", "answer", "moved", "start", "stop"} <= kinds
    assert check_delivery([log]).ok
    assert '"done": 200, "duplicates": 0' in first.stdout


def test_virtual_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["launch", str(PIPELINE), "--json", "--seed", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seed"] == 3 and out["mode"] == "virtual"
    assert out["summary"]["done"] == 200 and out["summary"]["duplicates"] == 0
    assert len(out["event_log_sha256"]) == 64


def test_virtual_actor_failure_exits_non_zero_with_seed_and_last_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario(tmp_path, fail_at_job=7)
    assert cli_main(["launch", str(path), "--seed", "5"]) == 1
    err = capsys.readouterr().err
    assert "actor 'worker1' failed: InjectedFailure: job 7" in err
    assert "\nseed 5\n" in err
    assert re.search(r"last 20 events:\n(  \d+ \d+ \S+ \S+ .*\n){20}", err), err
    assert "Traceback" not in err


# --- real time, several processes ----------------------------------------------------------------------


def test_realtime_pipeline_across_three_processes_delivers_every_message_once(tmp_path: Path) -> None:
    path = scenario(tmp_path, jobs=60)
    run_dir = tmp_path / "run"
    done = dualpath_emu("launch", str(path), "--mode", "realtime", "--json", "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["summary"]["done"] == 60 and out["summary"]["duplicates"] == 0
    assert set(out["processes"]) == {"source", "workers", "sink"}
    assert len({p["pid"] for p in out["processes"].values()}) == 3
    assert all(p["status"] == 0 and p["counters"]["rejected"] == 0 for p in out["processes"].values())
    logs = [run_dir / f"{name}.events" for name in ("source", "workers", "sink")]
    delivery = check_delivery(logs)
    assert delivery.ok and delivery.sent == out["messages_sent"] > 60 * 2
    # Messages really crossed processes: Jobs were sent in one log and delivered in another.
    source_sends = [parse_line(l) for l in logs[0].read_text().splitlines() if "\ttell\t" in l]
    assert any("Job source->worker" in e.summary for e in source_sends)
    for pid in (p["pid"] for p in out["processes"].values()):
        assert not alive(pid)


def start_long_run(tmp_path: Path) -> tuple[subprocess.Popen[str], dict[str, int], Path]:
    """A real-time run that would take minutes; returns the launcher, the children's pids, the run dir."""
    path = scenario(tmp_path, jobs=100000, gap_s=0.01)
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "dualpath_emu.cli", "launch", str(path), "--mode", "realtime", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids: dict[str, int] = {}
    assert launcher.stdout is not None
    while len(pids) < 3:
        line = launcher.stdout.readline()
        assert line, "the launcher ended before starting its processes"
        match = re.match(r"  started (\w+) \(pid (\d+)\)", line)
        if match:
            pids[match.group(1)] = int(match.group(2))
    wait_until(lambda: all((run_dir / f"{n}.ready").exists() for n in pids), "every process ready")
    time.sleep(0.5)  # the run is under way
    return launcher, pids, run_dir


def test_killing_one_process_ends_the_run_with_a_clear_error_and_no_orphans(tmp_path: Path) -> None:
    launcher, pids, _ = start_long_run(tmp_path)
    try:
        os.kill(pids["workers"], signal.SIGKILL)
        _, err = launcher.communicate(timeout=WAIT_S)
    finally:
        launcher.kill()
    assert launcher.returncode == 1
    assert f"process 'workers' (pid {pids['workers']}) was killed by SIGKILL before the run was complete" in err
    assert "seed 1" in err and "Traceback" not in err
    for pid in pids.values():
        assert not alive(pid)


def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    launcher, pids, _ = start_long_run(tmp_path)
    try:
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=WAIT_S)
    finally:
        launcher.kill()
    assert launcher.returncode == 130
    assert "interrupted by SIGINT; stopped 3 process(es)" in err
    for pid in pids.values():
        assert not alive(pid)


def test_a_killed_launcher_leaves_no_orphans(tmp_path: Path) -> None:
    launcher, pids, _ = start_long_run(tmp_path)
    launcher.kill()
    launcher.communicate(timeout=WAIT_S)
    wait_until(lambda: not any(alive(pid) for pid in pids.values()), "the children to end", timeout=20)


def test_realtime_actor_failure_is_reported_with_the_childs_output(tmp_path: Path) -> None:
    path = scenario(tmp_path, fail_at_job=5)
    failed = dualpath_emu("launch", str(path), "--mode", "realtime")
    assert failed.returncode == 1
    assert "process 'workers'" in failed.stderr and "exited with status 1" in failed.stderr
    assert "InjectedFailure: job 5" in failed.stderr and "| seed 1" in failed.stderr
    assert "Traceback" not in failed.stderr


# --- bad scenario files -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("seed = 1", "seed = \"one\""), "key 'seed': expected an integer in [0, 9223372036854775807], got the string 'one'"),
        (("jobs = 200", "jobz = 200"), "unknown key 'pipeline.jobz'"),
        (("mode = \"virtual\"", "mode = \"fast\""), "key 'mode': expected one of 'virtual', 'realtime', got the string 'fast'"),
        (('actors = ["sink"]', 'actors = ["source"]'), "key 'process[2].actors': expected actors not already in process 'source'"),
        (('actors = ["sink"]', 'actors = ["sinks"]'), "key 'process[2].actors': expected names of the application's actors"),
        (('actors = ["sink"]', 'actors = []'), "key 'process[2].actors': expected a non-empty list of strings"),
        (("app = \"pipeline\"", "app = \"nope\""), "key 'app': expected one of 'pipeline', got 'nope'"),
        (("time_scale = 1.0", "time_scale = 0"), "key 'time_scale': expected a number in [1e-6, 1e6], got 0"),
        (("seed = 1", "seed = [1"), "not valid TOML"),
    ],
)
def test_bad_scenarios_exit_2_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, str], message: str
) -> None:
    text = PIPELINE.read_text()
    assert edit[0] in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(edit[0], edit[1], 1))
    assert cli_main(["launch", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dualpath-emu: error: {path}: ")
    assert message in err
    assert "Traceback" not in err


def test_missing_scenario_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli_main(["launch", str(tmp_path / "none.toml")]) == 2
    assert "none.toml: no such file" in capsys.readouterr().err


@pytest.mark.xfail(
    reason="issue 14: ZmqActorSystem refuses tcp:// without keys; node.py / the launcher do not pass a run's keys "
    "yet (another change of issue 14). Strict: remove this mark once they do.",
    strict=True,
)
def test_realtime_over_tcp_loopback_with_a_time_scale(tmp_path: Path) -> None:
    text = scenario(tmp_path, jobs=20).read_text().replace('transport = "ipc"', 'transport = "tcp"')
    path = tmp_path / "tcp.toml"
    path.write_text(text)
    done = dualpath_emu("launch", str(path), "--mode", "realtime", "--time-scale", "5", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["summary"]["done"] == 20 and out["summary"]["duplicates"] == 0
