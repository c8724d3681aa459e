//! The promise fuzzer (issue 18, `eval::fuzz`): random scenarios over the
//! documented range of every scenario field, each checked against every
//! item of the promise that applies to its shape.
//!
//! `cargo run --release -p hqdmux-eval --example promise_fuzz -- [--seed S]
//! [--count N] [--family top|ladder|equals|light|rt|hostile] [--only FAMILY] [--policy NAME]
//! [--host-bound MS_PER_MS] [--shrink N] [--out DIR] [--quiet] [--dump] [--max-seconds S] [--file FILE] [--jobs N]`
//!
//! `--family NAME` makes every seed generate a scenario of that family;
//! `--only NAME` keeps each seed's own family and runs only the seeds whose
//! family it is (the others are skipped and not counted), so
//! `--seed 97000 --count 300 --only rt` runs exactly the `rt` scenarios of
//! a plain `--seed 97000 --count 300` campaign.
//!
//! `--file FILE --family NAME --count 1` checks (and shrinks) a scenario
//! file as that family instead of generated ones. `--max-seconds S` stops starting new scenarios after S s of wall time
//! (the summary covers the scenarios run). `--dump` prints the scenario files of the seeds without running them.
//! `--jobs N` (default 1) runs N scenarios at once on N threads; the
//! output is printed in seed order, the same as with one job (host CPU
//! figures are per thread; wall figures grow when the jobs share cores).
//!
//! Scenario i uses seed S + i (printed with every failure). Each failing
//! scenario prints its violations; the first `--shrink` (default 3)
//! failures of each promise item are shrunk and printed as scenario files
//! (`hqdmux sim --scenario-file FILE` runs them), written to `--out DIR`
//! when given. The summary gives violations by promise item and by class,
//! host time and the highest host ms per virtual ms. Exit status 1 when a
//! scenario outside the known-failing classes (`eval::fuzz::KNOWN_FAILING`)
//! broke an item.

use eval::fuzz::{
    check, generate, shrink, to_toml, Family, FuzzOptions, Generated, Summary, Verdict,
    KNOWN_FAILING,
};
use scheduler::Policy;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

fn usage(e: &str) -> ExitCode {
    eprintln!(
        "promise_fuzz: {e}\nusage: promise_fuzz [--seed S] [--count N] [--family NAME] [--only FAMILY] \
         [--policy NAME] [--host-bound MS] [--shrink N] [--out DIR] [--quiet] [--dump] [--max-seconds S] [--file FILE] [--jobs N]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let (mut seed, mut count) = (1u64, 100u64);
    let mut family = None;
    let mut only = None;
    let mut opts = FuzzOptions {
        host_bound: Some(eval::fuzz::MAX_HOST_MS_PER_VIRTUAL_MS),
        ..Default::default()
    };
    let mut shrink_n = 3usize;
    let mut out_dir: Option<std::path::PathBuf> = None;
    let mut quiet = false;
    let mut dump = false;
    let mut max_s: Option<f64> = None;
    let mut file: Option<std::path::PathBuf> = None;
    let mut jobs = 1u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--quiet" {
            quiet = true;
            continue;
        }
        if a == "--dump" {
            dump = true;
            continue;
        }
        let Some(v) = args.next() else {
            return usage(&format!("{a} needs a value"));
        };
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{a}: '{v}' is not a number"))
        };
        match a.as_str() {
            "--seed" => match num(&v) {
                Ok(n) => seed = n,
                Err(e) => return usage(&e),
            },
            "--count" => match num(&v) {
                Ok(n) => count = n,
                Err(e) => return usage(&e),
            },
            "--jobs" => match num(&v) {
                Ok(n) if n >= 1 => jobs = n,
                Ok(_) => return usage("--jobs: at least 1"),
                Err(e) => return usage(&e),
            },
            "--shrink" => match num(&v) {
                Ok(n) => shrink_n = n as usize,
                Err(e) => return usage(&e),
            },
            "--family" => match Family::ALL.iter().find(|f| f.name() == v) {
                Some(f) => family = Some(*f),
                None => return usage(&format!("--family: unknown family '{v}'")),
            },
            "--only" => match Family::ALL.iter().find(|f| f.name() == v) {
                Some(f) => only = Some(*f),
                None => return usage(&format!("--only: unknown family '{v}'")),
            },
            "--policy" => match Policy::from_name(&v) {
                Some(p) => opts.policy = p,
                None => return usage(&format!("--policy: unknown policy '{v}'")),
            },
            "--host-bound" => match v.parse::<f64>() {
                Ok(0.0) => opts.host_bound = None,
                Ok(b) => opts.host_bound = Some(b),
                Err(_) => return usage(&format!("--host-bound: '{v}' is not a number")),
            },
            "--out" => out_dir = Some(v.into()),
            "--file" => file = Some(v.into()),
            "--max-seconds" => match v.parse::<f64>() {
                Ok(x) => max_s = Some(x),
                Err(_) => return usage(&format!("--max-seconds: '{v}' is not a number")),
            },
            _ => return usage(&format!("unknown argument '{a}'")),
        }
    }
    println!(
        "promise fuzzer: seeds {seed}..{} ({count} scenarios{}), policy {}, known-failing classes {:?}",
        seed + count.saturating_sub(1),
        only.map_or(String::new(), |f| format!(", only family {}", f.name())),
        opts.policy.name(),
        KNOWN_FAILING
    );
    if dump {
        for s in seed..seed.saturating_add(count) {
            let g = generate(s, family);
            if only.is_none_or(|f| f == g.family) {
                print!("{}", to_toml(&g.scenario));
            }
        }
        return ExitCode::SUCCESS;
    }
    let t0 = Instant::now();
    let mut sum = Summary::default();
    let mut shrunk: BTreeMap<&'static str, usize> = BTreeMap::new();
    let scenario = |s: u64| -> Result<Generated, String> {
        match &file {
            // A scenario file, checked (and shrunk) as family `--family`.
            Some(f) => eval::scenario::Scenario::load(f)
                .map(|sc| Generated {
                    seed: sc.seed,
                    family: family.unwrap_or(Family::Top),
                    scenario: sc,
                })
                .map_err(|e| e.to_string()),
            None => Ok(generate(s, family)),
        }
    };
    let end = seed.saturating_add(count);
    let next = AtomicU64::new(seed);
    let stopped = AtomicBool::new(false);
    // Workers take seeds in order; this thread reports them in seed order
    // (and shrinks), so the output is the same whatever `--jobs`.
    let status = std::thread::scope(|sc| {
        // `Ok(None)`: a seed of another family than `--only`, skipped.
        type Outcome = Result<Option<(Generated, Verdict)>, String>;
        let (tx, rx) = mpsc::channel::<(u64, Outcome)>();
        for _ in 0..jobs {
            let tx = tx.clone();
            let (next, stopped, scenario, opts) = (&next, &stopped, &scenario, &opts);
            sc.spawn(move || loop {
                if max_s.is_some_and(|m| t0.elapsed().as_secs_f64() > m) {
                    stopped.store(true, Ordering::Relaxed);
                    return;
                }
                let s = next.fetch_add(1, Ordering::Relaxed);
                if s >= end {
                    return;
                }
                let r = scenario(s).and_then(|g| {
                    if only.is_some_and(|f| f != g.family) {
                        return Ok(None);
                    }
                    check(&g, opts)
                        .map(|v| Some((g, v)))
                        .map_err(|e| format!("seed {s}: {e}"))
                });
                let err = r.is_err();
                if tx.send((s, r)).is_err() || err {
                    return;
                }
            });
        }
        drop(tx);
        let mut ready = BTreeMap::new();
        let mut want = seed;
        for (s, r) in rx {
            ready.insert(s, r);
            while let Some(r) = ready.remove(&want) {
                want += 1;
                let (g, v) = match r {
                    Ok(Some(gv)) => gv,
                    Ok(None) => continue,
                    Err(e) => {
                        eprintln!("{e}");
                        next.store(end, Ordering::Relaxed);
                        return Some(ExitCode::from(2));
                    }
                };
                report(&g, &v, quiet, &mut sum);
                if v.violations.is_empty() {
                    continue;
                }
                // Shrink on a promise item before the host-cost one.
                let item = v
                    .violations
                    .iter()
                    .find(|x| x.item != "cost-host")
                    .unwrap_or(&v.violations[0])
                    .item;
                let n = shrunk.entry(item).or_default();
                if *n >= shrink_n {
                    continue;
                }
                *n += 1;
                shrink_and_print(&g, item, &opts, out_dir.as_deref());
            }
        }
        None
    });
    if let Some(code) = status {
        return code;
    }
    if stopped.load(Ordering::Relaxed) {
        println!(
            "stopped after {:.0} s (--max-seconds)",
            t0.elapsed().as_secs_f64()
        );
    }
    println!(
        "\n{} scenarios, {} failing ({} outside the known-failing classes), {:.0} s host time, {:.1} s virtual",
        sum.scenarios,
        sum.failing,
        sum.failing_unknown,
        t0.elapsed().as_secs_f64(),
        sum.virtual_ms as f64 / 1000.0
    );
    println!("violations by promise item: {:?}", sum.by_item);
    println!("failing scenarios by class (of scenarios in the class):");
    for (c, n) in &sum.per_class {
        println!(
            "  {c:<16} {:>5} / {n}",
            sum.by_class.get(c).copied().unwrap_or(0)
        );
    }
    println!(
        "max host CPU ms per virtual ms {:.3} (seed {}), max host wall ms per virtual ms {:.3} (seed {}), max decisions per virtual ms {:.0} (seed {})",
        sum.max_host_cpu_ms_per_virtual_ms.0,
        sum.max_host_cpu_ms_per_virtual_ms.1,
        sum.max_host_ms_per_virtual_ms.0,
        sum.max_host_ms_per_virtual_ms.1,
        sum.max_decisions_per_virtual_ms.0,
        sum.max_decisions_per_virtual_ms.1
    );
    println!(
        "max host CPU ms per virtual ms of a run the items compare with {:.3} (seed {})",
        sum.max_baseline_host_cpu_ms_per_virtual_ms.0,
        sum.max_baseline_host_cpu_ms_per_virtual_ms.1
    );
    if sum.failing_unknown > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Prints one scenario's verdict and adds it to the summary.
fn report(g: &Generated, v: &Verdict, quiet: bool, sum: &mut Summary) {
    let s = g.seed;
    sum.add(v);
    if !quiet {
        println!(
            "seed {s} {:<8} {} ms virtual, {:.2} host CPU ms/virtual ms ({:.2} wall), {:.0} decisions/virtual ms: {}",
            g.family.name(),
            g.scenario.duration_ms,
            v.host_cpu_ms_per_virtual_ms,
            v.host_ms_per_virtual_ms,
            v.decisions_per_virtual_ms,
            if v.violations.is_empty() { "ok" } else { "FAIL" }
        );
    }
    if v.violations.is_empty() {
        return;
    }
    if quiet {
        println!("seed {s} {} FAIL", g.family.name());
    }
    println!(
        "  classes {:?}{}",
        v.classes,
        if v.known() {
            " (known-failing class)"
        } else {
            ""
        }
    );
    for x in &v.violations {
        println!("  {}: {} [bound {}]", x.item, x.measured, x.bound);
    }
}

/// Shrinks a failing scenario on `item` and prints (or writes) the result.
fn shrink_and_print(
    g: &Generated,
    item: &'static str,
    opts: &FuzzOptions,
    out_dir: Option<&std::path::Path>,
) {
    let s = g.seed;
    match shrink(g, item, opts, 40) {
        Ok((small, sv)) => {
            let text = to_toml(&small.scenario);
            let still: Vec<String> = sv
                .violations
                .iter()
                .map(|x| format!("{}: {} [bound {}]", x.item, x.measured, x.bound))
                .collect();
            println!(
                "  shrunk to {} VMs, {} ms; still: {}",
                small.scenario.vm_count(),
                small.scenario.duration_ms,
                still.join("; ")
            );
            let header = format!(
                "# promise fuzzer seed {s} (family {}), shrunk: breaks `{item}`\n# classes {:?}\n# {}\n",
                g.family.name(),
                sv.classes,
                still.join("\n# ")
            );
            match out_dir {
                Some(d) => {
                    let f = d.join(format!("fuzz-{s}-{item}.toml"));
                    if let Err(e) = std::fs::create_dir_all(d)
                        .and_then(|_| std::fs::write(&f, format!("{header}{text}")))
                    {
                        eprintln!("{}: {e}", f.display());
                    } else {
                        println!("  written to {}", f.display());
                    }
                }
                None => println!("--- scenario file ---\n{header}{text}---"),
            }
        }
        Err(e) => eprintln!("  shrink: {e}"),
    }
}
