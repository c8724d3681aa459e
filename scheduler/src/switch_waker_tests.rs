//! A light VM that pays for its switch (issue 18, `light` family;
//! `Scheduler::switch_waker` in `engine/use_rate.rs`): a waker whose use
//! rate stays under its share with one switch of the partition (a save and
//! restore of the holder) counted as its use in every cycle takes the
//! partition without the owner's hold, so a closed loop whose think time is
//! shorter than the hold is not delayed by it at each job; a loop whose
//! cycle is too short to pay for its switch still waits for the hold, which
//! bounds the churn.

use super::*;

/// A light closed loop at priority 6 (jobs of `job`, think `think`, fixed or
/// exponential) beside `n` always-busy equals of weight 1, quantum `q`; the
/// equals ring at 0 and the light VM's first job at 1 ms. Returns the
/// latency of each light job after the first (10 us steps), and the GPU
/// time of each equal over the run.
fn light_loop(
    n: u32,
    q: Nanos,
    job: Nanos,
    think: Nanos,
    exp: bool,
    jobs: u32,
) -> (Vec<Nanos>, Vec<Nanos>) {
    let mut c = cfg(Policy::Hqdmux);
    c.quantum_ns[6] = q;
    let mut w = World::new(c, slots(1, 2, 4));
    let eq: Vec<QueueId> = (0..n).map(|vm| w.vm(vm, 6, 1, 1)[0]).collect();
    let light = w.vm(100, 6, 1, 1)[0];
    if exp {
        w.think_exp.insert(light);
    }
    for e in eq {
        w.submit(e, 1_000_000 * MS);
    }
    w.run_until(MS);
    let mut lat = Vec::new();
    for k in 0..jobs {
        let start = w.now;
        w.submit(light, job);
        let now = w.run_until_done(light, 10_000);
        if k > 0 {
            lat.push(now - start);
        }
        let t = w.think_of(light, think);
        w.run_until(now + t);
    }
    (lat, (0..n).map(|vm| w.gpu_ns(vm)).collect())
}

#[test]
fn a_light_loop_that_pays_for_its_switch_waits_for_no_hold() {
    // (equals, quantum, job, mean think, exponential): think times below
    // the hold (a quarter of the quantum), mean cycles at least 1.5 x (job
    // + one switch of 240 us) x (n + 1), so its rate with the switch is
    // below its share (fixed think: always). Before, each job
    // rung less than a hold after the owner's slice began (the slice
    // that began when its last job ended) waited for the rest of the hold:
    // with a 2.5 ms hold and 1.5 ms think, 1 ms more per job.
    let cases: &[(u32, Nanos, Nanos, Nanos, bool)] = &[
        (1, 10 * MS, 100_000, 1_500_000, false),
        (1, 10 * MS, 100_000, 1_500_000, true),
        (2, 10 * MS, 230_000, 2_000_000, false),
        (2, 10 * MS, 230_000, 2_000_000, true),
        (3, 10 * MS, 50_000, 2_200_000, false),
        (3, 20 * MS, 500_000, 4_000_000, true),
        (7, 20 * MS, 50_000, 4_500_000, false),
        (7, 80 * MS, 1_000_000, 16_000_000, true),
        (1, 12 * MS, 500_000, 2_000_000, false),
    ];
    for &(n, q, job, think, exp) in cases {
        let (lat, eq) = light_loop(n, q, job, think, exp, 60);
        let bound = job + 3 * UNMAP_NS + 10_000;
        // After the moving average's first samples (a first think drawn
        // short is a heavy first cycle).
        let later = &lat[3..];
        let over = later.iter().filter(|l| **l > bound).count();
        let worst = later.iter().copied().max().unwrap_or(0);
        let what = format!(
            "{n} equals, quantum {q}, job {job}, think {think} (exp {exp}): \
             {over} of {} jobs over {bound} ns, worst {worst} ns ({lat:?})",
            later.len()
        );
        if exp {
            // The rate is a moving average of drawn think times: after a
            // run of short ones it is above the share with the switch and
            // the hold applies (the bound of `use_rate_tests`); most jobs
            // wait for none. (Before: every job rung within a hold of
            // the slice's start, 45-81% of them here.)
            assert!(over * 5 <= later.len(), "{what}");
            assert!(worst <= bound + q / 4, "{what}");
        } else {
            assert_eq!(over, 0, "{what}");
        }
        // The equals stay within one slice of each other.
        let (lo, hi) = (eq.iter().min().unwrap(), eq.iter().max().unwrap());
        assert!(
            hi - lo <= q,
            "{n} equals, job {job}, think {think}: equal GPU times {eq:?}"
        );
    }
}

/// 50 us jobs with a fixed think beside `n` always-busy equals for 400 ms
/// (the light's first job at 1 ms): the light's jobs and the equals'
/// preemptions in all.
fn short_loop(n: u32, think: Nanos) -> (u64, u64) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    let eq: Vec<QueueId> = (0..n).map(|vm| w.vm(vm, 6, 1, 1)[0]).collect();
    let light = w.vm(100, 6, 1, 1)[0];
    for e in eq {
        w.submit(e, 1_000_000 * MS);
    }
    w.run_until(MS);
    let mut now = w.now;
    let mut jobs: u64 = 0;
    while now < MS + 400 * MS {
        w.submit(light, 50_000);
        while w.work[&light] > 0 {
            now += 10_000;
            w.run_until(now);
        }
        jobs += 1;
        now += think;
        w.run_until(now);
    }
    let preempted = (0..n)
        .map(|vm| w.s.vm_stats(VmId(vm)).unwrap().preemptions)
        .sum();
    (jobs, preempted)
}

#[test]
fn a_loop_too_short_to_pay_for_its_switch_still_waits_for_the_hold() {
    // 50 us jobs every 150-300 us beside 1-3 equals: one switch per cycle
    // at its measured price (a save and a restore of the equal, 2 x 50 us
    // here) would take the light to its share or above:
    // (50 + 100) / (50 + 100 + think) >= 1 / (n + 1). It is served after
    // the hold, so the equals are preempted at most once per hold (plus
    // the slice ends), not at every light job (served at once, it would
    // ring 1300-2700 jobs in the run and preempt at each).
    for (n, think) in [(1, 100_000), (3, 250_000), (2, 200_000)] {
        let (jobs, preempted) = short_loop(n, think);
        let c = cfg(Policy::Hqdmux);
        let run = 400 * MS;
        let hold = (c.quantum_ns[6] / 4).max(c.min_run_ns);
        let bound = run / hold + run / c.quantum_ns[6] + 2;
        assert!(
            preempted <= bound,
            "{n} equals, think {think}: equals preempted {preempted} times in {run} ns \
             (bound {bound}; light jobs {jobs})"
        );
        // And it is still served: about one job per hold.
        assert!(
            jobs >= run / hold * 9 / 10,
            "{n} equals, think {think}: {jobs} light jobs"
        );
    }
}

#[test]
fn a_loop_that_pays_for_its_measured_switch_is_served_at_once() {
    // Churn cases (50 us jobs every 300-600 us beside 1-3 equals)
    // where the saves cost 50 us: one switch per cycle, a save and a
    // restore of the equal (100 us), keeps the light below its share,
    // (50 + 100) / (50 + 100 + think) < 1 / (n + 1), so each job takes the
    // partition at once and preempts an equal. At the modelled price (240
    // us, a whole partition's save and restore) every one of these loops
    // was above its share with the switch and waited for the hold: about
    // one job per hold, the equals preempted once per hold.
    for (n, think) in [(1, 250_000), (3, 550_000), (2, 400_000)] {
        let (jobs, preempted) = short_loop(n, think);
        // Served at once: a job per 50 us job, 50 us save and think (and
        // the 10 us steps of the loop), at least 9/10 of them.
        let cycle = 50_000 + UNMAP_NS + think + 20_000;
        assert!(
            jobs >= 400 * MS / cycle * 9 / 10,
            "{n} equals, think {think}: {jobs} light jobs (cycle {cycle} ns)"
        );
        assert!(
            preempted >= jobs * 9 / 10,
            "{n} equals, think {think}: equals preempted {preempted} times, {jobs} light jobs"
        );
    }
}

#[test]
fn a_wake_weighs_the_switch_once_against_the_history() {
    // A light loop whose moving-average idle is just above the threshold
    // with one switch (100 us: a save and restore of 50 us saves) counted
    // in every cycle: 100 us jobs, 1.5 ms think beside 7 equals of weight
    // 1, so its rate with the switch is (100 + 100) / (200 + 1500) < 1 / 8
    // (idle above 7 x 200 = 1400 us). At a wake the cycle in progress has
    // no use and no idle yet: counted as a sample it shrank the history by
    // a quarter and left the switch whole (idle needed above 7 x (100 +
    // 4/3 x 100) = 1633 us), and every job rung within the owner's hold
    // (2.5 ms, think 1.5 ms) waited for the rest of it.
    let (lat, eq) = light_loop(7, 10 * MS, 100_000, 1_500_000, false, 60);
    let bound = 100_000 + 3 * UNMAP_NS + 10_000;
    let later = &lat[3..];
    let over = later.iter().filter(|l| **l > bound).count();
    assert_eq!(
        over,
        0,
        "{over} of {} jobs over {bound} ns: {lat:?}",
        later.len()
    );
    let (lo, hi) = (eq.iter().min().unwrap(), eq.iter().max().unwrap());
    assert!(hi - lo <= 10 * MS, "equal GPU times {eq:?}");
}
