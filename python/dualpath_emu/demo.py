"""``dualpath-emu demo lanes``: the data plane's virtual-lane isolation on one compute NIC, as tables.

One compute NIC (400 Gb/s) carries a long KV-cache transfer on the low-priority lane (VL2) while the model
issues MoE all-to-all bursts on a high-priority lane (VL0), first with the paper's virtual-lane isolation
(App. A.1: ``qos_high_limit 240``, VL2 weight 0 in the high table), then with none (all lanes equal). The
demo prints each lane's share of the port, checked against the exact packet arbiter, the bursts' latency
against an idle port, and a timeline of the port."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from dualpath_emu._core import Arbitration, Core, PacketArbiter

CNIC_BYTES_PER_S = 400e9 / 8  # one 400 Gb/s compute NIC
MODEL_LANE = 0  # collectives: high priority (paper §5)
KV_LANE = 2  # KV-cache traffic: low priority
KV_BYTES = 2_000_000_000  # e.g. the hit KV of ~50k DeepSeek-V3.2 tokens
BURST_BYTES = 200_000_000  # one all-to-all burst
BURST_PERIOD_NS = 10_000_000
BURSTS = 3
FIRST_BURST_NS = 5_000_000
SAMPLE_NS = 1_000_000
MTU = 4096


@dataclass
class Outcome:
    """What one run of the demonstration measured."""

    name: str
    kv_share_during_bursts: float
    kv_share_alone: float
    burst_latency_ns: list[int]
    kv_done_ns: int
    timeline: list[tuple[float, float]]  # (model lane, KV lane) utilisation per sample


def run_once(name: str, arbitration: Arbitration) -> Outcome:
    """Drive one port through the KV transfer and the bursts, in virtual time."""
    core = Core(sample_interval_ns=SAMPLE_NS)
    port = core.add_port("cnic0.tx", CNIC_BYTES_PER_S, mtu_bytes=MTU, arbitration=arbitration)
    core.submit_transfers([([port], KV_LANE, KV_BYTES, 0)])
    core.add_timers([(FIRST_BURST_NS + i * BURST_PERIOD_NS, 100 + i) for i in range(BURSTS)])
    kv_alone = _kv_share(core, port)
    kv_during = 0.0
    burst_started: dict[int, int] = {}
    burst_latency: list[int] = []
    kv_done = 0
    while (step := core.step()) is not None:
        _, done = step
        for kind, tag, start_ns, end_ns, _size, _lane in done:
            if kind == "timer":
                core.submit_transfers([([port], MODEL_LANE, BURST_BYTES, tag)])
                burst_started[tag] = end_ns
                kv_during = _kv_share(core, port)
            elif tag == 0:
                kv_done = end_ns
            else:
                burst_latency.append(end_ns - start_ns)
    model = core.utilisation(port, MODEL_LANE)
    kv = core.utilisation(port, KV_LANE)
    width = max(len(model), len(kv))
    timeline = [(model[i] if i < len(model) else 0.0, kv[i] if i < len(kv) else 0.0) for i in range(width)]
    return Outcome(name, kv_during, kv_alone, burst_latency, kv_done, timeline)


def _kv_share(core: Core, port: int) -> float:
    return core.lane_rates(port)[KV_LANE] / CNIC_BYTES_PER_S


def packet_share(arbitration: Arbitration, lanes: list[int], packets: int = 200_000) -> list[float]:
    """Long-run byte share of each lane under the exact packet arbiter, all lanes always backlogged."""
    arbiter = PacketArbiter(arbitration)
    heads = [MTU if lane in lanes else 0 for lane in range(16)]
    sent = [0] * 16
    for _ in range(packets):
        lane = arbiter.select(heads)
        assert lane is not None
        sent[lane] += 1
    return [sent[lane] / packets for lane in lanes]


def _bar(fraction: float, width: int = 20) -> str:
    cells = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * cells + "·" * (width - cells)


def _table(title: str, *numbers: str) -> Table:
    """A table of the runs: their arbitration, then columns of numbers."""
    table = Table(title=title)
    table.add_column("arbitration")
    for header in numbers:
        table.add_column(header, justify="right")
    return table


def main(args: argparse.Namespace | None = None) -> int:
    """Run the demonstration and print its tables; returns the exit status."""
    console = Console()
    isolated = Arbitration.paper()
    shared = Arbitration.fair(4)
    unloaded_ns = round(BURST_BYTES / CNIC_BYTES_PER_S * 1e9)
    runs = [run_once("isolated (A.1)", isolated), run_once("no isolation", shared)]

    console.print(
        f"[bold]dualpath-emu data plane[/]: one 400 Gb/s compute NIC; a {KV_BYTES / 1e9:g} GB KV transfer on "
        f"VL{KV_LANE} and {BURSTS} all-to-all bursts of {BURST_BYTES / 1e6:g} MB on VL{MODEL_LANE}.\n"
    )
    shares = _table("Share of the port while both lanes are backlogged", f"VL{MODEL_LANE}\nrate model",
                    f"VL{KV_LANE}\nrate model", f"VL{KV_LANE}\npacket arbiter",
                    f"VL{KV_LANE} in the run\n(alone → in a burst)")  # fmt: skip
    for run, arbitration in zip(runs, (isolated, shared)):
        rate_model = arbitration.saturated_shares(MTU, [MODEL_LANE, KV_LANE])
        packets = packet_share(arbitration, [MODEL_LANE, KV_LANE])
        shares.add_row(run.name, f"{rate_model[MODEL_LANE]:.2%}", f"{rate_model[KV_LANE]:.2%}", f"{packets[1]:.2%}",
                       f"{run.kv_share_alone:.0%} → {run.kv_share_during_bursts:.2%}")  # fmt: skip
    console.print(shares)

    latency = _table(f"All-to-all burst latency (idle port: {unloaded_ns / 1e6:.2f} ms)", "burst latency (ms)",
                     "vs idle", "KV transfer done (ms)")  # fmt: skip
    for run in runs:
        bursts = ", ".join(f"{ns / 1e6:.2f}" for ns in run.burst_latency_ns)
        worst = max(run.burst_latency_ns) / unloaded_ns
        latency.add_row(run.name, bursts, f"{worst:.2f}×", f"{run.kv_done_ns / 1e6:.2f}")
    console.print(latency)

    timeline = Table(
        title=f"The port over time (utilisation per lane, sampled every {SAMPLE_NS / 1e6:g} ms; every 2nd shown)"
    )
    timeline.add_column("t (ms)", justify="right")
    for run in runs:
        timeline.add_column(f"{run.name}: VL{MODEL_LANE} | VL{KV_LANE}")
    rows = max(len(run.timeline) for run in runs)
    for i in range(0, rows, 2):  # every other sample keeps the table short
        cells = []
        for run in runs:
            model, kv = run.timeline[i] if i < len(run.timeline) else (0.0, 0.0)
            cells.append(f"{_bar(model, 12)} | {_bar(kv, 12)}")
        timeline.add_row(f"{i * SAMPLE_NS / 1e6:.0f}", *cells)
    console.print(timeline)
    console.print(
        "With isolation the bursts keep their idle-port latency and KV traffic fills every gap between them;"
        " without it they share the port with KV traffic and slow down."
    )
    return 0
