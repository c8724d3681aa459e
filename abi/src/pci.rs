//! The vGPU as a PCI function (docs/vgpu-abi.md, "Finding the device"):
//! identity, BAR layout, MSI-X layout and the configuration mechanism #1
//! ports, shared by the VMM's PCI model and the guests' enumerator.

/// Configuration mechanism #1: 32-bit `CONFIG_ADDRESS` port.
pub const CONFIG_ADDRESS_PORT: u16 = 0xCF8;
/// Configuration mechanism #1: `CONFIG_DATA` port (0xCFC..0xCFF).
pub const CONFIG_DATA_PORT: u16 = 0xCFC;
/// `CONFIG_ADDRESS` enable bit.
pub const CONFIG_ENABLE: u32 = 1 << 31;

/// `CONFIG_ADDRESS` value of (bus, device, function, register offset).
pub const fn config_address(bus: u8, device: u8, function: u8, offset: u8) -> u32 {
    CONFIG_ENABLE
        | (bus as u32) << 16
        | ((device as u32) & 0x1F) << 11
        | ((function as u32) & 0x7) << 8
        | (offset as u32 & 0xFC)
}

/// Vendor id of the vGPU (AMD).
pub const VENDOR_ID: u16 = 0x1002;
/// Device id of the vGPU: hqdmux's own. No AMD device id starting with a 0
/// nibble exists in pci.ids (Debian `pci.ids` 0.0~2023.04.11), so no real
/// amdgpu driver binds to it.
pub const DEVICE_ID: u16 = 0x0FD0;
/// Subsystem vendor id.
pub const SUBSYSTEM_VENDOR_ID: u16 = 0x1002;
/// Subsystem id.
pub const SUBSYSTEM_ID: u16 = DEVICE_ID;
/// Class code: processing accelerator.
pub const CLASS: u8 = 0x12;
/// Subclass.
pub const SUBCLASS: u8 = 0x00;
/// Programming interface.
pub const PROG_IF: u8 = 0x00;
/// Revision id: the vGPU ABI version (2).
pub const REVISION: u8 = 2;

/// PCI device number of the host bridge on bus 0.
pub const HOST_BRIDGE_DEVICE: u8 = 0;
/// PCI device number of the vGPU on bus 0 (function 0).
pub const VGPU_DEVICE: u8 = 4;
/// Host bridge device id (hqdmux's own, as [`DEVICE_ID`]).
pub const HOST_BRIDGE_DEVICE_ID: u16 = 0x0FD1;

/// BAR0 (registers, MSI-X table, PBA): 32-bit non-prefetchable memory.
pub const BAR0_SIZE: u64 = 16 * 1024;
/// Register block in BAR0 (`abi::vgpu::reg`, decoded by the front end).
pub const REGS_OFFSET: u64 = 0x0000;
/// Register block size.
pub const REGS_SIZE: u64 = 0x1000;
/// MSI-X table offset in BAR0 (BIR 0).
pub const MSIX_TABLE_OFFSET: u64 = 0x2000;
/// MSI-X pending-bit array offset in BAR0 (BIR 0).
pub const MSIX_PBA_OFFSET: u64 = 0x3000;
/// Bytes per MSI-X table entry (address lo, address hi, data, vector control).
pub const MSIX_ENTRY_SIZE: u64 = 16;
/// BAR2 (doorbells): 32-bit non-prefetchable memory.
pub const BAR2_SIZE: u64 = 4 * 1024;
/// Doorbell of vHQD `i` is at BAR2 + `DOORBELL_STRIDE * i` (64-bit store of the write index).
pub const DOORBELL_STRIDE: u64 = 8;

/// Config space offset of the MSI-X capability.
pub const MSIX_CAP_OFFSET: u8 = 0x40;
/// MSI-X capability id.
pub const CAP_ID_MSIX: u8 = 0x11;
/// MSI-X message control: enable bit.
pub const MSIX_ENABLE: u16 = 1 << 15;
/// MSI-X message control: function mask bit.
pub const MSIX_FUNCTION_MASK: u16 = 1 << 14;
/// MSI-X vector control: per-vector mask bit.
pub const MSIX_VECTOR_MASKED: u32 = 1;

/// Configuration space header offsets (type 0) used here.
pub mod cfg {
    /// u16 vendor id.
    pub const VENDOR_ID: usize = 0x00;
    /// u16 device id.
    pub const DEVICE_ID: usize = 0x02;
    /// u16 command.
    pub const COMMAND: usize = 0x04;
    /// u16 status.
    pub const STATUS: usize = 0x06;
    /// u8 revision, then prog-if, subclass, class.
    pub const REVISION: usize = 0x08;
    /// u8 header type.
    pub const HEADER_TYPE: usize = 0x0E;
    /// u32 BAR0 (BARn at `BAR0 + 4 * n`).
    pub const BAR0: usize = 0x10;
    /// u16 subsystem vendor id.
    pub const SUBSYSTEM_VENDOR_ID: usize = 0x2C;
    /// u16 subsystem id.
    pub const SUBSYSTEM_ID: usize = 0x2E;
    /// u8 capabilities pointer.
    pub const CAP_PTR: usize = 0x34;
    /// u8 interrupt line.
    pub const INTERRUPT_LINE: usize = 0x3C;
}

/// COMMAND: memory space decoding.
pub const COMMAND_MEMORY: u16 = 1 << 1;
/// COMMAND: bus master.
pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
/// COMMAND: legacy INTx disable.
pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
/// STATUS: capability list present.
pub const STATUS_CAP_LIST: u16 = 1 << 4;

/// xAPIC MSI address of the local APIC with id `apic_id` (physical destination).
pub const fn msi_address(apic_id: u8) -> u32 {
    0xFEE0_0000 | (apic_id as u32) << 12
}

/// Guest-physical address of the local APIC page (xAPIC).
pub const LAPIC_BASE: u64 = 0xFEE0_0000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_address_packs_fields_and_drops_the_low_offset_bits() {
        assert_eq!(config_address(0, VGPU_DEVICE, 0, 0x10), 0x8000_2010);
        assert_eq!(config_address(1, 31, 7, 0xFF), 0x8001_FFFC);
        assert_eq!(msi_address(3), 0xFEE0_3000);
        const { assert!(MSIX_PBA_OFFSET + 8 <= BAR0_SIZE) };
        const { assert!(REGS_OFFSET + REGS_SIZE <= MSIX_TABLE_OFFSET) };
    }
}
