"""Workloads: the trajectory file format round-trips and reports malformed lines by number; the generator is
deterministic, matches Table 2 (per-trajectory reading: turns and total within ±1 %, append, gen and context
within ±5 % for every seed tried; per-turn reading: turns, append and gen per turn within ±1 %) and never
exceeds MaxLen; extra agents get the synthetic first round; the Mooncake importer computes prefix hits; the
``trace`` commands exit 0, or 2 with the file and line of a bad input and no traceback.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_emu.cli import main as cli_main
from dualpath_emu.errors import UsageError
from dualpath_emu.workload import load_trace
from dualpath_emu.workload.generator import DATASETS, GeneratorParams, generate, generate_base, scaled
from dualpath_emu.workload.mooncake import hit_tokens, read_mooncake
from dualpath_emu.workload.stats import dataset_stats, distribution, trace_stats
from dualpath_emu.workload.trajectory import (
    FORMAT,
    TraceError,
    Trajectory,
    read_trajectories,
    truncated,
    write_trajectories,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "mooncake"
HEADER = json.dumps({"format": FORMAT, "version": 1})

# ------------------------------------------------------------------------------------------ data model


def test_agent_trajectory_hits_are_its_context() -> None:
    t = Trajectory.from_rounds("a", [(100, 10), (5, 3), (7, 2)])
    assert t.is_agent and len(t) == 3
    assert t.hits() == (0, 110, 118)
    assert [turn.prompt for turn in t.turns()] == [100, 115, 125]
    assert t.total_tokens == 127 and t.max_tokens == 127


def test_explicit_turns_keep_prompt_hit_and_arrival() -> None:
    t = Trajectory.from_turns("r", [(1000, 512, 7), (1200, 1100, 1)], arrival_s=[0.5, 2.0])
    assert not t.is_agent
    assert [(x.prompt, x.hit, x.append, x.gen, x.arrival_s) for x in t.turns()] == [
        (1000, 512, 488, 7, 0.5),
        (1200, 1100, 100, 1, 2.0),
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"append": (), "gen": ()}, "at least one turn"),
        ({"append": (1, 2), "gen": (1,)}, "2 append values but 1 gen"),
        ({"append": (0,), "gen": (1,)}, "append tokens must be integers >= 1"),
        ({"append": (1,), "gen": (0,)}, "gen tokens must be integers >= 1"),
        ({"append": (1,), "gen": (1,), "hit": (-1,)}, "hit tokens must be integers >= 0"),
        ({"append": (1,), "gen": (1,), "arrival_s": (0.0,)}, "need explicit turns"),
        ({"append": (1, 1), "gen": (1, 1), "hit": (0, 0), "arrival_s": (2.0, 1.0)}, "must not decrease"),
    ],
)
def test_trajectory_refuses_inconsistent_columns(kwargs: dict[str, tuple[int, ...]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Trajectory("x", **kwargs)


def test_truncated_keeps_the_rounds_that_fit() -> None:
    t = Trajectory.from_rounds("a", [(100, 10), (50, 10), (50, 10)])
    assert truncated(t, 170).append == (100, 50)
    assert truncated(t, 229).append == (100, 50)
    assert truncated(t, 230) is t
    with pytest.raises(ValueError, match="first turn does not fit"):
        truncated(t, 109)


# ------------------------------------------------------------------------------------------ file format

_counts = st.integers(min_value=1, max_value=100_000)


@st.composite
def trajectories(draw: st.DrawFn, ident: str) -> Trajectory:
    n = draw(st.integers(min_value=1, max_value=8))
    if draw(st.booleans()):
        return Trajectory(
            ident,
            tuple(draw(st.lists(_counts, min_size=n, max_size=n))),
            tuple(draw(st.lists(_counts, min_size=n, max_size=n))),
        )
    turns = []
    for _ in range(n):
        prompt = draw(_counts)
        turns.append((prompt, draw(st.integers(min_value=0, max_value=prompt - 1)), draw(_counts)))
    arrivals = None
    if draw(st.booleans()):
        times = draw(st.lists(st.floats(min_value=0, max_value=1e7, allow_nan=False), min_size=n, max_size=n))
        arrivals = sorted(times)
    return Trajectory.from_turns(ident, turns, arrivals)


@st.composite
def trajectory_lists(draw: st.DrawFn) -> list[Trajectory]:
    ids = draw(st.lists(st.text(min_size=1, max_size=12), min_size=0, max_size=6, unique=True))
    return [draw(trajectories(i)) for i in ids]


_meta = st.dictionaries(
    st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.none()), max_size=4
)


@given(trajectory_lists(), _meta)
def test_file_round_trip(
    tmp_path_factory: pytest.TempPathFactory, items: list[Trajectory], meta: dict[str, object]
) -> None:
    path = tmp_path_factory.mktemp("rt") / "t.jsonl"
    write_trajectories(path, items, meta)
    read = read_trajectories(path)
    assert list(read.trajectories) == items
    assert dict(read.meta) == meta


def test_writer_refuses_duplicate_ids(tmp_path: Path) -> None:
    t = Trajectory.from_rounds("a", [(1, 1)])
    with pytest.raises(ValueError, match="duplicate"):
        write_trajectories(tmp_path / "t.jsonl", [t, t])


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([HEADER, '{"id": "a", "rounds": [[1, 1]]}', '{"id": "b", "rounds": [[1, 1]'], r":3: not valid JSON"),
        ([HEADER, '{"rounds": [[1, 1]]}'], r":2: missing key 'id'"),
        ([HEADER, '{"id": "a"}'], r":2: missing key 'rounds' .* or 'turns'"),
        (
            [HEADER, '{"id": "a", "rounds": [[1, 1], [-5, 1]]}'],
            r":2: 'rounds\[1\]\[0\]' \(append tokens\): expected an integer >= 1, got -5",
        ),
        (
            [HEADER, '{"id": "a", "rounds": [[1, 0]]}'],
            r":2: 'rounds\[0\]\[1\]' \(gen tokens\): expected an integer >= 1, got 0",
        ),
        ([HEADER, '{"id": "a", "rounds": [[1, true]]}'], r":2: .* expected an integer >= 1, got true"),
        (
            [HEADER, '{"id": "a", "rounds": [[1, 2, 3]]}'],
            r":2: 'rounds\[0\]': expected \[append, gen\], got a list of 3",
        ),
        ([HEADER, '{"id": "a", "rounds": []}'], r":2: 'rounds': expected a non-empty list"),
        ([HEADER, '{"id": "a", "turns": [[10, 10, 1]]}'], r":2: 'turns\[0\]': expected hit <= prompt - 1"),
        (
            [HEADER, '{"id": "a", "turns": [[10, 1, 1, 0.5], [10, 1, 1]]}'],
            r":2: 'turns': either every turn has arrival_s or none",
        ),
        ([HEADER, '{"id": "a", "turns": [[10, 1, 1, 2], [10, 1, 1, 1]]}'], r":2: .*arrivals that do not decrease"),
        (
            [HEADER, '{"id": "a", "turns": [[10, -1, 1]]}'],
            r":2: 'turns\[0\]\[1\]' \(hit tokens\): expected an integer >= 0, got -1",
        ),
        ([HEADER, '{"id": "a", "rounds": [[1, 1]], "colour": 1}'], r":2: unknown key 'colour'"),
        ([HEADER, '{"id": "a", "rounds": [[1, 1]], "turns": [[2, 1, 1]]}'], r":2: expected either 'rounds'"),
        (
            [HEADER, '{"id": "a", "rounds": [[1, 1]]}', "", '{"id": "a", "rounds": [[1, 1]]}'],
            r":4: duplicate id 'a' \(first on line 2\)",
        ),
        ([HEADER, "[1, 2]"], r":2: expected a JSON object, got a list of 2"),
        (
            ['{"format": "dualpath-emu-trajectories", "version": 3}'],
            r":1: unsupported format version 3: this reader knows versions 1 and 2",
        ),
        (['{"format": "dualpath-emu-trajectories"}'], r":1: unsupported format version null"),
        (['{"format": "something-else", "version": 1}'], r":1: not a dualpath-emu trajectory file"),
        (
            ['{"format": "dualpath-emu-trajectories", "version": 1, "extra": 1}'],
            r":1: unknown key 'extra' in the header",
        ),
        (
            [
                '{"format": "dualpath-emu-trajectories", "version": 1, "trajectories": 2}',
                '{"id": "a", "rounds": [[1, 1]]}',
            ],
            r"header says 2 trajectories, the file has 1",
        ),
        ([], r"empty file"),
    ],
)
def test_malformed_lines_are_reported_with_their_number(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    with pytest.raises(TraceError, match=message) as caught:
        read_trajectories(path)
    assert str(caught.value).startswith(str(path))
    assert isinstance(caught.value, UsageError)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        read_trajectories(tmp_path / "missing.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(HEADER.encode() + b"\n\xff\xfe\n")
    with pytest.raises(TraceError, match=r":2: not UTF-8 text"):
        read_trajectories(tmp_path / "latin1.jsonl")


# ------------------------------------------------------------------------------------------ generator


def test_generator_is_deterministic_by_seed() -> None:
    a = generate("32k", seed=7)
    assert generate("32k", seed=7) == a
    assert generate("32k", seed=8) != a
    assert generate("48k", seed=7) != a
    assert len(a) == 500 and len({t.id for t in a}) == 500


@pytest.mark.processes
def test_generated_file_does_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    outputs = []
    for hash_seed in ("0", "1"):
        out = tmp_path / f"h{hash_seed}.jsonl"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "dualpath_emu.cli",
                "trace",
                "gen",
                "--dataset",
                "48k",
                "--agents",
                "520",
                "--out",
                str(out),
            ],
            check=True,
            capture_output=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("name", list(DATASETS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generated_datasets_match_table_2(name: str, seed: int) -> None:
    dataset = DATASETS[name]
    paper = dataset.paper
    s = dataset_stats(generate(name, seed=seed))
    assert s.trajectories == 500
    assert s.turns == pytest.approx(paper.turns, rel=0.01)
    assert s.total == pytest.approx(paper.total, rel=0.01)
    assert s.append == pytest.approx(paper.append, rel=0.05)
    assert s.gen == pytest.approx(paper.gen, rel=0.05)
    assert s.context == pytest.approx(paper.context, rel=0.05)
    # The hit rate as the paper derives it from the columns (98.7 % for 64K).
    assert s.hit_rate == pytest.approx(paper.context / (paper.context + paper.append), abs=0.002)
    # Per request, appends are shorter in this reading: more of each prompt is a hit.
    assert s.append_per_turn < 0.8 * paper.append
    assert s.hit_fraction > s.hit_rate


@pytest.mark.parametrize("name", list(DATASETS))
def test_per_turn_reading_matches_append_and_gen_per_request(name: str) -> None:
    paper = DATASETS[name].paper
    s = dataset_stats(generate(name, seed=0, params=GeneratorParams(reading="per-turn")))
    assert s.turns == pytest.approx(paper.total / (paper.append + paper.gen), rel=0.01)
    assert s.append_per_turn == pytest.approx(paper.append, rel=0.01)
    assert s.gen_per_turn == pytest.approx(paper.gen, rel=0.01)
    assert s.total == pytest.approx(paper.total, rel=0.01)
    assert s.context == pytest.approx(paper.context, rel=0.05)
    assert s.hit_fraction == pytest.approx(paper.context / (paper.context + paper.append), abs=0.002)


@pytest.mark.parametrize("name", list(DATASETS))
def test_no_turn_exceeds_max_len(name: str) -> None:
    max_len = DATASETS[name].max_len
    agents = generate(name, agents=700, seed=3, params=GeneratorParams(first_append=2_000))
    assert max(t.max_tokens for t in agents) <= max_len
    assert max(t.total_tokens for t in agents) <= max_len
    # Many trajectories end close to MaxLen (the agent ran out of context).
    assert sum(t.total_tokens > 0.95 * max_len for t in agents[:500]) > 200


def test_extra_agents_copy_a_base_trajectory_after_a_synthetic_first_round() -> None:
    base = generate("64k", seed=5)
    agents = generate("64k", agents=540, seed=5)
    assert agents[:500] == base  # the base set does not depend on the agent count
    by_rounds = {(t.append, t.gen) for t in base}
    for extra in agents[500:]:
        assert (extra.append[0], extra.gen[0]) == (1, 1)
        rest = (extra.append[1:], extra.gen[1:])
        # A copy, possibly with its last round cut (the 2 synthetic tokens must still fit in MaxLen).
        assert any(rest == (a[: len(rest[0])], g[: len(rest[0])]) for a, g in by_rounds)
        assert extra.hits()[1] == 2  # the copied first round now reuses the synthetic prefix
    assert len({t.id for t in agents}) == 540
    assert len({t.append[1:] for t in agents[500:]}) > 1  # drawn, not one trajectory repeated
    fewer = generate("64k", agents=12, seed=5)
    assert fewer == base[:12]


def test_extra_agents_are_truncated_at_max_len() -> None:
    params = GeneratorParams(first_append=3_000)
    agents = generate("32k", agents=800, seed=0, params=params)
    base = {t.id: t for t in agents[:500]}
    cut = 0
    for extra in agents[500:]:
        assert extra.max_tokens <= 32 * 1024
        copies = [
            b
            for b in base.values()
            if b.append[: len(extra) - 1] == extra.append[1:] and b.gen[: len(extra) - 1] == extra.gen[1:]
        ]
        assert copies
        cut += all(len(b) > len(extra) - 1 for b in copies)
    assert cut > 0


def test_scaled_appends_are_retruncated() -> None:
    t = max(generate_base(DATASETS["64k"], seed=0, params=GeneratorParams(n_base=20)), key=lambda t: t.total_tokens)
    doubled = scaled(t, append_factor=2.0, max_len=64 * 1024)
    assert doubled.max_tokens <= 64 * 1024
    assert len(doubled) < len(t)
    assert doubled.append == tuple(2 * a for a in t.append[: len(doubled)])


def test_scaling_clips_a_first_round_that_no_longer_fits() -> None:
    from dualpath_emu.workload.trajectory import Trajectory

    t = Trajectory("big-first", (30_000, 500), (2_000, 100))
    tripled = scaled(t, append_factor=3.0, max_len=64 * 1024)
    assert len(tripled) == 1  # the first turn, clipped to fit; the second no longer fits after it
    assert tripled.append[0] + tripled.gen[0] == 64 * 1024
    assert tripled.gen[0] == 2_000


def test_generator_refuses_bad_parameters() -> None:
    with pytest.raises(ValueError, match="dataset"):
        generate("16k")
    with pytest.raises(ValueError, match="agents"):
        generate("32k", agents=0)
    with pytest.raises(ValueError, match="reading"):
        GeneratorParams(reading="sideways")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ Mooncake


def _mooncake_line(timestamp: float, input_length: int, hash_ids: list[int], output_length: int = 5) -> str:
    record = {
        "timestamp": timestamp,
        "input_length": input_length,
        "output_length": output_length,
        "hash_ids": hash_ids,
    }
    return json.dumps(record) + "\n"


def test_mooncake_hits_are_the_stored_prefix_run(tmp_path: Path) -> None:
    path = tmp_path / "mc.jsonl"
    path.write_text(
        _mooncake_line(0, 1500, [0, 1, 2])  # nothing stored yet: hit 0
        + _mooncake_line(0, 2000, [0, 1, 3, 4])  # blocks 0, 1 stored: 1,024
        + _mooncake_line(250, 1536, [0, 1, 2])  # all 3 stored: 1,536 capped at 1,535
        + _mooncake_line(1000, 1000, [5, 1])  # block 1 stored but not the first: a prefix run of 0
        + _mooncake_line(1500, 600, [5, 6])  # block 5 now stored: 512
    )
    requests = read_mooncake(path, sessions=False)
    assert [r.hit for r in requests] == [(0,), (1024,), (1535,), (0,), (512,)]
    assert [r.append for r in requests] == [(1500,), (976,), (1,), (1000,), (88,)]
    assert [r.arrival_s for r in requests] == [(0.0,), (0.0,), (0.25,), (1.0,), (1.5,)]
    assert requests[0].gen == (5,) and requests[0].id == "req-00000"
    assert hit_tokens([7], 100, {7}) == 99


def test_mooncake_conversation_slice() -> None:
    requests = read_mooncake(DATA / "conversation_trace.jsonl", sessions=False)
    stats = trace_stats(requests)
    assert stats.trajectories == stats.turns == 300
    # Cold start: only the shared first block (a common system prompt) is reused by 299 of 300 requests.
    assert sum(r.hit[0] for r in requests if r.hit) == 345_965
    assert stats.prompt.mean * 300 == 4_269_971
    assert stats.hit_fraction == pytest.approx(345_965 / 4_269_971)  # 8.10 %
    assert sum(1 for r in requests if r.hit and r.hit[0] > 0) == 299
    assert stats.duration_s == pytest.approx(102.0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"timestamp": 0, "input_length": 10, "output_length": 1}', r":2: missing key 'hash_ids'"),
        (
            '{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1]}',
            r":2: 'hash_ids': expected ceil\(1000 / 512\) = 2 block hashes, got 1",
        ),
        (
            '{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}',
            r":2: 'input_length': expected an integer >= 1, got 0",
        ),
        (
            '{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}',
            r":2: 'timestamp': expected a finite number",
        ),
        (
            '{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}',
            r":2: 'hash_ids': expected a list of integers",
        ),
        ('{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1], "x": 1}', r":2: unknown key 'x'"),
        ('{"timestamp": 5, "input_length": 10', r":2: not valid JSON"),
    ],
)
def test_mooncake_malformed_lines(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "mc.jsonl"
    path.write_text(_mooncake_line(10, 10, [0]) + line + "\n")
    with pytest.raises(TraceError, match=message):
        read_mooncake(path)


def test_mooncake_requires_arrival_order(tmp_path: Path) -> None:
    path = tmp_path / "mc.jsonl"
    path.write_text(_mooncake_line(10, 10, [0]) + _mooncake_line(9, 10, [1]))
    with pytest.raises(TraceError, match=r":2: 'timestamp': expected arrival order"):
        read_mooncake(path)


def test_load_trace_tells_the_formats_apart(tmp_path: Path) -> None:
    assert load_trace(DATA / "synthetic_trace.jsonl").kind == "mooncake"
    path = tmp_path / "ours.jsonl"
    write_trajectories(path, generate("32k", agents=3), {"dataset": "32k"})
    loaded = load_trace(path)
    assert loaded.kind == "trajectories" and loaded.meta == {"dataset": "32k"} and len(loaded.trajectories) == 3
    (tmp_path / "other.jsonl").write_text('{"prompt": 3}\n')
    with pytest.raises(TraceError, match=r"other.jsonl:1: expected a trajectory file .* or a Mooncake trace"):
        load_trace(tmp_path / "other.jsonl")


def test_distribution_uses_nearest_rank() -> None:
    d = distribution(list(range(1, 101)))
    assert (d.count, d.mean, d.p50, d.p99, d.max) == (100, 50.5, 50, 99, 100)
    assert distribution([]).count == 0


# ------------------------------------------------------------------------------------------ CLI


def test_cli_gen_stats_and_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "64k.jsonl"
    assert cli_main(["trace", "gen", "--dataset", "64k", "--agents", "510", "--seed", "3", "--out", str(out)]) == 0
    assert "wrote 510 trajectories" in capsys.readouterr().out
    contents = read_trajectories(out)
    assert len(contents.trajectories) == 510 and contents.meta["seed"] == 3 and contents.meta["max_len"] == 65536
    assert list(contents.trajectories) == generate("64k", agents=510, seed=3)

    assert cli_main(["trace", "stats", str(out)]) == 0
    text = capsys.readouterr().out
    assert "510 trajectories" in text and "prefix-hit fraction" in text and "Table 2 columns" in text

    assert cli_main(["trace", "stats", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "trajectories" and report["stats"]["trajectories"] == 510
    assert report["table2"]["turns"] == pytest.approx(dataset_stats(contents.trajectories).turns)

    converted = tmp_path / "conv.jsonl"
    assert cli_main(["trace", "import", str(DATA / "conversation_trace.jsonl"), "--out", str(converted)]) == 0
    assert "prefix-hit fraction 8.10%" in capsys.readouterr().out
    assert read_trajectories(converted).trajectories == tuple(read_mooncake(DATA / "conversation_trace.jsonl"))

    assert cli_main(["trace", "stats", str(DATA / "conversation_trace.jsonl"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "mooncake" and report["table2"] is None
    assert math.isclose(report["stats"]["hit_fraction"], 345_965 / 4_269_971)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["trace"], "a trace command is required"),
        (["trace", "gen", "--dataset", "16k", "--out", "x"], "--dataset: expected one of 32k, 48k, 64k"),
        (
            ["trace", "gen", "--dataset", "32k", "--agents", "0", "--out", "x"],
            "--agents: expected an integer in [1, 100000]",
        ),
        (
            ["trace", "gen", "--dataset", "32k", "--base", "0", "--out", "x"],
            "n_base: expected an integer in [1, 100000]",
        ),
        (["trace", "stats"], "the following arguments are required: file"),
    ],
)
def test_cli_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.processes
def test_cli_bad_file_exits_2_with_the_line_and_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(HEADER + '\n{"id": "a", "rounds": [[1, 1]]}\n{"id": "b", "rounds": [[1, -1]]}\n')
    for command in (["stats", str(bad)], ["import", str(bad), "--out", str(tmp_path / "o.jsonl")]):
        done = subprocess.run(
            [sys.executable, "-m", "dualpath_emu.cli", "trace", *command], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert (
        f"{bad}:3: 'rounds[0][1]' (gen tokens): expected an integer >= 1, got -1"
        in subprocess.run(
            [sys.executable, "-m", "dualpath_emu.cli", "trace", "stats", str(bad)],
            capture_output=True,
            text=True,
            timeout=60,
        ).stderr
    )
