"""Table 1 of the paper (§3): the cache-compute ratio, GB of KV to load per PFLOP of prefill compute.

For a turn that appends :data:`APPEND_TOKENS` = 429 tokens (the 64K trace's mean append, paper-facts §3.1) to
a context of ``L`` tokens::

    ratio [GB/PFLOP] = (L × KV bytes per token, all layers) / (429 × FLOPs per new token at context L)

with both sides from the catalog (:mod:`dualpath_emu.cluster.catalog`; docs/compute-model.md gives the FLOP
formulas): KV in FP8 for the DeepSeek models (V3.2's indexer key cache not counted), FP16 for Qwen2.5-32B;
each new token is charged as attending over ``L`` keys (the ≤ 429 appended keys before it are ignored, as in
paper-facts §2.3's reconstruction). Contexts: 16K, 32.7K (the trace's mean), 48K and 64K, with K = 1,024.

The paper prints only ranges over 16K→64K (Qwen2.5-32B 117-267, DeepSeek-V3.2 13-36; DS 27B, an internal
model, has no row). paper-facts §2.3's reconstruction takes the published parameter totals (2 × 37 B,
2 × 32.5 B); the catalog counts the GEMM parameters from the configs, without the input embedding (a
lookup). Qwen then lands on the paper's 117 and 267; V3.2's 16K end stays 7% under the paper's 13, as the
reconstruction's does (6%): the paper's FLOP accounting for V3.2 is not given."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

from dualpath_emu.cluster.catalog import ModelSpec, model
from dualpath_emu.reproduce.common import Report, experiment_main, within
from dualpath_emu.reproduce.plots import panels, save

__all__ = [
    "APPEND_TOKENS", "CONTEXTS", "MODELS", "PAPER_RANGES", "TOLERANCE", "Table1Row",
    "cache_compute_ratio_gb_per_pflop", "main", "rows",
]  # fmt: skip

APPEND_TOKENS: Final = 429
CONTEXTS: Final = (16_384, 32_721, 49_152, 65_536)
_CONTEXT_LABELS: Final = ("16K", "32.7K", "48K", "64K")
MODELS: Final = ("qwen32b", "ds660b", "ds27b")  # In the paper's row order; ds27b has no row there.
PAPER_RANGES: Final[Mapping[str, tuple[float, float]]] = MappingProxyType(
    {"qwen32b": (117.0, 267.0), "ds660b": (13.0, 36.0)}  # GB/PFLOP at 16K and 64K [paper Table 1]
)
TOLERANCE: Final = 0.10  # How far (relative) the emulator's 16K and 64K values may be from the paper's range ends.


def cache_compute_ratio_gb_per_pflop(spec: ModelSpec, context_tokens: int, append_tokens: int = APPEND_TOKENS) -> float:
    """GB of KV to load per PFLOP of prefill compute for one turn (see the module docstring)."""
    kv_bytes = context_tokens * spec.kv_bytes_per_token
    flops = append_tokens * spec.flops_per_token(context_tokens)
    return (kv_bytes / 1e9) / (flops / 1e15)


@dataclass(frozen=True)
class Table1Row:
    """One model's ratios at :data:`CONTEXTS`, with the paper's range where it has one."""

    model: str
    description: str
    kv_bytes_per_token: int
    gb_per_pflop: tuple[float, ...]  # One value per context of :data:`CONTEXTS`.
    paper_range: tuple[float, float] | None

    @property
    def end_errors(self) -> tuple[float, float] | None:
        """Relative differences of the 16K and 64K values from the paper's range ends; None without a range."""
        if self.paper_range is None:
            return None
        low, high = self.paper_range
        return (self.gb_per_pflop[0] / low - 1.0, self.gb_per_pflop[-1] / high - 1.0)

    @property
    def ends_within_tolerance(self) -> bool | None:
        """Both ends within ±:data:`TOLERANCE` of the paper's; None without a range."""
        errors = self.end_errors
        return None if errors is None else all(abs(e) <= TOLERANCE for e in errors)

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "description": self.description,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "gb_per_pflop": list(self.gb_per_pflop),
            "paper_range": None if self.paper_range is None else list(self.paper_range),
            "end_errors": None if self.end_errors is None else list(self.end_errors),
            "ends_within_tolerance": self.ends_within_tolerance,
        }


def rows(models: Sequence[str] = MODELS) -> list[Table1Row]:
    """Table 1's rows for ``models`` (catalog names)."""
    out = []
    for name in models:
        spec = model(name)
        ratios = tuple(cache_compute_ratio_gb_per_pflop(spec, ctx) for ctx in CONTEXTS)
        out.append(Table1Row(name, spec.description, spec.kv_bytes_per_token, ratios, PAPER_RANGES.get(name)))
    return out


def build(args: argparse.Namespace) -> Report:
    """Table 1 as a report: one row per model, the paper's range ends beside the 16K and 64K values."""
    table_rows = rows()
    comparisons = []
    for row in table_rows:
        if row.paper_range is not None:
            for label, paper, value in (("16K", row.paper_range[0], row.gb_per_pflop[0]),
                                        ("64K", row.paper_range[1], row.gb_per_pflop[-1])):  # fmt: skip
                comparisons.append(
                    within(f"{row.model} cache-compute ratio at {label} (GB/PFLOP)", paper, value, rel=TOLERANCE)
                )
    notes = [
        f"{row.model}: " + " / ".join(f"{v:.1f}" for v in row.gb_per_pflop) + f" GB/PFLOP at {'/'.join(_CONTEXT_LABELS)}"
        + (f" (paper {row.paper_range[0]:g}-{row.paper_range[1]:g})" if row.paper_range else " (no row in the paper)")
        for row in table_rows
    ]  # fmt: skip
    notes.append(f"{APPEND_TOKENS}-token append; KV in FP8 for the DeepSeek models (V3.2's indexer cache excluded), "
                 "FP16 for Qwen; ds27b is the paper's internal down-scaled model.")  # fmt: skip
    checks = {
        "both ends of each paper range within ±10%": all(r.ends_within_tolerance is not False for r in table_rows)
    }
    return Report("table1", f"cache-compute ratio (GB of KV per PFLOP of prefill), {APPEND_TOKENS}-token append",
                  [{**row.to_json(), "contexts": list(CONTEXTS)} for row in table_rows], comparisons, notes,
                  lambda path: plot(path, table_rows), checks)  # fmt: skip


def plot(path: Path, table_rows: Sequence[Table1Row]) -> None:
    """GB/PFLOP against context per model, the paper's range ends as crosses (log scale)."""
    fig, (ax,) = panels(1, width=5.0)
    for row in table_rows:
        (line,) = ax.plot([c / 1024 for c in CONTEXTS], row.gb_per_pflop, "o-", label=row.model)
        if row.paper_range is not None:
            ax.plot([CONTEXTS[0] / 1024, CONTEXTS[-1] / 1024], row.paper_range, "x", color=line.get_color(),
                    markersize=9, label=f"{row.model} (paper)")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("context (K tokens)")
    ax.set_ylabel("GB per PFLOP")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    return experiment_main("table1", "Table 1: GB of KV to load per PFLOP of prefill compute.", build, argv)
