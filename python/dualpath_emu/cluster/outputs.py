"""What ``dualpath-emu run`` writes: the summary (``--json``, ``summary.json``), ``requests.csv``, the plots.

* :func:`summary` — ``scenario``, ``seed``, ``systems.<name>`` (:meth:`SystemResult.summary`: JCT, turns,
  percentiles, NIC bytes and utilisation, the event log's SHA-256, wall time, events) and
  ``speedup_vs_basic.<name>`` (Basic's JCT / the system's; null without a Basic run), plus the scenario's
  settings under ``config`` and ``workload``.
* :func:`write_requests_csv` — one row per request per system, from :class:`~dualpath_emu.cluster.metrics.Metrics`;
  times in seconds since the run's start, empty where never reached; ``read_side`` is ``pe`` or ``de`` (the
  node whose storage NIC read the hit KV), ``none`` without a hit or under Oracle (no reads).
* :func:`write_plots` — ``jct.png`` (JCT per system) and ``snic-util.png`` (storage-NIC read utilisation over
  time, prefill vs decode nodes, one panel per system), drawn with matplotlib's Agg backend (no display).
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from dualpath_emu import __version__
from dualpath_emu.cluster.run import SystemResult
from dualpath_emu.cluster.scenario import ClusterScenario
from dualpath_emu.cluster.systems import SYSTEMS, System

__all__ = ["CSV_COLUMNS", "summary", "trace_file", "write_plots", "write_requests_csv"]

CSV_COLUMNS: Final = (
    "system", "rid", "agent", "prompt", "hit", "gen", "arrive_s", "first_token_s", "second_token_s", "done_s",
    "read_side", "pe", "de",
)  # fmt: skip


def summary(scenario: ClusterScenario, results: Mapping[str, SystemResult]) -> dict[str, Any]:
    """The run's JSON-able summary."""
    basic = results.get("basic")
    speedup: dict[str, float | None] = {}
    for name, result in results.items():
        ok = basic is not None and result.jct_s > 0
        speedup[name] = basic.jct_s / result.jct_s if basic is not None and ok else None
    config = dataclasses.asdict(scenario.config)
    return {
        "scenario": scenario.name,
        "source": scenario.source,
        "description": scenario.describe(),
        "seed": scenario.seed,
        "version": __version__,
        "config": config,
        "workload": {
            "dataset": None if scenario.trace is not None else scenario.config.dataset,
            "trace": None if scenario.trace is None else str(scenario.trace),
            "agents": scenario.config.agents,
            "max_rounds": scenario.max_rounds,
            "mode": scenario.config.mode,
            "generator": dataclasses.asdict(scenario.generator),
        },
        "systems": {name: result.summary() for name, result in results.items()},
        "speedup_vs_basic": speedup,
    }


def _seconds(ns: int) -> str:
    return "" if ns < 0 else f"{ns / 1e9:.9f}"


def write_requests_csv(path: Path, results: Mapping[str, SystemResult]) -> int:
    """Write ``requests.csv``; returns the number of rows (requests over all systems)."""
    rows = 0
    with open(path, "w", newline="", encoding="utf-8") as file:
        out = csv.writer(file)
        out.writerow(CSV_COLUMNS)
        for name, result in results.items():
            m = result.metrics
            spec: System | None = result.spec or SYSTEMS.get(name)
            oracle = spec is not None and spec.oracle
            for rid in range(len(m)):
                on_de = m.read_on_de[rid]
                side = "none" if oracle or m.hit[rid] == 0 or on_de < 0 else ("de" if on_de else "pe")
                out.writerow((
                    name, rid, m.agent[rid], m.prompt[rid], m.hit[rid], m.gen[rid], _seconds(m.arrive_ns[rid]),
                    _seconds(m.first_token_ns[rid]), _seconds(m.second_token_ns[rid]), _seconds(m.done_ns[rid]),
                    side, "" if m.pe[rid] < 0 else m.pe[rid], "" if m.de[rid] < 0 else m.de[rid],
                ))  # fmt: skip
                rows += 1
    return rows


def write_plots(directory: Path, scenario: ClusterScenario, results: Mapping[str, SystemResult]) -> list[Path]:
    """Write ``jct.png`` and (when the runs sampled utilisation) ``snic-util.png``; returns the paths."""
    # The object API with an explicit Agg canvas: no pyplot global state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    written: list[Path] = []
    names = list(results)
    figure = Figure(figsize=(max(4.0, 1.3 * len(names) + 2), 3.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    jcts = [results[n].jct_s for n in names]
    bars = axes.bar(names, jcts, color=[_colour(n) for n in names])
    axes.bar_label(bars, labels=[f"{v:,.0f} s" for v in jcts], padding=2, fontsize=8)
    axes.set_ylabel("JCT (s)")
    axes.set_title(f"{scenario.name}: job completion time", fontsize=10)
    axes.margins(y=0.15)
    axes.tick_params(axis="x", labelsize=8)
    path = directory / "jct.png"
    figure.savefig(path, dpi=120)
    written.append(path)

    sampled = [n for n in names if results[n].snic_timeline]
    if sampled:
        figure = Figure(figsize=(7.5, 1.9 * len(sampled) + 0.6), layout="constrained")
        FigureCanvasAgg(figure)
        panels = figure.subplots(len(sampled), 1, sharex=True, squeeze=False)[:, 0]
        for axes, name in zip(panels, sampled):
            result = results[name]
            for role, label, colour in (("pe", "prefill nodes", "tab:blue"), ("de", "decode nodes", "tab:orange")):
                series = result.snic_timeline.get(role, [])
                times = [i * result.sample_interval_s for i in range(len(series))]
                axes.plot(times, [100 * v for v in series], label=label, color=colour, linewidth=1)
            axes.set_ylim(0, 105)
            axes.set_ylabel("SNIC read %")
            axes.set_title(name, fontsize=9, loc="left")
            axes.legend(loc="upper right", fontsize=7)
        panels[-1].set_xlabel("emulated time (s)")
        figure.suptitle(f"{scenario.name}: storage-NIC utilisation (reads), mean per node", fontsize=10)
        path = directory / "snic-util.png"
        figure.savefig(path, dpi=120)
        written.append(path)
    return written


def _colour(system: str) -> str:
    palette = {"basic": "tab:gray", "dualpath": "tab:green", "oracle": "tab:purple"}
    return palette.get(system, "tab:blue")


def trace_file(directory: Path, system: str) -> Path:
    """Where the Perfetto/Chrome trace of ``system`` goes: ``trace-<system>.json``."""
    return directory / f"trace-{system}.json"

