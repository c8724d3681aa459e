//! libFuzzer target `scenario`: see the harness `eval/tests/fuzz/scenario.rs` (shared with the
//! corpus replay test) and docs/fuzzing.md.
#![no_main]

#[path = "../../eval/tests/fuzz/scenario.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run(data));
