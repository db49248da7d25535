"""Workloads: agent trajectories and request traces (:mod:`~dualpath_emu.workload.trajectory`, with their
file format), a generator shaped like the paper's datasets (:mod:`~dualpath_emu.workload.generator`), a
Mooncake importer (:mod:`~dualpath_emu.workload.mooncake`) and statistics (:mod:`~dualpath_emu.workload.stats`).
:func:`load_trace` reads either file type, telling them apart by the first line."""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dualpath_emu.workload.mooncake import is_mooncake_record, read_mooncake
from dualpath_emu.workload.trajectory import (
    FORMAT,
    TraceError,
    Trajectory,
    numbered_lines,
    parse_json_object,
    read_trajectories,
)

__all__ = ["LoadedTrace", "TraceError", "Trajectory", "load_trace"]


@dataclass(frozen=True)
class LoadedTrace:
    """A trace file read by :func:`load_trace`: its kind, the header's meta (ours only), the trajectories."""

    kind: Literal["trajectories", "mooncake"]
    trajectories: tuple[Trajectory, ...]
    meta: dict[str, Any]


def load_trace(path: str | Path) -> LoadedTrace:
    """Read ``path``: a trajectory file or a Mooncake request trace, told apart by its first line."""
    with closing(numbered_lines(path)) as lines:
        first = next(lines, None)
    if first is None:
        raise TraceError(f"{path}: empty file: expected a trajectory file or a Mooncake trace")
    record = parse_json_object(*first)
    if "format" in record:
        contents = read_trajectories(path)
        if not contents.trajectories:  # a header and nothing else: nothing to summarise or replay
            raise TraceError(f"{path}: no trajectories after the header: expected at least one trajectory line")
        return LoadedTrace("trajectories", contents.trajectories, dict(contents.meta))
    if is_mooncake_record(record):
        return LoadedTrace("mooncake", tuple(read_mooncake(path)), {})
    line = first[0]
    raise line.error(
        f'expected a trajectory file (first line {{"format": "{FORMAT}", ...}}) or a Mooncake trace '
        "(lines with timestamp, input_length, output_length, hash_ids)"
    )
