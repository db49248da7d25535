"""Users' own systems and policies: ``file.py:Name`` and ``module:Name`` in a scenario and on the command
line, the packaged example policy as the README runs it, and every way a spec can be wrong (one line, exit 2)."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dualpath_emu.cluster.catalog import MODELS
from dualpath_emu.cli import main
from dualpath_emu.cluster.run import run_system
from dualpath_emu.cluster.scenario import load_cluster_scenario
from dualpath_emu.cluster.policies import (
    DecodeAssignment, DecodeView, DualPathPolicy, EngineState, Policy, PolicyError, PrefillAssignment, PrefillView,
    Request,
)  # fmt: skip
from dualpath_emu.testing import check_prefill_call
from dualpath_emu.cluster.systems import SYSTEMS, System
from dualpath_emu.config import ScenarioError
from tests.cluster.test_run_cli import TINY as RUN_CLI_TINY
from tests.cluster.test_run_cli import TINY_TURNS

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "python" / "dualpath_emu" / "examples" / "custom_policy.py"

# test_run_cli's tiny DS 27B 1P1D scenario with a `systems` key to fill in.
TINY = RUN_CLI_TINY.replace("seed = 3\n", "seed = 3\nsystems = {systems}\n", 1)

# Every request to the prefill engine with the highest id: a policy whose effect shows in requests.csv.
LAST_PE = '''\
from dataclasses import dataclass
from typing import ClassVar

from dualpath_emu.cluster.policies import DualPathPolicy, PrefillAssignment, PrefillView
from dualpath_emu.cluster.systems import System


@dataclass
class LastPE(DualPathPolicy):
    """Every request to the last prefill engine."""

    promises: ClassVar[frozenset[str]] = frozenset({"fifo"})

    def assign_prefill(self, view: PrefillView) -> list[PrefillAssignment]:
        engine = max(e.id for e in view.engines)
        return [PrefillAssignment(request, engine) for request in view.queue]


LAST = System("last-pe", "every request to the last PE", layerwise=True, dual_path=True, scheduler=LastPE)
SYSTEMS = {"also-last": System("also-last", "the same", layerwise=True, dual_path=False, scheduler=LastPE)}
NOT_A_SYSTEM = 3
A_POLICY = LastPE()


def helper() -> None:
    pass
'''


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


# --------------------------------------------------------------------------------------------- the example


def test_the_example_runs_as_the_issue_asks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    status, stdout, stderr = run_cli(["run", "--system", "dualpath_emu.examples.custom_policy:least-loaded", "--agents", "16",
                                      "--json", "--out", str(out)])  # fmt: skip
    assert (status, stderr) == (0, "")
    summary = json.loads(stdout)
    assert list(summary["systems"]) == ["least-loaded"]
    result = summary["systems"]["least-loaded"]
    assert result["agents"] == 16 and result["turns"] > 16 and result["complete"]
    assert summary["speedup_vs_basic"] == {"least-loaded": None}
    assert json.loads((out / "summary.json").read_text()) == summary
    with open(out / "requests.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == result["turns"] and {r["system"] for r in rows} == {"least-loaded"}
    assert {r["read_side"] for r in rows} <= {"pe", "de", "none"} and all(r["pe"] != "" for r in rows)
    assert not list(out.glob("trace-*")) and (out / "jct.png").is_file(), "no trace without --trace"


def test_the_example_policy_balances_by_load_and_ignores_read_queues() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(EXAMPLE.read_text(), str(EXAMPLE), "exec"), namespace)
    policy = namespace["LeastLoadedPolicy"](alpha_tokens=10, beta_tokens=1_000)
    engines = (EngineState(0, 0, tok=500, seq=1), EngineState(1, 0), EngineState(8, 1, tok=100, seq=1))
    queue = tuple(Request(i, 300, 300, 0, 10, 1, i) for i in range(5))
    read_q = {0: 0, 1: 10**9}  # node 1's read queue is far over α: DualPath would avoid it, this policy does not
    view = PrefillView(queue, engines, read_q)
    assigned = check_prefill_call(policy, view, policy.assign_prefill(view))
    # 1 (0 -> 300), 8 (100 -> 400), 1 (300 -> 600), 8 (400 -> 700), 0 (500 -> 800): least loaded each time.
    assert [a.engine for a in assigned] == [1, 8, 1, 8, 0]
    over = PrefillView((Request(9, 1, 1, 0, 1, 1, 9),), (EngineState(0, 0, tok=1_001, seq=1),), {})  # over β
    assert policy.assign_prefill(over) == []


# --------------------------------------------------------------------------------------------- resolution


def test_a_user_policy_is_what_runs(tmp_path: Path) -> None:
    write(tmp_path, "mine.py", LAST_PE)
    scenario = load_cluster_scenario(write(tmp_path, "s.toml", TINY.format(systems='["dualpath", "mine.py:LAST"]')))
    assert scenario.systems == ("dualpath", "last-pe")
    assert [s.name for s in scenario.custom_systems] == ["last-pe"]
    work = scenario.trajectories()
    mine = run_system(scenario.config, scenario.system("last-pe"), work, seed=scenario.seed)
    theirs = run_system(scenario.config, "dualpath", work, seed=scenario.seed)
    gpus = scenario.config.node.gpus
    assert set(mine.metrics.pe) == {gpus - 1}  # 1P1D: PEs 0..7, every request on 7
    assert len(set(theirs.metrics.pe)) > 1
    assert mine.turns == theirs.turns == TINY_TURNS and mine.spec is scenario.system("last-pe")


@pytest.mark.parametrize(
    ("spec", "name", "dual_path"),
    [
        ("mine.py:LAST", "last-pe", True),  # a System attribute: its own name
        ("mine.py:also-last", "also-last", False),  # a name in SYSTEMS (a mapping here)
        ("mine.py:LastPE", "LastPE", True),  # a Policy subclass, wrapped; read_both_sides from the class
        ("sub/../mine.py:LAST", "last-pe", True),  # a relative path, from the scenario's folder
    ],
)
def test_every_form_of_a_file_spec(tmp_path: Path, spec: str, name: str, dual_path: bool) -> None:
    write(tmp_path, "mine.py", LAST_PE)
    (tmp_path / "sub").mkdir()
    scenario = load_cluster_scenario(write(tmp_path, "s.toml", TINY.format(systems=f'["{spec}"]')))
    system = scenario.system(name)
    assert scenario.systems == (name,) and system.dual_path is dual_path and system.layerwise
    assert isinstance(system.scheduler, type) and system.scheduler.__name__ == "LastPE"


def test_a_module_spec_and_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "pkg", "user_policies_for_test.py", LAST_PE)
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    scenario = load_cluster_scenario(write(tmp_path, "s.toml", TINY.format(systems='["user_policies_for_test:LAST"]')))
    assert scenario.systems == ("last-pe",)
    absolute = tmp_path / "pkg" / "user_policies_for_test.py"
    again = scenario.with_overrides(systems=["basic", f"{absolute}:also-last", "last-pe"])
    assert again.systems == ("basic", "also-last", "last-pe")  # "last-pe": the scenario's own, by name


def test_the_command_line_resolves_from_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "mine.py", LAST_PE)
    scenario = write(tmp_path, "s.toml", TINY.format(systems='["dualpath"]'))
    monkeypatch.chdir(tmp_path)
    status, stdout, stderr = run_cli(["run", str(scenario), "--json", "--system", "mine.py:LastPE"])
    assert (status, stderr) == (0, "")
    assert list(json.loads(stdout)["systems"]) == ["LastPE"]


def test_a_policy_gets_the_arguments_its_constructor_takes() -> None:
    @dataclass
    class Plain(Policy):
        def assign_prefill(self, view: PrefillView) -> list[PrefillAssignment]:
            return []

        def assign_decode(self, view: DecodeView) -> list[Any]:
            return []

    @dataclass
    class WithBeta(Plain):
        beta_tokens: int = 0

    plain = System("plain", "", layerwise=True, dual_path=True, scheduler=Plain).policy(7, 9)
    assert isinstance(plain, Plain) and plain.read_both_sides
    with_beta = System("beta", "", layerwise=True, dual_path=False, scheduler=WithBeta).policy(7, 9)
    assert isinstance(with_beta, WithBeta) and with_beta.beta_tokens == 9 and not with_beta.read_both_sides
    dual = System("dp", "", layerwise=True, dual_path=True, scheduler=DualPathPolicy).policy(7, 9)
    assert isinstance(dual, DualPathPolicy) and (dual.alpha_tokens, dual.beta_tokens) == (7, 9)
    first = System("dp", "", layerwise=True, dual_path=True, scheduler=DualPathPolicy)
    assert first.policy(1, 2) is not first.policy(1, 2)  # a fresh policy per run


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"name": "a/b"}, "System.name: expected 1-64 letters, digits and _.+- (not first), got 'a/b'"),
        ({"name": ""}, "System.name: expected 1-64 letters, digits and _.+- (not first), got ''"),
        ({"name": "x" * 65}, f"System.name: expected 1-64 letters, digits and _.+- (not first), got '{'x' * 65}'"),
        ({"scheduler": "fifo"}, "System 'x': scheduler: expected 'dualpath', 'round_robin', 'dualpath_affinity', 'dualpath_split' or a Policy subclass, "
                                "got 'fifo'"),
        ({"scheduler": Policy}, "System 'x': scheduler Policy is abstract (define assign_decode, assign_prefill)"),
    ],
)  # fmt: skip
def test_a_bad_system_is_refused(arguments: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"name": "x", "description": "", "layerwise": True, "dual_path": True,
                              "scheduler": "dualpath", **arguments}  # fmt: skip
    with pytest.raises(ValueError) as error:
        System(**fields)
    assert str(error.value) == message


# --------------------------------------------------------------------------------------------- bad specs


BAD_SPECS = [
    ("nowhere.py:X", "no such file {folder}/nowhere.py"),
    ("mine.py:nope", "{folder}/mine.py has no attribute 'nope' and no system of that name in its SYSTEMS "
                     "(it has: also-last)"),
    ("mine.py:NOT_A_SYSTEM", "expected a System, a Policy subclass, or the name of a system in the module's "
                             "SYSTEMS, got a int"),
    ("mine.py:helper", "expected a System, a Policy subclass, or the name of a system in the module's SYSTEMS, "
                       "got the function helper"),
    ("mine.py:A_POLICY", "expected a System, a Policy subclass, or the name of a system in the module's SYSTEMS, "
                         "got an instance of LastPE (give the class: every run makes its own policy, policies "
                         "keep state)"),
    ("mine.py:", "expected module:Name or path/to/file.py:Name"),
    ("no_such_module_here:X", "no module named 'no_such_module_here' (a file in this folder: give its path, "
                              "no_such_module_here.py:Name)"),
    ("some/dir:X", "expected a .py file or a dotted module name before the colon"),
    ("broken.py:X", "running {folder}/broken.py raised SyntaxError: invalid syntax (at {folder}/broken.py:2)"),
    ("raises.py:X", "running {folder}/raises.py raised RuntimeError: no GPU here (at {folder}/raises.py:3)"),
    ("plain.py:X", "{folder}/plain.py has no attribute 'X' and no SYSTEMS"),
    ("clash.py:SHADOW", "the system is called 'basic', a built-in system's name: give it another"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "message"), BAD_SPECS, ids=[s for s, _ in BAD_SPECS])
def test_a_bad_spec_is_one_line_naming_file_key_and_spec(tmp_path: Path, spec: str, message: str) -> None:
    write(tmp_path, "mine.py", LAST_PE)
    write(tmp_path, "broken.py", "x = 1\ndef (:\n")
    write(tmp_path, "raises.py", "import sys\n\nraise RuntimeError('no GPU here')\n")
    write(tmp_path, "plain.py", "y = 2\n")
    write(tmp_path, "clash.py", "from dualpath_emu.cluster.systems import System\n"
                                "SHADOW = System('basic', '', layerwise=True, dual_path=True, scheduler='dualpath')\n")  # fmt: skip
    path = write(tmp_path, "s.toml", TINY.format(systems=f'["{spec}"]'))
    status, stdout, stderr = run_cli(["validate", str(path)])
    expected = message.format(folder=tmp_path.resolve())
    assert (status, stdout) == (2, "")
    assert stderr == f"dualpath-emu: error: {path}: key 'systems': {spec!r}: {expected}\n"


def test_a_system_twice_and_a_bad_spec_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "mine.py", LAST_PE)
    path = write(tmp_path, "s.toml", TINY.format(systems='["mine.py:LAST", "mine.py:LAST"]'))
    with pytest.raises(ScenarioError) as error:
        load_cluster_scenario(path)
    assert str(error.value) == (
        f"{path}: key 'systems': 'mine.py:LAST': expected each system once: 'last-pe' is already in the list"
    )
    monkeypatch.chdir(tmp_path)
    status, stdout, stderr = run_cli(
        ["run", str(write(tmp_path, "ok.toml", TINY.format(systems='["basic"]'))), "--system", "missing.py:X"]
    )
    assert (status, stdout) == (2, "")
    assert stderr == f"dualpath-emu: error: --system: 'missing.py:X': no such file {tmp_path.resolve()}/missing.py\n"


def test_the_built_in_systems_are_unchanged() -> None:
    assert list(SYSTEMS) == [
        "basic",
        "basic+layerwise",
        "basic+layerwise+dualpath",
        "dualpath",
        "oracle",
        "sglmc",
        "dualpath+retention",
        "dualpath-split",
    ]
    with pytest.raises(TypeError):
        SYSTEMS["mine"] = SYSTEMS["basic"]  # type: ignore[index]


def test_a_file_is_loaded_afresh_for_every_scenario(tmp_path: Path) -> None:
    module = write(tmp_path, "mine.py", LAST_PE)
    path = write(tmp_path, "s.toml", TINY.format(systems='["mine.py:LAST"]'))
    first = load_cluster_scenario(path).system("last-pe")
    module.write_text(LAST_PE.replace('"every request to the last PE"', '"edited"'), encoding="utf-8")
    second = load_cluster_scenario(path).system("last-pe")
    assert (first.description, second.description) == ("every request to the last PE", "edited")


def test_the_example_file_explains_itself() -> None:
    text = textwrap.dedent(EXAMPLE.read_text())
    assert "dualpath-emu check dualpath_emu.examples.custom_policy:least-loaded" in text


# --- a policy that answers wrong, or never -------------------------------------------------------------------


@dataclass
class _ReturnsNone(DualPathPolicy):
    def assign_prefill(self, view: PrefillView) -> Any:
        return None


@dataclass
class _NotWaiting(DualPathPolicy):
    def assign_prefill(self, view: PrefillView) -> Any:
        return [PrefillAssignment(Request(10**6, 2, 1, 1, 1, 1, 0), view.engines[0].id)] if view.queue else []


@dataclass
class _NoSuchEngine(DualPathPolicy):
    def assign_prefill(self, view: PrefillView) -> Any:
        return [PrefillAssignment(view.queue[0], 999)] if view.queue else []


@dataclass
class _OtherGroupsEngine(DualPathPolicy):
    def assign_decode(self, view: DecodeView) -> Any:
        return [DecodeAssignment(view.queue[0], view.engines[0].id + 1000)] if view.queue else []


@dataclass
class _NeverAssigns(DualPathPolicy):
    def assign_prefill(self, view: PrefillView) -> Any:
        return []


def _small_work() -> tuple[Any, list[Any]]:
    from dualpath_emu.cluster.config import ClusterConfig
    from dualpath_emu.workload.generator import generate

    config = ClusterConfig(
        model=MODELS["ds27b"], pe_nodes=1, de_nodes=1, prefill_ep_nodes=1, decode_ep_nodes=1, agents=3
    )
    return config, [dataclasses.replace(t, append=t.append[:2], gen=t.gen[:2]) for t in generate("32k", 3, seed=1)]


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (_ReturnsNone, r"policy _ReturnsNone\.assign_prefill returned None; expected a list of PrefillAssignment"),
        (_NotWaiting, r"_NotWaiting\.assign_prefill assigned request 1000000, which was not waiting in the queue"),
        (_NoSuchEngine, r"_NoSuchEngine\.assign_prefill assigned request 0 to engine 999, not one that is up"),
        (_OtherGroupsEngine, r"_OtherGroupsEngine\.assign_decode assigned request \d+ to engine 10\d\d"),
        (_NeverAssigns, r"system 'bad': policy _NeverAssigns left 3 request\(s\) waiting for a prefill engine"),
    ],
)
def test_a_policy_that_answers_wrong_or_never_is_named_with_what_it_did(policy: type[Policy], message: str) -> None:
    config, work = _small_work()
    bad = System("bad", "a policy that misbehaves", layerwise=True, dual_path=True, scheduler=policy)
    with pytest.raises(PolicyError, match=message):
        run_system(config, bad, work)


def test_the_command_line_reports_a_stuck_policy_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "stuck.py"
    path.write_text(
        textwrap.dedent("""\
        from dataclasses import dataclass
        from dualpath_emu.cluster.policies import DualPathPolicy

        @dataclass
        class Stuck(DualPathPolicy):
            def assign_prefill(self, view):
                return []
        """)
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(["run", "ds27b-1p1d-offline", "--agents", "2", "--set", "workload.max_rounds=2",
                       "--system", f"{path}:Stuck"])  # fmt: skip
    assert status == 2
    text = err.getvalue()
    assert "policy Stuck left 2 request(s) waiting" in text and "Traceback" not in text


def test_every_system_has_one_colour_in_every_plot_and_users_systems_differ() -> None:
    from dualpath_emu.cluster.systems import SYSTEM_COLORS, system_colours
    from dualpath_emu.reproduce.plots import SYSTEM_COLORS as PLOTS_COLORS

    assert PLOTS_COLORS is SYSTEM_COLORS, "run --out, sweep and reproduce draw from the one table"
    names = ["basic", "dualpath", "oracle", "mine", "theirs", "least-loaded"]
    colours = system_colours(names)
    assert {n: colours[n] for n in ("basic", "dualpath", "oracle")} == {
        n: SYSTEM_COLORS[n] for n in ("basic", "dualpath", "oracle")
    }
    assert len(set(colours.values())) == len(names), "users' systems are told apart"
    assert system_colours(["mine"]) == system_colours(["mine"])
