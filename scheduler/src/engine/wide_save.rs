//! A wide owner's reservation set up with a save where the drain leaves it
//! none (issue 18, CWSR beside a wide RT; docs/scheduling.md, "A wide RT
//! saves where its drain leaves no reservation").
//!
//! A reservation's wait for the lower work on its CUs is a drain when the
//! lower workgroups end within the allowance (`spatial_drain_wait`), and
//! the owner's latency size is then budgeted with the allowance less that
//! drain. A drain of workgroups nearly as long as the allowance leaves a
//! wide owner's job almost nothing: no reservation within the width cap
//! meets its bound, `spatial_wide` gives none, and every job of the owner
//! preempts the whole partition, saving every lower queue (fuzz seed
//! 500045: a 1.27 ms RT of 3 x 304 workgroups of 7.2 us above three lower
//! queues of 226 us workgroups; a drain of 226 us of a 240 us allowance
//! leaves 13.8 us, the latency size is the whole XCC; a save of the three
//! queues per period, 21.2% of the run in CWSR). A save of the lower work
//! on the reserved CUs waits only for that save (`rt_switch_budget`, 45 us
//! there), which leaves the job 195 us: 4 CUs per XCC, 216 us, within its
//! bound of `1.1 x 21.6 + 240` us; the reservation is set up once with a
//! save and kept through the owner's gaps where `wide_keep.rs` weighs it
//! worth keeping.
//!
//! So where the drain's budget gives the owner no reservation, the save's
//! budget is tried: if it gives one, the reservation is a saved (kept) one
//! sized by it. Either way the owner's job is budgeted with what it waits
//! for: `t(k) + wait <= 1.1 x t(N) + allowance`, `wait` the drain or the
//! save. A drain that leaves a reservation is kept as before.

use super::*;

impl Scheduler {
    /// The wide reservation (CUs per XCC) owner `vm` at `level` of `p` on
    /// `queues` busy queues gets with a save of the lower work
    /// (`rt_switch_budget`), and that budget, when the drain's budget gave
    /// it none (see the module doc). `None`: no save measured, or no
    /// reservation with the save either.
    pub(super) fn wide_by_save(
        &self,
        p: usize,
        vm: VmId,
        level: u16,
        queues: u32,
    ) -> Option<(u32, Nanos)> {
        let switch = self.rt_switch_budget(p, level);
        if switch == 0 {
            return None;
        }
        let k = self.spatial_wide(p, vm, level, queues, switch, None)?;
        Some((k, switch))
    }
}
