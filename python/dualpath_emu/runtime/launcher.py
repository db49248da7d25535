"""The real-time launcher: one command starts every process of a run and always stops them all (issue 3).

:func:`launch` starts one ``python -m dualpath_emu.runtime.node`` child per ``[[process]]`` of a scenario
(each in its own session, so a terminal's Ctrl-C reaches only the launcher; its output goes to
``<run_dir>/<name>.out``), then watches them:

* **completion** -- the driver's process exits 0: the launcher closes the others' standard input, which
  tells them to stop; each writes its event log and results and exits 0;
* **a crashed child** -- any child exits non-zero (or is killed) before that: the run has failed; the
  launcher stops the others and raises :class:`LaunchError` naming the process, how it ended, and the
  last lines of its output;
* **Ctrl-C / SIGTERM** to the launcher, or ``timeout_s`` passing: the same, with that reason
  (:class:`LaunchInterrupted` for a signal).

Stopping means: close standard input, then SIGTERM after a grace period, then SIGKILL, and always wait
for the child, so no process outlives the launcher. A launcher that is itself killed with SIGKILL cannot
do this; its children then get SIGTERM from the kernel (``PR_SET_PDEATHSIG``, Linux) and see their
standard input close (everywhere).

After a complete run the launcher reads every process's event log and checks that each message sent
(``tell``/``ask``) was delivered (or dropped at a stopped actor) exactly once, across processes.
"""

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
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

from dualpath_emu.runtime.eventlog import EventLogWriter, parse_line
from dualpath_emu.runtime.scenario import ProcessSpec, RunScenario

__all__ = ["DeliveryReport", "LaunchError", "LaunchInterrupted", "LaunchResult", "check_delivery", "launch"]

STOP_GRACE_S: Final = 10.0
"""How long a child has to stop after its standard input is closed, and again after SIGTERM."""
POLL_S: Final = 0.02
OUTPUT_TAIL_LINES: Final = 30


class LaunchError(RuntimeError):
    """A real-time run failed: a child crashed, the run timed out, or the delivery check found a loss."""


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
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def _endpoints(scenario: RunScenario, socket_dir: Path) -> dict[str, str]:
    endpoints: dict[str, str] = {}
    for spec in scenario.processes:
        if spec.endpoint is not None:
            endpoints[spec.name] = spec.endpoint
        elif scenario.transport == "ipc":
            endpoints[spec.name] = f"ipc://{socket_dir / (spec.name + '.sock')}"
        else:
            endpoints[spec.name] = f"tcp://{scenario.host}:{_free_tcp_port(scenario.host)}"
    return endpoints


@dataclass
class _Child:
    spec: ProcessSpec
    process: subprocess.Popen[bytes]
    output: Path

    @property
    def name(self) -> str:
        return self.spec.name

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


def launch(
    scenario: RunScenario,
    *,
    run_dir: Path | None = None,
    event_log: Path | None = None,
    on_start: Callable[[str, int], None] | None = None,
) -> LaunchResult:
    """Run ``scenario`` in real time, one OS process per ``[[process]]``; see the module docstring.

    ``run_dir`` keeps each process's output, event log and results (default: a temporary directory,
    removed afterwards); ``event_log`` receives the concatenated event logs; ``on_start(name, pid)`` is
    called as each child starts. Raises :class:`LaunchError` (or :class:`LaunchInterrupted`).
    """
    keep = run_dir is not None
    work = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="dualpath-emu-run-"))
    work.mkdir(parents=True, exist_ok=True)
    for stale in (*work.glob("*.ready"), *work.glob("*.json"), *work.glob("*.events")):
        stale.unlink()
    socket_dir = Path(tempfile.mkdtemp(prefix="dpe-"))  # short: ipc:// paths are limited to ~100 bytes
    endpoints = _endpoints(scenario, socket_dir)
    children: list[_Child] = []
    started = time.perf_counter()
    try:
        with _signals_raise():
            try:
                for spec in scenario.processes:
                    children.append(_spawn(scenario, spec, endpoints, work))
                    if on_start is not None:
                        on_start(spec.name, children[-1].process.pid)
                _watch(scenario, children, started)
                _stop_all(children, gently=True)  # the driver is done: the others stop at end of input
            except _Interrupted as interrupt:
                _stop_all(children, gently=False)
                raise LaunchInterrupted(f"interrupted by {interrupt}; stopped {len(children)} process(es)") from None
            except BaseException:
                _stop_all(children, gently=False)
                raise
        failed = [c for c in children if c.process.returncode != 0]
        if failed:
            child = failed[0]
            raise LaunchError(
                f"process {child.name!r} (pid {child.process.pid}) {child.describe_exit()} while stopping; "
                f"its last output:\n{child.output_tail()}"
            )
        return _collect(scenario, children, work, event_log, time.perf_counter() - started)
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def _spawn(scenario: RunScenario, spec: ProcessSpec, endpoints: dict[str, str], work: Path) -> _Child:
    command = [
        sys.executable, "-m", "dualpath_emu.runtime.node", scenario.source,
        "--process", spec.name,
        "--run-dir", str(work),
        "--endpoints", json.dumps(endpoints),
        "--seed", str(scenario.seed),
        "--time-scale", repr(scenario.time_scale),
        "--parent-pid", str(os.getpid()),
    ]  # fmt: skip
    output = work / f"{spec.name}.out"
    with open(output, "wb") as sink:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal goes to the launcher, which stops the children
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return _Child(spec, process, output)


def _watch(scenario: RunScenario, children: list[_Child], started: float) -> None:
    """Return when the driver's process has exited 0; raise :class:`LaunchError` on any other ending."""
    driver = next(c for c in children if c.spec is scenario.driver_process)
    deadline = started + scenario.timeout_s
    while True:
        for child in children:
            code = child.process.poll()
            if code is None:
                continue
            if child is driver and code == 0:
                return
            raise LaunchError(
                f"process {child.name!r} (pid {child.process.pid}) {child.describe_exit()} before the run was "
                f"complete; stopped the other processes. Its last output:\n{child.output_tail()}"
            )
        if time.perf_counter() > deadline:
            raise LaunchError(f"the run did not complete within timeout_s = {scenario.timeout_s} s; stopped it")
        time.sleep(POLL_S)


def _collect(
    scenario: RunScenario, children: list[_Child], work: Path, event_log: Path | None, wall_s: float
) -> LaunchResult:
    processes: dict[str, dict[str, Any]] = {}
    logs: list[Path] = []
    with EventLogWriter(event_log) as writer:
        for child in children:
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
    return LaunchResult(summary, processes, sha256, events, delivery, wall_s, work)
