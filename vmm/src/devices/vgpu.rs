//! The vGPU windows of one VM: thin MMIO adapters from the bus to the
//! mediator (`mdev::mediator`, docs/vgpu-abi.md).

use std::sync::Arc;

use mdev::mediator::{Mediator, VgpuHandle};

use crate::bus::{BusAction, BusDevice};

/// Guest-physical base of the vGPU register window (start of the MMIO hole).
pub const VGPU_REGS_BASE: u64 = crate::boot::MMIO_BASE;
/// Guest-physical base of the vGPU doorbell window.
pub const VGPU_DOORBELLS_BASE: u64 = VGPU_REGS_BASE + mdev::mediator::REGS_BYTES;

/// The register window.
pub struct VgpuRegs {
    mediator: Arc<Mediator>,
    vm: VgpuHandle,
}

impl VgpuRegs {
    /// The register window of `vm`.
    pub fn new(mediator: Arc<Mediator>, vm: VgpuHandle) -> Self {
        VgpuRegs { mediator, vm }
    }
}

impl BusDevice for VgpuRegs {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let v = self.mediator.reg_read(self.vm, offset & !3).to_le_bytes();
        let n = data.len().min(4);
        data[..n].copy_from_slice(&v[..n]);
        data[n..].fill(0);
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> BusAction {
        match <[u8; 4]>::try_from(data) {
            Ok(b) => self
                .mediator
                .reg_write(self.vm, offset, u32::from_le_bytes(b)),
            Err(_) => log::warn!(
                "vGPU register write of {} bytes at {offset:#x} ignored (32-bit only)",
                data.len()
            ),
        }
        BusAction::Continue
    }
}

/// The doorbell window.
pub struct VgpuDoorbells {
    mediator: Arc<Mediator>,
    vm: VgpuHandle,
}

impl VgpuDoorbells {
    /// The doorbell window of `vm`.
    pub fn new(mediator: Arc<Mediator>, vm: VgpuHandle) -> Self {
        VgpuDoorbells { mediator, vm }
    }
}

impl BusDevice for VgpuDoorbells {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&mut self, offset: u64, _data: &[u8]) -> BusAction {
        self.mediator.doorbell(self.vm, offset);
        BusAction::Continue
    }
}
