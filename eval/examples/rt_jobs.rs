//! Per-job RT probe (issue 18): `cargo run --release -p hqdmux-eval
//! --example rt_jobs -- FILE.toml [MIN_US]`. Runs the scenario file under
//! `hqdmux` (seed of the file) and prints every job of the tenants named
//! `rt*` whose latency is at least `MIN_US` (0: all): tenant, arrival and
//! latency in us. Where `rt_probe` gives one p99 per scenario, this shows
//! which jobs are late and when (a p99 over the pooled RT jobs of a
//! scenario with a 137 us and a 1.3 ms RT is set by its worst 1%, e.g.
//! 60 of 6044 jobs for fuzz seed 97057).
use eval::driver::simulate;
use eval::scenario::Scenario;
use scheduler::Policy;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(file) = args.next() else {
        eprintln!("usage: rt_jobs FILE.toml [MIN_US]");
        std::process::exit(2);
    };
    let min: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(0.0);
    let sc = Scenario::load(std::path::Path::new(&file)).unwrap_or_else(|e| panic!("{e}"));
    let run = simulate(&sc, Policy::Hqdmux, sc.seed).unwrap_or_else(|e| panic!("{e}"));
    for j in &run.jobs {
        let Some(t) = sc.tenants.get(j.tenant) else {
            continue;
        };
        if !t.name.starts_with("rt") {
            continue;
        }
        let l = j.latency_ns.map_or(f64::INFINITY, |l| l as f64 / 1e3);
        if l >= min {
            println!(
                "{} arr {:.1} us lat {:.3} us",
                t.name,
                j.arrival_ns as f64 / 1e3,
                l
            );
        }
    }
}
