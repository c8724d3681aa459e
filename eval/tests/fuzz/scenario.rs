//! Fuzz harness `scenario`: hostile TOML text through
//! [`eval::scenario::Scenario::parse`] (parse and validate), then everything
//! the evaluation driver derives from an accepted scenario before it runs it
//! (topology, sweep expansion, counts, class filters). Shared by
//! `fuzz/fuzz_targets/scenario.rs` and `eval/tests/fuzz_corpus.rs`.
#![allow(dead_code)]

use eval::scenario::{Class, Scenario};

/// Runs one input.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(s) = Scenario::parse(text, "fuzz.toml") else {
        return;
    };
    assert!(s.topology().is_ok(), "a validated scenario has a valid GPU");
    for run in s.expand() {
        let _ = (run.vm_count(), run.queue_count());
        for class in [Class::Hi, Class::Lo] {
            let _ = run.only(class).vm_count();
        }
    }
}

/// Seed inputs: every built-in scenario.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    eval::scenario::BUILTIN
        .iter()
        .map(|(n, text)| (format!("builtin-{n}"), text.as_bytes().to_vec()))
        .collect()
}
