//! hqdmux's own VMM as a vfio-user client: the guest's doorbell over the two
//! paths the client has (docs/benchmarks.md, "Doorbells of hqdmux's VMM over
//! vfio-user: relay or mapped page"):
//!
//! * **relay**: the vGPU server offers no doorbell page; a doorbell store is
//!   a KVM ioeventfd (an exit handled in the kernel) and a thread of the VMM
//!   forwards it as a BAR2 REGION_WRITE;
//! * **page**: the server offers the mmapped BAR2 page
//!   (`doorbell_page = true`); the VMM maps it into the guest, a doorbell is
//!   a plain store and the server's poller notices it.
//!
//! For each path, one `builtin:doorbell` guest on an `hqdmux serve`-style
//! server in this process (a `vfio_server::VgpuServer` on this process's
//! arbiter):
//!
//! 1. store cost: rounds of `n` 64-bit stores to a bare KVM ioeventfd (the
//!    reference: one exit each) and to its own vGPU doorbell; ns per store
//!    from the guest's checkpoints;
//! 2. detection: `detect=J` jobs, each doorbell right after checkpoint 2;
//!    guest checkpoint -> the arbiter's doorbell observer saw it.
//!
//! `cargo run --release -p hqdmux --example vfio_client_bench [N=2000] [ROUNDS=10] [JOBS=200]`
//! Last line: `relay_store_ns=A page_store_ns=B relay_detect_p50_us=C page_detect_p50_us=D`.

use std::path::Path;
use std::sync::{Arc, Mutex};

use kvm_ioctls::{IoEventAddress, Kvm, NoDatamatch};
use mdev::arbiter::{DoorbellSeen, GpuArbiter};
use vfio_server::VgpuServer;
use vmm::config::FleetConfig;
use vmm::fleet::{attach_remote_vgpu, start_arbiter};
use vmm::vm::{Vm, VmReport};
use vmm_sys_util::eventfd::EventFd;

mod common;

/// The bare ioeventfd the store rounds write (MMIO hole).
const BARE_ADDR: u64 = 0xE000_0000;

/// A vGPU server named `tag`, with or without the doorbell page.
fn server(m: &Arc<GpuArbiter>, tag: &str, page: bool) -> Arc<VgpuServer> {
    common::vgpu_server(
        m,
        &common::sock("hqdmux-vfio-client-bench", tag),
        tag,
        Default::default(),
        common::page_options(page),
    )
}

/// Runs one `builtin:doorbell` guest with `args` on the vGPU at `socket`
/// (a bare ioeventfd at [`BARE_ADDR`]) until it ends.
fn run(socket: &Path, args: &str, want_page: bool) -> VmReport {
    let toml = format!(
        "[[vm]]\nname = \"bell\"\nimage = \"builtin:doorbell\"\nmemory_mib = 256\ngpu = {{ socket = \"{}\" }}\nargs = \"{args}\"\n",
        socket.display()
    );
    let cfg = FleetConfig::parse(&toml, Path::new("/")).expect("config");
    let vc = &cfg.vm[0];
    let kvm = Kvm::new().expect("kvm");
    let cpuid = vmm::vm::supported_cpuid(&kvm).expect("cpuid");
    let vm = Vm::create(&kvm, &cpuid, common::bench_vm_spec(0, vc)).expect("vm");
    let bare = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    vm.vm_fd()
        .register_ioevent(&bare, &IoEventAddress::Mmio(BARE_ADDR), NoDatamatch)
        .expect("bare ioeventfd");
    let gpu = attach_remote_vgpu(&vm, vc, socket).expect("remote vgpu");
    let has_page = gpu.remote().is_some_and(|r| r.has_doorbell_page());
    assert_eq!(has_page, want_page, "doorbell page offered and mapped");
    let done = EventFd::new(0).unwrap();
    let r = vm.start(done.try_clone().unwrap()).expect("start");
    gpu.bind_vm(&r);
    done.read().unwrap();
    let report = r.stop("bench done");
    gpu.detach();
    assert!(
        report.outcome.is_success(),
        "{}: {:?}",
        report.outcome,
        report.console
    );
    report
}

/// (bare ioeventfd ns, doorbell ns) per store, per round.
fn store_costs(socket: &Path, n: u64, rounds: u64, page: bool) -> (Vec<f64>, Vec<f64>) {
    let r = run(
        socket,
        &format!("bare={BARE_ADDR:#x} n={n} rounds={rounds}"),
        page,
    );
    common::store_ns(&r, n)
}

/// Guest checkpoint 2 -> the arbiter saw the doorbell (us), per job.
fn detection(m: &Arc<GpuArbiter>, srv: &Arc<VgpuServer>, jobs: u64, page: bool) -> Vec<f64> {
    let seen: Arc<Mutex<Vec<DoorbellSeen>>> = Arc::default();
    let s2 = seen.clone();
    m.set_doorbell_observer(Some(Arc::new(move |d: DoorbellSeen| {
        s2.lock().unwrap().push(d)
    })));
    let r = run(
        srv.path(),
        &format!("detect={jobs} wgs=64 cost_us=100"),
        page,
    );
    m.set_doorbell_observer(None);
    let seen = seen.lock().unwrap();
    common::submits(&r)
        .iter()
        .filter_map(|t| {
            let d = seen.iter().find(|d| d.at > *t)?;
            Some((d.at - *t).as_secs_f64() * 1e6)
        })
        .collect()
}

fn main() {
    common::require_kvm("vfio_client_bench");
    let (n, rounds, jobs) = (
        common::arg(1, 2000),
        common::arg(2, 10),
        common::arg(3, 200),
    );
    let cfg = FleetConfig::parse(
        "[[vm]]\nname = \"x\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\n",
        Path::new("/"),
    )
    .unwrap();
    let m = start_arbiter(&cfg).expect("arbiter");
    let mut last = Vec::new();
    for (tag, page) in [("relay", false), ("page", true)] {
        let srv = server(&m, tag, page);
        let (mut bare, mut bell) = store_costs(srv.path(), n, rounds, page);
        let mut det = detection(&m, &srv, jobs, page);
        let (b50, d50, d99) = (
            common::pct(&mut bare, 0.5),
            common::pct(&mut bell, 0.5),
            common::pct(&mut bell, 0.99),
        );
        let (t50, t99) = (common::pct(&mut det, 0.5), common::pct(&mut det, 0.99));
        println!(
            "{tag}: guest store ns ({rounds} rounds x {n}): vGPU doorbell p50 {d50:.0} p99 {d99:.0}, bare ioeventfd p50 {b50:.0}; doorbell -> arbiter saw it ({} of {jobs} jobs): p50 {t50:.1} us p99 {t99:.1} us",
            det.len()
        );
        // Which path the doorbells took: forwarded over the socket (the
        // relay's REGION_WRITEs) or noticed in the page by the poller.
        let st = srv.stats();
        println!(
            "{tag}: server saw {} doorbells over the socket, {} in the page",
            st.doorbells, st.mmap_doorbells
        );
        last.push((d50, t50));
        srv.stop();
    }
    m.shutdown();
    println!(
        "relay_store_ns={:.0} page_store_ns={:.0} relay_detect_p50_us={:.1} page_detect_p50_us={:.1}",
        last[0].0, last[1].0, last[0].1, last[1].1
    );
}
