//! Co-residence admission that counts the places the lower work leaves
//! (issue 18, docs/scheduling.md "Co-residence counts the CUs a lower
//! kernel's last round leaves").
//!
//! Co-residence is admitted on the premise that sharing a CU at most
//! doubles the owner's job (`Spatial::can_coreside`: a delay of `2A - s`).
//! That holds when every CU of the partition holds one lower workgroup:
//! the owner's workgroups then go beside them, one per CU, at half rate.
//! It does not hold when the lower queue's kernel leaves some CUs free
//! and holds the others: a queue that has free CUs of its mask runs its
//! kernels in lock-step rounds on them, one workgroup per CU, and goes
//! beside other queues' workgroups only once none is free
//! (docs/gpu-model.md, "Occupancy"). A lower kernel of `w` half-CU
//! workgroups on a partition of `N` CUs runs rounds of `N` and a last
//! round of `r = w - N x (ceil(w / N) - 1)`: in that round `F = N - r`
//! CUs are free, and an owner arriving then runs its whole job on `F` CUs
//! at full rate: `min(ceil(need / F) x s, work / F + s)` (its widest
//! dispatch's rounds for every kernel, or its CU time spread over `F`
//! plus one round), which for a small `F` is far more than doubled.
//! Fuzz seed 200117: an RT of 608 + 304 + 2 x 304 workgroups (51.4 us
//! isolated) co-resident above one lower queue of 548 half-CU workgroups
//! (`F = 304 - 244 = 60`) ran 35 lock-step rounds of 8.572 us on 56 CUs,
//! 300.02 us against a bound of 299.1 us.
//!
//! The admission now takes, over the widths of the lower VMs' recent
//! kernels (`Spatial::kernels`, each kernel of a doorbell apart: the
//! kernel the resident lower queue runs when the owner comes is one of
//! them), the fewest free CUs a last
//! round leaves, and refuses co-residence when the owner's job on that
//! many CUs exceeds its solo time by more than the allowance (one save
//! and restore). The owner then gets a reservation or the partition, as
//! any owner that may not co-reside.

use super::{Scheduler, SliceOwner};
use crate::spatial::Spatial;
use crate::VmId;

impl Spatial {
    /// The fewest free CUs (more than 0) of a partition of `n` CUs that a
    /// kernel of one of `widths` workgroups leaves in its last round
    /// (`None`: every width is a whole number of rounds, or `n` is 0).
    pub fn fewest_left_free(n: u64, widths: impl IntoIterator<Item = u64>) -> Option<u64> {
        if n == 0 {
            return None;
        }
        widths
            .into_iter()
            .filter(|&w| w > 0)
            .map(|w| n - ((w - 1) % n + 1))
            .filter(|&f| f > 0)
            .min()
    }

    /// How long `vm`'s job on `queues` busy queues runs in lock-step
    /// rounds on `free` CUs at full rate: `ceil(need / free) x s`, or its
    /// CU time over `free` plus one round, `work / free + s`, when that is
    /// less (both bound it from above). `None` without a width, a solo
    /// time or CUs.
    pub fn time_on_free(&self, vm: VmId, queues: u32, free: u64) -> Option<u64> {
        if free == 0 {
            return None;
        }
        let by_rounds = self.time_on_cus(vm, queues, free)?;
        let o = self.occ.get(&vm)?;
        let work = o.work_ns.saturating_mul(queues.max(1) as u64);
        if work == 0 {
            return Some(by_rounds);
        }
        Some(by_rounds.min(work.div_ceil(free).saturating_add(o.solo_ns)))
    }
}

impl Scheduler {
    /// Does `owner`'s job, beside the lower work of partition `p`, still
    /// end within its solo time plus `max_ns` when it comes during a lower
    /// kernel's last round and runs on the CUs that round leaves free (see
    /// the module doc)? True when no recent lower width leaves a round
    /// partly free, or when the owner's job fits those CUs within the
    /// allowance.
    pub(super) fn coreside_places_meet(&self, p: usize, owner: SliceOwner, max_ns: u64) -> bool {
        let sp = &self.spatial;
        let n = (sp.cus_per_xcc as u64).saturating_mul(sp.xccs.max(1) as u64);
        let lower = self.parts[p]
            .busy
            .range(..owner.level)
            .flat_map(|(_, m)| m.keys().copied());
        let widths = lower.flat_map(|v| sp.kernels.get(&v).into_iter().flat_map(|r| r.iter()));
        let Some(free) = Spatial::fewest_left_free(n, widths) else {
            return true;
        };
        let queues = self.owner_queues(p, owner);
        let Some(s) = sp.occ.get(&owner.vm).map(|o| o.solo_ns) else {
            return true;
        };
        match sp.time_on_free(owner.vm, queues, free) {
            Some(t) => t.saturating_sub(s) <= max_ns,
            None => true,
        }
    }
}
