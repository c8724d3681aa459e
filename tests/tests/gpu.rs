//! End-to-end: guests drive their mediated vGPU (registers, MQDs and AQL
//! rings in their own memory, doorbells, paravirtual waits) on the simulated
//! GPU, scheduled by priority.

use hqdmux_tests::{config, kvm_or_skip, last_checkpoint, run, scratch_dir};
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

#[test]
fn guests_run_mark_kernels_exactly_once_on_their_vgpus() {
    if !kvm_or_skip("guests_run_mark_kernels_exactly_once_on_their_vgpus") {
        return;
    }
    let dir = scratch_dir("gpu-two");
    let toml = [
        gpu_vm("a", 5, "queues=2 kernels=3 wgs=64 cost_us=200"),
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
    ]
    .concat();
    let report = run(&config(&dir, &toml));
    for (i, code) in [(0, 4), (1, 13), (2, 7)] {
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
    // Guests start together and nothing orders their first doorbells, so
    // the margins carry the test: training holds ~800 ms of whole-GPU work
    // in 50 ms workgroups; inference's 10 short jobs take ~150 ms of
    // emulated guest time, so most of them land while training runs.
    let toml = [
        gpu_vm("training", 2, "kernels=4 wgs=1216 cost_us=50000"),
        gpu_vm("inference", 12, "kernels=2 wgs=304 cost_us=500 loops=10"),
    ]
    .concat();
    let report = run(&config(&dir, &toml));
    assert!(report.all_succeeded(), "{}", report.summary());
    let training = report.vm_gpu[0].expect("training GPU accounting");
    assert!(
        training.preemptions >= 1,
        "inference preempted training: {}",
        report.summary()
    );
    // Inference (submitted while training runs) finishes first: its last
    // completion checkpoint precedes training's.
    let done = |i: usize| last_checkpoint(&report.vms[i], 3);
    assert!(done(1) < done(0), "{}", report.summary());
}

#[test]
fn an_operator_raises_a_waiting_vm_over_the_control_socket_and_it_preempts() {
    let test = "an_operator_raises_a_waiting_vm_over_the_control_socket_and_it_preempts";
    if !kvm_or_skip(test) {
        return;
    }
    let dir = scratch_dir("gpu-ctl");
    let sock = dir.join("api.sock");
    // Left alone, `late` (priority 1) cannot preempt `training` (priority 2):
    // in the default exclusive mode it waits for training's ~800 ms of 50 ms
    // workgroups, and training is never preempted. Once training holds a
    // slot the operator raises `late` to 12 over the control socket. `late`'s
    // 20 short jobs take ~300 ms of emulated guest time: it cannot finish
    // before training gets its slot, and once raised it ends well before
    // training does.
    let toml = [
        gpu_vm("training", 2, "kernels=4 wgs=1216 cost_us=50000"),
        gpu_vm("late", 1, "kernels=2 wgs=304 cost_us=500 loops=20"),
    ]
    .concat();
    let cfg = config(&dir, &toml);
    let opts = vmm::fleet::RunOptions {
        echo: false,
        api_socket: Some(sock.clone()),
        ..Default::default()
    };
    let fleet = std::thread::spawn(move || vmm::fleet::run_fleet(&cfg, opts).expect("fleet"));
    let t0 = std::time::Instant::now();
    let training_mapped = |list: &str| {
        list.lines()
            .find(|l| l.starts_with("training "))
            .is_some_and(|l| !l.contains(" maps=0 "))
    };
    loop {
        assert!(t0.elapsed().as_secs() < 20, "training never got a slot");
        if let Ok(list) = vmm::api::request(&sock, "list") {
            if training_mapped(&list) {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert_eq!(
        vmm::api::request(&sock, "policy").unwrap(),
        "policy hqdmux\n"
    );
    let bad = vmm::api::request(&sock, "priority late 16").unwrap();
    assert_eq!(
        bad,
        "error: vm 'late': priority: 16 is out of range 0..=15\n"
    );
    let ok = vmm::api::request(&sock, "priority late 12").unwrap();
    assert_eq!(ok, "ok: vm 'late': priority = 12\n");
    let list = vmm::api::request(&sock, "list").unwrap();
    assert!(
        list.lines()
            .any(|l| l.starts_with("late state=running gpu=yes priority=12 ")),
        "{list}"
    );
    let report = fleet.join().unwrap();
    assert!(report.all_succeeded(), "{}", report.summary());
    assert!(!sock.exists(), "socket removed when the fleet ends");
    let training = report.vm_gpu[0].expect("training GPU accounting");
    assert!(
        training.preemptions >= 1,
        "the raised VM preempted training: {}",
        report.summary()
    );
    let done = |i: usize| last_checkpoint(&report.vms[i], 3);
    assert!(
        done(1) < done(0),
        "raised VM finished first: {}",
        report.summary()
    );
}
