//! Promise checker (issue 9): runs the built-in promise scenarios and the
//! older built-ins' targets, prints one line per target and the per-VM
//! table of every failing run.
//!
//! `cargo run --release -p hqdmux-eval --example promises [-- --seeds 1,2,3]
//! [--policy hqdmux] [--only NAME-PART] [--exactly-once-ms 500|0]`
//!
//! Exit status 1 when a target is missed.

use eval::promises::{check_all, CheckOptions};
use eval::report::per_vm_table;
use scheduler::Policy;
use std::process::ExitCode;

fn usage(e: &str) -> ExitCode {
    eprintln!(
        "promises: {e}\nusage: promises [--seeds 1,2,3] [--policy NAME] [--only NAME-PART] \
         [--exactly-once-ms MS (0: skip)]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut opts = CheckOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let Some(v) = args.next() else {
            return usage(&format!("{a} needs a value"));
        };
        match a.as_str() {
            "--seeds" => match v.split(',').map(|s| s.trim().parse()).collect() {
                Ok(s) => opts.seeds = s,
                Err(_) => return usage(&format!("--seeds: '{v}' is not a list of numbers")),
            },
            "--policy" => match Policy::from_name(&v) {
                Some(p) => opts.policy = p,
                None => return usage(&format!("--policy: unknown policy '{v}'")),
            },
            "--only" => opts.filter = Some(v),
            "--exactly-once-ms" => match v.parse::<u64>() {
                Ok(0) => opts.exactly_once_ms = None,
                Ok(ms) => opts.exactly_once_ms = Some(ms),
                Err(_) => return usage(&format!("--exactly-once-ms: '{v}' is not a number")),
            },
            _ => return usage(&format!("unknown argument '{a}'")),
        }
    }
    let t0 = std::time::Instant::now();
    let outcomes = match check_all(&opts) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("promises: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "policy {}, seeds {:?} (figures per seed)\n",
        opts.policy.name(),
        opts.seeds
    );
    for o in &outcomes {
        println!(
            "{:<38} {:<4} {}  [target {}]",
            o.name,
            if o.pass { "PASS" } else { "FAIL" },
            o.measured.join(" | "),
            o.target
        );
    }
    let failed: Vec<_> = outcomes.iter().filter(|o| !o.pass).collect();
    let mut shown = std::collections::HashSet::new();
    for o in &failed {
        for r in &o.failures {
            if shown.insert((r.scenario.clone(), r.seed)) {
                print!("{}", per_vm_table(std::slice::from_ref(r)));
            }
        }
    }
    println!(
        "\n{} of {} targets met ({:.0} s host time)",
        outcomes.len() - failed.len(),
        outcomes.len(),
        t0.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
