"""A harness that runs one actor-runtime test over ZeroMQ (issue 3: "the runtime's test suite runs on both"
transports; in process, the servers' own actors talk as in a live run's process).

A test asks the ``transport`` fixture (a :class:`Transport`) for a :class:`Harness`, creates its actors in
``h.system``, sends from ``h.sender`` and runs its driver with ``h.run(main())``:

``zmq-ipc`` and ``zmq-tcp`` (:class:`ZmqHarness`)
    Two :class:`~dualpath_emu.runtime.zmq_transport.ZmqActorSystem`\\ s on one ordinary asyncio loop: ``system`` is the
    "server" that hosts the actors, ``sender`` the "client" the driver sends from. Both bind ``ipc://``
    endpoints in a (private) directory under pytest's base temporary directory, or ``tcp://127.0.0.1``
    with a fresh run's CURVE keys (processes ``server`` and ``client``); when :meth:`Harness.run` starts, the
    client's address book routes the name of every actor the server has then to the server's endpoint, so
    every tell and ask of the driver is encoded with the :class:`~dualpath_emu.messages.Codec` and crosses
    ZeroMQ (each system has its own registry of the test's message types). Asks between the server's own
    actors stay in-process. Time is real, every wait is bounded: a driver's ask gets
    ``h.timeout_s``, :meth:`Harness.wait` polls at most :data:`WAIT_S`, the whole run is cut at
    :data:`RUN_LIMIT_S`.

The driver runs as the ``main`` of ``h.system.run``, so a failing tell still ends the run with
:class:`~dualpath_emu.runtime.actors.ActorFailure`.
"""

from __future__ import annotations

import abc
import asyncio
import shutil
import tempfile
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, ClassVar, Final, TypeVar

import pytest

from dualpath_emu.messages import Codec, Message, MessageRegistry
from dualpath_emu.runtime.actors import DEFAULT_FAILURE_EVENTS, ActorSystem
from dualpath_emu.runtime.zmq_transport import ZmqActorSystem
from dualpath_emu.runtime.security import RunKeys

__all__ = ["RUN_LIMIT_S", "TRANSPORTS", "WAIT_S", "Harness", "Transport", "ZmqHarness"]

_T = TypeVar("_T")

TRANSPORTS: Final = ("zmq-ipc", "zmq-tcp")
"""The parameters of the ``transport`` fixture."""

WAIT_S: Final = 4.0
"""Over ZeroMQ: the timeout of a driver's ask and the bound of :meth:`Harness.wait` (a healthy run needs
milliseconds)."""

RUN_LIMIT_S: Final = 8.0
"""Over ZeroMQ: the bound on a whole run (opening, the driver, closing)."""

POLL_S: Final = 0.001
"""How often :meth:`Harness.wait` checks its condition in real time."""

MAX_IPC_PATH: Final = 100
"""The longest ``ipc://`` socket path used (the OS limit is ``sizeof(sun_path)``, about 107 bytes)."""


class Harness(abc.ABC):
    """One test's actor systems on one transport (see the module docstring)."""

    name: ClassVar[str]
    over_wire: ClassVar[bool]
    """Whether the driver's messages are encoded and cross ZeroMQ."""
    timeout_s: ClassVar[float]
    """The timeout to give every ask of the driver."""

    system: ActorSystem
    """Where the actors under test live: create them here."""
    sender: ActorSystem
    """What the driver tells and asks from (as ``main``)."""

    @abc.abstractmethod
    def run(self, main: Coroutine[Any, Any, _T]) -> _T:
        """Run ``main`` as the driver of ``system`` (``system.run``) and return its result.

        Raises what ``main`` raises, or :class:`~dualpath_emu.runtime.ActorFailure` when a tell failed.
        """

    async def wait(self, until: Callable[[], bool]) -> None:
        """Let the actors work until ``until()`` holds: poll it every :data:`POLL_S`, at most :data:`WAIT_S`
        (``TimeoutError`` after that)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while not until():
            if loop.time() > deadline:
                raise TimeoutError(f"the condition did not hold within {WAIT_S} s")
            await asyncio.sleep(POLL_S)


class ZmqHarness(Harness):
    """A server :class:`ZmqActorSystem` hosting the actors and a client one the driver sends from."""

    name = "zmq"
    over_wire = True
    timeout_s = WAIT_S

    def __init__(
        self,
        messages: Iterable[type[Message]],
        ipc_dir: Path,
        *,
        tcp: bool = False,
        latency_s: float = 0.0,
        failure_events: int = DEFAULT_FAILURE_EVENTS,
    ) -> None:
        messages = tuple(messages)
        self.tcp = tcp
        if tcp:  # loopback with the run's CURVE keys
            keys = RunKeys.generate(ipc_dir / "keys", ["server", "client"])
            server_options: dict[str, Any] = {"bind": "tcp://127.0.0.1:*", "keys": keys, "name": "server"}
            client_options: dict[str, Any] = {"bind": "tcp://127.0.0.1:*", "keys": keys, "name": "client"}
        else:
            server_options = {"bind": f"ipc://{ipc_dir}/server"}
            client_options = {"bind": f"ipc://{ipc_dir}/client"}
        self.server = ZmqActorSystem(
            Codec(_registry(messages)), latency_s=latency_s, failure_events=failure_events, **server_options
        )
        self.client = ZmqActorSystem(Codec(_registry(messages)), **client_options)
        self.system = self.server
        self.sender = self.client

    def run(self, main: Coroutine[Any, Any, _T]) -> _T:
        server, client = self.server, self.client

        async def driven() -> _T:
            async with server, client:
                for actor in server.actors:
                    client.add_route(actor.name, server.endpoint, "server")
                return await server.run(main)

        try:
            return asyncio.run(asyncio.wait_for(driven(), RUN_LIMIT_S))
        finally:
            main.close()  # a no-op once it ran; else no "never awaited" warning


def _registry(messages: tuple[type[Message], ...]) -> MessageRegistry:
    registry = MessageRegistry()
    for cls in messages:
        registry.register(cls)
    return registry


class Transport:
    """What the ``transport`` fixture gives a test: one transport's name and its harnesses.

    ``messages`` are the test module's message types (every one the driver sends or gets back must be
    registered for ZeroMQ); ``tmp_path_factory`` gives each ZeroMQ harness a directory for its sockets.
    Call :meth:`cleanup` when the test ends.
    """

    def __init__(
        self, name: str, messages: Iterable[type[Message]], tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        if name not in TRANSPORTS:
            raise ValueError(f"unknown transport {name!r}, expected one of {TRANSPORTS}")
        self.name = name
        self.messages = tuple(messages)
        self._tmp_path_factory = tmp_path_factory
        self._own_dirs: list[str] = []

    def harness(self, *, latency_s: float = 0.0, failure_events: int = DEFAULT_FAILURE_EVENTS) -> Harness:
        """A new harness: actor systems with this delivery latency and failure record."""
        return ZmqHarness(
            self.messages,
            self._ipc_dir(),
            tcp=self.name == "zmq-tcp",
            latency_s=latency_s,
            failure_events=failure_events,
        )

    def _ipc_dir(self) -> Path:
        path = self._tmp_path_factory.mktemp("zmq")
        if len(f"{path}/server") <= MAX_IPC_PATH:
            return path
        short = tempfile.mkdtemp(prefix="dpz")  # a long --basetemp: fall back to a short directory
        self._own_dirs.append(short)
        return Path(short)

    def cleanup(self) -> None:
        """Remove the directories made outside pytest's base temporary directory."""
        for path in self._own_dirs:
            shutil.rmtree(path, ignore_errors=True)
        self._own_dirs.clear()
