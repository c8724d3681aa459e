//! End-to-end isolation (issue 11): a guest whose kernel never reaches a
//! save point is reset after its preemption timeout (error 22 and the error
//! vector) while a good VM completes exactly; VMs that die during GPU work
//! (triple fault, exit without unloading, stopped by the host) have their
//! queues reclaimed and the others lose nothing.

use hqdmux_tests::{config, kvm_or_skip, run, scratch_dir};
use vmm::vm::VmOutcome;

/// A VM running the `gpu` guest with one queue.
fn gpu_vm(name: &str, priority: u8, args: &str, extra: &str) -> String {
    format!(
        "[[vm]]\nname = \"{name}\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\npriority = {priority}\nargs = \"{args}\"\n{extra}"
    )
}

#[test]
fn a_hung_kernel_is_reset_with_error_22_and_the_good_vm_completes_exactly() {
    if !kvm_or_skip("a_hung_kernel_is_reset_with_error_22_and_the_good_vm_completes_exactly") {
        return;
    }
    let dir = scratch_dir("iso-hung");
    let toml = [
        gpu_vm(
            "hung",
            8,
            "kernels=2 wgs=64 cost_us=100 bad=hang",
            "preempt_timeout_ms = 200\n",
        ),
        gpu_vm("good", 8, "kernels=4 wgs=304 cost_us=200 loops=3", ""),
    ]
    .concat();
    let report = run(&config(&dir, &toml));
    let (hung, good) = (&report.vms[0], &report.vms[1]);
    assert_eq!(hung.outcome, VmOutcome::Exited(2), "{}", report.summary());
    assert!(
        hung.console.iter().any(|l| l == "gpu: queue 0 error 22"),
        "{:?}",
        hung.console
    );
    assert!(
        hung.console.iter().any(|l| l == "gpu: error interrupt"),
        "{:?}",
        hung.console
    );
    // Its mark kernels (before the hung one) ran exactly once.
    assert!(
        hung.console.iter().any(|l| l == "gpu: other 1 queues: ok"),
        "{:?}",
        hung.console
    );
    assert_eq!(good.outcome, VmOutcome::Exited(0), "{}", report.summary());
    assert!(
        good.console
            .iter()
            .any(|l| l == "gpu: 1 queues x 4 kernels x 304 wgs x 3 loops: ok"),
        "{:?}",
        good.console
    );
    let gpu = report.gpu.expect("arbiter stats");
    assert_eq!(gpu.preempt_timeouts, 1, "{}", report.summary());
}

#[test]
fn vms_dying_during_gpu_work_are_reclaimed_and_the_others_lose_nothing() {
    if !kvm_or_skip("vms_dying_during_gpu_work_are_reclaimed_and_the_others_lose_nothing") {
        return;
    }
    let dir = scratch_dir("iso-die");
    // Two dying VMs outrank the good one and leave kernels of 304
    // workgroups of 1000 s each on the GPU: the good VM completes only if
    // their queues are reclaimed. The third spins after ringing until the
    // run timeout stops it (its short kernel does not hold the GPU).
    let long = "kernels=2 wgs=304 cost_us=1000000000";
    let toml = [
        gpu_vm("triple", 12, &format!("{long} die=triple"), ""),
        gpu_vm("exit", 12, &format!("{long} die=exit"), ""),
        gpu_vm("spin", 12, "kernels=1 wgs=4 cost_us=100 die=hang", ""),
        gpu_vm("good", 2, "kernels=3 wgs=304 cost_us=300 loops=2", ""),
        "[run]\ntimeout_ms = 40000\n".into(),
    ]
    .concat();
    // The spinning VM is stopped by the run timeout; the others end first.
    let report = run(&config(&dir, &toml));
    let by = |n: &str| report.vms.iter().find(|v| v.name == n).unwrap();
    assert!(
        matches!(by("triple").outcome, VmOutcome::TripleFault { .. }),
        "{}",
        report.summary()
    );
    assert_eq!(
        by("exit").outcome,
        VmOutcome::Exited(5),
        "{}",
        report.summary()
    );
    assert!(
        matches!(by("spin").outcome, VmOutcome::Stopped(_)),
        "{}",
        report.summary()
    );
    let good = by("good");
    assert_eq!(good.outcome, VmOutcome::Exited(0), "{}", report.summary());
    assert!(
        good.console
            .iter()
            .any(|l| l == "gpu: 1 queues x 3 kernels x 304 wgs x 2 loops: ok"),
        "{:?}",
        good.console
    );
}
