"""Reading validated settings from TOML files: every error names the file, the key and what was expected.

A :class:`Table` wraps one TOML table. Its typed getters take a default (the key's documented default) or none
(the key is required), check type and range, and remember which keys were read; :meth:`~Table.finish` then
refuses the keys nobody asked for, so a typo is an error, not a silently ignored setting. Errors are
:class:`ScenarioError` (a :class:`~dualpath_emu.errors.UsageError`: one line, exit status 2)::

    run.toml: key 'process[1].actors': expected a list of strings, got 3"""

from __future__ import annotations

import copy
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from dualpath_emu.errors import UsageError
from dualpath_emu.inputs import MAX_SCENARIO_BYTES, read_input, short_repr, shorten, too_long_number

__all__ = ["REQUIRED", "ScenarioError", "Table", "format_bound", "load_toml"]

_T = TypeVar("_T")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()  # The default of a key that must be given.

_MAX_INT: Final = 2**63 - 1  # The largest integer :meth:`Table.get_int` accepts when the key states no maximum.


class ScenarioError(UsageError):
    """A scenario file that cannot be used: names the file, the key and what was expected."""


def load_toml(path: str | Path) -> Table:
    """The top-level table of the TOML file ``path``: a regular file of at most
    :data:`~dualpath_emu.inputs.MAX_SCENARIO_BYTES`; anything unreadable or invalid is a :class:`ScenarioError`
    naming the file (and the line where known)."""
    source = str(path)
    try:
        data = read_input(path, what="a scenario TOML file", limit_bytes=MAX_SCENARIO_BYTES)
    except UsageError as error:
        raise ScenarioError(str(error)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ScenarioError(
            f"{source}: not valid TOML: line {line}: not UTF-8 text (byte {data[error.start]:#04x})"
        ) from None
    try:
        return Table(tomllib.loads(text), source)
    except tomllib.TOMLDecodeError as error:
        raise ScenarioError(f"{source}: not valid TOML: {shorten(str(error), 200)}") from None
    except RecursionError:
        raise ScenarioError(f"{source}: not valid TOML: arrays or tables nested too deeply") from None
    except ValueError as error:  # an integer of more than 4,300 digits (Python's int-to-str limit)
        raise ScenarioError(f"{source}: not valid TOML: {too_long_number(error)}") from None


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {short_repr(value)}"
    return short_repr(value)


class Table:
    """One TOML table of file ``source``; ``prefix`` is its dotted key path (empty at the top)."""

    def __init__(self, data: dict[str, Any], source: str, prefix: str = "", overrides: Mapping[str, str] | None = None,
                 schema: list[tuple[str, object, str]] | None = None) -> None:  # fmt: skip
        self._data = data
        self.source = source
        self.prefix = prefix
        self._read: set[str] = set()
        self._overrides: Mapping[str, str] = overrides or {}
        """Dotted key path -> how it was set from outside the file (``--set``, ``override``): errors name that."""
        self._schema = schema
        """If given, each key asked for is appended as (dotted path, default, what is expected): the schema of
        :mod:`dualpath_emu.cluster.scenario_reference`."""

    def _child(self, data: dict[str, Any], prefix: str, overrides: Mapping[str, str] | None = None) -> Table:
        return Table(data, self.source, prefix, self._overrides if overrides is None else overrides, self._schema)

    def key_path(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def where(self, key: str) -> str:
        """Where ``key`` was given, for an error: ``--set workload.agents`` if it was set so, else the file and key."""
        path = self.key_path(key)
        given = self._overrides.get(path)
        if given is None:
            return f"{self.source}: key {path!r}"
        return f"{given} {path}" if given.startswith("--") else f"{given} {path!r}"

    def error(self, key: str, expected: str, got: object = REQUIRED) -> ScenarioError:
        """A :class:`ScenarioError` for ``key``: expected ``expected``, got ``got`` (if given)."""
        found = "" if got is REQUIRED else f", got {_type_name(got)}"
        return ScenarioError(f"{self.where(key)}: expected {expected}{found}")

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def keys(self) -> list[str]:
        """The table's keys in the file's order."""
        return list(self._data)

    def _get(self, key: str, default: object, expected: str) -> object:
        self._read.add(key)
        if self._schema is not None:
            self._schema.append((self.key_path(key), default, expected))
        if key in self._data:
            return self._data[key]
        if default is REQUIRED:
            raise ScenarioError(f"{self.source}: missing key {self.key_path(key)!r} ({expected})")
        return default

    def get_int(
        self, key: str, default: int | _Required = REQUIRED, *, min: int | None = None, max: int | None = None
    ) -> int:
        expected = _range("an integer", min, max)
        value = self._get(key, default, expected)
        if not isinstance(value, int) or isinstance(value, bool) or not _within(value, min, max):
            raise self.error(key, expected, value)
        if max is None and value > _MAX_INT:  # no key needs more than 64 bits
            raise self.error(key, _range("an integer", min, _MAX_INT), value)
        return value

    def get_float(self, key: str, default: float | _Required = REQUIRED, *, min: float | None = None,
                  max: float | None = None, min_exclusive: bool = False) -> float:  # fmt: skip
        expected = _range("a number", min, max, min_exclusive)
        value = self._get(key, default, expected)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self.error(key, expected, value)
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the float range
            raise self.error(key, expected, value) from None
        if not math.isfinite(number) or not _within(number, min, max) or (min_exclusive and number == min):
            raise self.error(key, expected, value)
        return number

    def get_str(self, key: str, default: str | _Required = REQUIRED, *, choices: Sequence[str] | None = None) -> str:
        expected = "one of " + ", ".join(repr(c) for c in choices) if choices else "a string"
        value = self._get(key, default, expected)
        if not isinstance(value, str) or (choices is not None and value not in choices):
            raise self.error(key, expected, value)
        return value

    def get_bool(self, key: str, default: bool | _Required = REQUIRED) -> bool:
        value = self._get(key, default, "true or false")
        if not isinstance(value, bool):
            raise self.error(key, "true or false", value)
        return value

    def get_str_list(
        self, key: str, default: list[str] | _Required = REQUIRED, *, non_empty: bool = False, single: bool = False
    ) -> list[str]:
        """A list of strings; ``single``: a lone string is a list of one."""
        expected = "a non-empty list of strings" if non_empty else "a list of strings"
        if single:
            expected = f"a string or {expected}"
        value = self._get(key, default, expected)
        if single and isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (non_empty and not value):
            raise self.error(key, expected, value)
        return list(value)

    def table(self, key: str, *, required: bool = False) -> Table:
        """The sub-table ``key`` (an empty one if absent and not required)."""
        value = self._get(key, REQUIRED if required else {}, "a table")
        if not isinstance(value, dict):
            raise self.error(key, "a table", value)
        return self._child(value, self.key_path(key))

    def tables(self, key: str) -> list[Table]:
        """The array of tables ``[[key]]`` (empty if absent)."""
        value = self._get(key, [], "an array of tables [[...]]")
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.error(key, "an array of tables [[...]]", value)
        return [self._child(v, f"{self.key_path(key)}[{i}]") for i, v in enumerate(value)]

    def overridden(self, values: Mapping[str, object], what: str = "override") -> Table:
        """A copy with ``values`` set under their dotted keys (tables created), checked as the file is."""
        data = copy.deepcopy(self._data)
        for dotted, value in values.items():
            parts = dotted.split(".")
            if not all(parts):
                raise ScenarioError(f"{what} {dotted!r}: expected a dotted key such as 'workload.agents'")
            table = data
            for depth, part in enumerate(parts[:-1]):
                inner = table.setdefault(part, {})
                if not isinstance(inner, dict):
                    raise ScenarioError(f"{what} {dotted!r}: key {'.'.join(parts[: depth + 1])!r} is no table")
                table = inner
            table[parts[-1]] = value
        return self._child(data, self.prefix, {**self._overrides, **{dotted: what for dotted in values}})

    def without(self, dotted: str) -> Table:
        """A copy without the key at ``dotted`` (``"workload.dataset"``), if it is there."""
        data = copy.deepcopy(self._data)
        *path, last = dotted.split(".")
        table: object = data
        for part in path:
            table = table.get(part) if isinstance(table, dict) else None
        if isinstance(table, dict):
            table.pop(last, None)
        return self._child(data, self.prefix)

    def finish(self) -> None:
        """Refuse every key that no getter asked for (a typo, or a setting that does not exist)."""
        unknown = sorted(set(self._data) - self._read)
        if unknown:
            known = ", ".join(sorted(self._read)) or "none"
            path = self.key_path(unknown[0])
            # An override may have created the unknown table on its way (``--set a.b.c=1`` makes ``a``): name it.
            setter = next(((d, w) for d, w in self._overrides.items() if d == path or d.startswith(path + ".")), None)
            if setter is None:
                where = f"{self.source}: unknown key {short_repr(path)}"
            else:
                dotted, given = setter
                shown = dotted if given.startswith("--") else repr(dotted)
                where = (
                    f"{given} {shorten(shown, 200)}: no such key {short_repr(path)}"
                    if dotted != path
                    else f"{self.where(unknown[0])}: no such key"
                )
            raise ScenarioError(f"{where} (known keys here: {known})")


def _within(value: float, low: float | None, high: float | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def format_bound(x: float) -> str:
    """A bound in an error message: ``0``, ``0.5``, ``1e6`` (not ``1000000.0``), integers exactly."""
    if isinstance(x, int):
        return str(x)
    text = f"{x:g}"
    return re.sub(r"e([+-])0*(\d)", lambda m: f"e{'-' if m[1] == '-' else ''}{m[2]}", text)


def _range(what: str, low: float | None, high: float | None, low_exclusive: bool = False) -> str:
    if low is not None and high is not None:
        return f"{what} in {'(' if low_exclusive else '['}{format_bound(low)}, {format_bound(high)}]"
    if low is not None:
        return f"{what} {'>' if low_exclusive else '>='} {format_bound(low)}"
    if high is not None:
        return f"{what} <= {format_bound(high)}"
    return what
