//! A periodic owner's gap priced by the VMs that would run in it (issue
//! 18, fuzz seed 400058; docs/scheduling.md, "A gap priced by the VMs
//! that run in it").
//!
//! Giving an owner's gap away (`give.rs`) is refused when the save the
//! owner's next job waits for is longer than its RT bound allows (half
//! the allowance, `spatial_wait_allowance`: a save and its restore). That
//! save was the partition's moving average of every save, waits for
//! waves without a save point included (`save_ewma`), which only moves
//! when a save is made. Fuzz seed 400058: the first save of be0 (a
//! `no_save_point` VM of 1.9 ms waves) waited 3.5 ms at the start; the
//! average rose to 683 us, every gap of the RT (priority 14, 1.3 ms gaps)
//! was then held, nothing below it was ever saved again, and the average
//! stayed: be1, a flood whose saves take 19-34 us and which would have
//! run in every gap, got 7 jobs in 300 ms (best effort 0.021 of alone).
//!
//! The switch a given gap costs is the save of the lower queues that run
//! in it: those of the highest busy lower level (`give_worth`). So the
//! price is the longest recorded save of those VMs — a flagged VM's
//! longest recent whole save (`Spatial::waited`, its waits included),
//! else its longest recent clean save (`Spatial::saves`), else the
//! partition's typical clean save for a VM never saved — and never more
//! than the partition's average. A flagged VM below the gap's level
//! prices nothing: it does not run there. A flagged VM of the gap's
//! level keeps its own long whole save as the price, so its gaps stay
//! held (the flagged VM stays off); that record only shortens when it is
//! saved again (by 1/8 per shorter save), and a long wait then is
//! recorded again and billed to it (`save_wait`), so flagging buys it no
//! gap.

use super::*;

impl Scheduler {
    /// The save the next job of owner `vm` (at `level` of partition `p`)
    /// waits for when its gap is given to the lower work: the longest
    /// recorded save of the VMs of the highest busy level below `level`
    /// (their whole saves, waits for waves without a save point included),
    /// at most the partition's moving average of every save (`save_ewma`);
    /// that average when nothing below is busy.
    pub(super) fn gap_save(&self, p: usize, vm: VmId, level: u16) -> Nanos {
        let Some(part) = self.parts.get(p) else {
            return 0;
        };
        let ewma = part.aging.save_ewma;
        let Some((_, m)) = part.busy.range(..level).next_back() else {
            return ewma;
        };
        let typ = self.clean_save(p);
        let own = m
            .keys()
            .filter(|&&w| w != vm)
            .map(|&w| {
                let clean = self.spatial.saves.get(&w).copied().unwrap_or(typ);
                self.spatial.waited.get(w).unwrap_or(0).max(clean)
            })
            .max();
        match own {
            Some(s) if s > 0 => s.min(ewma),
            _ => ewma,
        }
    }
}
