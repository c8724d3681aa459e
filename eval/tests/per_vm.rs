//! Per-VM report and the scenario-language additions, run end to end over
//! the simulated GPU (virtual time).

use eval::driver::{evaluate, simulate};
use eval::scenario::Scenario;
use scheduler::Policy;

/// Two equal always-busy VMs (one counted entry) and a lone VM at priority 9.
const EQUALS: &str = include_str!("scenarios/equals.toml");

#[test]
fn equal_busy_vms_share_evenly_and_a_lone_level_has_no_jain() {
    let sc = Scenario::parse(EQUALS, "equals.toml").unwrap();
    let r = evaluate(&sc, Policy::Timeslice, 1).unwrap();
    let names: Vec<&str> = r.vms.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["busy-0", "busy-1", "loner"]);
    let total: f64 = r.vms.iter().map(|v| v.share).sum();
    assert!((total - 1.0).abs() < 1e-9, "{total}");
    let (a, b) = (&r.vms[0], &r.vms[1]);
    assert!(a.share > 0.3 && b.share > 0.3, "{:?}", r.vms);
    assert!(
        (a.gpu_time_us - b.gpu_time_us).abs() / a.gpu_time_us.max(b.gpu_time_us) < 0.15,
        "{:?}",
        r.vms
    );
    // The scheduler charged GPU time up to the end of the run, never more.
    for v in &r.vms {
        assert!(v.gpu_time_us <= 200_000.0 + 1.0, "{v:?}");
        assert!(v.cu_time_us > 0.0 && v.jobs > 0, "{v:?}");
        assert!(v.p50_us.unwrap() <= v.p99_us.unwrap(), "{v:?}");
    }
    assert_eq!((a.priority, a.weight), (4, 1));
    let j4 = r.jain_by_level[&4].expect("two VMs at level 4");
    assert!(j4 > 0.95, "{j4}");
    assert_eq!(r.jain_by_level[&9], None, "one VM at level 9");
    assert_eq!(r.jain_by_level.len(), 2);
    // Jain over the same VMs as the one-level `jain_index`.
    assert_eq!(r.jain_index, Some(j4));
}

#[test]
fn max_wait_sees_a_low_vm_kept_off_the_gpu() {
    // hqdmux, exclusive: the priority-2 VM waits while the priority-12 VM
    // holds the GPU with back-to-back work for the first 40 ms.
    let text = include_str!("scenarios/wait.toml");
    let sc = Scenario::parse(text, "wait.toml").unwrap();
    let r = evaluate(&sc, Policy::Hqdmux, 1).unwrap();
    let (top, low) = (&r.vms[0], &r.vms[1]);
    assert_eq!(top.jobs, 40, "one burst of 40 jobs: {top:?}");
    // The low VM's doorbell at t=1 us waits behind ~40 ms of top work.
    assert!(low.max_wait_us > 30_000.0, "{low:?}");
    assert!(low.max_wait_us <= 100_000.0, "{low:?}");
    assert!(top.max_wait_us < low.max_wait_us, "{top:?}");
    assert!(low.jobs > 0, "it runs once the top VM is done: {low:?}");
}

#[test]
fn bursty_arrivals_come_n_at_a_time() {
    let text = include_str!("scenarios/bursts.toml");
    let sc = Scenario::parse(text, "bursts.toml").unwrap();
    let out = simulate(&sc, Policy::Hqdmux, 1).unwrap();
    let times: Vec<u64> = out
        .jobs
        .iter()
        .filter(|j| j.tenant == 0)
        .map(|j| j.arrival_ns / 1000)
        .collect();
    // Bursts at 2, 12, 22, 32, 42 ms; 3 jobs on each of 2 queues.
    let mut want = Vec::new();
    for b in 0..5 {
        want.extend(std::iter::repeat_n(2000 + b * 10_000, 6));
    }
    assert_eq!(times, want);
}

#[test]
fn exponential_think_time_varies_the_gaps_around_the_mean() {
    let text = include_str!("scenarios/think.toml");
    let sc = Scenario::parse(text, "think.toml").unwrap();
    let out = simulate(&sc, Policy::Hqdmux, 3).unwrap();
    let jobs: Vec<_> = out.jobs.iter().filter(|j| j.tenant == 0).collect();
    // Gap between a completion and the next arrival = the think time.
    let thinks: Vec<u64> = jobs
        .windows(2)
        .filter_map(|w| Some(w[1].arrival_ns - (w[0].arrival_ns + w[0].latency_ns?)))
        .collect();
    assert!(thinks.len() > 100, "{}", thinks.len());
    let mean = thinks.iter().sum::<u64>() as f64 / thinks.len() as f64;
    assert!((700_000.0..1_300_000.0).contains(&mean), "{mean}");
    let (lo, hi) = (thinks.iter().min().unwrap(), thinks.iter().max().unwrap());
    assert!(*lo < 200_000 && *hi > 2_500_000, "{lo} {hi}");
}

#[test]
fn sla_us_counts_sub_millisecond_misses() {
    let sc = Scenario::parse(EQUALS, "equals.toml").unwrap();
    let loose = evaluate(&sc, Policy::Hqdmux, 1).unwrap();
    let tight = Scenario::parse(&EQUALS.replace("sla_us = 1500", "sla_us = 1"), "t.toml").unwrap();
    let tight = evaluate(&tight, Policy::Hqdmux, 1).unwrap();
    // 200 us jobs (one wave over 304 CUs): none meets 1 us.
    assert_eq!(tight.hi_sla_miss_rate, Some(1.0), "{tight:?}");
    assert!(loose.hi_sla_miss_rate.unwrap() < 1.0, "{loose:?}");
    assert_eq!(loose.hi_p99_us, tight.hi_p99_us);
}

#[test]
fn a_quantum_override_changes_the_slices_of_that_priority_only() {
    let slices = |q: &str| {
        let text = format!("{EQUALS}[scheduler]\nquantum_ns_by_priority = {{ {q} }}\n");
        let sc = Scenario::parse(&text, "q.toml").unwrap();
        simulate(&sc, Policy::Hqdmux, 1).unwrap().gpu.maps
    };
    let base = slices("\"9\" = 10000000");
    let short = slices("\"4\" = 1000000");
    assert!(
        short > base,
        "1 ms slices at level 4 map more often: {short} vs {base}"
    );
}

#[test]
fn promise_checker_runs_the_selected_targets_once_per_seed() {
    use eval::promises::{check_all, CheckOptions};
    let opts = CheckOptions {
        seeds: vec![1, 2],
        policy: Policy::Timeslice,
        filter: Some("weights124".into()),
        exactly_once_ms: None,
    };
    let out = check_all(&opts).unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    let o = &out[0];
    assert!(o.name.starts_with("weights124: "), "{}", o.name);
    assert_eq!(o.measured.len(), 2, "one figure per seed: {o:?}");
    for m in &o.measured {
        let x: f64 = m.strip_prefix("min/max ").unwrap().parse().unwrap();
        assert!(x > 0.0 && x <= 1.0, "{m}");
    }
    // A failing seed keeps its report for the per-VM table.
    assert_eq!(o.pass, o.failures.is_empty(), "{o:?}");
    if let Some(r) = o.failures.first() {
        assert_eq!(r.vms.len(), 3);
    }
}

mod accounting {
    //! Property: whatever the fleet and arrival kinds (including bursty and
    //! exponential think times), the per-VM report is consistent with the
    //! run: one row per VM, shares summing to 1, GPU and CU time inside
    //! the run's capacity, waits inside the run, job counts and latency
    //! percentiles matching the job records, a Jain value exactly for
    //! levels with two VMs or more; and effects land exactly once.

    use eval::driver::evaluate_full;
    use eval::scenario::Scenario;
    use proptest::prelude::*;
    use scheduler::Policy;
    use std::collections::BTreeMap;

    const MS: u64 = 200;

    fn arrival(kind: u8, a: u32, b: u32) -> String {
        match kind {
            0 => format!("{{ kind = \"closed\", outstanding = {} }}", a % 4 + 1),
            1 => format!(
                "{{ kind = \"closed\", think_us = {}, think_dist = \"exponential\" }}",
                b % 3000 + 1
            ),
            2 => format!(
                "{{ kind = \"bursty\", jobs = {}, period_us = {}, offset_us = {} }}",
                a % 6 + 1,
                b % 40_000 + 1000,
                b % 5000
            ),
            3 => format!("{{ kind = \"poisson\", mean_us = {} }}", b % 5000 + 200),
            _ => format!("{{ kind = \"uniform\", period_us = {} }}", b % 20_000 + 500),
        }
    }

    type Args = ((u8, u8, u8, u8), (u8, u32, u32), (u32, u32));

    fn args() -> impl Strategy<Value = Args> {
        (
            (0u8..16, 1u8..4, 1u8..4, 1u8..4),
            (0u8..5, any::<u32>(), any::<u32>()),
            (1u32..400, 10u32..2000),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

        #[test]
        fn per_vm_report_is_consistent_with_the_run(
            tenants in prop::collection::vec(args(), 1..5),
            policy in prop::sample::select(vec![Policy::Hqdmux, Policy::Fifo, Policy::Timeslice]),
            seed in 0u64..1000,
        ) {
            let mut text = format!("name = \"random\"\nduration_ms = {MS}\n");
            for (i, ((prio, weight, count, queues), (kind, a, b), (wgs, cost))) in
                tenants.into_iter().enumerate()
            {
                text += &format!(
                    "[[tenant]]\nname = \"t{i}\"\ncount = {count}\npriority = {prio}\n\
                     weight = {weight}\nqueues = {queues}\nclass = \"lo\"\narrival = {}\n\
                     [[tenant.kernel]]\nworkgroups = {wgs}\nwg_cost_us = {cost}\n",
                    arrival(kind, a, b)
                );
            }
            let sc = Scenario::parse(&text, "random.toml").unwrap();
            let (r, run) = evaluate_full(&sc, policy, seed).unwrap();
            prop_assert_eq!((run.lost_effects, run.duplicate_effects, run.queue_errors), (0, 0, 0));
            let names: Vec<String> = r.vms.iter().map(|v| v.name.clone()).collect();
            prop_assert_eq!(&names, &sc.vm_names());
            let end_us = (MS * 1000) as f64;
            let total_gpu: f64 = r.vms.iter().map(|v| v.gpu_time_us).sum();
            if total_gpu > 0.0 {
                let shares: f64 = r.vms.iter().map(|v| v.share).sum();
                prop_assert!((shares - 1.0).abs() < 1e-9, "{}", shares);
            }
            let cu_total: f64 = r.vms.iter().map(|v| v.cu_time_us).sum();
            prop_assert!(cu_total <= run.cus as f64 * end_us + 1.0, "{} > capacity", cu_total);
            // Stream -> VM: streams are numbered VM by VM, `queues` each.
            let mut stream_vm = Vec::new();
            for (vi, t) in sc.tenants.iter().flat_map(|t| (0..t.count).map(move |_| t)).enumerate() {
                stream_vm.extend(std::iter::repeat_n(vi, t.queues as usize));
            }
            let mut done = vec![0u64; r.vms.len()];
            for j in run.jobs.iter().filter(|j| j.latency_ns.is_some()) {
                done[stream_vm[j.stream]] += 1;
            }
            for (i, v) in r.vms.iter().enumerate() {
                prop_assert!(v.gpu_time_us <= end_us + 1e-6, "{:?}", v);
                prop_assert!(v.max_wait_us <= end_us + 1e-6, "{:?}", v);
                prop_assert_eq!(v.jobs, done[i], "{:?}", v);
                prop_assert_eq!(v.p50_us.is_some(), v.jobs > 0);
                if let (Some(a), Some(b)) = (v.p50_us, v.p99_us) {
                    prop_assert!(a <= b);
                }
            }
            let mut per_level: BTreeMap<u8, usize> = BTreeMap::new();
            for v in &r.vms {
                *per_level.entry(v.priority).or_default() += 1;
            }
            prop_assert_eq!(
                r.jain_by_level.keys().collect::<Vec<_>>(),
                per_level.keys().collect::<Vec<_>>()
            );
            for (p, n) in per_level {
                let level_cu: f64 = r.vms.iter().filter(|v| v.priority == p).map(|v| v.cu_time_us).sum();
                prop_assert_eq!(r.jain_by_level[&p].is_some(), n >= 2 && level_cu > 0.0, "level {}", p);
            }
        }
    }
}
