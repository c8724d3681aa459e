//! Helpers for the end-to-end tests: KVM gating and fleet runs from TOML text.

use std::path::{Path, PathBuf};

use vmm::config::FleetConfig;
use vmm::fleet::{run_fleet, FleetReport, RunOptions};

/// True when the test may use KVM; see [`vmm::kvm_or_skip`] (loud SKIPPED
/// without `/dev/kvm`, a failure instead under `HQDMUX_REQUIRE_KVM=1`).
pub fn kvm_or_skip(test: &str) -> bool {
    vmm::kvm_or_skip(test)
}

/// A scratch directory unique to this test.
pub fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hqdmux-test-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Parses `toml` as if it were `dir/fleet.toml`.
pub fn config(dir: &Path, toml: &str) -> FleetConfig {
    FleetConfig::parse(toml, &dir.join("fleet.toml")).expect("valid test config")
}

/// Runs a fleet quietly (consoles captured in the report, not echoed).
pub fn run(cfg: &FleetConfig) -> FleetReport {
    run_fleet(cfg, RunOptions::default()).expect("fleet launches")
}

/// A `[[vm]]` entry.
pub fn vm(name: &str, image: &str, args: &str) -> String {
    format!("[[vm]]\nname = \"{name}\"\nimage = \"{image}\"\nmemory_mib = 8\nargs = \"{args}\"\n")
}

/// Host time of the last checkpoint `code` the VM wrote (e.g. 3 = its last
/// GPU job completed); panics if it never wrote one.
pub fn last_checkpoint(vm: &vmm::vm::VmReport, code: u32) -> std::time::Instant {
    vm.checkpoints
        .iter()
        .rev()
        .find(|c| c.0 == code)
        .unwrap_or_else(|| panic!("vm '{}' never wrote checkpoint {code}", vm.name))
        .1
}

/// Host log lines of a test binary, captured (tests run in parallel in one
/// process: filter by VM name).
pub mod logs {
    use std::sync::Mutex;

    static LINES: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

    struct Capture;

    impl log::Log for Capture {
        fn enabled(&self, m: &log::Metadata) -> bool {
            m.level() <= log::Level::Info
        }
        fn log(&self, r: &log::Record) {
            if self.enabled(r.metadata()) {
                let line = r.args().to_string();
                lock().push((r.level(), line));
            }
        }
        fn flush(&self) {}
    }

    fn lock() -> std::sync::MutexGuard<'static, Vec<(log::Level, String)>> {
        LINES.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Installs the capturing logger (`Info` and above; once per process).
    pub fn capture() {
        static CAPTURE: Capture = Capture;
        if log::set_logger(&CAPTURE).is_ok() {
            log::set_max_level(log::LevelFilter::Info);
        }
    }

    /// Captured messages at `level` or more severe, in order.
    pub fn at_least(level: log::Level) -> Vec<String> {
        lock()
            .iter()
            .filter(|(l, _)| *l <= level)
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Captured messages (any captured level) that contain `needle`.
    pub fn containing(needle: &str) -> Vec<String> {
        lock()
            .iter()
            .filter(|(_, m)| m.contains(needle))
            .map(|(_, m)| m.clone())
            .collect()
    }
}

/// A fleet running in a background thread with its operator API, for tests
/// that must order events between VMs by what the host saw (a VM's queue on
/// the GPU) instead of by how long guests take: every wait is on a state
/// the API reports, with a deadline only as a hang guard.
pub struct LiveFleet {
    /// The API socket.
    pub sock: PathBuf,
    fleet: std::thread::JoinHandle<FleetReport>,
}

impl LiveFleet {
    /// Launches `toml` (parsed as `dir/fleet.toml`) with its API on a
    /// socket of its own in `dir` and waits for the socket.
    pub fn start(dir: &Path, toml: &str) -> LiveFleet {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let sock = dir.join(format!("live-fleet-{n}.sock"));
        assert!(!sock.exists(), "{} is taken", sock.display());
        let cfg = config(dir, toml);
        let opts = RunOptions {
            api_socket: Some(sock.clone()),
            ..Default::default()
        };
        let fleet = std::thread::spawn(move || run_fleet(&cfg, opts).expect("fleet launches"));
        let t0 = std::time::Instant::now();
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(t0.elapsed().as_secs() < 120, "no API socket");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        LiveFleet { sock, fleet }
    }

    /// One API request; panics unless it answers `want`.
    pub fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
        want: u16,
    ) -> serde_json::Value {
        let (st, v) =
            vmm::api::request(&self.sock, method, path, body.as_ref()).expect("API request");
        assert_eq!(st, want, "{method} {path}: {v}");
        v
    }

    /// Polls VM `name`'s view until `cond` holds (hang guard: 300 s).
    pub fn wait_vm(
        &self,
        name: &str,
        what: &str,
        cond: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let t0 = std::time::Instant::now();
        loop {
            let v = self.api("GET", &format!("/api/v1/vms/{name}"), None, 200);
            if cond(&v) {
                return v;
            }
            assert!(t0.elapsed().as_secs() < 300, "{name}: {what}: {v}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Waits until VM `name` has a queue mapped on the GPU.
    pub fn wait_on_gpu(&self, name: &str) {
        self.wait_vm(name, "never reached the GPU", |v| {
            v["maps"].as_u64().is_some_and(|m| m > 0)
        });
    }

    /// Waits until VM `name` has ended; returns its view.
    pub fn wait_ended(&self, name: &str) -> serde_json::Value {
        self.wait_vm(name, "never ended", |v| !v["outcome"].is_null())
    }

    /// Adds a VM from a JSON `[[vm]]` entry (`POST /api/v1/vms`).
    pub fn add(&self, entry: serde_json::Value) {
        self.api("POST", "/api/v1/vms", Some(entry), 201);
    }

    /// Stops VM `name` as an operator would (not a failure).
    pub fn stop(&self, name: &str) {
        self.api("POST", &format!("/api/v1/vms/{name}/stop"), None, 200);
    }

    /// Waits for the fleet to end (every VM ended or stopped).
    pub fn join(self) -> FleetReport {
        self.fleet.join().expect("fleet thread")
    }
}
