//! Helpers for the end-to-end tests: KVM gating and fleet runs from TOML text.

use std::path::{Path, PathBuf};

use vmm::config::FleetConfig;
use vmm::fleet::{run_fleet, FleetReport, RunOptions};

/// True when the test may use KVM. Without `/dev/kvm` it prints a loud
/// SKIPPED line and returns false — unless `HQDMUX_REQUIRE_KVM=1`, when a
/// missing KVM fails the test instead.
pub fn kvm_or_skip(test: &str) -> bool {
    if vmm::kvm_available() {
        return true;
    }
    if std::env::var("HQDMUX_REQUIRE_KVM").as_deref() == Ok("1") {
        panic!("{test}: HQDMUX_REQUIRE_KVM=1 but /dev/kvm cannot be opened");
    }
    eprintln!("!!! SKIPPED {test}: /dev/kvm is not available; this KVM test did not run !!!");
    false
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
    run_fleet(
        cfg,
        RunOptions {
            echo: false,
            api_socket: None,
        },
    )
    .expect("fleet launches")
}

/// A `[[vm]]` entry.
pub fn vm(name: &str, image: &str, args: &str) -> String {
    format!("[[vm]]\nname = \"{name}\"\nimage = \"{image}\"\nmemory_mib = 8\nargs = \"{args}\"\n")
}
