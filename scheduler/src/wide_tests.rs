//! Wide periodic owners keep CUs, not the partition (issue 18, best effort
//! beside RT; `engine/wide.rs`): an owner wider than the width cap whose
//! gaps the cost-aware hold would hold the whole partition through gets a
//! reservation sized by the RT bound and its load instead, kept across its
//! gaps; a closed loop, whose period stretches under it, and a backlogged
//! owner do not keep one.

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
/// The owner's width: the whole partition.
const WIDTH: u64 = 304;
/// Its solo time: one round of its workgroups.
const SOLO: Nanos = 4_000;

/// A world with the geometry and a busy lower VM (VM 0, priority 2,
/// whole-CU workgroups of 10 ms: no co-residence, no drain) and the wide
/// owner (VM 1, priority 12). Returns (lower queue, owner queue).
fn rig() -> (World, QueueId, QueueId) {
    lockstep_lower_and_owner(CUS)
}

/// The owner's job as the fake GPU runs it: one round on the whole
/// partition, `ceil(WIDTH / (k x 8))` rounds on a reservation of `k` CUs
/// per XCC (the fake GPU does not model CU masks, so the test stretches
/// the job itself).
fn job(w: &World, hi: QueueId) -> Nanos {
    match w.s.cu_reservation(0) {
        Some((vm, k)) if vm == w.vm_of[&hi] && k > 0 => WIDTH.div_ceil(k as u64 * 8) * SOLO,
        _ => SOLO,
    }
}

/// Rings one job of the owner with its width and occupancy.
fn ring(w: &mut World, hi: QueueId) {
    w.s.note_dispatch_width(hi, WIDTH);
    w.s.note_dispatch_occupancy(hi, SOLO, false);
    let j = job(w, hi);
    w.submit(hi, j);
}

fn lower_preemptions(w: &World) -> u64 {
    w.s.vm_stats(VmId(0)).unwrap().preemptions
}

/// A periodic owner (345 us period) as wide as the partition with 4 us
/// jobs: its gaps are short against a switch's worth (10 x 2 x 50 us), so
/// the cost-aware hold alone kept the whole partition idle through every
/// gap (best effort ~0). Now it holds a reservation of 1 CU per XCC (the
/// RT bound: 38 rounds of 4 us = 152 us against 1.1 x 4 + 240 - 50, the
/// allowance less the save it waits; 152 us is also within half its
/// period), kept across
/// its gaps: in steady state the lower work runs beside it, is never saved
/// and gets all but the reserved CUs' share of the time, and nothing is
/// held idle or billed as held.
#[test]
fn a_wide_periodic_owner_keeps_cus_not_the_partition() {
    let (mut w, lo, hi) = rig();
    let period = 345_000;
    let mut t = MS;
    for _ in 0..100 {
        ring(&mut w, hi);
        t += period;
        w.run_until(t);
    }
    let (pre, lo_gpu, held) = (
        lower_preemptions(&w),
        w.gpu_ns(0),
        w.s.vm_stats(VmId(1)).unwrap().held_ns,
    );
    for _ in 0..100 {
        ring(&mut w, hi);
        assert_eq!(w.state(lo), QueueState::Running);
        assert_eq!(w.s.slot_cu_set(w.mapped[&lo]), CuSet::AllBut(1));
        assert_eq!(w.s.slot_cu_set(w.mapped[&hi]), CuSet::Top(1));
        t += period;
        w.run_until(t);
    }
    assert_eq!(w.s.cu_reservation(0), Some((VmId(1), 1)));
    assert_eq!(
        lower_preemptions(&w),
        pre,
        "lower work saved in steady state"
    );
    assert_eq!(w.s.vm_stats(VmId(1)).unwrap().held_ns, held);
    // The lower VM is billed every ns of the 100 periods (it runs beside).
    assert!(
        w.gpu_ns(0) - lo_gpu >= 99 * period,
        "{}",
        w.gpu_ns(0) - lo_gpu
    );
}

/// A wide periodic owner whose period is short against its job on the
/// latency-sized reservation gets more CUs: its job takes at most half its
/// period (a 150 us period: 13 rounds of 4 us = 52 us on 3 CUs per XCC,
/// where the RT bound alone would give 1 and a 152 us job).
#[test]
fn the_reservation_carries_the_owners_load() {
    let (mut w, _lo, hi) = rig();
    let period = 150_000;
    let mut t = MS;
    for _ in 0..200 {
        ring(&mut w, hi);
        t += period;
        w.run_until(t);
    }
    let (_, k) = w.s.cu_reservation(0).expect("a reservation");
    assert_eq!(k, 3);
    assert!(WIDTH.div_ceil(k as u64 * 8) * SOLO <= period / 2);
}

/// A closed loop (300 us think) as wide as the partition: its period
/// stretches under the reservation (each job 19 rounds instead of one, a
/// 24% longer cycle: its throughput, item 1), so it keeps the whole
/// partition (the cost-aware hold, billed) and runs at full speed, but for
/// a retry of at most three cycles (the setup, one measured, and the one
/// whose ring finds it still held) per `RETRY_CYCLES` (64) cycles on the
/// whole partition.
#[test]
fn a_closed_loop_whose_period_stretches_keeps_the_partition() {
    let (mut w, _lo, hi) = rig();
    let think = 300_000;
    for _ in 0..200 {
        ring(&mut w, hi);
        // Until its job ends (a save of the lower work at most first).
        let end = w.run_until_done(hi, 10_000);
        w.run_until(end + think);
    }
    let held = w.s.vm_stats(VmId(1)).unwrap().held_ns;
    let n = 200;
    let mut wide = 0;
    for _ in 0..n {
        let on_wide =
            w.s.cu_reservation(0)
                .is_some_and(|(vm, k)| vm == VmId(1) && k > 0);
        ring(&mut w, hi);
        // A retry's setup cycle (the reservation made at this ring).
        let on_wide = on_wide
            || w.s
                .cu_reservation(0)
                .is_some_and(|(vm, k)| vm == VmId(1) && k > 0);
        wide += u64::from(on_wide);
        let start = w.now;
        let end = w.run_until_done(hi, 1_000);
        if !on_wide {
            // Full speed: one round after at most a save and restore.
            assert!(
                end - start <= SOLO + 2 * UNMAP_NS + 1_000,
                "{}",
                end - start
            );
        }
        w.run_until(end + think);
    }
    assert!(
        wide <= 3 * (n / 64 + 1),
        "{wide} of {n} cycles on a wide reservation"
    );
    assert!(
        w.s.vm_stats(VmId(1)).unwrap().held_ns > held,
        "the hold applies"
    );
}
