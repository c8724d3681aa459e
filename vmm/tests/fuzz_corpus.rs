//! Replays the committed fuzz corpora of the operator-facing targets
//! (`fuzz/corpus/{fleet_config,api_request}/`) through the harnesses the
//! libFuzzer targets run (docs/fuzzing.md).
//!
//! `HQDMUX_WRITE_FUZZ_SEEDS=1 cargo test -p hqdmux --test fuzz_corpus -- --ignored`
//! rewrites the generated seed files.

#[path = "fuzz/api_request.rs"]
mod api_request;
#[path = "fuzz/fleet_config.rs"]
mod fleet_config;

use std::path::PathBuf;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

fn replay(target: &str, run: fn(&[u8])) {
    let dir = corpus_dir(target);
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let f = e.unwrap().path();
        let data = std::fs::read(&f).unwrap();
        let r = std::panic::catch_unwind(|| run(&data));
        assert!(r.is_ok(), "{target}: {} panicked", f.display());
        n += 1;
    }
    assert!(n > 0, "{target}: empty corpus");
}

#[test]
fn fleet_config_corpus() {
    replay("fleet_config", fleet_config::run);
}

#[test]
fn api_request_corpus() {
    replay("api_request", api_request::run);
}

/// The example fleets in the corpus are accepted (so it reaches validation's
/// deep paths, not only the TOML parser).
#[test]
fn example_seeds_are_accepted() {
    for (name, text) in fleet_config::seeds() {
        if name.starts_with("example-") {
            let text = String::from_utf8(text).unwrap();
            vmm::config::FleetConfig::parse(&text, std::path::Path::new("/x/fleet.toml"))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

#[test]
#[ignore = "writes fuzz/corpus seed files; run with HQDMUX_WRITE_FUZZ_SEEDS=1"]
fn write_seeds() {
    if std::env::var_os("HQDMUX_WRITE_FUZZ_SEEDS").is_none() {
        return;
    }
    for (target, seeds) in [
        ("fleet_config", fleet_config::seeds()),
        ("api_request", api_request::seeds()),
    ] {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, data) in seeds {
            std::fs::write(dir.join(format!("seed-{name}")), data).unwrap();
        }
    }
}
