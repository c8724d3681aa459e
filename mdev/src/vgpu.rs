//! The per-VM vGPU front end (docs/vgpu-abi.md): register file, decode into
//! typed requests, MQD copy and admission, doorbell eventfds, completion
//! mailboxes and MSI-X vectors through an [`InterruptSink`].
//!
//! A front end never calls the GPU: register writes that need the scheduler
//! or the GPU become [`VgpuRequest`]s sent to the arbiter
//! (`crate::arbiter`), and the vCPU returns at once. The arbiter's service
//! thread calls back (`on_*` methods) to update registers, write mailboxes,
//! write back MQDs and raise vectors.
//!
//! Every guest value is hostile: addresses use checked arithmetic, a bad
//! input puts that vHQD in an error state, and guest-triggered log lines go
//! through a per-VM [`RateLimiter`]. Each front end has its own lock, which
//! is recovered (not propagated) if a thread panicked while holding it.

use crate::admission::check_mqd;
use crate::backend::{DequeueMode, QueueErrorReason};
use crate::mem::DmaMemory;
use crate::ratelimit::{Admit, RateLimiter};
use crate::topology::GpuTopology;
use abi::mqd::{V9Mqd, MQD_BYTES};
use abi::vgpu::{error, hqd_state, reg, ERROR_VECTOR, NUM_VECTORS, NUM_VHQD};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub use abi::vgpu::{VGPU_ABI_VERSION, VGPU_ID_VALUE};

/// `amd_signal_t.event_mailbox_ptr` (ROCr `amd_signal_t`, hsa `amd_hsa_signal.h`).
pub const SIGNAL_EVENT_MAILBOX_PTR: u64 = 0x10;
/// `amd_signal_t.event_id` (u32).
pub const SIGNAL_EVENT_ID: u64 = 0x18;
/// Register window bytes handled by the front end (BAR0 offsets below this).
pub const REGS_BYTES: u64 = 0x1000;

/// Where a front end raises MSI-X vectors; implemented by the VMM
/// (mask/pending/irqfd) and by tests.
pub trait InterruptSink: Send + Sync {
    /// Raises vector `vector` (< [`abi::vgpu::NUM_VECTORS`]).
    fn raise(&self, vector: u16);
}

/// A VM registered with the arbiter: the scheduler's own VM identity, the
/// one name for a VM from the front end down.
pub use scheduler::VmId;

/// What a register write asks of the arbiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VgpuRequest {
    /// Load vHQD `vhqd` with the admitted host copy of its MQD.
    Load {
        /// vHQD.
        vhqd: usize,
        /// Guest-physical MQD address (for the write-back after unload).
        mqd_addr: u64,
        /// Admitted shadow copy.
        mqd: Box<V9Mqd>,
    },
    /// Unload vHQD `vhqd` (`CP_HQD_DEQUEUE_REQUEST`).
    Dequeue {
        /// vHQD.
        vhqd: usize,
        /// Mode.
        mode: DequeueMode,
    },
    /// The front end refused a load of vHQD `vhqd` itself (bad MQD) with
    /// `CP_HQD_ERROR` `code`: no queue was made, the arbiter only counts
    /// the error (telemetry, the API's `queue_errors_by_code`).
    Refused {
        /// vHQD.
        vhqd: usize,
        /// The error code the guest reads.
        code: u32,
    },
}

/// Where a front end sends its requests (the arbiter's control channel).
pub trait RequestSink: Send + Sync {
    /// Queue `req` of VM `vm` for the arbiter and wake it; never blocks on
    /// the GPU. Called with the front end's register lock held (requests of
    /// one vHQD reach the arbiter in register order): must not call back
    /// into the front end.
    fn send(&self, vm: VmId, req: VgpuRequest);
}

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
        PreemptionTimeout { .. } => error::PREEMPTION_TIMEOUT,
        EmptyCuMask => error::EMPTY_CU_MASK,
    }
}

/// Read-only identification registers (from the topology).
#[derive(Clone, Copy, Debug)]
struct IdRegs {
    num_xcc: u32,
    cus_per_xcc: u32,
    ses_per_xcc: u32,
    cwsr_size: u32,
    ctl_stack_size: u32,
    debug_memory_size: u32,
    eop_buffer_size: u32,
}

impl IdRegs {
    fn of(t: &GpuTopology) -> Self {
        IdRegs {
            num_xcc: t.num_xcc(),
            cus_per_xcc: t.cus_per_xcc,
            ses_per_xcc: t.ses_per_xcc,
            cwsr_size: t.cwsr_size(),
            ctl_stack_size: t.ctl_stack_size(),
            debug_memory_size: t.debug_memory_size(),
            eop_buffer_size: t.eop_buffer_size(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum HqdPhase {
    #[default]
    Unloaded,
    Loaded {
        on_hqd: bool,
    },
    Dequeuing(DequeueMode),
}

#[derive(Clone, Copy, Debug, Default)]
struct VhqdRegs {
    mqd_base: u64,
    phase: HqdPhase,
    error: u32,
    rptr: u64,
    /// Accepted loads of this vHQD so far (wrapping).
    loads: u64,
    /// The loaded queue's write index at load and its poll address.
    start_wptr: u64,
    wptr_poll: u64,
}

/// A loaded vHQD's write index, as the arbiter reads it on a doorbell
/// ([`VgpuFrontEnd::loaded_queues`], [`VgpuFrontEnd::write_index`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadedQueue {
    /// Which load of the vHQD this is: a reload gives a new value.
    pub load: u64,
    /// The MQD's write index when it was loaded (where the queue starts).
    pub start_wptr: u64,
    /// The MQD's `cp_hqd_pq_wptr_poll_addr`; 0 = none (the write index
    /// stays `start_wptr`).
    pub wptr_poll: u64,
}

#[derive(Default)]
struct Regs {
    vhqd: [VhqdRegs; NUM_VHQD],
    int_status: u32,
}

/// One VM's vGPU registers and doorbells. `Send + Sync`; `&self` methods
/// never block on the GPU.
pub struct VgpuFrontEnd {
    vm: VmId,
    name: String,
    topo: GpuTopology,
    id: IdRegs,
    mem: Arc<dyn DmaMemory>,
    regs: Mutex<Regs>,
    doorbells: Vec<EventFd>,
    irq: Arc<dyn InterruptSink>,
    requests: Arc<dyn RequestSink>,
    logs: RateLimiter,
    quarantined: AtomicBool,
    /// The checks a load must pass ([`VgpuFrontEnd::set_load_check`]).
    load_check: crate::backend::LoadCheck,
}

/// Offset within the register window -> (vHQD index, register).
fn vhqd_reg(o: u64) -> Option<(usize, usize)> {
    let rel = usize::try_from(o.checked_sub(reg::HQD_BASE as u64)?).ok()?;
    let i = rel / reg::HQD_STRIDE;
    (i < NUM_VHQD).then_some((i, rel % reg::HQD_STRIDE))
}

impl Drop for VgpuFrontEnd {
    fn drop(&mut self) {
        self.flush_log();
    }
}

impl VgpuFrontEnd {
    /// A front end for VM `vm` (its memory, interrupt sink and the arbiter's
    /// request channel). Creates one non-blocking eventfd per vHQD doorbell.
    pub fn new(
        vm: VmId,
        name: &str,
        topo: &GpuTopology,
        mem: Arc<dyn DmaMemory>,
        irq: Arc<dyn InterruptSink>,
        requests: Arc<dyn RequestSink>,
    ) -> std::io::Result<Self> {
        let doorbells = (0..NUM_VHQD)
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(VgpuFrontEnd {
            vm,
            name: name.into(),
            topo: topo.clone(),
            id: IdRegs::of(topo),
            mem,
            regs: Mutex::new(Regs::default()),
            doorbells,
            irq,
            requests,
            logs: RateLimiter::new(),
            quarantined: AtomicBool::new(false),
            load_check: std::sync::Arc::new(check_mqd),
        })
    }

    /// Sets the checks a load must pass before it is accepted (the GPU's
    /// [`crate::backend::PhysGpu::load_check`]; default: the static
    /// admission rules). A load that fails them is refused: the vHQD stays
    /// unloaded with the error code, nothing reaches the arbiter but the
    /// refusal (counted for the guard), nothing is written back.
    pub fn set_load_check(&mut self, check: crate::backend::LoadCheck) {
        self.load_check = check;
    }

    /// The VM's handle.
    pub fn handle(&self) -> VmId {
        self.vm
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The VM's memory.
    pub fn memory(&self) -> &Arc<dyn DmaMemory> {
        &self.mem
    }

    /// The eventfd signalled by a doorbell write to vHQD `vhqd` (registered by
    /// the VMM as a KVM ioeventfd). Panics if `vhqd >= NUM_VHQD` (a host bug,
    /// never a guest value).
    pub fn doorbell_eventfd(&self, vhqd: usize) -> &EventFd {
        &self.doorbells[vhqd]
    }

    /// Logs one line with the count of guest-triggered lines suppressed
    /// since the last one logged (if any) and returns that count; also done
    /// when the front end is dropped, so the count is never lost.
    pub fn flush_log(&self) -> u64 {
        let n = self.logs.take_pending();
        if n > 0 {
            log::warn!("vm {}: vGPU: {n} similar lines suppressed", self.name);
        }
        n
    }

    /// (guest-triggered lines logged, lines suppressed) so far.
    pub fn log_counts(&self) -> (u64, u64) {
        self.logs.counts()
    }

    /// Whether a host bug while handling this VM took its vGPU away.
    pub fn quarantined(&self) -> bool {
        self.quarantined.load(Ordering::Relaxed)
    }

    /// Takes the vGPU away after a host fault while serving this VM: every
    /// vHQD then reads [`error::DEVICE_LOST`], and the error vector is raised
    /// once so a guest waiting in `hlt` learns of it.
    pub(crate) fn quarantine(&self) {
        if self.quarantined.swap(true, Ordering::Relaxed) {
            return;
        }
        // The sink may be what faulted: a second fault here is contained.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.irq.raise(ERROR_VECTOR as u16)
        }));
    }

    fn regs(&self) -> MutexGuard<'_, Regs> {
        self.regs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Logs a guest-triggered line, rate-limited per VM.
    pub fn guest_log(&self, level: log::Level, args: std::fmt::Arguments<'_>) {
        match self.logs.admit(Instant::now()) {
            Admit::Log { suppressed: 0 } => log::log!(level, "vm {}: {args}", self.name),
            Admit::Log { suppressed } => log::log!(
                level,
                "vm {}: {args} ({suppressed} similar lines suppressed)",
                self.name
            ),
            Admit::Suppress => {}
        }
    }

    fn raise(&self, regs: &mut Regs, vector: usize) {
        if vector < NUM_VECTORS {
            regs.int_status |= 1 << vector;
            self.irq.raise(vector as u16);
        }
    }

    // ---- guest accesses (vCPU threads) ---------------------------------

    /// Guest read of the 32-bit register at BAR0 `offset` (< 0x1000).
    pub fn reg_read(&self, offset: u64) -> u32 {
        if self.quarantined() {
            let lost = vhqd_reg(offset).is_some_and(|(_, r)| r == reg::CP_HQD_ERROR);
            return if lost { error::DEVICE_LOST } else { 0 };
        }
        let id = &self.id;
        let r = self.regs();
        match offset {
            o if o == reg::VGPU_ID as u64 => VGPU_ID_VALUE,
            o if o == reg::VGPU_VERSION as u64 => VGPU_ABI_VERSION,
            o if o == reg::NUM_VHQD as u64 => NUM_VHQD as u32,
            o if o == reg::NUM_XCC as u64 => id.num_xcc,
            o if o == reg::CUS_PER_XCC as u64 => id.cus_per_xcc,
            o if o == reg::SES_PER_XCC as u64 => id.ses_per_xcc,
            o if o == reg::CWSR_SIZE as u64 => id.cwsr_size,
            o if o == reg::CTL_STACK_SIZE as u64 => id.ctl_stack_size,
            o if o == reg::DEBUG_MEMORY_SIZE as u64 => id.debug_memory_size,
            o if o == reg::EOP_BUFFER_SIZE as u64 => id.eop_buffer_size,
            o if o == reg::NUM_VECTORS as u64 => NUM_VECTORS as u32,
            o if o == reg::ERROR_VECTOR as u64 => ERROR_VECTOR as u32,
            o if o == reg::INT_STATUS as u64 => r.int_status,
            o => {
                let Some((i, rr)) = vhqd_reg(o) else {
                    drop(r);
                    self.guest_log(
                        log::Level::Warn,
                        format_args!("vGPU read of unknown register {o:#x}"),
                    );
                    return 0;
                };
                let h = &r.vhqd[i];
                match rr {
                    reg::CP_MQD_BASE_ADDR => h.mqd_base as u32,
                    reg::CP_MQD_BASE_ADDR_HI => (h.mqd_base >> 32) as u32,
                    reg::CP_HQD_ACTIVE => (h.phase != HqdPhase::Unloaded) as u32,
                    reg::CP_HQD_DEQUEUE_REQUEST => match h.phase {
                        HqdPhase::Dequeuing(m) => m as u32,
                        _ => 0,
                    },
                    reg::CP_HQD_ERROR => h.error,
                    reg::CP_HQD_STATE => match h.phase {
                        HqdPhase::Unloaded => hqd_state::UNLOADED,
                        HqdPhase::Loaded { on_hqd: false } => hqd_state::WAITING,
                        HqdPhase::Loaded { on_hqd: true } => hqd_state::ON_HQD,
                        HqdPhase::Dequeuing(_) => hqd_state::DEQUEUING,
                    },
                    reg::CP_HQD_PQ_RPTR => h.rptr as u32,
                    _ => 0,
                }
            }
        }
    }

    /// Guest write of the 32-bit register at BAR0 `offset` (< 0x1000).
    /// Loads and dequeues are sent to the arbiter; this never waits for them.
    pub fn reg_write(&self, offset: u64, value: u32) {
        if self.quarantined() {
            return;
        }
        if offset == reg::INT_STATUS as u64 {
            self.regs().int_status &= !value;
            return;
        }
        let Some((i, r)) = vhqd_reg(offset) else {
            self.guest_log(
                log::Level::Warn,
                format_args!("vGPU write {value:#x} to read-only or unknown register {offset:#x}"),
            );
            return;
        };
        match r {
            reg::CP_MQD_BASE_ADDR => {
                let mut g = self.regs();
                let h = &mut g.vhqd[i];
                h.mqd_base = (h.mqd_base & !0xFFFF_FFFF) | u64::from(value);
            }
            reg::CP_MQD_BASE_ADDR_HI => {
                let mut g = self.regs();
                let h = &mut g.vhqd[i];
                h.mqd_base = (h.mqd_base & 0xFFFF_FFFF) | (u64::from(value) << 32);
            }
            reg::CP_HQD_ACTIVE if value & 1 == 1 => self.load(i),
            reg::CP_HQD_DEQUEUE_REQUEST if value != 0 => self.dequeue(i, value),
            _ => self.guest_log(
                log::Level::Debug,
                format_args!("vGPU write {offset:#x} = {value:#x} ignored"),
            ),
        }
    }

    /// A doorbell write the VMM saw itself (not through an ioeventfd), at
    /// `offset` in the doorbell window: signals the vHQD's eventfd, or logs
    /// (rate-limited) a write to a doorbell that does not exist.
    pub fn doorbell_write(&self, offset: u64) {
        let stride = abi::vgpu::DOORBELL_STRIDE as u64;
        match usize::try_from(offset / stride) {
            Ok(i) if i < NUM_VHQD && offset.is_multiple_of(stride) => {
                let _ = self.doorbells[i].write(1);
            }
            _ => self.guest_log(
                log::Level::Warn,
                format_args!("write at doorbell offset {offset:#x}: no such doorbell"),
            ),
        }
    }

    /// The vHQDs loaded now (loading, waiting, on an HQD or being
    /// dequeued), one lock taken; none while quarantined.
    pub fn loaded_queues(&self) -> [Option<LoadedQueue>; NUM_VHQD] {
        let mut out = [None; NUM_VHQD];
        if self.quarantined() {
            return out;
        }
        for (o, h) in out.iter_mut().zip(&self.regs().vhqd) {
            if h.phase != HqdPhase::Unloaded {
                *o = Some(LoadedQueue {
                    load: h.loads,
                    start_wptr: h.start_wptr,
                    wptr_poll: h.wptr_poll,
                });
            }
        }
        out
    }

    /// The write index of loaded queue `q` now: read from its poll address
    /// in VM memory (one 8-byte read), as the arbiter does on a doorbell;
    /// `None` if that address is not readable (a doorbell then makes the
    /// arbiter report the queue error).
    pub fn write_index(&self, q: &LoadedQueue) -> Option<u64> {
        match q.wptr_poll {
            0 => Some(q.start_wptr),
            a => self.mem.read_u64(a).ok(),
        }
    }

    fn load(&self, i: usize) {
        let mut g = self.regs();
        if g.vhqd[i].phase != HqdPhase::Unloaded {
            drop(g);
            self.guest_log(
                log::Level::Debug,
                format_args!("vHQD {i}: load while loaded ignored"),
            );
            return;
        }
        let base = g.vhqd[i].mqd_base;
        let mut b = [0u8; MQD_BYTES];
        let in_memory = base
            .checked_add(MQD_BYTES as u64)
            .is_some_and(|_| self.mem.read(base, &mut b).is_ok());
        let result = if in_memory {
            let mqd = V9Mqd::from_bytes(&b);
            (self.load_check)(&self.topo, &mqd, self.mem.as_ref())
                .map(|()| mqd)
                .map_err(|r| (error_code(&r), r.to_string()))
        } else {
            Err((
                error::MQD_ADDRESS,
                format!("MQD at {base:#x} is outside VM memory"),
            ))
        };
        match result {
            Ok(mqd) => {
                let h = &mut g.vhqd[i];
                h.phase = HqdPhase::Loaded { on_hqd: false };
                h.error = 0;
                h.rptr = mqd.read_index().unwrap_or(0);
                h.loads = h.loads.wrapping_add(1);
                h.start_wptr = mqd.write_index();
                h.wptr_poll = mqd.wptr_poll_addr();
                // Sent under the register lock (the send never blocks), so
                // a dequeue from another vCPU cannot reach the arbiter first.
                self.requests.send(
                    self.vm,
                    VgpuRequest::Load {
                        vhqd: i,
                        mqd_addr: base,
                        mqd: Box::new(mqd),
                    },
                );
            }
            Err((code, why)) => {
                g.vhqd[i].error = code;
                self.raise(&mut g, ERROR_VECTOR);
                // Counted as this VM's queue error like the GPU's.
                self.requests
                    .send(self.vm, VgpuRequest::Refused { vhqd: i, code });
                drop(g);
                self.guest_log(
                    log::Level::Warn,
                    format_args!("vHQD {i}: MQD refused: {why}"),
                );
            }
        }
    }

    fn dequeue(&self, i: usize, value: u32) {
        let Some(mode) = DequeueMode::from_u32(value) else {
            self.guest_log(
                log::Level::Warn,
                format_args!("vHQD {i}: CP_HQD_DEQUEUE_REQUEST {value} is not 1, 2 or 3"),
            );
            return;
        };
        let mut g = self.regs();
        match g.vhqd[i].phase {
            HqdPhase::Unloaded => {
                // Not loaded (perhaps a refused load): clear the sticky error.
                g.vhqd[i].error = 0;
            }
            HqdPhase::Dequeuing(_) => {}
            HqdPhase::Loaded { .. } => {
                g.vhqd[i].phase = HqdPhase::Dequeuing(mode);
                // Under the lock: ordered after the load it dequeues.
                self.requests
                    .send(self.vm, VgpuRequest::Dequeue { vhqd: i, mode });
            }
        }
    }

    // ---- arbiter callbacks (service thread) ------------------------------

    /// The arbiter refused a load (only while the VM is being removed): back
    /// to unloaded with `code` (error vector), or without error if 0
    /// (vector `i`, as for a finished dequeue).
    pub(crate) fn on_load_refused(&self, i: usize, code: u32) {
        let mut g = self.regs();
        g.vhqd[i].phase = HqdPhase::Unloaded;
        if code != 0 {
            g.vhqd[i].error = code;
            self.raise(&mut g, ERROR_VECTOR);
        } else {
            self.raise(&mut g, i);
        }
    }

    /// The queue of vHQD `i` went on (or off) a physical HQD.
    pub(crate) fn on_hqd(&self, i: usize, on: bool) {
        let mut g = self.regs();
        if let HqdPhase::Loaded { on_hqd } = &mut g.vhqd[i].phase {
            *on_hqd = on;
        }
    }

    /// A packet of vHQD `i` completed: updates the read index; if its
    /// completion signal has an `event_mailbox_ptr`, writes `event_id` (u32)
    /// there and raises vector `i`. A signal or mailbox address that wraps or
    /// lies outside VM memory is a queue error (returned).
    pub(crate) fn on_completed(
        &self,
        i: usize,
        dispatch_id: u64,
        signal: u64,
    ) -> Result<(), QueueErrorReason> {
        {
            let mut g = self.regs();
            g.vhqd[i].rptr = dispatch_id.saturating_add(1);
        }
        if signal == 0 {
            return Ok(());
        }
        let bad = QueueErrorReason::SignalOutOfRange { addr: signal };
        let mbox_at = signal.checked_add(SIGNAL_EVENT_MAILBOX_PTR).ok_or(bad)?;
        let id_at = signal.checked_add(SIGNAL_EVENT_ID).ok_or(bad)?;
        let mailbox = self.mem.read_u64(mbox_at).map_err(|_| bad)?;
        if mailbox == 0 {
            return Ok(());
        }
        let bad_mbox = QueueErrorReason::SignalOutOfRange { addr: mailbox };
        let mut idb = [0u8; 4];
        self.mem.read(id_at, &mut idb).map_err(|_| bad)?;
        if mailbox.checked_add(4).is_none() {
            return Err(bad_mbox);
        }
        self.mem.write(mailbox, &idb).map_err(|_| bad_mbox)?;
        let mut g = self.regs();
        self.raise(&mut g, i);
        Ok(())
    }

    /// vHQD `i` stopped with `reason`: sticky error code, error vector.
    pub(crate) fn on_error(&self, i: usize, reason: &QueueErrorReason) {
        let mut g = self.regs();
        g.vhqd[i].error = error_code(reason);
        self.raise(&mut g, ERROR_VECTOR);
        drop(g);
        self.guest_log(
            log::Level::Warn,
            format_args!("vHQD {i}: queue error: {reason}"),
        );
    }

    /// The queue of vHQD `i` is gone (dequeue finished, or VM removal):
    /// writes back the MQD fields KFD reads after a preempt into the guest
    /// MQD at `mqd_addr`, marks the vHQD unloaded and raises vector `i`.
    pub(crate) fn on_unloaded(&self, i: usize, mqd_addr: u64, mqd: &V9Mqd) {
        use abi::mqd::{
            CP_HQD_CNTL_STACK_OFFSET, CP_HQD_PQ_RPTR, CP_HQD_PQ_WPTR_HI, CP_HQD_PQ_WPTR_LO,
            CP_HQD_WG_STATE_OFFSET,
        };
        for dw in [
            CP_HQD_PQ_RPTR,
            CP_HQD_PQ_WPTR_LO,
            CP_HQD_PQ_WPTR_HI,
            CP_HQD_CNTL_STACK_OFFSET,
            CP_HQD_WG_STATE_OFFSET,
        ] {
            let ok = mqd_addr
                .checked_add(4 * dw as u64)
                .is_some_and(|a| self.mem.write(a, &mqd.dw[dw].to_le_bytes()).is_ok());
            if !ok {
                self.guest_log(
                    log::Level::Warn,
                    format_args!("vHQD {i}: MQD write-back at {mqd_addr:#x} failed"),
                );
                break;
            }
        }
        let mut g = self.regs();
        let h = &mut g.vhqd[i];
        h.phase = HqdPhase::Unloaded;
        h.rptr = mqd.read_index().unwrap_or(h.rptr);
        self.raise(&mut g, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::SparseMemory;
    use crate::probe::RecordingIrqs;

    #[derive(Default)]
    struct Sink(Mutex<Vec<(VmId, VgpuRequest)>>);
    impl RequestSink for Sink {
        fn send(&self, vm: VmId, req: VgpuRequest) {
            self.0.lock().unwrap().push((vm, req));
        }
    }
    fn fe() -> (
        VgpuFrontEnd,
        Arc<Sink>,
        Arc<RecordingIrqs>,
        Arc<dyn DmaMemory>,
    ) {
        let mem: Arc<dyn DmaMemory> = Arc::new(SparseMemory::new(1 << 32));
        let sink = Arc::new(Sink::default());
        let irqs = Arc::new(RecordingIrqs::new());
        let f = VgpuFrontEnd::new(
            VmId(3),
            "t",
            &GpuTopology::tiny(),
            mem.clone(),
            irqs.clone(),
            sink.clone(),
        )
        .unwrap();
        (f, sink, irqs, mem)
    }

    fn hr(i: usize, r: usize) -> u64 {
        (reg::HQD_BASE + reg::HQD_STRIDE * i + r) as u64
    }

    #[test]
    fn id_registers_come_from_the_topology() {
        let (f, ..) = fe();
        let t = GpuTopology::tiny();
        assert_eq!(f.reg_read(reg::VGPU_VERSION as u64), 2);
        assert_eq!(f.reg_read(reg::NUM_XCC as u64), t.num_xcc());
        assert_eq!(f.reg_read(reg::CWSR_SIZE as u64), t.cwsr_size());
        assert_eq!(f.reg_read(reg::CTL_STACK_SIZE as u64), t.ctl_stack_size());
        // 2 CUs x 40 waves x 32 bytes.
        assert_eq!(f.reg_read(reg::DEBUG_MEMORY_SIZE as u64), 2560);
        assert_eq!(f.reg_read(reg::EOP_BUFFER_SIZE as u64), 4096);
        assert_eq!(f.reg_read(reg::NUM_VECTORS as u64), NUM_VECTORS as u32);
        assert_eq!(f.reg_read(reg::ERROR_VECTOR as u64), ERROR_VECTOR as u32);
    }

    #[test]
    fn hostile_loads_and_dequeues_never_reach_the_arbiter() {
        let (f, sink, irqs, _) = fe();
        // MQD whose end wraps the address space.
        f.reg_write(hr(0, reg::CP_MQD_BASE_ADDR), 0xFFFF_FF00);
        f.reg_write(hr(0, reg::CP_MQD_BASE_ADDR_HI), 0xFFFF_FFFF);
        f.reg_write(hr(0, reg::CP_HQD_ACTIVE), 1);
        assert_eq!(f.reg_read(hr(0, reg::CP_HQD_ERROR)), error::MQD_ADDRESS);
        assert_eq!(f.reg_read(hr(0, reg::CP_HQD_ACTIVE)), 0);
        // All-zero MQD in memory: bad header.
        f.reg_write(hr(1, reg::CP_MQD_BASE_ADDR), 0x1000);
        f.reg_write(hr(1, reg::CP_HQD_ACTIVE), 1);
        assert_eq!(f.reg_read(hr(1, reg::CP_HQD_ERROR)), error::BAD_MQD_HEADER);
        // Bad dequeue mode, and dequeue of an unloaded vHQD clears its error.
        f.reg_write(hr(1, reg::CP_HQD_DEQUEUE_REQUEST), 7);
        assert_eq!(f.reg_read(hr(1, reg::CP_HQD_ERROR)), error::BAD_MQD_HEADER);
        f.reg_write(hr(1, reg::CP_HQD_DEQUEUE_REQUEST), 1);
        assert_eq!(f.reg_read(hr(1, reg::CP_HQD_ERROR)), 0);
        // No load or dequeue reaches the arbiter: only the two errors, to
        // be counted.
        let reqs: Vec<VgpuRequest> = sink
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, r)| r.clone())
            .collect();
        assert_eq!(
            reqs,
            vec![
                VgpuRequest::Refused {
                    vhqd: 0,
                    code: error::MQD_ADDRESS
                },
                VgpuRequest::Refused {
                    vhqd: 1,
                    code: error::BAD_MQD_HEADER
                },
            ]
        );
        assert_eq!(
            irqs.raised(),
            vec![ERROR_VECTOR as u16, ERROR_VECTOR as u16]
        );
        assert_eq!(f.reg_read(reg::INT_STATUS as u64), 1 << ERROR_VECTOR as u32);
        f.reg_write(reg::INT_STATUS as u64, 1 << ERROR_VECTOR as u32);
        assert_eq!(f.reg_read(reg::INT_STATUS as u64), 0);
    }

    #[test]
    fn loaded_queues_report_where_the_write_index_is_and_each_load_anew() {
        use crate::sim::testkit::TestVm;
        use abi::kernel::KernelKind;
        let (f, _, _, mem) = fe();
        let topo = GpuTopology::tiny();
        assert_eq!(f.loaded_queues(), [None; NUM_VHQD]);
        let mut vm = TestVm::with_memory(mem.clone(), 0x10_0000);
        let mut q = vm.queue(&topo, 64, 0);
        let at = vm.alloc(4096, 4096);
        mem.write(at, &q.mqd.to_bytes()).unwrap();
        f.reg_write(hr(3, reg::CP_MQD_BASE_ADDR), at as u32);
        f.reg_write(hr(3, reg::CP_MQD_BASE_ADDR_HI), (at >> 32) as u32);
        f.reg_write(hr(3, reg::CP_HQD_ACTIVE), 1);
        assert_eq!(f.reg_read(hr(3, reg::CP_HQD_ERROR)), 0);
        let first = f.loaded_queues();
        let l = first[3].expect("vHQD 3 loaded");
        assert!(first
            .iter()
            .enumerate()
            .all(|(i, q)| q.is_some() == (i == 3)));
        assert_eq!(l.wptr_poll, q.mqd.wptr_poll_addr());
        assert_ne!(l.wptr_poll, 0);
        assert_eq!(f.write_index(&l), Some(l.start_wptr));
        // The guest's write index moves: read where the arbiter reads it.
        let w = vm.kernel(&mut q, KernelKind::Mark, 4, 64, 1_000, 1, false);
        assert_ne!(w, l.start_wptr);
        assert_eq!(f.write_index(&l), Some(w));
        // A load of the same vHQD again is refused while loaded: same load.
        f.reg_write(hr(3, reg::CP_HQD_ACTIVE), 1);
        assert_eq!(f.loaded_queues()[3], Some(l));
        // Unloaded (the arbiter's write-back), then reloaded: a new load.
        f.on_unloaded(3, at, &q.mqd);
        assert_eq!(f.loaded_queues()[3], None);
        f.reg_write(hr(3, reg::CP_HQD_ACTIVE), 1);
        let again = f.loaded_queues()[3].expect("reloaded");
        assert_ne!(again.load, l.load);
        // An unreadable poll address reads as none; no poll address reads
        // the MQD's own write index.
        let gone = LoadedQueue {
            wptr_poll: 1 << 40,
            ..again
        };
        assert_eq!(f.write_index(&gone), None);
        let none = LoadedQueue {
            wptr_poll: 0,
            start_wptr: 9,
            ..again
        };
        assert_eq!(f.write_index(&none), Some(9));
        // Quarantined: nothing loaded as far as a poller is concerned.
        f.quarantine();
        assert_eq!(f.loaded_queues(), [None; NUM_VHQD]);
    }

    #[test]
    fn wrapping_signal_and_mailbox_addresses_are_refused() {
        let (f, _, irqs, mem) = fe();
        assert!(matches!(
            f.on_completed(0, 0, 0xFFFF_FFFF_FFFF_FFF8),
            Err(QueueErrorReason::SignalOutOfRange { .. })
        ));
        // A signal whose mailbox wraps.
        mem.write_u64(0x2000 + SIGNAL_EVENT_MAILBOX_PTR, u64::MAX - 1)
            .unwrap();
        assert!(f.on_completed(0, 0, 0x2000).is_err());
        // A good one: event_id written, vector 0 raised.
        mem.write_u64(0x2000 + SIGNAL_EVENT_MAILBOX_PTR, 0x3000)
            .unwrap();
        mem.write(0x2000 + SIGNAL_EVENT_ID, &77u32.to_le_bytes())
            .unwrap();
        f.on_completed(0, 4, 0x2000).unwrap();
        let mut b = [0u8; 4];
        mem.read(0x3000, &mut b).unwrap();
        assert_eq!(u32::from_le_bytes(b), 77);
        assert_eq!(irqs.raised(), vec![0]);
        assert_eq!(f.reg_read(hr(0, reg::CP_HQD_PQ_RPTR)), 5);
    }

    #[test]
    fn floods_of_missing_doorbells_and_registers_log_a_few_lines() {
        let (f, ..) = fe();
        for k in 0..200_000u64 {
            f.doorbell_write(0x800 + 8 * (k % 16));
        }
        for _ in 0..1000 {
            f.reg_write(0xF00, 1);
        }
        let (logged, suppressed) = f.log_counts();
        assert!(logged <= 2 * crate::ratelimit::LOG_BURST as u64, "{logged}");
        assert_eq!(logged + suppressed, 201_000);
        // The lines suppressed since the last logged one are reported once
        // (at the latest when the front end goes away), not lost.
        assert!(f.flush_log() > 0);
        assert_eq!(f.flush_log(), 0);
    }

    /// Issue 21, error 18: a load whose control record is corrupt is
    /// refused at load (the vHQD stays unloaded, nothing reaches the
    /// arbiter but the refusal, nothing is written back); the guest clears
    /// the error, repairs the record, reloads, and every workgroup of the
    /// interrupted kernel runs exactly once.
    #[test]
    fn a_corrupt_control_record_is_refused_at_load_and_the_repaired_one_resumes_exactly_once() {
        use crate::backend::{GpuEvent, PhysGpu, SlotId};
        use crate::sim::testkit::{map_req, run_virtual, TestVm};
        use crate::sim::SimGpu;
        use abi::kernel::KernelKind;
        let topo = GpuTopology::tiny();
        let mem: Arc<dyn DmaMemory> = Arc::new(SparseMemory::new(1 << 32));
        let sink = Arc::new(Sink::default());
        let irqs = Arc::new(RecordingIrqs::new());
        let mut f = VgpuFrontEnd::new(VmId(0), "t", &topo, mem.clone(), irqs.clone(), sink.clone())
            .unwrap();
        let mut gpu = SimGpu::new(topo.clone(), 1).unwrap();
        f.set_load_check(gpu.load_check());
        let mut vm = TestVm::with_memory(mem.clone(), 0x10_0000);
        let mut q = vm.queue(&topo, 64, 0);
        vm.kernel(&mut q, KernelKind::Mark, 64, 64, 100_000, 1, false);
        // Run part of the kernel, then save it with waves in flight.
        gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
        let mut ev = Vec::new();
        run_virtual(&mut gpu, 0, 150_000, &mut ev);
        gpu.unmap(150_000, SlotId(0), DequeueMode::SaveWaves)
            .unwrap();
        run_virtual(&mut gpu, 150_000, 10_000_000, &mut ev);
        let saved = ev
            .iter()
            .find_map(|e| match e {
                GpuEvent::Unmapped { mqd, .. } => Some((**mqd).clone()),
                _ => None,
            })
            .unwrap();
        assert!(saved.has_saved_state());
        let done_before = gpu.stats().wgs_completed;
        assert!(done_before > 0 && done_before < 64, "{done_before}");
        // The guest's MQD as the write-back left it.
        let mqd_at = vm.alloc(4096, 4096);
        mem.write(mqd_at, &saved.to_bytes()).unwrap();
        // Corrupt the record's checksum.
        let rec = saved.ctx_save_base() + saved.cntl_stack_offset() as u64;
        let mut byte = [0u8; 1];
        mem.read(rec + 24, &mut byte).unwrap();
        mem.write(rec + 24, &[byte[0] ^ 0x5A]).unwrap();
        f.reg_write(hr(2, reg::CP_MQD_BASE_ADDR), mqd_at as u32);
        f.reg_write(hr(2, reg::CP_MQD_BASE_ADDR_HI), (mqd_at >> 32) as u32);
        f.reg_write(hr(2, reg::CP_HQD_ACTIVE), 1);
        assert_eq!(f.reg_read(hr(2, reg::CP_HQD_ERROR)), error::BAD_SAVED_STATE);
        assert_eq!(f.reg_read(hr(2, reg::CP_HQD_ACTIVE)), 0);
        assert_eq!(f.reg_read(hr(2, reg::CP_HQD_STATE)), hqd_state::UNLOADED);
        assert_eq!(
            irqs.raised(),
            vec![ERROR_VECTOR as u16],
            "the error vector, once"
        );
        let reqs = |sink: &Sink| -> Vec<VgpuRequest> {
            sink.0
                .lock()
                .unwrap()
                .iter()
                .map(|(_, r)| r.clone())
                .collect()
        };
        assert_eq!(
            reqs(&sink),
            vec![VgpuRequest::Refused {
                vhqd: 2,
                code: error::BAD_SAVED_STATE
            }]
        );
        // Nothing written back: the guest MQD is as it was.
        let mut b = [0u8; MQD_BYTES];
        mem.read(mqd_at, &mut b).unwrap();
        assert_eq!(b, saved.to_bytes());
        // The documented recovery: clear the error (a dequeue request on
        // the unloaded vHQD), repair the record, reload.
        f.reg_write(hr(2, reg::CP_HQD_DEQUEUE_REQUEST), 1);
        assert_eq!(f.reg_read(hr(2, reg::CP_HQD_ERROR)), 0);
        mem.write(rec + 24, &byte).unwrap();
        f.reg_write(hr(2, reg::CP_HQD_ACTIVE), 1);
        assert_eq!(f.reg_read(hr(2, reg::CP_HQD_ERROR)), 0);
        assert_eq!(f.reg_read(hr(2, reg::CP_HQD_ACTIVE)), 1);
        let loaded = reqs(&sink)
            .into_iter()
            .find_map(|r| match r {
                VgpuRequest::Load { vhqd: 2, mqd, .. } => Some(*mqd),
                _ => None,
            })
            .expect("the repaired load reaches the arbiter");
        q.mqd = loaded;
        gpu.map(20_000_000, map_req(&vm, &q, 0, 0)).unwrap();
        ev.clear();
        run_virtual(&mut gpu, 20_000_000, 100_000_000, &mut ev);
        assert!(!ev.iter().any(|e| matches!(e, GpuEvent::QueueError { .. })));
        vm.verify(&q).unwrap();
        assert_eq!(gpu.stats().wgs_completed, 64);
    }
}
