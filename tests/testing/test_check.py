"""``dualpath_emu.testing`` and ``dualpath-emu check``: for each invariant a policy (or, for conservation, an emulator)
built to break it, which ``check`` catches and names; the packaged example policies (the one that passes, the one that
is subtly wrong), the scenario a failure writes and its replay; the command line's options and errors."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from dualpath_emu.cli import main
from dualpath_emu.cluster.policies import (
    DecodeAssignment, DecodeView, DualPathPolicy, PrefillAssignment, PrefillView, ReadSide, ReadView,
)  # fmt: skip
from dualpath_emu.cluster.observations import Ended
from dualpath_emu.cluster.systems import SYSTEMS, System
from dualpath_emu.testing import INVARIANTS, ClusterCase, FaultCase, Violation, run_case
from dualpath_emu.testing.check import CheckReport, check, parse_budget

REPO = Path(__file__).resolve().parents[2]


def system(cls: type, dual_path: bool = True) -> System:
    return System(cls.__name__, "", layerwise=True, dual_path=dual_path, scheduler=cls)


def broken(report: CheckReport) -> str:
    assert report.failure is not None, "check passed a policy built to fail"
    return report.failure.invariant


# --- one policy per invariant -------------------------------------------------------------------------------


@dataclass
class Lifo(DualPathPolicy):
    """Newest first, yet it promises DualPath's FIFO."""

    def assign_prefill(self, view: PrefillView) -> Sequence[PrefillAssignment]:
        engine = min(view.engines, key=lambda e: (e.tok, e.id)).id
        return [PrefillAssignment(r, engine) for r in reversed(view.queue)][:1]


@dataclass
class IgnoresBeta(DualPathPolicy):
    """Everything to the first PE, however loaded."""

    def assign_prefill(self, view: PrefillView) -> Sequence[PrefillAssignment]:
        return [PrefillAssignment(r, view.engines[0].id) for r in view.queue]


@dataclass
class AlwaysPe(DualPathPolicy):
    """Reads on the PE whatever the queues, yet it promises the shorter queue."""

    def read_side(self, view: ReadView) -> ReadSide:
        return "pe"


@dataclass
class FewestRequests(DualPathPolicy):
    """The DE with the fewest requests, ignoring the high-token mark Z."""

    def assign_decode(self, view: DecodeView) -> Sequence[DecodeAssignment]:
        free = {e.id: e.free_hbm_bytes for e in view.engines}
        seq = {e.id: e.seq for e in view.engines}
        out = []
        for r in view.queue:
            fits = [e for e in free if free[e] >= r.hbm_bytes]
            if not fits:
                break
            engine = min(fits, key=lambda e: (seq[e], e))
            free[engine] -= r.hbm_bytes
            seq[engine] += 1
            out.append(DecodeAssignment(r, engine))
        return out


@dataclass
class HoldsBack(DualPathPolicy):
    """Batches prefills: nothing until two requests wait (an idle PE then waits for a second request)."""

    promises: ClassVar[frozenset[str]] = frozenset({"fifo"})

    def assign_prefill(self, view: PrefillView) -> Sequence[PrefillAssignment]:
        return list(super().assign_prefill(view)) if len(view.queue) >= 2 else []


@dataclass
class CoinFlip(DualPathPolicy):
    """Breaks read-side ties with the process's random numbers: no two runs alike."""

    promises: ClassVar[frozenset[str]] = frozenset()

    def read_side(self, view: ReadView) -> ReadSide:
        return "de" if random.random() < 0.5 else "pe"


@dataclass
class Raises(DualPathPolicy):
    def assign_decode(self, view: DecodeView) -> Sequence[DecodeAssignment]:
        if len(view.queue) > 1:
            raise IndexError("the policy's own bug")
        return super().assign_decode(view)


@dataclass
class RemembersEngines(DualPathPolicy):
    """Sends each agent's turns to the PE of its first: wrong once that PE's group is down."""

    promises: ClassVar[frozenset[str]] = frozenset()
    _home: dict[int, int] | None = None

    def assign_prefill(self, view: PrefillView) -> Sequence[PrefillAssignment]:
        home = self._home = self._home if self._home is not None else {}
        out = []
        for r in view.queue:
            engine = home.setdefault(r.context, view.engines[r.context % len(view.engines)].id)
            out.append(PrefillAssignment(r, engine))
        return out


@pytest.mark.parametrize(
    ("policy", "invariant", "phase"),
    [
        (Lifo, "fifo", "policy"), (IgnoresBeta, "overload", "policy"), (AlwaysPe, "read_side", "policy"),
        (FewestRequests, "high_water", "policy"), (HoldsBack, "liveness", "policy"), (Raises, "no_error", "policy"),
        (CoinFlip, "determinism", "cluster"), (RemembersEngines, "contract", "cluster"),
    ],
)  # fmt: skip
def test_check_catches_a_policy_built_to_break_each_invariant(
    policy: type, invariant: str, phase: str, tmp_path: Path
) -> None:
    report = check(system(policy), policy.__name__, budget_s=None, examples=200, phases=(phase,), shrink_s=2.0,
                   beside=tmp_path)  # fmt: skip
    assert broken(report) == invariant, report.failure
    assert report.failure is not None and policy.__name__ in report.failure.message or invariant == "determinism"
    if phase == "cluster" and report.failure is not None:  # the shrunk case, written where it was told
        assert report.failure.scenario == tmp_path / f"{policy.__name__}.check-failure.toml"
        assert report.failure.scenario.is_file()


def test_the_policy_that_raised_is_named_not_the_emulator() -> None:
    report = check(system(Raises), "Raises", budget_s=None, examples=40, phases=("policy",))
    assert report.failure is not None and report.failure.message.startswith("the policy Raises raised IndexError")
    assert __file__ in report.failure.message


def test_check_catches_an_emulator_that_loses_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Conservation is the emulator's to keep, not the policy's: an emulator that ends a request twice is caught."""
    from dualpath_emu.cluster import decode

    original = decode.DecodeGroup.decoded

    def twice(self: Any, now: int, request: Any) -> None:
        original(self, now, request)
        self.out.observe(Ended(request.rid))

    monkeypatch.setattr(decode.DecodeGroup, "decoded", twice)
    case = ClusterCase(1, 1, 1, 0.1, (((100, 2),),), ((0.0,),))
    with pytest.raises(Violation) as error:
        run_case(case, SYSTEMS["dualpath"])
    assert error.value.invariant == "conservation"


def test_every_invariant_is_named_and_described() -> None:
    assert set(INVARIANTS) == {"contract", "fifo", "overload", "read_side", "high_water", "liveness", "conservation",
                               "determinism", "no_error"}  # fmt: skip
    assert all(len(text) > 30 for text in INVARIANTS.values())


# --- the built-in systems and the packaged examples ----------------------------------------------------------


@pytest.mark.parametrize("name", ["basic", "dualpath"])
def test_the_built_in_policies_pass(name: str) -> None:
    report = check(SYSTEMS[name], name, budget_s=None, examples=8)
    assert report.failure is None, report.failure
    assert report.policy_runs == 8 and report.cluster_runs == 8


def test_a_small_cluster_with_crashes_delays_and_shuffled_delivery_keeps_every_invariant() -> None:
    case = ClusterCase(2, 2, 2, 0.98, (((3000, 50), (9000, 40)), ((20000, 20),), ((5, 5), (5, 5), (5, 5))),
                       ((0.0, 0.5), (0.05,), (0.0, 0.0, 2.0)),
                       (FaultCase("crash", "de3", 0.2, 0.2), FaultCase("down", "n0.snic", 0.05, 0.5)), 1, 77, 0.002)  # fmt: skip
    for name in ("basic", "dualpath"):
        result = run_case(case, SYSTEMS[name])
        assert result.turns_done == case.requests


def test_the_broken_example_fails_shrunk_and_replays(capsys: pytest.CaptureFixture[str]) -> None:
    spec = "dualpath_emu.examples.broken_policy:most-free-hbm"
    # (Which chunk of the search fails first depends on the modules loaded, whose constants Hypothesis draws
    # from: 500 examples fail surely, and the search stops at the first chunk that fails.)
    assert main(["check", spec, "--examples", "500", "--phase", "policy"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: invariant 'contract'" in out and "assign_decode assigned request" in out
    assert "state.decode_fetch(" in out  # the shrunk sequence of events
    replay = out.split("replay: ")[1].strip()
    assert replay.startswith(f"dualpath-emu check {spec} --reproduce 6.")
    assert main([*replay.split()[1:], "--json"]) == 1  # the very run, replayed
    again = json.loads(capsys.readouterr().out)
    assert again["failure"]["invariant"] == "contract" and not again["passed"]
    assert again["failure"]["message"] == out.split("\n  ")[2].split("\n")[0]
    fixed = "dualpath_emu.examples.broken_policy:fixed"
    assert main(["check", fixed, "--examples", "25", "--phase", "policy"]) == 0


def test_a_whole_cluster_failure_is_written_as_a_scenario_that_run_and_replay_reproduce(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "mine.py"
    source.write_text((REPO / "python/dualpath_emu/examples/broken_policy.py").read_text(), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    # One DE GPU with room for one 25K-token request's KV, not two: both arrive at once, both fit alone.
    case = ClusterCase(1, 1, 1, 0.99, (((25_000, 10),), ((25_000, 10),)), ((0.0,), (0.0,)))
    from dualpath_emu.testing import write_case

    scenario, trace = write_case(case, "mine.py:most-free-hbm", tmp_path / "most-free-hbm.check-failure.toml")
    assert trace.is_file()
    assert main(["check", "mine.py:most-free-hbm", "--replay", str(scenario)]) == 1
    out = capsys.readouterr().out
    assert "FAILED: invariant 'contract'" in out and f"--replay {scenario}" in out
    assert main(["run", str(scenario), "--quiet"]) == 2  # the same run, unchecked: the scheduler refuses it too
    assert "MostFreeHbmPolicy.assign_decode assigned request" in capsys.readouterr().err
    assert main(["check", "mine.py:fixed", "--replay", str(scenario)]) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "nope"], "check: 'nope': expected a built-in system"),
        (["check", "dualpath", "--budget", "soon"], "--budget 'soon': expected a duration such as 60s or 2m"),
        (["check", "dualpath", "--examples", "0"], "--examples 0: expected an integer >= 1"),
        (["check", "dualpath", "--replay", "missing.toml"], "--replay missing.toml: no such file"),
        (["check", "dualpath", "--reproduce", "6.1:zz!"], "--reproduce '6.1:zz!': expected VERSION:BLOB as a failed"),
    ],
)
def test_bad_arguments_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_budgets_read_as_durations() -> None:
    assert (parse_budget("60s"), parse_budget("2m"), parse_budget("90")) == (60.0, 120.0, 90.0)


def test_the_plugin_gives_a_test_suite_the_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_mine="""
        from dualpath_emu.testing import ClusterCase

        def test_fixed_passes(check_policy):
            check_policy("dualpath_emu.examples.broken_policy:fixed", examples=5)

        from dualpath_emu.cluster.policies import DualPathPolicy, PrefillAssignment

        class Nowhere(DualPathPolicy):
            def assign_prefill(self, view):
                return [PrefillAssignment(r, 999) for r in view.queue]

        def test_broken_fails(check_policy):
            check_policy(Nowhere, examples=50)

        def test_a_case(run_small_cluster):
            result = run_small_cluster(ClusterCase(1, 1, 1, 0.1, (((100, 2),),), ((0.0,),)), "dualpath")
            assert result.turns_done == 1
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*FAILED: invariant 'contract'*"])
