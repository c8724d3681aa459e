//! Doorbell path figures, all measured in one run (docs/benchmarks.md):
//!
//! 1. Floor: wake-up of a host thread blocked in epoll on an eventfd that
//!    another host thread writes (p50/p99), sampled alone (every 500 us) and
//!    again every 200 us *while* phase 3 runs (same load: this machine's 2 cores are
//!    shared), which is the floor `detect_p99_ratio` divides by.
//! 2. Guest write cost: the `doorbell` guest writes a bare KVM ioeventfd
//!    (registered by this bench, drained by a host thread in epoll) and its
//!    vGPU doorbell (ioeventfd -> the arbiter's service thread, the write
//!    index re-read and dropped as stale) in alternating rounds, with the
//!    same guest loop; the cost per write is host time between checkpoints
//!    / writes. `doorbell_ratio` = median over rounds of (doorbell cost /
//!    bare cost of the same round): adjacent spans see the same host load.
//! 3. Detection, from the doorbell on: `mdev::probe` (also
//!    `mdev/examples/arbiter_wake.rs`): a high-priority VM's doorbell
//!    eventfd is written (what KVM does when the guest's doorbell store hits
//!    its ioeventfd) while a low-priority VM holds the only HQD slot; time
//!    to the arbiter having handed the CWSR preemption to the backend (the
//!    backend's dequeue called; the span to the binding's return, after
//!    that call and the rest of the scheduler's decision, is printed too).
//!    `detect_p99_ratio` = its p99 / the p99 of an eventfd wake-up of an
//!    idle host thread sampled between the doorbells. The service thread
//!    and that thread both wait on CPU 1; the writer is on CPU 0. Run again
//!    with the writer on CPU 1 too (both wake-ups then wait for the writer
//!    to block), printed as `detect_p99_ratio on one CPU`.
//! 4. Detection with a guest: an inference VM (priority 12, `builtin:doorbell
//!    detect=J`: one 304 x 500 us kernel per job) beside a training VM
//!    (priority 2); each inference job's doorbell preempts training. From
//!    the host timestamp of the guest's checkpoint 2 (its port write is the
//!    instruction right before the doorbell store) to the arbiter's service
//!    thread having handed the preemption to the backend (the doorbell
//!    observer's `issued` stamp), for the doorbells that issued one.
//!    `guest_detect_p99_ratio` = its p99 / the p99 of the floor sampled
//!    during it. The span also holds the checkpoint's PIO exit, the return
//!    into the guest and the emulated store, so it overstates detection.
//! 5. Host CPU (utime+stime of this process) over 3 s while four guests
//!    wait in `sti; hlt` for a long GPU job.
//!
//! `cargo run --release -p hqdmux --example doorbell_bench [N=2000] [ROUNDS=20] [JOBS=200] [PROBES=1000]`
//! (PROBES: doorbells of phase 3; a p99 of 1000 samples is the 10th
//! largest, against the 2nd largest of 200, so one host hiccup moves it
//! less.)
//! Last line: `doorbell_ratio=R detect_p99_ratio=D` (D from 3; 4 is printed
//! on a line before).

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_ioctls::{IoEventAddress, Kvm, NoDatamatch};
use mdev::arbiter::{DoorbellObserver, DoorbellSeen, GpuArbiter};
use vmm::config::FleetConfig;
use vmm::fleet::{attach_vgpu, run_fleet, start_arbiter, RunOptions, VgpuAttachment};
use vmm::vm::{Vm, VmReport};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

mod common;

/// Where the bench registers the bare ioeventfd (MMIO hole, above the BARs
/// the guest assigns from its start).
const BARE_ADDR: u64 = 0xE000_0000;

/// Pins the calling thread (see [`mdev::probe::pin_current`]): writers
/// (vCPU threads, the floors' writers) on CPU 0, waiters (the arbiter's
/// service thread, the bare ioeventfd's drain thread, the floors' waiters)
/// on CPU 1, so the bare and the doorbell paths see the same placement
/// (design.md §6).
fn pin(cpu: Option<usize>) {
    mdev::probe::pin_current(cpu);
}

/// A thread blocked in epoll on `fd`; calls `seen()` after each wake-up
/// (after reading the eventfd) until `stop` is set and `fd` written.
fn epoll_waiter(
    fd: EventFd,
    stop: Arc<AtomicBool>,
    seen: impl Fn() + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let ep = Epoll::new().unwrap();
        ep.ctl(
            ControlOperation::Add,
            fd.as_raw_fd(),
            EpollEvent::new(EventSet::IN, 0),
        )
        .unwrap();
        let mut ev = [EpollEvent::default(); 1];
        loop {
            if ep.wait(-1, &mut ev).unwrap_or(0) == 0 {
                continue;
            }
            let _ = fd.read();
            if stop.load(Ordering::SeqCst) {
                return;
            }
            seen();
        }
    })
}

/// Wake-up latency of a host thread in epoll on an eventfd, in us:
/// `samples` samples `period` apart, or until `until` is set.
fn eventfd_floor(samples: usize, period: Duration, until: Option<Arc<AtomicBool>>) -> Vec<f64> {
    let fd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Arc::new(Mutex::new(Instant::now()));
    let out = Arc::new(Mutex::new(Vec::with_capacity(samples.min(100_000))));
    let (t, o) = (t0.clone(), out.clone());
    pin(Some(1));
    let h = epoll_waiter(fd.try_clone().unwrap(), stop.clone(), move || {
        let d = t.lock().unwrap().elapsed();
        o.lock().unwrap().push(d.as_secs_f64() * 1e6);
    });
    pin(Some(0));
    for _ in 0..samples {
        if until.as_ref().is_some_and(|u| u.load(Ordering::SeqCst)) {
            break;
        }
        // Let the waiter go back to sleep first.
        std::thread::sleep(period);
        *t0.lock().unwrap() = Instant::now();
        fd.write(1).unwrap();
    }
    std::thread::sleep(Duration::from_millis(10));
    stop.store(true, Ordering::SeqCst);
    fd.write(1).unwrap();
    h.join().unwrap();
    pin(None);
    let v = out.lock().unwrap().clone();
    v
}

struct Built {
    vm: Vm,
    gpu: VgpuAttachment,
}

/// Builds the VMs of `toml` on one arbiter.
fn build(toml: &str) -> (Arc<GpuArbiter>, Vec<Built>, FleetConfig) {
    let cfg = FleetConfig::parse(toml, Path::new("/bench/fleet.toml")).expect("config");
    let kvm = Kvm::new().expect("kvm");
    let cpuid = vmm::vm::supported_cpuid(&kvm).expect("cpuid");
    pin(Some(1));
    let m = start_arbiter(&cfg).expect("arbiter");
    pin(None);
    let mut out = Vec::new();
    for (id, vc) in cfg.vm.iter().enumerate() {
        let vm = Vm::create(&kvm, &cpuid, common::bench_vm_spec(id, vc)).expect("vm");
        let gpu = attach_vgpu(&m, &vm, &cfg, vc).expect("vgpu");
        out.push(Built { vm, gpu });
    }
    (m, out, cfg)
}

/// Starts every VM, waits until VM `wait_for` ends, stops all; reports in order.
fn run(m: &Arc<GpuArbiter>, built: Vec<Built>, wait_for: usize) -> Vec<VmReport> {
    let mut running = Vec::new();
    let mut done_fds = Vec::new();
    pin(Some(0));
    for b in built {
        let done = EventFd::new(0).unwrap();
        running.push((b.vm.start(done.try_clone().unwrap()).expect("start"), b.gpu));
        done_fds.push(done);
    }
    pin(None);
    done_fds[wait_for].read().unwrap();
    let mut reports = Vec::new();
    for (r, gpu) in running {
        let h = gpu.handle().expect("an in-process vGPU");
        let report = r.stop("bench done");
        m.remove_vm(h);
        gpu.detach();
        reports.push(report);
    }
    m.shutdown();
    reports
}

fn vm(name: &str, image: &str, prio: u8, args: &str) -> String {
    format!(
        "[[vm]]\nname = \"{name}\"\nimage = \"builtin:{image}\"\nmemory_mib = 256\ngpu = true\npriority = {prio}\nargs = \"{args}\"\n"
    )
}

/// Guest write cost (ns per write) of the bare ioeventfd and the vGPU doorbell, per round.
fn write_costs(n: u64, rounds: u64) -> (Vec<f64>, Vec<f64>) {
    let (m, built, _) = build(&vm(
        "bell",
        "doorbell",
        7,
        &format!("bare={BARE_ADDR:#x} n={n} rounds={rounds}"),
    ));
    let bare = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    built[0]
        .vm
        .vm_fd()
        .register_ioevent(&bare, &IoEventAddress::Mmio(BARE_ADDR), NoDatamatch)
        .expect("bare ioeventfd");
    let stop = Arc::new(AtomicBool::new(false));
    pin(Some(1));
    let drain = epoll_waiter(bare.try_clone().unwrap(), stop.clone(), || {});
    pin(None);
    let reports = run(&m, built, 0);
    stop.store(true, Ordering::SeqCst);
    bare.write(1).unwrap();
    drain.join().unwrap();
    let r = &reports[0];
    assert!(r.outcome.is_success(), "{}: {:?}", r.outcome, r.console);
    common::store_ns(r, n)
}

/// Doorbell -> preemption issued, in us, for jobs whose doorbell preempted;
/// jobs submitted; the eventfd floor sampled meanwhile.
fn detection(jobs: u32) -> (Vec<f64>, usize, Vec<f64>) {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let floor =
        std::thread::spawn(move || eventfd_floor(usize::MAX, Duration::from_micros(200), Some(d)));
    let seen: Arc<Mutex<Vec<DoorbellSeen>>> = Arc::default();
    let s = seen.clone();
    let observer: DoorbellObserver = Arc::new(move |d| s.lock().unwrap().push(d));
    let toml = vm("training", "gpu", 2, "kernels=64 wgs=1216 cost_us=20000")
        + &vm(
            "inference",
            "doorbell",
            12,
            &format!("detect={jobs} wgs=304 cost_us=500"),
        );
    let (m, built, _) = build(&toml);
    m.set_doorbell_observer(Some(observer));
    let inference = built[1].gpu.handle().expect("an in-process vGPU");
    let reports = run(&m, built, 1);
    done.store(true, Ordering::SeqCst);
    let floor = floor.join().unwrap();
    let inf = &reports[1];
    assert!(
        inf.outcome.is_success(),
        "{}: {:?}",
        inf.outcome,
        inf.console
    );
    let seen = seen.lock().unwrap();
    let submits = common::submits(inf);
    let out = common::preempt_us(&submits, &seen, |vm| vm == inference);
    (out, submits.len(), floor)
}

/// Ticks of utime + stime of this process.
fn cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `rest` starts at field 3.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Host CPU (% of one core) while four guests wait for a long GPU job.
fn waiting_cpu() -> f64 {
    let mut toml = "[scheduler]\naging_ns = 60000000000\n".to_string();
    toml += &vm("long", "gpu", 12, "kernels=1 wgs=1216 cost_us=1500000");
    for i in 0..3 {
        toml += &vm(&format!("lo{i}"), "gpu", 2, "kernels=1 wgs=64 cost_us=1000");
    }
    let cfg = FleetConfig::parse(&toml, Path::new("/bench/fleet.toml")).expect("config");
    let fleet = std::thread::spawn(move || run_fleet(&cfg, RunOptions::default()).expect("fleet"));
    // Boot and submission take well under 1.5 s; the job takes ~6 s.
    std::thread::sleep(Duration::from_millis(1500));
    let (c0, t0) = (cpu_ticks(), Instant::now());
    std::thread::sleep(Duration::from_secs(3));
    let (c1, t1) = (cpu_ticks(), Instant::now());
    let report = fleet.join().unwrap();
    assert!(report.all_succeeded(), "{}", report.summary());
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (c1 - c0) as f64 / hz / (t1 - t0).as_secs_f64() * 100.0
}

fn main() {
    common::require_kvm("doorbell_bench");
    let (n, rounds, jobs) = (
        common::arg(1, 2000),
        common::arg(2, 20),
        common::arg(3, 200) as u32,
    );
    let probes = common::arg(4, 1000) as usize;

    let mut floor = eventfd_floor(2000, Duration::from_micros(500), None);
    let (f50, f99) = (common::pct(&mut floor, 0.5), common::pct(&mut floor, 0.99));
    println!(
        "eventfd wake-up of a host thread (epoll), alone: p50 {f50:.1} us, p99 {f99:.1} us ({} samples)",
        floor.len()
    );

    let (mut bare, mut bell) = write_costs(n, rounds);
    let mut ratios: Vec<f64> = bell.iter().zip(&bare).map(|(d, b)| d / b).collect();
    let ratio = common::pct(&mut ratios, 0.5);
    let (b50, d50) = (common::pct(&mut bare, 0.5), common::pct(&mut bell, 0.5));
    println!(
        "guest write, ns per write over {rounds} rounds x {n}: bare ioeventfd p50 {b50:.0}, vGPU doorbell p50 {d50:.0}; per-round ratio p50 {ratio:.2} (min {:.2}, max {:.2})",
        ratios[0],
        ratios[ratios.len() - 1]
    );

    let (mut det, submitted, mut busy_floor) = detection(jobs);
    let (p50, p99) = (common::pct(&mut det, 0.5), common::pct(&mut det, 0.99));
    let (bf50, bf99) = (
        common::pct(&mut busy_floor, 0.5),
        common::pct(&mut busy_floor, 0.99),
    );
    println!(
        "high-priority doorbell -> preemption issued: p50 {p50:.1} us, p99 {p99:.1} us ({} of {submitted} jobs preempted)",
        det.len()
    );
    println!(
        "eventfd wake-up sampled during that run: p50 {bf50:.1} us, p99 {bf99:.1} us ({} samples)",
        busy_floor.len()
    );

    let guest_ratio = p99 / bf99;
    println!("guest_detect_p99_ratio={guest_ratio:.2} (guest checkpoint -> preemption issued / floor during it)");

    let waker = mdev::probe::Waker::start();
    // Across CPUs (the placement of every phase: writer on CPU 0, waiters
    // on CPU 1), then on one CPU (writer beside the waiters) for reference.
    let d = detection_probe(probes, &waker, 0, "across CPUs");
    let same = detection_probe(probes, &waker, 1, "one CPU");
    println!("detect_p99_ratio on one CPU (writer beside the service thread): {same:.2}");

    let cpu = waiting_cpu();
    println!(
        "host CPU while 4 guests wait in sti;hlt for a 6 s GPU job: {cpu:.1}% of one core over 3 s"
    );
    println!(
        "load average at the end: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );

    println!("doorbell_ratio={ratio:.2} detect_p99_ratio={d:.2}");
}

/// Phase 3 with the doorbells and floor samples written from CPU
/// `writer_cpu` (waiters on CPU 1); prints its figures, returns D.
fn detection_probe(
    probes: usize,
    waker: &mdev::probe::Waker,
    writer_cpu: usize,
    label: &str,
) -> f64 {
    use mdev::probe::pct;
    let mut wake = Vec::new();
    let spans = mdev::probe::doorbell_spans(probes, waker, &mut wake, writer_cpu);
    let (mut hdet, mut hret, armed) = (spans.issued, spans.returned, spans.armed);
    let (w50, w99) = (pct(&mut wake, 0.5), pct(&mut wake, 0.99));
    let (h50, h99) = (pct(&mut hdet, 0.5), pct(&mut hdet, 0.99));
    println!(
        "[{label}] doorbell eventfd -> preemption issued: p50 {:.1} us, p99 {:.1} us ({} samples, {armed} prepared ahead); idle-thread eventfd wake-up between them: p50 {:.1} us, p99 {:.1} us",
        h50 as f64 / 1e3,
        h99 as f64 / 1e3,
        hdet.len(),
        w50 as f64 / 1e3,
        w99 as f64 / 1e3
    );
    println!(
        "[{label}] doorbell eventfd -> binding returned (backend's dequeue call and the rest of the decision done): p50 {:.1} us, p99 {:.1} us",
        pct(&mut hret, 0.5) as f64 / 1e3,
        pct(&mut hret, 0.99) as f64 / 1e3
    );
    h99 as f64 / w99.max(1) as f64
}
