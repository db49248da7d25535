//! The data plane through the public `Core` API: a small random topology (ports with token buckets and
//! any arbitration, a storage cluster) and a random sequence of operations, checked against a model
//! kept outside the core (as the FoundationDB-style checkers in STYLE.md):
//!
//! - every call the model deems invalid returns `Err` and changes nothing; every valid one is `Ok`;
//! - completions come out in time order, each accepted transfer, I/O and timer exactly once, with its
//!   kind, size, lane and start, and never sooner than its bytes at the slowest peak rate on its path;
//! - no port carries more than its capacity; every flow has a saturated port on its path (max-min)
//!   unless the rate iteration reported that it stopped short; lane rates add up to the port's load;
//! - per port and lane, `completed_bytes` is exactly the sizes of finished work that crossed it, and the
//!   fluid integral (and the utilisation samples) agree with it once idle;
//! - storage queues (`read_q`) are what was submitted and not finished, with `min(depth, outstanding)`
//!   in flight; `pending()` is everything not finished; after `run_until_idle` nothing is pending and
//!   the clock stands at the last completion (an idle core has nothing that should move time on).
//!
//! Bounds keep one input to a few milliseconds and the clock far from `u64::MAX`: rates within
//! 1 KB/s..10 TB/s (peaks up to 100x that), transfers up to 2^36 bytes, 64 operations. Invalid rates
//! (0, negative, NaN, infinite, outside the core's range, peak below rate) are generated too, and must be rejected.

#![no_main]

use std::collections::BTreeMap;

use arbitrary::Unstructured;
use dualpath_emu_core::*;
use dualpath_emu_fuzz::{arbitration, flag, int, log_uniform, pick, pick_or};
use libfuzzer_sys::fuzz_target;

const MAX_PORTS: usize = 6;
const MAX_NODES: usize = 3;
const MAX_OPS: usize = 64;

/// How far an input may stretch the clock.
struct Scale {
    min_rate: f64,
    /// Largest transfer or I/O.
    max_size: u64,
    /// Longest timer, advance or storage latency.
    max_delay_ns: u64,
}

/// Without sampling: 2^36 bytes at 1 KB/s is 2.2 years, so 64 of them in a row (and 64 delays of
/// 11.6 days) stay far below u64::MAX ns.
const WIDE: Scale = Scale { min_rate: 1e3, max_size: 1 << 36, max_delay_ns: 1_000_000_000_000_000 };
/// With utilisation sampling every second, a run must stay within hours, or the sample vectors alone
/// exhaust memory: 1 GB at 1 MB/s is 1000 s.
const SAMPLED: Scale = Scale { min_rate: 1e6, max_size: 1_000_000_000, max_delay_ns: 100_000_000_000 };
/// Relative slack on capacity and saturation checks (the proptests in core/tests use the same).
const TOL: f64 = 1e-7;

/// Something accepted that must complete exactly once.
#[derive(Debug, Clone)]
struct Expect {
    kind: CompletionKind,
    start_ns: u64,
    size: u64,
    lane: Lane,
    /// Ports whose counters it adds to.
    path: Vec<PortId>,
    /// Earliest possible end: exact for timers and empty transfers, a lower bound otherwise.
    min_end_ns: u64,
    exact_end: bool,
    node: Option<NodeId>,
}

struct Node {
    name: String,
    read_path: Vec<PortId>,
    write_path: Vec<PortId>,
    depth: u32,
    read_bytes: u64,
    read_requests: u64,
    write_bytes: u64,
    write_requests: u64,
}

struct Model {
    specs: Vec<PortSpec>,
    storage: Option<StorageSpec>,
    nodes: Vec<Node>,
    expect: BTreeMap<u64, Expect>,
    completed: Vec<[u64; MAX_LANES]>,
    crossings: Vec<u64>,
    last_end: u64,
    next_tag: u64,
    /// Utilisation sampling interval (0 = off).
    sample_ns: u64,
}

impl Model {
    fn path_ok(&self, path: &[PortId], lane: Lane) -> bool {
        !path.is_empty()
            && (lane as usize) < MAX_LANES
            && path.iter().enumerate().all(|(i, &p)| {
                (p as usize) < self.specs.len()
                    && !path[..i].contains(&p)
                    && self.specs[p as usize].arbitration.serves(lane)
            })
    }

    fn io_path(&self, node: NodeId, kind: IoKind) -> Option<Vec<PortId>> {
        let s = self.storage.as_ref()?;
        let n = self.nodes.get(node as usize)?;
        Some(match kind {
            IoKind::Read => std::iter::once(s.read_port).chain(n.read_path.iter().copied()).collect(),
            IoKind::Write => n.write_path.iter().copied().chain(std::iter::once(s.write_port)).collect(),
        })
    }

    /// The time `size` bytes take at the slowest peak rate along `path` (whole ns), less rounding slack.
    fn min_transfer_ns(&self, path: &[PortId], size: u64) -> u64 {
        if size == 0 {
            return 0;
        }
        let peak = path.iter().map(|&p| self.specs[p as usize].peak_bytes_per_s).fold(f64::INFINITY, f64::min);
        // A flow ends within a nanosecond's worth of service of its size (network::on_group_event).
        (size as f64 / peak * 1e9 * (1.0 - TOL) - 2.0).max(0.0) as u64
    }

    fn pending(&self) -> u64 {
        self.expect.len() as u64
    }
}

fn rate(u: &mut Unstructured, scale: &Scale) -> f64 {
    match int(u, 0u8, 15) {
        // Invalid: not a rate, or outside [MIN_RATE_BYTES_PER_S, MAX_RATE_BYTES_PER_S] (1e308 once made
        // lane shares inf).
        0 => pick(u, &[0.0, -0.0, -1e9, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.5, 1e19, 1e308]),
        1..=7 => pick(u, &[1e3f64, 1e6, 1e9, 1e10, 5e10, 1e11, 4.096e9]).max(scale.min_rate),
        _ => log_uniform(u, scale.min_rate, 1e13),
    }
}

fn port_spec(u: &mut Unstructured, i: usize, names: &[String], scale: &Scale) -> (PortSpec, bool) {
    let name = match int(u, 0u8, 31) {
        0 => String::new(),
        1 if !names.is_empty() => names[0].clone(),
        _ => format!("p{i}"),
    };
    let rate = rate(u, scale);
    let (peak, burst) = match int(u, 0u8, 7) {
        0..=3 => (rate, 0.0),
        4 | 5 => {
            let factor = pick_or(u, &[1.5, 2.0, 4.0, 100.0, 1.0 + 1e-6], |u| 1.0 + log_uniform(u, 1e-6, 99.0));
            let burst = match int(u, 0u8, 7) {
                0 => pick(u, &[0.0, 1.0, 4096.0, 1e6, 1e8, 1e10]),
                _ => log_uniform(u, 1.0, 1e12),
            };
            (rate * factor, burst)
        }
        6 => (rate, log_uniform(u, 1.0, 1e9)), // a bucket with no headroom: a plain port
        _ => {
            // Invalid on purpose (unless the draw happens to be fine; validity is computed below).
            let peak = pick(u, &[rate * 0.5, f64::NAN, f64::INFINITY, rate, rate * 2.0]);
            let burst = pick(u, &[-1.0, f64::NAN, f64::INFINITY, 1e6, 1e300]);
            (peak, burst)
        }
    };
    let mtu = match int(u, 0u8, 15) {
        0 => int(u, 0u32, 70_000),
        1 => int(u, 1u32, 64),
        _ => pick(u, &[4096u32, 4096, 1024, 2048, 256]),
    };
    let arb = arbitration(u);
    let arb_ok = arb.as_ref().is_ok_and(|a| a.validate().is_ok());
    let arbitration = arb.unwrap_or_else(|_| VlArbitration::fair(0));
    let ok_rate = |x: f64| (MIN_RATE_BYTES_PER_S..=MAX_RATE_BYTES_PER_S).contains(&x);
    let valid = !name.is_empty()
        && !names.contains(&name)
        && ok_rate(rate)
        && ok_rate(peak)
        && peak >= rate
        && (0.0..=MAX_BURST_BYTES).contains(&burst)
        && mtu > 0
        && arb_ok;
    let spec = PortSpec {
        name,
        rate_bytes_per_s: rate,
        peak_bytes_per_s: peak,
        burst_bytes: burst,
        mtu_bytes: mtu,
        arbitration,
    };
    (spec, valid)
}

/// A path: usually distinct existing ports in any order, sometimes anything (repeats, unknown ids).
fn port_list(u: &mut Unstructured, n_ports: usize, max_len: usize) -> Vec<PortId> {
    if int(u, 0u8, 15) == 0 {
        let len = int(u, 0usize, max_len);
        return (0..len).map(|_| int(u, 0u32, n_ports as u32 + 2)).collect();
    }
    let mut left: Vec<PortId> = (0..n_ports as PortId).collect();
    let len = int(u, 1usize, max_len.min(n_ports));
    (0..len).map(|_| left.remove(int(u, 0usize, left.len() - 1))).collect()
}

fn size(u: &mut Unstructured, scale: &Scale) -> u64 {
    match int(u, 0u8, 15) {
        0 => 0,
        1 => int(u, 1u64, 100),
        2 => scale.max_size,
        3..=9 => pick(u, &[4096u64, 1 << 20, 1_000_000, 100_000_000, 1_000_000_000]),
        _ => int(u, 1u64, scale.max_size),
    }
}

fn delay(u: &mut Unstructured, scale: &Scale) -> u64 {
    match int(u, 0u8, 7) {
        0 => 0,
        1 => int(u, 1u64, 1000),
        2..=5 => pick(u, &[1_000u64, 1_000_000, 10_000_000, 1_000_000_000]),
        _ => int(u, 0u64, scale.max_delay_ns),
    }
}

fn op_lane(u: &mut Unstructured) -> Lane {
    match int(u, 0u8, 31) {
        0 => int(u, 4, 255),
        _ => int(u, 0, 3),
    }
}

/// With `FUZZ_TRACE=1` in the environment, print the calls an input makes, as Rust, to stderr: run
/// one artifact (`cargo fuzz run core_ops <artifact>`) to turn it into a test case.
fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FUZZ_TRACE").is_some_and(|v| !v.is_empty() && v != "0"))
}

macro_rules! trace {
    ($($arg:tt)*) => {
        if tracing() {
            eprintln!($($arg)*);
        }
    };
}

fuzz_target!(|data: &[u8]| run(data));

fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let sample_ns = if int(&mut u, 0u8, 3) == 0 { pick(&mut u, &[1_000_000_000u64, 10_000_000_000]) } else { 0 };
    let scale = if sample_ns > 0 { &SAMPLED } else { &WIDE };
    let mut c = Core::new(CoreConfig { sample_interval_ns: sample_ns, ..CoreConfig::default() }).unwrap();
    trace!(
        "let mut c = Core::new(CoreConfig {{ sample_interval_ns: {sample_ns}, ..CoreConfig::default() }}).unwrap();"
    );
    let mut m = Model {
        specs: Vec::new(),
        storage: None,
        nodes: Vec::new(),
        expect: BTreeMap::new(),
        completed: Vec::new(),
        crossings: Vec::new(),
        last_end: 0,
        next_tag: 0,
        sample_ns,
    };

    // Topology.
    let mut names = Vec::new();
    for i in 0..int(&mut u, 1usize, MAX_PORTS + 1) {
        let (spec, valid) = port_spec(&mut u, i, &names, scale);
        let got = c.add_port(spec.clone());
        trace!("c.add_port({spec:?}); // {got:?}");
        assert_eq!(got.is_ok(), valid, "add_port({spec:?}) = {got:?}");
        if let Ok(id) = got {
            assert_eq!(id as usize, m.specs.len(), "port ids are dense");
            names.push(spec.name.clone());
            m.specs.push(spec);
            m.completed.push([0; MAX_LANES]);
            m.crossings.push(0);
        }
    }
    assert_eq!(c.port_count(), m.specs.len());
    let n_ports = m.specs.len();
    if n_ports == 0 {
        return;
    }
    if flag(&mut u) {
        let read_port = if int(&mut u, 0u8, 15) == 0 { 99 } else { int(&mut u, 0u32, n_ports as u32 - 1) };
        let write_port = if flag(&mut u) { read_port } else { int(&mut u, 0u32, n_ports as u32 - 1) };
        let spec = StorageSpec {
            read_port,
            write_port,
            read_latency_ns: pick_or(&mut u, &[0u64, 1, 100_000, 1_000_000], |u| int(u, 0, scale.max_delay_ns / 1000)),
            write_latency_ns: pick_or(&mut u, &[0u64, 1, 100_000, 2_000_000], |u| int(u, 0, scale.max_delay_ns / 1000)),
        };
        let valid = (read_port as usize) < n_ports;
        let got = c.configure_storage(spec.clone());
        trace!("c.configure_storage({spec:?}); // {got:?}");
        assert_eq!(got.is_ok(), valid, "configure_storage({spec:?}) = {got:?}");
        if valid {
            m.storage = Some(spec.clone());
            assert_eq!(c.configure_storage(spec).unwrap_err().kind, ErrorKind::State, "configured twice");
        }
        for i in 0..int(&mut u, 0usize, MAX_NODES) {
            let name = if int(&mut u, 0u8, 15) == 0 { "n0".to_string() } else { format!("n{i}") };
            let mut read_path = port_list(&mut u, n_ports, 3);
            let mut write_path = port_list(&mut u, n_ports, 3);
            if int(&mut u, 0u8, 7) != 0 {
                // Mostly a usable node: its own ports do not repeat the cluster's.
                read_path.retain(|&p| p != read_port);
                write_path.retain(|&p| p != write_port);
            }
            let spec = StorageNodeSpec {
                name: name.clone(),
                read_path,
                write_path,
                queue_depth: pick(&mut u, &[1u32, 2, 4, 0, 64]),
            };
            let valid = m.storage.is_some()
                && spec.queue_depth > 0
                && !m.nodes.iter().any(|n| n.name == name)
                && spec.read_path.iter().chain(&spec.write_path).all(|&p| (p as usize) < n_ports);
            let got = c.add_storage_node(spec.clone());
            trace!("c.add_storage_node({spec:?}); // {got:?}");
            assert_eq!(got.is_ok(), valid, "add_storage_node({spec:?}) = {got:?}");
            if let Ok(id) = got {
                assert_eq!(id as usize, m.nodes.len());
                assert_eq!(c.storage_node_id(&name).unwrap(), id);
                m.nodes.push(Node {
                    name,
                    read_path: spec.read_path,
                    write_path: spec.write_path,
                    depth: spec.queue_depth,
                    read_bytes: 0,
                    read_requests: 0,
                    write_bytes: 0,
                    write_requests: 0,
                });
            }
        }
    }

    // Operations.
    for _ in 0..MAX_OPS {
        if u.is_empty() {
            break;
        }
        match int(&mut u, 0u8, 15) {
            0..=5 => {
                let path = if int(&mut u, 0u8, 15) == 0 {
                    port_list(&mut u, n_ports, 7)
                } else {
                    port_list(&mut u, n_ports, 3)
                };
                let lane = op_lane(&mut u);
                let size = size(&mut u, scale);
                let valid = m.path_ok(&path, lane);
                assert_eq!(c.check_transfer(&path, lane).is_ok(), valid, "check_transfer({path:?}, {lane})");
                let tag = m.next_tag;
                let got = c.submit_transfer(&path, lane, size, tag);
                trace!("c.submit_transfer(&{path:?}, {lane}, {size}, {tag}); // {got:?}");
                assert_eq!(got.is_ok(), valid, "submit_transfer({path:?}, {lane}, {size}) = {got:?}");
                if valid {
                    let now = c.now_ns();
                    let min_end = now + m.min_transfer_ns(&path, size);
                    let path = if size == 0 { Vec::new() } else { path };
                    m.expect.insert(
                        tag,
                        Expect {
                            kind: CompletionKind::Transfer,
                            start_ns: now,
                            size,
                            lane,
                            path,
                            min_end_ns: min_end,
                            exact_end: size == 0,
                            node: None,
                        },
                    );
                    m.next_tag += 1;
                }
            }
            6..=8 => {
                let node = if int(&mut u, 0u8, 15) == 0 { int(&mut u, 0u32, 5) } else { int(&mut u, 0u32, 2) };
                let kind = if flag(&mut u) { IoKind::Read } else { IoKind::Write };
                let lane = op_lane(&mut u);
                let size = size(&mut u, scale);
                let path = m.io_path(node, kind);
                let valid = path.as_ref().is_some_and(|p| m.path_ok(p, lane));
                assert_eq!(c.check_io(node, kind, lane).is_ok(), valid, "check_io({node}, {kind:?}, {lane})");
                let tag = m.next_tag;
                let got = c.submit_io(node, kind, lane, size, tag);
                trace!("c.submit_io({node}, IoKind::{kind:?}, {lane}, {size}, {tag}); // {got:?}");
                assert_eq!(got.is_ok(), valid, "submit_io({node}, {kind:?}, {lane}, {size}) = {got:?}");
                if valid {
                    let path = path.unwrap();
                    let now = c.now_ns();
                    let s = m.storage.as_ref().unwrap();
                    let latency = match kind {
                        IoKind::Read => s.read_latency_ns,
                        IoKind::Write => s.write_latency_ns,
                    };
                    let min_end = now + latency + m.min_transfer_ns(&path, size);
                    let n = &mut m.nodes[node as usize];
                    match kind {
                        IoKind::Read => {
                            n.read_bytes += size;
                            n.read_requests += 1;
                        }
                        IoKind::Write => {
                            n.write_bytes += size;
                            n.write_requests += 1;
                        }
                    }
                    let ck = match kind {
                        IoKind::Read => CompletionKind::Read,
                        IoKind::Write => CompletionKind::Write,
                    };
                    m.expect.insert(
                        tag,
                        Expect {
                            kind: ck,
                            start_ns: now,
                            size,
                            lane,
                            path,
                            min_end_ns: min_end,
                            exact_end: false,
                            node: Some(node),
                        },
                    );
                    m.next_tag += 1;
                }
            }
            9 | 10 => {
                let now = c.now_ns();
                let backwards = int(&mut u, 0u8, 15) == 0 && now > 0;
                let at = if backwards { now - int(&mut u, 1u64, now) } else { now + delay(&mut u, scale) };
                let tag = m.next_tag;
                let got = c.add_timer(at, tag);
                trace!("c.add_timer({at}, {tag}); // {got:?}");
                assert_eq!(got.is_ok(), at >= now, "add_timer({at}) at {now} = {got:?}");
                if got.is_ok() {
                    m.expect.insert(
                        tag,
                        Expect {
                            kind: CompletionKind::Timer,
                            start_ns: at,
                            size: 0,
                            lane: 0,
                            path: Vec::new(),
                            min_end_ns: at,
                            exact_end: true,
                            node: None,
                        },
                    );
                    m.next_tag += 1;
                }
            }
            11 | 12 => {
                let now = c.now_ns();
                let backwards = int(&mut u, 0u8, 15) == 0 && now > 0;
                let t = if backwards { now - int(&mut u, 1u64, now) } else { now + delay(&mut u, scale) };
                let got = c.advance_to(t);
                trace!("c.advance_to({t}); // {got:?}");
                assert_eq!(got.is_ok(), !backwards, "advance_to({t}) at {now} = {got:?}");
                if !backwards {
                    assert_eq!(c.now_ns(), t);
                    assert!(c.next_event_ns().is_none_or(|next| next > t), "an event due by {t} was left");
                } else {
                    assert_eq!(c.now_ns(), now, "a rejected advance moved the clock");
                }
            }
            13 | 14 => {
                let now = c.now_ns();
                let next = c.next_event_ns();
                let got = c.step().unwrap();
                trace!("c.step(); // {got:?}");
                assert_eq!(got, next, "step() handles the next event");
                if let Some(t) = got {
                    assert!(t >= now && c.now_ns() == t, "step to {t} from {now}, now {}", c.now_ns());
                }
            }
            _ => run_until_idle(&mut c, &mut m),
        }
        collect(&mut c, &mut m);
        assert_eq!(c.pending(), m.pending(), "pending() disagrees with the model: {:?}", m.expect);
        check_rates(&mut c, &m);
        check_queues(&c, &m);
    }

    run_until_idle(&mut c, &mut m);
    assert!(c.in_flight().is_empty(), "flows left: {:?}", c.in_flight());
    assert_eq!(c.step().unwrap(), None);
    check_queues(&c, &m);
    check_counters(&mut c, &m);
}

/// Run until idle: everything accepted has completed, and the clock stopped at the last completion
/// (an idle core has no reason to move time on: the last event that does anything finishes something).
fn run_until_idle(c: &mut Core, m: &mut Model) {
    let before = c.now_ns();
    let end = c.run_until_idle().unwrap();
    trace!("c.run_until_idle(); // {end}");
    assert_eq!(end, c.now_ns());
    collect(c, m);
    assert!(m.expect.is_empty(), "never completed: {:?}", m.expect);
    assert_eq!(c.pending(), 0);
    assert_eq!(end, before.max(m.last_end), "run_until_idle moved the clock past the last completion");
}

/// Take completions and check each against what was accepted.
fn collect(c: &mut Core, m: &mut Model) {
    let now = c.now_ns();
    for done in c.take_completions() {
        trace!("    // done: {done:?}");
        assert!(done.end_ns >= m.last_end, "completion times went backwards: {done:?} after {}", m.last_end);
        assert!(done.end_ns <= now, "completion {done:?} in the future of {now}");
        m.last_end = done.end_ns;
        let Some(e) = m.expect.remove(&done.tag) else {
            panic!("completion {done:?} was never submitted, or completed twice");
        };
        assert_eq!((done.kind, done.start_ns, done.size_bytes), (e.kind, e.start_ns, e.size), "{done:?} vs {e:?}");
        if e.kind != CompletionKind::Timer {
            assert_eq!(done.lane, e.lane, "{done:?}");
        }
        if e.exact_end {
            assert_eq!(done.end_ns, e.min_end_ns, "{done:?} vs {e:?}");
        } else {
            assert!(done.end_ns >= e.min_end_ns, "{done:?} finished faster than its path allows ({e:?})");
        }
        for &p in &e.path {
            m.completed[p as usize][e.lane as usize] += e.size;
            m.crossings[p as usize] += 1;
        }
        if let Some(node) = e.node {
            let n = &mut m.nodes[node as usize];
            if e.kind == CompletionKind::Read {
                n.read_bytes -= e.size;
                n.read_requests -= 1;
            } else {
                n.write_bytes -= e.size;
                n.write_requests -= 1;
            }
        }
    }
}

/// Capacity, lane bookkeeping and max-min saturation of the current rates.
fn check_rates(c: &mut Core, m: &Model) {
    let flights = c.in_flight();
    let converged = c.stats().net.non_converged == 0;
    let mut load = vec![0.0; m.specs.len()];
    for (path, lane, n, rate) in &flights {
        assert!(rate.is_finite() && *rate >= 0.0, "rate {rate} on lane {lane} along {path:?}");
        assert!(*n > 0);
        for &p in path {
            load[p as usize] += *n as f64 * rate;
        }
    }
    let mut cap = Vec::with_capacity(m.specs.len());
    for (p, spec) in m.specs.iter().enumerate() {
        let k = c.capacity(p as PortId).unwrap();
        assert!(k == spec.rate_bytes_per_s || k == spec.peak_bytes_per_s, "port {p} capacity {k} ({spec:?})");
        assert!(load[p] <= k * (1.0 + TOL), "port {p} load {} > capacity {k}: {flights:?}", load[p]);
        let lanes: f64 = c.lane_rates(p as PortId).unwrap().iter().sum();
        assert!((lanes - load[p]).abs() <= 1e-6 * k, "port {p}: lane rates {lanes} vs load {}", load[p]);
        cap.push(k);
    }
    if converged {
        for (path, lane, _, rate) in &flights {
            let saturated = path.iter().any(|&p| load[p as usize] >= cap[p as usize] * (1.0 - TOL));
            assert!(
                saturated,
                "flow on lane {lane} along {path:?} at {rate} has no saturated port (load {load:?}, capacity {cap:?})"
            );
        }
    }
}

fn check_queues(c: &Core, m: &Model) {
    for (i, n) in m.nodes.iter().enumerate() {
        let q = c.storage_queue(i as NodeId).unwrap();
        let outstanding = n.read_requests + n.write_requests;
        assert_eq!(
            (q.read_bytes, q.read_requests, q.write_bytes, q.write_requests),
            (n.read_bytes, n.read_requests, n.write_bytes, n.write_requests),
            "node {i} queue"
        );
        assert_eq!(q.in_flight as u64, outstanding.min(n.depth as u64), "node {i} in flight");
    }
    assert!(c.storage_queue(m.nodes.len() as NodeId).is_err());
}

/// Once idle: exact completed bytes, and the fluid integral and samples within rounding of them.
fn check_counters(c: &mut Core, m: &Model) {
    let now_s = c.now_ns() as f64 / 1e9;
    for (p, spec) in m.specs.iter().enumerate() {
        let k = c.port_counters(p as PortId).unwrap().clone();
        assert_eq!(k.completed_bytes, m.completed[p], "port {p} completed bytes");
        assert!(k.busy_s <= now_s * (1.0 + 1e-12) + 1e-9, "port {p} busy {} s of {now_s}", k.busy_s);
        for l in 0..MAX_LANES {
            let want = m.completed[p][l] as f64;
            // The fluid integral may overshoot a flow's end by up to a nanosecond of service.
            let slack = m.crossings[p] as f64 * spec.peak_bytes_per_s * 2e-9 + 1e-9 * want + 1.0;
            assert!(
                (k.fluid_bytes[l] - want).abs() <= slack,
                "port {p} lane {l}: fluid {} vs completed {want} (slack {slack})",
                k.fluid_bytes[l]
            );
        }
        if m.sample_ns > 0 {
            let total: f64 = k.fluid_bytes.iter().sum();
            let sampled: f64 = k.samples.iter().sum();
            assert!((sampled - total).abs() <= 1e-6 * total + 1.0, "port {p}: samples {sampled} vs {total}");
            for (lane, s) in &k.lane_samples {
                let sum: f64 = s.iter().sum();
                let f = k.fluid_bytes[*lane as usize];
                assert!((sum - f).abs() <= 1e-6 * f + 1.0, "port {p} lane {lane}: samples {sum} vs {f}");
            }
        } else {
            assert!(k.samples.is_empty() && k.lane_samples.is_empty());
        }
    }
}
