"""The stepping of one node's decode GPUs: continuous batches, stepped as their EP group steps, and the
persistence of every completed Full Block (§4) -- the mechanics under a decode group
(:mod:`~dualpath_emu.cluster.decode`), which makes the decisions around them.

The data plane's core steps them (``core/src/decode.rs``, through ``DataPlane.decode_node``; every plane has
one: the in-process core, a one-process live run's, the data-plane service's, each host process's). The GPUs
that step together -- a node's DE GPUs for an MoE model (DP attention and expert parallelism), each GPU alone
for a dense model -- form a *step group*, stepped as one event per *segment* (the step priced from every GPU's
batch when one changes, ``Roofline.decode_pricing``), so a request costs a few events however many tokens it
generates. The core starts the block write-backs and the all-to-all itself and reports only what a decision
needs to a :class:`DecodeListener` (the decode group): a request has all its tokens
(:meth:`~DecodeListener.decoded`), a segment's end is accounted (:meth:`~DecodeListener.stepped`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.ledger import Booking, Ledger
from dualpath_emu.cluster.topology import KV_LANE, MODEL_LANE

__all__ = ["DecodeListener", "DecodeSteps", "DecodingRequest"]


class DecodeListener(Protocol):
    """What :class:`DecodeSteps` tells its decode group."""

    def decoded(self, now: int, request: DecodingRequest) -> None:
        """``request`` has all its tokens (its ``second_token_ns`` is set, if it had a second)."""

    def stepped(self, now: int) -> None:
        """A segment's end was accounted: what ended in it has been told to :meth:`decoded`."""


@dataclass(eq=False, slots=True)
class DecodingRequest:
    """A request on a DE GPU: its prompt KV is in HBM; it decodes until it has ``gen`` tokens."""

    rid: int
    prompt: int
    gen: int
    gpu: int
    stored_blocks: int
    """Full Blocks of this request's KV in storage (the hit's at first)."""
    context: int
    """The token stream its KV extends (see :class:`~dualpath_emu.cluster.messages.Turn`)."""
    produced: int = 1
    """Tokens out when it joins its GPU's batch: the first came from the prefill."""
    first_token_ns: int = -1
    """When the prefill produced its first token (from :class:`KvReady`)."""
    second_token_ns: int = -1
    """When its first decode step produced its second token (-1 until then)."""


def _write_back(
    plane: Ledger, node: int, d2h_path: tuple[int, ...], kv_bytes_per_token: int, written: list[tuple[int, int, int]]
) -> None:
    """Write back completed Full Blocks (``written``: which, as ``(context, first block, blocks)``): HBM → DRAM
    through the GPU's CNIC, then DRAM → SNIC → storage (§4), once for all of them."""
    size = sum(blocks for _, _, blocks in written) * BLOCK_TOKENS * kv_bytes_per_token
    plane.transfer(d2h_path, KV_LANE, size)
    plane.io(node, "write", KV_LANE, size, tuple(written))


def _end_at_once(
    now: int, request: DecodingRequest, persist: Callable[[int, list[tuple[int, int, int]]], None],
    listener: DecodeListener,
) -> None:  # fmt: skip
    """A request whose one token came from the prefill takes no step: its prompt's last Full Blocks are written
    back and it ends."""
    full = (request.prompt + request.produced) // BLOCK_TOKENS
    if full > request.stored_blocks:
        persist(request.gpu, [(request.context, request.stored_blocks, full - request.stored_blocks)])
    request.stored_blocks = full
    listener.decoded(now, request)


class DecodeSteps:
    """The decode GPUs of node ``node`` (``gpus`` of them, stepping together if ``together``), run by the data
    plane's core (see the module): a request joins there, the core steps, writes back (unless ``storage`` is
    None: the Oracle reads nothing back) and charges the all-to-all itself (``a2a_bytes_per_token`` over
    ``a2a_paths[gpu]``), and reports only the requests that ended, with their GPUs' busy spans (to
    ``busy_span(gpu unit, start, end, batch size, step)``). The bytes it moved on its own are booked in
    ``booking`` when the run's byte check asks."""

    def __init__(
        self,
        node: int,
        gpus: int,
        *,
        pricing: dict[str, float | int | bool | None],
        together: bool,
        kv_bytes_per_token: int,
        a2a_bytes_per_token: float,
        a2a_paths: Sequence[tuple[int, ...]],
        d2h_paths: Sequence[tuple[int, ...]],
        storage: tuple[int, tuple[int, ...]] | None,
        plane: Ledger,
        booking: Booking,
        listener: DecodeListener,
        busy_span: Callable[[int, int, int, int, int], None],
    ) -> None:
        self.node = node
        self._kv = kv_bytes_per_token
        self._d2h_paths = list(d2h_paths)
        self._a2a_paths = list(a2a_paths)
        self._storage = storage
        self.plane = plane
        self._listener = listener
        self._busy_span = busy_span
        self._requests: dict[int, DecodingRequest] = {}
        self._booked: dict[str, Any] = {"d2h": [(0, 0)] * gpus, "a2a": [(0, 0)] * gpus, "written": (0, 0)}
        """What :meth:`_book` booked so far: ``Core.decode_bytes`` as it was then."""
        self._id = plane.decode_node(
            self._report, gpus=gpus, together=together, pricing=pricing, kv_bytes_per_token=kv_bytes_per_token,
            a2a_bytes_per_token=a2a_bytes_per_token, a2a_paths=self._a2a_paths, a2a_lane=MODEL_LANE,
            d2h_paths=self._d2h_paths, storage_node=storage[0] if storage is not None else None, kv_lane=KV_LANE,
            first_unit=node * gpus,
        )  # fmt: skip
        booking.add_source(self._book)

    def join(self, now: int, request: DecodingRequest) -> None:
        """``request``'s prompt KV is in its GPU's HBM: it joins its GPU's batch at its group's next step
        boundary (at once if the group is idle); a request whose one token came from the prefill ends now."""
        if request.produced >= request.gen:
            _end_at_once(now, request, self._persist, self._listener)
            return
        self._requests[request.rid] = request
        self.plane.decode_join(self._id, request.gpu, request.rid, request.prompt, request.gen, request.produced,
                               request.stored_blocks, request.context)  # fmt: skip

    def reset(self, now: int) -> int:
        """The node's engine crashed (its HBM is lost, it restarts empty): every request is dropped without a
        word to the listener, in the plane's core (``DataPlane.decode_reset``, after what was asked for
        before; the busy spans it closes come with the node's next report). Returns the number of requests
        dropped: those joined and not reported ended."""
        self.plane.decode_reset(self._id)
        dropped = len(self._requests)
        self._requests.clear()
        return dropped

    def _report(self, now: int, ended: list[tuple[int, int]], spans: list[tuple[int, int, int, int, int]]) -> None:
        for span in spans:
            self._busy_span(*span)
        listener, requests = self._listener, self._requests
        for rid, second_token_ns in ended:
            request = requests.pop(rid, None)
            if request is None:
                continue  # it ended before a reset, which dropped it: its engine never heard of it
            request.second_token_ns = second_token_ns
            listener.decoded(now, request)
        listener.stepped(now)

    def _persist(self, gpu: int, written: list[tuple[int, int, int]]) -> None:
        if written and self._storage is not None:
            _write_back(self.plane, self.node, self._d2h_paths[gpu], self._kv, written)

    def _book(self, booking: Booking) -> None:
        """Book what the core moved on its own since the last time."""
        moved, last = self.plane.decode_bytes(self._id), self._booked
        if moved is None:
            return  # nothing known yet
        for kind, paths, lane in (("d2h", self._d2h_paths, KV_LANE), ("a2a", self._a2a_paths, MODEL_LANE)):
            for path, (size, count), (old_size, old_count) in zip(paths, moved[kind], last[kind], strict=True):
                if count > old_count:
                    booking.book(path, lane, size - old_size, count - old_count)
        (size, count), (old_size, old_count) = moved["written"], last["written"]
        if count > old_count and self._storage is not None:
            booking.book(self._storage[1], KV_LANE, size - old_size, count - old_count)
        self._booked = moved
