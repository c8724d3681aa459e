//! Under its share by use rate (issue 18, the `light` family;
//! docs/scheduling.md, "Under its share by use rate"): a VM whose GPU use
//! over its recent busy-period cycles — GPU time billed per cycle over the
//! cycle's length, a cycle running from a wake after more than its grace
//! to the next such wake — is below its entitlement among the busy VMs of
//! its level (`weight / sum of their weights`) is under its share whatever
//! its virtual time says, and its request preempts an equal holder after
//! the bounded hold like a lagging waker's.
//!
//! Why a rate and not only virtual time: a closed loop that ran its first
//! job before any equal was busy, or whose virtual time re-entered at its
//! own (later) value, is not a minimum run behind the owner when its next
//! request comes although it uses a small part of its share; it then
//! waited for the owner's slice end. The rate is what it got, measured by
//! the scheduler (billed time, not what the guest claims), so it cannot be
//! farmed: a VM that idles briefly before long jobs has a use rate near or
//! above its share as soon as it is served at its share, and is then
//! eligible only by virtual time; one below its share is served sooner
//! only until its rate reaches the share.

use super::exclusive::waker_may_preempt;
use super::*;

/// A VM's use over its recent busy-period cycles: moving averages (1/4)
/// of the GPU time billed per cycle and of the time it had no demand in
/// the cycle (no queue Ready, Saved, Running or being preempted with
/// work), and the idle time of the cycle in progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct CycleUse {
    /// Billed GPU time per cycle, ns (moving average).
    used: Nanos,
    /// Time without demand per cycle, ns (moving average).
    idle: Nanos,
    /// At least one cycle has ended.
    known: bool,
    /// Time without demand in the cycle in progress, ns.
    idle_now: Nanos,
}

impl CycleUse {
    /// The VM had no demand for `gap` ns (it has demand again).
    pub(super) fn gap(&mut self, gap: Nanos) {
        self.idle_now = self.idle_now.saturating_add(gap);
    }

    /// A cycle ended (a wake after more than its grace), in which the VM
    /// was billed `used` ns. The first cycle sets both averages.
    pub(super) fn close(&mut self, used: Nanos) {
        let idle = std::mem::take(&mut self.idle_now);
        if !self.known {
            self.used = used;
            self.idle = idle;
            self.known = true;
        } else {
            self.used = ewma(self.used, used);
            self.idle = ewma(self.idle, idle);
        }
    }

    /// Is its use rate — use over use plus idle, the cycle in progress
    /// counted as one more cycle (`used_now` billed in it so far) — below
    /// `weight / total`, an entitlement among VMs of total weight `total`?
    /// Time spent waiting for the GPU counts neither way: the rate is the
    /// VM's demand, what it would use if served at once, so a VM that
    /// queues behind its equals is not made to look light or heavy by it.
    /// `false` before any cycle has ended (a VM in its first busy period
    /// has its own rule, `lag_ready_at`) and for a zero total.
    #[cfg(test)]
    pub(super) fn below(&self, used_now: Nanos, weight: u128, total: u128) -> bool {
        self.below_with(used_now, 0, weight, total)
    }

    /// [`Self::below`] with `extra` ns counted as use in every cycle: the
    /// switch (a save and restore of the holder) that serving each of its
    /// busy periods at once costs the partition.
    ///
    /// The cycle in progress counts only where it makes the VM heavier
    /// ([`Self::use_and_idle`]): at a wake it is a sample of no use and no
    /// idle yet, which would shrink the history by a quarter and leave
    /// `extra` whole, weighing the switch 4/3 against the VM's own cycles
    /// (docs/scheduling.md, "A light VM's switch test").
    pub(super) fn below_with(
        &self,
        used_now: Nanos,
        extra: Nanos,
        weight: u128,
        total: u128,
    ) -> bool {
        if !self.known || total == 0 {
            return false;
        }
        let (used, idle) = self.use_and_idle(used_now);
        let used = u128::from(used) + u128::from(extra);
        let idle = u128::from(idle);
        // used / (used + idle) < weight / total, in integers.
        used.saturating_mul(total) < weight.saturating_mul(used + idle)
    }

    /// The use and idle per cycle the rate is taken from: the moving
    /// averages with the cycle in progress (`used_now` billed in it so far,
    /// `idle_now` idle) as one more sample when that sample's own rate is
    /// above the history's (`used_now x idle > used x idle_now`), else the
    /// history alone. So a VM that keeps demanding is not shielded by its
    /// light past, and a cycle that has only begun (nothing used, nothing
    /// idle: a wake) neither makes it look busier than its history nor,
    /// with its idle, lighter than it.
    fn use_and_idle(&self, used_now: Nanos) -> (Nanos, Nanos) {
        let heavier = u128::from(used_now).saturating_mul(u128::from(self.idle))
            > u128::from(self.used).saturating_mul(u128::from(self.idle_now));
        if heavier {
            (ewma(self.used, used_now), ewma(self.idle, self.idle_now))
        } else {
            (self.used, self.idle)
        }
    }
}

/// Moving average, 1/4 to the new sample.
fn ewma(avg: Nanos, x: Nanos) -> Nanos {
    (avg / 4).saturating_mul(3).saturating_add(x / 4)
}

impl CycleUse {
    /// GPU time a VM may still use in its busy period in progress (`used_now`
    /// billed in it so far) and stay within an entitlement `weight / total`
    /// over its cycle: its average idle per cycle plus the idle of the
    /// cycle in progress, times `weight / (total - weight)`, less what it
    /// used. 0 before any cycle has ended and when it is alone (`total <=
    /// weight`).
    pub(super) fn allowance(&self, used_now: Nanos, weight: u128, total: u128) -> Nanos {
        let others = total.saturating_sub(weight);
        if !self.known || others == 0 {
            return 0;
        }
        let idle = u128::from(self.idle).saturating_add(u128::from(self.idle_now));
        let earned = idle.saturating_mul(weight);
        let spent = u128::from(used_now).saturating_mul(others);
        (earned.saturating_sub(spent) / others).min(u128::from(Nanos::MAX)) as Nanos
    }
}

impl Scheduler {
    /// The sum of the weights of the VMs busy at level `top` of partition
    /// `p` (their number under a policy that does not weigh VMs), from the
    /// sums the index keeps.
    fn busy_weight(&self, p: usize, top: u16) -> u128 {
        let busy = &self.parts[p].busy;
        let total = if self.cfg.policy.ops().weighted {
            busy.weight_sum(top)
        } else {
            busy.get(&top).map_or(0, |m| m.len() as u128)
        };
        debug_assert_eq!(
            total,
            busy.get(&top).map_or(0, |m| m
                .keys()
                .filter_map(|x| self.vms.get(x))
                .map(|x| weight(x, self.cfg.policy))
                .sum::<u128>()),
            "busy weight sum of level {top} out of step"
        );
        total
    }

    /// End of owner `o`'s exclusive slice at level `top` (docs/scheduling.md,
    /// "A long job under its share"): its quantum, or later while its use in
    /// its busy period stays within its entitlement over its cycle
    /// ([`CycleUse::allowance`]). An under-share VM whose request is longer
    /// than the quantum (or that rings a burst of jobs) is served at its
    /// full entitlement instead of being sliced with its equals; a VM that
    /// keeps demanding earns no allowance (no idle), so slices among
    /// always-busy equals are unchanged. While the owner runs, its use
    /// grows as time does, so the end stays put.
    pub(super) fn slice_end(&self, p: usize, o: SliceOwner, top: u16) -> Nanos {
        let q_end = o.since.saturating_add(self.vm_slice(o.vm, top));
        if top >= BOOST_LEVEL || !self.ops().by_priority {
            return q_end;
        }
        let pol = self.cfg.policy;
        let (Some(v), Some(cands)) = (self.vms.get(&o.vm), self.parts[p].busy.get(&top)) else {
            return q_end;
        };
        let used_now = use_since_wake(v, self.now);
        let w = weight(v, pol);
        // Every other busy VM weighs at least 1, and the allowance only
        // shrinks as the others' weight grows: none at that bound means
        // none (an always-busy VM, most owners, at no cost per busy VM).
        let others = cands.len().saturating_sub(1) as u128;
        if v.cycle_use.allowance(used_now, w, w + others) == 0 {
            return q_end;
        }
        let total = self.busy_weight(p, top);
        let left = v.cycle_use.allowance(used_now, w, total);
        if left == 0 {
            return q_end;
        }
        q_end.max(self.now.saturating_add(left))
    }

    /// Is `vm`, busy at level `top` of partition `p`, under its share by
    /// use rate: its use over its recent cycles below its weight over the
    /// sum of the weights of the VMs busy at that level (itself included)?
    pub(super) fn under_share_by_use(&self, p: usize, vm: VmId, top: u16) -> bool {
        self.under_share_with(p, vm, top, 0)
    }

    /// [`Self::under_share_by_use`] with `extra` ns counted as its use in
    /// every cycle ([`CycleUse::below_with`]).
    fn under_share_with(&self, p: usize, vm: VmId, top: u16, extra: Nanos) -> bool {
        let pol = self.cfg.policy;
        let Some(v) = self.vms.get(&vm) else {
            return false;
        };
        let Some(cands) = self.parts[p].busy.get(&top) else {
            return false;
        };
        let used_now = use_since_wake(v, self.now);
        let w = weight(v, pol);
        // Every other busy VM weighs at least 1: a rate not below that
        // bound of its entitlement is not below it (most VMs, at no cost
        // per busy VM; the sum below walks them).
        let others = cands.len().saturating_sub(1) as u128;
        if !v.cycle_use.below_with(used_now, extra, w, w + others) {
            return false;
        }
        let total = self.busy_weight(p, top);
        v.cycle_use.below_with(used_now, extra, w, total)
    }

    /// Is there a VM woken during owner `o`'s slice at level `top` that may
    /// preempt it ([`waker_may_preempt`]) and is under its share by use
    /// rate even with one switch of the partition — a save and restore of
    /// the holder, [`Self::switch_price`] — counted as its use in
    /// every cycle (docs/scheduling.md, "A light VM that pays for its
    /// switch")? Such a VM takes the partition without the hold: serving
    /// each of its busy periods at once costs the partition at most one
    /// switch per cycle, inside its own share, so its equals keep theirs
    /// whatever its cycle; a VM whose cycle is too short for that (a closed
    /// loop of 0.06 ms jobs every 0.7 ms) still waits for the hold, which
    /// bounds the churn.
    pub(super) fn switch_waker(&self, p: usize, o: SliceOwner, top: u16) -> bool {
        if top >= BOOST_LEVEL || o.level != top || !self.ops().by_priority {
            return false;
        }
        let (Some(ov), Some(cands)) = (self.vms.get(&o.vm), self.parts[p].busy.get(&top)) else {
            return false;
        };
        let switch = self.switch_price(p);
        self.parts[p].woken.iter().any(|w| {
            *w != o.vm
                && cands.contains_key(w)
                && self.vms.get(w).is_some_and(|v| waker_may_preempt(v, ov, o))
                && self.under_share_with(p, *w, top, switch)
        })
    }

    /// Does `vm` take the partition first at this choice: it woke after
    /// the previous owner's slice began (`since`; any time when there was
    /// none) and is under its share by use rate at `top`?
    pub(super) fn use_waker(&self, p: usize, vm: VmId, since: Option<Nanos>, top: u16) -> bool {
        if top >= BOOST_LEVEL || !self.ops().by_priority {
            return false;
        }
        let Some(v) = self.vms.get(&vm) else {
            return false;
        };
        since.is_none_or(|s| v.entered > s)
            && self.parts[p].woken.contains(&vm)
            && self.under_share_by_use(p, vm, top)
    }
}

/// GPU time `v` has used since it last woke (its busy period so far),
/// the running period billed up to `now` included.
fn use_since_wake(v: &Vm, now: Nanos) -> Nanos {
    let billed = if v.active > 0 { billable(v, now) } else { 0 };
    v.stats
        .gpu_ns
        .saturating_add(billed)
        .saturating_sub(v.gpu_at_wake)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycles(n: usize, used: Nanos, idle: Nanos) -> CycleUse {
        let mut c = CycleUse::default();
        for _ in 0..n {
            c.gap(idle);
            c.close(used);
        }
        c
    }

    /// The rate is use over use plus idle; nothing is known before a
    /// cycle has ended.
    #[test]
    fn rate_is_use_over_use_and_idle() {
        let mut c = CycleUse::default();
        assert!(!c.below(0, 1, 2), "no cycle yet: no rate");
        c.gap(9_000_000);
        assert!(!c.below(0, 1, 2), "still no cycle ended");
        c.close(1_000_000);
        // 1 ms of use per 10 ms: 0.1, below 1/4 and above 1/16.
        assert!(c.below(0, 1, 4));
        assert!(!c.below(0, 1, 16));
        // Exactly at the entitlement is not below it.
        let c = cycles(4, 250_000, 750_000);
        assert!(!c.below(0, 1, 4));
        assert!(c.below(0, 2, 7));
        assert!(!c.below(0, 1, 0));
    }

    /// A light VM's past cannot shield a heavy present: the cycle in
    /// progress counts, so a VM that was light and then keeps demanding
    /// (a closed loop re-ringing within its grace closes no cycle) stops
    /// being below its share once it has used about a share's worth.
    #[test]
    fn the_cycle_in_progress_counts() {
        let c = cycles(8, 1_000_000, 9_000_000);
        assert!(c.below(0, 1, 4));
        assert!(c.below(5_000_000, 1, 4));
        assert!(!c.below(30_000_000, 1, 4));
        // Becoming heavy closes cycles of little idle: the rate follows.
        let mut c = c;
        for _ in 0..3 {
            c.gap(100_000);
            c.close(20_000_000);
        }
        assert!(!c.below(0, 1, 4), "{c:?}");
    }

    /// The allowance is the VM's entitlement over its cycle less its use:
    /// average idle per cycle plus the cycle's own idle, times weight over
    /// the others' weight; none before a cycle ended or when alone.
    #[test]
    fn allowance_is_the_cycle_entitlement_left() {
        let mut c = CycleUse::default();
        c.gap(30_000_000);
        assert_eq!(c.allowance(0, 1, 2), 0, "no cycle ended yet");
        c.close(3_000_000);
        // 30 ms idle per cycle, one equal of weight 1: up to 30 ms of use
        // in the busy period keeps it at half of its cycle.
        assert_eq!(c.allowance(0, 1, 2), 30_000_000);
        assert_eq!(c.allowance(10_000_000, 1, 2), 20_000_000);
        assert_eq!(c.allowance(30_000_000, 1, 2), 0);
        assert_eq!(c.allowance(40_000_000, 1, 2), 0, "spent: none left");
        // Three equals: a quarter of the cycle, a third of the idle.
        assert_eq!(c.allowance(0, 1, 4), 10_000_000);
        // Weight 3 against 1: three quarters, three times the idle.
        assert_eq!(c.allowance(0, 3, 4), 90_000_000);
        // Alone: no allowance (the quantum does not end its slice anyway).
        assert_eq!(c.allowance(0, 1, 1), 0);
        // Brief gaps in the busy period count as idle of the cycle.
        c.gap(3_000_000);
        assert_eq!(c.allowance(30_000_000, 1, 2), 3_000_000);
        // Huge values saturate.
        let mut h = CycleUse::default();
        h.gap(Nanos::MAX);
        h.close(0);
        h.gap(Nanos::MAX);
        assert_eq!(
            h.allowance(0, u128::from(u32::MAX), u128::from(u32::MAX) + 1),
            Nanos::MAX
        );
    }

    /// At a wake (nothing used, nothing idle in the cycle in progress)
    /// the switch is weighed once against the history: 100 us of use and
    /// 1.45 ms of idle per cycle with 100 us of switch is below 1/8
    /// (idle above 7 x 200 us), though with the empty cycle as a sample
    /// (3/4 of the history, the switch whole) it is not. A cycle in
    /// progress lighter than the history (idle, no use) does not make
    /// the VM lighter; one heavier does make it heavier.
    #[test]
    fn a_wake_is_not_a_sample() {
        let c = cycles(8, 100_000, 1_450_000);
        assert!(c.below_with(0, 100_000, 1, 8), "{c:?}");
        // The idle needed is 7 x 200 us, not less.
        let c2 = cycles(8, 100_000, 1_399_000);
        assert!(!c2.below_with(0, 100_000, 1, 8), "{c2:?}");
        // An idle cycle in progress: the history's rate, not lower.
        let mut idle = cycles(8, 100_000, 1_399_000);
        idle.gap(5_000_000);
        assert!(!idle.below_with(0, 100_000, 1, 8), "{idle:?}");
        // A busy one: 1 ms used since the wake, heavier than the history.
        assert!(!c.below_with(1_000_000, 100_000, 1, 8), "{c:?}");
        assert!(!c.below_with(2_000_000, 0, 1, 4), "{c:?}");
        assert!(c.below_with(200_000, 0, 1, 4), "{c:?}");
    }

    /// Huge values saturate instead of overflowing.
    #[test]
    fn large_values() {
        let c = cycles(1, Nanos::MAX / 4, Nanos::MAX / 4 * 3);
        assert!(c.below(0, 1, 2));
        assert!(!c.below(0, 1, 8));
        let c = cycles(3, Nanos::MAX, Nanos::MAX);
        assert!(!c.below(Nanos::MAX, 1, 4));
    }
}
