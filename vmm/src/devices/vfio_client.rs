//! The vGPU of a VM whose GPU is served by another process (`hqdmux
//! serve`) over vfio-user: `[[vm]] gpu = { socket = "..." }`.
//!
//! The VM gets the same PCI function as an in-process vGPU
//! ([`super::vgpu::VgpuPci`]: config space, BAR placement, MSI-X table and
//! PBA, doorbell ioeventfds); only its backend differs:
//!
//! * BAR0 register accesses are REGION_READ/REGION_WRITE round trips;
//! * doorbells: when the server offers BAR2 as an mmap-able page
//!   (`[[vgpu]] doorbell_page = true`), the page is mapped into the guest at
//!   BAR2 (a KVM memory slot): a doorbell is a plain store, no exit and no
//!   message. Otherwise each doorbell is a KVM ioeventfd (the vCPU does not
//!   exit to userspace) and a relay thread turns a signalled doorbell
//!   eventfd into a BAR2 REGION_WRITE to the server;
//! * the server raises vector `v` by writing the eventfd given for `v` in
//!   SET_IRQS; the relay thread passes it to the VM's [`Msix`], which
//!   applies the guest's masks and pending bits as for an in-process vGPU.
//!
//! Guest RAM (memfd) is shared with the server by one DMA_MAP per region.
//!
//! **Server loss.** The relay thread also watches the socket: the server
//! closing it (daemon killed, vGPU removed) or any request failing on the
//! stream means the device is gone. The backend then logs one line naming
//! the VM and the socket, answers every BAR0 register read with all ones
//! (as a surprise-removed PCI device reads), drops register writes and
//! doorbells, and ends the VM with [`VmOutcome::DeviceLost`] (a failed VM:
//! the run exits 1; the API shows the outcome). An error *reply* is not a
//! loss: it is counted and logged (rate-limited) as before.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use abi::pci::BAR2_SIZE;
use abi::vgpu::{NUM_VECTORS, NUM_VHQD};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::msix::Msix;
use super::vfio_wire::{UserClient, WireError};
use super::vgpu::VgpuBackend;
use crate::vm::{VmEnder, VmOutcome};

/// vfio-user region indices (VFIO PCI).
const REGION_BAR0: u32 = 0;
const REGION_BAR2: u32 = 2;
/// VFIO IRQ index of MSI-X and SET_IRQS flags (eventfd data, trigger).
const IRQ_MSIX: u32 = 2;
const IRQ_SET_EVENTFD_TRIGGER: u32 = (1 << 2) | (1 << 5);

const TOKEN_STOP: u64 = u64::MAX;
const TOKEN_SOCKET: u64 = u64::MAX - 1;
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
        source: WireError,
    },
    /// Host resources (eventfds, epoll, thread).
    #[error("vfio-user {0}: {1}")]
    Io(String, std::io::Error),
    /// Guest RAM is not one fd-backed region.
    #[error("guest RAM cannot be shared: {0}")]
    Memory(String),
}

/// The server's BAR2 doorbell page, mapped in this process.
struct DoorbellPage {
    addr: *mut libc::c_void,
    _fd: std::fs::File,
}

// SAFETY: the mapping is only handed to KVM by address; this process never
// reads or writes it through the pointer.
unsafe impl Send for DoorbellPage {}
// SAFETY: as above.
unsafe impl Sync for DoorbellPage {}

impl DoorbellPage {
    /// Maps `BAR2_SIZE` bytes of `fd` at `offset` shared and writable.
    fn map(fd: std::fs::File, offset: u64) -> std::io::Result<Self> {
        let off = libc::off_t::try_from(offset).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        // SAFETY: a new shared mapping of a fd we own; checked below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BAR2_SIZE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(DoorbellPage { addr, _fd: fd })
    }
}

impl Drop for DoorbellPage {
    fn drop(&mut self) {
        // SAFETY: our own mapping of BAR2_SIZE bytes; KVM's slot over it is
        // removed when the BAR goes (detach) before the backend is dropped.
        unsafe { libc::munmap(self.addr, BAR2_SIZE as usize) };
    }
}

/// The backend of a VM's vGPU served over vfio-user.
pub struct VfioBackend {
    name: String,
    socket: String,
    client: Mutex<UserClient>,
    doorbells: Vec<EventFd>,
    vectors: Vec<EventFd>,
    stop: EventFd,
    relay: Mutex<Option<JoinHandle<()>>>,
    errors: AtomicU64,
    log: mdev::ratelimit::RateLimiter,
    page: Option<DoorbellPage>,
    lost: AtomicBool,
    /// The VM to end when the server goes away (set once it runs); the
    /// lock also orders [`VfioBackend::bind_vm`] against a loss.
    ender: Mutex<Option<VmEnder>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl VfioBackend {
    /// Connects to the vGPU server at `socket`, shares guest RAM `mem`
    /// with it and gives it one eventfd per MSI-X vector; raised vectors
    /// go to `msix`, signalled doorbells to the server (relay thread).
    /// Maps the server's doorbell page when it offers one.
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
        let mut client = UserClient::connect(socket).map_err(proto("connect"))?;
        for r in mem.iter() {
            let f = r
                .file_offset()
                .ok_or_else(|| VfioClientError::Memory("anonymous guest RAM".into()))?;
            client
                .dma_map(f.start(), r.start_addr().0, r.len(), f.file().as_raw_fd())
                .map_err(proto("DMA_MAP"))?;
        }
        let bar2 = client
            .region_info(REGION_BAR2)
            .map_err(proto("DEVICE_GET_REGION_INFO"))?;
        let page = match (bar2.whole_mmap() && bar2.size == BAR2_SIZE, bar2.fd) {
            (true, Some(fd)) => match DoorbellPage::map(fd, bar2.offset) {
                Ok(p) => Some(p),
                Err(e) => {
                    log::warn!("vm {name}: vGPU {s}: cannot map the doorbell page ({e}); doorbells go over the socket");
                    None
                }
            },
            _ => None,
        };
        log::info!(
            "vm {name}: vGPU {s}: doorbells {}",
            if page.is_some() {
                "through the mapped BAR2 page"
            } else {
                "over the socket (ioeventfd relay)"
            }
        );
        let mk = |n: usize| {
            (0..n)
                .map(|_| EventFd::new(EFD_NONBLOCK))
                .collect::<std::io::Result<Vec<_>>>()
        };
        let doorbells = mk(NUM_VHQD).map_err(io)?;
        let vectors = mk(NUM_VECTORS).map_err(io)?;
        let fds: Vec<i32> = vectors.iter().map(|e| e.as_raw_fd()).collect();
        client
            .set_irqs(IRQ_MSIX, IRQ_SET_EVENTFD_TRIGGER, 0, &fds)
            .map_err(proto("SET_IRQS"))?;
        let stream_fd = client.as_raw_fd();
        let be = Arc::new(VfioBackend {
            name: name.into(),
            socket: s.clone(),
            client: Mutex::new(client),
            doorbells,
            vectors,
            stop: EventFd::new(EFD_NONBLOCK).map_err(io)?,
            relay: Mutex::new(None),
            errors: Default::default(),
            log: mdev::ratelimit::RateLimiter::new(),
            page,
            lost: AtomicBool::new(false),
            ender: Mutex::new(None),
        });
        let epoll = Epoll::new().map_err(io)?;
        let add = |fd: i32, events: EventSet, token: u64| {
            epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))
        };
        // Also with a mapped page: should KVM refuse the page's slot, the
        // guest's doorbells trap to these ioeventfds instead.
        for (i, d) in be.doorbells.iter().enumerate() {
            add(d.as_raw_fd(), EventSet::IN, i as u64).map_err(io)?;
        }
        for (v, e) in be.vectors.iter().enumerate() {
            add(e.as_raw_fd(), EventSet::IN, TOKEN_VECTOR + v as u64).map_err(io)?;
        }
        add(be.stop.as_raw_fd(), EventSet::IN, TOKEN_STOP).map_err(io)?;
        // Only the hang-up: replies are read by whoever sent the request.
        add(stream_fd, EventSet::READ_HANG_UP, TOKEN_SOCKET).map_err(io)?;
        let me = be.clone();
        let t = std::thread::Builder::new()
            .name("hqdmux-vfio".into())
            .spawn(move || me.relay(epoll, msix))
            .map_err(io)?;
        *lock(&be.relay) = Some(t);
        Ok(be)
    }

    /// Refused requests so far (error replies: a refused register access
    /// or doorbell).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// True once the server is gone (the device reads all ones).
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// True when doorbells go through the mapped BAR2 page.
    pub fn has_doorbell_page(&self) -> bool {
        self.page.is_some()
    }

    /// Ends `vm` with [`VmOutcome::DeviceLost`] when the server goes away
    /// (at once if it already did).
    pub fn bind_vm(&self, vm: VmEnder) {
        let mut e = lock(&self.ender);
        if self.is_lost() {
            vm.end(self.outcome());
        }
        *e = Some(vm);
    }

    fn outcome(&self) -> VmOutcome {
        VmOutcome::DeviceLost(format!(
            "the vGPU server at {} closed the connection",
            self.socket
        ))
    }

    /// The device is gone: one log line, all-ones from now on, the VM ends.
    fn lose(&self, why: &dyn std::fmt::Display) {
        let e = lock(&self.ender);
        if self.lost.swap(true, Ordering::SeqCst) {
            return;
        }
        log::error!(
            "vm {}: vGPU server {} is gone ({why}): the device now reads all ones and drops doorbells; stopping the VM (device lost)",
            self.name,
            self.socket
        );
        if let Some(vm) = e.as_ref() {
            vm.end(self.outcome());
        }
    }

    fn failed(&self, e: &WireError, what: std::fmt::Arguments<'_>) {
        if e.is_lost() {
            self.lose(&format_args!("{what}: {e}"));
            return;
        }
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let mdev::ratelimit::Admit::Log { suppressed } =
            self.log.admit(std::time::Instant::now())
        {
            log::warn!(
                "vm {}: vGPU server: {what}: {e} ({suppressed} similar lines suppressed)",
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
                    TOKEN_SOCKET => {
                        self.lose(&"the server closed the connection");
                        return;
                    }
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
                        if self.doorbells.get(i).is_some_and(|d| d.read().is_ok())
                            && !self.is_lost()
                        {
                            let off = abi::pci::DOORBELL_STRIDE * i as u64;
                            let r = lock(&self.client).region_write(REGION_BAR2, off, &[0u8; 8]);
                            if let Err(e) = r {
                                self.failed(&e, format_args!("doorbell {i}"));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Stops the relay and closes the connection (the server then releases
    /// the vGPU's queues); the VM is not ended by this.
    pub fn close(&self) {
        let _ = self.stop.write(1);
        if let Some(t) = lock(&self.relay).take() {
            let _ = t.join();
        }
        lock(&self.ender).take();
        lock(&self.client).shutdown();
    }
}

impl VgpuBackend for VfioBackend {
    fn reg_read(&self, offset: u64) -> u32 {
        if self.is_lost() {
            return u32::MAX;
        }
        let mut b = [0u8; 4];
        let r = lock(&self.client).region_read(REGION_BAR0, offset, &mut b);
        match r {
            Ok(()) => u32::from_le_bytes(b),
            Err(e) => {
                self.failed(&e, format_args!("register read {offset:#x}"));
                u32::MAX
            }
        }
    }

    fn reg_write(&self, offset: u64, value: u32) {
        if self.is_lost() {
            return;
        }
        let r = lock(&self.client).region_write(REGION_BAR0, offset, &value.to_le_bytes());
        if let Err(e) = r {
            self.failed(&e, format_args!("register write {offset:#x}"));
        }
    }

    fn doorbell_eventfd(&self, vhqd: usize) -> &EventFd {
        &self.doorbells[vhqd.min(NUM_VHQD - 1)]
    }

    fn doorbell_page(&self) -> Option<u64> {
        self.page.as_ref().map(|p| p.addr as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::msix::tests::Recorder;
    use std::time::{Duration, Instant};
    use vfio_server::{ServerOptions, VgpuServer, VgpuSpec};

    /// A vGPU server on a simulated GPU's arbiter, in this process.
    fn server(tag: &str, page: bool) -> Arc<VgpuServer> {
        let cfg = crate::config::FleetConfig::parse(
            "[[vm]]\nname = \"x\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\n",
            Path::new("/"),
        )
        .unwrap();
        let m = crate::fleet::start_arbiter(&cfg).unwrap();
        let path = std::env::temp_dir().join(format!(
            "hqdmux-vfio-client-{}-{tag}.sock",
            std::process::id()
        ));
        let s = VgpuServer::bind(
            &path,
            VgpuSpec {
                name: tag.into(),
                params: Default::default(),
                preempt_timeout: Duration::from_secs(9),
                guard: Default::default(),
                quantum: None,
            },
            m,
            ServerOptions {
                doorbell_poll: page.then_some(vfio_server::DEFAULT_DOORBELL_POLL),
                ..Default::default()
            },
        )
        .unwrap();
        s.spawn().unwrap();
        s
    }

    fn connect(srv: &VgpuServer) -> Arc<VfioBackend> {
        let mem = crate::vm::create_guest_memory("vfio-client-test", 16 << 20).unwrap();
        let msix = Arc::new(Msix::new(NUM_VECTORS, Arc::new(Recorder::default())));
        VfioBackend::connect("t", srv.path(), &mem, msix).unwrap()
    }

    /// The server going away (its vGPU removed) is a loss, not an error:
    /// from then on the device reads all ones and takes no writes, and the
    /// stream is no longer used.
    #[test]
    fn a_server_that_goes_away_leaves_a_device_that_reads_all_ones() {
        let srv = server("lost", false);
        let be = connect(&srv);
        assert!(!be.has_doorbell_page());
        assert_eq!(be.reg_read(0), abi::vgpu::VGPU_ID_VALUE);
        assert!(!be.is_lost());
        srv.stop();
        // The relay notices the hang-up on its own (no request needed).
        let t0 = Instant::now();
        while !be.is_lost() {
            assert!(t0.elapsed() < Duration::from_secs(60), "loss not noticed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(be.reg_read(0), u32::MAX);
        be.reg_write(0x100, 1);
        assert_eq!(be.errors(), 0, "a loss is not counted as refused requests");
        be.close();
    }

    /// A server offering the doorbell page gets it mapped; one without it
    /// does not; an error reply (a refused access) is not a loss.
    #[test]
    fn the_offered_doorbell_page_is_mapped_and_an_error_reply_is_no_loss() {
        let srv = server("page", true);
        let be = connect(&srv);
        assert!(be.has_doorbell_page());
        assert!(be.doorbell_page().is_some_and(|a| a % 4096 == 0));
        // BAR0 past its end: refused by the server, the connection lives.
        be.reg_write(abi::pci::BAR0_SIZE, 1);
        assert_eq!(be.errors(), 1);
        assert!(!be.is_lost());
        assert_eq!(be.reg_read(0), abi::vgpu::VGPU_ID_VALUE);
        be.close();
        srv.stop();
    }
}
