//! The queues of a partition that want CUs, as the rebalance
//! ([`SimGpu::rebalance`]) and the guest search's equal-split check
//! ([`SimGpu::try_guest`]) count them, and the bound that lets the
//! rebalance skip the count.
//!
//! Counting visits every active queue's packet window (`dispatchable`):
//! it was the top cost of a dispatch pass (one pass per workgroup end).
//! A pass counts at most once while nothing changes: the guest pass
//! hands its count to the rebalance, and the rebalance does not count
//! when no batch it could cut belongs to a queue above
//! [`share_floor`].
//!
//! [`SimGpu::rebalance`]: super::SimGpu::rebalance
//! [`SimGpu::try_guest`]: super::SimGpu::try_guest

use super::*;

/// The queues of a partition that want CUs (active, a workgroup to
/// launch) and the fewest CUs one of them holds (`u32::MAX` if none
/// wants any).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WantCount {
    /// How many want CUs.
    pub(super) want: u32,
    /// The least `inflight` among them (`u32::MAX` when `want` is 0).
    pub(super) min_held: u32,
}

/// The least equal split the rebalance can compute with `active` active
/// queues in a partition of `cus` CUs: the split is `cus / want` with
/// `1 <= want <= active`, so it is at least `cus / active`. A queue
/// holding no more than this holds no more than the split, and the
/// rebalance cuts no batch of it.
pub(super) fn share_floor(cus: u32, active: u32) -> u32 {
    cus / active.max(1)
}

/// Whether a free CU given to `q` at `now` would run something
/// (`SimGpu::dispatchable(q).is_some()`, without finding what): a saved
/// workgroup, or a dispatch of its window with a workgroup not handed
/// out or a batch a CU may join.
#[inline(always)]
fn wants_cus(q: &Hqd, batches: &[Batch], now: Nanos) -> bool {
    if !q.resume.is_empty() {
        return true;
    }
    for a in q.active.iter() {
        if let Work::Dispatch(ref d) = a.work {
            if a.next_wg < d.total {
                return true;
            }
            if let Some(i) = a.batch {
                if batches[i as usize].joinable(now) {
                    return true;
                }
            }
        }
    }
    false
}

impl SimGpu {
    /// Counts, over the active queues of partition `pi` (`active_slots`,
    /// noted by `dispatch`), those that want CUs and the fewest CUs one of
    /// them holds.
    pub(super) fn want_count(&self, pi: usize) -> WantCount {
        let mut c = WantCount {
            want: 0,
            min_held: u32::MAX,
        };
        let now = self.now;
        let slots = &self.parts[pi].slots;
        for &pos in &self.active_slots {
            let Some(q) = self.slots[slots[pos as usize] as usize].as_ref() else {
                continue;
            };
            if q.state == HState::Active && wants_cus(q, &self.batches, now) {
                c.want += 1;
                c.min_held = c.min_held.min(q.inflight);
            }
        }
        c
    }

    /// [`Self::want_count`] as a dispatch pass makes it (a guest try's,
    /// the rebalance's; not a debug check's), counted in tests.
    pub(super) fn pass_want_count(&self, pi: usize) -> WantCount {
        #[cfg(test)]
        self.want_counts.set(self.want_counts.get() + 1);
        self.want_count(pi)
    }

    /// Whether a batch of partition `pi`'s cut list is one the rebalance
    /// could cut with an equal split of `floor` CUs: live, in the
    /// partition, started, with workgroups still to start, and of a queue
    /// (the batch's generation) holding more than `floor`. With `floor` =
    /// [`share_floor`] of the active queues, a `false` means the rebalance
    /// cuts nothing whatever its count.
    pub(super) fn may_cut_above(&self, pi: usize, floor: u32) -> bool {
        let now = self.now;
        self.parts[pi].cuttable.iter().any(|&bi| {
            let b = &self.batches[bi as usize];
            b.live
                && self.slot_part[b.slot as usize] as usize == pi
                && now >= b.start
                && self.slots[b.slot as usize]
                    .as_ref()
                    .is_some_and(|q| q.gen == b.qgen && q.inflight > floor)
                && !b.all_started(now)
        })
    }
}
