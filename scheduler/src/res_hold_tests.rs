//! A narrow periodic RT's CU reservation outlives gaps longer than
//! `spatial_hold_ns` when keeping it costs the lower work less than the
//! saves a lapse brings (issue 18, CWSR time beside RT;
//! `engine/res_hold.rs`): keeping `k` CUs per XCC costs a lock-step lower
//! kernel whole rounds when it no longer fits the rest of the partition,
//! and only the reserved CUs otherwise; a lapse costs one save and
//! restore of every lower queue per period.

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
/// The owner's solo time: one round of its workgroups.
const SOLO: Nanos = 6_000;
/// The owner's width: a few workgroups (1 or 2 CUs per XCC).
const OWNER_WIDTH: u64 = 10;

/// A world with the geometry, a busy lower VM (VM 0, priority 2, whole-CU
/// workgroups of 600 us: no co-residence, no drain) of `queues` busy
/// queues dispatching kernels of `widths` workgroups (in that order), and
/// a narrow RT owner (VM 1, priority 12). Returns (lower queues, owner
/// queue).
fn rig(queues: u32, widths: &[u64]) -> (World, Vec<QueueId>, QueueId) {
    rig_fits(queues, widths, false)
}

/// [`rig`] with the lower workgroups fitting half a CU (`fits`: its
/// queues' workgroups share CUs) or not.
fn rig_fits(queues: u32, widths: &[u64], fits: bool) -> (World, Vec<QueueId>, QueueId) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo = w.vm(0, 2, 1, queues);
    let hi = w.vm(1, 12, 1, 1)[0];
    for &q in &lo {
        for &wgs in widths {
            w.s.note_dispatch_width(q, wgs);
        }
        w.s.note_dispatch_occupancy(q, 600_000, fits);
        w.submit(q, 100_000 * MS);
    }
    w.run_until(MS);
    (w, lo, hi)
}

/// Rings one job of the owner.
fn ring(w: &mut World, hi: QueueId) {
    w.ring_job(hi, OWNER_WIDTH, SOLO, false, SOLO);
}

fn lower_preemptions(w: &World) -> u64 {
    w.s.vm_stats(VmId(0)).unwrap().preemptions
}

/// Runs 60 periods to learn the owner's gaps and the save, then returns
/// the lower VM's preemptions over the next 100 periods and whether the
/// reservation was in place 1.2 ms into every one of those gaps.
fn steady(w: &mut World, hi: QueueId, period: Nanos) -> (u64, bool) {
    let mut t = MS;
    for _ in 0..60 {
        ring(w, hi);
        t += period;
        w.run_until(t);
    }
    let pre = lower_preemptions(w);
    let mut held = true;
    for _ in 0..100 {
        ring(w, hi);
        w.run_until(t + 1_200_000);
        held &=
            w.s.cu_reservation(0)
                .is_some_and(|(vm, k)| vm == VmId(1) && k > 0);
        t += period;
        w.run_until(t);
    }
    (lower_preemptions(w) - pre, held)
}

/// Gaps of 1.5-3 ms, longer than `spatial_hold_ns` (1 ms) and than the
/// whole partition's cost-aware hold (a switch worth 10 x 2 x 50 us):
/// before, the reservation lapsed in every gap and each job saved the
/// lower work again (one preemption per queue and period: CWSR 13.2% of
/// fuzz seed 50079's run). Three busy lower queues fill the CUs a kernel's
/// last round leaves, so keeping 1-2 of 38 CUs per XCC costs them only
/// those CUs, far less than three saves and restores per period: in
/// steady state the reservation stays, the lower work is never saved and
/// runs (is billed) every ns.
#[test]
fn a_narrow_owner_keeps_its_reservation_beside_several_lower_queues() {
    for period in [1_500_000, 2_037_000, 3_000_000] {
        let (mut w, lo, hi) = rig(3, &[304]);
        let lo_gpu = w.gpu_ns(0);
        let (pre, held) = steady(&mut w, hi, period);
        assert_eq!(
            pre, 0,
            "every {period} ns: lower work saved in steady state"
        );
        assert!(held, "every {period} ns: the reservation lapsed in a gap");
        for &q in &lo {
            assert_eq!(w.state(q), QueueState::Running);
        }
        let (_, k) = w.s.cu_reservation(0).unwrap();
        assert_eq!(w.s.slot_cu_set(w.mapped[&lo[0]]), CuSet::AllBut(k));
        // Billed (running) every ns of the 160 periods but the first
        // setup saves.
        assert!(
            w.gpu_ns(0) - lo_gpu >= 159 * period,
            "{}",
            w.gpu_ns(0) - lo_gpu
        );
    }
}

/// One busy lower queue whose kernels are as wide as the partition (304
/// workgroups): on the 296 or 288 CUs a reservation leaves, each kernel
/// runs two lock-step rounds instead of one, half its throughput for the
/// whole gap, while a lapse costs it one save and restore per period. So
/// the reservation lapses in the gaps (every CU back to the lower work)
/// and each job sets it up again with a save, as before.
#[test]
fn a_lone_lock_step_lower_kernel_gets_every_cu_back_in_the_gaps() {
    let (mut w, lo, hi) = rig(1, &[304]);
    let (pre, held) = steady(&mut w, hi, 2_037_000);
    assert!(
        !held,
        "kept through gaps that cost the lower kernel a round"
    );
    assert!(pre >= 90, "{pre} saves in 100 periods");
    assert_eq!(w.s.cu_reservation(0), None);
    assert_eq!(w.s.slot_cu_set(w.mapped[&lo[0]]), CuSet::All);
}

/// Two busy lower queues of 304 workgroups that fit half a CU run in
/// phase, one's workgroups beside the other's: together one lock-step
/// kernel of 608 workgroups, two rounds' time on 304 CUs and three on the
/// 296 a reservation leaves (a third of their throughput). So, as for one
/// lone queue, the reservation lapses in the gaps; with whole-CU
/// workgroups the same two queues fill each other's last rounds and keep
/// it (before, the queue count alone decided: fuzz seed 50148's lower VM
/// kept 0.650 of alone).
#[test]
fn lower_queues_that_share_cus_lose_rounds_together() {
    let (mut w, lo, hi) = rig_fits(2, &[304], true);
    let (pre, held) = steady(&mut w, hi, 2_037_000);
    assert!(
        !held,
        "kept through gaps that cost the lower queues a round"
    );
    assert!(pre >= 90, "{pre} saves in 100 periods");
    assert_eq!(w.s.slot_cu_set(w.mapped[&lo[0]]), CuSet::All);
    let (mut w, _, hi) = rig_fits(2, &[304], false);
    let (pre, held) = steady(&mut w, hi, 2_037_000);
    assert!(held, "whole-CU queues: the reservation lapsed in a gap");
    assert_eq!(pre, 0, "whole-CU queues saved in steady state");
}

/// The same lone lower queue with kernels of 200 workgroups fits the rest
/// of the partition in the same one round: keeping the reservation costs
/// it only the reserved CUs, less than the save and restore of a lapse
/// every 1.5 ms, so it is kept: the queue count does not decide, the
/// rounds do.
#[test]
fn a_lone_lower_kernel_that_fits_the_rest_keeps_running_beside_it() {
    let (mut w, lo, hi) = rig(1, &[200]);
    let (pre, held) = steady(&mut w, hi, 1_500_000);
    assert_eq!(pre, 0, "lower work saved in steady state");
    assert!(held, "the reservation lapsed in a gap");
    assert_eq!(w.state(lo[0]), QueueState::Running);
}

/// Gaps long against the saves a lapse costs (200 ms against three saves
/// and restores x 38 / k): the reservation lapses after
/// `spatial_hold_ns` and the lower work gets every CU back between jobs.
#[test]
fn a_rare_owner_lets_its_reservation_lapse() {
    let (mut w, lo, hi) = rig(3, &[304]);
    let period = 200 * MS;
    let mut t = MS;
    for _ in 0..8 {
        ring(&mut w, hi);
        w.run_until(t + 2 * MS);
        assert_eq!(w.s.cu_reservation(0), None, "held through a 200 ms gap");
        assert_eq!(w.s.slot_cu_set(w.mapped[&lo[0]]), CuSet::All);
        t += period;
        w.run_until(t);
    }
}
