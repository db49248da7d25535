//! A forward pass as one operation: a layerwise pipeline across the DP-attention ranks of one engine group,
//! expanded by the core into its own transfers and delays (DESIGN.md §4: cross the FFI boundary per forward
//! pass, never per layer).
//!
//! A forward has `n_layers` layers, a set of ranks (GPUs) and, per layer, a shared (MoE/FFN) phase. Per
//! layer, each rank `r` has an optional **load** (a transfer: e.g. that layer's hit KV into the GPU's HBM
//! over its CNIC, paper §4.1 steps 3–4), an **attention** compute time `attn_ns` (a pure delay) and an
//! optional **store** (a transfer: e.g. the layer's KV to the decode engine, steps 5–7); the group has a
//! shared compute time `ffn_ns` and optional **collectives** (transfers, e.g. MoE dispatch/combine on a
//! high-priority lane) that run during the shared phase. Every transfer of a forward is a flow of the
//! network model like any submitted transfer: it competes with other traffic on its ports and lanes, is
//! counted in their counters and shows in `in_flight` and `flow_rate`.
//!
//! Dependencies (ℓ is a layer, `w` the forward's `load_window`):
//! - rank r's **load ℓ** starts when its load ℓ−1 has finished (one load stream per rank; load 0 at
//!   submission) and, if `w` > 0, when the group's layer ℓ−w has finished (at most `w` layers loaded
//!   ahead of the layer being finished: HBM for `w` layers of KV; `w` = 2 is double buffering, layer
//!   ℓ+1's load overlapping layer ℓ's compute; `w` = 0 means no limit);
//! - rank r's **attention ℓ** starts when its load ℓ has finished and the group's layer ℓ−1 has finished
//!   (the barrier: DP-attention ranks wait for the slowest before the next layer, paper §7.5);
//! - the **shared phase ℓ** starts when every rank's attention ℓ has finished; it starts the compute
//!   delay `ffn_ns` and every collective at once, and **layer ℓ finishes** when all of them have;
//! - rank r's **store ℓ** starts when its attention ℓ and its store ℓ−1 have finished (one store stream
//!   per rank, which may lag behind the layers);
//! - the **forward finishes** when its last layer and every store have finished. The caller sees one
//!   completion, kind "forward", with `start_ns` the submission time, `size_bytes` the bytes of every load,
//!   store and collective of every layer, and lane 0. The pieces are internal: they never appear among
//!   the completions.
//!
//! A piece with nothing to do takes no time and creates no event: a rank without a load (or with a
//! zero-byte load) is never held back by loads, a zero-byte store or collective is done at once, a zero
//! attention or shared compute time finishes where it starts. So a forward with nothing that takes time
//! completes at the instant it is submitted (through one queue event, like a zero-byte transfer).
//!
//! Determinism: pieces that become ready at one instant are started in a fixed order (per layer: loads
//! then attentions by rank; the shared phase's compute delay, then its collectives in order), so their
//! events get sequence numbers in that order, and ties are broken by sequence like every other event.

use std::collections::VecDeque;

use crate::events::TimeNs;
use crate::lanes::Lane;
use crate::network::PortId;
use crate::{CoreError, Result};

/// A transfer repeated in every layer of a forward: `size_bytes` on `lane` along `path` (port ids).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerTransfer {
    pub path: Vec<PortId>,
    pub lane: Lane,
    /// Bytes per layer.
    pub size_bytes: u64,
}

/// What one DP-attention rank (one GPU) does in every layer of a forward.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwardRank {
    /// The layer's input brought to the GPU before its attention (e.g. hit KV, DRAM → CNIC → HBM).
    pub load: Option<LayerTransfer>,
    /// Attention compute time per layer.
    pub attn_ns: u64,
    /// The layer's output sent on after its attention (e.g. the layer's KV to the decode engine).
    pub store: Option<LayerTransfer>,
}

/// A forward pass of one engine group: see the module documentation for the dependencies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwardSpec {
    /// Layers (at least one).
    pub n_layers: u32,
    /// The DP-attention ranks (at least one).
    pub ranks: Vec<ForwardRank>,
    /// Shared (MoE/FFN) compute time per layer, after every rank's attention.
    pub ffn_ns: u64,
    /// Transfers of the shared phase, per layer (e.g. MoE dispatch and combine, on a high lane).
    pub collectives: Vec<LayerTransfer>,
    /// How many layers a rank's loads may run ahead: load ℓ waits for layer ℓ − `load_window` to have
    /// finished. 0: no limit (loads stream back to back from the submission on).
    pub load_window: u32,
}

impl ForwardSpec {
    /// Bytes the whole forward moves (loads, stores and collectives of every layer), or None if that
    /// does not fit in 64 bits.
    pub fn total_bytes(&self) -> Option<u64> {
        let per_rank = self.ranks.iter().flat_map(|r| [&r.load, &r.store]).flatten();
        let per_layer = per_rank.chain(&self.collectives).try_fold(0u64, |sum, t| sum.checked_add(t.size_bytes))?;
        per_layer.checked_mul(u64::from(self.n_layers))
    }

    /// Check what does not depend on the ports: layer and rank counts, total size. Paths are checked by
    /// the core, which knows the ports.
    pub(crate) fn check_shape(&self) -> Result<()> {
        if self.n_layers == 0 {
            return Err(CoreError::invalid("n_layers", "at least 1 layer, got 0"));
        }
        if self.ranks.is_empty() {
            return Err(CoreError::invalid("ranks", "at least one rank"));
        }
        if u32::try_from(self.ranks.len()).is_err() || u32::try_from(self.collectives.len()).is_err() {
            return Err(CoreError::invalid("ranks", "fewer than 2^32 ranks and collectives"));
        }
        if self.total_bytes().is_none() {
            return Err(CoreError::invalid("size_bytes", "a forward moving fewer than 2^64 bytes in all"));
        }
        Ok(())
    }
}

/// Which piece of a forward finished: carried by its flows and delay events, and handed back to
/// [`Forwards::on_step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardStep {
    /// Rank r's load of the layer it was loading.
    Load(u32),
    /// Rank r's attention of the current layer.
    Attn(u32),
    /// Rank r's store of the oldest layer it had not stored.
    Store(u32),
    /// One piece (the compute delay or a collective) of the current layer's shared phase.
    Shared,
}

/// Something that takes time, for the core to start on behalf of a forward. The state machine never
/// emits pieces that take no time; it completes them itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Rank r's load transfer (completes as `ForwardStep::Load(r)`).
    Load(u32),
    /// Rank r's attention delay (`ForwardStep::Attn(r)`).
    Attn(u32),
    /// Rank r's store transfer (`ForwardStep::Store(r)`).
    Store(u32),
    /// The shared compute delay (`ForwardStep::Shared`).
    Ffn,
    /// Collective i (`ForwardStep::Shared`).
    Collective(u32),
}

#[derive(Clone, Copy, Debug, Default)]
struct RankState {
    loads_started: u32,
    loads_done: u32,
    /// Attentions started (the one of layer `layers_done` is running while this is `layers_done + 1`
    /// and `attn_done` is `layers_done`).
    attn_started: u32,
    attn_done: u32,
    stores_started: u32,
    stores_done: u32,
}

/// A forward in progress.
#[derive(Debug)]
pub(crate) struct Forward {
    pub spec: ForwardSpec,
    pub tag: u64,
    pub start_ns: TimeNs,
    pub size_bytes: u64,
    ranks: Vec<RankState>,
    /// Layers whose shared phase has finished.
    layers_done: u32,
    /// Ranks whose attention of layer `layers_done` has finished.
    attn_ready: u32,
    /// Pieces of the running shared phase not finished yet.
    shared_left: u32,
    /// Pieces per shared phase: the compute delay if any, and the collectives that move bytes.
    shared_pieces: u32,
    /// Store transfers (all ranks, all layers) not finished yet.
    stores_left: u64,
}

impl Forward {
    fn new(mut spec: ForwardSpec, tag: u64, start_ns: TimeNs) -> Self {
        let size_bytes = spec.total_bytes().expect("checked at submission");
        // A zero-byte transfer is done as soon as it starts, so it never holds anything back: drop it.
        for rank in &mut spec.ranks {
            rank.load = rank.load.take().filter(|t| t.size_bytes > 0);
            rank.store = rank.store.take().filter(|t| t.size_bytes > 0);
        }
        spec.collectives.retain(|t| t.size_bytes > 0);
        let shared_pieces = u32::from(spec.ffn_ns > 0) + spec.collectives.len() as u32;
        let storing = spec.ranks.iter().filter(|r| r.store.is_some()).count() as u64;
        Self {
            ranks: vec![RankState::default(); spec.ranks.len()],
            layers_done: 0,
            attn_ready: 0,
            shared_left: 0,
            shared_pieces,
            stores_left: storing * u64::from(spec.n_layers),
            spec,
            tag,
            start_ns,
            size_bytes,
        }
    }

    fn is_done(&self) -> bool {
        self.layers_done == self.spec.n_layers && self.stores_left == 0
    }

    /// Start what can start at submission: every rank's first load, and the first attention of ranks
    /// without loads.
    fn begin(&mut self, ready: &mut VecDeque<ForwardStep>, out: &mut Vec<Action>) {
        for r in 0..self.ranks.len() as u32 {
            self.try_load(r, out);
            self.try_attn(r, ready, out);
        }
    }

    fn apply(&mut self, step: ForwardStep, ready: &mut VecDeque<ForwardStep>, out: &mut Vec<Action>) {
        match step {
            ForwardStep::Load(r) => {
                self.ranks[r as usize].loads_done += 1;
                self.try_load(r, out);
                self.try_attn(r, ready, out);
            }
            ForwardStep::Attn(r) => {
                self.ranks[r as usize].attn_done += 1;
                self.attn_ready += 1;
                self.try_store(r, out);
                if self.attn_ready as usize == self.ranks.len() {
                    self.start_shared(ready, out);
                }
            }
            ForwardStep::Store(r) => {
                self.ranks[r as usize].stores_done += 1;
                self.stores_left -= 1;
                self.try_store(r, out);
            }
            ForwardStep::Shared => {
                self.shared_left -= 1;
                if self.shared_left == 0 {
                    self.finish_layer(ready, out);
                }
            }
        }
    }

    fn try_load(&mut self, r: u32, out: &mut Vec<Action>) {
        if self.spec.ranks[r as usize].load.is_none() {
            return;
        }
        let window = self.spec.load_window;
        let s = &mut self.ranks[r as usize];
        let idle = s.loads_started == s.loads_done;
        let in_window = window == 0 || s.loads_started < self.layers_done.saturating_add(window);
        if idle && s.loads_started < self.spec.n_layers && in_window {
            s.loads_started += 1;
            out.push(Action::Load(r));
        }
    }

    fn try_attn(&mut self, r: u32, ready: &mut VecDeque<ForwardStep>, out: &mut Vec<Action>) {
        let layer = self.layers_done;
        let rank = &self.spec.ranks[r as usize];
        let s = &mut self.ranks[r as usize];
        let loaded = rank.load.is_none() || s.loads_done > layer;
        if layer < self.spec.n_layers && s.attn_started == layer && loaded {
            s.attn_started += 1;
            if rank.attn_ns == 0 {
                ready.push_back(ForwardStep::Attn(r));
            } else {
                out.push(Action::Attn(r));
            }
        }
    }

    fn try_store(&mut self, r: u32, out: &mut Vec<Action>) {
        if self.spec.ranks[r as usize].store.is_none() {
            return;
        }
        let s = &mut self.ranks[r as usize];
        if s.stores_started == s.stores_done && s.stores_started < s.attn_done {
            s.stores_started += 1;
            out.push(Action::Store(r));
        }
    }

    fn start_shared(&mut self, ready: &mut VecDeque<ForwardStep>, out: &mut Vec<Action>) {
        self.shared_left = self.shared_pieces;
        if self.spec.ffn_ns > 0 {
            out.push(Action::Ffn);
        }
        out.extend((0..self.spec.collectives.len() as u32).map(Action::Collective));
        if self.shared_left == 0 {
            self.finish_layer(ready, out);
        }
    }

    fn finish_layer(&mut self, ready: &mut VecDeque<ForwardStep>, out: &mut Vec<Action>) {
        self.layers_done += 1;
        self.attn_ready = 0;
        if self.layers_done == self.spec.n_layers {
            return;
        }
        for r in 0..self.ranks.len() as u32 {
            if self.spec.load_window > 0 {
                self.try_load(r, out);
            }
            self.try_attn(r, ready, out);
        }
    }
}

/// Counters of the work forwards created inside the core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardStats {
    /// Forwards submitted.
    pub forwards: u64,
    /// Transfers (flows) started on behalf of forwards: loads, stores, collectives.
    pub transfers: u64,
    /// Compute delays put on the event queue (attention and shared phases that take time).
    pub delays: u64,
    /// Pieces that took no time and were completed without an event.
    pub instant_steps: u64,
}

/// The forwards in progress: a slab with a free list, so ids are small and reused deterministically.
#[derive(Default)]
pub(crate) struct Forwards {
    slots: Vec<Option<Forward>>,
    free: Vec<u32>,
    /// Pieces finished at the current instant, not applied yet (reused between calls).
    ready: VecDeque<ForwardStep>,
    pub stats: ForwardStats,
}

impl Forwards {
    /// Take in a forward submitted at `now` (already checked); returns its id.
    pub fn insert(&mut self, spec: ForwardSpec, tag: u64, now: TimeNs) -> u32 {
        self.stats.forwards += 1;
        let forward = Forward::new(spec, tag, now);
        match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = Some(forward);
                id
            }
            None => {
                self.slots.push(Some(forward));
                (self.slots.len() - 1) as u32
            }
        }
    }

    pub fn get(&self, id: u32) -> &Forward {
        self.slots[id as usize].as_ref().expect("a live forward")
    }

    /// Start forward `id`: push what must be started to `out`. Returns true if it is already done.
    pub fn begin(&mut self, id: u32, out: &mut Vec<Action>) -> bool {
        let mut ready = std::mem::take(&mut self.ready);
        let forward = self.slots[id as usize].as_mut().expect("a live forward");
        forward.begin(&mut ready, out);
        self.drain(id, ready, 0, out)
    }

    /// A piece of forward `id` finished now: push what must be started next to `out`. Returns true if
    /// the forward is done (then `out` is empty: nothing of it is left to start).
    pub fn on_step(&mut self, id: u32, step: ForwardStep, out: &mut Vec<Action>) -> bool {
        let mut ready = std::mem::take(&mut self.ready);
        ready.push_back(step);
        self.drain(id, ready, 1, out)
    }

    /// Apply the pieces finished at this instant, and those they finish in turn, in FIFO order. The
    /// first `from_events` of `ready` came from events; the others took no time.
    fn drain(&mut self, id: u32, mut ready: VecDeque<ForwardStep>, from_events: u64, out: &mut Vec<Action>) -> bool {
        let forward = self.slots[id as usize].as_mut().expect("a live forward");
        let mut applied = 0u64;
        while let Some(step) = ready.pop_front() {
            applied += 1;
            forward.apply(step, &mut ready, out);
        }
        self.stats.instant_steps += applied - from_events;
        self.ready = ready;
        for a in out.iter() {
            match a {
                Action::Attn(_) | Action::Ffn => self.stats.delays += 1,
                _ => self.stats.transfers += 1,
            }
        }
        forward.is_done()
    }

    /// Forget a finished forward; returns it.
    pub fn remove(&mut self, id: u32) -> Forward {
        let forward = self.slots[id as usize].take().expect("a live forward");
        self.free.push(id);
        forward
    }

    /// Forwards submitted and not completed.
    pub fn live(&self) -> u64 {
        (self.slots.len() - self.free.len()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(size_bytes: u64) -> Option<LayerTransfer> {
        Some(LayerTransfer { path: vec![0], lane: 0, size_bytes })
    }

    #[test]
    fn total_bytes_counts_every_layer_and_detects_overflow() {
        let spec = ForwardSpec {
            n_layers: 3,
            ranks: vec![ForwardRank { load: t(10), attn_ns: 1, store: t(5) }, ForwardRank::default()],
            collectives: vec![LayerTransfer { path: vec![1], lane: 0, size_bytes: 7 }],
            ..ForwardSpec::default()
        };
        assert_eq!(spec.total_bytes(), Some(3 * 22));
        let huge = ForwardSpec {
            n_layers: 2,
            ranks: vec![ForwardRank { load: t(u64::MAX / 2 + 1), ..Default::default() }],
            ..spec
        };
        assert_eq!(huge.total_bytes(), None);
        assert!(huge.check_shape().unwrap_err().message.starts_with("size_bytes"));
    }

    /// Drive a forward by hand: the state machine emits what takes time, in a fixed order.
    #[test]
    fn the_state_machine_emits_pieces_in_dependency_order() {
        let spec = ForwardSpec {
            n_layers: 2,
            ranks: vec![
                ForwardRank { load: t(1), attn_ns: 5, store: t(1) },
                ForwardRank { load: None, attn_ns: 0, store: t(0) },
            ],
            ffn_ns: 3,
            collectives: vec![LayerTransfer { path: vec![1], lane: 0, size_bytes: 0 }],
            load_window: 0,
        };
        let mut fw = Forwards::default();
        let id = fw.insert(spec, 9, 0);
        let mut out = Vec::new();
        // Rank 1 has no load and no attention time: its attention of layer 0 is done at once.
        assert!(!fw.begin(id, &mut out));
        assert_eq!(out, vec![Action::Load(0)]);
        out.clear();
        assert!(!fw.on_step(id, ForwardStep::Load(0), &mut out));
        assert_eq!(out, vec![Action::Load(0), Action::Attn(0)]);
        out.clear();
        assert!(!fw.on_step(id, ForwardStep::Load(0), &mut out));
        assert!(out.is_empty(), "loads of every layer done; layer 1's attention waits for layer 0");
        // Rank 0's attention ends: its store starts and the shared phase (only the delay: the zero-byte
        // collective is dropped).
        assert!(!fw.on_step(id, ForwardStep::Attn(0), &mut out));
        assert_eq!(out, vec![Action::Store(0), Action::Ffn]);
        out.clear();
        assert!(!fw.on_step(id, ForwardStep::Shared, &mut out));
        assert_eq!(out, vec![Action::Attn(0)], "layer 1: rank 0's attention (rank 1's took no time)");
        out.clear();
        assert!(!fw.on_step(id, ForwardStep::Attn(0), &mut out));
        assert_eq!(out, vec![Action::Ffn], "store 1 waits for store 0");
        out.clear();
        assert!(!fw.on_step(id, ForwardStep::Shared, &mut out));
        assert!(out.is_empty());
        assert!(!fw.on_step(id, ForwardStep::Store(0), &mut out));
        assert_eq!(out, vec![Action::Store(0)]);
        out.clear();
        assert!(fw.on_step(id, ForwardStep::Store(0), &mut out), "last layer and last store done");
        assert!(out.is_empty());
        assert_eq!(fw.stats.transfers, 4);
        assert_eq!(fw.stats.delays, 4);
        assert_eq!(fw.stats.instant_steps, 2, "rank 1's two attentions");
        let f = fw.remove(id);
        assert_eq!((f.tag, f.size_bytes), (9, 4));
        assert_eq!(fw.live(), 0);
    }

    #[test]
    fn a_load_window_holds_loads_back_until_the_layer_window_ago_finished() {
        let spec = ForwardSpec {
            n_layers: 3,
            ranks: vec![ForwardRank { load: t(1), attn_ns: 1, store: None }],
            load_window: 1,
            ..ForwardSpec::default()
        };
        let mut fw = Forwards::default();
        let id = fw.insert(spec, 0, 0);
        let mut out = Vec::new();
        fw.begin(id, &mut out);
        assert_eq!(out, vec![Action::Load(0)]);
        out.clear();
        fw.on_step(id, ForwardStep::Load(0), &mut out);
        assert_eq!(out, vec![Action::Attn(0)], "load 1 waits for layer 0 to finish");
        out.clear();
        fw.on_step(id, ForwardStep::Attn(0), &mut out);
        assert_eq!(out, vec![Action::Load(0)], "layer 0 finished (no shared work): load 1 starts");
    }
}
