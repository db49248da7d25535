"""Agentic workloads (issue 25): tool waits between an agent's turns (from its trajectory or the scenario's
distribution), workloads built in Python, and a packaged scenario switched to a trace with ``--set``."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from pathlib import Path

import pytest

from dualpath_emu.cluster.catalog import GPUS, MODELS
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.live import config_from_wire, config_to_wire
from dualpath_emu.cluster.run import run_system
from dualpath_emu.cluster.scenario import load_cluster_scenario
from dualpath_emu.config import ScenarioError
from dualpath_emu import api
from dualpath_emu.errors import InvalidArgumentError, UsageError
from dualpath_emu.workload.generator import generate
from dualpath_emu.workload.mooncake import read_mooncake, session_count
from dualpath_emu.workload.trajectory import TraceError, Trajectory, read_trajectories, write_trajectories
from dualpath_emu.workload.waits import ToolWait, WaitDraws, read_wait_samples

NS = 1_000_000_000
CONFIG = ClusterConfig(model=MODELS["ds27b"], gpu=GPUS["h800"], pe_nodes=1, de_nodes=1, prefill_ep_nodes=1, decode_ep_nodes=1,
                       dataset="32k", agents=6, dram_buffer_bytes=80_000_000_000)  # fmt: skip


def work(agents: int = 6, rounds: int = 4) -> list[Trajectory]:
    return [
        dataclasses.replace(t, append=t.append[:rounds], gen=t.gen[:rounds]) for t in generate("32k", agents, seed=3)
    ]


def turns_by_agent(result_metrics: object) -> dict[int, list[tuple[int, int]]]:
    """Each agent's turns as (arrive_ns, done_ns), in order."""
    m = result_metrics
    out: dict[int, list[tuple[int, int]]] = {}
    for rid in range(len(m.arrive_ns)):  # type: ignore[attr-defined]
        out.setdefault(m.agent[rid], []).append((m.arrive_ns[rid], m.done_ns[rid]))  # type: ignore[attr-defined]
    return out


def test_a_constant_wait_separates_every_turn_from_the_previous_ones_end_exactly() -> None:
    config = dataclasses.replace(CONFIG, tool_wait=ToolWait("constant", 2.5))
    result = run_system(config, "dualpath", work())
    for agent, turns in turns_by_agent(result.metrics).items():
        assert turns[0][0] == 0, "an agent's first turn has no wait (offline: it starts at once)"
        for (_, done), (arrive, _) in zip(turns, turns[1:]):
            assert arrive - done == round(2.5 * NS), agent


def test_without_waits_nothing_changes_and_waits_lengthen_the_run_not_the_ttft() -> None:
    trajectories = work()
    plain = run_system(CONFIG, "dualpath", trajectories)
    zero = run_system(dataclasses.replace(CONFIG, tool_wait=ToolWait("lognormal", 0.0)), "dualpath", trajectories)
    assert zero.event_log_sha256 == plain.event_log_sha256, "a distribution that never waits sets no timer"
    waiting = run_system(dataclasses.replace(CONFIG, tool_wait=ToolWait("exponential", 20.0)), "dualpath", trajectories)
    assert waiting.turns == plain.turns and waiting.complete
    assert waiting.jct_s > plain.jct_s + 20.0
    assert waiting.working_set_bytes["mean"] > plain.working_set_bytes["mean"], "contexts stay alive while agents wait"
    again = run_system(dataclasses.replace(CONFIG, tool_wait=ToolWait("exponential", 20.0)), "dualpath", trajectories)
    assert again.event_log_sha256 == waiting.event_log_sha256, "waits come from the seed"


def test_a_trajectorys_own_waits_win_over_the_scenarios_and_delay_its_first_turn_too() -> None:
    plain = work(agents=2, rounds=3)
    own = Trajectory.from_rounds("own", zip(plain[0].append, plain[0].gen), wait_s=[1.0, 0.0, 4.0])
    config = dataclasses.replace(CONFIG, agents=2, tool_wait=ToolWait("constant", 7.0))
    result = run_system(config, "dualpath", [own, plain[1]])
    turns = turns_by_agent(result.metrics)
    assert turns[0][0][0] == 1 * NS
    assert turns[0][1][0] == turns[0][0][1]  # 0 s: at once
    assert turns[0][2][0] - turns[0][1][1] == 4 * NS
    assert [b[0] - a[1] for a, b in zip(turns[1], turns[1][1:])] == [7 * NS, 7 * NS]


DISTS = [
    ToolWait("constant", 3.0),
    ToolWait("exponential", 3.0),
    ToolWait("lognormal", 3.0, 1.0),
    ToolWait("empirical", samples=(0.2, 1.0, 2.0, 6.0)),
]


def waits_by_agent(result_metrics: object) -> dict[int, list[int]]:
    """Each agent's waits (ns): a turn's arrival minus the end of the agent's turn before it."""
    return {agent: [arrive - done for (_, done), (arrive, _) in zip(turns, turns[1:])]
            for agent, turns in turns_by_agent(result_metrics).items()}  # fmt: skip


@pytest.mark.parametrize("wait", DISTS, ids=lambda w: w.dist)
def test_every_system_gives_each_agent_the_same_waits(wait: ToolWait) -> None:
    # Common random numbers: an agent's wait is one of (seed, agent, turn), not of the order turns end in,
    # which differs between systems (Basic and DualPath end these agents' turns in different orders).
    config, trajectories = dataclasses.replace(CONFIG, agents=24, tool_wait=wait), work(agents=24, rounds=4)
    results = {system: run_system(config, system, trajectories, seed=5) for system in ("basic", "dualpath", "oracle")}
    ends = {s: [r.metrics.agent[rid] for rid in sorted(range(len(r.metrics.done_ns)), key=r.metrics.done_ns.__getitem__)]
            for s, r in results.items()}  # fmt: skip
    assert ends["basic"] != ends["dualpath"], "the agents' turns end in different orders (else this tests nothing)"
    waits = {system: waits_by_agent(r.metrics) for system, r in results.items()}
    assert waits["basic"] == waits["dualpath"] == waits["oracle"]
    draws = WaitDraws(wait, 5)  # what the client draws, in a live run's process as here
    assert waits["basic"] == {a: [round(draws(a, turn) * NS) for turn in range(1, 4)] for a in range(24)}
    if wait.dist != "constant":
        assert len({tuple(w) for w in waits["basic"].values()}) > 5, "random: the agents' waits differ"


def test_the_waits_depend_on_the_seed_agent_and_turn_alone() -> None:
    wait = ToolWait("lognormal", 5.0, 1.0)
    one, again, other = WaitDraws(wait, 1), WaitDraws(wait, 1), WaitDraws(wait, 2)
    order = [(a, t) for a in range(50) for t in range(1, 20)]
    forward = {key: one(*key) for key in order}
    assert {key: again(*key) for key in reversed(order)} == forward, "not of what was drawn before"
    assert sum(other(*key) == w for key, w in forward.items()) == 0, "another seed, other waits"
    assert len(set(forward.values())) == len(order)
    # Fixed functions of bytes (BLAKE2b keyed with SHA-256): these numbers in every process and under every
    # PYTHONHASHSEED; a change here changes every run with random waits.
    assert one.words(0, 1) == (8886454772613962987, 3649892652770104053)
    assert WaitDraws(ToolWait("exponential", 1.0), 1).words(0, 1) == one.words(0, 1), "the key is the seed's"
    assert [one(0, 1), one(0, 2)] == pytest.approx([4.474211282876092, 3.113765397945424], rel=1e-12)


@pytest.mark.parametrize("wait", DISTS + [ToolWait("lognormal", 5.0, 2.0), ToolWait("lognormal", 30.0, 0.5)],
                         ids=lambda w: f"{w.dist}-{w.mean_s:g}-{w.sigma:g}")  # fmt: skip
def test_each_distribution_has_its_mean_and_spread(wait: ToolWait) -> None:
    draws_of = WaitDraws(wait, 1)
    draws = [draws_of(agent, turn) for agent in range(2_000) for turn in range(1, 21)]
    assert min(draws) >= 0.0
    if wait.dist == "lognormal":  # the log of a lognormal draw is normal: check its mean and sigma, tightly
        logs = [math.log(d) for d in draws]
        assert statistics.fmean(logs) == pytest.approx(math.log(wait.mean_s) - wait.sigma**2 / 2, abs=0.03 * wait.sigma)
        assert statistics.stdev(logs) == pytest.approx(wait.sigma, rel=0.02)
    rel = 0.1 if wait.sigma == 2.0 and wait.dist == "lognormal" else 0.03  # sigma 2: a heavy tail, a noisy mean
    assert statistics.fmean(draws) == pytest.approx(wait.mean, rel=rel)
    if wait.dist == "exponential":
        assert statistics.stdev(draws) == pytest.approx(wait.mean_s, rel=0.03)
    if wait.dist == "empirical":
        counts = [draws.count(s) for s in wait.samples]
        assert all(abs(c / len(draws) - 1 / len(counts)) < 0.01 for c in counts)


def test_a_wait_draw_is_cheap() -> None:
    draws = WaitDraws(ToolWait("lognormal", 5.0, 1.0), 7)  # the dearest: a hash, two logs, a cos, an exp
    times = []
    for _ in range(3):  # the best of three: the machine may be busy
        start = time.perf_counter()
        for turn in range(1, 10_001):
            draws(3, turn)
        times.append((time.perf_counter() - start) / 10_000)
    # ~2 µs on an idle core; a turn's whole CPU budget is ~200 µs
    assert min(times) < 25e-6, f"{min(times) * 1e6:.1f} µs a draw"


def test_bad_distributions_are_refused() -> None:
    with pytest.raises(ValueError, match="dist must be one of"):
        ToolWait("gamma", 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mean_s"):
        ToolWait("constant", -1.0)
    with pytest.raises(ValueError, match="at least one sample"):
        ToolWait("empirical")


def test_waits_survive_the_wire_of_a_live_run() -> None:
    config = dataclasses.replace(CONFIG, tool_wait=ToolWait("empirical", samples=(0.5, 2.0)))
    assert config_from_wire(json.loads(json.dumps(config_to_wire(config)))) == config


# --- the scenario's keys -----------------------------------------------------------------------------------


def scenario(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(f'kind = "cluster"\n\n[workload]\nagents = 4\n\n[workload.tool_wait]\n{table}\n')
    return path


def test_the_scenario_sets_the_distribution(tmp_path: Path) -> None:
    (tmp_path / "waits.txt").write_text("# measured\n1.5\n\n3  # a slow one\n")
    s = load_cluster_scenario(scenario(tmp_path, 'dist = "empirical"\nfile = "waits.txt"'))
    assert s.config.tool_wait == ToolWait("empirical", samples=(1.5, 3.0))
    assert "empirical tool waits" in s.workload()
    s = load_cluster_scenario(scenario(tmp_path, 'dist = "lognormal"\nmean_s = 5\nsigma = 0.5'))
    assert s.config.tool_wait == ToolWait("lognormal", 5.0, 0.5)
    assert load_cluster_scenario(scenario(tmp_path, "")).config.tool_wait == ToolWait()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('dist = "gamma"', "workload.tool_wait.dist"),
        ('dist = "lognormal"', "workload.tool_wait.mean_s"),
        ('dist = "constant"\nmean_s = -2', "workload.tool_wait.mean_s"),
        ('dist = "lognormal"\nmean_s = 1\nsigma = 9', "workload.tool_wait.sigma"),
        ('dist = "empirical"', "workload.tool_wait.file"),
        ('dist = "constant"\nmean_s = 1\nfile = "w.txt"', "workload.tool_wait.file"),
        ('dist = "empirical"\nfile = "missing.txt"', "missing.txt: no such file"),
        ('dist = "constant"\nmean_s = 1\nspeed = 2', "speed"),
    ],
)
def test_bad_keys_name_the_key(tmp_path: Path, table: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace(".", r"\.")):
        load_cluster_scenario(scenario(tmp_path, table))


def test_a_bad_samples_file_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "w.txt"
    path.write_text("1\n2\nsoon\n")
    with pytest.raises(UsageError, match=r"w\.txt:3: expected a number of seconds"):
        read_wait_samples(path)
    path.write_text("# nothing\n")
    with pytest.raises(UsageError, match="no waits"):
        read_wait_samples(path)


# --- the trajectory file -----------------------------------------------------------------------------------


def test_waits_round_trip_through_a_version_2_file_and_files_without_them_stay_version_1(tmp_path: Path) -> None:
    waiting = Trajectory.from_rounds("a", [(10, 2), (5, 3)], wait_s=[0.0, 12.5])
    plain = Trajectory.from_rounds("b", [(7, 1)])
    write_trajectories(tmp_path / "w.jsonl", [waiting, plain])
    assert json.loads((tmp_path / "w.jsonl").read_text().splitlines()[0])["version"] == 2
    assert read_trajectories(tmp_path / "w.jsonl").trajectories == (waiting, plain)
    write_trajectories(tmp_path / "p.jsonl", [plain])
    assert json.loads((tmp_path / "p.jsonl").read_text().splitlines()[0])["version"] == 1
    assert [t.wait_s for t in waiting.turns()] == [0.0, 12.5]


@pytest.mark.parametrize(
    ("version", "rounds", "message"),
    [
        (1, [[10, 2, 1.0]], r"'rounds\[0\]': expected \[append, gen\]"),
        (2, [[10, 2, 1.0], [3, 1]], "either every turn has wait_s or none does"),
        (2, [[10, 2, -1]], r"'rounds\[0\]\[2\]' \(wait_s\): expected a number of seconds"),
        (2, [[10, 2, True]], r"'rounds\[0\]\[2\]' \(wait_s\)"),
        (3, [[10, 2]], "knows versions 1 and 2"),
    ],
)
def test_bad_waits_in_a_file_name_the_line(
    tmp_path: Path, version: int, rounds: list[list[object]], message: str
) -> None:
    path = tmp_path / "t.jsonl"
    header = {"format": "dualpath-emu-trajectories", "version": version}
    path.write_text(json.dumps(header) + "\n" + json.dumps({"id": "x", "rounds": rounds}) + "\n")
    with pytest.raises(TraceError, match=message):
        read_trajectories(path)


def test_a_trajectory_checks_its_waits() -> None:
    with pytest.raises(ValueError, match="2 turns but 1 tool waits"):
        Trajectory("x", (1, 2), (1, 1), wait_s=(1.0,))
    with pytest.raises(ValueError, match="closed-loop"):
        Trajectory("x", (1,), (1,), (0,), (0.0,), (1.0,))


# --- workloads built in Python, and a trace given with --set -------------------------------------------------


def test_api_run_replays_trajectories_built_in_python() -> None:
    agents = [Trajectory.from_rounds(f"a{i}", [(2000, 300), (500, 200)], wait_s=[0.0, 5.0]) for i in range(3)]
    result = api.run("ds27b-1p1d-offline", workload=agents, systems=["dualpath"])
    r = result.results["dualpath"]
    assert (r.agents, r.turns, r.complete) == (3, 6, True)
    assert r.jct_s > 5.0
    assert result.summary["workload"]["given_in_python"] and result.summary["workload"]["dataset"] is None
    first = api.run("ds27b-1p1d-offline", workload=agents, agents=2, systems=["dualpath"])
    assert first.results["dualpath"].turns == 4


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ([], "1 to"),
        (["not one"], r"workload\[0\]: expected a Trajectory"),
        ([Trajectory.from_rounds("a", [(1, 1)]), Trajectory.from_rounds("a", [(2, 2)])], "distinct ids"),
        ([Trajectory.from_rounds("huge", [(5_000_000, 10)])], "deployment.decode_ep_nodes"),
    ],
)
def test_a_workload_that_cannot_run_is_refused_up_front(workload: list[object], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        api.run("ds27b-1p1d-offline", workload=workload, systems=["dualpath"])  # type: ignore[arg-type]


def test_set_trace_switches_a_packaged_scenario_to_a_trace_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_trajectories(tmp_path / "mine.jsonl", [Trajectory.from_rounds(f"t{i}", [(1000, 100)]) for i in range(5)])
    monkeypatch.chdir(tmp_path)
    packaged = api.load_scenario("ds27b-1p1d-offline")
    assert packaged.trace is None and packaged.config.agents != 5
    s = api.load_scenario("ds27b-1p1d-offline", overrides={"workload.trace": "mine.jsonl"})
    assert s.trace == tmp_path / "mine.jsonl" and s.config.agents == 5, "all of the trace, not the file's agents"
    s = api.load_scenario("ds27b-1p1d-offline", overrides={"workload.trace": "mine.jsonl", "workload.agents": 2})
    assert s.config.agents == 2
    back = api.load_scenario(s.source, overrides={"workload.dataset": "32k"})
    assert back.trace is None and back.config.dataset == "32k"


# --- sessions rebuilt from a Mooncake trace ---------------------------------------------------------------


def mooncake_line(t_ms: int, length: int, hashes: list[int]) -> str:
    return json.dumps({"timestamp": t_ms, "input_length": length, "output_length": 7, "hash_ids": hashes}) + "\n"


def test_a_request_that_extends_an_earlier_ones_blocks_joins_its_session(tmp_path: Path) -> None:
    path = tmp_path / "mc.jsonl"
    path.write_text(
        mooncake_line(0, 1100, [1, 2, 3])  # full blocks [1, 2]: a new session
        + mooncake_line(10, 1600, [1, 2, 4, 5])  # extends [1, 2] (1,024 of 1,600 tokens): joins it
        + mooncake_line(20, 2000, [1, 9, 10, 11])  # shares block 1 only (512 < half of 2,000): its own session
        + mooncake_line(30, 3000, [1, 2, 4, 6, 7, 8])  # extends the second's [1, 2, 4]: the first's session
        + mooncake_line(40, 900, [1, 2])  # no earlier request's full blocks are just [1]: its own session
    )
    sessions = read_mooncake(path)
    single = read_mooncake(path, sessions=False)
    assert [t.id for t in sessions] == ["req-00000", "req-00002", "req-00004"]
    assert [len(t) for t in sessions] == [3, 1, 1] and session_count(sessions) == (1, 3)
    assert sessions[0].arrival_s == (0.0, 0.01, 0.03)
    # The same requests, hits and arrival times either way: sessions only group them.
    by_time = sorted((t_s, p, h) for t in sessions for t_s, p, h in zip(t.arrival_s or (), t.append, t.hit or ()))
    assert by_time == sorted((t.arrival_s[0], t.append[0], t.hit[0]) for t in single)  # type: ignore[index]


def test_trace_import_says_how_many_sessions_it_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dualpath_emu.cli import main as cli_main

    path = tmp_path / "mc.jsonl"
    path.write_text(
        mooncake_line(0, 1100, [1, 2, 3]) + mooncake_line(10, 1600, [1, 2, 4, 5]) + mooncake_line(20, 600, [8, 9])
    )
    assert cli_main(["trace", "import", str(path), "--out", str(tmp_path / "s.jsonl")]) == 0
    assert "3 requests" in (out := capsys.readouterr().out) and "2 sessions, 1 of them multi-turn (2 requests)" in out
    assert len(read_trajectories(tmp_path / "s.jsonl").trajectories) == 2
    assert cli_main(["trace", "import", str(path), "--out", str(tmp_path / "r.jsonl"), "--no-sessions"]) == 0
    assert "one trajectory per request" in capsys.readouterr().out
    assert len(read_trajectories(tmp_path / "r.jsonl").trajectories) == 3
