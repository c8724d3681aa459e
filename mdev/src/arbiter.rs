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
//!   mailboxes and vectors, errors, unloads with the MQD write-back. The
//!   service thread makes these calls after releasing the arbiter's lock
//!   (they take the VM's register and MSI-X locks, which its vCPUs hold),
//!   in the order they were decided.
//!
//! Front ends never call the GPU on a vCPU thread. Control calls from the
//! VMM (priority, weight, policy, add/remove VM) take the arbiter's lock
//! briefly and kick the service thread so it re-plans its timer.
//!
//! Per-VM handling runs under `catch_unwind`: a host bug while serving one
//! VM quarantines that VM's vGPU (its queues are removed), not the others.
//! Locks are recovered, never propagated as poison.

use crate::backend::{GpuEvent, PhysGpu, QueueErrorReason};
use crate::binding::{ArmedDoorbell, Binding, Notice};
use crate::guard::{GuardConfig, GuardConfigError, GuardEvent, GuardStatus, VmGuard};
use crate::mem::DmaMemory;
use crate::telemetry::Telemetry;
use crate::topology::{GpuTopology, TopologyError};
use crate::vgpu::{InterruptSink, RequestSink, VgpuFrontEnd, VgpuRequest};
use abi::mqd::V9Mqd;
use abi::vgpu::{error, NUM_VHQD};
use scheduler::{Nanos, Policy, QueueId, SchedConfig, SchedError, VmId, VmParams};
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

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
    /// Invalid guard limits.
    #[error("{0}")]
    Guard(#[from] GuardConfigError),
    /// Every VM handle was used once (2^32 registrations in this process):
    /// handles are never reused, so a stale one cannot reach a new VM.
    #[error("no VM handle left (handles are not reused)")]
    Handles,
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
    /// Doorbells that moved nothing (no scheduler decision): the write
    /// pointer the scheduler had already seen, or a queue off the GPU with
    /// nothing new to run (the binding's stalled doorbells).
    pub stale_doorbells: u64,
    /// VMs quarantined after a host bug while serving them.
    pub quarantined_vms: u64,
    /// Quarantines by the misbehaving-VM guard (since start).
    pub guard_quarantines: u64,
    /// Queues reset after a preemption timeout.
    pub preempt_timeouts: u64,
    /// Doorbells whose preemption was prepared at the end of the previous
    /// service turn and handed to the GPU before the scheduler ran.
    pub armed_preemptions: u64,
    /// Prepared unmaps the doorbell's decision did not make (never
    /// expected; the scheduler adopts them as preemptions).
    pub armed_mismatched: u64,
}

/// What a [`DoorbellObserver`] is told after each doorbell the service thread handled.
#[derive(Clone, Copy, Debug)]
pub struct DoorbellSeen {
    /// VM.
    pub vm: VmId,
    /// vHQD.
    pub vhqd: usize,
    /// When the binding returned (every map/unmap it decided was handed to the backend).
    pub at: Instant,
    /// The scheduler issued at least one preemption for this doorbell.
    pub preempted: bool,
    /// When the first preemption was handed to the backend (`PhysGpu`'s
    /// dequeue called), if one was.
    pub issued: Option<Instant>,
}

/// What a vGPU carries from one registration with an arbiter to the next
/// (issue 19): its misbehaving-VM guard (counts in the window and any
/// quarantine) and its remembered preemption timeouts (the hang
/// escalation). Taken by [`GpuArbiter::remove_vm_keeping`], given to the
/// next registration of the same vGPU by [`GpuArbiter::resume_history`]:
/// a VMM that disconnects and reconnects (or resets the device) after each
/// hang is escalated and quarantined as one that stays. Dropping it (an
/// operator removing the vGPU) is what starts the vGPU over.
#[derive(Clone, Debug)]
pub struct VmHistory {
    /// The arbiter whose clock the times are on.
    arbiter: u64,
    /// The handle it was taken from: a preemption of that VM's queues
    /// still pending at its removal may time out later, and counts for the
    /// vGPU all the same (read at resume, forwarded after).
    from: VmId,
    guard: VmGuard,
    hangs: Vec<Nanos>,
}

impl VmHistory {
    /// Why and when the vGPU was quarantined by the guard (`None`: it was not).
    pub fn quarantined(&self) -> Option<crate::guard::Trip> {
        self.guard.trip()
    }

    /// Preemption timeouts remembered for the escalation.
    pub fn hangs(&self) -> usize {
        self.hangs.len()
    }
}

/// Most preemption-timeout times a VM's slot keeps for its [`VmHistory`]
/// (the binding's escalation remembers as many).
const MAX_CARRIED_HANGS: usize = 64;

/// Arbiter identities (a [`VmHistory`] is resumed on its own arbiter's clock).
static NEXT_ARBITER_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Benchmark hook called on the service thread (none in production).
pub type DoorbellObserver = Arc<dyn Fn(DoorbellSeen) + Send + Sync>;

/// Owner of a binding queue: (VM, vHQD).
type Owner = (VmId, u8);

const TOKEN_CONTROL: u64 = u64::MAX;
const TOKEN_TIMER: u64 = u64::MAX - 1;

fn token(vm: VmId, vhqd: usize) -> u64 {
    (u64::from(vm.0) << 8) | vhqd as u64
}

struct VmSlot {
    /// The front end; `None` once the VM is removed and its queues are gone
    /// (its memory is then released).
    fe: Option<Arc<VgpuFrontEnd>>,
    /// The VM's memory; `None` with `fe`.
    mem: Option<Arc<dyn DmaMemory>>,
    queue: [Option<QueueId>; NUM_VHQD],
    mqd_addr: [u64; NUM_VHQD],
    wptr_poll: [u64; NUM_VHQD],
    removed: bool,
    /// Misbehaving-VM guard (issue 11).
    guard: VmGuard,
    /// Times of its preemption timeouts (at most [`MAX_CARRIED_HANGS`]),
    /// kept with the slot for its [`VmHistory`] (the binding forgets a
    /// removed VM's).
    hangs: std::collections::VecDeque<Nanos>,
    /// The registration that resumed its history: guard events and
    /// preemption timeouts of its queues still draining go there.
    heir: Option<VmId>,
    /// A host bug while serving it took its vGPU away.
    quarantined: bool,
    /// Removed and older than the retained removed VMs: the slot goes as
    /// soon as its queues are gone.
    forget: bool,
}

/// The arbiter's VM table: slots by handle. Handles are never reused (a
/// stale handle held by the API or a server cannot reach a later VM); a
/// removed VM's slot is dropped once its queues are gone and it is older
/// than the last [`crate::telemetry::RETAINED_REMOVED_VMS`] removed VMs
/// (whose guard figures `/metrics` keeps beside their telemetry). So a
/// storm of VMs added and removed keeps the table at live VMs + draining
/// ones + that many.
#[derive(Default)]
struct VmSlots {
    map: std::collections::BTreeMap<VmId, VmSlot>,
    /// The next handle.
    next: u32,
    /// Removed VMs still kept, oldest removal first.
    removed: std::collections::VecDeque<VmId>,
}

impl VmSlots {
    fn get(&self, v: VmId) -> Option<&VmSlot> {
        self.map.get(&v)
    }

    fn get_mut(&mut self, v: VmId) -> Option<&mut VmSlot> {
        self.map.get_mut(&v)
    }

    /// The slot of VM `vm` unless it is removed or unknown.
    fn live(&self, vm: VmId) -> Option<&VmSlot> {
        self.map.get(&vm).filter(|e| !e.removed)
    }

    /// [`Self::live`] for a change; a removed or unknown VM is
    /// [`SchedError::NoVm`].
    fn live_mut(&mut self, vm: VmId) -> Result<&mut VmSlot, SchedError> {
        self.map
            .get_mut(&vm)
            .filter(|e| !e.removed)
            .ok_or(SchedError::NoVm(vm))
    }

    fn iter(&self) -> impl Iterator<Item = (VmId, &VmSlot)> {
        self.map.iter().map(|(k, s)| (*k, s))
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    /// The next handle, or `None` when all were used.
    fn next_handle(&self) -> Option<VmId> {
        // u32::MAX stays unused: the doorbell tokens of the last handles
        // must stay clear of the control tokens (`token`).
        (self.next < u32::MAX).then_some(VmId(self.next))
    }

    fn insert(&mut self, s: VmSlot) {
        self.map.insert(VmId(self.next), s);
        self.next += 1;
    }

    /// Notes that `v` was removed; forgets the oldest removed slots past
    /// the retention (at once if their queues are gone, else when they
    /// are: [`VmSlots::drop_if_gone`]).
    fn note_removed(&mut self, v: VmId) {
        self.removed.push_back(v);
        while self.removed.len() > crate::telemetry::RETAINED_REMOVED_VMS {
            let Some(old) = self.removed.pop_front() else {
                break;
            };
            if let Some(s) = self.map.get_mut(&old) {
                s.forget = true;
            }
            self.drop_if_gone(old);
        }
    }

    /// Drops slot `v` if it is forgotten and holds no queue.
    fn drop_if_gone(&mut self, v: VmId) {
        if self
            .map
            .get(&v)
            .is_some_and(|s| s.forget && s.queue.iter().all(Option::is_none))
        {
            self.map.remove(&v);
        }
    }
}

impl std::ops::Index<VmId> for VmSlots {
    type Output = VmSlot;
    fn index(&self, v: VmId) -> &VmSlot {
        self.get(v).expect("a VM slot checked by the caller")
    }
}

impl std::ops::IndexMut<VmId> for VmSlots {
    fn index_mut(&mut self, v: VmId) -> &mut VmSlot {
        self.get_mut(v).expect("a VM slot checked by the caller")
    }
}

impl VmSlot {
    /// The front end of a VM still served (not removed, not quarantined).
    fn live(&self) -> Option<&Arc<VgpuFrontEnd>> {
        self.fe
            .as_ref()
            .filter(|_| !self.removed && !self.quarantined)
    }
}

/// A call into a VM's front end decided under the core lock and made by
/// the service thread after releasing it: front-end callbacks take the VM's
/// register lock (and its MSI-X lock), which its vCPUs hold.
enum FeCall {
    /// The queue went on (true) or off a physical HQD.
    Hqd(bool),
    /// A packet completed.
    Completed {
        queue: QueueId,
        dispatch_id: u64,
        signal: u64,
    },
    /// The queue stopped with an error.
    Error(QueueErrorReason),
    /// The queue is gone: MQD write-back.
    Unloaded { mqd_addr: u64, mqd: Box<V9Mqd> },
    /// A load was refused (`code` 0: no error).
    LoadRefused(u32),
    /// A doorbell of an unloaded vHQD (rate-limited debug line).
    StrayDoorbell,
    /// Take the vGPU away (error vector).
    Quarantine,
}

struct Pending {
    fe: Arc<VgpuFrontEnd>,
    vm: VmId,
    vhqd: usize,
    call: FeCall,
}

/// What a front-end call left for the core.
enum FollowUp {
    /// A bad signal or mailbox: stop the queue with an error.
    QueueError(VmId, QueueId, QueueErrorReason),
    /// A front-end call panicked.
    Quarantine(VmId),
}

struct Core {
    bind: Binding<Owner>,
    gpu: Box<dyn PhysGpu + Send>,
    vms: VmSlots,
    next_qid: u64,
    timer_at: Option<Nanos>,
    quarantined: u64,
    observer: Option<DoorbellObserver>,
    stopping: bool,
    guard_quarantines: u64,
    /// Metrics and the HQD-slot timeline (`metrics_text`, `timeline`).
    tele: Telemetry,
    /// Front-end calls in order, made by the service thread only.
    calls: Vec<Pending>,
    /// The service thread is making calls taken from `calls`.
    calls_in_flight: bool,
    /// Binding output, reused on the doorbell path (no allocation).
    notices: Vec<Notice<Owner>>,
    /// The last [`RECENT_DOORBELLS`] vHQDs rung, with the preemption their
    /// next doorbell causes, prepared at the end of each service turn (a
    /// preparation older than the binding's last change is not fired).
    recent: Vec<RecentDoorbell>,
    /// CU time taken from the backend, reused.
    cu_buf: Vec<(u64, u64)>,
}

/// The promise's figures of one VM ([`GpuArbiter::vm_promise`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmPromise {
    /// When they were read (ns on the arbiter's clock).
    pub at_ns: Nanos,
    /// Cumulative counters.
    pub counters: crate::telemetry::PromiseCounters,
    /// Its compute partition.
    pub partition: u32,
    /// Preemptions of its queues by VM name.
    pub preempted_by: Vec<(String, u64)>,
}

/// How many recently rung vHQDs get their next doorbell's preemption
/// prepared (the tenants that preempt are the ones that ring).
const RECENT_DOORBELLS: usize = 8;

/// How many of the [`RECENT_DOORBELLS`] one VM may hold: a guest ringing
/// many vHQDs does not push the other tenants' out.
const RECENT_PER_VM: usize = 2;

/// Moves vHQD `vhqd` of VM `vm` (loaded with `queue`) to the back of
/// `recent` (most recently rung). A new one takes the place of its VM's
/// least recently rung past [`RECENT_PER_VM`], else of the least recently
/// rung past [`RECENT_DOORBELLS`].
fn note_recent(recent: &mut Vec<RecentDoorbell>, vm: VmId, vhqd: usize, queue: QueueId) {
    let at = recent.iter().position(|r| r.vm == vm && r.vhqd == vhqd);
    let drop = at.or_else(|| {
        let mut own = recent.iter().enumerate().filter(|(_, r)| r.vm == vm);
        let oldest = own.next().map(|e| e.0);
        if own.count() + 1 >= RECENT_PER_VM {
            oldest
        } else {
            (recent.len() >= RECENT_DOORBELLS).then_some(0)
        }
    });
    let mut r = match drop {
        Some(i) => recent.remove(i),
        None => RecentDoorbell {
            vm,
            vhqd,
            queue,
            armed: ArmedDoorbell::default(),
        },
    };
    if at.is_none() {
        r.vm = vm;
        r.vhqd = vhqd;
    }
    r.queue = queue;
    recent.push(r);
}

/// A recently rung vHQD and its prepared preemption.
struct RecentDoorbell {
    vm: VmId,
    vhqd: usize,
    queue: QueueId,
    armed: ArmedDoorbell,
}

struct Requests {
    tx: Mutex<Sender<(VmId, VgpuRequest)>>,
    kick: EventFd,
    /// Loads refused by a front end, `(vm, code)` -> count, not yet in
    /// telemetry: counted at once (not through the channel) so that a VM
    /// removed right after its guest saw the error still counts it; taken
    /// by [`GpuArbiter::count_refused`] under the core lock.
    refused: Mutex<std::collections::BTreeMap<(VmId, u32), u64>>,
}

impl RequestSink for Requests {
    fn send(&self, vm: VmId, req: VgpuRequest) {
        if let VgpuRequest::Refused { code, .. } = req {
            if code != 0 {
                let mut r = self.refused.lock().unwrap_or_else(|e| e.into_inner());
                let first = r.is_empty();
                *r.entry((vm, code)).or_insert(0) += 1;
                drop(r);
                // The service thread counts them for the guard: woken by
                // the first of a batch only (a flood of refused loads
                // costs it one wake-up per batch, not one per load).
                if first {
                    let _ = self.kick.write(1);
                }
            }
            return;
        }
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
    /// Identity (see [`VmHistory`]).
    id: u64,
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
            refused: Mutex::new(Default::default()),
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
        let tele = Telemetry::new(&topo, timeline::RingLimits::default());
        let a = Arc::new(GpuArbiter {
            id: NEXT_ARBITER_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            topo,
            core: Mutex::new(Core {
                bind,
                gpu: backend,
                vms: VmSlots::default(),
                next_qid: 0,
                timer_at: None,
                quarantined: 0,
                observer: None,
                stopping: false,
                guard_quarantines: 0,
                tele,
                calls: Vec::new(),
                calls_in_flight: false,
                notices: Vec::new(),
                recent: Vec::with_capacity(RECENT_DOORBELLS),
                cu_buf: Vec::new(),
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
            stale_doorbells: s.stale_doorbells + c.bind.stats().stalled_doorbells,
            quarantined_vms: c.quarantined,
            guard_quarantines: c.guard_quarantines,
            preempt_timeouts: c.bind.stats().preempt_timeouts,
            armed_preemptions: c.bind.stats().armed_fired,
            armed_mismatched: c.bind.stats().armed_mismatched,
        }
    }

    /// Sets (or clears) the doorbell benchmark hook.
    /// While one is set, the binding stamps when it hands a preemption to
    /// the backend ([`DoorbellSeen::issued`]).
    pub fn set_doorbell_observer(&self, obs: Option<DoorbellObserver>) {
        let mut c = lock(&self.core);
        let epoch = self.epoch;
        c.bind.set_issue_clock(obs.as_ref().map(|_| {
            Box::new(move || epoch.elapsed().as_nanos() as u64) as crate::binding::DecisionClock
        }));
        c.observer = obs;
    }

    /// Registers a VM: its memory, scheduling parameters and interrupt sink.
    /// Returns its handle and its front end (registers, doorbell eventfds).
    /// Its guard starts with the default limits ([`GuardConfig::default`]);
    /// the fleet sets its own with [`GpuArbiter::set_guard`].
    pub fn add_vm(
        &self,
        name: &str,
        mem: Arc<dyn DmaMemory>,
        params: VmParams,
        irq: Arc<dyn InterruptSink>,
    ) -> Result<(VmId, Arc<VgpuFrontEnd>), ArbiterError> {
        let mut c = lock(&self.core);
        if c.stopping {
            return Err(ArbiterError::Stopped);
        }
        let idx = c.vms.next_handle().ok_or(ArbiterError::Handles)?;
        let h = idx;
        let mut fe =
            VgpuFrontEnd::new(h, name, &self.topo, mem.clone(), irq, self.requests.clone())?;
        fe.set_load_check(c.gpu.load_check());
        let fe = Arc::new(fe);
        for i in 0..NUM_VHQD {
            self.epoll.ctl(
                ControlOperation::Add,
                fe.doorbell_eventfd(i).as_raw_fd(),
                EpollEvent::new(EventSet::IN, token(idx, i)),
            )?;
        }
        c.bind.add_vm(idx, params)?;
        let part = c.bind.scheduler().vm_partition(idx).unwrap_or(0);
        c.tele.vm_added(idx, name, &params, part);
        c.vms.insert(VmSlot {
            fe: Some(fe.clone()),
            mem: Some(mem),
            queue: [None; NUM_VHQD],
            mqd_addr: [0; NUM_VHQD],
            wptr_poll: [0; NUM_VHQD],
            removed: false,
            guard: VmGuard::new(GuardConfig::default()),
            hangs: Default::default(),
            heir: None,
            quarantined: false,
            forget: false,
        });
        Ok((h, fe))
    }

    /// Unregisters a VM: its queues are reset-unmapped; returns when no slot
    /// holds one of them any more and the front-end calls they caused were
    /// made (or after 5 s). The arbiter then holds no reference to the VM's
    /// front end or memory (released at once if its queues are already gone,
    /// else when the last one is).
    pub fn remove_vm(&self, vm: VmId) {
        self.remove_vm_keeping(vm);
    }

    /// [`GpuArbiter::remove_vm`], handing back what the VM's next
    /// registration takes over ([`VmHistory`]; `None` for a VM unknown or
    /// already removed). Taken under the same lock as the removal: nothing
    /// the VM did before it is lost.
    pub fn remove_vm_keeping(&self, vm: VmId) -> Option<VmHistory> {
        let mut c = lock(&self.core);
        let v = vm;
        if c.vms.get(v).is_none_or(|e| e.removed) {
            return None;
        }
        c.vms[v].removed = true;
        if let Some(fe) = c.vms[v].fe.clone() {
            for i in 0..NUM_VHQD {
                let fd = fe.doorbell_eventfd(i).as_raw_fd();
                let _ = self
                    .epoll
                    .ctl(ControlOperation::Delete, fd, EpollEvent::default());
            }
        }
        let now = self.now();
        self.count_refused(&mut c);
        let core = &mut *c;
        let history = VmHistory {
            arbiter: self.id,
            from: vm,
            guard: core.vms[v].guard.clone(),
            hangs: core.vms[v].hangs.iter().copied().collect(),
        };
        let last = core.bind.scheduler().vm_stats(vm);
        let guard = core.vms[v].guard.totals();
        core.tele.vm_guard_final(vm, guard);
        core.tele.vm_removed(vm, last);
        let mut out = Vec::new();
        let _ = core.bind.remove_vm(core.gpu.as_mut(), now, vm, &mut out);
        self.deliver(core, out);
        Self::release_if_gone(core, v);
        core.vms.note_removed(vm);
        drop(c);
        let _ = self.requests.kick.write(1);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut c = lock(&self.core);
        while (c
            .vms
            .get(v)
            .is_some_and(|s| s.queue.iter().any(|q| q.is_some()))
            || !c.calls.is_empty()
            || c.calls_in_flight)
            && Instant::now() < deadline
        {
            c = self
                .cv
                .wait_timeout(c, Duration::from_millis(20))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Some(history)
    }

    /// Gives VM `vm` what an earlier registration of the same vGPU left
    /// ([`GpuArbiter::remove_vm_keeping`]): its guard quarantine, its guard
    /// counts in the window (when its limits are the same, as
    /// [`GpuArbiter::set_guard`] would) and its remembered preemption
    /// timeouts. Call it after the VM's limits are set and before its
    /// front end is served. A history of another arbiter brings its
    /// quarantine only (its times are on another clock).
    pub fn resume_history(&self, vm: VmId, h: VmHistory) -> Result<(), ArbiterError> {
        let mut c = lock(&self.core);
        let core = &mut *c;
        core.vms
            .get(vm)
            .filter(|e| !e.removed)
            .ok_or(SchedError::NoVm(vm))?;
        let (mut earlier, mut hangs) = (h.guard, h.hangs);
        if h.arbiter != self.id {
            earlier.set_limits(earlier.limits());
            hangs.clear();
        } else if let Some(old) = core.vms.get_mut(h.from).filter(|o| o.removed) {
            // The old registration's slot has what happened since the
            // history was taken (a pending preemption that timed out);
            // what still happens to it comes here.
            earlier = old.guard.clone();
            hangs = old.hangs.iter().copied().collect();
            // Also when its queues are gone: an older registration still
            // draining may forward to it.
            old.heir = Some(vm);
        }
        if h.arbiter == self.id {
            // Every older registration that forwarded to the one resumed
            // now forwards here, so a forward is one hop to the live
            // registration however many reconnections came between (a
            // chain could outgrow `heir_of`'s hops, or lose a link when a
            // drained slot is forgotten, and the timeout would land on a
            // removed registration nobody reads again: a VMM reconnecting
            // a few times while its hang is pending escaped it).
            for s in core.vms.map.values_mut() {
                if s.removed && s.heir == Some(h.from) {
                    s.heir = Some(vm);
                }
            }
        }
        let s = &mut core.vms[vm];
        s.guard.resume(&earlier);
        let skip = hangs.len().saturating_sub(MAX_CARRIED_HANGS);
        s.hangs = hangs.iter().copied().skip(skip).collect();
        core.bind.resume_hangs(vm, &hangs);
        if let Some(t) = s.guard.trip() {
            log::info!(
                "vm {}: vGPU still quarantined by the misbehaving-VM guard ({t}) from its \
                 earlier connection; new queue loads are refused until the operator clears it",
                s.fe.as_ref().map_or("?", |f| f.name())
            );
        }
        Ok(())
    }

    /// Why and when the vGPU whose history `h` is was quarantined by the
    /// guard (`None`: it is not), with what happened to its last
    /// registration since `h` was taken (a pending preemption that timed
    /// out after the removal).
    pub fn history_quarantine(&self, h: &VmHistory) -> Option<crate::guard::Trip> {
        let c = lock(&self.core);
        match c.vms.get(h.from).filter(|_| h.arbiter == self.id) {
            Some(old) => old.guard.trip(),
            None => h.guard.trip(),
        }
    }

    /// Lifts the guard quarantine of the vGPU whose history `h` is, and
    /// forgets its guard counts in the window: the operator's
    /// clear-quarantine while no client is connected (in `h` and in its
    /// last registration's slot, which the next registration reads).
    /// Returns whether it was quarantined.
    pub fn clear_history_quarantine(&self, h: &mut VmHistory) -> bool {
        let mut c = lock(&self.core);
        let old = match c.vms.get_mut(h.from).filter(|_| h.arbiter == self.id) {
            Some(old) => old.guard.clear(),
            None => false,
        };
        h.guard.clear() || old
    }

    /// Drops a removed VM's front end and memory once none of its queues is
    /// left (queued front-end calls keep their own reference until made).
    fn release_if_gone(c: &mut Core, v: VmId) {
        if let Some(s) = c.vms.get_mut(v) {
            if s.removed && s.queue.iter().all(Option::is_none) {
                s.fe = None;
                s.mem = None;
            }
        }
        c.vms.drop_if_gone(v);
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
    pub fn set_priority(&self, vm: VmId, priority: u8) -> Result<(), SchedError> {
        self.control(|b| b.set_vm_priority(vm, priority))
    }

    /// Changes a VM's weight live (applies at once).
    pub fn set_weight(&self, vm: VmId, weight: u32) -> Result<(), SchedError> {
        self.control(|b| b.set_vm_weight(vm, weight))
    }

    /// Changes the scheduling policy live (applies at once; mapped queues
    /// stay mapped until the new policy decides otherwise).
    pub fn set_policy(&self, policy: Policy) {
        let _ = self.control(|b| {
            b.set_policy(policy);
            Ok(())
        });
    }

    /// The current scheduling policy.
    pub fn policy(&self) -> Policy {
        lock(&self.core).bind.scheduler().config().policy
    }

    /// A VM's current parameters and accounting (`None` once removed).
    pub fn vm_status(&self, vm: VmId) -> Option<(VmParams, scheduler::VmStats)> {
        let mut c = lock(&self.core);
        c.vms.live(vm)?;
        // Bring the scheduler's clock to now: GPU time then includes the
        // time a queue has been running since the last event (a long kernel
        // otherwise reads as 0 until it completes).
        let now = self.now();
        let core = &mut *c;
        let mut out = Vec::new();
        core.bind.tick(core.gpu.as_mut(), now, &mut out);
        self.deliver(core, out);
        let id = vm;
        let s = c.bind.scheduler();
        let r = (s.vm_params(id)?, s.vm_stats(id)?);
        drop(c);
        // The tick may have re-armed the scheduler timer.
        let _ = self.requests.kick.write(1);
        Some(r)
    }

    // ---- service thread ------------------------------------------------

    fn service(self: Arc<Self>, rx: Receiver<(VmId, VgpuRequest)>, mut timer: TimerFd) {
        let mut events = vec![EpollEvent::default(); 64];
        let mut gpu_events = Vec::new();
        let mut spare = Vec::new();
        // The deadline the timerfd is armed for: re-armed only when it
        // changes (no syscall on a turn that leaves it as it was).
        let mut armed: Option<Nanos> = None;
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
            // Doorbells first: the preemption a high-priority doorbell
            // causes is handed to the backend before control requests and
            // timers of the same turn are served.
            let mut control = false;
            let mut fired = false;
            for ev in &events[..n] {
                match ev.data() {
                    TOKEN_CONTROL => control = true,
                    TOKEN_TIMER => fired = true,
                    t => {
                        let (vm, vhqd) = (VmId((t >> 8) as u32), (t & 0xFF) as usize);
                        self.per_vm(&mut c, vm, |a, core| a.doorbell(core, vm, vhqd));
                    }
                }
            }
            if fired {
                let _ = timer.wait();
                armed = None;
            }
            if control {
                self.count_refused(&mut c);
                let _ = self.requests.kick.read();
                while let Ok((vm, req)) = rx.try_recv() {
                    self.per_vm(&mut c, vm, |a, core| a.request(core, vm, req));
                }
            }
            self.run_gpu(&mut c, &mut gpu_events);
            // Re-plan: the earlier of the scheduler timer and the GPU deadline.
            let next = [c.timer_at, c.gpu.next_deadline()]
                .into_iter()
                .flatten()
                .min();
            if next != armed {
                let now = self.now();
                let r = match next {
                    Some(t) => {
                        timer.reset(Duration::from_nanos(t.saturating_sub(now).max(1)), None)
                    }
                    None => timer.clear(),
                };
                match r {
                    Ok(()) => armed = next,
                    Err(e) => log::error!("arbiter: timerfd: {e}"),
                }
            }
            self.flush(c, &mut spare);
            // Prepare the next doorbells' preemptions while the cache is
            // warm (the doorbell path then hands them to the GPU first).
            let mut c = lock(&self.core);
            self.arm_recent(&mut c);
            drop(c);
            self.cv.notify_all();
        }
    }

    /// Prepares the preemption each recently rung vHQD's next doorbell
    /// would cause (see [`Binding::arm_doorbell`]); forgets vHQDs no longer
    /// loaded with the same queue.
    fn arm_recent(&self, c: &mut Core) {
        let now = self.now();
        let Core {
            recent, bind, vms, ..
        } = c;
        recent.retain(|r| {
            vms.get(r.vm)
                .filter(|s| s.live().is_some())
                .and_then(|s| s.queue.get(r.vhqd).copied().flatten())
                == Some(r.queue)
        });
        for r in recent.iter_mut().filter(|r| !bind.armed_current(&r.armed)) {
            bind.arm_doorbell(r.queue, now, &mut r.armed);
        }
    }

    /// Makes the queued front-end calls without the core lock (service
    /// thread only, so they happen in the order they were decided), then
    /// feeds what they left back to the core. Consumes the guard.
    fn flush<'a>(&'a self, mut c: MutexGuard<'a, Core>, spare: &mut Vec<Pending>) {
        let mut follow = Vec::new();
        while !c.calls.is_empty() {
            std::mem::swap(&mut c.calls, spare);
            c.calls_in_flight = true;
            drop(c);
            for p in spare.drain(..) {
                let vm = p.vm;
                let r = catch_unwind(AssertUnwindSafe(|| Self::call(p)));
                match r {
                    Ok(Some(f)) => follow.push(f),
                    Ok(None) => {}
                    Err(_) => follow.push(FollowUp::Quarantine(vm)),
                }
            }
            c = lock(&self.core);
            c.calls_in_flight = false;
            for f in follow.drain(..) {
                match f {
                    FollowUp::QueueError(vm, q, reason) => {
                        if c.vms.get(vm).and_then(VmSlot::live).is_none() {
                            continue;
                        }
                        let now = self.now();
                        let core = &mut *c;
                        // The guest saw it (on_error): count it like a GPU one.
                        core.tele.queue_error(vm, &reason);
                        let mut out = Vec::new();
                        let r = catch_unwind(AssertUnwindSafe(|| {
                            core.bind.queue_error(core.gpu.as_mut(), now, q, &mut out)
                        }));
                        match r {
                            Ok(()) => {
                                self.guard_note(core, vm, GuardEvent::QueueError, 1);
                                self.deliver(core, out)
                            }
                            Err(_) => self.quarantine(core, vm),
                        }
                    }
                    FollowUp::Quarantine(vm) => self.quarantine(&mut c, vm),
                }
                // The core changed: the loop re-plans its timer.
                let _ = self.requests.kick.write(1);
            }
        }
    }

    /// One front-end call (no arbiter lock held).
    fn call(p: Pending) -> Option<FollowUp> {
        let (fe, i) = (&p.fe, p.vhqd);
        if fe.quarantined() {
            // Taken away after this call was queued: nothing reaches it.
            return None;
        }
        match p.call {
            FeCall::Hqd(on) => fe.on_hqd(i, on),
            FeCall::Completed {
                queue,
                dispatch_id,
                signal,
            } => {
                if let Err(reason) = fe.on_completed(i, dispatch_id, signal) {
                    // A bad signal/mailbox: the queue stops with an error.
                    fe.on_error(i, &reason);
                    return Some(FollowUp::QueueError(p.vm, queue, reason));
                }
            }
            FeCall::Error(reason) => fe.on_error(i, &reason),
            FeCall::Unloaded { mqd_addr, mqd } => fe.on_unloaded(i, mqd_addr, &mqd),
            FeCall::LoadRefused(code) => fe.on_load_refused(i, code),
            FeCall::StrayDoorbell => fe.guest_log(
                log::Level::Debug,
                format_args!("doorbell {i} of an unloaded vHQD ignored"),
            ),
            FeCall::Quarantine => fe.quarantine(),
        }
        None
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
        Self::take_cu_time(c);
        let mut out = Vec::new();
        for ev in buf.drain(..) {
            let tag = QueueId(ev.tag());
            c.tele.gpu_event(&ev);
            let r = catch_unwind(AssertUnwindSafe(|| {
                c.bind.gpu_event(c.gpu.as_mut(), now, ev, &mut out)
            }));
            if r.is_err() {
                let owner = c
                    .vms
                    .iter()
                    .find(|(_, s)| s.queue.contains(&Some(tag)))
                    .map(|(v, _)| v);
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

    /// Moves the backend's CU time into telemetry (by the queues' VMs).
    fn take_cu_time(c: &mut Core) {
        let mut buf = std::mem::take(&mut c.cu_buf);
        c.gpu.take_cu_time(&mut buf);
        for (tag, ns) in buf.drain(..) {
            if let Some(vm) = c.bind.queue_vm(QueueId(tag)) {
                c.tele.cu_time(vm, ns);
            }
        }
        c.cu_buf = buf;
    }

    /// The promise's counters of a live VM, brought to now (CU time taken
    /// from the backend, demand sampled), with its partition and the VMs
    /// that preempted it (name, count); `None` for a VM the arbiter does
    /// not have live.
    pub fn vm_promise(&self, vm: VmId) -> Option<VmPromise> {
        let mut c = lock(&self.core);
        c.vms.live(vm)?;
        let now = self.now();
        let core = &mut *c;
        Self::take_cu_time(core);
        core.tele.sample_demand(now, &core.bind, true);
        let partition = core.bind.scheduler().vm_partition(vm)?;
        let (_, t) = core.tele.vms().find(|(id, _)| **id == vm)?;
        let names: BTreeMap<VmId, String> = core
            .tele
            .vms()
            .map(|(id, v)| (*id, v.name.clone()))
            .collect();
        let preempted_by = t
            .preempted_by
            .iter()
            .map(|(id, n)| {
                let name = names.get(id).cloned().unwrap_or_else(|| format!("vm{id}"));
                (name, *n)
            })
            .collect();
        Some(VmPromise {
            at_ns: now,
            counters: t.promise,
            partition,
            preempted_by,
        })
    }

    /// Runs `f` for VM `vm`; a panic quarantines that VM only.
    fn per_vm(&self, c: &mut Core, vm: VmId, f: impl FnOnce(&Self, &mut Core)) {
        if c.vms.get(vm).and_then(VmSlot::live).is_none() {
            return;
        }
        if catch_unwind(AssertUnwindSafe(|| f(self, c))).is_err() {
            self.quarantine(c, vm);
        }
    }

    fn quarantine(&self, c: &mut Core, vm: VmId) {
        let Some(s) = c.vms.get_mut(vm) else {
            return;
        };
        if s.quarantined {
            return;
        }
        s.quarantined = true;
        let Some(fe) = s.fe.clone() else {
            return;
        };
        log::error!(
            "vm {}: host bug while serving its vGPU; vGPU quarantined (other VMs continue)",
            fe.name()
        );
        // Its doorbells are no longer served (level-triggered epoll would
        // otherwise wake this thread for them forever).
        for i in 0..NUM_VHQD {
            let fd = fe.doorbell_eventfd(i).as_raw_fd();
            let _ = self
                .epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
        // The front end's error vector is raised by the service thread
        // (not under this lock: the VM's MSI-X lock is its vCPUs').
        c.calls.push(Pending {
            fe,
            vm,
            vhqd: 0,
            call: FeCall::Quarantine,
        });
        c.quarantined += 1;
        let last = c.bind.scheduler().vm_stats(vm);
        c.tele.vm_removed(vm, last);
        let now = self.now();
        let mut out = Vec::new();
        let r = catch_unwind(AssertUnwindSafe(|| {
            let _ = c.bind.remove_vm(c.gpu.as_mut(), now, vm, &mut out);
        }));
        if r.is_err() {
            log::error!("arbiter: removing quarantined vm {vm} panicked");
        }
        self.deliver(c, out);
    }

    /// Queues a front-end call for VM `v` (if it still has a front end).
    fn push_call(c: &mut Core, vm: VmId, vhqd: usize, call: FeCall) {
        if let Some(fe) = c.vms.get(vm).and_then(|s| s.fe.clone()) {
            c.calls.push(Pending { fe, vm, vhqd, call });
        }
    }

    fn request(&self, c: &mut Core, vm: VmId, req: VgpuRequest) {
        let now = self.now();
        let v = vm;
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
                if c.vms[v].guard.quarantined() {
                    Self::push_call(c, vm, vhqd, FeCall::LoadRefused(error::QUARANTINED));
                    return;
                }
                let q = QueueId(c.next_qid);
                c.next_qid += 1;
                let prio = mqd.queue_priority().min(15) as u8;
                let wptr_poll = mqd.wptr_poll_addr();
                let Some(mem) = c.vms[v].mem.clone() else {
                    return;
                };
                if let Err(e) =
                    c.bind
                        .add_queue(vm, q, (vm, vhqd as u8), prio, V9Mqd::clone(&mqd), mem)
                {
                    // Only a VM being removed gets here (queue ids are
                    // fresh, priorities clamped).
                    log::warn!("vm {vm}: vHQD {vhqd}: load refused: {e}");
                    Self::push_call(c, vm, vhqd, FeCall::LoadRefused(error::BAD_POINTERS));
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
                        Self::push_call(c, vm, vhqd, FeCall::LoadRefused(0));
                    }
                    return;
                };
                let _ = c
                    .bind
                    .remove_queue(c.gpu.as_mut(), now, q, Some(mode), &mut out);
            }
            VgpuRequest::Refused { vhqd, code } => {
                // Refused by the front end (bad MQD): no queue, counted only.
                if vhqd < NUM_VHQD && code != 0 {
                    c.tele.load_refused(vm, code, 1);
                }
            }
        }
        self.deliver(c, out);
    }

    /// The write index of vHQD `vhqd` of VM `v`: from its poll address in
    /// guest memory, as the CP reads it; poll address 0 is "none"
    /// (docs/vgpu-abi.md): the write index stays the MQD's.
    fn read_wptr(c: &Core, v: VmId, vhqd: usize, q: QueueId) -> Option<u64> {
        let s = &c.vms[v];
        match s.wptr_poll[vhqd] {
            0 => Some(c.bind.mqd(q).map_or(0, V9Mqd::write_index)),
            poll => s.mem.as_ref()?.read_u64(poll).ok(),
        }
    }

    /// A doorbell of vHQD `vhqd`: the write index is read and the binding
    /// decides (a preemption is handed to the backend right there); the
    /// doorbell eventfd is cleared afterwards, then the write index read
    /// again (a doorbell rung in between is not lost). No allocation and no
    /// front-end call on this path.
    ///
    /// A preemption prepared for this vHQD ([`Binding::arm_doorbell`]) with
    /// nothing changed since goes to the GPU right after the write index
    /// is read, before the scheduler hears of the doorbell.
    fn doorbell(&self, c: &mut Core, vm: VmId, vhqd: usize) {
        let v = vm;
        // Reads (and resets) the doorbell's eventfd: the number of guest
        // writes folded into this wake-up (KVM signals 1 per write).
        let clear = |c: &Core| -> u64 {
            c.vms[v]
                .fe
                .as_ref()
                .and_then(|fe| fe.doorbell_eventfd(vhqd).read().ok())
                .unwrap_or(0)
        };
        let Some(q) = c.vms[v].queue[vhqd] else {
            clear(c);
            Self::push_call(c, vm, vhqd, FeCall::StrayDoorbell);
            return;
        };
        let now = self.now();
        let read_at = Instant::now();
        let mut out = std::mem::take(&mut c.notices);
        match Self::read_wptr(c, v, vhqd, q) {
            Some(wptr) => {
                let _ = c.bind.take_preempt_issued();
                let Core {
                    recent, bind, gpu, ..
                } = &mut *c;
                if let Some(r) = recent
                    .iter()
                    .find(|r| (r.vm, r.vhqd, r.queue) == (vm, vhqd, q))
                {
                    bind.fire_armed(gpu.as_mut(), now, &r.armed, wptr);
                }
                let rung = c.bind.doorbell(c.gpu.as_mut(), now, q, wptr, &mut out);
                c.tele.doorbell_published(vm, q.0, wptr, now);
                // Doorbells that moved nothing: the scheduler's stale ones
                // and those of a queue stalled on a packet it cannot run.
                let stale = rung.stale;
                if rung.preempted {
                    let ns = read_at.elapsed().as_nanos() as u64;
                    c.tele.doorbell_preempted(vm, ns);
                }
                if let Some(obs) = &c.observer {
                    let at = Instant::now();
                    let issued = c
                        .bind
                        .take_preempt_issued()
                        .map(|ns| self.epoch + Duration::from_nanos(ns));
                    obs(crate::arbiter::DoorbellSeen {
                        vm,
                        vhqd,
                        at,
                        preempted: rung.preempted,
                        issued,
                    });
                }
                let writes = clear(c);
                if stale > 0 {
                    // Counted per guest write, not per wake-up: every write
                    // folded into a wake-up that moved nothing moved nothing.
                    self.guard_note(c, vm, GuardEvent::StaleDoorbell, stale.max(writes));
                }
                if let Some(w) = Self::read_wptr(c, v, vhqd, q).filter(|w| *w != wptr) {
                    let again = self.now();
                    c.bind.doorbell(c.gpu.as_mut(), again, q, w, &mut out);
                    c.tele.doorbell_published(vm, q.0, w, again);
                }
            }
            None => {
                clear(c);
                let reason = QueueErrorReason::PointerAddrOutOfRange {
                    addr: c.vms[v].wptr_poll[vhqd],
                };
                c.tele.queue_error(vm, &reason);
                Self::push_call(c, vm, vhqd, FeCall::Error(reason));
                c.bind.queue_error(c.gpu.as_mut(), now, q, &mut out);
                self.guard_note(c, vm, GuardEvent::QueueError, 1);
            }
        }
        self.deliver_from(c, &mut out);
        c.notices = out;
        note_recent(&mut c.recent, vm, vhqd, q);
    }

    /// Carries out binding notices in order: bookkeeping here, front-end
    /// calls queued for the service thread (made after the lock is released).
    fn deliver(&self, c: &mut Core, mut out: Vec<Notice<Owner>>) {
        self.deliver_from(c, &mut out);
    }

    /// [`Self::deliver`] draining `out` (its allocation is kept).
    fn deliver_from(&self, c: &mut Core, out: &mut Vec<Notice<Owner>>) {
        // Guard events seen (no allocation unless a queue erred or a
        // save waited for waves without a save point).
        let mut guard: Vec<(VmId, GuardEvent, u64)> = Vec::new();
        for n in out.drain(..) {
            if let Notice::ArmTimer { at } = n {
                c.timer_at = Some(at);
                continue;
            }
            let Some((q, (vm, vhqd))) = n.queue_owner() else {
                continue;
            };
            let (v, i) = (vm, vhqd as usize);
            c.tele.notice(self.now(), &n, vm, c.gpu.as_ref());
            let Some(s) = c.vms.get_mut(v) else {
                continue;
            };
            if i >= NUM_VHQD {
                continue;
            }
            if s.quarantined {
                // Its queues are being removed; nothing reaches it any more.
                if let Notice::Removed { .. } = n {
                    if s.queue[i] == Some(q) {
                        s.queue[i] = None;
                    }
                }
                continue;
            }
            let call = match n {
                Notice::Mapped { .. } => FeCall::Hqd(true),
                Notice::Unmapped { save_wait_ns, .. } => {
                    if save_wait_ns > 0 {
                        guard.push((vm, GuardEvent::SaveWait, save_wait_ns));
                    }
                    FeCall::Hqd(false)
                }
                Notice::Completed {
                    dispatch_id,
                    signal,
                    ..
                } => FeCall::Completed {
                    queue: q,
                    dispatch_id,
                    signal,
                },
                Notice::QueueError { reason, .. } => {
                    let what = match reason {
                        QueueErrorReason::PreemptionTimeout { .. } => GuardEvent::Reset,
                        _ => GuardEvent::QueueError,
                    };
                    guard.push((vm, what, 1));
                    FeCall::Error(reason)
                }
                Notice::MapRefused { error: e, .. } => {
                    log::warn!("vm {vm}: vHQD {i}: map refused: {e}");
                    continue;
                }
                Notice::Removed { mqd, .. } => {
                    if s.queue[i] != Some(q) {
                        continue;
                    }
                    s.queue[i] = None;
                    FeCall::Unloaded {
                        mqd_addr: s.mqd_addr[i],
                        mqd,
                    }
                }
                // Telemetry's alone (the guest is not told).
                Notice::Preempted { .. } | Notice::Aged { .. } | Notice::ArmTimer { .. } => {
                    continue
                }
            };
            Self::push_call(c, vm, i, call);
            Self::release_if_gone(c, v);
        }
        for (vm, what, n) in guard {
            self.guard_note(c, vm, what, n);
        }
        c.tele.after(self.now(), &c.bind, c.gpu.as_ref());
        self.cv.notify_all();
    }

    // ---- operator lifecycle controls (pause, per-VM slice) ---------------

    /// Pauses a VM's GPU work: every mapped queue of it is unmapped with
    /// SaveWaves (CWSR) and none is mapped again until [`resume_vm`](Self::resume_vm).
    /// Doorbells rung meanwhile are recorded. Pausing a paused VM changes
    /// nothing.
    pub fn pause_vm(&self, vm: VmId) -> Result<(), SchedError> {
        self.live(vm)?;
        self.control(|b| b.set_vm_paused(vm, true))
    }

    /// Resumes a paused VM: its saved queues are eligible again (restored
    /// exactly where they stopped).
    pub fn resume_vm(&self, vm: VmId) -> Result<(), SchedError> {
        self.live(vm)?;
        self.control(|b| b.set_vm_paused(vm, false))
    }

    /// Sets the VM's slice length (`None`: its priority level's quantum).
    pub fn set_quantum(&self, vm: VmId, quantum: Option<Duration>) -> Result<(), SchedError> {
        self.live(vm)?;
        let ns = quantum.map(|d| d.as_nanos().min(u128::from(u64::MAX)) as Nanos);
        self.control(|b| b.set_vm_quantum(vm, ns))
    }

    /// The VM's pause state and slice override (`None` once removed).
    pub fn vm_controls(&self, vm: VmId) -> Option<(bool, Option<Duration>)> {
        let c = lock(&self.core);
        c.vms.live(vm)?;
        let s = c.bind.scheduler();
        let id = vm;
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
    fn live(&self, vm: VmId) -> Result<(), SchedError> {
        lock(&self.core).vms.live_mut(vm).map(|_| ())
    }

    // ---- preemption timeout (issue 11) -----------------------------------

    /// Sets VM `vm`'s preemption timeout live: a dequeue of one of its
    /// queues (scheduler preemption or the guest's own) that has not
    /// finished this long after the request resets that queue only; it
    /// reads `CP_HQD_ERROR` = [`error::PREEMPTION_TIMEOUT`]. Applies to
    /// dequeues requested from now on. Range: [`PREEMPT_TIMEOUT_MS_RANGE`].
    pub fn set_preempt_timeout(&self, vm: VmId, timeout: Duration) -> Result<(), ArbiterError> {
        let ms = timeout.as_millis();
        if ms < u128::from(*PREEMPT_TIMEOUT_MS_RANGE.start())
            || ms > u128::from(*PREEMPT_TIMEOUT_MS_RANGE.end())
        {
            return Err(ArbiterError::PreemptTimeout(timeout));
        }
        let mut c = lock(&self.core);
        if c.vms.live(vm).is_none() {
            return Err(SchedError::NoVm(vm).into());
        }
        let ns = timeout.as_nanos().min(u128::from(u64::MAX)) as Nanos;
        c.bind.set_preempt_timeout(vm, ns)?;
        Ok(())
    }

    /// VM `vm`'s preemption timeout (`None` once removed or unknown).
    pub fn preempt_timeout(&self, vm: VmId) -> Option<Duration> {
        let c = lock(&self.core);
        c.vms.live(vm)?;
        c.bind.preempt_timeout(vm).map(Duration::from_nanos)
    }

    /// VM `vm`'s preemption timeout in force now: its own
    /// ([`GpuArbiter::preempt_timeout`]) shortened by its recent
    /// preemption timeouts (`crate::binding::HangEscalation`, issue 21).
    /// `None` once removed or unknown.
    pub fn effective_preempt_timeout(&self, vm: VmId) -> Option<Duration> {
        let now = self.now();
        let c = lock(&self.core);
        c.vms.live(vm)?;
        c.bind
            .effective_preempt_timeout(vm, now)
            .map(Duration::from_nanos)
    }

    // ---- misbehaving-VM guard (issue 11) ---------------------------------

    /// Counts a guard event of VM `vm`; past a limit, quarantines it (one
    /// log line; its loads are refused from now on).
    fn guard_note(&self, c: &mut Core, vm: VmId, what: GuardEvent, n: u64) {
        let now = self.now();
        // A removed VM whose history a later registration resumed: that
        // one's guard counts it (its queues were still draining).
        let own = vm;
        let vm = Self::heir_of(c, own);
        if what == GuardEvent::Reset {
            if let Some(s) = c.vms.get_mut(vm) {
                if s.hangs.len() >= MAX_CARRIED_HANGS {
                    s.hangs.pop_front();
                }
                s.hangs.push_back(now);
                if vm != own && !s.removed {
                    // A forwarded timeout escalates the heir's next one
                    // (the binding counted it for the removed VM).
                    c.bind.resume_hangs(vm, &[now]);
                }
            }
        }
        let Some(s) = c.vms.get_mut(vm) else {
            return;
        };
        let trip = s.guard.record(now, what, n);
        if s.removed {
            // Its figures were taken at the removal: keep `/metrics` whole.
            let totals = s.guard.totals();
            c.tele.vm_guard_final(vm, totals);
        }
        let Some(s) = c.vms.get_mut(vm) else {
            return;
        };
        if let Some(t) = trip {
            log::warn!(
                "vm {}: vGPU quarantined by the misbehaving-VM guard: {t}; new queue loads \
                 are refused (error {}) until the operator clears it",
                s.fe.as_ref().map_or("?", |f| f.name()),
                error::QUARANTINED
            );
            c.guard_quarantines += 1;
        }
    }

    /// The registration that carries removed VM `vm`'s history (following
    /// a few resumptions), else `vm` itself.
    fn heir_of(c: &Core, mut vm: VmId) -> VmId {
        for _ in 0..8 {
            match c.vms.get(vm).filter(|s| s.removed).and_then(|s| s.heir) {
                Some(h) => vm = h,
                None => break,
            }
        }
        vm
    }

    /// VM `vm`'s guard: limits, counts in the window, and whether (why,
    /// when) it is quarantined. `None` once removed or unknown.
    pub fn guard_status(&self, vm: VmId) -> Option<GuardStatus> {
        let now = self.now();
        let mut c = lock(&self.core);
        self.count_refused(&mut c);
        let s = c.vms.live_mut(vm).ok()?;
        Some(s.guard.status(now))
    }

    /// Lifts VM `vm`'s guard quarantine (loads are accepted again) and
    /// forgets its counts in the window. Returns whether it was quarantined.
    /// A host-bug quarantine stays: only removing the vGPU lifts it
    /// (docs/architecture.md, "One quarantine, with a reason").
    pub fn clear_quarantine(&self, vm: VmId) -> Result<bool, ArbiterError> {
        let mut c = lock(&self.core);
        let s = c.vms.live_mut(vm)?;
        let was = s.guard.clear();
        if was {
            log::info!(
                "vm {}: guard quarantine cleared by the operator",
                s.fe.as_ref().map_or("?", |f| f.name())
            );
        }
        Ok(was)
    }

    /// Replaces VM `vm`'s guard limits (validated); counts restart, a
    /// quarantine stays until cleared.
    pub fn set_guard(&self, vm: VmId, limits: GuardConfig) -> Result<(), ArbiterError> {
        limits.validate()?;
        let mut c = lock(&self.core);
        let s = c.vms.live_mut(vm)?;
        s.guard.set_limits(limits);
        Ok(())
    }

    // ---- telemetry (issue 12) -------------------------------------------

    /// The Prometheus text exposition of the fleet's GPU (for `GET
    /// /metrics`, content type [`crate::metrics::CONTENT_TYPE`]); every
    /// family is described in `docs/metrics.md`.
    pub fn metrics_text(&self) -> String {
        self.metrics_text_with(&crate::metrics::MetricsInfo::local())
    }

    /// [`GpuArbiter::metrics_text`] with the process's device labels, build
    /// and VM states (`info`); adds `gpu_compute_partition_type`, each VM's
    /// quarantine and guard counts.
    pub fn metrics_text_with(&self, info: &crate::metrics::MetricsInfo) -> String {
        let mut c = lock(&self.core);
        self.count_refused(&mut c);
        // As `vm_status`: bring GPU time up to now first.
        let now = self.now();
        let core = &mut *c;
        let mut out = Vec::new();
        core.bind.tick(core.gpu.as_mut(), now, &mut out);
        self.deliver(core, out);
        let guard = c
            .vms
            .iter()
            .map(|(i, s)| {
                let quarantine =
                    crate::metrics::QuarantineReason::of(s.quarantined, s.guard.trip());
                let f = crate::metrics::VmGuardFigures {
                    quarantine,
                    guard_totals: s.guard.totals(),
                };
                (i, f)
            })
            .collect();
        let ctx = crate::metrics::RenderContext {
            info,
            partition_type: crate::metrics::partition_type(self.topo.partition_mode),
            guard: &guard,
            guard_quarantines: c.guard_quarantines,
        };
        let text = crate::metrics::render_with(&c.tele, &c.bind, &ctx);
        drop(c);
        let _ = self.requests.kick.write(1);
        text
    }

    /// The HQD-slot timeline of the last `window` (as much as the ring
    /// keeps: [`timeline::RingLimits::default`]), times in ns since the
    /// arbiter started. For `GET /api/v1/timeline?seconds=N`: serve
    /// [`timeline::Timeline::to_json`] or [`timeline::render_svg`].
    pub fn timeline(&self, window: Duration) -> timeline::Timeline {
        let c = lock(&self.core);
        let window_ns = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        c.tele.timeline(self.now(), Some(window_ns), &c.bind)
    }

    /// VM `vm`'s queue errors by code (`CP_HQD_ERROR` number as text, or
    /// `map_refused`), kept after the VM is removed (for the operator API's
    /// `queue_errors`). `None` for a VM the arbiter never had.
    pub fn vm_queue_errors(&self, vm: VmId) -> Option<std::collections::BTreeMap<String, u64>> {
        let mut c = lock(&self.core);
        self.count_refused(&mut c);
        let errors = c
            .tele
            .vms()
            .find(|(id, _)| **id == vm)
            .map(|(_, t)| t.queue_errors.clone());
        errors
    }

    /// VM `vm`'s packet latency (doorbell to completion) since it was
    /// added: `(p50, p99)` in seconds (1% precision, up to
    /// [`crate::telemetry::LATENCY_LIMIT_NS`]), kept after the VM is
    /// removed. `None` for a VM the arbiter never had or without
    /// completions.
    pub fn vm_packet_latency(&self, vm: VmId) -> Option<(f64, f64)> {
        let c = lock(&self.core);
        let (_, t) = c.tele.vms().find(|(id, _)| **id == vm)?;
        let s = &t.packet_latency_sketch;
        Some((s.quantile(0.5)?, s.quantile(0.99)?))
    }
}

#[cfg(test)]
#[path = "arbiter_tests.rs"]
mod tests;

impl GpuArbiter {
    /// Moves the loads refused by front ends into telemetry.
    fn count_refused(&self, c: &mut Core) {
        let taken = {
            let mut r = self
                .requests
                .refused
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if r.is_empty() {
                return;
            }
            std::mem::take(&mut *r)
        };
        for ((vm, code), n) in taken {
            c.tele.load_refused(vm, code, n);
            // A refused load is a queue error for the guard (issue 21),
            // except the refusals the guard or a device loss caused.
            if code != error::QUARANTINED && code != error::DEVICE_LOST {
                self.guard_note(c, vm, GuardEvent::QueueError, n);
            }
        }
    }

    /// VMs whose telemetry (histograms, queue errors, `/metrics` series) is
    /// kept: the live ones and at most
    /// [`crate::telemetry::RETAINED_REMOVED_VMS`] removed ones.
    pub fn telemetry_vm_count(&self) -> usize {
        lock(&self.core).tele.vm_count()
    }

    /// Slots in the arbiter's VM table: the live VMs, those whose queues
    /// are still going, and at most
    /// [`crate::telemetry::RETAINED_REMOVED_VMS`] removed ones.
    pub fn vm_slot_count(&self) -> usize {
        lock(&self.core).vms.len()
    }

    /// vHQDs of VM `vm` with a queue loaded (`None` once removed or
    /// unknown).
    pub fn vm_queue_count(&self, vm: VmId) -> Option<usize> {
        let c = lock(&self.core);
        let s = c.vms.live(vm)?;
        Some(s.queue.iter().filter(|q| q.is_some()).count())
    }

    /// Per-VM entries of the binding and the scheduler (see
    /// [`Binding::vm_entries`]): bounded by the live and draining VMs.
    pub fn vm_entry_count(&self) -> usize {
        lock(&self.core).bind.vm_entries()
    }
}

#[cfg(test)]
#[path = "arbiter_rss_tests.rs"]
mod rss_tests;
