//! Co-residence admission that counts the CUs a lower kernel's last round
//! leaves free (issue 18, `engine/coreside_places.rs`; docs/scheduling.md
//! "Co-residence counts the CUs a lower kernel's last round leaves"). A
//! higher VM co-resides only when its job, run in lock-step rounds on the
//! fewest CUs a recent lower kernel leaves free, exceeds its solo time by
//! at most one save and restore (fuzz seed 200117: 548 lower workgroups
//! leave 60 of 304 CUs; the RT's 51.4 us job took 300 us there).

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition (304 CUs).
const CUS: u32 = 38;
const PART_CUS: u64 = 304;
const PERIODS: u64 = 12;

/// A partition of 4 slots with a busy lower VM (VM 0, priority 2, one
/// queue of half-CU workgroups 1.7 ms long) whose recent kernels have the
/// widths `lower`, and a higher VM (VM 1, priority 12, one queue) that
/// rings a job of `width` half-CU workgroups of solo time `solo` every 2
/// ms. Returns the periods in which it co-resided. With `kernels` false
/// the lower kernels' widths are not reported (only the doorbell's
/// widest, as before this rule): what the other admission rules decide.
fn rt_beside(lower: &[u64], width: u64, solo: u64, kernels: bool) -> u64 {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo = w.vm(0, 2, 1, 1)[0];
    let rt = w.vm(1, 12, 1, 1)[0];
    w.s.note_dispatch_width(lo, lower.iter().copied().max().unwrap_or(0));
    for &k in lower.iter().filter(|_| kernels) {
        w.s.note_dispatch_kernel(lo, k);
    }
    w.s.note_dispatch_occupancy(lo, 1_728_000, true);
    w.submit(lo, 1000 * MS);
    w.run_until(MS);
    let mut coresident = 0;
    for i in 0..PERIODS {
        w.s.note_dispatch_width(rt, width);
        w.s.note_dispatch_kernel(rt, width);
        w.s.note_dispatch_occupancy(rt, solo, true);
        w.submit(rt, solo / 2);
        if w.s.cu_reservation(0) == Some((VmId(1), 0)) {
            coresident += 1;
        }
        w.run_until(MS + (i + 1) * 2 * MS);
    }
    coresident
}

/// [`rt_beside`] with the lower kernels' widths reported.
fn rt_beside_kernels(lower: &[u64], width: u64, solo: u64) -> u64 {
    rt_beside(lower, width, solo, true)
}

/// The rule written out: for the fewest CUs `F > 0` a lower kernel's
/// last round leaves (`F = N - r`, `r = w - N x (ceil(w / N) - 1)`), the
/// job's `ceil(width / F)` rounds of `s` within `s` plus the allowance
/// (the other admission rules, e.g. the rounds' `2A - s` or a lower
/// lock-step kernel that a reservation costs nothing, apply beside it).
fn places_meet(lower: &[u64], width: u64, solo: u64) -> bool {
    let max = cfg(Policy::Hqdmux).spatial_coreside_ns;
    let free = lower
        .iter()
        .map(|&w| PART_CUS - ((w - 1) % PART_CUS + 1))
        .filter(|&f| f > 0)
        .min();
    free.is_none_or(|f| width.div_ceil(f) * solo - solo <= max)
}

/// Fuzz seed 200117's shape: beside a lower kernel of 548 workgroups (60
/// CUs free in its last round), a 608-workgroup RT of 40 us rounds does
/// not co-reside (11 rounds there, 440 us); beside 1216 (whole rounds) or
/// 304 it does, in every period.
#[test]
fn a_lower_last_round_that_leaves_few_cus_ends_coresidence() {
    assert_eq!(rt_beside_kernels(&[548], 608, 40_000), 0);
    assert_eq!(rt_beside_kernels(&[1216, 548], 608, 40_000), 0);
    assert_eq!(rt_beside_kernels(&[1216], 608, 40_000), PERIODS);
    assert_eq!(rt_beside_kernels(&[304], 608, 40_000), PERIODS);
}

/// Over lower kernels from 1 workgroup to four rounds and a half (single
/// kernels and mixed doorbells), RT widths from 1 workgroup to two rounds
/// and solo times of 5-90 us: where the written-out rule holds, the
/// scheduler decides as without the lower kernels' widths (the other
/// rules); where it does not, it never co-resides, and in enough of those
/// cases the other rules alone would have co-resided in every period
/// (the rule disabled: the test fails).
#[test]
fn coresidence_follows_the_free_cus_over_lower_kernels_and_rt_shapes() {
    let lowers: [&[u64]; 9] = [
        &[1],
        &[100],
        &[303],
        &[304],
        &[305],
        &[548],
        &[600],
        &[1216, 548],
        &[1368, 912],
    ];
    let mut seen = (0, 0);
    for lower in lowers {
        for width in [1u64, 38, 152, 304, 608] {
            for solo in [5_000u64, 40_000, 90_000] {
                let c = rt_beside_kernels(lower, width, solo);
                let before = rt_beside(lower, width, solo, false);
                let what = format!("lower {lower:?} width {width} solo {solo}");
                if places_meet(lower, width, solo) {
                    assert_eq!(c, before, "{what}");
                    seen.0 += u32::from(c == PERIODS);
                } else {
                    assert_eq!(c, 0, "{what}");
                    seen.1 += u32::from(before == PERIODS);
                }
            }
        }
    }
    // Co-residence kept where the places allow it, and ended where only
    // this rule ends it.
    assert!(seen.0 >= 10 && seen.1 >= 5, "{seen:?}");
}
