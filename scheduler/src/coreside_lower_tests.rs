//! Co-residence admission counts the lower VMs that may hold CUs beside
//! the owner (issue 18, `engine/coreside_lower.rs`; docs/scheduling.md
//! "Co-residence counts the lower VMs that may run beside the owner"). A
//! busy lower VM whose occupancy was never recorded (it rang once and,
//! starved, never completed) no longer refuses a co-residence it cannot
//! run beside (fuzz seed 600002: refused all run, the best effort beside
//! the RT's reservation kept 0.745 of its CU time alone).

use super::*;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
const PERIODS: u64 = 12;

/// A partition of 8 slots with a busy lower VM `be0` (VM 0, priority 6,
/// half-CU workgroups 1.7 ms long, its occupancy recorded) when `be0` is
/// set, a busy lower VM `be1` (VM 2, priority `be1_prio`) whose occupancy
/// is never recorded, and an RT (VM 1, priority 14) ringing a job of 38
/// half-CU workgroups of 20 us every 2 ms. Returns the periods in which
/// the RT co-resided.
fn rt_beside_unknown(be0: bool, be1_prio: u8) -> u64 {
    rt_beside_lower(be0, be1_prio, false)
}

/// [`rt_beside_unknown`], with `be1`'s occupancy recorded as whole-CU
/// workgroups when `be1_noted` is set.
fn rt_beside_lower(be0: bool, be1_prio: u8, be1_noted: bool) -> u64 {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(CUS, 8);
    let lo = w.vm(0, 6, 1, 1)[0];
    let rt = w.vm(1, 14, 1, 1)[0];
    let unknown = w.vm(2, be1_prio, 1, 1)[0];
    if be0 {
        w.s.note_dispatch_width(lo, 304);
        w.s.note_dispatch_kernel(lo, 304);
        w.s.note_dispatch_occupancy(lo, 1_728_000, true);
        w.submit(lo, 1000 * MS);
    }
    if be1_noted {
        w.s.note_dispatch_width(unknown, 304);
        w.s.note_dispatch_occupancy(unknown, 2_272_000, false);
    }
    w.submit(unknown, 1000 * MS);
    w.run_until(MS);
    let mut coresident = 0;
    for i in 0..PERIODS {
        w.s.note_dispatch_width(rt, 38);
        w.s.note_dispatch_kernel(rt, 38);
        w.s.note_dispatch_occupancy(rt, 20_000, true);
        w.submit(rt, 10_000);
        if w.s.cu_reservation(0) == Some((VmId(1), 0)) {
            coresident += 1;
        }
        w.run_until(MS + (i + 1) * 2 * MS);
    }
    coresident
}

/// 600002's shape: the unknown VM sits below the best effort that runs
/// beside the RT (starved there, never mapped): the RT co-resides at
/// every job. (Before the rule: never.)
#[test]
fn a_starved_lower_vm_of_unknown_occupancy_does_not_refuse_coresidence() {
    assert_eq!(rt_beside_unknown(true, 4), PERIODS);
}

/// The unknown VM may still hold CUs beside the RT: at the level that
/// runs beside it (a slice switch there maps it), or running itself. Its
/// occupancy then decides, as before: no co-residence.
#[test]
fn a_lower_vm_of_unknown_occupancy_that_may_run_beside_refuses_it() {
    assert_eq!(rt_beside_unknown(true, 6), 0);
    assert_eq!(rt_beside_unknown(false, 4), 0);
}

/// Only an occupancy never recorded is left out: a starved lower VM known
/// to hold whole CUs still refuses co-residence, as before (fuzz seed
/// 97092: leaving such VMs out let a lower RT co-reside under a higher
/// RT whose jobs then saved the best effort at each job, CWSR 15.1% of
/// the run against main's passing figures).
#[test]
fn a_starved_lower_vm_known_to_hold_whole_cus_still_refuses_it() {
    assert_eq!(rt_beside_lower(true, 4, true), 0);
}
