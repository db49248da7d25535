"""Stub of the Rust extension module (core/src/python.rs); kept honest by ``mypy.stubtest``."""

__all__ = [
    "__version__",
    "CoreError",
    "InvalidArgumentError",
    "UnknownNameError",
    "ConfigError",
    "StateError",
    "CoreIOError",
]

__version__: str

class CoreError(Exception):
    """Base class of every error raised by the dualpath-emu core."""

class InvalidArgumentError(CoreError, ValueError):
    """An argument has a bad value; the message names the argument and what was expected."""

class UnknownNameError(CoreError, LookupError):
    """A port, node or transfer id or name that does not exist."""

class ConfigError(CoreError, ValueError):
    """A configuration (e.g. an arbitration table) that cannot be honoured."""

class StateError(CoreError, RuntimeError):
    """The operation is not allowed in the core's current state."""

class CoreIOError(CoreError, OSError):
    """Reading or writing a file failed."""
