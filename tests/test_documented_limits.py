"""The frame and queue limits the docs state are the code's (issue 26: the data plane's were not the README's).

Each number is formatted from its constant and looked for in its sentence, so a constant that changes
without its docs fails here."""

from __future__ import annotations

import re
from pathlib import Path

from dualpath_emu import messages
from dualpath_emu.runtime import zmq_transport
from dualpath_emu.runtime.dataplane import protocol

DOCS = Path(__file__).resolve().parents[1] / "docs"


def text(name: str) -> str:
    """A page with its lines joined (sentences wrap)."""
    return re.sub(r"\s+", " ", (DOCS / name).read_text(encoding="utf-8"))


def count(n: int) -> str:
    return f"{n:,}"


def mib(n: int) -> str:
    assert n % (1 << 20) == 0, n
    return f"{n >> 20} MiB"


def test_the_live_guide_states_the_actor_transports_and_the_data_planes_limits() -> None:
    live = text("live.md")
    actors = (
        f"Between actors: {count(zmq_transport.HWM)} messages queued per connection, frames of at most "
        f"{mib(messages.DEFAULT_MAX_FRAME_BYTES)} (a longer one drops its connection), and beyond ZeroMQ's queue "
        f"at most {count(zmq_transport.BACKLOG_MESSAGES)} messages or {mib(zmq_transport.BACKLOG_BYTES)} per "
        "connection"
    )
    plane = (
        f"On the data plane's sockets, whose messages are batches: {count(protocol.HWM)} messages queued per "
        f"peer, frames of at most {mib(protocol.MAX_FRAME_BYTES)} (a longer one drops its connection), at most "
        f"{count(protocol.MAX_REQUESTS_PER_MESSAGE)} requests of a kind in one message (larger batches are "
        f"split), and beyond ZeroMQ's queue at most {count(protocol.BACKLOG_MESSAGES)} messages or "
        f"{mib(protocol.BACKLOG_BYTES)}"
    )
    assert actors in live and plane in live
    assert zmq_transport.REJECTIONS_LOGGED == protocol.REJECTIONS_LOGGED
    assert f"only the first {protocol.REJECTIONS_LOGGED} logged" in live


def test_the_architecture_page_states_the_same_limits() -> None:
    page = text("architecture.md")
    assert (
        f"Queues are bounded ({count(zmq_transport.HWM)} messages per connection, and beyond them at most "
        f"{count(zmq_transport.BACKLOG_MESSAGES)} messages or {mib(zmq_transport.BACKLOG_BYTES)};"
    ) in page
    assert f"frames at most {mib(messages.DEFAULT_MAX_FRAME_BYTES)}" in page
    assert f"msgpack frames, version {protocol.PROTOCOL_VERSION};" in page
    assert (
        f"Its sockets queue {count(protocol.HWM)} messages per peer and take frames of at most "
        f"{mib(protocol.MAX_FRAME_BYTES)} with at most {count(protocol.MAX_REQUESTS_PER_MESSAGE)} requests of "
        f"a kind (larger batches are split); beyond ZeroMQ's queue a process holds at most "
        f"{count(protocol.BACKLOG_MESSAGES)} messages or {mib(protocol.BACKLOG_BYTES)}"
    ) in page


def test_the_codecs_docstring_states_its_frame_limit() -> None:
    assert f"(default {mib(messages.DEFAULT_MAX_FRAME_BYTES)})" in re.sub(r"\s+", " ", messages.__doc__ or "")
