//! The operator API of a running fleet: HTTP/1.1 + JSON over the Unix
//! socket of `hqdmux run --api-socket PATH` (server in [`crate::http`],
//! document in docs/api/openapi.json, guide in docs/operators.md).
//!
//! | method and path | effect |
//! |---|---|
//! | `GET /api/v1/vms` | every VM's view (config order, then added VMs) |
//! | `POST /api/v1/vms` | add and start a VM from one `[[vm]]` entry (TOML or JSON) |
//! | `GET /api/v1/vms/{name}` | one VM's view |
//! | `PATCH /api/v1/vms/{name}` | `priority`, `weight`, `quantum_ms`, `preempt_timeout_ms` |
//! | `POST /api/v1/vms/{name}/pause` | CWSR-save every queue, hold them until resume |
//! | `POST /api/v1/vms/{name}/resume` | make its queues eligible again |
//! | `POST /api/v1/vms/{name}/stop` | stop its vCPUs, reclaim its queues, keep its figures |
//! | `GET /api/v1/policy`, `PUT /api/v1/policy` | the fleet's scheduling policy |
//! | `GET /api/v1/fleet` | policy, GPU, totals |
//! | `POST /api/v1/vms/{name}/clear-quarantine` | lift its guard quarantine (200 with the view and `was_quarantined`) |
//! | `GET /api/v1/timeline?seconds=N&format=json\|svg&gpu_id=G` | GPU G's (default: the first with VMs) HQD-slot timeline of the last N (1..=120) s |
//! | `GET /metrics` | Prometheus text exposition of every GPU (each series labelled with its `gpu_id`) |
//! | `/api/v1/vgpus...` | the vGPUs of `hqdmux serve`, each on its GPU's arbiter ([`vgpus`]) |
//!
//! Every error is `{"error": "..."}` with a 4xx status naming the VM, the
//! field and the reason, and changes nothing. A request is read whole into
//! its type ([`types`]) and checked before any of it is applied; every
//! refusal is an [`ApiError`], whose status is chosen in one place
//! ([`ApiError::status`]).

pub mod types;
pub mod vgpus;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use mdev::arbiter::GpuArbiter;
use mdev::vgpu::VmId;
use serde_json::Value;
use vmm_sys_util::eventfd::EventFd;

use crate::config::{AddedVmError, FleetConfig, VmConfig};
use crate::http::{Handler, Request, Responder, Response};
pub use types::{
    ApiError, FleetView, GpuView, GuardView, PolicyChange, PolicyName, PolicyView, PromiseView,
    TenantView, VmList, VmState, VmUpdate, VmView,
};
pub use types::{PREEMPT_TIMEOUT_MS_RANGE, QUANTUM_MS_RANGE};

/// API version prefix.
pub const PREFIX: &str = "/api/v1";

/// Ended VMs (exited, stopped, failed) whose view the API keeps; an older
/// ended VM is forgotten: `GET /vms/{name}` answers 404, `GET /vms` no
/// longer lists it and its name stays taken (docs/operators.md). A fleet
/// that launches VMs continuously keeps a bounded history.
pub const RETAINED_ENDED_VMS: usize = 256;

/// `hqdmux_vm_state`'s `state` values: [`VmState::ALL`]'s names, in order.
const VM_STATE_NAMES: [&str; 7] = [
    "starting", "running", "paused", "stopping", "stopped", "exited", "failed",
];
/// How a VM ended, as the fleet reports it to the API.
#[derive(Debug, Clone, Default)]
pub struct VmEnd {
    /// Stopped (operator, timeout, signal) rather than ended by itself.
    pub stopped: bool,
    /// The outcome as the summary prints it.
    pub outcome: String,
    /// Exit status, when the guest exited.
    pub exit_status: Option<u32>,
    /// GPU accounting when its vGPU was detached.
    pub gpu: Option<scheduler::VmStats>,
}

/// A request the fleet's event loop carries out (it owns the VMs).
pub enum FleetCommand {
    /// Stop VM `index`; answer with its view.
    Stop {
        /// Index in the fleet.
        index: usize,
        /// Where the answer goes.
        reply: Responder,
    },
    /// Build and start `config` as VM `index`; answer 201 with its view.
    Add {
        /// Index it gets (the fleet's VM count).
        index: usize,
        /// Its validated entry.
        config: Box<VmConfig>,
        /// Where the answer goes.
        reply: Responder,
    },
}

struct VmEntry {
    config: VmConfig,
    vgpu: Option<VmId>,
    /// The vGPU it had, kept after it ended (its queue errors stay readable).
    last_vgpu: Option<VmId>,
    state: VmState,
    end: Option<VmEnd>,
    /// GPU time at the previous sample, and the share over the last interval.
    sample_ns: u64,
    share: Option<f64>,
    /// The promise's counters at the previous sample `(promise, gpu_ns)`,
    /// and the check of the last interval.
    promise_prev: Option<(mdev::arbiter::VmPromise, u64)>,
    verdict: Option<(mdev::promise::Verdict, f64)>,
    /// Queue errors by code and packet latency `(p50, p99)` taken when it
    /// ended (the arbiter forgets an old ended VM's figures).
    ended_errors: Option<BTreeMap<String, u64>>,
    ended_latency: Option<(f64, f64)>,
    /// Ended and older than the last [`RETAINED_ENDED_VMS`] ended VMs: not
    /// listed nor found; its strings are freed.
    forgotten: bool,
}

impl VmEntry {
    fn new(config: VmConfig, vgpu: Option<VmId>, state: VmState) -> Self {
        VmEntry {
            config,
            vgpu,
            last_vgpu: vgpu,
            state,
            end: None,
            sample_ns: 0,
            share: None,
            promise_prev: None,
            verdict: None,
            ended_errors: None,
            ended_latency: None,
            forgotten: false,
        }
    }
}

struct Inner {
    vms: Vec<VmEntry>,
    cfg: FleetConfig,
    fleet: Option<(Sender<FleetCommand>, Arc<EventFd>)>,
    last_sample: Instant,
    interval: Duration,
    /// Indices of ended VMs still viewable, oldest end first.
    ended: VecDeque<usize>,
    /// Names of forgotten VMs (still taken: an added VM cannot reuse one).
    retired: HashSet<String>,
}

/// What the API can see and steer; shared by the HTTP server and the fleet.
pub struct FleetControl {
    /// The fleet's GPUs: one arbiter each, started with the first VM on
    /// it (at launch or when added); a VM only reaches its own GPU's.
    gpus: Arc<crate::fleet::FleetGpus>,
    inner: Mutex<Inner>,
    started: Instant,
    config_path: PathBuf,
    /// The vGPUs of `hqdmux serve` (`/api/v1/vgpus`); unset in `run`.
    vgpus: OnceLock<Arc<vgpus::VgpuControl>>,
}

impl FleetControl {
    /// Control over `cfg`'s VMs (config order) with their vGPU handles.
    pub fn new(
        gpus: Arc<crate::fleet::FleetGpus>,
        cfg: &FleetConfig,
        vgpus: &[Option<VmId>],
    ) -> Self {
        let vms = cfg
            .vm
            .iter()
            .enumerate()
            .map(|(i, c)| {
                VmEntry::new(c.clone(), vgpus.get(i).copied().flatten(), VmState::Running)
            })
            .collect();
        FleetControl {
            gpus,
            inner: Mutex::new(Inner {
                vms,
                cfg: cfg.clone(),
                fleet: None,
                last_sample: Instant::now(),
                interval: Duration::ZERO,
                ended: VecDeque::new(),
                retired: HashSet::new(),
            }),
            started: Instant::now(),
            config_path: cfg.base_dir.join("(api)"),
            vgpus: OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fleet's GPUs (the fleet loop starts a GPU's arbiter here for
    /// the first VM added to it).
    pub fn gpus(&self) -> &Arc<crate::fleet::FleetGpus> {
        &self.gpus
    }

    /// The arbiter of the GPU the VM `c` is on (`None`: no vGPU on this
    /// fleet's GPUs, or its GPU not started).
    fn arb_of(&self, c: &VmConfig) -> Option<&Arc<GpuArbiter>> {
        self.gpus.of(c.gpu_id.filter(|_| c.gpu))
    }

    /// Serves `/api/v1/vgpus` over `v` (`hqdmux serve`; a second call
    /// changes nothing).
    pub fn set_vgpus(&self, v: Arc<vgpus::VgpuControl>) {
        let _ = self.vgpus.set(v);
    }

    /// Connects the fleet's command channel (stop, add): commands are sent
    /// on `tx` and `wake` is written.
    pub fn connect_fleet(&self, tx: Sender<FleetCommand>, wake: Arc<EventFd>) {
        self.lock().fleet = Some((tx, wake));
    }

    /// Disconnects the fleet's command channel (the run is ending): stop
    /// and add are answered 503 from now on.
    pub fn disconnect_fleet(&self) {
        self.lock().fleet = None;
    }

    /// Records that VM `i` ended (its vGPU is gone), with its final figures.
    pub fn ended(&self, i: usize, end: VmEnd) {
        let mut inner = self.lock();
        if let Some(v) = inner.vms.get_mut(i) {
            v.state = if end.stopped {
                VmState::Stopped
            } else {
                VmState::Exited
            };
            v.vgpu = None;
            v.share = None;
            v.end = Some(end);
            if let Some((h, m)) = v
                .last_vgpu
                .zip(self.gpus.of(v.config.gpu_id.filter(|_| v.config.gpu)))
            {
                v.ended_errors = m.vm_queue_errors(h);
                v.ended_latency = m.vm_packet_latency(h);
            }
            Self::retire_old(&mut inner, i);
        }
    }

    /// Records that the added VM `i` started with vGPU `vgpu`.
    pub fn started(&self, i: usize, vgpu: Option<VmId>) {
        if let Some(v) = self.lock().vms.get_mut(i) {
            v.state = VmState::Running;
            v.vgpu = vgpu;
            v.last_vgpu = vgpu;
        }
    }

    /// Records that the added VM `i` could not be built or started.
    pub fn failed(&self, i: usize, reason: String) {
        if let Some(v) = self.lock().vms.get_mut(i) {
            v.state = VmState::Failed;
            v.end = Some(VmEnd {
                stopped: false,
                outcome: reason,
                exit_status: None,
                gpu: None,
            });
        }
        Self::retire_old(&mut self.lock(), i);
    }

    /// Notes that VM `i` ended; forgets the oldest ended VMs beyond
    /// [`RETAINED_ENDED_VMS`] (its view, its config in the API's copy of
    /// the fleet config; its name stays taken).
    fn retire_old(inner: &mut Inner, i: usize) {
        if inner.vms.get(i).is_none_or(|v| v.forgotten) || inner.ended.contains(&i) {
            return;
        }
        inner.ended.push_back(i);
        while inner.ended.len() > RETAINED_ENDED_VMS {
            let Some(old) = inner.ended.pop_front() else {
                break;
            };
            let Some(v) = inner.vms.get_mut(old) else {
                continue;
            };
            let name = std::mem::take(&mut v.config.name);
            v.config.image = String::new();
            v.config.args = String::new();
            v.forgotten = true;
            v.end = None;
            v.ended_errors = None;
            v.ended_latency = None;
            v.last_vgpu = None;
            if let Some(p) = inner.cfg.vm.iter().position(|c| c.name == name) {
                inner.cfg.vm.swap_remove(p);
            }
            inner.retired.insert(name);
        }
    }

    /// Number of VMs known (config and added).
    pub fn len(&self) -> usize {
        self.lock().vms.len()
    }

    /// True when the fleet has no VMs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The view of VM `i` (`None`: no such index).
    pub fn view_of(&self, i: usize) -> Option<VmView> {
        let inner = self.lock();
        inner.vms.get(i).map(|v| self.view(v, &inner))
    }

    fn view(&self, v: &VmEntry, inner: &Inner) -> VmView {
        let c = &v.config;
        let arb = self.arb_of(c);
        let live = v.vgpu.zip(arb);
        let status = live.and_then(|(h, m)| m.vm_status(h));
        let controls = live.and_then(|(h, m)| m.vm_controls(h));
        let (priority, weight) = status
            .map(|(p, _)| (u32::from(p.priority), p.weight))
            .unwrap_or((u32::from(c.priority), c.weight));
        let stats = status
            .map(|(_, s)| s)
            .or_else(|| v.end.as_ref().and_then(|e| e.gpu));
        let quantum = match (controls, arb, c.gpu) {
            (Some((_, Some(q))), _, _) => Some(q),
            (_, Some(m), true) => Some(m.level_quantum(priority as u8)),
            _ => None,
        };
        let ms = |ns: u64| ns as f64 / 1e6;
        let queue_errors = v
            .ended_errors
            .clone()
            .or_else(|| v.last_vgpu.zip(arb).and_then(|(h, m)| m.vm_queue_errors(h)));
        let guard = live.and_then(|(h, m)| m.guard_status(h));
        let latency = v.ended_latency.or_else(|| {
            v.last_vgpu
                .zip(arb)
                .and_then(|(h, m)| m.vm_packet_latency(h))
        });
        VmView {
            name: c.name.clone(),
            state: v.state,
            gpu: c.gpu,
            gpu_id: c.gpu_id.filter(|_| c.gpu),
            placement: c.placement.clone().filter(|_| c.gpu),
            image: c.image.clone(),
            tenant: TenantView {
                priority,
                weight,
                quantum_ms: quantum.map(|q| q.as_secs_f64() * 1e3),
                quantum_override: controls.is_some_and(|(_, q)| q.is_some()),
                preempt_timeout_ms: live
                    .and_then(|(h, m)| m.preempt_timeout(h))
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(c.preempt_timeout_ms),
                gpu_time_ms: stats.map(|s| ms(s.gpu_ns)),
                share: v.share,
                preemptions: stats.map(|s| s.preemptions),
                queue_errors: queue_errors.as_ref().map(|q| q.values().sum::<u64>()),
                quarantined: guard.map(|g| g.quarantined.is_some()),
                ..Default::default()
            }
            .with_latency(latency),
            share_interval_ms: v.share.map(|_| inner.interval.as_secs_f64() * 1e3),
            maps: stats.map(|s| s.maps),
            cwsr_time_ms: stats.map(|s| ms(s.save_ns)),
            queue_errors_by_code: queue_errors,
            guard: guard.map(GuardView::from),
            outcome: v.end.as_ref().map(|e| e.outcome.clone()),
            exit_status: v.end.as_ref().and_then(|e| e.exit_status),
            promise: self.promise_view(v, status),
            was_quarantined: None,
        }
    }

    /// Samples every live VM's GPU time: the share of its GPU's time
    /// (summed over that GPU's VMs) each got since the previous sample.
    pub fn sample(&self) {
        if let Some(v) = self.vgpus.get() {
            v.sample();
        }
        let mut inner = self.lock();
        if self.gpus.started().next().is_none() {
            return;
        }
        let now = Instant::now();
        let mut deltas = Vec::with_capacity(inner.vms.len());
        let mut totals: BTreeMap<u32, u64> = BTreeMap::new();
        for v in inner.vms.iter_mut() {
            let on = v.config.gpu_id.filter(|_| v.config.gpu);
            let ns = v
                .vgpu
                .zip(self.gpus.of(on))
                .and_then(|(h, m)| m.vm_status(h))
                .map(|(_, s)| s.gpu_ns);
            match (ns, on) {
                (Some(ns), Some(id)) => {
                    let d = ns.saturating_sub(v.sample_ns);
                    *totals.entry(id).or_default() += d;
                    deltas.push(Some((id, d)));
                    v.sample_ns = ns;
                }
                _ => deltas.push(None),
            }
        }
        for (v, d) in inner.vms.iter_mut().zip(&deltas) {
            v.share = match d {
                Some((id, d)) => match totals.get(id).copied().unwrap_or(0) {
                    0 => Some(0.0),
                    total => Some(*d as f64 / total as f64),
                },
                None => None,
            };
        }
        inner.interval = now - inner.last_sample;
        inner.last_sample = now;
        self.sample_promise(&mut inner);
    }

    /// The promise over the interval since the previous sample: every live
    /// GPU VM's counters are differenced and checked together
    /// ([`mdev::promise::check_window`]).
    fn sample_promise(&self, inner: &mut Inner) {
        let mut idx = Vec::new();
        let mut samples = Vec::new();
        for (i, v) in inner.vms.iter_mut().enumerate() {
            let on = v.config.gpu_id.filter(|_| v.config.gpu);
            let (Some(h), Some(m), Some(gpu)) = (v.vgpu, self.gpus.of(on), on) else {
                v.promise_prev = None;
                v.verdict = None;
                continue;
            };
            let (Some(p), Some((params, stats))) = (m.vm_promise(h), m.vm_status(h)) else {
                v.promise_prev = None;
                v.verdict = None;
                continue;
            };
            if let Some((old, old_gpu)) = v.promise_prev.replace((p.clone(), stats.gpu_ns)) {
                let (a, b) = (&old.counters, &p.counters);
                let quantum = match m.vm_controls(h) {
                    Some((_, Some(q))) => q,
                    _ => m.level_quantum(params.priority),
                };
                idx.push(i);
                samples.push(mdev::promise::WindowSample {
                    name: v.config.name.clone(),
                    gpu,
                    partition: p.partition,
                    priority: params.priority,
                    weight: params.weight,
                    quantum_ns: quantum.as_nanos() as u64,
                    window_ns: p.at_ns.saturating_sub(old.at_ns),
                    demanding_ns: b.demanding_ns.saturating_sub(a.demanding_ns),
                    wait_ns: b.wait_ns.saturating_sub(a.wait_ns),
                    cu_ns: b.cu_ns.saturating_sub(a.cu_ns),
                    gpu_ns: stats.gpu_ns.saturating_sub(old_gpu),
                });
            }
        }
        let verdicts = mdev::promise::check_window(&samples);
        for ((i, verdict), s) in idx.into_iter().zip(verdicts).zip(&samples) {
            inner.vms[i].verdict = Some((verdict, s.window_ns as f64 / 1e6));
        }
    }

    /// The promise view of a live VM whose `status` was just read.
    fn promise_view(
        &self,
        v: &VmEntry,
        status: Option<(scheduler::VmParams, scheduler::VmStats)>,
    ) -> Option<PromiseView> {
        let m = self.arb_of(&v.config)?;
        let h = v.vgpu?;
        let (params, stats) = status?;
        let p = m.vm_promise(h)?;
        let ms = |ns: u64| ns as f64 / 1e6;
        let c = &p.counters;
        let verdict = v.verdict.as_ref();
        Some(PromiseView {
            at_ms: ms(p.at_ns),
            partition: p.partition,
            demanding: c.demanding,
            demand: verdict.map(|(x, _)| x.demand),
            entitled_share: verdict.map(|(x, _)| x.entitled),
            got_share: verdict.map(|(x, _)| x.got),
            got_slot_share: verdict.map(|(x, _)| x.got_slot),
            held: verdict.map(|(x, _)| x.held),
            why: verdict.map(|(x, _)| x.why.clone()),
            interval_ms: verdict.map(|(_, w)| *w),
            level_quantum_ms: m.level_quantum(params.priority).as_secs_f64() * 1e3,
            cu_time_ms: ms(c.cu_ns),
            demanding_ms: ms(c.demanding_ns),
            wait_ms: ms(c.wait_ns),
            cwsr_time_ms: ms(stats.save_ns),
            aging_boosts: c.aging_boosts,
            preemptions_suffered: stats.preemptions,
            preempted_by_aging: c.preempted_by_aging,
            preemptions_caused: c.preemptions_caused,
            preempted_by: p.preempted_by.into_iter().collect(),
        })
    }

    fn find(&self, inner: &Inner, name: &str) -> Result<usize, ApiError> {
        inner
            .vms
            .iter()
            .position(|v| !v.forgotten && v.config.name == name)
            .ok_or_else(|| ApiError::NoVm(name.to_owned()))
    }

    /// Routes one request. Each route is one match arm; routes outside
    /// `/api/v1` (e.g. `GET /metrics`) go in the first match.
    pub fn route(&self, req: Request, reply: Responder) {
        let m = req.method.as_str();
        if req.path == "/metrics" {
            return reply.send(match m {
                "GET" => self.metrics(),
                _ => ApiError::Method {
                    method: m.to_owned(),
                    path: req.path.clone(),
                    allow: "GET",
                }
                .into(),
            });
        }
        let Some(rest) = req.path.strip_prefix(PREFIX) else {
            return reply.send(ApiError::NoPath(req.path.clone()).into());
        };
        let segs: Vec<&str> = rest.split('/').skip(1).collect();
        let r = match (m, segs.as_slice()) {
            ("GET", ["vms"]) => ok(Ok(self.list())),
            ("POST", ["vms"]) => return self.add(&req, reply),
            ("GET", ["vms", name]) => ok(self.get(name)),
            ("PATCH", ["vms", name]) => ok(self.patch(name, &req)),
            ("POST", ["vms", name, "pause"]) => ok(self.pause(name, true)),
            ("POST", ["vms", name, "resume"]) => ok(self.pause(name, false)),
            ("POST", ["vms", name, "stop"]) => return self.stop(name, reply),
            ("GET", ["policy"]) => ok(Ok(self.get_policy())),
            ("PUT", ["policy"]) => ok(self.put_policy(&req)),
            ("GET", ["fleet"]) => ok(Ok(self.fleet())),
            ("POST", ["vms", name, "clear-quarantine"]) => ok(self.clear_quarantine(name)),
            ("GET", ["timeline"]) => self.timeline(&req),
            ("GET", ["vgpus"]) => ok(Ok(self.vgpus.get().map(|v| v.list()).unwrap_or_default())),
            ("POST", ["vgpus"]) => self
                .vgpus()
                .and_then(|v| v.create(&req))
                .map(|v| Response::json(201, &v)),
            ("GET", ["vgpus", name]) => ok(self.vgpus().and_then(|v| v.get(name))),
            ("PATCH", ["vgpus", name]) => ok(self.vgpus().and_then(|v| v.patch(name, &req))),
            ("DELETE", ["vgpus", name]) => ok(self.vgpus().and_then(|v| v.remove(name))),
            ("POST", ["vgpus", name, "pause"]) => {
                ok(self.vgpus().and_then(|v| v.pause(name, true)))
            }
            ("POST", ["vgpus", name, "clear-quarantine"]) => {
                ok(self.vgpus().and_then(|v| v.clear_quarantine(name)))
            }
            ("POST", ["vgpus", name, "resume"]) => {
                ok(self.vgpus().and_then(|v| v.pause(name, false)))
            }
            (_, p) => Err(match allowed(p) {
                Some(allow) => ApiError::Method {
                    method: m.to_owned(),
                    path: req.path.clone(),
                    allow,
                },
                None => ApiError::NoPath(req.path.clone()),
            }),
        };
        reply.send(r.unwrap_or_else(Response::from))
    }

    /// The vGPUs, or 409 where this process serves none (`hqdmux run`).
    fn vgpus(&self) -> Result<&Arc<vgpus::VgpuControl>, ApiError> {
        self.vgpus.get().ok_or_else(|| {
            ApiError::Conflict("vgpus: this process serves no vGPUs (`hqdmux serve` does)".into())
        })
    }

    fn list(&self) -> VmList {
        let inner = self.lock();
        VmList {
            vms: inner
                .vms
                .iter()
                .filter(|v| !v.forgotten)
                .map(|v| self.view(v, &inner))
                .collect(),
        }
    }

    fn get(&self, name: &str) -> Result<VmView, ApiError> {
        let inner = self.lock();
        let i = self.find(&inner, name)?;
        Ok(self.view(&inner.vms[i], &inner))
    }

    /// The VM's live vGPU, or the reason there is none (409).
    fn live_gpu(&self, v: &VmEntry, what: &str) -> Result<(VmId, Arc<GpuArbiter>), ApiError> {
        let name = &v.config.name;
        if !v.state.live() {
            return Err(ApiError::Conflict(format!(
                "vm '{name}': {what}: the VM is {}",
                v.state.name()
            )));
        }
        match (v.vgpu, self.arb_of(&v.config)) {
            (Some(h), Some(m)) => Ok((h, m.clone())),
            _ => Err(ApiError::Conflict(format!(
                "vm '{name}': {what}: the VM has no vGPU (gpu = false)"
            ))),
        }
    }

    fn patch(&self, name: &str, req: &Request) -> Result<VmView, ApiError> {
        let place = format!("vm '{name}'");
        let inner = self.lock();
        let i = self.find(&inner, name)?;
        // Read and check the whole body before applying anything.
        let u: VmUpdate = types::decode_json(req.header("content-type"), &req.body, &place)?;
        u.check(name)?;
        let v = &inner.vms[i];
        let (h, m) = self.live_gpu(v, u.first_field())?;
        // The guard's new limits: the VM's current ones with the given
        // fields replaced, validated whole before anything is applied.
        let guard = match u.guard {
            Some(o) => {
                let st = m.guard_status(h).ok_or_else(|| {
                    ApiError::Conflict(format!("vm '{name}': guard: the VM has ended"))
                })?;
                let limits = st.limits.with(&o.to_override());
                limits
                    .validate()
                    .map_err(|e| ApiError::invalid(&place, e.to_string()))?;
                Some(limits)
            }
            None => None,
        };
        let applied = (|| {
            if let Some(p) = u.priority {
                m.set_priority(h, p.0)
                    .map_err(|e| ("priority", e.to_string()))?;
            }
            if let Some(w) = u.weight {
                m.set_weight(h, w.0)
                    .map_err(|e| ("weight", e.to_string()))?;
            }
            if let Some(q) = u.quantum_ms {
                m.set_quantum(h, q.map(|q| Duration::from_millis(q.0)))
                    .map_err(|e| ("quantum_ms", e.to_string()))?;
            }
            if let Some(t) = u.preempt_timeout_ms {
                m.set_preempt_timeout(h, Duration::from_millis(t.0))
                    .map_err(|e| ("preempt_timeout_ms", e.to_string()))?;
            }
            if let Some(g) = guard {
                m.set_guard(h, g).map_err(|e| ("guard", e.to_string()))?;
            }
            Ok::<(), (&str, String)>(())
        })();
        if let Err((field, e)) = applied {
            // Only a VM removed meanwhile gets here.
            return Err(ApiError::Conflict(format!("vm '{name}': {field}: {e}")));
        }
        log::info!(
            "api: vm '{name}': changed {}",
            serde_json::to_string(&u).unwrap_or_default()
        );
        Ok(self.view(&inner.vms[i], &inner))
    }

    fn pause(&self, name: &str, pause: bool) -> Result<VmView, ApiError> {
        let what = if pause { "pause" } else { "resume" };
        let mut inner = self.lock();
        let i = self.find(&inner, name)?;
        let (h, m) = self.live_gpu(&inner.vms[i], what)?;
        let target = if pause {
            VmState::Paused
        } else {
            VmState::Running
        };
        if inner.vms[i].state == target {
            // Already there: idempotent, nothing changes.
            return Ok(self.view(&inner.vms[i], &inner));
        }
        let r = if pause { m.pause_vm(h) } else { m.resume_vm(h) };
        r.map_err(|e| ApiError::Conflict(format!("vm '{name}': {what}: {e}")))?;
        inner.vms[i].state = if pause {
            VmState::Paused
        } else {
            VmState::Running
        };
        log::info!("api: vm '{name}': {what}d");
        Ok(self.view(&inner.vms[i], &inner))
    }

    fn stop(&self, name: &str, reply: Responder) {
        let mut inner = self.lock();
        let i = match self.find(&inner, name) {
            Ok(i) => i,
            Err(e) => return reply.send(e.into()),
        };
        let st = inner.vms[i].state;
        if matches!(st, VmState::Stopped | VmState::Stopping) {
            // Already stopped (or being stopped): idempotent.
            return reply.send(Response::json(200, &self.view(&inner.vms[i], &inner)));
        }
        if !st.live() {
            return reply.send(
                ApiError::Conflict(format!("vm '{name}': stop: the VM is {}", st.name())).into(),
            );
        }
        let Some((tx, wake)) = inner.fleet.clone() else {
            return reply
                .send(ApiError::Unavailable(format!("vm '{name}': stop: no fleet loop")).into());
        };
        inner.vms[i].state = VmState::Stopping;
        log::info!("api: vm '{name}': stop requested");
        if let Err(e) = tx.send(FleetCommand::Stop { index: i, reply }) {
            inner.vms[i].state = st;
            let FleetCommand::Stop { reply, .. } = e.0 else {
                return;
            };
            return reply.send(
                ApiError::Unavailable(format!("vm '{name}': stop: the fleet is ending")).into(),
            );
        }
        let _ = wake.write(1);
    }

    fn add(&self, req: &Request, reply: Responder) {
        let mut inner = self.lock();
        let (config, tx, wake) = match self.check_add(&inner, req) {
            Ok(x) => x,
            Err(e) => return reply.send(e.into()),
        };
        let index = inner.vms.len();
        inner.cfg.vm.push(config.clone());
        inner
            .vms
            .push(VmEntry::new(config.clone(), None, VmState::Starting));
        log::info!("api: vm '{}': add requested", config.name);
        if tx
            .send(FleetCommand::Add {
                index,
                config: Box::new(config),
                reply,
            })
            .is_ok()
        {
            let _ = wake.write(1);
        } else {
            inner.vms[index].state = VmState::Failed;
        }
    }

    /// The VM entry of a `POST /vms`, checked against the fleet, and the
    /// fleet loop's channel.
    fn check_add(
        &self,
        inner: &Inner,
        req: &Request,
    ) -> Result<(VmConfig, Sender<FleetCommand>, Arc<EventFd>), ApiError> {
        let table = vm_table(req)?;
        let mut config = inner
            .cfg
            .check_added_vm(&table, &self.config_path)
            .map_err(|e| match e {
                AddedVmError::Entry(e) => ApiError::Unprocessable(e.to_string()),
                AddedVmError::Fleet(e) => ApiError::Conflict(e.to_string()),
            })?;
        // Its GPU: `gpu_id` as given, else placed against the VMs running
        // or starting.
        inner.cfg.place_added(
            &mut config,
            inner
                .vms
                .iter()
                // Starting counts: an add still being built is on its GPU.
                .filter(|v| !v.forgotten && (v.state.live() || v.state == VmState::Starting))
                .map(|v| &v.config),
        );
        if inner.retired.contains(&config.name) {
            return Err(ApiError::Conflict(format!(
                "vm '{}': name: duplicate name: an ended VM (no longer listed) had it",
                config.name
            )));
        }
        // Under `hqdmux serve`, VMs and vGPUs share one name space (the
        // commands that take a name try the vGPU first).
        if self
            .vgpus
            .get()
            .is_some_and(|v| v.get(&config.name).is_ok())
        {
            return Err(ApiError::Conflict(format!(
                "vm '{}': name: duplicate name: a vGPU of this daemon has it",
                config.name
            )));
        }
        let (tx, wake) = inner
            .fleet
            .clone()
            .ok_or_else(|| ApiError::Unavailable(format!("vm '{}': no fleet loop", config.name)))?;
        Ok((config, tx, wake))
    }

    fn get_policy(&self) -> PolicyView {
        let p = self
            .gpus
            .started()
            .next()
            .map(|(_, m)| m.policy())
            .unwrap_or(self.lock().cfg.scheduler.policy);
        PolicyView {
            policy: PolicyName(p),
            policies: scheduler::Policy::ALL
                .iter()
                .copied()
                .map(PolicyName)
                .collect(),
        }
    }

    fn put_policy(&self, req: &Request) -> Result<PolicyView, ApiError> {
        let c: PolicyChange = types::decode_json(req.header("content-type"), &req.body, "policy")?;
        if self.gpus.started().next().is_none() {
            return Err(ApiError::Conflict(
                "policy: the fleet has no GPU VMs".into(),
            ));
        }
        // One policy for the fleet: every GPU's scheduler.
        for (_, m) in self.gpus.started() {
            m.set_policy(c.policy.0);
        }
        log::info!("api: policy = {}", c.policy.0.name());
        Ok(self.get_policy())
    }

    fn fleet(&self) -> FleetView {
        let inner = self.lock();
        let listed = || inner.vms.iter().filter(|v| !v.forgotten);
        let states = VmState::ALL
            .iter()
            .map(|s| {
                let n = listed().filter(|v| v.state == *s).count() as u64;
                (s.name().to_owned(), n)
            })
            .collect();
        let gpus: Vec<GpuView> = self
            .gpus
            .started()
            .map(|(id, m)| {
                let t = m.topology();
                let s = m.stats();
                GpuView {
                    gpu_id: id,
                    policy: PolicyName(m.policy()),
                    xccs: t.xccs,
                    partitions: t.partitions(),
                    gpu_compute_partition_type: mdev::metrics::partition_type(t.partition_mode)
                        .to_owned(),
                    vms: listed()
                        .filter(|v| v.state.live() && v.config.gpu && v.config.gpu_id == Some(id))
                        .count() as u64,
                    completions: s.completions,
                    maps: s.maps,
                    preemptions: s.preemptions,
                    quarantined_vms: s.quarantined_vms,
                }
            })
            .collect();
        FleetView {
            uptime_ms: self.started.elapsed().as_secs_f64() * 1e3,
            vms: listed().count() as u64,
            vms_forgotten: inner.retired.len() as u64,
            states,
            gpu: gpus.first().cloned(),
            gpus,
        }
    }

    /// GPU `gpu_id`'s device labels, build and the state of each VM on
    /// it for `/metrics`.
    fn metrics_info(&self, gpu_id: u32) -> mdev::metrics::MetricsInfo {
        let mut info = mdev::metrics::MetricsInfo::local();
        info.gpu_id = gpu_id;
        info.commit = env!("HQDMUX_GIT_COMMIT").to_owned();
        info.version = env!("CARGO_PKG_VERSION").to_owned();
        info.states = &VM_STATE_NAMES;
        let inner = self.lock();
        for v in inner.vms.iter().filter(|v| !v.forgotten) {
            if v.config.gpu && v.config.gpu_id == Some(gpu_id) {
                if let Some(h) = v.last_vgpu {
                    info.vm_states.insert(h, v.state.name());
                }
                if let (Some(h), Some((x, _))) = (v.vgpu, &v.verdict) {
                    info.promise.insert(h, (x.entitled, x.got));
                }
            }
        }
        drop(inner);
        if let Some(v) = self.vgpus.get() {
            for (h, st) in v.vm_states(gpu_id) {
                info.vm_states.insert(h, st);
            }
        }
        info
    }

    fn metrics(&self) -> Response {
        let texts: Vec<String> = self
            .gpus
            .started()
            .map(|(id, m)| m.metrics_text_with(&self.metrics_info(id)))
            .collect();
        if texts.is_empty() {
            return Response::text(
                200,
                mdev::metrics::CONTENT_TYPE,
                "# hqdmux: this fleet has no GPU arbiter (no VM has gpu = true)\n".into(),
            );
        }
        Response::text(200, mdev::metrics::CONTENT_TYPE, merge_expositions(&texts))
    }

    fn timeline(&self, req: &Request) -> Result<Response, ApiError> {
        let (seconds, svg, gpu_id) = timeline_query(req)?;
        let (id, m) = match gpu_id {
            Some(id) if !self.gpus.ids().contains(&id) => {
                let known: Vec<String> = self.gpus.ids().iter().map(|i| i.to_string()).collect();
                return Err(ApiError::NoGpu {
                    id,
                    known: known.join(", "),
                });
            }
            Some(id) => (
                id,
                self.gpus
                    .get(id)
                    .ok_or_else(|| ApiError::Conflict(format!("timeline: GPU {id} has no VMs")))?,
            ),
            None => {
                self.gpus.started().next().ok_or_else(|| {
                    ApiError::Conflict("timeline: the fleet has no GPU VMs".into())
                })?
            }
        };
        let mut t = m.timeline(Duration::from_secs(seconds));
        // The model with the GPU it is of (first in the JSON, and on the
        // picture).
        t.gpu_id = Some(id);
        Ok(if svg {
            Response::text(
                200,
                "image/svg+xml",
                timeline::render_svg(&t, &Default::default()),
            )
        } else {
            Response::text(200, "application/json", t.to_json())
        })
    }

    fn clear_quarantine(&self, name: &str) -> Result<VmView, ApiError> {
        let inner = self.lock();
        let i = self.find(&inner, name)?;
        let (h, m) = self.live_gpu(&inner.vms[i], "clear-quarantine")?;
        let was = m
            .clear_quarantine(h)
            .map_err(|e| ApiError::Conflict(format!("vm '{name}': clear-quarantine: {e}")))?;
        log::info!("api: vm '{name}': clear-quarantine (was quarantined: {was})");
        Ok(VmView {
            was_quarantined: Some(was),
            ..self.view(&inner.vms[i], &inner)
        })
    }
}

/// A 200 answer of `v`.
fn ok<T: serde::Serialize>(v: Result<T, ApiError>) -> Result<Response, ApiError> {
    v.map(|v| Response::json(200, &v))
}

/// Range of `seconds` of `GET /api/v1/timeline`.
pub const TIMELINE_SECONDS_RANGE: std::ops::RangeInclusive<u64> = 1..=120;
/// `seconds` of `GET /api/v1/timeline` when not given.
pub const TIMELINE_DEFAULT_SECONDS: u64 = 10;

/// The query of `GET /api/v1/timeline`: `(seconds, svg, gpu_id)` (no
/// `gpu_id`: the first GPU with VMs).
fn timeline_query(req: &Request) -> Result<(u64, bool, Option<u32>), ApiError> {
    let mut seconds = TIMELINE_DEFAULT_SECONDS;
    let mut gpu_id = None;
    let mut svg = req
        .header("accept")
        .is_some_and(|a| a.contains("image/svg+xml") && !a.contains("application/json"));
    for kv in req
        .query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|s| !s.is_empty())
    {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "seconds" => {
                seconds = match v.parse::<u64>() {
                    Ok(n) if TIMELINE_SECONDS_RANGE.contains(&n) => n,
                    _ => {
                        return Err(ApiError::invalid(
                            "timeline: seconds",
                            format!(
                                "'{v}' is not an integer in {}..={}",
                                TIMELINE_SECONDS_RANGE.start(),
                                TIMELINE_SECONDS_RANGE.end()
                            ),
                        ))
                    }
                }
            }
            "gpu_id" => {
                gpu_id = match v.parse::<u32>() {
                    Ok(n) if n < crate::config::MAX_GPUS => Some(n),
                    _ => {
                        return Err(ApiError::invalid(
                            "timeline: gpu_id",
                            format!(
                                "'{v}' is not an integer in 0..={}",
                                crate::config::MAX_GPUS - 1
                            ),
                        ))
                    }
                }
            }
            "format" => {
                svg = match v {
                    "json" => false,
                    "svg" => true,
                    _ => {
                        return Err(ApiError::invalid(
                            "timeline: format",
                            format!("'{v}' is not one of json, svg"),
                        ))
                    }
                }
            }
            _ => {
                return Err(ApiError::invalid(
                    format!("timeline: {k}"),
                    "unknown query parameter (known: seconds, format, gpu_id)",
                ))
            }
        }
    }
    Ok((seconds, svg, gpu_id))
}

/// One Prometheus text exposition from several GPUs' (each a complete
/// exposition of the same families): each family's `# HELP` and `# TYPE`
/// once, then its samples from every GPU in turn (their `gpu_id` labels
/// differ). A sample line that repeats exactly (a series without a GPU
/// label, such as `hqdmux_build_info`) is kept once.
pub fn merge_expositions(texts: &[String]) -> String {
    // Family name -> (header lines, sample lines), in first-seen order.
    let mut order: Vec<String> = Vec::new();
    let mut families: BTreeMap<String, (Vec<&str>, Vec<&str>)> = BTreeMap::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for text in texts {
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "))
            {
                let name = rest.split_whitespace().next().unwrap_or("").to_owned();
                if !families.contains_key(&name) {
                    order.push(name.clone());
                }
                let f = families.entry(name.clone()).or_default();
                if !f.0.contains(&line) && f.1.is_empty() {
                    f.0.push(line);
                }
                current = name;
            } else if line.starts_with('#') || line.is_empty() {
                continue;
            } else {
                if !seen.insert(line) {
                    continue;
                }
                if !families.contains_key(&current) {
                    order.push(current.clone());
                }
                families.entry(current.clone()).or_default().1.push(line);
            }
        }
    }
    let mut out = String::new();
    for name in order {
        if let Some((head, samples)) = families.get(&name) {
            for l in head.iter().chain(samples) {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out
}

/// Methods of a known path (for 405), `None` for unknown paths.
fn allowed(p: &[&str]) -> Option<&'static str> {
    match p {
        ["vms"] => Some("GET, POST"),
        ["vms", _] => Some("GET, PATCH"),
        ["vms", _, "pause" | "resume" | "stop"] => Some("POST"),
        ["policy"] => Some("GET, PUT"),
        ["fleet"] | ["timeline"] => Some("GET"),
        ["vms", _, "clear-quarantine"] => Some("POST"),
        ["vgpus"] => Some("GET, POST"),
        ["vgpus", _] => Some("GET, PATCH, DELETE"),
        ["vgpus", _, "pause" | "resume" | "clear-quarantine"] => Some("POST"),
        _ => None,
    }
}

/// The body of `POST /vms` as one `[[vm]]` table: TOML (`[[vm]]` header
/// optional) or JSON (an object of the same fields). The fields are read
/// by the fleet config's own reader ([`FleetConfig::check_added_vm`]), so
/// an added VM is checked exactly as a config file's.
fn vm_table(req: &Request) -> Result<toml::Table, ApiError> {
    let ct = req.header("content-type").unwrap_or("application/toml");
    let text =
        std::str::from_utf8(&req.body).map_err(|_| ApiError::invalid("vm", "body is not UTF-8"))?;
    if ct.starts_with("application/json") {
        let m: serde_json::Map<String, Value> = types::decode_json(Some(ct), &req.body, "vm")?;
        return json_table(m, "");
    }
    if !(ct.starts_with("application/toml") || ct.starts_with("text/")) {
        return Err(ApiError::MediaType {
            expected: "application/toml or application/json",
            got: ct.to_owned(),
        });
    }
    let t: toml::Table = toml::from_str(text).map_err(|e| {
        ApiError::invalid("vm", format!("invalid TOML: {}", e.to_string().trim_end()))
    })?;
    match t.get("vm") {
        Some(toml::Value::Array(a)) if t.len() == 1 => match a.as_slice() {
            [toml::Value::Table(one)] => Ok(one.clone()),
            _ => Err(ApiError::invalid("vm", "expected exactly one [[vm]] entry")),
        },
        _ => Ok(t),
    }
}

/// A JSON object as the TOML table a config file would hold (strings,
/// booleans, integers and tables of them: `guard = {...}`); `at` prefixes
/// the field names in errors. Nesting is bounded by the JSON reader's.
fn json_table(m: serde_json::Map<String, Value>, at: &str) -> Result<toml::Table, ApiError> {
    let mut t = toml::Table::new();
    for (k, v) in m {
        let tv = match v {
            Value::String(s) => toml::Value::String(s),
            Value::Bool(b) => toml::Value::Boolean(b),
            Value::Number(n) if n.is_i64() => toml::Value::Integer(n.as_i64().unwrap_or(0)),
            Value::Number(n) => {
                return Err(ApiError::Unprocessable(format!(
                    "vm: field `{at}{k}`: {n} is not an integer in range"
                )))
            }
            Value::Object(o) => toml::Value::Table(json_table(o, &format!("{at}{k}."))?),
            other => {
                return Err(ApiError::Unprocessable(format!(
                    "vm: field `{at}{k}`: unsupported value {other}"
                )))
            }
        };
        t.insert(k, tv);
    }
    Ok(t)
}

/// The HTTP handler of a fleet.
pub struct ApiHandler(pub Arc<FleetControl>);

impl Handler for ApiHandler {
    fn handle(&self, req: Request, reply: Responder) {
        self.0.route(req, reply)
    }

    fn tick(&self) {
        self.0.sample()
    }
}

/// A listening API socket; stops (and removes the socket file) on drop.
pub type ApiServer = crate::http::HttpServer;

/// Starts the API on `path` with the socket file mode `mode`.
pub fn serve(
    path: &Path,
    mode: u32,
    ctl: Arc<FleetControl>,
) -> Result<ApiServer, crate::http::BindError> {
    crate::http::HttpServer::start(
        path,
        crate::http::SocketOptions { mode },
        Arc::new(ApiHandler(ctl)),
    )
}

/// Client side: one JSON request to the API at `path`; returns the status
/// and the parsed body (`Value::Null` if it is not JSON).
pub fn request(
    path: &Path,
    method: &str,
    target: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, Value)> {
    let bytes = body.map(|b| serde_json::to_vec(b).unwrap_or_default());
    let (st, out) = crate::http::call(
        path,
        method,
        target,
        bytes.as_deref().map(|b| ("application/json", b)),
    )?;
    Ok((st, serde_json::from_slice(&out).unwrap_or(Value::Null)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet() -> FleetConfig {
        FleetConfig::parse(
            "[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\n",
            Path::new("/x/f.toml"),
        )
        .unwrap()
    }

    fn call(ctl: &FleetControl, method: &str, path: &str, body: &str) -> (u16, Value) {
        let req = Request {
            method: method.into(),
            path: path.into(),
            query: None,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.as_bytes().to_vec(),
            keep_alive: true,
        };
        let (reply, rx) = Responder::detached();
        ctl.route(req, reply);
        let (_, r) = rx.recv().unwrap();
        (r.status, serde_json::from_slice(&r.body).unwrap())
    }

    #[test]
    fn refusals_name_the_vm_the_field_and_the_reason_and_change_nothing() {
        let ctl = FleetControl::new(
            Arc::new(crate::fleet::FleetGpus::new(&fleet())),
            &fleet(),
            &[None],
        );
        let (st, v) = call(&ctl, "GET", "/api/v1/vms", "");
        assert_eq!(st, 200);
        assert_eq!(v["vms"][0]["name"], "a");
        assert_eq!(v["vms"][0]["state"], "running");
        assert_eq!(v["vms"][0]["gpu"], false);
        let cases = [
            ("GET", "/api/v1/vms/b", "", 404, "vm 'b': no such VM"),
            (
                "PATCH",
                "/api/v1/vms/a",
                "{\"priority\": 16}",
                400,
                "vm 'a': priority: 16 is out of range 0..=15",
            ),
            (
                "PATCH",
                "/api/v1/vms/a",
                "{\"weight\": \"x\"}",
                400,
                "vm 'a': weight: invalid type: string",
            ),
            (
                "PATCH",
                "/api/v1/vms/a",
                "{\"colour\": 1}",
                400,
                "vm 'a': colour: unknown field",
            ),
            (
                "PATCH",
                "/api/v1/vms/a",
                "[1]",
                400,
                "expected a JSON object",
            ),
            (
                "PATCH",
                "/api/v1/vms/a",
                "{\"priority\": 3}",
                409,
                "vm 'a': priority: the VM has no vGPU",
            ),
            (
                "POST",
                "/api/v1/vms/a/pause",
                "",
                409,
                "vm 'a': pause: the VM has no vGPU",
            ),
            (
                "PUT",
                "/api/v1/policy",
                "{\"policy\": \"lottery\"}",
                400,
                "unknown policy 'lottery' (one of: hqdmux, fifo, poll5ms, timeslice, reset)",
            ),
            (
                "PUT",
                "/api/v1/policy",
                "{\"policy\": \"fifo\"}",
                409,
                "the fleet has no GPU VMs",
            ),
            (
                "DELETE",
                "/api/v1/vms/a",
                "",
                405,
                "method DELETE not allowed",
            ),
            ("GET", "/api/v2/vms", "", 404, "no such path"),
            ("POST", "/api/v1/vms/a/stop", "", 503, "no fleet loop"),
            (
                "POST",
                "/api/v1/vms",
                "{\"name\": \"a\", \"image\": \"builtin:hello\"}",
                409,
                "vm 'a' (vm[1]): field `name`",
            ),
            (
                "POST",
                "/api/v1/vms",
                "{\"name\": \"c\", \"image\": \"builtin:hello\", \"vcpus\": 99}",
                422,
                "vm 'c' (vm[1]): field `vcpus`: 99 is out of range",
            ),
        ];
        for (m, p, b, want_st, want) in cases {
            let (st, v) = call(&ctl, m, p, b);
            let e = v["error"]
                .as_str()
                .unwrap_or_else(|| panic!("{m} {p}: {v}"));
            assert_eq!(st, want_st, "{m} {p} {b}: {e}");
            assert!(e.contains(want), "{m} {p} {b}: {e}");
        }
        let (_, v) = call(&ctl, "GET", "/api/v1/vms/a", "");
        assert_eq!(v["priority"], 0);
        assert_eq!(v["state"], "running");
        assert_eq!(ctl.len(), 1, "no VM added");
    }

    fn raw(ctl: &FleetControl, method: &str, path: &str, query: Option<&str>) -> Response {
        let req = Request {
            method: method.into(),
            path: path.into(),
            query: query.map(str::to_owned),
            headers: vec![],
            body: vec![],
            keep_alive: true,
        };
        let (reply, rx) = Responder::detached();
        ctl.route(req, reply);
        rx.recv().unwrap().1
    }

    /// A control over one GPU VM `g` registered with a real arbiter.
    fn gpu_fleet() -> (FleetControl, Arc<GpuArbiter>) {
        let cfg = FleetConfig::parse(
            "[[vm]]\nname = \"g\"\nimage = \"builtin:gpu\"\ngpu = true\npriority = 5\nmemory_mib = 256\n",
            Path::new("/x/f.toml"),
        )
        .unwrap();
        let m = crate::fleet::start_arbiter(&cfg).unwrap();
        let mem: Arc<dyn gpu::mem::DmaMemory> = Arc::new(gpu::mem::SparseMemory::new(1 << 30));
        let params = scheduler::VmParams {
            priority: 5,
            ..Default::default()
        };
        let (h, _fe) = m
            .add_vm("g", mem, params, Arc::new(mdev::probe::NoIrqs))
            .unwrap();
        (
            FleetControl::new(
                Arc::new(crate::fleet::FleetGpus::single(0, m.clone())),
                &cfg,
                &[Some(h)],
            ),
            m,
        )
    }

    #[test]
    fn merged_expositions_have_each_family_once_and_every_gpus_samples() {
        let a = "# HELP x_total X.\n# TYPE x_total counter\nx_total{gpu_id=\"0\"} 1\n\
                 # HELP h H.\n# TYPE h histogram\nh_bucket{gpu_id=\"0\",le=\"+Inf\"} 2\nh_sum{gpu_id=\"0\"} 3\nh_count{gpu_id=\"0\"} 2\nsame 1\n";
        let b = a.replace("gpu_id=\"0\"", "gpu_id=\"1\"");
        let m = merge_expositions(&[a.to_owned(), b]);
        assert_eq!(m.matches("# HELP x_total").count(), 1, "{m}");
        assert_eq!(m.matches("# TYPE h histogram").count(), 1, "{m}");
        let lines: Vec<&str> = m.lines().collect();
        // A family's samples follow its header, GPU 0's then GPU 1's.
        let at = |l: &str| lines.iter().position(|x| *x == l).unwrap();
        assert!(at("# TYPE x_total counter") < at("x_total{gpu_id=\"0\"} 1"));
        assert_eq!(
            at("x_total{gpu_id=\"1\"} 1"),
            at("x_total{gpu_id=\"0\"} 1") + 1
        );
        assert!(at("h_count{gpu_id=\"1\"} 2") < at("# HELP h H.") + 10);
        assert!(at("h_count{gpu_id=\"1\"} 2") > at("# HELP h H."));
        assert_eq!(m.matches("same 1").count(), 1, "{m}");
        assert_eq!(merge_expositions(&[a.to_owned()]), a);
    }

    /// Two GPUs, VM `a` on GPU 0 and `b` on GPU 1, each registered with
    /// its own GPU's arbiter.
    fn two_gpu_fleet() -> (FleetControl, FleetConfig) {
        let cfg = FleetConfig::parse(
            "[[gpu]]\nid = 0\n[[gpu]]\nid = 1\npartition_mode = \"DPX\"\n\
             [[vm]]\nname = \"a\"\nimage = \"builtin:gpu\"\ngpu = true\ngpu_id = 0\nmemory_mib = 256\n\
             [[vm]]\nname = \"b\"\nimage = \"builtin:gpu\"\ngpu = true\nmemory_mib = 256\n",
            Path::new("/x/f.toml"),
        )
        .unwrap();
        assert_eq!(cfg.vm[1].gpu_id, Some(1), "placed on the empty GPU");
        let gpus = Arc::new(crate::fleet::FleetGpus::new(&cfg));
        let mut hs = Vec::new();
        for v in &cfg.vm {
            let m = gpus.start(&cfg, v.gpu_id.unwrap()).unwrap();
            let mem: Arc<dyn gpu::mem::DmaMemory> = Arc::new(gpu::mem::SparseMemory::new(1 << 30));
            let (h, _fe) = m
                .add_vm(
                    &v.name,
                    mem,
                    Default::default(),
                    Arc::new(mdev::probe::NoIrqs),
                )
                .unwrap();
            hs.push(Some(h));
        }
        (FleetControl::new(gpus, &cfg, &hs), cfg)
    }

    #[test]
    fn added_vms_are_placed_against_running_and_starting_vms() {
        let (ctl, _cfg) = two_gpu_fleet();
        let (tx, rx) = std::sync::mpsc::channel();
        ctl.connect_fleet(tx, Arc::new(EventFd::new(0).unwrap()));
        let add = |name: &str, extra: &str| -> VmConfig {
            let body = format!(
                "{{\"name\": \"{name}\", \"image\": \"builtin:gpu\", \"gpu\": true, \"memory_mib\": 256{extra}}}"
            );
            let req = Request {
                method: "POST".into(),
                path: "/api/v1/vms".into(),
                query: None,
                headers: vec![("content-type".into(), "application/json".into())],
                body: body.into_bytes(),
                keep_alive: true,
            };
            let (reply, _answers) = Responder::detached();
            ctl.route(req, reply);
            let Ok(FleetCommand::Add { config, .. }) = rx.try_recv() else {
                panic!("the add of {name} did not reach the fleet loop");
            };
            *config
        };
        // GPU 1 is DPX (two 152-CU partitions): b is on its partition 0,
        // so c would have 152 CUs on GPU 0 beside a and 152 alone on GPU
        // 1's partition 1: the tie goes to the partition with fewer VMs.
        let c = add("c", "");
        assert_eq!(c.gpu_id, Some(1), "{:?}", c.placement);
        // c is still starting (not built yet) but already on GPU 1.
        let d = add("d", "");
        assert_eq!(d.gpu_id, Some(0), "{:?}", d.placement);
        assert!(d
            .placement
            .unwrap()
            .contains("gpu 1 partition 0 76/152 CUs (weight 1 at >= 0, 1 VM)"));
        // gpu_id as given wins over the load.
        let e = add("e", ", \"gpu_id\": 0");
        assert_eq!(
            (e.gpu_id, e.placement.as_deref()),
            (Some(0), Some("gpu_id = 0"))
        );
        // The view of a VM being added already names its GPU.
        let (_, v) = call(&ctl, "GET", "/api/v1/vms/c", "");
        assert_eq!(v["gpu_id"], 1, "{v}");
        for (_, m) in ctl.gpus().started() {
            m.shutdown();
        }
    }

    #[test]
    fn two_gpus_each_carry_their_gpu_id_in_metrics_and_the_api() {
        let (ctl, cfg) = two_gpu_fleet();
        let g0 = ctl.gpus().get(0).unwrap().clone();
        let g1 = ctl.gpus().get(1).unwrap().clone();
        assert!(!Arc::ptr_eq(&g0, &g1), "one arbiter per GPU");
        let text = String::from_utf8(raw(&ctl, "GET", "/metrics", None).body).unwrap();
        let vm_lines = |vm: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.contains(&format!("vm=\"{vm}\"")))
                .map(String::from)
                .collect()
        };
        assert!(
            !vm_lines("a").is_empty() && !vm_lines("b").is_empty(),
            "{text}"
        );
        assert!(
            vm_lines("a").iter().all(|l| l.contains("gpu_id=\"0\"")),
            "{text}"
        );
        assert!(
            vm_lines("b").iter().all(|l| l.contains("gpu_id=\"1\"")),
            "{text}"
        );
        assert!(
            vm_lines("b").iter().all(|l| !l.contains("gpu_partition_id")
                || l.contains("gpu_compute_partition_type=\"DPX\"")),
            "{text}"
        );
        // One HELP per family although two GPUs wrote it.
        let mut helps: Vec<&str> = text.lines().filter(|l| l.starts_with("# HELP ")).collect();
        let n = helps.len();
        helps.dedup();
        assert_eq!(helps.len(), n, "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("hqdmux_hqd_slots{gpu_id=\"1\"")),
            "{text}"
        );
        // The API: each VM's GPU, each GPU's view.
        let (_, v) = call(&ctl, "GET", "/api/v1/vms/b", "");
        assert_eq!(v["gpu_id"], 1, "{v}");
        assert!(
            v["placement"].as_str().unwrap().starts_with("auto: gpu 1"),
            "{v}"
        );
        let (_, v) = call(&ctl, "GET", "/api/v1/vms/a", "");
        assert_eq!(v["gpu_id"], 0, "{v}");
        assert_eq!(v["placement"], "gpu_id = 0", "{v}");
        let (_, f) = call(&ctl, "GET", "/api/v1/fleet", "");
        let ids: Vec<u64> = f["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["gpu_id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids, [0, 1], "{f}");
        assert_eq!(f["gpus"][1]["gpu_compute_partition_type"], "DPX", "{f}");
        assert_eq!(f["gpus"][1]["partitions"], 2, "{f}");
        // Timelines per GPU; an unknown GPU is refused.
        for id in [0u64, 1] {
            let r = raw(
                &ctl,
                "GET",
                "/api/v1/timeline",
                Some(&format!("gpu_id={id}")),
            );
            assert_eq!(r.status, 200);
            let t: Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(t["gpu_id"], id, "{t}");
            assert!(t["slots"].is_array(), "{t}");
        }
        let t: Value =
            serde_json::from_slice(&raw(&ctl, "GET", "/api/v1/timeline", None).body).unwrap();
        assert_eq!(t["gpu_id"], 0, "the first GPU by default: {t}");
        // No such GPU: 404 naming the host's GPUs (issue 20: was 409).
        let r = raw(&ctl, "GET", "/api/v1/timeline", Some("gpu_id=7"));
        assert_eq!(r.status, 404);
        let e: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            e["error"], "gpu 7: no such GPU (the host's GPUs: 0, 1)",
            "{e}"
        );
        assert_eq!(
            raw(&ctl, "GET", "/api/v1/timeline", Some("gpu_id=x")).status,
            400
        );
        // A policy change reaches every GPU.
        let (st, _) = call(&ctl, "PUT", "/api/v1/policy", "{\"policy\":\"fifo\"}");
        assert_eq!(st, 200);
        assert_eq!(
            (g0.policy(), g1.policy()),
            (scheduler::Policy::Fifo, scheduler::Policy::Fifo)
        );
        drop(cfg);
        g0.shutdown();
        g1.shutdown();
    }

    #[test]
    fn metrics_timeline_and_guard_are_served() {
        let (ctl, m) = gpu_fleet();
        let r = raw(&ctl, "GET", "/metrics", None);
        assert_eq!(r.status, 200);
        assert_eq!(r.content_type, mdev::metrics::CONTENT_TYPE);
        let text = String::from_utf8(r.body).unwrap();
        assert!(text.contains("vm=\"g\""), "{text}");
        // Joinable with AMD's exporter; build, state and guard series.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            for label in [
                "gpu_id=\"0\"",
                "gpu_compute_partition_type=\"",
                "hostname=\"",
            ] {
                assert!(l.contains(label), "{label} missing: {l}");
            }
        }
        let commit = format!("commit=\"{}\"", env!("HQDMUX_GIT_COMMIT"));
        assert!(
            text.lines().any(|l| l.starts_with("hqdmux_build_info{")
                && l.contains(&commit)
                && l.ends_with(" 1")),
            "{text}"
        );
        let state = |st: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("hqdmux_vm_state{vm=\"g\"")
                        && l.contains(&format!("state=\"{st}\""))
                })
                .and_then(|l| l.rsplit_once(' '))
                .map(|(_, v)| v.to_owned())
        };
        assert_eq!(state("running").as_deref(), Some("1"), "{text}");
        assert_eq!(state("paused").as_deref(), Some("0"), "{text}");
        assert!(text.contains("hqdmux_vm_quarantined{vm=\"g\""), "{text}");
        assert!(text.contains("reason=\"none\"} 0"), "{text}");
        assert_eq!(
            VM_STATE_NAMES.to_vec(),
            VmState::ALL.iter().map(|s| s.name()).collect::<Vec<_>>()
        );
        assert_eq!(raw(&ctl, "POST", "/metrics", None).status, 405);

        let r = raw(&ctl, "GET", "/api/v1/timeline", Some("seconds=5"));
        assert_eq!(r.status, 200);
        assert_eq!(r.content_type, "application/json");
        let t = timeline::Timeline::from_json(std::str::from_utf8(&r.body).unwrap()).unwrap();
        assert!(t.vms.iter().any(|v| v.name == "g"), "{t:?}");
        let r = raw(
            &ctl,
            "GET",
            "/api/v1/timeline",
            Some("format=svg&seconds=120"),
        );
        assert_eq!(r.content_type, "image/svg+xml");
        let svg = String::from_utf8(r.body).unwrap();
        assert!(svg.starts_with("<svg") || svg.starts_with("<?xml"), "{svg}");
        assert!(svg.contains(">g"), "{svg}");
        for (q, want) in [
            (
                "seconds=0",
                "timeline: seconds: '0' is not an integer in 1..=120",
            ),
            ("seconds=121", "timeline: seconds: '121'"),
            ("seconds=x", "timeline: seconds: 'x'"),
            (
                "format=png",
                "timeline: format: 'png' is not one of json, svg",
            ),
            ("colour=red", "timeline: colour: unknown query parameter"),
        ] {
            let r = raw(&ctl, "GET", "/api/v1/timeline", Some(q));
            assert_eq!(r.status, 400, "{q}");
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            assert!(v["error"].as_str().unwrap().contains(want), "{q}: {v}");
        }

        let (st, v) = call(&ctl, "GET", "/api/v1/vms/g", "");
        assert_eq!(st, 200);
        assert_eq!(v["queue_errors"], 0);
        for k in ["latency_p50_ms", "latency_p99_ms"] {
            assert_eq!(v.get(k), Some(&Value::Null), "{k}: no completions yet");
        }
        assert_eq!(v["quarantined"], false);
        assert_eq!(v["guard"]["max_resets"], 3);
        assert_eq!(v["guard"]["quarantined"], Value::Null);
        let (st, v) = call(&ctl, "POST", "/api/v1/vms/g/clear-quarantine", "");
        assert_eq!(st, 200);
        assert_eq!(v["was_quarantined"], false);
        assert_eq!(v["name"], "g");

        let (st, v) = call(
            &ctl,
            "PATCH",
            "/api/v1/vms/g",
            "{\"guard\": {\"max_queue_errors\": 2, \"window_ms\": 1000}}",
        );
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["guard"]["max_queue_errors"], 2);
        assert_eq!(v["guard"]["window_ms"], 1000);
        assert_eq!(v["guard"]["max_resets"], 3, "other limits kept");
        for (body, want) in [
            ("{\"guard\": {\"window_ms\": 0}}", "guard.window_ms"),
            (
                "{\"guard\": {\"max_resets\": -1}}",
                "guard.max_resets: invalid value",
            ),
            ("{\"guard\": {\"bogus\": 1}}", "guard.bogus: unknown field"),
            (
                "{\"guard\": 3}",
                "guard: invalid type: integer `3`, expected struct",
            ),
            ("{\"guard\": {}, \"priority\": 9}", "guard: empty object"),
        ] {
            let (st, v) = call(&ctl, "PATCH", "/api/v1/vms/g", body);
            assert_eq!(st, 400, "{body}: {v}");
            assert!(v["error"].as_str().unwrap().contains(want), "{body}: {v}");
        }
        let (_, v) = call(&ctl, "GET", "/api/v1/vms/g", "");
        assert_eq!(
            v["guard"]["max_queue_errors"], 2,
            "refused changes changed nothing"
        );
        assert_eq!(v["priority"], 5);

        // After the VM ends its queue errors stay readable, its guard is gone.
        m.remove_vm(VmId(0));
        ctl.ended(0, VmEnd::default());
        let (_, v) = call(&ctl, "GET", "/api/v1/vms/g", "");
        assert_eq!(v["queue_errors"], 0);
        assert_eq!(v["guard"], Value::Null);
        let (st, _) = call(&ctl, "POST", "/api/v1/vms/g/clear-quarantine", "");
        assert_eq!(st, 409);
        m.shutdown();
    }

    #[test]
    fn without_a_gpu_metrics_answer_and_timeline_and_clear_quarantine_refuse() {
        let ctl = FleetControl::new(
            Arc::new(crate::fleet::FleetGpus::new(&fleet())),
            &fleet(),
            &[None],
        );
        let r = raw(&ctl, "GET", "/metrics", None);
        assert_eq!(r.status, 200);
        assert!(String::from_utf8(r.body).unwrap().starts_with('#'));
        assert_eq!(raw(&ctl, "GET", "/api/v1/timeline", None).status, 409);
        assert_eq!(
            raw(&ctl, "GET", "/api/v1/timeline", Some("seconds=0")).status,
            400
        );
        let (st, v) = call(&ctl, "POST", "/api/v1/vms/a/clear-quarantine", "");
        assert_eq!(st, 409);
        assert!(v["error"].as_str().unwrap().contains("no vGPU"), "{v}");
        let (st, v) = call(&ctl, "GET", "/api/v1/vms/a", "");
        assert_eq!(st, 200);
        assert_eq!(v["queue_errors"], Value::Null);
        assert_eq!(v["latency_p50_ms"], Value::Null);
        assert_eq!(v["guard"], Value::Null);
        assert_eq!(raw(&ctl, "DELETE", "/api/v1/timeline", None).status, 405);
    }

    #[test]
    fn vm_bodies_are_read_as_toml_or_json() {
        let req = |ct: &str, body: &str| Request {
            method: "POST".into(),
            path: "/api/v1/vms".into(),
            query: None,
            headers: vec![("content-type".into(), ct.into())],
            body: body.as_bytes().to_vec(),
            keep_alive: true,
        };
        let t = vm_table(&req(
            "application/toml",
            "[[vm]]\nname = \"x\"\ngpu = true\n",
        ))
        .unwrap();
        assert_eq!(t["name"].as_str(), Some("x"));
        let t = vm_table(&req("application/toml", "name = \"y\"\npriority = 3\n")).unwrap();
        assert_eq!(t["priority"].as_integer(), Some(3));
        let t = vm_table(&req("application/json", "{\"name\": \"z\", \"gpu\": true}")).unwrap();
        assert_eq!(t["gpu"].as_bool(), Some(true));
        let t = vm_table(&req(
            "application/json",
            "{\"name\": \"z\", \"guard\": {\"max_resets\": 2}}",
        ))
        .unwrap();
        assert_eq!(t["guard"]["max_resets"].as_integer(), Some(2));
        let e = vm_table(&req(
            "application/json",
            "{\"guard\": {\"window_ms\": [1]}}",
        ))
        .unwrap_err();
        assert_eq!(e.status(), 422);
        assert!(e.to_string().contains("`guard.window_ms`"), "{e}");
        assert!(vm_table(&req(
            "application/toml",
            "[[vm]]\nname=\"a\"\n[[vm]]\nname=\"b\"\n"
        ))
        .is_err());
        assert_eq!(vm_table(&req("image/png", "x")).unwrap_err().status(), 415);
        assert_eq!(
            vm_table(&req("application/json", "{\"weight\": 1.5}"))
                .unwrap_err()
                .status(),
            422
        );
    }

    #[test]
    fn hostile_patches_change_nothing_and_ended_vms_refuse_every_action() {
        let (ctl, _m) = gpu_fleet();
        let before = call(&ctl, "GET", "/api/v1/vms/g", "").1;
        assert_eq!(before["priority"], 5);
        let refused = [
            // A valid field beside an invalid one: nothing is applied.
            "{\"priority\": 15, \"weight\": 0}",
            "{\"weight\": 1000, \"priority\": 16}",
            "{\"priority\": 1, \"colour\": 1}",
            "{\"priority\": -1}",
            "{\"priority\": 2.0}",
            "{\"priority\": 1e1}",
            "{\"priority\": \"3\"}",
            "{\"priority\": true}",
            "{\"priority\": null}",
            "{\"weight\": 1001}",
            "{\"quantum_ms\": 0}",
            "{\"quantum_ms\": 10001}",
            "{\"preempt_timeout_ms\": 0}",
            "{\"preempt_timeout_ms\": 18446744073709551615}",
            "{\"preempt_timeout_ms\": 18446744073709551616}",
            "{\"priority\": 1, \"priority\": 99}",
            "{}",
            "{\"priority\": 1",
        ];
        for body in refused {
            let (st, v) = call(&ctl, "PATCH", "/api/v1/vms/g", body);
            assert_eq!(st, 400, "{body}: {v}");
            assert!(v["error"].is_string(), "{body}: {v}");
            let now = call(&ctl, "GET", "/api/v1/vms/g", "").1;
            assert_eq!(now["priority"], before["priority"], "{body}");
            assert_eq!(now["weight"], before["weight"], "{body}");
        }
        // The range edges are accepted.
        let (st, v) = call(
            &ctl,
            "PATCH",
            "/api/v1/vms/g",
            "{\"priority\": 15, \"weight\": 1000, \"quantum_ms\": 10000}",
        );
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["priority"], 15);
        assert_eq!(v["weight"], 1000);
        let (st, v) = call(
            &ctl,
            "PATCH",
            "/api/v1/vms/g",
            "{\"priority\": 0, \"weight\": 1}",
        );
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["priority"], 0);
        // Unknown VM names, including ones no config allows.
        for name in ["nope", "a%22b", "..", "x\u{7f}"] {
            for action in ["pause", "resume", "stop"] {
                let (st, _) = call(&ctl, "POST", &format!("/api/v1/vms/{name}/{action}"), "");
                assert_eq!(st, 404, "{name} {action}");
            }
        }
        // An ended VM refuses pause, resume, stop and PATCH alike.
        ctl.ended(0, VmEnd::default());
        for (m, p, b) in [
            ("POST", "/api/v1/vms/g/pause", ""),
            ("POST", "/api/v1/vms/g/resume", ""),
            ("POST", "/api/v1/vms/g/stop", ""),
            ("PATCH", "/api/v1/vms/g", "{\"priority\": 3}"),
        ] {
            let (st, v) = call(&ctl, m, p, b);
            assert_eq!(st, 409, "{m} {p}: {v}");
            assert!(
                v["error"].as_str().unwrap().contains("exited"),
                "{m} {p}: {v}"
            );
        }
    }

    #[test]
    fn pause_resume_and_stop_answer_200_when_the_vm_is_already_there() {
        let (ctl, m) = gpu_fleet();
        for (action, state) in [
            ("pause", "paused"),
            ("pause", "paused"),
            ("resume", "running"),
            ("resume", "running"),
        ] {
            let (st, v) = call(&ctl, "POST", &format!("/api/v1/vms/g/{action}"), "");
            assert_eq!(
                (st, v["state"].as_str()),
                (200, Some(state)),
                "{action}: {v}"
            );
        }
        // Stopped (by the operator): a stop is answered with the view, and
        // without a fleet loop to ask.
        m.remove_vm(VmId(0));
        ctl.ended(
            0,
            VmEnd {
                stopped: true,
                outcome: "stopped: by the operator".into(),
                ..Default::default()
            },
        );
        let (st, v) = call(&ctl, "POST", "/api/v1/vms/g/stop", "");
        assert_eq!((st, v["state"].as_str()), (200, Some("stopped")), "{v}");
        // Pause of an ended VM is still refused: it cannot be paused.
        let (st, _) = call(&ctl, "POST", "/api/v1/vms/g/pause", "");
        assert_eq!(st, 409);
        m.shutdown();
    }

    #[test]
    fn a_fleet_without_a_gpu_passes_a_gpu_vm_to_the_fleet_loop() {
        let ctl = FleetControl::new(
            Arc::new(crate::fleet::FleetGpus::new(&fleet())),
            &fleet(),
            &[None],
        );
        let (tx, rx) = std::sync::mpsc::channel();
        ctl.connect_fleet(tx, Arc::new(EventFd::new(0).unwrap()));
        let body =
            "{\"name\": \"g\", \"image\": \"builtin:gpu\", \"gpu\": true, \"memory_mib\": 256}";
        let req = Request {
            method: "POST".into(),
            path: "/api/v1/vms".into(),
            query: None,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.as_bytes().to_vec(),
            keep_alive: true,
        };
        let (reply, _answers) = Responder::detached();
        ctl.route(req, reply);
        let Ok(FleetCommand::Add { config, .. }) = rx.try_recv() else {
            panic!("the add did not reach the fleet loop");
        };
        assert!(config.gpu);
        // The fleet loop starts the arbiter and hands it over.
        let cfg = FleetConfig::parse(
            "[[vm]]\nname = \"g\"\nimage = \"builtin:gpu\"\ngpu = true\nmemory_mib = 256\n",
            Path::new("/x/f.toml"),
        )
        .unwrap();
        let m = ctl.gpus().start(&cfg, 0).unwrap();
        let (_, f) = call(&ctl, "GET", "/api/v1/fleet", "");
        assert_eq!(f["gpu"]["completions"], 0, "{f}");
        assert_eq!(
            raw(&ctl, "GET", "/api/v1/timeline", None).status,
            200,
            "the timeline is served once the GPU exists"
        );
        m.shutdown();
    }

    #[test]
    fn deeply_nested_bodies_are_refused_not_a_stack_overflow() {
        let ctl = FleetControl::new(
            Arc::new(crate::fleet::FleetGpus::new(&fleet())),
            &fleet(),
            &[None],
        );
        let depth = 30_000;
        let toml_body = format!("name = \"n\"\nx = {}", "[".repeat(depth));
        let json_body = format!("{{\"name\": {}", "[".repeat(depth));
        for (ct, body) in [
            ("application/toml", toml_body),
            ("application/json", json_body.clone()),
            ("application/toml", format!("x = {}", "{a = ".repeat(depth))),
        ] {
            let req = Request {
                method: "POST".into(),
                path: "/api/v1/vms".into(),
                query: None,
                headers: vec![("content-type".into(), ct.into())],
                body: body.into_bytes(),
                keep_alive: true,
            };
            let (reply, rx) = Responder::detached();
            ctl.route(req, reply);
            let (_, r) = rx.recv().unwrap();
            assert_eq!(r.status, 400, "{ct}");
        }
        let (st, _) = call(&ctl, "PATCH", "/api/v1/vms/a", &json_body);
        assert_eq!(st, 400);
        assert_eq!(ctl.len(), 1);
    }

    /// A fleet that adds and ends VMs through the API keeps the views of
    /// the last [`RETAINED_ENDED_VMS`] ended ones (and every live one):
    /// older ones answer 404, leave `GET /vms` and keep their name taken.
    #[test]
    fn only_the_last_ended_vms_are_kept_and_their_names_stay_taken() {
        let ctl = FleetControl::new(
            Arc::new(crate::fleet::FleetGpus::new(&fleet())),
            &fleet(),
            &[None],
        );
        let (tx, rx) = std::sync::mpsc::channel();
        ctl.connect_fleet(tx, Arc::new(EventFd::new(0).unwrap()));
        let n = RETAINED_ENDED_VMS + 40;
        for k in 0..n {
            let body = format!("{{\"name\": \"v{k}\", \"image\": \"builtin:hello\"}}");
            let (reply, answers) = Responder::detached();
            let req = Request {
                method: "POST".into(),
                path: "/api/v1/vms".into(),
                query: None,
                headers: vec![("content-type".into(), "application/json".into())],
                body: body.into_bytes(),
                keep_alive: true,
            };
            ctl.route(req, reply);
            // What the fleet loop does: start it, answer, and it ends.
            let Ok(FleetCommand::Add { index, reply, .. }) = rx.try_recv() else {
                panic!("no add command for v{k}");
            };
            ctl.started(index, None);
            reply.send(Response::json(201, &ctl.view_of(index).unwrap()));
            assert_eq!(answers.recv().unwrap().1.status, 201);
            ctl.ended(
                index,
                VmEnd {
                    outcome: "exited with status 0".into(),
                    exit_status: Some(0),
                    ..Default::default()
                },
            );
        }
        let (st, v) = call(&ctl, "GET", "/api/v1/vms", "");
        assert_eq!(st, 200);
        let names: Vec<&str> = v["vms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        // The live config VM and the last RETAINED_ENDED_VMS ended ones.
        assert_eq!(names.len(), 1 + RETAINED_ENDED_VMS);
        assert_eq!(names[0], "a");
        assert_eq!(names[1], format!("v{}", n - RETAINED_ENDED_VMS));
        assert_eq!(*names.last().unwrap(), format!("v{}", n - 1));
        let (st, v) = call(&ctl, "GET", "/api/v1/vms/v0", "");
        assert_eq!(
            (st, v["error"].as_str()),
            (404, Some("vm 'v0': no such VM"))
        );
        let (st, v) = call(&ctl, "GET", &format!("/api/v1/vms/v{}", n - 1), "");
        assert_eq!((st, v["state"].as_str()), (200, Some("exited")));
        assert_eq!(v["exit_status"], 0);
        // The name of a forgotten VM is still taken.
        let (st, v) = call(
            &ctl,
            "POST",
            "/api/v1/vms",
            "{\"name\": \"v0\", \"image\": \"builtin:hello\"}",
        );
        assert_eq!(st, 409, "{v}");
        assert!(
            v["error"].as_str().unwrap().contains("duplicate name"),
            "{v}"
        );
        assert!(rx.try_recv().is_err(), "a refused add reached the fleet");
        let (_, f) = call(&ctl, "GET", "/api/v1/fleet", "");
        assert_eq!(f["vms"], 1 + RETAINED_ENDED_VMS);
        assert_eq!(f["vms_forgotten"], 40);
        assert_eq!(f["states"]["exited"], RETAINED_ENDED_VMS);
        // The API's copy of the fleet config holds the kept VMs only.
        assert_eq!(ctl.lock().cfg.vm.len(), 1 + RETAINED_ENDED_VMS);
    }
}
