//! Preemption timeout in real time (issue 11): a low-priority VM runs a
//! kernel without a CWSR save point (1-hour workgroups) on every CU; a
//! high-priority VM rings a doorbell for a short kernel. The scheduler
//! preempts the hung queue, its save cannot finish, and after the hung VM's
//! `preempt_timeout` the arbiter resets it (error 22, error vector).
//!
//! Per timeout, per sample (a fresh arbiter each):
//! * `reset_ms`: from the high-priority doorbell `write` to the hung VM's
//!   error vector (the timeout plus the host's reaction);
//! * `overshoot_us`: `reset_ms` minus the timeout;
//! * `hi_done_ms`: from the doorbell to the high-priority kernel's completion
//!   vector (it can only run once the hung queue is gone).
//!
//! `cargo run --release -p hqdmux-mdev --features probe --example preempt_timeout [-- SAMPLES]`.
//! Host figures; nothing here asserts.

use abi::kernel::{flags, KernelKind};
use abi::vgpu::{error, hqd_state, reg, ERROR_VECTOR};
use mdev::probe::{
    add_guest, hqd_reg, interrupt_signal, load_hqd, mqd_addr, pct, tiny_arbiter, RecordingIrqs,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Waits for vector `v` (10 s at most); returns when it was first raised.
fn vector(irqs: &RecordingIrqs, v: u16) -> Instant {
    irqs.wait_for(v, 1, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("vector {v} not raised within 10 s"))
}

/// One sample: (reset, hi done) in ns since the high-priority doorbell.
fn sample(timeout: Duration) -> (u64, u64) {
    let a = tiny_arbiter();
    let vm = |name: &str, prio: u8, no_save: bool| {
        let irqs = Arc::new(RecordingIrqs::new());
        let g = add_guest(&a, name, prio, 1 << 34, 64, irqs.clone());
        let (mut tvm, mut q) = (g.tvm, g.q);
        tvm.kernel_flags = if no_save { flags::NO_SAVE_POINT } else { 0 };
        load_hqd(&g.fe, 0, mqd_addr(&q));
        let cost = if no_save { 3_600_000_000_000 } else { 10_000 };
        tvm.kernel(&mut q, KernelKind::Mark, 4, 64, cost, 1, true);
        let s = *q.signals.last().unwrap();
        let mailbox = tvm.alloc(8, 8);
        interrupt_signal(&*tvm.mem, s, mailbox, 1).unwrap();
        (g.handle, g.fe, irqs)
    };
    let (hung, hung_fe, hung_irqs) = vm("hung", 2, true);
    a.set_preempt_timeout(hung, timeout).unwrap();
    hung_fe.doorbell_eventfd(0).write(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while hung_fe.reg_read(hqd_reg(0, reg::CP_HQD_STATE)) != hqd_state::ON_HQD {
        assert!(Instant::now() < deadline, "hung queue not mapped");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (hi, hi_fe, hi_irqs) = vm("hi", 12, false);
    let t0 = Instant::now();
    hi_fe.doorbell_eventfd(0).write(1).unwrap();
    let reset = vector(&hung_irqs, ERROR_VECTOR as u16);
    let done = vector(&hi_irqs, 0);
    assert_eq!(
        hung_fe.reg_read(hqd_reg(0, reg::CP_HQD_ERROR)),
        error::PREEMPTION_TIMEOUT
    );
    a.remove_vm(hung);
    a.remove_vm(hi);
    a.shutdown();
    (
        reset.saturating_duration_since(t0).as_nanos() as u64,
        done.saturating_duration_since(t0).as_nanos() as u64,
    )
}

fn main() {
    let samples: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    for ms in [10u64, 50, 200] {
        let timeout = Duration::from_millis(ms);
        let (mut reset, mut done) = (Vec::new(), Vec::new());
        for _ in 0..samples {
            let (r, d) = sample(timeout);
            reset.push(r);
            done.push(d);
        }
        let mut over: Vec<u64> = reset
            .iter()
            .map(|r| r.saturating_sub(timeout.as_nanos() as u64))
            .collect();
        println!(
            "timeout {ms:>3} ms  samples={samples}  reset_ms p50={:.2} max={:.2}  overshoot_us p50={:.0} max={:.0}  hi_done_ms p50={:.2} max={:.2}",
            pct(&mut reset, 0.5) as f64 / 1e6,
            pct(&mut reset, 1.0) as f64 / 1e6,
            pct(&mut over, 0.5) as f64 / 1e3,
            pct(&mut over, 1.0) as f64 / 1e3,
            pct(&mut done, 0.5) as f64 / 1e6,
            pct(&mut done, 1.0) as f64 / 1e6,
        );
    }
}
