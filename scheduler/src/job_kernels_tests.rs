//! A kept wide reservation sized by the RT's job kernel by kernel (issue
//! 18, `engine/job_kernels.rs`): an RT of kernels of different widths was
//! timed at its widest kernel's rounds (or its CU time over the CUs plus
//! its solo time) and held more CUs than its job needs (fuzz seed 500000:
//! 10 CUs per XCC where its kernels' own rounds give 8 with the whole
//! switch allowance); and a kept size whose job fills its period so nearly
//! that its gap is no break is raised to the next that leaves one (fuzz
//! seed 500075).

use super::*;
use crate::engine::JobKernels;

/// CUs per XCC of the MI300X-like partition (8 XCCs).
const CUS: u32 = WIDE_CUS;

/// A periodic RT of several kernels: `(workgroups, one's cost)` each.
#[derive(Clone, Debug)]
struct KernelRt {
    kernels: Vec<(u64, Nanos)>,
    period: Nanos,
}

impl KernelRt {
    /// Its job on `k` CUs per XCC (0: the whole partition), kernel by
    /// kernel in lock-step rounds.
    fn job_on(&self, k: u32) -> Nanos {
        let c = u64::from(if k == 0 { CUS } else { k }) * WIDE_XCCS;
        self.kernels.iter().map(|&(w, s)| w.div_ceil(c) * s).sum()
    }

    /// Rings one job on `hi`: its widest dispatch, solo time, CU time
    /// and, with `kernels`, each kernel (the binding's complete scan).
    fn ring(&self, w: &mut World, hi: QueueId, kernels: bool) {
        let widest = self.kernels.iter().map(|k| k.0).max().unwrap_or(0);
        let solo = self.kernels.iter().map(|k| k.1).sum();
        let work = self.kernels.iter().map(|k| k.0 * k.1).sum();
        w.s.note_dispatch_width(hi, widest);
        w.s.note_dispatch_occupancy(hi, solo, false);
        w.s.note_dispatch_work(hi, work);
        if kernels {
            w.s.note_dispatch_kernels(hi, &self.kernels);
        }
        let k = match w.s.cu_reservation(0) {
            Some((vm, k)) if vm == w.vm_of[&hi] => k,
            _ => 0,
        };
        let j = self.job_on(k);
        w.submit(hi, j);
    }

    /// CUs per XCC it holds after 150 periods above a lock-step lower VM.
    fn held(&self, kernels: bool) -> Option<(VmId, u32)> {
        let (mut w, lo, hi) = lockstep_lower_and_owner(CUS);
        let mut t = MS;
        for _ in 0..150 {
            self.ring(&mut w, hi, kernels);
            t += self.period;
            w.run_until(t);
        }
        assert_eq!(w.state(lo), QueueState::Running, "{self:?}");
        w.s.cu_reservation(0)
    }
}

/// Fuzz seed 500000's RT (608 workgroups of 15.1 us, then four of 304 of
/// 7.6 us, every 738 us) above lock-step lower work: timed kernel by
/// kernel its job needs 10 CUs per XCC (242 us, within `1.1 x 60.5 us`
/// plus the switch left after the fake GPU's 50 us save, 190 us), where
/// its widest kernel's rounds and its CU time gave 11. Without the kernels
/// reported (the rule's input) it holds 11.
#[test]
fn a_wide_rt_of_unequal_kernels_holds_what_its_kernels_need() {
    let rt = KernelRt {
        kernels: vec![
            (608, 15_121),
            (304, 7_560),
            (304, 7_560),
            (304, 7_560),
            (304, 7_560),
        ],
        period: 738_000,
    };
    let got = rt.held(true);
    assert_eq!(got, Some((VmId(1), 10)));
    assert!(rt.job_on(10) <= rt.job_on(0) * 11 / 10 + 240_000 - UNMAP_NS);
    assert!(rt.job_on(9) > rt.job_on(0) * 11 / 10 + 240_000 - UNMAP_NS);
    assert_eq!(rt.held(false), Some((VmId(1), 11)));
}

/// Fuzz seed 500075's RT (304 and 132 workgroups of 40 us every 222 us):
/// no size carries its job within half its period, so its kept size
/// (`wide_kept_k`) is the fewest whose job ends within its period after
/// the setup save, kernel by kernel 17 CUs per XCC (160 us). After the
/// 50 us save that leaves a 12 us gap, inside the anticipation grace: it
/// holds 19 (120 us, a 52 us gap), the next size whose gap is a break.
#[test]
fn a_kept_wide_size_leaves_a_gap_that_is_a_break() {
    let rt = KernelRt {
        kernels: vec![(304, 39_957), (132, 39_957)],
        period: 222_000,
    };
    assert_eq!(rt.job_on(17), rt.job_on(18));
    assert!(2 * (rt.period - rt.job_on(17) - UNMAP_NS) <= 100_000);
    assert!(2 * (rt.period - rt.job_on(19) - UNMAP_NS) > 100_000);
    assert_eq!(rt.held(true), Some((VmId(1), 19)));
}

/// The model is exact kernel by kernel, scaled up by a wider or longer
/// recent dispatch than its own doorbell's, and hostile values neither
/// overflow nor grow it past 16 kernels.
#[test]
fn the_kernel_model_times_each_kernel_at_its_own_rounds() {
    let j = JobKernels::of(&[(608, 15_121), (304, 7_560), (0, 5), (9, 0)]);
    assert_eq!(j.time_on(1, 64), Some(10 * 15_121 + 5 * 7_560));
    assert_eq!(j.time_on(2, 64), Some(19 * 15_121 + 10 * 7_560));
    assert_eq!(j.time_on(1, 0), None);
    assert_eq!(JobKernels::of(&[]).time_on(1, 8), None);
    let huge = JobKernels::of(&[(u64::MAX, u64::MAX); 40]);
    assert_eq!(huge.time_on(u32::MAX, 1), Some(u64::MAX));
    let many: Vec<(u64, u64)> = (1..=40).map(|i| (1, i)).collect();
    assert_eq!(
        JobKernels::of(&many).time_on(1, 1),
        Some((1..=16).sum::<u64>())
    );

    let mut s = crate::spatial::Spatial {
        cus_per_xcc: 38,
        xccs: 8,
        ..Default::default()
    };
    let vm = VmId(3);
    s.note(vm, 608);
    s.note_occupancy(vm, 15_121 + 7_560, false);
    s.note_job_kernels(vm, &[(608, 15_121), (304, 7_560)]);
    assert_eq!(s.kernel_time_on(vm, 1, 64), Some(10 * 15_121 + 5 * 7_560));
    // A narrower, shorter doorbell after it: scaled by the larger ratio.
    s.note(vm, 304);
    s.note_job_kernels(vm, &[(304, 7_560)]);
    let t = s.kernel_time_on(vm, 1, 64).unwrap();
    assert!(t >= 5 * 7_560 * 2, "{t}");
    assert_eq!(s.kernel_fewest_k(vm, 1, 0), None);
}
