"""The pytest plugin of :mod:`dualpath_emu.testing` (registered as ``pytest11`` when the package is installed): its
fixtures are there in any test suite, no import needed.

``check_policy``
    ``check_policy("my_policy.py:Name")`` or ``check_policy(MyPolicy)`` runs what ``dualpath-emu check`` runs (the
    policy alone, then whole small clusters) for ``examples`` of each and fails the test with the broken invariant,
    the smallest case and its replay command.
``run_small_cluster``
    ``run_small_cluster(case, MyPolicy)`` runs a :class:`~dualpath_emu.testing.strategies.ClusterCase` with every
    decision checked and returns its :class:`~dualpath_emu.cluster.run.SystemResult` (a broken invariant raises
    :class:`~dualpath_emu.testing.invariants.Violation`); use it under ``@given(cluster_cases())``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dualpath_emu.cluster.policies import Policy
from dualpath_emu.cluster.run import SystemResult
from dualpath_emu.cluster.systems import System
from dualpath_emu.testing.strategies import ClusterCase

__all__ = ["check_policy", "run_small_cluster", "system_of"]


def system_of(target: str | System | type[Policy], base: Path | None = None) -> System:
    """A system from a spec (``file.py:Name``, ``module:Name``, a built-in name), a system, or a policy class."""
    if isinstance(target, System):
        return target
    from dualpath_emu.cluster.user_systems import SystemLoader, policy_system

    if isinstance(target, type) and issubclass(target, Policy):
        return policy_system(target)  # as `dualpath-emu run` wraps a policy class

    return SystemLoader(base or Path.cwd(), "check_policy").load(target)


@pytest.fixture
def check_policy(tmp_path: Path) -> Callable[..., None]:
    """Check a policy as ``dualpath-emu check`` does; a failure fails the test (a failing case is written to
    ``tmp_path``)."""
    from dualpath_emu.testing.check import _print, check

    def run(target: str | System | type[Policy], examples: int = 20, seed: int = 0) -> None:
        system = system_of(target)
        spec = target if isinstance(target, str) else system.name
        report = check(system, spec, budget_s=None, examples=examples, seed_=seed, beside=tmp_path)
        if report.failure is not None:
            import io

            text = io.StringIO()
            _print(report, text)
            pytest.fail(text.getvalue(), pytrace=False)

    return run


@pytest.fixture(scope="session")  # stateless: usable under @given (no function-scoped fixture there)
def run_small_cluster() -> Callable[[ClusterCase, str | System | type[Policy]], SystemResult]:
    """Run a small cluster case with a policy, every decision checked."""
    from dualpath_emu.testing.cluster import run_case

    def run(case: ClusterCase, target: str | System | type[Policy]) -> SystemResult:
        return run_case(case, system_of(target))

    return run
