//! Tests of the timer queue (`sim/timer_queue.rs`): it pops the timers in
//! the order the binary heap it replaced did, (time, arm sequence), with
//! pushes, pops and drops of stale timers interleaved.

use super::timer_queue::TimerQueue;
use super::Timer;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A timer whose fields carry `i` (to tell timers apart).
fn timer(i: u32) -> Timer {
    match i % 3 {
        0 => Timer::WgDone { idx: i, gen: i / 3 },
        1 => Timer::BatchDone { idx: i, gen: i / 3 },
        _ => Timer::Poll {
            slot: i,
            gen: i as u64,
        },
    }
}

#[test]
fn pops_in_time_then_arm_order() {
    let mut q = TimerQueue::new();
    assert_eq!(q.pop(), None);
    // Equal times pop in arm order; the earliest time first.
    q.push(50, 1, timer(1));
    q.push(10, 2, timer(2));
    q.push(50, 3, timer(3));
    q.push(10, 4, timer(4));
    q.push(u64::MAX, 5, timer(5));
    q.push(0, 6, timer(6));
    assert_eq!(q.len(), 6);
    assert_eq!(q.peek(), Some((0, &timer(6))));
    let order: Vec<(u64, Timer)> = std::iter::from_fn(|| q.pop()).collect();
    assert_eq!(
        order,
        vec![
            (0, timer(6)),
            (10, timer(2)),
            (10, timer(4)),
            (50, timer(1)),
            (50, timer(3)),
            (u64::MAX, timer(5)),
        ]
    );
    assert_eq!(q.len(), 0);
}

#[test]
fn matches_the_binary_heap_it_replaced() {
    let mut rng = SmallRng::seed_from_u64(18);
    let mut q = TimerQueue::new();
    let mut h: BinaryHeap<Reverse<(u64, u64, Timer)>> = BinaryHeap::new();
    let mut seq = 0u64;
    for round in 0..20_000u32 {
        match rng.gen_range(0..10) {
            // Arm: a few distinct times, so that ties are common.
            0..=5 => {
                seq += 1;
                let at = rng.gen_range(0..64u64) * 1000;
                let t = timer(round);
                q.push(at, seq, t);
                h.push(Reverse((at, seq, t)));
            }
            6..=8 => {
                let want = h.pop().map(|Reverse((at, _, t))| (at, t));
                assert_eq!(q.pop(), want, "round {round}");
            }
            // Drop the "stale" timers (here: those of odd index).
            _ => {
                let stale = |t: &Timer| match *t {
                    Timer::WgDone { idx, .. } | Timer::BatchDone { idx, .. } => idx % 2 == 1,
                    _ => false,
                };
                q.retain(|t| !stale(t));
                let mut v = std::mem::take(&mut h).into_vec();
                v.retain(|Reverse((_, _, t))| !stale(t));
                h = BinaryHeap::from(v);
            }
        }
        assert_eq!(q.len(), h.len(), "round {round}");
        assert_eq!(
            q.peek().map(|(at, t)| (at, *t)),
            h.peek().map(|Reverse((at, _, t))| (*at, *t)),
            "round {round}"
        );
    }
    while let Some(Reverse((at, _, t))) = h.pop() {
        assert_eq!(q.pop(), Some((at, t)));
    }
    assert_eq!(q.pop(), None);
}
