//! Two RTs at different levels each hold CUs of their own in one
//! reservation (issue 18; `engine/res_pair.rs`). Before, each job of the
//! higher RT took the lower RT's reserved CUs and saved its queue: fuzz
//! seed 50157, a 4.8 kHz RT saving the RT below it 1090 times in 839 ms.

use super::*;

// The three-VM rig of `res_keep_tests.rs`: a busy lower VM (VM 0,
// priority 2), a higher periodic VM `hi` (VM 1, priority 12) and a lower
// RT `mid` (VM 2, priority 11) between them.
use super::res_keep_tests::{rig, CUS};

/// Preemptions of `vm` so far.
fn saves(w: &World, vm: u32) -> u64 {
    w.s.vm_stats(VmId(vm)).unwrap().preemptions
}

/// Runs `n` periods of the lower RT (`mid_period` ns: a job of `mid_w`
/// workgroups of `mid_solo` ns, `mid_work` ns long) with `per` jobs of the
/// higher RT (`hi_w` workgroups of `hi_solo` ns) spread over each, the
/// first `offset` ns into it. Returns the lower RT's and the lower work's
/// saves over the periods after the first 10, and the higher RT's jobs
/// there.
#[allow(clippy::too_many_arguments)]
fn two_rts(
    (mid_w, mid_solo, mid_work): (u64, Nanos, Nanos),
    mid_period: Nanos,
    (hi_w, hi_solo): (u64, Nanos),
    per: u64,
    offset: Nanos,
    n: u64,
) -> (u64, u64, u64) {
    let (mut w, lo, hi, mid) = rig();
    let (mut mid0, mut lo0, mut jobs) = (0, 0, 0);
    let mut t = MS;
    let step = mid_period / per;
    for i in 0..n {
        if i == 10 {
            mid0 = saves(&w, 2);
            lo0 = saves(&w, 0);
        }
        w.ring_job(mid, mid_w, mid_solo, false, mid_work);
        for j in 0..per {
            w.run_until(t + offset % step + j * step);
            w.ring_job(hi, hi_w, hi_solo, false, hi_solo * 2);
            jobs += u64::from(i >= 10);
        }
        t += mid_period;
        w.run_until(t);
    }
    assert_eq!(w.state(lo), QueueState::Running);
    (saves(&w, 2) - mid0, saves(&w, 0) - lo0, jobs)
}

/// A 4 kHz narrow higher RT (20 workgroups of 20 us) during a 1 kHz lower
/// RT's jobs (40 workgroups of 400 us): both fit the cap together, so the
/// lower RT is never saved by the higher one (before: a save per job of
/// the higher RT while the lower one ran, 100 in 50 periods).
#[test]
fn a_higher_rt_does_not_save_the_lower_rt_where_both_fit() {
    let (mid, lo, jobs) = two_rts((40, 400_000, 400_000), MS, (20, 20_000), 4, 50_000, 60);
    assert_eq!(jobs, 200);
    assert_eq!(
        mid, 0,
        "lower RT saved {mid} times by {jobs} jobs of the higher one"
    );
    assert!(lo <= 5, "lower work saved {lo} times");
    let (_, k) = w_reservation_after(40, 20);
    assert!(k > 0 && k < CUS);
}

/// The reservation's size after a few periods of the two RTs (for the
/// sum of their sizes).
fn w_reservation_after(mid_w: u64, hi_w: u64) -> (VmId, u32) {
    let (mut w, _lo, hi, mid) = rig();
    let mut t = MS;
    for _ in 0..12 {
        w.ring_job(mid, mid_w, 400_000, false, 400_000);
        w.run_until(t + 100_000);
        w.ring_job(hi, hi_w, 20_000, false, 40_000);
        t += MS;
        w.run_until(t - 500_000);
    }
    w.s.cu_reservation(0).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Over the two RTs' widths (8-48 workgroups each: 1-8 CUs per XCC with the headroom, 16 of the cap's 19 at most),
    /// the higher one's workgroups (5-50 us) and rate (1-5 jobs per 1-5 ms
    /// period of the lower one: 0.2-5 kHz) and its phase: wherever the two
    /// fit the cap together, the lower RT is saved by the higher one at
    /// most once in 50 periods (forming the pair when the higher one held
    /// first), and the lower work keeps running.
    #[test]
    fn two_rts_that_fit_the_cap_do_not_save_each_other(
        mid_w in 8u64..48,
        hi_w in 8u64..48,
        hi_solo in 5_000u64..50_000,
        per in 1u64..5,
        period_ms in 1u64..5,
        offset in 0u64..1_000_000,
    ) {
        let period = period_ms * MS;
        let (mid, _lo, jobs) = two_rts(
            (mid_w, 300_000, 300_000 * period_ms),
            period,
            (hi_w, hi_solo),
            per,
            offset,
            60,
        );
        prop_assert!(mid <= 50, "lower RT saved {} times by {} jobs of the higher one", mid, jobs);
    }
}
