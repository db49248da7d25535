"""The systems compared (paper §7.2, §7.5; paper-facts §8.1): one bundle of policies each. Adding a built-in
system is one entry in :data:`SYSTEMS`; a user's is a :class:`System` in the user's own code
(:mod:`dualpath_emu.cluster.user_systems`), passed to :func:`~dualpath_emu.cluster.run.run_system` as the
object: no registry is global."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from dualpath_emu.cluster.policies import POLICIES, Policy

if TYPE_CHECKING:
    from dualpath_emu.cluster.config import ClusterConfig

__all__ = ["NAME_PATTERN", "SYSTEMS", "SYSTEM_COLORS", "System", "built_in", "system_colours", "with_tiers"]

NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
"""What a system's name may be: it keys ``summary.json`` and names files (``trace-<name>.json``)."""


@dataclass(frozen=True)
class System:
    """A named bundle of policies: one row of ``run``'s table; ``scheduler`` a name or a :class:`Policy`."""

    name: str
    description: str
    layerwise: bool
    """Layerwise prefill (§4): per-layer KV streamed into HBM during the pass, not the whole hit first."""
    dual_path: bool  # Reads may go through the decode node (storage → DE buffer → PE); otherwise PE-read only.
    scheduler: str | type[Policy]
    """A built-in policy's name (:data:`~dualpath_emu.cluster.policies.POLICIES`) or a :class:`Policy` subclass."""
    oracle: bool = False  # Disk reads, H2D/D2H and PE→DE transfers bypassed (§7.2): the zero-I/O bound.
    pool: bool = False
    """KV is kept in the nodes' DRAM pool (``[kv.pool]``, docs/kv-cache.md) as well as in storage, and a hit is read
    from the pool where it holds it (SGL(MC)'s Mooncake store, §7.1)."""
    retain: bool = False
    """Decode GPUs keep a context's KV in HBM after its turn while their running requests do not need the room; the
    context's next turn given the same DE loads its hit from there (docs/kv-cache.md). Needs ``layerwise``."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or NAME_PATTERN.fullmatch(self.name) is None:
            raise ValueError(f"System.name: expected 1-64 letters, digits and _.+- (not first), got {self.name!r:.80}")
        if self.retain and not self.layerwise:
            raise ValueError(f"System {self.name!r}: retain needs layerwise (the prefill loads a kept hit layer by "
                             "layer from the decode GPU's HBM)")  # fmt: skip
        scheduler = self.scheduler
        if isinstance(scheduler, type) and issubclass(scheduler, Policy):
            if inspect.isabstract(scheduler):
                missing = ", ".join(sorted(getattr(scheduler, "__abstractmethods__", ())))
                raise ValueError(f"System {self.name!r}: scheduler {scheduler.__name__} is abstract (define {missing})")
        elif not isinstance(scheduler, str) or scheduler not in POLICIES:
            raise ValueError(
                f"System {self.name!r}: scheduler: expected {', '.join(map(repr, POLICIES))} or a Policy subclass, "
                f"got {scheduler!r}"
            )

    def policy(self, alpha_tokens: int, beta_tokens: int) -> Policy:
        """This system's scheduling policy (a fresh one per run)."""
        cls = POLICIES[self.scheduler] if isinstance(self.scheduler, str) else self.scheduler
        return _make_policy(cls, read_both_sides=self.dual_path, alpha_tokens=alpha_tokens, beta_tokens=beta_tokens)


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
            System("sglmc", "SGL(MC): a Mooncake DRAM pool over storage, PE-read only, layerwise, round-robin (§7.1)",
                   True, False, "round_robin", pool=True),
            System("dualpath+retention", "DualPath whose decode GPUs keep a session's KV in HBM across turns, its "
                   "next turn sent there (session affinity)", True, True, "dualpath_affinity", retain=True),
            System("dualpath-split", "DualPath whose long hits are read on both sides at once, split to level the "
                   "read queues (§6.1)", True, True, "dualpath_split"),
        )
    }
)  # fmt: skip


def with_tiers(system: System, config: ClusterConfig) -> System:
    """``system`` as ``config`` runs it: keeping KV in the DRAM pool, or in decode HBM across turns, if the scenario
    names it in ``[kv.pool] systems`` or ``[kv.hbm] systems`` (a ``ValueError`` if it cannot retain)."""
    pool = system.pool or system.name in config.kv_pool.systems
    retain = system.retain or system.name in config.kv_hbm.systems
    if (pool, retain) == (system.pool, system.retain):
        return system
    return dataclasses.replace(system, pool=pool, retain=retain)


def built_in(name: str) -> System:
    """The built-in system called ``name`` (a :class:`KeyError` naming the built-in systems otherwise)."""
    try:
        return SYSTEMS[name]
    except KeyError:
        raise KeyError(f"no built-in system {name!r} (built-in: {', '.join(SYSTEMS)})") from None


def _make_policy(cls: type[Policy], **arguments: Any) -> Policy:
    """``cls(...)`` with those of ``arguments`` that its constructor accepts (all of them with ``**kwargs``)."""
    parameters = inspect.signature(cls).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        accepted = {p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
        arguments = {key: value for key, value in arguments.items() if key in accepted}
    return cls(**arguments)


SYSTEM_COLORS: Final[Mapping[str, str]] = MappingProxyType({
    "basic": "tab:blue",
    "basic+layerwise": "tab:purple",
    "basic+layerwise+dualpath": "tab:orange",
    "dualpath": "tab:red",
    "oracle": "tab:gray",
    "sglmc": "tab:green",
    "dualpath+retention": "tab:brown",
    "dualpath-split": "tab:pink",
})  # fmt: skip
"""The built-in systems' colours in every plot (``run --out``, ``sweep``, ``reproduce``)."""

_OTHER_COLORS: Final = ("tab:pink", "tab:olive", "tab:cyan", "gold", "navy", "teal", "darkviolet", "lime")


def system_colours(names: Iterable[str]) -> dict[str, str]:
    """A colour per system: a built-in one's own; a user's from the rest, by its name's hash, distinct."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        if name in SYSTEM_COLORS:
            out[name] = SYSTEM_COLORS[name]
            taken.add(out[name])
    for name in names:
        if name in out:
            continue
        start = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") % len(_OTHER_COLORS)
        choices = [_OTHER_COLORS[(start + i) % len(_OTHER_COLORS)] for i in range(len(_OTHER_COLORS))]
        out[name] = next((c for c in choices if c not in taken), choices[0])
        taken.add(out[name])
    return out
