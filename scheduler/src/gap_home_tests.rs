//! An owner's reserved CUs kept as its idle queues' CU set through its gap
//! (issue 18, `engine/gap_home.rs`): a mapped queue's doorbell reaches the
//! GPU before the scheduler, so its job's first kernel is placed on the
//! set the queue has in its gap; with the whole partition there it went
//! where the lower work is restored after the reservation's save and was
//! shared with it (fuzz seed 700010: a 170 us kernel ran 302 us).

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
/// The owner's solo time: one round of its workgroups.
const SOLO: Nanos = 6_000;
/// The owner's width: a few workgroups (1 or 2 CUs per XCC).
const OWNER_WIDTH: u64 = 10;

/// A busy lower VM (VM 0, priority 2) of one queue of lock-step kernels as
/// wide as the partition (304 whole-CU workgroups of 600 us: a kept
/// reservation would cost each kernel a round, so it lapses in the gaps,
/// `engine/res_hold.rs`) and a narrow periodic owner (VM 1, priority 12).
fn rig() -> (World, QueueId, QueueId) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo = w.vm(0, 2, 1, 1)[0];
    let hi = w.vm(1, 12, 1, 1)[0];
    w.s.note_dispatch_width(lo, 304);
    w.s.note_dispatch_occupancy(lo, 600_000, false);
    w.submit(lo, 100_000 * MS);
    w.run_until(MS);
    (w, lo, hi)
}

/// In every gap the reservation has lapsed and the lower queue has every
/// CU back, but the owner's idle mapped queue keeps the CUs its
/// reservation had (`Top(k)`), where its next doorbell places the first
/// kernel; during its jobs the sets are the reservation's as before.
/// Fails without the home: the owner's set in the gap is `All`.
#[test]
fn an_owner_keeps_its_reserved_cus_as_its_set_through_its_gap() {
    let (mut w, lo, hi) = rig();
    let period = 2_037_000;
    let mut t = MS;
    let mut gaps = 0;
    for _ in 0..40 {
        w.ring_job(hi, OWNER_WIDTH, SOLO, false, SOLO);
        let during = w.s.cu_reservation(0);
        w.run_until(t + 1_200_000);
        let gap = w.s.cu_reservation(0);
        if let (Some((vm, k)), None) = (during, gap) {
            assert_eq!(vm, VmId(1));
            assert!(k > 0);
            assert_eq!(w.state(hi), QueueState::MappedIdle);
            assert_eq!(w.s.slot_cu_set(w.mapped[&hi]), CuSet::Top(k));
            assert_eq!(w.s.slot_cu_set(w.mapped[&lo]), CuSet::All);
            gaps += 1;
        }
        t += period;
        w.run_until(t);
    }
    assert!(gaps >= 10, "{gaps} gaps without the reservation");
}
