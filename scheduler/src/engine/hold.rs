//! Anticipation and the cost-aware hold (docs/scheduling.md): how long a
//! slice owner whose queues drained keeps the partition, and the billing of
//! the time it holds it idle against lower work.

use super::*;

impl Scheduler {
    /// Anticipation grace of a VM: twice its re-ring gap (at least
    /// [`MIN_GRACE_NS`]) when that fits in `anticipation_ns`, else 0.
    pub(super) fn grace(&self, vm: VmId) -> Nanos {
        if !self.ops().by_priority || self.cfg.anticipation_ns == 0 {
            return 0;
        }
        let g = self
            .vms
            .get(&vm)
            .map_or(0, |v| v.gap_ewma.saturating_mul(2).max(MIN_GRACE_NS));
        if g <= self.cfg.anticipation_ns {
            g
        } else {
            0
        }
    }

    /// The cost-aware hold of a slice owner `vm` of partition `p` whose
    /// queues just drained: from its re-ring gap distribution, the idle
    /// time worth holding rather than switching, a switch being worth
    /// [`HOLD_SWITCH_FACTOR`] x (save + restore) of idle time, with the
    /// moving average of the partition's CWSR saves as the save and the
    /// restore (0 before any save was seen: nothing to weigh).
    pub(super) fn cost_hold_at_drain(&self, p: usize, vm: VmId) -> Nanos {
        if !self.ops().by_priority || self.cfg.anticipation_ns == 0 {
            return 0;
        }
        let switch = self.parts[p].aging.save_ewma.saturating_mul(2);
        self.vms.get(&vm).map_or(0, |v| {
            v.gaps.hold_ns(switch.saturating_mul(HOLD_SWITCH_FACTOR))
        })
    }

    /// The hold of a slice owner `vm` at level `level` of partition `p`
    /// whose queues just drained: the cost-aware hold
    /// ([`Scheduler::cost_hold_at_drain`]), shortened where holding costs
    /// the lower work more than giving the gap away costs in CWSR
    /// ([`Scheduler::give_worth`], `engine/give.rs`). A gap so given is
    /// a trial cycle of giving for the owner, a gap held a base cycle
    /// (`WakePeriods::gap_decided`).
    pub(super) fn owner_hold_at_drain(&mut self, p: usize, vm: VmId, level: u16) -> Nanos {
        let whole = self.cost_hold_at_drain(p, vm);
        if whole == 0 {
            return 0;
        }
        let reserved = self
            .spatial
            .res
            .get(p)
            .copied()
            .flatten()
            .is_some_and(|r| r.vm == vm);
        if reserved {
            // Its reservation decides what the lower work gets.
            return whole;
        }
        // No hold against a lower RT (issue 18, docs/scheduling.md "No
        // cost-aware hold against a lower RT"): its jobs wait through
        // every gap held, a loss of its RT bound, not of throughput. The
        // give's weighing (below) prices the partition's typical save,
        // which a lower best effort's long saves set, and its CWSR budget
        // refuses what they spend: fuzz seed 1200050, a 9.9 kHz RT under
        // a 1.4 kHz one whose 465 us gaps a 512 us hold covered, p99 98.9
        // ms against 579 us.
        if self.gap_goes_to_rt(p, vm, level) {
            return 0;
        }
        let c = self.give_worth(p, vm, level);
        let now = self.now;
        let Some(v) = self.vms.get_mut(&vm) else {
            return whole;
        };
        let weighed = c.map_or(whole, |(c, _)| v.gaps.hold_ns(c));
        let worth = weighed < whole;
        // Within the partition's CWSR budget, which every save of the
        // partition spends as it is made (`engine/cwsr_budget.rs`): a gap
        // is given while the saves measured so far leave room for its
        // own, so given gaps take what the partition's other saves leave
        // of the CWSR bound, not a fixed share. A gap worth giving that
        // the budget cannot pay for is held, but is no held (base) cycle
        // of the owner's trial: a closed loop's trial cycles, interleaved
        // with such gaps, are still judged.
        if worth && !c.is_some_and(|(_, cost)| self.parts[p].cwsr_budget.affords(now, cost)) {
            return whole;
        }
        v.wake.gap_decided(worth);
        if worth {
            weighed
        } else {
            whole
        }
    }

    /// Does a periodic VM (an RT tenant) of the highest busy level below
    /// `level` in partition `p`, other than `vm`, wait for owner `vm`'s
    /// gap?
    pub(super) fn gap_goes_to_rt(&self, p: usize, vm: VmId, level: u16) -> bool {
        let Some((_, m)) = self
            .parts
            .get(p)
            .and_then(|part| part.busy.range(..level).next_back())
        else {
            return false;
        };
        m.keys()
            .any(|w| *w != vm && self.vms.get(w).is_some_and(|v| v.wake.period() > 0))
    }

    /// The cost-aware hold of owner `o` as it applies now: only against
    /// lower work (equals share by slices and keep the anticipation
    /// grace), and not while the owner's CU reservation or co-residence
    /// lets the lower work run beside it (no switch to save).
    pub(super) fn cost_hold(&self, p: usize, o: &SliceOwner) -> Nanos {
        if o.hold == 0 || o.level >= BOOST_LEVEL {
            return 0;
        }
        if self.parts[p].top().is_none_or(|t| t >= o.level) && !self.lower_being_saved(p, o.level) {
            return 0;
        }
        if self
            .spatial
            .res
            .get(p)
            .copied()
            .flatten()
            .is_some_and(|r| r.vm == o.vm)
        {
            return 0;
        }
        o.hold
    }

    /// Is a queue of a VM below `level` being saved with work in partition
    /// `p`? It is lower work the hold keeps out once its save completes (an
    /// owner whose job ends before that save would otherwise find no lower
    /// work at its drain and hand the partition back at once).
    /// Only the partition's queues being freed are looked at.
    pub(super) fn lower_being_saved(&self, p: usize, level: u16) -> bool {
        self.parts[p].freeing.iter().any(|id| {
            self.queues.get(id).is_some_and(|q| {
                q.wants
                    && self
                        .vms
                        .get(&q.vm)
                        .is_some_and(|v| u16::from(v.params.priority) < level)
            })
        })
    }

    /// The owner's hold ends (it re-rang, its hold ran out, or a higher
    /// level came): time it held the partition idle against lower work
    /// is billed to it, as GPU time and virtual time.
    pub(super) fn end_hold(&mut self, o: &mut SliceOwner) {
        let Some(d) = o.drained else { return };
        if !o.cost_held {
            return;
        }
        o.cost_held = false;
        let held = self.now.min(d.saturating_add(o.hold)).saturating_sub(d);
        let pol = self.cfg.policy;
        if let Some(v) = self.vms.get_mut(&o.vm) {
            v.stats.gpu_ns += held;
            v.stats.held_ns += held;
            v.vtime += held as u128 * SCALE / weight(v, pol);
        }
        self.sync_vt(o.vm);
    }
}
