//! Replays the committed fuzz corpus of the `scenario` target
//! (`fuzz/corpus/scenario/`) through the harness the libFuzzer target runs
//! (docs/fuzzing.md).
//!
//! `HQDMUX_WRITE_FUZZ_SEEDS=1 cargo test -p hqdmux-eval --test fuzz_corpus -- --ignored`
//! rewrites the generated seed files.

#[path = "fuzz/scenario.rs"]
mod scenario;

use std::path::PathBuf;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

#[test]
fn scenario_corpus() {
    let dir = corpus_dir("scenario");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let f = e.unwrap().path();
        let data = std::fs::read(&f).unwrap();
        let r = std::panic::catch_unwind(|| scenario::run(&data));
        assert!(r.is_ok(), "scenario: {} panicked", f.display());
        n += 1;
    }
    assert!(n > 0, "scenario: empty corpus");
}

#[test]
#[ignore = "writes fuzz/corpus seed files; run with HQDMUX_WRITE_FUZZ_SEEDS=1"]
fn write_seeds() {
    if std::env::var_os("HQDMUX_WRITE_FUZZ_SEEDS").is_none() {
        return;
    }
    let dir = corpus_dir("scenario");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in scenario::seeds() {
        std::fs::write(dir.join(format!("seed-{name}")), data).unwrap();
    }
}
