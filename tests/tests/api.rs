//! A running fleet driven only through its HTTP API, with raw requests as
//! curl would send them (`curl --unix-socket S http://x/api/v1/...`).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use hqdmux_tests::{scratch_dir, LiveFleet};
use serde_json::Value;
use vmm::kvm_or_skip;

/// One request on a fresh connection (`Connection: close`): status, head
/// and body text.
fn send_text(sock: &Path, raw: &str) -> (u16, String, String) {
    let mut s = UnixStream::connect(sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

/// One request on a fresh connection (`Connection: close`): status and body.
fn send(sock: &Path, raw: &str) -> (u16, Value) {
    let (status, _, body) = send_text(sock, raw);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// `GET path` as text: status, Content-Type and body.
fn get_text(sock: &Path, path: &str) -> (u16, String, String) {
    let (st, head, body) = send_text(
        sock,
        &format!("GET {path} HTTP/1.1\r\nHost: hqdmux\r\nConnection: close\r\n\r\n"),
    );
    let ct = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    (st, ct, body)
}

/// The samples of metric `name` in a Prometheus text body, by `vm` label.
fn samples(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.split_once("} ")?;
            let vm = labels
                .split(',')
                .find_map(|kv| kv.strip_prefix("vm=\""))?
                .trim_end_matches('"')
                .to_owned();
            Some((vm, value.trim().parse().ok()?))
        })
        .collect()
}

fn metric(text: &str, name: &str, vm: &str) -> f64 {
    samples(text, name)
        .into_iter()
        .filter(|(v, _)| v == vm)
        .map(|(_, x)| x)
        .sum()
}

/// `GET /metrics`: checks the status and content type, returns the text.
fn metrics(sock: &Path) -> String {
    let (st, ct, body) = get_text(sock, "/metrics");
    assert_eq!(st, 200, "{body}");
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    body
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

fn gpu_vm(name: &str, priority: u8, args: &str) -> String {
    format!(
        "[[vm]]\nname = \"{name}\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\npriority = {priority}\nargs = \"{args}\"\n"
    )
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
    let fleet = LiveFleet::start(&dir, &toml);
    let sock = fleet.sock.clone();
    let mode = std::fs::metadata(&sock).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );

    // Metrics before the GPU work (the guests are still booting or just
    // started).
    let before = metrics(&sock);
    assert!(before.contains("# TYPE hqdmux_vm_gpu_busy_seconds_total counter"));

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

    // Clearing a quarantine that is not there: 200, said so, no change.
    let (st, v) = req(&sock, "POST", "/api/v1/vms/training/clear-quarantine", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["was_quarantined"], false);
    assert_eq!(v["quarantined"], false);
    assert_eq!(v["queue_errors"], 0);
    assert!(v["guard"]["quarantined"].is_null(), "{v}");
    assert_eq!(v["guard"]["max_resets"], 3, "[gpu.guard] default");

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
    fleet.wait_vm("checked", "never ran", |v| {
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
    // A queue running at the pause is CWSR-saved (a preemption); one that
    // was between kernels at that instant is only unmapped (seen once:
    // `maps 1, preemptions 0`), so the count is not asserted here.
    assert!(held["maps"].as_u64().unwrap() >= 1, "{held}");
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
            409,
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
    let (st, v) = req(&sock, "POST", "/api/v1/vms/idle/stop", None);
    assert_eq!(
        (st, v["state"].as_str()),
        (200, Some("stopped")),
        "already stopped: idempotent: {v}"
    );

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
    fleet.wait_vm("late", "never exited", |v| v["state"] == "exited");
    assert_eq!(vm(&sock, "late")["exit_status"], 0);

    // `checked` ends by itself with exact results; then stop training.
    let done = fleet.wait_vm("checked", "never ended", |v| v["state"] == "exited");
    assert_eq!(done["exit_status"], 0, "exact after pause/resume: {done}");
    assert!(
        done["gpu_time_ms"].as_f64().unwrap() > 0.0,
        "figures kept: {done}"
    );

    // Counters rose over the GPU work (parsed from the text).
    let after = metrics(&sock);
    for (name, vm) in [
        ("hqdmux_vm_gpu_busy_seconds_total", "training"),
        ("hqdmux_vm_gpu_busy_seconds_total", "checked"),
    ] {
        let (b, a) = (metric(&before, name, vm), metric(&after, name, vm));
        assert!(a > b, "{name}{{vm={vm}}}: {b} -> {a}\n{after}");
    }
    assert!(
        metric(&after, "hqdmux_vm_preemptions_total", "checked")
            >= metric(&before, "hqdmux_vm_preemptions_total", "checked"),
        "{after}"
    );
    assert!(
        metric(&after, "hqdmux_vm_preemptions_total", "training")
            >= metric(&before, "hqdmux_vm_preemptions_total", "training"),
        "{after}"
    );

    // The timeline of the last seconds, as JSON and SVG, names every GPU VM.
    let (st, ct, body) = get_text(&sock, "/api/v1/timeline?seconds=120");
    assert_eq!((st, ct.as_str()), (200, "application/json"), "{body}");
    let t: Value = serde_json::from_str(&body).unwrap();
    for name in ["training", "checked"] {
        assert!(
            t["vms"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["name"] == name),
            "{name} in {body}"
        );
    }
    assert!(!t["spans"].as_array().unwrap().is_empty(), "{body}");
    let (st, ct, svg) = get_text(&sock, "/api/v1/timeline?seconds=120&format=svg");
    assert_eq!((st, ct.as_str()), (200, "image/svg+xml"));
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
    for name in ["training", "checked"] {
        assert!(texts.iter().any(|t| t.contains(name)), "{name} in the SVG");
    }
    let (st, v) = req(&sock, "GET", "/api/v1/timeline?seconds=121", None);
    assert_eq!(st, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("seconds"), "{v}");

    let (st, _) = req(&sock, "POST", "/api/v1/vms/training/stop", None);
    assert_eq!(st, 200);
    let report = fleet.join();
    assert_eq!(report.vms.len(), 4, "{}", report.summary());
    assert!(report.vms[1].outcome.is_success(), "{}", report.summary());
    assert!(report.vms[3].outcome.is_success(), "{}", report.summary());
    assert!(!sock.exists(), "socket removed when the fleet ends");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_operator_sees_a_guard_quarantine_and_queue_errors_over_http_and_clears_it() {
    let test = "the_operator_sees_a_guard_quarantine_and_queue_errors_over_http_and_clears_it";
    if !kvm_or_skip(test) {
        return;
    }
    // The other test of this binary holds 2,000 connections in this process.
    let _ = vmm::config::raise_open_files_limit();
    let dir = scratch_dir("api-guard");
    // `storm` rings its loaded queue's doorbell without moving the write
    // index (100 per round, until stopped): past 50 in the window the guard
    // quarantines it. `hostile` publishes a write index past its ring (one
    // queue error) and spins.
    let toml =
        "[[vm]]\nname = \"storm\"\nimage = \"builtin:doorbell\"\nmemory_mib = 256\ngpu = true\n\
                args = \"bare=0xe0000000 n=100 rounds=100000000\"\n\
                guard = { max_stale_doorbells = 50, window_ms = 600000 }\n"
            .to_owned()
            + &gpu_vm("hostile", 4, "kernels=1 wgs=4 bad=wptr die=hang");
    let fleet = LiveFleet::start(&dir, &toml);
    let sock = fleet.sock.clone();

    let q = fleet.wait_vm("storm", "never quarantined", |v| v["quarantined"] == true);
    let trip = &q["guard"]["quarantined"];
    assert_eq!(trip["what"], "stale_doorbells", "{q}");
    assert_eq!(trip["limit"], 50, "{q}");
    assert!(trip["count"].as_u64().unwrap() > 50, "{q}");
    assert!(trip["reason"].as_str().unwrap().contains("limit 50"), "{q}");
    assert!(
        q["guard"]["total_stale_doorbells"].as_u64().unwrap() > 50,
        "{q}"
    );
    let (_, f) = req(&sock, "GET", "/api/v1/fleet", None);
    assert!(f["gpu"]["quarantined_vms"].as_u64().is_some(), "{f}");

    // New limits do not lift the quarantine; the operator's clear does.
    let (st, v) = req(
        &sock,
        "PATCH",
        "/api/v1/vms/storm",
        Some("{\"guard\": {\"max_stale_doorbells\": 0}}"),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["guard"]["max_stale_doorbells"], 0);
    assert_eq!(
        v["quarantined"], true,
        "a quarantine stays until cleared: {v}"
    );
    let (st, v) = req(&sock, "POST", "/api/v1/vms/storm/clear-quarantine", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["was_quarantined"], true);
    assert_eq!(v["quarantined"], false, "{v}");
    assert!(v["guard"]["quarantined"].is_null(), "{v}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(vm(&sock, "storm")["quarantined"], false, "limit disabled");
    let (st, v) = req(&sock, "POST", "/api/v1/vms/storm/clear-quarantine", None);
    assert_eq!(
        (st, v["was_quarantined"].as_bool()),
        (200, Some(false)),
        "{v}"
    );

    // Queue errors: counted live, by code, and kept after the VM ends.
    let h = fleet.wait_vm("hostile", "no queue error", |v| {
        v["queue_errors"].as_u64().is_some_and(|n| n >= 1)
    });
    let by_code: u64 = h["queue_errors_by_code"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(by_code, h["queue_errors"].as_u64().unwrap(), "{h}");
    let text = metrics(&sock);
    assert!(
        metric(&text, "hqdmux_vm_queue_errors_total", "hostile") >= 1.0,
        "{text}"
    );
    let (st, v) = req(&sock, "POST", "/api/v1/vms/hostile/stop", None);
    assert_eq!(st, 200, "{v}");
    let ended = vm(&sock, "hostile");
    assert_eq!(ended["state"], "stopped");
    assert_eq!(ended["queue_errors"], h["queue_errors"], "kept: {ended}");
    assert!(ended["guard"].is_null(), "{ended}");
    // Stopping the last running VM ends the run (and the server).
    let (st, v) = req(&sock, "POST", "/api/v1/vms/storm/stop", None);
    assert_eq!(st, 200, "{v}");
    let report = fleet.join();
    assert_eq!(report.vms.len(), 2, "{}", report.summary());
    assert!(!sock.exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_fleet_without_gpu_vms_adds_one_and_operator_stops_are_no_failure() {
    let test = "a_fleet_without_gpu_vms_adds_one_and_operator_stops_are_no_failure";
    if !kvm_or_skip(test) {
        return;
    }
    let dir = scratch_dir("api-lazy-gpu");
    let toml = "[[vm]]\nname = \"idle\"\nimage = \"builtin:fault\"\nargs = \"mode=hang\"\n";
    let fleet = LiveFleet::start(&dir, toml);
    let sock = fleet.sock.clone();
    let (_, f) = req(&sock, "GET", "/api/v1/fleet", None);
    assert!(f["gpu"].is_null(), "no GPU yet: {f}");
    let (st, _) = req(&sock, "GET", "/api/v1/timeline", None);
    assert_eq!(st, 409, "no GPU yet");

    // The first GPU VM starts the arbiter; its kernels run and check.
    let body = gpu_vm("late-gpu", 3, "kernels=2 wgs=64 cost_us=1000 loops=2");
    let (st, v) = send(
        &sock,
        &format!(
            "POST /api/v1/vms HTTP/1.1\r\nContent-Type: application/toml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["gpu"], true, "{v}");
    let done = fleet.wait_vm("late-gpu", "never ended", |v| v["state"] == "exited");
    assert_eq!(done["exit_status"], 0, "{done}");
    assert!(done["gpu_time_ms"].as_f64().unwrap() > 0.0, "{done}");
    let (_, f) = req(&sock, "GET", "/api/v1/fleet", None);
    assert!(f["gpu"]["completions"].as_u64().unwrap() > 0, "{f}");
    let text = metrics(&sock);
    assert!(
        metric(&text, "hqdmux_vm_gpu_busy_seconds_total", "late-gpu") > 0.0,
        "{text}"
    );

    // Stopping the last VM ends the run, which did not fail.
    let (st, v) = req(&sock, "POST", "/api/v1/vms/idle/stop", None);
    assert_eq!((st, v["state"].as_str()), (200, Some("stopped")), "{v}");
    let report = fleet.join();
    assert_eq!(report.vms.len(), 2, "{}", report.summary());
    assert_eq!(report.operator_stopped, [true, false]);
    assert!(report.all_succeeded(), "{}", report.summary());
    assert!(report.gpu.is_some_and(|g| g.completions > 0));
    std::fs::remove_dir_all(&dir).ok();
}
