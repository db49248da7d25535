"""``PacketPort`` through the binding: the token-bucket pacer a hardware backend uses to move real bytes in
chunks, with the virtual-lane arbitration of paper §5 / App. A.1 holding on those chunks (core/src/packet_port.rs).
"""

from __future__ import annotations

import inspect
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_emu._core import Arbitration, PacketPort
from dualpath_emu.errors import InvalidArgumentError

NS_PER_S = 1_000_000_000
CHUNK = 65536

Grant = tuple[int, int, int, bool]


def unpaced(arbitration: Arbitration | None = None, chunk_bytes: int = CHUNK) -> PacketPort:
    """A port whose bucket never limits, so only the order of the chunks is under test."""
    return PacketPort(1e9, burst_bytes=math.inf, arbitration=arbitration, chunk_bytes=chunk_bytes)


def drain(port: PacketPort, t_ns: int = 0) -> list[tuple[int, Grant]]:
    """Grant everything queued, each time at ``next_grant_ns``, checking that the nanosecond before grants
    nothing and that time does; returns ``(time, grant)`` pairs."""
    out: list[tuple[int, Grant]] = []
    while (next_ns := port.next_grant_ns(t_ns)) is not None:
        if next_ns > t_ns:
            assert port.grant(next_ns - 1) == [], next_ns
        granted = port.grant(next_ns)
        assert granted, f"nothing granted at next_grant_ns {next_ns}"
        out.extend((next_ns, g) for g in granted)
        t_ns = next_ns
    return out


def lanes(grants: list[Grant]) -> list[int]:
    return [lane for _, lane, _, _ in grants]


# ---------------------------------------------------------------------------------------------------
# Construction, chunks and counters


def test_defaults_and_properties() -> None:
    port = PacketPort(1e6)
    assert (port.rate_bytes_per_s, port.burst_bytes, port.chunk_bytes) == (1e6, float(CHUNK), CHUNK)
    port = PacketPort(2.5e9, burst_bytes=1e6, chunk_bytes=1500, arbitration=Arbitration.paper())
    assert (port.rate_bytes_per_s, port.burst_bytes, port.chunk_bytes) == (2.5e9, 1e6, 1500)
    assert port.next_grant_ns(0) is None
    assert (port.queued_bytes(), port.granted_bytes(), port.queued_messages()) == (0, 0, 0)
    assert port.grant(0) == []
    # The signature shows the defaults the core applies (core/src/python.rs writes them out by hand).
    assert inspect.signature(PacketPort).parameters["chunk_bytes"].default == PacketPort(1.0).chunk_bytes


def test_messages_are_cut_into_chunks_and_counted_per_lane() -> None:
    port = unpaced(chunk_bytes=4096)
    port.enqueue(3, 10_000, 7)
    port.enqueue(5, 4096, 8)
    assert (port.queued_bytes(), port.queued_bytes(3), port.queued_bytes(5), port.queued_messages()) == (
        14_096,
        10_000,
        4096,
        2,
    )
    assert port.grant(0) == [(7, 3, 4096, False), (7, 3, 4096, False), (7, 3, 1808, True), (8, 5, 4096, True)]
    assert (port.granted_bytes(), port.granted_bytes(3), port.granted_bytes(5), port.granted_bytes(0)) == (
        14_096,
        10_000,
        4096,
        0,
    )
    assert (port.queued_bytes(), port.queued_messages()) == (0, 0)


def test_max_chunks_caps_one_call() -> None:
    port = unpaced(chunk_bytes=100)
    port.enqueue(0, 10_000, 1)
    assert len(port.grant(0)) == 100
    port.enqueue(0, 1_000_000, 2)
    assert len(port.grant(0, 7)) == 7
    assert len(port.grant(0)) == inspect.signature(PacketPort.grant).parameters["max_chunks"].default == 4096
    assert port.next_grant_ns(0) == 0


# ---------------------------------------------------------------------------------------------------
# The token bucket


def test_long_run_rate_is_exact() -> None:
    # 10 MB at 1 MB/s with a one-chunk burst: chunk k may go once the bucket has refilled past
    # k * chunk - burst bytes, i.e. the first nanosecond after (k * chunk - burst) µs. Every grant lands
    # within a nanosecond of that however many came before (no drift), and all by 10 s.
    rate, total = 1e6, 10_000_000
    port = PacketPort(rate)
    port.enqueue(0, total, 1)
    grants = drain(port)
    assert len(grants) == -(-total // CHUNK)
    granted = 0
    for k, (t_ns, (_, _, size, _)) in enumerate(grants):
        owed_ns = (k * CHUNK - CHUNK) * 1000
        exact_ns = 0 if owed_ns < 0 else owed_ns + 1
        assert abs(t_ns - exact_ns) <= 1, (k, t_ns, exact_ns)
        granted += size
        assert granted <= CHUNK + rate * t_ns / NS_PER_S + CHUNK
    assert granted == total == port.granted_bytes()
    last_ns, (_, _, last_size, last) = grants[-1]
    assert last and last_ns <= 10 * NS_PER_S
    # ...and not earlier than the bucket allows: the bytes before the last chunk, less the burst, needed their time.
    assert last_ns >= (total - last_size - CHUNK) / rate * NS_PER_S


def test_a_burst_goes_at_once_then_chunks_are_paced_with_debt() -> None:
    # 0.7 bytes per ns, a burst of 4 chunks of 1000 bytes.
    port = PacketPort(0.7e9, burst_bytes=4000, chunk_bytes=1000)
    port.enqueue(0, 10_000, 1)
    assert len(port.grant(0)) == 4
    # At 0 tokens: one nanosecond later the bucket holds some, and a whole chunk may go...
    assert port.next_grant_ns(0) == 1
    assert len(port.grant(1)) == 1
    # ...leaving 999.3 bytes of debt, repaid after 1427.6 ns.
    assert port.next_grant_ns(1) == 1429
    assert port.grant(1428) == []
    assert len(port.grant(1429)) == 1
    # An idle bucket fills up to the burst, no more.
    assert len(port.grant(NS_PER_S)) == 4
    assert port.queued_messages() == 0


@pytest.mark.parametrize("rate", [1e6, 3e6 + 1, 7.77e9, 123.456])
def test_next_grant_ns_is_the_first_nanosecond_that_grants(rate: float) -> None:
    port = PacketPort(rate, chunk_bytes=1500)
    port.enqueue(1, 1_000_000, 0)
    t_ns = 0
    for _ in range(50):
        next_ns = port.next_grant_ns(t_ns)
        assert next_ns is not None and next_ns >= t_ns
        if next_ns > t_ns:
            assert port.grant(next_ns - 1) == []
        assert port.grant(next_ns) != []
        t_ns = next_ns


# ---------------------------------------------------------------------------------------------------
# Lanes on real bytes


def test_a_high_lane_message_overtakes_queued_low_lane_chunks() -> None:
    # The paper's config: model traffic on VL0 (high table), KV cache on VL2 (low table only).
    port = PacketPort(1e9, arbitration=Arbitration.paper())
    for tag in range(100):
        port.enqueue(2, CHUNK, tag)
    port.enqueue(0, 3 * CHUNK, 100)
    grants = [g for _, g in drain(port)]
    assert lanes(grants) == [0] * 3 + [2] * 100
    assert grants[2] == (100, 0, CHUNK, True)


def test_without_arbitration_every_lane_waits_in_one_fifo() -> None:
    port = unpaced()
    for tag in range(100):
        port.enqueue(2, CHUNK, tag)
    port.enqueue(0, 3 * CHUNK, 100)
    grants = port.grant(0)
    assert lanes(grants) == [2] * 100 + [0] * 3
    assert [tag for tag, _, _, _ in grants] == list(range(100)) + [100] * 3
    assert (port.granted_bytes(0), port.granted_bytes(2)) == (3 * CHUNK, 100 * CHUNK)


def test_the_paper_high_limit_lets_the_kv_lane_through() -> None:
    # 240 * 4 KiB of high-table bytes between low-table chunks: 15 chunks of 64 KiB. VL0 is in the low table
    # too, so low turns alternate between VL0 and VL2: VL2 gets one chunk in 32 of a backlogged port.
    port = unpaced(Arbitration.paper())
    port.enqueue(0, 128 * CHUNK, 0)
    port.enqueue(2, 4 * CHUNK, 1)
    assert lanes(port.grant(0, 96)) == ([0] * 31 + [2]) * 3


def test_weighted_round_robin_follows_the_weights_within_a_chunk_per_round() -> None:
    # Two low lanes, weights 1 KiB and 3 KiB, 1000-byte chunks: each visit of a lane sends its weight,
    # overshooting by less than one chunk (the IB quantum; the overshoot is lost, not carried over).
    port = unpaced(Arbitration.weighted_round_robin([(0, 16), (1, 48)]), chunk_bytes=1000)
    port.enqueue(0, 1_000_000, 0)
    port.enqueue(1, 1_000_000, 1)
    visits: list[list[int]] = []  # [lane, bytes] per run of one lane
    for _, lane, size, _ in port.grant(0, 600):
        if visits and visits[-1][0] == lane:
            visits[-1][1] += size
        else:
            visits.append([lane, size])
    assert len(visits) == 200
    for lane, sent in visits:
        weight = 1024 if lane == 0 else 3072
        assert weight <= sent < weight + 1000, (lane, sent)
    assert (port.granted_bytes(0), port.granted_bytes(1)) == (200_000, 400_000)


# ---------------------------------------------------------------------------------------------------
# Cancel


def test_cancel_drops_exactly_the_rest_of_a_message() -> None:
    port = PacketPort(1e6, chunk_bytes=1000, arbitration=Arbitration.strict_priority([0], [1]))
    port.enqueue(1, 4500, 7)
    port.enqueue(1, 2000, 8)
    port.enqueue(0, 300, 7)
    port.enqueue(0, 100, 9)
    assert port.grant(0, 3) == [(7, 0, 300, True), (9, 0, 100, True), (7, 1, 1000, False)]
    assert port.cancel(7) == 3500
    assert port.cancel(7) == 0
    assert port.cancel(12345) == 0
    assert (port.queued_bytes(), port.queued_bytes(1), port.queued_messages()) == (2000, 2000, 1)
    assert port.granted_bytes() == 1400
    assert [g for _, g in drain(port)] == [(8, 1, 1000, False), (8, 1, 1000, True)]


# ---------------------------------------------------------------------------------------------------
# Bad arguments


def _backwards_grant() -> None:
    port = PacketPort(1e6)
    port.grant(10)
    port.grant(9)


def _backwards_next_grant() -> None:
    port = PacketPort(1e6)
    port.grant(10)
    port.next_grant_ns(9)


@pytest.mark.parametrize(
    ("call", "prefix"),
    [
        (lambda: PacketPort(0.0), "rate_bytes_per_s:"),
        (lambda: PacketPort(-1.0), "rate_bytes_per_s:"),
        (lambda: PacketPort(math.inf), "rate_bytes_per_s:"),
        (lambda: PacketPort(math.nan), "rate_bytes_per_s:"),
        (lambda: PacketPort("fast"), "rate_bytes_per_s:"),  # type: ignore[arg-type]
        (lambda: PacketPort(1e6, chunk_bytes=0), "chunk_bytes:"),
        (lambda: PacketPort(1e6, chunk_bytes=-1), "chunk_bytes:"),
        (lambda: PacketPort(1e6, chunk_bytes=2**32), "chunk_bytes:"),
        (lambda: PacketPort(1e6, chunk_bytes=1.5), "chunk_bytes:"),  # type: ignore[arg-type]
        (lambda: PacketPort(1e6, burst_bytes=CHUNK - 1), "burst_bytes:"),
        (lambda: PacketPort(1e6, burst_bytes=math.nan), "burst_bytes:"),
        (lambda: PacketPort(1e6, burst_bytes=1000, chunk_bytes=1001), "burst_bytes:"),
        (lambda: PacketPort(1e6).enqueue(16, 1, 0), "lane:"),
        (lambda: PacketPort(1e6).enqueue(-1, 1, 0), "lane:"),
        (lambda: PacketPort(1e6, arbitration=Arbitration.paper()).enqueue(4, 1, 0), "lane:"),
        (lambda: PacketPort(1e6).enqueue(0, 0, 0), "size_bytes:"),
        (lambda: PacketPort(1e6).enqueue(0, -1, 0), "size_bytes:"),
        (lambda: PacketPort(1e6).enqueue(0, 1, -1), "tag:"),
        (lambda: PacketPort(1e6).enqueue(0, 1, 2**64), "tag:"),
        (lambda: PacketPort(1e6).grant(-1), "now_ns:"),
        (lambda: PacketPort(1e6).grant(0, 0), "max_chunks:"),
        (lambda: PacketPort(1e6).grant(0, 1.5), "max_chunks:"),  # type: ignore[arg-type]
        (_backwards_grant, "now_ns:"),
        (_backwards_next_grant, "now_ns:"),
        (lambda: PacketPort(1e6).next_grant_ns(-1), "now_ns:"),
        (lambda: PacketPort(1e6).cancel(-1), "tag:"),
        (lambda: PacketPort(1e6).queued_bytes(16), "lane:"),
        (lambda: PacketPort(1e6).granted_bytes(-1), "lane:"),
    ],
)
def test_bad_arguments_name_the_argument(call: object, prefix: str) -> None:
    assert callable(call)
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert str(info.value).startswith(prefix), str(info.value)


def test_a_rejected_message_leaves_the_port_unchanged() -> None:
    port = PacketPort(1e6, arbitration=Arbitration.paper())
    port.enqueue(0, 2**64 - 1, 0)
    with pytest.raises(InvalidArgumentError, match="^size_bytes: "):
        port.enqueue(2, 1, 1)
    assert (port.queued_bytes(), port.queued_bytes(2), port.queued_messages()) == (2**64 - 1, 0, 1)


# ---------------------------------------------------------------------------------------------------
# Property: paced, exact, and FIFO per lane.

# Each serves lanes 0..=2.
ARBITRATIONS = [
    None,
    Arbitration.paper(),
    Arbitration.strict_priority([0], [1, 2]),
    Arbitration.parse(3, 0, "0:64,1:16", "2:64,0:8"),
    Arbitration.weighted_round_robin([(0, 1), (1, 3), (2, 200)]),
]


@given(
    arbitration=st.sampled_from(ARBITRATIONS),
    rate=st.floats(1e3, 1e10),
    chunk=st.sampled_from([64, 1500, CHUNK]),
    burst_chunks=st.none() | st.floats(1.0, 8.0),
    events=st.lists(
        st.tuples(st.integers(0, 5_000_000), st.integers(0, 2), st.integers(1, 20_000)), min_size=1, max_size=20
    ),
)
def test_port_is_paced_and_grants_every_byte_once_in_lane_order(
    arbitration: Arbitration | None,
    rate: float,
    chunk: int,
    burst_chunks: float | None,
    events: list[tuple[int, int, int]],
) -> None:
    """Driven at its ``next_grant_ns`` times with messages arriving in between (as a backend sleeping until
    then would): the bytes granted by any time t never exceed burst + rate * t + chunk, nothing is granted a
    nanosecond before a ``next_grant_ns``, and every enqueued byte is granted exactly once, in FIFO order per
    lane (in enqueue order overall without an arbitration)."""
    port = PacketPort(
        rate,
        burst_bytes=None if burst_chunks is None else burst_chunks * chunk,
        arbitration=arbitration,
        chunk_bytes=chunk,
    )
    burst = port.burst_bytes
    expected: list[Grant] = []
    grants: list[tuple[int, Grant]] = []
    t_ns = 0
    for tag, (gap_ns, lane, size) in enumerate(events):
        arrive_ns = t_ns + gap_ns
        while (next_ns := port.next_grant_ns(t_ns)) is not None and next_ns < arrive_ns:
            if next_ns > t_ns:
                assert port.grant(next_ns - 1) == []
            granted = port.grant(next_ns, 5)
            assert granted
            grants.extend((next_ns, g) for g in granted)
            t_ns = next_ns
        t_ns = arrive_ns
        port.enqueue(lane, size, tag)
        n_chunks = -(-size // chunk)
        expected.extend((tag, lane, min(chunk, size - k * chunk), k == n_chunks - 1) for k in range(n_chunks))
    grants.extend(drain(port, t_ns))

    granted_bytes = 0
    for at_ns, (_, _, size, _) in grants:
        granted_bytes += size
        bound = burst + rate * at_ns / NS_PER_S + chunk
        assert granted_bytes <= bound * (1 + 1e-12), (granted_bytes, bound, at_ns)
    got = [g for _, g in grants]
    if arbitration is None:
        assert got == expected
    for lane in range(16):
        of_lane = [g for g in got if g[1] == lane]
        assert of_lane == [g for g in expected if g[1] == lane]
        assert port.granted_bytes(lane) == sum(size for _, _, size, _ in of_lane)
    assert (port.queued_bytes(), port.queued_messages()) == (0, 0)
    assert port.granted_bytes() == sum(size for _, _, size in events)
