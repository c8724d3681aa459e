//! Aging probe (issue 18): `cargo run --release -p hqdmux-eval --example
//! aging_probe -- FILE.toml [SEED]`. Runs the scenario under `hqdmux` and
//! prints, per VM (highest priority first), its priority, completed jobs,
//! CU time, billed GPU time, its longest wait without a completion and the
//! completion times (ms) around that wait: what aging gave each level.
use eval::driver::simulate;
use eval::fuzz::longest_without_completion;
use eval::scenario::Scenario;
use scheduler::Policy;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let file = a.get(1).expect("usage: aging_probe FILE.toml [SEED]");
    let sc = Scenario::load(std::path::Path::new(file)).unwrap_or_else(|e| panic!("{e}"));
    let seed = a.get(2).map_or(sc.seed, |s| s.parse().unwrap());
    let r = simulate(&sc, Policy::Hqdmux, seed).unwrap();
    let gaps = longest_without_completion(&r);
    let mut idx: Vec<usize> = (0..r.vm_runs.len()).collect();
    idx.sort_by_key(|&i| std::cmp::Reverse(r.vm_runs[i].priority));
    for i in idx {
        let v = &r.vm_runs[i];
        let mut done: Vec<u64> = r
            .jobs
            .iter()
            .filter(|j| j.vm == i)
            .filter_map(|j| j.latency_ns.map(|l| j.arrival_ns + l))
            .collect();
        done.sort_unstable();
        let times: Vec<String> = done
            .iter()
            .take(40)
            .map(|t| format!("{:.1}", *t as f64 / 1e6))
            .collect();
        println!(
            "{} p{}: {} jobs, cu {:.2} ms, billed {:.2} ms, longest gap {:.1} ms; done at {}",
            v.name,
            v.priority,
            done.len(),
            v.cu_ns as f64 / 1e6 / r.cus as f64,
            v.gpu_ns as f64 / 1e6,
            gaps[i] as f64 / 1e6,
            times.join(" ")
        );
    }
    println!(
        "preemptions {}, CWSR {:.1}% of the run",
        r.preemptions,
        100.0 * r.save_restore_ns as f64 / r.duration_ns as f64
    );
}
