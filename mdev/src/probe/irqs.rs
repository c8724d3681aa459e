//! The interrupt sinks of tests, examples, benches and fuzz harnesses (the
//! real ones are the VMM's MSI-X table and the vfio-user server's irq fds).
//!
//! * [`NoIrqs`] drops every signal.
//! * [`RecordingIrqs`] records every raised vector in order, with when it
//!   was raised, and lets a caller wait for a count or a condition with a
//!   deadline (against hangs: nothing here asserts on durations).

use crate::vgpu::InterruptSink;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long [`RecordingIrqs::wait_until`] sleeps between two looks at a
/// condition when no vector is raised (conditions that change without an
/// interrupt, e.g. a signal value in guest memory).
const POLL: Duration = Duration::from_millis(1);

/// An interrupt sink that drops every signal.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoIrqs;

impl InterruptSink for NoIrqs {
    fn raise(&self, _vector: u16) {}
}

/// An interrupt sink that records every raised vector (in order, with the
/// instant it was raised) and wakes waiters. [`RecordingIrqs::panicking`]
/// instead panics on every raise: a host bug in a VM's interrupt path.
#[derive(Debug, Default)]
pub struct RecordingIrqs {
    raised: Mutex<Vec<(u16, Instant)>>,
    cv: Condvar,
    panic_on_raise: bool,
}

impl InterruptSink for RecordingIrqs {
    fn raise(&self, vector: u16) {
        if self.panic_on_raise {
            panic!("injected host bug");
        }
        self.log().push((vector, Instant::now()));
        self.cv.notify_all();
    }
}

impl RecordingIrqs {
    /// A sink that records.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sink that panics on every raise and records nothing (a host bug
    /// in the VM's interrupt path, for fault-injection tests).
    pub fn panicking() -> Self {
        RecordingIrqs {
            panic_on_raise: true,
            ..Self::default()
        }
    }

    fn log(&self) -> MutexGuard<'_, Vec<(u16, Instant)>> {
        self.raised.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every vector raised so far, in order.
    pub fn raised(&self) -> Vec<u16> {
        self.log().iter().map(|(v, _)| *v).collect()
    }

    /// How many times `vector` was raised.
    pub fn count(&self, vector: u16) -> usize {
        self.log().iter().filter(|(v, _)| *v == vector).count()
    }

    /// How many vectors were raised, all vectors together.
    pub fn total(&self) -> usize {
        self.log().len()
    }

    /// Waits until `vector` has been raised `n` times (`n` >= 1), at most
    /// `timeout`; returns when the `n`-th was raised, or `None` at the
    /// deadline.
    pub fn wait_for(&self, vector: u16, n: usize, timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        let mut log = self.log();
        loop {
            if let Some((_, at)) = log
                .iter()
                .filter(|(v, _)| *v == vector)
                .nth(n.saturating_sub(1))
            {
                return Some(*at);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            log = self
                .cv
                .wait_timeout(log, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sleeps on raised vectors until `done` holds or `until` passes;
    /// returns whether `done` holds. `done` is also looked at every
    /// millisecond, for conditions no interrupt announces.
    pub fn wait_until(&self, until: Instant, mut done: impl FnMut() -> bool) -> bool {
        loop {
            if done() {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            let log = self.log();
            drop(self.cv.wait_timeout(log, (until - now).min(POLL)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn records_in_order_and_counts_per_vector() {
        let irqs = RecordingIrqs::new();
        for v in [0, 3, 0, 8] {
            irqs.raise(v);
        }
        assert_eq!(irqs.raised(), vec![0, 3, 0, 8]);
        assert_eq!(irqs.count(0), 2);
        assert_eq!(irqs.count(3), 1);
        assert_eq!(irqs.count(5), 0);
        assert_eq!(irqs.total(), 4);
        NoIrqs.raise(0);
    }

    #[test]
    fn wait_for_returns_the_nth_raise_and_gives_up_at_the_deadline() {
        let irqs = Arc::new(RecordingIrqs::new());
        irqs.raise(1);
        irqs.raise(2);
        irqs.raise(1);
        let log = irqs.log().clone();
        assert_eq!(irqs.wait_for(1, 1, Duration::ZERO), Some(log[0].1));
        assert_eq!(irqs.wait_for(1, 2, Duration::ZERO), Some(log[2].1));
        assert_eq!(irqs.wait_for(1, 3, Duration::ZERO), None);
        assert_eq!(irqs.wait_for(7, 1, Duration::ZERO), None);
        // A raise from another thread wakes the waiter (deadline against hangs).
        let other = irqs.clone();
        let t = std::thread::spawn(move || other.raise(7));
        assert!(irqs.wait_for(7, 1, Duration::from_secs(60)).is_some());
        t.join().unwrap();
    }

    #[test]
    fn wait_until_sees_conditions_with_and_without_interrupts() {
        let irqs = RecordingIrqs::new();
        assert!(!irqs.wait_until(Instant::now(), || false));
        assert!(irqs.wait_until(Instant::now(), || true));
        irqs.raise(0);
        assert!(irqs.wait_until(Instant::now(), || irqs.count(0) == 1));
    }

    #[test]
    fn a_panicking_sink_panics_and_records_nothing() {
        let irqs = RecordingIrqs::panicking();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| irqs.raise(0)));
        assert!(r.is_err());
        assert!(irqs.raised().is_empty());
    }
}
