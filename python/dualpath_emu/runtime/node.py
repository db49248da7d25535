"""Running an application: all of it in virtual time, or one process of a real-time run (issue 3).

:func:`run_virtual` runs every actor of a scenario in this process on a
:class:`~dualpath_emu.runtime.VirtualTimeLoop`: deterministic, the same scenario and seed give the same
event log byte for byte. :func:`serve_process` runs the actors of one ``[[process]]`` on a
:class:`~dualpath_emu.runtime.RealTimeLoop` with a :class:`~dualpath_emu.runtime.ZmqActorSystem`; the
launcher (:mod:`dualpath_emu.runtime.launcher`) starts one per process with ``python -m
dualpath_emu.runtime.node``, and on several hosts they can be started by hand (``dualpath-emu node``).

A process of a real-time run:

1. builds its core (wall clock, the scenario's time scale) and its actors, binds its endpoint and starts
   the actors, then writes ``<run_dir>/<name>.ready``;
2. the driver's process waits until every other process is ready (their ready files; ``--no-ready-wait``
   skips this, for hosts without a shared run directory: start the driver's process last), runs the application's driver and ends
   when it returns; any other process runs until it is told to stop: its standard input closes (the
   launcher closes it, or dies), or it gets SIGTERM or SIGINT;
3. it always writes its event log ``<run_dir>/<name>.events`` and ``<run_dir>/<name>.json`` (counters,
   the log's SHA-256 and, for the driver, the run's summary). Exit status 0 on success, 1 if an actor
   failed (the failure, the seed and the last events are printed), 3 when stopped before the driver was
   done.

On Linux a child asks the kernel to send it SIGTERM if its parent dies (``PR_SET_PDEATHSIG``), so a
killed launcher leaves no orphans; closing standard input does the same on any system.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from dualpath_emu._core import Core
from dualpath_emu.config import ScenarioError
from dualpath_emu.errors import UsageError
from dualpath_emu.messages import Codec
from dualpath_emu.runtime.actors import ActorFailure, ActorSystem
from dualpath_emu.runtime.eventlog import write_event_log
from dualpath_emu.runtime.realtime import RealTimeLoop
from dualpath_emu.runtime.scenario import ProcessSpec, RunScenario, load_run_scenario
from dualpath_emu.scenarios import find as find_scenario
from dualpath_emu.runtime.virtual_loop import run as run_virtual_loop
from dualpath_emu.runtime.zmq_transport import ZmqActorSystem

__all__ = ["EXIT_FAILED", "EXIT_STOPPED", "RunResult", "StoppedError", "run_virtual", "serve_process"]

EXIT_FAILED: Final = 1
EXIT_STOPPED: Final = 3
READY_TIMEOUT_S: Final = 60.0
"""How long (wall seconds) the driver's process waits for the others to be ready."""

_T = TypeVar("_T")


class StoppedError(Exception):
    """The process was told to stop before its driver was done."""


@dataclass
class RunResult:
    """What a run (or one process of it) produced."""

    summary: dict[str, Any] | None
    events: int
    sha256: str
    wall_s: float
    counters: dict[str, int]
    failure: ActorFailure | None = None


def _counters(system: ActorSystem) -> dict[str, int]:
    counters = {"dropped": system.dropped, "unhandled": system.unhandled}
    if isinstance(system, ZmqActorSystem):
        counters["rejected"] = system.rejected
    return counters


def run_virtual(scenario: RunScenario, event_log: Path | None = None) -> RunResult:
    """Run every actor of ``scenario`` in this process in virtual time; write the event log if asked.

    An actor failure does not raise: it is in :attr:`RunResult.failure` (the log is still written).
    """
    app = scenario.app
    core = Core()
    app.build_core(core)
    system = ActorSystem(latency_s=scenario.latency_s, seed=scenario.seed)
    for name in app.actor_names():
        app.create_actor(system, name)

    async def main() -> dict[str, Any]:
        for actor in system.actors:
            actor.start()
        return await app.drive(system)

    started = time.perf_counter()
    summary: dict[str, Any] | None = None
    failure: ActorFailure | None = None
    try:
        summary = run_virtual_loop(system.run(main()), core)
    except ActorFailure as error:
        failure = error
    wall_s = time.perf_counter() - started
    sha256 = write_event_log(system.raw_events(), event_log)
    return RunResult(summary, system.event_count, sha256, wall_s, _counters(system), failure)


async def _first(main: Awaitable[_T], stop: asyncio.Event) -> _T:
    """``main``'s result, or :class:`StoppedError` if ``stop`` is set first (``main`` is then cancelled)."""
    task = asyncio.ensure_future(main)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise StoppedError("told to stop before the run was complete")
    return task.result()


async def _wait_ready(run_dir: Path, others: Sequence[str], stop: asyncio.Event) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all((run_dir / f"{name}.ready").exists() for name in others):
        if stop.is_set():
            raise StoppedError("told to stop while waiting for the other processes")
        if time.monotonic() > deadline:
            missing = [n for n in others if not (run_dir / f"{n}.ready").exists()]
            raise TimeoutError(f"processes {missing} were not ready after {READY_TIMEOUT_S} s")
        await asyncio.sleep(0.01)


async def _serve(
    system: ZmqActorSystem,
    scenario: RunScenario,
    spec: ProcessSpec,
    run_dir: Path,
    watch_stdin: bool,
    wait_ready: bool,
) -> dict[str, Any] | None:
    app = scenario.app
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if watch_stdin:
        stdin = sys.stdin.fileno()

        def on_stdin() -> None:
            if not os.read(stdin, 4096):  # end of file: the launcher closed it, or is gone
                loop.remove_reader(stdin)
                stop.set()

        loop.add_reader(stdin, on_stdin)
    await system.open()
    try:
        for actor in system.actors:
            actor.start()
        (run_dir / f"{spec.name}.ready").touch()
        if spec is scenario.driver_process:
            others = [p.name for p in scenario.processes if p is not spec]

            async def drive() -> dict[str, Any]:
                if wait_ready:
                    await _wait_ready(run_dir, others, stop)
                return await app.drive(system)

            summary: dict[str, Any] | None = await system.run(_first(drive(), stop))
        else:
            await system.run(stop.wait())
            summary = None
    finally:
        await system.close()
    return summary


def serve_process(
    scenario: RunScenario,
    name: str,
    endpoints: Mapping[str, str],
    run_dir: Path,
    *,
    watch_stdin: bool = False,
    wait_ready: bool = True,
) -> int:
    """Run process ``name`` of a real-time run until it is done or told to stop; return its exit status."""
    spec = scenario.process(name)
    app = scenario.app
    core = Core(clock="wall", time_scale=scenario.time_scale)
    app.build_core(core)
    system = ZmqActorSystem(
        Codec(app.registry()),
        bind=endpoints[spec.name],
        address_book={a: endpoints[p.name] for p in scenario.processes if p is not spec for a in p.actors},
        latency_s=scenario.latency_s,
        seed=scenario.seed,
    )
    for actor in spec.actors:
        app.create_actor(system, actor)
    started = time.perf_counter()
    status: int = 0
    summary: dict[str, Any] | None = None
    failure: ActorFailure | None = None
    try:
        with asyncio.Runner(loop_factory=lambda: RealTimeLoop(core)) as runner:
            summary = runner.run(_serve(system, scenario, spec, run_dir, watch_stdin, wait_ready))
    except ActorFailure as error:
        status, failure = EXIT_FAILED, error
        print(f"{error}\nseed {scenario.seed}", file=sys.stderr)
    except StoppedError as error:
        status = EXIT_STOPPED
        print(f"process {name!r}: {error}", file=sys.stderr)
    wall_s = time.perf_counter() - started
    events = system.raw_events()
    sha256 = write_event_log(events, run_dir / f"{name}.events")
    result = {
        "process": name,
        "status": status,
        "events": len(events),
        "sha256": sha256,
        "wall_s": wall_s,
        "counters": _counters(system),
        "summary": summary,
        "failure": str(failure) if failure is not None else None,
    }
    (run_dir / f"{name}.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"process {name}: {len(events)} events, event log sha256 {sha256}", flush=True)
    return status


def set_parent_death_signal(parent_pid: int) -> None:
    """Linux: get SIGTERM when the parent dies. Exit at once if it is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(EXIT_STOPPED)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dualpath_emu.runtime.node``: one process of a real-time run (see the module)."""
    parser = argparse.ArgumentParser(
        prog="dualpath-emu node",
        description="Run one process of a real-time run: `dualpath-emu launch` starts one per [[process]]; on "
        "several hosts, start one by hand on each.",
    )
    parser.add_argument("scenario", help="run scenario TOML file, or a packaged one's name (e.g. pipeline)")
    parser.add_argument("--process", required=True, help="the [[process]] to run")
    parser.add_argument("--run-dir", required=True, type=Path, help="directory for ready files, logs, results")
    parser.add_argument("--endpoints", help="JSON object: process name -> endpoint (default: the scenario's)")
    parser.add_argument("--seed", type=int, help="override the scenario's seed (every process of a run needs the same)")
    parser.add_argument("--time-scale", type=float, help="override the scenario's emulated seconds per wall second")
    parser.add_argument("--parent-pid", type=int, help="exit when this process (the launcher) dies")
    parser.add_argument(
        "--no-ready-wait",
        action="store_true",
        help="the driver's process starts at once instead of waiting for the others' ready files in the run "
        "directory (on several hosts without a shared run directory: start the driver's process last)",
    )
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        set_parent_death_signal(args.parent_pid)
    try:
        scenario = load_run_scenario(find_scenario(args.scenario)).with_overrides(
            seed=args.seed, mode="realtime", time_scale=args.time_scale
        )
        if args.endpoints is not None:
            endpoints: dict[str, str] = json.loads(args.endpoints)
        else:
            endpoints = {p.name: p.endpoint or "" for p in scenario.processes}
            unset = [name for name, endpoint in endpoints.items() if not endpoint]
            if unset:
                raise ScenarioError(f"{scenario.source}: process {unset[0]!r} has no endpoint (give --endpoints)")
    except (UsageError, json.JSONDecodeError) as error:
        print(f"dualpath-emu node: error: {error}", file=sys.stderr)
        return 2
    args.run_dir.mkdir(parents=True, exist_ok=True)
    return serve_process(
        scenario,
        args.process,
        endpoints,
        args.run_dir,
        watch_stdin=args.parent_pid is not None,
        wait_ready=not args.no_ready_wait,
    )


if __name__ == "__main__":
    sys.exit(main())
