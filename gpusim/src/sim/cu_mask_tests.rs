//! CU masks in the simulator: guest MQD mask x host mask.

use super::testkit::*;
use super::*;
use abi::kernel::KernelKind;
use proptest::prelude::*;
use scheduler::CuSet;

fn host(set: CuSet) -> CuMask {
    let t = two_xcc_topo();
    CuMask::from_set(set, t.cus_per_xcc, t.xccs_per_partition())
}

fn set_of(code: u8) -> CuSet {
    match code % 3 {
        0 => CuSet::All,
        1 => CuSet::Top(1 + (code as u32 / 3) % 7),
        _ => CuSet::AllBut(1 + (code as u32 / 3) % 7),
    }
}

#[test]
fn guest_mask_follows_kfd_symmetric_layout() {
    let t = two_xcc_topo();
    let mut vm = TestVm::new(16 << 20);
    let mut q = vm.queue(&t, 64, 5);
    // SE0 bit 1 = CU 2, SE1 bit 0 = CU 1 (CU c is SE c % 2, bit c / 2).
    q.mqd.dw[abi::mqd::COMPUTE_STATIC_THREAD_MGMT_SE[0]] = 0b10;
    q.mqd.dw[abi::mqd::COMPUTE_STATIC_THREAD_MGMT_SE[1]] = 0b01;
    let m = CuMask::from_mqd(&q.mqd, 8, 2, 2);
    let cus: Vec<u32> = (0..16).filter(|&c| m.contains(c)).collect();
    // The same CUs on both XCCs.
    assert_eq!(cus, vec![1, 2, 9, 10]);
    let mut gpu = SimGpu::new(t, 1).unwrap();
    vm.kernel(&mut q, KernelKind::Mark, 12, 4, 1000, 3, false);
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    let mut running = gpu.running_cus(SlotId(0));
    running.sort_unstable();
    assert_eq!(running, vec![1, 2, 9, 10], "only the guest's CUs run");
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 0, u64::MAX, &mut ev);
    vm.verify(&q).unwrap();
    assert_eq!(gpu.free_cus(0), 16);
}

#[test]
fn a_narrowed_host_mask_applies_to_the_next_launches() {
    let t = two_xcc_topo();
    let mut vm = TestVm::new(16 << 20);
    let mut q = vm.queue(&t, 64, 5);
    vm.kernel(&mut q, KernelKind::Mark, 64, 4, 1000, 3, false);
    let mut gpu = SimGpu::new(t, 1).unwrap();
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    assert_eq!(gpu.running_cus(SlotId(0)).len(), 16);
    gpu.set_cu_mask(10, SlotId(0), &host(CuSet::AllBut(2)))
        .unwrap();
    // The first wave finishes where it is; the next ones avoid CUs 6, 7.
    let mut ev = Vec::new();
    gpu.advance(1000, &mut ev);
    let running = gpu.running_cus(SlotId(0));
    assert_eq!(running.len(), 12);
    assert!(running.iter().all(|&c| c % 8 < 6), "{running:?}");
    assert_eq!(gpu.stats().cu_mask_changes, 1);
    run_virtual(&mut gpu, 1000, u64::MAX, &mut ev);
    vm.verify(&q).unwrap();
}

/// 48 cases, or `PROPTEST_CASES` when set (an explicit `with_cases`
/// would override the variable).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Queues with random guest masks and host sets, narrowed and widened
    /// while they run, preempted with CWSR and mapped again: a workgroup
    /// only launches on a CU of its queue's mask, a CU runs one workgroup
    /// at a time, co-running queues with disjoint host sets never share a
    /// CU, and every effect lands exactly once.
    #[test]
    fn queues_run_only_on_their_cus(
        guest in proptest::collection::vec((1u32..16, 1u32..16), 3),
        sets in proptest::collection::vec(0u8..21, 3),
        changes in proptest::collection::vec((0usize..3, 0u8..21, 1u64..4000), 0..6),
        save_at in proptest::option::of((0usize..3, 1u64..3000)),
        groups in proptest::collection::vec(1u32..40, 3),
        seed in 0u64..100,
    ) {
        check_queues_run_only_on_their_cus(guest, sets, changes, save_at, groups, seed)?;
    }
}

/// The shrunk case of a lost effect: queue 2's host mask narrows at 2100
/// and its CWSR save comes at 2101 (see `queues_run_only_on_their_cus`).
#[test]
fn a_save_just_after_a_mask_change_loses_no_effect() {
    check_queues_run_only_on_their_cus(
        vec![(1, 8), (9, 1), (9, 8)],
        vec![4, 0, 0],
        vec![(2, 8, 2100), (2, 7, 1), (1, 10, 1)],
        Some((2, 2101)),
        vec![5, 4, 5],
        0,
    )
    .unwrap();
}

/// Body of `queues_run_only_on_their_cus` (also run on fixed cases).
fn check_queues_run_only_on_their_cus(
    guest: Vec<(u32, u32)>,
    sets: Vec<u8>,
    changes: Vec<(usize, u8, u64)>,
    save_at: Option<(usize, u64)>,
    groups: Vec<u32>,
    seed: u64,
) -> Result<(), TestCaseError> {
    {
        let t = two_xcc_topo();
        let mut vm = TestVm::new(64 << 20);
        let mut gpu = SimGpu::new(t.clone(), seed).unwrap();
        let mut qs: Vec<GuestQueue> = (0..3).map(|_| vm.queue(&t, 64, 5)).collect();
        let mut host_set: Vec<CuSet> = sets.iter().map(|&c| set_of(c)).collect();
        for (i, q) in qs.iter_mut().enumerate() {
            q.mqd.dw[abi::mqd::COMPUTE_STATIC_THREAD_MGMT_SE[0]] = guest[i].0;
            q.mqd.dw[abi::mqd::COMPUTE_STATIC_THREAD_MGMT_SE[1]] = guest[i].1;
            vm.kernel(
                q,
                KernelKind::Mark,
                groups[i],
                4,
                700 + 100 * i as u64,
                i as u32,
                false,
            );
            vm.kernel(q, KernelKind::Mark, groups[i], 4, 500, 7 + i as u32, true);
        }
        for (i, q) in qs.iter().enumerate() {
            let m = host(host_set[i]);
            gpu.map_with_cu_mask(0, map_req(&vm, q, i as u32, i as u64), Some(&m))
                .unwrap();
        }
        // Per queue: every host mask it had since its map (in-flight
        // workgroups of an older mask finish where they are).
        let guest_masks: Vec<CuMask> = qs
            .iter()
            .map(|q| CuMask::from_mqd(&q.mqd, 8, 2, 2))
            .collect();
        let mut since_map: Vec<Vec<CuSet>> = host_set.iter().map(|s| vec![*s]).collect();
        let mut changes = changes;
        changes.sort_by_key(|c| c.2);
        let mut saved: Option<usize> = None;
        let mut mapped = [true; 3];
        let mut now = 0;
        let mut ev = Vec::new();
        for _ in 0..100_000 {
            // Check the CUs in use.
            let mut all = Vec::new();
            for i in 0..3 {
                if !mapped[i] {
                    continue;
                }
                for cu in gpu.running_cus(SlotId(i as u32)) {
                    prop_assert!(
                        guest_masks[i].contains(cu),
                        "queue {i} on CU {cu} outside its MQD mask"
                    );
                    prop_assert!(
                        since_map[i].iter().any(|s| s.contains(cu % 8, 8)),
                        "queue {i} on CU {cu} outside every host set it had: {:?}",
                        since_map[i]
                    );
                    all.push((cu, i));
                }
            }
            all.sort_unstable();
            prop_assert!(
                all.windows(2).all(|w| w[0].0 != w[1].0),
                "a CU runs two workgroups: {all:?}"
            );
            let next = gpu.next_deadline();
            let change_due = changes.first().map(|c| c.2);
            let save_due = save_at.filter(|_| saved.is_none()).map(|s| s.1);
            let t_next = [next, change_due, save_due].into_iter().flatten().min();
            let Some(t_next) = t_next else { break };
            now = now.max(t_next);
            ev.clear();
            gpu.advance(now, &mut ev);
            for e in ev.drain(..) {
                if let GpuEvent::Unmapped {
                    tag, mqd, has_work, ..
                } = e
                {
                    let i = tag as usize;
                    qs[i].mqd = *mqd;
                    mapped[i] = false;
                    if has_work {
                        // Map again (restore) with the current host set.
                        let m = host(host_set[i]);
                        gpu.map_with_cu_mask(
                            now,
                            map_req(&vm, &qs[i], i as u32, i as u64),
                            Some(&m),
                        )
                        .unwrap();
                        mapped[i] = true;
                        since_map[i] = vec![host_set[i]];
                    }
                }
            }
            while changes.first().is_some_and(|c| c.2 <= now) {
                let (i, code, _) = changes.remove(0);
                host_set[i] = set_of(code);
                if mapped[i] {
                    gpu.set_cu_mask(now, SlotId(i as u32), &host(host_set[i]))
                        .unwrap();
                    since_map[i].push(host_set[i]);
                }
            }
            if let (Some((i, at)), None) = (save_at, saved) {
                if at <= now {
                    saved = Some(i);
                    if mapped[i] {
                        let _ = gpu.unmap(now, SlotId(i as u32), DequeueMode::SaveWaves);
                    }
                }
            }
        }
        for (i, m) in mapped.iter().enumerate() {
            if *m {
                // Masks may exclude every CU of the guest's: widen to finish.
                gpu.set_cu_mask(now, SlotId(i as u32), &host(CuSet::All))
                    .unwrap();
            }
        }
        run_virtual(&mut gpu, now, u64::MAX, &mut ev);
        for e in ev.drain(..) {
            if let GpuEvent::Unmapped {
                tag,
                mqd,
                has_work: true,
                ..
            } = e
            {
                let i = tag as usize;
                qs[i].mqd = *mqd;
                gpu.map(now, map_req(&vm, &qs[i], i as u32, i as u64))
                    .unwrap();
            }
        }
        run_virtual(&mut gpu, now, u64::MAX, &mut ev);
        for q in &qs {
            prop_assert_eq!(vm.verify(q), Ok(()));
        }
        prop_assert_eq!(gpu.free_cus(0), 16);
    }
    Ok(())
}

/// Lock-step batches under masks: a batch takes only CUs of its queue's
/// mask, a co-running queue gets the others, and a reset of the batched
/// queue hands back exactly the CUs its batch held (the free count and the
/// free set agree: `dispatch` asserts it in debug builds).
#[test]
fn a_batch_holds_cus_of_its_mask_and_a_reset_gives_them_back() {
    let t = two_xcc_topo();
    let mut vm = TestVm::new(32 << 20);
    let mut a = vm.queue(&t, 64, 5);
    let mut b = vm.queue(&t, 64, 5);
    // Queue a: guest mask SE0 bits 0..1 = CUs 0, 2, 4, 6 (+ 8, 10, 12, 14).
    a.mqd.dw[abi::mqd::COMPUTE_STATIC_THREAD_MGMT_SE[0]] = 0b1111;
    a.mqd.dw[abi::mqd::COMPUTE_STATIC_THREAD_MGMT_SE[1]] = 0;
    vm.kernel(&mut a, KernelKind::Mark, 4000, 4, 1000, 1, false);
    vm.kernel(&mut b, KernelKind::Mark, 64, 4, 1000, 2, false);
    let mut gpu = SimGpu::new(t, 1).unwrap();
    gpu.map(0, map_req(&vm, &a, 0, 0)).unwrap();
    let mut held = gpu.running_cus(SlotId(0));
    held.sort_unstable();
    assert_eq!(held, vec![0, 2, 4, 6, 8, 10, 12, 14]);
    gpu.map(0, map_req(&vm, &b, 1, 1)).unwrap();
    let mut other = gpu.running_cus(SlotId(1));
    other.sort_unstable();
    assert_eq!(other, vec![1, 3, 5, 7, 9, 11, 13, 15]);
    assert_eq!(gpu.free_cus(0), 0);
    let mut ev = Vec::new();
    gpu.advance(2_500, &mut ev);
    gpu.unmap(2_500, SlotId(0), DequeueMode::ResetWaves)
        .unwrap();
    assert!(gpu.running_cus(SlotId(0)).is_empty());
    // Queue b runs on every CU now, a's included.
    gpu.advance(3_000, &mut ev);
    let mut wide = gpu.running_cus(SlotId(1));
    wide.sort_unstable();
    assert_eq!(wide, (0..16).collect::<Vec<u32>>());
    run_virtual(&mut gpu, 3_000, u64::MAX, &mut ev);
    vm.verify(&b).unwrap();
    assert_eq!(gpu.free_cus(0), 16);
}
