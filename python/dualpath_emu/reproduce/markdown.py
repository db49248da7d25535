"""``dualpath-emu reproduce markdown FILE.json...``: an experiment's report (the ``NAME.json`` that ``--out`` writes) as
a Markdown section — the side-by-side table, the checks, the notes and the wall time — so that EVALUATION.md shows what
was measured, not numbers copied by hand.

``--image-dir DIR`` links each report's figure as ``DIR/STEM.png``, STEM being the JSON file's name without ``.json``
(keep each PNG beside its JSON under the same name); ``--into FILE`` writes the sections into FILE between the lines
``<!-- reproduce:begin -->`` and ``<!-- reproduce:end -->`` (what ``make evaluation`` does to EVALUATION.md) instead of
printing them; ``--heading`` sets the heading level (default 3)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dualpath_emu.reproduce import help_description
from dualpath_emu.errors import UsageError
from dualpath_emu.inputs import read_input, shorten

__all__ = ["BEGIN", "END", "main", "render"]

BEGIN = "<!-- reproduce:begin -->"
END = "<!-- reproduce:end -->"


def _number(value: float) -> str:
    if value != value:  # NaN
        return "–"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


_JCT_KEYS = frozenset({"model", "dataset", "agents", "system", "jct_s"})
_SYSTEMS = ("basic", "dualpath", "oracle")


def _jct_table(rows: list[Mapping[str, Any]]) -> list[str]:
    """fig7's rows, one per (model, dataset, agents): each system's JCT and DualPath's ratios to the others."""
    jct: dict[tuple[str, str, int], dict[str, float]] = {}
    for row in rows:
        jct.setdefault((str(row["model"]), row["dataset"], row["agents"]), {})[row["system"]] = row["jct_s"]
    several = len({model for model, _, _ in jct}) > 1
    lines = [("| model " if several else "") + "| context | agents | Basic JCT (s) | DualPath JCT (s) | Oracle JCT (s) "
             "| DualPath / Basic speedup | DualPath / Oracle |",
             ("|---" if several else "") + "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for (model, dataset, agents), by_system in sorted(jct.items()):
        if not all(system in by_system for system in _SYSTEMS):
            continue
        basic, dualpath, oracle = (by_system[system] for system in _SYSTEMS)
        lines.append((f"| {model} " if several else "") + f"| {dataset} | {agents:,} | {basic:,.0f} | {dualpath:,.0f} "
                     f"| {oracle:,.0f} | {basic / dualpath:.2f}× | {dualpath / oracle:.2f} |")  # fmt: skip
    return [*lines, ""] if len(lines) > 2 else []


def render(report: Mapping[str, Any], *, heading: int = 3, image: str | None = None) -> str:
    """One report as Markdown."""
    name, title = report["experiment"], report["title"]
    rows = report.get("rows") or []
    jct_rows = [row for row in rows if isinstance(row, Mapping) and _JCT_KEYS <= row.keys()]
    models = sorted({str(row["model"]) for row in jct_rows})
    label = f"{name} ({', '.join(models)})" if models else name
    lines = [f"{'#' * heading} {label}: {title}", ""]
    if image is not None:
        lines += [f"![{name}]({image})", ""]
    comparisons = report.get("comparisons") or []
    if comparisons:
        lines += ["| what | paper | emulator | ratio | target | met |", "|---|---:|---:|---:|---|---|"]
        for c in comparisons:
            met = "–" if c["met"] is None else ("yes" if c["met"] else "**no**")
            lines.append(f"| {c['what']} | {_number(c['paper'])} | {_number(c['emulator'])} | {c['ratio']:.2f} "
                         f"| {c['target']} | {met} |")  # fmt: skip
        lines.append("")
    elif rows and not jct_rows:  # nothing of the paper's to set beside: the emulator's rows themselves
        columns = list(rows[0])
        lines += ["| " + " | ".join(columns) + " |", "|" + "---:|" * len(columns)]
        lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
        lines.append("")
    lines += _jct_table(jct_rows)
    for check, ok in (report.get("checks") or {}).items():
        lines.append(f"- check: {check}: {'ok' if ok else '**failed**'}")
    for note in report.get("notes") or []:
        lines.append(f"- {note}")
    lines += [f"- wall time: {report.get('wall_s', 0.0) / 60:.1f} min", ""]
    return "\n".join(lines)


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dualpath-emu reproduce markdown", description=help_description(__doc__))
    parser.add_argument("reports", nargs="+", type=Path, metavar="FILE.json",
                        help="reports written by `dualpath-emu reproduce NAME --out DIR` (DIR/NAME.json)")  # fmt: skip
    parser.add_argument(
        "--image-dir", help="link STEM.png in this folder (relative to the Markdown) under each heading"
    )
    parser.add_argument("--heading", type=int, default=3, choices=range(1, 7), help="heading level (default 3)")
    parser.add_argument(
        "--into", type=Path, metavar="FILE", help=f"replace what lies between {BEGIN} and {END} in FILE"
    )
    args = parser.parse_args(argv)
    sections = []
    for path in args.reports:
        try:
            # A regular file of bounded size only (a FIFO or /dev/zero would be read forever).
            report = json.loads(read_input(path, what="a JSON report", limit_bytes=64 << 20).decode("utf-8"))
            report["experiment"], report["title"]
        except (UsageError, OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            return _error(f"{path}: not a report of dualpath-emu reproduce --out ({shorten(str(e), 200)})")
        image = f"{args.image_dir.rstrip('/')}/{path.stem}.png" if args.image_dir else None
        if image is not None and not (path.parent / f"{path.stem}.png").exists():
            image = None  # an experiment without a figure
        sections.append(render(report, heading=args.heading, image=image))
    text = "\n".join(sections)
    if args.into is None:
        print(text, end="")
        return 0
    try:
        document = args.into.read_text()
    except OSError as e:
        return _error(f"--into {args.into}: {e.strerror}")
    begin, end = document.find(BEGIN), document.find(END)
    if begin < 0 or end < begin:
        return _error(f"--into {args.into}: expected a line {BEGIN} and, after it, a line {END}")
    args.into.write_text(document[: begin + len(BEGIN)] + "\n\n" + text + "\n" + document[end:])
    return 0
