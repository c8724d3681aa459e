//! A wide reservation sized by the promise's own RT allowance (issue 18,
//! best effort beside wide RT tenants; docs/scheduling.md, "A wide RT's
//! reservation carries its whole period"): where the latency-and-load
//! sizing of `engine/wide.rs` finds no reservation within the width cap
//! (its job would need more than half its period, or the measured switch
//! is too short a slack for one more round), the owner's reservation is
//! sized instead by what the promise allows it. A wide reservation is kept
//! across the owner's gaps: its jobs wait for no save or drain, only the
//! first after the setup waits for one save of the lower work, so the
//! job may spend the rest of the promise's switch allowance (`1.1 x
//! alone + t_save + t_restore`, `spatial_coreside_ns`) on fewer CUs; and
//! it need only end before the owner's next job arrives (its whole wake
//! period), not within half of it, even the job that waited for the setup save
//! (`t + t_save <= P`: a job that ends later queues the next one, and a
//! backlog that a period only just longer than the job drains slowly
//! keeps the owner demanding past the backlog guard, `wide_deadline`,
//! which ends the reservation and sets it up again with a save).

use super::*;

impl Scheduler {
    /// CUs per XCC of a kept wide reservation for owner `vm` of partition
    /// `p` on `queues` busy queues whose wake period is `period`: the fewest
    /// with which its job meets the RT bound with the promise's switch
    /// allowance less the setup save (`spatial_wait_allowance` less
    /// `clean_save`) and ends within `period` after that save, within the
    /// width cap and a CU per XCC left; `None` otherwise (or nothing
    /// measured).
    pub(super) fn wide_kept_k(
        &self,
        p: usize,
        vm: VmId,
        queues: u32,
        period: Nanos,
    ) -> Option<u32> {
        if period == 0 {
            return None;
        }
        let save = self.clean_save(p);
        let slack = self.spatial_wait_allowance(p).saturating_sub(save);
        self.spatial.size_wide(
            vm,
            queues,
            slack,
            period.saturating_sub(save),
            self.cfg.spatial_max_permille,
        )
    }
}
