"""The actor runtime (issue 3): the loop that actors run on, in virtual or real time.

:mod:`dualpath_emu.runtime.virtual_loop` holds :class:`VirtualTimeLoop`, an asyncio event loop whose clock
is the core's virtual clock; :mod:`dualpath_emu.runtime.actors` the actors that run on it; :mod:`dualpath_emu.runtime.zmq_transport` the
ZeroMQ transport between actor systems on a real-time loop, and :mod:`dualpath_emu.runtime.security` who may
use it (a run's CURVE keys); :mod:`dualpath_emu.runtime.dataplane` the data-plane service that owns a
real-time run's only core and the :class:`RemoteDataPlaneLoop` that reaches it from other processes (issue 14).
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
from dualpath_emu.runtime.dataplane import DataPlaneService, DataPlaneServiceLoop, RemoteDataPlaneLoop
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
    "DataPlaneServiceLoop",
    "DeadlockError",
    "ErrorReply",
    "Event",
    "ForwardRank",
    "LayerTransfer",
    "NoneReply",
    "RemoteDataPlaneLoop",
    "RemoteError",
    "UnexpectedCompletionError",
    "UnhandledMessageError",
    "UnknownActorError",
    "VirtualTimeLoop",
    "ZmqActorSystem",
    "handles",
    "register_transport_messages",
    "run",
]
