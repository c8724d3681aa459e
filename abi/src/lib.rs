//! Hardware formats shared by the host (mdev) and the bare-metal guests (guest-tools).
//!
//! Everything here is `no_std`, allocation-free and integer-only (guests run under
//! an instruction emulator without SSE, see design.md §6).
//!
//! * [`mqd`]: gfx9 `struct v9_mqd` (linux `drivers/gpu/drm/amd/include/v9_structs.h`).
//! * [`aql`]: HSA AQL packets (`hsa.h`).
//! * [`queue`]: ROCr `amd_queue_t` and `amd_signal_t` offsets (`amd_hsa_queue.h`, `amd_hsa_signal.h`).
//! * [`kernel`]: hqdmux's own 64-byte kernel descriptor and built-in simulated kernels.
//! * [`boot`]: the boot-info block the VMM writes for the guest (docs/boot.md).
//! * [`config_space`]: a PCI type-0 config space with write masks and the vGPU's
//!   own, shared by the VMM's PCI function and the vfio-user server.
//! * [`pci`]: the vGPU's PCI identity, BARs and MSI-X layout (docs/vgpu-abi.md).
//! * [`vgpu`]: the guest-visible virtual GPU's registers and codes (docs/vgpu-abi.md).
#![no_std]
#![deny(missing_docs)]

pub mod aql;
pub mod boot;
pub mod config_space;
pub mod kernel;
pub mod mqd;
pub mod pci;
pub mod pvh;
pub mod queue;
pub mod vgpu;

/// Little-endian helpers on byte slices (panic-free callers check lengths first).
pub mod le {
    /// Read a u16 at `off`.
    #[inline]
    pub fn u16_at(b: &[u8], off: usize) -> u16 {
        u16::from_le_bytes([b[off], b[off + 1]])
    }
    /// Read a u32 at `off`.
    #[inline]
    pub fn u32_at(b: &[u8], off: usize) -> u32 {
        let mut a = [0u8; 4];
        a.copy_from_slice(&b[off..off + 4]);
        u32::from_le_bytes(a)
    }
    /// Read a u64 at `off`.
    #[inline]
    pub fn u64_at(b: &[u8], off: usize) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[off..off + 8]);
        u64::from_le_bytes(a)
    }
    /// Write a u16 at `off`.
    #[inline]
    pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
        b[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    /// Write a u32 at `off`.
    #[inline]
    pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
        b[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    /// Write a u64 at `off`.
    #[inline]
    pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }
}
