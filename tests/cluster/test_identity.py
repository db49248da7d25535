"""Engine groups' typed identity (``dualpath_emu.cluster.identity``): names made and read in one place."""

from __future__ import annotations

from dualpath_emu.cluster.assemble import engine_names
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.faults import engine_group_names
from dualpath_emu.cluster.identity import GroupId


def test_a_group_id_is_its_name_and_reads_back() -> None:
    for group in (GroupId("pe", 0), GroupId("de", 3), GroupId("pe", 48), GroupId("de", 143)):
        assert GroupId.parse(group.name) == group and str(group) == group.name
    assert GroupId("pe", 2).prefill and not GroupId("de", 2).prefill
    for other in ("scheduler", "client", "faults", "pe", "de-1", "pe01", "xe3", "pe3 ", "de3.snic", "pe1234567"):
        assert GroupId.parse(other) is None, other


def test_every_engine_group_of_a_cluster_is_named_by_its_id() -> None:
    config = ClusterConfig(pe_nodes=4, de_nodes=3, prefill_ep_nodes=2, decode_ep_nodes=1)
    groups = [GroupId.parse(name) for name in engine_names(config)]
    assert [g for g in groups if g is not None] == [
        GroupId("pe", 0), GroupId("pe", 2), GroupId("de", 4), GroupId("de", 5), GroupId("de", 6),
    ]  # fmt: skip
    assert [GroupId.parse(n) for n in engine_group_names(4, 3, 2)] == [g for g in groups if g is not None]
