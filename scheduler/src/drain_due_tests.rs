//! A drain that overruns (`engine/drain_due.rs`, docs/scheduling.md "A
//! drain that overruns"): a drained reservation's lower workgroups must
//! end within twice the wait it was set up with. The caller reports the
//! lower queues still on the reserved CUs at that deadline; each is saved
//! and its VM not drained again before its demand ends. Virtual time only.

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
/// The lower VM's longest workgroup as its doorbells report it (the
/// default shape).
const LONGEST: Nanos = 50_000;
/// The owner's solo time and width (1-2 CUs per XCC: the default shape).
const SOLO: Nanos = 30_000;
const OWNER_WIDTH: u64 = 10;

/// A busy lone lower queue (VM 0, priority 2) of 304-workgroup kernels
/// whose workgroups take `LONGEST`, and an RT owner (VM 1, priority 12)
/// of `OWNER_WIDTH` whose first job, of `job` ns, is rung at 1 ms.
fn rig(job: Nanos) -> (World, QueueId, QueueId) {
    rig_shaped(job, LONGEST, OWNER_WIDTH)
}

fn rig_shaped(job: Nanos, longest: Nanos, width: u64) -> (World, QueueId, QueueId) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo = w.vm(0, 2, 1, 1)[0];
    let hi = w.vm(1, 12, 1, 1)[0];
    w.s.note_dispatch_width(lo, 304);
    w.s.note_dispatch_occupancy(lo, longest, false);
    w.s.note_dispatch_longest_wg(lo, longest, 0);
    w.submit(lo, 100_000 * MS);
    w.run_until(MS);
    w.ring_job(hi, width, SOLO, false, job);
    (w, lo, hi)
}

fn saves(w: &World) -> u64 {
    w.s.vm_stats(VmId(0)).unwrap().preemptions
}

fn due(w: &mut World) -> Vec<(QueueId, SlotId)> {
    let mut v = Vec::new();
    let now = w.now;
    w.s.drains_due(now, &mut v);
    v
}

/// The drain is set up without a save; its deadline, twice the wait,
/// hands out the lower queue once (not before); reported as overrun, the
/// queue is saved at the next decision under the same owner's
/// reservation, and the VM's later reservations are never drained (its
/// queue saved, no deadline) while it stays busy.
#[test]
fn a_drain_that_overruns_is_set_up_again_with_a_save() {
    let (mut w, lo, hi) = rig(2 * MS);
    assert!(w
        .s
        .cu_reservation(0)
        .is_some_and(|(vm, k)| vm == VmId(1) && k > 0));
    assert_eq!(saves(&w), 0, "a drain saves nothing");
    assert_eq!(w.state(lo), QueueState::Running);
    w.run_until(MS + 2 * LONGEST - 1_000);
    assert!(due(&mut w).is_empty(), "due before twice the wait");
    w.run_until(MS + 2 * LONGEST + 1_000);
    let listed = due(&mut w);
    assert_eq!(listed, vec![(lo, w.mapped[&lo])]);
    assert!(due(&mut w).is_empty(), "a deadline is handed out once");
    w.s.drain_overdue(lo);
    let now = w.now;
    w.event(Event::Tick { now });
    assert_eq!(saves(&w), 1, "the overrun lower queue is saved");
    assert_eq!(w.s.spatial_stats().drains_overdue, 1);
    assert!(w.s.cu_reservation(0).is_some_and(|(vm, _)| vm == VmId(1)));
    // The owner's job ends; later jobs never drain the lower VM again.
    w.run_until_done(hi, 10_000);
    for i in 0..5u64 {
        let t = 4 * MS + i * 3 * MS;
        w.run_until(t);
        let before = saves(&w);
        w.ring_job(hi, OWNER_WIDTH, SOLO, false, 500_000);
        w.run_until(t + 3 * LONGEST);
        assert!(due(&mut w).is_empty(), "job {i}: drained again");
        assert!(
            saves(&w) > before || w.s.cu_reservation(0).is_some_and(|(vm, _)| vm == VmId(1)),
            "job {i}: neither saved nor reserved"
        );
        assert_eq!(w.s.spatial_stats().drains_overdue, 1);
    }
}

/// A drain whose lower workgroups ended in time (the caller reports
/// nothing at the deadline) keeps the lower queue running beside the
/// owner, unsaved; a drain whose owner's job ended before the deadline
/// (its reservation gone) hands out nothing.
#[test]
fn a_drain_in_time_or_ended_is_left_alone() {
    let (mut w, lo, _) = rig(2 * MS);
    w.run_until(MS + 2 * LONGEST + 1_000);
    assert_eq!(due(&mut w).len(), 1);
    let now = w.now;
    w.event(Event::Tick { now });
    w.run_until(MS + 500_000);
    assert_eq!(saves(&w), 0);
    assert_eq!(w.state(lo), QueueState::Running);
    assert_eq!(w.s.spatial_stats().drains_overdue, 0);

    // A 20 us job ends before the deadline (100 us).
    let (mut w, _, _) = rig(20_000);
    w.run_until(MS + 2 * LONGEST + 1_000);
    assert!(w.s.cu_reservation(0).is_none_or(|(vm, _)| vm != VmId(1)));
    assert!(due(&mut w).is_empty());
}

/// Over lower workgroups of 5-150 us and owners of 1-100 workgroups: the
/// overrun lower queue is saved at the next decision, once, whether the
/// reservation keeps its size (an owner of at most one CU per XCC: only
/// the overrun mark sets it up again) or grows (sized without the drain's
/// budget).
#[test]
fn an_overrun_is_saved_whatever_the_reservation_size() {
    for longest in [5_000, 50_000, 150_000] {
        for width in [1, 8, 10, 40, 100] {
            let at = format!("workgroup {longest} ns, owner width {width}");
            let (mut w, lo, _) = rig_shaped(2 * MS, longest, width);
            let Some((VmId(1), k)) = w.s.cu_reservation(0) else {
                panic!("{at}: no reservation");
            };
            assert_eq!(saves(&w), 0, "{at}: not drained");
            w.run_until(MS + 2 * longest + 1_000);
            assert_eq!(due(&mut w), vec![(lo, w.mapped[&lo])], "{at}");
            w.s.drain_overdue(lo);
            let now = w.now;
            w.event(Event::Tick { now });
            assert_eq!(saves(&w), 1, "{at}: reservation of {k} CUs/XCC");
            w.run_until(MS + 1_000_000);
            assert_eq!(saves(&w), 1, "{at}: saved again");
        }
    }
}

/// Reports of unknown or unmapped queues change nothing.
#[test]
fn overdue_reports_of_unknown_queues_are_ignored() {
    let (mut w, _, _) = rig(2 * MS);
    w.s.drain_overdue(QueueId(999));
    let now = w.now;
    w.event(Event::Tick { now });
    assert_eq!(saves(&w), 0);
    assert_eq!(w.s.spatial_stats().drains_overdue, 0);
}
