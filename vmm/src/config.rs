//! Fleet configuration: one TOML file describing every VM of a run.
//!
//! ```toml
//! [run]
//! timeout_ms = 10000
//!
//! [gpu]                    # GpuConfig (topology, backend, [gpu.sim], [gpu.guard]); every field optional,
//! backend = "sim"          # defaults describe an MI300X
//! xccs = 8
//! partition_mode = "SPX"   # SPX, DPX, QPX or CPX
//!
//! [[vm]]
//! name = "alpha"
//! image = "builtin:hello"
//! memory_mib = 16
//! vcpus = 1
//! priority = 8
//! weight = 1
//! partition = 0            # optional: pin to a GPU partition
//! args = "exit=0"
//! preempt_timeout_ms = 9000 # optional: reset a queue whose dequeue takes longer
//! gpu = true               # optional: a vGPU on this fleet's GPU, or
//!                          # gpu = { socket = "vgpu.sock" }: one `hqdmux serve` serves
//! ```
//!
//! Every error names the file, the section or VM (name and index), the field
//! and the reason.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use gpu::topology::{GpuTopology, PartitionMode, TopologyError};
use serde::Deserialize;

/// Which physical GPU backend (`[gpu] backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The simulated GPU (`gpusim::SimGpu`).
    #[default]
    Sim,
}

/// The `[gpu]` section, composed of the parts each crate owns: the hardware
/// topology (`gpu::topology::GpuTopology`, its fields at the top of the
/// section, `[gpu.cwsr]`), the backend choice and the simulator's knobs
/// (`[gpu.sim]`, `gpusim::SimParams`), and the fleet's guard defaults
/// (`[gpu.guard]`, `mdev::guard::GuardConfig`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "GpuSection")]
pub struct GpuConfig {
    /// The GPU's index on the host (`id`, default 0): the `gpu_id` VMs are
    /// placed on and every metric and API object carries (AMD's
    /// device-metrics-exporter numbers GPUs the same way).
    pub id: u32,
    /// Backend (`"sim"`).
    pub backend: Backend,
    /// Simulator knobs (`[gpu.sim]`; ignored by other backends).
    pub sim: gpusim::SimParams,
    /// Misbehaving-VM guard defaults (`[gpu.guard]`; per VM: `[[vm]] guard`).
    pub guard: mdev::guard::GuardConfig,
    /// The hardware: XCCs, partition mode, pipes, queues, CUs, `[gpu.cwsr]`.
    pub topology: GpuTopology,
}

/// The `[gpu]` section as the file spells it: one flat table (serde's
/// `flatten` would lose the line of an unknown field). Converted to
/// [`GpuConfig`]; the conversion names every topology field, so a field
/// added to [`GpuTopology`] fails to compile here until the file can set it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct GpuSection {
    id: u32,
    backend: Backend,
    xccs: u32,
    partition_mode: PartitionMode,
    pipes_per_xcc: u32,
    queues_per_pipe: u32,
    reserved_queues_per_pipe: u32,
    cus_per_xcc: u32,
    ses_per_xcc: u32,
    cwsr: gpu::topology::CwsrModel,
    sim: gpusim::SimParams,
    guard: mdev::guard::GuardConfig,
}

impl Default for GpuSection {
    fn default() -> Self {
        let GpuConfig {
            id,
            backend,
            sim,
            guard,
            topology: t,
        } = GpuConfig::default();
        GpuSection {
            id,
            backend,
            xccs: t.xccs,
            partition_mode: t.partition_mode,
            pipes_per_xcc: t.pipes_per_xcc,
            queues_per_pipe: t.queues_per_pipe,
            reserved_queues_per_pipe: t.reserved_queues_per_pipe,
            cus_per_xcc: t.cus_per_xcc,
            ses_per_xcc: t.ses_per_xcc,
            cwsr: t.cwsr,
            sim,
            guard,
        }
    }
}

impl From<GpuSection> for GpuConfig {
    fn from(f: GpuSection) -> Self {
        GpuConfig {
            id: f.id,
            backend: f.backend,
            sim: f.sim,
            guard: f.guard,
            topology: GpuTopology {
                xccs: f.xccs,
                partition_mode: f.partition_mode,
                pipes_per_xcc: f.pipes_per_xcc,
                queues_per_pipe: f.queues_per_pipe,
                reserved_queues_per_pipe: f.reserved_queues_per_pipe,
                cus_per_xcc: f.cus_per_xcc,
                ses_per_xcc: f.ses_per_xcc,
                cwsr: f.cwsr,
            },
        }
    }
}

impl GpuConfig {
    /// Checks the topology, then the chosen backend's settings against it
    /// (the guard is checked on its own). Errors name the field.
    pub fn validate(&self) -> Result<(), TopologyError> {
        self.topology.validate()?;
        match self.backend {
            Backend::Sim => self.sim.validate(&self.topology),
        }
    }
}

/// Smallest guest RAM: 1 MiB of boot structures plus room for the image.
pub const MIN_MEMORY_MIB: u64 = 4;
/// Largest guest RAM (65536 MiB = 64 GiB): [`crate::boot::MAX_RAM_BYTES`],
/// which says where the limit comes from. RAM beyond the first 3 GiB lies
/// above the MMIO hole, from 4 GiB (docs/boot.md).
pub const MAX_MEMORY_MIB: u64 = crate::boot::MAX_RAM_BYTES >> 20;
/// Most vCPUs per VM.
pub const MAX_VCPUS: u8 = 8;
/// Longest argument string (bytes), as the boot-info block holds it.
pub const MAX_ARGS_LEN: usize = 1024;
/// GPU priorities (higher wins) and weights among VMs of equal priority:
/// the scheduler's, which enforces them.
pub use scheduler::{PRIORITY_RANGE, WEIGHT_RANGE};
/// Longest VM name (bytes).
pub const MAX_NAME_LEN: usize = 64;

/// Why `name` cannot name a VM or a vGPU (`None`: it can). A name is a
/// single path component (`{name}.sock`, files named after it), a URL path
/// segment (`/api/v1/vgpus/{name}`), a metrics label, a CLI argument and a
/// log word: 1..=[`MAX_NAME_LEN`] bytes of ASCII letters, digits, '-', '_'
/// and '.', beginning with a letter or digit (so never `.`, `..`, a hidden
/// file or something a command line reads as an option).
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Some(format!("must be 1..={MAX_NAME_LEN} bytes"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Some("use only letters, digits, '-', '_' and '.'".into());
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Some(format!(
            "'{name}' must begin with a letter or a digit (not '.', '..', a hidden \
             file or an option)"
        ));
    }
    None
}
/// Run timeouts (`[run] timeout_ms` and `hqdmux run --timeout-ms`), in
/// milliseconds: at least 1, at most 30 days.
pub const TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 1..=30 * 24 * 3600 * 1000;

/// Checks a run timeout in milliseconds; the reason is shared by the config
/// field `run.timeout_ms` and the `--timeout-ms` option.
pub fn check_timeout_ms(ms: u64) -> Result<(), String> {
    if ms < *TIMEOUT_MS_RANGE.start() {
        Err(format!(
            "must be at least {} ms, got {ms} (range {}..={}; omit it to wait forever)",
            TIMEOUT_MS_RANGE.start(),
            TIMEOUT_MS_RANGE.start(),
            TIMEOUT_MS_RANGE.end()
        ))
    } else if ms > *TIMEOUT_MS_RANGE.end() {
        Err(format!(
            "must be at most {} ms (30 days), got {ms} (range {}..={})",
            TIMEOUT_MS_RANGE.end(),
            TIMEOUT_MS_RANGE.start(),
            TIMEOUT_MS_RANGE.end()
        ))
    } else {
        Ok(())
    }
}

/// Most physical GPUs per host (`[[gpu]]` entries); `id`s are below it.
pub const MAX_GPUS: u32 = 64;

/// A whole run: VMs, GPUs and run limits.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Run limits.
    pub run: RunConfig,
    /// The physical GPUs the VMs share, in file order: one `[gpu]` table
    /// (omitted = one MI300X in SPX, id 0) or `[[gpu]]` entries with
    /// unique `id`s. Each gets its own backend, arbiter and service thread.
    pub gpus: Vec<GpuConfig>,
    /// True when the file wrote `[[gpu]]` entries (errors then name the
    /// entry as `gpu[i] (id N)`).
    pub gpu_entries: bool,
    /// Scheduler policy and tunables (`[scheduler]`, docs/scheduling.md).
    pub scheduler: scheduler::SchedConfig,
    /// The VMs, in launch order.
    pub vm: Vec<VmConfig>,
    /// Directory of the config file; relative image paths resolve against it.
    pub base_dir: PathBuf,
}

/// The file as serde reads it: sections with their own types (errors carry
/// line and column), `[[vm]]` entries as raw tables read by [`VmConfig::from_table`]
/// so that every VM error names the VM, the field and the reason.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetFile {
    #[serde(default)]
    run: RunConfig,
    #[serde(default)]
    gpu: GpuList,
    #[serde(default)]
    scheduler: scheduler::SchedConfig,
    #[serde(default)]
    vm: Vec<toml::Table>,
}

/// The `gpu` key as written: one `[gpu]` table or an array of `[[gpu]]`
/// tables, each read as a [`GpuConfig`] (so errors keep the parser's line).
#[derive(Debug, Clone)]
pub(crate) struct GpuList {
    pub(crate) gpus: Vec<GpuConfig>,
    pub(crate) array: bool,
}

impl Default for GpuList {
    fn default() -> Self {
        GpuList {
            gpus: vec![GpuConfig::default()],
            array: false,
        }
    }
}

impl<'de> Deserialize<'de> for GpuList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{self, MapAccess, SeqAccess, Visitor};
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = GpuList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a [gpu] table or [[gpu]] entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, a: A) -> Result<GpuList, A::Error> {
                let g = GpuConfig::deserialize(de::value::MapAccessDeserializer::new(a))?;
                Ok(GpuList {
                    gpus: vec![g],
                    array: false,
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, a: A) -> Result<GpuList, A::Error> {
                let gpus = Vec::<GpuConfig>::deserialize(de::value::SeqAccessDeserializer::new(a))?;
                Ok(GpuList { gpus, array: true })
            }
        }
        d.deserialize_any(V)
    }
}

/// Limits of one run.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Stop every VM still running after this many milliseconds (none = wait forever).
    pub timeout_ms: Option<u64>,
}

/// One `[[vm]]` entry.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// Unique name; prefixes the VM's console lines.
    pub name: String,
    /// `builtin:NAME` or a path to a static x86_64 ELF loaded at 1 MiB.
    pub image: String,
    /// Guest RAM in MiB (default 16, range 4..=65536; beyond 3072 the rest
    /// lies above the MMIO hole, from 4 GiB).
    pub memory_mib: u64,
    /// Number of vCPUs (default 1; vCPU 0 runs the program).
    pub vcpus: u8,
    /// GPU priority 0..=15, higher wins (default 0).
    pub priority: u8,
    /// Share of GPU time among VMs of equal priority (1..=1000, default 1).
    pub weight: u32,
    /// GPU partition the VM's queues are pinned to (0-based, below the number
    /// of partitions of `[gpu] partition_mode`); none = the scheduler picks
    /// the least loaded one.
    pub partition: Option<u32>,
    /// Argument string passed to the guest.
    pub args: String,
    /// Give the VM a mediated virtual GPU (docs/vgpu-abi.md) on this
    /// fleet's GPU (`gpu = true`).
    pub gpu: bool,
    /// The physical GPU (`[[gpu]] id`) of a `gpu = true` VM: as written
    /// (`gpu_id = N`), or, when omitted, the one placement chose when the
    /// file was read or the VM added ([`place_vm`]). `None` for VMs without
    /// a vGPU on this fleet. A VM stays on its GPU (no migration).
    pub gpu_id: Option<u32>,
    /// Why the VM is on `gpu_id`: `"gpu_id = N"` when written, else the
    /// automatic placement's reason (what `check` and the log print).
    pub placement: Option<String>,
    /// Or attach the VM to a vGPU another process serves over vfio-user
    /// (`gpu = { socket = "PATH" }`, `hqdmux serve`; relative to the file).
    pub gpu_socket: Option<PathBuf>,
    /// Preemption timeout (ms): a dequeue of one of the VM's queues that
    /// has not finished this long after the request resets that queue
    /// (error 22). Default 9000 as KFD's `queue_preemption_timeout_ms`;
    /// range `mdev::arbiter::PREEMPT_TIMEOUT_MS_RANGE`.
    pub preempt_timeout_ms: u64,
    /// Per-VM override of `[gpu.guard]` limits (`guard = { max_resets = 5 }`).
    pub guard: mdev::guard::GuardOverride,
}

/// The keys of a `[[vm]]` entry.
/// The fields of a `[[vm]]` entry (the API's `VmEntry` schema has exactly
/// these).
pub const VM_FIELDS: [&str; 12] = [
    "name",
    "image",
    "memory_mib",
    "vcpus",
    "priority",
    "weight",
    "partition",
    "args",
    "gpu",
    "gpu_id",
    "preempt_timeout_ms",
    "guard",
];

/// A `[[vm]]` entry's field error before the entry is known to be valid.
struct FieldError {
    field: String,
    reason: String,
}

fn type_name(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date-time",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

impl VmConfig {
    /// Reads one `[[vm]]` table: unknown keys, missing required keys, wrong
    /// types and out-of-range integers are errors naming the field.
    fn from_table(t: &toml::Table) -> Result<Self, FieldError> {
        if let Some(k) = t.keys().find(|k| !VM_FIELDS.contains(&k.as_str())) {
            return Err(FieldError {
                field: k.clone(),
                reason: format!("unknown field (known: {})", VM_FIELDS.join(", ")),
            });
        }
        let string = |field: &'static str| -> Result<Option<String>, FieldError> {
            match t.get(field) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(s.clone())),
                Some(v) => Err(FieldError {
                    field: field.into(),
                    reason: format!("expected a string, found {}", type_name(v)),
                }),
            }
        };
        let int = |field: &'static str, min: i64, max: i64| -> Result<Option<i64>, FieldError> {
            match t.get(field) {
                None => Ok(None),
                Some(toml::Value::Integer(i)) if (min..=max).contains(i) => Ok(Some(*i)),
                Some(toml::Value::Integer(i)) => Err(FieldError {
                    field: field.into(),
                    reason: format!("{i} is out of range {min}..={max}"),
                }),
                Some(v) => Err(FieldError {
                    field: field.into(),
                    reason: format!("expected an integer, found {}", type_name(v)),
                }),
            }
        };
        let required = |field: &'static str, v: Option<String>| {
            v.ok_or(FieldError {
                field: field.into(),
                reason: "missing (required)".into(),
            })
        };
        let (gpu, gpu_socket) = match t.get("gpu") {
            None => (false, None),
            Some(toml::Value::Boolean(b)) => (*b, None),
            Some(toml::Value::Table(g)) => match (g.get("socket"), g.len()) {
                (Some(toml::Value::String(s)), 1) if !s.is_empty() => {
                    (false, Some(PathBuf::from(s)))
                }
                _ => {
                    return Err(FieldError {
                        field: "gpu".into(),
                        reason: "expected { socket = \"PATH\" } (a vfio-user vGPU)".into(),
                    })
                }
            },
            Some(v) => {
                return Err(FieldError {
                    field: "gpu".into(),
                    reason: format!(
                        "expected true, false or {{ socket = \"PATH\" }}, found {}",
                        type_name(v)
                    ),
                })
            }
        };
        Ok(VmConfig {
            name: required("name", string("name")?)?,
            image: required("image", string("image")?)?,
            memory_mib: int("memory_mib", 0, i64::MAX)?.unwrap_or(16) as u64,
            vcpus: int("vcpus", 1, MAX_VCPUS as i64)?.unwrap_or(1) as u8,
            priority: int(
                "priority",
                *PRIORITY_RANGE.start() as i64,
                *PRIORITY_RANGE.end() as i64,
            )?
            .unwrap_or(0) as u8,
            weight: int(
                "weight",
                *WEIGHT_RANGE.start() as i64,
                *WEIGHT_RANGE.end() as i64,
            )?
            .unwrap_or(1) as u32,
            partition: int("partition", 0, u32::MAX as i64)?.map(|p| p as u32),
            args: string("args")?.unwrap_or_default(),
            gpu,
            gpu_id: int("gpu_id", 0, i64::from(MAX_GPUS) - 1)?.map(|g| g as u32),
            placement: None,
            gpu_socket,
            preempt_timeout_ms: int(
                "preempt_timeout_ms",
                *mdev::arbiter::PREEMPT_TIMEOUT_MS_RANGE.start() as i64,
                *mdev::arbiter::PREEMPT_TIMEOUT_MS_RANGE.end() as i64,
            )?
            .unwrap_or(mdev::arbiter::DEFAULT_PREEMPT_TIMEOUT_MS as i64)
                as u64,
            guard: match t.get("guard") {
                None => Default::default(),
                Some(v @ toml::Value::Table(_)) => {
                    v.clone()
                        .try_into()
                        .map_err(|e: toml::de::Error| FieldError {
                            field: "guard".into(),
                            reason: one_line(e.message()),
                        })?
                }
                Some(v) => {
                    return Err(FieldError {
                        field: "guard".into(),
                        reason: format!("expected a table, found {}", type_name(v)),
                    })
                }
            },
        })
    }
}

/// Largest fleet config read (bytes): `/dev/zero` or a runaway file is an
/// error, not a host out of memory.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Where a guest image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// Embedded in the binary (see the `images` crate).
    Builtin(String),
    /// An ELF file on the host.
    File(PathBuf),
}

impl VmConfig {
    /// Resolves `image` against `base_dir`.
    pub fn image_source(&self, base_dir: &Path) -> ImageSource {
        match self.image.strip_prefix("builtin:") {
            Some(name) => ImageSource::Builtin(name.to_owned()),
            None => ImageSource::File(base_dir.join(&self.image)),
        }
    }
}

/// Why [`FleetConfig::check_added_vm`] refused an entry.
#[derive(Debug, thiserror::Error)]
pub enum AddedVmError {
    /// It is not a valid `[[vm]]` entry on its own: unknown field, wrong
    /// type, value out of its range (the API answers 422).
    #[error(transparent)]
    Entry(ConfigError),
    /// It reads as an entry, but this fleet on this host cannot take it: a
    /// name taken or not allowed, no such GPU or partition, memory below the
    /// GPU's CWSR need, guard limits invalid with the GPU's, an image that is
    /// missing or not a bootable ELF here (the API answers 409).
    #[error(transparent)]
    Fleet(ConfigError),
}

/// A configuration error; its `Display` names file, VM, field and reason.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The config file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax, unknown field, or wrong type.
    #[error("{file}: {message}")]
    Parse {
        /// The config file.
        file: PathBuf,
        /// The parser's message (with line, column and field).
        message: String,
    },
    /// The fleet is valid but this host cannot start it.
    #[error("{file}: cannot start on this host: {reason}")]
    Host {
        /// The config file.
        file: PathBuf,
        /// What would run out, with the numbers.
        reason: String,
    },
    /// A value that parses but is not acceptable.
    #[error("{file}: {place}field `{field}`: {reason}")]
    Invalid {
        /// The config file.
        file: PathBuf,
        /// "vm 'name' (vm[i]): ", "gpu: " or empty for top-level fields.
        place: Place,
        /// The field name (as written in the file for unknown fields).
        field: String,
        /// Why it is rejected.
        reason: String,
    },
}

/// Which part of the file an error is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A top-level section.
    Top,
    /// The `[gpu]` section (fields of its sub-tables as `cwsr.trap_ns`).
    Gpu,
    /// `[[gpu]]` entry number `index` with id `id`.
    GpuEntry {
        /// Position in the file, 0-based.
        index: usize,
        /// Its `id` field.
        id: u32,
    },
    /// `[[vm]]` number `index` named `name`.
    Vm {
        /// Position in the file, 0-based.
        index: usize,
        /// Its `name` field.
        name: String,
    },
    /// `[[vgpu]]` number `index` of a devices file (`hqdmux serve`) named
    /// `name`.
    Vgpu {
        /// Position in the file, 0-based.
        index: usize,
        /// Its `name` field.
        name: String,
    },
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Top => Ok(()),
            Place::Gpu => write!(f, "gpu: "),
            Place::GpuEntry { index, id } => write!(f, "gpu[{index}] (id {id}): "),
            // The name as read (a refused one may hold a newline or NUL):
            // escaped, so that the error stays one line.
            Place::Vm { index, name } => {
                write!(f, "vm '{}' (vm[{index}]): ", name.escape_debug())
            }
            Place::Vgpu { index, name } => {
                write!(f, "vgpu '{}' (vgpu[{index}]): ", name.escape_debug())
            }
        }
    }
}

impl FleetConfig {
    /// Reads, parses and validates a fleet file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = eval::scenario::read_bounded(path, MAX_CONFIG_BYTES).map_err(|source| {
            ConfigError::Read {
                file: path.to_owned(),
                source,
            }
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates `text` as if read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let file: FleetFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: path.to_owned(),
            // Kept on its lines: the parser points at the column under
            // the quoted line.
            message: e.to_string().trim_end().to_owned(),
        })?;
        Self::from_parts(file.run, file.gpu, file.scheduler, &file.vm, path)
    }

    /// A fleet of `gpu` and `scheduler` whose `[[vm]]` tables `tables` (read
    /// from `path`) are read, checked and placed exactly as a fleet file's
    /// (`hqdmux serve`'s devices file shares this).
    pub(crate) fn from_parts(
        run: RunConfig,
        gpu: GpuList,
        scheduler: scheduler::SchedConfig,
        tables: &[toml::Table],
        path: &Path,
    ) -> Result<Self, ConfigError> {
        let mut vm = Vec::with_capacity(tables.len());
        for (index, t) in tables.iter().enumerate() {
            let v = vm_entry(t, index, path)?;
            vm.push(v);
        }
        let mut cfg = FleetConfig {
            run,
            gpus: gpu.gpus,
            gpu_entries: gpu.array,
            scheduler,
            vm,
            base_dir: path
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from(".")),
        };
        cfg.validate(path)?;
        cfg.place_all();
        Ok(cfg)
    }

    /// Checks the GPU entries: at least one, at most [`MAX_GPUS`], unique
    /// ids below it, each topology and guard valid (`hqdmux serve`'s
    /// devices file shares this). Errors name the entry and field.
    pub fn validate_gpus(&self, file: &Path) -> Result<(), ConfigError> {
        let top = |field: &str, reason: String| ConfigError::Invalid {
            file: file.to_owned(),
            place: Place::Top,
            field: field.into(),
            reason,
        };
        if self.gpus.is_empty() {
            return Err(top(
                "gpu",
                "no [[gpu]] entries (omit `gpu` for one MI300X)".into(),
            ));
        }
        if self.gpus.len() > MAX_GPUS as usize {
            return Err(top(
                "gpu",
                format!("{} [[gpu]] entries, at most {MAX_GPUS}", self.gpus.len()),
            ));
        }
        for (index, g) in self.gpus.iter().enumerate() {
            let bad = |field: String, reason: String| ConfigError::Invalid {
                file: file.to_owned(),
                place: self.gpu_place(index),
                field,
                reason,
            };
            if g.id >= MAX_GPUS {
                return Err(bad(
                    "id".into(),
                    format!("{} is out of range 0..={}", g.id, MAX_GPUS - 1),
                ));
            }
            if let Some(first) = self.gpus[..index].iter().position(|o| o.id == g.id) {
                return Err(bad(
                    "id".into(),
                    format!(
                        "duplicate id {}: gpu[{first}] has it (each [[gpu]] needs its own id)",
                        g.id
                    ),
                ));
            }
            if let Err(e) = g.validate() {
                let (field, reason) = topology_error(&e);
                return Err(bad(field.into(), reason));
            }
            if let Err(e) = g.guard.validate() {
                return Err(bad(format!("guard.{}", e.field), e.reason));
            }
        }
        Ok(())
    }

    /// The GPU with id `id`.
    pub fn gpu(&self, id: u32) -> Option<&GpuConfig> {
        self.gpus.iter().find(|g| g.id == id)
    }

    /// The first GPU (the only one of a `[gpu]` table).
    pub fn first_gpu(&self) -> &GpuConfig {
        &self.gpus[0]
    }

    /// Where an error about GPU entry `index` is.
    fn gpu_place(&self, index: usize) -> Place {
        match (self.gpu_entries, self.gpus.get(index)) {
            (true, Some(g)) => Place::GpuEntry { index, id: g.id },
            _ => Place::Gpu,
        }
    }

    /// Places every `gpu = true` VM without a `gpu_id`, in file order,
    /// with [`place_vm`] against the VMs placed before it.
    fn place_all(&mut self) {
        let mut loads = GpuLoads::new(&self.gpus);
        for vm in self.vm.iter_mut() {
            if !vm.gpu {
                continue;
            }
            let p = match vm.gpu_id {
                Some(id) => Placement {
                    gpu_id: id,
                    reason: format!("gpu_id = {id}"),
                },
                None => loads.choose(vm),
            };
            vm.gpu_id = Some(p.gpu_id);
            vm.placement = Some(p.reason);
            loads.add(vm);
        }
    }

    fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let top = |field: &str, reason: String| ConfigError::Invalid {
            file: file.to_owned(),
            place: Place::Top,
            field: field.into(),
            reason,
        };
        if self.vm.is_empty() {
            return Err(top("vm", "no [[vm]] entries: nothing to launch".into()));
        }
        if let Some(ms) = self.run.timeout_ms {
            check_timeout_ms(ms).map_err(|reason| top("run.timeout_ms", reason))?;
        }
        self.validate_gpus(file)?;
        match self.scheduler.validate() {
            Ok(()) => {}
            Err(scheduler::SchedError::Config { field, reason }) => {
                return Err(top(&format!("scheduler.{field}"), reason))
            }
            Err(e) => return Err(top("scheduler", e.to_string())),
        }
        let mut names = HashSet::new();
        for (index, vm) in self.vm.iter().enumerate() {
            let bad = |field: &str, reason: String| ConfigError::Invalid {
                file: file.to_owned(),
                place: Place::Vm {
                    index,
                    name: vm.name.clone(),
                },
                field: field.into(),
                reason,
            };
            if let Some(why) = name_problem(&vm.name) {
                return Err(bad("name", why));
            }
            if !names.insert(vm.name.as_str()) {
                return Err(bad(
                    "name",
                    "duplicate name: another VM already has it".into(),
                ));
            }
            // priority, weight and vcpus are range-checked by `from_table`.
            if vm.memory_mib < MIN_MEMORY_MIB {
                return Err(bad(
                    "memory_mib",
                    format!(
                        "{} MiB is too small (minimum {MIN_MEMORY_MIB} MiB)",
                        vm.memory_mib
                    ),
                ));
            }
            if vm.memory_mib > MAX_MEMORY_MIB {
                return Err(bad(
                    "memory_mib",
                    format!(
                        "{} MiB is too large (maximum {MAX_MEMORY_MIB} MiB)",
                        vm.memory_mib
                    ),
                ));
            }
            // The GPUs the VM may be placed on: the one it names, or all.
            let candidates: Vec<&GpuConfig> = match vm.gpu_id {
                Some(id) => {
                    if !vm.gpu {
                        return Err(bad(
                            "gpu_id",
                            format!(
                                "gpu_id = {id} needs `gpu = true` (a vGPU on this fleet's GPU {id})"
                            ),
                        ));
                    }
                    match self.gpu(id) {
                        Some(g) => vec![g],
                        None => {
                            let ids: Vec<String> =
                                self.gpus.iter().map(|g| g.id.to_string()).collect();
                            return Err(bad(
                                "gpu_id",
                                format!(
                                    "no GPU with id {id} (this file's GPUs: {})",
                                    ids.join(", ")
                                ),
                            ));
                        }
                    }
                }
                None => self.gpus.iter().collect(),
            };
            if vm.gpu {
                // One queue's CWSR area must fit beside the image, on
                // whichever candidate GPU needs the most.
                let cwsr = candidates
                    .iter()
                    .map(|g| {
                        u64::from(g.topology.ctx_save_bytes_per_xcc())
                            * u64::from(g.topology.xccs_per_partition())
                    })
                    .max()
                    .unwrap_or(0);
                let need = cwsr.div_ceil(1 << 20) + MIN_MEMORY_MIB;
                if vm.memory_mib < need {
                    return Err(bad(
                        "memory_mib",
                        format!(
                            "{} MiB is too small for `gpu = true`: one queue's CWSR area is {} MiB on this [gpu]; need at least {need} MiB",
                            vm.memory_mib,
                            cwsr.div_ceil(1 << 20)
                        ),
                    ));
                }
            }
            for g in &candidates {
                if let Err(e) = g.guard.with(&vm.guard).validate() {
                    return Err(bad(&format!("guard.{}", e.field), e.reason));
                }
            }
            if let Some(p) = vm.partition {
                // Pinned: the partition must exist on the named GPU, or on
                // at least one GPU when placement chooses.
                if !candidates.iter().any(|g| p < g.topology.partitions()) {
                    let g = candidates[0];
                    let partitions = g.topology.partitions();
                    let on = match (vm.gpu_id, self.gpu_entries) {
                        (Some(id), _) => format!("GPU {id}'s"),
                        (None, true) => "every [[gpu]] entry's; the largest".into(),
                        (None, false) => "[gpu]".into(),
                    };
                    let partitions = if vm.gpu_id.is_none() {
                        candidates
                            .iter()
                            .map(|g| g.topology.partitions())
                            .max()
                            .unwrap_or(partitions)
                    } else {
                        partitions
                    };
                    let mode = candidates
                        .iter()
                        .find(|g| g.topology.partitions() == partitions)
                        .map_or(g.topology.partition_mode, |g| g.topology.partition_mode);
                    return Err(bad(
                        "partition",
                        format!(
                            "{p} is out of range 0..={} ({on} partition_mode {} has {partitions} partition{})",
                            partitions - 1,
                            mode_name(mode),
                            if partitions == 1 { "" } else { "s" },
                        ),
                    ));
                }
            }
            if vm.args.len() > MAX_ARGS_LEN {
                return Err(bad(
                    "args",
                    format!("{} bytes, maximum {MAX_ARGS_LEN}", vm.args.len()),
                ));
            }
            let elf = match vm.image_source(&self.base_dir) {
                ImageSource::Builtin(name) => match images::builtin(&name) {
                    Some(elf) => std::borrow::Cow::Borrowed(elf),
                    None => {
                        let known: Vec<_> = images::names().collect();
                        return Err(bad(
                            "image",
                            format!(
                                "no built-in image '{name}' (built in: {})",
                                known.join(", ")
                            ),
                        ));
                    }
                },
                ImageSource::File(path) => std::borrow::Cow::Owned(
                    read_image_file(&path, vm.memory_mib << 20).map_err(|e| {
                        bad(
                            "image",
                            match e {
                                ImageFileError::Open(e)
                                    if e.kind() == std::io::ErrorKind::NotFound =>
                                {
                                    format!("image file {} not found", path.display())
                                }
                                ImageFileError::NotRegular("directory") => {
                                    format!("{} is a directory, not an ELF file", path.display())
                                }
                                // As the ELF checks below word it: the image as written.
                                e => format!("{}: {e}", vm.image),
                            },
                        )
                    })?,
                ),
            };
            if let Err(why) = crate::boot::check_elf(&elf, vm.memory_mib << 20) {
                return Err(bad("image", format!("{}: {why}", vm.image)));
            }
        }
        Ok(())
    }
}

/// Which GPU a VM is on and why ([`place_vm`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The chosen GPU's `id`.
    pub gpu_id: u32,
    /// One line saying why (each candidate's figures).
    pub reason: String,
}

/// Levels a VM priority can take (`PRIORITY_RANGE`, 0-based).
const LEVELS: usize = scheduler::MAX_PRIORITY as usize + 1;

/// The GPUs' loads as placement sees them, per compute partition (a VM
/// only ever runs on its partition, so its entitlement is a share of that
/// partition's CUs, not of the GPU's): per GPU and partition, the sum of
/// the weights of the VMs on it at each priority, and their count. A VM
/// without `partition` is counted where the scheduler will put it, the
/// partition with the fewest VMs (ties: the lowest). Built once and updated
/// as VMs are placed, so placing n VMs on G GPUs of P partitions costs
/// O(n x G x P x levels), not O(n^2).
struct GpuLoads {
    /// Per GPU: id, CUs of one partition, partitions.
    gpus: Vec<(u32, u64, u32)>,
    /// Per GPU, per partition and priority: the sum of the weights there.
    weight_at: Vec<Vec<[u64; LEVELS]>>,
    /// Per GPU, per partition: VMs on it.
    vms: Vec<Vec<u64>>,
}

impl GpuLoads {
    fn new(gpus: &[GpuConfig]) -> Self {
        let gpus: Vec<(u32, u64, u32)> = gpus
            .iter()
            .map(|g| {
                let t = &g.topology;
                let parts = t.partitions().max(1);
                (
                    g.id,
                    u64::from(t.xccs) * u64::from(t.cus_per_xcc) / u64::from(parts),
                    parts,
                )
            })
            .collect();
        GpuLoads {
            weight_at: gpus
                .iter()
                .map(|g| vec![[0; LEVELS]; g.2 as usize])
                .collect(),
            vms: gpus.iter().map(|g| vec![0; g.2 as usize]).collect(),
            gpus,
        }
    }

    /// The partition of GPU index `i` a VM pinned to `pinned` (or not)
    /// lands on: its own, else the one with the fewest VMs (the
    /// scheduler's `add_vm` rule). `None` when the GPU lacks it.
    fn partition_on(&self, i: usize, pinned: Option<u32>) -> Option<usize> {
        let counts = &self.vms[i];
        match pinned {
            Some(p) => Some(p as usize).filter(|&p| p < counts.len()),
            None => (0..counts.len()).min_by_key(|&p| (counts[p], p)),
        }
    }

    /// Counts `vm` on its GPU (a `gpu = true` VM with its `gpu_id` set).
    fn add(&mut self, vm: &VmConfig) {
        let Some(i) = vm
            .gpu_id
            .filter(|_| vm.gpu)
            .and_then(|id| self.gpus.iter().position(|g| g.0 == id))
        else {
            return;
        };
        let Some(p) = self.partition_on(i, vm.partition) else {
            return;
        };
        self.vms[i][p] += 1;
        let level = usize::from(vm.priority).min(LEVELS - 1);
        self.weight_at[i][p][level] =
            self.weight_at[i][p][level].saturating_add(u64::from(vm.weight));
    }

    /// See [`place_vm`].
    fn choose(&self, vm: &VmConfig) -> Placement {
        let level = usize::from(vm.priority).min(LEVELS - 1);
        let w = u64::from(vm.weight.max(1));
        // (index, partition, partition CUs, weight at or above the VM's
        // priority there, VMs there).
        type Cand = (usize, usize, u64, u64, u64);
        let cands: Vec<Cand> = self
            .gpus
            .iter()
            .enumerate()
            .filter_map(|(i, g)| {
                let p = self.partition_on(i, vm.partition)?;
                let above = self.weight_at[i][p][level..]
                    .iter()
                    .fold(0u64, |a, x| a.saturating_add(*x));
                Some((i, p, g.1, above, self.vms[i][p]))
            })
            .collect();
        // Larger cus*w/(W+w) first: compare a.cus*(Wb+w) with b.cus*(Wa+w).
        let better = |a: &Cand, b: &Cand| {
            let lhs = u128::from(a.2) * u128::from(b.3.saturating_add(w));
            let rhs = u128::from(b.2) * u128::from(a.3.saturating_add(w));
            lhs > rhs || (lhs == rhs && a.4 < b.4)
        };
        let mut best: Option<&Cand> = None;
        for c in &cands {
            if best.is_none_or(|b| better(c, b)) {
                best = Some(c);
            }
        }
        let Some(best) = best else {
            // Validation guarantees a candidate; stay total anyway.
            return Placement {
                gpu_id: self.gpus.first().map_or(0, |g| g.0),
                reason: "no GPU has the VM's partition; the first GPU".into(),
            };
        };
        // One entry per distinct load, naming every GPU that has it (and
        // the partition, on a partitioned GPU).
        type Key = (Option<usize>, u64, u64, u64);
        let mut groups: Vec<(Key, Vec<u32>)> = Vec::new();
        for &(i, p, cus, above, n) in &cands {
            let (id, parts) = (self.gpus[i].0, self.gpus[i].2);
            let key = ((parts > 1).then_some(p), cus, above, n);
            match groups.iter_mut().find(|g| g.0 == key) {
                Some(g) => g.1.push(id),
                None => groups.push((key, vec![id])),
            }
        }
        let figures: Vec<String> = groups
            .iter()
            .map(|&((part, cus, above, n), ref ids)| {
                let names: Vec<String> = ids.iter().map(u32::to_string).collect();
                format!(
                    "gpu{} {}{} {}/{cus} CUs (weight {above} at >= {}, {n} VM{})",
                    if ids.len() == 1 { "" } else { "s" },
                    names.join(","),
                    part.map_or(String::new(), |p| format!(" partition {p}")),
                    cus.saturating_mul(w) / above.saturating_add(w).max(1),
                    vm.priority,
                    if n == 1 { "" } else { "s" }
                )
            })
            .collect();
        let id = self.gpus[best.0].0;
        Placement {
            gpu_id: id,
            reason: format!(
                "auto: gpu {id}, the largest entitlement at priority {} weight {w}: {}",
                vm.priority,
                figures.join("; ")
            ),
        }
    }
}

/// Automatic placement of a `gpu = true` VM written without `gpu_id`:
/// among the GPUs that have its partition (when pinned), the one where its
/// entitlement is the largest if every VM demands, `CUs x w / (W + w)` with
/// `CUs` those of the partition it would run on (its own, else the one
/// with the fewest VMs) and `W` the sum of the weights of the VMs already
/// on that partition at the VM's priority or above (lower priorities do
/// not take from it). On identical
/// GPUs this is the GPU with the least weight at or above its priority.
/// Ties go to the GPU with fewer VMs, then to the first in file order.
/// `placed` are the VMs already on a GPU (their `gpu_id` set); others are
/// ignored. Integer arithmetic, exact comparison.
pub fn place_vm<'a>(
    gpus: &[GpuConfig],
    placed: impl IntoIterator<Item = &'a VmConfig>,
    vm: &VmConfig,
) -> Placement {
    let mut loads = GpuLoads::new(gpus);
    for o in placed {
        loads.add(o);
    }
    loads.choose(vm)
}

/// Why an image file was refused ([`read_image_file`]).
#[derive(Debug, thiserror::Error)]
pub enum ImageFileError {
    /// `open(2)` failed.
    #[error("cannot open: {0}")]
    Open(std::io::Error),
    /// `fstat(2)` or `read(2)` failed.
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    /// Not a regular file (a device, FIFO, socket or directory).
    #[error("is a {0}, not a regular file")]
    NotRegular(&'static str),
    /// Larger than the VM's RAM: it cannot be loaded.
    #[error("{size} bytes is larger than the VM's {max}-byte RAM it must be loaded into")]
    TooLarge {
        /// File size (bytes).
        size: u64,
        /// The cap (bytes).
        max: u64,
    },
    /// The first bytes are not the ELF magic.
    #[error("not an ELF file (bad magic), first bytes {0:02x?}, expected [7f, 45, 4c, 46]")]
    NotElf(Vec<u8>),
}

/// Reads a guest image file, bounded and without blocking:
///
/// - opened with `O_NONBLOCK` (a FIFO or device cannot block the open) and
///   `O_CLOEXEC`; symbolic links are followed (images are often links to
///   build outputs) and the type checks below apply to the file opened;
/// - `fstat` first: anything but a regular file is refused, naming its type;
/// - a file larger than `max_bytes` (the VM's RAM) is refused before any read;
/// - the first 4 bytes must be the ELF magic before the rest is read;
/// - at most `max_bytes` are read even if the file grows meanwhile.
pub fn read_image_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, ImageFileError> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(ImageFileError::Open)?;
    let meta = file.metadata().map_err(ImageFileError::Read)?;
    let ft = meta.file_type();
    let kind = if ft.is_file() {
        None
    } else if ft.is_dir() {
        Some("directory")
    } else if ft.is_fifo() {
        Some("FIFO")
    } else if ft.is_char_device() {
        Some("character device")
    } else if ft.is_block_device() {
        Some("block device")
    } else if ft.is_socket() {
        Some("socket")
    } else {
        Some("special file")
    };
    if let Some(kind) = kind {
        return Err(ImageFileError::NotRegular(kind));
    }
    if meta.len() > max_bytes {
        return Err(ImageFileError::TooLarge {
            size: meta.len(),
            max: max_bytes,
        });
    }
    let mut magic = Vec::with_capacity(4);
    (&mut file)
        .take(4)
        .read_to_end(&mut magic)
        .map_err(ImageFileError::Read)?;
    if magic != b"\x7fELF" {
        return Err(ImageFileError::NotElf(magic));
    }
    let mut elf = magic;
    elf.reserve(meta.len().saturating_sub(4) as usize);
    // One byte more than allowed tells a file that grew past the cap.
    (&mut file)
        .take(max_bytes.saturating_sub(4).saturating_add(1))
        .read_to_end(&mut elf)
        .map_err(ImageFileError::Read)?;
    if elf.len() as u64 > max_bytes {
        return Err(ImageFileError::TooLarge {
            size: elf.len() as u64,
            max: max_bytes,
        });
    }
    Ok(elf)
}

/// The field a topology error is about and why, without the `gpu.` prefix
/// (the place says `gpu: `).
fn topology_error(e: &TopologyError) -> (&'static str, String) {
    match e {
        TopologyError::Zero(field) => (field, "must be greater than 0".into()),
        TopologyError::TooLarge { field, value, max } => {
            (field, format!("{value} exceeds the maximum {max}"))
        }
        TopologyError::PartitionMismatch { mode, parts, xccs } => (
            "xccs",
            format!(
                "{xccs} XCCs do not split evenly into the {parts} partitions of \
                 partition_mode {} (xccs must be a multiple of {parts})",
                mode_name(*mode)
            ),
        ),
        TopologyError::NoUserSlots { reserved, per_pipe } => (
            "reserved_queues_per_pipe",
            format!("{reserved} of {per_pipe} queues per pipe leaves no user queue"),
        ),
        TopologyError::ControlRecordTooLarge { field, need, have } => (
            field,
            format!("the largest CWSR control record ({need} bytes) does not fit the {have}-byte control stack of one XCC"),
        ),
    }
}

/// The TOML spelling of a partition mode.
pub fn mode_name(mode: PartitionMode) -> &'static str {
    match mode {
        PartitionMode::Spx => "SPX",
        PartitionMode::Dpx => "DPX",
        PartitionMode::Qpx => "QPX",
        PartitionMode::Cpx => "CPX",
    }
}

impl FleetConfig {
    /// What `hqdmux check` prints about the GPUs: for each, backend, XCCs,
    /// CUs, partitioning and user HQD slots (lines prefixed `gpu:` for a
    /// `[gpu]` table, `gpu N:` for `[[gpu]]` entries); then which VMs are
    /// pinned to a partition, and where each GPU VM was placed and why.
    pub fn gpu_summary(&self) -> String {
        let mut s = String::new();
        for g in &self.gpus {
            let prefix = if self.gpu_entries {
                format!("gpu {}", g.id)
            } else {
                "gpu".into()
            };
            s += &gpu_lines(&prefix, g);
        }
        let pinned: Vec<String> = self
            .vm
            .iter()
            .filter_map(|v| v.partition.map(|p| format!("{}->{p}", v.name)))
            .collect();
        if !pinned.is_empty() {
            s += &format!("gpu: pinned VMs (vm->partition): {}\n", pinned.join(", "));
        }
        if self.gpus.len() > 1 {
            for v in &self.vm {
                if let (Some(id), Some(why)) = (v.gpu_id, &v.placement) {
                    s += &format!("placement: vm '{}' on gpu {id} ({why})\n", v.name);
                }
            }
        }
        s
    }
}

/// One GPU's lines of [`FleetConfig::gpu_summary`].
fn gpu_lines(prefix: &str, gpu: &GpuConfig) -> String {
    let g = &gpu.topology;
    let backend = match gpu.backend {
        Backend::Sim => "sim (simulated MI300-class)",
    };
    let parts = g.partitions();
    let user_per_pipe = g.queues_per_pipe - g.reserved_queues_per_pipe;
    format!(
        "{prefix}: backend {backend}\n\
         {prefix}: {} XCCs x {} CUs = {} CUs\n\
         {prefix}: partition mode {}: {parts} partition{} of {} XCC{} ({} CUs each)\n\
         {prefix}: user HQD slots: {} ({parts} partition{} x {} pipes x {user_per_pipe} queues; \
         {} of {} queues per pipe reserved for kernel queues)\n",
        g.xccs,
        g.cus_per_xcc,
        g.xccs * g.cus_per_xcc,
        mode_name(g.partition_mode),
        if parts == 1 { "" } else { "s" },
        g.xccs_per_partition(),
        if g.xccs_per_partition() == 1 { "" } else { "s" },
        g.cus_per_partition(),
        g.user_slots().len(),
        if parts == 1 { "" } else { "s" },
        g.pipes_per_xcc,
        g.reserved_queues_per_pipe,
        g.queues_per_pipe,
    )
}

/// Open files `hqdmux run` holds for the whole process, whatever the fleet:
/// stdin/stdout/stderr, `/dev/kvm`, the event loop's epoll fd, the run
/// timer, the stop eventfd and its clone, the control socket's listener, and
/// headroom for control-socket connections, the GPU arbiter's thread and logging.
pub const BASE_OPEN_FILES: u64 = 32;
/// Open files per VM: the KVM VM fd, the memfd behind its RAM, and the
/// end-of-run eventfd with its clone (one per vCPU is added).
pub const OPEN_FILES_PER_VM: u64 = 4;
/// Extra open files per `gpu = true` VM: one doorbell eventfd per virtual
/// HQD (registered as a KVM ioeventfd) and one irqfd per MSI-X vector.
pub const OPEN_FILES_PER_GPU_VM: u64 = (abi::vgpu::NUM_VHQD + abi::vgpu::NUM_VECTORS) as u64;

/// What a fleet is predicted to need from the host ([`FleetConfig::needs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetNeeds {
    /// Open file descriptors at the peak (every VM built and running).
    pub open_files: u64,
    /// Guest RAM of all VMs (bytes). Guest RAM is a memfd populated on
    /// first touch, so this is the most the guests can use.
    pub memory_bytes: u64,
}

/// What the host offers ([`HostLimits::probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostLimits {
    /// The soft `RLIMIT_NOFILE` (after [`raise_open_files_limit`]).
    pub open_files: u64,
    /// `MemAvailable` of `/proc/meminfo` (bytes), if readable.
    pub mem_available: Option<u64>,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (what an unprivileged
/// process may do) and returns the new soft limit. `hqdmux run` and `check`
/// call it first, so `check` predicts with the limit `run` will have.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r.rlim_cur = r.rlim_max;
            } else {
                log::warn!(
                    "cannot raise the open-files limit from {} to {}: {}",
                    r.rlim_cur,
                    r.rlim_max,
                    std::io::Error::last_os_error()
                );
            }
        }
    }
    Ok(r.rlim_cur)
}

impl HostLimits {
    /// Reads the current soft `RLIMIT_NOFILE` and `MemAvailable`.
    pub fn probe() -> Self {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit with a valid rlimit struct.
        let open_files = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
            r.rlim_cur
        } else {
            u64::MAX
        };
        let mem_available = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| mem_available_bytes(&m));
        Self {
            open_files,
            mem_available,
        }
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl FleetConfig {
    /// Predicts the open files and guest RAM `hqdmux run` needs for this
    /// fleet (an estimate from what `run` opens, see the `OPEN_FILES_*`
    /// constants; docs/operators.md).
    pub fn needs(&self) -> FleetNeeds {
        let mut open_files = BASE_OPEN_FILES;
        let mut memory_bytes: u64 = 0;
        for vm in &self.vm {
            open_files = open_files
                .saturating_add(OPEN_FILES_PER_VM)
                .saturating_add(u64::from(vm.vcpus));
            if vm.gpu {
                open_files = open_files.saturating_add(OPEN_FILES_PER_GPU_VM);
            }
            memory_bytes = memory_bytes.saturating_add(vm.memory_mib.saturating_mul(1 << 20));
        }
        FleetNeeds {
            open_files,
            memory_bytes,
        }
    }

    /// Refuses a fleet this host cannot start: more predicted open files
    /// than `RLIMIT_NOFILE`, or more guest RAM than `MemAvailable`.
    pub fn check_host(&self, file: &Path, host: &HostLimits) -> Result<FleetNeeds, ConfigError> {
        let need = self.needs();
        let n = self.vm.len();
        if need.open_files > host.open_files {
            return Err(ConfigError::Host {
                file: file.to_owned(),
                reason: format!(
                    "{n} VMs need about {} open files, the limit is {} (RLIMIT_NOFILE, already raised to its hard limit; raise it with `ulimit -Hn` as root or run fewer VMs)",
                    need.open_files, host.open_files
                ),
            });
        }
        if let Some(avail) = host.mem_available {
            if need.memory_bytes > avail {
                return Err(ConfigError::Host {
                    file: file.to_owned(),
                    reason: format!(
                        "{n} VMs have {} MiB of guest RAM in total, the host has {} MiB available (MemAvailable in /proc/meminfo)",
                        need.memory_bytes >> 20,
                        avail >> 20
                    ),
                });
            }
        }
        Ok(need)
    }
}

fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "|")
        .collect::<Vec<_>>()
        .join(" ")
}

// ---- a VM added to a running fleet (operator API) ----------------------

impl FleetConfig {
    /// Checks one more `[[vm]]` entry (a TOML table, as in the file)
    /// against this fleet exactly as the file's entries are checked (known
    /// fields and types, ranges, unique name, partition of this GPU) and
    /// returns it. Errors name `file`, the VM (index `self.vm.len()`), the
    /// field and the reason, and say whether the entry could not be read or
    /// this fleet cannot take it ([`AddedVmError`]). `self` is not changed.
    pub fn check_added_vm(&self, t: &toml::Table, file: &Path) -> Result<VmConfig, AddedVmError> {
        let index = self.vm.len();
        let vm = vm_entry(t, index, file).map_err(AddedVmError::Entry)?;
        let mut all = self.clone();
        all.vm.push(vm.clone());
        all.validate(file).map_err(AddedVmError::Fleet)?;
        Ok(vm)
    }

    /// Puts an added `gpu = true` VM on a GPU: its `gpu_id` if written,
    /// else [`place_vm`] against `live` (the fleet's VMs still running).
    /// Sets `vm.gpu_id` and `vm.placement`.
    pub fn place_added<'a>(&self, vm: &mut VmConfig, live: impl IntoIterator<Item = &'a VmConfig>) {
        if !vm.gpu {
            return;
        }
        let p = match vm.gpu_id {
            Some(id) => Placement {
                gpu_id: id,
                reason: format!("gpu_id = {id}"),
            },
            None => place_vm(&self.gpus, live, vm),
        };
        vm.gpu_id = Some(p.gpu_id);
        vm.placement = Some(p.reason);
    }
}

/// VM entry `index` of `file` (a `[[vm]]` table) read and checked on its
/// own; an error names the file, the entry (by its name, or `?`), the field
/// and the reason.
fn vm_entry(t: &toml::Table, index: usize, file: &Path) -> Result<VmConfig, ConfigError> {
    VmConfig::from_table(t).map_err(|e| ConfigError::Invalid {
        file: file.to_owned(),
        place: Place::Vm {
            index,
            name: t
                .get("name")
                .and_then(toml::Value::as_str)
                .unwrap_or("?")
                .to_owned(),
        },
        field: e.field,
        reason: e.reason,
    })
}

/// docs/config.md checked against this parser.
#[cfg(test)]
mod reference_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FleetConfig, ConfigError> {
        FleetConfig::parse(text, Path::new("/cfg/fleet.toml"))
    }

    const GOOD: &str = r#"
        [[vm]]
        name = "a"
        image = "builtin:hello"
        priority = 12
        weight = 3
        args = "x=1"
    "#;

    #[test]
    fn an_endless_config_file_is_refused_not_read_into_memory() {
        let e = FleetConfig::load(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/dev/zero: cannot read: larger than 16777216 bytes"
        );
    }

    #[test]
    fn good_config_gets_defaults() {
        let cfg = parse(GOOD).unwrap();
        assert_eq!(cfg.vm.len(), 1);
        let vm = &cfg.vm[0];
        assert_eq!(
            (vm.memory_mib, vm.vcpus, vm.priority, vm.weight),
            (16, 1, 12, 3)
        );
        assert_eq!(cfg.first_gpu().backend, Backend::Sim);
        assert_eq!(
            vm.image_source(&cfg.base_dir),
            ImageSource::Builtin("hello".into())
        );
        assert_eq!(cfg.base_dir, Path::new("/cfg"));
        assert_eq!(vm.preempt_timeout_ms, 9000);
    }

    #[test]
    fn guard_defaults_come_from_gpu_guard_and_a_vm_overrides_fields() {
        let cfg = parse(&format!(
            "[gpu.guard]\nmax_resets = 5\nwindow_ms = 1000\n{GOOD}guard = {{ max_resets = 1 }}\n"
        ))
        .unwrap();
        assert_eq!(cfg.first_gpu().guard.max_resets, 5);
        let eff = cfg.first_gpu().guard.with(&cfg.vm[0].guard);
        assert_eq!((eff.max_resets, eff.window_ms), (1, 1000));
        assert_err_eq(
            &format!("[gpu.guard]\nwindow_ms = 0\n{GOOD}"),
            "/cfg/fleet.toml: gpu: field `guard.window_ms`: 0 is out of range 1..=86400000 (ms)",
        );
        assert_err_eq(
            &format!("{GOOD}guard = {{ window_ms = 0 }}\n"),
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `guard.window_ms`: 0 is out of range 1..=86400000 (ms)",
        );
        assert_err_eq(
            &format!("[gpu.guard]\nmax_save_wait_permille = 1001\n{GOOD}"),
            "/cfg/fleet.toml: gpu: field `guard.max_save_wait_permille`: 1001 is out of range \
             0..=1000 (permille of window_ms)",
        );
        assert_err_eq(
            &format!("{GOOD}guard = {{ max_save_wait_permille = 2000 }}\n"),
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `guard.max_save_wait_permille`: 2000 is out \
             of range 0..=1000 (permille of window_ms)",
        );
        let cfg = parse(&format!("{GOOD}guard = {{ max_save_wait_permille = 0 }}\n")).unwrap();
        let eff = cfg.first_gpu().guard.with(&cfg.vm[0].guard);
        assert_eq!((eff.max_save_wait_permille, eff.max_resets), (0, 3));
        assert_err_has(
            &format!("{GOOD}guard = {{ max_reset = 1 }}\n"),
            "vm 'a' (vm[0]): field `guard`: unknown field `max_reset`",
        );
        assert_err_ends(
            &format!("{GOOD}guard = 3\n"),
            "field `guard`: expected a table, found an integer",
        );
    }

    #[test]
    fn preempt_timeout_is_read_and_range_checked_naming_the_vm() {
        let cfg = parse(&format!("{GOOD}preempt_timeout_ms = 250\n")).unwrap();
        assert_eq!(cfg.vm[0].preempt_timeout_ms, 250);
        assert_err_eq(
            &format!("{GOOD}preempt_timeout_ms = 0\n"),
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `preempt_timeout_ms`: 0 is out of range 1..=3600000",
        );
        assert_err_ends(
            &format!("{GOOD}preempt_timeout_ms = \"9s\"\n"),
            "field `preempt_timeout_ms`: expected an integer, found a string",
        );
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    /// Asserts that `text` is refused with exactly the message `want`.
    fn assert_err_eq(text: &str, want: &str) {
        assert_eq!(err(text), want);
    }

    /// Asserts that `text` is refused with a message containing `want`.
    fn assert_err_has(text: &str, want: &str) {
        let e = err(text);
        assert!(e.contains(want), "{e}");
    }

    /// Asserts that `text` is refused with a message starting with `want`.
    fn assert_err_starts(text: &str, want: &str) {
        let e = err(text);
        assert!(e.starts_with(want), "{e}");
    }

    /// Asserts that `text` is refused with a message ending with `want`.
    fn assert_err_ends(text: &str, want: &str) {
        let e = err(text);
        assert!(e.ends_with(want), "{e}");
    }

    #[test]
    fn a_vm_attaches_to_a_vgpu_socket_with_a_gpu_table() {
        let remote = GOOD.replace(
            "args = \"x=1\"",
            "args = \"x=1\"\n        gpu = { socket = \"vgpu.sock\" }",
        );
        let c = parse(&remote).unwrap();
        assert!(!c.vm[0].gpu, "not on this fleet's GPU");
        assert_eq!(c.vm[0].gpu_socket.as_deref(), Some(Path::new("vgpu.sock")));
        for bad in [
            "gpu = { socket = \"\" }",
            "gpu = { path = \"x\" }",
            "gpu = { socket = \"x\", priority = 3 }",
            "gpu = { socket = 3 }",
            "gpu = \"x\"",
        ] {
            let t = GOOD.replace("args = \"x=1\"", &format!("args = \"x=1\"\n        {bad}"));
            assert!(err(&t).contains("field `gpu`"), "{bad}: {}", err(&t));
        }
    }

    #[test]
    fn gpu_vms_need_room_for_a_cwsr_area_and_scheduler_section_parses() {
        let gpu = GOOD.replace("args = \"x=1\"", "args = \"x=1\"\n        gpu = true");
        assert_err_starts(
            &gpu,
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `memory_mib`: 16 MiB is too small for `gpu = true`",
        );
        let ok = parse(&format!("{gpu}\n        memory_mib = 256\n")).unwrap();
        assert!(ok.vm[0].gpu);
        // A smaller GPU needs less.
        let small = format!("[gpu]\nxccs = 1\ncus_per_xcc = 4\n{gpu}");
        assert!(parse(&small).is_ok(), "{}", err(&small));
        let c = parse(&format!(
            "[scheduler]\npolicy = \"fifo\"\nmin_run_ns = 0\n{GOOD}"
        ))
        .unwrap();
        assert_eq!(c.scheduler.policy, scheduler::Policy::Fifo);
        assert_err_starts(
            &format!("[scheduler]\naging_ns = 0\n{GOOD}"),
            "/cfg/fleet.toml: field `scheduler.aging_ns`: must be > 0",
        );
        let e = err(&format!("[scheduler]\nquantum = 5\n{GOOD}"));
        assert!(
            e.contains("/cfg/fleet.toml") && e.contains("unknown field `quantum`"),
            "{e}"
        );
    }

    #[test]
    fn latency_figures_reach_the_longest_run_timeout() {
        assert_eq!(
            TIMEOUT_MS_RANGE.end() * 1_000_000,
            mdev::telemetry::LATENCY_LIMIT_NS
        );
    }

    #[test]
    fn toml_syntax_errors_keep_their_lines_and_caret() {
        let e = FleetConfig::parse(
            "[[vm]]\nname = \"a\"\nimage = builtin:hello\n",
            Path::new("/x/f.toml"),
        )
        .unwrap_err()
        .to_string();
        let lines: Vec<&str> = e.lines().collect();
        assert!(lines.len() >= 3, "{e}");
        assert!(
            lines[0].starts_with("/x/f.toml: TOML parse error at line 3"),
            "{e}"
        );
        let quoted = lines
            .iter()
            .position(|l| l.contains("image = builtin:hello"));
        let caret = lines
            .iter()
            .position(|l| l.trim_start().starts_with("|") && l.contains('^'));
        assert!(
            quoted.zip(caret).is_some_and(|(q, c)| c == q + 1),
            "the caret is under the quoted line: {e}"
        );
    }

    #[test]
    fn errors_name_file_vm_field_and_reason() {
        assert_err_eq(
            &GOOD.replace("priority = 12", "priority = 16"),
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `priority`: 16 is out of range 0..=15",
        );
        assert_err_has(
            &format!("{GOOD}{}", GOOD),
            "vm 'a' (vm[1]): field `name`: duplicate name",
        );
        assert_err_has(
            &GOOD.replace("builtin:hello", "builtin:nope"),
            "field `image`: no built-in image 'nope'",
        );
        assert_err_has(
            &GOOD.replace("builtin:hello", "missing.elf"),
            "image file /cfg/missing.elf not found",
        );
        assert_err_has(
            &format!("{GOOD}memory_mib = 1\n"),
            "field `memory_mib`: 1 MiB is too small",
        );
        // RAM above the 3 GiB MMIO hole is fine up to 64 GiB.
        for mib in [3072, 3584, 4096, 16384, MAX_MEMORY_MIB] {
            let cfg = parse(&format!("{GOOD}memory_mib = {mib}\n")).unwrap();
            assert_eq!(cfg.vm[0].memory_mib, mib);
        }
        assert_eq!(MAX_MEMORY_MIB, 65536);
        assert_err_has(
            &format!("{GOOD}memory_mib = 65537\n"),
            "field `memory_mib`: 65537 MiB is too large (maximum 65536 MiB)",
        );
        assert_err_has(
            &format!("{GOOD}weight = 0\n").replace("weight = 3\n", ""),
            "field `weight`: 0 is out of range",
        );
        assert_err_has(&format!("{GOOD}vcpus = 0\n"), "field `vcpus`");
        assert_err_has(
            &GOOD.replace("name = \"a\"", "name = \"a b\""),
            "field `name`: use only",
        );
        for bad in [".", "..", ".hidden", "-v", "_x"] {
            assert_err_has(
                &GOOD.replace("name = \"a\"", &format!("name = \"{bad}\"")),
                &format!("field `name`: '{bad}' must begin with a letter or a digit"),
            );
        }
        assert_eq!(name_problem("a..b"), None);
        assert_eq!(name_problem("0.9-x_y"), None);
        assert_err_has("[run]\ntimeout_ms = 5\n", "field `vm`: no [[vm]] entries");
    }

    #[test]
    fn unknown_fields_and_wrong_types_name_the_vm_and_field() {
        assert_err_starts(
            &format!("{GOOD}colour = \"red\"\n"),
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `colour`: unknown field",
        );
        assert_err_eq(
            &GOOD.replace("priority = 12", "priority = \"high\""),
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `priority`: expected an integer, found a string",
        );
        assert_err_ends(
            &GOOD.replace("priority = 12", "priority = -1"),
            "field `priority`: -1 is out of range 0..=15",
        );
        assert_err_ends(
            &GOOD.replace("image = \"builtin:hello\"", ""),
            "field `image`: missing (required)",
        );
        // Sections other than [[vm]] keep the parser's line and column.
        let e = err(&format!("[gpu]\nbackend = \"cuda\"\n{GOOD}"));
        assert!(
            e.contains("unknown variant `cuda`") && e.contains("line 2"),
            "{e}"
        );
        assert_err_has(&format!("{GOOD}\n[extra]\n"), "unknown field `extra`");
    }

    #[test]
    fn gpu_omitted_is_an_mi300x_in_spx() {
        let cfg = parse(GOOD).unwrap();
        assert_eq!(cfg.gpus, vec![GpuConfig::default()]);
        assert_eq!(
            (
                cfg.first_gpu().topology.xccs,
                cfg.first_gpu().topology.cus_per_xcc
            ),
            (8, 38)
        );
        assert_eq!(cfg.first_gpu().topology.partition_mode, PartitionMode::Spx);
        assert_eq!(cfg.vm[0].partition, None);
        let s = cfg.gpu_summary();
        assert!(s.contains("8 XCCs x 38 CUs = 304 CUs"), "{s}");
        assert!(
            s.contains("partition mode SPX: 1 partition of 8 XCCs"),
            "{s}"
        );
        assert!(s.contains("user HQD slots: 24 "), "{s}");
    }

    #[test]
    fn gpu_fields_override_the_defaults() {
        let cfg = parse(&format!(
            "[gpu]\nbackend = \"sim\"\npartition_mode = \"CPX\"\nreserved_queues_per_pipe = 0\n\
             [gpu.cwsr]\ntrap_ns = 1000\n{GOOD}partition = 7\n"
        ))
        .unwrap();
        assert_eq!(cfg.first_gpu().topology.partition_mode, PartitionMode::Cpx);
        assert_eq!(cfg.first_gpu().topology.xccs, 8);
        assert_eq!(cfg.first_gpu().topology.partitions(), 8);
        assert_eq!(cfg.first_gpu().topology.cwsr.trap_ns, 1000);
        assert_eq!(cfg.first_gpu().topology.cwsr.save_bytes_per_us, 200_000);
        assert_eq!(cfg.vm[0].partition, Some(7));
        let s = cfg.gpu_summary();
        assert!(
            s.contains("CPX: 8 partitions of 1 XCC (38 CUs each)"),
            "{s}"
        );
        assert!(s.contains("user HQD slots: 256 "), "{s}");
        assert!(s.contains("a->7"), "{s}");
    }

    #[test]
    fn unknown_gpu_field_is_rejected_naming_it() {
        let e = err(&format!("[gpu]\nxcc = 4\n{GOOD}"));
        assert!(e.starts_with("/cfg/fleet.toml: "), "{e}");
        assert!(e.contains("unknown field `xcc`"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        assert_err_has(
            &format!("[gpu.cwsr]\ntrap = 4\n{GOOD}"),
            "unknown field `trap`",
        );
        assert_err_has(
            &format!("[gpu]\nbackend = \"cuda\"\n{GOOD}"),
            "unknown variant `cuda`",
        );
        assert_err_has(
            &format!("[gpu]\npartition_mode = \"spx\"\n{GOOD}"),
            "unknown variant `spx`",
        );
    }

    #[test]
    fn invalid_gpu_topology_names_file_section_field_and_reason() {
        let e = err(&format!(
            "[gpu]\nxccs = 3\npartition_mode = \"DPX\"\n{GOOD}"
        ));
        assert_eq!(
            e,
            "/cfg/fleet.toml: gpu: field `xccs`: 3 XCCs do not split evenly into the 2 \
             partitions of partition_mode DPX (xccs must be a multiple of 2)"
        );
        assert_err_eq(
            &format!("[gpu]\ncus_per_xcc = 0\n{GOOD}"),
            "/cfg/fleet.toml: gpu: field `cus_per_xcc`: must be greater than 0",
        );
        assert_err_has(
            &format!("[gpu.sim]\njitter_permille = 2000\n{GOOD}"),
            "gpu: field `sim.jitter_permille`: 2000 exceeds the maximum 1000",
        );
        assert_err_has(
            &format!("[gpu]\nreserved_queues_per_pipe = 8\n{GOOD}"),
            "gpu: field `reserved_queues_per_pipe`: 8 of 8",
        );
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("hqdmux-config-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn image_files_are_refused_unless_regular_bounded_elf() {
        let dir = temp_dir("img");
        let elf = images::builtin("hello").unwrap();
        let good = dir.join("good.elf");
        std::fs::write(&good, elf).unwrap();
        assert_eq!(read_image_file(&good, 16 << 20).unwrap(), elf);
        // The cap is the VM's RAM: one byte less than the file is refused.
        let e = read_image_file(&good, elf.len() as u64 - 1).unwrap_err();
        assert!(
            matches!(e, ImageFileError::TooLarge { size, .. } if size == elf.len() as u64),
            "{e}"
        );
        // A sparse 1 GiB file is refused from its size, before any read.
        let big = dir.join("big.elf");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        let e = read_image_file(&big, 16 << 20).unwrap_err().to_string();
        assert!(e.starts_with("1073741824 bytes is larger than"), "{e}");
        // Not ELF: refused from the first bytes.
        let text = dir.join("text");
        std::fs::write(&text, b"#!/bin/sh\n").unwrap();
        let e = read_image_file(&text, 16 << 20).unwrap_err();
        assert!(
            matches!(&e, ImageFileError::NotElf(m) if m == b"#!/b"),
            "{e}"
        );
        let e = read_image_file(Path::new("/dev/zero"), 16 << 20).unwrap_err();
        assert_eq!(e.to_string(), "is a character device, not a regular file");
        let e = read_image_file(&dir, 16 << 20).unwrap_err();
        assert_eq!(e.to_string(), "is a directory, not a regular file");
        let fifo = dir.join("fifo");
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opening a FIFO without a writer would block without O_NONBLOCK.
        let e = read_image_file(&fifo, 16 << 20).unwrap_err();
        assert_eq!(e.to_string(), "is a FIFO, not a regular file");
        let e = read_image_file(&dir.join("none"), 16 << 20).unwrap_err();
        assert!(
            matches!(&e, ImageFileError::Open(io) if io.kind() == std::io::ErrorKind::NotFound)
        );
        // Through the config: file, VM, field and reason.
        let e = err(&GOOD.replace("builtin:hello", "/dev/zero"));
        assert_eq!(
            e,
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `image`: /dev/zero: \
             is a character device, not a regular file"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn run_timeout_has_one_range_for_the_file_and_the_option() {
        assert!(check_timeout_ms(0)
            .unwrap_err()
            .starts_with("must be at least 1 ms, got 0 (range 1..="));
        assert!(check_timeout_ms(u64::MAX)
            .unwrap_err()
            .starts_with("must be at most 2592000000 ms (30 days)"));
        assert!(check_timeout_ms(1).is_ok());
        assert!(check_timeout_ms(*TIMEOUT_MS_RANGE.end()).is_ok());
        assert!(check_timeout_ms(u64::MAX).is_err());
        let e = err(&format!("[run]\ntimeout_ms = 0\n{GOOD}"));
        assert_eq!(
            e,
            format!(
                "/cfg/fleet.toml: field `run.timeout_ms`: {}",
                check_timeout_ms(0).unwrap_err()
            )
        );
    }

    fn fleet(n: usize, vm_extra: &str) -> FleetConfig {
        let mut text = String::new();
        for i in 0..n {
            text += &format!("[[vm]]\nname = \"v{i}\"\nimage = \"builtin:hello\"\n{vm_extra}\n");
        }
        parse(&text).unwrap()
    }

    #[test]
    fn needs_grow_with_vms_vcpus_and_gpus() {
        let one = fleet(1, "").needs();
        let two = fleet(2, "").needs();
        assert_eq!(two.open_files - one.open_files, OPEN_FILES_PER_VM + 1);
        assert_eq!(two.memory_bytes, 2 * (16 << 20));
        let v4 = fleet(1, "vcpus = 4").needs();
        assert_eq!(v4.open_files - one.open_files, 3);
        let g = fleet(1, "gpu = true\nmemory_mib = 256").needs();
        assert_eq!(g.open_files - one.open_files, OPEN_FILES_PER_GPU_VM);
        assert_eq!(g.memory_bytes, 256 << 20);
    }

    #[test]
    fn check_host_refuses_a_fleet_beyond_the_open_files_or_memory() {
        let cfg = fleet(3, "");
        let need = cfg.needs();
        let file = Path::new("/cfg/fleet.toml");
        let roomy = HostLimits {
            open_files: need.open_files,
            mem_available: Some(need.memory_bytes),
        };
        assert_eq!(cfg.check_host(file, &roomy).unwrap(), need);
        let e = cfg
            .check_host(
                file,
                &HostLimits {
                    open_files: need.open_files - 1,
                    ..roomy
                },
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/cfg/fleet.toml: cannot start on this host: 3 VMs need about")
                && e.contains(&format!(
                    "the limit is {} (RLIMIT_NOFILE",
                    need.open_files - 1
                )),
            "{e}"
        );
        let e = cfg
            .check_host(
                file,
                &HostLimits {
                    mem_available: Some(need.memory_bytes - 1),
                    ..roomy
                },
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("48 MiB of guest RAM in total"), "{e}");
        // Unknown available memory is not a reason to refuse.
        let unknown = HostLimits {
            mem_available: None,
            ..roomy
        };
        assert!(cfg.check_host(file, &unknown).is_ok());
    }

    #[test]
    fn mem_available_is_read_in_bytes() {
        let m = "MemTotal:       24684092 kB\nMemFree: 1 kB\nMemAvailable:   22928276 kB\n";
        assert_eq!(mem_available_bytes(m), Some(22928276 * 1024));
        assert_eq!(mem_available_bytes("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available_bytes("MemAvailable: lots kB\n"), None);
    }

    #[test]
    fn vm_partition_must_exist_in_the_topology() {
        let e = err(&format!("{GOOD}partition = 1\n"));
        assert_eq!(
            e,
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `partition`: 1 is out of range 0..=0 \
             ([gpu] partition_mode SPX has 1 partition)"
        );
        assert_err_has(
            &format!("[gpu]\npartition_mode = \"QPX\"\n{GOOD}partition = 4\n"),
            "field `partition`: 4 is out of range 0..=3 ([gpu] partition_mode QPX has 4 partitions)",
        );
        let cfg = parse(&format!(
            "[gpu]\npartition_mode = \"QPX\"\n{GOOD}partition = 3\n"
        ))
        .unwrap();
        assert_eq!(cfg.vm[0].partition, Some(3));
    }

    /// `n` `[[gpu]]` entries with ids 0..n, then `vms`.
    fn multi(n: u32, extra: &str, vms: &str) -> String {
        let mut t = String::new();
        for id in 0..n {
            t += &format!("[[gpu]]\nid = {id}\n{extra}\n");
        }
        t + vms
    }

    fn gvm(name: &str, more: &str) -> String {
        format!(
            "[[vm]]\nname = \"{name}\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\n{more}\n"
        )
    }

    #[test]
    fn gpu_entries_each_have_an_id_and_their_own_topology() {
        let text = format!(
            "[[gpu]]\nid = 0\n[[gpu]]\nid = 3\npartition_mode = \"CPX\"\n[gpu.cwsr]\ntrap_ns = 7\n{}{}",
            gvm("a", "gpu_id = 3\npartition = 7"),
            gvm("b", "gpu_id = 0")
        );
        let c = parse(&text).unwrap();
        assert!(c.gpu_entries);
        assert_eq!(c.gpus.len(), 2);
        assert_eq!(
            c.gpu(3).unwrap().topology.partition_mode,
            PartitionMode::Cpx
        );
        assert_eq!(c.gpu(3).unwrap().topology.cwsr.trap_ns, 7);
        assert_eq!(c.gpu(0).unwrap().topology.cwsr.trap_ns, 5000);
        assert_eq!(c.vm[0].gpu_id, Some(3));
        assert_eq!(c.vm[0].placement.as_deref(), Some("gpu_id = 3"));
        let s = c.gpu_summary();
        assert!(s.contains("gpu 3: partition mode CPX: 8 partitions"), "{s}");
        assert!(s.contains("gpu 0: partition mode SPX"), "{s}");
        assert!(s.contains("placement: vm 'b' on gpu 0 (gpu_id = 0)"), "{s}");
        // A single [gpu] table is GPU 0, as before.
        let one = parse(&gvm("a", "")).unwrap();
        assert!(!one.gpu_entries);
        assert_eq!(one.vm[0].gpu_id, Some(0));
        // A VM without a vGPU is on no GPU.
        assert_eq!(parse(GOOD).unwrap().vm[0].gpu_id, None);
    }

    #[test]
    fn hostile_gpu_entries_are_refused_naming_the_entry_and_field() {
        assert_err_eq(
            &multi(1, "", &gvm("a", ""))
                .replace("[[gpu]]\nid = 0", "[[gpu]]\nid = 0\n[[gpu]]\nid = 0"),
            "/cfg/fleet.toml: gpu[1] (id 0): field `id`: duplicate id 0: gpu[0] has it \
             (each [[gpu]] needs its own id)",
        );
        // Two entries without ids are both 0.
        assert_err_has(
            &format!("[[gpu]]\n[[gpu]]\n{}", gvm("a", "")),
            "gpu[1] (id 0): field `id`: duplicate id 0",
        );
        assert_err_eq(
            &format!("[[gpu]]\nid = 64\n{}", gvm("a", "")),
            "/cfg/fleet.toml: gpu[0] (id 64): field `id`: 64 is out of range 0..=63",
        );
        let e = err(&format!("[[gpu]]\nid = -1\n{}", gvm("a", "")));
        assert!(
            e.starts_with("/cfg/fleet.toml: ") && e.contains("line 2"),
            "{e}"
        );
        assert_err_eq(
            &format!("gpu = []\n{}", gvm("a", "")),
            "/cfg/fleet.toml: field `gpu`: no [[gpu]] entries (omit `gpu` for one MI300X)",
        );
        let many = multi(65, "", &gvm("a", ""));
        assert_err_has(&many, "field `gpu`: 65 [[gpu]] entries, at most 64");
        // The topology of one entry is checked, naming it.
        assert_err_eq(
            &multi(2, "", &gvm("a", "")).replace("id = 1\n", "id = 1\ncus_per_xcc = 0\n"),
            "/cfg/fleet.toml: gpu[1] (id 1): field `cus_per_xcc`: must be greater than 0",
        );
        // Unknown fields keep the parser's line inside an entry.
        let e = err(&multi(2, "", &gvm("a", "")).replace("id = 1\n", "id = 1\nxcc = 2\n"));
        assert!(
            e.contains("unknown field `xcc`") && e.contains("line 6"),
            "{e}"
        );
        assert_err_has(
            &format!("gpu = 3\n{}", gvm("a", "")),
            "a [gpu] table or [[gpu]] entries",
        );
    }

    #[test]
    fn vm_placement_is_checked_against_the_gpus() {
        let two = |vm: &str| multi(2, "", vm);
        assert_err_eq(
            &two(&gvm("a", "gpu_id = 5")),
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `gpu_id`: no GPU with id 5 (this file's GPUs: 0, 1)",
        );
        assert_err_eq(
            &two(&gvm("a", "gpu_id = 64")),
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `gpu_id`: 64 is out of range 0..=63",
        );
        assert_err_ends(
            &two(&gvm("a", "gpu_id = \"1\"")),
            "field `gpu_id`: expected an integer, found a string",
        );
        assert_err_eq(
            &two(&format!("{GOOD}gpu_id = 1\n")),
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `gpu_id`: gpu_id = 1 needs `gpu = true` \
             (a vGPU on this fleet's GPU 1)",
        );
        // The partition must be on the named GPU ...
        let mixed = "[[gpu]]\nid = 0\n[[gpu]]\nid = 1\npartition_mode = \"QPX\"\n";
        assert_err_eq(
            &format!("{mixed}{}", gvm("a", "gpu_id = 0\npartition = 2")),
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `partition`: 2 is out of range 0..=0 \
             (GPU 0's partition_mode SPX has 1 partition)",
        );
        let c = parse(&format!("{mixed}{}", gvm("a", "gpu_id = 1\npartition = 2"))).unwrap();
        assert_eq!((c.vm[0].gpu_id, c.vm[0].partition), (Some(1), Some(2)));
        // ... or, without gpu_id, on some GPU: placement only looks there.
        let c = parse(&format!("{mixed}{}", gvm("a", "partition = 3"))).unwrap();
        assert_eq!(c.vm[0].gpu_id, Some(1));
        assert_err_has(
            &format!("{mixed}{}", gvm("a", "partition = 4")),
            "field `partition`: 4 is out of range 0..=3",
        );
        // The CWSR area of the named GPU decides the least RAM: a small GPU
        // takes a small VM, the default MI300X does not.
        let small = "[[gpu]]\nid = 0\n[[gpu]]\nid = 1\nxccs = 1\ncus_per_xcc = 4\n";
        let vm = "[[vm]]\nname = \"a\"\nimage = \"builtin:gpu\"\nmemory_mib = 16\ngpu = true\n";
        assert!(parse(&format!("{small}{vm}gpu_id = 1\n")).is_ok());
        assert_err_has(
            &format!("{small}{vm}gpu_id = 0\n"),
            "too small for `gpu = true`",
        );
        assert_err_has(&format!("{small}{vm}"), "too small for `gpu = true`");
    }

    #[test]
    fn automatic_placement_takes_the_gpu_with_the_least_weight_at_or_above_the_priority() {
        // Two equal GPUs: a heavy high-priority VM on 0; a high-priority VM
        // goes to 1, and then a low-priority VM goes where the weight above
        // it is least.
        let text = multi(
            2,
            "",
            &[
                gvm("big", "gpu_id = 0\npriority = 8\nweight = 4"),
                gvm("hi", "priority = 8\nweight = 1"),
                gvm("lo", "priority = 2\nweight = 1"),
                gvm("lo2", "priority = 2\nweight = 1"),
            ]
            .concat(),
        );
        let c = parse(&text).unwrap();
        let on: Vec<Option<u32>> = c.vm.iter().map(|v| v.gpu_id).collect();
        assert_eq!(on, [Some(0), Some(1), Some(1), Some(1)]);
        let why = c.vm[1].placement.as_deref().unwrap();
        assert!(
            why.starts_with("auto: gpu 1, the largest entitlement at priority 8 weight 1: ")
                && why.contains("gpu 0 60/304 CUs (weight 4 at >= 8, 1 VM)")
                && why.contains("gpu 1 304/304 CUs (weight 0 at >= 8, 0 VMs)"),
            "{why}"
        );
        // lo2: at >= 2, gpu 0 has 4 and gpu 1 has 2: gpu 1 (152 vs 60 CUs).
        assert!(
            c.vm[3]
                .placement
                .as_deref()
                .unwrap()
                .contains("gpu 1 101/304"),
            "{:?}",
            c.vm[3].placement
        );
        // Equal load: the GPU with fewer VMs, then the first.
        let c = parse(&multi(
            3,
            "",
            &[
                gvm("x", "gpu_id = 1\npriority = 1"),
                gvm("y", "priority = 9"),
                gvm("z", "priority = 9"),
            ]
            .concat(),
        ))
        .unwrap();
        assert_eq!(c.vm[1].gpu_id, Some(0));
        assert_eq!(c.vm[2].gpu_id, Some(2));
        // A larger GPU wins at equal weight: entitlement is in CUs.
        let c = parse(&format!(
            "[[gpu]]\nid = 0\nxccs = 4\n[[gpu]]\nid = 1\n{}{}",
            gvm("a", "gpu_id = 1"),
            gvm("b", "")
        ))
        .unwrap();
        // gpu 0: 152 x 1/1 = 152 CUs; gpu 1: 304 x 1/2 = 152 CUs: equal, fewer VMs wins.
        assert_eq!(c.vm[1].gpu_id, Some(0));
        let c = parse(&format!(
            "[[gpu]]\nid = 0\nxccs = 2\n[[gpu]]\nid = 1\n{}{}",
            gvm("a", "gpu_id = 1"),
            gvm("b", "")
        ))
        .unwrap();
        assert_eq!(c.vm[1].gpu_id, Some(1), "{:?}", c.vm[1].placement);
    }

    #[test]
    fn many_equal_vms_spread_evenly_and_priorities_are_balanced_per_level() {
        // 8 equal GPUs, 160 VMs alternating priority 9 and 3: each GPU gets
        // 10 of each level (weight at or above each level balanced).
        let vms: String = (0..160)
            .map(|i| {
                gvm(
                    &format!("v{i}"),
                    &format!("priority = {}", if i % 2 == 0 { 9 } else { 3 }),
                )
            })
            .collect();
        let c = parse(&multi(8, "", &vms)).unwrap();
        for id in 0..8 {
            for prio in [9, 3] {
                let n =
                    c.vm.iter()
                        .filter(|v| v.gpu_id == Some(id) && v.priority == prio)
                        .count();
                assert_eq!(n, 10, "gpu {id} priority {prio}");
            }
        }
        // The file's incremental placement is the one place_vm gives
        // against the VMs before each.
        for i in [0, 1, 17, 159] {
            let p = place_vm(&c.gpus, &c.vm[..i], &c.vm[i]);
            assert_eq!(Some(p.gpu_id), c.vm[i].gpu_id, "vm {i}");
            assert_eq!(Some(p.reason), c.vm[i].placement, "vm {i}");
        }
    }

    #[test]
    fn automatic_placement_counts_the_partition_a_vm_runs_on_not_the_whole_gpu() {
        // GPU 1 is QPX: a VM there runs on one 76-CU partition, so alone it
        // is entitled to 76 CUs, less than half of GPU 0's SPX partition
        // beside one equal VM (152 CUs).
        let text = format!(
            "[[gpu]]\nid = 0\n[[gpu]]\nid = 1\npartition_mode = \"QPX\"\n{}{}{}{}",
            gvm("a", "gpu_id = 0\npriority = 4"),
            gvm("b", "priority = 4"),
            gvm("c", "gpu_id = 1\npartition = 0\npriority = 4\nweight = 3"),
            gvm("d", "priority = 4\npartition = 0"),
        );
        let c = parse(&text).unwrap();
        let why = c.vm[1].placement.as_deref().unwrap();
        assert_eq!(c.vm[1].gpu_id, Some(0), "{why}");
        assert!(
            why.contains("gpu 0 152/304 CUs (weight 1 at >= 4, 1 VM)")
                && why.contains("gpu 1 partition 0 76/76 CUs (weight 0 at >= 4, 0 VMs)"),
            "{why}"
        );
        // d is pinned to partition 0: on GPU 0 beside a and b it gets
        // 304/3 = 101 CUs; on GPU 1 beside c (weight 3) 76/4 = 19.
        let why = c.vm[3].placement.as_deref().unwrap();
        assert_eq!(c.vm[3].gpu_id, Some(0), "{why}");
        assert!(
            why.contains("gpu 1 partition 0 19/76 CUs (weight 3 at >= 4, 1 VM)"),
            "{why}"
        );
        // Unpinned VMs on a partitioned GPU are counted on the partition
        // with the fewest VMs, as the scheduler places them: four VMs
        // on an empty QPX GPU leave each partition one VM, and a fifth
        // sees 38 of 76 CUs there.
        let mut text = "[[gpu]]\nid = 0\npartition_mode = \"QPX\"\n".to_owned();
        for i in 0..5 {
            text += &gvm(&format!("v{i}"), "");
        }
        let c = parse(&text).unwrap();
        let why = c.vm[4].placement.as_deref().unwrap();
        assert!(
            why.contains("gpu 0 partition 0 38/76 CUs (weight 1 at >= 0, 1 VM)"),
            "{why}"
        );
    }

    #[test]
    fn added_vms_are_placed_against_the_live_vms() {
        let c = parse(&multi(2, "", &gvm("a", "gpu_id = 0\nweight = 5"))).unwrap();
        let t: toml::Table = toml::from_str(&gvm("n", "").replace("[[vm]]\n", "")).unwrap();
        let mut v = c.check_added_vm(&t, Path::new("/api")).unwrap();
        assert_eq!(v.gpu_id, None);
        c.place_added(&mut v, c.vm.iter());
        assert_eq!(v.gpu_id, Some(1));
        // With 'a' gone (not live), GPU 0 is as good and has fewer VMs... equal: the first.
        let mut v2 = c.check_added_vm(&t, Path::new("/api")).unwrap();
        c.place_added(&mut v2, std::iter::empty());
        assert_eq!(v2.gpu_id, Some(0));
        // An unknown gpu_id is refused like the file's.
        let bad: toml::Table =
            toml::from_str(&gvm("n", "gpu_id = 2").replace("[[vm]]\n", "")).unwrap();
        let e = c
            .check_added_vm(&bad, Path::new("/api"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("field `gpu_id`: no GPU with id 2"), "{e}");
    }

    #[test]
    fn the_eight_gpu_example_parses_with_one_vm_per_gpu() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mi300x-8gpu.toml");
        let c = FleetConfig::load(&path).unwrap();
        assert_eq!(c.gpus.len(), 8);
        let mut on: Vec<u32> = c.vm.iter().filter_map(|v| v.gpu_id).collect();
        on.sort_unstable();
        on.dedup();
        assert_eq!(on, (0..8).collect::<Vec<_>>());
    }
}
