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
//! gaps only from its CWSR budget (`engine/cwsr_budget.rs`): every save of
//! the partition spends it as it is made (a give's among them), and a gap
//! is given only while the budget holds the give's `n x t_sw`; a gap it
//! cannot pay for is held. So the saves of given gaps and the partition's
//! other saves (slices among lower equals, aging batches, reservations'
//! lapses) stay within the bound together, and the lower work gets every
//! gap the other saves leave room for: a fixed share of the run for gives
//! alone (8% before) held gaps that the bound allowed wherever the other
//! saves cost less than the rest (fuzz seed 300111: 8.1% CWSR in all,
//! best effort 0.559 of alone against 0.579).

use super::*;

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
        let t_sw = self.measured_switch(p);
        if t_sw == 0 || v.wake.giving_stretches(part.aging.save_typ) {
            return None;
        }
        // The save it waits for is that of the VMs that run in the gap
        // (`engine/gap_price.rs`), not a flagged lower VM's long one.
        if self.gap_save(p, vm, level).saturating_mul(2) > self.spatial_wait_allowance(p) {
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
