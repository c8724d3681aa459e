//! The evaluation report: one row per (scenario, policy), as JSON (field names
//! fixed, for tools) or as a policy x metric table.

use serde::Serialize;

/// Metrics of one scenario run under one policy.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PolicyReport {
    /// Scenario name.
    pub scenario: String,
    /// Policy name.
    pub policy: String,
    /// Seed used for arrivals.
    pub seed: u64,
    /// High-priority (class hi) job latency percentiles, submission to last completion.
    pub hi_p50_us: f64,
    /// p99 of the same.
    pub hi_p99_us: f64,
    /// p99.9 of the same.
    pub hi_p999_us: f64,
    /// p99 of the same jobs with the lo tenants removed (same policy, same seed).
    pub hi_isolated_p99_us: f64,
    /// Fraction of hi jobs over their SLA (jobs still unfinished at the end count as misses).
    pub hi_sla_miss_rate: f64,
    /// Hi jobs completed.
    pub hi_jobs: u64,
    /// CU time used by lo work / CU time left by hi work (capacity minus hi CU time).
    pub lo_throughput_retained: f64,
    /// Jain's fairness index over weight-normalised CU time of the VMs at the
    /// priority level with the most VMs (1.0 = perfectly weighted).
    pub jain_index: f64,
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
    /// Host wall time for the run, ms.
    pub host_ms: f64,
}

/// Value at quantile `q` (0..=1) of `sorted` (nearest rank); 0 for none.
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Jain's fairness index of `x`: (sum x)^2 / (n * sum x^2); 1.0 for fewer than 2 values.
pub fn jain(x: &[f64]) -> f64 {
    if x.len() < 2 {
        return 1.0;
    }
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    if sq == 0.0 {
        return 1.0;
    }
    sum * sum / (x.len() as f64 * sq)
}

/// The human form: one row per policy, one column per metric.
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
            "{:<10} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>7.3} {:>7.3} {:>6.3} {:>7} {:>9.0} {:>5.1} {:>5} {:>5}\n",
            r.policy,
            r.hi_p50_us,
            r.hi_p99_us,
            r.hi_p999_us,
            r.hi_isolated_p99_us,
            r.hi_sla_miss_rate,
            r.lo_throughput_retained,
            r.jain_index,
            r.preemptions,
            r.save_restore_us_total,
            r.hqd_utilisation * 100.0,
            r.lost_effects,
            r.duplicate_effects
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&v, 0.999), 100);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn jain_index_bounds() {
        assert!((jain(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0]) - 0.5).abs() < 1e-12);
        assert!((jain(&[3.0, 1.0]) - 0.8).abs() < 1e-12);
        assert_eq!(jain(&[5.0]), 1.0);
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
}
