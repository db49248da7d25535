"""The cluster's engines stepped by hand: no driver, no loop, no core (the sans-I/O design, docs/architecture.md).

Each test builds one engine with a recording outbox and data plane, feeds it inputs with the time, and looks at
what it asked for: messages, observations, data-plane requests (whose ``then`` the test calls to say they ended).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from dualpath_emu.cluster.catalog import MODELS
from dualpath_emu._core import Core
from dualpath_emu.cluster.assemble import build_engine, engine_names
from dualpath_emu.cluster.catalog import TESTBED_NODE
from dualpath_emu.cluster.config import ClusterConfig, derived
from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.client import Client
from dualpath_emu.cluster.decode import DecodeGroup, DecodeSteps, DecodingRequest
from dualpath_emu.cluster.ledger import Booking, Ledger
from dualpath_emu.cluster.messages import (
    DecodeDone,
    DecodeTask,
    Expect,
    Fetch,
    HitReady,
    KvReady,
    Prefill,
    PrefillDone,
    PrefillTask,
    ReadDone,
    Start,
    Submit,
    Turn,
    TurnDone,
)
from dualpath_emu.cluster.observations import MEASUREMENTS, Completion, WorkloadEnded
from dualpath_emu.cluster.prefill import PrefillGroup
from dualpath_emu.cluster.scheduler import Scheduler
from dualpath_emu.cluster.systems import built_in
from dualpath_emu.cluster.topology import build_topology
from dualpath_emu.messages import Message
from dualpath_emu.workload.trajectory import Trajectory
from dualpath_emu.runtime.engine import Observed, Then, UnhandledInputError

MS = 1_000_000


class Outbox:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []
        self.records: list[tuple[str, str]] = []
        """Observations the event log keeps, as its ``(kind, summary)``."""
        self.observed: list[Observed] = []
        """Every observation, measurements too."""

    def send(self, recipient: str, msg: Message) -> None:
        self.sent.append((recipient, msg))

    def observe(self, record: Observed) -> None:
        self.observed.append(record)
        if type(record) not in MEASUREMENTS:
            self.records.append((record.kind, record.summary()))

    def take(self) -> list[tuple[str, Message]]:
        sent, self.sent = self.sent, []
        return sent


class Plane:
    """Records every request; ``then`` is the test's to call, and so is a decode node's ``report`` (kept in
    :attr:`reports`)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, tuple[Any, ...], Then | None]] = []
        self.reports: list[Any] = []

    def transfer(self, path: tuple[int, ...], lane: int, size_bytes: int, then: Then | None) -> None:
        self.requests.append(("transfer", (path, lane, size_bytes), then))

    def io(self, storage_node: int, kind: str, lane: int, size_bytes: int, extents: Any, then: Then | None) -> None:
        self.requests.append((kind, (storage_node, size_bytes, extents), then))

    def forward(self, n_layers: int, ranks: Any, ffn_ns: int, collectives: Any, then: Then) -> None:
        self.requests.append(("forward", (n_layers, ranks, ffn_ns), then))

    def timer(self, at_ns: int, then: Then) -> None:
        self.requests.append(("timer", (at_ns,), then))

    def clock_ns(self) -> int:
        return 0

    def decode_node(self, report: Any, **spec: Any) -> int:
        self.reports.append(report)
        self.requests.append(("decode_node", tuple(sorted(spec.items())), None))
        return len(self.reports) - 1

    def decode_join(self, *args: int) -> None:
        self.requests.append(("decode_join", args, None))

    def set_port_factor(self, port: int, factor: float) -> None:
        raise AssertionError("no faults here")

    def set_port_latency(self, port: int, extra_ns: int) -> None:
        raise AssertionError("no faults here")

    def decode_bytes(self, node: int) -> dict[str, Any] | None:
        return None

    def decode_reset(self, node: int) -> None:
        self.requests.append(("decode_reset", (node,), None))

    def discard(self, extents: Any) -> None:
        self.requests.append(("discard", (extents,), None))

    def pool(self, node: int, op: str, extents: Any) -> None:
        self.requests.append(("pool", (node, op, extents), None))

    def take(self, kind: str) -> list[tuple[tuple[Any, ...], Then | None]]:
        mine = [(args, then) for k, args, then in self.requests if k == kind]
        self.requests = [r for r in self.requests if r[0] != kind]
        return mine


def cluster(system: str = "dualpath") -> Cluster:
    node = dataclasses.replace(TESTBED_NODE, gpus=2)
    config = ClusterConfig(
        model=MODELS["ds27b"], node=node, pe_nodes=1, de_nodes=1, prefill_ep_nodes=1, decode_ep_nodes=1
    )
    d = derived(config)
    spec = built_in(system)
    topology = build_topology(Core(), config.node, config.pe_nodes, config.de_nodes, config.storage)
    return Cluster(config, spec, d, topology, spec.policy(d.alpha_tokens, d.beta_tokens))


def test_the_scheduler_assigns_a_submitted_turn_to_both_groups_when_they_have_pulled() -> None:
    c, out, plane = cluster(), Outbox(), Plane()
    scheduler = Scheduler(c, out, plane)
    scheduler.start(0)
    period = round(c.config.fetch_period_s * 1e9)
    scheduler.receive(0, Fetch((0,), period), "pe0")
    scheduler.receive(0, Fetch((1,), period), "de1")
    assert out.take() == [] and plane.requests == []  # nothing to do yet
    scheduler.receive(5, Submit((Turn(0, 5000, 4096, 30, 0),)), "client")
    sent = out.take()
    assert [(to, type(m)) for to, m in sent] == [("pe0", Prefill), ("de1", Expect)]
    prefill, expect = sent[0][1], sent[1][1]
    assert isinstance(prefill, Prefill) and isinstance(expect, Expect)
    task = prefill.tasks[0]
    assert (task.rid, task.prompt, task.hit, task.de_node) == (0, 5000, 4096, 1)
    assert expect.tasks[0].read_on_de == task.read_on_de
    assert ("assign", f"r0 pe{task.pe_node * 2 + task.pe_gpu} de{2 + task.de_gpu} {'de' if task.read_on_de else 'pe'}") \
        in out.records  # fmt: skip


def test_a_group_that_pulled_recently_is_served_when_its_period_has_passed() -> None:
    c, out, plane = cluster(), Outbox(), Plane()
    scheduler = Scheduler(c, out, plane)
    period = round(c.config.fetch_period_s * 1e9)
    scheduler.receive(0, Fetch((0,), period), "pe0")
    scheduler.receive(0, Fetch((1,), period), "de1")
    scheduler.receive(10, Submit((Turn(0, 500, 0, 3, 0),)), "client")
    assert [to for to, _ in out.take()] == ["pe0", "de1"]
    scheduler.receive(20, Submit((Turn(1, 500, 0, 3, 1),)), "client")
    assert out.take() == []  # pe0 was served at t = 10 ns: its next pull is due a period later
    [(args, then)] = plane.take("timer")
    assert args == (10 + period,) and then is not None
    then(10 + period)
    assert [to for to, _ in out.take()] == ["pe0", "de1"]


def test_a_decode_group_copies_the_kv_in_decodes_and_reports_the_turn() -> None:
    c, out, plane = cluster(), Outbox(), Plane()
    de = DecodeGroup(c, 1, out, plane)
    de.start(0)
    assert out.take() == [("scheduler", Fetch((1,), round(c.config.fetch_period_s * 1e9)))]
    de.receive(0, Expect((DecodeTask(7, 200, 128, 4, 1, 0, 0, False, 3),)), "scheduler")
    assert out.take() == [("pe0", HitReady(7, False))]  # the DE buffer is held: the PE may send the KV
    de.receive(2 * MS, KvReady((7,), 2 * MS), "pe0")
    [(args, copied)] = plane.take("transfer")  # the prompt KV into HBM
    assert args[2] == 200 * c.derived.kv_bytes_per_token and copied is not None
    copied(3 * MS)
    # It joins GPU 0's batch in the plane, which steps it (node, gpu, rid, prompt, gen, produced, stored, context).
    assert [args for args, _ in plane.take("decode_join")] == [(0, 0, 7, 200, 4, 1, 2, 3)]
    assert out.take() == []
    plane.reports[0](9 * MS, [(7, 4 * MS)], [(3, 3 * MS, 9 * MS, 1, MS)])  # the plane: it ended at 9 ms
    sent = out.take()
    assert [(to, type(m)) for to, m in sent] == [("scheduler", DecodeDone), ("client", TurnDone)]
    done = sent[1][1]
    assert (
        isinstance(done, TurnDone) and done.rids == (7,) and done.first_token_ns == (2 * MS,) and done.done_ns == 9 * MS
    )
    assert done.second_token_ns == (4 * MS,)
    assert ("end", "r7") in out.records


def test_a_prefill_group_reads_the_hit_waits_for_the_de_buffer_and_prefills_in_one_pass() -> None:
    c, out, plane = cluster(), Outbox(), Plane()
    pe = PrefillGroup(c, [0], out, plane)
    pe.start(0)
    assert out.take() == [("scheduler", Fetch((0,), round(c.config.fetch_period_s * 1e9)))]
    kv = c.derived.kv_bytes_per_token
    pe.receive(MS, Prefill((PrefillTask(7, 5000, 4096, 30, 0, 1, 1, 0, False, 3),)), "scheduler")
    [((storage_node, size, extents), read_done)] = plane.take("read")  # PE-read: storage -> the PE's DRAM buffer
    assert storage_node == c.topology.nodes[0].storage_node and size == 4096 * kv and read_done is not None
    assert extents == ((3, 0, 4096 // 64),)  # the context's first 64 Full Blocks
    read_done(2 * MS)
    assert out.take() == [("scheduler", ReadDone(0, 4096))]
    assert plane.take("timer") == []  # the hit is in, but the DE buffer is not yet held
    pe.receive(3 * MS, HitReady(7, False), "de1")
    [((at_ns,), kick)] = plane.take("timer")  # batch once this instant's inputs are in
    assert at_ns == 3 * MS and kick is not None
    kick(3 * MS)
    [((stages, ranks, _), passed)] = plane.take("forward")
    assert stages == c.derived.stages and len(ranks) == 1  # one DP rank with work: GPU 1
    load, _, store = ranks[0]
    assert load is not None and load[0] == c.topology.h2d(0, 1) and store is not None  # layer by layer in, then out
    assert passed is not None
    passed(10 * MS)
    sent = out.take()
    assert sent == [("de1", KvReady((7,), 10 * MS)), ("scheduler", PrefillDone((7,)))]
    assert ("prefilled", "r7") in out.records and ("give", f"n0.buffer 7 {4096 * kv}") in out.records
    [((after,), pulled)] = plane.take("timer")  # the pull wait before the next batch
    assert after > 10 * MS and pulled is not None


def test_the_client_submits_an_agents_next_turn_when_its_last_is_done_and_then_finishes() -> None:
    c, out, plane = cluster(), Outbox(), Plane()
    client = build_engine(
        "client", c, out, plane, trajectories=lambda: [Trajectory.from_rounds("a0", [(1000, 4), (200, 3)])], seed=0
    )
    assert isinstance(client, Client)
    client.receive(0, Start(), "main")
    assert out.take() == [("scheduler", Submit((Turn(0, 1000, 0, 4, 0, False),)))]
    client.receive(5 * MS, TurnDone((0,), (2 * MS,), (3 * MS,), 5 * MS), "de1")
    # The second turn's prompt is the whole context so far; its hit, the part in Full Blocks.
    assert out.take() == [("scheduler", Submit((Turn(1, 1204, 1004 // 64 * 64, 3, 0, True),)))]
    assert WorkloadEnded() not in out.observed
    client.receive(9 * MS, TurnDone((1,), (7 * MS,), (8 * MS,), 9 * MS), "de1")
    assert out.take() == [] and out.observed[-1] == WorkloadEnded()
    assert [r for r in out.records if r[0] == "admit"] == [("admit", "r0"), ("admit", "r1")]
    assert [r.done_ns for r in out.observed if isinstance(r, Completion)] == [5 * MS, 9 * MS]


def test_an_engine_refuses_a_message_it_does_not_handle() -> None:
    c, out, plane = cluster(), Outbox(), Plane()
    de = DecodeGroup(c, 1, out, plane)
    with pytest.raises(UnhandledInputError, match="de1.*Prefill"):
        de.receive(0, Prefill((PrefillTask(0, 1, 0, 1, 0, 0, 1, 0, False, 0),)), "scheduler")


def test_one_assembly_names_and_builds_every_engine() -> None:
    c = cluster()
    names = engine_names(c.config)
    assert names == ["client", "scheduler", "pe0", "de1"]
    engines = [build_engine(n, c, Outbox(), Plane(), trajectories=lambda: [], seed=0) for n in names]
    assert [e.name for e in engines] == names
    with pytest.raises(KeyError, match="de9"):
        build_engine("de9", c, Outbox(), Plane(), trajectories=lambda: [], seed=0)


def test_decode_steps_hand_the_node_to_the_plane_and_end_a_one_token_request_at_once() -> None:
    # The plane steps the node (its spec names the write-back storage and each GPU's paths); a request whose
    # one token came from the prefill takes no step: its prompt's last Full Blocks are written back and it ends.
    c, plane = cluster(), Plane()
    ended: list[tuple[int, int]] = []

    class Group:
        def decoded(self, now: int, request: DecodingRequest) -> None:
            ended.append((now, request.rid))

        def stepped(self, now: int) -> None:
            ended.append((now, -1))

    steps = DecodeSteps(
        1, 2, pricing={}, together=True, kv_bytes_per_token=10, a2a_bytes_per_token=0.0, a2a_paths=[(0,), (1,)],
        d2h_paths=[(5,), (6,)], storage=(4, (5, 9)), plane=Ledger(plane, c.topology, Booking()), booking=Booking(),
        listener=Group(), busy_span=lambda *span: None,
    )  # fmt: skip
    [(spec, _)] = plane.take("decode_node")
    assert dict(spec)["storage_node"] == 4 and dict(spec)["d2h_paths"] == [(5,), (6,)] and dict(spec)["first_unit"] == 2
    steps.join(0, DecodingRequest(1, prompt=190, gen=1, gpu=0, stored_blocks=1, context=7))
    assert ended == [(0, 1)] and plane.take("decode_join") == []
    assert [args[2] for args, _ in plane.take("write")] == [((7, 1, 1),)]  # tokens 64-127 (191 is not full)
    steps.join(MS, DecodingRequest(2, prompt=200, gen=5, gpu=1, stored_blocks=3, context=8))
    assert [args for args, _ in plane.take("decode_join")] == [(0, 1, 2, 200, 5, 1, 3, 8)]
    plane.reports[0](4 * MS, [(2, 2 * MS)], [])
    assert ended == [(0, 1), (4 * MS, 2), (4 * MS, -1)]
