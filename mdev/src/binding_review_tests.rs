//! Hostile-review tests of the binding (guest CU masks against spatial
//! sharing, dispatch-width scans).

use super::*;

/// A high-priority VM whose own (legal) CU mask keeps it on the low CUs of
/// each XCC must not be given a host reservation of the top CUs only: the
/// intersection would be empty and its queue would never launch.
#[test]
fn a_reservation_never_leaves_the_reserved_queue_without_cus() {
    let (mut rig, [(mut lo_vm, mut lo), (mut rt_vm, mut rt)]) = spx_lo_hi(|rt| {
        // CUs 0..3 of each XCC only (CU c is SE c % 2, bit c / 2).
        rt.mqd.dw[abi::mqd::COMPUTE_STATIC_THREAD_MGMT_SE[0]] = 0b11;
        rt.mqd.dw[abi::mqd::COMPUTE_STATIC_THREAD_MGMT_SE[1]] = 0b11;
    });
    for k in 0..4 {
        lo_vm.kernel(&mut lo, KernelKind::Mark, 32, 64, 1_000_000, k, true);
    }
    rig.doorbell(QueueId(0), lo.wptr);
    rig.run(100_000, |_| false);
    rig.now = 100_000;
    rt_vm.kernel(&mut rt, KernelKind::Mark, 1, 64, 20_000, 0, true);
    rig.doorbell(QueueId(1), rt.wptr);
    // rt's 20 us kernel ends long before lo's 4 ms of work.
    rig.run(2_000_000, |_| false);
    if let Some(s) = phys_slot(&rig, QueueId(1)) {
        assert!(
            rig.gpu.cu_mask(s).is_some_and(|m| !m.is_empty()),
            "rt's queue has no CU to launch on"
        );
    }
    assert_eq!(
        rig.completions_of(1).len(),
        1,
        "rt starved by its own reservation"
    );
    rig.run(u64::MAX, |_| false);
    lo_vm.verify(&lo).unwrap();
    rt_vm.verify(&rt).unwrap();
}
