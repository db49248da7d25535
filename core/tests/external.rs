//! Work handed out (`external.rs`): a transfer that leaves its domain and a marked storage node's I/O are
//! announced instead of modelled, the rules around them (storage queue and latency, a latency fault's wait,
//! a forward pass's dependencies) still hold, and each ends when `complete_externals` says so.

use dualpath_emu_core::*;

const GB: f64 = 1e9;
const MS: u64 = 1_000_000;

struct Cluster {
    core: Core,
    a: PortId,
    b: PortId,
    a_rx: PortId,
    node: NodeId,
}

/// Two domains: ports `a` and `a_rx` in 0, `b` in 1; a storage node whose path is in domain 0.
fn cluster() -> Cluster {
    let mut c = Core::new(CoreConfig::default()).unwrap();
    let store = c.add_port(PortSpec::plain("3fs", 100.0 * GB)).unwrap();
    let a = c.add_port(PortSpec::plain("a.tx", GB)).unwrap();
    let a_rx = c.add_port(PortSpec::plain("a.rx", GB)).unwrap();
    let b = c.add_port(PortSpec::plain("b.rx", GB)).unwrap();
    c.configure_storage(StorageSpec { read_port: store, write_port: store, read_latency_ns: MS, write_latency_ns: MS })
        .unwrap();
    let node = c
        .add_storage_node(StorageNodeSpec {
            name: "n0".into(),
            read_path: vec![a_rx],
            write_path: vec![a],
            queue_depth: 1,
        })
        .unwrap();
    c.set_external(ExternalRule { port_domains: vec![-1, 0, 0, 1], storage_nodes: vec![true] }).unwrap();
    Cluster { core: c, a, b, a_rx, node }
}

#[test]
fn a_transfer_between_domains_is_handed_out_and_completes_when_told() {
    let Cluster { mut core, a, b, a_rx, .. } = cluster();
    core.submit_transfers(&[(vec![a, b], 2, 1000, 7), (vec![a, a_rx], 2, 1_000_000, 8)]).unwrap();
    let out = core.take_external();
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].kind, out[0].path.clone(), out[0].size_bytes), (ExternalKind::Transfer, vec![a, b], 1000));
    let announced = core.take_completions();
    assert_eq!((announced[0].kind, announced[0].tag), (CompletionKind::External, out[0].id));
    core.advance_to(5 * MS).unwrap();
    let done = core.take_completions();
    assert_eq!(done.iter().map(|d| d.tag).collect::<Vec<_>>(), vec![8]); // the modelled one, 1 ms
    assert_eq!(core.pending(), 1);
    core.complete_externals(&[out[0].id]).unwrap();
    let done = core.take_completions();
    assert_eq!((done[0].kind, done[0].tag, done[0].start_ns, done[0].end_ns), (CompletionKind::Transfer, 7, 0, 5 * MS));
    assert_eq!(core.pending(), 0);
    assert!(core.complete_externals(&[out[0].id]).is_err()); // once only
    assert_eq!(core.port_counters(b).unwrap().completed_bytes[2], 0); // the plane moved it, not the model
}

#[test]
fn a_latency_fault_holds_external_work_back_first() {
    let Cluster { mut core, a, b, .. } = cluster();
    core.set_port_latency(b, 3 * MS).unwrap();
    core.submit_transfers(&[(vec![a, b], 2, 1000, 1)]).unwrap();
    assert!(core.take_external().is_empty());
    core.advance_until(u64::MAX).unwrap();
    assert_eq!(core.now_ns(), 3 * MS);
    let out = core.take_external();
    assert_eq!(out.len(), 1);
    core.complete_externals(&[out[0].id]).unwrap();
    assert_eq!(core.take_completions().last().unwrap().start_ns, 0);
}

#[test]
fn storage_io_keeps_its_queue_and_latency_and_carries_its_extents() {
    let Cluster { mut core, node, .. } = cluster();
    core.submit_ios(vec![
        (node, IoKind::Read, 2, 4096, 1, vec![(5, 0, 2)]),
        (node, IoKind::Write, 2, 4096, 2, vec![(6, 3, 1)]),
    ])
    .unwrap();
    core.advance_until(u64::MAX).unwrap(); // the first after its latency; the second waits (depth 1)
    assert_eq!(core.now_ns(), MS);
    let out = core.take_external();
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].kind, out[0].storage_node, out[0].extents.clone()),
        (ExternalKind::Io(IoKind::Read), Some(node), vec![(5, 0, 2)])
    );
    core.take_completions();
    core.complete_externals(&[out[0].id]).unwrap();
    assert_eq!(core.take_completions()[0].kind, CompletionKind::Read);
    core.advance_until(u64::MAX).unwrap();
    assert_eq!(core.now_ns(), 2 * MS);
    let out = core.take_external();
    assert_eq!(out[0].extents, vec![(6, 3, 1)]);
    core.complete_externals(&[out[0].id]).unwrap();
    assert_eq!(core.storage_queue(node).unwrap(), QueueState::default());
}

#[test]
fn a_forward_pass_waits_for_its_external_loads() {
    let Cluster { mut core, a, b, .. } = cluster();
    let load = LayerTransfer { path: vec![a, b], lane: 2, size_bytes: 100 };
    let spec = ForwardSpec {
        n_layers: 2,
        ranks: vec![ForwardRank { load: Some(load), attn_ns: MS, store: None }],
        ffn_ns: MS,
        collectives: vec![],
        load_window: 0,
    };
    core.submit_forwards(vec![(spec, 9)]).unwrap();
    // The plane takes 1 ms for each piece handed out.
    let mut due: Vec<(u64, u64)> = Vec::new();
    let mut ended = None;
    while ended.is_none() {
        for d in core.take_completions() {
            match d.kind {
                CompletionKind::External => due.push((d.end_ns + MS, d.tag)),
                CompletionKind::Forward => ended = Some(d.end_ns),
                _ => {}
            }
        }
        due.sort_unstable();
        let next = core.next_event_ns();
        match due.first().copied() {
            Some((at, id)) if next.is_none_or(|n| at <= n) => {
                core.advance_to(at).unwrap();
                core.complete_externals(&[id]).unwrap();
                due.remove(0);
            }
            _ if next.is_some() => {
                core.step().unwrap();
            }
            _ if ended.is_none() => panic!("stuck at {}", core.now_ns()),
            _ => {}
        }
    }
    // Load 0 ends at 1 ms, load 1 at 2 ms; attention 1→2, shared 2→3; attention 3→4, shared 4→5.
    assert_eq!(ended, Some(5 * MS));
}

#[test]
fn the_rule_is_checked() {
    let Cluster { mut core, .. } = cluster();
    assert!(core.set_external(ExternalRule { port_domains: vec![0; 99], storage_nodes: vec![] }).is_err());
    assert!(core.set_external(ExternalRule { port_domains: vec![], storage_nodes: vec![true; 2] }).is_err());
    assert!(core.complete_externals(&[3]).is_err());
}
