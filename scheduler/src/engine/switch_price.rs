//! The price of a light waker's switch (issue 18, `light` family;
//! docs/scheduling.md, "A light VM's switch test"): what serving a waker at
//! once costs the partition per cycle in [`Scheduler::switch_waker`] — a
//! save and a restore of the holder's work, `2 x s_typ(p)` with `s_typ(p)`
//! the partition's measured typical clean save (`save_typ`, the moving
//! average the cost-aware gives and reservation lapses price their switch
//! `t_sw` with), and the modelled whole-partition save and restore
//! (`spatial_coreside_ns`) before any save is measured.
//!
//! Why measured and not the model's floor: the model prices every switch
//! as the save of a whole partition of VGPR-heavy waves (240 us), while
//! the equals a light VM preempts may save in a fraction of that (fuzz
//! seed 400123: clean saves of ~55 us, 2 x s_typ 60-200 us over the run; the
//! switch priced at 240 us held 45%
//! of the light's wakes for the hold, the light served 0.534 of alone
//! against 0.815). A switch priced below its cost would let a loop too
//! short to pay for it churn the equals; priced above, a loop that pays
//! for it waits for the hold at each job. The measured save is what the
//! equals lose: the rate test then keeps their share within the bound
//! whichever they are.

use super::*;

impl Scheduler {
    /// The price of one switch of partition `p` for a waker served at
    /// once: `2 x s_typ(p)` (a save and a restore at the partition's
    /// typical clean save), `spatial_coreside_ns` while no save is
    /// measured.
    pub(super) fn switch_price(&self, p: usize) -> Nanos {
        match self.measured_switch(p) {
            0 => self.cfg.spatial_coreside_ns,
            t_sw => t_sw,
        }
    }
}
