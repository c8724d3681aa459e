//! Unit tests of the binding, over the simulated GPU in virtual time.

use super::*;
use crate::mem::SparseMemory;
use crate::sim::testkit::{GuestQueue, TestVm};
use crate::sim::SimGpu;
use abi::kernel::KernelKind;

/// A virtual-time loop around a binding, recording every notice.
struct Rig {
    gpu: SimGpu,
    b: Binding<usize>,
    now: Nanos,
    timer: Option<Nanos>,
    log: Vec<Notice<usize>>,
}

impl Rig {
    fn new(topo: GpuTopology) -> Rig {
        Rig::with_config(topo, SchedConfig::default())
    }

    /// A rig on which dispatch widths never enter a decision, the
    /// condition of armed doorbells ([`Binding::arm_doorbell`] refuses
    /// while `Scheduler::dispatch_width_matters`): reservations capped at
    /// a quarter of an XCC, which on [`GpuTopology::tiny`] (2 CUs per XCC)
    /// is less than one CU, so none fits. (The default cap, half an XCC,
    /// is one CU there: a narrow high job would be served by a reservation
    /// instead of a preemption, and nothing could be armed.)
    fn no_reservations(topo: GpuTopology) -> Rig {
        let cfg = SchedConfig {
            spatial_max_permille: 250,
            ..SchedConfig::default()
        };
        let rig = Rig::with_config(topo, cfg);
        assert!(!rig.b.scheduler().dispatch_width_matters());
        rig
    }

    fn with_config(topo: GpuTopology, cfg: SchedConfig) -> Rig {
        Rig {
            gpu: SimGpu::new(topo.clone(), 7).unwrap(),
            b: Binding::new(&topo, cfg).unwrap(),
            now: 0,
            timer: None,
            log: Vec::new(),
        }
    }

    fn take(&mut self, out: Vec<Notice<usize>>) {
        for n in out {
            if let Notice::ArmTimer { at } = n {
                self.timer = Some(at);
            }
            self.log.push(n);
        }
    }

    fn doorbell(&mut self, q: QueueId, wptr: u64) {
        let mut out = Vec::new();
        self.b.doorbell(&mut self.gpu, self.now, q, wptr, &mut out);
        self.take(out);
    }

    /// Runs until `stop` holds for a notice or nothing is left to do (or `until`).
    fn run(&mut self, until: Nanos, stop: impl Fn(&Notice<usize>) -> bool) {
        let mut evs = Vec::new();
        loop {
            if self.log.iter().any(&stop) {
                return;
            }
            let t = [self.gpu.next_deadline(), self.timer]
                .into_iter()
                .flatten()
                .min();
            let Some(t) = t.filter(|t| *t <= until) else {
                return;
            };
            self.now = self.now.max(t);
            self.gpu.advance(self.now, &mut evs);
            let mut out = Vec::new();
            for ev in evs.drain(..) {
                self.b.gpu_event(&mut self.gpu, self.now, ev, &mut out);
            }
            if self.timer.is_some_and(|x| x <= self.now) {
                self.timer = None;
                self.b.tick(&mut self.gpu, self.now, &mut out);
            }
            self.take(out);
        }
    }

    fn completions_of(&self, owner: usize) -> Vec<u64> {
        self.log
            .iter()
            .filter_map(|n| match n {
                Notice::Completed {
                    owner: o,
                    dispatch_id,
                    ..
                } if *o == owner => Some(*dispatch_id),
                _ => None,
            })
            .collect()
    }
}

/// 2 XCCs x 8 CUs (SPX), 2 shader engines per XCC, 4 slots: the topology
/// of the spatial-sharing and review tests.
fn spx_topo() -> GpuTopology {
    GpuTopology {
        cus_per_xcc: 8,
        ses_per_xcc: 2,
        ..GpuTopology::tiny()
    }
}

/// The spatial-sharing rig on [`spx_topo`]: VM 0 at priority 2 and VM 1
/// at priority 12, each with one 64-packet queue (queue id and owner = the
/// VM's id), added in that order; `edit_hi` may change VM 1's MQD first.
fn spx_lo_hi(edit_hi: impl FnOnce(&mut GuestQueue)) -> (Rig, [(TestVm, GuestQueue); 2]) {
    let topo = spx_topo();
    let mut rig = Rig::new(topo.clone());
    let mut lo_vm = vm(&mut rig, 0, 2);
    let lo = lo_vm.queue(&topo, 64, 0);
    add(&mut rig, &lo_vm, 0, QueueId(0), 0, &lo);
    let mut hi_vm = vm(&mut rig, 1, 12);
    let mut hi = hi_vm.queue(&topo, 64, 0);
    edit_hi(&mut hi);
    add(&mut rig, &hi_vm, 1, QueueId(1), 1, &hi);
    (rig, [(lo_vm, lo), (hi_vm, hi)])
}

/// The physical slot queue `q` holds while mapped (running or idle).
fn phys_slot(rig: &Rig, q: QueueId) -> Option<crate::backend::SlotId> {
    match rig.b.scheduler().queue_state(q) {
        Some((scheduler::QueueState::Running | scheduler::QueueState::MappedIdle, Some(s))) => {
            Some(crate::backend::SlotId(s.0))
        }
        _ => None,
    }
}

fn vm(rig: &mut Rig, id: u32, prio: u8) -> TestVm {
    rig.b
        .add_vm(
            VmId(id),
            VmParams {
                priority: prio,
                ..Default::default()
            },
        )
        .unwrap();
    TestVm::with_memory(Arc::new(SparseMemory::new(1 << 32)), 0x10_0000)
}

/// A rig on [`GpuTopology::tiny`] with one VM per entry of `prios` (VM `v`
/// at `prios[v]`) and six 64-packet queues over the first two VMs (queue
/// `i` of VM `i % 2`, queue priority `i % 4`; queue id and owner `i`).
fn six_queues(prios: &[u8]) -> (Rig, Vec<TestVm>, Vec<GuestQueue>) {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::no_reservations(topo.clone());
    let mut vms: Vec<TestVm> = prios
        .iter()
        .enumerate()
        .map(|(v, p)| vm(&mut rig, v as u32, *p))
        .collect();
    let mut qs = Vec::new();
    for i in 0..6usize {
        let v = i % 2;
        let gq = vms[v].queue(&topo, 64, (i % 4) as u32);
        add(&mut rig, &vms[v], v as u32, QueueId(i as u64), i, &gq);
        qs.push(gq);
    }
    (rig, vms, qs)
}

fn add(rig: &mut Rig, tvm: &TestVm, vm: u32, q: QueueId, owner: usize, gq: &GuestQueue) {
    rig.b
        .add_queue(VmId(vm), q, owner, 5, gq.mqd.clone(), tvm.dyn_mem())
        .unwrap();
}

#[test]
fn two_vms_run_exactly_once_and_notices_name_the_owner() {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::new(topo.clone());
    let mut qs = Vec::new();
    for (v, prio) in [(0u32, 2u8), (1, 12)] {
        let mut tvm = vm(&mut rig, v, prio);
        let mut gq = tvm.queue(&topo, 64, 0);
        add(&mut rig, &tvm, v, QueueId(v as u64), 10 + v as usize, &gq);
        for k in 0..3 {
            tvm.kernel(&mut gq, KernelKind::Mark, 8, 64, 20_000, k, true);
        }
        qs.push((tvm, gq));
    }
    for (v, (_, gq)) in qs.iter().enumerate() {
        rig.doorbell(QueueId(v as u64), gq.wptr);
    }
    rig.run(u64::MAX, |_| false);
    for (v, (tvm, gq)) in qs.iter().enumerate() {
        tvm.verify(gq).unwrap();
        let mut done = rig.completions_of(10 + v);
        done.sort_unstable();
        assert_eq!(done, vec![0, 1, 2], "vm {v}");
    }
    assert_eq!(rig.b.stats().completions, 6);
    assert!(rig
        .log
        .iter()
        .any(|n| matches!(n, Notice::Mapped { owner: 10, .. })));
}

#[test]
fn refused_map_reports_an_error_then_frees_the_slot_at_once() {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::new(topo.clone());
    let mut tvm = vm(&mut rig, 0, 5);
    let mut gq = tvm.queue(&topo, 64, 0);
    // A ring the GPU refuses at map time (the binding does not check MQDs).
    let mut bad = gq.mqd.clone();
    bad.set64(
        abi::mqd::CP_HQD_PQ_BASE_LO,
        abi::mqd::CP_HQD_PQ_BASE_HI,
        (1u64 << 40) >> 8,
    );
    rig.b
        .add_queue(VmId(0), QueueId(3), 42, 5, bad, tvm.dyn_mem())
        .unwrap();
    tvm.kernel(&mut gq, KernelKind::Mark, 1, 64, 1000, 0, true);
    rig.doorbell(QueueId(3), gq.wptr);
    let pos = rig
        .log
        .iter()
        .position(|n| matches!(n, Notice::QueueError { owner: 42, .. }))
        .expect("queue error notice");
    assert!(!rig.log[..pos]
        .iter()
        .any(|n| matches!(n, Notice::Mapped { .. })));
    assert_eq!(rig.b.occupied(), 0);
    let (st, slot) = rig.b.scheduler().queue_state(QueueId(3)).unwrap();
    assert_eq!(st, scheduler::QueueState::Error);
    assert_eq!(
        slot, None,
        "the unmap of a never-loaded slot completes at once"
    );
    assert!((0..topo.user_slots().len() as u32).all(|s| rig.b.slot_queue(SlotId(s)).is_none()));
    assert_eq!(rig.b.stats().queue_errors, 1);
}

#[test]
fn removal_with_save_returns_an_mqd_that_resumes_exactly_once() {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::new(topo.clone());
    let mut tvm = vm(&mut rig, 0, 5);
    let mut gq = tvm.queue(&topo, 64, 0);
    add(&mut rig, &tvm, 0, QueueId(0), 1, &gq);
    for k in 0..6 {
        tvm.kernel(&mut gq, KernelKind::Mark, 16, 64, 50_000, k, true);
    }
    rig.doorbell(QueueId(0), gq.wptr);
    rig.run(u64::MAX, |n| matches!(n, Notice::Completed { .. }));
    let mut out = Vec::new();
    rig.b
        .remove_queue(
            &mut rig.gpu,
            rig.now,
            QueueId(0),
            Some(DequeueMode::SaveWaves),
            &mut out,
        )
        .unwrap();
    rig.take(out);
    rig.run(u64::MAX, |n| matches!(n, Notice::Removed { .. }));
    let mqd = rig
        .log
        .iter()
        .find_map(|n| match n {
            Notice::Removed { owner: 1, mqd, .. } => Some((**mqd).clone()),
            _ => None,
        })
        .expect("removed");
    let first = rig.completions_of(1);
    let r = mqd.read_index().unwrap();
    assert!((1..6).contains(&r), "stopped part-way: read index {r}");
    assert_eq!(mqd.write_index(), 6);
    assert!(rig.b.mqd(QueueId(0)).is_none());
    // Reload the written-back MQD as a new queue: the rest runs once.
    rig.b
        .add_queue(VmId(0), QueueId(1), 2, 5, mqd, tvm.dyn_mem())
        .unwrap();
    rig.doorbell(QueueId(1), gq.wptr);
    rig.run(u64::MAX, |_| false);
    let mut all = first.clone();
    all.extend(rig.completions_of(2));
    all.sort_unstable();
    assert_eq!(all, (0..6).collect::<Vec<_>>());
    tvm.verify(&gq).unwrap();
}

#[test]
fn removing_a_vm_removes_each_of_its_queues_once() {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::new(topo.clone());
    let mut tvm = vm(&mut rig, 0, 5);
    let mut qs = Vec::new();
    for i in 0..3u64 {
        let mut gq = tvm.queue(&topo, 64, 0);
        add(&mut rig, &tvm, 0, QueueId(i), i as usize, &gq);
        tvm.kernel(&mut gq, KernelKind::Mark, 64, 64, 100_000, 1, true);
        qs.push(gq);
    }
    for (i, gq) in qs.iter().enumerate().take(2) {
        rig.doorbell(QueueId(i as u64), gq.wptr);
    }
    rig.run(1_000_000, |_| false);
    let mut out = Vec::new();
    rig.b
        .remove_vm(&mut rig.gpu, rig.now, VmId(0), &mut out)
        .unwrap();
    rig.take(out);
    rig.run(u64::MAX, |_| false);
    let mut removed: Vec<usize> = rig
        .log
        .iter()
        .filter_map(|n| match n {
            Notice::Removed { owner, .. } => Some(*owner),
            _ => None,
        })
        .collect();
    removed.sort_unstable();
    assert_eq!(removed, vec![0, 1, 2]);
    assert_eq!(rig.b.occupied(), 0);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// Queue `q` gets `k` kernels and rings its doorbell.
        Submit { q: usize, k: u32 },
        /// Time passes.
        Run { ns: u64 },
        /// The guest dequeues queue `q` with mode 1..=3.
        Remove { q: usize, mode: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..6usize, 1..4u32).prop_map(|(q, k)| Op::Submit { q, k }),
            4 => (1..400_000u64).prop_map(|ns| Op::Run { ns }),
            1 => (0..6usize, 1..4u32).prop_map(|(q, mode)| Op::Remove { q, mode }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Whatever the interleaving: queues never removed run every kernel
        /// exactly once; a removed queue gets exactly one `Removed` and no
        /// notice after it; the scheduler's invariants hold; at the end no
        /// slot is held by a removed queue.
        #[test]
        fn random_submissions_and_dequeues_keep_the_binding_consistent(
            prios in proptest::collection::vec(0u8..16, 2),
            ops in proptest::collection::vec(op(), 1..40),
        ) {
            let topo = GpuTopology::tiny();
            let (mut rig, mut vms, mut qs) = six_queues(&prios);
            let mut removed = [false; 6];
            for o in ops {
                match o {
                    Op::Submit { q, k } if !removed[q] => {
                        let v = q % 2;
                        if qs[q].wptr + k as u64 > qs[q].ring_packets {
                            continue;
                        }
                        for s in 0..k {
                            vms[v].kernel(&mut qs[q], KernelKind::Mark, 4, 64, 30_000, s, true);
                        }
                        rig.doorbell(QueueId(q as u64), qs[q].wptr);
                    }
                    Op::Run { ns } => {
                        let until = rig.now.saturating_add(ns);
                        rig.run(until, |_| false);
                        rig.now = rig.now.max(until);
                    }
                    Op::Remove { q, mode } if !removed[q] => {
                        removed[q] = true;
                        let mut out = Vec::new();
                        rig.b
                            .remove_queue(
                                &mut rig.gpu,
                                rig.now,
                                QueueId(q as u64),
                                DequeueMode::from_u32(mode),
                                &mut out,
                            )
                            .unwrap();
                        rig.take(out);
                    }
                    _ => {}
                }
                prop_assert!(rig.b.scheduler().check_invariants().is_ok());
            }
            rig.run(u64::MAX, |_| false);
            prop_assert!(rig.b.scheduler().check_invariants().is_ok());
            for (q, gone) in removed.iter().enumerate() {
                let owner_of = |n: &Notice<usize>| match n {
                    Notice::Mapped { owner, .. }
                    | Notice::Completed { owner, .. }
                    | Notice::Unmapped { owner, .. }
                    | Notice::QueueError { owner, .. }
                    | Notice::MapRefused { owner, .. }
                    | Notice::Removed { owner, .. } => Some(*owner),
                    Notice::ArmTimer { .. } => None,
                };
                let mine: Vec<&Notice<usize>> =
                    rig.log.iter().filter(|n| owner_of(n) == Some(q)).collect();
                let removals = mine
                    .iter()
                    .filter(|n| matches!(n, Notice::Removed { .. }))
                    .count();
                if *gone {
                    prop_assert_eq!(removals, 1, "queue {}", q);
                    let last_is_removal = matches!(mine.last(), Some(Notice::Removed { .. }));
                    prop_assert!(last_is_removal, "queue {} has notices after its removal", q);
                    prop_assert!(rig.b.mqd(QueueId(q as u64)).is_none());
                } else {
                    prop_assert_eq!(removals, 0);
                    let v = q % 2;
                    prop_assert!(vms[v].verify(&qs[q]).is_ok(), "queue {}", q);
                }
            }
            for s in 0..topo.user_slots().len() as u32 {
                if let Some(q) = rig.b.slot_queue(SlotId(s)) {
                    prop_assert!(!removed[q.0 as usize]);
                }
            }
        }
    }
}

/// Issue 11, progress-based busy: a queue whose write index is ahead of an
/// unpublished (INVALID) header goes idle and leaves its slot with no work;
/// doorbells while it stays unpublished do not reach the scheduler; once
/// the header is published, a doorbell with the same write index runs it.
#[test]
fn stalled_queue_is_idle_and_a_same_index_doorbell_after_publishing_runs_it() {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::new(topo.clone());
    let mut tvm = vm(&mut rig, 0, 6);
    let mut gq = tvm.queue(&topo, 64, 0);
    add(&mut rig, &tvm, 0, QueueId(0), 1, &gq);
    tvm.kernel(&mut gq, KernelKind::Mark, 8, 64, 20_000, 1, false);
    let hdr = tvm.mem.read_u32(gq.ring).unwrap();
    tvm.mem
        .write(gq.ring, &abi::aql::INVALID_HEADER.to_le_bytes())
        .unwrap();
    rig.doorbell(QueueId(0), gq.wptr);
    rig.run(u64::MAX, |n| matches!(n, Notice::Unmapped { owner: 1, .. }));
    assert!(
        rig.log.iter().any(|n| matches!(
            n,
            Notice::Unmapped {
                owner: 1,
                has_work: false,
                ..
            }
        )),
        "{:?}",
        rig.log
    );
    // Rings while still unpublished: swallowed.
    rig.log.clear();
    rig.doorbell(QueueId(0), gq.wptr);
    rig.doorbell(QueueId(0), gq.wptr);
    assert_eq!(rig.b.stats().stalled_doorbells, 2);
    assert!(!rig.log.iter().any(|n| matches!(n, Notice::Mapped { .. })));
    // Published, then the same index again: it runs to completion.
    tvm.mem.write_u32(gq.ring, hdr).unwrap();
    rig.doorbell(QueueId(0), gq.wptr);
    rig.run(u64::MAX, |_| false);
    assert_eq!(rig.completions_of(1), vec![0]);
    tvm.verify(&gq).unwrap();
}

#[test]
fn a_preemption_that_times_out_resets_only_that_queue_with_error_22() {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::new(topo.clone());
    let mut hung_vm = vm(&mut rig, 0, 2);
    let mut good_vm = vm(&mut rig, 1, 12);
    assert_eq!(
        rig.b.preempt_timeout(VmId(0)),
        Some(DEFAULT_PREEMPT_TIMEOUT_NS)
    );
    rig.b.set_preempt_timeout(VmId(0), 1_000_000).unwrap();
    assert!(rig.b.set_preempt_timeout(VmId(9), 1).is_err());
    let mut hung = hung_vm.queue(&topo, 64, 0);
    let mut good = good_vm.queue(&topo, 64, 0);
    add(&mut rig, &hung_vm, 0, QueueId(0), 10, &hung);
    add(&mut rig, &good_vm, 1, QueueId(1), 11, &good);
    hung_vm.kernel_flags = abi::kernel::flags::NO_SAVE_POINT;
    hung_vm.kernel(&mut hung, KernelKind::Mark, 4, 64, 10_000_000_000, 0, true);
    rig.doorbell(QueueId(0), hung.wptr);
    rig.run(100_000, |_| false);
    assert!(rig.b.on_gpu(QueueId(0)));
    // The higher-priority VM arrives: the scheduler preempts the hung
    // queue, whose save cannot finish.
    for k in 0..3 {
        good_vm.kernel(&mut good, KernelKind::Mark, 8, 64, 20_000, k, true);
    }
    let t0 = rig.now;
    rig.doorbell(QueueId(1), good.wptr);
    rig.run(u64::MAX, |_| false);
    let err = rig
        .log
        .iter()
        .find_map(|n| match n {
            Notice::QueueError {
                owner: 10, reason, ..
            } => Some(*reason),
            _ => None,
        })
        .expect("the hung queue stopped");
    let QueueErrorReason::PreemptionTimeout { waited_ns } = err else {
        panic!("{err:?}")
    };
    assert_eq!(waited_ns, 1_000_000);
    assert_eq!(
        crate::vgpu::error_code(&err),
        abi::vgpu::error::PREEMPTION_TIMEOUT
    );
    assert!(rig.now >= t0 + 1_000_000);
    assert_eq!(rig.b.stats().preempt_timeouts, 1);
    let (st, slot) = rig.b.scheduler().queue_state(QueueId(0)).unwrap();
    assert_eq!((st, slot), (scheduler::QueueState::Error, None));
    assert!(!rig.b.on_gpu(QueueId(0)));
    // The good VM lost nothing; no other queue saw an error.
    good_vm.verify(&good).unwrap();
    assert_eq!(rig.completions_of(11), vec![0, 1, 2]);
    assert!(rig.completions_of(10).is_empty());
    assert!(!rig
        .log
        .iter()
        .any(|n| matches!(n, Notice::QueueError { owner: 11, .. })));
    assert_eq!(rig.b.occupied(), 0);
}
#[path = "binding_spatial_tests.rs"]
mod spatial;

#[path = "binding_review_tests.rs"]
mod review;

/// Armed doorbells ([`Binding::arm_doorbell`] from a warm cache, then
/// [`Binding::fire_armed`] before [`Binding::doorbell`]) change nothing but
/// when the unmaps reach the GPU: over random submissions at random
/// priorities on [`GpuTopology::tiny`] with [`Rig::no_reservations`] (so
/// dispatch widths never enter a decision), a rig that arms every queue before each of its
/// doorbells logs exactly the notices of one that does not, its kernels
/// run exactly once, and armed unmaps were fired and never mismatched.
#[test]
fn armed_doorbells_log_what_plain_doorbells_log() {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[3; 32]),
    );
    let ops = proptest::collection::vec((0..6usize, 1..4u32, 1..600_000u64), 1..40);
    let mut fired = [0; 2];
    for run in 0..200u32 {
        let prios: Vec<u8> = vec![(run % 16) as u8, ((run * 7 + 3) % 16) as u8];
        let ops = ops.new_tree(&mut runner).unwrap().current();
        let mut rigs = [six_queues(&prios), six_queues(&prios), six_queues(&prios)];
        for (armed, (rig, vms, qs)) in rigs.iter_mut().enumerate() {
            let mut slot = ArmedDoorbell::default();
            // Rig 2 arms every queue at the end of each step, as the
            // arbiter does at the end of a turn; a doorbell fires its
            // preparation only if nothing reached the binding since.
            let mut ahead: Vec<ArmedDoorbell> = vec![ArmedDoorbell::default(); 6];
            for &(q, k, ns) in &ops {
                let v = q % 2;
                if qs[q].wptr + k as u64 <= qs[q].ring_packets {
                    for s in 0..k {
                        vms[v].kernel(&mut qs[q], KernelKind::Mark, 4, 64, 30_000, s, true);
                    }
                    let (id, wptr) = (QueueId(q as u64), qs[q].wptr);
                    if armed == 1 && rig.b.arm_doorbell(id, rig.now, &mut slot) {
                        assert!(slot.is_armed());
                        rig.b.fire_armed(&mut rig.gpu, rig.now, &slot, wptr);
                    }
                    if armed == 2 {
                        rig.b.fire_armed(&mut rig.gpu, rig.now, &ahead[q], wptr);
                    }
                    rig.doorbell(id, wptr);
                }
                // Odd runs arm before the step's GPU events and timers
                // (those preparations are stale if any reached the binding).
                if armed == 2 && run % 2 == 1 {
                    for (i, a) in ahead.iter_mut().enumerate() {
                        rig.b.arm_doorbell(QueueId(i as u64), rig.now, a);
                    }
                }
                let until = rig.now.saturating_add(ns);
                rig.run(until, |_| false);
                rig.now = rig.now.max(until);
                if armed == 2 && run % 2 == 0 {
                    for (i, a) in ahead.iter_mut().enumerate() {
                        rig.b.arm_doorbell(QueueId(i as u64), rig.now, a);
                    }
                }
            }
            rig.run(u64::MAX, |_| false);
            for (q, gq) in qs.iter().enumerate() {
                assert!(vms[q % 2].verify(gq).is_ok(), "run {run} queue {q}");
            }
            assert!(rig.b.scheduler().check_invariants().is_ok());
        }
        let plain = &rigs[0].0;
        for (i, (armed, ..)) in rigs.iter().enumerate().skip(1) {
            assert_eq!(plain.log, armed.log, "run {run} rig {i}");
            assert_eq!(plain.b.scheduler().stats(), armed.b.scheduler().stats());
            let s = armed.b.stats();
            assert_eq!(s.armed_mismatched, 0, "run {run}");
            assert_eq!(armed.b.scheduler().fast_stats().mismatched, 0);
            fired[i - 1] += s.armed_fired;
        }
    }
    assert!(
        fired[0] >= 40 && fired[1] >= 20,
        "armed doorbells fired {fired:?} times"
    );
}

/// On [`GpuTopology::tiny`] with [`Rig::no_reservations`] (dispatch widths
/// never enter a decision), VM 0 (priority 2, queue 0) runs a long kernel and VM 1
/// (priority 12, queue 1) is idle; returns the rig, both VMs with their
/// queue, and the physical slot the low queue holds.
fn lo_runs_hi_idle() -> (
    Rig,
    (TestVm, GuestQueue),
    (TestVm, GuestQueue),
    crate::backend::SlotId,
) {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::no_reservations(topo.clone());
    let mut lo_vm = vm(&mut rig, 0, 2);
    let mut lo = lo_vm.queue(&topo, 64, 0);
    add(&mut rig, &lo_vm, 0, QueueId(0), 0, &lo);
    let mut hi_vm = vm(&mut rig, 1, 12);
    let hi = hi_vm.queue(&topo, 64, 0);
    add(&mut rig, &hi_vm, 1, QueueId(1), 1, &hi);
    lo_vm.kernel(&mut lo, KernelKind::Mark, 4, 64, 5_000_000, 0, true);
    rig.doorbell(QueueId(0), lo.wptr);
    rig.run(rig.now + 10_000, |_| false);
    rig.now += 10_000;
    let victim = phys_slot(&rig, QueueId(0)).expect("low queue mapped");
    (rig, (lo_vm, lo), (hi_vm, hi), victim)
}

/// A doorbell says what it did: the high VM's doorbell preempts the low
/// queue; ringing it again with the same write index is stale and decides
/// nothing.
#[test]
fn a_doorbell_reports_whether_it_preempted_or_was_stale() {
    let (mut rig, (lo_vm, lo), (mut hi_vm, mut hi), _victim) = lo_runs_hi_idle();
    hi_vm.kernel(&mut hi, KernelKind::Mark, 4, 64, 30_000, 0, true);
    let mut out = Vec::new();
    let rung = rig
        .b
        .doorbell(&mut rig.gpu, rig.now, QueueId(1), hi.wptr, &mut out);
    rig.take(out);
    assert_eq!(
        rung,
        DoorbellOutcome {
            stale: 0,
            preempted: true
        }
    );
    assert_eq!(rig.b.scheduler().stats().preemptions, 1);
    let mut out = Vec::new();
    let again = rig
        .b
        .doorbell(&mut rig.gpu, rig.now, QueueId(1), hi.wptr, &mut out);
    rig.take(out);
    assert_eq!(
        again,
        DoorbellOutcome {
            stale: 1,
            preempted: false
        }
    );
    rig.run(u64::MAX, |_| false);
    assert!(lo_vm.verify(&lo).is_ok() && hi_vm.verify(&hi).is_ok());
}

/// Every control method of the binding makes a prepared doorbell stale
/// (the change count lives where every change passes).
#[test]
fn every_control_change_makes_an_armed_plan_stale() {
    type Change = fn(&mut Binding<usize>);
    let changes: [(&str, Change); 6] = [
        ("priority", |b| b.set_vm_priority(VmId(0), 3).unwrap()),
        ("weight", |b| b.set_vm_weight(VmId(0), 2).unwrap()),
        ("pause", |b| b.set_vm_paused(VmId(0), false).unwrap()),
        ("quantum", |b| {
            b.set_vm_quantum(VmId(0), Some(1_000_000)).unwrap()
        }),
        ("policy", |b| b.set_policy(scheduler::Policy::Hqdmux)),
        ("books", |b| b.close_books(0)),
    ];
    for (name, change) in changes {
        let (mut rig, _, _, _) = lo_runs_hi_idle();
        let mut armed = ArmedDoorbell::default();
        assert!(
            rig.b.arm_doorbell(QueueId(1), rig.now, &mut armed),
            "{name}"
        );
        assert!(rig.b.armed_current(&armed), "{name}");
        change(&mut rig.b);
        assert!(!rig.b.armed_current(&armed), "{name}: still current");
    }
}

/// A plan armed before something changed the binding is not fired: here
/// the victim's VM is raised above the doorbell's between arm and ring (a
/// careless caller; the arbiter re-arms after every change), so the
/// doorbell preempts nothing and its decision unmaps nothing. Firing the
/// stale plan would have dequeued the victim behind the scheduler's back.
#[test]
fn a_plan_armed_before_a_change_is_not_fired() {
    let (mut rig, (lo_vm, lo), (mut hi_vm, mut hi), victim) = lo_runs_hi_idle();
    let mut armed = ArmedDoorbell::default();
    assert!(rig.b.arm_doorbell(QueueId(1), rig.now, &mut armed));
    // The operator raises the low VM above the high one.
    rig.b.set_vm_priority(VmId(0), 15).unwrap();
    let mut out = Vec::new();
    rig.b.tick(&mut rig.gpu, rig.now, &mut out);
    rig.take(out);
    hi_vm.kernel(&mut hi, KernelKind::Mark, 4, 64, 30_000, 0, true);
    let fired = rig.b.fire_armed(&mut rig.gpu, rig.now, &armed, hi.wptr);
    rig.doorbell(QueueId(1), hi.wptr);
    assert!(!fired, "a stale plan was fired");
    assert_eq!(rig.b.stats().armed_mismatched, 0);
    assert_eq!(phys_slot(&rig, QueueId(0)), Some(victim));
    assert!(matches!(
        rig.gpu.query(victim).map(|s| s.state),
        Some(crate::backend::SlotState::Active)
    ));
    rig.run(u64::MAX, |_| false);
    assert!(lo_vm.verify(&lo).is_ok() && hi_vm.verify(&hi).is_ok());
}

/// Fired unmaps not yet settled by their doorbell: neither the same
/// preparation nor a new one fires again (the GPU gets one dequeue per
/// slot), and the doorbell then settles them as one preemption.
#[test]
fn fired_unmaps_are_not_fired_twice() {
    let (mut rig, (lo_vm, lo), (mut hi_vm, mut hi), victim) = lo_runs_hi_idle();
    hi_vm.kernel(&mut hi, KernelKind::Mark, 4, 64, 30_000, 0, true);
    let mut armed = ArmedDoorbell::default();
    assert!(rig.b.arm_doorbell(QueueId(1), rig.now, &mut armed));
    assert!(rig.b.fire_armed(&mut rig.gpu, rig.now, &armed, hi.wptr));
    assert!(!rig.b.fire_armed(&mut rig.gpu, rig.now, &armed, hi.wptr));
    let mut again = ArmedDoorbell::default();
    assert!(!rig.b.arm_doorbell(QueueId(1), rig.now, &mut again));
    assert!(!rig.b.fire_armed(&mut rig.gpu, rig.now, &again, hi.wptr));
    rig.doorbell(QueueId(1), hi.wptr);
    let s = rig.b.stats();
    assert_eq!((s.armed_fired, s.armed_mismatched), (1, 0));
    assert_eq!(rig.b.scheduler().stats().preemptions, 1);
    assert_eq!(
        rig.b.scheduler().queue_state(QueueId(0)).map(|s| s.0),
        Some(scheduler::QueueState::Preempting)
    );
    assert!(matches!(
        rig.gpu.query(victim).map(|s| s.state),
        Some(crate::backend::SlotState::Unmapping(_))
    ));
    rig.run(u64::MAX, |_| false);
    assert!(lo_vm.verify(&lo).is_ok() && hi_vm.verify(&hi).is_ok());
    assert!(rig.b.scheduler().check_invariants().is_ok());
}

/// A caller that fires a prepared preemption and then does not pass the
/// doorbell (a panic in between, say): the next event of any other kind
/// settles the fired unmaps first (adopted as preemptions and counted), so
/// no later decision mistakes them for its own and no queue waits for a
/// dequeue that already happened; both guests' work still runs exactly once.
#[test]
fn fired_unmaps_without_their_doorbell_are_settled_by_the_next_event() {
    let (mut rig, (lo_vm, lo), (mut hi_vm, mut hi), _) = lo_runs_hi_idle();
    hi_vm.kernel(&mut hi, KernelKind::Mark, 4, 64, 30_000, 0, true);
    let mut armed = ArmedDoorbell::default();
    assert!(rig.b.arm_doorbell(QueueId(1), rig.now, &mut armed));
    assert!(rig.b.fire_armed(&mut rig.gpu, rig.now, &armed, hi.wptr));
    // No doorbell: a tick comes next.
    let mut out = Vec::new();
    rig.b.tick(&mut rig.gpu, rig.now, &mut out);
    rig.take(out);
    assert_eq!(rig.b.stats().armed_mismatched, 1);
    assert_eq!(
        rig.b.scheduler().queue_state(QueueId(0)).map(|s| s.0),
        Some(scheduler::QueueState::Preempting)
    );
    // The doorbell, late: an ordinary one now.
    rig.doorbell(QueueId(1), hi.wptr);
    rig.run(u64::MAX, |_| false);
    assert!(lo_vm.verify(&lo).is_ok() && hi_vm.verify(&hi).is_ok());
    assert!(rig.b.scheduler().check_invariants().is_ok());
    assert_eq!(rig.b.stats().armed_mismatched, 1);
}

/// Pushes a barrier-AND on `dep` (a signal at 1) with a completion signal,
/// then `groups` Mark workgroups of `cost` ns: the queue blocks until `dep`
/// reads 0.
fn barrier_then_mark(tvm: &mut TestVm, gq: &mut GuestQueue, dep: u64, groups: u32, cost: u64) {
    let sig = tvm.signal();
    tvm.push(
        gq,
        &abi::aql::Packet::barrier_and(
            abi::aql::Barrier {
                dep_signal: [dep, 0, 0, 0, 0],
                completion_signal: sig,
            },
            false,
        ),
    );
    gq.signals.push(sig);
    tvm.kernel(gq, KernelKind::Mark, groups, 64, cost, 3, false);
}

/// Issue 21: a queue blocked on an unmet barrier (the guest's CPU will
/// meet it, much later) is idle to the scheduler: it leaves its slot after
/// the idle hysteresis, is billed nothing for the block while a busy
/// neighbour of the same priority is billed its run, and is re-checked off
/// the GPU with a backoff whose count over a long block is bounded by
/// `log2(MAX / MIN) + 1 + block / MAX`. Once the dependency reads 0 it
/// resumes at the next re-check and each workgroup runs exactly once.
#[test]
fn barrier_blocked_queue_is_released_unbilled_and_resumes_at_a_recheck() {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::new(topo.clone());
    let mut bad_vm = vm(&mut rig, 0, 8);
    let mut good_vm = vm(&mut rig, 1, 8);
    let mut bq = bad_vm.queue(&topo, 64, 0);
    let mut gq = good_vm.queue(&topo, 256, 0);
    add(&mut rig, &bad_vm, 0, QueueId(0), 0, &bq);
    add(&mut rig, &good_vm, 1, QueueId(1), 1, &gq);
    let dep = bad_vm.signal();
    barrier_then_mark(&mut bad_vm, &mut bq, dep, 8, 10_000);
    rig.doorbell(QueueId(0), bq.wptr);
    // The neighbour: 100 kernels of 1 ms each.
    for k in 0..100 {
        good_vm.kernel(&mut gq, KernelKind::Mark, 4, 64, 1_000_000, k, false);
    }
    rig.doorbell(QueueId(1), gq.wptr);
    let block: Nanos = 10_000_000_000; // 10 s of virtual time
    rig.run(block, |_| false);
    assert_eq!(rig.completions_of(1).len(), 100);
    good_vm.verify(&gq).unwrap();
    assert!(
        rig.log.iter().any(|n| matches!(
            n,
            Notice::Unmapped {
                owner: 0,
                has_work: false,
                ..
            }
        )),
        "the blocked queue left its slot"
    );
    assert!(!rig.b.on_gpu(QueueId(0)));
    assert!(rig.completions_of(0).is_empty());
    let bad = rig.b.scheduler().vm_stats(VmId(0)).unwrap().gpu_ns;
    let good = rig.b.scheduler().vm_stats(VmId(1)).unwrap().gpu_ns;
    // Billed at most the idle hysteresis, nothing for the 10 s block.
    let hyst = SchedConfig::default().idle_unmap_ns;
    assert!(
        bad <= hyst,
        "blocked VM billed {bad} ns (hysteresis {hyst})"
    );
    assert!(good >= 100_000_000, "busy neighbour billed {good} ns");
    // Re-checks off the GPU: backed off, bounded per capped interval.
    let rechecks = rig.b.stats().barrier_rechecks;
    let steps = (BARRIER_RECHECK_MAX_NS / BARRIER_RECHECK_MIN_NS).ilog2() as u64 + 1;
    let bound = steps + block / BARRIER_RECHECK_MAX_NS + 1;
    assert!(rechecks <= bound, "{rechecks} re-checks > {bound}");
    assert!(rechecks >= steps, "{rechecks}: the queue is re-checked");
    // The sim watched it only while it held the slot.
    let polls = rig.gpu.stats().blocked_polls;
    assert!(polls < 64, "{polls} GPU re-checks of a blocked queue");
    // The guest's CPU meets the dependency: the next re-check runs it.
    bad_vm.mem.write_u64(dep + 8, 0).unwrap();
    let t0 = rig.now;
    rig.run(u64::MAX, |_| false);
    assert_eq!(rig.completions_of(0), vec![0, 1]);
    bad_vm.verify(&bq).unwrap();
    let first = rig
        .log
        .iter()
        .position(|n| matches!(n, Notice::Completed { owner: 0, .. }))
        .unwrap();
    assert!(first > 0);
    assert!(rig.now <= t0 + BARRIER_RECHECK_MAX_NS + 10_000_000);
    assert_eq!(rig.b.stats().stall_wakes, 1);
}

/// A queue blocked on another VM's completion signal, off the GPU, is woken
/// by that completion (not by its re-check): its barrier completes in the
/// same instant, and each of its workgroups runs exactly once. A doorbell
/// while the barrier is unmet does not reach the scheduler.
#[test]
fn barrier_blocked_queue_wakes_on_the_completion_that_meets_it() {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::new(topo.clone());
    let mut a_vm = vm(&mut rig, 0, 8);
    let mut b_vm = vm(&mut rig, 1, 8);
    let mut aq = a_vm.queue(&topo, 64, 0);
    add(&mut rig, &a_vm, 0, QueueId(0), 0, &aq);
    // The producer: a second queue of VM 0 (signals live in its memory).
    let mut pq = a_vm.queue(&topo, 64, 0);
    add(&mut rig, &a_vm, 0, QueueId(2), 2, &pq);
    let bq = b_vm.queue(&topo, 64, 0);
    add(&mut rig, &b_vm, 1, QueueId(1), 1, &bq);
    let dep = a_vm.signal();
    barrier_then_mark(&mut a_vm, &mut aq, dep, 4, 10_000);
    rig.doorbell(QueueId(0), aq.wptr);
    rig.run(2_000_000_000, |_| false);
    assert!(!rig.b.on_gpu(QueueId(0)), "released after the hysteresis");
    rig.doorbell(QueueId(0), aq.wptr);
    assert_eq!(rig.b.stats().stalled_doorbells, 1);
    let before = rig.b.stats().barrier_rechecks;
    a_vm.kernel(&mut pq, KernelKind::Mark, 2, 64, 50_000, 9, false);
    let psig = *pq.signals.last().unwrap();
    // The barrier (slot 0) now waits on the producer's completion signal.
    a_vm.mem.write_u64(aq.ring + 8, psig).unwrap();
    rig.doorbell(QueueId(2), pq.wptr);
    rig.run(u64::MAX, |_| false);
    let done = |owner: usize| {
        rig.log
            .iter()
            .position(|n| matches!(n, Notice::Completed { owner: o, .. } if *o == owner))
            .unwrap()
    };
    assert!(done(2) < done(0));
    assert_eq!(rig.completions_of(0), vec![0, 1]);
    a_vm.verify(&aq).unwrap();
    a_vm.verify(&pq).unwrap();
    assert!(rig.b.stats().barrier_rechecks <= before + 1);
    assert_eq!(rig.b.stats().stall_wakes, 1);
}

/// What runs beside the good VM in [`beside`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Neighbour {
    /// Nothing.
    None,
    /// A legitimately busy VM: long kernels with save points.
    Busy,
    /// A VM that runs an unpreemptable (`NO_SAVE_POINT`) kernel that never
    /// ends, and submits another after each preemption-timeout reset (a
    /// guest reloading its queue).
    Hang,
}

/// Virtual time: a good VM (priority 8, `kernels` kernels of 2 x 100 ms
/// workgroups, two kernels at a time on the 4 CUs: 50 ms each alone)
/// beside `n` (priority 8). Returns when the good VM's last kernel
/// completed, the neighbour's preemption timeouts, and the good VM's
/// stalls: the sum of the gaps between its completions longer than 1 s.
fn beside(n: Neighbour, escalation: HangEscalation, kernels: u32) -> (Nanos, u64, Nanos) {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::new(topo.clone());
    rig.b.set_hang_escalation(escalation);
    let mut good_vm = vm(&mut rig, 0, 8);
    let mut bad_vm = vm(&mut rig, 1, 8);
    let mut good = good_vm.queue(&topo, 4096, 0);
    add(&mut rig, &good_vm, 0, QueueId(0), 0, &good);
    for k in 0..kernels {
        good_vm.kernel(&mut good, KernelKind::Mark, 2, 64, 100_000_000, k, false);
    }
    rig.doorbell(QueueId(0), good.wptr);
    let mut next_id = 100u64;
    let mut submit = |rig: &mut Rig, bad_vm: &mut TestVm| {
        let mut q = bad_vm.queue(&topo, 64, 0);
        let id = QueueId(next_id);
        next_id += 1;
        add(rig, bad_vm, 1, id, 1, &q);
        match n {
            Neighbour::None => {}
            Neighbour::Busy => {
                for k in 0..60 {
                    bad_vm.kernel(&mut q, KernelKind::Spin, 2, 64, 1_000_000_000, k, false);
                }
            }
            Neighbour::Hang => {
                bad_vm.kernel_flags = abi::kernel::flags::NO_SAVE_POINT;
                bad_vm.kernel(&mut q, KernelKind::Spin, 4, 64, 1 << 47, 0, false);
            }
        }
        rig.doorbell(id, q.wptr);
        id
    };
    let mut bad = submit(&mut rig, &mut bad_vm);
    let (mut last, mut stalls, mut done) = (0, 0, 0u32);
    while done < kernels {
        rig.log.clear();
        rig.run(u64::MAX, |n| {
            matches!(
                n,
                Notice::QueueError { owner: 1, .. }
                    | Notice::Removed { owner: 1, .. }
                    | Notice::Completed { owner: 0, .. }
            )
        });
        let mut progressed = false;
        for k in 0..rig.log.len() {
            match rig.log[k] {
                Notice::Completed { owner: 0, .. } => {
                    done += 1;
                    progressed = true;
                    let gap = rig.now - last;
                    if gap > 1_000_000_000 {
                        stalls += gap;
                    }
                    last = rig.now;
                }
                Notice::QueueError { owner: 1, .. } => {
                    // The guest sees error 22 and dequeues its vHQD ...
                    progressed = true;
                    let mut out = Vec::new();
                    rig.b
                        .remove_queue(&mut rig.gpu, rig.now, bad, None, &mut out)
                        .unwrap();
                    rig.take(out);
                }
                Notice::Removed { owner: 1, .. } => {
                    // ... then reloads it with another hanging kernel.
                    progressed = true;
                    bad = submit(&mut rig, &mut bad_vm);
                }
                _ => {}
            }
        }
        assert!(progressed, "the good VM stalled at {}", rig.now);
    }
    good_vm.verify(&good).unwrap();
    (rig.now, rig.b.stats().preempt_timeouts, stalls)
}

/// Issue 21, bounded harm from repeated hangs (virtual time): beside a VM
/// that re-hangs an unpreemptable kernel after every reset, the good VM's
/// stalls sum to at most the escalation's bound (`T / (1 - 2^-shift) + m *
/// floor`, [`HangEscalation`]) and its run takes at most its run beside a
/// legitimately busy VM plus that bound; without escalation every hang
/// costs the full timeout and the bound does not hold.
#[test]
fn repeated_hangs_cost_a_neighbour_a_bounded_time() {
    let esc = HangEscalation::default();
    let (alone, _, s0) = beside(Neighbour::None, esc, 1000);
    let (busy, _, s1) = beside(Neighbour::Busy, esc, 1000);
    let (hung, m, stalls) = beside(Neighbour::Hang, esc, 1000);
    let t = DEFAULT_PREEMPT_TIMEOUT_NS;
    let bound = t + t / 3 + m * esc.floor_ns;
    println!(
        "alone {alone} busy {busy} hang {hung} ns; stalls {s0} {s1} {stalls}, {m} timeouts, bound {bound}"
    );
    assert_eq!((s0, s1), (0, 0), "no stall alone or beside a busy VM");
    assert!(m >= 2, "the neighbour kept re-hanging: {m}");
    assert!(stalls <= bound, "stalls {stalls} > bound {bound}");
    assert!(hung <= busy + bound, "{hung} > {busy} + {bound}");
    // Without escalation the same guest costs the full timeout each time.
    let off = HangEscalation {
        window_ns: 0,
        ..esc
    };
    let (hung_off, m_off, stalls_off) = beside(Neighbour::Hang, off, 1000);
    println!("no escalation: {hung_off} ns, stalls {stalls_off}, {m_off} timeouts");
    assert!(stalls_off > bound, "{stalls_off}");
}

/// Issue 21: an idle high-priority VM that loads and unloads empty queues
/// (each load rings with the write index equal to the read index) preempts
/// nobody: the busy low-priority VM keeps the GPU, its kernels exact.
#[test]
fn load_churn_of_an_idle_vm_preempts_nobody() {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::no_reservations(topo.clone());
    let mut lo_vm = vm(&mut rig, 0, 2);
    let mut hi_vm = vm(&mut rig, 1, 12);
    let mut lo = lo_vm.queue(&topo, 64, 0);
    add(&mut rig, &lo_vm, 0, QueueId(0), 0, &lo);
    for k in 0..4 {
        lo_vm.kernel(&mut lo, KernelKind::Mark, 8, 64, 1_000_000, k, false);
    }
    rig.doorbell(QueueId(0), lo.wptr);
    rig.run(100_000, |_| false);
    let before = rig.b.scheduler().stats().preemptions;
    let empty = hi_vm.queue(&topo, 64, 0);
    for k in 0..50u64 {
        let q = QueueId(100 + k);
        add(&mut rig, &hi_vm, 1, q, 1, &empty);
        rig.doorbell(q, 0);
        let mut out = Vec::new();
        rig.b
            .remove_queue(
                &mut rig.gpu,
                rig.now,
                q,
                Some(DequeueMode::DrainPipe),
                &mut out,
            )
            .unwrap();
        rig.take(out);
        let t = rig.now + 100_000;
        rig.run(t, |_| false);
    }
    assert_eq!(rig.b.scheduler().stats().preemptions, before);
    rig.run(u64::MAX, |_| false);
    assert_eq!(rig.completions_of(0), vec![0, 1, 2, 3]);
    lo_vm.verify(&lo).unwrap();
}
