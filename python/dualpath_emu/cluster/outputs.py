"""What ``dualpath-emu run`` writes: the summary (``--json``, ``summary.json``: the scenario, each system's
:meth:`SystemResult.summary`, ``speedup_vs_basic``), ``requests.csv`` (one row per request per system, times in
seconds since the run's start, empty where never reached), the plots (``jct.png``, ``utilisation.png``,
``latency-cdf.png``, with matplotlib's Agg backend) and where a system's Perfetto trace goes."""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, TextIO

from dualpath_emu import __version__
from dualpath_emu.cluster.metrics import READ_SIDES, Metrics
from dualpath_emu.cluster.run import SystemResult, speedup
from dualpath_emu.cluster.scenario import ClusterScenario
from dualpath_emu.cluster.systems import SYSTEMS, System, system_colours
from dualpath_emu.errors import UsageError

__all__ = [
    "CSV_COLUMNS", "make_output_folder", "summary", "trace_file", "write_outputs", "write_plots", "write_requests",
    "write_requests_csv",
]  # fmt: skip

CSV_COLUMNS: Final = (
    "system", "rid", "agent", "prompt", "hit", "gen", "arrive_s", "first_token_s", "second_token_s", "done_s",
    "read_side", "pe", "de", "ttft_s", "ttst_s", "tpot_s", "failed_s", "redispatches", "recomputed",
)  # fmt: skip


def summary(scenario: ClusterScenario, results: Mapping[str, SystemResult]) -> dict[str, Any]:
    """The run's JSON-able summary."""
    basic = results.get("basic")
    speedups: dict[str, float | None] = {}
    no_speedup: dict[str, str] = {}
    for name, result in results.items():
        speedups[name], why = speedup(basic, result) if basic is not None else (None, None)
        if why is not None:
            no_speedup[name] = why
    config = json.loads(json.dumps(dataclasses.asdict(scenario.config)))  # as JSON has it: reads back equal
    given = scenario.workload_given is not None
    workload = {
        "dataset": None if scenario.trace is not None or given else scenario.config.dataset, "given_in_python": given,
        "trace": None if scenario.trace is None else str(scenario.trace), "agents": scenario.config.agents,
        "max_rounds": scenario.max_rounds, "mode": scenario.config.mode,
        "generator": dataclasses.asdict(scenario.generator),
    }  # fmt: skip
    return {
        "scenario": scenario.name, "source": scenario.source, "description": scenario.describe(),
        "seed": scenario.seed, "version": __version__, "config": config, "workload": workload,
        "complete": all(result.complete for result in results.values()),
        "systems": {name: result.summary() for name, result in results.items()}, "speedup_vs_basic": speedups,
        "no_speedup_vs_basic": no_speedup,
    }  # fmt: skip


def _seconds(ns: int) -> str:
    return "" if ns < 0 else f"{ns / 1e9:.9f}"


def _between(start_ns: int, end_ns: int, per: int = 1) -> str:
    """``(end − start) / per`` in seconds, empty if either was never reached."""
    return "" if start_ns < 0 or end_ns < 0 else f"{(end_ns - start_ns) / per / 1e9:.9f}"


def write_requests_csv(path: Path, results: Mapping[str, SystemResult]) -> int:
    """Write ``requests.csv``; returns the number of rows (requests over all systems)."""
    with open(path, "w", newline="", encoding="utf-8") as file:
        return write_requests(file, results)


def write_requests(file: TextIO, results: Mapping[str, SystemResult]) -> int:
    """``requests.csv``'s text into ``file`` (opened with ``newline=""``); returns the number of rows."""
    rows = 0
    out = csv.writer(file)
    out.writerow(CSV_COLUMNS)
    for name, result in results.items():
        m = result.metrics
        spec: System | None = result.spec or SYSTEMS.get(name)
        oracle = spec is not None and spec.oracle
        for rid in range(len(m)):
            on_de = m.read_on_de[rid]
            side = "none" if oracle or m.hit[rid] == 0 or on_de < 0 else READ_SIDES[on_de]
            out.writerow((
                name, rid, m.agent[rid], m.prompt[rid], m.hit[rid], m.gen[rid], _seconds(m.arrive_ns[rid]),
                _seconds(m.first_token_ns[rid]), _seconds(m.second_token_ns[rid]), _seconds(m.done_ns[rid]),
                side, "" if m.pe[rid] < 0 else m.pe[rid], "" if m.de[rid] < 0 else m.de[rid],
                _between(m.arrive_ns[rid], m.first_token_ns[rid]),
                _between(m.first_token_ns[rid], m.second_token_ns[rid]),
                _between(m.second_token_ns[rid], m.done_ns[rid], m.gen[rid] - 2) if m.gen[rid] > 2 else "",
                _seconds(m.failed_ns[rid]), max(0, m.redispatches[rid]), m.recomputed[rid],
            ))  # fmt: skip
            rows += 1
    return rows


def write_plots(directory: Path, scenario: ClusterScenario, results: Mapping[str, SystemResult]) -> list[Path]:
    """Write ``jct.png``, ``utilisation.png``, ``latency-cdf.png`` and, for a run with a bounded KV tier,
    ``kv.png``; returns the paths."""
    # The object API with an explicit Agg canvas: no pyplot global state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    written: list[Path] = []
    names = list(results)
    figure = Figure(figsize=(max(4.0, 1.3 * len(names) + 2), 3.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    jcts = [results[n].jct_s for n in names]
    colours = system_colours(names)
    bars = axes.bar(names, jcts, color=[colours[n] for n in names])
    partial = [not results[n].complete for n in names]
    for bar, hatched in zip(bars, partial):  # a run that failed work: its bar is how long it ran, not a JCT
        if hatched:
            bar.set_hatch("//")
            bar.set_alpha(0.5)
    axes.bar_label(bars, labels=[f"{v:,.0f} s" + (f"\n{results[n].failed_requests:,} failed" if p else "")
                                 for n, v, p in zip(names, jcts, partial)], padding=2, fontsize=8)  # fmt: skip
    axes.set_ylabel("JCT (s)")
    axes.set_title(f"{scenario.name}: job completion time" + (" (hatched: requests failed, the work is not "
                   "whole)" if any(partial) else ""), fontsize=10)  # fmt: skip
    axes.margins(y=0.15)
    axes.tick_params(axis="x", labelsize=8)
    path = directory / "jct.png"
    figure.savefig(path, dpi=120)
    written.append(path)

    # Utilisation over time: a row per system; columns storage NIC, compute NIC, DRAM, GPU; prefill nodes
    # blue, decode nodes orange; receive (reads into the node) solid, transmit dashed.
    columns = (
        ("storage NIC", (("snic.rx", "-", "rx: reads"), ("snic.tx", "--", "tx: writes"))),
        ("compute NIC", (("cnic.rx", "-", "rx"), ("cnic.tx", "--", "tx"))),
        ("DRAM", (("dram", "-", ""),)),
        ("GPU busy", (("gpu", "-", ""),)),
    )
    figure = Figure(figsize=(13.0, 2.2 * len(names) + 0.8), layout="constrained")
    FigureCanvasAgg(figure)
    panels = figure.subplots(len(names), len(columns), sharex=True, sharey=True, squeeze=False)
    for row, name in enumerate(names):
        result = results[name]
        for col, (title, series) in enumerate(columns):
            axes = panels[row][col]
            for kind, style, label in series:
                for role, role_label, colour in (("pe", "prefill", "tab:blue"), ("de", "decode", "tab:orange")):
                    values = result.timelines.get(kind, {}).get(role, [])
                    step_s = result.sample_interval_s  # the ports'; the GPUs' bins widen on their own budget
                    if kind == "gpu" and result.metrics is not None:
                        step_s = result.metrics.gpu_busy[role].interval_ns / 1e9
                    times = [i * step_s for i in range(len(values))]
                    axes.plot(times, [100 * v for v in values], style, color=colour, linewidth=0.8,
                              label=f"{role_label} {label}".strip())  # fmt: skip
            for fault in result.extra.get("faults", []):  # each fault's span, shaded (to the run's end if it lasted)
                end_s = fault["end_s"] if fault["end_s"] is not None else result.jct_s
                axes.axvspan(fault["start_s"], end_s, color="tab:red", alpha=0.12, linewidth=0)
            axes.set_ylim(0, 105)
            axes.set_title(f"{name}: {title}" if col == 0 else title, fontsize=9, loc="left")
            if col == 0:
                axes.set_ylabel("% of capacity")
            if row == 0:
                axes.legend(loc="upper right", fontsize=6)
    for axes in panels[-1]:
        axes.set_xlabel("emulated time (s)")
    shaded = "; faults shaded red" if any(results[n].extra.get("faults") for n in names) else ""
    figure.suptitle(f"{scenario.name}: utilisation per second, mean over the prefill / decode nodes' ports and "
                    f"GPUs{shaded}", fontsize=10)  # fmt: skip
    path = directory / "utilisation.png"
    figure.savefig(path, dpi=110)
    written.append(path)

    # Latency distributions: TTFT, TTST, TPOT, a line per system (log x: they span orders of magnitude).
    figure = Figure(figsize=(12.0, 3.4), layout="constrained")
    FigureCanvasAgg(figure)
    panels = figure.subplots(1, 3, squeeze=False)[0]
    spans: list[tuple[float, float]] = []
    latencies: tuple[tuple[str, str, float, Callable[[Metrics], list[float]]], ...] = (
        ("TTFT", "s", 1.0, Metrics.ttft_s), ("TTST", "ms", 1e3, Metrics.ttst_s), ("TPOT", "ms", 1e3, Metrics.tpot_s),
    )  # fmt: skip
    for axes, (label, unit, scale, values_of) in zip(panels, latencies):
        for name in names:
            values = sorted(v * scale for v in values_of(results[name].metrics))
            if not values:
                continue
            n = len(values)
            spans.append((values[0], values[-1]))
            picks = sorted({min(n - 1, i * n // 2000) for i in range(2000)} | {n - 1})  # ≤ 2,001 points
            axes.step([values[i] for i in picks], [(i + 1) / n for i in picks], where="post", color=colours[name],
                      label=name, linewidth=1)  # fmt: skip
        low, high = min((a for a, _ in spans), default=0.0), max((b for _, b in spans), default=0.0)
        if low > 0 and high > 20 * low:  # log where they span orders of magnitude
            axes.set_xscale("log")
        else:
            axes.locator_params(axis="x", nbins=5)
        spans.clear()
        axes.set_xlabel(f"{label} ({unit})")
        axes.set_ylim(0, 1.01)
        axes.set_title(label, fontsize=9, loc="left")
        axes.grid(alpha=0.3)
    panels[0].set_ylabel("fraction of requests")
    panels[0].legend(loc="lower right", fontsize=7)
    figure.suptitle(f"{scenario.name}: latency distributions (CDF)", fontsize=10)
    path = directory / "latency-cdf.png"
    figure.savefig(path, dpi=120)
    written.append(path)

    tiers = [(name, tier, stats) for name in names for tier, stats in sorted(results[name].metrics.kv.items())]
    if tiers:  # What each bounded KV tier held over time, against its capacity.
        figure = Figure(figsize=(6.4, 3.4), layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots()
        for name, tier, stats in tiers:
            step_s = stats.interval_ns / 1e9
            axes.step([k * step_s for k in range(len(stats.fill))], [b * stats.block_bytes / 1e9 for b in stats.fill],
                      where="post", color=colours[name], linestyle="-" if tier == "store" else "--",
                      label=f"{name}: {tier}", linewidth=1)  # fmt: skip
        for capacity in sorted({stats.capacity_bytes for _, _, stats in tiers}):
            axes.axhline(capacity / 1e9, color="grey", linewidth=0.8, linestyle=":")
        axes.set_xlabel("emulated time (s)")
        axes.set_ylabel("KV held (GB; dotted: capacity)")
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
        figure.suptitle(f"{scenario.name}: what each bounded KV tier held (most per second)", fontsize=10)
        path = directory / "kv.png"
        figure.savefig(path, dpi=110)
        written.append(path)
    return written


def trace_file(directory: Path, system: str) -> Path:
    """Where the Perfetto/Chrome trace of ``system`` goes: ``trace-<system>.json.gz`` (gzip: Perfetto opens it)."""
    return directory / f"trace-{system}.json.gz"


MIN_FREE_BYTES: Final = 16 << 20
"""A run's folder must have this much free space when the run starts (its logs, parts and outputs)."""


def make_output_folder(out: Path, option: str) -> None:
    """Create ``out`` for a run's files; a file, a read-only or full folder is refused before the run."""
    try:
        if out.exists() and not out.is_dir():
            raise UsageError(f"{option} {out}: is a file, expected a folder")
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):  # writable? (os.access says yes to root on some read-only mounts)
            pass
        free = shutil.disk_usage(out).free
    except OSError as error:
        raise UsageError(f"{option} {out}: cannot write there: {error.strerror or error}") from None
    if free < MIN_FREE_BYTES:
        raise UsageError(f"{option} {out}: {free:,} bytes free, expected at least {MIN_FREE_BYTES >> 20} MiB")


def write_outputs(out: Path, option: str, scenario: ClusterScenario, results: Mapping[str, SystemResult]) -> list[str]:
    """Write ``summary.json``, ``requests.csv`` and the plots into ``out``; returns the files' names."""
    try:
        text = json.dumps(summary(scenario, results), indent=2, allow_nan=False) + "\n"
        (out / "summary.json").write_text(text, encoding="utf-8")
        write_requests_csv(out / "requests.csv", results)
        plots = write_plots(out, scenario, results)
    except OSError as error:
        raise UsageError(f"{option} {out}: cannot write: {error.strerror or error}") from None
    return ["summary.json", "requests.csv", *(p.name for p in plots)]
