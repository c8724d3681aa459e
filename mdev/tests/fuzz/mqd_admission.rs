//! Fuzz harness `mqd_admission`: a hostile 2048-byte MQD through
//! [`gpu::admission::check_mqd`], and an admitted one on to `SimGpu::map`, a
//! few model steps and a dequeue. Shared by `fuzz/fuzz_targets/mqd_admission.rs`
//! (libFuzzer) and `mdev/tests/fuzz_corpus.rs` (corpus replay under `cargo test`).
//!
//! Input: byte 0 picks the topology, byte 1 the VM memory size
//! (2^(20 + b % 21) bytes, sparse), the rest is the MQD image (zero padded).

#![allow(dead_code)]

use abi::mqd::{AqlMqdBuilder, V9Mqd, MQD_BYTES};
use gpu::backend::{DequeueMode, MapRequest, PhysGpu, SlotId};
use gpu::mem::{DmaMemory, SparseMemory};
use gpu::topology::{GpuTopology, PartitionMode};
use gpusim::sim::SimGpu;
use std::sync::Arc;

/// The topology byte 0 selects.
pub fn topology(b: u8) -> GpuTopology {
    match b % 3 {
        0 => GpuTopology::tiny(),
        1 => GpuTopology::default(),
        _ => GpuTopology {
            partition_mode: PartitionMode::Cpx,
            ..GpuTopology::default()
        },
    }
}

/// Runs one input; panics only on a host bug.
pub fn run(data: &[u8]) {
    let (Some(&t), Some(&m)) = (data.first(), data.get(1)) else {
        return;
    };
    let topo = topology(t);
    let size = 1u64 << (20 + u32::from(m) % 21);
    let mut img = [0u8; MQD_BYTES];
    let body = &data[2..];
    let n = body.len().min(MQD_BYTES);
    img[..n].copy_from_slice(&body[..n]);
    let mqd = V9Mqd::from_bytes(&img);
    // Every accessor must be total on hostile dwords.
    let _ = (
        mqd.ring_bytes_exact(),
        mqd.packet_addr(u64::MAX),
        mqd.read_index(),
        mqd.quantum(),
        mqd.preload_size(),
        format!("{mqd:?}").len(),
    );
    let mem = Arc::new(SparseMemory::new(size));
    let Ok(()) = gpu::admission::check_mqd(&topo, &mqd, mem.as_ref()) else {
        return;
    };
    // Admitted: the rules the simulator relies on hold.
    assert!(mem.contains(mqd.ring_base(), mqd.ring_bytes()));
    assert!(mem.contains(
        mqd.ctx_save_base(),
        topo.cwsr_area_bytes(mqd.ctx_save_size())
    ));
    assert!(mqd.read_index().is_some());
    // Map it (restoring any saved state the image claims), run a few model
    // steps, ring the doorbell with a hostile value, then dequeue.
    let mut gpu = SimGpu::new(topo, 0).expect("built-in topology is valid");
    let req = MapRequest {
        slot: SlotId(0),
        tag: 1,
        mqd: mqd.clone(),
        mem: mem.clone() as Arc<dyn DmaMemory>,
    };
    if gpu.map(0, req).is_err() {
        return;
    }
    let mut out = Vec::new();
    step(&mut gpu, &mut out, 16);
    gpu.doorbell(gpu_now(&gpu), SlotId(0), mqd.wptr_dw() ^ 0x10);
    step(&mut gpu, &mut out, 16);
    let _ = gpu.unmap(gpu_now(&gpu), SlotId(0), DequeueMode::SaveWaves);
    step(&mut gpu, &mut out, 64);
}

fn gpu_now(gpu: &SimGpu) -> u64 {
    gpu.now()
}

/// At most `n` steps of virtual time.
pub fn step(gpu: &mut SimGpu, out: &mut Vec<gpu::backend::GpuEvent>, n: usize) {
    for _ in 0..n {
        let Some(t) = gpu.next_deadline() else { return };
        let t = t.max(gpu.now());
        gpu.advance(t, out);
    }
}

/// Seed inputs: admitted MQDs for each topology and a few near misses.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    for t in 0..3u8 {
        let topo = topology(t);
        let b = AqlMqdBuilder {
            mqd_addr: 0x1000,
            ring_base: 0x10_0000,
            ring_packets: 64,
            amd_queue: 0x2000,
            eop_base: 0x3000,
            priority: 5,
            ..Default::default()
        }
        .cwsr_for(0x20_0000, topo.cus_per_xcc, topo.ses_per_xcc);
        let good = b.build();
        let mut input = |name: &str, m: &V9Mqd| {
            let mut d = vec![t, 12]; // 2^32 bytes of memory
            d.extend_from_slice(&m.to_bytes());
            v.push((format!("t{t}-{name}"), d));
        };
        input("admitted", &good);
        let mut m = good.clone();
        m.dw[abi::mqd::CP_HQD_PQ_CONTROL] ^= 0x3F;
        input("ring-size", &m);
        let mut m = good.clone();
        m.dw[abi::mqd::CP_HQD_CNTL_STACK_OFFSET] = 0;
        input("saved-state", &m);
        let mut m = good.clone();
        m.set_write_index(20);
        m.set_read_index(4);
        input("pending", &m);
    }
    v
}
