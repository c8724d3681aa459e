//! How long a CU reservation outlives its VM's idle gaps when the gaps are
//! longer than `spatial_hold_ns` (docs/scheduling.md, "Reservation hold by
//! the lower work's cost"): the hold weighs what each choice costs the
//! lower work that runs beside the reservation.
//!
//! * **Keep** `k` CUs per XCC through a gap `g`: the lower work runs on
//!   `N' = N - XCCs x k` of the partition's `N` CUs and loses the fraction
//!   `lambda` of its throughput for `g`. A lower VM with one busy queue runs
//!   one kernel of `W` workgroups at a time in lock-step rounds: `ceil(W /
//!   N')` rounds instead of `ceil(W / N)`, `lambda = 1 - ceil(W / N) /
//!   ceil(W / N')` (a whole round when `W` just fills the partition), the
//!   worst of its last 8 dispatches (`Spatial::recent`: a job's kernels of
//!   different widths each run their own rounds). A VM with `m` busy
//!   queues whose workgroups fit half a CU runs them in phase, one
//!   queue's workgroups beside the other's on the same CUs, so its kernels
//!   are one lock-step kernel of `m x W` workgroups (two queues of 304
//!   lost a third of their throughput beside 8 reserved CUs: fuzz seed
//!   50148); a VM with several busy queues of whole-CU workgroups fills
//!   the CUs a kernel's last round leaves with its other kernels, and
//!   loses the reserved CUs only, `lambda = k / N` per XCC. The worst
//!   lower VM decides.
//! * **Lapse**: the owner's next job sets the reservation up again with a
//!   save of every lower queue running now (their workgroups sit on the
//!   CUs it takes): `n` saves and restores, `n x t_sw` of CWSR time per
//!   gap (`t_sw` twice the partition's typical save without waits for
//!   waves that have no save point).
//!
//! Both costs spend a 10% budget of the promise (best effort keeps 0.9 of
//! alone; CWSR at most 10% of the run), so they weigh the same: keeping
//! is worth it while `lambda x g < n x t_sw`, i.e. the gap hold
//! (`GapHist::hold_ns`) with a switch worth `c = n x t_sw / lambda` of gap
//! time. It only extends the hold: never shorter than `spatial_hold_ns`
//! and the whole partition's cost-aware hold (the rules before it; where
//! those keep a reservation that costs a lone lock-step lower kernel a
//! round, both targets fail either way: docs/scheduling.md).

use super::*;
use crate::spatial::Reservation;

impl Scheduler {
    /// The idle time of reservation `r`'s gaps a lapse is worth, `n x t_sw
    /// / lambda` (see the module doc), from the lower queues running in
    /// partition `p` now; 0 when nothing is known (no save measured, no
    /// lower work running, a co-residence or no geometry).
    pub(super) fn reservation_switch_worth(&self, p: usize, r: Reservation) -> Nanos {
        let sp = &self.spatial;
        let n_xcc = u64::from(sp.cus_per_xcc);
        let xccs = u64::from(sp.xccs).max(1);
        let k = u64::from(r.k);
        if k == 0 || n_xcc == 0 || k >= n_xcc {
            return 0;
        }
        let Some(part) = self.parts.get(p) else {
            return 0;
        };
        let t_sw = self.measured_switch(p);
        // Lower queues running beside the reservation, per VM.
        let mut per_vm: BTreeMap<VmId, u64> = BTreeMap::new();
        for e in part.running.iter().take_while(|e| e.0 < r.level) {
            if let Some(q) = self.queues.get(&e.2) {
                if q.vm != r.vm {
                    *per_vm.entry(q.vm).or_insert(0) += 1;
                }
            }
        }
        let n_saves: u64 = per_vm.values().sum();
        if t_sw == 0 || n_saves == 0 {
            return 0;
        }
        let all = n_xcc.saturating_mul(xccs);
        let rest = n_xcc.saturating_sub(k).saturating_mul(xccs);
        // lambda as a fraction num / den: the reserved CUs' share at least.
        let (mut num, mut den) = (k, n_xcc);
        for (vm, queues) in &per_vm {
            // Several queues run in lock-step together only when their
            // workgroups share CUs (see the module doc).
            let in_phase = *queues == 1 || sp.occ.get(vm).is_some_and(|o| o.fits);
            if !in_phase || rest == 0 {
                continue;
            }
            let Some(recent) = sp.recent.get(vm) else {
                continue;
            };
            for w in recent.iter() {
                let w = w.saturating_mul(*queues);
                let (a, b) = (w.div_ceil(all), w.div_ceil(rest));
                // (b - a) / b > num / den ?
                if u128::from(b - a) * u128::from(den) > u128::from(num) * u128::from(b) {
                    (num, den) = (b - a, b);
                }
            }
        }
        // A lapse the partition's CWSR budget cannot pay for is not made:
        // kept through the gaps whatever the lower work's loss
        // (`engine/cwsr_budget.rs`).
        let lapse = n_saves.saturating_mul(t_sw);
        if !part.cwsr_budget.affords(self.now, lapse) {
            return Nanos::MAX;
        }
        let c = u128::from(n_saves) * u128::from(t_sw) * u128::from(den) / u128::from(num.max(1));
        Nanos::try_from(c).unwrap_or(Nanos::MAX)
    }

    /// How long reservation `r` of partition `p` outlives its VM's idle
    /// gaps by cost: the longer of the whole partition's cost-aware hold
    /// (`cost_hold_at_drain`) and the gap hold with a switch worth
    /// [`Scheduler::reservation_switch_worth`]. 0 where the cost-aware
    /// hold is off or nothing is known.
    pub(super) fn reservation_hold(&self, p: usize, r: Reservation) -> Nanos {
        let whole = self.cost_hold_at_drain(p, r.vm);
        if !self.ops().by_priority || self.cfg.anticipation_ns == 0 {
            return whole;
        }
        let c = self.reservation_switch_worth(p, r);
        let own = self.vms.get(&r.vm).map_or(0, |v| v.gaps.hold_ns(c));
        whole.max(own)
    }
}
