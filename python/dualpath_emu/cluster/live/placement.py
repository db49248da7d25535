"""Where a live run's actors go: the processes of each placement (:data:`PLACEMENTS`), which of them a
restart may replace, and which host each runs on when started by hand."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Final

from dualpath_emu.cluster.identity import GroupId
from dualpath_emu.errors import UsageError

__all__ = ["PLACEMENTS", "check_restart", "host_of", "placement", "restartable"]

PLACEMENTS: Final = ("groups", "roles", "single")
"""``groups`` (the default: the scheduler, the client, each prefill group and each decode group in its own
process), ``roles`` (the client and the scheduler together, every prefill group in one process, every decode
group in another) and ``single`` (every actor in one process, on its own core: no data-plane service)."""


def placement(app_actors: Sequence[str], kind: str) -> list[tuple[str, list[str]]]:
    """The processes of placement ``kind``: ``(process name, its actors)`` each."""
    groups = {a: GroupId.parse(a) for a in app_actors}
    pe = [a for a, group in groups.items() if group is not None and group.prefill]
    de = [a for a, group in groups.items() if group is not None and not group.prefill]
    # The fault injector beside the scheduler it tells, and the background traffic's engine with them.
    faults = [a for a in app_actors if a in ("faults", "background")]
    if kind == "groups":
        return [("scheduler", ["scheduler", *faults]), ("client", ["client"]), *((a, [a]) for a in pe + de)]
    if kind == "roles":
        return [("front", ["client", "scheduler", *faults]), ("prefill", pe), ("decode", de)]
    if kind == "single":
        return [("main", list(app_actors))]
    raise ValueError(f"placement: expected one of {', '.join(PLACEMENTS)}, got {kind!r}")


def restartable(processes: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """The processes ``--restart-crashed`` starts again if they die: those hosting only engine groups."""
    return [name for name, actors in processes
            if actors and all(a.startswith(("pe", "de")) and a[2:].isdigit() for a in actors)]  # fmt: skip


def check_restart(backend: str, processes: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """:func:`restartable`, or a :class:`UsageError` where ``--restart-crashed`` cannot work."""
    if backend == "host":
        raise UsageError("--restart-crashed: the host backend's processes own real bytes (files, channels) that a "
                         "restarted process could not take over; use the model backend")  # fmt: skip
    names = restartable(processes)
    if not names:
        raise UsageError("--restart-crashed: this placement has no process of engine groups alone to start again "
                         "(placement single: one process, the run's own); use groups or roles")  # fmt: skip
    return names


def host_of(process: str, hosts: Sequence[tuple[str, str]], default: str) -> str:
    """The host a process runs on: the first ``(pattern, host)`` whose shell-style pattern matches its name."""
    for pattern, host in hosts:
        if fnmatch.fnmatchcase(process, pattern):
            return host
    return default
