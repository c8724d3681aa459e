//! A lower RT's job on CUs of its own below a higher RT's held
//! reservation (issue 18; docs/scheduling.md, "A lower RT beside a higher
//! RT's held reservation").
//!
//! A partition has one reservation. A lower RT whose job comes while a
//! higher RT holds the reservation across its gaps took it over in place
//! (`spatial_plan`'s kept path, at the larger of the two sizes): both RTs
//! then sat on the same highest CUs, and each job of the higher RT during
//! the lower one's saved the lower RT's queue and restored it after. Fuzz
//! seed 600008: a 3.1 kHz RT (1 CU per XCC) above a 0.28 kHz RT of 71 +
//! 52 whole-CU workgroups of 401 us (9 CUs per XCC): 3-4 saves and
//! restores of the lower RT per job, its p99 1353 us against 1196.
//!
//! Now such a lower RT gets the CUs just below the higher RT's
//! (`CuSet::Mid`), sized by its own latency size, for its job: the
//! reservation is the sum (`RtPair`), the lower work runs on the rest, and
//! the higher RT's jobs during the lower one's run on their own CUs
//! without saving it. It is formed once per job of the lower RT, where
//! its own reservation's growth saves the lower work anyway, or where its
//! job on its CUs spans at least one period of the higher RT (one save of
//! the lower work against at least one save and restore of the lower RT);
//! the sum fits the width cap and leaves a CU per XCC. It ends when the
//! lower RT's job ends (its queues no longer busy at its level), the
//! higher RT no longer holds, or a VM outside the pair owns the slice:
//! the lower work's CUs then grow back (no save).

use super::*;
use crate::spatial::{Reservation, RtPair};
use crate::CuSet;

/// What `spatial_plan` chose for a partition, the input of
/// [`Scheduler::rt_pair_plan`].
#[derive(Clone, Copy, Debug)]
pub(super) struct PairAsk {
    /// The slice's owner.
    pub owner: SliceOwner,
    /// The partition's reservation before this decision.
    pub prev: Option<Reservation>,
    /// The reservation chosen.
    pub r: Option<Reservation>,
    /// Whether it is set up with a save.
    pub establish: bool,
    /// The owner's busy queues.
    pub queues: u32,
    /// The owner's latency size (CUs per XCC), if any.
    pub lat: Option<u32>,
}

impl Scheduler {
    /// Partition `p`'s reservation and whether it is set up with a save,
    /// given what `spatial_plan` chose (`ask`): the pair's while it lasts,
    /// a new pair where one forms (see the module doc), else the chosen
    /// one (and any pair ended).
    pub(super) fn rt_pair_plan(&mut self, p: usize, ask: PairAsk) -> (Option<Reservation>, bool) {
        let PairAsk {
            owner,
            prev,
            r,
            establish,
            ..
        } = ask;
        if let Some(pair) = self.spatial.pair.get(p).copied().flatten() {
            let member = [pair.hi, pair.lo]
                .iter()
                .any(|m| m.vm == owner.vm && m.level == owner.level);
            let lasts = member
                && prev.is_some_and(|pr| pr.k == pair.k() && !pr.drain)
                && self.vm_busy_at(p, pair.lo.vm, pair.lo.level)
                && self.spatial_held(p, pair.hi);
            if lasts {
                return (Some(Self::pair_res(owner, pair.k())), false);
            }
            self.spatial.pair[p] = None;
            return (r, establish);
        }
        match self.rt_pair_forms(p, ask) {
            Some(pair) => {
                if let Some(slot) = self.spatial.pair.get_mut(p) {
                    *slot = Some(pair);
                }
                (Some(Self::pair_res(owner, pair.k())), true)
            }
            None => (r, establish),
        }
    }

    /// The pair `ask.owner` forms in `p` (see the module doc), if any.
    fn rt_pair_forms(&self, p: usize, ask: PairAsk) -> Option<RtPair> {
        let PairAsk {
            owner,
            prev,
            r,
            establish,
            queues,
            lat,
        } = ask;
        if owner.level >= BOOST_LEVEL {
            return None;
        }
        // The owner's own reservation was chosen (lower work beside it).
        r.filter(|r| r.vm == owner.vm && r.k > 0)?;
        let hi =
            prev.filter(|pr| pr.k > 0 && !pr.drain && pr.vm != owner.vm && pr.level > owner.level)?;
        if !self.spatial_held(p, hi) {
            return None;
        }
        // The higher RT's own size, as recorded when it last owned the
        // slice (`res_keep.rs`), not the reservation's: that one keeps the
        // size of every VM still holding it, the lower RT's own from its
        // earlier jobs included, and with it the pair never fitted the cap
        // (a 10-CU lower RT that once took the 1-CU higher one's
        // reservation over in place left it at 10 for good, and was saved
        // by each of the higher RT's jobs: proptest case 73 x 398 us
        // beside a 5 kHz RT, `rt_pair_tests.rs`).
        let hi_k = self
            .spatial
            .keep
            .get(p)
            .and_then(|keep| keep.iter().find(|r| r.vm == hi.vm && r.level == hi.level))
            .map_or(hi.k, |r| r.k.clamp(1, hi.k));
        let hi = Reservation { k: hi_k, ..hi };
        let k_lo = lat.filter(|&k| k > 0)?;
        let n = self.spatial.cus_per_xcc;
        let cap = n.saturating_mul(self.cfg.spatial_max_permille.min(1000)) / 1000;
        let k = hi.k.checked_add(k_lo)?;
        if k > cap || k >= n {
            return None;
        }
        // Both periodic: the higher RT's wakes have a period, the owner's
        // job on its part does not make it backlogged.
        let period = self.vms.get(&hi.vm)?.wake.period();
        if period == 0 {
            return None;
        }
        self.periodic_takes(p, owner, queues, k_lo)?;
        let t_lo = self.spatial.time_on(owner.vm, queues, k_lo)?;
        if !establish && t_lo < period {
            return None;
        }
        Some(RtPair {
            hi: Reservation { drain: false, ..hi },
            lo: Reservation {
                vm: owner.vm,
                level: owner.level,
                k: k_lo,
                drain: false,
                wide: false,
            },
        })
    }

    /// The partition's reservation under a pair of `k` CUs per XCC, held
    /// by the member that owns the slice.
    fn pair_res(owner: SliceOwner, k: u32) -> Reservation {
        Reservation {
            vm: owner.vm,
            level: owner.level,
            k,
            drain: false,
            wide: false,
        }
    }

    /// The CU set of `vm`'s queues in `p` under reservation `r` when a
    /// pair holds it and `vm` is a member (`None`: the usual set).
    pub(super) fn rt_pair_set(&self, p: usize, r: Option<Reservation>, vm: VmId) -> Option<CuSet> {
        let pair = self.spatial.pair.get(p).copied().flatten()?;
        r.filter(|r| r.k == pair.k() && r.k > 0)?;
        pair.set_of(vm)
    }

    /// Does the pair's other member's running queue `id` keep running
    /// beside `owner` (it is on its own CUs already)?
    pub(super) fn rt_pair_keeps(
        &self,
        p: usize,
        r: Option<Reservation>,
        owner: SliceOwner,
        id: QueueId,
    ) -> bool {
        let Some(q) = self.queues.get(&id) else {
            return false;
        };
        let Some(slot) = q.slot else {
            return false;
        };
        if q.vm == owner.vm || r.is_none_or(|r| r.vm != owner.vm) {
            return false;
        }
        let Some(set) = self.rt_pair_set(p, r, q.vm) else {
            return false;
        };
        self.slot_cu_set(slot) == set
    }
}
