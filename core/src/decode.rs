//! Decode stepping: the continuous batches of one node's decode GPUs, stepped as their EP group steps, and
//! the persistence of every completed Full Block -- mechanics the core runs so that Python is only told
//! what a decision needs (a request has all its tokens).
//!
//! The rules are those of `python/dualpath_emu/cluster/decode_steps.py` (the reference this is tested
//! against, event for event): GPUs that step together form a *step group*; a group steps as one event per
//! *segment*, whose step time is priced from every busy GPU's batch when one changes ([`DecodePricing`], the
//! same floating-point operations in the same order as `Roofline.ep_decode_step_s`); a request that arrives
//! mid-step joins at the step's end. At a segment's end the steps done are accounted: second-token times,
//! the Full Blocks completed (written back: HBM → DRAM through the GPU's compute NIC, then to storage), the
//! MoE all-to-all bytes (charged when a GPU's batch changes) and the requests that ended, in join order.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use crate::events::TimeNs;
use crate::lanes::Lane;
use crate::network::PortId;
use crate::storage::NodeId;

/// Tokens of a Full Block.
pub const BLOCK_TOKENS: i64 = 64;
const NS: f64 = 1_000_000_000.0;

/// The constants a decode step is priced from (see `Roofline.ep_decode_step_s`): per layer the slowest
/// rank's attention, the weight GEMMs at the largest batch and a fixed overhead; per MoE layer the
/// all-to-all at the largest batch.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodePricing {
    pub layers: u64,
    pub moe_layers: u64,
    pub overhead_s_per_layer: f64,
    /// DSA's top-k keys per query, or none (every key).
    pub sparse_top_k: Option<u64>,
    pub attention_flops_per_key: u64,
    pub indexer_flops_per_key: u64,
    pub kv_bytes_per_key: u64,
    pub indexer_bytes_per_key: u64,
    /// The GPU's attention FLOP/s and HBM bytes/s at their efficiencies.
    pub attention_flops_per_s: f64,
    pub attention_bytes_per_s: f64,
    pub gemm_flops_per_token: f64,
    pub gemm_peak_flops_per_s: f64,
    pub gemm_efficiency: f64,
    pub weight_bytes: f64,
    pub hbm_bytes_per_s: f64,
    pub memory_efficiency: f64,
    /// 0: no all-to-all (a dense model, or an EP group of one GPU).
    pub a2a_fixed_s: f64,
    pub a2a_bytes_per_token_layer: u64,
    pub a2a_remote_bytes_per_token: f64,
    pub a2a_local_peers: u64,
    pub ep_degree: u64,
    pub cnic_bytes_per_s: f64,
    pub nvlink_bytes_per_s: f64,
    pub a2a: bool,
}

fn max_f(a: f64, b: f64) -> f64 {
    // Python's max(a, b): a unless b is larger.
    if b > a {
        b
    } else {
        a
    }
}

impl DecodePricing {
    /// One layer's attention for a batch of `size` requests with `context` keys in all.
    fn attention_s(&self, size: u64, context: u64) -> f64 {
        let attended = match self.sparse_top_k {
            None => context,
            Some(k) => context.min(size * k),
        };
        let flops = (self.attention_flops_per_key * attended + self.indexer_flops_per_key * context) as f64;
        let bytes = (self.kv_bytes_per_key * attended + self.indexer_bytes_per_key * context) as f64;
        max_f(flops / self.attention_flops_per_s, bytes / self.attention_bytes_per_s)
    }

    /// One layer's weight GEMMs for `tokens` tokens.
    fn other_s(&self, tokens: u64) -> f64 {
        let layers = self.layers as f64;
        max_f(
            self.gemm_flops_per_token * tokens as f64 / layers / (self.gemm_peak_flops_per_s * self.gemm_efficiency),
            self.weight_bytes / layers / (self.hbm_bytes_per_s * self.memory_efficiency),
        )
    }

    /// One MoE layer's dispatch + combine for a GPU with `tokens` tokens.
    fn a2a_s(&self, tokens: u64) -> f64 {
        if !self.a2a || tokens == 0 {
            return 0.0;
        }
        let remote = tokens as f64 * self.a2a_remote_bytes_per_token;
        let local = (tokens * self.a2a_bytes_per_token_layer * self.a2a_local_peers) as f64 / self.ep_degree as f64;
        self.a2a_fixed_s + max_f(remote / self.cnic_bytes_per_s, local / self.nvlink_bytes_per_s)
    }

    /// One step of GPUs that step together, from each one's `(batch size, context tokens)`; 0 if none
    /// has a request.
    pub fn step_s(&self, batches: impl Iterator<Item = (u64, u64)>) -> f64 {
        let (mut slowest, mut largest) = (0.0_f64, 0_u64);
        for (size, context) in batches {
            if size > 0 {
                slowest = max_f(slowest, self.attention_s(size, context));
                largest = largest.max(size);
            }
        }
        if largest == 0 {
            return 0.0;
        }
        self.layers as f64 * (slowest + self.other_s(largest) + self.overhead_s_per_layer)
            + self.moe_layers as f64 * self.a2a_s(largest)
    }
}

/// Where one node's decode GPUs send what they write back and their all-to-all.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeNodeSpec {
    pub gpus: usize,
    /// Whether the node's GPUs step together (an MoE model's EP group) or each alone (a dense model).
    pub together: bool,
    pub pricing: DecodePricing,
    pub kv_bytes_per_token: u64,
    /// All-to-all bytes per decoded token over `a2a_paths[gpu]` (0: none).
    pub a2a_bytes_per_token: f64,
    pub a2a_paths: Vec<Vec<PortId>>,
    pub a2a_lane: Lane,
    /// Where a GPU's completed blocks leave HBM, then the storage node and lane they are written to; no
    /// write-backs without a storage node.
    pub d2h_paths: Vec<Vec<PortId>>,
    pub storage_node: Option<NodeId>,
    pub kv_lane: Lane,
    /// Whether completed blocks go on from the node's DRAM to storage at once (write-through); false: they stop
    /// in DRAM (a DRAM pool written back on eviction, which the engines ask for), the HBM → DRAM copy alone.
    pub write_through: bool,
    /// The first GPU's number in busy spans (the node's index × GPUs per node).
    pub first_unit: u64,
    /// The tag of the completion that says requests of this node ended.
    pub report_tag: u64,
}

/// A request joining a GPU's batch: its prompt KV is in HBM and it has `produced` of its `gen` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeJoin {
    pub gpu: usize,
    pub rid: u64,
    pub prompt: i64,
    pub gen: i64,
    pub produced: i64,
    pub stored_blocks: i64,
    pub context: u64,
}

#[derive(Clone, Debug)]
struct Request {
    join: DecodeJoin,
    offset: i64,
    seq: u64,
    second_token_ns: i64,
}

#[derive(Default)]
struct Gpu {
    /// Slab indices of the requests decoding here, by join order.
    batch: BTreeMap<u64, usize>,
    base: i64,
    finishing: BinaryHeap<Reverse<(i64, u64, usize)>>,
    next_block: BinaryHeap<Reverse<(i64, u64, usize)>>,
    fresh: Vec<usize>,
    joined: u64,
    busy_since_ns: i64,
    busy_batch: usize,
    busy_step_ns: u64,
    a2a_tokens: i64,
}

#[derive(Default)]
struct Group {
    gpus: Vec<usize>,
    steps: i64,
    segment_start_ns: TimeNs,
    step_ns: u64,
    timer: u64,
    timers: u64,
    timer_steps: i64,
    pending: Vec<usize>,
}

/// What a node asks the core to do (the core's `decode` glue carries it out).
#[derive(Clone, Debug, PartialEq)]
pub enum DecodeAction {
    /// Wake group `group` at `at_ns` (stale unless `number` is still its live wake-up).
    Wake {
        at_ns: TimeNs,
        group: u32,
        number: u64,
    },
    Transfer {
        path: Vec<PortId>,
        lane: Lane,
        size_bytes: u64,
    },
    Write {
        node: NodeId,
        lane: Lane,
        size_bytes: u64,
        /// The Full Blocks written, `(context, first block, blocks)` (for a plane that writes them for real).
        extents: Vec<(u64, u64, u64)>,
    },
    /// Requests of this node ended: report them.
    Report,
}

/// Bytes a node moved on its own, by kind, for the run's byte check: `[bytes, transfers]` per GPU for
/// write-backs out of HBM and for the all-to-all, and the node's storage writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecodeBytes {
    pub d2h: Vec<(u64, u64)>,
    pub a2a: Vec<(u64, u64)>,
    pub written: (u64, u64),
}

/// One node's decode GPUs (see the module).
pub struct DecodeNode {
    spec: DecodeNodeSpec,
    gpus: Vec<Gpu>,
    groups: Vec<Group>,
    group_of: Vec<usize>,
    slab: Vec<Option<Request>>,
    free: Vec<usize>,
    /// Requests that ended, `(rid, second-token time or -1)`, not yet taken.
    pub ended: Vec<(u64, i64)>,
    /// Busy spans not yet taken: `(GPU unit, start, end, batch size, step)`.
    pub spans: Vec<(u64, TimeNs, TimeNs, usize, u64)>,
    pub bytes: DecodeBytes,
}

impl DecodeNode {
    pub fn new(spec: DecodeNodeSpec) -> Self {
        let n = spec.gpus;
        let groups: Vec<Group> = if spec.together {
            vec![Group { gpus: (0..n).collect(), ..Group::default() }]
        } else {
            (0..n).map(|g| Group { gpus: vec![g], ..Group::default() }).collect()
        };
        let group_of = (0..n).map(|g| if spec.together { 0 } else { g }).collect();
        let gpus = (0..n).map(|_| Gpu { busy_since_ns: -1, ..Gpu::default() }).collect();
        let bytes = DecodeBytes { d2h: vec![(0, 0); n], a2a: vec![(0, 0); n], written: (0, 0) };
        Self {
            spec,
            gpus,
            groups,
            group_of,
            slab: Vec::new(),
            free: Vec::new(),
            ended: Vec::new(),
            spans: Vec::new(),
            bytes,
        }
    }

    pub fn spec(&self) -> &DecodeNodeSpec {
        &self.spec
    }

    /// Requests decoding or waiting to join.
    pub fn live_requests(&self) -> usize {
        self.slab.len() - self.free.len()
    }

    /// `request` joins its GPU's batch at its group's next step boundary (at once if the group is idle).
    pub fn join(&mut self, now: TimeNs, request: DecodeJoin, out: &mut Vec<DecodeAction>) {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slab.push(None);
                self.slab.len() - 1
            }
        };
        self.slab[idx] = Some(Request { join: request, offset: 0, seq: 0, second_token_ns: -1 });
        let g = self.group_of[request.gpu];
        self.groups[g].pending.push(idx);
        let group = &self.groups[g];
        if group.step_ns == 0 {
            self.at_step_end(now, g, out);
            return;
        }
        let boundary = group.steps + ((now - group.segment_start_ns) / group.step_ns) as i64 + 1;
        if boundary < group.timer_steps {
            self.set_timer(g, boundary, out);
        }
    }

    /// Group `group`'s wake-up `number` is due now.
    pub fn wake(&mut self, now: TimeNs, group: u32, number: u64, out: &mut Vec<DecodeAction>) {
        let g = group as usize;
        if self.groups[g].timer != number {
            return; // called off
        }
        self.groups[g].timer = 0;
        let ended = self.ended.len();
        self.at_step_end(now, g, out);
        if self.ended.len() > ended {
            out.push(DecodeAction::Report);
        }
    }

    /// The node's engine crashed (its HBM is lost; it restarts empty): every request is dropped, decoding or
    /// waiting to join, and so are the ended ones not yet taken (their engine never heard of them). Every
    /// group's wake-up is called off (wake-up numbers keep growing, so a stale one stays stale), every
    /// GPU's busy span is closed at `now` (and reported, if any was open), and the all-to-all tokens not
    /// yet charged are dropped: they never crossed a port. What was moved stays counted in [`Self::bytes`].
    /// After it, requests join as on a new node. Returns the number of requests dropped.
    pub fn reset(&mut self, now: TimeNs, out: &mut Vec<DecodeAction>) -> usize {
        let dropped = self.live_requests();
        self.slab.clear();
        self.free.clear();
        self.ended.clear();
        for group in &mut self.groups {
            group.steps = 0;
            group.segment_start_ns = now;
            group.step_ns = 0;
            group.timer = 0; // a wake-up already queued is stale: `timers` keeps counting
            group.timer_steps = 0;
            group.pending.clear();
        }
        let mut closed = false;
        for (i, gpu) in self.gpus.iter_mut().enumerate() {
            if gpu.busy_since_ns >= 0 {
                let unit = self.spec.first_unit + i as u64;
                self.spans.push((unit, gpu.busy_since_ns as TimeNs, now, gpu.busy_batch, gpu.busy_step_ns));
                closed = true;
            }
            *gpu = Gpu { busy_since_ns: -1, ..Gpu::default() };
        }
        if closed {
            out.push(DecodeAction::Report);
        }
        dropped
    }

    fn req(&self, idx: usize) -> &Request {
        self.slab[idx].as_ref().expect("a live request")
    }

    fn req_mut(&mut self, idx: usize) -> &mut Request {
        self.slab[idx].as_mut().expect("a live request")
    }

    fn at_step_end(&mut self, now: TimeNs, g: usize, out: &mut Vec<DecodeAction>) {
        self.account(now, g, out);
        let pending = std::mem::take(&mut self.groups[g].pending);
        for &idx in &pending {
            self.add(g, idx);
        }
        let mut pending = pending;
        pending.clear();
        self.groups[g].pending = pending;
        self.next_segment(now, g, out);
    }

    fn add(&mut self, g: usize, idx: usize) {
        let steps = self.groups[g].steps;
        let gpu_index = self.req(idx).join.gpu;
        let gpu = &mut self.gpus[gpu_index];
        let seq = gpu.joined;
        gpu.joined += 1;
        let r = self.slab[idx].as_mut().expect("a live request");
        r.seq = seq;
        r.offset = r.join.produced - steps;
        gpu.batch.insert(seq, idx);
        gpu.base += r.join.prompt + r.offset;
        gpu.finishing.push(Reverse((r.join.gen - r.offset, seq, idx)));
        gpu.fresh.push(idx);
    }

    fn next_segment(&mut self, now: TimeNs, g: usize, out: &mut Vec<DecodeAction>) {
        let group = &mut self.groups[g];
        group.timer = 0;
        let steps = group.steps;
        let busy = group.gpus.iter().any(|&i| !self.gpus[i].batch.is_empty());
        if busy {
            let gpus = &self.gpus;
            let step_s =
                self.spec.pricing.step_s(group.gpus.iter().filter(|&&i| !gpus[i].batch.is_empty()).map(|&i| {
                    let n = gpus[i].batch.len() as i64;
                    (n as u64, (gpus[i].base + n * steps) as u64)
                }));
            group.step_ns = ((step_s * NS).round_ties_even() as u64).max(1);
        } else {
            group.step_ns = 0;
        }
        group.segment_start_ns = now;
        let step_ns = group.step_ns;
        for k in 0..self.groups[g].gpus.len() {
            let i = self.groups[g].gpus[k];
            let gpu = &self.gpus[i];
            if gpu.batch.len() != gpu.busy_batch || gpu.busy_since_ns < 0 {
                self.busy(i, now, step_ns);
            }
        }
        if busy {
            let first = self.groups[g]
                .gpus
                .iter()
                .filter_map(|&i| self.gpus[i].finishing.peek().map(|Reverse((at, _, _))| *at))
                .min()
                .expect("a busy group has a request that finishes");
            self.set_timer(g, first, out);
        }
    }

    fn set_timer(&mut self, g: usize, steps: i64, out: &mut Vec<DecodeAction>) {
        let group = &mut self.groups[g];
        group.timer_steps = steps;
        group.timers += 1;
        group.timer = group.timers;
        let at_ns = (group.segment_start_ns as i64 + (steps - group.steps) * group.step_ns as i64) as TimeNs;
        out.push(DecodeAction::Wake { at_ns, group: g as u32, number: group.timer });
    }

    fn busy(&mut self, i: usize, now: TimeNs, step_ns: u64) {
        let unit = self.spec.first_unit + i as u64;
        let gpu = &mut self.gpus[i];
        let size = gpu.batch.len();
        if gpu.busy_since_ns >= 0 && size != gpu.busy_batch {
            self.spans.push((unit, gpu.busy_since_ns as TimeNs, now, gpu.busy_batch, gpu.busy_step_ns));
            gpu.busy_since_ns = -1;
        }
        if gpu.busy_since_ns < 0 && size > 0 && step_ns > 0 {
            gpu.busy_since_ns = now as i64;
            gpu.busy_batch = size;
            gpu.busy_step_ns = step_ns;
        }
    }

    fn account(&mut self, now: TimeNs, g: usize, out: &mut Vec<DecodeAction>) {
        let group = &mut self.groups[g];
        if group.step_ns == 0 {
            return;
        }
        let steps = ((now - group.segment_start_ns) / group.step_ns) as i64;
        if steps <= 0 {
            return;
        }
        group.steps += steps;
        let done = group.steps;
        let second_token_ns = (group.segment_start_ns + group.step_ns) as i64;
        group.segment_start_ns += steps as u64 * group.step_ns;
        for k in 0..self.groups[g].gpus.len() {
            let i = self.groups[g].gpus[k];
            let gpu = &mut self.gpus[i];
            if gpu.batch.is_empty() {
                continue;
            }
            let due = |heap: &BinaryHeap<Reverse<(i64, u64, usize)>>| {
                heap.peek().is_some_and(|Reverse((at, _, _))| *at <= done)
            };
            if !gpu.fresh.is_empty() || due(&gpu.finishing) || due(&gpu.next_block) {
                self.account_gpu(i, steps, done, second_token_ns, out);
            } else {
                gpu.a2a_tokens += steps * gpu.batch.len() as i64;
            }
        }
    }

    fn account_gpu(&mut self, i: usize, steps: i64, done: i64, second_token_ns: i64, out: &mut Vec<DecodeAction>) {
        let mut tokens = steps * self.gpus[i].batch.len() as i64;
        let fresh = std::mem::take(&mut self.gpus[i].fresh);
        let changed = !fresh.is_empty();
        let mut written: Vec<(u64, i64, i64)> = Vec::new();
        for &idx in &fresh {
            self.req_mut(idx).second_token_ns = second_token_ns;
            self.store_blocks(done, idx, &mut written);
        }
        let mut fresh = fresh;
        fresh.clear();
        self.gpus[i].fresh = fresh;
        while let Some(&Reverse((at, seq, idx))) = self.gpus[i].next_block.peek() {
            if at > done {
                break;
            }
            self.gpus[i].next_block.pop();
            if self.gpus[i].batch.get(&seq) == Some(&idx) {
                self.store_blocks(done, idx, &mut written);
            }
        }
        let mut finished: Vec<(u64, usize)> = Vec::new();
        while let Some(&Reverse((at, seq, idx))) = self.gpus[i].finishing.peek() {
            if at > done {
                break;
            }
            self.gpus[i].finishing.pop();
            let r = self.req(idx);
            tokens -= r.offset + done - r.join.gen; // steps past its last token: a request ends early
            finished.push((seq, idx));
        }
        finished.sort_unstable();
        for &(seq, idx) in &finished {
            let r = self.slab[idx].take().expect("a live request");
            self.free.push(idx);
            let gpu = &mut self.gpus[i];
            gpu.batch.remove(&seq);
            gpu.base -= r.join.prompt + r.offset;
            self.ended.push((r.join.rid, r.second_token_ns));
        }
        let gpu = &mut self.gpus[i];
        gpu.a2a_tokens += tokens;
        if self.spec.a2a_bytes_per_token != 0.0 && gpu.a2a_tokens > 0 && (changed || !finished.is_empty()) {
            let size = (self.spec.a2a_bytes_per_token * gpu.a2a_tokens as f64) as u64;
            gpu.a2a_tokens = 0;
            let tally = &mut self.bytes.a2a[i];
            tally.0 += size;
            tally.1 += 1;
            out.push(DecodeAction::Transfer {
                path: self.spec.a2a_paths[i].clone(),
                lane: self.spec.a2a_lane,
                size_bytes: size,
            });
        }
        self.persist(i, &written, out);
    }

    /// Write back completed Full Blocks, charged once per segment, not per block.
    fn persist(&mut self, i: usize, written: &[(u64, i64, i64)], out: &mut Vec<DecodeAction>) {
        let Some(node) = self.spec.storage_node else { return };
        if written.is_empty() {
            return;
        }
        let blocks: i64 = written.iter().map(|&(_, _, n)| n).sum();
        let size = blocks as u64 * BLOCK_TOKENS as u64 * self.spec.kv_bytes_per_token;
        let d2h = &mut self.bytes.d2h[i];
        d2h.0 += size;
        d2h.1 += 1;
        out.push(DecodeAction::Transfer {
            path: self.spec.d2h_paths[i].clone(),
            lane: self.spec.kv_lane,
            size_bytes: size,
        });
        if !self.spec.write_through {
            return;
        }
        self.bytes.written.0 += size;
        self.bytes.written.1 += 1;
        let extents = written.iter().map(|&(c, first, n)| (c, first as u64, n as u64)).collect();
        out.push(DecodeAction::Write { node, lane: self.spec.kv_lane, size_bytes: size, extents });
    }

    fn store_blocks(&mut self, steps: i64, idx: usize, written: &mut Vec<(u64, i64, i64)>) {
        let r = self.slab[idx].as_mut().expect("a live request");
        let produced = r.join.gen.min(r.offset + steps);
        let full = (r.join.prompt + produced) / BLOCK_TOKENS;
        let blocks = full - r.join.stored_blocks;
        if blocks > 0 {
            written.push((r.join.context, r.join.stored_blocks, blocks));
        }
        r.join.stored_blocks = full;
        if produced < r.join.gen {
            let at = (full + 1) * BLOCK_TOKENS - r.join.prompt - r.offset;
            let seq = r.seq;
            self.gpus[r.join.gpu].next_block.push(Reverse((at, seq, idx)));
        }
    }
}
