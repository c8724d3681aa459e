//! The promise fuzzer's exactly-once regressions of the simulator (issue
//! 18): saves the simulator wrote and then refused to restore ("control
//! stack larger than the largest record", "record counts out of range",
//! "malformed workgroup record"). Each file runs under hqdmux on its own
//! seed and must end with no lost or duplicate effect and no queue error.
//! The causes are pinned by deterministic tests in `gpusim`
//! (`sim::occupancy_tests`); these whole runs take minutes in a debug
//! build: `cargo test --release -p hqdmux-eval --test sim_exactly_once --
//! --ignored`.

use eval::scenario::Scenario;

#[test]
#[ignore = "minutes per file in a debug build; run with --release -- --ignored"]
fn saves_the_simulator_wrote_restore() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/fuzz-regress");
    let mut bad = Vec::new();
    for name in [
        "fuzz-1117-exactly-once.toml",
        "fuzz-20181-exactly-once.toml",
        "cwsr-record-too-large.toml",
    ] {
        let sc = Scenario::load(&dir.join(name)).unwrap_or_else(|e| panic!("{e}"));
        for sc in sc.expand() {
            let r = eval::driver::simulate(&sc, scheduler::Policy::Hqdmux, sc.seed).unwrap();
            if !eval::promises::exactly_once(&r) {
                bad.push(format!(
                    "{name}: lost {} dup {} errors {} (timeouts {})",
                    r.lost_effects, r.duplicate_effects, r.queue_errors, r.preempt_timeouts
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
