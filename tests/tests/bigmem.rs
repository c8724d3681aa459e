//! End-to-end: VMs with RAM above 4 GiB. RAM is split around the MMIO hole
//! (the first 3 GiB at 0, the rest from 4 GiB; docs/boot.md); a GPU guest
//! with 16 GiB puts its MQDs, rings and CWSR areas in the RAM above 4 GiB
//! (the largest free region of its memory map) and its kernels run there.
//!
//! Its own test binary: nothing else runs in this process, so its peak RSS
//! is what the big VMs cost.

use hqdmux_tests::{config, kvm_or_skip, run, scratch_dir};

/// `VmHWM` (peak resident set) of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// The address after `free from ` in the `gpu` guest's verbose line: where
/// its allocator starts (MQDs, rings, CWSR areas follow).
fn alloc_base(console: &[String]) -> u64 {
    let line = console
        .iter()
        .find(|l| l.starts_with("gpu: vGPU at PCI"))
        .unwrap_or_else(|| panic!("no verbose line: {console:?}"));
    let hex = line
        .rsplit_once("free from 0x")
        .unwrap_or_else(|| panic!("{line}"))
        .1;
    u64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("{line}"))
}

#[test]
fn a_gpu_vm_with_16_gib_boots_and_runs_its_queues_above_4_gib() {
    let test = "a_gpu_vm_with_16_gib_boots_and_runs_its_queues_above_4_gib";
    if !kvm_or_skip(test) {
        return;
    }
    let dir = scratch_dir("bigmem");
    let vm = |name: &str, mib: u64| {
        format!(
            "[[vm]]\nname = \"{name}\"\nimage = \"builtin:gpu\"\nmemory_mib = {mib}\ngpu = true\n\
             args = \"queues=2 kernels=3 wgs=64 cost_us=200 verbose=1\"\n"
        )
    };
    // 16 GiB: 3 GiB below the hole, 13 GiB from 4 GiB. 3.5 GiB: 3 GiB
    // below, 512 MiB above (the allocator keeps to the bigger low part).
    // The hostile guest's attacks at the end of RAM (rings, pointers, CWSR
    // areas, signals, kernargs past or straddling it) happen at 17 GiB.
    let hostile = "[[vm]]\nname = \"hostile\"\nimage = \"builtin:hostile\"\nmemory_mib = 16384\n\
                   gpu = true\nguard = { max_queue_errors = 0, max_stale_doorbells = 0 }\n";
    let toml = [vm("big", 16 << 10), vm("mid", 3584), hostile.to_string()].concat();
    let before = peak_rss_kib();
    let report = run(&config(&dir, &toml));
    let peak = peak_rss_kib();
    assert!(report.all_succeeded(), "{}", report.summary());
    assert!(
        report.vms[2]
            .console
            .iter()
            .any(|l| l == "hostile: every attack got the documented answer"),
        "{:?}",
        report.vms[2].console
    );
    for v in &report.vms[..2] {
        assert!(
            v.console
                .iter()
                .any(|l| l == "gpu: 2 queues x 3 kernels x 64 wgs: ok"),
            "{}: {:?}",
            v.name,
            v.console
        );
    }
    let gpu = report.gpu.expect("mediator stats");
    assert!(
        gpu.completions >= 2 * 2 * 3,
        "every packet of the gpu guests completed (and the hostile guest's few)"
    );

    let big = alloc_base(&report.vms[0].console);
    assert_eq!(
        big,
        4 << 30,
        "the 16 GiB guest allocates from the RAM above the hole"
    );
    let mid = alloc_base(&report.vms[1].console);
    assert!(
        mid < 3 << 30,
        "the 3.5 GiB guest allocates below the hole: {mid:#x}"
    );

    // Guest RAM is a memfd populated on first touch: 35.5 GiB of guest RAM
    // cost only what the guests touched.
    println!("{test}: peak RSS {before} KiB before the run, {peak} KiB after");
    assert!(
        peak < 1 << 20,
        "peak RSS {peak} KiB (before the run {before} KiB): guest RAM must be populated lazily"
    );
}
