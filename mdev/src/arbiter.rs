//! The GPU arbiter: one per fleet. It owns the scheduler <-> GPU
//! [`Binding`] and the physical backend (`Box<dyn PhysGpu + Send>`), and runs
//! one service thread:
//!
//! * an epoll loop over every VM's doorbell eventfds (KVM ioeventfds: a
//!   doorbell never exits to userspace), a timerfd armed for the earlier of
//!   the scheduler's timer and the backend's next deadline, and a control
//!   eventfd paired with a channel of front-end requests (load, dequeue);
//! * on a doorbell: read the write index from the queue's poll address in
//!   guest memory and feed the binding;
//! * binding notices go back to the VM's [`VgpuFrontEnd`]: completion
//!   mailboxes and vectors, errors, unloads with the MQD write-back.
//!
//! Front ends never call the GPU on a vCPU thread. Control calls from the
//! VMM (priority, weight, policy, add/remove VM) take the arbiter's lock
//! briefly and kick the service thread so it re-plans its timer.
//!
//! Per-VM handling runs under `catch_unwind`: a host bug while serving one
//! VM quarantines that VM's vGPU (its queues are removed), not the others.
//! Locks are recovered, never propagated as poison.

use crate::backend::{GpuEvent, PhysGpu};
use crate::binding::{Binding, Notice};
use crate::mem::DmaMemory;
use crate::topology::{GpuTopology, TopologyError};
use crate::vgpu::{InterruptSink, RequestSink, VgpuFrontEnd, VgpuHandle, VgpuRequest};
use abi::mqd::V9Mqd;
use abi::vgpu::{error, NUM_VHQD};
use scheduler::{Nanos, Policy, QueueId, SchedConfig, SchedError, VmId, VmParams};
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

/// Simulated-GPU events processed per service-loop turn in real time (about
/// 0.5 ms of host time at ~120 ns per workgroup): a guest that floods the
/// model with tiny workgroups makes it lag wall time but cannot keep the
/// service thread from other VMs' doorbells.
pub const REALTIME_EVENT_BUDGET: usize = 4096;

/// The backend the `[gpu]` section asks for (`backend = "sim"`).
pub fn open_backend(
    topo: &GpuTopology,
    seed: u64,
) -> Result<Box<dyn PhysGpu + Send>, TopologyError> {
    match topo.backend {
        crate::topology::Backend::Sim => {
            let mut g = crate::sim::SimGpu::new(topo.clone(), seed)?;
            g.set_event_budget(Some(REALTIME_EVENT_BUDGET));
            Ok(Box::new(g))
        }
    }
}

/// Arbiter errors.
#[derive(Debug, thiserror::Error)]
pub enum ArbiterError {
    /// Invalid topology.
    #[error("gpu: {0}")]
    Topology(#[from] TopologyError),
    /// Scheduler refused.
    #[error("scheduler: {0}")]
    Sched(#[from] SchedError),
    /// epoll / eventfd / timerfd / thread set-up failed.
    #[error("arbiter I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The arbiter was shut down.
    #[error("arbiter is shut down")]
    Stopped,
    /// A preemption timeout outside [`PREEMPT_TIMEOUT_MS_RANGE`].
    #[error(
        "preemption timeout {0:?} is out of range {lo}..={hi} ms",
        lo = PREEMPT_TIMEOUT_MS_RANGE.start(),
        hi = PREEMPT_TIMEOUT_MS_RANGE.end()
    )]
    PreemptTimeout(Duration),
}

/// Default per-VM preemption timeout (ms), as KFD's `queue_preemption_timeout_ms`.
pub const DEFAULT_PREEMPT_TIMEOUT_MS: u64 = 9000;
/// Accepted per-VM preemption timeouts (ms): 1 ms to 1 hour.
pub const PREEMPT_TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 1..=3_600_000;

/// Counters of an arbiter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArbiterStats {
    /// Packets completed on the GPU for any VM.
    pub completions: u64,
    /// Scheduler preemptions.
    pub preemptions: u64,
    /// Scheduler maps.
    pub maps: u64,
    /// Doorbells that did not move the write pointer (no scheduler decision).
    pub stale_doorbells: u64,
    /// VMs quarantined after a host bug while serving them.
    pub quarantined_vms: u64,
}

/// What a [`DoorbellObserver`] is told after each doorbell the service thread handled.
#[derive(Clone, Copy, Debug)]
pub struct DoorbellSeen {
    /// VM.
    pub vm: VgpuHandle,
    /// vHQD.
    pub vhqd: usize,
    /// When the binding returned (every map/unmap it decided was handed to the backend).
    pub at: Instant,
    /// The scheduler issued at least one preemption for this doorbell.
    pub preempted: bool,
}

/// Benchmark hook called on the service thread (none in production).
pub type DoorbellObserver = Arc<dyn Fn(DoorbellSeen) + Send + Sync>;

/// Owner of a binding queue: (VM index, vHQD).
type Owner = (u32, u8);

const TOKEN_CONTROL: u64 = u64::MAX;
const TOKEN_TIMER: u64 = u64::MAX - 1;

fn token(vm: u32, vhqd: usize) -> u64 {
    (u64::from(vm) << 8) | vhqd as u64
}

struct VmSlot {
    fe: Arc<VgpuFrontEnd>,
    mem: Arc<dyn DmaMemory>,
    queue: [Option<QueueId>; NUM_VHQD],
    mqd_addr: [u64; NUM_VHQD],
    wptr_poll: [u64; NUM_VHQD],
    removed: bool,
}

struct Core {
    bind: Binding<Owner>,
    gpu: Box<dyn PhysGpu + Send>,
    vms: Vec<VmSlot>,
    next_qid: u64,
    timer_at: Option<Nanos>,
    quarantined: u64,
    observer: Option<DoorbellObserver>,
    stopping: bool,
}

struct Requests {
    tx: Mutex<Sender<(VgpuHandle, VgpuRequest)>>,
    kick: EventFd,
}

impl RequestSink for Requests {
    fn send(&self, vm: VgpuHandle, req: VgpuRequest) {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if tx.send((vm, req)).is_ok() {
            let _ = self.kick.write(1);
        }
    }
}

/// One GPU arbiter per fleet. Create with [`GpuArbiter::start`]; stop with
/// [`GpuArbiter::shutdown`] (the service thread holds a reference, so
/// dropping the last handle does not stop it).
pub struct GpuArbiter {
    topo: GpuTopology,
    core: Mutex<Core>,
    /// Notified when a VM's queues are all gone.
    cv: Condvar,
    requests: Arc<Requests>,
    epoll: Epoll,
    thread: Mutex<Option<JoinHandle<()>>>,
    epoch: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GpuArbiter {
    /// Starts the arbiter and its service thread over `backend`.
    pub fn start(
        topo: GpuTopology,
        cfg: SchedConfig,
        backend: Box<dyn PhysGpu + Send>,
    ) -> Result<Arc<Self>, ArbiterError> {
        topo.validate()?;
        let bind = Binding::new(&topo, cfg)?;
        let (tx, rx) = channel();
        let requests = Arc::new(Requests {
            tx: Mutex::new(tx),
            kick: EventFd::new(EFD_NONBLOCK)?,
        });
        let epoll = Epoll::new()?;
        epoll.ctl(
            ControlOperation::Add,
            requests.kick.as_raw_fd(),
            EpollEvent::new(EventSet::IN, TOKEN_CONTROL),
        )?;
        let timer = TimerFd::new().map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        epoll.ctl(
            ControlOperation::Add,
            timer.as_raw_fd(),
            EpollEvent::new(EventSet::IN, TOKEN_TIMER),
        )?;
        let a = Arc::new(GpuArbiter {
            topo,
            core: Mutex::new(Core {
                bind,
                gpu: backend,
                vms: Vec::new(),
                next_qid: 0,
                timer_at: None,
                quarantined: 0,
                observer: None,
                stopping: false,
            }),
            cv: Condvar::new(),
            requests,
            epoll,
            thread: Mutex::new(None),
            epoch: Instant::now(),
        });
        let me = a.clone();
        let t = std::thread::Builder::new()
            .name("hqdmux-arbiter".into())
            .spawn(move || me.service(rx, timer))?;
        *lock(&a.thread) = Some(t);
        Ok(a)
    }

    /// Stops the service thread (VMs should be removed first). Idempotent.
    pub fn shutdown(&self) {
        lock(&self.core).stopping = true;
        let _ = self.requests.kick.write(1);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }

    /// The topology.
    pub fn topology(&self) -> &GpuTopology {
        &self.topo
    }

    /// Model time now (ns since start).
    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Counters.
    pub fn stats(&self) -> ArbiterStats {
        let c = lock(&self.core);
        let s = c.bind.scheduler().stats();
        ArbiterStats {
            completions: c.bind.stats().completions,
            preemptions: s.preemptions,
            maps: s.maps,
            stale_doorbells: s.stale_doorbells,
            quarantined_vms: c.quarantined,
        }
    }

    /// Sets (or clears) the doorbell benchmark hook.
    pub fn set_doorbell_observer(&self, obs: Option<DoorbellObserver>) {
        lock(&self.core).observer = obs;
    }

    /// Registers a VM: its memory, scheduling parameters and interrupt sink.
    /// Returns its handle and its front end (registers, doorbell eventfds).
    pub fn add_vm(
        &self,
        name: &str,
        mem: Arc<dyn DmaMemory>,
        params: VmParams,
        irq: Arc<dyn InterruptSink>,
    ) -> Result<(VgpuHandle, Arc<VgpuFrontEnd>), ArbiterError> {
        let mut c = lock(&self.core);
        if c.stopping {
            return Err(ArbiterError::Stopped);
        }
        let idx = c.vms.len() as u32;
        let h = VgpuHandle(idx);
        let fe = Arc::new(VgpuFrontEnd::new(
            h,
            name,
            &self.topo,
            mem.clone(),
            irq,
            self.requests.clone(),
        )?);
        for i in 0..NUM_VHQD {
            self.epoll.ctl(
                ControlOperation::Add,
                fe.doorbell_eventfd(i).as_raw_fd(),
                EpollEvent::new(EventSet::IN, token(idx, i)),
            )?;
        }
        c.bind.add_vm(VmId(idx), params)?;
        c.vms.push(VmSlot {
            fe: fe.clone(),
            mem,
            queue: [None; NUM_VHQD],
            mqd_addr: [0; NUM_VHQD],
            wptr_poll: [0; NUM_VHQD],
            removed: false,
        });
        Ok((h, fe))
    }

    /// Unregisters a VM: its queues are reset-unmapped; returns when no slot
    /// holds one of them any more (or after 5 s).
    pub fn remove_vm(&self, vm: VgpuHandle) {
        let mut c = lock(&self.core);
        let v = vm.0 as usize;
        if c.vms.get(v).is_none_or(|e| e.removed) {
            return;
        }
        c.vms[v].removed = true;
        for i in 0..NUM_VHQD {
            let fd = c.vms[v].fe.doorbell_eventfd(i).as_raw_fd();
            let _ = self
                .epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
        let now = self.now();
        let core = &mut *c;
        let mut out = Vec::new();
        let _ = core
            .bind
            .remove_vm(core.gpu.as_mut(), now, VmId(vm.0), &mut out);
        self.deliver(core, out);
        drop(c);
        let _ = self.requests.kick.write(1);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut c = lock(&self.core);
        while c.vms[v].queue.iter().any(|q| q.is_some()) && Instant::now() < deadline {
            c = self
                .cv
                .wait_timeout(c, Duration::from_millis(20))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn control(
        &self,
        f: impl FnOnce(&mut Binding<Owner>) -> Result<(), SchedError>,
    ) -> Result<(), SchedError> {
        let mut c = lock(&self.core);
        f(&mut c.bind)?;
        let now = self.now();
        let core = &mut *c;
        let mut out = Vec::new();
        core.bind.tick(core.gpu.as_mut(), now, &mut out);
        self.deliver(core, out);
        drop(c);
        let _ = self.requests.kick.write(1);
        Ok(())
    }

    /// Changes a VM's priority live (applies at once).
    pub fn set_priority(&self, vm: VgpuHandle, priority: u8) -> Result<(), SchedError> {
        self.control(|b| b.scheduler_mut().set_vm_priority(VmId(vm.0), priority))
    }

    /// Changes a VM's weight live (applies at once).
    pub fn set_weight(&self, vm: VgpuHandle, weight: u32) -> Result<(), SchedError> {
        self.control(|b| b.scheduler_mut().set_vm_weight(VmId(vm.0), weight))
    }

    /// Changes the scheduling policy live (applies at once; mapped queues
    /// stay mapped until the new policy decides otherwise).
    pub fn set_policy(&self, policy: Policy) {
        let _ = self.control(|b| {
            b.scheduler_mut().set_policy(policy);
            Ok(())
        });
    }

    /// The current scheduling policy.
    pub fn policy(&self) -> Policy {
        lock(&self.core).bind.scheduler().config().policy
    }

    /// A VM's current parameters and accounting (`None` once removed).
    pub fn vm_status(&self, vm: VgpuHandle) -> Option<(VmParams, scheduler::VmStats)> {
        let mut c = lock(&self.core);
        c.vms.get(vm.0 as usize).filter(|e| !e.removed)?;
        // Bring the scheduler's clock to now: GPU time then includes the
        // time a queue has been running since the last event (a long kernel
        // otherwise reads as 0 until it completes).
        let now = self.now();
        let core = &mut *c;
        let mut out = Vec::new();
        core.bind.tick(core.gpu.as_mut(), now, &mut out);
        self.deliver(core, out);
        let id = VmId(vm.0);
        let s = c.bind.scheduler();
        let r = (s.vm_params(id)?, s.vm_stats(id)?);
        drop(c);
        // The tick may have re-armed the scheduler timer.
        let _ = self.requests.kick.write(1);
        Some(r)
    }

    // ---- service thread ------------------------------------------------

    fn service(self: Arc<Self>, rx: Receiver<(VgpuHandle, VgpuRequest)>, mut timer: TimerFd) {
        let mut events = vec![EpollEvent::default(); 64];
        let mut gpu_events = Vec::new();
        loop {
            let n = match self.epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::error!("arbiter: epoll_wait: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let mut c = lock(&self.core);
            if c.stopping {
                return;
            }
            for ev in &events[..n] {
                match ev.data() {
                    TOKEN_CONTROL => {
                        let _ = self.requests.kick.read();
                        while let Ok((vm, req)) = rx.try_recv() {
                            self.per_vm(&mut c, vm.0, |a, core| a.request(core, vm.0, req));
                        }
                    }
                    TOKEN_TIMER => {
                        let _ = timer.wait();
                    }
                    t => {
                        let (vm, vhqd) = ((t >> 8) as u32, (t & 0xFF) as usize);
                        self.per_vm(&mut c, vm, |a, core| a.doorbell(core, vm, vhqd));
                    }
                }
            }
            self.run_gpu(&mut c, &mut gpu_events);
            // Re-plan: the earlier of the scheduler timer and the GPU deadline.
            let now = self.now();
            let next = [c.timer_at, c.gpu.next_deadline()]
                .into_iter()
                .flatten()
                .min();
            let r = match next {
                Some(t) => timer.reset(Duration::from_nanos(t.saturating_sub(now).max(1)), None),
                None => timer.clear(),
            };
            if let Err(e) = r {
                log::error!("arbiter: timerfd: {e}");
            }
            drop(c);
            self.cv.notify_all();
        }
    }

    /// Brings the GPU up to now, feeds its events and a due timer to the binding.
    ///
    /// A panic here must not end the service thread (every VM would lose
    /// its GPU): one while handling an event of a VM's queue quarantines
    /// that VM; one in the backend's `advance` or the scheduler tick (no
    /// single VM to blame) is logged and the loop goes on.
    fn run_gpu(&self, c: &mut Core, buf: &mut Vec<GpuEvent>) {
        let now = self.now();
        buf.clear();
        if catch_unwind(AssertUnwindSafe(|| c.gpu.advance(now, buf))).is_err() {
            // Events it appended before the panic did happen: deliver them.
            log::error!("arbiter: host bug: GPU backend panicked in advance; continuing");
        }
        let mut out = Vec::new();
        for ev in buf.drain(..) {
            let tag = QueueId(ev.tag());
            let r = catch_unwind(AssertUnwindSafe(|| {
                c.bind.gpu_event(c.gpu.as_mut(), now, ev, &mut out)
            }));
            if r.is_err() {
                let owner = c
                    .vms
                    .iter()
                    .position(|s| s.queue.contains(&Some(tag)))
                    .map(|v| v as u32);
                match owner {
                    Some(vm) => self.quarantine(c, vm),
                    None => log::error!("arbiter: host bug handling a GPU event of {tag:?}"),
                }
            }
        }
        if c.timer_at.is_some_and(|t| t <= now) {
            c.timer_at = None;
            let r = catch_unwind(AssertUnwindSafe(|| {
                c.bind.tick(c.gpu.as_mut(), now, &mut out)
            }));
            if r.is_err() {
                log::error!("arbiter: host bug: scheduler tick panicked; continuing");
            }
        }
        self.deliver(c, out);
    }

    /// Runs `f` for VM `vm`; a panic quarantines that VM only.
    fn per_vm(&self, c: &mut Core, vm: u32, f: impl FnOnce(&Self, &mut Core)) {
        let live = c
            .vms
            .get(vm as usize)
            .is_some_and(|s| !s.removed && !s.fe.quarantined());
        if !live {
            return;
        }
        if catch_unwind(AssertUnwindSafe(|| f(self, c))).is_err() {
            self.quarantine(c, vm);
        }
    }

    fn quarantine(&self, c: &mut Core, vm: u32) {
        let Some(s) = c.vms.get(vm as usize) else {
            return;
        };
        if s.fe.quarantined() {
            return;
        }
        log::error!(
            "vm {}: host bug while serving its vGPU; vGPU quarantined (other VMs continue)",
            s.fe.name()
        );
        s.fe.quarantine();
        // Its doorbells are no longer served (level-triggered epoll would
        // otherwise wake this thread for them forever).
        for i in 0..NUM_VHQD {
            let fd = s.fe.doorbell_eventfd(i).as_raw_fd();
            let _ = self
                .epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
        c.quarantined += 1;
        let now = self.now();
        let mut out = Vec::new();
        let r = catch_unwind(AssertUnwindSafe(|| {
            let _ = c.bind.remove_vm(c.gpu.as_mut(), now, VmId(vm), &mut out);
        }));
        if r.is_err() {
            log::error!("arbiter: removing quarantined vm {vm} panicked");
        }
        self.deliver(c, out);
    }

    fn request(&self, c: &mut Core, vm: u32, req: VgpuRequest) {
        let now = self.now();
        let v = vm as usize;
        let mut out = Vec::new();
        match req {
            VgpuRequest::Load {
                vhqd,
                mqd_addr,
                mqd,
            } => {
                if vhqd >= NUM_VHQD || c.vms[v].queue[vhqd].is_some() {
                    return;
                }
                let q = QueueId(c.next_qid);
                c.next_qid += 1;
                let prio = mqd.queue_priority().min(15) as u8;
                let wptr_poll = mqd.wptr_poll_addr();
                let mem = c.vms[v].mem.clone();
                if let Err(e) =
                    c.bind
                        .add_queue(VmId(vm), q, (vm, vhqd as u8), prio, V9Mqd::clone(&mqd), mem)
                {
                    // Only a VM being removed gets here (queue ids are
                    // fresh, priorities clamped).
                    log::warn!("vm {}: vHQD {vhqd}: load refused: {e}", c.vms[v].fe.name());
                    c.vms[v].fe.on_load_refused(vhqd, error::BAD_POINTERS);
                    return;
                }
                let s = &mut c.vms[v];
                s.queue[vhqd] = Some(q);
                s.mqd_addr[vhqd] = mqd_addr;
                s.wptr_poll[vhqd] = wptr_poll;
                // A doorbell rung before the load was served finds no queue:
                // look at the write index now.
                self.doorbell(c, vm, vhqd);
            }
            VgpuRequest::Dequeue { vhqd, mode } => {
                let Some(q) = c.vms[v].queue.get(vhqd).copied().flatten() else {
                    // The load was refused after the front end accepted it.
                    if vhqd < NUM_VHQD {
                        c.vms[v].fe.on_load_refused(vhqd, 0);
                    }
                    return;
                };
                let _ = c
                    .bind
                    .remove_queue(c.gpu.as_mut(), now, q, Some(mode), &mut out);
            }
        }
        self.deliver(c, out);
    }

    fn doorbell(&self, c: &mut Core, vm: u32, vhqd: usize) {
        let v = vm as usize;
        let fe = c.vms[v].fe.clone();
        let _ = fe.doorbell_eventfd(vhqd).read();
        let Some(q) = c.vms[v].queue[vhqd] else {
            fe.guest_log(
                log::Level::Debug,
                format_args!("doorbell {vhqd} of an unloaded vHQD ignored"),
            );
            return;
        };
        let now = self.now();
        let mut out = Vec::new();
        // The CP reads the write index from the poll address; so does the
        // scheduler, which drops doorbells that do not move it. Poll address
        // 0 is "none" (docs/vgpu-abi.md): the write index stays the MQD's.
        let poll = c.vms[v].wptr_poll[vhqd];
        let wptr = if poll == 0 {
            Ok(c.bind.mqd(q).map_or(0, V9Mqd::write_index))
        } else {
            c.vms[v].mem.read_u64(poll)
        };
        match wptr {
            Ok(wptr) => {
                let before = c.bind.scheduler().stats().preemptions;
                c.bind.doorbell(c.gpu.as_mut(), now, q, wptr, &mut out);
                if let Some(obs) = &c.observer {
                    obs(crate::arbiter::DoorbellSeen {
                        vm: VgpuHandle(vm),
                        vhqd,
                        at: Instant::now(),
                        preempted: c.bind.scheduler().stats().preemptions > before,
                    });
                }
            }
            Err(_) => {
                let reason = crate::backend::QueueErrorReason::PointerAddrOutOfRange {
                    addr: c.vms[v].wptr_poll[vhqd],
                };
                fe.on_error(vhqd, &reason);
                c.bind.queue_error(c.gpu.as_mut(), now, q, &mut out);
            }
        }
        self.deliver(c, out);
    }

    /// Carries out binding notices (and what they cause) in order.
    fn deliver(&self, c: &mut Core, mut out: Vec<Notice<Owner>>) {
        while !out.is_empty() {
            let mut more = Vec::new();
            for n in out.drain(..) {
                if let Notice::ArmTimer { at } = n {
                    c.timer_at = Some(at);
                    continue;
                }
                let (q, (vm, vhqd)) = match &n {
                    Notice::Mapped { queue, owner, .. }
                    | Notice::Completed { queue, owner, .. }
                    | Notice::Unmapped { queue, owner, .. }
                    | Notice::QueueError { queue, owner, .. }
                    | Notice::MapRefused { queue, owner, .. }
                    | Notice::Removed { queue, owner, .. } => (*queue, *owner),
                    Notice::ArmTimer { .. } => continue,
                };
                let (v, i) = (vm as usize, vhqd as usize);
                let Some(fe) = c.vms.get(v).map(|s| s.fe.clone()) else {
                    continue;
                };
                if fe.quarantined() {
                    // Its queues are being removed; nothing reaches it any more.
                    if let Notice::Removed { .. } = n {
                        if c.vms[v].queue[i] == Some(q) {
                            c.vms[v].queue[i] = None;
                        }
                    }
                    continue;
                }
                let r = catch_unwind(AssertUnwindSafe(|| match &n {
                    Notice::Mapped { .. } => {
                        fe.on_hqd(i, true);
                        None
                    }
                    Notice::Unmapped { .. } => {
                        fe.on_hqd(i, false);
                        None
                    }
                    Notice::Completed {
                        dispatch_id,
                        signal,
                        ..
                    } => fe.on_completed(i, *dispatch_id, *signal).err(),
                    Notice::QueueError { reason, .. } => {
                        fe.on_error(i, reason);
                        None
                    }
                    Notice::MapRefused { error: e, .. } => {
                        log::warn!("vm {}: vHQD {i}: map refused: {e}", fe.name());
                        None
                    }
                    Notice::Removed { mqd, .. } => {
                        let addr = c.vms[v].mqd_addr[i];
                        if c.vms[v].queue[i] == Some(q) {
                            c.vms[v].queue[i] = None;
                            fe.on_unloaded(i, addr, mqd);
                        }
                        None
                    }
                    Notice::ArmTimer { .. } => None,
                }));
                match r {
                    Ok(Some(reason)) => {
                        // A bad signal/mailbox: the queue stops with an error.
                        fe.on_error(i, &reason);
                        let now = self.now();
                        c.bind.queue_error(c.gpu.as_mut(), now, q, &mut more);
                    }
                    Ok(None) => {}
                    Err(_) => self.quarantine(c, vm),
                }
            }
            out = more;
        }
        self.cv.notify_all();
    }

    // ---- operator lifecycle controls (pause, per-VM slice) ---------------

    /// Pauses a VM's GPU work: every mapped queue of it is unmapped with
    /// SaveWaves (CWSR) and none is mapped again until [`resume_vm`](Self::resume_vm).
    /// Doorbells rung meanwhile are recorded. Pausing a paused VM changes
    /// nothing.
    pub fn pause_vm(&self, vm: VgpuHandle) -> Result<(), SchedError> {
        self.live(vm)?;
        self.control(|b| b.scheduler_mut().set_vm_paused(VmId(vm.0), true))
    }

    /// Resumes a paused VM: its saved queues are eligible again (restored
    /// exactly where they stopped).
    pub fn resume_vm(&self, vm: VgpuHandle) -> Result<(), SchedError> {
        self.live(vm)?;
        self.control(|b| b.scheduler_mut().set_vm_paused(VmId(vm.0), false))
    }

    /// Sets the VM's slice length (`None`: its priority level's quantum).
    pub fn set_quantum(&self, vm: VgpuHandle, quantum: Option<Duration>) -> Result<(), SchedError> {
        self.live(vm)?;
        let ns = quantum.map(|d| d.as_nanos().min(u128::from(u64::MAX)) as Nanos);
        self.control(|b| b.scheduler_mut().set_vm_quantum(VmId(vm.0), ns))
    }

    /// The VM's pause state and slice override (`None` once removed).
    pub fn vm_controls(&self, vm: VgpuHandle) -> Option<(bool, Option<Duration>)> {
        let c = lock(&self.core);
        c.vms.get(vm.0 as usize).filter(|e| !e.removed)?;
        let s = c.bind.scheduler();
        let id = VmId(vm.0);
        Some((s.vm_paused(id)?, s.vm_quantum(id).map(Duration::from_nanos)))
    }

    /// The scheduler's level quantum for `priority` (what a VM without a
    /// slice override gets).
    pub fn level_quantum(&self, priority: u8) -> Duration {
        let c = lock(&self.core);
        let cfg = c.bind.scheduler().config();
        let ns = match cfg.policy {
            Policy::Timeslice | Policy::Fifo => cfg.baseline_quantum_ns,
            _ => cfg.quantum_ns[usize::from(priority.min(15))],
        };
        Duration::from_nanos(ns.max(cfg.min_run_ns))
    }

    /// Refuses handles of removed or unknown VMs.
    fn live(&self, vm: VgpuHandle) -> Result<(), SchedError> {
        let c = lock(&self.core);
        match c.vms.get(vm.0 as usize) {
            Some(e) if !e.removed => Ok(()),
            _ => Err(SchedError::NoVm(VmId(vm.0))),
        }
    }

    // ---- preemption timeout (issue 11) -----------------------------------

    /// Sets VM `vm`'s preemption timeout live: a dequeue of one of its
    /// queues (scheduler preemption or the guest's own) that has not
    /// finished this long after the request resets that queue only; it
    /// reads `CP_HQD_ERROR` = [`error::PREEMPTION_TIMEOUT`]. Applies to
    /// dequeues requested from now on. Range: [`PREEMPT_TIMEOUT_MS_RANGE`].
    pub fn set_preempt_timeout(
        &self,
        vm: VgpuHandle,
        timeout: Duration,
    ) -> Result<(), ArbiterError> {
        let ms = timeout.as_millis();
        if ms < u128::from(*PREEMPT_TIMEOUT_MS_RANGE.start())
            || ms > u128::from(*PREEMPT_TIMEOUT_MS_RANGE.end())
        {
            return Err(ArbiterError::PreemptTimeout(timeout));
        }
        let mut c = lock(&self.core);
        if c.vms.get(vm.0 as usize).is_none_or(|e| e.removed) {
            return Err(SchedError::NoVm(VmId(vm.0)).into());
        }
        let ns = timeout.as_nanos().min(u128::from(u64::MAX)) as Nanos;
        c.bind.set_preempt_timeout(VmId(vm.0), ns)?;
        Ok(())
    }

    /// VM `vm`'s preemption timeout (`None` once removed or unknown).
    pub fn preempt_timeout(&self, vm: VgpuHandle) -> Option<Duration> {
        let c = lock(&self.core);
        c.vms.get(vm.0 as usize).filter(|e| !e.removed)?;
        c.bind.preempt_timeout(VmId(vm.0)).map(Duration::from_nanos)
    }
}

#[cfg(test)]
#[path = "arbiter_tests.rs"]
mod tests;
