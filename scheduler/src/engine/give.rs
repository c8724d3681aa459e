//! Giving a periodic owner's gaps to the lower work (issue 18,
//! docs/scheduling.md, "A held gap weighed against the lower work's
//! loss"): the cost-aware hold (`hold.rs`) keeps the whole partition
//! through gaps shorter than a switch worth `HOLD_SWITCH_FACTOR` x (save +
//! restore) of idle time, a price set for a closed loop at the top level,
//! whose next job waits for the save (item 1's 5%). An owner whose
//! period does not stretch when its next job waits for a save (a
//! periodic tenant: the wait is latency within its RT bound, not
//! throughput) pays nothing of it, and what the choice costs is the lower
//! work's:
//!
//! * **hold** a gap `g`: the lower work loses the whole partition for
//!   `g` (an RT too wide for a reservation holds it in every period and
//!   the lower work gets aging turns only: fuzz seed 96013, best effort
//!   0.013 of alone);
//! * **give** it: the owner's next job saves the `n` lower queues that ran
//!   in the gap (the busy queues of one VM of the highest busy lower level:
//!   its equals take turns by slices), `n x t_sw` of CWSR time (`t_sw` the
//!   partition's typical save and restore without waits for waves that
//!   have no save point), and the lower work computes in the gap less its
//!   own restore and save, `g - t_sw`.
//!
//! Giving is worth it when the lower work's gain exceeds the CWSR it costs,
//! `g - t_sw > n x t_sw`: the gap hold (`GapHist::hold_ns`, the release
//! point minimising `E[min(G, e)] + P(G > e) x c`) with a switch worth `c =
//! (n + 1) x t_sw` of gap time. Where `n x t_sw` is more than 10% of the
//! period, giving breaks the CWSR bound while holding breaks best effort:
//! no choice meets both (docs/scheduling.md gives the figures), and this
//! one keeps the more GPU time computing. It only shortens the cost-aware
//! hold, and is tried like a wide reservation (`wide.rs`): a closed loop
//! whose cycle grows by the save wait (more than 5% of it) goes back to
//! held gaps and tries again after `RETRY_CYCLES` held ones.
//!
//! **Within the CWSR bound.** Where giving every gap would cost more than
//! the promise's CWSR bound (10% of the run; item 3), the partition gives
//! gaps only from a budget ([`GiveBudget`]): it earns
//! [`GIVE_CWSR_PERMILLE`] of the time that passes and each give spends its
//! `n x t_sw`; a gap the budget cannot pay for is held. So the saves that
//! giving brings stay within the bound over any stretch of the run, and
//! the lower work gets the gaps the bound allows (all of them where they
//! are long enough).

use super::*;

/// Share of the run (per mille) the saves of given gaps may cost: 80 of
/// the promise's 100 (CWSR at most 10% of the run), the rest left to the
/// partition's other saves (slices among lower equals, aging batches,
/// the owner's own setup).
pub(super) const GIVE_CWSR_PERMILLE: u64 = 80;

/// The CWSR budget of a partition's given gaps (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct GiveBudget {
    /// CWSR time still to spend (ns).
    left: Nanos,
    /// When it was last brought up to date (`None`: never).
    at: Option<Nanos>,
}

impl GiveBudget {
    /// Earns up to `now`, then spends `cost` if it has it: `true` when a
    /// give of `cost` ns of CWSR is within the budget. It starts with one
    /// give and holds at most two, so a long quiet stretch buys no burst.
    pub(super) fn spend(&mut self, now: Nanos, cost: Nanos) -> bool {
        let earned = match self.at {
            Some(t) => now.saturating_sub(t).saturating_mul(GIVE_CWSR_PERMILLE) / 1000,
            None => cost,
        };
        self.at = Some(now);
        self.left = self.left.saturating_add(earned).min(cost.saturating_mul(2));
        if self.left >= cost {
            self.left -= cost;
            true
        } else {
            false
        }
    }
}

impl Scheduler {
    /// The idle time of owner `vm`'s gaps (at `level` of partition `p`)
    /// that giving one away is worth, `(n + 1) x t_sw`, and the CWSR a give
    /// costs, `n x t_sw` (see the module doc);
    /// `None` when there is nothing to weigh (no lower queue busy, no save
    /// measured), when the saves it would wait for are longer than the
    /// wait its RT bound allows (waits for waves without a save point),
    /// or when giving stretches its cycle.
    pub(super) fn give_worth(&self, p: usize, vm: VmId, level: u16) -> Option<(Nanos, Nanos)> {
        let part = self.parts.get(p)?;
        let v = self.vms.get(&vm)?;
        let t_sw = part.aging.save_typ.saturating_mul(2);
        if t_sw == 0 || v.wake.giving_stretches(part.aging.save_typ) {
            return None;
        }
        if part.aging.save_ewma.saturating_mul(2) > self.spatial_wait_allowance(p) {
            return None;
        }
        // Lower queues that run in a given gap: those of the highest busy
        // lower level, of one VM of it under exclusive slices (its equals
        // take turns by slices), at most one per slot.
        let (_, m) = part.busy.range(..level).next_back()?;
        let per_vm = m
            .iter()
            .filter(|(w, _)| **w != vm)
            .map(|(_, &q)| u64::from(q));
        let n = if self.slices() {
            per_vm.max().unwrap_or(0)
        } else {
            per_vm.sum()
        }
        .min(part.nslots as u64);
        if n == 0 {
            return None;
        }
        Some((
            n.saturating_add(1).saturating_mul(t_sw),
            n.saturating_mul(t_sw),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_pays_for_8_percent_of_the_time_and_buys_no_burst() {
        let mut b = GiveBudget::default();
        // One give at the start, then 100 us of CWSR per 1.25 ms.
        assert!(b.spend(0, 100_000));
        assert!(!b.spend(1_000_000, 100_000), "80 us earned of 100");
        assert!(b.spend(1_250_000, 100_000));
        // A second of quiet earns at most two gives.
        let t = 1_000_000_000;
        assert!(b.spend(t, 100_000));
        assert!(b.spend(t, 100_000));
        assert!(!b.spend(t, 100_000));
        // Over a long run the gives cost at most 8% of it plus the cap.
        let (mut gives, mut now) = (0u64, t);
        for _ in 0..1000 {
            now += 500_000;
            gives += u64::from(b.spend(now, 100_000));
        }
        assert!(gives * 100_000 <= 1000 * 500_000 * 80 / 1000 + 200_000);
        assert!(gives * 100_000 + 200_000 >= 1000 * 500_000 * 80 / 1000);
    }
}
