//! Hostile guests (review): the `hostile` guest attacks its own vGPU through
//! PCI configuration space, every BAR0 register, every BAR2 offset and width,
//! broken MQDs and malformed AQL packets (guest-tools/src/bin/hostile.rs),
//! checking each answer against docs/vgpu-abi.md from inside; a well-behaved
//! `gpu` VM runs beside it and must complete exactly, and the host must stay
//! up (the run returns a report).

use hqdmux_tests::{config, kvm_or_skip, run, scratch_dir};
use vmm::vm::VmOutcome;

#[test]
fn a_hostile_guest_gets_documented_errors_and_its_neighbour_loses_nothing() {
    if !kvm_or_skip("a_hostile_guest_gets_documented_errors_and_its_neighbour_loses_nothing") {
        return;
    }
    let dir = scratch_dir("hostile");
    // The attacks cause dozens of queue errors: the guard's queue-error
    // quarantine (docs/operators.md) is off for this VM so every attack is
    // answered by the front end itself.
    let toml = "\
[[vm]]
name = \"hostile\"
image = \"builtin:hostile\"
memory_mib = 256
gpu = true
priority = 8
guard = { max_queue_errors = 0, max_stale_doorbells = 0 }

[[vm]]
name = \"good\"
image = \"builtin:gpu\"
memory_mib = 256
gpu = true
priority = 8
args = \"kernels=4 wgs=304 cost_us=200 loops=3\"
";
    hqdmux_tests::logs::capture();
    let t0 = std::time::Instant::now();
    let report = run(&config(&dir, toml));
    // The host's log limits are per second: a run a loaded host stretches
    // over more seconds may log more lines, never one per error.
    let secs = t0.elapsed().as_secs() + 1;
    let (hostile, good) = (&report.vms[0], &report.vms[1]);
    let fails: Vec<_> = hostile
        .console
        .iter()
        .filter(|l| l.contains("FAIL"))
        .collect();
    assert!(fails.is_empty(), "{fails:#?}\n{}", report.summary());
    assert_eq!(
        hostile.outcome,
        VmOutcome::Exited(0),
        "{:?}",
        hostile.console
    );
    assert!(
        hostile
            .console
            .iter()
            .any(|l| l == "hostile: every attack got the documented answer"),
        "{:?}",
        hostile.console
    );
    // Dozens of queue errors and thousands of refused accesses in well
    // under a second: every guest-triggered warning names the VM (and goes
    // through its rate limit), none is a bare per-error line.
    let lines = hqdmux_tests::logs::at_least(log::Level::Warn);
    let bare: Vec<_> = lines.iter().filter(|l| !l.starts_with("vm ")).collect();
    assert!(bare.is_empty(), "warnings not naming a VM: {bare:#?}");
    let mine = lines.iter().filter(|l| l.starts_with("vm hostile")).count() as u64;
    assert!(
        mine <= 40 * secs,
        "{mine} warnings for one hostile VM in {secs} s: {lines:#?}"
    );
    assert_eq!(good.outcome, VmOutcome::Exited(0), "{}", report.summary());
    assert!(
        good.console
            .iter()
            .any(|l| l == "gpu: 1 queues x 4 kernels x 304 wgs x 3 loops: ok"),
        "{:?}",
        good.console
    );
}

#[test]
fn a_guest_flooding_console_and_checkpoints_keeps_bounded_host_memory() {
    if !kvm_or_skip("a_guest_flooding_console_and_checkpoints_keeps_bounded_host_memory") {
        return;
    }
    let dir = scratch_dir("hostile-flood");
    let toml = "\
[[vm]]
name = \"flood\"
image = \"builtin:hostile\"
args = \"mode=flood lines=60000 marks=70000\"
";
    let report = run(&config(&dir, toml));
    let v = &report.vms[0];
    assert_eq!(v.outcome, VmOutcome::Exited(0), "{}", report.summary());
    // 60000 empty lines cost more than the ~1 MiB kept: the oldest are
    // dropped and counted, the last line is kept.
    assert!(v.console.len() < 60_000, "{} lines kept", v.console.len());
    assert!(
        v.console[0].contains("earlier console lines dropped"),
        "{}",
        v.console[0]
    );
    assert_eq!(
        v.console.last().map(String::as_str),
        Some("hostile: flood done")
    );
    assert_eq!(v.checkpoints.len(), vmm::devices::MAX_CHECKPOINTS);
    assert_eq!(v.checkpoints[0].0, 1, "rt's entry checkpoint is kept");
}
