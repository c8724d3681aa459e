//! libFuzzer target `fleet_config`: see the harness `vmm/tests/fuzz/fleet_config.rs` (shared with the
//! corpus replay test) and docs/fuzzing.md.
#![no_main]

#[path = "../../vmm/tests/fuzz/fleet_config.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run(data));
