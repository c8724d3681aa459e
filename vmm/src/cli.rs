//! The operator CLI on the HTTP API (`hqdmux ps|stats|top|set|pause|resume|
//! stop|policy|add|unquarantine|metrics|timeline|promise --api-socket PATH`). Every command prints a table (or,
//! with `--json`, the API's JSON answer) and returns its exit code:
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | the fleet refused the request (the reason is printed) |
//! | 2 | bad usage, or the socket cannot be reached or answered garbage |

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::types::{
    ErrorBody, FleetView, PolicyChange, PolicyName, PolicyView, PreemptTimeoutMs, Priority,
    PromiseView, QuantumMs, VgpuCreate, VgpuList, VgpuView, VmList, VmUpdate, VmView, Weight,
};
use mdev::promise::{check_window, Demand, Verdict, WindowSample};

/// Exit code: the fleet refused.
pub const EXIT_REFUSED: u8 = 1;
/// Exit code: unreachable socket, bad usage.
pub const EXIT_UNREACHABLE: u8 = 2;

/// `print!` that does not panic: writes to stdout and evaluates to
/// `Result<(), ExitCode>` ([`write_out`]).
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => {
        $crate::cli::write_out(&format!($($t)*))
    };
}

/// Writes `s` to stdout and flushes it. A reader that went away (EPIPE:
/// `hqdmux ps | head -1`) ends the command quietly with exit 0 (it read
/// what it wanted); any other error (ENOSPC: `> /dev/full`) prints one
/// line on stderr and is exit 2 (an output that cannot be written).
pub fn write_out(s: &str) -> Result<(), ExitCode> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match o.write_all(s.as_bytes()).and_then(|()| o.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(ExitCode::SUCCESS),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "hqdmux: cannot write the output: {e}");
            Err(ExitCode::from(EXIT_UNREACHABLE))
        }
    }
}

/// The exit code of a command that printed `r`: 0, or what [`write_out`]
/// decided.
pub fn done(r: Result<(), ExitCode>) -> ExitCode {
    r.err().unwrap_or(ExitCode::SUCCESS)
}

/// Percent-encodes a VM name for a URL path segment.
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out += &format!("%{b:02X}");
        }
    }
    out
}

/// One API call from command `cmd`: the answer's JSON on 2xx, else the
/// exit code after printing why.
pub fn call(
    cmd: &str,
    socket: &Path,
    method: &str,
    target: &str,
    body: Option<(&str, Vec<u8>)>,
) -> Result<Value, ExitCode> {
    call_as(cmd, socket, method, target, body)
}

/// [`call`], the answer read as `T` (an answer that is not a `T`: exit 2
/// after printing why).
pub fn call_as<T: DeserializeOwned>(
    cmd: &str,
    socket: &Path,
    method: &str,
    target: &str,
    body: Option<(&str, Vec<u8>)>,
) -> Result<T, ExitCode> {
    let bytes = request(
        cmd,
        socket,
        method,
        &format!("{}{target}", crate::api::PREFIX),
        body.as_ref().map(|(ct, b)| (*ct, b.as_slice())),
    )?;
    serde_json::from_slice(&bytes).map_err(|e| {
        eprintln!(
            "hqdmux {cmd}: the fleet answered something unexpected: {}",
            escape(&e.to_string())
        );
        ExitCode::from(EXIT_UNREACHABLE)
    })
}

fn json_body<T: serde::Serialize>(v: &T) -> Option<(&'static str, Vec<u8>)> {
    Some((
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    ))
}

fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) => format!("{x:.digits$}"),
        None => "-".into(),
    }
}

/// A latency figure (ms); `>X` when it is at the limit the server resolves
/// (the latency was at least that).
fn latency(v: Option<f64>, limit: Option<f64>) -> String {
    match (v, limit) {
        (Some(x), Some(l)) if x >= l => format!(">{x:.0}"),
        _ => num(v, 3),
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| escape(&v.to_string()))
}

/// `s` with control characters (and backslashes) escaped as Rust writes
/// them (`\n`, `\u{1b}`): a VM name or an outcome printed on a terminal
/// cannot move the cursor, clear the screen or ring a bell.
pub fn escape(s: &str) -> String {
    if !s.chars().any(|c| c.is_control() || c == '\\') {
        return s.to_owned();
    }
    // Only control characters and backslashes: quotes stay as they are
    // (`char::escape_debug` alone would also write `'` as `\'`).
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() || c == '\\' {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// [`escape`], line feeds kept (a refusal's reason may span lines, as a
/// TOML error with its caret line does).
pub fn escape_lines(s: &str) -> String {
    s.split('\n').map(escape).collect::<Vec<_>>().join("\n")
}

/// The `ps`/`top` table of VM views.
pub fn table(vms: &[VmView]) -> String {
    let mut s = format!(
        "{:<16} {:<9} {:>3} {:>4} {:>6} {:>8} {:>11} {:>6} {:>12} {:>7} {:>9} {:>8} {:>8} {:>6} {:>4}  {}\n",
        "vm",
        "state",
        "gpu",
        "prio",
        "weight",
        "slice_ms",
        "gpu_time_ms",
        "share",
        "entitled/got",
        "preempt",
        "cwsr_ms",
        "p50_ms",
        "p99_ms",
        "qerr",
        "quar",
        "outcome"
    );
    for v in vms {
        let share = v
            .tenant
            .share
            .map(|x| format!("{:.1}%", x * 100.0))
            .unwrap_or_else(|| "-".into());
        let quarantined = match v.tenant.quarantined {
            Some(true) => "YES",
            Some(false) => "no",
            None => "-",
        };
        s += &format!(
            "{:<16} {:<9} {:>3} {:>4} {:>6} {:>8} {:>11} {:>6} {:>12} {:>7} {:>9} {:>8} {:>8} {:>6} {:>4}  {}\n",
            escape(&v.name),
            v.state.name(),
            // The VM's GPU id; `yes` for a vGPU served by another process.
            match (v.gpu_id, v.gpu) {
                (Some(id), _) => id.to_string(),
                (None, true) => "yes".into(),
                (None, false) => "no".into(),
            },
            v.tenant.priority,
            v.tenant.weight,
            num(v.tenant.quantum_ms, 1),
            num(v.tenant.gpu_time_ms, 2),
            share,
            entitled_vs_got(v.promise.as_ref()),
            opt(v.tenant.preemptions),
            num(v.cwsr_time_ms, 3),
            latency(v.tenant.latency_p50_ms, v.tenant.latency_limit_ms),
            latency(v.tenant.latency_p99_ms, v.tenant.latency_limit_ms),
            opt(v.tenant.queue_errors),
            quarantined,
            opt(v.outcome.as_deref()),
        );
    }
    s
}

/// The `entitled/got` cell: percentages of the partition's compute over
/// the last interval; `L` marks a demand-limited VM, `!` a VM whose
/// promise did not hold, `-` before the first interval.
pub fn entitled_vs_got(p: Option<&PromiseView>) -> String {
    let Some(p) = p else { return "-".into() };
    match (p.entitled_share, p.got_share) {
        (Some(e), Some(g)) => {
            let flag = match (p.demand, p.held) {
                (_, Some(false)) => "!",
                (Some(Demand::Limited), _) => "L",
                _ => "",
            };
            format!("{:.0}/{:.0}%{flag}", e * 100.0, g * 100.0)
        }
        _ => "-".into(),
    }
}

/// Exit code of `hqdmux promise`: the promise did not hold for some VM.
pub const EXIT_BROKEN: u8 = 1;

/// The window samples of the VMs live in both reads (by name, same
/// partition), from the differences of their promise counters.
pub fn window_samples(first: &VmList, second: &VmList) -> Vec<WindowSample> {
    let ns = |ms: f64| (ms.max(0.0) * 1e6).round() as u64;
    let mut out = Vec::new();
    for b in &second.vms {
        let Some(pb) = &b.promise else { continue };
        let Some(a) = first.vms.iter().find(|a| a.name == b.name) else {
            continue;
        };
        let Some(pa) = &a.promise else { continue };
        if pa.partition != pb.partition || a.gpu_id != b.gpu_id || pb.at_ms < pa.at_ms {
            continue;
        }
        out.push(WindowSample {
            name: b.name.clone(),
            gpu: b.gpu_id.unwrap_or(0),
            partition: pb.partition,
            priority: u8::try_from(b.tenant.priority).unwrap_or(u8::MAX),
            weight: b.tenant.weight,
            quantum_ns: ns(b.tenant.quantum_ms.unwrap_or(pb.level_quantum_ms)),
            window_ns: ns(pb.at_ms - pa.at_ms),
            demanding_ns: ns(pb.demanding_ms - pa.demanding_ms),
            wait_ns: ns(pb.wait_ms - pa.wait_ms),
            cu_ns: ns(pb.cu_time_ms - pa.cu_time_ms),
            gpu_ns: ns(b.tenant.gpu_time_ms.unwrap_or(0.0) - a.tenant.gpu_time_ms.unwrap_or(0.0)),
        });
    }
    out
}

/// The check `hqdmux promise` makes between two reads of `GET /vms`.
pub fn promise_check(first: &VmList, second: &VmList) -> Vec<Verdict> {
    check_window(&window_samples(first, second))
}

/// The window the check actually covered: the longest of the VMs' windows
/// (each one the difference of its two reads' `promise.at_ms`, on its
/// arbiter's clock), `None` without a VM to check. Longer than the window
/// asked for by the time the two reads took.
pub fn covered_window(samples: &[WindowSample]) -> Option<Duration> {
    samples
        .iter()
        .map(|s| Duration::from_nanos(s.window_ns))
        .max()
}

/// The table `hqdmux promise` prints.
pub fn promise_table(v: &[Verdict]) -> String {
    let mut s = format!(
        "{:<16} {:>3} {:>4} {:<10} {:>9} {:>8} {:>6} {:>8} {:>5}  {}\n",
        "vm", "gpu", "part", "demand", "demanding", "entitled", "got", "got_slot", "held", "why"
    );
    for x in v {
        s += &format!(
            "{:<16} {:>3} {:>4} {:<10} {:>8.0}% {:>7.1}% {:>5.1}% {:>7.1}% {:>5}  {}\n",
            escape(&x.name),
            x.gpu,
            x.partition,
            x.demand.name(),
            x.demanding * 100.0,
            x.entitled * 100.0,
            x.got * 100.0,
            x.got_slot * 100.0,
            if x.held { "yes" } else { "NO" },
            escape(&x.why),
        );
    }
    s
}

/// `hqdmux promise --window W`: reads every VM's promise counters, waits
/// `window`, reads them again and checks each live GPU VM's promise over
/// the window ([`mdev::promise::check_window`]). Exit 0 when it held for
/// every VM (or there is none), [`EXIT_BROKEN`] when not, 2 when the
/// socket cannot be reached.
pub fn promise(socket: &Path, window: Duration, as_json: bool) -> ExitCode {
    let first = match call_as::<VmList>("promise", socket, "GET", "/vms", None) {
        Ok(v) => v,
        Err(c) => return c,
    };
    let t0 = std::time::Instant::now();
    std::thread::sleep(window);
    let second = match call_as::<VmList>("promise", socket, "GET", "/vms", None) {
        Ok(v) => v,
        Err(c) => return c,
    };
    let samples = window_samples(&first, &second);
    let verdicts = check_window(&samples);
    let covered = covered_window(&samples).unwrap_or_else(|| t0.elapsed());
    let broken = verdicts.iter().filter(|v| !v.held).count();
    let r = if as_json {
        let rows: Vec<Value> = verdicts
            .iter()
            .map(|x| {
                let w = samples
                    .iter()
                    .find(|s| s.name == x.name)
                    .map(|s| s.window_ns as f64 / 1e6);
                serde_json::json!({
                    "vm": x.name,
                    "window_ms": w,
                    "gpu_id": x.gpu,
                    "partition": x.partition,
                    "demand": x.demand,
                    "demanding": x.demanding,
                    "entitled_share": x.entitled,
                    "got_share": x.got,
                    "got_slot_share": x.got_slot,
                    "tolerance": x.tolerance,
                    "held": x.held,
                    "why": x.why,
                })
            })
            .collect();
        out!(
            "{}\n",
            serde_json::to_string_pretty(&serde_json::json!({
                "window_ms": covered.as_secs_f64() * 1e3,
                "requested_window_ms": window.as_secs_f64() * 1e3,
                "held": broken == 0,
                "vms": rows,
            }))
            .unwrap_or_default()
        )
    } else if verdicts.is_empty() {
        out!("no live GPU VM to check\n")
    } else {
        let verdict = if broken == 0 {
            "the promise held for every VM".to_owned()
        } else {
            format!("the promise did not hold for {broken} VM(s)")
        };
        out!(
            "{}over {:.1} s: {verdict}\n",
            promise_table(&verdicts),
            covered.as_secs_f64()
        )
    };
    match r {
        Err(c) => c,
        Ok(()) if broken > 0 => ExitCode::from(EXIT_BROKEN),
        Ok(()) => ExitCode::SUCCESS,
    }
}

/// `top`'s header: policy, uptime, completions and preemptions summed
/// over the GPUs, then one line per GPU when there are several.
fn top_header(f: Option<&FleetView>, gpu: Option<&crate::api::GpuView>) -> String {
    let gpus = f.map_or(&[][..], |f| f.gpus.as_slice());
    let sum = |x: fn(&crate::api::GpuView) -> u64| {
        if gpus.is_empty() {
            gpu.map(x)
        } else {
            Some(gpus.iter().map(x).sum())
        }
    };
    let mut out = format!(
        "hqdmux top  policy {}  uptime {} s  completions {}  preemptions {}  (share: of the GPU time of the last interval)\n",
        opt(gpu.map(|g| g.policy.0.name())),
        num(f.map(|f| f.uptime_ms / 1e3), 1),
        opt(sum(|g| g.completions)),
        opt(sum(|g| g.preemptions)),
    );
    if gpus.len() > 1 {
        for g in gpus {
            out += &format!(
                "  gpu {:<2} {} vms {:<3} completions {:<8} preemptions {}\n",
                g.gpu_id, g.gpu_compute_partition_type, g.vms, g.completions, g.preemptions
            );
        }
    }
    out + "\n"
}

fn print_json<T: serde::Serialize>(v: &T) -> ExitCode {
    done(out!(
        "{}\n",
        serde_json::to_string_pretty(v).unwrap_or_default()
    ))
}

/// `hqdmux ps`: the VMs, then the vGPUs `hqdmux serve` serves (if any).
pub fn ps(socket: &Path, as_json: bool) -> ExitCode {
    let vms = match call_as::<VmList>("ps", socket, "GET", "/vms", None) {
        Ok(v) => v,
        Err(c) => return c,
    };
    let vgpus = vgpu_list(socket);
    if as_json {
        #[derive(serde::Serialize)]
        struct Ps {
            vms: Vec<VmView>,
            #[serde(skip_serializing_if = "Vec::is_empty")]
            vgpus: Vec<VgpuView>,
        }
        return print_json(&Ps {
            vms: vms.vms,
            vgpus: vgpus.vgpus,
        });
    }
    if vgpus.vgpus.is_empty() {
        return done(out!("{}", table(&vms.vms)));
    }
    if vms.vms.is_empty() {
        // `hqdmux serve`: vGPUs only.
        return done(out!("{}", vgpu_table(&vgpus.vgpus)));
    }
    done(out!("{}\n{}", table(&vms.vms), vgpu_table(&vgpus.vgpus)))
}

/// The vGPUs of the server at `socket` (none when it serves none or is an
/// older server without `/vgpus`).
fn vgpu_list(socket: &Path) -> VgpuList {
    let target = format!("{}/vgpus", crate::api::PREFIX);
    match crate::http::call(socket, "GET", &target, None) {
        Ok((200, b)) => serde_json::from_slice(&b).unwrap_or_default(),
        _ => VgpuList::default(),
    }
}

/// True when the server at `socket` serves a vGPU named `name` (then
/// `set`, `pause` and `resume` steer it).
fn is_vgpu(socket: &Path, name: &str) -> bool {
    let target = format!("{}/vgpus/{}", crate::api::PREFIX, encode_segment(name));
    matches!(
        crate::http::call(socket, "GET", &target, None),
        Ok((200, _))
    )
}

/// The `ps` table of vGPU views (`hqdmux serve`).
pub fn vgpu_table(vgpus: &[VgpuView]) -> String {
    let mut s = format!(
        "{:<16} {:<9} {:>3} {:>6} {:>4} {:>6} {:>8} {:>6} {:>11} {:>6} {:>7} {:>8} {:>8} {:>6}  {}\n",
        "vgpu",
        "state",
        "gpu",
        "paused",
        "prio",
        "weight",
        "slice_ms",
        "queues",
        "gpu_time_ms",
        "share",
        "preempt",
        "p50_ms",
        "p99_ms",
        "qerr",
        "socket"
    );
    for v in vgpus {
        let share = v
            .tenant
            .share
            .map(|x| format!("{:.1}%", x * 100.0))
            .unwrap_or_else(|| "-".into());
        s += &format!(
            "{:<16} {:<9} {:>3} {:>6} {:>4} {:>6} {:>8} {:>6} {:>11} {:>6} {:>7} {:>8} {:>8} {:>6}  {}\n",
            escape(&v.name),
            v.state.name(),
            v.gpu_id,
            if v.paused { "yes" } else { "no" },
            v.tenant.priority,
            v.tenant.weight,
            num(v.tenant.quantum_ms, 1),
            opt(v.queues),
            num(v.tenant.gpu_time_ms, 2),
            share,
            opt(v.tenant.preemptions),
            latency(v.tenant.latency_p50_ms, v.tenant.latency_limit_ms),
            latency(v.tenant.latency_p99_ms, v.tenant.latency_limit_ms),
            opt(v.tenant.queue_errors),
            escape(&v.socket),
        );
    }
    s
}

/// `hqdmux vgpu-add NAME ...`.
pub fn vgpu_add(socket: &Path, body: &VgpuCreate, as_json: bool) -> ExitCode {
    one_vgpu(
        "vgpu-add",
        socket,
        "POST",
        "/vgpus",
        json_body(body),
        as_json,
    )
}

/// `hqdmux vgpu-rm NAME`.
pub fn vgpu_rm(socket: &Path, name: &str, as_json: bool) -> ExitCode {
    one_vgpu(
        "vgpu-rm",
        socket,
        "DELETE",
        &format!("/vgpus/{}", encode_segment(name)),
        None,
        as_json,
    )
}

fn one_vgpu(
    cmd: &str,
    socket: &Path,
    method: &str,
    target: &str,
    body: Option<(&str, Vec<u8>)>,
    as_json: bool,
) -> ExitCode {
    match call_as::<VgpuView>(cmd, socket, method, target, body) {
        Ok(v) if as_json => print_json(&v),
        Ok(v) => done(out!("{}", vgpu_table(std::slice::from_ref(&v)))),
        Err(c) => c,
    }
}

/// `hqdmux stats [VM]`.
pub fn stats(socket: &Path, vm: Option<&str>, as_json: bool) -> ExitCode {
    let target = match vm {
        Some(n) => format!("/vms/{}", encode_segment(n)),
        None => "/fleet".into(),
    };
    match call("stats", socket, "GET", &target, None) {
        Ok(v) if as_json => print_json(&v),
        Ok(v) => done(out!("{}", key_values(&v, ""))),
        Err(c) => c,
    }
}

fn key_values(v: &Value, prefix: &str) -> String {
    let mut s = String::new();
    if let Value::Object(m) = v {
        for (k, x) in m {
            match x {
                Value::Object(_) => s += &key_values(x, &format!("{prefix}{k}.")),
                Value::Null => s += &format!("{:<28} -\n", format!("{prefix}{k}")),
                Value::String(t) => s += &format!("{:<28} {}\n", format!("{prefix}{k}"), escape(t)),
                _ => s += &format!("{:<28} {x}\n", escape(&format!("{prefix}{k}"))),
            }
        }
    }
    s
}

/// One `top` screen: the header, then the VM table and the table of the
/// vGPUs the server serves over vfio-user (`hqdmux serve`), each when it
/// has rows (a daemon serving only vGPUs shows only theirs; a fleet
/// without vGPUs only its VMs).
pub fn top_screen(f: Option<&FleetView>, vms: &VmList, vgpus: &VgpuList) -> String {
    let gpu = f.and_then(|f| f.gpu.as_ref());
    let mut out = top_header(f, gpu);
    if !vms.vms.is_empty() || vgpus.vgpus.is_empty() {
        out += &table(&vms.vms);
    }
    if !vgpus.vgpus.is_empty() {
        if !vms.vms.is_empty() {
            out += "\n";
        }
        out += &vgpu_table(&vgpus.vgpus);
    }
    out
}

/// `hqdmux top`: the VM and vGPU tables every `interval`, or once. On a terminal it
/// is cut to the terminal's size at each refresh, and `q` quits (exit 0);
/// SIGINT/SIGTERM quit too (130/143), the terminal restored.
pub fn top(socket: &Path, once: bool, interval: Duration, as_json: bool) -> ExitCode {
    let keys = (!once && !as_json).then(RawStdin::new).flatten();
    let stop = if once {
        None
    } else {
        crate::signals::install().ok()
    };
    loop {
        let v = match call_as::<VmList>("top", socket, "GET", "/vms", None) {
            Ok(v) => v,
            Err(c) => return c,
        };
        let f = call_as::<FleetView>("top", socket, "GET", "/fleet", None).ok();
        let g = vgpu_list(socket);
        if as_json {
            let mut line = serde_json::json!({"fleet": f, "vms": v.vms});
            if !g.vgpus.is_empty() {
                line["vgpus"] = serde_json::to_value(&g.vgpus).unwrap_or_default();
            }
            if let Err(c) = out!("{line}\n") {
                return c;
            }
        } else {
            let mut out = String::new();
            if !once {
                // Home and clear: a refreshing screen.
                out += "\x1b[H\x1b[2J";
            }
            out += &top_screen(f.as_ref(), &v, &g);
            if !once {
                if let Some((cols, rows)) = terminal_size() {
                    out = fit(&out, cols, rows);
                }
                if keys.is_some() {
                    out += "(q quits)";
                }
            }
            if let Err(c) = out!("{out}") {
                return c;
            }
        }
        if once {
            return ExitCode::SUCCESS;
        }
        match wait_for_key(interval, keys.as_ref(), stop.as_ref()) {
            Wake::Timeout => {}
            Wake::Quit => {
                let _ = out!("\n");
                return ExitCode::SUCCESS;
            }
            Wake::Signal(sig) => {
                drop(keys);
                let _ = out!("\n");
                return ExitCode::from(crate::signals::exit_code(sig));
            }
        }
    }
}

/// `(columns, rows)` of the terminal on stdout, if it is one.
fn terminal_size() -> Option<(usize, usize)> {
    // SAFETY: a zeroed winsize is valid; TIOCGWINSZ only writes it.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: fd 1 and a valid pointer to `ws`.
    let r = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_col > 0 && ws.ws_row > 0)
        .then(|| (usize::from(ws.ws_col), usize::from(ws.ws_row)))
}

/// `text` cut to a `cols` x `rows` screen: each line to `cols` characters
/// (escape sequences at the start of the text apart), at most `rows - 1`
/// lines (the last row stays for the prompt); lines that do not fit are
/// counted on the last one.
pub fn fit(text: &str, cols: usize, rows: usize) -> String {
    let (prefix, body) = match text.strip_prefix("\x1b[H\x1b[2J") {
        Some(b) => ("\x1b[H\x1b[2J", b),
        None => ("", text),
    };
    let lines: Vec<&str> = body.lines().collect();
    let room = rows.saturating_sub(1).max(1);
    let cut = |l: &str| l.chars().take(cols).collect::<String>();
    let mut out = String::from(prefix);
    if lines.len() <= room {
        for l in &lines {
            out += &cut(l);
            out.push('\n');
        }
        return out;
    }
    let shown = room.saturating_sub(1);
    for l in &lines[..shown] {
        out += &cut(l);
        out.push('\n');
    }
    out += &cut(&format!(
        "... {} more lines (a larger terminal shows them)",
        lines.len() - shown
    ));
    out.push('\n');
    out
}

/// Stdin as a terminal in non-canonical, no-echo mode (single key presses
/// readable at once); restored on drop. `None` when stdin is no terminal.
struct RawStdin {
    saved: libc::termios,
}

impl RawStdin {
    fn new() -> Option<Self> {
        // SAFETY: isatty on fd 0; tcgetattr writes a termios into `t`.
        unsafe {
            if libc::isatty(0) != 1 {
                return None;
            }
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return None;
            }
            let saved = t;
            t.c_lflag &= !(libc::ICANON | libc::ECHO);
            t.c_cc[libc::VMIN] = 1;
            t.c_cc[libc::VTIME] = 0;
            if libc::tcsetattr(0, libc::TCSANOW, &t) != 0 {
                return None;
            }
            Some(RawStdin { saved })
        }
    }
}

impl Drop for RawStdin {
    fn drop(&mut self) {
        // SAFETY: restores the attributes read in `new`.
        unsafe {
            libc::tcsetattr(0, libc::TCSANOW, &self.saved);
        }
    }
}

/// Why [`wait_for_key`] returned.
enum Wake {
    Timeout,
    Quit,
    Signal(i32),
}

/// Waits `interval` for `q` on the terminal or a stop signal.
fn wait_for_key(
    interval: Duration,
    keys: Option<&RawStdin>,
    stop: Option<&crate::signals::StopSignal>,
) -> Wake {
    use std::os::fd::AsRawFd;
    let deadline = std::time::Instant::now() + interval;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Wake::Timeout;
        }
        let mut fds = Vec::with_capacity(2);
        if keys.is_some() {
            fds.push(libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        if let Some(s) = stop {
            fds.push(libc::pollfd {
                fd: s.fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1);
        // SAFETY: `fds` is a valid array of `fds.len()` pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n <= 0 {
            continue; // timeout (checked above) or EINTR
        }
        if let Some(s) = stop {
            if fds.last().is_some_and(|f| f.revents != 0) {
                return Wake::Signal(s.received().unwrap_or(libc::SIGINT));
            }
        }
        if keys.is_some() && fds[0].revents != 0 {
            let mut buf = [0u8; 32];
            // SAFETY: reads at most 32 bytes into `buf`.
            let got = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
            if got <= 0 {
                // Stdin closed: wait out the interval without it.
                std::thread::sleep(left);
                return Wake::Timeout;
            }
            if buf[..got as usize].iter().any(|b| matches!(b, b'q' | b'Q')) {
                return Wake::Quit;
            }
        }
    }
}

/// Fields of `hqdmux set`, checked by the command line parser with the
/// API's own types.
#[derive(Debug, Default, Clone, Copy)]
pub struct SetFields {
    /// New priority.
    pub priority: Option<Priority>,
    /// New weight.
    pub weight: Option<Weight>,
    /// New slice (`Some(None)`: back to the level's quantum).
    pub quantum_ms: Option<Option<QuantumMs>>,
    /// New preemption timeout (ms).
    pub preempt_timeout_ms: Option<PreemptTimeoutMs>,
}

/// `hqdmux set VM ...`.
pub fn set(socket: &Path, vm: &str, f: SetFields, as_json: bool) -> ExitCode {
    let body = VmUpdate {
        priority: f.priority,
        weight: f.weight,
        quantum_ms: f.quantum_ms,
        preempt_timeout_ms: f.preempt_timeout_ms,
        guard: None,
    };
    if body.is_empty() {
        eprintln!("hqdmux set: nothing to change (--priority, --weight, --quantum-ms, --preempt-timeout-ms)");
        return ExitCode::from(EXIT_UNREACHABLE);
    }
    if is_vgpu(socket, vm) {
        return one_vgpu(
            "set",
            socket,
            "PATCH",
            &format!("/vgpus/{}", encode_segment(vm)),
            json_body(&body),
            as_json,
        );
    }
    one_vm(
        "set",
        socket,
        "PATCH",
        &format!("/vms/{}", encode_segment(vm)),
        json_body(&body),
        as_json,
    )
}

/// `hqdmux pause|resume|stop VM`.
pub fn vm_action(socket: &Path, action: &str, vm: &str, as_json: bool) -> ExitCode {
    if action != "stop" && is_vgpu(socket, vm) {
        return one_vgpu(
            action,
            socket,
            "POST",
            &format!("/vgpus/{}/{action}", encode_segment(vm)),
            None,
            as_json,
        );
    }
    one_vm(
        action,
        socket,
        "POST",
        &format!("/vms/{}/{action}", encode_segment(vm)),
        None,
        as_json,
    )
}

fn one_vm(
    cmd: &str,
    socket: &Path,
    method: &str,
    target: &str,
    body: Option<(&str, Vec<u8>)>,
    as_json: bool,
) -> ExitCode {
    match call_as::<VmView>(cmd, socket, method, target, body) {
        Ok(v) if as_json => print_json(&v),
        Ok(v) => done(out!("{}", table(std::slice::from_ref(&v)))),
        Err(c) => c,
    }
}

/// `hqdmux policy [P]`.
pub fn policy(socket: &Path, set: Option<PolicyName>, as_json: bool) -> ExitCode {
    let r = match set {
        Some(policy) => call_as::<PolicyView>(
            "policy",
            socket,
            "PUT",
            "/policy",
            json_body(&PolicyChange { policy }),
        ),
        None => call_as::<PolicyView>("policy", socket, "GET", "/policy", None),
    };
    match r {
        Ok(v) if as_json => print_json(&v),
        Ok(v) => done(out!("{}\n", v.policy.0.name())),
        Err(c) => c,
    }
}

/// `hqdmux add FILE.toml`: one `[[vm]]` entry.
pub fn add(socket: &Path, file: &Path, as_json: bool) -> ExitCode {
    let body = match std::fs::metadata(file) {
        Ok(m) if m.is_file() && m.len() <= crate::http::MAX_BODY as u64 => std::fs::read(file),
        Ok(_) => Err(std::io::Error::other(format!(
            "not a regular file of at most {} bytes",
            crate::http::MAX_BODY
        ))),
        Err(e) => Err(e),
    };
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            eprintln!("hqdmux add: {}: {e}", file.display());
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    };
    one_vm(
        "add",
        socket,
        "POST",
        "/vms",
        Some(("application/toml", body)),
        as_json,
    )
}

/// `hqdmux unquarantine VM`: lift its guard quarantine (exit 0 also when
/// it was not quarantined; the answer's `was_quarantined` says which).
pub fn unquarantine(socket: &Path, vm: &str, as_json: bool) -> ExitCode {
    if is_vgpu(socket, vm) {
        // A vGPU of `hqdmux serve`: its quarantine, connected or idle.
        return one_vgpu(
            "unquarantine",
            socket,
            "POST",
            &format!("/vgpus/{}/clear-quarantine", encode_segment(vm)),
            None,
            as_json,
        );
    }
    match call_as::<VmView>(
        "unquarantine",
        socket,
        "POST",
        &format!("/vms/{}/clear-quarantine", encode_segment(vm)),
        None,
    ) {
        Ok(v) if as_json => print_json(&v),
        Ok(v) => {
            if v.was_quarantined == Some(false) {
                if let Err(c) = out!("vm '{}' was not quarantined\n", escape(vm)) {
                    return c;
                }
            }
            done(out!("{}", table(std::slice::from_ref(&v))))
        }
        Err(c) => c,
    }
}

/// One request outside the JSON answers: the body on 2xx, else the exit
/// code after printing why.
fn call_raw(cmd: &str, socket: &Path, target: &str) -> Result<Vec<u8>, ExitCode> {
    request(cmd, socket, "GET", target, None)
}

/// One HTTP request from command `cmd` to `target` (a full path): the
/// answer's body on 2xx, else the exit code after printing why (the
/// answer's `error` field, or its body).
fn request(
    cmd: &str,
    socket: &Path,
    method: &str,
    target: &str,
    body: Option<(&str, &[u8])>,
) -> Result<Vec<u8>, ExitCode> {
    match crate::http::call(socket, method, target, body) {
        Ok((st, bytes)) if (200..300).contains(&st) => Ok(bytes),
        Ok((st, bytes)) => {
            let why = serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            eprintln!("hqdmux {cmd}: {} (HTTP {st})", escape_lines(why.trim_end()));
            Err(ExitCode::from(EXIT_REFUSED))
        }
        Err(e) => {
            let hint = match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                    "; no fleet listens there (start one with `hqdmux run FLEET.toml \
                     --api-socket`, or name its socket with --api-socket PATH)"
                }
                _ => "",
            };
            eprintln!(
                "hqdmux {cmd}: cannot reach {}: {e}{hint}",
                escape(&socket.display().to_string())
            );
            Err(ExitCode::from(EXIT_UNREACHABLE))
        }
    }
}

/// The default API socket: `/run/hqdmux/api.sock` for root (effective uid
/// 0, whatever `XDG_RUNTIME_DIR` says: a root shell and a systemd service
/// agree), else `$XDG_RUNTIME_DIR/hqdmux/api.sock`; an error naming the
/// variable when a non-root user has no (absolute) `XDG_RUNTIME_DIR`.
pub fn default_api_socket_for(
    euid: u32,
    xdg_runtime_dir: Option<&std::ffi::OsStr>,
) -> Result<std::path::PathBuf, String> {
    if euid == 0 {
        return Ok(std::path::PathBuf::from("/run/hqdmux/api.sock"));
    }
    match xdg_runtime_dir.map(Path::new) {
        Some(d) if d.is_absolute() => Ok(d.join("hqdmux").join("api.sock")),
        _ => Err(
            "no default API socket: XDG_RUNTIME_DIR is not set to an absolute path \
                  (set it, or pass --api-socket PATH)"
                .into(),
        ),
    }
}

/// [`default_api_socket_for`] this process (its effective uid and
/// environment).
pub fn default_api_socket() -> Result<std::path::PathBuf, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    default_api_socket_for(euid, std::env::var_os("XDG_RUNTIME_DIR").as_deref())
}

/// The socket a client command `cmd` talks to: `given`, else the default
/// ([`default_api_socket`]); exit 2 after one line when there is none.
pub fn client_socket(
    cmd: &str,
    given: Option<std::path::PathBuf>,
) -> Result<std::path::PathBuf, ExitCode> {
    match given {
        Some(p) => Ok(p),
        None => default_api_socket().map_err(|e| {
            eprintln!("hqdmux {cmd}: {e}");
            ExitCode::from(EXIT_UNREACHABLE)
        }),
    }
}

/// The socket `run`/`serve` serve the API on: none without
/// `--api-socket`, `PATH` for `--api-socket PATH`, the default
/// ([`default_api_socket`]) for a bare `--api-socket`, its directory created
/// (mode 0755: the socket's own mode guards it) when missing.
pub fn server_socket(
    given: Option<Option<std::path::PathBuf>>,
) -> Result<Option<std::path::PathBuf>, String> {
    server_socket_with(given, default_api_socket)
}

/// [`server_socket`] with the default given by `default`.
pub fn server_socket_with(
    given: Option<Option<std::path::PathBuf>>,
    default: impl FnOnce() -> Result<std::path::PathBuf, String>,
) -> Result<Option<std::path::PathBuf>, String> {
    let path = match given {
        None => return Ok(None),
        Some(Some(p)) => return Ok(Some(p)),
        Some(None) => default()?,
    };
    if let Some(dir) = path.parent() {
        if !dir.is_dir() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .and_then(|()| {
                    // Whatever the umask: other users' clients may look in.
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                })
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
    }
    Ok(Some(path))
}

/// `hqdmux metrics`: print `GET /metrics` (Prometheus text).
pub fn metrics(socket: &Path) -> ExitCode {
    match call_raw("metrics", socket, "/metrics") {
        Ok(b) => done(out!("{}", String::from_utf8_lossy(&b))),
        Err(c) => c,
    }
}

/// `hqdmux timeline -o OUT`: fetch the last `seconds` of the live fleet's
/// timeline as JSON, check it, and write it as SVG (rendered here) or, for
/// an `OUT` ending in `.json` or with `as_json`, as JSON. `gpu_id`: which
/// GPU (none: the first with VMs).
pub fn timeline(
    socket: &Path,
    out: &Path,
    seconds: u64,
    as_json: bool,
    gpu_id: Option<u32>,
) -> ExitCode {
    let gpu = gpu_id.map(|g| format!("&gpu_id={g}")).unwrap_or_default();
    let target = format!(
        "{}/timeline?seconds={seconds}&format=json{gpu}",
        crate::api::PREFIX
    );
    let bytes = match call_raw("timeline", socket, &target) {
        Ok(b) => b,
        Err(c) => return c,
    };
    let t = match std::str::from_utf8(&bytes)
        .map_err(|e| e.to_string())
        .and_then(|s| timeline::Timeline::from_json(s).map_err(|e| e.to_string()))
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("hqdmux timeline: the fleet answered an invalid timeline: {e}");
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    };
    let json_out = as_json
        || out
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let body = if json_out {
        t.to_json()
    } else {
        let title = format!("hqdmux timeline --seconds {seconds}: the fleet's last {seconds} s");
        timeline::render_svg(
            &t,
            &timeline::RenderOptions {
                title: Some(title),
                ..Default::default()
            },
        )
    };
    match std::fs::write(out, body) {
        Ok(()) => done(out!(
            "hqdmux timeline: {} ({} VMs, {} slots, {} spans, {} preemptions, {:.1} s)\n",
            out.display(),
            t.vms.len(),
            t.slots.len(),
            t.spans.len(),
            t.preemptions.len(),
            t.end_ns.saturating_sub(t.start_ns) as f64 / 1e9
        )),
        Err(e) => {
            eprintln!("hqdmux timeline: {}: {e}", out.display());
            ExitCode::from(EXIT_UNREACHABLE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_default_api_socket_is_per_user_or_system_wide_for_root() {
        let xdg = std::env::temp_dir().join(format!("hqdmux-xdg-{}", std::process::id()));
        assert_eq!(
            default_api_socket_for(1000, Some(xdg.as_os_str())).unwrap(),
            xdg.join("hqdmux/api.sock")
        );
        // Root: the system path whatever XDG_RUNTIME_DIR says.
        for x in [Some(xdg.as_os_str()), None] {
            assert_eq!(
                default_api_socket_for(0, x).unwrap(),
                Path::new("/run/hqdmux/api.sock")
            );
        }
        for bad in [
            None,
            Some(std::ffi::OsStr::new("")),
            Some(std::ffi::OsStr::new("rel")),
        ] {
            let e = default_api_socket_for(1000, bad).unwrap_err();
            assert!(
                e.contains("XDG_RUNTIME_DIR") && e.contains("--api-socket"),
                "{e}"
            );
        }
        // Serving: an explicit path as given, none without the option.
        assert_eq!(server_socket(None).unwrap(), None);
        let p = xdg.join("x.sock");
        assert_eq!(server_socket(Some(Some(p.clone()))).unwrap(), Some(p));
        assert_eq!(
            client_socket("ps", Some(xdg.join("y.sock"))).unwrap(),
            xdg.join("y.sock")
        );
        // A bare `--api-socket`: the default, its directory created.
        let _ = std::fs::remove_dir_all(&xdg);
        let def = default_api_socket_for(1000, Some(xdg.as_os_str())).unwrap();
        let got = server_socket_with(Some(None), || Ok(def.clone())).unwrap();
        assert_eq!(got.as_deref(), Some(def.as_path()));
        let dir = xdg.join("hqdmux");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "{mode:o}");
        let e = server_socket_with(Some(None), || Err("none".into())).unwrap_err();
        assert_eq!(e, "none");
        let _ = std::fs::remove_dir_all(&xdg);
    }

    #[test]
    fn metrics_timeline_and_unquarantine_exit_codes_over_a_real_socket() {
        let dir = std::env::temp_dir().join(format!("hqdmux-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let nowhere = dir.join("none.sock");
        let out = dir.join("t.svg");
        let unreachable = ExitCode::from(EXIT_UNREACHABLE);
        assert_eq!(metrics(&nowhere), unreachable);
        assert_eq!(timeline(&nowhere, &out, 5, false, None), unreachable);
        assert_eq!(unquarantine(&nowhere, "a", false), unreachable);

        // A fleet without GPU VMs: metrics answer, the timeline is refused
        // (409, exit 1) and nothing is written, so is clear-quarantine.
        let cfg = crate::config::FleetConfig::parse(
            "[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\n",
            Path::new("/x/f.toml"),
        )
        .unwrap();
        let ctl = std::sync::Arc::new(crate::api::FleetControl::new(
            std::sync::Arc::new(crate::fleet::FleetGpus::new(&cfg)),
            &cfg,
            &[None],
        ));
        let sock = dir.join("api.sock");
        let server = crate::api::serve(&sock, 0o600, ctl).unwrap();
        assert_eq!(metrics(&sock), ExitCode::SUCCESS);
        assert_eq!(
            timeline(&sock, &out, 5, false, None),
            ExitCode::from(EXIT_REFUSED)
        );
        assert!(!out.exists());
        assert_eq!(
            unquarantine(&sock, "a", false),
            ExitCode::from(EXIT_REFUSED)
        );
        assert_eq!(unquarantine(&sock, "b", true), ExitCode::from(EXIT_REFUSED));
        // `call`: the answer's JSON on 2xx, the refusal's exit code else.
        let v = call("ps", &sock, "GET", "/vms", None).unwrap();
        assert_eq!(v["vms"][0]["name"], "a", "{v}");
        assert_eq!(
            call("stats", &sock, "GET", "/vms/nosuch", None).unwrap_err(),
            ExitCode::from(EXIT_REFUSED)
        );
        drop(server);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// `top` shows the vGPUs a daemon serves (`GET /api/v1/vgpus`, typed
    /// as the API writes them) beside or instead of its VMs.
    #[test]
    fn top_shows_served_vgpus_beside_the_vms() {
        let vgpus: VgpuList = serde_json::from_value(json!({"vgpus": [
            {"name": "training", "socket": "/run/t.sock", "state": "connected",
             "priority": 2, "weight": 1, "gpu_id": 0, "doorbell_page": true,
             "mmap_doorbells": 9, "connections": 3, "gpu_time_ms": 12.5,
             "share": 0.5, "preemptions": 4},
            {"name": "inference", "socket": "/run/i.sock", "state": "idle",
             "priority": 12, "weight": 1, "gpu_id": 0}
        ]}))
        .unwrap();
        let vms: VmList = serde_json::from_value(json!({"vms": [
            {"name": "web", "state": "running", "gpu": false}
        ]}))
        .unwrap();
        let rows = |t: &str, first: &str| -> Vec<String> {
            t.lines()
                .filter(|l| l.split_whitespace().next() == Some(first))
                .map(str::to_owned)
                .collect()
        };
        // A daemon serving only vGPUs: their table alone, one row each.
        let only = top_screen(None, &VmList::default(), &vgpus);
        assert_eq!(rows(&only, "vgpu").len(), 1, "{only}");
        assert_eq!(rows(&only, "vm").len(), 0, "{only}");
        assert_eq!(rows(&only, "training").len(), 1, "{only}");
        assert!(rows(&only, "training")[0].contains("connected"), "{only}");
        assert_eq!(rows(&only, "inference").len(), 1, "{only}");
        // VMs and vGPUs: both tables.
        let both = top_screen(None, &vms, &vgpus);
        assert_eq!(rows(&both, "vm").len(), 1, "{both}");
        assert_eq!(rows(&both, "vgpu").len(), 1, "{both}");
        assert_eq!(rows(&both, "web").len(), 1, "{both}");
        assert_eq!(rows(&both, "training").len(), 1, "{both}");
        // A fleet without vGPUs: the VM table as before.
        let plain = top_screen(None, &vms, &VgpuList::default());
        assert_eq!(plain, top_header(None, None) + &table(&vms.vms));
    }

    #[test]
    fn top_fits_the_terminal() {
        let text = "\x1b[H\x1b[2Jheader line that is long\n\nrow1\nrow2\nrow3\n";
        // Large enough: unchanged.
        assert_eq!(fit(text, 80, 24), text);
        // Narrow: every line cut to the width, the clear kept.
        let f = fit(text, 6, 24);
        assert!(f.starts_with("\x1b[H\x1b[2Jheader\n\nrow1\n"), "{f:?}");
        assert!(f.lines().skip(1).all(|l| l.chars().count() <= 6), "{f:?}");
        // Short: rows - 1 lines, the last says how many are not shown.
        let f = fit(text, 80, 4);
        let lines: Vec<&str> = f.lines().collect();
        assert_eq!(lines.len(), 3, "{f:?}");
        assert_eq!(lines[2], "... 3 more lines (a larger terminal shows them)");
    }

    #[test]
    fn the_promise_check_differences_two_reads_and_the_column_says_it() {
        let view = |name: &str, weight: u32, at: f64, demanding: f64, cu: f64| -> VmView {
            serde_json::from_value(json!({
                "name": name, "state": "running", "gpu": true, "priority": 4,
                "weight": weight, "quantum_ms": 10.0, "gpu_time_ms": cu,
                "promise": {"at_ms": at, "partition": 0, "demanding": true,
                    "level_quantum_ms": 10.0, "cu_time_ms": cu,
                    "demanding_ms": demanding, "wait_ms": 0.0}
            }))
            .unwrap()
        };
        let first = VmList {
            vms: vec![
                view("a", 1, 1000.0, 0.0, 0.0),
                view("b", 3, 1000.0, 0.0, 0.0),
            ],
        };
        // b got 1:1 instead of 1:3 over 10 s; a VM only in the second read
        // and a VM without a vGPU are not checked.
        let mut second = VmList {
            vms: vec![
                view("a", 1, 11_000.0, 10_000.0, 500.0),
                view("b", 3, 11_000.0, 10_000.0, 500.0),
                view("late", 1, 11_000.0, 10_000.0, 500.0),
            ],
        };
        second.vms.push(VmView {
            name: "cpu".into(),
            ..Default::default()
        });
        let v = promise_check(&first, &second);
        assert_eq!(v.len(), 2);
        assert!((v[0].entitled - 0.25).abs() < 1e-12 && (v[1].entitled - 0.75).abs() < 1e-12);
        assert!(v[0].held && !v[1].held, "{v:?}");
        let t = promise_table(&v);
        assert!(t.lines().nth(2).unwrap().contains(" NO "), "{t}");
        // The window covered is the reads' (10 s on the arbiter's clock),
        // whatever was asked for; the longest VM window when they differ.
        let samples = window_samples(&first, &second);
        assert_eq!(covered_window(&samples), Some(Duration::from_secs(10)));
        let mut longer = second.clone();
        longer.vms[1] = view("b", 3, 11_500.0, 10_000.0, 500.0);
        let samples = window_samples(&first, &longer);
        assert_eq!(
            covered_window(&samples),
            Some(Duration::from_millis(10_500))
        );
        assert_eq!(covered_window(&[]), None);
        // The ps column.
        let mut p = second.vms[0].promise.clone().unwrap();
        assert_eq!(entitled_vs_got(Some(&p)), "-");
        p.entitled_share = Some(0.25);
        p.got_share = Some(0.5);
        p.held = Some(true);
        p.demand = Some(Demand::Limited);
        assert_eq!(entitled_vs_got(Some(&p)), "25/50%L");
        p.held = Some(false);
        p.demand = Some(Demand::Backlogged);
        assert_eq!(entitled_vs_got(Some(&p)), "25/50%!");
        assert_eq!(entitled_vs_got(None), "-");
    }

    #[test]
    fn names_are_percent_encoded_and_tables_show_every_vm() {
        assert_eq!(encode_segment("vm-a_1.x"), "vm-a_1.x");
        assert_eq!(encode_segment("a/b c"), "a%2Fb%20c");
        let vms: Vec<VmView> = [
            json!({"name": "a", "state": "running", "gpu": true, "priority": 3, "weight": 2,
                   "quantum_ms": 4.0, "gpu_time_ms": 12.5, "share": 0.25, "preemptions": 1,
                   "cwsr_time_ms": 0.05, "latency_p50_ms": 0.125,
                   "latency_p99_ms": 2.5, "queue_errors": 7, "quarantined": true, "outcome": null}),
            json!({"name": "b", "state": "exited", "gpu": false, "outcome": "exited with status 0",
                   "latency_p50_ms": 17600.0, "latency_p99_ms": 2592000000.0,
                   "latency_limit_ms": 2592000000.0}),
            json!({"name": "c\u{1b}[2J\u{7}", "state": "failed", "outcome": "x\ny"}),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
        let t = table(&vms);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(!t.contains('\u{1b}') && !t.contains('\u{7}'), "{t:?}");
        assert!(lines[3].starts_with("c\\u{1b}[2J\\u{7} "), "{t}");
        assert!(lines[3].ends_with("x\\ny"), "{t}");
        assert_eq!(escape_lines("a\u{7}\nb"), "a\\u{7}\nb");
        // Quotes are not escaped (a refusal quotes the VM name), a
        // backslash is, so an escaped byte and a literal `\u{1b}` differ.
        assert_eq!(
            escape("vm 'x\u{1b}' \"y\" a\\b"),
            "vm 'x\\u{1b}' \"y\" a\\\\b"
        );
        assert!(
            lines[1].starts_with("a ")
                && lines[1].contains("25.0%")
                && lines[1].contains(" 0.125 ")
                && lines[1].contains(" 2.500 ")
                && lines[1].contains(" 7  YES"),
            "{t}"
        );
        assert!(lines[2].ends_with("exited with status 0"), "{t}");
        // top's header sums the GPUs and lists each when there are several.
        let g = |id: u32, c: u64| crate::api::GpuView {
            gpu_id: id,
            policy: PolicyName(scheduler::Policy::Hqdmux),
            xccs: 8,
            partitions: 1,
            gpu_compute_partition_type: "SPX".into(),
            vms: 1,
            completions: c,
            maps: 0,
            preemptions: c / 10,
            quarantined_vms: 0,
        };
        let f = FleetView {
            gpu: Some(g(0, 100)),
            gpus: vec![g(0, 100), g(1, 20)],
            ..Default::default()
        };
        let h = top_header(Some(&f), f.gpu.as_ref());
        assert!(h.contains("completions 120  preemptions 12 "), "{h}");
        assert!(h.contains("\n  gpu 1  SPX vms 1   completions 20 "), "{h}");
        let one = FleetView {
            gpus: vec![g(0, 100)],
            ..f.clone()
        };
        let h1 = top_header(Some(&one), one.gpu.as_ref());
        assert!(
            h1.ends_with("interval)\n\n") && !h1.contains("  gpu "),
            "{h1}"
        );
        // The gpu column names the VM's GPU.
        let on1: VmView =
            serde_json::from_value(json!({"name": "g", "gpu": true, "gpu_id": 1})).unwrap();
        let t1 = table(&[on1]);
        assert!(
            t1.lines()
                .nth(1)
                .unwrap()
                .starts_with("g                starting    1 "),
            "{t1}"
        );
        assert!(
            lines[2].contains(" 17600.000 >2592000000 "),
            "past the limit: '>': {t}"
        );
    }
}
