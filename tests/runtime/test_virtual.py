"""Data planes are complete substitutes, chosen by name (``runtime/virtual.py``'s ``PLANES``): a plane written
here alone runs the whole cluster, with no change elsewhere -- one that records every call and forwards it to
the core (the same run, event for event), and one that moves every storage I/O itself, as the host backend
does, through the core's external work (``Core.set_external``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from dualpath_emu._core import Core
from dualpath_emu.cluster.config import BLOCK_TOKENS, derived
from dualpath_emu.cluster.run import run_system
from dualpath_emu.runtime.engine import DecodeReport, Extents, Hop, Then
from dualpath_emu.runtime.virtual import PLANES, CoreDataPlane
from tests.cluster.test_cluster import small_config, trajectories


class LoggingPlane:
    """Every call the engines make, counted by name, then done by the in-process core."""

    def __init__(self, core: Core, dispatch: Callable[[Then], None]) -> None:
        self.inner = CoreDataPlane(core, dispatch)
        self.calls: Counter[str] = Counter()
        LoggingPlane.last = self

    last: LoggingPlane

    def transfer(self, path: tuple[int, ...], lane: int, size_bytes: int, then: Then | None) -> None:
        self.calls["transfer"] += 1
        self.inner.transfer(path, lane, size_bytes, then)

    def io(self, storage_node: int, kind: str, lane: int, size_bytes: int, extents: Extents, then: Then | None) -> None:
        self.calls[kind] += 1
        self.inner.io(storage_node, kind, lane, size_bytes, extents, then)

    def forward(self, n_layers: int, ranks: Sequence[tuple[Hop | None, int, Hop | None]], ffn_ns: int,
                collectives: Sequence[Hop], then: Then) -> None:  # fmt: skip
        self.calls["forward"] += 1
        self.inner.forward(n_layers, ranks, ffn_ns, collectives, then)

    def timer(self, at_ns: int, then: Then) -> None:
        self.calls["timer"] += 1
        self.inner.timer(at_ns, then)

    def clock_ns(self) -> int:
        return self.inner.clock_ns()

    def set_port_factor(self, port: int, factor: float) -> None:
        self.calls["set_port_factor"] += 1
        self.inner.set_port_factor(port, factor)

    def set_port_latency(self, port: int, extra_ns: int) -> None:
        self.calls["set_port_latency"] += 1
        self.inner.set_port_latency(port, extra_ns)

    def decode_node(self, report: DecodeReport, **spec: Any) -> int:
        self.calls["decode_node"] += 1
        return self.inner.decode_node(report, **spec)

    def decode_join(
        self, node: int, gpu: int, rid: int, prompt: int, gen: int, produced: int, stored_blocks: int, context: int
    ) -> None:
        self.calls["decode_join"] += 1
        self.inner.decode_join(node, gpu, rid, prompt, gen, produced, stored_blocks, context)

    def decode_bytes(self, node: int) -> dict[str, Any] | None:
        return self.inner.decode_bytes(node)

    def decode_reset(self, node: int) -> None:
        self.calls["decode_reset"] += 1
        self.inner.decode_reset(node)

    def discard(self, extents: Extents) -> None:
        self.calls["discard"] += 1
        self.inner.discard(extents)

    def pool(self, node: int, op: str, extents: Extents) -> None:
        self.calls["pool"] += 1
        self.inner.pool(node, op, extents)

    def flush(self) -> None:
        self.inner.flush()

    def deliver(self, completions: list[tuple[str, int, int, int, int, int]]) -> None:
        self.inner.deliver(completions)

    @property
    def waiting(self) -> int:
        return self.inner.waiting


class StoragePlane(CoreDataPlane):
    """The core's plane, but every storage I/O is the plane's own to move (``Core.set_external``), as on the
    host backend: the core hands it out after its storage node's queue and latency, with the blocks it names,
    and the plane moves it -- here as a plain transfer along its storage path -- then says it ended."""

    moved: list[tuple[str, int, list[tuple[int, int, int]]]] = []
    """``(kind, size_bytes, extents)`` of every I/O handed out, in order (of the last run)."""

    def __init__(self, core: Core, dispatch: Callable[[Then], None]) -> None:
        super().__init__(core, dispatch)
        core.set_external([], list(range(core.storage_node_count)))
        self.moving: dict[int, int] = {}
        """The tag of each transfer moving an I/O -> the I/O's id in the core."""
        StoragePlane.moved = []

    def io(self, storage_node: int, kind: str, lane: int, size_bytes: int, extents: Extents, then: Then | None) -> None:
        self.flush()  # what came before, in order (the extents ride with the I/O)
        self.core.submit_ios([(storage_node, kind, lane, size_bytes, self._tag(then), extents)])

    def deliver(self, completions: list[tuple[str, int, int, int, int, int]]) -> None:
        rest, ended = [], []
        for completion in completions:
            if completion[0] == "external":
                continue
            ident = self.moving.pop(completion[1], None)
            if ident is None:
                rest.append(completion)
            else:
                ended.append(ident)
        for ident, kind, path, lane, size, _node, extents, _start in self.core.take_external():
            StoragePlane.moved.append((kind, size, extents))
            tag, self._next_tag = self._next_tag, self._next_tag + 1
            self.moving[tag] = ident
            self.core.submit_transfers([(path, lane, size, tag)])
        if ended:
            self.core.complete_externals(ended)
            rest += self.core.take_completions()
        super().deliver(rest)


def test_a_plane_written_here_alone_runs_the_whole_cluster_event_for_event() -> None:
    config, work = small_config(), trajectories()
    plain = run_system(config, "dualpath", work)
    logged = run_system(config, "dualpath", work, plane="logging", planes={**PLANES, "logging": LoggingPlane})
    assert logged.event_log_sha256 == plain.event_log_sha256 and logged.jct_s == plain.jct_s
    calls = LoggingPlane.last.calls
    # Every operation the engines use went through it, the decode GPUs' stepping included.
    assert {"transfer", "read", "forward", "timer", "decode_node", "decode_join"} <= set(calls), calls
    assert calls["decode_join"] >= plain.turns // 2


def test_a_plane_that_moves_storage_io_itself_gets_each_one_with_its_blocks() -> None:
    config, work = small_config(), trajectories()
    plain = run_system(config, "dualpath", work)
    result = run_system(config, "dualpath", work, plane="storage", planes={"storage": StoragePlane})
    # Every request ended once and every byte is accounted (run_system checks), in the model's times.
    assert result.metrics.turns_done == result.turns == plain.turns
    assert result.jct_s == pytest.approx(plain.jct_s, rel=1e-6)
    kinds = Counter(kind for kind, _, _ in StoragePlane.moved)
    assert kinds["read"] > 0 and kinds["write"] > 0  # the engines' reads, the decode GPUs' write-backs
    kv_block = BLOCK_TOKENS * derived(config).kv_bytes_per_token
    for kind, size, extents in StoragePlane.moved:
        if kind == "write":  # a write-back names exactly the Full Blocks it writes
            assert extents and sum(n for _, _, n in extents) * kv_block == size
