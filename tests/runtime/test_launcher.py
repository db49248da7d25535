"""Run scenarios end to end (``dualpath-emu launch``), with the cluster's live run (``run.toml``, written by
``cluster.live.write_run``): across the data plane and five processes over tcp loopback with the run's CURVE keys,
every message is delivered exactly once and the data plane's report reaches the summary; no endpoint is on a
command line (the run description, mode 0600, has them; the socket directory is 0700); Ctrl-C and a killed
launcher leave no process behind; a busy process is not taken for a hung one, and one busy past
``busy_timeout_s`` is named busy, with where; a failing engine ends the run with a non-zero status, the
child's output and the seed; bad scenario files get exit status 2 and a message naming the file and key.
(Killed and stopped processes: ``tests/cluster/test_live.py``; a run prepared by hand: the same.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dualpath_emu.cli import main as cli_main
from dualpath_emu.cluster.live import write_run
from dualpath_emu.cluster.systems import SYSTEMS
from dualpath_emu.cluster.user_systems import SystemLoader
from dualpath_emu.runtime.eventlog import parse_line, write_event_log
from dualpath_emu.runtime.delivery import check_delivery
from tests.cluster.test_live import small_config, work

pytestmark = pytest.mark.processes  # each test starts `dualpath-emu` processes

WAIT_S = 60.0
PROCESSES = ("scheduler", "client", "pe0", "de1", "de2")
"""The processes of the small cluster's ``groups`` placement, in start order after the data plane."""
FAILING_POLICY = """
from dataclasses import dataclass

from dualpath_emu.cluster.policies import DualPathPolicy


@dataclass
class Failing(DualPathPolicy):
    def assign_prefill(self, view):
        raise RuntimeError("the policy fails on purpose")
"""


def run_toml(tmp_path: Path, *, agents: int = 24, system: str = "dualpath", **keys: object) -> Path:
    """A live run of the small DS 27B 1P2D cluster written into ``tmp_path/run`` (``write_run``'s options from
    ``keys``; those it does not take, such as ``hang_timeout_s``, added to the scenario's top table)."""
    options = {k: v for k, v in keys.items() if k in ("time_scale", "transport", "timeout_s")}
    chosen = SYSTEMS[system] if system in SYSTEMS else SystemLoader(tmp_path, "test").load(system)
    path = write_run(small_config(), chosen, work(agents), run_dir=tmp_path / "run", **options)  # type: ignore[arg-type]
    extra = "".join(f"{k} = {v!r}\n" for k, v in keys.items() if k not in options)
    text = path.read_text()
    path.write_text(text.replace("\n[cluster]", f"\n{extra}[cluster]", 1))
    return path


def dualpath_emu(
    *args: str, env: dict[str, str] | None = None, timeout: float = WAIT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dualpath_emu.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})  # fmt: skip


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


def test_the_delivery_check_counts_a_tell_after_its_recipient_stopped_as_dropped_not_lost(tmp_path: Path) -> None:
    # The run's end races its last messages: a DecodeDone told once the scheduler had stopped, its process gone
    # before it arrived, was reported lost (make test-processes, a loaded machine). One told before is lost.
    scheduler, de = tmp_path / "scheduler.events", tmp_path / "de.events"
    write_event_log([(100, 0, "scheduler", "stop", "scheduler")], scheduler)
    late, early = "#7 DecodeDone de->scheduler", "#6 DecodeDone de->scheduler"
    write_event_log([(90, 0, "de", "tell", early), (100, 1, "de", "tell", late)], de)
    report = check_delivery([scheduler, de])
    assert report.lost == [early] and report.to_stopped == 1 and report.sent == 2


def test_a_run_over_tcp_delivers_every_message_once_with_the_runs_keys(tmp_path: Path) -> None:
    path = run_toml(tmp_path, agents=8, time_scale=4.0, transport="tcp")
    run_dir = path.parent
    done = dualpath_emu("launch", str(path), "--json", "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["summary"]["turns"] == sum(len(t) for t in work(8))
    assert set(out["processes"]) == set(PROCESSES)
    assert all(p["status"] == 0 and p["counters"]["rejected"] == 0 for p in out["processes"].values())
    logs = [run_dir / f"{name}.events" for name in PROCESSES]
    delivery = check_delivery(logs)
    assert delivery.ok and delivery.sent == out["messages_sent"] > 0
    # Messages really crossed processes: the scheduler's tasks were sent in its log and delivered in pe0's.
    sent = [parse_line(line) for line in logs[0].read_text().splitlines() if "\ttell\t" in line]
    assert any("scheduler->pe0" in e.summary for e in sent)
    for pid in (p["pid"] for p in out["processes"].values()):
        assert not alive(pid)
    plane = out["dataplane"]
    assert plane["counters"]["requests"] > 0 and plane["counters"]["rejected"] == 0
    for name in PROCESSES:
        client = plane["processes"][name]
        # ± RTT/2 of wall time, in emulated ns (× the time scale, 4)
        assert 0 < client["rtt_ns"] < 1e9 and client["offset_uncertainty_ns"] <= 2 * client["rtt_ns"] + 4
    final = json.loads((run_dir / "dataplane.json").read_text())
    assert final["status"] == 0 and final["outcome"] == "drained" and final["report"]["pending"] == 0
    # Over tcp the run has CURVE keys (one pair per process, the data plane's too) in a private directory.
    description = json.loads((run_dir / "run.json").read_text())
    assert stat.S_IMODE((run_dir / "run.json").stat().st_mode) == 0o600
    keys = Path(description["keys"])
    assert keys == (run_dir / "keys").resolve() and stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert sorted(p.name for p in keys.glob("*.key")) == sorted(f"{n}.key" for n in ("dataplane", *PROCESSES))
    assert description["dataplane"]["endpoint"].startswith("tcp://127.0.0.1:")
    assert all((run_dir / f"{name}.out").exists() for name in ("dataplane", *PROCESSES))


def start_long_run(tmp_path: Path) -> tuple[subprocess.Popen[str], dict[str, int], Path]:
    """A live run that would take minutes (the data plane and five processes); returns the launcher, the
    children's pids, the run dir."""
    path = run_toml(tmp_path, time_scale=0.02, hang_timeout_s=1.0, heartbeat_timeout_s=4.0)
    run_dir = path.parent
    launcher = subprocess.Popen(
        [sys.executable, "-m", "dualpath_emu.cli", "launch", str(path), "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    pids: dict[str, int] = {}
    assert launcher.stdout is not None
    while len(pids) < 1 + len(PROCESSES):
        line = launcher.stdout.readline()
        assert line, "the launcher ended before starting its processes"
        match = re.match(r"  started (\w+) \(pid (\d+)\)", line)
        if match:
            pids[match.group(1)] = int(match.group(2))
    assert list(pids) == ["dataplane", *PROCESSES]
    wait_until(lambda: all((run_dir / f"{n}.ready").exists() for n in pids), "every process ready")
    time.sleep(0.5)  # the run is under way
    return launcher, pids, run_dir


def test_no_endpoint_is_on_a_command_line_and_the_sockets_are_private(tmp_path: Path) -> None:
    launcher, pids, run_dir = start_long_run(tmp_path)
    try:
        for pid in pids.values():
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert not any(b"ipc://" in a or b"tcp://" in a for a in arguments), arguments
            options = [a for a in arguments if a.startswith(b"--")]
            assert options == [b"--process", b"--run-dir"], arguments
        description = json.loads((run_dir / "run.json").read_text())
        assert stat.S_IMODE((run_dir / "run.json").stat().st_mode) == 0o600
        socket_dir = Path(description["dataplane"]["endpoint"].removeprefix("ipc://")).parent
        assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
        assert description["dataplane"]["requesters"] == list(PROCESSES)
    finally:
        launcher.send_signal(signal.SIGINT)
        launcher.communicate(timeout=WAIT_S)
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
    assert f"interrupted by SIGINT; stopped {len(pids)} process(es)" in err
    for pid in pids.values():
        assert not alive(pid)


def test_a_killed_launcher_leaves_no_orphans(tmp_path: Path) -> None:
    launcher, pids, _ = start_long_run(tmp_path)
    launcher.kill()
    launcher.communicate(timeout=WAIT_S)
    wait_until(lambda: not any(alive(pid) for pid in pids.values()), "the children to end", timeout=20)


def test_a_busy_process_is_not_taken_for_a_hung_one(tmp_path: Path) -> None:
    """Issue 34: a loop held by a large batch for 2.5 times hang_timeout_s (and beyond the data plane's
    heartbeat_timeout_s) is busy, not hung: its heartbeat thread says so, and the run completes."""
    path = run_toml(tmp_path, agents=8, time_scale=4.0, hang_timeout_s=1.0, heartbeat_timeout_s=2.0)
    run_dir = path.parent
    env = {"DUALPATH_EMU_TEST_ONLY_BUSY": f"{run_dir.resolve()}|pe0|0.05|2.5"}
    done = dualpath_emu("launch", str(path), "--json", "--run-dir", str(run_dir), env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["turns"] == sum(len(t) for t in work(8))
    assert "holding its loop for 2.5 s" in (run_dir / "pe0.out").read_text()  # the spell did happen


def test_a_process_busy_beyond_busy_timeout_s_is_named_busy_with_where(tmp_path: Path) -> None:
    path = run_toml(tmp_path, agents=8, time_scale=4.0, hang_timeout_s=1.0, busy_timeout_s=2.0)
    run_dir = path.parent
    env = {"DUALPATH_EMU_TEST_ONLY_BUSY": f"{run_dir.resolve()}|pe0|0.05|30"}
    begun = time.monotonic()
    done = dualpath_emu("launch", str(path), "--run-dir", str(run_dir), env=env)
    assert done.returncode == 1
    match = re.search(r"process 'pe0' \(pid \d+\) is busy, not hung: one piece of work has held its loop for "
                      r"(\d+\.\d) s \(busy_timeout_s = 2.0\), in node.py:\d+ hold", done.stderr)  # fmt: skip
    assert match, done.stderr
    assert 2.0 <= float(match.group(1)) < 4.0
    assert "stopped or hung" not in done.stderr and time.monotonic() - begun < 30


def test_a_failing_engine_is_reported_with_the_childs_output_and_the_seed(tmp_path: Path) -> None:
    (tmp_path / "failing.py").write_text(FAILING_POLICY)
    path = run_toml(tmp_path, agents=4, time_scale=4.0, system="failing.py:Failing")
    failed = dualpath_emu("launch", str(path), "--run-dir", str(path.parent))
    assert failed.returncode == 1
    assert "process 'scheduler'" in failed.stderr and "exited with status 1" in failed.stderr
    assert "RuntimeError: the policy fails on purpose" in failed.stderr and "| seed 0" in failed.stderr
    assert "Traceback" not in failed.stderr


def test_node_without_a_run_description_says_how_to_make_one(tmp_path: Path) -> None:
    done = dualpath_emu("node", "run.toml", "--process", "client", "--run-dir", str(tmp_path))
    assert done.returncode == 2
    assert "no run description" in done.stderr and "--prepare" in done.stderr and "Traceback" not in done.stderr


# --- bad scenario files -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("seed = 0", 'seed = "one"'),
            "key 'seed': expected an integer in [0, 9223372036854775807], got the string 'one'",
        ),
        (('description = "cluster.json"', 'descriptionz = "cluster.json"'), "unknown key 'cluster.descriptionz'"),
        (('mode = "realtime"', 'mode = "virtual"'), "key 'mode': expected one of 'realtime', got the string 'virtual'"),
        (
            ('actors = ["client"]', 'actors = ["scheduler"]'),
            "key 'process[1].actors': expected actors not already in process 'scheduler'",
        ),
        (
            ('actors = ["client"]', 'actors = ["clients"]'),
            "key 'process[1].actors': expected names of the application's actors",
        ),
        (('actors = ["client"]', "actors = []"), "key 'process[1].actors': expected a non-empty list of strings"),
        (('app = "cluster"', 'app = "nope"'), "key 'app': expected one of 'cluster', got 'nope'"),
        (('backend = "model"', 'backend = "gpu"'), "key 'backend': expected one of 'host', 'model', got 'gpu'"),
        (("time_scale = 1.0", "time_scale = 0"), "key 'time_scale': expected a number in [1e-6, 1e6], got 0"),
        (("seed = 0", "seed = [1"), "not valid TOML"),
        (('name = "client"', 'name = "dataplane"'), "key 'process[1].name': expected a name other than 'dataplane'"),
    ],
)
def test_bad_scenarios_exit_2_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, str], message: str
) -> None:
    path = run_toml(tmp_path, agents=2)
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1], 1))
    assert cli_main(["launch", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dualpath-emu: error: {path}: ")
    assert message in err
    assert "Traceback" not in err


def test_missing_scenario_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli_main(["launch", str(tmp_path / "none.toml")]) == 2
    assert "none.toml: no such file" in capsys.readouterr().err
