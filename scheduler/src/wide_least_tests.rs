//! A kept wide reservation at its fewest CUs, against the saves' high
//! mark (issue 18, `engine/wide_least.rs`): a wide owner whose job fits
//! half its period on a reservation within the width cap held that one,
//! where fewer CUs carry its job within its RT bound and its whole period
//! (fuzz seed 300085: 13-16 CUs per XCC where 11-12 do; 97092's 5 kHz RT
//! of 304 workgroups: 8 where 6-7 do). It now holds the fewest that do
//! with a gap that is a break, and the lower work runs on the rest.

use super::*;
use crate::engine::save_high_after;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = WIDE_CUS;
/// The anticipation grace's limit (`SchedConfig::anticipation_ns`).
const ANTICIPATION_NS: Nanos = 100_000;

impl WideRt {
    /// Does its job on `k` CUs per XCC, after a save of `save`, leave a
    /// gap past the anticipation grace (`2g > anticipation_ns`)?
    fn breaks(&self, k: u32, save: Nanos) -> bool {
        2 * self.period.saturating_sub(self.job_on(k) + save) > ANTICIPATION_NS
    }
}

/// Wide RTs (widths 1.5-4 times the partition, jobs of 1-4 rounds alone,
/// periods 168-450 us) whose job fits half their period on a reservation
/// within the cap, and fits its whole period on fewer CUs: after 150
/// periods the owner holds the fewest CUs per XCC that carry its job
/// within its RT bound and its period after the setup save (the fake
/// GPU's 50 us, every save alike: its high mark) and leave a gap that is a
/// break, below the half-period size (1216 x 12 us every 300 us: 10 CUs
/// per XCC, where 8 and 9 carry the job but leave a gap inside the
/// grace); the half-period size where none does (304 x 16 us every 168
/// us after a 50 us save: every smaller size's gap is inside the grace).
/// Its job meets its bound and period there, and the
/// lower work is running beside it. With the rule disabled every one
/// holds the half-period size (300085's shape 14 CUs per XCC where 11
/// carry it).
#[test]
fn a_wide_rt_keeps_the_fewest_cus_that_carry_its_whole_period() {
    let mut fewer = 0;
    for (width, solo, period) in [
        // Fuzz seed 300085's RT: 1216 workgroups, 3 x 6.3 us, every 448 us.
        (1216u64, 19_000u64, 448_000u64),
        (1216, 19_000, 400_000),
        (912, 10_000, 300_000),
        (760, 20_000, 450_000),
        (1216, 12_000, 300_000),
        // Fuzz seed 97092's rt1: 304 workgroups of 15.7 us every 168 us
        // (here whole-CU, 16 us).
        (304, 16_000, 168_000),
        (456, 25_000, 400_000),
    ] {
        let rt = WideRt {
            width,
            solo,
            period,
        };
        // The fake GPU's save (50 us) less from the switch allowance.
        let kept = rt.fewest(190_000, UNMAP_NS, period);
        let half = rt.fewest(190_000, 0, period / 2);
        let (Some(kept), Some(half)) = (kept, half) else {
            panic!("{rt:?}: shape outside the test ({kept:?}, {half:?})");
        };
        assert!(kept < half, "{rt:?}: {kept} vs {half}");
        let want = (kept..half)
            .find(|&k| rt.breaks(k, UNMAP_NS))
            .unwrap_or(half);
        let (mut w, lo, hi) = lockstep_lower_and_owner(CUS);
        let mut t = MS;
        for _ in 0..150 {
            rt.ring(&mut w, hi);
            t += rt.period;
            w.run_until(t);
        }
        let got = w.s.cu_reservation(0);
        assert_eq!(
            got,
            Some((VmId(1), want)),
            "{rt:?}: kept size {kept}, half-period size {half}"
        );
        assert!(rt.job_on(want) + UNMAP_NS <= period, "{rt:?}");
        assert!(
            rt.job_on(want) <= rt.job_on(0) * 11 / 10 + 240_000,
            "{rt:?}"
        );
        assert_eq!(w.state(lo), QueueState::Running, "{rt:?}");
        fewer += u32::from(want < half);
    }
    assert_eq!(fewer, 6);
}

/// The high mark of saves rises at once to a longer save and falls by an
/// eighth of the difference per shorter one: after one 44 us save among
/// 5-17 us ones (fuzz seed 300108's spread), it stays above 17 us for
/// the next several saves, so a size that fits only below about 9 us is
/// not taken between them; a steady save brings it down to that save.
#[test]
fn the_saves_high_mark_rises_at_once_and_falls_slowly() {
    let mut h = 0;
    for s in [8_000u64, 5_000, 17_000, 44_000] {
        h = save_high_after(h, s);
    }
    assert_eq!(h, 44_000);
    for s in [5_000u64, 9_000, 6_000, 8_000, 5_000, 7_000] {
        h = save_high_after(h, s);
        assert!(h > 17_000, "{h}");
    }
    for _ in 0..200 {
        h = save_high_after(h, 9_000);
    }
    assert!((9_000..9_010).contains(&h), "{h}");
    assert_eq!(save_high_after(h, 12_000), 12_000);
}
