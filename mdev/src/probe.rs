//! Detection probe: how fast the arbiter's service thread issues a
//! preemption after a high-priority doorbell, against the floor of an
//! eventfd wake-up of a host thread, measured in the same run. Used by
//! `mdev/examples/arbiter_wake.rs` and `vmm/examples/doorbell_bench.rs`
//! (docs/benchmarks.md). Host figures only; nothing here asserts timing.
//! Also the interrupt sinks every test, example and fuzz harness uses
//! ([`NoIrqs`], [`RecordingIrqs`]).

use crate::arbiter::{DoorbellSeen, GpuArbiter};
use crate::backend::PhysGpu;
use crate::mem::{DmaMemory, MemError, SparseMemory};
use crate::sim::testkit::{GuestQueue, TestVm};
use crate::topology::GpuTopology;
use crate::vgpu::{InterruptSink, VgpuFrontEnd, VmId, SIGNAL_EVENT_ID, SIGNAL_EVENT_MAILBOX_PTR};
use abi::kernel::KernelKind;
use abi::vgpu::{hqd_state, reg};
use scheduler::{SchedConfig, VmParams};
use std::os::fd::AsRawFd;
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a probe waits for what must happen (a wake-up, a vHQD state,
/// a doorbell seen, a completion) before it panics: a guard against hangs,
/// never a measurement, long enough for a loaded 2-core host.
pub const HANG_GUARD: Duration = Duration::from_secs(60);
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

mod irqs;
pub use irqs::{NoIrqs, RecordingIrqs};

/// The simulated GPU of `topo` for a real-time arbiter (default simulator
/// knobs, the real-time event budget). Panics on an invalid topology (a
/// measurement and test helper).
pub fn sim_backend(topo: &GpuTopology, seed: u64) -> Box<dyn PhysGpu + Send> {
    gpusim::realtime_backend(topo, &gpusim::SimParams::default(), seed).expect("sim backend")
}

/// Value at quantile `q` of `v` (sorts `v`; `v` must not be empty).
pub fn pct(v: &mut [u64], q: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

/// MMIO offset of register `r` of vHQD `i` in the vGPU's register window.
pub fn hqd_reg(i: usize, r: usize) -> u64 {
    (reg::HQD_BASE + reg::HQD_STRIDE * i + r) as u64
}

/// Guest address of the MQD of `q` (from the MQD's own base address field).
pub fn mqd_addr(q: &GuestQueue) -> u64 {
    q.mqd
        .get64(abi::mqd::CP_MQD_BASE_ADDR_LO, abi::mqd::CP_MQD_BASE_ADDR_HI)
}

/// What a guest driver does to have a completion raise an interrupt: makes
/// the signal at guest address `signal` carry the 8-byte `mailbox` that
/// receives `event_id` at completion (the vHQD's vector is raised then).
pub fn interrupt_signal(
    mem: &dyn DmaMemory,
    signal: u64,
    mailbox: u64,
    event_id: u32,
) -> Result<(), MemError> {
    let at = |off: u64| {
        signal.checked_add(off).ok_or(MemError::OutOfRange {
            gpa: signal,
            len: 8,
        })
    };
    mem.write_u64(at(SIGNAL_EVENT_MAILBOX_PTR)?, mailbox)?;
    mem.write(at(SIGNAL_EVENT_ID)?, &event_id.to_le_bytes())
}

/// Pushes a `Mark` kernel of `groups` 64-item workgroups (`cost_ns` each,
/// `seed`, barrier bit set) on `q` whose completion writes `1000 + seed` to
/// `mailbox` and raises the vHQD's vector; returns (the queue's write index
/// after it, its completion signal). Panics if the signal is outside the
/// guest's memory (a test helper).
pub fn interrupt_kernel(
    tvm: &mut TestVm,
    q: &mut GuestQueue,
    groups: u32,
    cost_ns: u64,
    seed: u32,
    mailbox: u64,
) -> (u64, u64) {
    let w = tvm.kernel(q, KernelKind::Mark, groups, 64, cost_ns, seed, true);
    let s = *q.signals.last().expect("the kernel's signal");
    interrupt_signal(&*tvm.mem, s, mailbox, 1000 + seed).expect("signal in guest memory");
    (w, s)
}

/// What a guest driver does to start a queue: points vHQD `i` of `fe` at
/// the MQD at guest address `addr` and activates it.
pub fn load_hqd(fe: &VgpuFrontEnd, i: usize, addr: u64) {
    fe.reg_write(hqd_reg(i, reg::CP_MQD_BASE_ADDR), addr as u32);
    fe.reg_write(hqd_reg(i, reg::CP_MQD_BASE_ADDR_HI), (addr >> 32) as u32);
    fe.reg_write(hqd_reg(i, reg::CP_HQD_ACTIVE), 1);
}

/// A real-time arbiter over the simulated GPU of [`GpuTopology::tiny`]
/// (seed 1) with the default scheduler configuration. Panics if it cannot
/// start (a measurement and test helper).
pub fn tiny_arbiter() -> Arc<GpuArbiter> {
    let topo = GpuTopology::tiny();
    let gpu = sim_backend(&topo, 1);
    GpuArbiter::start(topo, SchedConfig::default(), gpu).unwrap()
}

/// A VM added to an arbiter by [`add_guest`]: its handle and front end, its
/// guest memory (in `tvm`) and one queue whose MQD is in that memory.
pub struct ProbeGuest {
    /// The arbiter's handle of the VM.
    pub handle: VmId,
    /// The VM's vGPU front end.
    pub fe: Arc<VgpuFrontEnd>,
    /// The guest's memory and allocator.
    pub tvm: TestVm,
    /// The guest's queue (not loaded into a vHQD yet: see [`load_hqd`]).
    pub q: GuestQueue,
}

/// Adds VM `name` at `priority` to `a` over fresh sparse guest memory of
/// `mem_bytes`, with one queue of `ring_packets` packets whose MQD is
/// written into that memory; `irq` receives its vectors. Panics if the
/// arbiter refuses the VM (a measurement and test helper, not a service).
pub fn add_guest(
    a: &GpuArbiter,
    name: &str,
    priority: u8,
    mem_bytes: u64,
    ring_packets: u32,
    irq: Arc<dyn InterruptSink>,
) -> ProbeGuest {
    let mem: Arc<dyn DmaMemory> = Arc::new(SparseMemory::new(mem_bytes));
    add_guest_in(a, name, priority, mem, ring_packets, irq)
}

/// [`add_guest`] over the guest memory `mem`.
pub fn add_guest_in(
    a: &GpuArbiter,
    name: &str,
    priority: u8,
    mem: Arc<dyn DmaMemory>,
    ring_packets: u32,
    irq: Arc<dyn InterruptSink>,
) -> ProbeGuest {
    let mut tvm = TestVm::with_memory(mem.clone(), 0x10_0000);
    let q = tvm.queue(a.topology(), ring_packets, 0);
    mem.write(mqd_addr(&q), &q.mqd.to_bytes()).unwrap();
    let (handle, fe) = a
        .add_vm(
            name,
            mem,
            VmParams {
                priority,
                ..Default::default()
            },
            irq,
        )
        .unwrap();
    ProbeGuest { handle, fe, tvm, q }
}

/// Pins the calling thread to CPU `cpu` (`None`: every CPU); threads it
/// creates afterwards inherit the mask. Nothing on a single-CPU host.
/// Probes place waiters (the arbiter's service thread, the floor's
/// waiter) on CPU 1 and the writer on CPU 0, so both wake-ups cross CPUs
/// alike (design.md §6).
pub fn pin_current(cpu: Option<usize>) {
    // The CPUs online, not `available_parallelism` (which reads this
    // thread's mask: once pinned to one CPU it would never move again).
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    if n < 2 {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays below
    // CPU_SETSIZE; sched_setaffinity reads the set we pass.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        match cpu {
            Some(c) => libc::CPU_SET(c.min(n - 1), &mut set),
            None => (0..n.min(libc::CPU_SETSIZE as usize)).for_each(|c| libc::CPU_SET(c, &mut set)),
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// A host thread blocked in `epoll_wait` on an eventfd, woken on demand:
/// the floor detection is compared with. It runs on CPU 1 (see
/// [`pin_current`]).
pub struct Waker {
    fd: Arc<EventFd>,
    rx: std::sync::mpsc::Receiver<Instant>,
}

impl Waker {
    /// Starts the waiting thread on CPU 1.
    pub fn start() -> Waker {
        Self::start_on(Some(1))
    }

    /// Starts the waiting thread on CPU `cpu` ([`pin_current`]; `None`:
    /// wherever the kernel puts it).
    pub fn start_on(cpu: Option<usize>) -> Waker {
        let fd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let (tx, rx) = channel::<Instant>();
        let f2 = fd.clone();
        std::thread::spawn(move || {
            pin_current(cpu);
            let ep = Epoll::new().unwrap();
            ep.ctl(
                ControlOperation::Add,
                f2.as_raw_fd(),
                EpollEvent::new(EventSet::IN, 0),
            )
            .unwrap();
            let mut evs = [EpollEvent::default(); 1];
            loop {
                if ep.wait(-1, &mut evs).is_err() {
                    return;
                }
                let now = Instant::now();
                let _ = f2.read();
                if tx.send(now).is_err() {
                    return;
                }
            }
        });
        Waker { fd, rx }
    }
    /// One wake-up: ns from `write` to the thread running.
    pub fn sample(&self) -> u64 {
        let t0 = Instant::now();
        self.fd.write(1).unwrap();
        // Blocks as the doorbell probe's writer does (on one CPU the woken
        // thread runs once the writer has blocked).
        let t1 = self.rx.recv_timeout(HANG_GUARD).unwrap();
        (t1 - t0).as_nanos() as u64
    }
}

/// `samples` high-priority doorbells, each written to the vHQD's doorbell
/// eventfd (what KVM does for an ioeventfd doorbell) while a low-priority VM
/// holds the only HQD slot: returns the ns from each `write` to the arbiter
/// having handed the CWSR preemption to the backend (the backend's dequeue
/// called). Samples the floor (`waker`) between doorbells into `wake`, so
/// both see the same load. Panics if the arbiter does not react within [`HANG_GUARD`]
/// (a measurement helper, not a service).
pub fn doorbell_to_preempt(samples: usize, waker: &Waker, wake: &mut Vec<u64>) -> Vec<u64> {
    doorbell_spans(samples, waker, wake, 0).issued
}

/// Spans of the preempting doorbells of [`doorbell_spans`], ns from the
/// eventfd `write`.
#[derive(Clone, Debug, Default)]
pub struct DoorbellSpans {
    /// To the backend's dequeue being called (the preemption issued).
    pub issued: Vec<u64>,
    /// To the binding's return from the doorbell (the backend's dequeue
    /// call and the rest of the scheduler's decision done).
    pub returned: Vec<u64>,
    /// Doorbells whose preemption was prepared ahead (armed) and fired.
    pub armed: u64,
    /// Prepared unmaps their decision did not make (never expected).
    pub armed_mismatched: u64,
}

/// [`doorbell_to_preempt`], with the span to the binding's return too; the
/// doorbells and the floor's samples are written from CPU `writer_cpu`
/// (the waiters are on CPU 1: 0 wakes across CPUs, 1 on the same CPU).
pub fn doorbell_spans(
    samples: usize,
    waker: &Waker,
    wake: &mut Vec<u64>,
    writer_cpu: usize,
) -> DoorbellSpans {
    // One HQD slot: every high-priority doorbell must preempt.
    let topo = GpuTopology {
        xccs: 1,
        pipes_per_xcc: 1,
        queues_per_pipe: 1,
        reserved_queues_per_pipe: 0,
        cus_per_xcc: 2,
        ses_per_xcc: 1,
        ..Default::default()
    };
    let cfg = SchedConfig {
        idle_unmap_ns: 50_000,
        ..Default::default()
    };
    // The service thread on CPU 1 (it inherits the mask), beside the
    // floor's waiter; this thread writes the doorbells from `writer_cpu`.
    pin_current(Some(1));
    let a = GpuArbiter::start(topo.clone(), cfg, sim_backend(&topo, 1)).unwrap();
    pin_current(Some(writer_cpu));
    let (seen_tx, seen_rx) = channel::<DoorbellSeen>();
    let seen_tx = Mutex::new(seen_tx);
    a.set_doorbell_observer(Some(Arc::new(move |s: DoorbellSeen| {
        let _ = seen_tx.lock().unwrap().send(s);
    })));
    let vm = |name: &str, prio: u8| {
        let irqs = Arc::new(RecordingIrqs::new());
        // Guest memory as the VMM gives it (an mmap of the VM's RAM).
        let mem: Arc<dyn DmaMemory> = Arc::new(
            vm_memory::GuestMemoryMmap::<()>::from_ranges(&[(
                vm_memory::GuestAddress(0),
                256 << 20,
            )])
            .unwrap(),
        );
        let g = add_guest_in(&a, name, prio, mem, 1024, irqs.clone());
        load_hqd(&g.fe, 0, mqd_addr(&g.q));
        (g.fe, g.tvm, g.q, irqs)
    };
    let (lo, mut lo_vm, mut lo_q, _lo_irqs) = vm("lo", 2);
    let (hi, mut hi_vm, mut hi_q, hi_irqs) = vm("hi", 12);
    // Long low-priority work: keeps the slot busy for the whole run.
    lo_vm.kernel(&mut lo_q, KernelKind::Spin, 1 << 20, 64, 1_000_000, 1, true);
    lo.doorbell_eventfd(0).write(1).unwrap();
    let mailbox = hi_vm.alloc(8, 8);
    let mut out = DoorbellSpans::default();
    let wait_state = |fe: &crate::vgpu::VgpuFrontEnd, st: u32| {
        let end = Instant::now() + HANG_GUARD;
        while fe.reg_read(hqd_reg(0, reg::CP_HQD_STATE)) != st {
            assert!(Instant::now() < end, "state {st} not reached");
            std::thread::sleep(Duration::from_micros(50));
        }
    };
    for k in 0..samples {
        wait_state(&lo, hqd_state::ON_HQD);
        wait_state(&hi, hqd_state::WAITING);
        hi_vm.kernel(&mut hi_q, KernelKind::Mark, 1, 64, 10_000, k as u32, true);
        let s = *hi_q.signals.last().unwrap();
        interrupt_signal(&*hi_vm.mem, s, mailbox, 1).unwrap();
        // Past the scheduler's min_run_ns (500 us) since lo was restored:
        // the preemption is issued at the doorbell, not deferred.
        std::thread::sleep(Duration::from_micros(800));
        // The floor, sampled in the same conditions: right before the
        // doorbell on even samples, right after it on odd ones.
        if k % 2 == 0 {
            wake.push(waker.sample());
        }
        while seen_rx.try_recv().is_ok() {}
        // As in the floor's sample: the clock read right before `write`.
        let bell = hi.doorbell_eventfd(0);
        let t0 = Instant::now();
        bell.write(1).unwrap();
        let seen = loop {
            let s = seen_rx.recv_timeout(HANG_GUARD).unwrap();
            if s.vm == hi.handle() {
                break s;
            }
        };
        if seen.preempted {
            let issued = seen.issued.unwrap_or(seen.at);
            out.issued.push((issued - t0).as_nanos() as u64);
            out.returned.push((seen.at - t0).as_nanos() as u64);
        }
        if k % 2 == 1 {
            wake.push(waker.sample());
        }
        // Completion interrupt of the high-priority packet.
        hi_irqs
            .wait_for(0, k + 1, HANG_GUARD)
            .expect("completion vector of the high-priority packet");
    }
    out.armed = a.stats().armed_preemptions;
    out.armed_mismatched = a.stats().armed_mismatched;
    a.shutdown();
    pin_current(None);
    out
}

/// A `/metrics` exposition as `series -> value` (`series` is the name
/// with its label set), panicking when a series is printed twice:
/// Prometheus rejects such a scrape. For the tests of every crate that
/// renders the arbiter's metrics.
pub fn exposition_series(text: &str) -> std::collections::BTreeMap<String, f64> {
    let mut m = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, v) = line.rsplit_once(' ').expect("sample value");
        let v = match v {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().expect("a number"),
        };
        assert!(
            m.insert(series.to_string(), v).is_none(),
            "duplicate series {series}\n{text}"
        );
    }
    m
}

/// `promtool check metrics` on an exposition, panicking on anything it
/// says; skipped (a line on stderr) where promtool is not installed
/// (Debian's `prometheus` package has it).
pub fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("promtool not installed: skipped (apt-get install prometheus)");
        return;
    };
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(text.as_bytes())
        .expect("promtool reads its input");
    let out = child.wait_with_output().expect("promtool ran");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
