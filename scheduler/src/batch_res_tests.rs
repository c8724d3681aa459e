//! An aging batch keeps a higher VM's held CU reservation (issue 18, the
//! `rt` family; `engine/batch_res.rs`): the batch's queues run on the
//! other CUs, a pause for the RT saves nothing, and an RT of any duty
//! cycle and width up to half the partition never waits for a batch
//! (fuzz seed 97138: an RT of 199 us jobs every 432 us used the batch's
//! yield allowance up in two pauses, each charged a save and restore, and
//! then waited 2.05 ms for the rest of the batch). Virtual time only.

use super::*;

/// CUs per XCC and XCCs of the partition.
const CUS: u32 = 38;
const XCCS: u32 = 8;

/// The configuration of every world here: aging after 100 ms at priority 0.
fn aging_cfg() -> SchedConfig {
    SchedConfig {
        aging_ns: 100 * MS,
        ..cfg(Policy::Hqdmux)
    }
}

/// The partition of [`rt_world`] before any work: aging after 100 ms at
/// priority 0, whole-partition kernels noted for the VMs at priorities 6
/// (VM 1) and 2 (VM 2), and VM 3 at priority 12. Returns the world and
/// their queues.
fn aging_world() -> (World, QueueId, QueueId, QueueId) {
    let mut w = World::new(aging_cfg(), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, XCCS);
    let mid = w.vm(1, 6, 1, 1)[0];
    let low = w.vm(2, 2, 1, 1)[0];
    let hi = w.vm(3, 12, 1, 1)[0];
    for q in [mid, low] {
        w.s.note_dispatch_width(q, (CUS * XCCS) as u64);
        w.s.note_dispatch_occupancy(q, 1_000_000, false);
    }
    (w, mid, low, hi)
}

/// A partition of 8 slots with a CU geometry and aging after 100 ms at
/// priority 0: an always-busy VM at priority 6 (backlogged, whole-partition
/// kernels), an always-busy one at priority 2 (starved: served only by
/// aging) and a periodic RT VM at priority 12 of `wg` workgroups per job
/// (`job` ns alone) rung every `job + think`. Returns the world and the
/// queues (mid, low, rt).
fn rt_world(wg: u64, job: Nanos, think: Nanos) -> (World, QueueId, QueueId, QueueId) {
    let (mut w, mid, low, rt) = aging_world();
    w.s.note_dispatch_width(rt, wg);
    w.s.note_dispatch_occupancy(rt, job, false);
    w.submit(mid, 10_000_000 * MS);
    w.submit(low, 10_000_000 * MS);
    w.closed_loop_think(rt, job, think);
    (w, mid, low, rt)
}

/// Runs `w` to `until` in steps of 10 us, checking at each step that a
/// running boosted queue of the starved VM never holds the CUs of the
/// RT's reservation. Returns how many steps found a batch beside a
/// reservation of the RT.
fn run_checking(w: &mut World, low: QueueId, until: Nanos) -> u64 {
    let mut beside = 0;
    while w.now < until {
        let next = w.now + 10_000;
        w.run_until(next);
        let Some((vm, k)) = w.s.cu_reservation(0) else {
            continue;
        };
        if vm != VmId(3) || k == 0 {
            continue;
        }
        let Some((QueueState::Running, Some(slot))) = w.s.queue_state(low) else {
            continue;
        };
        let set = w.s.slot_cu_set(slot);
        assert!(
            (0..CUS).all(|c| !(set.contains(c, CUS) && CuSet::Top(k).contains(c, CUS))),
            "at {}: the starved queue runs on {set:?} beside the RT's {k} CUs per XCC",
            w.now
        );
        beside += 1;
    }
    beside
}

/// RT shapes from a narrow low-duty tenant to one of half the partition
/// at 40% duty: every batch runs beside the RT's reservation, no RT job
/// waits for a batch (at most one save of the work it displaces, the
/// fake GPU's dequeue time), and the starved VM still gets its turns
/// within its aging bound. Before, a batch took the RT's CUs: each pause
/// saved the batch's work, and once the pauses had used the yield
/// allowance the RT waited for the rest of the batch (1.5-2 ms for all
/// but the first shape). A pause costs the batch the reserved share of
/// the CUs, so the allowance `Y` covers an RT whose reserved share times
/// its duty is below about `(Y - t_cwsr) / (B + Y)` (0.3 here): half the
/// partition at 60% duty is at that edge (one RT job waited 100 us for the
/// batch's last 100 us, twice the fake GPU's save).
#[test]
fn an_rt_of_any_duty_does_not_wait_for_a_batch_beside_its_reservation() {
    for (wg, job, think) in [
        (16, 50_000, 450_000),
        (38, 200_000, 233_000),
        (60, 300_000, 200_000),
        (76, 120_000, 180_000),
    ] {
        let (mut w, _mid, low, rt) = rt_world(wg, job, think);
        let beside = run_checking(&mut w, low, 1_000 * MS);
        w.event(Event::Tick { now: w.now });
        let shape = format!("RT of {wg} workgroups, {job} ns every {} ns", job + think);
        let st = w.s.vm_stats(VmId(2)).unwrap();
        assert!(st.aging_boosts >= 3, "{shape}: {st:?}");
        assert!(
            beside > 0,
            "{shape}: no batch ran beside the RT's reservation"
        );
        let waited = w.max_wait_full.get(&rt).copied().unwrap_or(0);
        assert!(waited <= UNMAP_NS, "{shape}: an RT job waited {waited} ns");
        let bound = Scheduler::aging_bound_job_ns(w.s.config(), 2, 1, &[(6, 1)], 8, UNMAP_NS, 1);
        let waited = w.max_wait_full.get(&low).copied().unwrap_or(0);
        assert!(
            waited <= bound,
            "{shape}: the starved VM waited {waited} > {bound}"
        );
    }
}

/// The control: without a CU geometry there is no reservation to keep, and
/// an RT of 60% duty uses the batch's yield allowance up (each pause saves
/// the batch's work): some RT job waits for the batch beyond one save.
/// (What the reservation changes; the bound of aging holds either way.)
#[test]
fn without_a_reservation_a_high_duty_rt_waits_for_the_batch() {
    let mut w = World::new(aging_cfg(), slots(1, 2, 4));
    let mid = w.vm(1, 6, 1, 1)[0];
    let low = w.vm(2, 2, 1, 1)[0];
    let rt = w.vm(3, 12, 1, 1)[0];
    w.submit(mid, 10_000_000 * MS);
    w.submit(low, 10_000_000 * MS);
    w.closed_loop_think(rt, 300_000, 200_000);
    w.run_until(1_000 * MS);
    let waited = w.max_wait_full.get(&rt).copied().unwrap_or(0);
    assert!(waited > UNMAP_NS, "an RT job waited only {waited} ns");
    let bound = Scheduler::aging_bound_job_ns(w.s.config(), 2, 1, &[(6, 1)], 8, UNMAP_NS, 1);
    let waited = w.max_wait_full.get(&low).copied().unwrap_or(0);
    assert!(waited <= bound, "the starved VM waited {waited} > {bound}");
}

/// A backlogged higher VM (always busy, e.g. a hung guest's queue) is what
/// aging exists to displace: a batch does not keep its reservation, so
/// the batch saves its work (a hung queue's save then times out and the
/// queue is reset, `eval::promises` "hung"). With the reservation kept it
/// was never saved again.
#[test]
fn a_batch_displaces_a_backlogged_higher_vm_with_a_reservation() {
    // The level beside the higher VM's reservation is the priority-6
    // VM's; the priority-2 one is starved.
    let (mut w, mid, low, hi) = aging_world();
    w.s.note_dispatch_width(hi, 16);
    w.s.note_dispatch_occupancy(hi, 100_000, false);
    w.submit(mid, 10_000_000 * MS);
    w.submit(low, 10_000_000 * MS);
    w.submit(hi, 10_000_000 * MS);
    w.run_until(1_000 * MS);
    let boosts = w.s.vm_stats(VmId(2)).unwrap().aging_boosts;
    let saves = w.s.vm_stats(VmId(3)).unwrap().preemptions;
    assert!(boosts >= 3, "the starved VM was boosted {boosts} times");
    assert!(
        saves >= boosts,
        "{boosts} batches saved the backlogged VM {saves} times"
    );
}

/// An RT whose workgroups fit half a CU, of a short period, above a
/// starved VM of two queues that fit half a CU too (fuzz seed 400110:
/// 153 us period, two busy queues of the starved VM). At a pause's
/// first job the starved VM's two queues take every CU's second place:
/// no co-residence, the RT's reservation is set up with a save. Once
/// that save has moved them off, a co-residence looked possible and took
/// the reservation's place; the batch then resumed on every CU, and each
/// RT job set the reservation up again with a save and restore of the
/// batch's work, until the pauses had spent the yield allowance and the
/// RT waited for the rest of the batch (1.85 ms in 400110). The owner of
/// a paused batch keeps its reservation (`pause_keeps_reservation`), the
/// batch keeps it in turn, and no RT job waits beyond one save.
#[test]
fn a_paused_batch_does_not_trade_the_rts_reservation_for_a_co_residence() {
    let mut w = World::new(aging_cfg(), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, XCCS);
    let mid = w.vm(1, 6, 1, 1)[0];
    let low = w.vm(2, 2, 1, 2);
    let rt = w.vm(3, 12, 1, 1)[0];
    for &q in [mid].iter().chain(low.iter()) {
        w.s.note_dispatch_width(q, (CUS * XCCS) as u64);
        w.s.note_dispatch_occupancy(q, 1_000_000, true);
        w.submit(q, 10_000_000 * MS);
    }
    // 100 us jobs every 250 us (the fake GPU's save is 50 us).
    w.s.note_dispatch_width(rt, 16);
    w.s.note_dispatch_occupancy(rt, 100_000, true);
    w.closed_loop_think(rt, 100_000, 150_000);
    w.run_until(1_000 * MS);
    let st = w.s.vm_stats(VmId(2)).unwrap();
    assert!(st.aging_boosts >= 6, "{st:?}");
    let waited = w.max_wait_full.get(&rt).copied().unwrap_or(0);
    assert!(waited <= UNMAP_NS, "an RT job waited {waited} ns");
    // The starved VM's work is saved about once per batch (at the pause
    // that sets the reservation up), not at every RT job.
    assert!(
        st.preemptions <= st.aging_boosts * 2,
        "the starved VM was saved {} times in {} boosts",
        st.preemptions,
        st.aging_boosts
    );
    let bound = Scheduler::aging_bound_job_ns(w.s.config(), 2, 1, &[(6, 1)], 8, UNMAP_NS, 1);
    for q in low {
        let waited = w.max_wait_full.get(&q).copied().unwrap_or(0);
        assert!(waited <= bound, "the starved VM waited {waited} > {bound}");
    }
}
