//! The `hqdmux` binary as an operator runs it.

use std::process::Command;

fn hqdmux() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hqdmux"))
}

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn bad_configs_are_rejected_with_file_vm_field_and_reason_and_nothing_runs() {
    let dir = std::env::temp_dir().join(format!("hqdmux-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = "[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\n";
    let cases = [
        (
            "prio.toml",
            good.replace("name = \"a\"", "name = \"a\"\npriority = 99"),
            "vm 'a' (vm[0]): field `priority`: 99 is out of range 0..=15",
        ),
        (
            "dup.toml",
            format!("{good}{good}"),
            "vm 'a' (vm[1]): field `name`: duplicate name",
        ),
        (
            "img.toml",
            good.replace("builtin:hello", "builtin:nosuch"),
            "field `image`: no built-in image 'nosuch'",
        ),
        (
            "mem.toml",
            format!("{good}memory_mib = 2\n"),
            "field `memory_mib`: 2 MiB is too small",
        ),
        (
            "unknown.toml",
            format!("{good}gpus = 2\n"),
            "vm 'a' (vm[0]): field `gpus`: unknown field",
        ),
        (
            "gpufield.toml",
            format!("[gpu]\nxcc = 4\n{good}"),
            "unknown field `xcc`",
        ),
        (
            "gputopo.toml",
            format!("[gpu]\nxccs = 3\npartition_mode = \"DPX\"\n{good}"),
            "gpu: field `xccs`: 3 XCCs do not split evenly",
        ),
        (
            "partition.toml",
            format!("{good}partition = 2\n"),
            "vm 'a' (vm[0]): field `partition`: 2 is out of range 0..=0",
        ),
        (
            "syntax.toml",
            "[[vm]\n".to_string(),
            "TOML parse error at line 1",
        ),
    ];
    for (file, text, want) in cases {
        let path = dir.join(file);
        std::fs::write(&path, text).unwrap();
        for sub in ["run", "check"] {
            let out = hqdmux()
                .args([sub, path.to_str().unwrap()])
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{sub} {file}: {stderr}");
            assert!(
                stderr.contains(path.to_str().unwrap()),
                "{file}: names the file: {stderr}"
            );
            assert!(stderr.contains(want), "{file}: wanted {want:?} in {stderr}");
            assert!(
                out.stdout.is_empty(),
                "{file}: nothing launched, nothing printed"
            );
        }
    }
    let out = hqdmux()
        .args(["run", dir.join("missing.toml").to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml: cannot read"));
}

#[test]
fn check_prints_the_gpu_topology() {
    let out = hqdmux()
        .args(["check", "examples/hello.toml"])
        .current_dir(root())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for want in [
        "examples/hello.toml: ok, 4 VMs",
        "gpu: 8 XCCs x 38 CUs = 304 CUs",
        "gpu: partition mode SPX",
        "gpu: user HQD slots: 24 ",
    ] {
        assert!(stdout.contains(want), "wanted {want:?} in {stdout}");
    }
    let dir = std::env::temp_dir().join(format!("hqdmux-cli-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cpx.toml");
    std::fs::write(
        &path,
        "[gpu]\npartition_mode = \"CPX\"\n[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\npartition = 5\n",
    )
    .unwrap();
    let out = hqdmux()
        .args(["check", path.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("partition mode CPX: 8 partitions of 1 XCC (38 CUs each)"),
        "{stdout}"
    );
    assert!(stdout.contains("user HQD slots: 192 "), "{stdout}");
    assert!(stdout.contains("a->5"), "{stdout}");
}

#[test]
fn help_lists_subcommands_and_each_has_its_own_help() {
    let out = hqdmux().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let commands: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for sub in ["run", "check", "images", "sim", "ctl"] {
        assert!(commands.contains(&sub), "{sub} in {commands:?}");
    }
    for (sub, option) in [
        ("run", "--timeout-ms"),
        ("run", "--api-socket"),
        ("check", "<CONFIG>"),
        ("sim", "--scenario"),
        ("ctl", "<SOCKET>"),
    ] {
        let out = hqdmux().args([sub, "--help"]).output().unwrap();
        assert!(out.status.success(), "{sub} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.contains(option),
            "{sub} --help mentions {option}: {help}"
        );
    }
    let out = hqdmux().arg("images").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("builtin:hello"));
    let out = hqdmux().arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "unknown subcommand");
}

#[test]
fn timeout_override_stops_a_hung_vm_and_the_run_fails() {
    if !vmm::kvm_or_skip("timeout_override_stops_a_hung_vm_and_the_run_fails") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("hqdmux-cli-timeout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hang.toml");
    // The file allows a minute; the command line allows 200 ms.
    std::fs::write(
        &path,
        "[run]\ntimeout_ms = 60000\n[[vm]]\nname = \"stuck\"\nimage = \"builtin:fault\"\nargs = \"mode=hang\"\n[[vm]]\nname = \"fine\"\nimage = \"builtin:hello\"\n",
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    let out = hqdmux()
        .args(["run", "--timeout-ms", "200", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(t0.elapsed().as_secs() < 30, "the override applied");
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap()
            .to_owned()
    };
    assert!(row("stuck").ends_with("stopped: run timeout"), "{stdout}");
    assert!(row("fine").ends_with("exited with status 0"), "{stdout}");
}

#[test]
fn the_readme_main_job_boots_every_example_vm() {
    if !vmm::kvm_or_skip("the_readme_main_job_boots_every_example_vm") {
        return;
    }
    // The README's first command runs examples/gpu.toml; hello.toml is the
    // plain fleet without GPUs.
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        readme.contains("cargo run --release -- run examples/gpu.toml"),
        "README's main job"
    );
    for (example, names, gpu) in [
        (
            "examples/gpu.toml",
            &["training", "inference-a", "inference-b", "batch"][..],
            true,
        ),
        (
            "examples/hello.toml",
            &["inference", "training", "batch-a", "batch-b"][..],
            false,
        ),
    ] {
        let out = hqdmux()
            .args(["run", example])
            .current_dir(root())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{example}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for name in names {
            let greeting = format!("[{name}] hello from {name} (vm ");
            let line = stdout
                .lines()
                .find(|l| l.starts_with(&greeting))
                .unwrap_or_else(|| panic!("{example}: no greeting of {name}: {stdout}"));
            assert!(line.contains("args: ["), "{line}");
            if gpu {
                assert!(
                    stdout
                        .lines()
                        .any(|l| l.starts_with(&format!("[{name}] gpu: ")) && l.ends_with(": ok")),
                    "{example}: {name} verified its GPU work: {stdout}"
                );
            }
            let row = stdout
                .lines()
                .find(|l| l.starts_with(name) && l.contains("exited"))
                .unwrap();
            assert!(row.ends_with("exited with status 0"), "{row}");
        }
    }
}

#[test]
fn a_failing_vm_makes_the_run_exit_nonzero() {
    if !vmm::kvm_or_skip("a_failing_vm_makes_the_run_exit_nonzero") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("hqdmux-cli-fail-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("f.toml");
    std::fs::write(
        &path,
        "[[vm]]\nname = \"x\"\nimage = \"builtin:fault\"\nargs = \"mode=exit code=5\"\n",
    )
    .unwrap();
    let out = hqdmux()
        .args(["run", "--quiet", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 of 1 VMs failed"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("exited with status 5"));
}

#[test]
fn ctl_without_a_running_fleet_says_it_cannot_reach_the_socket() {
    let out = hqdmux()
        .args(["ctl", "/nonexistent/hqdmux.sock", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hqdmux ctl: cannot reach /nonexistent/hqdmux.sock"),
        "{err}"
    );
}
