//! Replays the committed fuzz corpora of the guest-facing targets
//! (`fuzz/corpus/{mqd_admission,aql_packet,kernel_descriptor,vgpu_regs}/`)
//! through the same harnesses the libFuzzer targets run, so `cargo test`
//! exercises them without a fuzzer (docs/fuzzing.md).
//!
//! `HQDMUX_WRITE_FUZZ_SEEDS=1 cargo test -p hqdmux-mdev --test fuzz_corpus -- --ignored`
//! rewrites the generated seed files.

#[path = "fuzz/gpu_queue.rs"]
mod gpu_queue;
#[path = "fuzz/mqd_admission.rs"]
mod mqd_admission;
#[path = "fuzz/vgpu_regs.rs"]
mod vgpu_regs;

use std::path::PathBuf;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

/// Runs every file of the target's corpus; returns how many ran.
fn replay(target: &str, run: fn(&[u8])) -> usize {
    let dir = corpus_dir(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let r = std::panic::catch_unwind(|| run(&data));
        assert!(r.is_ok(), "{target}: {} panicked", f.display());
    }
    assert!(!files.is_empty(), "{target}: empty corpus");
    files.len()
}

#[test]
fn mqd_admission_corpus() {
    replay("mqd_admission", mqd_admission::run);
}

#[test]
fn aql_packet_corpus() {
    replay("aql_packet", gpu_queue::run_aql_packet);
}

#[test]
fn kernel_descriptor_corpus() {
    replay("kernel_descriptor", gpu_queue::run_kernel_descriptor);
}

#[test]
fn vgpu_regs_corpus() {
    replay("vgpu_regs", vgpu_regs::run);
}

/// The seeds decode as intended: an admitted MQD is admitted, the valid
/// dispatch completes its signal (so the corpus reaches the deep paths).
#[test]
fn seeds_reach_the_model() {
    use abi::mqd::{V9Mqd, MQD_BYTES};
    let (name, d) = &mqd_admission::seeds()[0];
    assert!(name.ends_with("admitted"));
    let img: [u8; MQD_BYTES] = d[2..].try_into().unwrap();
    let topo = mqd_admission::topology(d[0]);
    let mem = gpu::mem::SparseMemory::new(1 << (20 + d[1] as u32 % 21));
    assert_eq!(
        gpu::admission::check_mqd(&topo, &V9Mqd::from_bytes(&img), &mem),
        Ok(())
    );
    let mut w = gpu_queue::World::new();
    let (aql, _) = gpu_queue::seeds();
    let pkt: [u8; 64] = aql[0].1[1..65].try_into().unwrap();
    w.run(&[pkt], 1);
    let v = w.vm.mem.read_u64(w.signal + 8).unwrap();
    assert_eq!(v, 0, "the seed dispatch completed its signal");
}

/// The vGPU seeds drive a driver's sequences to their end: a submitted
/// kernel completes, a drain and a CWSR save dequeue finish.
#[test]
fn vgpu_seeds_complete_kernels_and_dequeues() {
    let seeds = vgpu_regs::seeds();
    let seed = |n: &str| &seeds.iter().find(|(name, _)| name == n).unwrap().1;
    // A deadline against hangs only (a loaded host is slow, never wrong).
    let budget = std::time::Duration::from_secs(30);
    let o = vgpu_regs::run_outcome(seed("load-submit-wait-drain"), budget);
    assert_eq!((o.completed_waits, o.finished_dequeues), (1, 1));
    let o = vgpu_regs::run_outcome(seed("submit-save-reload"), budget);
    assert_eq!((o.completed_waits, o.finished_dequeues), (1, 2));
    // Nothing completes on a queue whose MQD was refused.
    let o = vgpu_regs::run_outcome(seed("bad-mqd-then-load"), budget);
    assert_eq!(o, vgpu_regs::Outcome::default());
}

#[test]
#[ignore = "writes fuzz/corpus seed files; run with HQDMUX_WRITE_FUZZ_SEEDS=1"]
fn write_seeds() {
    if std::env::var_os("HQDMUX_WRITE_FUZZ_SEEDS").is_none() {
        return;
    }
    let (aql, kd) = gpu_queue::seeds();
    for (target, seeds) in [
        ("mqd_admission", mqd_admission::seeds()),
        ("aql_packet", aql),
        ("kernel_descriptor", kd),
        ("vgpu_regs", vgpu_regs::seeds()),
    ] {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, data) in seeds {
            std::fs::write(dir.join(format!("seed-{name}")), data).unwrap();
        }
    }
}
