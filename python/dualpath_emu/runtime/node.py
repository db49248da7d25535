"""One process of a live run: ``dualpath-emu node SCENARIO --process NAME --run-dir DIR`` (:func:`serve_process`).

Everything but the name comes from ``DIR/run.json``; the application and backend from the :class:`Registry` handed
to :func:`main`. The data plane (``dataplane``) serves the run's only core until every process said bye and the core
is idle. An actor process gets its plane from the backend, runs on a
:class:`~dualpath_emu.runtime.realtime.RealTimeLoop` on its clock, starts its actors and writes ``<name>.ready``; the
driver's process waits for the others' and ends with the driver, the others when told to stop, at the end of their
input or on SIGTERM/SIGINT; each then writes ``<name>.events`` and ``<name>.json`` (``.N`` suffixed for incarnation
``N``). Exit status 0, 1 (an actor failed or the data plane was lost), 3 (stopped before the driver was done). Under
a launcher a thread beats on a pipe (:class:`LauncherLink`); the process asks for SIGTERM if the launcher dies."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from dualpath_emu._core import Core
from dualpath_emu.config import ScenarioError
from dualpath_emu.errors import BackendUnavailable, UsageError, disk_error
from dualpath_emu.messages import Codec
from dualpath_emu.runtime.actors import ActorFailure
from dualpath_emu.runtime.app import SERVICE_REPORT, Application, Backend, PlaneRequest, Registry
from dualpath_emu.runtime.core_work import CoreWork
from dualpath_emu.runtime.dataplane.protocol import DataPlaneError
from dualpath_emu.runtime.dataplane.remote import RemoteDataPlane
from dualpath_emu.runtime.dataplane.service import DataPlaneService, ServiceCore
from dualpath_emu.runtime.eventlog import EventLogWriter, write_event_log
from dualpath_emu.runtime.realtime import WallClockCore
from dualpath_emu.runtime.scenario import DATAPLANE_PROCESS, INCARNATION_OPTION, ProcessSpec, RunDescription
from dualpath_emu.runtime.scenario import RunScenario, incarnation_stem, load_run_scenario
from dualpath_emu.scenarios import find as find_scenario
from dualpath_emu.runtime.security import RunKeys
from dualpath_emu.runtime.zmq_transport import ZmqActorSystem

__all__ = ["EXIT_FAILED", "EXIT_STOPPED", "LAUNCHER_ENV", "MODEL", "StoppedError", "serve_dataplane", "serve_process"]

EXIT_FAILED: Final = 1
EXIT_STOPPED: Final = 3
READY_TIMEOUT_S: Final = 60.0
"""How long (wall seconds) processes wait for each other: ready files, the welcome, every connection."""
LAUNCHER_ENV: Final = "DUALPATH_EMU_LAUNCHER"
"""``<launcher pid>:<heartbeat pipe fd>``, set by the launcher for its children."""
TEST_DIE_ENV: Final = "DUALPATH_EMU_TEST_ONLY_DIE"
"""**Test-only.** ``<run dir>|<process>|<seconds>``: process ``<process>`` (its first incarnation) of the run whose
run directory is ``<run dir>`` (resolved, exactly) kills itself with SIGKILL ``<seconds>`` emulated seconds after
its actors start, after holding its loop for :data:`TEST_DIE_QUIET_S` wall seconds (so that what it had sent has
left it: a death between two of its messages is not what the tests of a restart are about; see docs/live.md).
A value that names another run directory, another process or a later incarnation does nothing, so only a test
that made the run directory can trigger it."""
TEST_DIE_QUIET_S: Final = 0.1
LAUNCHER_BEAT_S: Final = 0.25
"""How often (wall seconds) a process started by the launcher writes a line to its heartbeat pipe."""
BUSY_AFTER_S: Final = 1.0
"""A loop that has not come round for this long (wall seconds) is said busy in the beats (see the module)."""
MAX_BEAT_BYTES: Final = 256  # The longest beat line: under PIPE_BUF, so each is written whole.
TEST_BUSY_ENV: Final = "DUALPATH_EMU_TEST_ONLY_BUSY"
"""**Test-only.** ``<run dir>|<process>|<seconds>|<wall seconds>``: as :data:`TEST_DIE_ENV`, but the process
holds its loop (computing) for ``<wall seconds>`` once, ``<seconds>`` emulated seconds after its actors start."""
QUIET_S: Final = 0.05
"""Once told to stop, a process keeps its actors until no message has come from another process for this
long (wall seconds) since the stop, at most :data:`QUIET_MAX_S`: the last turn's messages to others than the
driver (a decode group's DecodeDone to the scheduler) race the stop that the driver's completion sets off."""
QUIET_MAX_S: Final = 2.0

_T = TypeVar("_T")


class StoppedError(Exception):
    """The process was told to stop before its driver was done."""


def _counters(system: ZmqActorSystem) -> dict[str, int]:
    counters = {"dropped": system.dropped, "rejected": system.rejected}
    if system.incarnation is not None:
        counters["stale"] = system.counters["transport.stale"]
    return counters


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


class LauncherLink:
    """A child's side of the launcher's watch: a thread beats, so a busy loop is told from a stopped one."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._handle: asyncio.TimerHandle | None = None
        self._came_round = time.monotonic()
        self._loop_thread = threading.get_ident()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop, time_scale: float) -> None:
        """Mark each LAUNCHER_BEAT_S wall seconds on ``loop`` that it came round, and beat from a thread."""

        def came_round() -> None:
            self._came_round = time.monotonic()
            self._handle = loop.call_later(LAUNCHER_BEAT_S * time_scale, came_round)

        self._loop_thread = threading.get_ident()
        came_round()
        self._beat(".")
        self._thread = threading.Thread(target=self._beats, name="launcher-heartbeat", daemon=True)
        self._thread.start()

    def _beats(self) -> None:
        while not self._stopped.wait(LAUNCHER_BEAT_S):
            held = time.monotonic() - self._came_round
            if not self._beat("." if held < BUSY_AFTER_S else f"busy {held:.1f} {self._where()}"):
                return

    def _beat(self, line: str) -> bool:
        """Write one beat line; False once the pipe is unusable (the launcher is gone: stdin closes too)."""
        data = line.encode("utf-8", "replace")[: MAX_BEAT_BYTES - 1] + b"\n"
        try:
            os.write(self.fd, data)
        except (BlockingIOError, BrokenPipeError):
            pass  # the launcher reads late, or is gone
        except OSError:
            return False
        return True

    def _where(self) -> str:
        """The innermost frames of the loop's thread, ``file:line function`` (which handler holds it)."""
        frame = sys._current_frames().get(self._loop_thread)
        parts: list[str] = []
        while frame is not None and len(parts) < 3:
            code = frame.f_code
            parts.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
            frame = frame.f_back
        return " < ".join(parts) or "?"

    def stop(self) -> None:
        self._stopped.set()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _stop_event(watch_stdin: bool) -> asyncio.Event:
    """An event set on SIGTERM, SIGINT and (if asked) the end of standard input (inside the running loop)."""
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
    return stop


async def _serve(
    system: ZmqActorSystem, plane: CoreWork, scenario: RunScenario, spec: ProcessSpec, run_dir: Path, watch_stdin: bool,
    wait_ready: bool, launcher: LauncherLink | None, incarnation: int = 0,
) -> dict[str, Any] | None:  # fmt: skip
    app = scenario.app
    stop = _stop_event(watch_stdin)
    # A plane shared with other processes (the model backend's remote one, the host backend's) hears from the
    # driver's process, through the data plane or the byte channel, that the run is complete.
    plane.when_stop_requested(lambda reason: stop.set())
    if launcher is not None:
        launcher.start(asyncio.get_running_loop(), scenario.time_scale)
    _test_only_die(spec.name, incarnation, run_dir)
    _test_only_busy(spec.name, incarnation, run_dir)
    summary: dict[str, Any] | None = None
    await system.open()
    try:
        if incarnation > 0:
            await asyncio.sleep(0)  # a stop the data plane said at connect (the run is complete) is heard
        if stop.is_set() and incarnation > 0:
            # Started in place of one that died after its work was done: the run is complete, nothing to start.
            print(f"process {spec.name}: the run is complete already; its actors do not start", flush=True)
        else:
            for actor in system.actors:
                actor.start()
        (run_dir / f"{spec.name}.ready").touch()
        if spec is scenario.driver_process:
            others = [p.name for p in scenario.processes if p is not spec]

            async def drive() -> dict[str, Any]:
                if wait_ready:
                    await _wait_ready(run_dir, others, stop)
                return await app.drive(system)

            summary = await system.run(_first(drive(), stop))
        else:
            await system.run(_until_quiet(system, stop))
            summary = None
    finally:
        await system.close()
        # The actors are done: what they asked for is submitted; the driver's process, its run complete, has the
        # others told to stop (the data plane, the host backend's byte channel), or its own core drain.
        await plane.finish(run_complete=spec is scenario.driver_process and summary is not None)
    return summary


def data_plane_silence_s(scenario: RunScenario, description: RunDescription) -> float:
    """How long the data plane and a process may not hear from each other (heartbeat or busy timeout)."""
    if LAUNCHER_ENV in os.environ and scenario.transport == "ipc":
        return max(description.heartbeat_timeout_s, scenario.busy_timeout_s)
    return description.heartbeat_timeout_s


def _test_only_die(name: str, incarnation: int, run_dir: Path) -> None:
    """Arm the test-only death of :data:`TEST_DIE_ENV`, if it names this process of this run."""
    value = os.environ.get(TEST_DIE_ENV)
    if not value or incarnation != 0:
        return
    folder, _, rest = value.partition("|")
    process, _, seconds = rest.partition("|")
    if process != name or Path(folder).resolve() != Path(run_dir).resolve():
        return
    loop = asyncio.get_running_loop()

    def die() -> None:
        time.sleep(TEST_DIE_QUIET_S)  # the loop held: nothing more is sent, what was sent leaves
        print(f"process {name}: killing itself ({TEST_DIE_ENV}, test only)", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    loop.call_at(loop.time() + float(seconds), die)


def _test_only_busy(name: str, incarnation: int, run_dir: Path) -> None:
    """Arm the test-only busy spell of :data:`TEST_BUSY_ENV`, if it names this process of this run."""
    value = os.environ.get(TEST_BUSY_ENV)
    if not value or incarnation != 0:
        return
    folder, process, at_s, busy_s = (value.split("|") + ["", "", "", ""])[:4]
    if process != name or Path(folder).resolve() != Path(run_dir).resolve():
        return
    loop = asyncio.get_running_loop()

    def hold() -> None:
        print(f"process {name}: holding its loop for {busy_s} s ({TEST_BUSY_ENV}, test only)", flush=True)
        end = time.monotonic() + float(busy_s)
        while time.monotonic() < end:  # computing, as a large batch does (a sleep would not hold the interpreter)
            sum(range(1000))

    loop.call_at(loop.time() + float(at_s), hold)


async def _until_quiet(system: ZmqActorSystem, stop: asyncio.Event) -> None:
    """Wait for ``stop``, then until ``system`` has received nothing for :data:`QUIET_S` (see there)."""
    await stop.wait()
    stopped_ns = time.monotonic_ns()  # quiet since the stop: a process idle before it still waits for stragglers
    deadline = stopped_ns + round(QUIET_MAX_S * 1e9)
    quiet_ns = round(QUIET_S * 1e9)
    while (now := time.monotonic_ns()) < deadline:
        idle_ns = now - max(system.last_delivery_ns, stopped_ns)
        if idle_ns >= quiet_ns:
            return
        await asyncio.sleep((quiet_ns - idle_ns) / 1e9)


def serve_process(
    scenario: RunScenario, name: str, description: RunDescription, run_dir: Path, *, watch_stdin: bool = False,
    wait_ready: bool = True, launcher: LauncherLink | None = None, incarnation: int = 0,
) -> int:  # fmt: skip
    """Run process ``name`` until done or told to stop; return its exit status (``incarnation`` > 0: a restart)."""
    if name == DATAPLANE_PROCESS:
        return serve_dataplane(scenario, description, run_dir, watch_stdin=watch_stdin, launcher=launcher)
    spec = scenario.process(name)
    app = scenario.app
    endpoints = description.endpoints
    started = time.perf_counter()
    keys = _load_keys(description, name)
    stem = incarnation_stem(name, incarnation)
    try:
        plane = _process_plane(scenario, name, description, keys, run_dir, incarnation)
    except (DataPlaneError, ScenarioError, LookupError) as error:  # lost, or another scenario than the data plane's
        print(f"process {name!r}: {error}", file=sys.stderr)
        return EXIT_FAILED
    loop = plane.new_loop()
    others = [p for p in scenario.processes if p is not spec]
    system = ZmqActorSystem(
        Codec(app.registry()), bind=endpoints[spec.name],
        address_book={a: endpoints[p.name] for p in others for a in p.actors},
        peers={endpoints[p.name]: p.name for p in others}, keys=keys, name=spec.name, latency_s=scenario.latency_s,
        data_plane=plane, incarnation=incarnation if scenario.restart_crashed else None,
    )  # fmt: skip
    log: EventLogWriter | None = None
    if name in scenario.restart_crashed:  # it may die: its event log is written as it goes (see the module)
        log = EventLogWriter(run_dir / f"{stem}.events")
        writer = log

        def sink(events: list[tuple[int, int, str, str, str]], first_seq: int) -> None:
            writer.write_numbered(events, first_seq)
            writer.flush()

        system.set_event_sink(sink)
    for actor in spec.actors:
        app.create_actor(system, actor, restarted=incarnation > 0)  # (the cluster's groups start by saying so)
    if incarnation > 0:
        print(f"process {name}: incarnation {incarnation}, in place of one that died", flush=True)
    status: int = 0
    summary: dict[str, Any] | None = None
    failure: ActorFailure | None = None
    try:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            serving = _serve(system, plane, scenario, spec, run_dir, watch_stdin, wait_ready, launcher, incarnation)
            summary = runner.run(plane.run(serving))
    except ActorFailure as error:
        status, failure = EXIT_FAILED, error
        print(f"{error}\nseed {scenario.seed}", file=sys.stderr)
    except StoppedError as error:
        status = EXIT_STOPPED
        print(f"process {name!r}: {error}", file=sys.stderr)
    except (DataPlaneError, BackendUnavailable) as error:
        status = EXIT_FAILED
        print(f"process {name!r}: {error}\nseed {scenario.seed}", file=sys.stderr)
    finally:
        plane.close()
        if launcher is not None:
            launcher.stop()
    wall_s = time.perf_counter() - started
    app.write_part(run_dir / f"{stem}.part")
    if scenario.shares_core and isinstance(plane, WallClockCore):  # a one-process run: it owns the run's core
        _write_service_report(app, plane.core, run_dir)
    if log is not None:
        system.flush_events()
        log.close()
        sha256, count = log.sha256(), system.event_count
    else:
        events = system.raw_events()
        sha256, count = write_event_log(events, run_dir / f"{stem}.events"), len(events)
    result = {
        "process": name, "incarnation": incarnation, "status": status, "events": count, "sha256": sha256,
        "wall_s": wall_s, "cpu_s": round(time.process_time(), 3), "counters": _counters(system), "summary": summary,
        "failure": str(failure) if failure is not None else None, "dataplane": plane.report(),
        "delivery_lag": plane.delivery_lag.to_wire(),
    }  # fmt: skip
    (run_dir / f"{stem}.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"process {name}: {count} events, event log sha256 {sha256}", flush=True)
    return status


def _process_plane(
    scenario: RunScenario, name: str, description: RunDescription, keys: RunKeys | None, run_dir: Path,
    incarnation: int = 0,
) -> WallClockCore | RemoteDataPlane:  # fmt: skip
    """The data plane of process ``name`` of a live run: its backend's (default :data:`MODEL`)."""
    backend = scenario.backend if scenario.backend is not None else MODEL
    return backend.plane(PlaneRequest(scenario.app, name, scenario, description, keys, run_dir, incarnation))


def _model_plane(request: PlaneRequest) -> WallClockCore | RemoteDataPlane:
    """The model backend's plane: a one-process run's own core, else the data-plane service's (connected, synced)."""
    app, scenario, description, name = request.app, request.scenario, request.description, request.process
    if description.dataplane_endpoint is None:
        core = Core(clock="wall", time_scale=scenario.time_scale, **app.core_options())
        app.build_core(core)
        return WallClockCore(core)
    plane = RemoteDataPlane(
        description.dataplane_endpoint, name, time_scale=scenario.time_scale, keys=request.keys,
        peer_name=DATAPLANE_PROCESS, connect_timeout_s=READY_TIMEOUT_S,
        heartbeat_timeout_s=data_plane_silence_s(scenario, description), incarnation=request.incarnation,
    )  # fmt: skip
    try:
        app.use_layout(plane.layout)
    except BaseException:
        plane.close()
        raise
    print(
        f"process {name}: connected to the data plane at {plane.endpoint}; clock offset ±"
        f"{plane.sync.offset_uncertainty_ns / 1e3:.0f} µs (RTT {plane.sync.rtt_ns / 1e3:.0f} µs)",
        flush=True,
    )
    return plane


MODEL: Final = Backend("model", _model_plane)
"""The model backend: no bytes move; one core models every process's work (the service's, or its own)."""


def serve_dataplane(
    scenario: RunScenario, description: RunDescription, run_dir: Path, *, watch_stdin: bool = False,
    launcher: LauncherLink | None = None,
) -> int:  # fmt: skip
    """Run the data-plane process until drained, writing ``<run_dir>/dataplane.json``; returns its exit status."""
    if description.dataplane_endpoint is None:
        print(f"dualpath-emu node: error: {run_dir}/run.json: this run has no data plane", file=sys.stderr)
        return 2
    core = Core(clock="wall", time_scale=scenario.time_scale, **scenario.app.core_options())
    storage = _StorageRecorder(core)
    scenario.app.build_core(storage)  # type: ignore[arg-type]  # a Core in all it is asked for
    keys = _load_keys(description, DATAPLANE_PROCESS)
    plane = ServiceCore(core)
    loop = plane.new_loop()
    service = DataPlaneService(
        plane, bind=description.dataplane_endpoint, requesters=description.requesters, name=DATAPLANE_PROCESS,
        keys=keys, heartbeat_timeout_s=data_plane_silence_s(scenario, description), connect_timeout_s=READY_TIMEOUT_S,
        replaceable=scenario.restart_crashed, storage_paths=storage.paths(),
    )  # fmt: skip

    async def main() -> str:
        stop = _stop_event(watch_stdin)
        if launcher is not None:
            launcher.start(asyncio.get_running_loop(), scenario.time_scale)
        service.open()
        (run_dir / f"{DATAPLANE_PROCESS}.ready").touch()
        print(
            f"data plane: {core.port_count} ports, {core.storage_node_count} storage nodes at {service.endpoint}; "
            f"expecting {', '.join(description.requesters)}",
            flush=True,
        )
        return await service.serve(stop)

    started = time.perf_counter()
    status, outcome, failure = 0, "drained", None
    try:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            outcome = runner.run(main())
        if outcome != "drained":
            status = EXIT_STOPPED
            print("data plane: told to stop before every process said bye", file=sys.stderr)
    except DataPlaneError as error:
        status, outcome, failure = EXIT_FAILED, "failed", str(error)
        print(f"{error}\nseed {scenario.seed}", file=sys.stderr)
    finally:
        if launcher is not None:
            launcher.stop()
    report = service.report()
    if status == 0:
        _write_service_report(scenario.app, core, run_dir)
    result = {
        "process": DATAPLANE_PROCESS, "status": status, "outcome": outcome, "failure": failure,
        "wall_s": time.perf_counter() - started, "cpu_s": round(time.process_time(), 3),
        "endpoint": description.dataplane_endpoint, "report": report,
    }  # fmt: skip
    (run_dir / f"{DATAPLANE_PROCESS}.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    counters = report["counters"]
    print(
        f"data plane: {counters['requests']} requests in {counters['batches']} batches from "
        f"{len(report['requesters'])} processes, {counters['rejected']} frames rejected; {outcome}",
        flush=True,
    )
    return status


class _StorageRecorder:
    """A :class:`Core` as an application builds it, noting where storage I/Os go (for the service's tallies)."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self._ports: tuple[int, int] | None = None
        self._nodes: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def configure_storage(self, *, read_port: int, write_port: int, **options: Any) -> None:
        self._core.configure_storage(read_port=read_port, write_port=write_port, **options)
        self._ports = (read_port, write_port)

    def add_storage_node(self, name: str, *, read_path: Any, write_path: Any, **options: Any) -> int:
        read, write = tuple(read_path), tuple(write_path)
        node = self._core.add_storage_node(name, read_path=read, write_path=write, **options)
        self._nodes[node] = (read, write)
        return node

    def paths(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        """Storage node -> the ports its reads cross and those its writes cross (the storage's own included)."""
        if self._ports is None:
            return {}
        read_port, write_port = self._ports
        return {node: ((read_port, *read), (*write, write_port)) for node, (read, write) in self._nodes.items()}


def _write_service_report(app: Application, core: Core, run_dir: Path) -> None:
    """The application's report of the run's core, if it has one, to ``run_dir/SERVICE_REPORT`` (0600)."""
    report = app.service_report(core)
    if report is None:
        return
    fd = os.open(run_dir / SERVICE_REPORT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(report, file)


def _load_keys(description: RunDescription, process: str) -> RunKeys | None:
    """The run's keys as ``process``, or ``None`` when the run has none."""
    if description.keys is None:
        return None
    return RunKeys.load(Path(description.keys), process)


def set_parent_death_signal(parent_pid: int) -> None:
    """Linux: get SIGTERM when the parent dies. Exit at once if it is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(EXIT_STOPPED)


def _launcher_from_env() -> tuple[int, int] | None:
    value = os.environ.get(LAUNCHER_ENV)
    if not value:
        return None
    pid, _, fd = value.partition(":")
    try:
        return int(pid), int(fd)
    except ValueError:
        return None


def main(argv: Sequence[str], registry: Registry) -> int:
    """``dualpath-emu node``: one process of a real-time run, its application and backend from ``registry``."""
    parser = argparse.ArgumentParser(
        prog="dualpath-emu node",
        description="Run one process of a real-time run: `dualpath-emu launch` starts one per [[process]] (and the "
        "data plane); on several hosts, write the run description with `dualpath-emu launch SCENARIO --prepare "
        "--run-dir DIR`, copy DIR to each host (or share it) and start each process there, "
        "the data plane first.",
    )
    parser.add_argument("scenario", help="the run scenario's TOML file (a live run's run.toml)")
    parser.add_argument(
        "--process", required=True, help=f"the [[process]] to run, or {DATAPLANE_PROCESS!r} for the data plane"
    )
    parser.add_argument(
        "--run-dir", required=True, type=Path,
        help="the run directory: holds the run description run.json (endpoints, seed, time scale, keys), and "
        "receives ready files, logs and results",
    )  # fmt: skip
    parser.add_argument(
        "--no-ready-wait",
        action="store_true",
        help="the driver's process starts at once instead of waiting for the others' ready files in the run "
        "directory (on several hosts without a shared run directory: start the driver's process last)",
    )
    parser.add_argument(
        INCARNATION_OPTION, type=int, default=0, metavar="N",
        help="0 (default): the process's first start; N > 0: it is started in place of one that died (the run's "
        "restart_crashed): its files get the suffix .N and what was sent to the dead one is dropped",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.incarnation < 0:
        parser.error(f"{INCARNATION_OPTION}: expected 0, 1, 2, …, got {args.incarnation}")
    launcher = _launcher_from_env()
    if launcher is not None:
        set_parent_death_signal(launcher[0])
    try:
        description = RunDescription.read(args.run_dir)
        scenario = load_run_scenario(find_scenario(args.scenario), registry).with_overrides(
            seed=description.seed, time_scale=description.time_scale
        )
        if args.process != DATAPLANE_PROCESS:
            scenario.process(args.process)  # a ScenarioError naming the known ones
            if args.process not in description.endpoints:
                raise ScenarioError(f"{args.run_dir}/run.json: no endpoint for process {args.process!r}")
        if args.incarnation and args.process not in scenario.restart_crashed:
            raise ScenarioError(f"{INCARNATION_OPTION} {args.incarnation}: process {args.process!r} is not one the run "
                                "restarts (restart_crashed)")  # fmt: skip
    except UsageError as error:
        print(f"dualpath-emu node: error: {error}", file=sys.stderr)
        return 2
    try:
        return serve_process(
            scenario, args.process, description, args.run_dir, watch_stdin=launcher is not None,
            wait_ready=not args.no_ready_wait, launcher=LauncherLink(launcher[1]) if launcher is not None else None,
            incarnation=args.incarnation,
        )  # fmt: skip
    except OSError as error:
        full = disk_error(error)
        if full is None:
            raise
        print(f"dualpath-emu node {args.process}: error: {full} (run directory {args.run_dir})", file=sys.stderr)
        return 2
