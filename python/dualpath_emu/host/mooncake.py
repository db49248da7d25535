"""KV bytes through Mooncake's Transfer Engine (``[host] transfer_engine = "mooncake"``; issue 16).

The byte channel's chunks go as one-sided writes of the Transfer Engine (``transfer_sync_write``, over its
TCP transport: its RDMA transport needs the NICs' device names, which this does not take yet) into a receive region the
peer registered; the channel's ZeroMQ socket then carries only each chunk's header (which job, where in the
region, how long), and the receiver checks the bytes in its region against the job's pattern as for a chunk
that came inline. So the actors, the pacing and the checks are the same as with the default channel; only
the bytes take the transfer engine.

Each process registers one receive region of :data:`SLOTS` × :data:`SLOT_BYTES`, a slot per sending peer
(assigned in a handshake over the channel: ``mc-hello``), written as a ring; and one send region holding the
byte pattern chunks are cut from.

**Not secure by default**: the Transfer Engine's TCP transport and its handshake listen on every interface
with no authentication, and any peer that reaches them can write into the registered regions. Use it on a
cluster's private fabric; the default channel (ZeroMQ, CURVE over tcp, private ipc on one host) is the one
for anything else.
"""

from __future__ import annotations

from typing import Any, Final

from dualpath_emu.errors import BackendUnavailable
from dualpath_emu.host.transport import PATTERN_BYTES, pattern_region

__all__ = ["SLOTS", "SLOT_BYTES", "MooncakeUnavailable", "MooncakeWire", "check_available"]

SLOTS: Final = 8
"""Sending peers a process can receive from."""
SLOT_BYTES: Final = 8 << 20
"""The ring each sending peer writes its chunks into (a chunk is checked long before the ring comes round)."""


class MooncakeUnavailable(BackendUnavailable):
    """The Transfer Engine cannot be used here (not installed, or its native libraries are missing)."""


def check_available() -> None:
    """Raise :class:`MooncakeUnavailable` (saying what to install) unless the Transfer Engine loads here."""
    try:
        import mooncake.engine  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: F401
    except ImportError as error:
        raise MooncakeUnavailable(_missing(error)) from None


def _missing(error: ImportError) -> str:
    return (f"Mooncake's Transfer Engine is not usable here ({error}); install mooncake-transfer-engine-non-cuda "
            "and Debian's libibverbs1 (make does both), or use the default transfer engine, \"zmq\"")


class MooncakeWire:
    """This process's Transfer Engine: its receive region and the send region with the pattern."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        try:
            from mooncake.engine import TransferEngine  # type: ignore[import-not-found,unused-ignore]
        except ImportError as error:
            raise MooncakeUnavailable(_missing(error)) from None
        self.engine: Any = TransferEngine()
        status = self.engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
        if status != 0:
            raise MooncakeUnavailable(f"Mooncake's Transfer Engine did not start on {host} (status {status})")
        self.host = host
        self.region_bytes = SLOTS * SLOT_BYTES
        self.receive = int(self.engine.allocate_managed_buffer(self.region_bytes))
        self.send = int(self.engine.allocate_managed_buffer(2 * PATTERN_BYTES))
        if not self.receive or not self.send:
            raise MooncakeUnavailable("Mooncake's Transfer Engine could not register its buffers")
        self.engine.write_bytes_to_buffer(self.send, pattern_region(), 2 * PATTERN_BYTES)

    @property
    def endpoint(self) -> str:
        """Where peers reach this engine (``host:port``)."""
        return f"{self.host}:{self.engine.get_rpc_port()}"

    def write(self, target: str, remote: int, pattern_offset: int, nbytes: int) -> None:
        """Write ``nbytes`` of the pattern (from ``pattern_offset``) to address ``remote`` of engine ``target``
        (blocks: run it off the event loop)."""
        status = self.engine.transfer_sync_write(target, self.send + pattern_offset, remote, nbytes)
        if status != 0:
            raise ConnectionError(f"Mooncake transfer of {nbytes} B to {target} failed (status {status})")

    def received(self, offset: int, nbytes: int) -> bytes:
        """The bytes at ``offset`` of this process's receive region."""
        data: bytes = self.engine.read_bytes_from_buffer(self.receive + offset, nbytes)
        return data

    def close(self) -> None:
        for address in (self.receive, self.send):
            if address:
                self.engine.free_managed_buffer(address, self.region_bytes if address == self.receive
                                                else 2 * PATTERN_BYTES)  # fmt: skip
        self.receive = self.send = 0
