//! PCI bus 0 behind configuration mechanism #1 (ports 0xCF8/0xCFC,
//! docs/vgpu-abi.md "Finding the device"): a host bridge at device 0 and
//! the functions the VMM adds (the vGPU at `abi::pci::VGPU_DEVICE`).
//!
//! [`ConfigSpace`] is a type-0 header with per-bit write masks: BARs are
//! sized the usual way (write all ones, read the mask back) and assigned by
//! the guest; read-only fields ignore writes; accesses of a bad width, or
//! crossing a dword, read all ones and are not written.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use abi::pci::{CONFIG_ENABLE, HOST_BRIDGE_DEVICE};

use crate::bus::{BusAction, BusDevice};

pub use abi::config_space::{access_ok, read_from_dword, ConfigSpace, Identity, CONFIG_BYTES};

/// A function on the PCI bus.
pub trait PciFunction: Send + Sync {
    /// Config read of 1, 2 or 4 bytes at `offset` (within one dword).
    fn config_read(&self, offset: usize, data: &mut [u8]);
    /// Config write of 1, 2 or 4 bytes at `offset` (within one dword).
    fn config_write(&self, offset: usize, data: &[u8]);
}

/// The host bridge at device 0 (class 06/00).
pub struct HostBridge(Mutex<ConfigSpace>);

impl HostBridge {
    /// A host bridge with hqdmux's ids.
    pub fn new() -> Self {
        HostBridge(Mutex::new(ConfigSpace::new(Identity {
            vendor: abi::pci::VENDOR_ID,
            device: abi::pci::HOST_BRIDGE_DEVICE_ID,
            class: 0x06,
            subclass: 0x00,
            prog_if: 0,
            revision: 0,
            subsystem_vendor: abi::pci::SUBSYSTEM_VENDOR_ID,
            subsystem: abi::pci::HOST_BRIDGE_DEVICE_ID,
        })))
    }

    fn cfg(&self) -> MutexGuard<'_, ConfigSpace> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for HostBridge {
    fn default() -> Self {
        Self::new()
    }
}

impl PciFunction for HostBridge {
    fn config_read(&self, offset: usize, data: &mut [u8]) {
        self.cfg().read(offset, data);
    }
    fn config_write(&self, offset: usize, data: &[u8]) {
        self.cfg().write(offset, data);
    }
}

/// Reserved bits 30:24 of `CONFIG_ADDRESS`.
const CONFIG_RESERVED: u32 = 0x7F00_0000;

/// PCI bus 0 behind configuration mechanism #1: a bus device on the PIO
/// bus at 0xCF8, 8 ports (`CONFIG_ADDRESS` 0xCF8..0xCFB, `CONFIG_DATA`
/// 0xCFC..0xCFF). Function 0 of each device only; other buses and
/// functions read as absent (all ones).
pub struct PciRoot {
    address: Mutex<u32>,
    devices: Mutex<Vec<Option<Arc<dyn PciFunction>>>>,
}

/// Errors adding PCI functions.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PciError {
    /// The device number is taken or above 31.
    #[error("PCI device number {0} is taken or out of range")]
    Slot(u8),
}

impl PciRoot {
    /// Bus 0 with the host bridge at device 0.
    pub fn new() -> Self {
        let mut devices: Vec<Option<Arc<dyn PciFunction>>> = vec![None; 32];
        devices[usize::from(HOST_BRIDGE_DEVICE)] = Some(Arc::new(HostBridge::new()));
        PciRoot {
            address: Mutex::new(0),
            devices: Mutex::new(devices),
        }
    }

    /// Puts `f` at device number `device` (function 0).
    pub fn add(&self, device: u8, f: Arc<dyn PciFunction>) -> Result<(), PciError> {
        let mut d = self.devices.lock().unwrap_or_else(PoisonError::into_inner);
        match d.get_mut(usize::from(device)) {
            Some(slot @ None) => {
                *slot = Some(f);
                Ok(())
            }
            _ => Err(PciError::Slot(device)),
        }
    }

    /// The function `CONFIG_ADDRESS` selects and the register offset, if enabled and present.
    fn selected(&self) -> Option<(Arc<dyn PciFunction>, usize)> {
        let a = *self.address.lock().unwrap_or_else(PoisonError::into_inner);
        let bus = (a >> 16) & 0xFF;
        let device = (a >> 11) & 0x1F;
        let function = (a >> 8) & 0x7;
        // Bits 30:24 are reserved (some chipsets put extended register
        // numbers there; this bus has none): such an address selects nothing,
        // so it never aliases registers 0..0xFF.
        if a & CONFIG_ENABLE == 0 || a & CONFIG_RESERVED != 0 || bus != 0 || function != 0 {
            return None;
        }
        let d = self.devices.lock().unwrap_or_else(PoisonError::into_inner);
        let f = d.get(device as usize)?.clone()?;
        Some((f, (a & 0xFC) as usize))
    }
}

impl Default for PciRoot {
    fn default() -> Self {
        Self::new()
    }
}

impl BusDevice for PciRoot {
    fn read(&self, offset: u64, data: &mut [u8]) {
        match offset {
            0 if data.len() == 4 => {
                let a = *self.address.lock().unwrap_or_else(PoisonError::into_inner);
                data.copy_from_slice(&a.to_le_bytes());
            }
            4..=7 => match self.selected() {
                // The function's lock is taken after the address lock is released.
                Some((f, reg)) => f.config_read(reg + (offset as usize - 4), data),
                None => data.fill(0xFF),
            },
            _ => data.fill(0xFF),
        }
    }

    fn write(&self, offset: u64, data: &[u8]) -> BusAction {
        match offset {
            0 if data.len() == 4 => {
                let v = u32::from_le_bytes(data.try_into().expect("4 bytes"));
                *self.address.lock().unwrap_or_else(PoisonError::into_inner) = v;
            }
            4..=7 => {
                if let Some((f, reg)) = self.selected() {
                    f.config_write(reg + (offset as usize - 4), data);
                }
            }
            _ => log::debug!(
                "PCI: {}-byte write at port 0xCF8+{offset} ignored",
                data.len()
            ),
        }
        BusAction::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi::pci::config_address;
    use abi::pci::{
        cfg, COMMAND_BUS_MASTER, COMMAND_INTX_DISABLE, COMMAND_MEMORY, STATUS_CAP_LIST,
    };

    fn rd(root: &PciRoot, dev: u8, off: u8, len: usize) -> u32 {
        root.write(0, &config_address(0, dev, 0, off).to_le_bytes());
        let mut b = [0u8; 4];
        root.read(4 + u64::from(off % 4), &mut b[..len]);
        u32::from_le_bytes(b)
    }

    fn wr(root: &PciRoot, dev: u8, off: u8, val: u32, len: usize) {
        root.write(0, &config_address(0, dev, 0, off).to_le_bytes());
        root.write(4 + u64::from(off % 4), &val.to_le_bytes()[..len]);
    }

    #[test]
    fn mechanism_one_finds_the_host_bridge_and_nothing_else() {
        let root = PciRoot::new();
        assert_eq!(
            rd(&root, 0, 0, 4),
            u32::from(abi::pci::VENDOR_ID) | u32::from(abi::pci::HOST_BRIDGE_DEVICE_ID) << 16
        );
        assert_eq!(rd(&root, 0, 0x0B, 1), 0x06, "class: bridge");
        assert_eq!(
            rd(&root, 0, 2, 2),
            u32::from(abi::pci::HOST_BRIDGE_DEVICE_ID)
        );
        assert_eq!(rd(&root, 5, 0, 4), u32::MAX, "empty slot");
        wr(&root, 0, 0x04, 0xFFFF, 2);
        assert_eq!(rd(&root, 0, 0x04, 2), 0x406, "COMMAND's writable bits");
        wr(&root, 0, 0x00, 0, 4);
        assert_eq!(rd(&root, 0, 0, 2), 0x1002, "vendor is read-only");
        // Function 1, bus 1, or the enable bit clear: absent.
        root.write(0, &(config_address(0, 0, 1, 0)).to_le_bytes());
        let mut b = [0u8; 4];
        root.read(4, &mut b);
        assert_eq!(u32::from_le_bytes(b), u32::MAX);
        root.write(0, &(config_address(1, 0, 0, 0)).to_le_bytes());
        root.read(4, &mut b);
        assert_eq!(u32::from_le_bytes(b), u32::MAX);
        root.write(
            0,
            &(config_address(0, 0, 0, 0) & !CONFIG_ENABLE).to_le_bytes(),
        );
        root.read(4, &mut b);
        assert_eq!(u32::from_le_bytes(b), u32::MAX);
        // Reserved bits 30:24 (extended register numbers elsewhere): absent,
        // never an alias of registers 0..0xFF; writes there change nothing.
        for bit in 24..31 {
            root.write(0, &(config_address(0, 0, 0, 0x04) | 1 << bit).to_le_bytes());
            root.read(4, &mut b);
            assert_eq!(u32::from_le_bytes(b), u32::MAX, "bit {bit}");
            root.write(4, &0u16.to_le_bytes());
        }
        assert_eq!(rd(&root, 0, 0x04, 2), 0x406, "COMMAND unchanged");
        // CONFIG_ADDRESS reads back; partial writes to it are ignored.
        root.write(0, &0x8000_1234u32.to_le_bytes());
        root.write(0, &[0xAA]);
        root.read(0, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0x8000_1234);
        assert_eq!(
            root.add(0, Arc::new(HostBridge::new())),
            Err(PciError::Slot(0))
        );
        assert_eq!(
            root.add(32, Arc::new(HostBridge::new())),
            Err(PciError::Slot(32))
        );
    }

    #[test]
    fn bars_size_and_assign_and_read_only_fields_hold() {
        let mut c = ConfigSpace::new(Identity {
            vendor: 0x1002,
            device: 0x0FD0,
            class: 0x12,
            subclass: 0,
            prog_if: 0,
            revision: 2,
            subsystem_vendor: 0x1002,
            subsystem: 0x0FD0,
        });
        c.add_memory_bar(0, 0x4000);
        c.add_memory_bar(2, 0x1000);
        let bar = |c: &ConfigSpace, n: usize| c.dword(cfg::BAR0 + 4 * n);
        for n in 0..6 {
            assert!(c.write(cfg::BAR0 + 4 * n, &u32::MAX.to_le_bytes()));
        }
        assert_eq!(bar(&c, 0), 0xFFFF_C000, "16 KiB, 32-bit memory");
        assert_eq!(bar(&c, 2), 0xFFFF_F000, "4 KiB");
        for n in [1, 3, 4, 5] {
            assert_eq!(bar(&c, n), 0, "unimplemented BAR {n}");
        }
        assert!(c.write(cfg::BAR0, &0xC000_1234u32.to_le_bytes()));
        assert_eq!(
            c.bar_address(0),
            0xC000_0000,
            "low bits are not address bits"
        );
        // A byte write moves only its byte.
        assert!(c.write(cfg::BAR0 + 3, &[0xD0]));
        assert_eq!(c.bar_address(0), 0xD000_0000);
        // Identity and class are read-only.
        assert!(c.write(0, &0u32.to_le_bytes()));
        assert!(c.write(cfg::REVISION, &0u32.to_le_bytes()));
        assert_eq!(c.dword(0), 0x0FD0_1002);
        assert_eq!(c.dword(cfg::REVISION), 0x1200_0002);
        // COMMAND: only memory, bus master, INTx disable.
        assert!(c.write(cfg::COMMAND, &0xFFFFu16.to_le_bytes()));
        assert_eq!(
            c.command(),
            COMMAND_MEMORY | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE
        );
        // Bad widths and offsets: not written, read all ones.
        assert!(!c.write(cfg::COMMAND + 3, &[0, 0]));
        assert!(!c.write(cfg::COMMAND, &[0, 0, 0]));
        assert!(!c.write(CONFIG_BYTES, &[0]));
        assert!(!c.write(usize::MAX, &[0]));
        let mut b = [0u8; 2];
        c.read(3, &mut b);
        assert_eq!(b, [0xFF, 0xFF]);
        let mut b3 = [0u8; 3];
        c.read(0, &mut b3);
        assert_eq!(b3, [0xFF; 3]);
    }

    #[test]
    fn capability_list_links_from_the_pointer() {
        let mut c = ConfigSpace::new(Identity {
            vendor: 1,
            device: 2,
            class: 0x12,
            subclass: 0,
            prog_if: 0,
            revision: 0,
            subsystem_vendor: 1,
            subsystem: 2,
        });
        assert_eq!(c.dword(cfg::STATUS) >> 16 & u32::from(STATUS_CAP_LIST), 0);
        c.add_capability(0x40, 0x11, &[0x2000, 0x3000]);
        c.add_capability(0x50, 0x09, &[]);
        assert_ne!(c.dword(cfg::COMMAND) >> 16 & u32::from(STATUS_CAP_LIST), 0);
        let mut p = (c.dword(cfg::CAP_PTR) & 0xFF) as usize;
        let mut ids = vec![];
        while p != 0 {
            ids.push(c.dword(p) & 0xFF);
            p = ((c.dword(p) >> 8) & 0xFF) as usize;
        }
        assert_eq!(ids, vec![0x09, 0x11]);
        assert_eq!(c.dword(0x44), 0x2000);
        assert!(c.write(0x44, &0u32.to_le_bytes()));
        assert_eq!(c.dword(0x44), 0x2000, "capability body is read-only");
    }
}
