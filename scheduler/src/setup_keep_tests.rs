//! A reservation keeps its CUs while the save that sets it up is in flight
//! (issue 18, `engine/setup_keep.rs`): a decision taken while the only
//! lower work is being dequeued found no busy lower queue, dropped the
//! owner's new reservation and gave the owner every CU, so its kernel
//! started on CUs outside its reservation, where the lower work restored
//! beside it later shared them (fuzz seed 800135: RT p99 2793 us against
//! 2678).

use super::res_keep_tests::rig;
use super::*;

/// The higher VM's job: its reservation is set up with a save of the
/// lower VM (50 us in this world), and it decides again in that save.
const HI_WORK: Nanos = 400_000;

/// Ring the higher VM's job over the busy lower VM; 10 us into the lower
/// VM's save, a second doorbell of the higher VM makes another decision.
/// Through the save the reservation stays the higher VM's, of the same
/// size, and its queue keeps the reserved CUs (not every CU); when the
/// save ends the lower VM runs again beside it.
#[test]
fn a_reservation_keeps_its_cus_while_its_set_up_save_is_in_flight() {
    let (mut w, lo, hi, _mid) = rig();
    w.ring_job(hi, 10, HI_WORK, false, HI_WORK);
    let (vm, k) =
        w.s.cu_reservation(0)
            .expect("a reservation at the doorbell");
    assert_eq!(vm, VmId(1));
    assert!(k > 0);
    assert_eq!(
        w.state(lo),
        QueueState::Preempting,
        "the set-up saves the lower VM"
    );
    let slot = w.mapped[&hi];
    let set = w.s.slot_cu_set(slot);
    assert_ne!(set, CuSet::All);
    // A decision while the save is in flight.
    w.run_until(MS + 10_000);
    w.submit(hi, 10_000);
    assert_eq!(w.state(lo), QueueState::Preempting);
    assert_eq!(
        w.s.cu_reservation(0),
        Some((VmId(1), k)),
        "the reservation was dropped while its set-up save was in flight"
    );
    assert_eq!(
        w.s.slot_cu_set(slot),
        set,
        "the owner's CUs changed in the save"
    );
    // The save ends: the lower VM runs beside the same reservation.
    w.run_until(MS + 100_000);
    assert_eq!(w.s.cu_reservation(0), Some((VmId(1), k)));
    assert_eq!(w.s.slot_cu_set(slot), set);
    assert_eq!(w.state(lo), QueueState::Running);
}

/// With lower work still busy (a lower VM running beside the owner) the
/// plan is the ordinary one: the rule keeps nothing by itself, and once
/// the owner's job ends and its reservation lapses, the lower VM has the
/// partition again.
#[test]
fn the_kept_reservation_ends_with_the_owners_job() {
    let (mut w, lo, hi, _mid) = rig();
    w.ring_job(hi, 10, HI_WORK, false, HI_WORK);
    w.run_until(MS + 10_000);
    w.submit(hi, 10_000);
    w.run_until(MS + HI_WORK + 50 * MS);
    assert_eq!(w.state(lo), QueueState::Running);
    assert_eq!(w.s.cu_reservation(0), None);
}
