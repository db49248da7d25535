"""The real-time launcher: one command starts every process of a run and always stops them all.

:func:`launch` writes the run description (:mod:`~dualpath_emu.runtime.run_setup`) and starts one ``node`` child
per ``[[process]]`` (the data-plane service first), each in its own session with its output in
``<run_dir>/<name>.out``, then watches them: the driver's process exiting 0 completes the run; a child that
crashes fails it (:class:`LaunchError`, naming it and its last output) unless ``restart_crashed`` names it (then
it starts again with ``--incarnation N``, at most :data:`MAX_RESTARTS` times); a child whose heartbeat pipe
(:class:`~dualpath_emu.runtime.node.LauncherLink`) is silent for ``hang_timeout_s`` fails it as stopped or hung,
one busy for ``busy_timeout_s`` as busy; Ctrl-C, SIGTERM (:class:`LaunchInterrupted`) and ``timeout_s`` stop it.
Stopping is: close standard input, SIGTERM after a grace period, SIGKILL, always waiting, so no process outlives
the launcher (a SIGKILLed launcher's children get SIGTERM from the kernel). A complete run is then checked by
:mod:`~dualpath_emu.runtime.delivery`. :func:`launch_host` starts one host's share of a run prepared by hand.
docs/live.md ("Failure", "A process that dies") says what a user sees of each case."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

from dualpath_emu.errors import UsageError
from dualpath_emu.runtime.app import SERVICE_REPORT
from dualpath_emu.runtime.delivery import DeliveryReport, check_delivery
from dualpath_emu.runtime.eventlog import EventLogWriter, read_events
from dualpath_emu.runtime.node import LAUNCHER_ENV
from dualpath_emu.runtime.run_setup import describe_run, make_keys, needs_keys, node_command, process_names
from dualpath_emu.runtime.scenario import DATAPLANE_PROCESS, INCARNATION_OPTION, RUN_DESCRIPTION, ProcessSpec
from dualpath_emu.runtime.scenario import RunScenario, incarnation_stem

__all__ = ["LaunchError", "LaunchInterrupted", "LaunchResult", "launch", "launch_host", "mark_owner", "sweep_orphans"]

STOP_GRACE_S: Final = 10.0  # How long a child has to stop after its standard input is closed, and again after SIGTERM.
STARTUP_TIMEOUT_S: Final = 60.0  # How long a child may take to its first heartbeat (imports, connecting).
POLL_S: Final = 0.02
TICK_S: Final = 0.25  # How often (wall seconds) :func:`launch` calls its ``on_tick``.
OUTPUT_TAIL_LINES: Final = 30
MAX_RESTARTS: Final = 3
"""How many times a process of ``restart_crashed`` is started again at most; one that dies once more ends the run."""
RESTARTS_SUFFIX: Final = ".restarts.json"
"""``<run_dir>/<name>.restarts.json``: the restarts of process ``name`` (see the module)."""


class LaunchError(RuntimeError):
    """A real-time run failed (a child crashed or hung, a timeout, a lost message): ``died``, ``full_disk``."""

    def __init__(self, message: str, *, died: str | None = None) -> None:
        super().__init__(message)
        self.died = died
        self.full_disk: str | None = None


class LaunchInterrupted(LaunchError):
    """The launcher got SIGINT (Ctrl-C) or SIGTERM and stopped every process."""


@dataclass
class LaunchResult:
    summary: dict[str, Any] | None
    processes: dict[str, dict[str, Any]]
    """Per process: its ``<name>.json`` (status, events, sha256, counters, wall_s) plus ``pid``."""
    sha256: str  # SHA-256 of the processes' event logs concatenated in scenario order.
    events: int
    delivery: DeliveryReport
    wall_s: float
    run_dir: Path
    dataplane: dict[str, Any] | None = None
    """The data plane's ``dataplane.json`` (its final report), in a run of more than one process."""


@dataclass
class _Child:
    name: str
    spec: ProcessSpec | None  # ``None`` for the data plane.
    process: subprocess.Popen[bytes]
    output: Path
    beats: int  # The read end of its heartbeat pipe (non-blocking).
    last_beat_s: float = field(default_factory=time.monotonic)
    beating: bool = False
    hung: bool = False
    busy_since_s: float | None = None
    """When its loop was last seen to come round, while its beats say it is busy (else ``None``)."""
    busy_where: str = ""  # Where its loop was held, as its last busy beat said.
    partial: bytes = b""  # A beat line not read whole yet.
    cpu_at_beat: float | None = None  # Its CPU seconds (``/proc``) at its last beat, measured once it went silent.
    incarnation: int = 0  # 0, or N: started again in place of one that died, the N-th time (``--incarnation N``).
    extra: tuple[str, ...] = ()  # The arguments it was started with beyond the node's own (a restart gets the same).

    def read_beats(self, now_s: float) -> None:
        data = b""
        try:
            while chunk := os.read(self.beats, 4096):
                data += chunk
        except OSError:  # BlockingIOError: all read
            pass
        if not data:
            return
        self.last_beat_s, self.beating, self.cpu_at_beat = now_s, True, None
        *lines, self.partial = (self.partial + data).split(b"\n")
        self.partial = self.partial[-1024:]  # a child writes whole lines; a broken one cannot grow this
        for line in lines:
            if line.startswith(b"busy "):  # "busy <held s> <where>" (node.LauncherLink)
                held, _, where = line[5:].decode("utf-8", "replace").partition(" ")
                try:
                    self.busy_since_s = now_s - max(0.0, float(held))
                except ValueError:
                    continue
                self.busy_where = where[:300]
            elif line:
                self.busy_since_s = None

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


def _restart_dead(
    scenario: RunScenario, children: list[_Child], work: Path, started: float,
    on_start: Callable[[str, int], None] | None,
) -> None:  # fmt: skip
    """Start again each restartable child that died (:func:`_restart`)."""
    for index, child in enumerate(children):
        code = child.process.poll()
        if code is not None and code != 0 and not _ended_anyway(scenario, child):
            _restart(scenario, children, index, work, started, on_start)


def _finish(children: list[_Child], restart_dead: Callable[[], None] | None = None) -> None:
    """The driver is done: the actor processes stop at the end of their input, then the data plane."""
    if restart_dead is not None:
        restart_dead()
    actors = [c for c in children if c.spec is not None]
    _stop_all(actors, gently=True)
    dataplanes = [c for c in children if c.spec is None]
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(c.process.poll() is None for c in dataplanes):
        time.sleep(POLL_S)
    _stop_all(dataplanes, gently=True)


def launch(
    scenario: RunScenario, *, run_dir: Path | None = None, event_log: Path | None = None,
    on_start: Callable[[str, int], None] | None = None, keys: str | None = None,
    on_tick: Callable[[], None] | None = None,
) -> LaunchResult:  # fmt: skip
    """Run ``scenario`` in real time (see the module); ``run_dir`` holds its files (default: temporary)."""
    keep = run_dir is not None
    work = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="dualpath-emu-run-"))
    work.mkdir(parents=True, exist_ok=True)
    # An earlier run's files in this directory -- only those a run writes: the directory may hold other things.
    names = [p.name for p in scenario.processes] + [DATAPLANE_PROCESS]
    stale = [f"{n}{suffix}" for n in names for suffix in (".ready", ".json", ".events", ".part", ".out")]
    for n in scenario.restart_crashed:  # an earlier run's restarted processes' files
        stale += [f"{incarnation_stem(n, i)}{suffix}" for i in range(1, MAX_RESTARTS + 1)
                  for suffix in (".json", ".events", ".part", ".out")] + [n + RESTARTS_SUFFIX]  # fmt: skip
    for name in (*stale, "run.json", SERVICE_REPORT):
        (work / name).unlink(missing_ok=True)
    sweep_orphans("dpe-*")  # the socket folders of launchers killed before they could remove them
    socket_dir = Path(tempfile.mkdtemp(prefix="dpe-"))  # short: ipc:// paths are limited to ~100 bytes
    children: list[_Child] = []
    started = time.perf_counter()

    def watch() -> None:
        _watch(scenario, children, started, on_tick, work, on_start)
        _finish(children, lambda: _restart_dead(scenario, children, work, started, on_start))

    try:  # from here on the socket folder is removed whatever happens (a bad --host refused, say)
        os.chmod(socket_dir, 0o700)  # mkdtemp's mode already; said here because the sockets rely on it
        mark_owner(socket_dir)
        description = describe_run(scenario, socket_dir, keys)
        if keys is None and needs_keys(description):  # tcp: a new key pair per process, kept with the run
            shutil.rmtree(work / "keys", ignore_errors=True)  # an earlier run's in this run directory
            description = describe_run(scenario, socket_dir, make_keys(scenario, work / "keys"))
        description.write(work)
        _start_and_watch(scenario, children, process_names(scenario), work, {}, watch, on_start)
        failed = [c for c in children if c.process.returncode != 0 and not _ended_anyway(scenario, c)]
        if failed:
            child = failed[0]
            raise LaunchError(
                f"process {child.name!r} (pid {child.process.pid}) {child.describe_exit()} while stopping"
                f"{_why_not_restarted(scenario, child) if child.process.returncode < 0 else ''}; its last output:\n"
                f"{child.output_tail()}",
                died=child.name,
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
    """Write ``folder``'s owner (host, pid), so a later launcher can remove it if a killed one left it."""
    (folder / OWNER_FILE).write_text(f"{socket.gethostname()} {os.getpid()}\n", encoding="utf-8")


def sweep_orphans(pattern: str, parent: Path | None = None) -> list[Path]:
    """Remove and return the folders in ``parent`` left over by a launcher of this host that is gone."""
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
    scenario: RunScenario, run_dir: Path, names: Sequence[str], *, on_start: Callable[[str, int], None] | None = None
) -> None:
    """Start this host's share ``names`` of a run prepared in ``run_dir`` and watch them as :func:`launch`."""
    known = process_names(scenario)
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

        def watch() -> None:
            _watch_host(scenario, children, started, Path(run_dir), on_start)

        _start_and_watch(scenario, children, order, Path(run_dir), {driver: ["--no-ready-wait"]}, watch, on_start)
    finally:
        for child in children:
            child.close_beats()


def _start_and_watch(
    scenario: RunScenario, children: list[_Child], names: Sequence[str], work: Path, extra: Mapping[str, Sequence[str]],
    watch: Callable[[], None], on_start: Callable[[str, int], None] | None,
) -> None:  # fmt: skip
    """Start ``names`` in order, then ``watch()`` them; on Ctrl-C or any error, stop every one started."""
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


def _watch_host(
    scenario: RunScenario, children: list[_Child], started: float, work: Path,
    on_start: Callable[[str, int], None] | None = None,
) -> None:  # fmt: skip
    """Return when every child exited 0; :class:`LaunchError` on any other ending or a hang."""
    deadline = started + scenario.timeout_s
    while True:
        now = time.monotonic()
        running = []
        for index, child in enumerate(children):
            child.read_beats(now)
            code = child.process.poll()
            if code is None:
                running.append(child)
            elif code != 0 and not _ended_anyway(scenario, child):
                if _restart(scenario, children, index, work, started, on_start):
                    running.append(children[index])
                    continue
                raise LaunchError(
                    f"process {child.name!r} (pid {child.process.pid}) {child.describe_exit()} before the run was "
                    f"complete{_why_not_restarted(scenario, child)}; stopped the other processes here. Its last "
                    f"output:\n{child.output_tail()}",
                    died=child.name,
                )
        if not running:
            return
        _check_liveness(scenario, running, now, deadline)
        time.sleep(POLL_S)


def _spawn(scenario: RunScenario, name: str, work: Path, extra: Sequence[str] = (), incarnation: int = 0) -> _Child:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    output = work / f"{incarnation_stem(name, incarnation)}.out"
    again = [INCARNATION_OPTION, str(incarnation)] if incarnation else []
    try:
        with open(output, "wb") as sink:
            process = subprocess.Popen(
                [*node_command(scenario, name, work), *extra, *again],
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
    return _Child(name, spec, process, output, read_end, incarnation=incarnation, extra=tuple(extra))


def _why_not_restarted(scenario: RunScenario, child: _Child) -> str:
    """What an error says of a child that died in a run that restarts some processes."""
    if not scenario.restart_crashed:
        return ""
    if child.name not in scenario.restart_crashed:
        what = "the data plane" if child.spec is None else "a process"
        return (f" (it is {what} whose state is the run's, not one the run starts again: those are "
                f"{', '.join(scenario.restart_crashed)})")  # fmt: skip
    if child.incarnation >= MAX_RESTARTS:
        return f" (it died {child.incarnation + 1} times; started again at most {MAX_RESTARTS} times)"
    return (" (as the run ended, after it or the data plane had said bye: too late to start it again; what it had not "
            "written is lost)")  # fmt: skip


def _ended_anyway(scenario: RunScenario, child: _Child) -> bool:
    """Whether ``child``, a restartable process that died, had written its results first (status 0)."""
    if child.name not in scenario.restart_crashed:
        return False
    results = child.output.parent / f"{incarnation_stem(child.name, child.incarnation)}.json"
    try:
        return bool(json.loads(results.read_text()).get("status") == 0)
    except (OSError, ValueError, AttributeError):
        return False


def _restart(
    scenario: RunScenario, children: list[_Child], index: int, work: Path, started: float,
    on_start: Callable[[str, int], None] | None,
) -> bool:  # fmt: skip
    """Start ``children[index]``, which died, again if the run restarts it and it has restarts left; whether it did."""
    dead = children[index]
    if dead.name not in scenario.restart_crashed or dead.incarnation >= MAX_RESTARTS:
        return False
    if any(c.spec is None and c.process.poll() is not None for c in children):
        return False  # the data plane drained (every process had said bye): nothing to connect to
    if (work / f"{incarnation_stem(dead.name, dead.incarnation)}.part").exists():
        return False  # it had said bye (then it writes its part): the data plane does not wait for a new one
    died_s = time.perf_counter() - started
    dead.close_beats()
    _close_stdin(dead)
    child = _spawn(scenario, dead.name, work, dead.extra, dead.incarnation + 1)
    children[index] = child
    record = {
        "process": dead.name, "incarnation": child.incarnation, "pid": child.process.pid, "dead_pid": dead.process.pid,
        "dead_incarnation": dead.incarnation, "ended": dead.describe_exit(), "died_wall_s": round(died_s, 3),
        "restarted_wall_s": round(time.perf_counter() - started, 3),
    }  # fmt: skip
    path = work / f"{dead.name}{RESTARTS_SUFFIX}"
    try:
        records = json.loads(path.read_text()) if path.exists() else []
    except (OSError, ValueError):
        records = []
    path.write_text(json.dumps([*records, record], indent=1) + "\n")
    print(f"dualpath-emu: process {dead.name!r} (pid {dead.process.pid}) {dead.describe_exit()} before the run was "
          f"complete; started it again in its place (incarnation {child.incarnation}, pid {child.process.pid})",
          file=sys.stderr, flush=True)  # fmt: skip
    if on_start is not None:
        on_start(dead.name, child.process.pid)
    return True


def _driver_done(driver: _Child) -> bool:
    """Whether the driver's process exits 0 within the stop grace period (another child exited 0 first)."""
    try:
        return driver.process.wait(timeout=STOP_GRACE_S) == 0
    except subprocess.TimeoutExpired:
        return False


def _watch(
    scenario: RunScenario, children: list[_Child], started: float, on_tick: Callable[[], None] | None = None,
    work: Path | None = None, on_start: Callable[[str, int], None] | None = None,
) -> None:  # fmt: skip
    """Return when the driver's process exited 0; :class:`LaunchError` on any other ending."""
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
        if work is not None:  # a restartable child that died is started again, whatever else happened meanwhile
            _restart_dead(scenario, children, work, started, on_start)
        for child in children:
            code = child.process.poll()
            if code is None:
                continue
            if code != 0 and _ended_anyway(scenario, child):
                code = 0  # killed after it had written its results: nothing was lost
            if child is driver and code == 0:
                return
            if code == 0 and _driver_done(driver):
                return  # the run ended by messages, and this one was quicker to exit than the driver's process
            raise LaunchError(
                f"process {child.name!r} (pid {child.process.pid}) {child.describe_exit()} before the run was "
                f"complete{_why_not_restarted(scenario, child)}; stopped the other processes. Its last output:\n"
                f"{child.output_tail()}",
                died=child.name if code != 0 else None,
            )
        _check_liveness(scenario, children, now, deadline)
        time.sleep(POLL_S)


def _proc_state(pid: int) -> tuple[str, float] | None:
    """A process's state letter and CPU seconds (user + system) from ``/proc``; ``None`` where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _check_liveness(scenario: RunScenario, children: Sequence[_Child], now: float, deadline: float) -> None:
    """:class:`LaunchError` for a child stopped, hung or busy too long, or once ``deadline`` passed."""
    for child in children:
        silent = now - child.last_beat_s
        limit = scenario.hang_timeout_s if child.beating else STARTUP_TIMEOUT_S
        busy_s = now - child.busy_since_s if child.busy_since_s is not None else 0.0
        if silent > limit:
            state = _proc_state(child.process.pid)
            if child.beating and state is not None and state[0] in "RSD":
                # Silent but not stopped: busy in native code if it uses CPU (the interpreter held, so no beat).
                if child.cpu_at_beat is None:
                    child.cpu_at_beat = state[1]
                    child.last_beat_s = now - limit / 2  # measure CPU over half a limit more before judging
                    continue
                if state[1] - child.cpu_at_beat > 0.1 * (silent - limit / 2):
                    if child.busy_since_s is None:
                        child.busy_since_s, child.busy_where = child.last_beat_s, "native code (no beat)"
                    child.cpu_at_beat, child.last_beat_s = state[1], now - limit / 2
                    continue
            child.hung = True
            what = "" if child.beating else " since it started"
            if state is not None and state[0] in "Tt":
                why = f"it is stopped (state {state[0]}: SIGSTOP or a debugger)"
            elif state is not None and child.beating:
                why = f"it is hung: its process runs (state {state[0]}) but neither beats nor uses CPU"
            else:
                why = "it is stopped or hung"
            raise LaunchError(
                f"process {child.name!r} (pid {child.process.pid}) stopped answering: its heartbeat has been silent "
                f"for {silent:.1f} s{what} (hang_timeout_s = {scenario.hang_timeout_s}); {why}. "
                f"Stopped every process. Its last output:\n{child.output_tail()}"
            )
        if busy_s > scenario.busy_timeout_s:
            child.hung = True  # held by its work: it would not hear a gentle stop either
            raise LaunchError(
                f"process {child.name!r} (pid {child.process.pid}) is busy, not hung: one piece of work has held "
                f"its loop for {busy_s:.1f} s (busy_timeout_s = {scenario.busy_timeout_s}), in {child.busy_where}. "
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
    restarted: dict[str, int] = {}
    with EventLogWriter(event_log) as writer:
        for child in children:
            if child.spec is None:
                continue
            stem = incarnation_stem(child.name, child.incarnation)
            result: dict[str, Any] = json.loads((work / f"{stem}.json").read_text())
            result["pid"] = child.process.pid
            processes[child.name] = result
            if child.incarnation:
                restarted.update((actor, child.incarnation) for actor in child.spec.actors)
            for incarnation in range(child.incarnation + 1):  # the dead ones' logs too: what they wrote counts
                log = work / f"{incarnation_stem(child.name, incarnation)}.events"
                if log.exists() or incarnation == child.incarnation:
                    logs.append(log)
                    writer.write(read_events(log))
        sha256, events = writer.sha256(), writer.lines
    delivery = check_delivery(logs, restarted)
    if not delivery.ok:
        problems = [f"lost: {s}" for s in delivery.lost[:5]] + [f"duplicated: {s}" for s in delivery.duplicated[:5]]
        raise LaunchError(
            f"delivery check failed: {len(delivery.lost)} message(s) lost, {len(delivery.duplicated)} duplicated "
            f"of {delivery.sent} sent:\n  " + "\n  ".join(problems)
        )
    summary = processes[scenario.driver_process.name].get("summary")
    return LaunchResult(summary, processes, sha256, events, delivery, wall_s, work, dataplane)
