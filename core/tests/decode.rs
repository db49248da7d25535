//! The decode stepping (`decode.rs`): the step price against `Roofline.ep_decode_step_s` to the bit, and a
//! node's groups stepping, joining at step boundaries, writing back and reporting through the core.
//! (The whole cluster, event for event against the Python reference: `tests/cluster/test_cluster.py`.)

use dualpath_emu_core::*;

fn ds660b() -> DecodePricing {
    // `derived(ClusterConfig()).decode.decode_pricing()` (DS 660B on H800, EP 32).
    DecodePricing {
        layers: 61,
        moe_layers: 58,
        overhead_s_per_layer: 0.0,
        sparse_top_k: Some(2048),
        attention_flops_per_key: 278_528,
        indexer_flops_per_key: 16_384,
        kv_bytes_per_key: 656,
        indexer_bytes_per_key: 132,
        attention_flops_per_s: 593_640_000_000_000.0,
        attention_bytes_per_s: 2_680_000_000_000.0,
        gemm_flops_per_token: 74_952_212_480.0,
        gemm_peak_flops_per_s: 1_978_900_000_000_000.0,
        gemm_efficiency: 0.6,
        weight_bytes: 38_402_785_280.0,
        hbm_bytes_per_s: 3_350_000_000_000.0,
        memory_efficiency: 0.8,
        a2a: true,
        a2a_fixed_s: 8.7e-05,
        a2a_bytes_per_token_layer: 173_824,
        a2a_remote_bytes_per_token: 130_368.0,
        a2a_local_peers: 7,
        ep_degree: 32,
        cnic_bytes_per_s: 50e9,
        nvlink_bytes_per_s: 160e9,
    }
}

#[test]
fn a_step_is_priced_as_the_python_roofline_prices_it_to_the_bit() {
    // Values printed by `Roofline.ep_decode_step_s` for the same batches.
    let p = ds660b();
    assert_eq!(p.step_s([(1, 5000)].into_iter()), 0.019593656691761083);
    assert_eq!(p.step_s([(3, 120_000), (1, 800)].into_iter()), 0.020281353619104475);
    assert_eq!(p.step_s([(0, 0), (40, 2_000_000)].into_iter()), 0.03265660355820896);
    assert_eq!(p.step_s([(0, 0)].into_iter()), 0.0);
    // Qwen2.5-32B (dense, GQA): no all-to-all, every key attended.
    let qwen = DecodePricing {
        layers: 64,
        moe_layers: 0,
        sparse_top_k: None,
        attention_flops_per_key: 20_480,
        indexer_flops_per_key: 0,
        kv_bytes_per_key: 4096,
        indexer_bytes_per_key: 0,
        gemm_flops_per_token: 63_969_296_384.0,
        gemm_peak_flops_per_s: 989_400_000_000_000.0,
        weight_bytes: 65_526_431_744.0,
        a2a: false,
        a2a_bytes_per_token_layer: 0,
        a2a_remote_bytes_per_token: 0.0,
        ..ds660b()
    };
    assert_eq!(qwen.step_s([(7, 70_000)].into_iter()), 0.031297205874626866);
}

/// A node of two GPUs (stepping together or each alone) priced by a model whose only cost is a fixed overhead
/// of one layer: every step takes 1 ms.
fn node(c: &mut Core, together: bool) -> u32 {
    node_writing(c, together, true)
}

fn node_writing(c: &mut Core, together: bool, write_through: bool) -> u32 {
    let cluster = c.add_port(PortSpec::plain("storage", 1e9)).unwrap();
    c.configure_storage(StorageSpec {
        read_port: cluster,
        write_port: cluster,
        read_latency_ns: 0,
        write_latency_ns: 0,
    })
    .unwrap();
    let snic = c.add_port(PortSpec::plain("snic", 1e9)).unwrap();
    let store = c
        .add_storage_node(StorageNodeSpec {
            name: "n0".into(),
            read_path: vec![snic],
            write_path: vec![snic],
            queue_depth: 4,
        })
        .unwrap();
    let d2h: Vec<Vec<PortId>> =
        (0..2).map(|g| vec![c.add_port(PortSpec::plain(format!("d2h{g}"), 1e12)).unwrap()]).collect();
    let a2a: Vec<Vec<PortId>> =
        (0..2).map(|g| vec![c.add_port(PortSpec::plain(format!("a2a{g}"), 1e12)).unwrap()]).collect();
    let pricing = DecodePricing {
        layers: 1,
        moe_layers: 0,
        overhead_s_per_layer: 1e-3,
        attention_flops_per_key: 0,
        indexer_flops_per_key: 0,
        kv_bytes_per_key: 0,
        indexer_bytes_per_key: 0,
        gemm_flops_per_token: 0.0,
        weight_bytes: 0.0,
        a2a: false,
        ..ds660b()
    };
    c.add_decode_node(DecodeNodeSpec {
        gpus: 2,
        together,
        pricing,
        kv_bytes_per_token: 10,
        a2a_bytes_per_token: 100.0,
        a2a_paths: a2a,
        a2a_lane: 0,
        d2h_paths: d2h,
        storage_node: Some(store),
        kv_lane: 1,
        first_unit: 8,
        write_through,
        report_tag: 77,
    })
    .unwrap()
}

fn join(gpu: usize, rid: u64, prompt: i64, gen: i64, stored_blocks: i64) -> DecodeJoin {
    DecodeJoin { gpu, rid, prompt, gen, produced: 1, stored_blocks, context: rid }
}

const MS: u64 = 1_000_000;

#[test]
fn requests_join_at_step_boundaries_and_end_in_join_order_with_their_blocks_written_back() {
    let mut c = Core::new(CoreConfig::default()).unwrap();
    let n = node(&mut c, true);
    // Request 1: 126 prompt tokens (block 0 stored), 3 tokens in all: it ends after 2 steps (2 ms).
    c.submit_decode_joins(&[(n, join(0, 1, 126, 3, 1))]).unwrap();
    c.advance_until(MS / 2).unwrap();
    // Request 2 comes mid-step, on the other GPU: it joins at 1 ms and needs 4 steps.
    c.submit_decode_joins(&[(n, join(1, 2, 200, 5, 3))]).unwrap();
    let done = c.advance_until(u64::MAX).unwrap();
    let first: Vec<_> = c.take_completions();
    assert!(done > 0);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!((first[0].kind, first[0].tag, first[0].end_ns), (CompletionKind::Decoded, 77, 2 * MS));
    let (ended, spans) = c.take_decoded(n).unwrap();
    assert_eq!(ended, vec![(1, MS as i64)]); // its second token came with the first step
    assert_eq!(spans, vec![(8, 0, 2 * MS, 1, MS)]); // GPU 0 (unit 8) stepped one request until it ended
    c.advance_until(u64::MAX).unwrap();
    let (ended, spans) = c.take_decoded(n).unwrap();
    assert_eq!(ended, vec![(2, 2 * MS as i64)]); // joined at 1 ms, second token at 2 ms, done at 5 ms
    assert_eq!(c.now_ns(), 5 * MS);
    assert_eq!(spans, vec![(9, MS, 5 * MS, 1, MS)]);
    // Request 1 reached 128 tokens: block 1 written back (640 B); request 2 reached 204: nothing new
    // beyond its 3 stored blocks (192 tokens).
    let bytes = c.decode_bytes(n).unwrap();
    assert_eq!(bytes.d2h[0], (640, 1));
    assert_eq!(bytes.written, (640, 1));
    // The all-to-all: 100 B per token, charged when a GPU's batch changed (a request's first step, its end).
    assert_eq!(bytes.a2a[0], (200, 2)); // the 2 steps of request 1
    assert_eq!(bytes.a2a[1], (400, 2)); // the 4 steps of request 2
    c.run_until_idle().unwrap();
    assert_eq!(c.pending(), 0);
}

#[test]
fn without_write_through_completed_blocks_stop_in_dram() {
    // A DRAM pool written back on eviction: the HBM → DRAM copy as before, nothing written to storage.
    let mut c = Core::new(CoreConfig::default()).unwrap();
    let n = node_writing(&mut c, true, false);
    c.submit_decode_joins(&[(n, join(0, 1, 126, 3, 1))]).unwrap();
    c.run_until_idle().unwrap();
    let bytes = c.decode_bytes(n).unwrap();
    assert_eq!(bytes.d2h[0], (640, 1));
    assert_eq!(bytes.written, (0, 0));
    assert_eq!(c.pending(), 0);
}

#[test]
fn gpus_that_step_alone_keep_their_own_step_clocks() {
    let mut c = Core::new(CoreConfig::default()).unwrap();
    let n = node(&mut c, false);
    c.submit_decode_joins(&[(n, join(0, 1, 100, 3, 1)), (n, join(1, 2, 100, 2, 1))]).unwrap();
    c.run_until_idle().unwrap();
    let (ended, _) = c.take_decoded(n).unwrap();
    assert_eq!(ended, vec![(2, MS as i64), (1, MS as i64)]); // 1 step, then 2 steps
}

#[test]
fn a_bad_join_is_refused_and_changes_nothing() {
    let mut c = Core::new(CoreConfig::default()).unwrap();
    let n = node(&mut c, true);
    let bad = [
        (n, join(0, 1, 100, 1, 1)),
        (n, join(5, 2, 100, 3, 1)),
        (n + 1, join(0, 3, 100, 3, 1)),
        (n, join(0, 4, 100, 3, 9)),
    ];
    for j in bad {
        assert!(c.submit_decode_joins(&[(n, join(0, 9, 100, 3, 1)), j]).is_err(), "{j:?}");
    }
    assert_eq!(c.pending(), 0);
    assert_eq!(c.next_event_ns(), None);
}

#[test]
fn a_reset_drops_every_request_closes_the_busy_spans_calls_off_the_wake_ups_and_keeps_the_bytes() {
    let mut c = Core::new(CoreConfig::default()).unwrap();
    let n = node(&mut c, true);
    // Request 1 (GPU 0) needs 9 steps; request 2 (GPU 1) joins at the first step's end (1 ms) and ends at 3 ms.
    c.submit_decode_joins(&[(n, join(0, 1, 126, 10, 1)), (n, join(1, 2, 100, 3, 1))]).unwrap();
    c.advance_until(u64::MAX).unwrap();
    let reported = c.take_completions();
    assert_eq!(reported.len(), 1);
    assert_eq!((reported[0].kind, reported[0].end_ns), (CompletionKind::Decoded, 3 * MS));
    // Request 2's end is not taken: the crash comes first, mid-step, while request 1 decodes.
    c.advance_until(5 * MS + MS / 2).unwrap();
    let moved = c.decode_bytes(n).unwrap().clone();
    assert_eq!(moved.d2h[0], (640, 1)); // request 1's block 1, at its first step
    assert_eq!(moved.a2a, vec![(100, 1), (200, 1)]);
    assert_eq!(c.decode_reset(n).unwrap(), 1);
    let now = 5 * MS + MS / 2;
    let reported = c.take_completions();
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!((reported[0].kind, reported[0].tag, reported[0].end_ns), (CompletionKind::Decoded, 77, now));
    let (ended, spans) = c.take_decoded(n).unwrap();
    // Request 2 ended, but its engine never heard of it. GPU 1's span closed at 3 ms (not taken yet), GPU 0's
    // closed by the reset.
    assert_eq!(ended, vec![]);
    assert_eq!(spans, vec![(9, MS, 3 * MS, 1, MS), (8, 0, now, 1, MS)]);
    assert_eq!(c.decode_bytes(n).unwrap(), &moved); // what was moved stays moved; GPU 0's 3 uncharged a2a tokens go
    assert_eq!(c.pending(), 0);
    // Request 1's wake-up (at 9 ms) is still queued, but stale. A new request joins as on a new node: 9 steps
    // from now, through the stale wake-up, which neither ends nor re-times it.
    assert_eq!(c.next_event_ns(), Some(9 * MS));
    c.submit_decode_joins(&[(n, join(0, 3, 126, 10, 1))]).unwrap();
    c.advance_until(u64::MAX).unwrap();
    let reported = c.take_completions();
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!(reported[0].end_ns, now + 9 * MS);
    let (ended, spans) = c.take_decoded(n).unwrap();
    assert_eq!(ended, vec![(3, (now + MS) as i64)]);
    assert_eq!(spans, vec![(8, now, now + 9 * MS, 1, MS)]);
    let bytes = c.decode_bytes(n).unwrap();
    assert_eq!(bytes.d2h[0], (1280, 2)); // its block 1 too
    assert_eq!(bytes.written, (1280, 2));
    assert_eq!(bytes.a2a, vec![(1000, 2), (200, 1)]); // its 9 steps
    c.run_until_idle().unwrap();
    assert_eq!(c.pending(), 0);
    assert_eq!(c.take_completions(), vec![]);
}

#[test]
fn a_reset_of_an_idle_node_drops_nothing_and_reports_nothing_and_an_unknown_node_is_an_error() {
    let mut c = Core::new(CoreConfig::default()).unwrap();
    let n = node(&mut c, false);
    assert_eq!(c.decode_reset(n).unwrap(), 0);
    assert_eq!(c.take_completions(), vec![]);
    // A stale wake-up with nothing joined after the reset does nothing.
    c.submit_decode_joins(&[(n, join(1, 1, 100, 5, 1))]).unwrap();
    c.advance_until(MS / 2).unwrap();
    assert_eq!(c.decode_reset(n).unwrap(), 1);
    let (ended, spans) = c.take_decoded(n).unwrap();
    assert_eq!((ended, spans), (vec![], vec![(9, 0, MS / 2, 1, MS)]));
    c.take_completions();
    c.run_until_idle().unwrap();
    assert_eq!(c.now_ns(), 4 * MS); // the stale wake-up's time
    assert_eq!(c.take_completions(), vec![]);
    assert_eq!(c.take_decoded(n).unwrap(), (vec![], vec![]));
    let error = c.decode_reset(n + 1).unwrap_err();
    assert!(error.to_string().contains("unknown decode node"), "{error}");
}
