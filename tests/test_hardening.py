"""Issue 26, the emulator under bad input and faults: a regression test for each kind that broke.

Command-line values and environments get one line and exit status 2 (never a traceback); files the emulator did
not write are never trusted; memory stays bounded by a run's size, not its emulated time.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from dualpath_emu.cli import main
from dualpath_emu.errors import UsageError

SMALL = ["ds27b-1p1d-offline", "--agents", "1", "--set", "workload.max_rounds=1", "--system", "basic", "--quiet"]


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI, expect exit status 2 and one error line on stderr, and return that line."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("dualpath-emu: error: "), captured.err[:500]
    assert "Traceback" not in captured.err + captured.out
    return captured.err.removeprefix("dualpath-emu: error: ").rstrip("\n")


# 1. Command-line values and environments


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            "workload.agents=" + "[" * 5_000 + "]" * 5_000,
            "--set workload.agents: not a valid TOML value: nested too deeply",
        ),
        ("workload.agents=" + "{a=" * 3_000 + "1" + "}" * 3_000, "nested too deeply"),
        ("workload.agents=" + "9" * 5_000, "--set workload.agents: not a valid TOML value: an integer of more than"),
        ("workload.agents=1\nseed=3", "--set workload.agents: expected one TOML value"),
        ("a." * 40 + "b=1", "no such key 'a'"),
        ('"workload".agents=2', '--set "workload".agents: no such key'),
        ("workload.nope.deeper=1", "--set workload.nope.deeper: no such key 'workload.nope'"),
    ],
)
def test_a_set_value_a_file_could_not_hold_is_one_line(
    capsys: pytest.CaptureFixture[str], value: str, expected: str
) -> None:
    for command in (["run", *SMALL], ["sweep", "ds27b-1p1d-offline", "--out", "/nonexistent/x"]):
        line = error_line(capsys, [*command, "--set", value])
        assert expected in line, line


@pytest.mark.parametrize("host", ["nonexistent.invalid", "999.1.1.1", "::1", ""])
def test_a_host_the_run_cannot_listen_on_is_one_line(capsys: pytest.CaptureFixture[str], host: str) -> None:
    line = error_line(capsys, ["run", *SMALL, "--mode", "realtime", "--transport", "tcp", "--host", host])
    assert line.startswith(f"host {host!r} (--host): "), line


def test_a_run_dir_that_is_a_file_read_only_or_full_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    live = ["run", *SMALL, "--mode", "realtime", "--run-dir"]
    afile = tmp_path / "file"
    afile.write_text("x")
    assert error_line(capsys, [*live, str(afile)]) == f"--run-dir {afile}: is a file, expected a folder"
    assert "cannot write there: Not a directory" in error_line(capsys, [*live, str(afile / "sub")])
    assert error_line(capsys, ["run", *SMALL, "--out", str(afile)]) == f"--out {afile}: is a file, expected a folder"

    import dualpath_emu.cluster.outputs as outputs

    def read_only(*args: object, **kwargs: object) -> object:
        raise OSError(errno.EROFS, "Read-only file system")

    with monkeypatch.context() as patch:  # as root, os.access and chmod cannot show a read-only mount
        patch.setattr(outputs, "tempfile", type("T", (), {"TemporaryFile": staticmethod(read_only)}))
        assert error_line(capsys, [*live, str(tmp_path / "ro")]).endswith("cannot write there: Read-only file system")
    with monkeypatch.context() as patch:
        patch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(1 << 30, 1 << 30, 4096))
        assert "4,096 bytes free, expected at least 16 MiB" in error_line(capsys, [*live, str(tmp_path / "full")])


def test_a_disk_that_fills_during_a_live_run_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process whose disk fills says so on one line (status 2); the launcher names the full run directory."""
    from dualpath_emu.runtime import node
    from dualpath_emu.runtime.app import Registry

    def full(*args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "client.events"))

    monkeypatch.setattr(node, "RunDescription", type("D", (), {"read": staticmethod(lambda d: _Description())}))
    monkeypatch.setattr(node, "serve_process", full)
    monkeypatch.setattr(node, "find_scenario", Path)
    monkeypatch.setattr(
        node, "load_run_scenario", lambda path, registry: SimpleNamespace(with_overrides=lambda **_: None)
    )
    assert node.main(["run.toml", "--process", "dataplane", "--run-dir", str(tmp_path)], Registry({}, {})) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"dualpath-emu node dataplane: error: {tmp_path}/client.events: cannot write: No space")

    import dualpath_emu.cluster.live as live
    from dualpath_emu.runtime.launcher import LaunchError

    def stopped(*args: object, **kwargs: object) -> None:
        raise LaunchError("process 'dataplane' exited with status 1; its last output: (no output)")

    monkeypatch.setattr(live, "run_live", stopped)
    disk = shutil._ntuple_diskusage(1 << 30, 1 << 30, 100)
    free = iter([shutil._ntuple_diskusage(1 << 30, 0, 1 << 30)])
    monkeypatch.setattr(shutil, "disk_usage", lambda path: next(free, disk))
    line = error_line(capsys, ["run", *SMALL, "--mode", "realtime", "--run-dir", str(tmp_path / "r")])
    assert (
        line
        == f"basic: the run directory {tmp_path / 'r' / 'basic'} is full (100 bytes left): the run stopped; free space and run it again"
    )


class _Description:
    seed, time_scale, endpoints = 0, 1.0, dict[str, str]()


def test_a_metrics_port_in_use_is_refused_before_any_process_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = error_line(capsys, ["run", *SMALL, "--mode", "realtime", "--metrics-port", str(port)])
    assert line == f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_live_metrics_on_a_port_in_use_is_a_usage_error() -> None:
    from dualpath_emu.cluster.live.metrics import LiveMetrics

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(UsageError, match="--metrics-port .*Address already in use"):
            LiveMetrics().serve(taken.getsockname()[1])


@pytest.mark.parametrize("damage", ["fifo", "zero", "dir", "garbage", "truncated", "missing"])
def test_collect_on_damaged_or_missing_parts_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """The files ``collect`` reads come from other hosts: a FIFO is not waited on, a link to /dev/zero not read
    until memory runs out, and bad content is named, never a traceback."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "client.json").write_text('{"wall_s": 1.0}')
    (run / "client.events").write_text("1\t0\tclient\ttell\t#1 Start client->client\n")
    part = run / "client.part"
    if damage == "fifo":
        os.mkfifo(part)
    elif damage == "zero":
        part.symlink_to("/dev/zero")
    elif damage == "dir":
        part.mkdir()
    elif damage == "garbage":
        part.write_bytes(b"\xc1\xff" * 50)
    elif damage == "truncated":
        part.write_bytes(b"\x82\xa7metrics")
    line = error_line(capsys, ["collect", str(run)])
    if damage == "missing":  # everything read parses: the run's own description is what is missing
        assert line == f"{run}/run.toml: no such file"
    else:
        assert line.startswith(f"{part}: "), line
    assert error_line(capsys, ["collect", str(tmp_path / "none")]).startswith(
        f"{tmp_path / 'none'}: expected the folder"
    )


# 2. Memory bounded by a run's size, not its emulated time


def test_busy_bins_widen_within_their_budget_and_keep_totals() -> None:
    from dualpath_emu.cluster.metrics import MAX_SAMPLES_PER_UNIT, BusyTime

    busy = BusyTime(1_000)
    busy.add(0, 0, 500)
    busy.add(0, 10**10 - 500, 10**10)  # 10^7 intervals of 1 µs later
    bins = busy.busy_ns[0]
    assert len(bins) <= MAX_SAMPLES_PER_UNIT and sum(bins) == 1_000
    assert busy.interval_ns == 1_000 * 2**8  # the smallest power-of-2 multiple that fits
    assert len(busy.timeline([0], 10**10)) == len(bins)
    assert busy.utilisation([0], 10**10)["mean"] == pytest.approx(1_000 / 10**10)
    for unit in range(1, 1_000):  # more units: a smaller share each, widened again, totals kept
        busy.add(unit, 0, 1)
    assert sum(map(len, busy.busy_ns.values())) <= 1 << 20 and sum(busy.busy_ns[0]) == 1_000


def test_decode_segments_far_apart_in_time_widen_the_bins_and_keep_the_totals() -> None:
    from dualpath_emu.cluster.metrics import Metrics
    from dualpath_emu.cluster.observations import DecodeSegment

    metrics = Metrics.replay([(2_500, DecodeSegment(3, 0, 2_500, 1, 10)),
                              (10**10, DecodeSegment(4, 10**10 - 500, 10**10, 1, 10))], sample_interval_ns=1_000)  # fmt: skip
    busy = metrics.gpu_busy["de"]
    assert busy.interval_ns > 1_000 and sum(map(len, busy.busy_ns.values())) <= 1 << 20
    assert list(busy.busy_ns[3][:1]) == [2_500] and sum(busy.busy_ns[4]) == 500


def test_a_long_emulated_run_keeps_its_timelines_bounded() -> None:
    """4 agents whose tools wait a day between turns: 20 rounds are 1.6 M emulated seconds. The timelines
    and GPU bins stay within the sample budget (they held one value per emulated second: 1.1 GB)."""
    from dualpath_emu import api
    from dualpath_emu.cluster.run import run_system

    scenario = api.load_scenario("ds27b-1p1d-offline", agents=4, overrides={
        "workload.tool_wait.dist": "constant", "workload.tool_wait.mean_s": 86_400, "workload.max_rounds": 20})  # fmt: skip
    result = run_system(scenario.config, scenario.system("basic"), scenario.trajectories(), seed=0)
    assert result.jct_s > 1.6e6 and result.sample_interval_s > 1
    for by_role in result.timelines.values():
        for values in by_role.values():
            assert 0 < len(values) <= 1 << 16 and max(values) <= 1.0 + 1e-9
    for busy in result.metrics.gpu_busy.values():
        assert busy.interval_ns > 10**9 and all(len(b) <= 1 << 16 for b in busy.busy_ns.values())
    for util in (result.snic_util["pe"]["rx"], result.cnic_util["pe"]["tx"], result.gpu_util["de"]):
        assert 0.0 <= util["p99"] <= 1.0


# 3. Files the emulator did not write


@pytest.mark.parametrize("kind", ["fifo", "zero", "dir"])
def test_the_run_cache_never_waits_on_or_reads_a_file_it_did_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A FIFO in the cache hung the sweep; a link to /dev/zero was read until memory ran out. Both are now
    ignored with a warning and the run is done again (and, where it can, kept)."""
    import threading

    from dualpath_emu.reproduce import common

    cache = tmp_path / "cache"
    cache.mkdir()
    key = "ab" * 32
    path = common._cache_path(cache, key)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    found: list[object] = []
    reader = threading.Thread(
        target=lambda: found.append(common._cache_read(cache, key, common.PLAIN_JSON, None)), daemon=True
    )
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "the cache read blocked"
    assert found == [None]
    common._cache_write(cache, key, repr, common.PLAIN_JSON, {"x": 1})
    err = capsys.readouterr().err
    assert f"warning: ignoring the cache file {path} (" in err
    if kind != "dir":
        assert common._cache_read(cache, key, common.PLAIN_JSON, None) == ({"x": 1},)
    assert list(cache.glob("*.tmp")) == []


@pytest.mark.host
@pytest.mark.processes
def test_runs_sharing_a_storage_dir_keep_to_their_own_blocks(tmp_path: Path) -> None:
    """Two host-backend runs at once on one storage_dir deleted each other's blocks and reported a false
    corruption; each now has its own folder under it, removes only that, and leaves what it did not write."""
    import json
    import subprocess
    import sys

    storage = tmp_path / "kv"
    storage.mkdir()
    foreign = storage / "ctx-00000001.kv"
    foreign.write_text("not this run's")
    command = [sys.executable, "-m", "dualpath_emu.cli", "run", "ds27b-1p1d-offline", "--backend", "host", "--agents", "2",
               "--set", "workload.max_rounds=2", "--system", "dualpath", "--time-scale", "10", "--json",
               "--set", f"host.storage_dir={storage}"]  # fmt: skip
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for run in runs:
        out, err = run.communicate(timeout=240)
        assert run.returncode == 0, err[-2000:]
        host = json.loads(out)["systems"]["dualpath"]["host"]
        assert host["mismatched_blocks"] == 0 and host["verified_read_bytes"] > 0
    assert [p.name for p in storage.iterdir()] == [foreign.name] and foreign.read_text() == "not this run's"


def test_a_storage_dir_that_cannot_be_cleaned_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dualpath_emu.host.storage import remove_blocks, run_storage

    assert run_storage("") == "" and run_storage("/kv") != run_storage("/kv")
    folder = Path(run_storage(str(tmp_path)))
    folder.mkdir()
    (folder / "ctx-00000002.kv").write_bytes(b"x")

    def read_only(self: Path, missing_ok: bool = False) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    remove_blocks(folder)
    assert capsys.readouterr().err == (
        f"dualpath-emu: warning: could not remove the run's KV blocks in {folder}: Read-only file system\n"
    )


# 4. Trust


@pytest.mark.parametrize("how", ["file", "module"])
def test_a_policy_calling_sys_exit_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """``sys.exit(0)`` in a policy file ended the command with status 0 and no word."""
    (tmp_path / "leaving_policy.py").write_text("import sys\nsys.exit(0)\n")
    spec = str(tmp_path / "leaving_policy.py") + ":X" if how == "file" else "leaving_policy:X"
    monkeypatch.syspath_prepend(str(tmp_path))
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        f'kind = "cluster"\nsystems = ["{tmp_path / "leaving_policy.py"}:X"]\n[deployment]\nmodel = "ds27b"\n'
    )
    line = error_line(capsys, ["run", *SMALL[:-3], "--system", spec])
    assert f"--system: '{spec}': " in line and "raised SystemExit: 0" in line
    assert "raised SystemExit: 0" in error_line(capsys, ["validate", str(scenario)])


def test_validate_says_that_it_runs_the_policy_code_it_checks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--help"]) == 0
    assert "that runs their code" in " ".join(capsys.readouterr().out.split())


def test_ctrl_c_on_a_live_run_exits_130(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher's LaunchInterrupted (a LaunchError) was wrapped as a failed run and the command exited 1."""
    import dualpath_emu.cluster.live as live
    from dualpath_emu.runtime.launcher import LaunchInterrupted

    def interrupted(*args: object, **kwargs: object) -> None:
        raise LaunchInterrupted("interrupted by SIGINT; stopped 5 process(es)")

    monkeypatch.setattr(live, "run_live", interrupted)
    assert main(["run", *SMALL, "--mode", "realtime", "--run-dir", str(tmp_path / "r")]) == 130
    err = capsys.readouterr().err
    assert err.endswith("dualpath-emu: interrupted by SIGINT; stopped 5 process(es)\n") and "Traceback" not in err


@pytest.mark.processes
def test_a_killed_launchers_folders_are_removed_by_the_next_one(tmp_path: Path) -> None:
    """SIGKILL skips a launcher's clean-up: its socket folder and KV blocks stayed for ever. A folder marked
    with its owner (host and pid) is removed by a later launcher once that pid is gone; a live owner's, one
    without an owner file, another host's and a link are left alone."""
    import subprocess
    import sys

    from dualpath_emu.runtime.launcher import OWNER_FILE, mark_owner, sweep_orphans

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead_pid = int(gone.stdout)
    folders = {name: tmp_path / name for name in ("run-dead", "run-live", "run-unmarked", "run-elsewhere")}
    for folder in folders.values():
        folder.mkdir()
        (folder / "ctx-00000001.kv").write_bytes(b"kv")
    mark_owner(folders["run-live"])  # this process: alive
    (folders["run-dead"] / OWNER_FILE).write_text(f"{socket.gethostname()} {dead_pid}\n")
    (folders["run-elsewhere"] / OWNER_FILE).write_text(f"another-host-{socket.gethostname()} {dead_pid}\n")
    (tmp_path / "run-link").symlink_to(folders["run-dead"])
    assert sweep_orphans("run-*", tmp_path) == [folders["run-dead"]]
    assert not folders["run-dead"].exists()
    assert all(folders[n].exists() for n in ("run-live", "run-unmarked", "run-elsewhere"))


@pytest.mark.parametrize("refused", [
    ["--backend", "host", "--restart-crashed"],                        # the host backend refuses the option
    ["--mode", "realtime", "--placement", "single", "--restart-crashed"],  # no process to start again
    ["--mode", "realtime", "--transport", "tcp", "--host", "999.1.1.1"],    # after the run's files are written
])  # fmt: skip
def test_a_refused_live_run_leaves_no_temporary_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, refused: list[str]
) -> None:
    """Issue 34: a live run refused before any process ran removes the temporary run directory it made (it
    left an empty one, or one with the run's description, that nothing removed)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    error_line(capsys, ["run", *SMALL, *refused])
    assert not list(tmp_path.iterdir())


@pytest.mark.processes
def test_the_sweep_removes_a_killed_launchers_temporary_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: a live run's temporary folder is marked as its launcher's while the run is on; the next live run
    removes those of launchers that are gone (killed), and leaves a live one's, an unmarked one (a failed run's,
    kept for its logs) and another user's alone."""
    import subprocess
    import tempfile

    from dualpath_emu.runtime.launcher import OWNER_FILE

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])  # a pid that has exited
    dead.wait()
    host = socket.gethostname()
    orphan, alive, kept = (tmp_path / f"dualpath-emu-live-{n}" for n in ("orphan", "alive", "kept"))
    for folder in (orphan, alive, kept):
        folder.mkdir()
        (folder / "client.out").write_text("x")
    (orphan / OWNER_FILE).write_text(f"{host} {dead.pid}\n")
    (alive / OWNER_FILE).write_text(f"{host} {os.getpid()}\n")
    assert main(["run", *SMALL, "--mode", "realtime", "--timeout", "120"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, kept.name])


def test_a_full_disk_is_measured_before_a_host_runs_clean_up_frees_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: a host run's blocks fill the disk, a process fails, the run removes its blocks: the disk is
    measured before that (after it, it looks fine), and a process's own "No space left" counts too."""
    import dualpath_emu.cluster.live.launch as live
    from dualpath_emu.cluster.catalog import MODELS
    from dualpath_emu.cluster.config import ClusterConfig
    from dualpath_emu.cluster.systems import SYSTEMS
    from dualpath_emu.runtime import launcher
    from dualpath_emu.runtime.launcher import LaunchError
    from dualpath_emu.host.storage import remove_blocks as real_remove
    from dualpath_emu.workload.generator import generate

    cleaned = []

    def remove(folder: Path) -> None:
        cleaned.append(folder)
        real_remove(folder)

    def usage(path: object) -> object:  # full until the blocks are removed
        free = 1 << 30 if cleaned else 4096
        return shutil._ntuple_diskusage(1 << 30, (1 << 30) - free, free)

    def fails(*args: object, **kwargs: object) -> None:
        raise LaunchError("process 'de1' exited with status 1 before the run was complete; its last output:\n"
                          "  (no output)", died="de1")  # fmt: skip

    monkeypatch.setattr("dualpath_emu.cluster.live.launch.remove_blocks", remove)
    monkeypatch.setattr(shutil, "disk_usage", usage)
    monkeypatch.setattr(launcher, "launch", fails)
    config = ClusterConfig(model=MODELS["ds27b"], pe_nodes=1, de_nodes=1, prefill_ep_nodes=1, decode_ep_nodes=1)
    with pytest.raises(LaunchError) as raised:
        live.run_live(config, SYSTEMS["basic"], generate("64k", 1, seed=0), run_dir=tmp_path / "r", backend="host")
    assert cleaned and raised.value.full_disk == f"the run directory {tmp_path / 'r'} is full (4,096 bytes left)"
    assert shutil.disk_usage(tmp_path).free == 1 << 30  # what a check after the clean-up saw

    # A roomy disk: only a process that said it found no space makes it a full disk.
    roomy = tmp_path / "roomy"
    roomy.mkdir()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(1 << 30, 0, 1 << 30))
    assert live.full_disk(roomy, None, "process 'de1': the run failed: a block read back wrong") is None
    said = live.full_disk(roomy, roomy / "kv", f"write ctx-00000005.kv: {os.strerror(errno.ENOSPC)}")
    assert (
        said
        == f"a process ran out of space (No space left on device) writing to the KV storage directory {roomy / 'kv'} or its run directory"
    )
