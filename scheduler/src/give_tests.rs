//! A periodic owner too wide for a reservation gives its gaps to the
//! lower work when holding them costs the lower work more than the saves
//! giving brings (issue 18, best effort beside a wide RT;
//! `engine/give.rs`): the cost-aware hold kept the whole partition through
//! every gap shorter than `10 x (save + restore)`, and the lower work got
//! aging turns only (fuzz seed 96013: best effort 0.013 of alone). A gap
//! shorter than the saves of the lower queues that would run in it is
//! still held, and a closed loop, whose cycle grows by the save its next
//! job waits for, goes back to held gaps.

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
/// The owner's width: four rounds of the partition.
const WIDTH: u64 = 1216;
/// Its solo time: one round of its workgroups.
const SOLO: Nanos = 100_000;
/// Its job alone: four rounds (the fake GPU runs the job as given).
const JOB: Nanos = 400_000;

/// A world with the geometry, `vms` busy lower VMs (VMs 0.., priority
/// 2, `queues` busy queues each, whole-CU workgroups of 10 ms: no
/// co-residence, no drain) and the wide owner (VM `vms`, priority 12): its bound (1.1 x
/// 400 us + one switch) needs 31 CUs per XCC, above the cap of 19, so
/// it gets no reservation. Returns (lower queues, owner queue).
fn rig(vms: u32, queues: u32) -> (World, Vec<QueueId>, QueueId) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 4, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo: Vec<QueueId> = (0..vms).flat_map(|i| w.vm(i, 2, 1, queues)).collect();
    let hi = w.vm(vms, 12, 1, 1)[0];
    for &q in &lo {
        w.s.note_dispatch_width(q, 1216);
        w.s.note_dispatch_occupancy(q, 10 * MS, false);
        w.submit(q, 100_000 * MS);
    }
    w.run_until(MS);
    (w, lo, hi)
}

/// Rings one job of the owner with its width and occupancy: one save
/// longer when lower work holds the partition at the ring (the fake GPU
/// runs a queue mapped beside a save at once; on the GPU its waves wait
/// for the CUs the saved waves leave).
fn ring(w: &mut World, hi: QueueId) {
    w.s.note_dispatch_width(hi, WIDTH);
    w.s.note_dispatch_occupancy(hi, SOLO, false);
    let lower = w.mapped.keys().any(|q| w.vm_of[q] != w.vm_of[&hi]);
    w.submit(hi, JOB + if lower { UNMAP_NS } else { 0 });
}

/// Lower VMs' preemptions and billed GPU time, summed.
fn lower(w: &World, vms: u32) -> (u64, Nanos) {
    (0..vms).fold((0, 0), |(p, g), i| {
        let s = w.s.vm_stats(VmId(i)).unwrap();
        (p + s.preemptions, g + s.gpu_ns)
    })
}

/// Runs a periodic owner for 60 periods (learning its gaps and the save),
/// then returns the lower VMs' preemptions and billed GPU time over the
/// next 100 periods, the owner's longest wait from a ring to its map and
/// the idle time it held (billed) in them.
fn steady(w: &mut World, hi: QueueId, vms: u32, period: Nanos) -> (u64, Nanos, Nanos, Nanos) {
    let mut t = MS;
    for _ in 0..60 {
        ring(w, hi);
        t += period;
        w.run_until(t);
    }
    let (pre, gpu) = lower(w, vms);
    let held = w.s.vm_stats(VmId(vms)).unwrap().held_ns;
    let mut wait = 0;
    for _ in 0..100 {
        ring(w, hi);
        let rung = w.now;
        let mut at = rung;
        while w.state(hi) != QueueState::Running {
            at += 1_000;
            w.run_until(at);
        }
        wait = wait.max(at - rung);
        t += period;
        w.run_until(t);
    }
    let (pre2, gpu2) = lower(w, vms);
    let held = w.s.vm_stats(VmId(vms)).unwrap().held_ns - held;
    (pre2 - pre, gpu2 - gpu, wait, held)
}

/// Gaps of 600 us to 1.6 ms, all shorter than the cost-aware hold's
/// switch (10 x 2 x 50 us = 1 ms) or its bucket edge, beside 1-3 lower VMs
/// of 1-3 queues: holding them cost the lower work every ns of them. Now
/// the gaps go to the lower work (one save of the running lower VM's
/// queues per period, `n x 100 us` of CWSR: the lower equals take turns by
/// slices) as far as the partition's CWSR budget allows, which every save
/// of the partition spends (`engine/cwsr_budget.rs`, 9% of the run): every
/// gap where `n x 100 us` is at most 9% of the period, about that share of
/// them where it is more (1 queue every 1 ms: 85 of 100, 90 less the
/// budget's stretches of refusals; 2 queues every 1.2 ms: 54; gaps of 1 ms
/// or more the cost-aware hold gives away itself). With a fixed budget of
/// their own, 8% of the run, the gives were 80 and 48: the CWSR bound's
/// rest went unused where the partition saves nothing else. A given gap's lower work runs
/// and is billed at least the gap less two switches; the owner waits at
/// most one save (its RT bound allows one save and restore) and is billed
/// no held time but in the gaps the budget could not pay for.
#[test]
fn a_wide_periodic_owners_gaps_go_to_the_lower_work_within_the_cwsr_budget() {
    for (vms, queues, period) in [
        (1, 1, 1_000_000),
        (1, 1, 2_000_000),
        (2, 1, 1_500_000),
        (1, 3, 1_500_000),
        (1, 2, 1_200_000),
        (3, 2, 2_000_000),
    ] {
        let (mut w, _lo, hi) = rig(vms, queues);
        let (pre, gpu, wait, held) = steady(&mut w, hi, vms, period);
        let gap = period - JOB;
        let q = u64::from(queues);
        let cost = q * 2 * UNMAP_NS;
        // Gives the budget pays for in 100 periods (9% of them, in
        // costs), for gaps the cost-aware hold alone keeps (under 1 ms).
        let gives = if gap >= MS {
            100
        } else {
            (100 * period * 90 / 1000 / cost).min(100)
        };
        // At least nine tenths of them (the budget refuses in stretches
        // once short: `CwsrBudget::affords`).
        assert!(
            pre >= (gives.min(99) - 1) * q * 9 / 10,
            "{vms} VMs every {period} ns: {pre} saves in 100 periods, budget {gives} gives"
        );
        if vms == 1 && gap < MS {
            // Every save is a give's (no slices among lower equals): the
            // gives the budget affords, within five (its refusals come in
            // stretches; a budget of 8% for gives alone made 80 and 48 of
            // the 90 and 54 here)...
            assert!(
                pre / q + 5 >= gives,
                "{vms} VMs every {period} ns: {pre} saves in 100 periods, budget {gives} gives"
            );
            // ... and their CWSR within 9% of the run, but for one give.
            assert!(
                pre / q * cost <= 100 * period * 90 / 1000 + cost,
                "{vms} VMs every {period} ns: {pre} saves past the budget"
            );
        }
        assert!(
            gpu >= (gives.min(99) - 1) * 9 / 10 * (gap - 4 * UNMAP_NS),
            "{vms} VMs every {period} ns: lower work billed {gpu} ns in 100 periods"
        );
        assert!(
            wait <= UNMAP_NS + 1_000,
            "{vms} VMs every {period} ns: the owner waited {wait} ns"
        );
        if gives >= 100 {
            assert_eq!(held, 0, "{vms} VMs every {period} ns: gaps held");
        } else {
            assert!(
                held >= (100 - gives - 2) * (gap - 2 * UNMAP_NS),
                "{vms} VMs every {period} ns: the gaps past the budget are held ({held} ns)"
            );
        }
    }
}

/// A gap shorter than the saves of the lower queues that would run in it
/// (600 us against 8 queues x 100 us) is held as before: the lower work is
/// not saved in steady state (giving it would cost more CWSR than it
/// gives).
#[test]
fn a_gap_shorter_than_the_lower_queues_saves_is_held() {
    let vms = 1;
    let (mut w, _lo, hi) = rig(vms, 8);
    let (pre, _gpu, _wait, held) = steady(&mut w, hi, vms, 1_000_000);
    assert_eq!(pre, 0, "lower work saved in steady state");
    assert!(
        held >= 100 * 500_000,
        "held {held} ns in 100 gaps of 600 us"
    );
}

/// A closed loop (300 us think after each 400 us job): given its gap, its
/// next job waits for a save of the lower work, a cycle 7% longer (its
/// throughput, item 1's 5%), so it goes back to held gaps and runs at full
/// speed, but for a trial of at most three cycles (the first given, one
/// measured, one whose gap was given before the judgement) per
/// `RETRY_CYCLES` (64) held cycles.
#[test]
fn a_closed_loop_whose_cycle_stretches_keeps_its_gaps() {
    let vms = 1;
    let (mut w, _lo, hi) = rig(vms, 1);
    let think = 300_000;
    let run = |w: &mut World| {
        ring(w, hi);
        let end = w.run_until_done(hi, 1_000);
        w.run_until(end + think);
    };
    for _ in 0..100 {
        run(&mut w);
    }
    let (pre, _) = lower(&w, vms);
    let held = w.s.vm_stats(VmId(vms)).unwrap().held_ns;
    let n = 300;
    for _ in 0..n {
        run(&mut w);
    }
    let (pre2, _) = lower(&w, vms);
    assert!(
        pre2 - pre <= 3 * (n / 64 + 1),
        "{} saves of the lower work in {n} cycles",
        pre2 - pre
    );
    assert!(
        w.s.vm_stats(VmId(vms)).unwrap().held_ns > held,
        "the hold applies"
    );
}
