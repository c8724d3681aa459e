//! Fuzz harness `api_request`: a hostile control-socket request line through
//! [`vmm::api::parse_request`] and [`vmm::api::FleetControl::handle`] (a fleet
//! of two VMs on a running GPU arbiter, one without a vGPU). Shared by
//! `fuzz/fuzz_targets/api_request.rs` and `vmm/tests/fuzz_corpus.rs`.
#![allow(dead_code)]

use mdev::arbiter::{open_backend, GpuArbiter};
use mdev::topology::GpuTopology;
use mdev::vgpu::InterruptSink;
use scheduler::{SchedConfig, VmParams};
use std::sync::{Arc, OnceLock};
use vmm::api::{parse_request, FleetControl, Request};

/// The VM's MSI-X vectors go nowhere (no queue is ever loaded).
struct NoIrqs;

impl InterruptSink for NoIrqs {
    fn raise(&self, _vector: u16) {}
}

fn control() -> &'static FleetControl {
    static CTL: OnceLock<FleetControl> = OnceLock::new();
    CTL.get_or_init(|| {
        let topo = GpuTopology::tiny();
        let gpu = open_backend(&topo, 0).expect("backend");
        let m = GpuArbiter::start(topo, SchedConfig::default(), gpu).expect("arbiter");
        let mem = Arc::new(mdev::mem::SparseMemory::new(1 << 20));
        let (h, _fe) = m
            .add_vm("gpu0", mem, VmParams::default(), Arc::new(NoIrqs))
            .expect("add_vm");
        FleetControl::new(
            Some(m),
            vec![("gpu0".into(), Some(h)), ("cpu0".into(), None)],
        )
    })
}

/// Runs one input (any bytes; the socket reads a line of UTF-8 text).
pub fn run(data: &[u8]) {
    let line = String::from_utf8_lossy(data);
    let parsed = parse_request(&line);
    if let Ok(r) = &parsed {
        // Every parsed word comes from the line.
        let words: Vec<&str> = line.split_whitespace().collect();
        match r {
            Request::List | Request::Policy(None) => assert_eq!(words.len(), 1),
            Request::Priority { vm, value } | Request::Weight { vm, value } => {
                assert_eq!((words[1], words[2]), (*vm, *value))
            }
            Request::Policy(Some(p)) => assert_eq!(words[1], *p),
        }
    }
    let reply = control().handle(&line);
    assert!(reply.ends_with('\n'), "reply is whole lines: {reply:?}");
    if parsed.is_err() {
        assert!(reply.starts_with("error: "), "{reply:?}");
    }
}

/// Seed inputs.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    [
        ("list", "list\n"),
        ("priority", "priority gpu0 12\n"),
        ("priority-range", "priority gpu0 16\n"),
        ("weight", "weight gpu0 100\n"),
        ("weight-cpu", "weight cpu0 3\n"),
        ("weight-nan", "weight gpu0 -1\n"),
        ("policy", "policy\n"),
        ("policy-set", "policy timeslice\n"),
        ("policy-bad", "policy lottery\n"),
        ("unknown", "reboot gpu0\n"),
        ("empty", " \t\r\n"),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_owned(), s.as_bytes().to_vec()))
    .collect()
}
