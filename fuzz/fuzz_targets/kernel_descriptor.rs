//! libFuzzer target `kernel_descriptor`: see the harness `mdev/tests/fuzz/gpu_queue.rs` (shared with the
//! corpus replay test) and docs/fuzzing.md.
#![no_main]

#[path = "../../mdev/tests/fuzz/gpu_queue.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run_kernel_descriptor(data));
