//! The vGPU as a vfio-user device (issue 19): one Unix socket per vGPU,
//! served against the fleet's [`GpuArbiter`].
//!
//! A [`VgpuServer`] owns one vGPU: its socket, its scheduling parameters
//! and, while a client (a VMM) is connected, its registration with the
//! arbiter. Each connection gets a fresh front end over a [`MappedMemory`]
//! (the client's DMA_MAPs) and an [`Irqs`] (the client's SET_IRQS
//! eventfds); when the client goes away, or is killed mid-kernel, the vGPU
//! is removed from the arbiter as a dying VM is (its queues reset-unmapped)
//! and the socket accepts the next connection. What the guard and the hang
//! escalation learnt about the vGPU is not the connection's: the arbiter
//! hands it back on removal ([`VmHistory`]) and the next registration takes
//! it over, so a VMM that reconnects after each hang is escalated and
//! quarantined as one that stays; only the operator clears it
//! ([`VgpuServer::clear_quarantine`]) or removes the vGPU.
//!
//! What the client sees:
//! * the PCI config space from [`abi::config_space::vgpu_config_space`],
//!   the builder the in-VMM device uses;
//! * BAR0 registers (32-bit accesses to the front end), BAR2 doorbells
//!   (a write at `8 * i` signals vHQD `i`'s doorbell eventfd, as KVM's
//!   ioeventfd does in the VMM), MSI-X vectors through SET_IRQS eventfds
//!   with mask/unmask and pending bits ([`irq`]);
//! * DMA_MAP/UNMAP of guest memory ([`dma`]); DEVICE_RESET (queues released
//!   as on a disconnect, config space back to reset values).
//!
//! Every message is checked before it is acted on (its size against its
//! command, every range, every fd); a bad one gets an error reply, an
//! unrecoverable one (a size the stream cannot be resynchronised after)
//! ends that connection, and so does silence past
//! [`ServerOptions::first_message_timeout`] after connecting. Each vGPU is
//! served by its own thread with a bounded send time, so a client that
//! stops reading loses its own connection and costs the other vGPUs
//! nothing.
#![deny(missing_docs)]

pub mod dma;
pub mod irq;
pub mod mmio;
pub mod wire;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use abi::config_space::{read_from_dword, vgpu_config_space, ConfigSpace};
use abi::pci::{
    BAR0_SIZE, BAR2_SIZE, MSIX_CAP_OFFSET, MSIX_ENABLE, MSIX_FUNCTION_MASK, MSIX_PBA_OFFSET,
    REGS_SIZE,
};
use mdev::arbiter::{GpuArbiter, VmHistory};
use mdev::guard::GuardConfig;
use mdev::ratelimit::{Admit, RateLimiter};
use mdev::vgpu::{VgpuFrontEnd, VmId};
use scheduler::VmParams;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub use dma::MappedMemory;
pub use irq::Irqs;
use wire::{cmd, Header};

/// What one vGPU is: its name and the knobs a fleet VM has.
#[derive(Clone, Debug)]
pub struct VgpuSpec {
    /// Name (metrics and timelines label the vGPU by it).
    pub name: String,
    /// Priority, weight, partition.
    pub params: VmParams,
    /// Preemption timeout.
    pub preempt_timeout: Duration,
    /// The vGPU's guard limits (the `[gpu.guard]` defaults with its own
    /// overrides applied).
    pub guard: GuardConfig,
    /// Time slice (`None`: the level's).
    pub quantum: Option<Duration>,
}

/// Server options.
#[derive(Clone, Copy, Debug)]
pub struct ServerOptions {
    /// How long a reply may wait for a client that does not read before
    /// the connection is dropped.
    pub send_timeout: Duration,
    /// How long a client that connected may keep silent before its first
    /// message: the vGPU serves one connection at a time, so a client that
    /// connects and never speaks would hold it; past this the connection
    /// is dropped (one rate-limited log line) and the next client served.
    /// Default [`DEFAULT_FIRST_MESSAGE_TIMEOUT`].
    pub first_message_timeout: Duration,
    /// Offer BAR2 (the doorbells) as an mmap-able page and scan it this
    /// often while the vGPU has a queue loaded ([`mmio`]); `None` (the
    /// default): BAR2 is reached by REGION_WRITE only. Opt-in because a
    /// client that takes the page but keeps trapping BAR2 (hqdmux's own
    /// VMM, which rings over ioeventfd + REGION_WRITE) would pay the scans
    /// for nothing.
    pub doorbell_poll: Option<Duration>,
}

/// The BAR2 scan interval `hqdmux serve` uses for a vGPU with
/// `doorbell_page = true`, while queues are loaded
/// (docs/benchmarks.md, "Doorbells over vfio-user": its CPU cost).
pub const DEFAULT_DOORBELL_POLL: Duration = Duration::from_micros(100);

/// The default [`ServerOptions::first_message_timeout`]: a VMM sends
/// VERSION as soon as it connects (Cloud Hypervisor, QEMU and hqdmux's own
/// client all do), so a few seconds is ample.
pub const DEFAULT_FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            send_timeout: Duration::from_secs(2),
            first_message_timeout: DEFAULT_FIRST_MESSAGE_TIMEOUT,
            doorbell_poll: None,
        }
    }
}

/// Errors setting a vGPU server up.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket path is taken by something that is not a stale socket.
    #[error("socket {0}: the path exists (a live server, or not a socket)")]
    PathTaken(PathBuf),
    /// I/O on the socket.
    #[error("socket {0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// Counters of one vGPU server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted.
    pub connections: u64,
    /// Error replies sent.
    pub error_replies: u64,
    /// Commands that failed but had asked for no reply (the protocol's
    /// no-reply flag, e.g. QEMU's posted BAR writes): counted and logged
    /// (rate-limited), never answered.
    pub unreplied_errors: u64,
    /// Connections ended by the server (unrecoverable message, a client
    /// that did not read its replies, a client silent past
    /// [`ServerOptions::first_message_timeout`]) or by the client in the
    /// middle of a message. A connection closed because the server stops
    /// (SIGTERM, the vGPU removed) is a clean close, never counted here,
    /// whatever it was doing.
    pub dropped: u64,
    /// Of `dropped`: clients that sent nothing within
    /// [`ServerOptions::first_message_timeout`].
    pub silent: u64,
    /// Doorbell writes forwarded (REGION_WRITE to BAR2).
    pub doorbells: u64,
    /// Doorbells forwarded by the mmapped BAR2 page's poller (a loaded
    /// queue's write index moved; docs/vgpu-abi.md).
    pub mmap_doorbells: u64,
    /// Scans of the mmapped BAR2 page (each a wake-up of its poller).
    pub bar2_scans: u64,
    /// Resets.
    pub resets: u64,
    /// Registrations with the arbiter (a connection's first message, and
    /// each reset).
    pub registrations: u64,
}

/// One vGPU served on one socket.
pub struct VgpuServer {
    spec: Mutex<VgpuSpec>,
    arbiter: Arc<GpuArbiter>,
    listener: UnixListener,
    path: PathBuf,
    stop: EventFd,
    opts: ServerOptions,
    active: Mutex<Option<UnixStream>>,
    /// The registration lock: the live handle and whether the operator
    /// paused the vGPU (applied at each registration).
    handle: Mutex<Registration>,
    stats: Mutex<ServerStats>,
    poll_stats: Arc<mmio::PollStats>,
    /// Log lines about connections (a client can open many).
    conn_log: RateLimiter,
}

/// The vGPU's registration with the arbiter (under one lock with the spec
/// changes, so that a steer and a (re)connection cannot miss each other).
#[derive(Clone, Debug, Default)]
struct Registration {
    handle: Option<VmId>,
    paused: bool,
    /// What the last registration left for the next (guard, hang
    /// escalation): the vGPU's, not a connection's.
    history: Option<VmHistory>,
}

/// What [`VgpuServer::with_registration`] hands its closure.
pub struct Steer<'a> {
    /// The spec the next registration takes (change it to steer later
    /// connections too).
    pub spec: &'a mut VgpuSpec,
    /// Paused by the operator (applied at each registration).
    pub paused: &'a mut bool,
    /// The arbiter's handle while a client is connected.
    pub handle: Option<VmId>,
    /// The arbiter.
    pub arbiter: &'a Arc<GpuArbiter>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Binds `path`, replacing a stale socket (one nobody listens on).
fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(md) = std::fs::symlink_metadata(path) {
        let stale = md.file_type().is_socket()
            && UnixStream::connect(path)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
        if !stale {
            return Err(ServeError::PathTaken(path.into()));
        }
        std::fs::remove_file(path).map_err(|e| ServeError::Io(path.into(), e))?;
    }
    let l = UnixListener::bind(path).map_err(|e| ServeError::Io(path.into(), e))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| ServeError::Io(path.into(), e))?;
    Ok(l)
}

impl VgpuServer {
    /// Binds the vGPU's socket at `path` (mode 0600; a stale socket there
    /// is replaced). Serve it with [`VgpuServer::spawn`].
    pub fn bind(
        path: &Path,
        spec: VgpuSpec,
        arbiter: Arc<GpuArbiter>,
        opts: ServerOptions,
    ) -> Result<Arc<Self>, ServeError> {
        let listener = bind(path)?;
        listener
            .set_nonblocking(true)
            .map_err(|e| ServeError::Io(path.into(), e))?;
        let stop = EventFd::new(EFD_NONBLOCK).map_err(|e| ServeError::Io(path.into(), e))?;
        Ok(Arc::new(VgpuServer {
            spec: Mutex::new(spec),
            arbiter,
            listener,
            path: path.into(),
            stop,
            opts,
            active: Mutex::new(None),
            handle: Mutex::new(Registration::default()),
            stats: Mutex::new(ServerStats::default()),
            poll_stats: Arc::new(mmio::PollStats::default()),
            conn_log: RateLimiter::new(),
        }))
    }

    /// The server's options.
    pub fn options(&self) -> ServerOptions {
        self.opts
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The vGPU's spec.
    pub fn spec(&self) -> VgpuSpec {
        lock(&self.spec).clone()
    }

    /// The arbiter's handle of the vGPU while a client is connected.
    pub fn handle(&self) -> Option<VmId> {
        lock(&self.handle).handle
    }

    /// Paused by the operator.
    pub fn paused(&self) -> bool {
        lock(&self.handle).paused
    }

    /// Why and when the misbehaving-VM guard quarantined the vGPU (`None`:
    /// it is not), whether a client is connected or not: a quarantine
    /// outlives the connection it was earned on.
    pub fn quarantined(&self) -> Option<mdev::guard::Trip> {
        let reg = lock(&self.handle);
        match reg.handle {
            Some(h) => self.arbiter.guard_status(h).and_then(|g| g.quarantined),
            None => reg
                .history
                .as_ref()
                .and_then(|h| self.arbiter.history_quarantine(h)),
        }
    }

    /// Lifts the vGPU's guard quarantine and forgets its guard counts in
    /// the window (the operator's clear-quarantine), connected or not.
    /// Returns whether it was quarantined.
    pub fn clear_quarantine(&self) -> bool {
        let mut reg = lock(&self.handle);
        let kept = match reg.history.as_mut() {
            Some(h) => self.arbiter.clear_history_quarantine(h),
            None => false,
        };
        let live = reg
            .handle
            .is_some_and(|h| self.arbiter.clear_quarantine(h).unwrap_or(false));
        if kept && reg.handle.is_none() {
            log::info!(
                "vgpu {}: guard quarantine cleared by the operator",
                lock(&self.spec).name
            );
        }
        kept || live
    }

    /// Runs `f` under the registration lock with the spec, the pause flag
    /// and the live handle: a change applied to the arbiter through the
    /// handle and recorded in the spec reaches the current client and
    /// every later registration, with no connection in between missing it.
    pub fn with_registration<R>(&self, f: impl FnOnce(Steer<'_>) -> R) -> R {
        let mut reg = lock(&self.handle);
        let mut spec = self.spec();
        let mut paused = reg.paused;
        let r = f(Steer {
            spec: &mut spec,
            paused: &mut paused,
            handle: reg.handle,
            arbiter: &self.arbiter,
        });
        reg.paused = paused;
        *lock(&self.spec) = spec;
        r
    }

    /// Counters.
    pub fn stats(&self) -> ServerStats {
        use std::sync::atomic::Ordering::Relaxed;
        ServerStats {
            mmap_doorbells: self.poll_stats.doorbells.load(Relaxed),
            bar2_scans: self.poll_stats.scans.load(Relaxed),
            ..*lock(&self.stats)
        }
    }

    fn count(&self, f: impl FnOnce(&mut ServerStats)) {
        f(&mut lock(&self.stats));
    }

    /// Serves connections one after another on a thread of its own until
    /// [`VgpuServer::stop`].
    pub fn spawn(self: &Arc<Self>) -> std::io::Result<JoinHandle<()>> {
        let me = self.clone();
        let name = format!("vfio-{}", lock(&self.spec).name);
        std::thread::Builder::new()
            .name(name.chars().take(15).collect())
            .spawn(move || me.run())
    }

    /// Ends the current connection (its vGPU leaves the arbiter) and the
    /// accept loop; removes the socket file.
    pub fn stop(&self) {
        let _ = self.stop.write(1);
        if let Some(s) = lock(&self.active).as_ref() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Waits until the client's first byte is there (or it hung up, or the
    /// server stops): `false` when it stayed silent for
    /// [`ServerOptions::first_message_timeout`] or the server stops.
    fn first_message(&self, stream: &UnixStream) -> bool {
        let deadline = Instant::now() + self.opts.first_message_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match self.wait_readable(stream.as_raw_fd(), Some(left)) {
                Err(_) => return true, // the recv that follows reports it
                Ok((_, true)) => return false,
                Ok((true, _)) => return true,
                Ok(_) => {}
            }
        }
    }

    /// Polls `fd` for input beside the stop eventfd, for at most `timeout`
    /// (`None`: no limit); `(fd readable, stop asked)`, both false after
    /// the timeout or a signal.
    fn wait_readable(&self, fd: RawFd, timeout: Option<Duration>) -> std::io::Result<(bool, bool)> {
        let mut p = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // Whole milliseconds, rounded up (never a busy 0 ms poll).
        let ms = timeout.map_or(-1, |t| {
            i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
        });
        // SAFETY: two valid pollfds.
        if unsafe { libc::poll(p.as_mut_ptr(), 2, ms) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok((false, false));
            }
            return Err(e);
        }
        Ok((p[0].revents != 0, p[1].revents != 0))
    }

    fn stopping(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        unsafe { libc::poll(&mut p, 1, 0) > 0 }
    }

    /// Waits for a connection or the stop request.
    fn accept(&self) -> Option<UnixStream> {
        loop {
            match self.wait_readable(self.listener.as_raw_fd(), None) {
                Err(_) | Ok((_, true)) => return None,
                Ok((false, _)) => continue,
                Ok((true, false)) => {}
            }
            match self.listener.accept() {
                Ok((s, _)) => return Some(s),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => {
                    log::warn!("vgpu {}: accept: {e}", lock(&self.spec).name);
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    fn run(self: Arc<Self>) {
        while let Some(stream) = self.accept() {
            let name = lock(&self.spec).name.clone();
            if let Err(e) = self.serve(stream) {
                log::warn!("vgpu {name}: {e}");
            }
            if self.stopping() {
                break;
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }

    /// Serves one client until it goes away; then releases its queues.
    fn serve(&self, stream: UnixStream) -> Result<(), ServeError> {
        let io = |e| ServeError::Io(self.path.clone(), e);
        stream.set_nonblocking(false).map_err(io)?;
        stream
            .set_write_timeout(Some(self.opts.send_timeout))
            .map_err(io)?;
        *lock(&self.active) = Some(stream.try_clone().map_err(io)?);
        if self.stopping() {
            *lock(&self.active) = None;
            return Ok(());
        }
        self.count(|s| s.connections += 1);
        let spec = self.spec();
        log::info!("vgpu {}: client connected", spec.name);
        // The vGPU registers with the arbiter at the client's first byte: a
        // client that connects and leaves (or never speaks) costs the
        // arbiter nothing (each registration takes a slot for good).
        if !self.first_message(&stream) {
            *lock(&self.active) = None;
            if self.stopping() {
                return Ok(());
            }
            self.count(|s| {
                s.dropped += 1;
                s.silent += 1;
            });
            if let Admit::Log { suppressed } = self.conn_log.admit(Instant::now()) {
                log::warn!(
                    "vgpu {}: connection dropped: no message within {:?} of connecting \
                     ({suppressed} similar lines suppressed)",
                    spec.name,
                    self.opts.first_message_timeout
                );
            }
            return Ok(());
        }
        let mut b = [0u8; 1];
        let n = loop {
            // SAFETY: recv into a 1-byte buffer we own; MSG_PEEK leaves the
            // byte (and any fds) in the socket.
            let n =
                unsafe { libc::recv(stream.as_raw_fd(), b.as_mut_ptr().cast(), 1, libc::MSG_PEEK) };
            if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break n;
            }
        };
        if n <= 0 {
            *lock(&self.active) = None;
            log::info!("vgpu {}: client left before its first message", spec.name);
            return Ok(());
        }
        let mut conn = match Conn::open(self, stream) {
            Ok(c) => c,
            Err(e) => {
                *lock(&self.active) = None;
                log::warn!("vgpu {}: cannot register with the GPU: {e}", spec.name);
                return Ok(());
            }
        };
        let end = conn.run();
        conn.close();
        *lock(&self.active) = None;
        // A connection the server's stop cut (whatever it was doing, a
        // message half-read included) is a clean close, not a drop.
        let end = match end {
            End::Dropped(_) if self.stopping() => End::Stopped,
            e => e,
        };
        match end {
            End::Closed => log::info!("vgpu {}: client disconnected", spec.name),
            End::Stopped => log::info!("vgpu {}: connection closed: server stopping", spec.name),
            End::Dropped(why) => {
                self.count(|s| s.dropped += 1);
                if let Admit::Log { suppressed } = self.conn_log.admit(Instant::now()) {
                    log::warn!(
                        "vgpu {}: connection dropped: {why} ({suppressed} similar lines suppressed)",
                        spec.name
                    );
                }
            }
        }
        Ok(())
    }
}

/// How a connection ended.
#[derive(Debug)]
enum End {
    /// The client closed it between messages.
    Closed,
    /// The server's stop closed it.
    Stopped,
    /// The server ended it, or the client left mid-message.
    Dropped(String),
}

/// One client connection: the vGPU registered with the arbiter.
struct Conn<'a> {
    srv: &'a VgpuServer,
    stream: UnixStream,
    mem: Arc<MappedMemory>,
    irqs: Arc<Irqs>,
    fe: Arc<VgpuFrontEnd>,
    handle: VmId,
    cfg: ConfigSpace,
    msix_control: u16,
    log: RateLimiter,
    /// The mmapped BAR2 page and its poller (when offered).
    bar2: Option<(Arc<mmio::DoorbellPage>, mmio::Poller)>,
    /// A fd to send with the next reply (BAR2's region info).
    reply_fd: Option<RawFd>,
}

/// The MSI-X message control sits in bytes 2..4 of the capability's first dword.
const MSIX_CONTROL: usize = MSIX_CAP_OFFSET as usize + 2;

type Reply = Result<Vec<u8>, u32>;

fn einval<T>() -> Result<T, u32> {
    Err(libc::EINVAL as u32)
}

impl<'a> Conn<'a> {
    fn open(srv: &'a VgpuServer, stream: UnixStream) -> Result<Self, String> {
        let mem = Arc::new(MappedMemory::new());
        let irqs = Arc::new(Irqs::new());
        let (handle, fe) = srv.register(&mem, &irqs)?;
        let bar2 = match srv.opts.doorbell_poll {
            Some(interval) => {
                let page = mmio::DoorbellPage::new().map(Arc::new).and_then(|p| {
                    mmio::Poller::start(
                        fe.name(),
                        p.clone(),
                        fe.clone(),
                        interval,
                        srv.poll_stats.clone(),
                    )
                    .map(|poller| (p, poller))
                });
                match page {
                    Ok(b) => Some(b),
                    Err(e) => {
                        log::warn!(
                            "vgpu {}: BAR2 is not mmap-able on this connection: {e}",
                            fe.name()
                        );
                        None
                    }
                }
            }
            None => None,
        };
        Ok(Conn {
            srv,
            stream,
            mem,
            irqs,
            fe,
            handle,
            cfg: vgpu_config_space(),
            msix_control: 0,
            log: RateLimiter::new(),
            bar2,
            reply_fd: None,
        })
    }

    /// The client is gone: its queues are released as a dying VM's are.
    fn close(&mut self) {
        // The poller stops before the vGPU leaves the arbiter.
        self.bar2 = None;
        self.srv.unregister(self.handle);
        self.irqs.clear();
        self.mem.unmap_all();
    }

    fn warn(&self, args: std::fmt::Arguments<'_>) {
        if let Admit::Log { suppressed } = self.log.admit(Instant::now()) {
            log::warn!(
                "vgpu {}: {args} ({suppressed} similar lines suppressed)",
                self.fe.name()
            );
        }
    }

    /// Reads a header (and the fds that came with it); None at EOF. More
    /// than [`wire::MAX_FDS`] fds are all closed and reported as `Err(())`
    /// in place of the fds: the message is still read (the stream stays in
    /// step) and refused.
    #[allow(clippy::type_complexity)]
    fn read_header(&mut self) -> std::io::Result<Option<(Header, Result<Vec<File>, ()>)>> {
        let mut hb = [0u8; wire::HEADER];
        // Room for MAX_FDS descriptors (u64 for the cmsghdr's alignment).
        const SPACE: usize = 64 + 4 * wire::MAX_FDS;
        let mut cbuf = [0u64; SPACE / 8];
        let mut iov = libc::iovec {
            iov_base: hb.as_mut_ptr().cast(),
            iov_len: hb.len(),
        };
        // SAFETY: zeroed msghdr is valid; the pointers set below outlive the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a pure computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE((4 * wire::MAX_FDS) as u32) } as _;
        let n = loop {
            // SAFETY: msg points at live buffers of the lengths it states;
            // MSG_CMSG_CLOEXEC keeps received fds out of children.
            let n =
                unsafe { libc::recvmsg(self.stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if n >= 0 {
                break n as usize;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        let mut files = Vec::new();
        // SAFETY: the control buffer was filled by recvmsg; CMSG_* walk it
        // within msg_controllen, and every fd in an SCM_RIGHTS message is
        // new and owned by nobody else.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c);
                    let len = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                    for i in 0..len / 4 {
                        let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                        files.push(File::from_raw_fd(fd));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        let fds = if msg.msg_flags & libc::MSG_CTRUNC != 0 || files.len() > wire::MAX_FDS {
            Err(()) // `files` drops here: every fd that came is closed
        } else {
            Ok(files)
        };
        if n == 0 {
            return Ok(None);
        }
        if n < wire::HEADER {
            self.stream.read_exact(&mut hb[n..])?;
        }
        Ok(Some((Header::decode(&hb), fds)))
    }

    fn send(&mut self, h: &Header, body: &[u8]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(wire::HEADER + body.len());
        buf.extend_from_slice(&h.encode());
        buf.extend_from_slice(body);
        let Some(fd) = self.reply_fd.take() else {
            return self.stream.write_all(&buf);
        };
        // The fd rides on the first bytes; the rest (if the socket took a
        // part only) follows plainly.
        let mut cbuf = [0u64; 4];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: zeroed msghdr is valid; the pointers set below outlive the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a pure computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as _;
        // SAFETY: the control buffer (32 bytes) holds one cmsghdr with one fd.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
        let n = loop {
            // SAFETY: msg points at live buffers of the lengths it states.
            let n = unsafe { libc::sendmsg(self.stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
            if n >= 0 {
                break n as usize;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        self.stream.write_all(&buf[n..])
    }

    fn run(&mut self) -> End {
        loop {
            let (h, fds) = match self.read_header() {
                Ok(Some(x)) => x,
                Ok(None) => return End::Closed,
                Err(e) => return End::Dropped(format!("read: {e}")),
            };
            let size = h.size as usize;
            let no_reply = h.flags & wire::FLAG_NO_REPLY != 0;
            if !(wire::HEADER..=wire::MAX_MESSAGE).contains(&size) {
                // The body's end is unknown: the stream cannot be resynchronised.
                if no_reply {
                    self.srv.count(|s| s.unreplied_errors += 1);
                } else {
                    let _ = self.send_error(&h, libc::EINVAL as u32);
                }
                return End::Dropped(format!(
                    "message size {size} outside {}..={}",
                    wire::HEADER,
                    wire::MAX_MESSAGE
                ));
            }
            let mut body = vec![0u8; size - wire::HEADER];
            if let Err(e) = self.stream.read_exact(&mut body) {
                return End::Dropped(format!("read: {e}"));
            }
            self.reply_fd = None;
            let res = match fds {
                _ if h.flags & wire::TYPE_MASK != wire::TYPE_COMMAND => einval(),
                Err(()) => Err(libc::E2BIG as u32),
                Ok(fds) => self.dispatch(h.command, &body, fds),
            };
            let sent = match res {
                Ok(_) if no_reply => Ok(()),
                Err(errno) if no_reply => {
                    // The client asked for no reply: an error reply would be
                    // read as the answer to its next request.
                    self.srv.count(|s| s.unreplied_errors += 1);
                    self.warn(format_args!(
                        "command {} ({} bytes, no reply asked) failed: errno {errno}",
                        h.command, h.size
                    ));
                    Ok(())
                }
                Ok(reply) => {
                    let rh = Header {
                        id: h.id,
                        command: h.command,
                        size: (wire::HEADER + reply.len()) as u32,
                        flags: wire::TYPE_REPLY,
                        error: 0,
                    };
                    self.send(&rh, &reply)
                }
                Err(errno) => {
                    self.warn(format_args!(
                        "command {} ({} bytes) refused: errno {errno}",
                        h.command, h.size
                    ));
                    self.send_error(&h, errno)
                }
            };
            if let Err(e) = sent {
                return End::Dropped(format!("reply not taken: {e}"));
            }
        }
    }

    fn send_error(&mut self, h: &Header, errno: u32) -> std::io::Result<()> {
        self.reply_fd = None;
        self.srv.count(|s| s.error_replies += 1);
        let rh = Header {
            id: h.id,
            command: h.command,
            size: wire::HEADER as u32,
            flags: wire::TYPE_REPLY | wire::FLAG_ERROR,
            error: errno,
        };
        self.send(&rh, &[])
    }

    fn dispatch(&mut self, command: u16, b: &[u8], fds: Vec<File>) -> Reply {
        if !fds.is_empty() && !matches!(command, cmd::DMA_MAP | cmd::DEVICE_SET_IRQS) {
            return einval();
        }
        match command {
            cmd::VERSION => {
                if b.len() < 4 {
                    return einval();
                }
                let mut r = Vec::new();
                r.extend_from_slice(&0u16.to_le_bytes());
                r.extend_from_slice(&0u16.to_le_bytes());
                r.extend_from_slice(wire::SERVER_CAPABILITIES.as_bytes());
                r.push(0);
                Ok(r)
            }
            cmd::DEVICE_GET_INFO => {
                if b.len() != 16 {
                    return einval();
                }
                let mut r = Vec::with_capacity(16);
                r.extend_from_slice(&16u32.to_le_bytes());
                r.extend_from_slice(
                    &(wire::DEVICE_FLAGS_PCI | wire::DEVICE_FLAGS_RESET).to_le_bytes(),
                );
                r.extend_from_slice(&wire::NUM_REGIONS.to_le_bytes());
                r.extend_from_slice(&wire::NUM_IRQS.to_le_bytes());
                Ok(r)
            }
            cmd::DEVICE_GET_REGION_INFO => {
                if b.len() != 32 {
                    return einval();
                }
                let index = wire::u32_at(b, 8);
                if index >= wire::NUM_REGIONS {
                    return einval();
                }
                let size = region_size(index);
                let mut flags = if size > 0 {
                    wire::REGION_FLAG_READ | wire::REGION_FLAG_WRITE
                } else {
                    0
                };
                let mmap = index == wire::REGION_BAR2 && self.bar2.is_some();
                let (argsz, cap_offset) = if mmap {
                    flags |= wire::REGION_FLAG_MMAP | wire::REGION_FLAG_CAPS;
                    (wire::REGION_INFO + wire::BAR2_CAPS, wire::REGION_INFO)
                } else {
                    (wire::REGION_INFO, 0)
                };
                let mut r = Vec::with_capacity(argsz as usize);
                r.extend_from_slice(&argsz.to_le_bytes());
                r.extend_from_slice(&flags.to_le_bytes());
                r.extend_from_slice(&index.to_le_bytes());
                r.extend_from_slice(&cap_offset.to_le_bytes());
                r.extend_from_slice(&size.to_le_bytes());
                r.extend_from_slice(&0u64.to_le_bytes());
                // The capability list (and the page's fd) go to a client
                // whose argsz has room for them; a smaller one learns the
                // size it needs (VFIO's two-step query).
                let room = wire::u32_at(b, 0) >= argsz;
                if let (true, true, Some((page, poller))) = (mmap, room, &self.bar2) {
                    r.extend_from_slice(&wire::REGION_CAP_SPARSE_MMAP.to_le_bytes());
                    r.extend_from_slice(&1u16.to_le_bytes()); // version
                    r.extend_from_slice(&0u32.to_le_bytes()); // next
                    r.extend_from_slice(&1u32.to_le_bytes()); // nr_areas
                    r.extend_from_slice(&0u32.to_le_bytes()); // reserved
                    r.extend_from_slice(&0u64.to_le_bytes()); // area offset
                    r.extend_from_slice(&BAR2_SIZE.to_le_bytes()); // area size
                    self.reply_fd = Some(page.fd());
                    poller.arm();
                }
                Ok(r)
            }
            cmd::DEVICE_GET_IRQ_INFO => {
                if b.len() != 16 {
                    return einval();
                }
                let index = wire::u32_at(b, 8);
                if index >= wire::NUM_IRQS {
                    return einval();
                }
                let (flags, count) = if index == wire::IRQ_MSIX {
                    (
                        wire::IRQ_INFO_EVENTFD | wire::IRQ_INFO_NORESIZE,
                        abi::vgpu::NUM_VECTORS as u32,
                    )
                } else {
                    (wire::IRQ_INFO_EVENTFD, 0)
                };
                let mut r = Vec::with_capacity(16);
                r.extend_from_slice(&16u32.to_le_bytes());
                r.extend_from_slice(&flags.to_le_bytes());
                r.extend_from_slice(&index.to_le_bytes());
                r.extend_from_slice(&count.to_le_bytes());
                Ok(r)
            }
            cmd::DEVICE_SET_IRQS => self.set_irqs(b, fds),
            cmd::REGION_READ => {
                if b.len() != 16 {
                    return einval();
                }
                let (offset, region, count) =
                    (wire::u64_at(b, 0), wire::u32_at(b, 8), wire::u32_at(b, 12));
                let n = read_len(region, offset, count)?;
                let mut r = b.to_vec();
                r.resize(16 + n, 0);
                self.region_read(region, offset, &mut r[16..]);
                Ok(r)
            }
            cmd::REGION_WRITE => {
                if b.len() < 16 {
                    return einval();
                }
                let (offset, region, count) =
                    (wire::u64_at(b, 0), wire::u32_at(b, 8), wire::u32_at(b, 12));
                let n = access_len(region, offset, count)?;
                if b.len() != 16 + n {
                    return einval();
                }
                self.region_write(region, offset, &b[16..]);
                Ok(b[..16].to_vec())
            }
            cmd::DMA_MAP => {
                if b.len() != 32 || fds.len() > 1 {
                    return einval();
                }
                let (offset, address, size) =
                    (wire::u64_at(b, 8), wire::u64_at(b, 16), wire::u64_at(b, 24));
                self.mem
                    .map(fds.into_iter().next(), offset, address, size)
                    .map_err(|e| {
                        self.warn(format_args!("DMA_MAP refused: {e}"));
                        e.errno()
                    })?;
                Ok(Vec::new())
            }
            cmd::DMA_UNMAP => {
                if b.len() != 24 {
                    return einval();
                }
                let (flags, address, size) =
                    (wire::u32_at(b, 4), wire::u64_at(b, 8), wire::u64_at(b, 16));
                if flags & wire::DMA_UNMAP_DIRTY != 0 {
                    return Err(libc::ENOTSUP as u32);
                }
                if flags & wire::DMA_UNMAP_ALL != 0 {
                    self.mem.unmap_all();
                } else {
                    self.mem.unmap(address, size).map_err(|e| e.errno())?;
                }
                Ok(b.to_vec())
            }
            cmd::DEVICE_RESET => {
                if !b.is_empty() {
                    return einval();
                }
                self.reset().map(|_| Vec::new())
            }
            cmd::DEVICE_GET_REGION_IO_FDS | cmd::DMA_READ | cmd::DMA_WRITE | cmd::DIRTY_PAGES => {
                Err(libc::ENOTSUP as u32)
            }
            _ => Err(libc::ENOSYS as u32),
        }
    }

    fn set_irqs(&mut self, b: &[u8], fds: Vec<File>) -> Reply {
        use wire::*;
        if b.len() != 20 {
            return einval();
        }
        let (flags, index, start, count) =
            (u32_at(b, 4), u32_at(b, 8), u32_at(b, 12), u32_at(b, 16));
        let data = flags & (IRQ_SET_DATA_NONE | IRQ_SET_DATA_BOOL | IRQ_SET_DATA_EVENTFD);
        let action = flags & (IRQ_SET_ACTION_MASK | IRQ_SET_ACTION_UNMASK | IRQ_SET_ACTION_TRIGGER);
        if !data.is_power_of_two() || !action.is_power_of_two() || flags & !0x3F != 0 {
            return einval();
        }
        if data == IRQ_SET_DATA_BOOL {
            return Err(libc::ENOTSUP as u32);
        }
        if data != IRQ_SET_DATA_EVENTFD && !fds.is_empty() {
            return einval();
        }
        if index >= NUM_IRQS {
            return einval();
        }
        if index != IRQ_MSIX {
            // No other interrupt exists: only "disable all" is accepted.
            return if count == 0 && data == IRQ_SET_DATA_NONE {
                Ok(Vec::new())
            } else {
                einval()
            };
        }
        let n = abi::vgpu::NUM_VECTORS as u32;
        if start.checked_add(count).is_none_or(|end| end > n) {
            return einval();
        }
        let bits = if count == 0 {
            0
        } else {
            ((1u64 << count) - 1) << start
        };
        match (action, data) {
            (IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_EVENTFD) if fds.is_empty() => {
                // A run of `-1` fds: those vectors lose their eventfds.
                self.irqs.unset(start as usize, count as usize);
            }
            (IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_EVENTFD) => {
                if fds.len() != count as usize {
                    return einval();
                }
                self.irqs
                    .set_eventfds(start as usize, fds)
                    .map_err(|_| libc::EINVAL as u32)?;
            }
            (IRQ_SET_ACTION_TRIGGER, _) if count == 0 => self.irqs.clear(),
            (IRQ_SET_ACTION_TRIGGER, _) => {
                for v in start..start + count {
                    mdev::vgpu::InterruptSink::raise(&*self.irqs, v as u16);
                }
            }
            (IRQ_SET_ACTION_MASK, IRQ_SET_DATA_NONE) => self.irqs.set_masked(bits, true),
            (IRQ_SET_ACTION_UNMASK, IRQ_SET_DATA_NONE) => self.irqs.set_masked(bits, false),
            _ => return einval(),
        }
        Ok(Vec::new())
    }

    /// DEVICE_RESET: the queues go as on a disconnect; the vGPU comes back
    /// with fresh registers and config space. DMA mappings and eventfds stay
    /// (they are the VMM's, not the guest's).
    fn reset(&mut self) -> Result<(), u32> {
        self.srv.count(|s| s.resets += 1);
        self.srv.unregister(self.handle);
        let (handle, fe) = self.srv.register(&self.mem, &self.irqs).map_err(|e| {
            log::warn!("vgpu {}: reset: {e}", self.srv.spec().name);
            libc::EIO as u32
        })?;
        self.handle = handle;
        if let Some((_, poller)) = &self.bar2 {
            poller.reset(fe.clone());
        }
        self.fe = fe;
        self.cfg = vgpu_config_space();
        self.msix_control = 0;
        Ok(())
    }

    fn region_read(&self, region: u32, offset: u64, data: &mut [u8]) {
        data.fill(0);
        match region {
            wire::REGION_CONFIG if data.len() > wire::MAX_ACCESS as usize => {
                // A bulk read (QEMU reads the whole space at realize): byte by
                // byte from the dwords a guest would see.
                for (i, d) in data.iter_mut().enumerate() {
                    let off = offset as usize + i;
                    *d = self.config_dword(off).to_le_bytes()[off % 4];
                }
            }
            wire::REGION_CONFIG => {
                let off = offset as usize;
                read_from_dword(self.config_dword(off), off, data);
            }
            wire::REGION_BAR0 if offset < REGS_SIZE => {
                if data.len() == 4 && offset.is_multiple_of(4) {
                    data.copy_from_slice(&self.fe.reg_read(offset).to_le_bytes());
                } else {
                    self.fe.guest_log(
                        log::Level::Warn,
                        format_args!(
                            "{}-byte register read at {offset:#x} (32-bit aligned only)",
                            data.len()
                        ),
                    );
                    data.fill(0xFF);
                }
            }
            wire::REGION_BAR0 if (MSIX_PBA_OFFSET..MSIX_PBA_OFFSET + 8).contains(&offset) => {
                let b = self.irqs.pending().to_le_bytes();
                let s = (offset - MSIX_PBA_OFFSET) as usize;
                for (i, d) in data.iter_mut().enumerate() {
                    *d = b.get(s + i).copied().unwrap_or(0);
                }
            }
            _ => {} // MSI-X table (the VMM's), BAR2, holes: zeros
        }
    }

    /// The config dword holding `off`, with the MSI-X control word this
    /// server keeps.
    fn config_dword(&self, off: usize) -> u32 {
        let d = self.cfg.dword(off);
        if off & !3 == usize::from(MSIX_CAP_OFFSET) {
            (d & 0xFFFF) | u32::from(self.msix_control()) << 16
        } else {
            d
        }
    }

    fn msix_control(&self) -> u16 {
        (self.msix_control & (MSIX_ENABLE | MSIX_FUNCTION_MASK))
            | (abi::vgpu::NUM_VECTORS as u16 - 1)
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) {
        match region {
            wire::REGION_CONFIG => {
                let off = offset as usize;
                if !abi::config_space::access_ok(off, data.len()) {
                    return;
                }
                let end = off + data.len();
                if off < MSIX_CONTROL + 2 && end > MSIX_CONTROL {
                    let mut ctl = self.msix_control.to_le_bytes();
                    for (i, b) in data.iter().enumerate() {
                        if let Some(j) = (off + i).checked_sub(MSIX_CONTROL).filter(|j| *j < 2) {
                            ctl[j] = *b;
                        }
                    }
                    self.msix_control =
                        u16::from_le_bytes(ctl) & (MSIX_ENABLE | MSIX_FUNCTION_MASK);
                    return;
                }
                self.cfg.write(off, data);
            }
            wire::REGION_BAR0 if offset < REGS_SIZE => match <[u8; 4]>::try_from(data) {
                Ok(b) if offset.is_multiple_of(4) => {
                    self.fe.reg_write(offset, u32::from_le_bytes(b));
                    if let Some((_, poller)) = &self.bar2 {
                        // A queue may have been loaded: the poller looks.
                        poller.kick();
                    }
                }
                _ => self.fe.guest_log(
                    log::Level::Warn,
                    format_args!(
                        "{}-byte register write at {offset:#x} ignored (32-bit aligned only)",
                        data.len()
                    ),
                ),
            },
            wire::REGION_BAR0 => self.fe.guest_log(
                log::Level::Debug,
                format_args!(
                    "write to BAR0 offset {offset:#x} ignored (the MSI-X table is the VMM's)"
                ),
            ),
            wire::REGION_BAR2 => {
                self.srv.count(|s| s.doorbells += 1);
                self.fe.doorbell_write(offset);
            }
            _ => {}
        }
    }
}

impl VgpuServer {
    /// Registers the vGPU with the arbiter under the registration lock:
    /// the current spec, paused if the operator paused it.
    fn register(
        &self,
        mem: &Arc<MappedMemory>,
        irqs: &Arc<Irqs>,
    ) -> Result<(VmId, Arc<VgpuFrontEnd>), String> {
        let mut reg = lock(&self.handle);
        let spec = self.spec();
        let (h, fe) = register(&self.arbiter, &spec, mem, irqs)?;
        if reg.paused {
            if let Err(e) = self.arbiter.pause_vm(h) {
                self.arbiter.remove_vm(h);
                return Err(e.to_string());
            }
        }
        // The vGPU's guard and hang escalation continue where the last
        // registration left them (limits already set by `register`).
        if let Some(hist) = reg.history.take() {
            if let Err(e) = self.arbiter.resume_history(h, hist.clone()) {
                reg.history = Some(hist);
                self.arbiter.remove_vm(h);
                return Err(e.to_string());
            }
        }
        reg.handle = Some(h);
        self.count(|s| s.registrations += 1);
        Ok((h, fe))
    }
}

impl VgpuServer {
    /// Removes registration `h` from the arbiter under the registration
    /// lock, keeping what the next registration takes over.
    fn unregister(&self, h: VmId) {
        let mut reg = lock(&self.handle);
        reg.handle = None;
        if let Some(hist) = self.arbiter.remove_vm_keeping(h) {
            reg.history = Some(hist);
        }
    }
}

/// Bytes of region `index` (0: not implemented).
fn region_size(index: u32) -> u64 {
    match index {
        wire::REGION_BAR0 => BAR0_SIZE,
        wire::REGION_BAR2 => BAR2_SIZE,
        wire::REGION_CONFIG => abi::config_space::CONFIG_BYTES as u64,
        _ => 0,
    }
}

/// Checks a REGION_READ: as [`access_len`], except that the config region
/// may also be read in bulk (more than 8 bytes, up to its size), as QEMU's
/// vfio-user client reads it at realize.
fn read_len(region: u32, offset: u64, count: u32) -> Result<usize, u32> {
    if region == wire::REGION_CONFIG
        && count > wire::MAX_ACCESS
        && offset
            .checked_add(u64::from(count))
            .is_some_and(|e| e <= region_size(region))
    {
        return Ok(count as usize);
    }
    access_len(region, offset, count)
}

/// Checks a region access: 1, 2, 4 or 8 bytes inside an implemented region.
fn access_len(region: u32, offset: u64, count: u32) -> Result<usize, u32> {
    let size = if region < wire::NUM_REGIONS {
        region_size(region)
    } else {
        0
    };
    if !matches!(count, 1 | 2 | 4 | 8)
        || offset
            .checked_add(u64::from(count))
            .is_none_or(|e| e > size)
    {
        return einval();
    }
    Ok(count as usize)
}

fn register(
    a: &Arc<GpuArbiter>,
    spec: &VgpuSpec,
    mem: &Arc<MappedMemory>,
    irqs: &Arc<Irqs>,
) -> Result<(VmId, Arc<VgpuFrontEnd>), String> {
    let (h, fe) = a
        .add_vm(&spec.name, mem.clone(), spec.params, irqs.clone())
        .map_err(|e| e.to_string())?;
    let setup = || -> Result<(), String> {
        a.set_preempt_timeout(h, spec.preempt_timeout)
            .map_err(|e| e.to_string())?;
        a.set_guard(h, spec.guard).map_err(|e| e.to_string())?;
        if spec.quantum.is_some() {
            a.set_quantum(h, spec.quantum).map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    if let Err(e) = setup() {
        a.remove_vm(h);
        return Err(e);
    }
    Ok((h, fe))
}

#[cfg(test)]
mod tests;
