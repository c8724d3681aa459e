//! The evaluation report: one row per (scenario, policy), as JSON (field names
//! fixed, for tools) or as a policy x metric table.

use std::collections::BTreeMap;

use serde::Serialize;

/// Metrics of one scenario run under one policy. A metric without data in
/// the run (no hi tenant, no lo tenant, fewer than two lo VMs to compare) is
/// `None`: JSON `null`, `-` in the table — never a number that reads as a
/// result.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PolicyReport {
    /// Scenario name.
    pub scenario: String,
    /// Policy name.
    pub policy: String,
    /// Seed used for arrivals.
    pub seed: u64,
    /// High-priority (class hi) job latency percentiles, submission to last
    /// completion (`None`: no hi job completed).
    pub hi_p50_us: Option<f64>,
    /// p99 of the same.
    pub hi_p99_us: Option<f64>,
    /// p99.9 of the same.
    pub hi_p999_us: Option<f64>,
    /// p99 of the same jobs with the lo tenants removed (same policy, same seed).
    pub hi_isolated_p99_us: Option<f64>,
    /// Fraction of hi jobs over their SLA (jobs still unfinished at the end
    /// count as misses once late; `None`: no hi job counted).
    pub hi_sla_miss_rate: Option<f64>,
    /// Hi jobs completed.
    pub hi_jobs: u64,
    /// CU time used by lo work / CU time left by hi work (capacity minus hi
    /// CU time); `None` without lo tenants.
    pub lo_throughput_retained: Option<f64>,
    /// Jain's fairness index over weight-normalised CU time of the lo
    /// (backlogged, best-effort) VMs at the priority level with the most lo
    /// VMs (1.0 = perfectly weighted); `None` when fewer than two lo VMs
    /// share a level. Hi VMs are left out: they are demand-limited, and
    /// their service is measured by latency.
    pub jain_index: Option<f64>,
    /// Preemptions issued (unmaps with SAVE_WAVES or RESET_WAVES while work remained).
    pub preemptions: u64,
    /// Modelled CWSR save + restore time, summed.
    pub save_restore_us_total: f64,
    /// Mean fraction of HQD slots occupied.
    pub hqd_utilisation: f64,
    /// Workgroups whose effect never landed (mark counter 0 at completion).
    pub lost_effects: u64,
    /// Extra applications of workgroup effects (mark counter > 1).
    pub duplicate_effects: u64,
    /// Queues that ended in an error state.
    pub queue_errors: u64,
    /// Simulated workgroups completed.
    pub workgroups: u64,
    /// Scheduler decision cost per event, p99, in ns (host time).
    pub decision_p99_ns: f64,
    /// Host wall time for the run, ms (with the isolated baseline run).
    pub host_ms: f64,
    /// Host wall ms the simulation of this run alone (not its isolated
    /// baseline) spent per ms of virtual time: the simulation's cost.
    pub host_ms_per_virtual_ms: f64,
    /// The same in host CPU ms of the simulating thread: the cost without
    /// the time a loaded machine made it wait (the figure the cost bound
    /// is checked against).
    pub host_cpu_ms_per_virtual_ms: f64,
    /// Scheduler decisions (events handled by the engine) per ms of
    /// virtual time: the same cost in virtual terms, independent of the
    /// host's speed and load.
    pub decisions_per_virtual_ms: f64,
    /// One row per VM, in VM order (tenant entries in file order).
    pub vms: Vec<VmGpuReport>,
    /// VM priority -> Jain's index over the CU time / weight of that
    /// level's VMs (`None` below two VMs). JSON: keys are strings.
    pub jain_by_level: BTreeMap<u8, Option<f64>>,
}

/// What one VM got in a run. JSON field names are a contract.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct VmGpuReport {
    /// The tenant's name; `NAME-i` for the i-th (from 0) VM of an entry
    /// with `count` > 1.
    pub name: String,
    /// VM priority at the end of the run.
    pub priority: u8,
    /// VM weight at the end of the run.
    pub weight: u32,
    /// GPU time the scheduler charged the VM (`VmStats::gpu_ns`), us.
    pub gpu_time_us: f64,
    /// CU time of its completed kernels (workgroups x cost), CU-us.
    pub cu_time_us: f64,
    /// `gpu_time_us` / the sum over all VMs (0 when nothing ran).
    pub share: f64,
    /// Jobs completed.
    pub jobs: u64,
    /// Job latency (arrival to last completion) p50, us; `None` without jobs.
    pub p50_us: Option<f64>,
    /// p99 of the same.
    pub p99_us: Option<f64>,
    /// Longest a queue of this VM had work (doorbell seen) without a slot, us.
    pub max_wait_us: f64,
}

/// Value at quantile `q` (0..=1) of `sorted` (nearest rank); `None` when empty.
pub fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// Jain's fairness index of `x`: (sum x)^2 / (n * sum x^2); `None` for fewer
/// than 2 values or when every value is 0 (nothing to compare).
pub fn jain(x: &[f64]) -> Option<f64> {
    if x.len() < 2 {
        return None;
    }
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    if sq == 0.0 {
        return None;
    }
    Some(sum * sum / (x.len() as f64 * sq))
}

/// `v` right-aligned in `w` columns with `prec` decimals, or `-`.
fn opt(v: Option<f64>, w: usize, prec: usize) -> String {
    match v {
        Some(x) => format!("{x:>w$.prec$}"),
        None => format!("{:>w$}", "-"),
    }
}

/// The human form: one row per policy, one column per metric (`-`: no data).
pub fn table(rows: &[PolicyReport]) -> String {
    let mut out = String::new();
    let mut scenario = "";
    for r in rows {
        if r.scenario != scenario {
            scenario = &r.scenario;
            out += &format!(
                "\nscenario {scenario} (seed {})\n{:<10} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>6} {:>7} {:>9} {:>5} {:>5} {:>5}\n",
                r.seed, "policy", "hi_p50", "hi_p99", "hi_p999", "iso_p99", "sla_miss", "lo_ret", "jain", "preempt", "cwsr_us", "hqd%", "lost", "dup"
            );
        }
        out += &format!(
            "{:<10} {} {} {} {} {} {} {} {:>7} {:>9.0} {:>5.1} {:>5} {:>5}\n",
            r.policy,
            opt(r.hi_p50_us, 9, 0),
            opt(r.hi_p99_us, 9, 0),
            opt(r.hi_p999_us, 9, 0),
            opt(r.hi_isolated_p99_us, 9, 0),
            opt(r.hi_sla_miss_rate, 8, 3),
            opt(r.lo_throughput_retained, 7, 3),
            opt(r.jain_index, 6, 3),
            r.preemptions,
            r.save_restore_us_total,
            r.hqd_utilisation * 100.0,
            r.lost_effects,
            r.duplicate_effects
        );
    }
    out
}

/// The per-VM section of the human form: one block per (scenario, policy),
/// one row per VM, then the Jain index per priority level.
pub fn per_vm_table(rows: &[PolicyReport]) -> String {
    let mut out = String::new();
    for r in rows {
        out += &format!(
            "\nper VM: scenario {} policy {} (seed {})\n{:<16} {:>4} {:>6} {:>11} {:>12} {:>7} {:>6} {:>10} {:>10} {:>12}\n",
            r.scenario,
            r.policy,
            r.seed,
            "vm",
            "prio",
            "weight",
            "gpu_time_ms",
            "cu_time_cu_s",
            "share_%",
            "jobs",
            "p50_us",
            "p99_us",
            "max_wait_us"
        );
        for v in &r.vms {
            out += &format!(
                "{:<16} {:>4} {:>6} {:>11.1} {:>12.3} {:>7.2} {:>6} {} {} {:>12.0}\n",
                v.name,
                v.priority,
                v.weight,
                v.gpu_time_us / 1000.0,
                v.cu_time_us / 1e6,
                v.share * 100.0,
                v.jobs,
                opt(v.p50_us, 10, 0),
                opt(v.p99_us, 10, 0),
                v.max_wait_us
            );
        }
        let levels: Vec<String> = r
            .jain_by_level
            .iter()
            .rev()
            .map(|(p, j)| format!("{p}: {}", opt(*j, 0, 3)))
            .collect();
        out += &format!("jain by level (CU time / weight): {}\n", levels.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 0.999), Some(100));
        assert_eq!(percentile(&[7], 0.99), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn jain_index_bounds() {
        assert!((jain(&[1.0, 1.0, 1.0]).unwrap() - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0]).unwrap() - 0.5).abs() < 1e-12);
        assert!((jain(&[3.0, 1.0]).unwrap() - 0.8).abs() < 1e-12);
        assert_eq!(jain(&[5.0]), None, "one VM: nothing to compare");
        assert_eq!(jain(&[0.0, 0.0]), None);
    }

    #[test]
    fn missing_metrics_are_null_in_json_and_dash_in_the_table() {
        let r = PolicyReport {
            scenario: "s".into(),
            policy: "hqdmux".into(),
            lo_throughput_retained: Some(0.5),
            ..Default::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        assert!(v["hi_p99_us"].is_null() && v["jain_index"].is_null());
        assert_eq!(v["lo_throughput_retained"], 0.5);
        let t = table(&[r]);
        let row = t.lines().find(|l| l.starts_with("hqdmux")).unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        // policy, 4 latencies, sla_miss, lo_ret, jain, ...
        assert_eq!(&cols[1..9], &["-", "-", "-", "-", "-", "0.500", "-", "0"]);
    }

    #[test]
    fn json_has_the_contract_field_names() {
        let r = PolicyReport {
            scenario: "s".into(),
            policy: "p".into(),
            ..Default::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        for f in [
            "scenario",
            "policy",
            "hi_p50_us",
            "hi_p99_us",
            "hi_p999_us",
            "hi_isolated_p99_us",
            "hi_sla_miss_rate",
            "lo_throughput_retained",
            "jain_index",
            "preemptions",
            "save_restore_us_total",
            "hqd_utilisation",
            "lost_effects",
            "duplicate_effects",
        ] {
            assert!(v.get(f).is_some(), "missing {f}");
        }
        assert!(table(&[r]).contains("scenario s"));
    }

    fn two_vm_report() -> PolicyReport {
        PolicyReport {
            scenario: "s".into(),
            policy: "p".into(),
            vms: vec![
                VmGpuReport {
                    name: "a".into(),
                    priority: 3,
                    weight: 1,
                    gpu_time_us: 3000.0,
                    cu_time_us: 2.5e6,
                    share: 0.75,
                    jobs: 4,
                    p50_us: Some(700.0),
                    p99_us: Some(900.0),
                    max_wait_us: 12.0,
                },
                VmGpuReport {
                    name: "b-1".into(),
                    priority: 12,
                    weight: 2,
                    share: 0.25,
                    ..Default::default()
                },
            ],
            jain_by_level: [(3, None), (12, Some(0.5))].into_iter().collect(),
            ..Default::default()
        }
    }

    #[test]
    fn per_vm_json_has_exactly_the_contract_names() {
        let v = serde_json::to_value(two_vm_report()).unwrap();
        let vms = v["vms"].as_array().unwrap();
        assert_eq!(vms.len(), 2);
        let mut keys: Vec<&str> = vms[0]
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        keys.sort_unstable();
        let mut want = [
            "name",
            "priority",
            "weight",
            "gpu_time_us",
            "cu_time_us",
            "share",
            "jobs",
            "p50_us",
            "p99_us",
            "max_wait_us",
        ];
        want.sort_unstable();
        assert_eq!(keys, want);
        assert_eq!(vms[0]["p99_us"], 900.0);
        assert!(vms[1]["p50_us"].is_null() && vms[1]["p99_us"].is_null());
        assert_eq!(vms[1]["name"], "b-1");
        // Keyed by priority as a string; values number or null.
        let j = v["jain_by_level"].as_object().unwrap();
        assert_eq!(j.len(), 2);
        assert!(j["3"].is_null());
        assert_eq!(j["12"], 0.5);
    }

    #[test]
    fn per_vm_table_has_units_one_row_per_vm_and_levels() {
        let t = per_vm_table(&[two_vm_report()]);
        assert!(t.contains("per VM: scenario s policy p"), "{t}");
        for h in [
            "gpu_time_ms",
            "cu_time_cu_s",
            "share_%",
            "p99_us",
            "max_wait_us",
        ] {
            assert!(t.contains(h), "{h}: {t}");
        }
        let a: Vec<&str> = t
            .lines()
            .find(|l| l.starts_with("a "))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(
            a,
            ["a", "3", "1", "3.0", "2.500", "75.00", "4", "700", "900", "12"]
        );
        let b = t.lines().find(|l| l.starts_with("b-1 ")).unwrap();
        assert_eq!(b.split_whitespace().nth(7), Some("-"), "{b}");
        assert!(t.contains("12: 0.500, 3: -"), "{t}");
    }
}
