"""A node whose storage NIC is down cannot reach its storage, for real, on the host backend (issue 26).

Each node's process reaches the shared storage directory through its own views (``StorageView``: a directory
descriptor per direction of its storage NIC, resolved once); while a fault holds the port at 0, the view is a
removed directory's and every open of a block file through it fails with ENOENT from the kernel (processes run
as root here: file permissions would stop nothing). Reads and write-backs that meet it wait for the view and
try again; none fails, none is a block read back wrong. An I/O error where no fault acts still fails the run,
saying so. The store's counters of those ENOENTs are in each process's part file (``<process>.part``)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest

from dualpath_emu.cluster.faults import Fault, FaultPlan
from dualpath_emu.cluster.live import run_live
from dualpath_emu.cluster.run import SystemResult
from dualpath_emu.cluster.systems import SYSTEMS
from dualpath_emu.host.storage import BlockStore, HostStorageError
from dualpath_emu.runtime.launcher import LaunchError

from tests.host.test_host_backend import SCALE, config, work

pytestmark = pytest.mark.host

NS = 1_000_000_000
KIB = 1024


# --- the store ----------------------------------------------------------------------------------------------


def test_a_view_taken_away_cannot_open_its_files_and_its_read_waits_while_another_view_reads_on(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 4 * KIB) as store:
        down, other = store.view("n0.snic.rx"), store.view("n1.snic.rx")
        asyncio.run(store.write(1, 0, 4))
        entries = sorted(os.listdir(tmp_path))

        async def go() -> tuple[Any, Any]:
            store.take_away(down)
            with pytest.raises(FileNotFoundError):  # the kernel's answer, to root too
                os.open("ctx-00000001.kv", os.O_RDONLY, dir_fd=down.fd)
            # wait_s=0: a block "not there yet" would be read back wrong at once; one behind a view away waits.
            blocked = asyncio.ensure_future(store.read(1, 0, 4, wait_s=0.0, view=down))
            read = await store.read(1, 0, 4, wait_s=0.0, view=other)
            await asyncio.sleep(0.2)
            assert not blocked.done()
            assert sorted(os.listdir(tmp_path)) == entries  # nothing on disk stands for the view
            store.give_back(down)
            return read, await blocked

        read, blocked = asyncio.run(go())
        assert (read.verified_blocks, read.unreachable) == (4, 0)
        assert (blocked.verified_blocks, blocked.mismatched_blocks, blocked.retries) == (4, 0, 0)
        assert blocked.unreachable >= 4 and 0.15 < blocked.unreachable_s < 2.0
        stats = store.stats()
        assert stats["read_unreachable"] == blocked.unreachable and stats["mismatched_blocks"] == 0
        assert stats["views_away"] == 0 and stats["unreachable_max_s"] == pytest.approx(blocked.unreachable_s)


def test_a_write_back_through_a_view_taken_away_lands_when_it_is_back(tmp_path: Path) -> None:
    with BlockStore(tmp_path, 4 * KIB) as store:
        view = store.view("n1.snic.tx")

        async def go() -> Any:
            store.take_away(view)
            write = asyncio.ensure_future(store.write(2, 0, 3, view=view))
            await asyncio.sleep(0.1)
            assert not write.done() and not store.path(2).exists()
            assert store.stats()["views_away"] == 1
            store.give_back(view)
            return await write

        written = asyncio.run(go())
        assert written.unreachable >= 1 and written.unreachable_s > 0.05
        assert asyncio.run(store.read(2, 0, 3, view=view)).verified_blocks == 3
        assert store.stats()["write_unreachable"] == written.unreachable


def test_a_write_whose_open_went_through_the_view_just_before_it_came_back_opens_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The open runs on a pool thread: it may fail through the view away, the view be back before the thread
    # looks (an O_CREAT that fails with the directory there). Opened once more, not an error.
    with BlockStore(tmp_path, 4 * KIB) as store:
        view = store.view("n1.snic.tx")
        real_open = os.open
        failed: list[object] = []

        def once(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if str(path).startswith("ctx-") and not failed:
                failed.append(path)
                raise FileNotFoundError(2, "No such file or directory")
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", once)
        assert asyncio.run(store.write(1, 0, 2, view=view)).unreachable == 0 and failed
        assert asyncio.run(store.read(1, 0, 2, view=view)).verified_blocks == 2


def test_reach_tries_the_storage_until_the_view_is_back_and_costs_nothing_when_it_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[object] = []
    real_open = os.open

    def spy(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).startswith("ctx-"):
            opened.append(path)
        return real_open(path, flags, *args, **kwargs)

    with BlockStore(tmp_path, 4 * KIB) as store:
        view = store.view("n0.snic.rx")
        monkeypatch.setattr(os, "open", spy)
        assert asyncio.run(store.reach(view, 1)) == 0.0 and opened == []  # there: no syscall at all

        async def go() -> float:
            store.take_away(view)
            reach = asyncio.ensure_future(store.reach(view, 1))
            await asyncio.sleep(0.1)
            store.give_back(view)
            return await reach

        waited = asyncio.run(go())
        assert 0.08 < waited < 1.0 and store.stats()["read_unreachable"] == len(opened) - 1 >= 2


def test_through_a_view_a_read_opens_its_file_as_often_as_by_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cost of views when no fault acts: an openat relative to the view's descriptor in place of an open by
    # path, one per chunk either way (no stat, no lookup of the view).
    with BlockStore(tmp_path, 4 * KIB) as store:
        view = store.view("n0.snic.rx")
        asyncio.run(store.write(1, 0, 8))
        calls: list[tuple[object, object]] = []
        real_open = os.open

        def spy(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            calls.append((path, kwargs.get("dir_fd")))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", spy)
        asyncio.run(store.read(1, 0, 8))
        by_path, calls[:] = list(calls), []
        asyncio.run(store.read(1, 0, 8, view=view))
        assert len(calls) == len(by_path) == 1 and calls[0] == ("ctx-00000001.kv", view.fd)


def test_a_storage_directory_gone_is_an_error_saying_so_not_a_block_read_back_wrong(tmp_path: Path) -> None:
    root = tmp_path / "kv"
    root.mkdir()
    with BlockStore(root, 4 * KIB) as store:
        view = store.view("n0.snic.rx")
        asyncio.run(store.write(1, 0, 2, view=view))
        shutil.rmtree(root)
        with pytest.raises(HostStorageError, match=r"read .*ctx-00000001\.kv .*the storage directory .* is gone"):
            asyncio.run(store.read(1, 0, 2, wait_s=0.05, view=view))
        with pytest.raises(HostStorageError, match=r"write .*ctx-00000002\.kv .*No such file.* is gone"):
            asyncio.run(store.write(2, 0, 1, view=view))
        assert store.stats()["mismatched_blocks"] == 0


def test_closing_the_store_gives_its_views_back(tmp_path: Path) -> None:
    store = BlockStore(tmp_path, 4 * KIB)
    view = store.view("n0.snic.rx")
    store.take_away(view)
    store.close()
    assert not view.away and store.stats()["views_away"] == 0
    with pytest.raises(HostStorageError, match="closed"):
        store.view("n1.snic.rx")


# --- host runs ----------------------------------------------------------------------------------------------


def host_run(tmp_path: Path, system: str, *faults: Fault, read_timeout_s: float = 30.0) -> SystemResult:
    cluster = dataclasses.replace(config(), faults=FaultPlan(faults), read_timeout_s=read_timeout_s)
    return run_live(
        cluster, SYSTEMS[system], work(), run_dir=tmp_path / "run", backend="host", byte_scale=SCALE, timeout_s=120.0
    )


def store_stats(tmp_path: Path, process: str) -> dict[str, Any]:
    """What a process's block store counted (its part file: the run's summary sums the integer ones only)."""
    part = msgpack.unpackb((tmp_path / "run" / f"{process}.part").read_bytes(), strict_map_key=False)
    return part["host"]["store"]  # type: ignore[no-any-return]


def check_real_bytes(result: SystemResult) -> None:
    """Every turn ended (once: collect raises otherwise), every block read back verified, none wrong."""
    assert result.turns == 24 and result.complete and result.failed_requests == 0
    host = result.extra["host"]
    assert host["mismatched_blocks"] == 0 and host["blocks_read"] > 0


@pytest.mark.processes
def test_a_node_whose_storage_nic_is_down_cannot_open_its_block_files_and_dualpath_reads_on_the_other_side(
    tmp_path: Path,
) -> None:
    # Decode node 1's storage NIC is down from 0.5 s to 3 s: its process's views are away, and each of its
    # write-backs meanwhile tried its file and got ENOENT from the kernel, again and again, until the NIC was
    # back; then they landed and were read back verified. The prefill process was not touched (its reads
    # went on, none failed to open), and the hits of requests scheduled meanwhile were read there.
    result = host_run(tmp_path, "dualpath", Fault("down", "n1.snic", 0.5, 2.5))
    check_real_bytes(result)
    decode, prefill = store_stats(tmp_path, "de1"), store_stats(tmp_path, "pe0")
    assert decode["write_unreachable"] > 10 and decode["unreachable_max_s"] > 1.5
    assert decode["blocks_written"] > 0 and decode["mismatched_blocks"] == 0
    assert prefill["read_unreachable"] == prefill["write_unreachable"] == 0 and prefill["blocks_read"] > 0
    assert decode["views_away"] == prefill["views_away"] == 0  # back after the run
    m, start_ns = result.metrics, round(result.extra["emulated_start_s"] * NS)
    when = [(m.scheduled_de_ns[r] - start_ns) / NS for r in range(len(m))]
    during = [r for r in range(len(m)) if 0.6 < when[r] < 2.9 and m.hit[r] > 0]
    assert during and all(m.read_on_de[r] == 0 for r in during)


@pytest.mark.processes
def test_basic_reads_on_an_unreachable_storage_wait_or_are_given_up_and_dispatched_again(tmp_path: Path) -> None:
    # Basic has one path: prefill node 0's storage NIC down from 0.5 s to 2 s, its hit reads there meet ENOENT
    # and wait; those still stalled after read_timeout_s (1 s) are given up and their requests dispatched
    # again (to node 0 again: 1P1D), and the late completions of the given-up reads, when the view is back,
    # are ignored. Every request ends, done; the decode process's storage was never unreachable.
    result = host_run(tmp_path, "basic", Fault("down", "n0.snic", 0.5, 1.5), read_timeout_s=1.0)
    check_real_bytes(result)
    assert result.redispatches > 0
    prefill, decode = store_stats(tmp_path, "pe0"), store_stats(tmp_path, "de1")
    assert prefill["read_unreachable"] > 10 and prefill["unreachable_max_s"] > 0.5
    assert decode["read_unreachable"] == decode["write_unreachable"] == 0 and decode["blocks_written"] > 0
    assert prefill["views_away"] == decode["views_away"] == 0


@pytest.mark.processes
def test_a_storage_nic_down_to_the_end_of_the_run_gets_its_view_back_when_the_run_ends(tmp_path: Path) -> None:
    # Prefill node 0's storage NIC is down from 0.5 s on, never back (Basic, read_timeout_s 1 s): each request
    # read there is given up and dispatched again until it fails (after 3), so the run ends; the reads given up
    # still waiting for the view then are let go by the end of the faults -- the view back -- and complete,
    # ignored, every byte accounted (collect raises otherwise) and none read back wrong.
    result = host_run(tmp_path, "basic", Fault("down", "n0.snic", 0.5, None), read_timeout_s=1.0)
    assert result.failed_requests > 0 and result.redispatches >= 3 * result.failed_requests
    assert result.extra["host"]["mismatched_blocks"] == 0
    prefill = store_stats(tmp_path, "pe0")
    assert prefill["read_unreachable"] > 10 and prefill["views_away"] == 0 and prefill["mismatched_blocks"] == 0


@pytest.mark.processes
def test_an_io_error_where_no_fault_acts_fails_the_run_saying_so(tmp_path: Path) -> None:
    # Prefill node 0's storage NIC rx is down from 0.5 s to the end of the run (its reads wait for it); a
    # second after the first blocks are written, the storage directory is removed: a real I/O error on nodes no
    # fault holds down. The run fails, saying which node, that no fault holds it down and that the storage
    # directory is gone -- not a block read back wrong, not a wait to the run's timeout.
    storage = tmp_path / "run" / "storage"

    def remove() -> None:
        deadline = time.monotonic() + 60
        while len(list(storage.glob("ctx-*.kv"))) < 3:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        time.sleep(1.0)
        while storage.exists():  # (a write-back may create a file while it goes)
            shutil.rmtree(storage, ignore_errors=True)

    threading.Thread(target=remove, daemon=True).start()
    with pytest.raises(LaunchError) as caught:
        host_run(tmp_path, "dualpath", Fault("down", "n0.snic.rx", 0.5, None))
    message = str(caught.value)
    assert "storage failed (no fault holds its storage NIC down)" in message, message
    assert f"the storage directory {storage} is gone" in message, message
    assert "read back wrong" not in message and "Traceback" not in message, message
