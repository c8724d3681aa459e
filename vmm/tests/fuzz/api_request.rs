//! Fuzz harness `api_request`: hostile bytes on the operator API socket
//! through [`vmm::http::parse_request`] and, when they frame a request,
//! [`vmm::api::FleetControl::route`] (a fleet of two VMs on a running GPU
//! arbiter, one without a vGPU; no fleet loop, so stop and add are refused).
//! Shared by `fuzz/fuzz_targets/api_request.rs` and `vmm/tests/fuzz_corpus.rs`.
#![allow(dead_code)]

use gpu::topology::GpuTopology;
use mdev::arbiter::GpuArbiter;
use mdev::probe::NoIrqs;
use scheduler::{SchedConfig, VmParams};
use std::sync::{Arc, OnceLock};
use vmm::api::FleetControl;
use vmm::http::{parse_request, ParseError, Responder, MAX_BODY, MAX_HEAD};

fn control() -> &'static FleetControl {
    static CTL: OnceLock<FleetControl> = OnceLock::new();
    CTL.get_or_init(|| {
        let topo = GpuTopology::tiny();
        let gpu =
            gpusim::realtime_backend(&topo, &gpusim::SimParams::default(), 0).expect("backend");
        let m = GpuArbiter::start(topo, SchedConfig::default(), gpu).expect("arbiter");
        let mem = Arc::new(gpu::mem::SparseMemory::new(1 << 20));
        let (h, _fe) = m
            // The VM's MSI-X vectors go nowhere (no queue is ever loaded).
            .add_vm("gpu0", mem, VmParams::default(), Arc::new(NoIrqs))
            .expect("add_vm");
        let cfg = vmm::config::FleetConfig::parse(
            "[[vm]]\nname = \"gpu0\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\n\
             [[vm]]\nname = \"cpu0\"\nimage = \"builtin:hello\"\n",
            std::path::Path::new("/fuzz/fleet.toml"),
        )
        .expect("config");
        FleetControl::new(
            Arc::new(vmm::fleet::FleetGpus::single(0, m)),
            &cfg,
            &[Some(h), None],
        )
    })
}

/// Runs one input (any bytes, as a client would send them).
pub fn run(data: &[u8]) {
    let mut rest = data;
    // Pipelined requests: parse until the bytes run out or stop framing.
    for _ in 0..8 {
        match parse_request(rest) {
            Ok((req, used)) => {
                assert!(used > 0 && used <= rest.len());
                assert!(req.body.len() <= MAX_BODY);
                assert!(req.path.starts_with('/'));
                let (reply, rx) = Responder::detached();
                control().route(req, reply);
                let (_, resp) = rx.recv().expect("every request is answered");
                let v: serde_json::Value =
                    serde_json::from_slice(&resp.body).expect("answers are JSON");
                if resp.status >= 400 {
                    assert!(resp.status < 600);
                    assert!(v["error"].is_string(), "error bodies name a reason: {v}");
                }
                rest = &rest[used..];
            }
            Err(ParseError::Incomplete) => {
                assert!(rest.len() < MAX_HEAD + MAX_BODY + 4 || rest.len() >= MAX_HEAD);
                return;
            }
            Err(e) => {
                assert!((400..600).contains(&e.status()));
                return;
            }
        }
    }
}

/// Seed inputs.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let get = |p: &str| format!("GET {p} HTTP/1.1\r\nHost: x\r\n\r\n");
    let with = |m: &str, p: &str, ct: &str, b: &str| {
        format!(
            "{m} {p} HTTP/1.1\r\nContent-Type: {ct}\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
    };
    let j = "application/json";
    [
        ("list", get("/api/v1/vms")),
        ("get", get("/api/v1/vms/gpu0")),
        ("get-missing", get("/api/v1/vms/nope")),
        ("fleet", get("/api/v1/fleet")),
        ("policy", get("/api/v1/policy")),
        (
            "policy-set",
            with("PUT", "/api/v1/policy", j, "{\"policy\":\"timeslice\"}"),
        ),
        (
            "policy-bad",
            with("PUT", "/api/v1/policy", j, "{\"policy\":\"lottery\"}"),
        ),
        (
            "priority",
            with("PATCH", "/api/v1/vms/gpu0", j, "{\"priority\":12}"),
        ),
        (
            "priority-range",
            with("PATCH", "/api/v1/vms/gpu0", j, "{\"priority\":16}"),
        ),
        (
            "weight-cpu",
            with("PATCH", "/api/v1/vms/cpu0", j, "{\"weight\":3}"),
        ),
        (
            "quantum",
            with("PATCH", "/api/v1/vms/gpu0", j, "{\"quantum_ms\":2}"),
        ),
        (
            "quantum-reset",
            with("PATCH", "/api/v1/vms/gpu0", j, "{\"quantum_ms\":null}"),
        ),
        ("pause", with("POST", "/api/v1/vms/gpu0/pause", j, "")),
        ("resume", with("POST", "/api/v1/vms/gpu0/resume", j, "")),
        ("stop", with("POST", "/api/v1/vms/gpu0/stop", j, "")),
        (
            "add-toml",
            with(
                "POST",
                "/api/v1/vms",
                "application/toml",
                "[[vm]]\nname = \"n\"\nimage = \"builtin:hello\"\n",
            ),
        ),
        (
            "add-json",
            with(
                "POST",
                "/api/v1/vms",
                j,
                "{\"name\":\"n\",\"image\":\"builtin:hello\",\"gpu\":true}",
            ),
        ),
        (
            "add-bad",
            with("POST", "/api/v1/vms", j, "{\"name\":\"gpu0\",\"vcpus\":99}"),
        ),
        (
            "pipelined",
            format!("{}{}", get("/api/v1/vms"), get("/api/v1/policy")),
        ),
        (
            "chunked",
            "POST /api/v1/vms HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".into(),
        ),
        (
            "bad-length",
            "GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n".into(),
        ),
        ("method", "DELETE /api/v1/vms/gpu0 HTTP/1.1\r\n\r\n".into()),
        ("lf-only", "GET /api/v1/vms HTTP/1.1\n\n".into()),
        ("empty", " \t\r\n".into()),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_owned(), s.into_bytes()))
    .collect()
}
