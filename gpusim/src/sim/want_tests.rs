//! Tests of the rebalance's count of the queues that want CUs
//! (`sim/want.rs`): the least split bounds every split the count can give,
//! and a rebalance that must cut still does when it skips the count.

use super::testkit::*;
use super::want::share_floor;
use super::*;
use abi::kernel::KernelKind;

#[test]
fn the_least_split_bounds_every_split_of_the_active_queues() {
    for cus in [1u32, 7, 16, 38, 64, 76, 152, 304] {
        for active in 1u32..=40 {
            let floor = share_floor(cus, active);
            for want in 1..=active {
                assert!(
                    floor <= cus / want,
                    "{cus} CUs, {active} active, {want} want: floor {floor}"
                );
            }
            // It is the split when every active queue wants CUs: no lower
            // bound is tighter.
            assert_eq!(floor, cus / active);
        }
        // No active queue: nothing is split (and no division by zero).
        assert_eq!(share_floor(cus, 0), cus);
    }
}

/// A lower queue's kernel of 64 workgroups of 100 us holds all 16 CUs (4
/// rounds); a higher queue maps at 50 us with 16 workgroups of 100 us.
/// Returns the higher queue's completion.
fn late_queue_beside_a_batch() -> Vec<Nanos> {
    let t = two_xcc_topo();
    let mut vm = TestVm::new(64 << 20);
    let mut lo = vm.queue(&t, 64, 5);
    let mut hi = vm.queue(&t, 64, 5);
    vm.kernel(&mut lo, KernelKind::Mark, 64, 64, 100_000, 1, false);
    vm.kernel(&mut hi, KernelKind::Mark, 16, 64, 100_000, 2, false);
    let mut gpu = sim_no_floor(t, 1);
    gpu.map(0, map_req(&vm, &lo, 0, 0)).unwrap();
    let mut ev = Vec::new();
    gpu.advance(50_000, &mut ev);
    gpu.map(50_000, map_req(&vm, &hi, 1, 1)).unwrap();
    run_virtual(&mut gpu, 50_000, u64::MAX, &mut ev);
    vm.verify(&lo).unwrap();
    vm.verify(&hi).unwrap();
    assert_eq!(gpu.free_cus(0), 16);
    completions(&ev, 1)
}

#[test]
fn the_rebalance_cuts_a_batch_above_the_split_without_a_guest_count() {
    // At 50 us the higher queue wants CUs and holds none: the guest pass
    // places nothing (no CU has room beside a whole-CU workgroup) and does
    // not count, so the rebalance looks for a batch above the least split
    // (16 / 2 = 8) itself: the lower batch (16 CUs) is cut at its round
    // end, 100 us. The CUs are then split 8 and 8: the higher kernel runs
    // 2 rounds and completes at 300 us. Without the cut it waited for the
    // lower kernel's 4 rounds: 500 us.
    assert_eq!(late_queue_beside_a_batch(), vec![300_000]);
}
