//! A held reservation is sized for the jobs it carries, which wait for no
//! save (issue 18, fuzz seed 600115; docs/scheduling.md, "A held
//! reservation sized without the save its jobs do not wait for").
//!
//! An RT's reservation sized by latency (`Spatial::size_for_latency`) gets
//! the promise's allowance (one save and restore, `spatial_wait_allowance`)
//! less what its job waits before it runs: the save of the lower work on
//! its CUs (`rt_save_wait`, `rt_switch_budget`: the waits for waves without
//! a save point included). That wait is paid when the reservation is set
//! up. A reservation held across the owner's gaps (`spatial_held`) keeps
//! its CUs free of lower work, so each later job starts at its doorbell
//! and the whole allowance is the job's. Fuzz seed 600115: an RT of 42,
//! 17 and 20 workgroups of 13.7 us (41 us alone, every 528 us) above a
//! lower VM whose saves wait for its 202 us `no_save_point` waves was
//! sized 2 CUs per XCC for every job (a 120 us budget: 96 us on 16 CUs)
//! although it held its reservation for the whole run (4 saves in 300
//! ms) and waited for none; the lower VM's 869-workgroup kernels then ran
//! 4 rounds on 288 CUs instead of 3 (0.706 of alone against the bound's
//! 0.9 x 0.800, whose reservation case is 1 CU per XCC: 164 us within 1.1
//! x 41 + 242).
//!
//! So an owner whose own narrow, undrained reservation is in place and
//! held is sized with the whole allowance as its switch budget: the job
//! that set the reservation up was sized for its wait (the size in place
//! then), and a held reservation only shrinks to the held size, which
//! costs the lower work no save. A drained reservation hands its CUs back
//! in each gap (every job waits for the drain) and a wide one is sized by
//! its own rule (`wide.rs`): neither changes.

use super::*;
use crate::spatial::Reservation;

impl Scheduler {
    /// The switch budget for `owner`'s latency sizing in `p` when `prev`,
    /// the reservation in place, is the owner's own narrow, undrained
    /// reservation and is still held: the whole allowance (its job finds
    /// the reserved CUs free and waits for no save). `None` otherwise (the
    /// job may wait for a save: `rt_switch_budget` decides).
    pub(super) fn held_switch_budget(
        &self,
        p: usize,
        owner: SliceOwner,
        prev: Option<Reservation>,
    ) -> Option<Nanos> {
        let r = prev?;
        let own = r.vm == owner.vm && r.level == owner.level;
        (own && r.k > 0 && !r.drain && !r.wide && self.spatial_held(p, r))
            .then(|| self.spatial_wait_allowance(p))
    }
}
