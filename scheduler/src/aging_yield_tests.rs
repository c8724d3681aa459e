//! Aging batches yield to a demand-limited higher VM (issue 18, the `rt`
//! family): a periodic higher tenant's job does not wait for a batch of
//! boosted lower work, and a higher VM that only pretends to be
//! demand-limited (short busy periods rung again and again) cannot starve
//! aging: every starved queue still runs within
//! `Scheduler::aging_bound_job_ns` of its level.

use super::*;

/// An empty partition of 8 slots with aging after 100 ms at priority 0.
fn aging_world() -> World {
    let c = SchedConfig {
        aging_ns: 100 * MS,
        ..cfg(Policy::Hqdmux)
    };
    World::new(c, slots(1, 2, 4))
}

/// A partition of 8 slots with aging after 100 ms at priority 0: an
/// always-busy VM at priority 8 (backlogged) over an always-busy one at
/// priority 2 (starved: served only by aging). Returns the world and the
/// two queues.
fn starved_world() -> (World, QueueId, QueueId) {
    let mut w = aging_world();
    let mid = w.vm(1, 8, 1, 1)[0];
    w.submit(mid, 10_000_000 * MS);
    let low = w.vm(2, 2, 1, 1)[0];
    w.submit(low, 10_000_000 * MS);
    (w, mid, low)
}

/// A periodic real-time VM at priority 12 (0.1 ms jobs, 0.9 ms apart)
/// above the starved world: aging batches run (the priority-2 VM is
/// served) and none of the RT's jobs waits longer than the one save of the
/// work it displaces (the fake GPU maps it at once beside the save, so its
/// wait is 0): before, a job arriving during a batch waited for it, up to
/// the batch's 2 ms.
#[test]
fn a_periodic_higher_vm_does_not_wait_for_an_aging_batch() {
    let (mut w, _mid, low) = starved_world();
    let rt = w.vm(3, 12, 1, 1)[0];
    w.closed_loop_think(rt, 100_000, 900_000);
    w.run_until(1_500 * MS);
    w.event(Event::Tick { now: w.now });
    let boosts = w.s.vm_stats(VmId(2)).unwrap().aging_boosts;
    assert!(boosts >= 5, "the starved VM was boosted {boosts} times");
    assert!(w.gpu_ns(2) > 0, "the starved VM got nothing");
    let waited = w.max_wait_full.get(&rt).copied().unwrap_or(0);
    assert!(waited <= UNMAP_NS, "an RT job waited {waited} ns");
    // Aging still bounded for the starved VM (the backlogged VM at 8 is
    // the other VM below the top).
    let bound = Scheduler::aging_bound_job_ns(w.s.config(), 2, 1, &[(8, 1)], 8, UNMAP_NS, 1);
    let waited = w.max_wait_full.get(&low).copied().unwrap_or(0);
    assert!(waited <= bound, "the starved VM waited {waited} > {bound}");
}

/// A backlogged higher VM never displaces a batch: an always-busy VM at
/// priority 12 over the starved world gets no pause (the starved VM's
/// turns are whole batches, as before).
#[test]
fn a_backlogged_higher_vm_does_not_pause_a_batch() {
    let (mut w, _mid, low) = starved_world();
    let top = w.vm(3, 12, 1, 1)[0];
    w.submit(top, 10_000_000 * MS);
    w.run_until(1_500 * MS);
    w.event(Event::Tick { now: w.now });
    let low_vm = w.s.vm_stats(VmId(2)).unwrap();
    assert!(low_vm.maps >= 3, "{low_vm:?}");
    // Each map of the always-busy starved queue (its first, at the start,
    // aside) is an aging turn that runs it for a whole batch less its
    // restore: no pause cut one short (a pause saves it and maps it again).
    assert!(
        low_vm.gpu_ns >= (low_vm.maps - 1) * (Scheduler::AGING_BATCH_NS - 2 * UNMAP_NS),
        "{low_vm:?}"
    );
    let waited = w.max_wait_full.get(&low).copied().unwrap_or(0);
    let bound =
        Scheduler::aging_bound_job_ns(w.s.config(), 2, 1, &[(8, 1), (12, 1)], 8, UNMAP_NS, 1);
    assert!(waited <= bound, "the starved VM waited {waited} > {bound}");
}

/// Abuse: a priority-15 VM that keeps ringing short jobs with gaps just
/// longer than its anticipation grace (so each is a new busy period: it
/// passes for demand-limited) above a backlogged priority-12 VM and two
/// starved VMs (priorities 5 and 2). Whatever its job length (1 us, many
/// pauses per batch; 0.3 ms; 0.9 ms, one pause that takes the whole
/// yield allowance), each batch pauses for at most the allowance and runs
/// its whole length, and every starved queue runs within its aging bound
/// (no slack).
#[test]
fn a_higher_vm_pretending_to_be_demand_limited_does_not_starve_aging() {
    for (job, think) in [(1_000, 60_000), (300_000, 60_000), (900_000, 200_000)] {
        let mut w = aging_world();
        let flood = w.vm(1, 12, 1, 1)[0];
        w.submit(flood, 10_000_000 * MS);
        let five = w.vm(2, 5, 1, 1)[0];
        w.submit(five, 10_000_000 * MS);
        let two = w.vm(3, 2, 1, 1)[0];
        w.submit(two, 10_000_000 * MS);
        let hostile = w.vm(4, 15, 1, 1)[0];
        w.closed_loop_think(hostile, job, think);
        w.run_until(1_500 * MS);
        w.event(Event::Tick { now: w.now });
        for (q, vm, level, other) in [(five, 2u32, 5u8, 2u8), (two, 3, 2, 5)] {
            let bound = Scheduler::aging_bound_job_ns(
                w.s.config(),
                level,
                1,
                &[(other, 1), (12, 1)],
                8,
                UNMAP_NS,
                1,
            );
            let waited = w.max_wait_full.get(&q).copied().unwrap_or(0);
            assert!(
                waited <= bound,
                "job {job}: priority {level} waited {waited} > {bound}"
            );
            let st = w.s.vm_stats(VmId(vm)).unwrap();
            assert!(st.aging_boosts >= 2, "job {job}: {st:?}");
        }
    }
}
