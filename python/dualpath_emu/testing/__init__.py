"""Test your own scheduler (docs/testing-your-scheduler.md): Hypothesis strategies for the policy's views and for
whole small clusters, the invariants as reusable checks, a state machine to subclass for a policy, whole-cluster runs
with every decision checked, and a pytest plugin (``dualpath_emu.testing.plugin``, registered with pytest when the
package is installed). ``dualpath-emu check FILE.py:Name`` runs all of it."""

from __future__ import annotations

from dualpath_emu.testing.cluster import case_config, case_trajectories, policy_class, run_case, run_checked, write_case
from dualpath_emu.testing.invariants import (
    INVARIANTS, PAPER_RULES, Violation, check_decode_call, check_prefill_call, check_read_call, check_route_call,
    checked, promises,
)  # fmt: skip
from dualpath_emu.testing.machine import PolicyMachine
from dualpath_emu.testing.strategies import (
    ClusterCase, FaultCase, cluster_cases, decode_views, engine_states, fault_schedules, health, prefill_views,
    read_views, requests, route_views, trajectories,
)  # fmt: skip

__all__ = [
    "INVARIANTS", "PAPER_RULES", "ClusterCase", "FaultCase", "PolicyMachine", "Violation", "case_config",
    "case_trajectories", "check_decode_call", "check_prefill_call", "check_read_call", "check_route_call", "checked",
    "cluster_cases", "decode_views", "engine_states", "fault_schedules", "health", "policy_class", "prefill_views",
    "promises", "read_views", "requests", "route_views", "run_case", "run_checked", "trajectories", "write_case",
]  # fmt: skip
