//! Does a saturated GPU 0 delay a VM on GPU 1? (issue 20)
//!
//! A fleet with two `[[gpu]]` entries. A probe VM (priority 2) runs jobs
//! of one kernel of 304 workgroups of 20 ms (20 ms of the whole GPU), 40
//! times, and its job latency is
//! the host-measured time from its "submitted" checkpoint (2) to its
//! "completed" one (3). Three cases, each run `--reps` times alternately:
//!
//! - `idle`: the probe alone (GPU 0 has no VM);
//! - `other-gpu`: GPU 0 saturated by a training VM (priority 2, whole-GPU
//!   kernels) preempted again and again by a burst VM (priority 12);
//! - `same-gpu` (control): the same load on the probe's own GPU, where the
//!   probe shares the training VM's priority level (weighted slices) and
//!   waits for the burst VM.
//!
//! Prints the median over repetitions of each case's p50 and p90 job
//! latency and the ratios to `idle`: isolation between GPUs shows as
//! `other-gpu / idle` near 1 while `same-gpu / idle` is not. The simulated
//! GPUs' service threads share the host's CPUs, so a loaded host adds noise
//! to every case.
//!
//! Run: `cargo run --release -p hqdmux-tests --example multigpu_latency [-- --reps N]`

use std::time::Duration;

use hqdmux_tests::{config, run, scratch_dir};

fn gpu_vm(name: &str, gpu_id: u32, priority: u8, args: &str) -> String {
    format!(
        "[[vm]]\nname = \"{name}\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\n\
         gpu_id = {gpu_id}\npriority = {priority}\nargs = \"{args}\"\n"
    )
}

const PROBE: &str = "kernels=1 wgs=304 cost_us=20000 loops=40";
const PROBE_OK: &str = "gpu: 1 queues x 1 kernels x 304 wgs x 40 loops: ok";

/// One run: the probe on `probe_gpu`, the load on GPU 0 if `load`.
/// Returns the probe's job latencies (sorted).
fn once(probe_gpu: u32, load: bool) -> Vec<Duration> {
    let dir = scratch_dir("multigpu-latency");
    let mut toml = String::from("[[gpu]]\nid = 0\n[[gpu]]\nid = 1\n");
    if load {
        // The load outlasts the probe; the run timeout ends it.
        toml += "[run]\ntimeout_ms = 10000\n";
        toml += &gpu_vm("train", 0, 2, "kernels=4 wgs=1216 cost_us=100000 loops=100");
        toml += &gpu_vm("burst", 0, 12, "kernels=2 wgs=304 cost_us=500 loops=100000");
    }
    toml += &gpu_vm("probe", probe_gpu, 2, PROBE);
    let report = run(&config(&dir, &toml));
    let _ = std::fs::remove_dir_all(&dir);
    let probe = report.vms.iter().find(|v| v.name == "probe").unwrap();
    assert!(
        probe.console.iter().any(|l| l == PROBE_OK),
        "the probe did not finish its jobs: {}",
        report.summary()
    );
    let mut spans = probe.spans(2, 3);
    spans.sort();
    spans
}

fn pct(sorted: &[Duration], p: usize) -> f64 {
    let i = (sorted.len() * p / 100).min(sorted.len().saturating_sub(1));
    sorted.get(i).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    if !vmm::kvm_or_skip("multigpu_latency") {
        return;
    }
    let mut args = std::env::args().skip(1);
    let mut reps = 5;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--reps" => reps = args.next().and_then(|n| n.parse().ok()).unwrap_or(5),
            _ => {
                eprintln!("usage: multigpu_latency [--reps N]");
                std::process::exit(2);
            }
        }
    }
    let cases: [(&str, u32, bool); 3] = [
        ("idle", 1, false),
        ("other-gpu", 1, true),
        ("same-gpu", 0, true),
    ];
    let mut p50 = vec![Vec::new(); cases.len()];
    let mut p90 = vec![Vec::new(); cases.len()];
    for r in 0..reps {
        for (i, (name, gpu, load)) in cases.iter().enumerate() {
            let s = once(*gpu, *load);
            let (a, b) = (pct(&s, 50), pct(&s, 90));
            println!(
                "rep {r} {name:<10} jobs {:>3}  p50 {a:8.3} ms  p90 {b:8.3} ms",
                s.len()
            );
            p50[i].push(a);
            p90[i].push(b);
        }
    }
    let m50: Vec<f64> = p50.into_iter().map(median).collect();
    let m90: Vec<f64> = p90.into_iter().map(median).collect();
    println!("\nprobe job latency, median of {reps} runs:");
    for (i, (name, _, _)) in cases.iter().enumerate() {
        println!(
            "{name:<10} p50 {:8.3} ms ({:5.2}x idle)  p90 {:8.3} ms ({:5.2}x idle)",
            m50[i],
            m50[i] / m50[0],
            m90[i],
            m90[i] / m90[0]
        );
    }
}
