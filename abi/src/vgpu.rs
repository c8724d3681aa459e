//! The guest-visible virtual GPU (docs/vgpu-abi.md): register map, MSI-X
//! vectors and queue error codes, shared by the host front end
//! (`mdev::vgpu`) and the guest driver (`guest-tools`, `rt::gpu`).

/// `VGPU_ID` value, "HQDG".
pub const VGPU_ID_VALUE: u32 = 0x4744_5148;
/// vGPU ABI version (2: PCI function, MSI-X completion interrupts,
/// asynchronous dequeue with MQD write-back; no WAIT registers).
pub const VGPU_ABI_VERSION: u32 = 2;
/// Size of the register window and of the doorbell window.
pub const WINDOW_BYTES: u64 = 4096;
/// Virtual HQDs per VM (`NUM_VHQD`).
pub const NUM_VHQD: usize = 8;
/// MSI-X vectors of the vGPU: vector `i < NUM_VHQD` is the completion
/// interrupt of vHQD `i`; [`ERROR_VECTOR`] is a queue error on any vHQD.
pub const NUM_VECTORS: usize = NUM_VHQD + 1;
/// MSI-X vector raised on a queue error of any vHQD.
pub const ERROR_VECTOR: usize = NUM_VHQD;
/// Bytes per doorbell: doorbell `i` is at `DOORBELL_STRIDE * i`.
pub const DOORBELL_STRIDE: usize = 8;

/// Register offsets in BAR0 (docs/vgpu-abi.md, "Registers"). All 32-bit.
pub mod reg {
    /// ro: [`super::VGPU_ID_VALUE`].
    pub const VGPU_ID: usize = 0x000;
    /// ro: ABI version ([`super::VGPU_ABI_VERSION`]).
    pub const VGPU_VERSION: usize = 0x004;
    /// ro: virtual HQDs of this VM.
    pub const NUM_VHQD: usize = 0x008;
    /// ro: XCCs a queue runs on (KFD `num_xcc`): one CWSR save area and one
    /// debug area each.
    pub const NUM_XCC: usize = 0x00C;
    /// ro: v1 name of [`NUM_XCC`].
    pub const XCCS: usize = NUM_XCC;
    /// ro: CUs per XCC.
    pub const CUS_PER_XCC: usize = 0x010;
    /// ro: shader engines per XCC.
    pub const SES_PER_XCC: usize = 0x014;
    /// ro: least `cp_hqd_ctx_save_size` per XCC (KFD `cwsr_size`).
    pub const CWSR_SIZE: usize = 0x018;
    /// ro: v1 name of [`CWSR_SIZE`].
    pub const CTX_SAVE_SIZE: usize = CWSR_SIZE;
    /// ro: least `cp_hqd_cntl_stack_size` per XCC (KFD `ctl_stack_size`).
    pub const CTL_STACK_SIZE: usize = 0x01C;
    // 0x020..0x02C: reserved (ABI v1's WAIT registers); reads 0.
    /// ro: debug area per XCC after all save areas (KFD `debug_memory_size`).
    pub const DEBUG_MEMORY_SIZE: usize = 0x02C;
    /// ro: EOP buffer bytes (KFD `eop_buffer_size`).
    pub const EOP_BUFFER_SIZE: usize = 0x030;
    /// ro: MSI-X vectors ([`super::NUM_VECTORS`]).
    pub const NUM_VECTORS: usize = 0x034;
    /// ro: the queue-error vector ([`super::ERROR_VECTOR`]).
    pub const ERROR_VECTOR: usize = 0x038;
    /// rw1c: interrupt status: bit `i` < `NUM_VHQD` set with vector `i`
    /// (completion with a mailbox, or a finished dequeue of vHQD `i`); bit
    /// `NUM_VHQD` set with the error vector. Writing 1 clears a bit.
    pub const INT_STATUS: usize = 0x03C;
    /// Per-HQD block of HQD 0.
    pub const HQD_BASE: usize = 0x100;
    /// Distance between per-HQD blocks.
    pub const HQD_STRIDE: usize = 0x40;
    /// rw (per HQD): MQD address, low 32 bits.
    pub const CP_MQD_BASE_ADDR: usize = 0x00;
    /// rw (per HQD): MQD address, high 32 bits.
    pub const CP_MQD_BASE_ADDR_HI: usize = 0x04;
    /// rw (per HQD): write 1 loads the MQD; reads 1 from the load until its
    /// dequeue has finished.
    pub const CP_HQD_ACTIVE: usize = 0x08;
    /// rw (per HQD): write [`super::dequeue::DRAIN`], [`super::dequeue::RESET`]
    /// or [`super::dequeue::SAVE`] to unload (asynchronous); reads the
    /// pending request, 0 when none.
    pub const CP_HQD_DEQUEUE_REQUEST: usize = 0x0C;
    /// ro (per HQD): 0 or the queue error code (sticky until unload).
    pub const CP_HQD_ERROR: usize = 0x10;
    /// ro (per HQD): [`super::hqd_state`].
    pub const CP_HQD_STATE: usize = 0x14;
    /// ro (per HQD): read index (packets, low 32 bits) as last reported.
    pub const CP_HQD_PQ_RPTR: usize = 0x18;
}

/// `CP_HQD_DEQUEUE_REQUEST` values (as the hardware encodes them).
pub mod dequeue {
    /// Stop fetching, let in-flight work finish.
    pub const DRAIN: u32 = 1;
    /// Kill in-flight work; interrupted packets run again from the start on reload.
    pub const RESET: u32 = 2;
    /// CWSR: save in-flight waves; a reload resumes them.
    pub const SAVE: u32 = 3;
}

/// `CP_HQD_STATE` values.
pub mod hqd_state {
    /// Not loaded.
    pub const UNLOADED: u32 = 0;
    /// Loaded, waiting for a physical HQD.
    pub const WAITING: u32 = 1;
    /// On a physical HQD.
    pub const ON_HQD: u32 = 2;
    /// Dequeue requested, not finished (`CP_HQD_ACTIVE` still reads 1).
    pub const DEQUEUING: u32 = 3;
}

/// `CP_HQD_ERROR` codes: why a queue stopped (or a load was refused).
pub mod error {
    /// Bad MQD header.
    pub const BAD_MQD_HEADER: u32 = 1;
    /// Not an AQL queue.
    pub const NOT_AQL: u32 = 2;
    /// Ring size not a power of two / too small.
    pub const RING_SIZE: u32 = 3;
    /// Ring outside VM memory.
    pub const RING_OUT_OF_RANGE: u32 = 4;
    /// rptr report / wptr poll address outside VM memory.
    pub const POINTER_ADDR_OUT_OF_RANGE: u32 = 5;
    /// Bad read/write pointers.
    pub const BAD_POINTERS: u32 = 6;
    /// Write index beyond read index + ring size.
    pub const WPTR_BEYOND_RING: u32 = 7;
    /// Write index moved backwards.
    pub const WPTR_BACKWARDS: u32 = 8;
    /// Unsupported packet type.
    pub const UNSUPPORTED_PACKET: u32 = 9;
    /// Bad dispatch packet.
    pub const BAD_DISPATCH: u32 = 10;
    /// Kernel descriptor outside VM memory.
    pub const DESCRIPTOR_OUT_OF_RANGE: u32 = 11;
    /// Bad kernel descriptor.
    pub const BAD_DESCRIPTOR: u32 = 12;
    /// Kernarg outside VM memory.
    pub const KERNARG_OUT_OF_RANGE: u32 = 13;
    /// Kernel buffer outside VM memory.
    pub const DATA_OUT_OF_RANGE: u32 = 14;
    /// Signal outside VM memory.
    pub const SIGNAL_OUT_OF_RANGE: u32 = 15;
    /// CWSR area too small.
    pub const CWSR_TOO_SMALL: u32 = 16;
    /// CWSR area outside VM memory.
    pub const CWSR_OUT_OF_RANGE: u32 = 17;
    /// Corrupt saved state.
    pub const BAD_SAVED_STATE: u32 = 18;
    /// MQD address outside VM memory (at load).
    pub const MQD_ADDRESS: u32 = 19;
    /// CWSR fields inconsistent (`cntl_stack_offset` > `cntl_stack_size`, or the
    /// control stack larger than the context save area).
    pub const BAD_CWSR_LAYOUT: u32 = 20;
    /// The host took this VM's vGPU away after a host fault while serving it
    /// (quarantine): every vHQD reads this code, nothing runs any more, and
    /// the error vector is raised once. Other VMs are unaffected.
    pub const DEVICE_LOST: u32 = 21;
    /// A dequeue (scheduler preemption or the guest's own DRAIN/SAVE) did
    /// not finish within the VM's preemption timeout (`preempt_timeout_ms`,
    /// default 9000 ms as KFD's `queue_preemption_timeout_ms`): the host
    /// reset this queue only (RESET_WAVES; in-flight workgroups are lost)
    /// and raised the error vector. Other queues and VMs are unaffected.
    pub const PREEMPTION_TIMEOUT: u32 = 22;
    /// The host's misbehaving-VM guard quarantined this VM's vGPU (too many
    /// queue errors, preemption-timeout resets or doorbell storms within its
    /// window): loads are refused with this code until the operator clears
    /// the quarantine. Queues already loaded keep running.
    pub const QUARANTINED: u32 = 23;
    /// The MQD's CU mask (`compute_static_thread_mgmt_se0..7`) selects no
    /// CU of the partition: the queue could never run (at load, or at a
    /// map of an MQD changed since).
    pub const EMPTY_CU_MASK: u32 = 24;
}
