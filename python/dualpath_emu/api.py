"""The Python API: load a scenario, change what you like, run systems, look at the results (README, "Python API").

A scenario is a packaged scenario's name (:func:`scenario_names`), a TOML file, or ``None`` (DS 660B 2P4D, offline); a
system a built-in one's name, ``file.py:Name`` or ``module:Name`` (:mod:`dualpath_emu.cluster.user_systems`), or a
:class:`~dualpath_emu.cluster.systems.System` object; a workload the scenario's, or trajectories built in Python
(:class:`Trajectory`). Runs are in virtual time and deterministic. A bad scenario, key or system is a
:class:`~dualpath_emu.config.ScenarioError` with one line naming the file, the key and what was expected."""

from __future__ import annotations

import csv
import importlib
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dualpath_emu.cluster.outputs import make_output_folder, summary, trace_file, write_outputs, write_requests
from dualpath_emu.cluster.run import Progress, SystemResult, run_system, speedup
from dualpath_emu.cluster.run_cli import load_scenario as _load
from dualpath_emu.cluster.scenario import ClusterScenario
from dualpath_emu.cluster.policies import (
    DecodeAssignment, DecodeRoute, DecodeView, DualPathPolicy, EngineState, GroupState, Health, Policy,
    PrefillAssignment, PrefillView, ReadSide, ReadView, Request, RoundRobinPolicy, RouteView,
)  # fmt: skip
from dualpath_emu.cluster.systems import SYSTEMS, System
from dualpath_emu.config import ScenarioError, load_toml
from dualpath_emu.scenarios import names as _packaged_names
from dualpath_emu.scenarios import path as _packaged_path
from dualpath_emu.workload.trajectory import Trajectory

__all__ = [
    "BUILT_IN_SYSTEMS", "ClusterScenario", "DecodeAssignment", "DecodeRoute", "DecodeView", "DualPathPolicy",
    "EngineState", "GroupState", "Health", "Policy", "PrefillAssignment", "PrefillView", "Progress", "ReadSide",
    "ReadView", "Request", "RoundRobinPolicy", "RouteView", "RunResult", "ScenarioError", "System", "SystemResult",
    "Trajectory", "load_scenario", "run", "scenario_names",
]  # fmt: skip

BUILT_IN_SYSTEMS: Final[Mapping[str, System]] = SYSTEMS  # The built-in systems by name (read-only).

Row = dict[str, int | float | str | None]
"""One row of ``requests.csv``: column name -> value (``None`` where the CSV cell is empty)."""


def scenario_names() -> list[str]:
    """The names of the packaged cluster scenarios (``dualpath-emu run --list`` describes them)."""
    return [name for name in _packaged_names() if "kind" in load_toml(_packaged_path(name))]


def load_scenario(scenario: str | Path | None = None, *, overrides: Mapping[str, object] | None = None,
                  agents: int | None = None, seed: int | None = None,
                  systems: Sequence[str | System] | None = None) -> ClusterScenario:  # fmt: skip
    """A cluster scenario, checked: ``overrides`` (dotted keys) set before the checks, then the CLI-like options."""
    loaded = _load(scenario, dict(overrides) if overrides else None)
    return loaded.with_overrides(systems=systems, agents=agents, seed=seed)


def run(scenario: ClusterScenario | str | Path | None = None, *, systems: Sequence[str | System] | None = None,
        agents: int | None = None, seed: int | None = None, progress: Callable[[Progress], None] | None = None,
        out: str | Path | None = None, workload: Iterable[Trajectory] | None = None,
        trace: bool = False) -> RunResult:  # fmt: skip
    """Run every system of ``scenario`` on one workload in virtual time (``systems``, ``agents``, ``seed`` override it;
    ``workload``: trajectories instead of its dataset); ``out``, ``trace``: as ``run``'s."""
    if trace and out is None:
        raise ValueError("trace=True writes a Perfetto trace per system into out: give out=DIR too")
    if not isinstance(scenario, ClusterScenario):
        scenario = load_scenario(scenario)
    if workload is not None:
        scenario = scenario.with_workload(workload)
    scenario = scenario.with_overrides(systems=systems, agents=agents, seed=seed)
    directory = None if out is None else Path(out)
    if directory is not None:
        make_output_folder(directory, "out")
    trajectories = scenario.trajectories()
    results: dict[str, SystemResult] = {}
    for name in scenario.systems:
        results[name] = run_system(
            scenario.config, scenario.system(name), trajectories, seed=scenario.seed, progress=progress,
            trace_path=trace_file(directory, name) if directory is not None and trace else None,
        )  # fmt: skip
    if directory is not None:
        write_outputs(directory, "out", scenario, results)
    return RunResult(scenario, results)


@dataclass
class RunResult:
    """The results of :func:`run`: one :class:`SystemResult` per system, in the scenario's order."""

    scenario: ClusterScenario
    results: dict[str, SystemResult]
    _csv: str | None = field(default=None, init=False, repr=False)

    @property
    def systems(self) -> list[str]:
        return list(self.results)

    @property
    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` (and ``dualpath-emu run --json``) holds."""
        return summary(self.scenario, self.results)

    @property
    def jct_s(self) -> dict[str, float]:
        """Each system's job completion time (s)."""
        return {name: r.jct_s for name, r in self.results.items()}

    def speedup(self, baseline: str = "basic") -> dict[str, float | None]:
        """Each system's speedup over ``baseline``; ``None`` where either run failed requests."""
        if baseline not in self.results:
            raise KeyError(f"no system {baseline!r} in this run (its systems: {', '.join(self.results)})")
        base = self.results[baseline]
        return {name: speedup(base, r)[0] for name, r in self.results.items()}

    @property
    def complete(self) -> bool:
        """Whether every system finished every turn of the workload (no request failed)."""
        return all(r.complete for r in self.results.values())

    @property
    def incomplete(self) -> dict[str, str]:
        """Per system that did not finish its workload, why (its failed requests and agents)."""
        return {name: r.incomplete for name, r in self.results.items() if r.incomplete is not None}

    def requests_csv(self) -> str:
        """``requests.csv`` as text: one row per request per system."""
        if self._csv is None:
            text = io.StringIO(newline=None)  # "\n" line ends, as the file reads back in text mode
            write_requests(text, self.results)
            self._csv = text.getvalue()
        return self._csv

    def rows(self) -> list[Row]:
        """``requests.csv``'s rows as typed dicts, ``None`` where the CSV cell is empty (a time never reached)."""
        reader = csv.DictReader(io.StringIO(self.requests_csv()))
        return [{key: _typed(key, value) for key, value in row.items()} for row in reader]

    def to_pandas(self) -> Any:
        """The rows of :meth:`rows` as a ``pandas.DataFrame`` (pandas is no dependency: install it yourself)."""
        try:
            pandas = importlib.import_module("pandas")
        except ModuleNotFoundError:
            raise ModuleNotFoundError(
                "RunResult.to_pandas() needs pandas, which dualpath-emu does not install: pip install pandas "
                "(or use RunResult.rows(), plain dicts)"
            ) from None
        return pandas.read_csv(io.StringIO(self.requests_csv()), dtype={"system": str, "read_side": str})


_STRINGS: Final = frozenset({"system", "read_side"})


def _typed(column: str, text: str | None) -> int | float | str | None:
    if column in _STRINGS:
        return text
    if text is None or text == "":
        return None
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text
