//! Helpers the doorbell benches share (`mod common;` in each example; a
//! folder without `main.rs`, so Cargo does not build it as an example).
//! Not every bench uses every helper.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mdev::arbiter::{DoorbellSeen, GpuArbiter};
use vfio_server::{ServerOptions, VgpuServer, VgpuSpec};
use vmm::config::VmConfig;
use vmm::vm::VmSpec;

/// The spec of VM `vc`, number `id`, of a bench's fleet: its builtin image
/// (`image = "builtin:NAME"`), one vCPU, the console not echoed.
pub fn bench_vm_spec(id: usize, vc: &VmConfig) -> VmSpec {
    let image = vc.image.strip_prefix("builtin:").expect("builtin image");
    VmSpec {
        id: id as u32,
        name: vc.name.clone(),
        elf: images::builtin(image).expect("image").into(),
        mem_bytes: vc.memory_mib << 20,
        vcpus: 1,
        args: vc.args.clone(),
        echo: false,
        extra_devices: Vec::new(),
    }
}

/// The `q` quantile of `v` (sorted in place); NaN when `v` is empty.
pub fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Positional argument `i` of the command line as a number, `d` when it is
/// missing or not a number.
pub fn arg(i: usize, d: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(d)
}

/// Exits with a message when `/dev/kvm` is not there (`bench` names the
/// example).
pub fn require_kvm(bench: &str) {
    if !vmm::kvm_available() {
        eprintln!("{bench}: /dev/kvm is not available");
        std::process::exit(1);
    }
}

/// A socket path in the temporary folder, unique to this process:
/// `{prefix}-{pid}-{tag}.sock`.
pub fn sock(prefix: &str, tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{prefix}-{}-{tag}.sock", std::process::id()))
}

/// Server options with the BAR2 doorbell page offered and polled (`page`)
/// or not (the default: doorbells by message).
pub fn page_options(page: bool) -> ServerOptions {
    ServerOptions {
        doorbell_poll: page.then_some(vfio_server::DEFAULT_DOORBELL_POLL),
        ..Default::default()
    }
}

/// A vGPU `name` with `params`, served at `path` on `a` on its own thread.
pub fn vgpu_server(
    a: &Arc<GpuArbiter>,
    path: &Path,
    name: &str,
    params: scheduler::VmParams,
    opts: ServerOptions,
) -> Arc<VgpuServer> {
    let s = VgpuServer::bind(
        path,
        VgpuSpec {
            name: name.into(),
            params,
            preempt_timeout: Duration::from_secs(9),
            guard: Default::default(),
            quantum: None,
        },
        a.clone(),
        opts,
    )
    .expect("bind");
    s.spawn().expect("serve");
    s
}

/// Ns per store of a guest's store rounds of `n` stores each: (the bare
/// ioeventfd rounds, checkpoints 10 -> 11; the doorbell rounds, 12 -> 13),
/// one figure per round.
pub fn store_ns(r: &vmm::vm::VmReport, n: u64) -> (Vec<f64>, Vec<f64>) {
    let per = |a, b| -> Vec<f64> {
        r.spans(a, b)
            .iter()
            .map(|d| d.as_secs_f64() * 1e9 / n as f64)
            .collect()
    };
    (per(10, 11), per(12, 13))
}

/// When the `doorbell` guest of report `r` submitted each detection job
/// (its checkpoint 2, `detect=` mode).
pub fn submits(r: &vmm::vm::VmReport) -> Vec<Instant> {
    r.checkpoints
        .iter()
        .filter(|c| c.0 == 2)
        .map(|c| c.1)
        .collect()
}

/// Us from each of `submits` to the preemption issued for it: the first
/// doorbell of `seen` after the submit from a vGPU `ours` accepts, when it
/// preempted (the others are not counted).
pub fn preempt_us(
    submits: &[Instant],
    seen: &[DoorbellSeen],
    ours: impl Fn(mdev::vgpu::VmId) -> bool,
) -> Vec<f64> {
    let mut out = Vec::new();
    for t in submits {
        if let Some(d) = seen.iter().find(|d| ours(d.vm) && d.at > *t) {
            if d.preempted {
                out.push((d.issued.unwrap_or(d.at) - *t).as_secs_f64() * 1e6);
            }
        }
    }
    out
}
