//! A running fleet driven only through its HTTP API, with raw requests as
//! curl would send them (`curl --unix-socket S http://x/api/v1/...`).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hqdmux_tests::{config, scratch_dir};
use serde_json::Value;
use vmm::kvm_or_skip;

/// One request on a fresh connection (`Connection: close`): status and body.
fn send(sock: &Path, raw: &str) -> (u16, Value) {
    let mut s = UnixStream::connect(sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn req(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let raw = match body {
        Some(b) => format!(
            "{method} {path} HTTP/1.1\r\nHost: hqdmux\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        ),
        None => format!("{method} {path} HTTP/1.1\r\nHost: hqdmux\r\nConnection: close\r\n\r\n"),
    };
    send(sock, &raw)
}

fn vm(sock: &Path, name: &str) -> Value {
    let (st, v) = req(sock, "GET", &format!("/api/v1/vms/{name}"), None);
    assert_eq!(st, 200, "{v}");
    v
}

/// Polls `cond` on VM `name`'s view (deadline: a hang guard).
fn wait_vm(sock: &Path, name: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let t0 = Instant::now();
    loop {
        let v = vm(sock, name);
        if cond(&v) {
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{name}: {what}: {v}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn gpu_vm(name: &str, priority: u8, args: &str) -> String {
    format!(
        "[[vm]]\nname = \"{name}\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\npriority = {priority}\nargs = \"{args}\"\n"
    )
}

fn start(dir: &Path, toml: &str) -> (PathBuf, std::thread::JoinHandle<vmm::fleet::FleetReport>) {
    let sock = dir.join("api.sock");
    let cfg = config(dir, toml);
    let opts = vmm::fleet::RunOptions {
        api_socket: Some(sock.clone()),
        ..Default::default()
    };
    let fleet = std::thread::spawn(move || vmm::fleet::run_fleet(&cfg, opts).expect("fleet"));
    let t0 = Instant::now();
    while UnixStream::connect(&sock).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(60), "no API socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    (sock, fleet)
}

#[test]
fn an_operator_lists_steers_pauses_stops_and_adds_vms_over_http() {
    let test = "an_operator_lists_steers_pauses_stops_and_adds_vms_over_http";
    if !kvm_or_skip(test) {
        return;
    }
    let _ = vmm::config::raise_open_files_limit();
    let dir = scratch_dir("api-http");
    let toml = [
        gpu_vm(
            "training",
            2,
            "kernels=4 wgs=1216 cost_us=200000 loops=1000",
        ),
        gpu_vm("checked", 8, "kernels=4 wgs=304 cost_us=50000 loops=4"),
        "[[vm]]\nname = \"idle\"\nimage = \"builtin:fault\"\nargs = \"mode=hang\"\n".into(),
    ]
    .concat();
    let (sock, fleet) = start(&dir, &toml);
    let mode = std::fs::metadata(&sock).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );

    // List.
    let (st, list) = req(&sock, "GET", "/api/v1/vms", None);
    assert_eq!(st, 200);
    let names: Vec<&str> = list["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["training", "checked", "idle"]);

    // Change a priority.
    let (st, v) = req(
        &sock,
        "PATCH",
        "/api/v1/vms/training",
        Some("{\"priority\": 1, \"quantum_ms\": 3, \"preempt_timeout_ms\": 250}"),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["priority"], 1);
    assert_eq!(v["quantum_ms"], 3.0);
    assert_eq!(v["quantum_override"], true);
    assert_eq!(v["preempt_timeout_ms"], 250);

    // Pause `checked` once it has run, hold it, resume it: its guest checks
    // every workgroup counter is exactly 1 (exit 0).
    wait_vm(&sock, "checked", "never ran", |v| {
        v["gpu_time_ms"].as_f64().is_some_and(|t| t > 0.0)
    });
    let (st, v) = req(&sock, "POST", "/api/v1/vms/checked/pause", None);
    assert_eq!((st, v["state"].as_str()), (200, Some("paused")), "{v}");
    let mut prev = vm(&sock, "checked")["gpu_time_ms"].as_f64().unwrap();
    let t0 = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = vm(&sock, "checked")["gpu_time_ms"].as_f64().unwrap();
        if now == prev {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "GPU time still grows while paused"
        );
        prev = now;
    }
    let held = vm(&sock, "checked");
    assert_eq!(held["state"], "paused");
    assert!(held["preemptions"].as_u64().unwrap() >= 1, "{held}");
    let (st, v) = req(&sock, "POST", "/api/v1/vms/checked/resume", None);
    assert_eq!((st, v["state"].as_str()), (200, Some("running")), "{v}");

    // Bad requests: 4xx with a JSON reason, nothing changes.
    let bad = [
        (send(&sock, "NOT HTTP\r\n\r\n"), 400),
        (
            req(
                &sock,
                "PATCH",
                "/api/v1/vms/training",
                Some("{\"priority\": 99}"),
            ),
            400,
        ),
        (
            req(&sock, "PATCH", "/api/v1/vms/idle", Some("{\"weight\": 2}")),
            409,
        ),
        (req(&sock, "GET", "/api/v1/vms/nope", None), 404),
        (req(&sock, "DELETE", "/api/v1/vms/training", None), 405),
        (
            req(&sock, "PUT", "/api/v1/policy", Some("{\"policy\": \"x\"}")),
            400,
        ),
        (
            req(
                &sock,
                "POST",
                "/api/v1/vms",
                Some("{\"name\": \"idle\", \"image\": \"builtin:hello\"}"),
            ),
            422,
        ),
    ];
    for ((st, v), want) in bad {
        assert_eq!(st, want, "{v}");
        assert!(v["error"].is_string(), "{v}");
    }
    assert_eq!(vm(&sock, "training")["priority"], 1, "unchanged");

    // 2,000 idle connections (one half-sent), and a request still answered.
    let mut idle: Vec<UnixStream> = (0..2000)
        .map(|_| UnixStream::connect(&sock).expect("idle connection"))
        .collect();
    idle[0]
        .write_all(b"GET /api/v1/vms HTTP/1.1\r\nHost:")
        .unwrap();
    let (st, v) = req(&sock, "GET", "/api/v1/fleet", None);
    assert_eq!(st, 200);
    assert_eq!(v["vms"], 3);
    drop(idle);

    // Stop one VM: its figures stay.
    let (st, v) = req(&sock, "POST", "/api/v1/vms/idle/stop", None);
    assert_eq!((st, v["state"].as_str()), (200, Some("stopped")), "{v}");
    assert_eq!(v["outcome"], "stopped: by the operator");
    let (st, _) = req(&sock, "POST", "/api/v1/vms/idle/stop", None);
    assert_eq!(st, 409, "already stopped");

    // Add a VM (TOML body), it runs and exits; its status is kept.
    let body = "[[vm]]\nname = \"late\"\nimage = \"builtin:hello\"\nmemory_mib = 8\n";
    let (st, v) = send(
        &sock,
        &format!(
            "POST /api/v1/vms HTTP/1.1\r\nContent-Type: application/toml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["name"], "late");
    wait_vm(&sock, "late", "never exited", |v| v["state"] == "exited");
    assert_eq!(vm(&sock, "late")["exit_status"], 0);

    // `checked` ends by itself with exact results; then stop training.
    let done = wait_vm(&sock, "checked", "never ended", |v| v["state"] == "exited");
    assert_eq!(done["exit_status"], 0, "exact after pause/resume: {done}");
    assert!(
        done["gpu_time_ms"].as_f64().unwrap() > 0.0,
        "figures kept: {done}"
    );
    let (st, _) = req(&sock, "POST", "/api/v1/vms/training/stop", None);
    assert_eq!(st, 200);
    let report = fleet.join().unwrap();
    assert_eq!(report.vms.len(), 4, "{}", report.summary());
    assert!(report.vms[1].outcome.is_success(), "{}", report.summary());
    assert!(report.vms[3].outcome.is_success(), "{}", report.summary());
    assert!(!sock.exists(), "socket removed when the fleet ends");
    std::fs::remove_dir_all(&dir).ok();
}
