"""The DRAM pool of the host backend (docs/host-backend.md): the Full Blocks a process's nodes hold in the cluster's
DRAM pool (a Mooncake store's share on each node), in real memory.

The pool's index is the scheduler's (:class:`~dualpath_emu.cluster.kv_cache.KvIndex`); each node's decode engine
tells its data plane what the index placed on it (``put``), dropped from it (``drop``) and what a reading engine takes
from it (``read``), and :class:`DramPool` does it with real bytes: a block is the block files' contents (header and
pattern of its context and index, :meth:`~dualpath_emu.host.storage.BlockStore.contents`), so any block is checked
unaided. A dropped or read block is checked: one missing or wrong is counted (and fails the run). Memory is slots of
one block each in slabs allocated as the pool grows, never more than ``limit_blocks`` (the pool's capacity in Full
Blocks: the index never places more; a put beyond it is an error, not a growth)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = ["DramPool", "DramPoolError"]

SLAB_BYTES: Final = 1 << 20
"""Memory is allocated this much at a time (at least one block)."""

Extents = tuple[tuple[int, int, int], ...]
_Contents = Callable[[int, int, int], npt.NDArray[np.uint8]]


class DramPoolError(ValueError):
    """A put the pool cannot take: a block it holds already, or more blocks than its capacity."""


class DramPool:
    """The blocks one process's nodes hold in the DRAM pool (see the module): ``contents(context, first, count)``
    makes blocks' bytes (``count`` × ``stride``)."""

    def __init__(self, contents: _Contents, stride: int, limit_blocks: int) -> None:
        if stride < 1 or limit_blocks < 0:
            raise DramPoolError(f"a DRAM pool needs a stride >= 1 and a limit >= 0 (got {stride}, {limit_blocks})")
        self._contents = contents
        self.stride: Final = stride
        self.limit_blocks: Final = limit_blocks
        self._per_slab = max(1, SLAB_BYTES // stride)
        self._slabs: list[npt.NDArray[np.uint8]] = []
        self._free: list[int] = []
        self._slots: dict[tuple[int, int, int], int] = {}
        """(node, context, block) -> its slot."""
        self.peak_blocks = 0
        self.put_blocks = 0
        self.dropped_blocks = 0
        self.read_blocks = 0
        """Blocks checked as a reading engine took them."""
        self.mismatched_blocks = 0
        """Blocks dropped or read that were missing or wrong."""

    @property
    def held_blocks(self) -> int:
        return len(self._slots)

    @property
    def memory_bytes(self) -> int:
        """The real memory the pool holds now (its slabs, used or free)."""
        return len(self._slabs) * self._per_slab * self.stride

    def put(self, node: int, extents: Extents) -> None:
        """Node ``node`` now holds these blocks: their bytes go into its memory."""
        for context, first, count in extents:
            if count <= 0:
                continue
            data = self._contents(context, first, count)
            for j in range(count):
                key = (node, context, first + j)
                if key in self._slots:
                    raise DramPoolError(f"node {node} was given block {first + j} of context {context} again, "
                                        "which its DRAM pool holds")  # fmt: skip
                if len(self._slots) >= self.limit_blocks:
                    raise DramPoolError(f"the DRAM pool's {self.limit_blocks} blocks are all held: node {node} was "
                                        f"given block {first + j} of context {context} beyond its capacity")  # fmt: skip
                slot = self._slot()
                self._slots[key] = slot
                self._row(slot)[:] = data[j]
            self.put_blocks += count
        self.peak_blocks = max(self.peak_blocks, len(self._slots))

    def drop(self, node: int, extents: Extents) -> int:
        """Node ``node`` no longer holds these blocks: each is checked, then its memory freed; how many were missing
        or wrong."""
        bad = self._check(node, extents, free=True)
        self.dropped_blocks += sum(max(0, count) for _, _, count in extents)
        return bad

    def missing(self, node: int, extents: Extents) -> int:
        """How many of these blocks node ``node`` does not hold (yet)."""
        return sum(
            (node, context, first + j) not in self._slots for context, first, count in extents for j in range(count)
        )

    def read(self, node: int, extents: Extents) -> int:
        """A reading engine takes these blocks from node ``node``: each is checked; how many were missing or wrong."""
        self.read_blocks += sum(max(0, count) for _, _, count in extents)
        return self._check(node, extents, free=False)

    def stats(self) -> dict[str, int]:
        return {
            "held_blocks": len(self._slots), "peak_blocks": self.peak_blocks, "put_blocks": self.put_blocks,
            "dropped_blocks": self.dropped_blocks, "read_blocks": self.read_blocks,
            "mismatched_blocks": self.mismatched_blocks, "peak_memory_bytes": self.memory_bytes, "stride": self.stride,
        }  # fmt: skip

    def _check(self, node: int, extents: Extents, free: bool) -> int:
        bad = 0
        for context, first, count in extents:
            if count <= 0:
                continue
            expected = self._contents(context, first, count)
            for j in range(count):
                slot = (self._slots.pop if free else self._slots.get)((node, context, first + j), None)
                if slot is None:
                    bad += 1
                    continue
                if not np.array_equal(self._row(slot), expected[j]):
                    bad += 1
                if free:
                    self._free.append(slot)
        self.mismatched_blocks += bad
        return bad

    def _slot(self) -> int:
        if not self._free:
            base = len(self._slabs) * self._per_slab
            self._slabs.append(np.zeros((self._per_slab, self.stride), dtype=np.uint8))
            self._free.extend(range(base + self._per_slab - 1, base - 1, -1))  # the lowest slot first
        return self._free.pop()

    def _row(self, slot: int) -> npt.NDArray[np.uint8]:
        slab, index = divmod(slot, self._per_slab)
        row: npt.NDArray[np.uint8] = self._slabs[slab][index]
        return row
