//! MSI-X delivery to a vfio-user client: the eventfds of DEVICE_SET_IRQS.
//!
//! The client (the VMM) emulates the MSI-X table and PBA the guest
//! programs, as it does for a VFIO device; the server signals vector `v`'s
//! eventfd. Masking through SET_IRQS (ACTION_MASK/UNMASK) follows the
//! ABI's rule: a vector raised while masked, or before it has an eventfd,
//! sets its pending bit and is sent when unmasked or given one.
//!
//! Only eventfds are accepted, and the server's copy is made non-blocking;
//! since the client can undo that (the flag is on the file description
//! both share) and fill the counter to the brim, the writes happen on a
//! sender thread of the connection's own: a stuck eventfd stalls that
//! vGPU's interrupts, never the arbiter's service thread.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use abi::vgpu::NUM_VECTORS;
use mdev::vgpu::InterruptSink;

/// Counters of one vGPU's interrupt delivery.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrqStats {
    /// Eventfd writes.
    pub fired: u64,
    /// Raises that set a pending bit (masked, or no eventfd yet).
    pub held: u64,
    /// Eventfd writes that failed (e.g. the counter is full).
    pub failed: u64,
}

#[derive(Default)]
struct State {
    fds: Vec<Option<Arc<File>>>,
    masked: u64,
    pending: u64,
    /// Vectors to signal, taken by the sender thread.
    outbox: u64,
    /// The connection is over: the sender thread ends.
    closed: bool,
    sender: bool,
    stats: IrqStats,
}

struct Shared {
    st: Mutex<State>,
    cv: Condvar,
}

/// The MSI-X vectors of one client connection.
///
/// Eventfd writes happen on a sender thread of the connection's own, never
/// on the caller's (the arbiter's service thread): the server's
/// `O_NONBLOCK` is on the open file description it shares with the
/// client, which can clear it again and fill the counter so that a write
/// blocks. Then only this connection's interrupts wait.
pub struct Irqs {
    sh: Arc<Shared>,
}

/// Why a SET_IRQS eventfd was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IrqError {
    /// The fd is not an eventfd.
    #[error("fd for vector {0} is not an eventfd")]
    NotEventFd(usize),
    /// fcntl failed.
    #[error("fd for vector {0}: cannot make it non-blocking")]
    Fcntl(usize),
    /// The sender thread could not be started.
    #[error("cannot start the interrupt sender thread")]
    Thread,
}

fn is_eventfd(f: &File) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .is_ok_and(|p| p.as_os_str() == "anon_inode:[eventfd]")
}

fn set_nonblocking(f: &File) -> bool {
    // SAFETY: fcntl on an fd we own; no pointers.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        fl >= 0 && libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
    }
}

/// `events` of `f` ready right now.
fn ready(f: &File, events: i16) -> bool {
    let mut p = libc::pollfd {
        fd: f.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    unsafe { libc::poll(&mut p, 1, 0) > 0 && p.revents & events != 0 }
}

impl Default for Irqs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Irqs {
    fn drop(&mut self) {
        self.clear();
        self.sh.lock().closed = true;
        self.sh.cv.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sender thread: signals the vectors of the outbox, outside the lock.
    fn sender(self: Arc<Self>) {
        let mut st = self.lock();
        loop {
            while st.outbox == 0 && !st.closed {
                st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.closed {
                return;
            }
            let out = std::mem::take(&mut st.outbox);
            let fds: Vec<Option<Arc<File>>> = (0..NUM_VECTORS)
                .filter(|v| out & (1u64 << v) != 0)
                .map(|v| st.fds[v].clone())
                .collect();
            drop(st);
            let (mut fired, mut failed) = (0, 0);
            for f in fds {
                match f.map(|f| (&*f).write_all(&1u64.to_ne_bytes())) {
                    Some(Ok(())) => fired += 1,
                    _ => failed += 1,
                }
            }
            st = self.lock();
            st.stats.fired += fired;
            st.stats.failed += failed;
        }
    }
}

impl Irqs {
    /// `NUM_VECTORS` vectors, unmasked, none with an eventfd.
    pub fn new() -> Self {
        Irqs {
            sh: Arc::new(Shared {
                st: Mutex::new(State {
                    fds: (0..NUM_VECTORS).map(|_| None).collect(),
                    ..Default::default()
                }),
                cv: Condvar::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.sh.lock()
    }

    /// Counters.
    pub fn stats(&self) -> IrqStats {
        self.lock().stats
    }

    /// Pending bits (bit `v`: vector `v`).
    pub fn pending(&self) -> u64 {
        self.lock().pending
    }

    /// Gives vectors `start..start + fds.len()` these eventfds (the caller
    /// checked the range); sends those pending and unmasked.
    pub fn set_eventfds(&self, start: usize, fds: Vec<File>) -> Result<(), IrqError> {
        for (i, f) in fds.iter().enumerate() {
            if !is_eventfd(f) {
                return Err(IrqError::NotEventFd(start + i));
            }
            if !set_nonblocking(f) {
                return Err(IrqError::Fcntl(start + i));
            }
        }
        let mut st = self.lock();
        if !st.sender {
            let sh = self.sh.clone();
            std::thread::Builder::new()
                .name("vfio-irq".into())
                .spawn(move || sh.sender())
                .map_err(|_| IrqError::Thread)?;
            st.sender = true;
        }
        for (i, f) in fds.into_iter().enumerate() {
            st.fds[start + i] = Some(Arc::new(f));
        }
        self.flush(&mut st);
        Ok(())
    }

    /// Takes every eventfd away (SET_IRQS trigger with no data and count 0,
    /// or the end of the connection). A counter the client filled is
    /// drained, so that a sender blocked on it goes on.
    pub fn clear(&self) {
        self.unset(0, usize::MAX);
    }

    /// Takes the eventfds of `count` vectors from `start` away (SET_IRQS
    /// trigger with eventfd data and no fds: QEMU's vfio-user client sends
    /// a run of `-1` fds this way, e.g. to enable MSI-X before any vector
    /// is in use). Drains as [`Irqs::clear`] does.
    pub fn unset(&self, start: usize, count: usize) {
        let taken: Vec<Arc<File>> = {
            let mut st = self.lock();
            st.fds
                .iter_mut()
                .skip(start)
                .take(count)
                .filter_map(Option::take)
                .collect()
        };
        for f in taken {
            if !ready(&f, libc::POLLOUT) && ready(&f, libc::POLLIN) {
                let mut b = [0u8; 8];
                let _ = (&*f).read(&mut b);
            }
        }
    }

    /// Masks (`mask`) or unmasks the vectors of `bits`; unmasking sends the
    /// pending ones.
    pub fn set_masked(&self, bits: u64, mask: bool) {
        let mut st = self.lock();
        if mask {
            st.masked |= bits;
        } else {
            st.masked &= !bits;
            self.flush(&mut st);
        }
    }

    fn flush(&self, st: &mut State) {
        for v in 0..NUM_VECTORS {
            let bit = 1u64 << v;
            if st.pending & bit != 0 && st.masked & bit == 0 && st.fds[v].is_some() {
                st.pending &= !bit;
                self.send(st, v);
            }
        }
    }

    fn send(&self, st: &mut State, v: usize) {
        st.outbox |= 1u64 << v;
        self.sh.cv.notify_all();
    }
}

impl InterruptSink for Irqs {
    fn raise(&self, vector: u16) {
        let v = usize::from(vector);
        if v >= NUM_VECTORS {
            return;
        }
        let mut st = self.lock();
        if st.masked & (1 << v) != 0 || st.fds[v].is_none() {
            st.pending |= 1 << v;
            st.stats.held += 1;
        } else {
            self.send(&mut st, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    /// The next eventfd value (the sender thread delivers asynchronously).
    fn next(e: &EventFd) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Ok(v) = e.read() {
                return v;
            }
            assert!(std::time::Instant::now() < deadline, "no interrupt");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn wait_for(mut done: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "no progress");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn a_client_filled_blocking_eventfd_never_blocks_the_raiser() {
        let irq = Irqs::new();
        let (e, f) = efd();
        irq.set_eventfds(0, vec![f]).unwrap();
        // The client makes the shared description blocking again and fills
        // the counter: a write of 1 would now block.
        // SAFETY: fcntl on an fd the test owns; no pointers.
        unsafe {
            let fl = libc::fcntl(e.as_raw_fd(), libc::F_GETFL);
            assert_eq!(
                libc::fcntl(e.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK),
                0
            );
        }
        e.write(u64::MAX - 1).unwrap();
        // The raiser (the arbiter's thread) returns; a hang here is the bug.
        for _ in 0..3 {
            irq.raise(0);
        }
        irq.raise(1);
        assert_eq!(irq.pending(), 1 << 1);
        // Taking the eventfds away drains the full counter: the sender goes on.
        irq.clear();
        wait_for(|| {
            let s = irq.stats();
            s.fired + s.failed >= 1
        });
        drop(irq);
    }

    fn efd() -> (EventFd, File) {
        let e = EventFd::new(EFD_NONBLOCK).unwrap();
        // SAFETY: dup returns a fresh descriptor we own.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(libc::dup(e.as_raw_fd())) };
        (e, f)
    }

    #[test]
    fn masked_or_unwired_vectors_pend_and_fire_once_when_allowed() {
        let irq = Irqs::new();
        irq.raise(3);
        assert_eq!(irq.pending(), 1 << 3, "no eventfd yet: pending");
        let (e3, f3) = efd();
        irq.set_eventfds(3, vec![f3]).unwrap();
        assert_eq!(next(&e3), 1, "sent when wired");
        assert_eq!(irq.pending(), 0);
        irq.set_masked(1 << 3, true);
        irq.raise(3);
        irq.raise(3);
        assert!(e3.read().is_err(), "masked: nothing sent");
        assert_eq!(irq.pending(), 1 << 3);
        irq.set_masked(1 << 3, false);
        assert_eq!(next(&e3), 1, "one message for the pending bit");
        irq.raise(9);
        irq.raise(u16::MAX);
        wait_for(|| irq.stats().fired == 2);
        assert_eq!(
            irq.stats(),
            IrqStats {
                fired: 2,
                held: 3,
                failed: 0
            }
        );
        irq.clear();
        irq.raise(3);
        assert!(e3.read().is_err(), "cleared: nothing sent");
    }

    #[test]
    fn only_eventfds_are_accepted() {
        let irq = Irqs::new();
        let (r, _w) = std::io::pipe().unwrap();
        let f = File::from(std::os::fd::OwnedFd::from(r));
        assert_eq!(irq.set_eventfds(0, vec![f]), Err(IrqError::NotEventFd(0)));
    }

    #[test]
    fn unset_takes_only_the_named_vectors_away() {
        let irq = Irqs::new();
        let (e0, f0) = efd();
        let (e1, f1) = efd();
        let (e2, f2) = efd();
        irq.set_eventfds(0, vec![f0, f1, f2]).unwrap();
        irq.unset(1, 1);
        irq.raise(1);
        assert_eq!(irq.pending(), 1 << 1, "no eventfd: pending, not sent");
        assert!(e1.read().is_err());
        irq.raise(0);
        irq.raise(2);
        assert_eq!(next(&e0), 1);
        assert_eq!(next(&e2), 1);
        // Counts past the last vector are clipped, not a panic.
        irq.unset(2, usize::MAX);
        irq.raise(2);
        assert!(e2.read().is_err(), "taken away: nothing sent");
        irq.raise(0);
        assert_eq!(next(&e0), 1, "vector 0 kept its eventfd");
    }
}
