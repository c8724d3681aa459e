//! The one scheduler <-> GPU binding, sans-IO.
//!
//! [`Binding`] owns the [`Scheduler`], the queues it schedules (owner, host
//! shadow MQD, memory) and which slot each one holds. It takes scheduler
//! inputs (doorbells, ticks, control changes) and GPU events, turns scheduler
//! actions into calls on a `&mut dyn PhysGpu`, and returns [`Notice`]s: what
//! the caller must do (arm a timer, tell a vHQD about a completion, an error,
//! or the end of its dequeue with the updated MQD).
//!
//! It has no threads, clocks or locks: time comes in through `now`
//! arguments. Both the real-time arbiter (`crate::arbiter`) and eval's
//! virtual-time driver run it, so the harness validates the event order the
//! VMM runs.
//!
//! **Event order: FIFO.** One input event is handed to the scheduler; its
//! actions are carried out in the order the scheduler emitted them; events
//! that carrying them out produces at once (a refused map becomes a queue
//! error, an unmap of a slot the GPU never loaded completes at once) are
//! queued behind and handled in arrival order until none is left.
//! A decision that preempts is split (`Scheduler::handle_split`): its
//! unmaps, the first actions it emits, are carried out before the scheduler
//! does its bookkeeping of them and the rest of the decision, which then
//! emits the remaining actions; the actions and their order are the same as
//! unsplit (only decisions that change no CU set are split).

use crate::backend::{CuMask, GpuError, GpuEvent, MapRequest, PhysGpu, QueueErrorReason};
use crate::mem::DmaMemory;
use crate::topology::GpuTopology;
use abi::mqd::V9Mqd;
pub use scheduler::PreemptReason;
use scheduler::{
    Action, DequeueMode, Event, Nanos, Policy, QueueId, QueueState, SchedConfig, SchedError,
    SchedNotice, Scheduler, SlotDesc, SlotId, VmId, VmParams,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

/// Most packets read per doorbell for their dispatch width.
pub const WIDTH_SCAN_PACKETS: u64 = 16;

/// The scheduler's view of a topology's user HQD slots (`SlotId(i)` = slot i).
pub fn slot_descs(topo: &GpuTopology) -> Vec<SlotDesc> {
    topo.user_slots()
        .iter()
        .map(|s| SlotDesc {
            partition: s.partition,
            pipe: s.pipe,
            queue: s.queue,
        })
        .collect()
}

/// What the caller must do after a binding call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice<O> {
    /// Deliver [`Binding::tick`] at (or after) `at`; replaces any earlier timer.
    ArmTimer {
        /// Deadline.
        at: Nanos,
    },
    /// A queue was loaded into a slot.
    Mapped {
        /// Queue.
        queue: QueueId,
        /// Owner.
        owner: O,
        /// Slot.
        slot: SlotId,
    },
    /// A packet completed.
    Completed {
        /// Queue.
        queue: QueueId,
        /// Owner.
        owner: O,
        /// Packet index.
        dispatch_id: u64,
        /// Completion signal address (0: none).
        signal: u64,
    },
    /// A dequeue finished: the queue left its slot. `mqd` is the updated
    /// shadow (read/write pointers, CWSR offsets).
    Unmapped {
        /// Queue.
        queue: QueueId,
        /// Owner.
        owner: O,
        /// Saved waves, partly dispatched packets or unread packets remain.
        has_work: bool,
        /// Updated MQD.
        mqd: Box<V9Mqd>,
        /// Of a preemption's save, the partition time the queue's own
        /// waves without a save point held while it waited for them
        /// (`GpuEvent::Unmapped::wait_held_ns`: billed to its VM, counted
        /// by the misbehaving-VM guard); 0 without such a wait and for the
        /// guest's own dequeue of the queue.
        save_wait_ns: Nanos,
    },
    /// The queue stopped on bad input (or the GPU refused its MQD).
    QueueError {
        /// Queue.
        queue: QueueId,
        /// Owner.
        owner: O,
        /// Why.
        reason: QueueErrorReason,
    },
    /// The GPU refused to map the queue for a reason other than its MQD.
    MapRefused {
        /// Queue.
        queue: QueueId,
        /// Owner.
        owner: O,
        /// Error.
        error: GpuError,
    },
    /// The scheduler preempted a running queue (its dequeue is handed to
    /// the GPU; [`Notice::Unmapped`] follows when it finishes): said once
    /// per preemption the scheduler counts, where it decides it.
    Preempted {
        /// The preempted queue.
        queue: QueueId,
        /// Its owner.
        owner: O,
        /// The slot it leaves.
        slot: SlotId,
        /// The VM the slot is taken for, if one (see
        /// [`scheduler::SchedNotice::Preempted`]).
        by: Option<VmId>,
        /// Why.
        reason: PreemptReason,
    },
    /// The scheduler boosted the queue by aging above every VM priority
    /// (docs/scheduling.md, "Aging"): said once per boost.
    Aged {
        /// The boosted queue.
        queue: QueueId,
        /// Its owner.
        owner: O,
    },
    /// A removed queue is gone: no slot holds it, no event will name it again.
    /// `mqd` is its final shadow MQD (to write back to the guest).
    Removed {
        /// Queue.
        queue: QueueId,
        /// Owner.
        owner: O,
        /// Final MQD.
        mqd: Box<V9Mqd>,
    },
}

impl<O: Copy> Notice<O> {
    /// The queue and its owner the notice is about (none for
    /// [`Notice::ArmTimer`]).
    pub fn queue_owner(&self) -> Option<(QueueId, O)> {
        match self {
            Notice::Mapped { queue, owner, .. }
            | Notice::Completed { queue, owner, .. }
            | Notice::Unmapped { queue, owner, .. }
            | Notice::QueueError { queue, owner, .. }
            | Notice::MapRefused { queue, owner, .. }
            | Notice::Preempted { queue, owner, .. }
            | Notice::Aged { queue, owner }
            | Notice::Removed { queue, owner, .. } => Some((*queue, *owner)),
            Notice::ArmTimer { .. } => None,
        }
    }

    /// The owner the notice names (none for [`Notice::ArmTimer`]).
    pub fn owner(&self) -> Option<O> {
        self.queue_owner().map(|(_, o)| o)
    }
}

struct QueueRec<O> {
    vm: VmId,
    owner: O,
    mqd: V9Mqd,
    mem: Arc<dyn DmaMemory>,
    /// Slot the GPU holds it in (set by a map, also by a refused one: the
    /// scheduler unmaps it after the error).
    slot: Option<SlotId>,
    /// Whether the GPU really loaded it (false after a refused map).
    on_gpu: bool,
    /// Mode to use for the dequeue that removes it (guest's dequeue request).
    exit_mode: Option<DequeueMode>,
    removing: bool,
    /// Write index up to which its packets were read for their dispatch
    /// width (spatial sharing).
    seen_wptr: u64,
    /// Went idle with its write index ahead of a packet it cannot run yet
    /// (an unpublished header, or a barrier-AND/OR whose dependencies are
    /// unmet): a doorbell counts once that packet can run.
    stalled: bool,
    /// Off the GPU and stalled on an unmet barrier: when to re-check its
    /// dependencies next and the current interval (doubling from
    /// [`BARRIER_RECHECK_MIN_NS`] to [`BARRIER_RECHECK_MAX_NS`]).
    recheck: Option<(Nanos, Nanos)>,
}

/// First re-check of a queue that left the GPU blocked on an unmet barrier
/// whose dependency no completion and no doorbell met (the guest's CPU
/// wrote it): ~1 ms after it left.
pub const BARRIER_RECHECK_MIN_NS: Nanos = 1 << 20;
/// Longest interval between re-checks of such a queue (~16.8 ms). Intervals
/// are powers of two on a common grid, so the re-checks of every blocked
/// queue at the cap fall on the same instants: one timer wake-up per
/// interval however many queues are blocked.
pub const BARRIER_RECHECK_MAX_NS: Nanos = 1 << 24;

/// Counters kept by the binding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BindingStats {
    /// Packets completed.
    pub completions: u64,
    /// Queue errors reported by the GPU or refused maps.
    pub queue_errors: u64,
    /// Dequeues that did not finish within their VM's preemption timeout
    /// (each reset its queue with [`QueueErrorReason::PreemptionTimeout`]).
    pub preempt_timeouts: u64,
    /// Doorbells of a stalled queue whose packet still could not run
    /// (unpublished, or a barrier with unmet dependencies)
    /// (not passed to the scheduler).
    pub stalled_doorbells: u64,
    /// Armed doorbells that handed their unmaps to the GPU before the
    /// decision ([`Binding::fire_armed`]).
    pub armed_fired: u64,
    /// Unmaps of armed doorbells that the decision did not queue (never
    /// expected; adopted as preemptions).
    pub armed_mismatched: u64,
    /// Re-checks of off-GPU queues blocked on a barrier (backed off: at
    /// most `log2(MAX / MIN) + 1` plus one per [`BARRIER_RECHECK_MAX_NS`]
    /// of a block, per queue).
    pub barrier_rechecks: u64,
    /// Stalled queues woken because what they waited on changed (a
    /// completion's signal write, a re-check, the GPU resolving it).
    pub stall_wakes: u64,
    /// Lower queues found with workgroups still on a drained reservation's
    /// CUs at its deadline (each saved: docs/scheduling.md, "A drain that
    /// overruns").
    pub drain_overruns: u64,
}

/// The next instant after `now` on the grid of `interval` (a power of two):
/// re-checks with the same interval coincide.
fn next_grid(now: Nanos, interval: Nanos) -> Nanos {
    let iv = interval.max(1);
    (now / iv).saturating_add(1).saturating_mul(iv)
}

/// The barrier-AND/OR packet at the MQD's read index, if that is one.
fn barrier_at(mem: &dyn DmaMemory, mqd: &V9Mqd) -> Option<(abi::aql::Barrier, bool)> {
    let mut raw = [0u8; abi::aql::PACKET_SIZE];
    mem.read(mqd.packet_addr(mqd.read_index()?), &mut raw)
        .ok()?;
    match abi::aql::Packet::decode(&raw).body {
        abi::aql::Body::BarrierAnd(b) => Some((b, true)),
        abi::aql::Body::BarrierOr(b) => Some((b, false)),
        _ => None,
    }
}

/// Whether the packet at `addr` can run now: published (not INVALID) and,
/// for a barrier-AND/OR, its dependencies met (a signal value of 0; an
/// unreadable signal counts as met, so that the GPU reports the error).
fn packet_can_run(mem: &dyn DmaMemory, addr: u64) -> bool {
    let mut raw = [0u8; abi::aql::PACKET_SIZE];
    if mem.read(addr, &mut raw).is_err() {
        return false;
    }
    let met = |s: u64| {
        s.checked_add(abi::queue::AMD_SIGNAL_VALUE as u64)
            .and_then(|a| mem.read_u64(a).ok())
            .is_none_or(|v| v == 0)
    };
    match abi::aql::Packet::decode(&raw).body {
        abi::aql::Body::Invalid => false,
        abi::aql::Body::BarrierAnd(b) => b.dep_signal.iter().filter(|&&s| s != 0).all(|&s| met(s)),
        abi::aql::Body::BarrierOr(b) => {
            let mut used = b.dep_signal.iter().filter(|&&s| s != 0).peekable();
            used.peek().is_none() || used.any(|&s| met(s))
        }
        _ => true,
    }
}

/// Escalation of repeated preemption timeouts (issue 21): each timeout
/// of a VM's dequeue remembered within `window_ns` divides that VM's
/// preemption timeout by `2^shift`, down to `floor_ns` (never above the
/// VM's own timeout), so that a VM whose preemptions keep timing out loses
/// the right to hold the GPU that long; the guard's quarantine
/// (`crate::guard`) is the next step. With the VM's timeout `T`, the `k`-th
/// timeout within a window (k = 0, 1, ...) waits at most
/// `max(T / 2^(shift k), floor)`: over any interval no longer than the
/// window, a neighbour waits on the VM's preemptions at most
/// `T / (1 - 2^-shift) + m * floor` (`m` timeouts at the floor), whatever
/// the VM does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HangEscalation {
    /// How long a timeout is remembered (ns); 0 disables escalation.
    pub window_ns: Nanos,
    /// Each remembered timeout divides the timeout by `2^shift`.
    pub shift: u32,
    /// Lowest escalated timeout (ns).
    pub floor_ns: Nanos,
}

impl Default for HangEscalation {
    /// 10 minutes, divide by 4, at least 100 ms: with KFD's 9 s the
    /// timeouts run 9 s, 2.25 s, 562 ms, 141 ms, 100 ms...; the waits
    /// over any 10 minutes sum to at most 12 s plus 100 ms per further
    /// timeout.
    fn default() -> Self {
        HangEscalation {
            window_ns: 600_000_000_000,
            shift: 2,
            floor_ns: 100_000_000,
        }
    }
}

/// Most timeouts remembered per VM for the escalation (older ones are
/// forgotten first; the timeout is at its floor long before).
const MAX_REMEMBERED_HANGS: usize = 64;

/// Default preemption timeout (ns): KFD's `queue_preemption_timeout_ms`, 9000 ms.
pub const DEFAULT_PREEMPT_TIMEOUT_NS: Nanos = 9_000_000_000;

/// Host time source for measuring decisions (eval); `None` by default.
pub type DecisionClock = Box<dyn FnMut() -> u64 + Send>;

/// Scheduler + queue ownership + slot map; see the module doc.
pub struct Binding<O: Copy> {
    sched: Scheduler,
    queues: HashMap<QueueId, QueueRec<O>>,
    /// Slot -> queue on it (maps issued and not yet unmapped).
    slots: Vec<Option<QueueId>>,
    pending: VecDeque<Event>,
    removing: Vec<QueueId>,
    stats: BindingStats,
    /// Queues the GPU holds (maps that succeeded, unmaps not finished).
    occupied: usize,
    clock: Option<DecisionClock>,
    decision_ns: Vec<u64>,
    /// Scheduler actions of one event, reused (no allocation per event).
    acts: Vec<Action>,
    /// Per-VM preemption timeout (ns); VMs not listed use
    /// [`DEFAULT_PREEMPT_TIMEOUT_NS`].
    preempt_timeout: HashMap<VmId, Nanos>,
    /// Times of each VM's recent preemption timeouts (escalation).
    hangs: HashMap<VmId, VecDeque<Nanos>>,
    escalation: HangEscalation,
    /// Stamps the first preemption handed to the GPU (benchmarks; see
    /// [`Binding::set_issue_clock`]).
    issue_clock: Option<DecisionClock>,
    preempt_issued: Option<u64>,
    /// Unmaps an armed doorbell handed to the GPU before its decision
    /// ([`Binding::fire_armed`]): queue, slot, scheduler mode, whether the
    /// GPU took it. The decision's own unmaps of them make no second call.
    early: Vec<(QueueId, SlotId, DequeueMode, bool)>,
    /// The queue whose doorbell the unmaps in `early` were fired for.
    early_for: Option<QueueId>,
    /// Scratch for [`Binding::check_drains`].
    drains_due: Vec<(QueueId, SlotId)>,
    /// Bumped by every call that may change what a doorbell decides (or
    /// that hands unmaps to the GPU): an [`ArmedDoorbell`] prepared at an
    /// older value is not fired.
    gen: u64,
    /// The scheduler's last timer request not yet due (merged with the
    /// barrier re-checks into one [`Notice::ArmTimer`]).
    sched_timer: Option<Nanos>,
    /// The last deadline handed out in a [`Notice::ArmTimer`].
    armed_at: Option<Nanos>,
    /// Some queue may have a barrier re-check (`QueueRec::recheck`): set
    /// when one is scheduled, cleared when a scan finds none, so that the
    /// scans cost nothing while no queue is blocked off the GPU.
    any_recheck: bool,
}

/// What a doorbell did ([`Binding::doorbell`]), said where it happened (a
/// stale index, a stalled queue; a [`Notice::Preempted`] among its
/// notices), so that callers need not compare scheduler counters around it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DoorbellOutcome {
    /// Doorbells that moved nothing: dropped by the scheduler as stale (the
    /// write index it had already seen), or rung for a queue stalled on a
    /// packet it cannot run: 0 or 1.
    pub stale: u64,
    /// Its decision preempted at least one queue.
    pub preempted: bool,
}

/// A doorbell's preemption prepared ahead of the doorbell, from a warm
/// cache (see [`Binding::arm_doorbell`]); handed to the GPU by
/// [`Binding::fire_armed`] before the doorbell's decision runs.
#[derive(Clone, Debug, Default)]
pub struct ArmedDoorbell {
    plan: Option<scheduler::DoorbellPlan>,
    victims: Vec<(QueueId, SlotId)>,
    timeouts: Vec<Option<Nanos>>,
    /// [`Binding`]'s change count when prepared.
    gen: u64,
    /// The queue whose doorbell it is prepared for.
    queue: Option<QueueId>,
}

impl ArmedDoorbell {
    /// Is a preemption prepared?
    pub fn is_armed(&self) -> bool {
        self.plan.is_some()
    }
}

impl<O: Copy> Binding<O> {
    /// A binding over `topo`'s user slots.
    pub fn new(topo: &GpuTopology, cfg: SchedConfig) -> Result<Self, SchedError> {
        let slots = slot_descs(topo);
        let n = slots.len();
        let mut sched = Scheduler::new(cfg, slots)?;
        sched.set_cu_geometry(topo.cus_per_xcc, topo.xccs_per_partition());
        // Preemptions and boosts reach the caller as notices.
        sched.record_notices(true);
        Ok(Binding {
            sched,
            queues: HashMap::new(),
            slots: vec![None; n],
            pending: VecDeque::new(),
            removing: Vec::new(),
            stats: BindingStats::default(),
            occupied: 0,
            clock: None,
            decision_ns: Vec::new(),
            acts: Vec::new(),
            preempt_timeout: HashMap::new(),
            hangs: HashMap::new(),
            escalation: HangEscalation::default(),
            issue_clock: None,
            preempt_issued: None,
            early: Vec::new(),
            early_for: None,
            drains_due: Vec::new(),
            gen: 0,
            sched_timer: None,
            armed_at: None,
            any_recheck: false,
        })
    }

    /// Measure each scheduler decision with `clock` (host ns); see
    /// [`Binding::decision_ns`].
    pub fn set_decision_clock(&mut self, clock: Option<DecisionClock>) {
        self.clock = clock;
    }

    /// Host ns per scheduler event (handle + action collection), if a clock is set.
    pub fn decision_ns(&self) -> &[u64] {
        &self.decision_ns
    }

    /// The scheduler (read-only: stats, parameters, configuration). Every
    /// change goes through the binding's own methods.
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// The scheduler, for a change: the one place the binding's change
    /// count is bumped for control changes, so an [`ArmedDoorbell`]
    /// prepared before it is never fired.
    fn sched_mut(&mut self) -> &mut Scheduler {
        self.gen += 1;
        &mut self.sched
    }

    /// Changes a VM's priority; follow with [`Binding::tick`] to apply it.
    pub fn set_vm_priority(&mut self, vm: VmId, priority: u8) -> Result<(), SchedError> {
        self.sched_mut().set_vm_priority(vm, priority)
    }

    /// Changes a VM's weight; follow with [`Binding::tick`] to apply it.
    pub fn set_vm_weight(&mut self, vm: VmId, weight: u32) -> Result<(), SchedError> {
        self.sched_mut().set_vm_weight(vm, weight)
    }

    /// Pauses or resumes a VM; follow with [`Binding::tick`] to apply it.
    pub fn set_vm_paused(&mut self, vm: VmId, paused: bool) -> Result<(), SchedError> {
        self.sched_mut().set_vm_paused(vm, paused)
    }

    /// Sets a VM's slice length (`None`: its priority's quantum); follow
    /// with [`Binding::tick`] to apply it.
    pub fn set_vm_quantum(&mut self, vm: VmId, quantum: Option<Nanos>) -> Result<(), SchedError> {
        self.sched_mut().set_vm_quantum(vm, quantum)
    }

    /// Changes the policy (mapped queues stay mapped until it decides
    /// otherwise); follow with [`Binding::tick`] to apply it.
    pub fn set_policy(&mut self, policy: Policy) {
        self.sched_mut().set_policy(policy);
    }

    /// Ends a run at `now`: a last tick brings the scheduler's accounting
    /// (GPU time per VM) up to `now`; the actions it decides are dropped
    /// and the GPU is not called (the run is over).
    pub fn close_books(&mut self, now: Nanos) {
        let sched = self.sched_mut();
        sched.handle(Event::Tick { now });
        while sched.poll_action().is_some() {}
        while sched.poll_notice().is_some() {}
    }

    /// Counters.
    pub fn stats(&self) -> BindingStats {
        self.stats
    }

    /// Slots the GPU holds a queue in now (maps that succeeded, dequeues
    /// not finished).
    pub fn occupied(&self) -> usize {
        self.occupied
    }

    /// The queue in slot `slot`, if a map was issued there and its dequeue
    /// has not finished.
    pub fn slot_queue(&self, slot: SlotId) -> Option<QueueId> {
        self.slots.get(slot.0 as usize).copied().flatten()
    }

    /// Adds a VM to the scheduler.
    pub fn add_vm(&mut self, vm: VmId, params: VmParams) -> Result<(), SchedError> {
        self.gen += 1;
        self.sched.add_vm(vm, params).map(|_| ())
    }

    /// Removes a VM: its queues are reset-unmapped; each one's end is a
    /// [`Notice::Removed`].
    pub fn remove_vm(
        &mut self,
        gpu: &mut dyn PhysGpu,
        now: Nanos,
        vm: VmId,
        out: &mut Vec<Notice<O>>,
    ) -> Result<(), SchedError> {
        self.gen += 1;
        self.sched.remove_vm(vm)?;
        self.hangs.remove(&vm);
        let qs: Vec<QueueId> = self
            .queues
            .iter()
            .filter(|(_, r)| r.vm == vm)
            .map(|(q, _)| *q)
            .collect();
        for q in qs {
            self.mark_removing(q);
        }
        self.tick(gpu, now, out);
        // Its queues' dequeues were requested with its timeout; the entry
        // goes with the VM (a fleet that adds and removes VMs stays bounded).
        self.preempt_timeout.remove(&vm);
        Ok(())
    }

    /// Per-VM entries the binding holds (preemption timeouts, hang
    /// histories) beside the scheduler's VMs.
    pub fn vm_entries(&self) -> usize {
        self.preempt_timeout.len() + self.hangs.len() + self.sched.vm_count()
    }

    fn mark_removing(&mut self, q: QueueId) {
        self.gen += 1;
        if let Some(r) = self.queues.get_mut(&q) {
            if !r.removing {
                r.removing = true;
                self.removing.push(q);
            }
        }
    }

    /// Adds an idle queue (`mqd`: its validated shadow; `prio` 0..=15).
    pub fn add_queue(
        &mut self,
        vm: VmId,
        queue: QueueId,
        owner: O,
        prio: u8,
        mqd: V9Mqd,
        mem: Arc<dyn DmaMemory>,
    ) -> Result<(), SchedError> {
        self.gen += 1;
        if self.queues.contains_key(&queue) {
            return Err(SchedError::DuplicateQueue(queue));
        }
        self.sched.add_queue(vm, queue, prio)?;
        self.queues.insert(
            queue,
            QueueRec {
                vm,
                owner,
                mqd,
                mem,
                slot: None,
                on_gpu: false,
                exit_mode: None,
                removing: false,
                seen_wptr: u64::MAX,
                stalled: false,
                recheck: None,
            },
        );
        Ok(())
    }

    /// Removes a queue. A mapped one is dequeued with `mode` (the guest's
    /// `CP_HQD_DEQUEUE_REQUEST`; the scheduler's own removal mode when
    /// `None`) unless a dequeue is already under way. Its end is a
    /// [`Notice::Removed`] carrying the final MQD.
    pub fn remove_queue(
        &mut self,
        gpu: &mut dyn PhysGpu,
        now: Nanos,
        queue: QueueId,
        mode: Option<DequeueMode>,
        out: &mut Vec<Notice<O>>,
    ) -> Result<(), SchedError> {
        let Some(r) = self.queues.get_mut(&queue) else {
            return Err(SchedError::NoQueue(queue));
        };
        if r.removing {
            return Ok(());
        }
        r.exit_mode = mode;
        self.mark_removing(queue);
        self.sched.remove_queue(queue)?;
        self.tick(gpu, now, out);
        Ok(())
    }

    /// Whether the GPU holds the queue now (a map that succeeded, its
    /// dequeue not finished).
    pub fn on_gpu(&self, queue: QueueId) -> bool {
        self.queues.get(&queue).is_some_and(|r| r.on_gpu)
    }

    /// The VM a queue belongs to.
    pub fn queue_vm(&self, queue: QueueId) -> Option<VmId> {
        self.queues.get(&queue).map(|r| r.vm)
    }

    /// Per VM with queues, whether it is demanding now (a queue with work
    /// it could run: ready, saved, running or being preempted) and whether
    /// it is waiting for a slot (a queue ready or saved, none running);
    /// `out` is cleared first. The promise's demand (docs/scheduling.md).
    pub fn demand_states(&self, out: &mut BTreeMap<VmId, (bool, bool)>) {
        out.clear();
        for (q, r) in &self.queues {
            let Some((st, _)) = self.sched.queue_state(*q) else {
                continue;
            };
            let e = out.entry(r.vm).or_insert((false, false));
            match st {
                QueueState::Ready | QueueState::Saved => {
                    e.0 = true;
                    e.1 = true;
                }
                QueueState::Running | QueueState::Preempting => e.0 = true,
                QueueState::Idle | QueueState::MappedIdle | QueueState::Error => {}
            }
        }
        // Waiting only while none of its queues runs.
        for (q, r) in &self.queues {
            if let Some((QueueState::Running, _)) = self.sched.queue_state(*q) {
                if let Some(e) = out.get_mut(&r.vm) {
                    e.1 = false;
                }
            }
        }
    }

    /// The queue's shadow MQD.
    pub fn mqd(&self, queue: QueueId) -> Option<&V9Mqd> {
        self.queues.get(&queue).map(|r| &r.mqd)
    }

    /// Doorbell with the write index read from the queue's poll address: the
    /// GPU hears it if the queue is loaded, then the scheduler. Returns what
    /// it did (stale, preempted).
    pub fn doorbell(
        &mut self,
        gpu: &mut dyn PhysGpu,
        now: Nanos,
        queue: QueueId,
        wptr: u64,
        out: &mut Vec<Notice<O>>,
    ) -> DoorbellOutcome {
        let from = out.len();
        let stale = self.doorbell_inner(gpu, now, queue, wptr, out);
        DoorbellOutcome {
            stale: u64::from(stale),
            preempted: out[from..]
                .iter()
                .any(|n| matches!(n, Notice::Preempted { .. })),
        }
    }

    /// [`Binding::doorbell`]; returns whether it was stale (moved nothing).
    fn doorbell_inner(
        &mut self,
        gpu: &mut dyn PhysGpu,
        now: Nanos,
        queue: QueueId,
        wptr: u64,
        out: &mut Vec<Notice<O>>,
    ) -> bool {
        let Some(r) = self.queues.get(&queue) else {
            return false;
        };
        if r.removing {
            return false;
        }
        let stalled = r.stalled;
        if !r.on_gpu && r.slot.is_none() && r.mqd.read_index().is_some_and(|rp| wptr <= rp) {
            // Off the GPU with nothing to run (an empty ring: a fresh load,
            // a re-ring after its work is done): no work for the scheduler,
            // so an idle VM's load/unload churn preempts nobody (issue 21).
            self.stats.stalled_doorbells += 1;
            return true;
        }
        if let (Some(slot), true) = (r.slot, r.on_gpu) {
            gpu.doorbell(now, slot, wptr);
        }
        if stalled {
            if !self.stall_published(gpu, queue) {
                // Still waiting on an unpublished packet or an unmet
                // barrier: no work to schedule (progress-based busy).
                self.stats.stalled_doorbells += 1;
                return true;
            }
            if let Some(r) = self.queues.get_mut(&queue) {
                r.stalled = false;
                r.recheck = None;
                // The same write index again: read the now published packet
                // for its dispatch width.
                r.seen_wptr = u64::MAX;
            }
            self.sched.forget_doorbell(queue);
        }
        // The dispatch width sizes a spatial reservation; where none can
        // exist it cannot change this decision and is read after it (the
        // guest's packets are not read before the preemption is issued).
        let widths_first = self.sched.dispatch_width_matters();
        if widths_first {
            self.note_widths(&*gpu, queue, wptr);
        }
        // The scheduler drops a doorbell with the index it saw last.
        let stale = self.sched.seen_wptr(queue) == Some(wptr);
        self.event(gpu, Event::Doorbell { queue, wptr, now }, out);
        self.settle_early(gpu, now, out);
        if !widths_first {
            self.note_widths(&*gpu, queue, wptr);
        }
        stale
    }

    /// Prepares the preemption a doorbell of `queue` would cause (see
    /// [`Scheduler::doorbell_plan`]) into `armed`, for
    /// [`Binding::fire_armed`]: a caller that sleeps between doorbells
    /// calls this after its other work, while its cache is warm, so that
    /// the doorbell hands the CWSR saves to the GPU after a few reads.
    /// Arms nothing (returns `false`) where the plan could differ from the
    /// decision: the queue stalled or going away, a victim not on the GPU
    /// or being removed, or dispatch widths read before the decision.
    pub fn arm_doorbell(&self, queue: QueueId, now: Nanos, armed: &mut ArmedDoorbell) -> bool {
        armed.plan = None;
        armed.timeouts.clear();
        armed.gen = self.gen;
        armed.queue = Some(queue);
        // Unmaps fired and not yet settled by a doorbell: nothing more
        // goes to the GPU ahead of the scheduler.
        if !self.early.is_empty()
            || !self
                .queues
                .get(&queue)
                .is_some_and(|r| !r.removing && !r.stalled)
            || self.sched.dispatch_width_matters()
        {
            return false;
        }
        let Some(plan) = self.sched.doorbell_plan(queue, now, &mut armed.victims) else {
            return false;
        };
        let mode = plan.mode;
        for &(v, slot) in &armed.victims {
            match self.queues.get(&v) {
                Some(r) if r.on_gpu && !r.removing && r.slot == Some(slot) => {}
                _ => return false,
            }
            armed.timeouts.push(match mode {
                DequeueMode::ResetWaves => None,
                _ => Some(self.queue_preempt_timeout(v, now)),
            });
        }
        armed.plan = Some(plan);
        true
    }

    /// Is `armed` of the binding's current state (nothing changed since
    /// [`Binding::arm_doorbell`] prepared it)?
    pub fn armed_current(&self, armed: &ArmedDoorbell) -> bool {
        armed.gen == self.gen
    }

    /// A doorbell of the queue `armed` was prepared for, with write index
    /// `wptr`, at `now`: hands the prepared unmaps to the GPU unless the
    /// index is the one the scheduler saw (stale), the plan expired, or
    /// anything reached the binding since [`Binding::arm_doorbell`] (an
    /// event, a scheduler or queue change, another firing: the plan may
    /// be of an older state). The caller passes the doorbell to
    /// [`Binding::doorbell`] right after; its decision queues the same
    /// unmaps, which reach the GPU only once. Returns whether it fired.
    pub fn fire_armed(
        &mut self,
        gpu: &mut dyn PhysGpu,
        now: Nanos,
        armed: &ArmedDoorbell,
        wptr: u64,
    ) -> bool {
        let Some(plan) = armed.plan else {
            return false;
        };
        if plan.seen_wptr == Some(wptr) || now >= plan.until || armed.gen != self.gen {
            return false;
        }
        // Fired once: the same preparation (or any other) is stale now.
        self.gen += 1;
        if self.preempt_issued.is_none() {
            if let Some(c) = self.issue_clock.as_mut() {
                self.preempt_issued = Some(c());
            }
        }
        let mode = plan.mode;
        self.early_for = armed.queue;
        for (&(q, slot), &timeout) in armed.victims.iter().zip(&armed.timeouts) {
            let ok = gpu.unmap_within(now, slot, mode, timeout).is_ok();
            self.early.push((q, slot, plan.mode, ok));
        }
        self.stats.armed_fired += 1;
        true
    }

    /// Unmaps an armed doorbell handed to the GPU that its decision did
    /// not queue (never expected): the scheduler adopts them as
    /// preemptions and they are carried out as its own.
    fn settle_early(&mut self, gpu: &mut dyn PhysGpu, now: Nanos, out: &mut Vec<Notice<O>>) {
        self.early_for = None;
        while let Some(&(queue, slot, mode, _)) = self.early.first() {
            self.stats.armed_mismatched += 1;
            log::error!(
                "host bug: a prepared dequeue of {queue:?} on slot {slot:?} was not decided; adopted as a preemption"
            );
            self.sched.adopt_unmap(queue, mode);
            self.action(gpu, now, Action::Unmap { queue, slot, mode }, out);
            // `action` took the entry (same queue, slot and mode).
            if self
                .early
                .first()
                .is_some_and(|e| e.0 == queue && e.1 == slot)
            {
                self.early.remove(0);
            }
            self.pump(gpu, out);
        }
    }

    /// The timer fired, or the caller changed something through a control
    /// method ([`Binding::set_vm_priority`], ...).
    pub fn tick(&mut self, gpu: &mut dyn PhysGpu, now: Nanos, out: &mut Vec<Notice<O>>) {
        if self.sched_timer.is_some_and(|t| t <= now) {
            self.sched_timer = None;
        }
        if self.armed_at.is_some_and(|t| t <= now) {
            self.armed_at = None;
        }
        self.recheck_barriers(gpu, now, out);
        self.check_drains(&*gpu, now);
        self.event(gpu, Event::Tick { now }, out);
        self.rearm(out);
    }

    /// At a drained reservation's deadline, reports each lower queue whose
    /// workgroups are still outside its CU set (or that the GPU cannot
    /// tell about) to the scheduler, which saves it at the tick's decision
    /// (docs/scheduling.md, "A drain that overruns").
    fn check_drains(&mut self, gpu: &dyn PhysGpu, now: Nanos) {
        let mut due = std::mem::take(&mut self.drains_due);
        self.sched.drains_due(now, &mut due);
        for &(queue, slot) in &due {
            let on_slot = self
                .queues
                .get(&queue)
                .is_some_and(|r| r.on_gpu && r.slot == Some(slot));
            if on_slot && gpu.wgs_outside_mask(slot) != Some(false) {
                self.stats.drain_overruns += 1;
                self.sched.drain_overdue(queue);
            }
        }
        self.drains_due = due;
    }

    /// Re-checks the off-GPU queues blocked on a barrier whose re-check is
    /// due: a met barrier wakes its queue; an unmet one doubles its
    /// interval (up to the cap) and waits for the next grid instant.
    fn recheck_barriers(&mut self, gpu: &mut dyn PhysGpu, now: Nanos, out: &mut Vec<Notice<O>>) {
        if !self.any_recheck {
            return;
        }
        let due: Vec<QueueId> = self
            .queues
            .iter()
            .filter(|(_, r)| r.recheck.is_some_and(|(at, _)| at <= now))
            .map(|(q, _)| *q)
            .collect();
        for queue in due {
            self.stats.barrier_rechecks += 1;
            if self.stall_published(&*gpu, queue) {
                self.wake(gpu, now, queue, out);
            } else if let Some(r) = self.queues.get_mut(&queue) {
                if let Some((_, iv)) = r.recheck {
                    let iv = iv.saturating_mul(2).min(BARRIER_RECHECK_MAX_NS);
                    r.recheck = Some((next_grid(now, iv), iv));
                }
            }
        }
    }

    /// The earliest barrier re-check scheduled (clears `any_recheck` when
    /// there is none).
    fn next_recheck(&mut self) -> Option<Nanos> {
        if !self.any_recheck {
            return None;
        }
        let t = self
            .queues
            .values()
            .filter_map(|r| r.recheck.map(|(at, _)| at))
            .min();
        self.any_recheck = t.is_some();
        t
    }

    /// A stalled queue can run again (what it waited on changed): tell the
    /// scheduler as a doorbell would.
    fn wake(
        &mut self,
        gpu: &mut dyn PhysGpu,
        now: Nanos,
        queue: QueueId,
        out: &mut Vec<Notice<O>>,
    ) {
        let Some(r) = self.queues.get_mut(&queue) else {
            return;
        };
        if r.removing || !r.stalled {
            return;
        }
        r.stalled = false;
        r.recheck = None;
        r.seen_wptr = u64::MAX;
        let wptr = match (r.slot, r.on_gpu) {
            (Some(s), true) => gpu.query(s).map(|st| st.wptr),
            _ => None,
        }
        .unwrap_or_else(|| r.mqd.write_index());
        self.stats.stall_wakes += 1;
        self.sched.forget_doorbell(queue);
        self.event(gpu, Event::Doorbell { queue, wptr, now }, out);
    }

    /// Hands out the earlier of the scheduler's timer and the next barrier
    /// re-check, when it changed.
    fn rearm(&mut self, out: &mut Vec<Notice<O>>) {
        let recheck = self.next_recheck();
        let at = match (self.sched_timer, recheck) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(at) = at {
            if self.armed_at != Some(at) {
                self.armed_at = Some(at);
                out.push(Notice::ArmTimer { at });
            }
        }
    }

    /// Reports that queue `queue` stopped on an error found outside the GPU
    /// (e.g. its write pointer became unreadable).
    pub fn queue_error(
        &mut self,
        gpu: &mut dyn PhysGpu,
        now: Nanos,
        queue: QueueId,
        out: &mut Vec<Notice<O>>,
    ) {
        if self.queues.contains_key(&queue) {
            self.event(gpu, Event::QueueError { queue, now }, out);
        }
    }

    /// One GPU event (from `PhysGpu::advance`), handled at `now`.
    pub fn gpu_event(
        &mut self,
        gpu: &mut dyn PhysGpu,
        now: Nanos,
        ev: GpuEvent,
        out: &mut Vec<Notice<O>>,
    ) {
        self.gpu_event_inner(gpu, now, ev, out);
        self.rearm(out);
    }

    fn gpu_event_inner(
        &mut self,
        gpu: &mut dyn PhysGpu,
        now: Nanos,
        ev: GpuEvent,
        out: &mut Vec<Notice<O>>,
    ) {
        self.gen += 1;
        match ev {
            GpuEvent::PacketCompleted {
                tag,
                dispatch_id,
                signal,
                ..
            } => {
                let queue = QueueId(tag);
                self.stats.completions += 1;
                if let Some(r) = self.queues.get(&queue) {
                    out.push(Notice::Completed {
                        queue,
                        owner: r.owner,
                        dispatch_id,
                        signal,
                    });
                    // A stalled queue on the GPU completed a packet: the GPU
                    // resolved what it waited on (a barrier's re-check, a
                    // header published without a doorbell).
                    if r.stalled {
                        self.wake(gpu, now, queue, out);
                    }
                }
                if signal != 0 && self.any_recheck {
                    // The completion wrote a signal: off-GPU queues blocked on
                    // a barrier may wait on it (the GPU re-checks its own).
                    let blocked: Vec<QueueId> = self
                        .queues
                        .iter()
                        .filter(|(_, r)| r.recheck.is_some())
                        .map(|(q, _)| *q)
                        .collect();
                    for q in blocked {
                        if self.stall_published(&*gpu, q) {
                            self.wake(gpu, now, q, out);
                        }
                    }
                }
            }
            GpuEvent::QueueIdle { tag, slot, .. } => {
                self.note_stall(gpu, QueueId(tag), Some(slot), None);
                self.event(
                    gpu,
                    Event::QueueIdle {
                        queue: QueueId(tag),
                        now,
                    },
                    out,
                )
            }
            GpuEvent::Unmapped {
                tag,
                mqd,
                has_work,
                save_ns,
                wait_ns,
                wait_held_ns,
                ..
            } => {
                let queue = QueueId(tag);
                if wait_ns > 0 {
                    // Billed to the queue's VM (its waves ran) for the
                    // part of the partition they held, the rest to the
                    // VMs whose waves had the CUs it gave back.
                    self.sched.note_save_wait(queue, wait_ns);
                    self.sched.note_save_wait_held(queue, wait_held_ns);
                }
                if !has_work {
                    self.note_stall(gpu, queue, None, Some(&mqd));
                }
                if let Some(r) = self.queues.get_mut(&queue) {
                    r.mqd = (*mqd).clone();
                    r.recheck = None;
                    if r.stalled && !r.removing && !has_work {
                        // Off the GPU, nobody polls it: re-check a blocked
                        // barrier with a backoff (a header needs a doorbell).
                        if barrier_at(&*r.mem, &r.mqd).is_some() {
                            let iv = BARRIER_RECHECK_MIN_NS;
                            r.recheck = Some((next_grid(now, iv), iv));
                            self.any_recheck = true;
                        }
                    }
                    // The guest's own dequeue of its queue takes nothing
                    // back from it: only a preemption's wait is counted.
                    let save_wait_ns = if r.removing || wait_ns == 0 {
                        0
                    } else {
                        wait_held_ns.min(wait_ns)
                    };
                    self.slot_freed(queue);
                    let owner = self.queues[&queue].owner;
                    out.push(Notice::Unmapped {
                        queue,
                        owner,
                        has_work,
                        mqd,
                        save_wait_ns,
                    });
                }
                self.event(
                    gpu,
                    Event::Unmapped {
                        queue,
                        has_work,
                        save_ns,
                        now,
                    },
                    out,
                );
                // A barrier met since the GPU last looked: runnable at once.
                if self.queues.get(&queue).is_some_and(|r| r.recheck.is_some())
                    && self.stall_published(&*gpu, queue)
                {
                    self.wake(gpu, now, queue, out);
                }
            }
            GpuEvent::DequeueTimedOut {
                slot,
                tag,
                waited_ns,
                ..
            } => self.dequeue_timed_out(gpu, now, QueueId(tag), slot, waited_ns, out),
            GpuEvent::QueueError { tag, reason, .. } => {
                let queue = QueueId(tag);
                self.stats.queue_errors += 1;
                if let Some(r) = self.queues.get(&queue) {
                    out.push(Notice::QueueError {
                        queue,
                        owner: r.owner,
                        reason,
                    });
                }
                self.event(gpu, Event::QueueError { queue, now }, out);
            }
        }
    }

    /// Records whether an idle queue is stalled (read index behind its write
    /// index: the packet at the read index is not published), from the GPU's
    /// slot status or the MQD of its dequeue.
    fn note_stall(
        &mut self,
        gpu: &dyn PhysGpu,
        queue: QueueId,
        slot: Option<SlotId>,
        mqd: Option<&V9Mqd>,
    ) {
        let behind = match (slot, mqd) {
            (_, Some(m)) => m.read_index().is_some_and(|r| r < m.write_index()),
            (Some(s), None) => gpu.query(s).is_some_and(|st| st.rptr < st.wptr),
            (None, None) => false,
        };
        if let Some(r) = self.queues.get_mut(&queue) {
            r.stalled = behind;
        }
    }

    /// Whether the packet a stalled queue waits on is published now.
    fn stall_published(&self, gpu: &dyn PhysGpu, queue: QueueId) -> bool {
        let Some(r) = self.queues.get(&queue) else {
            return false;
        };
        let rptr = match (r.slot, r.on_gpu) {
            (Some(s), true) => gpu.query(s).map(|st| st.rptr),
            _ => r.mqd.read_index(),
        };
        let Some(rptr) = rptr else { return false };
        packet_can_run(&*r.mem, r.mqd.packet_addr(rptr))
    }

    fn slot_freed(&mut self, queue: QueueId) {
        if let Some(r) = self.queues.get_mut(&queue) {
            if std::mem::take(&mut r.on_gpu) {
                self.occupied -= 1;
            }
            if let Some(s) = r.slot.take() {
                if let Some(e) = self.slots.get_mut(s.0 as usize) {
                    *e = None;
                }
            }
        }
    }

    fn event(&mut self, gpu: &mut dyn PhysGpu, ev: Event, out: &mut Vec<Notice<O>>) {
        // Fired unmaps belong to the next doorbell of their queue; any
        // other event first settles them (a caller that fired and then did
        // not pass the doorbell, e.g. after a panic), so that no later,
        // unrelated decision takes them for its own unmaps.
        if !self.early.is_empty()
            && !matches!(ev, Event::Doorbell { queue, .. } if Some(queue) == self.early_for)
        {
            let now = ev.now();
            self.settle_early(gpu, now, out);
        }
        self.gen += 1;
        self.pending.push_back(ev);
        self.pump(gpu, out);
    }

    /// Handles queued events in FIFO order until none is left, then reaps
    /// removed queues.
    fn pump(&mut self, gpu: &mut dyn PhysGpu, out: &mut Vec<Notice<O>>) {
        while let Some(ev) = self.pending.pop_front() {
            let now = ev.now();
            let t0 = self.clock.as_mut().map(|c| c());
            let split = self.sched.handle_split(ev);
            let mut acts = std::mem::take(&mut self.acts);
            // A decision that preempts may be split: its unmaps (all it
            // queued so far) go to the GPU now, before the scheduler's
            // bookkeeping of them and the rest of the decision, so the
            // CWSR saves start a few microseconds earlier on a cold cache.
            // The actions and their order are those of an unsplit decision.
            let mut early_ns = 0;
            if split {
                let t1 = self.clock.as_mut().map(|c| c());
                while let Some(a) = self.sched.poll_action() {
                    acts.push(a);
                }
                // The decision is finished even if the backend panics here
                // (the caller may catch it and go on using the binding).
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    for a in acts.drain(..) {
                        self.action(gpu, now, a, out);
                    }
                }));
                if let (Some(t1), Some(c)) = (t1, self.clock.as_mut()) {
                    early_ns = c().saturating_sub(t1);
                }
                self.sched.resume();
                if let Err(panic) = r {
                    std::panic::resume_unwind(panic);
                }
            }
            while let Some(a) = self.sched.poll_action() {
                acts.push(a);
            }
            if let (Some(t0), Some(c)) = (t0, self.clock.as_mut()) {
                // Scheduler time only (not the early unmaps' GPU calls).
                self.decision_ns
                    .push(c().saturating_sub(t0).saturating_sub(early_ns));
            }
            self.apply_cu_changes(gpu, now);
            for a in acts.drain(..) {
                self.action(gpu, now, a, out);
            }
            self.acts = acts;
            self.forward_notices(out);
        }
        self.reap(out);
    }

    /// Passes on what the scheduler said it decided (preemptions with
    /// their cause, aging boosts), in its order, after the decision's
    /// actions were carried out.
    fn forward_notices(&mut self, out: &mut Vec<Notice<O>>) {
        while let Some(n) = self.sched.poll_notice() {
            let (queue, notice) = match n {
                SchedNotice::Preempted {
                    queue,
                    slot,
                    by,
                    reason,
                    ..
                } => (queue, Some((slot, by, reason))),
                SchedNotice::Aged { queue, .. } => (queue, None),
            };
            let Some(r) = self.queues.get(&queue) else {
                continue;
            };
            out.push(match notice {
                Some((slot, by, reason)) => Notice::Preempted {
                    queue,
                    owner: r.owner,
                    slot,
                    by,
                    reason,
                },
                None => Notice::Aged {
                    queue,
                    owner: r.owner,
                },
            });
        }
    }

    fn action(&mut self, gpu: &mut dyn PhysGpu, now: Nanos, a: Action, out: &mut Vec<Notice<O>>) {
        match a {
            Action::Map { queue, slot } => {
                let mask = self.usable_host_mask(&*gpu, queue, self.sched.slot_cu_set(slot));
                let Some(r) = self.queues.get_mut(&queue) else {
                    return;
                };
                let req = MapRequest {
                    slot,
                    tag: queue.0,
                    mqd: r.mqd.clone(),
                    mem: r.mem.clone(),
                };
                r.slot = Some(slot);
                if let Some(e) = self.slots.get_mut(slot.0 as usize) {
                    *e = Some(queue);
                }
                match gpu.map_with_cu_mask(now, req, mask.as_ref()) {
                    Ok(()) => {
                        r.on_gpu = true;
                        self.occupied += 1;
                        out.push(Notice::Mapped {
                            queue,
                            owner: r.owner,
                            slot,
                        });
                    }
                    Err(error) => {
                        // The slot was never loaded: report the error; the
                        // dequeue that follows completes at once.
                        r.on_gpu = false;
                        self.stats.queue_errors += 1;
                        out.push(match error {
                            GpuError::BadMqd(reason) => Notice::QueueError {
                                queue,
                                owner: r.owner,
                                reason,
                            },
                            error => Notice::MapRefused {
                                queue,
                                owner: r.owner,
                                error,
                            },
                        });
                        self.pending.push_back(Event::QueueError { queue, now });
                    }
                }
            }
            Action::Unmap { queue, slot, mode } => {
                let sched_mode = mode;
                let (on_gpu, mode) = match self.queues.get(&queue) {
                    Some(r) => (r.on_gpu, r.exit_mode.filter(|_| r.removing).unwrap_or(mode)),
                    None => (false, mode),
                };
                // Every dequeue but a reset must finish within the VM's
                // preemption timeout (a reset is what ends one that did not).
                let timeout = match mode {
                    DequeueMode::ResetWaves => None,
                    _ => Some(self.queue_preempt_timeout(queue, now)),
                };
                if on_gpu && mode != DequeueMode::DrainPipe && self.preempt_issued.is_none() {
                    if let Some(c) = self.issue_clock.as_mut() {
                        self.preempt_issued = Some(c());
                    }
                }
                let early = self
                    .early
                    .iter()
                    .position(|e| e.0 == queue && e.1 == slot && e.2 == sched_mode);
                let reached = match early {
                    // Handed to the GPU by an armed doorbell: not again.
                    Some(i) => self.early.swap_remove(i).3,
                    None => on_gpu && gpu.unmap_within(now, slot, mode, timeout).is_ok(),
                };
                if !on_gpu || !reached {
                    // Never reached the GPU (refused map): done at once.
                    self.slot_freed(queue);
                    if self.slots.get(slot.0 as usize).copied().flatten() == Some(queue) {
                        self.slots[slot.0 as usize] = None;
                    }
                    self.pending.push_back(Event::Unmapped {
                        queue,
                        has_work: false,
                        save_ns: 0,
                        now,
                    });
                }
            }
            Action::ArmTimer { at } => {
                self.sched_timer = Some(at);
                let at = self.next_recheck().map_or(at, |t| t.min(at));
                self.armed_at = Some(at);
                out.push(Notice::ArmTimer { at });
            }
        }
    }

    /// Sets VM `vm`'s preemption timeout (ns): a dequeue of one of its
    /// queues that has not finished this long after the request resets the
    /// queue ([`QueueErrorReason::PreemptionTimeout`]). Applies to dequeues
    /// requested from now on.
    pub fn set_preempt_timeout(&mut self, vm: VmId, timeout: Nanos) -> Result<(), SchedError> {
        self.gen += 1;
        if self.sched.vm_params(vm).is_none() {
            return Err(SchedError::NoVm(vm));
        }
        self.preempt_timeout.insert(vm, timeout.max(1));
        Ok(())
    }

    /// VM `vm`'s preemption timeout (ns), `None` for an unknown VM.
    pub fn preempt_timeout(&self, vm: VmId) -> Option<Nanos> {
        self.sched.vm_params(vm)?;
        Some(
            self.preempt_timeout
                .get(&vm)
                .copied()
                .unwrap_or(DEFAULT_PREEMPT_TIMEOUT_NS),
        )
    }

    fn queue_preempt_timeout(&self, queue: QueueId, now: Nanos) -> Nanos {
        match self.queues.get(&queue) {
            Some(r) => self.effective_timeout(r.vm, now),
            None => DEFAULT_PREEMPT_TIMEOUT_NS,
        }
    }

    /// VM `vm`'s timeout as escalated at `now` (see [`HangEscalation`]).
    fn effective_timeout(&self, vm: VmId, now: Nanos) -> Nanos {
        let base = self
            .preempt_timeout
            .get(&vm)
            .copied()
            .unwrap_or(DEFAULT_PREEMPT_TIMEOUT_NS);
        let e = self.escalation;
        if e.window_ns == 0 {
            return base;
        }
        let since = now.saturating_sub(e.window_ns);
        let n = self
            .hangs
            .get(&vm)
            .map_or(0, |h| h.iter().filter(|&&t| t > since).count()) as u64;
        let shift = n.saturating_mul(e.shift as u64);
        let t = if shift >= 64 { 0 } else { base >> shift };
        t.max(e.floor_ns.min(base)).max(1)
    }

    /// VM `vm`'s preemption timeout in force at `now`: its own
    /// ([`Binding::preempt_timeout`]) shortened by its recent timeouts
    /// ([`HangEscalation`]). `None` for an unknown VM.
    pub fn effective_preempt_timeout(&self, vm: VmId, now: Nanos) -> Option<Nanos> {
        self.sched.vm_params(vm)?;
        Some(self.effective_timeout(vm, now))
    }

    /// VM `vm`'s remembered preemption timeouts (times, oldest first), for
    /// a later registration of the same vGPU ([`Binding::resume_hangs`]):
    /// a client that reconnects after each hang is escalated as one that
    /// stays.
    pub fn hang_history(&self, vm: VmId) -> Vec<Nanos> {
        self.hangs
            .get(&vm)
            .map(|h| h.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Gives VM `vm` the remembered timeouts `times` of an earlier
    /// registration of the same vGPU (taken with [`Binding::hang_history`]
    /// on this binding's clock), before its own; at most the most recent
    /// 64 (`MAX_REMEMBERED_HANGS`) are kept. An unknown VM is ignored.
    pub fn resume_hangs(&mut self, vm: VmId, times: &[Nanos]) {
        if times.is_empty() || self.sched.vm_params(vm).is_none() {
            return;
        }
        self.gen += 1;
        let h = self.hangs.entry(vm).or_default();
        let own: Vec<Nanos> = h.drain(..).collect();
        let mut all: Vec<Nanos> = times.iter().copied().chain(own).collect();
        all.sort_unstable();
        let skip = all.len().saturating_sub(MAX_REMEMBERED_HANGS);
        h.extend(all.into_iter().skip(skip));
    }

    /// Sets how repeated preemption timeouts shorten a VM's timeout.
    pub fn set_hang_escalation(&mut self, e: HangEscalation) {
        self.gen += 1;
        self.escalation = e;
    }

    /// How repeated preemption timeouts shorten a VM's timeout.
    pub fn hang_escalation(&self) -> HangEscalation {
        self.escalation
    }

    /// A dequeue of `queue` in `slot` did not finish in time: reset only
    /// that queue (RESET_WAVES escalates the pending dequeue) and report it
    /// stopped with [`QueueErrorReason::PreemptionTimeout`]; the scheduler
    /// sees a queue error, so the queue is not mapped again until reloaded.
    fn dequeue_timed_out(
        &mut self,
        gpu: &mut dyn PhysGpu,
        now: Nanos,
        queue: QueueId,
        slot: SlotId,
        waited_ns: Nanos,
        out: &mut Vec<Notice<O>>,
    ) {
        let Some(r) = self.queues.get(&queue) else {
            return;
        };
        if !r.on_gpu || r.slot.map(|s| s.0) != Some(slot.0) {
            return; // stale: the dequeue finished meanwhile
        }
        self.stats.preempt_timeouts += 1;
        self.stats.queue_errors += 1;
        // Escalation: the VM's next dequeues get a shorter timeout.
        let window = self.escalation.window_ns;
        let h = self.hangs.entry(r.vm).or_default();
        while h
            .front()
            .is_some_and(|&t| t <= now.saturating_sub(window) || h.len() >= MAX_REMEMBERED_HANGS)
        {
            h.pop_front();
        }
        h.push_back(now);
        self.gen += 1;
        out.push(Notice::QueueError {
            queue,
            owner: r.owner,
            reason: QueueErrorReason::PreemptionTimeout { waited_ns },
        });
        if let Err(e) = gpu.unmap(now, slot, DequeueMode::ResetWaves) {
            log::error!("reset of {queue:?} after a preemption timeout refused: {e}");
        }
        self.event(gpu, Event::QueueError { queue, now }, out);
    }

    /// Reads the kernel dispatches written to `queue`'s ring since the last
    /// doorbell (at most [`WIDTH_SCAN_PACKETS`], the newest) and tells the
    /// scheduler their widest workgroup count. Guest memory is hostile: an
    /// unreadable or malformed packet is skipped (the GPU reports it when it
    /// fetches it).
    fn note_widths(&mut self, gpu: &dyn PhysGpu, queue: QueueId, wptr: u64) {
        let Some(r) = self.queues.get_mut(&queue) else {
            return;
        };
        let seen = std::mem::replace(&mut r.seen_wptr, wptr);
        let from = if seen == u64::MAX || seen > wptr {
            wptr.saturating_sub(1)
        } else {
            seen
        };
        let from = from.max(wptr.saturating_sub(WIDTH_SCAN_PACKETS));
        // Occupancy needs every new packet (a job's solo time is their sum):
        // not the first doorbell's guess, nor a truncated scan.
        let complete = seen != u64::MAX && seen <= wptr && from == seen;
        let mut widest = 0u64;
        // Occupancy: solo run time (one workgroup per kernel) and whether
        // every workgroup fits in half a CU (docs/gpu-model.md).
        let (mut solo_ns, mut fits) = (0u64, true);
        // Their CU time (each kernel's workgroups x one's cost, summed).
        let mut work_ns = 0u64;
        // The longest workgroups needing a whole CU and fitting half of one
        // (what a drain waits for; `u64::MAX`: one without an estimate).
        let (mut whole_ns, mut half_ns) = (0u64, 0u64);
        // Each kernel's workgroups and one's cost (none: an estimate is
        // missing), for the RT sizing's kernel-by-kernel time.
        // (On the stack: this runs at every doorbell, and a scan reads at
        // most `WIDTH_SCAN_PACKETS` packets.)
        let mut costs = [(0u64, 0u64); WIDTH_SCAN_PACKETS as usize];
        let mut n_costs: Option<usize> = Some(0);
        for idx in from..wptr {
            let mut raw = [0u8; abi::aql::PACKET_SIZE];
            if r.mem.read(r.mqd.packet_addr(idx), &mut raw).is_err() {
                break;
            }
            if let abi::aql::Body::KernelDispatch(d) = abi::aql::Packet::decode(&raw).body {
                if let Ok(n) = d.validate() {
                    widest = widest.max(n);
                    self.sched.note_dispatch_kernel(queue, n);
                    // The backend's estimate (none: no co-residence).
                    match gpu.dispatch_estimate(&*r.mem, &d) {
                        Some(e) => {
                            if let Some(i) = n_costs.filter(|&i| i < costs.len()) {
                                costs[i] = (n, e.wg_ns);
                                n_costs = Some(i + 1);
                            }
                            solo_ns = solo_ns.saturating_add(e.wg_ns);
                            work_ns = work_ns.saturating_add(e.wg_ns.saturating_mul(n));
                            if e.half_cu {
                                half_ns = half_ns.max(e.wg_ns);
                            } else {
                                whole_ns = whole_ns.max(e.wg_ns);
                            }
                            fits &= e.half_cu;
                        }
                        None => {
                            n_costs = None;
                            fits = false;
                            whole_ns = u64::MAX;
                        }
                    }
                }
            }
        }
        if widest > 0 {
            self.sched.note_dispatch_width(queue, widest);
            if complete {
                self.sched.note_dispatch_occupancy(queue, solo_ns, fits);
                self.sched.note_dispatch_work(queue, work_ns);
                self.sched
                    .note_dispatch_kernel_costs(queue, &costs[..n_costs.unwrap_or(0)]);
            }
            // What a drain of the VM's work waits for: a maximum, so the
            // packets of a truncated scan count too.
            if whole_ns > 0 || half_ns > 0 {
                self.sched
                    .note_dispatch_longest_wg(queue, whole_ns, half_ns);
            }
        }
    }

    /// The host mask of CU set `set` for `queue`, or `None` (every CU) when the
    /// queue's own MQD CU mask shares no CU with it: a reserved
    /// high-priority queue restricted by its guest to other CUs would
    /// otherwise never launch. Lower work restricted by its own guest to
    /// the reserved CUs waits (its choice); it never gets them.
    fn usable_host_mask(
        &self,
        gpu: &dyn PhysGpu,
        queue: QueueId,
        set: scheduler::CuSet,
    ) -> Option<CuMask> {
        let t = gpu.topology();
        let host = match set {
            scheduler::CuSet::All => return None,
            set => CuMask::from_set(set, t.cus_per_xcc, t.xccs_per_partition()),
        };
        let Some(r) = self.queues.get(&queue) else {
            return Some(host);
        };
        let guest = CuMask::from_mqd(&r.mqd, t.cus_per_xcc, t.ses_per_xcc, t.xccs_per_partition());
        if matches!(set, scheduler::CuSet::Top(_) | scheduler::CuSet::Mid { .. })
            && guest.and(&host).is_empty()
        {
            return None;
        }
        Some(host)
    }

    /// Carries the scheduler's CU-set changes of mapped queues to the GPU
    /// (before the decision's maps and unmaps).
    fn apply_cu_changes(&mut self, gpu: &mut dyn PhysGpu, now: Nanos) {
        while let Some((queue, slot, _)) = self.sched.poll_cu_change() {
            let on_slot = self
                .queues
                .get(&queue)
                .is_some_and(|r| r.on_gpu && r.slot == Some(slot));
            if !on_slot {
                continue; // mapped by this decision: the map carries it
            }
            let t = gpu.topology();
            let mask = self
                .usable_host_mask(&*gpu, queue, self.sched.slot_cu_set(slot))
                .unwrap_or_else(|| CuMask::all(t.cus_per_partition()));
            if let Err(e) = gpu.set_cu_mask(now, slot, &mask) {
                log::debug!("CU mask of queue {queue:?} on slot {slot:?}: {e}");
            }
        }
    }

    /// Forgets removed queues the scheduler dropped.
    fn reap(&mut self, out: &mut Vec<Notice<O>>) {
        if self.removing.is_empty() {
            return;
        }
        let mut keep = Vec::new();
        for q in std::mem::take(&mut self.removing) {
            if self.sched.queue_state(q).is_some() {
                keep.push(q);
                continue;
            }
            if let Some(r) = self.queues.remove(&q) {
                if let Some(s) = r.slot {
                    if let Some(e) = self.slots.get_mut(s.0 as usize) {
                        if *e == Some(q) {
                            *e = None;
                        }
                    }
                }
                // The scheduler dropped a removed VM with its last queue:
                // a hang recorded while it drained goes with it.
                if self.sched.vm_params(r.vm).is_none() {
                    self.hangs.remove(&r.vm);
                    self.preempt_timeout.remove(&r.vm);
                }
                out.push(Notice::Removed {
                    queue: q,
                    owner: r.owner,
                    mqd: Box::new(r.mqd),
                });
            }
        }
        self.removing = keep;
    }

    /// Stamp, with `clock` (host ns), the moment the first preemption (a
    /// SaveWaves or ResetWaves dequeue) is handed to the GPU; read it with
    /// [`Binding::take_preempt_issued`]. For benchmarks (doorbell ->
    /// preemption issued); `None` (the default) stamps nothing.
    pub fn set_issue_clock(&mut self, clock: Option<DecisionClock>) {
        self.issue_clock = clock;
        self.preempt_issued = None;
    }

    /// The stamp of the first preemption handed to the GPU since the last
    /// call (see [`Binding::set_issue_clock`]), and clears it.
    pub fn take_preempt_issued(&mut self) -> Option<u64> {
        self.preempt_issued.take()
    }
}

#[cfg(test)]
#[path = "binding_tests.rs"]
mod tests;
