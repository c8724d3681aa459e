//! The job alone a wide reservation's stretch is judged against (issue 18,
//! branch `top9`; docs/scheduling.md, "The stretch of a wide reservation
//! against its job's kernels").
//!
//! A closed loop given a wide reservation keeps it only while its job
//! there adds at most 5% to its cycle against its job alone
//! (`WakePeriods::stretched`). The job alone was `Spatial::time_on` on the
//! whole partition: its widest dispatch's rounds for the sum of every
//! kernel's workgroup cost, an upper bound that counts a narrow long
//! kernel as many rounds as the wide short one beside it. Fuzz seed
//! 50130's top (a 304 x 40 us kernel and a 1216 x 10 us one, 119 us
//! think) was taken to run 4 x 50.5 = 202 us alone where it runs 81 us:
//! its 131-170 us jobs on an 18-CU-per-XCC reservation looked no slower
//! than alone, and the reservation was kept 88 ms while a flood ran on the
//! other CUs (top CU time 0.914 of alone against 0.937). Kernel by kernel
//! the job alone on `N` CUs is at most `work / N + solo` (each kernel `i`
//! of `w_i` workgroups of cost `s_i` takes `ceil(w_i / N) x s_i <= (w_i /
//! N + 1) x s_i`): the reference is the smaller of the two upper bounds,
//! still never below the job alone, so a reservation that costs nothing
//! is not judged stretched.

use super::*;

/// The job alone on `n` CUs a stretch is judged against: `rounds_ns` (the
/// widest dispatch's rounds of the summed workgroup costs), or `work_ns /
/// n + solo_ns` when that is smaller (`work_ns`: the job's CU time, 0 when
/// not reported).
pub(super) fn stretch_alone_ns(rounds_ns: Nanos, work_ns: Nanos, n: u64, solo_ns: Nanos) -> Nanos {
    if work_ns == 0 || n == 0 {
        return rounds_ns;
    }
    rounds_ns.min((work_ns / n).saturating_add(solo_ns))
}

impl Scheduler {
    /// `vm`'s job alone on the whole partition on `queues` busy queues,
    /// as a wide reservation's stretch is judged against
    /// ([`stretch_alone_ns`]; `None` without a width or a solo time).
    pub(super) fn stretch_alone(&self, vm: VmId, queues: u32) -> Option<Nanos> {
        let sp = &self.spatial;
        let rounds = sp.time_on(vm, queues, sp.cus_per_xcc)?;
        let o = sp.occ.get(&vm)?;
        let n = u64::from(sp.cus_per_xcc).saturating_mul(u64::from(sp.xccs.max(1)));
        let work = o.work_ns.saturating_mul(u64::from(queues.max(1)));
        Some(stretch_alone_ns(rounds, work, n, o.solo_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fuzz seed 50130's top: 304 x 40.4 us and 1216 x 10.1 us on 304
    /// CUs. The rounds bound is 4 x 50.5 us; kernel by kernel, 80.9 + 50.5.
    #[test]
    fn a_narrow_long_kernel_beside_a_wide_short_one_is_not_counted_in_rounds() {
        let solo = 40_434 + 10_108;
        let work = 304 * 40_434 + 1216 * 10_108;
        let rounds = 4 * solo;
        let a = stretch_alone_ns(rounds, work, 304, solo);
        assert_eq!(a, work / 304 + solo);
        assert!(a < rounds);
        // One kernel as wide as the partition: the rounds bound is exact.
        assert_eq!(stretch_alone_ns(40_000, 304 * 40_000, 304, 40_000), 40_000);
        // No work reported: the rounds bound.
        assert_eq!(stretch_alone_ns(rounds, 0, 304, solo), rounds);
    }

    /// The closed loop of 50130 on an 18-CU-per-XCC reservation: jobs of
    /// 170 us there, 119 us think. Against the rounds bound (202 us) it
    /// is not stretched; against the kernel-by-kernel one (131 us) it is.
    #[test]
    fn the_closed_loop_on_a_wide_reservation_is_judged_stretched() {
        let solo = 40_434 + 10_108;
        let work = 304 * 40_434 + 1216 * 10_108;
        let rounds = 4 * solo;
        let (alone_job, trial_job, think) = (81_000, 170_000, 119_000);
        let mut w = wide::WakePeriods::default();
        let mut t = 0;
        // Cycles on the whole partition, then cycles on the reservation.
        for i in 0..20 {
            let trial = i >= 10;
            t += if trial { trial_job } else { alone_job } + think;
            w.wake(t, think, trial, false);
        }
        assert!(!w.stretched(rounds), "the rounds bound hides the stretch");
        assert!(w.stretched(stretch_alone_ns(rounds, work, 304, solo)));
    }
}
