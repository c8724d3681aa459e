//! A wide owner's reservation set up with a save where the drain leaves it
//! none (issue 18, `3-cwsr-time` beside a wide RT; `engine/wide_save.rs`).
//! Fuzz seed 500045: the drain of 226 us lower workgroups took 226 of the
//! 240 us allowance, no reservation within the width cap met the RT's
//! bound behind it, and every job of the RT saved the lower work (21.2% of
//! the run in CWSR). Virtual time only.

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
/// The owner's width: the whole partition (wider than the width cap).
const WIDTH: u64 = 304;
/// Its solo time: one round of its workgroups.
const SOLO: Nanos = 7_000;

/// A world with the geometry, a busy lower VM (VM 0, priority 2) of
/// `queues` queues of lock-step kernels of 1000 whole-CU workgroups (4
/// rounds on the partition and beside a reservation of up to 4 CUs per
/// XCC), 4 ms of solo time per doorbell and workgroups of at most
/// `longest`, and the wide owner (VM 1, priority 12).
fn rig(queues: u32, longest: Nanos) -> (World, QueueId, QueueId) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let los = w.vm(0, 2, 1, queues);
    let hi = w.vm(1, 12, 1, 1)[0];
    for &lo in &los {
        w.s.note_dispatch_width(lo, 1000);
        w.s.note_dispatch_occupancy(lo, 4 * MS, false);
        w.s.note_dispatch_longest_wg(lo, longest, 0);
        w.submit(lo, 100_000 * MS);
    }
    w.run_until(MS);
    (w, los[0], hi)
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

/// Three lower queues (fuzz seed 500045's shape) of workgroups of 236-239
/// us, within the 240 us allowance: their drain leaves the owner 1-4 us,
/// and its job of one 7 us round would need the whole XCC behind it
/// (beyond the cap of 19). With a save of the lower work instead (50 us
/// here), 2 CUs per XCC meet its bound (19 rounds, 133 us, within `1.1 x
/// 7 + 190` us), and in 3 ms periods the reservation is kept through the
/// gaps (`wide_keep.rs`: three saves and restores are worth more than
/// 2/38 of the lower work for a gap): the owner holds it at every job of
/// 100 periods, and the lower VM is saved at most six times in them. With
/// the rule disabled the owner has none and saves the three queues at
/// every job.
#[test]
fn a_drain_that_leaves_no_reservation_is_a_save() {
    for longest in [236_000, 239_000] {
        let (mut w, lo, hi) = rig(3, longest);
        let (saves, reserved, _) = super::drained_res_tests::steady_periods(
            &mut w,
            (lo, hi),
            3 * MS,
            (MS, 100),
            0,
            ring,
            |r| r.is_none_or(|(vm, _)| vm != VmId(1)),
        );
        let at = format!("workgroup {longest} ns");
        assert!(reserved, "{at}: no reservation during a job");
        assert!(
            saves <= 6,
            "{at}: lower VM saved {saves} times in 100 periods"
        );
    }
}

/// The control: lower workgroups of 83 us drain within the allowance and
/// leave the owner a reservation: drained as before (`wide_drain.rs`),
/// never saved in steady state.
#[test]
fn a_drain_that_leaves_a_reservation_stays_a_drain() {
    let (mut w, lo, hi) = rig(1, 83_000);
    let (saves, reserved, back) = super::drained_res_tests::steady_periods(
        &mut w,
        (lo, hi),
        964_000,
        (MS, 100),
        0,
        ring,
        |r| r.is_none_or(|(vm, _)| vm != VmId(1)),
    );
    assert_eq!(saves, 0, "lower queue saved");
    assert!(reserved, "no reservation during a job");
    assert!(back, "drained reservation held through a gap");
}
