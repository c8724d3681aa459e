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
