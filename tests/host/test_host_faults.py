"""Faults on the host backend (issue 26): the same fault schedule as in virtual time and live model runs acts
on real bytes -- the fault injector sets each port change on its process's plane, which passes it on to
every other process of the run over its byte channel, and each plane's pacers stop or slow what crosses the
port -- and engine crashes
work as everywhere. Every run here ends with every admitted request ended once and every byte accounted, every
block read back verified (``collect`` raises otherwise)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from dualpath_emu.cluster.faults import Fault, FaultPlan
from dualpath_emu.cluster.live import run_live
from dualpath_emu.cluster.run import SystemResult, run_system
from dualpath_emu.cluster.systems import SYSTEMS
from dualpath_emu.host.pacing import Pacer

from tests.host.test_host_backend import SCALE, config, work

pytestmark = [pytest.mark.host, pytest.mark.processes]  # three host runs' processes

NS = 1_000_000_000


def host_run(tmp_path: Path, system: str, *faults: Fault) -> SystemResult:
    return run_live(dataclasses.replace(config(), faults=FaultPlan(faults)), SYSTEMS[system], work(),
                    run_dir=tmp_path / "run", backend="host", byte_scale=SCALE, timeout_s=120.0)  # fmt: skip


def check_real_bytes(result: SystemResult) -> dict:  # type: ignore[type-arg]
    """Every turn ended, nothing lost, every block and byte verified; the host summary."""
    assert result.turns == 24 and result.complete and result.failed_requests == 0
    host = result.extra["host"]
    assert host["mismatched_blocks"] == 0 and host["blocks_read"] > 0
    assert host["network_bytes_sent"] == host["network_bytes_verified"] > 0 and host["network_bytes_mismatched"] == 0
    return host  # type: ignore[no-any-return]


def test_a_dead_storage_nic_stops_its_real_bytes_and_dualpath_reads_on_the_other_side(tmp_path: Path) -> None:
    # Decode node 1's storage NIC (where DualPath reads nearly every hit here) is down from 0.5 s to 4 s of a
    # ~8 s run: the decode process's storage pacers stop, so its write-backs wait out the outage (seconds,
    # where they take milliseconds otherwise); meanwhile hits are read on the prefill side, and the reads
    # there of blocks whose write-back is held back wait for it -- longer than a read's usual 2 s of patience
    # (a read gave up after them, reported a wrong block and failed the run) -- and verify.
    result = host_run(tmp_path, "dualpath", Fault("down", "n1.snic", 0.5, 3.5))
    host = check_real_bytes(result)
    [fault] = result.extra["faults"]  # the per-fault report, from the merged event log's fault lines
    assert (fault["kind"], fault["target"]) == ("down", "n1.snic")
    assert fault["end_s"] - fault["start_s"] == pytest.approx(3.5, abs=0.2)
    m, start_ns = result.metrics, round(result.extra["emulated_start_s"] * NS)
    when = [(m.scheduled_de_ns[r] - start_ns) / NS for r in range(len(m))]
    during = [r for r in range(len(m)) if 0.6 < when[r] < 3.9 and m.hit[r] > 0]
    after = [r for r in range(len(m)) if when[r] > 4.2 and m.hit[r] > 0]
    assert during and all(m.read_on_de[r] == 0 for r in during)  # the second path, while the NIC is down
    assert after and any(m.read_on_de[r] == 1 for r in after)  # and back on the decode side after it
    paths = host["paths"]
    # Real bytes stopped: the write-backs under way or queued at 0.5 s waited for the NIC...
    assert paths["write-back"]["max_s"] > 2.5
    # ...and so did prefill-side reads of their blocks, past 2 s.
    assert paths["storage read (PE)"]["count"] > 0 and paths["storage read (PE)"]["max_s"] > 2.0
    assert host["read_retries"] > 0


def test_a_degraded_node_slows_its_real_bytes(tmp_path: Path) -> None:
    # Every NIC of decode node 1 at 5% of its rate for the whole run: each kind of real work that crosses one
    # takes about what the model gives it on an idle path at 5% of the rate (measured: 0.7 to 0.95 of it) --
    # its storage reads (the storage NIC's pacer), the DE→PE loads it sends (its compute NICs' tx pacers) and
    # the PE→DE stores it receives (its compute NICs' rx: the chunks let in by a pacer in the decode process).
    # Unfaulted, the same kinds take 0.05 to 0.33 of that here.
    factor = 0.05
    result = host_run(tmp_path, "dualpath", Fault("degrade", "n1", 0.0, None, factor))
    paths = check_real_bytes(result)["paths"]
    measured = {}
    for kind in ("storage read (DE)", "DE→PE", "PE→DE"):
        row = paths[kind]
        assert row["count"] > 0, kind
        measured[kind] = row["mean_s"] / (row["idle_mean_s"] / factor)
    assert all(0.45 < ratio < 3.0 for ratio in measured.values()), measured
    [fault] = result.extra["faults"]
    assert (fault["kind"], fault["target"], fault["end_s"]) == ("degrade", "n1", None)


def test_a_decode_engine_crash_and_a_slow_storage_cluster_on_the_host_backend(tmp_path: Path) -> None:
    # Decode node 1's engines crash at 1 s and are back 1 s later: their requests are dispatched again (their
    # hits read again, from real blocks), and every request ends once, every pool is empty (collect raises
    # otherwise). The decode stepping here is each process's core's, reset by the crash. All along,
    # the storage cluster adds 10 ms to every I/O (its ports belong to no node: every node's process's core waits
    # it out before it hands a storage I/O of its own out).
    result = host_run(tmp_path, "dualpath", Fault("crash", "de1", 1.0, restart_s=1.0),
                      Fault("latency", "storage", 0.0, None, 0.0, 0.01))  # fmt: skip
    paths = check_real_bytes(result)["paths"]
    assert result.redispatches > 0
    crash, slow = sorted(result.extra["faults"], key=lambda f: f["kind"])
    assert (crash["kind"], crash["target"]) == ("crash", "de1") and crash["redispatched"] == result.redispatches
    assert crash["end_s"] - crash["start_s"] == pytest.approx(1.0, abs=0.2)
    assert (slow["kind"], slow["target"], slow["end_s"]) == ("latency", "storage", None)
    for kind in ("storage read (DE)", "write-back"):  # each waited 10 ms first (a few ms otherwise)
        assert paths[kind]["count"] > 0 and paths[kind]["mean_s"] > 0.01, kind


# --- the pacer --------------------------------------------------------------------------------------------


def test_a_pacer_pauses_and_changes_its_rate_without_losing_a_byte() -> None:
    """100 kB at 1 MB/s in 1 kB chunks: paused from 20 ms to 70 ms (nothing granted, what was queued waits,
    a message enqueued meanwhile too), then at a quarter of the rate, then back: every byte is granted once,
    in order, and the time each phase took is its bytes over its rate (within the loop's timer resolution)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        origin = time.monotonic_ns()

        def clock() -> int:
            return time.monotonic_ns() - origin

        grants: list[tuple[int, int, int]] = []  # (time ns, tag, bytes)
        pacer = Pacer(1e6, 1000, clock, lambda g: grants.extend((clock(), tag, n) for tag, _, n, _ in g), burst_s=1e-3)
        pacer.start(loop)
        pacer.enqueue(0, 100_000, 1)
        await asyncio.sleep(0.02)
        pacer.set_rate(0.0)
        paused_at, before = clock(), sum(n for _, _, n in grants)
        assert pacer.port.paused and 15_000 < before < 30_000
        pacer.enqueue(0, 5_000, 2)
        await asyncio.sleep(0.05)
        assert sum(n for _, _, n in grants) == before and all(t <= paused_at for t, _, _ in grants)
        pacer.set_rate(0.25e6)  # resumes at a quarter of the rate
        resumed_at = clock()
        await asyncio.sleep(0.04)
        slow = sum(n for t, _, n in grants if t >= resumed_at)
        assert 6_000 <= slow <= 14_000, slow  # 10 kB in 40 ms at 0.25 MB/s (a 1 ms bucket, timer slack)
        pacer.set_rate(1e6)
        fast_at, left = clock(), 105_000 - sum(n for _, _, n in grants)
        while sum(n for _, _, n in grants) < 105_000:
            await asyncio.sleep(0.005)
        took_s = (clock() - fast_at) / 1e9
        assert left / 1e6 * 0.9 < took_s < left / 1e6 + 0.03, (left, took_s)
        pacer.stop()
        assert [tag for _, tag, _ in grants] == sorted(tag for _, tag, _ in grants)  # FIFO: message 1, then 2
        assert (
            sum(n for _, tag, n in grants if tag == 1) == 100_000
            and sum(n for _, tag, n in grants if tag == 2) == 5_000
        )
        assert pacer.port.granted_bytes() == 105_000 and pacer.port.queued_bytes() == 0

    asyncio.run(main())


def test_a_decode_nodes_storage_nic_down_to_the_end_is_refused_on_the_host_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Its write-backs would be held for ever, and the later turns that read those blocks would wait for them: a
    # one-line error before anything starts, not a run that never ends.
    from dualpath_emu.cli import main

    faults = tmp_path / "f.toml"
    faults.write_text('kind = "faults"\n[[faults]]\nkind = "down"\ntarget = "n1.snic"\nat_s = 0.5\n')
    argv = ["run", "ds27b-1p1d-offline", "--backend", "host", "--agents", "2", "--faults", str(faults),
            "--run-dir", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "n1.snic at 0.5 s has no duration_s" in err and "Traceback" not in err
