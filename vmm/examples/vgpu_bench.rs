//! Guest-visible GPU job latency through the mediated vGPU, measured on the
//! host (checkpoint 2 "submitted" -> checkpoint 3 "all waits returned"):
//! an inference VM (priority 12, bursts of 4 kernels x 304 workgroups x
//! 500 us) alone, then beside a training VM (priority 2, 1216-workgroup
//! kernels of 20 ms workgroups) under each scheduling policy.
//!
//! `cargo run --release -p hqdmux --example vgpu_bench [LOOPS]`

use std::path::Path;
use std::time::Duration;

use vmm::config::FleetConfig;
use vmm::fleet::{run_fleet, RunOptions};

fn vm(name: &str, prio: u8, args: &str) -> String {
    format!(
        "[[vm]]\nname = \"{name}\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\npriority = {prio}\nargs = \"{args}\"\n"
    )
}

fn pct(v: &[Duration], q: f64) -> f64 {
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1e3
}

fn main() {
    if !vmm::kvm_available() {
        eprintln!("vgpu_bench: /dev/kvm is not available");
        std::process::exit(1);
    }
    let loops: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let infer = vm(
        "inference",
        12,
        &format!("kernels=4 wgs=304 cost_us=500 loops={loops}"),
    );
    // Enough training work to outlast the inference loops.
    let train = vm("training", 2, "kernels=8 wgs=1216 cost_us=20000");
    println!("inference job = 4 kernels x 304 wgs x 500 us = 2.0 ms of GPU; {loops} jobs; ms, host-measured");
    println!(
        "{:<24} {:>8} {:>8} {:>8} {:>8} {:>12}",
        "run", "p50", "p99", "max", "ratio", "preemptions"
    );
    let mut iso = 0.0;
    for (label, policy, with_training) in [
        ("isolated (hqdmux)", "hqdmux", false),
        ("+training, hqdmux", "hqdmux", true),
        ("+training, poll5ms", "poll5ms", true),
        ("+training, timeslice", "timeslice", true),
        ("+training, fifo", "fifo", true),
    ] {
        let mut text = format!("[run]\ntimeout_ms = 120000\n[scheduler]\npolicy = \"{policy}\"\n");
        if with_training {
            text += &train;
        }
        text += &infer;
        let cfg = FleetConfig::parse(&text, Path::new("/bench/fleet.toml")).expect("config");
        let r = run_fleet(
            &cfg,
            RunOptions {
                echo: false,
                api_socket: None,
                ..Default::default()
            },
        )
        .expect("fleet");
        let inf = r.vms.iter().find(|v| v.name == "inference").unwrap();
        if !inf.outcome.is_success() {
            eprintln!(
                "{label}: inference failed: {}\n{:?}",
                inf.outcome, inf.console
            );
            continue;
        }
        let mut spans = inf.spans(2, 3);
        spans.sort();
        let p50 = pct(&spans, 0.5);
        if !with_training {
            iso = p50;
        }
        println!(
            "{:<24} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>12}",
            label,
            p50,
            pct(&spans, 0.99),
            spans.last().unwrap().as_secs_f64() * 1e3,
            p50 / iso,
            r.gpu.map_or(0, |g| g.preemptions)
        );
    }
}
