//! A save's restore is charged to the CWSR budget as the queue's saved
//! state, not as the save itself (issue 18, docs/scheduling.md "A
//! restore charged as the queue's saved state").
//!
//! The partition's CWSR budget (`engine/cwsr_budget.rs`) counts every save
//! and, for a queue with work, its restore, which the scheduler does not
//! measure; it counted the restore as long as the save. A save writes the
//! waves on the CUs the queue holds; the restore writes back **all** the
//! queue's saved waves not yet resumed. A queue restored beside a sibling
//! that holds the CUs (whole-CU workgroups of one lower VM's two queues)
//! keeps its restored waves waiting, and its next save, holding no CU,
//! takes the trap alone (5 us) while its restore writes the waiting waves
//! back again (115 us): fuzz seed 1000086, 30 such saves of 380, restores
//! 26.2 ms against saves of 21.2 ms, so the budget's 9% (saves counted
//! twice) let 10.1% of the run go to CWSR.
//!
//! So the restore is charged as the longest of the save and the queue's
//! save record (`Spatial::queue_save`: its longest recent save, decaying
//! by 1/8 per shorter save of the same queue, before this save is
//! recorded): the saved state a queue's restore can write back is at most
//! what its recent saves wrote, and a queue whose saves shorten (its
//! waves ran) lowers its charge save by save. A queue with no record is
//! charged its save, as before.

use super::*;

impl Scheduler {
    /// The CWSR time charged for the restore of queue `q` of `vm` after a
    /// save of `save_ns`: the longer of the save and the queue's save
    /// record before this save.
    pub(crate) fn restore_charge(&self, vm: VmId, q: QueueId, save_ns: Nanos) -> Nanos {
        self.spatial
            .queue_save(vm, q)
            .map_or(save_ns, |r| r.max(save_ns))
    }
}

#[cfg(test)]
impl Scheduler {
    /// What partition `p`'s CWSR budget holds at `now` (tests).
    pub(crate) fn cwsr_budget_left(&self, p: usize, now: Nanos) -> i64 {
        self.parts[p].cwsr_budget.left_at(now)
    }
}
