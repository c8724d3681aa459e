//! A drain waits for the lower VM's longest workgroup, not for the sum of
//! a doorbell's packets (issue 18, `3-be-retained` beside RT;
//! `Spatial::drain_wait`). Fuzz seed 50129: a lone lower closed loop rang
//! 4 jobs of 6 kernels of 33-50 us workgroups at once, 1 ms of solo time,
//! so its queue was taken for work longer than one save and restore:
//! the RT's reservation was set up with a save and then held through its
//! 1.15 ms gaps by the save-priced holds, and the lower 912-workgroup
//! kernel ran 4 rounds instead of 3 for the whole run (0.856 of alone).
//! A drained reservation is set up without a save and ends with its
//! owner's job. Virtual time only.

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
/// The owner's solo time: one round of its workgroups.
const SOLO: Nanos = 30_000;
/// The owner's width: 1-2 CUs per XCC.
const OWNER_WIDTH: u64 = 10;

/// A world with the geometry, a busy lone lower queue (VM 0, priority 2)
/// of lock-step kernels of `width` whole-CU workgroups whose doorbells
/// carry `solo` of solo time and whose longest workgroup is `longest`
/// (0: not reported), and a narrow RT owner (VM 1, priority 12).
fn rig(width: u64, solo: Nanos, longest: Nanos) -> (World, QueueId, QueueId) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo = w.vm(0, 2, 1, 1)[0];
    let hi = w.vm(1, 12, 1, 1)[0];
    w.s.note_dispatch_width(lo, width);
    w.s.note_dispatch_occupancy(lo, solo, false);
    if longest > 0 {
        w.s.note_dispatch_longest_wg(lo, longest, 0);
    }
    w.submit(lo, 100_000 * MS);
    w.run_until(MS);
    (w, lo, hi)
}

/// Rings one job of the owner.
fn ring(w: &mut World, hi: QueueId) {
    w.ring_job(hi, OWNER_WIDTH, SOLO, false, SOLO);
}

/// What 100 periods of `period` do after 60 to learn the gaps: the lower
/// queue's saves, whether a reservation was in place during every job,
/// and whether the lower queue had every CU back halfway through every
/// gap.
fn steady(w: &mut World, lo: QueueId, hi: QueueId, period: Nanos) -> (u64, bool, bool) {
    let start = MS;
    steady_periods(w, (lo, hi), period, (start, 60), SOLO / 2, ring, |r| {
        r.is_none()
    })
}

/// `learn` periods of `period` from `start` (each rings the owner `hi`
/// with `ring`), then 100 more: the lower queue `lo`'s saves in those,
/// whether the owner (VM 1) held a reservation `probe` after every ring,
/// and whether halfway through every gap the
/// reservation was gone by `gone` and `lo` ran on every CU.
pub(super) fn steady_periods(
    w: &mut World,
    (lo, hi): (QueueId, QueueId),
    period: Nanos,
    (start, learn): (Nanos, usize),
    probe: Nanos,
    ring: impl Fn(&mut World, QueueId),
    gone: impl Fn(Option<(VmId, u32)>) -> bool,
) -> (u64, bool, bool) {
    let mut t = start;
    for _ in 0..learn {
        ring(w, hi);
        t += period;
        w.run_until(t);
    }
    let pre = w.s.vm_stats(VmId(0)).unwrap().preemptions;
    let (mut reserved, mut back) = (true, true);
    for _ in 0..100 {
        ring(w, hi);
        w.run_until(t + probe);
        reserved &=
            w.s.cu_reservation(0)
                .is_some_and(|(vm, k)| vm == VmId(1) && k > 0);
        w.run_until(t + period / 2);
        back &= gone(w.s.cu_reservation(0))
            && w.state(lo) == QueueState::Running
            && w.s.slot_cu_set(w.mapped[&lo]) == CuSet::All;
        t += period;
        w.run_until(t);
    }
    (
        w.s.vm_stats(VmId(0)).unwrap().preemptions - pre,
        reserved,
        back,
    )
}

/// Lone lock-step lower kernels (304 or 912 workgroups: one CU per XCC
/// costs them a round) whose workgroups of 10-200 us end within the
/// allowance (240 us) but whose doorbells carry 4 ms of solo time, under
/// RT periods of 0.5-3 ms: never saved, a reservation during every RT job
/// (drained), and every CU back to the lower work in every gap. Fails
/// with the doorbell's sum as the drain bound (each job then saves the
/// lower queue; from 1 ms the reservation is held through the gaps).
#[test]
fn short_lower_workgroups_drain_whatever_a_doorbell_sums() {
    for width in [304, 912] {
        for longest in [10_000, 50_000, 200_000] {
            for period in [500_000, 1_331_000, 3_000_000] {
                let (mut w, lo, hi) = rig(width, 4 * MS, longest);
                let (saves, reserved, back) = steady(&mut w, lo, hi, period);
                let at = format!("width {width}, workgroup {longest} ns, period {period} ns");
                assert_eq!(saves, 0, "{at}: lower queue saved");
                assert!(reserved, "{at}: no reservation during a job");
                assert!(back, "{at}: reservation held through a gap");
            }
        }
    }
}

/// The controls: lower workgroups longer than the allowance (300 us), or
/// no longest workgroup reported and 4 ms of solo time per doorbell,
/// cannot be drained: each RT job saves the lone lower queue (as before).
#[test]
fn lower_work_that_cannot_drain_is_saved() {
    for (solo, longest) in [(4 * MS, 300_000), (4 * MS, 0)] {
        let (mut w, lo, hi) = rig(304, solo, longest);
        let (saves, _, _) = steady(&mut w, lo, hi, 2_037_000);
        assert!(saves >= 90, "solo {solo}, longest {longest}: {saves} saves");
    }
}

/// A drain waits for every lower VM that may hold the CUs when a job of
/// the owner comes (docs/scheduling.md, "A drain waits for every lower VM
/// that may hold the CUs"): beside the drainable lower queue, a starved VM
/// (priority 1) whose queue waits, which an aging batch runs in the
/// owner's gaps. With workgroups of 1 ms it cannot drain (fuzz seed 97138:
/// the RT's drained reservation left nothing for the batch to keep,
/// `batch_res.rs`, and each RT job paused the batch with a save until its
/// yield allowance ran out: p99 1138 us against 460): the reservation is
/// set up with a save of the lower queue or held through the gaps, never
/// drained. With workgroups of 20 us it drains as before (every CU back in
/// every gap, the lower queue never saved).
#[test]
fn a_drain_waits_for_starved_work_an_aging_batch_may_run() {
    for longest in [10_000, 50_000, 200_000] {
        for period in [500_000, 1_331_000] {
            for (starved_wg, drains) in [(MS, false), (20_000, true)] {
                let (mut w, lo, hi) = rig(304, 4 * MS, longest);
                let starved = w.vm(2, 1, 1, 1)[0];
                w.s.note_dispatch_width(starved, 304);
                w.s.note_dispatch_occupancy(starved, starved_wg, false);
                w.s.note_dispatch_longest_wg(starved, starved_wg, 0);
                w.submit(starved, 100_000 * MS);
                let (saves, reserved, back) = steady(&mut w, lo, hi, period);
                let at = format!(
                    "workgroup {longest} ns, period {period} ns, starved workgroup {starved_wg} ns"
                );
                assert!(reserved, "{at}: no reservation during a job");
                let drained = saves == 0 && back;
                assert_eq!(
                    drained, drains,
                    "{at}: {saves} saves, back in every gap {back}"
                );
            }
        }
    }
}
