//! End-to-end: guests find their mediated vGPU on PCI, drive it (registers
//! in BAR0, MQDs and AQL rings in their own memory, doorbells in BAR2 as KVM
//! ioeventfds) and wait for MSI-X interrupts (`sti; hlt`) on the simulated
//! GPU, scheduled by priority.

use hqdmux_tests::{config, kvm_or_skip, run, scratch_dir, LiveFleet};
use vmm::vm::VmOutcome;

/// A VM running the `gpu` guest; RAM for one CWSR area (~177 MiB on the
/// default MI300X) per queue.
fn gpu_vm(name: &str, priority: u8, args: &str) -> String {
    let queues: u64 = args
        .split_whitespace()
        .find_map(|w| w.strip_prefix("queues="))
        .map_or(1, |q| q.parse().unwrap());
    let mib = 64 + 192 * queues;
    format!(
        "[[vm]]\nname = \"{name}\"\nimage = \"builtin:gpu\"\nmemory_mib = {mib}\ngpu = true\npriority = {priority}\nargs = \"{args}\"\n"
    )
}

/// [`gpu_vm`] as the JSON body of `POST /api/v1/vms`.
fn gpu_vm_json(name: &str, priority: u8, args: &str) -> serde_json::Value {
    serde_json::json!({
        "name": name, "image": "builtin:gpu", "memory_mib": 256,
        "gpu": true, "priority": priority, "args": args,
    })
}

#[test]
fn guests_run_mark_kernels_exactly_once_on_their_vgpus() {
    if !kvm_or_skip("guests_run_mark_kernels_exactly_once_on_their_vgpus") {
        return;
    }
    let dir = scratch_dir("gpu-two");
    let toml = [
        gpu_vm("a", 5, "queues=2 kernels=3 wgs=64 cost_us=200 verbose=1"),
        gpu_vm("b", 5, "queues=1 kernels=4 wgs=304 cost_us=100 loops=2"),
    ]
    .concat();
    let report = run(&config(&dir, &toml));
    assert!(report.all_succeeded(), "{}", report.summary());
    assert!(
        report.vms[0]
            .console
            .iter()
            .any(|l| l == "gpu: 2 queues x 3 kernels x 64 wgs: ok"),
        "{:?}",
        report.vms[0].console
    );
    assert!(
        report.vms[1].console.iter().any(|l| l.ends_with(": ok")),
        "{:?}",
        report.vms[1].console
    );
    let gpu = report.gpu.expect("mediator stats");
    assert_eq!(
        gpu.completions,
        2 * 3 + 4 * 2,
        "every packet completed once"
    );
    assert_eq!(
        report.vms[1].spans(2, 3).len(),
        2,
        "host saw both submissions"
    );
    // Found on PCI bus 0 at the ABI's device number.
    assert!(
        report.vms[0]
            .console
            .iter()
            .any(|l| l.starts_with("gpu: vGPU at PCI 00:4.0: 8 vhqds")),
        "{:?}",
        report.vms[0].console
    );
    // Waited by interrupt: one vector per packet (every signal has a
    // mailbox) plus one per finished dequeue was sent (none held: the guest
    // unmasked every vector), and no doorbell reached the VMM as an MMIO
    // exit (all went through the ioeventfds).
    for (v, packets, queues) in [(0, 6, 2), (1, 8, 1)] {
        let io = report.vgpu_io[v].expect("vGPU counters");
        assert_eq!(
            io.msix.fired,
            packets + queues,
            "{}: {io:?}",
            report.vms[v].name
        );
        assert_eq!(io.msix.held + io.msix.dropped, 0, "{io:?}");
        assert_eq!(io.refused, 0, "{io:?}");
    }
}

#[test]
fn a_doorbell_and_register_flood_logs_a_few_lines_and_counts_the_rest() {
    let test = "a_doorbell_and_register_flood_logs_a_few_lines_and_counts_the_rest";
    if !kvm_or_skip(test) {
        return;
    }
    hqdmux_tests::logs::capture();
    let dir = scratch_dir("gpu-flood");
    let flood = 5000;
    let toml = gpu_vm(
        "flooder",
        5,
        &format!("flood={flood} kernels=2 wgs=64 cost_us=100"),
    );
    let t0 = std::time::Instant::now();
    let report = run(&config(&dir, &toml));
    let secs = t0.elapsed().as_secs() + 1;
    assert!(report.all_succeeded(), "{}", report.summary());
    let io = report.vgpu_io[0].expect("vGPU counters");
    assert_eq!(io.refused, 2 * flood, "every refused write counted: {io:?}");
    let lines: Vec<String> = hqdmux_tests::logs::at_least(log::Level::Warn)
        .into_iter()
        .filter(|l| l.starts_with("vm flooder: vGPU"))
        .collect();
    // At most LOG_LINES_PER_SECOND per started second, plus the final count.
    let limit = vmm::devices::LOG_LINES_PER_SECOND as u64 * secs + 1;
    assert!(
        (lines.len() as u64) <= limit,
        "{} lines in {secs} s: {lines:#?}",
        lines.len()
    );
    assert!(
        lines.iter().any(|l| l.contains("no such doorbell")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("no register there")),
        "{lines:#?}"
    );
    assert_eq!(io.refused_unlogged, 2 * flood - (lines.len() as u64 - 1));
    assert!(
        lines
            .last()
            .is_some_and(|l| l.ends_with("similar lines suppressed")),
        "the count of suppressed lines is logged: {lines:#?}"
    );
}

#[test]
fn low_priority_vms_waiting_longer_than_ten_seconds_complete() {
    let test = "low_priority_vms_waiting_longer_than_ten_seconds_complete";
    if !kvm_or_skip(test) {
        return;
    }
    let dir = scratch_dir("gpu-long-wait");
    // `long` (priority 12) holds the whole GPU with 1000-s workgroups that
    // never end on their own; in the default exclusive mode, with aging
    // pushed out of the run, the priority-2 VMs added once it is on the GPU
    // wait behind it in `sti; hlt`. The operator stops `long` once the host
    // has counted 10 s of each low VM waiting ready for a slot, so each
    // low VM's wait is over 10 s whatever the host's load.
    let toml = "[scheduler]\naging_ns = 600000000000\n\n".to_string()
        + &gpu_vm("long", 12, "kernels=1 wgs=1216 cost_us=1000000000");
    let fleet = LiveFleet::start(&dir, &toml);
    fleet.wait_on_gpu("long");
    let lows = ["lo0", "lo1", "lo2"];
    for lo in lows {
        fleet.add(gpu_vm_json(lo, 2, "kernels=1 wgs=304 cost_us=1000000"));
    }
    for lo in lows {
        wait_ready_for(&fleet, lo, 10_000.0);
    }
    fleet.stop("long");
    let report = fleet.join();
    assert!(report.all_succeeded(), "{}", report.summary());
    assert_low_vms_waited(&report, 10);
}

/// utime + stime (clock ticks) of this process's threads whose name starts with `prefix`.
fn thread_cpu_ticks(prefix: &str) -> u64 {
    let mut total = 0;
    for t in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // Fields 14 and 15 of proc(5) follow the parenthesised name.
        if let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f.len() > 12 {
                total += f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
            }
        }
    }
    total
}

#[test]
fn low_priority_vms_waiting_minutes_for_the_gpu_complete() {
    let test = "low_priority_vms_waiting_minutes_for_the_gpu_complete";
    if !kvm_or_skip(test) {
        return;
    }
    let dir = scratch_dir("gpu-minutes");
    // As above, for two minutes: `mwhi` holds the whole GPU with 1000-s
    // workgroups (one packet in all: cheap in host CPU), the priority-2 VMs
    // (one 1 s whole-GPU kernel each) wait behind it in `sti; hlt`, and the
    // operator stops `mwhi` once the host has counted 120 s of each waiting.
    let toml = "[scheduler]\naging_ns = 600000000000\n\n".to_string()
        + &gpu_vm("mwhi", 12, "kernels=1 wgs=1216 cost_us=1000000000");
    let fleet = LiveFleet::start(&dir, &toml);
    fleet.wait_on_gpu("mwhi");
    let lows = ["mwlo0", "mwlo1", "mwlo2"];
    for lo in lows {
        fleet.add(gpu_vm_json(lo, 2, "kernels=1 wgs=304 cost_us=1000000"));
    }
    // Once every low VM waits: their vCPU threads ("mwlo*-vcpu0") over 30 s.
    for lo in lows {
        wait_ready_for(&fleet, lo, 1.0);
    }
    // /proc counts in USER_HZ ticks, 100 per second on x86-64 Linux.
    let hz = 100;
    let c0 = thread_cpu_ticks("mwlo");
    std::thread::sleep(std::time::Duration::from_secs(30));
    let c1 = thread_cpu_ticks("mwlo");
    for lo in lows {
        wait_ready_for(&fleet, lo, 120_000.0);
    }
    fleet.stop("mwhi");
    let report = fleet.join();
    assert!(report.all_succeeded(), "{}", report.summary());
    // Three waiting vCPUs over 30 s = 90 s of thread time if they spun;
    // halted, they use next to none (allow 3 s: a loaded CI machine).
    assert!(
        (c1 - c0) < 3 * hz,
        "waiting vCPUs used {} ticks ({hz}/s) in 30 s: {}",
        c1 - c0,
        report.summary()
    );
    assert_low_vms_waited(&report, 120);
    assert_eq!(report.gpu.expect("arbiter stats").completions, 3);
}

/// Every VM after the first ran its one kernel exactly once (the guest
/// checked every workgroup counter is 1) and waited at least `secs` from
/// submitting it to its completion.
fn assert_low_vms_waited(report: &vmm::fleet::FleetReport, secs: u64) {
    for v in &report.vms[1..] {
        assert!(
            v.console
                .iter()
                .any(|l| l == "gpu: 1 queues x 1 kernels x 304 wgs: ok"),
            "{}: {:?}",
            v.name,
            v.console
        );
        let waited = v.spans(2, 3);
        assert_eq!(waited.len(), 1, "{}", v.name);
        assert!(
            waited[0] >= std::time::Duration::from_secs(secs),
            "{} waited only {:?}: {}",
            v.name,
            waited[0],
            report.summary()
        );
    }
}

/// Waits until the host has counted at least `ms` of VM `name` waiting
/// ready for a slot (`promise.wait_ms`, never more than the real wait: it
/// only counts time between samples that both saw the VM waiting).
fn wait_ready_for(fleet: &LiveFleet, name: &str, ms: f64) {
    fleet.wait_vm(name, &format!("never waited {ms} ms"), |v| {
        v["promise"]["wait_ms"].as_f64().is_some_and(|w| w >= ms)
    });
}

#[test]
fn hostile_guests_get_queue_errors_and_the_others_finish() {
    if !kvm_or_skip("hostile_guests_get_queue_errors_and_the_others_finish") {
        return;
    }
    let dir = scratch_dir("gpu-hostile");
    let toml = [
        gpu_vm("ring", 5, "bad=ring"),
        gpu_vm("kernarg", 5, "bad=kernarg"),
        gpu_vm("wptr", 5, "bad=wptr"),
        gpu_vm("good", 5, "kernels=3 wgs=128 cost_us=300"),
        gpu_vm("signal", 5, "bad=signal"),
        gpu_vm("mailbox", 5, "bad=mailbox"),
    ]
    .concat();
    let report = run(&config(&dir, &toml));
    // Ring outside RAM, kernarg outside RAM, write index past the ring, a
    // wrapping completion-signal address, a wrapping mailbox address.
    for (i, code) in [(0, 4), (1, 13), (2, 7), (4, 15), (5, 15)] {
        let v = &report.vms[i];
        assert_eq!(v.outcome, VmOutcome::Exited(2), "{}", report.summary());
        assert!(
            v.console
                .iter()
                .any(|l| l.contains(&format!("error {code}"))),
            "{}: {:?}",
            v.name,
            v.console
        );
    }
    assert_eq!(
        report.vms[3].outcome,
        VmOutcome::Exited(0),
        "{}",
        report.summary()
    );
}

#[test]
fn a_high_priority_vm_preempts_a_low_priority_one() {
    if !kvm_or_skip("a_high_priority_vm_preempts_a_low_priority_one") {
        return;
    }
    let dir = scratch_dir("gpu-prio");
    // Training's workgroups (1000 s each, with save points) never end on
    // their own: once the host sees its queue on the GPU, inference (added
    // then, at priority 12) can only run by preempting it, however slowly
    // either guest runs on a loaded host. The operator stops training once
    // inference is done (an operator stop is not a failure).
    let fleet = LiveFleet::start(
        &dir,
        &gpu_vm("training", 2, "kernels=1 wgs=1216 cost_us=1000000000"),
    );
    fleet.wait_on_gpu("training");
    fleet.add(gpu_vm_json(
        "inference",
        12,
        "kernels=2 wgs=304 cost_us=500 loops=25",
    ));
    let inference = fleet.wait_ended("inference");
    let training = fleet.wait_vm("training", "still running", |v| v["outcome"].is_null());
    assert!(
        training["preemptions"].as_u64().is_some_and(|p| p >= 1),
        "inference preempted training: {training}"
    );
    assert_eq!(inference["preemptions"].as_u64(), Some(0), "{inference}");
    fleet.stop("training");
    let report = fleet.join();
    assert!(report.all_succeeded(), "{}", report.summary());
    assert!(
        report.vms[1]
            .console
            .iter()
            .any(|l| l == "gpu: 1 queues x 2 kernels x 304 wgs x 25 loops: ok"),
        "{:?}",
        report.vms[1].console
    );
    assert_eq!(report.operator_stopped, vec![true, false]);
}

#[test]
fn an_operator_raises_a_waiting_vm_over_the_control_socket_and_it_preempts() {
    let test = "an_operator_raises_a_waiting_vm_over_the_control_socket_and_it_preempts";
    if !kvm_or_skip(test) {
        return;
    }
    let dir = scratch_dir("gpu-ctl");
    // `training` (priority 2) runs 1000-s workgroups with save points that
    // never end on their own. `late` (priority 1) is added once the host
    // sees training on the GPU: left alone it could wait forever (the
    // default exclusive mode never lets priority 1 preempt 2, and aging is
    // pushed out of the run). The operator raises `late` to 12 over the
    // control socket, so late can only finish by preempting training,
    // whatever either guest's speed; then the operator stops training.
    let toml = "[scheduler]\naging_ns = 600000000000\n\n".to_string()
        + &gpu_vm("training", 2, "kernels=1 wgs=1216 cost_us=1000000000");
    let fleet = LiveFleet::start(&dir, &toml);
    fleet.wait_on_gpu("training");
    fleet.add(gpu_vm_json(
        "late",
        1,
        "kernels=2 wgs=304 cost_us=500 loops=20",
    ));
    let v = fleet.api("GET", "/api/v1/policy", None, 200);
    assert_eq!(v["policy"].as_str(), Some("hqdmux"));
    let bad = fleet.api(
        "PATCH",
        "/api/v1/vms/late",
        Some(serde_json::json!({"priority": 16})),
        400,
    );
    assert_eq!(
        bad["error"],
        "vm 'late': priority: 16 is out of range 0..=15"
    );
    let list = fleet.api("GET", "/api/v1/vms", None, 200);
    let late = &list["vms"][1];
    assert_eq!(
        (
            late["name"].as_str(),
            late["priority"].as_u64(),
            late["gpu"].as_bool(),
            late["gpu_time_ms"].as_f64().unwrap_or(0.0),
        ),
        (Some("late"), Some(1), Some(true), 0.0),
        "late has had no GPU time while training holds the GPU: {list}"
    );
    let ok = fleet.api(
        "PATCH",
        "/api/v1/vms/late",
        Some(serde_json::json!({"priority": 12})),
        200,
    );
    assert_eq!(ok["priority"].as_u64(), Some(12));
    fleet.wait_ended("late");
    let training = fleet.wait_vm("training", "still running", |v| v["outcome"].is_null());
    assert!(
        training["preemptions"].as_u64().is_some_and(|p| p >= 1),
        "the raised VM preempted training: {training}"
    );
    fleet.stop("training");
    let sock = fleet.sock.clone();
    let report = fleet.join();
    assert!(report.all_succeeded(), "{}", report.summary());
    assert!(!sock.exists(), "socket removed when the fleet ends");
    assert!(
        report.vms[1]
            .console
            .iter()
            .any(|l| l == "gpu: 1 queues x 2 kernels x 304 wgs x 20 loops: ok"),
        "{:?}",
        report.vms[1].console
    );
}
