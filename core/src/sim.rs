//! The core as callers see it: ports, storage and timers on one clock, driven in batches.
//!
//! Callers submit work (transfers, storage I/Os, timers, forward passes), then either advance virtual
//! time or, in wall mode, poll; finished work comes back as [`Completion`]s in a deterministic order
//! (time, then the order events were scheduled, then flow order within a group).

use std::fs::File;
use std::io::{BufWriter, Write};

use crate::clock::{Pacer, WallClock};
use crate::decode::{DecodeAction, DecodeBytes, DecodeJoin, DecodeNode, DecodeNodeSpec};
use crate::events::{EventKind, EventQueue, TimeNs, END_NS};
use crate::external::{External, ExternalKind, ExternalRule, Externals, InFlight};
use crate::forward::{Action, ForwardSpec, ForwardStats, ForwardStep, Forwards};
use crate::lanes::{Lane, MAX_LANES};
use crate::network::{Finished, NetStats, Network, Owner, PortCounters, PortId, PortSpec};
use crate::storage::{Io, IoKind, NodeId, QueueState, Storage, StorageNodeSpec, StorageSpec};
use crate::{CoreError, ErrorKind, Result};

/// How the core's time advances.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ClockMode {
    /// Jump from event to event; nothing waits.
    Virtual,
    /// Follow the wall clock, scaled (`time_scale` core seconds per wall second).
    Wall { time_scale: f64 },
}

/// Settings fixed when the core is created.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    pub clock: ClockMode,
    /// Utilisation sampling interval (0 = off).
    pub sample_interval_ns: u64,
    /// Keep one span per finished transfer for the trace, up to `max_spans` of them.
    pub record_spans: bool,
    /// Spans kept at most; later ones are counted in [`CoreStats::spans_dropped`]. Default [`MAX_SPANS`].
    pub max_spans: usize,
    /// Wall clock only: wall nanoseconds the run's clock has already run when this core is made, so that
    /// the cores of several processes of one run read one clock (0: it starts now).
    pub wall_elapsed_ns: u64,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            clock: ClockMode::Virtual,
            sample_interval_ns: 0,
            record_spans: false,
            max_spans: MAX_SPANS,
            wall_elapsed_ns: 0,
        }
    }
}

/// What finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionKind {
    Transfer,
    Read,
    Write,
    Timer,
    /// A forward pass (`forward.rs`): one completion for all its layers.
    Forward,
    /// Requests of a decode node ended (`decode.rs`); [`Core::take_decoded`] says which.
    Decoded,
    /// Work was handed out (`external.rs`; the tag is its id): [`Core::take_external`] says what.
    External,
}

impl CompletionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transfer => "transfer",
            Self::Read => "read",
            Self::Write => "write",
            Self::Timer => "timer",
            Self::Forward => "forward",
            Self::Decoded => "decoded",
            Self::External => "external",
        }
    }
}

/// Spans kept for the trace at most by default (`CoreConfig::max_spans`): 48 bytes each in memory (about
/// 50 MB), some 150 bytes each in the trace file; later spans are counted ([`CoreStats::spans_dropped`]).
pub const MAX_SPANS: usize = 1_000_000;

/// The range of the wall clock's `time_scale` (core seconds per wall second).
pub const MIN_TIME_SCALE: f64 = 1e-6;
pub const MAX_TIME_SCALE: f64 = 1e6;

/// The tag of work whose end nobody waits for (fire and forget: e.g. KV write-backs): it moves its bytes, is
/// counted and traced like any work, but is never reported as a completion, so `advance_until` does not
/// stop for it.
pub const UNREPORTED_TAG: u64 = u64::MAX;

/// One finished piece of work, with the caller's tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub kind: CompletionKind,
    pub tag: u64,
    /// When it was submitted (for I/Os: issued, including queueing and latency).
    pub start_ns: TimeNs,
    pub end_ns: TimeNs,
    pub size_bytes: u64,
    pub lane: Lane,
}

/// Counters about the core's own work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Transfers, I/O transfers and forwards' transfers started plus those finished: the "transfer
    /// events" of the benchmark.
    pub transfer_events: u64,
    /// Live queue events handled (void bucket forecasts excluded).
    pub queue_events: u64,
    pub net: NetStats,
    /// What forward passes created inside the core.
    pub forwards: ForwardStats,
    /// Spans not kept for the trace because [`MAX_SPANS`] were kept already.
    pub spans_dropped: u64,
}

/// Where a traced piece of work went: a transfer's path (an index into `Core::span_paths`; the network
/// reuses group ids, so they cannot name a path at the end of a run), or one storage node's I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Route {
    Path(u32),
    Io(NodeId, IoKind),
}

/// A transfer or storage I/O kept for the trace.
#[derive(Clone, Debug)]
struct Span {
    route: Route,
    lane: Lane,
    size_bytes: u64,
    start_ns: TimeNs,
    end_ns: TimeNs,
}

/// A latency-sensitive transfer waiting out the FIFO backlog of its lane ([`Core::submit_latency_sensitive`]).
#[derive(Clone, Debug)]
struct Waiting {
    path: Box<[PortId]>,
    lane: Lane,
    size_bytes: u64,
    tag: u64,
    submitted_ns: TimeNs,
}

/// The data-plane core.
pub struct Core {
    config: CoreConfig,
    net: Network,
    storage: Storage,
    queue: EventQueue,
    now: TimeNs,
    completions: Vec<Completion>,
    finished: Vec<Finished>,
    spans: Vec<Span>,
    /// The distinct paths of recorded transfer spans, and the index of each.
    span_paths: Vec<Box<[PortId]>>,
    span_path_index: std::collections::HashMap<Box<[PortId]>, u32>,
    pending_timers: u64,
    pending_transfers: u64,
    /// Latency-sensitive transfers not moving yet, by id (None: a free slot), and the free ids, reused
    /// last freed first (ids follow the order of operations only, so runs replay exactly).
    waiting: Vec<Option<Waiting>>,
    free_waiting: Vec<u32>,
    forwards: Forwards,
    /// Reused buffer of what a forward asks the core to start.
    forward_actions: Vec<Action>,
    decoders: Vec<DecodeNode>,
    /// Reused buffer of what a decode node asks the core to do.
    decode_actions: Vec<DecodeAction>,
    /// Work handed out rather than modelled (`external.rs`), and the rule saying which.
    externals: Externals,
    /// Set while a batch is submitted, so a wall clock does not move within it.
    clock_held: bool,
    transfer_events: u64,
    queue_events: u64,
    spans_dropped: u64,
    /// A delay (storage latency, a forward's compute) that would end past 2^64 ns: what, and when.
    time_overflow: Option<String>,
    wall: Option<(WallClock, Pacer)>,
}

impl Core {
    pub fn new(config: CoreConfig) -> Result<Self> {
        let wall = match config.clock {
            ClockMode::Virtual => None,
            ClockMode::Wall { time_scale } => {
                if !(MIN_TIME_SCALE..=MAX_TIME_SCALE).contains(&time_scale) {
                    return Err(CoreError::invalid(
                        "time_scale",
                        format!("a number in [{MIN_TIME_SCALE:e}, {MAX_TIME_SCALE:e}], got {time_scale}"),
                    ));
                }
                let pacer = Pacer::new().map_err(|e| CoreError::io("pacer socket", e))?;
                Some((WallClock::started(time_scale, config.wall_elapsed_ns), pacer))
            }
        };
        Ok(Self {
            net: Network::new(config.sample_interval_ns),
            storage: Storage::new(),
            queue: EventQueue::default(),
            now: 0,
            completions: Vec::new(),
            finished: Vec::new(),
            spans: Vec::new(),
            span_paths: Vec::new(),
            span_path_index: std::collections::HashMap::new(),
            pending_timers: 0,
            pending_transfers: 0,
            waiting: Vec::new(),
            free_waiting: Vec::new(),
            forwards: Forwards::default(),
            forward_actions: Vec::new(),
            decoders: Vec::new(),
            decode_actions: Vec::new(),
            externals: Externals::default(),
            clock_held: false,
            transfer_events: 0,
            queue_events: 0,
            spans_dropped: 0,
            time_overflow: None,
            wall,
            config,
        })
    }

    pub fn config(&self) -> &CoreConfig {
        &self.config
    }

    /// Current core time. In wall mode, the time of the last catch-up with the wall clock.
    pub fn now_ns(&self) -> TimeNs {
        self.now
    }

    /// The clock's reading at this moment, without handling anything: the virtual time, or in wall mode the
    /// scaled wall time (never before `now_ns`). A real-time event loop uses it as its own clock.
    pub fn clock_ns(&self) -> TimeNs {
        match &self.wall {
            Some((clock, _)) => clock.now_ns().max(self.now),
            None => self.now,
        }
    }

    /// Core nanoseconds per wall nanosecond in wall mode; `None` for the virtual clock.
    pub fn time_scale(&self) -> Option<f64> {
        self.wall.as_ref().map(|(clock, _)| clock.time_scale())
    }

    pub fn add_port(&mut self, spec: PortSpec) -> Result<PortId> {
        self.catch_up();
        self.net.add_port(spec, self.now)
    }

    pub fn port_id(&self, name: &str) -> Result<PortId> {
        self.net.port_id(name)
    }

    pub fn port_spec(&self, port: PortId) -> Result<&PortSpec> {
        self.net.port_spec(port)
    }

    pub fn port_count(&self) -> usize {
        self.net.port_count()
    }

    pub fn configure_storage(&mut self, spec: StorageSpec) -> Result<()> {
        self.net.port_spec(spec.read_port)?;
        self.net.port_spec(spec.write_port)?;
        self.storage.configure(spec)
    }

    pub fn add_storage_node(&mut self, spec: StorageNodeSpec) -> Result<NodeId> {
        for &p in spec.read_path.iter().chain(&spec.write_path) {
            self.net.port_spec(p)?;
        }
        self.storage.add_node(spec)
    }

    pub fn storage_node_id(&self, name: &str) -> Result<NodeId> {
        self.storage.node_id(name)
    }

    /// The name a storage node was added with.
    pub fn storage_node_name(&self, node: NodeId) -> Result<&str> {
        self.storage.node_name(node).ok_or_else(|| CoreError::unknown("storage node", node.to_string()))
    }

    pub fn storage_node_count(&self) -> usize {
        self.storage.node_count()
    }

    /// Outstanding I/O of a storage node (`read_q`).
    pub fn storage_queue(&self, node: NodeId) -> Result<QueueState> {
        self.storage.queue(node)
    }

    /// Check a transfer without submitting it.
    pub fn check_transfer(&self, path: &[PortId], lane: Lane) -> Result<()> {
        self.net.validate_path(path, lane)
    }

    /// Start many transfers at one instant: `(path, lane, size_bytes, tag)` each. All are checked before
    /// any is accepted; an error names the element (`transfers[3].path: ...`).
    pub fn submit_transfers(&mut self, batch: &[(Vec<PortId>, Lane, u64, u64)]) -> Result<()> {
        self.at_one_instant(|core| {
            for (i, (path, lane, _, _)) in batch.iter().enumerate() {
                core.check_transfer(path, *lane).map_err(|e| e.within(&format!("transfers[{i}]")))?;
            }
            batch.iter().try_for_each(|(path, lane, size, tag)| core.submit_transfer(path, *lane, *size, *tag))
        })
    }

    /// Start many *latency-sensitive* transfers at one instant, `(path, lane, size_bytes, tag)` each: small
    /// messages (a MoE dispatch, a collective) that queue FIFO behind the bulk data already posted on their
    /// lane, as packets do in a NIC's or switch's per-lane queue, which the fluid model leaves out.
    ///
    /// Each transfer first waits `max_p Q_p / r_p` over the ports `p` of its path, where `Q_p` is the sum
    /// over the flows crossing `p` on the same lane at submission of `min(their remaining bytes,
    /// outstanding_bytes)` (a bulk sender has at most its work-request size × queue depth posted ahead)
    /// and `r_p` the rate `p` serves that lane at now (the sum of its flow rates; the port's capacity if
    /// 0); then it becomes an ordinary flow. Its completion's `start_ns` is the submission time, so its
    /// latency includes the wait. The transfers of one batch do not queue behind one another (all waits
    /// are computed before any starts), and a lane with no other flow adds no wait, so with lane isolation
    /// a message waits for nothing. `outstanding_bytes == 0` is [`Core::submit_transfers`].
    pub fn submit_latency_sensitive(
        &mut self,
        batch: &[(Vec<PortId>, Lane, u64, u64)],
        outstanding_bytes: u64,
    ) -> Result<()> {
        if outstanding_bytes == 0 {
            return self.submit_transfers(batch);
        }
        self.at_one_instant(|core| {
            for (i, (path, lane, _, _)) in batch.iter().enumerate() {
                core.check_transfer(path, *lane).map_err(|e| e.within(&format!("transfers[{i}]")))?;
            }
            // The backlog as it stands now, with the rates of everything submitted before this batch.
            core.flush();
            let now = core.now;
            let waits = batch
                .iter()
                .map(|(path, lane, size, _)| {
                    if *size == 0 {
                        Ok(0) // moves nothing, so queues for nothing: completes now, as ordinarily
                    } else {
                        core.net.fifo_wait_ns(path, *lane, outstanding_bytes, now)
                    }
                })
                .collect::<Result<Vec<u64>>>()?;
            for ((path, lane, size, tag), wait) in batch.iter().zip(waits) {
                let wait = if *size == 0 { wait } else { wait.saturating_add(core.net.path_latency_ns(path)) };
                if wait == 0 {
                    core.submit_transfer(path, *lane, *size, *tag)?;
                } else {
                    core.wait_then_start(path, *lane, *size, *tag, wait);
                }
            }
            Ok(())
        })
    }

    /// Hold a checked transfer for `wait_ns`, then start it (`EventKind::Queued`).
    fn wait_then_start(&mut self, path: &[PortId], lane: Lane, size_bytes: u64, tag: u64, wait_ns: u64) {
        let item = Waiting { path: path.into(), lane, size_bytes, tag, submitted_ns: self.now };
        let id = match self.free_waiting.pop() {
            Some(id) => {
                self.waiting[id as usize] = Some(item);
                id
            }
            None => {
                self.waiting.push(Some(item));
                (self.waiting.len() - 1) as u32
            }
        };
        let at = self.later(wait_ns, || format!("a transfer's wait before it starts ({wait_ns} ns)"));
        self.queue.push(at, EventKind::Queued { id });
        self.transfer_events += 1;
        self.pending_transfers += 1;
    }

    /// Run `f` with the wall clock held at one instant (caught up once first), so a batch starts together.
    fn at_one_instant<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.catch_up();
        self.clock_held = true;
        let result = f(self);
        self.clock_held = false;
        // The pacer is re-armed once for the batch, not once per element (each re-arm folds in rates).
        self.after_change();
        result
    }

    /// Queue many storage I/Os at one instant: `(node, kind, lane, size_bytes, tag, extents)` each, checked
    /// first (the extents, `(context, first block, blocks)`, go with the I/O if it is handed out).
    #[allow(clippy::type_complexity)]
    pub fn submit_ios(&mut self, batch: Vec<(NodeId, IoKind, Lane, u64, u64, Vec<(u64, u64, u64)>)>) -> Result<()> {
        self.at_one_instant(|core| {
            for (i, (node, kind, lane, _, _, _)) in batch.iter().enumerate() {
                core.check_io(*node, *kind, *lane).map_err(|e| e.within(&format!("ios[{i}]")))?;
            }
            for (node, kind, lane, size_bytes, tag, extents) in batch {
                core.queue_io(Io { node, kind, lane, size_bytes, tag, issued_ns: core.now, extents });
            }
            Ok(())
        })
    }

    /// Many timers: `(at_ns, tag)` each, none in the past, checked first.
    pub fn add_timers(&mut self, batch: &[(TimeNs, u64)]) -> Result<()> {
        self.at_one_instant(|core| {
            for (i, (at_ns, _)) in batch.iter().enumerate() {
                core.check_time_arg(*at_ns).map_err(|e| e.within(&format!("timers[{i}]")))?;
            }
            batch.iter().try_for_each(|(at_ns, tag)| core.add_timer(*at_ns, *tag))
        })
    }

    /// Check a forward pass without submitting it: its shape, and every path with its lane. An error names
    /// the part (`ranks[0].load.path: unknown port 9`).
    pub fn check_forward(&self, spec: &ForwardSpec) -> Result<()> {
        spec.check_shape()?;
        for (i, rank) in spec.ranks.iter().enumerate() {
            for (name, t) in [("load", &rank.load), ("store", &rank.store)] {
                if let Some(t) = t {
                    self.check_transfer(&t.path, t.lane).map_err(|e| e.within(&format!("ranks[{i}].{name}")))?;
                }
            }
        }
        for (i, t) in spec.collectives.iter().enumerate() {
            self.check_transfer(&t.path, t.lane).map_err(|e| e.within(&format!("collectives[{i}]")))?;
        }
        Ok(())
    }

    /// Start many forward passes at one instant, `(spec, tag)` each. All are checked before any is
    /// accepted; an error names the element (`forwards[1].ranks[0].load.path: unknown port 9`).
    pub fn submit_forwards(&mut self, batch: Vec<(ForwardSpec, u64)>) -> Result<()> {
        for (i, (spec, _)) in batch.iter().enumerate() {
            self.check_forward(spec).map_err(|e| e.within(&format!("forwards[{i}]")))?;
        }
        self.at_one_instant(|core| {
            for (spec, tag) in batch {
                core.start_forward(spec, tag);
            }
            Ok(())
        })
    }

    /// Start a forward pass now (see `forward.rs` for what it does). It completes once, as a
    /// [`CompletionKind::Forward`] with `tag`; its transfers and delays are internal.
    pub fn submit_forward(&mut self, spec: ForwardSpec, tag: u64) -> Result<()> {
        self.check_forward(&spec)?;
        self.start_forward(spec, tag);
        Ok(())
    }

    /// Start a checked forward pass now.
    fn start_forward(&mut self, spec: ForwardSpec, tag: u64) {
        self.catch_up();
        let id = self.forwards.insert(spec, tag, self.now);
        let mut actions = std::mem::take(&mut self.forward_actions);
        let done = self.forwards.begin(id, &mut actions);
        self.start_forward_actions(id, &mut actions);
        self.forward_actions = actions;
        if done {
            // Nothing took time: complete through the queue at this instant, like a zero-byte transfer,
            // so the caller finds it by advancing the clock (never among a submission's side effects).
            self.queue.push(self.now, EventKind::ForwardDone { forward: id });
        }
        self.after_change();
    }

    /// A piece of forward `id` finished now: start what it lets start, and complete the forward if done.
    fn forward_step(&mut self, id: u32, step: ForwardStep) {
        let mut actions = std::mem::take(&mut self.forward_actions);
        let done = self.forwards.on_step(id, step, &mut actions);
        self.start_forward_actions(id, &mut actions);
        self.forward_actions = actions;
        if done {
            self.finish_forward(id);
        }
    }

    /// Start the transfers and delays a forward asked for (paths were checked at submission).
    fn start_forward_actions(&mut self, id: u32, actions: &mut Vec<Action>) {
        let now = self.now;
        for action in actions.drain(..) {
            let spec = &self.forwards.get(id).spec;
            let (transfer, step) = match action {
                Action::Load(r) => (spec.ranks[r as usize].load.as_ref(), ForwardStep::Load(r)),
                Action::Store(r) => (spec.ranks[r as usize].store.as_ref(), ForwardStep::Store(r)),
                Action::Collective(i) => (Some(&spec.collectives[i as usize]), ForwardStep::Shared),
                Action::Attn(r) => {
                    let delay = spec.ranks[r as usize].attn_ns;
                    let at = self.later(delay, || format!("forward pass {id}'s attention on rank {r} ({delay} ns)"));
                    self.queue.push(at, EventKind::Forward { forward: id, step: ForwardStep::Attn(r) });
                    continue;
                }
                Action::Ffn => {
                    let delay = spec.ffn_ns;
                    let at = self.later(delay, || format!("forward pass {id}'s shared phase ({delay} ns)"));
                    self.queue.push(at, EventKind::Forward { forward: id, step: ForwardStep::Shared });
                    continue;
                }
            };
            let t = transfer.expect("the state machine starts only transfers that exist");
            let owner = Owner::Forward { forward: id, step };
            if self.externals.rule.transfer(&t.path) {
                let (path, lane, size) = (t.path.clone(), t.lane, t.size_bytes);
                self.hand_out(ExternalKind::Transfer, path, lane, size, owner, now, None, Vec::new());
            } else {
                self.net
                    .add_flow(&t.path, t.lane, t.size_bytes, owner, now)
                    .expect("forward paths are validated at submission");
            }
            self.transfer_events += 1;
        }
    }

    fn finish_forward(&mut self, id: u32) {
        let f = self.forwards.remove(id);
        self.complete(CompletionKind::Forward, f.tag, f.start_ns, f.size_bytes, 0);
    }

    /// Add one node's decode GPUs (`decode.rs`); returns its id. Every path and the storage node are
    /// checked here, so what the node starts later needs no check.
    pub fn add_decode_node(&mut self, spec: DecodeNodeSpec) -> Result<u32> {
        let gpus = spec.gpus;
        if gpus == 0 || spec.a2a_paths.len() != gpus || spec.d2h_paths.len() != gpus {
            return Err(CoreError::invalid(
                "decode node",
                format!(
                    "1 or more GPUs with an a2a and a d2h path each, got {gpus} GPUs, {} a2a and {} d2h paths",
                    spec.a2a_paths.len(),
                    spec.d2h_paths.len()
                ),
            ));
        }
        for (i, path) in spec.a2a_paths.iter().enumerate() {
            self.check_transfer(path, spec.a2a_lane).map_err(|e| e.within(&format!("a2a_paths[{i}]")))?;
        }
        for (i, path) in spec.d2h_paths.iter().enumerate() {
            self.check_transfer(path, spec.kv_lane).map_err(|e| e.within(&format!("d2h_paths[{i}]")))?;
        }
        if let Some(node) = spec.storage_node {
            self.check_io(node, IoKind::Write, spec.kv_lane).map_err(|e| e.within("storage_node"))?;
        }
        let p = &spec.pricing;
        let rates = [
            p.attention_flops_per_s,
            p.attention_bytes_per_s,
            p.gemm_peak_flops_per_s * p.gemm_efficiency,
            p.hbm_bytes_per_s * p.memory_efficiency,
        ];
        if p.layers == 0
            || rates.iter().any(|r| !(r.is_finite() && *r > 0.0))
            || (p.a2a && !(p.ep_degree > 0 && p.cnic_bytes_per_s > 0.0 && p.nvlink_bytes_per_s > 0.0))
        {
            return Err(CoreError::invalid("pricing", "layers >= 1 and finite rates > 0"));
        }
        self.decoders.push(DecodeNode::new(spec));
        Ok((self.decoders.len() - 1) as u32)
    }

    fn decoder(&self, node: u32) -> Result<&DecodeNode> {
        self.decoders
            .get(node as usize)
            .ok_or_else(|| CoreError { kind: ErrorKind::Unknown, message: format!("node: unknown decode node {node}") })
    }

    /// Requests join their GPUs' batches now: `(decode node, join)` each, all checked first (a known node and
    /// GPU, `0 <= produced < gen`, `stored_blocks` within the prompt).
    pub fn submit_decode_joins(&mut self, batch: &[(u32, DecodeJoin)]) -> Result<()> {
        for (i, (node, j)) in batch.iter().enumerate() {
            let gpus = self.decoder(*node).map_err(|e| e.within(&format!("joins[{i}]")))?.spec().gpus;
            if j.gpu >= gpus
                || j.prompt < 0
                || j.produced < 0
                || j.produced >= j.gen
                || j.stored_blocks < 0
                || j.stored_blocks * crate::decode::BLOCK_TOKENS > j.prompt + j.produced
            {
                return Err(CoreError::invalid(
                    &format!("joins[{i}]"),
                    format!("a GPU below {gpus}, 0 <= produced < gen, stored blocks within the tokens, got {j:?}"),
                ));
            }
        }
        self.at_one_instant(|core| {
            for &(node, join) in batch {
                let mut actions = std::mem::take(&mut core.decode_actions);
                core.decoders[node as usize].join(core.now, join, &mut actions);
                core.run_decode_actions(node, &mut actions);
                core.decode_actions = actions;
            }
            Ok(())
        })
    }

    /// Decode node `node`'s engine crashed: it drops every request now, its GPUs' busy spans closed and
    /// reported (see [`DecodeNode::reset`]); what it already moved stays moved. Returns the number of
    /// requests dropped.
    pub fn decode_reset(&mut self, node: u32) -> Result<usize> {
        self.decoder(node)?;
        self.at_one_instant(|core| {
            let mut actions = std::mem::take(&mut core.decode_actions);
            let dropped = core.decoders[node as usize].reset(core.now, &mut actions);
            core.run_decode_actions(node, &mut actions);
            core.decode_actions = actions;
            Ok(dropped)
        })
    }

    /// Carry out what decode node `node` asked for (its paths were checked when it was added).
    fn run_decode_actions(&mut self, node: u32, actions: &mut Vec<DecodeAction>) {
        let now = self.now;
        for action in actions.drain(..) {
            match action {
                DecodeAction::Wake { at_ns, group, number } => {
                    self.queue.push(at_ns.min(END_NS), EventKind::DecodeWake { node, group, number });
                }
                DecodeAction::Transfer { path, lane, size_bytes } => {
                    if size_bytes == 0 {
                        self.queue.push(now, EventKind::Empty { tag: UNREPORTED_TAG, lane });
                    } else if self.externals.rule.transfer(&path) {
                        let owner = Owner::User(UNREPORTED_TAG);
                        self.hand_out(ExternalKind::Transfer, path, lane, size_bytes, owner, now, None, Vec::new());
                    } else {
                        self.net
                            .add_flow(&path, lane, size_bytes, Owner::User(UNREPORTED_TAG), now)
                            .expect("decode paths are validated when the node is added");
                    }
                    self.transfer_events += 1;
                    self.pending_transfers += 1;
                }
                DecodeAction::Write { node: storage, lane, size_bytes, extents } => {
                    let io = Io {
                        node: storage,
                        kind: IoKind::Write,
                        lane,
                        size_bytes,
                        tag: UNREPORTED_TAG,
                        issued_ns: now,
                        extents,
                    };
                    self.queue_io(io);
                }
                DecodeAction::Report => {
                    let tag = self.decoders[node as usize].spec().report_tag;
                    self.complete(CompletionKind::Decoded, tag, now, 0, 0);
                }
            }
        }
    }

    /// The requests of decode node `node` that ended since the last call, `(rid, second-token time or -1)`
    /// in the order they ended, and its GPUs' busy spans since then, `(GPU unit, start, end, batch size,
    /// step_ns)`.
    #[allow(clippy::type_complexity)]
    pub fn take_decoded(&mut self, node: u32) -> Result<(Vec<(u64, i64)>, Vec<(u64, TimeNs, TimeNs, usize, u64)>)> {
        self.decoder(node)?;
        let d = &mut self.decoders[node as usize];
        Ok((std::mem::take(&mut d.ended), std::mem::take(&mut d.spans)))
    }

    /// The bytes decode node `node` moved on its own so far (write-backs, all-to-all).
    pub fn decode_bytes(&self, node: u32) -> Result<&DecodeBytes> {
        Ok(&self.decoder(node)?.bytes)
    }

    /// Start a transfer now. A zero-byte transfer completes at the current time without touching a port.
    pub fn submit_transfer(&mut self, path: &[PortId], lane: Lane, size_bytes: u64, tag: u64) -> Result<()> {
        self.catch_up();
        let latency = self.net.path_latency_ns(path);
        if size_bytes == 0 {
            self.net.validate_path(path, lane)?;
            self.queue.push(self.now, EventKind::Empty { tag, lane });
        } else if latency > 0 {
            // A latency fault on its path: it waits that long first, as a latency-sensitive message waits.
            self.net.validate_path(path, lane)?;
            self.wait_then_start(path, lane, size_bytes, tag, latency);
            self.after_change();
            return Ok(());
        } else if self.externals.rule.transfer(path) {
            self.net.validate_path(path, lane)?;
            let now = self.now;
            self.hand_out(
                ExternalKind::Transfer,
                path.to_vec(),
                lane,
                size_bytes,
                Owner::User(tag),
                now,
                None,
                Vec::new(),
            );
        } else {
            self.net.add_flow(path, lane, size_bytes, Owner::User(tag), self.now)?;
        }
        self.transfer_events += 1;
        self.pending_transfers += 1;
        self.after_change();
        Ok(())
    }

    /// Check a storage I/O without submitting it.
    pub fn check_io(&self, node: NodeId, kind: IoKind, lane: Lane) -> Result<()> {
        self.storage.queue(node).map_err(|_| CoreError {
            kind: ErrorKind::Unknown,
            message: format!("node: unknown storage node {node}"),
        })?;
        let probe = Io { node, kind, lane, size_bytes: 0, tag: 0, issued_ns: 0, extents: Vec::new() };
        self.net.validate_path(&self.storage.path(&probe), lane)
    }

    /// Queue a storage read or write on a node; it completes after queueing, latency and transfer.
    pub fn submit_io(&mut self, node: NodeId, kind: IoKind, lane: Lane, size_bytes: u64, tag: u64) -> Result<()> {
        self.catch_up();
        self.check_io(node, kind, lane)?;
        self.queue_io(Io { node, kind, lane, size_bytes, tag, issued_ns: self.now, extents: Vec::new() });
        self.after_change();
        Ok(())
    }

    /// Queue a checked I/O on its node (it starts after its latency if the node has room).
    fn queue_io(&mut self, io: Io) {
        if let Some(id) = self.storage.submit(io).expect("storage nodes are checked first") {
            self.start_io_after_latency(id);
        }
    }

    fn start_io_after_latency(&mut self, id: u32) {
        let io = self.storage.io(id);
        let mut latency = self.storage.latency_ns(io.kind);
        if self.net.has_latency_faults() {
            latency = latency.saturating_add(self.net.path_latency_ns(&self.storage.path(io)));
        }
        let at = self.later(latency, || format!("a storage I/O's latency ({latency} ns)"));
        self.queue.push(at, EventKind::IoStart { io: id });
    }

    /// `delay_ns` after now; past the end of the clock ([`END_NS`]), the end of the clock, and the core then
    /// fails its next step with an error saying what (`check_time`), rather than run it at a wrong time.
    fn later(&mut self, delay_ns: u64, what: impl FnOnce() -> String) -> TimeNs {
        match self.now.checked_add(delay_ns) {
            Some(t) if t <= END_NS => t,
            _ => {
                if self.time_overflow.is_none() {
                    self.time_overflow = Some(format!("{} starting at t = {} ns", what(), self.now));
                }
                END_NS
            }
        }
    }

    /// An error if some work's end lies past the end of the clock: a delay that did (`later`), or
    /// transfers whose end does and that nothing is left to speed up (the core is otherwise idle).
    fn check_time(&mut self) -> Result<()> {
        let past_end = |what: &str| {
            CoreError::state(format!(
                "emulated time would pass 2^63 ns (about 292 years), the end of the core's clock: {what}; this \
                 work can never finish (rates too low, or sizes or delays too large?)"
            ))
        };
        if let Some(what) = &self.time_overflow {
            return Err(past_end(what));
        }
        if self.net.stuck_past_end().is_some() && self.next_event_ns().is_none() {
            return Err(past_end(self.net.stuck_past_end().unwrap_or_default()));
        }
        Ok(())
    }

    /// Scale port `port`'s rates by `factor` from now on (a fault: 1 as specified, 0 down; its flows stall
    /// until it is up again). See [`Network::set_port_factor`].
    pub fn set_port_factor(&mut self, port: PortId, factor: f64) -> Result<()> {
        self.catch_up();
        self.net.set_port_factor(port, factor, self.now)?;
        self.after_change();
        Ok(())
    }

    /// Add `extra_ns` to every transfer and storage I/O that starts crossing `port` from now on (a fault;
    /// 0 removes it). See [`Network::set_port_latency`].
    pub fn set_port_latency(&mut self, port: PortId, extra_ns: u64) -> Result<()> {
        self.catch_up();
        self.net.set_port_latency(port, extra_ns)
    }

    /// What a fault left of `port`'s rates (1 when none).
    pub fn port_factor(&self, port: PortId) -> Result<f64> {
        self.net.port_factor(port)
    }

    /// Complete a timer with `tag` at absolute core time `at_ns` (not in the past).
    pub fn add_timer(&mut self, at_ns: TimeNs, tag: u64) -> Result<()> {
        self.catch_up();
        self.check_time_arg(at_ns)?;
        self.queue.push(at_ns, EventKind::Timer { tag });
        self.pending_timers += 1;
        self.after_change();
        Ok(())
    }

    /// `at_ns` as a timer's time: not in the past, not past the end of the clock.
    fn check_time_arg(&self, at_ns: TimeNs) -> Result<()> {
        if at_ns < self.now {
            return Err(CoreError::invalid("at_ns", format!("a time >= now ({} ns), got {at_ns}", self.now)));
        }
        if at_ns > END_NS {
            return Err(CoreError::invalid(
                "at_ns",
                format!("a time <= {END_NS} ns (the end of the clock), got {at_ns}"),
            ));
        }
        Ok(())
    }

    /// Time of the next live event (after folding in pending changes), or None if nothing is pending.
    pub fn next_event_ns(&mut self) -> Option<TimeNs> {
        self.flush();
        self.skip_stale();
        self.queue.peek_time()
    }

    /// Virtual mode: handle every event up to and including `t_ns`, then set the clock to `t_ns`.
    /// Returns the number of completions now waiting to be taken.
    pub fn advance_to(&mut self, t_ns: TimeNs) -> Result<usize> {
        if self.wall.is_some() {
            return Err(CoreError::state("advance_to is for the virtual clock; a wall-clock core uses poll()"));
        }
        if t_ns < self.now {
            return Err(CoreError::invalid("t_ns", format!("a time >= now ({} ns), got {t_ns}", self.now)));
        }
        if t_ns > END_NS {
            return Err(CoreError::invalid(
                "t_ns",
                format!("a time <= {END_NS} ns (the end of the clock), got {t_ns}"),
            ));
        }
        self.process_until(t_ns);
        self.now = t_ns;
        self.check_time()?;
        Ok(self.completions.len())
    }

    /// Virtual mode: handle events in time order up to `t_ns`, but stop after the first instant at which
    /// something completed: the clock ends there, or at `t_ns` if nothing completed by then (with `t_ns ==
    /// u64::MAX`, at the last event handled). Internal events (rate changes, the pieces of a forward pass)
    /// never make a caller wake up for nothing. Returns the number of completions waiting.
    pub fn advance_until(&mut self, t_ns: TimeNs) -> Result<usize> {
        if self.wall.is_some() {
            return Err(CoreError::state("advance_until is for the virtual clock; a wall-clock core uses poll()"));
        }
        if t_ns < self.now {
            return Err(CoreError::invalid("t_ns", format!("a time >= now ({} ns), got {t_ns}", self.now)));
        }
        let before = self.completions.len();
        while let Some(t) = self.next_event_ns().filter(|&t| t <= t_ns) {
            self.now = t;
            while self.queue.peek_time() == Some(t) {
                let (_, kind) = self.queue.pop().expect("peeked");
                self.handle(kind);
            }
            self.flush();
            if self.completions.len() > before {
                self.check_time()?;
                return Ok(self.completions.len());
            }
        }
        if t_ns != TimeNs::MAX {
            self.now = t_ns.min(END_NS); // a limit past the end of the clock: as far as the clock goes
        }
        self.check_time()?;
        Ok(self.completions.len())
    }

    /// Virtual mode: handle the next batch of simultaneous events; returns its time, or None if idle.
    pub fn step(&mut self) -> Result<Option<TimeNs>> {
        if self.wall.is_some() {
            return Err(CoreError::state("step is for the virtual clock; a wall-clock core uses poll()"));
        }
        let Some(t) = self.next_event_ns() else {
            self.check_time()?;
            return Ok(None);
        };
        self.process_until(t);
        self.check_time()?;
        Ok(Some(t))
    }

    /// Virtual mode: run until no event is pending. Returns the final time.
    pub fn run_until_idle(&mut self) -> Result<TimeNs> {
        if self.wall.is_some() {
            return Err(CoreError::state("run_until_idle is for the virtual clock; a wall-clock core uses poll()"));
        }
        while self.step()?.is_some() {}
        Ok(self.now)
    }

    /// Wall mode: handle every event due by the wall clock and re-arm the pacer. Returns the completions
    /// now waiting. In virtual mode it is an error.
    pub fn poll(&mut self) -> Result<usize> {
        let Some((_, pacer)) = &self.wall else {
            return Err(CoreError::state("poll is for the wall clock; a virtual core uses advance_to() or step()"));
        };
        pacer.drain();
        self.catch_up();
        self.arm_pacer();
        self.check_time()?;
        Ok(self.completions.len())
    }

    /// Wall mode: the descriptor that becomes readable when the next event is due.
    pub fn wakeup_fd(&self) -> Result<i32> {
        match &self.wall {
            Some((_, pacer)) => Ok(pacer.fd()),
            None => Err(CoreError::state("a virtual-clock core has no wake-up descriptor")),
        }
    }

    pub fn take_completions(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.completions)
    }

    /// Transfers, I/Os and forwards not finished yet, plus timers not fired.
    pub fn pending(&self) -> u64 {
        let ios: u64 = (0..self.storage.node_count() as NodeId)
            .map(|n| self.storage.queue(n).map(|q| q.read_requests + q.write_requests).unwrap_or(0))
            .sum();
        let decoding: u64 = self.decoders.iter().map(|d| d.live_requests() as u64).sum();
        self.pending_transfers + ios + self.pending_timers + self.forwards.live() + decoding
    }

    pub fn stats(&self) -> CoreStats {
        CoreStats {
            transfer_events: self.transfer_events,
            queue_events: self.queue_events,
            net: self.net.stats,
            forwards: self.forwards.stats,
            spans_dropped: self.spans_dropped,
        }
    }

    /// Bring counters up to now, then read a port's counters.
    pub fn port_counters(&mut self, port: PortId) -> Result<&PortCounters> {
        self.net.settle_all(self.now);
        self.net.counters(port)
    }

    /// Utilisation of a port per sampling interval (fraction of its sustained rate), for all lanes or one, one
    /// value per interval up to now (idle ones included), with the interval (ns). The interval is the one
    /// asked for, doubled as often as the run's length needs to keep every series bounded (`network.rs`,
    /// `Sampling`), so there are never more than [`Network::samples_cap`] values.
    pub fn utilisation(&mut self, port: PortId, lane: Option<Lane>) -> Result<(u64, Vec<f64>)> {
        if self.config.sample_interval_ns == 0 {
            return Err(CoreError::state("sampling is off: create the Core with sample_interval_ns"));
        }
        if let Some(l) = lane {
            if l as usize >= MAX_LANES {
                return Err(CoreError::invalid("lane", format!("a lane in 0..{MAX_LANES}, got {l}")));
            }
        }
        let now = self.now;
        let rate = self.net.port_spec(port)?.rate_bytes_per_s;
        self.net.settle_all(now);
        let interval_ns = self.net.sample_ns();
        let k = self.net.counters(port)?;
        let samples: &[f64] = match lane {
            None => &k.samples,
            Some(l) => k.lane_samples.iter().find(|(x, _)| *x == l).map(|(_, s)| s.as_slice()).unwrap_or(&[]),
        };
        let full = rate * interval_ns as f64 / 1e9;
        let intervals = now.div_ceil(interval_ns) as usize;
        let mut out: Vec<f64> = samples.iter().map(|b| b / full).collect();
        out.resize(intervals.max(out.len()), 0.0);
        Ok((interval_ns, out))
    }

    /// The utilisation sampling interval now (ns; 0 = off): the one asked for, or a power-of-two multiple
    /// of it on a long run (see [`Core::utilisation`]).
    pub fn sample_interval_ns(&mut self) -> u64 {
        if self.config.sample_interval_ns == 0 {
            return 0;
        }
        self.net.settle_all(self.now);
        self.net.sample_ns()
    }

    pub fn lane_rates(&mut self, port: PortId) -> Result<[f64; MAX_LANES]> {
        self.flush();
        self.net.lane_rates(port)
    }

    pub fn flow_rate(&mut self, path: &[PortId], lane: Lane) -> Option<f64> {
        self.flush();
        self.net.flow_rate(path, lane)
    }

    /// Every group of transfers in flight: (path, lane, transfers, per-transfer rate).
    pub fn in_flight(&mut self) -> Vec<(Vec<PortId>, Lane, usize, f64)> {
        self.flush();
        self.net.in_flight()
    }

    pub fn capacity(&mut self, port: PortId) -> Result<f64> {
        self.flush();
        self.net.capacity(port)
    }

    fn flush(&mut self) {
        if self.net.needs_recompute() {
            self.net.recompute(self.now, &mut self.queue);
        }
    }

    fn skip_stale(&mut self) {
        while let Some(kind) = self.queue.peek_kind() {
            let live = match kind {
                EventKind::BucketEmpty { port, version } => self.net.bucket_version(port) == Some(version),
                _ => true,
            };
            if live {
                return;
            }
            self.queue.pop();
        }
    }

    fn process_until(&mut self, limit: TimeNs) {
        while let Some(t) = self.next_event_ns().filter(|&t| t <= limit) {
            self.now = t;
            while self.queue.peek_time() == Some(t) {
                let (_, kind) = self.queue.pop().expect("peeked");
                self.handle(kind);
            }
            self.flush();
        }
    }

    fn handle(&mut self, kind: EventKind) {
        let now = self.now;
        match kind {
            EventKind::Group { group } => {
                let mut finished = std::mem::take(&mut self.finished);
                if self.net.on_group_event(group, now, &mut finished) {
                    self.queue_events += 1;
                }
                for f in finished.drain(..) {
                    self.transfer_events += 1;
                    match f.owner {
                        Owner::User(tag) => {
                            self.trace_transfer(f.group, f.lane, f.size_bytes, f.start_ns);
                            self.complete(CompletionKind::Transfer, tag, f.start_ns, f.size_bytes, f.lane)
                        }
                        Owner::Io(id) => self.finish_io(id),
                        Owner::Forward { forward, step } => self.forward_step(forward, step),
                    }
                }
                self.finished = finished;
            }
            EventKind::Timer { tag } => {
                self.queue_events += 1;
                self.pending_timers -= 1;
                self.complete(CompletionKind::Timer, tag, now, 0, 0);
            }
            EventKind::Queued { id } => {
                self.queue_events += 1;
                let w = self.waiting[id as usize].take().expect("a waiting transfer starts once");
                self.free_waiting.push(id);
                let owner = Owner::User(w.tag);
                if self.externals.rule.transfer(&w.path) {
                    let path = w.path.into_vec();
                    self.hand_out(
                        ExternalKind::Transfer,
                        path,
                        w.lane,
                        w.size_bytes,
                        owner,
                        w.submitted_ns,
                        None,
                        Vec::new(),
                    );
                } else {
                    self.net
                        .add_flow_since(&w.path, w.lane, w.size_bytes, owner, w.submitted_ns, now)
                        .expect("latency-sensitive paths are validated at submission");
                }
            }
            EventKind::Empty { tag, lane } => {
                self.queue_events += 1;
                self.transfer_events += 1;
                self.complete(CompletionKind::Transfer, tag, now, 0, lane);
            }
            EventKind::IoStart { io } => {
                self.queue_events += 1;
                let io_ref = self.storage.io(io);
                if io_ref.size_bytes == 0 {
                    self.finish_io(io);
                } else {
                    let path = self.storage.path(io_ref);
                    let (lane, size) = (io_ref.lane, io_ref.size_bytes);
                    if self.externals.rule.storage(io_ref.node) {
                        let (kind, node, extents) =
                            (ExternalKind::Io(io_ref.kind), Some(io_ref.node), io_ref.extents.clone());
                        self.hand_out(kind, path, lane, size, Owner::Io(io), io_ref.issued_ns, node, extents);
                    } else {
                        self.net
                            .add_flow(&path, lane, size, Owner::Io(io), now)
                            .expect("I/O paths are validated at submission");
                    }
                    self.transfer_events += 1;
                }
            }
            EventKind::Forward { forward, step } => {
                self.queue_events += 1;
                self.forward_step(forward, step);
            }
            EventKind::ForwardDone { forward } => {
                self.queue_events += 1;
                self.finish_forward(forward);
            }
            EventKind::DecodeWake { node, group, number } => {
                self.queue_events += 1;
                let mut actions = std::mem::take(&mut self.decode_actions);
                self.decoders[node as usize].wake(now, group, number, &mut actions);
                self.run_decode_actions(node, &mut actions);
                self.decode_actions = actions;
            }
            EventKind::BucketEmpty { port, version } => {
                if self.net.on_bucket_event(port, version, now) {
                    self.queue_events += 1;
                }
            }
        }
    }

    /// Hand work out instead of starting its flow (`external.rs`): it ends when the plane says so.
    #[allow(clippy::too_many_arguments)]
    fn hand_out(
        &mut self,
        kind: ExternalKind,
        path: Vec<PortId>,
        lane: Lane,
        size_bytes: u64,
        owner: Owner,
        start_ns: TimeNs,
        storage_node: Option<NodeId>,
        extents: Vec<(u64, u64, u64)>,
    ) {
        let id = self.externals.insert(InFlight { owner, start_ns, lane, size_bytes });
        self.externals.out.push(External { id, kind, path, lane, size_bytes, storage_node, extents, start_ns });
        self.completions.push(Completion {
            kind: CompletionKind::External,
            tag: id,
            start_ns,
            end_ns: self.now,
            size_bytes,
            lane,
        });
    }

    /// Mark which work this core hands out rather than models (see `external.rs`); before any is in flight.
    pub fn set_external(&mut self, rule: ExternalRule) -> Result<()> {
        if self.externals.in_flight() > 0 {
            return Err(CoreError::state("the external rule changes only while no external work is in flight"));
        }
        if rule.port_domains.len() > self.net.port_count() {
            return Err(CoreError::invalid(
                "port_domains",
                format!("at most one domain per port ({}), got {}", self.net.port_count(), rule.port_domains.len()),
            ));
        }
        if rule.storage_nodes.len() > self.storage.node_count() {
            return Err(CoreError::invalid(
                "storage_nodes",
                format!(
                    "storage nodes of this core (below {}), got {}",
                    self.storage.node_count(),
                    rule.storage_nodes.len()
                ),
            ));
        }
        self.externals.rule = rule;
        Ok(())
    }

    /// The work handed out since the last call (each also announced by an `External` completion).
    pub fn take_external(&mut self) -> Vec<External> {
        std::mem::take(&mut self.externals.out)
    }

    /// External work `ids` ended now: each finishes as its flow would have (a transfer completes, an I/O
    /// frees its node's queue, a forward pass goes on). All are checked first: each must be in flight, once.
    pub fn complete_externals(&mut self, ids: &[u64]) -> Result<()> {
        let mut seen = ids.to_vec();
        seen.sort_unstable();
        for (i, pair) in seen.windows(2).enumerate() {
            if pair[0] == pair[1] {
                return Err(CoreError::invalid(&format!("ids[{i}]"), format!("each id once, got {} twice", pair[0])));
            }
        }
        for (i, &id) in ids.iter().enumerate() {
            if !self.externals.live(id) {
                return Err(CoreError::invalid(&format!("ids[{i}]"), format!("external work in flight, got {id}")));
            }
        }
        self.at_one_instant(|core| {
            for &id in ids {
                let w = core.externals.remove(id).expect("checked");
                core.transfer_events += 1;
                match w.owner {
                    Owner::User(tag) => core.complete(CompletionKind::Transfer, tag, w.start_ns, w.size_bytes, w.lane),
                    Owner::Io(io) => core.finish_io(io),
                    Owner::Forward { forward, step } => core.forward_step(forward, step),
                }
            }
            Ok(())
        })
    }

    fn finish_io(&mut self, id: u32) {
        let (io, next) = self.storage.finish(id);
        self.trace(Route::Io(io.node, io.kind), io.lane, io.size_bytes, io.issued_ns);
        let kind = match io.kind {
            IoKind::Read => CompletionKind::Read,
            IoKind::Write => CompletionKind::Write,
        };
        self.complete(kind, io.tag, io.issued_ns, io.size_bytes, io.lane);
        if let Some(next) = next {
            self.start_io_after_latency(next);
        }
    }

    fn complete(&mut self, kind: CompletionKind, tag: u64, start_ns: TimeNs, size_bytes: u64, lane: Lane) {
        let end_ns = self.now;
        if kind == CompletionKind::Transfer {
            self.pending_transfers -= 1;
        }
        if tag != UNREPORTED_TAG {
            self.completions.push(Completion { kind, tag, start_ns, end_ns, size_bytes, lane });
        }
    }

    /// The transfers and storage I/Os kept so far (`CoreConfig::record_spans`), in the order they ended:
    /// `(kind, path, storage node, lane, size_bytes, start_ns, end_ns)`, `kind` a [`CompletionKind`]
    /// (transfer, read or write), the path of an I/O its storage path, the storage node `None` for a transfer.
    #[allow(clippy::type_complexity)]
    pub fn spans(&self) -> Vec<(CompletionKind, Vec<PortId>, Option<NodeId>, Lane, u64, TimeNs, TimeNs)> {
        self.spans
            .iter()
            .map(|s| match s.route {
                Route::Path(i) => {
                    let path = self.span_paths.get(i as usize).map(|p| p.to_vec()).unwrap_or_default();
                    (CompletionKind::Transfer, path, None, s.lane, s.size_bytes, s.start_ns, s.end_ns)
                }
                Route::Io(node, kind) => {
                    let probe =
                        Io { node, kind, lane: s.lane, size_bytes: 0, tag: 0, issued_ns: 0, extents: Vec::new() };
                    let done = if kind == IoKind::Read { CompletionKind::Read } else { CompletionKind::Write };
                    (done, self.storage.path(&probe), Some(node), s.lane, s.size_bytes, s.start_ns, s.end_ns)
                }
            })
            .collect()
    }

    /// [`Core::trace`] for a transfer of network group `group` (alive until the next recompute).
    fn trace_transfer(&mut self, group: u32, lane: Lane, size_bytes: u64, start_ns: TimeNs) {
        if !self.config.record_spans || self.spans.len() >= self.config.max_spans {
            self.trace(Route::Path(0), lane, size_bytes, start_ns); // counted as dropped, or not at all
            return;
        }
        let path = self.net.group_path(group).expect("a finished transfer's group exists until the next recompute");
        let index = match self.span_path_index.get(path) {
            Some(&i) => i,
            None => {
                let i = self.span_paths.len() as u32;
                self.span_paths.push(path.into());
                self.span_path_index.insert(path.into(), i);
                i
            }
        };
        self.trace(Route::Path(index), lane, size_bytes, start_ns);
    }

    /// Keep a finished transfer or I/O (ending now) for the trace, if spans are recorded. Zero-byte
    /// transfers, timers and forward passes are not kept: the first move nothing, the caller knows best
    /// where the others belong (the cluster draws its forward passes on the GPUs that ran them).
    fn trace(&mut self, route: Route, lane: Lane, size_bytes: u64, start_ns: TimeNs) {
        if self.config.record_spans {
            if self.spans.len() < self.config.max_spans {
                self.spans.push(Span { route, lane, size_bytes, start_ns, end_ns: self.now });
            } else {
                self.spans_dropped += 1;
            }
        }
    }

    /// Wall mode: handle what is due by now on the wall clock.
    fn catch_up(&mut self) {
        if self.clock_held {
            return;
        }
        if let Some((clock, _)) = &self.wall {
            let t = clock.now_ns().max(self.now);
            self.process_until(t);
            self.now = t;
        }
    }

    fn after_change(&mut self) {
        if self.wall.is_some() && !self.clock_held {
            self.arm_pacer();
        }
    }

    fn arm_pacer(&mut self) {
        let next = self.next_event_ns();
        if let Some((clock, pacer)) = &self.wall {
            pacer.set_deadline(next.map(|t| clock.instant_of(t)));
        }
    }

    /// Utilisation of `port` (fraction of its sustained rate, all lanes) in each sampling interval that
    /// begins before `until_ns`. An interval the counters cover only in part (the one `now` falls in) is
    /// relative to the part covered, so a port busy until now reads 1, not less.
    fn utilisation_until(&self, port: PortId, until_ns: TimeNs) -> Result<(Vec<f64>, usize)> {
        if self.config.sample_interval_ns == 0 {
            return Err(CoreError::state("sampling is off: create the Core with sample_interval_ns"));
        }
        // The interval the samples are at now: the configured one, widened on long runs (the callers have
        // settled every port, so every series is at it).
        let interval_ns = self.net.sample_ns();
        if until_ns > self.now {
            return Err(CoreError::invalid("until_ns", format!("a time <= now ({} ns), got {until_ns}", self.now)));
        }
        let rate = self.net.port_spec(port)?.rate_bytes_per_s;
        let intervals = until_ns.div_ceil(interval_ns) as usize;
        let samples = &self.net.counters(port)?.samples;
        let out = samples
            .iter()
            .take(intervals)
            .enumerate()
            .map(|(k, bytes)| {
                let from = k as u64 * interval_ns;
                let covered = (from.saturating_add(interval_ns)).min(self.now).saturating_sub(from).max(1);
                bytes / (rate * covered as f64 / 1e9)
            })
            .collect();
        Ok((out, intervals))
    }

    /// The mean utilisation of `ports` in each sampling interval that begins before `until_ns` (a time
    /// series: one value per interval, idle intervals included).
    pub fn utilisation_mean(&mut self, ports: &[PortId], until_ns: TimeNs) -> Result<Vec<f64>> {
        self.net.settle_all(self.now);
        let mut sum = Vec::new();
        for &p in ports {
            let (series, intervals) = self.utilisation_until(p, until_ns)?;
            sum.resize(intervals, 0.0);
            for (total, u) in sum.iter_mut().zip(series) {
                *total += u;
            }
        }
        let n = ports.len().max(1) as f64;
        Ok(sum.into_iter().map(|total| total / n).collect())
    }

    /// The `q`-quantile (nearest rank) of the utilisation samples of every port of `ports` in every
    /// sampling interval that begins before `until_ns`, idle intervals included: how busy these ports get
    /// in their busiest intervals, which a run's mean hides. 0 without ports or intervals.
    pub fn utilisation_quantile(&mut self, ports: &[PortId], q: f64, until_ns: TimeNs) -> Result<f64> {
        if !(0.0..=1.0).contains(&q) {
            return Err(CoreError::invalid("q", format!("a quantile in [0, 1], got {q}")));
        }
        self.net.settle_all(self.now);
        let mut values = Vec::new();
        let mut total = 0usize;
        for &p in ports {
            let (series, intervals) = self.utilisation_until(p, until_ns)?;
            total += intervals;
            values.extend(series);
        }
        if total == 0 {
            return Ok(0.0);
        }
        // Intervals past a port's last sample were idle: zeros, the smallest values, counted not stored.
        let zeros = total - values.len();
        let rank = ((q * total as f64).ceil() as usize).clamp(1, total);
        if rank <= zeros {
            return Ok(0.0);
        }
        let i = rank - zeros - 1;
        let (_, value, _) = values.select_nth_unstable_by(i, |a, b| a.total_cmp(b));
        Ok(value.max(0.0))
    }

    /// Write a Chrome/Perfetto trace (JSON, `{"traceEvents": [...]}`): per port a utilisation counter
    /// track (one series per lane that carried traffic, per sampling interval); if spans were recorded,
    /// every transfer and storage I/O as an async slice (`b`/`e` with an id), named by its path
    /// (`n0.dram → n0.cnic0.tx → n0.cnic0.rx`; I/Os `read …`/`write …`). Perfetto puts the async slices
    /// of one name in one process on one track and stacks the ones that overlap, so concurrent transfers
    /// on a path are drawn correctly (thread slices must nest, which overlapping transfers do not).
    ///
    /// `port_pids` gives the process of each port's tracks (indexed by port id; a transfer goes with its
    /// path's first port, an I/O with its node's first port); the caller then names the processes in
    /// `extra_events`. Without it, ports are grouped into processes by their name's prefix (`n0` of
    /// `n0.dram`) and the core names them. `extra_events` (JSON objects, checked) are written as they are.
    pub fn write_trace(&mut self, path: &str, port_pids: Option<&[u32]>, extra_events: &[String]) -> Result<()> {
        if let Some(pids) = port_pids {
            if pids.len() != self.net.port_count() {
                return Err(CoreError::invalid(
                    "port_pids",
                    format!("one process id per port ({}), got {}", self.net.port_count(), pids.len()),
                ));
            }
        }
        for (i, event) in extra_events.iter().enumerate() {
            match serde_json::from_str::<serde_json::Value>(event) {
                Ok(serde_json::Value::Object(_)) => {}
                _ => return Err(CoreError::invalid(&format!("extra_events[{i}]"), "a JSON object (one trace event)")),
            }
        }
        self.net.settle_all(self.now);
        let file = File::create(path).map_err(|e| CoreError::io(path, e))?;
        let mut out = BufWriter::new(file);
        self.write_trace_to(&mut out, port_pids, extra_events)
            .and_then(|_| out.flush())
            .map_err(|e| CoreError::io(path, e))
    }

    fn write_trace_to(&self, out: &mut impl Write, port_pids: Option<&[u32]>, extra: &[String]) -> std::io::Result<()> {
        use serde_json::json;
        let ports = self.net.port_count() as PortId;
        let name = |p: PortId| self.net.port_spec(p).expect("port exists").name.as_str();
        // The process of each port: given, or one per name prefix, numbered in order of appearance.
        let mut prefixes: Vec<&str> = Vec::new();
        let pids: Vec<u32> = match port_pids {
            Some(pids) => pids.to_vec(),
            None => (0..ports)
                .map(|p| {
                    let prefix = name(p).split('.').next().unwrap_or("");
                    let i = prefixes.iter().position(|x| *x == prefix).unwrap_or_else(|| {
                        prefixes.push(prefix);
                        prefixes.len() - 1
                    });
                    i as u32 + 1
                })
                .collect(),
        };
        let mut first = true;
        let mut emit = |out: &mut dyn Write, v: &dyn std::fmt::Display| -> std::io::Result<()> {
            out.write_all(if first { b"{\"traceEvents\": [\n" } else { b",\n" })?;
            first = false;
            write!(out, "{v}")
        };
        for (i, prefix) in prefixes.iter().enumerate() {
            let pid = i as u32 + 1;
            emit(out, &json!({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": prefix}}))?;
        }
        let sample_ns = self.net.sample_ns();
        if sample_ns > 0 {
            let interval_s = sample_ns as f64 / 1e9;
            for p in 0..ports {
                let spec = self.net.port_spec(p).expect("port exists");
                let counters = self.net.counters(p).expect("port exists");
                let full = spec.rate_bytes_per_s * interval_s;
                for (k, _) in counters.samples.iter().enumerate() {
                    let mut args = serde_json::Map::new();
                    for (lane, samples) in &counters.lane_samples {
                        let bytes = samples.get(k).copied().unwrap_or(0.0);
                        args.insert(format!("lane{lane}"), json!(bytes / full));
                    }
                    let ts_us = k as f64 * interval_s * 1e6;
                    let event = json!({"name": spec.name, "cat": "utilisation", "ph": "C", "pid": pids[p as usize],
                                       "ts": ts_us, "args": args});
                    emit(out, &event)?;
                }
            }
        }
        // Names and processes of routes, worked out once each.
        let mut routes: std::collections::HashMap<Route, (String, u32)> = std::collections::HashMap::new();
        for (i, s) in self.spans.iter().enumerate() {
            let (label, pid) = routes.entry(s.route).or_insert_with(|| self.route_label(s.route, &pids));
            let id = i + 1;
            let cat = if matches!(s.route, Route::Io(..)) { "io" } else { "transfer" };
            let begin = json!({"name": label, "cat": cat, "ph": "b", "id": id, "pid": pid,
                               "ts": s.start_ns as f64 / 1e3, "args": {"bytes": s.size_bytes, "lane": s.lane}});
            emit(out, &begin)?;
            let end = json!({"name": label, "cat": cat, "ph": "e", "id": id, "pid": pid, "ts": s.end_ns as f64 / 1e3});
            emit(out, &end)?;
        }
        for event in extra {
            emit(out, event)?;
        }
        out.write_all(if first { b"{\"traceEvents\": []}\n" } else { b"\n]}\n" })
    }

    /// A route's span name (its path, ports by name) and the process it is drawn in.
    fn route_label(&self, route: Route, pids: &[u32]) -> (String, u32) {
        let (prefix, path, pid_port) = match route {
            Route::Path(i) => {
                let path = self.span_paths[i as usize].to_vec();
                let first = path[0];
                ("", path, first)
            }
            Route::Io(node, kind) => {
                let probe = Io { node, kind, lane: 0, size_bytes: 0, tag: 0, issued_ns: 0, extents: Vec::new() };
                let path = self.storage.path(&probe);
                // The node's own first port: after the storage cluster's for a read, first for a write.
                let (prefix, own) = match kind {
                    IoKind::Read => ("read ", path.get(1).copied().unwrap_or(path[0])),
                    IoKind::Write => ("write ", path[0]),
                };
                (prefix, path, own)
            }
        };
        let names: Vec<&str> =
            path.iter().map(|&p| self.net.port_spec(p).expect("port exists").name.as_str()).collect();
        (format!("{prefix}{}", names.join(" → ")), pids[pid_port as usize])
    }
}
