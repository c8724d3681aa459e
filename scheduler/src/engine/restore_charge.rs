//! A save's restore is charged to the CWSR budget as long as the longer of
//! the save and the queue's previous save (issue 18, docs/scheduling.md
//! "A restore charged with the waves still waiting from the last one").
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
//! 26.2 ms against saves of 21.2 ms, so the budget's 9% (each save counted
//! twice) let 10.1% of the run go to CWSR.
//!
//! The waves a restore writes back are those of its save and those of the
//! queue's previous restore that have not resumed since, at most what the
//! previous save wrote. So the restore is charged as the longer of the
//! save and the queue's previous save with work (`Queue::restore_ns`, the
//! modelled restore of its last save, before this one replaces it). The
//! queue's longest recent save (`Spatial::queue_save`, decaying by 1/8 per
//! shorter save) was measured first: it charged queues whose waves had run
//! between saves of varying length, and fuzz seed 1100068's best effort
//! fell from 0.636 to 0.588 of alone against a bound of 0.594.

use super::*;

impl Scheduler {
    /// The CWSR time charged for the restore of queue `q` after a save of
    /// `save_ns`: the longer of the save and the queue's previous save with
    /// work (0 if its last dequeue was not a save with work).
    pub(crate) fn restore_charge(&self, q: QueueId, save_ns: Nanos) -> Nanos {
        self.queues
            .get(&q)
            .map_or(save_ns, |qq| qq.restore_ns.max(save_ns))
    }
}

#[cfg(test)]
impl Scheduler {
    /// What partition `p`'s CWSR budget holds at `now` (tests).
    pub(crate) fn cwsr_budget_left(&self, p: usize, now: Nanos) -> i64 {
        self.parts[p].cwsr_budget.left_at(now)
    }
}
