//! Scheduler probe (issue 18): `cargo run --release -p hqdmux-eval --example
//! sched_probe -- FILE.toml [SEED]`. Runs each sweep point of the scenario
//! under `hqdmux`, and its `top` tenant alone, and prints one line per
//! point: the top VM's CU time vs alone, CWSR time as a share of the run,
//! preemptions, host ms per virtual ms, and per lower VM its completed
//! jobs, CU time and billed GPU time.
use eval::driver::simulate;
use eval::scenario::Scenario;
use scheduler::Policy;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let file = a.get(1).expect("usage: sched_probe FILE.toml [SEED]");
    let sc = Scenario::load(std::path::Path::new(file)).unwrap_or_else(|e| panic!("{e}"));
    for sc in sc.expand() {
        let seed = a.get(2).map_or(sc.seed, |s| s.parse().unwrap());
        let t0 = std::time::Instant::now();
        let r = simulate(&sc, Policy::Hqdmux, seed).unwrap();
        let host_ms = t0.elapsed().as_secs_f64() * 1e3;
        let alone = simulate(&sc.only_tenants(&["top"]), Policy::Hqdmux, seed).unwrap();
        let cu = |run: &eval::driver::RunOutput| -> u128 {
            run.vm_runs
                .iter()
                .filter(|v| v.name == "top" || v.name.starts_with("top-"))
                .map(|v| v.cu_ns)
                .sum()
        };
        let ratio = cu(&r) as f64 / cu(&alone).max(1) as f64;
        let dur = r.duration_ns as f64;
        let lower: Vec<String> = r
            .vm_runs
            .iter()
            .filter(|v| !(v.name == "top" || v.name.starts_with("top-")))
            .map(|v| {
                format!(
                    "{}: {} jobs, cu {:.1} ms, billed {:.1} ms",
                    v.name,
                    v.latency_ns.len(),
                    v.cu_ns as f64 / 1e6 / r.cus as f64,
                    v.gpu_ns as f64 / 1e6
                )
            })
            .collect();
        println!(
            "{}: top vs alone {:.3}; CWSR {:.1}% of the run; preemptions {}; host {:.1} ms/virtual ms",
            sc.name,
            ratio,
            100.0 * r.save_restore_ns as f64 / dur,
            r.preemptions,
            host_ms / (dur / 1e6),
        );
        let n = lower.len();
        for l in lower.iter().take(4) {
            println!("    {l}");
        }
        if n > 4 {
            println!("    ... {} more lower VMs", n - 4);
        }
    }
}
