//! The vGPU windows of one VM: thin MMIO adapters from the bus to the VM's
//! front end (`mdev::vgpu::VgpuFrontEnd`, docs/vgpu-abi.md).

use std::sync::Arc;

use mdev::vgpu::VgpuFrontEnd;

use crate::bus::{BusAction, BusDevice};

/// Guest-physical base of the vGPU register window (start of the MMIO hole).
pub const VGPU_REGS_BASE: u64 = crate::boot::MMIO_BASE;
/// Guest-physical base of the vGPU doorbell window.
pub const VGPU_DOORBELLS_BASE: u64 = VGPU_REGS_BASE + mdev::vgpu::REGS_BYTES;

/// The register window.
pub struct VgpuRegs {
    fe: Arc<VgpuFrontEnd>,
}

impl VgpuRegs {
    /// The register window of a VM's front end.
    pub fn new(fe: Arc<VgpuFrontEnd>) -> Self {
        VgpuRegs { fe }
    }
}

impl BusDevice for VgpuRegs {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let v = self.fe.reg_read(offset & !3).to_le_bytes();
        let n = data.len().min(4);
        data[..n].copy_from_slice(&v[..n]);
        data[n..].fill(0);
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> BusAction {
        match <[u8; 4]>::try_from(data) {
            Ok(b) => self.fe.reg_write(offset, u32::from_le_bytes(b)),
            Err(_) => log::warn!(
                "vGPU register write of {} bytes at {offset:#x} ignored (32-bit only)",
                data.len()
            ),
        }
        BusAction::Continue
    }
}

/// The doorbell window (MMIO exits signal the front end's doorbell eventfds).
pub struct VgpuDoorbells {
    fe: Arc<VgpuFrontEnd>,
}

impl VgpuDoorbells {
    /// The doorbell window of a VM's front end.
    pub fn new(fe: Arc<VgpuFrontEnd>) -> Self {
        VgpuDoorbells { fe }
    }
}

impl BusDevice for VgpuDoorbells {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&mut self, offset: u64, _data: &[u8]) -> BusAction {
        self.fe.doorbell_write(offset);
        BusAction::Continue
    }
}
