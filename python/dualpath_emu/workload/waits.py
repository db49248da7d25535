"""Tool waits: the time an agent spends between two of its turns (a tool call, thinking), issue 25.

In the paper's runs an agent sends its next turn the moment the previous one ends (§8.2: zero think time).
Real agents wait: a tool runs, a user reads. The wait keeps the agent's context alive (its KV is stored and
counted in the working set) while it sends nothing, so at a given arrival rate more agents are alive at once.

A wait comes from the trajectory file, per round (``[append, gen, wait_s]``,
:mod:`~dualpath_emu.workload.trajectory`), or else is drawn from the scenario's distribution
(:class:`ToolWait`, ``[workload.tool_wait]``) for every turn after an agent's first, from the run's seed (its
own stream, so the arrivals and everything else draw what they drew without waits). No wait is no timer: a
run without waits is the run it always was, event for event.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from dualpath_emu.errors import UsageError
from dualpath_emu.inputs import open_input, short_repr

__all__ = ["DISTRIBUTIONS", "MAX_SAMPLES", "MAX_WAIT_S", "ToolWait", "read_wait_samples"]

Distribution = Literal["none", "constant", "exponential", "lognormal", "empirical"]
DISTRIBUTIONS: Final[tuple[Distribution, ...]] = ("none", "constant", "exponential", "lognormal", "empirical")
MAX_WAIT_S: Final = 86_400.0
"""The longest wait (a day) a scenario's distribution mean or a trajectory file's wait may state."""
MAX_SIGMA: Final = 5.0
MAX_SAMPLES: Final = 1_000_000
"""The most waits an empirical distribution's file may hold."""


@dataclass(frozen=True)
class ToolWait:
    """The wait before an agent's next turn, in seconds: ``dist`` is

    * ``"none"``: no wait (the paper's setting);
    * ``"constant"``: ``mean_s`` every time;
    * ``"exponential"``: exponential with mean ``mean_s`` (a memoryless tool);
    * ``"lognormal"``: lognormal with mean ``mean_s`` and ``sigma`` the standard deviation of its logarithm
      (heavy-tailed, as measured tool latencies are: ``sigma`` 1 puts the p99 near 6× the median);
    * ``"empirical"``: one of ``samples`` (seconds, e.g. measured), each equally likely.
    """

    dist: Distribution = "none"
    mean_s: float = 0.0
    sigma: float = 1.0
    samples: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.dist not in DISTRIBUTIONS:
            raise ValueError(f"tool wait: dist must be one of {', '.join(DISTRIBUTIONS)}, got {self.dist!r}")
        if not (math.isfinite(self.mean_s) and 0.0 <= self.mean_s <= MAX_WAIT_S):
            raise ValueError(f"tool wait: mean_s must be in [0, {MAX_WAIT_S:g}], got {self.mean_s}")
        if not (math.isfinite(self.sigma) and 0.0 <= self.sigma <= MAX_SIGMA):
            raise ValueError(f"tool wait: sigma must be in [0, {MAX_SIGMA:g}], got {self.sigma}")
        if self.dist == "empirical" and not self.samples:
            raise ValueError("tool wait: an empirical distribution needs at least one sample")
        if not all(math.isfinite(s) and 0.0 <= s <= MAX_WAIT_S for s in self.samples):
            raise ValueError(f"tool wait: every sample must be a number of seconds in [0, {MAX_WAIT_S:g}]")

    @property
    def waits(self) -> bool:
        """Whether any turn waits (``False``: the run has no wait timers at all)."""
        if self.dist == "empirical":
            return any(s > 0.0 for s in self.samples)
        return self.dist != "none" and self.mean_s > 0.0

    @property
    def mean(self) -> float:
        """The distribution's mean wait (seconds)."""
        if self.dist == "none":
            return 0.0
        if self.dist == "empirical":
            return math.fsum(self.samples) / len(self.samples)
        return self.mean_s

    def draw(self, rng: random.Random) -> float:
        """One wait (seconds) from ``rng``."""
        if self.dist == "constant":
            return self.mean_s
        if self.dist == "exponential":
            return rng.expovariate(1.0 / self.mean_s) if self.mean_s > 0.0 else 0.0
        if self.dist == "lognormal":
            if self.mean_s <= 0.0:
                return 0.0
            # E[exp(N(mu, sigma^2))] = exp(mu + sigma^2 / 2) = mean_s
            return min(rng.lognormvariate(math.log(self.mean_s) - self.sigma**2 / 2, self.sigma), MAX_WAIT_S)
        if self.dist == "empirical":
            return self.samples[rng.randrange(len(self.samples))]
        return 0.0

    def describe(self) -> str:
        """In words, e.g. ``lognormal tool waits (mean 5 s, sigma 1)``."""
        if not self.waits:
            return "no tool waits"
        if self.dist == "lognormal":
            return f"lognormal tool waits (mean {self.mean_s:g} s, sigma {self.sigma:g})"
        if self.dist == "empirical":
            return f"empirical tool waits ({len(self.samples)} samples, mean {self.mean:.3g} s)"
        return f"{self.dist} tool waits (mean {self.mean_s:g} s)"


def read_wait_samples(path: str | Path) -> tuple[float, ...]:
    """The waits (seconds) in ``path``: one number per line; blank lines and ``#`` comments are skipped. Anything
    else is a :class:`~dualpath_emu.errors.UsageError` naming the file and line."""
    with open_input(path, what="a file of tool waits (one number of seconds per line)", limit_bytes=64 << 20) as file:
        data = file.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
    samples: list[float] = []
    for number, line in enumerate(text.splitlines(), start=1):
        value = line.split("#", 1)[0].strip()
        if not value:
            continue
        try:
            wait = float(value)
        except ValueError:
            wait = math.nan
        if not (math.isfinite(wait) and 0.0 <= wait <= MAX_WAIT_S):
            raise UsageError(f"{path}:{number}: expected a number of seconds in [0, {MAX_WAIT_S:g}], got {short_repr(value, 40)}")
        samples.append(wait)
        if len(samples) > MAX_SAMPLES:
            raise UsageError(f"{path}: more than {MAX_SAMPLES:,} waits")
    if not samples:
        raise UsageError(f"{path}: no waits in it (expected one number of seconds per line)")
    return tuple(samples)
