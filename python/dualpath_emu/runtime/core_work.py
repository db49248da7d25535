"""Work on the core as asyncio futures, shared by the virtual-time and the real-time loop (issue 3).

Actors move bytes by asking their loop: :meth:`CoreWork.transfer`, :meth:`~CoreWork.forward`,
:meth:`~CoreWork.io` and :meth:`~CoreWork.core_timer` return futures resolved with the :class:`Completion`.
Requests are batched and submitted in one ``submit_transfers``, one ``submit_forwards``, one ``submit_ios``
and one ``add_timers`` call (in that order): the virtual-time loop submits when it is next idle, the
real-time loop at its next iteration. So the FFI boundary is crossed per batch, not per request, and one
actor code base runs on either loop. A forward pass (all its layers' loads, attention, shared phase,
collectives and stores) is one request: the core expands it into its own events (DESIGN.md §4).

Tags come from a per-loop counter. Work submitted to the core by other code must take its tag from
:meth:`~CoreWork.new_tag` and register it with :meth:`~CoreWork.expect`; a completion with a tag the loop
does not know is an error (:class:`UnexpectedCompletionError`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, TypeAlias, TypeVar

from dualpath_emu._core import UNREPORTED_TAG, Core

__all__ = ["Completion", "CoreWork", "ForwardRank", "LayerTransfer", "UnexpectedCompletionError"]

_T = TypeVar("_T")

# ``(path, lane, size_bytes)``, e.g. a :class:`LayerTransfer`.
_LayerTransferLike: TypeAlias = tuple[Sequence[int], int, int]
# ``(load, attn_ns, store)``, e.g. a :class:`ForwardRank`.
_ForwardRankLike: TypeAlias = tuple[_LayerTransferLike | None, int, _LayerTransferLike | None]
_Forward: TypeAlias = tuple[int, tuple[_ForwardRankLike, ...], int, tuple[_LayerTransferLike, ...], int, int]


class Completion(NamedTuple):
    """What the core reports when work ends: ``(kind, tag, start_ns, end_ns, size_bytes, lane)``.

    ``kind`` is ``"transfer"``, ``"read"``, ``"write"``, ``"timer"`` or ``"forward"``. A plain tuple
    compares equal.
    """

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
    """One DP-attention rank (GPU) of a forward pass, per layer: an optional load before its attention
    (e.g. hit KV into HBM over its CNIC), the attention time, and an optional store after it (e.g. the
    layer's KV to the decode engine)."""

    load: LayerTransfer | None = None
    attn_ns: int = 0
    store: LayerTransfer | None = None


class UnexpectedCompletionError(RuntimeError):
    """The core completed work whose tag the loop was never told about (see ``CoreWork.expect``)."""


class CoreWork:
    """The loop's side of a core: tags, pending requests, waiters. Mixed into an asyncio event loop.

    Subclasses call :meth:`_init_core_work` in ``__init__`` and :meth:`_deliver` with what the core
    completed; :meth:`_work_requested` is called when a request is queued into an empty batch.
    """

    _core: Core

    def _init_core_work(self, core: Core) -> None:
        self._core = core
        self._next_tag = 1
        self._waiters: dict[int, asyncio.Future[Completion]] = {}
        self._pending_transfers: list[tuple[Sequence[int], int, int, int]] = []
        self._pending_forwards: list[_Forward] = []
        self._pending_ios: list[tuple[int, str, int, int, int]] = []
        self._pending_timers: list[tuple[int, int]] = []
        self._requested = False

    @property
    def core(self) -> Core:
        """The core this loop drives."""
        return self._core

    def clock_ns(self) -> int:
        """The loop's clock in integer nanoseconds (the core's clock)."""
        return self._core.clock_ns()

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
        loop: asyncio.AbstractEventLoop = self  # type: ignore[assignment]  # mixed into an event loop
        future: asyncio.Future[Completion] = loop.create_future()
        self._waiters[tag] = future
        return future

    def transfer(self, path: Sequence[int], lane: int, size_bytes: int) -> asyncio.Future[Completion]:
        """Start a transfer of ``size_bytes`` on ``lane`` along ``path`` (port ids) now.

        The future resolves with its completion, or fails with the core's error for a bad argument.
        Cancelling the future does not stop the transfer: the core has no cancellation.
        """
        tag = self.new_tag()
        self._pending_transfers.append((tuple(path), lane, size_bytes, tag))
        self._queued()
        return self.expect(tag)

    def transfer_detached(self, path: Sequence[int], lane: int, size_bytes: int) -> None:
        """Start a transfer nobody waits for (a write-back, say): it moves its bytes and is counted like any
        other, but its end is never reported, so the loop does not wake up for it. A bad argument fails
        the run's next flush (the core refuses it)."""
        self._pending_transfers.append((tuple(path), lane, size_bytes, UNREPORTED_TAG))
        self._queued()

    def forward(
        self,
        n_layers: int,
        ranks: Iterable[_ForwardRankLike],
        *,
        ffn_ns: int = 0,
        collectives: Iterable[_LayerTransferLike] = (),
        load_window: int = 0,
    ) -> asyncio.Future[Completion]:
        """Start a forward pass of ``n_layers`` layers over the DP-attention ``ranks`` (:class:`ForwardRank`)
        now; the future resolves with its one ``"forward"`` completion (``size_bytes``: every byte it moved).

        Per layer, each rank's attention waits for its load of that layer and for the previous layer to
        finish; the shared phase (``ffn_ns`` of compute and the ``collectives``, :class:`LayerTransfer`)
        starts when every rank's attention is done, and ends the layer; each rank's store follows its
        attention, one at a time. Loads stream back to back, at most ``load_window`` layers ahead of the
        layer being finished (0: no limit). The exact rules are in the core (``core/src/forward.rs``).
        ``ranks`` and ``collectives`` are copied (shallowly) now and read when the batch is submitted.
        """
        tag = self.new_tag()
        self._pending_forwards.append((n_layers, tuple(ranks), ffn_ns, tuple(collectives), load_window, tag))
        self._queued()
        return self.expect(tag)

    def io(self, node: int, kind: str, lane: int, size_bytes: int) -> asyncio.Future[Completion]:
        """Queue a storage I/O (``kind`` ``"read"`` or ``"write"``) on storage node ``node`` now."""
        tag = self.new_tag()
        self._pending_ios.append((node, kind, lane, size_bytes, tag))
        self._queued()
        return self.expect(tag)

    def io_detached(self, node: int, kind: str, lane: int, size_bytes: int) -> None:
        """Queue a storage I/O nobody waits for (see :meth:`transfer_detached`)."""
        self._pending_ios.append((node, kind, lane, size_bytes, UNREPORTED_TAG))
        self._queued()

    def core_timer(self, at_ns: int) -> asyncio.Future[Completion]:
        """A timer in the core's event queue, completing at ``at_ns`` (a ``"timer"`` completion)."""
        tag = self.new_tag()
        self._pending_timers.append((at_ns, tag))
        self._queued()
        return self.expect(tag)

    def flush(self) -> None:
        """Submit the work requested so far (the loop does this itself; call it before reading the core's
        state directly, e.g. ``in_flight`` or ``storage_queue``)."""
        self._requested = False
        if self._pending_transfers:
            transfers, self._pending_transfers = self._pending_transfers, []
            self._submit(self._core.submit_transfers, transfers, lambda t: t[3])
        if self._pending_forwards:
            forwards, self._pending_forwards = self._pending_forwards, []
            self._submit(self._core.submit_forwards, forwards, lambda f: f[5])
        if self._pending_ios:
            ios, self._pending_ios = self._pending_ios, []
            self._submit(self._core.submit_ios, ios, lambda t: t[4])
        if self._pending_timers:
            timers, self._pending_timers = self._pending_timers, []
            self._submit(self._core.add_timers, timers, lambda t: t[1])

    def _submit(self, submit: Callable[[list[_T]], int], batch: list[_T], tag_of: Callable[[_T], int]) -> None:
        try:
            submit(batch)
        except Exception:
            # The core checks a whole batch before accepting any of it, so nothing was submitted: retry one
            # at a time and give each bad request's error to its own future.
            for item in batch:
                try:
                    submit([item])
                except Exception as error:
                    tag = tag_of(item)
                    if tag == UNREPORTED_TAG:
                        raise  # detached: nobody to tell but the run
                    future = self._waiters.pop(tag)
                    if not future.done():
                        future.set_exception(error)

    def _deliver(self, completions: list[tuple[str, int, int, int, int, int]]) -> None:
        unknown: list[int] = []
        for raw in completions:
            future = self._waiters.pop(raw[1], None)
            if future is None:
                unknown.append(raw[1])
            elif not future.done():  # a waiter may have given up (cancelled, e.g. by wait_for)
                future.set_result(Completion._make(raw))
        if unknown:
            raise UnexpectedCompletionError(
                f"the core completed work with tags {unknown} at {self._core.now_ns} ns that nobody awaits; "
                "submit through the loop or register the tag with expect()"
            )
