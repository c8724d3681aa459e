//! A narrow periodic RT above lower work that a reservation would cost a
//! lock-step round: its reservation lapses in the gaps while the
//! partition's saves stay within the CWSR budget, and is kept through the
//! gaps the budget cannot pay for (issue 18, `engine/cwsr_budget.rs`;
//! docs/scheduling.md, "A reservation kept where the saves spend the CWSR
//! budget").

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
/// The owner's solo time: one round of its workgroups.
const SOLO: Nanos = 6_000;
/// The owner's width: a few workgroups (1 CU per XCC).
const OWNER_WIDTH: u64 = 10;
/// The owner's job: long enough that the lower queues saved at its set-up
/// are restored beside it before it ends.
const JOB: Nanos = 300_000;

/// A lower VM (VM 0, priority 2) of two busy queues of 304 workgroups that
/// fit half a CU (in phase: one lock-step kernel of 608 workgroups, a
/// third of its throughput lost beside any reservation) and a narrow RT
/// (VM 1, priority 12) ringing every `period` for `periods` periods.
/// Returns the lower VM's preemptions (one save and restore of 2 x 50 us
/// each, `UNMAP_NS`) over the last `periods - 60` periods and the number
/// of those periods whose gap kept the reservation 1.2 ms in.
fn run(period: Nanos, periods: u32) -> (u64, u32) {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo = w.vm(0, 2, 1, 2);
    let hi = w.vm(1, 12, 1, 1)[0];
    for &q in &lo {
        w.s.note_dispatch_width(q, 304);
        w.s.note_dispatch_occupancy(q, 600_000, true);
        w.submit(q, 100_000 * MS);
    }
    w.run_until(MS);
    let mut t = MS;
    let mut pre = 0;
    let mut kept = 0;
    for i in 0..periods {
        if i == 60 {
            pre = w.s.vm_stats(VmId(0)).unwrap().preemptions;
        }
        w.ring_job(hi, OWNER_WIDTH, SOLO, false, JOB);
        w.run_until(t + 1_200_000);
        if i >= 60
            && w.s
                .cu_reservation(0)
                .is_some_and(|(vm, k)| vm == VmId(1) && k > 0)
        {
            kept += 1;
        }
        t += period;
        w.run_until(t);
    }
    (w.s.vm_stats(VmId(0)).unwrap().preemptions - pre, kept)
}

/// Every 1.5 ms, a lapse per gap saves both lower queues: 2 x 100 us of
/// CWSR per period, 13.3% of the run, and the price per gap
/// (`res_hold.rs`) lapses each one (a third of the lower kernel's
/// throughput for the gap costs more). With the budget the saves stay
/// within its 9% (plus one window's share) and the reservation is kept
/// through the other gaps; the lower work still gets every CU back in
/// most of them (fails without the budget: 400 saves in 200 periods).
#[test]
fn lapses_stay_within_the_cwsr_budget() {
    let period = 1_500_000;
    let periods = 260;
    let (pre, kept) = run(period, periods);
    let steady = Nanos::from(periods - 60) * period;
    let cwsr = pre * 2 * UNMAP_NS;
    let window = 32 * MS * 90 / 1000;
    assert!(
        cwsr <= steady * 90 / 1000 + window,
        "{pre} saves in {} periods: {cwsr} ns of CWSR in {steady} ns",
        periods - 60
    );
    assert!(kept > 0, "no gap kept");
    assert!(kept < (periods - 60) / 2, "{kept} gaps kept");
}

/// Gaps long enough that a lapse per period is within the budget (every
/// 3 ms: 6.7% of the run): every gap lapses, as the price per gap has it.
#[test]
fn within_the_budget_every_gap_lapses() {
    let (pre, kept) = run(3_000_000, 160);
    assert_eq!(kept, 0, "a gap kept within the budget");
    assert!(pre >= 190, "{pre} saves in 100 periods");
}
