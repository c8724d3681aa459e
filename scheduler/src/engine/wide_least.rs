//! A kept wide reservation at its fewest CUs, sized against the
//! partition's high mark of saves (issue 18, best effort beside a wide RT;
//! docs/scheduling.md, "A kept wide reservation at its fewest CUs, against
//! the saves' high mark").
//!
//! A wide owner's reservation is sized first to end its job within half
//! its period (`Spatial::size_wide` with `period / 2`), and by its whole
//! period (`wide_fit.rs`, `wide_kept_k`) only when no half-period size fits
//! the width cap. Half the period was asked for so a job would not outlast
//! an aging batch's yield allowance when each pause of the batch was
//! charged the job's time (fuzz seed 97138); a batch now keeps a held
//! reservation of a higher VM (`batch_res.rs`) and is charged `k / n` of
//! its wall time beside it, whatever the job's length, so a smaller
//! reservation costs it less. Fuzz seed 300085 (1216 whole-CU workgroups,
//! 3 x 6.3 us, every 448 us) held 13-16 CUs per XCC where 11-12 carry its
//! job within its bound and its period.
//!
//! Taking the whole period's size against the moving typical save
//! (branch `agehold`) broke fuzz seed 300108: its RT (2 x 304 half-CU
//! workgroups of 3.15 us every 370 us) fitted one CU per XCC only while
//! the partition's typical save was below about 9 us (its saves ran 5-44
//! us), so its size flipped between 1 and 2 CUs per XCC in half its
//! decisions, each growth a save of the lower work, and its p99 went past
//! its bound. Here the kept size subtracts the partition's **high mark**
//! of clean saves `s^` (raised at once by a longer save, lowered by 1/8
//! of the difference per shorter one: `save_high`) where the model's
//! kept size subtracts the typical one: a size shrinks only after many
//! saves agree, and a size that fits only between the longer saves is not
//! taken. With `A` the promise's wait allowance
//! (`spatial_wait_allowance`), `a` the owner's job alone and `t_k` its job
//! on `k` CUs per XCC (round model), `k` is the fewest CUs per XCC with
//!
//! * `t_k <= 1.1 x a + A - s^` (the RT bound after the setup save),
//! * `t_k + s^ <= P` (after that save, the job ends within its period),
//! * `2 x (P - t_k - s^) > anticipation_ns` (its gap is a break: a gap
//!   inside the anticipation grace makes the owner look backlogged and its
//!   reservation set up anew with a save),
//!
//! below the half-period size; none: the half-period size. A half-period
//! size that is drained (`wide_drains`) stays: a drained reservation
//! gives the lower work its CUs back in every gap.

use super::*;

/// A partition's high mark of clean saves after a save of `save` ns:
/// raised at once to a longer save, lowered by 1/8 of the difference by a
/// shorter one (so a size sized against it shrinks only after many
/// shorter saves agree, and grows at the first longer one).
pub(crate) fn save_high_after(high: Nanos, save: Nanos) -> Nanos {
    if save >= high {
        save
    } else {
        high - (high - save) / 8
    }
}

impl Scheduler {
    /// CUs per XCC of owner `vm`'s wide reservation in partition `p` (on
    /// `queues` busy queues, wake period `period`, switch budget `switch`,
    /// `drain` the wait of a drained reservation if the lower work allows
    /// one): the half-period size (`Spatial::size_wide`), or fewer where
    /// the whole period carries the job after the saves' high mark (see
    /// the module doc); the kept size (`wide_kept_k`) when no half-period
    /// size fits; `None` when neither does.
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
        let Some(half) = half else {
            return self.wide_kept_k(p, vm, queues, period);
        };
        if let Some(w) = drain {
            if self.wide_drains(p, vm, queues, half, w) {
                return Some(half);
            }
        }
        let s = self.save_high(p);
        let slack = self.spatial_wait_allowance(p).saturating_sub(s);
        let Some(least) = self.spatial.size_wide(
            vm,
            queues,
            slack,
            period.saturating_sub(s),
            self.cfg.spatial_max_permille,
        ) else {
            return Some(half);
        };
        Some(
            (least..half)
                .find(|&k| self.wide_gap_breaks(vm, queues, period, s, k))
                .unwrap_or(half),
        )
    }

    /// Partition `p`'s high mark of clean saves, at least its typical one
    /// (`clean_save`).
    pub(super) fn save_high(&self, p: usize) -> Nanos {
        let a = &self.parts[p].aging;
        a.save_high.max(a.save_typ)
    }

    /// Does owner `vm`'s job on `k` CUs per XCC (on `queues` queues, wake
    /// period `period`) after a save of `s` leave a gap `g = P - t_k - s`
    /// that is a break, `2g > anticipation_ns` (the grace is twice the
    /// gap when that fits `anticipation_ns`)?
    fn wide_gap_breaks(&self, vm: VmId, queues: u32, period: Nanos, s: Nanos, k: u32) -> bool {
        self.spatial.time_on(vm, queues, k).is_some_and(|t| {
            period.saturating_sub(t).saturating_sub(s).saturating_mul(2) > self.cfg.anticipation_ns
        })
    }
}
