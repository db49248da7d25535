"""The scenario files that ship with dualpath-emu, run by name (``dualpath-emu run ds27b-1p1d-offline``).

Each ``NAME.toml`` in this folder is a cluster scenario of ``dualpath-emu run`` (``kind = "cluster"``, format in
:mod:`dualpath_emu.cluster.scenario`). Wherever a command takes a scenario file it also takes one of these names:
:func:`find` says which file an argument means."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from dualpath_emu.config import ScenarioError

__all__ = ["FOLDER", "find", "names", "path"]

FOLDER: Final = Path(__file__).resolve().parent  # Where the packaged scenario files are.


def names() -> list[str]:
    """The packaged scenarios' names (file names without ``.toml``), sorted."""
    return sorted(p.stem for p in FOLDER.glob("*.toml"))


def path(name: str) -> Path:
    """The file of the packaged scenario ``name`` (a :class:`ScenarioError` listing the names if none)."""
    file = FOLDER / f"{name}.toml"
    if name not in names():
        raise ScenarioError(f"no packaged scenario {name!r} (packaged: {', '.join(names())})")
    return file


def find(argument: str | Path) -> Path:
    """The scenario file ``argument`` means: an existing file, else a packaged scenario's name.

    A name is a bare word (no folder, ``.toml`` optional); anything else that is no file is a
    :class:`ScenarioError` that lists the packaged names."""
    given = Path(argument)
    if given.exists():
        return given
    text = str(argument)
    stem = text[: -len(".toml")] if text.endswith(".toml") else text
    if given.parent == Path(".") and stem in names():
        return FOLDER / f"{stem}.toml"
    raise ScenarioError(f"{text}: no such file, and no packaged scenario of that name (packaged: {', '.join(names())})")
