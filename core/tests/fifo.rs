//! Latency-sensitive transfers (`Core::submit_latency_sensitive`): the FIFO wait behind the bulk data
//! queued on their lane, `max_p Q_p / r_p`, then an ordinary flow; hand-solvable cases.

use std::collections::BTreeMap;

use dualpath_emu_core::*;

const GB: f64 = 1e9;
const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const MB: u64 = 1_000_000;

fn core() -> Core {
    Core::new(CoreConfig::default()).unwrap()
}

fn port(c: &mut Core, name: &str, rate: f64) -> PortId {
    c.add_port(PortSpec::plain(name, rate)).unwrap()
}

fn run(c: &mut Core) -> BTreeMap<u64, Completion> {
    c.run_until_idle().unwrap();
    c.take_completions().into_iter().map(|x| (x.tag, x)).collect()
}

/// One 1 GB bulk flow on lane 0 of a 50 GB/s port, 1 ms old (950 MB left) when the message comes.
fn one_bulk_flow(lane: Lane) -> (Core, PortId) {
    let mut c = core();
    let p = port(&mut c, "cnic", 50.0 * GB);
    c.submit_transfer(&[p], lane, 1_000_000_000, 1).unwrap();
    c.advance_to(MS).unwrap();
    (c, p)
}

#[test]
fn the_wait_is_the_capped_backlog_over_the_lane_rate() {
    let (mut c, p) = one_bulk_flow(0);
    // Q = min(950 MB, 1 MB) = 1 MB at r = 50 GB/s: 20 µs; then 1 MB at half the port (25 GB/s): 40 µs.
    c.submit_latency_sensitive(&[(vec![p], 0, MB, 7)], MB).unwrap();
    let done = run(&mut c);
    assert_eq!(done[&7].start_ns, MS, "latency counts from the submission");
    assert_eq!(done[&7].end_ns, MS + 20 * US + 40 * US);
    assert_eq!(done[&7].kind, CompletionKind::Transfer);
    assert_eq!(done[&7].size_bytes, MB);
    // The bulk flow lost 20 µs of half the port: 1 GB at 50 GB/s plus 1 MB at 50 GB/s.
    assert_eq!(done[&1].end_ns, 20 * MS + 20 * US);
}

#[test]
fn outstanding_bytes_zero_is_an_ordinary_transfer() {
    let (mut c, p) = one_bulk_flow(0);
    c.submit_latency_sensitive(&[(vec![p], 0, MB, 7)], 0).unwrap();
    let done = run(&mut c);
    assert_eq!((done[&7].start_ns, done[&7].end_ns), (MS, MS + 40 * US));
}

#[test]
fn another_lane_adds_no_wait() {
    let (mut c, p) = one_bulk_flow(2);
    c.submit_latency_sensitive(&[(vec![p], 0, MB, 7)], MB).unwrap();
    let (mut ordinary, q) = one_bulk_flow(2);
    ordinary.submit_transfer(&[q], 0, MB, 7).unwrap();
    let (done, expected) = (run(&mut c), run(&mut ordinary));
    // Lanes 0 and 2 share the port equally (no QoS): 1 MB at 25 GB/s, no wait.
    assert_eq!(done[&7].end_ns, MS + 40 * US);
    assert_eq!(done, expected);
}

#[test]
fn an_empty_lane_adds_no_wait() {
    let mut c = core();
    let p = port(&mut c, "cnic", 50.0 * GB);
    c.submit_latency_sensitive(&[(vec![p], 0, MB, 7)], 16 * MB).unwrap();
    assert_eq!(c.flow_rate(&[p], 0), Some(50.0 * GB), "it moves at once");
    assert_eq!(run(&mut c)[&7].end_ns, 20 * US);
}

#[test]
fn a_flow_near_its_end_queues_only_its_remaining_bytes() {
    let mut c = core();
    let p = port(&mut c, "cnic", 50.0 * GB);
    c.submit_transfer(&[p], 0, 10 * MB, 1).unwrap();
    c.advance_to(196 * US).unwrap(); // 9.8 MB moved, 200 kB left
    c.submit_latency_sensitive(&[(vec![p], 0, MB, 7)], 16 * MB).unwrap();
    let done = run(&mut c);
    // Q = 200 kB at 50 GB/s: 4 µs, by which time the bulk flow has ended; then 1 MB alone: 20 µs.
    assert_eq!(done[&1].end_ns, 200 * US);
    assert_eq!(done[&7].end_ns, 196 * US + 4 * US + 20 * US);
}

#[test]
fn the_wait_is_the_longest_over_the_path_and_counts_every_flow_of_the_lane() {
    let mut c = core();
    let a = port(&mut c, "a", 50.0 * GB);
    let b = port(&mut c, "b", 20.0 * GB);
    // Three flows on a (two of them through b), one more on b only: b's three get 6.7 GB/s each, the
    // flow on a alone the rest of a, so both ports serve lane 0 at capacity. Q = 3 MB at each: 60 µs at
    // a, 150 µs at b, and the message waits 150 µs.
    c.submit_transfer(&[a], 0, 1_000_000_000, 1).unwrap();
    c.submit_transfer(&[a, b], 0, 1_000_000_000, 2).unwrap();
    c.submit_transfer(&[a, b], 0, 1_000_000_000, 3).unwrap();
    c.submit_transfer(&[b], 0, 1_000_000_000, 4).unwrap();
    let rate_a: f64 = c.lane_rates(a).unwrap()[0];
    let rate_b: f64 = c.lane_rates(b).unwrap()[0];
    assert!((rate_a - 50.0 * GB).abs() < 1.0 && (rate_b - 20.0 * GB).abs() < 1.0, "{rate_a} {rate_b}");
    let cap = MB;
    let wait_a = 3.0 * cap as f64 / rate_a;
    let wait_b = 3.0 * cap as f64 / rate_b;
    assert!(wait_b > wait_a);
    c.submit_latency_sensitive(&[(vec![a, b], 0, 1000, 7)], cap).unwrap();
    c.advance_to((wait_b * 1e9) as u64 - 1).unwrap();
    assert_eq!(c.in_flight().iter().map(|g| g.2).sum::<usize>(), 4, "still waiting");
    c.advance_to((wait_b * 1e9).ceil() as u64).unwrap();
    assert_eq!(c.in_flight().iter().map(|g| g.2).sum::<usize>(), 5, "moving");
    let done = run(&mut c);
    assert_eq!(done[&7].start_ns, 0);
}

#[test]
fn a_starved_lane_is_served_at_the_port_capacity() {
    let mut c = core();
    let arbitration = VlArbitration::strict_priority(&[0], &[2]);
    let p = c.add_port(PortSpec { arbitration, ..PortSpec::plain("cnic", 50.0 * GB) }).unwrap();
    c.submit_transfer(&[p], 0, 1_000_000_000, 1).unwrap(); // takes the whole port
    c.submit_transfer(&[p], 2, 1_000_000_000, 2).unwrap(); // starved
    assert_eq!(c.lane_rates(p).unwrap()[2], 0.0);
    c.submit_latency_sensitive(&[(vec![p], 2, 4096, 7)], MB).unwrap();
    // Q = 1 MB over the port's 50 GB/s: 20 µs; then it starves behind lane 0 with the bulk flow.
    c.advance_to(20 * US - 1).unwrap();
    assert_eq!(c.in_flight().iter().map(|g| g.2).sum::<usize>(), 2);
    c.advance_to(20 * US).unwrap();
    assert_eq!(c.in_flight().iter().map(|g| g.2).sum::<usize>(), 3);
}

#[test]
fn a_batch_does_not_queue_behind_itself() {
    let mut c = core();
    let p = port(&mut c, "cnic", 50.0 * GB);
    let batch: Vec<_> = (0..4).map(|tag| (vec![p], 0, MB, tag)).collect();
    c.submit_latency_sensitive(&batch, 16 * MB).unwrap();
    let done = run(&mut c);
    assert!(done.values().all(|x| (x.start_ns, x.end_ns) == (0, 80 * US)), "{done:?}");
}

#[test]
fn waiting_transfers_are_pending_and_zero_bytes_complete_at_once() {
    let (mut c, p) = one_bulk_flow(0);
    c.submit_latency_sensitive(&[(vec![p], 0, MB, 7), (vec![p], 0, 0, 8)], MB).unwrap();
    assert_eq!(c.pending(), 3);
    assert_eq!(c.advance_until(u64::MAX).unwrap(), 1);
    let first = c.take_completions();
    assert_eq!((first[0].tag, first[0].end_ns), (8, MS));
    let done = run(&mut c);
    assert_eq!(done[&7].end_ns, MS + 60 * US);
    assert_eq!(c.pending(), 0);
}

#[test]
fn a_bad_element_leaves_the_core_unchanged() {
    let (mut c, p) = one_bulk_flow(0);
    let err = c.submit_latency_sensitive(&[(vec![p], 0, MB, 7), (vec![99], 0, MB, 8)], MB).unwrap_err();
    assert!(err.message.starts_with("transfers[1].path"), "{}", err.message);
    assert_eq!(c.pending(), 1);
}

#[test]
fn the_same_inputs_give_the_same_completions() {
    let once = || {
        let mut c = core();
        let ports: Vec<PortId> = (0..4).map(|i| port(&mut c, &format!("p{i}"), (10 + i) as f64 * GB)).collect();
        for (i, w) in ports.windows(2).enumerate() {
            c.submit_transfer(w, 0, 50 * MB + i as u64, 100 + i as u64).unwrap();
            c.submit_transfer(&w[..1], 0, 30 * MB, 200 + i as u64).unwrap();
        }
        c.advance_to(700 * US).unwrap();
        let batch: Vec<_> = (0..3).map(|i| (ports[i..i + 2].to_vec(), 0, 100_000 * (i as u64 + 1), i as u64)).collect();
        c.submit_latency_sensitive(&batch, 640 * 1024).unwrap();
        c.run_until_idle().unwrap();
        (c.take_completions(), c.stats())
    };
    assert_eq!(once(), once());
}
