//! Prints, for `rt`-family fuzz seeds, the best effort's CU time beside
//! its RT tenants against alone, and the `3-be-retained` bound's factor
//! and case (`eval::be_bound`; docs/scheduling.md, "The best-effort bound
//! in lock-step rounds").
//!
//! `cargo run --release -p hqdmux-eval --example be_bound -- SEED...`
//! (a seed picks its family as `promise_fuzz --seed S` does; `rt:SEED`
//! forces the `rt` family, as `promise_fuzz --family rt --seed S`).

use eval::driver::{evaluate_full, topology};
use eval::fuzz::{cu_time_named, generate, rt_be_bound, Family};
use eval::promises::cwsr_save_restore_ns;
use eval::scenario::Class;
use scheduler::Policy;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("seed   retained  1-RT-share  bound-factor  0.9xfactor  case");
    for a in std::env::args().skip(1) {
        let (seed, g) = match a.strip_prefix("rt:") {
            Some(s) => {
                let seed: u64 = s.parse()?;
                (seed, generate(seed, Some(Family::Rt)))
            }
            None => {
                let seed: u64 = a.parse()?;
                (seed, generate(seed, None))
            }
        };
        if g.family != Family::Rt {
            println!("{seed}  not an rt scenario");
            continue;
        }
        let sc = &g.scenario;
        let topo = topology(sc)?;
        let cwsr = cwsr_save_restore_ns(&topo);
        let cfg = sc.scheduler.clone().unwrap_or_default();
        let (report, run) = evaluate_full(sc, Policy::Hqdmux, seed)?;
        let (alone, _) = evaluate_full(&sc.only(Class::Lo), Policy::Hqdmux, seed)?;
        let capacity = run.cus as f64 * run.duration_ns as f64 / 1e3;
        let today = (1.0 - cu_time_named(&report, "rt") / capacity).max(0.0);
        let b = rt_be_bound(sc, &alone, &topo, cwsr, &cfg, today);
        let kept = cu_time_named(&report, "be") / cu_time_named(&alone, "be").max(1e-9);
        println!(
            "{seed}  {kept:.3}     {today:.3}       {:.3}         {:.3}       {}",
            b.factor,
            0.9 * b.factor,
            b.case
        );
    }
    Ok(())
}
