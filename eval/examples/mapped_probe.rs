//! Billing probe (issue 18, `equals` family): `cargo run --release -p
//! hqdmux-eval --example mapped_probe -- FILE.toml [VM ...]`. Runs the
//! scenario under `hqdmux` with the HQD-slot timeline and prints, per VM,
//! its billed GPU time, the wall time one of its queues was mapped
//! (run spans), its restore time, slices, CU time received
//! (`VmRun::cu_used_ns`) and CU-ns per billed and per mapped ns; for each
//! VM named after the file, its mapped intervals with the other VMs'
//! spans overlapping them (whose saves it was mapped during).
use eval::driver::simulate_timeline;
use eval::scenario::Scenario;
use scheduler::Policy;
use timeline::SpanKind;

fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (a, b) in v {
        if let Some(l) = out.last_mut() {
            if a <= l.1 {
                l.1 = l.1.max(b);
                continue;
            }
        }
        out.push((a, b));
    }
    out
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let sc = Scenario::load(std::path::Path::new(&a[1])).unwrap();
    let focus: Vec<String> = a[2..].to_vec();
    let sc = sc.expand().remove(0);
    let (r, t) = simulate_timeline(&sc, Policy::Hqdmux, sc.seed).unwrap();
    let name_of = |id: u32| {
        t.vms
            .iter()
            .find(|v| v.id == id)
            .map(|v| v.name.clone())
            .unwrap_or_default()
    };
    for v in &r.vm_runs {
        let ids: Vec<u32> = t
            .vms
            .iter()
            .filter(|x| x.name == v.name)
            .map(|x| x.id)
            .collect();
        let runs: Vec<(u64, u64)> = t
            .spans
            .iter()
            .filter(|s| ids.contains(&s.vm) && s.kind == SpanKind::Run)
            .map(|s| (s.start_ns, s.end_ns))
            .collect();
        let rest: Vec<(u64, u64)> = t
            .spans
            .iter()
            .filter(|s| ids.contains(&s.vm) && s.kind == SpanKind::Restore)
            .map(|s| (s.start_ns, s.end_ns))
            .collect();
        let m = merge(runs.clone());
        let tot: u64 = m.iter().map(|x| x.1 - x.0).sum();
        let rt: u64 = merge(rest).iter().map(|x| x.1 - x.0).sum();
        println!(
            "{} gpu {:.2} ms mapped {:.2} ms restore {:.2} ms intervals {} cu_used {:.2} ms eff/gpu {:.3} eff/mapped {:.3}",
            v.name,
            v.gpu_ns as f64 / 1e6,
            tot as f64 / 1e6,
            rt as f64 / 1e6,
            m.len(),
            v.cu_used_ns as f64 / 1e6 / r.cus as f64,
            v.cu_used_ns as f64 / (r.cus as f64 * v.gpu_ns as f64),
            v.cu_used_ns as f64 / (r.cus as f64 * tot.max(1) as f64),
        );
        if focus.contains(&v.name) {
            for (a, b) in &m {
                // who else was on the GPU meanwhile
                let mut others: Vec<String> = t
                    .spans
                    .iter()
                    .filter(|s| !ids.contains(&s.vm) && s.start_ns < *b && s.end_ns > *a)
                    .map(|s| {
                        format!(
                            "{}:{}[{:.3}-{:.3}]",
                            name_of(s.vm),
                            s.kind.name(),
                            s.start_ns as f64 / 1e6,
                            s.end_ns as f64 / 1e6
                        )
                    })
                    .collect();
                others.dedup();
                others.truncate(6);
                println!(
                    "   {:.3}-{:.3} ({:.3}) {}",
                    *a as f64 / 1e6,
                    *b as f64 / 1e6,
                    (b - a) as f64 / 1e6,
                    others.join(" ")
                );
            }
        }
    }
}
