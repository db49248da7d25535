"""Applications: what a run scenario runs (its messages, actors, core ports and driver) (issue 3).

An :class:`Application` is the unit the runners of :mod:`dualpath_emu.runtime.node` and
:mod:`dualpath_emu.runtime.launcher` know how to start, in virtual time in one process or in real time
across processes: the same actor classes either way. A scenario names it (``app = "pipeline"``) and
configures it in the table of that name (``[pipeline]``).

To add one, subclass :class:`Application` and add ``name -> "module:Class"`` to :data:`APPLICATIONS`.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from dualpath_emu._core import Core
from dualpath_emu.config import ScenarioError, Table
from dualpath_emu.inputs import short_repr
from dualpath_emu.messages import MessageRegistry
from dualpath_emu.runtime.actors import Actor, ActorSystem
from dualpath_emu.runtime.core_work import CoreLayout, core_layout
from dualpath_emu.runtime.realtime import WallClockCore

if TYPE_CHECKING:  # the scenario module imports this one
    from dualpath_emu.runtime.scenario import RunDescription, RunScenario
    from dualpath_emu.runtime.security import RunKeys

__all__ = ["APPLICATIONS", "SERVICE_REPORT", "Application", "application_class"]

SERVICE_REPORT: Final = "dataplane.report.json"
"""The file of a real-time run's directory that :meth:`Application.service_report` goes to (written by the
data-plane process once drained, or by the one process of a one-process run)."""

APPLICATIONS: Final[dict[str, str]] = {
    "pipeline": "dualpath_emu.apps.pipeline:Pipeline",
    "cluster": "dualpath_emu.cluster.live:ClusterApplication",
}
"""Application name -> ``"module:Class"``; imported only when a scenario names it."""


class Application(ABC):
    """A runnable set of actors. ``config`` is the scenario's table named after the application; the
    constructor reads its keys (and calls ``config.finish()``) so that a bad value is reported up front.
    """

    name: ClassVar[str]

    @abstractmethod
    def __init__(self, config: Table) -> None: ...

    @abstractmethod
    def registry(self) -> MessageRegistry:
        """Every message type the actors exchange (the ZeroMQ transport encodes them)."""

    @abstractmethod
    def actor_names(self) -> list[str]:
        """The names of the application's actors, in a fixed order."""

    @property
    @abstractmethod
    def driver_actor(self) -> str:
        """The driver (:meth:`drive`) runs in the process that hosts this actor."""

    @abstractmethod
    def build_core(self, core: Core) -> None:
        """Add the ports and storage the actors use to the run's core: in virtual time and in a one-process
        real-time run this process's, across processes only the data plane's (the others get
        :meth:`use_layout`)."""

    def use_layout(self, layout: CoreLayout) -> None:
        """In a process of a real-time run without the core (the data plane has it), learn the ids of the
        ports and storage nodes :meth:`build_core` made there, before any actor is created.

        By default :meth:`build_core` runs on a scratch virtual core (so an application that keeps the ids it
        gets there works unchanged) and its layout must be the data plane's: a scenario that differs between
        processes is an error, not a run over the wrong ports. Override it to look ids up by name instead.
        """
        scratch = Core()
        self.build_core(scratch)
        mine = core_layout(scratch)
        if dict(mine.ports) != dict(layout.ports) or dict(mine.storage_nodes) != dict(layout.storage_nodes):
            raise ScenarioError(
                f"application {self.name!r}: the data plane's ports and storage nodes differ from the ones this "
                "process's scenario builds (is every process of the run given the same scenario?)"
            )

    def core_options(self) -> dict[str, Any]:
        """Keyword arguments for the run's ``Core`` beyond its clock (e.g. ``sample_interval_ns``); none by
        default."""
        return {}

    def service_report(self, core: Core) -> dict[str, Any] | None:
        """The application's report of the run's core once the run is over (JSON-able), written to
        :data:`SERVICE_REPORT` in the run directory by the process that owns the core; ``None`` (the
        default): none."""
        return None

    def write_part(self, path: Path) -> None:
        """Write this process's share of a real-time run (its metrics, say) to ``path`` when it stops, for
        the application to merge afterwards; nothing by default."""

    def host_plane(
        self, core: Core, process: str, scenario: RunScenario, description: RunDescription, keys: RunKeys | None,
        run_dir: Path,
    ) -> WallClockCore:  # fmt: skip
        """The data plane of process ``process`` on the host backend (``backend = "host"``): a plane on ``core``
        (this process's wall-clock core, built by :meth:`build_core`) that moves real bytes, whose ``run(main)``
        runs ``main`` inside the backend's set-up and tear-down. By default an application has no host
        backend."""
        raise ScenarioError(f"application {self.name!r} has no host backend (backend = \"host\")")

    @abstractmethod
    def create_actor(self, system: ActorSystem, name: str) -> Actor:
        """Create (and so register) actor ``name`` in ``system``; it is started by the runner. Its data plane is
        the system's (``system.data_plane``: the core in virtual time, the data-plane service or the host
        backend live)."""

    @abstractmethod
    async def drive(self, system: ActorSystem) -> dict[str, Any]:
        """Drive the run from outside the actors; return its JSON-able summary when it is complete."""


def application_class(name: str, source: str = "scenario", key: str = "app") -> type[Application]:
    """The application class called ``name`` (a :class:`ScenarioError` naming ``source`` and ``key`` if none)."""
    target = APPLICATIONS.get(name)
    if target is None:
        known = ", ".join(repr(n) for n in sorted(APPLICATIONS))
        raise ScenarioError(f"{source}: key {key!r}: expected one of {known}, got {short_repr(name)}")
    module_name, _, class_name = target.partition(":")
    cls: type[Application] = getattr(importlib.import_module(module_name), class_name)
    return cls
