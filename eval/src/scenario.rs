//! Scenarios are data: a TOML file describes tenants (VM priority and
//! weight, queues, arrival pattern, kernel mix, SLA) and the run length. The
//! built-in scenarios are such files embedded in the binary.

use std::path::Path;

use serde::Deserialize;

/// A whole scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name used in reports.
    pub name: String,
    /// One line saying what it models.
    #[serde(default)]
    pub description: String,
    /// Virtual time to simulate, in milliseconds.
    pub duration_ms: u64,
    /// Default random seed (arrivals); `--seed` overrides.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// GPU size overrides for this scenario.
    #[serde(default)]
    pub gpu: GpuOverride,
    /// Scheduler tunables (`[scheduler]`, see docs/scheduling.md); the
    /// policy is chosen on the command line.
    #[serde(default)]
    pub scheduler: Option<scheduler::SchedConfig>,
    /// The tenants.
    #[serde(rename = "tenant")]
    pub tenants: Vec<Tenant>,
    /// Optional sweep: the scenario runs once per value of one tenant's `count`.
    pub sweep: Option<Sweep>,
    /// Live operator changes during the run (as `hqdmux` CLI steering would do).
    #[serde(default, rename = "change")]
    pub changes: Vec<Change>,
}

/// A live change of every VM of one tenant entry, at a time.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Change {
    /// When (ms of virtual time).
    pub at_ms: u64,
    /// Tenant entry name.
    pub tenant: String,
    /// New VM priority.
    pub priority: Option<u8>,
    /// New VM weight.
    pub weight: Option<u32>,
}

/// Runs a scenario several times with one tenant entry's VM count varied.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    /// Name of the tenant entry whose `count` varies.
    pub tenant: String,
    /// The counts to run.
    pub counts: Vec<u32>,
}

fn default_seed() -> u64 {
    1
}

/// Topology knobs a scenario may set (the rest are MI300X defaults).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuOverride {
    /// XCC count.
    pub xccs: Option<u32>,
    /// CUs per XCC.
    pub cus_per_xcc: Option<u32>,
    /// Partition mode: "SPX", "DPX", "QPX" or "CPX".
    pub partition_mode: Option<String>,
}

/// Latency-measured (real-time) or best-effort (throughput) work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Real-time: job latencies feed the `hi_*` metrics.
    Hi,
    /// Best effort: GPU time feeds `lo_throughput_retained`.
    Lo,
}

/// One VM and the work its queues submit.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    /// Name (VMs get `name` or `name-i` when `count` > 1).
    pub name: String,
    /// How many identical VMs this entry stands for.
    #[serde(default = "one")]
    pub count: u32,
    /// VM priority 0..=15.
    pub priority: u8,
    /// VM weight among equals.
    #[serde(default = "one")]
    pub weight: u32,
    /// Queues per VM; each queue is an independent stream of jobs following
    /// `arrival`.
    #[serde(default = "one")]
    pub queues: u32,
    /// Metric class.
    pub class: Class,
    /// Latency objective for one job (hi tenants), in milliseconds.
    pub sla_ms: Option<u64>,
    /// When jobs arrive.
    pub arrival: Arrival,
    /// The kernels of one job, in order.
    #[serde(rename = "kernel")]
    pub kernels: Vec<KernelSpec>,
}

fn one() -> u32 {
    1
}

/// Job arrival pattern of one queue. Uniform streams of the same tenant
/// entry are spread evenly over the period (stream i starts at
/// `offset_us + i * period_us / streams`).
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Arrival {
    /// One job every `period_us`, starting at `offset_us`.
    Uniform {
        /// Interval.
        period_us: u64,
        /// First arrival.
        #[serde(default)]
        offset_us: u64,
    },
    /// Exponential inter-arrival times with mean `mean_us`.
    Poisson {
        /// Mean interval.
        mean_us: u64,
    },
    /// Keep `outstanding` jobs in flight: a new one as soon as one completes.
    Closed {
        /// Jobs in flight per queue.
        #[serde(default = "one")]
        outstanding: u32,
        /// Think time between a completion and the next submission.
        #[serde(default)]
        think_us: u64,
    },
    /// Explicit arrival times.
    Trace {
        /// Arrival times in microseconds.
        times_us: Vec<u64>,
    },
    /// Ring as fast as possible: keep the ring full of jobs.
    Flood {
        /// Jobs kept queued per queue.
        #[serde(default = "default_flood_depth")]
        depth: u32,
    },
}

fn default_flood_depth() -> u32 {
    8
}

/// One kernel of a job.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSpec {
    /// Workgroups in the grid.
    pub workgroups: u32,
    /// Simulated time one workgroup takes on one CU, in microseconds.
    pub wg_cost_us: u64,
    /// How many times this kernel repeats in the job.
    #[serde(default = "one")]
    pub repeat: u32,
}

/// Scenario errors, naming the file (or built-in) and the reason.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Unknown built-in name.
    #[error("no built-in scenario '{0}' (built in: {1})")]
    Unknown(String, String),
    /// Unreadable file.
    #[error("{0}: cannot read: {1}")]
    Read(String, std::io::Error),
    /// Bad TOML or bad field.
    #[error("{0}: {1}")]
    Parse(String, String),
    /// A value that parses but is not acceptable.
    #[error("{file}: tenant '{tenant}': field `{field}`: {reason}")]
    Invalid {
        /// File or built-in name.
        file: String,
        /// Tenant name.
        tenant: String,
        /// Field.
        field: &'static str,
        /// Why.
        reason: String,
    },
}

/// Built-in scenario files: (name, TOML).
pub const BUILTIN: &[(&str, &str)] = &[
    ("seed", include_str!("../scenarios/seed.toml")),
    ("disb-a", include_str!("../scenarios/disb-a.toml")),
    ("disb-b", include_str!("../scenarios/disb-b.toml")),
    ("disb-c", include_str!("../scenarios/disb-c.toml")),
    ("disb-d", include_str!("../scenarios/disb-d.toml")),
    ("disb-e", include_str!("../scenarios/disb-e.toml")),
    ("flood", include_str!("../scenarios/flood.toml")),
    ("oversub", include_str!("../scenarios/oversub.toml")),
    ("storm", include_str!("../scenarios/storm.toml")),
];

/// Most kernels in one job (each queue's ring holds this many packets).
pub const MAX_JOB_KERNELS: u64 = 512;

/// Most workgroups in one kernel (bounds the exactly-once counters).
pub const MAX_WORKGROUPS: u32 = 4096;

impl Scenario {
    /// A built-in scenario by name.
    pub fn builtin(name: &str) -> Result<Self, ScenarioError> {
        let (_, text) = BUILTIN.iter().find(|(n, _)| *n == name).ok_or_else(|| {
            let names: Vec<_> = BUILTIN.iter().map(|(n, _)| *n).collect();
            ScenarioError::Unknown(name.into(), names.join(", "))
        })?;
        Self::parse(text, &format!("builtin:{name}"))
    }

    /// A scenario file.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let file = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| ScenarioError::Read(file.clone(), e))?;
        Self::parse(&text, &file)
    }

    /// Parses and validates `text` from `file`.
    pub fn parse(text: &str, file: &str) -> Result<Self, ScenarioError> {
        let s: Scenario = toml::from_str(text)
            .map_err(|e| ScenarioError::Parse(file.into(), e.to_string().replace('\n', " ")))?;
        s.validate(file)?;
        Ok(s)
    }

    fn validate(&self, file: &str) -> Result<(), ScenarioError> {
        if self.duration_ms == 0 || self.tenants.is_empty() {
            return Err(ScenarioError::Parse(
                file.into(),
                "duration_ms must be > 0 and at least one [[tenant]]".into(),
            ));
        }
        for t in &self.tenants {
            let bad = |field, reason: String| ScenarioError::Invalid {
                file: file.into(),
                tenant: t.name.clone(),
                field,
                reason,
            };
            if t.priority > 15 {
                return Err(bad(
                    "priority",
                    format!("{} is out of range 0..=15", t.priority),
                ));
            }
            if t.weight == 0 || t.count == 0 || t.queues == 0 || t.queues > 64 {
                return Err(bad(
                    "weight/count/queues",
                    "weight and count >= 1, queues 1..=64".into(),
                ));
            }
            if t.kernels.is_empty() {
                return Err(bad("kernel", "a job needs at least one kernel".into()));
            }
            let packets: u64 = t.kernels.iter().map(|k| k.repeat as u64).sum();
            if packets > MAX_JOB_KERNELS {
                return Err(bad(
                    "kernel.repeat",
                    format!("a job of {packets} kernels exceeds {MAX_JOB_KERNELS} (the ring size)"),
                ));
            }
            for k in &t.kernels {
                if k.workgroups == 0 || k.workgroups > MAX_WORKGROUPS {
                    return Err(bad(
                        "kernel.workgroups",
                        format!("{} is out of range 1..={MAX_WORKGROUPS}", k.workgroups),
                    ));
                }
                if k.wg_cost_us == 0 || k.repeat == 0 {
                    return Err(bad("kernel", "wg_cost_us and repeat must be >= 1".into()));
                }
            }
            match &t.arrival {
                Arrival::Uniform { period_us: 0, .. } | Arrival::Poisson { mean_us: 0 } => {
                    return Err(bad("arrival", "interval must be > 0".into()))
                }
                Arrival::Closed { outstanding: 0, .. } | Arrival::Flood { depth: 0 } => {
                    return Err(bad("arrival", "outstanding/depth must be >= 1".into()))
                }
                _ => {}
            }
            if t.class == Class::Hi && t.sla_ms.is_none() {
                return Err(bad("sla_ms", "hi tenants need an SLA".into()));
            }
        }
        for c in &self.changes {
            let bad = |reason: String| ScenarioError::Invalid {
                file: file.into(),
                tenant: c.tenant.clone(),
                field: "change",
                reason,
            };
            if !self.tenants.iter().any(|t| t.name == c.tenant) {
                return Err(bad("no tenant of that name".into()));
            }
            if c.priority.is_some_and(|p| p > 15) || c.weight == Some(0) {
                return Err(bad("priority must be 0..=15 and weight >= 1".into()));
            }
        }
        if let Some(sw) = &self.sweep {
            let bad = |reason: String| ScenarioError::Invalid {
                file: file.into(),
                tenant: sw.tenant.clone(),
                field: "sweep",
                reason,
            };
            if !self.tenants.iter().any(|t| t.name == sw.tenant) {
                return Err(bad("no tenant of that name".into()));
            }
            if sw.counts.is_empty() || sw.counts.contains(&0) {
                return Err(bad("counts must be a non-empty list of values >= 1".into()));
            }
        }
        Ok(())
    }

    /// The runs this scenario stands for: itself, or one per sweep point
    /// (named `NAME/TENANT=COUNT`).
    pub fn expand(&self) -> Vec<Scenario> {
        let Some(sw) = &self.sweep else {
            return vec![self.clone()];
        };
        sw.counts
            .iter()
            .map(|&n| {
                let mut s = self.clone();
                s.sweep = None;
                s.name = format!("{}/{}={n}", self.name, sw.tenant);
                for t in &mut s.tenants {
                    if t.name == sw.tenant {
                        t.count = n;
                    }
                }
                s
            })
            .collect()
    }

    /// Total VMs.
    pub fn vm_count(&self) -> u32 {
        self.tenants.iter().map(|t| t.count).sum()
    }

    /// Total queues.
    pub fn queue_count(&self) -> u32 {
        self.tenants.iter().map(|t| t.count * t.queues).sum()
    }

    /// The same scenario with only `class` tenants (for isolated baselines).
    pub fn only(&self, class: Class) -> Self {
        let mut s = self.clone();
        s.tenants.retain(|t| t.class == class);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_parses_and_validates() {
        for (name, _) in BUILTIN {
            let s = Scenario::builtin(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(&s.name, name);
            assert!(s.vm_count() >= 2, "{name}");
        }
        assert!(Scenario::builtin("nope")
            .unwrap_err()
            .to_string()
            .contains("built in: seed"));
    }

    #[test]
    fn bad_scenarios_name_the_tenant_and_field() {
        let base = r#"
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
        "#;
        assert!(Scenario::parse(base, "f.toml").is_ok());
        let e =
            Scenario::parse(&base.replace("priority = 3", "priority = 30"), "f.toml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "f.toml: tenant 't': field `priority`: 30 is out of range 0..=15"
        );
        let e = Scenario::parse(&base.replace("workgroups = 4", "workgroups = 0"), "f.toml")
            .unwrap_err();
        assert!(e.to_string().contains("kernel.workgroups"), "{e}");
        let e = Scenario::parse(&base.replace("class = \"lo\"", "class = \"hi\""), "f.toml")
            .unwrap_err();
        assert!(e.to_string().contains("sla_ms"), "{e}");
        let e = Scenario::parse(&base.replace("closed", "bursty"), "f.toml").unwrap_err();
        assert!(e.to_string().starts_with("f.toml: "), "{e}");
        let e = Scenario::parse(&format!("{base}\nextra = 1"), "f.toml").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }
}
