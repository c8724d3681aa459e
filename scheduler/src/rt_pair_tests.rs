//! A lower RT's job on CUs of its own below a higher RT's held
//! reservation (issue 18; `engine/rt_pair.rs`). Before, the lower RT took
//! the higher one's reservation over in place, on the same CUs, and each
//! job of the higher RT during its job saved it: fuzz seed 600008, 3-4
//! saves and restores per job of the lower RT, its p99 1353 us against
//! 1196.

use super::*;

// The three-VM rig of `res_keep_tests.rs`: a busy lower VM (VM 0,
// priority 2), a higher periodic VM `hi` (VM 1, priority 12) and a lower
// RT `mid` (VM 2, priority 11) between them.
use super::res_keep_tests::{rig, CUS};

/// Runs `n` periods of the lower RT `mid`, each `per` periods of `hi_period`
/// ns of the higher RT: `mid` rings a job of `mid_w` workgroups of
/// `mid_solo` ns at the start of each, `hi` a job of 8 workgroups of 20 us
/// at the start of each of its own periods. Returns `mid`'s preemptions
/// and the lower VM's over the last `n - 2` periods.
fn periods(
    w: &mut World,
    (hi, mid): (QueueId, QueueId),
    (mid_w, mid_solo): (u64, Nanos),
    hi_period: Nanos,
    per: u64,
    n: u64,
) -> (u64, u64) {
    let pre = |w: &World, vm: u32| w.s.vm_stats(VmId(vm)).unwrap().preemptions;
    let (mut mid0, mut lo0) = (0, 0);
    let mut t = MS;
    for j in 0..n {
        if j == 2 {
            (mid0, lo0) = (pre(w, 2), pre(w, 0));
        }
        w.ring_job(mid, mid_w, mid_solo, false, mid_solo * 2);
        for _ in 0..per {
            w.ring_job(hi, 8, 20_000, false, 20_000);
            t += hi_period;
            w.run_until(t);
        }
    }
    (pre(w, 2) - mid0, pre(w, 0) - lo0)
}

/// A 3.3 kHz higher RT (its reservation held across its 280 us gaps) above
/// a lower RT of 40 whole-CU workgroups of 400 us every 3 ms (two rounds on
/// its CUs, about 3 jobs of the higher RT in each of its jobs): over 20 of
/// its jobs the lower RT is never saved by the higher one (80 times
/// before, one per job of the higher RT in its job), and the lower work at
/// most once per job of the lower RT (the set-up of its part, which its own
/// reservation's growth took before too).
#[test]
fn a_lower_rt_on_cus_below_a_higher_rts_is_not_saved_by_its_jobs() {
    let (mut w, _lo, hi, mid) = rig();
    let (mid_pre, lo_pre) = periods(&mut w, (hi, mid), (40, 400_000), 300_000, 10, 22);
    assert_eq!(
        mid_pre, 0,
        "lower RT saved {mid_pre} times in 20 of its jobs"
    );
    assert!(
        lo_pre <= 20,
        "lower work saved {lo_pre} times in 20 periods"
    );
}

/// While a pair holds, the two RTs' CU sets and the lower work's are
/// disjoint, and the partition's reservation is their sum.
#[test]
fn a_pairs_cu_sets_are_disjoint() {
    let (mut w, lo, hi, mid) = rig();
    // Four periods of both (the higher RT's wake period is then known).
    periods(&mut w, (hi, mid), (40, 400_000), 300_000, 10, 4);
    let t = w.now;
    w.ring_job(mid, 40, 400_000, false, 800_000);
    w.run_until(t + 100_000);
    w.ring_job(hi, 8, 20_000, false, 20_000);
    w.run_until(t + 110_000);
    let set = |q: QueueId| {
        let slot = w.s.queue_state(q).and_then(|s| s.1).expect("mapped");
        w.s.slot_cu_set(slot)
    };
    let (h, m, l) = (set(hi), set(mid), set(lo));
    assert!(matches!(m, CuSet::Mid { .. }), "lower RT on {m:?}");
    for (a, b) in [(h, m), (h, l), (m, l)] {
        assert!(a.disjoint(b, CUS), "{a:?} and {b:?} share CUs");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Over the lower RT's widths (16-80 whole-CU workgroups: 2-10 CUs per
    /// XCC, within the cap beside the higher RT's) and workgroups (200-500
    /// us), and higher periods of 200-400 us (its gaps held): the lower RT
    /// is never saved by the higher one's jobs.
    #[test]
    fn a_lower_rt_beside_a_frequent_higher_rt_is_never_saved(
        mid_w in 16u64..80,
        mid_solo in 200_000u64..500_000,
        hi_period in 200_000u64..400_000,
    ) {
        let (mut w, _lo, hi, mid) = rig();
        let (mid_pre, _) = periods(&mut w, (hi, mid), (mid_w, mid_solo), hi_period, 12, 12);
        prop_assert_eq!(mid_pre, 0, "lower RT saved {} times in 10 of its jobs", mid_pre);
    }
}
