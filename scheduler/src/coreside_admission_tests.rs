//! Co-residence admission on the job's rounds (issue 18, the `rt` family,
//! docs/scheduling.md "Co-residence admission"): a higher VM shares every
//! CU with lower work only when the delay sharing can cause, `2A - s` (its
//! job's alone time `A` on the whole partition, up to twice that shared,
//! against an isolated time of at least its solo time `s`), is within one
//! save and restore. One round's solo time alone admitted a 4-round job
//! that then ran 353 us against an isolated 88 us (fuzz seed 50113).

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition (304 CUs).
const CUS: u32 = 38;
const PART_CUS: u64 = 304;

/// What a run decided: in how many periods the higher VM co-resided once
/// all its queues had rung, and how many saves the lower VM took.
struct Run {
    coresident_periods: u32,
    lower_saves: u64,
    lower_running: bool,
}

const PERIODS: u32 = 20;

/// A partition of 4 slots with the MI300X-like geometry, a busy lower VM
/// (VM 0, priority 2, one queue, half-CU workgroups 1.7 ms long, full
/// width) and a higher VM (VM 1, priority 12) of `rt_queues` queues that
/// rings all of them every 2 ms for 20 periods, each queue dispatching
/// `width` workgroups with solo time `solo` (one job of half that per
/// queue: the fake GPU runs the queues' jobs whatever their width).
fn rt_beside_lower(width: u64, solo: u64, rt_queues: u32) -> Run {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo = w.vm(0, 2, 1, 1)[0];
    let rts = w.vm(1, 12, 1, rt_queues);
    w.s.note_dispatch_width(lo, PART_CUS);
    w.s.note_dispatch_occupancy(lo, 1_728_000, true);
    w.submit(lo, 1000 * MS);
    w.run_until(MS);
    let mut coresident_periods = 0;
    let job = solo / 2;
    for i in 0..PERIODS as u64 {
        for &q in &rts {
            w.s.note_dispatch_width(q, width);
            w.s.note_dispatch_occupancy(q, solo, true);
            w.submit(q, job);
            assert_eq!(w.state(q), QueueState::Running, "period {i}");
        }
        // Decided with every queue busy (each doorbell re-decides).
        if w.s.cu_reservation(0) == Some((VmId(1), 0)) {
            coresident_periods += 1;
        }
        w.run_until(MS + (i + 1) * 2 * MS);
    }
    Run {
        coresident_periods,
        lower_saves: w.s.vm_stats(VmId(0)).unwrap().preemptions,
        lower_running: w.state(lo) == QueueState::Running,
    }
}

/// The admission rule written out: `A = ceil(width x queues / 304) x s`,
/// co-residence when `2A - s` is within the default bound (240 us, the
/// modelled save and restore; the fake GPU's saves are shorter).
fn admitted(width: u64, solo: u64, queues: u32) -> bool {
    let alone = (width * queues as u64).div_ceil(PART_CUS) * solo;
    2 * alone - solo <= cfg(Policy::Hqdmux).spatial_coreside_ns
}

/// The seed-50113 shape: 46.5 us of solo time over 1216 workgroups (4
/// rounds of the partition) may take 372 us shared against an isolated
/// time of at least 46.5 us; it does not co-reside (the lower work leaves
/// its CUs instead), while the same solo time over one round (304
/// workgroups) does in every period, without a save.
#[test]
fn a_multi_round_job_does_not_coreside_on_its_solo_time() {
    let r = rt_beside_lower(1216, 46_500, 1);
    assert_eq!(r.coresident_periods, 0);
    assert!(r.lower_saves >= 1);
    let r = rt_beside_lower(304, 46_500, 1);
    assert_eq!(r.coresident_periods, PERIODS);
    assert_eq!(r.lower_saves, 0);
    assert!(r.lower_running);
}

/// Every busy queue of the higher VM may dispatch its width at once: two
/// queues of 152 workgroups are one round (co-resident), three are two
/// rounds, whose doubling (a delay of up to 3 x 90 us) is past the bound:
/// the third queue's doorbell ends the co-residence its first two had.
#[test]
fn the_owner_s_busy_queues_count_in_its_rounds() {
    let r = rt_beside_lower(152, 90_000, 2);
    assert_eq!(r.coresident_periods, PERIODS);
    assert_eq!(r.lower_saves, 0);
    let r = rt_beside_lower(152, 90_000, 3);
    assert_eq!(r.coresident_periods, 0);
    assert!(r.lower_saves >= 1);
}

/// Over RT shapes from 1 workgroup to four times the partition, solo times
/// from 5 us to 230 us and one to three queues, the scheduler co-resides
/// (with every queue busy) exactly when the rule admits the shape, and
/// then in every period without costing the lower VM a save.
#[test]
fn coresidence_follows_the_rounds_over_rt_shapes() {
    let mut seen = (0, 0);
    for width in [1u64, 38, 152, 304, 305, 608, 1216] {
        for solo in [5_000u64, 40_000, 90_000, 230_000] {
            for queues in [1u32, 3] {
                let r = rt_beside_lower(width, solo, queues);
                let what = format!("width {width} solo {solo} queues {queues}");
                if admitted(width, solo, queues) {
                    seen.0 += 1;
                    assert_eq!(r.coresident_periods, PERIODS, "{what}");
                    assert_eq!(r.lower_saves, 0, "{what}");
                    assert!(r.lower_running, "{what}");
                } else {
                    seen.1 += 1;
                    assert_eq!(r.coresident_periods, 0, "{what}");
                }
            }
        }
    }
    // Both sides of the rule were exercised.
    assert!(seen.0 >= 5 && seen.1 >= 5, "{seen:?}");
}
