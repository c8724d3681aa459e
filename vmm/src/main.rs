//! The `hqdmux` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use vmm::config::FleetConfig;
use vmm::fleet::{run_fleet, RunOptions};

/// hqdmux: KVM VMs sharing a mediated AMD compute GPU by priority.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Launch every VM of a fleet config, stream their consoles, wait for all
    /// of them (or the run timeout) and print a per-VM summary. Exits 1 if
    /// any VM did not exit with status 0, 2 if the config is invalid.
    Run {
        /// Fleet config (TOML), e.g. examples/hello.toml.
        config: PathBuf,
        /// Do not echo guest consoles.
        #[arg(long, short)]
        quiet: bool,
        /// Override the config's run timeout (milliseconds).
        #[arg(long)]
        timeout_ms: Option<u64>,
        /// Serve the operator control socket here while the fleet runs
        /// (steer it with `hqdmux ctl PATH ...`).
        #[arg(long, value_name = "PATH")]
        api_socket: Option<PathBuf>,
    },
    /// Steer a running fleet through its control socket: `list`,
    /// `priority VM P` (0..15), `weight VM W` (1..1000), `policy [P]`.
    /// Applies at once.
    /// Exits 1 if the fleet refused the request, 2 if it cannot be reached.
    Ctl {
        /// The `--api-socket` path of `hqdmux run`.
        socket: PathBuf,
        /// The request, e.g. `priority training 14`.
        #[arg(required = true, num_args = 1..)]
        request: Vec<String>,
    },
    /// Check a fleet config without launching anything.
    Check {
        /// Fleet config (TOML).
        config: PathBuf,
    },
    /// List the guest images built into this binary.
    Images,
    /// Evaluate scheduling policies on a scenario in virtual time over the
    /// simulated GPU (no KVM needed): a policy x metric table, or JSON.
    Sim(vmm::simcmd::SimArgs),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run {
            config,
            quiet,
            timeout_ms,
            api_socket,
        } => {
            let mut cfg = match FleetConfig::load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("hqdmux: invalid config: {e}");
                    return ExitCode::from(2);
                }
            };
            if timeout_ms.is_some() {
                cfg.run.timeout_ms = timeout_ms;
            }
            match run_fleet(
                &cfg,
                RunOptions {
                    echo: !quiet,
                    api_socket,
                },
            ) {
                Ok(report) => {
                    print!("{}", report.summary());
                    if report.all_succeeded() {
                        ExitCode::SUCCESS
                    } else {
                        let failed = report
                            .vms
                            .iter()
                            .filter(|v| !v.outcome.is_success())
                            .count();
                        eprintln!("hqdmux: {failed} of {} VMs failed", report.vms.len());
                        ExitCode::from(1)
                    }
                }
                Err(e) => {
                    eprintln!("hqdmux: launch failed: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Check { config } => match FleetConfig::load(&config) {
            Ok(cfg) => {
                println!("{}: ok, {} VMs", config.display(), cfg.vm.len());
                print!("{}", cfg.gpu_summary());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("hqdmux: invalid config: {e}");
                ExitCode::from(2)
            }
        },
        Command::Sim(args) => vmm::simcmd::run(&args),
        Command::Ctl { socket, request } => match vmm::api::request(&socket, &request.join(" ")) {
            Ok(reply) => {
                print!("{reply}");
                if reply.starts_with("error:") {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => {
                eprintln!("hqdmux ctl: cannot reach {}: {e}", socket.display());
                ExitCode::from(2)
            }
        },
        Command::Images => {
            for name in images::names() {
                println!("builtin:{name}");
            }
            ExitCode::SUCCESS
        }
    }
}
