//! A periodic owner's gap is priced by the saves of the VMs that would run
//! in it (`engine/gap_price.rs`; fuzz seed 400058: one 3.5 ms save of a
//! `no_save_point` VM at the start raised the partition's average save,
//! the RT held every gap from then on, nothing was saved again, and an
//! unflagged flood whose saves take 19-34 us starved beside it). Virtual
//! time only.

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
/// The owner's width: four rounds of the partition (too wide for a
/// reservation, as `give_tests.rs`).
const WIDTH: u64 = 1216;
/// Its solo time: one round of its workgroups.
const SOLO: Nanos = 100_000;
/// Its job alone.
const JOB: Nanos = 400_000;
/// Its period: gaps of 1.1 ms, under the cost-aware hold's switch.
const PERIOD: Nanos = 1_500_000;
/// The flagged VM's wait for its own waves at each of its saves.
const NSP_WAIT: Nanos = 3_400_000;

/// A world with the geometry: VM 0 (priority 2) whose every save waits
/// [`NSP_WAIT`] for its waves without a save point, running alone for 1
/// ms; then, when `flood` is set, VM 1 (priority 3, saves of 50 us) comes
/// and preempts it (the flagged save is the partition's first); then the
/// wide periodic owner VM 2 (priority 12). Both lower VMs run whole-CU
/// workgroups of 10 ms (no co-residence, no drain). Returns the owner's
/// queue.
fn rig(flood: bool) -> (World, QueueId) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 4, 4));
    w.s.set_cu_geometry(CUS, 8);
    let flagged = w.vm(0, 2, 1, 1)[0];
    w.nsp_wait.insert(flagged, NSP_WAIT);
    w.ring_job(flagged, 1216, 10 * MS, false, 100_000 * MS);
    w.run_until(MS);
    if flood {
        let q = w.vm(1, 3, 1, 1)[0];
        w.ring_job(q, 1216, 10 * MS, false, 100_000 * MS);
        w.run_until(6 * MS);
        assert_eq!(
            w.s.vm_stats(VmId(0)).unwrap().preemptions,
            1,
            "the flood saves the flagged VM"
        );
    }
    let hi = w.vm(2, 12, 1, 1)[0];
    (w, hi)
}

/// Rings one job of the owner (one save longer when lower work holds the
/// partition at the ring, as `give_tests.rs`).
fn ring(w: &mut World, hi: QueueId) {
    let lower = w.mapped.keys().any(|q| w.vm_of[q] != w.vm_of[&hi]);
    w.ring_job(
        hi,
        WIDTH,
        SOLO,
        false,
        JOB + if lower { UNMAP_NS } else { 0 },
    );
}

/// Runs the owner for 60 periods (learning its gaps; the CWSR budget the
/// flagged save spent earns back), then returns VM 1's billed GPU time,
/// VM 0's preemptions and the owner's held time over the next 100.
fn steady(w: &mut World, hi: QueueId) -> (Nanos, u64, Nanos) {
    let mut t = w.now;
    let gpu = |w: &World, vm| w.s.vm_stats(VmId(vm)).map_or(0, |s| s.gpu_ns);
    for _ in 0..60 {
        ring(w, hi);
        t += PERIOD;
        w.run_until(t);
    }
    let g1 = gpu(w, 1);
    let p0 = w.s.vm_stats(VmId(0)).unwrap().preemptions;
    let held = w.s.vm_stats(VmId(2)).unwrap().held_ns;
    for _ in 0..100 {
        ring(w, hi);
        t += PERIOD;
        w.run_until(t);
    }
    (
        gpu(w, 1) - g1,
        w.s.vm_stats(VmId(0)).unwrap().preemptions - p0,
        w.s.vm_stats(VmId(2)).unwrap().held_ns - held,
    )
}

/// The flood's saves (50 us) price the gaps it runs in: most of the
/// owner's 1.1 ms gaps go to it (each given gap bills it at least the gap
/// less two switches), whatever the flagged VM below it once cost. With
/// the partition's average save as the price (3.4 ms of wait in it, never
/// lowered: nothing was saved again) every gap was held and the flood got
/// nothing. The flagged VM is not saved again by the gaps (it does not run
/// in them: the flood is above it).
#[test]
fn an_unflagged_vm_gets_the_gaps_a_flagged_vm_below_it_once_cost() {
    let (mut w, hi) = rig(true);
    let (gpu1, pre0, held) = steady(&mut w, hi);
    let gap = PERIOD - JOB;
    assert!(
        gpu1 >= 80 * (gap - 4 * UNMAP_NS),
        "the flood billed {gpu1} ns in 100 gaps of {gap} ns (held {held} ns)"
    );
    assert!(held <= 20 * gap, "held {held} ns of 100 gaps");
    assert_eq!(pre0, 0, "the flagged VM saved in the owner's gaps");
}

/// With the flagged VM alone below the owner, its own whole save (3.45
/// ms, more than the RT bound's allowance) prices the gaps: they stay
/// held, and it is not saved in steady state (it would cost the owner's
/// next job the whole wait).
#[test]
fn a_flagged_vm_alone_below_keeps_the_gaps_held() {
    let (mut w, hi) = rig(false);
    // Its one save, by the owner's first job.
    let (_gpu1, pre0, held) = steady(&mut w, hi);
    assert_eq!(pre0, 0, "the flagged VM saved in steady state");
    assert!(
        held >= 100 * (PERIOD - JOB - 2 * UNMAP_NS),
        "held {held} ns"
    );
}
