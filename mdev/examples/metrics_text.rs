//! Prints what `GET /metrics` serves after a preemption, and the timeline
//! of it as SVG: a GPU arbiter over the tiny simulated topology, a
//! low-priority VM busy with long kernels, a high-priority VM whose
//! doorbell preempts it (CWSR save, later restore).
//!
//! `cargo run -p hqdmux-mdev --example metrics_text [-- --svg out.svg]`

use abi::kernel::KernelKind;
use abi::vgpu::reg;
use mdev::arbiter::{open_backend, GpuArbiter};
use mdev::mem::{DmaMemory, SparseMemory};
use mdev::sim::testkit::TestVm;
use mdev::topology::GpuTopology;
use mdev::vgpu::InterruptSink;
use scheduler::{SchedConfig, VmParams};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct NoIrq;
impl InterruptSink for NoIrq {
    fn raise(&self, _: u16) {}
}

fn main() {
    let svg = std::env::args().skip_while(|a| a != "--svg").nth(1);
    let topo = GpuTopology::tiny();
    let a = GpuArbiter::start(
        topo.clone(),
        SchedConfig::default(),
        open_backend(&topo, 1).expect("tiny topology"),
    )
    .expect("arbiter");
    let hr = |r: usize| (reg::HQD_BASE + r) as u64;
    let mut guests = Vec::new();
    for (name, prio, kernels, cost) in [
        ("training", 2u8, 8u32, 2_000_000u64),
        ("inference", 12, 4, 100_000),
    ] {
        let mem: Arc<dyn DmaMemory> = Arc::new(SparseMemory::new(1 << 32));
        let mut tvm = TestVm::with_memory(mem.clone(), 0x10_0000);
        let mut q = tvm.queue(&topo, 64, 0);
        let addr = q
            .mqd
            .get64(abi::mqd::CP_MQD_BASE_ADDR_LO, abi::mqd::CP_MQD_BASE_ADDR_HI);
        mem.write(addr, &q.mqd.to_bytes()).expect("MQD in memory");
        let params = VmParams {
            priority: prio,
            ..Default::default()
        };
        let (h, fe) = a.add_vm(name, mem, params, Arc::new(NoIrq)).expect("vm");
        fe.reg_write(hr(reg::CP_MQD_BASE_ADDR), addr as u32);
        fe.reg_write(hr(reg::CP_MQD_BASE_ADDR_HI), (addr >> 32) as u32);
        fe.reg_write(hr(reg::CP_HQD_ACTIVE), 1);
        for k in 0..kernels {
            tvm.kernel(&mut q, KernelKind::Mark, 16, 64, cost, k, true);
        }
        guests.push((h, fe, tvm, q));
    }
    guests[0].1.doorbell_eventfd(0).write(1).expect("doorbell");
    std::thread::sleep(Duration::from_millis(5));
    guests[1].1.doorbell_eventfd(0).write(1).expect("doorbell");
    let deadline = Instant::now() + Duration::from_secs(60);
    for (_, _, tvm, q) in &guests {
        let last = *q.signals.last().expect("kernels");
        while (tvm
            .mem
            .read_u64(last + abi::queue::AMD_SIGNAL_VALUE as u64)
            .expect("signal") as i64)
            > 0
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    print!("{}", a.metrics_text());
    if let Some(path) = svg {
        let t = a.timeline(Duration::from_secs(60));
        let body = mdev::timeline::render_svg(&t, &Default::default());
        std::fs::write(&path, body).expect("write SVG");
        eprintln!("timeline written to {path}");
    }
    for (h, ..) in &guests {
        a.remove_vm(*h);
    }
    a.shutdown();
}
