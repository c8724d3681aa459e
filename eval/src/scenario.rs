//! Scenarios are data: a TOML file describes tenants (VM priority and
//! weight, queues, arrival pattern, kernel mix, SLA) and the run length. The
//! built-in scenarios are such files embedded in the binary.

use std::path::Path;

use gpu::topology::{GpuTopology, PartitionMode};
use scheduler::{PRIORITY_RANGE, WEIGHT_RANGE};

/// "`v` is out of range lo..=hi".
fn out_of_range<T: std::fmt::Display>(v: T, r: &std::ops::RangeInclusive<T>) -> String {
    format!("{v} is out of range {}..={}", r.start(), r.end())
}
use scheduler::Policy;
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
    /// policy is chosen on the command line (`policy` here is refused).
    /// Besides the engine's own keys, `quantum_ns_by_priority = { "12" =
    /// 2000000 }` overrides the quantum of the VM priorities it names (on
    /// top of `quantum_ns`, see docs/scenarios.md).
    #[serde(default, deserialize_with = "sched_section")]
    pub scheduler: Option<scheduler::SchedConfig>,
    /// The tenants.
    #[serde(rename = "tenant", default)]
    pub tenants: Vec<Tenant>,
    /// Optional sweep: the scenario runs once per value of one tenant's `count`.
    pub sweep: Option<Sweep>,
    /// Live operator changes during the run (as `hqdmux` CLI steering would do).
    #[serde(default, rename = "change")]
    pub changes: Vec<Change>,
}

/// A live operator change, at a time: new VM priority and/or weight of
/// every VM of one tenant entry, and/or a new scheduling policy.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Change {
    /// When (ms of virtual time, before `duration_ms`).
    pub at_ms: u64,
    /// Tenant entry name (needed with `priority` or `weight`).
    #[serde(default)]
    pub tenant: Option<String>,
    /// New VM priority.
    pub priority: Option<u8>,
    /// New VM weight.
    pub weight: Option<u32>,
    /// New scheduling policy (every VM).
    pub policy: Option<Policy>,
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
    /// Queue priority 0..=15 written in the MQD of every queue of the entry
    /// (as a guest would; orders queues within the VM only).
    #[serde(default)]
    pub queue_priority: u8,
    /// VM weight among equals.
    #[serde(default = "one")]
    pub weight: u32,
    /// Queues per VM; each queue is an independent stream of jobs following
    /// `arrival`.
    #[serde(default = "one")]
    pub queues: u32,
    /// Metric class.
    pub class: Class,
    /// Latency objective for one job (hi tenants), in milliseconds
    /// (`sla_us` for sub-millisecond objectives; not both).
    pub sla_ms: Option<u64>,
    /// Latency objective for one job, in microseconds.
    pub sla_us: Option<u64>,
    /// When jobs arrive.
    pub arrival: Arrival,
    /// The kernels of one job, in order.
    #[serde(rename = "kernel", default)]
    pub kernels: Vec<KernelSpec>,
    /// The VM's preemption timeout (ms; `[[vm]] preempt_timeout_ms` of the
    /// fleet config): a dequeue of its queue that has not finished this long
    /// after the request resets the queue (error 22). Default 9000.
    pub preempt_timeout_ms: Option<u64>,
    /// How the VM's guest behaves (`normal`, or a hostile behaviour).
    #[serde(default)]
    pub behaviour: Behaviour,
}

/// A tenant's guest behaviour (docs/scenarios.md, "Hostile tenants").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Behaviour {
    /// Writes packets, publishes their headers, rings the doorbell.
    #[default]
    Normal,
    /// Writes packet bodies and advances the write index, but leaves the
    /// headers INVALID (never published), and rings: no work ever runs.
    Stall,
    /// Normal submission of its kernels, meant with huge workgroup counts of
    /// tiny workgroups (`workgroups` up to 2^31, `wg_cost_ns` 1).
    Wgflood,
    /// Rings its doorbell at every arrival without writing any packet.
    Dbflood,
}

impl Behaviour {
    /// A hostile behaviour.
    pub fn hostile(self) -> bool {
        self != Behaviour::Normal
    }
}

fn one() -> u32 {
    1
}

impl KernelSpec {
    /// Per-workgroup cost from the scenario (ns), before the GPU's floor.
    pub fn cost_ns(&self) -> u64 {
        self.wg_cost_ns
            .unwrap_or(self.wg_cost_us.saturating_mul(1000))
    }
}

impl Tenant {
    /// The SLA in ns (`sla_us` or `sla_ms`), saturating.
    pub fn sla_ns(&self) -> Option<u64> {
        self.sla_us
            .map(|u| u.saturating_mul(1000))
            .or(self.sla_ms.map(|m| m.saturating_mul(1_000_000)))
    }
}

/// Key of the per-priority quantum override in `[scheduler]`.
pub const QUANTUM_BY_PRIORITY: &str = "quantum_ns_by_priority";

/// The `quantum_ns_by_priority` table of a `[scheduler]` section, checked:
/// (priority, quantum ns) pairs, or (field, reason).
fn quantum_overrides(sched: &toml::Table) -> Result<Vec<(usize, u64)>, (&'static str, String)> {
    let Some(v) = sched.get(QUANTUM_BY_PRIORITY) else {
        return Ok(Vec::new());
    };
    let Some(t) = v.as_table() else {
        return Err((
            QUANTUM_BY_PRIORITY,
            "must be a table of VM priority (\"0\"..\"15\") = quantum in ns".into(),
        ));
    };
    let mut out = Vec::new();
    for (k, v) in t {
        let p = k
            .parse::<u8>()
            .ok()
            .filter(|p| PRIORITY_RANGE.contains(p))
            .ok_or_else(|| {
                (
                    QUANTUM_BY_PRIORITY,
                    format!(
                        "key '{k}' is not a VM priority {}..={}",
                        PRIORITY_RANGE.start(),
                        PRIORITY_RANGE.end()
                    ),
                )
            })?;
        let q = v.as_integer().ok_or_else(|| {
            (
                QUANTUM_BY_PRIORITY,
                format!("priority {p}: the quantum must be an integer (ns)"),
            )
        })?;
        if q <= 0 {
            return Err((
                QUANTUM_BY_PRIORITY,
                format!("priority {p}: the quantum must be > 0 ns"),
            ));
        }
        out.push((p as usize, q as u64));
    }
    Ok(out)
}

/// `[scheduler]`: the engine's tunables plus `quantum_ns_by_priority`.
fn sched_section<'de, D>(d: D) -> Result<Option<scheduler::SchedConfig>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error;
    let mut t = toml::Table::deserialize(d)?;
    let over = quantum_overrides(&t).map_err(|(f, r)| D::Error::custom(format!("`{f}`: {r}")))?;
    t.remove(QUANTUM_BY_PRIORITY);
    let mut cfg: scheduler::SchedConfig =
        toml::Value::Table(t).try_into().map_err(D::Error::custom)?;
    for (p, q) in over {
        cfg.quantum_ns[p] = q;
    }
    Ok(Some(cfg))
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
        /// Think time between a completion and the next submission (the
        /// mean with `think_dist = "exponential"`).
        #[serde(default)]
        think_us: u64,
        /// Distribution of the think time.
        #[serde(default)]
        think_dist: ThinkDist,
    },
    /// `jobs` jobs at once every `period_us`, starting at `offset_us` (every
    /// queue of the entry bursts at the same instants).
    Bursty {
        /// Jobs per burst, per queue.
        jobs: u32,
        /// Interval between bursts.
        period_us: u64,
        /// First burst.
        #[serde(default)]
        offset_us: u64,
    },
    /// Explicit arrival times: a non-empty, sorted list inside the run.
    Trace {
        /// Arrival times in microseconds.
        times_us: Vec<u64>,
        /// Stream i of the entry replays the list shifted by
        /// `i * queue_offset_us` (arrivals past the end are not run).
        #[serde(default)]
        queue_offset_us: u64,
    },
    /// Ring as fast as possible: keep the ring full of jobs.
    Flood {
        /// Jobs kept queued per queue.
        #[serde(default = "default_flood_depth")]
        depth: u32,
    },
}

impl Arrival {
    /// The time values (us) of this arrival kind, with their field names.
    fn times_us(&self) -> Vec<(&'static str, u64)> {
        match self {
            Arrival::Uniform {
                period_us,
                offset_us,
            }
            | Arrival::Bursty {
                period_us,
                offset_us,
                ..
            } => vec![
                ("arrival.period_us", *period_us),
                ("arrival.offset_us", *offset_us),
            ],
            Arrival::Poisson { mean_us } => vec![("arrival.mean_us", *mean_us)],
            Arrival::Closed { think_us, .. } => vec![("arrival.think_us", *think_us)],
            Arrival::Trace {
                times_us,
                queue_offset_us,
            } => vec![
                ("arrival.times_us", times_us.last().copied().unwrap_or(0)),
                ("arrival.queue_offset_us", *queue_offset_us),
            ],
            Arrival::Flood { .. } => vec![],
        }
    }
}

fn default_flood_depth() -> u32 {
    8
}

/// Think-time distribution of a closed loop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThinkDist {
    /// Exactly `think_us`.
    #[default]
    Fixed,
    /// Exponential with mean `think_us`.
    Exponential,
}

/// One kernel of a job.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSpec {
    /// Workgroups in the grid.
    pub workgroups: u32,
    /// Simulated time one workgroup takes on one CU, in microseconds.
    #[serde(default)]
    pub wg_cost_us: u64,
    /// The same in nanoseconds (for tiny workgroups; overrides `wg_cost_us`).
    #[serde(default)]
    pub wg_cost_ns: Option<u64>,
    /// How many times this kernel repeats in the job.
    #[serde(default = "one")]
    pub repeat: u32,
    /// The kernel has no CWSR save point (`abi::kernel::flags::NO_SAVE_POINT`):
    /// a save waits for its in-flight workgroups. With a long `wg_cost_us`
    /// this is a **hung** tenant: its preemption times out and the queue
    /// is reset (docs/scenarios.md).
    #[serde(default)]
    pub no_save_point: bool,
    /// Work-items per workgroup (1..=1024, default 64: one wave): the
    /// dispatch packet's `workgroup_size_x`. With `vgprs` it sizes the
    /// workgroup's share of a CU (docs/gpu-model.md, "Occupancy").
    #[serde(default = "default_wg_items")]
    pub wg_items: u16,
    /// VGPRs per work-item (0..=512) written into the kernel descriptor;
    /// 0 (the default) = not given: each workgroup occupies a whole CU, as
    /// the model did before occupancy. With it, workgroups of different
    /// queues may share a CU when they fit.
    #[serde(default)]
    pub vgprs: u16,
    /// LDS bytes per workgroup (the packet's `group_segment_size`, at most
    /// 65536).
    #[serde(default)]
    pub lds_bytes: u32,
}

fn default_wg_items() -> u16 {
    64
}

/// Scenario errors, naming the file (or built-in), the place, the field
/// and the reason.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Unknown built-in name.
    #[error("no built-in scenario '{0}' (built in: {1})")]
    Unknown(String, String),
    /// Unreadable file.
    #[error("{0}: cannot read: {1}")]
    Read(String, std::io::Error),
    /// Bad TOML or a field of the wrong type or name (the TOML parser's
    /// message, with its line and caret snippet).
    #[error("{0}: {1}")]
    Parse(String, String),
    /// A tenant value that parses but is not acceptable.
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
    /// Any other value that parses but is not acceptable.
    #[error("{file}: {place}: field `{field}`: {reason}")]
    Field {
        /// File or built-in name.
        file: String,
        /// Where: `scenario`, `[gpu]`, `[scheduler]`, `sweep`, `[[change]] N`.
        place: String,
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
    // Issue 9: the two promises (see docs/scenarios.md).
    ("prio-inv", include_str!("../scenarios/prio-inv.toml")),
    (
        "prio-inv-long",
        include_str!("../scenarios/prio-inv-long.toml"),
    ),
    (
        "prio-inv-rev",
        include_str!("../scenarios/prio-inv-rev.toml"),
    ),
    ("ladder16", include_str!("../scenarios/ladder16.toml")),
    (
        "equal-queues",
        include_str!("../scenarios/equal-queues.toml"),
    ),
    ("equal-depth", include_str!("../scenarios/equal-depth.toml")),
    (
        "equal-jobsize",
        include_str!("../scenarios/equal-jobsize.toml"),
    ),
    ("weights124", include_str!("../scenarios/weights124.toml")),
    ("undershare", include_str!("../scenarios/undershare.toml")),
    ("rt5k", include_str!("../scenarios/rt5k.toml")),
    ("rt200", include_str!("../scenarios/rt200.toml")),
    // Issue 9 variants with occupancy (docs/scheduling.md).
    ("rt5k-wide", include_str!("../scenarios/rt5k-wide.toml")),
    ("rt5k-narrow", include_str!("../scenarios/rt5k-narrow.toml")),
    ("rt5k-short", include_str!("../scenarios/rt5k-short.toml")),
    ("rt5k-few", include_str!("../scenarios/rt5k-few.toml")),
    ("rt1k-8wg", include_str!("../scenarios/rt1k-8wg.toml")),
    ("rt200-1k", include_str!("../scenarios/rt200-1k.toml")),
    ("aging", include_str!("../scenarios/aging.toml")),
    // Issue 11: a hung (non-preemptible) tenant is reset after its timeout.
    ("hung", include_str!("../scenarios/hung.toml")),
    ("iso-stall", include_str!("../scenarios/iso-stall.toml")),
    (
        "iso-stall-hi",
        include_str!("../scenarios/iso-stall-hi.toml"),
    ),
    ("iso-wgflood", include_str!("../scenarios/iso-wgflood.toml")),
    (
        "iso-wgflood-hi",
        include_str!("../scenarios/iso-wgflood-hi.toml"),
    ),
    ("iso-dbflood", include_str!("../scenarios/iso-dbflood.toml")),
    (
        "iso-dbflood-hi",
        include_str!("../scenarios/iso-dbflood-hi.toml"),
    ),
    ("iso-shapes", include_str!("../scenarios/iso-shapes.toml")),
    (
        "iso-wgflood-w4",
        include_str!("../scenarios/iso-wgflood-w4.toml"),
    ),
    (
        "iso-wgflood-2good",
        include_str!("../scenarios/iso-wgflood-2good.toml"),
    ),
    (
        "iso-wgflood-cost",
        include_str!("../scenarios/iso-wgflood-cost.toml"),
    ),
];

/// Most kernels in one job (each queue's ring holds this many packets).
pub const MAX_JOB_KERNELS: u64 = 512;

/// Most workgroups in one kernel (bounds the exactly-once counters).
pub const MAX_WORKGROUPS: u32 = 4096;
/// Most workgroups of one kernel of a `wgflood` tenant (2^31).
pub const MAX_FLOOD_WORKGROUPS: u32 = 1 << 31;
/// Longest run (ms of virtual time): one hour.
pub const MAX_DURATION_MS: u64 = 3_600_000;
/// Largest time value of an arrival (us): one hour, so that every sum of
/// times in ns stays far from overflowing.
pub const MAX_ARRIVAL_US: u64 = MAX_DURATION_MS * 1000;
/// Most queues of one run (count x queues over every tenant entry).
pub const MAX_QUEUES: u64 = 4096;
/// Largest scenario file read (bytes): `/dev/zero` or a runaway file is an
/// error, not a host out of memory.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// The UTF-8 text of `path`, at most `max_bytes` (an `InvalidData` error
/// past it): a configuration or scenario file that is `/dev/zero` or a
/// runaway file is an error, not a host out of memory. Shared by scenario
/// files ([`MAX_FILE_BYTES`]) and the VMM's fleet and devices files.
pub fn read_bounded(path: &Path, max_bytes: u64) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(max_bytes.saturating_add(1))
        .read_to_string(&mut text)?;
    if text.len() as u64 > max_bytes {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max_bytes} bytes"),
        ));
    }
    Ok(text)
}

/// Most points of a `sweep` (each is a whole run).
pub const MAX_SWEEP_POINTS: usize = 64;
/// Most modelled time of one workgroup (ns; the simulator's limit).
pub const MAX_WG_COST_NS: u64 = 1 << 48;

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
            read_bounded(path, MAX_FILE_BYTES).map_err(|e| ScenarioError::Read(file.clone(), e))?;
        Self::parse(&text, &file)
    }

    /// Parses and validates `text` from `file`.
    pub fn parse(text: &str, file: &str) -> Result<Self, ScenarioError> {
        let raw: toml::Table =
            toml::from_str(text).map_err(|e| ScenarioError::Parse(file.into(), e.to_string()))?;
        let sched = raw.get("scheduler").and_then(|v| v.as_table());
        if let Some(Err((field, reason))) = sched.map(quantum_overrides) {
            return Err(ScenarioError::Field {
                file: file.into(),
                place: "[scheduler]".into(),
                field,
                reason,
            });
        }
        let s: Scenario =
            toml::from_str(text).map_err(|e| ScenarioError::Parse(file.into(), e.to_string()))?;
        // `policy` in [scheduler] would be silently overridden by --policy.
        if sched.is_some_and(|t| t.contains_key("policy")) {
            return Err(ScenarioError::Field {
                file: file.into(),
                place: "[scheduler]".into(),
                field: "policy",
                reason: "the policy is chosen with --policy (a [[change]] with `policy` \
                         switches it during the run)"
                    .into(),
            });
        }
        s.validate(file)?;
        Ok(s)
    }

    /// The GPU of this scenario: MI300X defaults with its `[gpu]` overrides.
    /// Error: (field, reason).
    pub fn topology(&self) -> Result<GpuTopology, (&'static str, String)> {
        let mut t = GpuTopology::default();
        if let Some(x) = self.gpu.xccs {
            t.xccs = x;
        }
        if let Some(c) = self.gpu.cus_per_xcc {
            t.cus_per_xcc = c;
        }
        if let Some(m) = &self.gpu.partition_mode {
            t.partition_mode = match m.as_str() {
                "SPX" => PartitionMode::Spx,
                "DPX" => PartitionMode::Dpx,
                "QPX" => PartitionMode::Qpx,
                "CPX" => PartitionMode::Cpx,
                _ => {
                    return Err((
                        "partition_mode",
                        format!("'{m}' is not SPX, DPX, QPX or CPX"),
                    ))
                }
            };
        }
        t.validate()
            .and_then(|()| gpusim::SimParams::default().validate(&t))
            .map_err(|e| {
                use gpu::topology::TopologyError as E;
                let field = match &e {
                    E::Zero(f) => *f,
                    E::TooLarge { field, .. } | E::ControlRecordTooLarge { field, .. } => *field,
                    E::PartitionMismatch { .. } => "partition_mode",
                    E::NoUserSlots { .. } => "reserved_queues_per_pipe",
                };
                (field, e.to_string())
            })?;
        Ok(t)
    }

    fn validate(&self, file: &str) -> Result<(), ScenarioError> {
        let field = |place: &str, field: &'static str, reason: String| ScenarioError::Field {
            file: file.into(),
            place: place.into(),
            field,
            reason,
        };
        if self.duration_ms == 0 {
            return Err(field("scenario", "duration_ms", "must be > 0".into()));
        }
        if self.duration_ms > MAX_DURATION_MS {
            return Err(field(
                "scenario",
                "duration_ms",
                format!("{} is out of range 1..={MAX_DURATION_MS}", self.duration_ms),
            ));
        }
        if self.tenants.is_empty() {
            return Err(field(
                "scenario",
                "tenant",
                "at least one [[tenant]] is needed".into(),
            ));
        }
        self.topology()
            .map_err(|(f, reason)| field("[gpu]", f, reason))?;
        if let Some(c) = &self.scheduler {
            c.validate().map_err(|e| match e {
                scheduler::SchedError::Config { field: f, reason } => {
                    field("[scheduler]", f, reason)
                }
                other => field("[scheduler]", "scheduler", other.to_string()),
            })?;
        }
        let end_us = self.duration_ms * 1000;
        for (i, t) in self.tenants.iter().enumerate() {
            let bad = |field, reason: String| ScenarioError::Invalid {
                file: file.into(),
                tenant: t.name.clone(),
                field,
                reason,
            };
            if self.tenants[..i].iter().any(|o| o.name == t.name) {
                return Err(bad(
                    "name",
                    "another [[tenant]] has this name (changes and sweeps name tenants)".into(),
                ));
            }
            if !PRIORITY_RANGE.contains(&t.priority) {
                return Err(bad("priority", out_of_range(t.priority, &PRIORITY_RANGE)));
            }
            if !PRIORITY_RANGE.contains(&t.queue_priority) {
                return Err(bad(
                    "queue_priority",
                    out_of_range(t.queue_priority, &PRIORITY_RANGE),
                ));
            }
            if t.weight == 0 {
                return Err(bad("weight", "must be >= 1".into()));
            }
            if !WEIGHT_RANGE.contains(&t.weight) {
                return Err(bad("weight", out_of_range(t.weight, &WEIGHT_RANGE)));
            }
            if t.count == 0 {
                return Err(bad("count", "must be >= 1".into()));
            }
            if t.queues == 0 || t.queues > 64 {
                return Err(bad(
                    "queues",
                    format!("{} is out of range 1..=64", t.queues),
                ));
            }
            if t.kernels.is_empty() {
                return Err(bad(
                    "kernel",
                    "a job needs at least one [[tenant.kernel]]".into(),
                ));
            }
            let packets: u64 = t.kernels.iter().map(|k| k.repeat as u64).sum();
            if packets > MAX_JOB_KERNELS {
                return Err(bad(
                    "kernel.repeat",
                    format!("a job of {packets} kernels exceeds {MAX_JOB_KERNELS} (the ring size)"),
                ));
            }
            if let Some(ms) = t.preempt_timeout_ms {
                let r = mdev::arbiter::PREEMPT_TIMEOUT_MS_RANGE;
                if !r.contains(&ms) {
                    return Err(bad(
                        "preempt_timeout_ms",
                        format!("{ms} is out of range {}..={}", r.start(), r.end()),
                    ));
                }
            }
            for k in &t.kernels {
                let max = if t.behaviour == Behaviour::Wgflood {
                    MAX_FLOOD_WORKGROUPS
                } else {
                    MAX_WORKGROUPS
                };
                if k.workgroups == 0 || k.workgroups > max {
                    return Err(bad(
                        "kernel.workgroups",
                        format!("{} is out of range 1..={max}", k.workgroups),
                    ));
                }
                if k.cost_ns() == 0 {
                    return Err(bad("kernel.wg_cost_us", "must be >= 1".into()));
                }
                if k.cost_ns() > MAX_WG_COST_NS {
                    return Err(bad(
                        "kernel.wg_cost_us",
                        format!(
                            "{} ns is more than 2^48 ns (the model's limit per workgroup)",
                            k.cost_ns()
                        ),
                    ));
                }
                if k.repeat == 0 {
                    return Err(bad("kernel.repeat", "must be >= 1".into()));
                }
                if k.wg_items == 0 || k.wg_items > 1024 {
                    return Err(bad(
                        "kernel.wg_items",
                        format!("{} is out of range 1..=1024", k.wg_items),
                    ));
                }
                if k.vgprs > 512 {
                    return Err(bad(
                        "kernel.vgprs",
                        format!("{} is out of range 0..=512", k.vgprs),
                    ));
                }
                if k.lds_bytes > 65536 {
                    return Err(bad(
                        "kernel.lds_bytes",
                        format!("{} is out of range 0..=65536", k.lds_bytes),
                    ));
                }
            }
            for (f, us) in t.arrival.times_us() {
                if us > MAX_ARRIVAL_US {
                    return Err(bad(
                        f,
                        format!("{us} us is out of range (at most {MAX_ARRIVAL_US}, one hour)"),
                    ));
                }
            }
            match &t.arrival {
                Arrival::Closed { outstanding, .. } if *outstanding as u64 > MAX_JOB_KERNELS => {
                    return Err(bad(
                        "arrival.outstanding",
                        format!("{outstanding} is out of range 1..={MAX_JOB_KERNELS}"),
                    ))
                }
                Arrival::Flood { depth } if *depth as u64 > MAX_JOB_KERNELS => {
                    return Err(bad(
                        "arrival.depth",
                        format!("{depth} is out of range 1..={MAX_JOB_KERNELS}"),
                    ))
                }
                Arrival::Uniform { period_us: 0, .. } => {
                    return Err(bad("arrival.period_us", "must be > 0".into()))
                }
                Arrival::Poisson { mean_us: 0 } => {
                    return Err(bad("arrival.mean_us", "must be > 0".into()))
                }
                Arrival::Closed { outstanding: 0, .. } => {
                    return Err(bad("arrival.outstanding", "must be >= 1".into()))
                }
                Arrival::Closed {
                    think_us: 0,
                    think_dist: ThinkDist::Exponential,
                    ..
                } => {
                    return Err(bad(
                        "arrival.think_us",
                        "must be > 0 with think_dist = \"exponential\" (it is the mean)".into(),
                    ))
                }
                Arrival::Bursty { jobs, .. } if *jobs == 0 || *jobs as u64 > MAX_JOB_KERNELS => {
                    return Err(bad(
                        "arrival.jobs",
                        format!("{jobs} is out of range 1..={MAX_JOB_KERNELS}"),
                    ))
                }
                Arrival::Bursty { period_us: 0, .. } => {
                    return Err(bad("arrival.period_us", "must be > 0".into()))
                }
                Arrival::Bursty { offset_us, .. } if *offset_us >= end_us => {
                    return Err(bad(
                        "arrival.offset_us",
                        format!(
                            "{offset_us} us is not inside the run (duration_ms = {})",
                            self.duration_ms
                        ),
                    ))
                }
                Arrival::Flood { depth: 0 } => {
                    return Err(bad("arrival.depth", "must be >= 1".into()))
                }
                Arrival::Trace {
                    times_us,
                    queue_offset_us,
                } => {
                    let Some(&last) = times_us.last() else {
                        return Err(bad(
                            "arrival.times_us",
                            "must list at least one arrival time".into(),
                        ));
                    };
                    if let Some(w) = times_us.windows(2).position(|w| w[1] < w[0]) {
                        return Err(bad(
                            "arrival.times_us",
                            format!(
                                "must be sorted: {} (index {}) comes after {}",
                                times_us[w + 1],
                                w + 1,
                                times_us[w]
                            ),
                        ));
                    }
                    if last >= end_us {
                        return Err(bad(
                            "arrival.times_us",
                            format!(
                                "{last} us is not inside the run (duration_ms = {})",
                                self.duration_ms
                            ),
                        ));
                    }
                    if *queue_offset_us >= end_us {
                        return Err(bad(
                            "arrival.queue_offset_us",
                            format!(
                                "{queue_offset_us} us is not inside the run (duration_ms = {})",
                                self.duration_ms
                            ),
                        ));
                    }
                }
                _ => {}
            }
            if t.sla_ms.is_some() && t.sla_us.is_some() {
                return Err(bad("sla_us", "give `sla_ms` or `sla_us`, not both".into()));
            }
            if t.sla_us == Some(0) || t.sla_ms == Some(0) {
                let f = if t.sla_us.is_some() {
                    "sla_us"
                } else {
                    "sla_ms"
                };
                return Err(bad(f, "must be > 0".into()));
            }
            if t.class == Class::Hi && t.sla_ns().is_none() {
                return Err(bad(
                    "sla_ms",
                    "hi tenants need an SLA (`sla_ms` or `sla_us`)".into(),
                ));
            }
        }
        for (i, c) in self.changes.iter().enumerate() {
            let place = format!("[[change]] {}", i + 1);
            let bad = |f, reason: String| field(&place, f, reason);
            if c.priority.is_none() && c.weight.is_none() && c.policy.is_none() {
                return Err(bad(
                    "priority",
                    "a change needs `priority`, `weight` or `policy`".into(),
                ));
            }
            if c.at_ms >= self.duration_ms {
                return Err(bad(
                    "at_ms",
                    format!(
                        "{} is not before the end of the run (duration_ms = {})",
                        c.at_ms, self.duration_ms
                    ),
                ));
            }
            match &c.tenant {
                Some(name) if !self.tenants.iter().any(|t| &t.name == name) => {
                    return Err(bad("tenant", format!("no tenant named '{name}'")));
                }
                None if c.priority.is_some() || c.weight.is_some() => {
                    return Err(bad(
                        "tenant",
                        "`priority` and `weight` changes name a tenant".into(),
                    ));
                }
                _ => {}
            }
            if let Some(p) = c.priority.filter(|p| !PRIORITY_RANGE.contains(p)) {
                return Err(bad("priority", out_of_range(p, &PRIORITY_RANGE)));
            }
            if c.weight == Some(0) {
                return Err(bad("weight", "must be >= 1".into()));
            }
            if let Some(w) = c.weight.filter(|w| !WEIGHT_RANGE.contains(w)) {
                return Err(bad("weight", out_of_range(w, &WEIGHT_RANGE)));
            }
        }
        if let Some(sw) = &self.sweep {
            if !self.tenants.iter().any(|t| t.name == sw.tenant) {
                return Err(field(
                    "sweep",
                    "tenant",
                    format!("no tenant named '{}'", sw.tenant),
                ));
            }
            if sw.counts.is_empty() || sw.counts.contains(&0) {
                return Err(field(
                    "sweep",
                    "counts",
                    "must be a non-empty list of values >= 1".into(),
                ));
            }
            if sw.counts.len() > MAX_SWEEP_POINTS {
                return Err(field(
                    "sweep",
                    "counts",
                    format!(
                        "{} points exceed {MAX_SWEEP_POINTS} (each is a whole run)",
                        sw.counts.len()
                    ),
                ));
            }
        }
        // Every run (each sweep point) must fit: no allocation sized by a
        // count the file makes up.
        let queues = |swept: Option<u32>| -> u64 {
            self.tenants
                .iter()
                .map(|t| {
                    let count = match (&self.sweep, swept) {
                        (Some(sw), Some(n)) if sw.tenant == t.name => n,
                        _ => t.count,
                    };
                    u64::from(count) * u64::from(t.queues)
                })
                .sum()
        };
        let too_many = |n: u64| {
            format!("{n} queues (count x queues summed over every [[tenant]]) exceed {MAX_QUEUES}")
        };
        let n = queues(None);
        if n > MAX_QUEUES {
            return Err(field("scenario", "count", too_many(n)));
        }
        if let Some(sw) = &self.sweep {
            if let Some(n) = sw.counts.iter().map(|&c| queues(Some(c))).max() {
                if n > MAX_QUEUES {
                    return Err(field("sweep", "counts", too_many(n)));
                }
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

    /// VM names in VM order: `NAME`, or `NAME-i` (i from 0) for the VMs
    /// of an entry with `count` > 1.
    pub fn vm_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for t in &self.tenants {
            if t.count == 1 {
                out.push(t.name.clone());
            } else {
                out.extend((0..t.count).map(|i| format!("{}-{i}", t.name)));
            }
        }
        out
    }

    /// The same scenario with only the tenant entries named in `names`
    /// (for isolated baselines of one tenant).
    pub fn only_tenants(&self, names: &[&str]) -> Self {
        let mut s = self.clone();
        s.tenants.retain(|t| names.contains(&t.name.as_str()));
        s.changes
            .retain(|c| c.tenant.as_deref().is_none_or(|n| names.contains(&n)));
        s
    }

    /// The baseline of an isolation scenario: every hostile tenant entry
    /// becomes a legitimately busy VM (same count) of the first well-behaved
    /// entry's priority and job shape (keeping the hostile entry's weight),
    /// closed loop with 2 jobs in flight. Named `NAME+busy`.
    pub fn busy_baseline(&self) -> Self {
        let mut s = self.clone();
        s.name = format!("{}+busy", self.name);
        let Some(good) = self.tenants.iter().find(|t| !t.behaviour.hostile()) else {
            return s;
        };
        for t in &mut s.tenants {
            if t.behaviour.hostile() {
                t.behaviour = Behaviour::Normal;
                t.priority = good.priority;
                t.queues = 1;
                t.class = Class::Lo;
                t.arrival = Arrival::Closed {
                    outstanding: 2,
                    think_us: 0,
                    think_dist: ThinkDist::Fixed,
                };
                t.kernels = good.kernels.clone();
            }
        }
        s.changes.clear();
        s
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

    const BASE: &str = r#"
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

    fn err(text: &str) -> String {
        Scenario::parse(text, "f.toml").unwrap_err().to_string()
    }

    /// `BASE` with `from` replaced by `to` (which must occur).
    fn with(from: &str, to: &str) -> String {
        assert!(BASE.contains(from), "{from}");
        BASE.replacen(from, to, 1)
    }

    #[test]
    fn bad_tenant_values_name_one_field_each() {
        assert!(Scenario::parse(BASE, "f.toml").is_ok());
        let cases = [
            (
                "priority = 3",
                "priority = 30",
                "priority",
                "30 is out of range 0..=15",
            ),
            (
                "priority = 3",
                "priority = 3\nqueue_priority = 16",
                "queue_priority",
                "16 is out of range 0..=15",
            ),
            (
                "priority = 3",
                "priority = 3\nweight = 0",
                "weight",
                "must be >= 1",
            ),
            (
                "priority = 3",
                "priority = 3\nweight = 1001",
                "weight",
                "1001 is out of range 1..=1000",
            ),
            (
                "priority = 3",
                "priority = 3\ncount = 0",
                "count",
                "must be >= 1",
            ),
            (
                "priority = 3",
                "priority = 3\nqueues = 65",
                "queues",
                "65 is out of range 1..=64",
            ),
            (
                "priority = 3",
                "priority = 3\nqueues = 0",
                "queues",
                "0 is out of range 1..=64",
            ),
            (
                "workgroups = 4",
                "workgroups = 0",
                "kernel.workgroups",
                "0 is out of range 1..=4096",
            ),
            (
                "wg_cost_us = 10",
                "wg_cost_us = 0",
                "kernel.wg_cost_us",
                "must be >= 1",
            ),
            (
                "wg_cost_us = 10",
                "wg_cost_us = 10\nrepeat = 0",
                "kernel.repeat",
                "must be >= 1",
            ),
            (
                "wg_cost_us = 10",
                "wg_cost_us = 10\nwg_items = 1025",
                "kernel.wg_items",
                "1025 is out of range 1..=1024",
            ),
            (
                "wg_cost_us = 10",
                "wg_cost_us = 10\nvgprs = 513",
                "kernel.vgprs",
                "513 is out of range 0..=512",
            ),
            (
                "wg_cost_us = 10",
                "wg_cost_us = 10\nrepeat = 513",
                "kernel.repeat",
                "a job of 513 kernels exceeds 512 (the ring size)",
            ),
            (
                "class = \"lo\"",
                "class = \"hi\"",
                "sla_ms",
                "hi tenants need an SLA (`sla_ms` or `sla_us`)",
            ),
            (
                "{ kind = \"closed\" }",
                "{ kind = \"closed\", outstanding = 0 }",
                "arrival.outstanding",
                "must be >= 1",
            ),
            (
                "{ kind = \"closed\" }",
                "{ kind = \"flood\", depth = 0 }",
                "arrival.depth",
                "must be >= 1",
            ),
            (
                "{ kind = \"closed\" }",
                "{ kind = \"uniform\", period_us = 0 }",
                "arrival.period_us",
                "must be > 0",
            ),
            (
                "{ kind = \"closed\" }",
                "{ kind = \"poisson\", mean_us = 0 }",
                "arrival.mean_us",
                "must be > 0",
            ),
        ];
        for (from, to, field, reason) in cases {
            assert_eq!(
                err(&with(from, to)),
                format!("f.toml: tenant 't': field `{field}`: {reason}")
            );
        }
        // No kernel at all.
        let text = BASE.split("[[tenant.kernel]]").next().unwrap();
        assert_eq!(
            err(text),
            "f.toml: tenant 't': field `kernel`: a job needs at least one [[tenant.kernel]]"
        );
        // Duplicate names.
        let dup = format!("{BASE}{}", &BASE[BASE.find("[[tenant]]").unwrap()..]);
        assert_eq!(
            err(&dup),
            "f.toml: tenant 't': field `name`: another [[tenant]] has this name \
             (changes and sweeps name tenants)"
        );
    }

    #[test]
    fn trace_arrivals_must_be_a_sorted_list_inside_the_run() {
        let trace = |list: &str| {
            with(
                "{ kind = \"closed\" }",
                &format!("{{ kind = \"trace\", {list} }}"),
            )
        };
        assert!(Scenario::parse(&trace("times_us = [0, 5, 5, 9999]"), "f.toml").is_ok());
        assert_eq!(
            err(&trace("times_us = []")),
            "f.toml: tenant 't': field `arrival.times_us`: must list at least one arrival time"
        );
        assert_eq!(
            err(&trace("times_us = [10, 300, 200]")),
            "f.toml: tenant 't': field `arrival.times_us`: must be sorted: 200 (index 2) comes after 300"
        );
        assert_eq!(
            err(&trace("times_us = [10, 10000]")),
            "f.toml: tenant 't': field `arrival.times_us`: 10000 us is not inside the run (duration_ms = 10)"
        );
        assert_eq!(
            err(&trace("times_us = [10], queue_offset_us = 20000")),
            "f.toml: tenant 't': field `arrival.queue_offset_us`: 20000 us is not inside the run (duration_ms = 10)"
        );
    }

    #[test]
    fn huge_values_are_errors_not_overflows_or_oom() {
        const M: &str = "9223372036854775807";
        let arrival = |a: &str| with("{ kind = \"closed\" }", a);
        let cases = [
            (
                with("duration_ms = 10", &format!("duration_ms = {M}")),
                "f.toml: scenario: field `duration_ms`: 9223372036854775807 is out of range 1..=3600000",
            ),
            (
                with("priority = 3", "priority = 3\ncount = 4294967295"),
                "f.toml: scenario: field `count`: 4294967295 queues (count x queues summed over every [[tenant]]) exceed 4096",
            ),
            (
                with("priority = 3", "priority = 3\ncount = 65\nqueues = 64"),
                "f.toml: scenario: field `count`: 4160 queues (count x queues summed over every [[tenant]]) exceed 4096",
            ),
            (
                with(
                    "duration_ms = 10",
                    "duration_ms = 10\nsweep = { tenant = \"t\", counts = [1, 4294967295] }",
                ),
                "f.toml: sweep: field `counts`: 4294967295 queues (count x queues summed over every [[tenant]]) exceed 4096",
            ),
            (
                arrival(&format!("{{ kind = \"uniform\", period_us = {M} }}")),
                "f.toml: tenant 't': field `arrival.period_us`: 9223372036854775807 us is out of range (at most 3600000000, one hour)",
            ),
            (
                arrival(&format!("{{ kind = \"uniform\", period_us = 5, offset_us = {M} }}")),
                "f.toml: tenant 't': field `arrival.offset_us`: 9223372036854775807 us is out of range (at most 3600000000, one hour)",
            ),
            (
                arrival(&format!("{{ kind = \"closed\", think_us = {M} }}")),
                "f.toml: tenant 't': field `arrival.think_us`: 9223372036854775807 us is out of range (at most 3600000000, one hour)",
            ),
            (
                arrival(&format!("{{ kind = \"poisson\", mean_us = {M} }}")),
                "f.toml: tenant 't': field `arrival.mean_us`: 9223372036854775807 us is out of range (at most 3600000000, one hour)",
            ),
            (
                arrival(&format!("{{ kind = \"bursty\", jobs = 1, period_us = {M} }}")),
                "f.toml: tenant 't': field `arrival.period_us`: 9223372036854775807 us is out of range (at most 3600000000, one hour)",
            ),
            (
                arrival("{ kind = \"closed\", outstanding = 4294967295 }"),
                "f.toml: tenant 't': field `arrival.outstanding`: 4294967295 is out of range 1..=512",
            ),
            (
                arrival("{ kind = \"flood\", depth = 4294967295 }"),
                "f.toml: tenant 't': field `arrival.depth`: 4294967295 is out of range 1..=512",
            ),
            (
                with("wg_cost_us = 10", &format!("wg_cost_ns = {M}")),
                "f.toml: tenant 't': field `kernel.wg_cost_us`: 9223372036854775807 ns is more than 2^48 ns (the model's limit per workgroup)",
            ),
            (
                with("wg_cost_us = 10", &format!("wg_cost_us = {M}")),
                "f.toml: tenant 't': field `kernel.wg_cost_us`: 18446744073709551615 ns is more than 2^48 ns (the model's limit per workgroup)",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(err(&text), want);
        }
        let e = Scenario::load(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e, "/dev/zero: cannot read: larger than 16777216 bytes",
            "an endless file is refused, not read into memory"
        );
        let points = vec!["1"; 65].join(", ");
        assert_eq!(
            err(&with(
                "duration_ms = 10",
                &format!("duration_ms = 10\nsweep = {{ tenant = \"t\", counts = [{points}] }}"),
            )),
            "f.toml: sweep: field `counts`: 65 points exceed 64 (each is a whole run)"
        );
        // The limits themselves are accepted.
        for ok in [
            with("duration_ms = 10", "duration_ms = 3600000"),
            with("priority = 3", "priority = 3\ncount = 64\nqueues = 64"),
            arrival("{ kind = \"uniform\", period_us = 3600000000, offset_us = 3600000000 }"),
            arrival("{ kind = \"flood\", depth = 512 }"),
            with("wg_cost_us = 10", "wg_cost_ns = 281474976710656"),
        ] {
            Scenario::parse(&ok, "f.toml").unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn bad_sections_changes_and_sweeps_name_place_and_field() {
        assert_eq!(
            err(&with("duration_ms = 10", "duration_ms = 0")),
            "f.toml: scenario: field `duration_ms`: must be > 0"
        );
        assert_eq!(
            err(&format!("{BASE}[gpu]\npartition_mode = \"XPX\"\n")),
            "f.toml: [gpu]: field `partition_mode`: 'XPX' is not SPX, DPX, QPX or CPX"
        );
        let e = err(&format!("{BASE}[gpu]\nxccs = 0\n"));
        assert!(e.starts_with("f.toml: [gpu]: field `xccs`: "), "{e}");
        let e = err(&format!(
            "{BASE}[gpu]\nxccs = 3\npartition_mode = \"DPX\"\n"
        ));
        assert!(
            e.starts_with("f.toml: [gpu]: field `partition_mode`: "),
            "{e}"
        );
        assert_eq!(
            err(&format!("{BASE}[scheduler]\naging_ns = 0\n")),
            "f.toml: [scheduler]: field `aging_ns`: must be > 0 (0 would boost every waiting queue at once)"
        );
        assert_eq!(
            err(&format!("{BASE}[scheduler]\nbaseline_quantum_ns = 0\n")),
            "f.toml: [scheduler]: field `baseline_quantum_ns`: must be > 0"
        );
        let e = err(&format!("{BASE}[scheduler]\npolicy = \"fifo\"\n"));
        assert!(
            e.starts_with(
                "f.toml: [scheduler]: field `policy`: the policy is chosen with --policy"
            ),
            "{e}"
        );
        let change = |body: &str| format!("{BASE}[[change]]\n{body}\n");
        assert!(Scenario::parse(&change("at_ms = 5\npolicy = \"fifo\""), "f.toml").is_ok());
        assert!(
            Scenario::parse(&change("at_ms = 5\ntenant = \"t\"\nweight = 2"), "f.toml").is_ok()
        );
        assert_eq!(
            err(&change("at_ms = 5\ntenant = \"t\"")),
            "f.toml: [[change]] 1: field `priority`: a change needs `priority`, `weight` or `policy`"
        );
        assert_eq!(
            err(&change("at_ms = 10\ntenant = \"t\"\npriority = 4")),
            "f.toml: [[change]] 1: field `at_ms`: 10 is not before the end of the run (duration_ms = 10)"
        );
        assert_eq!(
            err(&change("at_ms = 5\ntenant = \"nobody\"\npriority = 4")),
            "f.toml: [[change]] 1: field `tenant`: no tenant named 'nobody'"
        );
        assert_eq!(
            err(&change("at_ms = 5\npriority = 4")),
            "f.toml: [[change]] 1: field `tenant`: `priority` and `weight` changes name a tenant"
        );
        assert_eq!(
            err(&change("at_ms = 5\ntenant = \"t\"\npriority = 16")),
            "f.toml: [[change]] 1: field `priority`: 16 is out of range 0..=15"
        );
        assert_eq!(
            err(&change("at_ms = 5\ntenant = \"t\"\nweight = 0")),
            "f.toml: [[change]] 1: field `weight`: must be >= 1"
        );
        let e = err(&change("at_ms = 5\npolicy = \"lottery\""));
        assert!(e.starts_with("f.toml: ") && e.contains("lottery"), "{e}");
        assert_eq!(
            err(&with(
                "duration_ms = 10",
                "duration_ms = 10\nsweep = { tenant = \"u\", counts = [1] }"
            )),
            "f.toml: sweep: field `tenant`: no tenant named 'u'"
        );
        assert_eq!(
            err(&with(
                "duration_ms = 10",
                "duration_ms = 10\nsweep = { tenant = \"t\", counts = [] }"
            )),
            "f.toml: sweep: field `counts`: must be a non-empty list of values >= 1"
        );
    }

    #[test]
    fn sla_us_gives_sub_millisecond_objectives_and_excludes_sla_ms() {
        let hi = |sla: &str| with("class = \"lo\"", &format!("class = \"hi\"\n{sla}"));
        let s = Scenario::parse(&hi("sla_us = 250"), "f.toml").unwrap();
        assert_eq!(s.tenants[0].sla_ns(), Some(250_000));
        let s = Scenario::parse(&hi("sla_ms = 3"), "f.toml").unwrap();
        assert_eq!(s.tenants[0].sla_ns(), Some(3_000_000));
        assert_eq!(
            err(&hi("sla_ms = 3\nsla_us = 250")),
            "f.toml: tenant 't': field `sla_us`: give `sla_ms` or `sla_us`, not both"
        );
        assert_eq!(
            err(&hi("sla_us = 0")),
            "f.toml: tenant 't': field `sla_us`: must be > 0"
        );
        assert_eq!(
            err(&hi("sla_ms = 0")),
            "f.toml: tenant 't': field `sla_ms`: must be > 0"
        );
    }

    fn arrival(a: &str) -> Result<Arrival, String> {
        Scenario::parse(&with("{ kind = \"closed\" }", a), "f.toml")
            .map(|s| s.tenants[0].arrival.clone())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn bursty_arrivals_parse_and_bad_values_name_the_field() {
        match arrival("{ kind = \"bursty\", jobs = 8, period_us = 5000, offset_us = 10 }") {
            Ok(Arrival::Bursty {
                jobs: 8,
                period_us: 5000,
                offset_us: 10,
            }) => {}
            other => panic!("{other:?}"),
        }
        let e = |a: &str| arrival(a).unwrap_err();
        assert_eq!(
            e("{ kind = \"bursty\", jobs = 0, period_us = 5000 }"),
            "f.toml: tenant 't': field `arrival.jobs`: 0 is out of range 1..=512"
        );
        assert_eq!(
            e("{ kind = \"bursty\", jobs = 513, period_us = 5000 }"),
            "f.toml: tenant 't': field `arrival.jobs`: 513 is out of range 1..=512"
        );
        assert_eq!(
            e("{ kind = \"bursty\", jobs = 2, period_us = 0 }"),
            "f.toml: tenant 't': field `arrival.period_us`: must be > 0"
        );
        assert_eq!(
            e("{ kind = \"bursty\", jobs = 2, period_us = 10, offset_us = 10000 }"),
            "f.toml: tenant 't': field `arrival.offset_us`: 10000 us is not inside the run (duration_ms = 10)"
        );
        let missing = e("{ kind = \"bursty\", period_us = 10 }");
        assert!(
            missing.contains("jobs") && missing.contains('^'),
            "{missing}"
        );
    }

    #[test]
    fn closed_loops_take_an_exponential_think_time() {
        match arrival("{ kind = \"closed\", think_us = 300, think_dist = \"exponential\" }") {
            Ok(Arrival::Closed {
                outstanding: 1,
                think_us: 300,
                think_dist: ThinkDist::Exponential,
            }) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            arrival("{ kind = \"closed\", think_us = 300 }"),
            Ok(Arrival::Closed {
                think_dist: ThinkDist::Fixed,
                ..
            })
        ));
        assert_eq!(
            arrival("{ kind = \"closed\", think_dist = \"exponential\" }").unwrap_err(),
            "f.toml: tenant 't': field `arrival.think_us`: must be > 0 with \
             think_dist = \"exponential\" (it is the mean)"
        );
        let e = arrival("{ kind = \"closed\", think_dist = \"gamma\" }").unwrap_err();
        assert!(e.contains("gamma") && e.contains('^'), "{e}");
    }

    #[test]
    fn quantum_override_sets_only_the_named_priorities() {
        let s = Scenario::parse(
            &format!(
                "{BASE}[scheduler]\naging_ns = 7\nquantum_ns_by_priority = {{ \"12\" = 2000000, \"0\" = 5 }}\n"
            ),
            "f.toml",
        )
        .unwrap();
        let c = s.scheduler.unwrap();
        let d = scheduler::SchedConfig::default();
        assert_eq!(c.quantum_ns[12], 2_000_000);
        assert_eq!(c.quantum_ns[0], 5);
        assert_eq!(c.aging_ns, 7);
        for p in (1..16).filter(|p| *p != 12) {
            assert_eq!(c.quantum_ns[p], d.quantum_ns[p], "{p}");
        }
        // On top of a full `quantum_ns`.
        let s = Scenario::parse(
            &format!(
                "{BASE}[scheduler]\nquantum_ns = [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]\n\
                 quantum_ns_by_priority = {{ \"15\" = 9 }}\n"
            ),
            "f.toml",
        )
        .unwrap();
        let q = s.scheduler.unwrap().quantum_ns;
        assert_eq!((q[14], q[15]), (3, 9));
        let bad = |v: &str| {
            err(&format!(
                "{BASE}[scheduler]\nquantum_ns_by_priority = {v}\n"
            ))
        };
        assert_eq!(
            bad("{ \"16\" = 1000 }"),
            "f.toml: [scheduler]: field `quantum_ns_by_priority`: key '16' is not a VM priority 0..=15"
        );
        assert_eq!(
            bad("{ high = 1000 }"),
            "f.toml: [scheduler]: field `quantum_ns_by_priority`: key 'high' is not a VM priority 0..=15"
        );
        assert_eq!(
            bad("{ \"3\" = 0 }"),
            "f.toml: [scheduler]: field `quantum_ns_by_priority`: priority 3: the quantum must be > 0 ns"
        );
        assert_eq!(
            bad("{ \"3\" = \"1ms\" }"),
            "f.toml: [scheduler]: field `quantum_ns_by_priority`: priority 3: the quantum must be an integer (ns)"
        );
        assert_eq!(
            bad("5"),
            "f.toml: [scheduler]: field `quantum_ns_by_priority`: must be a table of VM priority (\"0\"..\"15\") = quantum in ns"
        );
        // Other [scheduler] keys are still checked by name.
        let e = err(&format!(
            "{BASE}[scheduler]\nquantum_ns_by_priority = {{ \"3\" = 1 }}\nagin_ns = 4\n"
        ));
        assert!(e.contains("agin_ns"), "{e}");
    }

    #[test]
    fn vm_names_number_the_vms_of_counted_entries() {
        let text = format!(
            "{BASE}{}",
            BASE[BASE.find("[[tenant]]").unwrap()..]
                .replace("name = \"t\"", "name = \"u\"\ncount = 3")
        );
        let s = Scenario::parse(&text, "f.toml").unwrap();
        assert_eq!(s.vm_names(), ["t", "u-0", "u-1", "u-2"]);
        assert_eq!(s.only_tenants(&["u"]).vm_names(), ["u-0", "u-1", "u-2"]);
    }

    #[test]
    fn no_tenant_is_an_error_naming_the_field() {
        assert_eq!(
            err("name = \"x\"\nduration_ms = 10\n"),
            "f.toml: scenario: field `tenant`: at least one [[tenant]] is needed"
        );
    }

    #[test]
    fn toml_errors_keep_their_caret_snippet() {
        let e = err(&format!("{BASE}\nextra = 1"));
        assert!(e.starts_with("f.toml: "), "{e}");
        assert!(e.contains("unknown field"), "{e}");
        assert!(e.contains('\n') && e.contains('^'), "snippet kept: {e}");
        let e = err(&with("closed", "bursty"));
        assert!(e.contains("bursty") && e.contains('^'), "{e}");
    }
}
