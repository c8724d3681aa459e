//! A CU reservation in place does not shrink below what a VM still
//! holding it needed (issue 18, docs/scheduling.md, "A reservation keeps
//! its size while its holders hold it").
//!
//! A reservation is sized afresh at every decision of its owner
//! (`Scheduler::spatial_plan`): the width sizing, the latency sizing (whose
//! switch budget is the partition's measured save, a moving average) and,
//! where two RT tenants at different levels pass one reservation between
//! them, the size of whichever holds it now. Shrinking costs nothing, but
//! growing it again saves every lower queue running beside it (their
//! workgroups sit on the CUs it takes), `n x t_sw` of CWSR. So a size that
//! goes down and up again as two owners of different sizes take turns
//! saves the lower work once per period: fuzz seed 97117 (a 6.9 kHz RT at
//! priority 13 sized 1 CU per XCC and a 1.9 kHz one at priority 11 sized
//! 2: the higher one's own decision shrank the reservation it took over),
//! CWSR 46.7% of the run.
//!
//! Each VM that holds the partition's reservation is recorded with the
//! size it was last given as its owner, and the reservation is never
//! smaller than the size of any other recorded VM that still holds it, in
//! place or across its gaps (`Scheduler::spatial_held`: the same price,
//! `lambda x g` against `n x t_sw`, that decides whether keeping its CUs
//! through a gap is worth a lapse). The owner's own size is its latest: a
//! lone owner's reservation follows its need as before (keeping a lone
//! owner's largest size instead cost lock-step lower kernels a round where
//! the size moved between 1 and 2 CUs per XCC: fuzz seeds 50087, 50221,
//! 50246 and 97108 fell under their best-effort bound). A VM leaves the
//! record when it no longer holds (its gap outlived the hold, its level
//! changed), and the record is cleared when the reservation ends, becomes
//! a co-residence or a drained one (a drained one grows without a save).
//! A wide reservation keeps its own size (`wide.rs`) but is recorded, so
//! a narrower higher VM that takes it over keeps its size while the wide
//! one holds (fuzz seed 97041: a 25-workgroup RT at priority 15 shrank a
//! 428-workgroup RT's wide reservation at every job, CWSR 14.1%; branch
//! `rttwo`, `res_pass.rs`). So the other VM's CUs
//! are kept exactly as long as the reservation itself would be kept for
//! it, and the lower work is saved at most once per lapse instead of once
//! per switch between the two.

use super::*;
use crate::spatial::Reservation;

impl Scheduler {
    /// Reservation `c`, newly sized for its owner in partition `p`, at
    /// least as large as every VM still holding the reservation needed (see
    /// the module doc); records the owner's size. Co-residences, drained
    /// and wide reservations are returned as they are (a wide one is
    /// recorded).
    pub(super) fn res_keep(&mut self, p: usize, c: Reservation) -> Reservation {
        if c.k == 0 || c.drain {
            return c;
        }
        let Some(mut keep) = self.spatial.keep.get_mut(p).map(std::mem::take) else {
            return c;
        };
        // The owner's own size is its latest (a lone owner's reservation
        // follows its need).
        let own = c.k;
        // Whoever no longer holds leaves the record (the owner holds now).
        keep.retain(|r| r.vm != c.vm && self.spatial_held(p, *r));
        let k = keep.iter().map(|r| r.k).fold(own, u32::max);
        keep.push(Reservation { k: own, ..c });
        if let Some(slot) = self.spatial.keep.get_mut(p) {
            *slot = keep;
        }
        // A wide reservation is sized by its own rule (`wide.rs`); it is
        // recorded so that a narrower VM taking it over keeps its size
        // while it holds (`res_pass.rs`).
        if c.wide {
            return c;
        }
        Reservation { k, ..c }
    }

    /// Partition `p`'s reservation becomes `r`: the record ends with a
    /// reservation that is none, a co-residence or drained.
    pub(super) fn res_keep_end(&mut self, p: usize, r: Option<Reservation>) {
        if r.is_some_and(|r| r.k > 0 && !r.drain) {
            return;
        }
        if let Some(keep) = self.spatial.keep.get_mut(p) {
            keep.clear();
        }
    }
}
