//! The scheduler's notices ([`SchedNotice`]): each preemption and each
//! aging boost is said once, where it is decided, with who it was for and
//! why; over the fake GPU of `tests.rs`, in virtual time.

use super::*;

/// Every notice recorded so far.
fn drain(w: &mut World) -> Vec<SchedNotice> {
    std::iter::from_fn(|| w.s.poll_notice()).collect()
}

fn preempted(ns: &[SchedNotice]) -> Vec<(QueueId, VmId, Option<VmId>, PreemptReason)> {
    ns.iter()
        .filter_map(|n| match *n {
            SchedNotice::Preempted {
                queue,
                vm,
                by,
                reason,
                ..
            } => Some((queue, vm, by, reason)),
            SchedNotice::Aged { .. } => None,
        })
        .collect()
}

/// One slot: a priority-2 VM runs a long job, then a priority-12 VM rings
/// a short one; returns the world (run to 20 ms) and the low queue.
fn lo_then_hi(record: bool) -> (World, QueueId) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 1, 1));
    w.s.record_notices(record);
    let lo = w.vm(0, 2, 1, 1)[0];
    let hi = w.vm(1, 12, 1, 1)[0];
    w.submit(lo, 50 * MS);
    w.run_until(MS);
    assert!(w.running(&lo));
    w.submit(hi, 5 * MS);
    w.run_until(20 * MS);
    assert_eq!(w.s.stats().preemptions, 1);
    (w, lo)
}

#[test]
fn a_higher_vm_preempts_a_lower_one_once_for_priority() {
    let (mut w, lo) = lo_then_hi(true);
    let ns = drain(&mut w);
    assert_eq!(
        preempted(&ns),
        vec![(lo, VmId(0), Some(VmId(1)), PreemptReason::Priority)]
    );
    let slot = ns.iter().find_map(|n| match n {
        SchedNotice::Preempted { slot, .. } => Some(*slot),
        _ => None,
    });
    assert_eq!(slot, Some(SlotId(0)), "the slot it left");
}

#[test]
fn nothing_is_recorded_unless_asked() {
    let (mut w, _) = lo_then_hi(false);
    assert!(drain(&mut w).is_empty());
}

#[test]
fn equals_take_turns_by_slice_and_a_higher_queue_of_the_vm_by_queue_priority() {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 1, 1));
    w.s.record_notices(true);
    let a = w.vm(0, 6, 1, 1)[0];
    let b = w.vm(1, 6, 1, 1)[0];
    w.submit(a, 400 * MS);
    w.submit(b, 400 * MS);
    w.run_until(200 * MS);
    let p = preempted(&drain(&mut w));
    assert!(p.len() >= 2, "equals alternate: {p:?}");
    for (q, vm, by, why) in &p {
        assert_eq!(*why, PreemptReason::Slice);
        assert_eq!(*vm, w.vm_of[q]);
        assert_eq!(*by, Some(VmId(1 - vm.0)), "for the other equal");
    }
    assert_eq!(p.len() as u64, w.s.stats().preemptions);

    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 1, 1));
    w.s.record_notices(true);
    let qs = w.vm_q(0, 6, 1, &[1, 9]);
    w.submit(qs[0], 50 * MS);
    w.run_until(MS);
    w.submit(qs[1], 5 * MS);
    w.run_until(20 * MS);
    assert_eq!(
        preempted(&drain(&mut w)),
        vec![(qs[0], VmId(0), Some(VmId(0)), PreemptReason::QueuePriority)]
    );
}

#[test]
fn a_pause_is_said_as_such() {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 1, 2));
    w.s.record_notices(true);
    let a = w.vm(0, 8, 1, 2);
    w.submit(a[0], 50 * MS);
    w.submit(a[1], 50 * MS);
    w.run_until(MS);
    w.s.set_vm_paused(VmId(0), true).unwrap();
    let mut p = preempted(&drain(&mut w));
    p.sort_by_key(|e| e.0);
    assert_eq!(
        p,
        vec![
            (a[0], VmId(0), None, PreemptReason::Paused),
            (a[1], VmId(0), None, PreemptReason::Paused)
        ]
    );
}

/// A starved low VM below a permanent flood: each boost is one `Aged`
/// notice (as many as its `aging_boosts`), and the flood's queues are
/// preempted for it with reason `Aging`.
#[test]
fn aging_says_each_boost_and_the_preemptions_it_makes() {
    let c = SchedConfig {
        aging_ns: 100 * MS,
        ..cfg(Policy::Hqdmux)
    };
    let mut w = World::new(c, slots(1, 1, 2));
    w.s.record_notices(true);
    let hi = w.vm(0, 15, 1, 2);
    let lo = w.vm(1, 2, 1, 1)[0];
    for q in &hi {
        w.submit(*q, 10_000_000 * MS);
    }
    w.submit(lo, 10_000_000 * MS);
    w.run_until(3_000 * MS);
    let ns = drain(&mut w);
    let aged: Vec<(QueueId, VmId)> = ns
        .iter()
        .filter_map(|n| match *n {
            SchedNotice::Aged { queue, vm } => Some((queue, vm)),
            _ => None,
        })
        .collect();
    let boosts = w.s.vm_stats(VmId(1)).unwrap().aging_boosts;
    assert!(boosts > 0);
    assert_eq!(aged.len() as u64, boosts);
    assert!(aged.iter().all(|&a| a == (lo, VmId(1))));
    let p = preempted(&ns);
    let by_aging: Vec<_> = p.iter().filter(|e| e.3 == PreemptReason::Aging).collect();
    assert!(!by_aging.is_empty(), "{p:?}");
    assert!(by_aging
        .iter()
        .all(|e| e.1 == VmId(0) && e.2 == Some(VmId(1))));
    assert_eq!(p.len() as u64, w.s.stats().preemptions);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Exactly once, whatever the policy, mode and live changes: per VM,
    /// as many `Preempted` notices naming it as its counted preemptions,
    /// as many `Aged` as its boosts; each `Preempted` names the queue's
    /// own VM, and another VM or none only where the reason allows.
    #[test]
    fn every_preemption_and_boost_is_said_once(ops in prop::collection::vec(op(), 1..100),
                                               policy in prop::sample::select(Policy::ALL.to_vec()),
                                               parts in 1u32..3,
                                               variant in 0u8..3) {
        let (mut w, qs) = build_variant(policy, 500_000, parts, &[1, 4, 4, 9, 12, 12], variant);
        w.s.record_notices(true);
        let mut ns = Vec::new();
        for o in &ops {
            apply(&mut w, &qs, o, true);
            ns.extend(drain(&mut w));
        }
        let mut pre: BTreeMap<VmId, u64> = BTreeMap::new();
        let mut aged: BTreeMap<VmId, u64> = BTreeMap::new();
        for n in &ns {
            match *n {
                SchedNotice::Preempted { queue, vm, by, reason, .. } => {
                    prop_assert_eq!(w.vm_of[&queue], vm);
                    match reason {
                        PreemptReason::QueuePriority => prop_assert_eq!(by, Some(vm)),
                        PreemptReason::Paused | PreemptReason::Adopted => prop_assert_eq!(by, None),
                        _ => prop_assert!(by.is_some(), "{:?}", n),
                    }
                    *pre.entry(vm).or_default() += 1;
                }
                SchedNotice::Aged { queue, vm } => {
                    prop_assert_eq!(w.vm_of[&queue], vm);
                    *aged.entry(vm).or_default() += 1;
                }
            }
        }
        let mut total = 0;
        for vm in 0..6u32 {
            let s = w.s.vm_stats(VmId(vm)).unwrap();
            prop_assert_eq!(pre.get(&VmId(vm)).copied().unwrap_or(0), s.preemptions);
            prop_assert_eq!(aged.get(&VmId(vm)).copied().unwrap_or(0), s.aging_boosts);
            total += s.preemptions;
        }
        prop_assert_eq!(total, w.s.stats().preemptions);
    }
}
