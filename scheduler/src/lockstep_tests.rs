//! Co-residence or a reservation by what each costs the lower lock-step
//! work (issue 18, `engine/lockstep.rs`, docs/scheduling.md "Co-residence
//! or reservation by the lower work's rounds"): a higher VM admitted to
//! co-reside gets a CU reservation instead when the lower VM's dispatches
//! fill the partition (co-residence then delays each of its rounds by up to
//! the owner's job, `lambda_co = min(A / I, 1 / 2)`) and the reservation costs them
//! fewer rounds (`lambda_res = 1 - ceil(W / N) / ceil(W / N')`).

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition (304 CUs).
const CUS: u32 = 38;
const PART_CUS: u64 = 304;

/// Periods of the higher VM in a run.
const PERIODS: u64 = 24;
/// Periods after which its interval is measured (the first doorbells
/// decide without one).
const WARM: u64 = 4;

/// What a run decided once the owner's period was measured.
#[derive(Debug)]
struct Run {
    /// Periods in which the owner co-resided (with its queue busy).
    coresident: u64,
    /// Periods in which it held a reservation.
    reserved: u64,
    /// Saves of the lower VM after the warm-up.
    lower_saves: u64,
    /// The lower VM still runs at the end.
    lower_running: bool,
}

/// A partition of 4 slots, a busy lower VM (VM 0, priority 2, one queue,
/// half-CU workgroups of 679 us, dispatches of `lower_width`) and a higher
/// VM (VM 1, priority 12, one queue) ringing every `period` a job of 3
/// half-CU workgroups of `solo` (the 50115 shape when `lower_width` is
/// 443, `solo` 238 us and `period` 716 us).
fn owner_beside_lockstep(lower_width: u64, solo: u64, period: u64) -> Run {
    owner_beside_rounds(lower_width, LOWER_SOLO, 3, solo, period)
}

/// The lower VM's workgroup (one round) in [`owner_beside_lockstep`].
const LOWER_SOLO: u64 = 679_000;

/// [`owner_beside_lockstep`] with the lower workgroup's cost `lower_solo`
/// and the owner's width `rt_width`.
fn owner_beside_rounds(
    lower_width: u64,
    lower_solo: u64,
    rt_width: u64,
    solo: u64,
    period: u64,
) -> Run {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo = w.vm(0, 2, 1, 1)[0];
    let rt = w.vm(1, 12, 1, 1)[0];
    w.s.note_dispatch_width(lo, lower_width);
    w.s.note_dispatch_occupancy(lo, lower_solo, true);
    w.submit(lo, 1000 * MS);
    w.run_until(MS);
    let (mut coresident, mut reserved, mut saves_at_warm) = (0, 0, 0);
    for i in 0..PERIODS {
        if i == WARM {
            saves_at_warm = w.s.vm_stats(VmId(0)).unwrap().preemptions;
        }
        w.ring_job(rt, rt_width, solo, true, solo);
        assert_eq!(w.state(rt), QueueState::Running, "period {i}");
        if i >= WARM {
            match w.s.cu_reservation(0) {
                Some((VmId(1), 0)) => coresident += 1,
                Some((VmId(1), _)) => reserved += 1,
                _ => {}
            }
        }
        w.run_until(MS + (i + 1) * period);
    }
    // The decisions after the warm-up start from a reservation already in
    // place or a co-residence; the setup save of a reservation may fall
    // in the warm-up or just after it.
    Run {
        coresident,
        reserved,
        lower_saves: w.s.vm_stats(VmId(0)).unwrap().preemptions - saves_at_warm,
        lower_running: w.state(lo) == QueueState::Running,
    }
}

/// The rule written out: the reservation `Spatial::size` gives 3
/// workgroups (1 CU per XCC: `N' = 296`), the owner's job alone `A =
/// solo` (one round), its interval `I = period`; sharing costs at most
/// half, and at most `D / (L + D)` with the owner's 3 guests per job spread
/// over the 304 CUs (`L` = 679 us: `h = floor(2L x 3 / (I x 304)) + 1` = 1
/// for every period here, `D = min(L, solo)`).
fn prefers_reservation(lower_width: u64, solo: u64, period: u64) -> bool {
    let rest = PART_CUS - 8;
    let (a, b) = (lower_width.div_ceil(PART_CUS), lower_width.div_ceil(rest));
    let h = 2 * LOWER_SOLO * 3 / (period * PART_CUS) + 1;
    let d = (h * solo).min(LOWER_SOLO);
    lower_width >= PART_CUS
        && (b - a) * period < solo * b
        && 2 * (b - a) < b
        && (b - a) * (LOWER_SOLO + d) < d * b
}

/// The 50115 shape: 443 lower workgroups run 2 rounds on 304 CUs and on
/// 296, so one reserved CU per XCC costs them nothing while sharing CUs
/// delays each full round by the RT's 238 us every 716 us: the owner holds
/// a reservation in every period, the lower VM is not saved again and keeps
/// running.
#[test]
fn a_reservation_that_costs_no_round_replaces_coresidence() {
    let r = owner_beside_lockstep(443, 238_000, 716_000);
    assert_eq!(r.reserved, PERIODS - WARM, "{r:?}");
    assert_eq!(r.coresident, 0, "{r:?}");
    assert!(r.lower_saves <= 1, "{r:?}");
    assert!(r.lower_running, "{r:?}");
}

/// One full round (304 workgroups) would run 2 rounds on 296 CUs: the
/// reservation costs half, sharing 238 us per 716 us a third: the owner
/// co-resides as before, without a save. A narrow lower kernel (100
/// workgroups) leaves the owner free CUs: co-residence costs it nothing.
#[test]
fn coresidence_stays_where_a_reservation_costs_more_rounds() {
    for width in [304u64, 100] {
        let r = owner_beside_lockstep(width, 238_000, 716_000);
        assert_eq!(r.coresident, PERIODS - WARM, "width {width}: {r:?}");
        assert_eq!(r.lower_saves, 0, "width {width}: {r:?}");
        assert!(r.lower_running, "width {width}: {r:?}");
    }
}

/// Over lower widths from a third of the partition to 4.3 rounds, owner
/// solo times of 20-238 us and periods of 0.5-8 ms, the owner co-resides or
/// holds a reservation in every measured period exactly as the rule says.
#[test]
fn the_choice_follows_the_rule_over_shapes() {
    let mut seen = (0, 0);
    for width in [100u64, 304, 443, 600, 900, 1216, 1300] {
        for solo in [20_000u64, 120_000, 238_000] {
            for period in [500_000u64, 2_000_000, 8_000_000] {
                let r = owner_beside_lockstep(width, solo, period);
                let what = format!("width {width} solo {solo} period {period}: {r:?}");
                if prefers_reservation(width, solo, period) {
                    seen.0 += 1;
                    assert_eq!(r.reserved, PERIODS - WARM, "{what}");
                } else {
                    seen.1 += 1;
                    assert_eq!(r.coresident, PERIODS - WARM, "{what}");
                    assert_eq!(r.lower_saves, 0, "{what}");
                }
                assert!(r.lower_running, "{what}");
            }
        }
    }
    assert!(seen.0 >= 5 && seen.1 >= 5, "{seen:?}");
}

/// Fuzz seed 400136's shape: 912 lower workgroups of 502 us (3 whole
/// rounds on 304 CUs, 4 on 296 or 288) beside an owner of 16 half-CU
/// workgroups of 97.6 us every 199 us. By `A / I` sharing would cost the
/// lower work 0.49 and the reservation a fourth round, 0.25; but the
/// owner's 16 guests per job go to the next 16 CUs round robin, so a CU
/// hosts one every 19 jobs (3.8 ms) and a round of at most 1004 us holds
/// at most one: 97.6 us of 599.6, 0.16. The owner co-resides in every
/// period and the lower VM is not saved (it kept 0.749 of alone under the
/// reservation, 0.930 co-resident).
#[test]
fn spread_guests_make_coresidence_cheaper_than_a_fourth_round() {
    let r = owner_beside_rounds(912, 502_134, 16, 97_598, 199_000);
    assert_eq!(r.coresident, PERIODS - WARM, "{r:?}");
    assert_eq!(r.reserved, 0, "{r:?}");
    assert_eq!(r.lower_saves, 0, "{r:?}");
    assert!(r.lower_running, "{r:?}");
    // 1216 lower workgroups (4 rounds, 5 on the 280 CUs the reservation
    // leaves: `lambda_res` = 0.2): the same owner still co-resides (0.16),
    // one of 150 us workgroups every 400 us (`A / I` = 0.375, `D` = 150 us
    // of 652, 0.23) gets the reservation.
    let four = owner_beside_rounds(1216, 502_134, 16, 97_598, 199_000);
    assert_eq!(four.coresident, PERIODS - WARM, "{four:?}");
    let long = owner_beside_rounds(1216, 502_134, 16, 150_000, 400_000);
    assert_eq!(long.reserved, PERIODS - WARM, "{long:?}");
    assert_eq!(long.coresident, 0, "{long:?}");
}
