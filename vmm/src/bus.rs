//! I/O buses: a range map from port or MMIO address to a device.
//!
//! A vCPU exit looks its address up here and hands the device the offset
//! inside the device's window. Devices are shared between the vCPUs of one VM
//! and take `&self` (each keeps its own interior lock); the bus's own lock is
//! released before a device is called, so a device may change the bus (the
//! PCI device manager moves BARs) and no bus lock is held across a device call.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

/// What a device asks the vCPU loop to do after an access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusAction {
    /// Keep running the guest.
    Continue,
    /// The guest asked to end the VM with this status.
    Exit(u32),
}

/// A device on a bus.
pub trait BusDevice: Send + Sync {
    /// Guest read of `data.len()` bytes at `offset` within the device's window.
    fn read(&self, offset: u64, data: &mut [u8]);
    /// Guest write at `offset` within the device's window.
    fn write(&self, offset: u64, data: &[u8]) -> BusAction;
}

/// A shared device handle.
pub type SharedDevice = Arc<dyn BusDevice>;

/// Errors inserting devices.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The new range overlaps an existing one.
    #[error("range {base:#x}+{len:#x} overlaps another device")]
    Overlap {
        /// Base address.
        base: u64,
        /// Length.
        len: u64,
    },
    /// Zero-length or overflowing range.
    #[error("range {base:#x}+{len:#x} is empty or overflows")]
    BadRange {
        /// Base address.
        base: u64,
        /// Length.
        len: u64,
    },
}

type Ranges = BTreeMap<u64, (u64, SharedDevice)>;

/// A bus: non-overlapping `[base, base+len)` ranges, each with one device.
/// Clones share the same ranges (every vCPU holds one).
#[derive(Default, Clone)]
pub struct Bus {
    ranges: Arc<RwLock<Ranges>>,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    fn ranges(&self) -> std::sync::RwLockReadGuard<'_, Ranges> {
        // The map is only ever replaced whole-entry: a poisoned lock still
        // holds a consistent map.
        self.ranges.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `dev` at `[base, base + len)`.
    pub fn insert(&self, base: u64, len: u64, dev: SharedDevice) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::BadRange { base, len })?;
        let mut ranges = self.ranges.write().unwrap_or_else(PoisonError::into_inner);
        let before = ranges.range(..end).next_back();
        if let Some((&b, &(l, _))) = before {
            if b + l > base {
                return Err(BusError::Overlap { base, len });
            }
        }
        ranges.insert(base, (len, dev));
        Ok(())
    }

    /// Removes the range starting at `base`; true if there was one.
    pub fn remove(&self, base: u64) -> bool {
        self.ranges
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&base)
            .is_some()
    }

    /// The device covering `addr` and the offset of `addr` in its window.
    pub fn resolve(&self, addr: u64) -> Option<(SharedDevice, u64)> {
        let ranges = self.ranges();
        let (&base, (len, dev)) = ranges.range(..=addr).next_back()?;
        (addr - base < *len).then(|| (dev.clone(), addr - base))
    }

    /// Dispatches a read; unclaimed reads return all ones, like open bus.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.resolve(addr) {
            Some((dev, off)) => {
                dev.read(off, data);
                true
            }
            None => {
                data.fill(0xff);
                false
            }
        }
    }

    /// Dispatches a write; `None` if no device claims `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> Option<BusAction> {
        let (dev, off) = self.resolve(addr)?;
        Some(dev.write(off, data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Mutex;

    #[derive(Default)]
    struct Reg(Mutex<Vec<(u64, Vec<u8>)>>);
    impl BusDevice for Reg {
        fn read(&self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&self, offset: u64, data: &[u8]) -> BusAction {
            self.0.lock().unwrap().push((offset, data.to_vec()));
            BusAction::Exit(offset as u32)
        }
    }

    #[test]
    fn resolves_offsets_and_rejects_overlaps() {
        let bus = Bus::new();
        let a = Arc::new(Reg::default());
        bus.insert(0x100, 0x10, a.clone()).unwrap();
        bus.insert(0x110, 0x10, Arc::new(Reg::default())).unwrap();
        assert_eq!(
            bus.insert(0x10f, 1, a.clone()),
            Err(BusError::Overlap {
                base: 0x10f,
                len: 1
            })
        );
        assert_eq!(
            bus.insert(0xf8, 0x9, a.clone()),
            Err(BusError::Overlap { base: 0xf8, len: 9 })
        );
        assert!(bus.insert(0x0, 0, a.clone()).is_err());
        assert!(bus.insert(u64::MAX, 2, a.clone()).is_err());
        let mut buf = [0u8; 2];
        assert!(bus.read(0x105, &mut buf));
        assert_eq!(buf, [5, 5]);
        assert!(!bus.read(0x120, &mut buf));
        assert_eq!(buf, [0xff, 0xff]);
        assert_eq!(bus.write(0x10c, &[1]), Some(BusAction::Exit(0xc)));
        assert_eq!(bus.write(0xff, &[1]), None);
        assert_eq!(*a.0.lock().unwrap(), vec![(0xc, vec![1])]);
        // Clones share ranges; a removed range is open bus again.
        let clone = bus.clone();
        assert!(bus.remove(0x110));
        assert!(!clone.remove(0x110));
        assert!(!clone.read(0x111, &mut buf));
        assert!(clone.read(0x101, &mut buf));
    }
}
