//! No timer in the past (issue 18, the timer storm): every deadline the
//! engine arms is strictly in the future and is a time at which a decision
//! can change something, so decisions per virtual ms stay bounded by the
//! work, whatever the fleet. Counts are in virtual time (deterministic).

use super::*;

/// Ticks allowed in one virtual ms: a few per deadline kind plus the
/// non-tick events of that ms (each state change can create a deadline).
/// A storm (the old slice-end candidate re-armed at `now + 1`) is a tick
/// per virtual ns, ~10^6 per ms.
fn tick_bound(events_in_ms: u64) -> u64 {
    32 + 2 * events_in_ms
}

/// Ticks and non-tick events per virtual ms of a run.
fn per_ms(w: &World, events: &BTreeMap<Nanos, u64>) -> Vec<(Nanos, u64, u64)> {
    w.ticks_in_ms
        .iter()
        .map(|(&ms, &t)| (ms, t, events.get(&ms).copied().unwrap_or(0)))
        .collect()
}

/// Runs `w` to `until` in 1 ms steps, recording the non-tick events of
/// each virtual ms (the World counts ticks itself).
fn run_counting(w: &mut World, until: Nanos) -> BTreeMap<Nanos, u64> {
    let mut events = BTreeMap::new();
    let mut t = w.now;
    while t < until {
        let (e0, k0) = (w.events, w.ticks);
        t = (t + MS).min(until);
        w.run_until(t);
        let non_tick = (w.events - e0) - (w.ticks - k0);
        *events.entry((t - 1) / MS).or_default() += non_tick;
    }
    events
}

/// The case: a top VM with a fixed 50 us think time (grace
/// 2 x 50 us = 100 us, within the 100 us cap) beside two always-busy lower
/// equals. Once its 10 ms slice has expired, the slice-end deadline was in
/// the past during every think gap and the timer was re-armed at `now + 1`:
/// a decision per virtual ns through each gap.
#[test]
fn fixed_think_beside_busy_lower_equals_arms_no_past_deadline() {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.tick_limit_per_ms = Some(tick_bound(1_000));
    for id in 1..=2 {
        let q = w.vm(id, 4, 1, 1)[0];
        w.submit(q, 10_000_000 * MS);
    }
    let top = w.vm(0, 12, 1, 1)[0];
    w.closed_loop_think(top, MS, 50_000);
    let events = run_counting(&mut w, 40 * MS);
    for (ms, ticks, ev) in per_ms(&w, &events) {
        assert!(
            ticks <= tick_bound(ev),
            "ms {ms}: {ticks} ticks for {ev} events"
        );
    }
    // The top VM kept its slice through the gaps (the grace held) and
    // did its work: ~1 ms per 1.05 ms.
    assert!(w.gpu_ns(0) >= 35 * MS, "top got {}", w.gpu_ns(0));
}

/// One VM of a random fleet for the timer property.
#[derive(Clone, Debug)]
struct Shape {
    prio: u8,
    weight: u32,
    queues: u32,
    job_ns: Nanos,
    /// `None`: always busy; `Some((think, exponential))`: closed loop.
    think: Option<(Nanos, bool)>,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop::sample::select(vec![0u8, 3, 3, 7, 12, 15]),
        1u32..5,
        1u32..4,
        prop::sample::select(vec![20_000u64, 100_000, 1_000_000, 4_000_000]),
        prop::option::weighted(
            0.8,
            (
                // Fixed think times shorter than, equal to and longer than
                // the grace cap (100 us), and beyond the CU hold (1 ms).
                prop::sample::select(vec![
                    0u64, 10_000, 30_000, 50_000, 80_000, 200_000, 1_500_000,
                ]),
                any::<bool>(),
            ),
        ),
    )
        .prop_map(|(prio, weight, queues, job_ns, think)| Shape {
            prio,
            weight,
            queues,
            job_ns,
            think: think.map(|(t, e)| (t, e && t > 0)),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Random fleets (priorities, weights, queue counts, job sizes, fixed
    /// and exponential think times, short quanta so slices expire, aging
    /// due during the run): in every virtual ms, ticks stay within
    /// [`tick_bound`] of the non-tick events of that ms, and every armed
    /// deadline is in the future (asserted by `World::event`).
    #[test]
    fn decisions_per_virtual_ms_stay_bounded(
        fleet in prop::collection::vec(shape(), 1..5),
        quantum in prop::sample::select(vec![MS, 2 * MS, 10 * MS]),
        aging in prop::sample::select(vec![10 * MS, 500 * MS]),
        seed in any::<u64>(),
    ) {
        let c = SchedConfig { quantum_ns: [quantum; 16], aging_ns: aging, ..cfg(Policy::Hqdmux) };
        let mut w = World::new(c, slots(1, 2, 4));
        w.rng = seed | 1;
        w.tick_limit_per_ms = Some(tick_bound(2_000));
        for (i, t) in fleet.iter().enumerate() {
            for q in w.vm(i as u32, t.prio, t.weight, t.queues) {
                match t.think {
                    None => w.submit(q, 10_000_000 * MS),
                    Some((think, exp)) => {
                        if exp {
                            w.think_exp.insert(q);
                        }
                        w.closed_loop_think(q, t.job_ns, think);
                    }
                }
            }
        }
        let events = run_counting(&mut w, 30 * MS);
        for (ms, ticks, ev) in per_ms(&w, &events) {
            prop_assert!(ticks <= tick_bound(ev), "ms {}: {} ticks for {} events", ms, ticks, ev);
        }
    }
}

/// Decision cost (issue 18, `tick` p99): an aging batch boosts at most the
/// partition's slots' worth of queues (the longest overdue first), however
/// many are due, so its start and end re-index a bounded number.
#[test]
fn an_aging_batch_boosts_at_most_the_partitions_slots() {
    let c = SchedConfig {
        aging_ns: 10 * MS,
        ..cfg(Policy::Hqdmux)
    };
    let mut w = World::new(c, slots(1, 2, 2));
    let top = w.vm(0, 15, 1, 1)[0];
    w.submit(top, 10_000_000 * MS);
    for id in 1..=5 {
        for q in w.vm(id, 2, 1, 4) {
            w.submit(q, 10_000_000 * MS);
        }
    }
    // 20 queues are due after age_wait(2) = 5 ms; the first batch starts
    // then and lasts at most 2 ms.
    w.run_until(6 * MS);
    let first = w.s.stats().boosts;
    assert!(
        (1..=4).contains(&first),
        "{first} queues boosted in one batch"
    );
    // Every starved queue is served in later batches all the same.
    w.run_until(3_000 * MS);
    for q in w.work.keys().copied().collect::<Vec<_>>() {
        if q != top {
            assert!(w.maps.iter().any(|(_, m)| *m == q), "{q:?} never ran");
        }
    }
    // Boosts are counted per VM too: the top VM never needs one, each
    // starved VM got some, and they add up to the engine's count.
    let per_vm: Vec<u64> = (0..=5u32)
        .map(|id| w.s.vm_stats(VmId(id)).unwrap().aging_boosts)
        .collect();
    assert_eq!(per_vm[0], 0);
    assert!(per_vm[1..].iter().all(|b| *b > 0), "{per_vm:?}");
    assert_eq!(per_vm.iter().sum::<u64>(), w.s.stats().boosts);
}
