//! libFuzzer target `vgpu_regs`: see the harness `mdev/tests/fuzz/vgpu_regs.rs` (shared with the
//! corpus replay test) and docs/fuzzing.md.
#![no_main]

#[path = "../../mdev/tests/fuzz/vgpu_regs.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run(data));
