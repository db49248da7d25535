//! InfiniBand-style virtual-lane (VL) arbitration: the QoS of the paper's CNIC-centric traffic
//! management (§5, App. A.1). Model-inference traffic rides high-priority VLs, KV-cache traffic a
//! low-priority VL, and the NIC's VL arbiter decides whose packet goes next.
//!
//! Two arbiters with one truth:
//!
//! * [`PacketArbiter`] is the exact per-packet arbiter, the reference semantics. A hardware backend
//!   will use it to pace real bytes; tests use it as the oracle for the rate model.
//! * [`LaneShares`] (from [`VlArbitration::rate_model`]) is the fluid rate model the emulator uses to
//!   give each lane a rate. It agrees with the packet arbiter in the long run (property-tested).
//!
//! # Packet-arbiter semantics
//!
//! Weights count 64-byte units and `high_limit` counts 4096-byte units, as in the IB spec.
//!
//! * `high_sent` counts the bytes of high-table packets sent since the last low-table packet. The high
//!   table may send while `high_limit == 255` or `high_sent < max(high_limit * 4096, 1)`, so limit 0
//!   lets exactly one high packet through before the low table gets a chance, and 240 lets 960 KiB.
//! * If the high table has an eligible packet and (the limit is not reached, or the low table has
//!   nothing eligible), the high table sends: the arbiter is work conserving. Otherwise, if the low
//!   table has an eligible packet, it sends exactly one packet and `high_sent` is reset to 0 (also when
//!   the low packet goes only because the high table had nothing).
//! * Within a table, weighted round robin as in the IB spec: a current entry and its remaining weight
//!   in bytes (`weight * 64` when the entry becomes current). An entry is eligible if its weight is
//!   nonzero, its lane has a packet and its remaining weight is positive. The current eligible entry
//!   sends its lane's head packet and its remaining weight drops by the packet's size; a packet is never
//!   split, so it may overshoot, and the overshoot is lost, not carried over. When the remaining weight
//!   reaches 0 or below, the next entry becomes current with a fresh weight. If the current entry is not
//!   eligible, the next one becomes current (fresh weight), for at most one pass round the table.
//! * Each table keeps its position across turns: the high-limit interruption does not reset it. A lane
//!   may appear in several entries and in both tables.
//!
//! # Rate model
//!
//! Every packet is taken to be `mtu` bytes. An entry's effective weight is `ceil(weight * 64 / mtu)`
//! packets (a weight below one MTU still sends one packet); a lane's weight in a table is the sum over
//! its entries. While both tables have backlogged lanes, the high table gets `n_h / (n_h + 1)` of the
//! port and the low table `1 / (n_h + 1)`, where `n_h = ceil(max(limit * 4096, 1) / mtu)` is the number
//! of packets the high table sends per turn (limit 255: the high table gets everything). A table whose
//! lanes are all satisfied (see below) gets what they use, and the other table the rest. Within a
//! table, the table's capacity left after its satisfied lanes is shared among its backlogged lanes in
//! proportion to their weights. A lane's rate is the sum over the two tables.
//!
//! [`LaneShares::allocate`] defines the work-conserving allocation by water filling on this two-level
//! scheduler. Start with every served lane of nonzero demand backlogged. Repeat: compute each
//! backlogged lane's offer (the rate the rule above gives it); every lane whose demand is within its
//! offer is satisfied: it gets its demand, which is charged to the two tables in proportion to the
//! lane's offers from them, and it stops being backlogged. When no lane is satisfied in a round, every
//! backlogged lane gets its offer. Offers never shrink when a lane is satisfied, so the result is the
//! weighted max-min allocation of the two-level scheduler.
//!
//! The capacity is accounted per table on purpose: a satisfied high lane leaves its unused share to
//! the *other high lanes*, not to the low table, as long as the high table still has backlogged lanes,
//! because the packet arbiter still sends `n_h` high packets per low packet then. (A flat water filling
//! that recomputes the table split from the remaining lanes is off by up to a quarter of the port.)
//!
//! Known limit: a demand-limited lane with weight in *both* tables is served by whichever table's
//! round robin reaches it first, which depends on packet phases, not on rates. Its own rate is right,
//! but how its demand is split between the tables (and so what the other lanes of each table get) is
//! not a function of the rates; the model splits it in proportion to the offers. The test
//! `dual_table_split_depends_on_phase` shows two phases of the same rates giving shares 25 points
//! apart. In the paper's config this error is at most the low table's share (1/241 at a 4 KiB MTU).

use crate::error::{CoreError, Result};

/// Lanes are numbered 0..MAX_LANES; arrays indexed by lane have this length.
pub const MAX_LANES: usize = 16;

/// A virtual lane number.
pub type Lane = u8;

/// IB arbitration-table weights count units of this many bytes.
const WEIGHT_UNIT_BYTES: u64 = 64;
/// IB `high_limit` counts units of this many bytes.
const HIGH_LIMIT_UNIT_BYTES: u64 = 4096;
/// The `high_limit` value that removes the limit (the low table then only gets idle high time).
const UNLIMITED_HIGH_LIMIT: u8 = 255;
/// An IB VLArbitration table holds at most this many entries.
const MAX_TABLE_ENTRIES: usize = 64;
/// Data VLs are 0..=14; VL15 carries subnet management and is not arbitrated by these tables.
const MAX_DATA_VLS: u8 = 15;
/// Relative slack when comparing a demand with an offer, so float noise does not split a tie.
const DEMAND_EPSILON: f64 = 1e-12;

/// One entry of an arbitration table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VlArbEntry {
    /// The lane this entry serves.
    pub vl: Lane,
    /// Bytes per turn in 64-byte units; 0 means the entry is skipped.
    pub weight: u8,
}

/// An IB VL arbitration configuration: a high- and a low-priority weighted round-robin table and the
/// limit on high-priority bytes between low-priority turns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VlArbitration {
    /// Number of data VLs in use (`qos_max_vls`), 1..=15; every entry's lane is below it.
    pub max_vls: u8,
    /// High-priority bytes allowed between low-priority packets, in 4 KiB units; 255 = no limit.
    pub high_limit: u8,
    /// The high-priority table (`qos_vlarb_high`).
    pub high: Vec<VlArbEntry>,
    /// The low-priority table (`qos_vlarb_low`).
    pub low: Vec<VlArbEntry>,
}

/// A table from `(lane, weight)` pairs, in order.
fn table_of(pairs: &[(Lane, u8)]) -> Vec<VlArbEntry> {
    pairs.iter().map(|&(vl, weight)| VlArbEntry { vl, weight }).collect()
}

/// One more than the highest lane, so that every lane given is below `max_vls`.
fn max_vls_for<'a>(lanes: impl IntoIterator<Item = &'a Lane>) -> u8 {
    lanes.into_iter().map(|&l| l.saturating_add(1)).max().unwrap_or(0)
}

/// Parse one table knob ("0:192,1:192,2:0"); empty or blank text is an empty table.
fn parse_table(knob: &str, text: &str) -> Result<Vec<VlArbEntry>> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .enumerate()
        .map(|(i, item)| {
            let bad = |why: &str| {
                CoreError::config(
                    &format!("{knob} entry {i}"),
                    format!("{why} in {:?} (expected VL:WEIGHT, e.g. \"2:64\")", item.trim()),
                )
            };
            let (vl, weight) = item.split_once(':').ok_or_else(|| bad("missing ':'"))?;
            let vl = vl.trim().parse().map_err(|_| bad("VL is not an integer 0..=255"))?;
            let weight = weight.trim().parse().map_err(|_| bad("weight is not an integer 0..=255"))?;
            Ok(VlArbEntry { vl, weight })
        })
        .collect()
}

/// Packets an entry of `weight` sends per visit when all packets are `mtu` bytes (IB quantisation).
fn packets_per_visit(weight: u8, mtu_bytes: u64) -> u64 {
    (weight as u64 * WEIGHT_UNIT_BYTES).div_ceil(mtu_bytes)
}

impl VlArbitration {
    /// Parse the operator's knobs: `qos_max_vls`, `qos_high_limit`, `qos_vlarb_high`,
    /// `qos_vlarb_low` (tables as "0:192,1:192,2:0,3:192"; an empty string is an empty table).
    /// The result is validated ([`VlArbitration::validate`]).
    pub fn parse(max_vls: u8, high_limit: u8, vlarb_high: &str, vlarb_low: &str) -> Result<Self> {
        let cfg = Self {
            max_vls,
            high_limit,
            high: parse_table("qos_vlarb_high", vlarb_high)?,
            low: parse_table("qos_vlarb_low", vlarb_low)?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The paper's App. A.1 config: `qos_max_vls 4`, `qos_high_limit 240`,
    /// `qos_vlarb_high 0:192,1:192,2:0,3:192`, `qos_vlarb_low 0:192,1:192,2:64,3:192`
    /// (VL0/1/3 carry inference traffic, VL2 the KV cache).
    pub fn paper() -> Self {
        Self {
            max_vls: 4,
            high_limit: 240,
            high: table_of(&[(0, 192), (1, 192), (2, 0), (3, 192)]),
            low: table_of(&[(0, 192), (1, 192), (2, 64), (3, 192)]),
        }
    }

    /// Plain strict priority: `high` lanes in the high table, `low` lanes in the low table, each with
    /// weight 1, no high limit (255), so a low lane only gets time the high lanes leave idle.
    pub fn strict_priority(high: &[Lane], low: &[Lane]) -> Self {
        Self {
            max_vls: max_vls_for(high.iter().chain(low)),
            high_limit: UNLIMITED_HIGH_LIMIT,
            high: high.iter().map(|&vl| VlArbEntry { vl, weight: 1 }).collect(),
            low: low.iter().map(|&vl| VlArbEntry { vl, weight: 1 }).collect(),
        }
    }

    /// Plain weighted round robin over `(lane, weight)` entries: one table (the low one; the high
    /// table is empty, so the limit plays no part).
    pub fn weighted_round_robin(entries: &[(Lane, u8)]) -> Self {
        Self {
            max_vls: max_vls_for(entries.iter().map(|(l, _)| l)),
            high_limit: UNLIMITED_HIGH_LIMIT,
            high: Vec::new(),
            low: table_of(entries),
        }
    }

    /// No QoS (PCIe, DRAM): lanes `0..n_lanes` with equal weight in one table. `n_lanes` must be in
    /// 1..=15 for the result to validate.
    pub fn fair(n_lanes: u8) -> Self {
        let lanes: Vec<(Lane, u8)> = (0..n_lanes).map(|vl| (vl, 1)).collect();
        Self { max_vls: n_lanes, ..Self::weighted_round_robin(&lanes) }
    }

    /// Check the configuration; errors are `CoreError::config` naming the knob: `qos_max_vls` not in
    /// 1..=15; an entry's VL not below `qos_max_vls`; more than 64 entries in a table; no entry with a
    /// nonzero weight in either table.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_DATA_VLS).contains(&self.max_vls) {
            return Err(CoreError::config(
                "qos_max_vls",
                format!("expected 1..={MAX_DATA_VLS} data VLs, got {}", self.max_vls),
            ));
        }
        for (knob, table) in [("qos_vlarb_high", &self.high), ("qos_vlarb_low", &self.low)] {
            if table.len() > MAX_TABLE_ENTRIES {
                return Err(CoreError::config(
                    knob,
                    format!("{} entries, a table holds at most {MAX_TABLE_ENTRIES}", table.len()),
                ));
            }
            if let Some((i, e)) = table.iter().enumerate().find(|(_, e)| e.vl >= self.max_vls) {
                return Err(CoreError::config(
                    &format!("{knob} entry {i}"),
                    format!("VL {} is not below qos_max_vls {}", e.vl, self.max_vls),
                ));
            }
        }
        if !self.high.iter().chain(&self.low).any(|e| e.weight > 0) {
            return Err(CoreError::config(
                "qos_vlarb_high, qos_vlarb_low",
                "no entry has a weight > 0, so no lane could ever send",
            ));
        }
        Ok(())
    }

    /// True if `lane` has a nonzero weight in some table (i.e. can ever be served).
    pub fn serves(&self, lane: Lane) -> bool {
        self.high.iter().chain(&self.low).any(|e| e.vl == lane && e.weight > 0)
    }

    /// High-table bytes allowed between low-table packets; `None` for no limit.
    fn high_limit_bytes(&self) -> Option<u64> {
        (self.high_limit != UNLIMITED_HIGH_LIMIT).then(|| (self.high_limit as u64 * HIGH_LIMIT_UNIT_BYTES).max(1))
    }

    /// Compile into the rate model for packets of `mtu_bytes` (> 0, else
    /// `CoreError::invalid("mtu_bytes", ..)`); the configuration is validated first.
    pub fn rate_model(&self, mtu_bytes: u32) -> Result<LaneShares> {
        self.validate()?;
        if mtu_bytes == 0 {
            return Err(CoreError::invalid("mtu_bytes", "expected a packet size > 0 bytes"));
        }
        let mtu = mtu_bytes as u64;
        let mut weight_packets = [[0.0; MAX_LANES]; 2];
        for (t, table) in [&self.high, &self.low].into_iter().enumerate() {
            for e in table {
                weight_packets[t][e.vl as usize] += packets_per_visit(e.weight, mtu) as f64;
            }
        }
        let high_fraction = match self.high_limit_bytes() {
            None => 1.0,
            Some(limit) => {
                let high_packets_per_turn = limit.div_ceil(mtu) as f64;
                high_packets_per_turn / (high_packets_per_turn + 1.0)
            }
        };
        Ok(LaneShares { weight_packets, high_fraction })
    }
}

/// The fluid rate model of a [`VlArbitration`] at one MTU (see the module doc): per-lane weights in
/// packets per round-robin cycle for each table, and the high table's fraction of the port.
#[derive(Clone, Debug)]
pub struct LaneShares {
    /// `[table][lane]`, table 0 = high, 1 = low: the lane's effective weight in MTU packets.
    weight_packets: [[f64; MAX_LANES]; 2],
    /// The high table's fraction of the port while both tables are backlogged; 1 with limit 255.
    high_fraction: f64,
}

/// Bits of the lanes in `mask`, lowest first.
fn lanes_in(mask: u16) -> impl Iterator<Item = usize> {
    (0..MAX_LANES).filter(move |&v| mask & (1 << v) != 0)
}

impl LaneShares {
    /// Long-run share of port capacity of each lane when exactly the lanes in `backlogged` (bit i =
    /// lane i) always have packets. Sums to 1 if any backlogged lane is served; unserved lanes get 0.
    pub fn saturated_shares(&self, backlogged: u16) -> [f64; MAX_LANES] {
        let mut demand = [0.0; MAX_LANES];
        for v in lanes_in(backlogged) {
            demand[v] = f64::INFINITY;
        }
        let mut out = [0.0; MAX_LANES];
        self.allocate(1.0, &demand, &mut out);
        out
    }

    /// Work-conserving allocation of `capacity` among lanes with `demand`s (bytes/s, may be
    /// `f64::INFINITY`; 0 = idle lane): the water filling of the module doc, which is the rate model's
    /// definition. Writes each lane's rate into `out`; unserved lanes get 0. No heap allocation.
    pub fn allocate(&self, capacity: f64, demand: &[f64; MAX_LANES], out: &mut [f64; MAX_LANES]) {
        *out = [0.0; MAX_LANES];
        let table_fraction = [self.high_fraction, 1.0 - self.high_fraction];
        let mut backlogged: u16 = 0;
        for (v, &d) in demand.iter().enumerate() {
            if d > 0.0 && self.serves_index(v) {
                backlogged |= 1 << v;
            }
        }
        // Capacity already given to satisfied lanes, charged per table.
        let mut used = [0.0f64; 2];
        while backlogged != 0 {
            let mut weight_sum = [0.0; 2];
            for v in lanes_in(backlogged) {
                for (t, sum) in weight_sum.iter_mut().enumerate() {
                    *sum += self.weight_packets[t][v];
                }
            }
            // A table with a backlogged lane is itself backlogged and holds its fraction of the port;
            // a table without one keeps just what its satisfied lanes use.
            let table_capacity = match (weight_sum[0] > 0.0, weight_sum[1] > 0.0) {
                (true, true) => table_fraction.map(|f| f * capacity),
                (true, false) => [capacity - used[1], used[1]],
                (false, true) => [used[0], capacity - used[0]],
                (false, false) => unreachable!("a backlogged lane is served by some table"),
            };
            let offer = |v: usize| -> [f64; 2] {
                [0, 1].map(|t| {
                    let w = self.weight_packets[t][v];
                    if w > 0.0 {
                        (table_capacity[t] - used[t]).max(0.0) * w / weight_sum[t]
                    } else {
                        0.0
                    }
                })
            };
            let mut satisfied: u16 = 0;
            for v in lanes_in(backlogged) {
                let [high, low] = offer(v);
                if demand[v] <= (high + low) * (1.0 + DEMAND_EPSILON) {
                    satisfied |= 1 << v;
                }
            }
            if satisfied == 0 {
                for v in lanes_in(backlogged) {
                    let [high, low] = offer(v);
                    out[v] = high + low;
                }
                return;
            }
            // Offers are computed before any charge, so lanes satisfied in the same round do not
            // see each other's use; offers only grow as lanes leave, so this is consistent.
            let mut charge = [0.0; 2];
            for v in lanes_in(satisfied) {
                let offers = offer(v);
                let total = offers[0] + offers[1];
                // min(): the epsilon above must not let a lane exceed its offer.
                out[v] = demand[v].min(total);
                for t in 0..2 {
                    // Scale the fraction, not the product: the product overflows or underflows at extreme rates.
                    charge[t] += out[v] * (offers[t] / total);
                }
            }
            used = [used[0] + charge[0], used[1] + charge[1]];
            backlogged &= !satisfied;
        }
    }

    /// True if `lane` has a nonzero weight in some table.
    pub fn serves(&self, lane: Lane) -> bool {
        self.serves_index(lane as usize)
    }

    fn serves_index(&self, v: usize) -> bool {
        v < MAX_LANES && (self.weight_packets[0][v] > 0.0 || self.weight_packets[1][v] > 0.0)
    }
}

/// One table's weighted round-robin state.
#[derive(Clone, Debug)]
struct WrrTable {
    entries: Vec<VlArbEntry>,
    current: usize,
    /// Bytes the current entry may still start; may go negative through overshoot.
    remaining_bytes: i64,
}

impl WrrTable {
    fn new(entries: &[VlArbEntry]) -> Self {
        let mut table = Self { entries: entries.to_vec(), current: 0, remaining_bytes: 0 };
        table.make_current(0);
        table
    }

    fn make_current(&mut self, i: usize) {
        self.current = i;
        self.remaining_bytes = self.entries.get(i).map_or(0, |e| e.weight as i64 * WEIGHT_UNIT_BYTES as i64);
    }

    /// The entry that would send next, looking once round the table from the current one. Pure, so
    /// the arbiter can ask both tables before deciding.
    fn peek(&self, head_bytes: &[u32; MAX_LANES]) -> Option<usize> {
        let n = self.entries.len();
        (0..n).map(|k| (self.current + k) % n).find(|&i| {
            let e = &self.entries[i];
            // An entry that becomes current starts with a fresh (positive) weight.
            let remaining_ok = i != self.current || self.remaining_bytes > 0;
            e.weight > 0 && head_bytes[e.vl as usize] > 0 && remaining_ok
        })
    }

    /// Record that entry `i` (from `peek`) sent a packet of `bytes`.
    fn commit(&mut self, i: usize, bytes: u32) {
        if i != self.current {
            self.make_current(i);
        }
        self.remaining_bytes -= bytes as i64;
        if self.remaining_bytes <= 0 {
            // The overshoot is dropped: the next entry starts from its full weight.
            self.make_current((i + 1) % self.entries.len());
        }
    }
}

/// Exact per-packet arbiter; the reference semantics (module doc). Will pace real bytes in a
/// hardware backend.
#[derive(Clone, Debug)]
pub struct PacketArbiter {
    high: WrrTable,
    low: WrrTable,
    /// `None`: no limit (`high_limit` 255).
    high_limit_bytes: Option<u64>,
    /// High-table bytes sent since the last low-table packet.
    high_sent_bytes: u64,
}

impl PacketArbiter {
    /// An arbiter in its initial state (both tables at entry 0); the config is validated first.
    pub fn new(cfg: &VlArbitration) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            high: WrrTable::new(&cfg.high),
            low: WrrTable::new(&cfg.low),
            high_limit_bytes: cfg.high_limit_bytes(),
            high_sent_bytes: 0,
        })
    }

    /// `head_bytes[l]` = size of the packet at the head of lane l, 0 if lane l is empty. Returns the
    /// lane whose head packet is sent next (and updates the arbiter state as if it was sent), or
    /// `None` if nothing can be sent.
    pub fn select(&mut self, head_bytes: &[u32; MAX_LANES]) -> Option<Lane> {
        let high = self.high.peek(head_bytes);
        let low = self.low.peek(head_bytes);
        let under_limit = match self.high_limit_bytes {
            Some(limit) => self.high_sent_bytes < limit,
            None => true,
        };
        // Work conserving: past its limit the high table still sends if the low table has nothing.
        if let Some(i) = high.filter(|_| under_limit || low.is_none()) {
            let lane = self.high.entries[i].vl;
            let bytes = head_bytes[lane as usize];
            self.high.commit(i, bytes);
            self.high_sent_bytes = self.high_sent_bytes.saturating_add(bytes as u64);
            Some(lane)
        } else if let Some(i) = low {
            let lane = self.low.entries[i].vl;
            self.low.commit(i, head_bytes[lane as usize]);
            self.high_sent_bytes = 0;
            Some(lane)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use proptest::prelude::*;

    /// Lane picked by each of `n` selections with the lanes in `backlogged` always holding `mtu`
    /// packets.
    fn saturated_sequence(cfg: &VlArbitration, mtu: u32, backlogged: u16, n: usize) -> Vec<Lane> {
        let mut arb = PacketArbiter::new(cfg).unwrap();
        let mut head = [0; MAX_LANES];
        for v in lanes_in(backlogged) {
            head[v] = mtu;
        }
        (0..n).map_while(|_| arb.select(&head)).collect()
    }

    /// (lane, period, arrival slots within each period): one packet per arrival slot.
    type Feed<'a> = (usize, u64, &'a [u64]);

    /// Fraction of `n` packet slots each lane used, all packets `mtu` bytes. Lanes in `saturated`
    /// always have packets; `feeds` add packets to the others. Idle slots count, so the result is a
    /// share of capacity.
    fn measure(cfg: &VlArbitration, mtu: u32, saturated: u16, feeds: &[Feed], n: u64) -> [f64; MAX_LANES] {
        let mut arb = PacketArbiter::new(cfg).unwrap();
        let mut queued = [0u64; MAX_LANES];
        let mut sent = [0u64; MAX_LANES];
        for slot in 0..n {
            for &(v, period, arrivals) in feeds {
                queued[v] += arrivals.iter().filter(|&&a| slot % period == a).count() as u64;
            }
            let mut head = [0; MAX_LANES];
            for v in 0..MAX_LANES {
                if saturated & (1 << v) != 0 || queued[v] > 0 {
                    head[v] = mtu;
                }
            }
            if let Some(lane) = arb.select(&head) {
                sent[lane as usize] += 1;
                queued[lane as usize] = queued[lane as usize].saturating_sub(1);
            }
        }
        sent.map(|s| s as f64 / n as f64)
    }

    fn assert_close(measured: &[f64; MAX_LANES], model: &[f64; MAX_LANES], tol: f64) {
        for v in 0..MAX_LANES {
            assert!(
                (measured[v] - model[v]).abs() <= tol,
                "lane {v}: measured {:.5}, model {:.5}\nmeasured {measured:?}\nmodel {model:?}",
                measured[v],
                model[v]
            );
        }
    }

    /// Packets in one round-robin cycle of each table (all entries), which bounds how far a
    /// finite run's shares are from their long-run value.
    fn cycle_packets(cfg: &VlArbitration, mtu: u32) -> u64 {
        cfg.high.iter().chain(&cfg.low).map(|e| packets_per_visit(e.weight, mtu as u64)).sum()
    }

    #[test]
    fn parses_the_paper_config() {
        let cfg = VlArbitration::parse(4, 240, "0:192,1:192,2:0,3:192", "0:192,1:192,2:64,3:192").unwrap();
        assert_eq!(cfg, VlArbitration::paper());
        assert!(cfg.serves(2) && !cfg.serves(4));
        // Inference on VL0 and KV on VL2, both saturated, 4 KiB MTU: the high table sends 240 packets
        // per low turn, and VL2 gets 1 of the low table's 3 + 1 packets per cycle (§6: ~0.1%).
        let shares = cfg.rate_model(4096).unwrap().saturated_shares(0b101);
        assert!((shares[2] - 1.0 / 241.0 / 4.0).abs() < 1e-12, "{shares:?}");
        assert!((shares[0] + shares[2] - 1.0).abs() < 1e-12);
        let measured = measure(&cfg, 4096, 0b101, &[], 241 * 4 * 50);
        assert_close(&measured, &shares, 1e-9);
    }

    #[test]
    fn parse_accepts_empty_tables_and_spaces() {
        let cfg = VlArbitration::parse(2, 0, "", " 0 : 1 , 1:2 ").unwrap();
        assert!(cfg.high.is_empty());
        assert_eq!(cfg.low, table_of(&[(0, 1), (1, 2)]));
    }

    #[test]
    fn bad_configs_name_the_knob() {
        let cases: &[(u8, &str, &str, &str)] = &[
            (0, "0:1", "", "qos_max_vls"),
            (16, "0:1", "", "qos_max_vls"),
            (4, "0:1,1:1,2:1,4:1", "", "qos_vlarb_high entry 3"),
            (4, "0:1", "3:1,2:9,4:0", "qos_vlarb_low entry 2"),
            (4, "0:0,1:0", "2:0", "qos_vlarb_high, qos_vlarb_low"),
            (4, "", "", "qos_vlarb_high, qos_vlarb_low"),
            (4, "0:192,1", "", "qos_vlarb_high entry 1"),
            (4, "0:256", "", "qos_vlarb_high entry 0"),
            (4, "0:1", "x:1", "qos_vlarb_low entry 0"),
            (4, "0:1", "1:-1", "qos_vlarb_low entry 0"),
            (4, "0:1,", "", "qos_vlarb_high entry 1"),
        ];
        for &(max_vls, high, low, knob) in cases {
            let err = VlArbitration::parse(max_vls, 0, high, low).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Config, "{err}");
            assert!(err.message.starts_with(&format!("{knob}: ")), "{knob:?} not in {err}");
        }
        let too_long = vec!["0:1"; 65].join(",");
        let err = VlArbitration::parse(4, 0, "", &too_long).unwrap_err();
        assert!(err.message.starts_with("qos_vlarb_low: 65 entries"), "{err}");
        assert!(VlArbitration::parse(4, 0, "", &vec!["0:1"; 64].join(",")).is_ok());
        // The same checks guard the rate model and the packet arbiter.
        assert!(VlArbitration::fair(16).rate_model(4096).is_err());
        assert!(PacketArbiter::new(&VlArbitration::fair(0)).is_err());
        let err = VlArbitration::fair(2).rate_model(0).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.starts_with("mtu_bytes: "), "{err}");
    }

    #[test]
    fn constructors_validate() {
        for cfg in [
            VlArbitration::paper(),
            VlArbitration::strict_priority(&[0, 1], &[2]),
            VlArbitration::weighted_round_robin(&[(0, 1), (3, 3)]),
            VlArbitration::fair(15),
        ] {
            cfg.validate().unwrap();
        }
        let sp = VlArbitration::strict_priority(&[1], &[0]);
        assert_eq!((sp.max_vls, sp.high_limit), (2, 255));
        assert_eq!(VlArbitration::fair(3).low, table_of(&[(0, 1), (1, 1), (2, 1)]));
    }

    #[test]
    fn limit_255_starves_the_low_table() {
        let cfg = VlArbitration::strict_priority(&[0], &[1]);
        assert!(saturated_sequence(&cfg, 4096, 0b11, 10_000).iter().all(|&l| l == 0));
        let model = cfg.rate_model(4096).unwrap();
        assert_eq!(model.saturated_shares(0b11)[..2], [1.0, 0.0]);
        // ...but the low table gets whatever the high one leaves idle.
        assert_eq!(saturated_sequence(&cfg, 4096, 0b10, 3), [1, 1, 1]);
        assert_eq!(model.saturated_shares(0b10)[..2], [0.0, 1.0]);
    }

    #[test]
    fn limit_0_alternates_one_high_one_low_packet() {
        let cfg = VlArbitration::parse(3, 0, "0:1,1:1", "2:1").unwrap();
        let seq = saturated_sequence(&cfg, 4096, 0b111, 8);
        assert_eq!(seq, [0, 2, 1, 2, 0, 2, 1, 2]);
        let shares = cfg.rate_model(4096).unwrap().saturated_shares(0b111);
        assert_eq!(shares[..3], [0.25, 0.25, 0.5]);
    }

    #[test]
    fn limit_240_sends_960_kib_of_high_per_low_packet() {
        let cfg = VlArbitration::parse(2, 240, "0:1", "1:1").unwrap();
        let seq = saturated_sequence(&cfg, 4096, 0b11, 2 * 241);
        for (i, &lane) in seq.iter().enumerate() {
            assert_eq!(lane, if i % 241 == 240 { 1 } else { 0 }, "packet {i}");
        }
        // With 1 KiB packets the same limit is 960 packets.
        let shares = cfg.rate_model(1024).unwrap().saturated_shares(0b11);
        assert!((shares[1] - 1.0 / 961.0).abs() < 1e-15);
    }

    #[test]
    fn weighted_round_robin_one_to_three() {
        let cfg = VlArbitration::weighted_round_robin(&[(0, 1), (1, 3)]);
        let model = cfg.rate_model(64).unwrap().saturated_shares(0b11);
        assert_eq!(model[..2], [0.25, 0.75]);
        let measured = measure(&cfg, 64, 0b11, &[], 10_001);
        assert_close(&measured, &model, 0.01);
        assert_eq!(saturated_sequence(&cfg, 64, 0b11, 8), [0, 1, 1, 1, 0, 1, 1, 1]);
    }

    #[test]
    fn weights_are_quantised_to_whole_packets() {
        // 64 B and 4096 B both round up to one 4 KiB packet per turn.
        let cfg = VlArbitration::weighted_round_robin(&[(0, 1), (1, 64)]);
        assert_eq!(saturated_sequence(&cfg, 4096, 0b11, 4), [0, 1, 0, 1]);
        // 6 KiB is two packets: the overshoot of the second is lost, not carried over.
        let cfg = VlArbitration::weighted_round_robin(&[(0, 96), (1, 64)]);
        assert_eq!(saturated_sequence(&cfg, 4096, 0b11, 6), [0, 0, 1, 0, 0, 1]);
        let shares = cfg.rate_model(4096).unwrap().saturated_shares(0b11);
        assert!((shares[0] - 2.0 / 3.0).abs() < 1e-15);
    }

    #[test]
    fn round_robin_position_survives_the_high_limit() {
        // Low entries 1 (two packets a visit) and 2: the low table sends one packet per turn but keeps
        // its place, so the low turns go 1, 1, 2, 1, 1, 2.
        let cfg = VlArbitration::parse(3, 0, "0:1", "1:128,2:64").unwrap();
        let seq = saturated_sequence(&cfg, 4096, 0b111, 12);
        assert_eq!(seq, [0, 1, 0, 1, 0, 2, 0, 1, 0, 1, 0, 2]);
    }

    /// Regression for the flat water filling: VL0 (high, demand 0.3) satisfied, VL1 (high) and VL2
    /// (low) saturated, 4 high packets per low one. The high table still holds 4/5 of the port, so VL1
    /// gets 0.8 - 0.3 and VL2 0.2 (a flat recomputation would give VL2 0.7 / 5 = 0.14).
    #[test]
    fn a_satisfied_high_lane_leaves_its_share_to_the_high_table() {
        let cfg = VlArbitration::parse(3, 1, "0:16,1:16", "2:16").unwrap();
        let model = cfg.rate_model(1024).unwrap();
        let mut demand = [0.0; MAX_LANES];
        demand[..3].copy_from_slice(&[0.3, f64::INFINITY, f64::INFINITY]);
        let mut out = [0.0; MAX_LANES];
        model.allocate(1.0, &demand, &mut out);
        let expected = [0.3, 0.5, 0.2];
        for v in 0..3 {
            assert!((out[v] - expected[v]).abs() < 1e-12, "{out:?}");
        }
        // VL0 gets 3 packets every 10 slots.
        let measured = measure(&cfg, 1024, 0b110, &[(0, 10, &[0, 3, 7])], 100_000);
        assert_close(&measured, &out, 0.005);
    }

    /// Why the demand-limited property leaves out lanes in both tables: VL0 is in both tables with
    /// demand 1/4, VL1 (high) and VL2 (low) are saturated, one high packet per low packet. A VL0 packet
    /// goes with whichever table has the next turn, so the phase of its arrivals alone moves a quarter
    /// of the port between VL1 and VL2, at the same rates.
    #[test]
    fn dual_table_split_depends_on_phase() {
        let cfg = VlArbitration::parse(3, 0, "0:64,1:64", "0:64,2:64").unwrap();
        let even = measure(&cfg, 4096, 0b110, &[(0, 4, &[0])], 40_000);
        let odd = measure(&cfg, 4096, 0b110, &[(0, 4, &[1])], 40_000);
        assert!((even[0] - 0.25).abs() < 1e-3 && (odd[0] - 0.25).abs() < 1e-3);
        assert!((even[1] - 0.25).abs() < 1e-3 && (even[2] - 0.5).abs() < 1e-3, "{even:?}");
        assert!((odd[1] - 0.5).abs() < 1e-3 && (odd[2] - 0.25).abs() < 1e-3, "{odd:?}");
        // The model splits VL0 by its offers (1/4 from each table): both runs are 1/8 away.
        let mut demand = [0.0; MAX_LANES];
        demand[..3].copy_from_slice(&[0.25, f64::INFINITY, f64::INFINITY]);
        let mut out = [0.0; MAX_LANES];
        cfg.rate_model(4096).unwrap().allocate(1.0, &demand, &mut out);
        assert!((out[0] - 0.25).abs() < 1e-12 && (out[1] - 0.375).abs() < 1e-12, "{out:?}");
    }

    #[test]
    fn allocate_with_unbounded_demand_is_the_saturated_shares() {
        let model = VlArbitration::paper().rate_model(2048).unwrap();
        let mut demand = [0.0; MAX_LANES];
        demand[1] = f64::INFINITY;
        demand[2] = f64::INFINITY;
        demand[7] = f64::INFINITY; // not served: gets nothing
        let mut out = [0.0; MAX_LANES];
        model.allocate(100.0, &demand, &mut out);
        let shares = model.saturated_shares(0b1000_0110);
        for v in 0..MAX_LANES {
            assert!((out[v] - 100.0 * shares[v]).abs() < 1e-9);
        }
        assert_eq!(out[7], 0.0);
        assert!(model.serves(2) && !model.serves(7) && !model.serves(200));
    }

    fn arb_table(max_vls: u8) -> impl Strategy<Value = Vec<VlArbEntry>> {
        prop::collection::vec((0..max_vls, any::<u8>()).prop_map(|(vl, weight)| VlArbEntry { vl, weight }), 1..=8)
    }

    /// Random valid configs: 1..=8 entries per table over up to 8 lanes, weights 0..=255 (zeros
    /// included), any limit.
    fn arb_config() -> impl Strategy<Value = VlArbitration> {
        (1..=8u8)
            .prop_flat_map(|m| (Just(m), any::<u8>(), arb_table(m), arb_table(m)))
            .prop_map(|(max_vls, high_limit, high, low)| VlArbitration { max_vls, high_limit, high, low })
            .prop_filter("some entry has a weight", |cfg| cfg.validate().is_ok())
    }

    /// `default_cases` cases, or `PROPTEST_CASES` when set (a longer soak than the default suite).
    fn depth(default_cases: u32) -> ProptestConfig {
        let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok());
        ProptestConfig::with_cases(cases.unwrap_or(default_cases))
    }

    fn arb_mtu() -> impl Strategy<Value = u32> {
        prop::sample::select(vec![256u32, 1024, 2048, 4096])
    }

    /// Per lane (up to 8): role 0 idle, 1 saturated, 2 fed one packet per `period` slots at `phase`.
    fn arb_roles() -> impl Strategy<Value = Vec<(u8, u64, u64)>> {
        prop::collection::vec((0..3u8, 2..=24u64, 0..24u64), 8)
    }

    fn in_both_tables(cfg: &VlArbitration, v: usize) -> bool {
        let has = |table: &[VlArbEntry]| table.iter().any(|e| e.vl as usize == v && e.weight > 0);
        has(&cfg.high) && has(&cfg.low)
    }

    /// Simulate `roles` on the packet arbiter; returns the model's shares, the measured ones, and the
    /// fed lanes served by both tables. With `feed_dual` false such lanes are saturated instead.
    fn demand_limited_case(
        cfg: &VlArbitration,
        mtu: u32,
        roles: &[(u8, u64, u64)],
        feed_dual: bool,
    ) -> ([f64; MAX_LANES], [f64; MAX_LANES], Vec<usize>) {
        let in_both = |v| in_both_tables(cfg, v);
        let mut saturated = 0u16;
        let mut arrivals = Vec::new();
        let mut demand = [0.0; MAX_LANES];
        for (v, &(role, period, phase)) in roles.iter().enumerate().take(cfg.max_vls as usize) {
            if role == 1 || (role == 2 && in_both(v) && !feed_dual) {
                saturated |= 1 << v;
                demand[v] = f64::INFINITY;
            } else if role == 2 {
                arrivals.push((v, period, [phase % period]));
                demand[v] = 1.0 / period as f64;
            }
        }
        let mut model = [0.0; MAX_LANES];
        cfg.rate_model(mtu).unwrap().allocate(1.0, &demand, &mut model);
        let n = (400 * (cycle_packets(cfg, mtu) + 2)).max(40_000);
        let feeds: Vec<Feed> = arrivals.iter().map(|(v, p, a)| (*v, *p, &a[..])).collect();
        let measured = measure(cfg, mtu, saturated, &feeds, n);
        let dual_fed = arrivals.iter().map(|a| a.0).filter(|&v| in_both(v)).collect();
        (model, measured, dual_fed)
    }

    proptest! {
        #![proptest_config(depth(64))]

        /// The rate model is the packet arbiter's long run. Over n packets each lane's count is off
        /// its long-run value by less than one round-robin cycle of each table plus one high/low
        /// turn, so with n >= 200 such cycles the shares are within 0.005.
        #[test]
        fn saturated_shares_match_the_packet_arbiter(
            cfg in arb_config(), mtu in arb_mtu(), backlogged in 1..=u8::MAX,
        ) {
            let backlogged = backlogged as u16 & ((1 << cfg.max_vls) - 1);
            let model = cfg.rate_model(mtu).unwrap().saturated_shares(backlogged);
            let n = (200 * (cycle_packets(&cfg, mtu) + 2)).max(20_000);
            let measured = measure(&cfg, mtu, backlogged, &[], n);
            assert_close(&measured, &model, 0.01);
            let total: f64 = model.iter().sum();
            let any_served = lanes_in(backlogged).any(|v| cfg.serves(v as Lane));
            let expected_total = if any_served { 1.0 } else { 0.0 };
            prop_assert!((total - expected_total).abs() < 1e-12, "total {}", total);
        }

        /// Lanes fed one packet every `period` slots (below or above their share) next to saturated
        /// lanes: the measured shares are `allocate` with those offered rates. Only lanes served by
        /// exactly one table are fed; a fed lane in both tables is made saturated instead (see
        /// `dual_table_split_depends_on_phase` for why).
        #[test]
        fn allocate_matches_the_packet_arbiter_with_demand_limited_lanes(
            cfg in arb_config(), mtu in arb_mtu(), roles in arb_roles(),
        ) {
            let (model, measured, _) = demand_limited_case(&cfg, mtu, &roles, false);
            assert_close(&measured, &model, 0.01);
        }

        #[test]
        fn allocate_is_feasible_and_work_conserving(
            cfg in arb_config(),
            mtu in arb_mtu(),
            capacity in 0.0..1e12f64,
            raw_demand in prop::collection::vec(prop_oneof![
                Just(0.0), Just(f64::INFINITY), 0.0..1e12f64, 0.0..1e3f64,
            ], MAX_LANES),
        ) {
            let model = cfg.rate_model(mtu).unwrap();
            let demand: [f64; MAX_LANES] = raw_demand.try_into().unwrap();
            let mut out = [f64::NAN; MAX_LANES];
            model.allocate(capacity, &demand, &mut out);
            let total: f64 = out.iter().sum();
            prop_assert!(total <= capacity * (1.0 + 1e-12), "total {total} > {capacity}");
            for v in 0..MAX_LANES {
                prop_assert!(out[v] >= 0.0 && out[v] <= demand[v], "lane {v}: {out:?}");
                prop_assert!(model.serves(v as Lane) || out[v] == 0.0);
                prop_assert_eq!(model.serves(v as Lane), cfg.serves(v as Lane));
            }
            if total < capacity * (1.0 - 1e-9) {
                for v in (0..MAX_LANES).filter(|&v| model.serves(v as Lane)) {
                    prop_assert!(out[v] >= demand[v] * (1.0 - 1e-9), "lane {v} short: {out:?}");
                }
            }
        }
    }

    proptest! {
        // Every case simulates a long run; fewer cases keep the suite fast. About one case in six
        // has no fed lane in both tables and is rejected.
        #![proptest_config(ProptestConfig { max_global_rejects: 10 * depth(24).cases, ..depth(24) })]

        /// A fed lane in both tables: which table serves it depends on phase, but its own rate is
        /// still the model's.
        #[test]
        fn a_demand_limited_lane_in_both_tables_gets_its_rate(
            cfg in arb_config(), mtu in arb_mtu(), roles in arb_roles(),
        ) {
            // Cases without such a lane would test nothing here.
            prop_assume!(roles.iter().enumerate().any(|(v, r)| r.0 == 2 && in_both_tables(&cfg, v)));
            let (model, measured, dual_fed) = demand_limited_case(&cfg, mtu, &roles, true);
            for v in dual_fed {
                prop_assert!((measured[v] - model[v]).abs() <= 0.01, "lane {}: {} vs {}", v, measured[v], model[v]);
            }
        }
    }
}
