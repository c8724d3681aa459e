//! `hqdmux sim`: the virtual-time evaluation harness (no KVM needed).

use std::path::PathBuf;
use std::process::ExitCode;

use eval::driver::evaluate;
use eval::report::{per_vm_table, table, PolicyReport};
use eval::scenario::{Scenario, BUILTIN};
use scheduler::Policy;

/// Arguments of `hqdmux sim`.
#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// Built-in scenario name, or `all` (see --list).
    #[arg(long, default_value = "seed", conflicts_with = "scenario_file")]
    pub scenario: String,
    /// Scenario file (TOML) instead of a built-in one.
    #[arg(long)]
    pub scenario_file: Option<PathBuf>,
    /// Policy: hqdmux, fifo, poll5ms, timeslice, reset, or `all`.
    #[arg(long, default_value = "all")]
    pub policy: String,
    /// Arrival seed (default: the scenario's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print one JSON object per (scenario, policy) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Add a per-VM section to the table (GPU time, CU time, share, jobs,
    /// latency, longest wait for a slot) per (scenario, policy). The JSON
    /// always carries it (`vms`, `jain_by_level`).
    #[arg(long)]
    pub per_vm: bool,
    /// List the built-in scenarios and exit.
    #[arg(long)]
    pub list: bool,
}

/// Loads the scenarios named by the arguments.
pub fn scenarios(args: &SimArgs) -> Result<Vec<Scenario>, String> {
    if let Some(f) = &args.scenario_file {
        return Scenario::load(f)
            .map(|s| s.expand())
            .map_err(|e| e.to_string());
    }
    if args.scenario == "all" {
        let mut all = Vec::new();
        for (n, _) in BUILTIN {
            all.extend(Scenario::builtin(n).map_err(|e| e.to_string())?.expand());
        }
        return Ok(all);
    }
    Scenario::builtin(&args.scenario)
        .map(|s| s.expand())
        .map_err(|e| e.to_string())
}

/// Parses `--policy`.
pub fn policies(name: &str) -> Result<Vec<Policy>, String> {
    if name == "all" {
        return Ok(Policy::ALL.to_vec());
    }
    Policy::from_name(name).map(|p| vec![p]).ok_or_else(|| {
        let names: Vec<_> = Policy::ALL.iter().map(|p| p.name()).collect();
        format!(
            "--policy: unknown policy '{name}' (one of {}, all)",
            names.join(", ")
        )
    })
}

/// Runs the command; exit 2 on bad arguments or scenario files.
pub fn run(args: &SimArgs) -> ExitCode {
    if args.list {
        for (name, _) in BUILTIN {
            let s = Scenario::builtin(name).expect("built-in scenarios parse");
            println!(
                "{name:<14} {} VMs, {} queues: {}",
                s.vm_count(),
                s.queue_count(),
                s.description
            );
        }
        return ExitCode::SUCCESS;
    }
    let (scs, pols) = match (scenarios(args), policies(&args.policy)) {
        (Ok(s), Ok(p)) => (s, p),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("hqdmux sim: {e}");
            return ExitCode::from(2);
        }
    };
    let mut rows: Vec<PolicyReport> = Vec::new();
    for sc in &scs {
        let seed = args.seed.unwrap_or(sc.seed);
        for p in &pols {
            match evaluate(sc, *p, seed) {
                Ok(r) => {
                    log::debug!(
                        "{} / {}: {:.0} ms host time",
                        r.scenario,
                        r.policy,
                        r.host_ms
                    );
                    rows.push(r);
                }
                Err(e) => {
                    eprintln!("hqdmux sim: {e}");
                    return ExitCode::from(2);
                }
            }
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("report serialises")
        );
    } else {
        print!("{}", table(&rows));
        if args.per_vm {
            print!("{}", per_vm_table(&rows));
        }
    }
    ExitCode::SUCCESS
}
