"""Live runs started by hand on two "hosts" of this machine (loopback addresses, each host its own copy of the
run directory), as `dualpath-emu run --prepare` prints them: shared by the model and host backends' tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path


def launch_per_host(per_host: Iterable[tuple[str, str]], folders: Mapping[str, Path], timeout_s: float) -> list[int]:
    """Run each host's ``dualpath-emu launch`` command (``host_commands``) with that host's run directory
    (``folders[host]``), all at once; return their exit statuses (a child still running at ``timeout_s`` is
    killed and the wait raises)."""
    children = []
    for host, command in per_host:
        words = command.split()
        folder = folders[host]
        words[words.index("--run-dir") + 1] = str(folder)
        words[2] = str(folder / "run.toml")
        children.append(subprocess.Popen([sys.executable, "-m", "dualpath_emu.cli", *words[1:]],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))  # fmt: skip
    try:
        return [child.wait(timeout=timeout_s) for child in children]
    finally:
        for child in children:
            child.kill()


def gather_parts(source: Path, into: Path, processes: Iterable[str]) -> None:
    """Copy what ``processes`` left in ``source`` (parts, event logs, reports) into ``into``, for ``collect``."""
    names = set(processes)
    for pattern in ("*.part", "*.events", "*.json"):
        for path in source.glob(pattern):
            if path.stem in names:
                shutil.copy2(path, into / path.name)
