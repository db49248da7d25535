"""The systems compared (paper §7.2, §7.5; paper-facts §8.1): one registered bundle of policies each.

A :class:`System` says which read paths are allowed, whether prefill is layerwise, which scheduler assigns
engines, and whether I/O is modelled at all (Oracle bypasses it). Adding a system is one entry in
:data:`SYSTEMS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from dualpath_emu.cluster.scheduler import DualPathPolicy, Policy, RoundRobinPolicy

__all__ = ["SYSTEMS", "System"]


@dataclass(frozen=True)
class System:
    name: str
    description: str
    layerwise: bool
    """Layerwise prefill (§4): per-layer KV streamed into HBM during the forward pass; otherwise the whole hit
    KV is copied into HBM first and the request's KV must fit in the PE's HBM."""
    dual_path: bool
    """Reads may go through the decode node (storage → DE buffer → PE); otherwise PE-read only."""
    scheduler: Literal["dualpath", "round_robin"]
    oracle: bool = False
    """Disk reads, H2D/D2H and PE→DE transfers bypassed (§7.2): the zero-I/O bound."""

    def policy(self, alpha_tokens: int, beta_tokens: int) -> Policy:
        """This system's scheduling policy."""
        if self.scheduler == "dualpath":
            return DualPathPolicy(read_both_sides=self.dual_path, alpha_tokens=alpha_tokens, beta_tokens=beta_tokens)
        return RoundRobinPolicy(read_both_sides=self.dual_path)


SYSTEMS: Final[Mapping[str, System]] = MappingProxyType(
    {
        s.name: s
        for s in (
            System("basic", "PE-read only, no layerwise prefill, round-robin engines (paper's Basic)", False, False,
                   "round_robin"),
            System("basic+layerwise", "Basic with layerwise prefill (ablation step 1)", True, False, "round_robin"),
            System("basic+layerwise+dualpath", "…and dual-path loading, round-robin engines (ablation step 2)",
                   True, True, "round_robin"),
            System("dualpath", "layerwise prefill, dual-path loading, DualPath's scheduler", True, True, "dualpath"),
            System("oracle", "DualPath with every disk read and KV copy bypassed (zero-I/O bound)", True, True,
                   "dualpath", oracle=True),
        )
    }
)  # fmt: skip
