"""The host backend knows nothing of the cluster: the cluster's side of it is ``cluster/live/host.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import dualpath_emu.host


def test_the_host_package_imports_nothing_of_the_cluster() -> None:
    folder = Path(dualpath_emu.host.__file__).parent
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):  # at the top, in functions, TYPE_CHECKING
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            found += [f"{path.name}: {name}" for name in names if name.startswith("dualpath_emu.cluster")]
    assert len(list(folder.glob("*.py"))) > 5 and not found, found
