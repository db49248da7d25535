"""Reading validated settings from TOML files: every error names the file, the key and what was expected.

A :class:`Table` wraps one TOML table. Its typed getters (:meth:`~Table.get_int`, :meth:`~Table.get_float`,
:meth:`~Table.get_str`, …) take a default (the documented default of the key) or none (the key is required),
check type and range, and remember which keys were read; :meth:`~Table.finish` then refuses the keys
nobody asked for, so a typo is an error, not a silently ignored setting. Errors are
:class:`ScenarioError` (a :class:`~dualpath_emu.errors.UsageError`: the CLI reports it on one line and
exits with status 2)::

    pipeline.toml: key 'process[1].actors': expected a list of strings, got 3
"""

from __future__ import annotations

import copy
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from dualpath_emu.errors import UsageError

__all__ = ["REQUIRED", "ScenarioError", "Table", "load_toml"]

_T = TypeVar("_T")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()
"""The default of a key that must be given."""


class ScenarioError(UsageError):
    """A scenario file that cannot be used: names the file, the key and what was expected."""


def load_toml(path: str | Path) -> Table:
    """The top-level table of the TOML file ``path`` (a :class:`ScenarioError` if unreadable or invalid)."""
    source = str(path)
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise ScenarioError(f"{source}: no such file") from None
    except OSError as error:
        raise ScenarioError(f"{source}: cannot read: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ScenarioError(f"{source}: not valid TOML: {error}") from None
    return Table(data, source)


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {value!r}"
    return repr(value)


class Table:
    """One TOML table of file ``source``; ``prefix`` is its dotted key path (empty at the top)."""

    def __init__(self, data: dict[str, Any], source: str, prefix: str = "") -> None:
        self._data = data
        self.source = source
        self.prefix = prefix
        self._read: set[str] = set()

    def key_path(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, expected: str, got: object = REQUIRED) -> ScenarioError:
        """A :class:`ScenarioError` for ``key``: expected ``expected``, got ``got`` (if given)."""
        found = "" if got is REQUIRED else f", got {_type_name(got)}"
        return ScenarioError(f"{self.source}: key {self.key_path(key)!r}: expected {expected}{found}")

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def _get(self, key: str, default: object, expected: str) -> object:
        self._read.add(key)
        if key in self._data:
            return self._data[key]
        if default is REQUIRED:
            raise ScenarioError(f"{self.source}: missing key {self.key_path(key)!r} ({expected})")
        return default

    def get_int(self, key: str, default: int | _Required = REQUIRED, *, min: int | None = None, max: int | None = None) -> int:
        expected = _range("an integer", min, max)
        value = self._get(key, default, expected)
        if not isinstance(value, int) or isinstance(value, bool) or not _within(value, min, max):
            raise self.error(key, expected, value)
        return value

    def get_float(
        self, key: str, default: float | _Required = REQUIRED, *, min: float | None = None, max: float | None = None,
        min_exclusive: bool = False,
    ) -> float:
        expected = _range("a number", min, max, min_exclusive)
        value = self._get(key, default, expected)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self.error(key, expected, value)
        number = float(value)
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

    def get_str_list(self, key: str, default: list[str] | _Required = REQUIRED, *, non_empty: bool = False) -> list[str]:
        expected = "a non-empty list of strings" if non_empty else "a list of strings"
        value = self._get(key, default, expected)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (non_empty and not value):
            raise self.error(key, expected, value)
        return list(value)

    def table(self, key: str, *, required: bool = False) -> Table:
        """The sub-table ``key`` (an empty one if absent and not required)."""
        value = self._get(key, REQUIRED if required else {}, "a table")
        if not isinstance(value, dict):
            raise self.error(key, "a table", value)
        return Table(value, self.source, self.key_path(key))

    def tables(self, key: str) -> list[Table]:
        """The array of tables ``[[key]]`` (empty if absent)."""
        value = self._get(key, [], "an array of tables [[...]]")
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.error(key, "an array of tables [[...]]", value)
        return [Table(v, self.source, f"{self.key_path(key)}[{i}]") for i, v in enumerate(value)]

    def overridden(self, values: Mapping[str, object], what: str = "override") -> Table:
        """A copy with ``values`` set, each under its dotted key path (``"workload.agents"``; tables on the
        way are created). Checked as the file is, when read; a key whose path crosses a value that is no
        table is a :class:`ScenarioError` naming ``what`` and the key."""
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
        return Table(data, self.source, self.prefix)

    def finish(self) -> None:
        """Refuse every key that no getter asked for (a typo, or a setting that does not exist)."""
        unknown = sorted(set(self._data) - self._read)
        if unknown:
            known = ", ".join(sorted(self._read)) or "none"
            raise ScenarioError(
                f"{self.source}: unknown key {self.key_path(unknown[0])!r} (known keys here: {known})"
            )


def _within(value: float, low: float | None, high: float | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def _range(what: str, low: float | None, high: float | None, low_exclusive: bool = False) -> str:
    if low is not None and high is not None:
        return f"{what} in {'(' if low_exclusive else '['}{low}, {high}]"
    if low is not None:
        return f"{what} {'>' if low_exclusive else '>='} {low}"
    if high is not None:
        return f"{what} <= {high}"
    return what
