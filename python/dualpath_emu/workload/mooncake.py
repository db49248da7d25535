"""Import Mooncake request traces (kvcache-ai/Mooncake, ``FAST25-release/traces``) as explicit turns: hits from
the prefix blocks any earlier request stored, requests regrouped into the sessions their blocks show. The input,
the rules and the output: docs/workloads.md ("Importing a Mooncake trace")."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any, Final

from dualpath_emu.inputs import short_repr
from dualpath_emu.workload.trajectory import (
    MAX_ARRIVAL_S,
    SourceLine,
    TraceError,
    Trajectory,
    numbered_lines,
    parse_json_object,
)

__all__ = [
    "BLOCK_TOKENS", "KEYS", "SESSION_SHARE", "hit_tokens", "is_mooncake_record", "read_mooncake", "session_count",
]  # fmt: skip

BLOCK_TOKENS: Final = 512  # Tokens per hash block in the Mooncake traces.

KEYS: Final = ("timestamp", "input_length", "output_length", "hash_ids")
"""The keys of a Mooncake request line (no others)."""

_MAX_TIMESTAMP_MS: Final = MAX_ARRIVAL_S * 1000  # 1e11, as the error message says
SESSION_SHARE: Final = 0.5
"""The least share of a request's prompt an earlier request's full blocks must cover for it to join that
session [our choice: the new message and the last answer are usually the smaller part of a context]."""


def is_mooncake_record(record: dict[str, Any]) -> bool:
    """Whether a parsed JSON line looks like a Mooncake request (used to detect the file type)."""
    return "input_length" in record and "hash_ids" in record


def hit_tokens(hash_ids: list[int], input_length: int, stored: set[int], block_tokens: int = BLOCK_TOKENS) -> int:
    """A request's reused-prefix tokens: its leading ``hash_ids`` in ``stored`` × ``block_tokens``, < its input."""
    run = 0
    for block in hash_ids:
        if block not in stored:
            break
        run += 1
    return min(run * block_tokens, input_length - 1)


def _field_count(line: SourceLine, record: dict[str, Any], key: str) -> int:
    if key not in record:
        raise line.error(f"missing key {key!r} (expected an integer >= 1)")
    return line.count(key, record[key], 1)


def _parse(line: SourceLine, text: str, block_tokens: int) -> tuple[float, int, int, list[int]]:
    record = parse_json_object(line, text)
    unknown = sorted(set(record) - set(KEYS))
    if unknown:
        raise line.error(f"unknown key {short_repr(unknown[0])} in a Mooncake request (known keys: {', '.join(KEYS)})")
    if "timestamp" not in record:
        raise line.error("missing key 'timestamp' (expected milliseconds >= 0)")
    timestamp = line.seconds("timestamp", record["timestamp"], _MAX_TIMESTAMP_MS,
                             "a finite number of milliseconds in [0, 1e11]")  # fmt: skip
    input_length = _field_count(line, record, "input_length")
    output_length = _field_count(line, record, "output_length")
    if "hash_ids" not in record:
        raise line.error("missing key 'hash_ids' (expected a list of integers >= 0)")
    hash_ids = record["hash_ids"]
    blocks = -(-input_length // block_tokens)  # exact for any block size
    if not isinstance(hash_ids, list) or not all(type(h) is int and h >= 0 for h in hash_ids):
        raise line.expected("hash_ids", "a list of integers >= 0", hash_ids)
    if len(hash_ids) != blocks:
        raise line.error(
            f"'hash_ids': expected ceil({input_length} / {block_tokens}) = {blocks} block hashes, got {len(hash_ids)}"
        )
    return timestamp, input_length, output_length, hash_ids


def read_mooncake(
    path: str | Path, *, block_tokens: int = BLOCK_TOKENS, prefix: str = "req", sessions: bool = True
) -> list[Trajectory]:
    """The requests of the Mooncake trace ``path`` with explicit hits, as sessions (module docstring)."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens: expected an integer >= 1, got {block_tokens}")
    stored: set[int] = set()
    # Per session (by its first request's index): its turns' prompt, hit, gen and arrival columns.
    columns: dict[int, tuple[list[int], list[int], list[int], list[float]]] = {}
    session_of: list[int] = []
    lengths: list[int] = []
    ends_at: dict[int, int] = {}
    """The hash of a request's last full block -> the latest request whose full blocks end there."""
    last_ms = 0.0
    with closing(numbered_lines(path)) as lines:
        for line, text in lines:
            timestamp_ms, input_length, output_length, hash_ids = _parse(line, text, block_tokens)
            if timestamp_ms < last_ms:
                raise line.error(
                    f"'timestamp': expected arrival order (not before {last_ms:g} ms), got {timestamp_ms:g}"
                )
            last_ms = timestamp_ms
            hit = hit_tokens(hash_ids, input_length, stored, block_tokens)
            stored.update(hash_ids)
            index = len(session_of)
            full = input_length // block_tokens
            session = index
            if sessions:
                least = SESSION_SHARE * input_length
                for depth in range(full, 0, -1):  # the deepest prefix first: a hash covers all before it
                    if depth * block_tokens < least:
                        break
                    parent = ends_at.get(hash_ids[depth - 1])
                    if parent is not None and lengths[parent] < input_length:
                        session = session_of[parent]
                        break
                if full:
                    ends_at[hash_ids[full - 1]] = index
            session_of.append(session)
            lengths.append(input_length)
            prompts, hits, gens, arrivals = columns.setdefault(session, ([], [], [], []))
            prompts.append(input_length)
            hits.append(hit)
            gens.append(output_length)
            arrivals.append(timestamp_ms / 1000)
    if not session_of:
        raise TraceError(f"{path}: empty file: expected Mooncake request lines ({', '.join(KEYS)})")
    return [
        Trajectory(f"{prefix}-{first:05d}", tuple(p - h for p, h in zip(prompts, hits)), tuple(gens), tuple(hits),
                   tuple(arrivals))
        for first, (prompts, hits, gens, arrivals) in columns.items()
    ]  # fmt: skip


def session_count(trajectories: list[Trajectory]) -> tuple[int, int]:
    """``(sessions of more than one request, requests in them)``."""
    multi = [len(t) for t in trajectories if len(t) > 1]
    return len(multi), sum(multi)
