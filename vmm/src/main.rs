//! The `hqdmux` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use vmm::api::types::{PolicyName, PreemptTimeoutMs, Priority, QuantumMs, Weight};
use vmm::config::{ConfigError, FleetConfig, FleetNeeds, HostLimits};
use vmm::fleet::{run_fleet, RunOptions};
use vmm::vm::VmOutcome;

/// `run`: some VM failed (did not exit 0, was not stopped by the operator).
const EXIT_VM_FAILED: u8 = 1;
/// `run`, `check`: the config is invalid or the fleet cannot be launched.
const EXIT_LAUNCH: u8 = 2;

/// Printed after the top-level `--help`.
const AFTER_HELP: &str = "\
Logging: RUST_LOG sets what is logged on stderr (default `info`), e.g.
  RUST_LOG=debug hqdmux run FLEET.toml
  RUST_LOG=warn,vmm::fleet=debug hqdmux run FLEET.toml
  hqdmux --log-format json serve DEVICES.toml   (one JSON object per line)
Exit codes: 0 ok; 1 a VM failed (run: it did not exit 0 and was not stopped
by the operator) or the fleet refused the request (ps, stats, top, set, pause,
resume, stop, policy, add, unquarantine, metrics, timeline); 2 invalid config,
a launch that failed, bad arguments, the API socket unreachable or an output
file that cannot be written; 130/143 stopped by SIGINT/SIGTERM.
Operator guide (each code once): docs/operators.md#exit-codes";

/// Printed after `run --help`.
const RUN_AFTER_HELP: &str = "\
Summary columns (host wall-clock ms; `-` = no data): entry_ms and line_ms from
the launch to the guest's runtime entry and first console line; run_ms from
the VM's start to its outcome; gpu_ms p50/max from GPU work submitted to
completed; gpu_time = GPU time charged to the VM; preempt = preemptions of its
queues. RUST_LOG sets stderr logging (default `info`, e.g. RUST_LOG=debug).
Details: docs/operators.md";

/// `--version`: the package version and the git commit it was built from
/// (`unknown` without git, see build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("HQDMUX_GIT_COMMIT"),
    ")"
);

/// hqdmux: KVM VMs sharing a mediated AMD compute GPU by priority.
#[derive(Parser)]
#[command(version = VERSION, about, long_about = None, after_help = AFTER_HELP)]
struct Cli {
    /// Log lines on stderr as text, or as one JSON object per line (`ts`,
    /// `level`, `target`, `msg`, and `vm` when the line is about one).
    #[arg(long, global = true, value_enum, default_value_t = vmm::logfmt::LogFormat::Text)]
    log_format: vmm::logfmt::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Launch every VM of a fleet config, stream their consoles, wait for all
    /// of them (or the run timeout) and print a per-VM summary. Exits 1 if
    /// any VM failed (did not exit with status 0 and was not stopped by the
    /// operator), 2 if the config is invalid or the launch failed.
    /// SIGINT/SIGTERM stop every VM, print the summary, remove the control
    /// socket and exit 130/143; a second signal exits at once (one line, the
    /// socket removed). Summary columns: docs/operators.md.
    #[command(after_help = RUN_AFTER_HELP)]
    Run {
        /// Fleet config (TOML), e.g. examples/hello.toml.
        config: PathBuf,
        /// Do not echo guest consoles.
        #[arg(long, short)]
        quiet: bool,
        /// Override the config's run timeout (milliseconds, 1..=2592000000,
        /// as `[run] timeout_ms`).
        #[arg(long, value_parser = parse_timeout_ms)]
        timeout_ms: Option<u64>,
        /// Serve the operator HTTP/JSON API on this Unix socket while the
        /// fleet runs (steer it with `hqdmux ps|set|pause|...`, or curl
        /// --unix-socket; docs/api/openapi.json). Without PATH (put it after
        /// the config): the default socket the client commands use,
        /// $XDG_RUNTIME_DIR/hqdmux/api.sock, or /run/hqdmux/api.sock as
        /// root. Without the option: no API. Refuses to replace anything but
        /// a dead fleet's socket; removed on exit.
        #[arg(long, value_name = "PATH")]
        api_socket: Option<Option<PathBuf>>,
        /// Permission bits of the API socket file, octal.
        #[arg(long, value_name = "OCTAL", default_value = "600", value_parser = parse_mode)]
        api_socket_mode: u32,
        /// Print the final summary as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Own the GPU and serve each `[[vgpu]]` of DEVICES.toml as a vfio-user
    /// device on its socket (Cloud Hypervisor `--user-device`, QEMU
    /// `vfio-user-pci`, or a `[[vm]] gpu = { socket = ... }` of `hqdmux run`)
    /// until SIGINT/SIGTERM; a vGPU takes a new VMM after one disconnects.
    /// Exits 2 if the file is invalid or a socket is taken, 130/143 when stopped.
    Serve {
        /// Devices file (TOML): `[gpu]`, `[scheduler]`, `[[vgpu]]` entries
        /// (name, socket, priority, weight, partition, quantum_ms,
        /// preempt_timeout_ms, guard).
        config: PathBuf,
        /// Serve the operator API (metrics, timeline, stats, policy, vGPUs
        /// created, steered and removed live) on this Unix socket; without
        /// PATH, on the default socket (as `run`).
        #[arg(long, value_name = "PATH")]
        api_socket: Option<Option<PathBuf>>,
        /// Permission bits of the API socket file, octal.
        #[arg(long, value_name = "OCTAL", default_value = "600", value_parser = parse_mode)]
        api_socket_mode: u32,
        /// Directory of the sockets of vGPUs created over the API (default:
        /// the API socket's directory); a socket outside it is refused.
        #[arg(long, value_name = "DIR")]
        vgpu_socket_dir: Option<PathBuf>,
    },
    /// List the VMs of a running fleet: state, priority, weight, slice, GPU
    /// time, share of the last interval, preemptions, CWSR time, outcome.
    Ps(ClientArgs),
    /// One VM's figures (`stats VM`) or the fleet's (`stats`).
    Stats {
        #[command(flatten)]
        c: ClientArgs,
        /// VM name (none: the fleet summary).
        vm: Option<String>,
    },
    /// A live table of per-VM share, GPU time and preemptions, refreshed
    /// every `--interval-ms`; `--once` prints it once (for scripts).
    Top {
        #[command(flatten)]
        c: ClientArgs,
        /// Print once and exit.
        #[arg(long)]
        once: bool,
        /// Refresh period.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60000))]
        interval_ms: u64,
    },
    /// Change a running VM's GPU scheduling live (applies at once).
    Set {
        #[command(flatten)]
        c: ClientArgs,
        /// VM name.
        vm: String,
        /// GPU priority 0..=15 (higher wins).
        #[arg(long, value_parser = ranged::<Priority>)]
        priority: Option<Priority>,
        /// Weight 1..=1000 among equal priorities.
        #[arg(long, value_parser = ranged::<Weight>)]
        weight: Option<Weight>,
        /// Slice length 1..=10000 ms (0: back to the priority's quantum).
        #[arg(long, value_parser = parse_quantum_ms)]
        quantum_ms: Option<QuantumArg>,
        /// Preemption timeout 1..=3600000 ms.
        #[arg(long, value_parser = ranged::<PreemptTimeoutMs>)]
        preempt_timeout_ms: Option<PreemptTimeoutMs>,
    },
    /// Pause a VM's GPU work: CWSR-save its queues and hold them.
    Pause(VmArgs),
    /// Resume a paused VM's GPU work where it stopped.
    Resume(VmArgs),
    /// Stop one VM (its vCPUs, its queues); its figures are kept.
    Stop(VmArgs),
    /// Print the scheduling policy, or switch it (`policy fifo`).
    Policy {
        #[command(flatten)]
        c: ClientArgs,
        /// New policy: hqdmux, fifo, poll5ms, timeslice, reset.
        #[arg(value_parser = parse_policy)]
        policy: Option<PolicyName>,
    },
    /// Add and start a VM from a file holding one `[[vm]]` entry.
    Add {
        #[command(flatten)]
        c: ClientArgs,
        /// TOML file with one `[[vm]]` entry (as in a fleet config).
        file: PathBuf,
    },
    /// Create a vGPU on a running `hqdmux serve` (`POST /api/v1/vgpus`);
    /// prints it with its vfio-user socket. Exits 1 if refused (name taken,
    /// socket outside the vGPU socket directory or in use).
    VgpuAdd {
        #[command(flatten)]
        c: ClientArgs,
        /// vGPU name.
        name: String,
        /// Socket: a file name in the daemon's vGPU socket directory, or a
        /// path directly inside it (default NAME.sock there).
        #[arg(long)]
        socket: Option<String>,
        /// GPU priority 0..=15 (higher wins).
        #[arg(long, value_parser = ranged::<Priority>)]
        priority: Option<Priority>,
        /// Weight 1..=1000 among equal priorities.
        #[arg(long, value_parser = ranged::<Weight>)]
        weight: Option<Weight>,
        /// GPU partition (default: the scheduler picks).
        #[arg(long)]
        partition: Option<u32>,
        /// The daemon's GPU (`[[gpu]] id`) to serve it on (default: placed
        /// by entitlement, as an added VM is).
        #[arg(long)]
        gpu_id: Option<u32>,
        /// Slice length 1..=10000 ms (default: the priority's quantum).
        #[arg(long, value_parser = ranged::<vmm::api::types::QuantumMs>)]
        quantum_ms: Option<vmm::api::types::QuantumMs>,
        /// Preemption timeout 1..=3600000 ms.
        #[arg(long, value_parser = ranged::<vmm::api::types::PreemptTimeoutMs>)]
        preempt_timeout_ms: Option<vmm::api::types::PreemptTimeoutMs>,
        /// Offer BAR2 as an mmap-able doorbell page (scanned every 100 us
        /// while the vGPU has a queue loaded).
        #[arg(long)]
        doorbell_page: bool,
    },
    /// Remove a vGPU of a running `hqdmux serve` (`DELETE
    /// /api/v1/vgpus/NAME`): its client is disconnected, its queues released
    /// as a dying VM's, its socket removed.
    VgpuRm(VmArgs),
    /// Lift a VM's misbehaving-VM guard quarantine (its queues may load
    /// again) and forget its counts in the window. Exits 0 also when it was
    /// not quarantined (the answer's `was_quarantined` says so).
    Unquarantine(VmArgs),
    /// Check the scheduler's promise on a running fleet: reads every VM's
    /// counters, waits `--window`, reads them again and says per VM whether
    /// it got its entitlement (the water-filling of docs/scheduling.md:
    /// strict priority across levels, weighted max-min within) and why
    /// not. Exits 0 when it held for every VM, 1 when not, 2 on usage
    /// errors or an unreachable socket.
    Promise {
        #[command(flatten)]
        c: ClientArgs,
        /// Window: `10s`, `500ms`, `2m` (a bare number is seconds),
        /// 100ms..=1h.
        #[arg(long, default_value = "10s", value_parser = parse_window)]
        window: std::time::Duration,
    },
    /// Print the fleet's Prometheus metrics (`GET /metrics`, text format;
    /// families in docs/metrics.md).
    Metrics {
        /// The `--api-socket` path of `hqdmux run` (default as for `ps`).
        #[arg(long, value_name = "PATH")]
        api_socket: Option<PathBuf>,
    },
    /// Save the HQD-slot timeline of the last N seconds of a running fleet:
    /// a Gantt chart per slot and per VM, coloured by VM, preemptions and
    /// CWSR marked (SVG, rendered here), or its JSON model (`-o x.json` or
    /// `--json`).
    Timeline {
        /// The `--api-socket` path of `hqdmux run` (default as for `ps`).
        #[arg(long, value_name = "PATH")]
        api_socket: Option<PathBuf>,
        /// Output file (.svg, or .json for the JSON model).
        #[arg(long, short, value_name = "FILE")]
        output: PathBuf,
        /// Window: the last N seconds, 1..=120.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=120))]
        seconds: u64,
        /// Write the JSON model whatever the file name.
        #[arg(long)]
        json: bool,
        /// Which GPU's timeline (`[[gpu]] id`; default: the first GPU with VMs).
        #[arg(long, value_name = "ID", value_parser = clap::value_parser!(u32).range(0..64))]
        gpu_id: Option<u32>,
    },
    /// Check a fleet config without launching anything: fields, images
    /// (regular ELF files no larger than the VM's RAM) and whether this host
    /// has the open files and memory to start it. Exits 2 if not.
    Check {
        /// Fleet config (TOML).
        config: PathBuf,
    },
    /// Describe the guest images built into this binary and their `args`;
    /// with `--write builtin:NAME -o FILE`, write that image as an ELF file
    /// that Cloud Hypervisor (`--kernel FILE --cmdline "ARGS"`) and QEMU
    /// (`-kernel FILE -append "ARGS"`) boot through its PVH entry.
    Images {
        /// The built-in image to write, `builtin:NAME` (or just `NAME`).
        #[arg(long, value_name = "builtin:NAME", requires = "output")]
        write: Option<String>,
        /// Where `--write` puts the image (replaced if it exists).
        #[arg(long, short, value_name = "FILE", requires = "write")]
        output: Option<PathBuf>,
    },
    /// Print a shell completion script, e.g.
    /// `hqdmux completions bash > /etc/bash_completion.d/hqdmux`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) of hqdmux, or of one subcommand, e.g.
    /// `hqdmux man > /usr/local/share/man/man1/hqdmux.1` or
    /// `hqdmux man run | man -l -`.
    Man {
        /// A subcommand (its page is `hqdmux-SUBCOMMAND(1)`); none: the
        /// main page, which lists every subcommand.
        subcommand: Option<String>,
    },
    /// Evaluate scheduling policies on a scenario in virtual time over the
    /// simulated GPU (no KVM needed): a policy x metric table, or JSON.
    Sim(vmm::simcmd::SimArgs),
}

/// Options of every API client command.
#[derive(clap::Args)]
struct ClientArgs {
    /// The `--api-socket` path of `hqdmux run` (default:
    /// $XDG_RUNTIME_DIR/hqdmux/api.sock, or /run/hqdmux/api.sock as root).
    #[arg(long, value_name = "PATH")]
    api_socket: Option<PathBuf>,
    /// Print the API's JSON answer instead of a table.
    #[arg(long)]
    json: bool,
}

/// A client command on one VM.
#[derive(clap::Args)]
struct VmArgs {
    #[command(flatten)]
    c: ClientArgs,
    /// VM name.
    vm: String,
}

/// An integer option read as the API's type `T` reads it (same range, same
/// reason).
fn ranged<T: serde::de::DeserializeOwned + Send + Sync + Clone + 'static>(
    s: &str,
) -> Result<T, String> {
    let n: u64 = s
        .parse()
        .map_err(|e| format!("expected a non-negative integer: {e}"))?;
    serde_json::from_value(serde_json::Value::from(n)).map_err(|e| e.to_string())
}

/// `--quantum-ms`: 0 returns to the priority level's quantum.
fn parse_quantum_ms(s: &str) -> Result<QuantumArg, String> {
    match s {
        "0" => Ok(QuantumArg(None)),
        _ => ranged::<QuantumMs>(s).map(|q| QuantumArg(Some(q))),
    }
}

/// `--quantum-ms`: a slice, or `None` (0) for the priority level's quantum
/// (a type of its own: clap reads `Option<Option<_>>` as an optional value).
#[derive(Clone, Copy, Debug)]
struct QuantumArg(Option<QuantumMs>);

/// The line a refused config prints: control bytes of the file's values
/// (a VM name) escaped, so the error cannot drive the terminal; a TOML
/// error keeps its lines and caret.
fn invalid_config(e: &ConfigError) -> String {
    format!(
        "hqdmux: invalid config: {}",
        vmm::cli::escape_lines(&e.to_string())
    )
}

/// `--window`: `N`, `Ns`, `Nms`, `Nm` or `Nh`, 100 ms..=1 h.
fn parse_window(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (n, unit_ms) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60_000)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3_600_000)
    } else {
        (t, 1000)
    };
    let n: u64 = n
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (10s, 500ms, 2m, 1h)"))?;
    let ms = n
        .checked_mul(unit_ms)
        .filter(|ms| (100..=3_600_000).contains(ms))
        .ok_or_else(|| format!("'{s}' is out of range 100ms..=1h"))?;
    Ok(std::time::Duration::from_millis(ms))
}

/// A policy name.
fn parse_policy(s: &str) -> Result<PolicyName, String> {
    serde_json::from_value(serde_json::Value::from(s)).map_err(|e| e.to_string())
}

/// `--api-socket-mode`: octal permission bits.
fn parse_mode(s: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(s, 8).map_err(|e| format!("expected octal digits: {e}"))?;
    if m > 0o777 {
        return Err(format!("{s}: permission bits are at most 777"));
    }
    Ok(m)
}

/// `--timeout-ms`: validated exactly as `[run] timeout_ms`.
fn parse_timeout_ms(s: &str) -> Result<u64, String> {
    let ms: u64 = s
        .parse()
        .map_err(|e| format!("expected milliseconds as an integer: {e}"))?;
    vmm::config::check_timeout_ms(ms)?;
    Ok(ms)
}

/// Loads a config and checks that this host can start it (raising the
/// open-files limit first, as `run` does).
fn load_for_host(config: &std::path::Path) -> Result<(FleetConfig, FleetNeeds), ConfigError> {
    let cfg = FleetConfig::load(config)?;
    if let Err(e) = vmm::config::raise_open_files_limit() {
        log::warn!("cannot read the open-files limit: {e}");
    }
    let needs = cfg.check_host(config, &HostLimits::probe())?;
    Ok((cfg, needs))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    vmm::logfmt::init(cli.log_format);
    match cli.command {
        Command::Serve {
            config,
            api_socket,
            api_socket_mode,
            vgpu_socket_dir,
        } => {
            let stop = match vmm::signals::install() {
                Ok(s) => Some(s),
                Err(e) => {
                    eprintln!("hqdmux: cannot install SIGINT/SIGTERM handlers: {e}");
                    return ExitCode::from(2);
                }
            };
            let cfg = match vmm::serve::DevicesConfig::load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{}", invalid_config(&e));
                    return ExitCode::from(2);
                }
            };
            let api_socket = match vmm::cli::server_socket(api_socket) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("hqdmux serve: {e}");
                    return ExitCode::from(2);
                }
            };
            let opts = vmm::serve::ServeOptions {
                api_socket,
                api_socket_mode: Some(api_socket_mode),
                vgpu_socket_dir,
                stop,
            };
            match vmm::serve::run_serve(&cfg, opts) {
                Ok(r) => {
                    for (name, s) in &r.vgpus {
                        println!(
                            "vgpu {name}: {} connections, {} doorbells, {} resets, {} error replies, {} dropped",
                            s.connections, s.doorbells, s.resets, s.error_replies, s.dropped
                        );
                    }
                    println!(
                        "gpu: {} packets completed, {} maps, {} preemptions",
                        r.gpu.completions, r.gpu.maps, r.gpu.preemptions
                    );
                    if let Some(vms) = &r.vms {
                        print!("{}", vms.summary());
                    }
                    let sig = vmm::signals::received().unwrap_or(libc_sigterm());
                    ExitCode::from(vmm::signals::exit_code(sig))
                }
                Err(e) => {
                    eprintln!("hqdmux: serve: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Run {
            config,
            quiet,
            timeout_ms,
            api_socket,
            api_socket_mode,
            json,
        } => {
            // Before anything runs: a signal from here on stops the fleet
            // gracefully (at once if it arrives before the VMs start).
            let stop = match vmm::signals::install() {
                Ok(s) => Some(s),
                Err(e) => {
                    log::warn!("cannot install SIGINT/SIGTERM handlers: {e}");
                    None
                }
            };
            let mut cfg = match load_for_host(&config) {
                Ok((c, _)) => c,
                Err(e) => {
                    eprintln!("{}", invalid_config(&e));
                    return ExitCode::from(EXIT_LAUNCH);
                }
            };
            if timeout_ms.is_some() {
                cfg.run.timeout_ms = timeout_ms;
            }
            let api_socket = match vmm::cli::server_socket(api_socket) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("hqdmux run: {e}");
                    return ExitCode::from(EXIT_LAUNCH);
                }
            };
            match run_fleet(
                &cfg,
                RunOptions {
                    echo: !quiet,
                    api_socket,
                    stop,
                    api_socket_mode: Some(api_socket_mode),
                },
            ) {
                Ok(report) => {
                    // An unwritable summary (`| head`, `> /dev/full`) does
                    // not change how the run ended, only what is printed.
                    let _ = if json {
                        vmm::out!(
                            "{}\n",
                            serde_json::to_string_pretty(&report.to_json()).unwrap_or_default()
                        )
                    } else {
                        vmm::out!("{}", report.summary())
                    };
                    if let (true, Some(sig)) = (report.stop_requested, vmm::signals::received()) {
                        eprintln!(
                            "hqdmux: stopped by {}: {} of {} VMs were still running",
                            vmm::signals::name(sig),
                            report
                                .vms
                                .iter()
                                .filter(|v| {
                                    matches!(&v.outcome, VmOutcome::Stopped(why) if *why == vmm::signals::name(sig))
                                })
                                .count(),
                            report.vms.len()
                        );
                        return ExitCode::from(vmm::signals::exit_code(sig));
                    }
                    match report.failures() {
                        0 => ExitCode::SUCCESS,
                        failed => {
                            eprintln!("hqdmux: {failed} of {} VMs failed", report.vms.len());
                            ExitCode::from(EXIT_VM_FAILED)
                        }
                    }
                }
                Err(e) => {
                    eprintln!("hqdmux: launch failed: {e}");
                    match vmm::signals::received() {
                        Some(sig) => ExitCode::from(vmm::signals::exit_code(sig)),
                        None => ExitCode::from(EXIT_LAUNCH),
                    }
                }
            }
        }
        Command::Check { config } => match load_for_host(&config) {
            Ok((cfg, needs)) => {
                let host = HostLimits::probe();
                vmm::cli::done(vmm::out!(
                    "{}: ok, {} VMs\n{}host: needs about {} open files (limit {}), {} MiB guest RAM (available {})\n",
                    config.display(),
                    cfg.vm.len(),
                    cfg.gpu_summary(),
                    needs.open_files,
                    host.open_files,
                    needs.memory_bytes >> 20,
                    host.mem_available
                        .map(|b| format!("{} MiB", b >> 20))
                        .unwrap_or_else(|| "unknown".into())
                ))
            }
            Err(e) => {
                eprintln!("{}", invalid_config(&e));
                ExitCode::from(EXIT_LAUNCH)
            }
        },
        Command::Sim(args) => vmm::simcmd::run(&args),
        Command::Ps(c) => with_socket("ps", c.api_socket, |s| vmm::cli::ps(&s, c.json)),
        Command::Stats { c, vm } => with_socket("stats", c.api_socket, |s| {
            vmm::cli::stats(&s, vm.as_deref(), c.json)
        }),
        Command::Top {
            c,
            once,
            interval_ms,
        } => with_socket("top", c.api_socket, |s| {
            vmm::cli::top(
                &s,
                once,
                std::time::Duration::from_millis(interval_ms),
                c.json,
            )
        }),
        Command::Set {
            c,
            vm,
            priority,
            weight,
            quantum_ms,
            preempt_timeout_ms,
        } => with_socket("set", c.api_socket, |s| {
            vmm::cli::set(
                &s,
                &vm,
                vmm::cli::SetFields {
                    priority,
                    weight,
                    quantum_ms: quantum_ms.map(|q| q.0),
                    preempt_timeout_ms,
                },
                c.json,
            )
        }),
        Command::Pause(a) => with_socket("pause", a.c.api_socket, |s| {
            vmm::cli::vm_action(&s, "pause", &a.vm, a.c.json)
        }),
        Command::Resume(a) => with_socket("resume", a.c.api_socket, |s| {
            vmm::cli::vm_action(&s, "resume", &a.vm, a.c.json)
        }),
        Command::Stop(a) => with_socket("stop", a.c.api_socket, |s| {
            vmm::cli::vm_action(&s, "stop", &a.vm, a.c.json)
        }),
        Command::Policy { c, policy } => with_socket("policy", c.api_socket, |s| {
            vmm::cli::policy(&s, policy, c.json)
        }),
        Command::Add { c, file } => {
            with_socket("add", c.api_socket, |s| vmm::cli::add(&s, &file, c.json))
        }
        Command::VgpuAdd {
            c,
            name,
            socket,
            priority,
            weight,
            partition,
            gpu_id,
            quantum_ms,
            preempt_timeout_ms,
            doorbell_page,
        } => with_socket("vgpu-add", c.api_socket, |s| {
            let body = vmm::api::types::VgpuCreate {
                name: name.clone(),
                socket: socket.clone(),
                priority,
                weight,
                partition,
                gpu_id,
                quantum_ms,
                preempt_timeout_ms,
                guard: None,
                doorbell_page: doorbell_page.then_some(true),
            };
            vmm::cli::vgpu_add(&s, &body, c.json)
        }),
        Command::VgpuRm(a) => with_socket("vgpu-rm", a.c.api_socket, |s| {
            vmm::cli::vgpu_rm(&s, &a.vm, a.c.json)
        }),
        Command::Unquarantine(a) => with_socket("unquarantine", a.c.api_socket, |s| {
            vmm::cli::unquarantine(&s, &a.vm, a.c.json)
        }),
        Command::Promise { c, window } => with_socket("promise", c.api_socket, |s| {
            vmm::cli::promise(&s, window, c.json)
        }),
        Command::Metrics { api_socket } => {
            with_socket("metrics", api_socket, |s| vmm::cli::metrics(&s))
        }
        Command::Timeline {
            api_socket,
            output,
            seconds,
            json,
            gpu_id,
        } => with_socket("timeline", api_socket, |s| {
            vmm::cli::timeline(&s, &output, seconds, json, gpu_id)
        }),
        Command::Man { subcommand } => man_page(subcommand.as_deref()),
        Command::Images {
            write: Some(name),
            output: Some(path),
        } => write_image(&name, &path),
        Command::Images { .. } => vmm::cli::done(vmm::out!("{}", describe_images())),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "hqdmux",
                &mut script,
            );
            vmm::cli::done(vmm::out!("{}", String::from_utf8_lossy(&script)))
        }
    }
}

/// Runs client command `cmd` on its socket (`given`, else the default).
fn with_socket(cmd: &str, given: Option<PathBuf>, f: impl FnOnce(PathBuf) -> ExitCode) -> ExitCode {
    match vmm::cli::client_socket(cmd, given) {
        Ok(s) => f(s),
        Err(c) => c,
    }
}

/// `hqdmux man [SUBCOMMAND]`: the roff page rendered from the clap
/// definition (`clap_mangen`); exit 2 for an unknown subcommand.
fn man_page(sub: Option<&str>) -> ExitCode {
    let cmd = <Cli as clap::CommandFactory>::command();
    let (page, title) = match sub {
        None => (cmd, "hqdmux".to_owned()),
        Some(name) => match cmd.find_subcommand(name) {
            Some(c) => {
                // clap names are `&'static str` (no `string` feature): one
                // small leak in a process about to exit.
                let page: &'static str = Box::leak(format!("hqdmux-{name}").into_boxed_str());
                (
                    c.clone()
                        .name(page)
                        .bin_name(format!("hqdmux {name}"))
                        .version(VERSION),
                    page.to_owned(),
                )
            }
            None => {
                eprintln!(
                    "hqdmux man: no subcommand '{}' (hqdmux --help lists them)",
                    vmm::cli::escape(name)
                );
                return ExitCode::from(EXIT_LAUNCH);
            }
        },
    };
    let mut roff = Vec::new();
    if let Err(e) = clap_mangen::Man::new(page).title(title).render(&mut roff) {
        eprintln!("hqdmux man: {e}");
        return ExitCode::from(EXIT_LAUNCH);
    }
    vmm::cli::done(vmm::out!("{}", String::from_utf8_lossy(&roff)))
}

/// `hqdmux images --write builtin:NAME -o FILE`: writes the embedded ELF
/// (checked to carry its PVH entry note) to `path`; exit 2 on an unknown
/// name or a file that cannot be written.
fn write_image(name: &str, path: &Path) -> ExitCode {
    let bare = name.strip_prefix("builtin:").unwrap_or(name);
    let Some(elf) = images::builtin(bare) else {
        let known: Vec<_> = images::names().map(|n| format!("builtin:{n}")).collect();
        eprintln!(
            "hqdmux images: no built-in image {name:?} (built in: {})",
            known.join(", ")
        );
        return ExitCode::from(EXIT_LAUNCH);
    };
    let pvh = match images::elf::pvh_entry(elf) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hqdmux images: builtin:{bare} is not PVH-bootable: {e}");
            return ExitCode::from(EXIT_LAUNCH);
        }
    };
    if let Err(e) = std::fs::write(path, elf) {
        eprintln!("hqdmux images: cannot write {}: {e}", path.display());
        return ExitCode::from(EXIT_LAUNCH);
    }
    vmm::cli::done(vmm::out!(
        "wrote builtin:{bare} to {} ({} bytes, PVH entry {pvh:#x})\n",
        path.display(),
        elf.len()
    ))
}

/// `hqdmux images`: each built-in image, what it does, its `args` keys and
/// exit statuses.
fn describe_images() -> String {
    let mut s = String::from(
        "Built-in guest images (image = \"builtin:NAME\"; args = \"key=value key=value\"):\n\
         (each also boots in Cloud Hypervisor and QEMU through its PVH entry, the args as\n\
         the kernel command line: hqdmux images --write builtin:NAME -o FILE)\n",
    );
    for name in images::names() {
        s += &format!("\nbuiltin:{name}\n");
        match images::describe(name) {
            Some(info) => {
                s += &format!("  {}\n", info.summary);
                if !info.args.is_empty() {
                    s += "  args:\n";
                    for (key, what) in info.args {
                        s += &format!("    {key:<12} {what}\n");
                    }
                }
                s += &format!("  exit status: {}\n", info.exit);
            }
            None => s += "  (no description)\n",
        }
    }
    s
}

/// SIGTERM's number (the exit code of a serve run that ended without a
/// recorded signal).
fn libc_sigterm() -> i32 {
    15
}

#[cfg(test)]
mod tests {
    use super::{invalid_config, parse_window};
    use std::path::Path;
    use std::time::Duration;
    use vmm::config::FleetConfig;

    #[test]
    fn a_config_error_escapes_control_bytes_of_a_vm_name() {
        let text = "[[vm]]\nname = \"x\\u001b[31m\"\nimage = \"builtin:hello\"\n";
        let e = FleetConfig::parse(text, Path::new("f.toml")).unwrap_err();
        // The name is escaped where the error is made, and again on the
        // line printed: no raw control byte reaches the terminal.
        assert!(!e.to_string().contains('\u{1b}'), "{e}");
        let line = invalid_config(&e);
        assert!(!line.contains('\u{1b}'), "{line:?}");
        assert!(line.contains("\\u{1b}[31m"), "{line:?}");
        // A TOML error keeps its lines (the caret under the column).
        let e = FleetConfig::parse("[[vm]\n", Path::new("f.toml")).unwrap_err();
        assert!(invalid_config(&e).contains('\n'), "{e}");
    }

    #[test]
    fn windows_take_every_unit_their_range_is_written_in() {
        assert_eq!(parse_window("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_window("60m"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_window("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_window("10"), Ok(Duration::from_secs(10)));
        assert!(parse_window("2h").unwrap_err().contains("out of range"));
        assert!(parse_window("99ms").unwrap_err().contains("out of range"));
        assert!(parse_window("5x").unwrap_err().contains("not a duration"));
        assert!(parse_window("18446744073709551615h")
            .unwrap_err()
            .contains("out of range"));
    }
}
