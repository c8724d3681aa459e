//! Waves without a save point, slow saves, dequeue timeouts and the reset
//! that ends an unfinished dequeue (issue 11).

use super::testkit::*;
use super::*;
use crate::topology::GpuTopology;
use abi::kernel::{flags, KernelKind};

fn gpu_and_vm(topo: &GpuTopology) -> (SimGpu, TestVm) {
    (SimGpu::new(topo.clone(), 0).unwrap(), TestVm::new(32 << 20))
}

fn unmapped_events(ev: &[GpuEvent]) -> Vec<(u64, DequeueMode, Box<V9Mqd>, Nanos)> {
    ev.iter()
        .filter_map(|e| match e {
            GpuEvent::Unmapped {
                tag, mode, mqd, at, ..
            } => Some((*tag, *mode, mqd.clone(), *at)),
            _ => None,
        })
        .collect()
}

fn timeouts(ev: &[GpuEvent]) -> Vec<(u64, DequeueMode, Nanos, Nanos)> {
    ev.iter()
        .filter_map(|e| match e {
            GpuEvent::DequeueTimedOut {
                tag,
                mode,
                waited_ns,
                at,
                ..
            } => Some((*tag, *mode, *waited_ns, *at)),
            _ => None,
        })
        .collect()
}

/// (wait_ns, save_ns) of each Unmapped event.
fn waits(ev: &[GpuEvent]) -> Vec<(Nanos, Nanos)> {
    ev.iter()
        .filter_map(|e| match e {
            GpuEvent::Unmapped {
                wait_ns, save_ns, ..
            } => Some((*wait_ns, *save_ns)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_save_of_waves_with_a_save_point_reports_no_wait() {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm) = gpu_and_vm(&topo);
    let mut q = vm.queue(&topo, 64, 5);
    vm.kernel(&mut q, KernelKind::Mark, 6, 4, 1000, 1, false);
    gpu.map(0, map_req(&vm, &q, 0, 7)).unwrap();
    gpu.unmap(400, SlotId(0), DequeueMode::SaveWaves).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 400, u64::MAX, &mut ev);
    let w = waits(&ev);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].0, 0, "{w:?}");
    assert!(w[0].1 > 0);
}

fn counters(vm: &TestVm, q: &GuestQueue) -> Vec<u32> {
    let Check::U32s { addr, expect } = q.checks[0].clone() else {
        panic!("not a Mark kernel")
    };
    (0..expect.len() as u64)
        .map(|i| vm.mem.read_u32(addr + 4 * i).unwrap())
        .collect()
}

#[test]
fn save_of_a_kernel_without_save_point_waits_for_its_waves_and_stays_exact() {
    let topo = GpuTopology::tiny(); // 4 CUs
    let (mut gpu, mut vm) = gpu_and_vm(&topo);
    let mut q = vm.queue(&topo, 64, 5);
    vm.kernel_flags = flags::NO_SAVE_POINT;
    vm.kernel(&mut q, KernelKind::Mark, 6, 4, 1000, 1, false);
    gpu.map(0, map_req(&vm, &q, 0, 7)).unwrap();
    gpu.unmap(400, SlotId(0), DequeueMode::SaveWaves).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 400, u64::MAX, &mut ev);
    let u = unmapped_events(&ev);
    assert_eq!(u.len(), 1);
    let (_, mode, mqd, at) = u[0].clone();
    assert_eq!(mode, DequeueMode::SaveWaves);
    // The 4 in-flight workgroups could not be saved: they finished at 1000,
    // then the records were written (trap + control records, no wave state).
    let c = &topo.cwsr;
    let rec = 32 + 32 + 4 * 24;
    assert_eq!(at, 1000 + c.trap_ns + rec * 1000 / c.save_bytes_per_us);
    // The wait (request at 400 to the waves' end at 1000) is reported
    // apart from the save: the scheduler bills it to the queue's VM.
    assert_eq!(waits(&ev), vec![(1000 - 400, at - 400)]);
    assert_eq!(gpu.stats().saved_wgs, 0);
    assert_eq!(gpu.stats().saves_waiting, 1);
    assert_eq!(gpu.stats().wgs_completed, 4);
    assert!(mqd.has_saved_state());
    q.mqd = *mqd;
    gpu.map(10_000, map_req(&vm, &q, 2, 7)).unwrap();
    run_virtual(&mut gpu, 10_000, u64::MAX, &mut ev);
    vm.verify(&q).unwrap();
    assert_eq!(counters(&vm, &q), vec![1; 6]);
    assert_eq!(gpu.stats().duplicate_effects, 0);
}

#[test]
fn a_hung_dequeue_times_out_and_a_reset_ends_it_while_a_corunner_stays_exact() {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm) = gpu_and_vm(&topo);
    let mut hung = vm.queue(&topo, 64, 5);
    let mut good = vm.queue(&topo, 64, 5);
    vm.kernel_flags = flags::NO_SAVE_POINT;
    vm.kernel(&mut hung, KernelKind::Mark, 2, 4, 1_000_000_000, 1, false);
    vm.kernel_flags = 0;
    for k in 0..4 {
        vm.kernel(&mut good, KernelKind::Mark, 8, 4, 1000, 2 + k, false);
    }
    gpu.map(0, map_req(&vm, &hung, 0, 0)).unwrap();
    gpu.map(0, map_req(&vm, &good, 1, 1)).unwrap();
    gpu.unmap_within(100, SlotId(0), DequeueMode::SaveWaves, Some(5_000))
        .unwrap();
    let mut ev = Vec::new();
    let mut now = 100;
    while timeouts(&ev).is_empty() {
        let t = gpu.next_deadline().expect("a timeout is armed");
        now = now.max(t);
        gpu.advance(now, &mut ev);
    }
    assert_eq!(
        timeouts(&ev),
        vec![(0, DequeueMode::SaveWaves, 5_000, 5_100)]
    );
    assert_eq!(
        gpu.query(SlotId(0)).unwrap().state,
        SlotState::Unmapping(DequeueMode::SaveWaves)
    );
    // A second dequeue is refused; a reset escalates.
    assert_eq!(
        gpu.unmap(now, SlotId(0), DequeueMode::SaveWaves),
        Err(GpuError::AlreadyUnmapping(SlotId(0)))
    );
    gpu.unmap(now, SlotId(0), DequeueMode::ResetWaves).unwrap();
    run_virtual(&mut gpu, now, u64::MAX, &mut ev);
    let u = unmapped_events(&ev);
    let hung_end: Vec<_> = u.iter().filter(|e| e.0 == 0).collect();
    assert_eq!(hung_end.len(), 1);
    assert_eq!(hung_end[0].1, DequeueMode::ResetWaves);
    assert_eq!(hung_end[0].3, 5_100 + topo.cwsr.trap_ns);
    assert_eq!(gpu.stats().escalated_resets, 1);
    assert_eq!(gpu.stats().killed_wgs, 2);
    assert_eq!(timeouts(&ev).len(), 1);
    // The co-runner ran to completion, every workgroup once.
    vm.verify(&good).unwrap();
    assert_eq!(vm.read_index(&good), 4);
    // The hung kernel's effects were never applied.
    assert_eq!(counters(&vm, &hung), vec![0; 2]);
    assert_eq!(gpu.free_cus(0), 4);
}

#[test]
fn a_save_slower_than_the_timeout_times_out() {
    let mut topo = GpuTopology::tiny();
    topo.cwsr.trap_ns = 1_000_000; // slow saves
    let (mut gpu, mut vm) = gpu_and_vm(&topo);
    let mut q = vm.queue(&topo, 64, 5);
    vm.kernel(&mut q, KernelKind::Mark, 6, 4, 1_000_000_000, 1, false);
    gpu.map(0, map_req(&vm, &q, 0, 3)).unwrap();
    gpu.unmap_within(10, SlotId(0), DequeueMode::SaveWaves, Some(10_000))
        .unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 10, 10_010, &mut ev);
    assert_eq!(
        timeouts(&ev),
        vec![(3, DequeueMode::SaveWaves, 10_000, 10_010)]
    );
    gpu.unmap(10_010, SlotId(0), DequeueMode::ResetWaves)
        .unwrap();
    run_virtual(&mut gpu, 10_010, u64::MAX, &mut ev);
    // One end only: the save's own completion (later) finds the slot gone.
    let u = unmapped_events(&ev);
    assert_eq!(u.len(), 1);
    assert_eq!(u[0].1, DequeueMode::ResetWaves);
    // The reset takes a trap too; the save's own timer may come first.
    assert!(u[0].3 <= 10_010 + topo.cwsr.trap_ns, "{}", u[0].3);
    assert_eq!(gpu.free_cus(0), 4);
}

#[test]
fn a_dequeue_that_finishes_in_time_reports_no_timeout() {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm) = gpu_and_vm(&topo);
    let mut q = vm.queue(&topo, 64, 5);
    vm.kernel_flags = flags::NO_SAVE_POINT;
    vm.kernel(&mut q, KernelKind::Mark, 6, 4, 1000, 1, false);
    gpu.map(0, map_req(&vm, &q, 0, 3)).unwrap();
    gpu.unmap_within(400, SlotId(0), DequeueMode::SaveWaves, Some(1_000_000))
        .unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 400, u64::MAX, &mut ev);
    assert!(timeouts(&ev).is_empty());
    assert_eq!(unmapped_events(&ev).len(), 1);
    // The slot is reused by another mapping before the stale timer: it
    // must not report against the new queue.
    let (mut gpu, mut vm) = gpu_and_vm(&topo);
    let mut q = vm.queue(&topo, 64, 5);
    vm.kernel(&mut q, KernelKind::Mark, 6, 4, 1000, 1, false);
    gpu.map(0, map_req(&vm, &q, 0, 3)).unwrap();
    gpu.unmap_within(0, SlotId(0), DequeueMode::DrainPipe, Some(50_000))
        .unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 0, 2_000, &mut ev);
    let (_, _, mqd, _) = unmapped_events(&ev)[0].clone();
    q.mqd = *mqd;
    let mut q2 = vm.queue(&topo, 64, 5);
    vm.kernel(&mut q2, KernelKind::Mark, 4, 4, 1_000_000, 9, false);
    gpu.map(2_000, map_req(&vm, &q2, 0, 4)).unwrap();
    gpu.unmap(2_000, SlotId(0), DequeueMode::SaveWaves).unwrap();
    run_virtual(&mut gpu, 2_000, u64::MAX, &mut ev);
    assert!(timeouts(&ev).is_empty());
}

/// (wait_ns, wait_held_ns) of each Unmapped event of `tag`.
fn held(ev: &[GpuEvent], of: u64) -> Vec<(Nanos, Nanos)> {
    ev.iter()
        .filter_map(|e| match e {
            GpuEvent::Unmapped {
                tag,
                wait_ns,
                wait_held_ns,
                ..
            } if *tag == of => Some((*wait_ns, *wait_held_ns)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_wait_reports_the_partition_time_its_waves_held() {
    // 4 CUs. The waiting queue's waves without a save point hold 2 of
    // them from the request at 400 to their end at 1000: 2 x 600 CU-ns,
    // 300 ns of the partition's time; the other 2 CUs were free for the
    // queue mapped at the request (its waves ran there).
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm) = gpu_and_vm(&topo);
    let mut nsp = vm.queue(&topo, 64, 5);
    let mut next = vm.queue(&topo, 64, 5);
    vm.kernel_flags = flags::NO_SAVE_POINT;
    vm.kernel(&mut nsp, KernelKind::Mark, 2, 4, 1000, 1, false);
    vm.kernel_flags = 0;
    vm.kernel(&mut next, KernelKind::Mark, 8, 4, 1000, 2, false);
    gpu.map(0, map_req(&vm, &nsp, 0, 7)).unwrap();
    gpu.unmap(400, SlotId(0), DequeueMode::SaveWaves).unwrap();
    gpu.map(400, map_req(&vm, &next, 1, 8)).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 400, u64::MAX, &mut ev);
    assert_eq!(held(&ev, 7), vec![(600, 2 * 600 / 4)]);
    vm.verify(&next).unwrap();
    // Waves that end at different times: each CU counts until its own
    // wave ends (here 4 CUs; 2 end at 1000, 2 at 3000: from a request at
    // 400, 2 x 600 + 2 x 2600 CU-ns, 1600 ns of the partition).
    let (mut gpu, mut vm) = gpu_and_vm(&topo);
    let mut q = vm.queue(&topo, 64, 5);
    vm.kernel_flags = flags::NO_SAVE_POINT;
    vm.kernel(&mut q, KernelKind::Mark, 2, 4, 1000, 1, false);
    vm.kernel(&mut q, KernelKind::Mark, 2, 4, 3000, 2, false);
    gpu.map(0, map_req(&vm, &q, 0, 7)).unwrap();
    gpu.unmap(400, SlotId(0), DequeueMode::SaveWaves).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 400, u64::MAX, &mut ev);
    assert_eq!(held(&ev, 7), vec![(2600, (2 * 600 + 2 * 2600) / 4)]);
    // Without a wait, nothing is held in one.
    let (mut gpu, mut vm) = gpu_and_vm(&topo);
    let mut q = vm.queue(&topo, 64, 5);
    vm.kernel(&mut q, KernelKind::Mark, 2, 4, 1000, 1, false);
    gpu.map(0, map_req(&vm, &q, 0, 7)).unwrap();
    gpu.unmap(400, SlotId(0), DequeueMode::SaveWaves).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 400, u64::MAX, &mut ev);
    assert_eq!(held(&ev, 7), vec![(0, 0)]);
}
