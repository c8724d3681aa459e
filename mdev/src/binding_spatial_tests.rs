//! Spatial sharing through the binding: dispatch widths read at doorbells,
//! CU sets carried to the simulated GPU.

use super::*;

#[test]
fn a_narrow_high_vm_gets_its_own_cus_beside_the_lower_vm() {
    let (mut rig, [(mut lo_vm, mut lo), (mut rt_vm, mut rt)]) = spx_lo_hi(|_| {});
    // lo: two kernels of 32 workgroups x 1 ms (two rounds of 16 CUs each).
    for k in 0..2 {
        lo_vm.kernel(&mut lo, KernelKind::Mark, 32, 64, 1_000_000, k, true);
    }
    rig.doorbell(QueueId(0), lo.wptr);
    rig.run(100_000, |_| false);
    assert_eq!(
        rig.gpu
            .running_cus(phys_slot(&rig, QueueId(0)).unwrap())
            .len(),
        16
    );
    // rt: 1-workgroup kernels of 20 us every 200 us.
    for i in 0..20u64 {
        rig.now = 100_000 + i * 200_000;
        rt_vm.kernel(&mut rt, KernelKind::Mark, 1, 64, 20_000, i as u32, true);
        rig.doorbell(QueueId(1), rt.wptr);
        rig.run(rig.now + 200_000, |_| false);
        // The scheduler sized 1 CU per XCC for rt (1 workgroup + 25%).
        assert_eq!(rig.b.scheduler().cu_reservation(0), Some((VmId(1), 1)));
        if let Some(s) = phys_slot(&rig, QueueId(0)) {
            let cus = rig.gpu.running_cus(s);
            assert!(cus.iter().all(|c| c % 8 != 7), "lo on rt's CUs: {cus:?}");
            assert!(rig.gpu.cu_mask(s).unwrap().count() == 14);
        }
    }
    rig.run(u64::MAX, |_| false);
    lo_vm.verify(&lo).unwrap();
    rt_vm.verify(&rt).unwrap();
    assert_eq!(rig.completions_of(1).len(), 20);
    // One save of lo when the reservation was set up, none per rt period.
    assert_eq!(rig.gpu.stats().saves, 1);
    assert!(rig.gpu.stats().cu_mask_changes >= 1);
}

#[test]
fn dispatch_widths_are_read_from_the_ring_within_bounds() {
    let (mut rig, [(mut lo_vm, mut lo), (mut hi_vm, mut hi)]) = spx_lo_hi(|_| {});
    lo_vm.kernel(&mut lo, KernelKind::Mark, 16, 64, 1_000_000, 0, true);
    rig.doorbell(QueueId(0), lo.wptr);
    // A wide kernel (16 workgroups: the whole GPU) behind a narrow one:
    // too wide to reserve, lo is preempted.
    hi_vm.kernel(&mut hi, KernelKind::Mark, 1, 64, 1000, 0, true);
    hi_vm.kernel(&mut hi, KernelKind::Mark, 16, 64, 1000, 1, true);
    rig.doorbell(QueueId(1), hi.wptr);
    assert_eq!(rig.b.scheduler().cu_reservation(0), None);
    assert_eq!(rig.gpu.stats().saves, 1);
    // A wild write pointer far past the ring: at most 16 packets are read,
    // nothing panics; the GPU reports the queue error.
    rig.doorbell(QueueId(1), u64::MAX / 32);
    rig.run(u64::MAX, |_| false);
    lo_vm.verify(&lo).unwrap();
}

#[test]
fn a_short_narrow_high_vm_with_small_workgroups_coresides_without_a_save() {
    let topo = spx_topo();
    let mut rig = Rig::new(topo.clone());
    let mut lo_vm = vm(&mut rig, 0, 2);
    lo_vm.kernel_vgprs = 128;
    let mut lo = lo_vm.queue(&topo, 64, 0);
    add(&mut rig, &lo_vm, 0, QueueId(0), 0, &lo);
    let mut rt_vm = vm(&mut rig, 1, 12);
    rt_vm.kernel_vgprs = 32;
    let mut rt = rt_vm.queue(&topo, 64, 0);
    add(&mut rig, &rt_vm, 1, QueueId(1), 1, &rt);
    // lo: 256-item workgroups at 128 VGPRs (a quarter of a CU), rung twice
    // (the first doorbell's scan is partial: no occupancy from it).
    for k in 0..2 {
        lo_vm.kernel(&mut lo, KernelKind::Mark, 32, 256, 1_000_000, k, true);
        rig.doorbell(QueueId(0), lo.wptr);
    }
    rig.run(100_000, |_| false);
    for i in 0..20u64 {
        rig.now = 100_000 + i * 200_000;
        rt_vm.kernel(&mut rt, KernelKind::Mark, 1, 64, 20_000, i as u32, true);
        rig.doorbell(QueueId(1), rt.wptr);
        rig.run(rig.now + 200_000, |_| false);
        if i > 0 {
            // From its second doorbell on: co-residence, lo keeps every CU.
            assert_eq!(rig.b.scheduler().cu_reservation(0), Some((VmId(1), 0)));
            let s = phys_slot(&rig, QueueId(0)).expect("lo keeps running");
            assert_eq!(rig.gpu.cu_mask(s).unwrap().count(), 16);
        }
    }
    rig.run(u64::MAX, |_| false);
    lo_vm.verify(&lo).unwrap();
    rt_vm.verify(&rt).unwrap();
    // rt's workgroups ran beside lo's (or on CUs lo left free); lo was
    // saved at most once (the first rt job, before its occupancy was known).
    assert_eq!(rig.completions_of(1).len(), 20);
    assert!(rig.gpu.stats().coresident_wgs > 0);
    assert!(rig.b.scheduler().vm_stats(VmId(0)).unwrap().preemptions <= 1);
}

/// The simulator behind a backend that gives no dispatch estimate (the
/// trait's default), as a real backend may.
struct NoEstimate(crate::sim::SimGpu);

impl PhysGpu for NoEstimate {
    fn topology(&self) -> &GpuTopology {
        self.0.topology()
    }
    fn map(&mut self, now: Nanos, req: MapRequest) -> Result<(), GpuError> {
        self.0.map(now, req)
    }
    fn unmap(&mut self, now: Nanos, slot: SlotId, mode: DequeueMode) -> Result<(), GpuError> {
        self.0.unmap(now, slot, mode)
    }
    fn unmap_within(
        &mut self,
        now: Nanos,
        slot: SlotId,
        mode: DequeueMode,
        timeout: Option<Nanos>,
    ) -> Result<(), GpuError> {
        self.0.unmap_within(now, slot, mode, timeout)
    }
    fn doorbell(&mut self, now: Nanos, slot: SlotId, wptr: u64) {
        self.0.doorbell(now, slot, wptr)
    }
    fn query(&self, slot: SlotId) -> Option<crate::backend::SlotStatus> {
        self.0.query(slot)
    }
    fn advance(&mut self, now: Nanos, out: &mut Vec<GpuEvent>) {
        self.0.advance(now, out)
    }
    fn next_deadline(&self) -> Option<Nanos> {
        self.0.next_deadline()
    }
    fn set_cu_mask(&mut self, now: Nanos, slot: SlotId, mask: &CuMask) -> Result<(), GpuError> {
        self.0.set_cu_mask(now, slot, mask)
    }
}

/// The co-residence above needs the backend's dispatch estimate: over a
/// backend without one, the same short, narrow RT tenant is never given
/// co-residence (its workgroups are assumed to fill their CUs), and both
/// VMs still run exactly once.
#[test]
fn without_a_dispatch_estimate_nothing_coresides() {
    let topo = spx_topo();
    let mut gpu = NoEstimate(crate::sim::SimGpu::new(topo.clone(), 7).unwrap());
    let mut b: Binding<usize> = Binding::new(&topo, SchedConfig::default()).unwrap();
    let mut mk = |id: u32, prio: u8, vgprs: u16| {
        b.add_vm(
            VmId(id),
            VmParams {
                priority: prio,
                ..Default::default()
            },
        )
        .unwrap();
        let mut tvm = TestVm::with_memory(Arc::new(SparseMemory::new(1 << 32)), 0x10_0000);
        tvm.kernel_vgprs = vgprs;
        let q = tvm.queue(&topo, 64, 0);
        b.add_queue(
            VmId(id),
            QueueId(id as u64),
            id as usize,
            5,
            q.mqd.clone(),
            tvm.dyn_mem(),
        )
        .unwrap();
        (tvm, q)
    };
    let (mut lo_vm, mut lo) = mk(0, 2, 128);
    let (mut rt_vm, mut rt) = mk(1, 12, 32);
    let mut out = Vec::new();
    let mut now = 0;
    let run_to = |b: &mut Binding<usize>, gpu: &mut NoEstimate, until: Nanos, now: &mut Nanos| {
        let mut evs = Vec::new();
        let mut out = Vec::new();
        while let Some(t) = gpu.next_deadline().filter(|t| *t <= until) {
            *now = (*now).max(t);
            gpu.advance(*now, &mut evs);
            for ev in evs.drain(..) {
                b.gpu_event(gpu, *now, ev, &mut out);
            }
            b.tick(gpu, *now, &mut out);
        }
        *now = (*now).max(until);
        b.tick(gpu, *now, &mut out);
    };
    for k in 0..2 {
        lo_vm.kernel(&mut lo, KernelKind::Mark, 32, 256, 1_000_000, k, true);
        b.doorbell(&mut gpu, now, QueueId(0), lo.wptr, &mut out);
    }
    run_to(&mut b, &mut gpu, 100_000, &mut now);
    for i in 0..10u64 {
        rt_vm.kernel(&mut rt, KernelKind::Mark, 1, 64, 20_000, i as u32, true);
        b.doorbell(&mut gpu, now, QueueId(1), rt.wptr, &mut out);
        assert_ne!(b.scheduler().cu_reservation(0), Some((VmId(1), 0)));
        run_to(&mut b, &mut gpu, now + 200_000, &mut now);
    }
    run_to(&mut b, &mut gpu, u64::MAX - 1, &mut now);
    lo_vm.verify(&lo).unwrap();
    rt_vm.verify(&rt).unwrap();
    assert_eq!(b.scheduler().spatial_stats().coresidences, 0);
    assert_eq!(gpu.0.stats().coresident_wgs, 0);
}

/// A hostile lower guest cannot make a drained reservation's owner wait
/// for its workgroups (docs/scheduling.md, "A drain that overruns"). Its
/// first doorbell rings a kernel of 5 ms workgroups on every CU behind a
/// 10 us one (a queue's first doorbell reads only its newest packet), its
/// second a 10 us kernel: the scheduler sees 10 us workgroups and drains
/// the RT's reservation instead of saving. At twice the wait the binding
/// finds the 5 ms workgroups still on the reserved CUs: the lower queue
/// is saved and the RT's 20 us job ends long before the 5 ms would have
/// (unchecked, it waited for them). Everything runs exactly once, and
/// the lower VM is never drained again while it stays busy.
#[test]
fn a_guest_whose_workgroups_outlast_a_drain_is_saved() {
    let (mut rig, [(mut lo_vm, mut lo), (mut rt_vm, mut rt)]) = spx_lo_hi(|_| {});
    // The RT's first job, before any lower work: its occupancy and the
    // save it would cost get measured.
    rt_vm.kernel(&mut rt, KernelKind::Mark, 1, 64, 20_000, 0, true);
    rig.doorbell(QueueId(1), rt.wptr);
    rig.run(200_000, |_| false);
    rig.now = 200_000;
    lo_vm.kernel(&mut lo, KernelKind::Mark, 16, 64, 5_000_000, 0, false);
    lo_vm.kernel(&mut lo, KernelKind::Mark, 1, 64, 10_000, 1, false);
    rig.doorbell(QueueId(0), lo.wptr);
    rig.run(210_000, |_| false);
    rig.now = 210_000;
    lo_vm.kernel(&mut lo, KernelKind::Mark, 1, 64, 10_000, 2, false);
    rig.doorbell(QueueId(0), lo.wptr);
    rig.run(300_000, |_| false);
    assert_eq!(
        rig.gpu
            .running_cus(phys_slot(&rig, QueueId(0)).unwrap())
            .len(),
        16,
        "the 5 ms workgroups fill the GPU"
    );
    let saves = rig.gpu.stats().saves;
    // The RT's second job.
    rig.now = 300_000;
    rt_vm.kernel(&mut rt, KernelKind::Mark, 1, 64, 20_000, 1, true);
    rig.doorbell(QueueId(1), rt.wptr);
    while rig.completions_of(1).len() < 2 && rig.step(10_000_000, |_| ()).is_some() {}
    let done_at = rig.now;
    assert_eq!(rig.completions_of(1).len(), 2);
    assert_eq!(rig.b.stats().drain_overruns, 1, "the drain was checked");
    assert!(rig.gpu.stats().saves > saves, "the lower queue was saved");
    assert!(
        done_at < 300_000 + 1_000_000,
        "the RT waited for the lower workgroups: done at {done_at} ns"
    );
    rig.run(u64::MAX, |_| false);
    lo_vm.verify(&lo).unwrap();
    rt_vm.verify(&rt).unwrap();
    assert_eq!(rig.b.stats().drain_overruns, 1);
}
