//! The mmapped BAR2 doorbell page: BAR2 offered as a sparse-mmap region so
//! that a VMM maps it into the guest and a doorbell store costs the vCPU no
//! exit and no socket round trip.
//!
//! The page is a sealed 4 KiB memfd shared by the client and the server.
//! A poller thread per connection notices doorbells by work, not by the
//! value stored: on each scan it reads every loaded vHQD's write index
//! where the arbiter reads it (the MQD's `cp_hqd_pq_wptr_poll_addr` in VM
//! memory) and forwards a doorbell when it moved since the poller last saw
//! it. The value the guest stores on the page is not used (as on the
//! ioeventfd and REGION_WRITE paths): a store of an unchanged value and a
//! reloaded queue's first store equal to the old queue's last one are not
//! missed, and a doorbell the poller forwards found new work (it is not a
//! stale doorbell for the misbehaving-VM guard, unless the arbiter already
//! took that work through another path, e.g. when serving the load).
//! Several stores between two scans fold into one doorbell, as several
//! ioeventfd signals fold into one read of the eventfd. A new load starts
//! from its MQD's write index; a store racing the (posted) register write
//! that loads the queue is not lost: the arbiter reads the write index
//! itself when it serves the load. Only a queue whose write index cannot
//! be read gets a doorbell per changed page value, so that the arbiter
//! reports the queue error.
//!
//! The poll is bounded: it runs only while the vGPU has a vHQD loaded
//! (looked at on every scan, one front-end lock), and only after the
//! client was handed the page; a scan reads the [`NUM_VHQD`] page slots
//! and one 8-byte write index in VM memory per loaded vHQD, every
//! `ServerOptions::doorbell_poll`, and otherwise the poller sleeps on an
//! eventfd the connection writes after each register write (a queue load
//! is one), so a vGPU without queues costs no CPU. A hostile client gets at
//! most one doorbell per loaded vHQD per interval, and only when its write
//! index moved; storing on the page buys nothing else.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use abi::pci::BAR2_SIZE;
use abi::vgpu::{DOORBELL_STRIDE, NUM_VHQD};
use mdev::vgpu::{LoadedQueue, VgpuFrontEnd};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// The shared doorbell page (BAR2).
pub struct DoorbellPage {
    file: File,
    ptr: *mut u64,
}

// SAFETY: the mapping is shared memory read and written with volatile
// accesses only; it lives as long as the page.
unsafe impl Send for DoorbellPage {}
// SAFETY: as above.
unsafe impl Sync for DoorbellPage {}

impl DoorbellPage {
    /// A zeroed page: a memfd sealed against shrinking and growing (a
    /// client cannot make the server's mapping fault), mapped shared.
    pub fn new() -> std::io::Result<Self> {
        // SAFETY: a valid C string; the fd returned is ours.
        let fd = unsafe {
            libc::memfd_create(
                c"hqdmux-bar2".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is fresh and owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(BAR2_SIZE)?;
        // SAFETY: fcntl on our own fd.
        let r = unsafe {
            libc::fcntl(
                fd,
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: maps BAR2_SIZE bytes of a file that is that long and
        // sealed so; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BAR2_SIZE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(DoorbellPage {
            file,
            ptr: p.cast(),
        })
    }

    /// The memfd handed to the client.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Doorbell `i` (`i < NUM_VHQD`).
    pub fn read(&self, i: usize) -> u64 {
        assert!(i < NUM_VHQD);
        // SAFETY: `i` is inside the mapped page; volatile (the client
        // writes it concurrently); aligned (the mapping is page-aligned).
        unsafe { std::ptr::read_volatile(self.ptr.add(i)) }
    }

    /// Stores `v` as doorbell `i` (what a guest store does).
    pub fn write(&self, i: usize, v: u64) {
        assert!(i < NUM_VHQD);
        // SAFETY: as in `read`.
        unsafe { std::ptr::write_volatile(self.ptr.add(i), v) }
    }
}

impl Drop for DoorbellPage {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`.
        unsafe {
            libc::munmap(self.ptr.cast(), BAR2_SIZE as usize);
        }
    }
}

/// Counters shared with the server's stats.
#[derive(Default)]
pub struct PollStats {
    /// Doorbells forwarded (a loaded queue's write index moved).
    pub doorbells: AtomicU64,
    /// Scans of the page.
    pub scans: AtomicU64,
}

/// What the poller shares with its connection.
struct Shared {
    page: Arc<DoorbellPage>,
    fe: Mutex<Arc<VgpuFrontEnd>>,
    /// Bumped at a reset: the remembered values start again from 0.
    generation: AtomicU64,
    /// The client has the page (armed from then on).
    handed_out: AtomicBool,
    wake: EventFd,
    stop: EventFd,
    stats: Arc<PollStats>,
}

/// The poller of one connection; stops (and joins) on drop.
pub struct Poller {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    /// Starts the poller of `page` for front end `fe`, scanning every
    /// `interval` while armed.
    pub fn start(
        name: &str,
        page: Arc<DoorbellPage>,
        fe: Arc<VgpuFrontEnd>,
        interval: Duration,
        stats: Arc<PollStats>,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            page,
            fe: Mutex::new(fe),
            generation: AtomicU64::new(0),
            handed_out: AtomicBool::new(false),
            wake: EventFd::new(EFD_NONBLOCK)?,
            stop: EventFd::new(EFD_NONBLOCK)?,
            stats,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("bar2-{name}").chars().take(15).collect())
            .spawn(move || run(&s, interval))?;
        Ok(Poller {
            shared,
            thread: Some(thread),
        })
    }

    /// The client was handed the page: poll while queues are loaded.
    pub fn arm(&self) {
        self.shared.handed_out.store(true, Ordering::Release);
        self.kick();
    }

    /// A register write happened (a queue may have been loaded).
    pub fn kick(&self) {
        let _ = self.shared.wake.write(1);
    }

    /// A reset: the new front end; the page is zeroed and its old values
    /// forgotten (no doorbell is raised for them).
    pub fn reset(&self, fe: Arc<VgpuFrontEnd>) {
        let mut slot = self.shared.fe.lock().unwrap_or_else(|e| e.into_inner());
        *slot = fe;
        for i in 0..NUM_VHQD {
            self.shared.page.write(i, 0);
        }
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        drop(slot);
        self.kick();
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        let _ = self.shared.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until one of `fds` is readable or `timeout` (None: forever)
/// passes; returns which were readable.
fn wait(fds: &[&EventFd], timeout: Option<Duration>) -> [bool; 2] {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `p` holds valid pollfds; `tp` is null or points at `ts`.
    let n = unsafe { libc::ppoll(p.as_mut_ptr(), p.len() as _, tp, std::ptr::null()) };
    let mut out = [false; 2];
    if n > 0 {
        for (o, f) in out.iter_mut().zip(&p) {
            *o = f.revents != 0;
        }
    }
    out
}

/// What the poller remembers of one vHQD.
#[derive(Clone, Copy, Default)]
struct Slot {
    /// The load it saw last (`None`: unloaded at the last scan).
    load: Option<u64>,
    /// The write index it saw last for that load.
    wptr: u64,
    /// The page value it saw last.
    page: u64,
}

/// One scan of the page: returns how many doorbells were forwarded.
///
/// A loaded vHQD gets a doorbell when its write index (read where the
/// arbiter reads it) moved since the poller last saw it, whatever value
/// the guest stored on the page: a store of an unchanged value, or a
/// reloaded queue's first store equal to the old queue's last, is not
/// missed, and a scan that forwards a doorbell found new work. A new load
/// starts from the MQD's write index (the arbiter reads the write index
/// itself when it serves the load). Only a queue whose write index cannot
/// be read gets a doorbell per changed page value (the arbiter then
/// reports the queue error). An unloaded vHQD gets none.
fn scan(
    page: &DoorbellPage,
    fe: &VgpuFrontEnd,
    queues: [Option<LoadedQueue>; NUM_VHQD],
    slots: &mut [Slot; NUM_VHQD],
) -> u64 {
    let mut rung = 0;
    for (i, (slot, q)) in slots.iter_mut().zip(queues).enumerate() {
        let v = page.read(i);
        let ring = match q {
            None => {
                slot.load = None;
                false
            }
            Some(q) => {
                if slot.load != Some(q.load) {
                    *slot = Slot {
                        load: Some(q.load),
                        wptr: q.start_wptr,
                        page: slot.page,
                    };
                }
                match fe.write_index(&q) {
                    Some(w) => std::mem::replace(&mut slot.wptr, w) != w,
                    None => slot.page != v,
                }
            }
        };
        slot.page = v;
        if ring {
            rung += 1;
            fe.doorbell_write(i as u64 * DOORBELL_STRIDE as u64);
        }
    }
    rung
}

fn run(s: &Shared, interval: Duration) {
    // The interval is short: ask the kernel not to stretch it by the
    // default 50 us timer slack.
    // SAFETY: prctl on the calling thread with an integer argument.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64) };
    let mut slots = [Slot::default(); NUM_VHQD];
    let mut generation = s.generation.load(Ordering::Acquire);
    loop {
        // A scan holds the front-end slot: a reset (which swaps it, zeroes
        // the page and bumps the generation under it) never interleaves.
        let fe = s.fe.lock().unwrap_or_else(|e| e.into_inner());
        let g = s.generation.load(Ordering::Acquire);
        if g != generation {
            generation = g;
            slots = [Slot::default(); NUM_VHQD];
        }
        let queues = fe.loaded_queues();
        if !s.handed_out.load(Ordering::Acquire) || queues.iter().all(Option::is_none) {
            drop(fe);
            // Idle: sleep until a register write (or the stop).
            let [_, stop] = wait(&[&s.wake, &s.stop], None);
            let _ = s.wake.read();
            if stop {
                return;
            }
            continue;
        }
        s.stats.scans.fetch_add(1, Ordering::Relaxed);
        let rung = scan(&s.page, &fe, queues, &mut slots);
        s.stats.doorbells.fetch_add(rung, Ordering::Relaxed);
        drop(fe);
        let [stop, _] = wait(&[&s.stop, &s.wake], Some(interval));
        if stop {
            return;
        }
        let _ = s.wake.read();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi::kernel::KernelKind;
    use abi::vgpu::reg;
    use gpu::mem::{DmaMemory, SparseMemory};
    use gpu::topology::GpuTopology;
    use gpusim::sim::testkit::TestVm;
    use mdev::probe::{hqd_reg, mqd_addr, NoIrqs};
    use mdev::vgpu::{RequestSink, VgpuRequest, VmId};

    struct Nobody;
    impl RequestSink for Nobody {
        fn send(&self, _: VmId, _: VgpuRequest) {}
    }

    /// Doorbells signalled on vHQD `i`'s eventfd since the last look.
    fn rung(fe: &VgpuFrontEnd, i: usize) -> u64 {
        fe.doorbell_eventfd(i).read().unwrap_or(0)
    }

    /// Scans decide by the write index, never by the page value: same
    /// value twice with work between, page changes without work, a reload
    /// whose first store repeats the old queue's last, an unloaded slot.
    #[test]
    fn a_scan_forwards_a_doorbell_exactly_when_the_write_index_moved() {
        let topo = GpuTopology::tiny();
        let mem: Arc<dyn DmaMemory> = Arc::new(SparseMemory::new(1 << 32));
        let fe = VgpuFrontEnd::new(
            VmId(1),
            "scan",
            &topo,
            mem.clone(),
            Arc::new(NoIrqs),
            Arc::new(Nobody),
        )
        .unwrap();
        let mut vm = TestVm::with_memory(mem.clone(), 0x10_0000);
        let mut q = vm.queue(&topo, 64, 0);
        let at = mqd_addr(&q);
        mem.write(at, &q.mqd.to_bytes()).unwrap();
        let page = DoorbellPage::new().unwrap();
        let mut slots = [Slot::default(); NUM_VHQD];
        let scan_now = |slots: &mut [Slot; NUM_VHQD]| scan(&page, &fe, fe.loaded_queues(), slots);

        // Unloaded: a store raises nothing.
        page.write(0, 5);
        assert_eq!(scan_now(&mut slots), 0);
        fe.reg_write(hqd_reg(0, reg::CP_MQD_BASE_ADDR), at as u32);
        fe.reg_write(hqd_reg(0, reg::CP_MQD_BASE_ADDR_HI), (at >> 32) as u32);
        fe.reg_write(hqd_reg(0, reg::CP_HQD_ACTIVE), 1);
        assert_eq!(fe.reg_read(hqd_reg(0, reg::CP_HQD_ERROR)), 0);
        // Loaded, nothing written: no doorbell, whatever is on the page.
        page.write(0, 6);
        assert_eq!(scan_now(&mut slots), 0);
        // A kernel and a store of 1; then another kernel, 1 again.
        vm.kernel(&mut q, KernelKind::Mark, 4, 64, 1_000, 1, false);
        page.write(0, 1);
        assert_eq!(scan_now(&mut slots), 1);
        assert_eq!(rung(&fe, 0), 1);
        assert_eq!(scan_now(&mut slots), 0, "one doorbell per move");
        vm.kernel(&mut q, KernelKind::Mark, 4, 64, 1_000, 2, false);
        page.write(0, 1);
        assert_eq!(scan_now(&mut slots), 1);
        // Work written before the store: the scan sees it already.
        let w = vm.kernel(&mut q, KernelKind::Mark, 4, 64, 1_000, 3, false);
        assert_eq!(scan_now(&mut slots), 1);
        page.write(0, w);
        assert_eq!(scan_now(&mut slots), 0, "its store brings nothing new");
        assert_eq!(rung(&fe, 0), 2);
        // A second queue loaded on vHQD 1 from an MQD whose write index is
        // ahead of zero (a written-back one): it starts there; only work
        // after it rings, whatever value is stored.
        let mut q2 = vm.queue(&topo, 64, 0);
        let w2 = vm.kernel(&mut q2, KernelKind::Mark, 4, 64, 1_000, 5, false);
        q2.mqd.set_write_index(w2);
        let at2 = mqd_addr(&q2);
        mem.write(at2, &q2.mqd.to_bytes()).unwrap();
        fe.reg_write(hqd_reg(1, reg::CP_MQD_BASE_ADDR), at2 as u32);
        fe.reg_write(hqd_reg(1, reg::CP_MQD_BASE_ADDR_HI), (at2 >> 32) as u32);
        fe.reg_write(hqd_reg(1, reg::CP_HQD_ACTIVE), 1);
        assert_eq!(fe.reg_read(hqd_reg(1, reg::CP_HQD_ERROR)), 0);
        page.write(1, w);
        assert_eq!(scan_now(&mut slots), 0, "a fresh load starts at its MQD");
        vm.kernel(&mut q2, KernelKind::Mark, 4, 64, 1_000, 6, false);
        page.write(1, w);
        assert_eq!(scan_now(&mut slots), 1);
        assert_eq!(rung(&fe, 1), 1);
        assert_eq!(rung(&fe, 0), 0);
        // Other vHQDs never rang.
        assert!((2..NUM_VHQD).all(|i| rung(&fe, i) == 0));
    }
}
