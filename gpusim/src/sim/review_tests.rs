//! Hostile-review tests of the simulator: a reset ending a dequeue that
//! still holds saved waves' CUs.

use super::testkit::*;
use super::*;
use crate::topology::GpuTopology;
use abi::kernel::{flags, KernelKind};

/// A save waiting on waves without a save point, ended by a reset (the
/// preemption timeout's escalation): the CUs of both the saved and the
/// killed waves come back at once, and the free count and free set agree
/// (a debug assertion in the dispatcher fired before).
#[test]
fn a_reset_ending_a_waiting_save_frees_every_cu_once() {
    let topo = GpuTopology::tiny();
    let mut gpu = SimGpu::new(topo.clone(), 1).unwrap();
    let mut vm = TestVm::new(64 << 20);
    let mut q = vm.queue(&topo, 64, 5);
    // Two workgroups without a save point, two with one.
    vm.kernel_flags = flags::NO_SAVE_POINT;
    vm.kernel(&mut q, KernelKind::Mark, 2, 4, 1_000_000_000, 1, false);
    vm.kernel_flags = 0;
    vm.kernel(&mut q, KernelKind::Mark, 2, 4, 1_000_000_000, 2, false);
    gpu.map(0, map_req(&vm, &q, 0, 3)).unwrap();
    let cus = topo.cus_per_partition();
    gpu.unmap_within(10, SlotId(0), DequeueMode::SaveWaves, Some(10_000))
        .unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 10, 10_010, &mut ev);
    gpu.unmap(10_010, SlotId(0), DequeueMode::ResetWaves)
        .unwrap();
    assert_eq!(gpu.free_cus(0), cus, "every CU free right after the reset");
    run_virtual(&mut gpu, 10_010, u64::MAX, &mut ev);
    assert_eq!(gpu.free_cus(0), cus, "no CU freed twice");
}

/// A guest CU mask with no CU (`compute_static_thread_mgmt_se*` all zero)
/// can never launch a workgroup: the queue should get a clear queue error
/// at the map instead of sitting on its slot forever with its kernel never
/// finishing. Today it hangs silently (only that queue: other slots run).
#[test]
fn an_all_zero_guest_cu_mask_is_refused_at_the_map() {
    let topo = GpuTopology::tiny();
    let mut gpu = SimGpu::new(topo.clone(), 1).unwrap();
    let mut vm = TestVm::new(64 << 20);
    let mut q = vm.queue(&topo, 64, 5);
    for dw in abi::mqd::COMPUTE_STATIC_THREAD_MGMT_SE {
        q.mqd.dw[dw] = 0;
    }
    vm.kernel(&mut q, KernelKind::Mark, 2, 4, 1000, 1, false);
    // A queue no CU may run would sit on its slot forever: the map is
    // refused (the binding turns that into a queue error, code 24).
    let free = gpu.free_cus(0);
    let r = gpu.map(0, map_req(&vm, &q, 0, 3));
    assert!(
        matches!(
            r,
            Err(GpuError::BadMqd(
                crate::backend::QueueErrorReason::EmptyCuMask
            ))
        ),
        "{r:?}"
    );
    assert_eq!(gpu.free_cus(0), free);
}
