//! MSI-X for the vGPU: the table and pending-bit array the guest programs in
//! BAR0 (docs/vgpu-abi.md, "Interrupts: MSI-X"), and their delivery through
//! KVM: one GSI with an MSI route and one irqfd per vector.
//!
//! A vector fires (its irqfd is written) only while MSI-X is enabled, the
//! function is not masked and the vector is not masked; a vector raised while
//! masked sets its pending bit and fires when it is unmasked. Writing an
//! entry's address or data re-programs that vector's route.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kvm_bindings::{kvm_irq_routing_entry, KvmIrqRouting, KVM_IRQ_ROUTING_MSI};
use kvm_ioctls::VmFd;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use abi::pci::{MSIX_ENABLE, MSIX_ENTRY_SIZE, MSIX_FUNCTION_MASK, MSIX_VECTOR_MASKED};

/// One MSI message: what the guest wrote into a table entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsiMessage {
    /// Message address (xAPIC: 0xFEE00000 | apic_id << 12).
    pub address: u64,
    /// Message data (xAPIC: the vector in bits 7:0).
    pub data: u32,
}

impl MsiMessage {
    /// Whether the message is an ordinary xAPIC interrupt the host sends:
    /// address `0xFEEx_xxxx` (upper half 0), delivery mode fixed (0) or
    /// lowest priority (1), vector 16..=255. Anything else (SMI, NMI, INIT,
    /// a reserved vector, a write to some other address) is refused: the
    /// vector is not routed and its raises are dropped and counted
    /// ([`MsixStats::refused`]).
    pub fn deliverable(&self) -> bool {
        let delivery_mode = (self.data >> 8) & 0x7;
        self.address & !0xF_FFFF == 0xFEE0_0000 && delivery_mode <= 1 && self.data & 0xFF >= 16
    }
}

/// Where MSI-X messages go: KVM routes + irqfds, or a test double.
pub trait MsiTarget: Send + Sync {
    /// The message of `vector` changed.
    fn route(&self, vector: u16, msg: MsiMessage);
    /// Sends `vector`'s message (never blocks).
    fn trigger(&self, vector: u16);
    /// A raise of `vector` was dropped: its message is not deliverable
    /// ([`MsiMessage::deliverable`]). Default: nothing.
    fn refused(&self, _vector: u16) {}
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    msg: MsiMessage,
    control: u32,
}

impl Default for Entry {
    fn default() -> Self {
        // Reset state: every vector masked.
        Entry {
            msg: MsiMessage::default(),
            control: MSIX_VECTOR_MASKED,
        }
    }
}

struct State {
    entries: Vec<Entry>,
    pending: u64,
    control: u16,
}

/// Counters of an MSI-X function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsixStats {
    /// Messages sent.
    pub fired: u64,
    /// Raises that set a pending bit (vector or function masked).
    pub held: u64,
    /// Raises dropped because MSI-X was disabled or the vector does not exist.
    pub dropped: u64,
    /// Raises dropped because the vector's message is not deliverable
    /// ([`MsiMessage::deliverable`]).
    pub refused: u64,
}

/// The MSI-X table, PBA and message control of one function.
pub struct Msix {
    st: Mutex<State>,
    stats: Mutex<MsixStats>,
    target: Arc<dyn MsiTarget>,
}

impl Msix {
    /// `vectors` entries (at most 64), all masked, MSI-X disabled.
    pub fn new(vectors: usize, target: Arc<dyn MsiTarget>) -> Self {
        assert!((1..=64).contains(&vectors), "1..=64 MSI-X vectors");
        Msix {
            st: Mutex::new(State {
                entries: vec![Entry::default(); vectors],
                pending: 0,
                control: 0,
            }),
            stats: Mutex::new(MsixStats::default()),
            target,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state consistent: a poisoned lock is usable.
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, f: impl FnOnce(&mut MsixStats)) {
        f(&mut self.stats.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Counters.
    pub fn stats(&self) -> MsixStats {
        *self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of vectors.
    pub fn vectors(&self) -> usize {
        self.lock().entries.len()
    }

    /// Bytes of the table.
    pub fn table_bytes(&self) -> u64 {
        self.vectors() as u64 * MSIX_ENTRY_SIZE
    }

    /// Message control as the guest reads it (table size field included).
    pub fn control(&self) -> u16 {
        let st = self.lock();
        (st.control & (MSIX_ENABLE | MSIX_FUNCTION_MASK)) | (st.entries.len() as u16 - 1)
    }

    /// Guest write of the message control (only enable and function mask are writable).
    pub fn set_control(&self, value: u16) {
        let fire = {
            let mut st = self.lock();
            st.control = value & (MSIX_ENABLE | MSIX_FUNCTION_MASK);
            Self::take_deliverable(&mut st)
        };
        self.fire_all(fire);
    }

    fn delivering(st: &State) -> bool {
        st.control & MSIX_ENABLE != 0 && st.control & MSIX_FUNCTION_MASK == 0
    }

    /// Pending vectors that may fire now, as (deliverable, refused
    /// messages); their pending bits are cleared.
    fn take_deliverable(st: &mut State) -> (u64, u64) {
        if !Self::delivering(st) {
            return (0, 0);
        }
        let mut fire = 0;
        for (v, e) in st.entries.iter().enumerate() {
            if st.pending & (1 << v) != 0 && e.control & MSIX_VECTOR_MASKED == 0 {
                fire |= 1 << v;
            }
        }
        st.pending &= !fire;
        let mut refused = 0;
        for (v, e) in st.entries.iter().enumerate() {
            if fire & (1 << v) != 0 && !e.msg.deliverable() {
                refused |= 1 << v;
            }
        }
        (fire & !refused, refused)
    }

    /// Sends the vectors of `fire`; counts those of `refused`.
    fn fire_all(&self, (fire, refused): (u64, u64)) {
        for v in 0..64 {
            if fire & (1 << v) != 0 {
                self.target.trigger(v as u16);
                self.count(|s| s.fired += 1);
            }
            if refused & (1 << v) != 0 {
                self.target.refused(v as u16);
                self.count(|s| s.refused += 1);
            }
        }
    }

    /// Raises `vector`: sends it, or sets its pending bit while masked
    /// (a vector whose message is not deliverable is dropped and counted).
    pub fn raise(&self, vector: u16) {
        let v = usize::from(vector);
        let mut pending = 0;
        let outcome = {
            let mut st = self.lock();
            if v >= st.entries.len() || st.control & MSIX_ENABLE == 0 {
                None
            } else if Self::delivering(&st) && st.entries[v].control & MSIX_VECTOR_MASKED == 0 {
                Some(st.entries[v].msg.deliverable())
            } else {
                st.pending |= 1 << v;
                pending = 1 << v;
                Some(false)
            }
        };
        match outcome {
            Some(true) => self.fire_all((1 << v, 0)),
            Some(false) if pending != 0 => self.count(|s| s.held += 1),
            Some(false) => self.fire_all((0, 1 << v)),
            None => self.count(|s| s.dropped += 1),
        }
    }

    /// Guest read in the table (`offset` from the table start, 4 or 8 bytes).
    pub fn table_read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let st = self.lock();
        let dword = |off: u64| -> u32 {
            let Some(e) = st.entries.get((off / MSIX_ENTRY_SIZE) as usize) else {
                return 0;
            };
            match off % MSIX_ENTRY_SIZE {
                0 => e.msg.address as u32,
                4 => (e.msg.address >> 32) as u32,
                8 => e.msg.data,
                _ => e.control,
            }
        };
        match data.len() {
            4 if offset.is_multiple_of(4) => data.copy_from_slice(&dword(offset).to_le_bytes()),
            8 if offset.is_multiple_of(8) => {
                let v = u64::from(dword(offset)) | u64::from(dword(offset + 4)) << 32;
                data.copy_from_slice(&v.to_le_bytes());
            }
            _ => {} // other sizes read 0
        }
    }

    /// Guest write in the table (`offset` from the table start, 4 or 8
    /// bytes, naturally aligned; anything else is ignored). Returns false
    /// when ignored.
    pub fn table_write(&self, offset: u64, data: &[u8]) -> bool {
        let dwords: Vec<(u64, u32)> = match data.len() {
            4 if offset.is_multiple_of(4) => {
                vec![(offset, u32::from_le_bytes(data.try_into().unwrap()))]
            }
            8 if offset.is_multiple_of(8) => {
                let v = u64::from_le_bytes(data.try_into().unwrap());
                vec![(offset, v as u32), (offset + 4, (v >> 32) as u32)]
            }
            _ => return false,
        };
        let mut routes = Vec::new();
        let fire = {
            let mut st = self.lock();
            for (off, v) in dwords {
                let idx = (off / MSIX_ENTRY_SIZE) as usize;
                let Some(e) = st.entries.get_mut(idx) else {
                    return false;
                };
                let before = e.msg;
                match off % MSIX_ENTRY_SIZE {
                    0 => e.msg.address = (e.msg.address & !0xFFFF_FFFF) | u64::from(v),
                    4 => e.msg.address = (e.msg.address & 0xFFFF_FFFF) | u64::from(v) << 32,
                    8 => e.msg.data = v,
                    _ => e.control = v & MSIX_VECTOR_MASKED,
                }
                if e.msg != before {
                    routes.push((idx as u16, e.msg));
                }
            }
            Self::take_deliverable(&mut st)
        };
        for (v, msg) in routes {
            // An undeliverable message is never sent: its route stays inert.
            let msg = if msg.deliverable() {
                msg
            } else {
                MsiMessage::default()
            };
            self.target.route(v, msg);
        }
        self.fire_all(fire);
        true
    }

    /// The pending-bit array (one u64: at most 64 vectors).
    pub fn pba(&self) -> u64 {
        self.lock().pending
    }
}

impl mdev::vgpu::InterruptSink for Msix {
    fn raise(&self, vector: u16) {
        Msix::raise(self, vector);
    }
}

/// Errors setting up MSI delivery in KVM.
#[derive(Debug, thiserror::Error)]
pub enum MsiError {
    /// An eventfd could not be created.
    #[error("irqfd eventfd: {0}")]
    EventFd(std::io::Error),
    /// A KVM ioctl failed.
    #[error("KVM {what}: {source}")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
}

/// First GSI used for MSI routes (after the 24 IOAPIC pins).
pub const MSI_GSI_BASE: u32 = 24;

/// MSI delivery through KVM: GSI `MSI_GSI_BASE + v` has vector `v`'s MSI
/// route, and an irqfd on it; [`MsiTarget::trigger`] writes the irqfd.
/// The VM's routing table holds only these routes (the guests use no
/// IOAPIC or PIC line).
pub struct KvmMsi {
    vm: Arc<VmFd>,
    irqfds: Vec<EventFd>,
    routes: Mutex<Vec<MsiMessage>>,
    name: String,
    /// Rate limit of the guest-triggered "message refused" lines.
    log: mdev::ratelimit::RateLimiter,
}

impl KvmMsi {
    /// Routes and irqfds for `vectors` vectors of VM `vm` (its in-kernel
    /// irqchip must exist).
    pub fn new(vm: Arc<VmFd>, vectors: usize, name: &str) -> Result<Self, MsiError> {
        let irqfds = (0..vectors)
            .map(|_| EventFd::new(EFD_NONBLOCK).map_err(MsiError::EventFd))
            .collect::<Result<Vec<_>, _>>()?;
        let k = KvmMsi {
            vm,
            irqfds,
            routes: Mutex::new(vec![MsiMessage::default(); vectors]),
            name: name.to_owned(),
            log: mdev::ratelimit::RateLimiter::new(),
        };
        k.program(&k.routes.lock().unwrap_or_else(PoisonError::into_inner))?;
        for (v, fd) in k.irqfds.iter().enumerate() {
            k.vm.register_irqfd(fd, MSI_GSI_BASE + v as u32)
                .map_err(|source| MsiError::Kvm {
                    what: "register_irqfd",
                    source,
                })?;
        }
        Ok(k)
    }

    fn program(&self, routes: &[MsiMessage]) -> Result<(), MsiError> {
        let mut table = KvmIrqRouting::new(routes.len()).map_err(|_| MsiError::Kvm {
            what: "routing table",
            source: kvm_ioctls::Error::new(libc::EINVAL),
        })?;
        for (i, (e, m)) in table.as_mut_slice().iter_mut().zip(routes).enumerate() {
            *e = kvm_irq_routing_entry {
                gsi: MSI_GSI_BASE + i as u32,
                type_: KVM_IRQ_ROUTING_MSI,
                ..Default::default()
            };
            e.u.msi.address_lo = m.address as u32;
            e.u.msi.address_hi = (m.address >> 32) as u32;
            e.u.msi.data = m.data;
        }
        self.vm
            .set_gsi_routing(&table)
            .map_err(|source| MsiError::Kvm {
                what: "set_gsi_routing",
                source,
            })
    }
}

impl MsiTarget for KvmMsi {
    fn route(&self, vector: u16, msg: MsiMessage) {
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(r) = routes.get_mut(usize::from(vector)) else {
            return;
        };
        *r = msg;
        if let Err(e) = self.program(&routes) {
            log::warn!("{}: MSI-X vector {vector}: {e}", self.name);
        }
    }

    fn refused(&self, vector: u16) {
        if let mdev::ratelimit::Admit::Log { suppressed } =
            self.log.admit(std::time::Instant::now())
        {
            log::warn!(
                "{}: MSI-X vector {vector}: message is not a fixed or lowest-priority xAPIC \
                 interrupt (address 0xFEEx_xxxx, vector >= 16): not sent ({suppressed} similar \
                 lines suppressed)",
                self.name
            );
        }
    }

    fn trigger(&self, vector: u16) {
        if let Some(fd) = self.irqfds.get(usize::from(vector)) {
            if let Err(e) = fd.write(1) {
                log::warn!("{}: MSI-X vector {vector}: irqfd write: {e}", self.name);
            }
        }
    }
}

impl Drop for KvmMsi {
    fn drop(&mut self) {
        for (v, fd) in self.irqfds.iter().enumerate() {
            let _ = self.vm.unregister_irqfd(fd, MSI_GSI_BASE + v as u32);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Records routes and triggers.
    #[derive(Default)]
    pub(crate) struct Recorder {
        pub routes: Mutex<Vec<(u16, MsiMessage)>>,
        pub fired: Mutex<Vec<u16>>,
    }

    impl MsiTarget for Recorder {
        fn route(&self, vector: u16, msg: MsiMessage) {
            self.routes.lock().unwrap().push((vector, msg));
        }
        fn trigger(&self, vector: u16) {
            self.fired.lock().unwrap().push(vector);
        }
    }

    fn entry_write(m: &Msix, v: u64, addr: u32, data: u32, ctrl: u32) {
        let b = v * MSIX_ENTRY_SIZE;
        assert!(m.table_write(b, &addr.to_le_bytes()));
        assert!(m.table_write(b + 4, &0u32.to_le_bytes()));
        assert!(m.table_write(b + 8, &data.to_le_bytes()));
        assert!(m.table_write(b + 12, &ctrl.to_le_bytes()));
    }

    #[test]
    fn masked_vectors_pend_and_fire_on_unmask() {
        let r = Arc::new(Recorder::default());
        let m = Msix::new(9, r.clone());
        assert_eq!(m.control(), 8, "table size field = N - 1, disabled");
        m.raise(0);
        assert_eq!(m.stats().dropped, 1, "disabled: no message, no pending bit");
        assert_eq!(m.pba(), 0);
        m.set_control(MSIX_ENABLE | MSIX_FUNCTION_MASK | 0x7FF);
        assert_eq!(m.control(), MSIX_ENABLE | MSIX_FUNCTION_MASK | 8);
        entry_write(&m, 3, 0xFEE0_0000, 0x43, 0);
        assert_eq!(
            r.routes.lock().unwrap().last().copied(),
            Some((
                3,
                MsiMessage {
                    address: 0xFEE0_0000,
                    data: 0x43
                }
            ))
        );
        m.raise(3); // function masked
        m.raise(5); // vector masked (reset state)
        assert_eq!(m.pba(), (1 << 3) | (1 << 5));
        assert!(r.fired.lock().unwrap().is_empty());
        m.set_control(MSIX_ENABLE);
        assert_eq!(*r.fired.lock().unwrap(), vec![3]);
        assert_eq!(m.pba(), 1 << 5);
        entry_write(&m, 5, 0xFEE0_0000, 0x45, 0);
        assert_eq!(*r.fired.lock().unwrap(), vec![3, 5]);
        assert_eq!(m.pba(), 0);
        m.raise(5);
        m.raise(9); // no such vector
        assert_eq!(*r.fired.lock().unwrap(), vec![3, 5, 5]);
        assert_eq!(
            m.stats(),
            MsixStats {
                fired: 3,
                held: 2,
                dropped: 2,
                refused: 0,
            }
        );
    }

    #[test]
    fn messages_that_are_not_plain_xapic_interrupts_are_never_sent() {
        let r = Arc::new(Recorder::default());
        let m = Msix::new(8, r.clone());
        m.set_control(MSIX_ENABLE);
        let bad = [
            (0xFEE0_0000, 0x0F),         // vector below 16
            (0xFEE0_0000, 0x200 | 0x40), // SMI
            (0xFEE0_0000, 0x400 | 0x40), // NMI
            (0xFEE0_0000, 0x500 | 0x40), // INIT
            (0xFED0_0000, 0x40),         // not the APIC window
            (0x0000_1000, 0x40),         // guest RAM
        ];
        for (v, (addr, data)) in bad.iter().enumerate() {
            entry_write(&m, v as u64, *addr, *data, 0);
            assert_eq!(
                r.routes.lock().unwrap().last().map(|x| x.1),
                Some(MsiMessage::default()),
                "vector {v}: an inert route, never the guest's message"
            );
            m.raise(v as u16);
        }
        // Held while masked, refused when unmasked.
        entry_write(&m, 6, 0xFEE0_0000, 0x700, MSIX_VECTOR_MASKED); // ExtINT
        m.raise(6);
        assert_eq!(m.pba(), 1 << 6);
        entry_write(&m, 6, 0xFEE0_0000, 0x700, 0);
        assert_eq!(m.pba(), 0);
        // Good messages: fixed and lowest priority.
        entry_write(&m, 7, 0xFEE0_1000, 0x1_0030, 0);
        m.raise(7);
        assert_eq!(
            *r.fired.lock().unwrap(),
            vec![7],
            "only the good vector fired"
        );
        let st = m.stats();
        assert_eq!((st.fired, st.held, st.refused), (1, 1, 7));
        assert!(MsiMessage {
            address: 0xFEE0_0000,
            data: 0x130
        }
        .deliverable());
        assert!(!MsiMessage {
            address: 0x1_FEE0_0000,
            data: 0x30
        }
        .deliverable());
    }

    #[test]
    fn table_reads_back_and_rejects_bad_accesses() {
        let r = Arc::new(Recorder::default());
        let m = Msix::new(2, r.clone());
        assert!(m.table_write(16, &0x1234_5678_FEE0_1000u64.to_le_bytes()));
        let mut b = [0u8; 8];
        m.table_read(16, &mut b);
        assert_eq!(u64::from_le_bytes(b), 0x1234_5678_FEE0_1000);
        let mut d = [0u8; 4];
        m.table_read(12, &mut d);
        assert_eq!(u32::from_le_bytes(d), MSIX_VECTOR_MASKED, "reset: masked");
        // Reserved control bits do not stick; bad widths/alignment/range ignored.
        assert!(m.table_write(12, &0xFFFF_FFFEu32.to_le_bytes()));
        m.table_read(12, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0);
        assert!(!m.table_write(1, &[1, 2, 3, 4]));
        assert!(!m.table_write(0, &[1, 2]));
        assert!(!m.table_write(32, &1u32.to_le_bytes()));
        assert!(!m.table_write(u64::MAX - 3, &1u32.to_le_bytes()));
        let mut odd = [0xAAu8; 2];
        m.table_read(0, &mut odd);
        assert_eq!(odd, [0, 0]);
        m.table_read(4096, &mut d);
        assert_eq!(d, [0; 4]);
    }
}
