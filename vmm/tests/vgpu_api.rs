//! vGPUs managed live over the API of a running `hqdmux serve` (no KVM: a
//! vfio-user client of the `vfio_user` crate plays the VMM). Waits have a
//! deadline against hangs; nothing asserts on durations.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vmm::api::request;

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hqdmux-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn wait(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct Daemon {
    api: PathBuf,
    stop: vmm::signals::StopSignal,
    thread: Option<std::thread::JoinHandle<vmm::serve::ServeReport>>,
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        Self::with(dir, "")
    }

    /// A daemon whose devices file is `gpus` (GPU tables, may be empty)
    /// and the vGPU `cfg` (priority 2, on GPU 0).
    fn with(dir: &Path, gpus: &str) -> Daemon {
        Self::reading(dir, dir, gpus)
    }

    /// As [`Daemon::with`], its devices file read from `devices_dir` (the
    /// API socket stays in `dir`).
    fn reading(dir: &Path, devices_dir: &Path, gpus: &str) -> Daemon {
        let devices = devices_dir.join("devices.toml");
        std::fs::write(
            &devices,
            format!("{gpus}[[vgpu]]\nname = \"cfg\"\nsocket = \"cfg.sock\"\npriority = 2\n"),
        )
        .unwrap();
        let cfg = vmm::serve::DevicesConfig::load(&devices).unwrap();
        let api = dir.join("api.sock");
        let stop = vmm::signals::manual().unwrap();
        let opts = vmm::serve::ServeOptions {
            api_socket: Some(api.clone()),
            api_socket_mode: None,
            vgpu_socket_dir: None,
            stop: Some(stop.clone()),
        };
        let thread = std::thread::spawn(move || vmm::serve::run_serve(&cfg, opts).unwrap());
        wait("api socket", || api.exists());
        Daemon {
            api,
            stop,
            thread: Some(thread),
        }
    }

    fn call(&self, method: &str, target: &str, body: Option<Value>) -> (u16, Value) {
        request(
            &self.api,
            method,
            &format!("/api/v1{target}"),
            body.as_ref(),
        )
        .unwrap()
    }

    fn vgpu(&self, name: &str) -> Value {
        let (st, v) = self.call("GET", &format!("/vgpus/{name}"), None);
        assert_eq!(st, 200, "{v}");
        v
    }

    fn names(&self) -> Vec<String> {
        let (st, v) = self.call("GET", "/vgpus", None);
        assert_eq!(st, 200);
        v["vgpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_owned())
            .collect()
    }

    fn finish(mut self) -> vmm::serve::ServeReport {
        self.stop.request();
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.request();
            let _ = t.join();
        }
    }
}

fn connect(path: &Path) -> vfio_user::Client {
    vfio_user::Client::new(path).expect("vfio-user client")
}

#[test]
fn vgpus_are_created_steered_paused_and_removed_live_and_hostile_bodies_change_nothing() {
    let dir = scratch("vgpu-api");
    let d = Daemon::start(&dir);
    // The devices file's vGPU is listed, idle.
    assert_eq!(d.names(), ["cfg"]);
    let cfg = d.vgpu("cfg");
    assert_eq!(cfg["state"], "idle");
    assert_eq!(cfg["priority"], 2);
    assert!(cfg["queues"].is_null());

    // Create: 201 with its socket (NAME.sock in the API socket's directory).
    let (st, v) = d.call(
        "POST",
        "/vgpus",
        Some(
            json!({"name": "a", "priority": 12, "weight": 3, "quantum_ms": 5,
                    "preempt_timeout_ms": 700, "guard": {"max_resets": 4}}),
        ),
    );
    assert_eq!(st, 201, "{v}");
    let sock = dir.canonicalize().unwrap().join("a.sock");
    assert_eq!(v["socket"], sock.display().to_string());
    assert!(sock.exists());
    assert_eq!(
        (&v["priority"], &v["weight"], &v["quantum_ms"]),
        (&json!(12), &json!(3), &json!(5.0))
    );
    assert_eq!(v["quantum_override"], true);
    assert_eq!(v["preempt_timeout_ms"], 700);
    assert_eq!(v["doorbell_page"], false);

    // Hostile bodies: refused with the field named, nothing created.
    let taken = dir.join("taken.sock");
    std::fs::write(&taken, "not a socket").unwrap();
    let outside = scratch("vgpu-api-outside");
    for (body, status, want) in [
        (
            json!({"name": "a"}),
            422,
            "vgpu 'a': name: a vGPU named 'a' exists",
        ),
        (json!({"name": "cfg"}), 422, "name"),
        (
            json!({"name": "b", "socket": outside.join("b.sock").display().to_string()}),
            422,
            "vgpu 'b': socket: ",
        ),
        (
            json!({"name": "b", "socket": "../b.sock"}),
            422,
            "outside the vGPU socket directory",
        ),
        (json!({"name": "b", "socket": "sub/b.sock"}), 422, "socket"),
        (json!({"name": "b", "socket": ".."}), 422, "names no file"),
        (
            json!({"name": "b", "socket": "a.sock"}),
            409,
            "another vGPU's",
        ),
        (
            json!({"name": "b", "socket": "cfg.sock"}),
            409,
            "another vGPU's",
        ),
        (
            json!({"name": "b", "socket": "taken.sock"}),
            409,
            "the path exists",
        ),
        (
            json!({"name": "b", "socket": "x".repeat(200)}),
            422,
            "longer than",
        ),
        (
            json!({"name": "b", "priority": 16}),
            400,
            "vgpu: priority: 16 is out of range 0..=15",
        ),
        (
            json!({"name": "b", "weight": 0}),
            400,
            "weight: 0 is out of range",
        ),
        (json!({"name": "b", "quantum_ms": 0}), 400, "quantum_ms"),
        (
            json!({"name": "b", "preempt_timeout_ms": 0}),
            400,
            "preempt_timeout_ms",
        ),
        (
            json!({"name": "b", "partition": 99}),
            400,
            "vgpu 'b': partition: 99 is out of range",
        ),
        (
            json!({"name": "b", "guard": {}}),
            400,
            "vgpu 'b': guard: empty object",
        ),
        (
            json!({"name": "b", "guard": {"window_ms": 0}}),
            400,
            "vgpu 'b': guard",
        ),
        (
            json!({"name": "b", "colour": 1}),
            400,
            "unknown field `colour`",
        ),
        (json!({"name": "b/c"}), 400, "vgpu 'b/c': name"),
        (
            json!({"name": "b", "doorbell_page": 1}),
            400,
            "doorbell_page: invalid type",
        ),
        (json!({"name": ""}), 400, "name"),
        (json!({"name": "."}), 400, "vgpu '.': name: '.' must begin"),
        (
            json!({"name": ".."}),
            400,
            "vgpu '..': name: '..' must begin",
        ),
        (json!({"name": "-v"}), 400, "name"),
        (json!({"priority": 1}), 400, "missing field `name`"),
    ] {
        let (st, e) = d.call("POST", "/vgpus", Some(body.clone()));
        assert_eq!(st, status, "{body}: {e}");
        let msg = e["error"].as_str().unwrap_or_default();
        assert!(msg.contains(want), "{body}: {msg}");
    }
    assert_eq!(d.names(), ["cfg", "a"]);
    assert!(!outside.join("b.sock").exists() && !dir.join("b.sock").exists());
    assert!(taken.exists(), "a taken path is left alone");

    // A client connects: the vGPU is registered with the arbiter.
    let client = connect(&sock);
    wait("connected", || d.vgpu("a")["state"] == "connected");
    let v = d.vgpu("a");
    assert_eq!(v["queues"], 0);
    assert_eq!(v["connections"], 1);
    assert_eq!(v["quarantined"], false);

    // Steer: validated whole; a bad field changes nothing.
    let (st, e) = d.call(
        "PATCH",
        "/vgpus/a",
        Some(json!({"priority": 1, "weight": 0})),
    );
    assert_eq!(st, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("vgpu 'a': weight"));
    assert_eq!(d.vgpu("a")["priority"], 12);
    for (body, want) in [
        (json!({}), "vgpu 'a': empty change"),
        (json!({"guard": {}}), "vgpu 'a': guard: empty object"),
        (json!({"guard": {"window_ms": 0}}), "vgpu 'a': guard"),
        (json!({"image": "x"}), "unknown field `image`"),
    ] {
        let (st, e) = d.call("PATCH", "/vgpus/a", Some(body.clone()));
        assert_eq!(st, 400, "{body}: {e}");
        assert!(e["error"].as_str().unwrap().contains(want), "{body}: {e}");
    }
    let (st, v) = d.call(
        "PATCH",
        "/vgpus/a",
        Some(json!({"priority": 14, "weight": 9, "quantum_ms": null})),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!((&v["priority"], &v["weight"]), (&json!(14), &json!(9)));
    assert_eq!(v["quantum_override"], false);
    let (st, e) = d.call("PATCH", "/vgpus/nosuch", Some(json!({"priority": 1})));
    assert_eq!(st, 404, "{e}");
    assert_eq!(e["error"], "vgpu 'nosuch': no such vGPU");

    // Metrics label the vGPU like a VM.
    let (st, text) = vmm::http::call(&d.api, "GET", "/metrics", None).unwrap();
    assert_eq!(st, 200);
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("vm=\"a\""), "{text}");

    // Pause (idempotent), then a VM reboot: the new client gets the
    // steered, paused vGPU.
    for _ in 0..2 {
        let (st, v) = d.call("POST", "/vgpus/a/pause", None);
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["paused"], true);
    }
    drop(client);
    wait("idle", || d.vgpu("a")["state"] == "idle");
    let v = d.vgpu("a");
    assert_eq!((&v["priority"], &v["paused"]), (&json!(14), &json!(true)));
    assert_eq!(v["quarantined"], false, "known while idle");
    let client = connect(&sock);
    wait("reconnected", || d.vgpu("a")["state"] == "connected");
    let v = d.vgpu("a");
    assert_eq!(
        (
            &v["priority"],
            &v["weight"],
            &v["paused"],
            &v["connections"]
        ),
        (&json!(14), &json!(9), &json!(true), &json!(2))
    );
    let (st, v) = d.call("POST", "/vgpus/a/resume", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["paused"], false);
    // Clear-quarantine: idempotent, connected or not.
    let (st, v) = d.call("POST", "/vgpus/a/clear-quarantine", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["quarantined"], false);
    let (st, _) = d.call("GET", "/vgpus/a/clear-quarantine", None);
    assert_eq!(st, 405);

    // Wrong methods and paths.
    let (st, _) = d.call("PUT", "/vgpus/a", None);
    assert_eq!(st, 405);
    let (st, _) = d.call("POST", "/vgpus/a/stop", None);
    assert_eq!(st, 404);

    // Remove with the client connected: disconnected, socket gone, name free.
    let (st, v) = d.call("DELETE", "/vgpus/a", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["state"], "idle");
    assert!(!sock.exists());
    let mut client = client;
    assert!(client.reset().is_err(), "the client was disconnected");
    let (st, _) = d.call("GET", "/vgpus/a", None);
    assert_eq!(st, 404);
    let (st, _) = d.call("DELETE", "/vgpus/a", None);
    assert_eq!(st, 404);
    assert_eq!(d.names(), ["cfg"]);
    let (st, v) = d.call(
        "POST",
        "/vgpus",
        Some(json!({"name": "a", "socket": sock.display().to_string()})),
    );
    assert_eq!(st, 201, "{v}");
    // A vGPU with the mmapped doorbell page: its client gets BAR2 as a
    // sparse-mmap region with the page's fd.
    let (st, v) = d.call(
        "POST",
        "/vgpus",
        Some(json!({"name": "paged", "doorbell_page": true})),
    );
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["doorbell_page"], true);
    let c = connect(Path::new(v["socket"].as_str().unwrap()));
    let bar2 = c.region(2).expect("BAR2");
    assert_ne!(bar2.flags & (1 << 2), 0, "mmap-able");
    assert!(bar2.file_offset.is_some() && bar2.sparse_areas.len() == 1);
    let plain = connect(&sock);
    assert_eq!(plain.region(2).unwrap().flags & (1 << 2), 0);
    drop((c, plain));
    let (st, _) = d.call("DELETE", "/vgpus/paged", None);
    assert_eq!(st, 200);
    let r = d.finish();
    let names: Vec<&str> = r.vgpus.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["cfg", "a"]);
    assert!(!sock.exists() && !dir.join("cfg.sock").exists());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&outside);
}

#[test]
fn the_cli_lists_steers_and_removes_vgpus() {
    let dir = scratch("vgpu-cli");
    let d = Daemon::start(&dir);
    let api = d.api.display().to_string();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_hqdmux"))
            .args(args)
            .args(["--api-socket", &api])
            .output()
            .unwrap()
    };
    let out = run(&["vgpu-add", "b", "--priority", "7", "--weight", "2"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("b.sock"));
    let out = run(&["vgpu-add", "b"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("name"));
    let out = run(&["set", "b", "--priority", "9"]);
    assert!(out.status.success(), "{out:?}");
    let out = run(&["pause", "b"]);
    assert!(out.status.success(), "{out:?}");
    // `unquarantine` reaches the vGPU (idle, not quarantined: exit 0).
    let out = run(&["unquarantine", "b", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&v["name"], &v["quarantined"]),
        (&json!("b"), &json!(false))
    );
    let out = run(&["ps"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("b "))
        .unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[1..6], ["idle", "0", "yes", "9", "2"], "{row}");
    assert!(text.lines().any(|l| l.starts_with("cfg ")), "{text}");
    let out = run(&["ps", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["vgpus"].as_array().unwrap().len(), 2);
    let out = run(&["vgpu-rm", "b"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!dir.join("b.sock").exists());
    let out = run(&["vgpu-rm", "b"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `hqdmux_vm_state` series of vGPU `vm` for `state`: (its `gpu_id`
/// label, value).
fn vm_state(text: &str, vm: &str, state: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| {
            l.starts_with("hqdmux_vm_state{")
                && l.contains(&format!("vm=\"{vm}\""))
                && l.contains(&format!("state=\"{state}\""))
        })
        .map(|l| {
            let gpu = l
                .split("gpu_id=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("?")
                .to_owned();
            (gpu, l.rsplit(' ').next().unwrap_or("").to_owned())
        })
        .collect()
}

#[test]
fn a_vgpu_created_on_gpu_1_of_two_is_served_steered_and_counted_there() {
    let dir = scratch("vgpu-api-2gpu");
    let d = Daemon::with(&dir, "[[gpu]]\nid = 0\n[[gpu]]\nid = 1\n");
    let fleet_gpus = |d: &Daemon| -> Vec<u64> {
        let (st, f) = d.call("GET", "/fleet", None);
        assert_eq!(st, 200, "{f}");
        f["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["gpu_id"].as_u64().unwrap())
            .collect()
    };
    // Only GPU 0 serves a vGPU (the file's): only its arbiter runs.
    assert_eq!(fleet_gpus(&d), [0]);
    let cfg = d.vgpu("cfg");
    assert_eq!(
        (&cfg["gpu_id"], &cfg["placement"]),
        (&json!(0), &json!("gpu_id = 0"))
    );

    // An unknown GPU is refused naming the field; nothing is created.
    let (st, e) = d.call("POST", "/vgpus", Some(json!({"name": "x", "gpu_id": 7})));
    assert_eq!(st, 422, "{e}");
    assert_eq!(
        e["error"],
        "vgpu 'x': gpu_id: no GPU with id 7 (this daemon's GPUs: 0, 1)"
    );
    // A partition is checked against the named GPU's.
    let (st, e) = d.call(
        "POST",
        "/vgpus",
        Some(json!({"name": "x", "gpu_id": 1, "partition": 1})),
    );
    assert_eq!(st, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("partition"), "{e}");
    assert_eq!(d.names(), ["cfg"]);
    assert_eq!(fleet_gpus(&d), [0]);

    // Created on GPU 1: its arbiter starts with it.
    let (st, v) = d.call("POST", "/vgpus", Some(json!({"name": "g1", "gpu_id": 1})));
    assert_eq!(st, 201, "{v}");
    assert_eq!(
        (&v["gpu_id"], &v["placement"]),
        (&json!(1), &json!("gpu_id = 1"))
    );
    assert_eq!(fleet_gpus(&d), [0, 1]);

    // Without gpu_id: placed by entitlement among the vGPUs there. At
    // priority 2 GPU 0 has `cfg` (weight 1 at >= 2), GPU 1 nothing (g1 is
    // at priority 0): GPU 1.
    let (st, v) = d.call(
        "POST",
        "/vgpus",
        Some(json!({"name": "auto", "priority": 2})),
    );
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["gpu_id"], 1, "{v}");
    assert!(
        v["placement"].as_str().unwrap().starts_with("auto: gpu 1"),
        "{v}"
    );

    // A client on each GPU's first vGPU: each is its arbiter's first
    // registration (the same handle on two arbiters).
    let c0 = connect(&dir.join("cfg.sock"));
    let c1 = connect(Path::new(d.vgpu("g1")["socket"].as_str().unwrap()));
    wait("connected", || {
        d.vgpu("cfg")["state"] == "connected" && d.vgpu("g1")["state"] == "connected"
    });
    // Steer and pause reach g1's own arbiter; cfg keeps its figures.
    let (st, v) = d.call(
        "PATCH",
        "/vgpus/g1",
        Some(json!({"priority": 9, "weight": 4})),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!((&v["priority"], &v["weight"]), (&json!(9), &json!(4)));
    let (st, v) = d.call("POST", "/vgpus/g1/pause", None);
    assert_eq!((st, &v["paused"]), (200, &json!(true)), "{v}");
    let cfg = d.vgpu("cfg");
    assert_eq!((&cfg["priority"], &cfg["weight"]), (&json!(2), &json!(1)));
    assert_eq!(cfg["paused"], false);

    // Metrics: each vGPU's series on its own GPU only, and the state of
    // each GPU's handle is its own vGPU's.
    let (st, text) = vmm::http::call(&d.api, "GET", "/metrics", None).unwrap();
    assert_eq!(st, 200);
    let text = String::from_utf8(text).unwrap();
    let on = |vm: &str| -> Vec<&str> {
        text.lines()
            .filter(|l| l.starts_with("hqdmux_") && l.contains(&format!("vm=\"{vm}\"")))
            .collect()
    };
    assert!(!on("g1").is_empty(), "{text}");
    assert!(
        on("g1").iter().all(|l| l.contains("gpu_id=\"1\"")),
        "{text}"
    );
    assert!(
        on("cfg").iter().all(|l| l.contains("gpu_id=\"0\"")),
        "{text}"
    );
    assert_eq!(vm_state(&text, "g1", "paused"), [("1".into(), "1".into())]);
    assert_eq!(vm_state(&text, "cfg", "paused"), [("0".into(), "0".into())]);
    assert_eq!(
        vm_state(&text, "cfg", "running"),
        [("0".into(), "1".into())]
    );

    // GPU 1's timeline answers for its GPU.
    let (st, t) = vmm::http::call(
        &d.api,
        "GET",
        "/api/v1/timeline?seconds=1&format=json&gpu_id=1",
        None,
    )
    .unwrap();
    assert_eq!(st, 200);
    let t: Value = serde_json::from_slice(&t).unwrap();
    assert_eq!(t["gpu_id"], 1, "{t}");

    // Removed: its client is disconnected; GPU 0 is untouched.
    let (st, v) = d.call("DELETE", "/vgpus/g1", None);
    assert_eq!((st, &v["gpu_id"]), (200, &json!(1)), "{v}");
    let mut c1 = c1;
    assert!(c1.reset().is_err(), "the client was disconnected");
    assert_eq!(d.vgpu("cfg")["state"], "connected");
    drop(c0);
    let r = d.finish();
    let ids: Vec<u32> = r.gpus.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [0, 1]);
    let names: Vec<&str> = r.vgpus.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["cfg", "auto"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_devices_file_socket_spelt_through_a_symlink_is_refused_as_that_vgpus() {
    // The devices file is read through a symlink to the API socket's
    // directory: its vGPU's socket is `link/cfg.sock`, the API's is
    // `dir/cfg.sock`, one file. Creating a vGPU on it is refused as
    // another vGPU's, without a probe connection to the live vGPU.
    let dir = scratch("vgpu-sockkey").canonicalize().unwrap();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let d = Daemon::reading(&dir, &link, "");
    let (st, e) = d.call(
        "POST",
        "/vgpus",
        Some(json!({"name": "dup", "socket": "cfg.sock"})),
    );
    assert_eq!(st, 409, "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("is another vGPU's"),
        "{e}"
    );
    assert_eq!(d.names(), ["cfg"]);
    assert_eq!(d.vgpu("cfg")["connections"], 0);
    let r = d.finish();
    assert_eq!(r.vgpus[0].1.connections, 0);
    let _ = std::fs::remove_dir_all(&dir);
}
