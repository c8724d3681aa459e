//! RT probe (issue 18, best effort beside real-time tenants): `cargo run
//! --release -p hqdmux-eval --example rt_probe -- FILE.toml...`. For each
//! scenario file of the fuzzer's `rt` shape (RT tenants named `rt*`, best
//! effort `be*`), runs it under `hqdmux` (seed of the file), the RT tenants
//! isolated and the best effort alone, and prints one line: RT p99 and its
//! bound (1.1 x isolated + one whole-partition save and restore), best
//! effort CU time vs alone and its bound (0.9 x (1 - RT CU share)), CWSR
//! time as a share of the run, and the partition's spatial counters.
use eval::driver::evaluate_full;
use eval::fuzz::cu_time_named;
use eval::promises::cwsr_save_restore_ns;
use eval::report::PolicyReport;
use eval::scenario::{Class, Scenario};
use scheduler::Policy;

fn main() {
    for file in std::env::args().skip(1) {
        let sc = Scenario::load(std::path::Path::new(&file)).unwrap_or_else(|e| panic!("{e}"));
        let topo = eval::driver::topology(&sc).unwrap();
        let cwsr = cwsr_save_restore_ns(&topo) as f64 / 1e3;
        let (r, run) = evaluate_full(&sc, Policy::Hqdmux, sc.seed).unwrap();
        let (alone, _) = evaluate_full(&sc.only(Class::Lo), Policy::Hqdmux, sc.seed).unwrap();
        let be = |r: &PolicyReport| cu_time_named(r, "be");
        let capacity = run.cus as f64 * run.duration_ns as f64 / 1e3;
        let hi = cu_time_named(&r, "rt");
        let share = hi / capacity;
        let iso = r.hi_isolated_p99_us.unwrap_or(0.0);
        println!(
            "{}: rt p99 {:.0} us (bound {:.0}); best effort {:.3} of alone (bound {:.3}); CWSR {:.1}% of the run; preemptions {}",
            sc.name,
            r.hi_p99_us.unwrap_or(f64::INFINITY),
            1.1 * iso + cwsr,
            be(&r) / be(&alone).max(1e-9),
            0.9 * (1.0 - share).max(0.0),
            100.0 * r.save_restore_us_total / (sc.duration_ms as f64 * 1000.0),
            run.preemptions,
        );
    }
}
