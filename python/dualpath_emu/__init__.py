"""dualpath-emu: emulate a prefill/decode-disaggregated LLM inference cluster that loads KV-cache from
distributed storage over two paths (DualPath).

Python actors (scheduler, prefill and decode engines, agents) make the decisions; the Rust core
(:mod:`dualpath_emu._core`) owns time and every byte that moves. Errors raised by the core are classes of
:mod:`dualpath_emu.errors`. The command line is ``dualpath-emu`` (:mod:`dualpath_emu.cli`); the Python API is
:mod:`dualpath_emu.api`, whose main names are also here (``dualpath_emu.run``, ``dualpath_emu.load_scenario``,
…), imported on first use so that ``import dualpath_emu`` stays light."""

from __future__ import annotations

import importlib
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dualpath_emu.api import Policy, RunResult, ScenarioError, System, load_scenario, run, scenario_names

__all__ = ["Policy", "RunResult", "ScenarioError", "System", "__version__", "load_scenario", "run", "scenario_names"]

__version__: str = _version("dualpath-emu")

_API: frozenset[str] = frozenset(__all__) - {"__version__"}


if not TYPE_CHECKING:  # type checkers see the imports above, and so still catch a misspelt name

    def __getattr__(name: str) -> Any:
        """The names of :mod:`dualpath_emu.api`, imported when first asked for."""
        if name in _API:
            return getattr(importlib.import_module("dualpath_emu.api"), name)
        raise AttributeError(f"module 'dualpath_emu' has no attribute {name!r}")
