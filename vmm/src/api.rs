//! The operator's control socket of a running fleet
//! (`hqdmux run --api-socket PATH`, driven by `hqdmux ctl PATH ...`).
//!
//! One request per connection: a single text line, answered with text lines,
//! then the connection closes. A reply that starts with `error:` is a refusal
//! (it names the VM, the field and the reason).
//!
//! | request | effect |
//! |---|---|
//! | `list` | one line per VM: name, state, gpu, priority, weight, GPU time, maps, preemptions |
//! | `priority NAME P` | set the VM's GPU priority (0..=15) live |
//! | `weight NAME W` | set the VM's weight (1..=1000) live |
//! | `policy` | print the fleet's scheduling policy |
//! | `policy P` | switch the scheduling policy live (`hqdmux`, `fifo`, `poll5ms`, `timeslice`, `reset`) |

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use mdev::arbiter::GpuArbiter;
use mdev::vgpu::VgpuHandle;

use crate::config::{PRIORITY_RANGE, WEIGHT_RANGE};

const USAGE: &str = "list | priority NAME P | weight NAME W | policy [P]";

/// One control-socket request, split into words but not yet checked against
/// the fleet (VM names, value ranges and policy names are checked by
/// [`FleetControl::handle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// `list`.
    List,
    /// `priority NAME P`.
    Priority {
        /// VM name.
        vm: &'a str,
        /// The requested priority, unparsed.
        value: &'a str,
    },
    /// `weight NAME W`.
    Weight {
        /// VM name.
        vm: &'a str,
        /// The requested weight, unparsed.
        value: &'a str,
    },
    /// `policy` (print) or `policy P` (switch).
    Policy(Option<&'a str>),
}

/// A request line that is not a [`Request`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No words at all.
    #[error("empty request (try: {USAGE})")]
    Empty,
    /// An unknown verb or a wrong number of words (the trimmed line).
    #[error("unknown request '{0}' (try: {USAGE})")]
    Unknown(String),
}

/// Parses one request line (pure: no fleet state is read).
pub fn parse_request(line: &str) -> Result<Request<'_>, RequestError> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["list"] => Ok(Request::List),
        ["priority", vm, value] => Ok(Request::Priority { vm, value }),
        ["weight", vm, value] => Ok(Request::Weight { vm, value }),
        ["policy"] => Ok(Request::Policy(None)),
        ["policy", p] => Ok(Request::Policy(Some(p))),
        [] => Err(RequestError::Empty),
        _ => Err(RequestError::Unknown(line.trim().to_owned())),
    }
}

/// What the control socket can see and steer.
pub struct FleetControl {
    arbiter: Option<Arc<GpuArbiter>>,
    vms: Mutex<Vec<VmEntry>>,
}

struct VmEntry {
    name: String,
    vgpu: Option<VgpuHandle>,
    ended: bool,
}

impl FleetControl {
    /// Control over `names` (config order) with their vGPU handles.
    pub fn new(arbiter: Option<Arc<GpuArbiter>>, vms: Vec<(String, Option<VgpuHandle>)>) -> Self {
        FleetControl {
            arbiter,
            vms: Mutex::new(
                vms.into_iter()
                    .map(|(name, vgpu)| VmEntry {
                        name,
                        vgpu,
                        ended: false,
                    })
                    .collect(),
            ),
        }
    }

    /// Marks VM `i` as ended (its vGPU is gone).
    pub fn ended(&self, i: usize) {
        if let Some(v) = self.vms.lock().unwrap().get_mut(i) {
            v.ended = true;
        }
    }

    /// Answers one request line.
    pub fn handle(&self, line: &str) -> String {
        match parse_request(line) {
            Ok(Request::List) => self.list(),
            Ok(Request::Priority { vm, value }) => self.set(vm, "priority", value, PRIORITY_RANGE),
            Ok(Request::Weight { vm, value }) => self.set(vm, "weight", value, WEIGHT_RANGE),
            Ok(Request::Policy(None)) => match &self.arbiter {
                Some(m) => format!("policy {}\n", m.policy().name()),
                None => "error: policy: the fleet has no GPU VMs\n".into(),
            },
            Ok(Request::Policy(Some(p))) => self.set_policy(p),
            Err(e) => format!("error: {e}\n"),
        }
    }

    fn set_policy(&self, name: &str) -> String {
        let Some(p) = scheduler::Policy::from_name(name) else {
            let names: Vec<&str> = scheduler::Policy::ALL.iter().map(|p| p.name()).collect();
            return format!(
                "error: policy: unknown policy '{name}' (one of: {})\n",
                names.join(", ")
            );
        };
        let Some(m) = &self.arbiter else {
            return "error: policy: the fleet has no GPU VMs\n".into();
        };
        m.set_policy(p);
        log::info!("api: policy = {name}");
        format!("ok: policy = {name}\n")
    }

    fn list(&self) -> String {
        let vms = self.vms.lock().unwrap();
        let mut out = String::new();
        for v in vms.iter() {
            let state = if v.ended { "ended" } else { "running" };
            let status = v
                .vgpu
                .zip(self.arbiter.as_ref())
                .and_then(|(h, m)| m.vm_status(h));
            match status {
                Some((p, s)) => {
                    out += &format!(
                    "{} state={state} gpu=yes priority={} weight={} gpu_ms={:.1} maps={} preemptions={}\n",
                    v.name,
                    p.priority,
                    p.weight,
                    s.gpu_ns as f64 / 1e6,
                    s.maps,
                    s.preemptions
                )
                }
                None => out += &format!("{} state={state} gpu=no\n", v.name),
            }
        }
        out
    }

    fn set(
        &self,
        name: &str,
        field: &str,
        value: &str,
        range: std::ops::RangeInclusive<u32>,
    ) -> String {
        let vms = self.vms.lock().unwrap();
        let Some(v) = vms.iter().find(|v| v.name == name) else {
            return format!("error: vm '{name}': no such VM\n");
        };
        let Ok(x) = value.parse::<u32>() else {
            return format!("error: vm '{name}': {field}: '{value}' is not a number\n");
        };
        if !range.contains(&x) {
            return format!(
                "error: vm '{name}': {field}: {x} is out of range {}..={}\n",
                range.start(),
                range.end()
            );
        }
        let (Some(h), Some(m), false) = (v.vgpu, self.arbiter.as_ref(), v.ended) else {
            return format!("error: vm '{name}': {field}: the VM has no running vGPU\n");
        };
        let r = if field == "priority" {
            m.set_priority(h, x as u8)
        } else {
            m.set_weight(h, x)
        };
        match r {
            Ok(()) => {
                log::info!("api: vm '{name}': {field} = {x}");
                format!("ok: vm '{name}': {field} = {x}\n")
            }
            Err(e) => format!("error: vm '{name}': {field}: {e}\n"),
        }
    }
}

/// A listening control socket; stops (and removes the socket file) on drop.
pub struct ApiServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ApiServer {
    /// Listens on `path` (an existing socket file there is replaced).
    pub fn start(path: &Path, ctl: Arc<FleetControl>) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("hqdmux-api".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => serve(conn, &ctl),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(10))
                        }
                        Err(e) => {
                            log::warn!("api: accept failed: {e}");
                            std::thread::sleep(Duration::from_millis(10))
                        }
                    }
                }
            })?;
        Ok(ApiServer {
            path: path.to_owned(),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(conn: UnixStream, ctl: &FleetControl) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let mut line = String::new();
    let mut reader = BufReader::new(&conn);
    // Requests are short; a line longer than 4 KiB is refused.
    let reply = match reader.by_ref().take(4096).read_line(&mut line) {
        Ok(_) => ctl.handle(&line),
        Err(e) => format!("error: unreadable request: {e}\n"),
    };
    let _ = (&conn).write_all(reply.as_bytes());
}

/// Client side: sends `request` to the socket at `path`, returns the reply.
pub fn request(path: &Path, request: &str) -> std::io::Result<String> {
    let mut conn = UnixStream::connect(path)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    conn.write_all(request.as_bytes())?;
    conn.write_all(b"\n")?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut conn, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_without_a_gpu_are_refused_with_vm_field_and_reason() {
        let ctl = FleetControl::new(None, vec![("a".into(), None)]);
        assert_eq!(ctl.handle("list"), "a state=running gpu=no\n");
        assert_eq!(ctl.handle("priority b 3"), "error: vm 'b': no such VM\n");
        assert_eq!(
            ctl.handle("priority a 16"),
            "error: vm 'a': priority: 16 is out of range 0..=15\n"
        );
        assert_eq!(
            ctl.handle("weight a x"),
            "error: vm 'a': weight: 'x' is not a number\n"
        );
        assert_eq!(
            ctl.handle("priority a 3"),
            "error: vm 'a': priority: the VM has no running vGPU\n"
        );
        assert!(ctl
            .handle("reboot a")
            .starts_with("error: unknown request 'reboot a'"));
        assert_eq!(
            ctl.handle("policy lottery"),
            "error: policy: unknown policy 'lottery' (one of: hqdmux, fifo, poll5ms, timeslice, reset)\n"
        );
        assert_eq!(
            ctl.handle("policy fifo"),
            "error: policy: the fleet has no GPU VMs\n"
        );
    }

    #[test]
    fn parse_request_splits_words_and_refuses_the_rest() {
        assert_eq!(parse_request(" list \n"), Ok(Request::List));
        assert_eq!(
            parse_request("priority vm-a 16"),
            Ok(Request::Priority {
                vm: "vm-a",
                value: "16"
            })
        );
        assert_eq!(
            parse_request("weight\tb x"),
            Ok(Request::Weight {
                vm: "b",
                value: "x"
            })
        );
        assert_eq!(parse_request("policy"), Ok(Request::Policy(None)));
        assert_eq!(
            parse_request("policy fifo"),
            Ok(Request::Policy(Some("fifo")))
        );
        assert_eq!(parse_request(" \r\n"), Err(RequestError::Empty));
        assert_eq!(
            parse_request("priority a 1 2\n"),
            Err(RequestError::Unknown("priority a 1 2".into()))
        );
        assert_eq!(
            parse_request("LIST"),
            Err(RequestError::Unknown("LIST".into()))
        );
    }

    #[test]
    fn socket_round_trip() {
        let dir = std::env::temp_dir().join(format!("hqdmux-api-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("api.sock");
        let ctl = Arc::new(FleetControl::new(None, vec![("vm0".into(), None)]));
        let server = ApiServer::start(&path, ctl.clone()).unwrap();
        assert_eq!(
            request(&path, "list").unwrap(),
            "vm0 state=running gpu=no\n"
        );
        ctl.ended(0);
        assert_eq!(request(&path, "list").unwrap(), "vm0 state=ended gpu=no\n");
        drop(server);
        assert!(!path.exists(), "socket file removed");
        assert!(request(&path, "list").is_err());
    }
}
