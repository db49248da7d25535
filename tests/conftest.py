"""Shared test configuration: the Hypothesis profiles, the check that a test starting a process is marked, and the
delivery order of virtual-time runs.

The depth of every property and stateful test is chosen by the environment variable
``DUALPATH_HYPOTHESIS_PROFILE`` (as pydantic-core does with ``HYPOTHESIS_PROFILE``):

``default``
    Modest example counts, so the whole suite stays fast (well under a minute on a 2-core machine).
    Random: each run explores new cases, and failures are kept in ``.hypothesis/`` and replayed first.
``ci``
    The same counts with ``derandomize=True`` and no example database, so a CI run is deterministic: the
    same commit tries the same cases every time. Chosen automatically when ``CI=true`` (as GitHub Actions
    and most CI services set it) and ``DUALPATH_HYPOTHESIS_PROFILE`` is not set.
``deep``
    Many more examples (and longer stateful runs) for soak runs, e.g.
    ``DUALPATH_HYPOTHESIS_PROFILE=deep .venv/bin/pytest tests/core/test_lanes.py tests/core/test_core_properties.py``.

No profile has a deadline: the per-example cost of these tests varies with machine load, and a deadline
would turn a slow CI runner into a flaky failure without finding a bug.

``--order-seed N`` (and ``--message-delay-ns NS``, which needs it) makes every virtual-time run of the session
deliver same-instant inputs in a seeded random order (and delay messages between engines), as ``VirtualDriver``'s
``order_seed`` and ``message_delay_ns`` do: the defaults of those keywords of ``VirtualDriver`` and ``run_system``
are patched for the session, so a test that passes its own keeps it. Golden event-log hashes differ under them
by design. E.g. ``.venv/bin/pytest tests/cluster -m "not processes" --order-seed 3 --message-delay-ns 200000``.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Generator

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ("pytester",)  # tests/testing runs a user's test suite with dualpath_emu's plugin

PROFILE_ENV = "DUALPATH_HYPOTHESIS_PROFILE"

settings.register_profile("default", max_examples=40, stateful_step_count=30, deadline=None)
settings.register_profile("ci", settings.get_profile("default"), derandomize=True, database=None)
settings.register_profile(
    "deep", max_examples=1_000, stateful_step_count=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

_PROFILES = ("default", "ci", "deep")


def _profile_name() -> str:
    chosen = os.environ.get(PROFILE_ENV)
    if chosen is None:
        return "ci" if os.environ.get("CI", "").strip().lower() in ("true", "1") else "default"
    if chosen not in _PROFILES:
        raise ValueError(f"{PROFILE_ENV}={chosen!r}: expected one of {', '.join(_PROFILES)}")
    return chosen


settings.load_profile(_profile_name())


# ------------------------------------------------------------------------------------------------- delivery order


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dualpath-emu")
    group.addoption("--order-seed", type=int, default=None, metavar="N",
                    help="virtual-time runs deliver same-instant inputs in an order seeded by N (VirtualDriver)")  # fmt: skip
    group.addoption("--message-delay-ns", type=int, default=0, metavar="NS",
                    help="with --order-seed: delay each message between engines by up to NS ns of virtual time")  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--order-seed``, a test marked ``fifo_only`` (it compares with a reference run or exact times) is skipped."""
    if config.getoption("--order-seed") is None:
        return
    skip = pytest.mark.skip(reason="fifo_only: holds in the default (FIFO) delivery order only")
    for item in items:
        if item.get_closest_marker("fifo_only"):
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _delivery_order(request: pytest.FixtureRequest) -> Generator[None, None, None]:
    """With ``--order-seed``: ``VirtualDriver``'s and ``run_system``'s ``order_seed``/``message_delay_ns`` defaults."""
    seed: int | None = request.config.getoption("--order-seed")
    delay: int = request.config.getoption("--message-delay-ns")
    if seed is None and not delay:
        yield
        return
    if seed is None:
        raise pytest.UsageError("--message-delay-ns needs --order-seed")
    from dualpath_emu.cluster.run import run_system
    from dualpath_emu.runtime.virtual import VirtualDriver

    with pytest.MonkeyPatch.context() as patch:
        for function in (VirtualDriver.__init__, run_system):
            assert function.__kwdefaults__ is not None
            patch.setitem(function.__kwdefaults__, "order_seed", seed)
            patch.setitem(function.__kwdefaults__, "message_delay_ns", delay)
        yield


# ------------------------------------------------------------------------------------------------- markers
# A test that starts an operating-system process must carry the `processes` marker (pyproject.toml), so that
# `-m "not processes"` is a subset that starts none. Python's audit events see subprocess.Popen (asyncio's
# subprocesses too), os.fork (multiprocessing's default start on Linux) and os.posix_spawn; a child started
# otherwise (multiprocessing's "spawn" context) and reaped within the test shows in RUSAGE_CHILDREN. A library
# probing the system the first time it is used (matplotlib's font cache runs fc-list, ctypes.util.find_library
# ldconfig or a compiler) starts no process of the test's own: those programs are not counted.

_SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.system"})
_PROBES = frozenset({"fc-list", "ldconfig", "ldconfig.real", "gcc", "cc", "ld", "objdump", "uname"})
_started: list[str] | None = None  # while a test runs: what it started
_probed = False  # whether a library's probe ran meanwhile (its CPU is in RUSAGE_CHILDREN too)
_children_before_s = 0.0  # RUSAGE_CHILDREN's CPU seconds when it began


def _audit(event: str, args: tuple[object, ...]) -> None:
    global _probed
    if _started is None or event not in _SPAWN_EVENTS:
        return
    if event == "subprocess.Popen" and _program(args) in _PROBES:
        _probed = True
    else:
        _started.append(event)


def _program(args: tuple[object, ...]) -> str:
    """The program a subprocess.Popen audit event (executable, args, cwd, env) starts, without its folder."""
    executable, argv = args[0], args[1]
    if executable is None and isinstance(argv, (list, tuple)) and argv:
        executable = argv[0]
    elif executable is None:
        executable = argv
    return os.path.basename(os.fsdecode(executable)) if isinstance(executable, (str, bytes, os.PathLike)) else ""


sys.addaudithook(_audit)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    global _started, _probed, _children_before_s
    _started, _probed, _children_before_s = [], False, _children_cpu_s()
    try:
        return (yield)
    finally:
        _started = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    if call.when != "teardown" or _started is None or item.get_closest_marker("processes") is not None:
        return report
    reaped = _children_cpu_s() > _children_before_s and not _probed
    if (_started or reaped) and report.passed:
        what = ", ".join(sorted(set(_started))) or "a child process (reaped: RUSAGE_CHILDREN grew)"
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started a process ({what}) but has no `processes` marker: add "
            "@pytest.mark.processes (or the module's pytestmark), see docs/testing.md"
        )
    return report
