"""Applications and backends: what a run scenario runs, and how its processes get their data plane (issues 3, 35).

An :class:`Application` is the unit the runners of :mod:`dualpath_emu.runtime.node` and
:mod:`dualpath_emu.runtime.launcher` know how to start across processes. A :class:`Backend` says how a live process gets
its data plane (the data-plane service's modelled core, or a plane that moves real bytes). The runtime knows neither its
applications nor the backends beyond its own (``model``): a :class:`Registry` of both, by name, is handed to it by
whoever starts it (the command line hands the cluster's, :func:`dualpath_emu.cluster.live.registry`). A scenario names
its application (``app = "cluster"``, configured in the table of that name) and its backend (``backend = "model"``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

from dualpath_emu._core import Core
from dualpath_emu.config import ScenarioError, Table
from dualpath_emu.inputs import short_repr
from dualpath_emu.messages import MessageRegistry
from dualpath_emu.runtime.core_work import CoreLayout, core_layout

if TYPE_CHECKING:  # the scenario module imports this one; the actor runtime loads asyncio and ZeroMQ
    from dualpath_emu.runtime.actors import Actor, ActorSystem
    from dualpath_emu.runtime.dataplane.remote import RemoteDataPlane
    from dualpath_emu.runtime.realtime import WallClockCore
    from dualpath_emu.runtime.scenario import RunDescription, RunScenario
    from dualpath_emu.runtime.security import RunKeys

__all__ = ["SERVICE_REPORT", "Application", "Backend", "PlaneRequest", "Registry"]

_E = TypeVar("_E")

SERVICE_REPORT: Final = "dataplane.report.json"
"""The file of a real-time run's directory that :meth:`Application.service_report` goes to."""


class Application(ABC):
    """A runnable set of actors; the constructor reads ``config`` (its table) so a bad value is reported up front."""

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
        """Add the ports and storage the actors use to a core (the data plane's, or a process's own)."""

    def use_layout(self, layout: CoreLayout) -> None:
        """In a process without the core, learn the ids of the ports and storage nodes of the data plane's."""
        scratch = Core()
        self.build_core(scratch)
        mine = core_layout(scratch)
        if dict(mine.ports) != dict(layout.ports) or dict(mine.storage_nodes) != dict(layout.storage_nodes):
            raise ScenarioError(
                f"application {self.name!r}: the data plane's ports and storage nodes differ from the ones this "
                "process's scenario builds (is every process of the run given the same scenario?)"
            )

    def core_options(self) -> dict[str, Any]:
        """Keyword arguments for the run's ``Core`` beyond its clock (e.g. ``sample_interval_ns``); none by default."""
        return {}

    def service_report(self, core: Core) -> dict[str, Any] | None:
        """The application's report of the core after the run (to :data:`SERVICE_REPORT`); ``None``: none."""
        return None

    def write_part(self, path: Path) -> None:
        """Write this process's share of a real-time run to ``path`` when it stops; nothing by default."""

    @abstractmethod
    def create_actor(self, system: ActorSystem, name: str, *, restarted: bool = False) -> Actor:
        """Create (and so register) actor ``name`` in ``system``, its data plane the system's; the runner starts it.
        ``restarted``: it is a new process's, in place of one that died (``--restart-crashed``)."""

    @abstractmethod
    async def drive(self, system: ActorSystem) -> dict[str, Any]:
        """Drive the run from outside the actors; return its JSON-able summary when it is complete."""


@dataclass(frozen=True)
class PlaneRequest:
    """What a :class:`Backend` is told when it builds process ``process``'s data plane."""

    app: Application
    process: str
    scenario: RunScenario
    description: RunDescription
    keys: RunKeys | None
    run_dir: Path
    incarnation: int = 0


@dataclass(frozen=True)
class Backend:
    """How a live process gets its data plane, by name (``backend = "model"`` in a run scenario): ``plane(request)``
    builds it (its ``new_loop()`` is the process's loop). ``shares_core``: the processes share one modelled core,
    the data-plane service's (``model``); otherwise each drives its own core from one clock origin and moves real
    bytes to the others over a byte channel (``host``)."""

    name: str
    plane: Callable[[PlaneRequest], WallClockCore | RemoteDataPlane]
    shares_core: bool = True


@dataclass(frozen=True)
class Registry:
    """The applications and backends a runtime can start, by name (handed in, never global)."""

    applications: Mapping[str, type[Application]]
    backends: Mapping[str, Backend]

    def application(self, name: str, source: str = "scenario", key: str = "app") -> type[Application]:
        """The application class called ``name`` (a :class:`ScenarioError` naming ``source`` and ``key`` if none)."""
        return _named(self.applications, name, source, key)

    def backend(self, name: str, source: str = "scenario", key: str = "backend") -> Backend:
        """The backend called ``name`` (a :class:`ScenarioError` naming ``source`` and ``key`` if none)."""
        return _named(self.backends, name, source, key)


def _named(entries: Mapping[str, _E], name: str, source: str, key: str) -> _E:
    entry = entries.get(name)
    if entry is None:
        known = ", ".join(repr(n) for n in sorted(entries))
        raise ScenarioError(f"{source}: key {key!r}: expected one of {known}, got {short_repr(name)}")
    return entry
