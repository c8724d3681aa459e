//! A wide reservation drained where the owner's gaps are long (issue 18,
//! `3-be-retained` beside a wide RT; `engine/wide_drain.rs`). Fuzz seed
//! 97101: an RT of 304 workgroups of 6.7 us every 964 us above a lone lower
//! closed loop whose workgroups end within 83 us kept a wide reservation of
//! 2 CUs per XCC for the whole run, and the lower lock-step kernels ran a
//! round more for it (0.706 of alone). Virtual time only.

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
/// The owner's width: the whole partition (wider than the width cap).
const WIDTH: u64 = 304;
/// Its solo time: one round of its workgroups.
const SOLO: Nanos = 7_000;

/// A world with the geometry, a busy lone lower queue (VM 0, priority 2)
/// of lock-step kernels of `width` whole-CU workgroups, 4 ms of solo time
/// per doorbell and workgroups of at most `longest`, and the wide owner
/// (VM 1, priority 12).
fn rig(width: u64, longest: Nanos) -> (World, QueueId, QueueId) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo = w.vm(0, 2, 1, 1)[0];
    let hi = w.vm(1, 12, 1, 1)[0];
    w.s.note_dispatch_width(lo, width);
    w.s.note_dispatch_occupancy(lo, 4 * MS, false);
    w.s.note_dispatch_longest_wg(lo, longest, 0);
    w.submit(lo, 100_000 * MS);
    w.run_until(MS);
    (w, lo, hi)
}

/// The owner's job as the fake GPU runs it: one round on the whole
/// partition, `ceil(WIDTH / (k x 8))` rounds on a reservation of `k` CUs
/// per XCC (the fake GPU does not model CU masks).
fn ring(w: &mut World, hi: QueueId) {
    let j = match w.s.cu_reservation(0) {
        Some((vm, k)) if vm == w.vm_of[&hi] && k > 0 => WIDTH.div_ceil(k as u64 * 8) * SOLO,
        _ => SOLO,
    };
    w.ring_job(hi, WIDTH, SOLO, false, j);
}

/// 100 periods of `period` after 100 to learn it: the lower queue's saves,
/// whether the owner held a reservation at every ring, and whether the
/// lower queue had every CU back halfway through every gap.
fn steady(w: &mut World, lo: QueueId, hi: QueueId, period: Nanos) -> (u64, bool, bool) {
    let start = w.now;
    // The reservation is looked at as the owner rings; halfway through a
    // gap it may stay another (lower) VM's.
    super::drained_res_tests::steady_periods(w, (lo, hi), period, (start, 100), 0, ring, |r| {
        r.is_none_or(|(vm, _)| vm != VmId(1))
    })
}

/// Periods of 0.5-0.96 ms, lower workgroups of 20-83 us (the drain and the
/// owner's job on its reservation within half the period): the lower
/// queue is never saved in steady state, the owner has its reservation at
/// every job, and the lower work has every CU back in every gap. Fails
/// with wide reservations never drained (kept through every gap, as
/// before: 97101's lock-step round lost for the whole run).
#[test]
fn a_wide_reservation_drains_where_the_gaps_are_long() {
    for width in [1216, 2867] {
        for longest in [20_000, 83_000] {
            for period in [500_000, 700_000, 964_000] {
                let (mut w, lo, hi) = rig(width, longest);
                let (saves, reserved, back) = steady(&mut w, lo, hi, period);
                let at = format!("width {width}, workgroup {longest} ns, period {period} ns");
                assert_eq!(saves, 0, "{at}: lower queue saved");
                assert!(reserved, "{at}: no reservation during a job");
                assert!(back, "{at}: reservation held through a gap");
            }
        }
    }
}

/// The control: a 7 kHz owner (142 us) above 95 us lower workgroups (fuzz
/// seed 50257): the drain and the job would fill more than half the
/// period, so the wide reservation is kept through the gaps (never saved
/// in steady state), not drained at every job.
#[test]
fn a_short_period_keeps_its_wide_reservation() {
    let (mut w, lo, hi) = rig(2791, 95_000);
    let (saves, reserved, back) = steady(&mut w, lo, hi, 142_000);
    assert!(reserved, "no reservation during a job");
    assert!(!back, "drained at a 142 us period");
    assert!(saves <= 1, "{saves} saves");
}

/// Fuzz seed 900112's shape: an owner of 912 whole-CU workgroups of 11.8
/// us (3 rounds alone, 6 on its 19 CUs per XCC, 71 us) every 145-200 us
/// above lower workgroups of 15 us. The job on the reservation fits half
/// the period but the job and the drain (86 us) do not; the gap after
/// them (59 us or more) is a break. The reservation is drained: the lower
/// queue is never saved in steady state, the owner has its reservation at
/// every job, and the lower work has every CU back late in every gap.
/// Fails with the drain asked to fit half the period too (the
/// reservation was then kept through every gap: best effort 0.489 of
/// alone).
#[test]
fn a_drain_beyond_half_the_period_still_drains_when_the_gap_breaks() {
    const W: u64 = 912;
    const S: Nanos = 11_832;
    let ring = |w: &mut World, hi: QueueId| {
        let j = match w.s.cu_reservation(0) {
            Some((vm, k)) if vm == w.vm_of[&hi] && k > 0 => W.div_ceil(k as u64 * 8) * S,
            _ => W.div_ceil(304) * S,
        };
        w.ring_job(hi, W, S, false, j);
    };
    for period in [145_000, 160_000, 200_000] {
        let (mut w, lo, hi) = rig(3248, 15_254);
        let mut t = w.now;
        for _ in 0..100 {
            ring(&mut w, hi);
            t += period;
            w.run_until(t);
        }
        let pre = w.s.vm_stats(VmId(0)).unwrap().preemptions;
        let (mut reserved, mut back) = (true, true);
        for _ in 0..100 {
            ring(&mut w, hi);
            w.run_until(t + 1);
            reserved &=
                w.s.cu_reservation(0)
                    .is_some_and(|(vm, k)| vm == VmId(1) && k > 0);
            w.run_until(t + period - 10_000);
            back &=
                w.state(lo) == QueueState::Running && w.s.slot_cu_set(w.mapped[&lo]) == CuSet::All;
            t += period;
            w.run_until(t);
        }
        let saves = w.s.vm_stats(VmId(0)).unwrap().preemptions - pre;
        let at = format!("period {period} ns");
        assert_eq!(saves, 0, "{at}: lower queue saved");
        assert!(reserved, "{at}: no reservation during a job");
        assert!(back, "{at}: reservation held through a gap");
    }
}

/// The gap test: a break is a gap whose double exceeds the anticipation
/// grace.
#[test]
fn a_drained_gap_breaks_beyond_the_grace() {
    use crate::engine::drained_gap_breaks;
    assert!(drained_gap_breaks(145_000, 86_000, 100_000));
    assert!(!drained_gap_breaks(142_000, 95_000, 100_000));
    assert!(!drained_gap_breaks(100_000, 120_000, 100_000));
}
