"""``dualpath-emu launch``: start a run scenario's processes (a live run's ``run.toml``) on this host, or write it
for processes started by hand (``--prepare``), or start this host's share of a prepared run (``--only``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dualpath_emu.errors import UsageError
from dualpath_emu.runtime.app import Registry
from dualpath_emu.runtime.launcher import LaunchError, LaunchInterrupted, LaunchResult, launch, launch_host
from dualpath_emu.runtime.run_setup import prepare
from dualpath_emu.runtime.scenario import DATAPLANE_PROCESS, RunScenario, check_overrides, load_run_scenario
from dualpath_emu.scenarios import find as find_scenario

__all__ = ["launch_command"]

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


def _say(args: argparse.Namespace, text: str) -> None:
    print(text, file=sys.stderr if args.json else sys.stdout, flush=True)


def launch_command(args: argparse.Namespace, registry: Registry) -> int:
    """``dualpath-emu launch`` of a scenario whose application and backend are ``registry``'s."""
    check_overrides(seed=args.seed, time_scale=args.time_scale)
    scenario = load_run_scenario(find_scenario(args.scenario), registry).with_overrides(
        seed=args.seed, time_scale=args.time_scale
    )
    if getattr(args, "prepare", False):
        return _prepare(args, scenario)
    if getattr(args, "only", None):
        return _launch_host(args, scenario)
    return _launch_realtime(args, scenario)


def _prepare(args: argparse.Namespace, scenario: RunScenario) -> int:
    if args.run_dir is None:
        raise UsageError("--prepare writes a real-time run's description: give --run-dir DIR")
    commands = prepare(scenario, args.run_dir)
    print(f"wrote {args.run_dir}/run.json; start the processes in this order (each on its host, with DIR shared "
          "or copied; ipc:// endpoints only work on one host):")  # fmt: skip
    for command in commands:
        print(f"  {command}")
    return 0


def _launch_host(args: argparse.Namespace, scenario: RunScenario) -> int:
    """``launch --only NAMES --run-dir DIR``: this host's processes of a prepared run."""
    if args.run_dir is None:
        raise UsageError("--only starts part of a prepared real-time run: give --run-dir DIR")
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    try:
        launch_host(
            scenario, args.run_dir, names, on_start=lambda name, pid: _say(args, f"  started {name} (pid {pid})")
        )
    except LaunchInterrupted as error:
        print(f"dualpath-emu: {error}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except LaunchError as error:
        print(f"dualpath-emu: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    _say(args, f"{', '.join(names)}: done; the run's files are in {args.run_dir}")
    return 0


def _launch_realtime(args: argparse.Namespace, scenario: RunScenario) -> int:
    dataplane = " and the data plane" if scenario.uses_dataplane else ""
    _say(
        args,
        f"{scenario.app.name}: {len(scenario.processes)} processes{dataplane} in real time (time scale "
        f"{scenario.time_scale}, {scenario.transport}), seed {scenario.seed}",
    )

    def started(name: str, pid: int) -> None:
        if name == DATAPLANE_PROCESS:
            _say(args, f"  started {name} (pid {pid}): the data plane (the run's core and every port)")
            return
        actors = ", ".join(scenario.process(name).actors)
        _say(args, f"  started {name} (pid {pid}): {actors}")

    try:
        result = launch(scenario, run_dir=args.run_dir, event_log=args.event_log, on_start=started)
    except LaunchInterrupted as error:
        print(f"dualpath-emu: {error}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except LaunchError as error:
        print(f"dualpath-emu: error: {error}\nseed {scenario.seed}", file=sys.stderr)
        return EXIT_FAILED
    out: dict[str, Any] = {
        "scenario": scenario.source, "mode": "realtime", "seed": scenario.seed, "summary": result.summary,
        "processes": result.processes, "messages_sent": result.delivery.sent, "events": result.events,
        "wall_s": round(result.wall_s, 3), "event_log_sha256": result.sha256, "dataplane": dataplane_summary(result),
    }  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"summary {json.dumps(result.summary, sort_keys=True)}")
    for name, process in result.processes.items():
        print(
            f"  {name}: {process['events']} events, counters {process['counters']}, "
            f"log sha256 {process['sha256'][:16]}…"
        )
    plane = out["dataplane"]
    if plane is not None:
        lag = plane["submission_lag_ns"]
        print(
            f"  data plane: {plane['counters']['requests']} requests, submission lag p50 {lag['p50_ns'] / 1e3:.0f} µs "
            f"p99 {lag['p99_ns'] / 1e3:.0f} µs"
        )
        for name, client in plane["processes"].items():
            delivery = client["delivery_lag_ns"]
            lag = (
                f"delivery lag p50 {delivery['p50_ns'] / 1e3:.0f} µs p99 {delivery['p99_ns'] / 1e3:.0f} µs"
                if delivery["count"]
                else "no core work"
            )
            print(
                f"    {name}: clock offset ±{client['offset_uncertainty_ns'] / 1e3:.0f} µs (RTT "
                f"{client['rtt_ns'] / 1e3:.0f} µs), {lag}"
            )
    print(f"{result.delivery.sent} messages sent, each delivered exactly once; {result.wall_s:.2f} s wall")
    print(f"event log sha256 {result.sha256}")
    return 0


def dataplane_summary(result: LaunchResult) -> dict[str, Any] | None:
    """The data plane's part of a run's summary (clocks, lags, ports, counters), or ``None``."""
    if result.dataplane is None:
        return None
    report = result.dataplane["report"]
    clients: dict[str, dict[str, Any]] = {
        name: p["dataplane"] for name, p in result.processes.items() if p.get("dataplane") is not None
    }
    return {
        "endpoint": result.dataplane.get("endpoint"),
        "counters": report["counters"],
        "submission_lag_ns": report["submission_lag_ns"],
        "processes": {
            name: {key: client[key] for key in ("rtt_ns", "offset_uncertainty_ns", "clock_check", "delivery_lag_ns")}
            for name, client in clients.items()
        },
        "ports": {
            name: {"completed_bytes": sum(counters["completed_bytes"]), "busy_s": counters["busy_s"]}
            for name, counters in report["ports"].items()
        },
    }
