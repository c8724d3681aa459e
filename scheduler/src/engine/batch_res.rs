//! An aging batch beside a higher VM's reservation (issue 18, `rt` family,
//! docs/scheduling.md "An aging batch keeps a higher VM's reservation").
//!
//! A batch boosts starved queues above every VM priority, so the slice
//! owner of its partition is the boost level and no reservation of a
//! higher VM would survive it: the batch's queues took every CU, and each
//! pause of the batch for a demand-limited higher VM (an RT job) set the
//! reservation up anew and saved the batch's work (a save and a restore
//! charged to the batch's yield allowance per RT job). An RT of a high
//! duty cycle used the allowance up within a few jobs and then waited for
//! the rest of the batch (fuzz seed 97138: 2.05 ms), and a batch of waves
//! without a save point made each pause wait for them (seed 97032: 4.6
//! ms). Here the batch keeps a held reservation of a VM above its own
//! VMs: its queues run on the other CUs, a pause saves nothing (the
//! batch's queues keep running beside the higher VM), and the pause costs
//! the batch only the CUs it leaves.

use super::*;
use crate::spatial::Reservation;

impl Scheduler {
    /// The reservation partition `p`'s boosted owner keeps: the one held
    /// now (`prev`) by a VM above every VM of the running batch, with CUs
    /// of its own (`k > 0`), not a drain, and still held across its VM's
    /// gaps. `None`: the batch takes the partition as before.
    pub(super) fn batch_keeps_reservation(
        &self,
        p: usize,
        prev: Option<Reservation>,
    ) -> Option<Reservation> {
        let r = prev?;
        if r.k == 0 || r.drain || !self.spatial_held(p, r) || self.yield_backlogged(r.vm) {
            return None;
        }
        // Kept only while the batch's yield allowance lasts (the run
        // beside it is charged there: `charge_beside`); then the batch
        // takes the partition as before.
        let part = &self.parts[p];
        if part.aging.paused_since.is_none()
            && part.aging.yielded.saturating_add(self.pause_switch(part)) >= AGING_YIELD_NS
        {
            return None;
        }
        let top = self.batch_top_priority(p)?;
        (r.level > top).then_some(r)
    }

    /// Does owner `owner` of partition `p` keep its own reservation `prev`
    /// rather than trade it for a co-residence, because an aging batch is
    /// paused for it? The pause saved the batch's queues off the reserved
    /// CUs, so a co-residence looks possible (no lower queue is resident
    /// beside the owner); but when the owner drains the batch resumes on
    /// every CU, and the owner's next job sets its reservation up again
    /// with a save and restore of the batch's work, charged to the yield
    /// allowance `Y` at every job. An RT of a short period spent `Y` within
    /// a few jobs and then waited for the rest of the batch (fuzz seed
    /// 400110: 153 us period, 1.85 ms waits at each batch). Kept, the
    /// reservation is held across the owner's gaps and the batch keeps it
    /// ([`Self::batch_keeps_reservation`]): its queues run on the other
    /// CUs and the owner's later jobs save nothing.
    pub(super) fn pause_keeps_reservation(
        &self,
        p: usize,
        owner: SliceOwner,
        prev: Option<Reservation>,
    ) -> bool {
        prev.is_some_and(|r| r.vm == owner.vm && r.k > 0 && !r.drain)
            && self.paused_batch_level(p, owner.level).is_some()
    }

    /// Charges partition `p`'s running batch, since the last charge, for
    /// its run beside a kept reservation of a higher VM: the reserved CUs'
    /// share of that time goes to its yield allowance (`yielded`), so the
    /// batch ends that much later and its turn still gets `B - 2 t_save`
    /// of the whole partition's work. Called before the decision, so the
    /// reservation read is the one in place since the last charge. (A
    /// pause is charged by `aging_yield`.)
    pub(super) fn charge_beside(&mut self, p: usize) {
        let now = self.now;
        let part = &self.parts[p];
        let since = part.aging.beside_at;
        let kept = part.aging.batch_since.is_some()
            && part.aging.paused_since.is_none()
            && self.spatial.res.get(p).copied().flatten().is_some_and(|r| {
                r.k > 0 && self.batch_top_priority(p).is_some_and(|t| r.level > t)
            });
        let cost = if kept {
            self.unsaved_pause_cost(p, now.saturating_sub(since))
        } else {
            0
        };
        let part = &mut self.parts[p];
        part.aging.yielded = part.aging.yielded.saturating_add(cost).min(AGING_YIELD_NS);
        part.aging.beside_at = now;
    }

    /// When partition `pi`'s running batch, due to end at `end` by the
    /// charges so far, ends while it runs beside a kept reservation of `k`
    /// of `n` CUs per XCC: each ns beside it moves the end `k / n` ns on
    /// (`charge_beside`), so the rest `end - t` (counted from the last
    /// charge `t`) takes `(end - t) x n / (n - k)`; at most where the
    /// allowance runs out (the charge stops at it). `end` when nothing is
    /// kept.
    pub(super) fn beside_end(&self, pi: usize, end: Nanos) -> Nanos {
        let part = &self.parts[pi];
        let n = self.spatial.cus_per_xcc as u128;
        let kept = if part.aging.paused_since.is_none() {
            self.spatial.res.get(pi).copied().flatten().filter(|r| {
                r.k > 0
                    && (r.k as u128) < n
                    && !r.drain
                    && self.batch_top_priority(pi).is_some_and(|t| r.level > t)
            })
        } else {
            None
        };
        let Some(r) = kept else {
            return end;
        };
        let t = part.aging.beside_at;
        let left = end.saturating_sub(t) as u128;
        let k = r.k as u128;
        let stretched = (left * n).div_ceil(n - k);
        // The allowance left caps the stretch: once it is charged
        // (`charge_beside` stops there) the end no longer moves, so the
        // batch ends at most the allowance left after `end`.
        let cap = left.saturating_add(AGING_YIELD_NS.saturating_sub(part.aging.yielded) as u128);
        t.saturating_add(stretched.min(cap).min(Nanos::MAX as u128) as Nanos)
            .max(self.now.saturating_add(1))
    }

    /// The highest VM priority among the queues of partition `p`'s running
    /// aging batch (`None`: no batch, or none of its queues is left).
    pub(super) fn batch_top_priority(&self, p: usize) -> Option<u16> {
        let part = &self.parts[p];
        part.aging.batch_since?;
        part.aging
            .batch
            .iter()
            .filter_map(|e| self.queues.get(&e.0))
            .filter_map(|q| self.vms.get(&q.vm))
            .map(|v| v.params.priority as u16)
            .max()
    }

    /// The level a queue's CU set is chosen by ([`Spatial::set_for`]): its
    /// VM's own priority while boosted (a boosted queue of a VM below the
    /// reservation's runs on the other CUs), else its key's level.
    pub(super) fn cu_set_level(&self, q: &Queue) -> u16 {
        if q.boosted {
            self.vms
                .get(&q.vm)
                .map_or(lvl(self.key_of(q)), |v| v.params.priority as u16)
        } else {
            lvl(self.key_of(q))
        }
    }

    /// [`Self::cu_set_level`] of a mapped queue: a mapped queue is indexed,
    /// so its key is current ([`Scheduler::key_of`], checked by
    /// `check_invariants` and here in debug builds) and only a boosted
    /// queue looks its VM up. The CU-set sync asks it for every mapped
    /// queue at every decision.
    pub(super) fn mapped_cu_set_level(&self, q: &Queue) -> u16 {
        debug_assert_eq!(
            lvl(q.key),
            lvl(self.key_of(q)),
            "a mapped queue's key is current"
        );
        if q.boosted {
            self.cu_set_level(q)
        } else {
            lvl(q.key)
        }
    }

    /// What a pause of `ns` of partition `p`'s batch costs the batch when
    /// its work was not saved: its queues keep running beside the VM it
    /// yields to on the CUs outside that VM's reservation, so the batch
    /// loses only the reserved CUs' share of the pause (`ns x k / n`,
    /// rounded up; `ns` when there is no such reservation).
    pub(super) fn unsaved_pause_cost(&self, p: usize, ns: Nanos) -> Nanos {
        let n = self.spatial.cus_per_xcc as u64;
        match self.spatial.res.get(p).copied().flatten() {
            Some(r) if r.k > 0 && n > 0 && (r.k as u64) < n && !r.drain => {
                ((ns as u128 * r.k as u128).div_ceil(n as u128)) as Nanos
            }
            _ => ns,
        }
    }

    /// Inverse of [`Self::unsaved_pause_cost`]: the longest pause of
    /// partition `p`'s batch whose cost is at most `cost`.
    pub(super) fn unsaved_pause_for(&self, p: usize, cost: Nanos) -> Nanos {
        let n = self.spatial.cus_per_xcc as u64;
        match self.spatial.res.get(p).copied().flatten() {
            Some(r) if r.k > 0 && n > 0 && (r.k as u64) < n && !r.drain => {
                ((cost as u128 * n as u128) / r.k as u128).min(Nanos::MAX as u128) as Nanos
            }
            _ => cost,
        }
    }

    /// Does a queue of partition `part`'s paused batch still run (beside
    /// the VM it yields to)?
    pub(super) fn batch_runs_beside(&self, part: &Partition) -> bool {
        part.aging
            .paused
            .iter()
            .filter_map(|q| self.queues.get(q))
            .any(|q| q.state == QueueState::Running)
    }

    /// Under a boosted owner keeping reservation `res` of a higher VM
    /// ([`Self::batch_keeps_reservation`]), that VM's running queue `q`
    /// keeps running on its reserved CUs: a batch that starts during an
    /// RT job does not save it (the batch's queues take the other CUs).
    pub(super) fn batch_keeps_holder(
        &self,
        res: Option<Reservation>,
        owner: SliceOwner,
        q: QueueId,
    ) -> bool {
        owner.level == BOOST_LEVEL
            && res.is_some_and(|r| {
                r.k > 0 && r.vm != owner.vm && self.queues.get(&q).is_some_and(|qq| qq.vm == r.vm)
            })
    }
}
