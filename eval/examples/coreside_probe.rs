//! Co-residence probe (issue 18, the `top`/`ladder` families' top share):
//! `cargo run --release -p hqdmux-eval --example coreside_probe -- FILE.toml
//! [SEED]` or `-- --fuzz SEED [FAMILY]` (a generated scenario, family by
//! seed unless given).
//!
//! Runs the scenario under `hqdmux` twice, as it is and with co-residence
//! off (`spatial_coreside_ns = 0`), and the partition's top VM alone, and
//! prints per run the top VM's CU time against alone, its billed GPU time,
//! co-resident workgroups, preemptions and CWSR time: whether lower work
//! co-resident beside the top slows it (occupancy's processor sharing) or
//! the top loses partition time (billed time against the run).
use eval::driver::{simulate, RunOutput};
use eval::fuzz::{generate, Family};
use eval::scenario::Scenario;
use scheduler::{Policy, SchedConfig};

fn top_of(r: &RunOutput) -> Option<usize> {
    (0..r.vm_runs.len()).max_by_key(|&i| r.vm_runs[i].priority)
}

fn line(label: &str, r: &RunOutput, alone_cu: f64) {
    let Some(t) = top_of(r) else { return };
    let v = &r.vm_runs[t];
    let cu = v.cu_ns as f64 / 1e6 / r.cus as f64;
    println!(
        "{label:>14}: top {} p{} cu {:.2} ms ({:.3} of alone {:.2}), billed {:.2} ms of {:.0} ms, \
         co-resident wgs {}, preemptions {}, CWSR {:.1}%",
        v.name,
        v.priority,
        cu,
        if alone_cu > 0.0 { cu / alone_cu } else { 1.0 },
        alone_cu,
        v.gpu_ns as f64 / 1e6,
        r.duration_ns as f64 / 1e6,
        r.gpu.coresident_wgs,
        r.preemptions,
        100.0 * r.save_restore_ns as f64 / r.duration_ns.max(1) as f64
    );
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let (sc, seed) = if a.first().map(String::as_str) == Some("--fuzz") {
        let s: u64 = a.get(1).and_then(|s| s.parse().ok()).expect("--fuzz SEED");
        let fam = a
            .get(2)
            .map(|n| *Family::ALL.iter().find(|f| f.name() == n).expect("FAMILY"));
        (generate(s, fam).scenario, s)
    } else {
        let file = a
            .first()
            .expect("usage: coreside_probe FILE.toml [SEED] | --fuzz SEED [FAMILY]");
        let sc = Scenario::load(std::path::Path::new(file)).unwrap_or_else(|e| panic!("{e}"));
        let seed = a.get(1).map_or(sc.seed, |s| s.parse().expect("SEED"));
        (sc, seed)
    };
    let full = simulate(&sc, Policy::Hqdmux, seed).unwrap_or_else(|e| panic!("{e}"));
    let Some(t) = top_of(&full) else { return };
    let tenant = sc.tenants[full.vm_runs[t].tenant].name.clone();
    let alone = simulate(&sc.only_tenants(&[tenant.as_str()]), Policy::Hqdmux, seed)
        .unwrap_or_else(|e| panic!("{e}"));
    let alone_cu = alone.vm_runs[0].cu_ns as f64 / 1e6 / alone.cus as f64;
    line("as is", &full, alone_cu);
    let mut off = sc.clone();
    let mut cfg = off.scheduler.clone().unwrap_or_else(SchedConfig::default);
    cfg.spatial_coreside_ns = 0;
    off.scheduler = Some(cfg);
    let r = simulate(&off, Policy::Hqdmux, seed).unwrap_or_else(|e| panic!("{e}"));
    line("coreside off", &r, alone_cu);
    line("alone", &alone, alone_cu);
}
