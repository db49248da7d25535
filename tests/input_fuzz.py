"""A fuzz target for the input loaders: scenario TOML (cluster and run scenarios) and trace JSONL
(trajectory files and Mooncake traces), by Hypothesis over generated and mutated documents.

The property: whatever the bytes, a loader either returns a valid object or raises the project's one-line
error (:class:`~dualpath_emu.errors.UsageError`: a ``ScenarioError`` or ``TraceError``) whose message names
the file, fits on one line and stays short; the CLI (``validate``, ``trace stats``) then exits 0 or 2 with at
most one line on stderr. Any other exception, a traceback, a hang or a message that echoes a huge value is a
failure. A scenario that loads must also be one the core accepts (its topology builds, its numbers convert)
and, for small ones, whose workload generates: values that validate and then overflow are failures too.

Documents come from three sources, mixed: structurally plausible scenarios and traces whose values are drawn
near and beyond every documented limit (:func:`scenario_documents`, :func:`trace_documents`); byte-level
mutations of those (truncation, insertion, duplication, bytes that are not UTF-8, deep nesting); and the
committed corpus, ``tests/data/bad_inputs``, as seeds.

Used two ways: ``tests/test_bad_inputs.py`` runs it at the test profile's depth, and ``make fuzz`` /
``make fuzz-smoke`` run it as a script (``python tests/input_fuzz.py --seconds N [--seed S] [--examples N]``)
for a time or example budget, printing how many documents it ran and, for a failure, the minimal document.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from dualpath_emu._core import Core
from dualpath_emu.cli import main as cli_main
from dualpath_emu.cluster.config import derived
from dualpath_emu.cluster.run import run_system
from dualpath_emu.cluster.scenario import ClusterScenario, load_cluster_scenario
from dualpath_emu.cluster.topology import build_topology
from dualpath_emu.errors import CoreError, UsageError
from dualpath_emu.cluster.live import registry
from dualpath_emu.runtime.scenario import load_run_scenario
from dualpath_emu.workload import load_trace
from dualpath_emu.workload.mooncake import read_mooncake
from dualpath_emu.workload.stats import trace_stats

__all__ = [
    "MAX_MESSAGE_CHARS",
    "check_cli",
    "check_run_scenario",
    "check_scenario",
    "check_trace",
    "mutated",
    "scenario_documents",
    "trace_documents",
]

CORPUS = Path(__file__).resolve().parent / "data" / "bad_inputs"
MAX_MESSAGE_CHARS = 1_000
"""An error line longer than this echoes too much (the CLI cuts at about this length; loaders stay far below)."""

# ------------------------------------------------------------------------------------------------ values

_HUGE_DIGITS = "9" * 4_400  # past Python's 4,300-digit int-from-text limit
_FLOATS = ["inf", "-inf", "nan", "1e308", "1e-300", "-0.0", "1e400", "5e-324", "0.0", "1e10", "1e19", "1e20"]


@dataclass(frozen=True)
class Raw:
    """A value written into a document as is (TOML or JSON text), e.g. an integer of 4,400 digits."""

    text: str


def _numbers() -> st.SearchStrategy[Any]:
    """Numbers around every limit a key has, and far beyond (as values or as raw text)."""
    edges = [0, 1, -1, 2, 7, 8, 15, 16, 17, 255, 256, 257, 1024, 65_536, 100_000, 100_001, 10**6, 2**31, 2**50,
             2**63 - 1, 2**63, 2**64, 10**30]  # fmt: skip
    floats = [0.0, 1e-6, 1e-3, 0.5, 0.99, 1.0, 5.0, 10.0, 60.0, 3600.0, 1e6, 1e12, 1e14, 1e16, 1e18, 1e300]
    return st.one_of(
        st.sampled_from(edges),
        st.sampled_from(floats),
        st.sampled_from([-x for x in floats[1:]]),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([Raw(t) for t in _FLOATS] + [Raw(_HUGE_DIGITS), Raw("-" + _HUGE_DIGITS), Raw("1" + "0" * 400)]),
    )


def _strings() -> st.SearchStrategy[str]:
    words = ["cluster", "ds660b", "ds27b", "qwen32b", "h800", "h200", "64k", "32k", "online", "offline", "basic",
             "dualpath", "oracle", "forward", "layer", "per-turn", "model", "host", "realtime", "ipc", "tcp",
             "t.jsonl", "", "../../etc/passwd", "x" * 100_000, "\x00", "é", "\u2028"]  # fmt: skip
    return st.one_of(st.sampled_from(words), st.text(max_size=20))


def _values(depth: int = 2) -> st.SearchStrategy[Any]:
    scalar = st.one_of(_numbers(), _strings(), st.booleans())
    if depth == 0:
        return scalar
    inner = _values(depth - 1)
    return st.one_of(
        scalar, scalar, scalar, st.lists(inner, max_size=4), st.dictionaries(_strings(), inner, max_size=3)
    )


# -------------------------------------------------------------------------------------- TOML scenarios

_CLUSTER_KEYS: dict[str, list[str]] = {
    "": ["kind", "name", "seed", "systems"],
    "deployment": ["model", "pe_nodes", "de_nodes", "prefill_ep_nodes", "decode_ep_nodes", "dram_buffer_bytes"],
    "hardware": ["gpu", "gpus", "cnic_bytes_per_s", "snic_bytes_per_s", "snics", "host_dram_bytes_per_s",
                 "pcie_bytes_per_s"],
    "storage": ["read_bytes_per_s", "write_bytes_per_s", "read_latency_s", "write_latency_s", "queue_depth"],
    "roofline": ["gemm_efficiency", "attention_efficiency", "memory_efficiency", "overhead_s_per_layer",
                 "a2a_fixed_s"],
    "workload": ["dataset", "trace", "agents", "max_rounds", "mode", "arrival_rate"],
    "workload.generator": ["base_trajectories", "reading", "append_sigma", "gen_sigma", "first_round_sigma",
                           "total_min_fraction", "first_append"],
    "scheduling": ["alpha_read_s", "beta_compute_s", "attention_quota_s", "attention_quota_per", "fetch_period_s",
                   "hit_block_aligned", "de_hbm_reserve_fraction", "pe_hbm_reserve_fraction", "pipeline_stages",
                   "max_redispatches", "read_timeout_s", "stall_timeout_s"],
    "random_faults": ["down_per_node_hour", "degrade_per_node_hour", "latency_per_node_hour", "crash_per_node_hour",
                      "mean_duration_s", "factor", "restart_s"],
    "network": ["isolation"],
    "network.cnic_vl": ["max_vls", "high_limit", "vlarb_high", "vlarb_low"],
    "kv.pool": ["bytes_per_node", "eviction", "ttl_s", "write"],
}  # fmt: skip
_RUN_KEYS: dict[str, list[str]] = {
    "": ["app", "seed", "mode", "latency_s", "time_scale", "transport", "host", "timeout_s", "heartbeat_timeout_s",
         "hang_timeout_s", "dataplane_endpoint", "backend"],
    "cluster": ["description", "metrics_port", "byte_scale", "storage_dir", "transfer_engine"],
}  # fmt: skip
# A small, valid starting point (DS 27B 1P1D), so that mutating a few keys still reaches the deep checks.
# Values worth trying for each known key: the default, each documented bound and just past it.
_PLAUSIBLE: dict[str, list[Any]] = {
    "kind": ["cluster"], "name": ["x", "", "n" * 300], "seed": [0, 1, 2**63 - 1, 2**63],
    "systems": [["dualpath"], ["basic", "oracle"], ["basic", "dualpath", "oracle"], [], ["dualpath", "dualpath"]],
    "model": ["ds27b", "ds660b", "qwen32b"], "pe_nodes": [1, 2, 4, 255, 256], "de_nodes": [1, 2, 8, 254, 255],
    "prefill_ep_nodes": [1, 2, 4], "decode_ep_nodes": [1, 2, 4],
    "dram_buffer_bytes": [1, 8_000_000_000, 80_000_000_000, 2**50, 2**50 + 1],
    "gpu": ["h800", "h200", "h20"], "gpus": [1, 2, 8, 16, 17], "snics": [1, 16, 17],
    "cnic_bytes_per_s": [1e6, 999_999.0, 1e12, 1.000001e12, 50e9], "snic_bytes_per_s": [1e6, 1e12, 50e9, 1e13],
    "host_dram_bytes_per_s": [1e6, 1e14, 5e11, 2e14], "pcie_bytes_per_s": [63e9],
    "read_bytes_per_s": [0, 1e6, 1e16, 5e5, 2e16], "write_bytes_per_s": [0, 1e6, 1e16, 1e5],
    "read_latency_s": [0, 10, 10.001, 2e-4], "write_latency_s": [0, 10, 11, 2e-4], "queue_depth": [1, 65_536, 65_537],
    "gemm_efficiency": [1e-3, 9e-4, 1, 1.0001, 0.5], "attention_efficiency": [1e-3, 1, 0.6],
    "memory_efficiency": [1e-3, 1, 0.8], "overhead_s_per_layer": [0, 1, 1.5], "a2a_fixed_s": [0, 1e-4, 2],
    "dataset": ["32k", "48k", "64k"], "trace": ["trace.jsonl", "missing.jsonl"], "agents": [1, 2, 100_000, 100_001],
    "max_rounds": [0, 1, 1_000_000, 1_000_001], "mode": ["offline", "online"],
    "arrival_rate": [1e-3, 9.99e-4, 1e6, 2e6, 0.1], "base_trajectories": [1, 2, 100_000, 100_001],
    "reading": ["per-trajectory", "per-turn"], "append_sigma": [0, 5, 5.01], "gen_sigma": [0, 5],
    "first_round_sigma": [0, 5], "total_min_fraction": [1e-9, 0.5, 0.999999, 1], "first_append": [1, 32_767, 32_768, 65_535],
    "alpha_read_s": [1e-3, 3600, 3601, 9e-4], "beta_compute_s": [1e-3, 3600], "attention_quota_s": [1e-3, 3600, 0],
    "attention_quota_per": ["forward", "layer"], "fetch_period_s": [1e-6, 60, 61, 1e-7], "hit_block_aligned": [True, False],
    "isolation": [True, False, "no"], "max_vls": [1, 4, 15, 16, 0], "high_limit": [0, 255, 256],
    "vlarb_high": ["", "0:255", "0:x", "99:1"], "vlarb_low": ["2:1", "0:1,2:1", "", "2:"],
    "bytes_per_node": [1, 1_500_000_000_000, 0], "eviction": ["lru", "ttl", "tool_wait", "fifo"],
    "ttl_s": [0.0, 30.0, -1.0], "write": ["through", "back", "around"],
    "de_hbm_reserve_fraction": [0, 0.99, 0.995], "pe_hbm_reserve_fraction": [0, 0.99], "pipeline_stages": [0, 1, 1024, 1025],
    "app": ["cluster", "other"], "latency_s": [0, 10, 11], "time_scale": [1e-6, 1e6, 1e-7, 2e6], "transport": ["ipc", "tcp"],
    "host": ["127.0.0.1", ""], "timeout_s": [1, 1e6, 2e6], "heartbeat_timeout_s": [0.1, 3600, 0.09, 5],
    "hang_timeout_s": [0.1, 3600, 3601, 3], "dataplane_endpoint": ["tcp://127.0.0.1:5550", "udp://x", ""],
    "backend": ["model", "host", "other"], "description": ["cluster.json", "", "../x.json"],
    "metrics_port": [-1, 0, 65_535, 65_536, -2], "byte_scale": [1e-3, 1, 0, 1.5],
    "storage_dir": ["", "/tmp"], "transfer_engine": ["zmq", "mooncake", "other"],
    "max_redispatches": [0, 3, 100, 101, -1], "read_timeout_s": [1e-3, 0.01, 3600, 3601, 0],
    "stall_timeout_s": [0, 60, 3600, 1e7, 59.9, 1.1e7, -1],
    "down_per_node_hour": [0, 1e-6, 1e-7, 3600, 3601], "degrade_per_node_hour": [0, 600],
    "latency_per_node_hour": [0, 600], "crash_per_node_hour": [0, 1e-6, 3600, 3601, 1e-7], "mean_duration_s": [1e-3, 1, 1e7, 0],
    "factor": [1e-9, 0.5, 1, 0], "restart_s": [1e-3, 1, 1e7, 1.1e7, 0],
}  # fmt: skip
_CLUSTER_BASE: dict[str, Any] = {
    "kind": "cluster",
    "systems": ["dualpath"],
    "deployment": {"model": "ds27b", "pe_nodes": 1, "de_nodes": 1, "prefill_ep_nodes": 1, "decode_ep_nodes": 1},
    "workload": {"agents": 2, "max_rounds": 2, "generator": {"base_trajectories": 4}},
}
_RUN_BASE: dict[str, Any] = {"app": "cluster", "seed": 1, "cluster": {}}


def _toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "-_" for c in key) and key.isascii() else _toml_string(key)


def _toml_string(text: str) -> str:
    out = ['"']
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _toml_value(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


def toml_text(document: dict[str, Any]) -> str:
    """``document`` as TOML: scalars and lists at the top, each table as an inline table."""
    return "".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in document.items())


@st.composite
def _scenario_dicts(draw: st.DrawFn, keys: dict[str, list[str]], base: dict[str, Any]) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(json.dumps(base)) if draw(st.integers(0, 7)) else {}
    for _ in range(draw(st.integers(0, 6))):
        table = draw(st.sampled_from(sorted(keys)))
        # Mostly known keys with values at and around their bounds; now and then anything at all.
        hostile = draw(st.integers(0, 3)) == 0
        key = draw(_strings().filter(bool)) if hostile and draw(st.booleans()) else draw(st.sampled_from(keys[table]))
        target = document
        for part in table.split(".") if table else []:
            if not isinstance(target.get(part), dict):
                target[part] = {}
            target = target[part]
        plausible = _PLAUSIBLE.get(key)
        target[key] = draw(_values()) if hostile or plausible is None else draw(st.sampled_from(plausible))
    return document


def scenario_documents() -> st.SearchStrategy[bytes]:
    """Cluster and run scenario TOML files: plausible ones with values near and past the limits, mutated."""
    documents = st.one_of(_scenario_dicts(_CLUSTER_KEYS, _CLUSTER_BASE), _scenario_dicts(_RUN_KEYS, _RUN_BASE))
    return mutated(documents.map(lambda d: toml_text(d).encode("utf-8")))


# -------------------------------------------------------------------------------------- JSONL traces


def _json_text(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text if not value.text.endswith(("inf", "nan")) else {"inf": "Infinity", "-inf": "-Infinity",
                                                                         "nan": "NaN"}.get(value.text, "NaN")  # fmt: skip
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{_json_text(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def _counts() -> st.SearchStrategy[Any]:
    return st.one_of(st.integers(1, 70_000), st.integers(0, 3), _numbers())


@st.composite
def _trace_lines(draw: st.DrawFn) -> list[str]:
    kind = draw(st.sampled_from(["trajectories", "mooncake", "other"]))
    lines: list[Any] = []
    if kind == "trajectories":
        header: dict[str, Any] = {"format": "dualpath-emu-trajectories", "version": 1}
        if draw(st.booleans()):
            header["trajectories"] = draw(_counts())
        if draw(st.integers(0, 3)) == 0:
            header[draw(st.sampled_from(["meta", "version", "format", "extra"]))] = draw(_values())
        lines.append(header)
        for i in range(draw(st.integers(0, 4))):
            ident = draw(st.sampled_from([f"t{i}", "t0", "", "x" * 100_000]) | _values(0))
            if draw(st.booleans()):
                rows = draw(st.lists(st.lists(_counts(), min_size=1, max_size=3), max_size=4))
                lines.append({"id": ident, "rounds": rows})
            else:
                rows = draw(st.lists(st.lists(_counts(), min_size=2, max_size=5), max_size=4))
                lines.append({"id": ident, "turns": rows})
    elif kind == "mooncake":
        for _ in range(draw(st.integers(0, 4))):
            length = draw(_counts())
            blocks = -(-length // 512) if isinstance(length, int) and 0 < length < 10**6 else draw(st.integers(0, 3))
            record = {"timestamp": draw(st.integers(0, 10**6) | _numbers()), "input_length": length,
                      "output_length": draw(_counts()), "hash_ids": list(range(min(blocks, 300)))}  # fmt: skip
            if draw(st.integers(0, 4)) == 0:
                record[draw(st.sampled_from(sorted(record)) | _strings())] = draw(_values())
            lines.append(record)
    else:
        lines = draw(st.lists(_values(), max_size=3))
    return [_json_text(line) for line in lines]


def trace_documents() -> st.SearchStrategy[bytes]:
    """Trajectory files and Mooncake traces: plausible lines with values near and past the limits, mutated."""
    return mutated(_trace_lines().map(lambda lines: ("\n".join(lines) + "\n").encode("utf-8")))


# -------------------------------------------------------------------------------------- mutations


@st.composite
def _mutate(draw: st.DrawFn, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(out)))
        op = draw(st.integers(0, 7))
        if op == 0:
            del out[at : at + draw(st.integers(1, 64))]
        elif op == 1:
            out[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == 2:
            out[at:at] = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\r", b"\n"]))
        elif op == 3:
            depth = draw(st.sampled_from([10, 200, 1_000, 5_000]))
            out[at:at] = draw(st.sampled_from([b"[", b"{", b"{a="])) * depth
        elif op == 4:
            end = min(len(out), at + draw(st.integers(1, 200)))
            out[at:at] = out[at:end] * draw(st.integers(1, 3))
        elif op == 5:
            del out[at:]
        elif op == 6:
            out[at:at] = draw(st.sampled_from([b" = 1\n", b"\n[x]\n", b"\n[[x]]\n", b'"', b"'''", b",", b"]", b"}"]))
        else:
            out[at:at] = draw(
                st.sampled_from([_HUGE_DIGITS.encode(), b"1e400", b"NaN", b"-Infinity", b"0x" + b"f" * 40])
            )
    return bytes(out)


def mutated(documents: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """``documents``, and byte-level mutations of them (a quarter)."""
    return st.one_of(documents, documents, documents, documents.flatmap(_mutate))


# -------------------------------------------------------------------------------------- the checks


class FuzzFailure(AssertionError):
    """A loader broke the property: something other than a valid object or a one-line error."""


def _check_message(error: BaseException, path: Path) -> None:
    message = str(error)
    if "\n" in message or len(message) > MAX_MESSAGE_CHARS:
        raise FuzzFailure(
            f"an error message of {len(message)} characters on {message.count(chr(10)) + 1} lines: {message[:300]!r}"
        )
    if not message.startswith(str(path)):
        raise FuzzFailure(f"an error that does not name the file first: {message[:300]!r}")


@contextlib.contextmanager
def _loaded(path: Path) -> Iterator[None]:
    """Run a loader: a UsageError must be one line naming ``path``; anything else escapes as a failure."""
    try:
        yield
    except UsageError as error:
        _check_message(error, path)
    except FuzzFailure:
        raise
    except Exception as error:  # noqa: BLE001 - anything else is what the fuzzer looks for
        raise FuzzFailure(f"{type(error).__name__} escaped: {str(error)[:300]}") from error


RUNS = [0]
"""Runs of accepted scenarios done (``--deep``)."""
RUN_ACCEPTED = False
"""Also run every accepted cluster scenario, cut to 2 agents × 1 round, for each of its systems (``--deep``):
it must end with a result or a one-line error (a time overflow the core reports), nothing else."""


def _accepted_cluster(scenario: ClusterScenario) -> None:
    """A scenario that loads must be one the core accepts and whose workload, if small, generates."""
    config = scenario.config
    derived(config)
    core = Core(sample_interval_ns=1_000_000_000)
    build_topology(core, config.node, config.pe_nodes, config.de_nodes, config.storage)
    if scenario.trace is None and config.agents <= 50 and scenario.generator.n_base <= 50:
        trajectories = scenario.trajectories()
        if len(trajectories) != config.agents:
            raise FuzzFailure(f"{len(trajectories)} trajectories for {config.agents} agents")
    if RUN_ACCEPTED and scenario.trace is None and scenario.generator.n_base <= 2_000:
        small = dataclasses.replace(scenario.with_overrides(agents=min(config.agents, 2)), max_rounds=1)
        trajectories = small.trajectories()
        for system in small.systems:
            RUNS[0] += 1
            try:
                run_system(small.config, system, trajectories, seed=small.seed)
            except CoreError as error:  # e.g. time past 2^64 ns: must be one line
                if "\n" in str(error) or len(str(error)) > MAX_MESSAGE_CHARS:
                    raise FuzzFailure(f"run {system}: a core error of {len(str(error))} characters") from error


def check_scenario(data: bytes, directory: Path) -> None:
    """Load ``data`` as a cluster scenario and as a run scenario; check the property."""
    path = directory / "scenario.toml"
    path.write_bytes(data)
    with _loaded(path):
        _accepted_cluster(load_cluster_scenario(path))
    check_run_scenario(path)


def check_run_scenario(path: Path) -> None:
    with _loaded(path):
        load_run_scenario(path, registry())


def check_trace(data: bytes, directory: Path) -> None:
    """Load ``data`` as a trace (either kind) and as a Mooncake trace; summarise what loads."""
    path = directory / "trace.jsonl"
    path.write_bytes(data)
    with _loaded(path):
        trace_stats(load_trace(path).trajectories)
    with _loaded(path):
        read_mooncake(path)


def check_cli(argv: list[str]) -> tuple[int, str]:
    """Run the CLI: it must exit 0 or 2, and on 2 print exactly one line on stderr. Returns (status, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli_main(argv)
    except Exception as error:  # noqa: BLE001
        raise FuzzFailure(f"{argv[:2]}: {type(error).__name__} escaped: {str(error)[:300]}") from error
    text = err.getvalue()
    if status not in (0, 2):
        raise FuzzFailure(f"{argv[:2]}: exit status {status}: {text[:300]!r}")
    if status == 2 and (text.count("\n") != 1 or not text.startswith("dualpath-emu: error: ")):
        raise FuzzFailure(f"{argv[:2]}: not one error line: {text[:300]!r}")
    return status, text


# -------------------------------------------------------------------------------------- the runner


@dataclass
class Counts:
    scenarios: int = 0
    traces: int = 0
    deadline: float = math.inf
    """``time.monotonic()`` after which the checks return at once, so that a batch ends soon after the budget."""

    @property
    def total(self) -> int:
        return self.scenarios + self.traces


def _targets(directory: Path, counts: Counts) -> list[tuple[str, st.SearchStrategy[bytes], Callable[[bytes], None]]]:
    def scenario(data: bytes) -> None:
        if time.monotonic() > counts.deadline:
            return
        counts.scenarios += 1
        check_scenario(data, directory)
        check_cli(["validate", str(directory / "scenario.toml")])

    def trace(data: bytes) -> None:
        if time.monotonic() > counts.deadline:
            return
        counts.traces += 1
        check_trace(data, directory)
        check_cli(["trace", "stats", str(directory / "trace.jsonl")])

    return [("scenarios", scenario_documents(), scenario), ("traces", trace_documents(), trace)]


def fuzz(seconds: float, examples: int | None, seed: int | None) -> int:
    """Run both targets, in batches of examples, until ``seconds`` pass (or ``examples`` ran); 0 if all held."""
    started = time.monotonic()
    counts = Counts(deadline=started + seconds)
    batch = 50 if RUN_ACCEPTED else 200
    round_ = 0
    with tempfile.TemporaryDirectory(prefix="dualpath-input-fuzz-") as tmp:
        directory = Path(tmp)
        targets = _targets(directory, counts)
        while True:
            for name, strategy, check in targets:
                spent = time.monotonic() - started
                if spent >= seconds or (examples is not None and counts.total >= examples):
                    runs = f", {RUNS[0]:,} runs of accepted scenarios" if RUN_ACCEPTED else ""
                    print(f"fuzz: inputs: ok, {counts.total:,} documents ({counts.scenarios:,} scenario TOML, "
                          f"{counts.traces:,} trace JSONL{runs}) in {spent:.0f} s")  # fmt: skip
                    return 0
                size = batch if examples is None else max(1, min(batch, (examples - counts.total + 1) // 2))
                test = settings(
                    max_examples=size, deadline=None, database=None, derandomize=False,
                    suppress_health_check=list(HealthCheck), print_blob=True,
                )(given(strategy)(check))  # fmt: skip
                if seed is not None:
                    test = hypothesis_seed(seed * 1_000 + round_)(test)
                try:
                    test()
                except (FuzzFailure, ExceptionGroup) as failure:  # a group: Hypothesis found several
                    print(f"fuzz: inputs: FAILED ({name}) after {counts.total:,} documents: {str(failure)[:500]}")
                    print(
                        "fuzz: inputs: the minimal document is printed above (Falsifying example); add it to "
                        "tests/data/bad_inputs/ with its expected error (tests/data/bad_inputs/expected.json)"
                    )
                    return 1
            round_ += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fuzz the scenario and trace loaders (see the module docstring).")
    parser.add_argument("--seconds", type=float, default=60.0, help="time budget (default 60)")
    parser.add_argument("--examples", type=int, help="stop after this many documents (with --seed: repeatable)")
    parser.add_argument("--seed", type=int, help="Hypothesis seed: the same seed and budget try the same documents")
    parser.add_argument("--deep", action="store_true", help="also run each accepted cluster scenario (2 agents, "
                        "1 round): slower, finds values that validate and then fail in a run")  # fmt: skip
    args = parser.parse_args(argv)
    global RUN_ACCEPTED
    RUN_ACCEPTED = args.deep
    os.environ.setdefault("COLUMNS", "120")
    return fuzz(args.seconds, args.examples, args.seed)


if __name__ == "__main__":
    sys.exit(main())
