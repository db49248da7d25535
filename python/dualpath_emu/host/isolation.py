"""Lane isolation on real bytes (issue 16): a collective on the model lane with KV traffic behind it on one
real link, with and without the virtual-lane arbitration.

One sending port (a :class:`~dualpath_emu.host.pacing.Pacer` at ``rate`` real bytes per second, in chunks
of ``chunk`` bytes) feeds one real link (a :class:`~dualpath_emu.host.transport.ByteChannel` over a private
``ipc://`` socket) to a receiver that checks every byte and acknowledges each message. The KV background keeps
``kv_outstanding`` messages of ``kv_bytes`` queued on the KV lane (VL2), as a NIC keeps work requests queued;
the collective is a ``collective_bytes`` message on the model lane (VL0), sent again and again, and its
latency is the time from its send to the receiver's acknowledgement. Three runs:

* **unloaded**: the collective alone;
* **isolated**: with the KV background, the port arbitrating lanes as the paper configures them (A.1,
  ``Arbitration.paper()``): the collective's chunks go before the queued KV chunks;
* **shared**: with the KV background, one FIFO for both lanes (no isolation): the collective waits behind
  the KV bytes already queued.

``python -m dualpath_emu.host.isolation`` prints the medians as ``BENCH`` lines (``make bench``).
"""

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


async def _run(folder: Path, *, isolated: bool, background: bool, rate: float, chunk: int, collective_bytes: int,
               kv_bytes: int, kv_outstanding: int, trials: int) -> tuple[list[float], int]:  # fmt: skip
    ends = {"tx": f"ipc://{folder}/tx.sock", "rx": f"ipc://{folder}/rx.sock"}
    sender = ByteChannel("tx", ends["tx"], {"rx": ends["rx"]})
    receiver = ByteChannel("rx", ends["rx"], {"tx": ends["tx"]})
    jobs: dict[int, list[int | bool | str]] = {}  # pacer tag -> [dest, job, ack, offset]

    def on_grants(grants: list[Grant]) -> None:
        for tag, _lane, nbytes, last in grants:
            dest, job, ack, offset = jobs[tag]
            sender.send_chunk(str(dest), int(job), int(offset), nbytes, last, bool(ack))
            jobs[tag][3] = int(offset) + nbytes
            if last:
                del jobs[tag]

    pacer = Pacer(rate, chunk, time.monotonic_ns, on_grants, arbitration=Arbitration.paper() if isolated else None)
    tags = iter(range(1, 1 << 62))

    def send(dest: str, job: int, nbytes: int, lane: int, ack: bool, port: int) -> None:
        tag = next(tags)
        jobs[tag] = [dest, job, ack, 0]
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
    return latencies, kv_done


def measure_isolation(*, rate: float = 100e6, chunk: int = 16 << 10, collective_bytes: int = 4 << 20,
                      kv_bytes: int = 4 << 20, kv_outstanding: int = 4, trials: int = 20) -> IsolationResult:  # fmt: skip
    """Run the three runs of the module docstring; return the collective's median latencies."""
    samples: dict[str, list[float]] = {}
    moved: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="dualpath-emu-isolation-") as folder:  # 0700: ipc needs no keys
        for name, isolated, background in (
            ("unloaded", True, False),
            ("isolated", True, True),
            ("shared", False, True),
        ):
            samples[name], moved[name] = asyncio.run(_run(
                Path(folder), isolated=isolated, background=background, rate=rate, chunk=chunk,
                collective_bytes=collective_bytes, kv_bytes=kv_bytes, kv_outstanding=kv_outstanding, trials=trials,
            ))  # fmt: skip
    median = {name: statistics.median(values) for name, values in samples.items()}
    return IsolationResult(median["unloaded"], median["isolated"], median["shared"], samples, moved)


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
