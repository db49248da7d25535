//! A pacer for real bytes: one port of a hardware backend (file reads, socket sends) that moves bytes
//! itself and asks this port, once per batch, which chunks it may move now. A token bucket sets the
//! port's rate and the exact [`PacketArbiter`] of [`crate::lanes`] decides whose chunk goes next, so
//! lanes keep their isolation on real bytes: a chunk of the high lane goes before queued chunks of the
//! low lane.
//!
//! Unlike [`crate::bucket::PacketPort`], which models a line (packets occupy a wire for their bytes at
//! the line rate), this port has no line: the caller moves a granted chunk at whatever speed its
//! device has, and the port only paces when chunks may start. It never reads a clock: time is integer
//! nanoseconds passed in by the caller, so a replay grants the same chunks at the same times.
//!
//! # Semantics
//!
//! * **Messages and chunks.** [`PacketPort::enqueue`] queues a message of `size_bytes` (>= 1) on a
//!   lane with the caller's tag. It leaves as chunks of `chunk_bytes`, the last one smaller. Messages
//!   on one lane are FIFO, and a message's chunks go in order.
//! * **Who goes next.** With an arbitration, each lane has its own FIFO and the next chunk is the head
//!   chunk of the lane the [`PacketArbiter`] selects over the lanes' head-chunk sizes (a chunk is its
//!   packet: weights and the high limit count chunk bytes). Without one there is no isolation: all
//!   lanes share one FIFO, in enqueue order (lanes are still counted per lane).
//! * **Token bucket with debt.** Tokens (bytes) start at `burst_bytes` and refill at
//!   `rate_bytes_per_s` up to `burst_bytes`. A chunk may be granted while the bucket holds more than 0
//!   tokens, and it takes its whole size, which may leave the bucket in debt. Waiting for a whole
//!   chunk's tokens instead would, with a burst of one chunk, lose to the cap whatever refills in the
//!   fraction of a nanosecond each wait is rounded up by, and drift below the rate; with debt nothing
//!   is lost, the long-run rate is exact, and the bytes granted by time `t` never exceed
//!   `burst + rate * t + chunk_bytes`. An infinite burst never limits (the arbitration still orders).
//! * **Granting.** [`PacketPort::grant`] at `now_ns` grants chunks, in order, while the bucket holds
//!   tokens at `now_ns`, a chunk is queued and fewer than `max_chunks` have been granted by this call.
//!   [`PacketPort::next_grant_ns`] says when the next call would grant something, so a backend can
//!   sleep until then. Time must not go backwards between calls.
//! * **Cancelling.** [`PacketPort::cancel`] drops the chunks not yet granted of every message with a
//!   tag; a message cancelled part way never sends its last chunk.
//! * **Changing the rate.** [`PacketPort::set_rate`] at `now_ns` (a fault: a degraded or dead port)
//!   settles the bucket at the old rate up to `now_ns`, then refills it at the new one, optionally up
//!   to a new capacity: tokens earned before are kept (a debt is repaid at the new rate; tokens above a
//!   smaller capacity are dropped, as the bucket drops what it cannot hold), none is earned twice. Rate
//!   0 pauses the port: it grants nothing, [`PacketPort::next_grant_ns`] says `None`, its tokens stay as
//!   they were, and what is queued waits until a rate above 0 is set.
//!
//! Counters saturate rather than overflow; the bytes queued at once are limited to `u64::MAX`.

use std::collections::VecDeque;

use crate::bucket::TokenBucket;
use crate::error::{CoreError, Result};
use crate::lanes::{Lane, PacketArbiter, VlArbitration, MAX_LANES};

const NS_PER_S: f64 = 1e9;

/// The chunk size a port has unless told otherwise (64 KiB: large enough that a batch of chunks is
/// cheap to grant, small enough that a high-lane message waits behind at most one low-lane chunk).
pub const DEFAULT_CHUNK_BYTES: u32 = 65536;

/// One chunk [`PacketPort::grant`] lets the caller move now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The tag of the message the chunk belongs to.
    pub tag: u64,
    /// The message's lane.
    pub lane: Lane,
    /// The chunk's size: `chunk_bytes`, or less for a message's last chunk.
    pub bytes: u32,
    /// True for the message's last chunk: once it is moved, the message is done.
    pub last: bool,
}

/// A queued message: what is left of it.
#[derive(Clone, Debug)]
struct Message {
    tag: u64,
    lane: Lane,
    /// Bytes not granted yet; > 0 while queued.
    left_bytes: u64,
}

/// The port's token bucket: [`TokenBucket`]'s arithmetic (the same tokens at the same times), with a
/// rate that may change part way and may be 0 (paused: no refill).
#[derive(Clone, Debug)]
struct Bucket {
    rate_bytes_per_s: f64,
    burst_bytes: f64,
    /// Tokens at `updated_ns`; negative while in debt.
    tokens_bytes: f64,
    updated_ns: u64,
}

impl Bucket {
    /// Tokens (bytes) in the bucket at `now_ns`; negative while in debt.
    fn tokens_at(&self, now_ns: u64) -> f64 {
        let elapsed_s = now_ns.saturating_sub(self.updated_ns) as f64 / NS_PER_S;
        (self.tokens_bytes + self.rate_bytes_per_s * elapsed_s).min(self.burst_bytes)
    }

    /// Take `bytes` tokens at `now_ns` (into debt if it holds fewer).
    fn consume(&mut self, now_ns: u64, bytes: u64) {
        let now_ns = now_ns.max(self.updated_ns);
        self.tokens_bytes = self.tokens_at(now_ns) - bytes as f64;
        self.updated_ns = now_ns;
    }

    /// Refill at `rate_bytes_per_s` up to `burst_bytes` from `now_ns` on, keeping the tokens earned at the
    /// old rate until then (no more than the new capacity holds).
    fn set_rate(&mut self, now_ns: u64, rate_bytes_per_s: f64, burst_bytes: f64) {
        let now_ns = now_ns.max(self.updated_ns);
        self.tokens_bytes = self.tokens_at(now_ns).min(burst_bytes);
        self.updated_ns = now_ns;
        self.rate_bytes_per_s = rate_bytes_per_s;
        self.burst_bytes = burst_bytes;
    }
}

/// A token-bucket pacer with per-lane arbitration over chunks of real bytes (see the module doc).
#[derive(Clone, Debug)]
pub struct PacketPort {
    bucket: Bucket,
    chunk_bytes: u32,
    /// `None`: one FIFO for all lanes (no isolation).
    arbiter: Option<PacketArbiter>,
    /// The lanes `enqueue` accepts: those the arbitration serves, or every lane without one.
    accepts: [bool; MAX_LANES],
    /// One FIFO per lane with an arbiter, a single FIFO without.
    queues: Vec<VecDeque<Message>>,
    /// The latest time the caller has granted at.
    now_ns: u64,
    queued_bytes: [u64; MAX_LANES],
    granted_bytes: [u64; MAX_LANES],
}

impl PacketPort {
    /// A port at time 0 with a full bucket. `rate_bytes_per_s` must be positive and finite,
    /// `chunk_bytes` >= 1, `burst_bytes` (default: one chunk) >= `chunk_bytes` (infinite: no pacing),
    /// and the arbitration, if any, valid. Errors name the argument (the arbitration's: its knob).
    pub fn new(
        rate_bytes_per_s: f64,
        burst_bytes: Option<f64>,
        arbitration: Option<&VlArbitration>,
        chunk_bytes: u32,
    ) -> Result<Self> {
        if chunk_bytes == 0 {
            return Err(CoreError::invalid("chunk_bytes", "expected a chunk size >= 1 byte, got 0"));
        }
        let burst_bytes = burst_bytes.unwrap_or(chunk_bytes as f64);
        if burst_bytes.is_nan() || burst_bytes < chunk_bytes as f64 {
            return Err(CoreError::invalid(
                "burst_bytes",
                format!("expected >= chunk_bytes ({chunk_bytes}), got {burst_bytes}"),
            ));
        }
        let checked = TokenBucket::new(rate_bytes_per_s, burst_bytes)?; // the arguments' checks
        let bucket = Bucket {
            rate_bytes_per_s: checked.rate_bytes_per_s(),
            burst_bytes: checked.burst_bytes(),
            tokens_bytes: checked.burst_bytes(),
            updated_ns: 0,
        };
        let arbiter = arbitration.map(PacketArbiter::new).transpose()?;
        let accepts = std::array::from_fn(|v| arbitration.map_or(true, |a| a.serves(v as Lane)));
        let n_queues = if arbiter.is_some() { MAX_LANES } else { 1 };
        Ok(Self {
            bucket,
            chunk_bytes,
            arbiter,
            accepts,
            queues: vec![VecDeque::new(); n_queues],
            now_ns: 0,
            queued_bytes: [0; MAX_LANES],
            granted_bytes: [0; MAX_LANES],
        })
    }

    /// Queue a message of `size_bytes` (>= 1) on `lane` with the caller's `tag` (tags need not be
    /// unique). With an arbitration the lane must be one it serves (else its bytes would never be
    /// granted); without, any lane below `MAX_LANES`.
    pub fn enqueue(&mut self, lane: Lane, size_bytes: u64, tag: u64) -> Result<()> {
        if lane as usize >= MAX_LANES {
            return Err(CoreError::invalid("lane", format!("expected a lane in 0..{MAX_LANES}, got {lane}")));
        }
        if !self.accepts[lane as usize] {
            return Err(CoreError::invalid(
                "lane",
                format!("lane {lane} has no nonzero weight in the arbitration tables, so it would never be granted"),
            ));
        }
        if size_bytes == 0 {
            return Err(CoreError::invalid("size_bytes", "expected a message of >= 1 byte, got 0"));
        }
        // Bounding the total keeps every byte counter below u64::MAX.
        if self.queued_bytes(None)?.checked_add(size_bytes).is_none() {
            return Err(CoreError::invalid(
                "size_bytes",
                format!("{size_bytes} more bytes would queue more than {} in all", u64::MAX),
            ));
        }
        let queue = self.queue_index(lane);
        self.queues[queue].push_back(Message { tag, lane, left_bytes: size_bytes });
        self.queued_bytes[lane as usize] += size_bytes;
        Ok(())
    }

    /// Grant chunks at `now_ns` (>= every earlier call's time): while the bucket holds tokens, a
    /// chunk is queued and fewer than `max_chunks` (>= 1) are granted, the next chunk (module doc) is
    /// granted and its bytes taken from the bucket. Returns them in grant order.
    pub fn grant(&mut self, now_ns: u64, max_chunks: usize) -> Result<Vec<Grant>> {
        self.check_time(now_ns)?;
        if max_chunks == 0 {
            return Err(CoreError::invalid("max_chunks", "expected >= 1 chunk per call, got 0"));
        }
        self.now_ns = now_ns;
        let mut granted = Vec::new();
        if self.paused() {
            return Ok(granted);
        }
        while granted.len() < max_chunks && self.bucket.tokens_at(now_ns) > 0.0 {
            let Some(chunk) = self.take_next_chunk() else { break };
            self.bucket.consume(now_ns, chunk.bytes as u64);
            let lane = chunk.lane as usize;
            self.queued_bytes[lane] -= chunk.bytes as u64;
            self.granted_bytes[lane] = self.granted_bytes[lane].saturating_add(chunk.bytes as u64);
            granted.push(chunk);
        }
        Ok(granted)
    }

    /// The earliest time >= `now_ns` (>= every earlier grant's time) at which [`PacketPort::grant`]
    /// grants at least one chunk, `None` if nothing is queued or the port is paused (rate 0). Whole
    /// nanoseconds, rounded up: a grant at the result grants, one at the nanosecond before (if >=
    /// `now_ns`) does not. `u64::MAX` if the bucket does not refill within `u64` nanoseconds (absurdly
    /// low rates only).
    pub fn next_grant_ns(&self, now_ns: u64) -> Result<Option<u64>> {
        self.check_time(now_ns)?;
        if self.paused() || self.queues.iter().all(VecDeque::is_empty) {
            return Ok(None);
        }
        Ok(Some(first_ns_with_tokens(&self.bucket, now_ns)))
    }

    /// Refill the bucket at `rate_bytes_per_s` (finite, >= 0; 0 pauses the port) from `now_ns` (>= every
    /// earlier call's time) on: what it earned at the old rate until `now_ns` is kept, and a debt is
    /// repaid at the new rate. `burst_bytes` (>= `chunk_bytes`; `None`: as it was) is its capacity from
    /// then on: tokens above a smaller one are dropped, as the bucket drops what it cannot hold, and a
    /// larger one fills at the rate, not at once. Later calls must not be before `now_ns`.
    pub fn set_rate(&mut self, now_ns: u64, rate_bytes_per_s: f64, burst_bytes: Option<f64>) -> Result<()> {
        self.check_time(now_ns)?;
        if !(rate_bytes_per_s >= 0.0 && rate_bytes_per_s.is_finite()) {
            return Err(CoreError::invalid(
                "rate_bytes_per_s",
                format!("expected a finite rate >= 0 (0: paused), got {rate_bytes_per_s}"),
            ));
        }
        let burst_bytes = burst_bytes.unwrap_or(self.bucket.burst_bytes);
        if burst_bytes.is_nan() || burst_bytes < self.chunk_bytes as f64 {
            return Err(CoreError::invalid(
                "burst_bytes",
                format!("expected >= chunk_bytes ({}), got {burst_bytes}", self.chunk_bytes),
            ));
        }
        self.now_ns = now_ns;
        self.bucket.set_rate(now_ns, rate_bytes_per_s, burst_bytes);
        Ok(())
    }

    /// Whether the port is paused (rate 0: [`PacketPort::set_rate`]).
    pub fn paused(&self) -> bool {
        self.bucket.rate_bytes_per_s == 0.0
    }

    /// Drop the chunks not yet granted of every queued message tagged `tag`; returns the bytes
    /// dropped (0 if there is none). Granted chunks are the caller's and stay counted.
    pub fn cancel(&mut self, tag: u64) -> u64 {
        let mut dropped = 0;
        for queue in &mut self.queues {
            queue.retain(|m| {
                if m.tag != tag {
                    return true;
                }
                self.queued_bytes[m.lane as usize] -= m.left_bytes;
                dropped += m.left_bytes;
                false
            });
        }
        // The arbiter keeps its state: it only ever sees the chunks that are still queued.
        dropped
    }

    /// Bytes queued and not yet granted on `lane`, or on all lanes for `None`.
    pub fn queued_bytes(&self, lane: Option<Lane>) -> Result<u64> {
        Ok(match lane {
            // Cannot overflow: `enqueue` bounds the total.
            None => self.queued_bytes.iter().sum(),
            Some(lane) => self.queued_bytes[lane_index(lane)?],
        })
    }

    /// Bytes granted so far on `lane`, or on all lanes for `None`.
    pub fn granted_bytes(&self, lane: Option<Lane>) -> Result<u64> {
        Ok(match lane {
            None => self.granted_bytes.iter().fold(0u64, |sum, &b| sum.saturating_add(b)),
            Some(lane) => self.granted_bytes[lane_index(lane)?],
        })
    }

    /// Messages with chunks not yet granted.
    pub fn queued_messages(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// The bucket's refill rate now (0 while paused).
    pub fn rate_bytes_per_s(&self) -> f64 {
        self.bucket.rate_bytes_per_s
    }

    /// The bucket's capacity (and its tokens at time 0).
    pub fn burst_bytes(&self) -> f64 {
        self.bucket.burst_bytes
    }

    /// The largest chunk a message is cut into.
    pub fn chunk_bytes(&self) -> u32 {
        self.chunk_bytes
    }

    /// The port's clock: the time of the latest grant call (0 before the first).
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    fn check_time(&self, now_ns: u64) -> Result<()> {
        if now_ns < self.now_ns {
            return Err(CoreError::invalid(
                "now_ns",
                format!("time went backwards: {now_ns} ns is before the port's last grant at {} ns", self.now_ns),
            ));
        }
        Ok(())
    }

    fn queue_index(&self, lane: Lane) -> usize {
        if self.arbiter.is_some() {
            lane as usize
        } else {
            0
        }
    }

    /// Size of the head chunk of `queue`, 0 if it is empty.
    fn head_chunk_bytes(&self, queue: usize) -> u32 {
        self.queues[queue].front().map_or(0, |m| m.left_bytes.min(self.chunk_bytes as u64) as u32)
    }

    /// Take the next chunk off its queue (module doc: the arbiter's pick, or the FIFO head), or
    /// `None` if nothing is queued.
    fn take_next_chunk(&mut self) -> Option<Grant> {
        let queue = if self.arbiter.is_some() {
            let heads: [u32; MAX_LANES] = std::array::from_fn(|v| self.head_chunk_bytes(v));
            // Every queued lane is served (enqueue checks), so the arbiter picks one if any is queued.
            self.arbiter.as_mut()?.select(&heads)? as usize
        } else {
            0
        };
        let bytes = self.head_chunk_bytes(queue);
        let message = self.queues[queue].front_mut()?;
        message.left_bytes -= bytes as u64;
        let grant = Grant { tag: message.tag, lane: message.lane, bytes, last: message.left_bytes == 0 };
        if grant.last {
            self.queues[queue].pop_front();
        }
        Some(grant)
    }
}

/// `lane` as an index into per-lane arrays, or an error naming it.
fn lane_index(lane: Lane) -> Result<usize> {
    if (lane as usize) < MAX_LANES {
        Ok(lane as usize)
    } else {
        Err(CoreError::invalid("lane", format!("expected a lane in 0..{MAX_LANES}, got {lane}")))
    }
}

/// The first nanosecond at or after `now_ns` at which `bucket` (refilling: rate > 0) holds more than 0
/// tokens (`now_ns` must not be before the bucket's last update), `u64::MAX` if none is.
fn first_ns_with_tokens(bucket: &Bucket, now_ns: u64) -> u64 {
    let tokens = bucket.tokens_at(now_ns);
    if tokens > 0.0 {
        return now_ns;
    }
    // A float estimate (`as` saturates), then settle on the exact nanosecond of the same function
    // `grant` evaluates, which is monotone in time: the estimate may be a nanosecond off either way.
    let wait_ns = (-tokens / bucket.rate_bytes_per_s * NS_PER_S).floor();
    let mut t = now_ns.saturating_add(wait_ns as u64);
    while t < u64::MAX && bucket.tokens_at(t) <= 0.0 {
        t += 1;
    }
    while t > now_ns && bucket.tokens_at(t - 1) > 0.0 {
        t -= 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use proptest::prelude::*;

    const CHUNK: u32 = 65536;
    /// Enough chunks for any test in one call.
    const ALL: usize = usize::MAX;

    /// A port that never limits, so only the order of the chunks is under test.
    fn unpaced(arbitration: Option<&VlArbitration>, chunk_bytes: u32) -> PacketPort {
        PacketPort::new(1e9, Some(f64::INFINITY), arbitration, chunk_bytes).unwrap()
    }

    fn lanes(grants: &[Grant]) -> Vec<Lane> {
        grants.iter().map(|g| g.lane).collect()
    }

    /// Grant everything queued, each time at `next_grant_ns`, from `t_ns` on; returns `(time, grant)`.
    fn drain(port: &mut PacketPort, mut t_ns: u64) -> Vec<(u64, Grant)> {
        let mut out = Vec::new();
        while let Some(next) = port.next_grant_ns(t_ns).unwrap() {
            t_ns = next;
            let granted = port.grant(t_ns, ALL).unwrap();
            assert!(!granted.is_empty(), "nothing granted at next_grant_ns {t_ns}");
            out.extend(granted.into_iter().map(|g| (t_ns, g)));
        }
        out
    }

    #[test]
    fn bad_arguments_are_named() {
        let prefix = |r: Result<PacketPort>| r.unwrap_err().message.split(':').next().unwrap().to_owned();
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(prefix(PacketPort::new(rate, None, None, CHUNK)), "rate_bytes_per_s");
        }
        assert_eq!(prefix(PacketPort::new(1e6, None, None, 0)), "chunk_bytes");
        for burst in [CHUNK as f64 - 1.0, 0.0, -1.0, f64::NAN] {
            assert_eq!(prefix(PacketPort::new(1e6, Some(burst), None, CHUNK)), "burst_bytes");
        }
        let err = PacketPort::new(1e6, None, Some(&VlArbitration::fair(0)), CHUNK).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Config);

        let mut port = PacketPort::new(1e6, None, Some(&VlArbitration::paper()), CHUNK).unwrap();
        assert!(port.enqueue(4, 1, 0).unwrap_err().message.starts_with("lane: "));
        assert!(port.enqueue(16, 1, 0).unwrap_err().message.starts_with("lane: "));
        assert!(port.enqueue(0, 0, 0).unwrap_err().message.starts_with("size_bytes: "));
        port.enqueue(0, u64::MAX, 0).unwrap();
        assert!(port.enqueue(2, 1, 0).unwrap_err().message.starts_with("size_bytes: "));
        assert!(port.grant(5, 0).unwrap_err().message.starts_with("max_chunks: "));
        port.grant(5, 1).unwrap();
        let err = port.grant(4, 1).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.starts_with("now_ns: "), "{err}");
        assert!(port.next_grant_ns(4).unwrap_err().message.starts_with("now_ns: "));
        assert!(port.queued_bytes(Some(16)).unwrap_err().message.starts_with("lane: "));
        assert!(port.granted_bytes(Some(16)).unwrap_err().message.starts_with("lane: "));
        // Without an arbitration every lane is accepted.
        unpaced(None, CHUNK).enqueue(15, 1, 0).unwrap();
    }

    #[test]
    fn defaults_and_accessors() {
        let port = PacketPort::new(1e6, None, None, 1000).unwrap();
        assert_eq!((port.rate_bytes_per_s(), port.burst_bytes(), port.chunk_bytes()), (1e6, 1000.0, 1000));
        assert_eq!(port.next_grant_ns(0).unwrap(), None);
        assert_eq!((port.queued_bytes(None).unwrap(), port.queued_messages()), (0, 0));
    }

    #[test]
    fn messages_are_cut_into_chunks() {
        let mut port = unpaced(None, 4096);
        port.enqueue(3, 10_000, 7).unwrap();
        port.enqueue(3, 4096, 8).unwrap();
        assert_eq!((port.queued_bytes(Some(3)).unwrap(), port.queued_messages()), (14_096, 2));
        let sizes: Vec<(u64, u32, bool)> =
            port.grant(0, ALL).unwrap().iter().map(|g| (g.tag, g.bytes, g.last)).collect();
        assert_eq!(sizes, [(7, 4096, false), (7, 4096, false), (7, 1808, true), (8, 4096, true)]);
        assert_eq!((port.granted_bytes(Some(3)).unwrap(), port.granted_bytes(Some(2)).unwrap()), (14_096, 0));
        assert_eq!((port.queued_bytes(None).unwrap(), port.queued_messages()), (0, 0));
    }

    /// 10 MB at 1 MB/s with a one-chunk burst: chunk k may go once the bucket has refilled past
    /// `k * chunk - burst` bytes, i.e. at the first nanosecond after `(k * chunk - burst)` µs. The grants
    /// land on those nanoseconds to within one, however many came before (no drift), all by 10 s, and
    /// never above `burst + rate * t + chunk`.
    #[test]
    fn long_run_rate_is_exact() {
        let (rate, total) = (1e6, 10_000_000u64);
        let mut port = PacketPort::new(rate, None, None, CHUNK).unwrap();
        port.enqueue(0, total, 1).unwrap();
        let grants = drain(&mut port, 0);
        assert_eq!(grants.len(), total.div_ceil(CHUNK as u64) as usize);
        let mut granted = 0;
        for (k, (t_ns, g)) in grants.iter().enumerate() {
            // Integer µs per byte at 1 MB/s: the exact first nanosecond with tokens > 0.
            let owed = (k as i64 * CHUNK as i64 - CHUNK as i64) * 1000;
            let exact_ns = if owed < 0 { 0 } else { owed as u64 + 1 };
            assert!(t_ns.abs_diff(exact_ns) <= 1, "chunk {k} at {t_ns} ns, exact {exact_ns} ns");
            granted += g.bytes as u64;
            assert!(granted as f64 <= CHUNK as f64 + rate * *t_ns as f64 / NS_PER_S + CHUNK as f64);
        }
        assert_eq!(granted, total);
        let last_ns = grants.last().unwrap().0;
        assert!(last_ns <= 10 * NS_PER_S as u64, "{last_ns}");
        // ...and not earlier than the bucket allows: the bytes before the last chunk needed their time.
        let before_last = total - grants.last().unwrap().1.bytes as u64;
        assert!(last_ns as f64 >= (before_last - CHUNK as u64) as f64 / rate * NS_PER_S);
    }

    #[test]
    fn a_burst_is_granted_at_once_then_paced() {
        // 0.7 bytes per ns, a 4-chunk burst of 1000-byte chunks.
        let mut port = PacketPort::new(0.7e9, Some(4000.0), None, 1000).unwrap();
        port.enqueue(0, 10_000, 1).unwrap();
        assert_eq!(port.grant(0, ALL).unwrap().len(), 4);
        // The bucket is at 0 tokens: one nanosecond later it holds some and one more chunk may go...
        assert_eq!(port.next_grant_ns(0).unwrap(), Some(1));
        assert_eq!(port.grant(1, ALL).unwrap().len(), 1);
        // ...which leaves it 999.3 bytes in debt, repaid after 1427.6 ns: the next chunk goes at 1 + 1428.
        assert_eq!(port.next_grant_ns(1).unwrap(), Some(1429));
        assert!(port.grant(1428, ALL).unwrap().is_empty());
        assert_eq!(port.grant(1429, ALL).unwrap().len(), 1);
        // After idling the bucket holds at most the burst.
        assert_eq!(port.grant(1_000_000, ALL).unwrap().len(), 4);
        assert_eq!(port.queued_messages(), 0);
        // max_chunks caps a call; the rest is grantable at once.
        port.enqueue(0, 10_000, 2).unwrap();
        assert_eq!(port.grant(2_000_000, 2).unwrap().len(), 2);
        assert_eq!(port.next_grant_ns(2_000_000).unwrap(), Some(2_000_000));
    }

    #[test]
    fn next_grant_ns_is_the_first_nanosecond_that_grants() {
        // Rates whose nanoseconds are not whole: the rounding must be up, never early.
        for rate in [1e6, 3e6 + 1.0, 7.77e9, 123.456] {
            let mut port = PacketPort::new(rate, None, None, 1500).unwrap();
            port.enqueue(1, 1_000_000, 0).unwrap();
            let mut t = 0;
            for _ in 0..50 {
                let next = port.next_grant_ns(t).unwrap().unwrap();
                if next > t {
                    assert!(port.clone().grant(next - 1, ALL).unwrap().is_empty(), "rate {rate} at {next}");
                }
                assert!(!port.grant(next, ALL).unwrap().is_empty());
                t = next;
            }
        }
    }

    #[test]
    fn strict_priority_puts_the_high_lane_first() {
        // The paper's config: model traffic on VL0 (high table), KV cache on VL2 (low table only).
        let paper = VlArbitration::paper();
        let mut port = PacketPort::new(1e9, None, Some(&paper), CHUNK).unwrap();
        for tag in 0..100 {
            port.enqueue(2, CHUNK as u64, tag).unwrap();
        }
        port.enqueue(0, 3 * CHUNK as u64, 100).unwrap();
        let grants = drain(&mut port, 0);
        let order: Vec<Lane> = grants.iter().map(|(_, g)| g.lane).collect();
        assert_eq!(order, [vec![0; 3], vec![2; 100]].concat());
        assert_eq!(grants[2].1, Grant { tag: 100, lane: 0, bytes: CHUNK, last: true });

        // Without arbitration the same message waits behind the 100 low-lane chunks.
        let mut fifo = unpaced(None, CHUNK);
        for tag in 0..100 {
            fifo.enqueue(2, CHUNK as u64, tag).unwrap();
        }
        fifo.enqueue(0, 3 * CHUNK as u64, 100).unwrap();
        let order = lanes(&fifo.grant(0, ALL).unwrap());
        assert_eq!(order, [vec![2; 100], vec![0; 3]].concat());
    }

    /// The paper's high limit is 240 * 4 KiB of high-table bytes between low-table chunks: 15 chunks of
    /// 64 KiB. VL0 is in the low table too, so the low turns alternate between VL0 and VL2 (entries 0
    /// and 2; VL1 and VL3 are empty), and VL2 gets one chunk in 32: with 64 KiB chunks the KV lane holds
    /// more of a backlogged port than with 4 KiB packets (1 in 964), but it is not starved.
    #[test]
    fn the_paper_high_limit_lets_one_low_chunk_through_per_960_kib() {
        let mut port = unpaced(Some(&VlArbitration::paper()), CHUNK);
        port.enqueue(0, 128 * CHUNK as u64, 0).unwrap();
        port.enqueue(2, 4 * CHUNK as u64, 1).unwrap();
        let order = lanes(&port.grant(0, 96).unwrap());
        assert_eq!(order, [vec![0; 31], vec![2]].concat().repeat(3));
    }

    /// Two low lanes with weights 1 KiB and 3 KiB and 1000-byte chunks: each visit of a lane sends its
    /// weight in bytes, overshooting by less than one chunk (the IB quantum; the overshoot is lost).
    #[test]
    fn weighted_round_robin_follows_the_weights_within_a_chunk_per_round() {
        let cfg = VlArbitration::weighted_round_robin(&[(0, 16), (1, 48)]);
        let mut port = unpaced(Some(&cfg), 1000);
        port.enqueue(0, 1_000_000, 0).unwrap();
        port.enqueue(1, 1_000_000, 1).unwrap();
        let grants = port.grant(0, 600).unwrap();
        let mut visits: Vec<(Lane, u64)> = Vec::new();
        for g in &grants {
            match visits.last_mut() {
                Some((lane, bytes)) if *lane == g.lane => *bytes += g.bytes as u64,
                _ => visits.push((g.lane, g.bytes as u64)),
            }
        }
        assert!(visits.len() > 100);
        for &(lane, bytes) in &visits {
            let weight = if lane == 0 { 1024 } else { 3072 };
            assert!((weight..weight + 1000).contains(&bytes), "lane {lane} sent {bytes} in one visit");
        }
        let (l0, l1) = (port.granted_bytes(Some(0)).unwrap(), port.granted_bytes(Some(1)).unwrap());
        // 2 chunks against 4 a round: shares 1/3 and 2/3 of the chunks, exactly over whole rounds.
        assert_eq!((l0, l1), (200_000, 400_000));
    }

    #[test]
    fn cancel_drops_exactly_the_rest_of_a_message() {
        let mut port = PacketPort::new(1e6, None, Some(&VlArbitration::strict_priority(&[0], &[1])), 1000).unwrap();
        port.enqueue(1, 4500, 7).unwrap();
        port.enqueue(1, 2000, 8).unwrap();
        port.enqueue(0, 300, 7).unwrap();
        port.enqueue(0, 100, 9).unwrap();
        // Lane 0 first, then the first chunk of tag 7 on lane 1.
        let grants = port.grant(0, 3).unwrap();
        assert_eq!(grants.iter().map(|g| (g.tag, g.bytes)).collect::<Vec<_>>(), [(7, 300), (9, 100), (7, 1000)]);
        assert_eq!(port.cancel(7), 3500);
        assert_eq!(port.cancel(7), 0);
        assert_eq!(port.cancel(12345), 0);
        assert_eq!((port.queued_bytes(Some(1)).unwrap(), port.queued_bytes(Some(0)).unwrap()), (2000, 0));
        assert_eq!(port.queued_messages(), 1);
        assert_eq!(port.granted_bytes(None).unwrap(), 1400);
        let rest = drain(&mut port, 0);
        assert_eq!(
            rest.iter().map(|(_, g)| (g.tag, g.bytes, g.last)).collect::<Vec<_>>(),
            [(8, 1000, false), (8, 1000, true)]
        );
    }

    /// A rate change keeps the tokens earned at the old rate and repays a debt at the new one.
    #[test]
    fn set_rate_keeps_the_tokens_earned_before() {
        let mut port = PacketPort::new(1e6, None, None, 1000).unwrap();
        port.enqueue(0, 10_000, 1).unwrap();
        // The full bucket: 1000 tokens, now 0.
        assert_eq!(port.grant(0, ALL).unwrap().len(), 1);
        // 0.5 ms later the bucket holds 500 bytes, earned at 1 MB/s; they stay when the rate doubles...
        port.set_rate(500_000, 2e6, None).unwrap();
        assert_eq!(port.rate_bytes_per_s(), 2e6);
        // 500 - 1000: 500 in debt, repaid at 2 MB/s in 250 µs (at 1 MB/s it would have taken 500 µs).
        assert_eq!(port.grant(500_000, ALL).unwrap().len(), 1);
        let next = port.next_grant_ns(500_000).unwrap().unwrap();
        assert!(next.abs_diff(750_001) <= 1, "{next}");
        assert!(port.clone().grant(next - 1, ALL).unwrap().is_empty());
        // Setting the same rate again at the same instant changes nothing (no token counted twice).
        port.set_rate(500_000, 2e6, None).unwrap();
        assert_eq!(port.next_grant_ns(500_000).unwrap(), Some(next));
        // Slower from 600 µs on: the 300 bytes of debt left then are repaid at 0.5 MB/s, in 600 µs.
        let mut slower = port.clone();
        slower.set_rate(600_000, 5e5, None).unwrap();
        let at = slower.next_grant_ns(600_000).unwrap().unwrap();
        assert!(at.abs_diff(1_200_001) <= 1, "{at}");
    }

    /// Rate 0 pauses the port: nothing is granted, no token is earned, what is queued waits; a rate
    /// above 0 resumes it with the tokens it had when paused (not a bucket refilled over the pause).
    #[test]
    fn rate_0_pauses_and_keeps_the_tokens() {
        let mut port = PacketPort::new(1e6, Some(4000.0), None, 1000).unwrap();
        port.enqueue(0, 10_000, 1).unwrap();
        assert_eq!(port.grant(0, ALL).unwrap().len(), 4); // the burst: 0 tokens left
        port.set_rate(1_000_000, 0.0, None).unwrap(); // 1000 tokens earned by then
        assert!(port.paused());
        assert!(port.grant(5_000_000, ALL).unwrap().is_empty());
        assert_eq!(port.next_grant_ns(5_000_000).unwrap(), None);
        port.enqueue(0, 500, 2).unwrap(); // queued while paused: it waits too
        assert_eq!((port.queued_bytes(None).unwrap(), port.granted_bytes(None).unwrap()), (6_500, 4_000));
        port.set_rate(10_000_000, 1e6, None).unwrap();
        assert!(!port.paused());
        // The 1000 tokens of before the pause, not the 4000 a 9 ms idle bucket would hold: one chunk now.
        assert_eq!(port.next_grant_ns(10_000_000).unwrap(), Some(10_000_000));
        assert_eq!(port.grant(10_000_000, ALL).unwrap().len(), 1);
        let rest = drain(&mut port, 10_000_000);
        assert_eq!(rest.iter().map(|(_, g)| g.bytes as u64).sum::<u64>(), 5_500);
        assert_eq!(rest.last().unwrap().1, Grant { tag: 2, lane: 0, bytes: 500, last: true });
        // Six chunks at 1 MB/s after the first: the last goes 5 ms after the resume (to within a ns).
        assert!(rest.last().unwrap().0.abs_diff(15_000_001) <= 1, "{:?}", rest.last());
    }

    /// A new capacity: a smaller one drops the tokens it cannot hold, a larger one fills at the rate.
    #[test]
    fn set_rate_may_change_the_capacity() {
        let mut port = PacketPort::new(1e6, Some(8000.0), None, 1000).unwrap();
        port.enqueue(0, 100_000, 1).unwrap();
        port.set_rate(1_000_000, 1e5, Some(2000.0)).unwrap(); // a full bucket of 8000: 2000 left
        assert_eq!(port.burst_bytes(), 2000.0);
        assert_eq!(port.grant(1_000_000, ALL).unwrap().len(), 2);
        // Back to 1 MB/s and 8000 bytes: the bucket holds nothing (0 tokens), and fills at the rate.
        port.set_rate(1_000_000, 1e6, Some(8000.0)).unwrap();
        assert_eq!(port.next_grant_ns(1_000_000).unwrap(), Some(1_000_001));
        assert_eq!(port.grant(9_000_000, ALL).unwrap().len(), 8); // 8 ms later: a full bucket again
        assert!(port.set_rate(9_000_000, 1e6, Some(999.0)).unwrap_err().message.starts_with("burst_bytes: "));
        assert!(port.set_rate(9_000_000, 1e6, Some(f64::NAN)).unwrap_err().message.starts_with("burst_bytes: "));
    }

    #[test]
    fn set_rate_checks_its_arguments() {
        let mut port = PacketPort::new(1e6, None, None, 1000).unwrap();
        port.grant(10, 1).unwrap();
        for rate in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(port.set_rate(10, rate, None).unwrap_err().message.starts_with("rate_bytes_per_s: "));
        }
        assert!(port.set_rate(9, 1e6, None).unwrap_err().message.starts_with("now_ns: "));
        port.set_rate(20, 1e6, None).unwrap();
        // Time moved on with the change.
        assert!(port.grant(19, 1).unwrap_err().message.starts_with("now_ns: "));
    }

    /// `default_cases` cases, or `PROPTEST_CASES` when set (a longer soak than the default suite).
    fn depth(default_cases: u32) -> ProptestConfig {
        let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok());
        ProptestConfig::with_cases(cases.unwrap_or(default_cases))
    }

    fn arb_arbitration() -> impl Strategy<Value = Option<VlArbitration>> {
        prop::sample::select(vec![
            None,
            Some(VlArbitration::paper()),
            Some(VlArbitration::strict_priority(&[0], &[1, 2])),
            Some(VlArbitration::parse(3, 0, "0:64,1:16", "2:64,0:8").unwrap()),
            Some(VlArbitration::weighted_round_robin(&[(0, 1), (1, 3), (2, 200)])),
        ])
    }

    proptest! {
        #![proptest_config(depth(128))]

        /// Driven at its `next_grant_ns` times with messages arriving in between: never more than
        /// `burst + rate * t + chunk` bytes by any grant time, nothing granted a nanosecond before a
        /// `next_grant_ns`, every byte granted exactly once in per-lane FIFO order (whole FIFO order
        /// without an arbitration), and the counters agree.
        #[test]
        fn port_is_paced_and_exact(
            cfg in arb_arbitration(),
            rate in 1e3..1e10f64,
            chunk in prop::sample::select(vec![13u32, 1500, 65536]),
            burst_chunks in prop_oneof![Just(None), (1.0..8.0f64).prop_map(Some)],
            events in prop::collection::vec((0u64..5_000_000, 0u8..3, 1u64..30_000), 1..25),
        ) {
            let burst = burst_chunks.map(|b| b * chunk as f64);
            let mut port = PacketPort::new(rate, burst, cfg.as_ref(), chunk).unwrap();
            let burst = port.burst_bytes();
            let served: Vec<Lane> = (0..3).filter(|&l| cfg.as_ref().map_or(true, |c| c.serves(l))).collect();
            let mut expected: Vec<(u64, Lane, u32, bool)> = Vec::new();
            let mut grants: Vec<(u64, Grant)> = Vec::new();
            let mut t = 0;
            for (tag, &(gap_ns, lane_index, size)) in events.iter().enumerate() {
                let arrive_ns = t + gap_ns;
                // Grant what is due before the arrival, as a backend sleeping until next_grant_ns would.
                while let Some(next) = port.next_grant_ns(t).unwrap().filter(|&n| n < arrive_ns) {
                    if next > t {
                        prop_assert!(port.clone().grant(next - 1, 1).unwrap().is_empty());
                    }
                    let granted = port.grant(next, 7).unwrap();
                    prop_assert!(!granted.is_empty());
                    grants.extend(granted.into_iter().map(|g| (next, g)));
                    t = next;
                }
                t = arrive_ns;
                let lane = served[lane_index as usize % served.len()];
                port.enqueue(lane, size, tag as u64).unwrap();
                let chunks = size.div_ceil(chunk as u64);
                for k in 0..chunks {
                    let bytes = (size - k * chunk as u64).min(chunk as u64) as u32;
                    expected.push((tag as u64, lane, bytes, k + 1 == chunks));
                }
            }
            grants.extend(drain(&mut port, t));

            let mut granted = 0u64;
            for (t_ns, g) in &grants {
                granted += g.bytes as u64;
                let bound = burst + rate * *t_ns as f64 / NS_PER_S + chunk as f64;
                prop_assert!(granted as f64 <= bound * (1.0 + 1e-12), "{} > {} at {}", granted, bound, t_ns);
            }
            let got: Vec<(u64, Lane, u32, bool)> = grants.iter().map(|(_, g)| (g.tag, g.lane, g.bytes, g.last)).collect();
            if cfg.is_none() {
                prop_assert_eq!(&got, &expected);
            }
            for lane in 0..MAX_LANES as Lane {
                let of_lane = |v: &[(u64, Lane, u32, bool)]| v.iter().filter(|c| c.1 == lane).cloned().collect::<Vec<_>>();
                let lane_got = of_lane(&got);
                prop_assert_eq!(&lane_got, &of_lane(&expected));
                let bytes: u64 = lane_got.iter().map(|c| c.2 as u64).sum();
                prop_assert_eq!(port.granted_bytes(Some(lane)).unwrap(), bytes);
            }
            prop_assert_eq!((port.queued_bytes(None).unwrap(), port.queued_messages()), (0, 0));
        }

        /// A backlog granted at `next_grant_ns` through rate changes (0 included): the bytes granted by
        /// any grant never exceed `burst + ∫ rate + chunk` (nothing is counted twice), each segment at a
        /// rate above 0 grants all it earned but for at most a chunk's debt (nothing earned is lost), and
        /// a paused one grants nothing.
        #[test]
        fn rate_changes_lose_and_double_count_nothing(
            chunk in prop::sample::select(vec![100u32, 1500, 65536]),
            segments in prop::collection::vec((1u64..20_000_000, prop_oneof![Just(0.0), 1e5..1e9f64]), 1..12),
        ) {
            let burst = 2.0 * chunk as f64;
            let mut port = PacketPort::new(1e8, Some(burst), None, chunk).unwrap();
            port.enqueue(1, u64::MAX / 2, 0).unwrap();
            let (mut start, mut earned, mut granted) = (0u64, 0.0f64, 0u64);
            for &(length, rate) in &segments {
                port.set_rate(start, rate, None).unwrap();
                let (end, before) = (start + length, granted);
                let mut t = start;
                while let Some(next) = port.next_grant_ns(t).unwrap().filter(|&n| n < end) {
                    granted += port.grant(next, usize::MAX).unwrap().iter().map(|g| g.bytes as u64).sum::<u64>();
                    let bound = burst + earned + rate * (next - start) as f64 / NS_PER_S + chunk as f64;
                    prop_assert!(granted as f64 <= bound * (1.0 + 1e-9), "{} > {}", granted, bound);
                    t = next;
                }
                let due = rate * length as f64 / NS_PER_S;
                earned += due;
                if rate == 0.0 {
                    prop_assert_eq!(granted, before);
                } else {
                    let got = (granted - before) as f64;
                    prop_assert!(got + chunk as f64 + 1.0 >= due * (1.0 - 1e-9), "{} granted of {} due", got, due);
                }
                start = end;
            }
            prop_assert_eq!(port.granted_bytes(None).unwrap(), granted);
        }
    }
}
