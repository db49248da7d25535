"""What every engine group shares: the pull of work from the scheduler (:class:`EngineGroup`), the MoE
all-to-all volume that crosses the network, and waiting on the data plane without a task."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from dualpath_emu.cluster.catalog import ModelSpec
from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.messages import Fetch
from dualpath_emu.runtime.actors import Actor, ActorSystem
from dualpath_emu.runtime.core_work import Extents

__all__ = ["NS", "EngineGroup", "guarded", "hit_extents", "inter_node_a2a_bytes"]

NS = 1_000_000_000

def hit_extents(context: int, hit: int) -> Extents:
    """The Full Blocks of a hit of ``hit`` tokens of ``context``: its whole blocks (a hit that is not block
    aligned ends in part of a block that was never written back: reads of it only move modelled bytes)."""
    blocks = hit // BLOCK_TOKENS
    return ((context, 0, blocks),) if blocks else ()


class EngineGroup(Actor):
    """An engine group's leader: pulls work from the scheduler at most once per fetch period (§6.1), through
    the standing :class:`Fetch` it sends when it starts."""

    def __init__(self, system: ActorSystem, name: str, cluster: Cluster, nodes: Sequence[int]) -> None:
        super().__init__(system, name)
        self.cluster = cluster
        self.nodes = list(nodes)
        self.fail_run = functools.partial(system.fail, self)
        """Fail the run with an error (of a read or copy the core refused)."""

    def start(self) -> None:
        super().start()
        self.tell("scheduler", Fetch(tuple(self.nodes), round(self.cluster.config.fetch_period_s * NS)))


def guarded(actor: Actor, callback: Callable[[], None]) -> Callable[[], None]:
    """``callback`` for the loop to call when a read or copy is done: an error in it fails the run (the
    loop would only log it)."""

    def done() -> None:
        try:
            callback()
        except Exception as error:
            actor.system.fail(actor, error)

    return done


def inter_node_a2a_bytes(model: ModelSpec, nodes: int) -> float:
    """MoE dispatch + combine bytes per token per layer (averaged over all layers) that cross the compute
    network, for an EP group spread over ``nodes`` nodes.

    As DeepEP does, a token goes once to each *remote node* that hosts one of its ``k`` experts and is spread
    within the node over NVLink (which no port models); the combine comes back the same way. With experts
    evenly over the nodes, a token reaches on average ``(nodes - 1) × (1 - (1 - 1/nodes)^k)`` remote nodes
    [derived]. One node: no network traffic at all."""
    k = model.activated_experts
    if nodes <= 1 or k == 0:
        return 0.0
    per_expert = (model.a2a_dispatch_bytes_per_token_layer + model.a2a_combine_bytes_per_token_layer) / k
    remote_nodes = (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** k)
    return per_expert * remote_nodes * model.moe_layers / model.layers
