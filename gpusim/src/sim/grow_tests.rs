//! Tests of the dispatch pass's pending grows (`sim/grow.rs`): a batch
//! that has not started is noted while it has room, and CUs handed out by
//! noted grows are the CUs, batches and completions the general path
//! gives.

use super::testkit::*;
use super::*;
use abi::kernel::KernelKind;

#[test]
fn a_batch_before_its_start_is_noted_while_its_first_round_has_room() {
    let t = two_xcc_topo();
    let mut vm = TestVm::new(64 << 20);
    let mut q = vm.queue(&t, 64, 5);
    // 20 workgroups of 1 us on 16 CUs: at 0 the batch holds all 16 and
    // has not started (it starts at 0), 4 workgroups of its first round
    // still without a CU.
    vm.kernel(&mut q, KernelKind::Mark, 20, 64, 1_000, 1, false);
    let mut gpu = sim_no_floor(t, 1);
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    assert_eq!(gpu.free_cus(0), 0);
    let g = gpu.pending_grow(0).expect("a batch before its start");
    assert_eq!(g.room, 4);
    assert_eq!(g.packet, 0);
    let b = gpu.batches[g.batch as usize];
    assert_eq!((b.width, b.held, b.len()), (16, 16, 20));
    // The pass grew it by notes after its first CU: the batch's CUs are
    // the free CUs in order, each noted in the per-CU batch index.
    assert_eq!(gpu.grows_taken, 15);
    assert_eq!(
        gpu.batch_cus[g.batch as usize],
        (0..16).collect::<Vec<u32>>()
    );
    for cu in 0..16 {
        assert_eq!(gpu.batch_on(0, cu, 0), Some(g.batch as usize));
    }
    // Once it has started, nothing is noted: a CU would cut it.
    let mut ev = Vec::new();
    gpu.advance(1, &mut ev);
    assert_eq!(gpu.pending_grow(0), None);
    // An empty or unmapped slot has nothing to grow.
    assert_eq!(gpu.pending_grow(1), None);
    assert_eq!(gpu.pending_grow(u32::MAX), None);
    run_virtual(&mut gpu, 1, u64::MAX, &mut ev);
    vm.verify(&q).unwrap();
    assert_eq!(gpu.free_cus(0), 16);
}

/// Three queues of short workgroups (below the join-now cost: a CU given
/// to a running batch waits for its round end, in a new batch that grows
/// until then), one masked to CUs 4-11, mapped at 0, 3 and 7 us, two
/// kernels each. Returns every event, the grows taken, and per batch
/// index its final CU list.
fn flood(notes_off: bool) -> (Vec<GpuEvent>, u64, Vec<Vec<u32>>) {
    let t = two_xcc_topo();
    let mut vm = TestVm::new(64 << 20);
    let mut qs: Vec<GuestQueue> = (0..3).map(|_| vm.queue(&t, 64, 5)).collect();
    for (i, q) in qs.iter_mut().enumerate() {
        let i32 = i as u32;
        vm.kernel(
            q,
            KernelKind::Mark,
            300 + 70 * i32,
            4,
            2_000 + 300 * i as u64,
            i32,
            false,
        );
        vm.kernel(q, KernelKind::Mark, 90, 4, 1_500, 10 + i32, true);
    }
    let mut gpu = sim_no_floor(t, 1);
    gpu.grow_notes_off = notes_off;
    let mut mask = CuMask::none(16);
    for cu in 4..12 {
        mask.insert(cu);
    }
    let mut ev = Vec::new();
    for (i, at) in [0u64, 3_000, 7_000].into_iter().enumerate() {
        let now = run_virtual(&mut gpu, 0, at, &mut ev).max(at);
        gpu.advance(now, &mut ev);
        let req = map_req(&vm, &qs[i], i as u32, i as u64);
        let m = (i == 1).then_some(&mask);
        gpu.map_with_cu_mask(now, req, m).unwrap();
    }
    run_virtual(&mut gpu, 7_000, u64::MAX, &mut ev);
    for q in &qs {
        vm.verify(q).unwrap();
    }
    assert_eq!(gpu.free_cus(0), 16);
    (ev, gpu.grows_taken, gpu.batch_cus.clone())
}

#[test]
fn noted_grows_hand_out_the_cus_the_general_path_does() {
    let (ev, taken, cus) = flood(false);
    let (ev_off, taken_off, cus_off) = flood(true);
    assert_eq!(taken_off, 0);
    // Many CUs of this flood grow a batch waiting for its round end
    // (837 of them when this was written).
    assert!(taken > 500, "{taken} grows taken");
    assert_eq!(ev, ev_off);
    assert_eq!(cus, cus_off);
    for tag in 0..3 {
        assert_eq!(completions(&ev, tag).len(), 2, "queue {tag}");
    }
}
