"""Tool waits: the time an agent spends between two of its turns (a tool call, thinking; §8.2), keeping its context
alive while it sends nothing. A wait comes from the trajectory file or is drawn from the scenario's distribution
(:class:`ToolWait`, ``[workload.tool_wait]``) for every turn after an agent's first; no wait is no timer. A drawn wait
is a function of (seed, agent, turn) alone (:class:`WaitDraws`, common random numbers): every system, driver and
process gives an agent the same waits."""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from dualpath_emu.errors import UsageError
from dualpath_emu.inputs import open_input, short_repr

__all__ = ["DISTRIBUTIONS", "MAX_SAMPLES", "MAX_WAIT_S", "WAIT_STREAM", "ToolWait", "WaitDraws", "read_wait_samples"]

Distribution = Literal["none", "constant", "exponential", "lognormal", "empirical"]
DISTRIBUTIONS: Final[tuple[Distribution, ...]] = ("none", "constant", "exponential", "lognormal", "empirical")
MAX_WAIT_S: Final = 86_400.0
"""The longest wait (a day) a scenario's distribution mean or a trajectory file's wait may state."""
MAX_SIGMA: Final = 5.0
MAX_SAMPLES: Final = 1_000_000  # The most waits an empirical distribution's file may hold.
WAIT_STREAM: Final = "client/tool-wait"  # The name the waits' key is derived from, with the seed (:class:`WaitDraws`).
_TWO_WORDS: Final = struct.Struct(">QQ")
_pack, _unpack, _blake2b = _TWO_WORDS.pack, _TWO_WORDS.unpack, hashlib.blake2b
_UNIT: Final = 2.0**-52


@dataclass(frozen=True)
class ToolWait:
    """The wait before an agent's next turn, in seconds: ``dist`` is

    * ``"none"``: no wait (the paper's setting);
    * ``"constant"``: ``mean_s`` every time;
    * ``"exponential"``: exponential with mean ``mean_s`` (a memoryless tool);
    * ``"lognormal"``: lognormal with mean ``mean_s`` and ``sigma`` the standard deviation of its logarithm
      (heavy-tailed, as measured tool latencies are: ``sigma`` 1 puts the p99 near 6× the median);
    * ``"empirical"``: one of ``samples`` (seconds, e.g. measured), each equally likely."""

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

    def draw(self, a: int, b: int) -> float:
        """The wait (seconds) that ``a`` and ``b``, two independent uniform 64-bit words, give: by the inverse
        CDF of ``u = ((a >> 12) + 0.5) / 2**52`` for exponential (exact in a double, so in (0, 1), never 0 or 1),
        by Box–Muller with ``v`` likewise from ``b`` for lognormal (capped at :data:`MAX_WAIT_S`), sample
        ``(a * n) >> 64`` of ``n`` for empirical."""
        if self.dist == "constant":
            return self.mean_s
        if self.dist == "empirical":
            samples = self.samples
            return samples[(a * len(samples)) >> 64]
        if self.mean_s <= 0.0 or self.dist not in ("exponential", "lognormal"):
            return 0.0
        u = ((a >> 12) + 0.5) * _UNIT
        if self.dist == "exponential":
            return -self.mean_s * math.log(u)
        # E[exp(N(mu, sigma^2))] = exp(mu + sigma^2 / 2) = mean_s
        z = math.sqrt(-2.0 * math.log(u)) * math.cos(2.0 * math.pi * ((b >> 12) + 0.5) * _UNIT)
        return min(math.exp(math.log(self.mean_s) - self.sigma**2 / 2 + self.sigma * z), MAX_WAIT_S)

    def describe(self) -> str:
        """In words, e.g. ``lognormal tool waits (mean 5 s, sigma 1)``."""
        if not self.waits:
            return "no tool waits"
        if self.dist == "lognormal":
            return f"lognormal tool waits (mean {self.mean_s:g} s, sigma {self.sigma:g})"
        if self.dist == "empirical":
            return f"empirical tool waits ({len(self.samples)} samples, mean {self.mean:.3g} s)"
        return f"{self.dist} tool waits (mean {self.mean_s:g} s)"


class WaitDraws:
    """The scenario's waits of a run with ``seed``, each a function of (seed, agent, turn) alone.

    ``WaitDraws(w, seed)(agent, turn)`` is :meth:`ToolWait.draw` of the two big-endian 8-byte halves of the
    16-byte BLAKE2b digest of ``agent`` and ``turn`` (big-endian unsigned 8-byte integers), keyed with the
    SHA-256 of ``"<seed>/client/tool-wait"``: no ``PYTHONHASHSEED`` or platform enters; about 2 µs a draw.
    ``agent`` is the agent's index in the run's trajectories."""

    __slots__ = ("_key", "_draw", "_constant", "tool_wait")

    def __init__(self, tool_wait: ToolWait, seed: int) -> None:
        self.tool_wait = tool_wait
        self._key = hashlib.sha256(f"{seed}/{WAIT_STREAM}".encode()).digest()
        self._draw = tool_wait.draw
        self._constant = tool_wait.mean_s if tool_wait.dist == "constant" else None
        """A constant wait needs no hash (a turn's whole budget is ~200 µs)."""

    def words(self, agent: int, turn: int) -> tuple[int, int]:
        """The two uniform 64-bit words of ``turn`` of ``agent``."""
        digest = _blake2b(_pack(agent, turn), digest_size=16, key=self._key).digest()
        return _unpack(digest)

    def __call__(self, agent: int, turn: int) -> float:
        """The wait (seconds) before ``turn`` of ``agent``."""
        if self._constant is not None:
            return self._constant
        return self._draw(*_unpack(_blake2b(_pack(agent, turn), digest_size=16, key=self._key).digest()))


def read_wait_samples(path: str | Path) -> tuple[float, ...]:
    """The waits (seconds) in ``path``, one per line (``#`` comments); else a :class:`UsageError`."""
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
            raise UsageError(
                f"{path}:{number}: expected a number of seconds in [0, {MAX_WAIT_S:g}], got {short_repr(value, 40)}"
            )
        samples.append(wait)
        if len(samples) > MAX_SAMPLES:
            raise UsageError(f"{path}: more than {MAX_SAMPLES:,} waits")
    if not samples:
        raise UsageError(f"{path}: no waits in it (expected one number of seconds per line)")
    return tuple(samples)
