//! The data plane end to end through the public `Core` API: hand-solvable cases with exact completion
//! times, storage queues, token buckets, and properties over random operation sequences.

use std::collections::BTreeMap;

use dualpath_emu_core::*;
use proptest::prelude::*;

const GB: f64 = 1e9;
const MS: u64 = 1_000_000;

fn core() -> Core {
    Core::new(CoreConfig::default()).unwrap()
}

fn port(c: &mut Core, name: &str, rate: f64) -> PortId {
    c.add_port(PortSpec::plain(name, rate)).unwrap()
}

fn qos_port(c: &mut Core, name: &str, rate: f64, arbitration: VlArbitration) -> PortId {
    c.add_port(PortSpec { arbitration, ..PortSpec::plain(name, rate) }).unwrap()
}

fn run(c: &mut Core) -> BTreeMap<u64, Completion> {
    c.run_until_idle().unwrap();
    c.take_completions().into_iter().map(|x| (x.tag, x)).collect()
}

#[test]
fn one_transfer_takes_size_over_rate() {
    let mut c = core();
    let p = port(&mut c, "snic", 50.0 * GB);
    c.submit_transfer(&[p], 0, 1_000_000_000, 7).unwrap();
    let done = run(&mut c);
    assert_eq!(done[&7].end_ns, 20 * MS);
    assert_eq!(done[&7].kind, CompletionKind::Transfer);
}

#[test]
fn n_equal_transfers_share_and_finish_together() {
    let mut c = core();
    let p = port(&mut c, "cnic", 50.0 * GB);
    for tag in 0..4 {
        c.submit_transfer(&[p], 0, 1_000_000_000, tag).unwrap();
    }
    let done = run(&mut c);
    assert!(done.values().all(|x| x.end_ns == 80 * MS), "{done:?}");
}

#[test]
fn two_hop_bottleneck_and_work_conservation_on_the_wide_hop() {
    let mut c = core();
    let wide = port(&mut c, "wide", 100.0 * GB);
    let narrow = port(&mut c, "narrow", 10.0 * GB);
    c.submit_transfer(&[wide, narrow], 0, 1_000_000_000, 1).unwrap();
    c.submit_transfer(&[wide], 0, 1_000_000_000, 2).unwrap();
    assert_eq!(c.flow_rate(&[wide, narrow], 0), Some(10.0 * GB));
    // The flow held back by the narrow hop leaves 90 GB/s of the wide port to the other flow.
    assert_eq!(c.flow_rate(&[wide], 0), Some(90.0 * GB));
    let done = run(&mut c);
    assert_eq!(done[&1].end_ns, 100 * MS);
    assert_eq!(done[&2].end_ns, 11_111_112); // ceil(1e9 / 90e9 s) in ns
}

#[test]
fn strict_priority_burst_preempts_low_lane() {
    let mut c = core();
    let p = qos_port(&mut c, "cnic", GB, VlArbitration::strict_priority(&[0], &[1]));
    c.submit_transfer(&[p], 1, 1_000_000_000, 1).unwrap();
    c.advance_to(500 * MS).unwrap();
    c.submit_transfer(&[p], 0, 100_000_000, 2).unwrap();
    assert_eq!(c.flow_rate(&[p], 1), Some(0.0));
    let done = run(&mut c);
    assert_eq!(done[&2].end_ns, 600 * MS);
    assert_eq!(done[&1].end_ns, 1100 * MS);
}

#[test]
fn paper_lanes_leave_the_kv_lane_a_trickle_and_conserve_work() {
    // App. A.1: high limit 240 (960 KiB) then one 4 KiB low-table packet; in the low table VL0 (weight
    // 192 = 3 packets) and VL2 (64 = 1 packet) take turns, so the KV lane keeps 1/241 * 1/4 = 1/964.
    let mut c = core();
    let p = qos_port(&mut c, "cnic", GB, VlArbitration::paper());
    c.submit_transfer(&[p], 2, 1_000_000_000, 1).unwrap();
    c.advance_to(500 * MS).unwrap();
    c.submit_transfer(&[p], 0, 100_000_000, 2).unwrap();
    let kv = c.flow_rate(&[p], 2).unwrap();
    assert!((kv - GB / 964.0).abs() < 1.0, "{kv}");
    let done = run(&mut c);
    // 100 MB at 963/964 of 1 GB/s.
    assert_eq!(done[&2].end_ns, 500 * MS + (0.1 * 964.0 / 963.0 * 1e9_f64).ceil() as u64);
    // Work conserving: 1.1 GB through a 1 GB/s port ends at 1.1 s (to within the rounding of each step).
    assert!((done[&1].end_ns as i64 - 1100 * MS as i64).abs() <= 2, "{}", done[&1].end_ns);
}

#[test]
fn zero_byte_transfer_completes_now() {
    let mut c = core();
    let p = port(&mut c, "p", GB);
    c.advance_to(5).unwrap();
    c.submit_transfer(&[p], 0, 0, 3).unwrap();
    let done = run(&mut c);
    assert_eq!(done[&3].end_ns, 5);
}

#[test]
fn bad_arguments_are_errors_naming_the_argument() {
    let mut c = core();
    let p = port(&mut c, "p", GB);
    let e = c.submit_transfer(&[], 0, 1, 0).unwrap_err();
    assert!(e.message.starts_with("path"), "{e}");
    let e = c.submit_transfer(&[p, 99], 0, 1, 0).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unknown);
    let e = c.submit_transfer(&[p, p], 0, 1, 0).unwrap_err();
    assert!(e.message.contains("twice"), "{e}");
    let e = c.submit_transfer(&[p], 16, 1, 0).unwrap_err();
    assert!(e.message.starts_with("lane"), "{e}");
    let e = c.add_port(PortSpec::plain("q", 0.0)).unwrap_err();
    assert!(e.message.starts_with("rate_bytes_per_s"), "{e}");
    let e = c.add_port(PortSpec::plain("q", f64::NAN)).unwrap_err();
    assert!(e.message.starts_with("rate_bytes_per_s"), "{e}");
    let e = c.add_port(PortSpec::plain("p", GB)).unwrap_err();
    assert!(e.message.contains("already exists"), "{e}");
    let q = qos_port(&mut c, "qos", GB, VlArbitration::paper());
    let e = c.submit_transfer(&[q], 5, 1, 0).unwrap_err();
    assert!(e.message.contains("no weight"), "{e}");
    assert_eq!(c.advance_to(0).unwrap(), 0);
    c.advance_to(10).unwrap();
    assert!(c.advance_to(5).is_err());
    assert!(c.add_timer(3, 0).is_err());
    assert_eq!(c.pending(), 0, "nothing rejected was accepted");
}

#[test]
fn storage_read_waits_latency_queue_and_bandwidth() {
    let mut c = core();
    let cluster = port(&mut c, "3fs", 1000.0 * GB);
    let snic = port(&mut c, "node0.snic.rx", 50.0 * GB);
    let dram = port(&mut c, "node0.dram", 500.0 * GB);
    let snic_tx = port(&mut c, "node0.snic.tx", 50.0 * GB);
    c.configure_storage(StorageSpec {
        read_port: cluster,
        write_port: cluster,
        read_latency_ns: MS,
        write_latency_ns: 2 * MS,
    })
    .unwrap();
    let node = c
        .add_storage_node(StorageNodeSpec {
            name: "node0".into(),
            read_path: vec![snic, dram],
            write_path: vec![dram, snic_tx],
            queue_depth: 1,
        })
        .unwrap();
    c.submit_io(node, IoKind::Read, 2, 1_000_000_000, 1).unwrap();
    c.submit_io(node, IoKind::Read, 2, 500_000_000, 2).unwrap();
    let q = c.storage_queue(node).unwrap();
    assert_eq!((q.read_bytes, q.read_requests, q.in_flight), (1_500_000_000, 2, 1));
    c.advance_to(21 * MS).unwrap();
    let q = c.storage_queue(node).unwrap();
    assert_eq!((q.read_bytes, q.read_requests), (500_000_000, 1));
    let done = run(&mut c);
    assert_eq!(done[&1].end_ns, 21 * MS); // 1 ms latency + 1 GB at 50 GB/s
    assert_eq!(done[&2].end_ns, 21 * MS + MS + 10 * MS); // queued behind the first (depth 1)
    assert_eq!(done[&2].kind, CompletionKind::Read);
    assert_eq!(done[&2].start_ns, 0);
    c.submit_io(node, IoKind::Write, 2, 50_000_000, 3).unwrap();
    let done = run(&mut c);
    assert_eq!(done[&3].end_ns, 32 * MS + 2 * MS + MS);
    assert_eq!(c.port_counters(snic_tx).unwrap().completed_bytes[2], 50_000_000);
    assert_eq!(c.port_counters(dram).unwrap().completed_bytes[2], 1_550_000_000);
    assert_eq!(c.storage_queue(node).unwrap(), QueueState::default());
}

#[test]
fn token_bucket_runs_at_peak_until_dry() {
    let mut c = core();
    let spec = PortSpec { peak_bytes_per_s: 2.0 * GB, burst_bytes: 1e8, ..PortSpec::plain("shaped", GB) };
    let p = c.add_port(spec).unwrap();
    c.submit_transfer(&[p], 0, 1_000_000_000, 1).unwrap();
    assert_eq!(c.flow_rate(&[p], 0), Some(2.0 * GB));
    // Tokens drain at (2 - 1) GB/s: dry after 0.1 s having sent 0.2 GB; the remaining 0.8 GB at 1 GB/s.
    let done = run(&mut c);
    assert_eq!(done[&1].end_ns, 900 * MS);
}

#[test]
fn counters_and_samples_add_up() {
    let mut c = Core::new(CoreConfig { sample_interval_ns: 10 * MS, ..CoreConfig::default() }).unwrap();
    let p = port(&mut c, "p", GB);
    c.submit_transfer(&[p], 3, 25_000_000, 1).unwrap();
    run(&mut c);
    c.advance_to(50 * MS).unwrap();
    let k = c.port_counters(p).unwrap().clone();
    assert_eq!(k.completed_bytes[3], 25_000_000);
    assert!((k.fluid_bytes[3] - 25e6).abs() < 1.0);
    assert!((k.busy_s - 0.025).abs() < 1e-9);
    assert_eq!(k.samples.len(), 3);
    assert!((k.samples[0] - 1e7).abs() < 1.0 && (k.samples[2] - 5e6).abs() < 1.0, "{:?}", k.samples);
    assert_eq!(k.lane_samples.len(), 1);
    let path = std::env::temp_dir().join("dualpath_trace_test.json");
    c.write_trace(path.to_str().unwrap(), None, &[]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(v["traceEvents"].as_array().unwrap().iter().any(|e| e["ph"] == "C" && e["name"] == "p"));
    // Full, full, half: the 1-s p99 sees the full intervals, the mean series all three.
    let mean = c.utilisation_mean(&[p], 30 * MS).unwrap();
    assert!(mean.len() == 3 && (mean[0] - 1.0).abs() < 1e-6 && (mean[2] - 0.5).abs() < 1e-6, "{mean:?}");
    assert!((c.utilisation_quantile(&[p], 0.99, 30 * MS).unwrap() - 1.0).abs() < 1e-6);
    assert!((c.utilisation_quantile(&[p], 0.0, 30 * MS).unwrap() - 0.5).abs() < 1e-6);
}

#[test]
fn utilisation_quantile_counts_idle_intervals_and_ports() {
    let mut c = Core::new(CoreConfig { sample_interval_ns: 10 * MS, ..CoreConfig::default() }).unwrap();
    let busy = port(&mut c, "busy", GB);
    let idle = port(&mut c, "idle", GB);
    // Busy for the first 10 ms of 100 ms: of the 20 (port, interval) samples, one is 1.0, the rest 0.
    c.submit_transfer(&[busy], 0, 10_000_000, 1).unwrap();
    run(&mut c);
    c.advance_to(100 * MS).unwrap();
    assert_eq!(c.utilisation_quantile(&[busy, idle], 0.9, 100 * MS).unwrap(), 0.0);
    assert!((c.utilisation_quantile(&[busy, idle], 0.96, 100 * MS).unwrap() - 1.0).abs() < 1e-6);
    let mean = c.utilisation_mean(&[busy, idle], 100 * MS).unwrap();
    assert_eq!(mean.len(), 10);
    assert!((mean[0] - 0.5).abs() < 1e-6 && mean[1..].iter().all(|&u| u == 0.0), "{mean:?}");
    assert!(c.utilisation_quantile(&[busy], 1.5, 100 * MS).is_err());
    assert!(c.utilisation_mean(&[busy], 200 * MS).is_err(), "past now");
}

#[test]
fn a_partly_covered_interval_is_relative_to_the_part_covered() {
    let mut c = Core::new(CoreConfig { sample_interval_ns: 10 * MS, ..CoreConfig::default() }).unwrap();
    let p = port(&mut c, "p", GB);
    c.submit_transfer(&[p], 0, 15_000_000, 1).unwrap();
    run(&mut c); // busy until 15 ms, and now is 15 ms: the second interval is half covered, all busy
    let mean = c.utilisation_mean(&[p], 15 * MS).unwrap();
    assert!(mean.len() == 2 && mean.iter().all(|u| (u - 1.0).abs() < 1e-6), "{mean:?}");
}

#[test]
fn trace_has_metadata_and_one_async_slice_per_transfer_named_by_its_path() {
    let mut c =
        Core::new(CoreConfig { sample_interval_ns: 10 * MS, record_spans: true, ..CoreConfig::default() }).unwrap();
    let a = port(&mut c, "n0.tx", GB);
    let b = port(&mut c, "n1.rx", GB);
    c.submit_transfer(&[a, b], 0, 5_000_000, 1).unwrap();
    c.submit_transfer(&[a, b], 0, 5_000_000, dualpath_emu_core::UNREPORTED_TAG).unwrap();
    run(&mut c);
    let path = std::env::temp_dir().join(format!("dualpath_trace_spans_{}.json", std::process::id()));
    c.write_trace(path.to_str().unwrap(), None, &[r#"{"name": "extra", "ph": "i", "pid": 9, "ts": 1}"#.into()])
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let names: Vec<&str> =
        events.iter().filter(|e| e["ph"] == "M").map(|e| e["args"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["n0", "n1"]);
    let slices: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "b" || e["ph"] == "e").collect();
    assert_eq!(slices.len(), 4, "two transfers, each a begin and an end");
    assert!(slices.iter().all(|e| e["name"] == "n0.tx → n1.rx" && e["pid"] == 1 && e["cat"] == "transfer"));
    assert_ne!(slices[0]["id"], slices[2]["id"]);
    assert!(events.iter().any(|e| e["name"] == "extra"));
    let bad = c.write_trace(path.to_str().unwrap(), None, &["[1]".into()]).unwrap_err();
    assert!(bad.message.contains("extra_events[0]"), "{}", bad.message);
    assert!(c.write_trace(path.to_str().unwrap(), Some(&[1]), &[]).is_err(), "one pid per port");
}

#[test]
fn trace_names_paths_of_groups_whose_ids_were_reused() {
    // One path at a time, more paths than the network keeps empty groups for: it frees them and gives
    // their ids to new groups, and every span still carries its own path's name.
    let mut c = Core::new(CoreConfig { record_spans: true, ..CoreConfig::default() }).unwrap();
    let ports: Vec<PortId> = (0..160).map(|i| port(&mut c, &format!("n{i}.p"), GB)).collect();
    let mut want = Vec::new();
    for (i, &a) in ports.iter().enumerate() {
        for (j, &b) in ports.iter().enumerate().skip(i + 1) {
            c.submit_transfer(&[a, b], 0, 1_000, 0).unwrap();
            run(&mut c);
            want.push(format!("n{i}.p → n{j}.p"));
        }
    }
    let path = std::env::temp_dir().join(format!("dualpath_trace_reuse_{}.json", std::process::id()));
    c.write_trace(path.to_str().unwrap(), None, &[]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let begins: Vec<&str> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "b")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(begins, want);
}

// ---------------------------------------------------------------------------------------------------
// Properties over random topologies and operation sequences.

#[derive(Debug, Clone)]
enum Op {
    Submit { path: Vec<usize>, lane: u8, size: u64 },
    Advance { dt_ns: u64 },
}

fn ops(n_ports: usize) -> impl Strategy<Value = Vec<Op>> {
    let ports: Vec<usize> = (0..n_ports).collect();
    let submit = (proptest::sample::subsequence(ports, 1..=3), 0u8..4, 1u64..50_000_000)
        .prop_flat_map(|(path, lane, size)| (Just(path).prop_shuffle(), Just(lane), Just(size)))
        .prop_map(|(path, lane, size)| Op::Submit { path, lane, size });
    let advance = (0u64..20 * MS).prop_map(|dt_ns| Op::Advance { dt_ns });
    proptest::collection::vec(prop_oneof![3 => submit, 1 => advance], 1..60)
}

fn topology() -> impl Strategy<Value = Vec<(f64, u8)>> {
    // (rate in GB/s, arbitration: 0 fair, 1 paper, 2 strict 0>1..3, 3 WRR)
    proptest::collection::vec((prop_oneof![Just(1.0), Just(10.0), Just(50.0), 1.0f64..100.0], 0u8..4), 1..6)
}

fn arbitration(kind: u8) -> VlArbitration {
    match kind {
        0 => VlArbitration::fair(4),
        1 => VlArbitration::paper(),
        2 => VlArbitration::strict_priority(&[0], &[1, 2, 3]),
        _ => VlArbitration::weighted_round_robin(&[(0, 1), (1, 3), (2, 64), (3, 255)]),
    }
}

/// After every change: no port over capacity, and every in-flight flow has a saturated port on its path
/// (max-min: nobody could go faster without slowing someone; a backlogged lane never waits on an idle port).
fn check_allocation(c: &mut Core, ports: &[PortId]) -> std::result::Result<(), TestCaseError> {
    let tol = 1e-7;
    // Capacity is never exceeded. Work conservation is exact unless the rate iteration stopped short of
    // its fixed point (possible only with mixed arbitration around a loop of paths; network::recompute).
    let flights = c.in_flight();
    let converged = c.stats().net.non_converged == 0;
    let mut load = vec![0.0; ports.len()];
    for (path, _, n, rate) in &flights {
        prop_assert!(rate.is_finite() && *rate >= 0.0);
        for &p in path {
            load[p as usize] += *n as f64 * rate;
        }
    }
    for &p in ports {
        let cap = c.capacity(p).unwrap();
        prop_assert!(load[p as usize] <= cap * (1.0 + tol), "port {p} load {} > {cap}", load[p as usize]);
        let lanes: f64 = c.lane_rates(p).unwrap().iter().sum();
        prop_assert!((lanes - load[p as usize]).abs() <= 1e-6 * cap, "usage bookkeeping drifted at {p}");
    }
    for (path, lane, _, rate) in &flights {
        let saturated = path.iter().any(|&p| load[p as usize] >= c.capacity(p).unwrap() * (1.0 - tol));
        prop_assert!(
            saturated || !converged,
            "flow on lane {lane} along {path:?} at {rate} has no saturated port ({:?})",
            c.stats().net
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_every_invariant(topo in topology(), ops in ops(6)) {
        let mut c = core();
        let ports: Vec<PortId> = topo.iter().enumerate()
            .map(|(i, &(gbps, arb))| qos_port(&mut c, &format!("p{i}"), gbps * GB, arbitration(arb)))
            .collect();
        let mut expected_bytes = vec![[0u64; MAX_LANES]; ports.len()];
        let mut crossings = vec![0u64; ports.len()];
        let mut submitted = BTreeMap::new();
        let mut last_end = 0;
        let mut tag = 0u64;
        let mut seen = BTreeMap::new();
        for op in ops {
            match op {
                Op::Submit { path, lane, size } => {
                    let path: Vec<PortId> = path.into_iter().filter(|&i| i < ports.len()).map(|i| ports[i]).collect();
                    if path.is_empty() { continue; }
                    // Strict priority starves lanes forever when lane 0 never ends; keep lanes the arbiter serves.
                    if c.check_transfer(&path, lane).is_err() { continue; }
                    c.submit_transfer(&path, lane, size, tag).unwrap();
                    for &p in &path {
                        expected_bytes[p as usize][lane as usize] += size;
                        crossings[p as usize] += 1;
                    }
                    submitted.insert(tag, (c.now_ns(), size));
                    tag += 1;
                }
                Op::Advance { dt_ns } => { let t = c.now_ns() + dt_ns; c.advance_to(t).unwrap(); }
            }
            check_allocation(&mut c, &ports)?;
            for done in c.take_completions() {
                prop_assert!(done.end_ns >= last_end, "time went backwards");
                last_end = done.end_ns;
                prop_assert!(seen.insert(done.tag, done).is_none(), "completed twice");
            }
        }
        c.run_until_idle().unwrap();
        for done in c.take_completions() {
            prop_assert!(done.end_ns >= last_end, "time went backwards");
            last_end = done.end_ns;
            prop_assert!(seen.insert(done.tag, done).is_none(), "completed twice");
        }
        prop_assert_eq!(seen.len(), submitted.len(), "every transfer ends exactly once");
        for (tag, (start, size)) in &submitted {
            let done = &seen[tag];
            prop_assert_eq!(done.start_ns, *start);
            prop_assert_eq!(done.size_bytes, *size);
            prop_assert!(done.end_ns >= *start);
        }
        for (i, &p) in ports.iter().enumerate() {
            let k = c.port_counters(p).unwrap();
            for (l, &expected) in expected_bytes[i].iter().enumerate() {
                prop_assert_eq!(k.completed_bytes[l], expected);
                let want = expected as f64;
                // The fluid integral may run past a flow's exact end by up to one nanosecond of service,
                // since completions happen on whole nanoseconds.
                let slack = crossings[i] as f64 * topo[i].0 * GB * 1e-9 + 1e-9 * want + 1.0;
                prop_assert!(k.fluid_bytes[l] >= want - slack && k.fluid_bytes[l] <= want + slack,
                    "port {} lane {} moved {} bytes, expected {}", i, l, k.fluid_bytes[l], want);
            }
        }
        // Ports that all arbitrate alike always reach the fixed point; mixed arbitration along one path
        // may leave a continuum of fixed points (see network::recompute), where the invariants above
        // still hold.
        if topo.iter().all(|t| t.1 == topo[0].1) {
            prop_assert_eq!(c.stats().net.non_converged, 0);
        }
        prop_assert_eq!(c.pending(), 0);
    }

    #[test]
    fn bucket_never_exceeds_rate_plus_burst_over_any_window(
        sizes in proptest::collection::vec(1u64..200_000_000, 1..8),
        gaps in proptest::collection::vec(0u64..300 * MS, 8),
        burst in 1e6f64..3e8,
    ) {
        let mut c = Core::new(CoreConfig { sample_interval_ns: MS, ..CoreConfig::default() }).unwrap();
        let spec = PortSpec { peak_bytes_per_s: 4.0 * GB, burst_bytes: burst, ..PortSpec::plain("shaped", GB) };
        let p = c.add_port(spec).unwrap();
        for (i, &size) in sizes.iter().enumerate() {
            c.submit_transfer(&[p], 0, size, i as u64).unwrap();
            let t = c.now_ns() + gaps[i];
            c.advance_to(t).unwrap();
        }
        c.run_until_idle().unwrap();
        let k = c.port_counters(p).unwrap();
        // Samples are per 1 ms; any window of w samples may carry at most rate*w + burst (+ one sample of
        // slack at each edge because a window of samples is wider than the exact window it covers).
        let s = &k.samples;
        let mut prefix = vec![0.0];
        for x in s { prefix.push(prefix.last().unwrap() + x); }
        for i in 0..s.len() {
            for j in i + 1..=s.len() {
                let w = (j - i) as f64 * 1e-3;
                let bytes = prefix[j] - prefix[i];
                // Event times are rounded up to the nanosecond: allow a nanosecond at peak (4 B) per window edge
                // and per transfer's start and end inside it (a case with 8 transfers went 8.7 B over 8 B).
                let slack = 4.0 * (2.0 + 2.0 * sizes.len() as f64);
                prop_assert!(bytes <= GB * w + burst + slack, "window {i}..{j}: {bytes} > {}", GB * w + burst);
            }
        }
        prop_assert_eq!(k.completed_bytes[0], sizes.iter().sum::<u64>());
    }
}

#[test]
fn many_flows_many_paths_match_a_global_max_min_solution() {
    // Three-port line: A-B-C. Flows: [A,B] x2, [B,C] x1, [A] x1, [C] x1 with capacities 10, 6, 20.
    // Max-min: B is the bottleneck for the 3 flows through it (2 each); A: 10 - 4 = 6 for [A];
    // C: 20 - 2 = 18 for [C].
    let mut c = core();
    let a = port(&mut c, "A", 10.0);
    let b = port(&mut c, "B", 6.0);
    let cc = port(&mut c, "C", 20.0);
    for (i, path) in [vec![a, b], vec![a, b], vec![b, cc], vec![a], vec![cc]].iter().enumerate() {
        c.submit_transfer(path, 0, 1_000, i as u64).unwrap();
    }
    assert_eq!(c.flow_rate(&[a, b], 0), Some(2.0));
    assert_eq!(c.flow_rate(&[b, cc], 0), Some(2.0));
    assert_eq!(c.flow_rate(&[a], 0), Some(6.0));
    assert_eq!(c.flow_rate(&[cc], 0), Some(18.0));
}

#[test]
fn wall_clock_core_follows_the_wall_and_wakes_its_descriptor() {
    let mut c = Core::new(CoreConfig { clock: ClockMode::Wall { time_scale: 1.0 }, ..CoreConfig::default() }).unwrap();
    let p = port(&mut c, "p", GB);
    c.submit_transfer(&[p], 0, 30_000_000, 1).unwrap(); // 30 ms at 1 GB/s
    assert_eq!(c.poll().unwrap(), 0, "nothing is due yet");
    assert!(c.advance_to(u64::MAX).is_err(), "a wall clock cannot be advanced by hand");
    // The pacer makes the descriptor readable once the transfer is due.
    let fd = c.wakeup_fd().unwrap();
    let mut fds = [libc_pollfd(fd)];
    let ready = unsafe { poll(fds.as_mut_ptr(), 1, 2_000) };
    assert_eq!(ready, 1, "descriptor did not become readable");
    assert!(
        c.poll().unwrap() >= 1 || {
            std::thread::sleep(std::time::Duration::from_millis(5));
            c.poll().unwrap() >= 1
        }
    );
    let done = c.take_completions();
    assert_eq!(done[0].tag, 1);
    assert_eq!(done[0].end_ns, done[0].start_ns + 30 * MS, "completion carries its modelled time");
    assert!(c.now_ns() >= done[0].end_ns);
}

#[test]
fn clock_ns_reads_the_scaled_wall_clock_without_handling_events() {
    let mut c = Core::new(CoreConfig { clock: ClockMode::Wall { time_scale: 4.0 }, ..CoreConfig::default() }).unwrap();
    assert_eq!(c.time_scale(), Some(4.0));
    let p = port(&mut c, "p", GB);
    c.submit_transfer(&[p], 0, 1_000, 1).unwrap(); // 1 us of core time
    std::thread::sleep(std::time::Duration::from_millis(10));
    let before = c.now_ns();
    let reading = c.clock_ns();
    assert!(reading >= 40 * MS, "10 ms of wall time at scale 4 is >= 40 ms of core time, got {reading}");
    assert_eq!(c.now_ns(), before, "reading the clock handles nothing");
    assert!(c.take_completions().is_empty());
    let mut v = core();
    assert_eq!((v.time_scale(), v.clock_ns()), (None, 0));
    v.add_timers(&[(5, 1)]).unwrap();
    v.advance_to(5).unwrap();
    assert_eq!(v.clock_ns(), 5);
}

#[repr(C)]
struct PollFd {
    fd: i32,
    events: i16,
    revents: i16,
}

fn libc_pollfd(fd: i32) -> PollFd {
    PollFd { fd, events: 1 /* POLLIN */, revents: 0 }
}

extern "C" {
    fn poll(fds: *mut PollFd, nfds: u64, timeout_ms: i32) -> i32;
}

#[test]
fn a_bucket_forecast_made_void_by_a_lighter_load_does_not_fire() {
    // The port runs above its sustained rate (tokens draining), then the load drops below it: the
    // forecast "bucket dry at t" is void and must not move the clock when the core runs to idle.
    let mut c = core();
    let spec = PortSpec { peak_bytes_per_s: 2.0 * GB, burst_bytes: 1e9, ..PortSpec::plain("shaped", GB) };
    let p = c.add_port(spec).unwrap();
    c.submit_transfer(&[p], 0, 1_000_000, 1).unwrap(); // 0.5 ms at the peak; the bucket would last 1 s
    let end = c.run_until_idle().unwrap();
    let done = c.take_completions();
    assert_eq!(done[0].end_ns, 500_000);
    assert_eq!(end, 500_000, "the clock ran on to a void bucket forecast");
}

// Regressions found by fuzzing (fuzz/fuzz_targets/core_ops.rs, arbitration.rs).

#[test]
fn a_bucket_forecast_beyond_the_end_of_time_does_not_overflow() {
    let mut c = core();
    let spec = PortSpec { peak_bytes_per_s: 1e3 * (1.0 + 1e-6), burst_bytes: 1e12, ..PortSpec::plain("slow", 1e3) };
    let p = c.add_port(spec).unwrap();
    c.advance_to(1).unwrap();
    c.submit_transfer(&[p], 0, 1000, 1).unwrap();
    c.run_until_idle().unwrap();
    assert_eq!(c.take_completions().len(), 1);
}

#[test]
fn an_idle_lane_carries_exactly_nothing_after_rates_came_and_went() {
    let mut c = core();
    let fast = port(&mut c, "fast", 1e9);
    let slow = port(&mut c, "slow", 1193.3083573853105);
    c.submit_transfer(&[slow, fast], 1, 1_000, 1).unwrap();
    c.submit_transfer(&[fast], 1, 66, 2).unwrap();
    c.submit_transfer(&[slow, fast], 0, 1_000_000_000_000, 3).unwrap(); // keeps `fast` busy on lane 0
    c.advance_to(10_000_000_000).unwrap();
    assert_eq!(c.take_completions().len(), 2);
    assert_eq!(c.lane_rates(fast).unwrap()[1], 0.0);
    c.run_until_idle().unwrap();
    let k = c.port_counters(fast).unwrap();
    assert_eq!(k.completed_bytes[1], 1066);
    assert!((k.fluid_bytes[1] - 1066.0).abs() <= 2.0, "{}", k.fluid_bytes[1]);
}

#[test]
fn allocation_holds_at_extreme_scales() {
    let model = VlArbitration::paper().rate_model(4096).unwrap();
    let mut d = [0.0; MAX_LANES];
    let mut out = [0.0; MAX_LANES];
    d[0] = 1e200;
    d[1] = f64::INFINITY;
    model.allocate(4e200, &d, &mut out);
    assert!((out[1] - 3e200).abs() <= 1e188, "{}", out[1]);
    d[0] = 1e-200;
    model.allocate(4e-200, &d, &mut out);
    assert!(out.iter().sum::<f64>() <= 4e-200 * (1.0 + 1e-12), "{out:?}");
}

#[test]
fn work_near_the_end_of_time_neither_panics_nor_spins() {
    let mut c = core();
    let p = port(&mut c, "p", GB);
    let cluster = port(&mut c, "3fs", GB);
    c.configure_storage(StorageSpec {
        read_port: cluster,
        write_port: cluster,
        read_latency_ns: MS,
        write_latency_ns: MS,
    })
    .unwrap();
    let node = c
        .add_storage_node(StorageNodeSpec { name: "n".into(), read_path: vec![p], write_path: vec![p], queue_depth: 1 })
        .unwrap();
    c.advance_to(END_NS - 10).unwrap();
    c.submit_io(node, IoKind::Read, 0, 1_000_000, 1).unwrap();
    c.submit_transfer(&[p], 0, 1_000_000, 2).unwrap();
    // Work that would end past the end of the clock never ends: running it is an error that says why, every time.
    for _ in 0..2 {
        let err = c.run_until_idle().unwrap_err();
        assert_eq!(err.kind, ErrorKind::State);
        assert!(err.message.contains("2^63 ns"), "{}", err.message);
    }
    assert_eq!(c.pending(), 2);
}

#[test]
fn a_transfer_ending_past_the_end_of_time_is_an_error_not_silence() {
    // 2^64 bytes at 1 B/s: 5.8e11 years. Nothing else is pending, so nothing can speed it up.
    let mut c = core();
    let p = port(&mut c, "slow", MIN_RATE_BYTES_PER_S);
    c.submit_transfer(&[p], 0, u64::MAX, 1).unwrap();
    let err = c.run_until_idle().unwrap_err();
    assert!(err.message.contains("2^63 ns") && err.message.contains("\"slow\""), "{}", err.message);
    assert!(c.advance_until(u64::MAX).is_err() && c.step().is_err() && c.advance_to(c.now_ns()).is_err());
    assert_eq!(c.pending(), 1, "the transfer is still there, not lost");
}

#[test]
fn a_transfer_projected_past_the_end_of_time_is_fine_while_a_later_change_can_speed_it_up() {
    // Strict priority on p: lane 0's transfer is held to 1 GB/s - 1 B/s by q, so lane 1 gets 1 B/s, at which
    // its 100 GB would take 10^11 s, past the end of the clock. Once lane 0 is done (1 s), lane 1 has the
    // whole port.
    let mut c = core();
    let p = qos_port(&mut c, "p", GB, VlArbitration::strict_priority(&[0], &[1]));
    let q = port(&mut c, "q", GB - 1.0);
    c.submit_transfer(&[p], 1, 100 * GB as u64, 1).unwrap();
    c.submit_transfer(&[p, q], 0, (GB - 1.0) as u64, 2).unwrap();
    c.advance_to(MS).unwrap();
    assert!(c.flow_rate(&[p], 1).unwrap() <= 1.0 + 1e-6, "{:?}", c.flow_rate(&[p], 1));
    let done = run(&mut c);
    assert_eq!(done[&2].end_ns, 1_000_000_000);
    assert!((done[&1].end_ns as f64 - 101e9).abs() < 1e3, "{}", done[&1].end_ns);
}

#[test]
fn port_rates_outside_the_supported_range_are_rejected_naming_the_argument() {
    let mut c = core();
    for (rate, peak, burst, arg) in [
        (0.5, None, 0.0, "rate_bytes_per_s"),
        (1e308, None, 0.0, "rate_bytes_per_s"),
        (MAX_RATE_BYTES_PER_S * 2.0, None, 0.0, "rate_bytes_per_s"),
        (GB, Some(f64::MAX), 1e6, "peak_bytes_per_s"),
        (GB, Some(2.0 * GB), 1e300, "burst_bytes"),
    ] {
        let spec = PortSpec {
            peak_bytes_per_s: peak.unwrap_or(rate),
            burst_bytes: burst,
            ..PortSpec::plain(format!("p{rate}"), rate)
        };
        let err = c.add_port(spec).unwrap_err();
        assert!(err.kind == ErrorKind::InvalidArgument && err.message.starts_with(arg), "{}", err.message);
    }
    assert_eq!(c.port_count(), 0);
    for rate in [MIN_RATE_BYTES_PER_S, MAX_RATE_BYTES_PER_S] {
        c.add_port(PortSpec::plain(format!("ok{rate}"), rate)).unwrap();
    }
}

#[test]
fn the_fastest_port_moves_bytes_exactly() {
    // At the top of the range, lane shares stay finite and a transfer still ends (the issue: 1e308 B/s made
    // them inf/0 and the transfer never completed).
    let mut c = core();
    let arbitration = VlArbitration::paper();
    let p = c.add_port(PortSpec { arbitration, ..PortSpec::plain("fast", MAX_RATE_BYTES_PER_S) }).unwrap();
    c.submit_transfer(&[p], 0, 1 << 40, 1).unwrap();
    c.submit_transfer(&[p], 2, 1 << 40, 2).unwrap();
    let done = run(&mut c);
    assert_eq!(done.len(), 2);
    assert!(c.lane_rates(p).unwrap().iter().all(|r| *r == 0.0));
    assert_eq!(c.port_counters(p).unwrap().completed_bytes[0], 1 << 40);
}

#[test]
fn times_past_the_end_of_the_clock_are_refused() {
    let mut c = core();
    assert!(c.add_timer(END_NS + 1, 1).is_err() && c.add_timers(&[(u64::MAX, 1)]).is_err());
    assert!(c.advance_to(END_NS + 1).is_err());
    c.add_timer(END_NS, 2).unwrap();
    assert_eq!(c.advance_until(u64::MAX).unwrap(), 1, "u64::MAX is still the advance_until that has no limit");
    assert_eq!(c.now_ns(), END_NS);
}

#[test]
fn a_delay_past_the_end_of_time_is_an_error() {
    let mut c = core();
    let p = port(&mut c, "p", GB);
    let cluster = port(&mut c, "3fs", GB);
    c.configure_storage(StorageSpec {
        read_port: cluster,
        write_port: cluster,
        read_latency_ns: END_NS / 2,
        write_latency_ns: 0,
    })
    .unwrap();
    let node = c
        .add_storage_node(StorageNodeSpec { name: "n".into(), read_path: vec![p], write_path: vec![p], queue_depth: 1 })
        .unwrap();
    c.advance_to(END_NS / 2 + 10).unwrap();
    c.submit_io(node, IoKind::Read, 0, 1, 1).unwrap();
    let err = c.advance_until(u64::MAX).unwrap_err();
    assert!(err.message.contains("latency"), "{}", err.message);
}

#[test]
fn utilisation_samples_stay_bounded_over_a_long_idle_span() {
    // Sampling every nanosecond, then 10^18 ns idle, then a transfer: once 2^64 samples were asked for.
    let mut c = Core::new(CoreConfig { sample_interval_ns: 1, ..CoreConfig::default() }).unwrap();
    let p = port(&mut c, "p", GB);
    c.add_timer(1_000_000_000_000_000_000, 1).unwrap();
    c.run_until_idle().unwrap();
    c.submit_transfer(&[p], 0, 1_000_000_000, 2).unwrap();
    c.run_until_idle().unwrap();
    let (interval, series) = c.utilisation(p, None).unwrap();
    let cap = MAX_SAMPLES_PER_SERIES as usize;
    assert!(series.len() <= cap && interval.is_power_of_two(), "{} samples of {interval} ns", series.len());
    assert!(c.now_ns().div_ceil(interval) as usize <= cap);
    // Every byte is still there: the last samples hold the transfer, one second at 1 GB/s.
    let bytes: f64 = series.iter().map(|u| u * GB * interval as f64 / 1e9).sum();
    assert!((bytes - 1e9).abs() < 1.0, "{bytes}");
    assert_eq!(c.sample_interval_ns(), interval);
}

#[test]
fn samples_merge_in_pairs_as_a_run_grows_and_keep_every_byte() {
    // One port: 65,536 samples per series. At 1 ms per sample, 65.536 s fit; 100 s need 2 ms samples.
    let mut c = Core::new(CoreConfig { sample_interval_ns: MS, ..CoreConfig::default() }).unwrap();
    let p = port(&mut c, "p", GB);
    c.submit_transfer(&[p], 0, 10 * GB as u64, 1).unwrap(); // 10 s at full rate
    c.run_until_idle().unwrap();
    let (interval, first) = c.utilisation(p, None).unwrap();
    assert_eq!((interval, first.len()), (MS, 10_000));
    assert!(first.iter().all(|u| (u - 1.0).abs() < 1e-9));
    c.add_timer(100_000 * MS, 2).unwrap();
    c.run_until_idle().unwrap();
    c.submit_transfer(&[p], 0, GB as u64, 3).unwrap(); // 1 s more, from t = 100 s
    c.run_until_idle().unwrap();
    let (interval, series) = c.utilisation(p, Some(0)).unwrap();
    assert_eq!((interval, series.len()), (2 * MS, 50_500));
    assert!(series[..5_000].iter().all(|u| (u - 1.0).abs() < 1e-9) && series[5_000..50_000].iter().all(|u| *u == 0.0));
    let bytes: f64 = series.iter().sum::<f64>() * GB * 2e-3;
    assert!((bytes - 11.0 * GB).abs() < 1.0, "{bytes}");
}

#[test]
fn recorded_spans_are_capped_and_the_rest_counted() {
    let mut c = Core::new(CoreConfig { record_spans: true, max_spans: 3, ..CoreConfig::default() }).unwrap();
    let p = port(&mut c, "p", GB);
    for tag in 0..5 {
        c.submit_transfer(&[p], 0, 1000, tag).unwrap();
    }
    assert_eq!(run(&mut c).len(), 5, "every transfer still completes");
    assert_eq!(c.stats().spans_dropped, 2);
    let path = std::env::temp_dir().join(format!("dualpath-spans-{}.json", std::process::id()));
    c.write_trace(path.to_str().unwrap(), None, &[]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let begins = v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "b").count();
    assert_eq!(begins, 3, "one async slice per kept span");
}

#[test]
fn the_sample_budget_is_shared_by_the_ports() {
    let mut c = Core::new(CoreConfig { sample_interval_ns: MS, ..CoreConfig::default() }).unwrap();
    for i in 0..64 {
        port(&mut c, &format!("p{i}"), GB);
    }
    // 2^20 samples over 64 ports: 16,384 each.
    c.add_timer(20_000 * MS, 1).unwrap();
    c.run_until_idle().unwrap();
    let (interval, series) = c.utilisation(0, None).unwrap();
    assert_eq!((interval, series.len()), (2 * MS, 10_000));
}

#[test]
fn long_transfers_end_on_the_nanosecond_they_are_due_not_before() {
    // 30,000,000,001 bytes at 3 GB/s take 10,000,000,000.33 ns: the end is rounded up, never to nearest.
    let mut c = core();
    let p = port(&mut c, "p", 3.0 * GB);
    c.submit_transfer(&[p], 0, 30_000_000_001, 1).unwrap();
    let done = run(&mut c);
    assert_eq!(done[&1].end_ns, 10_000_000_001);
}

#[test]
fn advance_until_stops_at_the_first_completion_and_skips_internal_events() {
    let mut c = core();
    let p = port(&mut c, "p", GB);
    c.submit_transfer(&[p], 0, 1_000_000, 1).unwrap(); // alone: 1 ms; shares the port from 0.5 ms
    c.add_timers(&[(500_000, 9)]).unwrap();
    c.submit_transfer(&[p], 0, 10_000_000, 2).unwrap();
    // Both share 1 GB/s: the timer at 0.5 ms completes first.
    assert_eq!(c.advance_until(u64::MAX).unwrap(), 1);
    assert_eq!(c.now_ns(), 500_000);
    assert_eq!(c.take_completions()[0].tag, 9);
    // Transfer 1 has 0.75 MB left at 0.5 GB/s: done at 2 ms; a limit before that moves the clock to it.
    assert_eq!(c.advance_until(1_000_000).unwrap(), 0);
    assert_eq!(c.now_ns(), 1_000_000);
    assert_eq!(c.advance_until(u64::MAX).unwrap(), 1);
    assert_eq!(c.now_ns(), 2 * MS);
    assert_eq!(c.take_completions()[0].tag, 1);
    assert!(c.advance_until(0).is_err(), "time never goes back");
}

#[test]
fn unreported_work_moves_its_bytes_but_never_completes_for_the_caller() {
    use dualpath_emu_core::UNREPORTED_TAG;
    let mut c = core();
    let p = port(&mut c, "p", GB);
    // Two transfers share the port: the unreported one (1 MB) ends at 2 ms, the reported one (3 MB) at 4 ms.
    c.submit_transfer(&[p], 0, 1_000_000, UNREPORTED_TAG).unwrap();
    c.submit_transfer(&[p], 0, 3_000_000, 7).unwrap();
    assert_eq!(c.advance_until(u64::MAX).unwrap(), 1, "advance_until does not stop at 2 ms");
    assert_eq!(c.now_ns(), 4 * MS);
    let done = c.take_completions();
    assert_eq!((done.len(), done[0].tag), (1, 7));
    assert_eq!(c.port_counters(p).unwrap().completed_bytes[0], 4_000_000, "both transfers' bytes are counted");
    assert_eq!(c.pending(), 0);
}
