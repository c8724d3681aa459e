//! An RT's job held to half its interval only where a stall can come
//! (issue 18, best effort beside a narrow RT's reservation;
//! docs/scheduling.md, "An RT's job held to half its interval where a
//! stall can come").
//!
//! `Spatial::size_for_latency` holds an RT's latency-sized job to half the
//! measured interval between its jobs less its wait (branch `rtsmall`,
//! fuzz seed 97138): an aging batch of a starved lower VM yields to a
//! demand-limited RT for at most half its length (`AGING_YIELD_NS`), and a
//! job that fills its interval spends that yield within a few jobs and
//! then waits for the rest of the batch; after such a stall, a job near
//! its interval clears the backlog by only `P - t` per period. The
//! promise's best-effort bound asks only that the job end before the next
//! arrives, and where neither stall can come the half-interval rule costs
//! the lower work CUs for nothing (fuzz seed 700147: 9 CUs per XCC where 5
//! carry the job within its period, best effort 0.621 of alone against
//! 0.627).
//!
//! The half interval is kept while a stall can come:
//!
//! * an aging batch of the partition is running or being chosen, or one
//!   is due (the earliest boost deadline of a waiting queue below the
//!   owner, not before the next batch may start) within two intervals of
//!   now: a job sized now may run into it, and the job before the batch
//!   is sized for it, so the batch finds the reservation at its
//!   half-interval size and keeps it (`batch_res.rs`). Within one interval
//!   only, fuzz seed 97138's RT (199 us alone every 432 us; 3 CUs per XCC
//!   relaxed, 5 halved) grew its reservation at the job the batch began
//!   with and waited the batch out: 2.37 ms, p99 740 us against 460;
//! * the owner is backlogged: busy without going idle for at least an
//!   interval (its last job did not end before this one came);
//! * a VM above it on the partition has rung: its jobs take the CUs or
//!   the reservation over (`res_pass.rs`). Without this, fuzz seed
//!   97077's 6.7 kHz RT below a 590 Hz one, relaxed from 2 CUs per XCC to
//!   1, took the RTs' p99 to 914 us against 796 (668 before).
//!
//! Elsewhere the job may fill its interval less its wait and a gap that
//! is a break of its demand (`rt_room_gap`): a job that ends within half
//! the anticipation cap of the next arrival never breaks its VM's demand,
//! which then looks backlogged to aging (`yield_backlogged`: a batch
//! neither yields to it nor keeps its reservation, `batch_res.rs`).
//! Without the gap fuzz seed 97161's RT (85 workgroups of 8.6 us every
//! 103 us; 2 CUs per XCC relaxed, 3 halved) left 18 us gaps and waited out
//! a 2 ms batch (RT p99 1537 us against 261), although its reservation had
//! grown back two jobs before the batch.

use super::*;

impl Scheduler {
    /// The gap a relaxed RT job leaves before its next arrival: the
    /// shortest that is a break of its demand, `2g > anticipation_ns`
    /// (the grace is twice the re-ring gap when that fits
    /// `anticipation_ns`, `hold.rs`; `wide_least.rs` asks the same of a
    /// kept wide reservation's job).
    pub(super) fn rt_room_gap(&self) -> Nanos {
        self.cfg.anticipation_ns / 2 + 1
    }

    /// Is the job of `vm` (at `level` of partition `p`) held to half its
    /// measured interval (see the module doc)? `true` when the interval is
    /// not measured (nothing to relax).
    pub(super) fn rt_room_halved(&self, p: usize, vm: VmId, level: u16) -> bool {
        let Some(interval) = self.spatial.interval_ns(vm).filter(|&i| i > 0) else {
            return true;
        };
        let part = &self.parts[p];
        let now = self.now;
        let a = &part.aging;
        if a.batch_since.is_some() || a.scan.is_some() || !a.to_boost.is_empty() {
            return true;
        }
        let below = (level as usize).min(part.waiting.len());
        let due = part.waiting[..below]
            .iter()
            .filter_map(|w| w.first().map(|e| e.0))
            .min();
        let horizon = now.saturating_add(interval.saturating_mul(2));
        if due.is_some_and(|d| d.max(a.next_batch) <= horizon) {
            return true;
        }
        if self
            .vms
            .get(&vm)
            .is_some_and(|v| v.demand > 0 && now.saturating_sub(v.entered) >= interval)
        {
            return true;
        }
        // A VM above the owner on the partition that has rung: its jobs
        // take the CUs over (or the owner's reservation: `res_pass.rs`).
        self.vms.values().any(|v| {
            v.partition as usize == p
                && v.params.priority as u16 > level
                && (v.demand > 0 || v.wake.period() > 0)
        })
    }
}
