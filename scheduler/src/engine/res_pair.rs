//! Two RTs at different levels share a partition's reservation, each on CUs
//! of its own (issue 18; docs/scheduling.md, "Two RTs on CUs of their
//! own").
//!
//! A partition has one CU reservation. When a lower RT held it and a
//! higher RT's job came, the higher one took it over (`res_pass.rs`, or
//! the kept path of `Scheduler::spatial_plan`): the lower RT's queue, on
//! the reserved CUs, was saved at every job of the higher one, and its
//! next dispatch mapped it back. Fuzz seed 50157: a 4.8 kHz RT at priority
//! 13 saved the RT below it (four kernels of 55 workgroups of 87 us per
//! 1.8 ms) 1090 times in 839 ms, 6.8% of the run in save and restore;
//! seed 97095: a 7.6 kHz RT saved a 0.27 kHz RT of 707 us workgroups at
//! each of its jobs, whose latency went from 1.4 ms isolated to 3.3 ms.
//!
//! Now, where both RTs' own sizes fit the cap together (`k_top + k_mid`
//! at most `spatial_max_permille` of an XCC's CUs, and a CU per XCC left
//! to the lower work), the reservation is their sum and each holds its own
//! part ([`ResPair`]): the RT that held it first keeps its highest CUs
//! (`CuSet::Top`), the other gets the CUs just below (`CuSet::Mid`), the
//! lower work the rest. A job of either runs on its own CUs and the other
//! RT's running queue keeps running on its own: nothing of it is saved.
//! Forming the pair takes the second RT's CUs from the lower work, a save
//! of it, as a reservation of its own would; the pair lasts while both
//! hold (`Scheduler::spatial_held`) and is then the remaining RT's
//! reservation. Where the two do not fit, the higher RT takes the lower
//! one's CUs as before (a save of it per job, within the CWSR budget's
//! pricing of the lapses and holds, `cwsr_budget.rs`).
//!
//! The bound: while a pair holds, the lower RT is saved by the higher RT
//! zero times per higher-RT job; the lower work is saved once per forming
//! (at most once per lapse of either member's hold) and once per growth
//! of the mid member (its own size grown by its width average).

use super::*;
use crate::spatial::{ResPair, Reservation};

impl Scheduler {
    /// The pair reservation of partition `p` for `owner` (with `own`, the
    /// CUs per XCC its job needs on CUs of its own, `None`: not sized),
    /// after `prev`: the pair in place kept (grown when `owner` is its mid
    /// member and needs more), or a new pair of `prev`'s holder, still
    /// holding, and `owner`, where both fit the cap. `None`: no pair; the
    /// reservation is chosen as before.
    pub(super) fn res_pair_plan(
        &self,
        p: usize,
        owner: SliceOwner,
        own: Option<u32>,
        prev: Option<Reservation>,
    ) -> Option<(Reservation, ResPair)> {
        if owner.level >= BOOST_LEVEL {
            return None;
        }
        let pr = prev.filter(|r| r.k > 0 && !r.drain)?;
        let n = self.spatial.cus_per_xcc;
        let cap = n.saturating_mul(self.cfg.spatial_max_permille.min(1000)) / 1000;
        let fits = |k: u32| k > 0 && k <= cap && k < n;
        let cur = self
            .spatial
            .pair
            .get(p)
            .copied()
            .flatten()
            .filter(|pair| pair.k() == pr.k);
        let pair = match cur {
            Some(pair) => {
                let me = pair.member(owner.vm, owner.level)?;
                let other = if me.vm == pair.top.vm {
                    pair.mid
                } else {
                    pair.top
                };
                if !self.res_pair_holds(p, other) {
                    return None;
                }
                match own.filter(|&k| k > me.k) {
                    None => pair,
                    // The mid member grows downwards into the lower
                    // work's CUs (a save of it). The top one moves the mid
                    // one's CUs: only while none of its queues runs (else
                    // no pair, as before).
                    Some(k) => {
                        let grown = if me.vm == pair.mid.vm {
                            ResPair {
                                mid: Reservation { k, ..pair.mid },
                                ..pair
                            }
                        } else if self.vm_runs_in(p, other.vm) {
                            return None;
                        } else {
                            ResPair {
                                top: Reservation { k, ..pair.top },
                                ..pair
                            }
                        };
                        if !fits(grown.k()) {
                            return None;
                        }
                        grown
                    }
                }
            }
            None => {
                let own = own.filter(|&k| k > 0)?;
                // Formed by the higher RT's job, on the CUs below the
                // lower RT's (a lower RT's job beside a higher one's held
                // CUs shares them, as before: `Scheduler::spatial_plan`).
                if pr.vm == owner.vm || pr.level >= owner.level || !self.res_pair_holds(p, pr) {
                    return None;
                }
                // Forming the pair saves the lower work (the owner's CUs
                // are taken from it): only for an owner whose CUs then
                // outlive its gaps. One that lapses after each job would
                // cost the lower work a save per job where taking the
                // lower RT's CUs costs that RT one (`res_pass.rs`).
                if !self.res_pair_outlives_gaps(owner) {
                    return None;
                }
                let pair = ResPair {
                    top: Reservation { drain: false, ..pr },
                    mid: Reservation {
                        vm: owner.vm,
                        level: owner.level,
                        k: own,
                        drain: false,
                        wide: false,
                    },
                };
                if !fits(pair.k()) {
                    return None;
                }
                pair
            }
        };
        let r = Reservation {
            vm: owner.vm,
            level: owner.level,
            k: pair.k(),
            drain: false,
            wide: false,
        };
        Some((r, pair))
    }

    /// Partition `p`'s reservation `r`, chosen by the rules before this
    /// one (`paired`: by [`Scheduler::res_pair_plan`]): where it is the
    /// pair's and one member no longer holds, the other member's own
    /// CUs. (Kept at the pair's size, the next pair would start from it:
    /// the top member's part grew by the other's at each forming, up to
    /// the cap, where the higher RT then saved the lower one again.)
    pub(super) fn res_pair_end(
        &self,
        p: usize,
        r: Option<Reservation>,
        paired: bool,
    ) -> Option<Reservation> {
        let Some(pair) = self.spatial.pair.get(p).copied().flatten() else {
            return r;
        };
        let Some(rr) = r.filter(|r| !paired && r.k > 0 && !r.drain && r.k == pair.k()) else {
            return r;
        };
        let (top, mid) = (
            self.res_pair_holds(p, pair.top),
            self.res_pair_holds(p, pair.mid),
        );
        let m = match (top, mid) {
            (true, true) | (false, false) => return Some(rr),
            (true, false) => pair.top,
            (false, true) => pair.mid,
        };
        Some(Reservation {
            vm: m.vm,
            level: m.level,
            k: m.k,
            drain: false,
            wide: m.wide,
        })
    }

    /// Partition `p`'s reservation became `r`; `formed`: the pair
    /// [`Scheduler::res_pair_plan`] chose for it. A pair in place lasts
    /// while the reservation is still the pair's (its size, held by a
    /// member) and both members hold.
    pub(super) fn res_pair_note(
        &mut self,
        p: usize,
        r: Option<Reservation>,
        formed: Option<ResPair>,
    ) {
        let cur = formed.or_else(|| self.spatial.pair.get(p).copied().flatten());
        let keep = cur.filter(|pair| {
            r.is_some_and(|r| r.k == pair.k() && !r.drain && pair.member(r.vm, r.level).is_some())
                && self.res_pair_holds(p, pair.top)
                && self.res_pair_holds(p, pair.mid)
        });
        if let Some(slot) = self.spatial.pair.get_mut(p) {
            *slot = keep;
        }
    }

    /// Does member `m` of a pair in `p` still hold its CUs: its
    /// reservation held across its gaps (`Scheduler::spatial_held`)? A
    /// busy RT whose gaps lapse its CUs does not: forming a pair saves the
    /// lower work, and re-forming it at each job of a lapsing RT saved the
    /// best effort of fuzz seed 50157 once per period (0.621 of alone
    /// against its bound 0.701).
    fn res_pair_holds(&self, p: usize, m: Reservation) -> bool {
        self.spatial_held(p, m)
    }

    /// Does `owner` come back within the hold a reservation keeps in any
    /// case (`spatial_hold_ns`): its period between doorbells with new
    /// work (`Occupancy::interval_ns`) known and at most that long? Its
    /// own CUs then outlive its gaps, and the save of the lower work that
    /// forms a pair is paid once, not at each of its jobs.
    fn res_pair_outlives_gaps(&self, owner: SliceOwner) -> bool {
        self.spatial
            .occ
            .get(&owner.vm)
            .is_some_and(|o| o.interval_ns > 0 && o.interval_ns <= self.cfg.spatial_hold_ns)
    }

    /// Does a queue of `vm` run in partition `p`?
    fn vm_runs_in(&self, p: usize, vm: VmId) -> bool {
        self.parts[p]
            .running
            .iter()
            .any(|e| self.queues.get(&e.2).is_some_and(|q| q.vm == vm))
    }

    /// The pair holding partition `p`'s reservation `r`, if any.
    pub(super) fn res_pair_of(&self, p: usize, r: Option<Reservation>) -> Option<ResPair> {
        let r = r?;
        self.spatial
            .pair
            .get(p)
            .copied()
            .flatten()
            .filter(|pair| pair.k() == r.k && pair.member(r.vm, r.level).is_some())
    }

    /// Is running queue `id` of the pair member below `owner` on its own
    /// CUs already? It keeps running beside the owner's job: its CUs are
    /// not the owner's (no save).
    pub(super) fn res_pair_keeps(
        &self,
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
        let p = self.slots[slot.0 as usize].partition as usize;
        let Some(pair) = self.res_pair_of(p, r.filter(|r| r.vm == owner.vm)) else {
            return false;
        };
        q.vm != owner.vm
            && lvl(q.key) < owner.level
            && pair.member(q.vm, self.cu_set_level(q)).is_some()
            && pair.set_of(q.vm) == Some(self.slot_cu_set(slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CuSet;

    fn res(vm: u32, level: u16, k: u32) -> Reservation {
        Reservation {
            vm: VmId(vm),
            level,
            k,
            drain: false,
            wide: false,
        }
    }

    #[test]
    fn a_pairs_members_and_the_lower_work_have_disjoint_cus() {
        for (t, m) in [(1, 1), (3, 5), (10, 27), (0, 4)] {
            let pair = ResPair {
                top: res(2, 9, t),
                mid: res(1, 13, m),
            };
            let n = 38;
            let top = pair.set_of(VmId(2)).unwrap();
            let mid = pair.set_of(VmId(1)).unwrap();
            let rest = CuSet::AllBut(pair.k());
            assert!(top.disjoint(mid, n) && top.disjoint(rest, n) && mid.disjoint(rest, n));
            let count = |s: CuSet| (0..n).filter(|&c| s.contains(c, n)).count() as u32;
            assert_eq!((count(top), count(mid), count(rest)), (t, m, n - t - m));
            assert_eq!(pair.set_of(VmId(3)), None);
        }
    }

    #[test]
    fn hostile_sizes_do_not_overflow() {
        let pair = ResPair {
            top: res(2, 9, u32::MAX),
            mid: res(1, 13, u32::MAX),
        };
        assert_eq!(pair.k(), u32::MAX);
        let mid = CuSet::Mid {
            above: u32::MAX,
            n: u32::MAX,
        };
        assert!(!(0..38).any(|c| mid.contains(c, 38)));
    }
}
