"""Issue 34: every fault target the reader accepts is one the run resolves. A target has one spelling, the
cluster's own (``n1.snic``, ``n0.cnic2.tx``, ``de2``: ASCII digits, no leading zeros, lower case, nothing
around it); another spelling is refused when the file is read, on one line naming the key, with the spelling to
use where a loose reading finds one. Before, ``n01.snic.rx`` or ``n٠.snic.rx`` passed ``validate`` and the run
died with a KeyError when the fault fired; ``n`` and 5,000 digits raised a ValueError from ``int``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpath_emu.cli import main
from dualpath_emu.cluster.catalog import MODELS
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.faults import Fault, FaultPlan, engine_group_names, target_ports
from dualpath_emu.cluster.run import run_system
from dualpath_emu.cluster.scenario import load_cluster_scenario
from dualpath_emu.config import ScenarioError
from dualpath_emu.workload.generator import generate

BASE = ('kind = "cluster"\nsystems = ["basic"]\n[deployment]\nmodel = "ds27b"\npe_nodes = 1\nde_nodes = 1\n'
        "prefill_ep_nodes = 1\ndecode_ep_nodes = 1\n[workload]\nagents = 2\nmax_rounds = 2\n")  # fmt: skip
NODES, GPUS, ENGINES = 2, 8, ("pe0", "de1")
CONFIG = ClusterConfig(model=MODELS["ds27b"], pe_nodes=1, de_nodes=1, prefill_ep_nodes=1, decode_ep_nodes=1, agents=2)
EXTRA = {"degrade": "factor = 0.5\nduration_s = 0.5\n", "down": "duration_s = 0.5\n", "latency": "latency_s = 0.001\n",
         "crash": "restart_s = 0.5\n", "slow_storage": "factor = 0.5\n"}  # fmt: skip


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: control characters escaped, the rest as it is (not as \\u escapes)."""
    return '"' + "".join(f"\\u{ord(c):04x}" if c in '"\\' or ord(c) < 0x20 or ord(c) == 0x7F else c for c in text) + '"'


def fault_toml(kind: str, target: str) -> str:
    return f'[[faults]]\nkind = "{kind}"\ntarget = {toml_string(target)}\nat_s = 0.01\n{EXTRA[kind]}'


def read(tmp_path: Path, kind: str, target: str) -> Fault:
    path = tmp_path / "s.toml"
    path.write_text(BASE + fault_toml(kind, target), encoding="utf-8")
    [fault] = load_cluster_scenario(path).config.faults.faults
    return fault


# Each of these was accepted before (the first group ran until the fault fired and died; the last raised when read).
@pytest.mark.parametrize(
    ("kind", "target", "write_it"),
    [
        ("degrade", "n01.snic.rx", "n1.snic.rx"),  # leading zero in a port: KeyError when the fault fired
        ("degrade", "n٠.snic.rx", "n0.snic.rx"),  # Arabic-Indic digit (Python's \d, int() reads it)
        ("degrade", "n0.cnic٣.tx", "n0.cnic3.tx"),
        ("degrade", "n0.cnic01.tx", "n0.cnic1.tx"),
        ("degrade", "n00.dram", "n0.dram"),
        ("down", "n१.snic.tx", "n1.snic.tx"),  # Devanagari
        ("degrade", "n０.snic", "n0.snic"),  # fullwidth: a NIC resolved, but reported as 'n０.snic'
        ("degrade", "n01", "n1"),
        ("latency", "n0.cnic00", "n0.cnic0"),
        ("degrade", "N1.SNIC", "n1.snic"),  # (refused before too, now with the spelling to use)
        ("degrade", " n1.snic. ", "n1.snic"),
        ("crash", "de01", "de1"),
        ("crash", "PE0", "pe0"),
        ("slow_storage", "Storage", "storage"),
    ],
)
def test_a_target_in_another_spelling_is_refused_with_the_one_to_use(
    tmp_path: Path, kind: str, target: str, write_it: str
) -> None:
    with pytest.raises(
        ScenarioError,
        match=r"key 'faults\[0\]\.target': expected .*\(write it '" + write_it.replace(".", r"\.") + "'\\)",
    ):
        read(tmp_path, kind, target)
    assert read(tmp_path, kind, write_it).target == write_it


@pytest.mark.parametrize(
    "target", ["n" + "9" * 5000, "n0.cnic" + "1" * 4400 + ".tx", "n+1", "n-0", "n1.snic\n", "n1..snic", "n 1"]
)
def test_a_target_that_is_no_name_is_one_line(tmp_path: Path, target: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE + fault_toml("degrade", target), encoding="utf-8")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "key 'faults[0].target'" in err and "Traceback" not in err, err[:400]


def test_target_ports_names_ports_as_the_topology_does() -> None:
    assert target_ports("n1.cnic7.tx", NODES, GPUS) == ("n1.cnic7.tx",)
    assert target_ports("n0.dram", NODES, GPUS) == ("n0.dram",)
    for other in ("n01.cnic7.tx", "n1.cnic07.tx", "n١.cnic7.tx", "n1.cnic7.TX", "n1.cnic7.tx.", "n1.cnic8.tx"):
        assert target_ports(other, NODES, GPUS) is None, other


def test_a_plan_built_in_python_with_a_target_the_cluster_lacks_is_refused_before_the_run() -> None:
    trajectories = [dataclasses.replace(t, append=t.append[:1], gen=t.gen[:1]) for t in generate("32k", 2, seed=1)]
    for fault in (Fault("degrade", "n01.snic.rx", 0.0, 1.0, 0.5), Fault("crash", "de01", 0.0, restart_s=1.0)):
        with pytest.raises(ValueError, match=r"faults\[0\]: the cluster has no .*'(n01\.snic\.rx|de01)'"):
            run_system(dataclasses.replace(CONFIG, faults=FaultPlan((fault,))), "basic", trajectories)


# --- a property: whatever the reader accepts resolves and runs; whatever it refuses is one line naming the key

_DIGITS = st.sampled_from(["0", "1", "7", "00", "01", "10", "٠", "١", "０", "１", "१", "𝟏", "¹", "+1", "-1", " 1", "1 ", "",
                           "99999999999", "1_0"])  # fmt: skip
_SEP = st.sampled_from([".", ". ", "..", "", "。", "．"])
_SPELLING = st.one_of(
    st.builds(lambda pre, n, sep, nic, g, end: f"{pre}{n}{sep}{nic}{g}{end}",
              st.sampled_from(["n", "N", " n", "ｎ", "pe", "de", "node"]), _DIGITS, _SEP,
              st.sampled_from(["snic", "SNIC", "cnic", "Cnic", "dram", "nic", ""]), st.sampled_from(["", "0", "1", "01", "٣", "7", "8"]),
              st.sampled_from(["", ".rx", ".tx", ".RX", ".rx.", ".", " ", "\t", ".up"])),
    st.builds(lambda pre, n: f"{pre}{n}", st.sampled_from(["pe", "de", "PE", "de ", "n"]), _DIGITS),
    st.sampled_from(["storage", "Storage", " storage", "3fs.read", "3FS.read", "3fs.write.", "3fs"]),
    st.text(max_size=12),
)  # fmt: skip


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(kind=st.sampled_from(sorted(EXTRA)), target=_SPELLING)
def test_every_accepted_spelling_resolves_and_runs(tmp_path: Path, kind: str, target: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE + fault_toml(kind, target), encoding="utf-8")
    try:
        scenario = load_cluster_scenario(path)
    except ScenarioError as error:
        line = str(error)
        assert "\n" not in line and "key 'faults[0].target'" in line, line
        return
    [fault] = scenario.config.faults.faults
    if kind == "crash":
        assert fault.target in engine_group_names(1, 1, 1)
    else:
        ports = target_ports(fault.target, NODES, GPUS)
        assert ports is not None and fault.target.isascii()
        assert set(ports) <= set(port_ids_of_config())
    # The run itself: the fault fires (at 10 ms) and ends without raising.
    result = run_system(scenario.config, "basic", scenario.trajectories())
    assert [f["target"] for f in result.extra["faults"]] == [fault.target]


def port_ids_of_config() -> dict[str, int]:
    from dualpath_emu._core import Core
    from dualpath_emu.cluster.topology import build_topology, port_names

    core = Core()
    return port_names(build_topology(core, CONFIG.node, CONFIG.pe_nodes, CONFIG.de_nodes, CONFIG.storage))
