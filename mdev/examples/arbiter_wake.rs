//! How fast the arbiter's service thread reacts to a doorbell, against the
//! floor of an eventfd wake-up of a host thread, measured in the same run.
//!
//! * `eventfd_wake`: a thread blocked in `epoll_wait` on an eventfd; time
//!   from `write` to the thread running (sampled between doorbells, so both
//!   see the same machine load).
//! * `doorbell_to_preempt`: a low-priority VM holds the only HQD slot with
//!   long work; a high-priority VM writes its doorbell eventfd (what KVM does
//!   for an ioeventfd doorbell); time from the `write` to the arbiter having
//!   handed the CWSR preemption to the backend (the doorbell observer).
//!
//! `cargo run --release -p hqdmux-mdev --features probe --example arbiter_wake [-- SAMPLES]`.
//! The last line reads `detect_p99_ratio=D` (p99 doorbell_to_preempt / p99
//! eventfd_wake). Figures are host-dependent; nothing here asserts.

use mdev::probe::{doorbell_to_preempt, pct, Waker};

fn main() {
    let samples: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let waker = Waker::start();
    let mut wake = Vec::new();
    let mut det = doorbell_to_preempt(samples, &waker, &mut wake);
    let (w50, w99) = (pct(&mut wake, 0.5), pct(&mut wake, 0.99));
    let (d50, d99) = (pct(&mut det, 0.5), pct(&mut det, 0.99));
    println!(
        "eventfd_wake         samples={} p50={w50} ns p99={w99} ns",
        wake.len()
    );
    println!(
        "doorbell_to_preempt  samples={} p50={d50} ns p99={d99} ns",
        det.len()
    );
    println!("detect_p99_ratio={:.2}", d99 as f64 / w99.max(1) as f64);
}
