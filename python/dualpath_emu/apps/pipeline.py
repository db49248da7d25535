"""The pipeline application: a source, workers and a sink, the runtime's reference scenario (issue 3).

It exercises every part of the runtime with one small piece of actor code that runs unchanged in virtual
time (one process, deterministic) and in real time (any split of the actors over OS processes, ZeroMQ
between them):

* the **driver** tells the ``source`` to start, then polls the ``sink`` with asks until every job is done
  and finally asks each worker for its statistics;
* the ``source`` waits a random gap (a loop timer) before each job and tells it to a worker
  (``job % workers``); gaps and sizes come from its random stream, so from the scenario's seed;
* a ``worker<i>`` moves the job's bytes over the ``link`` port (a core transfer through its
  ``data_plane``), records when, and tells the ``sink``. The workers share the one link wherever they
  run: in real time across processes the link lives in the run's data-plane service;
* the ``sink`` counts distinct jobs and duplicates (a job counted twice would break "exactly once").

Keys of the ``[pipeline]`` table (all optional):

``jobs`` (100; at most 10^6), ``workers`` (2; at most 1,024), ``gap_s`` (0.002: the mean gap between jobs,
drawn uniformly in [0, 2 × gap_s]; at most 60), ``job_bytes_min`` / ``job_bytes_max`` (1 MB / 200 MB; at
most 10^11), ``link_gbps`` (400: the link the workers share, in Gb/s; 1..10^6), ``poll_s`` (0.005: how often
the driver asks the sink; 10^-6..60, and at most 10^7 polls over the longest run the other keys allow),
``ask_timeout_s`` (5.0; at most 10^6), ``fail_at_job`` (-1: none; a worker raises on this job, to see how a
failing run is reported).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

from dualpath_emu._core import Core
from dualpath_emu.config import Table
from dualpath_emu.messages import Message, MessageRegistry
from dualpath_emu.runtime.actors import Actor, ActorSystem, handles
from dualpath_emu.runtime.app import Application
from dualpath_emu.runtime.core_work import CoreLayout

__all__ = ["Pipeline"]

_MAX_POLLS = 10_000_000


@dataclass(frozen=True, slots=True)
class Go(Message):
    WIRE_NAME: ClassVar[str] = "pipeline.Go"
    VERSION: ClassVar[int] = 1
    jobs: int


@dataclass(frozen=True, slots=True)
class Job(Message):
    WIRE_NAME: ClassVar[str] = "pipeline.Job"
    VERSION: ClassVar[int] = 1
    job: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Done(Message):
    WIRE_NAME: ClassVar[str] = "pipeline.Done"
    VERSION: ClassVar[int] = 1
    job: int
    worker: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class CountQuery(Message):
    WIRE_NAME: ClassVar[str] = "pipeline.CountQuery"
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class Count(Message):
    WIRE_NAME: ClassVar[str] = "pipeline.Count"
    VERSION: ClassVar[int] = 1
    done: int
    duplicates: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class StatsQuery(Message):
    WIRE_NAME: ClassVar[str] = "pipeline.StatsQuery"
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class WorkerStats(Message):
    WIRE_NAME: ClassVar[str] = "pipeline.WorkerStats"
    VERSION: ClassVar[int] = 2
    jobs: int
    size_bytes: int
    busy_ns: int
    first_start_ns: int
    """When its first transfer started (-1: none), on the data plane's clock."""
    last_end_ns: int
    """When its last transfer ended (-1: none)."""


class InjectedFailure(RuntimeError):
    """Raised by a worker on ``fail_at_job``: the scenario's way to show how a failed run is reported."""


class Source(Actor):
    def __init__(self, system: ActorSystem, name: str, app: Pipeline) -> None:
        super().__init__(system, name)
        self.app = app

    @handles(Go)
    async def on_go(self, msg: Go) -> None:
        app, rng = self.app, self.random
        for job in range(msg.jobs):
            await asyncio.sleep(rng.uniform(0.0, 2 * app.gap_s))
            size = rng.randint(app.job_bytes_min, app.job_bytes_max)
            self.tell(f"worker{job % app.workers}", Job(job, size))


class Worker(Actor):
    def __init__(self, system: ActorSystem, name: str, app: Pipeline, port: int) -> None:
        super().__init__(system, name)
        self.app = app
        self.port = port
        self.jobs = 0
        self.size_bytes = 0
        self.busy_ns = 0
        self.first_start_ns = -1
        self.last_end_ns = -1

    @handles(Job)
    async def on_job(self, msg: Job) -> None:
        if msg.job == self.app.fail_at_job:
            raise InjectedFailure(f"job {msg.job}: failing as the scenario asks (fail_at_job)")
        done = await self.system.data_plane.transfer([self.port], 0, msg.size_bytes)
        self.system.record(self.name, "moved", f"job {msg.job} {msg.size_bytes} B {done.start_ns}-{done.end_ns}")
        self.jobs += 1
        self.size_bytes += msg.size_bytes
        self.busy_ns += done.end_ns - done.start_ns
        if self.first_start_ns < 0:
            self.first_start_ns = done.start_ns
        self.last_end_ns = max(self.last_end_ns, done.end_ns)
        self.tell("sink", Done(msg.job, self.name, msg.size_bytes))

    @handles(StatsQuery)
    async def on_stats(self, msg: StatsQuery) -> WorkerStats:
        return WorkerStats(self.jobs, self.size_bytes, self.busy_ns, self.first_start_ns, self.last_end_ns)


class Sink(Actor):
    def __init__(self, system: ActorSystem, name: str) -> None:
        super().__init__(system, name)
        self.jobs: set[int] = set()
        self.duplicates = 0
        self.size_bytes = 0

    @handles(Done)
    async def on_done(self, msg: Done) -> None:
        if msg.job in self.jobs:
            self.duplicates += 1
        else:
            self.jobs.add(msg.job)
            self.size_bytes += msg.size_bytes

    @handles(CountQuery)
    async def on_count(self, msg: CountQuery) -> Count:
        return Count(len(self.jobs), self.duplicates, self.size_bytes)


class Pipeline(Application):
    name = "pipeline"

    def __init__(self, config: Table) -> None:
        # The bounds keep a run's size and its emulated time (at most jobs × (2 × gap + size / link)) finite.
        self.jobs = config.get_int("jobs", 100, min=0, max=1_000_000)
        self.workers = config.get_int("workers", 2, min=1, max=1024)
        self.gap_s = config.get_float("gap_s", 0.002, min=0.0, max=60.0)
        self.job_bytes_min = config.get_int("job_bytes_min", 1_000_000, min=1, max=10**11)
        self.job_bytes_max = config.get_int("job_bytes_max", 200_000_000, min=self.job_bytes_min, max=10**11)
        self.link_gbps = config.get_float("link_gbps", 400.0, min=1.0, max=1e6)
        self.poll_s = config.get_float("poll_s", 0.005, min=1e-6, max=60.0)
        self.ask_timeout_s = config.get_float("ask_timeout_s", 5.0, min=0.0, max=1e6, min_exclusive=True)
        self.fail_at_job = config.get_int("fail_at_job", -1, min=-1, max=1_000_000)
        # The driver polls the sink every poll_s until all jobs are done: bound the polls, or a long run with a
        # short period is a hang in all but name (10^6 jobs 60 s apart polled every microsecond: 10^14 asks).
        longest_s = self.jobs * (2 * self.gap_s + self.job_bytes_max * 8 / (self.link_gbps * 1e9))
        if longest_s / self.poll_s > _MAX_POLLS:
            raise config.error(
                "poll_s", f"at least {longest_s / _MAX_POLLS:.3g} s: these jobs, gaps and sizes may last "
                f"{longest_s:.3g} s of emulated time, and the driver polls at most {_MAX_POLLS:,} times",
                self.poll_s)  # fmt: skip
        config.finish()
        self._port = -1

    def registry(self) -> MessageRegistry:
        registry = MessageRegistry()
        for cls in (Go, Job, Done, CountQuery, Count, StatsQuery, WorkerStats):
            registry.register(cls)
        return registry

    def actor_names(self) -> list[str]:
        return ["source", *(f"worker{i}" for i in range(self.workers)), "sink"]

    @property
    def driver_actor(self) -> str:
        return "source"

    def build_core(self, core: Core) -> None:
        self._port = core.add_port("link", self.link_gbps * 1e9 / 8)

    def use_layout(self, layout: CoreLayout) -> None:
        self._port = layout.port_id("link")

    def create_actor(self, system: ActorSystem, name: str) -> Actor:
        if name == "source":
            return Source(system, name, self)
        if name == "sink":
            return Sink(system, name)
        if name.startswith("worker") and name[6:].isdigit() and int(name[6:]) < self.workers:
            return Worker(system, name, self, self._port)
        raise ValueError(f"the pipeline has no actor {name!r} (it has {', '.join(self.actor_names())})")

    async def drive(self, system: ActorSystem) -> dict[str, Any]:
        started_ns = system.now_ns()
        system.tell("source", Go(self.jobs))
        while True:
            await asyncio.sleep(self.poll_s)
            count = await system.ask("sink", CountQuery(), timeout_s=self.ask_timeout_s)
            assert isinstance(count, Count)
            if count.done + count.duplicates >= self.jobs:
                break
        elapsed_ns = system.now_ns() - started_ns
        workers: dict[str, dict[str, int]] = {}
        for i in range(self.workers):
            stats = await system.ask(f"worker{i}", StatsQuery(), timeout_s=self.ask_timeout_s)
            assert isinstance(stats, WorkerStats)
            workers[f"worker{i}"] = {
                "jobs": stats.jobs, "size_bytes": stats.size_bytes, "busy_ns": stats.busy_ns,
                "first_start_ns": stats.first_start_ns, "last_end_ns": stats.last_end_ns,
            }  # fmt: skip
        starts = [w["first_start_ns"] for w in workers.values() if w["jobs"]]
        ends = [w["last_end_ns"] for w in workers.values() if w["jobs"]]
        return {
            "jobs": self.jobs,
            "done": count.done,
            "duplicates": count.duplicates,
            "size_bytes": count.size_bytes,
            "workers": workers,
            # From telling the source to go until the driver saw every job done, on the driver's clock (so
            # within one poll_s); and from the first transfer's start to the last one's end, on the core's.
            "elapsed_s": round(elapsed_ns / 1e9, 6),
            "span_s": round((max(ends) - min(starts)) / 1e9, 6) if starts else 0.0,
        }
