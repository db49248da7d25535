"""The typed messages and their msgpack codec (``dualpath_emu.messages``): round trips for every field kind,
the pinned wire format, deterministic encoding, strict validation with errors that name the problem, and
the guarantee the runtime relies on: any bytes from a socket decode to a registered message or raise
MessageError, never anything else.
"""

from __future__ import annotations

import dataclasses
import math
import tracemalloc
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dualpath_emu.messages import DEFAULT_MAX_ARRAY_LEN, FORMAT, Codec, Envelope, Message, MessageError, MessageRegistry

INT_MIN, INT_MAX = -(2**63), 2**64 - 1


# ---------------------------------------------------------------------------------------------------------
# Test message types: one per field kind, plus nesting two levels deep, an empty one and one with a check.


@dataclass(frozen=True, slots=True)
class Ping(Message):
    WIRE_NAME: ClassVar[str] = "Ping"
    VERSION: ClassVar[int] = 1

    seq: int
    note: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Scalars(Message):
    WIRE_NAME: ClassVar[str] = "Scalars"
    VERSION: ClassVar[int] = 3

    i: int
    f: float
    s: str
    b: bool
    raw: bytes


@dataclass(frozen=True, slots=True)
class Optionals(Message):
    WIRE_NAME: ClassVar[str] = "Optionals"
    VERSION: ClassVar[int] = 1

    i: int | None
    f: float | None
    s: str | None
    b: bool | None
    raw: bytes | None
    ints: tuple[int, ...] | None
    ping: Ping | None


@dataclass(frozen=True, slots=True)
class Tuples(Message):
    WIRE_NAME: ClassVar[str] = "Tuples"
    VERSION: ClassVar[int] = 1

    ints: tuple[int, ...]
    floats: tuple[float, ...]
    strs: tuple[str, ...]
    flags: tuple[bool, ...]
    blobs: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Outer(Message):
    WIRE_NAME: ClassVar[str] = "Outer"
    VERSION: ClassVar[int] = 2

    name: str
    ping: Ping
    maybe: Scalars | None


@dataclass(frozen=True, slots=True)
class Deep(Message):
    WIRE_NAME: ClassVar[str] = "Deep"
    VERSION: ClassVar[int] = 1

    outer: Outer
    tag: int


@dataclass(frozen=True, slots=True)
class Batch(Message):
    """A batch of nested records."""

    WIRE_NAME: ClassVar[str] = "Batch"
    VERSION: ClassVar[int] = 1

    pings: tuple[Ping, ...]
    outers: tuple[Outer, ...] | None


@dataclass(frozen=True, slots=True)
class Stop(Message):
    WIRE_NAME: ClassVar[str] = "Stop"
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class Checked(Message):
    """Its own invariant runs on decode too."""

    WIRE_NAME: ClassVar[str] = "Checked"
    VERSION: ClassVar[int] = 1

    count: int

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"count must be >= 0, got {self.count}")


ALL_TYPES: tuple[type[Message], ...] = (Ping, Scalars, Optionals, Tuples, Outer, Deep, Batch, Stop, Checked)


def make_registry() -> MessageRegistry:
    registry = MessageRegistry()
    for cls in ALL_TYPES:  # nested types come before the types that hold them
        registry.register(cls)
    return registry


REGISTRY = make_registry()
CODEC = Codec(REGISTRY)


def frame(*elements: Any) -> bytes:
    """Hand-made wire bytes (lists, not tuples, so nothing of the codec is involved)."""
    return bytes(msgpack.packb(list(elements), use_bin_type=True))


PING = Ping(7, "hi", b"\x00")
SCALARS = Scalars(-5, 2.5, "señal", True, b"\xff\x00")
DEEP = Deep(Outer("deep", Ping(1, "p", b"p"), SCALARS), -1)
EXAMPLES: tuple[Message, ...] = (
    PING,
    Ping(INT_MIN, "", b""),
    Ping(INT_MAX, "x" * 300, bytes(range(256)) * 2),
    SCALARS,
    Scalars(0, -0.0, "", False, b""),
    Scalars(1, math.inf, "\u2603", False, b"a"),
    Optionals(None, None, None, None, None, None, None),
    Optionals(1, 1.5, "s", False, b"r", (1, 2, 3), PING),
    Optionals(0, 0.0, "", True, b"", (), Ping(0, "", b"")),
    Tuples((), (), (), (), ()),
    Tuples((INT_MIN, 0, INT_MAX), (0.5, -1e300), ("a", "", "ü"), (True, False), (b"", b"\x01")),
    Outer("o", PING, None),
    Outer("o", PING, SCALARS),
    DEEP,
    Batch((), None),
    Batch((PING, Ping(0, "", b"")), (Outer("o", PING, None), Outer("p", PING, SCALARS))),
    Stop(),
    Checked(0),
)


# ---------------------------------------------------------------------------------------------------------
# Strategies for message values.

ints = st.integers(INT_MIN, INT_MAX)
floats = st.floats(allow_nan=False)
texts = st.text(max_size=12)
blobs = st.binary(max_size=12)


def tuples_of(elements: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(elements, max_size=6).map(tuple)


pings = st.builds(Ping, ints, texts, blobs)
scalars = st.builds(Scalars, ints, floats, texts, st.booleans(), blobs)
optionals = st.builds(
    Optionals,
    st.none() | ints,
    st.none() | floats,
    st.none() | texts,
    st.none() | st.booleans(),
    st.none() | blobs,
    st.none() | tuples_of(ints),
    st.none() | pings,
)
tuple_messages = st.builds(
    Tuples, tuples_of(ints), tuples_of(floats), tuples_of(texts), tuples_of(st.booleans()), tuples_of(blobs)
)
outers = st.builds(Outer, texts, pings, st.none() | scalars)
messages: st.SearchStrategy[Message] = st.one_of(
    pings,
    scalars,
    optionals,
    tuple_messages,
    outers,
    st.builds(Deep, outers, ints),
    st.builds(Batch, tuples_of(pings), st.none() | tuples_of(outers)),
    st.just(Stop()),
    st.builds(Checked, st.integers(0, INT_MAX)),
)
envelopes = st.builds(Envelope, texts, texts, ints, messages)


# ---------------------------------------------------------------------------------------------------------
# Round trips, the pinned wire format and determinism.


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_field_kind_round_trips(message: Message) -> None:
    data = CODEC.encode(message)
    decoded = CODEC.decode(data)
    assert decoded == message
    assert type(decoded) is type(message)
    assert CODEC.encode(decoded) == data


@given(messages)
def test_generated_messages_round_trip(message: Message) -> None:
    data = CODEC.encode(message)
    assert CODEC.decode(data) == message
    assert CODEC.encode(message) == data  # the same message twice gives the same bytes


@given(envelopes)
def test_generated_envelopes_round_trip(envelope: Envelope) -> None:
    data = CODEC.encode_envelope(envelope)
    assert CODEC.decode_envelope(data) == envelope
    assert CODEC.encode_envelope(envelope) == data


def test_wire_format_is_pinned() -> None:
    # [1, "Ping", 1, [7, "hi", b"\x00"]]: fixarray(4), 1, fixstr "Ping", 1, fixarray(3), 7, fixstr "hi", bin8.
    assert FORMAT == 1
    assert CODEC.encode(PING) == bytes.fromhex("94 01 a4 50696e67 01 93 07 a2 6869 c4 01 00")
    assert CODEC.encode(Stop()) == bytes.fromhex("94 01 a4 53746f70 01 90")
    envelope = Envelope("a", "b", 9, Stop())
    # [1, "envelope", 2, ["a", "b", 9, [1, "Stop", 1, []]]]
    expected = "94 01 a8 656e76656c6f7065 02 94 a1 61 a1 62 09 94 01 a4 53746f70 01 90"
    assert CODEC.encode_envelope(envelope) == bytes.fromhex(expected)


def test_nested_messages_encode_as_the_same_four_element_array() -> None:
    decoded = msgpack.unpackb(CODEC.encode(Outer("o", PING, None)))
    assert decoded == [1, "Outer", 2, ["o", [1, "Ping", 1, [7, "hi", b"\x00"]], None]]


@given(messages, messages)
def test_different_messages_give_different_bytes(a: Message, b: Message) -> None:
    if a != b:
        assert CODEC.encode(a) != CODEC.encode(b)


@pytest.mark.parametrize(
    "changed",
    [
        Scalars(-4, 2.5, "señal", True, b"\xff\x00"),
        Scalars(-5, 2.25, "señal", True, b"\xff\x00"),
        Scalars(-5, 2.5, "senal", True, b"\xff\x00"),
        Scalars(-5, 2.5, "señal", False, b"\xff\x00"),
        Scalars(-5, 2.5, "señal", True, b"\xff\x01"),
    ],
)
def test_every_field_reaches_the_bytes(changed: Scalars) -> None:
    assert CODEC.encode(changed) != CODEC.encode(SCALARS)
    assert CODEC.decode(CODEC.encode(changed)) == changed


def test_equal_messages_from_different_objects_encode_alike() -> None:
    copy = Deep(Outer("deep", Ping(1, "p", b"p"), dataclasses.replace(SCALARS)), -1)
    assert copy is not DEEP and copy == DEEP
    assert CODEC.encode(copy) == CODEC.encode(DEEP)
    # Another codec over another registry with the same types writes the same bytes.
    assert Codec(make_registry()).encode(copy) == CODEC.encode(copy)


def test_an_int_in_a_float_field_is_sent_as_a_float() -> None:
    as_int = Scalars(1, 3, "", False, b"")  # what a caller may write; equal to the float version
    as_float = Scalars(1, 3.0, "", False, b"")
    assert as_int == as_float
    assert CODEC.encode(as_int) == CODEC.encode(as_float)
    decoded = CODEC.decode(CODEC.encode(as_int))
    assert isinstance(decoded, Scalars) and type(decoded.f) is float
    tuples = CODEC.decode(CODEC.encode(Tuples((), (1, 2.5), (), (), ())))
    assert isinstance(tuples, Tuples) and [type(x) for x in tuples.floats] == [float, float]


def test_an_int_on_the_wire_is_accepted_for_a_float_field() -> None:
    decoded = CODEC.decode(frame(1, "Scalars", 3, [1, INT_MAX, "", False, b""]))
    assert isinstance(decoded, Scalars)
    assert decoded.f == float(INT_MAX) and type(decoded.f) is float
    decoded = CODEC.decode(frame(1, "Tuples", 1, [[], [1, 2.5], [], [], []]))
    assert isinstance(decoded, Tuples) and decoded.floats == (1.0, 2.5)
    assert all(type(x) is float for x in decoded.floats)


def test_nan_round_trips_to_nan_with_stable_bytes() -> None:
    message = Scalars(0, math.nan, "", False, b"")
    data = CODEC.encode(message)
    decoded = CODEC.decode(data)
    assert isinstance(decoded, Scalars) and math.isnan(decoded.f)
    assert CODEC.encode(decoded) == data


def test_decoded_messages_are_immutable_and_hashable() -> None:
    message = Optionals(1, 1.5, "s", False, b"r", (1, 2, 3), PING)
    decoded = CODEC.decode(CODEC.encode(message))
    assert isinstance(decoded, Optionals) and decoded is not message
    assert hash(decoded) == hash(message) and len({decoded, message}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.i = 2  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------------------
# Decoding refuses what is wrong, and says what.

GOOD_PING = [7, "hi", b""]
SCALARS_FIELDS = [1, 2.5, "s", True, b""]

MALFORMED: list[tuple[str, bytes, str]] = [
    ("str for int", frame(1, "Ping", 1, ["x", "hi", b""]), "Ping v1 field 'seq': expected int, got str"),
    ("bool for int", frame(1, "Ping", 1, [True, "hi", b""]), "Ping v1 field 'seq': expected int, got bool"),
    ("float for int", frame(1, "Ping", 1, [7.0, "hi", b""]), "Ping v1 field 'seq': expected int, got float"),
    ("nil for int", frame(1, "Ping", 1, [None, "hi", b""]), "Ping v1 field 'seq': expected int, got None"),
    ("bin for str", frame(1, "Ping", 1, [7, b"hi", b""]), "Ping v1 field 'note': expected str, got bytes"),
    ("str for bin", frame(1, "Ping", 1, [7, "hi", "x"]), "Ping v1 field 'payload': expected bytes, got str"),
    ("int for bool", frame(1, "Scalars", 3, [1, 2.5, "s", 1, b""]), "Scalars v3 field 'b': expected bool, got int"),
    (
        "str for float",
        frame(1, "Scalars", 3, [1, "2", "s", True, b""]),
        "Scalars v3 field 'f': expected float, got str",
    ),
    (
        "bool for float",
        frame(1, "Scalars", 3, [1, True, "s", True, b""]),
        "Scalars v3 field 'f': expected float, got bool",
    ),
    (
        "str for optional int",
        frame(1, "Optionals", 1, ["1", None, None, None, None, None, None]),
        "Optionals v1 field 'i': expected int | None, got str",
    ),
    ("array for int", frame(1, "Ping", 1, [[7], "hi", b""]), "Ping v1 field 'seq': expected int, got tuple"),
    (
        "str in int tuple",
        frame(1, "Tuples", 1, [[1, "2"], [], [], [], []]),
        r"Tuples v1 field 'ints': expected tuple\[int, \.\.\.\], got tuple with str at index 1",
    ),
    (
        "bool in int tuple",
        frame(1, "Tuples", 1, [[False], [], [], [], []]),
        r"Tuples v1 field 'ints': expected tuple\[int, \.\.\.\], got tuple with bool at index 0",
    ),
    (
        "float in int tuple",
        frame(1, "Tuples", 1, [[1, 2, 3.0], [], [], [], []]),
        r"Tuples v1 field 'ints': expected tuple\[int, \.\.\.\], got tuple with float at index 2",
    ),
    (
        "str in float tuple",
        frame(1, "Tuples", 1, [[], [1.0, "x"], [], [], []]),
        r"Tuples v1 field 'floats': expected tuple\[float, \.\.\.\], got tuple with str at index 1",
    ),
    (
        "int for tuple",
        frame(1, "Tuples", 1, [[], [], 5, [], []]),
        r"Tuples v1 field 'strs': expected tuple\[str, \.\.\.\], got int",
    ),
    ("unknown type", frame(1, "Pong", 1, []), "unknown message type 'Pong'"),
    ("wrong version", frame(1, "Ping", 2, GOOD_PING), r"Ping: version 2 not supported \(1\)"),
    ("older version", frame(1, "Scalars", 2, SCALARS_FIELDS), r"Scalars: version 2 not supported \(3\)"),
    ("bool version", frame(1, "Ping", True, GOOD_PING), r"Ping: version True not supported \(1\)"),
    ("str version", frame(1, "Ping", "1", GOOD_PING), r"Ping: version '1' not supported \(1\)"),
    ("too few fields", frame(1, "Ping", 1, [7, "hi"]), "expected 3 fields for Ping, got 2"),
    ("too many fields", frame(1, "Ping", 1, [*GOOD_PING, 0]), "expected 3 fields for Ping, got 4"),
    ("fields for an empty type", frame(1, "Stop", 1, [0]), "expected 0 fields for Stop, got 1"),
    ("wrong format", frame(2, "Ping", 1, GOOD_PING), r"frame format 2 not supported \(1\)"),
    ("bool format", frame(True, "Ping", 1, GOOD_PING), r"frame format True not supported \(1\)"),
    ("float format", frame(1.0, "Ping", 1, GOOD_PING), r"frame format 1\.0 not supported \(1\)"),
    ("three elements", frame(1, "Ping", 1), r"expected a frame \[format, name, version, fields\], got array of 3"),
    ("five elements", frame(1, "Ping", 1, GOOD_PING, 0), "expected a frame .*, got array of 5"),
    ("not an array", bytes(msgpack.packb(42)), "expected a frame .*, got int"),
    ("name not str", frame(1, 5, 1, []), "message name: expected str, got int"),
    ("name as bin", frame(1, b"Ping", 1, GOOD_PING), "message name: expected str, got bytes"),
    ("fields not an array", frame(1, "Ping", 1, 5), "'Ping': expected an array of fields, got int"),
    (
        "wrong nested type",
        frame(1, "Outer", 2, ["o", [1, "Scalars", 3, SCALARS_FIELDS], None]),
        "Outer v2 field 'ping': expected Ping, got message 'Scalars'",
    ),
    (
        "bad nested field",
        frame(1, "Outer", 2, ["o", [1, "Ping", 1, ["x", "hi", b""]], None]),
        "Outer v2 field 'ping': Ping v1 field 'seq': expected int, got str",
    ),
    (
        "bad nested version",
        frame(1, "Outer", 2, ["o", [1, "Ping", 9, GOOD_PING], None]),
        r"Outer v2 field 'ping': Ping: version 9 not supported \(1\)",
    ),
    ("nested not a frame", frame(1, "Outer", 2, ["o", 5, None]), "Outer v2 field 'ping': expected a frame .*, got int"),
    (
        "two levels down",
        frame(1, "Deep", 1, [[1, "Outer", 2, ["o", [1, "Ping", 1, GOOD_PING], [1, "Scalars", 3, [1] * 5]]], 0]),
        "Deep v1 field 'outer': Outer v2 field 'maybe': Scalars v3 field 's': expected str, got int",
    ),
    ("the type's own check", frame(1, "Checked", 1, [-1]), "Checked v1: count must be >= 0, got -1"),
    (
        "an envelope",
        frame(1, "envelope", 2, ["a", "b", 1, [1, "Stop", 1, []]]),
        "got an envelope frame: decode it with decode_envelope",
    ),
    ("empty input", b"", "truncated or malformed msgpack"),
    ("truncated", frame(1, "Ping", 1, GOOD_PING)[:-1], "truncated or malformed msgpack"),
    ("trailing byte", frame(1, "Ping", 1, GOOD_PING) + b"\x00", "truncated or malformed msgpack.*ExtraData"),
    ("reserved byte 0xc1", b"\x94\x01\xc1", "truncated or malformed msgpack"),
    ("invalid UTF-8", b"\x94\x01\xa4Pi\xffg\x01\x90", "truncated or malformed msgpack"),
    ("a map", frame(1, "Ping", 1, {"seq": 7}), "truncated or malformed msgpack.*max_map_len"),
    ("an ext value", frame(1, "Ping", 1, [msgpack.ExtType(1, b"x"), "", b""]), "truncated or malformed msgpack"),
    ("a timestamp", b"\x94\x01\xa4Ping\x01\x93\xd6\xff\x00\x00\x00\x01\xa0\xc4\x00", "truncated or malformed msgpack"),
    ("too deep", b"\x91" * 5000 + b"\xc0", "truncated or malformed msgpack"),
    (
        "array over the limit",
        frame(1, "Tuples", 1, [list(range(DEFAULT_MAX_ARRAY_LEN + 1)), [], [], [], []]),
        rf"truncated or malformed msgpack.*exceeds max_array_len\({DEFAULT_MAX_ARRAY_LEN}\)",
    ),
    (
        "a short frame's array longer than the frame",
        b"\x94\x01\xa4Ping\x01\xdd\x00\x00\x04\x01",
        r"truncated or malformed msgpack.*exceeds max_array_len\(1024\)",
    ),
]


@pytest.mark.parametrize(("data", "error"), [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED])
def test_malformed_frames_are_refused_with_the_reason(data: bytes, error: str) -> None:
    with pytest.raises(MessageError, match=f"^{error}"):
        CODEC.decode(data)


def test_the_longest_allowed_tuple_decodes() -> None:
    longest = Tuples(tuple(range(DEFAULT_MAX_ARRAY_LEN)), (), (), (), ())
    assert CODEC.decode(CODEC.encode(longest)) == longest


def test_oversized_frames_are_refused_before_parsing() -> None:
    codec = Codec(REGISTRY, max_frame_bytes=64)
    big = Ping(1, "x" * 100, b"")
    data = CODEC.encode(big)
    with pytest.raises(MessageError, match=rf"^a frame of {len(data)} bytes exceeds max_frame_bytes \(64\)"):
        codec.decode(data)
    with pytest.raises(MessageError, match=r"^Ping: a frame of \d+ bytes exceeds max_frame_bytes \(64\)"):
        codec.encode(big)
    assert codec.decode(codec.encode(PING)) == PING


def test_a_hostile_frame_cannot_make_the_decoder_allocate_much() -> None:
    # Nested array headers (5 bytes each), each claiming `claim` elements, that never come: msgpack builds
    # every array it opens at its declared length (capped at 10,000 slots since msgpack 1.2).
    def nested_headers(claim: int, levels: int, pad: int = 0) -> bytes:
        return (b"\xdd" + claim.to_bytes(4, "big")) * levels + b"\xc0" * pad

    long_frame = nested_headers(DEFAULT_MAX_ARRAY_LEN, 1000, 100_000)
    short_frame = nested_headers(1024, 200)
    assert len(short_frame) <= 1024 < len(long_frame)
    tracemalloc.start()
    try:
        # A long frame is walked first, without building anything, and refused as incomplete.
        with pytest.raises(MessageError, match="^truncated or malformed msgpack"):
            CODEC.decode(long_frame)
        # A short one is parsed at once, its arrays limited to 1,024 elements (as many as it has bytes).
        with pytest.raises(MessageError, match="^truncated or malformed msgpack"):
            CODEC.decode(short_frame)
        with pytest.raises(MessageError, match=r"^truncated or malformed msgpack.*exceeds max_array_len\(1024\)"):
            CODEC.decode(nested_headers(1025, 200))
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 4e6  # without the walk: ~80 MB (1,000 levels x 10,000 slots x 8 bytes)


def test_a_complete_long_frame_costs_at_most_a_few_bytes_per_byte() -> None:
    # The worst complete frame: many arrays of one array of one array (3 bytes, two tuples).
    data = b"\x94\x01\xa4Ping\x01\xdd" + (300_000).to_bytes(4, "big") + b"\x91\x91\x90" * 300_000
    tracemalloc.start()
    try:
        with pytest.raises(MessageError, match="^expected 3 fields for Ping"):
            CODEC.decode(data)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 60 * len(data)  # the bound the module docstring states


def test_the_codec_refuses_a_non_bytes_input() -> None:
    with pytest.raises(MessageError, match="truncated or malformed msgpack"):
        CODEC.decode("not bytes")  # type: ignore[arg-type]
    with pytest.raises(MessageError, match="^expected bytes, got int"):
        CODEC.decode(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_truncation_of_a_valid_frame_is_refused(message: Message) -> None:
    data = CODEC.encode(message)
    for end in range(len(data)):
        with pytest.raises(MessageError, match="^truncated or malformed msgpack"):
            CODEC.decode(data[:end])


def test_every_truncation_of_an_envelope_is_refused() -> None:
    data = CODEC.encode_envelope(Envelope("sched", "pe-0", 3, DEEP))
    for end in range(len(data)):
        with pytest.raises(MessageError, match="^truncated or malformed msgpack"):
            CODEC.decode_envelope(data[:end])


# ---------------------------------------------------------------------------------------------------------
# Any bytes at all: a registered message, or MessageError. Random bytes rarely look like msgpack, so the
# inputs also include valid frames with bytes overwritten or cut, and well-formed frames of random values.


def accepts_or_refuses(data: bytes) -> None:
    """What a receiving actor relies on: a registered message that encodes again, or MessageError."""
    try:
        message = CODEC.decode(data)
    except MessageError:
        pass
    else:
        assert type(message) in REGISTRY
        canonical = CODEC.encode(message)
        assert CODEC.encode(CODEC.decode(canonical)) == canonical
    try:
        envelope = CODEC.decode_envelope(data)
    except MessageError:
        pass
    else:
        assert type(envelope.body) in REGISTRY
        canonical = CODEC.encode_envelope(envelope)
        assert CODEC.encode_envelope(CODEC.decode_envelope(canonical)) == canonical


wire_values = st.recursive(
    st.none() | st.booleans() | ints | st.floats() | texts | blobs,
    lambda children: st.lists(children, max_size=5),
    max_leaves=12,
)
wire_shaped = st.builds(
    lambda fmt, name, version, fields: frame(fmt, name, version, fields),
    st.sampled_from([1, 1, 1, 0, 2, True]),
    st.sampled_from([*REGISTRY.wire_names(), "Pong", "envelope"]),
    st.sampled_from([1, 1, 2, 3, 0, True]),
    st.lists(wire_values, max_size=8),
)


@st.composite
def damaged_frames(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(messages.map(CODEC.encode) | envelopes.map(CODEC.encode_envelope)))
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["overwrite", "insert", "delete", "cut"]))
        byte = draw(st.integers(0, 255))
        if action == "overwrite":
            data[position] = byte
        elif action == "insert":
            data.insert(position, byte)
        elif action == "delete" and len(data) > 1:
            del data[position]
        elif action == "cut":
            del data[position:]
        if not data:
            break
    return bytes(data)


@given(st.binary(max_size=64) | damaged_frames() | wire_shaped)
@example(b"\x94\x01\xa4Ping\x01\x93\x07\xa2hi\xc4\x01\x00")  # a valid frame, to check the accepting branch
@example(frame(1, "Scalars", 3, [1, 2, "s", True, b""]))
def test_any_bytes_decode_to_a_registered_message_or_raise_message_error(data: bytes) -> None:
    accepts_or_refuses(data)


# ---------------------------------------------------------------------------------------------------------
# Encoding validates, so a bad value is reported at the sender.

BAD_VALUES: list[tuple[str, Message, str]] = [
    ("str for int", Ping("7", "hi", b""), "Ping v1 field 'seq': expected int, got str"),  # type: ignore[arg-type]
    ("bool for int", Ping(True, "hi", b""), "Ping v1 field 'seq': expected int, got bool"),
    ("int too large", Ping(2**64, "hi", b""), r"Ping v1 field 'seq': expected int, got 18446744073709551616 \(outside"),
    ("int too small", Ping(-(2**63) - 1, "hi", b""), "Ping v1 field 'seq': expected int, got -9223372036854775809"),
    ("float for int", Ping(7.0, "hi", b""), "Ping v1 field 'seq': expected int, got float"),  # type: ignore[arg-type]
    ("bytearray for bytes", Ping(7, "hi", bytearray(b"x")), "Ping v1 field 'payload': expected bytes, got bytearray"),  # type: ignore[arg-type]
    ("int for bool", Scalars(1, 1.0, "", 1, b""), "Scalars v3 field 'b': expected bool, got int"),  # type: ignore[arg-type]
    (
        "int too large for a float",
        Scalars(1, 10**400, "", True, b""),
        "Scalars v3 field 'f': expected float, got int 1000",
    ),
    ("None for str", Scalars(1, 1.0, None, True, b""), "Scalars v3 field 's': expected str, got None"),  # type: ignore[arg-type]
    ("list for tuple", Tuples([1], (), (), (), ()), r"Tuples v1 field 'ints': expected tuple\[int, \.\.\.\], got list"),  # type: ignore[arg-type]
    (
        "int too large in a tuple",
        Tuples((1, 2**64), (), (), (), ()),
        r"Tuples v1 field 'ints': expected tuple\[int, \.\.\.\], got tuple with 18446744073709551616 .* at index 1",
    ),
    (
        "tuple too long",
        Tuples((), (), ("a",) * (DEFAULT_MAX_ARRAY_LEN + 1), (), ()),
        rf"Tuples v1 field 'strs': expected tuple\[str, \.\.\.\], got tuple of {DEFAULT_MAX_ARRAY_LEN + 1} elements \(the codec's max_array_len is {DEFAULT_MAX_ARRAY_LEN}\)",
    ),
    ("wrong nested type", Outer("o", SCALARS, None), "Outer v2 field 'ping': expected Ping, got Scalars"),  # type: ignore[arg-type]
    (
        "bad nested value",
        Deep(Outer("o", Ping(1, 2, b""), None), 0),  # type: ignore[arg-type]
        "Deep v1 field 'outer': Outer v2 field 'ping': Ping v1 field 'note': expected str, got int",
    ),
    (
        "bad value in a batch",
        Batch((PING, Ping(1, 2, b"")), None),  # type: ignore[arg-type]
        "Batch v1 field 'pings': element 1: Ping v1 field 'note': expected str, got int",
    ),
    (
        "wrong type in a batch",
        Batch((SCALARS,), None),  # type: ignore[arg-type]
        r"Batch v1 field 'pings': expected tuple\[Ping, \.\.\.\], got tuple with Scalars at index 0",
    ),
    ("lone surrogate", Ping(1, "\ud800", b""), "cannot encode Ping"),
]


@pytest.mark.parametrize(("message", "error"), [c[1:] for c in BAD_VALUES], ids=[c[0] for c in BAD_VALUES])
def test_encoding_refuses_invalid_values_with_the_reason(message: Message, error: str) -> None:
    with pytest.raises(MessageError, match=f"^{error}"):
        CODEC.encode(message)
    # A failed encode leaves the codec's packer clean: the next frame is the pinned one.
    assert CODEC.encode(PING) == bytes.fromhex("94 01 a4 50696e67 01 93 07 a2 6869 c4 01 00")


def test_encoding_an_unregistered_type_is_refused() -> None:
    @dataclass(frozen=True, slots=True)
    class Unknown(Message):
        WIRE_NAME: ClassVar[str] = "Unknown"
        VERSION: ClassVar[int] = 1

    with pytest.raises(MessageError, match="^Unknown is not a message type registered with this codec's registry"):
        CODEC.encode(Unknown())
    with pytest.raises(MessageError, match="^int is not a message type registered"):
        CODEC.encode(5)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# Envelopes.


def test_envelope_round_trip() -> None:
    for envelope in (
        Envelope("scheduler", "pe-0", 41, PING),
        Envelope("pe-0", "scheduler", 7, Outer("ok", PING, SCALARS)),
    ):
        assert CODEC.decode_envelope(CODEC.encode_envelope(envelope)) == envelope


BODY = [1, "Stop", 1, []]
MALFORMED_ENVELOPES: list[tuple[str, bytes, str]] = [
    ("a message frame", CODEC.encode(PING), "expected an envelope, got message 'Ping'"),
    ("wrong version", frame(1, "envelope", 1, ["a", "b", 1, None, BODY]), r"envelope: version 1 not supported \(2\)"),
    ("three fields", frame(1, "envelope", 2, ["a", "b", BODY]), "expected 4 fields for envelope, got 3"),
    ("sender not str", frame(1, "envelope", 2, [1, "b", 1, BODY]), "envelope v2 field 'sender': expected str"),
    ("msg_id str", frame(1, "envelope", 2, ["a", "b", "1", BODY]), "envelope v2 field 'msg_id': expected int, got str"),
    (
        "unknown body",
        frame(1, "envelope", 2, ["a", "b", 1, [1, "Pong", 1, []]]),
        "envelope v2 field 'body': unknown message type 'Pong'",
    ),
    (
        "bad body field",
        frame(1, "envelope", 2, ["a", "b", 1, [1, "Ping", 1, ["x", "", b""]]]),
        "envelope v2 field 'body': Ping v1 field 'seq': expected int, got str",
    ),
    (
        "an envelope as body",
        frame(1, "envelope", 2, ["a", "b", 1, [1, "envelope", 1, ["a", "b", 1, None, BODY]]]),
        "envelope v2 field 'body': got an envelope frame",
    ),
    ("body not a frame", frame(1, "envelope", 2, ["a", "b", 1, 3]), "envelope v2 field 'body': expected a frame"),
    ("garbage", b"\xc1", "truncated or malformed msgpack"),
]


@pytest.mark.parametrize(
    ("data", "error"), [c[1:] for c in MALFORMED_ENVELOPES], ids=[c[0] for c in MALFORMED_ENVELOPES]
)
def test_malformed_envelopes_are_refused_with_the_reason(data: bytes, error: str) -> None:
    with pytest.raises(MessageError, match=f"^{error}"):
        CODEC.decode_envelope(data)


@pytest.mark.parametrize(
    ("envelope", "error"),
    [
        (Envelope(1, "b", 1, PING), "envelope v2 field 'sender': expected str, got int"),  # type: ignore[arg-type]
        (Envelope("a", "b", True, PING), "envelope v2 field 'msg_id': expected int, got bool"),
        (Envelope("a", "b", 1, "ping"), "envelope v2 field 'body': str is not a message type"),  # type: ignore[arg-type]
        (
            Envelope("a", "b", 1, Ping("x", "", b"")),  # type: ignore[arg-type]
            "envelope v2 field 'body': Ping v1 field 'seq': expected int, got str",
        ),
    ],
)
def test_encoding_an_invalid_envelope_is_refused(envelope: Envelope, error: str) -> None:
    with pytest.raises(MessageError, match=f"^{error}"):
        CODEC.encode_envelope(envelope)


def test_encode_envelope_wants_an_envelope() -> None:
    with pytest.raises(MessageError, match="^expected an Envelope, got Ping"):
        CODEC.encode_envelope(PING)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# The registry.


def test_register_works_as_a_decorator_and_lookup_finds_the_type() -> None:
    registry = MessageRegistry()

    @registry.register
    @dataclass(frozen=True, slots=True)
    class Hello(Message):
        WIRE_NAME: ClassVar[str] = "hello"
        VERSION: ClassVar[int] = 1

        who: str

    assert registry.lookup("hello") is Hello
    assert Hello in registry and Ping not in registry
    assert len(registry) == 1 and registry.wire_names() == ("hello",)
    assert Codec(registry).decode(Codec(registry).encode(Hello("x"))) == Hello("x")
    with pytest.raises(KeyError, match="unknown message type 'Ping'"):
        registry.lookup("Ping")


def test_registries_are_independent() -> None:
    # No global state: a type registered in one registry is unknown to another.
    only_ping = MessageRegistry()
    only_ping.register(Ping)
    assert only_ping.wire_names() == ("Ping",)
    assert REGISTRY.wire_names() == tuple(cls.WIRE_NAME for cls in ALL_TYPES)
    with pytest.raises(MessageError, match="^unknown message type 'Scalars'"):
        Codec(only_ping).decode(CODEC.encode(SCALARS))
    with pytest.raises(MessageError, match="^Scalars is not a message type registered"):
        Codec(only_ping).encode(SCALARS)


@dataclass(frozen=True, slots=True)
class PingAgain(Message):
    WIRE_NAME: ClassVar[str] = "Ping"
    VERSION: ClassVar[int] = 2

    seq: int


def test_duplicate_wire_names_are_refused() -> None:
    registry = MessageRegistry()
    registry.register(Ping)
    with pytest.raises(ValueError, match=r"^PingAgain: wire name 'Ping' is already registered \(by Ping\)"):
        registry.register(PingAgain)
    with pytest.raises(ValueError, match="^Ping: wire name 'Ping' is already registered"):
        registry.register(Ping)
    assert registry.lookup("Ping") is Ping


def message_type(annotation: object, **namespace: object) -> type[Message]:
    """A one-field message type ``Bad`` with the given annotation, made at run time."""
    namespace = {"WIRE_NAME": "Bad", "VERSION": 1, **namespace}
    cls = dataclasses.make_dataclass(
        "Bad", [("x", annotation)], bases=(Message,), frozen=True, slots=True, namespace=namespace
    )
    return cls


@pytest.mark.parametrize(
    "annotation",
    [
        list[int],
        dict[str, int],
        set[int],
        int | str,
        int | str | None,
        tuple[int, int],
        tuple[int],
        tuple[list[int], ...],
        tuple[int | None, ...],
        object,
        Any,
        bytearray,
        type(None),
        Message,
    ],
    ids=repr,
)
def test_unsupported_annotations_are_refused_at_registration(annotation: object) -> None:
    cls = message_type(annotation)
    with pytest.raises(TypeError, match=r"^Bad\.x: unsupported field type"):
        MessageRegistry().register(cls)


def test_a_nested_type_must_be_registered_first() -> None:
    registry = MessageRegistry()
    registry.register(Scalars)
    with pytest.raises(
        TypeError, match=r"^Outer\.ping: message type Ping is not registered here \(register it first\)"
    ):
        registry.register(Outer)
    assert Outer not in registry
    with pytest.raises(TypeError, match=r"^Batch\.pings: message type Ping is not registered here"):
        registry.register(Batch)


@dataclass(frozen=True, slots=True)
class NoName(Message):
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class InheritsName(Ping):
    pass


@dataclass(frozen=True, slots=True)
class VersionZero(Message):
    WIRE_NAME: ClassVar[str] = "v0"
    VERSION: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class VersionBool(Message):
    WIRE_NAME: ClassVar[str] = "vb"
    VERSION: ClassVar[int] = True


@dataclass(frozen=True, slots=True)
class Reserved(Message):
    WIRE_NAME: ClassVar[str] = "envelope"
    VERSION: ClassVar[int] = 1


class NotADataclass(Message):
    WIRE_NAME: ClassVar[str] = "nd"
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True)
class NotAMessage:
    WIRE_NAME: ClassVar[str] = "nm"
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class KeywordOnly(Message):
    WIRE_NAME: ClassVar[str] = "kw"
    VERSION: ClassVar[int] = 1

    x: int = dataclasses.field(kw_only=True)


@dataclass(frozen=True, slots=True)
class NotInInit(Message):
    WIRE_NAME: ClassVar[str] = "ni"
    VERSION: ClassVar[int] = 1

    x: int = dataclasses.field(init=False, default=0)


@pytest.mark.parametrize(
    ("cls", "exception", "error"),
    [
        (NoName, TypeError, "NoName: WIRE_NAME must be a non-empty str declared on the class itself"),
        (InheritsName, TypeError, "InheritsName: WIRE_NAME must be"),
        (VersionZero, TypeError, "VersionZero: VERSION must be an int >= 1"),
        (VersionBool, TypeError, "VersionBool: VERSION must be an int >= 1"),
        (Reserved, ValueError, "Reserved: the wire name 'envelope' is reserved"),
        (NotADataclass, TypeError, r"NotADataclass: decorate it with @dataclass\(frozen=True, slots=True\)"),
        (NotAMessage, TypeError, "NotAMessage: a message type must be a subclass of Message"),
        (Message, TypeError, "Message: a message type must be a subclass of Message"),
        (KeywordOnly, TypeError, r"KeywordOnly\.x: every field must be a positional __init__ parameter"),
        (NotInInit, TypeError, r"NotInInit\.x: every field must be a positional __init__ parameter"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_invalid_message_types_are_refused(cls: Any, exception: type[Exception], error: str) -> None:
    registry = MessageRegistry()
    with pytest.raises(exception, match=f"^{error}"):
        registry.register(cls)
    assert len(registry) == 0


def test_a_message_type_cannot_be_mutable() -> None:
    # Message is a frozen dataclass, so dataclasses itself refuses a non-frozen subclass.
    with pytest.raises(TypeError, match="cannot inherit non-frozen dataclass from a frozen one"):

        @dataclass
        class Mutable(Message):  # type: ignore[misc]
            x: int


def test_a_codec_refuses_limits_too_small_for_a_frame() -> None:
    with pytest.raises(ValueError, match="max_array_len >= 5"):
        Codec(REGISTRY, max_array_len=4)
    with pytest.raises(ValueError, match="max_frame_bytes must be >= 1"):
        Codec(REGISTRY, max_frame_bytes=0)
