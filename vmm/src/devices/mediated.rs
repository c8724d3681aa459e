//! Temporary glue from the vGPU PCI function to today's `Mediator`: BAR0
//! registers go to `Mediator::reg_read/reg_write`, and one host thread per
//! VM waits in epoll on the VM's doorbell eventfds (the KVM ioeventfds of
//! BAR2) and calls `Mediator::doorbell`. Replaced by the mdev front end
//! (`mdev::vgpu::VgpuFrontEnd`) and the arbiter's service thread.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use mdev::mediator::{Mediator, VgpuHandle};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use abi::pci::DOORBELL_STRIDE;
use abi::vgpu::NUM_VHQD;

use super::vgpu::VgpuBackend;

/// What a [`DoorbellObserver`] is told after each doorbell the reader handled.
#[derive(Clone, Copy, Debug)]
pub struct DoorbellSeen {
    /// vHQD index.
    pub vhqd: usize,
    /// When the reader had read the doorbell's eventfd (before the mediator call).
    pub woke: std::time::Instant,
    /// When `Mediator::doorbell` returned (the scheduler has decided and
    /// every map/unmap it issued has been handed to the GPU backend).
    pub at: std::time::Instant,
    /// The scheduler issued at least one preemption during this doorbell.
    pub preempted: bool,
}

/// Benchmark hook on the doorbell reader (none in production).
pub type DoorbellObserver = Arc<dyn Fn(DoorbellSeen) + Send + Sync>;

/// One VM's vGPU on the mediator, with its doorbell reader thread.
pub struct MediatedVgpu {
    mediator: Arc<Mediator>,
    vm: VgpuHandle,
    doorbells: Vec<EventFd>,
    stop: EventFd,
    reader: Mutex<Option<JoinHandle<()>>>,
}

const STOP_TOKEN: u64 = u64::MAX;

impl MediatedVgpu {
    /// Eventfds for every vHQD doorbell and the thread that reads them.
    pub fn start(
        mediator: Arc<Mediator>,
        vm: VgpuHandle,
        name: &str,
        observer: Option<DoorbellObserver>,
    ) -> std::io::Result<Arc<Self>> {
        let doorbells = (0..NUM_VHQD)
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<std::io::Result<Vec<_>>>()?;
        let stop = EventFd::new(EFD_NONBLOCK)?;
        let epoll = Epoll::new()?;
        let mut fds = Vec::with_capacity(NUM_VHQD);
        for (i, fd) in doorbells.iter().enumerate() {
            let fd = fd.try_clone()?;
            epoll.ctl(
                ControlOperation::Add,
                fd.as_raw_fd(),
                EpollEvent::new(EventSet::IN, i as u64),
            )?;
            fds.push(fd);
        }
        let stop_fd = stop.try_clone()?;
        epoll.ctl(
            ControlOperation::Add,
            stop_fd.as_raw_fd(),
            EpollEvent::new(EventSet::IN, STOP_TOKEN),
        )?;
        let m = mediator.clone();
        let t = std::thread::Builder::new()
            .name(format!("{name}-doorbells"))
            .spawn(move || {
                let _stop = stop_fd;
                let mut events = vec![EpollEvent::default(); NUM_VHQD + 1];
                loop {
                    let n = match epoll.wait(-1, &mut events) {
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            log::error!("doorbell reader: epoll: {e}");
                            return;
                        }
                    };
                    for ev in &events[..n] {
                        let i = ev.data();
                        if i == STOP_TOKEN {
                            return;
                        }
                        if let Some(fd) = fds.get(i as usize) {
                            // Several writes since the last read count as one
                            // doorbell: the write index is read from memory.
                            let _ = fd.read();
                            match &observer {
                                None => m.doorbell(vm, DOORBELL_STRIDE * i),
                                Some(f) => {
                                    let woke = std::time::Instant::now();
                                    let before = m.stats().preemptions;
                                    m.doorbell(vm, DOORBELL_STRIDE * i);
                                    let at = std::time::Instant::now();
                                    f(DoorbellSeen {
                                        vhqd: i as usize,
                                        woke,
                                        at,
                                        preempted: m.stats().preemptions > before,
                                    });
                                }
                            }
                        }
                    }
                }
            })?;
        Ok(Arc::new(MediatedVgpu {
            mediator,
            vm,
            doorbells,
            stop,
            reader: Mutex::new(Some(t)),
        }))
    }

    /// The mediator's handle of this VM.
    pub fn handle(&self) -> VgpuHandle {
        self.vm
    }

    /// Stops the doorbell reader thread (idempotent).
    pub fn stop(&self) {
        let _ = self.stop.write(1);
        if let Some(t) = self
            .reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = t.join();
        }
    }
}

impl Drop for MediatedVgpu {
    fn drop(&mut self) {
        self.stop();
    }
}

impl VgpuBackend for MediatedVgpu {
    fn reg_read(&self, offset: u64) -> u32 {
        self.mediator.reg_read(self.vm, offset)
    }
    fn reg_write(&self, offset: u64, value: u32) {
        self.mediator.reg_write(self.vm, offset, value)
    }
    fn doorbell_eventfd(&self, vhqd: usize) -> &EventFd {
        &self.doorbells[vhqd.min(NUM_VHQD - 1)]
    }
}
