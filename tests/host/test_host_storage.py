"""The host backend's block storage (:mod:`dualpath_emu.host.storage`): real files, O_DIRECT, verified reads.

Coroutines are driven with ``asyncio.run`` (no pytest-asyncio). Files live under ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import errno
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dualpath_emu.host.storage import ALIGN, BlockStore, HostStorageError, IoResult

pytestmark = pytest.mark.host

KIB = 1024


def _flip(path: Path, offset: int) -> None:
    """Flip every bit of the byte at ``offset`` of ``path``."""
    with path.open("r+b") as file:
        file.seek(offset)
        value = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([value ^ 0xFF]))


def _zero(path: Path, offset: int, size: int) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        file.write(bytes(size))


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every os.open of a context file: (name, flags)."""
    seen: list[tuple[str, int]] = []
    real_open = os.open

    def spy(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if Path(path).name.startswith("ctx-"):
            seen.append((Path(path).name, flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    return seen


@pytest.mark.parametrize("block_bytes", [1, 100, 4096, 5000, 64 * KIB])
def test_written_blocks_read_back_verified_and_laid_out_as_documented(tmp_path: Path, block_bytes: int) -> None:
    with BlockStore(tmp_path, block_bytes) as store:
        stride = store.stride
        assert (
            store.align in (512, ALIGN) and stride % store.align == 0 and stride - store.align < block_bytes <= stride
        )

        async def go() -> tuple[IoResult, IoResult, IoResult]:
            return await store.write(7, 0, 5), await store.read(7, 0, 5), await store.read(7, 2, 3)

        written, read, part = asyncio.run(go())
        assert (written.bytes, written.blocks, written.verified_blocks) == (5 * stride, 5, 0)
        assert read == IoResult(
            bytes=5 * stride,
            blocks=5,
            verified_blocks=5,
            verified_bytes=5 * stride,
            mismatched_blocks=0,
            retries=0,
            wall_s=read.wall_s,
        )
        assert read.wall_s > 0
        assert (part.verified_blocks, part.verified_bytes, part.mismatched_blocks) == (3, 3 * stride, 0)
        stats = store.stats()
        assert {
            key: stats[key]
            for key in (
                "bytes_read",
                "bytes_written",
                "reads",
                "writes",
                "blocks_read",
                "blocks_written",
                "verified_bytes",
                "mismatched_blocks",
                "retries",
                "seeded_blocks",
                "stride",
                "block_bytes",
            )
        } == {
            "bytes_read": 8 * stride,
            "bytes_written": 5 * stride,
            "reads": 2,
            "writes": 1,
            "blocks_read": 8,
            "blocks_written": 5,
            "verified_bytes": 8 * stride,
            "mismatched_blocks": 0,
            "retries": 0,
            "seeded_blocks": 0,
            "stride": stride,
            "block_bytes": block_bytes,
        }
        assert isinstance(stats["read_wall_s"], float) and isinstance(stats["write_wall_s"], float)
        # The layout: one file per context, block i at i × stride, header first, zeros after block_bytes.
        path = tmp_path / "ctx-00000007.kv"
        assert store.path(7) == path
        data = path.read_bytes()
        assert len(data) == 5 * stride
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        for i in range(5):
            block = data[i * stride : (i + 1) * stride]
            assert block[: min(4, block_bytes)] == b"DPKV"[:block_bytes]
            assert block[block_bytes:] == bytes(stride - block_bytes)
        if block_bytes >= 32:  # a smaller block holds only a prefix of its header
            assert data[:stride] != data[stride : 2 * stride]  # the contents depend on the block


def test_contents_depend_on_context_and_block(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 8 * KIB) as store:
        store.seed(1, 0, 2)
        store.seed(2, 0, 2)
        one, two = store.path(1).read_bytes(), store.path(2).read_bytes()
        assert one[64 : 8 * KIB] != two[64 : 8 * KIB] and one[8 * KIB + 64 :] != one[64 : 8 * KIB]
        # A block copied to the wrong place (another context's) is a mismatch, found at once.
        store.path(2).write_bytes(one)
        result = asyncio.run(store.read(2, 0, 2))
        assert (result.verified_blocks, result.mismatched_blocks, result.retries) == (0, 2, 0)


def test_an_unwritten_block_is_retried_then_mismatched(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 4 * KIB) as store:
        no_file = asyncio.run(store.read(1, 0, 1, wait_s=0.03))
        assert (no_file.verified_blocks, no_file.mismatched_blocks) == (0, 1)
        assert no_file.retries == 6  # sleeps of 1, 2, 4, 8, 8 and 7 ms (a step is at most 8 ms)
        assert no_file.wall_s >= 0.03
        store.seed(1, 0, 2)
        past_end = asyncio.run(store.read(1, 0, 4, wait_s=0.01))
        assert (past_end.verified_blocks, past_end.mismatched_blocks) == (2, 2)
        assert past_end.retries == 2 * 4  # 1, 2, 4 and 3 ms, two blocks each time
        at_once = asyncio.run(store.read(1, 5, 1, wait_s=0))
        assert (at_once.mismatched_blocks, at_once.retries) == (1, 0)
        assert store.stats()["mismatched_blocks"] == 4
        assert store.stats()["retries"] == 14


def test_a_write_landing_during_the_backoff_verifies_with_retries(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 64 * KIB) as reader, BlockStore(tmp_path, 64 * KIB) as writer:

        async def go() -> IoResult:
            read = asyncio.create_task(reader.read(3, 0, 4, wait_s=2.0))
            await asyncio.sleep(0.02)
            await writer.write(3, 0, 4)
            return await read

        result = asyncio.run(go())
        assert (result.verified_blocks, result.mismatched_blocks) == (4, 0)
        assert result.retries > 0
        assert result.wall_s < 1.5


def test_a_wrong_byte_or_header_is_mismatched_at_once(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 60 * KIB) as store:  # stride 60 KiB: no padding
        store.seed(4, 0, 4)
        stride, path = store.stride, store.path(4)
        _flip(path, 1 * stride + 20_000)  # the pattern of block 1
        _flip(path, 2 * stride + 5)  # the header of block 2 (its version)
        result = asyncio.run(store.read(4, 0, 4, wait_s=2.0))
        assert (result.verified_blocks, result.mismatched_blocks, result.retries) == (2, 2, 0)
        assert result.wall_s < 1.0
    with BlockStore(tmp_path, 5000) as padded:  # stride 5,120 (or 8,192) bytes: zeros from byte 5000
        padded.seed(5, 0, 1)
        _flip(padded.path(5), 5050)
        result = asyncio.run(padded.read(5, 0, 1, wait_s=2.0))
        assert (result.mismatched_blocks, result.retries) == (1, 0)


def test_a_page_of_zeros_looks_like_a_write_in_flight(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 16 * KIB) as store:
        store.seed(6, 0, 2)
        _zero(store.path(6), store.stride + ALIGN, ALIGN)  # the second page of block 1, not yet written
        result = asyncio.run(store.read(6, 0, 2, wait_s=0.02))
        assert (result.verified_blocks, result.mismatched_blocks) == (1, 1)
        assert result.retries > 0
        store.seed(6, 1, 1)  # the write-back lands
        assert asyncio.run(store.read(6, 0, 2)).verified_blocks == 2


def test_o_direct_is_used_where_the_file_system_allows_it(tmp_path: Path, opens: list[tuple[str, int]]) -> None:
    o_direct = getattr(os, "O_DIRECT", 0)
    with BlockStore(tmp_path, 8 * KIB) as store:
        direct = store.stats()["direct_io"]
        assert isinstance(direct, bool) and direct is store.direct_io
        result = asyncio.run(store.write(1, 0, 3))
        result = asyncio.run(store.read(1, 0, 3))  # with O_DIRECT, an unaligned buffer or size would fail
        assert result.verified_blocks == 3
    assert len(opens) == 2
    if direct:
        assert store.stats()["direct_io_reason"] == ""
        assert all(flags & o_direct for _, flags in opens)
    else:
        assert store.stats()["direct_io_reason"] != ""
        assert not any(flags & o_direct for _, flags in opens)
    opens.clear()
    with BlockStore(tmp_path, 8 * KIB, direct=False) as buffered:
        assert buffered.direct_io is False
        assert "direct=False" in str(buffered.stats()["direct_io_reason"])
        assert asyncio.run(buffered.read(1, 0, 3)).verified_blocks == 3
        asyncio.run(buffered.write(2, 0, 1))
    assert opens and not any(flags & o_direct for _, flags in opens)


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    path = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="dualpath-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_tmpfs_falls_back_to_buffered_io_or_takes_o_direct(shm_dir: Path) -> None:
    with BlockStore(shm_dir, 8 * KIB) as store:
        assert asyncio.run(store.read(1, 0, 1, wait_s=0)).mismatched_blocks == 1
        store.seed(1, 0, 1)
        assert asyncio.run(store.read(1, 0, 1)).verified_blocks == 1
        direct, reason = store.direct_io, store.direct_io_reason
    if direct:  # tmpfs accepts O_DIRECT since Linux 6.6 (into its page cache)
        assert reason == ""
        BlockStore(shm_dir, 8 * KIB, direct=True).close()
    else:
        assert "O_DIRECT" in reason
        with pytest.raises(HostStorageError, match="direct=True"):
            BlockStore(shm_dir, 8 * KIB, direct=True)


@pytest.mark.parametrize("refused_at", ["open", "first I/O"])
def test_a_file_system_refusing_o_direct_falls_back_or_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused_at: str
) -> None:
    """As tmpfs before Linux 6.6 (EINVAL on open) and some FUSE file systems (EINVAL on the first I/O)."""
    o_direct = getattr(os, "O_DIRECT", 0)
    if not o_direct:
        pytest.skip("no O_DIRECT here")
    real_open, real_pwrite = os.open, os.pwrite
    direct_fds: set[int] = set()

    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & o_direct and refused_at == "open":
            raise OSError(errno.EINVAL, "Invalid argument")
        fd = real_open(path, flags, *args, **kwargs)
        if flags & o_direct:
            direct_fds.add(fd)
        return fd

    def fake_pwrite(fd: int, data: Any, offset: int) -> int:
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "pwrite", fake_pwrite)
    with BlockStore(tmp_path, 8 * KIB) as store:
        assert store.direct_io is False
        assert f"EINVAL on {'open' if refused_at == 'open' else 'the first I/O'}" in store.direct_io_reason
        assert store.stats()["direct_io_reason"] == store.direct_io_reason
        asyncio.run(store.write(1, 0, 2))  # buffered now
        assert asyncio.run(store.read(1, 0, 2)).verified_blocks == 2
    with pytest.raises(HostStorageError, match="direct=True, but the file system refuses O_DIRECT"):
        BlockStore(tmp_path, 8 * KIB, direct=True)
    assert [p.name for p in tmp_path.iterdir()] == ["ctx-00000001.kv"]  # no probe file left behind


def test_two_stores_on_one_root_see_each_others_blocks(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 32 * KIB) as one, BlockStore(tmp_path, 32 * KIB, threads=2) as two:

        async def go() -> tuple[IoResult, IoResult]:
            await one.write(1, 0, 3)
            await two.write(2, 0, 2)
            await two.write(1, 3, 2)  # the next blocks of one's context
            return await two.read(1, 0, 5), await one.read(2, 0, 2)

        five, two_blocks = asyncio.run(go())
        assert five.verified_blocks == 5 and two_blocks.verified_blocks == 2
        assert two.remove_all() == 2
        assert asyncio.run(one.read(1, 0, 1, wait_s=0)).mismatched_blocks == 1


def _write_in_child(root: str, block_bytes: int, context: int, n_blocks: int) -> None:
    """A second process (a node) writing back blocks into the shared root."""
    time.sleep(0.05)
    with BlockStore(Path(root), block_bytes) as store:
        asyncio.run(store.write(context, 0, n_blocks))


@pytest.mark.processes
def test_a_second_process_writes_blocks_that_this_one_reads(tmp_path: Path) -> None:
    child = multiprocessing.get_context("spawn").Process(target=_write_in_child, args=(str(tmp_path), 48 * KIB, 9, 6))
    with BlockStore(tmp_path, 48 * KIB) as store:
        child.start()
        try:
            result = asyncio.run(store.read(9, 0, 6, wait_s=10.0))  # waits for the child's write
        finally:
            child.join(timeout=10)
        assert child.exitcode == 0
        assert (result.verified_blocks, result.mismatched_blocks) == (6, 0)
        assert result.retries > 0
        assert asyncio.run(store.read(9, 0, 6)).retries == 0


def test_many_concurrent_reads_and_writes_all_verify(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 64 * KIB, threads=4) as store:

        async def go() -> list[IoResult]:
            writes = [store.write(context, 0, 4) for context in range(32)]
            reads = [store.read(context, 0, 4, wait_s=5.0) for context in range(32)]
            return await asyncio.gather(*writes, *reads)

        results = asyncio.run(go())
        assert len(results) == 64
        assert all(r.verified_blocks == 4 and r.mismatched_blocks == 0 for r in results[32:])

        async def again() -> list[IoResult]:
            return await asyncio.gather(*(store.read(i % 32, i % 3, 2) for i in range(64)))

        assert all(r.verified_blocks == 2 for r in asyncio.run(again()))
        stats = store.stats()
        assert (stats["writes"], stats["reads"], stats["mismatched_blocks"]) == (32, 96, 0)
        assert stats["verified_bytes"] == (32 * 4 + 64 * 2) * store.stride


def test_a_large_block_run_is_split_into_chunks(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 3 * 1024 * KIB, threads=2) as store:  # 2 blocks a chunk (8 MiB)
        written = asyncio.run(store.write(1, 0, 5))
        assert store.path(1).stat().st_size == 5 * store.stride == written.bytes
        assert asyncio.run(store.read(1, 0, 5)).verified_blocks == 5


def test_seed_writes_synchronously_and_is_counted_apart(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 4 * KIB) as store:
        seeded = store.seed(5, 10, 3)
        assert (seeded.bytes, seeded.blocks) == (3 * ALIGN, 3)
        stats = store.stats()
        assert (stats["seeded_blocks"], stats["blocks_written"], stats["writes"]) == (3, 0, 0)
        assert asyncio.run(store.read(5, 10, 3)).verified_blocks == 3


def test_remove_all_deletes_the_context_files_only(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with BlockStore(tmp_path, 4 * KIB) as store:
        for context in (0, 1, 123_456_789):
            store.seed(context, 0, 1)
        assert sorted(p.name for p in tmp_path.glob("ctx-*.kv")) == [
            "ctx-00000000.kv",
            "ctx-00000001.kv",
            "ctx-123456789.kv",
        ]
    assert store.remove_all() == 3  # after close too
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert store.remove_all() == 0


def test_a_closed_store_refuses_io(tmp_path: Path) -> None:
    store = BlockStore(tmp_path, 4 * KIB)
    store.close()
    store.close()
    with pytest.raises(HostStorageError, match="closed"):
        asyncio.run(store.read(0, 0, 1))
    with pytest.raises(HostStorageError, match="closed"):
        store.seed(0, 0, 1)


def _store(tmp: Path) -> BlockStore:
    return BlockStore(tmp, 4 * KIB)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda t: BlockStore(t, 0), "block_bytes"),
        (lambda t: BlockStore(t, 4.0), "block_bytes"),  # type: ignore[arg-type]
        (lambda t: BlockStore(t, 4096, threads=0), "threads"),
        (lambda t: BlockStore(t, 4096, direct=1), "direct"),  # type: ignore[arg-type]
        (lambda t: _store(t).seed(-1, 0, 1), "context"),
        (lambda t: _store(t).seed(0, -1, 1), "first_block"),
        (lambda t: _store(t).seed(0, 0, 0), "n_blocks"),
        (lambda t: _store(t).seed(0, True, 1), "first_block"),
        (lambda t: _store(t).seed(2**63, 0, 1), "context"),
        (lambda t: asyncio.run(_store(t).write(0, 0, -3)), "n_blocks"),
        (lambda t: asyncio.run(_store(t).read(0, 0, 0)), "n_blocks"),
        (lambda t: asyncio.run(_store(t).read(0, 0, 1, wait_s=-1)), "wait_s"),
        (lambda t: asyncio.run(_store(t).read(0, 0, 1, wait_s=float("nan"))), "wait_s"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(tmp_path: Path, call: Callable[[Path], object], name: str) -> None:
    with pytest.raises(HostStorageError, match=name) as caught:
        call(tmp_path)
    assert isinstance(caught.value, ValueError)


def test_a_root_that_is_not_a_writable_directory_is_refused(tmp_path: Path) -> None:
    missing, a_file = tmp_path / "missing", tmp_path / "file"
    a_file.write_text("")
    for root in (missing, a_file):
        with pytest.raises(HostStorageError, match=str(root)):
            BlockStore(root, 4096)
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(HostStorageError, match="not a writable directory"):
            BlockStore(locked, 4096)


def test_os_errors_surface_naming_the_file_and_operation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with BlockStore(tmp_path, 4 * KIB) as store:
        store.path(1).mkdir()  # the context's file cannot be opened
        with pytest.raises(HostStorageError, match=r"write .*ctx-00000001\.kv") as caught:
            asyncio.run(store.write(1, 0, 1))
        assert isinstance(caught.value.__cause__, OSError)
        with pytest.raises(HostStorageError, match=r"read .*ctx-00000001\.kv"):
            asyncio.run(store.read(1, 0, 1))

        def full(*args: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "pwritev", full)
        with pytest.raises(HostStorageError, match=r"write .*ctx-00000002\.kv \(blocks 0\.\.1\): No space"):
            asyncio.run(store.write(2, 0, 2))
        with pytest.raises(HostStorageError, match="No space"):
            store.seed(2, 0, 1)
        assert store.stats()["writes"] == 0


def test_a_read_of_blocks_this_store_is_still_writing_waits_for_the_write(tmp_path: Path) -> None:
    # One process's read of its own write-back in flight waits for the write (no polling, no retry); another
    # store's (another process's) read of the same polls the file until the blocks are there.
    with BlockStore(tmp_path, 64 * KIB) as store:

        async def go() -> IoResult:
            write = asyncio.ensure_future(store.write(3, 0, 32))
            await asyncio.sleep(0)  # the write has begun
            read = await store.read(3, 0, 32, wait_s=0.0)
            await write
            return read

        result = asyncio.run(go())
        assert (result.verified_blocks, result.mismatched_blocks, result.retries) == (32, 0, 0)
        assert store._writing == {}


def test_discarding_a_contexts_tail_cuts_its_file_and_keeps_its_head(tmp_path: Path) -> None:
    # A bounded store evicted blocks 4-9 of context 3: its file keeps blocks 0-3, which still read back verified.
    with BlockStore(tmp_path, 8 * KIB) as store:
        asyncio.run(store.write(3, 0, 10))
        assert store.discard([(3, 4, 6), (7, 0, 2)]) == 6  # context 7 was never written: nothing to cut
        assert store.path(3).stat().st_size == 4 * store.stride
        head = asyncio.run(store.read(3, 0, 4))
        assert (head.verified_blocks, head.mismatched_blocks) == (4, 0)
        assert store.discard([(3, 4, 1)]) == 0  # already gone
        assert store.stats()["discarded_blocks"] == 6
        with pytest.raises(HostStorageError, match="n_blocks"):
            store.discard([(3, 1, 0)])
