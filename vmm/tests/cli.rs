//! The `hqdmux` binary as an operator runs it.

mod common;

use common::{hqdmux, refused, run_on, scratch, scratch_file, spawn_on, write_file};

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn bad_configs_are_rejected_with_file_vm_field_and_reason_and_nothing_runs() {
    let dir = scratch("cli");
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
        let path = write_file(&dir, file, text);
        for sub in ["run", "check"] {
            let out = run_on(&[sub], &path);
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
    let out = run_on(&["run"], &dir.join("missing.toml"));
    assert!(refused(&out).contains("missing.toml: cannot read"));
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
    let path = scratch_file(
        "cli-gpu",
        "cpx.toml",
        "[gpu]\npartition_mode = \"CPX\"\n[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\npartition = 5\n",
    );
    let out = run_on(&["check"], &path);
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
    for sub in [
        "run", "check", "images", "sim", "ps", "stats", "top", "set", "pause", "resume", "stop",
        "policy", "add",
    ] {
        assert!(commands.contains(&sub), "{sub} in {commands:?}");
    }
    for (sub, option) in [
        ("run", "--timeout-ms"),
        ("run", "--api-socket"),
        ("check", "<CONFIG>"),
        ("sim", "--scenario"),
        ("run", "--api-socket-mode"),
        ("run", "--json"),
        ("ps", "--api-socket"),
        ("top", "--once"),
        ("set", "--quantum-ms"),
        ("set", "--preempt-timeout-ms"),
        ("add", "<FILE>"),
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
    assert!(
        !commands.contains(&"ctl"),
        "the text protocol client is gone: {commands:?}"
    );
    let out = hqdmux().arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "unknown subcommand");
}

#[test]
fn version_names_the_commit_and_completions_cover_every_subcommand() {
    let out = hqdmux().arg("--version").output().unwrap();
    assert!(out.status.success());
    let v = String::from_utf8_lossy(&out.stdout);
    // `hqdmux 0.1.0 (commit 0123456789ab)`, or `unknown` without git.
    let commit = v
        .trim()
        .strip_prefix(concat!("hqdmux ", env!("CARGO_PKG_VERSION"), " (commit "))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{v}"));
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{v}"
    );
    for (shell, marker) in [
        ("bash", "_hqdmux()"),
        ("zsh", "#compdef hqdmux"),
        ("fish", "complete -c hqdmux"),
    ] {
        let out = hqdmux().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        for sub in ["run", "unquarantine", "timeline", "completions"] {
            assert!(script.contains(sub), "{shell} completes {sub}");
        }
    }
    let out = hqdmux().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "unknown shell");
}

#[test]
fn timeout_override_stops_a_hung_vm_and_the_run_fails() {
    if !vmm::kvm_or_skip("timeout_override_stops_a_hung_vm_and_the_run_fails") {
        return;
    }
    // The file allows an hour; the command line 5 s (a generous bound on
    // `fine`'s hello boot, which must end first to keep its result). The
    // override applied if the run ends before the hang guard kills it: no
    // duration is asserted.
    let path = scratch_file(
        "cli-timeout",
        "hang.toml",
        "[run]\ntimeout_ms = 3600000\n[[vm]]\nname = \"stuck\"\nimage = \"builtin:fault\"\nargs = \"mode=hang\"\n[[vm]]\nname = \"fine\"\nimage = \"builtin:hello\"\n",
    );
    let child = spawn_on(&["run", "--timeout-ms", "5000"], &path);
    let out = wait_or_kill(
        child,
        std::time::Duration::from_secs(300),
        "the override applied",
    );
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
    let path = scratch_file(
        "cli-fail",
        "f.toml",
        "[[vm]]\nname = \"x\"\nimage = \"builtin:fault\"\nargs = \"mode=exit code=5\"\n",
    );
    let out = run_on(&["run", "--quiet"], &path);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 of 1 VMs failed"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("exited with status 5"));
}

#[test]
fn clients_without_a_running_fleet_say_they_cannot_reach_the_socket() {
    for args in [
        vec!["ps"],
        vec!["stats", "a"],
        vec!["top", "--once"],
        vec!["set", "a", "--priority", "3"],
        vec!["pause", "a"],
        vec!["policy"],
        vec!["promise", "--window", "100ms"],
    ] {
        let out = hqdmux()
            .args(&args)
            .args(["--api-socket", "/nonexistent/hqdmux.sock"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "hqdmux {}: cannot reach /nonexistent/hqdmux.sock",
                args[0]
            )),
            "{err}"
        );
    }
}

#[test]
fn clients_without_api_socket_use_the_default_and_name_it_when_nothing_listens() {
    let dir = scratch("xdg");
    let xdg = dir.join("run");
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let expected = vmm::cli::default_api_socket_for(euid, Some(xdg.as_os_str())).unwrap();
    if std::os::unix::net::UnixStream::connect(&expected).is_ok() {
        eprintln!("a fleet serves {}: skipped", expected.display());
        return;
    }
    for args in [vec!["ps"], vec!["metrics"], vec!["stop", "a"]] {
        let out = hqdmux()
            .args(&args)
            .env("XDG_RUNTIME_DIR", &xdg)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.starts_with(&format!(
                "hqdmux {}: cannot reach {}: ",
                args[0],
                expected.display()
            )) && err.contains("hqdmux run FLEET.toml --api-socket"),
            "{err}"
        );
    }
    if euid != 0 {
        // A user without XDG_RUNTIME_DIR is told to set it or name a socket.
        let out = hqdmux()
            .arg("ps")
            .env_remove("XDG_RUNTIME_DIR")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("XDG_RUNTIME_DIR"));
    }
}

#[test]
fn values_the_api_refuses_are_refused_by_the_command_line_with_the_same_reason() {
    for (args, want) in [
        (
            vec!["set", "a", "--priority", "16"],
            "'16' for '--priority <PRIORITY>': 16 is out of range 0..=15",
        ),
        (
            vec!["set", "a", "--weight", "0"],
            "'0' for '--weight <WEIGHT>': 0 is out of range 1..=1000",
        ),
        (
            vec!["set", "a", "--quantum-ms", "10001"],
            "10001 is out of range 1..=10000",
        ),
        (
            vec!["set", "a", "--preempt-timeout-ms", "0"],
            "0 is out of range 1..=3600000",
        ),
        (
            vec!["set", "a", "--weight=-1"],
            "expected a non-negative integer",
        ),
        (
            vec!["promise", "--window", "50ms"],
            "'50ms' is out of range 100ms..=1h",
        ),
        (
            vec!["promise", "--window", "ten"],
            "'ten' is not a duration (10s, 500ms, 2m, 1h)",
        ),
        (
            vec!["policy", "lottery"],
            "unknown policy 'lottery' (one of: hqdmux, fifo, poll5ms, timeslice, reset)",
        ),
    ] {
        let out = hqdmux()
            .args(&args)
            .args(["--api-socket", "/nonexistent/hqdmux.sock"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            !err.contains("cannot reach"),
            "refused before any request: {err}"
        );
    }
    // `--quantum-ms 0` (back to the level's quantum) is a valid value: it
    // gets as far as the socket.
    let out = hqdmux()
        .args([
            "set",
            "a",
            "--quantum-ms",
            "0",
            "--api-socket",
            "/nonexistent/hqdmux.sock",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach"));
}

/// Waits for `child` (killing it and failing after `limit`: a hang guard,
/// not a performance assertion).
fn wait_or_kill(
    mut child: std::process::Child,
    limit: std::time::Duration,
    what: &str,
) -> std::process::Output {
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: still running after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// The summary row of VM `name`.
fn row<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name) && !l.starts_with('['))
        .unwrap_or_else(|| panic!("no summary row for {name}: {stdout}"))
}

/// The `gpu_time` column (ms) of a summary row.
fn gpu_time(row: &str) -> f64 {
    // vm entry_ms line_ms run_ms gpu_ms gpu_time preempt outcome...
    row.split_whitespace().nth(5).unwrap().parse().unwrap()
}

/// A fleet that runs until stopped: a hung CPU guest and a GPU guest whose
/// kernels take far longer than the test.
const ENDLESS: &str = "[run]\ntimeout_ms = 600000\n\
    [[vm]]\nname = \"stuck\"\nimage = \"builtin:fault\"\nargs = \"mode=hang\"\n\
    [[vm]]\nname = \"trainer\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\n\
    args = \"kernels=4 wgs=1216 cost_us=200000 loops=1000\"\n";

/// Starts `hqdmux run --api-socket` on [`ENDLESS`] and waits until its
/// control socket answers and `trainer` has been charged GPU time.
fn start_endless(dir: &std::path::Path) -> (std::process::Child, std::path::PathBuf) {
    let cfg = write_file(dir, "endless.toml", ENDLESS);
    let sock = dir.join("fleet.sock");
    let child = spawn_on(
        &["run", "--quiet", "--api-socket", sock.to_str().unwrap()],
        &cfg,
    );
    let t0 = std::time::Instant::now();
    loop {
        // Wait until the GPU guest has been charged GPU time (its kernels
        // are on the GPU): a state the host reports, not a guess of how
        // long the guest takes to boot.
        let out = hqdmux()
            .args(["ps", "--json", "--api-socket", sock.to_str().unwrap()])
            .output()
            .unwrap();
        let charged = out.status.success()
            && serde_json::from_slice::<serde_json::Value>(&out.stdout).is_ok_and(|v| {
                v["vms"].as_array().is_some_and(|vms| {
                    vms.iter().any(|vm| {
                        vm["name"] == "trainer"
                            && vm["gpu_time_ms"].as_f64().is_some_and(|t| t > 0.0)
                    })
                })
            });
        if charged {
            break;
        }
        assert!(
            t0.elapsed().as_secs() < 120,
            "the fleet never served its socket or never ran trainer's kernels"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (child, sock)
}

fn signal(child: &std::process::Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

#[test]
fn sigterm_and_sigint_stop_every_vm_print_the_summary_and_remove_the_socket() {
    if !vmm::kvm_or_skip("sigterm_and_sigint_stop_every_vm_print_the_summary_and_remove_the_socket")
    {
        return;
    }
    for (sig, code, name) in [
        (libc::SIGTERM, 143, "SIGTERM"),
        (libc::SIGINT, 130, "SIGINT"),
    ] {
        let dir = scratch(&format!("cli-sig{sig}"));
        let (child, sock) = start_endless(&dir);
        assert!(sock.exists());
        signal(&child, sig);
        let out = wait_or_kill(child, std::time::Duration::from_secs(60), name);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{name}: {stdout}\n{stderr}");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("vm ") && l.contains("gpu_time")),
            "{name}: summary header: {stdout}"
        );
        for vm in ["stuck", "trainer"] {
            let r = row(&stdout, vm);
            assert!(r.ends_with(&format!("stopped: {name}")), "{name}: {r}");
        }
        // The GPU VM keeps the GPU time it had when it was stopped.
        assert!(gpu_time(row(&stdout, "trainer")) > 0.0, "{stdout}");
        assert!(
            stderr.contains(&format!(
                "hqdmux: stopped by {name}: 2 of 2 VMs were still running"
            )),
            "{stderr}"
        );
        assert!(!sock.exists(), "{name}: the control socket was removed");
        // Scratch clean-up only: a failure here is no failure of the test.
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_second_signal_ends_the_process_at_once_without_a_summary() {
    if !vmm::kvm_or_skip("a_second_signal_ends_the_process_at_once_without_a_summary") {
        return;
    }
    let dir = scratch("cli-sig2");
    let (child, sock) = start_endless(&dir);
    // Two different signals (the same one would merge while pending): the
    // first delivered starts the graceful stop, the second ends the process.
    signal(&child, libc::SIGTERM);
    signal(&child, libc::SIGINT);
    let out = wait_or_kill(child, std::time::Duration::from_secs(60), "two signals");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        matches!(out.status.code(), Some(130) | Some(143)),
        "{:?}",
        out.status
    );
    assert!(
        !stdout.contains("gpu_time"),
        "no summary after the second signal: {stdout}"
    );
    // One line says so, and the socket is gone all the same.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("hqdmux: second SIG"))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].ends_with("exiting at once, no summary"), "{stderr}");
    assert!(!sock.exists(), "the second signal removed the socket");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A stdout whose reader is gone: every write fails with EPIPE.
fn broken_pipe() -> std::process::Stdio {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two new descriptors; the read end is closed at
    // once, the write end is owned by the returned Stdio.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        libc::close(fds[0]);
        std::process::Stdio::from(std::os::fd::OwnedFd::from_raw_fd(fds[1]))
    }
}

/// `hqdmux ARGS --api-socket SOCK`.
fn client(args: &[&str], sock: &std::path::Path) -> std::process::Output {
    hqdmux()
        .args(args)
        .args(["--api-socket", sock.to_str().unwrap()])
        .output()
        .unwrap()
}

#[test]
fn operator_stops_are_not_failures_stop_and_pause_are_idempotent_and_closed_outputs_do_not_panic() {
    if !vmm::kvm_or_skip("operator_stops_are_not_failures_stop_and_pause_are_idempotent_and_closed_outputs_do_not_panic") {
        return;
    }
    let dir = scratch("cli-lifecycle");
    let (child, sock) = start_endless(&dir);
    let s = sock.to_str().unwrap();

    // A reader that went away (`| head`): quiet, exit 0, no panic.
    for args in [
        vec!["ps", "--json"],
        vec!["ps"],
        vec!["stats"],
        vec!["top", "--once"],
    ] {
        let out = hqdmux()
            .args(&args)
            .args(["--api-socket", s])
            .stdout(broken_pipe())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
    // A full disk: one line, exit 2, no panic.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = hqdmux()
        .args(["ps", "--api-socket", s])
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("hqdmux: cannot write the output: "),
        "{stderr}"
    );

    // `set` sends a typed update: values, and `--quantum-ms 0` as `null`.
    for (args, prio, over) in [
        (vec!["--priority", "4", "--quantum-ms", "8"], 4, true),
        (vec!["--weight", "3", "--quantum-ms", "0"], 4, false),
    ] {
        let mut a = vec!["set", "trainer", "--json"];
        a.extend(args);
        let out = client(&a, &sock);
        assert_eq!(out.status.code(), Some(0), "{a:?}: {out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["priority"], prio, "{v}");
        assert_eq!(v["quantum_override"], over, "{v}");
    }

    // Pause, resume and stop twice: the second asks for the state the VM
    // is in and is answered 200 too (exit 0).
    for action in ["pause", "pause", "resume", "resume"] {
        let out = client(&[action, "trainer", "--json"], &sock);
        assert_eq!(out.status.code(), Some(0), "{action}: {out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let want = if action == "pause" {
            "paused"
        } else {
            "running"
        };
        assert_eq!(v["state"], want, "{action}: {v}");
    }
    for _ in 0..2 {
        let out = client(&["stop", "stuck", "--json"], &sock);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["state"], "stopped", "{v}");
        assert_eq!(v["outcome"], "stopped: by the operator", "{v}");
    }
    // Stopping the last VM ends the run; operator stops are no failure.
    let out = client(&["stop", "trainer"], &sock);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = wait_or_kill(child, std::time::Duration::from_secs(60), "last stop");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    for vm in ["stuck", "trainer"] {
        assert!(
            row(&stdout, vm).ends_with("stopped: by the operator"),
            "{stdout}"
        );
    }
    assert!(!stderr.contains("failed"), "{stderr}");
    assert!(!sock.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_gpu_vm_stopped_by_the_run_timeout_says_so_and_keeps_its_gpu_figures() {
    if !vmm::kvm_or_skip("a_gpu_vm_stopped_by_the_run_timeout_says_so_and_keeps_its_gpu_figures") {
        return;
    }
    let dir = scratch("cli-gputimeout");
    let cfg = write_file(&dir, "endless.toml", ENDLESS);
    // Long enough that the trainer has run on the GPU by then however
    // loaded the host (a generous bound, not a race).
    let child = spawn_on(&["run", "--quiet", "--timeout-ms", "5000"], &cfg);
    let out = wait_or_kill(child, std::time::Duration::from_secs(60), "run timeout");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let r = row(&stdout, "trainer");
    assert!(r.ends_with("stopped: run timeout"), "{r}");
    assert!(gpu_time(r) > 0.0, "{r}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn devices_fifos_and_oversized_images_are_refused_without_reading_them() {
    let dir = scratch("cli-images");
    let fifo = dir.join("fifo.elf");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // 4 GiB, sparse: larger than any VM's RAM.
    let big = dir.join("big.elf");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    // 100 MiB of non-ELF in a VM big enough to hold it: refused by its magic.
    let text = dir.join("text.elf");
    std::fs::File::create(&text)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    for (image, mem, want) in [
        (
            "/dev/zero",
            16,
            "field `image`: /dev/zero: is a character device, not a regular file",
        ),
        ("fifo.elf", 16, "fifo.elf: is a FIFO, not a regular file"),
        (
            "big.elf",
            16,
            "big.elf: 4294967296 bytes is larger than the VM's 16777216-byte RAM",
        ),
        (
            "text.elf",
            256,
            "text.elf: not an ELF file (bad magic), first bytes [00, 00, 00, 00]",
        ),
    ] {
        let cfg = write_file(
            &dir,
            "fleet.toml",
            format!("[[vm]]\nname = \"v\"\nimage = \"{image}\"\nmemory_mib = {mem}\n"),
        );
        for sub in ["check", "run"] {
            let child = spawn_on(&[sub], &cfg);
            let out = wait_or_kill(child, std::time::Duration::from_secs(30), image);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{sub} {image}: {stderr}");
            assert!(
                stderr.contains("vm 'v' (vm[0]): field `image`: ") && stderr.contains(want),
                "{sub} {image}: wanted {want:?} in {stderr}"
            );
            assert!(out.stdout.is_empty(), "{sub} {image}: nothing launched");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn timeout_option_is_validated_as_the_config_field_is() {
    let dir = scratch("cli-timeout0");
    let cfg = write_file(
        &dir,
        "zero.toml",
        "[run]\ntimeout_ms = 0\n[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\n",
    );
    let file_err = refused(&run_on(&["check"], &cfg));
    let reason = file_err
        .trim()
        .split("field `run.timeout_ms`: ")
        .nth(1)
        .unwrap_or_else(|| panic!("{file_err}"))
        .to_owned();
    for bad in ["0", "2592000001", "-5", "soon"] {
        let opt = hqdmux()
            .args(["run", &format!("--timeout-ms={bad}"), "examples/hello.toml"])
            .current_dir(root())
            .output()
            .unwrap();
        assert_eq!(opt.status.code(), Some(2), "--timeout-ms {bad}");
        assert!(opt.stdout.is_empty(), "nothing ran");
        let opt_err = String::from_utf8_lossy(&opt.stderr);
        assert!(opt_err.contains("--timeout-ms"), "{opt_err}");
        if bad == "0" {
            assert!(
                opt_err.contains(&reason),
                "same reason {reason:?}: {opt_err}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_refuses_a_fleet_this_host_cannot_start() {
    let dir = scratch("cli-fleet10k");
    let mut text = String::new();
    for i in 0..10_000 {
        text += &format!("[[vm]]\nname = \"vm{i}\"\nimage = \"builtin:hello\"\n");
    }
    let path = write_file(&dir, "10k.toml", &text);
    // The prediction the binary must act on, with the limit it will have.
    let cfg = vmm::config::FleetConfig::load(&path).unwrap();
    vmm::config::raise_open_files_limit().unwrap();
    let host = vmm::config::HostLimits::probe();
    let need = cfg.needs();
    assert!(need.open_files > 10_000 * 5, "{need:?}");
    assert_eq!(need.memory_bytes, 10_000 * (16 << 20));
    let expect_refusal = need.open_files > host.open_files
        || host.mem_available.is_some_and(|m| need.memory_bytes > m);
    let out = run_on(&["check"], &path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if expect_refusal {
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "{}: cannot start on this host: 10000 VMs",
                path.display()
            )),
            "{stderr}"
        );
        assert!(
            stderr.contains("open files") || stderr.contains("MiB of guest RAM"),
            "{stderr}"
        );
        // `run` refuses it the same way, before launching anything.
        let out = run_on(&["run"], &path);
        assert_eq!(out.status.code(), Some(2));
        assert!(out.stdout.is_empty());
    } else {
        assert!(out.status.success(), "{stderr}");
    }
    // A small fleet passes and prints its predicted needs.
    let out = hqdmux()
        .args(["check", "examples/hello.toml"])
        .current_dir(root())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(stdout.contains("host: needs about "), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn images_write_puts_a_pvh_bootable_elf_in_the_file_and_refuses_unknown_names() {
    let dir = scratch("images-write");
    let file = dir.join("gpu.elf");
    let out = hqdmux()
        .args(["images", "--write", "builtin:gpu", "-o"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read(&file).unwrap();
    assert_eq!(
        written,
        images::builtin("gpu").unwrap(),
        "the embedded bytes"
    );
    // Parsed from the file: the PVH note names the 32-bit stub (cli; cld),
    // and the own-VMM entry stays at 1 MiB.
    let pvh = images::elf::pvh_entry(&written).unwrap();
    assert_eq!(
        images::elf::bytes_at(&written, pvh, 2),
        Some(&[0xFA, 0xFC][..])
    );
    assert_eq!(images::elf::entry(&written), Ok(0x10_0000));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("PVH entry {pvh:#x}")), "{stdout}");
    // A bare name works too; an unknown one and a missing -o are usage errors.
    let out = hqdmux()
        .args(["images", "--write", "hello", "-o"])
        .arg(dir.join("hello.elf"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = hqdmux()
        .args(["images", "--write", "builtin:nope", "-o"])
        .arg(dir.join("nope.elf"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("builtin:hello"));
    assert!(!dir.join("nope.elf").exists());
    let out = hqdmux()
        .args(["images", "--write", "builtin:gpu"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "--write needs -o");
    let out = hqdmux()
        .args(["images", "--write", "builtin:gpu", "-o"])
        .arg(dir.join("no-such-dir/gpu.elf"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "unwritable path");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn images_describes_every_image_and_its_arguments_and_help_mentions_rust_log() {
    let out = hqdmux().arg("images").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for name in images::names() {
        let info = images::describe(name).unwrap();
        assert!(
            text.contains(&format!("builtin:{name}\n  {}", info.summary)),
            "{text}"
        );
        for (key, _) in info.args {
            assert!(text.contains(key), "{name} {key}: {text}");
        }
    }
    for key in [
        "queues=Q",
        "kernels=N",
        "wgs=W",
        "cost_us=C",
        "loops=L",
        "bad=KIND",
    ] {
        assert!(text.contains(key), "{key}");
    }
    let out = hqdmux().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("RUST_LOG"), "{help}");
    assert!(help.contains("130/143"), "{help}");
    let out = hqdmux().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for column in [
        "entry_ms",
        "line_ms",
        "run_ms",
        "gpu_ms p50/max",
        "gpu_time",
        "preempt",
        "RUST_LOG",
    ] {
        assert!(
            help.contains(column),
            "run --help explains {column}: {help}"
        );
    }
}

#[test]
fn run_refuses_to_replace_a_file_at_the_api_socket_path_before_building_vms() {
    let dir = scratch("cli-sockfile");
    let cfg = write_file(
        &dir,
        "f.toml",
        "[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\n",
    );
    let precious = write_file(&dir, "precious.txt", "keep me");
    let out = run_on(
        &["run", "--quiet", "--api-socket", precious.to_str().unwrap()],
        &cfg,
    );
    assert_eq!(out.status.code(), Some(2), "a launch that failed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("exists and is not a socket; refusing to replace it"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
    assert!(String::from_utf8_lossy(&out.stdout).is_empty(), "no VM ran");
    let out = run_on(
        &[
            "run",
            "--api-socket-mode",
            "999",
            "--api-socket",
            "/tmp/x.sock",
        ],
        &cfg,
    );
    assert_eq!(out.status.code(), Some(2), "a mode that is not octal");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn run_json_prints_the_summary_as_json() {
    if !vmm::kvm_or_skip("run_json_prints_the_summary_as_json") {
        return;
    }
    let dir = scratch("cli-runjson");
    let cfg = write_file(
        &dir,
        "f.toml",
        "[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\n\
         [[vm]]\nname = \"b\"\nimage = \"builtin:hello\"\nargs = \"exit=3\"\n",
    );
    let out = run_on(&["run", "--quiet", "--json"], &cfg);
    assert_eq!(out.status.code(), Some(1), "b exits 3");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(v["vms"][0]["name"], "a");
    assert_eq!(v["vms"][0]["exit_status"], 0);
    assert_eq!(v["vms"][1]["exit_status"], 3);
    assert_eq!(v["vms"][1]["outcome"], "exited with status 3");
    assert_eq!(v["all_succeeded"], false);
    assert!(v["vms"][0]["run_ms"].as_f64().unwrap() > 0.0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--log-format json` (a global option, before or after the subcommand):
/// every stderr line of `serve` is one JSON object with `ts`, `level`,
/// `target`, `msg`, and `vm` for a line about a vGPU.
#[test]
fn json_logs_are_one_object_per_line_naming_the_vm() {
    use std::io::BufRead;
    let dir = scratch("jsonlog");
    let devices = write_file(
        &dir,
        "devices.toml",
        "[[vgpu]]\nname = \"alpha\"\nsocket = \"alpha.sock\"\npriority = 2\n",
    );
    for args in [
        vec!["--log-format", "json", "serve"],
        vec!["serve", "--log-format", "json"],
    ] {
        let mut child = hqdmux()
            .args(&args)
            .arg(&devices)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        // Blocks until the daemon logs that it serves the vGPU.
        let mut seen = Vec::new();
        let serving = loop {
            let line = lines.next().expect("serve logs before it ends").unwrap();
            let v: serde_json::Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            for key in ["ts", "level", "target", "msg"] {
                assert!(v[key].is_string(), "{key} in {line}");
            }
            let ts = v["ts"].as_str().unwrap();
            assert!(ts.ends_with('Z') && ts.contains('T'), "RFC 3339 UTC: {ts}");
            seen.push(line.clone());
            if v["msg"].as_str().unwrap().contains("serving vfio-user") {
                break v;
            }
        };
        assert_eq!(serving["level"], "INFO", "{seen:?}");
        assert_eq!(serving["vm"], "alpha", "{seen:?}");
        signal(&child, libc::SIGTERM);
        // The rest, up to the end, is JSON too.
        for line in lines {
            let line = line.unwrap();
            assert!(
                serde_json::from_str::<serde_json::Value>(&line).is_ok(),
                "{line}"
            );
        }
        assert_eq!(child.wait().unwrap().code(), Some(143));
    }
}

/// `hqdmux man`: a roff page from the clap definition naming every
/// subcommand `--help` lists; `hqdmux man SUB` is that subcommand's page.
#[test]
fn the_man_page_lists_every_subcommand_and_each_has_a_page() {
    let out = hqdmux().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 18, "{commands:?}");
    let out = hqdmux().arg("man").output().unwrap();
    assert!(out.status.success());
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.contains(".TH hqdmux 1"), "{page}");
    for section in [".SH NAME", ".SH SYNOPSIS", ".SH OPTIONS", ".SH SUBCOMMANDS"] {
        assert!(page.contains(section), "{section}");
    }
    // roff escapes '-' as '\-'.
    assert!(page.contains("\\-\\-log\\-format"), "{page}");
    for sub in &commands {
        let name = sub.replace('-', "\\-");
        assert!(
            page.contains(&format!("hqdmux\\-{name}(1)")),
            "{sub} in the page"
        );
        let out = hqdmux().args(["man", sub]).output().unwrap();
        assert!(out.status.success(), "man {sub}");
        let sub_page = String::from_utf8(out.stdout).unwrap();
        assert!(
            sub_page.contains(&format!(".TH hqdmux-{sub} 1")),
            "{sub}: {sub_page}"
        );
    }
    let out = hqdmux().args(["man", "run"]).output().unwrap();
    let run = String::from_utf8_lossy(&out.stdout);
    assert!(run.contains("\\-\\-api\\-socket") && run.contains("\\-\\-timeout\\-ms"));
    let out = hqdmux().args(["man", "nosuch"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no subcommand 'nosuch'"));
}
