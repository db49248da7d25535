"""The data-plane service of a real-time run, and the data plane that reaches it from other processes (issue 14).

In real time the rates of all transfers are one max-min solution over all ports, so one process -- the
**data-plane service** -- owns the run's only core (``Core(clock="wall", time_scale=s)``, its plane a
:class:`ServiceCore`) and every port, and the actors of every other process reach it through the same data-plane
interface as any (:class:`~dualpath_emu.runtime.core_work.CoreWork`: ``transfer``, ``transfer_detached``,
``forward``, ``io``, ``io_detached``, ``core_timer``, ``new_tag``, ``expect``, ``flush``, ``clock_ns``): theirs
is a :class:`RemoteDataPlane`. Actor code cannot tell which it has (docs/architecture.md)::

    # the data plane's process
    core = Core(clock="wall", time_scale=1.0); app.build_core(core)
    plane = ServiceCore(core); loop = plane.new_loop()
    service = DataPlaneService(plane, bind="ipc:///run/dp.sock", requesters=["source", "workers"])
    loop.run_until_complete(service.serve())            # returns once every requester said bye, drained

    # any other process
    plane = RemoteDataPlane("ipc:///run/dp.sock", "workers", time_scale=1.0)   # connects, syncs clocks
    run_remote(main(), plane)                   # on a loop on the service's clock; main's actors use the plane

**Batches.** The remote plane queues requests like any :class:`CoreWork` and, at its next iteration, sends
everything requested in that iteration -- transfers, forwards, I/Os and timers -- as one ``submit``
message. The service submits each message to its core at once (one core call per kind, split one by one
if the core refuses it: each refused request gets its own error back, see
:func:`~dualpath_emu.runtime.core_work.submit_split`), and sends completions back batched: one ``done``
message per requester per wake-up (a pacer wake-up, or a batch of received messages). Detached work is
never reported; a detached request the core refuses fails the requester's run (:class:`DetachedRequestError`).
Tags are per requester: the service maps ``(requester, tag)`` to its own core tags.

**One clock.** At connect the remote plane measures its offset to the service's core clock NTP-style:
:data:`SYNC_ROUNDS` pings, each answered with the service's clock; the sample with the smallest round trip
is kept, its clock reading taken to be the service's clock at the round trip's midpoint. From then on the
remote plane's ``time()`` and ``clock_ns()`` are the service's clock (scaled by the run's ``time_scale``),
within ± RTT/2 of wall time (``offset_uncertainty_ns``, in emulated nanoseconds: × ``time_scale``). On one
host both clocks are the same ``CLOCK_MONOTONIC``, so that bound is all the error there is. Across hosts the
handshake works the same (any ``tcp://`` endpoint), but the hosts' monotonic clocks drift apart by their
frequency error (typically some ppm, 3.6 ms per hour at 1 ppm, less under NTP's discipline): that is **not
corrected**. Every heartbeat is a fresh sample, so the loop measures it: ``clock_check`` in
:meth:`RemoteDataPlane.report` holds the largest and the last disagreement seen between the service's
clock and the remote's estimate of it (samples with a round trip at most twice the handshake's); on one
host it stays within the RTT, on several hosts its growth is the drift. Re-run a long multi-host run's
handshake (a new process) if that matters.

**Lags.** The remote plane records, for each completion it delivers, its clock at delivery minus the
completion's modelled ``end_ns`` (the *delivery lag*); the service records, for each batch, its clock
when it submitted it minus the requester's clock when the first request of the batch was made (the
*submission lag*, carried in the batch). Both are :class:`LagStats` (p50, p99, max in bounded memory).

**Heartbeats.** Each remote plane pings the service every ``heartbeat_interval_s`` (0.5 s) wall and the
service answers; a remote plane that hears nothing from the service for ``heartbeat_timeout_s`` (5 s) fails
with :class:`DataPlaneLost` naming the data plane's endpoint; the service, hearing nothing from a
connected requester that long, fails with :class:`RequesterLost` naming it (and tells the others).

**Ending.** A requester whose actors are done says ``bye`` (:meth:`RemoteDataPlane.say_bye`); the
driver's process, its run complete, says so in its bye, and the service then tells every other connected
requester to ``stop`` (:meth:`RemoteDataPlane.when_stop_requested`), so a run ends by messages, with or
without a launcher; once every expected requester has said bye and the core has no pending work
(``core.pending() == 0``, detached work included), :meth:`DataPlaneService.serve` returns and the caller
writes :meth:`DataPlaneService.report`
(port counters, core stats, storage queues, lags). A ``stats`` request answers the same report at any time
(:meth:`RemoteDataPlane.stats`), for the end-of-run byte checks and live metrics.

Wire format (version :data:`PROTOCOL_VERSION`)
-----------------------------------------------
Sockets: a ROUTER at the service, one DEALER per remote process (high-water marks :data:`HWM`, frames at
most :data:`MAX_FRAME_BYTES`: ``zmq.MAXMSGSIZE``; what waits beyond ZeroMQ's queue is bounded by
:data:`BACKLOG_MESSAGES` and :data:`BACKLOG_BYTES`, answers to a peer refused at hello are dropped instead). With a ``keys`` object (:class:`DataPlaneKeys`, e.g. a
:class:`~dualpath_emu.runtime.security.RunKeys`) the service calls ``keys.make_server(socket)`` before it
binds and runs ``start_authenticator(context, keys)`` (a ZAP handler admitting the run's keys only); a
remote plane calls ``keys.make_client(socket, peer_name)`` before it connects: CURVE, authenticated and
encrypted. Without keys the rules of the actors' transport apply (:mod:`dualpath_emu.runtime.zmq_transport`):
a ``tcp://`` endpoint is refused (:class:`~dualpath_emu.errors.SecurityError`) unless ``insecure=True``, and
an ``ipc://`` socket's directory must be private to the user
(:func:`~dualpath_emu.runtime.security.check_private_ipc`). Every message is one frame, a msgpack array
``[version, kind, ...]``:

==========  =========  =====================================================================================
direction   kind       fields after ``kind``
==========  =========  =====================================================================================
to service  hello      ``name: str, pid: int, time_scale: float[, incarnation: int]`` (``incarnation``: 0 if
                       left out; see Restarted processes)
to remote   welcome    ``service: str, clock_ns: int, time_scale: float, layout: {"ports": {name: id},
                       "storage_nodes": {name: id}}, heartbeat_interval_s: float, heartbeat_timeout_s: float``
to remote   refused    ``reason: str`` (unknown or duplicate name, other time scale)
to service  ping       ``seq: int, t0: int`` (handshake rounds and heartbeats; ``t0`` the remote's own)
to remote   pong       ``seq: int, t0: int, clock_ns: int``
to service  submit     ``seq: int, requested_ns: int, transfers, forwards, ios, timers`` -- transfers
                       ``[[path, lane, size_bytes, tag]]``, forwards ``[[n_layers, [[load, attn_ns, store]],
                       ffn_ns, [[path, lane, size_bytes]], load_window, tag]]`` (``load``/``store``
                       ``[path, lane, size_bytes]`` or nil), ios ``[[node, "read"|"write", lane, size_bytes,
                       tag]]``, timers ``[[at_ns, tag]]``, decode_nodes ``[[tag, spec]]`` (``spec``:
                       ``Core.add_decode_node``'s keywords but ``report_tag``), joins ``[[node_tag, gpu, rid,
                       prompt, gen, produced, stored_blocks, context]]``; tag ``UNREPORTED_TAG`` (2^64 - 1):
                       detached (a join is: a bad one is reported with that tag)
to remote   done       ``sent_ns: int, completions: [[kind, tag, start_ns, end_ns, size_bytes, lane]],
                       errors: [[tag, error_type: str, text: str]], decoded: [[node_tag, ended, spans,
                       moved]]`` (``Core.take_decoded`` and ``Core.decode_bytes`` of the node, at its report)
to service  fault      ``seq: int, port: int, "factor" | "latency", value`` -- a port fault from now on
                       (``Core.set_port_factor``: a float in [0, 1]; ``Core.set_port_latency``: ns); or ``seq:
                       int, nil, "decode_reset", node_tag: int`` -- an engine crash: the sender's decode node
                       drops every request (``Core.decode_reset``; one it never added is refused, tag
                       ``UNREPORTED_TAG``). Sent after the sender's earlier submissions, so it follows them
to service  stats      ``seq: int``
to remote   stats      ``seq: int, report: map`` (:meth:`DataPlaneService.report`)
to service  bye        ``seq: int, run_complete: bool``
to remote   bye        ``seq: int``
to remote   stop       ``reason: str`` (the run is complete: stop the actors, then say bye)
to remote   fatal      ``reason: str`` (the service is failing)
==========  =========  =====================================================================================

**Restarted processes (issue 26).** A service given ``replaceable`` names (a live run's ``restart_crashed``)
lets a process of such a name that died be replaced: a hello under a name that is connected, with a higher
``incarnation`` than the connected one's, replaces it. The dead one's decode nodes drop every request
(``Core.decode_reset``), what the core completes for it afterwards is dropped (counted in
``completions_dropped``: not sent to the new one, not an error), frames from its connection are rejected, and
the end of the run waits for the new one's bye. A replaceable requester the service cannot reach any more (its
connection is gone: ZeroMQ's ``EHOSTUNREACH``) is taken for dead at once (its decode nodes reset, nothing
more sent to it); one silent for ``heartbeat_timeout_s`` is waited for ``connect_timeout_s`` more before the
run fails (its process is being started again). What each replaceable requester asked the core to move is
tallied per ``(port, lane)`` (as a process's ledger books it: its transfers, its forward passes' per-layer
transfers, its storage I/Os and its decode nodes' own traffic), and :meth:`DataPlaneService.report` gives, in
``replaced``, each replaced incarnation's tally: the bytes check of the run counts it for the ledger the dead
process never wrote.

The service checks every field of every frame it receives (types, ranges, lengths, known kinds, tags
not already in flight for that requester, a hello before anything else); a frame that fails is rejected
whole -- dropped, logged (logger ``dualpath_emu.runtime.dataplane``), counted (``rejected``) -- and never
disturbs the service. Whether a request makes sense (the ports exist, the lane is configured) is the
core's to say, per request, as in one process.
"""

from __future__ import annotations

import asyncio
import builtins
import importlib
import logging
import math
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import zmq

from dualpath_emu import _core
from dualpath_emu._core import UNREPORTED_TAG, Core
from dualpath_emu.errors import SecurityError
from dualpath_emu.runtime.lag import LagStats
from dualpath_emu.runtime.core_work import (
    clear_faults,
    TAG_OF_FORWARD,
    TAG_OF_IO,
    TAG_OF_TIMER,
    TAG_OF_TRANSFER,
    TAG_OF_DECODE_NODE,
    CoreLayout,
    CoreWork,
    core_layout,
    core_state,
    submit_split,
)
from dualpath_emu.runtime.realtime import RealTimeLoop, WallClockCore
from dualpath_emu.runtime.security import BoundedLog, check_private_ipc

__all__ = [
    "BACKLOG_BYTES",
    "BACKLOG_MESSAGES",
    "HWM",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "SYNC_ROUNDS",
    "Authenticator",
    "ClockSync",
    "DataPlaneError",
    "DataPlaneKeys",
    "DataPlaneLost",
    "DataPlaneService",
    "DetachedRequestError",
    "FrameError",
    "LagStats",
    "RefusedError",
    "RemoteDataPlane",
    "RequesterLost",
    "ServiceCore",
    "StartAuthenticator",
    "check_endpoint",
    "decode_frame",
    "error_from_service",
    "run_remote",
]

PROTOCOL_VERSION: Final = 2
"""2: decode nodes stepped by the service's core (``submit``'s ``decode_nodes`` and ``joins``, ``done``'s
``decoded``)."""
HWM: Final = 100_000
"""Send and receive high-water marks (messages queued per peer) of the data plane's sockets."""
MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
"""``zmq.MAXMSGSIZE`` of the data plane's sockets: a larger frame is refused by ZeroMQ itself."""
MAX_REQUESTS_PER_MESSAGE: Final = 65_536
"""At most this many requests of one kind (and completions) in one message; larger batches are split."""
MAX_PATH_PORTS: Final = 1_024
MAX_RANKS: Final = 65_536
MAX_NAME_CHARS: Final = 256
RECEIVE_BATCH: Final = 1_024
"""At most this many messages are taken from a socket before the loop runs others."""
BACKLOG_MESSAGES: Final = 100_000
"""The most messages a process holds beyond ZeroMQ's queue for the data plane's socket (the service: towards
all its requesters together; a remote plane: towards the service). Past it, or :data:`BACKLOG_BYTES`, the
run fails naming the peer that does not read: it is stuck, gone or far slower than the run."""
BACKLOG_BYTES: Final = 256 << 20
REJECTIONS_LOGGED: Final = 100
"""Rejected frames logged one by one by the service; then one summary line per power of ten (``BoundedLog``)."""
SYNC_ROUNDS: Final = 8
"""Ping rounds of the clock handshake; the one with the smallest round trip is kept."""
HEARTBEAT_INTERVAL_S: Final = 0.5
HEARTBEAT_TIMEOUT_S: Final = 5.0
CONNECT_TIMEOUT_S: Final = 60.0
"""How long a remote plane waits for the service's welcome, and the service for its expected requesters."""
BYE_TIMEOUT_S: Final = 1.0
DRAIN_CHECK_S: Final = 0.01
"""While every requester has said bye but work is pending, the service checks this often (wall s)."""
_U64_MAX: Final = 2**64 - 1
_U32_MAX: Final = 2**32 - 1
_REJECTION_LOG: Final = 20

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


# --- errors ------------------------------------------------------------------------------------------


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


# --- keys (runtime/security.py implements them) -------------------------------------------------------


class DataPlaneKeys(Protocol):
    """What the data plane needs of a run's keys (:class:`~dualpath_emu.runtime.security.RunKeys` has it):
    configure a socket as server, or as client of the peer called ``peer_name``."""

    def make_server(self, socket: zmq.Socket[Any], /) -> None: ...

    def make_client(self, socket: zmq.Socket[Any], peer_name: str, /) -> None: ...


class Authenticator(Protocol):
    """A running ZeroMQ authenticator (ZAP handler)."""

    def stop(self) -> None: ...


StartAuthenticator = Callable[[zmq.Context[Any], DataPlaneKeys], Authenticator]


def _default_start_authenticator() -> StartAuthenticator:
    """:func:`dualpath_emu.runtime.security.start_authenticator` (it takes its own ``RunKeys``)."""
    module = importlib.import_module("dualpath_emu.runtime.security")
    start: StartAuthenticator = module.start_authenticator
    return start


def check_endpoint(endpoint: str, keys: DataPlaneKeys | None, insecure: bool) -> None:
    """Refuse what the transport's security rules refuse: without keys, ``tcp://`` (unless ``insecure``) and
    an ``ipc://`` socket in a directory others may use (:func:`~dualpath_emu.runtime.security.check_private_ipc`)."""
    if keys is not None or insecure:
        return
    if endpoint.startswith("tcp://"):
        raise SecurityError(
            f"{endpoint}: a tcp:// data plane without keys would let any local process move the run's bytes and "
            "read its counters; give keys (RunKeys.load(...)), use ipc:// in a private directory, or insecure=True"
        )
    if endpoint.startswith("ipc://"):
        check_private_ipc(endpoint)


# --- lag statistics ---------------------------------------------------------------------------------


# --- decoding (every field checked) ------------------------------------------------------------------


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _uint(value: object, what: str, high: int = _U64_MAX, low: int = 0) -> int:
    if type(value) is not int or not low <= value <= high:
        raise FrameError(f"{what}: expected an integer in [{low}, {high}], got {_short(value)}")
    return value


def _float(value: object, what: str) -> float:
    if type(value) is not float or not math.isfinite(value):
        raise FrameError(f"{what}: expected a finite float, got {_short(value)}")
    return value


def _str(value: object, what: str, max_chars: int = MAX_NAME_CHARS) -> str:
    if type(value) is not str or len(value) > max_chars:
        raise FrameError(f"{what}: expected a string of at most {max_chars} characters, got {_short(value)}")
    return value


def _array(value: object, what: str, max_len: int, length: int | None = None) -> list[Any]:
    if type(value) is not list or len(value) > max_len or (length is not None and len(value) != length):
        wanted = f"{length} items" if length is not None else f"at most {max_len} items"
        got = f"{len(value)} items" if type(value) is list else _short(value)
        raise FrameError(f"{what}: expected an array of {wanted}, got {got}")
    return value


def _path(value: object, what: str) -> tuple[int, ...]:
    ports = _array(value, what, MAX_PATH_PORTS)
    return tuple(_uint(port, f"{what}[{i}]", _U32_MAX) for i, port in enumerate(ports))


def _tag(value: object, what: str, detached_ok: bool) -> int:
    tag = _uint(value, what, _U64_MAX, 1)
    if tag == UNREPORTED_TAG and not detached_ok:
        raise FrameError(f"{what}: UNREPORTED_TAG where a reported tag is required")
    return tag


def _layer_transfer(value: object, what: str) -> tuple[tuple[int, ...], int, int]:
    path, lane, size = _array(value, what, 3, 3)
    return (_path(path, f"{what}.path"), _uint(lane, f"{what}.lane", _U32_MAX), _uint(size, f"{what}.size_bytes"))


def _is_path(path: object) -> bool:
    return (
        type(path) is list
        and len(path) <= MAX_PATH_PORTS
        and all(type(port) is int and 0 <= port <= _U32_MAX for port in path)
    )


def _transfer(value: object, what: str) -> tuple[tuple[int, ...], int, int, int]:
    if type(value) is list and len(value) == 4:  # the common case, checked in one expression
        path, lane, size, tag = value
        if (
            type(lane) is int and type(size) is int and type(tag) is int
            and 0 <= lane <= _U32_MAX and 0 <= size <= _U64_MAX and 1 <= tag <= _U64_MAX and _is_path(path)
        ):  # fmt: skip
            return (tuple(path), lane, size, tag)
    path, lane, size, tag = _array(value, what, 4, 4)  # else say what is wrong
    return (
        _path(path, f"{what}.path"),
        _uint(lane, f"{what}.lane", _U32_MAX),
        _uint(size, f"{what}.size_bytes"),
        _tag(tag, f"{what}.tag", True),
    )


def _forward(value: object, what: str) -> tuple[int, tuple[Any, ...], int, tuple[Any, ...], int, int]:
    n_layers, ranks, ffn_ns, collectives, load_window, tag = _array(value, what, 6, 6)
    checked_ranks = []
    for i, rank in enumerate(_array(ranks, f"{what}.ranks", MAX_RANKS)):
        load, attn_ns, store = _array(rank, f"{what}.ranks[{i}]", 3, 3)
        checked_ranks.append((
            None if load is None else _layer_transfer(load, f"{what}.ranks[{i}].load"),
            _uint(attn_ns, f"{what}.ranks[{i}].attn_ns"),
            None if store is None else _layer_transfer(store, f"{what}.ranks[{i}].store"),
        ))  # fmt: skip
    checked_collectives = tuple(
        _layer_transfer(c, f"{what}.collectives[{i}]")
        for i, c in enumerate(_array(collectives, f"{what}.collectives", MAX_RANKS))
    )
    return (
        _uint(n_layers, f"{what}.n_layers", _U32_MAX),
        tuple(checked_ranks),
        _uint(ffn_ns, f"{what}.ffn_ns"),
        checked_collectives,
        _uint(load_window, f"{what}.load_window", _U32_MAX),
        _tag(tag, f"{what}.tag", False),
    )


def _io(value: object, what: str) -> tuple[int, str, int, int, int]:
    if type(value) is list and len(value) == 5:
        node, kind, lane, size, tag = value
        if (
            type(node) is int and type(lane) is int and type(size) is int and type(tag) is int
            and (kind == "read" or kind == "write") and type(kind) is str
            and 0 <= node <= _U32_MAX and 0 <= lane <= _U32_MAX and 0 <= size <= _U64_MAX and 1 <= tag <= _U64_MAX
        ):  # fmt: skip
            return (node, kind, lane, size, tag)
    node, kind, lane, size, tag = _array(value, what, 5, 5)
    if kind not in ("read", "write") or type(kind) is not str:
        raise FrameError(f"{what}.kind: expected 'read' or 'write', got {_short(kind)}")
    return (
        _uint(node, f"{what}.node", _U32_MAX),
        kind,
        _uint(lane, f"{what}.lane", _U32_MAX),
        _uint(size, f"{what}.size_bytes"),
        _tag(tag, f"{what}.tag", True),
    )


def _timer(value: object, what: str) -> tuple[int, int]:
    if type(value) is list and len(value) == 2:
        at_ns, tag = value
        if type(at_ns) is int and type(tag) is int and 0 <= at_ns <= _U64_MAX and 1 <= tag < _U64_MAX:
            return (at_ns, tag)
    at_ns, tag = _array(value, what, 2, 2)
    return (_uint(at_ns, f"{what}.at_ns"), _tag(tag, f"{what}.tag", False))


_DECODE_SPEC_KEYS: Final = frozenset({
    "gpus", "together", "pricing", "kv_bytes_per_token", "a2a_bytes_per_token", "a2a_paths", "a2a_lane", "d2h_paths",
    "storage_node", "kv_lane", "first_unit",
})  # fmt: skip
"""The keywords of ``Core.add_decode_node`` a decode node's ``spec`` may give (its values are the core's to check)."""


def _decode_node(value: object, what: str) -> tuple[int, dict[str, Any]]:
    tag, spec = _array(value, what, 2, 2)
    if type(spec) is not dict or not all(type(k) is str for k in spec):
        raise FrameError(f"{what}.spec: expected a map of keywords, got {_short(spec)}")
    unknown = sorted(set(spec) - _DECODE_SPEC_KEYS)
    if unknown:
        raise FrameError(f"{what}.spec: unknown keywords {_short(unknown)}")
    return _tag(tag, f"{what}.tag", False), spec


def _join(value: object, what: str) -> tuple[int, ...]:
    if type(value) is list and len(value) == 8 and all(type(v) is int and 0 <= v <= _U64_MAX for v in value):
        return tuple(value)
    return tuple(_uint(v, f"{what}[{i}]") for i, v in enumerate(_array(value, what, 8, 8)))


_KINDS_TO_SERVICE: Final = ("hello", "ping", "submit", "fault", "stats", "bye")
_KINDS_TO_REMOTE: Final = ("welcome", "refused", "pong", "done", "stats", "bye", "stop", "fatal")


def decode_frame(frame: bytes, kinds: Sequence[str] = _KINDS_TO_SERVICE) -> list[Any]:
    """Unpack ``frame`` and check its envelope: ``[PROTOCOL_VERSION, kind, ...]`` with ``kind`` in ``kinds``.

    Raises :class:`FrameError` (never anything else) for bytes that are not one msgpack array of that form.
    The fields after ``kind`` are checked by the receiver.
    """
    try:
        message = msgpack.unpackb(
            frame, raw=False, use_list=True, strict_map_key=True, max_ext_len=0, max_bin_len=0, timestamp=0
        )
    except Exception as error:  # FormatError, StackError, ExtraData, ValueError, UnicodeDecodeError, ...
        raise FrameError(f"not one msgpack value ({type(error).__name__}: {_short(str(error))})") from None
    if type(message) is not list or len(message) < 2:
        raise FrameError(f"expected an array [version, kind, ...], got {_short(message)}")
    if type(message[0]) is not int or message[0] != PROTOCOL_VERSION:
        raise FrameError(f"unsupported protocol version {_short(message[0])} (this side speaks {PROTOCOL_VERSION})")
    if type(message[1]) is not str or message[1] not in kinds:
        raise FrameError(f"unknown message kind {_short(message[1])}")
    return message


def _decode_submit(
    message: list[Any],
) -> tuple[int, int, list[Any], list[Any], list[Any], list[Any], list[Any], list[Any]]:
    _array(message, "submit", 10, 10)
    seq = _uint(message[2], "submit.seq")
    requested_ns = _uint(message[3], "submit.requested_ns")
    limit = MAX_REQUESTS_PER_MESSAGE
    transfers = [_transfer(t, f"transfers[{i}]") for i, t in enumerate(_array(message[4], "transfers", limit))]
    forwards = [_forward(f, f"forwards[{i}]") for i, f in enumerate(_array(message[5], "forwards", limit))]
    ios = [_io(t, f"ios[{i}]") for i, t in enumerate(_array(message[6], "ios", limit))]
    timers = [_timer(t, f"timers[{i}]") for i, t in enumerate(_array(message[7], "timers", limit))]
    nodes = [_decode_node(n, f"decode_nodes[{i}]") for i, n in enumerate(_array(message[8], "decode_nodes", limit))]
    joins = [_join(j, f"joins[{i}]") for i, j in enumerate(_array(message[9], "joins", limit))]
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
    )
}


def error_from_service(type_name: str, text: str) -> Exception:
    """The exception a refused request's ``(error_type, text)`` is rebuilt as: the core's error class of that
    name, else the builtin exception of that name, else :class:`DataPlaneError` (``"Type: text"``)."""
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


def _socket_options(socket: zmq.Socket[Any], linger_ms: int) -> None:
    socket.setsockopt(zmq.LINGER, linger_ms)
    socket.setsockopt(zmq.SNDHWM, HWM)
    socket.setsockopt(zmq.RCVHWM, HWM)
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)


def _fd_of(socket: zmq.Socket[Any]) -> int:
    """The socket's (edge-triggered) descriptor, for ``add_reader``."""
    fd = socket.getsockopt(zmq.FD)
    assert isinstance(fd, int)
    return fd


_NOBLOCK: Final = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK: Final = int(zmq.SNDMORE | zmq.NOBLOCK)


# --- the service ------------------------------------------------------------------------------------


@dataclass
class _Requester:
    """A connected remote process, as the service sees it."""

    name: str
    identity: bytes
    pid: int
    last_heard_s: float
    inflight: set[int] = field(default_factory=set)
    completions: list[list[Any]] = field(default_factory=list)
    errors: list[list[Any]] = field(default_factory=list)
    decoded: list[list[Any]] = field(default_factory=list)
    decode_nodes: dict[int, int] = field(default_factory=dict)
    """Its decode nodes: its tag -> the node's id in the core."""
    submission_lag: LagStats = field(default_factory=LagStats)
    batches: int = 0
    requests: int = 0
    completed: int = 0
    refused: int = 0
    said_bye: bool = False
    touched: bool = False
    incarnation: int = 0
    gone: bool = False
    """It died (replaced, or unreachable): nothing more is sent to it."""
    booked: dict[tuple[tuple[int, ...], int], list[int]] | None = None
    """A replaceable requester's tally: ``[bytes, transfers]`` per ``(path, lane)`` it asked the core to move."""
    decode_specs: dict[int, dict[str, Any]] = field(default_factory=dict)
    """A replaceable requester's decode nodes' specs (their paths: what they move on their own), by core id."""


class ServiceCore(WallClockCore):
    """The service's core: a :class:`~dualpath_emu.runtime.realtime.WallClockCore` whose completions for remote
    requesters go to the :class:`DataPlaneService` attached to it (the rest to this plane's own waiters)."""

    def __init__(self, core: Core) -> None:
        super().__init__(core)
        self._service: DataPlaneService | None = None

    def _deliver(self, completions: list[tuple[str, int, int, int, int, int]]) -> None:
        service = self._service
        if service is not None and completions:
            completions = service._route(completions)
        if completions:
            super()._deliver(completions)


class DataPlaneService:
    """The data-plane service of ``plane``'s core (see the module docstring), on the loop ``plane`` is bound to;
    bound at ``bind`` by :meth:`serve`.

    ``requesters`` names every process expected to connect (``None``: any name; the service is then drained
    once every process that connected said bye). ``keys`` (with ``start_authenticator``, by default the one of
    :mod:`dualpath_emu.runtime.security`) make it a CURVE server; without them ``insecure`` allows ``tcp://``
    (see the wire format). The heartbeat parameters are wall seconds. ``replaceable`` names the processes that
    may die and be replaced by a later incarnation, ``storage_paths`` every storage node's (core id) read and
    write ports (for their tallies; see Restarted processes in the module).
    """

    def __init__(
        self,
        plane: ServiceCore,
        *,
        bind: str,
        requesters: Iterable[str] | None = None,
        name: str = "dataplane",
        keys: DataPlaneKeys | None = None,
        start_authenticator: StartAuthenticator | None = None,
        insecure: bool = False,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        replaceable: Iterable[str] = (),
        storage_paths: Mapping[int, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
    ) -> None:
        if plane._service is not None:
            raise ValueError("this core already has a data-plane service")
        if not 0 < heartbeat_interval_s < heartbeat_timeout_s:
            raise ValueError("expected 0 < heartbeat_interval_s < heartbeat_timeout_s")
        check_endpoint(bind, keys, insecure)
        self.plane = plane
        self.core = plane.core
        self.bind_address = bind
        self.expected: tuple[str, ...] | None = None if requesters is None else tuple(requesters)
        self.name = name
        self._keys = keys
        self._start_authenticator = start_authenticator
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.counters: dict[str, int] = {
            "frames": 0, "rejected": 0, "batches": 0, "requests": 0, "completions": 0, "refused": 0,
            "messages_sent": 0, "send_failures": 0, "completions_dropped": 0,
        }  # fmt: skip
        self.rejections: deque[str] = deque(maxlen=_REJECTION_LOG)
        """The reasons of the last rejected frames."""
        self._rejection_log = BoundedLog(_log, "data plane: rejected a frame", first=REJECTIONS_LOGGED)
        self.submission_lag = LagStats()
        self._requesters: dict[bytes, _Requester] = {}
        self._by_name: dict[str, _Requester] = {}
        self._routes: dict[int, tuple[_Requester, int]] = {}
        self._decode_routes: dict[int, tuple[_Requester, int, int]] = {}
        """Core tag of a decode node's reports -> (its requester, the requester's tag, the node's id)."""
        self._touched: list[_Requester] = []
        self._layout = core_layout(self.core)
        self._context: zmq.Context[Any] | None = None
        self._socket: zmq.Socket[Any] | None = None
        self._authenticator: Authenticator | None = None
        self._endpoint: str | None = None
        self._done: asyncio.Future[str] | None = None
        self._backlog: deque[list[bytes]] = deque()
        self._backlog_bytes = 0
        self._recheck_due = False
        self._started_s = time.monotonic()
        self._drain_check: asyncio.TimerHandle | None = None
        self.failure: DataPlaneError | None = None
        self.run_complete_by: str | None = None
        """The requester that said its run is complete (then every other one was told to stop)."""
        self.replaceable = frozenset(replaceable)
        """Names whose process may die and be replaced by a later incarnation (see Restarted processes)."""
        self._storage_paths = dict(storage_paths or {})
        """Storage node (core id) -> the ports of its reads and of its writes, for the tallies."""
        self._replaced: list[_Requester] = []
        plane._service = self

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the service runs on (its plane's)."""
        return self.plane.loop

    # --- life --------------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The endpoint actually bound (a ``*`` port resolved); after :meth:`open`."""
        if self._endpoint is None:
            raise RuntimeError("the data-plane service is not open")
        return self._endpoint

    def open(self) -> None:
        """Bind the ROUTER socket and start serving (inside the running loop, or before it runs)."""
        if self._context is not None:
            raise RuntimeError("the data-plane service is already open")
        context: zmq.Context[Any] = zmq.Context()
        self._context = context
        try:
            if self._keys is not None:
                start = self._start_authenticator or _default_start_authenticator()
                self._authenticator = start(context, self._keys)
            socket = self._socket = context.socket(zmq.ROUTER)
            _socket_options(socket, 0)
            socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished peer is an error we count, not silence
            if self._keys is not None:
                self._keys.make_server(socket)
            socket.bind(self.bind_address)
        except BaseException:
            self.close()
            raise
        endpoint = socket.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(endpoint, bytes)
        self._endpoint = endpoint.decode()
        self._done = self.loop.create_future()
        self.loop.add_reader(_fd_of(socket), self._on_readable)
        self._started_s = time.monotonic()
        self.loop.call_soon(self._on_readable)
        self._schedule_heartbeat()

    def close(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._drain_check is not None:
            self._drain_check.cancel()
            self._drain_check = None
        if self._socket is not None:
            if not self.loop.is_closed():
                self.loop.remove_reader(_fd_of(self._socket))
            self._socket.close(linger=200)  # what we last sent (fatal, bye) still leaves
            self._socket = None
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None
        if self._context is not None:
            self._context.term()
            self._context = None
        self._rejection_log.flush()

    async def serve(self, stop: asyncio.Event | None = None) -> str:
        """Serve until drained (returns ``"drained"``), told to stop through ``stop`` (``"stopped"``), or
        failed (raises :class:`DataPlaneError`, e.g. :class:`RequesterLost`). Opens the service if needed
        and closes it on return."""
        if self._context is None:
            self.open()
        assert self._done is not None
        stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            waiting: set[asyncio.Future[Any]] = {self._done} if stopper is None else {self._done, stopper}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if self._done.done():
                return self._done.result()
            return "stopped"
        finally:
            if stopper is not None:
                stopper.cancel()
            self.close()

    # --- receiving ---------------------------------------------------------------------------------

    def _reject(self, reason: str, requester: _Requester | None = None) -> None:
        self.counters["rejected"] += 1
        who = f" from {requester.name!r}" if requester is not None else ""
        text = f"rejected a frame{who}: {reason}"
        self.rejections.append(text)
        self._rejection_log.note(f"{self._endpoint}{who}: {reason}")  # a flood is counted, not all logged

    def _on_readable(self) -> None:
        socket = self._socket
        if socket is None:
            return
        self._recheck_due = False
        recv = socket.recv
        handled = 0
        while handled < RECEIVE_BATCH:
            try:
                # recv_multipart(NOBLOCK), frame by frame (RCVMORE through getsockopt costs more than a frame)
                part = recv(_NOBLOCK, copy=False)
                frames = [part.bytes]
                while part.more:
                    part = recv(_NOBLOCK, copy=False)
                    frames.append(part.bytes)
            except zmq.Again:
                break
            except zmq.ZMQError as error:  # e.g. a frame over MAXMSGSIZE: ZeroMQ drops the peer's connection
                self._reject(f"receive failed: {error}")
                break
            handled += 1
            self.counters["frames"] += 1
            try:
                self._on_frames(frames)
            except FrameError as error:
                self._reject(str(error), self._requesters.get(frames[0]))
            except Exception as error:  # never let one frame end the service
                self._reject(f"{type(error).__name__}: {error}", self._requesters.get(frames[0]))
        completions = self.core.take_completions()  # what the submissions completed at once
        if completions:
            self.plane._deliver(completions)
        self._send_touched()
        if handled >= RECEIVE_BATCH:
            self.loop.call_soon(self._on_readable)

    def _on_frames(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            raise FrameError(f"expected one frame after the peer's identity, got {len(frames) - 1}")
        identity, frame = frames
        message = decode_frame(frame)
        kind = message[1]
        requester = self._requesters.get(identity)
        if kind == "hello":
            self._on_hello(identity, requester, message)
            return
        if requester is None:
            raise FrameError(f"a {kind!r} from a peer that has not said hello")
        requester.last_heard_s = time.monotonic()
        if kind == "submit":
            self._on_submit(requester, message)
        elif kind == "fault":
            self._on_fault(requester, message)
        elif kind == "ping":
            _array(message, "ping", 4, 4)
            seq, t0 = _uint(message[2], "ping.seq"), _uint(message[3], "ping.t0")
            self._send(identity, [PROTOCOL_VERSION, "pong", seq, t0, self.core.clock_ns()])
        elif kind == "stats":
            _array(message, "stats", 3, 3)
            self._send(identity, [PROTOCOL_VERSION, "stats", _uint(message[2], "stats.seq"), self.report()])
        else:  # bye
            _array(message, "bye", 4, 4)
            seq = _uint(message[2], "bye.seq")
            if type(message[3]) is not bool:
                raise FrameError(f"bye.run_complete: expected true or false, got {_short(message[3])}")
            requester.said_bye = True
            self._send(identity, [PROTOCOL_VERSION, "bye", seq])
            if message[3] and self.run_complete_by is None:
                self.run_complete_by = requester.name
                for other in self._requesters.values():
                    if not other.said_bye:
                        self._send(other.identity, [PROTOCOL_VERSION, "stop", f"{requester.name!r} completed the run"])
            self._check_drained()

    def _on_hello(self, identity: bytes, requester: _Requester | None, message: list[Any]) -> None:
        if type(message) is list and len(message) == 5:
            message = [*message, 0]
        _array(message, "hello", 6, 6)
        name = _str(message[2], "hello.name")
        pid = _uint(message[3], "hello.pid", _U32_MAX)
        time_scale = _float(message[4], "hello.time_scale")
        incarnation = _uint(message[5], "hello.incarnation", _U32_MAX)
        reason = None
        old = self._by_name.get(name)
        # (One that said bye may have died before it wrote its results: the new one's replace them, its tally counts.)
        replaces = old is not None and name in self.replaceable and incarnation > old.incarnation
        if requester is not None:
            reason = f"this connection already said hello as {requester.name!r}"
        elif not name:
            reason = "an empty name"
        elif self.expected is not None and name not in self.expected:
            reason = f"no process {name!r} is expected (expected: {', '.join(self.expected)})"
        elif old is not None and not old.said_bye and not replaces:
            reason = f"a process named {name!r} is already connected"
        elif not math.isclose(time_scale, self.plane.time_scale, rel_tol=1e-12):
            reason = f"time_scale {time_scale} differs from the data plane's {self.plane.time_scale}"
        if reason is not None:
            self._reject(f"hello refused: {reason}")
            self._send(identity, [PROTOCOL_VERSION, "refused", reason])
            return
        if replaces:
            assert old is not None
            self._replace(old, incarnation, pid)
        requester = _Requester(name, identity, pid, time.monotonic(), incarnation=incarnation)
        if name in self.replaceable:
            requester.booked = {}
        self._requesters[identity] = requester
        self._by_name[name] = requester
        layout = {"ports": dict(self._layout.ports), "storage_nodes": dict(self._layout.storage_nodes)}
        self._send(identity, [
            PROTOCOL_VERSION, "welcome", self.name, self.core.clock_ns(), self.plane.time_scale, layout,
            self.heartbeat_interval_s, self.heartbeat_timeout_s,
        ])  # fmt: skip
        if self.run_complete_by is not None:  # late: the run is over already
            self._send(identity, [PROTOCOL_VERSION, "stop", f"{self.run_complete_by!r} completed the run"])
        _log.info("data plane: %r (pid %d) connected", name, pid)

    def _gone(self, requester: _Requester, why: str) -> None:
        """Replaceable ``requester``'s process died: its decode nodes drop every request, nothing more is sent to
        it (what the core completes for it is dropped)."""
        if requester.gone:
            return
        requester.gone = True
        for node in requester.decode_nodes.values():
            self.core.decode_reset(node)
        _log.warning(
            "data plane: process %r (pid %d, incarnation %d) %s: its work is dropped; waiting for the "
            "process started in its place",
            requester.name,
            requester.pid,
            requester.incarnation,
            why,
        )

    def _replace(self, old: _Requester, incarnation: int, pid: int) -> None:
        """A new incarnation (pid ``pid``) of ``old``'s process said hello: ``old`` is dead (see Restarted
        processes in the module)."""
        self._gone(old, f"is replaced by incarnation {incarnation} (pid {pid})")
        self._requesters.pop(old.identity, None)  # its connection's frames are rejected from now on
        self._replaced.append(old)
        self.counters["replaced"] = self.counters.get("replaced", 0) + 1

    def _on_fault(self, requester: _Requester, message: list[Any]) -> None:
        """``[version, "fault", seq, port, "factor" | "latency", value]``: a fault changes a port from now on
        (:mod:`dualpath_emu.cluster.faults`; sent after the requester's earlier submissions, so it follows them);
        ``[version, "fault", seq, nil, "decode_reset", node_tag]``: an engine crash, the requester's decode node
        ``node_tag`` drops every request now (``Core.decode_reset``)."""
        _array(message, "fault", 6, 6)
        _uint(message[2], "fault.seq")
        what = _str(message[4], "fault.what")
        if what == "decode_reset":
            if message[3] is not None:
                raise FrameError(f"fault.port: expected nil for a decode_reset, got {_short(message[3])}")
            tag = _uint(message[5], "fault.value")
            node = requester.decode_nodes.get(tag)
            if node is None:  # like a join naming it: the requester's run is told
                self._refuse(requester, UNREPORTED_TAG, ValueError(f"a decode_reset names decode node {tag}, which "
                                                                   "this process never added"))  # fmt: skip
                return
            self.core.decode_reset(node)  # the spans it closes are reported with the completions of this read
            return
        port = _uint(message[3], "fault.port", self.core.port_count - 1)
        if what == "factor":
            factor = _float(message[5], "fault.value")
            if not 0.0 <= factor <= 1.0:
                raise FrameError(f"fault.value: expected a factor in [0, 1], got {_short(message[5])}")
            self.core.set_port_factor(port, factor)
        elif what == "latency":
            self.core.set_port_latency(port, _uint(message[5], "fault.value"))
        else:
            raise FrameError(f"fault.what: expected 'factor', 'latency' or 'decode_reset', got {_short(what)}")

    def _on_submit(self, requester: _Requester, message: list[Any]) -> None:
        _, requested_ns, transfers, forwards, ios, timers, nodes, joins = _decode_submit(message)
        # Tags must be new: not in flight for this requester (nor a decode node's), and not twice in this message.
        inflight, standing = requester.inflight, requester.decode_nodes
        seen: set[int] = set()
        for batch, tag_of in (
            (transfers, TAG_OF_TRANSFER), (forwards, TAG_OF_FORWARD), (ios, TAG_OF_IO), (timers, TAG_OF_TIMER),
            (nodes, TAG_OF_DECODE_NODE),
        ):  # fmt: skip
            for item in batch:
                tag = tag_of(item)
                if tag == UNREPORTED_TAG:
                    continue
                if tag in inflight or tag in standing or tag in seen:
                    raise FrameError(f"tag {tag} is already in flight")
                seen.add(tag)
        now_ns = self.core.clock_ns()
        lag = now_ns - requested_ns
        requester.submission_lag.add(lag)
        self.submission_lag.add(lag)
        requester.batches += 1
        self.counters["batches"] += 1
        count = len(transfers) + len(forwards) + len(ios) + len(timers) + len(nodes) + len(joins)
        requester.requests += count
        self.counters["requests"] += count
        if requester.booked is not None:
            self._tally(requester.booked, transfers, forwards, ios)
        core = self.core
        if transfers:
            self._submit(requester, core.submit_transfers, transfers, 3)
        if forwards:
            self._submit(requester, core.submit_forwards, forwards, 5)
        if ios:
            self._submit(requester, core.submit_ios, ios, 4)
        if timers:
            self._submit(requester, core.add_timers, timers, 1)
        for tag, spec in nodes:
            self._add_decode_node(requester, tag, spec)
        if joins:
            self._join(requester, joins)

    def _tally(
        self, booked: dict[tuple[tuple[int, ...], int], list[int]], transfers: list[Any], forwards: list[Any],
        ios: list[Any],
    ) -> None:  # fmt: skip
        """Book what a replaceable requester asked for as its ledger does (see Restarted processes)."""

        def book(path: tuple[int, ...], lane: int, size: int, count: int) -> None:
            tally = booked.get((path, lane))
            if tally is None:
                booked[(path, lane)] = [size, count]
            else:
                tally[0] += size
                tally[1] += count

        for path, lane, size, _ in transfers:
            book(path, lane, size, 1)
        for n_layers, ranks, _, collectives, _, _ in forwards:
            for load, _, store in ranks:
                for hop in (load, store):
                    if hop is not None:
                        book(hop[0], hop[1], hop[2] * n_layers, n_layers)
            for path, lane, size in collectives:
                book(path, lane, size * n_layers, n_layers)
        for node, kind, lane, size, _ in ios:
            paths = self._storage_paths.get(node)
            if paths is not None:
                book(paths[0] if kind == "read" else paths[1], lane, size, 1)

    def _tallied(self, requester: _Requester) -> list[list[int]]:
        """``requester``'s tally per port: ``[port, lane, bytes, transfers]``, its decode nodes' own traffic
        included (``Core.decode_bytes``, as its ledger books it)."""
        booked: dict[tuple[tuple[int, ...], int], list[int]] = {k: list(v) for k, v in (requester.booked or {}).items()}

        def book(path: tuple[int, ...], lane: int, size: int, count: int) -> None:
            tally = booked.setdefault((path, lane), [0, 0])
            tally[0] += size
            tally[1] += count

        for node, spec in requester.decode_specs.items():
            moved: dict[str, Any] = self.core.decode_bytes(node)
            for kind, paths, lane in (("d2h", spec.get("d2h_paths", ()), spec.get("kv_lane", 0)),
                                      ("a2a", spec.get("a2a_paths", ()), spec.get("a2a_lane", 0))):  # fmt: skip
                for path, (moved_bytes, moved_count) in zip(paths, moved[kind]):
                    if moved_count:
                        book(tuple(path), lane, moved_bytes, moved_count)
            written_bytes, written_count = moved["written"]
            storage = spec.get("storage_node")
            if written_count and storage is not None and storage in self._storage_paths:
                book(self._storage_paths[storage][1], spec.get("kv_lane", 0), written_bytes, written_count)
        ports: dict[tuple[int, int], list[int]] = {}
        for (path, lane), (size, count) in booked.items():
            for port in path:
                tally = ports.setdefault((port, lane), [0, 0])
                tally[0] += size
                tally[1] += count
        return [[port, lane, size, count] for (port, lane), (size, count) in sorted(ports.items())]

    def _add_decode_node(self, requester: _Requester, tag: int, spec: dict[str, Any]) -> None:
        core_tag = self.plane.new_tag()
        try:
            node = self.core.add_decode_node(report_tag=core_tag, **spec)
        except Exception as error:  # a bad spec: the core's error (or a keyword's type) goes back with its tag
            self._refuse(requester, tag, error)
            return
        requester.decode_nodes[tag] = node
        self._decode_routes[core_tag] = (requester, tag, node)
        if requester.booked is not None:
            requester.decode_specs[node] = spec

    def _join(self, requester: _Requester, joins: list[tuple[int, ...]]) -> None:
        nodes, known = requester.decode_nodes, []
        for join in joins:
            node = nodes.get(join[0])
            if node is None:
                self._refuse(requester, UNREPORTED_TAG, ValueError(f"a join names decode node {join[0]}, which "
                                                                   "this process never added"))  # fmt: skip
            else:
                known.append((node, *join[1:]))
        for _, error in submit_split(self.core.submit_decode_joins, known):  # type: ignore[arg-type]  # 8 ints
            self._refuse(requester, UNREPORTED_TAG, error)

    def _refuse(self, requester: _Requester, tag: int, error: Exception) -> None:
        requester.refused += 1
        self.counters["refused"] += 1
        requester.errors.append([tag, type(error).__name__, str(error)])
        self._touch(requester)

    def _submit(
        self, requester: _Requester, submit: Callable[[list[Any]], int], batch: list[Any], tag_index: int
    ) -> None:
        routes, inflight, new_tag = self._routes, requester.inflight, self.plane.new_tag
        items: list[Any] = []
        for item in batch:
            tag = item[tag_index]
            if tag == UNREPORTED_TAG:
                items.append(item)
                continue
            core_tag = new_tag()
            routes[core_tag] = (requester, tag)
            inflight.add(tag)
            items.append((*item[:tag_index], core_tag, *item[tag_index + 1 :]))
        for item, error in submit_split(submit, items):
            core_tag = item[tag_index]
            tag = UNREPORTED_TAG
            if core_tag != UNREPORTED_TAG:
                _, tag = routes.pop(core_tag)
                inflight.discard(tag)
            self._refuse(requester, tag, error)

    # --- sending -----------------------------------------------------------------------------------

    def _touch(self, requester: _Requester) -> None:
        if not requester.touched:
            requester.touched = True
            self._touched.append(requester)

    def _route(
        self, completions: list[tuple[str, int, int, int, int, int]]
    ) -> list[tuple[str, int, int, int, int, int]]:
        """Hand the completions of remote requests to their requesters; return the others."""
        routes, rest = self._routes, []
        for raw in completions:
            route = routes.pop(raw[1], None)
            if route is None:
                decode = self._decode_routes.get(raw[1])
                if decode is None:
                    rest.append(raw)
                else:  # a decode node's report: what ended, and what it moved so far
                    requester, tag, node = decode
                    requester.decoded.append([tag, *self.core.take_decoded(node), self.core.decode_bytes(node)])
                    self._touch(requester)
                continue
            requester, tag = route
            requester.inflight.discard(tag)
            requester.completed += 1
            requester.completions.append([raw[0], tag, raw[2], raw[3], raw[4], raw[5]])
            if not requester.touched:
                requester.touched = True
                self._touched.append(requester)
        self.counters["completions"] += len(completions) - len(rest)
        self._send_touched()
        if self._all_said_bye():
            self._check_drained()
        return rest

    def _send_touched(self) -> None:
        touched, self._touched = self._touched, []
        for requester in touched:
            requester.touched = False
            completions, errors, decoded = requester.completions, requester.errors, requester.decoded
            requester.completions, requester.errors, requester.decoded = [], [], []
            if requester.said_bye or requester.gone:
                self.counters["completions_dropped"] += len(completions)
                continue
            sent_ns = self.core.clock_ns()
            limit = MAX_REQUESTS_PER_MESSAGE
            for start in range(0, max(len(completions), len(decoded), 1), limit):
                end = start + limit
                self._send(requester.identity, [
                    PROTOCOL_VERSION, "done", sent_ns, completions[start:end], errors if start == 0 else [],
                    decoded[start:end],
                ])  # fmt: skip

    def _send(self, identity: bytes, message: list[Any]) -> None:
        payload = msgpack.packb(message, use_bin_type=True)
        frames = [identity, payload]
        if self._backlog:
            self._keep(frames)
            return
        self._send_now(frames)

    def _keep(self, frames: list[bytes]) -> None:
        """Put ``frames`` at the end of the backlog, bounded: past its bounds the run fails (see
        :data:`BACKLOG_MESSAGES`) and the frames are dropped."""
        if self._backlog and (
            len(self._backlog) >= BACKLOG_MESSAGES or self._backlog_bytes + len(frames[1]) > BACKLOG_BYTES
        ):  # (a message alone always fits)
            self.counters["send_failures"] += 1
            if self.failure is None:
                stuck = self._requesters.get(self._backlog[0][0])
                self._fail(DataPlaneError(
                    f"data plane: {len(self._backlog):,} messages ({self._backlog_bytes:,} bytes) wait for process "
                    f"{stuck.name if stuck else '?'!r}, which does not take them: stuck, gone or far slower than "
                    "the run"
                ))  # fmt: skip
            return
        self._backlog.append(frames)
        self._backlog_bytes += len(frames[1])

    def _send_now(self, frames: list[bytes]) -> bool:
        """Send at once; False (and the frames are kept) when the peer's queue is full."""
        socket = self._socket
        if socket is None:
            return True
        try:
            socket.send(frames[0], _SNDMORE_NOBLOCK)
            socket.send(frames[1], _NOBLOCK)
            self.counters["messages_sent"] += 1
        except zmq.Again:
            if frames[0] not in self._requesters:  # a refused peer that does not read: never hold its answers
                self.counters["send_failures"] += 1
                return True
            if not self._backlog or self._backlog[0] is not frames:
                self._keep(frames)
            self.loop.call_later(0.001 * self.plane.time_scale, self._drain_backlog)
            return False
        except zmq.ZMQError as error:  # EHOSTUNREACH: the peer is gone (ROUTER_MANDATORY)
            self.counters["send_failures"] += 1
            requester = self._requesters.get(frames[0])
            if requester is not None and requester.name in self.replaceable:
                self._gone(requester, "is unreachable (its process died)")
            else:
                _log.warning("data plane: a send failed: %s", error)
        finally:
            # The socket's descriptor is edge-triggered and a send may consume the edge that was to wake the
            # reader: look again at the next iteration (once, after every send of this one).
            if not self._recheck_due:
                self._recheck_due = True
                self.loop.call_soon(self._on_readable)
        return True

    def _drain_backlog(self) -> None:
        while self._backlog:
            if not self._send_now(self._backlog[0]):
                return
            self._backlog_bytes -= len(self._backlog.popleft()[1])

    # --- heartbeats and the end ----------------------------------------------------------------------

    def _schedule_heartbeat(self) -> None:
        self.loop.call_later(self.heartbeat_interval_s * self.plane.time_scale, self._heartbeat)

    def _heartbeat(self) -> None:
        if self._socket is None or self._done is None or self._done.done():
            return
        self._on_readable()  # what arrived while this loop was busy counts as heard
        now = time.monotonic()
        for requester in self._requesters.values():
            silent = now - requester.last_heard_s
            if requester.name in self.replaceable and not requester.said_bye and silent > self.heartbeat_timeout_s:
                # Its process died, or hangs (then its launcher ends the run): wait for the one started in its place.
                self._gone(requester, f"has not been heard from for {silent:.1f} s")
                if silent <= self.heartbeat_timeout_s + self.connect_timeout_s:
                    continue
            if not requester.said_bye and silent > self.heartbeat_timeout_s:
                self._fail(RequesterLost(
                    f"data plane: process {requester.name!r} (pid {requester.pid}) has not been heard from for "
                    f"{silent:.1f} s (heartbeat timeout {self.heartbeat_timeout_s} s): stopped, hung or gone"
                ))  # fmt: skip
                return
        if self.expected is not None and now - self._started_s > self.connect_timeout_s:
            missing = [name for name in self.expected if name not in self._by_name]
            if missing:
                self._fail(
                    DataPlaneError(f"data plane: processes {missing} did not connect within {self.connect_timeout_s} s")
                )
                return
        self._check_drained()
        self._schedule_heartbeat()

    def _fail(self, error: DataPlaneError) -> None:
        _log.error("%s", error)
        self.failure = error
        for requester in self._requesters.values():
            if not requester.said_bye and not requester.gone:
                self._send(requester.identity, [PROTOCOL_VERSION, "fatal", str(error)])
        if self._done is not None and not self._done.done():
            self._done.set_exception(error)

    def _all_said_bye(self) -> bool:
        if self.expected is not None:
            return all(name in self._by_name and self._by_name[name].said_bye for name in self.expected)
        return bool(self._requesters) and all(r.said_bye for r in self._requesters.values())

    def _check_drained(self) -> None:
        if self._done is None or self._done.done() or not self._all_said_bye():
            return
        clear_faults(self.core)  # the run is over, its faults with it: what they hold back may finish
        if self.core.pending() == 0:
            self._done.set_result("drained")
        elif self._drain_check is None:
            # Detached work ends without waking Python: look again shortly.
            def again() -> None:
                self._drain_check = None
                self._check_drained()

            self._drain_check = self.loop.call_later(DRAIN_CHECK_S * self.plane.time_scale, again)

    # --- reports -----------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """Everything the run's checks and metrics read: every port's counters (``Core.port_counters``, by
        port name), ``Core.stats()``, every storage node's queue, the lags and the service's counters."""
        core = self.core
        state = core_state(core)
        return {
            "service": self.name,
            "clock_ns": state["clock_ns"],
            "time_scale": self.plane.time_scale,
            "pending": core.pending(),
            "ports": state["ports"],
            "core": core.stats(),
            "storage": state["storage"],
            "counters": dict(self.counters),
            "submission_lag_ns": self.submission_lag.summary(),
            "submission_lag": self.submission_lag.to_wire(),
            "requesters": {
                r.name: {
                    "pid": r.pid, "batches": r.batches, "requests": r.requests, "completed": r.completed,
                    "refused": r.refused, "in_flight": len(r.inflight), "said_bye": r.said_bye,
                    "incarnation": r.incarnation,
                    "submission_lag_ns": r.submission_lag.summary(),
                }
                for r in self._requesters.values()
            },
            "replaced": [
                {"name": r.name, "incarnation": r.incarnation, "pid": r.pid, "batches": r.batches,
                 "requests": r.requests, "completed": r.completed, "in_flight": len(r.inflight),
                 "booked": self._tallied(r)}
                for r in self._replaced
            ],
            "rejections": list(self.rejections),
            "wall_s": round(time.monotonic() - self._started_s, 3),
        }  # fmt: skip


# --- the remote plane -----------------------------------------------------------------------------------


@dataclass
class ClockSync:
    """The result of a clock handshake: the service's clock ``clock_ns`` read at the remote's monotonic
    ``local_ns`` (the midpoint of the round trip ``rtt_ns``, wall ns) and the samples taken."""

    clock_ns: int
    local_ns: int
    rtt_ns: int
    rounds: int
    time_scale: float

    @property
    def offset_uncertainty_ns(self) -> int:
        """± this many emulated ns: half the round trip, scaled."""
        return math.ceil(self.rtt_ns / 2 * self.time_scale)


class _ClockCheck:
    """Later samples of the service's clock against the remote's estimate of it (heartbeats)."""

    __slots__ = ("samples", "max_abs_error_ns", "last_error_ns", "last_rtt_ns", "last_after_ns")

    def __init__(self) -> None:
        self.samples = 0
        self.max_abs_error_ns = 0
        self.last_error_ns = 0
        self.last_rtt_ns = 0
        self.last_after_ns = 0
        """Wall ns from the handshake to the last sample."""

    def summary(self) -> dict[str, int | float]:
        """The samples' count, the largest and the last disagreement (emulated ns), the last sample's round
        trip (wall ns) and the drift rate it implies (ppm of emulated time; noise within the RTT included)."""
        return {
            "samples": self.samples,
            "max_abs_error_ns": self.max_abs_error_ns,
            "last_error_ns": self.last_error_ns,
            "last_rtt_ns": self.last_rtt_ns,
            "drift_ppm": round(self.last_error_ns / self.last_after_ns * 1e6, 3) if self.last_after_ns else 0.0,
        }


def _plain_forward(forward: tuple[Any, ...]) -> list[Any]:
    """A forward request with every sequence as a list (msgpack packs lists and tuples only)."""

    def layer(transfer: Any) -> Any:
        return None if transfer is None else [list(transfer[0]), transfer[1], transfer[2]]

    n_layers, ranks, ffn_ns, collectives, load_window, tag = forward
    return [
        n_layers, [[layer(r[0]), r[1], layer(r[2])] for r in ranks], ffn_ns, [layer(c) for c in collectives],
        load_window, tag,
    ]  # fmt: skip


class RemoteDataPlane(CoreWork):
    """A data plane whose core work runs in the data-plane service at ``endpoint``, on the service's clock.

    Connects (a DEALER socket), says hello as ``name`` and measures the clock offset on construction
    (blocking, at most ``connect_timeout_s``: :class:`RefusedError`, :class:`DataPlaneLost`); ``layout`` is
    then the service's ports and storage nodes by name. ``time_scale`` must be the service's. ``keys`` make
    it a CURVE client of the process ``peer_name`` (the service's); without them ``insecure`` allows
    ``tcp://``. Then bind it to a loop on its clock (:meth:`new_loop`), run the program through :meth:`run`
    so that a lost data plane ends it, and call :meth:`say_bye` when its actors are done. The heartbeat
    parameters are wall seconds. ``incarnation`` > 0: this process was started in place of one that died
    (see Restarted processes in the module).
    """

    def __init__(
        self,
        endpoint: str,
        name: str,
        *,
        time_scale: float = 1.0,
        keys: DataPlaneKeys | None = None,
        peer_name: str = "dataplane",
        insecure: bool = False,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        sync_rounds: int = SYNC_ROUNDS,
        incarnation: int = 0,
    ) -> None:
        self._heartbeat_handle: asyncio.TimerHandle | None = None
        self.incarnation = incarnation
        """Which incarnation of its process this is (said at hello: a later one replaces a dead one)."""
        self._stop_callbacks: list[Callable[[str], None]] = []
        self.stop_reason: str | None = None
        """Why the service asked this process to stop (the run is complete), once it has."""
        self._fd: int | None = None
        self._socket: zmq.Socket[Any] | None = None
        self._context: zmq.Context[Any] | None = None
        super().__init__()
        if not 0 < heartbeat_interval_s < heartbeat_timeout_s:
            raise ValueError("expected 0 < heartbeat_interval_s < heartbeat_timeout_s")
        check_endpoint(endpoint, keys, insecure)
        self._decode_moved: dict[int, dict[str, Any]] = {}
        """Decode node (its tag) -> what it moved on its own, as of its last report."""
        self.endpoint = endpoint
        self.name = name
        self._time_scale = time_scale
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.delivery_lag = LagStats()
        self.counters: dict[str, int] = {"batches": 0, "requests": 0, "completions": 0, "refused": 0, "rejected": 0}
        self.failure: DataPlaneError | None = None
        """Why the data plane was lost (then :meth:`guard` raises it)."""
        self._failed: asyncio.Future[None] | None = None
        self._clock_check = _ClockCheck()
        self._seq = 0
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._batch_requested_ns = 0
        self._recheck_due = False
        self._backlog: deque[bytes] = deque()
        self._backlog_bytes = 0
        self._context = zmq.Context()
        socket = self._socket = self._context.socket(zmq.DEALER)
        try:
            _socket_options(socket, 200)
            if keys is not None:
                keys.make_client(socket, peer_name)
            socket.connect(endpoint)
            self.sync, self.layout = self._handshake(connect_timeout_s, sync_rounds)
        except BaseException:
            self._close_socket()
            raise
        self._base_ns = self.sync.clock_ns
        self._ref_ns = self.sync.local_ns
        self._last_heard_s = time.monotonic()

    def new_loop(self) -> RealTimeLoop:
        """A :class:`~dualpath_emu.runtime.realtime.RealTimeLoop` on the service's clock, with this plane bound
        to it."""
        loop = RealTimeLoop(self.clock_ns, self._time_scale)
        self.bind(loop)
        return loop

    def _bound(self) -> None:
        loop = self.loop
        self._failed = loop.create_future()
        if self.failure is not None:
            self._failed.set_result(None)
        if self._socket is not None:
            self._fd = _fd_of(self._socket)
            loop.add_reader(self._fd, self._on_readable)
            self._heartbeat_handle = loop.call_later(self.heartbeat_interval_s * self._time_scale, self._heartbeat)

    # --- the handshake -----------------------------------------------------------------------------

    def _handshake(self, timeout_s: float, rounds: int) -> tuple[ClockSync, CoreLayout]:
        socket = self._socket
        assert socket is not None
        deadline = time.monotonic() + timeout_s

        def receive(what: str) -> list[Any]:
            while True:
                left_ms = (deadline - time.monotonic()) * 1000
                if left_ms <= 0 or not socket.poll(max(1, int(left_ms)), zmq.POLLIN):
                    raise DataPlaneLost(
                        f"no {what} from the data plane at {self.endpoint} within {timeout_s} s: is it running?"
                    )
                try:
                    message = decode_frame(socket.recv(), _KINDS_TO_REMOTE)
                except FrameError as error:
                    self._reject(str(error))
                    continue
                if message[1] == "stop" and len(message) == 3 and type(message[2]) is str:
                    self.stop_reason = self.stop_reason or message[2]  # the run is complete already (a late process)
                    continue
                return message

        hello = [PROTOCOL_VERSION, "hello", self.name, os.getpid(), float(self._time_scale)]
        socket.send(msgpack.packb(hello + [self.incarnation] if self.incarnation else hello))
        while True:
            message = receive("welcome")
            if message[1] == "refused":
                raise RefusedError(
                    f"the data plane at {self.endpoint} refused {self.name!r}: {message[2] if len(message) > 2 else '?'}"
                )
            if message[1] == "welcome":
                break
        try:
            _array(message, "welcome", 8, 8)
            time_scale = _float(message[4], "welcome.time_scale")
            layout_map = message[5]
            if type(layout_map) is not dict or type(layout_map.get("ports")) is not dict:
                raise FrameError("welcome.layout: expected a map with ports and storage_nodes")
            layout = CoreLayout(
                {_str(k, "port name"): _uint(v, "port id", _U32_MAX) for k, v in layout_map["ports"].items()},
                {_str(k, "node name"): _uint(v, "node id", _U32_MAX) for k, v in dict(layout_map.get("storage_nodes", {})).items()},
            )  # fmt: skip
        except (FrameError, AttributeError, TypeError) as error:
            raise DataPlaneError(f"a malformed welcome from the data plane at {self.endpoint}: {error}") from None
        if not math.isclose(time_scale, self._time_scale, rel_tol=1e-12):
            raise RefusedError(f"the data plane runs at time_scale {time_scale}, this process at {self._time_scale}")
        best: ClockSync | None = None
        for seq in range(1, max(rounds, 1) + 1):
            t0 = time.monotonic_ns()
            socket.send(msgpack.packb([PROTOCOL_VERSION, "ping", seq, t0]))
            while True:
                pong = receive("answer to a clock ping")
                if pong[1] == "pong" and len(pong) == 5 and pong[2] == seq:
                    break
            t1 = time.monotonic_ns()
            clock_ns = _uint(pong[4], "pong.clock_ns")
            if best is None or t1 - t0 < best.rtt_ns:
                best = ClockSync(clock_ns, (t0 + t1) // 2, t1 - t0, rounds, self._time_scale)
        assert best is not None
        self._seq = max(rounds, 1)
        return best, layout

    # --- the clock ---------------------------------------------------------------------------------

    @property
    def time_scale(self) -> float:
        """Emulated seconds per wall second (the service's)."""
        return self._time_scale

    def clock_ns(self) -> int:
        """The service's core clock now, as measured at connect (see the module docstring)."""
        return self._base_ns + int((time.monotonic_ns() - self._ref_ns) * self._time_scale)

    def decode_bytes(self, node: int) -> dict[str, Any] | None:
        """What decode node ``node`` moved on its own, as its last report said (``None`` before one came)."""
        return self._decode_moved.get(node)

    # --- submitting --------------------------------------------------------------------------------

    def set_port_factor(self, port: int, factor: float) -> None:
        """A fault: ``port``'s rates × ``factor`` from now on, in the service's core (after what was asked
        for before it)."""
        self.flush()
        self._send(msgpack.packb([PROTOCOL_VERSION, "fault", self._next_seq(), port, "factor", float(factor)]))

    def set_port_latency(self, port: int, extra_ns: int) -> None:
        """A fault: ``extra_ns`` added to what starts crossing ``port`` from now on, in the service's core."""
        self.flush()
        self._send(msgpack.packb([PROTOCOL_VERSION, "fault", self._next_seq(), port, "latency", int(extra_ns)]))

    def decode_reset(self, node: int) -> None:
        """An engine crash: decode node ``node`` (this process's handle) drops every request now, in the
        service's core (after what was asked for before it); the busy spans it closes come with a report."""
        if node not in self._decode_reports:
            raise LookupError(f"decode_reset: decode node {node} was never added through this data plane")
        self.flush()
        self._send(msgpack.packb([PROTOCOL_VERSION, "fault", self._next_seq(), None, "decode_reset", int(node)]))

    def _work_requested(self) -> None:
        self._batch_requested_ns = self.clock_ns()
        self.loop.call_soon(self.flush)

    def _submit_batch(
        self, transfers: list[Any], forwards: list[Any], ios: list[Any], timers: list[Any], decode_nodes: list[Any],
        joins: list[Any],
    ) -> None:  # fmt: skip
        requested_ns = self._batch_requested_ns
        self.counters["batches"] += 1
        self.counters["requests"] += (
            len(transfers) + len(forwards) + len(ios) + len(timers) + len(decode_nodes) + len(joins)
        )
        limit = MAX_REQUESTS_PER_MESSAGE
        largest = max(len(transfers), len(forwards), len(ios), len(timers), len(joins), 1)
        for start in range(0, largest, limit):
            end = start + limit
            message = [
                PROTOCOL_VERSION, "submit", self._next_seq(), requested_ns,
                transfers[start:end], forwards[start:end], ios[start:end], timers[start:end],
                decode_nodes if start == 0 else [], joins[start:end],  # the nodes before any join that names them
            ]  # fmt: skip
            try:
                payload = msgpack.packb(message)
            except TypeError:  # a path given as another sequence (a range, say): make every sequence a list
                message[5] = [_plain_forward(f) for f in forwards[start:end]]
                message[4] = [[list(t[0]), t[1], t[2], t[3]] for t in transfers[start:end]]
                payload = msgpack.packb(message)
            self._send(payload)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, payload: bytes) -> None:
        if self._socket is None:
            return
        if len(payload) > MAX_FRAME_BYTES:  # the service's socket would drop the connection: say why instead
            self._fatal(DataPlaneError(
                f"{self.name!r} has a message of {len(payload):,} bytes for the data plane, more than its frames "
                f"take ({MAX_FRAME_BYTES:,} bytes)"
            ))  # fmt: skip
            return
        if not self._backlog:
            try:
                self._socket.send(payload, _NOBLOCK)
            except zmq.Again:
                self._keep(payload)
                self.loop.call_later(0.001 * self._time_scale, self._drain_backlog)
        else:
            self._keep(payload)
        if not self._recheck_due:  # a send may consume the descriptor's edge: look again next iteration
            self._recheck_due = True
            self.loop.call_soon(self._on_readable)

    def _keep(self, payload: bytes) -> None:
        """Put ``payload`` at the end of the backlog, bounded: past its bounds the run fails (see
        :data:`BACKLOG_MESSAGES`) and what this process asks for from then on is dropped."""
        if self._backlog and (
            len(self._backlog) >= BACKLOG_MESSAGES or self._backlog_bytes + len(payload) > BACKLOG_BYTES
        ):  # (a message alone always fits)
            self._fatal(DataPlaneError(
                f"{len(self._backlog):,} messages ({self._backlog_bytes:,} bytes) of {self.name!r} wait for the data "
                f"plane at {self.endpoint}, which does not take them: stuck or far slower than the run"
            ))  # fmt: skip
            return
        self._backlog.append(payload)
        self._backlog_bytes += len(payload)

    def _drain_backlog(self) -> None:
        socket = self._socket
        while self._backlog and socket is not None:
            try:
                socket.send(self._backlog[0], _NOBLOCK)
            except zmq.Again:
                self.loop.call_later(0.001 * self._time_scale, self._drain_backlog)
                return
            self._backlog_bytes -= len(self._backlog.popleft())

    # --- receiving ---------------------------------------------------------------------------------

    def _reject(self, reason: str) -> None:
        self.counters["rejected"] += 1
        _log.warning("remote data plane %r: rejected a frame from %s: %s", self.name, self.endpoint, reason)

    def _on_readable(self) -> None:
        self._recheck_due = False
        socket = self._socket
        if socket is None:
            return
        recv = socket.recv
        for _ in range(RECEIVE_BATCH):
            try:
                frame = recv(_NOBLOCK)
            except zmq.Again:
                return
            self._last_heard_s = time.monotonic()
            try:
                self._on_message(decode_frame(frame, _KINDS_TO_REMOTE))
            except FrameError as error:
                self._reject(str(error))
        self.loop.call_soon(self._on_readable)  # more may be queued: let others run first

    def _on_message(self, message: list[Any]) -> None:
        kind = message[1]
        if kind == "done":
            _array(message, "done", 6, 6)
            completions = _array(message[3], "done.completions", MAX_REQUESTS_PER_MESSAGE)
            errors = _array(message[4], "done.errors", MAX_REQUESTS_PER_MESSAGE * 4)
            decoded = _array(message[5], "done.decoded", MAX_REQUESTS_PER_MESSAGE)
            for entry in errors:
                tag, type_name, text = _array(entry, "done.errors[]", 3, 3)
                self.counters["refused"] += 1
                error = error_from_service(_str(type_name, "error type"), _str(text, "error text", 100_000))
                if tag == UNREPORTED_TAG or tag in self._decode_reports:  # nobody but the run can be told
                    what = "a detached request" if tag == UNREPORTED_TAG else "a decode node"
                    self._fatal(DetachedRequestError(f"the data plane refused {what}: {type(error).__name__}: {error}"))
                else:
                    self._refused(_uint(tag, "error tag"), error)
            if completions:
                now = self.clock_ns()
                add = self.delivery_lag.add
                for completion in completions:
                    if type(completion) is not list or len(completion) != 6:
                        raise FrameError(
                            f"done.completions: expected [kind, tag, start, end, size, lane], got {_short(completion)}"
                        )
                    add(now - completion[3])
                self.counters["completions"] += len(completions)
                try:
                    self._deliver(completions)
                except Exception as error:  # UnexpectedCompletionError: nobody awaits a tag
                    self._fatal(DataPlaneError(str(error)))
            for entry in decoded:
                tag, ended, spans, moved = _array(entry, "done.decoded[]", 4, 4)
                if tag not in self._decode_reports:
                    raise FrameError(
                        f"done.decoded: a report of decode node {_short(tag)}, which this process never added"
                    )
                self._decode_moved[tag] = moved
                self._decoded(
                    tag,
                    _array(ended, "done.decoded[].ended", _U32_MAX),
                    _array(spans, "done.decoded[].spans", _U32_MAX),
                )
        elif kind == "pong":
            _array(message, "pong", 5, 5)
            t1 = time.monotonic_ns()
            seq, t0, clock_ns = (
                _uint(message[2], "pong.seq"),
                _uint(message[3], "pong.t0"),
                _uint(message[4], "pong.clock_ns"),
            )
            rtt = t1 - t0
            if 0 <= rtt <= 2 * self.sync.rtt_ns + 50_000:
                # A good sample: how far is the service's clock from our estimate of it at the midpoint?
                estimate = self._base_ns + int(((t0 + t1) // 2 - self._ref_ns) * self._time_scale)
                check = self._clock_check
                check.samples += 1
                check.last_error_ns = clock_ns - estimate
                check.last_rtt_ns = rtt
                check.last_after_ns = max(1, int(((t0 + t1) // 2 - self._ref_ns) * self._time_scale))
                check.max_abs_error_ns = max(check.max_abs_error_ns, abs(check.last_error_ns))
            self._resolve(seq, None)
        elif kind in ("stats", "bye"):
            seq = _uint(message[2], f"{kind}.seq")
            self._resolve(seq, message[3] if kind == "stats" and len(message) > 3 else None)
        elif kind == "stop":
            reason = _str(message[2], "stop.reason", 100_000) if len(message) > 2 else "stop"
            if self.stop_reason is None:
                self.stop_reason = reason
                for callback in self._stop_callbacks:
                    self.loop.call_soon(callback, reason)
        elif kind == "fatal":
            self._fatal(
                DataPlaneError(f"the data plane at {self.endpoint} failed: {_str(message[2], 'reason', 100_000)}")
            )
        else:  # welcome or refused after the handshake
            raise FrameError(f"an unexpected {kind!r} after the handshake")

    def _resolve(self, seq: int, value: Any) -> None:
        future = self._replies.pop(seq, None)
        if future is not None and not future.done():
            future.set_result(value)

    # --- heartbeats, failure and the end -------------------------------------------------------------

    def _heartbeat(self) -> None:
        self._heartbeat_handle = None
        if self._socket is None or self.failure is not None:
            return
        self._on_readable()  # what arrived while the loop was busy counts as heard
        silent = time.monotonic() - self._last_heard_s
        if silent > self.heartbeat_timeout_s:
            self._fatal(DataPlaneLost(
                f"no word from the data plane at {self.endpoint} for {silent:.1f} s (heartbeat timeout "
                f"{self.heartbeat_timeout_s} s): it is stopped, hung or gone"
            ))  # fmt: skip
            return
        self._send(msgpack.packb([PROTOCOL_VERSION, "ping", self._next_seq(), time.monotonic_ns()]))
        self._heartbeat_handle = self.loop.call_later(self.heartbeat_interval_s * self._time_scale, self._heartbeat)

    def _fatal(self, error: DataPlaneError) -> None:
        if self.failure is None:
            _log.error("%s", error)
            self.failure = error
            if self._failed is not None and not self._failed.done():
                self._failed.set_result(None)

    async def run(self, main: Awaitable[_T]) -> _T:
        """``main``'s result; if the data plane is lost first, ``main`` is cancelled and the
        :class:`DataPlaneError` raised."""
        assert self._failed is not None, "bind the plane to its loop first (new_loop)"
        task = asyncio.ensure_future(main)
        waiting: set[asyncio.Future[Any]] = {task, self._failed}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert self.failure is not None
        raise self.failure

    def when_stop_requested(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` (soon, in the loop) when the service says the run is complete: another
        process's bye said so (see :meth:`say_bye`); at once if it has said so already."""
        self._stop_callbacks.append(callback)
        if self.stop_reason is not None:
            self.loop.call_soon(callback, self.stop_reason)

    async def _request(self, kind: str, timeout_s: float, *fields: Any) -> Any:
        seq = self._next_seq()
        future: asyncio.Future[Any] = self.loop.create_future()
        self._replies[seq] = future
        self._send(msgpack.packb([PROTOCOL_VERSION, kind, seq, *fields]))
        try:
            return await asyncio.wait_for(future, timeout_s * self._time_scale)
        finally:
            self._replies.pop(seq, None)

    async def stats(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """The service's :meth:`DataPlaneService.report` (``timeout_s`` wall seconds; :class:`TimeoutError`)."""
        self.flush()
        report: dict[str, Any] = await self._request("stats", timeout_s)
        return report

    async def say_bye(self, timeout_s: float = BYE_TIMEOUT_S, *, run_complete: bool = False) -> bool:
        """Submit what is still queued and tell the service this process is done; True once it answered
        (within ``timeout_s`` wall seconds). ``run_complete`` (the driver's process, its run done): the
        service tells every other process to stop."""
        self.flush()
        if self._socket is None or self.failure is not None:
            return False
        try:
            await self._request("bye", timeout_s, run_complete)
        except TimeoutError:
            return False
        return True

    async def finish(self, run_complete: bool) -> None:
        """Submit what is still queued and say bye (:meth:`say_bye`)."""
        await self.say_bye(run_complete=run_complete)

    def report(self) -> dict[str, Any]:
        """This process's side: the clock handshake, the later clock checks, delivery lags, counters."""
        return {
            "endpoint": self.endpoint,
            "rtt_ns": self.sync.rtt_ns,
            "offset_uncertainty_ns": self.sync.offset_uncertainty_ns,
            "sync_rounds": self.sync.rounds,
            "clock_check": self._clock_check.summary(),
            "delivery_lag_ns": self.delivery_lag.summary(),
            "delivery_lag": self.delivery_lag.to_wire(),
            "counters": dict(self.counters),
            "failure": str(self.failure) if self.failure is not None else None,
        }

    def _close_socket(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._context is not None:
            self._context.term()
            self._context = None

    def close(self) -> None:
        """Stop the heartbeat, close the socket (idempotent; the loop stays open)."""
        if self._heartbeat_handle is not None:
            self._heartbeat_handle.cancel()
            self._heartbeat_handle = None
        loop = getattr(self, "loop", None)
        if self._fd is not None and loop is not None and not loop.is_closed():
            loop.remove_reader(self._fd)
        self._fd = None
        self._close_socket()


def run_remote(main: Awaitable[_T], plane: RemoteDataPlane) -> _T:
    """Run ``main`` to completion on a new loop on ``plane``'s clock (guarded: a lost data plane raises); close
    the plane and the loop after."""
    loop = plane.new_loop()
    try:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            return runner.run(plane.run(main))
    finally:
        plane.close()
