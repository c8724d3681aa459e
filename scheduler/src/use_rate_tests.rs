//! Under its share by use rate (issue 18, `light` family; `engine/use_rate.rs`):
//! a closed-loop VM whose use over its recent cycles is below its
//! entitlement among its busy equals is served after one bounded hold of
//! the owner, whatever its virtual time says; a VM whose use is not (one
//! that idles briefly before long jobs, or was light and turned heavy)
//! gets no more than its share.

use super::*;

/// The owner's lag hold at priority 6.
fn hold(w: &World) -> Nanos {
    (w.s.config().quantum_ns[6] / 4).max(w.s.config().min_run_ns)
}

/// A closed-loop light VM (weight `lw`, jobs of `job`, think `think`; config `c`)
/// rings its first job at 0, before any equal is busy; `n` always-busy
/// equals of weight `ew` become busy at 50 us, 60 us, ... Returns the
/// latency of each of its jobs after the first (virtual time, 10 us steps).
fn light_latencies(
    c: SchedConfig,
    (n, ew, lw): (u32, u32, u32),
    job: Nanos,
    think: Nanos,
    jobs: u32,
) -> Vec<Nanos> {
    let mut w = World::new(c, slots(1, 2, 4));
    let light = w.vm(100, 6, lw, 1)[0];
    let eq: Vec<QueueId> = (0..n).map(|vm| w.vm(vm, 6, ew, 1)[0]).collect();
    w.submit(light, job);
    for (i, q) in eq.into_iter().enumerate() {
        w.run_until(50_000 + 10_000 * i as Nanos);
        w.submit(q, 1_000_000 * MS);
    }
    let mut lat = Vec::new();
    for k in 0..jobs {
        let start = w.now;
        if k > 0 {
            w.submit(light, job);
        }
        let now = w.run_until_done(light, 10_000);
        if k > 0 {
            lat.push(now - start);
        }
        w.run_until(now + think);
    }
    lat
}

#[test]
fn a_light_closed_loop_that_ran_first_waits_one_hold_not_a_slice() {
    // Before: the light VM's first job ran alone, so its virtual time was
    // ahead of its equals' when its next jobs came; it was not a minimum
    // run behind the owner and waited for the owner's slice end (10 ms)
    // or a round of slices. Its use (job / (job + think)) is below its
    // entitlement in every case here, for any job size, think time and
    // weight: each later job now waits at most one hold of the owner plus
    // the saves around it.
    let cases: &[(u32, u32, u32, Nanos, Nanos)] = &[
        // (equals, equal weight, light weight, job, think)
        (1, 1, 1, 100_000, MS),
        (3, 1, 1, 100_000, MS),
        (7, 1, 1, 100_000, MS),
        (3, 1, 1, 2 * MS, 20 * MS),
        (3, 2, 1, 2 * MS, 40 * MS),
        (2, 1, 4, 7_800_000, 30 * MS),
        (1, 8, 8, 300_000, 2 * MS),
    ];
    let w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    for &(n, ew, lw, job, think) in cases {
        let lat = light_latencies(cfg(Policy::Hqdmux), (n, ew, lw), job, think, 30);
        let bound = job + hold(&w) + 3 * UNMAP_NS + 10_000;
        let worst = lat.iter().copied().max().unwrap_or(0);
        assert!(
            worst <= bound,
            "{n} equals of weight {ew}, light weight {lw}, job {job} ns, think {think} ns: \
             worst latency {worst} ns > {bound} ns ({lat:?})"
        );
    }
}

/// A VM that runs `light` light cycles (100 us jobs, 2 ms think), then
/// rings 2 ms jobs back to back (a closed loop of think 0: it closes no
/// cycle) beside three always-busy equals; over the heavy phase of 2
/// virtual s: (its share of the GPU, the least share of an equal).
fn light_then_heavy(light: u32) -> (f64, f64) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    let eqs: Vec<QueueId> = (0..3).map(|vm| w.vm(vm, 6, 1, 1)[0]).collect();
    let q = w.vm(100, 6, 1, 1)[0];
    for e in eqs {
        w.submit(e, 1_000_000 * MS);
    }
    let mut now = 0;
    for _ in 0..light {
        w.run_until(now + 2 * MS);
        now = w.now;
        w.submit(q, 100_000);
        while w.work[&q] > 0 {
            now += 10_000;
            w.run_until(now);
        }
    }
    let before: Vec<Nanos> = [0, 1, 2, 100].iter().map(|&vm| w.gpu_ns(vm)).collect();
    w.closed_loop(q, 2 * MS);
    let end = w.now + 2_000 * MS;
    w.run_until(end);
    let got: Vec<Nanos> = [0, 1, 2, 100]
        .iter()
        .zip(&before)
        .map(|(&vm, b)| w.gpu_ns(vm) - b)
        .collect();
    let total: Nanos = got.iter().sum();
    let share = |i: usize| got[i] as f64 / total as f64;
    (share(3), (0..3).map(share).fold(f64::INFINITY, f64::min))
}

#[test]
fn a_light_past_buys_no_more_than_a_share_once_heavy() {
    // Its light cycles set a use rate far below its share (0.05 against
    // 0.25); the cycle in progress counts in the rate, so once it keeps
    // demanding it is eligible only by virtual time again and gets no
    // more than an equal share.
    for light in [0, 8, 40] {
        let (share, least) = light_then_heavy(light);
        assert!(
            share <= 0.25 * 1.05,
            "after {light} light cycles: the heavy VM got {share:.3} (equal share 0.25)"
        );
        assert!(
            least >= 0.25 * 0.95,
            "after {light} light cycles: an equal got {least:.3}"
        );
    }
}
