//! Ports and multi-hop transfers: the fluid rate model of the data plane.
//!
//! A *port* is one direction of a resource (a NIC's transmit or receive side, a PCIe direction, host DRAM,
//! the storage cluster) with a sustained rate, a lane arbiter (`lanes.rs`), and optionally a token bucket
//! that lets it run at a higher peak (line) rate while tokens last. A *transfer* moves bytes on one lane
//! along a path of ports.
//!
//! Rate model:
//! - Transfers with the same path and lane form a *group* and share its rate equally (processor sharing).
//!   The group keeps the cumulative service one of its flows has received; a flow ends when that reaches
//!   its value at the flow's arrival plus the flow's size. A rate change therefore touches one number per
//!   group, never one per transfer.
//! - Rates across groups are the fixed point of a per-port *advertised rate* (the distributed max-min
//!   algorithm of Charny et al., generalised to lanes): every port `p` advertises `mu[p][lane]`, the
//!   per-flow rate it offers to flows not held back elsewhere; a flow's rate is the minimum advertisement
//!   on its path. A port computes its advertisements from its capacity, its arbiter's work-conserving
//!   allocation among lanes (a lane's demand is the sum over its flows of what the rest of their path
//!   allows) and water filling among the flows of a lane. So a port serves lanes by their priority and
//!   weights, flows within a lane max-min fairly, and capacity a flow cannot use goes to the others.
//! - A change (arrival, completion, bucket running dry) recomputes the ports on the changed path and
//!   propagates only to ports whose inputs change, so an event costs a few port recomputations, not a
//!   global solve. Completion times are exact to the nanosecond between changes; nothing ticks.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, VecDeque};

use rustc_hash::FxHashMap;

use crate::events::{EventKind, EventQueue, TimeNs, END_NS};
use crate::forward::ForwardStep;
use crate::lanes::{Lane, LaneShares, VlArbitration, MAX_LANES};
use crate::{CoreError, ErrorKind, Result};

/// Index of a port, in the order ports were added.
pub type PortId = u32;
type GroupId = u32;

const NS_PER_S: f64 = 1e9;
const INF: f64 = f64::INFINITY;
const DETACHED: u32 = u32::MAX;
/// Relative change below which an advertised rate counts as unchanged (stops propagation on noise).
const REL_TOL: f64 = 1e-12;
/// Recomputations of one port within one change after which its updates are damped (see recompute_port).
const DAMP_AFTER_VISITS: u32 = 8;
/// Recomputations of one port within one change after which it stops propagating (see `recompute`).
const MAX_VISITS: u32 = 256;
/// How often (in recomputations of a port) its demand cache is recomputed exactly from its members.
const EXACT_DEMAND_EVERY: u32 = 32;
/// Emptyings per generation of idle groups, at least (see `sweep_idle_groups`).
const IDLE_GENERATION: usize = 4096;
/// Relative load above capacity that counts as an overload (float rounding stays far below it).
const OVERLOAD_TOL: f64 = 1e-9;

/// The slowest sustained rate a port may have (bytes/s). Rates are bounded on both sides so that lane
/// shares, water levels and their sums stay far inside the f64 range (a 1e308 B/s port made them inf).
pub const MIN_RATE_BYTES_PER_S: f64 = 1.0;
/// The fastest rate (sustained or peak) a port may have: 1 EB/s, a million times a 400 Gb/s NIC.
pub const MAX_RATE_BYTES_PER_S: f64 = 1e18;
/// The deepest token bucket a port may have (bytes).
pub const MAX_BURST_BYTES: f64 = 1e18;

/// Utilisation samples all series of a network hold together, at most (ports × series × samples, counting
/// each port's all-lane series and one per lane in use as one series each): about 8 MB of samples per
/// series-port, however long the run.
pub const SAMPLE_BUDGET: u64 = 1 << 20;
/// Samples of one series at most, and at least (whatever the number of ports).
pub const MAX_SAMPLES_PER_SERIES: u64 = 1 << 16;
pub const MIN_SAMPLES_PER_SERIES: u64 = 256;

/// What a port is: its name, rates, bucket, packet size and lane arbitration.
#[derive(Clone, Debug)]
pub struct PortSpec {
    pub name: String,
    /// Sustained rate: the token bucket's fill rate, and the port's capacity once the bucket is empty.
    pub rate_bytes_per_s: f64,
    /// Line rate while the bucket has tokens; equal to `rate_bytes_per_s` for a plain port (no bucket).
    pub peak_bytes_per_s: f64,
    /// Token-bucket depth: how far the port may run ahead of its sustained rate.
    pub burst_bytes: f64,
    /// Packet size the lane arbiter's weights are quantised by.
    pub mtu_bytes: u32,
    pub arbitration: VlArbitration,
}

impl PortSpec {
    /// A plain port: no burst above `rate`, 4 KiB packets, no QoS (all lanes equal).
    pub fn plain(name: impl Into<String>, rate_bytes_per_s: f64) -> Self {
        Self {
            name: name.into(),
            rate_bytes_per_s,
            peak_bytes_per_s: rate_bytes_per_s,
            burst_bytes: 0.0,
            mtu_bytes: 4096,
            arbitration: VlArbitration::fair(15),
        }
    }

    fn validate(&self) -> Result<()> {
        let ok_rate = |x: f64| (MIN_RATE_BYTES_PER_S..=MAX_RATE_BYTES_PER_S).contains(&x);
        if self.name.is_empty() {
            return Err(CoreError::invalid("name", "a non-empty port name"));
        }
        if !ok_rate(self.rate_bytes_per_s) {
            return Err(CoreError::invalid(
                "rate_bytes_per_s",
                format!(
                    "a rate in [{MIN_RATE_BYTES_PER_S:e}, {MAX_RATE_BYTES_PER_S:e}] for port {:?}, got {}",
                    self.name, self.rate_bytes_per_s
                ),
            ));
        }
        if !ok_rate(self.peak_bytes_per_s) || self.peak_bytes_per_s < self.rate_bytes_per_s {
            return Err(CoreError::invalid(
                "peak_bytes_per_s",
                format!(
                    "a rate in [rate_bytes_per_s ({}), {MAX_RATE_BYTES_PER_S:e}] for port {:?}, got {}",
                    self.rate_bytes_per_s, self.name, self.peak_bytes_per_s
                ),
            ));
        }
        if !(0.0..=MAX_BURST_BYTES).contains(&self.burst_bytes) {
            return Err(CoreError::invalid(
                "burst_bytes",
                format!("a size in [0, {MAX_BURST_BYTES:e}] for port {:?}, got {}", self.name, self.burst_bytes),
            ));
        }
        if self.mtu_bytes == 0 {
            return Err(CoreError::invalid("mtu_bytes", format!("> 0 for port {:?}", self.name)));
        }
        self.arbitration.validate()
    }

    fn has_bucket(&self) -> bool {
        self.peak_bytes_per_s > self.rate_bytes_per_s && self.burst_bytes > 0.0
    }
}

/// Who a flow belongs to: a user transfer (with the caller's tag), a storage I/O of the core, or a piece
/// of a forward pass (`forward.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    User(u64),
    Io(u32),
    Forward { forward: u32, step: ForwardStep },
}

/// A transfer that has moved its last byte.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Finished {
    pub owner: Owner,
    /// The transfer's group: its path with its lane ([`Network::group_path`]).
    pub group: u32,
    pub lane: Lane,
    pub size_bytes: u64,
    pub start_ns: TimeNs,
    pub end_ns: TimeNs,
}

/// Counters of one port, from which every utilisation metric is computed.
#[derive(Clone, Debug, Default)]
pub struct PortCounters {
    /// Integral of each lane's rate over time (what actually crossed the port, so far).
    pub fluid_bytes: [f64; MAX_LANES],
    /// Sizes of finished transfers that crossed this port, per lane (exact integers).
    pub completed_bytes: [u64; MAX_LANES],
    /// Time during which any byte was moving through the port.
    pub busy_s: f64,
    /// Bytes per sampling interval, all lanes (empty if sampling is off).
    pub samples: Vec<f64>,
    /// Bytes per sampling interval for each lane that ever carried traffic.
    pub lane_samples: Vec<(Lane, Vec<f64>)>,
    /// The interval of `samples` and `lane_samples` (ns; 0 before the first sample): the network's
    /// interval at the last settle ([`Network::sample_ns`]).
    pub sample_ns: u64,
}

/// Utilisation sampling in bounded memory: bytes per fixed interval, `base_ns` to start with. Once the
/// clock passes `cap` intervals, adjacent intervals merge in pairs (the interval doubles) as often as
/// needed, so no series ever holds more than `cap` samples, however long the run or short the interval
/// (sampling every nanosecond over a long idle span once asked for 2^64 samples). Merging keeps every
/// byte; every series settled at one time has the same interval, so they stay comparable.
#[derive(Clone, Copy, Debug)]
struct Sampling {
    /// The interval asked for (0 = off).
    base_ns: u64,
    /// Samples per series at most: [`SAMPLE_BUDGET`] shared by the ports (see `Network::add_port`).
    cap: u64,
}

impl Sampling {
    /// The interval at time `now`: the smallest `base_ns × 2^k` that covers `now` in at most `cap` samples.
    /// Never decreases as `now` grows (and `cap` only shrinks), and every value divides the later ones.
    ///
    /// `ceil(now / i) <= cap` is `now <= cap * i`, so this is `base_ns × 2^k` for the smallest `k` with
    /// `2^k >= ceil(now / (base_ns × cap))`, saturating at `u64::MAX`: one division, not one per doubling
    /// (it runs on every settle of a busy port).
    fn interval_at(self, now: TimeNs) -> u64 {
        let base = self.base_ns;
        let Some(span) = base.checked_mul(self.cap) else { return base };
        if now <= span {
            return base;
        }
        let doublings = u64::BITS - (now.div_ceil(span) - 1).leading_zeros();
        1u64.checked_shl(doublings).and_then(|factor| base.checked_mul(factor)).unwrap_or(u64::MAX)
    }
}

struct Port {
    spec: PortSpec,
    shares: LaneShares,
    /// Current capacity: the peak while the bucket has tokens, the sustained rate otherwise (each × `factor`).
    capacity: f64,
    /// What a fault leaves of the port's rates (`Network::set_port_factor`): 1 as specified, 0 down.
    factor: f64,
    /// Added to every transfer and storage I/O whose path crosses the port (`Network::set_port_latency`).
    extra_latency_ns: u64,
    tokens: f64,
    bucket_version: u64,
    /// The groups with flows crossing this port, with what recomputing the port needs of them kept here,
    /// contiguous, so a recomputation is one pass over this array.
    members: Vec<Member>,
    /// Bit l set when `mu[l]` is finite.
    bottleneck_lanes: u16,
    /// Cached demand per lane: sum over member flows of what the rest of their path allows (finite
    /// part), and the number of flows nothing else limits. Kept in step with every change so a port that
    /// holds nothing back can prove in O(lanes) that it still does not, without visiting its members.
    demand: [f64; MAX_LANES],
    unbounded_flows: [i64; MAX_LANES],
    usage: [f64; MAX_LANES],
    /// Bit l set when `usage[l] > 0`.
    busy_lanes: u16,
    /// Member groups per lane, and the lanes that have any.
    lane_members: [u32; MAX_LANES],
    member_lanes: u16,
    /// Recomputations left before the demand cache is added up again exactly.
    exact_in: u32,
    total_usage: f64,
    settled_at: TimeNs,
    counters: PortCounters,
    queued: bool,
    /// Recomputations of this port during the current `recompute`, and the direction of each lane's
    /// last change in it (to recognise an alternation).
    visits: u32,
    last_step: [i8; MAX_LANES],
    /// In `Network::raised` (its load went up in the current `apply_rates`).
    raised: bool,
}

impl Port {
    /// The sustained rate as a fault leaves it (× 1.0 is exact: no fault, no change).
    fn sustained_rate(&self) -> f64 {
        self.spec.rate_bytes_per_s * self.factor
    }

    fn peak_rate(&self) -> f64 {
        self.spec.peak_bytes_per_s * self.factor
    }
}

/// A group as one of its ports sees it.
#[derive(Clone, Copy, Debug)]
struct Member {
    group: GroupId,
    /// Index of this port in the group's path.
    pos: u32,
    lane: Lane,
    /// Flows in the group (as f64: it only ever multiplies rates).
    flows: f64,
    /// What the rest of the group's path allows one flow: the minimum advertisement of its other ports.
    /// Kept exact: every advertisement change updates it where it matters.
    ext: f64,
}

#[derive(Debug)]
struct Flow {
    /// Group service (bytes per flow) at which this flow is done.
    finish: f64,
    seq: u64,
    owner: Owner,
    size_bytes: u64,
    start_ns: TimeNs,
}

impl PartialEq for Flow {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Flow {}
impl PartialOrd for Flow {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Flow {
    fn cmp(&self, other: &Self) -> Ordering {
        self.finish.total_cmp(&other.finish).then(self.seq.cmp(&other.seq))
    }
}

struct Group {
    path: Box<[PortId]>,
    /// Index of this group in `ports[path[i]].members`, or DETACHED while the group is empty.
    slots: Box<[u32]>,
    lane: Lane,
    flows: BinaryHeap<Reverse<Flow>>,
    /// Per-flow rate (bytes/s).
    rate: f64,
    /// `flows.len() * rate` as last charged to the ports' usage.
    charged: f64,
    /// Cumulative per-flow service (bytes) at `service_at`.
    service: f64,
    service_at: TimeNs,
    dirty: bool,
    /// Its next completion lies past [`END_NS`] at the current rate (counted in `overflowed_groups`).
    overflowed: bool,
    /// In `Network::idle_new` or `idle_old`.
    idle: bool,
    /// The generation of idle groups in which it last went empty.
    emptied_in: u32,
}

impl Group {
    fn settle(&mut self, now: TimeNs) {
        if now > self.service_at {
            self.service += self.rate * (now - self.service_at) as f64 / NS_PER_S;
            self.service_at = now;
        }
    }
}

/// Counters about the rate computation itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Port recomputations done.
    pub port_recomputes: u64,
    /// Changes after which some port hit its recomputation cap (see `recompute`).
    pub non_converged: u64,
    /// Flows finished.
    pub finished: u64,
    /// Recomputations answered from the demand cache (the port provably holds nothing back).
    pub skipped_recomputes: u64,
    /// Ports scaled down because the iteration stopped short of its fixed point.
    pub overload_repairs: u64,
}

/// All ports and in-flight transfers.
pub struct Network {
    ports: Vec<Port>,
    /// Advertised per-flow rate of each port per lane (INF: the port does not hold the lane back).
    /// Kept apart from `ports` because it is the hottest data: read for every member on every recompute.
    mu: Vec<[f64; MAX_LANES]>,
    by_name: HashMap<String, PortId>,
    /// Groups with flows in flight, and empty ones not freed yet: every so often the empty ones are freed
    /// and their slots reused, so memory follows the number of paths in use, not the number ever used.
    groups: Vec<Group>,
    /// Groups that went empty in this generation and in the one before (some may have flows again);
    /// see `sweep_idle_groups`.
    idle_new: Vec<GroupId>,
    idle_old: Vec<GroupId>,
    generation: u32,
    /// Groups with flows (attached to their ports).
    busy_groups: usize,
    /// Slots of freed groups, reused (last freed first) by new groups.
    free_groups: Vec<GroupId>,
    /// Group of each (path, lane) in use, keyed by the path's port ids followed by the lane.
    group_of: FxHashMap<Box<[u32]>, GroupId>,
    /// Reused lookup key for `group_of`, so finding a group allocates nothing.
    key: Vec<u32>,
    worklist: VecDeque<PortId>,
    dirty_groups: Vec<GroupId>,
    bucket_ports: Vec<PortId>,
    next_flow_seq: u64,
    active_flows: u64,
    sampling: Sampling,
    /// The sampling interval as of the last `settle_all`.
    sample_ns: u64,
    scratch: Vec<(f64, f64)>,
    /// Ports recomputed during the current `recompute` (to reset their visit counts).
    visited: Vec<PortId>,
    /// Ports whose load went up during the current `apply_rates`.
    raised: Vec<PortId>,
    /// The last transfer whose end fell past the last representable time: what would end when.
    time_overflow: Option<String>,
    /// Groups whose next completion lies past [`END_NS`] at their current rate.
    overflowed_groups: u32,
    /// Ports with a latency fault (`set_port_latency`): only while there are any is a path's latency added up.
    latency_ports: u32,
    pub stats: NetStats,
}

impl Network {
    /// `sample_ns` is the utilisation sampling interval to start with (0 = no samples; see `Sampling`).
    pub fn new(sample_ns: u64) -> Self {
        Self {
            ports: Vec::new(),
            mu: Vec::new(),
            by_name: HashMap::new(),
            groups: Vec::new(),
            idle_new: Vec::new(),
            idle_old: Vec::new(),
            generation: 0,
            busy_groups: 0,
            free_groups: Vec::new(),
            group_of: FxHashMap::default(),
            key: Vec::new(),
            worklist: VecDeque::new(),
            dirty_groups: Vec::new(),
            bucket_ports: Vec::new(),
            next_flow_seq: 0,
            active_flows: 0,
            sampling: Sampling { base_ns: sample_ns, cap: MAX_SAMPLES_PER_SERIES },
            sample_ns,
            scratch: Vec::new(),
            visited: Vec::new(),
            raised: Vec::new(),
            time_overflow: None,
            overflowed_groups: 0,
            latency_ports: 0,
            stats: NetStats::default(),
        }
    }

    pub fn add_port(&mut self, spec: PortSpec, now: TimeNs) -> Result<PortId> {
        spec.validate()?;
        if self.by_name.contains_key(&spec.name) {
            return Err(CoreError::invalid("name", format!("a new port name, {:?} already exists", spec.name)));
        }
        let shares = spec.arbitration.rate_model(spec.mtu_bytes)?;
        let id = PortId::try_from(self.ports.len()).map_err(|_| CoreError::invalid("name", "too many ports"))?;
        let (capacity, tokens) =
            if spec.has_bucket() { (spec.peak_bytes_per_s, spec.burst_bytes) } else { (spec.rate_bytes_per_s, 0.0) };
        self.by_name.insert(spec.name.clone(), id);
        // The sample budget is shared: more ports, fewer samples each (and so, on long runs, wider ones).
        let ports = u64::from(id) + 1;
        self.sampling.cap = (SAMPLE_BUDGET / ports).clamp(MIN_SAMPLES_PER_SERIES, MAX_SAMPLES_PER_SERIES);
        self.mu.push([INF; MAX_LANES]);
        self.ports.push(Port {
            spec,
            shares,
            capacity,
            factor: 1.0,
            extra_latency_ns: 0,
            tokens,
            bucket_version: 0,
            members: Vec::new(),
            bottleneck_lanes: 0,
            demand: [0.0; MAX_LANES],
            unbounded_flows: [0; MAX_LANES],
            usage: [0.0; MAX_LANES],
            busy_lanes: 0,
            lane_members: [0; MAX_LANES],
            member_lanes: 0,
            exact_in: 0,
            total_usage: 0.0,
            settled_at: now,
            counters: PortCounters::default(),
            queued: false,
            visits: 0,
            last_step: [0; MAX_LANES],
            raised: false,
        });
        Ok(id)
    }

    pub fn port_id(&self, name: &str) -> Result<PortId> {
        self.by_name.get(name).copied().ok_or_else(|| CoreError::unknown("port", format!("{name:?}")))
    }

    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    pub fn port_spec(&self, port: PortId) -> Result<&PortSpec> {
        Ok(&self.port(port)?.spec)
    }

    fn port(&self, port: PortId) -> Result<&Port> {
        self.ports.get(port as usize).ok_or_else(|| CoreError::unknown("port", port))
    }

    /// Check that a transfer on `lane` along `path` could ever move.
    pub fn validate_path(&self, path: &[PortId], lane: Lane) -> Result<()> {
        if (lane as usize) < MAX_LANES && self.in_use(path, lane) {
            return Ok(()); // checked when its group was made, and ports never change
        }
        self.check_path(path, lane)
    }

    /// [`Network::validate_path`] in full.
    fn check_path(&self, path: &[PortId], lane: Lane) -> Result<()> {
        if path.is_empty() {
            return Err(CoreError::invalid("path", "at least one port"));
        }
        if lane as usize >= MAX_LANES {
            return Err(CoreError::invalid("lane", format!("a lane in 0..{MAX_LANES}, got {lane}")));
        }
        for (i, &p) in path.iter().enumerate() {
            let port = self
                .port(p)
                .map_err(|_| CoreError { kind: ErrorKind::Unknown, message: format!("path: unknown port {p}") })?;
            if path[..i].contains(&p) {
                return Err(CoreError::invalid(
                    "path",
                    format!("each port once, port {:?} appears twice", port.spec.name),
                ));
            }
            if !port.shares.serves(lane) {
                return Err(CoreError::invalid(
                    "lane",
                    format!(
                        "a lane that port {:?} serves; its arbitration gives lane {lane} no weight",
                        port.spec.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether a group of (`path`, `lane`) exists: one lookup, allocating nothing for paths of usual length.
    fn in_use(&self, path: &[PortId], lane: Lane) -> bool {
        let mut key = [0u32; 16];
        if path.len() >= key.len() {
            return false; // a full check instead
        }
        key[..path.len()].copy_from_slice(path);
        key[path.len()] = lane as u32;
        self.group_of.contains_key(&key[..=path.len()])
    }

    /// Start a transfer of `size_bytes` (> 0) at `now`. Rates are recomputed by the next `recompute`.
    pub fn add_flow(&mut self, path: &[PortId], lane: Lane, size_bytes: u64, owner: Owner, now: TimeNs) -> Result<()> {
        self.add_flow_since(path, lane, size_bytes, owner, now, now)
    }

    /// [`Network::add_flow`] for a transfer submitted at `start_ns` (<= `now`) that starts moving bytes only
    /// now (it waited in a FIFO queue, [`Network::fifo_wait_ns`]): its [`Finished::start_ns`] is `start_ns`.
    pub fn add_flow_since(
        &mut self,
        path: &[PortId],
        lane: Lane,
        size_bytes: u64,
        owner: Owner,
        start_ns: TimeNs,
        now: TimeNs,
    ) -> Result<()> {
        debug_assert!(start_ns <= now, "a flow submitted after it starts");
        self.key.clear();
        self.key.extend_from_slice(path);
        self.key.push(lane as u32);
        let found = self.group_of.get(self.key.as_slice()).copied();
        if found.is_none() {
            // A path in use was validated when its group was made (ports never change), so only a new
            // one is checked; the size check comes after the path's, as it always did.
            self.check_path(path, lane)?;
        }
        if size_bytes == 0 {
            return Err(CoreError::invalid(
                "size_bytes",
                "> 0 for a flow (zero-byte transfers never reach the network)",
            ));
        }
        let gid = match found {
            Some(g) => g,
            None => {
                let group = Group {
                    path: path.into(),
                    slots: vec![DETACHED; path.len()].into(),
                    lane,
                    flows: BinaryHeap::new(),
                    rate: 0.0,
                    charged: 0.0,
                    service: 0.0,
                    service_at: now,
                    dirty: false,
                    overflowed: false,
                    idle: false,
                    emptied_in: 0,
                };
                let g = match self.free_groups.pop() {
                    Some(g) => {
                        // Keep the freed group's flow heap: its allocation fits the next group as well.
                        let flows = std::mem::take(&mut self.groups[g as usize].flows);
                        self.groups[g as usize] = Group { flows, ..group };
                        g
                    }
                    None => {
                        self.groups.push(group);
                        (self.groups.len() - 1) as GroupId
                    }
                };
                self.group_of.insert(self.key.as_slice().into(), g);
                g
            }
        };
        let group = &mut self.groups[gid as usize];
        if group.flows.is_empty() {
            self.busy_groups += 1;
            group.service = 0.0;
            group.service_at = now;
            for (i, &p) in group.path.iter().enumerate() {
                let ext = group
                    .path
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .map(|(_, &q)| self.mu[q as usize][lane as usize])
                    .fold(INF, f64::min);
                let port = &mut self.ports[p as usize];
                group.slots[i] = port.members.len() as u32;
                port.members.push(Member { group: gid, pos: i as u32, lane, flows: 0.0, ext });
                port.lane_members[lane as usize] += 1;
                port.member_lanes |= 1 << lane;
            }
        } else {
            group.settle(now);
        }
        let seq = self.next_flow_seq;
        self.next_flow_seq += 1;
        group.flows.push(Reverse(Flow { finish: group.service + size_bytes as f64, seq, owner, size_bytes, start_ns }));
        self.active_flows += 1;
        self.add_group_demand(gid, 1.0);
        self.touch_group(gid, true);
        Ok(())
    }

    /// `flows` more (or fewer, if negative) flows of group `gid` at every port of its path.
    fn add_group_demand(&mut self, gid: GroupId, flows: f64) {
        let group = &self.groups[gid as usize];
        for (&p, &slot) in group.path.iter().zip(group.slots.iter()) {
            let port = &mut self.ports[p as usize];
            let member = &mut port.members[slot as usize];
            member.flows += flows;
            let (lane, ext) = (member.lane, member.ext);
            add_demand(port, lane, flows, ext);
        }
    }

    /// Mark a group's rate for recomputation and its ports for re-allocation.
    fn touch_group(&mut self, gid: GroupId, demand_may_rise: bool) {
        let group = &mut self.groups[gid as usize];
        if !group.dirty {
            group.dirty = true;
            self.dirty_groups.push(gid);
        }
        for i in 0..group.path.len() {
            let p = self.groups[gid as usize].path[i];
            self.enqueue(p, demand_may_rise);
        }
    }

    fn enqueue(&mut self, p: PortId, demand_may_rise: bool) {
        let port = &mut self.ports[p as usize];
        // A port that holds nothing back stays that way when its demand only falls.
        if port.queued || (!demand_may_rise && port.bottleneck_lanes == 0) {
            return;
        }
        port.queued = true;
        self.worklist.push_back(p);
    }

    /// The FIFO backlog a latency-sensitive message meets on `lane` at `port` at `now` (the lane's per-port
    /// FIFO of packets, which the fluid model otherwise leaves out): `(queued_bytes, serving_rate)`.
    /// `queued_bytes` is the sum over the flows crossing the port on that lane of `min(remaining bytes,
    /// outstanding_bytes)` (a bulk sender has at most its posted work requests, `outstanding_bytes`, queued
    /// ahead); `serving_rate` is the rate the port serves that lane at now (the sum of the lane's flow
    /// rates), or its capacity if that is 0. Rates must be current (no `recompute` pending).
    pub fn lane_backlog(&self, port: PortId, lane: Lane, outstanding_bytes: u64, now: TimeNs) -> Result<(f64, f64)> {
        let p = self.port(port)?;
        if lane as usize >= MAX_LANES {
            return Err(CoreError::invalid("lane", format!("a lane in 0..{MAX_LANES}, got {lane}")));
        }
        let cap = outstanding_bytes as f64;
        let mut queued = 0.0;
        // Members in slot order and flows in heap order: both follow the sequence of operations only,
        // so the sum (and the wait made of it) is the same on every run.
        for m in p.members.iter().filter(|m| m.lane == lane) {
            let group = &self.groups[m.group as usize];
            let service = group.service + group.rate * now.saturating_sub(group.service_at) as f64 / NS_PER_S;
            queued += group.flows.iter().map(|Reverse(f)| (f.finish - service).clamp(0.0, cap)).sum::<f64>();
        }
        let lane_rate = p.usage[lane as usize];
        Ok((queued, if lane_rate > 0.0 { lane_rate } else { p.capacity }))
    }

    /// How long a latency-sensitive message on `lane` along `path` submitted at `now` waits behind the bulk
    /// data already queued on its lane before it moves (ns, rounded up): `max_p Q_p / r_p` over the ports of
    /// its path, `(Q_p, r_p)` from [`Network::lane_backlog`]. 0 where its lane holds no flow on any of its
    /// ports. Rates must be current (no `recompute` pending).
    pub fn fifo_wait_ns(&self, path: &[PortId], lane: Lane, outstanding_bytes: u64, now: TimeNs) -> Result<u64> {
        let mut wait_s: f64 = 0.0;
        for &p in path {
            let (queued, rate) = self.lane_backlog(p, lane, outstanding_bytes, now)?;
            if queued > 0.0 {
                wait_s = wait_s.max(queued / rate);
            }
        }
        let ns = ceil_ns(wait_s * NS_PER_S);
        Ok(if ns >= u64::MAX as f64 { u64::MAX } else { ns as u64 })
    }

    /// Handle a group's completion event: finish the flows that are done. Returns false for an unknown group.
    pub fn on_group_event(&mut self, gid: u32, now: TimeNs, out: &mut Vec<Finished>) -> bool {
        let Some(group) = self.groups.get_mut(gid as usize) else { return false };
        group.settle(now);
        // Completion times are rounded up to the nanosecond, so allow a nanosecond's worth of service.
        let tolerance = group.rate * 1e-9 + 1e-9;
        let (mut done, mut done_bytes) = (0u64, 0u64);
        while let Some(Reverse(top)) = group.flows.peek() {
            if top.finish > group.service + tolerance {
                break;
            }
            let Reverse(flow) = group.flows.pop().expect("peeked");
            done_bytes += flow.size_bytes;
            out.push(Finished {
                owner: flow.owner,
                group: gid,
                lane: group.lane,
                size_bytes: flow.size_bytes,
                start_ns: flow.start_ns,
                end_ns: now,
            });
            done += 1;
        }
        self.active_flows -= done;
        self.stats.finished += done;
        if done > 0 {
            // Once per port, not once per flow (integers: the same sums).
            for &p in group.path.iter() {
                self.ports[p as usize].counters.completed_bytes[group.lane as usize] += done_bytes;
            }
            self.add_group_demand(gid, -(done as f64));
        }
        if done > 0 && self.groups[gid as usize].flows.is_empty() {
            self.detach(gid);
        }
        self.touch_group(gid, false);
        true
    }

    fn detach(&mut self, gid: GroupId) {
        self.busy_groups -= 1;
        let path_len = self.groups[gid as usize].path.len();
        for i in 0..path_len {
            let p = self.groups[gid as usize].path[i];
            let slot = self.groups[gid as usize].slots[i];
            let port = &mut self.ports[p as usize];
            let gone = port.members.swap_remove(slot as usize);
            port.lane_members[gone.lane as usize] -= 1;
            if port.lane_members[gone.lane as usize] == 0 {
                port.member_lanes &= !(1 << gone.lane);
            }
            let members = &port.members;
            if let Some(moved) = members.get(slot as usize) {
                self.groups[moved.group as usize].slots[moved.pos as usize] = slot;
            }
            self.groups[gid as usize].slots[i] = DETACHED;
        }
    }

    /// Handle a port's bucket running dry. Returns false if stale.
    pub fn on_bucket_event(&mut self, p: u32, version: u64, now: TimeNs) -> bool {
        let sampling = self.sampling;
        let Some(port) = self.ports.get_mut(p as usize) else { return false };
        if port.bucket_version != version {
            return false;
        }
        settle_port(port, now, sampling);
        port.tokens = 0.0;
        port.capacity = port.sustained_rate();
        self.enqueue(p, true);
        true
    }

    /// Scale port `p`'s rates by `factor` from `now` on: a fault (1: as specified; in (0, 1): degraded; 0:
    /// down, the flows crossing it stall, keeping what they moved, until it is up again). Counters and
    /// utilisation stay relative to the specified rate, so a degraded port shows as less used.
    pub fn set_port_factor(&mut self, p: PortId, factor: f64, now: TimeNs) -> Result<()> {
        if !(0.0..=1.0).contains(&factor) {
            return Err(CoreError::invalid("factor", format!("a number in [0, 1], got {factor}")));
        }
        let sampling = self.sampling;
        let port = self.ports.get_mut(p as usize).ok_or_else(|| CoreError::unknown("port", p))?;
        settle_port(port, now, sampling);
        port.factor = factor;
        port.capacity = if port.spec.has_bucket() && port.tokens >= port.spec.mtu_bytes as f64 {
            port.peak_rate()
        } else {
            port.sustained_rate()
        };
        if port.spec.has_bucket() {
            self.bucket_ports.push(p); // its forecast of running dry is void
        }
        self.enqueue(p, true);
        Ok(())
    }

    /// Add `extra_ns` to every transfer and storage I/O that starts crossing port `p` from now on (a fault:
    /// a slow link or device; 0 removes it). What is already moving is not held back.
    pub fn set_port_latency(&mut self, p: PortId, extra_ns: u64) -> Result<()> {
        let port = self.ports.get_mut(p as usize).ok_or_else(|| CoreError::unknown("port", p))?;
        // Kept as a count, so that clearing every port's faults at a run's end is linear, not quadratic.
        match (port.extra_latency_ns > 0, extra_ns > 0) {
            (false, true) => self.latency_ports += 1,
            (true, false) => self.latency_ports -= 1,
            _ => {}
        }
        port.extra_latency_ns = extra_ns;
        Ok(())
    }

    /// Whether some port has a latency fault now.
    pub fn has_latency_faults(&self) -> bool {
        self.latency_ports > 0
    }

    /// The latency faults add to an operation along `path`: the sum over its ports (0 without any).
    pub fn path_latency_ns(&self, path: &[PortId]) -> u64 {
        if self.latency_ports == 0 {
            return 0;
        }
        path.iter().map(|&q| self.ports.get(q as usize).map_or(0, |p| p.extra_latency_ns)).fold(0, u64::saturating_add)
    }

    /// What a fault left of port `p`'s rates (1 when none).
    pub fn port_factor(&self, p: PortId) -> Result<f64> {
        Ok(self.port(p)?.factor)
    }

    /// Bring rates to the new fixed point after arrivals/completions at `now`, update port usage and
    /// counters, and schedule the affected groups' next completions.
    pub fn recompute(&mut self, now: TimeNs, queue: &mut EventQueue) {
        let mut pops = 0u64;
        let mut gave_up = false;
        while let Some(p) = self.worklist.pop_front() {
            let port = &mut self.ports[p as usize];
            port.queued = false;
            port.visits += 1;
            if port.visits == 1 {
                self.visited.push(p);
            }
            if port.visits > MAX_VISITS {
                // Mixed arbitration along paths can leave a continuum of fixed points that the iteration
                // creeps along; every point on it is feasible and work conserving, so stop here.
                gave_up = true;
                continue;
            }
            pops += 1;
            self.recompute_port(p, now);
        }
        if gave_up {
            self.stats.non_converged += 1;
        }
        self.stats.port_recomputes += pops;
        for p in self.visited.drain(..) {
            self.ports[p as usize].visits = 0;
            self.ports[p as usize].last_step = [0; MAX_LANES];
        }
        self.apply_rates(now, queue);
        self.check_buckets(now, queue);
    }

    fn recompute_port(&mut self, p: PortId, now: TimeNs) {
        let sampling = self.sampling;
        {
            let port = &mut self.ports[p as usize];
            if port.spec.has_bucket() {
                settle_port(port, now, sampling);
                // Back to the peak once at least a packet's worth of tokens has built up.
                port.capacity =
                    if port.tokens >= port.spec.mtu_bytes as f64 { port.peak_rate() } else { port.sustained_rate() };
            }
            if port.exact_in == 0 {
                // Now and then add the demand up again from the members, shedding the rounding the
                // incremental updates of the cache accumulate; in between the cache is the demand.
                let (mut demand, mut unbounded) = ([0.0f64; MAX_LANES], [0i64; MAX_LANES]);
                for m in &port.members {
                    if m.ext.is_finite() {
                        demand[m.lane as usize] += m.flows * m.ext;
                    } else {
                        unbounded[m.lane as usize] += m.flows as i64;
                    }
                }
                (port.demand, port.unbounded_flows, port.exact_in) = (demand, unbounded, EXACT_DEMAND_EVERY);
            }
            port.exact_in -= 1;
            // A port that held nothing back and whose whole demand fits keeps advertising "no limit".
            let fits = port.unbounded_flows.iter().all(|&n| n == 0)
                && port.demand.iter().sum::<f64>() <= port.capacity * (1.0 - 1e-9);
            if port.bottleneck_lanes == 0 && fits {
                self.stats.skipped_recomputes += 1;
                return;
            }
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let port = &mut self.ports[p as usize];
        let member_lanes = port.member_lanes;
        // Lanes with members now, or with an advertisement left from members that have gone.
        let lanes_here: u16 = port.bottleneck_lanes | member_lanes;
        let mut demand = port.demand;
        for l in lanes_of(lanes_here) {
            if port.unbounded_flows[l] > 0 {
                demand[l] = INF;
            }
        }
        let mut alloc = [0.0f64; MAX_LANES];
        if member_lanes.count_ones() == 1 {
            // One lane: the arbiter has nothing to arbitrate (validate_path ensured the lane is served).
            let l = member_lanes.trailing_zeros() as usize;
            alloc[l] = demand[l].min(port.capacity);
        } else {
            port.shares.allocate(port.capacity, &demand, &mut alloc);
        }
        let old = self.mu[p as usize];
        let mut mu = old;
        let mut changed: u16 = 0;
        let mut damped = false;
        for l in lanes_of(lanes_here) {
            let (d, a) = (demand[l], alloc[l]);
            let mut new = if d == 0.0 || (d.is_finite() && a >= d * (1.0 - REL_TOL)) {
                INF
            } else {
                scratch.clear();
                scratch.extend(port.members.iter().filter(|m| m.lane as usize == l).map(|m| (m.ext, m.flows)));
                water_level(&mut scratch, a)
            };
            // Priorities can close a loop with negative feedback (a low lane's share at one port caps a
            // flow that competes with a high lane elsewhere), where the plain iteration alternates
            // between two values forever. When a port's advertisement keeps reversing direction within
            // one change, halving its step turns the alternation into a contraction onto the fixed point.
            if new.is_finite() && old[l].is_finite() && differs(old[l], new) {
                let step: i8 = if new > old[l] { 1 } else { -1 };
                if port.visits > DAMP_AFTER_VISITS && step == -port.last_step[l] {
                    new = 0.5 * (new + old[l]);
                    // A damped value is not this port's own answer yet: come back until it settles.
                    damped = true;
                }
                port.last_step[l] = step;
            }
            // Changes below the tolerance are not taken, so every advertised change is propagated.
            if differs(old[l], new) {
                mu[l] = new;
                changed |= 1 << l;
            }
        }
        self.scratch = scratch;
        if changed == 0 {
            return;
        }
        self.mu[p as usize] = mu;
        port.bottleneck_lanes = lanes_of(lanes_here).filter(|&l| mu[l].is_finite()).fold(0u16, |m, l| m | (1 << l));
        if damped {
            self.enqueue(p, true);
        }
        // Tell the other ports of every group in a changed lane, where the group's cap there changed.
        let members = std::mem::take(&mut self.ports[p as usize].members);
        for m in &members {
            let lane = m.lane as usize;
            if changed & (1 << lane) == 0 {
                continue;
            }
            let group = &mut self.groups[m.group as usize];
            // The smallest and second smallest advertisement along the path give every position's cap
            // (and the smallest is the group's rate).
            let (mut min1, mut at1, mut min2) = (INF, usize::MAX, INF);
            for (j, &q) in group.path.iter().enumerate() {
                let v = self.mu[q as usize][lane];
                if v < min1 {
                    (min2, min1, at1) = (min1, v, j);
                } else if v < min2 {
                    min2 = v;
                }
            }
            // Groups held back elsewhere keep their rate: nothing to redo for them.
            if !group.dirty && differs(min1, group.rate) {
                group.dirty = true;
                self.dirty_groups.push(m.group);
            }
            for (j, (&q, &slot)) in group.path.iter().zip(group.slots.iter()).enumerate() {
                if j == m.pos as usize {
                    continue;
                }
                let after = if j == at1 { min2 } else { min1 };
                let port = &mut self.ports[q as usize];
                let member = &mut port.members[slot as usize];
                let before = member.ext;
                if before == after {
                    continue;
                }
                member.ext = after;
                let flows = member.flows;
                add_demand(port, m.lane, -flows, before);
                add_demand(port, m.lane, flows, after);
                if differs(before, after) {
                    let may_rise = after > before;
                    if !port.queued && (may_rise || port.bottleneck_lanes != 0) {
                        port.queued = true;
                        self.worklist.push_back(q);
                    }
                }
            }
        }
        self.ports[p as usize].members = members;
    }

    fn apply_rates(&mut self, now: TimeNs, queue: &mut EventQueue) {
        let dirty = std::mem::take(&mut self.dirty_groups);
        for &g in &dirty {
            let group = &mut self.groups[g as usize];
            group.dirty = false;
            let lane = group.lane as usize;
            let mut rate = if group.flows.is_empty() {
                0.0
            } else {
                group.path.iter().map(|&q| self.mu[q as usize][lane]).fold(INF, f64::min)
            };
            if !rate.is_finite() {
                // Only reachable if propagation was cut short: fall back to the slowest port's capacity.
                rate = group.path.iter().map(|&q| self.ports[q as usize].capacity).fold(INF, f64::min);
            }
            self.set_group_rate(g, rate, now, queue);
            let group = &mut self.groups[g as usize];
            if group.flows.is_empty() {
                group.emptied_in = self.generation;
                if !group.idle {
                    group.idle = true;
                    self.idle_new.push(g);
                }
            }
        }
        self.dirty_groups = dirty;
        self.dirty_groups.clear();
        self.sweep_idle_groups();
        // Where the iteration stopped short of its fixed point (see `recompute`), a port may be asked for
        // more than it has: scale its flows down. Scaling only lowers other ports' load, so one pass over
        // the ports whose load rose suffices. Never happens when the iteration converged.
        let raised = std::mem::take(&mut self.raised);
        for &p in &raised {
            let port = &mut self.ports[p as usize];
            port.raised = false;
            if port.total_usage > port.capacity * (1.0 + OVERLOAD_TOL) {
                let factor = port.capacity / port.total_usage;
                self.stats.overload_repairs += 1;
                // A copy: set_group_rate reads the member list (an empty one means an idle port).
                let groups: Vec<GroupId> = self.ports[p as usize].members.iter().map(|m| m.group).collect();
                for g in groups {
                    let rate = self.groups[g as usize].rate * factor;
                    self.set_group_rate(g, rate, now, queue);
                }
            }
        }
        self.raised = raised;
        self.raised.clear();
    }

    /// Give group `g` a new per-flow rate at `now`: settle its service, charge its ports, reschedule.
    fn set_group_rate(&mut self, g: GroupId, rate: f64, now: TimeNs, queue: &mut EventQueue) {
        let group = &mut self.groups[g as usize];
        group.settle(now);
        let charge = group.flows.len() as f64 * rate;
        let delta = charge - group.charged;
        group.charged = charge;
        group.rate = rate;
        match group.flows.peek() {
            Some(Reverse(next)) if rate > 0.0 => {
                let left = (next.finish - group.service).max(0.0);
                let dt_ns = ceil_ns(left / rate * NS_PER_S);
                let t = now.saturating_add(if dt_ns >= u64::MAX as f64 { u64::MAX } else { dt_ns as u64 });
                if t <= END_NS {
                    queue.schedule_group(g, t);
                    self.set_overflowed(g, false);
                } else {
                    // Past the end of the clock (2^63 ns, ~292 years). A later rate change may
                    // still bring it in; if none comes, the core reports it (`Network::stuck_past_end`).
                    queue.cancel_group(g);
                    if !self.groups[g as usize].overflowed {
                        let group = &self.groups[g as usize];
                        let names: Vec<&str> =
                            group.path.iter().map(|&q| self.ports[q as usize].spec.name.as_str()).collect();
                        self.time_overflow = Some(format!(
                            "a transfer of {left:.0} more bytes on lane {} along {names:?} at {rate:e} B/s would \
                             end {:.3e} s after t = {now} ns",
                            group.lane,
                            left / rate,
                        ));
                    }
                    self.set_overflowed(g, true);
                }
            }
            // Empty, or starved by a higher-priority lane: nothing to schedule until rates change.
            _ => {
                queue.cancel_group(g);
                self.set_overflowed(g, false);
            }
        }
        if delta != 0.0 {
            for i in 0..self.groups[g as usize].path.len() {
                let q = self.groups[g as usize].path[i];
                let lane = self.groups[g as usize].lane;
                self.charge_port(q, lane, delta, now);
            }
        }
    }

    /// Free the groups that stayed empty for a whole generation (`IDLE_GENERATION` emptyings, or as many
    /// as there are busy groups if more): memory stays within a few times the groups in use, and a path
    /// emptied and soon used again (a forward pass's layer after layer, a busy link) keeps its group
    /// instead of paying for a new one. Runs at the end of `apply_rates`, when every empty group has its
    /// rate and charges back at zero.
    fn sweep_idle_groups(&mut self) {
        if self.idle_new.len() < IDLE_GENERATION.max(self.busy_groups) {
            return;
        }
        let old = std::mem::take(&mut self.idle_old);
        for &g in &old {
            let group = &mut self.groups[g as usize];
            if !group.flows.is_empty() {
                group.idle = false; // listed again when it next goes empty
            } else if group.emptied_in == self.generation {
                self.idle_new.push(g); // went empty again in this generation: keep it
            } else {
                group.idle = false;
                self.free_group(g);
            }
        }
        self.idle_old = std::mem::replace(&mut self.idle_new, old);
        self.idle_new.clear();
        self.generation = self.generation.wrapping_add(1);
    }

    /// Forget an empty group whose rate and charges are back to zero (so a new group on its path starts
    /// from the very state this one is in); its slot goes to the next new group.
    fn free_group(&mut self, g: GroupId) {
        let group = &mut self.groups[g as usize];
        debug_assert!(group.flows.is_empty() && group.charged == 0.0 && group.rate == 0.0);
        debug_assert!(!group.overflowed && !group.dirty && group.slots.iter().all(|&s| s == DETACHED));
        self.key.clear();
        self.key.extend_from_slice(&group.path);
        self.key.push(group.lane as u32);
        self.group_of.remove(self.key.as_slice());
        // Nothing of the path is kept: an empty path marks the slot free (`in_flight`, `group_path`).
        group.path = Box::default();
        group.slots = Box::default();
        self.free_groups.push(g);
    }

    fn set_overflowed(&mut self, g: GroupId, overflowed: bool) {
        let group = &mut self.groups[g as usize];
        if group.overflowed != overflowed {
            group.overflowed = overflowed;
            if overflowed {
                self.overflowed_groups += 1;
            } else {
                self.overflowed_groups -= 1;
            }
        }
    }

    /// With no event left to change rates: the transfers that can never finish because their end lies past
    /// the end of the clock ([`END_NS`]), described (None if there are none).
    pub fn stuck_past_end(&self) -> Option<&str> {
        (self.overflowed_groups > 0).then(|| self.time_overflow.as_deref().unwrap_or("a transfer"))
    }

    /// Change the load of `lane` at port `q` by `delta` bytes/s at `now`.
    fn charge_port(&mut self, q: PortId, lane: Lane, delta: f64, now: TimeNs) {
        let (ports, groups) = (&mut self.ports, &self.groups);
        let port = &mut ports[q as usize];
        settle_port(port, now, self.sampling);
        let l = lane as usize;
        let mut usage = (port.usage[l] + delta).max(0.0);
        if port.lane_members[l] == 0 {
            // Idle here: drop the rounding its past rates left, so idle is exactly zero.
            usage = 0.0;
        } else if usage < 1e-3 * delta.abs() {
            // A large rate has gone and a small one is left: the running sum has lost its digits to
            // cancellation, so add the lane up again from what its groups are charged.
            usage = port.members.iter().filter(|m| m.lane == lane).map(|m| groups[m.group as usize].charged).sum();
        }
        port.usage[l] = usage;
        if usage > 0.0 {
            port.busy_lanes |= 1 << l;
        } else {
            port.busy_lanes &= !(1 << l);
        }
        // The total is the sum of the lanes, never a running sum of its own.
        port.total_usage = lanes_of(port.busy_lanes).map(|x| port.usage[x]).sum();
        if delta > 0.0 && !port.raised {
            port.raised = true;
            self.raised.push(q);
        }
        if port.spec.has_bucket() {
            self.bucket_ports.push(q);
        }
    }

    fn check_buckets(&mut self, now: TimeNs, queue: &mut EventQueue) {
        let sampling = self.sampling;
        while let Some(p) = self.bucket_ports.pop() {
            let port = &mut self.ports[p as usize];
            settle_port(port, now, sampling);
            let rate = port.sustained_rate();
            // Any earlier forecast is void: the port's load has changed since it was made.
            port.bucket_version += 1;
            if port.capacity > rate && port.total_usage > rate * (1.0 + REL_TOL) {
                let dt_ns = ceil_ns(port.tokens / (port.total_usage - rate) * NS_PER_S) as u64;
                let t = now.saturating_add(dt_ns);
                if t <= END_NS {
                    queue.push(t, EventKind::BucketEmpty { port: p, version: port.bucket_version });
                }
            }
        }
    }

    /// Bring every port's counters up to `now`, every sample series to the interval of `now`.
    pub fn settle_all(&mut self, now: TimeNs) {
        let sampling = self.sampling;
        if sampling.base_ns > 0 {
            self.sample_ns = sampling.interval_at(now);
        }
        for port in &mut self.ports {
            settle_port(port, now, sampling);
            if sampling.base_ns > 0 {
                coarsen(&mut port.counters, self.sample_ns);
            }
        }
    }

    pub fn counters(&self, port: PortId) -> Result<&PortCounters> {
        Ok(&self.port(port)?.counters)
    }

    /// Current rate of each lane through a port (bytes/s).
    pub fn lane_rates(&self, port: PortId) -> Result<[f64; MAX_LANES]> {
        Ok(self.port(port)?.usage)
    }

    /// Current capacity of a port (its peak while its bucket has tokens).
    pub fn capacity(&self, port: PortId) -> Result<f64> {
        Ok(self.port(port)?.capacity)
    }

    /// Per-flow rate of the transfers on `lane` along `path`, if any are in flight.
    pub fn flow_rate(&self, path: &[PortId], lane: Lane) -> Option<f64> {
        let key: Vec<u32> = path.iter().copied().chain(std::iter::once(lane as u32)).collect();
        let g = *self.group_of.get(key.as_slice())?;
        let group = &self.groups[g as usize];
        (!group.flows.is_empty()).then_some(group.rate)
    }

    pub fn bucket_version(&self, port: u32) -> Option<u64> {
        self.ports.get(port as usize).map(|p| p.bucket_version)
    }

    /// Every group with flows in flight: (path, lane, flows, per-flow rate), in slot order (freed slots are
    /// reused, so not necessarily the order the paths were first used). For tests and inspection.
    pub fn in_flight(&self) -> Vec<(Vec<PortId>, Lane, usize, f64)> {
        self.groups
            .iter()
            .filter(|g| !g.flows.is_empty())
            .map(|g| (g.path.to_vec(), g.lane, g.flows.len(), g.rate))
            .collect()
    }

    /// The path of a group (as reported in [`Finished::group`]). A group lives while it has flows, and
    /// until the next [`Network::recompute`] after its last one finished; then its id may name a new group.
    pub fn group_path(&self, group: u32) -> Option<&[PortId]> {
        self.groups.get(group as usize).map(|g| &*g.path).filter(|path| !path.is_empty())
    }

    /// Group slots allocated (in use or free): what the groups' memory grows with.
    pub fn group_slots(&self) -> usize {
        self.groups.len()
    }

    pub fn active_flows(&self) -> u64 {
        self.active_flows
    }

    /// The sampling interval of every series as of the last [`Network::settle_all`] (0 = sampling off):
    /// the interval asked for, doubled as often as the run's length needed (see `Sampling`).
    pub fn sample_ns(&self) -> u64 {
        self.sample_ns
    }

    /// Samples one series holds at most now (it shrinks as ports are added).
    pub fn samples_cap(&self) -> u64 {
        self.sampling.cap
    }

    /// True while some change has not been folded into the rates yet.
    pub fn needs_recompute(&self) -> bool {
        !self.worklist.is_empty() || !self.dirty_groups.is_empty() || !self.bucket_ports.is_empty()
    }
}

/// Per-flow level `mu` with `sum flows * min(cap, mu) = alloc` over one lane's `(cap, flows)` entries.
/// Repeatedly sets aside the entries capped below the current level (moving them behind the rest, so
/// later passes skip them); no sort needed, and a few passes suffice in practice. Reorders `entries`.
fn water_level(entries: &mut [(f64, f64)], alloc: f64) -> f64 {
    let mut remaining = alloc;
    let mut count: f64 = entries.iter().map(|e| e.1).sum();
    let mut open = entries.len();
    while count > 0.0 {
        let level = remaining / count;
        let before = open;
        let mut i = 0;
        while i < open {
            let (cap, flows) = entries[i];
            if cap < level {
                remaining -= cap * flows;
                count -= flows;
                open -= 1;
                entries.swap(i, open);
            } else {
                i += 1;
            }
        }
        if open == before {
            break;
        }
    }
    if count > 0.0 {
        (remaining / count).max(0.0)
    } else {
        INF
    }
}

/// Account `flows` flows (negative: fewer) whose external cap is `ext` in a port's demand cache.
fn add_demand(port: &mut Port, lane: Lane, flows: f64, ext: f64) {
    let l = lane as usize;
    if ext.is_finite() {
        let change = flows * ext;
        port.demand[l] += change;
        // A large term gone and a small sum left: the running sum has lost its digits to cancellation,
        // so have the next recomputation add the demand up again exactly.
        if port.demand[l].abs() < 1e-6 * change.abs() {
            port.exact_in = 0;
        }
    } else {
        port.unbounded_flows[l] += flows as i64;
    }
}

/// Round a duration in nanoseconds up to a whole nanosecond, except that a value within float noise (a
/// few units in the last place) of a whole number is that number (3 GB at 50 GB/s is 60,000,000 ns, not
/// 60,000,001).
fn ceil_ns(x: f64) -> f64 {
    let nearest = x.round();
    if (x - nearest).abs() <= 1e-13 * x.max(1.0) {
        nearest
    } else {
        x.ceil()
    }
}

/// The lanes whose bit is set in `mask`, in increasing order.
fn lanes_of(mask: u16) -> impl Iterator<Item = usize> + Clone {
    let mut rest = mask;
    std::iter::from_fn(move || {
        (rest != 0).then(|| {
            let l = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            l
        })
    })
}

fn differs(a: f64, b: f64) -> bool {
    if a == b {
        return false;
    }
    if a.is_infinite() || b.is_infinite() {
        return true;
    }
    (a - b).abs() > REL_TOL * a.abs().max(b.abs())
}

/// Account the time since the port was last settled: bytes per lane, busy time, samples, tokens.
fn settle_port(port: &mut Port, now: TimeNs, sampling: Sampling) {
    let from = port.settled_at;
    if now <= from {
        return;
    }
    port.settled_at = now;
    let dt = (now - from) as f64 / NS_PER_S;
    if port.spec.has_bucket() {
        let fill = (port.sustained_rate() - port.total_usage) * dt;
        port.tokens = (port.tokens + fill).clamp(0.0, port.spec.burst_bytes);
    }
    if port.total_usage <= 0.0 {
        return;
    }
    let c = &mut port.counters;
    c.busy_s += dt;
    let busy_lanes = lanes_of(port.busy_lanes);
    for l in busy_lanes.clone() {
        c.fluid_bytes[l] += port.usage[l] * dt;
    }
    if sampling.base_ns == 0 {
        return;
    }
    let sample_ns = sampling.interval_at(now);
    coarsen(c, sample_ns);
    add_to_samples(&mut c.samples, from, now, sample_ns, port.total_usage);
    for l in busy_lanes {
        {
            let lane = l as Lane;
            let idx = match c.lane_samples.iter().position(|(x, _)| *x == lane) {
                Some(i) => i,
                None => {
                    c.lane_samples.push((lane, Vec::new()));
                    c.lane_samples.len() - 1
                }
            };
            add_to_samples(&mut c.lane_samples[idx].1, from, now, sample_ns, port.usage[l]);
        }
    }
}

/// Spread `rate` bytes/s over [from, to) into fixed sampling intervals (at most `Sampling::cap` of them up
/// to `to`, by the choice of `sample_ns`).
fn add_to_samples(samples: &mut Vec<f64>, from: TimeNs, to: TimeNs, sample_ns: u64, rate: f64) {
    // Divide once: each later interval starts where the one before ended.
    let mut k = from / sample_ns;
    let mut t = from;
    while t < to {
        let end = (k + 1).saturating_mul(sample_ns).min(to);
        let i = k as usize;
        if i >= samples.len() {
            // Grown to the last interval of [from, to) at once, as its samples all get bytes.
            samples.resize(((to - 1) / sample_ns) as usize + 1, 0.0);
        }
        samples[i] += rate * (end - t) as f64 / NS_PER_S;
        t = end;
        k += 1;
    }
}

/// Bring a port's sample series to the interval `sample_ns`, merging adjacent samples. Intervals only grow,
/// each a power-of-two multiple of the one before (see `Sampling::interval_at`).
fn coarsen(c: &mut PortCounters, sample_ns: u64) {
    if c.sample_ns == 0 {
        c.sample_ns = sample_ns; // nothing sampled yet
        return;
    }
    if sample_ns <= c.sample_ns {
        debug_assert_eq!(sample_ns, c.sample_ns, "the sampling interval shrank");
        return;
    }
    debug_assert_eq!(sample_ns % c.sample_ns, 0, "intervals are the base interval times powers of two");
    let factor = (sample_ns / c.sample_ns) as usize;
    let merge = |series: &mut Vec<f64>| {
        let merged: Vec<f64> = series.chunks(factor).map(|chunk| chunk.iter().sum()).collect();
        *series = merged;
    };
    merge(&mut c.samples);
    for (_, series) in &mut c.lane_samples {
        merge(series);
    }
    c.sample_ns = sample_ns;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finish_all(net: &mut Network, queue: &mut EventQueue) -> Vec<Finished> {
        let mut out = Vec::new();
        net.recompute(0, queue);
        while let Some((t, kind)) = queue.pop() {
            if let EventKind::Group { group } = kind {
                net.on_group_event(group, t, &mut out);
            }
            net.recompute(t, queue);
        }
        out
    }

    #[test]
    fn interval_at_is_the_doubling_loop() {
        let by_loop = |s: Sampling, now: TimeNs| {
            let mut interval = s.base_ns;
            while now.div_ceil(interval) > s.cap {
                interval = interval.saturating_mul(2);
            }
            interval
        };
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..100_000 {
            let base = [1, 3, 1_000_000, 10_000_000, 1 << 40, u64::MAX / 3][i % 6];
            let cap = [MIN_SAMPLES_PER_SERIES, 1000, MAX_SAMPLES_PER_SERIES][i % 3];
            let now = next() >> (next() % 64);
            let s = Sampling { base_ns: base, cap };
            assert_eq!(s.interval_at(now), by_loop(s, now), "base {base} cap {cap} now {now}");
        }
        let s = Sampling { base_ns: 1_000_000, cap: 256 };
        for now in [0, 1, 256_000_000, 256_000_001, 512_000_000, 512_000_001, END_NS, u64::MAX] {
            assert_eq!(s.interval_at(now), by_loop(s, now), "now {now}");
        }
    }

    #[test]
    fn empty_groups_are_freed_and_their_slots_reused() {
        let mut net = Network::new(0);
        let ports: Vec<PortId> =
            (0..160).map(|i| net.add_port(PortSpec::plain(format!("p{i}"), 1e9), 0).unwrap()).collect();
        let mut queue = EventQueue::default();
        // 12,720 distinct paths, used one after the other: the empty groups are freed in sweeps, so the
        // slots stay below what a sweep lets gather.
        for (i, &a) in ports.iter().enumerate() {
            for &b in &ports[i + 1..] {
                net.add_flow(&[a, b], 0, 1000, Owner::User(0), 0).unwrap();
                let done = finish_all(&mut net, &mut queue);
                assert_eq!(done.len(), 1);
            }
        }
        // Fewer slots than paths: freed slots went to new groups.
        assert!(net.group_slots() <= 2 * IDLE_GENERATION + 1, "{} slots", net.group_slots());
        assert!(net.group_of.len() <= 2 * IDLE_GENERATION && net.in_flight().is_empty());
        // A group kept (not swept yet) or made anew: the same rates.
        net.add_flow(&[ports[0]], 0, 1000, Owner::User(1), 0).unwrap();
        net.add_flow(&[ports[1]], 0, 1000, Owner::User(2), 0).unwrap();
        net.add_flow(&[ports[0]], 0, 1000, Owner::User(3), 0).unwrap();
        let done = finish_all(&mut net, &mut queue);
        assert_eq!(done.iter().map(|f| f.end_ns).collect::<Vec<_>>(), [1000, 2000, 2000]);
    }
}
