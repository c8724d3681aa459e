//! A short run of the promise fuzzer (issue 18, `eval::fuzz`) in the test
//! suite: a fixed set of generated scenarios — the first seeds, from 1,
//! whose scenarios fall in none of the classes the scheduler is known to
//! fail today (`eval::fuzz::KNOWN_FAILING`; the classes are a function of
//! the generated scenario, not of a run) — must keep every promise item
//! that applies to their shape, exactly-once and the decision-cost bound
//! (virtual: decisions per virtual ms; no host timing). The known-failing
//! classes have their own `#[ignore]` test until the scheduler work of
//! issue 18 lands. Long runs: `cargo run --release -p hqdmux-eval
//! --example promise_fuzz -- --count 10000 --seed S` (docs/benchmarks.md).

use eval::fuzz::{
    check, classes, generate, shrink, to_toml, Family, FuzzOptions, Generated, KNOWN_FAILING,
};
use eval::scenario::Scenario;

/// Scenarios of one check at most this many VM x virtual ms (keeps the
/// run near a minute on 2 cores; a property of the scenario, not of time).
const MAX_VM_MS: u64 = 6_000;

/// Per family, the first `n` seeds from 1 whose scenarios (of that
/// family) satisfy `keep` and cost at most [`MAX_VM_MS`].
fn seeds(n: usize, keep: impl Fn(&[&str]) -> bool) -> Vec<Generated> {
    Family::ALL
        .iter()
        .flat_map(|&f| {
            (1..5000u64)
                .map(move |s| generate(s, Some(f)))
                .filter(|g| {
                    keep(&classes(g))
                        && u64::from(g.scenario.vm_count()) * g.scenario.duration_ms <= MAX_VM_MS
                })
                .take(n)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn known(c: &[&str]) -> bool {
    c.iter().any(|c| KNOWN_FAILING.contains(c))
}

fn assert_kept(gs: &[Generated]) {
    let opts = FuzzOptions::default();
    let mut bad = Vec::new();
    for g in gs {
        let v = check(g, &opts).unwrap_or_else(|e| panic!("seed {}: {e}", g.seed));
        eprintln!(
            "seed {} {} {:?}: {} violations",
            g.seed,
            g.family.name(),
            v.classes,
            v.violations.len()
        );
        if !v.violations.is_empty() {
            bad.push(format!(
                "seed {} ({}, classes {:?}): {:?}\n{}",
                g.seed,
                g.family.name(),
                v.classes,
                v.violations,
                to_toml(&g.scenario)
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn fuzzed_scenarios_outside_the_known_failing_classes_keep_every_promise() {
    let gs = seeds(3, |c| !known(c));
    // Every family has scenarios outside the known-failing classes.
    assert_eq!(gs.len(), 3 * Family::ALL.len());
    assert_kept(&gs);
}

#[test]
#[ignore = "classes issue 18 lists as failing today (think times, co-residence, no_save_point, \
            latency edges, many VMs, aging, weights, wide RT, strict order of unlike shapes): \
            fixed by the scheduler work on branch `sched`; run with --ignored"]
fn fuzzed_scenarios_in_the_known_failing_classes_keep_every_promise() {
    assert_kept(&seeds(3, known));
}

/// Regressions of `eval/scenarios/fuzz-regress/` that pass now and are
/// cheap enough for the test suite (the others that pass, `fuzz-1036`,
/// `fuzz-20015` and `fuzz-20081`, take minutes in a debug build; the
/// ignored test below runs every file).
const FIXED_REGRESSIONS: &[&str] = &[
    "fuzz-1081-2-weights.toml",
    "fuzz-20011-3-undershare-latency.toml",
    "fuzz-20121-1-top-share.toml",
];

#[test]
fn fixed_fuzz_regressions_keep_every_promise() {
    check_regressions(|f| FIXED_REGRESSIONS.contains(&f));
}

#[test]
#[ignore = "issue 18's shrunk regressions (eval/scenarios/fuzz-regress/) fail today; run with --ignored"]
fn fuzz_regression_scenarios_keep_every_promise() {
    check_regressions(|_| true);
}

fn check_regressions(keep: impl Fn(&str) -> bool) {
    // Each file's first line names its family: "# promise fuzzer seed S
    // (family F), shrunk: breaks `ITEM`"; without one, exactly-once and
    // the decision-cost bound are checked.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/fuzz-regress");
    let mut bad = Vec::new();
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let f = e.unwrap().path();
        if f.extension().is_none_or(|x| x != "toml")
            || !f.file_name().and_then(|n| n.to_str()).is_some_and(&keep)
        {
            continue;
        }
        n += 1;
        let text = std::fs::read_to_string(&f).unwrap();
        let sc = Scenario::load(&f).unwrap_or_else(|e| panic!("{e}"));
        let family = text.lines().next().and_then(|l| {
            Family::ALL
                .into_iter()
                .find(|fam| l.contains(&format!("(family {})", fam.name())))
        });
        match family {
            Some(family) => {
                let g = Generated {
                    seed: sc.seed,
                    family,
                    scenario: sc,
                };
                let v = check(&g, &FuzzOptions::default()).unwrap();
                if !v.violations.is_empty() {
                    bad.push(format!("{}: {:?}", f.display(), v.violations));
                }
            }
            None => {
                let r = eval::driver::simulate(&sc, scheduler::Policy::Hqdmux, sc.seed).unwrap();
                let dpm = eval::driver::per_virtual_ms(r.decision_ns.len() as f64, r.duration_ns);
                if !eval::promises::exactly_once(&r)
                    || dpm > eval::fuzz::MAX_DECISIONS_PER_VIRTUAL_MS
                {
                    bad.push(format!(
                        "{}: exactly-once or {dpm:.0} decisions/ms",
                        f.display()
                    ));
                }
            }
        }
    }
    assert!(n > 0, "no regression file selected");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn fuzz_regression_files_are_valid_scenarios() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/fuzz-regress");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let f = e.unwrap().path();
        if f.extension().is_some_and(|x| x == "toml") {
            Scenario::load(&f).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n > 0);
}

#[test]
fn a_failing_scenario_shrinks_to_a_file_that_still_fails() {
    // A regression the fuzzer found (RT latency above 1.1 x isolated +
    // one save and restore); once the mechanism work fixes it there is
    // nothing to shrink and the test says so by returning.
    let f = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios/fuzz-regress/fuzz-20023-3-rt-latency.toml");
    let sc = Scenario::load(&f).unwrap();
    let g = Generated {
        seed: sc.seed,
        family: Family::Rt,
        scenario: sc,
    };
    let opts = FuzzOptions::default();
    let item = "3-rt-latency";
    if !check(&g, &opts)
        .unwrap()
        .violations
        .iter()
        .any(|x| x.item == item)
    {
        eprintln!("{item} holds now: nothing to shrink");
        return;
    }
    let (small, sv) = shrink(&g, item, &opts, 8).unwrap();
    eprintln!("shrunk:\n{}", to_toml(&small.scenario));
    assert!(sv.violations.iter().any(|x| x.item == item));
    assert!(small.scenario.duration_ms <= g.scenario.duration_ms);
    assert!(small.scenario.vm_count() <= g.scenario.vm_count());
    assert_eq!(small.scenario.name, format!("fuzz-{}-{item}", g.seed));
    let file = to_toml(&small.scenario);
    let back = Scenario::parse(&file, "shrunk.toml").unwrap();
    assert_eq!(to_toml(&back), file);
}
