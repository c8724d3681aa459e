//! A small PCI enumerator: configuration mechanism #1 (ports 0xCF8/0xCFC),
//! bus 0, function 0 of each device; BAR sizing and assignment in the MMIO
//! hole of the boot-info memory map; MSI-X programming (docs/vgpu-abi.md,
//! "Finding the device").

use core::ptr::{read_volatile, write_volatile};

use abi::pci::{
    cfg, config_address, CAP_ID_MSIX, COMMAND_BUS_MASTER, COMMAND_INTX_DISABLE, COMMAND_MEMORY,
    CONFIG_ADDRESS_PORT, CONFIG_DATA_PORT, MSIX_ENABLE, MSIX_ENTRY_SIZE, MSIX_FUNCTION_MASK,
    STATUS_CAP_LIST,
};

use crate::boot::{region_kind, BootInfo};
use crate::io::{inl, outl};

/// Reads the config dword at `offset & !3` of bus 0, `device`, function 0.
pub fn read32(device: u8, offset: u8) -> u32 {
    outl(CONFIG_ADDRESS_PORT, config_address(0, device, 0, offset));
    inl(CONFIG_DATA_PORT)
}

/// Writes the config dword at `offset & !3`.
pub fn write32(device: u8, offset: u8, value: u32) {
    outl(CONFIG_ADDRESS_PORT, config_address(0, device, 0, offset));
    outl(CONFIG_DATA_PORT, value);
}

/// The first device on bus 0 with `vendor` and `device_id` (function 0).
pub fn find(vendor: u16, device_id: u16) -> Option<u8> {
    let want = u32::from(vendor) | u32::from(device_id) << 16;
    (0..32u8).find(|&d| read32(d, cfg::VENDOR_ID as u8) == want)
}

/// Why a BAR could not be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PciError {
    /// The BAR is not implemented, is I/O or 64-bit.
    NotMemory32,
    /// No room left in the MMIO hole.
    NoSpace,
    /// The function has no MSI-X capability.
    NoMsix,
    /// The MSI-X table is in a BAR this driver did not assign, or too small.
    BadMsixTable,
}

impl core::fmt::Display for PciError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            PciError::NotMemory32 => "BAR is not 32-bit memory",
            PciError::NoSpace => "no room in the MMIO hole",
            PciError::NoMsix => "no MSI-X capability",
            PciError::BadMsixTable => "bad MSI-X table location",
        })
    }
}

/// Bump allocator over the MMIO hole (first `region_kind::MMIO` region of
/// the memory map, below 4 GiB and below the local APIC page).
pub struct MmioAlloc {
    next: u64,
    end: u64,
}

impl MmioAlloc {
    /// The hole from the memory map (empty if there is none).
    pub fn new(boot: &BootInfo) -> MmioAlloc {
        let r = boot.regions().iter().find(|r| r.kind == region_kind::MMIO);
        let (base, size) = r.map_or((0, 0), |r| (r.base, r.size));
        let end = base
            .saturating_add(size)
            .min(abi::pci::LAPIC_BASE)
            .min(1 << 32);
        MmioAlloc { next: base, end }
    }

    /// Moves the allocator past `[base, base + size)` when that range lies
    /// at or after its next free address (a BAR placed by someone else).
    pub fn reserve(&mut self, base: u64, size: u64) {
        let end = base.saturating_add(size);
        if end > self.next && base < self.end {
            self.next = end;
        }
    }

    /// `size` bytes (a power of two) aligned to `size`.
    pub fn alloc(&mut self, size: u64) -> Option<u64> {
        let start = self.next.checked_add(size - 1)? & !(size - 1);
        let end = start.checked_add(size)?;
        (end <= self.end).then(|| {
            self.next = end;
            start
        })
    }
}

/// Sizes memory BAR `n` of `device` (write all ones, read the mask back)
/// and returns (base, size). A BAR the VMM or firmware already placed
/// (non-zero, aligned to its size, below the local APIC: Cloud Hypervisor,
/// QEMU's SeaBIOS) keeps its address, and `hole` skips past it; a BAR at 0
/// (hqdmux's own VMM) is assigned from `hole`. Decoding must be off.
pub fn assign_bar(device: u8, n: u8, hole: &mut MmioAlloc) -> Result<(u64, u64), PciError> {
    let off = cfg::BAR0 as u8 + 4 * n;
    let old = read32(device, off);
    write32(device, off, u32::MAX);
    let mask = read32(device, off);
    // Bit 0: I/O space; bits 2:1: type (0 = 32-bit).
    if mask == 0 || mask == u32::MAX || mask & 0x7 != 0 {
        write32(device, off, old);
        return Err(PciError::NotMemory32);
    }
    let size = u64::from(!(mask & !0xF)) + 1;
    let placed = u64::from(old & !0xF);
    if placed != 0 && placed & (size - 1) == 0 && placed + size <= abi::pci::LAPIC_BASE {
        write32(device, off, old);
        hole.reserve(placed, size);
        return Ok((placed, size));
    }
    let base = hole.alloc(size).ok_or(PciError::NoSpace)?;
    write32(device, off, base as u32);
    Ok((base, size))
}

/// Turns on memory decoding and bus mastering (INTx off).
pub fn enable_memory(device: u8) {
    let c = read32(device, cfg::COMMAND as u8);
    let cmd = (c & 0xFFFF) as u16 | COMMAND_MEMORY | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE;
    // The upper half is STATUS (write-one-to-clear bits): write 0 there.
    write32(device, cfg::COMMAND as u8, u32::from(cmd));
}

/// Config offset of capability `id`, walking the list from 0x34 (at most 48 hops).
pub fn find_capability(device: u8, id: u8) -> Option<u8> {
    let status = (read32(device, cfg::COMMAND as u8) >> 16) as u16;
    if status & STATUS_CAP_LIST == 0 {
        return None;
    }
    let mut p = (read32(device, cfg::CAP_PTR as u8) & 0xFC) as u8;
    for _ in 0..48 {
        if p < 0x40 {
            return None;
        }
        let d = read32(device, p);
        if d & 0xFF == u32::from(id) {
            return Some(p);
        }
        p = ((d >> 8) & 0xFC) as u8;
    }
    None
}

/// Programs MSI-X: entry `i` gets address `msi_address` and data
/// `first_vector + i` for `i < count`, unmasked; then MSI-X is enabled with
/// the function unmasked. `bar(n)` is the assigned base of BAR `n` (0 = not
/// assigned; a function, not an array: zeroing a small array compiles to
/// SSE stores the emulator lacks). Returns the table size (vectors).
pub fn setup_msix(
    device: u8,
    bar: impl Fn(usize) -> u64,
    msi_address: u32,
    first_vector: u8,
    count: u16,
) -> Result<u16, PciError> {
    let cap = find_capability(device, CAP_ID_MSIX).ok_or(PciError::NoMsix)?;
    let ctl = (read32(device, cap) >> 16) as u16;
    let size = (ctl & 0x7FF) + 1;
    let tab = read32(device, cap + 4);
    let bir = (tab & 7) as usize;
    let base = if bir < 6 { bar(bir) } else { 0 };
    if base == 0 || count > size {
        return Err(PciError::BadMsixTable);
    }
    let table = base + u64::from(tab & !7);
    // Enabled but function-masked while the entries are written.
    let hdr = read32(device, cap) & 0xFFFF;
    write32(
        device,
        cap,
        hdr | u32::from(MSIX_ENABLE | MSIX_FUNCTION_MASK) << 16,
    );
    for i in 0..u64::from(count) {
        let e = table + i * MSIX_ENTRY_SIZE;
        // SAFETY: the table lies in a BAR this driver assigned in the MMIO
        // hole (identity mapped, uncached); 32-bit accesses as the spec asks.
        unsafe {
            write_volatile(e as *mut u32, msi_address);
            write_volatile((e + 4) as *mut u32, 0);
            write_volatile((e + 8) as *mut u32, u32::from(first_vector) + i as u32);
            write_volatile((e + 12) as *mut u32, 0);
        }
    }
    write32(device, cap, hdr | u32::from(MSIX_ENABLE) << 16);
    // SAFETY: as above; reading back the first entry's data orders the writes.
    let _ = unsafe { read_volatile((table + 8) as *const u32) };
    Ok(size)
}
