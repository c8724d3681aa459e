//! The partition's running CWSR share, and reservations kept through the
//! gaps a lapse can no longer pay for (issue 18, docs/scheduling.md, "A
//! reservation kept where the saves spend the CWSR budget").
//!
//! `res_hold.rs` weighs one lapse of a reservation against keeping it
//! through one gap: a lapse costs `n x t_sw` of CWSR per period (the
//! owner's next job saves the `n` lower queues running beside it), keeping
//! costs the lower work `lambda x g`. Each is priced per period, so where a
//! save per period is the cheaper of the two but still more than 10% of
//! the period (a 1.5 kHz RT above a lone lock-step lower kernel that would
//! lose a round beside any reservation: fuzz seed 50205, 10.3% of the run;
//! two RTs each saving the lone best effort per period: 97230, 15.7%), the
//! saves add up past the promise's CWSR bound (at most 10% of the run,
//! item 3) while the lower work keeps far more than its bound.
//!
//! So the partition counts what its saves cost, all of them ([`CwsrBudget`]:
//! it earns [`CWSR_BUDGET_PERMILLE`] of the time that passes, at most
//! [`CWSR_WINDOW_NS`]'s worth, and every save spends its dequeue time and,
//! when the queue had work, as much again for its restore). A lapse the
//! budget cannot pay for (`n x t_sw` more than it holds) is not made: the
//! reservation is kept through the owner's gaps
//! (`Scheduler::reservation_switch_worth` prices the lapse as unbounded),
//! and lapses again once the budget has earned it back. Over any stretch
//! the saves stay within the budget's share plus one window's worth, and
//! the gaps that are kept are the fewest that do it: a mix of lapses and
//! kept gaps where neither alone meets both items (a lapse per period
//! breaks the CWSR bound, keeping every gap costs the lower work a round
//! per kernel).

use crate::Nanos;

/// Share of the run (per mille) the partition's saves may cost before a
/// reservation's lapse is refused: the promise's 100 less a margin for the
/// restore, which the scheduler does not measure and counts as long as the
/// save (the simulator's restores run up to a few percent longer).
pub(super) const CWSR_BUDGET_PERMILLE: u64 = 90;

/// The window the budget remembers: it holds at most this much time's
/// share (a quiet stretch buys no longer burst of saves), and a save longer
/// than that share (a wait for waves without a save point) leaves it at
/// most that much in debt.
pub(super) const CWSR_WINDOW_NS: Nanos = 32_000_000;

/// The CWSR budget of a partition (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct CwsrBudget {
    /// CWSR time still to spend at `at` (ns; negative: in debt).
    left: i64,
    /// A lapse ran it short: lapses wait until it holds half a window's
    /// share again (kept and lapsed gaps come in stretches, not one by
    /// one).
    refusing: bool,
    /// When it was last brought up to date (`None`: never; the budget
    /// holds half a window's share, [`FRESH`], and earns from the
    /// partition's first save on).
    at: Option<Nanos>,
}

/// What a partition's budget holds before its first save: half a
/// window's share, as if the partition had been quiet that long. Empty, a
/// partition's first save ran it short and refused every lapse until half
/// a window's share was earned (16 ms of saves kept through the gaps at
/// the start of every run: fuzz-50113's 40 ms cut lost its best effort,
/// 0.818 of alone against 0.861). The saves of any stretch from the start
/// stay within `0.09 x T` plus 1.5 windows' share (this and the most the
/// budget owes).
const FRESH: i64 = (CWSR_WINDOW_NS * CWSR_BUDGET_PERMILLE / 1000 / 2) as i64;

/// The most the budget holds, and the most it owes.
fn cap() -> i64 {
    i64::try_from(CWSR_WINDOW_NS.saturating_mul(CWSR_BUDGET_PERMILLE) / 1000).unwrap_or(i64::MAX)
}

impl CwsrBudget {
    /// What the budget holds at `now` (earned since it was last spent).
    pub(super) fn left_at(&self, now: Nanos) -> i64 {
        match self.at {
            None => FRESH,
            Some(t) => {
                let earned = now.saturating_sub(t).saturating_mul(CWSR_BUDGET_PERMILLE) / 1000;
                let earned = i64::try_from(earned).unwrap_or(i64::MAX);
                self.left.saturating_add(earned).min(cap())
            }
        }
    }

    /// Spends `cost` ns of CWSR time at `now` (never more than one window's
    /// worth of debt).
    pub(super) fn spend(&mut self, now: Nanos, cost: Nanos) {
        let cost = i64::try_from(cost).unwrap_or(i64::MAX);
        let left = self.left_at(now);
        let refusing = self.refusing && left < cap() / 2;
        self.left = left.saturating_sub(cost).max(-cap());
        self.refusing = refusing || (cost > 0 && self.left < cost);
        self.at = Some(now);
    }

    /// May a lapse that will cost `cost` ns of CWSR be made at `now`?
    pub(super) fn affords(&self, now: Nanos, cost: Nanos) -> bool {
        let left = self.left_at(now);
        let floor = if self.refusing { cap() / 2 } else { 0 };
        i64::try_from(cost).is_ok_and(|c| left >= c.max(floor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh budget holds half a window's share, whenever it is asked;
    /// it earns its share of the time from the first save on, at most one
    /// window's share, and a spend leaves it short until the time passes
    /// that earns it back.
    #[test]
    fn earns_its_share_of_the_time() {
        let mut b = CwsrBudget::default();
        let half = (cap() / 2) as Nanos;
        for t in [0, 5 * CWSR_WINDOW_NS] {
            assert!(b.affords(t, half), "{t}");
            assert!(!b.affords(t, half + 1), "{t}");
        }
        b.spend(0, half);
        let full = cap() as Nanos;
        assert!(b.affords(CWSR_WINDOW_NS, full));
        assert!(!b.affords(2 * CWSR_WINDOW_NS, full + 1));
        b.spend(CWSR_WINDOW_NS, full);
        assert!(!b.affords(CWSR_WINDOW_NS, 1));
        // Run short, it refuses lapses until it holds half a window's
        // share again, then affords what it holds.
        let t = CWSR_WINDOW_NS + half * 1000 / CWSR_BUDGET_PERMILLE;
        assert!(!b.affords(t - 1_000, 100_000));
        assert!(b.affords(t, 100_000));
        assert!(b.affords(t, half));
        assert!(!b.affords(t, half + 1_000));
        b.spend(t, 100_000);
        assert!(b.affords(t, half - 100_000));
        // Never more than a window's share.
        assert_eq!(b.left_at(10 * CWSR_WINDOW_NS), cap());
    }

    /// A save far longer than the window's share leaves the budget one
    /// window's share in debt, no more; hostile lengths do not overflow.
    #[test]
    fn debt_is_bounded() {
        let mut b = CwsrBudget::default();
        b.spend(0, Nanos::MAX);
        assert_eq!(b.left_at(0), -cap());
        assert!(!b.affords(0, Nanos::MAX));
        b.spend(Nanos::MAX, 1);
        assert_eq!(b.left_at(Nanos::MAX), cap() - 1);
    }
}
