//! Virtual-lane arbitration: parsing never panics, the packet arbiter only sends packets that exist
//! from the table the IB rules pick, and the fluid allocation is feasible, demand-bounded and work
//! conserving.

#![no_main]

use arbitrary::Unstructured;
use dualpath_emu_core::lanes::{PacketArbiter, VlArbEntry};
use dualpath_emu_core::{ErrorKind, Lane, VlArbitration, MAX_LANES};
use dualpath_emu_fuzz::{arbitration, int, log_uniform, pick, raw_f64};
use libfuzzer_sys::fuzz_target;

/// Packet-arbiter decisions per input.
const MAX_STEPS: usize = 512;
/// `allocate` calls per input.
const MAX_ALLOCATIONS: usize = 16;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    // Parsing arbitrary text and numbers must never panic; errors are Config errors naming the knob.
    let max_vls = int(&mut u, 0u8, 255);
    let high_limit = int(&mut u, 0u8, 255);
    let high: &str = u.arbitrary().unwrap_or("");
    let low: &str = u.arbitrary().unwrap_or("");
    if let Err(e) = VlArbitration::parse(max_vls, high_limit, high, low) {
        assert_eq!(e.kind, ErrorKind::Config, "{e}");
        assert!(e.message.starts_with("qos_"), "an arbitration error names its knob: {e}");
    }

    let cfg = match arbitration(&mut u) {
        Ok(cfg) => cfg,
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::Config, "{e}");
            return;
        }
    };
    let mtu = match int(&mut u, 0u8, 7) {
        0 => int(&mut u, 0u32, u32::MAX),
        1 => int(&mut u, 1u32, 64),
        _ => pick(&mut u, &[256u32, 1024, 2048, 4096]),
    };
    let valid = cfg.validate().is_ok();
    let model = cfg.rate_model(mtu);
    assert_eq!(model.is_ok(), valid && mtu > 0, "rate_model({mtu}) of {cfg:?}: {model:?}");
    assert_eq!(PacketArbiter::new(&cfg).is_ok(), valid);
    if !valid {
        return;
    }
    let model = match model {
        Ok(m) => m,
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
            return;
        }
    };
    for v in 0..=255u8 {
        assert_eq!(model.serves(v), cfg.serves(v), "lane {v}");
        assert!(!cfg.serves(v) || (v as usize) < MAX_LANES);
    }

    if int(&mut u, 0u8, 1) == 0 {
        packet_arbiter(&mut u, &cfg);
    }
    for _ in 0..int(&mut u, 1usize, MAX_ALLOCATIONS) {
        allocation(&mut u, &cfg, &model);
    }
});

fn weight_in(table: &[VlArbEntry], v: usize) -> bool {
    table.iter().any(|e| e.vl as usize == v && e.weight > 0)
}

/// Drive the packet arbiter over arbitrary head-of-line sizes. Besides "only lanes with a packet",
/// the table that sends is predicted from the IB rules alone (module doc of `lanes.rs`): the high
/// table sends if it has an eligible packet and its limit is not reached or the low table has none;
/// else the low table sends one packet and resets the high count. Which entry sends within a table is
/// left to the lane-share property tests.
fn packet_arbiter(u: &mut Unstructured, cfg: &VlArbitration) {
    let mut arbiter = PacketArbiter::new(cfg).expect("validated");
    let limit = (cfg.high_limit != 255).then(|| (cfg.high_limit as u64 * 4096).max(1));
    let in_high: [bool; MAX_LANES] = std::array::from_fn(|v| weight_in(&cfg.high, v));
    let in_low: [bool; MAX_LANES] = std::array::from_fn(|v| weight_in(&cfg.low, v));
    let mut head = [0u32; MAX_LANES];
    let mut high_sent: u64 = 0;
    for step in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        // Change a few lanes' head packets between decisions (0 = lane empty).
        for _ in 0..int(u, 0usize, 3) {
            let v = int(u, 0usize, MAX_LANES - 1);
            head[v] = match int(u, 0u8, 7) {
                0 => 0,
                1 => int(u, 1u32, u32::MAX),
                _ => pick(u, &[1u32, 64, 256, 1024, 4096, 4096]),
            };
        }
        let high_ready = (0..MAX_LANES).any(|v| in_high[v] && head[v] > 0);
        let low_ready = (0..MAX_LANES).any(|v| in_low[v] && head[v] > 0);
        let under_limit = limit.is_none_or(|l| high_sent < l);
        let got = arbiter.select(&head);
        let Some(lane) = got else {
            assert!(!high_ready && !low_ready, "step {step}: nothing sent though {head:?} has packets ({cfg:?})");
            continue;
        };
        let v = lane as usize;
        assert!(v < MAX_LANES && head[v] > 0, "step {step}: lane {lane} has no packet in {head:?}");
        if high_ready && (under_limit || !low_ready) {
            assert!(in_high[v], "step {step}: the high table must send, got lane {lane} ({cfg:?}, {head:?})");
            high_sent = high_sent.saturating_add(head[v] as u64);
        } else {
            assert!(low_ready && in_low[v], "step {step}: the low table must send, got {lane} ({cfg:?})");
            high_sent = 0;
        }
    }
}

/// One `allocate` call with arbitrary demands (0, unbounded, any finite size, any scale).
fn allocation(u: &mut Unstructured, cfg: &VlArbitration, model: &dualpath_emu_core::lanes::LaneShares) {
    let capacity = match int(u, 0u8, 7) {
        0 => 0.0,
        1 => {
            // Any scale a float holds, short of subnormals (whose rounding alone breaks the 1e-9
            // tolerance) and of the last factor 1e8 below f64::MAX (a weight times it overflows).
            let x = raw_f64(u).abs();
            if (1e-250..=1e300).contains(&x) {
                x
            } else {
                1.0
            }
        }
        _ => log_uniform(u, 1e-3, 1e15),
    };
    let mut demand = [0.0f64; MAX_LANES];
    let active = int(u, 0u16, u16::MAX);
    for (v, d) in demand.iter_mut().enumerate() {
        if active & (1 << v) == 0 {
            continue;
        }
        *d = match int(u, 0u8, 9) {
            0 => f64::INFINITY,
            1 => {
                let x = raw_f64(u).abs();
                if x.is_nan() {
                    0.0
                } else {
                    x
                }
            }
            2 => capacity * pick(u, &[0.25, 0.5, 1.0, 1.0 / 3.0, 2.0]),
            _ => log_uniform(u, 1e-3, 1e15),
        };
    }
    let mut out = [f64::NAN; MAX_LANES];
    model.allocate(capacity, &demand, &mut out);
    let total: f64 = out.iter().sum();
    let ctx = || format!("capacity {capacity:e}, demand {demand:?}, out {out:?}, {cfg:?}");
    assert!(total <= capacity * (1.0 + 1e-9), "over capacity: {}", ctx());
    for v in 0..MAX_LANES {
        assert!(!out[v].is_nan() && out[v] >= 0.0, "lane {v}: {}", ctx());
        assert!(out[v] <= demand[v], "lane {v} above its demand: {}", ctx());
        assert!(model.serves(v as Lane) || out[v] == 0.0, "unserved lane {v} got a rate: {}", ctx());
    }
    // Work conserving: capacity is left over only when every served lane got all it asked for.
    if total < capacity * (1.0 - 1e-9) {
        for v in (0..MAX_LANES).filter(|&v| model.serves(v as Lane) && demand[v] > 0.0) {
            assert!(out[v] >= demand[v] * (1.0 - 1e-9), "lane {v} short with capacity left: {}", ctx());
        }
    }
    // Saturated shares: a distribution over the served backlogged lanes.
    let backlogged = active;
    let shares = model.saturated_shares(backlogged);
    let any_served = (0..MAX_LANES).any(|v| backlogged & (1 << v) != 0 && model.serves(v as Lane));
    let sum: f64 = shares.iter().sum();
    assert!((sum - if any_served { 1.0 } else { 0.0 }).abs() < 1e-9, "shares {shares:?} of {backlogged:#x}");
}
