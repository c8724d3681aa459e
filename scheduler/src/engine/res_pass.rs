//! A higher RT runs on a lower RT's held reservation (issue 18, two RT
//! tenants at different levels; docs/scheduling.md, "A higher RT takes
//! a lower RT's reservation").
//!
//! A partition has one CU reservation. When a lower RT holds it (kept
//! across its gaps: `Scheduler::spatial_held`) and a higher VM becomes the
//! slice owner with no reservation of its own (too wide for the width cap
//! and refused a wide one, `engine/wide.rs`), the reservation used to end
//! and the partition was preempted whole: every lower queue beside the
//! lower RT saved, and then set up again, with a second save, at the lower
//! RT's next job. Fuzz seed 97092 (a 2.3 kHz RT at priority 13, 3 x 304
//! workgroups of 1 us, above a 6 kHz RT at priority 9 holding 13-19 CUs per
//! XCC): two saves of the best effort per period of the higher RT, CWSR
//! 37% of the run.
//!
//! Now the higher owner takes the reservation over as it is when its job
//! meets its RT bound on those CUs (its latency size, the same
//! `Spatial::size_for_latency` the owner's own reservation is sized by, is
//! not larger), it is periodic (its wake period known and not stretched
//! under a reservation, `WakePeriods`) and not backlogged (demanding
//! without a break for at most twice its job's time there): the lower
//! work beside it keeps running on the other CUs, and only the lower RT's
//! queue, on the reserved CUs, is saved, as strict priority has it. The
//! lower RT's reservation is recorded; once the higher owner no longer
//! holds, the reservation goes back to it, without a save (nothing grows),
//! while it still holds. A backlogged or closed-loop higher VM, or one
//! whose job needs more CUs than the cap leaves, preempts the partition
//! as before. One whose job needs more than the lower RT's CUs but fits
//! the cap takes the reservation grown to its latency size: a save of the
//! lower work on the added CUs, where a preemption of the whole partition
//! saved it all and the lower RT's next job saved it again (fuzz seed
//! 50158: a 1 kHz RT of 304 workgroups above a 10 kHz RT of 66: CWSR
//! 11.2% -> 5.9% of the run).

use super::*;
use crate::spatial::Reservation;

impl Scheduler {
    /// The reservation `owner` (with `queues` busy queues at its level and
    /// latency size `lat`, `Spatial::size_for_latency`) takes over in `p`
    /// when it has none of its own: a lower VM's reservation `prev` held
    /// across its gaps, or the one it took over before, when its job meets
    /// its bound on those CUs (see the module doc). `None`: the partition
    /// is preempted whole, as before.
    pub(super) fn res_pass_up(
        &self,
        p: usize,
        owner: SliceOwner,
        prev: Option<Reservation>,
        queues: u32,
        lat: Option<u32>,
    ) -> Option<Reservation> {
        let pr = prev.filter(|r| r.k > 0 && !r.drain)?;
        let taken_before = pr.vm == owner.vm
            && pr.level == owner.level
            && self.spatial.passed.get(p).copied().flatten().is_some();
        let from_lower = pr.vm != owner.vm && pr.level < owner.level && self.spatial_held(p, pr);
        if !(taken_before || from_lower) {
            return None;
        }
        // Grown to its latency size when the lower VM's CUs are too few
        // (a save of the lower work on the added CUs, as a preemption of
        // the whole partition would save it), within the cap and leaving
        // a CU per XCC.
        let n = self.spatial.cus_per_xcc;
        let cap = n.saturating_mul(self.cfg.spatial_max_permille.min(1000)) / 1000;
        let k = pr.k.max(lat?);
        if k > pr.k && (k > cap || k >= n) {
            return None;
        }
        self.periodic_takes(p, owner, queues, k)
    }

    /// A reservation of `k` CUs per XCC for `owner` (with `queues` busy
    /// queues) in `p`, taken over from another holder, when the owner is
    /// periodic: its wakes have a period its job alone does not stretch,
    /// and its job on the `k` CUs plus the wait allowance does not make it
    /// backlogged (`coreside_backlogged`). `None` otherwise. Shared by
    /// `res_pass_up` and `res_pass_down`.
    pub(super) fn periodic_takes(
        &self,
        p: usize,
        owner: SliceOwner,
        queues: u32,
        k: u32,
    ) -> Option<Reservation> {
        let v = self.vms.get(&owner.vm)?;
        let alone = self.stretch_alone(owner.vm, queues)?;
        if v.wake.period() == 0 || v.wake.stretched(alone) {
            return None;
        }
        let t = self
            .spatial
            .time_on(owner.vm, queues, k)?
            .saturating_add(self.spatial_wait_allowance(p));
        if self.coreside_backlogged(owner.vm, t) {
            return None;
        }
        Some(Reservation {
            vm: owner.vm,
            level: owner.level,
            k,
            drain: false,
            wide: false,
        })
    }

    /// The reservation an `owner` of `p` that may co-reside (with `queues`
    /// busy queues at its level and latency size `lat`) keeps instead of
    /// co-residing, while another VM below it still holds the partition's
    /// reservation `prev` across its gaps: a co-residence gives the lower
    /// work every CU, and the other VM's next job takes its CUs back with
    /// a save of that work, once per job of the owner (fuzz seed 300016: a
    /// 5.8 kHz RT that co-resides above a 2.8 kHz RT holding 5 CUs per
    /// XCC, CWSR 29.2% of the run; docs/scheduling.md, "A co-residence
    /// keeps a lower RT's reservation"). The lower VM's reservation is
    /// taken over through `res_pass_up`: as it is when the owner's job
    /// fits it, else grown to the owner's size within the cap (one save
    /// of the lower work on the added CUs; `res_keep` then holds the
    /// larger size for both, where co-residing cost the lower work a save
    /// at every job of the lower RT: docs/scheduling.md, "A co-residence
    /// grows a lower RT's reservation once"); the owner's own reservation, which `res_keep` holds at another
    /// holder's size, stays at that size (its own size `lat`, raised by
    /// `res_keep`). `None`: it co-resides.
    pub(super) fn coreside_keeps_held(
        &self,
        p: usize,
        owner: SliceOwner,
        prev: Option<Reservation>,
        queues: u32,
        lat: Option<u32>,
    ) -> Option<Reservation> {
        let pr = prev.filter(|r| r.k > 0 && !r.drain)?;
        let lat = lat?;
        if pr.vm != owner.vm {
            return self.res_pass_up(p, owner, prev, queues, Some(lat));
        }
        if lat > pr.k {
            return None;
        }
        let other = self.spatial.keep.get(p).into_iter().flatten().any(|r| {
            r.vm != owner.vm && r.level < owner.level && r.k > lat && self.spatial_held(p, *r)
        });
        other.then_some(Reservation {
            vm: owner.vm,
            level: owner.level,
            k: lat,
            drain: false,
            wide: false,
        })
    }

    /// When the VM holding partition `p`'s reservation `prev` no longer
    /// holds and the owner (at `level`) is below it: the reservation goes
    /// to another VM above the owner that held it and still holds (the
    /// lower VM a higher owner took it over from, `res_pass_up`, or one
    /// recorded by `res_keep`), the highest of them, at the largest size
    /// any of them needed and never larger than `prev` (its lower work is
    /// on the other CUs already: nothing is saved). Before, it ended, and
    /// the other VM's next job set it up again with a save of the lower
    /// work: fuzz seed 97077, the best effort saved at each job of the
    /// lower RT after one of the higher.
    pub(super) fn res_pass_back(
        &self,
        p: usize,
        level: u16,
        prev: Option<Reservation>,
    ) -> Option<Reservation> {
        let pr = prev.filter(|r| r.k > 0 && !r.drain)?;
        let passed = self.spatial.passed.get(p).copied().flatten();
        let kept = self.spatial.keep.get(p).into_iter().flatten().copied();
        let holders = || {
            passed
                .into_iter()
                .chain(kept.clone())
                .filter(|lo| lo.vm != pr.vm && lo.level > level && lo.k > 0)
                .filter(|lo| self.spatial_held(p, *lo))
        };
        let top = holders().max_by_key(|lo| lo.level)?;
        let k = holders().map(|lo| lo.k).max().unwrap_or(top.k).min(pr.k);
        Some(Reservation {
            k,
            drain: false,
            ..top
        })
    }

    /// Does reservation `r` take the place of `prev` without taking a CU
    /// the lower work may be on: `prev` had CUs of its own and was not a
    /// drain (every lower queue beside it is on the other CUs), and `r`
    /// is no larger? Then it changes owner without a save (the queues of
    /// the VM that held it, on the reserved CUs, are saved when below the
    /// new owner, as `Scheduler::spatial_keeps` has it). Before, a
    /// reservation that passed to another VM was set up anew, saving the
    /// lower work although its CUs did not change: fuzz seed 97077 (a
    /// 0.6 kHz RT and a 6.7 kHz one at priorities 11 and 8 above a
    /// best effort), the best effort saved at each job of the higher RT
    /// and again when the lower RT took the reservation back.
    pub(super) fn res_in_place(r: Reservation, prev: Option<Reservation>) -> bool {
        prev.is_some_and(|pr| pr.k > 0 && !pr.drain && r.k > 0 && r.k <= pr.k)
    }

    /// Partition `p`'s reservation becomes `r` after `prev`: records the
    /// lower VM's reservation when a higher owner takes it over
    /// (`res_pass_up`), and forgets it when the reservation goes back to
    /// that VM, ends or becomes a co-residence or a drained one.
    pub(super) fn res_pass_note(
        &mut self,
        p: usize,
        prev: Option<Reservation>,
        r: Option<Reservation>,
        taken: bool,
    ) {
        let Some(slot) = self.spatial.passed.get_mut(p) else {
            return;
        };
        if taken {
            if let Some(pr) = prev.filter(|pr| r.is_some_and(|r| r.vm != pr.vm)) {
                *slot = Some(pr);
            }
            return;
        }
        let end = match (r, *slot) {
            (None, _) | (_, None) => true,
            (Some(r), Some(lo)) => r.vm == lo.vm || r.k == 0 || r.drain,
        };
        if end {
            *slot = None;
        }
    }
}
