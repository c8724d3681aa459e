//! The mediator: the guest-visible virtual GPU of every VM (registers,
//! doorbells, waits; `docs/vgpu-abi.md`) joined to the scheduler and the
//! physical GPU in real time.
//!
//! A guest loads a virtual HQD by pointing it at an MQD in its memory; the
//! mediator copies the MQD into a host-owned shadow, checks it, and adds the
//! queue to the [`Scheduler`]. Doorbells become scheduler events (and, for a
//! queue on a physical HQD, a doorbell to the GPU); scheduler actions become
//! `map`/`unmap` calls on the [`SimGpu`], which runs under a
//! [`RealTimeDriver`]; GPU events feed the scheduler and wake waiting vCPUs.
//!
//! Locking: one state mutex; it is always taken before the GPU's (through
//! `RealTimeDriver::with`), never the other way round. GPU events arrive on
//! the driver thread outside the GPU lock.

use crate::backend::{
    DequeueMode, GpuEvent, MapRequest, PhysGpu, QueueErrorReason, SlotId as PhysSlot,
};
use crate::mem::DmaMemory;
use crate::sim::{check_mqd, RealTimeDriver, SimGpu};
use crate::topology::{GpuTopology, TopologyError};
use abi::mqd::{V9Mqd, MQD_BYTES};
use abi::queue::AMD_SIGNAL_VALUE;
use scheduler::{
    Action, Event, Nanos, Policy, QueueId, SchedConfig, SchedError, Scheduler, SlotDesc, SlotId,
    UnmapMode, VmId, VmParams,
};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use abi::vgpu::{error, reg, wait_result as wait, NUM_VHQD, VGPU_ABI_VERSION, VGPU_ID_VALUE};

/// Register window size.
pub const REGS_BYTES: u64 = abi::vgpu::WINDOW_BYTES;
/// Doorbell window size.
pub const DOORBELL_BYTES: u64 = abi::vgpu::WINDOW_BYTES;
/// Longest paravirtual wait.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Simulated-GPU events processed per lock hold in real time (about 0.5 ms
/// of host time at ~120 ns per workgroup): a guest that floods the model with
/// tiny workgroups makes it lag wall time but cannot block other VMs'
/// register accesses behind one long catch-up.
pub const REALTIME_EVENT_BUDGET: usize = 4096;

/// `CP_HQD_ERROR` code of a queue error reason (docs/vgpu-abi.md).
pub fn error_code(r: &QueueErrorReason) -> u32 {
    use QueueErrorReason::*;
    match r {
        BadMqdHeader(_) => error::BAD_MQD_HEADER,
        NotAql => error::NOT_AQL,
        RingSize { .. } => error::RING_SIZE,
        RingOutOfRange { .. } => error::RING_OUT_OF_RANGE,
        PointerAddrOutOfRange { .. } => error::POINTER_ADDR_OUT_OF_RANGE,
        BadPointers => error::BAD_POINTERS,
        WptrBeyondRing { .. } => error::WPTR_BEYOND_RING,
        WptrBackwards { .. } => error::WPTR_BACKWARDS,
        UnsupportedPacket(_) => error::UNSUPPORTED_PACKET,
        BadDispatch { .. } => error::BAD_DISPATCH,
        DescriptorOutOfRange { .. } => error::DESCRIPTOR_OUT_OF_RANGE,
        BadDescriptor { .. } => error::BAD_DESCRIPTOR,
        KernargOutOfRange { .. } => error::KERNARG_OUT_OF_RANGE,
        DataOutOfRange { .. } => error::DATA_OUT_OF_RANGE,
        SignalOutOfRange { .. } => error::SIGNAL_OUT_OF_RANGE,
        CwsrTooSmall { .. } => error::CWSR_TOO_SMALL,
        CwsrOutOfRange { .. } => error::CWSR_OUT_OF_RANGE,
        BadCwsrLayout { .. } => error::BAD_CWSR_LAYOUT,
        BadSavedState(_) => error::BAD_SAVED_STATE,
    }
}

/// A VM registered with the mediator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VgpuHandle(pub u32);

/// Mediator set-up errors.
#[derive(Debug, thiserror::Error)]
pub enum MediatorError {
    /// Invalid topology.
    #[error("gpu: {0}")]
    Topology(#[from] TopologyError),
    /// Scheduler refused.
    #[error("scheduler: {0}")]
    Sched(#[from] SchedError),
}

#[derive(Default, Clone)]
struct VHqd {
    mqd_base: u64,
    qid: Option<QueueId>,
    /// Host-owned copy of the guest MQD (updated from dequeues).
    shadow: Option<V9Mqd>,
    slot: Option<SlotId>,
    error: u32,
    rptr: u64,
}

struct VmEntry {
    name: String,
    mem: Arc<dyn DmaMemory>,
    vhqd: [VHqd; NUM_VHQD],
    wait_addr_lo: u32,
    wait_result: u32,
    removed: bool,
}

struct State {
    sched: Scheduler,
    vms: Vec<VmEntry>,
    /// Scheduler queue -> (vm, vHQD index).
    owners: HashMap<QueueId, (usize, usize)>,
    next_qid: u64,
    timer_at: Option<Nanos>,
    completions: u64,
    stopping: bool,
}

/// Counters of a mediator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MediatorStats {
    /// Packets completed on the GPU for any VM.
    pub completions: u64,
    /// Scheduler preemptions.
    pub preemptions: u64,
    /// Scheduler maps.
    pub maps: u64,
    /// Doorbells that did not move the write pointer (no scheduler decision).
    pub stale_doorbells: u64,
}

/// The mediator. Create with [`Mediator::start`].
pub struct Mediator {
    topo: GpuTopology,
    st: Mutex<State>,
    /// Notified on completions, errors, dequeues and timer changes.
    cv: Condvar,
    driver: Mutex<Option<RealTimeDriver<SimGpu>>>,
    timer_thread: Mutex<Option<JoinHandle<()>>>,
    epoch: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Mediator {
    /// Starts the simulated GPU (real time), the scheduler and its timer thread.
    pub fn start(
        topo: GpuTopology,
        cfg: SchedConfig,
        seed: u64,
    ) -> Result<Arc<Self>, MediatorError> {
        let mut gpu = SimGpu::new(topo.clone(), seed)?;
        gpu.set_event_budget(Some(REALTIME_EVENT_BUDGET));
        let sched = Scheduler::new(cfg, slot_descs(&topo))?;
        let m = Arc::new(Mediator {
            topo,
            st: Mutex::new(State {
                sched,
                vms: Vec::new(),
                owners: HashMap::new(),
                next_qid: 0,
                timer_at: None,
                completions: 0,
                stopping: false,
            }),
            cv: Condvar::new(),
            driver: Mutex::new(None),
            timer_thread: Mutex::new(None),
            epoch: Instant::now(),
        });
        let weak: Weak<Mediator> = Arc::downgrade(&m);
        let driver = RealTimeDriver::start(gpu, move |ev| {
            if let Some(m) = weak.upgrade() {
                m.gpu_event(ev);
            }
        });
        *lock(&m.driver) = Some(driver);
        let weak = Arc::downgrade(&m);
        let t = std::thread::Builder::new()
            .name("hqdmux-sched-timer".into())
            .spawn(move || timer_loop(weak))
            .expect("spawn scheduler timer thread");
        *lock(&m.timer_thread) = Some(t);
        Ok(m)
    }

    /// Stops the GPU and timer threads (VMs should be removed first).
    pub fn shutdown(&self) {
        lock(&self.st).stopping = true;
        self.cv.notify_all();
        if let Some(t) = lock(&self.timer_thread).take() {
            let _ = t.join();
        }
        if let Some(d) = lock(&self.driver).take() {
            d.stop();
        }
    }

    /// The topology.
    pub fn topology(&self) -> &GpuTopology {
        &self.topo
    }

    /// Counters.
    pub fn stats(&self) -> MediatorStats {
        let st = lock(&self.st);
        let s = st.sched.stats();
        MediatorStats {
            completions: st.completions,
            preemptions: s.preemptions,
            maps: s.maps,
            stale_doorbells: s.stale_doorbells,
        }
    }

    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Registers a VM (its memory, scheduling parameters).
    pub fn add_vm(
        &self,
        name: &str,
        mem: Arc<dyn DmaMemory>,
        params: VmParams,
    ) -> Result<VgpuHandle, MediatorError> {
        let mut st = lock(&self.st);
        let id = st.vms.len();
        st.sched.add_vm(VmId(id as u32), params)?;
        st.vms.push(VmEntry {
            name: name.into(),
            mem,
            vhqd: Default::default(),
            wait_addr_lo: 0,
            wait_result: 0,
            removed: false,
        });
        Ok(VgpuHandle(id as u32))
    }

    /// Unregisters a VM: its queues are reset-unmapped; returns when no slot
    /// holds one of them any more.
    pub fn remove_vm(&self, vm: VgpuHandle) {
        let mut st = lock(&self.st);
        let v = vm.0 as usize;
        if st.vms.get(v).is_none_or(|e| e.removed) {
            return;
        }
        st.vms[v].removed = true;
        let _ = st.sched.remove_vm(VmId(vm.0));
        let now = self.now();
        st = self.pump(st, Event::Tick { now });
        let deadline = Instant::now() + Duration::from_secs(5);
        while st.owners.values().any(|(o, _)| *o == v) && Instant::now() < deadline {
            st = self
                .cv
                .wait_timeout(st, Duration::from_millis(20))
                .unwrap()
                .0;
        }
        self.cv.notify_all();
    }

    /// Changes a VM's priority live (applies at once).
    pub fn set_priority(&self, vm: VgpuHandle, priority: u8) -> Result<(), SchedError> {
        let mut st = lock(&self.st);
        st.sched.set_vm_priority(VmId(vm.0), priority)?;
        let now = self.now();
        drop(self.pump(st, Event::Tick { now }));
        Ok(())
    }

    /// Changes a VM's weight live (applies at once).
    pub fn set_weight(&self, vm: VgpuHandle, weight: u32) -> Result<(), SchedError> {
        let mut st = lock(&self.st);
        st.sched.set_vm_weight(VmId(vm.0), weight)?;
        let now = self.now();
        drop(self.pump(st, Event::Tick { now }));
        Ok(())
    }

    /// Changes the scheduling policy live (applies at once; mapped queues
    /// stay mapped until the new policy decides otherwise).
    pub fn set_policy(&self, policy: Policy) {
        let mut st = lock(&self.st);
        st.sched.set_policy(policy);
        let now = self.now();
        drop(self.pump(st, Event::Tick { now }));
    }

    /// The current scheduling policy.
    pub fn policy(&self) -> Policy {
        lock(&self.st).sched.config().policy
    }

    /// A VM's current parameters and accounting (`None` once removed).
    pub fn vm_status(&self, vm: VgpuHandle) -> Option<(VmParams, scheduler::VmStats)> {
        let st = lock(&self.st);
        st.vms.get(vm.0 as usize).filter(|e| !e.removed)?;
        // Bring the scheduler's clock to now: GPU time then includes the
        // period a queue has been running since the last event (a long
        // kernel otherwise reads as 0 until it completes).
        let now = self.now();
        let st = self.pump(st, Event::Tick { now });
        let id = VmId(vm.0);
        Some((st.sched.vm_params(id)?, st.sched.vm_stats(id)?))
    }

    // ---- guest register and doorbell access ---------------------------

    /// Guest read of a vGPU register.
    pub fn reg_read(&self, vm: VgpuHandle, offset: u64) -> u32 {
        let offset = offset as usize;
        let st = lock(&self.st);
        let Some(v) = st.vms.get(vm.0 as usize) else {
            return 0;
        };
        match offset {
            reg::VGPU_ID => VGPU_ID_VALUE,
            reg::VGPU_VERSION => VGPU_ABI_VERSION,
            reg::NUM_VHQD => NUM_VHQD as u32,
            reg::XCCS => self.topo.xccs_per_partition(),
            reg::CUS_PER_XCC => self.topo.cus_per_xcc,
            reg::SES_PER_XCC => self.topo.ses_per_xcc,
            reg::CTX_SAVE_SIZE => self.topo.ctx_save_bytes_per_xcc(),
            reg::WAIT_RESULT => v.wait_result,
            o if o >= reg::HQD_BASE => {
                let Some((i, r)) = vhqd_reg(o) else { return 0 };
                let h = &v.vhqd[i];
                match r {
                    reg::CP_MQD_BASE_ADDR => h.mqd_base as u32,
                    reg::CP_MQD_BASE_ADDR_HI => (h.mqd_base >> 32) as u32,
                    reg::CP_HQD_ACTIVE => h.qid.is_some() as u32,
                    reg::CP_HQD_ERROR => h.error,
                    reg::CP_HQD_STATE => match (h.qid, h.slot) {
                        (None, _) => 0,
                        (Some(_), None) => 1,
                        (Some(_), Some(_)) => 2,
                    },
                    reg::CP_HQD_PQ_RPTR => h.rptr as u32,
                    _ => 0,
                }
            }
            _ => 0,
        }
    }

    /// Guest write of a vGPU register. Blocks for waits and dequeues.
    pub fn reg_write(&self, vm: VgpuHandle, offset: u64, value: u32) {
        let offset = offset as usize;
        let v = vm.0 as usize;
        let mut st = lock(&self.st);
        if st.vms.get(v).is_none_or(|e| e.removed) {
            return;
        }
        match offset {
            reg::WAIT_SIGNAL_LO => st.vms[v].wait_addr_lo = value,
            reg::WAIT_SIGNAL_HI => {
                let addr = (u64::from(value) << 32) | u64::from(st.vms[v].wait_addr_lo);
                let r = self.wait_signal(st, v, addr);
                lock(&self.st).vms[v].wait_result = r;
            }
            o if o >= reg::HQD_BASE => {
                let Some((i, r)) = vhqd_reg(o) else {
                    log::warn!(
                        "vm {}: vGPU write to unknown register {o:#x}",
                        st.vms[v].name
                    );
                    return;
                };
                match r {
                    reg::CP_MQD_BASE_ADDR => {
                        let h = &mut st.vms[v].vhqd[i];
                        h.mqd_base = (h.mqd_base & !0xFFFF_FFFF) | u64::from(value);
                    }
                    reg::CP_MQD_BASE_ADDR_HI => {
                        let h = &mut st.vms[v].vhqd[i];
                        h.mqd_base = (h.mqd_base & 0xFFFF_FFFF) | (u64::from(value) << 32);
                    }
                    reg::CP_HQD_ACTIVE if value & 1 == 1 => self.load(st, v, i),
                    reg::CP_HQD_DEQUEUE_REQUEST if value != 0 => self.unload(st, v, i),
                    _ => log::debug!(
                        "vm {}: vGPU write {o:#x} = {value:#x} ignored",
                        st.vms[v].name
                    ),
                }
            }
            o => log::warn!(
                "vm {}: vGPU write to read-only or unknown register {o:#x}",
                st.vms[v].name
            ),
        }
    }

    /// Guest write to the doorbell window.
    pub fn doorbell(&self, vm: VgpuHandle, offset: u64) {
        let v = vm.0 as usize;
        let i = offset as usize / abi::vgpu::DOORBELL_STRIDE;
        let st = lock(&self.st);
        let Some(e) = st.vms.get(v).filter(|e| !e.removed) else {
            return;
        };
        if i >= NUM_VHQD {
            log::warn!("vm {}: doorbell {i} does not exist", e.name);
            return;
        }
        let h = &e.vhqd[i];
        let (Some(q), Some(mqd)) = (h.qid, h.shadow.as_ref()) else {
            log::debug!("vm {}: doorbell {i} of an unloaded vHQD ignored", e.name);
            return;
        };
        if h.error != 0 {
            return;
        }
        let now = self.now();
        // The CP reads the write pointer from the poll address; so does the
        // scheduler, which drops doorbells that do not move it.
        let wptr = match e.mem.read_u64(mqd.wptr_poll_addr()) {
            Ok(w) => w,
            Err(_) => {
                // Checked at load, so only a memory change gets here.
                log::warn!("vm {}: vHQD {i}: write pointer unreadable", e.name);
                let mut st = st;
                st.vms[v].vhqd[i].error = error::POINTER_ADDR_OUT_OF_RANGE;
                self.cv.notify_all();
                drop(self.pump(st, Event::QueueError { queue: q, now }));
                return;
            }
        };
        if let Some(slot) = h.slot {
            self.with_gpu(|g, t| g.doorbell(t, PhysSlot(slot.0), wptr));
        }
        drop(self.pump(
            st,
            Event::Doorbell {
                queue: q,
                wptr,
                now,
            },
        ));
    }

    // ---- internals -----------------------------------------------------

    fn with_gpu<R>(&self, f: impl FnOnce(&mut SimGpu, Nanos) -> R) -> R {
        let d = lock(&self.driver);
        let d = d.as_ref().expect("mediator running");
        d.with(f)
    }

    fn load<'a>(&'a self, mut st: MutexGuard<'a, State>, v: usize, i: usize) {
        if st.vms[v].vhqd[i].qid.is_some() {
            return;
        }
        let base = st.vms[v].vhqd[i].mqd_base;
        let name = st.vms[v].name.clone();
        let mut b = [0u8; MQD_BYTES];
        if st.vms[v].mem.read(base, &mut b).is_err() {
            log::warn!("vm {name}: vHQD {i}: MQD at {base:#x} is outside VM memory");
            st.vms[v].vhqd[i].error = error::MQD_ADDRESS;
            self.cv.notify_all();
            return;
        }
        let mqd = V9Mqd::from_bytes(&b);
        if let Err(r) = check_mqd(&self.topo, &mqd, st.vms[v].mem.as_ref()) {
            log::warn!("vm {name}: vHQD {i}: MQD refused: {r}");
            st.vms[v].vhqd[i].error = error_code(&r);
            self.cv.notify_all();
            return;
        }
        let q = QueueId(st.next_qid);
        st.next_qid += 1;
        let prio = mqd.queue_priority().min(15) as u8;
        if let Err(e) = st.sched.add_queue(VmId(v as u32), q, prio) {
            log::warn!("vm {name}: vHQD {i}: {e}");
            return;
        }
        st.owners.insert(q, (v, i));
        let h = &mut st.vms[v].vhqd[i];
        h.qid = Some(q);
        h.rptr = mqd.read_index().unwrap_or(0);
        h.shadow = Some(mqd);
        h.error = 0;
        log::debug!("vm {name}: vHQD {i} loaded (MQD {base:#x}, queue {})", q.0);
    }

    fn unload<'a>(&'a self, mut st: MutexGuard<'a, State>, v: usize, i: usize) {
        let Some(q) = st.vms[v].vhqd[i].qid else {
            // Not loaded (perhaps a refused load): clear the sticky error.
            st.vms[v].vhqd[i] = VHqd::default();
            return;
        };
        let _ = st.sched.remove_queue(q);
        let now = self.now();
        st = self.pump(st, Event::Tick { now });
        let deadline = Instant::now() + Duration::from_secs(5);
        while st.owners.contains_key(&q) && Instant::now() < deadline {
            st = self
                .cv
                .wait_timeout(st, Duration::from_millis(20))
                .unwrap()
                .0;
        }
        st.vms[v].vhqd[i] = VHqd::default();
    }

    fn wait_signal<'a>(&'a self, mut st: MutexGuard<'a, State>, v: usize, addr: u64) -> u32 {
        let deadline = Instant::now() + WAIT_TIMEOUT;
        loop {
            let e = &st.vms[v];
            let val = match e.mem.read_u64(addr + AMD_SIGNAL_VALUE as u64) {
                Ok(x) => x as i64,
                Err(_) => return wait::BAD_SIGNAL,
            };
            if val <= 0 {
                return wait::DONE;
            }
            if e.vhqd.iter().any(|h| h.error != 0) {
                return wait::QUEUE_ERROR;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || st.stopping || e.removed {
                return wait::TIMEOUT;
            }
            st = self
                .cv
                .wait_timeout(st, left.min(Duration::from_millis(100)))
                .unwrap()
                .0;
        }
    }

    /// Feeds one event to the scheduler and carries out its actions (and the
    /// events those produce at once).
    fn pump<'a>(&'a self, mut st: MutexGuard<'a, State>, ev: Event) -> MutexGuard<'a, State> {
        let mut pending = vec![ev];
        while let Some(ev) = pending.pop() {
            st.sched.handle(ev);
            while let Some(a) = st.sched.poll_action() {
                self.action(&mut st, a, &mut pending);
            }
        }
        self.reap(&mut st);
        st
    }

    fn action(&self, st: &mut State, a: Action, pending: &mut Vec<Event>) {
        let now = self.now();
        match a {
            Action::Map { queue, slot } => {
                let Some(&(v, i)) = st.owners.get(&queue) else {
                    return;
                };
                let e = &mut st.vms[v];
                let mqd = e.vhqd[i]
                    .shadow
                    .clone()
                    .expect("loaded queue has a shadow MQD");
                let req = MapRequest {
                    slot: PhysSlot(slot.0),
                    tag: queue.0,
                    mqd,
                    mem: e.mem.clone(),
                };
                match self.with_gpu(|g, t| g.map(t, req)) {
                    Ok(()) => e.vhqd[i].slot = Some(slot),
                    Err(err) => {
                        log::warn!("vm {}: vHQD {i}: map refused: {err}", e.name);
                        if let crate::backend::GpuError::BadMqd(r) = err {
                            e.vhqd[i].error = error_code(&r);
                        }
                        // The slot was never loaded: report the error, and
                        // complete the dequeue that follows at once.
                        e.vhqd[i].slot = Some(slot);
                        pending.push(Event::QueueError { queue, now });
                        self.cv.notify_all();
                    }
                }
            }
            Action::Unmap { queue, slot, mode } => {
                let mode = match mode {
                    UnmapMode::Drain => DequeueMode::DrainPipe,
                    UnmapMode::Save => DequeueMode::SaveWaves,
                    UnmapMode::Reset => DequeueMode::ResetWaves,
                };
                let r = self.with_gpu(|g, t| g.unmap(t, PhysSlot(slot.0), mode));
                if r.is_err() {
                    // Never reached the GPU (refused map): done at once.
                    if let Some(&(v, i)) = st.owners.get(&queue) {
                        st.vms[v].vhqd[i].slot = None;
                    }
                    pending.push(Event::Unmapped {
                        queue,
                        has_work: false,
                        save_ns: 0,
                        now,
                    });
                }
            }
            Action::ArmTimer { at } => {
                st.timer_at = Some(at);
                self.cv.notify_all();
            }
        }
    }

    /// Forgets queues the scheduler dropped (removed and dequeued).
    fn reap(&self, st: &mut State) {
        let gone: Vec<QueueId> = st
            .owners
            .keys()
            .copied()
            .filter(|q| st.sched.queue_state(*q).is_none())
            .collect();
        for q in gone {
            st.owners.remove(&q);
            self.cv.notify_all();
        }
    }

    fn gpu_event(&self, ev: GpuEvent) {
        let mut st = lock(&self.st);
        let now = self.now();
        let q = QueueId(match &ev {
            GpuEvent::PacketCompleted { tag, .. }
            | GpuEvent::QueueIdle { tag, .. }
            | GpuEvent::Unmapped { tag, .. }
            | GpuEvent::QueueError { tag, .. } => *tag,
        });
        let owner = st.owners.get(&q).copied();
        match ev {
            GpuEvent::PacketCompleted { dispatch_id, .. } => {
                st.completions += 1;
                if let Some((v, i)) = owner {
                    st.vms[v].vhqd[i].rptr = dispatch_id + 1;
                }
                self.cv.notify_all();
            }
            GpuEvent::QueueIdle { .. } => {
                st = self.pump(st, Event::QueueIdle { queue: q, now });
            }
            GpuEvent::Unmapped {
                mqd,
                has_work,
                save_ns,
                ..
            } => {
                if let Some((v, i)) = owner {
                    let h = &mut st.vms[v].vhqd[i];
                    h.shadow = Some(*mqd);
                    h.slot = None;
                }
                st = self.pump(
                    st,
                    Event::Unmapped {
                        queue: q,
                        has_work,
                        save_ns,
                        now,
                    },
                );
                self.cv.notify_all();
            }
            GpuEvent::QueueError { reason, .. } => {
                if let Some((v, i)) = owner {
                    log::warn!("vm {}: vHQD {i}: queue error: {reason}", st.vms[v].name);
                    st.vms[v].vhqd[i].error = error_code(&reason);
                }
                st = self.pump(st, Event::QueueError { queue: q, now });
                self.cv.notify_all();
            }
        }
        drop(st);
    }
}

/// The scheduler's view of a topology's user HQD slots (`SlotId(i)` = slot i).
pub fn slot_descs(topo: &GpuTopology) -> Vec<SlotDesc> {
    topo.user_slots()
        .iter()
        .map(|s| SlotDesc {
            partition: s.partition,
            pipe: s.pipe,
            queue: s.queue,
        })
        .collect()
}

/// Offset within the register window -> (vHQD index, register).
fn vhqd_reg(o: usize) -> Option<(usize, usize)> {
    let rel = o.checked_sub(reg::HQD_BASE)?;
    let i = rel / reg::HQD_STRIDE;
    (i < NUM_VHQD).then_some((i, rel % reg::HQD_STRIDE))
}

/// Delivers scheduler timer ticks.
fn timer_loop(weak: Weak<Mediator>) {
    loop {
        let Some(m) = weak.upgrade() else { return };
        let mut st = lock(&m.st);
        if st.stopping {
            return;
        }
        let now = m.now();
        match st.timer_at {
            Some(at) if at <= now => {
                st.timer_at = None;
                drop(m.pump(st, Event::Tick { now }));
            }
            Some(at) => {
                let d = Duration::from_nanos(at - now).min(Duration::from_millis(50));
                drop(m.cv.wait_timeout(st, d).unwrap());
            }
            None => {
                drop(m.cv.wait_timeout(st, Duration::from_millis(50)).unwrap());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::SparseMemory;
    use crate::sim::testkit::{GuestQueue, TestVm};
    use abi::kernel::KernelKind;

    fn vm_with_queue(m: &Mediator, name: &str, prio: u8) -> (VgpuHandle, TestVm, GuestQueue) {
        let mem: Arc<dyn DmaMemory> = Arc::new(SparseMemory::new(1 << 32));
        let mut tvm = TestVm::with_memory(mem.clone(), 0x10_0000);
        let q = tvm.queue(m.topology(), 64, 0);
        let addr = q
            .mqd
            .get64(abi::mqd::CP_MQD_BASE_ADDR_LO, abi::mqd::CP_MQD_BASE_ADDR_HI);
        mem.write(addr, &q.mqd.to_bytes()).unwrap();
        let h = m
            .add_vm(
                name,
                mem,
                VmParams {
                    priority: prio,
                    ..Default::default()
                },
            )
            .unwrap();
        (h, tvm, q)
    }

    /// Offset of register `r` of vHQD `i`.
    fn hr(i: usize, r: usize) -> u64 {
        (reg::HQD_BASE + reg::HQD_STRIDE * i + r) as u64
    }

    fn load(m: &Mediator, h: VgpuHandle, i: usize, mqd_addr: u64) {
        let b = (reg::HQD_BASE + reg::HQD_STRIDE * i) as u64;
        m.reg_write(h, b + reg::CP_MQD_BASE_ADDR as u64, mqd_addr as u32);
        m.reg_write(
            h,
            b + reg::CP_MQD_BASE_ADDR_HI as u64,
            (mqd_addr >> 32) as u32,
        );
        m.reg_write(h, b + reg::CP_HQD_ACTIVE as u64, 1);
    }

    fn wait(m: &Mediator, h: VgpuHandle, signal: u64) -> u32 {
        m.reg_write(h, reg::WAIT_SIGNAL_LO as u64, signal as u32);
        m.reg_write(h, reg::WAIT_SIGNAL_HI as u64, (signal >> 32) as u32);
        m.reg_read(h, reg::WAIT_RESULT as u64)
    }

    fn mqd_addr(q: &GuestQueue) -> u64 {
        q.mqd
            .get64(abi::mqd::CP_MQD_BASE_ADDR_LO, abi::mqd::CP_MQD_BASE_ADDR_HI)
    }

    #[test]
    fn two_vms_run_mark_kernels_exactly_once_through_registers_and_doorbells() {
        let m = Mediator::start(GpuTopology::tiny(), SchedConfig::default(), 1).unwrap();
        assert_eq!(
            m.reg_read(VgpuHandle(0), reg::VGPU_ID as u64),
            0,
            "no VM yet"
        );
        let mut vms: Vec<_> = [("lo", 2), ("hi", 12)]
            .iter()
            .map(|(n, p)| vm_with_queue(&m, n, *p))
            .collect();
        for (h, tvm, q) in vms.iter_mut() {
            assert_eq!(m.reg_read(*h, reg::VGPU_ID as u64), VGPU_ID_VALUE);
            assert_eq!(
                m.reg_read(*h, reg::CTX_SAVE_SIZE as u64),
                m.topology().ctx_save_bytes_per_xcc()
            );
            load(&m, *h, 0, mqd_addr(q));
            assert_eq!(m.reg_read(*h, hr(0, reg::CP_HQD_ACTIVE)), 1);
            for k in 0..4 {
                tvm.kernel(q, KernelKind::Mark, 16, 64, 20_000, k, true);
            }
            m.doorbell(*h, 0);
        }
        for (h, tvm, q) in &vms {
            assert_eq!(wait(&m, *h, *q.signals.last().unwrap()), wait::DONE);
            tvm.verify(q).unwrap();
            assert_eq!(m.reg_read(*h, hr(0, reg::CP_HQD_ERROR)), 0);
            m.reg_write(*h, hr(0, reg::CP_HQD_DEQUEUE_REQUEST), 1);
            assert_eq!(m.reg_read(*h, hr(0, reg::CP_HQD_ACTIVE)), 0);
        }
        assert_eq!(m.stats().completions, 8);
        for (h, ..) in &vms {
            m.remove_vm(*h);
        }
        m.shutdown();
    }

    #[test]
    fn hostile_mqds_and_packets_get_a_queue_error_and_others_continue() {
        let m = Mediator::start(GpuTopology::tiny(), SchedConfig::default(), 1).unwrap();
        let (bad, mut btvm, mut bq) = vm_with_queue(&m, "bad", 5);
        let (good, mut gtvm, mut gq) = vm_with_queue(&m, "good", 5);
        // MQD outside memory.
        load(&m, bad, 1, 1 << 40);
        assert_eq!(
            m.reg_read(bad, hr(1, reg::CP_HQD_ERROR)),
            error::MQD_ADDRESS
        );
        assert_eq!(m.reg_read(bad, hr(1, reg::CP_HQD_ACTIVE)), 0);
        // Ring outside memory.
        let mut evil = bq.mqd.clone();
        evil.set64(
            abi::mqd::CP_HQD_PQ_BASE_LO,
            abi::mqd::CP_HQD_PQ_BASE_HI,
            (1 << 40) >> 8,
        );
        let ea = btvm.alloc(4096, 4096);
        evil.set64(
            abi::mqd::CP_MQD_BASE_ADDR_LO,
            abi::mqd::CP_MQD_BASE_ADDR_HI,
            ea,
        );
        btvm.mem.write(ea, &evil.to_bytes()).unwrap();
        load(&m, bad, 2, ea);
        assert_eq!(m.reg_read(bad, hr(2, reg::CP_HQD_ERROR)), 4);
        // A valid queue whose write index runs past the ring: error at the doorbell.
        load(&m, bad, 0, mqd_addr(&bq));
        btvm.kernel(&mut bq, KernelKind::Mark, 4, 64, 10_000, 1, true);
        btvm.mem
            .write_u64(
                bq.amd_queue + abi::queue::AMD_QUEUE_WRITE_DISPATCH_ID as u64,
                1000,
            )
            .unwrap();
        m.doorbell(bad, 0);
        // Meanwhile the good VM's work completes.
        load(&m, good, 0, mqd_addr(&gq));
        gtvm.kernel(&mut gq, KernelKind::Mark, 8, 64, 10_000, 2, true);
        m.doorbell(good, 0);
        assert_eq!(wait(&m, good, gq.signals[0]), wait::DONE);
        gtvm.verify(&gq).unwrap();
        assert_eq!(wait(&m, bad, bq.signals[0]), wait::QUEUE_ERROR);
        assert_eq!(m.reg_read(bad, hr(0, reg::CP_HQD_ERROR)), 7);
        // Waiting on a signal outside memory.
        assert_eq!(wait(&m, good, 1 << 40), wait::BAD_SIGNAL);
        m.remove_vm(bad);
        m.remove_vm(good);
        m.shutdown();
    }

    #[test]
    fn policy_changes_live_and_repeated_doorbells_decide_nothing() {
        let m = Mediator::start(GpuTopology::tiny(), SchedConfig::default(), 1).unwrap();
        assert_eq!(m.policy(), Policy::Hqdmux);
        m.set_policy(Policy::Fifo);
        assert_eq!(m.policy(), Policy::Fifo);
        let (lo, mut ltvm, mut lq) = vm_with_queue(&m, "lo", 2);
        let (hi, mut htvm, mut hq) = vm_with_queue(&m, "hi", 12);
        load(&m, lo, 0, mqd_addr(&lq));
        load(&m, hi, 0, mqd_addr(&hq));
        ltvm.kernel(&mut lq, KernelKind::Mark, 8, 64, 200_000, 1, true);
        m.doorbell(lo, 0);
        htvm.kernel(&mut hq, KernelKind::Mark, 4, 64, 10_000, 2, true);
        m.doorbell(hi, 0);
        // The same write pointer again: nothing new for the scheduler.
        m.doorbell(hi, 0);
        m.doorbell(hi, 0);
        assert_eq!(m.stats().stale_doorbells, 2);
        assert_eq!(wait(&m, hi, hq.signals[0]), wait::DONE);
        assert_eq!(wait(&m, lo, lq.signals[0]), wait::DONE);
        htvm.verify(&hq).unwrap();
        ltvm.verify(&lq).unwrap();
        // fifo co-runs on free slots: the high-priority VM preempted nobody.
        assert_eq!(m.stats().preemptions, 0);
        m.remove_vm(lo);
        m.remove_vm(hi);
        m.shutdown();
    }
}
