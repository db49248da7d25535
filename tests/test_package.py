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


@pytest.mark.processes
def test_console_script_prints_the_version() -> None:
    assert SCRIPT.is_file(), f"console script not installed at {SCRIPT}"
    result = subprocess.run([str(SCRIPT), "version"], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"dualpath-emu {dualpath_emu.__version__}"


@pytest.mark.processes
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


# --------------------------------------------------------------------------------------------- packaging

REPO = Path(__file__).resolve().parent.parent


def test_runtime_dependencies_are_ranges_that_the_dev_pins_satisfy() -> None:
    import tomllib

    from packaging.requirements import Requirement

    dependencies = [
        Requirement(d) for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    pins = {}
    for line in (REPO / "requirements-dev.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            pins[name.lower()] = pinned
    assert {d.name for d in dependencies} == {
        "msgpack", "pyzmq", "rich", "matplotlib", "numpy", "prometheus-client", "hypothesis",
    }  # fmt: skip
    for dependency in dependencies:
        operators = {spec.operator for spec in dependency.specifier}
        assert operators == {">=", "<"}, f"{dependency}: expected a range (>=, <), not a pin"
        assert dependency.specifier.contains(pins[dependency.name]), (
            f"{dependency}: the dev pin {pins[dependency.name]}"
        )


def test_scenarios_ship_in_the_package_and_run_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    from dualpath_emu.scenarios import FOLDER, find, names

    assert FOLDER == Path(dualpath_emu.__file__).resolve().parent / "scenarios"
    assert {"ds660b-2p4d-offline", "ds27b-1p1d-offline"} <= set(names())
    assert not (REPO / "scenarios").exists(), "scenarios live in python/dualpath_emu/scenarios only (one copy)"
    for name in names():
        assert find(name) == find(f"{name}.toml") == FOLDER / f"{name}.toml"
        assert main(["validate", name]) == 0
    assert main(["run", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()[-len(names()) :]
    assert [line.split(":")[0] for line in listed] == names()


def test_a_file_wins_over_a_packaged_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dualpath_emu.scenarios import find

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds27b-1p1d-offline").write_text("")
    assert find("ds27b-1p1d-offline") == Path("ds27b-1p1d-offline")
    with pytest.raises(errors.UsageError, match=r"^sub/ds27b-1p1d-offline: no such file, and no packaged scenario"):
        find("sub/ds27b-1p1d-offline")


def test_every_path_the_readme_names_exists() -> None:
    import re

    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)\)", text)
    tops = ("python/", "core/", "tests/", "docs/", "fuzz/", ".ci/", "scenarios/")
    quoted = [t for t in re.findall(r"`([^`\s]+)`", text) if t.startswith(tops)]
    missing = [p for p in links + quoted if "://" not in p and not (REPO / p.split(":")[0]).exists()]
    assert missing == []
    assert links or quoted
