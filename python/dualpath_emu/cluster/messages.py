"""The messages the cluster's engines exchange, and the flow of one turn through them (paper §4, §6).

The engines share no Python objects: everything one needs from another comes in these messages, so each can
live in its own process. One turn:

1. client → scheduler: :class:`Submit`.
2. Groups *pull* (§6.1) with a standing :class:`Fetch`, served whenever there is work, at most once per
   period. A prefill fetch runs Algorithm 1; the requests assigned are routed to a decode group (§6.2),
   whose fetch assigns DEs and read sides (§6.3): :class:`Prefill` to the prefill group, :class:`Expect` to
   the decode group.
3. The reading side reads the hit KV from storage into its DRAM buffer; a DE-side read then tells the prefill
   group :class:`HitReady`. Either side tells the scheduler :class:`ReadDone`.
4. The prefill group batches ready requests per GPU under the attention quota (§6.4) and runs one forward
   pass over its GPUs; a request whose last chunk is done has its first token: :class:`KvReady` to the
   decode group, :class:`PrefillDone` to the scheduler.
5. The decode group copies the prompt KV into HBM and decodes it, persisting every completed block; at its
   last token :class:`DecodeDone` to the scheduler and :class:`TurnDone` to the client, which submits the
   agent's next turn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from dualpath_emu.messages import Message, MessageRegistry

__all__ = [
    "Crash", "DecodeDone", "DecodeTask", "Drop", "Expect", "Lost", "Restart", "TurnFailed", "TurnsEnded", "WhichEnded", "PoolChange", "Fetch", "HitReady", "KvReady", "Prefill", "PrefillDone", "PrefillTask",
    "ReadDone", "Start", "Submit", "Turn", "TurnDone", "cluster_registry",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Turn(Message):
    """One agent turn: request ``rid`` of ``prompt`` tokens (``hit`` of them its ``context``'s so far), ``gen`` out;
    ``last``: its agent's last (its context is not needed again)."""

    rid: int
    prompt: int
    hit: int
    gen: int
    context: int
    last: bool = False


@dataclass(frozen=True, slots=True)
class Submit(Message):
    """New turns, in arrival order (those the client submits at one instant travel together)."""

    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Fetch(Message):
    """A group's standing pull: work for each of its ``nodes`` whenever there is some, at most once per period."""

    nodes: tuple[int, ...]
    period_ns: int


@dataclass(frozen=True, slots=True)
class PrefillTask(Message):
    """Compute request ``rid`` on PE GPU ``pe_gpu`` of ``pe_node``; its KV goes to ``de_node``/``de_gpu``."""

    rid: int
    prompt: int
    hit: int
    gen: int
    pe_node: int
    pe_gpu: int
    de_node: int
    de_gpu: int
    read_on_de: bool
    context: int
    pooled: tuple[int, ...] = ()
    """Where the DRAM pool holds the hit's start: ``node, tokens`` pairs, flat (:attr:`Request.pooled`)."""
    kept: bool = False
    """The hit is in the DE's HBM, kept from the context's last turn: the PE loads it from there, nothing is read."""
    de_part: int = 0
    """A split read (:class:`~dualpath_emu.cluster.policies.Split`, ``read_on_de`` False): the hit's last ``de_part``
    tokens are read on the decode side and loaded from its buffer, the rest here (0: the hit is read whole)."""


@dataclass(frozen=True, slots=True)
class Prefill(Message):
    """To a prefill group: the tasks one decode fetch assigned to its GPUs, in assignment order."""

    tasks: tuple[PrefillTask, ...]


@dataclass(frozen=True, slots=True)
class DecodeTask(Message):
    """Request ``rid`` decodes on ``de_gpu`` of ``de_node``, its hit KV read there if ``read_on_de``."""

    rid: int
    prompt: int
    hit: int
    gen: int
    de_node: int
    de_gpu: int
    pe_node: int
    read_on_de: bool
    context: int
    pooled: tuple[int, ...] = ()
    """As :attr:`PrefillTask.pooled`."""
    kept: bool = False
    """As :attr:`PrefillTask.kept`: the DE's buffer and H2D carry the new tokens' KV only."""
    de_part: int = 0
    """As :attr:`PrefillTask.de_part`: the hit's last tokens this node reads."""


@dataclass(frozen=True, slots=True)
class Expect(Message):
    """To a decode group: the tasks one decode fetch assigned to its GPUs, in assignment order."""

    tasks: tuple[DecodeTask, ...]


@dataclass(frozen=True, slots=True)
class HitReady(Message):
    """To a prefill group: the DE buffer for ``rid`` is held (``read`` False) or holds the hit KV it read (True)."""

    rid: int
    read: bool


@dataclass(frozen=True, slots=True)
class ReadHere(Message):
    """The sender's storage NIC went down before the hit was read there: read it on your side (failover)."""

    rid: int
    started: bool


@dataclass(frozen=True, slots=True)
class ReadMoved(Message):
    """To the scheduler: a read of ``tokens`` moved from node ``from_node``'s queue to ``to_node``'s."""

    from_node: int
    to_node: int
    tokens: int


@dataclass(frozen=True, slots=True)
class ReadDone(Message):
    """To the scheduler: a read of ``tokens`` on ``node`` ended (its read queue shrinks)."""

    node: int
    tokens: int


@dataclass(frozen=True, slots=True)
class KvReady(Message):
    """To a decode group: these requests' prompt KV is in its DE buffer, their first token at ``first_token_ns``."""

    rids: tuple[int, ...]
    first_token_ns: int


@dataclass(frozen=True, slots=True)
class PrefillDone(Message):
    """To the scheduler: these requests left their PEs (one forward pass)."""

    rids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DecodeDone(Message):
    """To the scheduler: these requests left their DEs at ``done_ns``, with their :class:`TurnDone`'s content."""

    rids: tuple[int, ...]
    first_token_ns: tuple[int, ...] = ()
    second_token_ns: tuple[int, ...] = ()
    done_ns: int = -1


@dataclass(frozen=True, slots=True)
class TurnDone(Message):
    """To the client: these turns are done at ``done_ns``, with their first and second tokens' times (-1: none)."""

    rids: tuple[int, ...]
    first_token_ns: tuple[int, ...]
    second_token_ns: tuple[int, ...]
    done_ns: int


@dataclass(frozen=True, slots=True)
class Health(Message):
    """From the fault injector: what faults leave of port ``ports[i]``'s rates, ``factors[i]`` (0: down)."""

    ports: tuple[str, ...]
    factors: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Crash(Message):
    """To an engine group, from the fault injector: you crash now (HBM and DRAM state gone) until :class:`Restart`."""


@dataclass(frozen=True, slots=True)
class Restart(Message):
    """To a crashed engine group, from the fault injector: you are back, empty; fetch work again."""


@dataclass(frozen=True, slots=True)
class Lost(Message):
    """To the scheduler: these requests are no longer here, ``why`` (``"crash"``, ``"down"``, ``"dropped"``, ``"dropped
    from"``, ``"timeout"``, ``"restarted"``); ``read_nodes``/``read_tokens``: reads that will never end."""

    rids: tuple[int, ...]
    why: str
    read_nodes: tuple[int, ...] = ()
    read_tokens: tuple[int, ...] = ()
    kept: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Drop(Message):
    """To an engine group: forget these requests (their other engine crashed); answer :class:`Lost`."""

    rids: tuple[int, ...]
    from_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolChange(Message):
    """To a decode group, from the DRAM pool's index: its node's DRAM now holds the Full Blocks ``put``, no longer
    holds those in ``drop``, and writes those in ``write`` to storage (a pool that writes back: dirty blocks it
    drops or has no room for). Each a flat run of ``(context, first block, blocks)`` triples."""

    put: tuple[int, ...] = ()
    drop: tuple[int, ...] = ()
    write: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class WhichEnded(Message):
    """To the client, when a decode group's process restarted: which of these turns have you ended?"""

    rids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TurnsEnded(Message):
    """To the scheduler, from the client: of the turns ``asked`` (a :class:`WhichEnded`), these had ended."""

    asked: tuple[int, ...]
    ended: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TurnFailed(Message):
    """To the client, from the scheduler: these turns end as failed, ``reasons[i]`` why."""

    rids: tuple[int, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Start(Message):
    """To the client (and the fault injector): the run starts."""


_VERSIONS: Final[dict[type[Message], int]] = {
    Turn: 2, Submit: 2, Fetch: 2, PrefillTask: 4, Prefill: 2, DecodeTask: 4, Expect: 2, HitReady: 2, ReadDone: 1,
    KvReady: 3, PrefillDone: 2, DecodeDone: 3, TurnDone: 3, Health: 1, ReadHere: 1, ReadMoved: 1, Start: 1, Crash: 1,
    Restart: 1, Lost: 2, Drop: 2, TurnFailed: 1, WhichEnded: 1, TurnsEnded: 1, PoolChange: 1,
}  # fmt: skip
"""Every cluster message type and its wire version (bump it when its fields change): ``cluster.<name>``."""
for _cls, _version in _VERSIONS.items():
    _cls.WIRE_NAME, _cls.VERSION = f"cluster.{_cls.__name__}", _version


def cluster_registry() -> MessageRegistry:
    """Every message type of the cluster."""
    registry = MessageRegistry()
    for cls in _VERSIONS:
        registry.register(cls)
    return registry
