//! Input decoders shared by the fuzz targets: bytes → numbers, arbitration configs and table text.
//!
//! Every decoder reads from an [`Unstructured`] and never fails: once the input runs out it yields
//! the smallest choice, so every byte string is some well-formed case and libFuzzer's mutations stay
//! meaningful. Choices are biased towards the values the core is built for (the paper's rates, lanes
//! 0..4, a 4 KiB MTU) with a minority of invalid or odd values that must come back as `Err`.

use arbitrary::Unstructured;
use dualpath_emu_core::lanes::VlArbEntry;
use dualpath_emu_core::{Lane, VlArbitration};

/// A number in `lo..=hi`; `lo` once the input is exhausted.
pub fn int<T>(u: &mut Unstructured, lo: T, hi: T) -> T
where
    T: arbitrary::unstructured::Int,
{
    u.int_in_range(lo..=hi).unwrap_or(lo)
}

/// One of `items` (the first once the input is exhausted).
pub fn pick<T: Copy>(u: &mut Unstructured, items: &[T]) -> T {
    items[int(u, 0, items.len() - 1)]
}

/// One of `items`, or (as one more choice) whatever `other` draws.
pub fn pick_or<T: Copy>(u: &mut Unstructured, items: &[T], other: impl FnOnce(&mut Unstructured) -> T) -> T {
    match int(u, 0, items.len()) {
        i if i < items.len() => items[i],
        _ => other(u),
    }
}

pub fn flag(u: &mut Unstructured) -> bool {
    u.arbitrary().unwrap_or(false)
}

/// A fraction in [0, 1].
pub fn unit(u: &mut Unstructured) -> f64 {
    int(u, 0u32, u32::MAX) as f64 / u32::MAX as f64
}

/// Log-uniform in [lo, hi] (both > 0).
pub fn log_uniform(u: &mut Unstructured, lo: f64, hi: f64) -> f64 {
    let x = lo * (hi / lo).powf(unit(u));
    x.clamp(lo, hi)
}

/// Any f64 bit pattern: NaN, infinities, subnormals, negative zero.
pub fn raw_f64(u: &mut Unstructured) -> f64 {
    f64::from_bits(int(u, 0u64, u64::MAX))
}

/// Lanes for configs: mostly the four the tests use, sometimes any data lane, rarely out of range.
pub fn lane(u: &mut Unstructured) -> Lane {
    match int(u, 0u8, 15) {
        0..=11 => int(u, 0, 3),
        12..=14 => int(u, 0, 14),
        _ => int(u, 15, 255),
    }
}

/// Table text for `VlArbitration::parse`: usually well-formed "VL:WEIGHT" lists (with odd spacing,
/// out-of-range numbers and stray separators now and then), sometimes arbitrary text.
pub fn table_text(u: &mut Unstructured, max_vls: u8) -> String {
    match int(u, 0u8, 9) {
        0 => String::new(),
        1 => u.arbitrary::<&str>().unwrap_or("").chars().take(200).collect(),
        2 => {
            // Too many entries (the IB table holds 64).
            let n = int(u, 60usize, 70);
            vec!["0:1"; n].join(",")
        }
        _ => {
            let n = int(u, 1usize, 8);
            let mut parts = Vec::with_capacity(n);
            for _ in 0..n {
                let vl: String = match int(u, 0u8, 15) {
                    0 => int(u, 0u16, 300).to_string(),
                    1 => "-1".into(),
                    2 => "x".into(),
                    _ => int(u, 0, max_vls.saturating_sub(1)).to_string(),
                };
                let weight: String = match int(u, 0u8, 15) {
                    0 => int(u, 0u16, 300).to_string(),
                    1 => "0".into(),
                    2 => "".into(),
                    _ => pick_or(u, &[1u8, 16, 32, 64, 96, 128, 192, 255], |u| int(u, 0, 255)).to_string(),
                };
                parts.push(match int(u, 0u8, 15) {
                    0 => vl.clone(),
                    1 => format!(" {vl} : {weight} "),
                    _ => format!("{vl}:{weight}"),
                });
            }
            let mut text = parts.join(",");
            if int(u, 0u8, 15) == 0 {
                text.push(',');
            }
            text
        }
    }
}

/// Raw table entries (bypassing the parser), possibly invalid.
pub fn entries(u: &mut Unstructured, max_vls: u8) -> Vec<VlArbEntry> {
    let n = if int(u, 0u8, 31) == 0 { int(u, 0usize, 70) } else { int(u, 0usize, 8) };
    (0..n)
        .map(|_| {
            let vl = if int(u, 0u8, 15) == 0 { lane(u) } else { int(u, 0, max_vls.saturating_sub(1)) };
            let weight = pick_or(u, &[0u8, 1, 4, 16, 64, 192, 255], |u| int(u, 0, 255));
            VlArbEntry { vl, weight }
        })
        .collect()
}

/// An arbitration config, or the parse error it produced: the named constructors, `parse` over
/// generated text, and raw structs. Invalid ones are returned as they are so callers can check that
/// the core rejects them.
pub fn arbitration(u: &mut Unstructured) -> Result<VlArbitration, dualpath_emu_core::CoreError> {
    match int(u, 0u8, 9) {
        0 | 1 => {
            let n = if int(u, 0u8, 15) == 0 { int(u, 0, 255) } else { int(u, 1, 15) };
            Ok(VlArbitration::fair(n))
        }
        2 | 3 => Ok(VlArbitration::paper()),
        4 => {
            let high: Vec<Lane> = (0..int(u, 0usize, 3)).map(|_| lane(u)).collect();
            let low: Vec<Lane> = (0..int(u, 0usize, 4)).map(|_| lane(u)).collect();
            Ok(VlArbitration::strict_priority(&high, &low))
        }
        5 => {
            let e: Vec<(Lane, u8)> = (0..int(u, 0usize, 6)).map(|_| (lane(u), int(u, 0, 255))).collect();
            Ok(VlArbitration::weighted_round_robin(&e))
        }
        6 | 7 => {
            let max_vls = if int(u, 0u8, 15) == 0 { int(u, 0, 255) } else { int(u, 1, 8) };
            let high_limit = pick_or(u, &[0u8, 1, 240, 254, 255], |u| int(u, 0, 255));
            let high = table_text(u, max_vls);
            let low = table_text(u, max_vls);
            VlArbitration::parse(max_vls, high_limit, &high, &low)
        }
        _ => {
            let max_vls = if int(u, 0u8, 15) == 0 { int(u, 0, 255) } else { int(u, 1, 8) };
            let high_limit = pick_or(u, &[0u8, 1, 240, 254, 255], |u| int(u, 0, 255));
            let high = entries(u, max_vls);
            let low = entries(u, max_vls);
            Ok(VlArbitration { max_vls, high_limit, high, low })
        }
    }
}
