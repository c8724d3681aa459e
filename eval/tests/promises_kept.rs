//! The promises of docs/scheduling.md that the hqdmux policy keeps today,
//! asserted through the promise checker (`eval::promises`, seeds 1-3), so a
//! change that breaks one fails here. The ones not yet kept are listed in
//! docs/scheduling.md ("Measured against the promise") and reported by
//! `cargo run --release -p hqdmux-eval --example promises`.

mod common;

use common::{assert_passed, check_hqdmux_seeds};

/// Runs the checker on the targets whose name contains `filter` and
/// asserts that every one named in `kept` passed (and that it ran).
fn assert_kept(filter: &str, kept: &[&str]) {
    let out = check_hqdmux_seeds(filter);
    for name in kept {
        let o = out
            .iter()
            .find(|o| o.name.starts_with(name))
            .unwrap_or_else(|| panic!("{name} not checked: {out:?}"));
        assert_passed(o);
    }
}

#[test]
fn equal_priority_shares_do_not_depend_on_queue_count_depth_or_job_size() {
    assert_kept(
        "equal",
        &[
            "equal-queues:",
            "equal-depth:",
            "equal-jobsize:",
            "weights124:",
            "undershare: saturating VMs equal",
        ],
    );
}

#[test]
fn a_closed_loop_top_vm_keeps_its_alone_share_beside_lower_vms() {
    assert_kept(
        "prio-inv",
        &[
            "prio-inv/under=1:",
            "prio-inv/under=4:",
            "prio-inv/under=15:",
            "prio-inv-long/under=1:",
            "prio-inv-long/under=4:",
            "prio-inv-rev/under=1:",
            "prio-inv-rev/under=4:",
        ],
    );
}

#[test]
fn a_vm_below_its_share_keeps_its_latency_beside_saturating_equals() {
    assert_kept(
        "undershare",
        &[
            "undershare: light p99",
            "undershare: saturating VMs equal",
            "undershare: light served in full",
        ],
    );
}

#[test]
fn every_starved_vm_completes_a_job_within_the_aging_bound() {
    assert_kept(
        "every",
        &["ladder16: every VM served", "aging: every job served"],
    );
}

#[test]
fn latency_targets_kept_on_the_built_ins_and_the_rt_tenant() {
    assert_kept("disb-d", &["disb-d: hi p99", "disb-d: lo retained"]);
    assert_kept("rt5k: rt p99", &["rt5k: rt p99"]);
}

#[test]
fn periodic_rt_tenants_keep_latency_best_effort_and_cwsr_targets() {
    // Issue 9 with occupancy: every target of rt5k, rt200 and their
    // variants (other best-effort shapes, RT rates and widths).
    let mut kept = Vec::new();
    for n in ["rt5k", "rt200"]
        .into_iter()
        .chain(eval::promises::RT_VARIANTS.iter().copied())
    {
        for t in ["rt p99", "CWSR time"] {
            kept.push(format!("{n}: {t}"));
        }
    }
    kept.push("rt5k: lo retained".into());
    kept.push("rt200: lo retained".into());
    for n in eval::promises::RT_VARIANTS {
        kept.push(format!("{n}: be CU time vs alone"));
    }
    let names: Vec<&str> = kept.iter().map(|s| s.as_str()).collect();
    assert_kept("rt", &names);
}
