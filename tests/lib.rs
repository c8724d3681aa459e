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
