//! The vGPU of a VM whose GPU is served by another process (`hqdmux
//! serve`) over vfio-user: `[[vm]] gpu = { socket = "..." }`.
//!
//! The VM gets the same PCI function as an in-process vGPU
//! ([`super::vgpu::VgpuPci`]: config space, BAR placement, MSI-X table and
//! PBA, doorbell ioeventfds); only its backend differs:
//!
//! * BAR0 register accesses are REGION_READ/REGION_WRITE round trips;
//! * each doorbell is still a KVM ioeventfd (the vCPU does not exit); a
//!   relay thread turns a signalled doorbell eventfd into a BAR2
//!   REGION_WRITE to the server;
//! * the server raises vector `v` by writing the eventfd given for `v` in
//!   SET_IRQS; the relay thread passes it to the VM's [`Msix`], which
//!   applies the guest's masks and pending bits as for an in-process vGPU.
//!
//! Guest RAM (memfd) is shared with the server by one DMA_MAP.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use abi::vgpu::{NUM_VECTORS, NUM_VHQD};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::msix::Msix;
use super::vgpu::VgpuBackend;

/// vfio-user region indices (VFIO PCI).
const REGION_BAR0: u32 = 0;
const REGION_BAR2: u32 = 2;
/// VFIO IRQ index of MSI-X and SET_IRQS flags (eventfd data, trigger).
const IRQ_MSIX: u32 = 2;
const IRQ_SET_EVENTFD_TRIGGER: u32 = (1 << 2) | (1 << 5);

const TOKEN_STOP: u64 = u64::MAX;
const TOKEN_VECTOR: u64 = 1 << 32;

/// Errors connecting a VM to a vGPU server.
#[derive(Debug, thiserror::Error)]
pub enum VfioClientError {
    /// The vfio-user session could not be set up.
    #[error("vfio-user {socket}: {what}: {source}")]
    Protocol {
        /// The socket.
        socket: String,
        /// The step.
        what: &'static str,
        /// The error.
        source: vfio_user::Error,
    },
    /// Host resources (eventfds, epoll, thread).
    #[error("vfio-user {0}: {1}")]
    Io(String, std::io::Error),
    /// Guest RAM is not one fd-backed region.
    #[error("guest RAM cannot be shared: {0}")]
    Memory(String),
}

/// The backend of a VM's vGPU served over vfio-user.
pub struct VfioBackend {
    name: String,
    client: Mutex<vfio_user::Client>,
    doorbells: Vec<EventFd>,
    vectors: Vec<EventFd>,
    stop: EventFd,
    relay: Mutex<Option<JoinHandle<()>>>,
    errors: std::sync::atomic::AtomicU64,
    log: mdev::ratelimit::RateLimiter,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl VfioBackend {
    /// Connects to the vGPU server at `socket`, shares guest RAM `mem`
    /// with it and gives it one eventfd per MSI-X vector; raised vectors
    /// go to `msix`, signalled doorbells to the server (relay thread).
    pub fn connect(
        name: &str,
        socket: &Path,
        mem: &GuestMemoryMmap,
        msix: Arc<Msix>,
    ) -> Result<Arc<Self>, VfioClientError> {
        let s = socket.display().to_string();
        let proto = |what| {
            let s = s.clone();
            move |source| VfioClientError::Protocol {
                socket: s,
                what,
                source,
            }
        };
        let io = |e| VfioClientError::Io(s.clone(), e);
        let mut client = vfio_user::Client::new(socket).map_err(proto("connect"))?;
        for r in mem.iter() {
            let f = r
                .file_offset()
                .ok_or_else(|| VfioClientError::Memory("anonymous guest RAM".into()))?;
            client
                .dma_map(f.start(), r.start_addr().0, r.len(), f.file().as_raw_fd())
                .map_err(proto("DMA_MAP"))?;
        }
        let mk = |n: usize| {
            (0..n)
                .map(|_| EventFd::new(EFD_NONBLOCK))
                .collect::<std::io::Result<Vec<_>>>()
        };
        let doorbells = mk(NUM_VHQD).map_err(io)?;
        let vectors = mk(NUM_VECTORS).map_err(io)?;
        let fds: Vec<i32> = vectors.iter().map(|e| e.as_raw_fd()).collect();
        client
            .set_irqs(
                IRQ_MSIX,
                IRQ_SET_EVENTFD_TRIGGER,
                0,
                NUM_VECTORS as u32,
                &fds,
            )
            .map_err(proto("SET_IRQS"))?;
        let be = Arc::new(VfioBackend {
            name: name.into(),
            client: Mutex::new(client),
            doorbells,
            vectors,
            stop: EventFd::new(EFD_NONBLOCK).map_err(io)?,
            relay: Mutex::new(None),
            errors: Default::default(),
            log: mdev::ratelimit::RateLimiter::new(),
        });
        let epoll = Epoll::new().map_err(io)?;
        let add = |fd: i32, token: u64| {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )
        };
        for (i, d) in be.doorbells.iter().enumerate() {
            add(d.as_raw_fd(), i as u64).map_err(io)?;
        }
        for (v, e) in be.vectors.iter().enumerate() {
            add(e.as_raw_fd(), TOKEN_VECTOR + v as u64).map_err(io)?;
        }
        add(be.stop.as_raw_fd(), TOKEN_STOP).map_err(io)?;
        let me = be.clone();
        let t = std::thread::Builder::new()
            .name("hqdmux-vfio".into())
            .spawn(move || me.relay(epoll, msix))
            .map_err(io)?;
        *lock(&be.relay) = Some(t);
        Ok(be)
    }

    /// Socket errors so far (each a refused register access or a lost doorbell).
    pub fn errors(&self) -> u64 {
        self.errors.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn failed(&self, what: std::fmt::Arguments<'_>) {
        self.errors
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let mdev::ratelimit::Admit::Log { suppressed } =
            self.log.admit(std::time::Instant::now())
        {
            log::warn!(
                "vm {}: vGPU server: {what} ({suppressed} similar lines suppressed)",
                self.name
            );
        }
    }

    fn relay(&self, epoll: Epoll, msix: Arc<Msix>) {
        let mut events = vec![EpollEvent::default(); 32];
        loop {
            let n = match epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::error!("vm {}: vGPU relay: {e}", self.name);
                    return;
                }
            };
            for ev in &events[..n] {
                match ev.data() {
                    TOKEN_STOP => return,
                    t if t >= TOKEN_VECTOR => {
                        let v = (t - TOKEN_VECTOR) as usize;
                        if let Some(e) = self.vectors.get(v) {
                            if e.read().is_ok() {
                                msix.raise(v as u16);
                            }
                        }
                    }
                    i => {
                        let i = i as usize;
                        if self.doorbells.get(i).is_some_and(|d| d.read().is_ok()) {
                            let off = abi::pci::DOORBELL_STRIDE * i as u64;
                            if let Err(e) =
                                lock(&self.client).region_write(REGION_BAR2, off, &[0u8; 8])
                            {
                                self.failed(format_args!("doorbell {i}: {e}"));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Stops the relay and closes the connection (the server then releases
    /// the vGPU's queues).
    pub fn close(&self) {
        let _ = self.stop.write(1);
        if let Some(t) = lock(&self.relay).take() {
            let _ = t.join();
        }
        let _ = lock(&self.client).shutdown();
    }
}

impl VgpuBackend for VfioBackend {
    fn reg_read(&self, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        match lock(&self.client).region_read(REGION_BAR0, offset, &mut b) {
            Ok(()) => u32::from_le_bytes(b),
            Err(e) => {
                self.failed(format_args!("register read {offset:#x}: {e}"));
                u32::MAX
            }
        }
    }

    fn reg_write(&self, offset: u64, value: u32) {
        if let Err(e) = lock(&self.client).region_write(REGION_BAR0, offset, &value.to_le_bytes()) {
            self.failed(format_args!("register write {offset:#x}: {e}"));
        }
    }

    fn doorbell_eventfd(&self, vhqd: usize) -> &EventFd {
        &self.doorbells[vhqd.min(NUM_VHQD - 1)]
    }
}
