//! Quick runner: `cargo run --release -p hqdmux-eval --example evalrun -- SCENARIO|FILE.toml [POLICY|all] [SEED]`.
use eval::driver::evaluate;
use eval::report::table;
use eval::scenario::Scenario;
use scheduler::Policy;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let name = a.get(1).map_or("seed", |s| s);
    let sc = if name.ends_with(".toml") {
        Scenario::load(std::path::Path::new(name))
    } else {
        Scenario::builtin(name)
    }
    .unwrap_or_else(|e| panic!("{e}"));
    let pols: Vec<Policy> = match a.get(2).map(|s| s.as_str()) {
        None | Some("all") => Policy::ALL.to_vec(),
        Some(p) => vec![Policy::from_name(p).unwrap()],
    };
    let seed = a.get(3).map_or(sc.seed, |s| s.parse().unwrap());
    for p in &pols {
        let r = eval::driver::simulate(&sc, *p, seed).unwrap();
        eprintln!("{}: {:?}", p.name(), r.gpu);
    }
    let rows: Vec<_> = pols
        .iter()
        .map(|p| evaluate(&sc, *p, seed).unwrap())
        .collect();
    print!("{}", table(&rows));
    for r in &rows {
        eprintln!(
            "{} host {:.0} ms, decision p99 {:.0} ns, wgs {}, errors {}",
            r.policy, r.host_ms, r.decision_p99_ns, r.workgroups, r.queue_errors
        );
    }
}
