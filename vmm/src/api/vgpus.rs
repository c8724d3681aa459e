//! The vGPUs of `hqdmux serve` over the operator API (`/api/v1/vgpus...`):
//! created, listed, steered, paused and removed live.
//!
//! | method and path | effect |
//! |---|---|
//! | `GET /api/v1/vgpus` | every vGPU's view (devices file order, then created ones) |
//! | `POST /api/v1/vgpus` | create one ([`VgpuCreate`]); 201 with its view (its socket) |
//! | `GET /api/v1/vgpus/{name}` | one vGPU's view |
//! | `PATCH /api/v1/vgpus/{name}` | priority, weight, slice, preemption timeout, guard ([`VmUpdate`]) |
//! | `POST /api/v1/vgpus/{name}/pause`, `.../resume` | hold its queues (CWSR-saved) / release them |
//! | `POST /api/v1/vgpus/{name}/clear-quarantine` | lift its guard quarantine, connected or idle |
//! | `DELETE /api/v1/vgpus/{name}` | disconnect its client (queues released as a dying VM's), remove the socket |
//!
//! The vGPU's misbehaving-VM guard (counts, quarantine) and its hang
//! escalation belong to the vGPU, not to a connection: a VMM that
//! reconnects (or resets the device) finds them as it left them. The
//! operator starts them over: clear-quarantine, or DELETE and create again.
//!
//! A steer or a pause is recorded in the vGPU's spec under the server's
//! registration lock ([`VgpuServer::with_registration`]): it applies at
//! once to the connected client and to every later one (a VM reboot keeps
//! it). Bodies are read whole and checked before anything applies;
//! errors name the vGPU and the field.
//!
//! Each vGPU is on one of the daemon's GPUs (`gpu_id`) and registers with
//! that GPU's arbiter, started with the GPU's first vGPU. Shares, metrics
//! states and timelines are per GPU: a vGPU competes only with the vGPUs of
//! its own GPU.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use mdev::arbiter::GpuArbiter;
use mdev::vgpu::VmId;
use scheduler::VmParams;
use vfio_server::{ServeError, ServerOptions, ServerStats, VgpuServer, VgpuSpec};

use super::types::{
    self, ApiError, TenantView, VgpuCreate, VgpuList, VgpuState, VgpuView, VmUpdate,
};
use crate::config::{FleetConfig, VmConfig};
use crate::fleet::FleetGpus;
use crate::http::Request;

/// Longest socket path (bytes): `sun_path` holds 108 with its NUL.
pub const MAX_SOCKET_PATH: usize = 107;

/// One served vGPU.
struct Served {
    server: Arc<VgpuServer>,
    thread: Option<JoinHandle<()>>,
    /// Its GPU's id and arbiter.
    gpu_id: u32,
    arbiter: Arc<GpuArbiter>,
    /// Why it is on `gpu_id`.
    placement: String,
    /// The last registration seen (its figures stay readable while idle).
    last: Option<VmId>,
    /// GPU time of `last` at the previous sample, and the share since.
    sample_ns: u64,
    share: Option<f64>,
}

struct Inner {
    vgpus: Vec<Served>,
}

/// The daemon's vGPUs: what the API sees and steers of them.
pub struct VgpuControl {
    /// One arbiter per GPU, started with the GPU's first vGPU.
    gpus: Arc<FleetGpus>,
    /// The daemon's GPUs (ids, topologies, guard defaults) and scheduler.
    fleet: FleetConfig,
    socket_dir: PathBuf,
    opts: ServerOptions,
    inner: Mutex<Inner>,
}

/// Why a vGPU could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another vGPU has the name.
    #[error("name: a vGPU named '{0}' exists")]
    Name(String),
    /// Another vGPU has the socket.
    #[error("socket: {0} is another vGPU's")]
    Socket(PathBuf),
    /// Binding or serving the socket failed.
    #[error("socket: {0}")]
    Serve(#[from] ServeError),
    /// Its GPU's arbiter could not be started.
    #[error("gpu_id: GPU {0}: {1}")]
    Gpu(u32, String),
}

/// What a removed or stopped vGPU did.
pub type VgpuReport = (String, ServerStats);

impl VgpuControl {
    /// Control over vGPUs on the GPUs of `fleet` (`gpus` are their
    /// arbiters, started on demand from `fleet`); a created vGPU's guard
    /// starts from its GPU's `[gpu.guard]`; sockets created over the API
    /// must lie in `socket_dir`.
    pub fn new(
        gpus: Arc<FleetGpus>,
        fleet: FleetConfig,
        socket_dir: PathBuf,
        opts: ServerOptions,
    ) -> Self {
        let socket_dir = socket_dir.canonicalize().unwrap_or(socket_dir);
        VgpuControl {
            gpus,
            fleet,
            socket_dir,
            opts,
            inner: Mutex::new(Inner { vgpus: Vec::new() }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The directory API-created sockets must lie in.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// Binds `socket` and serves `spec` on it (names and sockets unique)
    /// with GPU `gpu_id`'s arbiter, started if it is the GPU's first vGPU;
    /// `doorbell_page`: BAR2 offered as an mmap-able page; `placement`:
    /// why it is on that GPU.
    pub fn start(
        &self,
        spec: VgpuSpec,
        socket: &Path,
        doorbell_page: bool,
        gpu_id: u32,
        placement: String,
    ) -> Result<(), StartError> {
        let mut inner = self.lock();
        self.start_in(&mut inner, spec, socket, doorbell_page, gpu_id, placement)
    }

    /// GPU `id`'s arbiter, started if it is not yet; a GPU started while
    /// others run takes their scheduling policy (one policy for the
    /// daemon, as `PUT /api/v1/policy` sets it).
    fn arbiter(&self, id: u32) -> Result<Arc<GpuArbiter>, StartError> {
        if let Some(m) = self.gpus.get(id) {
            return Ok(m.clone());
        }
        let m = self
            .gpus
            .start(&self.fleet, id)
            .map_err(|e| StartError::Gpu(id, e.to_string()))?;
        if let Some((_, o)) = self.gpus.started().find(|(i, _)| *i != id) {
            m.set_policy(o.policy());
        }
        log::info!("serve: gpu {id}: arbiter started");
        Ok(m)
    }

    fn start_in(
        &self,
        inner: &mut Inner,
        spec: VgpuSpec,
        socket: &Path,
        doorbell_page: bool,
        gpu_id: u32,
        placement: String,
    ) -> Result<(), StartError> {
        if inner
            .vgpus
            .iter()
            .any(|v| v.server.spec().name == spec.name)
        {
            return Err(StartError::Name(spec.name));
        }
        // Compared as files, not as spellings: a relative devices-file
        // path, or one through a symlinked directory, is the same socket
        // as the API's absolute one (else the bind below would probe the
        // live vGPU with a connection of its own).
        let key = socket_key(socket);
        if inner
            .vgpus
            .iter()
            .any(|v| socket_key(v.server.path()) == key)
        {
            return Err(StartError::Socket(socket.into()));
        }
        let name = spec.name.clone();
        let (priority, weight) = (spec.params.priority, spec.params.weight);
        let opts = ServerOptions {
            doorbell_poll: doorbell_page.then_some(vfio_server::DEFAULT_DOORBELL_POLL),
            ..self.opts
        };
        let arbiter = self.arbiter(gpu_id)?;
        let server = VgpuServer::bind(socket, spec, arbiter.clone(), opts)?;
        let thread = server
            .spawn()
            .map_err(|e| ServeError::Io(socket.into(), e))?;
        log::info!(
            "vgpu '{name}': serving vfio-user on {} (gpu {gpu_id}, priority {priority}, \
             weight {weight})",
            socket.display()
        );
        inner.vgpus.push(Served {
            server,
            thread: Some(thread),
            gpu_id,
            arbiter,
            placement,
            last: None,
            sample_ns: 0,
            share: None,
        });
        Ok(())
    }

    /// Number of vGPUs.
    pub fn len(&self) -> usize {
        self.lock().vgpus.len()
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `GET /vgpus`.
    pub fn list(&self) -> VgpuList {
        let mut inner = self.lock();
        VgpuList {
            vgpus: inner.vgpus.iter_mut().map(|v| self.view(v)).collect(),
        }
    }

    /// `GET /vgpus/{name}`.
    pub fn get(&self, name: &str) -> Result<VgpuView, ApiError> {
        let mut inner = self.lock();
        let i = find(&inner, name)?;
        Ok(self.view(&mut inner.vgpus[i]))
    }

    fn view(&self, v: &mut Served) -> VgpuView {
        let srv = &v.server;
        let spec = srv.spec();
        let stats = srv.stats();
        let a = &v.arbiter;
        let live = srv.handle();
        if live.is_some() {
            v.last = live;
        }
        let status = live.and_then(|h| a.vm_status(h));
        let controls = live.and_then(|h| a.vm_controls(h));
        let (priority, weight) = status
            .map(|(p, _)| (p.priority, p.weight))
            .unwrap_or((spec.params.priority, spec.params.weight));
        let quantum_override = match controls {
            Some((_, q)) => q,
            None => spec.quantum,
        };
        let quantum = quantum_override.unwrap_or_else(|| a.level_quantum(priority));
        let errors = v.last.and_then(|h| a.vm_queue_errors(h));
        let latency = v.last.and_then(|h| a.vm_packet_latency(h));
        let ms = |ns: u64| ns as f64 / 1e6;
        VgpuView {
            name: spec.name.clone(),
            socket: srv.path().display().to_string(),
            state: if live.is_some() {
                VgpuState::Connected
            } else {
                VgpuState::Idle
            },
            paused: srv.paused(),
            doorbell_page: srv.options().doorbell_poll.is_some(),
            mmap_doorbells: stats.mmap_doorbells,
            tenant: TenantView {
                priority: u32::from(priority),
                weight,
                quantum_ms: Some(quantum.as_secs_f64() * 1e3),
                quantum_override: quantum_override.is_some(),
                preempt_timeout_ms: live
                    .and_then(|h| a.preempt_timeout(h))
                    .unwrap_or(spec.preempt_timeout)
                    .as_millis() as u64,
                gpu_time_ms: status.map(|(_, s)| ms(s.gpu_ns)),
                share: v.share.filter(|_| live.is_some()),
                preemptions: status.map(|(_, s)| s.preemptions),
                queue_errors: errors.map(|e| e.values().sum()),
                quarantined: Some(srv.quarantined().is_some()),
                ..Default::default()
            }
            .with_latency(latency),
            partition: spec.params.partition,
            gpu_id: v.gpu_id,
            placement: v.placement.clone(),
            queues: live.and_then(|h| a.vm_queue_count(h)).map(|n| n as u64),
            connections: stats.connections,
            doorbells: stats.doorbells,
        }
    }

    /// Samples each connected vGPU's GPU time: its share of the GPU time
    /// of the vGPUs on its GPU since the previous sample.
    pub fn sample(&self) {
        let mut inner = self.lock();
        let mut deltas = Vec::with_capacity(inner.vgpus.len());
        for v in inner.vgpus.iter_mut() {
            let h = v.server.handle();
            if h != v.last && h.is_some() {
                v.last = h;
                v.sample_ns = 0;
            }
            match h.and_then(|h| v.arbiter.vm_status(h)) {
                Some((_, s)) => {
                    deltas.push(Some(s.gpu_ns.saturating_sub(v.sample_ns)));
                    v.sample_ns = s.gpu_ns;
                }
                None => deltas.push(None),
            }
        }
        let on: Vec<(u32, Option<u64>)> = inner
            .vgpus
            .iter()
            .zip(&deltas)
            .map(|(v, d)| (v.gpu_id, *d))
            .collect();
        for (v, share) in inner.vgpus.iter_mut().zip(shares_per_gpu(&on)) {
            v.share = share;
        }
    }

    /// `POST /vgpus`: checks the whole body, binds the socket, serves it.
    pub fn create(&self, req: &Request) -> Result<VgpuView, ApiError> {
        let c: VgpuCreate = types::decode_json(req.header("content-type"), &req.body, "vgpu")?;
        let place = format!("vgpu '{}'", c.name);
        let bad =
            |field: &str, reason: String| ApiError::invalid(format!("{place}: {field}"), reason);
        if let Some(why) = crate::config::name_problem(&c.name) {
            return Err(bad("name", why));
        }
        if let Some(id) = c.gpu_id {
            if self.fleet.gpu(id).is_none() {
                let ids: Vec<String> = self.fleet.gpus.iter().map(|g| g.id.to_string()).collect();
                // 422 as an added VM's unknown `gpu_id`.
                return Err(ApiError::Unprocessable(format!(
                    "{place}: gpu_id: no GPU with id {id} (this daemon's GPUs: {})",
                    ids.join(", ")
                )));
            }
        }
        if let Some(p) = c.partition {
            // Its GPU's partitions, or (placed) the most any GPU has.
            let parts = self
                .fleet
                .gpus
                .iter()
                .filter(|g| c.gpu_id.is_none_or(|id| g.id == id))
                .map(|g| g.topology.partitions())
                .max()
                .unwrap_or(1);
            if p >= parts {
                return Err(bad(
                    "partition",
                    format!("{p} is out of range 0..={}", parts - 1),
                ));
            }
        }
        if c.guard.is_some_and(|g| g.is_empty()) {
            return Err(bad(
                "guard",
                format!("empty object (fields: {})", types::GuardUpdate::FIELDS),
            ));
        }
        // The guard: its GPU's `[gpu.guard]` with the override, checked
        // once the GPU is known.
        let guard_on = |id: u32| {
            let base = self
                .fleet
                .gpu(id)
                .map_or(self.fleet.first_gpu().guard, |g| g.guard);
            match c.guard {
                Some(g) => base.with(&g.to_override()),
                None => base,
            }
        };
        let socket = self
            .socket_path(c.socket.as_deref(), &c.name)
            .map_err(|r| ApiError::Unprocessable(format!("{place}: socket: {r}")))?;
        let priority = c.priority.map_or(0, |p| p.0);
        let weight = c.weight.map_or(1, |w| w.0);
        let mut inner = self.lock();
        // Its GPU: `gpu_id` as given, else placed against the vGPUs there
        // (under the lock: two quick creates see each other).
        let (gpu_id, placement) = match c.gpu_id {
            Some(id) => (id, format!("gpu_id = {id}")),
            None => {
                let placed: Vec<VmConfig> = inner
                    .vgpus
                    .iter()
                    .map(|v| {
                        let s = v.server.spec();
                        as_vm(s.name, s.params, Some(v.gpu_id))
                    })
                    .collect();
                let me = as_vm(
                    c.name.clone(),
                    VmParams {
                        priority,
                        weight,
                        partition: c.partition,
                    },
                    None,
                );
                let p = crate::config::place_vm(&self.fleet.gpus, &placed, &me);
                (p.gpu_id, p.reason)
            }
        };
        let guard = guard_on(gpu_id);
        guard.validate().map_err(|e| bad("guard", e.to_string()))?;
        let spec = VgpuSpec {
            name: c.name.clone(),
            params: VmParams {
                priority,
                weight,
                partition: c.partition,
            },
            preempt_timeout: Duration::from_millis(
                c.preempt_timeout_ms
                    .map_or(mdev::arbiter::DEFAULT_PREEMPT_TIMEOUT_MS, |t| t.0),
            ),
            guard,
            quantum: c.quantum_ms.map(|q| Duration::from_millis(q.0)),
        };
        self.start_in(
            &mut inner,
            spec,
            &socket,
            c.doorbell_page.unwrap_or(false),
            gpu_id,
            placement.clone(),
        )
        .map_err(|e| match e {
            StartError::Name(_) => ApiError::Unprocessable(format!("{place}: {e}")),
            _ => ApiError::Conflict(format!("{place}: {e}")),
        })?;
        drop(inner);
        log::info!(
            "api: vgpu '{}': created on {} (gpu {gpu_id}: {placement})",
            c.name,
            socket.display()
        );
        self.get(&c.name)
    }

    /// The socket of a created vGPU: `NAME.sock` in the socket directory,
    /// a file name there, or an absolute path directly inside it.
    fn socket_path(&self, asked: Option<&str>, name: &str) -> Result<PathBuf, String> {
        let dir = &self.socket_dir;
        let path = match asked {
            None => dir.join(format!("{name}.sock")),
            Some(s) => {
                let p = Path::new(s);
                let file = p
                    .file_name()
                    .filter(|f| !s.ends_with('/') && Path::new(f) != Path::new(".."))
                    .ok_or_else(|| format!("'{s}' names no file"))?;
                if s.contains('\0') {
                    return Err("contains NUL".into());
                }
                if p.components().count() > 1 {
                    let parent = p
                        .parent()
                        .filter(|_| p.is_absolute())
                        .and_then(|d| d.canonicalize().ok());
                    if parent.as_deref() != Some(dir.as_path()) {
                        return Err(format!(
                            "'{s}' is outside the vGPU socket directory {} (give a file name \
                             or a path directly inside it)",
                            dir.display()
                        ));
                    }
                }
                dir.join(file)
            }
        };
        if path.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(format!(
                "{} is longer than {MAX_SOCKET_PATH} bytes",
                path.display()
            ));
        }
        Ok(path)
    }

    fn server(&self, name: &str) -> Result<Arc<VgpuServer>, ApiError> {
        let inner = self.lock();
        let i = find(&inner, name)?;
        Ok(inner.vgpus[i].server.clone())
    }

    /// `PATCH /vgpus/{name}`: the whole update checked, then applied to
    /// the connected client (if any) and recorded for later ones.
    pub fn patch(&self, name: &str, req: &Request) -> Result<VgpuView, ApiError> {
        let place = format!("vgpu '{name}'");
        let srv = self.server(name)?;
        let u: VmUpdate = types::decode_json(req.header("content-type"), &req.body, &place)?;
        if u.is_empty() {
            return Err(ApiError::invalid(
                &place,
                format!("empty change (fields: {})", VmUpdate::FIELDS),
            ));
        }
        if u.guard.is_some_and(|g| g.is_empty()) {
            return Err(ApiError::invalid(
                format!("{place}: guard"),
                format!("empty object (fields: {})", types::GuardUpdate::FIELDS),
            ));
        }
        srv.with_registration(|s| {
            let guard = match u.guard {
                Some(o) => {
                    let g = s.spec.guard.with(&o.to_override());
                    g.validate()
                        .map_err(|e| ApiError::invalid(format!("{place}: guard"), e.to_string()))?;
                    Some(g)
                }
                None => None,
            };
            if let Some(h) = s.handle {
                let a = s.arbiter;
                let applied = (|| {
                    if let Some(p) = u.priority {
                        a.set_priority(h, p.0)
                            .map_err(|e| ("priority", e.to_string()))?;
                    }
                    if let Some(w) = u.weight {
                        a.set_weight(h, w.0)
                            .map_err(|e| ("weight", e.to_string()))?;
                    }
                    if let Some(q) = u.quantum_ms {
                        a.set_quantum(h, q.map(|q| Duration::from_millis(q.0)))
                            .map_err(|e| ("quantum_ms", e.to_string()))?;
                    }
                    if let Some(t) = u.preempt_timeout_ms {
                        a.set_preempt_timeout(h, Duration::from_millis(t.0))
                            .map_err(|e| ("preempt_timeout_ms", e.to_string()))?;
                    }
                    if let Some(g) = guard {
                        a.set_guard(h, g).map_err(|e| ("guard", e.to_string()))?;
                    }
                    Ok::<(), (&str, String)>(())
                })();
                if let Err((field, e)) = applied {
                    return Err(ApiError::Conflict(format!("{place}: {field}: {e}")));
                }
            }
            if let Some(p) = u.priority {
                s.spec.params.priority = p.0;
            }
            if let Some(w) = u.weight {
                s.spec.params.weight = w.0;
            }
            if let Some(q) = u.quantum_ms {
                s.spec.quantum = q.map(|q| Duration::from_millis(q.0));
            }
            if let Some(t) = u.preempt_timeout_ms {
                s.spec.preempt_timeout = Duration::from_millis(t.0);
            }
            if let Some(g) = guard {
                s.spec.guard = g;
            }
            Ok(())
        })?;
        log::info!(
            "api: vgpu '{name}': changed {}",
            serde_json::to_string(&u).unwrap_or_default()
        );
        self.get(name)
    }

    /// `POST /vgpus/{name}/pause|resume`: idempotent; kept across
    /// connections.
    pub fn pause(&self, name: &str, pause: bool) -> Result<VgpuView, ApiError> {
        let what = if pause { "pause" } else { "resume" };
        let srv = self.server(name)?;
        srv.with_registration(|s| {
            if *s.paused == pause {
                return Ok(());
            }
            if let Some(h) = s.handle {
                let r = if pause {
                    s.arbiter.pause_vm(h)
                } else {
                    s.arbiter.resume_vm(h)
                };
                r.map_err(|e| ApiError::Conflict(format!("vgpu '{name}': {what}: {e}")))?;
            }
            *s.paused = pause;
            log::info!("api: vgpu '{name}': {what}d");
            Ok(())
        })?;
        self.get(name)
    }

    /// `POST /vgpus/{name}/clear-quarantine`: lifts the vGPU's guard
    /// quarantine (loads are accepted again) and forgets its guard counts
    /// in the window, whether a client is connected or not; idempotent.
    pub fn clear_quarantine(&self, name: &str) -> Result<VgpuView, ApiError> {
        let was = self.server(name)?.clear_quarantine();
        log::info!("api: vgpu '{name}': clear-quarantine (was quarantined: {was})");
        self.get(name)
    }

    /// `DELETE /vgpus/{name}`: its client is disconnected (its queues
    /// released as a dying VM's), its socket removed; answers its last
    /// view.
    pub fn remove(&self, name: &str) -> Result<VgpuView, ApiError> {
        let mut v = {
            let mut inner = self.lock();
            let i = find(&inner, name)?;
            let view = self.view(&mut inner.vgpus[i]);
            (inner.vgpus.remove(i), view)
        };
        stop(&mut v.0);
        log::info!("api: vgpu '{name}': removed");
        Ok(VgpuView {
            state: VgpuState::Idle,
            queues: None,
            ..v.1
        })
    }

    /// Stops every vGPU (clients disconnected, sockets removed); returns
    /// their counters in order.
    pub fn stop_all(&self) -> Vec<VgpuReport> {
        let all = std::mem::take(&mut self.lock().vgpus);
        let mut out = Vec::with_capacity(all.len());
        for mut v in all {
            stop(&mut v);
            out.push((v.server.spec().name, v.server.stats()));
        }
        out
    }

    /// The live handles of GPU `gpu_id`'s vGPUs (handles are per arbiter)
    /// with their state name (`running`, `paused`), for that GPU's
    /// `/metrics` `hqdmux_vm_state`.
    pub fn vm_states(&self, gpu_id: u32) -> Vec<(VmId, &'static str)> {
        self.lock()
            .vgpus
            .iter()
            .filter(|v| v.gpu_id == gpu_id)
            .filter_map(|v| {
                let h = v.server.handle()?;
                Some((
                    h,
                    if v.server.paused() {
                        "paused"
                    } else {
                        "running"
                    },
                ))
            })
            .collect()
    }
}

impl Drop for VgpuControl {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn stop(v: &mut Served) {
    v.server.stop();
    if let Some(t) = v.thread.take() {
        let _ = t.join();
    }
}

/// `path` with its directory resolved (symlinks, relative to the working
/// directory): two spellings of one socket file give one key. A path whose
/// directory cannot be resolved is its own key.
fn socket_key(path: &Path) -> PathBuf {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match (dir.canonicalize(), path.file_name()) {
        (Ok(d), Some(f)) => d.join(f),
        _ => path.to_path_buf(),
    }
}

fn find(inner: &Inner, name: &str) -> Result<usize, ApiError> {
    inner
        .vgpus
        .iter()
        .position(|v| v.server.spec().name == name)
        .ok_or_else(|| ApiError::NoVgpu(name.to_owned()))
}

/// Each vGPU's share of its own GPU's time: its GPU time since the last
/// sample (`None`: not connected) over the sum of the vGPUs' on the same
/// GPU (0 when that GPU did nothing). `deltas`: (gpu_id, GPU ns) per vGPU.
fn shares_per_gpu(deltas: &[(u32, Option<u64>)]) -> Vec<Option<f64>> {
    let mut totals: BTreeMap<u32, u64> = BTreeMap::new();
    for (gpu, d) in deltas {
        let t = totals.entry(*gpu).or_default();
        *t = t.saturating_add(d.unwrap_or(0));
    }
    deltas
        .iter()
        .map(|(gpu, d)| {
            let total = totals.get(gpu).copied().unwrap_or(0);
            d.map(|d| {
                if total > 0 {
                    d as f64 / total as f64
                } else {
                    0.0
                }
            })
        })
        .collect()
}

/// A vGPU as placement sees a VM: a `gpu = true` VM with its priority,
/// weight, partition and (once placed) GPU.
fn as_vm(name: String, p: VmParams, gpu_id: Option<u32>) -> VmConfig {
    VmConfig {
        name,
        image: String::new(),
        memory_mib: 0,
        vcpus: 1,
        priority: p.priority,
        weight: p.weight,
        partition: p.partition,
        args: String::new(),
        gpu: true,
        gpu_id,
        placement: None,
        gpu_socket: None,
        preempt_timeout_ms: mdev::arbiter::DEFAULT_PREEMPT_TIMEOUT_MS,
        guard: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_socket_spelt_two_ways_has_one_key() {
        let dir = std::env::temp_dir().join(format!("hqdmux-sockkey-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("real")).unwrap();
        std::os::unix::fs::symlink(dir.join("real"), dir.join("link")).unwrap();
        let real = socket_key(&dir.join("real/a.sock"));
        assert_eq!(socket_key(&dir.join("link/a.sock")), real);
        assert_eq!(socket_key(&dir.join("real/../link/a.sock")), real);
        assert_ne!(socket_key(&dir.join("real/b.sock")), real);
        // Relative: against the working directory.
        let cwd = std::env::current_dir().unwrap().canonicalize().unwrap();
        assert_eq!(socket_key(Path::new("x.sock")), cwd.join("x.sock"));
        // An unresolvable directory: the path itself.
        let gone = dir.join("gone/a.sock");
        assert_eq!(socket_key(&gone), gone);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shares_are_parts_of_each_vgpus_own_gpu() {
        // GPU 0: two vGPUs 3:1; GPU 1: one alone, one idle, one not
        // connected; GPU 2: did nothing.
        let s = shares_per_gpu(&[
            (0, Some(300)),
            (1, Some(50)),
            (0, Some(100)),
            (1, Some(0)),
            (1, None),
            (2, Some(0)),
        ]);
        assert_eq!(
            s,
            [
                Some(0.75),
                Some(1.0),
                Some(0.25),
                Some(0.0),
                None,
                Some(0.0)
            ]
        );
        // Saturating: no overflow on huge figures.
        let s = shares_per_gpu(&[(0, Some(u64::MAX)), (0, Some(u64::MAX))]);
        assert!(s
            .iter()
            .all(|x| x.is_some_and(|x| (0.0..=1.0).contains(&x))));
    }
}
