//! The vfio-user doorbell against hqdmux's ioeventfd doorbell and a bare
//! Unix-socket round trip, measured in one run (docs/benchmarks.md,
//! "Doorbells over vfio-user"):
//!
//! 1. Host round trips (a host thread, no guest): a bare Unix-socket round
//!    trip of the shape of a vfio-user REGION_WRITE (32 bytes out, 32 back,
//!    to an echo thread), and a real BAR2 REGION_WRITE to an `hqdmux serve`
//!    vGPU server (`vfio_server::VgpuServer` on this process's arbiter).
//! 2. Guest write cost, as a VMM that traps BAR2 (Cloud Hypervisor's
//!    vfio-user client) pays it: the `doorbell` guest alternates rounds of
//!    `n` 64-bit stores to a trapped address and to its own vGPU doorbell
//!    (KVM ioeventfd). Run A: the trapped address forwards each store to the
//!    server as a BAR2 REGION_WRITE from the vCPU thread (MMIO exit + socket
//!    round trip). Run B: the trapped address does a bare socket round trip
//!    instead. `vfio_doorbell_ratio` = median over A's rounds of (trapped
//!    cost / ioeventfd cost of the same round); `vfio_vs_socket` = A's
//!    trapped p50 / B's trapped p50.
//! 3. Detection over vfio-user, hqdmux's own VMM as the client: an
//!    inference VM (priority 12, `builtin:doorbell detect=J`) attached over
//!    vfio-user (ioeventfd -> relay thread -> REGION_WRITE -> the server's
//!    thread -> the front end's doorbell eventfd -> the arbiter) beside an
//!    in-process training VM (priority 2): guest checkpoint 2 (right before
//!    the doorbell store) -> the arbiter having issued the preemption.
//!    `vfio_detect_p99_ratio` = its p99 / the p99 of an eventfd wake-up of
//!    an idle host thread sampled during it (as doorbell_bench's
//!    `guest_detect_p99_ratio`, which is the in-process figure).
//!
//! 4. The mmapped BAR2 doorbell (host side: a vfio-user client with guest
//!    RAM and one queue, as a VMM that maps BAR2 into its guest): per
//!    kernel, the doorbell is either a REGION_WRITE (socket) or a store to
//!    the mapped page, alternately; store -> the arbiter having served the
//!    doorbell (its observer). `mmap_detect_p50_ratio` = page p50 / socket
//!    p50. Then the poller's CPU cost: the process's CPU time over 1 s with
//!    a queue loaded and idle, with the page (scanned every
//!    `vfio_server::DEFAULT_DOORBELL_POLL`) and without (no poller).
//!
//! `cargo run --release -p hqdmux --example vfio_doorbell_bench [N=2000] [ROUNDS=20] [JOBS=100] [SAMPLES=5000] [KERNELS=400]`
//! Last line: `vfio_doorbell_ratio=R vfio_vs_socket=S vfio_detect_p99_ratio=D mmap_detect_p50_ratio=M poll_cpu_pct=C`.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_ioctls::Kvm;
use mdev::arbiter::{DoorbellObserver, DoorbellSeen, GpuArbiter};
use vfio_server::{ServerOptions, VgpuServer};
use vmm::bus::{BusAction, BusDevice};
use vmm::config::FleetConfig;
use vmm::fleet::{attach_remote_vgpu, attach_vgpu, start_arbiter, VgpuAttachment};
use vmm::vm::{Vm, VmReport};
use vmm_sys_util::eventfd::EventFd;

mod common;

/// The trapped "doorbell" the guest's bare rounds write (MMIO hole).
const TRAP_ADDR: u64 = 0xE000_0000;

fn sock(tag: &str) -> PathBuf {
    common::sock("hqdmux-vfio-bench", tag)
}

/// A vGPU server for `name` on `a`.
fn server(a: &Arc<GpuArbiter>, name: &str, priority: u8) -> Arc<VgpuServer> {
    common::vgpu_server(
        a,
        &sock(name),
        name,
        scheduler::VmParams {
            priority,
            ..Default::default()
        },
        ServerOptions::default(),
    )
}

/// One end of a socket pair whose other end echoes 32-byte messages.
fn echo() -> UnixStream {
    let (a, mut b) = UnixStream::pair().unwrap();
    std::thread::spawn(move || {
        let mut m = [0u8; 32];
        while b.read_exact(&mut m).is_ok() {
            if b.write_all(&m).is_err() {
                return;
            }
        }
    });
    a
}

fn round_trip(s: &mut UnixStream) {
    let mut m = [0u8; 32];
    s.write_all(&m).unwrap();
    s.read_exact(&mut m).unwrap();
}

/// What the trapped address does with each guest store.
enum Trap {
    /// A BAR2 REGION_WRITE (doorbell 0) to a vGPU server.
    Vfio(Mutex<vfio_user::Client>),
    /// A bare socket round trip.
    Socket(Mutex<UnixStream>),
}

impl BusDevice for Trap {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&self, _offset: u64, data: &[u8]) -> BusAction {
        match self {
            Trap::Vfio(c) => c.lock().unwrap().region_write(2, 0, data).unwrap(),
            Trap::Socket(s) => round_trip(&mut s.lock().unwrap()),
        }
        BusAction::Continue
    }
}

fn vm(name: &str, image: &str, prio: u8, gpu: &str, args: &str) -> String {
    format!(
        "[[vm]]\nname = \"{name}\"\nimage = \"builtin:{image}\"\nmemory_mib = 256\ngpu = {gpu}\npriority = {prio}\nargs = \"{args}\"\n"
    )
}

/// Builds the VMs of `toml` (in-process vGPUs on `m`, or over sockets),
/// starts them, waits for VM `wait_for` to end, stops all; the reports and
/// the in-process vGPUs' handles.
fn run(
    m: &Arc<GpuArbiter>,
    toml: &str,
    wait_for: usize,
    trap: Option<Arc<Trap>>,
) -> (Vec<VmReport>, Vec<Option<mdev::vgpu::VmId>>) {
    let cfg = FleetConfig::parse(toml, Path::new("/")).expect("config");
    let kvm = Kvm::new().expect("kvm");
    let cpuid = vmm::vm::supported_cpuid(&kvm).expect("cpuid");
    let mut built: Vec<(Vm, VgpuAttachment)> = Vec::new();
    for (id, vc) in cfg.vm.iter().enumerate() {
        let vm = Vm::create(&kvm, &cpuid, common::bench_vm_spec(id, vc)).expect("vm");
        let gpu = match &vc.gpu_socket {
            Some(p) => attach_remote_vgpu(&vm, vc, p).expect("remote vgpu"),
            None => attach_vgpu(m, &vm, &cfg, vc).expect("vgpu"),
        };
        if let (0, Some(t)) = (id, &trap) {
            vm.mmio_bus().insert(TRAP_ADDR, 8, t.clone()).expect("trap");
        }
        built.push((vm, gpu));
    }
    let handles = built.iter().map(|(_, g)| g.handle()).collect();
    let mut running = Vec::new();
    let mut done = Vec::new();
    for (v, gpu) in built {
        let d = EventFd::new(0).unwrap();
        running.push((v.start(d.try_clone().unwrap()).expect("start"), gpu));
        done.push(d);
    }
    done[wait_for].read().unwrap();
    let mut out = Vec::new();
    for (r, gpu) in running {
        let report = r.stop("bench done");
        if let Some(h) = gpu.handle() {
            m.remove_vm(h);
        }
        gpu.detach();
        out.push(report);
    }
    (out, handles)
}

/// (trapped, ioeventfd) ns per write, per round.
fn write_costs(m: &Arc<GpuArbiter>, trap: Trap, n: u64, rounds: u64) -> (Vec<f64>, Vec<f64>) {
    let toml = vm(
        "bell",
        "doorbell",
        7,
        "true",
        &format!("bare={TRAP_ADDR:#x} n={n} rounds={rounds}"),
    );
    let r = &run(m, &toml, 0, Some(Arc::new(trap))).0[0];
    assert!(r.outcome.is_success(), "{}: {:?}", r.outcome, r.console);
    common::store_ns(r, n)
}

/// Wake-ups (us) of an idle host thread in epoll on an eventfd (not
/// pinned), one every 200 us until `until`.
fn floor(until: Arc<AtomicBool>) -> Vec<f64> {
    let waker = mdev::probe::Waker::start_on(None);
    let mut out = Vec::new();
    while !until.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_micros(200));
        out.push(waker.sample() as f64 / 1e3);
    }
    out
}

/// A vfio-user client with guest RAM (a memfd it DMA-maps) and one queue
/// loaded on vHQD 0, as a VMM and its guest.
struct HostGuest {
    client: vfio_user::Client,
    tvm: gpusim::sim::testkit::TestVm,
    q: gpusim::sim::testkit::GuestQueue,
    bar2: Option<*mut u64>,
}

impl HostGuest {
    fn attach(path: &Path, topo: &gpu::topology::GpuTopology) -> HostGuest {
        use gpu::mem::DmaMemory;
        use std::os::fd::FromRawFd;
        use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};
        const MEM: u64 = 4 << 30; // sparse: only what the queue touches is backed
        let mut client = vfio_user::Client::new(path).expect("client");
        // SAFETY: a valid C string; the fd returned is ours.
        let fd = unsafe { libc::memfd_create(c"bench-ram".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: a fresh fd owned by nobody else.
        let ram = unsafe { std::fs::File::from_raw_fd(fd) };
        ram.set_len(MEM).unwrap();
        client.dma_map(0, 0, MEM, ram.as_raw_fd()).unwrap();
        let gm = GuestMemoryMmap::<()>::from_ranges_with_files([(
            GuestAddress(0),
            MEM as usize,
            Some(FileOffset::new(ram, 0)),
        )])
        .unwrap();
        let mem: Arc<dyn DmaMemory> = Arc::new(gm);
        let mut tvm = gpusim::sim::testkit::TestVm::with_memory(mem.clone(), 0x10_0000);
        let q = tvm.queue(topo, 1024, 0);
        let mqd = mdev::probe::mqd_addr(&q);
        mem.write(mqd, &q.mqd.to_bytes()).unwrap();
        let bar2 = client.region(2).and_then(|r| {
            let fo = r.file_offset.as_ref()?;
            // SAFETY: maps the server's sealed one-page memfd, shared.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fo.file().as_raw_fd(),
                    fo.start() as libc::off_t,
                )
            };
            (p != libc::MAP_FAILED).then_some(p.cast::<u64>())
        });
        let mut g = HostGuest {
            client,
            tvm,
            q,
            bar2,
        };
        let reg = |r: usize| (abi::vgpu::reg::HQD_BASE + r) as u64;
        g.wr(reg(abi::vgpu::reg::CP_MQD_BASE_ADDR), mqd as u32);
        g.wr(reg(abi::vgpu::reg::CP_MQD_BASE_ADDR_HI), (mqd >> 32) as u32);
        g.wr(reg(abi::vgpu::reg::CP_HQD_ACTIVE), 1);
        g
    }

    fn wr(&mut self, off: u64, v: u32) {
        self.client.region_write(0, off, &v.to_le_bytes()).unwrap();
    }

    /// Writes one short kernel; its write index.
    fn kernel(&mut self, seed: u32) -> u64 {
        self.tvm.kernel(
            &mut self.q,
            abi::kernel::KernelKind::Mark,
            1,
            64,
            2_000,
            seed,
            true,
        )
    }

    fn done(&self) -> bool {
        let s = *self.q.signals.last().unwrap();
        (self
            .tvm
            .mem
            .read_u64(s + abi::queue::AMD_SIGNAL_VALUE as u64)
            .unwrap() as i64)
            <= 0
    }
}

/// The process's CPU time (user + system).
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct we own.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
    t(u.ru_utime) + t(u.ru_stime)
}

/// Section 4: (socket detection us, page detection us, poll CPU % of a
/// core, scans per second).
fn mmap_doorbells(m: &Arc<GpuArbiter>, kernels: u64) -> (Vec<f64>, Vec<f64>, f64, f64) {
    let srv = common::vgpu_server(
        m,
        &sock_path("mmap"),
        "mmap",
        Default::default(),
        common::page_options(true),
    );
    let mut g = HostGuest::attach(srv.path(), m.topology());
    let bar2 = g.bar2.expect("BAR2 offered as a page");
    let h = srv.handle().expect("registered");
    let seen: Arc<Mutex<Vec<DoorbellSeen>>> = Arc::default();
    let s2 = seen.clone();
    m.set_doorbell_observer(Some(Arc::new(move |d: DoorbellSeen| {
        if d.vm == h {
            s2.lock().unwrap().push(d)
        }
    })));
    let (mut sock, mut page) = (Vec::new(), Vec::new());
    for k in 0..kernels {
        let w = g.kernel(k as u32);
        seen.lock().unwrap().clear();
        let t0 = Instant::now();
        if k % 2 == 0 {
            g.client.region_write(2, 0, &w.to_le_bytes()).unwrap();
        } else {
            // SAFETY: doorbell 0 of the mapped page.
            unsafe { std::ptr::write_volatile(bar2, w) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let at = loop {
            if let Some(d) = seen.lock().unwrap().iter().find(|d| d.at > t0) {
                break d.at;
            }
            assert!(Instant::now() < deadline, "doorbell {k} not served");
            std::hint::spin_loop();
        };
        let us = (at - t0).as_secs_f64() * 1e6;
        if k % 2 == 0 {
            sock.push(us);
        } else {
            page.push(us);
        }
        while !g.done() {
            assert!(Instant::now() < deadline, "kernel {k} did not complete");
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    g.tvm.verify(&g.q).expect("every kernel exactly once");
    m.set_doorbell_observer(None);
    // The poller's cost: 1 s idle with the queue loaded, against the same
    // second with a vGPU whose BAR2 is not a page.
    let idle = |what: &str| {
        let c0 = cpu_time();
        std::thread::sleep(Duration::from_secs(1));
        let c = (cpu_time() - c0).as_secs_f64();
        println!(
            "  CPU time over 1 s idle, queue loaded, {what}: {:.1} ms",
            c * 1e3
        );
        c
    };
    let scans0 = srv.stats().bar2_scans;
    let with = idle("BAR2 page polled");
    let scans = (srv.stats().bar2_scans - scans0) as f64;
    drop(g);
    srv.stop();
    let plain = common::vgpu_server(
        m,
        &sock_path("nopage"),
        "nopage",
        Default::default(),
        ServerOptions::default(),
    );
    let g = HostGuest::attach(plain.path(), m.topology());
    assert!(g.bar2.is_none());
    let without = idle("no page");
    drop(g);
    plain.stop();
    (sock, page, (with - without).max(0.0) * 100.0, scans)
}

/// [`sock`], for where a local binding shadows it.
fn sock_path(tag: &str) -> PathBuf {
    sock(tag)
}

fn main() {
    common::require_kvm("vfio_doorbell_bench");
    let (n, rounds, jobs, samples) = (
        common::arg(1, 2000),
        common::arg(2, 20),
        common::arg(3, 100),
        common::arg(4, 5000),
    );
    let kernels = common::arg(5, 400);
    let cfg = FleetConfig::parse(&vm("x", "gpu", 0, "true", ""), Path::new("/")).unwrap();
    let m = start_arbiter(&cfg).expect("arbiter");

    // 1. Host round trips.
    let mut s = echo();
    let mut bare: Vec<f64> = (0..samples)
        .map(|_| {
            let t = Instant::now();
            round_trip(&mut s);
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    let host_srv = server(&m, "host", 7);
    let mut c = vfio_user::Client::new(host_srv.path()).expect("client");
    let mut rw: Vec<f64> = (0..samples)
        .map(|_| {
            let t = Instant::now();
            c.region_write(2, 0, &[0u8; 8]).unwrap();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    drop(c);
    println!(
        "host round trip ({samples} samples): bare Unix socket p50 {:.1} us p99 {:.1} us; vfio-user BAR2 REGION_WRITE p50 {:.1} us p99 {:.1} us",
        common::pct(&mut bare, 0.5),
        common::pct(&mut bare, 0.99),
        common::pct(&mut rw, 0.5),
        common::pct(&mut rw, 0.99)
    );

    // 2. Guest write costs.
    let a_srv = server(&m, "trap", 7);
    let client = vfio_user::Client::new(a_srv.path()).expect("client");
    let (mut a_trap, a_bell) = write_costs(&m, Trap::Vfio(Mutex::new(client)), n, rounds);
    let (mut b_trap, b_bell) = write_costs(&m, Trap::Socket(Mutex::new(echo())), n, rounds);
    let mut ra: Vec<f64> = a_trap.iter().zip(&a_bell).map(|(t, b)| t / b).collect();
    let mut rb: Vec<f64> = b_trap.iter().zip(&b_bell).map(|(t, b)| t / b).collect();
    let mut bells: Vec<f64> = a_bell.iter().chain(&b_bell).copied().collect();
    let (at50, bt50, bl50) = (
        common::pct(&mut a_trap, 0.5),
        common::pct(&mut b_trap, 0.5),
        common::pct(&mut bells, 0.5),
    );
    let ratio = common::pct(&mut ra, 0.5);
    println!(
        "guest write, ns per write over {rounds} rounds x {n}: trapped vfio-user doorbell p50 {at50:.0}, trapped bare socket round trip p50 {bt50:.0}, ioeventfd vGPU doorbell p50 {bl50:.0}; per-round ratio to the ioeventfd doorbell: vfio-user p50 {ratio:.1}, bare socket p50 {:.1}",
        common::pct(&mut rb, 0.5)
    );
    let vs_socket = at50 / bt50;

    // 3. Detection over vfio-user (hqdmux's VMM as the client).
    let inf_srv = server(&m, "inference", 12);
    let seen: Arc<Mutex<Vec<DoorbellSeen>>> = Arc::default();
    let s2 = seen.clone();
    let observer: DoorbellObserver = Arc::new(move |d| s2.lock().unwrap().push(d));
    m.set_doorbell_observer(Some(observer));
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let fl = std::thread::spawn(move || floor(st));
    let toml = vm(
        "training",
        "gpu",
        2,
        "true",
        "kernels=64 wgs=1216 cost_us=20000",
    ) + &vm(
        "inference",
        "doorbell",
        12,
        &format!("{{ socket = \"{}\" }}", inf_srv.path().display()),
        &format!("detect={jobs} wgs=304 cost_us=500"),
    );
    let (reports, handles) = run(&m, &toml, 1, None);
    stop.store(true, Ordering::SeqCst);
    let mut fl = fl.join().unwrap();
    let inf = &reports[1];
    assert!(
        inf.outcome.is_success(),
        "{}: {:?}",
        inf.outcome,
        inf.console
    );
    let seen = seen.lock().unwrap();
    // The inference vGPU's handle is the server's: every doorbell the
    // observer saw that is not training's.
    let training = handles[0];
    let submits = common::submits(inf);
    let mut det = common::preempt_us(&submits, &seen, |vm| Some(vm) != training);
    assert!(!det.is_empty(), "no preempting doorbell over vfio-user");
    let (d50, d99) = (common::pct(&mut det, 0.5), common::pct(&mut det, 0.99));
    let (f50, f99) = (common::pct(&mut fl, 0.5), common::pct(&mut fl, 0.99));
    println!(
        "vfio-user high-priority doorbell (guest checkpoint) -> preemption issued: p50 {d50:.1} us, p99 {d99:.1} us ({} of {} jobs preempted); eventfd floor meanwhile p50 {f50:.1} us p99 {f99:.1} us",
        det.len(),
        submits.len()
    );
    host_srv.stop();
    a_srv.stop();
    inf_srv.stop();
    drop(seen);

    // 4. The mmapped BAR2 doorbell.
    let (mut ds, mut dp, poll_cpu, scans) = mmap_doorbells(&m, kernels);
    let (s50, s99, p50, p99) = (
        common::pct(&mut ds, 0.5),
        common::pct(&mut ds, 0.99),
        common::pct(&mut dp, 0.5),
        common::pct(&mut dp, 0.99),
    );
    println!(
        "doorbell -> arbiter served ({} kernels each): REGION_WRITE p50 {s50:.1} us p99 {s99:.1} us; mmapped BAR2 page (poll every {} us) p50 {p50:.1} us p99 {p99:.1} us; poller {scans:.0} scans/s, {poll_cpu:.1}% of a core while a queue is loaded",
        ds.len(),
        vfio_server::DEFAULT_DOORBELL_POLL.as_micros()
    );
    m.shutdown();
    println!(
        "load average at the end: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "vfio_doorbell_ratio={ratio:.1} vfio_vs_socket={vs_socket:.2} vfio_detect_p99_ratio={:.2} mmap_detect_p50_ratio={:.2} poll_cpu_pct={poll_cpu:.1}",
        d99 / f99,
        p50 / s50
    );
}
