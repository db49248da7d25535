"""Replicates: the same scenario on several seeds, each figure's mean with a 95% confidence interval.

One seed is one sample (workload, arrivals and tool waits all come from it). ``dualpath-emu run --seeds N``
reports per system and figure the mean over the seeds and its 95% interval (Student's t), and the speedup over
Basic paired by seed, so the workload's own variation cancels. ``dualpath-emu compare OUT_A OUT_B`` prints two
``summary.json`` files' figures side by side, with whether their intervals overlap."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dualpath_emu.cluster.run import SystemResult, speedup
from dualpath_emu.errors import UsageError
from dualpath_emu.inputs import open_input

__all__ = ["FIGURES", "Estimate", "compare_summaries", "estimate", "parse_seeds", "replicate_summary"]

MAX_SEEDS: Final = 1_000

# Student's t at 0.975 for 1..30 degrees of freedom, then a few more; beyond, the normal 1.96.
_T975: Final = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_T975_MORE: Final = ((40, 2.021), (60, 2.000), (120, 1.980))

FIGURES: Final[Mapping[str, Callable[[Mapping[str, Any]], float]]] = {
    "jct_s": lambda s: s["jct_s"], "failed_requests": lambda s: s.get("failed_requests", 0),
    "ttft_p50_s": lambda s: s["ttft_s"]["p50"], "ttft_p99_s": lambda s: s["ttft_s"]["p99"],
    "tpot_p50_s": lambda s: s["tpot_s"]["p50"], "working_set_mean_bytes": lambda s: s["working_set_bytes"]["mean"],
}  # fmt: skip
"""The figures a replicate run reports, read off a system's summary."""


def _t975(df: int) -> float:
    if df <= len(_T975):
        return _T975[df - 1]
    for limit, t in _T975_MORE:
        if df <= limit:
            return t
    return 1.960


@dataclass(frozen=True)
class Estimate:
    """A figure over seeds: its ``mean`` and the 95% interval ``[low, high]`` (the mean itself for one seed)."""

    mean: float
    low: float
    high: float
    values: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci95": [self.low, self.high], "values": list(self.values)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Estimate:
        """The inverse of :meth:`to_json`."""
        return cls(data["mean"], data["ci95"][0], data["ci95"][1], tuple(data["values"]))

    def text(self, unit: float = 1.0, digits: int = 3) -> str:
        """``mean ± half-width`` in ``unit`` (the half-width left out for one seed)."""
        mean = self.mean / unit
        if len(self.values) < 2:
            return f"{mean:.{digits}g}"
        return f"{mean:.{digits}g} ± {(self.high - self.low) / 2 / unit:.2g}"


def estimate(values: Sequence[float]) -> Estimate:
    """The mean of ``values`` with its 95% confidence interval (Student's t; one value: no interval)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to estimate from")
    mean = math.fsum(values) / n
    if n == 1:
        return Estimate(mean, mean, mean, tuple(values))
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = _t975(n - 1) * math.sqrt(variance / n)
    return Estimate(mean, mean - half, mean + half, tuple(values))


def parse_seeds(text: str, first: int) -> list[int]:
    """``--seeds``: a count N (the seeds ``first`` .. ``first + N - 1``) or a comma list of seeds."""
    text = text.strip()
    try:
        if "," in text:
            seeds = [int(part) for part in text.split(",") if part.strip()]
        else:
            count = int(text)
            if not 1 <= count <= MAX_SEEDS:
                raise UsageError(f"--seeds: expected a count in [1, {MAX_SEEDS}] or a list such as 0,3,7, got {text!r}")
            seeds = list(range(first, first + count))
    except ValueError:
        raise UsageError(f"--seeds: expected a count or a comma list of seeds such as 0,3,7, got {text!r}") from None
    if not seeds or len(seeds) > MAX_SEEDS or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise UsageError(f"--seeds: expected 1 to {MAX_SEEDS} distinct seeds >= 0, got {text!r}")
    return seeds


def replicate_summary(seeds: Sequence[int], runs: Mapping[int, Mapping[str, SystemResult]]) -> dict[str, Any]:
    """``summary.json``'s ``replicates``: per system and figure the mean and 95% interval, and paired speedups."""
    systems = list(runs[seeds[0]])
    out: dict[str, Any] = {"seeds": list(seeds), "systems": {}, "speedup_vs_basic": {}, "no_speedup_vs_basic": {},
                           "incomplete_seeds": {}}  # fmt: skip
    summaries = {seed: {name: r.summary() for name, r in runs[seed].items()} for seed in seeds}
    for name in systems:
        out["systems"][name] = {
            figure: estimate([get(summaries[s][name]) for s in seeds]).to_json() for figure, get in FIGURES.items()
        }
        incomplete = [s for s in seeds if not runs[s][name].complete]
        if incomplete:
            out["incomplete_seeds"][name] = incomplete
        out["speedup_vs_basic"][name] = None
        if "basic" in systems:
            # Paired by seed, and only where every pair finished the same work: one seed's run that gave up
            # early would pull the mean towards a speedup that never happened.
            pairs = [speedup(runs[s]["basic"], runs[s][name]) for s in seeds]
            why = next((f"seed {s}: {reason}" for s, (_, reason) in zip(seeds, pairs) if reason is not None), None)
            if why is None:
                out["speedup_vs_basic"][name] = estimate([ratio for ratio, _ in pairs if ratio is not None]).to_json()
            else:
                out["no_speedup_vs_basic"][name] = why
    return out


# --- compare ---------------------------------------------------------------------------------------------------


def _load_summary(path: Path) -> dict[str, Any]:
    file = path / "summary.json" if path.is_dir() else path
    # open_input refuses what is no regular file (a FIFO would block, a device never end) and a huge one.
    with open_input(file, what="a run's summary.json, or the folder of `run --out`", limit_bytes=1 << 30) as source:
        data_bytes = source.read()
    try:
        data = json.loads(data_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{file}: not a readable summary.json ({error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("systems"), dict):
        raise UsageError(f"{file}: not a dualpath-emu summary (no 'systems' object)")
    return data


def _figures_of(summary: dict[str, Any], system: str) -> dict[str, Estimate]:
    """A system's figures in a summary: from its replicates if it has them, else its one run's."""
    replicates = summary.get("replicates")
    if isinstance(replicates, dict) and system in replicates.get("systems", {}):
        figures = {k: Estimate.from_json(v) for k, v in replicates["systems"][system].items()}
        speedup = replicates.get("speedup_vs_basic", {}).get(system)
        if speedup is not None:
            figures["speedup_vs_basic"] = Estimate.from_json(speedup)
        return figures
    one = {figure: get(summary["systems"][system]) for figure, get in FIGURES.items()}
    speedup = summary.get("speedup_vs_basic", {}).get(system)
    if speedup is not None:
        one["speedup_vs_basic"] = speedup
    return {k: Estimate(v, v, v, (v,)) for k, v in one.items()}


_SHOWN: Final = {
    "jct_s": ("JCT (s)", 1.0), "failed_requests": ("failed requests", 1.0), "speedup_vs_basic": ("vs basic (×)", 1.0),
    "ttft_p50_s": ("TTFT p50 (s)", 1.0), "ttft_p99_s": ("TTFT p99 (s)", 1.0), "tpot_p50_s": ("TPOT p50 (ms)", 1e-3),
    "working_set_mean_bytes": ("working set (GB)", 1e9),
}  # fmt: skip
"""How ``compare`` shows each figure: its label and unit."""


def compare_summaries(a: Path, b: Path) -> list[list[str]]:
    """The rows of ``compare A B``: system, figure, A, B, the change and whether the intervals overlap."""
    first, second = _load_summary(a), _load_summary(b)
    common = [name for name in first["systems"] if name in second["systems"]]
    if not common:
        raise UsageError(
            f"{a} and {b} have no system in common ({', '.join(first['systems'])} vs {', '.join(second['systems'])})"
        )
    rows: list[list[str]] = []
    for name in common:
        fa, fb = _figures_of(first, name), _figures_of(second, name)
        for figure, (label, unit) in _SHOWN.items():
            if figure not in fa or figure not in fb:
                continue
            x, y = fa[figure], fb[figure]
            diff = y.mean - x.mean
            change = f"{diff / x.mean:+.1%}" if x.mean else f"{diff / unit:+.3g}"
            intervals = len(x.values) > 1 and len(y.values) > 1
            overlap = ("yes" if x.low <= y.high and y.low <= x.high else "no") if intervals else "-"
            rows.append([name, label, x.text(unit), y.text(unit), change, overlap])
        finished = [_complete(first, name), _complete(second, name)]
        if not all(finished):  # say it beside the figures: one side's JCT is not a whole workload's
            rows.append([name, "finished every turn", *("yes" if f else "no" for f in finished), "-", "-"])
    return rows


def _complete(summary: dict[str, Any], system: str) -> bool:
    """Whether a summary's run of ``system`` finished every turn (on every seed of a replicate run)."""
    replicates = summary.get("replicates")
    if isinstance(replicates, dict) and replicates.get("incomplete_seeds", {}).get(system):
        return False
    one = summary["systems"][system]
    return bool(one.get("complete", one.get("failed_requests", 0) == 0))
