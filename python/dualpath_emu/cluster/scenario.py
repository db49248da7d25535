"""Cluster scenarios: a TOML file (``kind = "cluster"``) → the :class:`~dualpath_emu.cluster.config.ClusterConfig`,
the systems to compare, the workload and the seed of one ``dualpath-emu run``; run scenarios (``app = ...``) are
refused with a pointer to ``launch``.

Every key, with its default, range and meaning, is in ``scenario_keys.toml`` beside this module (generating
docs/scenario-reference.md; :data:`LIMITS` holds the ranges' numbers, docs/limits.md says why they keep runs bounded). Checks beyond types and ranges, each an error naming the key: the model's weights fit an EP group's GPUs; a
DE GPU has HBM for the longest request's KV; without layerwise prefill (``basic``) a PE GPU holds one request's whole
KV; a node's DRAM buffer holds one request's KV. Every error is a :class:`~dualpath_emu.config.ScenarioError` naming
the file, the key and what was expected. :data:`DEFAULT` is the built-in scenario (the same settings as the packaged
``ds660b-2p4d-offline.toml``; a test keeps them equal)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, cast

from dualpath_emu.cluster.catalog import PACKAGED, Catalog, GpuSpec, ModelSpec, NodeSpec
from dualpath_emu.cluster.config import (
    WRITE_BACK,
    WRITE_POLICIES,
    ClusterConfig,
    KvHbmSpec,
    KvPoolSpec,
    KvTierSpec,
    derived,
)
from dualpath_emu.cluster.kv_cache import EVICTIONS, Eviction
from dualpath_emu.cluster.faults import MAX_TIME_S, engine_group_names, fault_tables, load_fault_file, read_fault_plan
from dualpath_emu.cluster.roofline import Roofline, RooflineParams
from dualpath_emu._core import Core
from dualpath_emu.cluster.topology import KV_LANE, BackgroundTraffic, NetworkSpec, TokenBucket, VlTables, build_topology
from dualpath_emu.cluster.systems import NAME_PATTERN, SYSTEMS, System
from dualpath_emu.cluster.topology import StorageSpec
from dualpath_emu.cluster.user_systems import SystemLoader, is_user_spec
from dualpath_emu.config import ScenarioError, Table, format_bound, load_toml
from dualpath_emu.errors import InvalidArgumentError, UsageError
from dualpath_emu.inputs import short_repr
from dualpath_emu.workload import load_trace
from dualpath_emu.workload.generator import (
    DATASETS, MAX_AGENTS, MAX_BASE_TRAJECTORIES, MAX_SIGMA, READINGS, Dataset, GeneratorParams, Reading, generate,
    max_total_min_fraction,
)  # fmt: skip
from dualpath_emu.workload.trajectory import Trajectory
from dualpath_emu.workload.waits import DISTRIBUTIONS, MAX_SIGMA, MAX_WAIT_S, Distribution, ToolWait, read_wait_samples

__all__ = [
    "BUILT_IN", "DEFAULT", "DEFAULT_AGENTS", "DEFAULT_SYSTEMS", "LIMITS", "ClusterScenario", "Limits",
    "load_cluster_scenario", "scenario_from_table",
]  # fmt: skip

BACKENDS: Final = ("model", "host")
KIND: Final = "cluster"
BUILT_IN: Final = "<built-in>"
DEFAULT_SYSTEMS: Final = ("basic", "dualpath", "oracle")
DEFAULT_AGENTS: Final = 256
"""Agents of the built-in scenario: ``make run`` in about a minute on 2 cores, storage-bound already."""

_MAX_SEED: Final = 2**63 - 1


@dataclass(frozen=True)
class Limits:
    """The ranges a cluster scenario's keys must lie in (module docstring, "Limits")."""

    max_nodes: int = 256  # pe_nodes + de_nodes (the paper's largest deployment: 144 nodes).
    max_gpus: int = 16
    max_snics: int = 16
    nic_bytes_per_s: tuple[float, float] = (1e6, 1e12)
    host_dram_bytes_per_s: tuple[float, float] = (1e6, 1e14)
    storage_bytes_per_s: tuple[float, float] = (1e6, 1e16)
    max_latency_s: float = 10.0
    max_queue_depth: int = 65_536
    max_dram_buffer_bytes: int = 2**50
    max_kv_tier_bytes: int = 2**60  # A KV tier's capacity (an exabyte).
    max_ttl_s: float = 30 * 86_400.0  # A KV tier's time to live (a month).
    min_efficiency: float = 1e-3
    max_overhead_s_per_layer: float = 1.0
    max_agents: int = MAX_AGENTS
    max_rounds: int = 1_000_000
    arrival_rate: tuple[float, float] = (1e-3, 1e6)
    max_base_trajectories: int = MAX_BASE_TRAJECTORIES
    max_sigma: float = MAX_SIGMA
    scheduling_s: tuple[float, float] = (1e-3, 3600.0)  # alpha_read_s, beta_compute_s, attention_quota_s.
    fetch_period_s: tuple[float, float] = (1e-6, 60.0)
    max_pipeline_stages: int = 1024


LIMITS: Final = Limits()
Mode = Literal["offline", "online"]
MODES: Final[tuple[Mode, ...]] = ("offline", "online")


@dataclass(frozen=True)
class ClusterScenario:
    """One cluster run: settings, systems, workload and seed. ``source`` is the file (or ``<built-in>``)."""

    name: str
    config: ClusterConfig
    systems: tuple[str, ...] = DEFAULT_SYSTEMS
    seed: int = 0
    trace: Path | None = None  # A trace file to replay instead of generating ``config.dataset``.
    max_rounds: int = 0  # > 0: keep only each agent's first ``max_rounds`` rounds.
    generator: GeneratorParams = field(default_factory=GeneratorParams)
    source: str = BUILT_IN
    custom_systems: tuple[System, ...] = ()
    """The systems of ``systems`` that are not built in (from the user's code), in order."""
    backend: str = "model"  # ``"model"`` or ``"host"`` (real bytes, :mod:`dualpath_emu.host`).
    byte_scale: float = 1e-3
    storage_dir: str = ""
    transfer_engine: str = "zmq"
    workload_given: tuple[Trajectory, ...] | None = field(default=None, repr=False)
    """Trajectories built in Python (:meth:`with_workload`), replayed instead of the dataset or ``trace``."""

    def with_workload(self, trajectories: Iterable[Trajectory]) -> ClusterScenario:
        """A copy that replays ``trajectories`` (one agent each), checked as a trace file's are."""
        work = tuple(trajectories)
        for i, t in enumerate(work):
            if not isinstance(t, Trajectory):
                raise InvalidArgumentError(f"workload[{i}]: expected a Trajectory, got {short_repr(t)}")
        if not 1 <= len(work) <= LIMITS.max_agents:
            raise InvalidArgumentError(f"workload: expected 1 to {LIMITS.max_agents:,} trajectories, got {len(work):,}")
        if len({t.id for t in work}) < len(work):
            raise InvalidArgumentError("workload: expected trajectories with distinct ids")
        out = dataclasses.replace(
            self, trace=None, workload_given=work, config=dataclasses.replace(self.config, agents=len(work))
        )

        def error(table: str, key: str, expected: str, got: object) -> Exception:
            return InvalidArgumentError(
                f"workload: its longest request needs {table}.{key} to be {expected} (it is {got})"
            )

        _check_memory(out, error)
        return out

    def system(self, name: str) -> System:
        """The system called ``name``: one of :attr:`custom_systems`, else a built-in one."""
        for system in self.custom_systems:
            if system.name == name:
                return system
        if name not in SYSTEMS:
            raise KeyError(f"no system {name!r} in scenario {self.name!r} (its systems: {', '.join(self.systems)})")
        return SYSTEMS[name]

    def workload(self) -> str:
        """The workload in words, e.g. ``64k × 128 agents, offline``."""
        what = f"trace {self.trace}" if self.trace is not None else f"{self.config.dataset}"
        if self.workload_given is not None:
            what = "trajectories given in Python"
        rounds = f" (first {self.max_rounds} rounds)" if self.max_rounds else ""
        mode = self.config.mode if self.config.mode == "offline" else f"online at {self.config.arrival_rate:g} APS"
        waits = f", {self.config.tool_wait.describe()}" if self.config.tool_wait.waits else ""
        faults = f"; faults: {self.config.faults.describe()}" if self.config.faults.any else ""
        return f"{what} × {self.config.agents} agents{rounds}, {mode}{waits}{faults}"

    def describe(self) -> str:
        """One line: model, GPU, deployment, workload, systems, seed."""
        c = self.config
        gpus = c.node.gpus
        parallel = f"prefill EP{c.prefill_ep_nodes * gpus}, decode EP{c.decode_ep_nodes * gpus}"
        if c.model.moe_layers == 0:  # a dense model has no experts to shard
            parallel = "DP only"
        return (f"{c.model.name} on {c.gpu.name}, {c.pe_nodes}P{c.de_nodes}D ({parallel}), {self.workload()}; "
                f"systems {', '.join(self.systems)}; seed {self.seed}")  # fmt: skip

    def trajectories(self) -> list[Trajectory]:
        """The workload: generated (deterministic in ``seed``), read from ``trace``, or given in Python."""
        if self.workload_given is not None:
            out = list(self.workload_given[: self.config.agents])
        elif self.trace is not None:
            out = list(load_trace(self.trace).trajectories[: self.config.agents])
        else:
            out = generate(self.config.dataset, self.config.agents, seed=self.seed, params=self.generator)
        if self.max_rounds:
            out = [_first_rounds(t, self.max_rounds) for t in out]
        return out

    def with_overrides(
        self, *, systems: Sequence[str | System] | None = None, agents: int | None = None, seed: int | None = None,
        backend: str | None = None, byte_scale: float | None = None, faults: str | Path | None = None,
    ) -> ClusterScenario:  # fmt: skip
        """A copy with command-line overrides (``None``: as is), checked like the file."""
        out = self
        if systems is not None:
            loader = SystemLoader(Path.cwd(), "--system")
            names, custom = _check_systems(list(systems), "--system", loader, known=out.custom_systems)
            out = dataclasses.replace(out, systems=names, custom_systems=custom)
            _check_retention(out, lambda name: ScenarioError(
                f"--system {name!r}: it has no layerwise prefill, which keeping KV in decode HBM ([kv.hbm] systems) "
                "needs"))  # fmt: skip
        if agents is not None:
            if not 1 <= agents <= LIMITS.max_agents:
                raise ScenarioError(
                    f"--agents: expected an integer in [1, {LIMITS.max_agents}], got {short_repr(agents)}"
                )
            if out.workload_given is not None and agents > len(out.workload_given):
                raise ScenarioError(
                    f"--agents: expected at most {len(out.workload_given)} (the workload's trajectories), got {agents}"
                )
            if out.trace is not None:
                available = len(load_trace(out.trace).trajectories)
                if agents > available:
                    raise ScenarioError(
                        f"--agents: expected at most {available} (the trajectories in {out.trace}), got {agents}"
                    )
            out = dataclasses.replace(out, config=dataclasses.replace(out.config, agents=agents))
        if seed is not None:
            if not 0 <= seed <= _MAX_SEED:
                raise ScenarioError(f"--seed: expected an integer in [0, {_MAX_SEED}], got {short_repr(seed)}")
            out = dataclasses.replace(out, seed=seed)
        if backend is not None:
            if backend not in BACKENDS:
                raise ScenarioError(f"--backend: expected one of {', '.join(BACKENDS)}, got {short_repr(backend)}")
            out = dataclasses.replace(out, backend=backend)
            if backend == "host" and out.config.network.background:
                raise ScenarioError(f"--backend host: {NO_HOST_BACKGROUND}")
        if faults is not None:
            config = out.config
            engines = engine_group_names(config.pe_nodes, config.de_nodes, config.prefill_ep_nodes)
            plan = load_fault_file(faults, config.pe_nodes + config.de_nodes, config.node.gpus, engines)
            out = dataclasses.replace(out, config=dataclasses.replace(config, faults=config.faults.plus(plan)))
        if byte_scale is not None:
            if not 0.0 < byte_scale <= 1.0:
                raise ScenarioError(f"--byte-scale: expected a number in (0, 1], got {short_repr(byte_scale)}")
            out = dataclasses.replace(out, byte_scale=byte_scale)
        return out


DEFAULT: Final = ClusterScenario(name="ds660b-2p4d-offline", config=ClusterConfig(agents=DEFAULT_AGENTS))
"""The built-in scenario: the packaged ``ds660b-2p4d-offline.toml``'s settings."""


def _first_rounds(trajectory: Trajectory, rounds: int) -> Trajectory:
    if len(trajectory) <= rounds:
        return trajectory

    hit, arrival_s, wait_s = trajectory.hit, trajectory.arrival_s, trajectory.wait_s
    return dataclasses.replace(
        trajectory, append=trajectory.append[:rounds], gen=trajectory.gen[:rounds],
        hit=None if hit is None else hit[:rounds], arrival_s=None if arrival_s is None else arrival_s[:rounds],
        wait_s=None if wait_s is None else wait_s[:rounds],
    )  # fmt: skip


def load_cluster_scenario(
    path: str | Path, overrides: Mapping[str, object] | None = None, *, what: str = "override"
) -> ClusterScenario:
    """Read and check the cluster scenario in ``path``; ``overrides`` set by dotted path first."""
    top = load_toml(path)
    if overrides:
        overrides = dict(overrides)
        trace = overrides.get("workload.trace")
        if isinstance(trace, str) and trace and not Path(trace).is_absolute():
            overrides["workload.trace"] = str(Path.cwd() / trace)
        if "workload.trace" in overrides and "workload.dataset" not in overrides:
            top = top.without("workload.dataset")
            if "workload.agents" not in overrides:
                top = top.without("workload.agents")
        elif "workload.dataset" in overrides and "workload.trace" not in overrides:
            top = top.without("workload.trace")
        top = top.overridden(overrides, what)  # a bad value's error names it as given: "--set workload.agents"
    return scenario_from_table(top, Path(path))


def scenario_from_table(top: Table, path: Path) -> ClusterScenario:
    """The cluster scenario of the TOML top-level table ``top``, read from ``path``."""
    if "kind" not in top and "app" in top:
        raise ScenarioError(
            f"{top.source}: this is an actor-runtime scenario (it has key 'app'), not a cluster scenario "
            '(kind = "cluster"): run it with `dualpath-emu launch`'
        )
    top.get_str("kind", choices=(KIND,))
    name = top.get_str("name", path.stem)
    if not name:
        raise top.error("name", "a non-empty string", name)
    seed = top.get_int("seed", 0, min=0, max=_MAX_SEED)
    order_value = top.get_int("order_seed", 0, min=0, max=_MAX_SEED)
    order_seed = order_value if "order_seed" in top else None  # not given: FIFO
    message_delay_s = top.get_float("message_delay_s", 0.0, min=0.0, max=1.0)
    if message_delay_s and order_seed is None:
        raise top.error("message_delay_s", "0 unless order_seed is given (the delays are drawn from it)",
                        message_delay_s)  # fmt: skip
    systems_table_value = top.get_str_list("systems", list(DEFAULT_SYSTEMS), non_empty=True)
    backend = top.get_str("backend", "model", choices=BACKENDS)
    if backend == "host" and top.table("network").tables("background"):
        raise top.error("backend", f'"model" with [[network.background]] ({NO_HOST_BACKGROUND})', backend)
    host = top.table("host")
    byte_scale = host.get_float("byte_scale", 1e-3, min=0.0, max=1.0, min_exclusive=True)
    storage_dir = host.get_str("storage_dir", "")
    transfer_engine = host.get_str("transfer_engine", "zmq", choices=("zmq", "mooncake"))
    host.finish()
    catalog = scenario_catalog(top, path.parent)
    faults = fault_tables(top)

    deployment = top.table("deployment")
    hardware = top.table("hardware")
    storage_table = top.table("storage")
    roofline_table = top.table("roofline")
    workload = top.table("workload")
    scheduling = top.table("scheduling")
    kv_table = top.table("kv")
    network_table = top.table("network")
    top.finish()

    base = ClusterConfig()
    node = _node(hardware, base.node, catalog)
    gpu = catalog.gpu(hardware.get_str("gpu", base.gpu.name, choices=tuple(catalog.gpus)))
    hardware.finish()

    model = catalog.model(deployment.get_str("model", base.model.name, choices=tuple(catalog.models)))
    if gpu.peak_flops_per_s(model.gemm_dtype) == 0.0:
        raise hardware.error("gpu", f"a GPU with {model.gemm_dtype} tensor cores for {model.name}'s "
                             f"weight_dtype = {model.gemm_dtype!r}", gpu.name)  # fmt: skip
    pe_nodes = deployment.get_int("pe_nodes", base.pe_nodes, min=1, max=LIMITS.max_nodes - 1)
    de_nodes = deployment.get_int("de_nodes", base.de_nodes, min=1, max=LIMITS.max_nodes - pe_nodes)
    prefill_ep = deployment.get_int("prefill_ep_nodes", base.prefill_ep_nodes, min=1)
    decode_ep = deployment.get_int("decode_ep_nodes", base.decode_ep_nodes, min=1)
    dram_buffer = deployment.get_int(
        "dram_buffer_bytes", base.dram_buffer_bytes, min=1, max=LIMITS.max_dram_buffer_bytes
    )
    if pe_nodes % prefill_ep:
        raise deployment.error("prefill_ep_nodes", f"a divisor of pe_nodes = {pe_nodes}", prefill_ep)
    if de_nodes % decode_ep:
        raise deployment.error("decode_ep_nodes", f"a divisor of de_nodes = {de_nodes}", decode_ep)
    for key, ep_nodes in (("prefill_ep_nodes", prefill_ep), ("decode_ep_nodes", decode_ep)):
        _check_weights_fit(deployment, key, model, gpu, node.gpus, ep_nodes)
    deployment.finish()

    fault_plan = read_fault_plan(
        faults, pe_nodes + de_nodes, node.gpus, engine_group_names(pe_nodes, de_nodes, prefill_ep)
    )
    storage = _storage(storage_table, base.storage)
    network = _network(network_table, base.network, pe_nodes, de_nodes, node.gpus)
    if network.buckets:  # a bucket's sustained rate must be under its port's own: the topology checks it
        try:
            build_topology(Core(), node, pe_nodes, de_nodes, storage, network)
        except ValueError as error:
            raise ScenarioError(f"{network_table.where('bucket')}: {error}") from None
    kv_store = _kv_tier(kv_table.table("store"), base.kv_store, path.parent)
    kv_pool = _kv_pool(kv_table.table("pool"), base.kv_pool, path.parent, kv_store.bounded)
    hbm_table = kv_table.table("hbm")
    hbm_eviction, hbm_ttl_s = _eviction(hbm_table, base.kv_hbm.eviction, base.kv_hbm.ttl_s, path.parent)
    kv_hbm = KvHbmSpec(_system_names(hbm_table, "systems", base.kv_hbm.systems), hbm_ttl_s, hbm_eviction)
    hbm_table.finish()
    kv_table.finish()
    prefill_roofline, decode_roofline = _rooflines(roofline_table, base.prefill_roofline, base.decode_roofline)
    base = _scheduling(scheduling, base)

    dataset = workload.get_str("dataset", base.dataset, choices=tuple(DATASETS))
    trace_value = workload.get_str("trace", "")
    if trace_value and "dataset" in workload:
        raise workload.error("trace", "either dataset or trace, not both", trace_value)
    trace = (path.parent / trace_value) if trace_value else None
    agents_given = "agents" in workload
    agents = workload.get_int("agents", base.agents, min=1, max=LIMITS.max_agents)
    max_rounds = workload.get_int("max_rounds", 0, min=0, max=LIMITS.max_rounds)
    mode = cast(Mode, workload.get_str("mode", base.mode, choices=MODES))
    arrival_rate = workload.get_float(
        "arrival_rate", base.arrival_rate, min=LIMITS.arrival_rate[0], max=LIMITS.arrival_rate[1]
    )
    generator = _generator(workload.table("generator"), DATASETS[dataset])
    tool_wait = _tool_wait(workload.table("tool_wait"), path.parent)
    workload.finish()
    if trace is not None:
        try:
            available = len(load_trace(trace).trajectories)
        except UsageError as error:  # a missing or malformed trace: name the key that points at it
            raise ScenarioError(f"{workload.where('trace')}: {error}") from None
        if agents_given and agents > available:
            raise workload.error("agents", f"at most {available} (the trajectories in {trace})", agents)
        if not agents_given and available > LIMITS.max_agents:
            raise workload.error(
                "agents", f"an integer in [1, {LIMITS.max_agents}]: {trace} has {available:,} trajectories, "
                "more than a run takes, so say how many to replay")  # fmt: skip
        agents = agents if agents_given else available

    config = dataclasses.replace(
        base, model=model, gpu=gpu, node=node, pe_nodes=pe_nodes, de_nodes=de_nodes, prefill_ep_nodes=prefill_ep,
        decode_ep_nodes=decode_ep, storage=storage, prefill_roofline=prefill_roofline,
        decode_roofline=decode_roofline, dataset=dataset, agents=agents, mode=mode,
        arrival_rate=arrival_rate, tool_wait=tool_wait, dram_buffer_bytes=dram_buffer, faults=fault_plan,
        order_seed=order_seed, message_delay_s=message_delay_s, kv_store=kv_store, kv_pool=kv_pool, kv_hbm=kv_hbm,
        network=network,
    )  # fmt: skip
    loader = SystemLoader(path.parent, f"{top.source}: key 'systems'")
    systems, custom = _check_systems(systems_table_value, "systems", loader, top)
    scenario = ClusterScenario(name, config, systems, seed, trace, max_rounds, generator, top.source, custom, backend,
                               byte_scale, storage_dir, transfer_engine)  # fmt: skip
    _check_retention(
        scenario,
        lambda name: hbm_table.error(
            "systems", f"systems with layerwise prefill, which keeping KV in decode HBM needs ({name!r} has none)", name
        ),
    )
    _check_memory(
        scenario, lambda table, key, expected, got: (top if table == "top" else deployment).error(key, expected, got)
    )
    return scenario


def scenario_catalog(top: Table, folder: Path) -> Catalog:
    """The packaged catalog, the catalog files ``top`` includes (relative to ``folder``) and its own entries."""
    files = top.get_str_list("catalog", [], single=True)
    catalog = PACKAGED
    for file in files:
        try:
            catalog = catalog.with_file(folder / file)
        except ScenarioError as error:
            raise ScenarioError(f"{top.where('catalog')}: {error}") from None
    return catalog.with_entries(top)


def _node(t: Table, base: NodeSpec, catalog: Catalog) -> NodeSpec:
    if "pcie_bytes_per_s" in t:
        # Accepted once and never used: refused rather than silently ignored.
        raise ScenarioError(
            f"{t.where('pcie_bytes_per_s')} is not used: PCIe is not modelled (every GPU "
            "byte crosses the GPU's own compute NIC, the slower link; see dualpath_emu.cluster.topology); remove it"
        )
    nic_low, nic_high = LIMITS.nic_bytes_per_s
    dram_low, dram_high = LIMITS.host_dram_bytes_per_s

    def nic_rate(kind: str, default: float) -> float:
        """``<kind>_bytes_per_s``, or the rate of the catalog NIC ``<kind>`` names (not both)."""
        rate_key = f"{kind}_bytes_per_s"
        name = t.get_str(kind, "")
        if not name:
            return t.get_float(rate_key, default, min=nic_low, max=nic_high)
        if name not in catalog.nics:
            raise t.error(kind, "one of " + ", ".join(repr(n) for n in catalog.nics), name)
        if rate_key in t:
            raise t.error(kind, f"either {kind} or {rate_key}, not both", name)
        return catalog.nics[name].bytes_per_s

    return dataclasses.replace(
        base,
        gpus=t.get_int("gpus", base.gpus, min=1, max=LIMITS.max_gpus),
        cnic_bytes_per_s=nic_rate("cnic", base.cnic_bytes_per_s),
        snic_bytes_per_s=nic_rate("snic", base.snic_bytes_per_s),
        snics=t.get_int("snics", base.snics, min=1, max=LIMITS.max_snics),
        host_dram_bytes_per_s=t.get_float(
            "host_dram_bytes_per_s", base.host_dram_bytes_per_s, min=dram_low, max=dram_high
        ),
    )


def _storage(t: Table, base: StorageSpec) -> StorageSpec:
    low, high = LIMITS.storage_bytes_per_s

    def bandwidth(key: str, default: float | None) -> float | None:
        # TOML has no null: 0 (or no key) means "unset", i.e. every storage NIC together.
        value = t.get_float(key, default or 0.0, min=0.0, max=high)
        if 0.0 < value < low:
            raise t.error(key, f"0 (unset) or a number in [{format_bound(low)}, {format_bound(high)}]", value)
        return value or None

    latency = LIMITS.max_latency_s
    out = StorageSpec(
        read_bytes_per_s=bandwidth("read_bytes_per_s", base.read_bytes_per_s),
        write_bytes_per_s=bandwidth("write_bytes_per_s", base.write_bytes_per_s),
        read_latency_s=t.get_float("read_latency_s", base.read_latency_s, min=0.0, max=latency),
        write_latency_s=t.get_float("write_latency_s", base.write_latency_s, min=0.0, max=latency),
        queue_depth=t.get_int("queue_depth", base.queue_depth, min=1, max=LIMITS.max_queue_depth),
    )
    t.finish()
    return out


NO_HOST_BACKGROUND: Final = (
    "background traffic is modelled only: the host backend has no process to move its "
    "bytes (run it on the model backend, in virtual time or live)"
)
MAX_BACKGROUND: Final = 64
"""Background traffics a scenario may give (each a transfer per target port and burst)."""
MAX_BURSTS: Final = 10_000
"""Bursts one background traffic may have (its duration over its period)."""


def _network(t: Table, base: NetworkSpec, pe_nodes: int, de_nodes: int, gpus: int) -> NetworkSpec:
    """The network's table (``[network]``): isolation, the compute NICs' VL tables, background traffic."""
    isolation = t.get_bool("isolation", base.isolation)
    cnic_vl = base.cnic_vl
    if "cnic_vl" in t:
        vl = t.table("cnic_vl")
        cnic_vl = VlTables(vl.get_int("max_vls", min=1, max=15), vl.get_int("high_limit", min=0, max=255),
                           vl.get_str("vlarb_high"), vl.get_str("vlarb_low"))  # fmt: skip
        try:
            cnic_vl.arbitration()
        except ValueError as error:
            raise ScenarioError(f"{vl.where('vlarb_low')}: not a VL arbitration the core takes: {error}") from None
        vl.finish()
    entries = t.tables("background")
    if len(entries) > MAX_BACKGROUND:
        raise t.error("background", f"at most {MAX_BACKGROUND} background traffics", f"{len(entries)} of them")
    background = list(base.background) if not entries else []
    for b in entries:
        ports = tuple(p for spec in b.get_str_list("ports") for p in _ports(b, spec, pe_nodes, de_nodes, gpus))
        if not ports:
            raise b.error("ports", "at least one port", [])
        if len(set(ports)) != len(ports):
            raise b.error("ports", "each port once", ports)
        rate = b.get_float("rate_bytes_per_s", min=1.0, max=LIMITS.storage_bytes_per_s[1])
        at_s = b.get_float("at_s", 0.0, min=0.0, max=MAX_TIME_S)
        duration_s = b.get_float("duration_s", min=0.0, max=MAX_TIME_S, min_exclusive=True)
        period_s = b.get_float("period_s", 0.0, min=0.0, max=MAX_TIME_S)
        on_s = (b.get_float("on_s", 0.0, min=0.0, max=period_s) or period_s) if period_s > 0 else 0.0
        if period_s > 0 and duration_s / period_s > MAX_BURSTS:
            raise b.error("period_s", f"at most {MAX_BURSTS:,} bursts over duration_s = {duration_s:g}", period_s)
        lane = b.get_int("lane", KV_LANE, min=0, max=14)
        b.finish()
        background.append(BackgroundTraffic(ports, rate, at_s, duration_s, period_s, on_s, lane))
    entries = t.tables("bucket")
    buckets = list(base.buckets) if not entries else []
    for b in entries:
        ports = tuple(p for spec in b.get_str_list("ports") for p in _ports(b, spec, pe_nodes, de_nodes, gpus))
        if not ports:
            raise b.error("ports", "at least one port", [])
        taken = {p for bucket in buckets for p in bucket.ports}
        if taken & set(ports) or len(set(ports)) != len(ports):
            raise b.error("ports", "each port in one bucket, once", sorted(taken & set(ports)) or ports)
        sustained = b.get_float(
            "sustained_bytes_per_s", min=LIMITS.nic_bytes_per_s[0], max=LIMITS.storage_bytes_per_s[1]
        )
        burst = b.get_float("burst_bytes", min=0.0, max=1e15, min_exclusive=True)
        b.finish()
        buckets.append(TokenBucket(ports, sustained, burst))
    t.finish()
    return NetworkSpec(isolation, cnic_vl, tuple(background), tuple(buckets))


def _ports(t: Table, spec: str, pe_nodes: int, de_nodes: int, gpus: int) -> list[str]:
    """The port names ``spec`` names: one port (``n3.snic.rx``, ``3fs.write``, ``n0.cnic2.tx``), or one kind of port
    on every node of a role (``de.snic.rx``, ``pe.cnic.tx``: every GPU's; ``all.dram``)."""
    nodes = {"pe": range(pe_nodes), "de": range(pe_nodes, pe_nodes + de_nodes), "all": range(pe_nodes + de_nodes)}
    kinds = ("snic.rx", "snic.tx", "dram", "cnic.tx", "cnic.rx")
    if spec in ("3fs.read", "3fs.write"):
        return [spec]
    head, _, kind = spec.partition(".")
    if head in nodes and kind in kinds:
        chosen = [f"n{n}" for n in nodes[head]]
    elif head[:1] == "n" and head[1:].isdigit() and int(head[1:]) < pe_nodes + de_nodes:
        chosen = [head]
    else:
        chosen = []
    if kind in ("cnic.tx", "cnic.rx"):
        return [f"{n}.cnic{g}.{kind[-2:]}" for n in chosen for g in range(gpus)]
    if kind in kinds[:3] or (kind[:4] == "cnic" and kind[4:-3].isdigit() and int(kind[4:-3]) < gpus
                             and kind[-3:] in (".tx", ".rx")):  # fmt: skip
        return [f"{n}.{kind}" for n in chosen] or _no_port(t, spec, pe_nodes + de_nodes, gpus)
    return _no_port(t, spec, pe_nodes + de_nodes, gpus)


def _no_port(t: Table, spec: str, nodes: int, gpus: int) -> list[str]:
    raise t.error("ports", f"port names of this cluster ({nodes} nodes of {gpus} GPUs): n<i>.snic.rx, n<i>.snic.tx, "
                  "n<i>.dram, n<i>.cnic<g>.tx or .rx, 3fs.read, 3fs.write, or pe., de. or all. before a kind "
                  "(de.snic.rx, pe.cnic.tx: every GPU's)", spec)  # fmt: skip


def _kv_tier(t: Table, base: KvTierSpec, folder: Path) -> KvTierSpec:
    """A KV tier's table (``[kv.store]``): its capacity in bytes (0: unbounded), eviction and time to live."""
    capacity = t.get_int("capacity_bytes", base.capacity_bytes, min=0, max=LIMITS.max_kv_tier_bytes)
    eviction, ttl_s = _eviction(t, base.eviction, base.ttl_s, folder)
    t.finish()
    return KvTierSpec(capacity, eviction, ttl_s)


def _kv_pool(t: Table, base: KvPoolSpec, folder: Path, store_bounded: bool) -> KvPoolSpec:
    """The DRAM pool's table (``[kv.pool]``): bytes per node, eviction, time to live, the systems given it besides
    those that always keep KV in one, and its write policy."""
    per_node = t.get_int("bytes_per_node", base.bytes_per_node, min=1, max=LIMITS.max_kv_tier_bytes // LIMITS.max_nodes)
    eviction, ttl_s = _eviction(t, base.eviction, base.ttl_s, folder)
    systems = _system_names(t, "systems", base.systems)
    write = t.get_str("write", base.write, choices=WRITE_POLICIES)
    if write == WRITE_BACK and store_bounded:
        raise t.error("write", "'through' with a bounded [kv.store] (a store that evicts takes no write-backs: not "
                      "modelled)", write)  # fmt: skip
    t.finish()
    return KvPoolSpec(per_node, eviction, ttl_s, systems, write)


def _system_names(t: Table, key: str, default: Sequence[str]) -> tuple[str, ...]:
    """A list of system names (``[kv.pool] systems``, ``[kv.hbm] systems``)."""
    names = t.get_str_list(key, list(default))
    for name in names:
        if NAME_PATTERN.fullmatch(name) is None:
            raise t.error(key, "system names (1-64 letters, digits and _.+-)", name)
    return tuple(names)


def _check_retention(scenario: ClusterScenario, error: Callable[[str], Exception]) -> None:
    """Every system of ``scenario`` that keeps KV in decode HBM has layerwise prefill (:func:`with_tiers`)."""
    for name in scenario.systems:
        system = scenario.system(name)
        if not system.layerwise and (system.retain or name in scenario.config.kv_hbm.systems):
            raise error(name)


def _eviction(t: Table, eviction: str, ttl_s: float, folder: Path) -> tuple[str, float]:
    """A tier's ``eviction`` and ``ttl_s``. A user's eviction (``module:Name``, ``file.py:Name`` relative to the
    scenario) is loaded here to check it, and kept with its file's absolute path, so that every process finds it."""
    eviction = t.get_str("eviction", eviction)
    if is_user_spec(eviction):
        target, _, name = eviction.rpartition(":")
        if target.endswith(".py"):
            eviction = f"{(folder / target).resolve()}:{name}"
        SystemLoader(folder, t.where("eviction")).load_class(eviction, Eviction)
    elif eviction not in EVICTIONS:
        raise t.error("eviction", f"one of {', '.join(map(repr, EVICTIONS))}, or a user's module:Name or "
                      "file.py:Name", eviction)  # fmt: skip
    ttl_s = t.get_float("ttl_s", ttl_s, min=0.0, max=LIMITS.max_ttl_s)
    if eviction == "ttl" and not ttl_s > 0:
        raise t.error("ttl_s", "a time to live > 0 s with eviction = 'ttl'", ttl_s)
    return eviction, ttl_s


def _rooflines(t: Table, prefill: RooflineParams, decode: RooflineParams) -> tuple[RooflineParams, RooflineParams]:
    """The [roofline] table: its keys set both engines', [roofline.prefill] and [roofline.decode] one's."""
    low = LIMITS.min_efficiency
    high_s = LIMITS.max_overhead_s_per_layer

    def read(table: Table, base: RooflineParams) -> RooflineParams:
        return RooflineParams(
            gemm_efficiency=table.get_float("gemm_efficiency", base.gemm_efficiency, min=low, max=1.0),
            attention_efficiency=table.get_float("attention_efficiency", base.attention_efficiency, min=low, max=1.0),
            memory_efficiency=table.get_float("memory_efficiency", base.memory_efficiency, min=low, max=1.0),
            overhead_s_per_layer=table.get_float(
                "overhead_s_per_layer", base.overhead_s_per_layer, min=0.0, max=high_s
            ),
            a2a_fixed_s=table.get_float("a2a_fixed_s", base.a2a_fixed_s, min=0.0, max=high_s),
        )

    prefill_table, decode_table = t.table("prefill"), t.table("decode")
    prefill, decode = read(t, prefill), read(t, decode)
    t.finish()
    prefill, decode = read(prefill_table, prefill), read(decode_table, decode)
    prefill_table.finish()
    decode_table.finish()
    return prefill, decode


def _scheduling(t: Table, base: ClusterConfig) -> ClusterConfig:
    """``base`` with the [scheduling] keys (their defaults are ``base``'s)."""
    low, high = LIMITS.scheduling_s
    fetch_low, fetch_high = LIMITS.fetch_period_s
    out = dataclasses.replace(
        base,
        alpha_read_s=t.get_float("alpha_read_s", base.alpha_read_s, min=low, max=high),
        beta_compute_s=t.get_float("beta_compute_s", base.beta_compute_s, min=low, max=high),
        attention_quota_s=t.get_float("attention_quota_s", base.attention_quota_s, min=low, max=high),
        attention_quota_per=cast(
            Literal["forward", "layer"],
            t.get_str("attention_quota_per", base.attention_quota_per, choices=("forward", "layer")),
        ),
        fetch_period_s=t.get_float("fetch_period_s", base.fetch_period_s, min=fetch_low, max=fetch_high),
        hit_block_aligned=t.get_bool("hit_block_aligned", base.hit_block_aligned),
        de_hbm_reserve_fraction=t.get_float("de_hbm_reserve_fraction", base.de_hbm_reserve_fraction, min=0.0, max=0.99),
        pe_hbm_reserve_fraction=t.get_float("pe_hbm_reserve_fraction", base.pe_hbm_reserve_fraction, min=0.0, max=0.99),
        pipeline_stages=t.get_int("pipeline_stages", base.pipeline_stages, min=0, max=LIMITS.max_pipeline_stages),
        max_redispatches=t.get_int("max_redispatches", base.max_redispatches, min=0, max=100),
        read_timeout_s=t.get_float("read_timeout_s", base.read_timeout_s, min=0.001, max=3600.0),
        stall_timeout_s=_stall_timeout(t, base.stall_timeout_s),
    )
    t.finish()
    return out


def _stall_timeout(t: Table, default: float) -> float:
    """``stall_timeout_s``: 0 (never), or at least a minute (below that, a run's own waits would trip it)."""
    value = t.get_float("stall_timeout_s", default, min=0.0, max=1e7)
    if 0.0 < value < 60.0:
        raise t.error("stall_timeout_s", "0 (never) or a number in [60, 1e7]", value)
    return value


def _generator(t: Table, dataset: Dataset) -> GeneratorParams:
    base = GeneratorParams()
    sigma = LIMITS.max_sigma
    max_len = dataset.max_len
    # λ_min must lie below the dataset's mean total / MaxLen, or no draw has the dataset's mean (generator.py).
    fraction_high = max_total_min_fraction(dataset)
    fraction = t.get_float("total_min_fraction", base.total_min_fraction, min=0.0, max=1.0, min_exclusive=True)
    if fraction >= fraction_high:
        raise t.error("total_min_fraction", f"a number in (0, {fraction_high:.4f}) for dataset {dataset.name} "
                      "(below its mean total / MaxLen)", fraction)  # fmt: skip
    out = GeneratorParams(
        n_base=t.get_int("base_trajectories", base.n_base, min=1, max=LIMITS.max_base_trajectories),
        reading=cast(Reading, t.get_str("reading", base.reading, choices=READINGS)),
        append_sigma=t.get_float("append_sigma", base.append_sigma, min=0.0, max=sigma),
        gen_sigma=t.get_float("gen_sigma", base.gen_sigma, min=0.0, max=sigma),
        first_round_sigma=t.get_float("first_round_sigma", base.first_round_sigma, min=0.0, max=sigma),
        total_min_fraction=fraction,
        # An extra agent's first round (first_append tokens and one generated) must fit the dataset's MaxLen.
        first_append=t.get_int("first_append", base.first_append, min=1, max=max_len - 1),
    )
    t.finish()
    return out


def _tool_wait(t: Table, folder: Path) -> ToolWait:
    dist = cast(Distribution, t.get_str("dist", "none", choices=DISTRIBUTIONS))
    mean_s = t.get_float("mean_s", 0.0, min=0.0, max=MAX_WAIT_S)
    sigma = t.get_float("sigma", 1.0, min=0.0, max=MAX_SIGMA)
    file = t.get_str("file", "")
    if dist == "empirical":
        if not file:
            raise t.error("file", 'a file of waits (one number of seconds per line) for dist = "empirical"')
        try:
            samples = read_wait_samples(folder / file)
        except UsageError as error:
            raise ScenarioError(f"{t.where('file')}: {error}") from None
    elif file:
        raise t.error("file", f'no file: it is for dist = "empirical" (dist is {dist!r})', file)
    else:
        samples = ()
    if dist in ("constant", "exponential", "lognormal") and "mean_s" not in t:
        raise t.error("mean_s", f"the mean wait in seconds for dist = {dist!r}")
    t.finish()
    return ToolWait(dist, mean_s, sigma, samples)


def _check_systems(specs: Sequence[str | System], key: str, loader: SystemLoader, table: Table | None = None,
                   known: tuple[System, ...] = ()) -> tuple[tuple[str, ...], tuple[System, ...]]:  # fmt: skip
    """The names of the systems ``specs`` give, and those of them not built in (resolved with ``loader``)."""
    expected = f"names of systems ({', '.join(SYSTEMS)}) or module:Name, file.py:Name, each once"

    def bad(spec: str) -> ScenarioError:
        return table.error(key, expected, spec) if table is not None else ScenarioError(
            f"{key}: expected {expected}, got {spec!r}")  # fmt: skip

    names: list[str] = []
    custom: list[System] = []
    for given in specs:
        if isinstance(given, System):
            system = given
        elif (found := next((s for s in known if s.name == given), None)) is not None:
            system = found
        elif is_user_spec(given):
            system = loader.load(given)
        elif given in SYSTEMS:
            system = SYSTEMS[given]
        else:
            raise bad(given)
        shown = given if isinstance(given, str) else system.name
        if SYSTEMS.get(system.name, system) != system:
            raise loader.error(
                shown, f"the system is called {system.name!r}, a built-in system's name: give it another"
            )
        if system.name in names:
            if isinstance(given, str) and not is_user_spec(given):
                raise bad(given)
            raise loader.error(shown, f"expected each system once: {system.name!r} is already in the list")
        names.append(system.name)
        if system.name not in SYSTEMS:
            custom.append(system)
    if not names:
        raise ScenarioError(f"{key}: expected at least one system")
    return tuple(names), tuple(custom)


def _check_weights_fit(t: Table, key: str, spec: ModelSpec, card: GpuSpec, gpus_per_node: int, ep_nodes: int) -> None:
    model, gpu = spec.name, card.name
    try:
        Roofline(card, spec, ep_nodes * gpus_per_node)
    except InvalidArgumentError as error:
        fitting = [n for n in range(1, 257) if spec.weight_bytes_per_gpu(n * gpus_per_node) <= card.hbm_bytes]
        need = (f"at least {fitting[0]} node(s) of {gpus_per_node} {gpu}, so that every GPU holds its share of "
                f"{model}'s weights" if fitting else f"a GPU with more HBM: {model}'s weights fit no EP group of {gpu}")  # fmt: skip
        raise ScenarioError(f"{t.where(key)}: expected {need}, got {ep_nodes} ({error})") from None


def _check_memory(scenario: ClusterScenario, error: Callable[[str, str, str, object], Exception]) -> None:
    """The longest request's KV must fit where the actors put it; ``error(table, key, expected, got)`` says not."""
    config = scenario.config
    d = derived(config)
    if scenario.workload_given is not None:
        longest = max(t.max_tokens for t in scenario.workload_given)
        what = "the longest request of the workload"
    elif scenario.trace is not None:
        longest = max(t.max_tokens for t in scenario.trajectories())
        what = f"the longest request of {scenario.trace}"
    else:
        longest = DATASETS[config.dataset].max_len
        what = f"a {config.dataset} request"
    kv = longest * d.kv_bytes_per_token
    gb = f"{kv / 1e9:.1f} GB of KV for {what} ({longest} tokens)"
    if d.de_hbm_kv_bytes < kv:
        raise error(
            "deployment", "decode_ep_nodes", f"a decode EP group whose GPUs have HBM for {gb}; a DE GPU has "
            f"{d.de_hbm_kv_bytes / 1e9:.1f} GB for KV (see also scheduling.de_hbm_reserve_fraction)",
            config.decode_ep_nodes)  # fmt: skip
    whole = [name for name in scenario.systems if not scenario.system(name).layerwise]
    if whole and d.pe_hbm_kv_bytes < kv:
        raise error(
            "top", "systems", f"systems whose PE GPUs can hold a request's KV: without layerwise prefill {whole[0]!r} "
            f"needs {gb}, a PE GPU has {d.pe_hbm_kv_bytes / 1e9:.1f} GB for KV (see also "
            "scheduling.pe_hbm_reserve_fraction)", whole[0])  # fmt: skip
    if config.dram_buffer_bytes < kv:
        raise error("deployment", "dram_buffer_bytes", f"at least {gb}", config.dram_buffer_bytes)
