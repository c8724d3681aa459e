//! A wide reservation drained where the owner's gaps are long (issue 18,
//! best effort beside wide RT tenants; docs/scheduling.md, "A wide
//! reservation drained in long gaps"). A wide reservation (an owner wider
//! than the width cap, `engine/wide.rs`) is set up with a save and kept
//! across the owner's gaps: the lower lock-step work then runs on the
//! other CUs for the whole run, and loses a round of each kernel that
//! needs one more on them (fuzz seed 97101: a 964 us RT of one 6.7 us
//! round, 2 CUs per XCC kept, best effort 0.706 of alone). Where the lower
//! workgroups drain within the allowance, the owner's job on the
//! reservation takes at most half its wake period, and that job plus the
//! drain leave a gap that is a break (twice it beyond the anticipation
//! grace) and meet its RT bound, the reservation is drained instead: the
//! lower work loses the CUs only while the owner waits for the drain and
//! runs, and gets them back in every gap. (The drain was asked to fit the
//! half period with the job: fuzz seed 900112's RT, 71 us on 19 CUs per
//! XCC after a 15 us drain every 145 us, then kept its reservation
//! through 59 us gaps, best effort 0.489 of alone; drained, 0.736.
//! docs/scheduling.md, "A wide reservation drained beyond half its
//! period".) A short period keeps the reservation as before: a drain per
//! period that fills most of it would leave no break, give little back
//! and make every job wait for it (fuzz seed 50257's 7 kHz RT, 95 us
//! lower workgroups in a 142 us period).

use super::*;

impl Scheduler {
    /// Is owner `vm`'s wide reservation of `k` CUs per XCC on `queues`
    /// busy queues drained rather than kept, the lower work's drain
    /// taking `wait`: its job there `t(k)` within half its wake period
    /// `P`, and the job after the wait, `t(k) + wait`, within its RT bound
    /// `1.1 x t(N) + allowance` (`spatial_wait_allowance`) and leaving a
    /// gap that is a break ([`drained_gap_breaks`])? `false` when its
    /// period or its job's time is not measured.
    pub(super) fn wide_drains(&self, p: usize, vm: VmId, queues: u32, k: u32, wait: Nanos) -> bool {
        let Some(v) = self.vms.get(&vm) else {
            return false;
        };
        let period = v.wake.period();
        if period == 0 {
            return false;
        }
        let (Some(t), Some(alone)) = (
            self.spatial.time_on(vm, queues, k),
            self.spatial.time_on(vm, queues, self.spatial.cus_per_xcc),
        ) else {
            return false;
        };
        let job = t.saturating_add(wait);
        let bound = alone
            .saturating_mul(11)
            .div_ceil(10)
            .saturating_add(self.spatial_wait_allowance(p));
        job <= bound && t <= period / 2 && drained_gap_breaks(period, job, self.cfg.anticipation_ns)
    }
}

/// Does a drained wide reservation's period `period`, of which the owner's
/// job and the drain it waits for take `job`, leave a gap that is a break
/// (`2 x (P - job) > anticipation_ns`: a gap inside the anticipation grace,
/// twice the gap when that fits `anticipation_ns`, never starts a new busy
/// period, and the owner would look backlogged)? The job itself is held to
/// half the period by the caller (as a kept one's, `size_wide`); the drain
/// is paid by each job only because the reservation is drained, so it is
/// not asked to fit that half as well (fuzz seed 900112: a 71 us job on 19
/// CUs per XCC after a 15 us drain, every 145 us, kept its reservation
/// through 59 us gaps: best effort 0.489 of alone).
pub(crate) fn drained_gap_breaks(period: Nanos, job: Nanos, anticipation: Nanos) -> bool {
    period.saturating_sub(job).saturating_mul(2) > anticipation
}
