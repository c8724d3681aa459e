//! A fleet run: build every VM of a config, start them, wait on one event
//! loop (event-manager) for each VM's end or the run timeout, report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use event_manager::{EventManager, EventOps, Events, MutEventSubscriber, SubscriberOps};
use kvm_ioctls::Kvm;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use gpu::mem::DmaMemory;
use mdev::arbiter::{ArbiterStats, GpuArbiter};
use mdev::vgpu::VmId;
use scheduler::VmParams;

use crate::api::ApiError;
use crate::config::{FleetConfig, ImageSource, VmConfig};
use crate::devices::msix::{KvmMsi, Msix};
use crate::devices::vgpu::VgpuPci;
use crate::vm::{Vm, VmError, VmReport, VmSpec};

/// Run options not in the config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Print console lines on stdout as they arrive.
    pub echo: bool,
    /// Serve the operator control socket here while the fleet runs.
    pub api_socket: Option<std::path::PathBuf>,
    /// Stop every VM when this becomes readable (SIGINT/SIGTERM, see
    /// [`crate::signals`]); the run then reports like a timeout.
    pub stop: Option<crate::signals::StopSignal>,
    /// Permission bits of the API socket file (`None`: 0600).
    pub api_socket_mode: Option<u32>,
}

/// Failures before any VM runs (nothing is left running).
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// `/dev/kvm` could not be opened.
    #[error("cannot open /dev/kvm: {0}")]
    Kvm(kvm_ioctls::Error),
    /// An image file could not be read.
    #[error("vm '{vm}': cannot read image {path}: {source}")]
    Image {
        /// VM name.
        vm: String,
        /// Image path.
        path: String,
        /// I/O error.
        source: std::io::Error,
    },
    /// A VM could not be built.
    #[error("vm '{vm}': {source}")]
    Build {
        /// VM name.
        vm: String,
        /// Why.
        source: VmError,
    },
    /// An eventfd or timerfd of the event loop could not be made.
    #[error("event loop: {0}")]
    EventLoop(#[source] std::io::Error),
    /// The event manager failed.
    #[error("event loop: {0}")]
    EventManager(#[source] event_manager::Error),
    /// The mediated GPU could not be set up.
    #[error("gpu: {0}")]
    Gpu(#[source] GpuError),
    /// A VM's vGPU could not be set up.
    #[error("gpu: vm '{vm}': {source}")]
    Vgpu {
        /// VM name.
        vm: String,
        /// Why.
        source: GpuError,
    },
    /// The API socket path is taken (a file, or a live fleet's socket).
    #[error("api socket {0}")]
    ApiBind(crate::http::BindError),
    /// A stop request (SIGINT/SIGTERM) arrived while the VMs were being
    /// built: the launch was abandoned before any guest ran.
    #[error("stopped by {} before any VM started", crate::signals::name(*.0))]
    Stopped(i32),
}

/// Why the mediated GPU or a VM's vGPU could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The `[gpu]` backend could not be opened.
    #[error("{0}")]
    Backend(#[from] gpu::topology::TopologyError),
    /// The arbiter refused.
    #[error("{0}")]
    Arbiter(#[from] mdev::arbiter::ArbiterError),
    /// The vGPU's MSI-X routes could not be set up.
    #[error("{0}")]
    Msi(#[from] crate::devices::msix::MsiError),
    /// The vGPU could not be put on the PCI bus.
    #[error("{0}")]
    Pci(#[from] crate::devices::pci::PciError),
    /// The vfio-user server of a `gpu = { socket }` VM refused or failed.
    #[error("{0}")]
    Remote(#[from] crate::devices::vfio_client::VfioClientError),
    /// A GPU VM in a fleet without a GPU arbiter.
    #[error("the fleet has no GPU arbiter")]
    NoArbiter,
}

/// The result of a fleet run.
#[derive(Debug)]
pub struct FleetReport {
    /// When the launch began (before any VM was built).
    pub launched: Instant,
    /// One report per VM, in config order.
    pub vms: Vec<VmReport>,
    /// True if the run timeout stopped some VM.
    pub timed_out: bool,
    /// True if a stop request ([`RunOptions::stop`]) ended the run.
    pub stop_requested: bool,
    /// Mediated-GPU counters summed over the GPUs, when some VM had
    /// `gpu = true`.
    pub gpu: Option<ArbiterStats>,
    /// Each started GPU's counters, by `gpu_id`, in file order.
    pub gpus: Vec<(u32, ArbiterStats)>,
    /// Each VM's GPU (config order, then added VMs; `None` without a vGPU
    /// on this fleet's GPUs).
    pub vm_gpu_id: Vec<Option<u32>>,
    /// Per-VM GPU accounting at the moment its vGPU was detached (config
    /// order; `None` for VMs without `gpu = true`).
    pub vm_gpu: Vec<Option<scheduler::VmStats>>,
    /// Per-VM vGPU device counters (config order; `None` without a vGPU).
    pub vgpu_io: Vec<Option<VgpuIoStats>>,
    /// Per VM: stopped by the operator through the API (not a failure).
    pub operator_stopped: Vec<bool>,
}

/// Device-side counters of one VM's vGPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VgpuIoStats {
    /// MSI-X messages sent, held pending, dropped.
    pub msix: crate::devices::msix::MsixStats,
    /// Guest accesses the VMM refused (no such doorbell or register, bad
    /// width), logged or suppressed.
    pub refused: u64,
    /// Of those, how many were not logged (rate limit).
    pub refused_unlogged: u64,
}

impl FleetReport {
    /// True when VM `i` failed: it did not exit with status 0 and was not
    /// stopped by the operator.
    pub fn failed(&self, i: usize) -> bool {
        self.vms.get(i).is_some_and(|v| {
            !v.outcome.is_success() && !self.operator_stopped.get(i).copied().unwrap_or(false)
        })
    }

    /// How many VMs failed ([`failed`](Self::failed)).
    pub fn failures(&self) -> usize {
        (0..self.vms.len()).filter(|&i| self.failed(i)).count()
    }

    /// True when no VM failed: each exited with status 0 or was stopped by
    /// the operator.
    pub fn all_succeeded(&self) -> bool {
        self.failures() == 0
    }

    /// A per-VM summary table. `gpu_ms` is the host-measured time from the
    /// guest's "GPU work submitted" checkpoint (2) to its "completed" one (3):
    /// median and max over its submissions.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{:<16} {:>10} {:>10} {:>10} {:>16} {:>10} {:>8}  outcome\n",
            "vm", "entry_ms", "line_ms", "run_ms", "gpu_ms p50/max", "gpu_time", "preempt"
        );
        let ms = |t: Option<Instant>| {
            t.map(|t| format!("{:.2}", (t - self.launched).as_secs_f64() * 1e3))
                .unwrap_or_else(|| "-".into())
        };
        for (i, v) in self.vms.iter().enumerate() {
            let mut spans = v.spans(2, 3);
            spans.sort();
            let gpu = match (spans.get(spans.len() / 2), spans.last()) {
                (Some(p50), Some(max)) => format!(
                    "{:.2}/{:.2}",
                    p50.as_secs_f64() * 1e3,
                    max.as_secs_f64() * 1e3
                ),
                _ => "-".into(),
            };
            let (time, preempt) = match self.vm_gpu.get(i).copied().flatten() {
                Some(g) => (
                    format!("{:.2}", g.gpu_ns as f64 / 1e6),
                    g.preemptions.to_string(),
                ),
                None => ("-".into(), "-".into()),
            };
            s += &format!(
                "{:<16} {:>10} {:>10} {:>10.2} {:>16} {:>10} {:>8}  {}\n",
                v.name,
                ms(v.entered),
                ms(v.first_line),
                v.run_time.as_secs_f64() * 1e3,
                gpu,
                time,
                preempt,
                v.outcome
            );
        }
        s
    }
}

impl FleetReport {
    /// The summary as JSON (`hqdmux run --json`): per VM its outcome, exit
    /// status, times (ms) and GPU figures; the GPU counters.
    pub fn to_json(&self) -> serde_json::Value {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let since = |t: Option<Instant>| t.map(|t| ms(t - self.launched));
        let vms: Vec<serde_json::Value> = self
            .vms
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let mut spans = v.spans(2, 3);
                spans.sort();
                let g = self.vm_gpu.get(i).copied().flatten();
                serde_json::json!({
                    "name": v.name,
                    "gpu_id": self.vm_gpu_id.get(i).copied().flatten(),
                    "outcome": v.outcome.to_string(),
                    "success": !self.failed(i),
                    "stopped_by_operator": self.operator_stopped.get(i).copied().unwrap_or(false),
                    "exit_status": match v.outcome { crate::vm::VmOutcome::Exited(s) => Some(s), _ => None },
                    "entry_ms": since(v.entered),
                    "line_ms": since(v.first_line),
                    "run_ms": ms(v.run_time),
                    "gpu_ms_p50": spans.get(spans.len() / 2).map(|d| ms(*d)),
                    "gpu_ms_max": spans.last().map(|d| ms(*d)),
                    "gpu_time_ms": g.map(|g| g.gpu_ns as f64 / 1e6),
                    "preemptions": g.map(|g| g.preemptions),
                    "maps": g.map(|g| g.maps),
                    "cwsr_time_ms": g.map(|g| g.save_ns as f64 / 1e6),
                })
            })
            .collect();
        serde_json::json!({
            "vms": vms,
            "timed_out": self.timed_out,
            "stop_requested": self.stop_requested,
            "all_succeeded": self.all_succeeded(),
            "gpu": self.gpu.map(|s| serde_json::json!({
                "completions": s.completions,
                "maps": s.maps,
                "preemptions": s.preemptions,
                "stale_doorbells": s.stale_doorbells,
                "quarantined_vms": s.quarantined_vms,
            })),
            "gpus": self.gpus.iter().map(|(id, s)| serde_json::json!({
                "gpu_id": id,
                "completions": s.completions,
                "maps": s.maps,
                "preemptions": s.preemptions,
                "stale_doorbells": s.stale_doorbells,
                "quarantined_vms": s.quarantined_vms,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Builds, runs and reports every VM in `cfg`.
pub fn run_fleet(cfg: &FleetConfig, opts: RunOptions) -> Result<FleetReport, FleetError> {
    run_fleet_on(cfg, opts, None)
}

/// What `hqdmux serve` lends a fleet it runs inside the daemon: its GPUs
/// (the arbiters its vGPUs are served by) and its vGPU servers.
pub(crate) struct Host {
    /// The daemon's GPUs; VMs go on their arbiters, beside the vGPUs.
    pub(crate) gpus: Arc<FleetGpus>,
    /// The daemon's vGPU servers (`/api/v1/vgpus` on the same API).
    pub(crate) vgpus: Arc<crate::api::vgpus::VgpuControl>,
}

/// [`run_fleet`], or with `host` the fleet of a `hqdmux serve` daemon: on
/// the daemon's arbiters (left running for the daemon to stop), with its
/// vGPUs on the API, and running until the stop request even when no VM
/// is left (a VM ending is not the daemon ending; more can be added over
/// the API).
pub(crate) fn run_fleet_on(
    cfg: &FleetConfig,
    opts: RunOptions,
    host: Option<Host>,
) -> Result<FleetReport, FleetError> {
    let launched = Instant::now();
    // A taken API socket path fails the launch before any VM is built.
    if let Some(path) = &opts.api_socket {
        crate::http::check_socket_path(path).map_err(FleetError::ApiBind)?;
    }
    let kvm = Kvm::new().map_err(FleetError::Kvm)?;
    let cpuid = crate::vm::supported_cpuid(&kvm).map_err(|source| FleetError::Build {
        vm: "(all)".into(),
        source,
    })?;
    // One GPU arbiter (scheduler + backend + service thread) per physical
    // GPU that has a VM; a GPU without one starts its arbiter when the
    // operator adds the first VM placed on it.
    let hosted = host.is_some();
    let (gpus, served) = match host {
        Some(h) => (h.gpus, Some(h.vgpus)),
        None => (Arc::new(FleetGpus::new(cfg)), None),
    };
    // Stops the arbiters' threads on every return path, early ones
    // included (a daemon's arbiters are the daemon's to stop).
    let _arbiter_guard = (!hosted).then(|| ArbiterGuard(gpus.clone()));
    for g in &cfg.gpus {
        if cfg.vm.iter().any(|v| v.gpu && v.gpu_id == Some(g.id)) {
            gpus.start(cfg, g.id)?;
        }
    }
    // Each VM's GPU (`None`: no vGPU on this fleet's GPUs).
    let mut gpu_of: Vec<Option<u32>> = cfg.vm.iter().map(|v| v.gpu_id.filter(|_| v.gpu)).collect();
    for v in &cfg.vm {
        if let (Some(id), Some(why)) = (v.gpu_id.filter(|_| v.gpu), &v.placement) {
            log::info!("vm '{}': on gpu {id} ({why})", v.name);
        }
    }
    let mut vgpus: Vec<Option<VmId>> = vec![None; cfg.vm.len()];
    let mut attached: Vec<Option<VgpuAttachment>> = (0..cfg.vm.len()).map(|_| None).collect();
    // Build everything first: a VM that cannot be built aborts the launch
    // before any guest runs.
    let mut built = Vec::with_capacity(cfg.vm.len());
    for (id, vc) in cfg.vm.iter().enumerate() {
        // Building thousands of VMs takes a while: honour a signal now
        // rather than after every VM was built and started.
        if let Some(sig) = opts.stop.as_ref().and_then(|s| s.received()) {
            return Err(FleetError::Stopped(sig));
        }
        let (vm, att) = build_vm(&kvm, &cpuid, &gpus, cfg, vc, id, opts.echo)?;
        if let Some(a) = att {
            vgpus[id] = a.handle();
            attached[id] = Some(a);
        }
        built.push(vm);
    }

    let control = Arc::new(crate::api::FleetControl::new(gpus.clone(), cfg, &vgpus));
    if let Some(v) = served {
        control.set_vgpus(v);
    }
    let (cmd_tx, cmd_rx) = std::sync::mpsc::channel();
    let cmd_wake = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(FleetError::EventLoop)?);
    control.connect_fleet(cmd_tx, cmd_wake.clone());
    let _api = match &opts.api_socket {
        Some(path) => Some(
            crate::api::serve(path, opts.api_socket_mode.unwrap_or(0o600), control.clone())
                .map_err(FleetError::ApiBind)?,
        ),
        None => None,
    };
    // Dropped before `_api`: a second signal removes the socket until the
    // server does.
    let _socket_cleanup = opts
        .api_socket
        .as_deref()
        .map(crate::signals::SocketCleanup::register);
    let mut running = Vec::with_capacity(built.len());
    let mut done_fds = Vec::with_capacity(built.len());
    for (i, vm) in built.into_iter().enumerate() {
        let name = vm.spec_name().to_owned();
        let done = EventFd::new(EFD_NONBLOCK).map_err(FleetError::EventLoop)?;
        let done_clone = done.try_clone().map_err(FleetError::EventLoop)?;
        match vm.start(done_clone) {
            Ok(r) => {
                if let Some(Some(a)) = attached.get(i) {
                    a.bind_vm(&r);
                }
                running.push(Some(r))
            }
            Err(source) => {
                // Stop what already runs, then fail.
                for r in running.into_iter().flatten() {
                    let _ = r.stop("launch aborted");
                }
                return Err(FleetError::Build { vm: name, source });
            }
        }
        done_fds.push(done);
    }

    let stop_fd = match &opts.stop {
        Some(s) => Some(s.fd().try_clone().map_err(FleetError::EventLoop)?),
        None => None,
    };
    let mut monitor = FleetMonitor::new(
        done_fds,
        cfg.run.timeout_ms.map(Duration::from_millis),
        stop_fd,
    )?;
    monitor.commands = Some(cmd_wake.try_clone().map_err(FleetError::EventLoop)?);
    let mut reports: Vec<Option<VmReport>> = (0..running.len()).map(|_| None).collect();
    let mut vm_gpu: Vec<Option<scheduler::VmStats>> = vec![None; running.len()];
    let mut vgpu_io: Vec<Option<VgpuIoStats>> = vec![None; running.len()];
    let mut operator_stopped = vec![false; running.len()];
    let mut manager: EventManager<FleetMonitor> =
        EventManager::new().map_err(FleetError::EventManager)?;
    let mut id = manager.add_subscriber(monitor);
    loop {
        // Blocks in epoll_wait until a VM's eventfd or the timeout's timerfd fires.
        manager.run().map_err(FleetError::EventManager)?;
        let m = manager
            .subscriber_mut(id)
            .map_err(FleetError::EventManager)?;
        for i in m.take_finished() {
            if let Some(vm) = running[i].take() {
                vm_gpu[i] = detach_vgpu(gpus.of(gpu_of[i]), vgpus[i].take());
                let mut r = vm.stop("VM ended");
                control.ended(i, vm_end(&r, vm_gpu[i]));
                if i >= cfg.vm.len() {
                    compact_report(&mut r);
                }
                reports[i] = Some(r);
                if let Some(a) = attached[i].take() {
                    vgpu_io[i] = Some(a.detach());
                }
            }
        }
        if m.timed_out || m.stop_requested {
            break;
        }
        // Operator commands (stop one VM, add one).
        let mut new_done = Vec::new();
        while let Ok(cmd) = cmd_rx.try_recv() {
            match cmd {
                crate::api::FleetCommand::Stop { index, reply } => {
                    if let Some(vm) = running.get_mut(index).and_then(Option::take) {
                        let why = OPERATOR_STOP;
                        operator_stopped[index] = true;
                        vm.halt(why);
                        vm_gpu[index] = detach_vgpu(gpus.of(gpu_of[index]), vgpus[index].take());
                        let mut r = vm.stop(why);
                        control.ended(index, vm_end(&r, vm_gpu[index]));
                        if index >= cfg.vm.len() {
                            compact_report(&mut r);
                        }
                        reports[index] = Some(r);
                        if let Some(a) = attached[index].take() {
                            vgpu_io[index] = Some(a.detach());
                        }
                        log::info!(
                            "vm '{}': stopped by the operator",
                            reports[index].as_ref().map_or("?", |r| r.name.as_str())
                        );
                    }
                    let view = control.view_of(index).unwrap_or_default();
                    reply.send(crate::http::Response::json(200, &view));
                }
                crate::api::FleetCommand::Add {
                    index,
                    config,
                    reply,
                } => {
                    if index != running.len() {
                        log::error!("api: add of vm index {index} out of order");
                        control.failed(index, "host error: out of order".into());
                        reply.send(ApiError::Internal("add out of order".into()).into());
                        continue;
                    }
                    let on = config.gpu_id.filter(|_| config.gpu);
                    if let Some(id) = on.filter(|id| gpus.get(*id).is_none()) {
                        // The first VM on a GPU that had none.
                        match gpus.start(cfg, id) {
                            Ok(_) => {
                                log::info!("gpu {id}: arbiter started for vm '{}'", config.name)
                            }
                            Err(e) => log::warn!("api: vm '{}': {e}", config.name),
                        }
                    }
                    if let (Some(id), Some(why)) = (on, &config.placement) {
                        log::info!("vm '{}': on gpu {id} ({why})", config.name);
                    }
                    gpu_of.push(on);
                    let added = build_vm(&kvm, &cpuid, &gpus, cfg, &config, index, opts.echo)
                        .and_then(|(vm, att)| {
                            let done = EventFd::new(EFD_NONBLOCK).map_err(FleetError::EventLoop)?;
                            let done2 = done.try_clone().map_err(FleetError::EventLoop)?;
                            let h = att.as_ref().and_then(VgpuAttachment::handle);
                            match vm.start(done2) {
                                Ok(r) => {
                                    if let Some(a) = &att {
                                        a.bind_vm(&r);
                                    }
                                    Ok((r, att, h, done))
                                }
                                Err(source) => {
                                    if let Some(a) = att {
                                        detach_vgpu(gpus.of(on), a.handle());
                                        a.detach();
                                    }
                                    Err(FleetError::Build {
                                        vm: config.name.clone(),
                                        source,
                                    })
                                }
                            }
                        });
                    match added {
                        Ok((r, att, h, done)) => {
                            running.push(Some(r));
                            operator_stopped.push(false);
                            reports.push(None);
                            vm_gpu.push(None);
                            vgpu_io.push(None);
                            vgpus.push(h);
                            attached.push(att);
                            new_done.push(done);
                            control.started(index, h);
                            log::info!("vm '{}': added by the operator", config.name);
                            let view = control.view_of(index).unwrap_or_default();
                            reply.send(crate::http::Response::json(201, &view));
                        }
                        Err(e) => {
                            // Keep the vectors aligned with the API's list.
                            running.push(None);
                            operator_stopped.push(false);
                            reports.push(Some(VmReport {
                                name: config.name.clone(),
                                outcome: crate::vm::VmOutcome::HostError(e.to_string()),
                                started: Instant::now(),
                                entered: None,
                                first_line: None,
                                run_time: Duration::ZERO,
                                console: Vec::new(),
                                exits: 0,
                                checkpoints: Vec::new(),
                            }));
                            vm_gpu.push(None);
                            vgpu_io.push(None);
                            vgpus.push(None);
                            attached.push(None);
                            new_done
                                .push(EventFd::new(EFD_NONBLOCK).map_err(FleetError::EventLoop)?);
                            log::warn!("api: {e}");
                            control.failed(index, e.to_string());
                            reply.send(ApiError::Unprocessable(e.to_string()).into());
                        }
                    }
                }
            }
        }
        if !new_done.is_empty() {
            // Re-register the monitor with the new VMs' end eventfds.
            let mut m = manager
                .remove_subscriber(id)
                .map_err(FleetError::EventManager)?;
            m.done.extend(new_done.into_iter().map(Some));
            id = manager.add_subscriber(m);
        }
        if !hosted && running.iter().all(Option::is_none) {
            break;
        }
    }
    // No more operator commands: answer any still queued.
    control.disconnect_fleet();
    while let Ok(cmd) = cmd_rx.try_recv() {
        let reply = match cmd {
            crate::api::FleetCommand::Stop { reply, .. } => reply,
            crate::api::FleetCommand::Add { index, reply, .. } => {
                control.failed(index, "the fleet ended before it started".into());
                reply
            }
        };
        reply.send(ApiError::Unavailable("the fleet is ending".into()).into());
    }
    let (timed_out, stop_requested) = manager
        .subscriber_mut(id)
        .map(|m| (m.timed_out, m.stop_requested))
        .unwrap_or((false, false));
    drop(manager);
    let why = match (
        stop_requested,
        opts.stop.as_ref().and_then(|s| s.received()),
    ) {
        (true, Some(sig)) => crate::signals::name(sig),
        (true, None) => "stop requested".to_owned(),
        (false, _) => "run timeout".to_owned(),
    };
    // Record every remaining VM's outcome as stopped first, so that a guest
    // woken from a vGPU wait by the detach below cannot report that as its
    // own exit status.
    for vm in running.iter().flatten() {
        vm.halt(&why);
    }
    for (i, vm) in running.into_iter().enumerate() {
        if let Some(vm) = vm {
            // Release vCPUs blocked in a vGPU wait before joining them; the
            // detach returns the VM's GPU figures up to now.
            vm_gpu[i] = detach_vgpu(gpus.of(gpu_of[i]), vgpus[i].take());
            let r = vm.stop(&why);
            control.ended(i, vm_end(&r, vm_gpu[i]));
            reports[i] = Some(r);
            if let Some(a) = attached[i].take() {
                a.detach();
            }
        }
    }
    let mut per_gpu = Vec::new();
    for (id, m) in gpus.started() {
        let s = m.stats();
        log::info!(
            "gpu {id}: {} packets completed, {} maps, {} preemptions",
            s.completions,
            s.maps,
            s.preemptions
        );
        if !hosted {
            m.shutdown();
        }
        per_gpu.push((id, s));
    }
    let gpu = sum_stats(per_gpu.iter().map(|(_, s)| s));
    Ok(FleetReport {
        launched,
        vms: reports
            .into_iter()
            .map(|r| r.expect("every VM reported"))
            .collect(),
        timed_out,
        stop_requested,
        gpu,
        gpus: per_gpu,
        vm_gpu_id: gpu_of,
        vm_gpu,
        vgpu_io,
        operator_stopped,
    })
}

/// The outcome's reason of a VM stopped through the API
/// (`stopped: by the operator`).
pub const OPERATOR_STOP: &str = "by the operator";

/// Console lines kept in the run's report of an ended VM that was added
/// through the API (its last lines, with the guest's verdict).
pub const ADDED_VM_CONSOLE_TAIL: usize = 32;

/// Checkpoints kept in the run's report of an ended VM that was added
/// through the API (its last ones).
pub const ADDED_VM_CHECKPOINTS: usize = 256;

/// Shrinks the report of an ended VM added through the API to a compact
/// summary (a fleet that launches VMs continuously keeps every VM's outcome
/// and times, not every VM's whole console): the last
/// [`ADDED_VM_CONSOLE_TAIL`] console lines, preceded by a line saying how
/// many were dropped, and the last [`ADDED_VM_CHECKPOINTS`] checkpoints.
pub fn compact_report(r: &mut VmReport) {
    if r.console.len() > ADDED_VM_CONSOLE_TAIL {
        let dropped = r.console.len() - ADDED_VM_CONSOLE_TAIL;
        r.console.drain(..dropped);
        r.console.insert(
            0,
            format!(
                "[hqdmux: {dropped} earlier console lines not kept (VM added through the API)]"
            ),
        );
    }
    r.console.shrink_to_fit();
    if r.checkpoints.len() > ADDED_VM_CHECKPOINTS {
        let dropped = r.checkpoints.len() - ADDED_VM_CHECKPOINTS;
        r.checkpoints.drain(..dropped);
    }
    r.checkpoints.shrink_to_fit();
}

/// How a VM ended, for the API.
fn vm_end(r: &VmReport, gpu: Option<scheduler::VmStats>) -> crate::api::VmEnd {
    crate::api::VmEnd {
        stopped: matches!(r.outcome, crate::vm::VmOutcome::Stopped(_)),
        outcome: r.outcome.to_string(),
        exit_status: match r.outcome {
            crate::vm::VmOutcome::Exited(s) => Some(s),
            _ => None,
        },
        gpu,
    }
}

/// Builds one VM of the fleet (its image, KVM VM and, with `gpu = true`,
/// its vGPU on the arbiter): the same path for config VMs and VMs added
/// through the API.
fn build_vm(
    kvm: &Kvm,
    cpuid: &kvm_bindings::CpuId,
    gpus: &FleetGpus,
    cfg: &FleetConfig,
    vc: &VmConfig,
    id: usize,
    echo: bool,
) -> Result<(Vm, Option<VgpuAttachment>), FleetError> {
    let elf: Arc<[u8]> = match vc.image_source(&cfg.base_dir) {
        ImageSource::Builtin(name) => images::builtin(&name)
            .ok_or_else(|| FleetError::Image {
                vm: vc.name.clone(),
                path: format!("builtin:{name}"),
                source: std::io::ErrorKind::NotFound.into(),
            })?
            .into(),
        // Bounded and non-blocking, as `check` reads it.
        ImageSource::File(path) => crate::config::read_image_file(&path, vc.memory_mib << 20)
            .map_err(|e| FleetError::Image {
                vm: vc.name.clone(),
                path: path.display().to_string(),
                source: std::io::Error::other(e),
            })?
            .into(),
    };
    let spec = VmSpec {
        id: id as u32,
        name: vc.name.clone(),
        elf,
        mem_bytes: vc.memory_mib << 20,
        vcpus: vc.vcpus,
        args: vc.args.clone(),
        echo,
        extra_devices: Vec::new(),
    };
    let vm = Vm::create(kvm, cpuid, spec).map_err(|source| FleetError::Build {
        vm: vc.name.clone(),
        source,
    })?;
    let arbiter = gpus.of(vc.gpu_id.filter(|_| vc.gpu));
    let att = match (vc.gpu, arbiter) {
        _ if vc.gpu_socket.is_some() => Some(attach_remote_vgpu(
            &vm,
            vc,
            &cfg.base_dir
                .join(vc.gpu_socket.as_deref().unwrap_or(std::path::Path::new(""))),
        )?),
        (true, Some(m)) => Some(attach_vgpu(m, &vm, cfg, vc)?),
        (true, None) => {
            return Err(FleetError::Vgpu {
                vm: vc.name.clone(),
                source: GpuError::NoArbiter,
            })
        }
        _ => None,
    };
    Ok((vm, att))
}

/// The backend the `[gpu]` section asks for (`backend = "sim"`): where the
/// process picks its GPU (the mediation only knows the `PhysGpu` contract).
pub fn open_backend(
    gpu: &crate::config::GpuConfig,
    seed: u64,
) -> Result<Box<dyn gpu::backend::PhysGpu + Send>, gpu::topology::TopologyError> {
    match gpu.backend {
        crate::config::Backend::Sim => gpusim::realtime_backend(&gpu.topology, &gpu.sim, seed),
    }
}

/// Starts an arbiter for the fleet's first GPU (`[gpu]`) with the backend
/// it asks for.
pub fn start_arbiter(cfg: &FleetConfig) -> Result<Arc<GpuArbiter>, FleetError> {
    start_gpu_arbiter(cfg.first_gpu(), &cfg.scheduler)
}

/// Starts one GPU's arbiter (its backend, scheduler and service thread).
/// The simulator's seed is the GPU's id, so two simulated GPUs differ.
pub fn start_gpu_arbiter(
    g: &crate::config::GpuConfig,
    sched: &scheduler::SchedConfig,
) -> Result<Arc<GpuArbiter>, FleetError> {
    let backend =
        open_backend(g, 1 + u64::from(g.id)).map_err(|e| FleetError::Gpu(GpuError::Backend(e)))?;
    GpuArbiter::start(g.topology.clone(), sched.clone(), backend)
        .map_err(|e| FleetError::Gpu(GpuError::Arbiter(e)))
}

/// The fleet's physical GPUs: one arbiter (scheduler, backend, service
/// thread) per `[[gpu]]` entry, started for the first VM placed on it and
/// never replaced. Shared by the fleet loop and the API; a VM's queues only
/// ever reach its own GPU's arbiter.
pub struct FleetGpus {
    ids: Vec<u32>,
    arbiters: Vec<std::sync::OnceLock<Arc<GpuArbiter>>>,
}

impl FleetGpus {
    /// `cfg`'s GPUs, none started.
    pub fn new(cfg: &FleetConfig) -> Self {
        let ids: Vec<u32> = cfg.gpus.iter().map(|g| g.id).collect();
        FleetGpus {
            arbiters: ids.iter().map(|_| Default::default()).collect(),
            ids,
        }
    }

    /// One GPU `id` with its arbiter `m` already started (`hqdmux serve`,
    /// tests).
    pub fn single(id: u32, m: Arc<GpuArbiter>) -> Self {
        let cell = std::sync::OnceLock::new();
        let _ = cell.set(m);
        FleetGpus {
            ids: vec![id],
            arbiters: vec![cell],
        }
    }

    /// Starts GPU `id`'s arbiter (its entry in `cfg`) unless it runs.
    pub fn start(&self, cfg: &FleetConfig, id: u32) -> Result<Arc<GpuArbiter>, FleetError> {
        let (i, g) = self
            .ids
            .iter()
            .position(|&x| x == id)
            .zip(cfg.gpu(id))
            .ok_or(FleetError::Gpu(GpuError::NoArbiter))?;
        if let Some(m) = self.arbiters[i].get() {
            return Ok(m.clone());
        }
        let m = start_gpu_arbiter(g, &cfg.scheduler)?;
        match self.arbiters[i].set(m.clone()) {
            Ok(()) => Ok(m),
            Err(_) => {
                m.shutdown();
                Ok(self.arbiters[i].get().cloned().expect("set"))
            }
        }
    }

    /// GPU `id`'s arbiter, if started.
    pub fn get(&self, id: u32) -> Option<&Arc<GpuArbiter>> {
        let i = self.ids.iter().position(|&x| x == id)?;
        self.arbiters[i].get()
    }

    /// The arbiter of a VM on GPU `id` (`None`: no GPU, or not started).
    pub fn of(&self, id: Option<u32>) -> Option<&Arc<GpuArbiter>> {
        id.and_then(|id| self.get(id))
    }

    /// Every started arbiter with its GPU id, in file order.
    pub fn started(&self) -> impl Iterator<Item = (u32, &Arc<GpuArbiter>)> {
        self.ids
            .iter()
            .zip(&self.arbiters)
            .filter_map(|(id, a)| a.get().map(|m| (*id, m)))
    }

    /// Every GPU id, in file order.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

/// The fleet's counters: the sum over its GPUs (`None` without any).
pub(crate) fn sum_stats<'a>(it: impl Iterator<Item = &'a ArbiterStats>) -> Option<ArbiterStats> {
    let mut total: Option<ArbiterStats> = None;
    for s in it {
        let t = total.get_or_insert_with(ArbiterStats::default);
        t.completions += s.completions;
        t.preemptions += s.preemptions;
        t.maps += s.maps;
        t.stale_doorbells += s.stale_doorbells;
        t.quarantined_vms += s.quarantined_vms;
        t.guard_quarantines += s.guard_quarantines;
        t.preempt_timeouts += s.preempt_timeouts;
        t.armed_preemptions += s.armed_preemptions;
        t.armed_mismatched += s.armed_mismatched;
    }
    total
}

/// Shuts every started arbiter down when dropped (`GpuArbiter::shutdown`
/// is idempotent).
struct ArbiterGuard(Arc<FleetGpus>);

impl Drop for ArbiterGuard {
    fn drop(&mut self) {
        for (_, m) in self.0.started() {
            m.shutdown();
        }
    }
}

/// A VM's vGPU: its PCI function (BARs, ioeventfds, MSI-X) on the
/// fleet's arbiter, or on a vGPU server's socket.
pub struct VgpuAttachment {
    pci: Arc<VgpuPci>,
    handle: Option<VmId>,
    remote: Option<Arc<crate::devices::vfio_client::VfioBackend>>,
}

impl VgpuAttachment {
    /// The fleet arbiter's handle of the VM (`None` for a vGPU served by
    /// another process).
    pub fn handle(&self) -> Option<VmId> {
        self.handle
    }

    /// Ends `vm` with [`crate::vm::VmOutcome::DeviceLost`] should its
    /// vGPU's server go away (a vGPU served over vfio-user; nothing for an
    /// in-process one, which lives as long as the fleet).
    pub fn bind_vm(&self, vm: &crate::vm::RunningVm) {
        if let Some(r) = &self.remote {
            r.bind_vm(vm.ender());
        }
    }

    /// The vfio-user backend of a vGPU served by another process.
    pub fn remote(&self) -> Option<&Arc<crate::devices::vfio_client::VfioBackend>> {
        self.remote.as_ref()
    }

    /// Takes the BARs off the bus and the ioeventfds out of KVM (after the
    /// VM's vCPUs stopped), closes a vfio-user connection (the server then
    /// releases the vGPU's queues); returns the device counters.
    pub fn detach(self) -> VgpuIoStats {
        self.pci.detach();
        if let Some(r) = &self.remote {
            r.close();
        }
        VgpuIoStats {
            msix: self.pci.msix().stats(),
            refused: self.pci.bad_accesses(),
            refused_unlogged: self.pci.flush_log(),
        }
    }
}

/// Registers a built VM with the arbiter and puts its vGPU on PCI bus 0:
/// MSI-X through KVM irqfds (the VM's `Msix` is the front end's interrupt
/// sink), doorbells through KVM ioeventfds on the front end's eventfds
/// (registered once the guest assigns BAR2 and enables decoding).
pub fn attach_vgpu(
    m: &Arc<GpuArbiter>,
    vm: &Vm,
    cfg: &FleetConfig,
    vc: &VmConfig,
) -> Result<VgpuAttachment, FleetError> {
    let err = |e: GpuError| FleetError::Vgpu {
        vm: vc.name.clone(),
        source: e,
    };
    let mem: Arc<dyn DmaMemory> = Arc::new(vm.guest_memory().as_ref().clone());
    let params = VmParams {
        priority: vc.priority,
        weight: vc.weight,
        partition: vc.partition,
    };
    let target = KvmMsi::new(vm.vm_fd().clone(), abi::vgpu::NUM_VECTORS, &vc.name)
        .map_err(|e| err(e.into()))?;
    let msix = Arc::new(Msix::new(abi::vgpu::NUM_VECTORS, Arc::new(target)));
    let (handle, fe) = m
        .add_vm(&vc.name, mem, params, msix.clone())
        .map_err(|e| err(e.into()))?;
    m.set_preempt_timeout(
        handle,
        std::time::Duration::from_millis(vc.preempt_timeout_ms),
    )
    .map_err(|e| err(e.into()))?;
    let gpu = vc
        .gpu_id
        .and_then(|id| cfg.gpu(id))
        .unwrap_or(cfg.first_gpu());
    m.set_guard(handle, gpu.guard.with(&vc.guard))
        .map_err(|e| err(e.into()))?;
    let pci = Arc::new(VgpuPci::new(
        &vc.name,
        fe,
        msix,
        vm.mmio_bus(),
        vm.vm_fd().clone(),
    ));
    vm.pci()
        .add(abi::pci::VGPU_DEVICE, pci.clone())
        .map_err(|e| err(e.into()))?;
    Ok(VgpuAttachment {
        pci,
        handle: Some(handle),
        remote: None,
    })
}

impl Drop for VgpuAttachment {
    /// A remote vGPU's connection and relay thread end with the attachment
    /// even when it is never detached (a launch aborted after it was built).
    fn drop(&mut self) {
        if let Some(r) = &self.remote {
            r.close();
        }
    }
}

/// Puts on PCI bus 0 a vGPU that `hqdmux serve` (or any vfio-user server
/// of this device) serves on `socket`: the same PCI function as
/// [`attach_vgpu`]'s, whose registers and doorbells go over the socket
/// ([`crate::devices::vfio_client`]).
pub fn attach_remote_vgpu(
    vm: &Vm,
    vc: &VmConfig,
    socket: &std::path::Path,
) -> Result<VgpuAttachment, FleetError> {
    let err = |e: GpuError| FleetError::Vgpu {
        vm: vc.name.clone(),
        source: e,
    };
    let target = KvmMsi::new(vm.vm_fd().clone(), abi::vgpu::NUM_VECTORS, &vc.name)
        .map_err(|e| err(e.into()))?;
    let msix = Arc::new(Msix::new(abi::vgpu::NUM_VECTORS, Arc::new(target)));
    let remote = crate::devices::vfio_client::VfioBackend::connect(
        &vc.name,
        socket,
        &vm.guest_memory(),
        msix.clone(),
    )
    .map_err(|e| err(e.into()))?;
    let pci = Arc::new(VgpuPci::new(
        &vc.name,
        remote.clone(),
        msix,
        vm.mmio_bus(),
        vm.vm_fd().clone(),
    ));
    if let Err(e) = vm.pci().add(abi::pci::VGPU_DEVICE, pci.clone()) {
        remote.close();
        return Err(err(e.into()));
    }
    Ok(VgpuAttachment {
        pci,
        handle: None,
        remote: Some(remote),
    })
}

/// Removes a VM's vGPU from its GPU's arbiter; returns its final GPU accounting.
fn detach_vgpu(m: Option<&Arc<GpuArbiter>>, h: Option<VmId>) -> Option<scheduler::VmStats> {
    let (m, h) = (m?, h?);
    let stats = m.vm_status(h).map(|(_, s)| s);
    m.remove_vm(h);
    stats
}

/// Event-loop subscriber: one eventfd per VM (signalled when it ends), the
/// run timeout's timerfd and the stop eventfd (SIGINT/SIGTERM).
struct FleetMonitor {
    /// Each VM's end eventfd; closed (`None`) once it fired, so a fleet
    /// that keeps adding VMs does not keep one fd per ended VM (soak: 2640
    /// open fds after 2602 VMs, issue 11).
    done: Vec<Option<EventFd>>,
    timer: Option<TimerFd>,
    stop: Option<EventFd>,
    /// Written by the API when it queued a [`crate::api::FleetCommand`].
    commands: Option<EventFd>,
    finished: Vec<usize>,
    timed_out: bool,
    stop_requested: bool,
}

const TIMER_TOKEN: u32 = u32::MAX;
const STOP_TOKEN: u32 = u32::MAX - 1;
const COMMAND_TOKEN: u32 = u32::MAX - 2;

impl FleetMonitor {
    fn new(
        done: Vec<EventFd>,
        timeout: Option<Duration>,
        stop: Option<EventFd>,
    ) -> Result<Self, FleetError> {
        let timer = match timeout {
            Some(t) => {
                let io = |e: vmm_sys_util::errno::Error| {
                    FleetError::EventLoop(std::io::Error::from_raw_os_error(e.errno()))
                };
                let mut fd = TimerFd::new().map_err(io)?;
                fd.reset(t, None).map_err(io)?;
                Some(fd)
            }
            None => None,
        };
        Ok(Self {
            done: done.into_iter().map(Some).collect(),
            timer,
            stop,
            commands: None,
            finished: Vec::new(),
            timed_out: false,
            stop_requested: false,
        })
    }

    fn take_finished(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.finished)
    }
}

impl MutEventSubscriber for FleetMonitor {
    fn init(&mut self, ops: &mut EventOps) {
        for (i, fd) in self.done.iter().enumerate() {
            let Some(fd) = fd else { continue };
            if let Err(e) = ops.add(Events::with_data(fd, i as u32, EventSet::IN)) {
                log::error!("event loop: cannot watch VM {i}: {e:?}");
            }
        }
        if let Some(t) = &self.timer {
            if let Err(e) = ops.add(Events::with_data(t, TIMER_TOKEN, EventSet::IN)) {
                log::error!("event loop: cannot watch the run timer: {e:?}");
            }
        }
        if let Some(s) = &self.stop {
            if let Err(e) = ops.add(Events::with_data(s, STOP_TOKEN, EventSet::IN)) {
                log::error!("event loop: cannot watch the stop signal: {e:?}");
            }
        }
        if let Some(c) = &self.commands {
            if let Err(e) = ops.add(Events::with_data(c, COMMAND_TOKEN, EventSet::IN)) {
                log::error!("event loop: cannot watch the API commands: {e:?}");
            }
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let token = events.data();
        if token == TIMER_TOKEN {
            self.timed_out = true;
            if let Some(t) = self.timer.as_mut() {
                let _ = t.wait();
                let _ = ops.remove(Events::with_data(&*t, TIMER_TOKEN, EventSet::IN));
            }
            return;
        }
        if token == COMMAND_TOKEN {
            // The loop drains the command channel after every wake-up.
            if let Some(c) = &self.commands {
                let _ = c.read();
            }
            return;
        }
        if token == STOP_TOKEN {
            self.stop_requested = true;
            if let Some(s) = &self.stop {
                let _ = s.read();
                let _ = ops.remove(Events::with_data(s, STOP_TOKEN, EventSet::IN));
            }
            return;
        }
        if let Some(fd) = self.done.get_mut(token as usize).and_then(Option::take) {
            let _ = fd.read();
            let _ = ops.remove(Events::with_data(&fd, token, EventSet::IN));
            self.finished.push(token as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the monitor's event loop once and returns it.
    fn dispatch(monitor: FleetMonitor) -> FleetMonitor {
        let mut manager: EventManager<FleetMonitor> = EventManager::new().unwrap();
        let id = manager.add_subscriber(monitor);
        manager.run().unwrap();
        manager.remove_subscriber(id).unwrap()
    }

    #[test]
    fn the_stop_eventfd_ends_the_wait_like_the_timer_and_names_no_vm() {
        let done = vec![
            EventFd::new(EFD_NONBLOCK).unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        ];
        let stop = EventFd::new(EFD_NONBLOCK).unwrap();
        stop.write(1).unwrap();
        let m = dispatch(FleetMonitor::new(done, None, Some(stop)).unwrap());
        assert!(m.stop_requested && !m.timed_out);
        assert!(m.finished.is_empty(), "no VM ended");
        // A VM ending is still told apart from a stop.
        let done = vec![
            EventFd::new(EFD_NONBLOCK).unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        ];
        done[1].write(1).unwrap();
        let stop = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut m = dispatch(FleetMonitor::new(done, None, Some(stop)).unwrap());
        assert!(!m.stop_requested);
        assert_eq!(m.take_finished(), vec![1]);
    }

    #[test]
    fn a_compact_report_keeps_the_last_lines_and_checkpoints_and_says_what_it_dropped() {
        let t = Instant::now();
        let mut r = VmReport {
            name: "v".into(),
            outcome: crate::vm::VmOutcome::Exited(0),
            started: t,
            entered: None,
            first_line: None,
            run_time: Duration::ZERO,
            console: (0..100).map(|i| format!("line {i}")).collect(),
            exits: 0,
            checkpoints: (0..1000u32).map(|i| (2 + i % 2, t)).collect(),
        };
        compact_report(&mut r);
        assert_eq!(r.console.len(), ADDED_VM_CONSOLE_TAIL + 1);
        assert!(
            r.console[0].contains("68 earlier console lines"),
            "{:?}",
            r.console[0]
        );
        assert_eq!(r.console[1], "line 68");
        assert_eq!(r.console.last().unwrap(), "line 99");
        assert_eq!(r.checkpoints.len(), ADDED_VM_CHECKPOINTS);
        assert_eq!(r.spans(2, 3).len(), ADDED_VM_CHECKPOINTS / 2);
        // A short report is left as it is.
        let mut short = VmReport {
            console: vec!["gpu: ok".into()],
            checkpoints: vec![(2, t), (3, t)],
            ..r
        };
        compact_report(&mut short);
        assert_eq!(short.console, vec!["gpu: ok".to_string()]);
        assert_eq!(short.checkpoints.len(), 2);
    }
}
