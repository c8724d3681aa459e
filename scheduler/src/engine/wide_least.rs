//! A kept wide reservation at its fewest CUs (issue 18, best effort beside
//! a wide RT and aging batches; docs/scheduling.md, "A kept wide
//! reservation at its fewest CUs").
//!
//! A wide owner's reservation was sized first to end its job within half
//! its period (`Spatial::size_wide` with `period / 2`), and by its whole
//! period (`wide_fit.rs`) only when no half-period size fitted the width
//! cap. Half the period was asked for so a job would not outlast an
//! aging batch's yield allowance, which each pause of the batch for the
//! RT's job was charged by the job's time (fuzz seed 97138). A batch now
//! keeps a held reservation of a higher VM (`batch_res.rs`) and is
//! charged `k / n` of its wall time beside it, whatever the RT's job
//! length: the smaller reservation costs the batch less, and the lower
//! work outside batches loses `k` CUs per XCC in every gap. Fuzz seed
//! 300085 (1216 whole-CU workgroups, 3 x 6.3 us, every 448 us): 14-16 CUs
//! per XCC by the half period where 9-11 carry the job within its bound
//! and its period; best effort 0.576 of alone against 0.9 x 0.755.
//!
//! So the kept size (whole period less the setup save, the promise's
//! allowance less that save) is taken when it is smaller and its job
//! leaves a gap `g = P - t - t_save` past the anticipation grace (`2g >
//! anticipation_ns`: a gap inside the grace makes the owner look
//! backlogged and its reservation set up anew with a save), unless the
//! half-period reservation is one that is drained (`wide_drains`: its job
//! and the drain within half the period and the bound): a drained
//! reservation gives the lower work its CUs back in every gap, which a
//! kept one never does.

use super::*;

impl Scheduler {
    /// CUs per XCC of owner `vm`'s wide reservation in partition `p` (on
    /// `queues` busy queues, wake period `period`, switch budget `switch`,
    /// `drain` the wait of a drained reservation if the lower work allows
    /// one): the fewer of the half-period size (`Spatial::size_wide`) and
    /// the kept size over the whole period (`wide_kept_k`), the
    /// half-period one when it is drained; `None` when neither fits.
    pub(super) fn wide_least_k(
        &self,
        p: usize,
        vm: VmId,
        queues: u32,
        period: Nanos,
        switch: Nanos,
        drain: Option<Nanos>,
    ) -> Option<u32> {
        let half = self.spatial.size_wide(
            vm,
            queues,
            switch,
            period / 2,
            self.cfg.spatial_max_permille,
        );
        if let (Some(k), Some(w)) = (half, drain) {
            if self.wide_drains(p, vm, queues, k, w) {
                return Some(k);
            }
        }
        let kept = self.wide_kept_k(p, vm, queues, period);
        match (half, kept) {
            (Some(a), Some(b)) if b < a && self.wide_gap_breaks(p, vm, queues, period, b) => {
                Some(b)
            }
            (a, b) => a.or(b),
        }
    }

    /// Does owner `vm`'s job on `k` CUs per XCC (on `queues` queues, wake
    /// period `period`) leave a gap `g = P - t - t_save` that is a break,
    /// past its anticipation grace (`2g > anticipation_ns`, the grace
    /// being twice the gap when that fits `anticipation_ns`)? A gap
    /// inside it makes the owner look backlogged (`coreside_backlogged`)
    /// and its reservation set up anew with a save: there the half-period
    /// size is kept.
    fn wide_gap_breaks(&self, p: usize, vm: VmId, queues: u32, period: Nanos, k: u32) -> bool {
        let save = self.clean_save(p);
        self.spatial.time_on(vm, queues, k).is_some_and(|t| {
            period
                .saturating_sub(t)
                .saturating_sub(save)
                .saturating_mul(2)
                > self.cfg.anticipation_ns
        })
    }
}
