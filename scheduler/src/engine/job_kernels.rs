//! An RT's job timed kernel by kernel (issue 18, best effort beside RT
//! reservations; docs/scheduling.md, "A reservation sized by the RT's job
//! kernel by kernel").
//!
//! The reservation sizing timed a job on `c` CUs as `ceil(need / c)`
//! rounds of its solo time (every kernel at the widest kernel's rounds) or
//! as `work / c + solo`; both bound the job from above, and for a job of
//! kernels of different widths both are loose: fuzz seed 500000's RT (608
//! workgroups of 15.1 us, then 4 x 304 of 7.6 us) runs 302 us on 8 CUs per
//! XCC kernel by kernel, 363 us by the rounds model and 332 us by the work
//! model, so it was held at 10 CUs per XCC where 8 meet its bound. The
//! job's lock-step time (docs/gpu-model.md, "Batches") is exact for a job
//! alone on its CUs: each kernel `i` of `W_i` workgroups of cost `s_i` on
//! `q` busy queues runs `ceil(q x W_i / c)` rounds,
//!
//! `T(c) = sum_i ceil(q x W_i / c) x s_i`,
//!
//! from the kernels of the VM's latest completely read doorbell (at most
//! the binding's scan of 16 packets). Doorbells differ: the model is
//! scaled up by how far the VM's decaying widest dispatch and solo time
//! (what the other models use) exceed that doorbell's, so a larger recent
//! job is not timed by a smaller later one. Guest-given values are hostile:
//! at most [`JOB_KERNELS`] kernels are kept and every product saturates.

use crate::spatial::Spatial;
use crate::VmId;

/// How many kernels of a doorbell [`JobKernels`] keeps (the binding reads
/// at most 16 packets per doorbell).
pub(crate) const JOB_KERNELS: usize = 16;

/// The kernels of a VM's latest completely read doorbell: workgroups and
/// one workgroup's cost alone, ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct JobKernels {
    k: [(u64, u64); JOB_KERNELS],
    len: usize,
}

impl JobKernels {
    /// The kernels `kernels` (workgroups, cost per workgroup in ns); those
    /// beyond [`JOB_KERNELS`] and empty ones are dropped.
    pub fn of(kernels: &[(u64, u64)]) -> JobKernels {
        let mut j = JobKernels::default();
        for &(w, s) in kernels.iter().filter(|(w, s)| *w > 0 && *s > 0) {
            if j.len == JOB_KERNELS {
                break;
            }
            j.k[j.len] = (w, s);
            j.len += 1;
        }
        j
    }

    fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.k[..self.len].iter().copied()
    }

    /// Its widest kernel, workgroups.
    fn widest(&self) -> u64 {
        self.iter().map(|(w, _)| w).max().unwrap_or(0)
    }

    /// Its solo time: one workgroup's cost per kernel, summed.
    fn solo(&self) -> u64 {
        self.iter().fold(0u64, |a, (_, s)| a.saturating_add(s))
    }

    /// `T(c)` on `queues` busy queues (see the module doc); `None` with no
    /// kernel or no CU.
    pub fn time_on(&self, queues: u32, c: u64) -> Option<u64> {
        if self.len == 0 || c == 0 {
            return None;
        }
        let q = u64::from(queues.max(1));
        Some(self.iter().fold(0u64, |a, (w, s)| {
            a.saturating_add(w.saturating_mul(q).div_ceil(c).saturating_mul(s))
        }))
    }
}

impl Spatial {
    /// Records the kernels of a completely read doorbell of `vm`.
    pub fn note_job_kernels(&mut self, vm: VmId, kernels: &[(u64, u64)]) {
        let j = JobKernels::of(kernels);
        if j.len > 0 {
            self.jobs.insert(vm, j);
        } else {
            self.jobs.remove(&vm);
        }
    }

    /// `vm`'s job on `c` CUs in all on `queues` busy queues kernel by
    /// kernel (`T(c)`), scaled up by `max(width / W, solo / S)` when the
    /// VM's decaying widest dispatch `width` and solo time `solo` exceed
    /// its latest doorbell's `W` and `S`. `None` without kernels, a width
    /// or a solo time.
    pub fn kernel_time_on(&self, vm: VmId, queues: u32, c: u64) -> Option<u64> {
        let j = self.jobs.get(&vm)?;
        let t = j.time_on(queues, c)?;
        let width = *self.width.get(&vm)?;
        let solo = self.occ.get(&vm)?.solo_ns;
        let (jw, js) = (j.widest().max(1), j.solo().max(1));
        // The larger of the two ratios, as a fraction num / den >= 1.
        let (num, den) = if u128::from(width) * u128::from(js) >= u128::from(solo) * u128::from(jw)
        {
            (width, jw)
        } else {
            (solo, js)
        };
        if num <= den {
            return Some(t);
        }
        let scaled = u128::from(t) * u128::from(num) / u128::from(den);
        Some(u64::try_from(scaled).unwrap_or(u64::MAX))
    }

    /// The fewest CUs per XCC (at most `cus_per_xcc`) on which `vm`'s job
    /// on `queues` busy queues takes at most `budget` kernel by kernel
    /// (`None`: no kernels known, or none fits).
    pub fn kernel_fewest_k(&self, vm: VmId, queues: u32, budget: u64) -> Option<u32> {
        let xccs = u64::from(self.xccs.max(1));
        let fits = |k: u32| {
            self.kernel_time_on(vm, queues, u64::from(k).saturating_mul(xccs))
                .is_some_and(|t| t <= budget)
        };
        // `T(c)` never grows with `c`: a binary search.
        let (mut lo, mut hi) = (1u32, self.cus_per_xcc);
        if hi == 0 || !fits(hi) {
            return None;
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Some(lo)
    }
}
