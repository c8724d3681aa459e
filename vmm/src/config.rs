//! Fleet configuration: one TOML file describing every VM of a run.
//!
//! ```toml
//! [run]
//! timeout_ms = 10000
//!
//! [gpu]
//! backend = "sim"
//!
//! [[vm]]
//! name = "alpha"
//! image = "builtin:hello"
//! memory_mib = 16
//! vcpus = 1
//! priority = 8
//! weight = 1
//! args = "exit=0"
//! ```
//!
//! Every error names the file, the VM (name and index), the field and the reason.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Smallest guest RAM: 1 MiB of boot structures plus room for the image.
pub const MIN_MEMORY_MIB: u64 = 4;
/// Largest guest RAM: RAM must stay below the 3 GiB MMIO hole.
pub const MAX_MEMORY_MIB: u64 = 3072;
/// Most vCPUs per VM.
pub const MAX_VCPUS: u8 = 8;
/// Longest argument string (bytes), as the boot-info block holds it.
pub const MAX_ARGS_LEN: usize = 1024;
/// Longest VM name (bytes).
pub const MAX_NAME_LEN: usize = 64;

/// A whole run: VMs, GPU and run limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// Run limits.
    #[serde(default)]
    pub run: RunConfig,
    /// The physical GPU the VMs share.
    #[serde(default)]
    pub gpu: GpuConfig,
    /// The VMs, in launch order.
    #[serde(default)]
    pub vm: Vec<VmConfig>,
    /// Directory of the config file; relative image paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// Limits of one run.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Stop every VM still running after this many milliseconds (none = wait forever).
    pub timeout_ms: Option<u64>,
}

/// Which physical GPU backend to use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuBackendKind {
    /// The simulated MI300-class GPU (the only backend so far).
    #[default]
    Sim,
}

/// The `[gpu]` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// Backend kind.
    #[serde(default)]
    pub backend: GpuBackendKind,
}

/// One `[[vm]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// Unique name; prefixes the VM's console lines.
    pub name: String,
    /// `builtin:NAME` or a path to a static x86_64 ELF loaded at 1 MiB.
    pub image: String,
    /// Guest RAM in MiB.
    #[serde(default = "default_memory_mib")]
    pub memory_mib: u64,
    /// Number of vCPUs (vCPU 0 runs the program).
    #[serde(default = "default_vcpus")]
    pub vcpus: u8,
    /// GPU priority 0..=15, higher wins.
    #[serde(default)]
    pub priority: u8,
    /// Share of GPU time among VMs of equal priority (1..=1000).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Argument string passed to the guest.
    #[serde(default)]
    pub args: String,
}

fn default_memory_mib() -> u64 {
    16
}
fn default_vcpus() -> u8 {
    1
}
fn default_weight() -> u32 {
    1
}

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
    /// A value that parses but is not acceptable.
    #[error("{file}: {place}field `{field}`: {reason}")]
    Invalid {
        /// The config file.
        file: PathBuf,
        /// "vm 'name' (vm[i]): " or empty for top-level fields.
        place: Place,
        /// The field name.
        field: &'static str,
        /// Why it is rejected.
        reason: String,
    },
}

/// Which part of the file an error is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A top-level section.
    Top,
    /// `[[vm]]` number `index` named `name`.
    Vm {
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
            Place::Vm { index, name } => write!(f, "vm '{name}' (vm[{index}]): "),
        }
    }
}

impl FleetConfig {
    /// Reads, parses and validates a fleet file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates `text` as if read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let mut cfg: FleetConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: path.to_owned(),
            message: one_line(&e.to_string()),
        })?;
        cfg.base_dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        cfg.validate(path)?;
        Ok(cfg)
    }

    fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let top = |field, reason: String| ConfigError::Invalid {
            file: file.to_owned(),
            place: Place::Top,
            field,
            reason,
        };
        if self.vm.is_empty() {
            return Err(top("vm", "no [[vm]] entries: nothing to launch".into()));
        }
        if self.run.timeout_ms == Some(0) {
            return Err(top("run.timeout_ms", "must be at least 1".into()));
        }
        let mut names = HashSet::new();
        for (index, vm) in self.vm.iter().enumerate() {
            let bad = |field, reason: String| ConfigError::Invalid {
                file: file.to_owned(),
                place: Place::Vm {
                    index,
                    name: vm.name.clone(),
                },
                field,
                reason,
            };
            if vm.name.is_empty() || vm.name.len() > MAX_NAME_LEN {
                return Err(bad("name", format!("must be 1..={MAX_NAME_LEN} bytes")));
            }
            if !vm
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            {
                return Err(bad(
                    "name",
                    "use only letters, digits, '-', '_' and '.'".into(),
                ));
            }
            if !names.insert(vm.name.as_str()) {
                return Err(bad(
                    "name",
                    "duplicate name: another VM already has it".into(),
                ));
            }
            if vm.priority > 15 {
                return Err(bad(
                    "priority",
                    format!("{} is out of range 0..=15", vm.priority),
                ));
            }
            if !(1..=1000).contains(&vm.weight) {
                return Err(bad(
                    "weight",
                    format!("{} is out of range 1..=1000", vm.weight),
                ));
            }
            if !(1..=MAX_VCPUS).contains(&vm.vcpus) {
                return Err(bad(
                    "vcpus",
                    format!("{} is out of range 1..={MAX_VCPUS}", vm.vcpus),
                ));
            }
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
            if vm.args.len() > MAX_ARGS_LEN {
                return Err(bad(
                    "args",
                    format!("{} bytes, maximum {MAX_ARGS_LEN}", vm.args.len()),
                ));
            }
            match vm.image_source(&self.base_dir) {
                ImageSource::Builtin(name) => {
                    if images::builtin(&name).is_none() {
                        let known: Vec<_> = images::names().collect();
                        return Err(bad(
                            "image",
                            format!(
                                "no built-in image '{name}' (built in: {})",
                                known.join(", ")
                            ),
                        ));
                    }
                }
                ImageSource::File(path) => {
                    if !path.is_file() {
                        return Err(bad(
                            "image",
                            format!("image file {} not found", path.display()),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "|")
        .collect::<Vec<_>>()
        .join(" ")
}

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
    fn good_config_gets_defaults() {
        let cfg = parse(GOOD).unwrap();
        assert_eq!(cfg.vm.len(), 1);
        let vm = &cfg.vm[0];
        assert_eq!(
            (vm.memory_mib, vm.vcpus, vm.priority, vm.weight),
            (16, 1, 12, 3)
        );
        assert_eq!(cfg.gpu.backend, GpuBackendKind::Sim);
        assert_eq!(
            vm.image_source(&cfg.base_dir),
            ImageSource::Builtin("hello".into())
        );
        assert_eq!(cfg.base_dir, Path::new("/cfg"));
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn errors_name_file_vm_field_and_reason() {
        let e = err(&GOOD.replace("priority = 12", "priority = 16"));
        assert_eq!(
            e,
            "/cfg/fleet.toml: vm 'a' (vm[0]): field `priority`: 16 is out of range 0..=15"
        );
        let e = err(&format!("{GOOD}{}", GOOD));
        assert!(
            e.contains("vm 'a' (vm[1]): field `name`: duplicate name"),
            "{e}"
        );
        let e = err(&GOOD.replace("builtin:hello", "builtin:nope"));
        assert!(e.contains("field `image`: no built-in image 'nope'"), "{e}");
        let e = err(&GOOD.replace("builtin:hello", "missing.elf"));
        assert!(e.contains("image file /cfg/missing.elf not found"), "{e}");
        let e = err(&format!("{GOOD}memory_mib = 1\n"));
        assert!(e.contains("field `memory_mib`: 1 MiB is too small"), "{e}");
        let e = err(&format!("{GOOD}weight = 0\n").replace("weight = 3\n", ""));
        assert!(e.contains("field `weight`: 0 is out of range"), "{e}");
        let e = err(&format!("{GOOD}vcpus = 0\n"));
        assert!(e.contains("field `vcpus`"), "{e}");
        let e = err(&GOOD.replace("name = \"a\"", "name = \"a b\""));
        assert!(e.contains("field `name`: use only"), "{e}");
        let e = err("[run]\ntimeout_ms = 5\n");
        assert!(e.contains("field `vm`: no [[vm]] entries"), "{e}");
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_parse_errors_with_location() {
        let e = err(&format!("{GOOD}colour = \"red\"\n"));
        assert!(e.starts_with("/cfg/fleet.toml: "), "{e}");
        assert!(e.contains("unknown field `colour`"), "{e}");
        let e = err(&GOOD.replace("priority = 12", "priority = \"high\""));
        assert!(e.contains("line"), "{e}");
        let e = err(&format!("[gpu]\nbackend = \"cuda\"\n{GOOD}"));
        assert!(e.contains("unknown variant `cuda`"), "{e}");
    }
}
