//! `hqdmux serve DEVICES.toml`: a daemon that owns the GPUs (`[gpu]` or
//! `[[gpu]]` entries), one arbiter per GPU that serves a vGPU, and serves
//! each `[[vgpu]]` entry (and each created over the API) as a vfio-user
//! device on its own Unix socket (docs/operators.md, "Serving vGPUs over vfio-user"),
//! until SIGINT/SIGTERM.
//!
//! A vGPU outlives its VMM: a VMM that disconnects, or dies mid-kernel,
//! has its queues released as a dying VM's are, and the socket takes the
//! next connection (a VM reboot).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use scheduler::VmParams;
use serde::Deserialize;
use vfio_server::{ServerOptions, ServerStats, VgpuSpec};

use crate::api::vgpus::VgpuControl;

use crate::config::{ConfigError, FleetConfig, Place, PRIORITY_RANGE, WEIGHT_RANGE};

/// Slice lengths a `[[vgpu]]` may ask for (ms), as `hqdmux set --quantum-ms`.
pub const QUANTUM_MS_RANGE: std::ops::RangeInclusive<u64> = 1..=10_000;

/// One `[[vgpu]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VgpuEntry {
    /// Unique name (metrics and timelines label the vGPU by it).
    pub name: String,
    /// The vfio-user socket (relative paths resolve against the file's directory).
    pub socket: PathBuf,
    /// GPU priority 0..=15, higher wins (default 0).
    #[serde(default)]
    pub priority: u32,
    /// Share among equal priorities, 1..=1000 (default 1).
    #[serde(default = "one")]
    pub weight: u32,
    /// GPU partition (none: the scheduler picks).
    #[serde(default)]
    pub partition: Option<u32>,
    /// The physical GPU (`[[gpu]] id`, default 0) whose arbiter serves it.
    #[serde(default)]
    pub gpu_id: u32,
    /// Preemption timeout (ms), as a fleet VM's.
    #[serde(default = "default_preempt")]
    pub preempt_timeout_ms: u64,
    /// Time slice (ms; none: the priority level's quantum).
    #[serde(default)]
    pub quantum_ms: Option<u64>,
    /// Per-vGPU override of `[gpu.guard]` limits.
    #[serde(default)]
    pub guard: mdev::guard::GuardOverride,
    /// Offer BAR2 as an mmap-able doorbell page (a VMM that maps it into
    /// the guest rings with no exit; the server scans it every
    /// [`vfio_server::DEFAULT_DOORBELL_POLL`] while queues are loaded).
    #[serde(default)]
    pub doorbell_page: bool,
}

fn one() -> u32 {
    1
}

fn default_preempt() -> u64 {
    mdev::arbiter::DEFAULT_PREEMPT_TIMEOUT_MS
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DevicesFile {
    #[serde(default)]
    gpu: crate::config::GpuList,
    #[serde(default)]
    scheduler: scheduler::SchedConfig,
    #[serde(default)]
    vgpu: Vec<VgpuEntry>,
    /// `[[vm]]` entries, read and checked as a fleet file's.
    #[serde(default)]
    vm: Vec<toml::Table>,
}

/// A parsed and checked devices file.
#[derive(Debug, Clone)]
pub struct DevicesConfig {
    /// The first GPU (the only one of a `[gpu]` table: topology, backend,
    /// simulator knobs, guard defaults, as in fleet files).
    pub gpu: crate::config::GpuConfig,
    /// Every GPU (`[gpu]` or `[[gpu]]` entries, checked as a fleet file's);
    /// each `[[vgpu]]` names one by `gpu_id`.
    pub gpus: Vec<crate::config::GpuConfig>,
    /// Scheduler policy and tunables.
    pub scheduler: scheduler::SchedConfig,
    /// The vGPUs (sockets resolved).
    pub vgpu: Vec<VgpuEntry>,
    /// The `[[vm]]` entries the daemon boots in its own VMM, checked and
    /// placed on the GPUs exactly as a fleet file's (`hqdmux run`).
    pub vm: Vec<crate::config::VmConfig>,
    /// The file's directory (relative image paths resolve against it).
    pub base_dir: PathBuf,
}

impl DevicesConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = eval::scenario::read_bounded(path, crate::config::MAX_CONFIG_BYTES).map_err(
            |source| ConfigError::Read {
                file: path.into(),
                source,
            },
        )?;
        Self::parse(&text, path)
    }

    /// Parses and checks `text` as if read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let f: DevicesFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: path.into(),
            message: e.to_string().replace('\n', " "),
        })?;
        let bad = |index: usize, name: &str, field: &str, reason: String| ConfigError::Invalid {
            file: path.into(),
            place: Place::Vgpu {
                index,
                name: name.into(),
            },
            field: field.into(),
            reason,
        };
        // The GPUs are checked exactly as a fleet file's (ids, topology,
        // guard), through a fleet of them; so are the `[[vm]]` entries,
        // through the fleet file's own reader (one validation).
        let gpus = if f.vm.is_empty() {
            let gpus = FleetConfig {
                run: Default::default(),
                gpus: f.gpu.gpus,
                gpu_entries: f.gpu.array,
                scheduler: f.scheduler.clone(),
                vm: Vec::new(),
                base_dir: PathBuf::from("."),
            };
            gpus.validate_gpus(path)?;
            FleetConfig {
                base_dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
                ..gpus
            }
        } else {
            FleetConfig::from_parts(Default::default(), f.gpu, f.scheduler.clone(), &f.vm, path)?
        };
        if f.vgpu.is_empty() && gpus.vm.is_empty() {
            return Err(ConfigError::Invalid {
                file: path.into(),
                place: Place::Top,
                field: "vgpu".into(),
                reason: "no [[vgpu]] or [[vm]] entry".into(),
            });
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let mut out = Vec::with_capacity(f.vgpu.len());
        for (i, mut v) in f.vgpu.into_iter().enumerate() {
            let n = v.name.clone();
            let range = |field: &str, val: u64, r: std::ops::RangeInclusive<u64>| {
                if r.contains(&val) {
                    Ok(())
                } else {
                    Err(bad(
                        i,
                        &n,
                        field,
                        format!("{val} is out of range {}..={}", r.start(), r.end()),
                    ))
                }
            };
            range(
                "priority",
                u64::from(v.priority),
                u64::from(*PRIORITY_RANGE.start())..=u64::from(*PRIORITY_RANGE.end()),
            )?;
            range(
                "weight",
                u64::from(v.weight),
                u64::from(*WEIGHT_RANGE.start())..=u64::from(*WEIGHT_RANGE.end()),
            )?;
            range(
                "preempt_timeout_ms",
                v.preempt_timeout_ms,
                mdev::arbiter::PREEMPT_TIMEOUT_MS_RANGE,
            )?;
            if let Some(q) = v.quantum_ms {
                range("quantum_ms", q, QUANTUM_MS_RANGE)?;
            }
            let Some(g) = gpus.gpu(v.gpu_id) else {
                let ids: Vec<String> = gpus.gpus.iter().map(|g| g.id.to_string()).collect();
                return Err(bad(
                    i,
                    &n,
                    "gpu_id",
                    format!(
                        "no GPU with id {} (this file's GPUs: {})",
                        v.gpu_id,
                        ids.join(", ")
                    ),
                ));
            };
            if let Some(p) = v.partition {
                range(
                    "partition",
                    u64::from(p),
                    0..=u64::from(g.topology.partitions()) - 1,
                )?;
            }
            // A fleet VM's name rule: the name is a URL path segment
            // (`/api/v1/vgpus/{name}`), a metrics label and a log word.
            if let Some(why) = crate::config::name_problem(&n) {
                return Err(bad(i, &n, "name", why));
            }
            if out.iter().any(|o: &VgpuEntry| o.name == n) {
                return Err(bad(i, &n, "name", "not unique".into()));
            }
            // vGPUs and VMs share the API's and the metrics' name space.
            if gpus.vm.iter().any(|vm| vm.name == n) {
                return Err(bad(i, &n, "name", "a [[vm]] entry has this name".into()));
            }
            v.socket = base.join(&v.socket);
            if out.iter().any(|o: &VgpuEntry| o.socket == v.socket) {
                return Err(bad(i, &n, "socket", "not unique".into()));
            }
            out.push(v);
        }
        Ok(DevicesConfig {
            gpu: gpus.gpus[0].clone(),
            gpus: gpus.gpus,
            scheduler: f.scheduler,
            vgpu: out,
            vm: gpus.vm,
            base_dir: gpus.base_dir,
        })
    }
}

impl VgpuEntry {
    /// The server's view of the entry, its guard over the `[gpu.guard]`
    /// defaults `guard`.
    pub fn spec(&self, guard: &mdev::guard::GuardConfig) -> VgpuSpec {
        VgpuSpec {
            name: self.name.clone(),
            params: VmParams {
                priority: self.priority as u8,
                weight: self.weight,
                partition: self.partition,
            },
            preempt_timeout: Duration::from_millis(self.preempt_timeout_ms),
            guard: guard.with(&self.guard),
            quantum: self.quantum_ms.map(Duration::from_millis),
        }
    }
}

/// Options of a serve run.
#[derive(Default)]
pub struct ServeOptions {
    /// Serve the operator API (metrics, timeline, stats, policy, vGPUs) here.
    pub api_socket: Option<PathBuf>,
    /// Permission bits of the API socket (`None`: 0600).
    pub api_socket_mode: Option<u32>,
    /// Where vGPUs created over the API put their sockets (`None`: the API
    /// socket's directory).
    pub vgpu_socket_dir: Option<PathBuf>,
    /// Ends the run when readable (SIGINT/SIGTERM).
    pub stop: Option<crate::signals::StopSignal>,
}

/// Serve failures.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The GPU could not be set up.
    #[error("gpu: {0}")]
    Gpu(String),
    /// A vGPU's socket.
    #[error("vgpu '{0}': {1}")]
    Socket(String, crate::api::vgpus::StartError),
    /// The API socket.
    #[error("api socket: {0}")]
    Api(crate::http::BindError),
    /// Waiting for the stop request failed.
    #[error("{0}")]
    Io(std::io::Error),
    /// The `[[vm]]` entries could not be booted (nothing of them runs).
    #[error("{0}")]
    Vms(crate::fleet::FleetError),
}

/// What a serve run did, per vGPU (config order, then those created over
/// the API and still there at the end).
#[derive(Debug)]
pub struct ServeReport {
    /// (name, counters).
    pub vgpus: Vec<(String, ServerStats)>,
    /// The arbiters' counters at the end, summed over the GPUs.
    pub gpu: mdev::arbiter::ArbiterStats,
    /// Each serving GPU's counters by `gpu_id`.
    pub gpus: Vec<(u32, mdev::arbiter::ArbiterStats)>,
    /// The daemon's VMs (`[[vm]]` entries, then those added over the API),
    /// when the file had `[[vm]]` entries.
    pub vms: Option<crate::fleet::FleetReport>,
}

/// Stops the servers and the arbiters on every return path.
struct Running {
    arbiters: Arc<crate::fleet::FleetGpus>,
    vgpus: Arc<VgpuControl>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.vgpus.stop_all();
        for (_, m) in self.arbiters.started() {
            m.shutdown();
        }
    }
}

/// Runs the daemon until `opts.stop` fires (or forever without one).
pub fn run_serve(cfg: &DevicesConfig, opts: ServeOptions) -> Result<ServeReport, ServeError> {
    // The GPUs as a fleet's: one arbiter per GPU that serves a vGPU,
    // started with its first vGPU (from the devices file or the API).
    let fleet = FleetConfig {
        run: Default::default(),
        gpus: cfg.gpus.clone(),
        gpu_entries: cfg.gpus.len() > 1,
        scheduler: cfg.scheduler.clone(),
        vm: cfg.vm.clone(),
        base_dir: cfg.base_dir.clone(),
    };
    let gpus = Arc::new(crate::fleet::FleetGpus::new(&fleet));
    let dir = opts
        .vgpu_socket_dir
        .clone()
        .or_else(|| {
            opts.api_socket
                .as_ref()
                .and_then(|p| p.parent())
                .map(Path::to_path_buf)
        })
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("."));
    let vgpus = Arc::new(VgpuControl::new(
        gpus.clone(),
        fleet.clone(),
        dir,
        ServerOptions::default(),
    ));
    let run = Running {
        arbiters: gpus.clone(),
        vgpus: vgpus.clone(),
    };
    for v in &cfg.vgpu {
        let guard = fleet.gpu(v.gpu_id).map_or(cfg.gpu.guard, |g| g.guard);
        vgpus
            .start(
                v.spec(&guard),
                &v.socket,
                v.doorbell_page,
                v.gpu_id,
                format!("gpu_id = {}", v.gpu_id),
            )
            .map_err(|e| ServeError::Socket(v.name.clone(), e))?;
    }
    if !cfg.vm.is_empty() {
        // The `[[vm]]` entries run in the fleet's VM runtime (the one
        // `hqdmux run` uses, with its API for adding and stopping VMs) on
        // the daemon's arbiters, so that a VM and a served vGPU on one GPU
        // share its scheduler; it serves the API, vGPUs included, and
        // returns on the stop request.
        log::info!("serve: booting {} VM(s)", cfg.vm.len());
        let report = crate::fleet::run_fleet_on(
            &fleet,
            crate::fleet::RunOptions {
                // Guest consoles go to stdout as `[name] line` (the
                // journal under systemd), as `hqdmux run`'s.
                echo: true,
                api_socket: opts.api_socket.clone(),
                stop: opts.stop.clone(),
                api_socket_mode: Some(opts.api_socket_mode.unwrap_or(0o600)),
            },
            Some(crate::fleet::Host {
                gpus: gpus.clone(),
                vgpus: vgpus.clone(),
            }),
        );
        log::info!("serve: stopping");
        return match report {
            Ok(r) => Ok(finish(run, Some(r))),
            // A stop request while the VMs were being built is a stop.
            Err(crate::fleet::FleetError::Stopped(sig)) => {
                log::info!(
                    "serve: {} before the VMs started",
                    crate::signals::name(sig)
                );
                Ok(finish(run, None))
            }
            Err(e) => Err(ServeError::Vms(e)),
        };
    }
    let _api = match &opts.api_socket {
        Some(path) => {
            // The fleet API over the daemon's arbiter: metrics, timeline,
            // stats, policy of every GPU, and the vGPUs (`/api/v1/vgpus`).
            let ctl = Arc::new(crate::api::FleetControl::new(gpus.clone(), &fleet, &[]));
            ctl.set_vgpus(vgpus.clone());
            log::info!(
                "serve: vGPUs created over the API put their sockets in {}",
                vgpus.socket_dir().display()
            );
            Some(
                crate::api::serve(path, opts.api_socket_mode.unwrap_or(0o600), ctl)
                    .map_err(ServeError::Api)?,
            )
        }
        None => None,
    };
    match &opts.stop {
        Some(stop) => wait_readable(stop.fd()).map_err(ServeError::Io)?,
        None => loop {
            std::thread::park();
        },
    }
    log::info!("serve: stopping");
    drop(_api);
    Ok(finish(run, None))
}

/// Stops the vGPU servers, then the arbiters, and reports.
fn finish(run: Running, vms: Option<crate::fleet::FleetReport>) -> ServeReport {
    let vgpus = run.vgpus.stop_all();
    let per_gpu: Vec<(u32, mdev::arbiter::ArbiterStats)> = run
        .arbiters
        .started()
        .map(|(id, m)| (id, m.stats()))
        .collect();
    let gpu = crate::fleet::sum_stats(per_gpu.iter().map(|(_, s)| s)).unwrap_or_default();
    drop(run);
    ServeReport {
        vgpus,
        gpu,
        gpus: per_gpu,
        vms,
    }
}

fn wait_readable(fd: &vmm_sys_util::eventfd::EventFd) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, -1) };
        if n > 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if n < 0 && e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A devices file is read with the fleet file's size bound: `/dev/zero`
    /// is an error naming the file, not a host out of memory.
    #[test]
    fn a_runaway_devices_file_is_an_error() {
        let e = DevicesConfig::load(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/dev/zero: cannot read: larger than 16777216 bytes"
        );
    }

    #[test]
    fn a_devices_file_is_checked_like_a_fleet_file() {
        let p = Path::new("/etc/hqdmux/devices.toml");
        let c = DevicesConfig::parse(
            "[[vgpu]]\nname = \"hi\"\nsocket = \"hi.sock\"\npriority = 12\nquantum_ms = 5\n\
             [[vgpu]]\nname = \"lo\"\nsocket = \"/run/lo.sock\"\nweight = 3\nguard = { max_resets = 5 }\n",
            p,
        )
        .unwrap();
        assert_eq!(c.vgpu.len(), 2);
        assert_eq!(c.vgpu[0].socket, Path::new("/etc/hqdmux/hi.sock"));
        assert_eq!(c.vgpu[1].socket, Path::new("/run/lo.sock"));
        let s = c.vgpu[0].spec(&c.gpu.guard);
        assert_eq!(s.params.priority, 12);
        assert_eq!(s.quantum, Some(Duration::from_millis(5)));
        assert_eq!(
            s.preempt_timeout,
            Duration::from_millis(mdev::arbiter::DEFAULT_PREEMPT_TIMEOUT_MS)
        );
        assert_eq!(c.vgpu[1].spec(&c.gpu.guard).params.weight, 3);
        assert_eq!(c.vgpu[1].guard.max_resets, Some(5));
        for (text, field) in [
            ("[[vgpu]]\nname='a'\nsocket='s'\npriority=16", "priority"),
            ("[[vgpu]]\nname='a'\nsocket='s'\nweight=0", "weight"),
            ("[[vgpu]]\nname='a'\nsocket='s'\nquantum_ms=0", "quantum_ms"),
            (
                "[[vgpu]]\nname='a'\nsocket='s'\npreempt_timeout_ms=0",
                "preempt_timeout_ms",
            ),
            (
                "[[vgpu]]\nname='a'\nsocket='s'\n[[vgpu]]\nname='a'\nsocket='t'",
                "name",
            ),
            (
                "[[vgpu]]\nname='a'\nsocket='s'\n[[vgpu]]\nname='b'\nsocket='s'",
                "socket",
            ),
            ("[[vgpu]]\nname='a'\nsocket='s'\npartition=9", "partition"),
            // Names as a fleet VM's: no '/', no control character, no
            // quote, at most 64 bytes, not empty.
            ("[[vgpu]]\nname='a/b'\nsocket='s'", "name"),
            ("[[vgpu]]\nname=\"a\\nb\"\nsocket='s'", "name"),
            ("[[vgpu]]\nname='a\"b'\nsocket='s'", "name"),
            ("[[vgpu]]\nname=''\nsocket='s'", "name"),
            ("[[vgpu]]\nname='.'\nsocket='s'", "name"),
            ("[[vgpu]]\nname='..'\nsocket='s'", "name"),
            ("[[vgpu]]\nname='.hidden'\nsocket='s'", "name"),
            ("[[vgpu]]\nname='-v'\nsocket='s'", "name"),
        ] {
            match DevicesConfig::parse(text, p) {
                Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        // The error names the file, the entry, the field and the reason.
        let e = DevicesConfig::parse("[[vgpu]]\nname='..'\nsocket='s'", p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("devices.toml") && e.contains("name") && e.contains("'..' must begin"),
            "{e}"
        );
        let long = format!("[[vgpu]]\nname='{}'\nsocket='s'", "a".repeat(65));
        assert!(matches!(
            DevicesConfig::parse(&long, p),
            Err(ConfigError::Invalid { field, .. }) if field == "name"
        ));
        let ok = format!("[[vgpu]]\nname='{}'\nsocket='s'", "a".repeat(64));
        assert!(DevicesConfig::parse(&ok, p).is_ok());
        assert!(matches!(
            DevicesConfig::parse("[[vgpu]]\nname='a'\nsocket='s'\nimage='x'", p),
            Err(ConfigError::Parse { .. })
        ));
        assert!(matches!(
            DevicesConfig::parse("", p),
            Err(ConfigError::Invalid { .. })
        ));
    }

    /// A refused `[[vgpu]]` name is reported as a vGPU's (not a VM's), on
    /// one line whatever it holds, naming file, entry, field and reason.
    #[test]
    fn a_bad_vgpu_name_is_one_line_naming_file_vgpu_field_and_reason() {
        let p = Path::new("/etc/hqdmux/devices.toml");
        let long = "a".repeat(300);
        for (toml_name, shown, why) in [
            ("a\\nb", "a\\nb", "use only letters"),
            ("a\\u0000b", "a\\0b", "use only letters"),
            ("a/b", "a/b", "use only letters"),
            ("\u{e9}", "\u{e9}", "use only letters"),
            ("..", "..", "must begin with a letter or a digit"),
            (long.as_str(), long.as_str(), "must be 1..=64 bytes"),
        ] {
            let e = DevicesConfig::parse(
                &format!("[gpu]\n[[vgpu]]\nname = \"{toml_name}\"\nsocket = \"x.sock\"\n"),
                p,
            )
            .unwrap_err()
            .to_string();
            assert!(!e.contains('\n') && !e.contains('\0'), "{e:?}");
            let head =
                format!("/etc/hqdmux/devices.toml: vgpu '{shown}' (vgpu[0]): field `name`: ");
            assert!(e.starts_with(&head) && e.contains(why), "{e:?}");
        }
    }

    /// `[[vm]]` entries of a devices file are read and checked as a fleet
    /// file's, by the same reader: the same error, naming file, `vm[i]`
    /// and field; `gpu = true` VMs are placed on the file's GPUs.
    #[test]
    fn vm_entries_are_checked_and_placed_as_a_fleet_files() {
        let p = Path::new("/etc/hqdmux/devices.toml");
        let gpus = "[[gpu]]\nid = 0\n[[gpu]]\nid = 4\n";
        let vgpu = "[[vgpu]]\nname = \"a\"\nsocket = \"a.sock\"\n";
        let c = DevicesConfig::parse(
            &format!(
                "{gpus}{vgpu}[[vm]]\nname = \"v\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\ngpu_id = 4\n\
                 [[vm]]\nname = \"w\"\nimage = \"builtin:hello\"\n"
            ),
            p,
        )
        .unwrap();
        assert_eq!(c.vgpu.len(), 1);
        assert_eq!(c.vm.len(), 2);
        assert_eq!((c.vm[0].gpu, c.vm[0].gpu_id), (true, Some(4)));
        assert!(!c.vm[1].gpu);
        // Relative image paths resolve against the file's directory.
        assert_eq!(c.base_dir, Path::new("/etc/hqdmux"));
        // A VM alone is a valid devices file (no vGPU served).
        let only =
            DevicesConfig::parse("[[vm]]\nname = \"v\"\nimage = \"builtin:hello\"\n", p).unwrap();
        assert!(only.vgpu.is_empty() && only.vm.len() == 1);
        for (entry, field) in [
            ("vcpus = \"x\"", "vcpus"),
            ("priority = 99", "priority"),
            ("gpu = true\ngpu_id = 1", "gpu_id"),
            ("bogus = 1", "bogus"),
        ] {
            let vm = format!(
                "[[vm]]\nname = \"v\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\n{entry}\n"
            );
            let served = DevicesConfig::parse(&format!("{gpus}{vgpu}{vm}"), p)
                .unwrap_err()
                .to_string();
            let fleet = FleetConfig::parse(&format!("{gpus}{vm}"), p)
                .unwrap_err()
                .to_string();
            assert_eq!(served, fleet, "{entry}");
            assert!(
                served.starts_with("/etc/hqdmux/devices.toml: vm 'v' (vm[0]): field `")
                    && served.contains(field),
                "{served}"
            );
        }
        // Names are unique across vGPUs and VMs (one API, one metrics
        // label space).
        let e = DevicesConfig::parse(
            &format!("{vgpu}[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\n"),
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("vgpu 'a' (vgpu[0]): field `name`: a [[vm]] entry has this name"),
            "{e}"
        );
        // No run timeout in a daemon.
        assert!(matches!(
            DevicesConfig::parse("[run]\ntimeout_ms = 5\n", p),
            Err(ConfigError::Parse { .. })
        ));
        assert!(DevicesConfig::parse("[gpu]\n", p)
            .unwrap_err()
            .to_string()
            .contains("no [[vgpu]] or [[vm]] entry"));
    }

    #[test]
    fn vgpus_name_their_gpu_among_the_gpu_entries() {
        let p = Path::new("/etc/hqdmux/devices.toml");
        let gpus = "[[gpu]]\nid = 0\n[[gpu]]\nid = 4\npartition_mode = \"CPX\"\n";
        let c = DevicesConfig::parse(
            &format!(
                "{gpus}[[vgpu]]\nname = \"a\"\nsocket = \"a.sock\"\n\
                 [[vgpu]]\nname = \"b\"\nsocket = \"b.sock\"\ngpu_id = 4\npartition = 7\n"
            ),
            p,
        )
        .unwrap();
        assert_eq!(c.gpus.len(), 2);
        assert_eq!((c.vgpu[0].gpu_id, c.vgpu[1].gpu_id), (0, 4));
        // The partition is checked against the vGPU's own GPU.
        let e = DevicesConfig::parse(
            &format!("{gpus}[[vgpu]]\nname = \"a\"\nsocket = \"a.sock\"\npartition = 7\n"),
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("field `partition`: 7 is out of range 0..=0"),
            "{e}"
        );
        let e = DevicesConfig::parse(
            &format!("{gpus}[[vgpu]]\nname = \"a\"\nsocket = \"a.sock\"\ngpu_id = 1\n"),
            p,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "/etc/hqdmux/devices.toml: vgpu 'a' (vgpu[0]): field `gpu_id`: no GPU with id 1 \
             (this file's GPUs: 0, 4)"
        );
        // Duplicate GPU ids are refused as in a fleet file.
        let e = DevicesConfig::parse(
            "[[gpu]]\n[[gpu]]\n[[vgpu]]\nname = \"a\"\nsocket = \"a.sock\"\n",
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("gpu[1] (id 0): field `id`: duplicate id 0"),
            "{e}"
        );
    }
}
