"""``dualpath-emu trace``: summarise (``stats``), generate (``gen``, :mod:`~dualpath_emu.workload.generator`)
and import (``import``, Mooncake, :mod:`~dualpath_emu.workload.mooncake`) workload traces. Bad input is a
:class:`~dualpath_emu.errors.UsageError`: one line, exit status 2."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dualpath_emu import __version__
from dualpath_emu.errors import UsageError
from dualpath_emu.workload import load_trace
from dualpath_emu.inputs import short_repr, shorten
from dualpath_emu.workload.generator import DATASETS, MAX_AGENTS, READINGS, GeneratorParams, generate
from dualpath_emu.workload.mooncake import BLOCK_TOKENS, read_mooncake, session_count
from dualpath_emu.workload.stats import Distribution, dataset_stats, trace_stats
from dualpath_emu.workload.trajectory import MAX_TOKENS, Trajectory, write_trajectories

__all__ = ["trace_command"]


def trace_command(args: argparse.Namespace) -> int:
    """Runs ``dualpath-emu trace <command>``; returns the exit status."""
    commands = {"stats": _stats, "gen": _gen, "import": _import}
    if args.trace_command not in commands:
        raise UsageError(f"a trace command is required: {', '.join(commands)}; see dualpath-emu trace --help")
    return commands[args.trace_command](args)


def _write(path: Path, trajectories: list[Trajectory], meta: dict[str, Any]) -> None:
    try:
        write_trajectories(path, trajectories, meta)
    except OSError as error:
        raise UsageError(f"{path}: cannot write: {error.strerror or error}") from None


def _gen(args: argparse.Namespace) -> int:
    if args.dataset not in DATASETS:
        raise UsageError(f"--dataset: expected one of {', '.join(DATASETS)}, got {short_repr(args.dataset)}")
    if args.agents is not None and not 1 <= args.agents <= MAX_AGENTS:
        raise UsageError(f"--agents: expected an integer in [1, {MAX_AGENTS}], got {short_repr(args.agents)}")
    if args.reading is not None and args.reading not in READINGS:
        raise UsageError(f"--reading: expected one of {', '.join(READINGS)}, got {short_repr(args.reading)}")
    # Options not given keep GeneratorParams' defaults (documented there, in one place).
    given = {"n_base": args.base, "reading": args.reading, "first_append": args.first_append}
    try:
        params = GeneratorParams(**{key: value for key, value in given.items() if value is not None})
        trajectories = generate(args.dataset, args.agents, args.seed, params)
    except ValueError as error:
        raise UsageError(f"trace gen: {shorten(str(error), 200)}") from None
    dataset = DATASETS[args.dataset]
    meta = {"generator": "dualpath_emu.workload.generator", "dualpath_emu_version": __version__,
            "dataset": dataset.name, "max_len": dataset.max_len, "seed": args.seed, "agents": len(trajectories),
            "params": asdict(params)}  # fmt: skip
    _write(args.out, trajectories, meta)
    print(f"wrote {len(trajectories):,} trajectories (dataset {dataset.name}, seed {args.seed}) to {args.out}")
    return 0


def _import(args: argparse.Namespace) -> int:
    block_tokens = BLOCK_TOKENS if args.block_tokens is None else args.block_tokens
    if not 1 <= block_tokens <= MAX_TOKENS:
        raise UsageError(f"--block-tokens: expected an integer in [1, {MAX_TOKENS}], got {short_repr(block_tokens)}")
    sessions = not args.no_sessions
    trajectories = read_mooncake(args.file, block_tokens=block_tokens, sessions=sessions)
    meta = {"importer": "mooncake", "source": Path(args.file).name, "block_tokens": block_tokens, "sessions": sessions}
    _write(args.out, trajectories, meta)
    stats = trace_stats(trajectories)
    multi, in_multi = session_count(trajectories)
    found = (f"{stats.trajectories:,} sessions, {multi:,} of them multi-turn ({in_multi:,} requests)" if sessions
             else "one trajectory per request")  # fmt: skip
    print(
        f"imported {stats.turns:,} requests from {args.file} to {args.out}: {found}; "
        f"prefix-hit fraction {stats.hit_fraction:.2%}"
    )
    return 0


def _row(name: str, d: Distribution) -> str:
    return f"{name:<22}{d.mean:>12,.1f}{d.p50:>12,.0f}{d.p99:>12,.0f}{d.max:>12,.0f}"


def _stats(args: argparse.Namespace) -> int:
    trace = load_trace(args.file)
    stats = trace_stats(trace.trajectories)
    all_agents = stats.agent_trajectories == stats.trajectories
    table2 = dataset_stats(trace.trajectories) if all_agents else None
    if args.json:
        out = {"file": str(args.file), "kind": trace.kind, "meta": trace.meta, "stats": stats.as_dict(),
               "table2": None if table2 is None else table2.as_dict()}  # fmt: skip
        print(json.dumps(out, indent=1))
        return 0
    kind = "Mooncake request trace" if trace.kind == "mooncake" else "dualpath-emu trajectories"
    print(f"{args.file}: {kind}" + (f"; meta {json.dumps(trace.meta, sort_keys=True)}" if trace.meta else ""))
    span = "" if stats.duration_s is None else f", arrivals over {stats.duration_s:,.1f} s"
    print(
        f"{stats.trajectories:,} trajectories ({stats.agent_trajectories:,} agents with implied hits), "
        f"{stats.turns:,} turns (requests){span}"
    )
    print(f"{'':<22}{'mean':>12}{'p50':>12}{'p99':>12}{'max':>12}")
    print(_row("turns per trajectory", stats.turns_per_trajectory))
    for name in ("prompt", "hit", "append", "gen"):
        print(_row(f"{name} tokens", getattr(stats, name)))
    print(f"prefix-hit fraction {stats.hit_fraction:.2%} (hit tokens / prompt tokens)")
    if table2 is not None:
        print(
            f"Table 2 columns: turns {table2.turns:,.1f}, append {table2.append:,.1f}, gen {table2.gen:,.1f}, "
            f"total {table2.total:,.0f}, context {table2.context:,.0f}, hit rate {table2.hit_rate:.2%} "
            "(per-trajectory means; context per turn)"
        )
    return 0
