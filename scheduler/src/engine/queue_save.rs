//! A VM's save record is the longest of its queues' records (issue 18,
//! docs/scheduling.md "A VM's save record kept per queue").
//!
//! The save record of a VM (`Spatial::saves`, read by
//! `Scheduler::rt_save_wait`) is what a higher RT's latency size budgets
//! for its set-up save. It was one record per VM, the longest recent save
//! of any of its queues, decaying by 1/8 per shorter save. A reservation's
//! set-up saves every lower queue on its CUs side by side and the RT
//! waits for the **longest**; but the shorter saves of the VM's other
//! queues (in the same set-up, and in the growth saves that follow it)
//! each decayed the one record, so it fell below the save the RT waits
//! for at every set-up (fuzz seed 800120: be0's four queues saved in 8.1,
//! 8.1, 17.2 and 25.6 us at each set-up; the record flapped around 17-22
//! us, the RT's size budgeted 19.2 us, and its job took 25.6 + 490.8 us
//! against a bound of 512).
//!
//! So each queue keeps its own record (`Spatial::queue_saves`: its
//! longest recent save, decaying by 1/8 per shorter save **of the same
//! queue**), and the VM's record is the longest of them: a queue whose
//! saves are long keeps the VM's record up while its saves stay long,
//! whatever the VM's other queues do; a VM whose saves all shorten still
//! lowers its record, queue by queue. A removed queue's record is
//! forgotten.

use super::*;

impl Scheduler {
    /// Records a save of `save_ns` (its waits for waves without a save
    /// point taken out) of queue `q` ([`crate::spatial::Spatial::note_save`]).
    pub(super) fn note_queue_save(&mut self, q: QueueId, save_ns: Nanos) {
        if let Some(vm) = self.queues.get(&q).map(|qq| qq.vm) {
            self.spatial.note_save(vm, q, save_ns);
        }
    }
}
