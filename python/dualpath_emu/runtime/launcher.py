"""The real-time launcher: one command starts every process of a run and always stops them all (issues 3, 14).

:func:`launch` writes the run description ``<run_dir>/run.json`` (mode 0600: endpoints, the data plane's
endpoint, seed, time scale, heartbeat timeout, where keys live; :class:`~dualpath_emu.runtime.scenario.RunDescription`)
and starts one ``python -m dualpath_emu.runtime.node SCENARIO --process NAME --run-dir DIR`` child per
``[[process]]`` of a scenario -- first, in a run of more than one process, the data-plane service
(``dataplane``), which owns the run's only core (docs/architecture.md). Each child runs in its own session (a
terminal's Ctrl-C reaches only the launcher) with its output in ``<run_dir>/<name>.out``; ipc:// sockets live
in a directory of mode 0700. Then the launcher watches them:

* **completion** -- the driver's process says so in its bye to the data plane, which tells the other actor
  processes to stop (by message: the same on several hosts without a launcher); each stops its actors, says
  bye, writes its event log and results and exits 0; the data plane, once every process said bye and its
  core is idle, writes its final counters (``dataplane.json``) and exits 0 by itself. The launcher, seeing
  the driver's process exit 0, also closes the others' standard input (the way a one-process run, or one
  whose data plane is slow to tell them, stops);
* **a crashed child** -- any child exits non-zero (or is killed) before that: the run has failed; the
  launcher stops the others and raises :class:`LaunchError` naming the process, how it ended, and the
  last lines of its output;
* **a hung child** -- every child writes a byte to a pipe (its heartbeat) every 0.25 s from its asyncio
  loop; a child silent for ``hang_timeout_s`` (SIGSTOP, a loop stuck in a callback) fails the run the same
  way, naming it and how long it was silent (before its first beat a child has :data:`STARTUP_TIMEOUT_S`);
* **Ctrl-C / SIGTERM** to the launcher, or ``timeout_s`` passing: the same, with that reason
  (:class:`LaunchInterrupted` for a signal).

Stopping means: close standard input, then SIGTERM after a grace period, then SIGKILL (at once for a hung
child), and always wait for the child, so no process outlives the launcher. A launcher that is itself killed
with SIGKILL cannot do this; its children then get SIGTERM from the kernel (``PR_SET_PDEATHSIG``, Linux) and
see their standard input close (everywhere). Every child's output, event log and results stay in the run
directory.

After a complete run the launcher reads every process's event log and checks that each message sent
(``tell``/``ask``) was delivered (or dropped at a stopped actor) exactly once, across processes.

**Keys.** A run that reaches any process over ``tcp://`` gets a CURVE key pair per process (the data plane's
included) in ``<run_dir>/keys`` (0700; :class:`~dualpath_emu.runtime.security.RunKeys`), named in the run
description; every socket of the run is then authenticated and encrypted. ipc:// runs need none (their
sockets' directory is private).

**By hand, on several hosts**: :func:`prepare` (``dualpath-emu launch SCENARIO --mode realtime --prepare
--run-dir DIR``) writes the run description (and, for tcp://, the keys) and returns the command that starts
each process; copy (or share) ``DIR`` and run them, the data plane first. Give every process an ``endpoint``
and the scenario a ``dataplane_endpoint`` reachable from the other hosts (tcp://).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

from dualpath_emu.errors import UsageError
from dualpath_emu.inputs import short_repr
from dualpath_emu.runtime.app import SERVICE_REPORT
from dualpath_emu.runtime.eventlog import EventLogWriter, parse_line
from dualpath_emu.runtime.node import LAUNCHER_ENV
from dualpath_emu.runtime.security import RunKeys
from dualpath_emu.runtime.scenario import DATAPLANE_PROCESS, RUN_DESCRIPTION, ProcessSpec, RunDescription, RunScenario

__all__ = [
    "DeliveryReport",
    "LaunchError",
    "LaunchInterrupted",
    "LaunchResult",
    "check_delivery",
    "dataplane_summary",
    "describe_run",
    "launch",
    "launch_host",
    "prepare",
]

STOP_GRACE_S: Final = 10.0
"""How long a child has to stop after its standard input is closed, and again after SIGTERM."""
STARTUP_TIMEOUT_S: Final = 60.0
"""How long a child may take to its first heartbeat (imports, connecting)."""
POLL_S: Final = 0.02
TICK_S: Final = 0.25
"""How often (wall seconds) :func:`launch` calls its ``on_tick``."""
OUTPUT_TAIL_LINES: Final = 30


class LaunchError(RuntimeError):
    """A real-time run failed: a child crashed or hung, the run timed out, or the delivery check found a loss."""


class LaunchInterrupted(LaunchError):
    """The launcher got SIGINT (Ctrl-C) or SIGTERM and stopped every process."""


@dataclass
class DeliveryReport:
    """Messages sent across the run, and those delivered (or dropped) a number of times other than once."""

    sent: int
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.duplicated


@dataclass
class LaunchResult:
    summary: dict[str, Any] | None
    processes: dict[str, dict[str, Any]]
    """Per process: its ``<name>.json`` (status, events, sha256, counters, wall_s) plus ``pid``."""
    sha256: str
    """SHA-256 of the processes' event logs concatenated in scenario order."""
    events: int
    delivery: DeliveryReport
    wall_s: float
    run_dir: Path
    dataplane: dict[str, Any] | None = None
    """The data plane's ``dataplane.json`` (its final report), in a run of more than one process."""


def check_delivery(logs: list[Path]) -> DeliveryReport:
    """Every ``tell``/``ask`` event across ``logs`` must be matched by exactly one ``deliver`` or ``drop``.

    Events are matched by their summary (``#id Type sender->recipient``; ids count per process and each
    actor lives in one process, so a summary names one message).
    """
    sent: Counter[str] = Counter()
    arrived: Counter[str] = Counter()
    for log in logs:
        with open(log, encoding="utf-8") as file:
            for line in file:
                event = parse_line(line)
                if event.kind in ("tell", "ask"):
                    sent[event.summary] += 1
                elif event.kind in ("deliver", "drop"):
                    arrived[event.summary] += 1
    report = DeliveryReport(sent=sum(sent.values()))
    for summary in sorted(sent.keys() | arrived.keys()):
        if arrived[summary] < sent[summary]:
            report.lost.append(summary)
        elif arrived[summary] > sent[summary]:
            report.duplicated.append(summary)
    return report


def _free_tcp_port(host: str) -> int:
    if not host or ":" in host:  # the transport's sockets are IPv4 only
        raise UsageError(f"host {short_repr(host, 200)} (--host): expected an IPv4 address or a host name")
    try:
        with socket.socket(socket.AF_INET) as probe:
            probe.bind((host, 0))
            port: int = probe.getsockname()[1]
            return port
    except (OSError, UnicodeError) as error:  # unresolvable, not this machine's, or no such address family
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise UsageError(f"host {short_repr(host, 200)} (--host): cannot listen on it: {reason}") from None


def _endpoint(scenario: RunScenario, name: str, fixed: str | None, socket_dir: Path) -> str:
    if fixed is not None:
        return fixed
    if scenario.transport == "ipc":
        return f"ipc://{socket_dir / (name + '.sock')}"
    return f"tcp://{scenario.host}:{_free_tcp_port(scenario.host)}"


def describe_run(scenario: RunScenario, socket_dir: Path, keys: str | None = None) -> RunDescription:
    """The run description of a real-time run of ``scenario``: fixed endpoints where the scenario gives them,
    else ipc:// sockets in ``socket_dir`` or free tcp:// ports on ``host``."""
    endpoints = {spec.name: _endpoint(scenario, spec.name, spec.endpoint, socket_dir) for spec in scenario.processes}
    dataplane = (
        _endpoint(scenario, DATAPLANE_PROCESS, scenario.dataplane_endpoint, socket_dir) if scenario.uses_dataplane else None
    )
    data = (
        {spec.name: _endpoint(scenario, spec.name + ".data", spec.data_endpoint, socket_dir) for spec in scenario.processes}
        if scenario.backend == "host" else {}
    )  # fmt: skip
    return RunDescription(
        scenario=str(Path(scenario.source).resolve()) if Path(scenario.source).exists() else scenario.source,
        seed=scenario.seed,
        time_scale=scenario.time_scale,
        endpoints=endpoints,
        dataplane_endpoint=dataplane,
        requesters=tuple(spec.name for spec in scenario.processes) if dataplane is not None else (),
        heartbeat_timeout_s=scenario.heartbeat_timeout_s,
        keys=keys,
        data_endpoints=data,
        clock_origin_ns=time.time_ns() if scenario.backend == "host" else None,
    )


def _process_names(scenario: RunScenario) -> list[str]:
    """Every process of a real-time run, in start order: the data plane first (if any)."""
    return ([DATAPLANE_PROCESS] if scenario.uses_dataplane else []) + [spec.name for spec in scenario.processes]


def _needs_keys(description: RunDescription) -> bool:
    """Whether a run reaches any process over tcp:// (then it gets CURVE keys; ipc:// sockets are private)."""
    endpoints = [*description.endpoints.values(), *description.data_endpoints.values(), description.dataplane_endpoint or ""]
    return any(endpoint.startswith("tcp://") for endpoint in endpoints)


def _make_keys(scenario: RunScenario, directory: Path) -> str:
    """A new key pair per process of the run (the data plane's included) in ``directory`` (0700)."""
    RunKeys.generate(directory, _process_names(scenario))
    return str(directory.resolve())


def node_command(scenario: RunScenario, name: str, run_dir: Path) -> list[str]:
    """The command line that starts process ``name`` of a run whose description is in ``run_dir``."""
    return [sys.executable, "-m", "dualpath_emu.runtime.node", scenario.source, "--process", name, "--run-dir", str(run_dir)]


def prepare(scenario: RunScenario, run_dir: Path) -> list[str]:
    """Write the run description into ``run_dir`` for processes started by hand; return the shell command of
    each, in start order (the data plane first, the driver's process last, with ``--no-ready-wait``)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    socket_dir = run_dir / "sockets"
    socket_dir.mkdir(mode=0o700, exist_ok=True)
    os.chmod(socket_dir, 0o700)
    description = describe_run(scenario, socket_dir)
    if _needs_keys(description):
        keys_dir = run_dir / "keys"
        keys = str(keys_dir.resolve()) if keys_dir.exists() else _make_keys(scenario, keys_dir)
        description = describe_run(scenario, socket_dir, keys)
    description.write(run_dir)
    names = [n for n in _process_names(scenario) if n != scenario.driver_process.name] + [scenario.driver_process.name]
    commands = []
    for name in names:
        command = ["dualpath-emu", "node", *node_command(scenario, name, run_dir)[3:]]
        if name == scenario.driver_process.name:
            command.append("--no-ready-wait")
        commands.append(shlex.join(command))
    return commands


@dataclass
class _Child:
    name: str
    spec: ProcessSpec | None
    """``None`` for the data plane."""
    process: subprocess.Popen[bytes]
    output: Path
    beats: int
    """The read end of its heartbeat pipe (non-blocking)."""
    last_beat_s: float = field(default_factory=time.monotonic)
    beating: bool = False
    hung: bool = False

    def read_beats(self, now_s: float) -> None:
        try:
            while os.read(self.beats, 4096):
                self.last_beat_s, self.beating = now_s, True
        except BlockingIOError:
            pass
        except OSError:
            pass

    def close_beats(self) -> None:
        if self.beats >= 0:
            os.close(self.beats)
            self.beats = -1

    def describe_exit(self) -> str:
        code = self.process.returncode
        if code is None:
            return "is still running"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def output_tail(self) -> str:
        try:
            lines = self.output.read_text(errors="replace").splitlines()
        except OSError:
            return "  (no output)"
        tail = lines[-OUTPUT_TAIL_LINES:]
        return "\n".join(f"  | {line}" for line in tail) if tail else "  (no output)"


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`_Interrupted` in the main thread while inside."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _close_stdin(child: _Child) -> None:
    stdin: IO[bytes] | None = child.process.stdin
    if stdin is not None and not stdin.closed:
        try:
            stdin.close()
        except OSError:
            pass


def _stop_all(children: list[_Child], *, gently: bool) -> None:
    """Stop every child that still runs and wait for all of them (stdin, then SIGTERM, then SIGKILL)."""
    for child in children:
        if child.hung and child.process.poll() is None:
            child.process.send_signal(signal.SIGKILL)  # stopped or stuck: it would not hear anything gentler
    running = [c for c in children if c.process.poll() is None]
    steps: list[Callable[[_Child], None]] = [lambda c: c.process.send_signal(signal.SIGKILL)]
    steps.insert(0, lambda c: c.process.send_signal(signal.SIGTERM))
    if gently:
        steps.insert(0, _close_stdin)
    for step in steps:
        for child in running:
            if child.process.poll() is None:
                try:
                    step(child)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(c.process.poll() is None for c in running):
            time.sleep(POLL_S)
        running = [c for c in running if c.process.poll() is None]
        if not running:
            break
    for child in children:
        child.process.wait()
        _close_stdin(child)
        child.close_beats()


def _finish(children: list[_Child]) -> None:
    """The driver is done: the actor processes stop at the end of their input (and say bye to the data
    plane), then the data plane, which exits by itself once drained."""
    actors = [c for c in children if c.spec is not None]
    _stop_all(actors, gently=True)
    dataplanes = [c for c in children if c.spec is None]
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(c.process.poll() is None for c in dataplanes):
        time.sleep(POLL_S)
    _stop_all(dataplanes, gently=True)


def launch(
    scenario: RunScenario,
    *,
    run_dir: Path | None = None,
    event_log: Path | None = None,
    on_start: Callable[[str, int], None] | None = None,
    keys: str | None = None,
    on_tick: Callable[[], None] | None = None,
) -> LaunchResult:
    """Run ``scenario`` in real time, one OS process per ``[[process]]`` (and the data plane); see the module.

    ``run_dir`` keeps each process's output, event log and results and the run description (default: a
    temporary directory, removed afterwards); ``event_log`` receives the concatenated event logs;
    ``on_start(name, pid)`` is called as each child starts, ``on_tick()`` a few times a second while they run
    (an application's progress line, say); ``keys`` is where the run's keys live (written
    into the run description; each process loads its own, :mod:`dualpath_emu.runtime.security`). Raises
    :class:`LaunchError` (or :class:`LaunchInterrupted`).
    """
    keep = run_dir is not None
    work = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="dualpath-emu-run-"))
    work.mkdir(parents=True, exist_ok=True)
    # An earlier run's files in this directory -- only those a run writes: the directory may hold other things.
    names = [p.name for p in scenario.processes] + [DATAPLANE_PROCESS]
    stale = [f"{n}{suffix}" for n in names for suffix in (".ready", ".json", ".events", ".part", ".out")]
    for name in (*stale, "run.json", SERVICE_REPORT):
        (work / name).unlink(missing_ok=True)
    sweep_orphans("dpe-*")  # the socket folders of launchers killed before they could remove them
    socket_dir = Path(tempfile.mkdtemp(prefix="dpe-"))  # short: ipc:// paths are limited to ~100 bytes
    children: list[_Child] = []
    started = time.perf_counter()

    def watch() -> None:
        _watch(scenario, children, started, on_tick)
        _finish(children)

    try:  # from here on the socket folder is removed whatever happens (a bad --host refused, say)
        os.chmod(socket_dir, 0o700)  # mkdtemp's mode already; said here because the sockets rely on it
        mark_owner(socket_dir)
        description = describe_run(scenario, socket_dir, keys)
        if keys is None and _needs_keys(description):  # tcp: a new key pair per process, kept with the run
            shutil.rmtree(work / "keys", ignore_errors=True)  # an earlier run's in this run directory
            description = describe_run(scenario, socket_dir, _make_keys(scenario, work / "keys"))
        description.write(work)
        _start_and_watch(scenario, children, _process_names(scenario), work, {}, watch, on_start)
        failed = [c for c in children if c.process.returncode != 0]
        if failed:
            child = failed[0]
            raise LaunchError(
                f"process {child.name!r} (pid {child.process.pid}) {child.describe_exit()} while stopping; "
                f"its last output:\n{child.output_tail()}"
            )
        return _collect(scenario, children, work, event_log, time.perf_counter() - started)
    finally:
        for child in children:
            child.close_beats()
        shutil.rmtree(socket_dir, ignore_errors=True)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


OWNER_FILE: Final = "owner"
"""In a folder a launcher makes for one run (its sockets, its KV blocks): ``<host> <pid>`` of that launcher."""


def mark_owner(folder: Path) -> None:
    """Write ``folder``'s owner: this host and process, so a later launcher can tell the folder is left over
    from one that was killed (SIGKILL ends a process without its clean-up) and remove it."""
    (folder / OWNER_FILE).write_text(f"{socket.gethostname()} {os.getpid()}\n", encoding="utf-8")


def sweep_orphans(pattern: str, parent: Path | None = None) -> list[Path]:
    """Remove the folders matching ``pattern`` in ``parent`` (the temporary directory by default) that this user
    owns and whose owner file names a launcher of this host that is gone; returns them. A folder without an
    owner file, another host's, or a live process's is left alone (a pid of this host that was reused keeps
    its folder: safe, if untidy)."""
    removed = []
    for folder in (parent or Path(tempfile.gettempdir())).glob(pattern):
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            host, pid = (folder / OWNER_FILE).read_text(encoding="utf-8").split()
        except (OSError, ValueError):
            continue
        if host != socket.gethostname() or not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or a pid no process can have
        return False
    except PermissionError:  # another user's process
        return True
    return True


def launch_host(
    scenario: RunScenario,
    run_dir: Path,
    names: Sequence[str],
    *,
    on_start: Callable[[str, int], None] | None = None,
) -> None:
    """Start this host's share of a prepared run (:func:`prepare`: the description is in ``run_dir``, copied
    to every host): the processes ``names``, the data plane first and the driver's process last (it starts
    at once: no shared run directory for the others' ready files). Watch them as :func:`launch` does and
    return when each has exited 0 (the run ended by messages); a crash, a hang (``hang_timeout_s``), Ctrl-C or
    ``timeout_s`` stop the others here and raise :class:`LaunchError` (or :class:`LaunchInterrupted`). An
    unknown process or a missing description is a :class:`UsageError`."""
    known = _process_names(scenario)
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"no process {unknown[0]!r} in this run (its processes: {', '.join(known)})" if unknown
                         else "give at least one process to start")  # fmt: skip
    if not (Path(run_dir) / RUN_DESCRIPTION).exists():
        raise UsageError(f"{run_dir}: no run description ({RUN_DESCRIPTION}); write it with --prepare first")
    driver = scenario.driver_process.name
    order = [n for n in known if n in names and n != driver] + ([driver] if driver in names else [])
    children: list[_Child] = []
    started = time.perf_counter()
    try:
        _start_and_watch(scenario, children, order, Path(run_dir), {driver: ["--no-ready-wait"]},
                         lambda: _watch_host(scenario, children, started), on_start)  # fmt: skip
    finally:
        for child in children:
            child.close_beats()


def _start_and_watch(
    scenario: RunScenario,
    children: list[_Child],
    names: Sequence[str],
    work: Path,
    extra: Mapping[str, Sequence[str]],
    watch: Callable[[], None],
    on_start: Callable[[str, int], None] | None,
) -> None:
    """Start processes ``names`` in order (each with its ``extra`` arguments) into ``children``, then
    ``watch()`` them; on Ctrl-C (:class:`LaunchInterrupted`) or any error, stop every one started first."""
    with _signals_raise():
        try:
            for name in names:
                children.append(_spawn(scenario, name, work, extra.get(name, ())))
                if on_start is not None:
                    on_start(name, children[-1].process.pid)
            watch()
        except _Interrupted as interrupt:
            _stop_all(children, gently=False)
            raise LaunchInterrupted(f"interrupted by {interrupt}; stopped {len(children)} process(es)") from None
        except BaseException:
            _stop_all(children, gently=False)
            raise


def _watch_host(scenario: RunScenario, children: list[_Child], started: float) -> None:
    """Return when every child has exited 0; raise :class:`LaunchError` on any other ending or a hang."""
    deadline = started + scenario.timeout_s
    while True:
        now = time.monotonic()
        running = []
        for child in children:
            child.read_beats(now)
            code = child.process.poll()
            if code is None:
                running.append(child)
            elif code != 0:
                raise LaunchError(
                    f"process {child.name!r} (pid {child.process.pid}) {child.describe_exit()} before the run was "
                    f"complete; stopped the other processes here. Its last output:\n{child.output_tail()}"
                )
        if not running:
            return
        _check_liveness(scenario, running, now, deadline)
        time.sleep(POLL_S)


def _spawn(scenario: RunScenario, name: str, work: Path, extra: Sequence[str] = ()) -> _Child:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    output = work / f"{name}.out"
    try:
        with open(output, "wb") as sink:
            process = subprocess.Popen(
                [*node_command(scenario, name, work), *extra],
                stdin=subprocess.PIPE,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in a terminal goes to the launcher, which stops the children
                pass_fds=(write_end,),
                env={**os.environ, "PYTHONUNBUFFERED": "1", LAUNCHER_ENV: f"{os.getpid()}:{write_end}"},
            )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    spec = None if name == DATAPLANE_PROCESS else scenario.process(name)
    return _Child(name, spec, process, output, read_end)


def _driver_done(driver: _Child) -> bool:
    """Whether the driver's process exits 0 within the stop grace period (another child exited 0 first)."""
    try:
        return driver.process.wait(timeout=STOP_GRACE_S) == 0
    except subprocess.TimeoutExpired:
        return False


def _watch(
    scenario: RunScenario, children: list[_Child], started: float, on_tick: Callable[[], None] | None = None
) -> None:
    """Return when the driver's process has exited 0; raise :class:`LaunchError` on any other ending. Calls
    ``on_tick()`` every :data:`TICK_S` meanwhile."""
    driver = next(c for c in children if c.spec is scenario.driver_process)
    deadline = started + scenario.timeout_s
    next_tick = 0.0
    while True:
        now = time.monotonic()
        if on_tick is not None and now >= next_tick:
            next_tick = now + TICK_S
            on_tick()
        for child in children:
            child.read_beats(now)
        for child in children:
            code = child.process.poll()
            if code is None:
                continue
            if child is driver and code == 0:
                return
            if code == 0 and _driver_done(driver):
                return  # the run ended by messages, and this one was quicker to exit than the driver's process
            raise LaunchError(
                f"process {child.name!r} (pid {child.process.pid}) {child.describe_exit()} before the run was "
                f"complete; stopped the other processes. Its last output:\n{child.output_tail()}"
            )
        _check_liveness(scenario, children, now, deadline)
        time.sleep(POLL_S)


def _check_liveness(scenario: RunScenario, children: Sequence[_Child], now: float, deadline: float) -> None:
    """Raise :class:`LaunchError` for a child whose heartbeat is silent too long (``hang_timeout_s``; before
    its first beat :data:`STARTUP_TIMEOUT_S`), or when ``timeout_s`` has passed (``deadline``)."""
    for child in children:
        silent = now - child.last_beat_s
        limit = scenario.hang_timeout_s if child.beating else STARTUP_TIMEOUT_S
        if silent > limit:
            child.hung = True
            what = "" if child.beating else " since it started"
            raise LaunchError(
                f"process {child.name!r} (pid {child.process.pid}) stopped answering: its loop has been silent "
                f"for {silent:.1f} s{what} (hang_timeout_s = {scenario.hang_timeout_s}); it is stopped or hung. "
                f"Stopped every process. Its last output:\n{child.output_tail()}"
            )
    if time.perf_counter() > deadline:
        raise LaunchError(f"the run did not complete within timeout_s = {scenario.timeout_s} s; stopped it")


def _collect(
    scenario: RunScenario, children: list[_Child], work: Path, event_log: Path | None, wall_s: float
) -> LaunchResult:
    processes: dict[str, dict[str, Any]] = {}
    logs: list[Path] = []
    dataplane: dict[str, Any] | None = None
    if scenario.uses_dataplane:
        dataplane = json.loads((work / f"{DATAPLANE_PROCESS}.json").read_text())
        dataplane["pid"] = next(c.process.pid for c in children if c.spec is None)
    with EventLogWriter(event_log) as writer:
        for child in children:
            if child.spec is None:
                continue
            result: dict[str, Any] = json.loads((work / f"{child.name}.json").read_text())
            result["pid"] = child.process.pid
            processes[child.name] = result
            log = work / f"{child.name}.events"
            logs.append(log)
            with open(log, encoding="utf-8") as file:
                writer.write(parse_line(line) for line in file)
        sha256, events = writer.sha256(), writer.lines
    delivery = check_delivery(logs)
    if not delivery.ok:
        problems = [f"lost: {s}" for s in delivery.lost[:5]] + [f"duplicated: {s}" for s in delivery.duplicated[:5]]
        raise LaunchError(
            f"delivery check failed: {len(delivery.lost)} message(s) lost, {len(delivery.duplicated)} duplicated "
            f"of {delivery.sent} sent:\n  " + "\n  ".join(problems)
        )
    summary = processes[scenario.driver_process.name].get("summary")
    return LaunchResult(summary, processes, sha256, events, delivery, wall_s, work, dataplane)


def dataplane_summary(result: LaunchResult) -> dict[str, Any] | None:
    """The data plane's part of a run's summary: per process the clock handshake's round trip and offset
    uncertainty, the clock checks and the delivery lag; the submission lag; per port the bytes completed
    and busy seconds; its counters. ``None`` for a run without a data plane."""
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
            name: {
                key: client[key]
                for key in ("rtt_ns", "offset_uncertainty_ns", "clock_check", "delivery_lag_ns")
            }
            for name, client in clients.items()
        },
        "ports": {
            name: {"completed_bytes": sum(counters["completed_bytes"]), "busy_s": counters["busy_s"]}
            for name, counters in report["ports"].items()
        },
    }
