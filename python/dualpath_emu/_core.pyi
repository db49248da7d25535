"""Stub of the Rust extension module (core/src/python.rs); kept honest by ``mypy.stubtest``."""

from collections.abc import Iterable, Sequence
from typing import Literal, TypeAlias, final

__all__ = [
    "__version__",
    "UNREPORTED_TAG",
    "Core",
    "Arbitration",
    "PacketArbiter",
    "PacketPort",
    "CoreError",
    "InvalidArgumentError",
    "UnknownNameError",
    "ConfigError",
    "StateError",
    "CoreIOError",
]

__version__: str
UNREPORTED_TAG: int
"""The tag of work nobody waits for: counted and traced, never reported as a completion."""

class CoreError(Exception):
    """Base class of every error raised by the dualpath-emu core."""

class InvalidArgumentError(CoreError, ValueError):
    """An argument has a bad value; the message names the argument and what was expected."""

class UnknownNameError(CoreError, LookupError):
    """A port, node or transfer id or name that does not exist."""

class ConfigError(CoreError, ValueError):
    """A configuration (e.g. an arbitration table) that cannot be honoured."""

class StateError(CoreError, RuntimeError):
    """The operation is not allowed in the core's current state."""

class CoreIOError(CoreError, OSError):
    """Reading or writing a file failed."""

# ``(kind, tag, start_ns, end_ns, size_bytes, lane)``; kind is "transfer", "read", "write", "timer",
# "forward" or "decoded".
_Completion: TypeAlias = tuple[str, int, int, int, int, int]
# A forward pass's per-layer transfer: ``(path, lane, size_bytes)``.
_LayerTransfer: TypeAlias = tuple[Iterable[int], int, int]
# One DP-attention rank of a forward pass: ``(load, attn_ns, store)``.
_ForwardRank: TypeAlias = tuple[_LayerTransfer | None, int, _LayerTransfer | None]
# ``(n_layers, ranks, ffn_ns, collectives, load_window, tag)``.
_Forward: TypeAlias = tuple[int, Iterable[_ForwardRank], int, Iterable[_LayerTransfer], int, int]

@final
class Arbitration:
    """A port's virtual-lane arbitration, configured with InfiniBand's ``qos_*`` knobs."""

    @staticmethod
    def parse(max_vls: int, high_limit: int, vlarb_high: str, vlarb_low: str) -> Arbitration: ...
    @staticmethod
    def paper() -> Arbitration: ...
    @staticmethod
    def strict_priority(high: Iterable[int], low: Iterable[int]) -> Arbitration: ...
    @staticmethod
    def weighted_round_robin(entries: Iterable[tuple[int, int]]) -> Arbitration: ...
    @staticmethod
    def fair(n_lanes: int) -> Arbitration: ...
    @property
    def max_vls(self) -> int: ...
    @property
    def high_limit(self) -> int: ...
    @property
    def high(self) -> list[tuple[int, int]]: ...
    @property
    def low(self) -> list[tuple[int, int]]: ...
    def saturated_shares(self, mtu_bytes: int, backlogged: Iterable[int]) -> list[float]: ...
    def allocate(self, mtu_bytes: int, capacity: float, demands: Sequence[float]) -> list[float]: ...
    def __eq__(self, value: object, /) -> bool: ...

@final
class PacketArbiter:
    """The exact per-packet arbiter, the reference semantics of :class:`Arbitration`."""

    def __new__(cls, arbitration: Arbitration) -> PacketArbiter: ...
    def select(self, head_bytes: Iterable[int]) -> int | None: ...

@final
class PacketPort:
    """A token-bucket pacer with virtual-lane arbitration over chunks of real bytes.

    A backend enqueues messages, asks once per batch which chunks it may move now, and moves them itself.
    Tokens start at ``burst_bytes`` and refill at ``rate_bytes_per_s`` up to ``burst_bytes``; a chunk may be
    granted while the bucket holds more than 0 tokens and takes its whole size (a debt keeps the long-run
    rate exact). With an ``arbitration`` the next chunk is the head chunk of the lane the
    :class:`PacketArbiter` selects; without one, all lanes share one FIFO. Times are integer nanoseconds
    from the caller's clock and must not go backwards. ``grant`` returns ``(tag, lane, chunk_bytes,
    last_chunk_of_message)`` per chunk, in grant order. ``set_rate`` changes the rate part way (a fault).
    """

    def __new__(
        cls,
        rate_bytes_per_s: float,
        *,
        burst_bytes: float | None = None,
        arbitration: Arbitration | None = None,
        chunk_bytes: int = 65536,
    ) -> PacketPort: ...
    def enqueue(self, lane: int, size_bytes: int, tag: int) -> None: ...
    def grant(self, now_ns: int, max_chunks: int = 4096) -> list[tuple[int, int, int, bool]]: ...
    def next_grant_ns(self, now_ns: int) -> int | None: ...
    def set_rate(self, now_ns: int, rate_bytes_per_s: float, burst_bytes: float | None = None) -> None:
        """Refill at ``rate_bytes_per_s`` (>= 0; 0 pauses the port: it grants nothing and ``next_grant_ns`` is
        None) up to ``burst_bytes`` (None: as it was; tokens above a smaller one are dropped) from ``now_ns``
        on, keeping the tokens earned at the old rate until then."""
    @property
    def paused(self) -> bool: ...
    def cancel(self, tag: int) -> int: ...
    def queued_bytes(self, lane: int | None = None) -> int: ...
    def granted_bytes(self, lane: int | None = None) -> int: ...
    def queued_messages(self) -> int: ...
    @property
    def rate_bytes_per_s(self) -> float: ...
    @property
    def burst_bytes(self) -> float: ...
    @property
    def chunk_bytes(self) -> int: ...

@final
class Core:
    """The data-plane core: ports, transfers, storage and timers on one clock, driven in batches.

    Times are integer nanoseconds; rates are bytes per second.
    """

    def __new__(
        cls,
        *,
        clock: Literal["virtual", "wall"] | str = "virtual",
        time_scale: float = 1.0,
        sample_interval_ns: int | None = None,
        record_spans: bool = False,
        wall_elapsed_ns: int | None = None,
    ) -> Core: ...
    def add_port(
        self,
        name: str,
        rate_bytes_per_s: float,
        *,
        peak_bytes_per_s: float | None = None,
        burst_bytes: float | None = None,
        mtu_bytes: int | None = None,
        arbitration: Arbitration | None = None,
    ) -> int: ...
    def port_id(self, name: str) -> int: ...
    def port_name(self, port: int) -> str: ...
    def port_rate(self, port: int) -> float: ...
    @property
    def port_count(self) -> int: ...
    def configure_storage(
        self, *, read_port: int, write_port: int, read_latency_ns: int, write_latency_ns: int
    ) -> None: ...
    def add_storage_node(
        self, name: str, *, read_path: Iterable[int], write_path: Iterable[int], queue_depth: int
    ) -> int: ...
    def storage_node_id(self, name: str) -> int: ...
    def storage_node_name(self, node: int) -> str: ...
    @property
    def storage_node_count(self) -> int: ...
    def submit_transfers(
        self, transfers: Iterable[tuple[Sequence[int], int, int, int]], *, latency_sensitive_outstanding_bytes: int = 0
    ) -> int:
        """Start ``(path, lane, size_bytes, tag)`` transfers now; returns how many.

        With ``latency_sensitive_outstanding_bytes`` > 0 the batch is latency-sensitive (small messages such as
        a MoE dispatch): each transfer first waits ``max_p Q_p / r_p`` over the ports ``p`` of its path, ``Q_p``
        being the sum over the flows already crossing ``p`` on its lane of ``min(remaining bytes,
        latency_sensitive_outstanding_bytes)`` (a bulk sender's work-request size × queue depth) and ``r_p`` the
        rate ``p`` serves that lane at now (its capacity if 0), then moves as an ordinary transfer. Its
        completion's ``start_ns`` is the submission time. Transfers of one batch do not queue behind each
        other; a lane without other flows adds no wait.
        """
    def submit_forwards(self, forwards: Iterable[_Forward]) -> int: ...
    def submit_ios(
        self,
        ios: Iterable[tuple[int, str, int, int, int] | tuple[int, str, int, int, int, Sequence[tuple[int, int, int]]]],
    ) -> int: ...
    def set_external(self, port_domains: Sequence[int], storage_nodes: Sequence[int]) -> None:
        """Hand out, rather than model, a transfer whose path has ports of two domains (-1: none) and every I/O
        of the storage nodes listed: each comes as an ``"external"`` completion (its tag the work's id)."""
    def take_external(self) -> list[tuple[int, str, list[int], int, int, int, list[tuple[int, int, int]], int]]:
        """The work handed out since the last call: ``(id, kind, path, lane, size_bytes, storage node or -1,
        extents, start_ns)``, ``kind`` ``"transfer"``, ``"read"`` or ``"write"``, ``start_ns`` when it was asked
        for (before a storage queue's or a latency fault's wait)."""
    def spans(self) -> list[tuple[str, list[int], int, int, int, int, int]]:
        """The transfers and storage I/Os kept so far (``record_spans``): ``(kind, path, storage node or -1, lane,
        size_bytes, start_ns, end_ns)``."""
    def complete_externals(self, ids: Iterable[int]) -> int:
        """External work ``ids`` ended now (each in flight, once)."""
    def set_port_factor(self, port: int, factor: float) -> None: ...
    def set_port_latency(self, port: int, extra_ns: int) -> None: ...
    def port_factor(self, port: int) -> float: ...
    def add_timers(self, timers: Iterable[tuple[int, int]]) -> int: ...
    def add_decode_node(
        self,
        *,
        gpus: int,
        together: bool,
        pricing: dict[str, float | int | bool | None],
        kv_bytes_per_token: int,
        a2a_bytes_per_token: float,
        a2a_paths: Sequence[Sequence[int]],
        a2a_lane: int,
        d2h_paths: Sequence[Sequence[int]],
        storage_node: int | None,
        kv_lane: int,
        first_unit: int,
        report_tag: int,
        write_through: bool = True,
    ) -> int:
        """Add one node's decode GPUs, stepped by the core; returns its id (see ``core/src/decode.rs``;
        ``write_through`` False: completed blocks stop in the node's DRAM)."""
    def submit_decode_joins(self, joins: Iterable[tuple[int, int, int, int, int, int, int, int]]) -> int:
        """Requests join their decode GPUs' batches now: ``(node, gpu, rid, prompt, gen, produced,
        stored_blocks, context)`` each."""
    def take_decoded(self, node: int) -> tuple[list[tuple[int, int]], list[tuple[int, int, int, int, int]]]:
        """``([(rid, second_token_ns)], [(gpu unit, start_ns, end_ns, batch, step_ns)])`` since the last call."""
    def decode_reset(self, node: int) -> int:
        """An engine crash: decode node ``node`` drops every request now (decoding, waiting to join, ended but
        not taken), its GPUs' busy spans closed and reported (a ``"decoded"`` completion); returns how many."""
    def decode_bytes(self, node: int) -> dict[str, list[tuple[int, int]] | tuple[int, int]]: ...
    @property
    def now_ns(self) -> int: ...
    def clock_ns(self) -> int: ...
    @property
    def time_scale(self) -> float | None: ...
    def next_event_ns(self) -> int | None: ...
    def advance_to(self, t_ns: int) -> list[_Completion]: ...
    def advance_until(self, t_ns: int) -> list[_Completion]: ...
    def step(self) -> tuple[int, list[_Completion]] | None: ...
    def run_until_idle(self) -> list[_Completion]: ...
    def poll(self) -> list[_Completion]: ...
    def wakeup_fd(self) -> int: ...
    def take_completions(self) -> list[_Completion]: ...
    def pending(self) -> int: ...
    def storage_queue(self, node: int) -> dict[str, int]: ...
    def port_counters(self, port: int) -> dict[str, list[float] | list[int] | float]: ...
    def utilisation(self, port: int, lane: int | None = None) -> list[float]: ...
    def utilisation_mean(self, ports: Iterable[int], until_ns: int) -> list[float]: ...
    def utilisation_quantile(self, ports: Iterable[int], q: float, until_ns: int) -> float: ...
    @property
    def sample_interval_ns(self) -> int | None: ...
    def lane_rates(self, port: int) -> list[float]: ...
    def capacity(self, port: int) -> float: ...
    def flow_rate(self, path: Iterable[int], lane: int) -> float | None: ...
    def in_flight(self) -> list[tuple[list[int], int, int, float]]: ...
    def stats(self) -> dict[str, int]: ...
    def write_trace(
        self, path: str, *, port_pids: Iterable[int] | None = None, extra_events: Iterable[str] | None = None
    ) -> None: ...
