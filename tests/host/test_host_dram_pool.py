"""The host backend's DRAM pool (:mod:`dualpath_emu.host.dram_pool`): blocks in real memory, the block files' bytes,
checked as they are dropped or read; bounded by the pool's capacity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualpath_emu.host.dram_pool import SLAB_BYTES, DramPool, DramPoolError
from dualpath_emu.host.storage import BlockStore


def test_a_pool_holds_the_block_files_bytes_checks_them_and_frees_what_it_drops(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 1000, threads=1) as store:
        pool = DramPool(store.contents, store.stride, limit_blocks=6)
        pool.put(3, ((7, 0, 4),))  # node 3 holds blocks 0-3 of context 7
        pool.put(4, ((7, 4, 2),))
        assert pool.held_blocks == 6 and pool.missing(3, ((7, 0, 4),)) == 0
        assert pool.missing(4, ((7, 0, 1),)) == 1  # node 4 holds none of blocks 0-3: the pool places by node
        assert pool.read(3, ((7, 1, 3),)) == 0 and pool.read(4, ((7, 4, 2),)) == 0
        # A block's bytes are the files' own: what a write of them would put on disk.
        assert np.array_equal(pool._row(pool._slots[(3, 7, 2)]), store.contents(7, 2, 1)[0])
        with pytest.raises(DramPoolError, match="beyond its capacity"):
            pool.put(3, ((8, 0, 1),))
        with pytest.raises(DramPoolError, match="again"):
            pool.put(3, ((7, 0, 1),))
        pool._row(pool._slots[(3, 7, 3)])[100] ^= 0xFF  # a byte flipped in memory
        assert pool.read(3, ((7, 3, 1),)) == 1
        assert pool.drop(3, ((7, 2, 2),)) == 1 and pool.held_blocks == 4  # checked as it goes, then freed
        assert pool.drop(3, ((7, 2, 1),)) == 1  # not there any more: missing
        pool.put(3, ((8, 0, 2),))  # the room freed is used again, with no new memory
        assert pool.held_blocks == 6 and pool.memory_bytes == SLAB_BYTES // store.stride * store.stride
        stats = pool.stats()
        assert stats["put_blocks"] == 8 and stats["dropped_blocks"] == 3 and stats["mismatched_blocks"] == 3
        assert stats["peak_blocks"] == 6 and stats["read_blocks"] == 6


def test_a_pool_grows_its_memory_a_slab_at_a_time_up_to_its_capacity(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 300_000, threads=1) as store:
        per_slab = max(1, SLAB_BYTES // store.stride)
        pool = DramPool(store.contents, store.stride, limit_blocks=3 * per_slab)
        pool.put(0, ((1, 0, per_slab + 1),))
        assert pool.memory_bytes == 2 * per_slab * store.stride
        assert pool.drop(0, ((1, 0, per_slab + 1),)) == 0 and pool.held_blocks == 0
