"""The host backend over the whole documented range of ``byte_scale``, (0, 1] (issue 26): at the smallest scales a
storage I/O is under one real byte; it must still take the time the model gives it, and a run must report no
corruption."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from dualpath_emu._core import Core
from dualpath_emu.cluster.catalog import MODELS
from dualpath_emu.cluster.config import BLOCK_TOKENS, ClusterConfig, derived
from dualpath_emu.cluster.live import run_live
from dualpath_emu.cluster.systems import SYSTEMS
from dualpath_emu.cluster.topology import build_topology
from dualpath_emu.host.plane import HostDataPlane, HostPlan
from dualpath_emu.host.storage import BlockStore
from dualpath_emu.host.transport import ByteChannel
from dualpath_emu.workload.generator import generate
from dualpath_emu.workload.trajectory import Trajectory

pytestmark = [pytest.mark.host, pytest.mark.processes]  # host runs' processes


def config() -> ClusterConfig:
    return ClusterConfig(model=MODELS["ds27b"], pe_nodes=1, de_nodes=1, prefill_ep_nodes=1, decode_ep_nodes=1)


def test_storage_io_takes_its_modelled_time_at_the_smallest_byte_scale(tmp_path: Path) -> None:
    # 40 one-block write-backs, then reads, on one 50 GB/s storage NIC: 1 ms in the model. Paced in scaled bytes,
    # each was rounded up to one real byte at 50 B/s (20 ms): 0.8 s, and under load write-backs fell seconds
    # behind until a read of their blocks gave up (96 agents: "1 block(s) read back wrong").
    scale, blocks = 1e-9, 40
    c = config()
    core = Core(clock="wall")
    topology = build_topology(core, c.node, c.pe_nodes, c.de_nodes, c.storage)
    rates = {p: core.port_rate(p) for p in range(core.port_count)}
    plan = HostPlan(topology, ("p",) * len(topology.nodes), rates, BLOCK_TOKENS * derived(c).kv_bytes_per_token, scale)
    store = BlockStore(tmp_path, max(1, round(plan.block_bytes * scale)))
    endpoint = f"ipc://{tmp_path}/unused"
    plane = HostDataPlane(core, plan, "p", ByteChannel("p", endpoint, {"p": endpoint}), store)
    loop = plane.new_loop()
    node = topology.nodes[1].storage_node

    async def batch(kind: str) -> float:
        start = time.perf_counter()
        await asyncio.gather(*(plane.io(node, kind, 0, plan.block_bytes, ((0, i, 1),)) for i in range(blocks)))
        return time.perf_counter() - start

    try:
        write_s = loop.run_until_complete(batch("write"))
        read_s = loop.run_until_complete(batch("read"))
    finally:
        for pacer in plane._pacers.values():
            pacer.stop()
        store.close()
        loop.close()
    assert store.stats()["mismatched_blocks"] == 0 and store.stats()["blocks_read"] == blocks
    assert write_s < 0.25 and read_s < 0.25, (write_s, read_s)


@pytest.mark.parametrize(("system", "scale"), [("basic", 1e-9), ("dualpath", 1e-9), ("dualpath", 1e-7)])
def test_a_host_run_at_the_smallest_byte_scales_reports_no_corruption(
    tmp_path: Path, system: str, scale: float
) -> None:
    work = [Trajectory.from_rounds(t.id, list(zip(t.append, t.gen))[:3]) for t in generate("64k", 8, seed=0)]
    result = run_live(
        config(), SYSTEMS[system], work, run_dir=tmp_path / "run", backend="host", byte_scale=scale, timeout_s=120.0
    )
    host = result.extra["host"]
    assert result.turns == 24 and host["byte_scale"] == scale
    assert host["blocks_read"] > 0 and host["bytes_read"] == host["verified_read_bytes"]
    assert host["mismatched_blocks"] == host["network_bytes_mismatched"] == 0
    # A block is one real byte (the first of its header), padded to O_DIRECT's unit.
    assert host["block_stride"] in (512, 4096)
