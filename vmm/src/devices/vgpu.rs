//! The vGPU as a PCI function (docs/vgpu-abi.md, "Finding the device"):
//! configuration space, BAR0 (registers, MSI-X table, PBA), BAR2
//! (doorbells) and the device manager that keeps KVM and the MMIO bus in
//! step with where the guest put the BARs.
//!
//! * BAR0 offsets below `abi::pci::REGS_SIZE` go to the [`VgpuBackend`]
//!   (32-bit accesses); the MSI-X table and PBA are decoded here ([`Msix`]).
//! * Each vHQD doorbell (BAR2 + 8 * i) is a KVM ioeventfd on the backend's
//!   eventfd for that vHQD: a doorbell write never exits to userspace. Other
//!   BAR2 accesses exit and are logged (rate-limited) as missing doorbells.
//!   A backend that has the doorbell page itself ([`VgpuBackend::doorbell_page`],
//!   a vfio-user server's mmapped BAR2) gets it mapped into the guest at
//!   BAR2 (KVM memory slot [`DOORBELL_PAGE_SLOT`]): doorbells are then plain
//!   stores, without an exit.
//! * While COMMAND.MEMORY is set and a BAR has a non-zero address, the BAR is
//!   on the MMIO bus (and BAR2's ioeventfds are registered); moving a BAR or
//!   toggling decoding re-registers both. Remaps are serialised by one lock
//!   that is never held while calling the backend.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use vmm_sys_util::eventfd::EventFd;

use abi::pci::{
    cfg, BAR0_SIZE, BAR2_SIZE, COMMAND_MEMORY, DOORBELL_STRIDE, MSIX_CAP_OFFSET, MSIX_ENTRY_SIZE,
    MSIX_PBA_OFFSET, MSIX_TABLE_OFFSET, REGS_SIZE,
};
use abi::vgpu::{NUM_VECTORS, NUM_VHQD};

use super::msix::Msix;
use super::pci::{read_from_dword, ConfigSpace, Identity, PciFunction};
use super::RateLimitedLog;
use crate::bus::{Bus, BusAction, BusDevice};

/// What the vGPU function forwards register accesses and doorbells to (the
/// mdev front end of one VM).
pub trait VgpuBackend: Send + Sync {
    /// Guest read of the 32-bit register at BAR0 `offset` (< 0x1000).
    fn reg_read(&self, offset: u64) -> u32;
    /// Guest write of the 32-bit register at BAR0 `offset` (< 0x1000).
    fn reg_write(&self, offset: u64, value: u32);
    /// The eventfd KVM signals on a doorbell write to vHQD `vhqd`.
    fn doorbell_eventfd(&self, vhqd: usize) -> &EventFd;
    /// The host address of a page (`BAR2_SIZE` bytes, page-aligned) that
    /// is the doorbell page itself (a vfio-user server's mmapped BAR2):
    /// mapped into the guest at BAR2 instead of the ioeventfds. `None` (the
    /// default): doorbells are ioeventfds.
    fn doorbell_page(&self) -> Option<u64> {
        None
    }
}

impl VgpuBackend for mdev::vgpu::VgpuFrontEnd {
    fn reg_read(&self, offset: u64) -> u32 {
        mdev::vgpu::VgpuFrontEnd::reg_read(self, offset)
    }
    fn reg_write(&self, offset: u64, value: u32) {
        mdev::vgpu::VgpuFrontEnd::reg_write(self, offset, value)
    }
    fn doorbell_eventfd(&self, vhqd: usize) -> &EventFd {
        mdev::vgpu::VgpuFrontEnd::doorbell_eventfd(self, vhqd.min(NUM_VHQD - 1))
    }
}

/// KVM ioeventfd registration (a `VmFd`, or a test double).
pub trait IoEvents: Send + Sync {
    /// Signals `fd` on every guest write to MMIO `addr`.
    fn register(&self, fd: &EventFd, addr: u64) -> Result<(), kvm_ioctls::Error>;
    /// Undoes [`IoEvents::register`].
    fn unregister(&self, fd: &EventFd, addr: u64) -> Result<(), kvm_ioctls::Error>;
    /// Maps the host page at `host` (`BAR2_SIZE` bytes) into the guest at
    /// `gpa` (KVM memory slot [`DOORBELL_PAGE_SLOT`]), replacing a
    /// previous mapping of that slot.
    fn map_page(&self, gpa: u64, host: u64) -> Result<(), kvm_ioctls::Error>;
    /// Undoes [`IoEvents::map_page`].
    fn unmap_page(&self, gpa: u64) -> Result<(), kvm_ioctls::Error>;
}

/// The KVM memory slot of a vGPU's mapped doorbell page (guest RAM uses
/// the slots from 0, at most one per RAM region).
pub const DOORBELL_PAGE_SLOT: u32 = 16;

fn page_slot(gpa: u64, host: u64, size: u64) -> kvm_bindings::kvm_userspace_memory_region {
    kvm_bindings::kvm_userspace_memory_region {
        slot: DOORBELL_PAGE_SLOT,
        flags: 0,
        guest_phys_addr: gpa,
        memory_size: size,
        userspace_addr: host,
    }
}

impl IoEvents for VmFd {
    // No datamatch: KVM registers a zero-length match, which takes a write of
    // any size at `addr` (the ABI's doorbell is one 64-bit store).
    fn register(&self, fd: &EventFd, addr: u64) -> Result<(), kvm_ioctls::Error> {
        self.register_ioevent(fd, &IoEventAddress::Mmio(addr), NoDatamatch)
    }
    fn unregister(&self, fd: &EventFd, addr: u64) -> Result<(), kvm_ioctls::Error> {
        self.unregister_ioevent(fd, &IoEventAddress::Mmio(addr), NoDatamatch)
    }
    fn map_page(&self, gpa: u64, host: u64) -> Result<(), kvm_ioctls::Error> {
        // SAFETY: `host` is a live mapping of BAR2_SIZE bytes owned by the
        // backend, which outlives the slot (detach removes it first).
        unsafe { self.set_user_memory_region(page_slot(gpa, host, BAR2_SIZE)) }
    }
    fn unmap_page(&self, gpa: u64) -> Result<(), kvm_ioctls::Error> {
        // SAFETY: a zero size deletes the slot.
        unsafe { self.set_user_memory_region(page_slot(gpa, 0, 0)) }
    }
}

/// The PCI identity of the vGPU (`abi::pci`).
pub fn identity() -> Identity {
    abi::config_space::vgpu_identity()
}

/// The vGPU's config space ([`abi::config_space::vgpu_config_space`], the
/// same builder the vfio-user server uses): identity, BAR0 16 KiB, BAR2
/// 4 KiB, MSI-X capability at 0x40 (table BIR 0 at 0x2000, PBA BIR 0 at 0x3000).
pub fn config_space() -> ConfigSpace {
    abi::config_space::vgpu_config_space()
}

/// Where the BARs are live (None: not decoded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    /// BAR0 base on the MMIO bus.
    pub bar0: Option<u64>,
    /// BAR2 base (bus + ioeventfds).
    pub bar2: Option<u64>,
}

/// The vGPU PCI function of one VM.
pub struct VgpuPci {
    name: String,
    cfg: Mutex<ConfigSpace>,
    msix: Arc<Msix>,
    backend: Arc<dyn VgpuBackend>,
    mmio: Bus,
    ioevents: Arc<dyn IoEvents>,
    mapped: Mutex<Mapping>,
    /// BAR2 is the backend's doorbell page mapped into the guest (changed
    /// under `mapped`'s lock).
    bar2_page: std::sync::atomic::AtomicBool,
    bar0: Arc<Bar0>,
    bar2: Arc<Bar2>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The MSI-X message control sits in bytes 2..4 of the capability's first dword.
const MSIX_CONTROL: usize = MSIX_CAP_OFFSET as usize + 2;

impl VgpuPci {
    /// The function of VM `name`: BARs unassigned, decoding off, MSI-X
    /// disabled. BARs appear on `mmio` (and doorbells in `ioevents`) once
    /// the guest assigns them and enables memory decoding.
    pub fn new(
        name: &str,
        backend: Arc<dyn VgpuBackend>,
        msix: Arc<Msix>,
        mmio: Bus,
        ioevents: Arc<dyn IoEvents>,
    ) -> Self {
        let log = Arc::new(RateLimitedLog::new(format!("vm {name}: vGPU")));
        VgpuPci {
            name: name.to_owned(),
            cfg: Mutex::new(config_space()),
            bar0: Arc::new(Bar0 {
                backend: backend.clone(),
                msix: msix.clone(),
                log: log.clone(),
            }),
            bar2: Arc::new(Bar2 { log }),
            msix,
            backend,
            mmio,
            ioevents,
            mapped: Mutex::new(Mapping::default()),
            bar2_page: Default::default(),
        }
    }

    /// The MSI-X function (the VM's interrupt sink).
    pub fn msix(&self) -> &Arc<Msix> {
        &self.msix
    }

    /// Where the BARs are live now.
    pub fn mapping(&self) -> Mapping {
        *lock(&self.mapped)
    }

    /// Guest-visible accesses the BAR handlers refused and logged (or suppressed).
    pub fn bad_accesses(&self) -> u64 {
        self.bar2.log.total()
    }

    /// Logs how many refused accesses the rate limit kept out of the log
    /// (if any) and returns that total.
    pub fn flush_log(&self) -> u64 {
        self.bar2.log.flush()
    }

    fn wanted(&self) -> Mapping {
        let c = lock(&self.cfg);
        if c.command() & COMMAND_MEMORY == 0 {
            return Mapping::default();
        }
        let live = |a: u64| (a != 0).then_some(a);
        Mapping {
            bar0: live(c.bar_address(0)),
            bar2: live(c.bar_address(2)),
        }
    }

    /// Brings the MMIO bus and the ioeventfds in line with the config space.
    fn remap(&self) {
        let mut cur = lock(&self.mapped);
        let want = self.wanted();
        let (bar0, bar2) = (want.bar0 != cur.bar0, want.bar2 != cur.bar2);
        // Every BAR leaving its place goes first, then the BARs are placed:
        // a BAR refused because it overlapped the other one is placed as
        // soon as the other moves away (issue 21: BAR0 retried before
        // BAR2 left stayed off the bus).
        if bar0 {
            if let Some(old) = cur.bar0.take() {
                self.mmio.remove(old);
            }
        }
        if bar2 {
            if let Some(old) = cur.bar2.take() {
                self.mmio.remove(old);
                if self
                    .bar2_page
                    .swap(false, std::sync::atomic::Ordering::SeqCst)
                {
                    if let Err(e) = self.ioevents.unmap_page(old) {
                        log::warn!("vm {}: doorbell page at {old:#x}: unmap: {e}", self.name);
                    }
                }
                for i in 0..NUM_VHQD {
                    let fd = self.backend.doorbell_eventfd(i);
                    if let Err(e) = self
                        .ioevents
                        .unregister(fd, old + DOORBELL_STRIDE * i as u64)
                    {
                        log::warn!("vm {}: doorbell {i}: unregister ioeventfd: {e}", self.name);
                    }
                }
            }
        }
        if bar0 {
            if let Some(new) = want.bar0 {
                match self.mmio.insert(new, BAR0_SIZE, self.bar0.clone()) {
                    Ok(()) => cur.bar0 = Some(new),
                    Err(e) => self.bar2.log.warn(format_args!("BAR0 at {new:#x}: {e}")),
                }
            }
            log::debug!("vm {}: vGPU BAR0 at {:x?}", self.name, cur.bar0);
        }
        if bar2 {
            if let Some(new) = want.bar2 {
                match self.mmio.insert(new, BAR2_SIZE, self.bar2.clone()) {
                    Ok(()) => {
                        if let Some(host) = self.backend.doorbell_page() {
                            match self.ioevents.map_page(new, host) {
                                Ok(()) => self
                                    .bar2_page
                                    .store(true, std::sync::atomic::Ordering::SeqCst),
                                Err(e) => log::warn!(
                                    "vm {}: doorbell page at {new:#x}: {e}; doorbells trap instead",
                                    self.name
                                ),
                            }
                        }
                        // Registered beside a mapped page too (KVM takes the
                        // page's stores without an exit; the ioeventfds only
                        // matter when the page could not be mapped).
                        for i in 0..NUM_VHQD {
                            let fd = self.backend.doorbell_eventfd(i);
                            let addr = new + DOORBELL_STRIDE * i as u64;
                            if let Err(e) = self.ioevents.register(fd, addr) {
                                log::warn!("vm {}: doorbell {i} at {addr:#x}: {e}", self.name);
                            }
                        }
                        cur.bar2 = Some(new);
                    }
                    Err(e) => self.bar2.log.warn(format_args!("BAR2 at {new:#x}: {e}")),
                }
            }
            log::debug!("vm {}: vGPU BAR2 at {:x?}", self.name, cur.bar2);
        }
    }

    /// Unregisters everything (BARs off the bus, ioeventfds removed).
    pub fn detach(&self) {
        lock(&self.cfg).write(cfg::COMMAND, &0u16.to_le_bytes());
        self.remap();
    }
}

impl PciFunction for VgpuPci {
    fn config_read(&self, offset: usize, data: &mut [u8]) {
        let mut d = lock(&self.cfg).dword(offset);
        if offset & !3 == usize::from(MSIX_CAP_OFFSET) {
            d = (d & 0xFFFF) | u32::from(self.msix.control()) << 16;
        }
        read_from_dword(d, offset, data);
    }

    fn config_write(&self, offset: usize, data: &[u8]) {
        if !super::pci::access_ok(offset, data.len()) {
            return;
        }
        let end = offset + data.len();
        if offset < MSIX_CONTROL + 2 && end > MSIX_CONTROL {
            // Merge the written bytes into the current message control.
            let mut ctl = self.msix.control().to_le_bytes();
            for (i, b) in data.iter().enumerate() {
                if let Some(j) = (offset + i).checked_sub(MSIX_CONTROL).filter(|j| *j < 2) {
                    ctl[j] = *b;
                }
            }
            self.msix.set_control(u16::from_le_bytes(ctl));
            return;
        }
        let remap = {
            let mut c = lock(&self.cfg);
            c.write(offset, data);
            offset & !3 == cfg::COMMAND || (cfg::BAR0..cfg::BAR0 + 24).contains(&offset)
        };
        if remap {
            self.remap();
        }
    }
}

/// BAR0: registers, MSI-X table and PBA.
pub struct Bar0 {
    backend: Arc<dyn VgpuBackend>,
    msix: Arc<Msix>,
    log: Arc<RateLimitedLog>,
}

impl BusDevice for Bar0 {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let table_end = MSIX_TABLE_OFFSET + MSIX_ENTRY_SIZE * NUM_VECTORS as u64;
        match offset {
            o if o < REGS_SIZE => {
                if data.len() == 4 && o % 4 == 0 {
                    data.copy_from_slice(&self.backend.reg_read(o).to_le_bytes());
                } else {
                    self.log.warn(format_args!(
                        "{}-byte register read at {o:#x} (32-bit aligned only)",
                        data.len()
                    ));
                    data.fill(0xFF);
                }
            }
            o if (MSIX_TABLE_OFFSET..table_end).contains(&o) => {
                self.msix.table_read(o - MSIX_TABLE_OFFSET, data)
            }
            o if (MSIX_PBA_OFFSET..MSIX_PBA_OFFSET + 8).contains(&o) => {
                let b = self.msix.pba().to_le_bytes();
                let s = (o - MSIX_PBA_OFFSET) as usize;
                for (i, d) in data.iter_mut().enumerate() {
                    *d = b.get(s + i).copied().unwrap_or(0);
                }
            }
            _ => data.fill(0),
        }
    }

    fn write(&self, offset: u64, data: &[u8]) -> BusAction {
        let table_end = MSIX_TABLE_OFFSET + MSIX_ENTRY_SIZE * NUM_VECTORS as u64;
        match offset {
            o if o < REGS_SIZE => match <[u8; 4]>::try_from(data) {
                Ok(b) if o % 4 == 0 => self.backend.reg_write(o, u32::from_le_bytes(b)),
                _ => self.log.warn(format_args!(
                    "{}-byte register write at {o:#x} ignored (32-bit aligned only)",
                    data.len()
                )),
            },
            o if (MSIX_TABLE_OFFSET..table_end).contains(&o) => {
                if !self.msix.table_write(o - MSIX_TABLE_OFFSET, data) {
                    self.log.warn(format_args!(
                        "{}-byte MSI-X table write at {o:#x} ignored",
                        data.len()
                    ));
                }
            }
            o => self.log.warn(format_args!(
                "write to BAR0 offset {o:#x} ignored (no register there)"
            )),
        }
        BusAction::Continue
    }
}

/// BAR2: what reaches userspace here is not a doorbell (KVM takes those).
pub struct Bar2 {
    log: Arc<RateLimitedLog>,
}

impl BusDevice for Bar2 {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&self, offset: u64, data: &[u8]) -> BusAction {
        self.log.warn(format_args!(
            "{}-byte write at doorbell offset {offset:#x}: no such doorbell",
            data.len()
        ));
        BusAction::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::msix::tests::Recorder;
    use crate::devices::pci::PciRoot;
    use abi::pci::{config_address, MSIX_ENABLE, VGPU_DEVICE};
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    struct Regs {
        fds: Vec<EventFd>,
        writes: Mutex<Vec<(u64, u32)>>,
        page: Option<u64>,
    }
    impl VgpuBackend for Regs {
        fn reg_read(&self, offset: u64) -> u32 {
            0xA000_0000 | offset as u32
        }
        fn reg_write(&self, offset: u64, value: u32) {
            self.writes.lock().unwrap().push((offset, value));
        }
        fn doorbell_eventfd(&self, vhqd: usize) -> &EventFd {
            &self.fds[vhqd]
        }
        fn doorbell_page(&self) -> Option<u64> {
            self.page
        }
    }

    /// Registered ioeventfd addresses; mapped pages (guest, host).
    #[derive(Default)]
    struct Ioev(Mutex<Vec<u64>>, Mutex<Vec<(u64, u64)>>);
    impl IoEvents for Ioev {
        fn register(&self, _fd: &EventFd, addr: u64) -> Result<(), kvm_ioctls::Error> {
            self.0.lock().unwrap().push(addr);
            Ok(())
        }
        fn unregister(&self, _fd: &EventFd, addr: u64) -> Result<(), kvm_ioctls::Error> {
            let mut v = self.0.lock().unwrap();
            let i = v.iter().position(|a| *a == addr).expect("registered");
            v.remove(i);
            Ok(())
        }
        fn map_page(&self, gpa: u64, host: u64) -> Result<(), kvm_ioctls::Error> {
            self.1.lock().unwrap().push((gpa, host));
            Ok(())
        }
        fn unmap_page(&self, gpa: u64) -> Result<(), kvm_ioctls::Error> {
            let mut v = self.1.lock().unwrap();
            let i = v.iter().position(|p| p.0 == gpa).expect("mapped");
            v.remove(i);
            Ok(())
        }
    }

    struct Rig {
        root: PciRoot,
        mmio: Bus,
        ioev: Arc<Ioev>,
        regs: Arc<Regs>,
        irq: Arc<Recorder>,
        dev: Arc<VgpuPci>,
    }

    fn rig() -> Rig {
        rig_with_page(None)
    }

    fn rig_with_page(page: Option<u64>) -> Rig {
        let regs = Arc::new(Regs {
            fds: (0..NUM_VHQD)
                .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
                .collect(),
            writes: Mutex::default(),
            page,
        });
        let irq = Arc::new(Recorder::default());
        let mmio = Bus::new();
        let ioev = Arc::new(Ioev::default());
        let dev = Arc::new(VgpuPci::new(
            "t",
            regs.clone(),
            Arc::new(Msix::new(NUM_VECTORS, irq.clone())),
            mmio.clone(),
            ioev.clone(),
        ));
        let root = PciRoot::new();
        root.add(VGPU_DEVICE, dev.clone()).unwrap();
        Rig {
            root,
            mmio,
            ioev,
            regs,
            irq,
            dev,
        }
    }

    impl Rig {
        fn rd(&self, off: u8) -> u32 {
            self.root
                .write(0, &config_address(0, VGPU_DEVICE, 0, off).to_le_bytes());
            let mut b = [0u8; 4];
            self.root.read(4, &mut b);
            u32::from_le_bytes(b)
        }
        fn wr(&self, off: u8, data: &[u8]) {
            self.root.write(
                0,
                &config_address(0, VGPU_DEVICE, 0, off & !3).to_le_bytes(),
            );
            self.root.write(4 + u64::from(off & 3), data);
        }
    }

    #[test]
    fn identity_bars_and_msix_capability_as_the_abi_says() {
        let r = rig();
        assert_eq!(r.rd(0), 0x0FD0_1002);
        assert_eq!(r.rd(0x08), 0x1200_0002, "class 12/00/00, revision 2");
        assert_eq!(r.rd(0x2C), 0x0FD0_1002, "subsystem");
        assert_ne!(r.rd(0x04) >> 16 & 0x10, 0, "capability list");
        let cap = (r.rd(0x34) & 0xFF) as u8;
        assert_eq!(cap, 0x40);
        let d0 = r.rd(cap);
        assert_eq!(d0 & 0xFF, 0x11, "MSI-X");
        assert_eq!(d0 >> 8 & 0xFF, 0, "last capability");
        assert_eq!(d0 >> 16 & 0x7FF, NUM_VECTORS as u32 - 1);
        assert_eq!(r.rd(cap + 4), 0x2000, "table: BIR 0, offset 0x2000");
        assert_eq!(r.rd(cap + 8), 0x3000, "PBA: BIR 0, offset 0x3000");
        // Sizing.
        r.wr(0x10, &u32::MAX.to_le_bytes());
        r.wr(0x18, &u32::MAX.to_le_bytes());
        assert_eq!(!(r.rd(0x10) & !0xF) + 1, 16 * 1024);
        assert_eq!(!(r.rd(0x18) & !0xF) + 1, 4096);
        assert_eq!(r.rd(0x14), 0);
        // Enable MSI-X with a 16-bit write to the message control.
        r.wr(0x42, &MSIX_ENABLE.to_le_bytes());
        assert_eq!(r.rd(0x40) >> 16, u32::from(MSIX_ENABLE) | 8);
        assert_eq!(r.dev.msix().control() & MSIX_ENABLE, MSIX_ENABLE);
    }

    #[test]
    fn bars_appear_move_and_vanish_with_decoding() {
        let r = rig();
        r.wr(0x10, &0xC000_0000u32.to_le_bytes());
        r.wr(0x18, &0xC000_4000u32.to_le_bytes());
        assert_eq!(r.dev.mapping(), Mapping::default(), "decoding off");
        assert!(r.mmio.resolve(0xC000_0000).is_none());
        r.wr(0x04, &COMMAND_MEMORY.to_le_bytes());
        assert_eq!(
            r.dev.mapping(),
            Mapping {
                bar0: Some(0xC000_0000),
                bar2: Some(0xC000_4000)
            }
        );
        let want: Vec<u64> = (0..NUM_VHQD as u64).map(|i| 0xC000_4000 + 8 * i).collect();
        assert_eq!(*r.ioev.0.lock().unwrap(), want);
        // Registers through BAR0, 32-bit only.
        let mut b = [0u8; 4];
        assert!(r.mmio.read(0xC000_0104, &mut b));
        assert_eq!(u32::from_le_bytes(b), 0xA000_0104);
        r.mmio.write(0xC000_0108, &7u32.to_le_bytes());
        r.mmio.write(0xC000_0108, &[1, 2]);
        r.mmio.write(0xC000_0109, &7u32.to_le_bytes());
        assert_eq!(*r.regs.writes.lock().unwrap(), vec![(0x108, 7)]);
        // Move BAR2: old ioeventfds gone, new ones in.
        r.wr(0x18, &0xD000_0000u32.to_le_bytes());
        let want: Vec<u64> = (0..NUM_VHQD as u64).map(|i| 0xD000_0000 + 8 * i).collect();
        assert_eq!(*r.ioev.0.lock().unwrap(), want);
        assert!(r.mmio.resolve(0xC000_4000).is_none());
        // A write BAR2 sees is no doorbell: logged, counted (with the two
        // bad register writes above).
        r.mmio.write(0xD000_0800, &1u64.to_le_bytes());
        assert_eq!(r.dev.bad_accesses(), 3);
        // Overlapping BARs: the second one stays off the bus.
        r.wr(0x18, &0xC000_0000u32.to_le_bytes());
        assert_eq!(r.dev.mapping().bar2, None);
        assert!(r.ioev.0.lock().unwrap().is_empty());
        // Decoding off: everything gone.
        r.wr(0x18, &0xD000_0000u32.to_le_bytes());
        r.wr(0x04, &0u16.to_le_bytes());
        assert_eq!(r.dev.mapping(), Mapping::default());
        assert!(r.ioev.0.lock().unwrap().is_empty());
        assert!(r.mmio.resolve(0xC000_0000).is_none());
    }

    /// A backend with the doorbell page itself gets it mapped at BAR2,
    /// following the BAR as it moves and going with decoding; a backend
    /// without one never gets a page slot.
    #[test]
    fn a_doorbell_page_is_mapped_at_bar2_and_follows_it() {
        let r = rig_with_page(Some(0x7000_0000));
        r.wr(0x10, &0xC000_0000u32.to_le_bytes());
        r.wr(0x18, &0xC000_4000u32.to_le_bytes());
        assert!(r.ioev.1.lock().unwrap().is_empty(), "decoding off");
        r.wr(0x04, &COMMAND_MEMORY.to_le_bytes());
        assert_eq!(*r.ioev.1.lock().unwrap(), vec![(0xC000_4000, 0x7000_0000)]);
        r.wr(0x18, &0xD000_0000u32.to_le_bytes());
        assert_eq!(*r.ioev.1.lock().unwrap(), vec![(0xD000_0000, 0x7000_0000)]);
        // Moved over BAR0: refused, so no page either.
        r.wr(0x18, &0xC000_0000u32.to_le_bytes());
        assert!(r.ioev.1.lock().unwrap().is_empty());
        r.wr(0x18, &0xD000_0000u32.to_le_bytes());
        assert_eq!(r.ioev.1.lock().unwrap().len(), 1);
        r.dev.detach();
        assert!(r.ioev.1.lock().unwrap().is_empty());
        assert!(r.ioev.0.lock().unwrap().is_empty());

        let plain = rig();
        plain.wr(0x18, &0xC000_4000u32.to_le_bytes());
        plain.wr(0x04, &COMMAND_MEMORY.to_le_bytes());
        assert!(plain.ioev.1.lock().unwrap().is_empty());
        assert_eq!(plain.ioev.0.lock().unwrap().len(), NUM_VHQD);
    }

    /// Issue 21: BAR0 placed over BAR2 stays off the bus only while they
    /// overlap; once BAR2 moves away BAR0 is decoded (and the other way
    /// round).
    #[test]
    fn a_bar_placed_over_the_other_is_decoded_once_the_other_moves_away() {
        let r = rig();
        r.wr(0x10, &0xC000_0000u32.to_le_bytes());
        r.wr(0x18, &0xC000_4000u32.to_le_bytes());
        r.wr(0x04, &COMMAND_MEMORY.to_le_bytes());
        // BAR0 over BAR2 (BAR0's 16 KiB cover BAR2's page).
        r.wr(0x10, &0xC000_4000u32.to_le_bytes());
        assert_eq!(r.dev.mapping().bar0, None);
        assert_eq!(r.dev.mapping().bar2, Some(0xC000_4000));
        // BAR2 moves away: BAR0 is placed, BAR2 at its new address.
        r.wr(0x18, &0xD000_0000u32.to_le_bytes());
        assert_eq!(
            r.dev.mapping(),
            Mapping {
                bar0: Some(0xC000_4000),
                bar2: Some(0xD000_0000)
            }
        );
        let mut b = [0u8; 4];
        assert!(r.mmio.read(0xC000_4104, &mut b));
        let want: Vec<u64> = (0..NUM_VHQD as u64).map(|i| 0xD000_0000 + 8 * i).collect();
        assert_eq!(*r.ioev.0.lock().unwrap(), want);
        // And BAR2 over BAR0, then BAR0 moves away.
        r.wr(0x18, &0xC000_5000u32.to_le_bytes());
        assert_eq!(r.dev.mapping().bar2, None);
        r.wr(0x10, &0xE000_0000u32.to_le_bytes());
        assert_eq!(
            r.dev.mapping(),
            Mapping {
                bar0: Some(0xE000_0000),
                bar2: Some(0xC000_5000)
            }
        );
    }

    #[test]
    fn msix_table_and_pba_through_bar0() {
        let r = rig();
        r.wr(0x10, &0xC000_0000u32.to_le_bytes());
        r.wr(0x04, &COMMAND_MEMORY.to_le_bytes());
        r.wr(0x42, &MSIX_ENABLE.to_le_bytes());
        let e = 0xC000_0000 + MSIX_TABLE_OFFSET + 16 * 2;
        r.mmio.write(e, &0xFEE0_0000u32.to_le_bytes());
        r.mmio.write(e + 8, &0x42u32.to_le_bytes());
        r.dev.msix().raise(2);
        let mut pba = [0u8; 8];
        r.mmio.read(0xC000_0000 + MSIX_PBA_OFFSET, &mut pba);
        assert_eq!(u64::from_le_bytes(pba), 1 << 2, "masked at reset: pending");
        r.mmio.write(e + 12, &0u32.to_le_bytes());
        assert_eq!(*r.irq.fired.lock().unwrap(), vec![2]);
        r.mmio.read(0xC000_0000 + MSIX_PBA_OFFSET, &mut pba);
        assert_eq!(pba, [0; 8]);
    }
}
