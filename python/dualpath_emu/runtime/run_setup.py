"""What a live run needs before its processes start: each process's endpoints, the run description
(``run.json``), CURVE keys where a socket is ``tcp://``, and the command that starts each process; :func:`prepare`
writes it all for processes started by hand, on several hosts."""

from __future__ import annotations

import os
import shlex
import socket
import sys
import time
from pathlib import Path

from dualpath_emu.errors import UsageError
from dualpath_emu.inputs import short_repr
from dualpath_emu.runtime.scenario import DATAPLANE_PROCESS, RunDescription, RunScenario
from dualpath_emu.runtime.security import RunKeys

__all__ = ["describe_run", "make_keys", "needs_keys", "node_command", "prepare", "process_names"]


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
    """The run description of ``scenario``: its fixed endpoints, else ipc:// in ``socket_dir`` or tcp:// ports."""
    endpoints = {spec.name: _endpoint(scenario, spec.name, spec.endpoint, socket_dir) for spec in scenario.processes}
    dataplane = (
        _endpoint(scenario, DATAPLANE_PROCESS, scenario.dataplane_endpoint, socket_dir)
        if scenario.uses_dataplane
        else None
    )
    data = (
        {spec.name: _endpoint(scenario, spec.name + ".data", spec.data_endpoint, socket_dir) for spec in scenario.processes}
        if not scenario.shares_core else {}
    )  # fmt: skip
    return RunDescription(
        scenario=str(Path(scenario.source).resolve()) if Path(scenario.source).exists() else scenario.source,
        seed=scenario.seed, time_scale=scenario.time_scale, endpoints=endpoints, dataplane_endpoint=dataplane,
        requesters=tuple(spec.name for spec in scenario.processes) if dataplane is not None else (),
        heartbeat_timeout_s=scenario.heartbeat_timeout_s, keys=keys, data_endpoints=data,
        clock_origin_ns=time.time_ns() if not scenario.shares_core else None,
    )  # fmt: skip


def process_names(scenario: RunScenario) -> list[str]:
    """Every process of a real-time run, in start order: the data plane first (if any)."""
    return ([DATAPLANE_PROCESS] if scenario.uses_dataplane else []) + [spec.name for spec in scenario.processes]


def needs_keys(description: RunDescription) -> bool:
    """Whether a run reaches any process over tcp:// (then it gets CURVE keys; ipc:// sockets are private)."""
    endpoints = [
        *description.endpoints.values(),
        *description.data_endpoints.values(),
        description.dataplane_endpoint or "",
    ]
    return any(endpoint.startswith("tcp://") for endpoint in endpoints)


def make_keys(scenario: RunScenario, directory: Path) -> str:
    """A new key pair per process of the run (the data plane's included) in ``directory`` (0700)."""
    RunKeys.generate(directory, process_names(scenario))
    return str(directory.resolve())


def node_command(scenario: RunScenario, name: str, run_dir: Path) -> list[str]:
    """The command line that starts process ``name`` of a run whose description is in ``run_dir``."""
    return [sys.executable, "-m", "dualpath_emu.cli", "node", scenario.source, "--process", name, "--run-dir",
            str(run_dir)]  # fmt: skip


def prepare(scenario: RunScenario, run_dir: Path) -> list[str]:
    """Write the run description for processes started by hand; return each one's command, in start order."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    socket_dir = run_dir / "sockets"
    socket_dir.mkdir(mode=0o700, exist_ok=True)
    os.chmod(socket_dir, 0o700)
    description = describe_run(scenario, socket_dir)
    if needs_keys(description):
        keys_dir = run_dir / "keys"
        keys = str(keys_dir.resolve()) if keys_dir.exists() else make_keys(scenario, keys_dir)
        description = describe_run(scenario, socket_dir, keys)
    description.write(run_dir)
    names = [n for n in process_names(scenario) if n != scenario.driver_process.name] + [scenario.driver_process.name]
    commands = []
    for name in names:
        command = ["dualpath-emu", "node", *node_command(scenario, name, run_dir)[4:]]
        if name == scenario.driver_process.name:
            command.append("--no-ready-wait")
        commands.append(shlex.join(command))
    return commands
