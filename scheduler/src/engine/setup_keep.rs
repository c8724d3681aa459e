//! A reservation keeps its CUs while the save that sets it up is in flight
//! (issue 18, docs/scheduling.md "A reservation kept through its set-up
//! save").
//!
//! An owner's reservation that is new saves the lower work on its CUs: the
//! lower queues are `Preempting` until their dequeues end, and a queue
//! being dequeued is not busy (`Part::busy` counts Ready, Saved and Running
//! queues). A decision taken in that window (another queue's drain, a
//! doorbell) found no busy lower work, planned no reservation, and mapped
//! the owner on every CU; its kernel then started on CUs the save freed
//! anywhere in the partition. When the save ended, the lower work was busy
//! again (Saved) and the next decision set the same reservation up a
//! second time: the owner's queue was narrowed to its CUs, but a started
//! round keeps the CUs it holds outside the new mask until it ends (a
//! host-mask change cuts a batch at its round's end), and the lower work
//! restored on the other CUs put its workgroups beside the owner's there.
//! Each such guest delays the owner's round by up to one lower workgroup
//! (`d = min(c, h)`, docs/gpu-model.md "Throughput: processor sharing"):
//! fuzz seed 800135, rt0's 2.2 ms round stretched by up to 850 us beside
//! be0's 840 us workgroups, RT p99 2793 us against 2678.
//!
//! So while the lower work the owner's own reservation saves is in flight
//! (a lower queue being dequeued with work: it comes back Saved), the plan
//! keeps that reservation as it is: no second set-up, and the owner's
//! kernels start on its reserved CUs, which the save frees.

use super::*;
use crate::spatial::Reservation;

impl Scheduler {
    /// The owner's own reservation `prev` of partition `p`, kept when the
    /// plan finds no busy lower work (`lower` false) only because the lower
    /// work is being saved: a lower queue with work is being dequeued
    /// ([`Scheduler::lower_being_saved`]) and comes back Saved, beside the
    /// same reservation. `None` when the rule does not apply.
    pub(super) fn setup_keeps(
        &self,
        p: usize,
        owner: SliceOwner,
        prev: Option<Reservation>,
        lower: bool,
    ) -> Option<Reservation> {
        if lower {
            return None;
        }
        let r = prev.filter(|r| r.vm == owner.vm && r.level == owner.level && r.k > 0)?;
        self.lower_being_saved(p, owner.level).then_some(r)
    }
}
