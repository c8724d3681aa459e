//! The simulator's pending timers: a 4-ary min-heap keyed by (time, arm
//! sequence number).
//!
//! Every workgroup end, batch end and poll is armed here and popped in
//! time order; on many-queue tenants whose workgroups pair (a guest
//! workgroup per event) the binary heap's pop and push were about a sixth
//! of the simulator's host time. Four children per node halve the levels
//! a pop walks down (and a push walks up), and the key is one `u128`
//! compare.
//!
//! The order is the same as the `BinaryHeap<Reverse<(Nanos, u64,
//! Timer)>>` it replaces: the arm sequence number is unique (`SimGpu::arm`
//! increments it per timer), so no two timers have the same key and the
//! pop order is fully determined by (time, sequence) whatever the heap's
//! shape. [`TimerQueue::retain`] keeps the same timers, so the length
//! (which decides when stale timers are dropped) is the same after every
//! operation.

use super::{Nanos, Timer};

/// Children per node.
const ARITY: usize = 4;

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// `at << 64 | seq`: time first, then arm order.
    key: u128,
    timer: Timer,
}

impl Entry {
    fn at(&self) -> Nanos {
        (self.key >> 64) as Nanos
    }
}

/// Pending timers, earliest (then first armed) first.
#[derive(Debug, Default)]
pub(super) struct TimerQueue {
    v: Vec<Entry>,
}

impl TimerQueue {
    /// An empty queue.
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// Timers held (stale ones included).
    pub(super) fn len(&self) -> usize {
        self.v.len()
    }

    /// Adds `timer` due at `at`, armed as the `seq`-th timer (unique).
    pub(super) fn push(&mut self, at: Nanos, seq: u64, timer: Timer) {
        let e = Entry {
            key: (at as u128) << 64 | seq as u128,
            timer,
        };
        self.v.push(e);
        self.sift_up(self.v.len() - 1);
    }

    /// The earliest timer: its time and the timer.
    pub(super) fn peek(&self) -> Option<(Nanos, &Timer)> {
        self.v.first().map(|e| (e.at(), &e.timer))
    }

    /// Removes and returns the earliest timer.
    pub(super) fn pop(&mut self) -> Option<(Nanos, Timer)> {
        let last = self.v.pop()?;
        let top = match self.v.first_mut() {
            Some(first) => {
                let top = *first;
                *first = last;
                self.sift_down(0);
                top
            }
            None => last,
        };
        Some((top.at(), top.timer))
    }

    /// Keeps only the timers `keep` accepts (their order is kept).
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Timer) -> bool) {
        self.v.retain(|e| keep(&e.timer));
        let n = self.v.len();
        if n > 1 {
            for i in (0..=(n - 2) / ARITY).rev() {
                self.sift_down(i);
            }
        }
    }

    fn sift_up(&mut self, mut i: usize) {
        let e = self.v[i];
        while i > 0 {
            let parent = (i - 1) / ARITY;
            let p = self.v[parent];
            if p.key <= e.key {
                break;
            }
            self.v[i] = p;
            i = parent;
        }
        self.v[i] = e;
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.v.len();
        let e = self.v[i];
        loop {
            let first = i * ARITY + 1;
            if first >= n {
                break;
            }
            let end = (first + ARITY).min(n);
            let mut best = first;
            let mut best_key = self.v[first].key;
            for c in first + 1..end {
                let k = self.v[c].key;
                if k < best_key {
                    best = c;
                    best_key = k;
                }
            }
            if e.key <= best_key {
                break;
            }
            self.v[i] = self.v[best];
            i = best;
        }
        self.v[i] = e;
    }
}
