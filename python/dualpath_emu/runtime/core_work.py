"""Work on the core as asyncio futures: a live process's data plane, bound to its loop (:meth:`CoreWork.bind`), whose
clock it gives. Requests are batched and a batch submitted at the loop's next iteration (the FFI boundary or the wire
is crossed per batch); :class:`CoreWork` holds what every plane shares (tags, pending lists, waiters, delivery) and a
flavour says how a batch is submitted: :class:`LocalCoreWork` on a core in this process, the remote plane to the
data-plane service, the host backend moving real bytes. A refused request fails its own future; a detached one the
run. Work submitted by other code takes its tag from :meth:`~CoreWork.new_tag` and registers it with ``expect``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple, TypeAlias, TypeVar

from dualpath_emu._core import UNREPORTED_TAG, Core
from dualpath_emu.runtime.engine import Extents, forward_bytes
from dualpath_emu.runtime.virtual import submit_batch

__all__ = [
    "clear_faults", "Completion", "CoreLayout", "CoreWork", "Extents", "ForwardRank", "LayerTransfer",
    "LocalCoreWork", "UnexpectedCompletionError", "core_layout", "core_state", "forward_bytes"
]  # fmt: skip

_T = TypeVar("_T")

# ``(path, lane, size_bytes)``, e.g. a :class:`LayerTransfer`.
_LayerTransferLike: TypeAlias = tuple[Sequence[int], int, int]
# ``(load, attn_ns, store)``, e.g. a :class:`ForwardRank`.
_ForwardRankLike: TypeAlias = tuple[_LayerTransferLike | None, int, _LayerTransferLike | None]
_Forward: TypeAlias = tuple[int, tuple[_ForwardRankLike, ...], int, tuple[_LayerTransferLike, ...], int, int]
_Transfer: TypeAlias = tuple[Sequence[int], int, int, int]
_Io: TypeAlias = tuple[int, str, int, int, int] | tuple[int, str, int, int, int, Extents]
_Timer: TypeAlias = tuple[int, int]
_RawCompletion: TypeAlias = tuple[str, int, int, int, int, int]
_DecodeNode: TypeAlias = tuple[int, dict[str, Any]]
_Join: TypeAlias = tuple[int, int, int, int, int, int, int, int]
_Report: TypeAlias = Callable[[list[tuple[int, int]], list[tuple[int, int, int, int, int]]], None]

# Where each kind of request keeps its tag (module constants: no closure is made per batch).
TAG_OF_TRANSFER: Callable[[_Transfer], int] = itemgetter(3)
TAG_OF_FORWARD: Callable[[_Forward], int] = itemgetter(5)
TAG_OF_IO: Callable[[_Io], int] = itemgetter(4)
TAG_OF_TIMER: Callable[[_Timer], int] = itemgetter(1)
TAG_OF_DECODE_NODE: Callable[[_DecodeNode], int] = itemgetter(0)


class Completion(NamedTuple):
    """What the core reports when work ends (``kind``: transfer, read, write, timer or forward)."""

    kind: str
    tag: int
    start_ns: int
    end_ns: int
    size_bytes: int
    lane: int


class LayerTransfer(NamedTuple):
    """A transfer repeated in every layer of a forward pass: ``size_bytes`` on ``lane`` along ``path``."""

    path: Sequence[int]
    lane: int
    size_bytes: int


class ForwardRank(NamedTuple):
    """One DP-attention rank of a forward pass, per layer: an optional load, its attention, an optional store."""

    load: LayerTransfer | None = None
    attn_ns: int = 0
    store: LayerTransfer | None = None


class UnexpectedCompletionError(RuntimeError):
    """The core completed work whose tag the loop was never told about (see ``CoreWork.expect``)."""


def clear_faults(core: Core) -> None:
    """End every fault on ``core``'s ports (a run's end: what they hold back may then finish and be accounted)."""
    for port in range(core.port_count):
        if core.port_factor(port) != 1.0:
            core.set_port_factor(port, 1.0)
        core.set_port_latency(port, 0)


@dataclass(frozen=True)
class CoreLayout:
    """The names and ids of a core's ports and storage nodes, for a process without the core to name them."""

    ports: Mapping[str, int]
    storage_nodes: Mapping[str, int]

    def port_id(self, name: str) -> int:
        """The id of the port called ``name`` (a :class:`LookupError` naming the known ones if none)."""
        try:
            return self.ports[name]
        except KeyError:
            raise LookupError(f"the data plane has no port {name!r} (it has {len(self.ports)})") from None

    def storage_node_id(self, name: str) -> int:
        """The id of the storage node called ``name``."""
        try:
            return self.storage_nodes[name]
        except KeyError:
            raise LookupError(
                f"the data plane has no storage node {name!r} (it has {len(self.storage_nodes)})"
            ) from None


def core_layout(core: Core) -> CoreLayout:
    """The :class:`CoreLayout` of ``core``: every port and storage node, by name."""
    ports = {core.port_name(port): port for port in range(core.port_count)}
    nodes = {core.storage_node_name(node): node for node in range(core.storage_node_count)}
    return CoreLayout(ports, nodes)


def core_state(core: Core) -> dict[str, Any]:
    """A core's state now: ``clock_ns``, each port's counters and each storage node's queue, by name."""
    return {
        "clock_ns": core.clock_ns(),
        "ports": {core.port_name(p): core.port_counters(p) for p in range(core.port_count)},
        "storage": {core.storage_node_name(n): core.storage_queue(n) for n in range(core.storage_node_count)},
    }


class _Call(NamedTuple):
    """A waiter that is a callback (:meth:`CoreWork.call_when_done`), not a future."""

    done: Callable[[], None]
    failed: Callable[[Exception], None]


class CoreWork:
    """A data plane's side of the work on its loop; a flavour implements :meth:`_submit_batch` and :meth:`clock_ns`."""

    loop: asyncio.AbstractEventLoop  # The event loop the plane is bound to (:meth:`bind`).

    def __init__(self) -> None:
        self._next_tag = 1
        self._waiters: dict[int, asyncio.Future[Completion] | _Call] = {}
        self._pending_transfers: list[_Transfer] = []
        self._pending_forwards: list[_Forward] = []
        self._pending_ios: list[_Io] = []
        self._pending_timers: list[_Timer] = []
        self._pending_decode_nodes: list[_DecodeNode] = []
        self._pending_joins: list[_Join] = []
        self._decode_reports: dict[int, _Report] = {}
        """Decode node (its tag) -> what to call with ``(ended, spans)`` when some of its requests ended."""
        self._requested = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run this plane's futures and callbacks on ``loop`` (once, before any work is asked for)."""
        if getattr(self, "loop", None) is not None:
            raise RuntimeError("this data plane is already bound to a loop")
        self.loop = loop
        self._bound()

    def _bound(self) -> None:
        """Called once bound: a flavour registers its readers and timers with :attr:`loop` here."""

    def clock_ns(self) -> int:
        """The plane's clock in integer nanoseconds: the clock of the core the work runs on."""
        raise NotImplementedError

    async def run(self, main: Awaitable[_T]) -> _T:
        """Run ``main`` (the actors) inside what the plane sets up and tears down around them."""
        return await main

    def when_stop_requested(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` from the loop when another process says the run is complete."""

    async def finish(self, run_complete: bool) -> None:
        """The actors are done: submit what they still asked for (``run_complete``: the driver's process)."""
        self.flush()

    def report(self) -> dict[str, Any] | None:
        """The plane's side of the run, for the process's report (``None``: nothing to say)."""
        return None

    async def stats(self) -> dict[str, Any]:
        """The core's state now (:func:`core_state`), as the data-plane service reports it."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the plane holds (sockets, readers); the loop stays open."""

    def _work_requested(self) -> None:
        """Called once per batch, when the first request of a batch is queued."""

    def _queued(self) -> None:
        if not self._requested:
            self._requested = True
            self._work_requested()

    def new_tag(self) -> int:
        """A tag no other work of this loop uses (1, 2, 3, … in request order)."""
        tag = self._next_tag
        self._next_tag += 1
        return tag

    def expect(self, tag: int) -> asyncio.Future[Completion]:
        """A future resolved with the completion of ``tag``, for work submitted to the core directly."""
        if tag in self._waiters:
            raise ValueError(f"tag {tag} is already awaited")
        future: asyncio.Future[Completion] = self.loop.create_future()
        self._waiters[tag] = future
        return future

    def call_when_done(self, tag: int, done: Callable[[], None], failed: Callable[[Exception], None]) -> None:
        """Call ``done()`` from the loop when ``tag`` completes (``failed(error)`` if refused), without a future."""
        if tag in self._waiters:
            raise ValueError(f"tag {tag} is already awaited")
        self._waiters[tag] = _Call(done, failed)

    def transfer_then(
        self, path: Sequence[int], lane: int, size_bytes: int, done: Callable[[], None],
        failed: Callable[[Exception], None],
    ) -> None:  # fmt: skip
        """:meth:`transfer` with :meth:`call_when_done` instead of a future."""
        self.call_when_done(self._queue_transfer(path, lane, size_bytes, self.new_tag()), done, failed)

    def io_then(
        self, node: int, kind: str, lane: int, size_bytes: int, done: Callable[[], None],
        failed: Callable[[Exception], None], extents: Extents = (),
    ) -> None:  # fmt: skip
        """:meth:`io` with :meth:`call_when_done` instead of a future."""
        self.call_when_done(self._queue_io(node, kind, lane, size_bytes, self.new_tag(), extents), done, failed)

    def transfer(self, path: Sequence[int], lane: int, size_bytes: int) -> asyncio.Future[Completion]:
        """Start a transfer of ``size_bytes`` on ``lane`` along ``path`` now; the future resolves when it ends."""
        return self.expect(self._queue_transfer(path, lane, size_bytes, self.new_tag()))

    def transfer_detached(self, path: Sequence[int], lane: int, size_bytes: int) -> None:
        """Start a transfer nobody waits for (a write-back): counted, its end never reported."""
        self._queue_transfer(path, lane, size_bytes, UNREPORTED_TAG)

    def forward(
        self, n_layers: int, ranks: Iterable[_ForwardRankLike], *, ffn_ns: int = 0,
        collectives: Iterable[_LayerTransferLike] = (), load_window: int = 0,
    ) -> asyncio.Future[Completion]:  # fmt: skip
        """Start a forward pass of ``n_layers`` layers over the DP-attention ``ranks`` (:class:`ForwardRank`) now,
        with per layer ``ffn_ns`` of shared compute and the ``collectives`` (:class:`LayerTransfer`), loads at most
        ``load_window`` layers ahead (0: no limit); the rules are the core's (docs/architecture.md, "Forward
        passes"). The future resolves with its one ``"forward"`` completion (``size_bytes``: every byte moved)."""
        tag = self.new_tag()
        self._pending_forwards.append((n_layers, tuple(ranks), ffn_ns, tuple(collectives), load_window, tag))
        self._queued()
        return self.expect(tag)

    def io(self, node: int, kind: str, lane: int, size_bytes: int, extents: Extents = ()) -> asyncio.Future[Completion]:
        """Queue a storage ``"read"`` or ``"write"`` on node ``node`` now (``extents``: for real bytes)."""
        return self.expect(self._queue_io(node, kind, lane, size_bytes, self.new_tag(), extents))

    def io_detached(self, node: int, kind: str, lane: int, size_bytes: int, extents: Extents = ()) -> None:
        """Queue a storage I/O nobody waits for (see :meth:`transfer_detached`)."""
        self._queue_io(node, kind, lane, size_bytes, UNREPORTED_TAG, extents)

    def _queue_transfer(self, path: Sequence[int], lane: int, size_bytes: int, tag: int) -> int:
        self._pending_transfers.append((tuple(path), lane, size_bytes, tag))
        self._queued()
        return tag

    def _queue_io(self, node: int, kind: str, lane: int, size_bytes: int, tag: int, extents: Extents = ()) -> int:
        # The core moves no bytes: the extents are for a flavour that does (the host backend overrides this).
        self._pending_ios.append((node, kind, lane, size_bytes, tag))
        self._queued()
        return tag

    def decode_node(self, report: _Report, spec: Mapping[str, Any]) -> int:
        """Add a node's decode GPUs, stepped by the core; ``report(ended, spans)`` when some requests ended."""
        tag = self.new_tag()
        self._decode_reports[tag] = report
        self._pending_decode_nodes.append((tag, dict(spec)))
        self._queued()
        return tag

    def decode_join(
        self, node: int, gpu: int, rid: int, prompt: int, gen: int, produced: int, stored_blocks: int, context: int
    ) -> None:
        """Request ``rid`` joins GPU ``gpu`` of decode node ``node`` (a :meth:`decode_node` handle) now."""
        self._pending_joins.append((node, gpu, rid, prompt, gen, produced, stored_blocks, context))
        self._queued()

    def decode_bytes(self, node: int) -> dict[str, Any] | None:
        """What decode node ``node`` moved on its own (as of its last report where the core is remote)."""
        raise NotImplementedError

    def decode_reset(self, node: int) -> None:
        """An engine crash: decode node ``node`` drops every request after earlier work; the spans' report follows."""
        raise NotImplementedError

    def discard(self, extents: Extents) -> None:
        """Stored blocks no longer kept: nothing to drop where the core models the bytes (the host backend
        overrides this)."""

    def pool(self, node: int, op: str, extents: Extents) -> None:
        """A node's DRAM pool changed or serves a read: nothing to keep where the core models the bytes (the host
        backend overrides this)."""

    def set_port_factor(self, port: int, factor: float) -> None:
        """A fault: ``port``'s rates × ``factor`` from now on (in this process's core or the service's)."""
        raise NotImplementedError

    def set_port_latency(self, port: int, extra_ns: int) -> None:
        """A fault: ``extra_ns`` added to what starts crossing ``port`` from now on."""
        raise NotImplementedError

    def core_timer(self, at_ns: int) -> asyncio.Future[Completion]:
        """A timer in the core's event queue, completing at ``at_ns`` (a ``"timer"`` completion)."""
        tag = self.new_tag()
        self._pending_timers.append((at_ns, tag))
        self._queued()
        return self.expect(tag)

    def flush(self) -> None:
        """Submit the work requested so far (the loop does; call it before reading the core's state directly)."""
        self._requested = False
        transfers, forwards, ios, timers = (
            self._pending_transfers, self._pending_forwards, self._pending_ios, self._pending_timers
        )  # fmt: skip
        nodes, joins = self._pending_decode_nodes, self._pending_joins
        if transfers or forwards or ios or timers or nodes or joins:
            self._pending_transfers, self._pending_forwards, self._pending_ios, self._pending_timers = [], [], [], []
            self._pending_decode_nodes, self._pending_joins = [], []
            self._submit_batch(transfers, forwards, ios, timers, nodes, joins)

    def _submit_batch(
        self, transfers: list[_Transfer], forwards: list[_Forward], ios: list[_Io], timers: list[_Timer],
        decode_nodes: list[_DecodeNode], joins: list[_Join],
    ) -> None:  # fmt: skip
        """Submit one batch (lists may be empty; decode nodes before the joins naming them)."""
        raise NotImplementedError

    def _local_decoded(self, tag: int) -> None:
        """The core this loop drives says decode node ``tag`` has something to report."""
        raise UnexpectedCompletionError(f"a decode report of node {tag} from a core this loop does not drive")

    def _decoded(self, tag: int, ended: list[Any], spans: list[Any]) -> None:
        """Decode node ``tag`` reported: call its report from the loop."""
        self.loop.call_soon(self._decode_reports[tag], ended, spans)

    def _refused(self, tag: int, error: Exception) -> None:
        """The core refused ``tag``'s request: fail its future (a detached request's error is raised)."""
        if tag == UNREPORTED_TAG:
            raise error
        future = self._waiters.pop(tag, None)
        if isinstance(future, _Call):
            self.loop.call_soon(future.failed, error)
        elif future is not None and not future.done():
            future.set_exception(error)

    def _deliver(self, completions: list[_RawCompletion]) -> None:
        unknown: list[int] = []
        call_soon = self.loop.call_soon
        for raw in completions:
            future = self._waiters.pop(raw[1], None)
            if future is None:
                if raw[0] == "decoded" and raw[1] in self._decode_reports:
                    self._local_decoded(raw[1])
                    continue
                unknown.append(raw[1])
            elif isinstance(future, _Call):  # where the future's done callback would have been scheduled
                call_soon(future.done)
            elif not future.done():  # a waiter may have given up (cancelled, e.g. by wait_for)
                future.set_result(tuple.__new__(Completion, raw))  # Completion._make, without its frame
        if unknown:
            raise UnexpectedCompletionError(
                f"the core completed work with tags {unknown} at {self.clock_ns()} ns that nobody awaits; "
                "submit through the loop or register the tag with expect()"
            )


class LocalCoreWork(CoreWork):
    """Core work on a :class:`~dualpath_emu._core.Core` in this process: one core call per kind."""

    def __init__(self, core: Core) -> None:
        super().__init__()
        self._core = core
        self._decode_ids: dict[int, int] = {}  # Decode node handle (tag) -> its id in the core.

    @property
    def core(self) -> Core:
        """The core this plane drives."""
        return self._core

    def clock_ns(self) -> int:
        """The plane's clock in integer nanoseconds (the core's clock)."""
        return self._core.clock_ns()

    def set_port_factor(self, port: int, factor: float) -> None:
        self.flush()  # what was asked for before the fault starts before it
        self._core.set_port_factor(port, factor)

    def set_port_latency(self, port: int, extra_ns: int) -> None:
        self.flush()
        self._core.set_port_latency(port, extra_ns)

    def _submit_batch(
        self, transfers: list[_Transfer], forwards: list[_Forward], ios: list[_Io], timers: list[_Timer],
        decode_nodes: list[_DecodeNode], joins: list[_Join],
    ) -> None:  # fmt: skip
        core = self._core
        submit_batch(core, transfers, forwards, ios, timers, [], self._refused)
        for tag, spec in decode_nodes:  # a node the core refuses is the run's error: its joins could go nowhere
            self._decode_ids[tag] = core.add_decode_node(report_tag=tag, **spec)
        if joins:  # after the nodes they name (a join the core refuses is the run's error)
            ids = self._decode_ids
            submit_batch(core, [], [], [], [], [(ids[j[0]], *j[1:]) for j in joins], self._refused)

    def _local_decoded(self, tag: int) -> None:
        self._decoded(tag, *self._core.take_decoded(self._decode_ids[tag]))

    async def stats(self) -> dict[str, Any]:
        return core_state(self._core)

    def decode_bytes(self, node: int) -> dict[str, Any] | None:
        """What decode node ``node`` moved on its own so far (``Core.decode_bytes``)."""
        node_id = self._decode_ids.get(node)
        return None if node_id is None else self._core.decode_bytes(node_id)

    def decode_reset(self, node: int) -> None:
        self.flush()  # what was asked for before the crash (the node itself, its joins) happens before it
        node_id = self._decode_ids.get(node)
        if node_id is None:
            raise LookupError(f"decode_reset: decode node {node} was never added through this data plane")
        self._core.decode_reset(node_id)
        completions = self._core.take_completions()  # the report of the spans it closed: due now, not later
        if completions:
            self._deliver(completions)
