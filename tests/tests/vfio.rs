//! End-to-end over vfio-user (issue 19): `hqdmux serve` in a separate
//! process owns the GPU and serves two vGPUs of different priorities; two
//! `builtin:gpu` guests in hqdmux's own VMM attach to them over their
//! sockets, run their kernels, and the lower one is preempted.
//!
//! The server process is this test binary re-run on the
//! `serve_child_process` test with `HQDMUX_SERVE_CHILD` set (it serves until
//! SIGTERM). Waits have deadlines against hangs; nothing asserts on time.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hqdmux_tests::{config, kvm_or_skip, run, scratch_dir, LiveFleet};

const CHILD_ENV: &str = "HQDMUX_SERVE_CHILD";

/// Not a test on its own: the server side when re-run with [`CHILD_ENV`].
#[test]
fn serve_child_process() {
    let Ok(devices) = std::env::var(CHILD_ENV) else {
        return;
    };
    let stop = vmm::signals::install().expect("signal handlers");
    let cfg = vmm::serve::DevicesConfig::load(Path::new(&devices)).expect("devices file");
    let api = Path::new(&devices).with_file_name("api.sock");
    let r = vmm::serve::run_serve(
        &cfg,
        vmm::serve::ServeOptions {
            api_socket: Some(api),
            api_socket_mode: None,
            vgpu_socket_dir: None,
            stop: Some(stop),
        },
    )
    .expect("serve");
    for (name, s) in &r.vgpus {
        println!(
            "SERVED {name} connections={} dropped={}",
            s.connections, s.dropped
        );
    }
    println!("SERVED gpu completions={}", r.gpu.completions);
    for (id, g) in &r.gpus {
        println!("SERVED gpu {id} completions={}", g.completions);
    }
    if let Some(f) = &r.vms {
        for (i, v) in f.vms.iter().enumerate() {
            for l in &v.console {
                println!("SERVED-VM {}: {l}", v.name);
            }
            println!("SERVED-VM {} failed={}", v.name, f.failed(i));
            println!("SERVED-VM {} outcome={}", v.name, v.outcome);
        }
    }
    std::process::exit(0);
}

struct Server {
    child: Option<Child>,
    api: PathBuf,
}

impl Server {
    /// The server for test `test` on `devices`, in a fresh scratch folder
    /// named `scratch` (also returned); `None` when KVM is not there (the
    /// test is skipped).
    fn for_test(test: &str, scratch: &str, devices: &str) -> Option<(PathBuf, Server)> {
        if !kvm_or_skip(test) {
            return None;
        }
        let dir = scratch_dir(scratch);
        let srv = Server::start(&dir, devices);
        Some((dir, srv))
    }

    fn start(dir: &Path, vgpus: &str) -> Server {
        let devices = dir.join("devices.toml");
        std::fs::write(&devices, vgpus).unwrap();
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "serve_child_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &devices)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let s = Server {
            child: Some(child),
            api: dir.join("api.sock"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while UnixStream::connect(&s.api).is_err() {
            assert!(Instant::now() < deadline, "serve did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
        s
    }

    /// Sends one whole HTTP `request` to the API socket; the whole response.
    fn http(&self, request: &str) -> String {
        let mut c = UnixStream::connect(&self.api).unwrap();
        c.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    }

    fn get(&self, path: &str) -> String {
        self.http(&format!(
            "GET {path} HTTP/1.1\r\nHost: hqdmux\r\nConnection: close\r\n\r\n"
        ))
    }

    /// `POST path` with a TOML body; the whole response.
    fn post_toml(&self, path: &str, body: &str) -> String {
        self.http(&format!(
            "POST {path} HTTP/1.1\r\nHost: hqdmux\r\nConnection: close\r\n\
             Content-Type: application/toml\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ))
    }

    /// The JSON body of `GET path`.
    fn json(&self, path: &str) -> serde_json::Value {
        let r = self.get(path);
        let b = r.split("\r\n\r\n").nth(1).unwrap_or_default();
        serde_json::from_str(b).unwrap_or_else(|e| panic!("{path}: {e}: {r}"))
    }

    fn metrics(&self) -> String {
        self.get("/metrics")
    }

    /// GPU packets completed (`GET /api/v1/fleet`).
    fn completions(&self) -> u64 {
        let v = self.json("/api/v1/fleet");
        v["gpu"]["completions"]
            .as_u64()
            .unwrap_or_else(|| panic!("{v}"))
    }

    /// Waits until `vm`'s busy time on the GPU is above 0 (it reached the
    /// GPU); a hang guard fails the test past `deadline`.
    fn wait_on_gpu(&self, vm: &str, deadline: Instant) {
        while metric(&self.metrics(), "hqdmux_vm_gpu_busy_seconds_total", vm) <= 0.0 {
            assert!(Instant::now() < deadline, "{vm} never reached the GPU");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGTERM; the server's closing report.
    fn stop(mut self) -> String {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill with the pid of our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert!(child.wait().unwrap().success(), "{out}");
        out
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A `builtin:gpu` VM attached to the vGPU at `socket`.
fn remote_vm(name: &str, socket: &str, args: &str) -> String {
    format!(
        "[[vm]]\nname = \"{name}\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = {{ socket = \"{socket}\" }}\nargs = \"{args}\"\n"
    )
}

fn metric(text: &str, name: &str, vm: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{vm=\"{vm}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The first VM of `r` printed `line` on its console.
fn first_vm_printed(r: &vmm::fleet::FleetReport, line: &str) {
    assert!(
        r.vms[0].console.iter().any(|l| l == line),
        "{:?}",
        r.vms[0].console
    );
}

/// GPU `id`'s completed packets in the server's closing report `out`.
fn served_completions(out: &str, id: u32) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("SERVED gpu {id} completions=")))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no GPU {id}: {out}"))
}

/// In the metrics `m`, `training` was preempted at least once and
/// `inference` never.
fn training_preempted_by_inference(m: &str) {
    assert!(
        metric(m, "hqdmux_vm_preemptions_total", "training") >= 1.0,
        "training preempted:\n{m}"
    );
    assert_eq!(metric(m, "hqdmux_vm_preemptions_total", "inference"), 0.0);
}

#[test]
fn two_guests_share_a_gpu_served_by_another_process_and_the_lower_one_is_preempted() {
    let Some((dir, srv)) = Server::for_test(
        "two_guests_share_a_gpu_served_by_another_process_and_the_lower_one_is_preempted",
        "vfio-two",
        "[[vgpu]]\nname = \"training\"\nsocket = \"training.sock\"\npriority = 2\n\
         [[vgpu]]\nname = \"inference\"\nsocket = \"inference.sock\"\npriority = 12\n",
    ) else {
        return;
    };
    // Training runs 1000-s workgroups with save points that never end on
    // their own, in a fleet of its own with an API socket. Once the server
    // sees it on the GPU, inference's VM starts: its jobs can only run by
    // preempting training, however slowly either guest runs; then the
    // operator stops training (both VMs are in this process's VMM, the GPU
    // in the server's).
    let training = LiveFleet::start(
        &dir,
        &remote_vm(
            "training",
            "training.sock",
            "kernels=1 wgs=1216 cost_us=1000000000",
        ),
    );
    srv.wait_on_gpu("training", Instant::now() + Duration::from_secs(120));
    let inference = run(&config(
        &dir,
        &remote_vm(
            "inference",
            "inference.sock",
            "kernels=2 wgs=304 cost_us=500 loops=25",
        ),
    ));
    training_preempted_by_inference(&srv.metrics());
    training.stop("training");
    let training = training.join();
    assert_eq!(training.operator_stopped, vec![true]);
    for r in [&training, &inference] {
        assert!(r.all_succeeded(), "{}", r.summary());
        assert!(r.gpu.is_none(), "no GPU in the VMM's process");
    }
    first_vm_printed(
        &inference,
        "gpu: 1 queues x 2 kernels x 304 wgs x 25 loops: ok",
    );
    // The vGPU outlives its VM: the next VM on the same socket runs too.
    let again = run(&config(
        &dir,
        &remote_vm(
            "inference",
            "inference.sock",
            "kernels=1 wgs=64 cost_us=100",
        ),
    ));
    assert!(again.all_succeeded(), "{}", again.summary());
    // Every packet completed exactly once: 2 x 25 + 1 (training's one
    // kernel was stopped, never completed).
    assert_eq!(srv.completions(), 51);
    // A VM stopped mid-kernel (its fleet's run timeout) loses its queues
    // while another process's VM on the other vGPU keeps running: that one
    // completes every kernel exactly once (its guest checks), and the
    // stopped one's vGPU then takes a new VM.
    let other = {
        let cfg = config(
            &dir,
            &remote_vm(
                "inference",
                "inference.sock",
                "kernels=2 wgs=304 cost_us=500 loops=10",
            ),
        );
        std::thread::spawn(move || run(&cfg))
    };
    let cut = run(&config(
        &dir,
        &[
            "[run]\ntimeout_ms = 300\n".to_string(),
            remote_vm(
                "training",
                "training.sock",
                "kernels=4 wgs=1216 cost_us=50000",
            ),
        ]
        .concat(),
    ));
    assert!(cut.timed_out && !cut.all_succeeded(), "{}", cut.summary());
    let other = other.join().unwrap();
    assert!(other.all_succeeded(), "{}", other.summary());
    let after = run(&config(
        &dir,
        &[
            remote_vm("training", "training.sock", "kernels=1 wgs=64 cost_us=100"),
            remote_vm(
                "inference",
                "inference.sock",
                "kernels=1 wgs=64 cost_us=100",
            ),
        ]
        .concat(),
    ));
    assert!(after.all_succeeded(), "{}", after.summary());
    let out = srv.stop();
    assert!(
        out.contains("SERVED inference connections=4 dropped=0"),
        "{out}"
    );
    assert!(
        out.contains("SERVED training connections=3 dropped=0"),
        "{out}"
    );
}

/// Issue 19: a devices file's `[[vm]]` boots in the daemon's own VMM on
/// the arbiter of the GPU that serves the `[[vgpu]]`, is listed beside
/// it, and ending does not end the daemon: the vGPU still takes a client,
/// and SIGTERM ends the daemon. Waits are on states, with hang guards.
#[test]
fn a_devices_file_vm_boots_in_the_daemon_which_serves_on_after_it_ends() {
    let Some((dir, srv)) = Server::for_test(
        "a_devices_file_vm_boots_in_the_daemon_which_serves_on_after_it_ends",
        "vfio-serve-vm",
        "[[vgpu]]\nname = \"remote\"\nsocket = \"remote.sock\"\n\
         [[vm]]\nname = \"local\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\n\
         args = \"kernels=2 wgs=304 cost_us=500 loops=2\"\n",
    ) else {
        return;
    };
    // Waits until VM `i` of `GET /api/v1/vms` (named `name`) has exited.
    let exited = |i: usize, name: &str| {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let vms = srv.json("/api/v1/vms");
            let list = vms["vms"].as_array().expect("vms");
            assert_eq!(list.len(), i + 1, "{vms}");
            assert_eq!(list[i]["name"], name, "{vms}");
            let state = list[i]["state"].as_str().unwrap_or_default().to_owned();
            if state == "exited" {
                return list[i].clone();
            }
            assert!(["starting", "running"].contains(&state.as_str()), "{vms}");
            assert!(Instant::now() < deadline, "{name} never ended: {vms}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let local = exited(0, "local");
    assert_eq!(local["gpu_id"], 0, "{local}");
    assert_eq!(local["exit_status"], 0, "{local}");
    // The daemon's VMM takes VMs live after its last one ended; a VM may
    // not take a vGPU's name.
    let r = srv.post_toml(
        "/api/v1/vms",
        "name = \"remote\"\nimage = \"builtin:hello\"\n",
    );
    assert!(
        r.starts_with("HTTP/1.1 409") && r.contains("a vGPU of this daemon has it"),
        "{r}"
    );
    let r = srv.post_toml(
        "/api/v1/vms",
        "name = \"late\"\nimage = \"builtin:hello\"\n",
    );
    assert!(r.starts_with("HTTP/1.1 201"), "{r}");
    let late = exited(1, "late");
    assert_eq!(late["exit_status"], 0, "{late}");
    // The daemon outlives its VM: the vGPU is listed and takes a client.
    let vgpus = srv.json("/api/v1/vgpus");
    assert_eq!(vgpus["vgpus"][0]["name"], "remote", "{vgpus}");
    let r = run(&config(
        &dir,
        &remote_vm("remote", "remote.sock", "kernels=1 wgs=64 cost_us=100"),
    ));
    assert!(r.all_succeeded(), "{}", r.summary());
    let out = srv.stop();
    assert!(
        out.contains("SERVED-VM local: gpu: 1 queues x 2 kernels x 304 wgs x 2 loops: ok"),
        "{out}"
    );
    assert!(out.contains("SERVED-VM local failed=false"), "{out}");
    assert!(
        out.contains("SERVED remote connections=1 dropped=0"),
        "{out}"
    );
    // One arbiter served both: GPU 0 completed the daemon VM's 2 x 2
    // kernels and the client's one, each exactly once.
    assert_eq!(served_completions(&out, 0), 5, "{out}");
}

/// Issue 19: a daemon VM and a served vGPU on one GPU share its arbiter:
/// the vGPU's higher-priority client can only run its jobs by preempting
/// the daemon VM's kernel that never ends on its own, whatever the speed
/// of either guest; SIGTERM then stops the daemon VM still running.
#[test]
fn a_served_vgpu_preempts_a_daemon_vm_of_lower_priority() {
    let Some((dir, srv)) = Server::for_test(
        "a_served_vgpu_preempts_a_daemon_vm_of_lower_priority",
        "vfio-serve-vm-preempt",
        "[[vgpu]]\nname = \"inference\"\nsocket = \"inference.sock\"\npriority = 12\n\
         [[vm]]\nname = \"training\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\n\
         priority = 2\nargs = \"kernels=1 wgs=1216 cost_us=1000000000\"\n",
    ) else {
        return;
    };
    srv.wait_on_gpu("training", Instant::now() + Duration::from_secs(120));
    let inference = run(&config(
        &dir,
        &remote_vm(
            "inference",
            "inference.sock",
            "kernels=2 wgs=304 cost_us=500 loops=5",
        ),
    ));
    assert!(inference.all_succeeded(), "{}", inference.summary());
    training_preempted_by_inference(&srv.metrics());
    let out = srv.stop();
    assert!(
        out.contains("SERVED-VM training outcome=stopped: SIGTERM"),
        "{out}"
    );
    // Inference's 2 x 5 kernels, each exactly once; training's one
    // kernel was stopped, never completed.
    assert!(out.contains("SERVED gpu 0 completions=10"), "{out}");
}

/// `hqdmux serve` with two `[[gpu]]` entries (issue 20): each vGPU is
/// served by its own GPU's arbiter, its series carry that GPU's id, and
/// each GPU completed exactly its own VM's packets.
#[test]
fn a_server_with_two_gpus_serves_each_vgpu_on_its_own_gpu() {
    let Some((dir, srv)) = Server::for_test(
        "a_server_with_two_gpus_serves_each_vgpu_on_its_own_gpu",
        "vfio-two-gpus",
        "[[gpu]]\nid = 0\n[[gpu]]\nid = 1\npartition_mode = \"DPX\"\n\
         [[vgpu]]\nname = \"a\"\nsocket = \"a.sock\"\ngpu_id = 0\n\
         [[vgpu]]\nname = \"b\"\nsocket = \"b.sock\"\ngpu_id = 1\n",
    ) else {
        return;
    };
    let r = run(&config(
        &dir,
        &[
            remote_vm("a", "a.sock", "kernels=2 wgs=304 cost_us=500 loops=2"),
            remote_vm("b", "b.sock", "kernels=3 wgs=152 cost_us=500 loops=2"),
        ]
        .concat(),
    ));
    assert!(r.all_succeeded(), "{}", r.summary());
    let m = srv.metrics();
    let gpu_of = |vm: &str| -> Vec<String> {
        m.lines()
            .filter(|l| !l.starts_with('#') && l.contains(&format!("vm=\"{vm}\"")))
            .filter_map(|l| {
                let (_, rest) = l.split_once("gpu_id=\"")?;
                Some(rest.split_once('"')?.0.to_owned())
            })
            .collect()
    };
    let (a, b) = (gpu_of("a"), gpu_of("b"));
    assert!(!a.is_empty() && a.iter().all(|g| g == "0"), "{m}");
    assert!(!b.is_empty() && b.iter().all(|g| g == "1"), "{m}");
    assert!(
        m.lines()
            .any(|l| l.starts_with("hqdmux_hqd_slots{gpu_id=\"1\",gpu_partition_id=\"1\""))
            && m.contains("gpu_compute_partition_type=\"DPX\""),
        "GPU 1 in DPX:\n{m}"
    );
    let out = srv.stop();
    // Each GPU completed its own VM's kernels: 2 x 2 on GPU 0, 3 x 2 on
    // GPU 1 (plus each guest's own mark packets, on its own GPU).
    let (g0, g1) = (served_completions(&out, 0), served_completions(&out, 1));
    assert!(g0 >= 4 && g1 >= 6, "{out}");
    assert!(g1 > g0, "b submits more than a: {out}");
}

/// Issue 19: a VM whose vGPU server goes away (the vGPU removed through the
/// server's API, then the whole server killed) stops with `device lost`
/// naming the socket, instead of waiting forever on a device that can no
/// longer answer. The guests' kernels never end on their own, so only the
/// loss can end these VMs; the waits are on states, with hang guards.
#[test]
fn a_vm_whose_vgpu_server_goes_away_stops_with_device_lost() {
    let Some((dir, mut srv)) = Server::for_test(
        "a_vm_whose_vgpu_server_goes_away_stops_with_device_lost",
        "vfio-lost",
        "[[vgpu]]\nname = \"a\"\nsocket = \"a.sock\"\n\
         [[vgpu]]\nname = \"b\"\nsocket = \"b.sock\"\n",
    ) else {
        return;
    };
    let forever = "kernels=1 wgs=1216 cost_us=1000000000";
    let fleet = LiveFleet::start(
        &dir,
        &[
            remote_vm("a", "a.sock", forever),
            remote_vm("b", "b.sock", forever),
        ]
        .concat(),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    for vm in ["a", "b"] {
        srv.wait_on_gpu(vm, deadline);
    }
    let (st, v) = vmm::api::request(&srv.api, "DELETE", "/api/v1/vgpus/a", None).unwrap();
    assert_eq!(st, 200, "{v}");
    let a = fleet.wait_ended("a");
    let outcome = a["outcome"].as_str().unwrap_or_default();
    assert!(
        outcome.starts_with("device lost:") && outcome.contains("a.sock"),
        "{a}"
    );
    // b's vGPU is untouched: its VM keeps running until the server dies.
    let b = fleet.api("GET", "/api/v1/vms/b", None, 200);
    assert!(b["outcome"].is_null(), "{b}");
    let mut child = srv.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    // b was the fleet's last VM: the fleet ends with it.
    let r = fleet.join();
    assert!(!r.all_succeeded(), "{}", r.summary());
    assert_eq!(
        r.summary()
            .matches("device lost: the vGPU server at")
            .count(),
        2,
        "{}",
        r.summary()
    );
    for (v, sock) in r.vms.iter().zip(["a.sock", "b.sock"]) {
        assert!(
            matches!(&v.outcome, vmm::vm::VmOutcome::DeviceLost(why) if why.contains(sock)),
            "{}: {}",
            v.name,
            v.outcome
        );
    }
}

/// Issue 19: a vGPU served with `doorbell_page = true` has its BAR2 page
/// mapped into the guest by hqdmux's VMM: the guest's doorbells are plain
/// stores the server's poller notices (none goes over the socket), and
/// every kernel completes.
#[test]
fn a_guest_rings_its_doorbells_through_the_mapped_page() {
    let Some((dir, srv)) = Server::for_test(
        "a_guest_rings_its_doorbells_through_the_mapped_page",
        "vfio-page",
        "[[vgpu]]\nname = \"p\"\nsocket = \"p.sock\"\ndoorbell_page = true\n",
    ) else {
        return;
    };
    let r = run(&config(
        &dir,
        &remote_vm("p", "p.sock", "kernels=2 wgs=304 cost_us=500 loops=5"),
    ));
    assert!(r.all_succeeded(), "{}", r.summary());
    first_vm_printed(&r, "gpu: 1 queues x 2 kernels x 304 wgs x 5 loops: ok");
    let (st, v) = vmm::api::request(&srv.api, "GET", "/api/v1/vgpus/p", None).unwrap();
    assert_eq!(st, 200, "{v}");
    assert!(v["mmap_doorbells"].as_u64().unwrap_or(0) > 0, "{v}");
    assert_eq!(v["doorbells"], 0, "no doorbell over the socket: {v}");
    srv.stop();
}
