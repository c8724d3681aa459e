//! Co-residence or a reservation, by what each costs the lower lock-step
//! work (issue 18, the `rt` family's `3-be-retained`; docs/scheduling.md,
//! "Co-residence or reservation by the lower work's rounds").
//!
//! A lower kernel runs its workgroups in lock-step rounds, one per CU
//! (`docs/gpu-model.md`, batches), and a round ends as late as its most
//! delayed CU. Under a **co-residence** the higher owner's workgroups take
//! free CUs first and only share a CU with a lower workgroup when the lower
//! kernel fills the partition; each shared CU then delays the lower round
//! by up to the owner's solo time. So a lower VM whose recent dispatches
//! fill the partition (`W >= N`) loses up to the owner's job alone `A` per
//! owner period `I`, and at most half (two workgroups on a CU each run at
//! half rate): `lambda_co = min(A / I, 1 / 2)`. A **reservation** of `k` CUs per
//! XCC costs a lower kernel of `W` workgroups `lambda_res = 1 - ceil(W / N)
//! / ceil(W / N')` (`N' = N - XCCs x k`; 0 when its last round leaves room
//! for the reserved CUs), the worst of its recent dispatches, the rule of
//! `engine/res_hold.rs`. Co-residence is kept unless the reservation
//! costs less (fuzz seed 50115: 443 whole-round workgroups of 679 us
//! beside a 716 us RT of 3 workgroups of 238 us kept 0.868 of alone
//! co-resident, `lambda_co` = 0.33, while 8 reserved CUs leave its two
//! rounds two: `lambda_res` = 0).
//!
//! The reservation's `k` is the width sizing with headroom (`Spatial::size`,
//! at least the latency sizing the reservation gets): the most CUs it may
//! take, so its cost is not understated.

use super::*;

impl Scheduler {
    /// Should `owner`, admitted to co-reside on partition `p`, get a CU
    /// reservation instead because that costs the lower lock-step work
    /// running there less than sharing its CUs (`lambda_res < lambda_co`,
    /// see the module doc)? `false` whenever something is unknown (the
    /// owner's width, solo time or period, a lower VM's widths) or no
    /// narrow reservation fits the cap.
    pub(super) fn lockstep_prefers_reservation(&self, p: usize, owner: SliceOwner) -> bool {
        let sp = &self.spatial;
        let n_xcc = u64::from(sp.cus_per_xcc);
        let xccs = u64::from(sp.xccs).max(1);
        let queues = self.owner_queues(p, owner);
        let Some(k) = sp.size(
            owner.vm,
            queues,
            self.cfg.spatial_headroom_pct,
            self.cfg.spatial_max_permille,
        ) else {
            return false;
        };
        let k = u64::from(k);
        if k == 0 || k >= n_xcc {
            return false;
        }
        let (Some(a), Some(o)) = (sp.alone_ns(owner.vm, queues), sp.occ.get(&owner.vm)) else {
            return false;
        };
        let i = o.interval_ns;
        if a == 0 || i == 0 {
            return false;
        }
        let Some(part) = self.parts.get(p) else {
            return false;
        };
        let all = n_xcc.saturating_mul(xccs);
        let rest = n_xcc.saturating_sub(k).saturating_mul(xccs);
        if rest == 0 {
            return false;
        }
        // The worst lower dispatch under the reservation, (b - a) / b, and
        // whether any lower dispatch fills the partition (co-residence then
        // delays its rounds).
        let (mut num, mut den) = (0u64, 1u64);
        let mut fills = false;
        let mut seen = false;
        // Every busy lower VM (running, or being saved or restored when the
        // decision is made: a running-queue view would flip a reservation
        // being set up back to a co-residence).
        for vm in part.busy.range(..owner.level).flat_map(|(_, m)| m.keys()) {
            if *vm == owner.vm {
                continue;
            }
            let Some(recent) = sp.recent.get(vm) else {
                return false;
            };
            for w in recent.iter() {
                seen = true;
                fills |= w >= all;
                let (ra, rb) = (w.div_ceil(all), w.div_ceil(rest));
                if u128::from(rb - ra) * u128::from(den) > u128::from(num) * u128::from(rb) {
                    (num, den) = (rb - ra, rb);
                }
            }
        }
        // lambda_res = num / den < lambda_co = min(a / i, 1 / 2).
        seen && fills
            && u128::from(num) * u128::from(i) < u128::from(a) * u128::from(den)
            && u128::from(num) * 2 < u128::from(den)
    }
}
