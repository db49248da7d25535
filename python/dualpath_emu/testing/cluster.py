"""Whole small clusters in virtual time for a policy under test: a :class:`~dualpath_emu.testing.strategies.ClusterCase`
run with every decision checked (:func:`~dualpath_emu.testing.invariants.checked`), its failures named by invariant,
and written as a scenario and trajectory file that ``dualpath-emu run`` and ``dualpath-emu check --replay`` replay."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from dualpath_emu.cluster.catalog import MODELS, TESTBED_NODE
from dualpath_emu.cluster.config import BLOCK_TOKENS, ClusterConfig, KvPoolSpec, KvTierSpec, derived
from dualpath_emu.cluster.faults import Fault, FaultPlan
from dualpath_emu.cluster.invariants import InvariantError
from dualpath_emu.cluster.policies import POLICIES, Policy, PolicyError
from dualpath_emu.cluster.run import SystemResult, run_system
from dualpath_emu.cluster.systems import System
from dualpath_emu.errors import NoProgressError
from dualpath_emu.runtime.virtual import DeadlockError
from dualpath_emu.testing.invariants import Violation, checked
from dualpath_emu.testing.strategies import ClusterCase
from dualpath_emu.workload.trajectory import Trajectory, write_trajectories

__all__ = [
    "MODEL",
    "case_config",
    "case_fits",
    "case_trajectories",
    "policy_class",
    "run_case",
    "run_checked",
    "write_case",
]

MODEL: Final = "ds27b"
"""The model of every case: the smallest of the paper's (one DS 27B fits one GPU; runs take milliseconds)."""
_STALL_S: Final = 600.0  # a case making no progress this long is stuck (its waits and faults end within seconds)


def policy_class(system: System) -> type[Policy]:
    """The policy class ``system`` runs (a built-in one by its name)."""
    return POLICIES[system.scheduler] if isinstance(system.scheduler, str) else system.scheduler


def case_config(case: ClusterCase, system: str = "") -> ClusterConfig:
    """The deployment and fault plan of ``case`` (DS 27B, one node per EP group); its DRAM pool for ``system``."""
    faults = tuple(
        Fault("crash", f.target, f.at_s, restart_s=f.duration_s) if f.kind == "crash"
        else Fault(f.kind, f.target, f.at_s, f.duration_s)  # type: ignore[arg-type]
        for f in case.faults
    )  # fmt: skip
    return ClusterConfig(
        model=MODELS[MODEL], node=dataclasses.replace(TESTBED_NODE, gpus=case.gpus), pe_nodes=case.pe_nodes,
        de_nodes=case.de_nodes, prefill_ep_nodes=1, decode_ep_nodes=1, agents=len(case.rounds),
        de_hbm_reserve_fraction=case.de_hbm_reserve_fraction, faults=FaultPlan(faults), stall_timeout_s=_STALL_S,
        order_seed=case.order_seed, message_delay_s=case.message_delay_s, kv_store=KvTierSpec(
            case.store_blocks * BLOCK_TOKENS * MODELS[MODEL].kv_bytes_per_token, case.eviction, case.ttl_s),
        kv_pool=KvPoolSpec(case.pool_blocks * BLOCK_TOKENS * MODELS[MODEL].kv_bytes_per_token, systems=(system,),
                           write=case.pool_write) if case.pool_blocks else KvPoolSpec(),
    )  # fmt: skip


def case_fits(case: ClusterCase) -> bool:
    """Whether each agent's whole context (its last turn's KV, the longest) fits a DE GPU's HBM for KV."""
    longest = max(sum(a + g for a, g in rounds) for rounds in case.rounds)
    d = derived(case_config(case))
    return longest * d.kv_bytes_per_token <= d.de_hbm_kv_bytes


def case_trajectories(case: ClusterCase) -> list[Trajectory]:
    return [Trajectory.from_rounds(f"agent-{i}", rounds, wait_s=case.waits_s[i] if any(case.waits_s[i]) else None)
            for i, rounds in enumerate(case.rounds)]  # fmt: skip


def run_checked(config: ClusterConfig, system: System, trajectories: Sequence[Trajectory], seed: int = 0,
                determinism: bool = True) -> SystemResult:  # fmt: skip
    """Run ``trajectories`` on ``config`` with ``system``'s policy checked at every decision (its delivery order from
    ``config.order_seed``); raise :class:`Violation` naming the invariant a failure broke (``determinism``: run it
    twice and compare the event logs)."""
    checked_system = dataclasses.replace(system, scheduler=checked(policy_class(system), system.dual_path))

    def once() -> SystemResult:
        return run_system(config, checked_system, trajectories, seed=seed)

    try:
        result = once()
    except Violation:
        raise
    except PolicyError as error:
        text = str(error)
        raise Violation("liveness" if " left " in text else "contract", text) from None
    except InvariantError as error:
        raise Violation("conservation", str(error)) from None
    except (DeadlockError, NoProgressError) as error:
        raise Violation("liveness", str(error)) from None
    if result.turns_done + result.failed_requests + result.turns_not_run != result.turns_planned:
        raise Violation("conservation", f"{result.turns_done} turns done, {result.failed_requests} failed and "
                                        f"{result.turns_not_run} not run, of {result.turns_planned}")  # fmt: skip
    if determinism:
        again = once()
        if again.event_log_sha256 != result.event_log_sha256:
            raise Violation("determinism", f"two runs of the same case gave event logs {result.event_log_sha256[:12]} "
                                           f"and {again.event_log_sha256[:12]}")  # fmt: skip
    return result


def run_case(case: ClusterCase, system: System, determinism: bool = True) -> SystemResult:
    """:func:`run_checked` on ``case``."""
    return run_checked(case_config(case, system.name), system, case_trajectories(case), case.seed, determinism)


def write_case(case: ClusterCase, spec: str, path: Path, name: str = "") -> tuple[Path, Path]:
    """Write ``case`` as a scenario ``path`` (``.toml``) that runs ``spec`` (a system called ``name``, which its DRAM
    pool is for) and a trajectory file beside it."""
    trace = path.with_suffix(".jsonl")
    write_trajectories(trace, case_trajectories(case))
    lines = [
        'kind = "cluster"', f"name = {json.dumps(path.stem)}", f"seed = {case.seed}",
        f"systems = [{json.dumps(spec)}]",
    ]  # fmt: skip
    if case.order_seed is not None:
        lines.append(f"order_seed = {case.order_seed}")
    if case.message_delay_s:
        lines.append(f"message_delay_s = {case.message_delay_s!r}")
    lines += [
        "", "[deployment]", f'model = "{MODEL}"', f"pe_nodes = {case.pe_nodes}", f"de_nodes = {case.de_nodes}",
        "prefill_ep_nodes = 1", "decode_ep_nodes = 1", "", "[hardware]", f"gpus = {case.gpus}", "",
        "[scheduling]", f"de_hbm_reserve_fraction = {case.de_hbm_reserve_fraction!r}", f"stall_timeout_s = {_STALL_S}",
        "", "[workload]", f"trace = {json.dumps(trace.name)}", f"agents = {len(case.rounds)}",
    ]  # fmt: skip
    if case.store_blocks:
        lines += ["", "[kv.store]", f"capacity_bytes = {case_config(case).kv_store.capacity_bytes}",
                  f'eviction = "{case.eviction}"']  # fmt: skip
        if case.eviction == "ttl":
            lines.append(f"ttl_s = {case.ttl_s!r}")
    if case.pool_blocks:
        lines += ["", "[kv.pool]", f"bytes_per_node = {case_config(case).kv_pool.bytes_per_node}",
                  f"systems = [{json.dumps(name)}]", f'write = "{case.pool_write}"']  # fmt: skip
    for fault in case.faults:
        lines += ["", "[[faults]]", f'kind = "{fault.kind}"', f'target = "{fault.target}"', f"at_s = {fault.at_s!r}"]
        lines.append(
            f"restart_s = {fault.duration_s!r}" if fault.kind == "crash" else f"duration_s = {fault.duration_s!r}"
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, trace
