"""Statistics of a workload: the Table 2 columns of a dataset, and per-turn length distributions of any trace.

Per turn: prompt, hit, append, gen (an agent turn's hit is its context, §3.2); the prefix-hit fraction is Σ hit / Σ
prompt (token-weighted); p50 and p99 are nearest-rank percentiles. :func:`dataset_stats` computes Table 2's columns in
the per-trajectory reading :mod:`~dualpath_emu.workload.generator` matches, and the per-turn values beside them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dualpath_emu.workload.trajectory import Trajectory

__all__ = ["Distribution", "Table2Stats", "TraceStats", "dataset_stats", "distribution", "trace_stats"]


@dataclass(frozen=True)
class Distribution:
    """Summary of a list of numbers: count, mean, nearest-rank p50 and p99, max (0s when empty)."""

    count: int
    mean: float
    p50: float
    p99: float
    max: float


def distribution(values: Sequence[float]) -> Distribution:
    """The :class:`Distribution` of ``values``."""
    if not values:
        return Distribution(0, 0.0, 0.0, 0.0, 0.0)
    ordered = sorted(values)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * n) - 1)]

    return Distribution(n, math.fsum(ordered) / n, rank(0.50), rank(0.99), ordered[-1])


@dataclass(frozen=True)
class Table2Stats:
    """Table 2's columns (§7.2) in the per-trajectory reading, then the per-turn view and the longest round."""

    trajectories: int
    turns: float
    append: float
    gen: float
    total: float
    context: float
    hit_rate: float
    append_per_turn: float
    gen_per_turn: float
    hit_fraction: float
    max_tokens: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def dataset_stats(trajectories: Sequence[Trajectory]) -> Table2Stats:
    """The Table 2 columns of ``trajectories`` (at least one)."""
    if not trajectories:
        raise ValueError("dataset_stats: no trajectories")
    n = len(trajectories)
    turns = sum(len(t) for t in trajectories)
    append_sum = sum(sum(t.append) for t in trajectories)
    gen_sum = sum(sum(t.gen) for t in trajectories)
    hit_sum = sum(sum(t.hits()) for t in trajectories)
    context = hit_sum / turns
    append = math.fsum(sum(t.append) / len(t) for t in trajectories) / n
    return Table2Stats(
        trajectories=n, turns=turns / n, append=append, gen=math.fsum(sum(t.gen) / len(t) for t in trajectories) / n,
        total=(append_sum + gen_sum) / n, context=context, hit_rate=context / (context + append),
        append_per_turn=append_sum / turns, gen_per_turn=gen_sum / turns,
        hit_fraction=hit_sum / (hit_sum + append_sum), max_tokens=max(t.max_tokens for t in trajectories),
    )  # fmt: skip


@dataclass(frozen=True)
class TraceStats:
    """What ``dualpath-emu trace stats`` prints: counts, per-turn length distributions, prefix-hit fraction."""

    trajectories: int
    agent_trajectories: int
    turns: int
    turns_per_trajectory: Distribution
    prompt: Distribution
    hit: Distribution
    append: Distribution
    gen: Distribution
    hit_fraction: float
    duration_s: float | None  # Last arrival minus first arrival, if turns carry arrival times.

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def trace_stats(trajectories: Sequence[Trajectory]) -> TraceStats:
    """The :class:`TraceStats` of ``trajectories``."""
    prompts: list[int] = []
    hits: list[int] = []
    arrivals: list[float] = []
    for trajectory in trajectories:
        turn_hits = trajectory.hits()
        hits.extend(turn_hits)
        prompts.extend(h + a for h, a in zip(turn_hits, trajectory.append))
        if trajectory.arrival_s is not None:
            arrivals.extend(trajectory.arrival_s)
    appends = [a for t in trajectories for a in t.append]
    hit_sum = sum(hits)
    prompt_sum = sum(prompts)
    return TraceStats(
        trajectories=len(trajectories), agent_trajectories=sum(1 for t in trajectories if t.is_agent),
        turns=len(prompts), turns_per_trajectory=distribution([len(t) for t in trajectories]),
        prompt=distribution(prompts), hit=distribution(hits), append=distribution(appends),
        gen=distribution([g for t in trajectories for g in t.gen]),
        hit_fraction=hit_sum / prompt_sum if prompt_sum else 0.0,
        duration_s=max(arrivals) - min(arrivals) if arrivals else None,
    )  # fmt: skip
