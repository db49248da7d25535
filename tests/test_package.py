"""The package, its native module, the exception hierarchy and the console script fit together."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dualpath_emu
from dualpath_emu import _core, errors
from dualpath_emu.cli import main

# The console script pip generated next to this interpreter (tests run from .venv/bin/pytest).
SCRIPT = Path(sys.executable).parent / "dualpath-emu"


def test_version_matches_the_extension() -> None:
    # A stale extension (package rebuilt, .so not) shows up here.
    assert dualpath_emu.__version__ == _core.__version__


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (errors.InvalidArgumentError, ValueError),
        (errors.UnknownNameError, LookupError),
        (errors.ConfigError, ValueError),
        (errors.StateError, RuntimeError),
        (errors.CoreIOError, OSError),
    ],
)
def test_error_classes_derive_from_core_error_and_a_builtin(cls: type[Exception], builtin: type[Exception]) -> None:
    assert issubclass(cls, errors.CoreError)
    assert issubclass(cls, builtin)
    assert cls.__module__ == "dualpath_emu.errors"
    with pytest.raises(builtin, match="rate_bps: must be > 0"):
        raise cls("rate_bps: must be > 0")


def test_core_error_is_an_exception_but_no_usage_error() -> None:
    assert issubclass(errors.CoreError, Exception)
    assert errors.CoreError.__module__ == "dualpath_emu.errors"
    assert errors.CoreError is _core.CoreError
    assert not issubclass(errors.UsageError, errors.CoreError)
    assert not issubclass(errors.CoreError, ValueError)


def test_console_script_prints_the_version() -> None:
    assert SCRIPT.is_file(), f"console script not installed at {SCRIPT}"
    result = subprocess.run([str(SCRIPT), "version"], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"dualpath-emu {dualpath_emu.__version__}"


@pytest.mark.parametrize("argv", [["no-such-command"], [], ["run", "a.toml", "extra"]])
def test_bad_usage_exits_2_with_one_line_and_no_traceback(argv: list[str]) -> None:
    result = subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("dualpath-emu: error: ")
    assert len(result.stderr.splitlines()) == 1


def test_main_reports_core_errors_as_usage_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(args: object) -> int:
        raise errors.InvalidArgumentError("rate_bps: must be > 0, got -1")

    monkeypatch.setattr("dualpath_emu.cli._cmd_version", fail)
    assert main(["version"]) == 2
    assert capsys.readouterr().err == "dualpath-emu: error: rate_bps: must be > 0, got -1\n"
