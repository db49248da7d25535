"""``dualpath-emu check SPEC``: a policy's properties alone, then whole small clusters in virtual time under random
loads, fault schedules and delivery orders, until a budget is spent (docs/testing-your-scheduler.md).

Each phase runs in chunks, chunk ``k`` seeded with ``--seed + k`` (Hypothesis, no example database): a chunk repeats
exactly from its seed, so a failure is replayed by the command printed with it. A failing whole-cluster case is shrunk
by Hypothesis and written as a scenario beside the policy's file; ``check SPEC --replay FILE.toml`` runs it again with
every decision checked, ``dualpath-emu run FILE.toml`` shows it in full."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from hypothesis import HealthCheck, Phase, given, reproduce_failure, seed, settings
from hypothesis.errors import HypothesisException
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from dualpath_emu.cluster.policies import Policy
from dualpath_emu.cluster.systems import System
from dualpath_emu.cluster.user_systems import SystemLoader, is_user_spec
from dualpath_emu.errors import UsageError
from dualpath_emu.testing.cluster import policy_class, run_case, run_checked, write_case
from dualpath_emu.testing.invariants import INVARIANTS, Violation, promises
from dualpath_emu.testing.machine import PolicyMachine
from dualpath_emu.testing.strategies import ClusterCase, cluster_cases

__all__ = ["CheckReport", "Failure", "check", "check_command", "parse_budget"]

POLICY_CHUNK: Final = 25  # state-machine runs per policy-phase chunk
CLUSTER_CHUNK: Final = 10  # small clusters per cluster-phase chunk
POLICY_SHARE: Final = 0.25  # of a time budget, for the policy phase
_QUIET: Final = settings(
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
    stateful_step_count=30,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),  # no "explain": it reruns a failure many times over
)


@dataclass
class Failure:
    """The first invariant broken: where, how, the smallest case, and how to replay it."""

    invariant: str
    message: str
    phase: str  # "policy" or "cluster"
    seed: int
    examples: int
    steps: list[str] = field(default_factory=list)  # the policy phase's shrunk program, as Hypothesis prints it
    blob: str | None = None
    """The policy phase's failing run as Hypothesis encodes it (``VERSION:BLOB``): ``--reproduce`` replays it."""
    case: ClusterCase | None = None
    scenario: Path | None = None
    replay: str = ""


@dataclass
class CheckReport:
    spec: str
    policy: str
    promises: list[str]
    seed: int
    policy_runs: int = 0
    cluster_runs: int = 0
    wall_s: float = 0.0
    failure: Failure | None = None

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.failure is not None:
            out["failure"]["scenario"] = None if self.failure.scenario is None else str(self.failure.scenario)
        out["passed"] = self.failure is None
        return out


def parse_budget(text: str) -> float:
    """``60s``, ``2m``, ``90`` (seconds) -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(s|m|min)?\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise UsageError(f"--budget {text!r}: expected a duration such as 60s or 2m")
    return float(match.group(1)) * (60 if match.group(2) in ("m", "min") else 1)


def _violation(error: BaseException, policy_file: str | None, policy: str = "") -> Violation:
    """The invariant an exception from a run of the policy broke: ``no_error``, naming who raised it."""
    if isinstance(error, BaseExceptionGroup):
        return _violation(error.exceptions[0], policy_file, policy)
    if isinstance(error, Violation):
        return error
    frames = traceback.extract_tb(error.__traceback__)
    mine = [f for f in frames if policy_file is not None and f.filename == policy_file]
    where = (mine or frames)[-1] if frames else None
    at = f" at {where.filename}:{where.lineno}" if where is not None else ""
    who = (
        f"the policy {policy}".rstrip()
        if mine
        else "the emulator (a bug in dualpath-emu: please report it with this case)"
    )
    return Violation("no_error", f"{who} raised {type(error).__name__}: {error}{at}")


def _source(cls: type) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except TypeError:
        return None


_BLOB: Final = re.compile(r"@reproduce_failure\('([^']+)', b'([^']+)'\)")


def _policy_chunk(system: System, chunk_seed: int, examples: int, blob: str | None = None) -> Failure | None:
    """``examples`` runs of the policy state machine seeded with ``chunk_seed`` (``blob``: replay that one run)."""

    class Machine(PolicyMachine):
        dual_path = system.dual_path

        def make_policy(self, alpha_tokens: int, beta_tokens: int) -> Policy:
            return system.policy(alpha_tokens, beta_tokens)

    factory: Any = seed(chunk_seed)(Machine)
    if blob is not None:
        version, data = blob.split(":", 1)
        factory = reproduce_failure(version, data.encode())(factory)
    reported: list[str] = []
    try:
        with with_reporter(lambda text: reported.append(str(text))):
            run_state_machine_as_test(factory, settings=settings(_QUIET, max_examples=examples))
    except (Exception, BaseExceptionGroup) as error:  # whatever the policy raised is its failure
        if isinstance(error, HypothesisException) and not isinstance(error, AssertionError):
            raise
        notes = getattr(error, "__notes__", [])
        steps = [line for note in notes for line in note.splitlines()
                 if line.startswith(("state.", " ")) and not line.startswith(("state.teardown", "state.hbm_"))]  # fmt: skip
        found = next((m for text in [*notes, *reported] if (m := _BLOB.search(text))), None)
        error.__notes__ = []
        cls = policy_class(system)
        violation = _violation(error, _source(cls), cls.__name__)
        failure = Failure(violation.invariant, violation.detail, "policy", chunk_seed, examples, steps)
        failure.blob = blob or (f"{found.group(1)}:{found.group(2)}" if found else None)
        return failure
    return None


def _cluster_chunk(system: System, chunk_seed: int, examples: int, runs: list[int], shrink_s: float) -> Failure | None:
    """``examples`` small clusters; a failure is shrunk for at most ``shrink_s`` seconds after it is found."""
    failing: list[tuple[ClusterCase, Violation]] = []
    known: dict[ClusterCase, Violation] = {}
    cls = policy_class(system)
    policy_file, policy_name = _source(cls), cls.__name__
    stop_at = [float("inf")]

    @seed(chunk_seed)
    @settings(_QUIET, max_examples=examples)
    @given(cluster_cases())
    def one(case: ClusterCase) -> None:
        if time.monotonic() > stop_at[0]:  # out of time to shrink: what failed still fails, the rest passes
            if case in known:
                raise known[case]
            return
        runs[0] += 1
        try:
            run_case(case, system)
        except Exception as error:
            violation = _violation(error, policy_file, policy_name)
            if not failing:
                stop_at[0] = time.monotonic() + shrink_s
            failing.append((case, violation))
            known[case] = violation
            raise violation from None

    try:
        with with_reporter(lambda _: None):
            one()
    except (Exception, BaseExceptionGroup):
        if not failing:
            raise
        case, violation = failing[-1]  # Hypothesis replays the smallest failing case last
        return Failure(violation.invariant, violation.detail, "cluster", chunk_seed, examples, case=case)
    return None


def check(
    system: System, spec: str, *, budget_s: float | None = 60.0, examples: int | None = None, seed_: int = 0,
    phases: tuple[str, ...] = ("policy", "cluster"), beside: Path | None = None,
    progress: Callable[[str], None] | None = None, shrink_s: float | None = None,
) -> CheckReport:  # fmt: skip
    """Check ``system``'s policy: ``examples`` per phase, else until ``budget_s`` (a quarter of it for the policy). A
    whole cluster's failure is shrunk for ``shrink_s`` (default: what is left of the budget, at least 10 s)."""
    cls = policy_class(system)
    report = CheckReport(spec, cls.__name__, sorted(promises(cls)), seed_)
    start = time.monotonic()
    say = progress or (lambda _: None)
    for phase in phases:
        done, chunk = 0, 0
        size = POLICY_CHUNK if phase == "policy" else CLUSTER_CHUNK
        deadline = None if budget_s is None else start + budget_s * (POLICY_SHARE if phase == "policy" and
                                                                      "cluster" in phases else 1.0)  # fmt: skip
        while True:
            if examples is not None and done >= examples:
                break
            if examples is None and deadline is not None and time.monotonic() >= deadline:
                break
            n = size if examples is None else min(size, examples - done)
            runs = [0]
            if phase == "policy":
                failure = _policy_chunk(system, seed_ + chunk, n)
                report.policy_runs += n
            else:
                left = (
                    shrink_s
                    if shrink_s is not None
                    else max(10.0, (deadline - time.monotonic()) if deadline is not None else 60.0)
                )
                failure = _cluster_chunk(system, seed_ + chunk, n, runs, left)
                report.cluster_runs += runs[0]
            done += n
            chunk += 1
            say(f"{phase}: {done} examples, {time.monotonic() - start:.0f} s")
            if failure is not None:
                report.failure = _replayable(failure, spec, beside, system.name)
                report.wall_s = time.monotonic() - start
                return report
    report.wall_s = time.monotonic() - start
    return report


def _replayable(failure: Failure, spec: str, beside: Path | None, name: str = "") -> Failure:
    if failure.case is None:
        if failure.blob is not None:
            failure.replay = f"dualpath-emu check {spec} --reproduce {failure.blob}"
        else:
            failure.replay = (f"dualpath-emu check {spec} --phase policy --seed {failure.seed} "
                              f"--examples {failure.examples}")  # fmt: skip
        return failure
    folder = beside if beside is not None else Path.cwd()
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", spec.rpartition(":")[2] or "policy").strip("-") or "policy"
    path = folder / f"{stem}.check-failure.toml"
    try:
        write_case(failure.case, spec, path, name)
    except OSError as error:  # a read-only or full folder: the failure still stands, found again from its seed
        failure.replay = (f"dualpath-emu check {spec} --phase cluster --seed {failure.seed} --examples "
                          f"{failure.examples} (the case could not be written to {path}: {error.strerror or error})")  # fmt: skip
        return failure
    failure.scenario = path
    failure.replay = f"dualpath-emu check {spec} --replay {path}"
    return failure


def describe_case(case: ClusterCase) -> list[str]:
    """The smallest case in words, a line each."""
    lines = [
        f"cluster: {case.pe_nodes} prefill and {case.de_nodes} decode node(s) of {case.gpus} GPU(s), DS 27B, "
        f"DE HBM reserve {case.de_hbm_reserve_fraction:g}"
    ]
    for i, (rounds, waits) in enumerate(zip(case.rounds, case.waits_s, strict=True)):
        shown = ", ".join(
            f"{a}+{g}" + (f" after {w:g} s" if w else "") for (a, g), w in zip(rounds, waits, strict=True)
        )
        lines.append(f"agent {i}: rounds (appended+generated tokens) {shown}")
    lines.append("faults: " + ("; ".join(f"{f.kind} {f.target} at {f.at_s:g} s for {f.duration_s:g} s"
                                         for f in case.faults) or "none"))  # fmt: skip
    order = "FIFO" if case.order_seed is None else f"order seed {case.order_seed}"
    delay = f", messages delayed up to {case.message_delay_s * 1e3:g} ms" if case.message_delay_s else ""
    lines.append(f"delivery: {order}{delay}; workload seed {case.seed}")
    tiers = [f"store of {case.store_blocks} blocks ({case.eviction})" if case.store_blocks else "unbounded store"]
    if case.pool_blocks:
        tiers.append(f"DRAM pool of {case.pool_blocks} blocks per node, write-{case.pool_write}")
    lines.append("kv: " + ", ".join(tiers))
    return lines


def _print(report: CheckReport, out: Any) -> None:
    rules = ", ".join(report.promises) or "none"
    print(f"{report.spec}: policy {report.policy}; paper rules it promises: {rules}", file=out)
    print(f"  policy alone: {report.policy_runs} state-machine runs; whole clusters: {report.cluster_runs} "
          f"(seed {report.seed}, {report.wall_s:.1f} s)", file=out)  # fmt: skip
    failure = report.failure
    if failure is None:
        print(f"passed: no invariant broken ({', '.join(INVARIANTS)})", file=out)
        return
    print(f"FAILED: invariant {failure.invariant!r} ({INVARIANTS.get(failure.invariant, '')})", file=out)
    print(f"  {failure.message}", file=out)
    if failure.steps:
        print("  smallest sequence of scheduler events (the policy alone):", file=out)
        for line in failure.steps:
            print(f"    {line}", file=out)
    if failure.case is not None:
        print("  smallest case:", file=out)
        for line in describe_case(failure.case):
            print(f"    {line}", file=out)
        if failure.scenario is not None:
            trajectories = failure.scenario.with_suffix(".jsonl").name
            print(f"  scenario: {failure.scenario} (and its trajectories, {trajectories})", file=out)
    print(f"replay: {failure.replay}", file=out)


def replay(system: System, spec: str, scenario_path: Path) -> CheckReport:
    """Run a scenario ``check`` wrote (or any) with ``system``'s every decision checked."""
    from dualpath_emu.cluster.run_cli import load_scenario

    scenario = load_scenario(scenario_path)
    cls = policy_class(system)
    report = CheckReport(spec, cls.__name__, sorted(promises(cls)), scenario.seed, cluster_runs=1)
    start = time.monotonic()
    try:
        run_checked(scenario.config, system, scenario.trajectories(), scenario.seed)
    except Violation as violation:
        report.failure = Failure(violation.invariant, violation.detail, "cluster", scenario.seed, 1,
                                 scenario=scenario_path, replay=f"dualpath-emu check {spec} --replay {scenario_path}")  # fmt: skip
    report.wall_s = time.monotonic() - start
    return report


def reproduce(system: System, spec: str, blob: str) -> CheckReport:
    """Replay one failing run of the policy state machine (``VERSION:BLOB``, as a failed check printed it)."""
    import hypothesis

    version, _, data = blob.partition(":")
    if not data or not re.fullmatch(r"[A-Za-z0-9+/=]+", data):
        raise UsageError(f"--reproduce {blob!r}: expected VERSION:BLOB as a failed check printed it")
    if version != hypothesis.__version__:
        raise UsageError(f"--reproduce: the run was recorded with Hypothesis {version}; this is "
                         f"{hypothesis.__version__} (replay with that version, or search again with --seed)")  # fmt: skip
    cls = policy_class(system)
    report = CheckReport(spec, cls.__name__, sorted(promises(cls)), 0, policy_runs=1)
    start = time.monotonic()
    try:
        failure = _policy_chunk(system, 0, 1, blob)
    except HypothesisException as error:
        raise UsageError(f"--reproduce: Hypothesis could not replay it ({error})") from None
    report.failure = None if failure is None else _replayable(failure, spec, None)
    report.wall_s = time.monotonic() - start
    return report


def check_command(args: argparse.Namespace) -> int:
    """Runs ``dualpath-emu check``; returns the exit status (0 passed, 1 an invariant broken)."""
    spec: str = args.spec
    base = Path.cwd()
    system = SystemLoader(base, "check").load(spec)
    beside = None
    if is_user_spec(spec):
        target = spec.rpartition(":")[0]
        beside = (base / target).resolve().parent if target.endswith(".py") else None
    if args.examples is not None and args.examples < 1:
        raise UsageError(f"--examples {args.examples}: expected an integer >= 1")
    if args.seed < 0:
        raise UsageError(f"--seed {args.seed}: expected an integer >= 0")
    if args.replay is not None:
        if not args.replay.is_file():
            what = (
                "a folder" if args.replay.is_dir() else "not a regular file" if args.replay.exists() else "no such file"
            )
            raise UsageError(f"--replay {args.replay}: {what}; expected the scenario file a failed check wrote")
        report = replay(system, spec, args.replay)
    elif args.reproduce is not None:
        report = reproduce(system, spec, args.reproduce)
    else:
        budget = parse_budget(args.budget) if args.examples is None else None
        phases = ("policy", "cluster") if args.phase == "all" else (args.phase,)
        show = (
            None
            if args.json or not sys.stderr.isatty()
            else (lambda text: print(f"\r{text}   ", end="", file=sys.stderr))
        )
        report = check(system, spec, budget_s=budget, examples=args.examples, seed_=args.seed, phases=phases,
                       beside=beside, progress=show)  # fmt: skip
        if show is not None:
            print(file=sys.stderr)
    if args.json:
        print(json.dumps(report.as_json(), indent=2, default=str))
    else:
        _print(report, sys.stdout)
    return 0 if report.failure is None else 1
