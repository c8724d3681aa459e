//! An owner's reserved CUs kept as its idle queues' CU set through its gap
//! (issue 18, branch `fresh7`).
//!
//! A mapped queue's doorbell reaches the GPU before the scheduler: the
//! dispatcher places the job's first kernel on the queue's CU set at that
//! instant, and only then does the scheduler's decision narrow the set to
//! the reservation it sets up and restore the lower work it saved onto
//! the other CUs. With the whole partition as its set in the gap (no
//! reservation in place), an RT's first kernel went to the CUs the lower
//! work was on and was then shared with the lower work restored beside it:
//! fuzz seed 700010, a first kernel of 11 workgroups of 170 us ran 302 us
//! and the job 811 us against the bound's 802 (the job on the reservation
//! alone: 681 us). So the last owner of a partition's reservation keeps
//! its reserved CUs (`CuSet::Top(k)`) as the set of its idle mapped
//! queues while no reservation is in place: its next job's first kernel
//! lands on the CUs its reservation takes (as a guest beside lower
//! workgroups being saved there, alone once they are), and nothing of its
//! job sits where the lower work is restored. The home ends when the VM
//! runs with no reservation of its own (a co-residence, or a save of the
//! whole partition): its set is then the whole partition, as before.

use super::*;
use crate::spatial::Reservation;

impl Scheduler {
    /// Keeps partition `p`'s home up to date with its reservation `r`
    /// (called by the CU-set sync): a reservation with CUs of its own is
    /// its owner's home; the home ends when its VM runs in `p` without
    /// one (a co-residence with no CUs of its own, or no reservation).
    pub(super) fn gap_home_note(&mut self, p: usize, r: Option<Reservation>) {
        let Some(slot) = self.spatial.home.get_mut(p) else {
            return;
        };
        match r {
            Some(r) if r.k > 0 => *slot = Some(r),
            Some(r) => {
                if slot.is_some_and(|h| h.vm == r.vm) {
                    *slot = None;
                }
            }
            None => {
                let Some(h) = *slot else { return };
                let runs = self.parts[p]
                    .running
                    .iter()
                    .any(|e| self.queues.get(&e.2).is_some_and(|q| q.vm == h.vm));
                if runs {
                    self.spatial.home[p] = None;
                }
            }
        }
    }

    /// The CU set of an idle mapped queue of `vm` in `p` while `p` has no
    /// reservation in place: its last reservation's CUs if `vm` owned it
    /// and still has that home, else `None` (the usual set).
    pub(super) fn gap_home_set(&self, p: usize, r: Option<Reservation>, vm: VmId) -> Option<CuSet> {
        if r.is_some() {
            return None;
        }
        let h = self.spatial.home.get(p).copied().flatten()?;
        (h.vm == vm).then_some(CuSet::Top(h.k))
    }
}
