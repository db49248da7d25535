//! Token buckets and a packet-level port: the reference pacing a hardware backend uses to send real
//! bytes, and the oracle that tests hold the rate model ([`crate::lanes::LaneShares`]) against.
//!
//! Time is integer nanoseconds (`u64`), so a replay gives the same packet times bit for bit.

use std::collections::VecDeque;

use crate::error::{CoreError, Result};
use crate::lanes::{Lane, PacketArbiter, VlArbitration, MAX_LANES};

const NS_PER_S: f64 = 1e9;

/// A token bucket: tokens (bytes) accrue at `rate_bytes_per_s` up to `burst_bytes`, and a packet may
/// start once the bucket holds its size. A packet larger than the burst may start when the bucket is
/// full; the bucket then goes into debt (negative tokens) that later packets wait to repay, so the
/// long-run rate still holds. It starts full at time 0. Times earlier than the last update are taken
/// as the last update (time never runs backwards).
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate_bytes_per_s: f64,
    burst_bytes: f64,
    /// Tokens at `updated_ns`; negative while in debt.
    tokens_bytes: f64,
    updated_ns: u64,
}

impl TokenBucket {
    /// A full bucket. `rate_bytes_per_s` must be positive and finite; `burst_bytes` must be >= 0
    /// (infinite: the bucket never limits; 0: packets are paced back to back at the rate).
    pub fn new(rate_bytes_per_s: f64, burst_bytes: f64) -> Result<Self> {
        if !(rate_bytes_per_s > 0.0 && rate_bytes_per_s.is_finite()) {
            return Err(CoreError::invalid(
                "rate_bytes_per_s",
                format!("expected a positive finite rate, got {rate_bytes_per_s}"),
            ));
        }
        if burst_bytes.is_nan() || burst_bytes < 0.0 {
            return Err(CoreError::invalid("burst_bytes", format!("expected >= 0 bytes, got {burst_bytes}")));
        }
        Ok(Self { rate_bytes_per_s, burst_bytes, tokens_bytes: burst_bytes, updated_ns: 0 })
    }

    /// The refill rate.
    pub fn rate_bytes_per_s(&self) -> f64 {
        self.rate_bytes_per_s
    }

    /// The bucket's capacity.
    pub fn burst_bytes(&self) -> f64 {
        self.burst_bytes
    }

    /// Tokens (bytes) in the bucket at `now_ns`; negative while in debt.
    pub fn tokens_at(&self, now_ns: u64) -> f64 {
        let elapsed_s = now_ns.saturating_sub(self.updated_ns) as f64 / NS_PER_S;
        (self.tokens_bytes + self.rate_bytes_per_s * elapsed_s).min(self.burst_bytes)
    }

    /// The first nanosecond at or after `now_ns` (and the last update) at which a packet of `bytes`
    /// may start: when the bucket holds `min(bytes, burst)` tokens. `u64::MAX` if never.
    pub fn earliest_send_ns(&self, now_ns: u64, bytes: u64) -> u64 {
        let now_ns = now_ns.max(self.updated_ns);
        let need = (bytes as f64).min(self.burst_bytes);
        let missing = need - self.tokens_at(now_ns);
        if missing <= 0.0 {
            return now_ns;
        }
        let wait_ns = (missing / self.rate_bytes_per_s * NS_PER_S).ceil();
        let mut t = now_ns.saturating_add(wait_ns as u64);
        // The float estimate may be a nanosecond off either way; settle on the exact first one.
        while t < u64::MAX && self.tokens_at(t) < need {
            t += 1;
        }
        while t > now_ns && self.tokens_at(t - 1) >= need {
            t -= 1;
        }
        t
    }

    /// Take `bytes` tokens at `now_ns`. No check: the caller asks [`TokenBucket::earliest_send_ns`]
    /// first; taking more than the bucket holds puts it in debt.
    pub fn consume(&mut self, now_ns: u64, bytes: u64) {
        let now_ns = now_ns.max(self.updated_ns);
        self.tokens_bytes = self.tokens_at(now_ns) - bytes as f64;
        self.updated_ns = now_ns;
    }
}

/// One packet put on the wire by a [`PacketPort`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentPacket {
    /// When its first byte goes on the wire.
    pub start_ns: u64,
    /// When its last byte has left (start + size / line rate, rounded up to the ns; see
    /// [`PacketPort`] for how back-to-back packets avoid accumulating the rounding).
    pub end_ns: u64,
    /// The virtual lane it was queued on.
    pub lane: Lane,
    /// Its size.
    pub bytes: u32,
}

/// The reference packet-level port: per-lane FIFOs of MTU packets, a [`PacketArbiter`] choosing
/// among them, a token bucket shaping the port and a line that sends one packet at a time.
///
/// Semantics: the port has a clock, `now_ns`, moved by [`PacketPort::run_until`]; bytes enqueued
/// are queued at that time. Whenever the line is free and a packet is queued, the arbiter chooses the
/// next packet among those queued then; the chosen packet starts as soon as the bucket allows and
/// occupies the line for `bytes / line rate`. Packets are sent back to back: the port never idles
/// while a packet is queued except to wait for tokens. Packet times are whole nanoseconds (an end
/// rounded up); the line keeps the sub-nanosecond remainder, so a train of back-to-back packets ends
/// exactly when its bytes at the line rate say, rounded up.
#[derive(Clone, Debug)]
pub struct PacketPort {
    line_rate_bytes_per_s: f64,
    bucket: TokenBucket,
    mtu_bytes: u32,
    arbiter: PacketArbiter,
    serves: [bool; MAX_LANES],
    /// Unsent bytes of each queued message per lane, oldest first; a message leaves as MTU packets.
    queues: [VecDeque<u64>; MAX_LANES],
    /// A packet the arbiter has chosen that is waiting for tokens.
    chosen: Option<(Lane, u32)>,
    now_ns: u64,
    /// When the packet on the wire ends, rounded up to the ns...
    line_free_ns: u64,
    /// ...and by how much it really ended earlier (0..1 ns).
    line_lead_ns: f64,
    sent_bytes: [u64; MAX_LANES],
}

impl PacketPort {
    /// An idle port at time 0. `line_rate_bytes_per_s` must be positive and finite, `mtu_bytes`
    /// positive, and the arbitration valid.
    pub fn new(
        line_rate_bytes_per_s: f64,
        bucket: TokenBucket,
        mtu_bytes: u32,
        arbitration: &VlArbitration,
    ) -> Result<Self> {
        if !(line_rate_bytes_per_s > 0.0 && line_rate_bytes_per_s.is_finite()) {
            return Err(CoreError::invalid(
                "line_rate_bytes_per_s",
                format!("expected a positive finite rate, got {line_rate_bytes_per_s}"),
            ));
        }
        if mtu_bytes == 0 {
            return Err(CoreError::invalid("mtu_bytes", "expected a packet size > 0 bytes"));
        }
        Ok(Self {
            line_rate_bytes_per_s,
            bucket,
            mtu_bytes,
            arbiter: PacketArbiter::new(arbitration)?,
            serves: std::array::from_fn(|v| arbitration.serves(v as Lane)),
            queues: std::array::from_fn(|_| VecDeque::new()),
            chosen: None,
            now_ns: 0,
            line_free_ns: 0,
            line_lead_ns: 0.0,
            sent_bytes: [0; MAX_LANES],
        })
    }

    /// Queue `bytes` on `lane` at the port's current time, as MTU packets (the last one smaller).
    /// Zero bytes queue nothing. The lane must be served by the arbitration, else its bytes could
    /// never leave.
    pub fn enqueue(&mut self, lane: Lane, bytes: u64) -> Result<()> {
        if !self.serves.get(lane as usize).copied().unwrap_or(false) {
            return Err(CoreError::invalid(
                "lane",
                format!("lane {lane} has no nonzero weight in the arbitration tables, so it is never sent"),
            ));
        }
        if bytes > 0 {
            self.queues[lane as usize].push_back(bytes);
        }
        Ok(())
    }

    /// Advance the clock to `t_ns` (if later), sending packets; returns those that start at or before
    /// `t_ns` (one may still be on the wire at `t_ns`).
    pub fn run_until(&mut self, t_ns: u64) -> Vec<SentPacket> {
        let mut sent = Vec::new();
        loop {
            // The arbiter decides when the line frees up, among the packets queued by then.
            let decide_ns = self.now_ns.max(self.line_free_ns);
            if decide_ns > t_ns {
                break;
            }
            let (lane, bytes) = match self.chosen {
                Some(packet) => packet,
                None => {
                    let head = std::array::from_fn(|v| self.head_packet_bytes(v));
                    let Some(lane) = self.arbiter.select(&head) else { break };
                    self.take_head_packet(lane as usize, head[lane as usize]);
                    // Held until it starts: the arbiter has already accounted for this packet.
                    self.chosen = Some((lane, head[lane as usize]));
                    (lane, head[lane as usize])
                }
            };
            let start_ns = self.bucket.earliest_send_ns(decide_ns, bytes as u64);
            if start_ns > t_ns {
                break;
            }
            self.chosen = None;
            self.bucket.consume(start_ns, bytes as u64);
            let (busy_ns, lead_ns) = self.wire_ns(start_ns, bytes);
            let end_ns = start_ns.saturating_add(busy_ns);
            self.line_free_ns = end_ns;
            self.line_lead_ns = lead_ns;
            self.sent_bytes[lane as usize] += bytes as u64;
            sent.push(SentPacket { start_ns, end_ns, lane, bytes });
        }
        self.now_ns = self.now_ns.max(t_ns);
        sent
    }

    /// Size of the packet at the head of lane `v`, 0 if the lane is empty.
    fn head_packet_bytes(&self, v: usize) -> u32 {
        self.queues[v].front().map_or(0, |&message_bytes| message_bytes.min(self.mtu_bytes as u64) as u32)
    }

    fn take_head_packet(&mut self, v: usize, bytes: u32) {
        let queue = &mut self.queues[v];
        if let Some(message_bytes) = queue.front_mut() {
            *message_bytes -= bytes as u64;
            if *message_bytes == 0 {
                queue.pop_front();
            }
        }
    }

    /// Nanoseconds the line is busy with a packet of `bytes` starting at `start_ns`, rounded up, and
    /// the line's new sub-nanosecond lead. A packet sent back to back starts where the previous one
    /// really ended, so rounding never accumulates and the line runs at exactly its rate. A result
    /// within float noise of a whole nanosecond is that nanosecond (4096 B at 4.096 GB/s is 1000 ns).
    fn wire_ns(&self, start_ns: u64, bytes: u32) -> (u64, f64) {
        let lead_ns = if start_ns == self.line_free_ns { self.line_lead_ns } else { 0.0 };
        let exact_ns = bytes as f64 / self.line_rate_bytes_per_s * NS_PER_S - lead_ns;
        let nearest_ns = exact_ns.round();
        let is_whole = (exact_ns - nearest_ns).abs() <= 1e-9 * nearest_ns.max(1.0);
        // max(0): a tiny packet may fit entirely in the lead.
        let busy_ns = if is_whole { nearest_ns } else { exact_ns.ceil() }.max(0.0);
        (busy_ns as u64, (busy_ns - exact_ns).max(0.0))
    }

    /// Bytes of `lane` that have started on the wire (0 for a lane out of range).
    pub fn bytes_sent(&self, lane: Lane) -> u64 {
        self.sent_bytes.get(lane as usize).copied().unwrap_or(0)
    }

    /// The port's clock: the latest `t_ns` it was run until.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// True if nothing is queued and the last packet has left the wire by the port's clock.
    pub fn is_idle(&self) -> bool {
        self.chosen.is_none() && self.queues.iter().all(VecDeque::is_empty) && self.line_free_ns <= self.now_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use proptest::prelude::*;

    /// 4096 bytes per microsecond.
    const LINE_RATE: f64 = 4.096e9;

    fn unlimited() -> TokenBucket {
        TokenBucket::new(LINE_RATE, f64::INFINITY).unwrap()
    }

    #[test]
    fn bad_arguments_are_named() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = TokenBucket::new(rate, 1.0).unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidArgument);
            assert!(err.message.starts_with("rate_bytes_per_s: "), "{err}");
        }
        for burst in [-1.0, f64::NAN] {
            assert!(TokenBucket::new(1.0, burst).unwrap_err().message.starts_with("burst_bytes: "));
        }
        let cfg = VlArbitration::strict_priority(&[0], &[1]);
        let err = PacketPort::new(0.0, unlimited(), 4096, &cfg).unwrap_err();
        assert!(err.message.starts_with("line_rate_bytes_per_s: "), "{err}");
        assert!(PacketPort::new(LINE_RATE, unlimited(), 0, &cfg).unwrap_err().message.starts_with("mtu_bytes: "));
        assert_eq!(
            PacketPort::new(LINE_RATE, unlimited(), 4096, &VlArbitration::fair(0)).unwrap_err().kind,
            ErrorKind::Config
        );
        let mut port = PacketPort::new(LINE_RATE, unlimited(), 4096, &VlArbitration::paper()).unwrap();
        assert!(port.enqueue(4, 1).unwrap_err().message.starts_with("lane: "));
        assert!(port.enqueue(200, 1).is_err());
        // VL2 has weight 0 in the high table but 64 in the low one: served.
        port.enqueue(2, 1).unwrap();
    }

    #[test]
    fn bucket_refills_up_to_the_burst() {
        // 1 byte per ns, 1000-byte burst.
        let mut b = TokenBucket::new(1e9, 1000.0).unwrap();
        assert_eq!(b.tokens_at(0), 1000.0);
        assert_eq!(b.earliest_send_ns(0, 1000), 0);
        b.consume(0, 1000);
        assert_eq!(b.tokens_at(0), 0.0);
        assert_eq!(b.tokens_at(250), 250.0);
        assert_eq!(b.tokens_at(5000), 1000.0);
        assert_eq!(b.earliest_send_ns(0, 500), 500);
        assert_eq!(b.earliest_send_ns(600, 500), 600);
        // A packet larger than the burst goes when the bucket is full, and leaves a debt.
        assert_eq!(b.earliest_send_ns(0, 3000), 1000);
        b.consume(1000, 3000);
        assert_eq!(b.tokens_at(1000), -2000.0);
        assert_eq!(b.earliest_send_ns(1000, 100), 3100);
        // Times before the last update count as the last update; even an empty packet waits out a debt.
        assert_eq!(b.tokens_at(0), -2000.0);
        assert_eq!(b.earliest_send_ns(0, 100), 3100);
        assert_eq!(b.earliest_send_ns(0, 0), 3000);
    }

    #[test]
    fn zero_burst_paces_packets_at_the_rate() {
        let mut b = TokenBucket::new(1e9, 0.0).unwrap();
        let mut t = 0;
        for expected in [0, 100, 200] {
            t = b.earliest_send_ns(t, 100);
            assert_eq!(t, expected);
            b.consume(t, 100);
        }
    }

    proptest! {
        /// In any window between two packet starts the bucket lets through at most
        /// rate * window + max(burst, largest packet) bytes: just rate * window + burst when every
        /// packet fits the burst, plus the one-off debt of a packet that does not.
        #[test]
        fn bucket_bounds_every_window(
            rate in 1e6..1e10f64,
            burst in prop_oneof![Just(0.0), 0.0..1e5f64],
            packets in prop::collection::vec((1u64..20_000, 0u64..50_000), 2..40),
        ) {
            let mut b = TokenBucket::new(rate, burst).unwrap();
            let mut starts = Vec::new();
            let mut t = 0;
            for &(bytes, gap_ns) in &packets {
                let ready = t + gap_ns;
                t = b.earliest_send_ns(ready, bytes);
                let need = (bytes as f64).min(burst);
                prop_assert!(b.tokens_at(t) >= need);
                // The first such nanosecond.
                prop_assert!(t == ready || b.tokens_at(t - 1) < need);
                b.consume(t, bytes);
                starts.push(t);
            }
            let slack = burst.max(packets.iter().map(|p| p.0).max().unwrap() as f64);
            for i in 0..starts.len() {
                let mut window_bytes = 0.0;
                for j in i..starts.len() {
                    window_bytes += packets[j].0 as f64;
                    let bound = rate * (starts[j] - starts[i]) as f64 / NS_PER_S + slack;
                    prop_assert!(window_bytes <= bound * (1.0 + 1e-9), "{window_bytes} > {bound} in [{i}, {j}]");
                }
            }
        }
    }

    fn starts(packets: &[SentPacket]) -> Vec<u64> {
        packets.iter().map(|p| p.start_ns).collect()
    }

    #[test]
    fn ten_mtu_packets_take_ten_microseconds() {
        let mut port = PacketPort::new(LINE_RATE, unlimited(), 4096, &VlArbitration::fair(1)).unwrap();
        port.enqueue(0, 10 * 4096).unwrap();
        let sent = port.run_until(9_999);
        assert_eq!(starts(&sent), (0..10).map(|i| i * 1000).collect::<Vec<_>>());
        assert_eq!(sent.last().unwrap().end_ns, 10_000);
        assert!(sent.iter().all(|p| p.bytes == 4096 && p.lane == 0));
        assert!(!port.is_idle());
        assert!(port.run_until(10_000).is_empty());
        assert!(port.is_idle());
        assert_eq!(port.bytes_sent(0), 40_960);
    }

    #[test]
    fn messages_split_into_mtu_packets() {
        let mut port = PacketPort::new(LINE_RATE, unlimited(), 4096, &VlArbitration::fair(1)).unwrap();
        port.enqueue(0, 10_000).unwrap();
        port.enqueue(0, 0).unwrap();
        let sent = port.run_until(u64::MAX);
        assert_eq!(sent.iter().map(|p| p.bytes).collect::<Vec<_>>(), [4096, 4096, 1808]);
        // 1808 B at 4.096 B/ns is 441.4 ns, rounded up.
        assert_eq!(sent[2].end_ns, 2442);
    }

    #[test]
    fn bucket_at_half_the_line_rate_spaces_packets() {
        let bucket = TokenBucket::new(LINE_RATE / 2.0, 4096.0).unwrap();
        let mut port = PacketPort::new(LINE_RATE, bucket, 4096, &VlArbitration::fair(1)).unwrap();
        port.enqueue(0, 10 * 4096).unwrap();
        let sent = port.run_until(u64::MAX);
        assert_eq!(starts(&sent), (0..10).map(|i| i * 2000).collect::<Vec<_>>());
        assert_eq!(sent.last().unwrap().end_ns, 19_000);
    }

    #[test]
    fn a_packet_chosen_while_waiting_for_tokens_keeps_its_turn() {
        // 1 byte per ns, 4096 B burst, 409.6 ns per packet on the line. The second low packet is chosen
        // when the first one ends and waits for tokens until 4096 ns; the high packet queued at 1000 ns
        // goes after it.
        let bucket = TokenBucket::new(1e9, 4096.0).unwrap();
        let mut port = PacketPort::new(1e10, bucket, 4096, &VlArbitration::strict_priority(&[0], &[1])).unwrap();
        port.enqueue(1, 2 * 4096).unwrap();
        assert_eq!(starts(&port.run_until(0)), [0]);
        assert!(port.run_until(1000).is_empty());
        port.enqueue(0, 4096).unwrap();
        let sent = port.run_until(u64::MAX);
        assert_eq!(sent.iter().map(|p| (p.lane, p.start_ns)).collect::<Vec<_>>(), [(1, 4096), (0, 8192)]);
    }

    #[test]
    fn port_shares_follow_the_arbitration() {
        // Weights 256 B and 768 B at a 256 B MTU: lanes 0 and 1 get 1 and 3 packets a round.
        let cfg = VlArbitration::weighted_round_robin(&[(0, 4), (1, 12)]);
        let mut port = PacketPort::new(LINE_RATE, unlimited(), 256, &cfg).unwrap();
        port.enqueue(0, 1 << 20).unwrap();
        port.enqueue(1, 1 << 20).unwrap();
        let sent = port.run_until(100_000);
        let total: u64 = sent.iter().map(|p| p.bytes as u64).sum();
        let expected = cfg.rate_model(256).unwrap().saturated_shares(0b11);
        for lane in 0..2 {
            let share = port.bytes_sent(lane) as f64 / total as f64;
            assert!((share - expected[lane as usize]).abs() < 0.01, "lane {lane}: {share}");
        }
        // Back to back at exactly the line rate, although a packet takes 62.5 ns: 100 us at 4096 B/us
        // (plus the packet starting at 100 us).
        assert_eq!(sent.iter().filter(|p| p.end_ns <= 100_000).map(|p| p.bytes).sum::<u32>(), 409_600);
        assert_eq!(sent.last().unwrap().start_ns, 100_000);
    }

    /// `default_cases` cases, or `PROPTEST_CASES` when set (a longer soak than the default suite).
    fn depth(default_cases: u32) -> ProptestConfig {
        let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok());
        ProptestConfig::with_cases(cases.unwrap_or(default_cases))
    }

    fn arb_arbitration() -> impl Strategy<Value = VlArbitration> {
        prop::sample::select(vec![
            VlArbitration::paper(),
            VlArbitration::strict_priority(&[0], &[1, 2]),
            VlArbitration::parse(3, 0, "0:64,1:16", "2:64,0:8").unwrap(),
            VlArbitration::weighted_round_robin(&[(0, 1), (1, 3), (2, 200)]),
            VlArbitration::fair(3),
        ])
    }

    proptest! {
        #![proptest_config(depth(128))]

        /// Replays the port against its definition: every packet starts exactly when the line is
        /// free, something is queued, and a bucket replayed alongside allows it (never idle while
        /// backlogged, never early); packets do not overlap, keep each lane's FIFO order, and every
        /// byte leaves.
        #[test]
        fn port_is_work_conserving_and_exact(
            cfg in arb_arbitration(),
            line_rate in 1e8..1e11f64,
            bucket_rate_factor in 0.1..2.0f64,
            burst in prop_oneof![Just(0.0), 0.0..1e5f64, Just(f64::INFINITY)],
            mtu in prop::sample::select(vec![256u32, 1024, 4096]),
            events in prop::collection::vec((0u64..20_000, 0u8..3, 1u64..20_000), 1..30),
        ) {
            let bucket = TokenBucket::new(line_rate * bucket_rate_factor, burst).unwrap();
            let mut port = PacketPort::new(line_rate, bucket.clone(), mtu, &cfg).unwrap();
            let lanes: Vec<Lane> = (0..3).filter(|&l| cfg.serves(l)).collect();
            let mut sent = Vec::new();
            let mut enqueued = Vec::new(); // (time, bytes)
            let mut expected_sizes: [Vec<u32>; MAX_LANES] = Default::default();
            let mut t = 0;
            for &(gap_ns, lane_index, bytes) in &events {
                t += gap_ns;
                sent.extend(port.run_until(t));
                let lane = lanes[lane_index as usize % lanes.len()];
                port.enqueue(lane, bytes).unwrap();
                enqueued.push((t, bytes));
                let sizes = &mut expected_sizes[lane as usize];
                sizes.extend(std::iter::repeat(mtu).take((bytes / mtu as u64) as usize));
                sizes.extend(Some((bytes % mtu as u64) as u32).filter(|&b| b > 0));
            }
            sent.extend(port.run_until(t + 1_000_000_000_000));
            prop_assert!(port.is_idle());

            let mut replay = bucket;
            let mut line_free_ns = 0;
            let mut sent_bytes = 0;
            for p in &sent {
                let queued_by = |time: u64| enqueued.iter().filter(|e| e.0 <= time).map(|e| e.1).sum::<u64>();
                let ready_ns = if queued_by(line_free_ns) > sent_bytes {
                    line_free_ns
                } else {
                    enqueued.iter().map(|e| e.0).find(|&e| e > line_free_ns).unwrap()
                };
                prop_assert_eq!(p.start_ns, replay.earliest_send_ns(ready_ns, p.bytes as u64), "{:?}", p);
                let wire_ns = p.bytes as f64 / line_rate * NS_PER_S;
                prop_assert!(((p.end_ns - p.start_ns) as f64 - wire_ns).abs() < 1.0 + 1e-6);
                replay.consume(p.start_ns, p.bytes as u64);
                line_free_ns = p.end_ns;
                sent_bytes += p.bytes as u64;
            }
            for lane in 0..MAX_LANES as Lane {
                let sizes: Vec<u32> = sent.iter().filter(|p| p.lane == lane).map(|p| p.bytes).collect();
                prop_assert_eq!(&sizes, &expected_sizes[lane as usize]);
                prop_assert_eq!(port.bytes_sent(lane), sizes.iter().map(|&b| b as u64).sum::<u64>());
            }
        }
    }
}
