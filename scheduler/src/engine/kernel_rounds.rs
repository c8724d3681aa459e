//! An RT's job timed kernel by kernel in its latency sizing (issue 18,
//! best effort beside a narrow RT's reservation; docs/scheduling.md, "An
//! RT's job timed kernel by kernel in its latency sizing").
//!
//! `Spatial::size_for_latency` bounds the job's time on `c` CUs with two
//! upper bounds from the VM's aggregates: every kernel at the widest one's
//! rounds (`ceil(need / c) x solo`) and `work / c + solo`. Neither is
//! exact for a job whose kernels differ in width: fuzz seed 800037's RT
//! (kernels of 44 and 76 workgroups of 51 us every 221 us) runs in 153 us
//! on 6 CUs per XCC (one round of the first kernel, two of the second:
//! the simulator runs a queue's kernel in lock-step rounds, one workgroup
//! per CU), but the rounds model gives 204 us there (and `work / c +
//! solo` 229 us), which the interval less the gap (171 us) refuses, so
//! the RT kept 10 CUs per XCC and the best effort beside it fell to 0.729
//! of alone against 0.764.
//!
//! With each kernel's workgroups and one workgroup's cost recorded for
//! the VM's latest complete doorbell (`Scheduler::note_dispatch_kernel_costs`),
//! the job's time on `c` CUs is `sum ceil(q x W_i / c) x cost_i` on `q`
//! busy queues. It is used only while those kernels are the ones the
//! decaying aggregates hold (their solo time, CU time and widest kernel
//! equal to the VM's `solo_ns`, `work_ns` and width): a VM whose jobs
//! change shape keeps the aggregates' bounds.
//!
//! It sizes only the job's room, in the whole-interval sizing of a narrow
//! owner no stall can reach (`rt_room.rs`): the RT bound keeps the
//! aggregates' sizes, whose margin covers waits its switch budget misses.
//! Held to the bound kernel by kernel, fuzz seed 50281's RT (26 and 33
//! workgroups of 197 us every 1482 us) got 4 CUs per XCC (592 us of the
//! bound's 640) instead of 5 and its p99 rose from 417 us to 790 against
//! 676. Applied to a wide owner's sizing, fuzz seed 400058's wide RT was
//! sized 19 CUs per XCC instead of 21 (RT p99 1337 us against 452).

use super::*;
use crate::spatial::Spatial;

/// At most this many kernels of a doorbell are recorded (a ring scan reads
/// at most 16 packets).
pub(crate) const MAX_KERNELS: usize = 16;

impl Scheduler {
    /// The caller read every dispatch newly written to `queue`'s ring
    /// (a complete scan, with [`Scheduler::note_dispatch_work`]): each
    /// kernel's workgroups and one workgroup's cost alone, in ring order.
    /// It times the VM's job kernel by kernel in its latency sizing
    /// (`Spatial::size_for_latency`). Unknown queues are ignored.
    pub fn note_dispatch_kernel_costs(&mut self, queue: QueueId, kernels: &[(u64, u64)]) {
        if let Some(q) = self.queues.get(&queue) {
            let vm = q.vm;
            self.spatial.note_kernel_costs(vm, kernels);
        }
    }
}

impl Spatial {
    /// Records the kernels (workgroups, one workgroup's cost) of `vm`'s
    /// latest complete doorbell (at most [`MAX_KERNELS`]; none: forgotten).
    pub fn note_kernel_costs(&mut self, vm: VmId, kernels: &[(u64, u64)]) {
        if kernels.is_empty() || kernels.len() > MAX_KERNELS {
            self.kernel_costs.remove(&vm);
        } else {
            // The VM's vector reused: no allocation per doorbell.
            let v = self.kernel_costs.entry(vm).or_default();
            v.clear();
            v.extend_from_slice(kernels);
        }
    }

    /// `vm`'s recorded kernels when they are those its aggregates hold:
    /// their solo time, CU time and widest kernel equal its `solo_ns`,
    /// `work_ns` and width (`None` otherwise).
    fn steady_kernels(&self, vm: VmId) -> Option<&[(u64, u64)]> {
        let ks = self.kernel_costs.get(&vm)?;
        let o = self.occ.get(&vm)?;
        let width = *self.width.get(&vm)?;
        let solo: u64 = ks.iter().map(|&(_, c)| c).sum();
        let work: u64 = ks.iter().map(|&(w, c)| w.saturating_mul(c)).sum();
        let widest = ks.iter().map(|&(w, _)| w).max()?;
        (solo == o.solo_ns && work == o.work_ns && widest == width && solo > 0)
            .then_some(ks.as_slice())
    }

    /// The job's time on `c` CUs in all on `queues` busy queues, kernel by
    /// kernel: `sum ceil(queues x W_i / c) x cost_i` (`None`: no steady
    /// kernels recorded, or `c` 0).
    #[cfg(test)]
    pub fn kernel_time_on_cus(&self, vm: VmId, queues: u32, c: u64) -> Option<u64> {
        Some(time_on(self.steady_kernels(vm)?, queues, c)).filter(|_| c > 0)
    }

    /// The fewest CUs in all (at most `n`, the partition's) on which `vm`'s
    /// job, timed kernel by kernel, runs within `room` (not below its time
    /// on `n`); `None` without steady kernels. The RT bound is not asked
    /// here: `Spatial::size_for_latency` keeps the aggregates' sizes for it.
    pub(crate) fn cus_by_kernels(&self, vm: VmId, queues: u32, n: u64, room: u64) -> Option<u64> {
        // The steady kernels looked up once for the whole search.
        let ks = self.steady_kernels(vm)?;
        if n == 0 {
            return None;
        }
        let budget = room.max(time_on(ks, queues, n));
        // The time does not grow with `c`: the fewest `c` within budget.
        let (mut lo, mut hi) = (1u64, n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if time_on(ks, queues, mid) <= budget {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Some(lo)
    }
}

/// The time of `kernels` (workgroups, one workgroup's cost) on `c > 0`
/// CUs in all on `queues` busy queues: `sum ceil(queues x W_i / c) x
/// cost_i`.
fn time_on(kernels: &[(u64, u64)], queues: u32, c: u64) -> u64 {
    let q = queues.max(1) as u64;
    kernels.iter().fold(0u64, |t, &(w, cost)| {
        t.saturating_add(w.saturating_mul(q).div_ceil(c.max(1)).saturating_mul(cost))
    })
}
