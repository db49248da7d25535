//! Forward passes (`forward.rs`) through the public `Core` API: hand-solved pipelines with exact times
//! (compute-bound, load-bound, a lagging store stream, load windows, a collective sharing a compute NIC
//! with KV traffic under the paper's lane arbitration), edge cases, errors, and properties: the end time
//! equals a reference computation when every transfer runs alone on its own ports, contention never makes
//! a forward end sooner, and every port carries exactly the bytes that crossed it.

use std::collections::BTreeMap;

use dualpath_emu_core::*;
use proptest::prelude::*;

const GB: f64 = 1e9;
const MB: u64 = 1_000_000;
const MS: u64 = 1_000_000;

fn core() -> Core {
    Core::new(CoreConfig::default()).unwrap()
}

fn port(c: &mut Core, name: &str, rate: f64) -> PortId {
    c.add_port(PortSpec::plain(name, rate)).unwrap()
}

fn xfer(path: &[PortId], lane: Lane, size_bytes: u64) -> Option<LayerTransfer> {
    Some(LayerTransfer { path: path.to_vec(), lane, size_bytes })
}

fn rank(load: Option<LayerTransfer>, attn_ns: u64, store: Option<LayerTransfer>) -> ForwardRank {
    ForwardRank { load, attn_ns, store }
}

/// Run to idle; every completion by tag (asserting none comes twice).
fn run(c: &mut Core) -> BTreeMap<u64, Completion> {
    c.run_until_idle().unwrap();
    let mut out = BTreeMap::new();
    for done in c.take_completions() {
        assert!(out.insert(done.tag, done).is_none(), "tag {} completed twice", done.tag);
    }
    out
}

/// 3 layers, 2 ranks, ports of 1 GB/s (1 MB takes 1 ms). Rank 0 loads 1 MB per layer and computes 3 ms,
/// rank 1 loads `load1_mb` MB and computes 1 ms; the shared phase takes 2 ms.
fn two_rank_forward(c: &mut Core, load1_mb: u64, store0: Option<LayerTransfer>, load_window: u32) -> ForwardSpec {
    let l0 = port(c, "pe0.cnic.rx", GB);
    let l1 = port(c, "pe1.cnic.rx", GB);
    ForwardSpec {
        n_layers: 3,
        ranks: vec![rank(xfer(&[l0], 2, MB), 3 * MS, store0), rank(xfer(&[l1], 2, load1_mb * MB), MS, None)],
        ffn_ns: 2 * MS,
        collectives: vec![],
        load_window,
    }
}

#[test]
fn compute_bound_forward_hides_its_loads() {
    // Loads end at 1, 2, 3 ms (rank 0) and 2, 4, 6 ms (rank 1); they never hold attention back after layer 0.
    // Layer 0: attention 1→4 and 2→3, shared 4→6. Layer 1: 6→9 and 6→7, shared 9→11.
    // Layer 2: 11→14 and 11→12, shared 14→16.
    let mut c = core();
    let spec = two_rank_forward(&mut c, 2, None, 0);
    c.submit_forward(spec, 7).unwrap();
    assert_eq!(c.pending(), 1);
    c.advance_to(6 * MS).unwrap();
    assert!(c.take_completions().is_empty(), "the loads' completions are internal");
    // Loads run ahead of compute: all six layers' loads are in by 6 ms.
    assert_eq!(c.port_counters(1).unwrap().completed_bytes[2], 6 * MB);
    let done = run(&mut c);
    assert_eq!(done.len(), 1);
    let f = done[&7];
    assert_eq!(f.kind, CompletionKind::Forward);
    assert_eq!((f.start_ns, f.end_ns, f.size_bytes, f.lane), (0, 16 * MS, 9 * MB, 0));
    assert_eq!(c.pending(), 0);
    let k = c.port_counters(0).unwrap();
    assert_eq!(k.completed_bytes[2], 3 * MB);
    assert!((k.busy_s - 0.003).abs() < 1e-12, "{}", k.busy_s);
    let s = c.stats();
    assert_eq!(s.forwards.forwards, 1);
    assert_eq!(s.forwards.transfers, 6);
    assert_eq!(s.forwards.delays, 3 * 2 + 3);
    assert_eq!(s.net.finished, 6);
}

#[test]
fn load_bound_forward_waits_for_the_slowest_rank() {
    // Rank 1 loads 10 MB per layer: its loads end at 10, 20, 30 ms and set the pace (paper §7.5: DP ranks
    // wait for the slowest). Layer 0: attention 1→4 and 10→11, shared 11→13. Layer 1: 13→16 and 20→21,
    // shared 21→23. Layer 2: 23→26 and 30→31, shared 31→33.
    let mut c = core();
    let spec = two_rank_forward(&mut c, 10, None, 0);
    c.submit_forward(spec, 1).unwrap();
    let done = run(&mut c);
    assert_eq!(done[&1].end_ns, 33 * MS);
    assert_eq!(done[&1].size_bytes, 33 * MB);
}

#[test]
fn a_lagging_store_stream_ends_the_forward_after_its_last_layer() {
    // Rank 0 stores 7 MB per layer (7 ms) once each attention ends (4, 9, 14 ms) and the store before it
    // has: 4→11, 11→18, 18→25. The layers end at 16 ms; the forward at 25 ms.
    let mut c = core();
    let s0 = port(&mut c, "pe0.cnic.tx", GB);
    let spec = two_rank_forward(&mut c, 2, xfer(&[s0], 2, 7 * MB), 0);
    c.submit_forward(spec, 1).unwrap();
    // One stream: store 1 waits for store 0 (it does not share the port with it), so each ends on time.
    for (t, stored) in [(11 * MS - 1, 0), (11 * MS, 7 * MB), (18 * MS - 1, 7 * MB), (18 * MS, 14 * MB)] {
        c.advance_to(t).unwrap();
        assert_eq!(c.port_counters(s0).unwrap().completed_bytes[2], stored, "at {t} ns");
    }
    assert!(c.take_completions().is_empty());
    let done = run(&mut c);
    assert_eq!(done[&1].end_ns, 25 * MS);
    assert_eq!(done[&1].size_bytes, 9 * MB + 21 * MB);
}

#[test]
fn a_load_window_bounds_how_far_loads_run_ahead() {
    // Window 1: load l waits for layer l-1, so nothing overlaps. Layer 0 ends at 6 ms as before; layer 1's
    // loads 6→7 and 6→8, attention 7→10 and 8→9, shared 10→12; layer 2: loads 12→13 and 12→14, attention
    // 13→16 and 14→15, shared 16→18.
    let mut c = core();
    let spec = two_rank_forward(&mut c, 2, None, 1);
    c.submit_forward(spec, 1).unwrap();
    assert_eq!(run(&mut c)[&1].end_ns, 18 * MS);
    // Window 2 (double buffering): layer l+1's load overlaps layer l's compute, enough to hide it here.
    let mut c = core();
    let spec = two_rank_forward(&mut c, 2, None, 2);
    c.submit_forward(spec, 1).unwrap();
    c.advance_to(5 * MS).unwrap();
    assert_eq!(c.port_counters(1).unwrap().completed_bytes[2], 4 * MB, "load 2 waits for layer 0");
    assert_eq!(run(&mut c)[&1].end_ns, 16 * MS);
}

/// 2 layers on one rank (no load, 1 ms attention, no store), shared phase: 2 ms compute and a 9.63 MB
/// collective on lane 0 through a 1 GB/s compute NIC, while a 10 MB KV transfer on lane 2 crosses it
/// from t = 0.
fn collective_beside_kv(arbitration: VlArbitration) -> (Core, PortId) {
    let mut c = core();
    let cnic = c.add_port(PortSpec { arbitration, ..PortSpec::plain("pe0.cnic.tx", GB) }).unwrap();
    c.submit_transfer(&[cnic], 2, 10 * MB, 100).unwrap();
    let spec = ForwardSpec {
        n_layers: 2,
        ranks: vec![rank(None, MS, None)],
        ffn_ns: 2 * MS,
        collectives: vec![LayerTransfer { path: vec![cnic], lane: 0, size_bytes: 9_630_000 }],
        load_window: 0,
    };
    c.submit_forward(spec, 1).unwrap();
    (c, cnic)
}

fn assert_near(got: u64, want_ns: f64, slack_ns: f64) {
    assert!((got as f64 - want_ns).abs() <= slack_ns, "got {got} ns, want {want_ns} ± {slack_ns}");
}

#[test]
fn a_collective_on_the_high_lane_takes_the_cnic_from_kv_traffic() {
    // Paper App. A.1: while the collective runs, KV keeps 1/964 of the port, so 9.63 MB takes
    // 9.63 * 964/963 = 9.64 ms. Layer 0: attention 0→1, collective 1→10.64 (the 2 ms compute is
    // shorter); layer 1: attention →11.64, collective →21.28 ms. KV ran alone for 2 ms and got 1/964 of
    // the port for 19.28 ms (20 kB); work conservation ends it at 10 MB + 19.26 MB over 1 GB/s = 29.26 ms.
    let (mut c, cnic) = collective_beside_kv(VlArbitration::paper());
    c.advance_to(2 * MS).unwrap();
    let kv = c.flow_rate(&[cnic], 2).unwrap();
    assert!((kv - GB / 964.0).abs() < 1.0, "{kv}");
    let done = run(&mut c);
    assert_near(done[&1].end_ns, 21.28e6, 3.0);
    assert_eq!(done[&1].size_bytes, 2 * 9_630_000);
    assert_near(done[&100].end_ns, 29.26e6, 3.0);
    let k = c.port_counters(cnic).unwrap();
    assert_eq!((k.completed_bytes[0], k.completed_bytes[2]), (2 * 9_630_000, 10 * MB));
}

#[test]
fn without_lane_isolation_the_collective_shares_the_cnic_with_kv() {
    // No QoS: the collective gets half the port. From 1 ms both move at 0.5 GB/s; the KV transfer's last
    // 9 MB end at 19 ms, then the collective's last 0.63 MB take 0.63 ms: layer 0 ends at 19.63 ms.
    // Layer 1 runs alone: 20.63 ms, then 9.63 ms: 30.26 ms.
    let (mut c, _) = collective_beside_kv(VlArbitration::fair(15));
    let done = run(&mut c);
    assert_near(done[&100].end_ns, 19e6, 2.0);
    assert_near(done[&1].end_ns, 30.26e6, 3.0);
}

#[test]
fn a_forward_with_nothing_that_takes_time_completes_at_its_submission() {
    let mut c = core();
    let p = port(&mut c, "p", GB);
    c.advance_to(5).unwrap();
    let spec = ForwardSpec {
        n_layers: 4,
        ranks: vec![rank(None, 0, None), rank(xfer(&[p], 0, 0), 0, xfer(&[p], 1, 0))],
        ffn_ns: 0,
        collectives: vec![LayerTransfer { path: vec![p], lane: 0, size_bytes: 0 }],
        load_window: 1,
    };
    c.submit_forward(spec, 3).unwrap();
    assert!(c.take_completions().is_empty(), "reported by advancing the clock, never by the submission");
    assert_eq!(c.pending(), 1);
    assert_eq!(c.next_event_ns(), Some(5));
    let done = run(&mut c);
    assert_eq!((done[&3].start_ns, done[&3].end_ns, done[&3].size_bytes), (5, 5, 0));
    assert_eq!(c.now_ns(), 5);
    let s = c.stats().forwards;
    assert_eq!((s.transfers, s.delays), (0, 0));
    assert_eq!(s.instant_steps, 8, "two attentions per layer, no event");
    assert_eq!(c.port_counters(p).unwrap().busy_s, 0.0);
}

#[test]
fn ranks_without_loads_or_stores_and_zero_times_mix_with_busy_ones() {
    // Rank 0 loads 2 MB per layer (2 ms), computes nothing; rank 1 has neither load nor store and
    // computes 1 ms; no shared compute. Layer l's attention of rank 1 waits only for layer l-1: 0→1,
    // then rank 0's load at 2 ms ends layer 0. Layer 1: rank 0's load ended at 4, rank 1 2→3: ends 4.
    // Layer 2: load at 6, rank 1 4→5: ends 6.
    let mut c = core();
    let p = port(&mut c, "p", GB);
    let spec = ForwardSpec {
        n_layers: 3,
        ranks: vec![rank(xfer(&[p], 2, 2 * MB), 0, None), rank(None, MS, None)],
        ..ForwardSpec::default()
    };
    c.submit_forward(spec, 1).unwrap();
    assert_eq!(run(&mut c)[&1].end_ns, 6 * MS);
}

#[test]
fn internal_pieces_never_reach_the_caller_but_share_ports_with_its_transfers() {
    // A forward's loads and a submitted transfer share one port: max-min halves both.
    let mut c = core();
    let p = port(&mut c, "p", GB);
    c.submit_transfer(&[p], 2, 2 * MB, 50).unwrap();
    let spec = ForwardSpec { n_layers: 2, ranks: vec![rank(xfer(&[p], 2, MB), 0, None)], ..ForwardSpec::default() };
    c.submit_forward(spec, 51).unwrap();
    assert_eq!(c.flow_rate(&[p], 2), Some(GB / 2.0), "one group: the forward's load and the transfer");
    assert_eq!(c.pending(), 2);
    let mut seen = Vec::new();
    while let Some(t) = c.step().unwrap() {
        for done in c.take_completions() {
            seen.push((t, done.kind, done.tag));
        }
    }
    // Load 0 at 0.5 GB/s ends at 2 ms; load 1 and the transfer's last MB share until 4 ms, together.
    assert_eq!(seen, vec![(4 * MS, CompletionKind::Transfer, 50), (4 * MS, CompletionKind::Forward, 51)]);
    assert_eq!(c.port_counters(p).unwrap().completed_bytes[2], 4 * MB);
    assert_eq!(c.stats().transfer_events, 2 + 2 * 2, "the user transfer and two loads, each start and end");
}

#[test]
fn bad_forwards_are_rejected_whole_with_the_part_named() {
    let mut c = core();
    let p = port(&mut c, "p", GB);
    let q = c.add_port(PortSpec { arbitration: VlArbitration::paper(), ..PortSpec::plain("q", GB) }).unwrap();
    let good = ForwardSpec { n_layers: 1, ranks: vec![rank(xfer(&[p], 0, 1), 1, None)], ..ForwardSpec::default() };
    let cases: Vec<(ForwardSpec, ErrorKind, &str)> = vec![
        (
            ForwardSpec { ranks: vec![rank(xfer(&[9], 0, 0), 0, None)], ..good.clone() },
            ErrorKind::Unknown,
            "forwards[1].ranks[0].load.path: unknown port 9",
        ),
        (
            ForwardSpec { ranks: vec![rank(None, 0, None), rank(None, 0, xfer(&[p, p], 0, 1))], ..good.clone() },
            ErrorKind::InvalidArgument,
            "forwards[1].ranks[1].store.path: each port once",
        ),
        (
            ForwardSpec { collectives: vec![LayerTransfer { path: vec![q], lane: 5, size_bytes: 1 }], ..good.clone() },
            ErrorKind::InvalidArgument,
            "forwards[1].collectives[0].lane: a lane that port \"q\" serves",
        ),
        (ForwardSpec { n_layers: 0, ..good.clone() }, ErrorKind::InvalidArgument, "forwards[1].n_layers: at least 1"),
        (ForwardSpec { ranks: vec![], ..good.clone() }, ErrorKind::InvalidArgument, "forwards[1].ranks: at least one"),
        (
            ForwardSpec { n_layers: 3, ranks: vec![rank(xfer(&[p], 0, u64::MAX / 2), 0, None)], ..good.clone() },
            ErrorKind::InvalidArgument,
            "forwards[1].size_bytes",
        ),
    ];
    for (bad, kind, message) in cases {
        let e = c.submit_forwards(vec![(good.clone(), 1), (bad, 2)]).unwrap_err();
        assert_eq!(e.kind, kind, "{e}");
        assert!(e.message.starts_with(message), "{e}");
    }
    assert_eq!(c.pending(), 0, "nothing of a rejected batch was accepted");
    assert_eq!(c.stats().forwards.forwards, 0);
    assert_eq!(c.next_event_ns(), None);
    c.submit_forwards(vec![(good.clone(), 1), (good, 2)]).unwrap();
    assert_eq!(run(&mut c).len(), 2);
}

/// Two engine groups' forwards sharing compute NICs with KV and collective traffic: a busy scenario.
fn busy_run() -> (Vec<Completion>, CoreStats) {
    let mut c = core();
    let nic = |c: &mut Core, name: &str| {
        c.add_port(PortSpec { arbitration: VlArbitration::paper(), ..PortSpec::plain(name, 50.0 * GB) }).unwrap()
    };
    let tx: Vec<PortId> = (0..4).map(|g| nic(&mut c, &format!("cnic{g}.tx"))).collect();
    let rx: Vec<PortId> = (0..4).map(|g| nic(&mut c, &format!("cnic{g}.rx"))).collect();
    let dram = port(&mut c, "dram", 500.0 * GB);
    for i in 0..4u64 {
        c.submit_transfer(&[dram, tx[i as usize], rx[(i as usize + 1) % 4]], 2, (i + 1) * 300 * MB, 1000 + i).unwrap();
    }
    let mut batch = Vec::new();
    for (f, group) in [[0usize, 1], [2, 3]].iter().enumerate() {
        let ranks = group
            .iter()
            .map(|&g| {
                rank(
                    xfer(&[dram, tx[g], rx[g]], 2, (g as u64 + 1) * 20 * MB),
                    300_000 + g as u64 * 50_000,
                    xfer(&[tx[g], rx[(g + 2) % 4], dram], 2, 5 * MB),
                )
            })
            .collect();
        let collectives = group
            .iter()
            .flat_map(|&a| group.iter().filter(move |&&b| b != a).map(move |&b| (a, b)))
            .map(|(a, b)| LayerTransfer { path: vec![tx[a], rx[b]], lane: 0, size_bytes: 7 * MB })
            .collect();
        batch.push((
            ForwardSpec { n_layers: 61, ranks, ffn_ns: 200_000, collectives, load_window: 2 * f as u32 },
            f as u64,
        ));
    }
    c.submit_forwards(batch).unwrap();
    c.run_until_idle().unwrap();
    (c.take_completions(), c.stats())
}

#[test]
fn the_same_forwards_give_the_same_times() {
    let (a, sa) = busy_run();
    let (b, sb) = busy_run();
    assert_eq!(a, b);
    assert_eq!(sa, sb);
    assert_eq!(a.iter().filter(|x| x.kind == CompletionKind::Forward).count(), 2);
    assert_eq!(a.len(), 6);
    assert_eq!(sa.forwards.transfers, 2 * 61 * (2 + 2 + 2));
}

#[test]
fn a_forward_runs_on_the_wall_clock() {
    let mut c =
        Core::new(CoreConfig { clock: ClockMode::Wall { time_scale: 100.0 }, ..CoreConfig::default() }).unwrap();
    let p = port(&mut c, "p", GB);
    let spec = ForwardSpec {
        n_layers: 3,
        ranks: vec![rank(xfer(&[p], 0, MB), MS, None)],
        ffn_ns: MS,
        ..ForwardSpec::default()
    };
    c.submit_forward(spec, 1).unwrap();
    let start = c.now_ns();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let done = loop {
        c.poll().unwrap();
        let done = c.take_completions();
        if !done.is_empty() || std::time::Instant::now() > deadline {
            break done;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    assert_eq!(done.len(), 1);
    // Load 0 1 ms, then per layer attention 1 ms + shared 1 ms (later loads hidden): 7 ms of core time.
    assert_eq!(done[0].end_ns - done[0].start_ns, 7 * MS);
    assert_eq!(done[0].start_ns, start);
}

// ---------------------------------------------------------------------------------------------------
// Properties.

/// What the core does to a duration in seconds: round up to the nanosecond, except within float noise of
/// a whole number (`network::ceil_ns`).
fn ceil_ns(x: f64) -> u64 {
    let nearest = x.round();
    if (x - nearest).abs() <= 1e-13 * x.max(1.0) {
        nearest as u64
    } else {
        x.ceil() as u64
    }
}

/// A transfer alone on its ports: size over the slowest port's rate.
fn alone_ns(t: &Option<LayerTransfer>, rates: &[f64]) -> u64 {
    match t {
        Some(t) if t.size_bytes > 0 => {
            let rate = t.path.iter().map(|&p| rates[p as usize]).fold(f64::INFINITY, f64::min);
            ceil_ns(t.size_bytes as f64 / rate * 1e9)
        }
        _ => 0,
    }
}

/// The forward's end by the dependencies of `forward.rs`, with each transfer taking `alone_ns`.
fn reference_end(spec: &ForwardSpec, rates: &[f64], t0: u64) -> u64 {
    let n = spec.n_layers as usize;
    let mut layer_end = vec![0u64; n];
    let mut load_end: Vec<u64> = vec![t0; spec.ranks.len()];
    let mut store_end: Vec<u64> = vec![t0; spec.ranks.len()];
    for l in 0..n {
        let prev_layer = if l > 0 { layer_end[l - 1] } else { t0 };
        let mut shared_start = t0;
        for (r, rank) in spec.ranks.iter().enumerate() {
            let w = spec.load_window as usize;
            let window_start = if w > 0 && l >= w { layer_end[l - w] } else { t0 };
            load_end[r] = load_end[r].max(window_start) + alone_ns(&rank.load, rates);
            let attn_end = load_end[r].max(prev_layer) + rank.attn_ns;
            shared_start = shared_start.max(attn_end);
            store_end[r] = store_end[r].max(attn_end) + alone_ns(&rank.store, rates);
        }
        let collectives = spec.collectives.iter().map(|c| alone_ns(&Some(c.clone()), rates)).max().unwrap_or(0);
        layer_end[l] = shared_start + spec.ffn_ns.max(collectives);
    }
    store_end.into_iter().fold(layer_end[n - 1], u64::max)
}

/// Rates in GB/s, from a small set so ties and non-round durations both occur.
fn rate() -> impl Strategy<Value = f64> {
    prop_oneof![Just(1.0), Just(2.5), Just(10.0), Just(50.0), 0.5f64..100.0].prop_map(|g| g * GB)
}

/// A transfer to build: (hops, size, lane).
type TransferShape = (usize, u64, Lane);

fn transfer() -> impl Strategy<Value = Option<TransferShape>> {
    proptest::option::weighted(0.7, (1usize..=3, prop_oneof![Just(0u64), 1u64..20 * MB], 0u8..3))
}

#[derive(Debug, Clone)]
struct Shape {
    n_layers: u32,
    ranks: Vec<(Option<TransferShape>, u64, Option<TransferShape>)>,
    ffn_ns: u64,
    collectives: Vec<TransferShape>,
    load_window: u32,
    t0: u64,
}

fn shape() -> impl Strategy<Value = Shape> {
    let delay = prop_oneof![Just(0u64), 1u64..3 * MS];
    (
        1u32..6,
        proptest::collection::vec((transfer(), delay.clone(), transfer()), 1..4),
        delay,
        proptest::collection::vec((1usize..=2, prop_oneof![Just(0u64), 1u64..20 * MB], 0u8..3), 0..3),
        0u32..4,
        0u64..5 * MS,
    )
        .prop_map(|(n_layers, ranks, ffn_ns, collectives, load_window, t0)| Shape {
            n_layers,
            ranks,
            ffn_ns,
            collectives,
            load_window,
            t0,
        })
}

/// Build the forward of `shape`, every transfer on ports of its own drawn from `rates` in order (ports
/// are created as needed), or on the first `share` ports round robin when `share` is set.
fn build(c: &mut Core, shape: &Shape, rates: &mut impl Iterator<Item = f64>, share: Option<usize>) -> ForwardSpec {
    let mut next = 0usize;
    let mut t = |c: &mut Core, hops: usize, size: u64, lane: Lane| -> LayerTransfer {
        let mut path = (0..hops)
            .map(|_| {
                next += 1;
                match share {
                    Some(n) => ((next * 7 + hops) % n) as PortId,
                    None => c.add_port(PortSpec::plain(format!("p{}", c.port_count()), rates.next().unwrap())).unwrap(),
                }
            })
            .collect::<Vec<_>>();
        path.sort_unstable();
        path.dedup();
        LayerTransfer { path, lane, size_bytes: size }
    };
    let ranks = shape
        .ranks
        .iter()
        .map(|(load, attn_ns, store)| {
            let load = load.map(|(h, s, l)| t(c, h, s, l));
            let store = store.map(|(h, s, l)| t(c, h, s, l));
            ForwardRank { load, attn_ns: *attn_ns, store }
        })
        .collect();
    let collectives = shape.collectives.iter().map(|&(h, s, l)| t(c, h, s, l)).collect();
    ForwardSpec { n_layers: shape.n_layers, ranks, ffn_ns: shape.ffn_ns, collectives, load_window: shape.load_window }
}

fn rates_of(c: &Core) -> Vec<f64> {
    (0..c.port_count() as PortId).map(|p| c.port_spec(p).unwrap().rate_bytes_per_s).collect()
}

/// Bytes per (port, lane) that the forward moves.
fn expected_bytes(spec: &ForwardSpec, n_ports: usize) -> Vec<[u64; MAX_LANES]> {
    let mut out = vec![[0u64; MAX_LANES]; n_ports];
    let ranks = spec.ranks.iter().flat_map(|r| [&r.load, &r.store]).flatten();
    for t in ranks.chain(&spec.collectives) {
        for &p in &t.path {
            out[p as usize][t.lane as usize] += t.size_bytes * spec.n_layers as u64;
        }
    }
    out
}

/// Every port carried exactly the expected bytes: completed sizes exactly, the fluid integral to within
/// a nanosecond of service per transfer.
fn check_bytes(c: &mut Core, expected: &[[u64; MAX_LANES]], transfers: u64) -> std::result::Result<(), TestCaseError> {
    for (p, lanes) in expected.iter().enumerate() {
        let rate = c.port_spec(p as PortId).unwrap().rate_bytes_per_s;
        let k = c.port_counters(p as PortId).unwrap();
        for (l, &want) in lanes.iter().enumerate() {
            prop_assert_eq!(k.completed_bytes[l], want, "port {} lane {}", p, l);
            let slack = transfers as f64 * rate * 1e-9 + 1e-9 * want as f64 + 1.0;
            prop_assert!(
                (k.fluid_bytes[l] - want as f64).abs() <= slack,
                "port {p} lane {l}: {} vs {want}",
                k.fluid_bytes[l]
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn alone_on_its_ports_a_forward_ends_when_the_reference_says(
        shape in shape(),
        rates in proptest::collection::vec(rate(), 40),
    ) {
        let mut c = core();
        let spec = build(&mut c, &shape, &mut rates.into_iter(), None);
        c.advance_to(shape.t0).unwrap();
        let want = reference_end(&spec, &rates_of(&c), shape.t0);
        let expected = expected_bytes(&spec, c.port_count());
        let total = spec.total_bytes().unwrap();
        c.submit_forwards(vec![(spec.clone(), 42)]).unwrap();
        c.run_until_idle().unwrap();
        let done = c.take_completions();
        prop_assert_eq!(done.len(), 1, "only the forward completes: {:?}", done);
        let f = done[0];
        prop_assert_eq!((f.kind, f.tag, f.start_ns, f.size_bytes, f.lane), (CompletionKind::Forward, 42, shape.t0, total, 0));
        prop_assert_eq!(f.end_ns, want);
        prop_assert_eq!(c.now_ns(), want);
        prop_assert_eq!(c.pending(), 0);
        let moving = spec.ranks.iter().flat_map(|r| [&r.load, &r.store]).flatten().chain(&spec.collectives)
            .filter(|t| t.size_bytes > 0).count() as u64 * spec.n_layers as u64;
        let s = c.stats();
        prop_assert_eq!(s.forwards.transfers, moving);
        prop_assert_eq!(s.net.finished, moving);
        check_bytes(&mut c, &expected, moving)?;
    }

    #[test]
    fn contention_never_makes_a_forward_end_sooner_and_ports_conserve_bytes(
        shapes in proptest::collection::vec(shape(), 1..4),
        rates in proptest::collection::vec(rate(), 5),
        background in proptest::collection::vec((0usize..5, 1u64..50 * MB, 0u8..3), 0..6),
    ) {
        let mut c = core();
        for (i, &r) in rates.iter().enumerate() {
            let arbitration = if i % 2 == 0 { VlArbitration::paper() } else { VlArbitration::fair(4) };
            c.add_port(PortSpec { arbitration, ..PortSpec::plain(format!("p{i}"), r) }).unwrap();
        }
        let mut expected = vec![[0u64; MAX_LANES]; 5];
        let mut transfers = 0u64;
        for (tag, &(p, size, lane)) in background.iter().enumerate() {
            c.submit_transfer(&[p as PortId], lane, size, 1000 + tag as u64).unwrap();
            expected[p][lane as usize] += size;
            transfers += 1;
        }
        let mut want = BTreeMap::new();
        let mut batch = Vec::new();
        for (i, shape) in shapes.iter().enumerate() {
            let spec = build(&mut c, shape, &mut std::iter::empty(), Some(5));
            for (p, lanes) in expected_bytes(&spec, 5).iter().enumerate() {
                for l in 0..MAX_LANES { expected[p][l] += lanes[l]; }
            }
            transfers += spec.ranks.iter().flat_map(|r| [&r.load, &r.store]).flatten().chain(&spec.collectives)
                .filter(|t| t.size_bytes > 0).count() as u64 * spec.n_layers as u64;
            // Flows of one group that end within a nanosecond's service of each other end together, so
            // each piece on the critical path may end up to a nanosecond early.
            let pieces = spec.n_layers as u64 * (2 * spec.ranks.len() + spec.collectives.len() + 2) as u64;
            want.insert(i as u64, (reference_end(&spec, &rates, 0), pieces, spec.total_bytes().unwrap()));
            batch.push((spec, i as u64));
        }
        c.submit_forwards(batch).unwrap();
        c.run_until_idle().unwrap();
        let mut seen = BTreeMap::new();
        for done in c.take_completions() {
            prop_assert!(seen.insert((done.kind == CompletionKind::Forward, done.tag), done).is_none());
        }
        prop_assert_eq!(seen.len(), shapes.len() + background.len());
        for (tag, (alone, pieces, total)) in want {
            let f = seen[&(true, tag)];
            prop_assert!(f.end_ns + pieces >= alone, "forward {} ended at {} before its alone time {}", tag, f.end_ns, alone);
            prop_assert_eq!(f.size_bytes, total);
        }
        prop_assert_eq!(c.pending(), 0);
        check_bytes(&mut c, &expected, transfers)?;
    }
}
