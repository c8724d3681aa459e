use super::testkit::*;
use super::*;
use crate::topology::{GpuTopology, PartitionMode};
use abi::aql::{Barrier, Packet};
use abi::kernel::KernelKind;
use proptest::prelude::*;

const KINDS: [KernelKind; 6] = [
    KernelKind::Mark,
    KernelKind::VecAdd,
    KernelKind::Saxpy,
    KernelKind::Fill,
    KernelKind::Checksum,
    KernelKind::Spin,
];

/// A small scheduler stand-in: maps queues with work onto free slots, drains idle ones.
struct World {
    gpu: SimGpu,
    vm: TestVm,
    qs: Vec<GuestQueue>,
    slot_of: Vec<Option<u32>>,
    unmapping: Vec<bool>,
    slot_free: Vec<bool>,
    now: u64,
    trace: Vec<GpuEvent>,
    errors: Vec<(u64, QueueErrorReason)>,
}

impl World {
    fn new(topo: GpuTopology, seed: u64, nq: usize) -> World {
        Self::with_params(topo, SimParams::default(), seed, nq)
    }

    fn with_params(topo: GpuTopology, params: SimParams, seed: u64, nq: usize) -> World {
        let gpu = SimGpu::with_params(topo.clone(), params, seed).unwrap();
        let mut vm = TestVm::new(64 << 20);
        let qs = (0..nq).map(|_| vm.queue(&topo, 64, 5)).collect();
        let ns = topo.user_slots().len();
        World {
            gpu,
            vm,
            qs,
            slot_of: vec![None; nq],
            unmapping: vec![false; nq],
            slot_free: vec![true; ns],
            now: 0,
            trace: Vec::new(),
            errors: Vec::new(),
        }
    }
    fn handle(&mut self, evs: Vec<GpuEvent>) {
        for e in evs {
            self.trace.push(e.clone());
            match e {
                GpuEvent::Unmapped { slot, tag, mqd, .. } => {
                    self.qs[tag as usize].mqd = *mqd;
                    self.slot_of[tag as usize] = None;
                    self.unmapping[tag as usize] = false;
                    self.slot_free[slot.0 as usize] = true;
                }
                GpuEvent::QueueIdle { slot, tag, at } => {
                    if !self.unmapping[tag as usize] {
                        self.unmapping[tag as usize] = true;
                        self.gpu.unmap(at, slot, DequeueMode::DrainPipe).unwrap();
                    }
                }
                GpuEvent::QueueError {
                    slot,
                    tag,
                    reason,
                    at,
                } => {
                    self.errors.push((tag, reason));
                    if !self.unmapping[tag as usize] {
                        self.unmapping[tag as usize] = true;
                        self.gpu.unmap(at, slot, DequeueMode::DrainPipe).unwrap();
                    }
                }
                GpuEvent::DequeueTimedOut { slot, at, .. } => {
                    self.gpu.unmap(at, slot, DequeueMode::ResetWaves).unwrap();
                }
                GpuEvent::PacketCompleted { .. } => {}
            }
        }
    }
    fn advance(&mut self, t: u64) {
        self.now = self.now.max(t);
        let mut ev = Vec::new();
        self.gpu.advance(self.now, &mut ev);
        self.handle(ev);
    }
    fn has_work(&self, q: usize) -> bool {
        let g = &self.qs[q];
        self.vm.read_index(g) < g.wptr || g.mqd.has_saved_state()
    }
    fn map(&mut self, q: usize, slot: u32) -> bool {
        if self.slot_of[q].is_some() || !self.slot_free[slot as usize] || !self.has_work(q) {
            return false;
        }
        let req = map_req(&self.vm, &self.qs[q], slot, q as u64);
        self.gpu.map(self.now, req).unwrap();
        self.slot_of[q] = Some(slot);
        self.slot_free[slot as usize] = false;
        true
    }
    fn save(&mut self, q: usize) {
        if let (Some(s), false) = (self.slot_of[q], self.unmapping[q]) {
            self.unmapping[q] = true;
            self.gpu
                .unmap(self.now, SlotId(s), DequeueMode::SaveWaves)
                .unwrap();
        }
    }
    fn submit(&mut self, q: usize, kind: KernelKind, groups: u32, cost: u64, seed: u32) {
        let g = &mut self.qs[q];
        if g.wptr - self.vm.read_index(g) >= g.ring_packets {
            return; // ring full
        }
        let w = self
            .vm
            .kernel(g, kind, groups, 4, cost, seed, seed.is_multiple_of(3));
        if let Some(s) = self.slot_of[q] {
            self.gpu.doorbell(self.now, SlotId(s), w);
        }
    }
    /// Map queues with work onto free slots and run to completion.
    fn finish(&mut self) {
        for _ in 0..1_000_000 {
            for q in 0..self.qs.len() {
                if let Some(s) = self.slot_free.iter().position(|f| *f) {
                    self.map(q, s as u32);
                }
            }
            match self.gpu.next_deadline() {
                Some(t) => self.advance(t),
                None => {
                    if (0..self.qs.len()).all(|q| !self.has_work(q) && self.slot_of[q].is_none()) {
                        return;
                    }
                    if !self.slot_free.iter().any(|f| *f) {
                        panic!("stuck: no deadline and no free slot");
                    }
                }
            }
        }
        panic!("did not finish");
    }
    fn verify_all(&self) {
        for (i, q) in self.qs.iter().enumerate() {
            if let Err(e) = self.vm.verify(q) {
                panic!("queue {i}: {e}");
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Map(usize, u32),
    Save(usize),
    Submit(usize, usize, u32, u64),
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..6usize, 0..4u32).prop_map(|(q, s)| Op::Map(q, s)),
        (0..6usize).prop_map(Op::Save),
        (0..6usize, 0..6usize, 1..12u32, 50..3000u64)
            .prop_map(|(q, k, g, c)| Op::Submit(q, k, g, c)),
        (0..4000u64).prop_map(Op::Wait),
    ]
}

fn run_ops(topo: GpuTopology, seed: u64, ops: &[Op]) -> World {
    run_ops_with(topo, SimParams::default(), seed, ops)
}

fn run_ops_with(topo: GpuTopology, params: SimParams, seed: u64, ops: &[Op]) -> World {
    let mut w = World::with_params(topo, params, seed, 6);
    for q in 0..6 {
        for k in 0..3 {
            w.submit(
                q,
                KINDS[(q + k) % 6],
                3 + k as u32,
                500 + 300 * k as u64,
                (q * 10 + k) as u32,
            );
        }
    }
    for (i, o) in ops.iter().enumerate() {
        match *o {
            Op::Map(q, s) => {
                w.map(q, s);
            }
            Op::Save(q) => w.save(q),
            Op::Submit(q, k, g, c) => w.submit(q, KINDS[k], g, c, i as u32 * 7919),
            Op::Wait(dt) => {
                let t = w.now + dt;
                w.advance(t);
            }
        }
    }
    w.finish();
    w
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any interleaving of map / SaveWaves / remap on other slots: every mark
    /// counter is exactly 1 and every functional result is correct.
    #[test]
    fn exactly_once_under_cwsr(seed in any::<u64>(), ops in proptest::collection::vec(op(), 1..80)) {
        let w = run_ops(GpuTopology::tiny(), seed, &ops);
        prop_assert!(w.errors.is_empty(), "errors: {:?}", w.errors);
        w.verify_all();
        prop_assert_eq!(w.gpu.stats().duplicate_effects, 0);
        let total: u64 = w.qs.iter().map(|q| q.wgs).sum();
        prop_assert_eq!(w.gpu.stats().wgs_completed, total);
    }

    /// Same seed, same inputs: identical event traces (jitter on). Another
    /// seed draws other jitter: the trace differs (the seed is really used).
    #[test]
    fn virtual_time_is_deterministic(seed in any::<u64>(), ops in proptest::collection::vec(op(), 1..40)) {
        let t = GpuTopology::tiny();
        let p = SimParams { jitter_permille: 300, ..Default::default() };
        let a = run_ops_with(t.clone(), p.clone(), seed, &ops);
        let b = run_ops_with(t.clone(), p.clone(), seed, &ops);
        prop_assert_eq!(&a.trace, &b.trace);
        prop_assert_eq!(a.gpu.stats(), b.gpu.stats());
        let c = run_ops_with(t, p, seed.wrapping_add(1), &ops);
        prop_assert_ne!(&a.trace, &c.trace);
        // Jitter only stretches workgroups: the work done is the same.
        prop_assert_eq!(a.gpu.stats().wgs_completed, c.gpu.stats().wgs_completed);
    }
}

#[test]
fn exactly_once_multi_partition() {
    let mut t = GpuTopology::tiny();
    t.xccs = 4;
    t.partition_mode = PartitionMode::Dpx;
    let ops: Vec<Op> = (0..60)
        .map(|i| match i % 4 {
            0 => Op::Map(i % 6, (i % 8) as u32),
            1 => Op::Wait(700),
            2 => Op::Save((i * 5) % 6),
            _ => Op::Wait(300),
        })
        .collect();
    let w = run_ops(t, 1, &ops);
    assert!(w.errors.is_empty());
    w.verify_all();
    assert!(w.gpu.stats().saves > 0 && w.gpu.stats().restores > 0);
}

fn one_queue(topo: GpuTopology) -> (SimGpu, TestVm, GuestQueue) {
    let gpu = SimGpu::new(topo.clone(), 0).unwrap();
    let mut vm = TestVm::new(32 << 20);
    let q = vm.queue(&topo, 64, 5);
    (gpu, vm, q)
}

fn unmapped(ev: &[GpuEvent]) -> Option<(V9Mqd, bool, u64, u64)> {
    ev.iter().find_map(|e| match e {
        GpuEvent::Unmapped {
            mqd,
            has_work,
            save_ns,
            at,
            ..
        } => Some(((**mqd).clone(), *has_work, *save_ns, *at)),
        _ => None,
    })
}

#[test]
fn save_restore_keeps_progress_and_models_latency() {
    let topo = GpuTopology::tiny(); // 4 CUs
    let (mut gpu, mut vm, mut q) = one_queue(topo.clone());
    vm.kernel(&mut q, KernelKind::Mark, 6, 4, 1000, 1, false);
    gpu.map(0, map_req(&vm, &q, 0, 7)).unwrap();
    assert_eq!(gpu.query(SlotId(0)).unwrap().inflight_wgs, 4);
    gpu.unmap(400, SlotId(0), DequeueMode::SaveWaves).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 400, u64::MAX, &mut ev);
    let (mqd, has_work, save_ns, at) = unmapped(&ev).unwrap();
    assert!(has_work && mqd.has_saved_state());
    // trap + (records + 2 wgs on the busiest XCC x state) / bandwidth
    let c = &topo.cwsr;
    let rec = 32 + 32 + 4 * 24;
    assert_eq!(
        save_ns,
        c.trap_ns + (rec + 2 * c.wg_state_bytes) * 1000 / c.save_bytes_per_us
    );
    assert_eq!(at, 400 + save_ns);
    assert_eq!(gpu.stats().saved_wgs, 4);
    assert_eq!(gpu.free_cus(0), 4);
    // Resume on another slot much later.
    q.mqd = mqd;
    let t0 = 1_000_000;
    gpu.map(t0, map_req(&vm, &q, 3, 7)).unwrap();
    assert_eq!(gpu.query(SlotId(3)).unwrap().state, SlotState::Restoring);
    let mut ev = Vec::new();
    run_virtual(&mut gpu, t0, u64::MAX, &mut ev);
    let done = ev
        .iter()
        .find_map(|e| matches!(e, GpuEvent::PacketCompleted { .. }).then(|| e.at()))
        .unwrap();
    let restore = gpu.stats().restore_ns_total;
    // 4 saved wgs resume with 600 ns left, then wgs 4,5 take 1000 ns.
    assert_eq!(done, t0 + restore + 600 + 1000);
    vm.verify(&q).unwrap();
    assert_eq!(vm.read_index(&q), 1);
    // CU time: 6 workgroups x 1000 ns, the 4 saved ones counted once.
    let mut cu = Vec::new();
    gpu.take_cu_time(&mut cu);
    let total: u64 = cu.iter().map(|(t, ns)| if *t == 7 { *ns } else { 0 }).sum();
    assert_eq!(total, 6 * 1000, "{cu:?}");
    cu.clear();
    gpu.take_cu_time(&mut cu);
    assert!(cu.is_empty(), "taken once");
}

/// CU time is the work done, credited as it is done: a save in the middle
/// of a round credits the part done before it (nothing is credited twice
/// or lost), so a window that ends during a long preempted kernel still
/// sees the compute its VM received.
#[test]
fn cu_time_is_the_work_done_through_saves() {
    let topo = GpuTopology::tiny(); // 4 CUs
    for save_at in [1, 2_500, 5_500, 15_999] {
        let (mut gpu, mut vm, mut q) = one_queue(topo.clone());
        vm.kernel(&mut q, KernelKind::Mark, 64, 4, 1000, 1, false);
        gpu.map(0, map_req(&vm, &q, 0, 7)).unwrap();
        gpu.unmap(save_at, SlotId(0), DequeueMode::SaveWaves)
            .unwrap();
        let mut ev = Vec::new();
        run_virtual(&mut gpu, save_at, u64::MAX, &mut ev);
        let (mqd, has_work, _, at) = unmapped(&ev).unwrap();
        assert!(has_work, "save at {save_at}");
        let mut cu = Vec::new();
        gpu.take_cu_time(&mut cu);
        let before: u64 = cu.iter().map(|(_, ns)| ns).sum();
        // At most the 4 CUs' time up to the save, at least the rounds
        // finished before it.
        assert!(before <= 4 * save_at, "{before} by {save_at}");
        assert!(
            before >= 4 * (save_at / 1000) * 1000,
            "{before} by {save_at}"
        );
        q.mqd = mqd;
        gpu.map(at + 1000, map_req(&vm, &q, 1, 7)).unwrap();
        let mut ev = Vec::new();
        run_virtual(&mut gpu, at + 1000, u64::MAX, &mut ev);
        vm.verify(&q).unwrap();
        cu.clear();
        gpu.take_cu_time(&mut cu);
        let after: u64 = cu.iter().map(|(_, ns)| ns).sum();
        assert_eq!(before + after, 64 * 1000, "save at {save_at}");
    }
}

#[test]
fn drain_pipe_finishes_inflight_and_keeps_rest() {
    let (mut gpu, mut vm, mut q) = one_queue(GpuTopology::tiny());
    vm.kernel(&mut q, KernelKind::Mark, 10, 4, 1000, 1, false);
    gpu.map(0, map_req(&vm, &q, 0, 1)).unwrap();
    gpu.unmap(500, SlotId(0), DequeueMode::DrainPipe).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 500, u64::MAX, &mut ev);
    let (mqd, has_work, save_ns, at) = unmapped(&ev).unwrap();
    assert_eq!((at, save_ns), (1000, 500));
    assert!(has_work && mqd.has_saved_state());
    assert_eq!(gpu.stats().wgs_completed, 4);
    q.mqd = mqd;
    gpu.map(2000, map_req(&vm, &q, 1, 1)).unwrap();
    run_virtual(&mut gpu, 2000, u64::MAX, &mut ev);
    vm.verify(&q).unwrap();
    assert_eq!(gpu.stats().duplicate_effects, 0);
}

#[test]
fn reset_waves_reruns_and_counts_duplicates() {
    let (mut gpu, mut vm, mut q) = one_queue(GpuTopology::tiny());
    vm.kernel(&mut q, KernelKind::Mark, 10, 4, 1000, 1, false);
    gpu.map(0, map_req(&vm, &q, 0, 1)).unwrap();
    gpu.unmap(1500, SlotId(0), DequeueMode::ResetWaves).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 1500, u64::MAX, &mut ev);
    let (mqd, has_work, _, _) = unmapped(&ev).unwrap();
    assert!(has_work && !mqd.has_saved_state());
    assert_eq!(gpu.stats().killed_wgs, 4);
    assert_eq!(gpu.stats().duplicate_effects, 4);
    q.mqd = mqd;
    gpu.map(5000, map_req(&vm, &q, 2, 1)).unwrap();
    run_virtual(&mut gpu, 5000, u64::MAX, &mut ev);
    // Workgroups 0..4 ran twice, the rest once.
    let Check::U32s { addr, .. } = q.checks[0].clone() else {
        panic!()
    };
    for i in 0..10u64 {
        let v = vm.mem.read_u32(addr + 4 * i).unwrap();
        assert_eq!(v, if i < 4 { 2 } else { 1 }, "counter {i}");
    }
}

#[test]
fn corunner_slows_queue_round_robin() {
    let topo = GpuTopology::tiny();
    let alone = {
        let (mut gpu, mut vm, mut q) = one_queue(topo.clone());
        vm.kernel(&mut q, KernelKind::Spin, 16, 1, 1000, 0, false);
        gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
        let mut ev = Vec::new();
        run_virtual(&mut gpu, 0, u64::MAX, &mut ev);
        ev.iter()
            .find(|e| matches!(e, GpuEvent::PacketCompleted { .. }))
            .unwrap()
            .at()
    };
    let (mut gpu, mut vm, mut hi) = one_queue(topo.clone());
    let mut lo = vm.queue(&topo, 64, 0);
    vm.kernel(&mut lo, KernelKind::Spin, 64, 1, 1000, 0, false);
    vm.kernel(&mut hi, KernelKind::Spin, 16, 1, 1000, 0, false);
    gpu.map(0, map_req(&vm, &lo, 1, 1)).unwrap();
    gpu.map(0, map_req(&vm, &hi, 0, 0)).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 0, u64::MAX, &mut ev);
    let shared = ev
        .iter()
        .find(|e| matches!(e, GpuEvent::PacketCompleted { tag: 0, .. }))
        .unwrap()
        .at();
    assert_eq!(alone, 4000);
    // Round robin over the two queues: each gets half of the 4 CUs, so the
    // 16-workgroup queue takes twice as long. Starving it (e.g. running the
    // 64-workgroup co-runner first) would give 20 us; never slowing it, 4 us.
    assert!(
        (2 * alone - 1000..=2 * alone + 1000).contains(&shared),
        "alone {alone} shared {shared}"
    );
}

#[test]
fn barrier_and_waits_for_other_queue() {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm, mut a) = one_queue(topo.clone());
    let mut b = vm.queue(&topo, 64, 5);
    vm.kernel(&mut b, KernelKind::Spin, 1, 1, 10_000, 0, false);
    let dep = b.signals[0];
    let sig = vm.signal();
    vm.push(
        &mut a,
        &Packet::barrier_and(
            Barrier {
                dep_signal: [dep, 0, 0, 0, 0],
                completion_signal: sig,
            },
            true,
        ),
    );
    a.signals.push(sig);
    vm.kernel(&mut a, KernelKind::Mark, 2, 1, 100, 0, false);
    gpu.map(0, map_req(&vm, &a, 0, 0)).unwrap();
    gpu.map(0, map_req(&vm, &b, 1, 1)).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 0, u64::MAX, &mut ev);
    let mark_done = ev
        .iter()
        .find(|e| {
            matches!(
                e,
                GpuEvent::PacketCompleted {
                    tag: 0,
                    dispatch_id: 1,
                    ..
                }
            )
        })
        .unwrap()
        .at();
    assert!(mark_done >= 10_100, "{mark_done}");
    vm.verify(&a).unwrap();
    vm.verify(&b).unwrap();
    // Barrier-OR with no deps completes at once.
    let sig2 = vm.signal();
    a.signals.push(sig2);
    let w = vm.push(
        &mut a,
        &Packet::barrier_or(
            Barrier {
                completion_signal: sig2,
                ..Default::default()
            },
            false,
        ),
    );
    gpu.doorbell(20_000, SlotId(0), w);
    run_virtual(&mut gpu, 20_000, u64::MAX, &mut ev);
    vm.verify(&a).unwrap();
}

// ------------------------------------------------------------- bad input

/// What a hostile queue must get.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// `map` refuses the MQD with this reason (the slot stays free).
    Refused(QueueErrorReason),
    /// `map` accepts; the queue stops with this queue error.
    Error(QueueErrorReason),
}

const MEM: u64 = 32 << 20;

/// A good queue runs 8 Mark workgroups (500 ns each, 4 CUs: done at 1000 ns
/// alone). At 100 ns, while it has 4 workgroups in flight, a corrupted queue is
/// mapped next to it (then rung with `doorbell`, default its write index). The
/// corrupted queue must get exactly `want`, and the good one must complete
/// correctly — at exactly 1000 ns if `timing` (the bad queue never ran).
fn bad_case(
    name: &str,
    want: Want,
    timing: bool,
    doorbell: Option<u64>,
    corrupt: impl FnOnce(&mut TestVm, &mut GuestQueue),
) {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm, mut good) = one_queue(topo.clone());
    assert_eq!(vm.mem.size(), MEM);
    let mut bad = vm.queue(&topo, 64, 5);
    vm.kernel(&mut good, KernelKind::Mark, 8, 1, 500, 0, false);
    vm.kernel(&mut bad, KernelKind::Mark, 8, 1, 500, 0, false);
    corrupt(&mut vm, &mut bad);
    gpu.map(0, map_req(&vm, &good, 0, 0)).unwrap();
    let mut ev = Vec::new();
    gpu.advance(100, &mut ev);
    assert_eq!(
        gpu.query(SlotId(0)).unwrap().inflight_wgs,
        4,
        "{name}: good queue running at the bad map"
    );
    let res = gpu.map(100, map_req(&vm, &bad, 1, 1));
    match want {
        Want::Refused(r) => {
            assert_eq!(res, Err(GpuError::BadMqd(r)), "{name}");
            assert!(gpu.query(SlotId(1)).is_none(), "{name}: slot taken");
            run_virtual(&mut gpu, 100, 1_000_000, &mut ev);
        }
        Want::Error(r) => {
            assert_eq!(res, Ok(()), "{name}");
            gpu.doorbell(150, SlotId(1), doorbell.unwrap_or(bad.wptr));
            let t = run_virtual(&mut gpu, 150, 1_000_000, &mut ev);
            assert_eq!(
                gpu.query(SlotId(1)).map(|s| s.state),
                Some(SlotState::Error(r)),
                "{name}"
            );
            gpu.unmap(t, SlotId(1), DequeueMode::SaveWaves).unwrap();
            run_virtual(&mut gpu, t, 1_000_000, &mut ev);
            let (_, has_work, _, _) = unmapped(&ev).unwrap_or_else(|| panic!("{name}: no unmap"));
            assert!(!has_work, "{name}");
        }
    }
    let errs: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            GpuEvent::QueueError { tag, reason, .. } => Some((*tag, *reason)),
            _ => None,
        })
        .collect();
    match want {
        Want::Refused(_) => assert_eq!(errs, vec![], "{name}"),
        Want::Error(r) => assert_eq!(errs, vec![(1, r)], "{name}"),
    }
    vm.verify(&good)
        .unwrap_or_else(|e| panic!("{name}: good queue: {e}"));
    let done = ev
        .iter()
        .find_map(|e| match e {
            GpuEvent::PacketCompleted { tag: 0, at, .. } => Some(*at),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{name}: good queue did not complete"));
    if timing {
        assert_eq!(done, 1000, "{name}: good queue slowed down");
    }
    assert_eq!(gpu.query(SlotId(0)).unwrap().state, SlotState::Active);
    assert!(gpu.query(SlotId(1)).is_none(), "{name}: slot not freed");
    assert_eq!(gpu.free_cus(0), 4, "{name}");
}

fn dispatch_field(vm: &TestVm, q: &GuestQueue, off: u64, v: u64) {
    vm.mem.write_u64(q.ring + off, v).unwrap();
}

/// Address held at `off` in packet 0 of `q` (descriptor @32, kernarg @40, signal @56).
fn packet_ptr(vm: &TestVm, q: &GuestQueue, off: u64) -> u64 {
    vm.mem.read_u64(q.ring + off).unwrap()
}

/// `packet_ptr` of the bad queue of [`bad_case`], before corruption (the
/// allocator is deterministic).
fn bad_queue_ptr(off: u64) -> u64 {
    let topo = GpuTopology::tiny();
    let (_, mut vm, mut good) = one_queue(topo.clone());
    let mut bad = vm.queue(&topo, 64, 5);
    vm.kernel(&mut good, KernelKind::Mark, 8, 1, 500, 0, false);
    vm.kernel(&mut bad, KernelKind::Mark, 8, 1, 500, 0, false);
    packet_ptr(&vm, &bad, off)
}

#[test]
fn bad_mqds_are_refused_at_map() {
    use QueueErrorReason as R;
    let topo = GpuTopology::tiny();
    let need_ctl = topo.ctl_stack_bytes_per_xcc();
    let need_ctx = topo.ctx_save_bytes_per_xcc();
    bad_case(
        "bad header",
        Want::Refused(R::BadMqdHeader(0x1234)),
        true,
        None,
        |_, q| q.mqd.dw[0] = 0x1234,
    );
    bad_case("not aql", Want::Refused(R::NotAql), true, None, |_, q| {
        q.mqd.dw[mqd::CP_HQD_AQL_CONTROL] = 0
    });
    bad_case(
        "ring out of range (crosses the end of memory)",
        Want::Refused(R::RingOutOfRange { addr: MEM - 2048 }),
        true,
        None,
        |_, q| {
            q.mqd.set64(
                mqd::CP_HQD_PQ_BASE_LO,
                mqd::CP_HQD_PQ_BASE_HI,
                (MEM - 2048) >> 8,
            )
        },
    );
    // QUEUE_SIZE encodes only powers of two (2^(QUEUE_SIZE + 3) bytes): a
    // non-power-of-two ring is not representable. Rings below
    // KFD_MIN_QUEUE_RING_SIZE (1 KiB) and above 2 GiB are refused (rules in
    // `crate::admission`).
    bad_case(
        "ring below one packet",
        Want::Refused(R::RingSize { queue_size: 1 }),
        true,
        None,
        |_, q| q.mqd.dw[mqd::CP_HQD_PQ_CONTROL] = 1,
    );
    bad_case(
        "ring below 1024 bytes",
        Want::Refused(R::RingSize { queue_size: 6 }),
        true,
        None,
        |_, q| q.mqd.dw[mqd::CP_HQD_PQ_CONTROL] = 6,
    );
    bad_case(
        "ring size field beyond 2 GiB",
        Want::Refused(R::RingSize { queue_size: 40 }),
        true,
        None,
        |_, q| q.mqd.dw[mqd::CP_HQD_PQ_CONTROL] = 40,
    );
    bad_case(
        "wptr poll address out of range",
        Want::Refused(R::PointerAddrOutOfRange { addr: MEM - 4 }),
        true,
        None,
        |_, q| q.mqd.set64(141, 142, MEM - 4),
    );
    bad_case(
        "rptr report address out of range",
        Want::Refused(R::PointerAddrOutOfRange { addr: MEM - 4 }),
        true,
        None,
        |_, q| {
            q.mqd.set64(
                mqd::CP_HQD_PQ_RPTR_REPORT_ADDR_LO,
                mqd::CP_HQD_PQ_RPTR_REPORT_ADDR_HI,
                MEM - 4,
            )
        },
    );
    bad_case(
        "rptr not packet aligned",
        Want::Refused(R::BadPointers),
        true,
        None,
        |_, q| q.mqd.dw[mqd::CP_HQD_PQ_RPTR] = 3,
    );
    bad_case(
        "CWSR area smaller than the formula",
        Want::Refused(R::CwsrTooSmall {
            need: need_ctx as u64,
            have: 4096,
        }),
        true,
        None,
        |_, q| q.mqd.dw[mqd::CP_HQD_CTX_SAVE_SIZE] = 4096,
    );
    bad_case(
        "control stack smaller than the formula",
        Want::Refused(R::CwsrTooSmall {
            need: need_ctl as u64,
            have: need_ctl as u64 - 8,
        }),
        true,
        None,
        |_, q| q.mqd.dw[mqd::CP_HQD_CNTL_STACK_SIZE] = need_ctl - 8,
    );
    bad_case(
        "cntl_stack_offset beyond cntl_stack_size",
        Want::Refused(R::BadCwsrLayout {
            cntl_stack_offset: need_ctl + 8,
            cntl_stack_size: need_ctl,
            ctx_save_size: need_ctx,
        }),
        true,
        None,
        |_, q| q.mqd.dw[mqd::CP_HQD_CNTL_STACK_OFFSET] = need_ctl + 8,
    );
    bad_case(
        "control stack larger than the save area",
        Want::Refused(R::BadCwsrLayout {
            cntl_stack_offset: need_ctl,
            cntl_stack_size: need_ctx + 4096,
            ctx_save_size: need_ctx,
        }),
        true,
        None,
        |_, q| q.mqd.dw[mqd::CP_HQD_CNTL_STACK_SIZE] = need_ctx + 4096,
    );
    bad_case(
        "CWSR area out of range",
        Want::Refused(R::CwsrOutOfRange { addr: MEM - 4096 }),
        true,
        None,
        |_, q| q.mqd.set64(171, 172, MEM - 4096),
    );
}

#[test]
fn bad_pointers_are_queue_errors() {
    use QueueErrorReason as R;
    let wdi = abi::queue::AMD_QUEUE_WRITE_DISPATCH_ID as u64;
    bad_case(
        "wptr beyond the ring at the doorbell",
        Want::Error(R::WptrBeyondRing {
            wptr: 66,
            rptr: 0,
            size: 64,
        }),
        true,
        Some(66),
        |vm, q| vm.mem.write_u64(q.amd_queue + wdi, 0).unwrap(),
    );
    bad_case(
        "wptr beyond the ring at map (poll address)",
        Want::Error(R::WptrBeyondRing {
            wptr: 1000,
            rptr: 0,
            size: 64,
        }),
        true,
        None,
        |vm, q| vm.mem.write_u64(q.amd_queue + wdi, 1000).unwrap(),
    );
    bad_case(
        "wptr near u64::MAX at the doorbell",
        Want::Error(R::WptrBeyondRing {
            wptr: u64::MAX,
            rptr: 0,
            size: 64,
        }),
        true,
        Some(u64::MAX),
        |vm, q| vm.mem.write_u64(q.amd_queue + wdi, 0).unwrap(),
    );
    bad_case(
        "wptr backwards at the doorbell",
        Want::Error(R::WptrBackwards { old: 1, new: 0 }),
        true,
        Some(0),
        // Header INVALID: the CP waits for it, the queue runs nothing.
        |vm, q| vm.mem.write(q.ring, &[abi::aql::TYPE_INVALID, 0]).unwrap(),
    );
    bad_case(
        "wptr backwards at map (poll address below the MQD's wptr)",
        Want::Error(R::WptrBackwards { old: 5, new: 3 }),
        true,
        None,
        |vm, q| {
            q.mqd.set_write_index(5);
            vm.mem.write_u64(q.amd_queue + wdi, 3).unwrap();
        },
    );
}

#[test]
fn bad_packets_are_queue_errors() {
    use abi::aql::DispatchError as D;
    use abi::kernel::DescriptorError as K;
    use QueueErrorReason as R;
    bad_case(
        "unsupported packet type",
        Want::Error(R::UnsupportedPacket(0x7f)),
        true,
        None,
        |vm, q| vm.mem.write(q.ring, &[0x7f, 0]).unwrap(),
    );
    bad_case(
        "dependency signal out of range",
        Want::Error(R::SignalOutOfRange { addr: MEM - 8 }),
        true,
        None,
        |vm, q| {
            let b = Barrier {
                dep_signal: [0, 0, MEM - 8, 0, 0],
                completion_signal: 0,
            };
            vm.mem
                .write(q.ring, &Packet::barrier_and(b, false).encode())
                .unwrap();
        },
    );
    bad_case(
        "completion signal crossing the end of memory",
        Want::Error(R::SignalOutOfRange { addr: MEM - 32 }),
        true,
        None,
        |vm, q| dispatch_field(vm, q, 56, MEM - 32),
    );
    bad_case(
        "completion signal wrapping the address space",
        Want::Error(R::SignalOutOfRange { addr: u64::MAX - 8 }),
        true,
        None,
        |vm, q| dispatch_field(vm, q, 56, u64::MAX - 8),
    );
    bad_case(
        "grid size 0",
        Want::Error(R::BadDispatch {
            why: D::ZeroGrid { dim: 1 },
        }),
        true,
        None,
        |vm, q| vm.mem.write_u32(q.ring + 16, 0).unwrap(),
    );
    bad_case(
        "workgroup size 0",
        Want::Error(R::BadDispatch {
            why: D::ZeroWorkgroupSize { dim: 0 },
        }),
        true,
        None,
        |vm, q| vm.mem.write(q.ring + 4, &[0, 0]).unwrap(),
    );
    bad_case(
        "more than 1024 work-items per workgroup",
        Want::Error(R::BadDispatch {
            why: D::WorkgroupTooLarge { items: 1056 },
        }),
        true,
        None,
        |vm, q| vm.mem.write(q.ring + 4, &[32, 0, 33, 0, 1, 0]).unwrap(),
    );
    bad_case(
        "more than 2^32 workgroups",
        Want::Error(R::BadDispatch {
            why: D::TooManyWorkgroups {
                grid: [65536, 65537, 1],
                workgroup: [1, 1, 1],
            },
        }),
        true,
        None,
        |vm, q| {
            vm.mem.write(q.ring + 4, &[1, 0, 1, 0, 1, 0]).unwrap();
            for (i, g) in [65536u32, 65537, 1].into_iter().enumerate() {
                vm.mem.write_u32(q.ring + 12 + 4 * i as u64, g).unwrap();
            }
        },
    );
    bad_case(
        "kernel descriptor out of range",
        Want::Error(R::DescriptorOutOfRange { addr: MEM - 32 }),
        true,
        None,
        |vm, q| dispatch_field(vm, q, 32, MEM - 32),
    );
    // The bad queue's descriptor (same deterministic layout as in bad_case).
    let kd = bad_queue_ptr(32);
    bad_case(
        "descriptor magic",
        Want::Error(R::BadDescriptor {
            addr: kd,
            why: K::BadMagic(0xdead),
        }),
        true,
        None,
        |vm, q| vm.mem.write_u32(packet_ptr(vm, q, 32), 0xdead).unwrap(),
    );
    bad_case(
        "descriptor version",
        Want::Error(R::BadDescriptor {
            addr: kd,
            why: K::BadVersion(7),
        }),
        true,
        None,
        |vm, q| vm.mem.write(packet_ptr(vm, q, 32) + 4, &[7, 0]).unwrap(),
    );
    bad_case(
        "unknown kernel kind",
        Want::Error(R::BadDescriptor {
            addr: kd,
            why: K::UnknownKind(99),
        }),
        true,
        None,
        |vm, q| vm.mem.write(packet_ptr(vm, q, 32) + 6, &[99, 0]).unwrap(),
    );
    bad_case(
        "kernarg out of range",
        Want::Error(R::KernargOutOfRange { addr: MEM - 8 }),
        true,
        None,
        |vm, q| dispatch_field(vm, q, 40, MEM - 8),
    );
    bad_case(
        "kernel buffer out of range",
        Want::Error(R::DataOutOfRange {
            addr: MEM - 8,
            len: 32,
        }),
        true,
        None,
        |vm, q| {
            let ka = packet_ptr(vm, q, 40);
            vm.mem.write_u64(ka, MEM - 8).unwrap();
        },
    );
}

fn saved_queue() -> (SimGpu, TestVm, GuestQueue) {
    let (mut gpu, mut vm, mut q) = one_queue(GpuTopology::tiny());
    vm.kernel(&mut q, KernelKind::Mark, 8, 1, 1000, 0, false);
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    gpu.unmap(300, SlotId(0), DequeueMode::SaveWaves).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 300, u64::MAX, &mut ev);
    q.mqd = unmapped(&ev).unwrap().0;
    (gpu, vm, q)
}

#[test]
fn hostile_saved_state_is_a_queue_error() {
    type Corrupt = fn(&TestVm, &mut GuestQueue);
    let cases: [(&str, Corrupt, QueueErrorReason); 6] = [
        (
            "flip a record byte",
            |vm, q| {
                let a = q.mqd.ctx_save_base() + q.mqd.cntl_stack_offset() as u64 + 40;
                let v = vm.mem.read_u32(a).unwrap();
                vm.mem.write_u32(a, v ^ 1).unwrap();
            },
            QueueErrorReason::BadSavedState("checksum mismatch"),
        ),
        (
            "bad magic",
            |vm, q| {
                vm.mem
                    .write_u32(q.mqd.ctx_save_base() + q.mqd.cntl_stack_offset() as u64, 0)
                    .unwrap();
            },
            QueueErrorReason::BadSavedState("bad magic"),
        ),
        (
            // The header is then read from 24 zero bytes below the record.
            "offset too low",
            |_, q| q.mqd.dw[mqd::CP_HQD_CNTL_STACK_OFFSET] -= 24,
            QueueErrorReason::BadSavedState("bad magic"),
        ),
        (
            // A 4 KiB "record": refused before the host buffers it.
            "offset 0",
            |_, q| q.mqd.dw[mqd::CP_HQD_CNTL_STACK_OFFSET] = 0,
            QueueErrorReason::BadSavedState("control stack larger than the largest record"),
        ),
        (
            "ring packet replaced by a barrier",
            |vm, q| {
                let b = Packet::barrier_and(Barrier::default(), false).encode();
                vm.mem.write(q.ring, &b).unwrap();
            },
            QueueErrorReason::BadSavedState("packet record does not match the ring"),
        ),
        (
            "record count beyond the write index",
            |vm, q| {
                // Re-seal a record claiming 2 packets (the queue has 1).
                let a = q.mqd.ctx_save_base() + q.mqd.cntl_stack_offset() as u64;
                let len = (q.mqd.cntl_stack_size() - q.mqd.cntl_stack_offset()) as usize;
                let mut b = vec![0u8; len + 32];
                vm.mem.read(a, &mut b[..32]).unwrap();
                vm.mem.read(a + 32, &mut b[64..]).unwrap();
                b[8] = 2;
                let c = super::cwsr::checksum(&b[32..]);
                b[24..32].copy_from_slice(&c.to_le_bytes());
                vm.mem.write(a - 32, &b).unwrap();
                q.mqd.dw[mqd::CP_HQD_CNTL_STACK_OFFSET] -= 32;
            },
            QueueErrorReason::BadSavedState("saved packets beyond the write index"),
        ),
    ];
    for (name, f, want) in cases {
        let (mut gpu, vm, mut q) = saved_queue();
        assert!(q.mqd.has_saved_state(), "{name}");
        f(&vm, &mut q);
        gpu.map(10_000, map_req(&vm, &q, 1, 0)).unwrap();
        let mut ev = Vec::new();
        gpu.advance(10_000, &mut ev);
        let errs: Vec<_> = ev
            .iter()
            .filter_map(|e| match e {
                GpuEvent::QueueError { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect();
        assert_eq!(errs, vec![want], "{name}");
        assert_eq!(gpu.query(SlotId(1)).unwrap().state, SlotState::Error(want));
        assert_eq!(gpu.free_cus(0), 4, "{name}");
    }
}

#[test]
fn map_errors() {
    let (mut gpu, vm, q) = one_queue(GpuTopology::tiny());
    assert_eq!(
        gpu.map(0, map_req(&vm, &q, 9, 0)).unwrap_err(),
        GpuError::NoSuchSlot(SlotId(9))
    );
    assert_eq!(
        gpu.unmap(0, SlotId(0), DequeueMode::SaveWaves).unwrap_err(),
        GpuError::NotMapped(SlotId(0))
    );
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    assert_eq!(
        gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap_err(),
        GpuError::SlotBusy(SlotId(0))
    );
    // Idle queue reports idle.
    let mut ev = Vec::new();
    gpu.advance(1, &mut ev);
    assert!(matches!(ev[0], GpuEvent::QueueIdle { .. }));
    gpu.doorbell(2, SlotId(3), 5); // unmapped slot: ignored
}

#[test]
fn real_time_driver_runs_the_model() {
    use std::sync::mpsc;
    let topo = GpuTopology::tiny();
    let gpu = SimGpu::new(topo.clone(), 0).unwrap();
    let mut vm = TestVm::new(32 << 20);
    let mut q = vm.queue(&topo, 64, 5);
    vm.kernel(&mut q, KernelKind::Mark, 8, 1, 200_000, 0, false);
    let (tx, rx) = mpsc::channel();
    let drv = RealTimeDriver::start(gpu, move |e| {
        let _ = tx.send(e);
    });
    let req = map_req(&vm, &q, 0, 0);
    let t0 = drv.with(|g, now| {
        g.map(now, req).unwrap();
        now
    });
    let e = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
    assert!(matches!(e, GpuEvent::PacketCompleted { .. }));
    assert_eq!(e.at(), t0 + 400_000);
    assert!(drv.now() >= e.at());
    let gpu = drv.stop();
    assert_eq!(gpu.stats().wgs_completed, 8);
    vm.verify(&q).unwrap();
}

#[test]
fn real_time_catch_up_is_bounded_so_callers_get_in_while_the_model_lags() {
    // A flood of 1 ns workgroups costs far more host time to simulate than
    // the model time it covers: the model lags wall time. With an event
    // budget, register-level calls (`with`) are served between bounded
    // catch-up steps instead of waiting for the whole flood.
    let topo = GpuTopology::tiny();
    let mut gpu = SimGpu::new(topo.clone(), 0).unwrap();
    gpu.set_event_budget(Some(256));
    let mut vm = TestVm::new(64 << 20);
    let mut q = vm.queue(&topo, 64, 5);
    let groups = 1_000_000;
    // Jitter makes every workgroup an event (no batching): the per-event
    // path is what the budget bounds.
    let p = SimParams {
        jitter_permille: 1,
        ..Default::default()
    };
    let mut gpu = SimGpu::with_params(topo.clone(), p, 0).unwrap();
    gpu.set_event_budget(Some(256));
    vm.kernel(&mut q, KernelKind::Mark, groups, 1, 1, 0, false);
    let drv = RealTimeDriver::start(gpu, |_| {});
    let req = map_req(&vm, &q, 0, 0);
    drv.with(|g, now| g.map(now, req).unwrap());
    // Sample progress every millisecond until the flood is done. Unbounded,
    // the driver would cover it in two or three long lock holds (each
    // catching up to the wall time the previous one used); bounded, callers
    // see it advance step by step.
    let mut seen = std::collections::BTreeSet::new();
    let t0 = std::time::Instant::now();
    loop {
        let done = drv.with(|g, _| g.stats().wgs_completed);
        if done == groups as u64 {
            break;
        }
        if done > 0 {
            seen.insert(done);
        }
        assert!(t0.elapsed().as_secs() < 60, "the model never caught up");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(
        seen.len() >= 5,
        "callers saw only {} intermediate states: {seen:?}",
        seen.len()
    );
    let gpu = drv.stop();
    assert!(gpu.stats().lagging_calls > 0);
    assert_eq!(gpu.stats().wgs_completed, groups as u64);
    vm.verify(&q).unwrap();
}

#[test]
fn exactly_once_many_save_cycles() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(42);
    let mut topo = GpuTopology::tiny();
    topo.cwsr.trap_ns = 200;
    topo.cwsr.restore_ns = 200;
    topo.cwsr.wg_state_bytes = 4096;
    let mut w = World::new(topo, 3, 6);
    for q in 0..6 {
        for k in 0..6 {
            w.submit(
                q,
                KINDS[(q + k) % 5],
                20 + k as u32,
                2000 + 100 * k as u64,
                (q * 31 + k) as u32,
            );
        }
    }
    for _ in 0..400 {
        let q = rng.gen_range(0..6);
        if w.slot_of[q].is_none() {
            if let Some(s) = (0..4).find(|s| w.slot_free[*s]) {
                w.map(q, s as u32);
            }
        } else {
            w.save(q);
        }
        let t = w.now + rng.gen_range(0..1500);
        w.advance(t);
    }
    w.finish();
    assert!(w.errors.is_empty(), "{:?}", w.errors);
    w.verify_all();
    let st = w.gpu.stats();
    assert!(
        st.saves > 50 && st.saved_wgs > 100 && st.restores > 50,
        "{st:?}"
    );
    assert_eq!(st.duplicate_effects, 0);
}

#[derive(Clone, Debug)]
enum Op2 {
    Map(usize, u32),
    Unmap(usize, u8),
    Wait(u64),
}

fn op2() -> impl Strategy<Value = Op2> {
    prop_oneof![
        (0..5usize, 0..4u32).prop_map(|(q, s)| Op2::Map(q, s)),
        (0..5usize, 1..4u8).prop_map(|(q, m)| Op2::Unmap(q, m)),
        (0..3000u64).prop_map(Op2::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random DrainPipe / ResetWaves / SaveWaves interleavings over Mark kernels
    /// of random sizes and per-packet costs (so later packets often complete
    /// before earlier ones): everything completes (no queue hangs on a
    /// completed packet's INVALID header after a remap), every counter is >= 1,
    /// every signal is exactly 0, and the extra increments are exactly the
    /// duplicates counted for ResetWaves (none without a reset).
    #[test]
    fn drain_reset_save_semantics(
        seed in any::<u64>(),
        ops in proptest::collection::vec(op2(), 1..60),
        shapes in proptest::collection::vec((1..7u32, 50..4000u64), 20),
    ) {
        let mut w = World::new(GpuTopology::tiny(), seed, 5);
        for q in 0..5 {
            for k in 0..4usize {
                let (groups, cost) = shapes[q * 4 + k];
                w.submit(q, KernelKind::Mark, groups, cost, k as u32 + 1);
            }
        }
        let mut resets = 0;
        for o in &ops {
            match *o {
                Op2::Map(q, s) => {
                    w.map(q, s);
                }
                Op2::Unmap(q, m) => {
                    if let (Some(s), false) = (w.slot_of[q], w.unmapping[q]) {
                        w.unmapping[q] = true;
                        let mode = DequeueMode::from_u32(m as u32).unwrap();
                        resets += (mode == DequeueMode::ResetWaves) as u32;
                        w.gpu.unmap(w.now, SlotId(s), mode).unwrap();
                    }
                }
                Op2::Wait(dt) => {
                    let t = w.now + dt;
                    w.advance(t);
                }
            }
        }
        w.finish();
        prop_assert!(w.errors.is_empty(), "{:?}", w.errors);
        let mut extra = 0u64;
        for q in &w.qs {
            for c in &q.checks {
                let Check::U32s { addr, expect } = c else { unreachable!() };
                for i in 0..expect.len() as u64 {
                    let v = w.vm.mem.read_u32(addr + 4 * i).unwrap();
                    prop_assert!(v >= 1, "lost effect");
                    extra += v as u64 - 1;
                }
            }
        }
        let st = w.gpu.stats();
        prop_assert_eq!(extra, st.duplicate_effects);
        for q in &w.qs {
            for &sig in &q.signals {
                prop_assert_eq!(w.vm.mem.read_u64(sig + 8).unwrap(), 0, "signal");
            }
            prop_assert_eq!(w.vm.read_index(q), q.wptr);
        }
        if resets == 0 {
            prop_assert_eq!(extra, 0);
            for q in &w.qs {
                prop_assert!(w.vm.verify(q).is_ok());
            }
        }
    }
}

#[test]
fn runs_on_guest_memory_mmap() {
    use vm_memory::{GuestAddress, GuestMemoryMmap};
    let topo = GpuTopology::tiny();
    let gm = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
    let mut vm = TestVm::with_memory(Arc::new(gm), 1 << 20);
    let mut q = vm.queue(&topo, 64, 5);
    vm.kernel(&mut q, KernelKind::VecAdd, 8, 16, 1000, 3, false);
    vm.kernel(&mut q, KernelKind::Mark, 8, 1, 1000, 0, true);
    let mut gpu = SimGpu::new(topo, 0).unwrap();
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    gpu.unmap(500, SlotId(0), DequeueMode::SaveWaves).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 500, u64::MAX, &mut ev);
    q.mqd = unmapped(&ev).unwrap().0;
    gpu.map(50_000, map_req(&vm, &q, 2, 0)).unwrap();
    run_virtual(&mut gpu, 50_000, u64::MAX, &mut ev);
    vm.verify(&q).unwrap();
    assert_eq!(vm.read_index(&q), 2);
}

// ------------------------------------------------- dequeue edge cases

/// Regression: ResetWaves after an out-of-order completion. Packet 1 (1 short
/// workgroup) completes while packet 0 (2 long ones) still runs: its signal is
/// decremented and its header INVALID. Before the fix the reset dropped the
/// whole window, the remap refetched packet 1's INVALID header and the queue
/// polled forever (and its signal would have gone to -1).
#[test]
fn reset_after_out_of_order_completion_resumes() {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm, mut q) = one_queue(topo);
    vm.kernel(&mut q, KernelKind::Mark, 2, 1, 10_000, 0, false);
    vm.kernel(&mut q, KernelKind::Mark, 1, 1, 100, 1, false);
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 0, 500, &mut ev);
    assert!(
        ev.iter().any(|e| matches!(
            e,
            GpuEvent::PacketCompleted {
                dispatch_id: 1,
                at: 100,
                ..
            }
        )),
        "packet 1 completes first: {ev:?}"
    );
    assert_eq!(vm.read_index(&q), 0, "packet 0 not retired");
    gpu.unmap(500, SlotId(0), DequeueMode::ResetWaves).unwrap();
    run_virtual(&mut gpu, 500, u64::MAX, &mut ev);
    let (mqd, has_work, _, _) = unmapped(&ev).unwrap();
    assert!(
        has_work && mqd.has_saved_state(),
        "packet 1 kept as a record"
    );
    // Packet 0 had no finished workgroup: nothing runs twice.
    assert_eq!(gpu.stats().duplicate_effects, 0);
    assert_eq!(gpu.stats().killed_wgs, 2);
    q.mqd = mqd;
    ev.clear();
    gpu.map(20_000, map_req(&vm, &q, 1, 0)).unwrap();
    // No saved waves: no modelled restore; packet 0 restarts at once.
    assert_eq!(gpu.query(SlotId(1)).unwrap().state, SlotState::Active);
    let end = run_virtual(&mut gpu, 20_000, 1_000_000, &mut ev);
    assert!(end < 1_000_000, "queue hangs");
    assert!(gpu.next_deadline().is_none(), "queue still polling");
    let done: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            GpuEvent::PacketCompleted {
                dispatch_id, at, ..
            } => Some((*dispatch_id, *at)),
            _ => None,
        })
        .collect();
    assert_eq!(done, vec![(0, 30_000)], "packet 1 must not complete twice");
    vm.verify(&q).unwrap(); // marks exactly 1, both signals exactly 0
    assert_eq!(vm.read_index(&q), 2);
    assert_eq!(gpu.stats().restore_ns_total, 0);
}

/// A reset counts as duplicates exactly the finished workgroups of the
/// incomplete dispatches, not completed packets.
#[test]
fn reset_counts_only_incomplete_dispatch_progress() {
    let (mut gpu, mut vm, mut q) = one_queue(GpuTopology::tiny());
    vm.kernel(&mut q, KernelKind::Mark, 6, 1, 1000, 0, false); // 4 + 2 workgroups
    vm.kernel(&mut q, KernelKind::Mark, 1, 1, 300, 1, false); // fits next to the 2
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    let mut ev = Vec::new();
    // t=1000: wgs 0..3 done; 4, 5 and packet 1 start; packet 1 done at 1300.
    gpu.unmap(1500, SlotId(0), DequeueMode::ResetWaves).unwrap();
    run_virtual(&mut gpu, 1500, u64::MAX, &mut ev);
    assert_eq!(gpu.stats().duplicate_effects, 4);
    assert_eq!(gpu.stats().killed_wgs, 2);
    q.mqd = unmapped(&ev).unwrap().0;
    gpu.map(5000, map_req(&vm, &q, 1, 0)).unwrap();
    run_virtual(&mut gpu, 5000, 1_000_000, &mut ev);
    assert_eq!(vm.read_index(&q), 2, "both packets retired");
    assert!(gpu.next_deadline().is_none(), "queue still polling");
    let Check::U32s { addr, .. } = q.checks[0].clone() else {
        panic!()
    };
    for i in 0..6u64 {
        let v = vm.mem.read_u32(addr + 4 * i).unwrap();
        assert_eq!(v, if i < 4 { 2 } else { 1 }, "counter {i}");
    }
    let Check::U32s { addr, .. } = q.checks[1].clone() else {
        panic!()
    };
    assert_eq!(
        vm.mem.read_u32(addr).unwrap(),
        1,
        "completed packet ran once"
    );
    for &s in &q.signals {
        assert_eq!(vm.mem.read_u64(s + 8).unwrap(), 0);
    }
}

/// Drain records without saved waves are taken at map at no modelled cost;
/// the queue continues at once.
#[test]
fn drain_records_restore_without_cost() {
    let (mut gpu, mut vm, mut q) = one_queue(GpuTopology::tiny());
    vm.kernel(&mut q, KernelKind::Mark, 10, 4, 1000, 1, false);
    gpu.map(0, map_req(&vm, &q, 0, 1)).unwrap();
    gpu.unmap(500, SlotId(0), DequeueMode::DrainPipe).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 500, u64::MAX, &mut ev);
    q.mqd = unmapped(&ev).unwrap().0;
    assert!(q.mqd.has_saved_state());
    ev.clear();
    gpu.map(2000, map_req(&vm, &q, 1, 1)).unwrap();
    assert_eq!(gpu.query(SlotId(1)).unwrap().state, SlotState::Active);
    assert_eq!(gpu.query(SlotId(1)).unwrap().inflight_wgs, 4);
    run_virtual(&mut gpu, 2000, u64::MAX, &mut ev);
    let done = ev.iter().find_map(|e| match e {
        GpuEvent::PacketCompleted { at, .. } => Some(*at),
        _ => None,
    });
    // wgs 4..7 then 8, 9: two rounds of 1000 ns from the map.
    assert_eq!(done, Some(4000));
    assert_eq!(gpu.stats().restores, 1);
    assert_eq!(gpu.stats().restore_ns_total, 0);
    vm.verify(&q).unwrap();
}

/// Memory that refuses writes to one range once armed (a failing DMA target).
struct FaultyMemory {
    inner: crate::mem::VecMemory,
    deny: std::sync::Mutex<Option<(u64, u64)>>,
}

impl DmaMemory for FaultyMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), crate::mem::MemError> {
        self.inner.read(gpa, buf)
    }
    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), crate::mem::MemError> {
        if let Some((lo, hi)) = *self.deny.lock().unwrap() {
            if gpa < hi && gpa + buf.len() as u64 > lo {
                return Err(crate::mem::MemError::OutOfRange {
                    gpa,
                    len: buf.len() as u64,
                });
            }
        }
        self.inner.write(gpa, buf)
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// A dequeue whose control records cannot be written loses the queue's
/// progress: that is a queue error (not a log line), and the dequeue still
/// completes and frees the CUs.
#[test]
fn dequeue_record_write_failure_is_a_queue_error() {
    for mode in [
        DequeueMode::DrainPipe,
        DequeueMode::SaveWaves,
        DequeueMode::ResetWaves,
    ] {
        let topo = GpuTopology::tiny();
        let fm = Arc::new(FaultyMemory {
            inner: crate::mem::VecMemory::new(32 << 20),
            deny: std::sync::Mutex::new(None),
        });
        let mut vm = TestVm::with_memory(fm.clone(), 0x1000);
        let mut q = vm.queue(&topo, 64, 5);
        if mode == DequeueMode::ResetWaves {
            // Packet 1 completes out of order: ResetWaves keeps it as a record.
            vm.kernel(&mut q, KernelKind::Mark, 2, 1, 10_000, 0, false);
            vm.kernel(&mut q, KernelKind::Mark, 1, 1, 100, 1, false);
        } else {
            // Partly dispatched at the dequeue: records to write.
            vm.kernel(&mut q, KernelKind::Mark, 10, 1, 1000, 0, false);
        }
        let mut gpu = SimGpu::new(topo.clone(), 0).unwrap();
        gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
        let mut ev = Vec::new();
        gpu.advance(500, &mut ev);
        let base = q.mqd.ctx_save_base();
        let area = topo.ctx_save_bytes_per_xcc() as u64 * topo.xccs_per_partition() as u64;
        *fm.deny.lock().unwrap() = Some((base, base + area));
        gpu.unmap(500, SlotId(0), mode).unwrap();
        ev.clear();
        run_virtual(&mut gpu, 500, u64::MAX, &mut ev);
        let errs: Vec<_> = ev
            .iter()
            .filter_map(|e| match e {
                GpuEvent::QueueError { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect();
        assert_eq!(errs.len(), 1, "{mode:?}: {ev:?}");
        assert!(
            matches!(errs[0], QueueErrorReason::CwsrOutOfRange { addr } if addr >= base && addr < base + area),
            "{mode:?}: {errs:?}"
        );
        let (mqd, has_work, _, _) = unmapped(&ev).expect("dequeue completes");
        assert!(!has_work && !mqd.has_saved_state(), "{mode:?}");
        assert!(gpu.query(SlotId(0)).is_none());
        assert_eq!(gpu.free_cus(0), 4, "{mode:?}");
        assert_eq!(gpu.stats().queue_errors, 1);
    }
}

// ------------------------------------------------- arithmetic on guest values

/// A Spin kernarg near u64::MAX is refused at dispatch (its modelled cost
/// exceeds the longest workgroup): a queue error naming the cost, not a
/// corrupt-save error at a later restore.
#[test]
fn huge_spin_is_refused_at_dispatch() {
    let topo = GpuTopology::tiny();
    let p = SimParams {
        jitter_permille: 1000,
        ..Default::default()
    };
    let (_, mut vm, mut q) = one_queue(topo.clone());
    let mut gpu = SimGpu::with_params(topo, p, 9).unwrap();
    vm.kernel(&mut q, KernelKind::Spin, 4, 1, 1000, 0, false);
    let ka = packet_ptr(&vm, &q, 40);
    vm.mem.write_u64(ka, u64::MAX - 5).unwrap();
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    let mut ev = Vec::new();
    gpu.advance(0, &mut ev);
    assert!(
        ev.iter().any(|e| matches!(
            e,
            GpuEvent::QueueError {
                reason: QueueErrorReason::BadDispatch {
                    why: abi::aql::DispatchError::CostOverflow { workgroups: 4, .. }
                },
                ..
            }
        )),
        "{ev:?}"
    );
    assert_eq!(gpu.query(SlotId(0)).unwrap().inflight_wgs, 0);
    gpu.advance(1_000_000, &mut ev);
    gpu.unmap(1_000_000, SlotId(0), DequeueMode::ResetWaves)
        .unwrap();
    run_virtual(&mut gpu, 1_000_000, u64::MAX, &mut ev);
    assert!(unmapped(&ev).is_some());
    assert_eq!(gpu.free_cus(0), 4);
}

/// Zero-cost workgroups take the modelled floor (`sim.wg_floor_ns`): time
/// advances per workgroup.
#[test]
fn zero_cost_workgroups_take_the_floor() {
    let (mut gpu, mut vm, mut q) = one_queue(GpuTopology::tiny());
    vm.kernel(&mut q, KernelKind::Mark, 10, 1, 0, 0, false);
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 0, u64::MAX, &mut ev);
    let done = ev.iter().find_map(|e| match e {
        GpuEvent::PacketCompleted { at, .. } => Some(*at),
        _ => None,
    });
    // 10 workgroups on 4 CUs at the floor each: 3 rounds.
    let floor = SimParams::default().wg_floor_ns.max(MIN_WG_NS);
    assert_eq!(done, Some(3 * floor));
    vm.verify(&q).unwrap();
}

/// The largest workgroup (1024 work-items) with a partial last workgroup.
#[test]
fn max_workgroup_size_effects_are_exact() {
    let (mut gpu, mut vm, mut q) = one_queue(GpuTopology::tiny());
    vm.kernel(&mut q, KernelKind::VecAdd, 3, 1024, 1000, 7, false);
    vm.kernel(&mut q, KernelKind::Saxpy, 2, 1024, 1000, 8, false);
    vm.kernel(&mut q, KernelKind::Fill, 3, 1024, 1000, 9, false);
    vm.kernel(&mut q, KernelKind::Checksum, 5, 1024, 1000, 10, false);
    // Shrink the VecAdd to 2500 elements: workgroup 2 covers 2048..2500.
    let ka = packet_ptr(&vm, &q, 40);
    vm.mem.write_u32(ka + 24, 2500).unwrap();
    let Check::U32s { addr, expect } = q.checks[0].clone() else {
        panic!()
    };
    let mut e = expect.clone();
    e.truncate(2500);
    e.resize(3072, 0);
    q.checks[0] = Check::U32s { addr, expect: e };
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 0, u64::MAX, &mut ev);
    vm.verify(&q).unwrap();
}

// ------------------------------------------------------------- fuzzing

/// A hostile packet: raw bytes plus selectors that steer fields towards
/// addresses and shapes the simulator accepts, so the fuzz reaches execution.
#[derive(Clone, Debug)]
struct HostilePacket {
    raw: Vec<u8>,
    typ: u8,
    kernel: u8,
    kernarg: u8,
    signal: u8,
    shape: (u16, u16),
}

fn hostile_packet() -> impl Strategy<Value = HostilePacket> {
    (
        proptest::collection::vec(any::<u8>(), 64),
        any::<u8>(),
        0..8u8,
        0..8u8,
        0..8u8,
        (1..80u16, 1..6u16),
    )
        .prop_map(|(raw, typ, kernel, kernarg, signal, shape)| HostilePacket {
            raw,
            typ,
            kernel,
            kernarg,
            signal,
            shape,
        })
}

#[derive(Clone, Debug)]
struct Hostile {
    packets: Vec<HostilePacket>,
    /// Raw descriptor bytes; `kd_fix` 0 = raw, else valid magic/version and
    /// kind `kd_fix % 7` (0 is unknown), with a small cost if bit 7 is set.
    kd: Vec<u8>,
    kd_fix: u8,
    /// Raw kernarg bytes; `ka_fix` points the buffers of the descriptor's
    /// kind into a scratch area and makes its element count small.
    ka: Vec<u8>,
    ka_fix: bool,
    /// (MQD dword selector, value, whether to use the value raw or as a delta).
    mqd_pokes: Vec<(usize, u32, bool)>,
    /// Control stack: bytes below `cntl_stack_size`, sealed with a valid
    /// header (magic, version, counts, checksum) or not.
    stack: Option<(Vec<u8>, bool)>,
    doorbells: Vec<(u8, u64)>,
    /// Keep every field in the ranges the simulator accepts (only the values
    /// vary: kinds, counts, costs, overlapping buffers, shared signals), so
    /// about half the cases reach execution rather than a fetch-time error.
    tame: bool,
}

const POKE_DWORDS: [usize; 14] = [
    mqd::HEADER,
    mqd::CP_HQD_PQ_BASE_LO,
    mqd::CP_HQD_PQ_BASE_HI,
    mqd::CP_HQD_PQ_RPTR,
    mqd::CP_HQD_PQ_RPTR_REPORT_ADDR_LO,
    mqd::CP_HQD_PQ_WPTR_POLL_ADDR_LO,
    mqd::CP_HQD_PQ_CONTROL,
    mqd::CP_HQD_CTX_SAVE_BASE_ADDR_LO,
    mqd::CP_HQD_CNTL_STACK_OFFSET,
    mqd::CP_HQD_CNTL_STACK_SIZE,
    mqd::CP_HQD_CTX_SAVE_SIZE,
    mqd::CP_HQD_AQL_CONTROL,
    mqd::CP_HQD_PQ_WPTR_LO,
    mqd::CP_HQD_PQ_WPTR_HI,
];

fn hostile() -> impl Strategy<Value = Hostile> {
    (
        proptest::collection::vec(hostile_packet(), 1..6),
        proptest::collection::vec(any::<u8>(), 64),
        any::<u8>(),
        proptest::collection::vec(any::<u8>(), 32),
        proptest::bool::weighted(0.8),
        proptest::option::weighted(0.3, (0..POKE_DWORDS.len(), any::<u32>(), any::<bool>()))
            .prop_map(|p| p.into_iter().collect::<Vec<_>>()),
        proptest::option::weighted(
            0.15,
            (
                proptest::collection::vec(any::<u8>(), 0..200),
                any::<bool>(),
            ),
        ),
        proptest::collection::vec((0..4u8, any::<u64>()), 0..4),
        any::<bool>(),
    )
        .prop_map(
            |(packets, kd, kd_fix, ka, ka_fix, mqd_pokes, stack, doorbells, tame)| {
                let mut h = Hostile {
                    packets,
                    kd,
                    kd_fix,
                    ka,
                    ka_fix,
                    mqd_pokes,
                    stack,
                    doorbells,
                    tame,
                };
                if tame {
                    for p in &mut h.packets {
                        p.typ = (p.typ % 6) | 0x40; // dispatch or barrier, sane shape
                        p.kernel %= 7;
                        p.kernarg %= 7;
                        p.signal %= 7;
                    }
                    h.kd_fix = h.kd_fix % 6 + 1; // a known kind (and a short cost)
                    h.ka_fix = true;
                    h.mqd_pokes.clear();
                    h.stack = None;
                    for d in &mut h.doorbells {
                        d.0 = 0;
                    }
                }
                h
            },
        )
}

/// Write the hostile queue into `vm`; returns the write index.
fn build_hostile(
    vm: &mut TestVm,
    q: &mut GuestQueue,
    h: &Hostile,
    good_kd: u64,
    good_sig: u64,
) -> u64 {
    use abi::le::{put_u16, put_u32, put_u64};
    let mut kd = h.kd.clone();
    let kind = h.kd_fix % 7;
    if h.kd_fix != 0 {
        put_u32(&mut kd, 0, abi::kernel::KD_MAGIC);
        put_u16(&mut kd, 4, abi::kernel::KD_VERSION);
        put_u16(&mut kd, 6, kind as u16);
        if h.tame || h.kd_fix & 0xC0 != 0 {
            let c = u64::from_le_bytes(kd[8..16].try_into().unwrap()) % 5000;
            put_u64(&mut kd, 8, c);
        }
    }
    let kd_addr = vm.alloc(64, 64);
    vm.mem.write(kd_addr, &kd).unwrap();
    let scratch = vm.alloc(64 << 10, 64);
    let mut ka = h.ka.clone();
    if h.ka_fix {
        // Buffers in scratch (possibly overlapping), n < 4096: Fill and Mark
        // have 1 buffer, Saxpy and Checksum 2, VecAdd 3; Spin a short time.
        let ptrs = match kind {
            1 | 5 => 1,
            3 | 4 => 2,
            2 => 3,
            _ => 0,
        };
        for k in 0..ptrs {
            let off = 8 * k;
            let o = u64::from_le_bytes(ka[off..off + 8].try_into().unwrap()) % (16 << 10);
            put_u64(&mut ka, off, scratch + (o & !3));
        }
        if ptrs > 0 {
            let n = u32::from_le_bytes(ka[8 * ptrs..8 * ptrs + 4].try_into().unwrap()) % 4096;
            put_u32(&mut ka, 8 * ptrs, n);
        } else {
            let ns = u64::from_le_bytes(ka[0..8].try_into().unwrap()) % 10_000;
            put_u64(&mut ka, 0, ns);
        }
    }
    let ka_addr = vm.alloc(32, 16);
    vm.mem.write(ka_addr, &ka).unwrap();
    let sig = vm.signal();
    for (i, p) in h.packets.iter().enumerate() {
        let mut b = p.raw.clone();
        b[0] = match p.typ % 8 {
            0..=3 => abi::aql::TYPE_KERNEL_DISPATCH,
            4 => abi::aql::TYPE_BARRIER_AND,
            5 => abi::aql::TYPE_BARRIER_OR,
            6 => abi::aql::TYPE_INVALID,
            _ => b[0],
        };
        if b[0] == abi::aql::TYPE_KERNEL_DISPATCH && p.typ & 0xC0 != 0 {
            // A well-formed geometry.
            put_u16(&mut b, 4, p.shape.0);
            put_u16(&mut b, 6, 1);
            put_u16(&mut b, 8, 1);
            put_u32(&mut b, 12, p.shape.0 as u32 * p.shape.1 as u32);
            put_u32(&mut b, 16, 1);
            put_u32(&mut b, 20, 1);
        }
        match p.kernel {
            0..=4 => put_u64(&mut b, 32, kd_addr),
            5 | 6 => put_u64(&mut b, 32, good_kd),
            _ => {}
        }
        if p.kernarg != 7 {
            put_u64(&mut b, 40, ka_addr);
        }
        match p.signal {
            0 | 1 => put_u64(&mut b, 56, 0),
            2..=4 => put_u64(&mut b, 56, sig),
            // Another queue's signal: hostile but in range.
            5 | 6 => put_u64(&mut b, 56, good_sig),
            _ => {}
        }
        if b[0] == abi::aql::TYPE_BARRIER_AND || b[0] == abi::aql::TYPE_BARRIER_OR {
            for k in 0..5 {
                if h.tame || b[8 + 8 * k] & 7 != 0 {
                    let dep = [0, sig, good_sig][b[9 + 8 * k] as usize % 3];
                    put_u64(&mut b, 8 + 8 * k, dep);
                }
            }
        }
        let slot = q.ring + (i as u64 % q.ring_packets) * 64;
        vm.mem.write(slot + 2, &b[2..]).unwrap();
        vm.mem.write(slot, &b[..2]).unwrap();
    }
    let n = h.packets.len() as u64;
    vm.mem
        .write_u64(
            q.amd_queue + abi::queue::AMD_QUEUE_WRITE_DISPATCH_ID as u64,
            n,
        )
        .unwrap();
    q.wptr = n;
    if let Some((bytes, seal)) = &h.stack {
        let size = q.mqd.cntl_stack_size();
        let mut b = bytes.clone();
        if *seal && b.len() >= 32 {
            put_u32(&mut b, 0, super::SAVE_MAGIC);
            put_u16(&mut b, 4, super::SAVE_VERSION);
            let np = b[8] as u32 % 4;
            let rest = b.len().saturating_sub(32 + 32 * np as usize);
            put_u32(&mut b, 8, np);
            put_u32(&mut b, 12, (rest / 24) as u32);
            b.truncate(32 + 32 * np as usize + 24 * (rest / 24));
            put_u64(&mut b, 16, 0);
            let c = super::cwsr::checksum(&b[32..]);
            put_u64(&mut b, 24, c);
        }
        if (b.len() as u32) <= size {
            let off = size - b.len() as u32;
            vm.mem
                .write(q.mqd.ctx_save_base() + off as u64, &b)
                .unwrap();
            q.mqd.dw[mqd::CP_HQD_CNTL_STACK_OFFSET] = off;
        }
    }
    for &(sel, v, raw) in &h.mqd_pokes {
        let d = POKE_DWORDS[sel];
        q.mqd.dw[d] = if raw {
            v
        } else {
            q.mqd.dw[d].wrapping_add(v % 64).wrapping_sub(32)
        };
    }
    n
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random bytes as packets, kernargs, descriptors, MQD fields, saved
    /// control stacks and doorbell values: the host never panics, the hostile
    /// queue is refused, errors, or runs; the host can always take its slot back
    /// (ResetWaves completes), and a well-formed queue mapped next to it
    /// completes with correct results.
    #[test]
    fn hostile_queue_never_hurts_host_or_neighbour(seed in any::<u64>(), h in hostile()) {
        let topo = GpuTopology::tiny();
        let mut gpu = SimGpu::new(topo.clone(), seed).unwrap();
        // Two VMs: the hostile one can reach only its own memory.
        let mut vm = TestVm::new(32 << 20);
        let mut bvm = TestVm::new(32 << 20);
        let mut good = vm.queue(&topo, 64, 5);
        let mut bad = bvm.queue(&topo, 64, 5);
        vm.kernel(&mut good, KernelKind::VecAdd, 6, 16, 700, 1, false);
        vm.kernel(&mut good, KernelKind::Mark, 9, 1, 300, 2, false);
        vm.kernel(&mut good, KernelKind::Checksum, 5, 8, 900, 3, true);
        // Plausible addresses for the hostile packets: a real descriptor and
        // signal of its own VM.
        let mut decoy = bvm.queue(&topo, 64, 5);
        bvm.kernel(&mut decoy, KernelKind::Mark, 2, 1, 100, 0, false);
        let own_kd = packet_ptr(&bvm, &decoy, 32);
        let own_sig = decoy.signals[0];
        let wptr = build_hostile(&mut bvm, &mut bad, &h, own_kd, own_sig);
        gpu.map(0, map_req(&vm, &good, 0, 0)).unwrap();
        let mut ev = Vec::new();
        let refused = match gpu.map(50, map_req(&bvm, &bad, 1, 1)) {
            Ok(()) => false,
            Err(GpuError::BadMqd(_)) => true,
            Err(e) => panic!("unexpected map error {e}"),
        };
        let mut t = 50;
        for &(sel, v) in &h.doorbells {
            t += 200;
            let w = match sel {
                0 => wptr,
                1 => wptr.wrapping_add(1),
                2 => wptr.wrapping_sub(1),
                _ => v,
            };
            gpu.advance(t, &mut ev);
            gpu.doorbell(t, SlotId(1), w);
        }
        // Phase 1: both run (bounded: a hostile queue may poll or spin forever).
        let mut steps = 0;
        while let Some(d) = gpu.next_deadline() {
            if d > 200_000 || steps > 20_000 {
                break;
            }
            t = t.max(d);
            gpu.advance(t, &mut ev);
            steps += 1;
        }
        // The host takes the slot back.
        let mapped = gpu.query(SlotId(1)).is_some();
        prop_assert!(!(refused && mapped));
        let unmapping = matches!(gpu.query(SlotId(1)).map(|s| s.state), Some(SlotState::Unmapping(_)));
        if mapped && !unmapping {
            gpu.unmap(t, SlotId(1), DequeueMode::ResetWaves).unwrap();
        }
        let limit = t + 10_000_000;
        let mut steps = 0;
        while let Some(d) = gpu.next_deadline() {
            if d > limit || steps > 100_000 {
                break;
            }
            t = t.max(d);
            gpu.advance(t, &mut ev);
            steps += 1;
        }
        prop_assert!(gpu.query(SlotId(1)).is_none(), "hostile slot not freed");
        if mapped {
            let unmapped = ev.iter().any(|e| matches!(e, GpuEvent::Unmapped { tag: 1, .. }));
            prop_assert!(unmapped, "no Unmapped for the hostile queue");
        }
        let good_err = ev.iter().any(|e| matches!(e, GpuEvent::QueueError { tag: 0, .. }));
        prop_assert!(!good_err, "good queue errored");
        // The good queue finished with correct results and signals.
        let q0 = gpu.query(SlotId(0)).unwrap();
        prop_assert_eq!(q0.state, SlotState::Active);
        prop_assert_eq!(q0.rptr, good.wptr);
        prop_assert_eq!(vm.read_index(&good), good.wptr);
        if let Err(e) = vm.verify(&good) {
            return Err(TestCaseError::fail(format!("good queue: {e}")));
        }
        prop_assert_eq!(gpu.free_cus(0), 4);
    }
}

#[test]
fn a_save_dequeue_writes_its_control_record_when_it_finishes_not_at_the_request() {
    let (mut gpu, mut vm, mut q) = one_queue(GpuTopology::tiny());
    vm.kernel(&mut q, KernelKind::Mark, 6, 4, 1000, 1, false);
    gpu.map(0, map_req(&vm, &q, 0, 7)).unwrap();
    // Header + one packet + 4 saved workgroups, at the top of the control stack.
    let size = q.mqd.cntl_stack_size() as u64;
    let rec = 32 + 32 + 4 * 24;
    let at = q.mqd.ctx_save_base() + size - rec;
    let magic = |vm: &TestVm| {
        let mut b = [0u8; 4];
        vm.mem.read(at, &mut b).unwrap();
        u32::from_le_bytes(b)
    };
    gpu.unmap(400, SlotId(0), DequeueMode::SaveWaves).unwrap();
    // The request touches no guest memory (it is on the doorbell ->
    // preemption path); the save time is modelled from the record size.
    assert_eq!(magic(&vm), 0);
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 400, u64::MAX, &mut ev);
    let (mqd, has_work, _, _) = unmapped(&ev).unwrap();
    assert!(has_work && mqd.has_saved_state());
    assert_eq!(mqd.cntl_stack_offset() as u64, size - rec);
    assert_eq!(magic(&vm), super::cwsr::SAVE_MAGIC);
}

/// 2^31 uniform workgroups (the floor's cost each) cost the host a handful
/// of events, not one per workgroup, and take the modelled time exactly.
#[test]
fn huge_uniform_dispatch_costs_events_not_workgroups() {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm, mut q) = one_queue(topo.clone());
    let groups: u32 = 1 << 31;
    vm.kernel(&mut q, KernelKind::Spin, groups, 1, 1, 0, false);
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    let mut ev = Vec::new();
    let mut steps = 0;
    let mut now = 0;
    while let Some(t) = gpu.next_deadline() {
        now = now.max(t);
        gpu.advance(now, &mut ev);
        steps += 1;
    }
    assert!(steps < 16, "{steps} steps");
    assert_eq!(gpu.stats().wgs_completed, groups as u64);
    let cus = topo.cus_per_partition() as u64;
    let floor = SimParams::default().wg_floor_ns;
    let done = ev.iter().find_map(|e| match e {
        GpuEvent::PacketCompleted { at, .. } => Some(*at),
        _ => None,
    });
    assert_eq!(done, Some((groups as u64).div_ceil(cus) * floor));
}

/// A huge batch saved mid-flight: finished rounds count once, the round in
/// flight is saved, the rest resumes; the counters come out exactly once.
#[test]
fn batch_save_restore_is_exact() {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm, mut q) = one_queue(topo.clone());
    vm.kernel(&mut q, KernelKind::Mark, 100_000, 1, 1000, 3, false);
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    let mut ev = Vec::new();
    // Save three times at odd phases, resume on other slots.
    let mut t = 0;
    for (k, dt) in [(1u32, 3_500_123u64), (2, 7_000_777), (3, 1_234_567)] {
        t += dt;
        gpu.advance(t, &mut ev);
        let slot = SlotId(k - 1);
        gpu.unmap(t, slot, DequeueMode::SaveWaves).unwrap();
        t = run_virtual(&mut gpu, t, u64::MAX, &mut ev);
        let (mqd, has_work, _, _) = unmapped(&ev).unwrap();
        assert!(has_work && mqd.has_saved_state());
        ev.clear();
        q.mqd = mqd;
        gpu.map(t, map_req(&vm, &q, k, 0)).unwrap();
    }
    run_virtual(&mut gpu, t, u64::MAX, &mut ev);
    assert!(gpu.stats().saved_wgs >= 3);
    assert_eq!(gpu.stats().wgs_completed, 100_000);
    vm.verify(&q).unwrap();
}

/// A write index ahead of an unpublished (INVALID) header: nothing runs, so
/// the queue is idle (QueueIdle; a drain reports no work). Publishing the
/// header and ringing again runs it.
#[test]
fn stalled_queue_is_idle_until_published() {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm, mut q) = one_queue(topo.clone());
    vm.kernel(&mut q, KernelKind::Mark, 8, 1, 1000, 0, false);
    let hdr_addr = q.ring;
    let hdr = vm.mem.read_u32(hdr_addr).unwrap();
    vm.mem
        .write(hdr_addr, &abi::aql::INVALID_HEADER.to_le_bytes())
        .unwrap();
    gpu.map(0, map_req(&vm, &q, 0, 0)).unwrap();
    let mut ev = Vec::new();
    gpu.advance(10_000, &mut ev);
    assert!(
        ev.iter().any(|e| matches!(e, GpuEvent::QueueIdle { .. })),
        "{ev:?}"
    );
    assert_eq!(gpu.free_cus(0), topo.cus_per_partition());
    gpu.unmap(10_000, SlotId(0), DequeueMode::DrainPipe)
        .unwrap();
    ev.clear();
    run_virtual(&mut gpu, 10_000, u64::MAX, &mut ev);
    let (mqd, has_work, _, _) = unmapped(&ev).unwrap();
    assert!(!has_work, "a stalled queue has no work");
    q.mqd = mqd;
    vm.mem.write_u32(hdr_addr, hdr).unwrap();
    ev.clear();
    gpu.map(20_000, map_req(&vm, &q, 0, 0)).unwrap();
    gpu.doorbell(20_000, SlotId(0), q.wptr);
    run_virtual(&mut gpu, 20_000, u64::MAX, &mut ev);
    assert!(ev
        .iter()
        .any(|e| matches!(e, GpuEvent::PacketCompleted { .. })));
    vm.verify(&q).unwrap();
}

// ------------------------------------------- blocked queues (issue 21)

/// A queue whose next packet is a barrier-AND on a signal nobody writes
/// (the guest's CPU will, later): it has no work (idle, not active), its
/// re-checks back off to one per capped interval, and it resumes once the
/// signal reads 0, its kernel's workgroups each run exactly once.
#[test]
fn unmet_barrier_is_idle_and_rechecked_with_backoff() {
    let topo = GpuTopology::tiny();
    let poll = SimParams::default().barrier_poll_ns;
    let cap = poll << BLOCKED_POLL_MAX_SHIFT;
    let (mut gpu, mut vm, mut a) = one_queue(topo.clone());
    let dep = vm.signal();
    let sig = vm.signal();
    vm.push(
        &mut a,
        &Packet::barrier_and(
            Barrier {
                dep_signal: [dep, 0, 0, 0, 0],
                completion_signal: sig,
            },
            false,
        ),
    );
    a.signals.push(sig);
    vm.kernel(&mut a, KernelKind::Mark, 8, 1, 1_000, 0, false);
    gpu.map(0, map_req(&vm, &a, 0, 0)).unwrap();
    let mut ev = Vec::new();
    // A long block, in virtual time: 10 s.
    let block = 10_000_000_000u64;
    run_virtual(&mut gpu, 0, block, &mut ev);
    assert!(
        ev.iter()
            .any(|e| matches!(e, GpuEvent::QueueIdle { tag: 0, .. })),
        "a queue blocked on an unmet barrier is idle: {ev:?}"
    );
    assert_eq!(gpu.stats().wgs_completed, 0);
    let st = gpu.query(SlotId(0)).unwrap();
    assert_eq!((st.rptr, st.inflight_wgs), (0, 0));
    // Backoff: the first BLOCKED_POLL_MAX_SHIFT + 1 re-checks reach the
    // cap, then one per capped interval (at most; the re-check cost per
    // second is bounded, whatever the length of the block).
    let polls = gpu.stats().blocked_polls;
    let bound = BLOCKED_POLL_MAX_SHIFT as u64 + 2 + block / cap;
    assert!(polls <= bound, "{polls} re-checks > {bound}");
    // Without backoff it would have been block / poll (5 million).
    assert!(polls < block / poll / 400, "{polls}");
    // The guest's CPU meets the dependency: the next re-check (within one
    // capped interval) resolves the barrier and the kernel runs once.
    vm.mem.write_u64(dep + 8, 0).unwrap();
    let before = gpu.stats().blocked_polls;
    ev.clear();
    run_virtual(&mut gpu, block, block + cap + 20_000, &mut ev);
    let done = ev
        .iter()
        .find(|e| {
            matches!(
                e,
                GpuEvent::PacketCompleted {
                    tag: 0,
                    dispatch_id: 0,
                    ..
                }
            )
        })
        .expect("barrier completed")
        .at();
    assert!(done <= block + cap, "resolved at {done}");
    assert!(gpu.stats().blocked_polls - before <= 1);
    vm.verify(&a).unwrap();
    assert_eq!(vm.read_index(&a), 2);
}

/// A barrier waiting on another queue's completion signal is re-checked
/// when that completion writes the signal, not at its backed-off poll: it
/// completes at the very time the other queue's packet does.
#[test]
fn barrier_wakes_on_other_queues_completion() {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm, mut a) = one_queue(topo.clone());
    let mut b = vm.queue(&topo, 64, 5);
    // 3.001 ms of work: the waiter's poll is at its cap by then.
    vm.kernel(&mut b, KernelKind::Spin, 1, 1, 3_001_000, 0, false);
    let dep = b.signals[0];
    let sig = vm.signal();
    vm.push(
        &mut a,
        &Packet::barrier_and(
            Barrier {
                dep_signal: [dep, 0, 0, 0, 0],
                completion_signal: sig,
            },
            false,
        ),
    );
    a.signals.push(sig);
    vm.kernel(&mut a, KernelKind::Mark, 4, 1, 100, 0, false);
    gpu.map(0, map_req(&vm, &a, 0, 0)).unwrap();
    gpu.map(0, map_req(&vm, &b, 1, 1)).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 0, 1_000_000_000, &mut ev);
    let at = |tag: u64, id: u64| {
        ev.iter()
            .find(|e| {
                matches!(e, GpuEvent::PacketCompleted { tag: t, dispatch_id: d, .. }
                    if *t == tag && *d == id)
            })
            .unwrap()
            .at()
    };
    assert_eq!(
        at(0, 0),
        at(1, 0),
        "the barrier resolves with its dependency"
    );
    assert!(gpu.stats().barrier_wakes >= 1);
    vm.verify(&a).unwrap();
    vm.verify(&b).unwrap();
}

/// A blocked queue dequeued (the scheduler's idle eviction) reports no work
/// and writes back the barrier's index: reloaded after the dependency is
/// met, every workgroup runs exactly once.
#[test]
fn blocked_queue_unmaps_without_work_and_resumes_exactly_once() {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm, mut a) = one_queue(topo.clone());
    vm.kernel(&mut a, KernelKind::Mark, 8, 1, 1_000, 1, false);
    let dep = vm.signal();
    let sig = vm.signal();
    vm.push(
        &mut a,
        &Packet::barrier_or(
            Barrier {
                dep_signal: [dep, 0, 0, 0, 0],
                completion_signal: sig,
            },
            false,
        ),
    );
    a.signals.push(sig);
    vm.kernel(&mut a, KernelKind::Mark, 8, 1, 1_000, 2, false);
    gpu.map(0, map_req(&vm, &a, 0, 0)).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 0, 1_000_000, &mut ev);
    gpu.unmap(1_000_000, SlotId(0), DequeueMode::SaveWaves)
        .unwrap();
    run_virtual(&mut gpu, 1_000_000, 2_000_000, &mut ev);
    let (mqd, has_work, _, _) = unmapped(&ev).expect("unmapped");
    assert!(!has_work, "blocked on a barrier: no work");
    assert_eq!(mqd.read_index(), Some(1), "the barrier is next");
    vm.mem.write_u64(dep + 8, 0).unwrap();
    a.mqd = mqd;
    ev.clear();
    gpu.map(2_000_000, map_req(&vm, &a, 0, 0)).unwrap();
    run_virtual(&mut gpu, 2_000_000, 3_000_000, &mut ev);
    vm.verify(&a).unwrap();
    assert_eq!(vm.read_index(&a), 3);
    assert_eq!(gpu.stats().wgs_completed, 16);
}

/// Issue 21, error 18 at map (a record corrupted after the load was
/// accepted): the queue stops with 18 and its dequeue writes back the read
/// index and control-stack offset it was loaded with, so that the repaired
/// record reloads and every workgroup runs exactly once.
#[test]
fn error_18_at_map_loses_no_work_and_the_repaired_record_resumes_exactly_once() {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm, mut a) = one_queue(topo.clone());
    vm.kernel(&mut a, KernelKind::Mark, 64, 64, 100_000, 1, false);
    gpu.map(0, map_req(&vm, &a, 0, 0)).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, 0, 150_000, &mut ev);
    gpu.unmap(150_000, SlotId(0), DequeueMode::SaveWaves)
        .unwrap();
    run_virtual(&mut gpu, 150_000, 10_000_000, &mut ev);
    let (saved, has_work, _, _) = unmapped(&ev).unwrap();
    assert!(has_work && saved.has_saved_state());
    let rec = saved.ctx_save_base() + saved.cntl_stack_offset() as u64;
    let mut byte = [0u8; 1];
    vm.mem.read(rec + 24, &mut byte).unwrap();
    vm.mem.write(rec + 24, &[byte[0] ^ 1]).unwrap();
    assert_eq!(
        validate_load(&topo, &SimParams::default(), &saved, &*vm.mem),
        Err(QueueErrorReason::BadSavedState("checksum mismatch"))
    );
    a.mqd = saved.clone();
    ev.clear();
    gpu.map(20_000_000, map_req(&vm, &a, 0, 0)).unwrap();
    run_virtual(&mut gpu, 20_000_000, 21_000_000, &mut ev);
    assert!(ev.iter().any(|e| matches!(
        e,
        GpuEvent::QueueError {
            reason: QueueErrorReason::BadSavedState(_),
            ..
        }
    )));
    gpu.unmap(21_000_000, SlotId(0), DequeueMode::ResetWaves)
        .unwrap();
    run_virtual(&mut gpu, 21_000_000, 22_000_000, &mut ev);
    let (back, _, _, _) = unmapped(&ev).unwrap();
    assert_eq!(back.read_index(), saved.read_index());
    assert_eq!(back.cntl_stack_offset(), saved.cntl_stack_offset());
    vm.mem.write(rec + 24, &byte).unwrap();
    assert_eq!(
        validate_load(&topo, &SimParams::default(), &back, &*vm.mem),
        Ok(())
    );
    a.mqd = back;
    ev.clear();
    gpu.map(30_000_000, map_req(&vm, &a, 0, 0)).unwrap();
    run_virtual(&mut gpu, 30_000_000, 100_000_000, &mut ev);
    vm.verify(&a).unwrap();
    assert_eq!(gpu.stats().wgs_completed, 64);
}

/// A saved batch or workgroup leaves its end timer behind in the heap
/// (stale: it fires nothing), behind a live timer that keeps it from the
/// heap's top. Saved and mapped again 3 x [`MIN_HEAP_COMPACT`] times, a
/// queue's stale timers are dropped as they pile up, so the heap stays
/// below twice the bound; and both kernels still complete exactly once.
#[test]
fn stale_timers_of_saved_work_do_not_pile_up() {
    let topo = GpuTopology::tiny();
    let (mut gpu, mut vm, mut q) = one_queue(topo.clone());
    // A live timer ahead of every stale one (so that dropping stale
    // timers from the heap's top alone cannot keep up): one workgroup of
    // another queue, ending before any of the saved batches would.
    let mut blocker = vm.queue(&topo, 64, 5);
    vm.kernel(
        &mut blocker,
        KernelKind::Mark,
        1,
        4,
        500_000_000_000,
        4,
        false,
    );
    gpu.map(0, map_req(&vm, &blocker, 2, 8)).unwrap();
    // Long workgroups: every map starts a batch whose end is far ahead.
    vm.kernel(&mut q, KernelKind::Mark, 3, 4, 1_000_000_000_000, 3, false);
    let mut t = 0;
    let mut max_len = 0;
    for i in 0..3 * MIN_HEAP_COMPACT as u32 {
        let slot = i % 2;
        gpu.map(t, map_req(&vm, &q, slot, 7)).unwrap();
        // Restored and running (a batch started) when the save comes.
        let mut ev = Vec::new();
        run_virtual(&mut gpu, t, t + 1_000_000, &mut ev);
        gpu.unmap(t + 1_000_000, SlotId(slot), DequeueMode::SaveWaves)
            .unwrap();
        run_virtual(&mut gpu, t + 1_000_000, t + 100_000_000, &mut ev);
        let (mqd, has_work, _, at) = unmapped(&ev).expect("saved");
        assert!(has_work, "cycle {i}");
        q.mqd = mqd;
        t = at + 100;
        max_len = max_len.max(gpu.heap.len());
    }
    assert!(max_len < 2 * MIN_HEAP_COMPACT, "heap reached {max_len}");
    gpu.map(t, map_req(&vm, &q, 0, 7)).unwrap();
    let mut ev = Vec::new();
    run_virtual(&mut gpu, t, u64::MAX, &mut ev);
    vm.verify(&q).unwrap();
    vm.verify(&blocker).unwrap();
}
