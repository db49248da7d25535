"""Systems and policies from the user's own code: ``module:Name`` or ``path/to/file.py:Name`` (``docs/policies.md``).

A file (relative to the scenario's folder, or the current one on the command line) is run afresh for every scenario
loaded; a module is imported once. ``Name`` is, in that module: a :class:`~dualpath_emu.cluster.systems.System` (under
its own ``name``); a :class:`~dualpath_emu.cluster.policies.Policy` subclass, wrapped into a system called ``Name`` with
DualPath's data path and the policy's ``read_both_sides``; else the name of a system in the module's ``SYSTEMS`` (a
list, tuple or mapping), for names that are no Python identifier. A system may not take a built-in system's name.
Whatever cannot be resolved is one :class:`~dualpath_emu.config.ScenarioError` line naming where the spec was given, the
spec and what was expected."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Final

from dualpath_emu.cluster.policies import Policy
from dualpath_emu.cluster.systems import SYSTEMS, System
from dualpath_emu.config import ScenarioError
from dualpath_emu.errors import UsageError

__all__ = ["EXPECTED", "SystemLoader", "is_user_spec", "policy_system", "system_specs"]

EXPECTED: Final = "a System, a Policy subclass, or the name of a system in the module's SYSTEMS"


def is_user_spec(spec: str) -> bool:
    """Whether ``spec`` names user code (``module:Name``, ``file.py:Name``) rather than a built-in system."""
    return ":" in spec


def system_specs(values: Sequence[str]) -> list[str]:
    """The systems of ``--system`` options (repeated or comma-separated), in order; empty: error."""
    specs: list[str] = []
    for value in values:
        parts = [part.strip() for part in value.split(",")]
        if any(not part for part in parts):
            raise UsageError(
                f"--system {value!r}: expected a system, or several separated by commas, e.g. basic,dualpath"
            )
        specs += parts
    return specs


class SystemLoader:
    """Resolves system specs for one scenario: relative paths from ``base``; ``where``: where given."""

    def __init__(self, base: Path, where: str) -> None:
        self.base = base
        self.where = where
        self._files: dict[Path, ModuleType] = {}

    def error(self, spec: str, problem: str) -> ScenarioError:
        """The one-line error for ``spec`` (a spec over 200 characters shown by its ends)."""
        shown = spec if len(spec) <= 200 else f"{spec[:120]}…{spec[-60:]}"
        return ScenarioError(f"{self.where}: {shown!r}: {problem}")

    def load(self, spec: str) -> System:
        """The system ``spec`` names (a built-in one by its name, or user code's)."""
        if not is_user_spec(spec):
            if spec not in SYSTEMS:
                raise self.error(
                    spec, f"expected a built-in system ({', '.join(SYSTEMS)}) or module:Name, file.py:Name"
                )
            return SYSTEMS[spec]
        target, _, name = spec.rpartition(":")
        if not target or not name:
            raise self.error(spec, "expected module:Name or path/to/file.py:Name")
        module = self._file(spec, target) if target.endswith(".py") else self._module(spec, target)
        return self._find(spec, module, name)

    def load_class(self, spec: str, base: type) -> type:
        """The subclass of ``base`` that user spec ``spec`` (``module:Name``, ``file.py:Name``) names."""
        target, _, name = spec.rpartition(":")
        if not target or not name:
            raise self.error(spec, "expected module:Name or path/to/file.py:Name")
        module = self._file(spec, target) if target.endswith(".py") else self._module(spec, target)
        value = getattr(module, name, None) if name.isidentifier() else None
        if not (isinstance(value, type) and issubclass(value, base)):
            source = getattr(module, "__file__", None) or module.__name__
            found = "nothing" if value is None else _describe(value)
            raise self.error(spec, f"expected a subclass of {base.__name__} called {name!r} in {source}, got {found}")
        return value

    def _file(self, spec: str, target: str) -> ModuleType:
        path = (self.base / target).resolve()
        if path in self._files:
            return self._files[path]
        if not path.is_file():
            raise self.error(spec, f"no such file {path}")
        # A name of its own per file (two files may share a stem); in sys.modules while it runs, as the
        # import system does, since dataclasses look their module up there.
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
        module_name = f"_dualpath_emu_user_{path.stem.replace('-', '_')}_{digest}"
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise self.error(spec, f"cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except (Exception, SystemExit) as error:  # the user's code failed (or called sys.exit): say where
            del sys.modules[module_name]
            raise self.error(spec, f"running {path} raised {_where(error, path)}") from None
        self._files[path] = module
        return module

    def _module(self, spec: str, target: str) -> ModuleType:
        if "/" in target or "\\" in target:
            raise self.error(spec, "expected a .py file or a dotted module name before the colon")
        try:
            return importlib.import_module(target)
        except ModuleNotFoundError as error:
            if error.name is not None and (target == error.name or target.startswith(error.name + ".")):
                raise self.error(spec, f"no module named {error.name!r} (a file in this folder: give its path, "
                                       f"{target.replace('.', '/')}.py:Name)") from None  # fmt: skip
            raise self.error(spec, f"importing {target} raised {_where(error)}") from None
        except (Exception, SystemExit) as error:  # sys.exit(0) in it must not end the command with success
            raise self.error(spec, f"importing {target} raised {_where(error)}") from None

    def _find(self, spec: str, module: ModuleType, name: str) -> System:
        source = getattr(module, "__file__", None) or module.__name__
        if name.isidentifier() and hasattr(module, name):
            value = getattr(module, name)
            if isinstance(value, System):
                return value
            if isinstance(value, type) and issubclass(value, Policy):
                try:
                    return policy_system(value, name)
                except ValueError as error:
                    raise self.error(spec, str(error)) from None
            if isinstance(value, Policy):
                raise self.error(spec, f"expected {EXPECTED}, got an instance of {type(value).__name__} (give the "
                                       "class: every run makes its own policy, policies keep state)")  # fmt: skip
            raise self.error(spec, f"expected {EXPECTED}, got {_describe(value)}")
        registry = getattr(module, "SYSTEMS", None)
        if registry is None:
            raise self.error(spec, f"{source} has no attribute {name!r} and no SYSTEMS")
        values = list(registry.values()) if isinstance(registry, Mapping) else registry
        if not isinstance(values, (list, tuple)) or not all(isinstance(s, System) for s in values):
            raise self.error(
                spec, f"{source}: SYSTEMS: expected a list, tuple or mapping of Systems, got {_describe(registry)}"
            )
        systems: list[System] = list(values)
        for system in systems:
            if system.name == name:
                return system
        known = ", ".join(s.name for s in systems) or "none"
        raise self.error(
            spec, f"{source} has no attribute {name!r} and no system of that name in its SYSTEMS (it has: {known})"
        )


def policy_system(cls: type[Policy], name: str | None = None) -> System:
    """A policy class as a system called ``name`` (its class name by default): layerwise, reads on both sides as its
    ``read_both_sides`` default says, its docstring's first line as the description."""
    name = name or cls.__name__
    description = cls.__doc__.strip().split("\n")[0] if cls.__doc__ else name
    return System(name, description, layerwise=True, dual_path=bool(cls.read_both_sides), scheduler=cls)


def _describe(value: object) -> str:
    if isinstance(value, type):
        return f"the class {value.__name__}"
    if callable(value):
        return f"the {type(value).__name__} {getattr(value, '__name__', '')}".rstrip()
    return f"a {type(value).__name__}"


def _where(error: BaseException, path: Path | None = None) -> str:
    """``Type: message (at file:line)``, the line being the innermost frame in ``path`` (or anywhere)."""
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, SyntaxError) and error.filename is not None:
        return f"{type(error).__name__}: {error.msg} (at {error.filename}:{error.lineno})"
    frames = traceback.extract_tb(error.__traceback__)
    mine = [f for f in frames if path is None or Path(f.filename) == path] or frames
    if mine:
        text += f" (at {mine[-1].filename}:{mine[-1].lineno})"
    return text
