"""The paper's experiments, one module each, run by ``dualpath-emu reproduce NAME``.

:data:`EXPERIMENTS` maps each name to its module; every such module exposes ``main(argv: list[str] | None) -> int``, and
every experiment accepts ``--json`` (``markdown`` is the tool that turns their reports into Markdown). This package
imports nothing heavy: the command line reads the names here and imports an experiment's module only when it runs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = ["EXPERIMENTS", "SUMMARIES", "help_description"]

SUMMARIES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "table1": "cache-compute ratio of the three models (paper §3, Table 1)",
        "fig7": "offline JCT vs agents and context, three models (§7.3); --quick: DS 660B and DS 27B, small",
        "fig8": "P/D ratio on DS 27B (§7.3)",
        "fig9": "append and generation scaling (§7.3)",
        "fig10": "online: the largest arrival rate that meets the SLO (§7.4)",
        "fig12": "ablation ladder and TTFT breakdown (§7.4-7.5)",
        "fig13": "storage-NIC and attention balance (§7.5)",
        "isolation": "MoE collective latency with KV traffic, with and without virtual lanes (§5)",
        "toolwaits": "tool waits online: the working set and latency as agents wait between turns (§8.2)",
        "kvstore": "a bounded KV store under tool waits: hits found, recomputation and latency (§8.2)",
        "sglmc": "SGL(MC)'s DRAM pool against Basic and DualPath, at the paper's size and smaller (§7.1)",
        "retention": "decode-side retention with session affinity against DualPath, over HBM headroom and tool waits",
        "faults": "a prefill node's storage NIC down and random fault schedules, Basic vs DualPath (the paper has none)",
        "network": "virtual-lane isolation on and off at cluster scale, and a checkpoint load on the decode storage NICs",
        "split": "split reads (a long hit read on both sides at once) against DualPath's whole reads (§6.1)",
        "calibrate": "fit the hardware parameters the paper does not give, on Basic and Oracle runs",
        "markdown": "the reports (NAME.json) as Markdown, for EVALUATION.md",
    }
)
"""One line per experiment, for ``reproduce --list``."""

EXPERIMENTS: Final[Mapping[str, str]] = MappingProxyType({name: f"{__name__}.{name}" for name in SUMMARIES})
"""Each experiment's module, by name."""


def help_description(doc: str | None) -> str:
    """The first paragraph of a module's docstring as plain text (roles and literals reduced), for ``--help``."""
    paragraph = (doc or "").strip().split("\n\n")[0]
    text = " ".join(paragraph.split())
    text = re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return text.replace("``", "").replace("**", "")
