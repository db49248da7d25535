"""Synthetic agent trajectories shaped like the paper's three datasets (Table 2: MaxLen 32K, 48K, 64K),
deterministic from a seed, extended to more agents as §3.2 / A.3 does. Which reading of Table 2 is matched, the
distributions and how their parameters are solved: docs/workloads.md ("The synthetic datasets")."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from dualpath_emu.workload.trajectory import Trajectory, truncated

__all__ = [
    "DATASETS", "MAX_AGENTS", "MAX_BASE_TRAJECTORIES", "MAX_SIGMA", "READINGS", "Dataset", "GeneratorParams", "Model",
    "PaperRow", "extend_agents", "generate", "generate_base", "max_total_min_fraction", "model", "scaled",
]  # fmt: skip

MAX_AGENTS: Final = 100_000  # The most agents :func:`generate` makes (~250 MB at this many).
MAX_BASE_TRAJECTORIES: Final = 100_000
MAX_SIGMA: Final = 5.0  # The largest σ of the generator's lognormal weights.

Reading = Literal["per-trajectory", "per-turn"]
READINGS: Final[tuple[Reading, ...]] = ("per-trajectory", "per-turn")


@dataclass(frozen=True)
class PaperRow:
    """The Table 2 columns (§7.2): means of turns, append/gen tokens per turn, total tokens, context tokens."""

    turns: float
    append: float
    gen: float
    total: float
    context: float


@dataclass(frozen=True)
class Dataset:
    """One of the paper's datasets: its name, MaxLen (tokens) and its Table 2 row."""

    name: str
    max_len: int
    paper: PaperRow


# Table 2 (arXiv 2602.21548 §7.2) [exact]. "32K" is taken as 32 × 1024 tokens (a model's context window).
DATASETS: Final[Mapping[str, Dataset]] = {
    "32k": Dataset("32k", 32 * 1024, PaperRow(turns=60, append=608, gen=148, total=28_639, context=17_183)),
    "48k": Dataset("48k", 48 * 1024, PaperRow(turns=106, append=474, gen=172, total=42_607, context=25_120)),
    "64k": Dataset("64k", 64 * 1024, PaperRow(turns=157, append=429, gen=176, total=55_958, context=32_721)),
}


@dataclass(frozen=True)
class GeneratorParams:
    """The generator's knobs (docs/workloads.md, "The synthetic datasets")."""

    n_base: int = 500
    reading: Reading = "per-trajectory"
    append_sigma: float = 1.0
    gen_sigma: float = 0.6
    first_round_sigma: float = 0.3
    total_min_fraction: float = 0.1
    first_append: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.n_base <= MAX_BASE_TRAJECTORIES:
            raise ValueError(f"n_base: expected an integer in [1, {MAX_BASE_TRAJECTORIES}], got {self.n_base}")
        if self.reading not in READINGS:
            raise ValueError(f"reading: expected one of {', '.join(READINGS)}, got {self.reading!r}")
        for name in ("append_sigma", "gen_sigma", "first_round_sigma"):
            value = getattr(self, name)
            if not 0 <= value <= MAX_SIGMA:
                raise ValueError(f"{name}: expected a number in [0, {MAX_SIGMA}], got {value}")
        if not 0 < self.total_min_fraction < 1:
            raise ValueError(f"total_min_fraction: expected a number in (0, 1), got {self.total_min_fraction}")
        if self.first_append < 1:
            raise ValueError(f"first_append: expected an integer >= 1, got {self.first_append}")


@dataclass(frozen=True)
class Model:
    """The per-dataset parameters derived from Table 2 (module docstring, steps 1–4): τ, σ_T, k, s_A, φ."""

    turns_mean: float
    turns_sigma: float
    total_shape: float
    append_share: float
    first_share: float


def max_total_min_fraction(dataset: Dataset) -> float:
    """The bound ``total_min_fraction`` must stay below: the dataset's mean total / MaxLen (step 2)."""
    return dataset.paper.total / dataset.max_len


def model(dataset: Dataset, params: GeneratorParams = GeneratorParams()) -> Model:
    """Solve the model's parameters from the dataset's Table 2 row (closed forms)."""
    row = dataset.paper
    bound = max_total_min_fraction(dataset)
    if not params.total_min_fraction < bound:
        raise ValueError(
            f"total_min_fraction: expected a number in (0, {bound:.4f}) for dataset {dataset.name} (below its "
            f"mean total / MaxLen), got {params.total_min_fraction}"
        )
    per_turn = row.append + row.gen
    turns_sigma = _solve_sigma(row.turns * per_turn / row.total)
    tau = row.turns if params.reading == "per-trajectory" else row.total / per_turn
    mean_fraction = row.total / dataset.max_len
    total_shape = (1 - params.total_min_fraction) / (1 - mean_fraction) - 1
    s_a = row.append / per_turn
    # Σ_i context_i = Σ_k (A_k + g_k)(T - k); with exchangeable weights its expectation given (T, L) is
    # L·[φ·T/2 + s_A·(T - 2)/2 + (1 - s_A)·(T - 1)/2]; T ⟂ L, so dividing by E[T] = τ and equating to
    # Context gives φ.
    first_share = (2 * row.context * tau / row.total - s_a * (tau - 2) - (1 - s_a) * (tau - 1)) / tau
    if not (total_shape > 0 and 0 < first_share < s_a):
        raise ValueError(f"dataset {dataset.name}: Table 2 row {row} gives no valid model")
    return Model(tau, turns_sigma, total_shape, s_a, first_share)


_Z_CLAMP: Final = 3.0  # z of the turn counts exp(μ + σ·z) is clamped to ±3: no 1-round or 5,000-round agents.


def _clamped_mean(sigma: float) -> float:
    """E[exp(σ·clamp(Z, -c, c))] for standard normal Z (c = 3); the same for -σ by symmetry."""
    phi = statistics.NormalDist().cdf
    c = _Z_CLAMP
    return math.exp(sigma**2 / 2) * (phi(c - sigma) - phi(-c - sigma)) + (
        math.exp(sigma * c) + math.exp(-sigma * c)
    ) * phi(-c)


def _solve_sigma(ratio: float) -> float:
    """σ with E[T]·E[1/T] = ratio for T = exp(μ + σ·clamp(Z)) (that product is ``_clamped_mean(σ)²``)."""
    low, high = 0.0, 3.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _clamped_mean(mid) ** 2 < ratio else (low, mid)
    return (low + high) / 2


def _stratified(n: int, rng: random.Random) -> list[float]:
    """n uniforms in (0, 1), one in each stratum [j/n, (j+1)/n), in random order."""
    strata = list(range(n))
    rng.shuffle(strata)
    return [min(max((j + rng.random()) / n, 1e-12), 1 - 1e-12) for j in strata]


def _split(total: int, parts: int, sigma: float, rng: random.Random) -> list[int]:
    """``total`` tokens in ``parts`` integers >= 1 proportional to i.i.d. lognormal(0, σ) weights."""
    weights = [rng.lognormvariate(0.0, sigma) for _ in range(parts)]
    scale = (total - parts) / sum(weights)
    out = []
    cumulative = 0.0
    previous = 0
    for w in weights:  # cumulative rounding: the parts add up to total exactly
        cumulative += w * scale
        current = round(cumulative)
        out.append(1 + current - previous)
        previous = current
    out[-1] += total - sum(out)  # float rounding of the last cumulative sum
    return out


def generate_base(dataset: Dataset, seed: int = 0, params: GeneratorParams = GeneratorParams()) -> list[Trajectory]:
    """The ``params.n_base`` base trajectories of ``dataset`` for ``seed`` (ids ``<name>-00000``, …)."""
    m = model(dataset, params)
    rng = random.Random(f"dualpath-emu/workload/{dataset.name}/{seed}/base")
    normal = statistics.NormalDist()
    n = params.n_base
    turn_u = _stratified(n, rng)
    total_u = _stratified(n, rng)
    mu_t = math.log(m.turns_mean / _clamped_mean(m.turns_sigma))
    out = []
    for j in range(n):
        fraction = 1 - (1 - params.total_min_fraction) * total_u[j] ** m.total_shape
        total = max(4, min(dataset.max_len, round(fraction * dataset.max_len)))
        append_total = round(m.append_share * total)
        gen_total = total - append_total
        z = min(max(normal.inv_cdf(turn_u[j]), -_Z_CLAMP), _Z_CLAMP)
        turns = round(math.exp(mu_t + m.turns_sigma * z))
        turns = max(2, min(turns, gen_total, append_total))
        phi = m.first_share * rng.lognormvariate(-(params.first_round_sigma**2) / 2, params.first_round_sigma)
        first = max(1, min(round(phi * total), append_total - (turns - 1)))
        append = [first, *_split(append_total - first, turns - 1, params.append_sigma, rng)]
        gen = _split(gen_total, turns, params.gen_sigma, rng)
        out.append(Trajectory(f"{dataset.name}-{j:05d}", tuple(append), tuple(gen)))
    return out


def extend_agents(
    base: Sequence[Trajectory], agents: int, rng: random.Random, *, first_append: int = 1, max_len: int, prefix: str
) -> list[Trajectory]:
    """``base`` cut or extended to ``agents`` trajectories (§3.2, A.3; docs/workloads.md)."""
    if agents <= len(base):
        return list(base[:agents])
    if not base:
        raise ValueError("extend_agents: no base trajectories to copy")
    out = list(base)
    for k in range(len(base), agents):
        copied = base[rng.randrange(len(base))]
        agent = Trajectory(f"{prefix}-{k:05d}", (first_append, *copied.append), (1, *copied.gen))
        out.append(truncated(agent, max_len))
    return out


def generate(
    name: str, agents: int | None = None, seed: int = 0, params: GeneratorParams = GeneratorParams()
) -> list[Trajectory]:
    """``agents`` trajectories (default ``params.n_base``) of dataset ``name`` (``32k``, ``48k``, ``64k``)."""
    if name not in DATASETS:
        raise ValueError(f"dataset: expected one of {', '.join(DATASETS)}, got {name!r}")
    if agents is not None and not 1 <= agents <= MAX_AGENTS:
        raise ValueError(f"agents: expected an integer in [1, {MAX_AGENTS}], got {agents}")
    dataset = DATASETS[name]
    if params.first_append >= dataset.max_len:  # an extra agent's first round must fit
        raise ValueError(
            f"first_append: expected an integer below {name}'s MaxLen {dataset.max_len}, got {params.first_append}"
        )
    base = generate_base(dataset, seed, params)
    rng = random.Random(f"dualpath-emu/workload/{name}/{seed}/extra")
    count = params.n_base if agents is None else agents
    return extend_agents(base, count, rng, first_append=params.first_append, max_len=dataset.max_len, prefix=name)


def scaled(trajectory: Trajectory, *, append_factor: float = 1.0, gen_factor: float = 1.0, max_len: int) -> Trajectory:
    """An agent trajectory with appends (gens) × ``append_factor`` (``gen_factor``), re-truncated (Fig. 9)."""
    if trajectory.hit is not None:
        raise ValueError(f"trajectory {trajectory.id!r}: scaling needs an agent trajectory (implied hits)")
    if not (append_factor > 0 and gen_factor > 0):
        raise ValueError("scaled: factors must be > 0")
    append = [max(1, round(a * append_factor)) for a in trajectory.append]
    gen = [max(1, round(g * gen_factor)) for g in trajectory.gen]
    # A first round that no longer fits alone is clipped to fit (the agent still runs one turn), as the
    # re-truncation keeps every agent in the job.
    if append[0] + gen[0] > max_len:
        gen[0] = min(gen[0], max(1, max_len // 8))
        append[0] = max_len - gen[0]
    return truncated(Trajectory(trajectory.id, tuple(append), tuple(gen)), max_len)
