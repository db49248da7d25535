"""Per-request timestamps of a cluster run, and the figures computed from them (paper §7: JCT, TTFT, TTST,
TPOT and the TTFT breakdown of Fig. 12).

Request ids are 0, 1, 2, … in arrival order, so every column is a flat array indexed by id (a run of 640,000
turns keeps a few dozen MB, not an object per request). A time not reached yet is -1.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Metrics", "Percentiles", "percentiles"]

_UNSET = -1


def _column() -> array[int]:
    return array("q")


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float
    mean: float

    def as_dict(self) -> dict[str, float]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "mean": self.mean}


def percentiles(values: Sequence[float]) -> Percentiles:
    """Nearest-rank percentiles (0 for an empty list)."""
    if not values:
        return Percentiles(0.0, 0.0, 0.0, 0.0)
    ordered = sorted(values)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[min(n - 1, max(0, -(-int(q * n * 1000) // 1000) - 1))]

    return Percentiles(rank(0.5), rank(0.9), rank(0.99), sum(ordered) / n)


class Metrics:
    """Timestamps (ns) per request; filled by the actors as the request moves."""

    def __init__(self) -> None:
        self.agent = _column()
        self.prompt = _column()
        self.hit = _column()
        self.gen = _column()
        self.arrive_ns = _column()
        self.scheduled_pe_ns = _column()
        self.scheduled_de_ns = _column()
        self.read_start_ns = _column()
        self.read_done_ns = _column()
        self.prefill_start_ns = _column()
        self.first_token_ns = _column()
        self.second_token_ns = _column()
        self.done_ns = _column()
        self.pe = _column()
        self.de = _column()
        self.read_on_de = _column()
        self.forward_ns = _column()
        """Start of each prefill forward pass (all groups, in start order)."""
        self.forward_attention_balance: array[float] = array("d")
        """Per forward pass: max/mean attention time over the GPUs of its group (an idle GPU counts 0; the
        DP barrier makes every GPU wait for the slowest), Fig. 13 right."""

    def __len__(self) -> int:
        return len(self.arrive_ns)

    def arrive(self, rid: int, agent: int, t_ns: int, prompt: int, hit: int, gen: int) -> None:
        if rid != len(self.arrive_ns):
            raise ValueError(f"request ids must come in order: got {rid}, expected {len(self.arrive_ns)}")
        for column, value in ((self.agent, agent), (self.prompt, prompt), (self.hit, hit), (self.gen, gen),
                              (self.arrive_ns, t_ns)):  # fmt: skip
            column.append(value)
        for column in (self.scheduled_pe_ns, self.scheduled_de_ns, self.read_start_ns, self.read_done_ns,
                       self.prefill_start_ns, self.first_token_ns, self.second_token_ns, self.done_ns, self.pe,
                       self.de, self.read_on_de):  # fmt: skip
            column.append(_UNSET)

    def scheduled_pe(self, rid: int, t_ns: int) -> None:
        self.scheduled_pe_ns[rid] = t_ns

    def scheduled_de(self, rid: int, t_ns: int, pe: int, de: int, read_on_de: bool) -> None:
        self.scheduled_de_ns[rid] = t_ns
        self.pe[rid], self.de[rid], self.read_on_de[rid] = pe, de, int(read_on_de)

    def read_start(self, rid: int, t_ns: int) -> None:
        self.read_start_ns[rid] = t_ns

    def read_done(self, rid: int, t_ns: int) -> None:
        self.read_done_ns[rid] = t_ns

    def prefill_start(self, rid: int, t_ns: int) -> None:
        if self.prefill_start_ns[rid] == _UNSET:
            self.prefill_start_ns[rid] = t_ns

    def first_token(self, rid: int, t_ns: int) -> None:
        self.first_token_ns[rid] = t_ns

    def second_token(self, rid: int, t_ns: int) -> None:
        self.second_token_ns[rid] = t_ns

    def done(self, rid: int, t_ns: int) -> None:
        if self.done_ns[rid] != _UNSET:
            raise RuntimeError(f"request {rid} ended twice")
        self.done_ns[rid] = t_ns

    def forward(self, t_ns: int, attention_s: Sequence[float]) -> None:
        """A prefill forward pass started with these per-GPU attention times (one per GPU of the group)."""
        mean = sum(attention_s) / len(attention_s)
        self.forward_ns.append(t_ns)
        self.forward_attention_balance.append(max(attention_s) / mean if mean > 0 else 1.0)

    # --- figures -------------------------------------------------------------------------------------

    def unfinished(self) -> list[int]:
        """Requests admitted but not ended."""
        return [rid for rid, t in enumerate(self.done_ns) if t == _UNSET]

    def ttft_s(self) -> list[float]:
        return [(f - a) / 1e9 for a, f in zip(self.arrive_ns, self.first_token_ns) if f != _UNSET]

    def ttst_s(self) -> list[float]:
        return [(s - a) / 1e9 for a, s in zip(self.arrive_ns, self.second_token_ns) if s != _UNSET]

    def tpot_s(self) -> list[float]:
        """Per request with at least 3 tokens: (last token − second token) / (tokens − 2)."""
        out = []
        for second, done, gen in zip(self.second_token_ns, self.done_ns, self.gen):
            if second != _UNSET and done != _UNSET and gen > 2:
                out.append((done - second) / (gen - 2) / 1e9)
        return out

    def jct_s(self) -> float:
        """Job completion time: from the first arrival to the last request's end (offline, §7.3)."""
        ended = [t for t in self.done_ns if t != _UNSET]
        return (max(ended) - min(self.arrive_ns)) / 1e9 if ended else 0.0
