//! Host time of a virtual-time run with and without timeline recording
//! (`hqdmux sim --timeline`), and the size of the recorded timeline.
//!
//! `cargo run --release -p hqdmux-eval --example timeline_overhead [-- SCENARIO [REPEATS]]`

use eval::driver::{simulate, simulate_timeline};
use eval::scenario::Scenario;
use scheduler::Policy;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "seed".into());
    let reps: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(3);
    let sc = match Scenario::builtin(&name) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("timeline_overhead: {e}");
            std::process::exit(2);
        }
    };
    let (mut plain, mut rec) = (Vec::new(), Vec::new());
    let mut sizes = (0, 0, 0);
    for _ in 0..reps {
        let t0 = Instant::now();
        simulate(&sc, Policy::Hqdmux, sc.seed).expect("scenario runs");
        plain.push(t0.elapsed().as_secs_f64() * 1000.0);
        let t0 = Instant::now();
        let (_, t) = simulate_timeline(&sc, Policy::Hqdmux, sc.seed).expect("scenario runs");
        rec.push(t0.elapsed().as_secs_f64() * 1000.0);
        sizes = (t.spans.len(), t.preemptions.len(), t.to_json().len());
    }
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "scenario {name}, policy hqdmux, {reps} runs each: simulate min {:.1} ms, simulate_timeline min {:.1} ms ({:+.1}%); {} spans, {} preemptions, {} bytes of JSON",
        min(&plain),
        min(&rec),
        (min(&rec) / min(&plain) - 1.0) * 100.0,
        sizes.0,
        sizes.1,
        sizes.2
    );
}
