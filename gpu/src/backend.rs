//! The physical GPU backend trait: what the scheduler <-> GPU binding drives.
//!
//! Nothing here is simulator specific: a real `/dev/kfd` backend maps `map` to
//! CREATE_QUEUE/restore, `unmap` to a dequeue (DBG_TRAP suspend / destroy with the
//! given mode), `doorbell` to a doorbell store, and reports completions from
//! signals/EOP interrupts through `advance`.

use crate::mem::DmaMemory;
use crate::topology::GpuTopology;
pub use abi::aql::DispatchError;
pub use abi::kernel::DescriptorError;
use abi::mqd::V9Mqd;
use std::sync::Arc;

/// The vocabulary shared with the scheduler, defined once there: the time
/// type (nanoseconds on the caller's clock), the HQD slot id (index into
/// [`GpuTopology::user_slots`], the same list the scheduler is given) and
/// the dequeue mode.
pub use scheduler::{DequeueMode, Nanos, SlotId};

/// Load a queue into a slot.
#[derive(Clone)]
pub struct MapRequest {
    /// Target slot.
    pub slot: SlotId,
    /// Caller's queue id, echoed in events.
    pub tag: u64,
    /// Host-owned, validated shadow copy of the guest MQD (as returned by the
    /// last [`GpuEvent::Unmapped`] when resuming).
    pub mqd: V9Mqd,
    /// That VM's memory (all queue addresses are guest-physical in it).
    pub mem: Arc<dyn DmaMemory>,
}

impl std::fmt::Debug for MapRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapRequest")
            .field("slot", &self.slot)
            .field("tag", &self.tag)
            .field("mqd", &self.mqd)
            .finish()
    }
}

/// Why a queue stopped with an error (or an MQD was refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueueErrorReason {
    /// MQD header is not 0xC0310800.
    #[error("MQD header {0:#x} is not a v9 MQD")]
    BadMqdHeader(u32),
    /// Not an AQL queue (`cp_hqd_aql_control` != 1).
    #[error("queue is not AQL")]
    NotAql,
    /// `CP_HQD_PQ_CONTROL.QUEUE_SIZE` encodes a ring (2^(QUEUE_SIZE + 3)
    /// bytes) outside `abi::mqd::MIN_RING_BYTES..=MAX_RING_BYTES`.
    #[error(
        "ring size {} bytes (QUEUE_SIZE {queue_size}) is outside the accepted {}..={} bytes",
        abi::mqd::ring_bytes_of_queue_size(*.queue_size),
        abi::mqd::MIN_RING_BYTES,
        abi::mqd::MAX_RING_BYTES
    )]
    RingSize {
        /// The `QUEUE_SIZE` field (bits 5:0 of `cp_hqd_pq_control`).
        queue_size: u32,
    },
    /// Ring not inside VM memory.
    #[error("ring at {addr:#x} is outside VM memory")]
    RingOutOfRange {
        /// Ring base.
        addr: u64,
    },
    /// wptr poll / rptr report address outside VM memory.
    #[error("queue pointer address {addr:#x} is outside VM memory")]
    PointerAddrOutOfRange {
        /// Address.
        addr: u64,
    },
    /// Saved rptr/wptr in the MQD are inconsistent.
    #[error("MQD read/write pointers are inconsistent")]
    BadPointers,
    /// Write index more than a ring ahead of the read index.
    #[error("write index {wptr} is beyond read index {rptr} + ring size {size}")]
    WptrBeyondRing {
        /// New write index.
        wptr: u64,
        /// Read index.
        rptr: u64,
        /// Ring size (packets).
        size: u64,
    },
    /// Write index moved backwards.
    #[error("write index moved backwards from {old} to {new}")]
    WptrBackwards {
        /// Previous write index.
        old: u64,
        /// New write index.
        new: u64,
    },
    /// Packet type not supported (vendor, agent dispatch, reserved).
    #[error("unsupported AQL packet type {0}")]
    UnsupportedPacket(u8),
    /// Malformed dispatch geometry (zero grid or workgroup dimension, more than
    /// 1024 work-items per workgroup, more than 2^32 workgroups).
    #[error("malformed kernel dispatch packet: {why}")]
    BadDispatch {
        /// What is wrong.
        why: DispatchError,
    },
    /// Kernel descriptor outside memory.
    #[error("kernel object {addr:#x} is outside VM memory")]
    DescriptorOutOfRange {
        /// Address.
        addr: u64,
    },
    /// Kernel descriptor has a bad magic / version / kind.
    #[error("bad kernel descriptor at {addr:#x}: {why}")]
    BadDescriptor {
        /// Address.
        addr: u64,
        /// What is wrong.
        why: DescriptorError,
    },
    /// Kernarg segment outside memory.
    #[error("kernarg {addr:#x} is outside VM memory")]
    KernargOutOfRange {
        /// Address.
        addr: u64,
    },
    /// A kernel's data buffer outside memory.
    #[error("kernel buffer {addr:#x} (+{len}) is outside VM memory")]
    DataOutOfRange {
        /// Address.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// Completion/dependency signal outside memory.
    #[error("signal {addr:#x} is outside VM memory")]
    SignalOutOfRange {
        /// Address.
        addr: u64,
    },
    /// CWSR area smaller than the gfx9.4.x formula.
    #[error("CWSR area too small: need {need} bytes per XCC, have {have}")]
    CwsrTooSmall {
        /// Required bytes.
        need: u64,
        /// Declared bytes.
        have: u64,
    },
    /// CWSR area outside memory (or a write into it failed).
    #[error("CWSR area at {addr:#x} is outside VM memory")]
    CwsrOutOfRange {
        /// Base (or the address of the failed access).
        addr: u64,
    },
    /// CWSR fields are inconsistent: `cntl_stack_offset > cntl_stack_size`, or
    /// the control stack is larger than the per-XCC context save area.
    #[error(
        "CWSR layout inconsistent: cntl_stack_offset {cntl_stack_offset}, \
         cntl_stack_size {cntl_stack_size}, ctx_save_size {ctx_save_size}"
    )]
    BadCwsrLayout {
        /// `cp_hqd_cntl_stack_offset`.
        cntl_stack_offset: u32,
        /// `cp_hqd_cntl_stack_size`.
        cntl_stack_size: u32,
        /// `cp_hqd_ctx_save_size`.
        ctx_save_size: u32,
    },
    /// Saved state read back on restore is malformed.
    #[error("malformed saved CWSR state: {0}")]
    BadSavedState(&'static str),
    /// A dequeue did not finish within the VM's preemption timeout (waves
    /// that do not reach a save point, or a save slower than the timeout):
    /// the queue was reset (RESET_WAVES), its in-flight work is lost.
    #[error("dequeue did not finish within the preemption timeout ({waited_ns} ns); queue reset")]
    PreemptionTimeout {
        /// How long the dequeue had been waiting (ns).
        waited_ns: u64,
    },
    /// The MQD's CU mask (`compute_static_thread_mgmt_se*`) selects no CU
    /// of the partition: the queue could never launch a workgroup.
    #[error("CU mask selects no CU of the partition (compute_static_thread_mgmt_se* all zero)")]
    EmptyCuMask,
}

/// A set of CUs of one partition: bit `x * cus_per_xcc + c` is CU `c` of the
/// partition's `x`-th XCC. The host half of a queue's CU mask
/// ([`PhysGpu::set_cu_mask`]); the GPU intersects it with the guest MQD's
/// `compute_static_thread_mgmt_se*` (docs/gpu-model.md, "CU masks").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CuMask {
    bits: Vec<u64>,
    len: u32,
}

impl CuMask {
    /// Every one of `len` CUs.
    pub fn all(len: u32) -> Self {
        let mut m = CuMask::none(len);
        for c in 0..len {
            m.insert(c);
        }
        m
    }

    /// None of `len` CUs.
    pub fn none(len: u32) -> Self {
        CuMask {
            bits: vec![0; len.div_ceil(64) as usize],
            len,
        }
    }

    /// The CUs of a scheduler [`scheduler::CuSet`] on every XCC of a
    /// partition of `xccs` XCCs with `cus_per_xcc` CUs each.
    pub fn from_set(set: scheduler::CuSet, cus_per_xcc: u32, xccs: u32) -> Self {
        let mut m = CuMask::none(cus_per_xcc.saturating_mul(xccs));
        for x in 0..xccs {
            for c in 0..cus_per_xcc {
                if set.contains(c, cus_per_xcc) {
                    m.insert(x * cus_per_xcc + c);
                }
            }
        }
        m
    }

    /// The guest's CU mask from an MQD's `compute_static_thread_mgmt_se0..3`,
    /// on every XCC: CU `c` of an XCC is shader engine `c % ses`, bit
    /// `c / ses` of that engine's dword (KFD's symmetric CU-mask layout).
    /// Shader engines past the fourth, and bits past 31, are not in the MQD
    /// fields this model reads: such CUs count as enabled.
    pub fn from_mqd(mqd: &V9Mqd, cus_per_xcc: u32, ses: u32, xccs: u32) -> Self {
        let ses = ses.max(1);
        let mut m = CuMask::none(cus_per_xcc.saturating_mul(xccs));
        for c in 0..cus_per_xcc {
            let (se, bit) = (c % ses, c / ses);
            let on = match abi::mqd::COMPUTE_STATIC_THREAD_MGMT_SE.get(se as usize) {
                Some(&dw) if bit < 32 => mqd.dw[dw] >> bit & 1 == 1,
                _ => true,
            };
            if on {
                for x in 0..xccs {
                    m.insert(x * cus_per_xcc + c);
                }
            }
        }
        m
    }

    /// Number of CUs the mask ranges over.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Is CU `cu` in the mask?
    pub fn contains(&self, cu: u32) -> bool {
        cu < self.len && self.bits[(cu / 64) as usize] >> (cu % 64) & 1 == 1
    }

    /// Adds CU `cu` (ignored past the end).
    pub fn insert(&mut self, cu: u32) {
        if cu < self.len {
            self.bits[(cu / 64) as usize] |= 1 << (cu % 64);
        }
    }

    /// Removes CU `cu`.
    pub fn remove(&mut self, cu: u32) {
        if cu < self.len {
            self.bits[(cu / 64) as usize] &= !(1 << (cu % 64));
        }
    }

    /// CUs in both masks (over the shorter length).
    pub fn and(&self, other: &CuMask) -> CuMask {
        let len = self.len.min(other.len);
        let mut bits: Vec<u64> = self
            .bits
            .iter()
            .zip(&other.bits)
            .map(|(a, b)| a & b)
            .collect();
        bits.truncate(len.div_ceil(64) as usize);
        CuMask { bits, len }
    }

    /// The mask as words: CU `c` is bit `c % 64` of word `c / 64` (bits
    /// past [`Self::len`] are clear).
    pub fn words(&self) -> &[u64] {
        &self.bits
    }

    /// Number of CUs in the mask.
    pub fn count(&self) -> u32 {
        self.bits.iter().map(|w| w.count_ones()).sum()
    }

    /// No CU in the mask?
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|w| *w == 0)
    }

    /// The CUs in the mask in round-robin order from `start`: those at or
    /// after it, ascending, then those before it. Skips empty words, so a
    /// sparse mask costs a few word reads, not one step per CU.
    pub fn iter_from(&self, start: u32) -> impl Iterator<Item = u32> + '_ {
        let start = if start < self.len { start } else { 0 };
        self.ones_in(start, self.len).chain(self.ones_in(0, start))
    }

    /// The CUs in the mask in `lo..hi`, ascending.
    fn ones_in(&self, lo: u32, hi: u32) -> impl Iterator<Item = u32> + '_ {
        let (first, last) = (lo / 64, hi.div_ceil(64));
        (first..last).flat_map(move |i| {
            let mut w = self.bits.get(i as usize).copied().unwrap_or(0);
            if i == first && !lo.is_multiple_of(64) {
                w &= !0u64 << (lo % 64);
            }
            std::iter::from_fn(move || {
                (w != 0).then(|| {
                    let b = w.trailing_zeros();
                    w &= w - 1;
                    i * 64 + b
                })
            })
            .filter(move |&c| c >= lo && c < hi)
        })
    }

    /// Lowest CU in both this mask and `free` (a mask of the same length).
    pub fn first_in(&self, free: &CuMask) -> Option<u32> {
        self.bits
            .iter()
            .zip(&free.bits)
            .enumerate()
            .find_map(|(i, (a, b))| {
                let w = a & b;
                (w != 0).then(|| i as u32 * 64 + w.trailing_zeros())
            })
            .filter(|&c| c < self.len.min(free.len))
    }
}

/// Errors of [`PhysGpu`] calls (the call is refused; no state changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// No such slot.
    #[error("slot {0:?} does not exist")]
    NoSuchSlot(SlotId),
    /// Slot already holds a queue (or is still unmapping).
    #[error("slot {0:?} is busy")]
    SlotBusy(SlotId),
    /// Slot holds no queue.
    #[error("slot {0:?} is not mapped")]
    NotMapped(SlotId),
    /// Slot is already being unmapped.
    #[error("slot {0:?} is already unmapping")]
    AlreadyUnmapping(SlotId),
    /// The MQD was refused.
    #[error("bad MQD: {0}")]
    BadMqd(QueueErrorReason),
}

/// Run state of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Loaded and executing (or idle, waiting for a doorbell).
    Active,
    /// Restoring saved waves (modelled latency).
    Restoring,
    /// Dequeue requested, not finished.
    Unmapping(DequeueMode),
    /// Stopped by an error; only `unmap` is accepted.
    Error(QueueErrorReason),
}

/// Snapshot of a mapped slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotStatus {
    /// Caller's tag.
    pub tag: u64,
    /// State.
    pub state: SlotState,
    /// Read index (packets).
    pub rptr: u64,
    /// Write index (packets).
    pub wptr: u64,
    /// Workgroups executing on CUs now.
    pub inflight_wgs: u32,
}

/// Something the GPU did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuEvent {
    /// A packet completed (its completion signal, if any, was decremented).
    PacketCompleted {
        /// Slot.
        slot: SlotId,
        /// Tag.
        tag: u64,
        /// Packet index (= dispatch id).
        dispatch_id: u64,
        /// The packet's completion signal address (0: none), already decremented;
        /// the front end reads its `event_mailbox_ptr` / `event_id`.
        signal: u64,
        /// Time.
        at: Nanos,
    },
    /// Mapped queue ran dry: rptr == wptr and nothing in flight.
    QueueIdle {
        /// Slot.
        slot: SlotId,
        /// Tag.
        tag: u64,
        /// Time.
        at: Nanos,
    },
    /// The dequeue finished; the slot is free.
    Unmapped {
        /// Slot.
        slot: SlotId,
        /// Tag.
        tag: u64,
        /// Mode requested.
        mode: DequeueMode,
        /// Updated MQD (rptr, wptr, control stack offset); map it again to resume.
        mqd: Box<V9Mqd>,
        /// Saved waves, partly dispatched packets or unread packets remain.
        has_work: bool,
        /// Time from the request to completion (modelled save latency for SaveWaves).
        save_ns: Nanos,
        /// The part of `save_ns` a SaveWaves dequeue spent waiting for
        /// in-flight waves without a save point (`NO_SAVE_POINT` kernels)
        /// to finish before their save began: the queue's own waves ran.
        /// 0 when there was none, or when the backend cannot tell (the
        /// scheduler then keeps its threshold on `save_ns`).
        wait_ns: Nanos,
        /// Of `wait_ns`, the partition time the queue's waves held: the
        /// CU-ns its CUs (finishing waves and saved ones waiting with
        /// them) were held during the wait / the partition's CUs. The
        /// rest of the wait's CUs were free for other queues (the
        /// scheduler bills them to the VMs mapped meanwhile). Equal to
        /// `wait_ns` when the backend cannot tell.
        wait_held_ns: Nanos,
        /// Time.
        at: Nanos,
    },
    /// A dequeue requested with a timeout ([`PhysGpu::unmap_within`]) has
    /// not finished in time (KFD: the HWS reports a failed preemption). The
    /// slot stays unmapping; the caller resets it with a
    /// [`DequeueMode::ResetWaves`] unmap, which then ends with
    /// [`GpuEvent::Unmapped`].
    DequeueTimedOut {
        /// Slot.
        slot: SlotId,
        /// Tag.
        tag: u64,
        /// Mode that did not finish.
        mode: DequeueMode,
        /// Time since the request (ns).
        waited_ns: Nanos,
        /// Time.
        at: Nanos,
    },
    /// The queue stopped on bad input; other queues continue. Unmap it to free the slot.
    QueueError {
        /// Slot.
        slot: SlotId,
        /// Tag.
        tag: u64,
        /// Reason.
        reason: QueueErrorReason,
        /// Time.
        at: Nanos,
    },
}

impl GpuEvent {
    /// Event time.
    pub fn at(&self) -> Nanos {
        match self {
            GpuEvent::PacketCompleted { at, .. }
            | GpuEvent::QueueIdle { at, .. }
            | GpuEvent::Unmapped { at, .. }
            | GpuEvent::DequeueTimedOut { at, .. }
            | GpuEvent::QueueError { at, .. } => *at,
        }
    }
    /// Slot of the event.
    pub fn slot(&self) -> SlotId {
        match self {
            GpuEvent::PacketCompleted { slot, .. }
            | GpuEvent::QueueIdle { slot, .. }
            | GpuEvent::Unmapped { slot, .. }
            | GpuEvent::DequeueTimedOut { slot, .. }
            | GpuEvent::QueueError { slot, .. } => *slot,
        }
    }
    /// Tag (the caller's queue id) of the event.
    pub fn tag(&self) -> u64 {
        match self {
            GpuEvent::PacketCompleted { tag, .. }
            | GpuEvent::QueueIdle { tag, .. }
            | GpuEvent::Unmapped { tag, .. }
            | GpuEvent::DequeueTimedOut { tag, .. }
            | GpuEvent::QueueError { tag, .. } => *tag,
        }
    }
}

/// What a backend estimates of a kernel dispatch before it runs
/// ([`PhysGpu::dispatch_estimate`]): the inputs of the scheduler's
/// co-residence choice (docs/scheduling.md, occupancy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatchEstimate {
    /// Run time of one of its workgroups alone on a CU, ns.
    pub wg_ns: u64,
    /// Each workgroup takes at most half a CU (waves, VGPRs and LDS), so
    /// another queue's workgroup fits beside it.
    pub half_cu: bool,
}

/// Checks an MQD before its load is accepted ([`PhysGpu::load_check`]).
pub type LoadCheck = std::sync::Arc<
    dyn Fn(&GpuTopology, &V9Mqd, &dyn DmaMemory) -> Result<(), QueueErrorReason> + Send + Sync,
>;

/// A physical GPU: HQD slots that run queues from VM memory.
///
/// Time only moves through the `now` arguments (monotonic, never decreasing).
/// Calls at `now` first bring the model up to `now`; events become visible at the
/// next [`PhysGpu::advance`].
///
/// A dequeue may not finish (waves that never reach a save point): with
/// [`PhysGpu::unmap_within`] the backend reports [`GpuEvent::DequeueTimedOut`]
/// after the timeout (KFD's `queue_preemption_timeout_ms`), and accepts a
/// [`DequeueMode::ResetWaves`] unmap of the still-unmapping slot to end it.
pub trait PhysGpu: Send {
    /// Topology (slot list, CU counts).
    fn topology(&self) -> &GpuTopology;
    /// Load a queue (`hqd_load`), restoring saved waves if the MQD has any.
    fn map(&mut self, now: Nanos, req: MapRequest) -> Result<(), GpuError>;
    /// Request a dequeue; completion is reported by [`GpuEvent::Unmapped`].
    /// A [`DequeueMode::ResetWaves`] request on a slot whose drain or save has
    /// not finished escalates it (kills the waves still running).
    fn unmap(&mut self, now: Nanos, slot: SlotId, mode: DequeueMode) -> Result<(), GpuError>;
    /// As [`PhysGpu::unmap`], and if the dequeue has not finished `timeout`
    /// ns after `now`, report [`GpuEvent::DequeueTimedOut`] (`None`: wait
    /// forever). The default ignores the timeout (a backend whose dequeues
    /// always finish).
    fn unmap_within(
        &mut self,
        now: Nanos,
        slot: SlotId,
        mode: DequeueMode,
        timeout: Option<Nanos>,
    ) -> Result<(), GpuError> {
        let _ = timeout;
        self.unmap(now, slot, mode)
    }
    /// Doorbell: new write index (packets). Ignored for unmapped slots.
    fn doorbell(&mut self, now: Nanos, slot: SlotId, wptr: u64);
    /// Status of a mapped slot.
    fn query(&self, slot: SlotId) -> Option<SlotStatus>;
    /// Run the model up to `now` and append events in time order.
    fn advance(&mut self, now: Nanos, out: &mut Vec<GpuEvent>);
    /// When the model next has something to do (`None`: nothing until a call).
    fn next_deadline(&self) -> Option<Nanos>;
    /// Sets the host CU mask of a mapped slot (partition CU numbering, see
    /// [`CuMask`]): from then on its workgroups launch only on CUs in both
    /// this mask and its MQD's; workgroups in flight finish where they are.
    /// A map starts with every CU. The default (a backend without CU masks)
    /// ignores it: spatial sharing then loses isolation, not correctness.
    fn set_cu_mask(&mut self, now: Nanos, slot: SlotId, mask: &CuMask) -> Result<(), GpuError> {
        let _ = (now, slot, mask);
        Ok(())
    }
    /// The checks a load of an MQD must pass before the front end accepts
    /// it (on the vCPU thread, from guest memory, nothing changed): every
    /// reason [`PhysGpu::map`] would refuse the queue for at once, so that
    /// a load it would refuse never becomes active (docs/vgpu-abi.md,
    /// "Error codes"). The default is the static admission rules.
    fn load_check(&self) -> LoadCheck {
        std::sync::Arc::new(crate::admission::check_mqd)
    }
    /// [`PhysGpu::map`] with a host CU mask in force before its first
    /// workgroup launches.
    fn map_with_cu_mask(
        &mut self,
        now: Nanos,
        req: MapRequest,
        mask: Option<&CuMask>,
    ) -> Result<(), GpuError> {
        let slot = req.slot;
        self.map(now, req)?;
        match mask {
            Some(m) => self.set_cu_mask(now, slot, m),
            None => Ok(()),
        }
    }
    /// Does the queue on a mapped `slot` still have workgroups on CUs
    /// outside its host CU mask ([`PhysGpu::set_cu_mask`]: those launched
    /// before the mask narrowed)? What a drained CU reservation waits for
    /// (docs/scheduling.md, "A drain that overruns"). `None` (the default)
    /// when the backend cannot tell: the scheduler then treats the drain
    /// as overrun and saves the queue.
    fn wgs_outside_mask(&self, slot: SlotId) -> Option<bool> {
        let _ = slot;
        None
    }
    /// Moves the compute done since the last call into `out`, as `(tag,
    /// CU ns)` pairs: per queue, the CU time of the workgroups that
    /// completed (workgroups x their modelled run time alone on a CU), the
    /// compute a VM received (docs/scheduling.md, the promise). Several
    /// pairs may name one tag. The default (a backend that cannot tell)
    /// reports nothing.
    fn take_cu_time(&mut self, out: &mut Vec<(u64, u64)>) {
        let _ = out;
    }
    /// The backend's estimate of one kernel dispatch before it runs (a
    /// scheduling hint, read on the doorbell path: it must be cheap, and it
    /// reads guest memory only through `mem`, whose every address it must
    /// treat as hostile). `None` (the default) when the backend cannot
    /// tell; the scheduler then assumes the dispatch fills its CUs and
    /// gives it no co-residence.
    fn dispatch_estimate(
        &self,
        mem: &dyn DmaMemory,
        dispatch: &abi::aql::KernelDispatch,
    ) -> Option<DispatchEstimate> {
        let _ = (mem, dispatch);
        None
    }
}

#[cfg(test)]
mod cu_mask_tests {
    use super::CuMask;

    /// `iter_from` visits exactly the set CUs, each once, in round-robin
    /// order from `start`, for every start and a spread of masks (across
    /// word boundaries, empty, full, partial last word).
    #[test]
    fn iter_from_is_round_robin_over_the_set_cus() {
        for len in [1u32, 63, 64, 65, 130, 304] {
            for pattern in 0..6u32 {
                let mut m = CuMask::none(len);
                for c in 0..len {
                    let on = match pattern {
                        0 => false,
                        1 => true,
                        2 => c % 2 == 0,
                        3 => c % 7 == 3,
                        4 => c == len - 1,
                        _ => c.wrapping_mul(2_654_435_761) % 5 < 2,
                    };
                    if on {
                        m.insert(c);
                    }
                }
                for start in [0, 1, 63, 64, 65, len / 2, len - 1, len, len + 9] {
                    let got: Vec<u32> = m.iter_from(start).collect();
                    let s = if start < len { start } else { 0 };
                    let want: Vec<u32> = (s..len).chain(0..s).filter(|&c| m.contains(c)).collect();
                    assert_eq!(got, want, "len {len} pattern {pattern} start {start}");
                }
            }
        }
    }
}
