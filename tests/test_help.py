"""Every ``--help`` of the command line is complete: each command and experiment has a description that ends
a sentence, and every option says what it does (a description cut mid-sentence once showed here)."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator
from typing import Any

import pytest

from dualpath_emu.cli import build_parser, main
from dualpath_emu.reproduce import EXPERIMENTS, help_description


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield sub.prog, sub
                yield from _subparsers(sub)


def _captured(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser that ``dualpath-emu *argv`` builds for its own options (experiments, node)."""
    seen: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        if self.prog == "dualpath-emu":  # the command line's own parser: let it dispatch
            return original(self, *args, **kwargs)
        seen.append(self)
        raise SystemExit(0)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", capture)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main(argv)
    assert seen, f"dualpath-emu {' '.join(argv)} built no parser of its own"
    return seen[-1]


def _problems(prog: str, parser: argparse.ArgumentParser) -> list[str]:
    out = []
    description = (parser.description or "").strip()
    if not description.endswith((".", ".)")):
        out.append(f"{prog}: description does not end a sentence: {description[-60:]!r}")
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
            continue
        text = (action.help or "").strip()
        if not text or text.endswith((",", ";", ":", "(", "-", " so that", " and", " or", " the")):
            out.append(f"{prog}: {'/'.join(action.option_strings) or action.dest}: help missing or cut: {text!r}")
    return out


def test_every_command_has_complete_help() -> None:
    parser = build_parser()
    problems = _problems(parser.prog, parser)
    commands = dict(_subparsers(parser))
    assert {"dualpath-emu run", "dualpath-emu validate", "dualpath-emu trace gen"} <= set(commands)
    for prog, sub in commands.items():
        if prog in ("dualpath-emu node", "dualpath-emu calibrate", "dualpath-emu reproduce"):
            continue  # their own parsers, below (reproduce's own options are checked there too)
        problems += _problems(prog, sub)
    assert problems == []


@pytest.mark.parametrize("argv", [["reproduce", name, "--help"] for name in EXPERIMENTS] + [["calibrate", "--help"]],
                         ids=lambda argv: " ".join(argv[:-1]))  # fmt: skip
def test_every_experiment_has_complete_help(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    parser = _captured(argv, monkeypatch)
    assert parser.prog.startswith("dualpath-emu reproduce ")
    assert _problems(parser.prog, parser) == []


def test_node_has_complete_help(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = _captured(["node", "--help"], monkeypatch)
    assert parser.prog == "dualpath-emu node" and _problems(parser.prog, parser) == []


def test_the_reproduce_command_says_what_the_names_are() -> None:
    sub = dict(_subparsers(build_parser()))["dualpath-emu reproduce"]
    assert _problems(sub.prog, sub) == []


def test_help_description_takes_the_first_paragraph_as_plain_text() -> None:
    doc = """Fit ``x`` on **Basic** runs, so that
    :func:`~a.b.fit` predicts.

    More."""
    assert help_description(doc) == "Fit x on Basic runs, so that fit predicts."


def test_help_text_is_printed_whole(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--help"]) == 0
    out = capsys.readouterr().out
    assert "so that DualPath's results are predictions." in " ".join(out.split())
