//! No co-residence beside a lower VM whose saves wait longer than the
//! allowance for its waves without a save point (`engine/nsp_coreside.rs`;
//! fuzz seed 600053). Virtual time only.

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
/// The flagged VM's wait for its own waves at each of its saves (longer
/// than the allowance, one save and restore).
const NSP_WAIT: Nanos = 3 * MS;

/// VM 0 (priority 2, one queue of half-CU workgroups over every CU, its
/// saves waiting `nsp_wait`) busy below VM 1 (priority 12). VM 1's first
/// job is too long to co-reside (600 us alone): it takes a reservation
/// with a save of VM 0 (the one wait). Then 50 short narrow jobs of VM 1
/// (20 us, half-CU workgroups, one every 200 us), each of which
/// co-resides beside an unflagged VM (`spatial_tests.rs`,
/// `a_short_narrow_high_vm_coresides_without_a_save`). Returns the world
/// and the two queues.
fn rig(nsp_wait: Nanos) -> (World, QueueId, QueueId) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo = w.vm(0, 2, 1, 1)[0];
    let hi = w.vm(1, 12, 1, 1)[0];
    if nsp_wait > 0 {
        w.nsp_wait.insert(lo, nsp_wait);
    }
    w.s.note_dispatch_width(lo, 304);
    w.s.note_dispatch_occupancy(lo, 10 * MS, true);
    w.submit(lo, 1000 * MS);
    w.run_until(MS);
    w.s.note_dispatch_width(hi, 1);
    w.s.note_dispatch_occupancy(hi, 600_000, true);
    w.submit(hi, 600_000);
    w.run_until(6 * MS);
    assert_eq!(
        w.s.vm_stats(VmId(0)).unwrap().preemptions,
        1,
        "the long job saves the lower VM once"
    );
    for i in 0..50 {
        w.s.note_dispatch_width(hi, 1);
        w.s.note_dispatch_occupancy(hi, 20_000, true);
        w.submit(hi, 20_000);
        w.run_until(6 * MS + (i + 1) * 200_000);
    }
    (w, lo, hi)
}

/// Beside the flagged VM, whose one save waited 3 ms, the short jobs do
/// not co-reside: sharing its CUs would leave them waiting for its waves
/// (and the co-residence deadline's save would wait for them too). The
/// owner keeps a reservation held across its gaps; the flagged VM runs on
/// the other CUs and is not saved at every job. (With the rule disabled:
/// 34 co-residences.)
#[test]
fn no_coresidence_beside_waves_a_save_waits_for() {
    let (w, lo, hi) = rig(NSP_WAIT);
    assert_eq!(w.s.spatial_stats().coresidences, 0);
    // Its saves: the long job's (the one wait) and one more while the
    // reservation took its short jobs' size; not one per job.
    assert!(w.s.vm_stats(VmId(0)).unwrap().preemptions <= 2);
    assert!(matches!(w.s.cu_reservation(0), Some((VmId(1), k)) if k > 0));
    assert_eq!(w.state(lo), QueueState::Running);
    assert!(matches!(w.s.slot_cu_set(w.mapped[&lo]), CuSet::AllBut(_)));
    assert!(matches!(w.s.slot_cu_set(w.mapped[&hi]), CuSet::Top(_)));
}

/// Guard: the same rig without the flag co-resides once the long job is
/// over (the rule keys on the recorded wait, not on the first save).
#[test]
fn an_unflagged_vm_below_still_coresides() {
    let (w, _, _) = rig(0);
    assert!(w.s.spatial_stats().coresidences > 0);
}
