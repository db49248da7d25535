"""KV-cache Full Blocks in real files, the 3FS of the host backend (docs/host-backend.md): written and read with
O_DIRECT on a thread pool, every read verified.

A context (one agent's blocks) is one file, ``ctx-{context:08d}.kv``, block *i* at *i* × ``stride`` (``block_bytes``
rounded up to the O_DIRECT unit). A block is a 32-byte header (``DPKV``, version, context, block, block_bytes:
``<4sIQQQ``) then a pattern of (context, block) alone, so any process verifies any block unaided: a misplaced, torn or
stale one fails. O_DIRECT so reads hit the disk, not the page cache (buffered where refused:
``stats()["direct_io_reason"]``); one ``preadv``/``pwritev`` per chunk of up to 8 MiB, in parallel. A block not there
yet (another process's write-back in flight) is re-read with backoff for up to ``wait_s`` (not counted while
``held()``), then counts as mismatched.

A node reaches the storage through its own :class:`StorageView` (a directory descriptor opens are relative to):
:meth:`BlockStore.take_away` swaps it in place for a removed directory's, so its opens fail with a real ``ENOENT`` for
that node alone, and I/O waits until :meth:`BlockStore.give_back` (never an error or a false corruption)."""

from __future__ import annotations

import asyncio
import errno
import math
import mmap
import os
import re
import secrets
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import numpy as np
import numpy.typing as npt

__all__ = [
    "ALIGN",
    "SMALL_ALIGN",
    "BlockStore",
    "HostStorageError",
    "IoResult",
    "StorageView",
    "remove_blocks",
    "run_storage",
]

ALIGN: Final = 4096  # O_DIRECT alignment of buffers, offsets and sizes where the device asks for pages
SMALL_ALIGN: Final = 512
"""The alignment where the device's logical blocks are 512 bytes (most disks; probed)."""
_HEADER: Final = struct.Struct("<4sIQQQ")  # magic, version, context, block, block_bytes: 32 bytes
_MAGIC: Final = b"DPKV"
_VERSION: Final = 1
_WORD_MUL: Final = 0x9E3779B97F4A7C15  # odd: word index × it is a bijection on 64-bit words
_MASK64: Final = (1 << 64) - 1
_MAX_INDEX: Final = (1 << 63) - 1  # contexts, and file offsets (off_t)
_CHUNK_BYTES: Final = 8 << 20  # most bytes in one preadv/pwritev (at least one block)
_FIRST_BACKOFF_S: Final = 0.001
_MAX_BACKOFF_S: Final = 0.008  # The longest sleep between two reads of a block not there yet.
_CTX_FILE: Final = re.compile(r"ctx-\d{8,}\.kv")
_FIRST_REACH_S: Final = 0.001
_MAX_REACH_S: Final = 0.05
"""The longest wait between two tries of a view that is away (a view back wakes its waiters at once)."""

# What a read found in a block.
_OK: Final = 0
_PENDING: Final = 1  # not there yet: re-read
_CORRUPT: Final = 2  # wrong contents: mismatched at once
_UNREACHABLE: Final = 3  # its file could not be opened, its view away: wait for the view, then read again

_Words = npt.NDArray[np.uint64]


class HostStorageError(ValueError):
    """A bad argument or root of a :class:`BlockStore`, a refused O_DIRECT, or an I/O error (file named)."""


@dataclass(frozen=True, slots=True)
class IoResult:
    """What one read, write or seed did: bytes moved and verified (not by a write), and block re-reads."""

    bytes: int
    blocks: int
    verified_blocks: int = 0
    verified_bytes: int = 0
    mismatched_blocks: int = 0
    retries: int = 0
    wall_s: float = 0.0
    unreachable: int = 0  # Opens the kernel failed with ENOENT, the view away (each one waited for it and tried again).
    unreachable_s: float = 0.0  # Seconds spent waiting for the view to come back.


class StorageView:
    """One node's way to the storage: the directory descriptor its I/O opens files relative to."""

    __slots__ = ("_back", "away", "fd", "name")

    def __init__(self, name: str, fd: int) -> None:
        self.name: Final = name
        self.fd: Final = fd
        self.away = False  # Whether it is taken away (every open through it fails with ENOENT).
        self._back: asyncio.Event | None = None

    async def wait_back(self, timeout_s: float) -> None:
        """Return when the view is back, or after ``timeout_s``, whichever comes first."""
        back = self._back
        if not self.away or back is None:
            return
        try:
            await asyncio.wait_for(back.wait(), timeout_s)
        except TimeoutError:
            pass

    def __repr__(self) -> str:
        return f"StorageView({self.name!r}{', away' if self.away else ''})"


def _key(context: int, block: int) -> int:
    """A 64-bit mix of (context, block) (splitmix64's finaliser)."""
    z = (context * 0xBF58476D1CE4E5B9 + block * 0x94D049BB133111EB + _WORD_MUL) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HostStorageError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise HostStorageError(f"{name} must be >= {minimum}, not {value}")
    return value


class _Buffers:
    """Page-aligned anonymous mmap buffers of one size, reused; at most ``keep`` are kept when idle."""

    def __init__(self, size: int, keep: int) -> None:
        self._size = size
        self._keep = keep
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self._closed = False

    def get(self) -> mmap.mmap:
        with self._lock:
            if self._free:
                return self._free.pop()
        return mmap.mmap(-1, self._size)

    def put(self, buffer: mmap.mmap) -> None:
        with self._lock:
            if not self._closed and len(self._free) < self._keep:
                self._free.append(buffer)
                return
        _unmap(buffer)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for buffer in free:
            _unmap(buffer)


def _unmap(buffer: mmap.mmap) -> None:
    try:
        buffer.close()
    except BufferError:  # a view is still alive (e.g. in a traceback): the collector frees it later
        pass


class BlockStore:
    """Full Blocks of KV cache in files under ``root`` (``direct``: O_DIRECT or not; ``threads``: the pool)."""

    def __init__(self, root: Path, block_bytes: int, *, threads: int = 4, direct: bool | None = None) -> None:
        self.block_bytes: Final = _check_int("block_bytes", block_bytes, 1)
        self.threads: Final = _check_int("threads", threads, 1)
        if direct is not None and not isinstance(direct, bool):
            raise HostStorageError(f"direct must be True, False or None, not {direct!r}")
        self.root: Final = Path(root)
        if not self.root.is_dir():
            raise HostStorageError(f"root {self.root}: not a directory")
        self.direct_io, self.direct_io_reason, self.align = self._probe(direct)
        self.stride: Final = -(-block_bytes // self.align) * self.align
        self._flags = getattr(os, "O_DIRECT", 0) if self.direct_io else 0
        self._chunk_blocks = max(1, _CHUNK_BYTES // self.stride)
        self._words = self.stride // 8
        self._base: _Words = np.arange(self._words, dtype=np.uint64) * np.uint64(_WORD_MUL)
        writers = max(1, threads // 2)
        self._buffers = _Buffers(self._chunk_blocks * self.stride, keep=threads + writers)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="blockstore")
        # Writes have threads of their own: a write-back never waits behind a node's reads (a storage NIC's
        # two directions are two ports in the model).
        self._write_pool = ThreadPoolExecutor(max_workers=writers, thread_name_prefix="blockstore-write")
        self._local = threading.local()  # each thread's scratch array of expected contents
        self._lock = threading.Lock()
        counts = ("bytes_read bytes_written reads writes blocks_read blocks_written discarded_blocks verified_bytes "
                  "mismatched_blocks "
                  "retries seeded_blocks read_unreachable write_unreachable read_unreachable_waits "
                  "write_unreachable_waits")  # fmt: skip
        seconds = "read_wall_s write_wall_s read_unreachable_s write_unreachable_s unreachable_max_s"
        self._totals: dict[str, int | float] = {
            **dict.fromkeys(counts.split(), 0),
            **dict.fromkeys(seconds.split(), 0.0),
        }
        self._closed = False
        self._root_fd: int | None = None  # the directory's descriptor, opened with the first view
        self._gone_fd: int | None = None  # a removed directory's, what a view away is
        self._views: list[StorageView] = []
        self._writing: dict[int, list[tuple[int, int, asyncio.Future[None]]]] = {}
        """This store's writes in flight, per context: ``(first block, end, done)``. A read of their blocks waits
        for them here rather than polling the file (a write-back of another process is polled for)."""

    # --- the API --------------------------------------------------------------------------------------------

    def path(self, context: int) -> Path:
        """The file of ``context``."""
        return self.root / f"ctx-{_check_int('context', context, 0):08d}.kv"

    def view(self, name: str) -> StorageView:
        """A new view of the storage (``name``: whose, in errors and stats), ``root`` resolved once."""
        if self._closed:
            raise HostStorageError("the BlockStore is closed")
        if self._root_fd is None:
            try:
                self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as err:
                raise HostStorageError(f"root {self.root}: {err.strerror or err}") from err
        view = StorageView(name, os.dup(self._root_fd))
        self._views.append(view)
        return view

    def take_away(self, view: StorageView) -> None:
        """Make ``view`` unreachable: from now on every open through it fails with ENOENT (see the module)."""
        if view.away:
            return
        if self._gone_fd is None:  # an empty directory, removed: a lookup in it finds nothing, even as root
            folder = tempfile.mkdtemp(prefix="dualpath-emu-gone-")
            try:
                self._gone_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            finally:
                os.rmdir(folder)
        os.dup2(self._gone_fd, view.fd, inheritable=False)
        view.away = True
        view._back = asyncio.Event()

    def give_back(self, view: StorageView) -> None:
        """Make ``view`` reach the storage again; what waits for it tries again at once."""
        if not view.away:
            return
        assert self._root_fd is not None
        os.dup2(self._root_fd, view.fd, inheritable=False)
        view.away = False
        back, view._back = view._back, None
        if back is not None:
            back.set()

    async def reach(self, view: StorageView, context: int, kind: str = "read") -> float:
        """Before an I/O on ``view``: while it is away, try, wait and try again; returns the seconds waited."""
        if kind not in ("read", "write"):
            raise HostStorageError(f"kind must be 'read' or 'write', not {kind!r}")
        if not view.away:
            return 0.0
        _check_int("context", context, 0)
        loop = asyncio.get_running_loop()
        pool = self._pool if kind == "read" else self._write_pool
        start = time.perf_counter()
        tries, delay = 0, _FIRST_REACH_S
        while await loop.run_in_executor(pool, self._unreachable, context, view):
            tries += 1
            await view.wait_back(delay)
            delay = min(2 * delay, _MAX_REACH_S)
        waited = time.perf_counter() - start if tries else 0.0
        self._count_unreachable(kind, tries, waited)
        return waited

    async def write(
        self, context: int, first_block: int, n_blocks: int, *, view: StorageView | None = None
    ) -> IoResult:
        """Write blocks ``first_block`` … ``+ n_blocks - 1`` of ``context`` (through ``view``, waiting while away)."""
        self._check(context, first_block, n_blocks)
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        entry = (first_block, first_block + n_blocks, loop.create_future())
        writing = self._writing.setdefault(context, [])
        writing.append(entry)
        tries, waited = 0, 0.0
        try:
            chunks = list(self._chunks(first_block, n_blocks))
            delay = _FIRST_REACH_S
            while True:
                written = await asyncio.gather(*(loop.run_in_executor(self._write_pool, self._write_chunk, context,
                                                                      first, count, view)
                                                 for first, count in chunks))  # fmt: skip
                chunks = [chunk for chunk, done in zip(chunks, written, strict=True) if not done]
                if not chunks:
                    break
                assert view is not None  # (only a view can be away)
                tries += len(chunks)
                waited += await self._wait_view(view, delay)
                delay = min(2 * delay, _MAX_REACH_S)
        finally:
            entry[2].set_result(None)
            writing.remove(entry)
            if not writing:
                del self._writing[context]
        result = IoResult(bytes=n_blocks * self.stride, blocks=n_blocks, wall_s=time.perf_counter() - start,
                          unreachable=tries, unreachable_s=waited)  # fmt: skip
        self._count(result, "written", "writes", "write_wall_s")
        return result

    async def read(self, context: int, first_block: int, n_blocks: int, *, wait_s: float = 2.0,
                   held: Callable[[], bool] | None = None, view: StorageView | None = None) -> IoResult:  # fmt: skip
        """Read and verify blocks ``first_block`` … ``+ n_blocks - 1`` of ``context`` (re-read for ``wait_s``)."""
        self._check(context, first_block, n_blocks)
        if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not math.isfinite(wait_s) or wait_s < 0:
            raise HostStorageError(f"wait_s must be a finite number >= 0, not {wait_s!r}")
        start = time.perf_counter()
        end = first_block + n_blocks
        overlapping = [
            done for first, stop, done in self._writing.get(context, ()) if first < end and first_block < stop
        ]
        if overlapping:  # written by this store, still in flight: wait for them, then read
            await asyncio.gather(*overlapping)
        verified = mismatched = retries = tries = 0
        pending = list(range(first_block, first_block + n_blocks))
        delay, slept = _FIRST_BACKOFF_S, 0.0
        reach_delay, waited = _FIRST_REACH_S, 0.0
        while True:
            statuses = await self._read_blocks(context, pending, view)
            verified += statuses.count(_OK)
            mismatched += statuses.count(_CORRUPT)
            if _UNREACHABLE in statuses:  # the view is away: wait for it (not counted in wait_s), read them again
                assert view is not None
                tries += statuses.count(_UNREACHABLE)
                pending = [
                    block for block, status in zip(pending, statuses, strict=True) if status in (_PENDING, _UNREACHABLE)
                ]
                waited += await self._wait_view(view, reach_delay)
                reach_delay = min(2 * reach_delay, _MAX_REACH_S)
                continue
            pending = [block for block, status in zip(pending, statuses, strict=True) if status == _PENDING]
            if not pending:
                break
            if held is not None and held():  # write-backs held back by a fault: this wait does not count
                await asyncio.sleep(_MAX_BACKOFF_S)
                retries += len(pending)
                continue
            if slept >= wait_s - 1e-9:  # (the sum of the sleeps, within rounding)
                if gone := self._gone():  # not a block read back wrong: the storage is not there
                    raise HostStorageError(
                        f"read {self.path(context)} (blocks {pending[0]}..{pending[-1]}): not found{gone}"
                    )
                mismatched += len(pending)  # never verified within wait_s
                break
            pause = min(delay, wait_s - slept)
            await asyncio.sleep(pause)
            slept += pause
            delay = min(2 * delay, _MAX_BACKOFF_S)  # a write-back lands within ms: keep looking often
            retries += len(pending)
        result = IoResult(bytes=n_blocks * self.stride, blocks=n_blocks, verified_blocks=verified,
                          verified_bytes=verified * self.stride, mismatched_blocks=mismatched, retries=retries,
                          wall_s=time.perf_counter() - start, unreachable=tries, unreachable_s=waited)  # fmt: skip
        self._count(result, "read", "reads", "read_wall_s")
        return result

    def seed(self, context: int, first_block: int, n_blocks: int) -> IoResult:
        """Write, in the calling thread, blocks a trace says are cached (counted as ``seeded_blocks``)."""
        self._check(context, first_block, n_blocks)
        start = time.perf_counter()
        for first, count in self._chunks(first_block, n_blocks):
            self._write_chunk(context, first, count)
        with self._lock:
            self._totals["seeded_blocks"] += n_blocks
        return IoResult(bytes=n_blocks * self.stride, blocks=n_blocks, wall_s=time.perf_counter() - start)

    def discard(self, extents: Iterable[Sequence[int]]) -> int:
        """Drop the blocks of each ``(context, first, blocks)`` run, a context's tail that a bounded store evicted:
        its file is cut after its first ``first`` blocks (counted as ``discarded_blocks``). Returns how many of
        them the file held. A write of a later block still in flight lands after the cut, past a hole, and is
        read by nobody before its block is written again."""
        dropped = 0
        for context, first, n_blocks in extents:
            self._check(context, first, n_blocks)
            path = self.path(context)
            try:
                size = path.stat().st_size
                keep = first * self.stride
                if size > keep:
                    os.truncate(path, keep)
                    dropped += min(n_blocks, -(-(size - keep) // self.stride))
            except FileNotFoundError:  # never written here (a context whose blocks were never persisted)
                continue
            except OSError as err:
                raise HostStorageError(f"discard blocks {first}+ of {path}: {err.strerror or err}") from err
        with self._lock:
            self._totals["discarded_blocks"] += dropped
        return dropped

    def stats(self) -> dict[str, int | float | bool | str]:
        """Totals since creation (wall times are sums over calls, which may overlap), and the settings."""
        with self._lock:
            totals: dict[str, int | float | bool | str] = dict(self._totals)
        totals.update(
            direct_io=self.direct_io,
            direct_io_reason=self.direct_io_reason,
            stride=self.stride,
            block_bytes=self.block_bytes,
            views_away=sum(view.away for view in self._views),
        )
        return totals

    def close(self) -> None:
        """Wait for the I/O in flight, stop the pool and free the buffers; idempotent."""
        if self._closed:
            return
        self._closed = True
        for view in self._views:  # back (what waits for it goes on), then closed with the pools
            self.give_back(view)
        self._pool.shutdown(wait=True)
        self._write_pool.shutdown(wait=True)
        self._buffers.close()
        for fd in (*(view.fd for view in self._views), self._root_fd, self._gone_fd):
            if fd is not None:
                os.close(fd)
        self._root_fd = self._gone_fd = None

    def remove_all(self) -> int:
        """Delete every context file under ``root`` (whoever wrote it), even after :meth:`close`; returns how many."""
        removed = 0
        for entry in self.root.iterdir():
            if _CTX_FILE.fullmatch(entry.name):
                try:
                    entry.unlink()
                    removed += 1
                except FileNotFoundError:  # another process's clean-up got there first
                    pass
                except OSError as err:
                    raise HostStorageError(f"remove {entry}: {err.strerror or err}") from err
        return removed

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    # --- the work -------------------------------------------------------------------------------------------

    def _probe(self, direct: bool | None) -> tuple[bool, str, int]:
        """Whether to use O_DIRECT (else why not) and the I/O alignment; checks that ``root`` is writable."""
        probe = self.root / f".probe-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            os.close(os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as err:
            raise HostStorageError(f"root {self.root}: not a writable directory ({err.strerror or err})") from err
        try:
            if direct is False:
                return False, "buffered I/O asked for (direct=False)", SMALL_ALIGN
            reason, align = self._try_direct(probe)
        finally:
            probe.unlink(missing_ok=True)
        if not reason:
            return True, "", align
        if direct:
            raise HostStorageError(f"direct=True, but {reason} (root {self.root})")
        return False, reason, SMALL_ALIGN

    @staticmethod
    def _try_direct(probe: Path) -> tuple[str, int]:
        o_direct: int = getattr(os, "O_DIRECT", 0)
        if not o_direct:
            return "os.O_DIRECT does not exist on this platform", ALIGN
        try:
            fd = os.open(probe, os.O_RDWR | o_direct)
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise HostStorageError(f"open {probe} with O_DIRECT: {err.strerror or err}") from err
            return "the file system refuses O_DIRECT (EINVAL on open)", ALIGN
        buffer = mmap.mmap(-1, 2 * ALIGN)
        try:
            os.pwrite(fd, buffer, 0)
            os.preadv(fd, [buffer], 0)
        except OSError as err:
            os.close(fd)
            _unmap(buffer)
            if err.errno != errno.EINVAL:
                raise HostStorageError(f"I/O on {probe} with O_DIRECT: {err.strerror or err}") from err
            return "the file system refuses O_DIRECT (EINVAL on the first I/O)", ALIGN
        try:  # most devices' logical blocks are 512 bytes: then so is O_DIRECT's alignment
            with memoryview(buffer) as view:
                os.pwrite(fd, view[:SMALL_ALIGN], SMALL_ALIGN)
                os.preadv(fd, [view[:SMALL_ALIGN]], SMALL_ALIGN)
            align = SMALL_ALIGN
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise HostStorageError(f"I/O on {probe} with O_DIRECT: {err.strerror or err}") from err
            align = ALIGN
        finally:
            os.close(fd)
            _unmap(buffer)
        return "", align

    def _check(self, context: int, first_block: int, n_blocks: int) -> None:
        if self._closed:
            raise HostStorageError("the BlockStore is closed")
        _check_int("context", context, 0)
        _check_int("first_block", first_block, 0)
        _check_int("n_blocks", n_blocks, 1)
        if context > _MAX_INDEX:
            raise HostStorageError(f"context must be < 2**63, not {context}")
        if (first_block + n_blocks) * self.stride > _MAX_INDEX:
            raise HostStorageError(f"first_block + n_blocks = {first_block + n_blocks}: past the largest file")

    def _chunks(self, first_block: int, n_blocks: int) -> Iterator[tuple[int, int]]:
        """(first, count) of each chunk of one contiguous run."""
        end = first_block + n_blocks
        for first in range(first_block, end, self._chunk_blocks):
            yield first, min(self._chunk_blocks, end - first)

    async def _wait_view(self, view: StorageView, delay_s: float) -> float:
        """Wait for ``view`` to be back, at most ``delay_s``; the seconds waited."""
        start = time.perf_counter()
        await view.wait_back(delay_s)
        return time.perf_counter() - start

    def _count_unreachable(self, kind: str, tries: int, waited: float) -> None:
        if not tries:
            return
        with self._lock:
            totals = self._totals
            totals[f"{kind}_unreachable"] += tries
            totals[f"{kind}_unreachable_waits"] += 1
            totals[f"{kind}_unreachable_s"] += waited
            totals["unreachable_max_s"] = max(totals["unreachable_max_s"], waited)

    def _open(self, context: int, flags: int, view: StorageView | None) -> int:
        """A descriptor of ``context``'s file: through ``view`` (relative to its directory), else by path."""
        if view is None:
            return os.open(self.path(context), flags, 0o600)
        return os.open(f"ctx-{context:08d}.kv", flags, 0o600, dir_fd=view.fd)

    def _open_to_write(self, context: int, view: StorageView | None) -> int:
        """A descriptor of ``context``'s file to write (created if need be), or -1 where ``view`` is away."""
        flags = os.O_WRONLY | os.O_CREAT | self._flags
        for attempt in range(2):
            try:
                return self._open(context, flags, view)
            except FileNotFoundError as err:  # (O_CREAT: the directory is not there)
                if view is not None and view.away:
                    return -1
                if view is None or attempt:  # (once more: the view may be back since the open went through it)
                    raise OSError(err.errno, f"{err.strerror}{self._gone()}") from err
        raise AssertionError("unreachable")

    def _unreachable(self, context: int, view: StorageView) -> bool:
        """Whether the kernel failed opening ``context``'s file through ``view`` for the view being away."""
        try:
            os.close(self._open(context, os.O_RDONLY, view))
        except FileNotFoundError:
            return view.away
        except OSError as err:
            raise HostStorageError(f"open {self.path(context)}: {err.strerror or err}") from err
        return False

    def _gone(self) -> str:
        """Why nothing can be found in ``root`` any more (removed, unmounted), or ``""``."""
        try:
            if os.fstat(self._root_fd).st_nlink > 0 if self._root_fd is not None else self.root.is_dir():
                return ""
        except OSError:
            pass
        return f" (the storage directory {self.root} is gone: removed or unmounted during the run)"

    async def _read_blocks(self, context: int, blocks: list[int], view: StorageView | None = None) -> list[int]:
        """What a read of ``blocks`` (sorted) found in each: one syscall per chunk of each contiguous run."""
        runs: list[tuple[int, int]] = []
        for block in blocks:
            if runs and runs[-1][0] + runs[-1][1] == block:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((block, 1))
        loop = asyncio.get_running_loop()
        found = await asyncio.gather(
            *(
                loop.run_in_executor(self._pool, self._read_chunk, context, first, count, view)
                for run in runs
                for first, count in self._chunks(*run)
            )
        )
        return [status for chunk in found for status in chunk]

    def contents(self, context: int, first_block: int, count: int) -> npt.NDArray[np.uint8]:
        """The bytes of blocks ``first_block`` … ``first_block + count - 1`` of ``context`` as the files hold them
        (``count`` × :attr:`stride`; what a DRAM pool keeps of them too)."""
        words: _Words = np.empty((count, self._words), dtype=np.uint64)
        self._expected(words, context, first_block)
        return words.view(np.uint8)

    def _expected(self, out: _Words, context: int, first_block: int) -> None:
        """Fill ``out`` (blocks × words) with the contents of blocks ``first_block`` … of ``context``."""
        count = out.shape[0]
        keys = np.fromiter((_key(context, first_block + j) for j in range(count)), dtype=np.uint64, count=count)
        np.bitwise_xor(self._base, keys[:, None], out=out)
        octets = out.view(np.uint8)
        head = min(_HEADER.size, self.block_bytes)
        for j in range(count):
            header = _HEADER.pack(_MAGIC, _VERSION, context, first_block + j, self.block_bytes)
            octets[j, :head] = np.frombuffer(header, dtype=np.uint8, count=head)
        octets[:, self.block_bytes :] = 0

    def _words_of(self, buffer: mmap.mmap, count: int) -> _Words:
        words: _Words = np.frombuffer(buffer, dtype=np.uint64, count=count * self._words).reshape(count, -1)
        return words

    def _write_chunk(self, context: int, first_block: int, count: int, view: StorageView | None = None) -> bool:
        """One pwritev of ``count`` blocks; False if the file could not be opened, ``view`` away (retry later)."""
        size = count * self.stride
        offset = first_block * self.stride
        buffer = self._buffers.get()
        try:
            self._expected(self._words_of(buffer, count), context, first_block)
            fd = self._open_to_write(context, view)
            if fd < 0:
                return False
            try:
                with memoryview(buffer) as window:
                    done = 0
                    while done < size:  # a regular file writes all at once but for errors; loop all the same
                        written = os.pwritev(fd, [window[done:size]], offset + done)
                        if written <= 0:
                            raise OSError(errno.EIO, "pwritev wrote nothing")
                        done += written
            finally:
                os.close(fd)
        except OSError as err:
            raise HostStorageError(
                f"write {self.path(context)} (blocks {first_block}..{first_block + count - 1}): {err.strerror or err}"
            ) from err
        finally:
            self._buffers.put(buffer)
        return True

    def _read_chunk(self, context: int, first_block: int, count: int, view: StorageView | None = None) -> list[int]:
        """One preadv of ``count`` blocks, and what it found in each (on a pool thread)."""
        size = count * self.stride
        buffer = self._buffers.get()
        try:
            try:
                fd = self._open(context, os.O_RDONLY | self._flags, view)
            except FileNotFoundError:
                if view is not None and view.away:
                    return [_UNREACHABLE] * count  # the view is away: not "not there yet"
                return [_PENDING] * count  # nothing of this context written yet
            try:
                with memoryview(buffer) as window:
                    got = os.preadv(fd, [window[:size]], first_block * self.stride)
            finally:
                os.close(fd)
            return self._verify(buffer, got, context, first_block, count)
        except OSError as err:
            raise HostStorageError(
                f"read {self.path(context)} (blocks {first_block}..{first_block + count - 1}): {err.strerror or err}"
            ) from err
        finally:
            self._buffers.put(buffer)

    def _verify(self, buffer: mmap.mmap, got: int, context: int, first_block: int, count: int) -> list[int]:
        """What each block of a chunk read into ``buffer`` is: _OK, _PENDING or _CORRUPT."""
        words = self._words_of(buffer, count)
        if got < count * self.stride:  # the file ends early: what was not read counts as zero (not yet there)
            words.view(np.uint8).reshape(-1)[got:] = 0
        scratch: Any = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = np.empty((self._chunk_blocks, self._words), dtype=np.uint64)
        expected: _Words = scratch[:count]
        self._expected(expected, context, first_block)
        if np.array_equal(words, expected):
            return [_OK] * count
        statuses = []
        for block_words, block_expected in zip(words, expected, strict=True):
            if np.array_equal(block_words, block_expected):
                statuses.append(_OK)
                continue
            pages = block_words.reshape(-1, self.align // 8)
            differs = (pages != block_expected.reshape(-1, self.align // 8)).any(axis=1)
            zero = ~pages.any(axis=1)  # a page not written yet reads as zeros
            statuses.append(_CORRUPT if (differs & ~zero).any() else _PENDING)
        return statuses

    def _count(self, result: IoResult, moved: str, calls: str, wall: str) -> None:
        with self._lock:
            totals = self._totals
            totals[f"bytes_{moved}"] += result.bytes
            totals[f"blocks_{moved}"] += result.blocks
            totals[calls] += 1
            totals[wall] += result.wall_s
            totals["verified_bytes"] += result.verified_bytes
            totals["mismatched_blocks"] += result.mismatched_blocks
            totals["retries"] += result.retries
        self._count_unreachable("read" if moved == "read" else "write", result.unreachable, result.unreachable_s)


def run_storage(storage_dir: str) -> str:
    """The run's own folder under ``storage_dir`` (``run-<random>``), so runs sharing it never touch each other's."""
    return str(Path(storage_dir) / f"run-{secrets.token_hex(8)}") if storage_dir else ""


def remove_blocks(folder: Path) -> None:
    """Remove the run's own KV block folder; one that cannot be cleaned is said, not an error."""
    from dualpath_emu.runtime.launcher import OWNER_FILE

    try:
        for path in folder.glob("ctx-*.kv"):
            path.unlink(missing_ok=True)
        (folder / OWNER_FILE).unlink(missing_ok=True)
        folder.rmdir()
    except FileNotFoundError:
        pass
    except OSError as error:
        if error.errno != errno.ENOTEMPTY:  # something else is in it: not ours to remove
            print(f"dualpath-emu: warning: could not remove the run's KV blocks in {folder}: "
                  f"{error.strerror or error}", file=sys.stderr, flush=True)  # fmt: skip
