"""What a live run's directory holds, as data: the cluster's description (its configuration and system, by a
generic dataclass <-> plain-data conversion driven by the dataclasses' fields and type hints) and the run
scenario (``run.toml``, written from data by :func:`toml_text`). Every process of the run reads these, on
any host that has a copy of the directory."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import json
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.systems import System
from dualpath_emu.cluster.user_systems import SystemLoader

__all__ = ["config_from_wire", "config_to_wire", "from_wire", "system_from_wire", "system_to_wire", "to_wire",
           "toml_text", "write_private"]  # fmt: skip

T = TypeVar("T")


def to_wire(value: Any) -> Any:
    """``value`` as plain data: a dataclass by its fields (nested too), tuples as lists, an enum by its value."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_wire(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, (tuple, list)):
        return [to_wire(v) for v in value]
    if isinstance(value, Mapping):
        return {k: to_wire(v) for k, v in value.items()}
    return value.value if isinstance(value, enum.Enum) else value


def from_wire(cls: type[T], data: Any) -> T:
    """The inverse of :func:`to_wire` for dataclass ``cls``, by type hints; :class:`ValueError` on bad data."""
    return typing.cast(T, _decode(cls, data, cls.__name__))


def _decode(hint: Any, data: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a table of {hint.__name__}'s fields, got {type(data).__name__}")
        hints = typing.get_type_hints(hint)
        fields = {f.name for f in dataclasses.fields(hint) if f.init}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}")
        required = (f.name for f in dataclasses.fields(hint) if f.init and f.default is f.default_factory is MISSING)
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
        return hint(**{name: _decode(hints[name], value, f"{where}.{name}") for name, value in data.items()})
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        problems = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _decode(option, data, where)
            except ValueError as error:
                problems.append(str(error))
        raise ValueError("; ".join(problems))
    if origin is Literal:
        if data not in args:
            raise ValueError(f"{where}: expected one of {', '.join(map(repr, args))}, got {data!r:.80}")
        return data
    if origin in (tuple, list):
        if not isinstance(data, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {type(data).__name__}")
        kinds = [args[0]] * len(data) if origin is list or args[-1:] == (...,) else list(args)
        if len(kinds) != len(data):
            raise ValueError(f"{where}: expected {len(kinds)} items, got {len(data)}")
        return origin(_decode(k, v, f"{where}[{i}]") for i, (k, v) in enumerate(zip(kinds, data)))
    if origin in (dict, Mapping) or hint is dict:
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a table, got {type(data).__name__}")
        key, value = args or (Any, Any)
        return {_decode(key, k, where): _decode(value, v, f"{where}[{k!r}]") for k, v in data.items()}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(data)
        except ValueError:
            raise ValueError(f"{where}: expected a {hint.__name__}, got {data!r:.80}") from None
    if hint is Any:
        return data
    accepted = (int, float) if hint is float else hint  # an int where a float may be: as written
    if not isinstance(hint, type) or not isinstance(data, accepted) or (isinstance(data, bool) and hint is not bool):
        raise ValueError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {type(data).__name__}")
    return data


def config_to_wire(config: ClusterConfig) -> dict[str, Any]:
    return typing.cast(dict[str, Any], to_wire(config))


def config_from_wire(data: Mapping[str, Any]) -> ClusterConfig:
    return from_wire(ClusterConfig, data)


def system_to_wire(system: System) -> dict[str, Any]:
    """A system as data; a user's policy class by its module (or file) and name, loadable everywhere."""
    scheduler = system.scheduler
    policy: dict[str, str] | str
    if isinstance(scheduler, str):
        policy = scheduler
    elif "<locals>" in scheduler.__qualname__:
        raise ValueError(
            f"system {system.name!r}: its policy {scheduler.__qualname__} is defined inside a function; a "
            "real-time run loads it again in every process, so define it at the top level of a module or file"
        )
    else:
        policy = {"module": scheduler.__module__, "file": inspect.getsourcefile(scheduler) or "",
                  "name": scheduler.__qualname__}  # fmt: skip
    return {**to_wire(dataclasses.replace(system, scheduler="dualpath")), "scheduler": policy}


def system_from_wire(data: Mapping[str, Any]) -> System:
    policy = data["scheduler"]
    scheduler: Any = policy
    if not isinstance(policy, str):
        module_name, name = policy["module"], policy["name"]
        try:
            scheduler = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):  # a module loaded from a file: load the file again
            loader = SystemLoader(Path("/"), "the run's description")
            scheduler = loader.load(f"{policy['file']}:{name}").scheduler
    return dataclasses.replace(from_wire(System, {**data, "scheduler": "dualpath"}), scheduler=scheduler)


def toml_text(data: Mapping[str, Any]) -> str:
    """``data`` (a run scenario: one level of tables) as TOML, checked to read back as ``data``."""
    lines = [f"{k} = {_toml(v)}" for k, v in data.items() if not isinstance(v, Mapping) and not _tables(v)]
    for key, value in data.items():
        for table in [value] if isinstance(value, Mapping) else value if _tables(value) else []:
            lines += ["", f"[[{key}]]" if _tables(value) else f"[{key}]"]
            lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != data:
        raise ValueError(f"cannot write as TOML: {data!r:.200}")
    return text


def _tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):  # a JSON string is a TOML basic string, but for DEL
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as a TOML value")


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, readable by this user alone."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
