"""The data plane's wire format: frame kinds, limits, the checks of every field, errors and socket options.

Every message is one frame, a msgpack array ``[PROTOCOL_VERSION, kind, ...]``; the kinds and their fields are in
docs/wire.md ("The data-plane protocol"). Sockets: a ROUTER at the service, one DEALER per remote process, bounded
by :data:`HWM`, :data:`MAX_FRAME_BYTES`, :data:`BACKLOG_MESSAGES` and :data:`BACKLOG_BYTES`; CURVE with a
:class:`DataPlaneKeys`, else only private ``ipc://`` or ``insecure=True`` (:func:`check_endpoint`). The receiver
checks every field of every frame; a frame that fails is rejected whole (:class:`FrameError`: dropped, logged,
counted) and never disturbs the receiver. Whether a request makes sense is the core's to say, per request."""

from __future__ import annotations

import builtins
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, Protocol, TypeVar

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import zmq

from dualpath_emu import _core
from dualpath_emu._core import UNREPORTED_TAG
from dualpath_emu.errors import SecurityError
from dualpath_emu.runtime.security import check_private_ipc

PROTOCOL_VERSION: Final = 2
"""2: decode nodes stepped by the service's core (``submit``'s ``decode_nodes``, ``joins``; ``done``'s ``decoded``)."""
HWM: Final = 100_000  # Send and receive high-water marks (messages queued per peer) of the data plane's sockets.
MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
"""``zmq.MAXMSGSIZE`` of the data plane's sockets: a larger frame is refused by ZeroMQ itself."""
MAX_REQUESTS_PER_MESSAGE: Final = 65_536
"""At most this many requests of one kind (and completions) in one message; larger batches are split."""
MAX_PATH_PORTS: Final = 1_024
MAX_RANKS: Final = 65_536
MAX_NAME_CHARS: Final = 256
RECEIVE_BATCH: Final = 1_024  # At most this many messages are taken from a socket before the loop runs others.
BACKLOG_MESSAGES: Final = 100_000
"""The most messages a process holds beyond ZeroMQ's queue for the data plane's socket (the service: towards
all its requesters together; a remote plane: towards the service). Past it, or :data:`BACKLOG_BYTES`, the
run fails naming the peer that does not read: it is stuck, gone or far slower than the run."""
BACKLOG_BYTES: Final = 256 << 20
REJECTIONS_LOGGED: Final = 100
"""Rejected frames logged one by one by the service; then one summary line per power of ten (``BoundedLog``)."""
SYNC_ROUNDS: Final = 8  # Ping rounds of the clock handshake; the one with the smallest round trip is kept.
HEARTBEAT_INTERVAL_S: Final = 0.5
HEARTBEAT_TIMEOUT_S: Final = 5.0
CONNECT_TIMEOUT_S: Final = 60.0
"""How long a remote plane waits for the service's welcome, and the service for its expected requesters."""
BYE_TIMEOUT_S: Final = 1.0
DRAIN_CHECK_S: Final = 0.01
"""While every requester has said bye but work is pending, the service checks this often (wall s)."""
_U64_MAX: Final = 2**64 - 1
U32_MAX: Final = 2**32 - 1
_T = TypeVar("_T")


class DataPlaneError(RuntimeError):
    """The data plane failed, or a process lost it."""


class DataPlaneLost(DataPlaneError):
    """A remote plane heard nothing from the data-plane service for its heartbeat timeout."""


class RequesterLost(DataPlaneError):
    """The service heard nothing from a connected requester for its heartbeat timeout."""


class RefusedError(DataPlaneError):
    """The service refused a remote plane's hello (an unknown or duplicate name, another time scale)."""


class DetachedRequestError(DataPlaneError):
    """The core refused a detached request (nobody waits for it, so the run fails)."""


class FrameError(ValueError):
    """A frame that does not follow the wire format (see the module docstring)."""


class DataPlaneKeys(Protocol):
    """What the data plane needs of a run's keys: configure a socket as server, or client of ``peer_name``."""

    def make_server(self, socket: zmq.Socket[Any], /) -> None: ...

    def make_client(self, socket: zmq.Socket[Any], peer_name: str, /) -> None: ...


class Authenticator(Protocol):
    """A running ZeroMQ authenticator (ZAP handler)."""

    def stop(self) -> None: ...


StartAuthenticator = Callable[[zmq.Context[Any], DataPlaneKeys], Authenticator]


def check_endpoint(endpoint: str, keys: DataPlaneKeys | None, insecure: bool) -> None:
    """Refuse what the transport's security rules refuse (``tcp://`` without keys, public ipc)."""
    if keys is not None or insecure:
        return
    if endpoint.startswith("tcp://"):
        raise SecurityError(
            f"{endpoint}: a tcp:// data plane without keys would let any local process move the run's bytes and "
            "read its counters; give keys (RunKeys.load(...)), use ipc:// in a private directory, or insecure=True"
        )
    if endpoint.startswith("ipc://"):
        check_private_ipc(endpoint)


def short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def uint(value: object, what: str, high: int = _U64_MAX, low: int = 0) -> int:
    if type(value) is not int or not low <= value <= high:
        raise FrameError(f"{what}: expected an integer in [{low}, {high}], got {short(value)}")
    return value


def finite_float(value: object, what: str) -> float:
    if type(value) is not float or not math.isfinite(value):
        raise FrameError(f"{what}: expected a finite float, got {short(value)}")
    return value


def bounded_str(value: object, what: str, max_chars: int = MAX_NAME_CHARS) -> str:
    if type(value) is not str or len(value) > max_chars:
        raise FrameError(f"{what}: expected a string of at most {max_chars} characters, got {short(value)}")
    return value


def array(value: object, what: str, max_len: int, length: int | None = None) -> list[Any]:
    if type(value) is not list or len(value) > max_len or (length is not None and len(value) != length):
        wanted = f"{length} items" if length is not None else f"at most {max_len} items"
        got = f"{len(value)} items" if type(value) is list else short(value)
        raise FrameError(f"{what}: expected an array of {wanted}, got {got}")
    return value


def _path(value: object, what: str) -> tuple[int, ...]:
    ports = array(value, what, MAX_PATH_PORTS)
    return tuple(uint(port, f"{what}[{i}]", U32_MAX) for i, port in enumerate(ports))


def _tag(value: object, what: str, detached_ok: bool) -> int:
    tag = uint(value, what, _U64_MAX, 1)
    if tag == UNREPORTED_TAG and not detached_ok:
        raise FrameError(f"{what}: UNREPORTED_TAG where a reported tag is required")
    return tag


def _layer_transfer(value: object, what: str) -> tuple[tuple[int, ...], int, int]:
    path, lane, size = array(value, what, 3, 3)
    return (_path(path, f"{what}.path"), uint(lane, f"{what}.lane", U32_MAX), uint(size, f"{what}.size_bytes"))


def _is_path(path: object) -> bool:
    return (
        type(path) is list
        and len(path) <= MAX_PATH_PORTS
        and all(type(port) is int and 0 <= port <= U32_MAX for port in path)
    )


def _transfer(value: object, what: str) -> tuple[tuple[int, ...], int, int, int]:
    if type(value) is list and len(value) == 4:  # the common case, checked in one expression
        path, lane, size, tag = value
        if (
            type(lane) is int and type(size) is int and type(tag) is int
            and 0 <= lane <= U32_MAX and 0 <= size <= _U64_MAX and 1 <= tag <= _U64_MAX and _is_path(path)
        ):  # fmt: skip
            return (tuple(path), lane, size, tag)
    path, lane, size, tag = array(value, what, 4, 4)  # else say what is wrong
    return (
        _path(path, f"{what}.path"), uint(lane, f"{what}.lane", U32_MAX), uint(size, f"{what}.size_bytes"),
        _tag(tag, f"{what}.tag", True),
    )  # fmt: skip


def _forward(value: object, what: str) -> tuple[int, tuple[Any, ...], int, tuple[Any, ...], int, int]:
    n_layers, ranks, ffn_ns, collectives, load_window, tag = array(value, what, 6, 6)
    checked_ranks = []
    for i, rank in enumerate(array(ranks, f"{what}.ranks", MAX_RANKS)):
        load, attn_ns, store = array(rank, f"{what}.ranks[{i}]", 3, 3)
        checked_ranks.append((
            None if load is None else _layer_transfer(load, f"{what}.ranks[{i}].load"),
            uint(attn_ns, f"{what}.ranks[{i}].attn_ns"),
            None if store is None else _layer_transfer(store, f"{what}.ranks[{i}].store"),
        ))  # fmt: skip
    checked_collectives = tuple(
        _layer_transfer(c, f"{what}.collectives[{i}]")
        for i, c in enumerate(array(collectives, f"{what}.collectives", MAX_RANKS))
    )
    return (
        uint(n_layers, f"{what}.n_layers", U32_MAX), tuple(checked_ranks), uint(ffn_ns, f"{what}.ffn_ns"),
        checked_collectives, uint(load_window, f"{what}.load_window", U32_MAX), _tag(tag, f"{what}.tag", False),
    )  # fmt: skip


def _io(value: object, what: str) -> tuple[int, str, int, int, int]:
    if type(value) is list and len(value) == 5:
        node, kind, lane, size, tag = value
        if (
            type(node) is int and type(lane) is int and type(size) is int and type(tag) is int
            and (kind == "read" or kind == "write") and type(kind) is str
            and 0 <= node <= U32_MAX and 0 <= lane <= U32_MAX and 0 <= size <= _U64_MAX and 1 <= tag <= _U64_MAX
        ):  # fmt: skip
            return (node, kind, lane, size, tag)
    node, kind, lane, size, tag = array(value, what, 5, 5)
    if kind not in ("read", "write") or type(kind) is not str:
        raise FrameError(f"{what}.kind: expected 'read' or 'write', got {short(kind)}")
    return (
        uint(node, f"{what}.node", U32_MAX), kind, uint(lane, f"{what}.lane", U32_MAX),
        uint(size, f"{what}.size_bytes"), _tag(tag, f"{what}.tag", True),
    )  # fmt: skip


def _timer(value: object, what: str) -> tuple[int, int]:
    if type(value) is list and len(value) == 2:
        at_ns, tag = value
        if type(at_ns) is int and type(tag) is int and 0 <= at_ns <= _U64_MAX and 1 <= tag < _U64_MAX:
            return (at_ns, tag)
    at_ns, tag = array(value, what, 2, 2)
    return (uint(at_ns, f"{what}.at_ns"), _tag(tag, f"{what}.tag", False))


_DECODE_SPEC_KEYS: Final = frozenset({
    "gpus", "together", "pricing", "kv_bytes_per_token", "a2a_bytes_per_token", "a2a_paths", "a2a_lane", "d2h_paths",
    "storage_node", "kv_lane", "first_unit", "write_through",
})  # fmt: skip
"""The keywords of ``Core.add_decode_node`` a decode node's ``spec`` may give (its values are the core's to check)."""


def _decode_node(value: object, what: str) -> tuple[int, dict[str, Any]]:
    tag, spec = array(value, what, 2, 2)
    if type(spec) is not dict or not all(type(k) is str for k in spec):
        raise FrameError(f"{what}.spec: expected a map of keywords, got {short(spec)}")
    unknown = sorted(set(spec) - _DECODE_SPEC_KEYS)
    if unknown:
        raise FrameError(f"{what}.spec: unknown keywords {short(unknown)}")
    return _tag(tag, f"{what}.tag", False), spec


def _join(value: object, what: str) -> tuple[int, ...]:
    if type(value) is list and len(value) == 8 and all(type(v) is int and 0 <= v <= _U64_MAX for v in value):
        return tuple(value)
    return tuple(uint(v, f"{what}[{i}]") for i, v in enumerate(array(value, what, 8, 8)))


_KINDS_TO_SERVICE: Final = ("hello", "ping", "submit", "fault", "stats", "bye")
KINDS_TO_REMOTE: Final = ("welcome", "refused", "pong", "done", "stats", "bye", "stop", "fatal")


def decode_frame(frame: bytes, kinds: Sequence[str] = _KINDS_TO_SERVICE) -> list[Any]:
    """Unpack ``frame`` and check its envelope: ``[PROTOCOL_VERSION, kind, ...]`` with ``kind`` in ``kinds``.

    Raises :class:`FrameError` (never anything else) for bytes that are not one msgpack array of that form.
    The fields after ``kind`` are checked by the receiver."""
    try:
        message = msgpack.unpackb(
            frame, raw=False, use_list=True, strict_map_key=True, max_ext_len=0, max_bin_len=0, timestamp=0
        )
    except Exception as error:  # FormatError, StackError, ExtraData, ValueError, UnicodeDecodeError, ...
        raise FrameError(f"not one msgpack value ({type(error).__name__}: {short(str(error))})") from None
    if type(message) is not list or len(message) < 2:
        raise FrameError(f"expected an array [version, kind, ...], got {short(message)}")
    if type(message[0]) is not int or message[0] != PROTOCOL_VERSION:
        raise FrameError(f"unsupported protocol version {short(message[0])} (this side speaks {PROTOCOL_VERSION})")
    if type(message[1]) is not str or message[1] not in kinds:
        raise FrameError(f"unknown message kind {short(message[1])}")
    return message


def decode_submit(
    message: list[Any],
) -> tuple[int, int, list[Any], list[Any], list[Any], list[Any], list[Any], list[Any]]:
    array(message, "submit", 10, 10)
    seq = uint(message[2], "submit.seq")
    requested_ns = uint(message[3], "submit.requested_ns")
    limit = MAX_REQUESTS_PER_MESSAGE
    transfers = [_transfer(t, f"transfers[{i}]") for i, t in enumerate(array(message[4], "transfers", limit))]
    forwards = [_forward(f, f"forwards[{i}]") for i, f in enumerate(array(message[5], "forwards", limit))]
    ios = [_io(t, f"ios[{i}]") for i, t in enumerate(array(message[6], "ios", limit))]
    timers = [_timer(t, f"timers[{i}]") for i, t in enumerate(array(message[7], "timers", limit))]
    nodes = [_decode_node(n, f"decode_nodes[{i}]") for i, n in enumerate(array(message[8], "decode_nodes", limit))]
    joins = [_join(j, f"joins[{i}]") for i, j in enumerate(array(message[9], "joins", limit))]
    return seq, requested_ns, transfers, forwards, ios, timers, nodes, joins


_CORE_ERRORS: Final[dict[str, type[Exception]]] = {
    cls.__name__: cls
    for cls in (
        _core.CoreError,
        _core.InvalidArgumentError,
        _core.UnknownNameError,
        _core.ConfigError,
        _core.StateError,
        _core.CoreIOError,
    )  # fmt: skip
}


def error_from_service(type_name: str, text: str) -> Exception:
    """The exception a refused request's ``(error_type, text)`` is rebuilt as (a core or builtin class)."""
    cls = _CORE_ERRORS.get(type_name)
    if cls is None:
        builtin = getattr(builtins, type_name, None)
        if isinstance(builtin, type) and issubclass(builtin, Exception):
            cls = builtin
    if cls is not None:
        try:
            return cls(text)
        except Exception:  # a builtin whose constructor takes other arguments
            pass
    return DataPlaneError(f"{type_name}: {text}")


def socket_options(socket: zmq.Socket[Any], linger_ms: int) -> None:
    socket.setsockopt(zmq.LINGER, linger_ms)
    socket.setsockopt(zmq.SNDHWM, HWM)
    socket.setsockopt(zmq.RCVHWM, HWM)
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)


def fd_of(socket: zmq.Socket[Any]) -> int:
    """The socket's (edge-triggered) descriptor, for ``add_reader``."""
    fd = socket.getsockopt(zmq.FD)
    assert isinstance(fd, int)
    return fd


NOBLOCK: Final = int(zmq.NOBLOCK)
SNDMORE_NOBLOCK: Final = int(zmq.SNDMORE | zmq.NOBLOCK)


class Backlog(Generic[_T]):
    """What a process holds for its socket beyond ZeroMQ's queue, within :data:`BACKLOG_MESSAGES` and bytes."""

    __slots__ = ("items", "size_bytes")

    def __init__(self) -> None:
        self.items: deque[tuple[_T, int]] = deque()
        self.size_bytes = 0

    def __len__(self) -> int:
        return len(self.items)

    def keep(self, item: _T, size_bytes: int) -> bool:
        """Put ``item`` at the end; False (and it is not kept) past the bounds."""
        if self.items and (len(self.items) >= BACKLOG_MESSAGES or self.size_bytes + size_bytes > BACKLOG_BYTES):
            return False
        self.items.append((item, size_bytes))
        self.size_bytes += size_bytes
        return True

    def drain(self, send: Callable[[_T], bool]) -> None:
        """Send from the front while ``send`` takes it (True)."""
        while self.items:
            if not send(self.items[0][0]):
                return
            self.size_bytes -= self.items.popleft()[1]
