//! Soak (issue 11, item 7; not in CI): a KVM fleet for N minutes mixing
//! well-behaved `builtin:gpu` guests that verify every workgroup counter
//! exactly, hostile guests (a stalled queue, a doorbell flooder, a
//! workgroup flooder, a hung non-preemptible kernel, queues blocked on
//! barriers nobody meets for seconds and a guest re-submitting an
//! unpreemptable kernel after every reset (issue 21), bad ring / kernarg /
//! write-index / signal / mailbox addresses, guests that triple-fault or
//! exit with work in flight), live operator changes through the HTTP API
//! (priority, weight, quantum, preemption-timeout PATCHes, pause/resume,
//! clear-quarantine, VMs added with `POST /api/v1/vms` and stopped with
//! `POST .../stop`). Guests are short-lived: the soak re-launches VMs to
//! keep the fleet populated. It samples this process's RSS and open fds,
//! counts host panics (a panic hook, and the arbiter's "host bug" log
//! lines) and prints a summary table and a last line
//! `soak: ok=... lost=0 dup=0 ... rss_growth_kib=...`.
//!
//! ```text
//! cargo run --release -p hqdmux-tests --example soak -- --minutes 10
//! ```
//!
//! Options: `--minutes M` (10; fractions allowed), `--good N` (3 good VMs
//! kept running), `--hostile N` (3 hostile VMs kept running), `--seed S`
//! (1), `--log-warnings` (echo host warnings on stderr). Exit status 0 when
//! every good VM that was not stopped verified exactly, no effect was lost
//! or duplicated, every hostile VM ended as its kind expects and the host
//! did not panic; 1 otherwise.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use vmm::vm::VmOutcome;

// ---- host log and panic counters -------------------------------------------

static PANICS: AtomicU64 = AtomicU64::new(0);
static LOG_BY_LEVEL: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
static HOST_BUGS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static ECHO_WARNINGS: AtomicU64 = AtomicU64::new(0);

struct Counter;

impl log::Log for Counter {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        LOG_BY_LEVEL[r.level() as usize].fetch_add(1, Ordering::Relaxed);
        if r.level() <= log::Level::Warn && ECHO_WARNINGS.load(Ordering::Relaxed) != 0 {
            eprintln!("{} {}", r.level(), r.args());
        }
        if r.level() == log::Level::Error {
            let line = r.args().to_string();
            if line.contains("panicked") || line.contains("host bug") {
                let mut b = HOST_BUGS.lock().unwrap_or_else(|e| e.into_inner());
                if b.len() < 50 {
                    b.push(line);
                }
            }
        }
    }
    fn flush(&self) {}
}

/// Resident set size of this process (kB, `/proc/self/status` VmRSS).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Mappings of memfd-backed memory (guest RAM) in this process: how many
/// and their resident kB (`/proc/self/smaps`).
fn memfd_mappings() -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string("/proc/self/smaps") else {
        return (0, 0);
    };
    let (mut n, mut kb, mut inside) = (0, 0, false);
    for l in text.lines() {
        let first = l.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            inside = l.contains("/memfd:");
            n += u64::from(inside);
        } else if inside {
            if let Some(v) = l.strip_prefix("Rss:") {
                kb += v
                    .split_whitespace()
                    .next()
                    .and_then(|x| x.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    (n, kb)
}

/// Open file descriptors of this process.
fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

// ---- HTTP over the API socket ------------------------------------------------

/// One request on a fresh connection: status and JSON body (`Null` if the
/// body is not JSON). `None` when the socket does not answer.
fn request(
    sock: &Path,
    method: &str,
    path: &str,
    body: Option<(&str, &str)>,
) -> Option<(u16, Value)> {
    let mut s = UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let raw = match body {
        Some((ct, b)) => format!(
            "{method} {path} HTTP/1.1\r\nHost: soak\r\nConnection: close\r\nContent-Type: {ct}\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        ),
        None => format!("{method} {path} HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n"),
    };
    s.write_all(raw.as_bytes()).ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

// ---- tenants -----------------------------------------------------------------

/// What a soak VM does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    Good,
    Stall,
    DbFlood,
    WgFlood,
    Hang,
    BadRing,
    BadKernarg,
    BadWptr,
    BadSignal,
    BadMailbox,
    Triple,
    Exit,
    Barrier,
    Rehang,
}

const HOSTILE: [Kind; 13] = [
    Kind::Stall,
    Kind::DbFlood,
    Kind::WgFlood,
    Kind::Hang,
    Kind::BadRing,
    Kind::BadKernarg,
    Kind::BadWptr,
    Kind::BadSignal,
    Kind::BadMailbox,
    Kind::Triple,
    Kind::Exit,
    Kind::Barrier,
    Kind::Rehang,
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Good => "good",
            Kind::Stall => "stall",
            Kind::DbFlood => "dbflood",
            Kind::WgFlood => "wgflood",
            Kind::Hang => "hang",
            Kind::BadRing => "bad-ring",
            Kind::BadKernarg => "bad-kernarg",
            Kind::BadWptr => "bad-wptr",
            Kind::BadSignal => "bad-signal",
            Kind::BadMailbox => "bad-mailbox",
            Kind::Triple => "triple",
            Kind::Exit => "exit",
            Kind::Barrier => "barrier",
            Kind::Rehang => "rehang",
        }
    }

    /// The `[[vm]]` entry of VM `name` of this kind.
    fn toml(self, name: &str, rng: &mut Rng) -> String {
        let (args, extra) = match self {
            Kind::Good => (
                format!(
                    "kernels={} wgs=304 cost_us={} loops={}",
                    rng.range(2, 6),
                    rng.range(100, 2000),
                    rng.range(2, 8)
                ),
                String::new(),
            ),
            Kind::Stall => (
                "kernels=1 wgs=1 cost_us=1 bad=stall hold=50000".into(),
                String::new(),
            ),
            Kind::DbFlood => (
                "kernels=1 wgs=1 cost_us=1 bad=dbflood hold=200000 flood=2000".into(),
                // Low enough that the storm quarantines it.
                "guard = { max_stale_doorbells = 20000 }\n".into(),
            ),
            Kind::WgFlood => (
                "kernels=1 wgs=1 cost_us=1 bad=wgflood".into(),
                String::new(),
            ),
            Kind::Hang => (
                "kernels=1 wgs=64 cost_us=100 bad=hang".into(),
                format!("preempt_timeout_ms = {}\n", rng.range(50, 400)),
            ),
            Kind::BadRing => (
                "kernels=2 wgs=64 cost_us=100 bad=ring".into(),
                String::new(),
            ),
            Kind::BadKernarg => (
                "kernels=2 wgs=64 cost_us=100 bad=kernarg".into(),
                String::new(),
            ),
            Kind::BadWptr => (
                "kernels=2 wgs=64 cost_us=100 bad=wptr".into(),
                String::new(),
            ),
            Kind::BadSignal => (
                "kernels=2 wgs=64 cost_us=100 bad=signal".into(),
                String::new(),
            ),
            Kind::BadMailbox => (
                "kernels=2 wgs=64 cost_us=100 bad=mailbox".into(),
                String::new(),
            ),
            Kind::Triple => (
                "kernels=2 wgs=304 cost_us=100000 die=triple".into(),
                String::new(),
            ),
            Kind::Exit => (
                "kernels=2 wgs=304 cost_us=100000 die=exit".into(),
                String::new(),
            ),
            // Their own image and arguments (below).
            Kind::Barrier | Kind::Rehang => (String::new(), String::new()),
        };
        if self == Kind::Barrier {
            // The hostile guest, not `gpu`: queues blocked on barriers its
            // CPU meets after a while (no doorbell), each kernel behind
            // them verified exactly.
            return format!(
                "name = \"{name}\"\nimage = \"builtin:hostile\"\nmemory_mib = 2048\ngpu = true\npriority = {}\nargs = \"mode=barrier queues={} wgs=64 ms={}\"\n",
                rng.range(2, 12),
                rng.range(1, 8),
                rng.range(500, 5000)
            );
        }
        if self == Kind::Rehang {
            // Re-submits an unpreemptable kernel after every reset until
            // the guard refuses its reload or 0.5-5 s pass.
            return format!(
                "name = \"{name}\"\nimage = \"builtin:hostile\"\nmemory_mib = 512\ngpu = true\npriority = {}\npreempt_timeout_ms = {}\nargs = \"mode=rehang wgs=64 ms={}\"\n",
                rng.range(2, 12),
                rng.range(50, 400),
                rng.range(500, 5000)
            );
        }
        format!(
            "name = \"{name}\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\npriority = {}\nargs = \"{args}\"\n{extra}",
            rng.range(2, 12)
        )
    }

    /// Whether a VM of this kind that ended by itself ended as expected.
    fn expected(self, outcome: &VmOutcome) -> bool {
        match self {
            Kind::Good
            | Kind::Stall
            | Kind::DbFlood
            | Kind::WgFlood
            | Kind::Barrier
            | Kind::Rehang => *outcome == VmOutcome::Exited(0),
            Kind::Hang
            | Kind::BadRing
            | Kind::BadKernarg
            | Kind::BadWptr
            | Kind::BadSignal
            | Kind::BadMailbox => *outcome == VmOutcome::Exited(2),
            Kind::Triple => matches!(outcome, VmOutcome::TripleFault { .. }),
            Kind::Exit => *outcome == VmOutcome::Exited(5),
        }
    }
}

/// xorshift64*: deterministic operator choices from `--seed`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

// ---- options -----------------------------------------------------------------

struct Opts {
    minutes: f64,
    good: usize,
    hostile: usize,
    seed: u64,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        minutes: 10.0,
        good: 3,
        hostile: 3,
        seed: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--minutes" => {
                o.minutes = val("--minutes")?
                    .parse()
                    .map_err(|e| format!("--minutes: {e}"))?
            }
            "--good" => o.good = val("--good")?.parse().map_err(|e| format!("--good: {e}"))?,
            "--hostile" => {
                o.hostile = val("--hostile")?
                    .parse()
                    .map_err(|e| format!("--hostile: {e}"))?
            }
            "--seed" => o.seed = val("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--log-warnings" => ECHO_WARNINGS.store(1, Ordering::Relaxed),
            "-h" | "--help" => return Err(
                "usage: soak [--minutes M] [--good N] [--hostile N] [--seed S] [--log-warnings]"
                    .into(),
            ),
            _ => return Err(format!("unknown option {a}")),
        }
    }
    if !(o.minutes > 0.0 && o.minutes <= 24.0 * 60.0) {
        return Err("--minutes must be in (0, 1440]".into());
    }
    Ok(o)
}

// ---- the soak ----------------------------------------------------------------

/// A VM the soak launched.
struct Launched {
    kind: Kind,
    /// Stopped by the soak (operator kill or end of the run).
    stopped: bool,
    ended: bool,
    paused_until: Option<Instant>,
    quarantined_seen: bool,
    /// Its view's GPU time and queue errors by code, taken the first time
    /// it was seen ended (the API keeps only the last ended VMs' views).
    ended_view: Option<(f64, Vec<(String, u64)>)>,
}

/// The figures of an ended VM's view the summary uses.
fn ended_figures(v: &Value) -> (f64, Vec<(String, u64)>) {
    let errors = v["queue_errors_by_code"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(c, n)| (c.clone(), n.as_u64().unwrap_or(0)))
        .collect();
    (v["gpu_time_ms"].as_f64().unwrap_or(0.0), errors)
}

/// Per-kind totals of the summary.
#[derive(Default)]
struct KindTotals {
    runs: u64,
    expected: u64,
    unexpected: u64,
    killed: u64,
    quarantined: u64,
    errors_by_code: BTreeMap<String, u64>,
    gpu_ms: f64,
}

/// Operator requests by kind: (answered 2xx, refused).
#[derive(Default)]
struct Ops {
    by_op: BTreeMap<&'static str, (u64, u64)>,
    unanswered: u64,
}

impl Ops {
    fn note(&mut self, name: &'static str, r: Option<(u16, Value)>) {
        let e = self.by_op.entry(name).or_default();
        match r {
            Some((s, _)) if (200..300).contains(&s) => e.0 += 1,
            Some(_) => e.1 += 1,
            None => self.unanswered += 1,
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn main() {
    let opts = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    static COUNTER: Counter = Counter;
    let _ = log::set_logger(&COUNTER);
    log::set_max_level(log::LevelFilter::Info);
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));
    if !vmm::kvm_or_skip("soak") {
        std::process::exit(2);
    }
    let _ = vmm::config::raise_open_files_limit();
    let code = soak(&opts);
    std::process::exit(code);
}

fn soak(opts: &Opts) -> i32 {
    let mut rng = Rng(opts.seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let dir: PathBuf = std::env::temp_dir().join(format!("hqdmux-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let sock = dir.join("api.sock");
    let rss_before = rss_kib();
    let fds_before = open_fds();
    // The anchor keeps the fleet alive between launches (it halts, no CPU).
    let toml = "[[vm]]\nname = \"anchor\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\nargs = \"kernels=1 wgs=1 cost_us=1 die=idle\"\n";
    let cfg = vmm::config::FleetConfig::parse(toml, &dir.join("fleet.toml")).expect("soak config");
    let ropts = vmm::fleet::RunOptions {
        api_socket: Some(sock.clone()),
        ..Default::default()
    };
    let fleet = std::thread::spawn(move || vmm::fleet::run_fleet(&cfg, ropts));
    let t0 = Instant::now();
    while UnixStream::connect(&sock).is_err() {
        if t0.elapsed() > Duration::from_secs(60) {
            eprintln!("soak: no API socket after 60 s");
            return 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    let duration = Duration::from_secs_f64(opts.minutes * 60.0);
    let start = Instant::now();
    let mut vms: HashMap<String, Launched> = HashMap::new();
    let mut seq = 0u64;
    let mut next_hostile = 0usize;
    // (s, rss kB, fds, live VMs, VMs ended so far)
    let mut samples: Vec<(f64, u64, u64, usize, u64)> = Vec::new();
    let mut next_sample = start;
    let mut next_action = start + Duration::from_millis(500);
    let mut ops = Ops::default();

    while start.elapsed() < duration {
        let now = Instant::now();
        // Views of every VM: ends, quarantines.
        if let Some((200, list)) = request(&sock, "GET", "/api/v1/vms", None) {
            for v in list["vms"].as_array().into_iter().flatten() {
                let Some(l) = v["name"].as_str().and_then(|n| vms.get_mut(n)) else {
                    continue;
                };
                let state = v["state"].as_str().unwrap_or("");
                if matches!(state, "exited" | "stopped" | "failed") {
                    l.ended = true;
                    if l.ended_view.is_none() {
                        l.ended_view = Some(ended_figures(v));
                    }
                }
                if v["quarantined"] == Value::Bool(true) {
                    l.quarantined_seen = true;
                }
            }
        } else {
            ops.unanswered += 1;
        }
        // Keep the fleet populated.
        let live = |k: bool| {
            vms.values()
                .filter(|l| !l.ended && (l.kind == Kind::Good) == k)
                .count()
        };
        let (mut good, mut hostile) = (live(true), live(false));
        while good < opts.good || hostile < opts.hostile {
            let kind = if good < opts.good {
                good += 1;
                Kind::Good
            } else {
                hostile += 1;
                next_hostile += 1;
                HOSTILE[(next_hostile - 1) % HOSTILE.len()]
            };
            seq += 1;
            let name = format!("{}-{seq}", kind.name());
            let body = kind.toml(&name, &mut rng);
            let r = request(
                &sock,
                "POST",
                "/api/v1/vms",
                Some(("application/toml", &body)),
            );
            let added = matches!(r, Some((201, _)));
            if !added {
                eprintln!("soak: adding {name} failed: {r:?}");
            }
            ops.note("add", r);
            vms.insert(
                name,
                Launched {
                    kind,
                    stopped: false,
                    ended: !added,
                    paused_until: None,
                    quarantined_seen: false,
                    ended_view: None,
                },
            );
        }
        // Resume paused VMs whose pause is over; clear quarantines.
        let names: Vec<String> = vms.keys().cloned().collect();
        for n in &names {
            let l = vms.get_mut(n).unwrap();
            if l.ended {
                continue;
            }
            if l.paused_until.is_some_and(|t| t <= now) {
                l.paused_until = None;
                let r = request(&sock, "POST", &format!("/api/v1/vms/{n}/resume"), None);
                ops.note("resume", r);
            }
        }
        // One operator action every 250 ms on a random live VM.
        if now >= next_action {
            next_action = now + Duration::from_millis(250);
            let mut live: Vec<&String> = vms
                .iter()
                .filter(|(_, l)| !l.ended && l.paused_until.is_none())
                .map(|(n, _)| n)
                .collect();
            live.sort();
            if !live.is_empty() {
                let n = live[rng.range(0, live.len() as u64 - 1) as usize].clone();
                let kind = vms[&n].kind;
                let path = format!("/api/v1/vms/{n}");
                match rng.range(0, 9) {
                    0..=3 => {
                        let timeout = if matches!(kind, Kind::Hang | Kind::Rehang) {
                            rng.range(50, 500)
                        } else {
                            rng.range(2000, 9000)
                        };
                        let quantum = if rng.range(0, 3) == 0 {
                            "null".to_owned()
                        } else {
                            rng.range(1, 20).to_string()
                        };
                        let body = format!(
                            "{{\"priority\": {}, \"weight\": {}, \"quantum_ms\": {quantum}, \"preempt_timeout_ms\": {timeout}}}",
                            rng.range(0, 15),
                            rng.range(1, 8)
                        );
                        let r = request(&sock, "PATCH", &path, Some(("application/json", &body)));
                        ops.note("patch", r);
                    }
                    4..=5 => {
                        let r = request(&sock, "POST", &format!("{path}/pause"), None);
                        if matches!(r, Some((200, _))) {
                            vms.get_mut(&n).unwrap().paused_until =
                                Some(now + Duration::from_millis(rng.range(50, 500)));
                        }
                        ops.note("pause", r);
                    }
                    6 => {
                        let r = request(&sock, "POST", &format!("{path}/clear-quarantine"), None);
                        ops.note("clear-quarantine", r);
                    }
                    7 if rng.range(0, 2) == 0 => {
                        let r = request(&sock, "POST", &format!("{path}/stop"), None);
                        if matches!(r, Some((200, _))) {
                            vms.get_mut(&n).unwrap().stopped = true;
                        }
                        ops.note("stop", r);
                    }
                    _ => {
                        let r = request(&sock, "GET", "/metrics", None);
                        ops.note("metrics", r);
                    }
                }
            }
        }
        // Quarantined VMs are cleared by the operator.
        let q: Vec<String> = vms
            .iter()
            .filter(|(_, l)| l.quarantined_seen && !l.ended)
            .map(|(n, _)| n.clone())
            .collect();
        for n in q {
            let r = request(
                &sock,
                "POST",
                &format!("/api/v1/vms/{n}/clear-quarantine"),
                None,
            );
            ops.note("clear-quarantine", r);
        }
        if now >= next_sample {
            next_sample = now + Duration::from_secs(1);
            let live = vms.values().filter(|l| !l.ended).count();
            let ended = (vms.len() - live) as u64;
            samples.push((
                start.elapsed().as_secs_f64(),
                rss_kib(),
                open_fds(),
                live,
                ended,
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    // End: resume the paused, stop every live VM, then the anchor.
    let soak_s = start.elapsed().as_secs_f64();
    let mut names: Vec<String> = vms.keys().cloned().collect();
    names.sort();
    for n in &names {
        let l = vms.get_mut(n).unwrap();
        if l.paused_until.take().is_some() {
            let r = request(&sock, "POST", &format!("/api/v1/vms/{n}/resume"), None);
            ops.note("resume", r);
        }
    }
    for n in &names {
        let l = vms.get_mut(n).unwrap();
        if !l.ended {
            if let Some((200, v)) = request(&sock, "POST", &format!("/api/v1/vms/{n}/stop"), None) {
                // A VM that ended just before keeps its own outcome.
                l.stopped = v["outcome"]
                    .as_str()
                    .is_some_and(|o| o.contains("operator"));
            }
        }
    }
    let final_views = request(&sock, "GET", "/api/v1/vms", None)
        .map(|(_, v)| v)
        .unwrap_or(Value::Null);
    let final_views_bytes = final_views.to_string().len();
    let rss_end_live = rss_kib();
    let memfd_live = memfd_mappings();
    let fds_end_live = open_fds();
    let _ = request(&sock, "POST", "/api/v1/vms/anchor/stop", None);
    let report = match fleet.join() {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            eprintln!("soak: fleet failed: {e}");
            return 1;
        }
        Err(_) => {
            eprintln!("soak: the fleet thread panicked");
            return 1;
        }
    };

    // ---- results -------------------------------------------------------------
    let views: HashMap<&str, &Value> = final_views["vms"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| Some((v["name"].as_str()?, v)))
        .collect();
    let mut totals: BTreeMap<Kind, KindTotals> = BTreeMap::new();
    let (mut ok, mut lost, mut dup, mut bad_good) = (0u64, 0u64, 0u64, 0u64);
    let mut jobs: Vec<Duration> = Vec::new();
    let mut unexpected_lines: Vec<String> = Vec::new();
    for r in &report.vms {
        let Some(l) = vms.get(&r.name) else { continue };
        let t = totals.entry(l.kind).or_default();
        t.runs += 1;
        let figures = l
            .ended_view
            .clone()
            .or_else(|| views.get(r.name.as_str()).map(|v| ended_figures(v)));
        if let Some((gpu_ms, errors)) = figures {
            t.gpu_ms += gpu_ms;
            for (code, n) in errors {
                *t.errors_by_code.entry(code).or_default() += n;
            }
        }
        if l.quarantined_seen {
            t.quarantined += 1;
        }
        // Wrong-counter lines (lost / dup) from any verifying guest.
        for line in &r.console {
            if let Some(rest) = line.split("(lost ").nth(1) {
                let mut it = rest.trim_end_matches(')').split(", dup ");
                lost += it.next().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
                dup += it.next().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            }
        }
        let stopped = matches!(r.outcome, VmOutcome::Stopped(_)) && l.stopped;
        if stopped {
            t.killed += 1;
            continue;
        }
        if l.kind.expected(&r.outcome) {
            t.expected += 1;
            if l.kind == Kind::Good {
                ok += 1;
                jobs.extend(r.spans(2, 3));
            }
        } else {
            t.unexpected += 1;
            if l.kind == Kind::Good {
                bad_good += 1;
            }
            if unexpected_lines.len() < 20 {
                unexpected_lines.push(format!(
                    "{} ({}): {} | {}",
                    r.name,
                    l.kind.name(),
                    r.outcome,
                    r.console.join(" | ")
                ));
            }
        }
    }
    jobs.sort();
    let unexpected: u64 = totals.values().map(|t| t.unexpected).sum();
    let vms_run: u64 = totals.values().map(|t| t.runs).sum();
    let rss_after = rss_kib();
    let memfd_after = memfd_mappings();
    let fds_after = open_fds();
    // RSS growth: the last minute's mean against the first minute's
    // (after 10 s of warm-up), with the fleet populated in both.
    let window = |lo: f64, hi: f64| -> Option<u64> {
        let v: Vec<u64> = samples
            .iter()
            .filter(|s| s.0 >= lo && s.0 < hi)
            .map(|s| s.1)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<u64>() / v.len() as u64)
    };
    let warm = (soak_s / 6.0).min(10.0);
    let span = ((soak_s - warm) / 2.0).min(60.0);
    let rss_first = window(warm, warm + span).unwrap_or(0);
    let rss_last = window(soak_s - span, soak_s + 1.0).unwrap_or(0);
    let rss_peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let fds_peak = samples.iter().map(|s| s.2).max().unwrap_or(0);
    let host_bugs = HOST_BUGS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let panics = PANICS.load(Ordering::SeqCst) + host_bugs.len() as u64;

    println!(
        "soak: {:.0} s, {} VMs run (seed {}), {} good + {} hostile kept live",
        soak_s, vms_run, opts.seed, opts.good, opts.hostile
    );
    println!(
        "{:<12} {:>5} {:>9} {:>11} {:>7} {:>12} {:>10}  queue errors by code",
        "kind", "runs", "expected", "unexpected", "killed", "quarantined", "gpu_ms"
    );
    for (k, t) in &totals {
        let codes: Vec<String> = t
            .errors_by_code
            .iter()
            .map(|(c, n)| format!("{c}:{n}"))
            .collect();
        println!(
            "{:<12} {:>5} {:>9} {:>11} {:>7} {:>12} {:>10.1}  {}",
            k.name(),
            t.runs,
            t.expected,
            t.unexpected,
            t.killed,
            t.quarantined,
            t.gpu_ms,
            if codes.is_empty() {
                "-".into()
            } else {
                codes.join(" ")
            }
        );
    }
    println!(
        "good VMs: {ok} verified exactly, {bad_good} failed; {} jobs: p50 {:.2} ms, p99 {:.2} ms (host-measured submit to last completion)",
        jobs.len(),
        percentile(&jobs, 0.5),
        percentile(&jobs, 0.99)
    );
    let mut opl: Vec<String> = ops
        .by_op
        .iter()
        .map(|(k, (a, b))| format!("{k} {a} ok/{b} refused"))
        .collect();
    opl.push(format!("unanswered {}", ops.unanswered));
    println!("operator: {}", opl.join(", "));
    println!(
        "host: RSS before {rss_before} kB, first minute {rss_first} kB, last minute {rss_last} kB, peak {rss_peak} kB, at the end (live) {rss_end_live} kB, after the fleet {rss_after} kB; fds before {fds_before}, peak {fds_peak}, end (live) {fds_end_live}, after {fds_after}"
    );
    // RSS and fds once a minute (and VMs ended by then), to tell growth
    // per VM from a leak per unit of time.
    let mut per_min = Vec::new();
    let mut next_min = 0.0;
    for smp in &samples {
        if smp.0 >= next_min {
            per_min.push(format!(
                "{:.0}s {} kB {} fds {} VMs",
                smp.0, smp.1, smp.2, smp.4
            ));
            next_min += 60.0;
        }
    }
    println!("host by minute: {}", per_min.join("; "));
    println!(
        "host: guest-RAM (memfd) mappings: {} ({} kB resident) at the end with {} VMs live, {} ({} kB) after the fleet",
        memfd_live.0,
        memfd_live.1,
        samples.last().map_or(0, |l| l.3),
        memfd_after.0,
        memfd_after.1
    );
    let ended_between = samples
        .last()
        .map_or(0, |l| l.4)
        .saturating_sub(samples.iter().find(|x| x.0 >= warm).map_or(0, |f| f.4));
    if ended_between > 0 {
        println!(
            "host: RSS growth per VM ended after warm-up {:.1} kB ({} VMs)",
            (rss_last as f64 - rss_first as f64) / ended_between as f64,
            ended_between
        );
    }
    // What the fleet still holds per VM (its run report) and what the API
    // answers, to attribute growth.
    let console_bytes: usize = report
        .vms
        .iter()
        .flat_map(|r| &r.console)
        .map(|l| l.capacity() + std::mem::size_of::<String>())
        .sum();
    let checkpoint_bytes: usize = report
        .vms
        .iter()
        .map(|r| r.checkpoints.capacity() * std::mem::size_of::<(u32, Instant)>())
        .sum();
    println!(
        "host: run report {} VMs: console {} kB, checkpoints {} kB, {} B per VM in all (with the report itself); last GET /api/v1/vms {} kB ({} VMs listed)",
        report.vms.len(),
        console_bytes / 1024,
        checkpoint_bytes / 1024,
        (console_bytes
            + checkpoint_bytes
            + report.vms.len() * std::mem::size_of::<vmm::vm::VmReport>())
            / report.vms.len().max(1),
        final_views_bytes / 1024,
        views.len()
    );
    let by_level: Vec<u64> = LOG_BY_LEVEL
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    println!(
        "host log: {} error, {} warn, {} info lines; panics {} (hook {}, host-bug lines {})",
        by_level[1],
        by_level[2],
        by_level[3],
        panics,
        PANICS.load(Ordering::SeqCst),
        host_bugs.len()
    );
    let mut mismatched = 0;
    if let Some(g) = &report.gpu {
        println!(
            "gpu: {} completions, {} maps, {} preemptions ({} prepared ahead, {} prepared unmaps not decided), {} preemption timeouts, {} stale doorbells, {} guard quarantines",
            g.completions,
            g.maps,
            g.preemptions,
            g.armed_preemptions,
            g.armed_mismatched,
            g.preempt_timeouts,
            g.stale_doorbells,
            g.guard_quarantines
        );
        mismatched = g.armed_mismatched;
    }
    for l in &unexpected_lines {
        println!("unexpected: {l}");
    }
    for l in &host_bugs {
        println!("host bug: {l}");
    }
    let growth = rss_last as i64 - rss_first as i64;
    println!(
        "soak: ok={ok} bad_good={bad_good} lost={lost} dup={dup} unexpected={unexpected} panics={panics} armed_mismatched={mismatched} vms={vms_run} rss_growth_kib={growth} fds_growth={}",
        fds_after as i64 - fds_before as i64
    );
    let _ = std::fs::remove_dir_all(&dir);
    i32::from(bad_good + lost + dup + unexpected + panics + mismatched != 0)
}
