"""What a failed host-backend live run says (issue 34): a disk that filled is named as full even though the run's
clean-up frees the blocks that filled it; ``--restart-crashed``, which the host backend refuses, is never advised
(a block read back wrong, a full disk, a killed process); and a run that fails keeps its temporary folder for its
logs, unmarked, so that no later run's sweep removes it."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dualpath_emu.cli import main
from dualpath_emu.cluster.live import FULL_DISK_BYTES
from dualpath_emu.runtime.launcher import OWNER_FILE
from dualpath_emu.runtime.node import TEST_DIE_ENV

pytestmark = [pytest.mark.host, pytest.mark.processes]  # host runs' processes

HOST_RUN = ["ds27b-1p1d-offline", "--backend", "host", "--agents", "8", "--set", "workload.max_rounds=4",
            "--system", "dualpath", "--quiet"]  # fmt: skip
ADVICE = "--restart-crashed"


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A file system of its own (a tmpfs of ``request.param`` MiB, default 1), which a host run's KV blocks fill."""
    # A short path of its own: under xdist tmp_path gains "popen-gwN/", and the run's ipc socket paths
    # inside the mount then pass the kernel's 107-character limit.
    mount = Path(tempfile.mkdtemp(prefix="dpe-disk-"))
    size = getattr(request, "param", 1)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}m,mode=0700", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        shutil.rmtree(mount, ignore_errors=True)
        pytest.skip(f"mounting a small tmpfs needs root with CAP_SYS_ADMIN: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        shutil.rmtree(mount, ignore_errors=True)


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    status = main(["run", *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err


def test_a_full_kv_storage_directory_is_named_although_the_clean_up_frees_it(
    small_disk: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = _run(
        capsys, [*HOST_RUN, "--set", f'host.storage_dir="{small_disk}"', "--run-dir", str(tmp_path / "r")]
    )
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"dualpath-emu: error: dualpath: the KV storage directory {small_disk} is full (")
    assert err.endswith("the run stopped; free space and run it again\n") and ADVICE not in err
    assert not list(small_disk.iterdir())  # the clean-up did free it: measured before, it was full


@pytest.mark.parametrize("small_disk", [3], indirect=True)
def test_a_full_temporary_run_directory_is_named_and_kept(
    small_disk: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    # The run's own temporary folder on a 3 MiB disk that its blocks (in its `storage`) fill: its processes'
    # output cannot be written either ("no output" was all the old message had), and once the blocks are
    # removed over 1 MiB is free again.
    monkeypatch.setattr(tempfile, "tempdir", str(small_disk))
    monkeypatch.setenv("TMPDIR", str(small_disk))
    status, err = _run(capsys, [*HOST_RUN, "--agents", "16", "--set", "workload.max_rounds=8", "--time-scale", "4"])
    [folder] = small_disk.glob("dualpath-emu-live-*")
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"dualpath-emu: error: dualpath: the run directory {folder} is full (") and ADVICE not in err
    assert not (folder / "storage").exists()  # the blocks were removed, the logs kept
    assert shutil.disk_usage(small_disk).free > FULL_DISK_BYTES  # so measuring after the clean-up saw no full disk
    assert not (folder / OWNER_FILE).exists()


def test_a_killed_process_of_a_host_run_is_not_advised_a_restart_the_backend_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # pe0 kills itself mid-run (the node's test-only hook: only for this run directory).
    folder = tmp_path / "r"
    monkeypatch.setenv(TEST_DIE_ENV, f"{(folder / 'dualpath').resolve()}|pe0|1.0")
    status, err = _run(capsys, [*HOST_RUN, "--run-dir", str(folder)])
    assert status == 1 and "process 'pe0'" in err and "was killed by SIGKILL" in err, err
    assert ADVICE not in err and f"the run's logs are in {folder / 'dualpath'}" in err


def test_a_block_read_back_wrong_is_not_advised_a_restart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "r"
    storage = run_dir / "dualpath" / "storage"
    stop = threading.Event()

    def corrupt() -> None:
        # Every block file's first bytes zeroed, again and again: a read of them cannot come back right.
        while not stop.is_set():
            for path in storage.glob("ctx-*.kv"):
                try:
                    with path.open("r+b") as file:
                        file.write(bytes(64))
                except OSError:
                    pass
            time.sleep(0.005)

    corrupter = threading.Thread(target=corrupt, daemon=True)
    corrupter.start()
    try:
        status, err = _run(capsys, [*HOST_RUN, "--run-dir", str(run_dir)])
    finally:
        stop.set()
        corrupter.join()
    assert status == 1 and "read back" in err, err
    assert ADVICE not in err and "is full" not in err
