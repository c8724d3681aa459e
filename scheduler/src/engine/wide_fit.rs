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
//! which ends the reservation and sets it up again with a save). Its job
//! is modelled by its kernels' own lock-step rounds where its doorbell was
//! read whole (`job_kernels.rs`, reported by the front end through
//! [`Scheduler::note_dispatch_kernels`]): the widest-dispatch model counts
//! every kernel as the widest (fuzz seed 97028: 248 us on half the
//! partition against 165).

use super::*;
use crate::job_kernels::JobKernels;

impl Scheduler {
    /// The caller read every dispatch newly written to `queue`'s ring (a
    /// complete scan, as for [`Scheduler::note_dispatch_occupancy`]):
    /// `kernels`, per dispatch in order, its workgroup count and one
    /// workgroup's cost alone (ns). It models the VM's job in lock-step
    /// rounds for a wide RT's reservation (`job_kernels.rs`). A doorbell of
    /// more than [`crate::JOB_KERNELS`] dispatches, or one
    /// with a dispatch of no workgroups or no estimate, forgets the model
    /// (the widest-dispatch model decides). Unknown queues are ignored.
    pub fn note_dispatch_kernels(&mut self, queue: QueueId, kernels: &[(u64, u64)]) {
        let Some(vm) = self.queues.get(&queue).map(|q| q.vm) else {
            return;
        };
        match JobKernels::of(kernels) {
            Some(j) => {
                self.spatial.kernels.insert(vm, j);
            }
            None => {
                self.spatial.kernels.remove(&vm);
            }
        }
    }

    /// CUs per XCC of a kept wide reservation for owner `vm` of partition
    /// `p` on `queues` busy queues whose wake period is `period`: the fewest
    /// with which its job meets the RT bound with the promise's switch
    /// allowance less the setup save (`spatial_wait_allowance` less
    /// `clean_save`) and ends within `period` after that save, within the
    /// width cap and a CU per XCC left; `None` otherwise (or nothing
    /// measured). Its job's time is its kernels' own rounds where its last
    /// doorbell was modelled (`job_kernels.rs`), else the widest
    /// dispatch's rounds of the summed solo time (`Spatial::size_wide`).
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
        let within = period.saturating_sub(save);
        let Some(j) = self.spatial.kernels.get(&vm) else {
            return self.spatial.size_wide(
                vm,
                queues,
                slack,
                within,
                self.cfg.spatial_max_permille,
            );
        };
        let (per_xcc, xccs) = (
            u64::from(self.spatial.cus_per_xcc),
            u64::from(self.spatial.xccs.max(1)),
        );
        let q = u64::from(queues.max(1));
        let alone = j.time_on(q, per_xcc.saturating_mul(xccs))?;
        let bound = alone.saturating_mul(11) / 10 + slack;
        let cap = (per_xcc * u64::from(self.cfg.spatial_max_permille.min(1000)) / 1000)
            .min(per_xcc.saturating_sub(1));
        (1..=cap)
            .find(|&k| {
                j.time_on(q, k.saturating_mul(xccs))
                    .is_some_and(|t| t <= bound && t <= within)
            })
            .and_then(|k| u32::try_from(k).ok())
    }
}
