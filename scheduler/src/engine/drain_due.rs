//! A drain that overruns (docs/scheduling.md, "A drain that overruns").
//!
//! A drained reservation leaves the lower workgroups on the reserved CUs
//! to end instead of saving them: the owner waits for them, within one
//! save and restore. How long they take comes from the backend's estimate
//! of each dispatch, read at the doorbell from guest memory: a guest that
//! rewrites its kernel descriptor after the doorbell, or rings packets
//! the doorbell scan never read (the first doorbell of a queue, more than
//! the scan window), can make its workgroups outlast the estimate, and
//! the owner would wait for them as long as they run. So every drained
//! reservation has a deadline, twice the wait it was set up with (a
//! workgroup runs at most twice its modelled cost: jitter, or a half-CU
//! one sharing its CU). At the deadline the caller asks the GPU whether
//! a lower queue still has workgroups outside its CU set
//! ([`Scheduler::drains_due`]); each that does is reported
//! ([`Scheduler::drain_overdue`]): its VM is never drained again before
//! its demand ends, and the reservation is set up again with a save of
//! the lower work on the reserved CUs. The owner waits at most the
//! deadline plus one save; the guest gains nothing.

use super::Scheduler;
use crate::spatial::Reservation;
use crate::{CuSet, Nanos, QueueId, SlotId};

impl Scheduler {
    /// Records partition `p`'s drain deadline after a plan: `now + 2 x wait`
    /// when a drained reservation was set up (`establish`) with `wait`;
    /// kept while that drained reservation stays; cleared otherwise.
    pub(super) fn drain_due_note(
        &mut self,
        p: usize,
        r: Option<Reservation>,
        establish: bool,
        wait: Option<Nanos>,
    ) {
        let now = self.now;
        let Some(due) = self.spatial.drain_due.get_mut(p) else {
            return;
        };
        match r {
            Some(r) if r.drain && r.k > 0 => {
                if establish {
                    *due = wait.map(|w| now.saturating_add(w.saturating_mul(2)).saturating_add(1));
                }
            }
            _ => *due = None,
        }
    }

    /// Takes partition `p`'s overdue mark: true when a drain overran and
    /// `r` reserves CUs (it must be set up again, saving the lower work on
    /// them).
    pub(super) fn drain_overdue_take(&mut self, p: usize, r: Option<Reservation>) -> bool {
        let overdue = self.spatial.overdue.get_mut(p).is_some_and(std::mem::take);
        overdue && r.is_some_and(|r| r.k > 0)
    }

    /// The drain deadline of partition `p` still to come (the timer table).
    pub(super) fn drain_deadline(&self, p: usize) -> Option<Nanos> {
        self.spatial
            .drain_due
            .get(p)
            .copied()
            .flatten()
            .filter(|&t| t > self.now)
    }

    /// The drains due at `now`: into `out`, every mapped queue of a
    /// partition whose drain deadline passed that runs on a restricted CU
    /// set (the lower work the drain left to end), with its slot. The
    /// caller asks the GPU whether each still has workgroups outside its
    /// CU set and reports those with [`Scheduler::drain_overdue`], then
    /// sends [`crate::Event::Tick`]. Each deadline is handed out once.
    pub fn drains_due(&mut self, now: Nanos, out: &mut Vec<(QueueId, SlotId)>) {
        out.clear();
        for p in 0..self.spatial.drain_due.len() {
            if self.spatial.drain_due[p].is_none_or(|t| t > now) {
                continue;
            }
            self.spatial.drain_due[p] = None;
            let Some(r) = self.spatial.res.get(p).copied().flatten() else {
                continue;
            };
            if !r.drain {
                continue;
            }
            for (i, owner) in self.slot_owner.iter().enumerate() {
                let Some(id) = *owner else { continue };
                let slot = SlotId(i as u32);
                if self.slots[i].partition as usize != p
                    || self.queues.get(&id).is_none_or(|q| q.vm == r.vm)
                {
                    continue;
                }
                if !matches!(self.slot_cu_set(slot), CuSet::All) {
                    out.push((id, slot));
                }
            }
        }
    }

    /// `queue` still had workgroups outside its CU set at its partition's
    /// drain deadline ([`Scheduler::drains_due`]): its VM is not drained
    /// again before its demand ends, and the partition's next decision
    /// sets the reservation up again with a save. Unknown or unmapped
    /// queues are ignored.
    pub fn drain_overdue(&mut self, queue: QueueId) {
        let Some(q) = self.queues.get(&queue) else {
            return;
        };
        let Some(slot) = q.slot else { return };
        let (vm, p) = (q.vm, self.slots[slot.0 as usize].partition as usize);
        self.spatial.never_drain(vm);
        if let Some(o) = self.spatial.overdue.get_mut(p) {
            *o = true;
            self.spatial.stats.drains_overdue += 1;
        }
    }
}
