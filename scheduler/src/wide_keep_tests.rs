//! A wide reservation where the whole partition's hold gives the gaps away
//! (issue 18, CWSR beside RT; `engine/wide_keep.rs`): a periodic owner as
//! wide as the partition whose gaps are longer than a switch's worth of
//! idle time (10 x save and restore) used to save every lower queue at each
//! of its jobs; now it gets a latency-sized reservation wherever keeping it
//! through the gaps costs the lower work less than those saves, and not
//! where a lone lock-step lower kernel would lose a round to it.

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
/// The owner's width: the whole partition.
const WIDTH: u64 = 304;
/// Its solo time: one round of its workgroups.
const SOLO: Nanos = 4_000;

/// A world with the geometry, a busy lower VM (VM 0, priority 2) of
/// `queues` queues of `width` whole-CU workgroups of 10 ms (no
/// co-residence, no drain) and the wide owner (VM 1, priority 12).
/// Returns (lower queues, owner queue).
fn rig(queues: u32, width: u64) -> (World, Vec<QueueId>, QueueId) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo = w.vm(0, 2, 1, queues);
    let hi = w.vm(1, 12, 1, 1)[0];
    for &q in &lo {
        w.s.note_dispatch_width(q, width);
        w.s.note_dispatch_occupancy(q, 10 * MS, false);
        w.submit(q, 100_000 * MS);
    }
    w.run_until(MS);
    (w, lo, hi)
}

/// The owner's job as the fake GPU runs it: one round on the whole
/// partition, `ceil(WIDTH / (k x 8))` rounds on a reservation of `k` CUs
/// per XCC (the fake GPU does not model CU masks).
fn ring(w: &mut World, hi: QueueId) {
    w.s.note_dispatch_width(hi, WIDTH);
    w.s.note_dispatch_occupancy(hi, SOLO, false);
    let j = match w.s.cu_reservation(0) {
        Some((vm, k)) if vm == w.vm_of[&hi] && k > 0 => WIDTH.div_ceil(k as u64 * 8) * SOLO,
        _ => SOLO,
    };
    w.submit(hi, j);
}

fn lower_preemptions(w: &World) -> u64 {
    w.s.vm_stats(VmId(0)).unwrap().preemptions
}

/// Runs `n` periods of the owner; returns the lower VM's preemptions in
/// the last half and whether the owner held a reservation at each of its
/// last-half rings.
fn periods(w: &mut World, hi: QueueId, period: Nanos, n: u32) -> (u64, bool) {
    let mut t = w.now;
    let mut pre = 0;
    let mut reserved = true;
    for i in 0..n {
        if i == n / 2 {
            pre = lower_preemptions(w);
        }
        ring(w, hi);
        if i >= n / 2 {
            reserved &=
                w.s.cu_reservation(0)
                    .is_some_and(|(vm, k)| vm == VmId(1) && k > 0);
        }
        t += period;
        w.run_until(t);
    }
    (lower_preemptions(w) - pre, reserved)
}

/// Periods of 1.2-1.9 ms (gaps longer than the whole partition's switch
/// worth, 10 x 100 us: that hold gives them away) above 2-3 lower queues
/// of whole-CU workgroups (each saved at every job before: 2-3 x 100 us
/// of CWSR per period, 11-25%): the owner keeps a reservation of a few
/// CUs per XCC (keeping it costs the lower work `k / 38` of its
/// throughput, under the saves' worth), and in steady state the lower work
/// is never saved and runs through every period.
#[test]
fn a_wide_owner_with_given_gaps_keeps_cus_instead_of_saving_per_period() {
    for queues in [2, 3] {
        for period in [1_200_000, 1_500_000, 1_900_000] {
            let (mut w, lo, hi) = rig(queues, 1216);
            let (saves, reserved) = periods(&mut w, hi, period, 200);
            assert!(reserved, "{queues} queues, period {period}: no reservation");
            assert_eq!(saves, 0, "{queues} queues, period {period}");
            for &q in &lo {
                assert_eq!(w.state(q), QueueState::Running);
            }
        }
    }
}

/// A lone lower kernel of 304 whole-CU workgroups runs in one lock-step
/// round on the whole partition and in two beside any reservation: keeping
/// one through a 1.5 ms gap would cost it half its throughput (750 us of
/// its time) against one save and restore (100 us), so the owner gets none
/// and its jobs run on the whole partition, one save of the lower queue
/// each.
#[test]
fn no_wide_reservation_where_keeping_it_costs_the_lower_work_a_round() {
    let (mut w, _lo, hi) = rig(1, 304);
    let (saves, _) = periods(&mut w, hi, 1_500_000, 200);
    assert!(
        w.s.cu_reservation(0)
            .is_none_or(|(vm, k)| vm != VmId(1) || k == 0),
        "{:?}",
        w.s.cu_reservation(0)
    );
    assert!(saves >= 90, "{saves} saves in 100 periods");
}
