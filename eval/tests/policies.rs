//! The evaluation targets of the scheduler, checked in virtual time
//! (deterministic: these assert behaviour, not host speed).

use eval::driver::evaluate;
use eval::report::PolicyReport;
use eval::scenario::Scenario;
use scheduler::Policy;

fn shortened(name: &str, ms: u64) -> Scenario {
    let mut s = Scenario::builtin(name).unwrap();
    s.duration_ms = ms;
    s
}

fn run(s: &Scenario, p: Policy) -> PolicyReport {
    evaluate(s, p, s.seed).unwrap()
}

#[test]
fn seed_hqdmux_meets_the_latency_target_and_baselines_invert() {
    let s = shortened("seed", 3000);
    let hq = run(&s, Policy::Hqdmux);
    assert!(hq.hi_jobs >= 25, "{hq:?}");
    let cwsr_per_preemption = hq.save_restore_us_total / hq.preemptions.max(1) as f64;
    assert!(
        hq.hi_p99_us <= 1.05 * hq.hi_isolated_p99_us + cwsr_per_preemption,
        "hqdmux p99 {} vs isolated {} + cwsr {}",
        hq.hi_p99_us,
        hq.hi_isolated_p99_us,
        cwsr_per_preemption
    );
    assert!(hq.lo_throughput_retained >= 0.95, "{hq:?}");
    assert_eq!(hq.hi_sla_miss_rate, 0.0);
    assert!(hq.preemptions > 0);
    let fifo = run(&s, Policy::Fifo);
    assert!(
        fifo.hi_p99_us > 2.0 * hq.hi_p99_us,
        "fifo shows the inversion: {fifo:?}"
    );
    assert!(fifo.hi_sla_miss_rate > 0.5);
    let poll = run(&s, Policy::Poll5ms);
    assert!(
        poll.hi_p99_us > hq.hi_p99_us + 1000.0,
        "poll5ms pays up to a poll period: {poll:?}"
    );
    for r in [&hq, &fifo, &poll] {
        assert_eq!(
            (r.lost_effects, r.duplicate_effects, r.queue_errors),
            (0, 0, 0),
            "{r:?}"
        );
    }
}

#[test]
fn flood_cannot_take_more_than_its_share() {
    let s = shortened("flood", 1000);
    let r = run(&s, Policy::Hqdmux);
    assert!(r.jain_index >= 0.99, "{r:?}");
    // Co-running without slices lets the large kernels crowd the flooder out.
    let fifo = run(&s, Policy::Fifo);
    assert!(fifo.jain_index < r.jain_index, "{fifo:?}");
}

#[test]
fn storm_is_exactly_once_except_under_reset() {
    let s = shortened("storm", 600);
    for p in Policy::ALL {
        let r = run(&s, p);
        assert!(r.workgroups > 10_000, "{r:?}");
        if p == Policy::Reset {
            assert!(
                r.duplicate_effects > 0,
                "reset re-runs applied effects: {r:?}"
            );
        } else {
            assert_eq!((r.lost_effects, r.duplicate_effects), (0, 0), "{r:?}");
        }
        assert_eq!(r.lost_effects, 0);
        if p != Policy::Fifo {
            assert!(r.preemptions > 50, "{r:?}");
        }
    }
}

#[test]
fn weighted_tenants_share_by_weight() {
    let text = r#"
        name = "weights"
        duration_ms = 1500
        [[tenant]]
        name = "one"
        priority = 5
        weight = 1
        class = "lo"
        arrival = { kind = "closed", outstanding = 2 }
        [[tenant.kernel]]
        workgroups = 304
        wg_cost_us = 500
        [[tenant]]
        name = "three"
        priority = 5
        weight = 3
        class = "lo"
        arrival = { kind = "closed", outstanding = 2 }
        [[tenant.kernel]]
        workgroups = 304
        wg_cost_us = 500
    "#;
    let s = Scenario::parse(text, "weights.toml").unwrap();
    let r = run(&s, Policy::Hqdmux);
    // Jain over weight-normalised shares: 1.0 when the 1:3 split holds.
    assert!(r.jain_index >= 0.99, "{r:?}");
    let ts = run(&s, Policy::Timeslice);
    assert!(ts.jain_index < 0.85, "timeslice ignores weights: {ts:?}");
}

#[test]
fn runs_are_deterministic_for_a_seed() {
    let s = shortened("disb-c", 500);
    let strip = |mut r: PolicyReport| {
        r.host_ms = 0.0;
        r.decision_p99_ns = 0.0;
        r
    };
    let a = strip(evaluate(&s, Policy::Hqdmux, 7).unwrap());
    let b = strip(evaluate(&s, Policy::Hqdmux, 7).unwrap());
    let c = strip(evaluate(&s, Policy::Hqdmux, 8).unwrap());
    assert_eq!(a, b);
    assert_ne!(a.hi_p99_us, 0.0);
    assert_ne!(
        (a.hi_p50_us, a.workgroups),
        (c.hi_p50_us, c.workgroups),
        "seed changes arrivals"
    );
}

#[test]
fn live_priority_change_takes_effect_at_the_next_event() {
    let base = shortened("seed", 1000);
    let before = run(&base, Policy::Hqdmux);
    // The operator raises training above inference at 0.5 s: from then on
    // inference bursts wait behind training's exclusive slices.
    let mut changed = base.clone();
    changed.changes = vec![eval::scenario::Change {
        at_ms: 500,
        tenant: "training".into(),
        priority: Some(14),
        weight: None,
    }];
    let after = run(&changed, Policy::Hqdmux);
    assert!(before.hi_sla_miss_rate == 0.0, "{before:?}");
    // Bursts after 0.5 s miss their SLA (waiting for aging); those before do not.
    assert!(after.hi_sla_miss_rate >= 0.4, "{after:?}");
    assert!(after.hi_jobs < before.hi_jobs, "{after:?}");
    assert!(after.hi_p50_us <= before.hi_p50_us * 1.01, "{after:?}");
    // And a scenario file says the same thing.
    let text = r#"
        name = "x"
        duration_ms = 10
        [[tenant]]
        name = "t"
        priority = 3
        class = "lo"
        arrival = { kind = "closed" }
        [[tenant.kernel]]
        workgroups = 4
        wg_cost_us = 10
        [[change]]
        at_ms = 5
        tenant = "nobody"
        priority = 3
    "#;
    let e = Scenario::parse(text, "c.toml").unwrap_err().to_string();
    assert_eq!(
        e,
        "c.toml: tenant 'nobody': field `change`: no tenant of that name"
    );
}
