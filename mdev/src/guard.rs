//! The misbehaving-VM guard (issue 11; AMD's GIM has one, e.g. 3 resets in
//! 60 s): per-VM counts of preemption-timeout resets, other queue errors,
//! doorbells that did not move a write index (doorbell storms) and the time
//! its saves waited for its own waves without a save point (issue 18 item
//! 4: time it kept the GPU after the scheduler took it back), each over a
//! sliding window. A VM past one of its limits is quarantined: the arbiter
//! refuses its new loads (`CP_HQD_ERROR` = `abi::vgpu::error::QUARANTINED`),
//! logs one line and shows it in `GpuArbiter::guard_status`, until the
//! operator calls `GpuArbiter::clear_quarantine`.
//!
//! Fleet defaults come from `[gpu.guard]`; a `[[vm]]` may override any
//! field with a `guard = { ... }` table (docs/operators.md).

use scheduler::Nanos;
use serde::Deserialize;

/// Buckets of a [`RateWindow`]: counts are exact to within 1/`BUCKETS` of
/// the window (an event is forgotten between `window` and
/// `window + window / BUCKETS` after it happened).
pub const BUCKETS: usize = 16;

/// Longest guard window (ms): one day.
pub const MAX_WINDOW_MS: u64 = 24 * 3600 * 1000;

/// Default [`GuardConfig::max_save_wait_permille`]: 5% of the window.
pub const DEFAULT_MAX_SAVE_WAIT_PERMILLE: u32 = 50;

/// The guard's totals since a VM was added, by index: preemption-timeout
/// resets, other queue errors, stale doorbells, and ns of save waits
/// ([`GuardEvent::index`]).
pub type GuardTotals = [u64; 4];

/// Guard limits (`[gpu.guard]`). A limit of 0 disables that count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardConfig {
    /// Sliding window (ms), 1..=[`MAX_WINDOW_MS`]. Default 60_000.
    pub window_ms: u64,
    /// Preemption-timeout resets tolerated per window (default 3, as GIM's
    /// example); one more quarantines the VM.
    pub max_resets: u32,
    /// Other queue errors (bad packets, pointers, signals...) tolerated per
    /// window (default 32).
    pub max_queue_errors: u32,
    /// Doorbells that did not move the write index tolerated per window
    /// (default 1_000_000: a doorbell storm).
    pub max_stale_doorbells: u32,
    /// Time the VM's saves may wait for its own waves without a save
    /// point (`NO_SAVE_POINT` kernels: the GPU stays the VM's after the
    /// scheduler took it back), in permille of the window, beyond its
    /// single longest such wait (one long kernel is tolerated: a wait is
    /// at most the preemption timeout, a longer one is a reset).
    /// 0..=1000, 0 disables; default [`DEFAULT_MAX_SAVE_WAIT_PERMILLE`]
    /// (50: 3 s a minute, the promise's 5% tolerance on shares).
    pub max_save_wait_permille: u32,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            window_ms: 60_000,
            max_resets: 3,
            max_queue_errors: 32,
            max_stale_doorbells: 1_000_000,
            max_save_wait_permille: DEFAULT_MAX_SAVE_WAIT_PERMILLE,
        }
    }
}

/// A per-VM override of some [`GuardConfig`] fields (`[[vm]] guard = {...}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardOverride {
    /// See [`GuardConfig::window_ms`].
    pub window_ms: Option<u64>,
    /// See [`GuardConfig::max_resets`].
    pub max_resets: Option<u32>,
    /// See [`GuardConfig::max_queue_errors`].
    pub max_queue_errors: Option<u32>,
    /// See [`GuardConfig::max_stale_doorbells`].
    pub max_stale_doorbells: Option<u32>,
    /// See [`GuardConfig::max_save_wait_permille`].
    pub max_save_wait_permille: Option<u32>,
}

/// An invalid guard field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("guard.{field}: {reason}")]
pub struct GuardConfigError {
    /// Field name (`window_ms`...).
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

impl GuardConfig {
    /// Checks the window and permille ranges.
    pub fn validate(&self) -> Result<(), GuardConfigError> {
        if self.max_save_wait_permille > 1000 {
            return Err(GuardConfigError {
                field: "max_save_wait_permille",
                reason: format!(
                    "{} is out of range 0..=1000 (permille of window_ms)",
                    self.max_save_wait_permille
                ),
            });
        }
        if !(1..=MAX_WINDOW_MS).contains(&self.window_ms) {
            return Err(GuardConfigError {
                field: "window_ms",
                reason: format!(
                    "{} is out of range 1..={MAX_WINDOW_MS} (ms)",
                    self.window_ms
                ),
            });
        }
        Ok(())
    }

    /// These limits with `o`'s fields replacing theirs.
    pub fn with(mut self, o: &GuardOverride) -> Self {
        if let Some(v) = o.window_ms {
            self.window_ms = v;
        }
        if let Some(v) = o.max_resets {
            self.max_resets = v;
        }
        if let Some(v) = o.max_queue_errors {
            self.max_queue_errors = v;
        }
        if let Some(v) = o.max_stale_doorbells {
            self.max_stale_doorbells = v;
        }
        if let Some(v) = o.max_save_wait_permille {
            self.max_save_wait_permille = v;
        }
        self
    }

    fn window_ns(&self) -> Nanos {
        self.window_ms.max(1).saturating_mul(1_000_000)
    }

    /// Save-wait time (ns) tolerated in a window beyond the longest wait.
    pub fn save_wait_allowance_ns(&self) -> Nanos {
        let ns = u128::from(self.window_ns()) * u128::from(self.max_save_wait_permille) / 1000;
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

/// Events counted over a sliding window in [`BUCKETS`] buckets (constant
/// memory whatever the rate).
#[derive(Clone, Debug)]
pub struct RateWindow {
    bucket_ns: Nanos,
    buckets: [u64; BUCKETS],
    /// Largest single `add` in each bucket.
    peaks: [u64; BUCKETS],
    /// Index of the current bucket.
    cur: usize,
    /// Start of the current bucket.
    start: Nanos,
}

impl RateWindow {
    /// A window of `window_ns` (at least `BUCKETS` ns).
    pub fn new(window_ns: Nanos) -> Self {
        RateWindow {
            bucket_ns: (window_ns / BUCKETS as u64).max(1),
            buckets: [0; BUCKETS],
            peaks: [0; BUCKETS],
            cur: 0,
            start: 0,
        }
    }

    fn roll(&mut self, now: Nanos) {
        if now < self.start.saturating_add(self.bucket_ns) {
            return;
        }
        let steps = (now - self.start) / self.bucket_ns;
        if steps >= BUCKETS as u64 {
            self.buckets = [0; BUCKETS];
            self.peaks = [0; BUCKETS];
            self.cur = 0;
        } else {
            for _ in 0..steps {
                self.cur = (self.cur + 1) % BUCKETS;
                self.buckets[self.cur] = 0;
                self.peaks[self.cur] = 0;
            }
        }
        self.start = self
            .start
            .saturating_add(steps.saturating_mul(self.bucket_ns));
    }

    /// Counts `n` events at `now` (monotonic); returns the count in the window.
    pub fn add(&mut self, now: Nanos, n: u64) -> u64 {
        self.roll(now);
        self.buckets[self.cur] = self.buckets[self.cur].saturating_add(n);
        self.peaks[self.cur] = self.peaks[self.cur].max(n);
        self.count(now)
    }

    /// The largest single `add` in the window ending at `now` (bucket
    /// granularity, as [`Self::count`]).
    pub fn peak(&mut self, now: Nanos) -> u64 {
        self.roll(now);
        self.peaks.iter().copied().max().unwrap_or(0)
    }

    /// Events in the window ending at `now` (bucket granularity).
    pub fn count(&mut self, now: Nanos) -> u64 {
        self.roll(now);
        self.buckets.iter().fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// Forgets every event.
    pub fn clear(&mut self) {
        self.buckets = [0; BUCKETS];
        self.peaks = [0; BUCKETS];
    }
}

/// What the guard counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardEvent {
    /// A queue reset after a preemption timeout.
    Reset,
    /// Any other queue error.
    QueueError,
    /// A doorbell that did not move the write index.
    StaleDoorbell,
    /// A save of one of the VM's queues waited for the VM's own waves
    /// without a save point; counted in ns of partition time its waves
    /// held meanwhile (`GpuEvent::Unmapped::wait_held_ns`, what the
    /// scheduler bills it for the wait).
    SaveWait,
}

impl GuardEvent {
    /// Its index in [`GuardTotals`].
    pub fn index(self) -> usize {
        match self {
            GuardEvent::Reset => 0,
            GuardEvent::QueueError => 1,
            GuardEvent::StaleDoorbell => 2,
            GuardEvent::SaveWait => 3,
        }
    }
}

/// Why a VM was quarantined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trip {
    /// The count that went past its limit.
    pub what: GuardEvent,
    /// Events of that kind in the window ([`GuardEvent::SaveWait`]: ns
    /// waited).
    pub count: u64,
    /// The limit ([`GuardEvent::SaveWait`]: permille of the window beyond
    /// the longest single wait).
    pub limit: u32,
    /// The window (ms).
    pub window_ms: u64,
    /// When (the arbiter's clock, ns).
    pub at: Nanos,
}

impl std::fmt::Display for Trip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.what {
            GuardEvent::Reset => "preemption-timeout resets",
            GuardEvent::QueueError => "queue errors",
            GuardEvent::StaleDoorbell => "doorbells that did not move a write index",
            GuardEvent::SaveWait => {
                return write!(
                    f,
                    "saves waited {}.{:03} ms for its own waves without a save point in {} ms \
                     (limit {} permille of the window beyond the longest wait)",
                    self.count / 1_000_000,
                    self.count % 1_000_000 / 1000,
                    self.window_ms,
                    self.limit
                );
            }
        };
        write!(
            f,
            "{} {what} in {} ms (limit {})",
            self.count, self.window_ms, self.limit
        )
    }
}

/// One VM's guard state.
#[derive(Clone, Debug)]
pub struct VmGuard {
    cfg: GuardConfig,
    resets: RateWindow,
    errors: RateWindow,
    stale: RateWindow,
    waits: RateWindow,
    quarantine: Option<Trip>,
    totals: GuardTotals,
}

/// What [`VmGuard::status`] reports (and `GpuArbiter::guard_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardStatus {
    /// The limits in force.
    pub limits: GuardConfig,
    /// Why and when the VM was quarantined; `None` when it is not.
    pub quarantined: Option<Trip>,
    /// Preemption-timeout resets in the window.
    pub resets: u64,
    /// Other queue errors in the window.
    pub queue_errors: u64,
    /// Stale doorbells in the window.
    pub stale_doorbells: u64,
    /// Save waits for its own waves without a save point in the window (ns).
    pub save_wait_ns: u64,
    /// Totals since the VM was added: resets, queue errors, stale
    /// doorbells, save-wait ns ([`GuardEvent::index`]).
    pub totals: GuardTotals,
}

impl VmGuard {
    /// A guard with limits `cfg` (validated by the caller).
    pub fn new(cfg: GuardConfig) -> Self {
        let w = cfg.window_ns();
        VmGuard {
            cfg,
            resets: RateWindow::new(w),
            errors: RateWindow::new(w),
            stale: RateWindow::new(w),
            waits: RateWindow::new(w),
            quarantine: None,
            totals: [0; 4],
        }
    }

    /// Replaces the limits (counts restart: the window may have changed).
    pub fn set_limits(&mut self, cfg: GuardConfig) {
        let q = self.quarantine;
        let totals = self.totals;
        *self = VmGuard::new(cfg);
        self.quarantine = q;
        self.totals = totals;
    }

    /// Takes over what an earlier registration of the same vGPU left
    /// ([`GpuArbiter::remove_vm_keeping`](crate::arbiter::GpuArbiter::remove_vm_keeping)):
    /// its quarantine, and its counts in the window when the limits are the
    /// same (as [`VmGuard::set_limits`], other limits restart the counts).
    /// The totals stay this registration's: telemetry adds the earlier
    /// ones by name.
    pub fn resume(&mut self, earlier: &VmGuard) {
        if earlier.cfg == self.cfg {
            self.resets = earlier.resets.clone();
            self.errors = earlier.errors.clone();
            self.stale = earlier.stale.clone();
            self.waits = earlier.waits.clone();
        }
        if self.quarantine.is_none() {
            self.quarantine = earlier.quarantine;
        }
    }

    /// Counts `n` events of kind `what` at `now` ([`GuardEvent::SaveWait`]:
    /// one wait of `n` ns). Returns the trip when this makes the VM
    /// quarantined (once; `None` while already quarantined).
    pub fn record(&mut self, now: Nanos, what: GuardEvent, n: u64) -> Option<Trip> {
        let i = what.index();
        self.totals[i] = self.totals[i].saturating_add(n);
        let (count, limit, over) = match what {
            GuardEvent::SaveWait => {
                let limit = self.cfg.max_save_wait_permille;
                let count = self.waits.add(now, n);
                // One wait, however long (bounded by the preemption
                // timeout), is a long kernel: only the rest counts.
                let beyond = count.saturating_sub(self.waits.peak(now));
                (count, limit, beyond > self.cfg.save_wait_allowance_ns())
            }
            _ => {
                let (w, limit) = match what {
                    GuardEvent::Reset => (&mut self.resets, self.cfg.max_resets),
                    GuardEvent::QueueError => (&mut self.errors, self.cfg.max_queue_errors),
                    _ => (&mut self.stale, self.cfg.max_stale_doorbells),
                };
                let count = w.add(now, n);
                (count, limit, count > u64::from(limit))
            }
        };
        if limit == 0 || !over || self.quarantine.is_some() {
            return None;
        }
        let t = Trip {
            what,
            count,
            limit,
            window_ms: self.cfg.window_ms,
            at: now,
        };
        self.quarantine = Some(t);
        Some(t)
    }

    /// The limits in force.
    pub fn limits(&self) -> GuardConfig {
        self.cfg
    }

    /// Why the VM is quarantined (`None` when it is not).
    pub fn trip(&self) -> Option<Trip> {
        self.quarantine
    }

    /// Totals since the VM was added: resets, queue errors, stale
    /// doorbells, save-wait ns.
    pub fn totals(&self) -> GuardTotals {
        self.totals
    }

    /// Whether the VM is quarantined.
    pub fn quarantined(&self) -> bool {
        self.quarantine.is_some()
    }

    /// Lifts the quarantine and forgets the counts in the window. Returns
    /// whether the VM was quarantined.
    pub fn clear(&mut self) -> bool {
        self.resets.clear();
        self.errors.clear();
        self.stale.clear();
        self.waits.clear();
        self.quarantine.take().is_some()
    }

    /// Counts and state at `now`.
    pub fn status(&mut self, now: Nanos) -> GuardStatus {
        GuardStatus {
            limits: self.cfg,
            quarantined: self.quarantine,
            resets: self.resets.count(now),
            queue_errors: self.errors.count(now),
            stale_doorbells: self.stale.count(now),
            save_wait_ns: self.waits.count(now),
            totals: self.totals,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Nanos = 1_000_000;

    #[test]
    fn window_counts_recent_events_and_forgets_old_ones() {
        let mut w = RateWindow::new(1600 * MS); // 100 ms buckets
        assert_eq!(w.add(0, 1), 1);
        assert_eq!(w.add(50 * MS, 2), 3);
        assert_eq!(w.add(900 * MS, 1), 4);
        // Still inside the window at 1599 ms.
        assert_eq!(w.count(1599 * MS), 4);
        // The first bucket (0..100 ms) expires at 1600 ms.
        assert_eq!(w.count(1600 * MS), 1);
        // Everything expires after a long gap.
        assert_eq!(w.count(100_000 * MS), 0);
        assert_eq!(w.add(100_000 * MS, 5), 5);
        w.clear();
        assert_eq!(w.count(100_000 * MS), 0);
    }

    #[test]
    fn three_resets_per_minute_are_tolerated_a_fourth_quarantines() {
        let mut g = VmGuard::new(GuardConfig::default());
        let min = 60_000 * MS;
        for i in 0..3 {
            assert_eq!(g.record(i * 10_000 * MS, GuardEvent::Reset, 1), None);
        }
        let t = g.record(30_000 * MS, GuardEvent::Reset, 1).expect("trips");
        assert_eq!((t.what, t.count, t.limit), (GuardEvent::Reset, 4, 3));
        assert!(g.quarantined());
        assert_eq!(
            t.to_string(),
            "4 preemption-timeout resets in 60000 ms (limit 3)"
        );
        // Once only.
        assert_eq!(g.record(31_000 * MS, GuardEvent::Reset, 1), None);
        assert!(g.clear());
        assert!(!g.clear());
        assert_eq!(g.status(31_000 * MS).resets, 0);
        assert_eq!(g.status(31_000 * MS).totals, [5, 0, 0, 0]);
        // Spread out beyond the window: never trips.
        let mut g = VmGuard::new(GuardConfig::default());
        for i in 0..20 {
            assert_eq!(g.record(i * (min / 2), GuardEvent::Reset, 1), None);
        }
    }

    #[test]
    fn a_zero_limit_disables_the_count_and_overrides_apply_per_field() {
        let cfg = GuardConfig::default().with(&GuardOverride {
            max_stale_doorbells: Some(0),
            max_queue_errors: Some(1),
            ..Default::default()
        });
        assert_eq!(cfg.max_resets, 3);
        let mut g = VmGuard::new(cfg);
        assert_eq!(g.record(0, GuardEvent::StaleDoorbell, u64::MAX), None);
        assert_eq!(g.record(0, GuardEvent::QueueError, 1), None);
        assert!(g.record(1, GuardEvent::QueueError, 1).is_some());
        assert_eq!(
            GuardConfig {
                window_ms: 0,
                ..Default::default()
            }
            .validate()
            .unwrap_err()
            .to_string(),
            "guard.window_ms: 0 is out of range 1..=86400000 (ms)"
        );
    }

    #[test]
    fn a_resumed_guard_keeps_the_quarantine_and_the_counts_of_the_same_limits() {
        let mut g = VmGuard::new(GuardConfig::default());
        for i in 0..3 {
            assert_eq!(g.record(i * MS, GuardEvent::Reset, 1), None);
        }
        // Same limits: the fourth reset trips as it would have.
        let mut next = VmGuard::new(GuardConfig::default());
        next.resume(&g);
        assert_eq!(next.totals(), [0; 4], "totals are the registration's");
        assert!(next.record(10 * MS, GuardEvent::Reset, 1).is_some());
        // A quarantine carries whatever the limits.
        let strict = GuardConfig {
            max_resets: 1,
            ..Default::default()
        };
        let mut other = VmGuard::new(strict);
        other.resume(&next);
        assert!(other.quarantined());
        assert_eq!(other.status(10 * MS).resets, 0, "other limits restart");
        // Other limits: the counts restart (the window may differ).
        let mut fresh = VmGuard::new(strict);
        fresh.resume(&g);
        assert!(!fresh.quarantined());
        assert_eq!(fresh.record(11 * MS, GuardEvent::Reset, 1), None);
    }

    #[test]
    fn saves_that_keep_waiting_past_the_allowance_quarantine_within_the_window() {
        // 1 s window, 5%: 50 ms of waits beyond the longest are tolerated.
        let cfg = GuardConfig {
            window_ms: 1000,
            ..Default::default()
        };
        assert_eq!(cfg.save_wait_allowance_ns(), 50 * MS);
        let mut g = VmGuard::new(cfg);
        // Every save waits 20 ms, one every 100 ms (20% of the time).
        let mut trip = None;
        for k in 0..10u64 {
            trip = g.record(k * 100 * MS, GuardEvent::SaveWait, 20 * MS);
            if trip.is_some() {
                // 80 ms waited, 60 ms beyond the longest: past 50 ms.
                assert_eq!(k, 3, "the fourth wait trips");
                break;
            }
        }
        let t = trip.expect("trips within the window");
        assert_eq!(
            (t.what, t.count, t.limit),
            (GuardEvent::SaveWait, 80 * MS, 50)
        );
        assert_eq!(
            t.to_string(),
            "saves waited 80.000 ms for its own waves without a save point in 1000 ms \
             (limit 50 permille of the window beyond the longest wait)"
        );
        assert!(g.quarantined());
        let st = g.status(300 * MS);
        assert_eq!((st.save_wait_ns, st.totals[3]), (80 * MS, 80 * MS));
        // Once only, and a clear forgets the window's waits.
        assert_eq!(g.record(400 * MS, GuardEvent::SaveWait, 20 * MS), None);
        assert!(g.clear());
        assert_eq!(g.status(400 * MS).save_wait_ns, 0);
        assert_eq!(g.totals(), [0, 0, 0, 100 * MS]);
    }

    #[test]
    fn one_long_wait_is_a_long_kernel_not_a_trip() {
        // Default limits: a single 9 s wait (the default preemption
        // timeout, 15% of the minute), then waits that stay within 5%.
        let mut g = VmGuard::new(GuardConfig::default());
        assert_eq!(g.record(0, GuardEvent::SaveWait, 9_000 * MS), None);
        for k in 1..=29u64 {
            assert_eq!(
                g.record(k * 1000 * MS, GuardEvent::SaveWait, 100 * MS),
                None
            );
        }
        // 9 s + 2.9 s: 2.9 s beyond the longest, within 3 s.
        assert_eq!(g.status(29_000 * MS).save_wait_ns, 11_900 * MS);
        // 101 ms more is past 3 s beyond the longest.
        let t = g.record(29_500 * MS, GuardEvent::SaveWait, 101 * MS);
        assert_eq!(t.map(|t| t.what), Some(GuardEvent::SaveWait));
        // Waits of 20% each, spread one per window, never trip.
        let mut g = VmGuard::new(GuardConfig {
            window_ms: 1000,
            ..Default::default()
        });
        for k in 0..100u64 {
            assert_eq!(
                g.record(k * 1100 * MS, GuardEvent::SaveWait, 200 * MS),
                None
            );
        }
    }

    #[test]
    fn the_save_wait_limit_validates_overrides_and_disables_at_zero() {
        let cfg = GuardConfig::default().with(&GuardOverride {
            max_save_wait_permille: Some(0),
            ..Default::default()
        });
        assert_eq!(cfg.max_save_wait_permille, 0);
        let mut g = VmGuard::new(cfg);
        for k in 0..100u64 {
            assert_eq!(g.record(k * MS, GuardEvent::SaveWait, MS), None);
        }
        assert_eq!(
            GuardConfig {
                max_save_wait_permille: 1001,
                ..Default::default()
            }
            .validate()
            .unwrap_err()
            .to_string(),
            "guard.max_save_wait_permille: 1001 is out of range 0..=1000 (permille of window_ms)"
        );
        let all = GuardConfig {
            max_save_wait_permille: 1000,
            window_ms: MAX_WINDOW_MS,
            ..Default::default()
        };
        assert!(all.validate().is_ok());
        assert_eq!(all.save_wait_allowance_ns(), MAX_WINDOW_MS * MS);
    }

    proptest! {
        /// The window count is never below the events of the last
        /// `window - bucket` and never above those of the last
        /// `window + bucket` (bucket = window / BUCKETS).
        #[test]
        fn window_count_is_bounded_by_exact_counts(
            gaps in proptest::collection::vec((0u64..400, 1u64..4), 1..200)
        ) {
            let window = 1600u64;
            let bucket = window / BUCKETS as u64;
            let mut w = RateWindow::new(window);
            let mut t = 0u64;
            let mut evs: Vec<(u64, u64)> = Vec::new();
            for (gap, n) in gaps {
                t += gap;
                let c = w.add(t, n);
                evs.push((t, n));
                let within = |span: u64| evs.iter()
                    .filter(|(at, _)| t - at < span)
                    .map(|(_, n)| n)
                    .sum::<u64>();
                prop_assert!(c >= within(window - bucket), "{c} at {t}");
                prop_assert!(c <= within(window + bucket), "{c} at {t}");
                // The peak: the largest single add of the same spans.
                let p = w.peak(t);
                let peak = |span: u64| evs.iter()
                    .filter(|(at, _)| t - at < span)
                    .map(|(_, n)| *n)
                    .max()
                    .unwrap_or(0);
                prop_assert!(p >= peak(window - bucket) && p <= peak(window + bucket));
                prop_assert!(p <= c);
            }
        }
    }
}
