//! A higher RT's CUs fenced off a lower VM's waves without a save point
//! (issue 18 item 4: "a guest's `no_save_point` never costs a higher VM
//! more than its preemption timeout once, and is billed";
//! docs/scheduling.md "An RT fenced off waves without a save point").
//!
//! Every way the engine serves a higher RT over lower work but one takes
//! CUs the lower waves sit on when the RT's job comes: a save per job, a
//! reservation set up with a save, a drain, or a co-residence that
//! overruns and ends in a save. A save waits for the waves that have no
//! save point, each as long as the guest made it (fuzz seed 97057: 9.4 ms
//! workgroups, saves that waited 15-18 ms, at every period of a 1.3 ms
//! RT). Once a lower VM's save has waited longer than the owner's switch
//! budget (the promise's allowance less one clean save, `nsp_budget`),
//! the scheduler knows that VM runs such waves, and only CUs its waves
//! are kept off serve the owner within its bound: the owner gets a
//! reservation sized for its RT bound without a save (`size_for_latency`
//! with that budget as the switch), not capped by `spatial_max_permille`
//! (at most every CU but one per XCC), in place of a smaller one, a
//! co-residence or none, and holds it through its gaps up to twice its
//! measured interval between jobs while that VM stays busy below it. The
//! lower work pays the fenced CUs, which the guest's flag makes necessary.

use super::*;
use crate::spatial::Reservation;

impl Scheduler {
    /// The longest wait for lower waves without a save point that an
    /// owner's switch in `p` covers: the promise's allowance
    /// (`spatial_wait_allowance`) less one clean save of the lower work.
    fn nsp_budget(&self, p: usize) -> Nanos {
        self.spatial_wait_allowance(p)
            .saturating_sub(self.clean_save(p))
    }

    /// Is a VM busy below `level` in `p` (or boosted from below it) whose
    /// recent saves waited longer
    /// than the owner's switch budget for its own waves without a save
    /// point (`Spatial::nsp`)?
    pub(super) fn nsp_below(&self, p: usize, level: u16) -> bool {
        if self.spatial.nsp.is_empty() {
            return false;
        }
        let budget = self.nsp_budget(p);
        let busy = &self.parts[p].busy;
        // Busy below `level`, or boosted in an aging batch from below it
        // (the batch runs them on the partition's CUs in the owner's gaps).
        let below = busy.range(..level).flat_map(|(_, vms)| vms.keys());
        let batch = busy
            .get(&BOOST_LEVEL)
            .into_iter()
            .flat_map(|vms| vms.keys())
            .filter(|vm| {
                self.vms
                    .get(vm)
                    .is_some_and(|v| (v.params.priority as u16) < level)
            });
        below
            .chain(batch)
            .any(|vm| self.spatial.nsp.get(vm).is_some_and(|&w| w > budget))
    }

    /// The reservation `owner` (at a normal level, over busy lower work)
    /// gets in `p` instead of `cand` while a VM below it runs waves without
    /// a save point: its own, at least as many CUs per XCC as its RT bound
    /// needs with no save (`cand` when that is no smaller and not
    /// drained). `cand` when no such VM is below, the size is not measured
    /// yet, it would leave the lower work no CU, or the owner is
    /// backlogged (`nsp_fence_size`).
    ///
    /// The partition has one reservation: a held one of another RT at
    /// another level (`prev`) passes to the owner at the larger size
    /// (`spatial_plan`), so both RTs' jobs run on the fence, side by side
    /// when they overlap: it holds the sum of both sizes (fuzz seed
    /// 97057: a 1.3 ms RT's 20 CUs per XCC shared with a 137 us RT's
    /// jobs ran it 550-700 us against a bound of 577).
    pub(super) fn nsp_fence(
        &self,
        p: usize,
        owner: SliceOwner,
        prev: Option<Reservation>,
        cand: Option<Reservation>,
    ) -> Option<Reservation> {
        if owner.level >= BOOST_LEVEL || !self.nsp_below(p, owner.level) {
            return cand;
        }
        let Some(own) = self.nsp_fence_size(p, owner.vm, owner.level) else {
            return cand;
        };
        let other = prev
            .filter(|pr| {
                pr.vm != owner.vm && pr.level != owner.level && pr.k > 0 && self.nsp_held(p, *pr)
            })
            .and_then(|pr| self.nsp_fence_size(p, pr.vm, pr.level))
            .unwrap_or(0);
        let k = own.saturating_add(other);
        if k >= self.spatial.cus_per_xcc {
            return cand;
        }
        match cand {
            Some(c) if c.k >= k && !c.drain => cand,
            _ => Some(Reservation {
                vm: owner.vm,
                level: owner.level,
                k,
                drain: false,
                wide: false,
            }),
        }
    }

    /// CUs per XCC on which `vm`'s job (its busy queues at `level` of
    /// `p`) meets its RT bound with no save: the switch budget as the
    /// bound's switch (`None`: not measured yet, or 0).
    /// Only for a demand-limited VM (not `yield_backlogged`, as an aging
    /// batch yields to: an RT's job, not a flood's backlog).
    fn nsp_fence_size(&self, p: usize, vm: VmId, level: u16) -> Option<u32> {
        if self.yield_backlogged(vm) {
            return None;
        }
        let queues = self.owner_queues(
            p,
            SliceOwner {
                vm,
                level,
                since: self.now,
                drained: None,
                hold: 0,
                cost_held: false,
            },
        );
        self.spatial
            .size_for_latency(vm, queues, self.nsp_budget(p), 0)
            .filter(|&k| k > 0)
    }

    /// How long reservation `r` of `p` outlives its VM's idle gaps because
    /// a VM below it runs waves without a save point: twice the VM's
    /// measured interval between jobs (a periodic owner's next job comes
    /// within it). `None`: no such VM below, a co-residence or a drain, a
    /// backlogged VM, or no interval measured.
    pub(super) fn nsp_hold(&self, p: usize, r: Reservation) -> Option<Nanos> {
        if r.k == 0 || r.drain || self.yield_backlogged(r.vm) || !self.nsp_below(p, r.level) {
            return None;
        }
        let i = self.spatial.occ.get(&r.vm)?.interval_ns;
        (i > 0).then(|| i.saturating_mul(2))
    }

    /// Is `r` held by [`Self::nsp_hold`]: its VM busy, or idle no longer
    /// than that hold (same level, not removed)?
    pub(super) fn nsp_held(&self, p: usize, r: Reservation) -> bool {
        let Some(hold) = self.nsp_hold(p, r) else {
            return false;
        };
        self.vms.get(&r.vm).is_some_and(|v| {
            !v.removed
                && v.params.priority as u16 == r.level
                && (v.busy > 0 || self.now.saturating_sub(v.idle_at) <= hold)
        })
    }

    /// Does partition `p`'s running aging batch hold a VM whose saves
    /// waited longer than the switch budget for its own waves without a
    /// save point, below a held reservation `r` of a demand-limited VM
    /// (with CUs of its own, not a drain)? Then
    /// the batch keeps `r` past its yield allowance: taking the whole
    /// partition would put those waves on the fence's CUs, and the
    /// owner's next job would wait for them (fuzz seed 400058: one RT job
    /// of 1.1-1.6 ms, against a bound of 452 us, per batch of a VM of
    /// 1.9 ms waves).
    pub(super) fn batch_fenced(&self, p: usize, r: Reservation) -> bool {
        // (Not `nsp_held`: the batch's queues are busy at the boost
        // level, not below `r`'s.)
        if self.spatial.nsp.is_empty() || r.k == 0 || r.drain || self.yield_backlogged(r.vm) {
            return false;
        }
        let budget = self.nsp_budget(p);
        self.parts[p]
            .aging
            .batch
            .iter()
            .filter_map(|e| self.queues.get(&e.0))
            .any(|q| self.spatial.nsp.get(&q.vm).is_some_and(|&w| w > budget))
    }

    /// Does a queue of `vm` get every CU of `p` although fence `r` is in
    /// place: `r` held over a flagged VM ([`Self::nsp_held`]), its owner
    /// in a gap (no busy queue), and `vm` not flagged itself (its saves
    /// waited at most the switch budget)? The fence is per VM: only the
    /// flagged VM's waves are kept off the owner's CUs in its gaps; a VM
    /// whose waves can be saved takes them and is saved at the owner's
    /// next job as without a fence (fuzz seed 400058: a flood at
    /// priority 6 kept beside a 1.5 kHz RT's fence of 21 of 38 CUs per
    /// XCC for a VM of 1.9 ms waves below it lost half its work).
    pub(super) fn nsp_gap_open(&self, p: usize, r: Reservation, vm: VmId) -> bool {
        if self.spatial.nsp.is_empty() || r.k == 0 || vm == r.vm {
            return false;
        }
        let idle = self.vms.get(&r.vm).is_some_and(|v| v.busy == 0);
        if !idle || !self.nsp_held(p, r) {
            return false;
        }
        let budget = self.nsp_budget(p);
        self.spatial.nsp.get(&vm).is_none_or(|&w| w <= budget)
    }

    /// Is partition `p`'s reservation a held fence its running batch keeps
    /// ([`Self::batch_fenced`])? A pause of that batch for the fence's
    /// owner saves nothing and leaves the batch only the CUs it never had,
    /// so it does not spend the batch's yield allowance.
    pub(super) fn batch_fence_kept(&self, p: usize) -> bool {
        self.spatial
            .res
            .get(p)
            .copied()
            .flatten()
            .is_some_and(|r| self.spatial_held(p, r) && self.batch_fenced(p, r))
    }
}
