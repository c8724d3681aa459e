//! A lower RT's reservation budgets the jobs of the RTs above it (issue
//! 18, fuzz seed 300152; docs/scheduling.md, "A lower RT's budget less
//! the higher RTs' jobs").
//!
//! A reservation sized by latency (`Spatial::size_for_latency`) gets the
//! promise's allowance (one save and restore, `spatial_wait_allowance`)
//! less the save the RT waits for before it runs (`rt_switch_budget`),
//! and its job fills the rest: fuzz seed 300152's rt1 (218 us alone, every
//! 4.5 ms) took 470.7 us against its bound of 482. A higher RT whose job
//! comes during it takes the reservation over (`res_pass.rs`): the lower
//! RT's queue is saved, waits for the higher job and is restored, 43 us
//! more (7 + 29 + 7), and 11 of its 100 jobs took 511-525 us.
//!
//! Here the switch budget of an owner with periodic VMs above it in its
//! partition is also less what those can take from one of its jobs: for
//! each higher VM `h` of measured period `P_h` and job time `t_h`
//! (`WakePeriods`, its cycle less its gap), `floor(W / P_h) + 1` jobs in
//! the owner's window `W = 1.1 x alone + A` (its job alone on the whole
//! partition, `A` the allowance), each a save and restore of the owner's
//! queue (`2 x` the partition's clean save) and the wait for `t_h`:
//! `I = sum_h (floor(W / P_h) + 1) x (t_h + 2 x save)`. When the budget
//! `B` leaves room for it (`I < B`), the budget is `B - I`, and a job
//! interrupted by them ends within `S + I + t_k <= S + I + 1.1 x alone +
//! (A - S - I) = 1.1 x alone + A`. Otherwise (a higher RT that comes many
//! times per job: fuzz seeds 97095, a 7.6 kHz RT above a 1.4 ms job, and
//! 50157) no size meets the bound behind it, and the budget is `B` as
//! before.
//!
//! A guest cannot widen a reservation this way beyond its size without
//! latency sizing: the latency size only ever lowers the size the RT's
//! width asks for (`Scheduler::spatial_plan`).

use super::*;

impl Scheduler {
    /// What the periodic VMs above `owner` in partition `p` may take from
    /// one job of the owner (with `queues` busy queues at its level) in
    /// its window `1.1 x alone + allowance`: for each, its jobs in the
    /// window (`floor(W / P_h) + 1`) times its job time and a save and
    /// restore of the owner's queue (see the module doc). 0 when nothing
    /// above is periodic or the owner's time alone is not measured.
    pub(super) fn rt_above_interference(&self, p: usize, owner: SliceOwner, queues: u32) -> Nanos {
        let Some(alone) = self
            .spatial
            .time_on(owner.vm, queues, self.spatial.cus_per_xcc)
        else {
            return 0;
        };
        let window = (alone / 10)
            .saturating_mul(11)
            .saturating_add(self.spatial_wait_allowance(p));
        let switch = self.clean_save(p).saturating_mul(2);
        self.vms
            .iter()
            .filter(|(id, v)| {
                **id != owner.vm
                    && v.partition as usize == p
                    && v.params.priority as u16 > owner.level
            })
            .filter_map(|(_, v)| {
                let period = v.wake.period();
                let job = v.wake.job();
                (period > 0 && job > 0).then(|| {
                    (window / period)
                        .saturating_add(1)
                        .saturating_mul(job.saturating_add(switch))
                })
            })
            .fold(0, Nanos::saturating_add)
    }

    /// The switch budget `budget` of `owner` (with `queues` busy queues at
    /// its level) in `p` less [`Self::rt_above_interference`], when that
    /// leaves a budget; else `budget` (no size meets the bound behind
    /// the higher VMs' jobs).
    pub(super) fn rt_budget_below_higher(
        &self,
        p: usize,
        owner: SliceOwner,
        queues: u32,
        budget: Nanos,
    ) -> Nanos {
        let i = self.rt_above_interference(p, owner, queues);
        match budget.checked_sub(i) {
            Some(b) if b > 0 => b,
            _ => budget,
        }
    }
}
