"""Lags in bounded memory (:class:`LagStats`): how late a real-time run delivers what its model says.

A real-time loop measures, for each completion it delivers, its clock at delivery minus the completion's
modelled end (the *delivery lag*), and the data-plane service, for each batch, its clock when it submitted
it minus the requester's clock when it was made (the *submission lag*); both in the run's (emulated)
nanoseconds: divide by the time scale for wall time. Each process keeps its own; :meth:`LagStats.to_wire`
and :meth:`LagStats.merge` combine them into the run's."""

from __future__ import annotations

import math
from typing import Any, Final

__all__ = ["LagStats"]

_SUB_BITS: Final = 5
_SUB: Final = 1 << _SUB_BITS  # 32 buckets per power of two above 64: at most 1/64 (1.6 %) relative error


class LagStats:
    """A stream of lags (ns) in a log-linear histogram of bounded memory (quantiles within 1.6%)."""

    __slots__ = ("count", "negative", "min", "max", "total", "_buckets")

    def __init__(self) -> None:
        self.count = 0
        self.negative = 0
        self.min = 0
        self.max = 0
        self.total = 0
        self._buckets: dict[int, int] = {}

    def add(self, value: int) -> None:
        """Record one lag of ``value`` ns."""
        if self.count == 0:
            self.min = self.max = value
        elif value < self.min:
            self.min = value
        elif value > self.max:
            self.max = value
        self.count += 1
        self.total += value
        if value < 64:
            if value < 0:
                self.negative += 1
                value = 0
            index = value
        else:
            shift = value.bit_length() - (_SUB_BITS + 1)
            index = (shift << _SUB_BITS) + (value >> shift)
        buckets = self._buckets
        buckets[index] = buckets.get(index, 0) + 1

    @staticmethod
    def _value(index: int) -> int:
        if index < 64:
            return index
        shift = (index >> _SUB_BITS) - 1
        mantissa = (index & (_SUB - 1)) + _SUB
        return ((mantissa << shift) + ((mantissa + 1) << shift) - 1) // 2  # the bucket's middle

    def quantile(self, q: float) -> int:
        """The ``q``-quantile (0 ≤ q ≤ 1) in ns (0 when empty), clamped to [min, max]."""
        if self.count == 0:
            return 0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for index in sorted(self._buckets):
            seen += self._buckets[index]
            if seen >= rank:
                return min(max(self._value(index), self.min), self.max)
        return self.max

    def summary(self) -> dict[str, int | float]:
        """``count``, ``p50_ns``, ``p99_ns``, ``max_ns``, ``min_ns``, ``mean_ns`` and ``negative``."""
        return {
            "count": self.count, "p50_ns": self.quantile(0.5), "p99_ns": self.quantile(0.99), "max_ns": self.max,
            "min_ns": self.min, "mean_ns": round(self.total / self.count, 1) if self.count else 0.0,
            "negative": self.negative,
        }  # fmt: skip

    def to_wire(self) -> dict[str, Any]:
        """Everything, histogram included, as msgpack/JSON-able data (:meth:`from_wire` rebuilds it)."""
        return {"count": self.count, "negative": self.negative, "min": self.min, "max": self.max,
                "total": self.total, "buckets": sorted(self._buckets.items())}  # fmt: skip

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> LagStats:
        stats = cls()
        stats.count, stats.negative = int(data["count"]), int(data["negative"])
        stats.min, stats.max, stats.total = int(data["min"]), int(data["max"]), int(data["total"])
        stats._buckets = {int(index): int(count) for index, count in data["buckets"]}
        return stats

    def merge(self, other: LagStats) -> None:
        """Add ``other``'s values to these (as if each had been added here)."""
        if other.count == 0:
            return
        if self.count == 0:
            self.min, self.max = other.min, other.max
        else:
            self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self.count += other.count
        self.negative += other.negative
        self.total += other.total
        for index, count in other._buckets.items():
            self._buckets[index] = self._buckets.get(index, 0) + count
