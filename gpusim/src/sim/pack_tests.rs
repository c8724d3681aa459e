//! Occupancy across batches: a queue below its equal split of the
//! partition packs its later rounds beside other queues' workgroups
//! instead of waiting for their round ends, and a guest never delays a
//! batch by more than the batch's own length alone.

use super::testkit::*;
use super::*;
use abi::kernel::KernelKind;

/// A lower queue runs a kernel of 24 workgroups of 1 ms (16 CUs, then 8),
/// then, behind a barrier, `lo_next` workgroups of 1 ms (0: none). A higher queue
/// arrives at 1.9 ms with `kernels` kernels (each behind a barrier) of 16
/// workgroups of `hi_ns`; all declare VGPRs, so any two of them fit one
/// CU. Returns the higher queue's completions and the lower one's.
fn short_kernels_beside_a_long_one(
    kernels: u32,
    hi_ns: u64,
    lo_next: u32,
) -> (Vec<Nanos>, Vec<Nanos>, u64) {
    let t = two_xcc_topo();
    let mut vm = TestVm::new(64 << 20);
    let mut lo = vm.queue(&t, 64, 5);
    let mut hi = vm.queue(&t, 64, 5);
    vm.kernel_vgprs = 64;
    vm.kernel(&mut lo, KernelKind::Mark, 24, 256, 1_000_000, 1, false);
    if lo_next > 0 {
        vm.kernel(&mut lo, KernelKind::Mark, lo_next, 256, 1_000_000, 2, true);
    }
    vm.kernel_vgprs = 32;
    for k in 0..kernels {
        vm.kernel(&mut hi, KernelKind::Mark, 16, 64, hi_ns, 10 + k, k > 0);
    }
    let mut gpu = sim_no_floor(t, 1);
    gpu.map(0, map_req(&vm, &lo, 0, 0)).unwrap();
    let mut ev = Vec::new();
    gpu.advance(1_900_000, &mut ev);
    gpu.map(1_900_000, map_req(&vm, &hi, 1, 1)).unwrap();
    run_virtual(&mut gpu, 1_900_000, u64::MAX, &mut ev);
    vm.verify(&lo).unwrap();
    vm.verify(&hi).unwrap();
    assert_eq!(gpu.free_cus(0), 16);
    (
        completions(&ev, 1),
        completions(&ev, 0),
        gpu.stats().coresident_wgs,
    )
}

#[test]
fn a_queue_below_its_split_packs_its_rounds_beside_the_others() {
    // The higher queue arrives at 1.9 ms: 8 CUs are free (the lower
    // kernel's last round holds the other 8), its first kernel runs 2
    // rounds of 100 us on them. At 2 ms the lower queue's next kernel
    // wants CUs too: at each of the higher kernels' ends the free CUs
    // are split between the two, so the higher queue holds 8, 4, 2, 1
    // CUs. Below its equal split (8) it puts the rest of each kernel
    // beside the lower workgroups, where both fit (half rate each): each
    // kernel takes at most twice one round alone, 200 us. Before, its
    // rounds stayed on its own shrinking CUs until the rebalance at the
    // lower round's end (1 ms workgroups): 2.1, 2.5, 3.1 and 5.0 ms.
    let (hi, lo, guests) = short_kernels_beside_a_long_one(4, 100_000, 64);
    assert_eq!(hi, vec![2_100_000, 2_300_000, 2_500_000, 2_700_000]);
    assert!(guests > 0);
    // The lower queue does 88 ms of CU work and the higher 6.4: on 16 CUs
    // at least 5.9 ms. It ended at 7.1 ms before; packing costs it nothing.
    assert_eq!(lo[0], 2_000_000);
    assert!(lo[1] <= 6_400_000, "{lo:?}");
}

#[test]
fn a_queue_no_other_queue_contends_with_keeps_its_rounds() {
    // The same higher kernels with nothing behind the lower kernel's
    // barrier: no other queue wants CUs, so the higher queue keeps its
    // lock-step rounds on its own CUs and shares none (its first kernel 2
    // rounds on the 8 free CUs, then one round each on all 16).
    let (hi, lo, guests) = short_kernels_beside_a_long_one(4, 100_000, 0);
    assert_eq!(hi, vec![2_100_000, 2_200_000, 2_300_000, 2_400_000]);
    assert_eq!(guests, 0);
    assert_eq!(lo, vec![2_000_000]);
}

#[test]
fn a_cut_batch_keeps_at_most_its_own_length_of_guest_delay() {
    // A batch of 4 rounds of 10 us that guests delayed by 1 ms (each
    // placed against its whole stay, with the delay already counted) is
    // cut after its first round: it keeps at most that round's 10 us of
    // delay, since sharing at most halves its rate.
    let mut b = Batch {
        slot: 0,
        qgen: 0,
        id: 0,
        first: 0,
        end: 32,
        width: 8,
        held: 8,
        start: 0,
        cost: 10_000,
        gen: 0,
        live: true,
        armed: false,
        shifted: 1_000_000,
    };
    assert_eq!(b.solo_len(), 40_000);
    b.cut_at(8);
    assert_eq!(b.shifted, 10_000);
    assert_eq!(b.finish(), 20_000);
    // A delay within its length is kept.
    b.shifted = 4_000;
    b.cut_at(8);
    assert_eq!(b.shifted, 4_000);
}
