"""The actor runtime (issue 3): the loop that actors run on, in virtual or real time.

:mod:`dualpath_emu.runtime.virtual_loop` holds :class:`VirtualTimeLoop`, an asyncio event loop whose clock
is the core's virtual clock.
"""

from dualpath_emu.runtime.virtual_loop import (
    Completion,
    DeadlockError,
    UnexpectedCompletionError,
    VirtualTimeLoop,
    run,
)

__all__ = ["Completion", "DeadlockError", "UnexpectedCompletionError", "VirtualTimeLoop", "run"]
