//! gfx9 memory queue descriptor, `struct v9_mqd` (linux
//! `drivers/gpu/drm/amd/include/v9_structs.h`): 512 dwords = 2048 bytes.
//!
//! Dwords 128..=183 are the register image that `hqd_load`
//! (`kgd_gfx_v9_hqd_load`, `amdgpu_amdkfd_gfx_v9.c`) writes, in order, to the
//! registers `CP_MQD_BASE_ADDR` (0x1FA9) .. `CP_HQD_PQ_WPTR_HI` (0x1FE0).
//!
//! Pointer conventions (as on gfx9 AQL queues, `wptr_shift = 4` in KFD): the
//! register image counts ring positions in **dwords** (a packet is 16 dwords);
//! `cp_hqd_pq_rptr` is the low 32 bits of the read position, `cp_hqd_pq_wptr_lo/hi`
//! the 64-bit write position. The user-visible indices (doorbell value,
//! `amd_queue_t` read/write_dispatch_id) count **packets**. [`V9Mqd::read_index`]
//! rebuilds the 64-bit packet read index from the 32-bit rptr and the 64-bit wptr
//! (valid because wptr - rptr never exceeds the ring size).
//!
//! **Deviation from hardware (documented in docs/gpu-model.md).** On gfx9 only
//! the low log2(ring dwords) bits of `CP_HQD_PQ_RPTR` are meaningful (the ring
//! offset); KFD's `kgd_gfx_v9_hqd_load` takes the remaining bits from the saved
//! 64-bit wptr. hqdmux stores the low 32 bits of the absolute dword position
//! instead. The ring offset (`rptr & (ring_dwords - 1)`) is identical, so a
//! reader that masks like KFD sees the same value; the extra bits let
//! [`V9Mqd::read_index`] tell a full ring (wptr - rptr = ring size) from an
//! empty one, which the offset alone cannot. An MQD whose rptr holds only the
//! ring offset (as saved by real hardware) is rebuilt correctly only while
//! wptr < 2^32 dwords; otherwise `read_index` returns `None`.

/// Number of dwords.
pub const MQD_DWORDS: usize = 512;
/// Size in bytes.
pub const MQD_BYTES: usize = 2048;
/// Value of dword 0 (`header`) written by KFD's `init_mqd`.
pub const MQD_HEADER_VALUE: u32 = 0xC031_0800;

/// dword 0: header.
pub const HEADER: usize = 0;
/// dwords 23, 24, 26, 27: `compute_static_thread_mgmt_se0..3` (CU masks).
pub const COMPUTE_STATIC_THREAD_MGMT_SE: [usize; 4] = [23, 24, 26, 27];
/// First dword of the register image.
pub const REG_IMAGE_FIRST: usize = 128;
/// Last dword of the register image.
pub const REG_IMAGE_LAST: usize = 183;
/// `cp_mqd_base_addr_lo`.
pub const CP_MQD_BASE_ADDR_LO: usize = 128;
/// `cp_mqd_base_addr_hi`.
pub const CP_MQD_BASE_ADDR_HI: usize = 129;
/// `cp_hqd_active` (register 0x1FAB).
pub const CP_HQD_ACTIVE: usize = 130;
/// `cp_hqd_vmid`.
pub const CP_HQD_VMID: usize = 131;
/// `cp_hqd_persistent_state`.
pub const CP_HQD_PERSISTENT_STATE: usize = 132;
/// `cp_hqd_pipe_priority` (0 LOW, 1 MEDIUM, 2 HIGH).
pub const CP_HQD_PIPE_PRIORITY: usize = 133;
/// `cp_hqd_queue_priority` (0..15).
pub const CP_HQD_QUEUE_PRIORITY: usize = 134;
/// `cp_hqd_quantum`.
pub const CP_HQD_QUANTUM: usize = 135;
/// `cp_hqd_pq_base_lo` (ring address >> 8).
pub const CP_HQD_PQ_BASE_LO: usize = 136;
/// `cp_hqd_pq_base_hi`.
pub const CP_HQD_PQ_BASE_HI: usize = 137;
/// `cp_hqd_pq_rptr` (read position in dwords, low 32 bits).
pub const CP_HQD_PQ_RPTR: usize = 138;
/// `cp_hqd_pq_rptr_report_addr_lo` (address of `amd_queue_t.read_dispatch_id`).
pub const CP_HQD_PQ_RPTR_REPORT_ADDR_LO: usize = 139;
/// `cp_hqd_pq_rptr_report_addr_hi`.
pub const CP_HQD_PQ_RPTR_REPORT_ADDR_HI: usize = 140;
/// `cp_hqd_pq_wptr_poll_addr_lo` (address of `amd_queue_t.write_dispatch_id`).
pub const CP_HQD_PQ_WPTR_POLL_ADDR_LO: usize = 141;
/// `cp_hqd_pq_wptr_poll_addr_hi`.
pub const CP_HQD_PQ_WPTR_POLL_ADDR_HI: usize = 142;
/// `cp_hqd_pq_doorbell_control` (offset bits 27:2, enable bit 30).
pub const CP_HQD_PQ_DOORBELL_CONTROL: usize = 143;
/// `cp_hqd_pq_control` (bits 5:0 QUEUE_SIZE: ring dwords = 2 << QUEUE_SIZE).
pub const CP_HQD_PQ_CONTROL: usize = 145;
/// `cp_hqd_dequeue_request` (1 DRAIN_PIPE, 2 RESET_WAVES, 3 SAVE_WAVES).
pub const CP_HQD_DEQUEUE_REQUEST: usize = 152;
/// `cp_hqd_eop_base_addr_lo`.
pub const CP_HQD_EOP_BASE_ADDR_LO: usize = 165;
/// `cp_hqd_eop_base_addr_hi`.
pub const CP_HQD_EOP_BASE_ADDR_HI: usize = 166;
/// `cp_hqd_eop_control`.
pub const CP_HQD_EOP_CONTROL: usize = 167;
/// `cp_hqd_ctx_save_base_addr_lo` (CWSR area).
pub const CP_HQD_CTX_SAVE_BASE_ADDR_LO: usize = 171;
/// `cp_hqd_ctx_save_base_addr_hi`.
pub const CP_HQD_CTX_SAVE_BASE_ADDR_HI: usize = 172;
/// `cp_hqd_cntl_stack_offset` (control stack grows down from size to offset).
pub const CP_HQD_CNTL_STACK_OFFSET: usize = 174;
/// `cp_hqd_cntl_stack_size`.
pub const CP_HQD_CNTL_STACK_SIZE: usize = 175;
/// `cp_hqd_wg_state_offset`.
pub const CP_HQD_WG_STATE_OFFSET: usize = 176;
/// `cp_hqd_ctx_save_size` (per XCC).
pub const CP_HQD_CTX_SAVE_SIZE: usize = 177;
/// `cp_hqd_aql_control` (1 = AQL).
pub const CP_HQD_AQL_CONTROL: usize = 181;
/// `cp_hqd_pq_wptr_lo` (write position in dwords).
pub const CP_HQD_PQ_WPTR_LO: usize = 182;
/// `cp_hqd_pq_wptr_hi`.
pub const CP_HQD_PQ_WPTR_HI: usize = 183;

/// Register number of `CP_MQD_BASE_ADDR` (dword 128).
pub const REG_CP_MQD_BASE_ADDR: u32 = 0x1FA9;
/// Register number of `CP_HQD_ACTIVE` (dword 130).
pub const REG_CP_HQD_ACTIVE: u32 = 0x1FAB;
/// Register number of `CP_HQD_DEQUEUE_REQUEST` (dword 152).
pub const REG_CP_HQD_DEQUEUE_REQUEST: u32 = 0x1FC1;
/// Register number of `CP_HQD_PQ_WPTR_HI` (dword 183).
pub const REG_CP_HQD_PQ_WPTR_HI: u32 = 0x1FE0;

/// Register number loaded from MQD dword `dw` (128..=183).
pub const fn reg_of_dword(dw: usize) -> Option<u32> {
    if dw >= REG_IMAGE_FIRST && dw <= REG_IMAGE_LAST {
        Some(REG_CP_MQD_BASE_ADDR + (dw - REG_IMAGE_FIRST) as u32)
    } else {
        None
    }
}
/// MQD dword holding register `reg` (0x1FA9..=0x1FE0).
pub const fn dword_of_reg(reg: u32) -> Option<usize> {
    if reg >= REG_CP_MQD_BASE_ADDR && reg <= REG_CP_HQD_PQ_WPTR_HI {
        Some(REG_IMAGE_FIRST + (reg - REG_CP_MQD_BASE_ADDR) as usize)
    } else {
        None
    }
}

/// `CP_HQD_PQ_CONTROL.QUEUE_SIZE` mask (bits 5:0): the ring holds
/// `2 << QUEUE_SIZE` dwords, i.e. `2^(QUEUE_SIZE + 3)` bytes.
pub const PQ_CONTROL_QUEUE_SIZE_MASK: u32 = 0x3f;
/// Dwords per AQL packet.
pub const DWORDS_PER_PACKET: u64 = 16;
/// Smallest ring in bytes: `KFD_MIN_QUEUE_RING_SIZE` (linux
/// `include/uapi/linux/kfd_ioctl.h`; `set_queue_properties_from_user` in
/// `kfd_chardev.c` raises smaller rings to it). 16 AQL packets.
pub const MIN_RING_BYTES: u64 = 1024;
/// Largest ring in bytes: KFD takes the ring size as the `u32` `ring_size` of
/// `kfd_ioctl_create_queue_args` and requires a power of two, so 2^31 is the
/// largest it can describe. 2^25 AQL packets.
pub const MAX_RING_BYTES: u64 = 1 << 31;
/// `QUEUE_SIZE` of the smallest ring ([`MIN_RING_BYTES`]).
pub const MIN_QUEUE_SIZE: u32 = 7;
/// `QUEUE_SIZE` of the largest ring ([`MAX_RING_BYTES`]).
pub const MAX_QUEUE_SIZE: u32 = 28;
const _: () = assert!(MIN_RING_BYTES == 1 << (MIN_QUEUE_SIZE + 3));
const _: () = assert!(MAX_RING_BYTES == 1 << (MAX_QUEUE_SIZE + 3));

/// Ring bytes encoded by a `QUEUE_SIZE` value (`2^(QUEUE_SIZE + 3)`), exact for
/// every 6-bit value (up to 2^66).
pub const fn ring_bytes_of_queue_size(queue_size: u32) -> u128 {
    1u128 << ((queue_size & PQ_CONTROL_QUEUE_SIZE_MASK) + 3)
}

/// `CP_HQD_PERSISTENT_STATE.PRELOAD_REQ` (bit 0; gfx9 `gc_9_0_sh_mask.h`).
pub const PERSISTENT_STATE_PRELOAD_REQ: u32 = 1 << 0;
/// `CP_HQD_PERSISTENT_STATE.PRELOAD_SIZE` shift (field bits 17:8).
pub const PERSISTENT_STATE_PRELOAD_SIZE_SHIFT: u32 = 8;
/// `CP_HQD_PERSISTENT_STATE.PRELOAD_SIZE` mask.
pub const PERSISTENT_STATE_PRELOAD_SIZE_MASK: u32 = 0x3FF << PERSISTENT_STATE_PRELOAD_SIZE_SHIFT;
/// PRELOAD_SIZE written by KFD for gfx9 (`init_mqd`, `kfd_mqd_manager_v9.c`).
pub const KFD_PRELOAD_SIZE: u32 = 0x53;
/// `cp_hqd_persistent_state` as KFD's `init_mqd` (`kfd_mqd_manager_v9.c`)
/// writes it: `PRELOAD_REQ | 0x53 << PRELOAD_SIZE` = 0x5301.
pub const KFD_PERSISTENT_STATE: u32 =
    PERSISTENT_STATE_PRELOAD_REQ | KFD_PRELOAD_SIZE << PERSISTENT_STATE_PRELOAD_SIZE_SHIFT;

/// `CP_HQD_QUANTUM.QUANTUM_EN` (bit 0).
pub const QUANTUM_EN: u32 = 1 << 0;
/// `CP_HQD_QUANTUM.QUANTUM_SCALE` (bit 4).
pub const QUANTUM_SCALE: u32 = 1 << 4;
/// `CP_HQD_QUANTUM.QUANTUM_DURATION` shift (field bits 13:8).
pub const QUANTUM_DURATION_SHIFT: u32 = 8;
/// `CP_HQD_QUANTUM.QUANTUM_DURATION` mask.
pub const QUANTUM_DURATION_MASK: u32 = 0x3F << QUANTUM_DURATION_SHIFT;
/// `cp_hqd_quantum` as KFD's `init_mqd` (`kfd_mqd_manager_v9.c`) writes it:
/// `QUANTUM_EN | QUANTUM_SCALE | 1 << QUANTUM_DURATION` = 0x111.
pub const KFD_QUANTUM: u32 = QUANTUM_EN | QUANTUM_SCALE | 1 << QUANTUM_DURATION_SHIFT;

/// Decoded `cp_hqd_quantum` (the time slice a CP gives a queue among the
/// queues of its pipe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantum {
    /// `QUANTUM_EN`: time slicing on.
    pub enabled: bool,
    /// `QUANTUM_SCALE`.
    pub scale: bool,
    /// `QUANTUM_DURATION` (0..=63).
    pub duration: u32,
}

impl Quantum {
    /// Decode a register value (other bits ignored).
    pub const fn decode(v: u32) -> Quantum {
        Quantum {
            enabled: v & QUANTUM_EN != 0,
            scale: v & QUANTUM_SCALE != 0,
            duration: (v & QUANTUM_DURATION_MASK) >> QUANTUM_DURATION_SHIFT,
        }
    }
    /// Encode (a duration above 63 is truncated to its 6 field bits).
    pub const fn encode(self) -> u32 {
        (if self.enabled { QUANTUM_EN } else { 0 })
            | (if self.scale { QUANTUM_SCALE } else { 0 })
            | ((self.duration << QUANTUM_DURATION_SHIFT) & QUANTUM_DURATION_MASK)
    }
}

/// gfx9.4.x CWSR (compute wave save/restore) sizes, as linux `kfd_queue.c`
/// (`kfd_queue_ctx_save_restore_size`) computes them per XCC from the CU and
/// shader-engine counts of one XCC, and the layout of a queue's whole area
/// (`kfd_queue_acquire_buffers`):
///
/// ```text
/// ctx_save_base + 0 * ctx_save_size   XCC 0 save area (control stack, then wave state)
/// ctx_save_base + 1 * ctx_save_size   XCC 1 save area
/// ...
/// ctx_save_base + n * ctx_save_size   debug area of XCC 0 (debug_memory_size bytes)
///               + i * debug_memory_size  debug area of XCC i
/// total = ALIGN((ctx_save_size + debug_memory_size) * n, page)
/// ```
///
/// `ctx_save_size` is the MQD's `cp_hqd_ctx_save_size` (at least [`cwsr::cwsr_size`]),
/// `n` the number of XCCs of the queue's partition.
pub mod cwsr {
    /// `SIZEOF_HSA_USER_CONTEXT_SAVE_AREA_HEADER`.
    pub const HEADER_BYTES: u32 = 40;
    /// Control-stack bytes per wave on gfx9 (`CNTL_STACK_BYTES_PER_WAVE`).
    pub const BYTES_PER_WAVE: u32 = 8;
    /// Per-CU VGPR save bytes (gfx9.4.x).
    pub const VGPR_BYTES: u32 = 0x80000;
    /// Per-CU SGPR save bytes.
    pub const SGPR_BYTES: u32 = 0x4000;
    /// Per-CU LDS save bytes.
    pub const LDS_BYTES: u32 = 0x10000;
    /// Per-CU hardware-register save bytes.
    pub const HWREG_BYTES: u32 = 0x1000;
    /// Per-CU wave-state bytes (sum of the above; `WG_CONTEXT_DATA_SIZE_PER_CU`).
    pub const CU_STATE_BYTES: u32 = VGPR_BYTES + SGPR_BYTES + LDS_BYTES + HWREG_BYTES;
    /// Debugger bytes per wave (`DEBUGGER_BYTES_PER_WAVE`).
    pub const DEBUGGER_BYTES_PER_WAVE: u32 = 32;
    /// Alignment of the per-XCC debug area (`DEBUGGER_BYTES_ALIGN`).
    pub const DEBUGGER_BYTES_ALIGN: u32 = 64;
    /// EOP buffer size of gfx9.4.x (`eop_buffer_size` in KFD's topology).
    pub const EOP_BUFFER_SIZE: u32 = 4096;
    /// Page size used for alignment.
    pub const PAGE: u32 = 4096;

    const fn align_up(v: u32, a: u32) -> u32 {
        v.div_ceil(a).saturating_mul(a)
    }

    /// Waves per XCC: min(cu x 40, SEs x 512).
    pub const fn waves(cus_per_xcc: u32, ses_per_xcc: u32) -> u32 {
        let a = cus_per_xcc.saturating_mul(40);
        let b = ses_per_xcc.saturating_mul(512);
        if a < b {
            a
        } else {
            b
        }
    }
    /// Control stack bytes per XCC (KFD `ctl_stack_size`):
    /// `ALIGN(40 + waves x 8 + 8, page)`.
    pub const fn ctl_stack_size(cus_per_xcc: u32, ses_per_xcc: u32) -> u32 {
        let raw = HEADER_BYTES
            .saturating_add(waves(cus_per_xcc, ses_per_xcc).saturating_mul(BYTES_PER_WAVE))
            .saturating_add(8);
        align_up(raw, PAGE)
    }
    /// Workgroup data bytes per XCC: `ALIGN(cu x (VGPR + SGPR + LDS + HWREG), page)`.
    pub const fn wg_data_size(cus_per_xcc: u32) -> u32 {
        align_up(cus_per_xcc.saturating_mul(CU_STATE_BYTES), PAGE)
    }
    /// Minimum save area per XCC (KFD `cwsr_size`): control stack + workgroup data.
    pub const fn cwsr_size(cus_per_xcc: u32, ses_per_xcc: u32) -> u32 {
        ctl_stack_size(cus_per_xcc, ses_per_xcc).saturating_add(wg_data_size(cus_per_xcc))
    }
    /// Debug area per XCC (KFD `debug_memory_size`): `ALIGN(waves x 32, 64)`.
    pub const fn debug_memory_size(cus_per_xcc: u32, ses_per_xcc: u32) -> u32 {
        align_up(
            waves(cus_per_xcc, ses_per_xcc).saturating_mul(DEBUGGER_BYTES_PER_WAVE),
            DEBUGGER_BYTES_ALIGN,
        )
    }
    /// EOP buffer bytes (KFD `eop_buffer_size` for gfx9.4.x).
    pub const fn eop_buffer_size() -> u32 {
        EOP_BUFFER_SIZE
    }
    /// Bytes a queue's CWSR area must span from `cp_hqd_ctx_save_base_addr`:
    /// `ALIGN((ctx_save_size + debug_memory_size) x num_xcc, page)`
    /// (`kfd_queue_acquire_buffers`). Saturates at `u64::MAX` (only for
    /// sizes no memory holds).
    pub const fn total_area_size(ctx_save_size: u32, debug_memory_size: u32, num_xcc: u32) -> u64 {
        let per_xcc = ctx_save_size as u128 + debug_memory_size as u128;
        let total = (per_xcc * num_xcc as u128).div_ceil(PAGE as u128) * PAGE as u128;
        if total > u64::MAX as u128 {
            u64::MAX
        } else {
            total as u64
        }
    }
    /// Offset of XCC `xcc`'s save area from `cp_hqd_ctx_save_base_addr`.
    pub const fn save_area_offset(ctx_save_size: u32, xcc: u32) -> u64 {
        ctx_save_size as u64 * xcc as u64
    }
    /// Offset of XCC `xcc`'s debug area: after the save areas of all `num_xcc` XCCs.
    pub const fn debug_area_offset(
        ctx_save_size: u32,
        debug_memory_size: u32,
        num_xcc: u32,
        xcc: u32,
    ) -> u64 {
        ctx_save_size as u64 * num_xcc as u64 + debug_memory_size as u64 * xcc as u64
    }

    /// Same as [`ctl_stack_size`] (earlier name).
    pub const fn ctl_stack_bytes(cus_per_xcc: u32, ses_per_xcc: u32) -> u32 {
        ctl_stack_size(cus_per_xcc, ses_per_xcc)
    }
    /// Same as [`wg_data_size`] (earlier name).
    pub const fn wg_data_bytes(cus_per_xcc: u32) -> u32 {
        wg_data_size(cus_per_xcc)
    }
    /// Same as [`cwsr_size`] (earlier name).
    pub const fn ctx_save_bytes(cus_per_xcc: u32, ses_per_xcc: u32) -> u32 {
        cwsr_size(cus_per_xcc, ses_per_xcc)
    }
}

/// `struct v9_mqd` as 512 dwords.
#[derive(Clone, PartialEq, Eq)]
#[repr(C)]
pub struct V9Mqd {
    /// Raw dwords.
    pub dw: [u32; MQD_DWORDS],
}

impl core::fmt::Debug for V9Mqd {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("V9Mqd")
            .field("header", &self.dw[HEADER])
            .field("ring_base", &self.ring_base())
            .field("ring_bytes", &self.ring_bytes())
            .field("rptr_dw", &self.dw[CP_HQD_PQ_RPTR])
            .field("wptr_dw", &self.wptr_dw())
            .field("ctx_save_base", &self.ctx_save_base())
            .finish()
    }
}

impl Default for V9Mqd {
    fn default() -> Self {
        let mut dw = [0u32; MQD_DWORDS];
        dw[HEADER] = MQD_HEADER_VALUE;
        V9Mqd { dw }
    }
}

#[inline]
const fn lohi(lo: u32, hi: u32) -> u64 {
    (lo as u64) | ((hi as u64) << 32)
}

impl V9Mqd {
    /// 64-bit value from a lo/hi dword pair.
    pub fn get64(&self, lo: usize, hi: usize) -> u64 {
        lohi(self.dw[lo], self.dw[hi])
    }
    /// Store a 64-bit value into a lo/hi dword pair.
    pub fn set64(&mut self, lo: usize, hi: usize, v: u64) {
        self.dw[lo] = v as u32;
        self.dw[hi] = (v >> 32) as u32;
    }
    /// Ring (PQ) base address in bytes (`pq_base` << 8).
    pub fn ring_base(&self) -> u64 {
        self.get64(CP_HQD_PQ_BASE_LO, CP_HQD_PQ_BASE_HI) << 8
    }
    /// `CP_HQD_PQ_CONTROL.QUEUE_SIZE`.
    pub fn queue_size_field(&self) -> u32 {
        self.dw[CP_HQD_PQ_CONTROL] & PQ_CONTROL_QUEUE_SIZE_MASK
    }
    /// Ring size in dwords (2 << QUEUE_SIZE; saturates at `u64::MAX` for
    /// QUEUE_SIZE 63, which no consumer accepts).
    pub fn ring_dwords(&self) -> u64 {
        1u64.checked_shl(self.queue_size_field() + 1)
            .unwrap_or(u64::MAX)
    }
    /// Ring size in bytes (saturating: QUEUE_SIZE >= 61 gives `u64::MAX`).
    pub fn ring_bytes(&self) -> u64 {
        self.ring_dwords().saturating_mul(4)
    }
    /// Ring size in 64-byte AQL packets.
    pub fn ring_packets(&self) -> u64 {
        self.ring_dwords() / DWORDS_PER_PACKET
    }
    /// Where the CP polls the write index (`amd_queue_t.write_dispatch_id`), 0 = none.
    pub fn wptr_poll_addr(&self) -> u64 {
        self.get64(CP_HQD_PQ_WPTR_POLL_ADDR_LO, CP_HQD_PQ_WPTR_POLL_ADDR_HI)
    }
    /// Where the CP reports the read index (`amd_queue_t.read_dispatch_id`), 0 = none.
    pub fn rptr_report_addr(&self) -> u64 {
        self.get64(CP_HQD_PQ_RPTR_REPORT_ADDR_LO, CP_HQD_PQ_RPTR_REPORT_ADDR_HI)
    }
    /// EOP buffer address (`eop_base` << 8).
    pub fn eop_base(&self) -> u64 {
        self.get64(CP_HQD_EOP_BASE_ADDR_LO, CP_HQD_EOP_BASE_ADDR_HI) << 8
    }
    /// CWSR context save area base (XCC 0; XCC i at base + i x ctx_save_size).
    pub fn ctx_save_base(&self) -> u64 {
        self.get64(CP_HQD_CTX_SAVE_BASE_ADDR_LO, CP_HQD_CTX_SAVE_BASE_ADDR_HI)
    }
    /// CWSR context save area size per XCC.
    pub fn ctx_save_size(&self) -> u32 {
        self.dw[CP_HQD_CTX_SAVE_SIZE]
    }
    /// Control stack offset (== size when the stack is empty).
    pub fn cntl_stack_offset(&self) -> u32 {
        self.dw[CP_HQD_CNTL_STACK_OFFSET]
    }
    /// Control stack size.
    pub fn cntl_stack_size(&self) -> u32 {
        self.dw[CP_HQD_CNTL_STACK_SIZE]
    }
    /// Workgroup state offset.
    pub fn wg_state_offset(&self) -> u32 {
        self.dw[CP_HQD_WG_STATE_OFFSET]
    }
    /// `cp_hqd_persistent_state`.
    pub fn persistent_state(&self) -> u32 {
        self.dw[CP_HQD_PERSISTENT_STATE]
    }
    /// `CP_HQD_PERSISTENT_STATE.PRELOAD_REQ`.
    pub fn preload_req(&self) -> bool {
        self.persistent_state() & PERSISTENT_STATE_PRELOAD_REQ != 0
    }
    /// `CP_HQD_PERSISTENT_STATE.PRELOAD_SIZE` (0..=0x3FF).
    pub fn preload_size(&self) -> u32 {
        (self.persistent_state() & PERSISTENT_STATE_PRELOAD_SIZE_MASK)
            >> PERSISTENT_STATE_PRELOAD_SIZE_SHIFT
    }
    /// Decoded `cp_hqd_quantum`.
    pub fn quantum(&self) -> Quantum {
        Quantum::decode(self.dw[CP_HQD_QUANTUM])
    }
    /// Ring size in bytes, exact for every QUEUE_SIZE (see
    /// [`ring_bytes_of_queue_size`]).
    pub fn ring_bytes_exact(&self) -> u128 {
        ring_bytes_of_queue_size(self.queue_size_field())
    }
    /// AQL queue?
    pub fn is_aql(&self) -> bool {
        self.dw[CP_HQD_AQL_CONTROL] & 1 == 1
    }
    /// Queue priority (0..15).
    pub fn queue_priority(&self) -> u32 {
        self.dw[CP_HQD_QUEUE_PRIORITY]
    }
    /// VMID.
    pub fn vmid(&self) -> u32 {
        self.dw[CP_HQD_VMID]
    }
    /// `cp_hqd_active`.
    pub fn active(&self) -> bool {
        self.dw[CP_HQD_ACTIVE] & 1 == 1
    }
    /// 64-bit write position in dwords.
    pub fn wptr_dw(&self) -> u64 {
        self.get64(CP_HQD_PQ_WPTR_LO, CP_HQD_PQ_WPTR_HI)
    }
    /// Write index in packets.
    pub fn write_index(&self) -> u64 {
        self.wptr_dw() / DWORDS_PER_PACKET
    }
    /// Set the write index (packets).
    pub fn set_write_index(&mut self, packets: u64) {
        self.set64(
            CP_HQD_PQ_WPTR_LO,
            CP_HQD_PQ_WPTR_HI,
            packets.wrapping_mul(DWORDS_PER_PACKET),
        );
    }
    /// Read index in packets, rebuilt from the 32-bit rptr and the 64-bit wptr.
    /// Returns `None` if the result would be inconsistent (rptr not packet
    /// aligned, or the distance to wptr exceeds the ring).
    pub fn read_index(&self) -> Option<u64> {
        let r = self.dw[CP_HQD_PQ_RPTR] as u64;
        if !r.is_multiple_of(DWORDS_PER_PACKET) {
            return None;
        }
        let w = self.wptr_dw();
        let mut full = (w & !0xFFFF_FFFF) | r;
        if full > w {
            full = full.checked_sub(1u64 << 32)?;
        }
        if w - full > self.ring_dwords() {
            return None;
        }
        Some(full / DWORDS_PER_PACKET)
    }
    /// Set the read index (packets): stores the low 32 bits of the dword position.
    pub fn set_read_index(&mut self, packets: u64) {
        self.dw[CP_HQD_PQ_RPTR] = packets.wrapping_mul(DWORDS_PER_PACKET) as u32;
    }
    /// Byte address of ring slot for packet index `idx` (saturating: a ring
    /// that does not fit the address space gives an address no memory holds).
    pub fn packet_addr(&self, idx: u64) -> u64 {
        self.ring_base()
            .saturating_add((idx % self.ring_packets().max(1)).saturating_mul(64))
    }
    /// Is there saved CWSR control-stack content (offset below size)?
    pub fn has_saved_state(&self) -> bool {
        self.cntl_stack_offset() < self.cntl_stack_size()
    }
    /// Little-endian 2048-byte image.
    pub fn to_bytes(&self) -> [u8; MQD_BYTES] {
        let mut b = [0u8; MQD_BYTES];
        for (i, d) in self.dw.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&d.to_le_bytes());
        }
        b
    }
    /// From a little-endian 2048-byte image.
    pub fn from_bytes(b: &[u8; MQD_BYTES]) -> V9Mqd {
        let mut dw = [0u32; MQD_DWORDS];
        for (i, d) in dw.iter_mut().enumerate() {
            *d = crate::le::u32_at(b, i * 4);
        }
        V9Mqd { dw }
    }
}

/// Builder for an AQL user queue MQD, following KFD `init_mqd` / `update_mqd`
/// (`kfd_mqd_manager_v9.c`) for the fields the simulator uses.
#[derive(Clone, Copy, Debug, Default)]
pub struct AqlMqdBuilder {
    /// Address of the MQD itself (`cp_mqd_base_addr`).
    pub mqd_addr: u64,
    /// Ring address (256-byte aligned).
    pub ring_base: u64,
    /// Ring size in packets (power of two, 16 ([`MIN_RING_BYTES`]) ..= 2^25
    /// ([`MAX_RING_BYTES`])).
    pub ring_packets: u32,
    /// `amd_queue_t` address: wptr poll = +0x38, rptr report = +0x80 (0 = none).
    pub amd_queue: u64,
    /// EOP buffer address (256-byte aligned, [`cwsr::EOP_BUFFER_SIZE`] bytes, informative).
    pub eop_base: u64,
    /// CWSR area base (XCC 0).
    pub ctx_save_base: u64,
    /// CWSR area size per XCC.
    pub ctx_save_size: u32,
    /// Control stack size (per XCC).
    pub cntl_stack_size: u32,
    /// Queue priority 0..15.
    pub priority: u32,
    /// VMID.
    pub vmid: u32,
    /// Doorbell offset (dwords).
    pub doorbell_offset: u32,
}

impl AqlMqdBuilder {
    /// Fill CWSR size fields from the gfx9.4.x formula for a CU/SE count
    /// (`cntl_stack_size` = [`cwsr::ctl_stack_size`], `ctx_save_size` =
    /// [`cwsr::cwsr_size`]). The area at `ctx_save_base` must span
    /// [`cwsr::total_area_size`] bytes (save areas and debug areas of all XCCs).
    pub fn cwsr_for(mut self, ctx_save_base: u64, cus_per_xcc: u32, ses_per_xcc: u32) -> Self {
        self.ctx_save_base = ctx_save_base;
        self.cntl_stack_size = cwsr::ctl_stack_size(cus_per_xcc, ses_per_xcc);
        self.ctx_save_size = cwsr::cwsr_size(cus_per_xcc, ses_per_xcc);
        self
    }
    /// Build the MQD. `QUEUE_SIZE` = log2(ring dwords) - 1; a non power-of-two
    /// `ring_packets` is rounded down.
    pub fn build(&self) -> V9Mqd {
        let mut m = V9Mqd::default();
        for se in COMPUTE_STATIC_THREAD_MGMT_SE {
            m.dw[se] = 0xFFFF_FFFF;
        }
        m.set64(CP_MQD_BASE_ADDR_LO, CP_MQD_BASE_ADDR_HI, self.mqd_addr);
        m.dw[CP_HQD_VMID] = self.vmid;
        m.dw[CP_HQD_PERSISTENT_STATE] = KFD_PERSISTENT_STATE;
        let prio = self.priority.min(15);
        m.dw[CP_HQD_QUEUE_PRIORITY] = prio;
        m.dw[CP_HQD_PIPE_PRIORITY] = match prio {
            0..=6 => 0,
            7..=10 => 1,
            _ => 2,
        };
        m.dw[CP_HQD_QUANTUM] = KFD_QUANTUM;
        m.set64(CP_HQD_PQ_BASE_LO, CP_HQD_PQ_BASE_HI, self.ring_base >> 8);
        let pk = self.ring_packets.max(1);
        let log2p = 31 - pk.leading_zeros();
        // dwords = 16 * packets = 2 << QUEUE_SIZE  =>  QUEUE_SIZE = log2(packets) + 3
        m.dw[CP_HQD_PQ_CONTROL] = (log2p + 3) & PQ_CONTROL_QUEUE_SIZE_MASK;
        if self.amd_queue != 0 {
            let wp = self.amd_queue + crate::queue::AMD_QUEUE_WRITE_DISPATCH_ID as u64;
            let rp = self.amd_queue + crate::queue::AMD_QUEUE_READ_DISPATCH_ID as u64;
            m.set64(CP_HQD_PQ_WPTR_POLL_ADDR_LO, CP_HQD_PQ_WPTR_POLL_ADDR_HI, wp);
            m.set64(
                CP_HQD_PQ_RPTR_REPORT_ADDR_LO,
                CP_HQD_PQ_RPTR_REPORT_ADDR_HI,
                rp,
            );
        }
        m.dw[CP_HQD_PQ_DOORBELL_CONTROL] = ((self.doorbell_offset & 0x03FF_FFFF) << 2) | (1 << 30);
        m.set64(
            CP_HQD_EOP_BASE_ADDR_LO,
            CP_HQD_EOP_BASE_ADDR_HI,
            self.eop_base >> 8,
        );
        m.dw[CP_HQD_EOP_CONTROL] = 9; // EOP size field as KFD for 4 KiB
        m.set64(
            CP_HQD_CTX_SAVE_BASE_ADDR_LO,
            CP_HQD_CTX_SAVE_BASE_ADDR_HI,
            self.ctx_save_base,
        );
        m.dw[CP_HQD_CTX_SAVE_SIZE] = self.ctx_save_size;
        m.dw[CP_HQD_CNTL_STACK_SIZE] = self.cntl_stack_size;
        m.dw[CP_HQD_CNTL_STACK_OFFSET] = self.cntl_stack_size; // empty stack (KFD init_mqd)
        m.dw[CP_HQD_WG_STATE_OFFSET] = self.cntl_stack_size;
        m.dw[CP_HQD_AQL_CONTROL] = 1;
        m.dw[CP_HQD_ACTIVE] = 0;
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_numbers() {
        assert_eq!(reg_of_dword(128), Some(0x1FA9));
        assert_eq!(reg_of_dword(130), Some(REG_CP_HQD_ACTIVE));
        assert_eq!(reg_of_dword(152), Some(REG_CP_HQD_DEQUEUE_REQUEST));
        assert_eq!(reg_of_dword(183), Some(0x1FE0));
        assert_eq!(reg_of_dword(184), None);
        assert_eq!(dword_of_reg(0x1FE0), Some(183));
        assert_eq!(dword_of_reg(0x1FA8), None);
    }

    #[test]
    fn builder_and_accessors() {
        let m = AqlMqdBuilder {
            mqd_addr: 0x10000,
            ring_base: 0x20_0000,
            ring_packets: 256,
            amd_queue: 0x30000,
            priority: 12,
            ..Default::default()
        }
        .cwsr_for(0x100_0000, 38, 4)
        .build();
        assert_eq!(m.dw[0], 0xC031_0800);
        assert_eq!(m.ring_base(), 0x20_0000);
        assert_eq!(m.ring_packets(), 256);
        assert_eq!(m.ring_bytes(), 256 * 64);
        assert_eq!(m.wptr_poll_addr(), 0x30038);
        assert_eq!(m.rptr_report_addr(), 0x30080);
        assert_eq!(m.dw[CP_HQD_PIPE_PRIORITY], 2);
        assert!(m.is_aql());
        assert!(!m.has_saved_state());
        assert_eq!(m.cntl_stack_size(), 12288);
        assert_eq!(m.ctx_save_size(), 12288 + 38 * 0x95000);
        let b = m.to_bytes();
        assert_eq!(V9Mqd::from_bytes(&b), m);
    }

    #[test]
    fn read_index_reconstruction() {
        let mut m = AqlMqdBuilder {
            ring_packets: 64,
            ..Default::default()
        }
        .build();
        for (r, w) in [
            (0u64, 0u64),
            (5, 60),
            (0x0FFF_FFF0, 0x1000_0010),
            (1 << 30, (1 << 30) + 64),
        ] {
            m.set_write_index(w);
            m.set_read_index(r);
            assert_eq!(m.read_index(), Some(r), "r={r} w={w}");
        }
        m.set_write_index(200);
        m.set_read_index(100);
        assert_eq!(m.read_index(), None); // further apart than the ring
        m.dw[CP_HQD_PQ_RPTR] = 3;
        assert_eq!(m.read_index(), None);
    }

    struct Sink;
    impl core::fmt::Write for Sink {
        fn write_str(&mut self, _: &str) -> core::fmt::Result {
            Ok(())
        }
    }

    #[test]
    fn hostile_queue_size_does_not_overflow() {
        let mut m = V9Mqd::default();
        for qs in 0..=63u32 {
            m.dw[CP_HQD_PQ_CONTROL] = qs;
            m.set64(CP_HQD_PQ_BASE_LO, CP_HQD_PQ_BASE_HI, u64::MAX);
            core::fmt::write(&mut Sink, format_args!("{m:?}")).unwrap();
            let _ = m.read_index();
            let _ = m.packet_addr(u64::MAX);
            assert!(m.ring_bytes() >= m.ring_dwords() || qs >= 61);
        }
        m.dw[CP_HQD_PQ_CONTROL] = 61;
        assert_eq!(m.ring_bytes(), u64::MAX);
        assert_eq!(m.ring_dwords(), 1 << 62);
        m.dw[CP_HQD_PQ_CONTROL] = 63;
        assert_eq!(m.ring_dwords(), u64::MAX);
        m.dw[CP_HQD_PQ_CONTROL] = 9;
        assert_eq!(m.ring_bytes(), 4096);
        // packet_addr never wraps around to a low address.
        assert_eq!(m.ring_base(), u64::MAX << 8);
        assert_eq!(m.packet_addr(3), (u64::MAX << 8) + 192);
        assert_eq!(m.packet_addr(5), u64::MAX);
    }

    #[test]
    fn cwsr_formula() {
        assert_eq!(cwsr::waves(38, 4), 1520);
        assert_eq!(cwsr::waves(2, 1), 80);
        // 40 + 1520 x 8 + 8 = 12208 -> 3 pages.
        assert_eq!(cwsr::ctl_stack_size(38, 4), 12288);
        assert_eq!(cwsr::ctl_stack_bytes(38, 4), 12288);
        assert_eq!(cwsr::wg_data_size(1), 0x95000);
        assert_eq!(cwsr::cwsr_size(38, 4), 12288 + 38 * 0x95000);
        // 1520 x 32 = 48640, already a multiple of 64; 80 x 32 = 2560.
        assert_eq!(cwsr::debug_memory_size(38, 4), 48640);
        assert_eq!(cwsr::debug_memory_size(2, 1), 2560);
        // 1 CU, 1 SE: 40 waves x 32 = 1280 (a multiple of 64); 3 CUs: 120 x 32 = 3840.
        assert_eq!(cwsr::debug_memory_size(3, 1), 3840);
        assert_eq!(cwsr::eop_buffer_size(), 4096);
    }

    #[test]
    fn cwsr_area_layout() {
        let ctx = cwsr::cwsr_size(2, 1);
        let dbg = cwsr::debug_memory_size(2, 1);
        // Debug areas follow all save areas, then the total is page aligned.
        assert_eq!(cwsr::save_area_offset(ctx, 1), ctx as u64);
        assert_eq!(cwsr::debug_area_offset(ctx, dbg, 2, 0), 2 * ctx as u64);
        assert_eq!(
            cwsr::debug_area_offset(ctx, dbg, 2, 1),
            2 * ctx as u64 + dbg as u64
        );
        let total = cwsr::total_area_size(ctx, dbg, 2);
        assert_eq!(total, (2 * (ctx + dbg) as u64).div_ceil(4096) * 4096);
        assert!(total >= cwsr::debug_area_offset(ctx, dbg, 2, 2));
        assert_eq!(total % 4096, 0);
        // Hostile sizes saturate instead of wrapping.
        assert_eq!(
            cwsr::total_area_size(u32::MAX, u32::MAX, u32::MAX),
            u64::MAX
        );
        assert_eq!(cwsr::total_area_size(0, 0, 8), 0);
    }

    #[test]
    fn kfd_register_values() {
        assert_eq!(KFD_PERSISTENT_STATE, 0x5301);
        assert_eq!(KFD_QUANTUM, 0x111);
        let m = AqlMqdBuilder::default().build();
        assert!(m.preload_req());
        assert_eq!(m.preload_size(), 0x53);
        assert_eq!(
            m.quantum(),
            Quantum {
                enabled: true,
                scale: true,
                duration: 1
            }
        );
        // The register reset value 0x0BE05501: PRELOAD_REQ, PRELOAD_SIZE 0x55.
        let mut r = m.clone();
        r.dw[CP_HQD_PERSISTENT_STATE] = 0x0BE0_5501;
        assert!(r.preload_req());
        assert_eq!(r.preload_size(), 0x55);
        // DURATION is bits 13:8: bit 14 and bits 7:5 are not part of it.
        let q = Quantum::decode(0x4000 | 0xE0 | 0x3F00 | 1);
        assert_eq!((q.enabled, q.scale, q.duration), (true, false, 63));
        for v in [0u32, 1, 0x10, 0x111, 0x3F11, 0x2A01] {
            assert_eq!(Quantum::decode(v).encode(), v);
        }
    }

    #[test]
    fn ring_size_limits() {
        assert_eq!(ring_bytes_of_queue_size(MIN_QUEUE_SIZE), 1024);
        assert_eq!(ring_bytes_of_queue_size(MAX_QUEUE_SIZE), 1 << 31);
        assert_eq!(ring_bytes_of_queue_size(63), 1 << 66);
        for packets in [16u32, 64, 1 << 25] {
            let m = AqlMqdBuilder {
                ring_packets: packets,
                ..Default::default()
            }
            .build();
            assert_eq!(m.ring_packets(), packets as u64);
            assert_eq!(m.ring_bytes_exact(), packets as u128 * 64);
        }
        let m = AqlMqdBuilder {
            ring_packets: 16,
            ..Default::default()
        }
        .build();
        assert_eq!(m.queue_size_field(), MIN_QUEUE_SIZE);
    }
}
