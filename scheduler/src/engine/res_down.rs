//! A lower RT runs on a higher RT's held reservation (issue 18, two RT
//! tenants at different levels; docs/scheduling.md, "A lower RT takes a
//! higher RT's held reservation").
//!
//! A partition has one CU reservation. When a higher RT takes a lower RT's
//! reservation over (`res_pass.rs`, or `spatial_plan`'s "passes to the
//! owner without shrinking") it holds it across its own gaps, at the lower
//! RT's size (`res_keep.rs`). The lower RT's next job then found a
//! reservation of a VM above it: with none of its own (a wide owner whose
//! own is not weighed worth keeping, `wide_keep.rs`, because only one held
//! by itself counts as in place) the plan kept the higher VM's, and the
//! owner, below that VM's level, got the other CUs (`Spatial::set_for_with`,
//! `CuSet::AllBut`): every lower queue on them was saved for its job,
//! while the reserved CUs, sized for that very job, stood idle. Fuzz seed
//! 97041 (a 1.2 kHz RT of 25 workgroups at priority 15 above a 0.67 kHz
//! RT of 428 x 3 at priority 11 whose 8 CUs per XCC it kept): 146 of the
//! run's 191 preemptions saved the best effort this way, CWSR 8.5%.
//!
//! Now such an owner takes the higher VM's reservation over as it is,
//! when its job meets its RT bound on those CUs (its latency size,
//! `Spatial::size_for_latency`, is not larger), the higher VM is in its
//! gap (no busy queue: its next job takes the reservation back as
//! `spatial_plan` passes a reservation between two holders, without a
//! save), and the owner is periodic and not backlogged (as
//! `res_pass_up`). Its CUs do not change (`res_in_place`): nothing is
//! saved but the higher VM's queues still on them, none in its gap. The
//! higher VM's reservation is recorded as passed (`res_pass_note`), so it
//! goes back to it (`res_pass_back`) when the owner no longer holds.

use super::*;
use crate::spatial::Reservation;

impl Scheduler {
    /// The reservation `owner` (with `queues` busy queues at its level and
    /// latency size `lat`) takes over in `p` when it has none of its own
    /// and a higher VM in its gap holds the reservation `prev` there (see
    /// the module doc): `prev` at its size, as the owner's. `None`: as
    /// before (the higher VM's reservation stays, the owner gets the other
    /// CUs).
    pub(super) fn res_pass_down(
        &self,
        p: usize,
        owner: SliceOwner,
        prev: Option<Reservation>,
        queues: u32,
        lat: Option<u32>,
    ) -> Option<Reservation> {
        let pr = prev.filter(|r| r.k > 0 && !r.drain)?;
        if pr.vm == owner.vm || pr.level <= owner.level || !self.spatial_held(p, pr) {
            return None;
        }
        // The higher VM is in its gap: none of its queues on the CUs.
        if self.vms.get(&pr.vm).is_none_or(|v| v.busy > 0) {
            return None;
        }
        // Its job meets its bound on the CUs in place (no growth: that
        // would save the lower work on the added CUs).
        if lat? > pr.k {
            return None;
        }
        self.periodic_takes(p, owner, queues, pr.k)
    }
}
