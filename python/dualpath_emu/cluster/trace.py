"""The Perfetto trace of one cluster run (``trace-<system>.json.gz`` of ``dualpath-emu run --out``; open it at
ui.perfetto.dev): a Trace Event Format object with a process per node, one for the storage cluster and one for
the requests.

* **node** ``n<i> (prefill|decode)``: a thread per GPU whose slices are what it was busy with (``prefill pass``,
  or ``decode`` at one batch size); per port a counter track of its utilisation per virtual lane; every
  transfer that leaves the node and every storage I/O, as an async slice named by its path.
* **storage (3fs)**: the utilisation of the storage cluster's own ports, and per bounded KV tier (the store, the
  DRAM pool) a counter of what it held, the most per sample interval.
* **requests**: per request async slices for its phases: ``request``, ``waiting``, ``read KV``, ``prefill``,
  ``hand-off`` (first → second token) and ``decode``.

Async slices (``b``/``e``, each with an id of its own) are used wherever slices overlap: Perfetto stacks them,
while slices on a thread must nest."""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from dualpath_emu._core import Core
from dualpath_emu.cluster.config import ClusterConfig
from dualpath_emu.cluster.metrics import READ_SIDES, Metrics
from dualpath_emu.cluster.topology import Topology

__all__ = ["REQUESTS_PID", "STORAGE_PID", "node_pid", "port_pids", "trace_events", "write_trace"]

REQUESTS_PID: Final = 1
STORAGE_PID: Final = 2


def node_pid(node: int) -> int:
    """The process of node ``node``'s tracks."""
    return 3 + node


def port_pids(topology: Topology, port_count: int) -> list[int]:
    """The process of each port (by port id): its node's, or the storage cluster's."""
    pids = [STORAGE_PID] * port_count
    for n in topology.nodes:
        for port in (n.snic_rx, n.snic_tx, n.dram, *n.cnic_tx, *n.cnic_rx):
            pids[port] = node_pid(n.index)
    return pids


def _us(t_ns: int) -> float:
    """Nanoseconds as the format's microseconds plus half a ns, so back-to-back slices never overlap."""
    return (t_ns + 0.5) / 1e3


def trace_events(config: ClusterConfig, topology: Topology, metrics: Metrics, system: str,
                 faults: Sequence[Mapping[str, Any]] = (), end_ns: int = 0) -> Iterator[str]:  # fmt: skip
    """The run's own events: names, the GPUs' busy slices, the requests and the faults (JSON texts)."""

    def event(**fields: Any) -> str:
        return json.dumps(fields, separators=(",", ":"))

    processes = [(REQUESTS_PID, f"requests ({system})"), (STORAGE_PID, "storage (3fs)")]
    processes += [
        (node_pid(n.index), f"n{n.index} ({'prefill' if n.role == 'pe' else 'decode'})") for n in topology.nodes
    ]
    for pid, name in processes:
        yield event(name="process_name", ph="M", pid=pid, args={"name": name})
        yield event(name="process_sort_index", ph="M", pid=pid, args={"sort_index": pid})
    gpus = config.node.gpus
    for n in topology.nodes:
        for g in range(gpus):
            yield event(name="thread_name", ph="M", pid=node_pid(n.index), tid=g + 1, args={"name": f"gpu{g}"})
    for busy in metrics.gpu_busy.values():
        for unit, start, end, what, args in busy.spans or ():
            yield event(name=what, ph="X", pid=node_pid(unit // gpus), tid=unit % gpus + 1, ts=_us(start),
                        dur=_us(end - start), args=dict(args))  # fmt: skip
    if faults:
        yield event(name="thread_name", ph="M", pid=REQUESTS_PID, tid=1, args={"name": "faults"})
    for f in faults:
        start = round(f["start_s"] * 1e9)
        end = end_ns if f["end_s"] is None else round(f["end_s"] * 1e9)
        yield event(name=f"{f['kind']} {f['target']}", ph="X", pid=REQUESTS_PID, tid=1, ts=_us(start),
                    dur=_us(max(0, end - start)), args={"kind": f["kind"], "target": f["target"]})  # fmt: skip
    for tier, stats in sorted(metrics.kv.items()):  # a counter track per bounded KV tier: what it held
        step_ns, last = stats.interval_ns, -1
        for k, blocks in enumerate(stats.fill):
            if blocks != last:
                yield event(name=f"kv {tier} held (GB)", ph="C", pid=STORAGE_PID, ts=_us(k * step_ns),
                            args={"GB": round(blocks * stats.block_bytes / 1e9, 3)})  # fmt: skip
                last = blocks
    yield from _requests(metrics, event)


def _requests(metrics: Metrics, event: Any) -> Iterator[str]:
    m = metrics
    for rid in range(len(m)):
        arrive, done = m.arrive_ns[rid], m.done_ns[rid]
        start, first, second = m.prefill_start_ns[rid], m.first_token_ns[rid], m.second_token_ns[rid]
        on_de = m.read_on_de[rid]
        args = {"rid": rid, "agent": m.agent[rid], "prompt": m.prompt[rid], "hit": m.hit[rid], "gen": m.gen[rid],
                "pe": m.pe[rid], "de": m.de[rid], "read_side": "none" if on_de < 0 or m.hit[rid] == 0 else
                READ_SIDES[on_de]}  # fmt: skip
        phases = [("request", arrive, done, args), ("waiting", arrive, start, None),
                  ("read KV", m.read_start_ns[rid], m.read_done_ns[rid], None), ("prefill", start, first, None),
                  ("hand-off", first, second if second >= 0 else done, None),
                  ("decode", second, done, None)]  # fmt: skip
        for name, begin, end, extra in phases:
            if begin < 0 or end < begin:  # never reached (no read, one token, or not ended)
                continue
            common = {"name": name, "cat": name, "id": rid, "pid": REQUESTS_PID}
            yield event(**common, ph="b", ts=_us(begin), **({"args": extra} if extra else {}))
            yield event(**common, ph="e", ts=_us(end))


def write_trace(path: str | Path, core: Core, config: ClusterConfig, topology: Topology, metrics: Metrics, system: str,
                faults: Sequence[Mapping[str, Any]] = (), end_ns: int = 0) -> None:  # fmt: skip
    """Write the trace of a finished run; gzip-compressed when ``path`` ends in ``.gz``."""
    target = Path(path)
    plain = target.with_suffix("") if target.suffix == ".gz" else target
    core.write_trace(str(plain), port_pids=port_pids(topology, core.port_count),
                     extra_events=trace_events(config, topology, metrics, system, faults, end_ns))  # fmt: skip
    if plain != target:
        with open(plain, "rb") as source, gzip.open(target, "wb", compresslevel=6) as packed:
            shutil.copyfileobj(source, packed, 1 << 20)
        plain.unlink()
