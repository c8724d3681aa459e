//! `hqdmux sim`: the virtual-time evaluation harness (no KVM needed).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use eval::driver::{evaluate, simulate_timeline};
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
    /// Also write the HQD-slot timeline of each (scenario, policy) run: a
    /// Gantt chart per HQD slot and per VM, coloured by VM, CWSR save and
    /// restore hatched, preemptions marked with the preemptor's name,
    /// waiting and operator changes shown; aggregated per VM lane when
    /// spans would be narrower than a pixel (SVG; a path ending in `.json`
    /// gets the timeline as JSON). With one scenario and one policy the
    /// file is PATH; with several, one file per run, named
    /// `STEM-SCENARIO-POLICY.EXT` (the scenario part only with several
    /// scenarios; e.g. `--policy all --timeline t.svg` writes
    /// t-hqdmux.svg, t-fifo.svg, ...).
    #[arg(long, value_name = "PATH")]
    pub timeline: Option<PathBuf>,
    /// Timeline window start, ms of virtual time (default: 0).
    #[arg(long, value_name = "MS", requires = "timeline")]
    pub timeline_from_ms: Option<u64>,
    /// Timeline window end, ms of virtual time (default: the end of the run).
    #[arg(long, value_name = "MS", requires = "timeline")]
    pub timeline_to_ms: Option<u64>,
}

/// The file `--timeline PATH` names for one run (see `SimArgs::timeline`).
pub fn timeline_path(
    base: &Path,
    scenario: &str,
    policy: &str,
    many_scenarios: bool,
    many_policies: bool,
) -> PathBuf {
    if !many_scenarios && !many_policies {
        return base.to_path_buf();
    }
    let stem = base
        .file_stem()
        .map_or_else(|| "timeline".into(), |s| s.to_string_lossy().into_owned());
    let mut name = stem;
    if many_scenarios {
        name.push('-');
        name.push_str(scenario);
    }
    if many_policies {
        name.push('-');
        name.push_str(policy);
    }
    if let Some(ext) = base.extension() {
        name.push('.');
        name.push_str(&ext.to_string_lossy());
    }
    base.with_file_name(name)
}

/// Records and writes the timeline of one run (`--timeline`).
fn write_timeline(
    args: &SimArgs,
    sc: &Scenario,
    p: Policy,
    seed: u64,
    path: &Path,
) -> Result<(), String> {
    let (run, t) = simulate_timeline(sc, p, seed).map_err(|e| e.to_string())?;
    let from = args.timeline_from_ms.unwrap_or(0).saturating_mul(1_000_000);
    let to = args
        .timeline_to_ms
        .map_or(t.end_ns, |ms| ms.saturating_mul(1_000_000));
    if from >= to || from >= t.end_ns {
        return Err(format!(
            "--timeline-from-ms/--timeline-to-ms: empty window ({} ms run)",
            t.end_ns / 1_000_000
        ));
    }
    let mut t = t.clip(from, to);
    // The harness simulates one GPU.
    t.gpu_id = Some(0);
    let body = if path.extension().is_some_and(|e| e == "json") {
        t.to_json()
    } else {
        let title = format!(
            "hqdmux sim --scenario {} --policy {} --seed {seed}: {} preemptions in the run",
            sc.name,
            p.name(),
            run.preemptions
        );
        timeline::render_svg(
            &t,
            &timeline::RenderOptions {
                title: Some(title),
                ..Default::default()
            },
        )
    };
    std::fs::write(path, body).map_err(|e| format!("--timeline {}: {e}", path.display()))?;
    log::info!(
        "{} / {}: timeline written to {}",
        sc.name,
        p.name(),
        path.display()
    );
    Ok(())
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
            if let Err(c) = crate::out!(
                "{name:<14} {} VMs, {} queues: {}\n",
                s.vm_count(),
                s.queue_count(),
                s.description
            ) {
                return c;
            }
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
            if let Some(base) = &args.timeline {
                let path = timeline_path(base, &sc.name, p.name(), scs.len() > 1, pols.len() > 1);
                if let Err(e) = write_timeline(args, sc, *p, seed, &path) {
                    eprintln!("hqdmux sim: {e}");
                    return ExitCode::from(2);
                }
            }
            match evaluate(sc, *p, seed) {
                Ok(r) => {
                    log::debug!(
                        "{} / {}: {:.0} ms host time, {:.3} host ms per virtual ms ({:.3} CPU)",
                        r.scenario,
                        r.policy,
                        r.host_ms,
                        r.host_ms_per_virtual_ms,
                        r.host_cpu_ms_per_virtual_ms
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
    crate::cli::done(if args.json {
        crate::out!(
            "{}\n",
            serde_json::to_string_pretty(&rows).expect("report serialises")
        )
    } else if args.per_vm {
        crate::out!("{}{}", table(&rows), per_vm_table(&rows))
    } else {
        crate::out!("{}", table(&rows))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_paths_per_run() {
        let b = Path::new("out/t.svg");
        assert_eq!(timeline_path(b, "seed", "fifo", false, false), b);
        assert_eq!(
            timeline_path(b, "seed", "fifo", false, true),
            Path::new("out/t-fifo.svg")
        );
        assert_eq!(
            timeline_path(b, "seed", "fifo", true, true),
            Path::new("out/t-seed-fifo.svg")
        );
        assert_eq!(
            timeline_path(Path::new("t"), "seed", "fifo", true, false),
            Path::new("t-seed")
        );
    }
}
