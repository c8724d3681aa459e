//! libFuzzer target `api_request`: see the harness `vmm/tests/fuzz/api_request.rs` (shared with the
//! corpus replay test) and docs/fuzzing.md.
#![no_main]

#[path = "../../vmm/tests/fuzz/api_request.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run(data));
