"""Trajectories, the unit of workload (agent rounds or request turns), and their JSONL file format
(``dualpath-emu-trajectories``, version 2): the format, its limits and its errors are in docs/workloads.md. Every
malformed line is a :class:`TraceError` naming the file, the line, the key and what was expected."""

from __future__ import annotations

import json
import math
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple

from dualpath_emu.errors import UsageError
from dualpath_emu.inputs import MAX_LINE_BYTES, MAX_TRACE_BYTES, open_input, short_repr, too_long_number
from dualpath_emu.workload.waits import MAX_WAIT_S

__all__ = [
    "FORMAT", "MAX_ARRIVAL_S", "MAX_TOKENS", "VERSION", "TraceError", "Trajectory", "TrajectoryFile", "Turn",
    "read_trajectories", "truncated", "write_trajectories",
]  # fmt: skip

FORMAT: Final = "dualpath-emu-trajectories"
VERSION: Final = 2  # The format version written when trajectories have tool waits (1 and 2 are read).
_HEADER_KEYS: Final = frozenset({"format", "version", "trajectories", "meta"})

MAX_TOKENS: Final = 10**9
"""The largest token count (prompt, hit, append, gen) and trajectory count a trace file may state."""
MAX_ARRIVAL_S: Final = 1e8
"""The latest arrival time (seconds) a trace file may state: about 3 years, far below the core's 2^64 ns."""


class TraceError(UsageError, ValueError):
    """A trace file that cannot be used: names the file, the line and what was expected (CLI: exit status 2)."""


class Turn(NamedTuple):
    """One request of a trajectory, as a driver replays it (tokens; seconds)."""

    prompt: int  # Prompt tokens = hit + append.
    hit: int  # Reused-prefix tokens: KV-cache read from storage, not computed.
    append: int  # Tokens computed by prefill (the miss).
    gen: int  # Output tokens (forced exactly).
    arrival_s: float | None  # Arrival time (open loop), or None (issued when the previous turn finishes).
    wait_s: float | None = None
    """Closed loop: the tool wait before the turn is sent, after the previous one ended (None: none given)."""


def _is_count(value: object, low: int) -> bool:
    return type(value) is int and value >= low


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One client's turns, in columns: an agent trajectory (``hit is None``) or explicit turns."""

    id: str
    append: tuple[int, ...]
    gen: tuple[int, ...]
    hit: tuple[int, ...] | None = None
    arrival_s: tuple[float, ...] | None = None
    wait_s: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.append)
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"trajectory id: expected a non-empty string, got {self.id!r}")
        if n == 0:
            raise ValueError(f"trajectory {self.id!r}: expected at least one turn")
        if len(self.gen) != n:
            raise ValueError(f"trajectory {self.id!r}: {n} append values but {len(self.gen)} gen values")
        if not all(_is_count(a, 1) for a in self.append):
            raise ValueError(f"trajectory {self.id!r}: append tokens must be integers >= 1")
        if not all(_is_count(g, 1) for g in self.gen):
            raise ValueError(f"trajectory {self.id!r}: gen tokens must be integers >= 1")
        if self.hit is not None:
            if len(self.hit) != n:
                raise ValueError(f"trajectory {self.id!r}: {n} append values but {len(self.hit)} hit values")
            if not all(_is_count(h, 0) for h in self.hit):
                raise ValueError(f"trajectory {self.id!r}: hit tokens must be integers >= 0")
        if self.arrival_s is not None:
            if self.hit is None:
                raise ValueError(f"trajectory {self.id!r}: arrival times need explicit turns (hit given)")
            if len(self.arrival_s) != n:
                raise ValueError(f"trajectory {self.id!r}: {n} turns but {len(self.arrival_s)} arrival times")
            if not all(isinstance(t, float) and math.isfinite(t) and t >= 0.0 for t in self.arrival_s):
                raise ValueError(f"trajectory {self.id!r}: arrival times must be finite floats >= 0")
            if any(b < a for a, b in zip(self.arrival_s, self.arrival_s[1:])):
                raise ValueError(f"trajectory {self.id!r}: arrival times must not decrease")
        if self.wait_s is not None:
            if self.arrival_s is not None:
                raise ValueError(f"trajectory {self.id!r}: tool waits are for closed-loop turns, not timed arrivals")
            if len(self.wait_s) != n:
                raise ValueError(f"trajectory {self.id!r}: {n} turns but {len(self.wait_s)} tool waits")
            if not all(isinstance(w, float) and math.isfinite(w) and 0.0 <= w <= MAX_WAIT_S for w in self.wait_s):
                raise ValueError(f"trajectory {self.id!r}: tool waits must be floats in [0, {MAX_WAIT_S:g}] seconds")

    @classmethod
    def from_rounds(
        cls, id: str, rounds: Iterable[tuple[int, int]], wait_s: Sequence[float] | None = None
    ) -> Trajectory:
        """An agent trajectory from ``(append, gen)`` pairs, with a tool wait (seconds) before each round if given."""
        pairs = list(rounds)
        waits = None if wait_s is None else tuple(float(w) for w in wait_s)
        return cls(id, tuple(a for a, _ in pairs), tuple(g for _, g in pairs), wait_s=waits)

    @classmethod
    def from_turns(
        cls, id: str, turns: Iterable[tuple[int, int, int]], arrival_s: Sequence[float] | None = None
    ) -> Trajectory:
        """Explicit turns from ``(prompt, hit, gen)`` triples (``prompt - hit`` must be >= 1)."""
        triples = list(turns)
        if any(not (_is_count(p, 1) and _is_count(h, 0) and h < p) for p, h, _ in triples):
            raise ValueError(f"trajectory {id!r}: expected 0 <= hit <= prompt - 1 in every turn")
        return cls(
            id,
            tuple(p - h for p, h, _ in triples),
            tuple(g for _, _, g in triples),
            tuple(h for _, h, _ in triples),
            None if arrival_s is None else tuple(float(t) for t in arrival_s),
        )

    @property
    def is_agent(self) -> bool:
        """Whether hits are implied by the rounds (agent trajectory, §3.2) rather than explicit."""
        return self.hit is None

    def __len__(self) -> int:
        return len(self.append)

    def hits(self) -> tuple[int, ...]:
        """The hit of every turn: explicit, or (agent) the context A_1 + g_1 + … + A_{i-1} + g_{i-1}."""
        if self.hit is not None:
            return self.hit
        out = []
        context = 0
        for a, g in zip(self.append, self.gen):
            out.append(context)
            context += a + g
        return tuple(out)

    def turns(self) -> Iterator[Turn]:
        """The turns in order, as a driver replays them."""
        arrivals: Iterable[float | None] = self.arrival_s if self.arrival_s is not None else [None] * len(self)
        waits: Iterable[float | None] = self.wait_s if self.wait_s is not None else [None] * len(self)
        for h, a, g, t, w in zip(self.hits(), self.append, self.gen, arrivals, waits):
            yield Turn(h + a, h, a, g, t, w)

    @property
    def total_tokens(self) -> int:
        """Tokens appended and generated over all turns (an agent's final context length; Table 2 'Total')."""
        return sum(self.append) + sum(self.gen)

    @property
    def max_tokens(self) -> int:
        """The longest sequence any turn holds: max over turns of prompt + gen (must fit the model's MaxLen)."""
        return max(t.prompt + t.gen for t in self.turns())


def truncated(trajectory: Trajectory, max_len: int) -> Trajectory:
    """``trajectory`` cut before the first round exceeding ``max_len`` tokens (ValueError if the first does)."""
    keep = 0
    for turn in trajectory.turns():
        if turn.prompt + turn.gen > max_len:
            break
        keep += 1
    if keep == len(trajectory):
        return trajectory
    if keep == 0:
        raise ValueError(f"trajectory {trajectory.id!r}: the first turn does not fit in {max_len} tokens")

    def cut(column: tuple[Any, ...] | None) -> Any:
        return None if column is None else column[:keep]

    t = trajectory
    return Trajectory(t.id, t.append[:keep], t.gen[:keep], cut(t.hit), cut(t.arrival_s), cut(t.wait_s))


@dataclass(frozen=True)
class TrajectoryFile:
    """A trajectory file's trajectories, in file order, and its header's ``meta``."""

    trajectories: tuple[Trajectory, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- writing


def _record(trajectory: Trajectory) -> dict[str, Any]:
    if trajectory.hit is None:
        if trajectory.wait_s is not None:
            rows = zip(trajectory.append, trajectory.gen, trajectory.wait_s)
            return {"id": trajectory.id, "rounds": [[a, g, w] for a, g, w in rows]}
        return {"id": trajectory.id, "rounds": [[a, g] for a, g in zip(trajectory.append, trajectory.gen)]}
    if trajectory.wait_s is not None:
        raise ValueError(f"trajectory {trajectory.id!r}: the file format keeps tool waits for agent rounds only")
    columns: list[Iterable[Any]] = [
        (h + a for h, a in zip(trajectory.hit, trajectory.append)),
        trajectory.hit,
        trajectory.gen,
    ]
    if trajectory.arrival_s is not None:
        columns.append(trajectory.arrival_s)
    return {"id": trajectory.id, "turns": [list(row) for row in zip(*columns)]}


def write_trajectories(
    path: str | Path, trajectories: Sequence[Trajectory], meta: Mapping[str, Any] | None = None
) -> None:
    """Write ``trajectories`` to ``path`` (version 2 if some have waits, else 1); duplicate ids: ValueError."""
    seen: set[str] = set()
    for trajectory in trajectories:
        if trajectory.id in seen:
            raise ValueError(f"duplicate trajectory id {trajectory.id!r}")
        seen.add(trajectory.id)
    version = VERSION if any(t.wait_s is not None for t in trajectories) else 1
    header: dict[str, Any] = {"format": FORMAT, "version": version, "trajectories": len(trajectories)}
    if meta:
        header["meta"] = dict(meta)
    with open(path, "w", encoding="utf-8") as file:
        file.write(json.dumps(header, allow_nan=False) + "\n")
        for trajectory in trajectories:
            file.write(json.dumps(_record(trajectory), separators=(",", ":"), allow_nan=False) + "\n")


# ---------------------------------------------------------------------------------------------------- reading


def _describe(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, str):
        return f"the string {short_repr(value, 40)}"
    return short_repr(value)


class SourceLine:
    """One line being parsed: builds errors that name the file and line."""

    def __init__(self, source: str, number: int) -> None:
        self.source = source
        self.number = number

    def error(self, message: str) -> TraceError:
        return TraceError(f"{self.source}:{self.number}: {message}")

    def expected(self, key: str, expected: str, got: object, what: str = "") -> TraceError:
        label = f"'{key}' ({what})" if what else f"'{key}'"
        return self.error(f"{label}: expected {expected}, got {_describe(got)}")

    def count(self, key: str, value: object, low: int, what: str = "", high: int = MAX_TOKENS) -> int:
        if not _is_count(value, low):
            raise self.expected(key, f"an integer >= {low}", value, what)
        assert isinstance(value, int)
        if value > high:
            raise self.expected(key, f"an integer in [{low}, {high:,}]", value, what)
        return value

    def seconds(self, key: str, value: object, high: float, expected: str, what: str = "") -> float:
        """A number (no boolean) in [0, ``high``], else an error saying ``expected``."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high:
            raise self.expected(key, expected, value, what)
        return float(value)


def parse_json_object(line: SourceLine, text: str) -> dict[str, Any]:
    """``text`` as a JSON object, or a :class:`TraceError` naming the line."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise line.error(f"not valid JSON ({error.msg} at column {error.colno})") from None
    except RecursionError:
        raise line.error("not valid JSON (arrays or objects nested too deeply)") from None
    except ValueError as error:  # an integer of more than 4,300 digits (Python's int-to-str limit)
        raise line.error(f"not valid JSON ({too_long_number(error)})") from None
    if not isinstance(value, dict):
        raise line.error(f"expected a JSON object, got {_describe(value)}")
    return value


def _check_keys(line: SourceLine, record: dict[str, Any], allowed: Iterable[str], what: str) -> None:
    unknown = sorted(set(record) - set(allowed))
    if unknown:
        raise line.error(f"unknown key {short_repr(unknown[0])} in {what} (known keys: {', '.join(sorted(allowed))})")


def _parse_header(line: SourceLine, text: str) -> tuple[int | None, dict[str, Any], int]:
    header = parse_json_object(line, text)
    if header.get("format") != FORMAT:
        raise line.error(
            f'not a dualpath-emu trajectory file: expected a first line {{"format": "{FORMAT}", "version": {VERSION}, ...}}'
        )
    version = header.get("version")
    if version not in (1, VERSION) or type(version) is not int:
        raise line.error(f"unsupported format version {_describe(version)}: this reader knows versions 1 and {VERSION}")
    _check_keys(line, header, _HEADER_KEYS, "the header")
    count = header.get("trajectories")
    if count is not None:
        count = line.count("trajectories", count, 0)
    meta = header.get("meta", {})
    if not isinstance(meta, dict):
        raise line.expected("meta", "an object", meta)
    return count, meta, version


def _parse_rows(
    line: SourceLine, key: str, value: object, names: Sequence[str], optional_last: bool
) -> list[list[Any]]:
    shape = (
        "[" + ", ".join(names[:-1] if optional_last else names) + (f"[, {names[-1]}]" if optional_last else "") + "]"
    )
    if not isinstance(value, list) or not value:
        raise line.expected(key, f"a non-empty list of {shape}", value)
    widths = {len(names) - 1, len(names)} if optional_last else {len(names)}
    for i, row in enumerate(value):
        if not isinstance(row, list) or len(row) not in widths:
            raise line.expected(f"{key}[{i}]", shape, row)
    if optional_last and len({len(row) for row in value}) > 1:
        raise line.error(f"{key!r}: either every turn has {names[-1]} or none does")
    return value


def _parse_trajectory(line: SourceLine, text: str, version: int) -> Trajectory:
    record = parse_json_object(line, text)
    if "rounds" in record and "turns" in record:
        raise line.error("expected either 'rounds' (agent trajectory) or 'turns' (explicit turns), not both")
    body = "rounds" if "rounds" in record else "turns"
    _check_keys(line, record, ("id", body), "a trajectory")
    if "id" not in record:
        raise line.error("missing key 'id' (expected a non-empty string)")
    ident = record["id"]
    if not isinstance(ident, str) or not ident:
        raise line.expected("id", "a non-empty string", ident)
    if body not in record:
        raise line.error("missing key 'rounds' (agent trajectory: [[append, gen], ...]) or 'turns' (explicit turns)")
    if body == "rounds":
        if version >= 2:
            rows = _parse_rows(line, "rounds", record["rounds"], ("append", "gen", "wait_s"), optional_last=True)
        else:
            rows = _parse_rows(line, "rounds", record["rounds"], ("append", "gen"), optional_last=False)
        append = tuple(line.count(f"rounds[{i}][0]", row[0], 1, "append tokens") for i, row in enumerate(rows))
        gen = tuple(line.count(f"rounds[{i}][1]", row[1], 1, "gen tokens") for i, row in enumerate(rows))
        waits = tuple(line.seconds(f"rounds[{i}][2]", row[2], MAX_WAIT_S, f"a number of seconds in [0, {MAX_WAIT_S:g}]",
                                   "wait_s") for i, row in enumerate(rows) if len(row) == 3)  # fmt: skip
        return Trajectory(ident, append, gen, wait_s=waits or None)
    rows = _parse_rows(line, "turns", record["turns"], ("prompt", "hit", "gen", "arrival_s"), optional_last=True)
    prompts: list[int] = []
    hits: list[int] = []
    gens: list[int] = []
    arrivals: list[float] = []
    for i, row in enumerate(rows):
        prompt = line.count(f"turns[{i}][0]", row[0], 1, "prompt tokens")
        hit = line.count(f"turns[{i}][1]", row[1], 0, "hit tokens")
        if hit >= prompt:
            raise line.error(
                f"'turns[{i}]': expected hit <= prompt - 1 (at least one token computed), got hit {hit}, prompt {prompt}"
            )
        prompts.append(prompt)
        hits.append(hit)
        gens.append(line.count(f"turns[{i}][2]", row[2], 1, "gen tokens"))
        if len(row) == 4:
            t = line.seconds(f"turns[{i}][3]", row[3], MAX_ARRIVAL_S, "a finite number in [0, 1e8]", "arrival_s")
            if arrivals and t < arrivals[-1]:
                raise line.error(
                    f"'turns[{i}][3]' (arrival_s): expected arrivals that do not decrease, got {row[3]} after {arrivals[-1]}"
                )
            arrivals.append(t)
    return Trajectory(
        ident, tuple(p - h for p, h in zip(prompts, hits)), tuple(gens), tuple(hits), tuple(arrivals) or None
    )


def numbered_lines(path: str | Path) -> Generator[tuple[SourceLine, str], None, None]:
    """The non-blank lines of ``path`` with their numbers; an unreadable file is a :class:`TraceError`."""
    source = str(path)
    try:
        file = open_input(path, what="a trace file (JSON Lines)", limit_bytes=MAX_TRACE_BYTES)
    except UsageError as error:
        raise TraceError(str(error)) from None
    # bytes, decoded line by line: a bad byte is reported on its line
    with file:
        number = 0
        read = 0
        while True:
            try:
                raw = file.readline(MAX_LINE_BYTES + 1)
            except OSError as error:
                raise TraceError(f"{source}: cannot read: {error.strerror or error}") from None
            if not raw:
                return
            number += 1
            read += len(raw)
            if read > MAX_TRACE_BYTES:  # it grew after it was opened
                raise TraceError(f"{source}: more than the {MAX_TRACE_BYTES:,} bytes read from a trace file")
            if len(raw) > MAX_LINE_BYTES:
                raise TraceError(f"{source}:{number}: a line longer than {MAX_LINE_BYTES:,} bytes")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise TraceError(f"{source}:{number}: not UTF-8 text") from None
            if text.strip():
                yield SourceLine(source, number), text


def read_trajectories(path: str | Path) -> TrajectoryFile:
    """Read a trajectory file (format version 1 or 2); every problem is a :class:`TraceError` naming the line."""
    trajectories: list[Trajectory] = []
    first_line: dict[str, int] = {}
    with closing(numbered_lines(path)) as lines:
        first = next(lines, None)
        if first is None:
            raise TraceError(
                f'{path}: empty file: expected a first line {{"format": "{FORMAT}", "version": {VERSION}, ...}}'
            )
        count, meta, version = _parse_header(*first)
        for line, text in lines:
            trajectory = _parse_trajectory(line, text, version)
            if trajectory.id in first_line:
                raise line.error(
                    f"duplicate id {short_repr(trajectory.id)} (first on line {first_line[trajectory.id]})"
                )
            first_line[trajectory.id] = line.number
            trajectories.append(trajectory)
    if count is not None and count != len(trajectories):
        raise TraceError(f"{path}: the header says {count} trajectories, the file has {len(trajectories)} (truncated?)")
    return TrajectoryFile(tuple(trajectories), meta)
