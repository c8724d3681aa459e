//! Bare-metal driver for the hqdmux virtual GPU (docs/vgpu-abi.md).
//!
//! The driver follows KFD/ROCr: it builds a gfx9 `v9_mqd`, an AQL ring, an
//! `amd_queue_t`, an EOP buffer and a CWSR area in guest RAM (formats from the
//! `abi` crate), points a virtual HQD at the MQD and rings doorbells after
//! publishing packets. The device is found on PCI ([`crate::pci`]): BAR0
//! holds the registers and the MSI-X table, BAR2 the doorbells (KVM
//! ioeventfds). Completion is awaited by interrupt: each vHQD has an MSI-X
//! vector raised when one of its packets completes, and one more vector
//! signals a queue error; [`Vgpu::wait`] sleeps in `sti; hlt` between
//! checks of the completion signal. Guests never spin.
//!
//! Rules kept throughout (the guest runs under an instruction emulator):
//! * device registers are accessed with volatile 32-bit loads and stores only;
//! * everything the GPU reads or writes in RAM (MQD, ring, `amd_queue_t`,
//!   signals, kernargs, counters) is accessed with volatile loads and stores,
//!   so the compiler neither drops, merges, reorders nor vectorises them;
//! * memory comes from a bump allocator over never-used RAM, which is zero:
//!   nothing is cleared, and the CWSR area (hundreds of MiB) is never touched;
//! * no zero-initialised byte images on the stack: the compiler builds those
//!   with `xorps`/`pxor`, which the emulator cannot execute. So the `abi`
//!   images (`amd_queue_image`, `amd_signal_image`, `KernelDescriptor::encode`,
//!   `Packet::encode_body`, `Kernarg::encode`) are not called at run time;
//!   their fields are stored one by one at the `abi` offsets into fresh (zero)
//!   RAM, which yields the same bytes. Only the MQD comes from
//!   [`AqlMqdBuilder`] (its 2 KiB zeroing is a `memset` call, `rep stosb`);
//! * integers are printed with [`crate::num`], not `core`'s formatting.

use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{compiler_fence, Ordering};

use abi::aql::{Header, KernelDispatch, INVALID_HEADER, PACKET_SIZE, TYPE_KERNEL_DISPATCH};
use abi::kernel::{KernelDescriptor, KD_MAGIC, KD_SIZE, KD_VERSION};
use abi::mqd::{cwsr, AqlMqdBuilder};
use abi::queue::{
    AMD_QUEUE_BASE_ADDRESS, AMD_QUEUE_READ_DISPATCH_ID, AMD_QUEUE_SIZE, AMD_QUEUE_SIZE_PACKETS,
    AMD_QUEUE_WRITE_DISPATCH_ID, AMD_SIGNAL_SIZE, AMD_SIGNAL_VALUE,
};

use crate::boot::BootInfo;
use crate::irq;
use crate::num::{Dec, Hex};
use crate::pci::{self, MmioAlloc, PciError};

/// Page size.
pub const PAGE: u64 = 4096;
pub use abi::vgpu::{ERROR_VECTOR, NUM_VECTORS, VGPU_ABI_VERSION, VGPU_ID_VALUE};
/// Most virtual HQDs whose registers fit in the register block of BAR0.
pub const MAX_VHQD: usize = ((abi::pci::REGS_SIZE as usize) - reg::HQD_BASE) / reg::HQD_STRIDE;
/// Smallest ring the ABI accepts, in packets (1024 bytes, `abi::mqd::MIN_RING_BYTES`).
pub const MIN_RING_PACKETS: u32 = (abi::mqd::MIN_RING_BYTES / 64) as u32;
/// Work-items per workgroup of the dispatches built by [`Queue::submit_mark`].
pub const MARK_WG_SIZE: u16 = 64;
/// `amd_signal_t.event_mailbox_ptr` (ROCr `amd_hsa_signal.h`).
pub const SIGNAL_EVENT_MAILBOX_PTR: u64 = 0x10;
/// Offset of `amd_signal_t.event_id` (u32).
pub const SIGNAL_EVENT_ID_OFFSET: u64 = 0x18;
/// The `event_id` this driver puts in its signals (the host writes it to the mailbox).
pub const SIGNAL_EVENT_ID: u32 = 1;
/// EOP buffer size (as KFD).
pub const EOP_BYTES: u64 = 4096;

pub use abi::vgpu::reg;

/// Outcome of [`Vgpu::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitResult {
    /// The signal's value is <= 0.
    Done,
    /// The error vector arrived: some queue of this VM is in error (read
    /// `CP_HQD_ERROR` to find it).
    QueueError,
}

impl core::fmt::Display for WaitResult {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            WaitResult::Done => f.write_str("done"),
            WaitResult::QueueError => f.write_str("queue error"),
        }
    }
}

/// Why [`Vgpu::probe_detailed`] found no usable vGPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeError {
    /// No PCI function with vendor 0x1002 and hqdmux's device id on bus 0.
    NotFound,
    /// A BAR could not be sized/assigned, or MSI-X could not be set up.
    Pci(PciError),
    /// `VGPU_ID` is not "HQDG".
    BadId(u32),
    /// Unsupported `VGPU_VERSION`.
    BadVersion(u32),
    /// `NUM_VHQD`, `XCCS` or `CUS_PER_XCC` out of range.
    BadGeometry,
}

/// Driver errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The bump allocator ran past the end of RAM.
    OutOfMemory(OutOfMemory),
    /// The virtual HQD index is not below `NUM_VHQD`.
    BadIndex(u32),
    /// The virtual HQD is already loaded.
    Busy(u32),
    /// Ring size not a power of two of at least [`MIN_RING_PACKETS`].
    BadRingSize(u32),
    /// The host put the queue in error (`CP_HQD_ERROR` code) while loading it;
    /// the driver has unloaded it again.
    Queue {
        /// Virtual HQD index.
        vhqd: u32,
        /// `CP_HQD_ERROR` code.
        code: u32,
    },
    /// No free ring slot (the GPU has not consumed enough packets).
    RingFull,
    /// The ring is not driver memory (created with a foreign ring address).
    RingNotWritable,
    /// The queue was destroyed.
    NotLoaded,
}

impl core::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            ProbeError::NotFound => f.write_str("no vGPU on PCI bus 0"),
            ProbeError::Pci(e) => write!(f, "PCI: {e}"),
            ProbeError::BadId(v) => write!(f, "VGPU_ID {}", Hex(v as u64)),
            ProbeError::BadVersion(v) => write!(f, "VGPU_VERSION {}", Dec(v as u64)),
            ProbeError::BadGeometry => f.write_str("bad NUM_VHQD/XCCS/CUS_PER_XCC"),
        }
    }
}

impl From<OutOfMemory> for Error {
    fn from(e: OutOfMemory) -> Error {
        Error::OutOfMemory(e)
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Error::OutOfMemory(e) => write!(
                f,
                "out of guest memory: {} bytes requested at {}, RAM ends at {}",
                Dec(e.size),
                Hex(e.next),
                Hex(e.end)
            ),
            Error::BadIndex(i) => write!(f, "no virtual HQD {}", Dec(i as u64)),
            Error::Busy(i) => write!(f, "virtual HQD {} already loaded", Dec(i as u64)),
            Error::BadRingSize(n) => write!(f, "bad ring size {} packets", Dec(n as u64)),
            Error::Queue { vhqd, code } => {
                write!(f, "queue {} error {}", Dec(vhqd as u64), Dec(code as u64))
            }
            Error::RingFull => f.write_str("ring full"),
            Error::RingNotWritable => f.write_str("ring not writable"),
            Error::NotLoaded => f.write_str("queue not loaded"),
        }
    }
}

/// A failed allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    /// Bytes requested.
    pub size: u64,
    /// Allocator position at the time.
    pub next: u64,
    /// End of RAM.
    pub end: u64,
}

// ---------------------------------------------------------------------------
// Memory access helpers.

#[inline]
fn mmio_read(addr: u64) -> u32 {
    // SAFETY: `addr` is a 4-byte aligned register inside a BAR that probe
    // assigned in the identity-mapped MMIO hole below 4 GiB.
    unsafe { read_volatile(addr as *const u32) }
}

#[inline]
fn mmio_write(addr: u64, v: u32) {
    compiler_fence(Ordering::SeqCst);
    // SAFETY: as `mmio_read`.
    unsafe { write_volatile(addr as *mut u32, v) }
    compiler_fence(Ordering::SeqCst);
}

/// Volatile 32-bit load from guest RAM owned by the driver.
#[inline]
fn ram_read32(addr: u64) -> u32 {
    // SAFETY: callers pass 4-byte aligned addresses from the allocator, which
    // hands out RAM (identity mapped) not used by the program image.
    unsafe { read_volatile(addr as *const u32) }
}

/// Volatile 32-bit store to guest RAM owned by the driver.
#[inline]
fn ram_write32(addr: u64, v: u32) {
    // SAFETY: as `ram_read32`.
    unsafe { write_volatile(addr as *mut u32, v) }
}

/// Volatile 64-bit load from guest RAM owned by the driver.
#[inline]
fn ram_read64(addr: u64) -> u64 {
    // SAFETY: as `ram_read32`, 8-byte aligned.
    unsafe { read_volatile(addr as *const u64) }
}

/// Volatile 64-bit store to guest RAM (one store: the GPU never sees a torn value).
#[inline]
fn ram_write64(addr: u64, v: u64) {
    // SAFETY: as `ram_read64`.
    unsafe { write_volatile(addr as *mut u64, v) }
}

const fn align_up(x: u64, align: u64) -> Option<u64> {
    match x.checked_add(align - 1) {
        Some(v) => Some(v & !(align - 1)),
        None => None,
    }
}

// ---------------------------------------------------------------------------
// Allocator.

/// Bump allocator over the largest free RAM region of the boot-info memory
/// map (the RAM after the program image).
///
/// Memory is never freed or reused, so every allocation is fresh RAM, which
/// is zero: nothing is cleared.
#[derive(Clone, Debug)]
pub struct Alloc {
    next: u64,
    end: u64,
}

impl Alloc {
    /// The largest free RAM region of the memory map (page aligned): the
    /// RAM after the image, or, in a VM with more than 4 GiB of RAM, the RAM
    /// above the MMIO hole (from 4 GiB; docs/boot.md).
    pub fn new(boot: &BootInfo) -> Alloc {
        match boot.largest_free_ram() {
            Some(r) => Alloc::with_range(r.base, r.base + r.size),
            None => Alloc::with_range(boot.image_end, boot.mem_bytes),
        }
    }

    /// Allocator over `[start rounded up to a page, end)`.
    pub fn with_range(start: u64, end: u64) -> Alloc {
        let next = align_up(start, PAGE).unwrap_or(end).min(end);
        Alloc { next, end }
    }

    /// `size` bytes aligned to `align` (a power of two); zero-filled because fresh.
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OutOfMemory> {
        let align = align.max(1).next_power_of_two();
        let err = OutOfMemory {
            size,
            next: self.next,
            end: self.end,
        };
        let start = align_up(self.next, align).ok_or(err)?;
        let end = start.checked_add(size).ok_or(err)?;
        if end > self.end {
            return Err(err);
        }
        self.next = end;
        Ok(start)
    }

    /// Next free address.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Bytes left.
    pub fn remaining(&self) -> u64 {
        self.end - self.next
    }

    /// `n` zeroed values of `T` in fresh RAM, e.g. tables that would
    /// otherwise be zeroed on the stack (with SSE stores the emulator lacks).
    ///
    /// # Safety
    /// All-zero bytes must be a valid `T` (integers, bools, `Option` of a
    /// reference...).
    pub unsafe fn zeroed<T>(&mut self, n: usize) -> Result<&'static mut [T], OutOfMemory> {
        let size = (core::mem::size_of::<T>() as u64).saturating_mul(n as u64);
        let addr = self.alloc(size, core::mem::align_of::<T>() as u64)?;
        // SAFETY: fresh, zero, identity-mapped RAM used by nothing else, aligned
        // for T; the caller vouches that zero is a valid T.
        Ok(core::slice::from_raw_parts_mut(addr as *mut T, n))
    }
}

// ---------------------------------------------------------------------------
// Device.

/// The probed vGPU.
#[derive(Clone, Debug)]
pub struct Vgpu {
    regs: u64,
    doorbells: u64,
    /// PCI device number on bus 0.
    pub pci_device: u8,
    /// `NUM_VHQD`.
    pub num_vhqd: u32,
    /// `XCCS`.
    pub xccs: u32,
    /// `CUS_PER_XCC`.
    pub cus_per_xcc: u32,
    /// `SES_PER_XCC`.
    pub ses_per_xcc: u32,
    /// `CTX_SAVE_SIZE` (minimum per XCC).
    pub ctx_save_size: u32,
}

impl Vgpu {
    /// Finds the vGPU on PCI, assigns its BARs, enables decoding and MSI-X,
    /// sets up the IDT and LAPIC, and checks the ID and version.
    pub fn probe(boot: &BootInfo) -> Option<Vgpu> {
        Vgpu::probe_detailed(boot).ok()
    }

    /// As [`Vgpu::probe`], saying why it failed.
    pub fn probe_detailed(boot: &BootInfo) -> Result<Vgpu, ProbeError> {
        let dev =
            pci::find(abi::pci::VENDOR_ID, abi::pci::DEVICE_ID).ok_or(ProbeError::NotFound)?;
        let mut hole = MmioAlloc::new(boot);
        let (bar0, _) = pci::assign_bar(dev, 0, &mut hole).map_err(ProbeError::Pci)?;
        let (bar2, _) = pci::assign_bar(dev, 2, &mut hole).map_err(ProbeError::Pci)?;
        pci::enable_memory(dev);
        let apic_id = irq::init();
        pci::setup_msix(
            dev,
            |n| match n {
                0 => bar0,
                2 => bar2,
                _ => 0,
            },
            abi::pci::msi_address(apic_id),
            irq::VECTOR_BASE,
            NUM_VECTORS as u16,
        )
        .map_err(ProbeError::Pci)?;
        let regs = bar0 + abi::pci::REGS_OFFSET;
        let id = mmio_read(regs + reg::VGPU_ID as u64);
        if id != VGPU_ID_VALUE {
            return Err(ProbeError::BadId(id));
        }
        let version = mmio_read(regs + reg::VGPU_VERSION as u64);
        if version != VGPU_ABI_VERSION {
            return Err(ProbeError::BadVersion(version));
        }
        let g = Vgpu {
            regs,
            doorbells: bar2,
            pci_device: dev,
            num_vhqd: mmio_read(regs + reg::NUM_VHQD as u64),
            xccs: mmio_read(regs + reg::XCCS as u64),
            cus_per_xcc: mmio_read(regs + reg::CUS_PER_XCC as u64),
            ses_per_xcc: mmio_read(regs + reg::SES_PER_XCC as u64),
            ctx_save_size: mmio_read(regs + reg::CTX_SAVE_SIZE as u64),
        };
        if g.num_vhqd == 0
            || g.num_vhqd as usize > MAX_VHQD
            || g.num_vhqd as usize > abi::vgpu::NUM_VHQD
            || NUM_VECTORS > irq::MAX_VECTORS
            || g.xccs == 0
            || g.xccs > 64
            || g.cus_per_xcc == 0
        {
            return Err(ProbeError::BadGeometry);
        }
        Ok(g)
    }

    /// BAR0 register block base.
    pub fn regs_base(&self) -> u64 {
        self.regs
    }

    /// BAR2 doorbell base.
    pub fn doorbell_base(&self) -> u64 {
        self.doorbells
    }

    fn hqd_reg(&self, vhqd: u32, off: usize) -> u64 {
        self.regs + (reg::HQD_BASE + reg::HQD_STRIDE * vhqd as usize + off) as u64
    }

    /// Per-XCC CWSR save size put in the MQD: the gfx9.4 formula for this
    /// partition, at least `CTX_SAVE_SIZE`, page aligned.
    pub fn ctx_save_per_xcc(&self) -> u32 {
        let formula = cwsr::ctx_save_bytes(self.cus_per_xcc, self.ses_per_xcc);
        let v = formula.max(self.ctx_save_size) as u64;
        align_up(v, PAGE).map_or(u32::MAX, |v| v.min(u32::MAX as u64) as u32)
    }

    /// Bytes of one queue's CWSR area: `XCCS` save areas, then `XCCS` debug
    /// areas, page aligned (`abi::mqd::cwsr::total_area_size`).
    pub fn cwsr_bytes(&self) -> u64 {
        let debug = cwsr::debug_memory_size(self.cus_per_xcc, self.ses_per_xcc);
        cwsr::total_area_size(self.ctx_save_per_xcc(), debug, self.xccs)
    }

    /// RAM needed by one queue with a ring of `ring_packets` (page-rounded parts).
    pub fn queue_bytes(&self, ring_packets: u32) -> u64 {
        let ring = align_up(ring_packets as u64 * PACKET_SIZE as u64, PAGE).unwrap_or(u64::MAX);
        // MQD page, amd_queue_t page, EOP, ring, CWSR area.
        (3 * PAGE)
            .saturating_add(ring)
            .saturating_add(self.cwsr_bytes())
    }

    /// `CP_HQD_ERROR` of virtual HQD `vhqd` (0 = no error).
    pub fn hqd_error(&self, vhqd: u32) -> u32 {
        mmio_read(self.hqd_reg(vhqd, reg::CP_HQD_ERROR))
    }

    /// `CP_HQD_STATE` of virtual HQD `vhqd`.
    pub fn hqd_state(&self, vhqd: u32) -> u32 {
        mmio_read(self.hqd_reg(vhqd, reg::CP_HQD_STATE))
    }

    /// `CP_HQD_ACTIVE` of virtual HQD `vhqd`.
    pub fn hqd_active(&self, vhqd: u32) -> bool {
        mmio_read(self.hqd_reg(vhqd, reg::CP_HQD_ACTIVE)) & 1 == 1
    }

    /// Unloads virtual HQD `vhqd` (clears a sticky error): writes
    /// `CP_HQD_DEQUEUE_REQUEST` = 1 (drain) and polls `CP_HQD_ACTIVE` until 0.
    pub fn hqd_dequeue(&self, vhqd: u32) {
        mmio_write(self.hqd_reg(vhqd, reg::CP_HQD_DEQUEUE_REQUEST), 1);
        while self.hqd_active(vhqd) {
            core::hint::spin_loop();
        }
    }

    /// Sleeps (`sti; hlt`) until the `amd_signal_t` at `signal`, completed
    /// by packets of vHQD `vhqd`, is <= 0 ([`WaitResult::Done`]) or the
    /// error vector arrives ([`WaitResult::QueueError`]). Every wake-up of
    /// vHQD `vhqd`'s vector re-reads the signal.
    ///
    /// # Safety
    /// `signal` is an `amd_signal_t` in RAM, e.g. from [`Vgpu::new_signal`].
    pub unsafe fn wait(&self, vhqd: u32, signal: u64) -> WaitResult {
        let mine = 1u64 << (vhqd as u64 % 64);
        let err = 1u64 << ERROR_VECTOR;
        loop {
            irq::take(mine);
            compiler_fence(Ordering::SeqCst);
            // SAFETY: the caller's promise.
            if unsafe { Vgpu::signal_value(signal) } <= 0 {
                return WaitResult::Done;
            }
            if irq::take(err) != 0 {
                return WaitResult::QueueError;
            }
            irq::halt();
        }
    }

    /// Writes a kernel descriptor (64 bytes, 64-byte aligned, the bytes of
    /// [`KernelDescriptor::encode`]) and returns its address.
    pub fn write_kernel_descriptor(alloc: &mut Alloc, kd: &KernelDescriptor) -> Result<u64, Error> {
        let addr = alloc.alloc(KD_SIZE as u64, 64)?;
        ram_write32(addr, KD_MAGIC);
        ram_write32(addr + 4, KD_VERSION as u32 | (kd.kind as u32) << 16);
        ram_write64(addr + 8, kd.wg_cost_ns);
        ram_write32(addr + 16, kd.flags);
        Ok(addr)
    }

    /// A new interrupt signal: an `amd_signal_t` (64 bytes, 64-byte
    /// aligned) with `value`, an `event_mailbox_ptr` (+0x10) to a fresh
    /// 8-byte mailbox and `event_id` (+0x18) [`SIGNAL_EVENT_ID`], so its
    /// completion raises the vHQD's MSI-X vector (docs/vgpu-abi.md).
    pub fn new_signal(alloc: &mut Alloc, value: i64) -> Result<u64, Error> {
        let addr = alloc.alloc(AMD_SIGNAL_SIZE as u64, 64)?;
        let mailbox = alloc.alloc(8, 8)?;
        ram_write64(addr + AMD_SIGNAL_VALUE as u64, value as u64);
        ram_write64(addr + SIGNAL_EVENT_MAILBOX_PTR, mailbox);
        ram_write32(addr + SIGNAL_EVENT_ID_OFFSET, SIGNAL_EVENT_ID);
        Ok(addr)
    }

    /// Current value of the signal at `signal`.
    ///
    /// # Safety
    /// `signal` is an `amd_signal_t` in RAM, e.g. from [`Vgpu::new_signal`].
    pub unsafe fn signal_value(signal: u64) -> i64 {
        ram_read64(signal + AMD_SIGNAL_VALUE as u64) as i64
    }

    /// How many of the `n` u32 counters at `counters` differ from `expected`
    /// (volatile loads: written by the GPU, and never vectorised).
    ///
    /// # Safety
    /// `counters` is 4-byte aligned RAM of at least `4 * n` bytes, e.g. from
    /// [`Queue::submit_mark`].
    pub unsafe fn counters_differing(counters: u64, n: u32, expected: u32) -> u32 {
        let mut wrong = 0;
        for i in 0..n as u64 {
            if ram_read32(counters + 4 * i) != expected {
                wrong += 1;
            }
        }
        wrong
    }

    /// Creates and loads an AQL queue on virtual HQD `vhqd` with a ring of
    /// `ring_packets` (power of two >= [`MIN_RING_PACKETS`]) and queue priority `priority` (0..15).
    pub fn create_queue(
        &mut self,
        alloc: &mut Alloc,
        vhqd: u32,
        ring_packets: u32,
        priority: u32,
    ) -> Result<Queue, Error> {
        self.create_queue_with(alloc, vhqd, ring_packets, priority, None)
    }

    /// As [`Vgpu::create_queue`]; with `foreign_ring = Some(addr)` the MQD and
    /// `amd_queue_t` name `addr` as the ring and the driver never touches it
    /// (for hostile-input tests: packets cannot be submitted to such a queue,
    /// only [`Queue::set_write_index`] and [`Queue::ring`]).
    pub fn create_queue_with(
        &mut self,
        alloc: &mut Alloc,
        vhqd: u32,
        ring_packets: u32,
        priority: u32,
        foreign_ring: Option<u64>,
    ) -> Result<Queue, Error> {
        if vhqd >= self.num_vhqd {
            return Err(Error::BadIndex(vhqd));
        }
        if ring_packets < MIN_RING_PACKETS || !ring_packets.is_power_of_two() {
            return Err(Error::BadRingSize(ring_packets));
        }
        if self.hqd_active(vhqd) {
            return Err(Error::Busy(vhqd));
        }
        let ctx_per_xcc = self.ctx_save_per_xcc();
        let cwsr_bytes = self.cwsr_bytes();
        let mqd = alloc.alloc(PAGE, PAGE)?;
        let amd_queue = alloc.alloc(AMD_QUEUE_SIZE as u64, PAGE)?;
        let eop = alloc.alloc(EOP_BYTES, PAGE)?;
        let ring_bytes = ring_packets as u64 * PACKET_SIZE as u64;
        let ring = match foreign_ring {
            Some(a) => a,
            None => alloc.alloc(ring_bytes, PAGE)?,
        };
        // Never touched: written by the GPU when it saves the queue's waves.
        let ctx_save = alloc.alloc(cwsr_bytes, PAGE)?;

        if foreign_ring.is_none() {
            // As ROCr: every slot starts INVALID (fresh RAM would read as
            // type 0, VENDOR_SPECIFIC). Only the header dword of each slot.
            for i in 0..ring_packets as u64 {
                ram_write32(ring + i * PACKET_SIZE as u64, INVALID_HEADER as u32);
            }
        }
        // The bytes of `amd_queue_image(ring, ring_packets)` (rest zero).
        ram_write64(amd_queue + AMD_QUEUE_BASE_ADDRESS as u64, ring);
        ram_write32(amd_queue + AMD_QUEUE_SIZE_PACKETS as u64, ring_packets);

        let mut b = AqlMqdBuilder {
            mqd_addr: mqd,
            ring_base: ring,
            ring_packets,
            amd_queue,
            eop_base: eop,
            priority,
            vmid: 0,
            doorbell_offset: vhqd * 2, // 8-byte doorbell i at window offset 8 * i
            ..Default::default()
        }
        .cwsr_for(ctx_save, self.cus_per_xcc, self.ses_per_xcc);
        b.ctx_save_size = ctx_per_xcc;
        let m = b.build();
        for (i, d) in m.dw.iter().enumerate() {
            ram_write32(mqd + 4 * i as u64, *d);
        }

        mmio_write(self.hqd_reg(vhqd, reg::CP_MQD_BASE_ADDR), mqd as u32);
        mmio_write(
            self.hqd_reg(vhqd, reg::CP_MQD_BASE_ADDR_HI),
            (mqd >> 32) as u32,
        );
        mmio_write(self.hqd_reg(vhqd, reg::CP_HQD_ACTIVE), 1);
        let code = self.hqd_error(vhqd);
        if code != 0 {
            self.hqd_dequeue(vhqd);
            return Err(Error::Queue { vhqd, code });
        }
        Ok(Queue {
            vhqd,
            regs: self.hqd_reg(vhqd, 0),
            doorbell: self.doorbells + 8 * vhqd as u64,
            mqd,
            amd_queue,
            eop,
            ring,
            ring_packets,
            ctx_save,
            ctx_save_bytes: cwsr_bytes,
            ring_writable: foreign_ring.is_none(),
            loaded: true,
            wptr: 0,
        })
    }
}

// ---------------------------------------------------------------------------
// Queue.

/// A loaded AQL queue on one virtual HQD.
#[derive(Debug)]
pub struct Queue {
    vhqd: u32,
    regs: u64,
    doorbell: u64,
    mqd: u64,
    amd_queue: u64,
    eop: u64,
    ring: u64,
    ring_packets: u32,
    ctx_save: u64,
    ctx_save_bytes: u64,
    ring_writable: bool,
    loaded: bool,
    wptr: u64,
}

impl Queue {
    /// Virtual HQD index.
    pub fn index(&self) -> u32 {
        self.vhqd
    }
    /// MQD address.
    pub fn mqd_addr(&self) -> u64 {
        self.mqd
    }
    /// `amd_queue_t` address.
    pub fn amd_queue_addr(&self) -> u64 {
        self.amd_queue
    }
    /// EOP buffer address.
    pub fn eop_addr(&self) -> u64 {
        self.eop
    }
    /// Ring address.
    pub fn ring_addr(&self) -> u64 {
        self.ring
    }
    /// Ring size in packets.
    pub fn ring_packets(&self) -> u32 {
        self.ring_packets
    }
    /// CWSR area (base, bytes).
    pub fn cwsr_area(&self) -> (u64, u64) {
        (self.ctx_save, self.ctx_save_bytes)
    }
    /// Is the queue loaded (not destroyed)?
    pub fn is_loaded(&self) -> bool {
        self.loaded
    }

    /// Write index (packets) published so far.
    pub fn write_index(&self) -> u64 {
        self.wptr
    }

    /// Read index (packets) the GPU reported in `amd_queue_t.read_dispatch_id`.
    pub fn read_index(&self) -> u64 {
        ram_read64(self.amd_queue + AMD_QUEUE_READ_DISPATCH_ID as u64)
    }

    /// Checks that the next packet may be written; returns its slot address.
    fn next_slot(&self) -> Result<u64, Error> {
        if !self.loaded {
            return Err(Error::NotLoaded);
        }
        if !self.ring_writable {
            return Err(Error::RingNotWritable);
        }
        if self.wptr.wrapping_sub(self.read_index()) >= self.ring_packets as u64 {
            return Err(Error::RingFull);
        }
        Ok(self.ring + (self.wptr & (self.ring_packets as u64 - 1)) * PACKET_SIZE as u64)
    }

    /// Stores header and `setup` (one 32-bit store, after the body) and
    /// publishes the packet in `write_dispatch_id`. Returns its index.
    fn commit(&mut self, slot: u64, barrier: bool, setup: u16) -> u64 {
        compiler_fence(Ordering::Release);
        let header = Header::system(TYPE_KERNEL_DISPATCH, barrier).encode();
        ram_write32(slot, header as u32 | (setup as u32) << 16);
        compiler_fence(Ordering::Release);
        let idx = self.wptr;
        self.set_write_index(idx + 1);
        idx
    }

    /// Publishes a kernel dispatch in the next ring slot: the body (the
    /// bytes of `Packet::dispatch(*d, barrier).encode_body()`), then header and
    /// `setup` as one 32-bit store, then `write_dispatch_id`. System-scope
    /// fences. Does not ring the doorbell. Returns the packet index.
    pub fn submit_dispatch(&mut self, d: &KernelDispatch, barrier: bool) -> Result<u64, Error> {
        let slot = self.next_slot()?;
        // A reused slot holds the previous packet: every body byte is written.
        ram_write32(
            slot + 4,
            d.workgroup_size[0] as u32 | (d.workgroup_size[1] as u32) << 16,
        );
        ram_write32(slot + 8, d.workgroup_size[2] as u32); // + reserved0
        ram_write32(slot + 12, d.grid_size[0]);
        ram_write32(slot + 16, d.grid_size[1]);
        ram_write32(slot + 20, d.grid_size[2]);
        ram_write32(slot + 24, d.private_segment_size);
        ram_write32(slot + 28, d.group_segment_size);
        ram_write64(slot + 32, d.kernel_object);
        ram_write64(slot + 40, d.kernarg_address);
        ram_write64(slot + 48, 0); // reserved2
        ram_write64(slot + 56, d.completion_signal);
        Ok(self.commit(slot, barrier, d.setup))
    }

    /// As [`Queue::submit_dispatch`] with
    /// `KernelDispatch::one_d(kernel_object, kernarg, wg, groups, signal)`
    /// (built in place: that constructor's code uses SSE the emulator lacks).
    pub fn submit_one_d(
        &mut self,
        kernel_object: u64,
        kernarg: u64,
        wg: u16,
        groups: u32,
        signal: u64,
        barrier: bool,
    ) -> Result<u64, Error> {
        let slot = self.next_slot()?;
        ram_write32(slot + 4, wg as u32 | 1 << 16); // workgroup x, y = 1
        ram_write32(slot + 8, 1); // workgroup z = 1, reserved0
        ram_write32(slot + 12, (wg as u32).saturating_mul(groups));
        ram_write32(slot + 16, 1);
        ram_write32(slot + 20, 1);
        ram_write32(slot + 24, 0);
        ram_write32(slot + 28, 0);
        ram_write64(slot + 32, kernel_object);
        ram_write64(slot + 40, kernarg);
        ram_write64(slot + 48, 0);
        ram_write64(slot + 56, signal);
        Ok(self.commit(slot, barrier, 1))
    }

    /// Submits a `mark` dispatch of `workgroups` workgroups of
    /// [`MARK_WG_SIZE`] work-items, kernel descriptor at `kd_addr` (a
    /// [`abi::kernel::KernelKind::Mark`] descriptor): allocates a completion
    /// signal (value 1), the kernarg segment (`Kernarg::Mark`) and
    /// `workgroups` zeroed u32 counters. Returns (signal, counters) addresses.
    pub fn submit_mark(
        &mut self,
        alloc: &mut Alloc,
        kd_addr: u64,
        workgroups: u32,
        barrier: bool,
    ) -> Result<(u64, u64), Error> {
        self.next_slot()?;
        let signal = Vgpu::new_signal(alloc, 1)?;
        let kernarg = alloc.alloc(64, 64)?;
        let counters = alloc.alloc(4 * workgroups as u64, 64)?;
        // Kernarg::Mark layout: counters u64 @0, n u32 @8.
        ram_write64(kernarg, counters);
        ram_write32(kernarg + 8, workgroups);
        self.submit_one_d(kd_addr, kernarg, MARK_WG_SIZE, workgroups, signal, barrier)?;
        Ok((signal, counters))
    }

    /// Stores `idx` in `amd_queue_t.write_dispatch_id` (the MQD's wptr poll
    /// address) without writing packets. [`Queue::submit`] uses it; calling
    /// it directly is for hostile-input tests.
    pub fn set_write_index(&mut self, idx: u64) {
        self.wptr = idx;
        compiler_fence(Ordering::Release);
        ram_write64(self.amd_queue + AMD_QUEUE_WRITE_DISPATCH_ID as u64, idx);
        compiler_fence(Ordering::Release);
    }

    /// Rings the queue's doorbell: one 64-bit store of the write index to
    /// BAR2 + 8 * vHQD (a KVM ioeventfd: no exit to the VMM).
    pub fn ring(&self) {
        compiler_fence(Ordering::SeqCst);
        // SAFETY: the doorbell lies in BAR2, assigned by probe in the
        // identity-mapped MMIO hole.
        unsafe { write_volatile(self.doorbell as *mut u64, self.wptr) }
        compiler_fence(Ordering::SeqCst);
    }

    /// `CP_HQD_ERROR` (0 = no error).
    pub fn error(&self) -> u32 {
        mmio_read(self.regs + reg::CP_HQD_ERROR as u64)
    }

    /// Writes `CP_HQD_DEQUEUE_REQUEST` = `mode` (`abi::vgpu::dequeue`)
    /// without waiting; [`Queue::active`] reads false once it finished.
    pub fn request_dequeue(&self, mode: u32) {
        mmio_write(self.regs + reg::CP_HQD_DEQUEUE_REQUEST as u64, mode);
    }

    /// `CP_HQD_ACTIVE`: loaded, or its dequeue not finished.
    pub fn active(&self) -> bool {
        mmio_read(self.regs + reg::CP_HQD_ACTIVE as u64) & 1 == 1
    }

    /// `CP_HQD_STATE`.
    pub fn state(&self) -> u32 {
        mmio_read(self.regs + reg::CP_HQD_STATE as u64)
    }

    /// `CP_HQD_PQ_RPTR` (packets, low 32 bits).
    pub fn rptr_reg(&self) -> u32 {
        mmio_read(self.regs + reg::CP_HQD_PQ_RPTR as u64)
    }

    /// Unloads the queue (`CP_HQD_DEQUEUE_REQUEST` = 1, then polls
    /// `CP_HQD_ACTIVE` until 0). Idempotent.
    pub fn destroy(&mut self) {
        if self.loaded {
            mmio_write(self.regs + reg::CP_HQD_DEQUEUE_REQUEST as u64, 1);
            while mmio_read(self.regs + reg::CP_HQD_ACTIVE as u64) & 1 == 1 {
                core::hint::spin_loop();
            }
            self.loaded = false;
        }
    }
}
