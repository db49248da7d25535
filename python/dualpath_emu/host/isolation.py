"""Lane isolation on real bytes: a collective on the model lane (VL0) with KV (VL2) queued behind it on one real
link (a :class:`~dualpath_emu.host.pacing.Pacer` feeding a private ``ipc://``
:class:`~dualpath_emu.host.transport.ByteChannel`), in three runs: **unloaded** (the collective alone),
**isolated** (``kv_outstanding`` KV messages kept queued, the paper's arbitration, A.1) and **shared** (the same
KV, one FIFO). The collective's latency is its send to the receiver's ack. ``python -m
dualpath_emu.host.isolation`` prints the medians as ``BENCH`` lines (``make bench``)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dualpath_emu._core import Arbitration
from dualpath_emu.host.pacing import Grant, Pacer
from dualpath_emu.host.transport import ByteChannel

__all__ = ["IsolationResult", "measure_isolation"]

MODEL_LANE, KV_LANE = 0, 2
"""The paper's lanes (A.1), as the cluster numbers them: the model's traffic on VL0, KV on VL2."""


@dataclass(frozen=True)
class IsolationResult:
    """Median collective latency (wall seconds) in each run, and every sample."""

    unloaded_s: float
    isolated_s: float
    shared_s: float
    samples: dict[str, list[float]]
    kv_bytes_moved: dict[str, int]
    kv_bytes_ahead: dict[str, list[tuple[int, int]]]
    """Per run and trial: the KV bytes queued at the port when the collective was sent, and those it let through
    before the collective's last byte (what isolation is, whatever the CPU's load: the collective goes first)."""


async def _run(folder: Path, *, isolated: bool, background: bool, rate: float, chunk: int, collective_bytes: int,
               kv_bytes: int, kv_outstanding: int, trials: int) -> tuple[list[float], int, list[tuple[int, int]]]:  # fmt: skip
    ends = {"tx": f"ipc://{folder}/tx.sock", "rx": f"ipc://{folder}/rx.sock"}
    sender = ByteChannel("tx", ends["tx"], {"rx": ends["rx"]})
    receiver = ByteChannel("rx", ends["rx"], {"tx": ends["tx"]})
    jobs: dict[int, list[int | bool | str]] = {}  # pacer tag -> [dest, job, ack, offset]
    ahead: list[tuple[int, int]] = []  # per trial: KV bytes queued at the collective's send, let through before it
    collective: list[int] = []  # the tag of the collective in flight
    kv_queued = 0

    def on_grants(grants: list[Grant]) -> None:
        nonlocal kv_queued
        for tag, lane, nbytes, last in grants:
            kv_queued -= nbytes if lane == KV_LANE else 0
            if collective and lane == KV_LANE:
                ahead[-1] = (ahead[-1][0], ahead[-1][1] + nbytes)
            elif collective and tag == collective[0] and last:
                collective.clear()
            dest, job, ack, offset = jobs[tag]
            sender.send_chunk(str(dest), int(job), int(offset), nbytes, last, bool(ack))
            jobs[tag][3] = int(offset) + nbytes
            if last:
                del jobs[tag]

    pacer = Pacer(rate, chunk, time.monotonic_ns, on_grants, arbitration=Arbitration.paper() if isolated else None)
    tags = iter(range(1, 1 << 62))

    def send(dest: str, job: int, nbytes: int, lane: int, ack: bool, port: int) -> None:
        nonlocal kv_queued
        tag = next(tags)
        jobs[tag] = [dest, job, ack, 0]
        kv_queued += nbytes if lane == KV_LANE else 0
        if lane == MODEL_LANE:
            collective[:] = [tag]
            ahead.append((kv_queued, 0))
        pacer.enqueue(lane, nbytes, tag)

    sender.send = send
    await sender.open()
    await receiver.open()
    pacer.start(asyncio.get_running_loop())
    stop = asyncio.Event()
    kv_done = 0

    async def kv_stream() -> None:
        nonlocal kv_done
        while not stop.is_set():
            await sender.push("rx", kv_bytes, KV_LANE, 0)
            kv_done += kv_bytes

    streams = [asyncio.get_running_loop().create_task(kv_stream()) for _ in range(kv_outstanding if background else 0)]
    latencies: list[float] = []
    try:
        await asyncio.sleep(kv_bytes * kv_outstanding / rate if background else 0.0)  # the KV queue fills
        for _ in range(trials):
            started = time.perf_counter()
            await sender.push("rx", collective_bytes, MODEL_LANE, 0)
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0)  # back to back: every trial starts with the bucket as the last left it
    finally:
        stop.set()
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
        pacer.stop()
        await sender.close()
        await receiver.close()
    if receiver.stats.mismatched_bytes:
        raise RuntimeError(f"{receiver.stats.mismatched_bytes} byte(s) arrived differing from what was sent")
    return latencies, kv_done, ahead


def measure_isolation(*, rate: float = 100e6, chunk: int = 16 << 10, collective_bytes: int = 4 << 20,
                      kv_bytes: int = 4 << 20, kv_outstanding: int = 4, trials: int = 20) -> IsolationResult:  # fmt: skip
    """Run the three runs of the module docstring; return the collective's median latencies."""
    samples: dict[str, list[float]] = {}
    moved: dict[str, int] = {}
    ahead: dict[str, list[tuple[int, int]]] = {}
    with tempfile.TemporaryDirectory(prefix="dualpath-emu-isolation-") as folder:  # 0700: ipc needs no keys
        for name, isolated, background in (
            ("unloaded", True, False),
            ("isolated", True, True),
            ("shared", False, True),
        ):
            samples[name], moved[name], ahead[name] = asyncio.run(_run(
                Path(folder), isolated=isolated, background=background, rate=rate, chunk=chunk,
                collective_bytes=collective_bytes, kv_bytes=kv_bytes, kv_outstanding=kv_outstanding, trials=trials,
            ))  # fmt: skip
    median = {name: statistics.median(values) for name, values in samples.items()}
    return IsolationResult(median["unloaded"], median["isolated"], median["shared"], samples, moved, ahead)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dualpath_emu.host.isolation", description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=100e6, help="the port's rate, real bytes per second")
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args(argv)
    result = measure_isolation(rate=args.rate, trials=args.trials)
    for name in ("unloaded", "isolated", "shared"):
        print(f"BENCH host_isolation_{name}_collective_ms {getattr(result, name + '_s') * 1e3:.2f} ms")
    print(f"BENCH host_isolation_isolated_vs_unloaded {result.isolated_s / result.unloaded_s:.2f} x")
    print(f"BENCH host_isolation_shared_vs_unloaded {result.shared_s / result.unloaded_s:.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
