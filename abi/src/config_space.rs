//! A PCI type-0 configuration space with per-bit write masks, and the
//! vGPU's own ([`vgpu_config_space`]): one builder shared by the VMM's
//! in-process PCI function and the out-of-process vfio-user server, so both
//! present the same identity, BARs and MSI-X capability.
//!
//! BARs are sized the usual way (write all ones, read the mask back) and
//! assigned by the guest; read-only fields ignore writes; accesses of a bad
//! width, or crossing a dword, read all ones and are not written.

use crate::pci::{
    cfg, BAR0_SIZE, BAR2_SIZE, CAP_ID_MSIX, COMMAND_BUS_MASTER, COMMAND_INTX_DISABLE,
    COMMAND_MEMORY, MSIX_CAP_OFFSET, MSIX_PBA_OFFSET, MSIX_TABLE_OFFSET, STATUS_CAP_LIST,
};

/// Bytes of a function's configuration space.
pub const CONFIG_BYTES: usize = 256;
const DWORDS: usize = CONFIG_BYTES / 4;

/// Identity of a function.
#[derive(Clone, Copy, Debug)]
pub struct Identity {
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// Class code.
    pub class: u8,
    /// Subclass.
    pub subclass: u8,
    /// Programming interface.
    pub prog_if: u8,
    /// Revision id.
    pub revision: u8,
    /// Subsystem vendor id.
    pub subsystem_vendor: u16,
    /// Subsystem id.
    pub subsystem: u16,
}

/// A type-0 configuration space with write masks.
#[derive(Clone)]
pub struct ConfigSpace {
    regs: [u32; DWORDS],
    writable: [u32; DWORDS],
}

/// True for a config access of 1, 2 or 4 bytes inside one dword of the space.
pub fn access_ok(offset: usize, len: usize) -> bool {
    matches!(len, 1 | 2 | 4) && offset < CONFIG_BYTES && offset % 4 + len <= 4
}

impl ConfigSpace {
    /// A header with `id`; COMMAND's memory, bus-master and INTx-disable bits
    /// and the interrupt line are writable, everything else read-only.
    pub fn new(id: Identity) -> Self {
        let mut c = ConfigSpace {
            regs: [0; DWORDS],
            writable: [0; DWORDS],
        };
        c.regs[cfg::VENDOR_ID / 4] = u32::from(id.vendor) | u32::from(id.device) << 16;
        c.regs[cfg::REVISION / 4] = u32::from(id.revision)
            | u32::from(id.prog_if) << 8
            | u32::from(id.subclass) << 16
            | u32::from(id.class) << 24;
        c.regs[cfg::SUBSYSTEM_VENDOR_ID / 4] =
            u32::from(id.subsystem_vendor) | u32::from(id.subsystem) << 16;
        c.writable[cfg::COMMAND / 4] =
            u32::from(COMMAND_MEMORY | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE);
        c.writable[cfg::INTERRUPT_LINE / 4] = 0xFF;
        c
    }

    /// Makes BAR `n` (0..6) a 32-bit non-prefetchable memory BAR of `size`
    /// bytes (a power of two, at least 16).
    pub fn add_memory_bar(&mut self, n: usize, size: u32) {
        assert!(n < 6 && size.is_power_of_two() && size >= 16, "bad BAR");
        self.writable[cfg::BAR0 / 4 + n] = !(size - 1);
    }

    /// Adds a capability at `offset` (dword aligned, >= 0x40) whose first
    /// dword is `header` (id in bits 7:0; the next pointer is filled in) and
    /// following dwords `body`; links it at the head of the list.
    pub fn add_capability(&mut self, offset: usize, header: u32, body: &[u32]) {
        assert!(
            offset >= 0x40
                && offset.is_multiple_of(4)
                && offset + 4 * (body.len() + 1) <= CONFIG_BYTES
        );
        let next = self.regs[cfg::CAP_PTR / 4] & 0xFF;
        self.regs[offset / 4] = (header & !0xFF00) | next << 8;
        for (i, d) in body.iter().enumerate() {
            self.regs[offset / 4 + 1 + i] = *d;
        }
        self.regs[cfg::CAP_PTR / 4] = (self.regs[cfg::CAP_PTR / 4] & !0xFF) | offset as u32;
        self.regs[cfg::COMMAND / 4] |= u32::from(STATUS_CAP_LIST) << 16;
    }

    /// The dword at `offset & !3`.
    pub fn dword(&self, offset: usize) -> u32 {
        self.regs.get(offset / 4).copied().unwrap_or(u32::MAX)
    }

    /// Guest read; bad accesses read all ones.
    pub fn read(&self, offset: usize, data: &mut [u8]) {
        read_from_dword(self.dword(offset), offset, data);
    }

    /// Guest write through the write masks; false (nothing written) for a bad access.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> bool {
        if !access_ok(offset, data.len()) {
            return false;
        }
        let shift = 8 * (offset % 4);
        let mut val = 0u32;
        let mut bytes = 0u32;
        for (i, b) in data.iter().enumerate() {
            val |= u32::from(*b) << (8 * i + shift);
            bytes |= 0xFF << (8 * i + shift);
        }
        let i = offset / 4;
        let mask = self.writable[i] & bytes;
        self.regs[i] = (self.regs[i] & !mask) | (val & mask);
        true
    }

    /// COMMAND.
    pub fn command(&self) -> u16 {
        self.regs[cfg::COMMAND / 4] as u16
    }

    /// Guest-assigned address of memory BAR `n` (0 if never assigned).
    pub fn bar_address(&self, n: usize) -> u64 {
        let i = cfg::BAR0 / 4 + n;
        u64::from(self.regs[i] & self.writable[i])
    }
}

/// Copies the bytes of `dword` that a config read of `data.len()` at
/// `offset` returns; all ones for a bad access.
pub fn read_from_dword(dword: u32, offset: usize, data: &mut [u8]) {
    if !access_ok(offset, data.len()) {
        data.fill(0xFF);
        return;
    }
    let b = dword.to_le_bytes();
    let s = offset % 4;
    data.copy_from_slice(&b[s..s + data.len()]);
}

/// The PCI identity of the vGPU (`abi::pci`).
pub const fn vgpu_identity() -> Identity {
    Identity {
        vendor: crate::pci::VENDOR_ID,
        device: crate::pci::DEVICE_ID,
        class: crate::pci::CLASS,
        subclass: crate::pci::SUBCLASS,
        prog_if: crate::pci::PROG_IF,
        revision: crate::pci::REVISION,
        subsystem_vendor: crate::pci::SUBSYSTEM_VENDOR_ID,
        subsystem: crate::pci::SUBSYSTEM_ID,
    }
}

/// The vGPU's config space: identity, BAR0 16 KiB, BAR2 4 KiB, MSI-X
/// capability at 0x40 (table BIR 0 at 0x2000, PBA BIR 0 at 0x3000).
pub fn vgpu_config_space() -> ConfigSpace {
    let mut c = ConfigSpace::new(vgpu_identity());
    c.add_memory_bar(0, BAR0_SIZE as u32);
    c.add_memory_bar(2, BAR2_SIZE as u32);
    c.add_capability(
        usize::from(MSIX_CAP_OFFSET),
        u32::from(CAP_ID_MSIX) | (crate::vgpu::NUM_VECTORS as u32 - 1) << 16,
        &[MSIX_TABLE_OFFSET as u32, MSIX_PBA_OFFSET as u32],
    );
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vgpu_space_has_its_identity_bars_and_msix_capability() {
        let mut c = vgpu_config_space();
        assert_eq!(c.dword(0), 0x0FD0_1002);
        assert_eq!(c.dword(cfg::REVISION), 0x1200_0002);
        assert_eq!(c.dword(cfg::CAP_PTR) & 0xFF, 0x40);
        assert_eq!(c.dword(0x40) & 0xFF, u32::from(CAP_ID_MSIX));
        assert_eq!(c.dword(0x44), 0x2000);
        assert_eq!(c.dword(0x48), 0x3000);
        assert!(c.write(cfg::BAR0, &u32::MAX.to_le_bytes()));
        assert_eq!(c.dword(cfg::BAR0), 0xFFFF_C000);
        assert!(c.write(cfg::BAR0 + 8, &u32::MAX.to_le_bytes()));
        assert_eq!(c.dword(cfg::BAR0 + 8), 0xFFFF_F000);
        assert!(!c.write(cfg::BAR0 + 3, &[0, 0]), "crosses a dword");
    }
}
