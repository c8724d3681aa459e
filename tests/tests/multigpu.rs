//! Several GPUs per host (issue 20): a fleet with two `[[gpu]]` entries
//! runs VMs on each, every metric and API object names the VM's real
//! `gpu_id`, and the GPUs are isolated: GPU 0 saturated by a training VM
//! that a high-priority VM keeps preempting never preempts, nor even shows
//! its VMs to, GPU 1's scheduler. Asserted without timing: counts of
//! preemptions (0 on GPU 1, some on GPU 0), which GPU each series names,
//! exact results. The latency comparison (GPU 1's job latency with GPU 0
//! idle vs saturated) is `cargo run --release -p hqdmux-tests --example
//! multigpu_latency`, recorded in docs/benchmarks.md.

use std::path::Path;

use hqdmux_tests::{scratch_dir, LiveFleet};
use serde_json::Value;
use vmm::vm::VmOutcome;

/// One request through the VMM's own API client (`vmm::http::call`).
fn send(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let body = body.map(|b| ("application/json", b.as_bytes()));
    let (st, out) = vmm::http::call(sock, method, path, body).expect("API request");
    (st, String::from_utf8_lossy(&out).into_owned())
}

fn json(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let (st, b) = send(sock, method, path, body);
    (st, serde_json::from_str(&b).unwrap_or(Value::Null))
}

/// The `gpu_id` label of every sample line naming `vm="NAME"`.
fn gpu_ids_of(text: &str, vm: &str) -> Vec<String> {
    let tag = format!("vm=\"{vm}\"");
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(&tag))
        .map(|l| {
            l.split_once("gpu_id=\"")
                .and_then(|(_, r)| r.split_once('"'))
                .map(|(id, _)| id.to_owned())
                .unwrap_or_else(|| panic!("no gpu_id: {l}"))
        })
        .collect()
}

fn gpu_vm(name: &str, gpu_id: Option<u32>, priority: u8, args: &str) -> String {
    let on = gpu_id
        .map(|g| format!("gpu_id = {g}\n"))
        .unwrap_or_default();
    format!(
        "[[vm]]\nname = \"{name}\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\n{on}priority = {priority}\nargs = \"{args}\"\n"
    )
}

#[test]
fn two_gpus_run_their_own_vms_label_them_and_do_not_disturb_each_other() {
    let test = "two_gpus_run_their_own_vms_label_them_and_do_not_disturb_each_other";
    if !vmm::kvm_or_skip(test) {
        return;
    }
    let dir = scratch_dir("multigpu");
    // GPU 0: a training VM that always has work (stopped at the end) and
    // a high-priority VM (added below) whose jobs preempt it. GPU 1: one
    // VM, verified.
    let toml = [
        "[[gpu]]\nid = 0\n[[gpu]]\nid = 1\n".to_string(),
        gpu_vm(
            "train",
            Some(0),
            2,
            "kernels=4 wgs=1216 cost_us=200000 loops=1000",
        ),
        gpu_vm(
            "solo",
            Some(1),
            2,
            "kernels=4 wgs=304 cost_us=20000 loops=20",
        ),
    ]
    .concat();
    let fleet = LiveFleet::start(&dir, &toml);
    let sock = fleet.sock.clone();
    // The high-priority VM is added once the host sees training's queue on
    // GPU 0: its jobs can then only run by preempting training, however
    // slowly either guest boots on a loaded host.
    fleet.wait_on_gpu("train");
    fleet.add(serde_json::json!({
        "name": "burst", "image": "builtin:gpu", "memory_mib": 256, "gpu": true,
        "gpu_id": 0, "priority": 12, "args": "kernels=4 wgs=304 cost_us=5000 loops=10",
    }));

    // Every VM's GPU in the API.
    for (vm, id) in [("train", 0), ("burst", 0), ("solo", 1)] {
        let v = fleet.wait_vm(vm, "has GPU time", |v| {
            v["gpu_time_ms"].as_f64().is_some_and(|t| t > 0.0) || v["state"] != "running"
        });
        assert_eq!(v["gpu_id"], id, "{v}");
        assert_eq!(v["placement"], format!("gpu_id = {id}"), "{v}");
    }
    let (_, f) = json(&sock, "GET", "/api/v1/fleet", None);
    let gpus = f["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 2, "{f}");
    assert_eq!(
        (gpus[0]["gpu_id"].clone(), gpus[1]["gpu_id"].clone()),
        (0.into(), 1.into())
    );

    // Metrics: each VM's series carry its own GPU's id, and GPU 1's
    // scheduler never sees GPU 0's VMs (no `gpu_id="1"` series names them).
    let (st, text) = send(&sock, "GET", "/metrics", None);
    assert_eq!(st, 200);
    for (vm, id) in [("train", "0"), ("burst", "0"), ("solo", "1")] {
        let ids = gpu_ids_of(&text, vm);
        assert!(!ids.is_empty(), "no series for {vm}:\n{text}");
        assert!(ids.iter().all(|g| g == id), "{vm}: {ids:?}\n{text}");
    }
    for g in ["0", "1"] {
        let slots = format!("hqdmux_hqd_slots{{gpu_id=\"{g}\"");
        assert!(text.lines().any(|l| l.starts_with(&slots)), "{text}");
    }
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("# HELP hqdmux_hqd_slots "))
            .count(),
        1,
        "one family header for both GPUs"
    );

    // Solo finishes on GPU 1 while GPU 0 stays saturated.
    fleet.wait_vm("solo", "exits", |v| v["state"] == "exited");
    // Added after solo ended: GPU 1 has no live VM, so automatic placement
    // (entitlement at priority 2) takes it there, and says why.
    let (st, late) = json(
        &sock,
        "POST",
        "/api/v1/vms",
        Some(
            "{\"name\":\"late\",\"image\":\"builtin:gpu\",\"memory_mib\":256,\"gpu\":true,\
             \"priority\":2,\"args\":\"kernels=2 wgs=304 cost_us=2000 loops=2\"}",
        ),
    );
    assert_eq!(st, 201, "{late}");
    assert_eq!(late["gpu_id"], 1, "{late}");
    let why = late["placement"].as_str().unwrap_or_default();
    assert!(why.starts_with("auto: gpu 1, "), "{why}");
    assert!(
        why.contains("gpu 1 304/304 CUs (weight 0 at >= 2, 0 VMs)"),
        "{why}"
    );
    // An unknown GPU is refused naming the field.
    let (st, bad) = json(
        &sock,
        "POST",
        "/api/v1/vms",
        Some("{\"name\":\"nowhere\",\"image\":\"builtin:gpu\",\"memory_mib\":256,\"gpu\":true,\"gpu_id\":5}"),
    );
    assert_eq!(st, 409, "{bad}");
    assert!(
        bad["error"]
            .as_str()
            .unwrap_or("")
            .contains("field `gpu_id`: no GPU with id 5"),
        "{bad}"
    );
    fleet.wait_vm("late", "exits", |v| v["state"] == "exited");
    fleet.wait_vm("burst", "exits", |v| v["state"] == "exited");
    let (st, v) = json(&sock, "POST", "/api/v1/vms/train/stop", None);
    assert_eq!(st, 200, "{v}");
    let report = fleet.join();

    let by = |n: &str| report.vms.iter().position(|v| v.name == n).unwrap();
    for (vm, ok) in [
        (
            "burst",
            "gpu: 1 queues x 4 kernels x 304 wgs x 10 loops: ok",
        ),
        ("solo", "gpu: 1 queues x 4 kernels x 304 wgs x 20 loops: ok"),
        ("late", "gpu: 1 queues x 2 kernels x 304 wgs x 2 loops: ok"),
    ] {
        let r = &report.vms[by(vm)];
        assert_eq!(r.outcome, VmOutcome::Exited(0), "{}", report.summary());
        assert!(r.console.iter().any(|l| l == ok), "{vm}: {:?}", r.console);
    }
    // Isolation: GPU 0 preempted (the high-priority VM took it from the
    // training VM); GPU 1 never did, and its VMs were never preempted.
    let stats = |id: u32| {
        report
            .gpus
            .iter()
            .find(|(g, _)| *g == id)
            .map(|(_, s)| *s)
            .unwrap_or_else(|| panic!("no GPU {id}: {:?}", report.gpus))
    };
    // The run's report names each VM's GPU and each GPU's counters.
    let on: Vec<Option<u32>> = ["train", "burst", "solo", "late"]
        .iter()
        .map(|n| report.vm_gpu_id[by(n)])
        .collect();
    assert_eq!(on, [Some(0), Some(0), Some(1), Some(1)]);
    let j = report.to_json();
    assert_eq!(j["vms"][by("late")]["gpu_id"], 1, "{j}");
    assert_eq!(j["gpus"][1]["gpu_id"], 1, "{j}");
    assert_eq!(j["gpus"][1]["preemptions"], 0, "{j}");
    assert!(stats(0).preemptions > 0, "{:?}", report.gpus);
    assert_eq!(stats(1).preemptions, 0, "{:?}", report.gpus);
    for vm in ["solo", "late"] {
        let g = report.vm_gpu[by(vm)].expect("GPU figures");
        assert_eq!(g.preemptions, 0, "{vm}: {}", report.summary());
        assert!(g.gpu_ns > 0, "{vm}");
    }
    assert!(
        report.vm_gpu[by("train")].is_some_and(|g| g.preemptions > 0),
        "{}",
        report.summary()
    );
    // GPU 1 completed exactly its own VMs' packets: 4 x 20 + 2 x 2 kernels
    // (plus each guest's own barrier/mark packets, also its own).
    assert!(stats(1).completions >= 84, "{:?}", report.gpus);
    let _ = std::fs::remove_dir_all(&dir);
}
