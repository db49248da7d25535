"""An engine crash wipes a decode node's stepping (``decode_reset``, issue 26): every request dropped, the
wake-ups called off, the GPUs' busy spans closed and reported, the bytes already moved kept.

The core's reset (``Core.decode_reset``) through the in-process plane and through a whole scripted run
(:meth:`DecodeSteps.reset`), and the data-plane service's ``fault`` frame (``decode_reset``) from a remote
plane. The node's own mechanics are
tested in ``core/tests/decode.rs``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import msgpack  # type: ignore[import-untyped]
import pytest

from dualpath_emu._core import Core
from dualpath_emu.cluster.catalog import MODELS, TESTBED_NODE
from dualpath_emu.cluster.config import ClusterConfig, Derived, derived
from dualpath_emu.cluster.decode import DecodeSteps, DecodingRequest
from dualpath_emu.cluster.ledger import Booking, Ledger
from dualpath_emu.cluster.topology import MODEL_LANE, Topology, build_topology
from dualpath_emu.runtime.dataplane.protocol import PROTOCOL_VERSION as V
from dualpath_emu.runtime.dataplane.protocol import DetachedRequestError, decode_frame
from dualpath_emu.runtime.dataplane.remote import run_remote
from dualpath_emu.runtime.engine import Then
from dualpath_emu.runtime.virtual import CoreDataPlane, VirtualDriver
from tests.runtime.test_dataplane import build_core, decode_spec, raw_peer, remote, service

MS = 1_000_000
Span = tuple[int, int, int, int, int]


def config(model: str) -> ClusterConfig:
    """One PE node and a decode EP group of two nodes of two GPUs (DS 27B's all-to-all crosses the network)."""
    node = dataclasses.replace(TESTBED_NODE, gpus=2)
    return ClusterConfig(model=MODELS[model], node=node, pe_nodes=1, de_nodes=2, prefill_ep_nodes=1, decode_ep_nodes=2)


class Listener:
    """A decode group that records what ended, ``(now, rid, second_token_ns)``."""

    def __init__(self) -> None:
        self.ended: list[tuple[int, int, int]] = []

    def decoded(self, now: int, request: DecodingRequest) -> None:
        self.ended.append((now, request.rid, request.second_token_ns))

    def stepped(self, now: int) -> None:
        pass


def steps_of(
    d: Derived, topo: Topology, plane: Ledger, booking: Booking, listener: Listener,
    busy_span: Callable[[int, int, int, int, int], None],
) -> DecodeSteps:  # fmt: skip
    """Decode node 1 (GPUs 0 and 1), built as ``cluster/decode.py`` builds it, its all-to-all to node 2."""
    node, gpus = 1, 2
    together = d.model.moe_layers > 0 and d.decode.ep_degree > 1
    a2a = d.decode.a2a_remote_bytes_per_token * d.model.moe_layers
    a2a_paths = [topo.gpu_to_gpu(node, g, 2, g) for g in range(gpus)]
    d2h_paths = [topo.d2h(node, g) for g in range(gpus)]
    write = (topo.nodes[node].storage_node, topo.storage_io_path(node, "write"))
    return DecodeSteps(
        node, gpus, pricing=d.decode.decode_pricing(), together=together, kv_bytes_per_token=d.kv_bytes_per_token,
        a2a_bytes_per_token=a2a, a2a_paths=a2a_paths, d2h_paths=d2h_paths, storage=write, plane=plane,
        booking=booking, listener=listener, busy_span=busy_span,
    )  # fmt: skip


def request(rid: int, gpu: int, prompt: int, gen: int) -> DecodingRequest:
    return DecodingRequest(rid, prompt=prompt, gen=gen, gpu=gpu, stored_blocks=prompt // 64, context=rid)


# --- a reset in the middle of a run ----------------------------------------------------------------------------


def run_with_a_reset(model: str) -> dict[str, Any]:
    """Requests join (some mid-step), some end, the engine crashes mid-step while others decode, new ones join
    (one at the instant of the crash), and the run goes to its end."""
    cfg = config(model)
    d = derived(cfg)
    core = Core()
    topo = build_topology(core, cfg.node, cfg.pe_nodes, cfg.de_nodes, cfg.storage)
    driver = VirtualDriver(core)
    booking = Booking()
    plane = Ledger(driver.plane, topo, booking)
    listener = Listener()
    spans: list[Span] = []
    steps = steps_of(d, topo, plane, booking, listener, lambda *span: spans.append(span))
    step_ns = round(d.decode.ep_decode_step_s([(1, 5000)]) * 1e9)
    reset_at = 12 * step_ns + step_ns // 3  # mid-step
    dropped: list[int] = []

    def joins(*requests: DecodingRequest) -> Then:
        def join(now: int) -> None:
            for r in requests:
                steps.join(now, r)

        return join

    script: list[tuple[int, Then]] = [
        (0, joins(*(request(rid, rid % 2, 5000 + 300 * rid, gen) for rid, gen in enumerate((5, 8, 40, 60))))),
        (3 * step_ns + step_ns // 2, joins(request(4, 1, 9000, 30))),  # mid-step
        (reset_at, lambda now: dropped.append(steps.reset(now))),
        (reset_at, joins(request(5, 0, 7000, 12))),  # at the crash, after it
        (reset_at + 5 * step_ns, joins(request(6, 0, 4000, 20), request(7, 1, 4000, 20))),
    ]
    remaining = len(script)

    def scripted(then: Then) -> Then:
        def run(now: int) -> None:
            nonlocal remaining
            remaining -= 1
            then(now)

        return run

    for at_ns, then in script:
        driver.plane.timer(at_ns, scripted(then))
    driver.run(lambda: remaining == 0 and len(listener.ended) == 5)  # 0 and 1 before the crash, 5, 6, 7 after
    core.run_until_idle()  # the write-backs and all-to-all still moving, and the stale wake-ups
    core.take_completions()
    ports = {p: cast(list[int], core.port_counters(p)["completed_bytes"]) for p in range(core.port_count)}
    return {
        "ended": listener.ended, "spans": sorted(spans), "dropped": dropped, "booked": booking.bytes,
        "transfers": booking.transfers, "ports": ports, "reset_at": reset_at,
    }  # fmt: skip


@pytest.mark.parametrize("model", ["ds27b", "qwen32b"])
def test_a_reset_mid_step_drops_what_decodes_and_the_node_goes_on_empty(model: str) -> None:
    core = run_with_a_reset(model)
    assert sorted(rid for _, rid, _ in core["ended"]) == [0, 1, 5, 6, 7]  # 2, 3 and 4 were decoding at the crash
    assert core["dropped"] == [3]
    reset_at = core["reset_at"]
    assert {unit for unit, _, end, _, _ in core["spans"] if end == reset_at} == {2, 3}  # node 1's two GPUs
    assert all(second < reset_at or second > reset_at for _, _, second in core["ended"])
    # Every byte accounted: what the core finished on each port and lane is what was booked, no more.
    for port, completed in core["ports"].items():
        for lane, size in enumerate(completed):
            assert size == core["booked"].get((port, lane), 0), (port, lane)
    if model == "ds27b":  # the all-to-all crossed the network (the model's lane)
        assert any(size for (_, lane), size in core["booked"].items() if lane == MODEL_LANE)


# --- the in-process core's data plane ------------------------------------------------------------------------


def test_a_reset_through_the_virtual_plane_reports_its_spans_at_once_and_forgets_what_ended_before_it() -> None:
    cfg = config("ds27b")
    d = derived(cfg)
    core = Core()
    topo = build_topology(core, cfg.node, cfg.pe_nodes, cfg.de_nodes, cfg.storage)
    due: list[Then] = []
    raw = CoreDataPlane(core, due.append)
    booking = Booking()
    listener = Listener()
    spans: list[Span] = []
    steps = steps_of(d, topo, Ledger(raw, topo, booking), booking, listener, lambda *span: spans.append(span))

    def run_due() -> None:
        while due:
            due.pop(0)(core.now_ns)

    steps.join(0, request(1, 0, 5118, 4))  # its first step completes a Full Block (5,120 tokens)
    steps.join(0, request(2, 1, 6000, 5))  # joins at the first step's end, would end 2 steps after request 1
    raw.flush()
    raw.deliver(core.advance_until(2**64 - 1))  # request 1 ended: its report is due, not yet run
    ended_at = core.now_ns
    assert len(due) == 1 and listener.ended == []
    moved = raw.decode_bytes(0)
    assert moved is not None and moved["written"][1] > 0
    # The crash comes at the same instant, before the report is read: request 1's end is dropped with the rest.
    assert steps.reset(ended_at) == 2
    assert len(due) == 2  # the report of the spans the reset closed, due now
    run_due()
    assert listener.ended == []
    # GPU 0's span closed when request 1 ended, GPU 1's (since request 2 joined) by the reset.
    assert [(unit, end, batch) for unit, _, end, batch, _ in sorted(spans)] == [(2, ended_at, 1), (3, ended_at, 1)]
    assert sorted(spans)[1][1] > 0
    assert raw.decode_bytes(0) == moved  # what was moved stays moved
    # A report that crossed the crash (a remote core's, in flight) names requests the node forgot: ignored.
    steps._report(ended_at, [(2, 5)], [])
    assert listener.ended == []
    # After it, requests join as on a new node: a stale wake-up (request 2's) neither ends nor re-times them.
    core.advance_until(ended_at + MS)
    steps.join(core.now_ns, request(3, 0, 5000, 4))
    raw.flush()
    while not listener.ended:
        raw.deliver(core.advance_until(2**64 - 1))
        run_due()
    [(now, rid, second)] = listener.ended
    step_ns = round(d.decode.ep_decode_step_s([(1, 5001)]) * 1e9)  # a new node's first step: 5000 + 1 tokens
    assert rid == 3 and second == ended_at + MS + step_ns and now == ended_at + MS + 3 * step_ns


def test_the_core_call_drops_what_a_node_holds_and_says_how_many() -> None:
    core = Core()
    build_core(core)
    ids = {"link": core.port_id("link"), "nic": core.port_id("nic"), "node0": core.storage_node_id("node0")}
    node = core.add_decode_node(**decode_spec(ids), report_tag=9)
    # The first starts a step; the other two wait to join at its end.
    core.submit_decode_joins([(node, 0, rid, 1000, 50, 1, 0, rid) for rid in range(3)])
    core.advance_to(MS)
    assert core.pending() == 3
    assert core.decode_reset(node) == 3
    assert core.pending() == 0
    [completion] = core.take_completions()
    assert completion[:2] == ("decoded", 9) and completion[3] == MS
    ended, spans = core.take_decoded(node)
    assert ended == [] and [(unit, start, end, batch) for unit, start, end, batch, _ in spans] == [(0, 0, MS, 1)]
    assert core.decode_reset(node) == 0 and core.take_completions() == []
    with pytest.raises(Exception, match="unknown decode node"):
        core.decode_reset(node + 1)


# --- the data-plane service -----------------------------------------------------------------------------------


@pytest.fixture
def directory() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dpr") as path:  # short: ipc:// paths are limited to ~100 bytes
        yield Path(path)


def test_a_remote_plane_resets_its_decode_node_in_the_services_core(directory: Path) -> None:
    with service(directory) as svc:
        plane = remote(svc.endpoint)
        ids = {"link": plane.layout.port_id("link"), "nic": plane.layout.port_id("nic")}
        ids["node0"] = plane.layout.storage_node_id("node0")

        async def main() -> tuple[list[tuple[list[Any], list[Any]]], dict[str, Any] | None, dict[str, Any] | None]:
            reports: list[tuple[list[Any], list[Any]]] = []
            heard = asyncio.Event()

            def report(done: list[Any], spans: list[Any]) -> None:
                reports.append((done, spans))
                heard.set()

            async def next_report() -> tuple[list[Any], list[Any]]:
                heard.clear()
                await asyncio.wait_for(heard.wait(), 10.0)
                return reports[-1]

            node = plane.decode_node(report, decode_spec(ids))
            plane.decode_join(node, 0, 7, 2000, 3, 1, 0, 70)  # ends after 2 steps
            plane.decode_join(node, 0, 8, 3000, 100_000, 1, 0, 80)  # would decode for minutes
            done, _ = await next_report()
            assert [rid for rid, _ in done] == [7]
            before = plane.decode_bytes(node)
            with pytest.raises(LookupError, match="never added"):
                plane.decode_reset(node + 1000)
            plane.decode_reset(node)
            done, spans = await next_report()  # the span the reset closed
            assert done == [] and len(spans) >= 1 and spans[-1][3] == 1  # request 8 alone, since 7 ended
            plane.decode_join(node, 0, 9, 2000, 3, 1, 0, 90)
            done, _ = await next_report()
            assert [rid for rid, _ in done] == [9]
            assert await plane.say_bye()
            return reports, before, plane.decode_bytes(node)

        reports, before, after = run_remote(main(), plane)
        svc.join()
    assert all(rid != 8 for done, _ in reports for rid, _ in done)
    assert before is not None and after is not None and after["written"][0] > before["written"][0] > 0
    # The service drained: the reset left no request in its core (the stale wake-up holds nothing up).
    assert svc.outcome == "drained" and svc.report is not None
    assert svc.report["pending"] == 0 and svc.report["counters"]["refused"] == 0
    assert svc.report["counters"]["rejected"] == 0


RESET_FRAMES: dict[str, bytes] = {
    "fault.port: expected nil for a decode_reset": msgpack.packb([V, "fault", 1, 0, "decode_reset", 5]),
    "fault.value": msgpack.packb([V, "fault", 2, None, "decode_reset", "five"]),
    "fault.what: expected 'factor', 'latency' or 'decode_reset'": msgpack.packb([V, "fault", 3, 0, "reset", 5]),
}


def test_a_bad_reset_frame_is_rejected_and_a_reset_of_a_node_never_added_is_refused(directory: Path) -> None:
    with service(directory) as svc, raw_peer(svc.endpoint) as socket:
        socket.send(msgpack.packb([V, "hello", "raw", 1, 1.0]))
        assert socket.poll(5000) and decode_frame(socket.recv(), ["welcome", "refused"])[1] == "welcome"
        for frame in RESET_FRAMES.values():
            socket.send(frame)
        socket.send(msgpack.packb([V, "fault", 4, None, "decode_reset", 12345]))  # well formed, no such node
        assert socket.poll(5000)
        done = decode_frame(socket.recv(), ["done"])
        [[_, error_type, text]] = done[4]
        assert error_type == "ValueError" and "names decode node 12345" in text
    assert svc.report is not None and svc.report["counters"]["rejected"] == len(RESET_FRAMES)
    assert svc.report["counters"]["refused"] == 1
    for reason, rejection in zip(RESET_FRAMES, svc.report["rejections"], strict=True):
        assert reason in rejection, rejection


def test_a_remote_reset_of_a_node_the_service_never_added_fails_the_run(directory: Path) -> None:
    # The plane's own check passes (the node is its own), but the service refused the node: the reset is
    # refused too, and the run fails, as a join naming it would.
    with service(directory) as svc:
        plane = remote(svc.endpoint)

        async def main() -> None:
            node = plane.decode_node(
                lambda done, spans: None, {**decode_spec({"link": 0, "nic": 1, "node0": 0}), "gpus": 0}
            )
            plane.decode_reset(node)
            await asyncio.sleep(5.0)

        with pytest.raises(DetachedRequestError, match="refused a decode node"):
            run_remote(main(), plane)
    assert svc.report is not None and svc.report["counters"]["refused"] == 2  # the node, then its reset
