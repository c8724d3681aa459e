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
//!
//! **The owner's guests are spread** (branch `coreback`). The simulator
//! and the hardware place a workgroup beside another queue's on the CUs
//! round robin over the partition (`gpusim` `guest_rr`), so the `w`
//! workgroups of each owner job land on the next `w` CUs: a given CU hosts
//! one of them every `N / w` jobs, i.e. every `I x N / w` ns. A lower round
//! of solo length `L` is stretched to at most `2L` (sharing at most halves
//! it), and a window of `2L` holds at most `h = floor(2L x w / (I x N)) + 1`
//! of one CU's guests; each delays the round by at most the owner's solo
//! time `s` (one workgroup's cost per kernel). So a round is delayed by at
//! most `D = min(L, h x s)`, and the lower work loses at most
//! `lambda_spread = D / (L + D)` of its time. `lambda_co` is the least of
//! the two bounds, `min(A / I, 1/2, lambda_spread)`, the worst over the
//! lower VMs whose dispatches fill the partition (`L` each one's solo
//! time; unknown: `1/2`). Fuzz seed 400136: an owner of 16 half-CU
//! workgroups of 97.6 us every 199 us (`A / I` = 0.49) beside 912 lower
//! workgroups of 502 us (3 whole rounds; `h` = 1, `lambda_spread` =
//! 97.6 / 599.6 = 0.16) held a reservation that costs a fourth round
//! (`lambda_res` = 0.25): the lower VM kept 0.749 of alone; co-resident it
//! keeps 0.930 (docs/scheduling.md, "Co-residence priced by spread
//! guests").

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
        // The worst `lambda_spread = D / (L + D)` of the lower VMs that fill
        // the partition (1/2 when one's round is not known).
        let (mut sp_num, mut sp_den) = (0u128, 1u128);
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
            let mut vm_fills = false;
            for w in recent.iter() {
                seen = true;
                vm_fills |= w >= all;
                let (ra, rb) = (w.div_ceil(all), w.div_ceil(rest));
                if u128::from(rb - ra) * u128::from(den) > u128::from(num) * u128::from(rb) {
                    (num, den) = (rb - ra, rb);
                }
            }
            if vm_fills {
                fills = true;
                let (d, l) = self.spread_round_delay(owner.vm, queues, *vm, i, all);
                if d * sp_den > sp_num * (l + d) {
                    (sp_num, sp_den) = (d, l + d);
                }
            }
        }
        // lambda_res = num / den < lambda_co = min(a / i, 1 / 2,
        // lambda_spread).
        seen && fills
            && u128::from(num) * u128::from(i) < u128::from(a) * u128::from(den)
            && u128::from(num) * 2 < u128::from(den)
            && u128::from(num) * sp_den < sp_num * u128::from(den)
    }

    /// The most a co-resident `owner` (on `queues` busy queues, ringing
    /// every `interval_ns`) delays one lock-step round of `lower` on a
    /// partition of `cus` CUs, with its guests spread round robin over the
    /// CUs (see the module doc): `(D, L)`, `D = min(L, h x s)` with `h =
    /// floor(2L x w / (I x N)) + 1`, `L` the lower VM's solo time, `s` the
    /// owner's and `w` its width times its queues. `(1, 1)` (a loss of
    /// 1/2, no tighter than `lambda_co`'s cap) when a figure is unknown.
    pub(super) fn spread_round_delay(
        &self,
        owner: VmId,
        queues: u32,
        lower: VmId,
        interval_ns: u64,
        cus: u64,
    ) -> (u128, u128) {
        let sp = &self.spatial;
        let unknown = (1, 1);
        let Some(l) = sp.occ.get(&lower).map(|o| u128::from(o.solo_ns)) else {
            return unknown;
        };
        let Some(s) = sp.occ.get(&owner).map(|o| u128::from(o.solo_ns)) else {
            return unknown;
        };
        let Some(w) = sp.width.get(&owner).copied() else {
            return unknown;
        };
        let w = u128::from(w) * u128::from(queues.max(1));
        let per = u128::from(interval_ns) * u128::from(cus);
        if l == 0 || s == 0 || w == 0 || per == 0 {
            return unknown;
        }
        // Guest-given widths: saturating (a saturated `h x s` is `L`).
        let h = l.saturating_mul(2).saturating_mul(w) / per + 1;
        (h.saturating_mul(s).min(l), l)
    }
}
