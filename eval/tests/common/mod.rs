//! Helpers shared by the evaluation tests.

// Each test binary uses its own subset of these.
#![allow(dead_code)]

use eval::promises::{check_all, CheckOptions, Outcome};
use scheduler::Policy;

/// Runs the promise checker under the hqdmux policy, seeds 1-3 (issue
/// 22: not tuned to one input), on the targets whose name contains
/// `filter`.
pub fn check_hqdmux_seeds(filter: &str) -> Vec<Outcome> {
    check_all(&CheckOptions {
        seeds: vec![1, 2, 3],
        policy: Policy::Hqdmux,
        filter: Some(filter.into()),
        exactly_once_ms: None,
    })
    .unwrap()
}

/// Asserts that target `o` passed, naming its figures and its target.
pub fn assert_passed(o: &Outcome) {
    assert!(o.pass, "{}: {:?} [{}]", o.name, o.measured, o.target);
}
