//! A lower RT with no reservation of its own runs on a higher RT's
//! reservation held across the higher one's gap (issue 18, two RT tenants
//! at different levels; `engine/res_down.rs`). Before, the lower RT, below
//! the reservation's level, got the other CUs and each of its jobs saved
//! the lower work there, while the reserved CUs stood idle: fuzz seed
//! 97041, 146 of 191 preemptions.

use super::*;

// The three-VM rig of `res_keep_tests.rs`: a busy lower VM (VM 0,
// priority 2), a higher periodic VM `hi` (VM 1, priority 12) and a lower
// RT `mid` (VM 2, priority 11) between them.
use super::res_keep_tests::rig;

/// Runs `n` periods of `period` ns: `hi` rings a narrow job (8
/// workgroups of `hi_solo` ns) at the start of each, and `mid`, in one
/// period of `mid_every`, `offset` ns later, a job of `mid_w` workgroups
/// of `mid_solo` ns (`mid_work` ns of work). Returns the lower VM's
/// preemptions over the last `n - 10` periods.
#[allow(clippy::too_many_arguments)]
fn periods(
    w: &mut World,
    (hi, mid): (QueueId, QueueId),
    hi_solo: Nanos,
    (mid_w, mid_solo, mid_work): (u64, Nanos, Nanos),
    mid_every: u64,
    offset: Nanos,
    period: Nanos,
    n: u64,
) -> u64 {
    let mut pre = 0;
    let mut t = MS;
    for i in 0..n {
        if i == 10 {
            pre = w.s.vm_stats(VmId(0)).unwrap().preemptions;
        }
        w.ring_job(hi, 8, hi_solo, false, hi_solo);
        w.run_until(t + offset);
        if i % mid_every == 0 {
            w.ring_job(mid, mid_w, mid_solo, false, mid_work);
        }
        t += period;
        w.run_until(t);
    }
    w.s.vm_stats(VmId(0)).unwrap().preemptions - pre
}

/// A wide lower RT (304 workgroups of 1 us: on one CU per XCC its 38
/// rounds meet its bound, 1.1 x one round + the rig's switch) ringing
/// every 3 ms, far apart for a wide reservation of its own, under a 1 kHz
/// narrow RT whose reservation is held across its gaps: over 90 periods
/// the lower work is never saved for it (30 saves before, one per job).
#[test]
fn a_lower_rt_runs_on_a_higher_rts_held_reservation() {
    let (mut w, lo, hi, mid) = rig();
    let pre = periods(
        &mut w,
        (hi, mid),
        20_000,
        (304, 1_000, 8_000),
        3,
        400_000,
        1_000_000,
        100,
    );
    assert_eq!(pre, 0, "lower work saved {pre} times in 90 periods");
    assert_eq!(w.state(lo), QueueState::Running);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Over the lower RT's widths (160-400 workgroups: above the width
    /// cap, up to 1.3 rounds of the partition) and workgroups (0.5-1.2
    /// us: its job meets its bound on the higher RT's CUs), one job in
    /// 2-4 periods of 0.6-1 ms of the higher RT, rung 0.1-0.5 ms into
    /// the period: the lower work is never saved for it.
    #[test]
    fn a_lower_rt_on_a_higher_rts_reservation_saves_no_lower_work(
        mid_w in 160u64..400,
        mid_solo in 500u64..1_200,
        mid_every in 2u64..5,
        offset in 100_000u64..500_000,
        period in 600_000u64..1_000_000,
    ) {
        let (mut w, lo, hi, mid) = rig();
        let pre = periods(
            &mut w,
            (hi, mid),
            20_000,
            (mid_w, mid_solo, mid_solo * 8),
            mid_every,
            offset,
            period,
            70,
        );
        prop_assert_eq!(pre, 0, "lower work saved {} times in 60 periods", pre);
        prop_assert_eq!(w.state(lo), QueueState::Running);
    }
}
