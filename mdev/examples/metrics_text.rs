//! Prints what `GET /metrics` serves after a preemption, and the timeline
//! of it as SVG: a GPU arbiter over the tiny simulated topology, a
//! low-priority VM busy with long kernels, a high-priority VM whose
//! doorbell preempts it (CWSR save, later restore).
//!
//! `cargo run -p hqdmux-mdev --features probe --example metrics_text [-- --svg out.svg]`

use abi::kernel::KernelKind;
use mdev::probe::{add_guest, load_hqd, mqd_addr, tiny_arbiter, NoIrqs};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let svg = std::env::args().skip_while(|a| a != "--svg").nth(1);
    let a = tiny_arbiter();
    let mut guests = Vec::new();
    for (name, prio, kernels, cost) in [
        ("training", 2u8, 8u32, 2_000_000u64),
        ("inference", 12, 4, 100_000),
    ] {
        let g = add_guest(&a, name, prio, 1 << 32, 64, Arc::new(NoIrqs));
        let (h, fe, mut tvm, mut q) = (g.handle, g.fe, g.tvm, g.q);
        load_hqd(&fe, 0, mqd_addr(&q));
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
