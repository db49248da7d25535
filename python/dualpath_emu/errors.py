"""The exceptions of dualpath-emu.

The core's errors are created in Rust (``dualpath_emu._core``) with ``__module__ == "dualpath_emu.errors"``
and re-exported here, their stable home. Each subclass also derives from the built-in exception a caller
would expect, so ``except ValueError`` catches a bad argument.
"""

from dualpath_emu._core import (
    ConfigError,
    CoreError,
    CoreIOError,
    InvalidArgumentError,
    StateError,
    UnknownNameError,
)

__all__ = [
    "ConfigError",
    "CoreError",
    "CoreIOError",
    "InvalidArgumentError",
    "StateError",
    "UnknownNameError",
    "UsageError",
]


class UsageError(Exception):
    """Bad command-line input: the CLI prints the message on one line and exits with status 2."""
