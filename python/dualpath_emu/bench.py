"""`make bench`, Python side: the core driven through its binding, as actors will drive it.

The same paper-scale mix as the Rust benchmark (core/examples/bench_core.rs): 6 nodes × 8 compute NICs with
the paper's lanes, a storage NIC and DRAM per node, ~2,000 transfers in flight, closed loop. Each event
batch crosses the FFI boundary once each way (one `step()`, one `submit_transfers()`), so the figure shows
what the binding costs on top of the core. Prints `BENCH <name> <value> <unit>` lines."""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass

from dualpath_emu._core import Arbitration, Core

NODES = 6
GPUS = 8
IN_FLIGHT = 2_000
GBPS_400 = 50e9


@dataclass
class Ports:
    """Port ids of the benchmark cluster, by role."""

    storage: int
    snic: list[int]
    dram: list[int]
    tx: list[list[int]]
    rx: list[list[int]]


def build(core: Core) -> Ports:
    """Add the cluster's ports to `core`."""
    paper = Arbitration.paper()

    def nics(side: str) -> list[list[int]]:
        return [
            [core.add_port(f"n{n}.cnic{g}.{side}", GBPS_400, arbitration=paper) for g in range(GPUS)]
            for n in range(NODES)
        ]

    return Ports(
        storage=core.add_port("3fs", NODES * 2 * GBPS_400),
        snic=[core.add_port(f"n{n}.snic.rx", GBPS_400) for n in range(NODES)],
        dram=[core.add_port(f"n{n}.dram", 500e9) for n in range(NODES)],
        tx=nics("tx"),
        rx=nics("rx"),
    )


def pick(ports: Ports, rng: random.Random) -> tuple[list[int], int, int]:
    """One transfer of the mix: (path, lane, size); the same kinds and sizes as the Rust benchmark."""
    n, g = rng.randrange(NODES), rng.randrange(GPUS)
    kv_block = 64 * 656 * (1 + rng.randrange(61))
    kind = rng.randrange(10)
    m = (n + 1 + rng.randrange(NODES - 1)) % NODES
    if kind <= 2:
        return [ports.storage, ports.snic[n], ports.dram[n]], 2, kv_block * 8
    if kind <= 4:
        return [ports.dram[n], ports.tx[n][g], ports.rx[n][g]], 2, kv_block
    if kind <= 7:
        return [ports.tx[n][g], ports.rx[m][rng.randrange(GPUS)], ports.dram[m]], 2, kv_block
    return [ports.tx[n][g], ports.rx[m][g]], 0, 7168 * 128 * (1 + rng.randrange(4))


def main() -> None:
    completions_goal = int(os.environ.get("BENCH_BINDING_COMPLETIONS", "300000"))
    rng = random.Random(1)
    core = Core()
    ports = build(core)
    tag = 0
    batch: list[tuple[list[int], int, int, int]] = []
    for _ in range(IN_FLIGHT):
        path, lane, size = pick(ports, rng)
        batch.append((path, lane, size, tag))
        tag += 1
    core.submit_transfers(batch)
    start = time.perf_counter()
    completed = 0
    calls = 0
    while completed < completions_goal:
        step = core.step()
        calls += 1
        if step is None:
            break
        _, done = step
        if done:
            batch = []
            for _ in done:
                path, lane, size = pick(ports, rng)
                batch.append((path, lane, size, tag))
                tag += 1
            core.submit_transfers(batch)
            calls += 1
            completed += len(done)
    wall = time.perf_counter() - start
    events = 2 * completed  # each completion and the arrival it triggers
    print(f"binding mix: {completed} completions in {wall:.2f} s wall, {calls} FFI calls")
    print(f"BENCH binding_transfer_events_per_s {events / wall:.0f} events/s")
    print(f"BENCH binding_ffi_calls_per_completion {calls / max(completed, 1):.2f} calls")


if __name__ == "__main__":
    main()
