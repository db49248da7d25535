"""``dualpath-emu calibrate-host``: this machine's disk and network, measured through the host backend's own I/O paths
(a :class:`~dualpath_emu.host.storage.BlockStore` in ``--dir``, 16 I/Os in flight, and a
:class:`~dualpath_emu.host.transport.ByteChannel` over private ``ipc://``, unpaced; every byte verified; plus the median
latency of a 4 KiB read and round trip), written as TOML ``[hardware]`` and ``[storage]`` tables a cluster scenario can
use, with, as a comment, the largest ``byte_scale`` at which a host run keeps to its model's rates here."""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dualpath_emu.host.storage import BlockStore
from dualpath_emu.host.transport import ByteChannel

__all__ = ["HostRates", "calibrate_host", "calibrate_command", "hardware_table"]

BLOCK_BYTES = 1 << 20
IN_FLIGHT = 16
NET_CHUNK_BYTES = 256 << 10


@dataclass(frozen=True)
class HostRates:
    """What :func:`calibrate_host` measured: bytes per second and seconds."""

    disk_read_bytes_per_s: float
    disk_write_bytes_per_s: float
    disk_read_latency_s: float
    disk_write_latency_s: float
    direct_io: bool
    network_bytes_per_s: float
    network_rtt_s: float
    size_bytes: int


async def _disk(folder: Path, size: int) -> tuple[float, float, float, float, bool]:
    blocks = max(IN_FLIGHT, size // BLOCK_BYTES)
    with BlockStore(folder, BLOCK_BYTES, threads=IN_FLIGHT // 2) as store:
        try:
            started = time.perf_counter()
            for first in range(0, blocks, IN_FLIGHT):
                await asyncio.gather(*(store.write(1, b, 1) for b in range(first, min(blocks, first + IN_FLIGHT))))
            write_s = time.perf_counter() - started
            started = time.perf_counter()
            for first in range(0, blocks, IN_FLIGHT):
                results = await asyncio.gather(
                    *(store.read(1, b, 1, wait_s=0.0) for b in range(first, min(blocks, first + IN_FLIGHT)))
                )
                if any(r.mismatched_blocks for r in results):
                    raise RuntimeError(f"{folder}: a block read back differed from what was written")
            read_s = time.perf_counter() - started
        finally:
            store.remove_all()
    with BlockStore(folder, 4096, threads=1) as small:
        try:
            writes, reads = [], []
            for b in range(64):
                writes.append((await small.write(2, b, 1)).wall_s)
            for b in range(64):
                reads.append((await small.read(2, b, 1, wait_s=0.0)).wall_s)
            direct = small.direct_io
        finally:
            small.remove_all()
    total = blocks * store.stride
    return total / read_s, total / write_s, statistics.median(reads), statistics.median(writes), direct


async def _network(folder: Path, size: int) -> tuple[float, float]:
    ends = {"a": f"ipc://{folder}/a.sock", "b": f"ipc://{folder}/b.sock"}
    a = ByteChannel("a", ends["a"], {"b": ends["b"]})
    b = ByteChannel("b", ends["b"], {"a": ends["a"]})

    def send(dest: str, job: int, nbytes: int, lane: int, ack: bool, port: int) -> None:
        for offset in range(0, nbytes, NET_CHUNK_BYTES):
            a.send_chunk(
                dest, job, offset, min(NET_CHUNK_BYTES, nbytes - offset), offset + NET_CHUNK_BYTES >= nbytes, ack
            )

    a.send = send
    await a.open()
    await b.open()
    try:
        rtts = []
        for _ in range(64):
            started = time.perf_counter()
            await a.push("b", 4096, 0, 0)
            rtts.append(time.perf_counter() - started)
        message = 16 << 20
        count = max(1, size // message)
        started = time.perf_counter()
        for _ in range(count):
            await a.push("b", message, 2, 0)
        elapsed = time.perf_counter() - started
    finally:
        await a.close()
        await b.close()
    if b.stats.mismatched_bytes:
        raise RuntimeError("bytes arrived differing from what was sent")
    return count * message / elapsed, statistics.median(rtts)


def calibrate_host(folder: Path, size_bytes: int) -> HostRates:
    """Measure this host (see the module docstring); the disk in ``folder``."""
    read, write, read_latency, write_latency, direct = asyncio.run(_disk(folder, size_bytes))
    with tempfile.TemporaryDirectory(prefix="dualpath-emu-calibrate-") as sockets:  # 0700: private ipc
        network, rtt = asyncio.run(_network(Path(sockets), size_bytes))
    return HostRates(read, write, read_latency, write_latency, direct, network, rtt, size_bytes)


def hardware_table(rates: HostRates, *, snic_bytes_per_s: float = 50e9, cnic_bytes_per_s: float = 50e9) -> str:
    """The TOML tables of ``rates``, and the byte scale a host run of a cluster with these NIC rates can use."""
    low, high = 1e6, 1e12  # the scenario's range of NIC rates
    disk = min(rates.disk_read_bytes_per_s, rates.disk_write_bytes_per_s)
    scale = min(disk / snic_bytes_per_s, rates.network_bytes_per_s / cnic_bytes_per_s)
    lines = [
        f"# This host ({socket.gethostname()}), measured by dualpath-emu calibrate-host on "
        f"{time.strftime('%Y-%m-%d %H:%M')} with {rates.size_bytes >> 20} MiB each way:",
        f"#   disk {'O_DIRECT' if rates.direct_io else 'buffered (the page cache may have served reads)'}: read "
        f"{rates.disk_read_bytes_per_s / 1e6:,.0f} MB/s, write {rates.disk_write_bytes_per_s / 1e6:,.0f} MB/s, "
        f"4 KiB read {rates.disk_read_latency_s * 1e6:,.0f} us, write {rates.disk_write_latency_s * 1e6:,.0f} us",
        f"#   byte channel (one host, ipc): {rates.network_bytes_per_s / 1e6:,.0f} MB/s, 4 KiB round trip "
        f"{rates.network_rtt_s * 1e6:,.0f} us",
        f"# A host-backend run of nodes with {snic_bytes_per_s / 1e9:g} GB/s storage and {cnic_bytes_per_s / 1e9:g} "
        f"GB/s compute NICs keeps to its model's rates here up to byte_scale = {scale:.2g} (one busy NIC of "
        "each kind; lower it for more).",
        '# Paste below `kind = "cluster"` to model nodes like this host (at byte_scale 1).',
        "",
        "[hardware]",
        f"snic_bytes_per_s = {min(max(disk, low), high):.4g}",
        f"cnic_bytes_per_s = {min(max(rates.network_bytes_per_s, low), high):.4g}",
        "",
        "[storage]",
        f"read_bytes_per_s = {min(max(rates.disk_read_bytes_per_s, low), 1e16):.4g}",
        f"write_bytes_per_s = {min(max(rates.disk_write_bytes_per_s, low), 1e16):.4g}",
        f"read_latency_s = {min(rates.disk_read_latency_s, 10.0):.3g}",
        f"write_latency_s = {min(rates.disk_write_latency_s, 10.0):.3g}",
        "",
    ]
    return "\n".join(lines)


def calibrate_command(args: argparse.Namespace) -> int:
    """Runs ``dualpath-emu calibrate-host``."""
    from dualpath_emu.errors import UsageError

    if not 1 <= args.size_mib <= 1 << 20:
        raise UsageError(f"--size-mib: expected an integer in [1, 1048576], got {args.size_mib}")
    folder = args.dir
    if not folder.is_dir():
        raise UsageError(f"--dir {folder}: not a directory")
    with tempfile.TemporaryDirectory(prefix="dualpath-emu-calibrate-", dir=folder) as work:
        rates = calibrate_host(Path(work), args.size_mib << 20)
    text = hardware_table(rates)
    if args.out is not None:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0
