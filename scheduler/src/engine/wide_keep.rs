//! A wide reservation where the whole partition's hold gives the gaps away
//! (issue 18, CWSR beside RT; docs/scheduling.md, "A wide reservation kept
//! where the gaps are given away"): `spatial_wide` (`wide.rs`) gives a
//! wide periodic owner a latency-sized CU reservation only where the
//! cost-aware hold would keep the whole partition through its gaps. Where
//! that hold releases (gaps longer than a switch's worth of idle time),
//! each of the owner's jobs saved every lower queue running in the gap:
//! `n x t_sw` of CWSR per period, outside `give.rs`'s budget (fuzz seeds
//! 97202 and 97160: a whole-partition RT of 4-8 us jobs every 650-870 us
//! above two lower queues, 13.6% and 17.1% of the run in CWSR).
//!
//! A reservation kept through the gaps costs the lower work the reserved
//! CUs' share of its throughput (`lambda`, `res_hold.rs`) for each gap `g`
//! instead: the owner gets one where keeping it is worth it by the same
//! price `res_hold.rs` keeps a reservation with, `lambda x g < n x t_sw`
//! (the gap hold `GapHist::hold_ns` at a switch worth `n x t_sw /
//! lambda`): a reservation that would lapse in every gap saves the lower
//! work per period anyway and only slows the owner's job.

use super::*;
use crate::spatial::Reservation;

impl Scheduler {
    /// Would the wide reservation owner `vm` at `level` of partition `p`
    /// gets on `queues` busy queues with switch `switch`
    /// (`Spatial::size_wide`, as `spatial_wide` sizes it) be kept through
    /// the owner's gaps by the lower work's cost
    /// (`Scheduler::reservation_switch_worth`)? `false` when nothing is
    /// known (no size, no lower work running, no save measured, no gap
    /// seen).
    pub(super) fn wide_kept_through_gaps(
        &self,
        p: usize,
        vm: VmId,
        level: u16,
        queues: u32,
        switch: Nanos,
    ) -> bool {
        // One in place was weighed when it was set up (its set-up saved
        // the lower queues: none is running while they restore); its
        // lapse is `res_hold.rs`'s to decide, in the owner's gaps.
        let held = self
            .spatial
            .res
            .get(p)
            .copied()
            .flatten()
            .is_some_and(|r| r.vm == vm && r.wide && r.k > 0);
        if held {
            return true;
        }
        let Some(period) = self.vms.get(&vm).map(|v| v.wake.period()) else {
            return false;
        };
        let Some(k) = self.spatial.size_wide(
            vm,
            queues,
            switch,
            period / 2,
            self.cfg.spatial_max_permille,
        ) else {
            return false;
        };
        let r = Reservation {
            vm,
            level,
            k,
            drain: false,
            wide: true,
        };
        let c = self.reservation_switch_worth(p, r);
        c > 0 && self.vms.get(&vm).is_some_and(|v| v.gaps.hold_ns(c) > 0)
    }
}
