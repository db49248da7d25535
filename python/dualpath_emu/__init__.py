"""dualpath-emu: emulate a prefill/decode-disaggregated LLM inference cluster that loads KV-cache from
distributed storage over two paths (DualPath).

Python actors (scheduler, prefill and decode engines, agents) make the decisions; the Rust core
(:mod:`dualpath_emu._core`) owns time and every byte that moves. Errors raised by the core are classes of
:mod:`dualpath_emu.errors`. The command line is ``dualpath-emu`` (:mod:`dualpath_emu.cli`).
"""

from importlib.metadata import version as _version

__all__ = ["__version__"]

__version__: str = _version("dualpath-emu")
