"""Live Prometheus metrics of a live cluster run (``--metrics-port P``; the metrics: docs/live.md), served by
the client's process on ``127.0.0.1:P`` (``prometheus-client``'s HTTP server, a thread) from a registry of its
own. Turns and their latencies are counted as the client observes them (:meth:`LiveMetrics.watch`); the ports and read queues come from
the data plane, asked once per poll (a port's utilisation: its bytes over the poll's interval / (its rate ×
the interval), in emulated time)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from dualpath_emu.cluster.observations import Arrival, Completion
from dualpath_emu.errors import UsageError
from dualpath_emu.runtime.engine import Watch

__all__ = ["LiveMetrics"]

TTFT_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0)
TPOT_BUCKETS: Final = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.5, 1.0)


class LiveMetrics:
    """The metrics and their HTTP endpoint (see the module)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.admitted = Counter("dualpath_turns_admitted", "Turns the client submitted", registry=r)
        self.done = Counter("dualpath_turns_done", "Turns whose last token is out", registry=r)
        self.ttft = Histogram(
            "dualpath_ttft_seconds", "First token - arrival (emulated s)", buckets=TTFT_BUCKETS, registry=r
        )
        self.tpot = Histogram("dualpath_tpot_seconds", "Time per output token after the second (emulated s)",
                              buckets=TPOT_BUCKETS, registry=r)  # fmt: skip
        self.clock = Gauge("dualpath_emulated_seconds", "The run's clock (emulated s)", registry=r)
        self.port_utilisation = Gauge(
            "dualpath_port_utilisation", "Port busy fraction over the last poll", ["port"], registry=r
        )
        self.read_queue = Gauge(
            "dualpath_read_queue_bytes", "Bytes waiting in a node's storage read queue", ["node"], registry=r
        )
        self._open: dict[int, tuple[int, int]] = {}
        """Per turn admitted and not ended, its arrival time and tokens to generate (for its TTFT and TPOT)."""
        self._last: tuple[int, list[float]] | None = None
        self._server: object | None = None
        self.port: int | None = None

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint (``port`` 0: a free one); returns the port it listens on."""
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            raise UsageError(
                f"--metrics-port {port}: cannot listen on {host}:{port}: {error.strerror or error}"
            ) from None
        self._server = server
        self.port = int(server.server_port)
        return self.port

    def close(self) -> None:
        server = self._server
        if server is not None:
            self._server = None
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]

    def watch(self) -> Watch:
        """The client's observations these metrics follow: each turn admitted and ended."""
        return Watch({Arrival: self._admitted, Completion: self._done})

    def _admitted(self, now_ns: int, record: Arrival) -> None:
        self.admitted.inc()
        self._open[record.rid] = (now_ns, record.gen)

    def _done(self, now_ns: int, record: Completion) -> None:
        arrive_ns, gen = self._open.pop(record.rid)
        self.done.inc()
        if record.first_ns >= 0:
            self.ttft.observe((record.first_ns - arrive_ns) / 1e9)
        if record.second_ns >= 0 and gen > 2:
            self.tpot.observe((record.done_ns - record.second_ns) / (gen - 2) / 1e9)

    def data_plane(
        self, now_ns: int, ports: Sequence[tuple[str, float, float]], read_queues: Sequence[tuple[str, int]]
    ) -> None:
        """The data plane at ``now_ns``: per port ``(name, rate, bytes moved)``, per node its read queue's bytes."""
        self.clock.set(now_ns / 1e9)
        moved = [total for _, _, total in ports]
        if self._last is not None:
            then_ns, before = self._last
            span_s = (now_ns - then_ns) / 1e9
            if span_s > 0 and len(before) == len(moved):
                for (name, rate, _), now_bytes, then_bytes in zip(ports, moved, before):
                    busy = (now_bytes - then_bytes) / (rate * span_s) if rate > 0 else 0.0
                    self.port_utilisation.labels(port=name).set(min(1.0, max(0.0, busy)))
        self._last = (now_ns, moved)
        for node, queued in read_queues:
            self.read_queue.labels(node=node).set(queued)
