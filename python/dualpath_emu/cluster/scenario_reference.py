"""The scenario reference (``docs/scenario-reference.md``), generated so that it cannot drift from the code.

The **schema** is what the reader asks for (a scenario and the packaged catalog read with a recording
:class:`~dualpath_emu.config.Table`: every key's path, default and what it accepts, as its errors say); the
**descriptions** are the annotated example :data:`EXAMPLE`. :func:`check` says where the two disagree; a test
runs it and compares the committed page with :func:`render`. ``make docs`` writes the page."""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dualpath_emu.cluster import scenario as scenario_module
from dualpath_emu.cluster.catalog import PACKAGED_FILE, Catalog
from dualpath_emu.config import REQUIRED, Table

__all__ = ["EXAMPLE", "Documented", "Key", "check", "documented", "render", "schema"]

EXAMPLE: Final = Path(__file__).with_name("scenario_keys.toml")
"""Every key of a cluster scenario, with its default and what it does (the comments after it)."""

_ENTRY_KINDS = ("models", "gpus", "nics")
_SAME_KEYS = ("roofline.prefill.", "roofline.decode.")
"""Tables that take another table's keys (their own are checked to be those by the scenario tests)."""


@dataclass(frozen=True)
class Key:
    """One key as the reader asks for it."""

    path: str  # Dotted, with ``NAME`` for a catalog entry's name: ``models.NAME.hidden_size``.
    default: object  # :data:`~dualpath_emu.config.REQUIRED` if the key must be given.
    expected: str


@dataclass(frozen=True)
class Documented:
    """One key (or table) of the annotated example."""

    path: str
    default: str  # As written (a TOML value), "" for a table or a key shown commented out (no default).
    description: str
    table: bool = False
    array: bool = False  # An array of tables (``[[faults]]``).


def schema() -> list[Key]:
    """Every key a cluster scenario may have, in the order the reader asks for them (the first time)."""
    rows: list[tuple[str, object, str]] = []
    # Every key of a fault is read for some kind: slow_storage's, with a duration, and a crash's cover them all.
    fault = {
        "kind": "slow_storage", "target": "storage", "at_s": 0.0, "duration_s": 1.0, "factor": 0.5, "latency_s": 0.0,
    }  # fmt: skip
    crash = {"kind": "crash", "target": "pe0", "at_s": 0.0, "restart_s": 1.0}
    # The network's VL tables and a background traffic in bursts read every key of [network].
    vl = {"max_vls": 4, "high_limit": 255, "vlarb_high": "0:255", "vlarb_low": "2:1"}
    background = {"ports": ["de.snic.rx"], "rate_bytes_per_s": 1e9, "duration_s": 1.0, "period_s": 1.0}
    bucket = {"ports": ["pe.snic.rx"], "sustained_bytes_per_s": 1e9, "burst_bytes": 1e9}
    example = {"kind": "cluster", "faults": [fault, crash], "random_faults": {},
               "network": {"cnic_vl": vl, "background": [background], "bucket": [bucket]}}  # fmt: skip
    scenario_module.scenario_from_table(Table(example, "reference", schema=rows), Path("reference.toml"))
    packaged = tomllib.loads(PACKAGED_FILE.read_text(encoding="utf-8"))
    Catalog().with_entries(Table(packaged, str(PACKAGED_FILE), schema=rows))  # every kind of entry is in it
    out: dict[str, Key] = {}
    for path, default, expected in rows:
        if expected in ("a table", "an array of tables [[...]]") or path.startswith(_SAME_KEYS):
            continue  # tables are documented by their headers; [roofline.prefill] and [.decode] by [roofline]'s
        path = re.sub(r"\[\d+\]", "", path)  # an array of tables' element: faults[0].kind is faults.kind
        parts = path.split(".")
        if parts[0] in _ENTRY_KINDS:
            if len(parts) < 3:
                continue  # the [models] table itself
            path = ".".join([parts[0], "NAME", *parts[2:]])
        out.setdefault(path, Key(path, default, expected))
    return list(out.values())


_EXAMPLE_START = 'kind = "cluster"'
_KEY = re.compile(r"^(# )?([a-z_0-9]+) = (.+?)(?:\s{2,}# ?(.*))?$")
_TABLE = re.compile(r"^\[\[?([a-zA-Z_.]+)\]\]?(?:\s+# ?(.*))?$")
_MORE = re.compile(r"^\s{5,}# ?(.*)$")


def documented(example: str | None = None) -> list[Documented]:
    """The keys and tables of the annotated example (:data:`EXAMPLE`'s text, or ``example``)."""
    text = EXAMPLE.read_text(encoding="utf-8") if example is None else example
    lines = text[text.index(_EXAMPLE_START) :].splitlines()
    out: list[Documented] = []
    table = ""
    for line in lines:
        if not line.strip():
            continue
        if (m := _TABLE.match(line)) is not None:
            table = m[1]
            out.append(Documented(table, "", m[2] or "", table=True, array=line.lstrip().startswith("[[")))
        elif (m := _KEY.match(line)) is not None:
            path = f"{table}.{m[2]}" if table else m[2]
            out.append(Documented(path, "" if m[1] else m[3].strip(), m[4] or ""))
        elif (m := _MORE.match(line)) is not None and out:
            last = out[-1]
            out[-1] = Documented(last.path, last.default, f"{last.description} {m[1]}".strip(), last.table, last.array)
        elif line.strip().startswith("#") and out:  # a note under a table, at the keys' indentation
            last = next(d for d in reversed(out) if d.table)
            note = line.strip().lstrip("# ").strip("()")
            i = out.index(last)
            out[i] = Documented(last.path, "", f"{last.description} {note}".strip(), table=True, array=last.array)
        else:
            raise ValueError(f"{EXAMPLE.name}: cannot read the line {line!r}")
    return out


def check(example: str | None = None) -> list[str]:
    """Where the schema and the annotated example disagree; empty when they agree."""
    keys = {k.path: k for k in schema()}
    docs = {d.path: d for d in documented(example) if not d.table}
    problems = [f"{p}: read by the scenario reader, missing from {EXAMPLE.name}" for p in keys if p not in docs]
    problems += [f"{p}: in {EXAMPLE.name}, not read by the scenario reader" for p in docs if p not in keys]
    for path, doc in docs.items():
        key = keys.get(path)
        if key is None or not doc.default or key.default is REQUIRED:
            continue
        try:
            value = tomllib.loads(f"x = {doc.default}")["x"]
        except tomllib.TOMLDecodeError:
            continue
        if isinstance(value, str) and value.startswith("<"):
            continue  # a placeholder such as "<file name without .toml>"
        if value != key.default:
            problems.append(f"{path}: {EXAMPLE.name} says {doc.default}, the reader's default is {key.default!r}")
    return problems


def _default(key: Key, doc: Documented) -> str:
    if key.default is REQUIRED:
        return "required"
    if not doc.default:
        return "—"
    return f"`{doc.default}`"


def render() -> str:
    """The Markdown page."""
    keys = {k.path: k for k in schema()}
    out = """# Scenario reference

<!-- Generated by `make docs` from the scenario reader and the annotated example
     python/dualpath_emu/cluster/scenario_keys.toml; do not edit (a test compares it with the code). -->

Every key a cluster scenario (`kind = "cluster"`) may have: its default, what the reader accepts (as
its error messages say it) and what it does. A key not given keeps its default; an unknown key, a wrong
type or a value out of range is an error naming the file and the key. `--set KEY=VALUE` sets any of
them from the command line (`dualpath-emu run --set workload.agents=16`).

The `[models.NAME]`, `[gpus.NAME]` and `[nics.NAME]` tables define catalog entries, in a scenario or
in a catalog file it includes (`kind = "catalog"`); `dualpath-emu catalog` lists the packaged ones
and the numbers derived from each (python/dualpath_emu/cluster/catalog.toml holds them, with sources).
""".split("\n")
    sections: list[tuple[str, str, list[str]]] = [("", "", [])]  # (table header, its description, its rows)
    for doc in documented():
        if doc.table:
            sections.append((f"[[{doc.path}]]" if doc.array else f"[{doc.path}]", doc.description, []))
            continue
        key = keys[doc.path]
        name = doc.path.rsplit(".", 1)[-1]
        sections[-1][2].append(
            f"| `{name}` | {_default(key, doc)} | {key.expected} | {doc.description.replace('|', '/')} |"
        )
    for table, description, rows in sections:
        out += [f"## `{table}`" if table else "## Top level", ""]
        if description:
            out += [description[0].upper() + description[1:] + ("" if description.endswith(".") else "."), ""]
        if rows:
            out += ["| key | default | accepted | what it does |", "|---|---|---|---|", *rows, ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    """``python -m dualpath_emu.cluster.scenario_reference [OUT]``: check, then write the page (or print it)."""
    problems = check()
    if problems:
        print("the scenario reference does not match the reader:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    text = render()
    if argv:
        Path(argv[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
