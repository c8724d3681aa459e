//! A split decision ([`Scheduler::handle_split`] + [`Scheduler::resume`])
//! queues exactly the actions and CU changes of [`Scheduler::handle`] and
//! leaves the same state, and the part before the split queues only the
//! preemptions' unmaps.

use crate::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
enum Op {
    Doorbell(usize),
    Idle(usize),
    FinishUnmap {
        has_work: bool,
    },
    Error(usize),
    Width(usize, u64),
    Wait(u64),
    Priority(u32, u8),
    /// Operator controls, each followed by a tick (as the arbiter's
    /// `control` does).
    Pause(u32, bool),
    Weight(u32, u32),
    Quantum(u32, Option<u64>),
    RemoveVm(u32),
    /// A doorbell with the write index last rung (stale).
    Stale(usize),
    /// A doorbell some microseconds after its plan was made.
    Late(usize, u64),
    /// The binding's stalled-queue path: the index is forgotten.
    Forget(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..16).prop_map(Op::Doorbell),
        3 => (0usize..16).prop_map(Op::Idle),
        4 => any::<bool>().prop_map(|has_work| Op::FinishUnmap { has_work }),
        1 => (0usize..16).prop_map(Op::Error),
        2 => (0usize..16, 1u64..200).prop_map(|(q, w)| Op::Width(q, w)),
        4 => (1u64..3_000).prop_map(Op::Wait),
        1 => (0u32..4, 0u8..16).prop_map(|(v, p)| Op::Priority(v, p)),
        1 => (0u32..4, any::<bool>()).prop_map(|(v, p)| Op::Pause(v, p)),
        1 => (0u32..4, 1u32..8).prop_map(|(v, w)| Op::Weight(v, w)),
        1 => (0u32..4, prop::option::of(1u64..3_000_000)).prop_map(|(v, q)| Op::Quantum(v, q)),
        1 => (0u32..16).prop_map(Op::RemoveVm),
        1 => (0usize..16).prop_map(Op::Stale),
        3 => (0usize..16, 1u64..3_000).prop_map(|(q, us)| Op::Late(q, us)),
        1 => (0usize..16).prop_map(Op::Forget),
    ]
}

/// Everything a caller sees of one event: actions (the ones before the
/// split first, marked), then CU changes.
type Seen = (Vec<Action>, Vec<(QueueId, SlotId, CuSet)>);

fn drain(s: &mut Scheduler, acts: &mut Vec<Action>) {
    while let Some(a) = s.poll_action() {
        acts.push(a);
    }
}

fn cu_changes(s: &mut Scheduler) -> Vec<(QueueId, SlotId, CuSet)> {
    std::iter::from_fn(|| s.poll_cu_change()).collect()
}

struct Pair {
    plain: Scheduler,
    split: Scheduler,
    now: Nanos,
    wptr: BTreeMap<QueueId, u64>,
    mapped: BTreeMap<QueueId, SlotId>,
    unmapping: Vec<QueueId>,
    timer: Option<Nanos>,
    splits: usize,
    /// Dispatch widths go to `plain` only.
    widths_to_plain_only: bool,
    /// Doorbell plans found to hold until a later time.
    plans_checked: usize,
}

impl Pair {
    fn new(cfg: SchedConfig, parts: u32, spatial: bool, prios: &[u8]) -> (Pair, Vec<QueueId>) {
        Self::with_geometry(cfg, parts, spatial.then_some((38, 1)), prios)
    }

    fn with_geometry(
        cfg: SchedConfig,
        parts: u32,
        geometry: Option<(u32, u32)>,
        prios: &[u8],
    ) -> (Pair, Vec<QueueId>) {
        let mut slots = Vec::new();
        for partition in 0..parts {
            for pipe in 0..2 {
                for queue in 0..2 {
                    slots.push(SlotDesc {
                        partition,
                        pipe,
                        queue,
                    });
                }
            }
        }
        let mk = || {
            let mut s = Scheduler::new(cfg.clone(), slots.clone()).unwrap();
            if let Some((cus, xccs)) = geometry {
                s.set_cu_geometry(cus, xccs);
            }
            s
        };
        let (mut plain, mut split) = (mk(), mk());
        let mut qs = Vec::new();
        for (v, &p) in prios.iter().enumerate() {
            for s in [&mut plain, &mut split] {
                s.add_vm(
                    VmId(v as u32),
                    VmParams {
                        priority: p,
                        weight: 1 + v as u32 % 3,
                        partition: None,
                    },
                )
                .unwrap();
                for i in 0..4 {
                    s.add_queue(VmId(v as u32), QueueId((v * 4 + i) as u64), (i % 2) as u8)
                        .unwrap();
                }
            }
            qs.extend((0..4).map(|i| QueueId((v * 4 + i) as u64)));
        }
        let pair = Pair {
            plain,
            split,
            now: 1,
            wptr: BTreeMap::new(),
            mapped: BTreeMap::new(),
            unmapping: Vec::new(),
            timer: None,
            splits: 0,
            widths_to_plain_only: false,
            plans_checked: 0,
        };
        (pair, qs)
    }

    /// A doorbell plan made now is the plan at `later` (before its
    /// `until`, nothing else reaching the scheduler): returns how many
    /// queues had one.
    fn plans_hold(&self, qs: &[QueueId], later: Nanos) -> usize {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut n = 0;
        for &q in qs {
            let Some(plan) = self.plain.doorbell_plan(q, self.now, &mut a) else {
                continue;
            };
            assert!(!a.is_empty() && plan.until > self.now);
            let at = later.min(plan.until - 1);
            assert_eq!(
                self.plain.doorbell_plan(q, at, &mut b),
                Some(plan),
                "{q:?} at {at}"
            );
            assert_eq!(a, b);
            n += 1;
        }
        n
    }

    /// One event to both; returns the actions it queued.
    fn event(&mut self, ev: Event) -> Result<Vec<Action>, TestCaseError> {
        let mut a = Vec::new();
        self.plain.handle(ev);
        drain(&mut self.plain, &mut a);
        let seen_a: Seen = (a, cu_changes(&mut self.plain));
        let mut b = Vec::new();
        if self.split.handle_split(ev) {
            self.splits += 1;
            drain(&mut self.split, &mut b);
            prop_assert!(!b.is_empty(), "split with nothing queued");
            prop_assert!(
                b.iter().all(|a| matches!(
                    a,
                    Action::Unmap {
                        mode: DequeueMode::SaveWaves | DequeueMode::ResetWaves,
                        ..
                    }
                )),
                "before the split: {b:?}"
            );
            self.split.resume();
        }
        drain(&mut self.split, &mut b);
        let seen_b: Seen = (b, cu_changes(&mut self.split));
        prop_assert_eq!(&seen_a, &seen_b, "event {:?}", ev);
        self.split.check_invariants().map_err(TestCaseError::fail)?;
        for &act in &seen_a.0 {
            match act {
                Action::Map { queue, slot } => {
                    self.mapped.insert(queue, slot);
                }
                Action::Unmap { queue, .. } => self.unmapping.push(queue),
                Action::ArmTimer { at } => self.timer = Some(at),
            }
        }
        Ok(seen_a.0)
    }

    /// A doorbell, checked against the plan made right before it (as a
    /// binding arms one): a plan for a new write index before its `until`
    /// names exactly the unmaps the decision queues first.
    fn doorbell(&mut self, queue: QueueId, wptr: u64) -> Result<(), TestCaseError> {
        self.late_doorbell(queue, wptr, 0)
    }

    /// [`Pair::doorbell`] with the plan made `after` ns before the
    /// doorbell, nothing reaching the scheduler in between (the arbiter
    /// arms at the end of a turn; a timer due meanwhile is served after
    /// the next turn's doorbells).
    fn late_doorbell(
        &mut self,
        queue: QueueId,
        wptr: u64,
        after: Nanos,
    ) -> Result<(), TestCaseError> {
        let mut victims = Vec::new();
        let plan = self.plain.doorbell_plan(queue, self.now, &mut victims);
        self.now += after;
        let now = self.now;
        let acts = self.event(Event::Doorbell { queue, wptr, now })?;
        if let Some(plan) = plan.filter(|p| p.seen_wptr != Some(wptr) && now < p.until) {
            let want: Vec<Action> = victims
                .iter()
                .map(|&(queue, slot)| Action::Unmap {
                    queue,
                    slot,
                    mode: plan.mode,
                })
                .collect();
            prop_assert!(
                acts.len() >= want.len() && acts[..want.len()] == want[..],
                "plan {plan:?} {want:?}, decision {acts:?}"
            );
            self.plans_checked += 1;
        }
        Ok(())
    }

    fn apply(&mut self, qs: &[QueueId], o: &Op) -> Result<(), TestCaseError> {
        let now = self.now;
        match *o {
            Op::Doorbell(i) => {
                let q = qs[i % qs.len()];
                let w = self.wptr.entry(q).or_insert(0);
                *w += 1;
                let wptr = *w;
                self.doorbell(q, wptr)?;
            }
            Op::Idle(i) => {
                let q = qs[i % qs.len()];
                if self.mapped.contains_key(&q) && !self.unmapping.contains(&q) {
                    self.event(Event::QueueIdle { queue: q, now })?;
                }
            }
            Op::FinishUnmap { has_work } => {
                if !self.unmapping.is_empty() {
                    let q = self.unmapping.remove(0);
                    self.mapped.remove(&q);
                    self.event(Event::Unmapped {
                        queue: q,
                        has_work,
                        save_ns: 20_000,
                        now,
                    })?;
                }
            }
            Op::Error(i) => {
                let q = qs[i % qs.len()];
                self.event(Event::QueueError { queue: q, now })?;
            }
            Op::Width(i, w) => {
                let q = qs[i % qs.len()];
                self.plain.note_dispatch_width(q, w);
                if !self.widths_to_plain_only {
                    self.split.note_dispatch_width(q, w);
                }
            }
            Op::Wait(us) => {
                self.plans_checked += self.plans_hold(qs, self.now + us * 1000);
                self.now += us * 1000;
                if self.timer.is_some_and(|t| t <= self.now) {
                    self.timer = None;
                    self.event(Event::Tick { now: self.now })?;
                }
            }
            Op::Priority(v, p) => {
                for s in [&mut self.plain, &mut self.split] {
                    let _ = s.set_vm_priority(VmId(v), p);
                }
                self.event(Event::Tick { now })?;
            }
            Op::Pause(v, p) => {
                for s in [&mut self.plain, &mut self.split] {
                    let _ = s.set_vm_paused(VmId(v), p);
                }
                self.event(Event::Tick { now })?;
            }
            Op::Weight(v, wt) => {
                for s in [&mut self.plain, &mut self.split] {
                    let _ = s.set_vm_weight(VmId(v), wt);
                }
                self.event(Event::Tick { now })?;
            }
            Op::Quantum(v, q) => {
                for s in [&mut self.plain, &mut self.split] {
                    let _ = s.set_vm_quantum(VmId(v), q);
                }
                self.event(Event::Tick { now })?;
            }
            Op::RemoveVm(v) => {
                // Rare: only VM 0..4 exist, most draws remove nothing.
                for s in [&mut self.plain, &mut self.split] {
                    let _ = s.remove_vm(VmId(v));
                }
                self.event(Event::Tick { now })?;
            }
            Op::Stale(i) => {
                let q = qs[i % qs.len()];
                let wptr = self.wptr.get(&q).copied().unwrap_or(0);
                self.doorbell(q, wptr)?;
            }
            Op::Late(i, us) => {
                let q = qs[i % qs.len()];
                let w = self.wptr.entry(q).or_insert(0);
                *w += 1;
                let wptr = *w;
                self.late_doorbell(q, wptr, us * 1000)?;
            }
            Op::Forget(i) => {
                let q = qs[i % qs.len()];
                for s in [&mut self.plain, &mut self.split] {
                    s.forget_doorbell(q);
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Under every policy and mode, with and without spatial sharing:
    /// same actions, same CU changes, same states and counters.
    #[test]
    fn split_decisions_equal_whole_ones(
        ops in prop::collection::vec(op(), 1..200),
        policy in prop::sample::select(Policy::ALL.to_vec()),
        parts in 1u32..3,
        spatial in any::<bool>(),
        corun in any::<bool>(),
    ) {
        let cfg = SchedConfig {
            policy,
            corun_equals: corun,
            min_run_ns: 100_000,
            aging_ns: 20_000_000,
            ..Default::default()
        };
        let (mut w, qs) = Pair::new(cfg, parts, spatial, &[2, 2, 9, 12]);
        for o in &ops {
            w.apply(&qs, o)?;
        }
        for q in &qs {
            prop_assert_eq!(w.plain.queue_state(*q), w.split.queue_state(*q));
        }
        for v in 0..4 {
            prop_assert_eq!(w.plain.vm_stats(VmId(v)), w.split.vm_stats(VmId(v)));
        }
        prop_assert_eq!(w.plain.stats(), w.split.stats());
        prop_assert_eq!(w.plain.spatial_stats(), w.split.spatial_stats());
        prop_assert_eq!(w.split.fast_stats().mismatched, 0);
        prop_assert_eq!(w.plain.fast_stats(), FastStats::default());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Where `dispatch_width_matters` says no (spatial sharing off, or an
    /// XCC too small for any reservation under the cap), decisions do not
    /// depend on the widths noted: a scheduler that never hears of them
    /// decides the same.
    #[test]
    fn widths_do_not_matter_where_the_scheduler_says_so(
        ops in prop::collection::vec(op(), 1..200),
        policy in prop::sample::select(Policy::ALL.to_vec()),
        geometry in prop::sample::select(vec![None, Some((2, 1)), Some((3, 8)), Some((38, 8))]),
        permille in prop::sample::select(vec![0u32, 250, 1000]),
    ) {
        let cfg = SchedConfig {
            policy,
            min_run_ns: 100_000,
            aging_ns: 20_000_000,
            spatial_max_permille: permille,
            ..Default::default()
        };
        let (mut w, qs) = Pair::with_geometry(cfg, 1, geometry, &[2, 2, 9, 12]);
        prop_assume!(!w.plain.dispatch_width_matters());
        w.widths_to_plain_only = true;
        for o in &ops {
            w.apply(&qs, o)?;
        }
        prop_assert_eq!(w.plain.stats(), w.split.stats());
    }
}

/// The doorbell fast path, exercised: 300 random runs of the priority
/// policies (with and without CU geometry, so reservations and
/// co-residence sometimes forbid it) whose doorbells often come from a
/// level above the busy ones. Every event's actions and the final states
/// equal the whole decisions', and the fast path was taken many times.
#[test]
fn doorbell_fast_path_is_taken_and_equals_whole_decisions() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let (mut taken, mut runs_taken, mut plans) = (0, 0, 0);
    for run in 0..300u32 {
        let ops = prop::collection::vec(op(), 1..200)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let policy = [Policy::Hqdmux, Policy::Reset][run as usize % 2];
        let geometry = [None, Some((2, 1)), Some((38, 1))][run as usize % 3];
        let cfg = SchedConfig {
            policy,
            min_run_ns: 100_000,
            aging_ns: 20_000_000,
            idle_unmap_ns: [50_000, 5_000_000][run as usize % 2],
            ..Default::default()
        };
        let (mut w, qs) = Pair::with_geometry(cfg, 1 + run % 2, geometry, &[2, 5, 9, 12]);
        for o in &ops {
            w.apply(&qs, o).unwrap();
        }
        for q in &qs {
            assert_eq!(w.plain.queue_state(*q), w.split.queue_state(*q));
        }
        assert_eq!(w.plain.stats(), w.split.stats());
        assert_eq!(w.plain.spatial_stats(), w.split.spatial_stats());
        let f = w.split.fast_stats();
        assert_eq!(f.mismatched, 0, "run {run}");
        taken += f.taken;
        runs_taken += u32::from(f.taken > 0);
        plans += w.plans_checked;
    }
    assert!(
        plans >= 100,
        "only {plans} doorbell plans checked over time"
    );
    assert!(
        taken >= 150 && runs_taken >= 100,
        "fast path taken {taken} times in {runs_taken} runs"
    );
}

/// An MI300X-like geometry with the default cap needs the widths; a 2-CU
/// XCC under a 25% cap, or no geometry, does not.
#[test]
fn dispatch_width_matters_follows_geometry_and_cap() {
    let (w, _) = Pair::with_geometry(SchedConfig::default(), 1, Some((38, 8)), &[2]);
    assert!(w.plain.dispatch_width_matters());
    // Half of one CU per XCC: no reservation fits.
    let (w, _) = Pair::with_geometry(SchedConfig::default(), 1, Some((1, 1)), &[2]);
    assert!(!w.plain.dispatch_width_matters());
    let (w, _) = Pair::with_geometry(SchedConfig::default(), 1, None, &[2]);
    assert!(!w.plain.dispatch_width_matters());
    let cfg = SchedConfig {
        policy: Policy::Fifo,
        ..Default::default()
    };
    let (w, _) = Pair::with_geometry(cfg, 1, Some((38, 8)), &[2]);
    assert!(!w.plain.dispatch_width_matters());
}

/// The doorbell of a higher level's queue while lower work holds every slot
/// is split: its preemptions come before the state changes.
#[test]
fn a_preempting_doorbell_is_split() {
    let (mut w, qs) = Pair::new(SchedConfig::default(), 1, false, &[2, 2, 12, 12]);
    let mut ops: Vec<Op> = (0..8).map(Op::Doorbell).collect();
    ops.push(Op::Wait(2_000));
    ops.push(Op::Doorbell(8));
    for o in &ops {
        w.apply(&qs, o).unwrap();
    }
    assert!(w.splits >= 1, "no split decision");
    assert!(w.split.stats().preemptions >= 1);
    // Level 12 above every busy level (2), no reservation possible: the
    // doorbell fast path queued the unmaps, and the decision agreed.
    assert_eq!(
        w.split.fast_stats(),
        FastStats {
            taken: 1,
            mismatched: 0
        }
    );
}

/// A caller that does not resume a split decision: the next `handle`
/// finishes it first (the preempted queues are Preempting, the winner's
/// work follows) and is itself never split.
#[test]
fn an_unresumed_split_is_finished_by_the_next_handle() {
    let (mut w, qs) = Pair::new(SchedConfig::default(), 1, false, &[2, 2, 12, 12]);
    for i in 0..8 {
        w.apply(&qs, &Op::Doorbell(i)).unwrap();
    }
    w.apply(&qs, &Op::Wait(2_000)).unwrap();
    let s = &mut w.split;
    let split = s.handle_split(Event::Doorbell {
        queue: qs[8],
        wptr: 1,
        now: w.now,
    });
    assert!(split, "the preempting doorbell was not split");
    let mut first = Vec::new();
    drain(s, &mut first);
    let victims: Vec<QueueId> = first
        .iter()
        .map(|a| match a {
            Action::Unmap { queue, .. } => *queue,
            a => panic!("before the split: {a:?}"),
        })
        .collect();
    assert!(!victims.is_empty());
    for q in &victims {
        assert_eq!(s.queue_state(*q).map(|x| x.0), Some(QueueState::Running));
    }
    s.handle(Event::Tick { now: w.now });
    for q in &victims {
        assert_eq!(s.queue_state(*q).map(|x| x.0), Some(QueueState::Preempting));
    }
    s.check_invariants().unwrap();
    // Nothing pending: another plain event is handled whole.
    s.handle(Event::Tick { now: w.now + 1 });
    s.check_invariants().unwrap();
}

/// A plan holds until a lower VM's idle mapped queue is due to give its
/// slot back: from then on the decision evicts that queue first, so the
/// plan ends there (`until`) and is not made at or after it.
#[test]
fn a_plan_ends_when_an_idle_mapped_queue_falls_due() {
    let cfg = SchedConfig {
        idle_unmap_ns: 1_000_000,
        ..Default::default()
    };
    let (mut w, qs) = Pair::new(cfg, 1, false, &[2, 12]);
    // VM 0's queues 0 and 2 (same queue priority) both run; queue 2 drains.
    w.apply(&qs, &Op::Doorbell(0)).unwrap();
    w.apply(&qs, &Op::Doorbell(2)).unwrap();
    w.apply(&qs, &Op::Idle(2)).unwrap();
    let s = &w.plain;
    assert_eq!(
        s.queue_state(qs[2]).map(|x| x.0),
        Some(QueueState::MappedIdle)
    );
    let idle_since = w.now;
    let mut victims = Vec::new();
    let plan = s
        .doorbell_plan(qs[4], w.now + 1, &mut victims)
        .expect("VM 1's doorbell preempts VM 0");
    let slot0 = s.queue_state(qs[0]).unwrap().1.unwrap();
    assert_eq!(victims, vec![(qs[0], slot0)]);
    assert_eq!(plan.until, idle_since + 1_000_000);
    assert_eq!(s.doorbell_plan(qs[4], plan.until, &mut victims), None);
    // A doorbell at `until` evicts the idle queue before the running one.
    // (`split` is `plain`'s twin: the same state.)
    let late = &mut w.split;
    late.handle(Event::Doorbell {
        queue: qs[4],
        wptr: 1,
        now: plan.until,
    });
    let first = late.poll_action();
    assert!(
        matches!(first, Some(Action::Unmap { queue, mode: DequeueMode::DrainPipe, .. }) if queue == qs[2]),
        "{first:?}"
    );
}
