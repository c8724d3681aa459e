//! MSI-X delivery to a vfio-user client: the eventfds of DEVICE_SET_IRQS.
//!
//! The client (the VMM) emulates the MSI-X table and PBA the guest
//! programs, as it does for a VFIO device; the server signals vector `v`'s
//! eventfd. Masking through SET_IRQS (ACTION_MASK/UNMASK) follows the
//! ABI's rule: a vector raised while masked, or before it has an eventfd,
//! sets its pending bit and is sent when unmasked or given one.
//!
//! Only eventfds are accepted, and the server's copy is made non-blocking,
//! so that a client cannot stall the arbiter's service thread with a full
//! pipe or an eventfd it filled to the brim.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::{Mutex, MutexGuard};

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
    fds: Vec<Option<File>>,
    masked: u64,
    pending: u64,
    stats: IrqStats,
}

/// The MSI-X vectors of one client connection.
pub struct Irqs {
    st: Mutex<State>,
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

impl Default for Irqs {
    fn default() -> Self {
        Self::new()
    }
}

impl Irqs {
    /// `NUM_VECTORS` vectors, unmasked, none with an eventfd.
    pub fn new() -> Self {
        Irqs {
            st: Mutex::new(State {
                fds: (0..NUM_VECTORS).map(|_| None).collect(),
                ..Default::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
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
        for (i, f) in fds.into_iter().enumerate() {
            st.fds[start + i] = Some(f);
        }
        Self::flush(&mut st);
        Ok(())
    }

    /// Takes every eventfd away (SET_IRQS trigger with no data and count 0,
    /// or the end of the connection).
    pub fn clear(&self) {
        let mut st = self.lock();
        for f in st.fds.iter_mut() {
            *f = None;
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
            Self::flush(&mut st);
        }
    }

    fn flush(st: &mut State) {
        for v in 0..NUM_VECTORS {
            let bit = 1u64 << v;
            if st.pending & bit != 0 && st.masked & bit == 0 && st.fds[v].is_some() {
                st.pending &= !bit;
                Self::send(st, v);
            }
        }
    }

    fn send(st: &mut State, v: usize) {
        let ok = match st.fds[v].as_ref() {
            Some(mut f) => f.write_all(&1u64.to_ne_bytes()).is_ok(),
            None => false,
        };
        if ok {
            st.stats.fired += 1;
        } else {
            st.stats.failed += 1;
        }
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
            Self::send(&mut st, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

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
        assert_eq!(e3.read().unwrap(), 1, "sent when wired");
        assert_eq!(irq.pending(), 0);
        irq.set_masked(1 << 3, true);
        irq.raise(3);
        irq.raise(3);
        assert!(e3.read().is_err(), "masked: nothing sent");
        assert_eq!(irq.pending(), 1 << 3);
        irq.set_masked(1 << 3, false);
        assert_eq!(e3.read().unwrap(), 1, "one message for the pending bit");
        irq.raise(9);
        irq.raise(u16::MAX);
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
}
