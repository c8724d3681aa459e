//! A VM's job as lock-step kernels (issue 18, best effort beside wide RT
//! tenants; docs/scheduling.md, "A wide RT's reservation carries its whole
//! period"): the kernels of its last complete doorbell, each its
//! workgroup count and one workgroup's cost alone, so that its job's time
//! on `c` CUs is `sum ceil(W_i x m / c) x s_i` (`m` busy queues in phase).
//! The reservation sizing's round model (`Spatial::time_on`: the widest
//! dispatch's rounds x the summed solo time) is an upper bound that counts
//! every kernel as the widest; a job of 608 workgroups of 20.6 us and 1216
//! of 10.3 us (fuzz seed 97028) takes 165 us on 152 CUs, which that model
//! puts at 248 us.

/// Kernels kept per job ([`crate::Scheduler::note_dispatch_kernels`]); a
/// doorbell with more is not modelled (the widest-dispatch model decides).
pub const JOB_KERNELS: usize = 8;

/// The kernels of one job (a doorbell's dispatches), in order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct JobKernels {
    /// (workgroups, one workgroup's cost alone in ns) per kernel.
    k: [(u64, u64); JOB_KERNELS],
    /// Kernels in `k`.
    len: usize,
}

impl JobKernels {
    /// The job of `kernels` (workgroups, cost ns); `None` when empty, with
    /// more than [`JOB_KERNELS`] kernels, or with a kernel of no
    /// workgroups or no cost (nothing to model).
    pub fn of(kernels: &[(u64, u64)]) -> Option<JobKernels> {
        if kernels.is_empty()
            || kernels.len() > JOB_KERNELS
            || kernels.iter().any(|&(w, s)| w == 0 || s == 0)
        {
            return None;
        }
        let mut j = JobKernels::default();
        j.k[..kernels.len()].copy_from_slice(kernels);
        j.len = kernels.len();
        Some(j)
    }

    /// Time of the job of `queues` busy queues (in phase: one kernel of
    /// `queues x W` workgroups each) on `cus` CUs: `sum ceil(W_i x queues
    /// / cus) x s_i`, saturating; `None` on no CU.
    pub fn time_on(&self, queues: u64, cus: u64) -> Option<u64> {
        if cus == 0 {
            return None;
        }
        Some(self.k[..self.len].iter().fold(0u64, |t, &(w, s)| {
            let rounds = w.saturating_mul(queues.max(1)).div_ceil(cus);
            t.saturating_add(rounds.saturating_mul(s))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_counts_each_kernels_own_rounds() {
        // Fuzz seed 97028's RT: 608 x 20.6 us and 1216 x 10.3 us.
        let j = JobKernels::of(&[(608, 20_644), (1216, 10_322)]).unwrap();
        assert_eq!(j.time_on(1, 304), Some(2 * 20_644 + 4 * 10_322));
        assert_eq!(j.time_on(1, 152), Some(4 * 20_644 + 8 * 10_322));
        // 136 CUs: 5 and 9 rounds.
        assert_eq!(j.time_on(1, 136), Some(5 * 20_644 + 9 * 10_322));
        // Two queues in phase: one kernel of twice the workgroups each.
        assert_eq!(j.time_on(2, 304), Some(4 * 20_644 + 8 * 10_322));
        assert_eq!(j.time_on(1, 0), None);
    }

    #[test]
    fn hostile_or_unmodelled_jobs_are_refused() {
        assert_eq!(JobKernels::of(&[]), None);
        assert_eq!(JobKernels::of(&[(0, 5)]), None);
        assert_eq!(JobKernels::of(&[(5, 0)]), None);
        assert_eq!(JobKernels::of(&[(1, 1); JOB_KERNELS + 1]), None);
        let j = JobKernels::of(&[(u64::MAX, u64::MAX); JOB_KERNELS]).unwrap();
        assert_eq!(j.time_on(u64::MAX, 1), Some(u64::MAX));
    }
}
