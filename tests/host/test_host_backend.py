"""The host backend (``backend = "host"``, ``dualpath-emu run --backend host``): the cluster live, moving real
bytes -- KV Full Blocks in files read back and verified, KV between the node processes over the byte
channel, verified on arrival -- with every invariant of the model backend (every admitted request ends once,
every byte booked is moved: ``collect`` raises otherwise)."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgpack  # type: ignore[import-untyped]
import pytest
import zmq

from dualpath_emu.cluster.catalog import MODELS
from dualpath_emu.cluster.config import BLOCK_TOKENS, ClusterConfig
from dualpath_emu.cluster.live import run_live
from dualpath_emu.cluster.run import SystemResult, run_system
from dualpath_emu.cluster.systems import SYSTEMS
from dualpath_emu.config import ScenarioError
from dualpath_emu.host.transport import ByteChannel
from dualpath_emu.cluster.live import registry
from dualpath_emu.runtime.scenario import load_run_scenario
from dualpath_emu.workload.generator import generate
from dualpath_emu.workload.trajectory import Trajectory

from tests.by_hand import gather_parts, launch_per_host

pytestmark = pytest.mark.host

SCALE = 1e-3


def config() -> ClusterConfig:
    return ClusterConfig(model=MODELS["ds27b"], pe_nodes=1, de_nodes=1, prefill_ep_nodes=1, decode_ep_nodes=1)


def work(agents: int = 6, rounds: int = 4) -> list[Trajectory]:
    return [Trajectory.from_rounds(t.id, list(zip(t.append, t.gen))[:rounds]) for t in generate("64k", agents, seed=0)]


def host_run(tmp_path: Path, system: str, **options: object) -> SystemResult:
    return run_live(config(), SYSTEMS[system], work(), run_dir=tmp_path / "run", backend="host", byte_scale=SCALE,
                    timeout_s=120.0, **options)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.processes
@pytest.mark.parametrize(("system", "transport"), [("basic", "ipc"), ("dualpath", "tcp")])
def test_a_host_run_moves_and_verifies_real_bytes(tmp_path: Path, system: str, transport: str) -> None:
    virtual = run_system(config(), system, work())
    result = host_run(tmp_path, system, transport=transport)
    assert result.turns == virtual.turns == 24
    host = result.extra["host"]
    assert result.extra["backend"] == "host" and host["byte_scale"] == SCALE
    # Every block read back was checked against what was written; every byte sent arrived as sent.
    assert host["blocks_read"] > 0 and host["bytes_read"] == host["verified_read_bytes"] > 0
    assert host["mismatched_blocks"] == 0
    assert host["blocks_written"] > 0 and host["bytes_written"] > 0
    assert host["network_bytes_sent"] == host["network_bytes_verified"] > 0
    assert host["network_bytes_mismatched"] == host["rejected_frames"] == 0
    # Scaled: a Full Block of DS 27B (1.26 MB) is 1,260 real bytes, stored in 1,536 (512-byte O_DIRECT units) or 4,096.
    assert host["bytes_read"] == host["blocks_read"] * host["block_stride"] and host["block_stride"] in (1536, 4096)
    kinds = {kind for kind, row in host["paths"].items() if row["count"] > 0}
    assert {"PE→DE", "write-back", "forward pass"} <= kinds
    if system == "dualpath":
        assert "DE→PE" in kinds and "storage read (DE)" in kinds  # the second path, on real bytes
    else:
        assert "storage read (PE)" in kinds and "DE→PE" not in kinds and "storage read (DE)" not in kinds
    # Next to each kind, the model's figures for the same run (a virtual-time run probed by kind).
    assert host["model_jct_s"] == pytest.approx(virtual.jct_s)
    paths = host["paths"]
    assert paths["forward pass"]["model_count"] > 0 and paths["forward pass"]["model_mean_s"] > 0
    assert paths["write-back"]["model_count"] > 0 and paths["H2D"]["model_count"] > 0
    for row in paths.values():
        assert row["count"] == 0 or row["mean_s"] >= 0
    # The same run in real bytes takes about as long as the model says (this 2-core machine keeps up at
    # 1/1000 of the bytes), and the block files are gone.
    assert virtual.jct_s * 0.9 < result.jct_s < virtual.jct_s * 2.0
    assert not (tmp_path / "run" / "storage").exists()


@pytest.mark.processes
def test_the_command_line_runs_the_host_backend(tmp_path: Path) -> None:
    command = [str(Path(sys.executable).parent / "dualpath-emu"), "run", "ds27b-1p1d-offline", "--backend", "host",
               "--agents", "3", "--set", "workload.max_rounds=2", "--system", "dualpath", "--json",
               "--run-dir", str(tmp_path / "runs")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    system = summary["systems"]["dualpath"]
    assert system["turns"] == 6
    assert system["host"]["mismatched_blocks"] == 0 and system["host"]["verified_read_bytes"] > 0


@pytest.mark.processes
def test_the_host_backend_refuses_virtual_time(tmp_path: Path) -> None:
    command = [str(Path(sys.executable).parent / "dualpath-emu"), "run", "ds27b-1p1d-offline", "--backend", "host", "--mode",
               "virtual"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--backend host" in done.stderr and "Traceback" not in done.stderr


def test_scenario_keys_of_the_host_backend_are_checked(tmp_path: Path) -> None:
    from dualpath_emu.cluster.scenario import load_cluster_scenario

    path = tmp_path / "s.toml"
    path.write_text('kind = "cluster"\nbackend = "hots"\n')
    with pytest.raises(ScenarioError, match="backend"):
        load_cluster_scenario(path)
    path.write_text('kind = "cluster"\nbackend = "host"\n[host]\nbyte_scale = 0\n')
    with pytest.raises(ScenarioError, match="byte_scale"):
        load_cluster_scenario(path)
    path.write_text('kind = "cluster"\nbackend = "host"\n[host]\nbyte_scale = 0.01\nstorage_dir = "/mnt/3fs"\n')
    scenario = load_cluster_scenario(path)
    assert (scenario.backend, scenario.byte_scale, scenario.storage_dir) == ("host", 0.01, "/mnt/3fs")
    run = tmp_path / "run.toml"
    run.write_text('app = "cluster"\nbackend = "hots"\n[cluster]\n')
    with pytest.raises(ScenarioError, match="key 'backend': expected one of 'host', 'model', got 'hots'"):
        load_run_scenario(run, registry())


# --- the byte channel ------------------------------------------------------------------------------------


def _channels(tmp_path: Path) -> tuple[ByteChannel, ByteChannel]:
    folder = tmp_path / "sockets"
    folder.mkdir(mode=0o700)
    ends = {"a": f"ipc://{folder}/a.data.sock", "b": f"ipc://{folder}/b.data.sock"}
    a = ByteChannel("a", ends["a"], {"b": ends["b"]})
    b = ByteChannel("b", ends["b"], {"a": ends["a"]})

    def sender(channel: ByteChannel, chunk: int) -> None:
        def send(dest: str, job: int, nbytes: int, lane: int, ack: bool, port: int) -> None:
            for offset in range(0, nbytes, chunk):
                channel.send_chunk(dest, job, offset, min(chunk, nbytes - offset), offset + chunk >= nbytes, ack)

        channel.send = send

    sender(a, 1000)
    sender(b, 4096)
    return a, b


def test_the_byte_channel_pushes_and_pulls_verified_bytes(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = _channels(tmp_path)
        await a.open()
        await b.open()
        try:
            await asyncio.wait_for(a.push("b", 10_500, 2, 0), 5)  # done when b acknowledged every byte
            await asyncio.wait_for(a.pull("b", 9_000, 0, 0), 5)  # b sends; done when the last byte arrived
            await asyncio.wait_for(asyncio.gather(*(a.push("b", 3_333 + i, 2, 0) for i in range(20))), 5)
        finally:
            await a.close()
            await b.close()
        assert b.stats.received_bytes == b.stats.verified_bytes == 10_500 + sum(3_333 + i for i in range(20))
        assert a.stats.received_bytes == a.stats.verified_bytes == 9_000
        assert a.stats.mismatched_bytes == b.stats.mismatched_bytes == 0

    asyncio.run(main())


def test_the_byte_channel_rejects_bad_frames_and_counts_wrong_bytes(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = _channels(tmp_path)
        reads: list[tuple[int, list[int]]] = []
        b.on_pool = lambda node, flat: reads.append((node, flat))
        await b.open()
        context = zmq.Context()
        raw = context.socket(zmq.DEALER)
        raw.setsockopt(zmq.IDENTITY, b"a")
        raw.connect(b.bind)
        try:
            raw.send_multipart([b"\xc1not msgpack"])
            raw.send_multipart([msgpack.packb(["launch", 1])])
            raw.send_multipart([msgpack.packb(["data", 7, 0, True, False]), b"x" * 10])  # nobody pulled it
            # A chunk whose bytes are not the job's pattern: counted as mismatched, then acknowledged.
            raw.send_multipart([msgpack.packb(["data", 8, 0, True, True]), b"\0" * 100])
            raw.send_multipart([msgpack.packb(["pool", 2, [1, 0]])])  # a pool read's blocks are triples
            raw.send_multipart([msgpack.packb(["pool", 2, [1, 0, 4]])])
            for _ in range(200):
                await asyncio.sleep(0.01)
                if b.stats.rejected >= 4 and b.stats.mismatched_bytes and reads:
                    break
        finally:
            raw.close(linger=0)
            context.term()
            await b.close()
        assert b.stats.rejected == 4 and reads == [(2, [1, 0, 4])]
        assert b.stats.mismatched_bytes == 100 and b.stats.verified_bytes == 0

    asyncio.run(main())


def test_the_byte_channel_refuses_tcp_without_keys() -> None:
    from dualpath_emu.errors import SecurityError

    channel = ByteChannel("a", "tcp://127.0.0.1:0", {})

    async def main() -> None:
        with pytest.raises(SecurityError, match="keys"):
            await channel.open()

    asyncio.run(main())


def test_lanes_hold_on_real_bytes() -> None:
    # A 4 MiB collective on the model lane, 16 MiB of KV queued behind it on one real link paced at 100 MB/s:
    # with the paper's lane arbitration its bytes go first (the port lets through at most the KV chunks already
    # granted); in one FIFO with the KV it waits for the queued KV bytes first (up to 5x as long). Counted in
    # bytes the port let through, which CPU load does not change; the wall-clock latencies are checked when
    # the runs kept the pace (a loaded machine, here at load average 7 on 2 cores, makes them measure the CPU
    # instead: isolated/shared went from 0.2 to 0.9).
    from dualpath_emu.host.isolation import measure_isolation

    collective, kv, rate = 4 << 20, 4 << 20, 100e6
    result = measure_isolation(trials=8, collective_bytes=collective, kv_bytes=kv, rate=rate)
    ahead = result.kv_bytes_ahead
    assert ahead["unloaded"] == [(0, 0)] * 8, result
    # Isolated: KV was queued, and at most a chunk or two of it (granted in the same instant) went first.
    assert sum(q for q, _ in ahead["isolated"]) >= kv and max(a for _, a in ahead["isolated"]) <= collective // 16, (
        result
    )
    # Shared: one FIFO, so the collective waited for every KV byte queued before it.
    assert sum(q for q, _ in ahead["shared"]) >= kv and all(a >= q for q, a in ahead["shared"]), result
    assert result.kv_bytes_moved["isolated"] > 0 and result.kv_bytes_moved["unloaded"] == 0
    # The latencies, where every run kept the pace (its median within 1.5x of the paced time of the collective
    # and of what went before it): isolated about as fast as unloaded, shared as slow as the KV it waited for
    # (how much was queued depends on the load: not always 16 MiB).
    paced_s = {run: (collective + statistics.median(a for _, a in ahead[run])) / rate for run in ahead}
    if all(statistics.median(result.samples[run]) <= 1.5 * paced_s[run] for run in ahead):
        assert result.isolated_s <= 1.5 * result.unloaded_s, result
        assert result.shared_s >= 0.8 * result.unloaded_s * paced_s["shared"] / paced_s["unloaded"], result


@pytest.mark.parametrize("system", ["basic", "dualpath"])
def test_probing_the_model_by_kind_changes_nothing(system: str) -> None:
    # The model's side of the comparison times every data movement, write-backs included: the same run,
    # event for event.
    plain = run_system(config(), system, work(8, 6))
    probed = run_system(config(), system, work(8, 6), probe_paths=True)
    assert probed.event_log_sha256 == plain.event_log_sha256 and probed.jct_s == plain.jct_s
    paths = probed.extra["paths"]
    assert paths["write-back"]["count"] > 0 and paths["forward pass"]["count"] > 0
    assert "paths" not in plain.extra


def test_calibrate_host_writes_a_hardware_table_a_scenario_can_use(tmp_path: Path) -> None:
    from dualpath_emu.cli import main
    from dualpath_emu.cluster.scenario import load_cluster_scenario

    out = tmp_path / "host.toml"
    assert main(["calibrate-host", "--size-mib", "8", "--dir", str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert "byte_scale" in text and "[hardware]" in text and "[storage]" in text
    scenario_file = tmp_path / "like-this-host.toml"
    scenario_file.write_text('kind = "cluster"\n' + text)
    scenario = load_cluster_scenario(scenario_file)
    assert scenario.config.node.snic_bytes_per_s > 1e6 and scenario.config.storage.read_latency_s > 0
    assert not list(tmp_path.glob("dualpath-emu-calibrate-*"))  # its files are gone
    assert main(["calibrate-host", "--size-mib", "0"]) == 2


def _mooncake() -> None:
    from dualpath_emu.host.mooncake import MooncakeUnavailable, MooncakeWire

    try:
        MooncakeWire().close()
    except MooncakeUnavailable as error:
        pytest.skip(str(error))


def test_the_byte_channel_carries_bytes_through_mooncakes_transfer_engine(tmp_path: Path) -> None:
    _mooncake()

    async def main() -> None:
        a, b = _channels(tmp_path)
        a.engine = b.engine = "mooncake"
        await a.open()
        await b.open()
        try:
            # One-sided writes into b's region, then b writes into a's. (The limits only guard against a hang: a
            # loaded 2-core machine once took over 10 s to set up the transfer engine's first write.)
            await asyncio.wait_for(a.push("b", 3_000_000, 2, 0), 60)
            await asyncio.wait_for(a.pull("b", 1_500_000, 0, 0), 60)
        finally:
            await a.close()
            await b.close()
        assert b.stats.verified_bytes == 3_000_000 and a.stats.verified_bytes == 1_500_000
        assert a.stats.mismatched_bytes == b.stats.mismatched_bytes == 0

    asyncio.run(main())


@pytest.mark.processes
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_host_run_through_mooncakes_transfer_engine(tmp_path: Path, transport: str) -> None:
    _mooncake()
    result = host_run(tmp_path, "dualpath", transfer_engine="mooncake", transport=transport)
    host = result.extra["host"]
    assert result.turns == 24 and host["transfer_engine"] == "mooncake"
    assert host["network_bytes_sent"] == host["network_bytes_verified"] > 0 and host["mismatched_blocks"] == 0
    # Never hidden: the summary says the KV went over an unauthenticated engine, and where each one listened:
    # in the node processes alone, on the run's address (loopback here), read back from /proc by each.
    assert host["transfer_engine_unauthenticated"] is True
    listening = host["transfer_engine_listening"]
    assert set(listening) == {"pe0", "de1"}
    for addresses in listening.values():
        assert len(addresses) == 2 and all(a.rsplit(":", 1)[0] == "127.0.0.1" for a in addresses)
    # The scheduler's and the client's processes started none (the engine logs its start on standard error).
    run = tmp_path / "run"
    assert "Transfer Engine" in (run / "pe0.out").read_text()
    for name in ("scheduler", "client"):
        assert "Transfer Engine" not in (run / f"{name}.out").read_text()


def test_mooncakes_transfer_engine_listens_on_the_channels_address_alone(tmp_path: Path) -> None:
    _mooncake()
    from dualpath_emu.host.mooncake import MooncakeUnavailable, MooncakeWire, confine_binds, listening_sockets

    before = set(listening_sockets())
    wire = MooncakeWire("127.0.0.1")
    try:
        mine = {(a, p) for a, p in listening_sockets() if (a, p) not in before}
        # Its handshake and its TCP transport (which it binds to 0.0.0.0 and [::] unless confined), each on
        # loopback: not reachable from another host.
        assert len(mine) == 2 and {a for a, _ in mine} == {"127.0.0.1"}
        assert sorted(f"{a}:{p}" for a, p in mine) == wire.listening
        assert wire.endpoint.startswith("127.0.0.1:")
    finally:
        wire.close()
    # Every interface is refused, not started.
    for host in ("0.0.0.0", "::"):
        with pytest.raises(MooncakeUnavailable, match="no authentication"):
            confine_binds(host)


def test_a_missing_transfer_engine_is_one_line_naming_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import builtins

    from dualpath_emu.cli import main

    real_import = builtins.__import__

    def no_mooncake(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("mooncake"):
            raise ImportError("No module named 'mooncake'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_mooncake)
    status = main(["run", "ds27b-1p1d-offline", "--backend", "host", "--set", 'host.transfer_engine="mooncake"',
                   "--agents", "2", "--set", "workload.max_rounds=1", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "mooncake-transfer-engine-non-cuda" in err and "libibverbs1" in err


@pytest.mark.processes
def test_a_one_process_host_run_sends_its_nodes_bytes_to_itself(tmp_path: Path) -> None:
    result = host_run(tmp_path, "dualpath", placement_kind="single")
    host = result.extra["host"]
    assert result.turns == 24 and result.extra["processes"] == 1
    assert host["network_bytes_sent"] == host["network_bytes_verified"] > 0 and host["mismatched_blocks"] == 0


def test_a_pacer_hands_its_callbacks_errors_on_instead_of_losing_them() -> None:
    # A pacer runs on loop callbacks, whose exceptions asyncio would only log (the run would then wait for
    # bytes that never come): an error goes to on_error, which the host data plane turns into the run's end.
    from dualpath_emu.host.pacing import Pacer

    errors: list[Exception] = []

    def broken(grants: list[tuple[int, int, int, bool]]) -> None:
        raise ConnectionError("no route")

    async def main() -> None:
        pacer = Pacer(1e6, 1000, time.monotonic_ns, broken, on_error=errors.append)
        pacer.start(asyncio.get_running_loop())
        pacer.enqueue(2, 5000, 1)
        await asyncio.sleep(0.05)
        pacer.stop()

    asyncio.run(main())
    assert len(errors) == 1 and isinstance(errors[0], ConnectionError)


@pytest.mark.processes
def test_a_host_run_started_by_hand_on_two_hosts_shares_only_its_storage(tmp_path: Path) -> None:
    # Two "hosts" on this machine, 127.0.0.1 (client, scheduler) and 127.0.0.2 (the engine groups), each with
    # its own copy of the run directory; CURVE on every tcp socket, the byte channels' included; the KV blocks
    # in one directory both mount, as a 3FS or NFS mount would be.
    import shutil

    from dualpath_emu.cluster.live import collect_dir, host_commands, prepare_live

    host_a, host_b, shared = tmp_path / "a", tmp_path / "b", tmp_path / "kv"
    shared.mkdir(mode=0o700)
    with pytest.raises(ValueError, match="storage_dir"):
        prepare_live(config(), SYSTEMS["dualpath"], work(), run_dir=tmp_path / "x", backend="host")
    commands = prepare_live(config(), SYSTEMS["dualpath"], work(), run_dir=host_a, hosts=[("pe*", "127.0.0.2"),
                            ("de*", "127.0.0.2")], port_base=47_500, backend="host", byte_scale=SCALE,
                            storage_dir=str(shared))  # fmt: skip
    assert "dataplane" not in {name for _, name, _ in commands} and commands[-1][1] == "client"
    run_toml = (host_a / "run.toml").read_text()
    assert 'backend = "host"' in run_toml and 'data_endpoint = "tcp://127.0.0.2:' in run_toml
    shutil.copytree(host_a, host_b)
    per_host = host_commands(host_a, commands)
    codes = launch_per_host(per_host, {"127.0.0.1": host_a, "127.0.0.2": host_b}, timeout_s=90)
    assert codes == [0] * len(per_host)
    gather_parts(host_b, host_a, ("pe0", "de1"))
    result, _ = collect_dir(host_a)  # every request ended once, every byte accounted, or it raises
    host = result.extra["host"]
    assert result.turns == 24 and result.extra["backend"] == "host" and result.extra["processes"] == 4
    assert host["verified_read_bytes"] > 0 and host["mismatched_blocks"] == 0
    assert host["network_bytes_sent"] == host["network_bytes_verified"] > 0
    assert not list(shared.glob("ctx-*.kv"))  # collect removed the run's blocks


@pytest.mark.processes
def test_a_bounded_store_on_the_host_backend_cuts_the_real_block_files(tmp_path: Path) -> None:
    # The scheduler's process evicts: the contexts' block files are cut after the blocks kept, and every block a
    # later turn reads is still there and verified (none read back differs, none is waited for in vain).
    import dataclasses

    from dualpath_emu.cluster.config import BLOCK_TOKENS, KvTierSpec

    plain = run_system(config(), "dualpath", work())
    bounded = dataclasses.replace(config(), kv_store=KvTierSpec(int(plain.working_set_bytes["max"] / 3), "lru"))
    result = run_live(bounded, SYSTEMS["dualpath"], work(), run_dir=tmp_path / "run", backend="host",
                      byte_scale=SCALE, timeout_s=120.0)  # fmt: skip
    host, kv = result.extra["host"], result.extra["kv"]["store"]
    assert result.complete and result.turns == 24 and kv["evictions"] > 0 and kv["recomputed_tokens"] > 0
    evicted_blocks = kv["evicted_bytes"] // (BLOCK_TOKENS * MODELS["ds27b"].kv_bytes_per_token)
    assert 0 < host["discarded_blocks"] <= evicted_blocks  # (a block evicted before its write-back landed: none)
    assert host["mismatched_blocks"] == 0 and host["bytes_read"] == host["verified_read_bytes"] > 0


@pytest.mark.processes
@pytest.mark.parametrize("write", ["through", "back"])
def test_sglmc_reads_its_pool_over_the_byte_channel_and_storage_for_what_the_pool_lacks(
    tmp_path: Path, write: str
) -> None:
    # A pool's hits cross from the decode node that holds them to the prefill node as real bytes, verified on
    # arrival; what a small pool lacks is read from the block files. Written back, the blocks a later turn reads
    # from the files were written there by the decode node when the pool dropped them, and every read verifies.
    import dataclasses

    from dualpath_emu.cluster.config import KvPoolSpec

    plain = run_system(config(), "sglmc", work())
    small = dataclasses.replace(config(), kv_pool=KvPoolSpec(int(plain.working_set_bytes["max"] / 6), write=write))
    result = run_live(small, SYSTEMS["sglmc"], work(), run_dir=tmp_path / "run", backend="host",
                      byte_scale=SCALE, timeout_s=120.0)  # fmt: skip
    host, kv = result.extra["host"], result.extra["kv"]["pool"]
    assert result.complete and result.turns == 24 and kv["evictions"] > 0 and 0 < kv["found_rate"] < 1
    kinds = {kind for kind, row in host["paths"].items() if row["count"] > 0}
    assert {"pool read", "storage read (PE)"} <= kinds and "storage read (DE)" not in kinds
    assert host["network_bytes_sent"] == host["network_bytes_verified"] > 0 and host["mismatched_blocks"] == 0
    assert host["bytes_read"] == host["verified_read_bytes"] > 0
    # The pool is real memory in the decode nodes' processes: every block it was given, dropped and read is there,
    # intact; it never held more than its capacity.
    pool = host["dram_pool"]
    block = BLOCK_TOKENS * MODELS["ds27b"].kv_bytes_per_token
    assert pool["mismatched_blocks"] == 0 and pool["blocks_dropped"] == kv["evicted_bytes"] // block > 0
    assert pool["blocks_put"] == kv["stored_bytes"] // block and pool["blocks_held_at_end"] == kv["end_bytes"] // block
    assert pool["blocks_read_checked"] * block >= kv["found_bytes"] * 0.9 > 0
    if write == "back":  # every storage write is a write-back of blocks the pool dropped
        assert kv["write_backs"] > 0 and result.snic_write_bytes["de"] == pytest.approx(kv["written_back_bytes"])
        row = host["paths"]["write-back"]
        assert row["count"] * row["mean_modelled_bytes"] == pytest.approx(kv["written_back_bytes"])


@pytest.mark.processes
def test_retention_on_the_host_backend_moves_kept_hits_from_the_decode_process_as_real_bytes(tmp_path: Path) -> None:
    virtual = run_system(config(), "dualpath+retention", work())
    result = host_run(tmp_path, "dualpath+retention")
    host, kv = result.extra["host"], result.extra["kv"]["hbm"]
    assert result.complete and result.turns == virtual.turns and kv["taken_bytes"] > 0 and kv["found_rate"] > 0.5
    assert host["network_bytes_sent"] == host["network_bytes_verified"] > 0 and host["mismatched_blocks"] == 0
    kinds = {kind for kind, row in host["paths"].items() if row["count"] > 0}
    assert "DE→PE" in kinds  # the kept hits, from the decode GPU's HBM into the prefill GPU's, layer by layer


@pytest.mark.processes
def test_the_host_backend_takes_the_networks_lanes_vl_tables_and_buckets(tmp_path: Path) -> None:
    # Isolation off (the engines put every transfer in the KV's lane), equal VL tables (the compute NICs' pacers
    # arbitrate by them) and a bucket (paced at its sustained rate): the run moves and verifies its bytes as ever.
    import dataclasses

    from dualpath_emu.cluster.topology import NetworkSpec, TokenBucket, VlTables

    rate = config().node.snic_bytes_per_s * config().node.snics
    net = NetworkSpec(False, VlTables(4, 0, "", "0:1,2:1"), (), (TokenBucket(("n0.snic.rx",), rate / 2, 1e6),))
    result = run_live(dataclasses.replace(config(), network=net), SYSTEMS["dualpath"], work(), run_dir=tmp_path / "run",
                      backend="host", byte_scale=SCALE, timeout_s=120.0)  # fmt: skip
    host = result.extra["host"]
    assert result.complete and host["mismatched_blocks"] == 0 and host["bytes_read"] == host["verified_read_bytes"] > 0
    assert host["network_bytes_sent"] == host["network_bytes_verified"] > 0


@pytest.mark.processes
def test_split_reads_on_the_host_backend_read_each_part_on_its_side_and_verify_it(tmp_path: Path) -> None:
    virtual = run_system(config(), "dualpath-split", work())
    result = host_run(tmp_path, "dualpath-split")
    host = result.extra["host"]
    assert result.complete and result.turns == virtual.turns
    assert host["mismatched_blocks"] == 0 and host["bytes_read"] == host["verified_read_bytes"] > 0
    kinds = {kind for kind, row in host["paths"].items() if row["count"] > 0}
    assert {"storage read (PE)", "storage read (DE)", "DE→PE"} <= kinds
