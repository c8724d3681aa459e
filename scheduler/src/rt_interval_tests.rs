//! An RT reservation keeps up with its tenant's arrivals (issue 18,
//! `3-rt-latency`): sized by latency alone, a reservation may run each job
//! longer than the time to the next one, and the queue never drains (fuzz
//! seed 50032: an 8 kHz RT of 38 workgroups on one CU per XCC, p99 14 ms
//! against 280 us). The fake GPU of `tests.rs`, virtual time only.

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
const XCCS: u32 = 8;

/// CUs per XCC of the reservation a periodic RT VM (VM 1, priority 12) of
/// `width` workgroups and solo time `solo` holds beside a busy lower VM
/// of whole-CU 10 ms workgroups (saved, never drained, never co-resident)
/// after `jobs` jobs `period` apart (each as long as its rounds on the
/// reservation it gets, at most `period`); read while its last job runs.
fn reservation_after(width: u64, solo: Nanos, period: Nanos, jobs: u64) -> u32 {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, XCCS);
    let lo = w.vm(0, 2, 1, 1)[0];
    let rt = w.vm(1, 12, 1, 1)[0];
    w.s.note_dispatch_width(lo, 304);
    w.s.note_dispatch_occupancy(lo, 10 * MS, false);
    w.submit(lo, 10_000 * MS);
    w.run_until(MS);
    let mut k = 0;
    for i in 0..jobs {
        let at = MS + i * period;
        w.run_until(at);
        w.s.note_dispatch_width(rt, width);
        w.s.note_dispatch_occupancy(rt, solo, false);
        // The job runs its rounds on the CUs it had last time (the whole
        // width before any reservation), and never past its period.
        let cus = if k == 0 { width } else { (k * XCCS) as u64 };
        let job = (width.div_ceil(cus.max(1)) * solo).min(period - 1);
        w.submit(rt, job);
        k =
            w.s.cu_reservation(0)
                .filter(|r| r.0 == VmId(1))
                .map_or(0, |r| r.1);
    }
    k
}

/// Rounds of a `width`-workgroup job on `k` CUs per XCC.
fn rounds(width: u64, k: u32) -> u64 {
    width.div_ceil((k * XCCS) as u64)
}

#[test]
fn a_reservation_runs_each_job_within_the_interval_between_jobs() {
    // (width, solo ns, period ns) over RT rates of 8-20 kHz and widths
    // of 38-144 workgroups. With this fake GPU's save (50 us) the bound
    // alone allows `floor(1.1 + 100 us / s)` rounds, longer than the
    // period for all but the first shape (e.g. 128 x 10 us every 50 us:
    // 11 rounds allowed, 2 CUs per XCC, 8 rounds = 80 us per job); with
    // the interval, the job's rounds on the reservation take at most the
    // period.
    for (width, solo, period) in [
        (38, 35_000, 122_000),
        (128, 10_000, 50_000),
        (96, 20_000, 100_000),
        (120, 30_000, 100_000),
        (64, 15_000, 50_000),
        (144, 20_000, 90_000),
    ] {
        let k = reservation_after(width, solo, period, 40);
        let what = format!("width {width}, solo {solo} ns, period {period} ns: k {k}");
        assert!(k > 0, "{what}: no reservation");
        assert!(k < CUS, "{what}");
        assert!(
            rounds(width, k) * solo <= period,
            "{what}: the queue never drains"
        );
    }
}

#[test]
fn a_slow_rt_keeps_the_fewest_cus_that_meet_its_bound() {
    // A 1 kHz RT of 152 workgroups of 100 us: its period is long against
    // its rounds, so the interval takes nothing from the lower work: the
    // same CUs as at 100 Hz (the fewest that meet the bound with this
    // fake GPU's save).
    let slow = reservation_after(152, 100_000, 10 * MS, 40);
    let many = reservation_after(152, 100_000, MS, 40);
    assert_eq!(many, slow);
    assert!(
        rounds(152, many) > 1,
        "k {many}: the latency sizing was bypassed"
    );
    // Faster arrivals of the same job grow it, never shrink it.
    let fast = reservation_after(152, 100_000, 250_000, 40);
    assert!(fast >= many, "{fast} < {many}");
    assert!(rounds(152, fast) * 100_000 <= 250_000, "k {fast}");
}
