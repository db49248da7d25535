"""Shared test configuration: the Hypothesis profiles.

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
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE_ENV = "DUALPATH_HYPOTHESIS_PROFILE"

settings.register_profile("default", max_examples=40, stateful_step_count=30, deadline=None)
settings.register_profile("ci", settings.get_profile("default"), derandomize=True, database=None)
settings.register_profile(
    "deep",
    max_examples=1_000,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
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
