//! Hostile-guest and fault-injection cases of the issue-10 review: the
//! service thread and the front ends under odd orders and host bugs.

use super::*;
use crate::backend::SlotId;
use crate::backend::{MapRequest, SlotStatus};
use std::sync::atomic::{AtomicBool, Ordering};

/// A backend that panics once in `advance` when armed (a host bug in the
/// GPU model while serving the fleet), otherwise the simulator.
struct PanicOnce {
    inner: Box<dyn PhysGpu + Send>,
    armed: Arc<AtomicBool>,
}

impl PhysGpu for PanicOnce {
    fn topology(&self) -> &GpuTopology {
        self.inner.topology()
    }
    fn map(&mut self, now: Nanos, req: MapRequest) -> Result<(), crate::backend::GpuError> {
        self.inner.map(now, req)
    }
    fn unmap(
        &mut self,
        now: Nanos,
        slot: SlotId,
        mode: crate::backend::DequeueMode,
    ) -> Result<(), crate::backend::GpuError> {
        self.inner.unmap(now, slot, mode)
    }
    fn doorbell(&mut self, now: Nanos, slot: SlotId, wptr: u64) {
        self.inner.doorbell(now, slot, wptr)
    }
    fn query(&self, slot: SlotId) -> Option<SlotStatus> {
        self.inner.query(slot)
    }
    fn advance(&mut self, now: Nanos, out: &mut Vec<GpuEvent>) {
        if self.armed.swap(false, Ordering::SeqCst) {
            panic!("injected backend bug");
        }
        self.inner.advance(now, out)
    }
    fn next_deadline(&self) -> Option<Nanos> {
        self.inner.next_deadline()
    }
}

#[test]
fn a_panic_in_the_gpu_path_of_the_service_loop_does_not_stop_the_arbiter() {
    let topo = GpuTopology::tiny();
    let armed = Arc::new(AtomicBool::new(false));
    let gpu = Box::new(PanicOnce {
        inner: crate::probe::sim_backend(&topo, 1),
        armed: armed.clone(),
    });
    let a = GpuArbiter::start(topo, SchedConfig::default(), gpu).unwrap();
    let mut g = guest(&a, "g", 5, false);
    let addr = mqd_addr(&g.q);
    g.load(0, addr);
    armed.store(true, Ordering::SeqCst);
    let s = g.kernel(2, 1000, 0);
    g.ring(0);
    // The next service-loop turn panicked in the backend; the doorbell
    // below must still be served (the service thread is alive).
    let deadline = Instant::now() + Duration::from_secs(20);
    while armed.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "backend never advanced");
        std::thread::sleep(Duration::from_millis(2));
    }
    let s2 = g.kernel(2, 1000, 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while g.signal(s2) > 0 {
        assert!(Instant::now() < deadline, "service thread died");
        g.ring(0);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(g.signal(s) <= 0);
    g.tvm.verify(&g.q).unwrap();
    a.remove_vm(g.h);
    a.shutdown();
}

/// Records the order of requests; holds a `Load` back (up to 300 ms) until
/// another vCPU has written `CP_HQD_DEQUEUE_REQUEST`, as a slow vCPU would.
#[derive(Default)]
struct SlowLoadSink {
    order: Mutex<Vec<&'static str>>,
    dequeue_written: AtomicBool,
}

impl RequestSink for SlowLoadSink {
    fn send(&self, _vm: VmId, req: VgpuRequest) {
        let kind = match req {
            VgpuRequest::Load { .. } => {
                let until = Instant::now() + Duration::from_millis(300);
                while !self.dequeue_written.load(Ordering::SeqCst) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(1));
                }
                "load"
            }
            VgpuRequest::Dequeue { .. } => "dequeue",
            VgpuRequest::Refused { .. } => "refused",
        };
        lock(&self.order).push(kind);
    }
}

#[test]
fn a_dequeue_from_another_vcpu_never_overtakes_the_load_it_dequeues() {
    let mem: Arc<dyn DmaMemory> = Arc::new(SparseMemory::new(1 << 32));
    let topo = GpuTopology::tiny();
    let mut tvm = TestVm::with_memory(mem.clone(), 0x10_0000);
    let q = tvm.queue(&topo, 64, 0);
    let addr = mqd_addr(&q);
    mem.write(addr, &q.mqd.to_bytes()).unwrap();
    let sink = Arc::new(SlowLoadSink::default());
    let fe = Arc::new(
        VgpuFrontEnd::new(
            VmId(0),
            "race",
            &topo,
            mem,
            Arc::new(RecordingIrqs::new()),
            sink.clone(),
        )
        .unwrap(),
    );
    fe.reg_write(hr(0, reg::CP_MQD_BASE_ADDR), addr as u32);
    fe.reg_write(hr(0, reg::CP_MQD_BASE_ADDR_HI), (addr >> 32) as u32);
    let other = {
        let (fe, sink) = (fe.clone(), sink.clone());
        std::thread::spawn(move || {
            // vCPU 1: sees the vHQD active, dequeues it.
            while fe.reg_read(hr(0, reg::CP_HQD_ACTIVE)) == 0 {
                std::thread::yield_now();
            }
            fe.reg_write(hr(0, reg::CP_HQD_DEQUEUE_REQUEST), dequeue::DRAIN);
            sink.dequeue_written.store(true, Ordering::SeqCst);
        })
    };
    // vCPU 0: loads.
    fe.reg_write(hr(0, reg::CP_HQD_ACTIVE), 1);
    other.join().unwrap();
    // The arbiter must see the load before the dequeue, or it dequeues
    // nothing, marks the vHQD unloaded and then runs the load nobody tracks.
    assert_eq!(*lock(&sink.order), vec!["load", "dequeue"]);
}

#[test]
fn the_v1_wait_registers_are_gone_and_never_hold_a_vcpu_in_the_host() {
    let a = arbiter();
    let mut g = guest(&a, "v1", 5, false);
    // A signal that never completes (no queue runs it).
    let s = g.tvm.alloc(64, 64);
    g.tvm.mem.write_u64(s + AMD_SIGNAL_VALUE as u64, 1).unwrap();
    let fe = g.fe.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        fe.reg_write(0x020, s as u32); // v1 WAIT_SIGNAL_LO
        fe.reg_write(0x024, (s >> 32) as u32); // v1 WAIT_SIGNAL_HI
        let _ = tx.send(fe.reg_read(0x028)); // v1 WAIT_RESULT
    });
    // Deadline against a vCPU parked in the host (docs: the v2 device has
    // no WAIT registers; they read 0 and writes are ignored).
    let r = rx.recv_timeout(Duration::from_secs(10));
    assert_eq!(r, Ok(0), "vCPU held in the host by a v1 wait");
    assert!(g.fe.log_counts().0 >= 1, "the write is logged as unknown");
    a.remove_vm(g.h);
    a.shutdown();
}

#[test]
fn odd_register_orders_leave_a_vhqd_that_still_runs_each_kernel_exactly_once() {
    let a = arbiter();
    let mut g = guest(&a, "odd", 5, false);
    let addr = mqd_addr(&g.q);
    // A doorbell on a vHQD that is not loaded: ignored.
    g.ring(0);
    g.load(0, addr);
    // Load again while loaded, and dequeue requests that are not 1, 2 or 3.
    g.load(0, addr);
    for v in [0, 4, 0xFFFF_FFFF] {
        g.fe.reg_write(hr(0, reg::CP_HQD_DEQUEUE_REQUEST), v);
    }
    assert_eq!(g.fe.reg_read(hr(0, reg::CP_HQD_ACTIVE)), 1);
    assert_eq!(g.fe.reg_read(hr(0, reg::CP_HQD_ERROR)), 0);
    let first = g.kernel(2, 1000, 0);
    g.ring(0);
    g.wait_until("first", |g| g.signal(first) <= 0);
    // Drain; more packets while unloaded; reload from the written-back MQD.
    g.fe.reg_write(hr(0, reg::CP_HQD_DEQUEUE_REQUEST), dequeue::DRAIN);
    // A second dequeue while one is under way: ignored.
    g.fe.reg_write(hr(0, reg::CP_HQD_DEQUEUE_REQUEST), dequeue::SAVE);
    g.wait_until("drain", |g| g.fe.reg_read(hr(0, reg::CP_HQD_ACTIVE)) == 0);
    let mut last = first;
    for k in 1..4 {
        last = g.kernel(4, 2000, k);
    }
    g.ring(0); // not loaded: nothing runs
    assert!(g.signal(last) > 0);
    g.load(0, addr);
    g.wait_until("rest", |g| g.signal(last) <= 0);
    g.tvm.verify(&g.q).unwrap();
    assert_eq!(a.stats().completions, 4);
    a.remove_vm(g.h);
    a.shutdown();
}

#[test]
fn removing_a_vm_whose_queues_run_leaves_the_gpu_to_the_others() {
    let a = arbiter();
    let mut gone = guest(&a, "gone", 12, false);
    let mut stays = guest(&a, "stays", 2, false);
    let (ga, sa) = (mqd_addr(&gone.q), mqd_addr(&stays.q));
    gone.load(0, ga);
    stays.load(0, sa);
    for k in 0..4 {
        gone.kernel(64, 500_000, k);
    }
    gone.ring(0);
    let s = stays.kernel(8, 10_000, 9);
    stays.ring(0);
    a.remove_vm(gone.h);
    assert!(a.vm_status(gone.h).is_none());
    // Its late register writes and doorbells reach nothing.
    gone.load(1, ga);
    gone.ring(0);
    stays.wait_until("stays", |g| g.signal(s) <= 0);
    stays.tvm.verify(&stays.q).unwrap();
    a.remove_vm(stays.h);
    a.shutdown();
}

#[test]
fn a_queue_without_a_wptr_poll_address_never_reads_guest_address_zero() {
    use abi::mqd::{
        CP_HQD_PQ_WPTR_HI, CP_HQD_PQ_WPTR_LO, CP_HQD_PQ_WPTR_POLL_ADDR_HI,
        CP_HQD_PQ_WPTR_POLL_ADDR_LO,
    };
    let a = arbiter();
    let mut g = guest(&a, "nopoll", 5, false);
    // Whatever the guest keeps at address 0 (here a write index far past
    // the ring) is not a write pointer: the docs say poll address 0 = none.
    g.tvm.mem.write_u64(0, 1000).unwrap();
    let mut last = 0;
    for k in 0..3 {
        last = g.kernel(2, 1000, k);
    }
    // The work is published through the MQD's wptr instead.
    let mut m = g.q.mqd.clone();
    m.set64(CP_HQD_PQ_WPTR_POLL_ADDR_LO, CP_HQD_PQ_WPTR_POLL_ADDR_HI, 0);
    m.set64(CP_HQD_PQ_WPTR_LO, CP_HQD_PQ_WPTR_HI, 3 * 16);
    let addr = mqd_addr(&g.q);
    g.tvm.mem.write(addr, &m.to_bytes()).unwrap();
    g.load(0, addr);
    g.ring(0);
    g.wait_until("kernels", |g| {
        g.signal(last) <= 0 || g.fe.reg_read(hr(0, reg::CP_HQD_ERROR)) != 0
    });
    assert_eq!(g.fe.reg_read(hr(0, reg::CP_HQD_ERROR)), 0);
    g.tvm.verify(&g.q).unwrap();
    a.remove_vm(g.h);
    a.shutdown();
}
