"""Calibration: fit the parameters the paper does not give on **Basic and Oracle runs only**, so that DualPath's results
are predictions.

Three hardware parameters, shared by every model, fitted on DS 660B 2P4D, 64K, whole trajectories (the paper's Fig. 7
[fig~]):

1. ``prefill_speed``, one factor on the prefill engines' kernel efficiencies
   (:mod:`dualpath_emu.cluster.roofline`), so that **Oracle at 4,096 agents** takes the paper's ≈9,400 s
   (Oracle has no I/O: with thousands of agents its JCT is prefill throughput);
2. ``prefill_overhead_s_per_layer``, a prefill pass's fixed cost per layer (launches, DP-attention
   synchronisation), so that **Oracle at 512 agents** takes ≈2,000 s (the longest trajectory's chain of short
   turns, where a fixed cost per pass weighs). Both points depend on both, so the two are fitted together
   (:func:`_fit_prefill`);
3. ``snic_bytes_per_s``, the storage NICs' effective read rate (line rate 50 GB/s; what 3FS reaches through
   one NIC is not given, paper-facts §10), so that the storage-bound **Basic at 512 agents** takes ≈2,900 s;
   where it is slower even at the line rate, the rate stays the line rate.

The decode engines are **not** fitted (roofline efficiencies, DeepEP all-to-all latencies,
:meth:`~dualpath_emu.cluster.roofline.Roofline.ep_decode_step_s`): TPOT is a prediction too. ``--write`` stores the
result in ``calibration.json`` in this package, which every experiment reads through
:func:`~dualpath_emu.reproduce.common.deployment`; ``dualpath-emu calibrate`` reruns the fit. ``--quick`` fits a
storage-bound miniature (fewer agents, 40 rounds) to known parameters, to check the procedure, and never writes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from collections.abc import Callable
from typing import Any, Final

from dualpath_emu.cluster.catalog import TESTBED_NODE
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.roofline import RooflineParams
from dualpath_emu.reproduce import help_description
from dualpath_emu.reproduce.common import Cell, Comparison, Report, deployment, experiment_main, run_cells

__all__ = ["CALIBRATION_FILE", "apply", "load", "main"]

CALIBRATION_FILE: Final = Path(__file__).resolve().parent / "calibration.json"
TOLERANCE: Final = 0.02
MAX_ITERATIONS: Final = 8
MIN_ELASTICITY: Final = 0.25  # |d ln JCT / d ln parameter| below which a fit stops and keeps its start value.
TARGETS: Final = {("oracle", 512): 2000.0, ("oracle", 4096): 9400.0, ("basic", 512): 2900.0}
"""DS 660B 2P4D, 64K, JCT in seconds by (system, agents) [Fig. 7, fig~]."""
QUICK_AGENTS: Final = {512: 96, 4096: 384}  # The miniature's agent counts standing for 512 and 4,096.
START: Final = {"prefill_speed": 0.44, "prefill_overhead_s_per_layer": 7e-3}
"""Where the prefill fit starts: near its last solution (saves Newton steps)."""
FITTED: Final = ("prefill_speed", "prefill_overhead_s_per_layer", "snic_bytes_per_s")
LINE_RATE_TOLERANCE: Final = 0.05
"""Basic may be this much over its target when the storage NICs already run at line rate."""


def load(path: Path = CALIBRATION_FILE) -> dict[str, float] | None:
    """The fitted parameters (:data:`FITTED`), or None without a calibration (or one that lacks them)."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if not all(key in data for key in FITTED):
        return None
    return {key: float(data[key]) for key in FITTED}


def apply(config: ClusterConfig, fitted: dict[str, float]) -> ClusterConfig:
    """``config`` with the fitted prefill efficiencies (× ``prefill_speed``, ≤ 1), prefill overhead and SNIC rate."""
    base = RooflineParams()
    speed = fitted["prefill_speed"]
    prefill = dataclasses.replace(
        config.prefill_roofline,
        gemm_efficiency=min(1.0, base.gemm_efficiency * speed),
        attention_efficiency=min(1.0, base.attention_efficiency * speed),
        memory_efficiency=min(1.0, base.memory_efficiency * speed),
        overhead_s_per_layer=fitted["prefill_overhead_s_per_layer"],
    )
    node = dataclasses.replace(config.node, snic_bytes_per_s=fitted["snic_bytes_per_s"])
    return dataclasses.replace(config, prefill_roofline=prefill, node=node)


def _fit(name: str, system: str, target: float, start: float, bounds: tuple[float, float],
         config: Callable[[float], ClusterConfig], rounds: int, args: argparse.Namespace,
         history: list[dict[str, Any]]) -> tuple[float, float]:  # fmt: skip
    """Fit ``x``, a parameter that makes the cluster faster as it grows, so that ``system``'s JCT on
    ``config(x)`` is ``target``; returns ``(x, its JCT)``, the closest run if none is within :data:`TOLERANCE`.

    Steps ``x ← x × JCT / target`` (JCT about inversely proportional to ``x`` where it binds), a factor of 2
    where the JCT hardly responds (elasticity below :data:`MIN_ELASTICITY`); once runs bracket the target, the
    secant of log JCT against log ``x``, or the geometric midpoint when the last two fell on one side."""
    low, high = bounds
    runs: list[tuple[float, float]] = []
    x = start
    for iteration in range(MAX_ITERATIONS):
        cell = Cell({"fit": name, "value": x}, config(x), system, max_rounds=rounds)
        (result,) = run_cells([cell], 1, quiet=args.quiet, cache=args.cache, dask=args.dask)
        jct = result.jct_s
        history.append(
            {"parameter": name, "iteration": iteration, "value": x, "system": system, "jct_s": jct, "target_s": target}
        )
        runs.append((x, jct))
        if abs(jct / target - 1.0) <= TOLERANCE:
            break
        too_slow = [r for r in runs if r[1] > target]  # x too small
        too_fast = [r for r in runs if r[1] < target]  # x too large
        if too_slow and too_fast:
            (x0, j0), (x1, j1) = max(too_slow), min(too_fast)
            step = math.log(target / j0) / math.log(j1 / j0)
            if len(runs) > 2 and (runs[-1][1] > target) == (runs[-2][1] > target):
                step = 0.5  # the secant keeps landing on one side (a kink): bisect
            x = math.exp(math.log(x0) + step * math.log(x1 / x0))
        else:
            first_x, first_jct = runs[0]
            flat = len(runs) > 1 and abs(math.log(jct / first_jct) / math.log(x / first_x)) < MIN_ELASTICITY
            x = x * (2.0 if jct > target else 0.5) if flat else x * jct / target
        x = min(high, max(low, x))
        if any(x == r[0] for r in runs):
            break  # at a bound it already ran
    return min(runs, key=lambda r: abs(r[1] / target - 1.0))


def _fit_prefill(targets: dict[tuple[str, int], float], speed: float, overhead_s: float,
                 config: Callable[..., ClusterConfig], rounds: int, args: argparse.Namespace,
                 history: list[dict[str, Any]]) -> tuple[float, float, dict[tuple[str, int], float]]:  # fmt: skip
    """Fit prefill speed and overhead together so that Oracle takes its targets at 4,096 and 512 agents
    (fitting them in turn drifts: each refit undoes half the other's). Newton steps on the residuals
    ``log(JCT / target)`` in ``(log speed, overhead in ms)``, the Jacobian from finite differences at the start
    and updated by Broyden after; at most :data:`MAX_ITERATIONS` steps, returning the closest evaluation."""
    points = (("oracle", 4096), ("oracle", 512))

    def evaluate(x: tuple[float, float]) -> tuple[list[float], dict[tuple[str, int], float]]:
        s, o_ms = math.exp(x[0]), x[1]
        cells = [Cell({"fit": "prefill", "speed": s, "overhead_ms": o_ms},
                      config(n, prefill_speed=s, prefill_overhead_s_per_layer=o_ms / 1e3), system,
                      max_rounds=rounds) for system, n in points]  # fmt: skip
        results = run_cells(cells, args.jobs, quiet=args.quiet, cache=args.cache, dask=args.dask)
        jcts = {key: r.jct_s for key, r in zip(points, results, strict=True)}
        for key in points:
            history.append({"parameter": "prefill_speed+overhead", "iteration": len(history), "value": s,
                            "overhead_ms": o_ms, "system": key[0], "agents": key[1], "jct_s": jcts[key],
                            "target_s": targets[key]})  # fmt: skip
        return [math.log(jcts[key] / targets[key]) for key in points], jcts

    def solve(j: list[list[float]], f: list[float]) -> list[float]:
        det = j[0][0] * j[1][1] - j[0][1] * j[1][0]
        if det == 0:
            raise ArithmeticError("singular")
        return [-(j[1][1] * f[0] - j[0][1] * f[1]) / det, -(-j[1][0] * f[0] + j[0][0] * f[1]) / det]

    x = (math.log(speed), overhead_s * 1e3)
    f, jcts = evaluate(x)
    tried = [(max(abs(r) for r in f), x, jcts)]
    steps = (math.log(1.1), 1.0)
    jacobian = [[0.0, 0.0], [0.0, 0.0]]
    for k in range(2):  # finite differences, one parameter at a time
        moved = (x[0] + steps[0], x[1]) if k == 0 else (x[0], x[1] + steps[1])
        fk, jk = evaluate(moved)
        tried.append((max(abs(r) for r in fk), moved, jk))
        for i in range(2):
            jacobian[i][k] = (fk[i] - f[i]) / steps[k]
    limit = math.log(1.0 + TOLERANCE)
    for _ in range(MAX_ITERATIONS):
        if max(abs(r) for r in f) <= limit:
            break
        try:
            dx = solve(jacobian, f)
        except ArithmeticError:
            break
        # keep steps modest (a factor of 1.6 in speed, 5 ms in overhead) and the overhead >= 0
        scale = min(1.0, 0.5 / max(abs(dx[0]), 1e-12), 5.0 / max(abs(dx[1]), 1e-12))
        dx = [dx[0] * scale, dx[1] * scale]
        new = (min(math.log(1.0 / 0.6), max(math.log(0.01), x[0] + dx[0])), max(0.0, x[1] + dx[1]))
        dx = [new[0] - x[0], new[1] - x[1]]
        if dx == [0.0, 0.0]:
            break
        f_new, jcts = evaluate(new)
        tried.append((max(abs(r) for r in f_new), new, jcts))
        df = [f_new[i] - f[i] for i in range(2)]
        norm = dx[0] ** 2 + dx[1] ** 2
        for i in range(2):  # Broyden's update: the Jacobian that explains the last step
            miss = df[i] - (jacobian[i][0] * dx[0] + jacobian[i][1] * dx[1])
            for k in range(2):
                jacobian[i][k] += miss * dx[k] / norm
        x, f = new, f_new
    _, best, best_jcts = min(tried, key=lambda t: t[0])
    return math.exp(best[0]), best[1] / 1e3, best_jcts


def build(args: argparse.Namespace) -> Report:
    rounds = 40 if args.quick else 0
    agents = {n: QUICK_AGENTS[n] if args.quick else n for n in (512, 4096)}
    targets = dict(TARGETS)
    history: list[dict[str, Any]] = []
    line_rate = deployment("ds660b", quick=args.quick, calibrated=False).node.snic_bytes_per_s
    if args.quick:  # the miniature's JCTs at known parameters: checks that the procedure finds a fit
        known = {"prefill_speed": 0.5, "prefill_overhead_s_per_layer": 2e-3, "snic_bytes_per_s": 0.6 * line_rate}
        cells = [Cell({}, apply(deployment("ds660b", quick=True, calibrated=False, agents=agents[n]), known), s,
                      max_rounds=rounds) for s, n in targets]  # fmt: skip
        base = run_cells(cells, args.jobs, quiet=args.quiet, dask=args.dask)
        targets = {key: r.jct_s for key, r in zip(targets, base, strict=True)}
    fitted = {**START, "snic_bytes_per_s": line_rate}

    def config(n: int, **values: float) -> ClusterConfig:
        c = deployment("ds660b", quick=args.quick, calibrated=False, agents=agents[n])
        return apply(c, {**fitted, **values})

    start = (fitted["prefill_speed"], fitted["prefill_overhead_s_per_layer"])
    speed, overhead, jcts = _fit_prefill(targets, *start, config, rounds, args, history)
    fitted.update(prefill_speed=speed, prefill_overhead_s_per_layer=overhead)
    snic, jcts["basic", 512] = _fit("snic_bytes_per_s", "basic", targets["basic", 512], line_rate,
                                    (line_rate / 16, line_rate), lambda x: config(512, snic_bytes_per_s=x), rounds,
                                    args, history)  # fmt: skip
    fitted["snic_bytes_per_s"] = snic
    # Basic slower than its target even at the line rate: nothing to fit, the rate is the NIC's
    at_line_rate = snic >= line_rate and jcts["basic", 512] > targets["basic", 512]

    def comparison(key: tuple[str, int], target: float) -> Comparison:
        system, n = key
        loose = at_line_rate and key == ("basic", 512)
        tolerance = LINE_RATE_TOLERANCE if loose else TOLERANCE
        text = f"±{TOLERANCE:.0%}" + (f", or over it at the line rate (±{LINE_RATE_TOLERANCE:.0%})" if loose else "")
        met = abs(jcts[key] / target - 1) <= tolerance
        return Comparison(
            f"{system.capitalize()} JCT, DS 660B 64K {agents[n]} agents (s)", target, jcts[key], text, met
        )

    comparisons = [comparison(key, target) for key, target in targets.items()]
    if args.write and not args.quick:
        record = {**fitted, "targets_s": {f"{s}@{n}": t for (s, n), t in targets.items()}, "history": history,
                  "line_rate_snic_bytes_per_s": TESTBED_NODE.snic_bytes_per_s}  # fmt: skip
        CALIBRATION_FILE.write_text(json.dumps(record, indent=2) + "\n")
    columns = {key: None for row in history for key in row}  # every row with every column (CSV, tables)
    history = [{**columns, **row} for row in history]
    return Report(
        name="calibrate",
        title="fit prefill speed and overhead on Oracle (4,096 and 512 agents) and the storage-NIC rate on Basic "
              "(512 agents); DS 660B 2P4D, 64K",
        rows=history,
        comparisons=comparisons,
        checks={"every fit converged": all(c.met for c in comparisons)},
        notes=[f"fitted: prefill_speed {fitted['prefill_speed']:.3f} (prefill efficiencies × it), prefill overhead "
               f"{fitted['prefill_overhead_s_per_layer'] * 1e3:.2f} ms per layer, storage-NIC rate {snic / 1e9:.1f} GB/s"
               + (f"; written to {CALIBRATION_FILE}" if args.write and not args.quick else "")],
    )  # fmt: skip


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--write", action="store_true", help=f"write the fit to {CALIBRATION_FILE.name}")


def main(argv: list[str] | None = None) -> int:
    return experiment_main("calibrate", help_description(__doc__), build, argv, configure=_configure)
