"""The paper's experiments, one module each, run by ``dualpath-emu reproduce NAME``.

:data:`EXPERIMENTS` maps each name to its module; every such module exposes ``main(argv: list[str] | None)
-> int`` and accepts ``--json``. This package imports nothing heavy: the command line reads the names here
and imports an experiment's module only when it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = ["EXPERIMENTS"]

EXPERIMENTS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "table1": "dualpath_emu.reproduce.table1",  # cache-compute ratio (§3, Table 1)
    }
)
