"""Engine groups' identity, typed: a role and a node, whose name (``pe0``, ``de3``) is what messages, fault targets
and processes use. Names are made and read here only, so no module parses ``"pe3"`` on its own."""

from __future__ import annotations

import re
from typing import Final, Literal, NamedTuple

__all__ = ["GroupId", "Role"]

Role = Literal["pe", "de"]
_NAME: Final = re.compile(r"(pe|de)(0|[1-9][0-9]{0,5})")


class GroupId(NamedTuple):
    """A prefill group (``pe``, named by its EP group's first node) or a decode node's engines (``de``)."""

    role: Role
    node: int

    @property
    def name(self) -> str:
        return f"{self.role}{self.node}"

    def __str__(self) -> str:
        return self.name

    @property
    def prefill(self) -> bool:
        return self.role == "pe"

    @classmethod
    def parse(cls, name: str) -> GroupId | None:
        """The group ``name`` names (``None``: no group's name, e.g. ``scheduler`` or ``pe01``)."""
        match = _NAME.fullmatch(name)
        if match is None:
            return None
        return cls("pe" if match.group(1) == "pe" else "de", int(match.group(2)))
