//! Graceful stop on SIGINT and SIGTERM.
//!
//! [`install`] replaces the default action of SIGINT and SIGTERM (kill the
//! process at once) with a handler that writes to an eventfd. The fleet's
//! event loop watches that eventfd ([`StopSignal::fd`]) beside its VMs' end
//! eventfds and the run timer: on the first signal it stops every VM, keeps
//! their reports and GPU figures, prints the summary, removes the control
//! socket and the process exits `128 + signal` (130 for SIGINT, 143 for
//! SIGTERM, the shell convention). A second SIGINT or SIGTERM while the fleet
//! is stopping ends the process at once with the same code (`_exit`, no
//! summary): it removes the API socket registered with [`SocketCleanup`]
//! and prints one line on stderr first.
//!
//! The handler only does async-signal-safe work: an atomic compare-exchange,
//! `write(2)` on the eventfd and, for the second signal, `unlink(2)`,
//! `write(2)` on stderr and `_exit(2)`. It saves and restores `errno`. The vCPU kick signal (`SIGRTMIN`, see
//! `vm.rs`) is a different signal and is left alone; a SIGINT/SIGTERM that
//! lands on a vCPU thread interrupts `KVM_RUN` with `EINTR`, which the vCPU
//! loop already retries.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};
use std::sync::Arc;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// The signal that asked for the stop (0: none yet).
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// The eventfd the handler writes (-1: none installed).
static STOP_FD: AtomicI32 = AtomicI32::new(-1);
/// The API socket a second signal removes (null: none).
static SOCKET: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

/// Registers the API socket file for removal by a second signal (which
/// ends the process before the server can remove it); unregistered on
/// drop. Drop it before the server, which then removes the file itself.
#[derive(Debug)]
pub struct SocketCleanup(());

impl SocketCleanup {
    /// Registers `path`.
    pub fn register(path: &Path) -> Self {
        if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
            // Never freed: the handler may read it at any moment (one
            // path per fleet run).
            SOCKET.store(c.into_raw(), Ordering::SeqCst);
        }
        SocketCleanup(())
    }
}

impl Drop for SocketCleanup {
    fn drop(&mut self) {
        SOCKET.store(std::ptr::null_mut(), Ordering::SeqCst);
    }
}

/// The line a second signal prints before the process ends.
pub fn second_signal_line(signal: i32) -> &'static [u8] {
    match signal {
        libc::SIGINT => b"hqdmux: second SIGINT: exiting at once, no summary\n",
        libc::SIGTERM => b"hqdmux: second SIGTERM: exiting at once, no summary\n",
        _ => b"hqdmux: second signal: exiting at once, no summary\n",
    }
}

/// Handles to the stop request: an eventfd written on the first SIGINT or
/// SIGTERM. Cloning shares the same eventfd.
#[derive(Debug, Clone)]
pub struct StopSignal {
    fd: Arc<EventFd>,
}

impl StopSignal {
    /// The eventfd to watch (readable once a stop was asked for).
    pub fn fd(&self) -> &EventFd {
        &self.fd
    }

    /// The signal that asked for the stop, if one arrived.
    pub fn received(&self) -> Option<i32> {
        received()
    }

    /// A stop request not tied to a signal, for tests and embedders: makes
    /// [`fd`](Self::fd) readable as a signal would.
    pub fn request(&self) {
        let _ = self.fd.write(1);
    }
}

/// A stop eventfd no signal writes: stopped only by
/// [`StopSignal::request`] (embedders and tests that must not take over
/// the process's signal handlers).
pub fn manual() -> std::io::Result<StopSignal> {
    Ok(StopSignal {
        fd: Arc::new(EventFd::new(EFD_NONBLOCK)?),
    })
}

/// Installs the SIGINT/SIGTERM handlers and returns the stop eventfd. Call
/// once, before the fleet starts; later calls return a new eventfd and
/// redirect the handler to it.
pub fn install() -> std::io::Result<StopSignal> {
    let fd = Arc::new(EventFd::new(EFD_NONBLOCK)?);
    STOP_FD.store(fd.as_raw_fd(), Ordering::SeqCst);
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid starting value; the handler
        // is an `extern "C" fn(c_int)` that only performs async-signal-safe
        // operations; `sigemptyset` gets a valid pointer.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(StopSignal { fd })
}

/// The signal that asked for the stop, if one arrived.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The process exit code after a stop by `signal`: `128 + signal`.
pub fn exit_code(signal: i32) -> u8 {
    u8::try_from(128 + signal.clamp(0, 127)).unwrap_or(u8::MAX)
}

/// The signal's name as operators write it (`SIGINT`, `SIGTERM`).
pub fn name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        s => format!("signal {s}"),
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    // SAFETY: errno is thread-local; saving and restoring it keeps the
    // interrupted code's view intact.
    let errno = unsafe { *libc::__errno_location() };
    if RECEIVED
        .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // Second signal: no graceful path, end now, without leaving the
        // socket behind.
        let path = SOCKET.load(Ordering::SeqCst);
        let line = second_signal_line(sig);
        // SAFETY: unlink, write and _exit are async-signal-safe; `path` is
        // null or a NUL-terminated string that is never freed; `line` is
        // static.
        unsafe {
            if !path.is_null() {
                libc::unlink(path);
            }
            libc::write(2, line.as_ptr().cast(), line.len());
            libc::_exit(i32::from(exit_code(sig)));
        }
    }
    let fd = STOP_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; `one` is 8 valid bytes;
        // the eventfd lives as long as the `StopSignal` (the process, in
        // `hqdmux run`).
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code(libc::SIGINT), 130);
        assert_eq!(exit_code(libc::SIGTERM), 143);
        assert_eq!(name(libc::SIGTERM), "SIGTERM");
        assert_eq!(name(libc::SIGINT), "SIGINT");
    }

    #[test]
    fn a_request_makes_the_eventfd_readable() {
        let s = StopSignal {
            fd: Arc::new(EventFd::new(EFD_NONBLOCK).unwrap()),
        };
        assert!(s.fd().read().is_err(), "nothing yet (EAGAIN)");
        s.clone().request();
        assert_eq!(s.fd().read().unwrap(), 1);
    }
}
