"""Virtual-lane arbitration through the binding: ``Arbitration`` (the InfiniBand ``qos_*`` knobs and the
fluid rate model) against ``PacketArbiter`` (the exact per-packet reference), paper §5 and App. A.1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_emu._core import Arbitration, PacketArbiter
from dualpath_emu.errors import ConfigError, InvalidArgumentError

N_LANES = 16
PAPER_HIGH = "0:192,1:192,2:0,3:192"
PAPER_LOW = "0:192,1:192,2:64,3:192"


def sequence(arbitration: Arbitration, mtu: int, backlogged: Iterable[int], n: int) -> list[int]:
    """The lanes of the next `n` packets when the `backlogged` lanes always hold `mtu`-byte packets."""
    arbiter = PacketArbiter(arbitration)
    head = [0] * N_LANES
    for lane in backlogged:
        head[lane] = mtu
    out: list[int] = []
    for _ in range(n):
        sent = arbiter.select(head)
        if sent is None:
            break
        out.append(sent)
    return out


def measured_shares(arbitration: Arbitration, mtu: int, backlogged: Iterable[int], n: int) -> list[float]:
    """Fraction of `n` packet slots each lane used (all packets `mtu` bytes, so also of the bytes)."""
    counts = [0] * N_LANES
    for lane in sequence(arbitration, mtu, backlogged, n):
        counts[lane] += 1
    return [c / n for c in counts]


# ---------------------------------------------------------------------------------------------------
# Configuration


def test_parse_the_paper_config() -> None:
    cfg = Arbitration.parse(4, 240, PAPER_HIGH, PAPER_LOW)
    assert cfg.max_vls == 4
    assert cfg.high_limit == 240
    assert cfg.high == [(0, 192), (1, 192), (2, 0), (3, 192)]
    assert cfg.low == [(0, 192), (1, 192), (2, 64), (3, 192)]
    assert cfg == Arbitration.paper()
    assert cfg != Arbitration.parse(4, 239, PAPER_HIGH, PAPER_LOW)
    assert repr(cfg) == f'Arbitration.parse(4, 240, "{PAPER_HIGH}", "{PAPER_LOW}")'
    assert eval(repr(cfg), {"Arbitration": Arbitration}) == cfg


def test_parse_accepts_empty_tables_and_spaces() -> None:
    cfg = Arbitration.parse(2, 0, "", " 0 : 1 , 1:2 ")
    assert cfg.high == []
    assert cfg.low == [(0, 1), (1, 2)]


def test_constructors() -> None:
    sp = Arbitration.strict_priority([1], [0])
    assert (sp.max_vls, sp.high_limit, sp.high, sp.low) == (2, 255, [(1, 1)], [(0, 1)])
    fair = Arbitration.fair(3)
    assert (fair.max_vls, fair.high, fair.low) == (3, [], [(0, 1), (1, 1), (2, 1)])
    wrr = Arbitration.weighted_round_robin([(0, 1), (3, 3)])
    assert (wrr.max_vls, wrr.high_limit, wrr.high, wrr.low) == (4, 255, [], [(0, 1), (3, 3)])


@pytest.mark.parametrize(
    ("max_vls", "high", "low", "knob"),
    [
        (0, "0:1", "", "qos_max_vls"),
        (16, "0:1", "", "qos_max_vls"),
        (4, "0:1,1:1,2:1,4:1", "", "qos_vlarb_high entry 3"),
        (4, "0:1", "3:1,2:9,4:0", "qos_vlarb_low entry 2"),
        (4, "0:0,1:0", "2:0", "qos_vlarb_high, qos_vlarb_low"),
        (4, "", "", "qos_vlarb_high, qos_vlarb_low"),
        (4, "0:192,1", "", "qos_vlarb_high entry 1"),
        (4, "0:256", "", "qos_vlarb_high entry 0"),
        (4, "0:1", "x:1", "qos_vlarb_low entry 0"),
        (4, "0:1", "1:-1", "qos_vlarb_low entry 0"),
        (4, "0:1,", "", "qos_vlarb_high entry 1"),
        (4, "", ",".join(["0:1"] * 65), "qos_vlarb_low"),
    ],
)
def test_parse_errors_name_the_knob(max_vls: int, high: str, low: str, knob: str) -> None:
    with pytest.raises(ConfigError) as info:
        Arbitration.parse(max_vls, 0, high, low)
    assert str(info.value).startswith(f"{knob}: "), str(info.value)


def test_a_full_table_of_64_entries_is_accepted() -> None:
    assert len(Arbitration.parse(4, 0, "", ",".join(["0:1"] * 64)).low) == 64


@pytest.mark.parametrize(
    ("call", "prefix"),
    [
        (lambda: Arbitration.parse(-1, 0, "0:1", ""), "qos_max_vls:"),
        (lambda: Arbitration.parse(4, 256, "0:1", ""), "qos_high_limit:"),
        (lambda: Arbitration.parse(4, 1.5, "0:1", ""), "qos_high_limit:"),  # type: ignore[arg-type]
        (lambda: Arbitration.strict_priority([16], [0]), "high[0]:"),
        (lambda: Arbitration.strict_priority([0], [0, -1]), "low[1]:"),
        (lambda: Arbitration.weighted_round_robin([(0, 256)]), "entries[0].weight:"),
        (lambda: Arbitration.weighted_round_robin([(0, 1), (16, 1)]), "entries[1].lane:"),
        (lambda: Arbitration.weighted_round_robin([(0, 1, 2)]), "entries[0]:"),  # type: ignore[list-item]
        (lambda: Arbitration.fair(16), "n_lanes:"),
        (lambda: Arbitration.paper().saturated_shares(0, [0]), "mtu_bytes:"),
        (lambda: Arbitration.paper().saturated_shares(4096, [16]), "backlogged[0]:"),
        (lambda: Arbitration.paper().allocate(4096, 0.0, [1.0]), "capacity:"),
        (lambda: Arbitration.paper().allocate(4096, 1.0, [math.nan]), "demands:"),
        (lambda: Arbitration.paper().allocate(4096, 1.0, [1.0] * 17), "demands:"),
        (lambda: PacketArbiter(Arbitration.paper()).select([1] * 17), "head_bytes:"),
        (lambda: PacketArbiter(Arbitration.paper()).select([1, -1]), "head_bytes[1]:"),
    ],
)
def test_bad_arguments_name_the_argument(call: object, prefix: str) -> None:
    assert callable(call)
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert str(info.value).startswith(prefix), str(info.value)


def test_constructors_that_build_an_invalid_table_are_config_errors() -> None:
    with pytest.raises(ConfigError) as info:
        Arbitration.weighted_round_robin([(0, 0)])
    assert str(info.value).startswith("qos_vlarb_high, qos_vlarb_low: ")
    with pytest.raises(InvalidArgumentError, match="^n_lanes: "):
        Arbitration.fair(0)


# ---------------------------------------------------------------------------------------------------
# The rate model against the packet arbiter, by hand.


def test_paper_saturated_shares_and_the_packet_arbiter_agree_exactly() -> None:
    # Inference on VL0 and KV on VL2, 4 KiB MTU: 240 high packets per low turn, and VL2 gets 1 of the low
    # table's 3 + 1 packets per cycle, so 1/964 of the port (§6: ~0.1%).
    shares = Arbitration.paper().saturated_shares(4096, [0, 2])
    assert len(shares) == N_LANES
    assert shares[2] == pytest.approx(1 / 964, abs=1e-12)
    assert shares[0] == pytest.approx(963 / 964, abs=1e-12)
    assert sum(shares) == pytest.approx(1.0, abs=1e-12)
    # The arbiter's pattern repeats every 964 packets, so whole periods measure the shares exactly.
    assert measured_shares(Arbitration.paper(), 4096, [0, 2], 964 * 5) == pytest.approx(shares, abs=1e-12)


def test_paper_saturated_shares_with_every_lane_backlogged() -> None:
    # High table: VL0, VL1, VL3 at 3 packets each (VL2 has weight 0); 240/241 of the port.
    # Low table: VL0, VL1, VL3 at 3 packets and VL2 at 1 (10 a cycle); 1/241 of the port.
    shares = Arbitration.paper().saturated_shares(4096, [0, 1, 2, 3])
    inference = 240 / 241 / 3 + 1 / 241 * 3 / 10
    assert shares[:4] == pytest.approx([inference, inference, 1 / 241 / 10, inference], abs=1e-12)
    assert shares[4:] == [0.0] * 12
    # Lanes the config does not serve get nothing, and alone they get nothing at all.
    assert Arbitration.paper().saturated_shares(4096, [7]) == [0.0] * N_LANES


def test_limit_255_starves_the_low_table() -> None:
    cfg = Arbitration.strict_priority([0], [1])
    assert set(sequence(cfg, 4096, [0, 1], 10_000)) == {0}
    assert cfg.saturated_shares(4096, [0, 1])[:2] == [1.0, 0.0]
    # ...but the low table gets whatever the high one leaves idle.
    assert sequence(cfg, 4096, [1], 3) == [1, 1, 1]
    assert cfg.saturated_shares(4096, [1])[:2] == [0.0, 1.0]


def test_limit_0_alternates_one_high_one_low_packet() -> None:
    cfg = Arbitration.parse(3, 0, "0:1,1:1", "2:1")
    assert sequence(cfg, 4096, [0, 1, 2], 8) == [0, 2, 1, 2, 0, 2, 1, 2]
    assert cfg.saturated_shares(4096, [0, 1, 2])[:3] == [0.25, 0.25, 0.5]


def test_limit_240_sends_960_kib_of_high_per_low_packet() -> None:
    cfg = Arbitration.parse(2, 240, "0:1", "1:1")
    seq = sequence(cfg, 4096, [0, 1], 2 * 241)
    assert seq == ([0] * 240 + [1]) * 2
    # With 1 KiB packets the same limit is 960 packets.
    assert cfg.saturated_shares(1024, [0, 1])[1] == pytest.approx(1 / 961, abs=1e-15)


def test_weighted_round_robin_one_to_three() -> None:
    cfg = Arbitration.weighted_round_robin([(0, 1), (1, 3)])
    shares = cfg.saturated_shares(64, [0, 1])
    assert shares[:2] == [0.25, 0.75]
    assert sequence(cfg, 64, [0, 1], 8) == [0, 1, 1, 1, 0, 1, 1, 1]
    assert measured_shares(cfg, 64, [0, 1], 10_001) == pytest.approx(shares, abs=0.01)


def test_weights_are_quantised_to_whole_packets() -> None:
    # 64 B and 4096 B both round up to one 4 KiB packet per turn.
    cfg = Arbitration.weighted_round_robin([(0, 1), (1, 64)])
    assert sequence(cfg, 4096, [0, 1], 4) == [0, 1, 0, 1]
    # 6 KiB is two packets: the overshoot of the second is lost, not carried over.
    cfg = Arbitration.weighted_round_robin([(0, 96), (1, 64)])
    assert sequence(cfg, 4096, [0, 1], 6) == [0, 0, 1, 0, 0, 1]
    assert cfg.saturated_shares(4096, [0, 1])[0] == pytest.approx(2 / 3, abs=1e-15)


def test_round_robin_position_survives_the_high_limit() -> None:
    cfg = Arbitration.parse(3, 0, "0:1", "1:128,2:64")
    assert sequence(cfg, 4096, [0, 1, 2], 12) == [0, 1, 0, 1, 0, 2, 0, 1, 0, 1, 0, 2]


def test_packet_arbiter_selects_nothing_when_every_lane_is_empty() -> None:
    arbiter = PacketArbiter(Arbitration.paper())
    assert arbiter.select([]) is None
    assert arbiter.select([0] * N_LANES) is None
    assert arbiter.select([0, 0, 0, 0, 4096]) is None  # VL4 is not served
    assert arbiter.select([0, 0, 4096]) == 2


def test_allocate_leaves_a_satisfied_high_lanes_share_to_the_high_table() -> None:
    # VL0 (high, demand 0.3) satisfied, VL1 (high) and VL2 (low) saturated, 4 high packets per low one:
    # the high table still holds 4/5 of the port, so VL1 gets 0.8 - 0.3 and VL2 0.2.
    cfg = Arbitration.parse(3, 1, "0:16,1:16", "2:16")
    out = cfg.allocate(1024, 1.0, [0.3, math.inf, math.inf])
    assert out[:3] == pytest.approx([0.3, 0.5, 0.2], abs=1e-12)
    assert out[3:] == [0.0] * 13


def test_allocate_with_unbounded_demand_is_the_saturated_shares() -> None:
    demand = [0.0] * N_LANES
    demand[1] = demand[2] = demand[7] = math.inf  # VL7 is not served: it gets nothing
    out = Arbitration.paper().allocate(2048, 100.0, demand)
    shares = Arbitration.paper().saturated_shares(2048, [1, 2, 7])
    assert out == pytest.approx([100 * s for s in shares], abs=1e-9)
    assert out[7] == 0.0


# ---------------------------------------------------------------------------------------------------
# Property: the packet arbiter's long-run byte shares are `saturated_shares`.
#
# Over n packets a lane's count is off its long-run value by less than one round-robin cycle of each
# table plus one high/low turn (the table split is periodic to within one packet, and each table's round
# robin to within one cycle of its entries). So with C = packets in a cycle of both tables + 2 and
# n >= C / TOLERANCE * SAFETY, the measured shares are within TOLERANCE of the model.
#
# To keep this fast in Python (about 1.5 µs per `select`), cycles are kept short: MTU 2048 or 4096 and
# weights 0..255 make each entry at most ceil(255 * 64 / 2048) = 8 packets, and at most 4 entries per
# table bound C by 2 * 4 * 8 + 2 = 66, so n <= 66 / 0.01 * 1.5 ≈ 10k packets per example. The high
# limit is any 0..255: it sets the high/low turn length, which adds at most one packet of error, not
# one turn.

TOLERANCE = 0.01
SAFETY = 1.5


@st.composite
def arbitrations(draw: st.DrawFn) -> Arbitration:
    max_vls = draw(st.integers(1, 6))
    entry = st.tuples(st.integers(0, max_vls - 1), st.integers(0, 255))
    high = draw(st.lists(entry, min_size=0, max_size=4))
    low = draw(st.lists(entry, min_size=0 if high else 1, max_size=4))
    # A config without a nonzero weight is rejected (tested above); make the last entry count.
    if not any(w for _, w in high + low):
        table = low or high  # one of them has an entry
        table[-1] = (table[-1][0], draw(st.integers(1, 255)))
    limit = draw(st.sampled_from([0, 1, 2, 240, 254, 255]) | st.integers(0, 255))
    return Arbitration.parse(max_vls, limit, knob(high), knob(low))


def knob(table: Iterable[tuple[int, int]]) -> str:
    """A table as its ``qos_vlarb_*`` text."""
    return ",".join(f"{lane}:{weight}" for lane, weight in table)


def cycle_packets(cfg: Arbitration, mtu: int) -> int:
    return sum(-(-weight * 64 // mtu) for _, weight in cfg.high + cfg.low)


@given(cfg=arbitrations(), mtu=st.sampled_from([2048, 4096]), backlogged=st.sets(st.integers(0, 5), min_size=1))
def test_packet_arbiter_long_run_shares_match_saturated_shares(
    cfg: Arbitration, mtu: int, backlogged: set[int]
) -> None:
    lanes = sorted(lane for lane in backlogged if lane < cfg.max_vls)
    model = cfg.saturated_shares(mtu, lanes)
    n = max(1_000, math.ceil((cycle_packets(cfg, mtu) + 2) / TOLERANCE * SAFETY))
    measured = measured_shares(cfg, mtu, lanes, n)
    for lane in range(N_LANES):
        assert abs(measured[lane] - model[lane]) <= TOLERANCE, (lane, measured, model)
    served = any(cfg.saturated_shares(mtu, [lane])[lane] > 0 for lane in lanes)
    assert sum(model) == pytest.approx(1.0 if served else 0.0, abs=1e-12)


@given(cfg=arbitrations(), mtu=st.sampled_from([256, 1024, 4096]), data=st.data())
def test_allocate_is_feasible_and_at_most_the_demand(cfg: Arbitration, mtu: int, data: st.DataObject) -> None:
    demand: Sequence[float] = data.draw(
        st.lists(st.sampled_from([0.0, math.inf]) | st.floats(0.0, 10.0), min_size=N_LANES, max_size=N_LANES)
    )
    capacity = data.draw(st.floats(1e-3, 10.0))
    out = cfg.allocate(mtu, capacity, demand)
    assert sum(out) <= capacity * (1 + 1e-12)
    for lane in range(N_LANES):
        assert 0.0 <= out[lane] <= demand[lane]
    # Work conserving: if capacity is left over, every served lane got its whole demand.
    if sum(out) < capacity * (1 - 1e-9):
        for lane in range(N_LANES):
            if cfg.saturated_shares(mtu, [lane])[lane] > 0:
                assert out[lane] >= demand[lane] * (1 - 1e-9), (lane, out, demand)
