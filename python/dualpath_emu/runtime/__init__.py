"""The runtime: what runs engines and actors, in virtual or real time.

:mod:`dualpath_emu.runtime.engine` is the engine contract (state machines fed inputs with the time, outputs to an
outbox and a data plane); :mod:`dualpath_emu.runtime.virtual` the virtual-time driver that steps engines over
the in-process core without asyncio; :mod:`dualpath_emu.runtime.engine_actor` the live driver's shell, an actor
around each engine. :mod:`dualpath_emu.runtime.actors` holds the actors; the two event loops are clocks, not data
planes: :mod:`dualpath_emu.runtime.virtual_loop` :class:`VirtualTimeLoop` (an asyncio loop on the core's virtual
clock, for the actor runtime's own applications) and :mod:`dualpath_emu.runtime.realtime` :class:`RealTimeLoop`
(every live process's, on its data plane's clock). :mod:`dualpath_emu.runtime.core_work` is the live data
planes' common part, :mod:`dualpath_emu.runtime.zmq_transport` the ZeroMQ transport between actor systems on a
real-time loop, and :mod:`dualpath_emu.runtime.security` who may use it (a run's CURVE keys);
:mod:`dualpath_emu.runtime.dataplane` the data-plane service that owns a real-time run's only core and the
:class:`RemoteDataPlane` that reaches it from other processes (issue 14).
"""

from dualpath_emu.runtime.actors import (
    MAIN,
    Actor,
    ActorError,
    ActorFailure,
    ActorStoppedError,
    ActorSystem,
    Event,
    UnhandledMessageError,
    UnknownActorError,
    handles,
)
from dualpath_emu.runtime.core_work import ForwardRank, LayerTransfer
from dualpath_emu.runtime.dataplane import DataPlaneService, RemoteDataPlane, ServiceCore
from dualpath_emu.runtime.realtime import RealTimeLoop, WallClockCore
from dualpath_emu.runtime.zmq_transport import (
    BacklogFullError,
    ErrorReply,
    NoneReply,
    RemoteError,
    ZmqActorSystem,
    register_transport_messages,
)
from dualpath_emu.runtime.virtual_loop import (
    Completion,
    DeadlockError,
    UnexpectedCompletionError,
    VirtualTimeLoop,
    run,
)

__all__ = [
    "MAIN",
    "Actor",
    "ActorError",
    "ActorFailure",
    "ActorStoppedError",
    "ActorSystem",
    "BacklogFullError",
    "Completion",
    "DataPlaneService",
    "DeadlockError",
    "ErrorReply",
    "Event",
    "ForwardRank",
    "LayerTransfer",
    "NoneReply",
    "RealTimeLoop",
    "RemoteDataPlane",
    "RemoteError",
    "ServiceCore",
    "UnexpectedCompletionError",
    "UnhandledMessageError",
    "UnknownActorError",
    "VirtualTimeLoop",
    "WallClockCore",
    "ZmqActorSystem",
    "handles",
    "register_transport_messages",
    "run",
]
