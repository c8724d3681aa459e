//! Under-share and weights probe (issue 18, `light`/`equals` families):
//! `cargo run --release -p hqdmux-eval --example light_probe -- FILE.toml [SEED]`.
//! Runs the scenario under `hqdmux` and prints, per VM, its jobs, the
//! latencies of its first 10 jobs and its p99 (ms), billed GPU time and CU
//! time (ms of the whole partition) per unit of weight (of completed
//! kernels, and as received: `VmRun::cu_used_ns`), its preemptions and
//! longest wait for a slot, and the same for
//! the VM alone (`Scenario::only_tenants`).
use eval::driver::{simulate, RunOutput, VmRun};
use eval::scenario::Scenario;
use scheduler::Policy;

fn p99(v: &VmRun) -> f64 {
    let mut l = v.latency_ns.clone();
    l.sort_unstable();
    if l.is_empty() {
        return 0.0;
    }
    let i = ((l.len() as f64 * 0.99).ceil() as usize).clamp(1, l.len()) - 1;
    l[i] as f64 / 1e6
}

fn line(r: &RunOutput, v: &VmRun) -> String {
    let first: Vec<String> = v
        .latency_ns
        .iter()
        .take(10)
        .map(|l| format!("{:.2}", *l as f64 / 1e6))
        .collect();
    let w = v.weight.max(1) as f64;
    format!(
        "{} w{} jobs {} p99 {:.2} ms first [{}] billed/w {:.2} ms wait/w {:.2} ms cu/w {:.2} ms eff {:.3} used/w {:.2} ms used eff {:.3} preempt {} max_wait {:.2} ms",
        v.name,
        v.weight,
        v.latency_ns.len(),
        p99(v),
        first.join(" "),
        v.gpu_ns as f64 / 1e6 / w,
        v.save_wait_ns as f64 / 1e6 / w,
        v.cu_ns as f64 / 1e6 / r.cus as f64 / w,
        v.cu_ns as f64 / (r.cus as f64 * v.gpu_ns.max(1) as f64),
        v.cu_used_ns as f64 / 1e6 / r.cus as f64 / w,
        v.cu_used_ns as f64 / (r.cus as f64 * v.gpu_ns.max(1) as f64),
        v.preemptions,
        v.max_wait_ns as f64 / 1e6,
    )
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let file = a.get(1).expect("usage: light_probe FILE.toml [SEED]");
    let sc = Scenario::load(std::path::Path::new(file)).unwrap_or_else(|e| panic!("{e}"));
    for sc in sc.expand() {
        let seed = a.get(2).map_or(sc.seed, |s| s.parse().unwrap());
        let r = simulate(&sc, Policy::Hqdmux, seed).unwrap();
        println!(
            "{}: {} ms, CWSR {:.1}% of the run, preemptions {}",
            sc.name,
            sc.duration_ms,
            100.0 * r.save_restore_ns as f64 / r.duration_ns.max(1) as f64,
            r.preemptions
        );
        for v in &r.vm_runs {
            println!("  {}", line(&r, v));
        }
        // The light VM's slowest jobs: (index, latency ms).
        if let Some(v) = r.vm_runs.iter().find(|v| v.name == "light") {
            let mut worst: Vec<(usize, u64)> = v.latency_ns.iter().copied().enumerate().collect();
            worst.sort_by_key(|e| std::cmp::Reverse(e.1));
            let w: Vec<String> = worst
                .iter()
                .take(4)
                .map(|(i, l)| format!("#{i} {:.2}", *l as f64 / 1e6))
                .collect();
            println!("  light slowest jobs [{}]", w.join(", "));
            // Its first jobs as (arrival ms: latency ms), to see bursts.
            let vi = r.vm_runs.iter().position(|v| v.name == "light");
            let arr: Vec<String> = r
                .jobs
                .iter()
                .filter(|j| Some(j.vm) == vi)
                .take(12)
                .map(|j| {
                    format!(
                        "{:.2}: {}",
                        j.arrival_ns as f64 / 1e6,
                        j.latency_ns
                            .map_or("-".into(), |l| format!("{:.2}", l as f64 / 1e6))
                    )
                })
                .collect();
            println!("  light jobs [{}]", arr.join(", "));
        }
        for t in &sc.tenants {
            let alone =
                simulate(&sc.only_tenants(&[t.name.as_str()]), Policy::Hqdmux, seed).unwrap();
            for v in alone.vm_runs.iter().take(1) {
                println!("  alone {}", line(&alone, v));
            }
        }
    }
}
