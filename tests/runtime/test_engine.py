"""The engine contract (``runtime/engine.py``) is light: importing it, or the cluster's engines, loads neither asyncio
nor ZeroMQ nor the live runtime (issue 35); only a live run's modules do."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes  # each test imports in a fresh interpreter

ENGINE_MODULES = (
    "dualpath_emu.runtime.engine",
    "dualpath_emu.runtime.virtual",
    "dualpath_emu.cluster.decode",
    "dualpath_emu.cluster.prefill",
    "dualpath_emu.cluster.scheduler",
    "dualpath_emu.cluster.client",
)
LIVE_ONLY = ("asyncio", "zmq", "dualpath_emu.runtime.actors", "dualpath_emu.runtime.dataplane",
             "dualpath_emu.runtime.zmq_transport")  # fmt: skip


def loaded_after(*modules: str) -> set[str]:
    """The modules a fresh interpreter holds after importing ``modules``."""
    code = f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout))


def test_importing_the_engines_loads_no_asyncio_nor_zeromq() -> None:
    loaded = loaded_after(*ENGINE_MODULES)
    assert set(ENGINE_MODULES) <= loaded
    assert not loaded & set(LIVE_ONLY), sorted(loaded & set(LIVE_ONLY))


def test_the_live_driver_does_load_them() -> None:  # the check above can fail
    loaded = loaded_after("dualpath_emu.runtime.engine_actor", "dualpath_emu.runtime.zmq_transport")
    assert {"asyncio", "zmq"} <= loaded
