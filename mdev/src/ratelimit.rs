//! A small limiter for guest-triggered log lines: at most [`LOG_BURST`] lines
//! per [`LOG_WINDOW`] per VM; the first line after a quiet spell says how many
//! were suppressed. A guest that floods a missing doorbell or register costs
//! the host a counter increment per access, not a log line.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines logged per window.
pub const LOG_BURST: u32 = 5;
/// Window length.
pub const LOG_WINDOW: Duration = Duration::from_secs(1);

#[derive(Default)]
struct State {
    window_start: Option<Instant>,
    in_window: u32,
    /// Suppressed since the last logged line.
    pending: u64,
    /// Suppressed in total.
    total: u64,
    logged: u64,
}

/// What to do with one guest-triggered line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Log it; `suppressed` lines were dropped since the previous logged one.
    Log {
        /// Lines dropped before this one.
        suppressed: u64,
    },
    /// Drop it (counted).
    Suppress,
}

/// Per-VM limiter (its own small lock; never held across anything else).
#[derive(Default)]
pub struct RateLimiter {
    st: Mutex<State>,
}

impl RateLimiter {
    /// A limiter with nothing logged yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decide about one line at `now`.
    pub fn admit(&self, now: Instant) -> Admit {
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = match st.window_start {
            Some(t) => now
                .checked_duration_since(t)
                .is_some_and(|d| d >= LOG_WINDOW),
            None => true,
        };
        if fresh {
            st.window_start = Some(now);
            st.in_window = 0;
        }
        if st.in_window < LOG_BURST {
            st.in_window += 1;
            st.logged += 1;
            Admit::Log {
                suppressed: std::mem::take(&mut st.pending),
            }
        } else {
            st.pending += 1;
            st.total += 1;
            Admit::Suppress
        }
    }

    /// Takes the count of lines suppressed since the last logged one (for a
    /// final line when the VM goes away).
    pub fn take_pending(&self) -> u64 {
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut st.pending)
    }

    /// (lines logged, lines suppressed) so far.
    pub fn counts(&self) -> (u64, u64) {
        let st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        (st.logged, st.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_a_burst_per_window_and_reports_the_dropped_count() {
        let rl = RateLimiter::new();
        let t0 = Instant::now();
        let mut logged = 0;
        for _ in 0..10_000 {
            if matches!(rl.admit(t0), Admit::Log { .. }) {
                logged += 1;
            }
        }
        assert_eq!(logged, LOG_BURST);
        assert_eq!(rl.counts(), (LOG_BURST as u64, 10_000 - LOG_BURST as u64));
        // Next window: the first line carries the suppressed count.
        assert_eq!(
            rl.admit(t0 + LOG_WINDOW),
            Admit::Log {
                suppressed: 10_000 - LOG_BURST as u64
            }
        );
        assert_eq!(rl.admit(t0 + LOG_WINDOW), Admit::Log { suppressed: 0 });
    }
}
