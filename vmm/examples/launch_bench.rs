//! Launch latency: launch -> guest entry and launch -> first console line,
//! for fleets of 1 and 16 `hello` VMs. Prints medians over several runs.
//!
//! `cargo run --release -p hqdmux --example launch_bench [RUNS]`

use std::path::Path;
use std::time::Instant;

use vmm::config::FleetConfig;
use vmm::fleet::{run_fleet, RunOptions};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    if !vmm::kvm_available() {
        eprintln!("launch_bench: /dev/kvm is not available");
        std::process::exit(1);
    }
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    println!("runs per size: {runs} (median, ms since launch; 'all' = the last VM of the fleet)");
    println!(
        "{:>4} {:>12} {:>12} {:>12} {:>12}",
        "vms", "entry_first", "entry_all", "line_first", "line_all"
    );
    for n in [1usize, 16] {
        let toml: String = (0..n)
            .map(|i| {
                format!("[[vm]]\nname = \"b{i}\"\nimage = \"builtin:hello\"\nmemory_mib = 16\n")
            })
            .collect();
        let cfg = FleetConfig::parse(&toml, Path::new("bench.toml")).unwrap();
        let (mut ef, mut ea, mut lf, mut la) = (vec![], vec![], vec![], vec![]);
        for _ in 0..runs {
            let report = run_fleet(
                &cfg,
                RunOptions {
                    echo: false,
                    api_socket: None,
                    ..Default::default()
                },
            )
            .unwrap();
            assert!(report.all_succeeded());
            let ms = |t: Option<Instant>| (t.unwrap() - report.launched).as_secs_f64() * 1e3;
            let entries: Vec<f64> = report.vms.iter().map(|v| ms(v.entered)).collect();
            let lines: Vec<f64> = report.vms.iter().map(|v| ms(v.first_line)).collect();
            ef.push(entries.iter().cloned().fold(f64::MAX, f64::min));
            ea.push(entries.iter().cloned().fold(0.0, f64::max));
            lf.push(lines.iter().cloned().fold(f64::MAX, f64::min));
            la.push(lines.iter().cloned().fold(0.0, f64::max));
        }
        println!(
            "{n:>4} {:>12.2} {:>12.2} {:>12.2} {:>12.2}",
            median(&mut ef),
            median(&mut ea),
            median(&mut lf),
            median(&mut la)
        );
    }
}
