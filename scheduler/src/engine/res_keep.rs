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
//! A wide reservation is sized by its own rule (`wide.rs`) and recorded; a
//! wide owner keeps the larger size of a holder below it (a wide owner of 1
//! CU per XCC shrank a lower wide RT's 8 at each of its jobs: the CUs went
//! to an aging batch beside it and the lower RT's next job took them back
//! with a save of the batch, fuzz seed 97092), not of one above it. So
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
    /// the module doc); records the owner's size. Co-residences and
    /// drained reservations are returned as they are; a wide one (its
    /// owner's size by `wide.rs`) is recorded and kept at least as large
    /// as the holders below its owner.
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
        // A wide owner keeps the size of a holder below it only (see
        // below); any other owner that of every other holder.
        let k = keep
            .iter()
            .filter(|r| !c.wide || r.level < c.level)
            .map(|r| r.k)
            .fold(own, u32::max);
        keep.push(Reservation { k: own, ..c });
        if let Some(slot) = self.spatial.keep.get_mut(p) {
            *slot = keep;
        }
        // A wide reservation is sized by its own rule (`wide.rs`); it is
        // recorded so that a narrower VM taking it over keeps its size
        // while it holds (`res_pass.rs`), and a wide owner above another
        // holder keeps that one's larger size too: its job interrupts the
        // lower RT, whose next job follows within its hold, and shrinking
        // would hand the lower work (an aging batch beside it) CUs that
        // job takes back with a save, once per period of the lower RT
        // (fuzz seed 97092, "A wide owner keeps a lower RT's reservation"
        // in docs/scheduling.md). A wide owner below a larger holder keeps
        // its own size: the lower work gets the CUs until the higher VM's
        // next job (one save per period of the higher one, its own
        // reservation's price; keeping the higher one's 15 CUs per XCC
        // through a 2.9 kHz lower RT's turns cost seed 97040's best effort
        // 0.440 of alone against its bound 0.470).
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One partition of 4 slots, 38 CUs per XCC and 8 XCCs (MI300X), a
    /// higher RT (VM 1, priority 13) and a lower one (VM 2, priority 9),
    /// both with a job rung (busy: each holds a reservation it was given).
    fn two_rts() -> Scheduler {
        let slots = (2..6)
            .map(|queue| SlotDesc {
                partition: 0,
                pipe: 0,
                queue,
            })
            .collect();
        let cfg = SchedConfig {
            policy: Policy::Hqdmux,
            ..Default::default()
        };
        let mut s = Scheduler::new(cfg, slots).unwrap();
        s.set_cu_geometry(38, 8);
        for (vm, priority) in [(1, 13), (2, 9)] {
            s.add_vm(
                VmId(vm),
                VmParams {
                    priority,
                    weight: 1,
                    partition: None,
                },
            )
            .unwrap();
            s.add_queue(VmId(vm), QueueId(vm as u64), 0).unwrap();
            s.handle(Event::Doorbell {
                queue: QueueId(vm as u64),
                wptr: 1,
                now: 0,
            });
        }
        s
    }

    fn wide(vm: u32, level: u16, k: u32) -> Reservation {
        Reservation {
            vm: VmId(vm),
            level,
            k,
            drain: false,
            wide: true,
        }
    }

    /// A wide owner (fuzz seed 97092: a 2.3 kHz RT of 3 x 304 one-us
    /// workgroups sized 1 CU per XCC) that takes over a wider lower RT's
    /// wide reservation (6 kHz, 8 CUs per XCC) keeps it at 8 while the
    /// lower one holds: shrinking it handed the lower work (an aging batch
    /// beside it) 7 CUs per XCC that the lower RT's next job took back with
    /// a save (the batch's yield allowance spent on it, and the RT then
    /// waited for the rest of the batch: p99 2962 us against 282). Its own
    /// size is recorded, and it is back to it once the other VM is gone.
    #[test]
    fn a_wide_owner_does_not_shrink_a_wider_holders_reservation() {
        let mut s = two_rts();
        assert_eq!(s.res_keep(0, wide(2, 9, 8)).k, 8);
        assert_eq!(s.res_keep(0, wide(1, 13, 1)).k, 8);
        // The lower RT leaves: the higher one's own size is its latest.
        s.remove_vm(VmId(2)).unwrap();
        assert_eq!(s.res_keep(0, wide(1, 13, 1)).k, 1);
    }

    /// A wide owner below a larger holder keeps its own size: the lower
    /// work gets the CUs until the higher VM's next job (fuzz seed 97040).
    #[test]
    fn a_wide_owner_below_a_wider_holder_keeps_its_own_size() {
        let mut s = two_rts();
        assert_eq!(s.res_keep(0, wide(1, 13, 15)).k, 15);
        assert_eq!(s.res_keep(0, wide(2, 9, 2)).k, 2);
    }
}
