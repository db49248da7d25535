"""The isolation experiment (paper §5): how long an EP16 MoE dispatch takes on compute NICs that also carry
20 GB/s of KV-cache traffic, with and without virtual-lane isolation, when the dispatch queues FIFO behind the
KV work requests already posted on its lane.

The setup is the SIGCOMM version's micro-benchmark (its App. A.5: EP16 dispatch, 20 GB/s of low-priority KV
per port); the paper gives no latencies to compare with (paper-facts §6). The experiment drives the Rust core
directly: "without isolation" is only another lane for the same transfers (docs/architecture.md).

**Why FIFO.** In the fluid model a message sharing a lane with bulk flows gets its max-min share at once,
slowed by at most C / (C − B) (1.67× for 20 GB/s on a 50 GB/s NIC). Real NICs queue packets FIFO per lane, so
the dispatch is submitted *latency-sensitive* (``latency_sensitive_outstanding_bytes=WR × depth``): at each
port it first waits for ``Q_p = Σ min(remaining, WR × depth)`` over its lane's flows there, drained at the
rate the port serves that lane, then shares the port max-min.

**Fabric and traffic.** DS 660B's prefill EP group (2 PE nodes × 8 GPUs) and the 4 DE nodes of its 2P4D
deployment, ports named as in :mod:`dualpath_emu.cluster.topology` (a 50 GB/s compute NIC per GPU each way,
500 GB/s DRAM per DE node; the fabric is non-blocking). The dispatch (DeepEP's normal layout, as
``cluster/engines.py``): one transfer per GPU to its same-index peer of ``tokens × 7,392 B × (1 - (1 -
1/2)^8)``; the main point is :data:`A5_TOKENS` = 128 tokens per GPU (0.94 MB, 19 µs idle), prefill batches of
512 to 8,192 for context; its latency runs from submission to the last transfer's end. The KV background is
DualPath's DE-read path (paper-facts §4): per PE GPU a Layer-Block stream from and a miss-KV stream to each DE
node, :data:`KV_QPS_PER_PORT` per direction, throttled by a 20 GB/s port of their own so KV takes exactly
:data:`KV_BYTES_PER_S` of each PE CNIC direction; they start :data:`WARMUP_NS` early and outlast the dispatch.

**Assumed, not from the paper** (``--queue-depth``, ``--kv-qps``): a KV sender keeps :data:`QUEUE_DEPTH` = 16
WRs of one Layer Block (64 × 656 B for DS 660B) posted, drained at the KV rate (at line rate the wait would be
2.5× shorter): without isolation the dispatch waits 4 × 16 × 41,984 B / 20 GB/s ≈ 134 µs, then moves at 30 GB/s.

**Conditions** (A.1's VL arbitration on every CNIC): ``unloaded`` (the dispatch alone); ``isolated`` (KV on
VL2 = :data:`~dualpath_emu.cluster.topology.KV_LANE`, the dispatch on VL0 =
:data:`~dualpath_emu.cluster.topology.MODEL_LANE`: nothing to wait for); ``shared_lane`` (KV on VL0, the
dispatch waits out the FIFO); ``shared_lane_fluid`` (the same as an ordinary transfer: C / (C − B)). Checks:
``isolated`` ≤ 1.10 × unloaded at every batch; ``shared_lane`` ≥ 2 × ``shared_lane_fluid`` at the main point
and slower than it at every batch. ``--quick`` runs 128 and 8,192 tokens."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dualpath_emu._core import Arbitration, Core
from dualpath_emu.cluster.catalog import TESTBED_NODE, ModelSpec, model
from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.topology import KV_LANE, MODEL_LANE
from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce.common import DEPLOYMENTS, Comparison, Report, experiment_main, within
from dualpath_emu.reproduce.plots import panels, save

__all__ = [
    "A5_TOKENS", "BATCH_TOKENS", "CONDITIONS", "KV_BYTES_PER_S", "KV_QPS_PER_PORT", "QUEUE_DEPTH", "Condition",
    "Point", "dispatch_bytes_per_peer", "fifo_wait_ns", "main", "measure", "outstanding_bytes",
]  # fmt: skip

MODEL: Final = "ds660b"
EP_NODES: Final[int] = DEPLOYMENTS[MODEL]["prefill_ep_nodes"]
DE_NODES: Final[int] = DEPLOYMENTS[MODEL]["de_nodes"]
A5_TOKENS: Final = 128  # Tokens per GPU of the main point: a decode-sized batch (the task's setup).
BATCH_TOKENS: Final = (A5_TOKENS, 512, 2048, 8192)
"""Tokens per GPU in one dispatch (full run): the main point, then prefill batches for context."""
QUICK_BATCH_TOKENS: Final = (A5_TOKENS, 8192)
KV_BYTES_PER_S: Final = 20e9  # KV background per PE CNIC direction (the task's setup).
KV_QPS_PER_PORT: Final = DE_NODES
"""KV sender QPs per PE CNIC direction: one stream to or from each DE node (an assumption)."""
QUEUE_DEPTH: Final = 16  # Work requests a KV sender keeps posted (an assumption, not a paper number).
WARMUP_NS: Final = 50_000  # Background traffic runs alone this long first, so the dispatch meets it in steady state.
KV_FLOW_BYTES: Final = 4 << 30
"""Each KV stream's size: at 5 GB/s it lasts ≈0.9 s, far beyond the slowest dispatch (≈2 ms)."""
ISOLATION_TOLERANCE: Final = 0.10
FIFO_OVER_FLUID: Final = 2.0
"""How much slower than the fluid model the shared lane must be at the main point ("clearly slower")."""
_COLLECTIVE_TAG0: Final = 1
_KV_TAG0: Final = 1 << 32  # apart from the dispatch's tags, so a completion says which it was


@dataclass(frozen=True)
class Condition:
    """One configuration: the lane KV traffic rides (None: no KV traffic) and how the dispatch is submitted."""

    name: str
    kv_lane: int | None
    fifo: bool  # Submit the dispatch latency-sensitive (it queues FIFO behind its lane's KV WRs) or as a plain flow.
    description: str


CONDITIONS: Final = (
    Condition("unloaded", None, True, "the dispatch alone"),
    Condition("isolated", KV_LANE, True, "KV on VL2 (low), dispatch on VL0 (high): paper A.1"),
    Condition("shared_lane", MODEL_LANE, True, "no isolation: KV on the dispatch's VL0, FIFO behind its WRs"),
    Condition("shared_lane_fluid", MODEL_LANE, False, "no isolation, pure fluid model (context)"),
)


@dataclass(frozen=True)
class Point:
    """One measurement: the dispatch's latency under ``condition``."""

    batch_tokens: int
    condition: Condition
    bytes_per_peer: int
    latency_ns: int


def dispatch_bytes_per_peer(spec: ModelSpec, tokens: int, ep_nodes: int) -> int:
    """Bytes one GPU's MoE dispatch sends to its same-index GPU on one other node (DeepEP normal layout)."""
    k = spec.activated_experts
    per_token = spec.a2a_dispatch_bytes_per_token_layer / k
    return round(tokens * per_token * (1.0 - (1.0 - 1.0 / ep_nodes) ** k))


def outstanding_bytes(spec: ModelSpec, queue_depth: int = QUEUE_DEPTH) -> int:
    """What one KV sender has posted ahead at most: ``queue_depth`` WRs of one Layer Block each."""
    return BLOCK_TOKENS * spec.kv_bytes_per_token_layer * queue_depth


def fifo_wait_ns(spec: ModelSpec, queue_depth: int = QUEUE_DEPTH, kv_qps: int = KV_QPS_PER_PORT) -> float:
    """The closed form of the shared lane's FIFO wait: every KV QP's posted WRs, drained at the KV rate."""
    return kv_qps * outstanding_bytes(spec, queue_depth) / KV_BYTES_PER_S * 1e9


@dataclass(frozen=True)
class _Fabric:
    cnic_tx: dict[tuple[int, int], int]
    cnic_rx: dict[tuple[int, int], int]
    dram: dict[int, int]
    kv_load: dict[tuple[int, int], int]
    kv_store: dict[tuple[int, int], int]


def _build_fabric(core: Core) -> _Fabric:
    """PE nodes, then DE nodes: CNIC ports per GPU (A.1), DRAM per DE node, two 20 GB/s KV ports per PE GPU."""
    node = TESTBED_NODE
    tx: dict[tuple[int, int], int] = {}
    rx: dict[tuple[int, int], int] = {}
    dram: dict[int, int] = {}
    kv_load: dict[tuple[int, int], int] = {}
    kv_store: dict[tuple[int, int], int] = {}
    for n in range(EP_NODES + DE_NODES):
        if n >= EP_NODES:  # PE DRAM is not on any path here
            dram[n] = core.add_port(f"n{n}.dram", node.host_dram_bytes_per_s)
        for g in range(node.gpus):
            tx[n, g] = core.add_port(f"n{n}.cnic{g}.tx", node.cnic_bytes_per_s, arbitration=Arbitration.paper())
            rx[n, g] = core.add_port(f"n{n}.cnic{g}.rx", node.cnic_bytes_per_s, arbitration=Arbitration.paper())
            if n < EP_NODES:
                kv_load[n, g] = core.add_port(f"n{n}.kv{g}.load", KV_BYTES_PER_S)
                kv_store[n, g] = core.add_port(f"n{n}.kv{g}.store", KV_BYTES_PER_S)
    return _Fabric(tx, rx, dram, kv_load, kv_store)


def measure(
    condition: Condition, batch_tokens: int, *, queue_depth: int = QUEUE_DEPTH, kv_qps: int = KV_QPS_PER_PORT
) -> Point:
    """Run one condition in a fresh core and return the dispatch's latency (submission → last transfer's end)."""
    spec = model(MODEL)
    core = Core()
    fabric = _build_fabric(core)
    gpus = TESTBED_NODE.gpus
    if condition.kv_lane is not None:
        background = []
        for n, g, j in itertools.product(range(EP_NODES), range(gpus), range(kv_qps)):
            de = EP_NODES + j % DE_NODES  # one stream per DE node (round robin beyond DE_NODES QPs)
            load = (fabric.dram[de], fabric.cnic_tx[de, g], fabric.cnic_rx[n, g], fabric.kv_load[n, g])
            store = (fabric.kv_store[n, g], fabric.cnic_tx[n, g], fabric.cnic_rx[de, g], fabric.dram[de])
            background += [load, store]
        core.submit_transfers(
            (path, condition.kv_lane, KV_FLOW_BYTES, _KV_TAG0 + i) for i, path in enumerate(background)
        )
    if core.advance_until(WARMUP_NS):
        raise RuntimeError("isolation: background traffic ended during the warm-up")
    start_ns = core.now_ns
    size = dispatch_bytes_per_peer(spec, batch_tokens, EP_NODES)
    pairs = [(n, g, peer) for n, g in itertools.product(range(EP_NODES), range(gpus))
             for peer in range(EP_NODES) if peer != n]  # fmt: skip
    dispatch = [
        ((fabric.cnic_tx[n, g], fabric.cnic_rx[peer, g]), MODEL_LANE, size, _COLLECTIVE_TAG0 + i)
        for i, (n, g, peer) in enumerate(pairs)
    ]
    outstanding = outstanding_bytes(spec, queue_depth) if condition.fifo else 0
    core.submit_transfers(dispatch, latency_sensitive_outstanding_bytes=outstanding)
    waiting = {tag for *_, tag in dispatch}
    end_ns = start_ns
    while waiting:
        stepped = core.step()
        if stepped is None:
            raise RuntimeError("isolation: the core went idle before the dispatch finished")
        for _kind, tag, start, end, _size, _lane in stepped[1]:
            if tag >= _KV_TAG0:  # the load would no longer be the one the point claims
                raise RuntimeError(f"isolation: a KV stream ended before the dispatch ({condition.name})")
            if start != start_ns:
                raise RuntimeError(f"isolation: a dispatch transfer reported start {start}, not {start_ns}")
            waiting.discard(tag)
            end_ns = max(end_ns, end)
    return Point(batch_tokens, condition, size, end_ns - start_ns)


_COLORS: Final = {"unloaded": "tab:gray", "isolated": "tab:green", "shared_lane": "tab:red",
                  "shared_lane_fluid": "tab:orange"}  # fmt: skip


def _plot(path: Path, points: Sequence[Point], unloaded: dict[int, int]) -> None:
    """Left: latency per condition against the batch; right: slowdown (latency / unloaded) per batch."""
    batches = sorted(unloaded)
    by_key = {(p.batch_tokens, p.condition.name): p for p in points}
    loaded = [c for c in CONDITIONS if c.kv_lane is not None]
    fig, (left, right) = panels(2, width=5.5, height=3.8)
    width = 0.8 / len(loaded)
    for i, c in enumerate(loaded):
        xs = [k + (i - (len(loaded) - 1) / 2) * width for k in range(len(batches))]
        right.bar(xs, [by_key[b, c.name].latency_ns / unloaded[b] for b in batches], width, color=_COLORS[c.name],
                  label=c.name)  # fmt: skip
    right.axhline(1 + ISOLATION_TOLERANCE, color="tab:green", linestyle="--", linewidth=0.8)
    right.set_xticks(range(len(batches)), [str(b) for b in batches], fontsize=8)
    right.set_xlabel("tokens per GPU")
    right.set_yscale("log")
    right.set_ylim(0.8, None)  # so that the isolated bars (≈1.0) show
    right.set_ylabel("latency / unloaded")
    right.set_title("slowdown of the EP16 dispatch")
    right.legend(fontsize=8)
    right.grid(alpha=0.3, axis="y")
    for c in CONDITIONS:
        ys = [by_key[b, c.name].latency_ns / 1e3 for b in batches]
        style = "s--" if c.kv_lane is None else "o-"  # unloaded and isolated coincide: keep both visible
        left.plot(batches, ys, style, color=_COLORS[c.name], label=c.name, markersize=4 if c.kv_lane is None else 7,
                  zorder=3 if c.kv_lane is None else 2)  # fmt: skip
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("tokens per GPU")
    left.set_ylabel("dispatch latency (µs)")
    left.set_title(f"{KV_BYTES_PER_S / 1e9:g} GB/s of KV per CNIC direction")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    save(fig, path)


def build(args: argparse.Namespace) -> Report:
    """Measure every (batch, condition) point and compare with the targets and the closed forms."""
    batches = QUICK_BATCH_TOKENS if args.quick else BATCH_TOKENS
    depth, qps = args.queue_depth, args.kv_qps
    spec = model(MODEL)
    points = [measure(c, b, queue_depth=depth, kv_qps=qps) for b in batches for c in CONDITIONS]
    unloaded = {p.batch_tokens: p.latency_ns for p in points if p.condition.name == "unloaded"}
    latency = {(p.batch_tokens, p.condition.name): p.latency_ns for p in points}
    wait_ns = fifo_wait_ns(spec, depth, qps)
    rows: list[dict[str, Any]] = []
    for p in points:
        c = p.condition
        rows.append({
            "batch_tokens": p.batch_tokens,
            "condition": c.name,
            "model_lane": MODEL_LANE,
            "kv_lane": "" if c.kv_lane is None else c.kv_lane,
            "fifo": c.fifo,
            "kv_gbps_per_port": 0.0 if c.kv_lane is None else KV_BYTES_PER_S / 1e9,
            "bytes_per_peer": p.bytes_per_peer,
            "latency_us": p.latency_ns / 1e3,
            "unloaded_us": unloaded[p.batch_tokens] / 1e3,
            "slowdown": p.latency_ns / unloaded[p.batch_tokens],
            "over_fluid": p.latency_ns / latency[p.batch_tokens, "shared_lane_fluid"],
        })  # fmt: skip

    def slowdowns(name: str) -> list[float]:
        return [r["slowdown"] for r in rows if r["condition"] == name]

    isolated = slowdowns("isolated")
    a5 = {c.name: latency[A5_TOKENS, c.name] for c in CONDITIONS}
    capacity = TESTBED_NODE.cnic_bytes_per_s
    fluid_bound = capacity / (capacity - KV_BYTES_PER_S)
    # The shared lane in closed form: the FIFO wait, then the bytes at what KV leaves of the port.
    a5_bytes = dispatch_bytes_per_peer(spec, A5_TOKENS, EP_NODES)
    predicted_ns = wait_ns + a5_bytes / (capacity - KV_BYTES_PER_S) * 1e9
    over_fluid = a5["shared_lane"] / a5["shared_lane_fluid"]
    kv_share = Arbitration.paper().saturated_shares(4096, [MODEL_LANE, KV_LANE])[KV_LANE]
    comparisons = [
        within(f"dispatch latency unloaded, {A5_TOKENS} tokens/GPU (µs; paper column: the bytes at C)",
               a5_bytes / capacity * 1e6, a5["unloaded"] / 1e3, rel=0.01),
        within("dispatch latency isolated / unloaded (worst batch)", 1.0, max(isolated), rel=ISOLATION_TOLERANCE),
        within(f"dispatch latency shared lane, fluid only / unloaded ({A5_TOKENS} tokens; paper column: C / (C − B))",
               fluid_bound, a5["shared_lane_fluid"] / a5["unloaded"], rel=0.01),
        within(f"dispatch latency shared lane, FIFO / unloaded ({A5_TOKENS} tokens; paper column: closed form)",
               predicted_ns / a5["unloaded"], a5["shared_lane"] / a5["unloaded"], rel=0.01),
        Comparison(f"dispatch latency shared lane, FIFO / fluid only ({A5_TOKENS} tokens)", FIFO_OVER_FLUID,
                   over_fluid, f">= {FIFO_OVER_FLUID:g}x", over_fluid >= FIFO_OVER_FLUID),
        Comparison("KV lane's share of a saturated CNIC, A.1 arbitration", 1.0 - 0.999, kv_share,
                   "context: paper ≈99.9% to the high VL", None),
    ]  # fmt: skip
    checks = {
        f"isolation keeps the dispatch within {ISOLATION_TOLERANCE:.0%} of unloaded (every batch)":
            max(isolated) <= 1.0 + ISOLATION_TOLERANCE,
        f"without isolation the FIFO makes it >= {FIFO_OVER_FLUID:g}x the fluid bound ({A5_TOKENS} tokens)":
            over_fluid >= FIFO_OVER_FLUID,
        "without isolation it is slower than the fluid bound (every batch)":
            all(latency[b, "shared_lane"] > latency[b, "shared_lane_fluid"] for b in batches),
    }  # fmt: skip
    outstanding = outstanding_bytes(spec, depth)
    notes = [
        "The paper reports no latencies for this experiment (paper-facts §6); the 'paper' column holds targets "
        "and closed forms: 1.0 (the unloaded latency, ±10%), C / (C − B) for the fluid model, and the FIFO "
        "wait plus the bytes at C − B for the shared lane.",
        f"Setup: {MODEL} prefill EP group of {EP_NODES} nodes × {TESTBED_NODE.gpus} GPUs (EP16) with {DE_NODES} "
        f"DE nodes; 50 GB/s CNICs with A.1 arbitration; one dispatch transfer per GPU and peer node on "
        f"VL{MODEL_LANE}; {KV_BYTES_PER_S / 1e9:g} GB/s of KV (DE-read loads / miss-KV stores) per PE CNIC "
        f"direction in {qps} streams.",
        f"Assumed (not paper numbers): each KV stream keeps {depth} WRs of one Layer Block ({BLOCK_TOKENS} tokens "
        f"× {spec.kv_bytes_per_token_layer} B = {BLOCK_TOKENS * spec.kv_bytes_per_token_layer:,} B) posted, "
        f"{outstanding:,} B; without isolation the dispatch waits for {qps} × that at the KV rate, "
        f"{wait_ns / 1e3:.0f} µs, before it shares the port (a queue drained at line rate would wait "
        f"{KV_BYTES_PER_S / capacity:.1f}× as long).",
        f"Unloaded / isolated / shared lane (FIFO) / shared lane (fluid only) at {A5_TOKENS} tokens per GPU: "
        f"{a5['unloaded'] / 1e3:.1f} / {a5['isolated'] / 1e3:.1f} / {a5['shared_lane'] / 1e3:.1f} / "
        f"{a5['shared_lane_fluid'] / 1e3:.1f} µs.",
    ]
    return Report("isolation", "EP16 MoE dispatch latency under 20 GB/s of KV traffic, with and without VL isolation "
                  "(§5)", rows, comparisons, notes, lambda path: _plot(path, points, unloaded), checks)  # fmt: skip


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue-depth", type=_positive, default=QUEUE_DEPTH, metavar="N",
                        help=f"WRs each KV stream keeps posted (default {QUEUE_DEPTH}, an assumption)")  # fmt: skip
    parser.add_argument("--kv-qps", type=_positive, default=KV_QPS_PER_PORT, metavar="N",
                        help=f"KV streams per PE CNIC direction (default {KV_QPS_PER_PORT}: one per DE node)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return experiment_main("isolation", help_description(__doc__), build, argv, configure=_configure)
