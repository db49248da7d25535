//! `make bench`: transfer events per second for a paper-scale mix.
//!
//! 6 nodes, each with 8 GPUs whose compute NICs (400 Gb/s, transmit and receive sides, the paper's VL
//! arbitration) share host DRAM (500 GB/s), one storage NIC (400 Gb/s each way), and a storage cluster
//! behind them. A closed loop keeps ~2,000 transfers in flight: storage reads, DRAM→HBM loopback copies and
//! PE→DE KV transfers on the KV lane, and collective bursts on a high-priority lane. Each completion
//! submits a new transfer, until 1,000,000 have completed. Then forward passes: one prefill engine group
//! (8 DP-attention ranks of one node) runs 61-layer forwards back to back, each one core call expanded
//! into per-layer loads, attention, MoE all-to-all and KV stores, while the mix above keeps moving.
//! Prints `BENCH` lines.

use std::time::Instant;

use dualpath_emu_core::*;

const NODES: usize = 6;
const GPUS: usize = 8;
const IN_FLIGHT: usize = 2_000;
const GBPS_400: f64 = 50e9;

/// xorshift64*: a fixed, dependency-free generator so the mix is identical on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct Cluster {
    storage: PortId,
    snic_rx: Vec<PortId>,
    dram: Vec<PortId>,
    cnic_tx: Vec<Vec<PortId>>,
    cnic_rx: Vec<Vec<PortId>>,
}

fn build(core: &mut Core) -> Cluster {
    let nic = |name: String| PortSpec { arbitration: VlArbitration::paper(), ..PortSpec::plain(name, GBPS_400) };
    let storage = core.add_port(PortSpec::plain("3fs", NODES as f64 * 2.0 * GBPS_400)).unwrap();
    let mut c = Cluster { storage, snic_rx: vec![], dram: vec![], cnic_tx: vec![], cnic_rx: vec![] };
    for n in 0..NODES {
        c.snic_rx.push(core.add_port(PortSpec::plain(format!("n{n}.snic.rx"), GBPS_400)).unwrap());
        c.dram.push(core.add_port(PortSpec::plain(format!("n{n}.dram"), 500e9)).unwrap());
        c.cnic_tx.push((0..GPUS).map(|g| core.add_port(nic(format!("n{n}.cnic{g}.tx"))).unwrap()).collect());
        c.cnic_rx.push((0..GPUS).map(|g| core.add_port(nic(format!("n{n}.cnic{g}.rx"))).unwrap()).collect());
    }
    c
}

/// One transfer of the mix: (path, lane, size).
fn pick(c: &Cluster, rng: &mut Rng) -> (Vec<PortId>, Lane, u64) {
    let n = rng.below(NODES);
    let g = rng.below(GPUS);
    let kv_block = 64 * 656 * (1 + rng.below(61) as u64); // 64-token layer blocks of DS V3.2, 1–61 layers
    match rng.below(10) {
        0..=2 => (vec![c.storage, c.snic_rx[n], c.dram[n]], 2, kv_block * 8),
        3..=4 => (vec![c.dram[n], c.cnic_tx[n][g], c.cnic_rx[n][g]], 2, kv_block),
        5..=7 => {
            let m = (n + 1 + rng.below(NODES - 1)) % NODES;
            (vec![c.cnic_tx[n][g], c.cnic_rx[m][rng.below(GPUS)], c.dram[m]], 2, kv_block)
        }
        _ => {
            let m = (n + 1 + rng.below(NODES - 1)) % NODES;
            (vec![c.cnic_tx[n][g], c.cnic_rx[m][g]], 0, 7168 * 128 * (1 + rng.below(4) as u64))
        }
    }
}

fn main() {
    // BENCH_COMPLETIONS shortens the run for profiling; the reported figure uses the default.
    let completions: u64 = std::env::var("BENCH_COMPLETIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let mut core = Core::new(CoreConfig::default()).unwrap();
    let cluster = build(&mut core);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut tag = 0u64;
    for _ in 0..IN_FLIGHT {
        let (path, lane, size) = pick(&cluster, &mut rng);
        core.submit_transfer(&path, lane, size, tag).unwrap();
        tag += 1;
    }
    let start = Instant::now();
    let mut completed = 0u64;
    let mut batches = 0u64;
    while completed < completions {
        if core.step().unwrap().is_none() {
            break;
        }
        batches += 1;
        for _ in core.take_completions() {
            completed += 1;
            let (path, lane, size) = pick(&cluster, &mut rng);
            core.submit_transfer(&path, lane, size, tag).unwrap();
            tag += 1;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let stats = core.stats();
    let events = stats.transfer_events - IN_FLIGHT as u64; // arrivals and completions inside the timed loop
    println!(
        "core mix: {} ports, {IN_FLIGHT} transfers in flight, {completed} completed, {batches} event batches",
        core.port_count()
    );
    println!(
        "          {:.3} s emulated in {wall:.2} s wall; {} port recomputations ({} answered from the demand cache); non-converged {}",
        core.now_ns() as f64 / 1e9,
        stats.net.port_recomputes,
        stats.net.skipped_recomputes,
        stats.net.non_converged
    );
    println!("BENCH core_transfer_events_per_s {:.0} events/s", events as f64 / wall);
    println!("BENCH core_completions_per_s {:.0} completions/s", completed as f64 / wall);
    println!(
        "BENCH core_port_recomputes_per_event {:.2} recomputes/event",
        stats.net.port_recomputes as f64 / events as f64
    );
    bench_forwards(&mut core, &cluster);
}

/// Forward passes of one PE group (node 0): per layer and rank a 100-block hit-KV load DRAM → CNIC →
/// HBM and a 10-block store to a DE node, 0.3 ms of attention; 0.2 ms of MoE compute with an all-to-all
/// among the 8 GPUs on the high lane. The transfers still in flight from the mix compete with them.
fn bench_forwards(core: &mut Core, c: &Cluster) {
    let forwards: u64 = std::env::var("BENCH_FORWARDS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let layer_block = 64 * 656;
    let ranks: Vec<ForwardRank> = (0..GPUS)
        .map(|g| ForwardRank {
            load: Some(LayerTransfer {
                path: vec![c.dram[0], c.cnic_tx[0][g], c.cnic_rx[0][g]],
                lane: 2,
                size_bytes: 100 * layer_block,
            }),
            attn_ns: 300_000,
            store: Some(LayerTransfer {
                path: vec![c.cnic_tx[0][g], c.cnic_rx[1][g], c.dram[1]],
                lane: 2,
                size_bytes: 10 * layer_block,
            }),
        })
        .collect();
    let collectives: Vec<LayerTransfer> = (0..GPUS)
        .flat_map(|a| (0..GPUS).filter(move |&b| b != a).map(move |b| (a, b)))
        .map(|(a, b)| LayerTransfer { path: vec![c.cnic_tx[0][a], c.cnic_rx[0][b]], lane: 0, size_bytes: 7168 * 256 })
        .collect();
    let spec = ForwardSpec { n_layers: 61, ranks, ffn_ns: 200_000, collectives, load_window: 2 };
    let before = core.stats();
    let start = Instant::now();
    let t0 = core.now_ns();
    for tag in 0..forwards {
        // Tags below UNREPORTED_TAG (u64::MAX: detached work, never reported) and above the mix's.
        core.submit_forward(spec.clone(), u64::MAX - 1 - tag).unwrap();
        // Step until this forward is done (the mix's completions are dropped: it is winding down).
        while !core.take_completions().iter().any(|x| x.kind == CompletionKind::Forward) {
            core.step().unwrap().expect("the forward is pending");
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let stats = core.stats();
    let events = stats.transfer_events - before.transfer_events;
    println!(
        "forwards: {forwards} of 61 layers x 8 ranks (+56 all-to-all transfers per layer), {:.3} s emulated in {wall:.2} s wall; {} internal transfers",
        (core.now_ns() - t0) as f64 / 1e9,
        stats.forwards.transfers - before.forwards.transfers
    );
    println!("BENCH core_forwards_per_s {:.0} forwards/s", forwards as f64 / wall);
    println!("BENCH core_forward_transfer_events_per_s {:.0} events/s", events as f64 / wall);
}
