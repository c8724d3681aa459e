//! libFuzzer target `mqd_admission`: see the harness `mdev/tests/fuzz/mqd_admission.rs` (shared with the
//! corpus replay test) and docs/fuzzing.md.
#![no_main]

#[path = "../../mdev/tests/fuzz/mqd_admission.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run(data));
