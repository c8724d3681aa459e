//! End-to-end: real bare-metal guests under KVM.

use hqdmux_tests::{config, kvm_or_skip, run, scratch_dir, vm};
use vmm::vm::VmOutcome;

#[test]
fn one_vm_prints_name_and_args_and_exits_zero() {
    if !kvm_or_skip("one_vm_prints_name_and_args_and_exits_zero") {
        return;
    }
    let dir = scratch_dir("one");
    let cfg = config(&dir, &vm("solo", "builtin:hello", "alpha=1 beta=two"));
    let report = run(&cfg);
    assert!(report.all_succeeded(), "{}", report.summary());
    let v = &report.vms[0];
    assert_eq!(
        v.console,
        vec!["hello from solo (vm 0), args: [alpha=1 beta=two]"]
    );
    let entered = v.entered.expect("runtime entry checkpoint seen");
    let line = v.first_line.expect("a console line");
    assert!(entered >= v.started && line >= entered);
}

#[test]
fn fleet_of_eight_all_run_with_their_own_identity() {
    if !kvm_or_skip("fleet_of_eight_all_run_with_their_own_identity") {
        return;
    }
    let dir = scratch_dir("eight");
    let toml: String = (0..8)
        .map(|i| vm(&format!("vm{i}"), "builtin:hello", &format!("n={i}")))
        .collect();
    let report = run(&config(&dir, &toml));
    assert!(report.all_succeeded(), "{}", report.summary());
    assert_eq!(report.vms.len(), 8);
    for (i, v) in report.vms.iter().enumerate() {
        assert_eq!(v.name, format!("vm{i}"));
        assert_eq!(
            v.console,
            vec![format!("hello from vm{i} (vm {i}), args: [n={i}]")]
        );
    }
}

#[test]
fn nonzero_exit_status_is_reported_per_vm() {
    if !kvm_or_skip("nonzero_exit_status_is_reported_per_vm") {
        return;
    }
    let dir = scratch_dir("nonzero");
    let toml =
        vm("bad", "builtin:fault", "mode=exit code=42") + &vm("good", "builtin:hello", "exit=0");
    let report = run(&config(&dir, &toml));
    assert!(!report.all_succeeded());
    assert_eq!(report.vms[0].outcome, VmOutcome::Exited(42));
    assert_eq!(report.vms[1].outcome, VmOutcome::Exited(0));
    assert!(report.summary().contains("exited with status 42"));
}

#[test]
fn triple_fault_names_that_vm_and_the_others_finish() {
    if !kvm_or_skip("triple_fault_names_that_vm_and_the_others_finish") {
        return;
    }
    let dir = scratch_dir("triple");
    let toml = vm("a", "builtin:hello", "")
        + &vm("crasher", "builtin:fault", "mode=triple")
        + &vm("c", "builtin:hello", "");
    let report = run(&config(&dir, &toml));
    assert_eq!(report.vms[1].outcome, VmOutcome::TripleFault { vcpu: 0 });
    assert!(report.vms[0].outcome.is_success() && report.vms[2].outcome.is_success());
    let summary = report.summary();
    let line = summary.lines().find(|l| l.starts_with("crasher")).unwrap();
    assert!(line.contains("triple fault on vCPU 0"), "{summary}");
}

#[test]
fn guest_panic_prints_message_and_exits_254() {
    if !kvm_or_skip("guest_panic_prints_message_and_exits_254") {
        return;
    }
    let dir = scratch_dir("panic");
    let report = run(&config(&dir, &vm("p", "builtin:fault", "mode=panic")));
    assert_eq!(report.vms[0].outcome, VmOutcome::Exited(254));
    assert!(report.vms[0]
        .console
        .iter()
        .any(|l| l.contains("guest panic")));
}

#[test]
fn run_timeout_stops_a_hung_vm_and_keeps_finished_results() {
    if !kvm_or_skip("run_timeout_stops_a_hung_vm_and_keeps_finished_results") {
        return;
    }
    let dir = scratch_dir("timeout");
    // `fine` must exit before the timeout for its result to be kept: the
    // timeout is a generous bound on a hello boot (milliseconds), not a
    // race a loaded host can lose.
    let toml = format!(
        "[run]\ntimeout_ms = 5000\n{}{}",
        vm("hung", "builtin:fault", "mode=hang"),
        vm("fine", "builtin:hello", "")
    );
    let report = run(&config(&dir, &toml));
    assert!(report.timed_out);
    assert_eq!(
        report.vms[0].outcome,
        VmOutcome::Stopped("run timeout".into())
    );
    assert_eq!(report.vms[1].outcome, VmOutcome::Exited(0));
}

#[test]
fn image_from_an_elf_file_and_multiple_vcpus() {
    if !kvm_or_skip("image_from_an_elf_file_and_multiple_vcpus") {
        return;
    }
    let dir = scratch_dir("file");
    std::fs::write(dir.join("hello.elf"), images::builtin("hello").unwrap()).unwrap();
    let toml =
        vm("f", "hello.elf", "from=file").replace("memory_mib = 8", "memory_mib = 8\nvcpus = 4");
    let report = run(&config(&dir, &toml));
    assert!(report.all_succeeded(), "{}", report.summary());
    assert_eq!(
        report.vms[0].console,
        vec!["hello from f (vm 0), args: [from=file]"]
    );
}

#[test]
fn every_vcpu_of_a_multi_vcpu_vm_runs() {
    if !kvm_or_skip("every_vcpu_of_a_multi_vcpu_vm_runs") {
        return;
    }
    let dir = scratch_dir("vcpus");
    // vCPU 0 hangs (hlt) so the VM lives until the timeout: every secondary
    // vCPU has long since run by then (a generous bound, not a race a
    // loaded host can lose), and each checks in with 0x100 | index.
    let toml = format!(
        "[run]\ntimeout_ms = 5000\n{}",
        vm("smp", "builtin:fault", "mode=hang")
            .replace("memory_mib = 8", "memory_mib = 8\nvcpus = 4")
    );
    let report = run(&config(&dir, &toml));
    assert_eq!(
        report.vms[0].outcome,
        VmOutcome::Stopped("run timeout".into())
    );
    let mut secondaries: Vec<u32> = report.vms[0]
        .checkpoints
        .iter()
        .map(|c| c.0)
        .filter(|c| c & 0x100 != 0)
        .collect();
    secondaries.sort();
    assert_eq!(secondaries, vec![0x101, 0x102, 0x103]);
}

#[test]
fn bad_configs_are_rejected_with_file_vm_field_and_reason() {
    // No KVM needed: validation happens before anything is built.
    let dir = scratch_dir("badcfg");
    std::fs::write(dir.join("junk.elf"), b"this is not an ELF file").unwrap();
    std::fs::create_dir_all(dir.join("adir")).unwrap();
    let file = dir.join("fleet.toml");
    let f = file.display();
    let good = vm("good", "builtin:hello", "");
    let cases: Vec<(String, String)> = vec![
        (
            vm("junk", "junk.elf", ""),
            "vm 'junk' (vm[0]): field `image`: junk.elf: not an ELF file (bad magic)".into(),
        ),
        (
            vm("d", "adir", ""),
            format!(
                "vm 'd' (vm[0]): field `image`: {}/adir is a directory",
                dir.display()
            ),
        ),
        (
            vm("m", "missing.elf", ""),
            format!(
                "vm 'm' (vm[0]): field `image`: image file {}/missing.elf not found",
                dir.display()
            ),
        ),
        (
            vm("big", "builtin:hello", "").replace("memory_mib = 8", "memory_mib = 65537"),
            "vm 'big' (vm[0]): field `memory_mib`: 65537 MiB is too large (maximum 65536 MiB)"
                .into(),
        ),
        (
            good.clone() + &vm("p", "builtin:hello", "") + "priority = 300\n",
            "vm 'p' (vm[1]): field `priority`: 300 is out of range 0..=15".into(),
        ),
        (
            good.clone() + "priority = \"high\"\n",
            "vm 'good' (vm[0]): field `priority`: expected an integer, found a string".into(),
        ),
        (
            good.clone() + "vcpus = 300\n",
            "vm 'good' (vm[0]): field `vcpus`: 300 is out of range 1..=8".into(),
        ),
        (
            good.clone() + "colour = 1\n",
            "vm 'good' (vm[0]): field `colour`: unknown field (known: name, image,".into(),
        ),
        (
            good.clone() + &good,
            "vm 'good' (vm[1]): field `name`: duplicate name".into(),
        ),
        (
            "[[vm]]\nimage = \"builtin:hello\"\n".into(),
            "vm '?' (vm[0]): field `name`: missing (required)".into(),
        ),
        (
            good.clone() + "gpu = \"yes\"\n",
            "vm 'good' (vm[0]): field `gpu`: expected true, false or { socket = \"PATH\" }, found a string".into(),
        ),
        (
            format!("[gpu]\npartition_mode = \"DPX\"\nxccs = 3\n{good}"),
            "gpu: field `xccs`: 3 XCCs do not split evenly".into(),
        ),
        (
            format!("[run]\ntimeout_ms = 0\n{good}"),
            "field `run.timeout_ms`: must be at least 1".into(),
        ),
        (format!("[runn]\n{good}"), "unknown field `runn`".into()),
    ];
    for (text, want) in cases {
        let err = vmm::config::FleetConfig::parse(&text, &file)
            .expect_err(&want)
            .to_string();
        assert!(err.starts_with(&format!("{f}: ")), "names the file: {err}");
        assert!(err.contains(&want), "wanted {want:?} in {err:?}");
    }
}

#[test]
fn an_unusable_control_socket_path_aborts_the_launch_naming_it() {
    if !kvm_or_skip("an_unusable_control_socket_path_aborts_the_launch_naming_it") {
        return;
    }
    let dir = scratch_dir("badsock");
    let cfg = config(&dir, &vm("a", "builtin:hello", ""));
    let opts = vmm::fleet::RunOptions {
        echo: false,
        api_socket: Some(dir.join("no/such/dir/api.sock")),
        ..Default::default()
    };
    let err = vmm::fleet::run_fleet(&cfg, opts).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "api socket {}",
            dir.join("no/such/dir/api.sock").display()
        )),
        "{err}"
    );
}
