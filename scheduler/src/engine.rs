//! The scheduling engine (policy in docs/scheduling.md).

use crate::*;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::BuildHasherDefault;

mod busy;
mod spatial_engine;

/// Level of a boosted (aged) queue: above every VM priority.
const BOOST_LEVEL: u16 = 16;

/// Queue map with a fixed (not OS-seeded) hasher: runs are reproducible and
/// the engine takes no randomness from the host. Nothing depends on its
/// iteration order (listings sort the ids).
type QueueMap<V> = HashMap<QueueId, V, BuildHasherDefault<QueueIdHasher>>;

/// Hasher for the queue map: a queue id is one `u64`, hashed by one
/// multiply and a fold of the high half into the low bits (a few
/// instructions and no tables, against SipHash's rounds, on the doorbell
/// path). Queue ids are chosen by the host, not by guests, so the map needs
/// no defence against chosen collisions.
#[derive(Default)]
struct QueueIdHasher(u64);

impl std::hash::Hasher for QueueIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not used by `QueueId` (it writes one u64); kept correct anyway.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        let m = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = m ^ (m >> 32);
    }
}

/// Level (VM priority, or [`BOOST_LEVEL`]) of a queue key.
fn lvl(key: u16) -> u16 {
    key >> 4
}

/// Lowest and highest key of a level.
fn level_keys(level: u16) -> (u16, u16) {
    (level << 4, (level << 4) | 15)
}
/// Fixed-point scale of virtual time (ns x SCALE / weight).
const SCALE: u128 = 1 << 16;

/// Shortest anticipation grace (a re-ring gap measured as 0 still gets it).
const MIN_GRACE_NS: Nanos = 10_000;

/// Aging budget: boosted (aged) work, plus the CWSR it causes, takes at most
/// `1 / AGING_SHARE_INV` of a partition's time (a batch of boosts lasting
/// `b` is followed by `(b + save and restore) x (AGING_SHARE_INV - 1)` of
/// no boosts), so that a top-level VM keeps more than 95% of its GPU time
/// whatever the number of starved VMs below it.
const AGING_SHARE_INV: u64 = 32;

/// Longest aging batch: boosted queues run at most this long in a row.
const AGING_BATCH_NS: Nanos = 2_000_000;

/// Why a queue is being dequeued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    /// Preempted with work left.
    Preempt(DequeueMode),
    /// Idle queue gives its slot back.
    Evict,
    /// Queue error: the slot is reclaimed, the queue stays in error.
    Error,
    /// Queue removed by the operator.
    Remove,
}

#[derive(Clone, Debug)]
struct Queue {
    vm: VmId,
    prio: u8,
    state: QueueState,
    /// Entered the current state (ready since / mapped since / idle since).
    since: Nanos,
    slot: Option<SlotId>,
    /// Key under which the queue is indexed (valid while indexed):
    /// `level << 4 | queue priority`, see [`Scheduler::key_of`].
    key: u16,
    /// Write pointer of the last doorbell (`None`: none seen yet).
    wptr: Option<u64>,
    boosted: bool,
    doorbell_while_unmapping: bool,
    reason: Option<Reason>,
    errored: bool,
    /// Modelled restore of its last CWSR save (its last save time when it
    /// was saved with work, else 0): not billed at its next map.
    restore_ns: Nanos,
}

#[derive(Clone, Debug)]
struct Vm {
    params: VmParams,
    partition: u32,
    queues: BTreeSet<QueueId>,
    stats: VmStats,
    /// Queues Running or Preempting.
    active: u32,
    active_since: Nanos,
    /// Queues Ready, Saved, Running or Preempting.
    busy: u32,
    /// Weighted GPU time (ns x SCALE / weight), charged up to `active_since`.
    vtime: u128,
    /// Key of the VM in its partition's `vt` index, while busy.
    vt_key: Option<u128>,
    /// When it last became busy after being idle.
    entered: Nanos,
    /// When it last stopped being busy.
    idle_at: Nanos,
    /// Moving average of its re-ring gap (idle to busy again), ns.
    gap_ewma: Nanos,
    removed: bool,
    /// Its Ready/Saved queues, highest key first, then oldest.
    ready: BTreeSet<(Reverse<u16>, Nanos, QueueId)>,
    /// Its Running queues, lowest key first, then longest mapped.
    running: BTreeSet<(u16, Nanos, QueueId)>,
    /// Paused by the operator: its queues are never picked (not indexed
    /// as ready or running) and mapped ones are unmapped with SaveWaves.
    paused: bool,
    /// Per-VM slice length overriding the level's quantum.
    quantum_ns: Option<Nanos>,
    /// Queues Running (billing, see [`charge`]).
    running_n: u32,
    /// Billing (`stats.gpu_ns`) starts at this time within an active
    /// period: after its own restore and after other queues' saves that
    /// were in flight when it was mapped; `Nanos::MAX` while none of its
    /// queues is Running (its own saves are not billed).
    bill_from: Nanos,
    /// Mapped while a save was in flight in its partition: its billing
    /// starts when the partition's saves are done.
    wait_save: bool,
}

impl Vm {
    /// Its Ready/Saved queues with keys in `lo..=hi`, highest key first,
    /// then oldest.
    fn ready_in(
        &self,
        lo: u16,
        hi: u16,
    ) -> impl Iterator<Item = &(Reverse<u16>, Nanos, QueueId)> + '_ {
        self.ready
            .range((Reverse(hi), 0, QueueId(0))..=(Reverse(lo), Nanos::MAX, QueueId(u64::MAX)))
    }
    /// Highest key of its busy (Ready/Saved/Running) queues.
    fn top_key(&self) -> Option<u16> {
        let ready = self.ready.first().map(|e| e.0 .0);
        let running = self.running.last().map(|e| e.0);
        ready.max(running)
    }
    /// Highest key of its busy queues at `level`.
    fn top_key_at(&self, level: u16) -> Option<u16> {
        let (a, b) = level_keys(level);
        let ready = self.ready_in(a, b).next().map(|e| e.0 .0);
        let running = self
            .running
            .range((a, 0, QueueId(0))..=(b, Nanos::MAX, QueueId(u64::MAX)))
            .next_back()
            .map(|e| e.0);
        ready.max(running)
    }
    /// Its best ready queue at `level` (highest key, then oldest).
    fn best_ready_at(&self, level: u16) -> Option<(u16, QueueId)> {
        let (a, b) = level_keys(level);
        self.ready_in(a, b).next().map(|e| (e.0 .0, e.2))
    }
}

/// The VM owning a partition's time slice at a priority level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SliceOwner {
    vm: VmId,
    level: u16,
    since: Nanos,
    /// Since when the owner has had no busy queue at its level
    /// (anticipation grace running).
    drained: Option<Nanos>,
}

/// A slice owner displaced by a higher level, resumed with the rest of its
/// quantum when its level is the top again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Parked {
    vm: VmId,
    level: u16,
    /// Slice time it had used.
    used: Nanos,
}

#[derive(Clone, Debug, Default)]
struct Partition {
    /// Free slots per pipe (pipe order of the slot list).
    free: Vec<BTreeSet<SlotId>>,
    nfree: usize,
    next_pipe: usize,
    /// Ready/Saved queues, highest level first, then oldest (queue
    /// priorities do not order queues of different VMs).
    ready: BTreeSet<(Reverse<u16>, Nanos, QueueId)>,
    /// Ready/Saved queues that are not boosted, per level (VM priority),
    /// by boost deadline (ready since + [`age_wait`] of the level): aging
    /// looks only at the levels below the top busy one.
    waiting: [BTreeSet<(Nanos, QueueId)>; 16],
    /// Running queues, lowest level first, then longest mapped.
    running: BTreeSet<(u16, Nanos, QueueId)>,
    /// MappedIdle queues, oldest first.
    idle_mapped: BTreeSet<(Nanos, QueueId)>,
    /// Busy (Ready/Saved/Running) queue counts per level per VM (a
    /// table over the levels with a map's interface: `busy.rs`).
    busy: busy::BusyLevels,
    /// Queues being dequeued (their slots free soon).
    freeing: usize,
    /// Busy VMs by charged virtual time (fairness floor).
    vt: BTreeSet<(u128, VmId)>,
    /// VM holding the partition's exclusive slice.
    owner: Option<SliceOwner>,
    /// Slice owner displaced by a higher level.
    parked: Option<Parked>,
    /// VMs that became busy since the last owner choice (a parked owner
    /// does not resume ahead of an equal that woke meanwhile).
    woken: Vec<VmId>,
    vms: usize,
    /// Aging batches and their budget.
    aging: AgingBudget,
    /// VMs whose billing waits for the partition's saves in flight.
    save_waiters: Vec<VmId>,
}

/// Aging batches of a partition: the queues due for a boost are boosted
/// together (one batch), and the next batch waits until the batch's cost
/// is at most [`AGING_SHARE_INV`]`^-1` of the time since it started.
#[derive(Clone, Debug, Default)]
struct AgingBudget {
    /// Start of the running batch.
    batch_since: Option<Nanos>,
    /// Queues boosted by the running batch.
    batch: Vec<QueueId>,
    /// No batch starts before this.
    next_batch: Nanos,
    /// Last dequeue (CWSR save) time seen in the partition: a batch is
    /// charged one save and one restore of the work it displaced.
    save_ns: Nanos,
}

impl Partition {
    fn top(&self) -> Option<u16> {
        self.busy.keys().next_back().copied()
    }
    fn alloc(&mut self) -> Option<SlotId> {
        let n = self.free.len();
        for i in 0..n {
            let pipe = (self.next_pipe + i) % n;
            if let Some(s) = self.free[pipe].pop_first() {
                self.next_pipe = (pipe + 1) % n;
                self.nfree -= 1;
                return Some(s);
            }
        }
        None
    }
}

/// Engine counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Events handled.
    pub events: u64,
    /// Map actions.
    pub maps: u64,
    /// Unmaps that interrupted work.
    pub preemptions: u64,
    /// Idle queues that gave their slot back.
    pub evictions: u64,
    /// Queues boosted by aging.
    pub boosts: u64,
    /// Events for unknown queues or in impossible states (ignored).
    pub stray_events: u64,
    /// Doorbells that did not move the write pointer (dropped, no decision).
    pub stale_doorbells: u64,
}

/// The scheduler. See the crate docs.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedConfig,
    slots: Vec<SlotDesc>,
    slot_pipe: Vec<usize>,
    slot_owner: Vec<Option<QueueId>>,
    parts: Vec<Partition>,
    queues: QueueMap<Queue>,
    vms: BTreeMap<VmId, Vm>,
    actions: VecDeque<Action>,
    armed: Option<Nanos>,
    next_poll: Nanos,
    now: Nanos,
    stats: EngineStats,
    /// Spatial sharing with CU masks (`spatial_engine.rs`).
    spatial: crate::spatial::Spatial,
    /// Split decisions ([`Scheduler::handle_split`]): `None` when the
    /// caller did not ask for one, `Some(None)` while it may happen,
    /// `Some(Some(rest))` when a decision stopped after queueing its
    /// preemptions and waits for [`Scheduler::resume`].
    split: Option<Option<Split>>,
    /// The exclusive decision's list of preempted queues, reused.
    evict_buf: Vec<QueueId>,
    /// The doorbell fast path's unmaps, reused (see [`Split::Doorbell`]).
    early_buf: Vec<(QueueId, SlotId)>,
    /// Doorbell fast path: decisions taken, and (a bug) decisions whose
    /// full run did not start with the unmaps handed out early.
    fast: FastStats,
}

/// Counters of the doorbell fast path (see [`Scheduler::handle_split`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastStats {
    /// Preempting doorbells whose unmaps were queued before the decision ran.
    pub taken: u64,
    /// Of those, decisions that did not queue the same unmaps first (never
    /// expected: the queues are adopted as preempted, nothing is lost).
    pub mismatched: u64,
}

/// A doorbell's preemption known before the doorbell is handled (see
/// [`Scheduler::doorbell_plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DoorbellPlan {
    /// Mode of the victims' unmaps.
    pub mode: DequeueMode,
    /// The write index the scheduler last saw for the queue: a doorbell
    /// with it is stale and preempts nothing.
    pub seen_wptr: Option<u64>,
    /// The plan holds for doorbells before this time (an idle slot's
    /// hysteresis or an aging batch falls due then).
    pub until: Nanos,
}

/// A decision stopped after queueing its preemptions' unmaps.
#[derive(Debug)]
enum Split {
    /// An exclusive decision past its choice of victims.
    Tail(ExclusiveTail),
    /// The doorbell fast path: a doorbell that makes a queue of a level
    /// above every busy one in its partition Ready evicts every running
    /// queue there (the exclusive decision's outcome, found from a few
    /// indexes before the event is handled). `resume` handles the event
    /// whole and drops the unmaps it queues that were handed out already.
    Doorbell {
        ev: Event,
        early: Vec<(QueueId, SlotId)>,
        mode: DequeueMode,
    },
}

/// What an exclusive decision still has to do after queueing the unmap
/// actions of its preemptions (see [`Scheduler::handle_split`]).
#[derive(Debug)]
struct ExclusiveTail {
    p: usize,
    owner: SliceOwner,
    res: Option<crate::spatial::Reservation>,
    klo: u16,
    khi: u16,
    /// Preempted queues (their actions are queued, their state not yet).
    evict: Vec<QueueId>,
    mode: DequeueMode,
}

impl Scheduler {
    /// A scheduler over `slots` (`SlotId(i)` is `slots[i]`). Partitions are
    /// numbered 0..=max partition of the slots.
    pub fn new(cfg: SchedConfig, slots: Vec<SlotDesc>) -> Result<Self, SchedError> {
        cfg.validate()?;
        if slots.is_empty() {
            return Err(SchedError::NoSlots);
        }
        let nparts = slots.iter().map(|s| s.partition).max().unwrap_or(0) as usize + 1;
        let mut parts = vec![Partition::default(); nparts];
        let mut pipes: Vec<Vec<u32>> = vec![Vec::new(); nparts];
        for s in &slots {
            let p = &mut pipes[s.partition as usize];
            if !p.contains(&s.pipe) {
                p.push(s.pipe);
            }
        }
        let mut slot_pipe = Vec::with_capacity(slots.len());
        for (p, pp) in parts.iter_mut().zip(&pipes) {
            p.free = vec![BTreeSet::new(); pp.len()];
        }
        for (i, s) in slots.iter().enumerate() {
            let pi = pipes[s.partition as usize]
                .iter()
                .position(|&x| x == s.pipe)
                .unwrap_or(0);
            slot_pipe.push(pi);
            let part = &mut parts[s.partition as usize];
            part.free[pi].insert(SlotId(i as u32));
            part.nfree += 1;
        }
        Ok(Scheduler {
            cfg,
            slot_owner: vec![None; slots.len()],
            slots,
            slot_pipe,
            parts,
            queues: QueueMap::default(),
            vms: BTreeMap::new(),
            actions: VecDeque::new(),
            armed: None,
            next_poll: 0,
            now: 0,
            stats: EngineStats::default(),
            spatial: Default::default(),
            split: None,
            evict_buf: Vec::new(),
            early_buf: Vec::new(),
            fast: FastStats::default(),
        })
    }

    /// Current configuration.
    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    /// Number of partitions.
    pub fn partitions(&self) -> u32 {
        self.parts.len() as u32
    }

    /// The slot list.
    pub fn slots(&self) -> &[SlotDesc] {
        &self.slots
    }

    /// Engine counters.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    // ---- control -------------------------------------------------------

    /// Adds a VM; returns its partition.
    pub fn add_vm(&mut self, vm: VmId, params: VmParams) -> Result<u32, SchedError> {
        if self.vms.contains_key(&vm) {
            return Err(SchedError::DuplicateVm(vm));
        }
        check_params(&params, self.partitions())?;
        let partition = params.partition.unwrap_or_else(|| {
            (0..self.parts.len())
                .min_by_key(|&i| (self.parts[i].vms, i))
                .unwrap_or(0) as u32
        });
        self.parts[partition as usize].vms += 1;
        self.vms.insert(
            vm,
            Vm {
                params,
                partition,
                queues: BTreeSet::new(),
                stats: VmStats::default(),
                active: 0,
                active_since: 0,
                busy: 0,
                vtime: 0,
                vt_key: None,
                entered: 0,
                idle_at: 0,
                gap_ewma: 0,
                removed: false,
                ready: BTreeSet::new(),
                running: BTreeSet::new(),
                paused: false,
                quantum_ns: None,
                running_n: 0,
                bill_from: Nanos::MAX,
                wait_save: false,
            },
        );
        Ok(partition)
    }

    /// Removes a VM and all its queues (mapped ones are reset-unmapped; the
    /// VM is gone once they are).
    pub fn remove_vm(&mut self, vm: VmId) -> Result<(), SchedError> {
        let v = self.vms.get_mut(&vm).ok_or(SchedError::NoVm(vm))?;
        v.removed = true;
        let qs: Vec<QueueId> = v.queues.iter().copied().collect();
        for q in qs {
            self.remove_queue(q)?;
        }
        self.drop_vm_if_done(vm);
        Ok(())
    }

    /// Adds an idle queue of `vm` with queue priority `prio` (0..=15, KFD's
    /// queue priority). It orders (and preempts) queues of the same VM only:
    /// between VMs, VM priority and weight decide.
    pub fn add_queue(&mut self, vm: VmId, queue: QueueId, prio: u8) -> Result<(), SchedError> {
        if prio > MAX_PRIORITY {
            return Err(SchedError::Priority(prio));
        }
        if self.queues.contains_key(&queue) {
            return Err(SchedError::DuplicateQueue(queue));
        }
        let v = self
            .vms
            .get_mut(&vm)
            .filter(|v| !v.removed)
            .ok_or(SchedError::NoVm(vm))?;
        v.queues.insert(queue);
        self.queues.insert(
            queue,
            Queue {
                vm,
                prio,
                state: QueueState::Idle,
                since: self.now,
                slot: None,
                key: 0,
                wptr: None,
                boosted: false,
                doorbell_while_unmapping: false,
                reason: None,
                errored: false,
                restore_ns: 0,
            },
        );
        Ok(())
    }

    /// Removes a queue. A mapped queue is first dequeued (RESET_WAVES: its
    /// work is abandoned); it disappears at its `Unmapped` event.
    pub fn remove_queue(&mut self, queue: QueueId) -> Result<(), SchedError> {
        let q = self.queues.get(&queue).ok_or(SchedError::NoQueue(queue))?;
        match q.state {
            QueueState::Running | QueueState::MappedIdle => {
                self.unmap(queue, DequeueMode::ResetWaves, Reason::Remove);
            }
            QueueState::Preempting => {
                self.queues.get_mut(&queue).unwrap().reason = Some(Reason::Remove);
            }
            _ => self.forget_queue(queue),
        }
        Ok(())
    }

    /// Changes a VM's priority (applies at the next event).
    pub fn set_vm_priority(&mut self, vm: VmId, priority: u8) -> Result<(), SchedError> {
        if priority > MAX_PRIORITY {
            return Err(SchedError::Priority(priority));
        }
        self.rekey_vm(vm, |v| v.params.priority = priority)
    }

    /// Changes a queue's own priority (0..=15; orders queues within its VM;
    /// applies at the next event). KFD's UPDATE_QUEUE does this on bare metal.
    pub fn set_queue_priority(&mut self, queue: QueueId, prio: u8) -> Result<(), SchedError> {
        if prio > MAX_PRIORITY {
            return Err(SchedError::Priority(prio));
        }
        if !self.queues.contains_key(&queue) {
            return Err(SchedError::NoQueue(queue));
        }
        self.rekey(queue, |q| q.prio = prio);
        Ok(())
    }

    /// Changes a VM's weight (applies at the next event).
    pub fn set_vm_weight(&mut self, vm: VmId, weight: u32) -> Result<(), SchedError> {
        if !WEIGHT_RANGE.contains(&weight) {
            return Err(SchedError::Weight(weight));
        }
        let now = self.now;
        let v = self.vms.get_mut(&vm).ok_or(SchedError::NoVm(vm))?;
        if v.active > 0 {
            charge(v, now, self.cfg.policy);
        }
        v.params.weight = weight;
        self.sync_vt(vm);
        Ok(())
    }

    /// Changes the policy (applies at the next event; mapped queues stay
    /// mapped until the new policy decides otherwise).
    pub fn set_policy(&mut self, policy: Policy) {
        let ids: Vec<QueueId> = self.sorted_queue_ids();
        for &q in &ids {
            self.unindex(q);
        }
        self.cfg.policy = policy;
        for p in &mut self.parts {
            p.owner = None;
        }
        for &q in &ids {
            self.index(q);
        }
    }

    /// Replaces the tunables (applies at the next event).
    pub fn set_config(&mut self, cfg: SchedConfig) -> Result<(), SchedError> {
        cfg.validate()?;
        let policy = cfg.policy;
        // Boost deadlines in the aging index depend on `aging_ns`.
        let ids: Vec<QueueId> = self.sorted_queue_ids();
        for &q in &ids {
            self.unindex(q);
        }
        self.cfg = SchedConfig {
            policy: self.cfg.policy,
            ..cfg
        };
        for &q in &ids {
            self.index(q);
        }
        if policy != self.cfg.policy {
            self.set_policy(policy);
        }
        Ok(())
    }

    // ---- queries -------------------------------------------------------

    /// The aging bound (docs/scheduling.md, "Aging"): the longest a ready
    /// queue of a VM of priority `level`, below the top busy level of its
    /// partition, waits for a slot under a priority policy:
    ///
    /// `age_wait(level) + ceil(backlog_ns / B) x F x (B + 2 x save_ns) + B`
    ///
    /// with `age_wait(l) = aging_ns x 2 / (l + 2)`, `B` the longest aging
    /// batch (2 ms), `F` = 32 (aging takes at most `1 / F` of the
    /// partition), `backlog_ns` the aged work that can be due with it — the
    /// sum over the queues of the partition below the top level of
    /// `min(job, B) + save_ns` — and `save_ns` the longest CWSR save. A job
    /// of at most `B` completes within the bound plus its own length.
    pub fn aging_bound_ns(
        cfg: &SchedConfig,
        level: u8,
        backlog_ns: Nanos,
        save_ns: Nanos,
    ) -> Nanos {
        let batches = backlog_ns.div_ceil(AGING_BATCH_NS).max(1);
        let per = AGING_BATCH_NS.saturating_add(save_ns.saturating_mul(2));
        age_wait(cfg, level as u16)
            .saturating_add(batches.saturating_mul(AGING_SHARE_INV).saturating_mul(per))
            .saturating_add(AGING_BATCH_NS)
    }

    /// Longest aging batch, ns: boosted queues run at most this long in a
    /// row (`B` in [`Scheduler::aging_bound_ns`]).
    pub const AGING_BATCH_NS: Nanos = AGING_BATCH_NS;

    /// State and slot of a queue.
    pub fn queue_state(&self, queue: QueueId) -> Option<(QueueState, Option<SlotId>)> {
        self.queues.get(&queue).map(|q| {
            let st = if q.errored {
                QueueState::Error
            } else {
                q.state
            };
            (st, q.slot)
        })
    }

    /// Accounting of a VM (GPU time up to the last event).
    pub fn vm_stats(&self, vm: VmId) -> Option<VmStats> {
        self.vms.get(&vm).map(|v| {
            let mut s = v.stats;
            if v.active > 0 {
                s.gpu_ns += billable(v, self.now);
            }
            s
        })
    }

    /// A VM's current parameters (with live changes applied).
    pub fn vm_params(&self, vm: VmId) -> Option<VmParams> {
        self.vms.get(&vm).map(|v| v.params)
    }

    /// Partition a VM is pinned to.
    pub fn vm_partition(&self, vm: VmId) -> Option<u32> {
        self.vms.get(&vm).map(|v| v.partition)
    }

    /// Queue holding a slot.
    pub fn slot_owner(&self, slot: SlotId) -> Option<QueueId> {
        self.slot_owner.get(slot.0 as usize).copied().flatten()
    }

    /// Effective level of a queue under the current policy: its VM's
    /// priority, 16 while boosted by aging, 0 under policies without
    /// priorities. Levels order queues of different VMs.
    pub fn queue_level(&self, queue: QueueId) -> Option<u16> {
        self.queues.get(&queue).map(|q| lvl(self.key_of(q)))
    }

    /// Effective queue priority (orders queues of one VM at one level; 0
    /// under policies without priorities).
    pub fn queue_priority(&self, queue: QueueId) -> Option<u8> {
        self.queues.get(&queue).map(|q| (self.key_of(q) & 15) as u8)
    }

    /// Next action for the caller.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    // ---- events --------------------------------------------------------

    /// Handles one event and queues the resulting actions.
    pub fn handle(&mut self, ev: Event) {
        // A split decision the caller did not resume is finished first;
        // this one is never split.
        self.resume();
        self.split = None;
        self.handle_event(ev);
    }

    /// [`Scheduler::handle`]; may split the decision when `split` is
    /// `Some(None)` (see [`Scheduler::handle_split`]).
    fn handle_event(&mut self, ev: Event) {
        let now = ev.now().max(self.now);
        self.now = now;
        self.stats.events += 1;
        let mut part = None;
        match ev {
            Event::Doorbell { queue, wptr, .. } => {
                if let Some(q) = self.queues.get_mut(&queue) {
                    if q.wptr == Some(wptr) {
                        // Nothing new since the last doorbell seen: the
                        // state already reflects that work.
                        self.stats.stale_doorbells += 1;
                        return;
                    }
                    q.wptr = Some(wptr);
                    part = Some(queue);
                    match q.state {
                        QueueState::Idle if !q.errored => self.set_state(queue, QueueState::Ready),
                        QueueState::MappedIdle => self.set_state(queue, QueueState::Running),
                        QueueState::Preempting => q.doorbell_while_unmapping = true,
                        _ => {}
                    }
                } else {
                    self.stats.stray_events += 1;
                }
            }
            Event::QueueIdle { queue, .. } => match self.queues.get_mut(&queue) {
                Some(q) if q.state == QueueState::Running => {
                    q.boosted = false;
                    part = Some(queue);
                    self.set_state(queue, QueueState::MappedIdle);
                }
                Some(_) => {}
                None => self.stats.stray_events += 1,
            },
            Event::Unmapped {
                queue,
                has_work,
                save_ns,
                ..
            } => match self.queues.get(&queue) {
                Some(q) if q.state == QueueState::Preempting => {
                    part = Some(queue);
                    self.finish_unmap(queue, has_work, save_ns);
                }
                _ => self.stats.stray_events += 1,
            },
            Event::QueueError { queue, .. } => match self.queues.get_mut(&queue) {
                Some(q) => {
                    part = Some(queue);
                    q.errored = true;
                    match q.state {
                        QueueState::Running | QueueState::MappedIdle => {
                            self.unmap(queue, DequeueMode::ResetWaves, Reason::Error)
                        }
                        QueueState::Preempting => {
                            if q.reason != Some(Reason::Remove) {
                                q.reason = Some(Reason::Error);
                            }
                        }
                        _ => self.set_state(queue, QueueState::Error),
                    }
                }
                None => self.stats.stray_events += 1,
            },
            Event::Tick { .. } => {}
        }
        let poll = self.cfg.policy == Policy::Poll5ms && now >= self.next_poll;
        if poll {
            self.next_poll = now + self.cfg.poll_ns.max(1);
        }
        match part.and_then(|q| self.partition_of(q)) {
            Some(p) if !matches!(ev, Event::Tick { .. }) && !poll => self.decide(p, poll),
            _ => {
                // One partition's decision may be split, not a sweep.
                let split = self.split.take();
                for p in 0..self.parts.len() {
                    self.decide(p, poll);
                }
                self.split = split;
            }
        }
        if matches!(self.split, Some(Some(_))) {
            return;
        }
        self.arm_timer();
    }

    // ---- decisions -----------------------------------------------------

    fn decide(&mut self, p: usize, poll: bool) {
        let now = self.now;
        // Idle queues give their slots back after the hysteresis.
        while let Some(&(since, q)) = self.parts[p].idle_mapped.first() {
            if since + self.cfg.idle_unmap_ns > now {
                break;
            }
            self.evict(q);
        }
        if self.cfg.policy.uses_priority() {
            self.age(p);
        }
        match self.cfg.policy {
            Policy::Hqdmux | Policy::Reset if self.slices() => self.decide_exclusive(p),
            Policy::Hqdmux | Policy::Reset if self.cfg.exclusive => {
                self.decide_shared(p, true, true)
            }
            Policy::Timeslice => self.decide_exclusive(p),
            Policy::Hqdmux | Policy::Reset => self.decide_shared(p, true, false),
            Policy::Poll5ms => self.decide_shared(p, poll, true),
            Policy::Fifo => self.decide_shared(p, false, false),
        }
        if matches!(self.split, Some(Some(_))) {
            return;
        }
        self.spatial_sync(p);
    }

    /// Aging (priority policies): queues of levels below the top busy one
    /// that waited [`age_wait`] are boosted above every VM priority, all
    /// the due ones together (a batch). A boosted queue drops back to its
    /// level when its ring drains (its job is done: `QueueIdle`); the batch
    /// ends when no boosted queue is busy or after [`AGING_BATCH_NS`]
    /// (queues still boosted then drop back; those that did not run keep
    /// their place), and the next batch waits `AGING_SHARE_INV - 1` times the
    /// batch's length plus one CWSR save and restore, so aging never takes
    /// more than `1 / AGING_SHARE_INV` of the partition. Queues of the top
    /// busy level are not aged: they are served by the weighted slices of
    /// their level (between VMs) and by their VM's own queue priorities
    /// (within it).
    fn age(&mut self, p: usize) {
        let now = self.now;
        let part = &mut self.parts[p];
        if let Some(start) = part.aging.batch_since {
            let boosting = part.busy.contains_key(&BOOST_LEVEL);
            if boosting && now < start.saturating_add(AGING_BATCH_NS) {
                return;
            }
            // The batch is over: charge it (with one save and restore of
            // the work it displaced) to the budget.
            let cost = now
                .saturating_sub(start)
                .saturating_add(part.aging.save_ns.saturating_mul(2));
            part.aging.next_batch = now.saturating_add(cost.saturating_mul(AGING_SHARE_INV - 1));
            part.aging.batch_since = None;
            let batch = std::mem::take(&mut part.aging.batch);
            for q in batch {
                if self.queues.get(&q).is_some_and(|q| q.boosted) {
                    self.rekey(q, |q| q.boosted = false);
                }
            }
        }
        let part = &mut self.parts[p];
        if now < part.aging.next_batch {
            return;
        }
        let Some(top) = part.busy.range(..BOOST_LEVEL).next_back().map(|e| *e.0) else {
            return;
        };
        let due: Vec<QueueId> = part.waiting[..top as usize]
            .iter()
            .flat_map(|w| w.iter().take_while(|e| e.0 <= now).map(|e| e.1))
            .collect();
        if due.is_empty() {
            return;
        }
        part.aging.batch_since = Some(now);
        part.aging.batch = due.clone();
        for q in due {
            self.stats.boosts += 1;
            self.rekey(q, |q| q.boosted = true);
        }
    }

    /// Earliest time aging has something to do in partition `p` (the end of
    /// the running batch, or the next one), for the timer.
    fn aging_due(&self, p: &Partition) -> Option<Nanos> {
        if let Some(start) = p.aging.batch_since {
            return Some(start.saturating_add(AGING_BATCH_NS));
        }
        let top = p.busy.range(..BOOST_LEVEL).next_back().map(|e| *e.0)?;
        let due = p.waiting[..top as usize]
            .iter()
            .filter_map(|w| w.first().map(|e| e.0))
            .min()?;
        Some(due.max(p.aging.next_batch))
    }

    /// Exclusive per-VM slices at the top level (the default)?
    fn slices(&self) -> bool {
        self.cfg.exclusive && !self.cfg.corun_equals
    }

    /// Slice length at a level (VM priority, or the boost level).
    fn quantum(&self, level: u16) -> Nanos {
        let q = match self.cfg.policy {
            Policy::Timeslice | Policy::Fifo => self.cfg.baseline_quantum_ns,
            // Boosted VMs take turns by whole jobs (the batch ends them).
            _ if level >= BOOST_LEVEL => AGING_BATCH_NS,
            _ => self.cfg.quantum_ns[level.min(15) as usize],
        };
        q.max(self.cfg.min_run_ns).max(1)
    }

    fn preempt_mode(&self) -> DequeueMode {
        if self.cfg.policy == Policy::Reset {
            DequeueMode::ResetWaves
        } else {
            DequeueMode::SaveWaves
        }
    }

    /// Exclusive slices: one VM at the top busy level holds the partition;
    /// within it, only its highest busy queue priority runs.
    fn decide_exclusive(&mut self, p: usize) {
        let now = self.now;
        let top = self.parts[p].top();
        let mut owner = self.parts[p].owner;
        // Anticipation: an owner whose queues drained keeps the partition
        // against its equals and lower levels for a short grace (its next
        // doorbell then needs no CWSR of someone else's work).
        if let Some(o) = owner.as_mut() {
            if self.vm_busy_at(p, o.vm, o.level) {
                o.drained = None;
            } else if o.level < BOOST_LEVEL
                && self.vms.contains_key(&o.vm)
                && top.is_none_or(|t| t <= o.level)
            {
                let d = *o.drained.get_or_insert(now);
                if now < d.saturating_add(self.grace(o.vm)) {
                    self.parts[p].owner = owner;
                    return;
                }
            }
        }
        let Some(top) = top else {
            self.parts[p].owner = None;
            self.parts[p].woken.clear();
            return;
        };
        let pol = self.cfg.policy;
        let cands = &self.parts[p].busy[&top];
        let keep = match owner {
            Some(o) if cands.contains_key(&o.vm) => {
                // Same level (or its own level changed): slice until quantum
                // expiry when others wait, or until an equal that woke below
                // its share takes over after the owner's minimum run.
                cands.len() == 1
                    || (now < o.since + self.vm_slice(o.vm, top)
                        && !(now >= o.since.saturating_add(self.lag_hold(top))
                            && self.lag_waker(p, o, top)))
            }
            // A higher level (or a boost) never waits for a lower owner's
            // minimum run.
            _ => false,
        };
        let owner = if keep {
            let mut o = owner.unwrap();
            if cands.contains_key(&o.vm) {
                o.level = top;
            }
            o
        } else {
            // A lower owner still busy at its level is parked: it resumes
            // the rest of its slice when its level is the top again.
            if let Some(o) = owner {
                if o.level < top && self.vm_busy_at(p, o.vm, o.level) {
                    self.parts[p].parked = Some(Parked {
                        vm: o.vm,
                        level: o.level,
                        used: now.saturating_sub(o.since),
                    });
                }
            }
            let parked = self.parts[p].parked;
            let cands = &self.parts[p].busy[&top];
            let resume = parked.filter(|k| {
                k.level == top
                    && cands.contains_key(&k.vm)
                    && k.used < self.vm_slice(k.vm, top)
                    && !self.parts[p]
                        .woken
                        .iter()
                        .any(|w| *w != k.vm && cands.contains_key(w))
            });
            if parked.is_some_and(|k| k.level >= top) {
                self.parts[p].parked = None;
            }
            if let Some(k) = resume {
                SliceOwner {
                    vm: k.vm,
                    level: top,
                    since: now - k.used,
                    drained: None,
                }
            } else {
                // Least weighted GPU time wins (stride scheduling). Ties: the
                // current holder loses (equals alternate), then the VM that
                // became busy last wins (one that was idle re-enters at the
                // least virtual time of the busy VMs, less one minimum run,
                // and goes first among them).
                let prev = owner.map(|o| o.vm);
                // Equals alternate: the previous holder yields to an equal
                // whose virtual time is within one CWSR save and restore of
                // its own (a few hundred us of CWSR, charged to whoever was
                // mapped, must not hand it a second slice in a row).
                let slack = self.parts[p].aging.save_ns.saturating_mul(2) as u128 * SCALE;
                let cands = &self.parts[p].busy[&top];
                // Boosted (aged) queues are served oldest first: aging
                // bounds waiting, it does not share by weight.
                let oldest_boosted = (top == BOOST_LEVEL)
                    .then(|| {
                        self.parts[p]
                            .ready
                            .range((Reverse(BOOST_LEVEL), 0, QueueId(0))..)
                            .next()
                            .filter(|e| e.0 .0 == BOOST_LEVEL)
                            .map(|e| self.queues[&e.2].vm)
                    })
                    .flatten();
                let vm = if let Some(vm) = oldest_boosted {
                    vm
                } else {
                    *cands
                        .keys()
                        .min_by_key(|v| {
                            let vv = &self.vms[v];
                            let held = Some(**v) == prev;
                            // Unweighted: the CWSR noise of a weight-1
                            // equal is as large as anyone's.
                            let slack = if held { slack } else { 0 };
                            (
                                vtime_now(vv, now, pol).saturating_add(slack),
                                held,
                                Reverse(vv.entered),
                                **v,
                            )
                        })
                        .unwrap()
                };
                SliceOwner {
                    vm,
                    level: top,
                    since: now,
                    drained: None,
                }
            }
        };
        if owner.since == now {
            // A new choice: the woken VMs had their chance.
            let part = &mut self.parts[p];
            part.woken.retain(|w| *w != owner.vm);
            let busy = &part.busy;
            part.woken
                .retain(|w| busy.get(&top).is_some_and(|m| m.contains_key(w)));
        }
        self.parts[p].owner = Some(owner);
        let prev_res = self.spatial.res.get(p).copied().flatten();
        let (res, establish) = self.spatial_plan(p, owner);
        // The owner's highest busy queue priority at its level runs.
        let okey = self.vms[&owner.vm]
            .top_key_at(owner.level)
            .unwrap_or(owner.level << 4);
        // Boosted queues of the owner all run, whatever their queue
        // priorities: aging serves the queues that waited, and one of the
        // VM's own higher queues must not keep a boosted lower one waiting.
        let (klo, khi) = if owner.level == BOOST_LEVEL {
            level_keys(BOOST_LEVEL)
        } else {
            (okey, okey)
        };
        // Preempt every running queue that is not the owner's at that key.
        // (In a buffer kept between decisions: no allocation before the
        // preemptions are handed out.)
        let mut evict = std::mem::take(&mut self.evict_buf);
        evict.clear();
        evict.extend(
            self.parts[p]
                .running
                .iter()
                .filter(|(_, _, q)| {
                    let qq = &self.queues[q];
                    (qq.vm != owner.vm || qq.key < klo || qq.key > khi)
                        && !self.spatial_keeps(res, establish, owner, *q)
                })
                .map(|e| e.2),
        );
        let mode = self.preempt_mode();
        // The preemptions' actions first; their state changes (which this
        // decision reads only through the partition's `freeing` count,
        // in `place` below) follow, here or, for a split decision, in
        // `resume` after the caller handed the unmaps to the GPU.
        for &q in &evict {
            self.unmap_action(q, mode);
        }
        let cont = ExclusiveTail {
            p,
            owner,
            res,
            klo,
            khi,
            evict,
            mode,
        };
        // Split only when nothing but these unmaps is queued and the
        // decision changes no CU set (the caller applies CU changes before
        // the actions of a decision: an early unmap must not pass one).
        if self.split.is_some()
            && !cont.evict.is_empty()
            && self.actions.len() == cont.evict.len()
            && self.spatial.changes.is_empty()
            && (!self.spatial.enabled() || (res.is_none() && prev_res.is_none()))
        {
            self.split = Some(Some(Split::Tail(cont)));
            return;
        }
        self.exclusive_tail(cont);
    }

    /// The rest of an exclusive decision after its preemptions' actions
    /// were queued (see [`Scheduler::handle_split`]).
    fn exclusive_tail(&mut self, cont: ExclusiveTail) {
        let ExclusiveTail {
            p,
            owner,
            res,
            klo,
            khi,
            evict,
            mode,
        } = cont;
        for &q in &evict {
            self.unmap_state(q, Reason::Preempt(mode));
        }
        self.evict_buf = evict;
        // Idle queues of other VMs below the owner's level give their slots
        // back now: a doorbell on a mapped queue starts its work on the GPU
        // at once, and work that may not run would only be saved again
        // (a CWSR for nothing, e.g. a closed loop that re-rings after its
        // boosted job while the next boosted VM runs).
        let idle: Vec<QueueId> = self.parts[p]
            .idle_mapped
            .iter()
            .filter(|(_, q)| {
                let q = &self.queues[q];
                q.vm != owner.vm && lvl(q.key) < owner.level
            })
            .map(|e| e.1)
            .collect();
        for q in idle {
            self.evict(q);
        }
        // Map the owner's waiting queues at that key.
        let want: Vec<QueueId> = self.vms[&owner.vm]
            .ready_in(klo, khi)
            .map(|e| e.2)
            .collect();
        let mut left = want.len();
        for &q in &want {
            if !self.place(p, q, left) {
                break;
            }
            left -= 1;
        }
        self.spatial_beside(p, res, owner);
    }

    /// Shared (co-running) mode: ready queues fill slots, by level and then
    /// age across VMs, by queue priority within a VM. With `preempt`,
    /// lower-level running queues make room for higher ones (and, in
    /// exclusive mode, do not co-run with them). `only_top`: map only queues
    /// of the top busy level, and of each VM only its highest busy queue
    /// priority (lower ones of that VM are preempted at once).
    fn decide_shared(&mut self, p: usize, preempt: bool, only_top: bool) {
        let now = self.now;
        let mode = self.preempt_mode();
        let top = self.parts[p].top().unwrap_or(0);
        let prio = self.cfg.policy.uses_priority();
        if preempt && self.cfg.exclusive {
            let low: Vec<QueueId> = self.parts[p]
                .running
                .iter()
                .filter(|&&(l, since, q)| {
                    (l < top && since + self.cfg.min_run_ns <= now)
                        || (only_top && prio && self.below_own_top(q))
                })
                .map(|e| e.2)
                .collect();
            for q in low {
                self.unmap(q, mode, Reason::Preempt(mode));
            }
        }
        // At most this many can be placed or make a victim now.
        let reach = self.parts[p].nfree + self.parts[p].running.len() + 1;
        // (With `only_top`, queues below their VM's best busy queue wait
        // and do not count against `reach`.)
        let ready: Vec<(u16, QueueId)> = self.parts[p]
            .ready
            .iter()
            .map(|(l, _, q)| (l.0, *q))
            .take_while(|(l, _)| !only_top || *l >= top)
            .filter(|(_, q)| !(only_top && prio && self.below_own_top(*q)))
            .take(reach)
            .collect();
        let mut left = self.parts[p].ready.len();
        for (level, q) in ready {
            // The slot goes to this queue's VM; within the VM, to its best
            // ready queue at this level.
            let vm = self.queues[&q].vm;
            // (With `only_top`, the filter above left only VMs whose best
            // ready queue is at their top busy key; mapping one keeps it so.)
            let Some((key, q)) = self.vms[&vm].best_ready_at(level) else {
                continue;
            };
            if self.place(p, q, left) {
                left -= 1;
                continue;
            }
            if self.parts[p].freeing >= left {
                break;
            }
            // No slot: take one from lower work (or, for fifo, round robin).
            let fifo = self.cfg.policy == Policy::Fifo;
            let own_lower = self.vms[&vm]
                .running
                .first()
                .filter(|e| prio && e.0 < key)
                .map(|e| e.2);
            match self.parts[p].running.first().copied() {
                Some((l, since, v))
                    if preempt && l < level && since + self.cfg.min_run_ns <= now =>
                {
                    self.unmap(v, mode, Reason::Preempt(mode));
                }
                Some((_, since, v)) if fifo && since + self.queue_slice(v) <= now => {
                    self.unmap(v, mode, Reason::Preempt(mode));
                }
                _ => match own_lower {
                    // Queue priority preempts within the VM, at once.
                    Some(v) if preempt => self.unmap(v, mode, Reason::Preempt(mode)),
                    _ => break,
                },
            }
        }
    }

    /// Is a running queue below the highest busy queue priority of its VM?
    fn below_own_top(&self, q: QueueId) -> bool {
        let q = &self.queues[&q];
        self.vms[&q.vm].top_key().is_some_and(|t| q.key < t)
    }

    /// Maps `q` into a free slot of `p`; else asks an idle queue to give its
    /// slot back (when fewer slots are on their way than `wanted`).
    fn place(&mut self, p: usize, q: QueueId, wanted: usize) -> bool {
        if let Some(slot) = self.parts[p].alloc() {
            self.map(q, slot);
            return true;
        }
        if self.parts[p].freeing < wanted {
            if let Some(&(_, idle)) = self.parts[p].idle_mapped.first() {
                self.evict(idle);
            }
        }
        false
    }

    /// Anticipation grace of a VM: twice its re-ring gap (at least
    /// [`MIN_GRACE_NS`]) when that fits in `anticipation_ns`, else 0.
    fn grace(&self, vm: VmId) -> Nanos {
        if !self.cfg.policy.uses_priority() || self.cfg.anticipation_ns == 0 {
            return 0;
        }
        let g = self
            .vms
            .get(&vm)
            .map_or(0, |v| v.gap_ewma.saturating_mul(2).max(MIN_GRACE_NS));
        if g <= self.cfg.anticipation_ns {
            g
        } else {
            0
        }
    }

    /// Lag-based eligibility among equals (in the style of EEVDF): is there
    /// a VM of the owner's level that woke during the owner's slice and is
    /// behind the owner by at least one minimum run of weighted GPU time?
    /// Such a VM uses less than its share; it takes the partition once the
    /// owner has held it [`Self::lag_hold`], instead of waiting for the
    /// quantum.
    /// (A VM that was idle re-enters at most one minimum run behind the
    /// least busy VM, so it cannot bank more than that; a closed loop that
    /// re-rings within its anticipation grace keeps its virtual time and is
    /// rarely that far behind, so slices among always-busy equals stay
    /// whole.)
    fn lag_waker(&self, p: usize, o: SliceOwner, top: u16) -> bool {
        self.lag_ready_at(p, o, top).is_some_and(|t| t <= self.now)
    }

    /// How long an owner holds the partition against an eligible waker of
    /// its level: its minimum run, and at least a quarter of the level's
    /// slice, so wake preemptions cost at most one CWSR save and restore per
    /// quarter slice (a few percent of the partition), and an owner whose
    /// job is shorter than that finishes it first.
    fn lag_hold(&self, level: u16) -> Nanos {
        (self.quantum(level) / 4).max(self.cfg.min_run_ns)
    }

    /// When the first woken VM becomes eligible against the owner (see
    /// [`Self::lag_waker`]): the owner's virtual time grows while it runs.
    /// `None`: no woken VM can be.
    fn lag_ready_at(&self, p: usize, o: SliceOwner, top: u16) -> Option<Nanos> {
        if top >= BOOST_LEVEL || o.level != top || !self.cfg.policy.uses_priority() {
            return None;
        }
        let pol = self.cfg.policy;
        let now = self.now;
        let ov = self.vms.get(&o.vm)?;
        // Only an owner that has been demanding for a while: one that woke
        // recently is probably demand-limited itself (its job ends soon,
        // and preempting it would only add a CWSR to both).
        let owner_vt = vtime_now(ov, now, pol);
        let cands = self.parts[p].busy.get(&top)?;
        self.parts[p]
            .woken
            .iter()
            .filter(|w| **w != o.vm && cands.contains_key(*w))
            .filter_map(|w| {
                let v = self.vms.get(w)?;
                // Only a VM that woke during this slice: one that was
                // already waiting when the owner was chosen lost the
                // choice fairly.
                if v.entered <= o.since {
                    return None;
                }
                // Only against an owner that was already demanding when the
                // waker went idle: one that became busy after that is as
                // demand-limited as the waker (preempting it would only add
                // a CWSR to both).
                if ov.entered > v.idle_at {
                    return None;
                }
                let allow = self.cfg.min_run_ns as u128 * SCALE / weight(v, pol);
                let need = vtime_now(v, now, pol).saturating_add(allow);
                if need <= owner_vt {
                    return Some(now);
                }
                if ov.active == 0 {
                    return None;
                }
                let ns = (need - owner_vt)
                    .saturating_mul(weight(ov, pol))
                    .div_ceil(SCALE);
                Some(now.saturating_add(ns.min(u64::MAX as u128) as u64))
            })
            .min()
    }

    fn vm_busy_at(&self, p: usize, vm: VmId, level: u16) -> bool {
        self.parts[p]
            .busy
            .get(&level)
            .is_some_and(|m| m.contains_key(&vm))
    }

    fn arm_timer(&mut self) {
        let now = self.now;
        let mut at: Option<Nanos> = None;
        let mut consider = |t: Nanos| at = Some(at.map_or(t, |a: Nanos| a.min(t)));
        let prio = self.cfg.policy.uses_priority();
        let mut any_busy = false;
        for (pi, p) in self.parts.iter().enumerate() {
            if let Some(&(since, _)) = p.idle_mapped.first() {
                consider(since + self.cfg.idle_unmap_ns);
            }
            if prio {
                if let Some(t) = self.aging_due(p) {
                    consider(t);
                }
            }
            let Some(top) = p.top() else { continue };
            any_busy = true;
            match self.cfg.policy {
                Policy::Hqdmux | Policy::Reset | Policy::Timeslice
                    if self.slices() || self.cfg.policy == Policy::Timeslice =>
                {
                    if let Some(o) = p.owner {
                        if let Some(d) = o.drained {
                            let until = d.saturating_add(self.grace(o.vm));
                            if until > now {
                                consider(until);
                            }
                        }
                        if o.level >= top && p.busy[&top].len() > 1 {
                            consider(o.since + self.vm_slice(o.vm, top));
                            if let Some(t) = self.lag_ready_at(pi, o, top) {
                                let t = t.max(o.since.saturating_add(self.lag_hold(top)));
                                if t > now {
                                    consider(t);
                                }
                            }
                        }
                    }
                }
                Policy::Hqdmux | Policy::Reset => {
                    // A lower running queue protected by its minimum run
                    // while a higher one waits (or, exclusive, is busy).
                    if let Some(&(l, since, _)) = p.running.first() {
                        let waiting_above = p.ready.first().is_some_and(|r| r.0 .0 > l);
                        let below_top = self.cfg.exclusive && l < top;
                        let until = since + self.cfg.min_run_ns;
                        if (waiting_above || below_top) && until > now {
                            consider(until);
                        }
                    }
                }
                Policy::Fifo => {
                    if let (Some(&(_, since, q)), false) = (p.running.first(), p.ready.is_empty()) {
                        consider(since + self.queue_slice(q));
                    }
                }
                _ => {}
            }
        }
        if self.cfg.policy == Policy::Poll5ms && any_busy {
            consider(self.next_poll);
        }
        if let Some(t) = self.spatial_deadline() {
            consider(t);
        }
        if let Some(t) = at {
            let t = t.max(now + 1);
            if self.armed != Some(t) || self.armed.is_some_and(|a| a <= now) {
                self.armed = Some(t);
                self.actions.push_back(Action::ArmTimer { at: t });
            }
        }
    }

    // ---- state changes -------------------------------------------------

    fn map(&mut self, q: QueueId, slot: SlotId) {
        self.slot_owner[slot.0 as usize] = Some(q);
        self.spatial_on_map(slot);
        let qq = self.queues.get_mut(&q).unwrap();
        qq.slot = Some(slot);
        let vm = qq.vm;
        self.set_state(q, QueueState::Running);
        if let Some(v) = self.vms.get_mut(&vm) {
            v.stats.maps += 1;
        }
        self.stats.maps += 1;
        self.actions.push_back(Action::Map { queue: q, slot });
    }

    fn evict(&mut self, q: QueueId) {
        self.stats.evictions += 1;
        self.unmap(q, DequeueMode::DrainPipe, Reason::Evict);
    }

    fn unmap(&mut self, q: QueueId, mode: DequeueMode, reason: Reason) {
        self.unmap_action(q, mode);
        self.unmap_state(q, reason);
    }

    /// Queues the unmap action of a mapped queue (first half of
    /// [`Self::unmap`]; it reads nothing the state change writes, so the
    /// action list is the same whichever half runs first).
    fn unmap_action(&mut self, q: QueueId, mode: DequeueMode) {
        let slot = self.queues[&q].slot.expect("unmap of an unmapped queue");
        self.actions.push_back(Action::Unmap {
            queue: q,
            slot,
            mode,
        });
    }

    /// The state change and counters of an unmap whose action is queued
    /// (second half of [`Self::unmap`]).
    fn unmap_state(&mut self, q: QueueId, reason: Reason) {
        let qq = self.queues.get_mut(&q).unwrap();
        let interrupts = qq.state == QueueState::Running && matches!(reason, Reason::Preempt(_));
        qq.reason = Some(reason);
        qq.doorbell_while_unmapping = false;
        let vm = qq.vm;
        self.set_state(q, QueueState::Preempting);
        if interrupts {
            self.stats.preemptions += 1;
            if let Some(v) = self.vms.get_mut(&vm) {
                v.stats.preemptions += 1;
            }
        }
    }

    fn finish_unmap(&mut self, q: QueueId, has_work: bool, save_ns: Nanos) {
        let qq = self.queues.get_mut(&q).unwrap();
        let slot = qq.slot.take().unwrap();
        let reason = qq.reason.take();
        let work = has_work || qq.doorbell_while_unmapping;
        let vm = qq.vm;
        let errored = qq.errored;
        self.slot_owner[slot.0 as usize] = None;
        let p = self.slots[slot.0 as usize].partition as usize;
        self.parts[p].free[self.slot_pipe[slot.0 as usize]].insert(slot);
        self.parts[p].nfree += 1;
        if let Some(v) = self.vms.get_mut(&vm) {
            v.stats.save_ns += save_ns;
        }
        if matches!(reason, Some(Reason::Preempt(_))) && has_work {
            self.parts[p].aging.save_ns = save_ns;
        }
        let next = match reason {
            Some(Reason::Remove) => {
                self.set_state(q, QueueState::Idle);
                self.forget_queue(q);
                return;
            }
            _ if errored => QueueState::Error,
            Some(Reason::Error) => QueueState::Error,
            _ if !work => QueueState::Idle,
            Some(Reason::Preempt(DequeueMode::SaveWaves)) if has_work => QueueState::Saved,
            _ => QueueState::Ready,
        };
        if let Some(qq) = self.queues.get_mut(&q) {
            qq.restore_ns = if next == QueueState::Saved {
                save_ns
            } else {
                0
            };
        }
        self.set_state(q, next);
        self.release_save_waiters(p);
    }

    /// When no save is in flight in partition `p` any more, the VMs mapped
    /// during those saves start being billed (their waves had no CUs).
    fn release_save_waiters(&mut self, p: usize) {
        if self.parts[p].freeing > 0 || self.parts[p].save_waiters.is_empty() {
            return;
        }
        let now = self.now;
        let pol = self.cfg.policy;
        for vm in std::mem::take(&mut self.parts[p].save_waiters) {
            if let Some(v) = self.vms.get_mut(&vm) {
                if v.wait_save && v.active > 0 {
                    // Nothing billed up to now (its waves had no CUs).
                    charge(v, now, pol);
                }
                v.wait_save = false;
                if v.running_n > 0 {
                    v.bill_from = v.bill_from.max(now);
                }
            }
        }
    }

    fn forget_queue(&mut self, q: QueueId) {
        self.unindex(q);
        let Some(qq) = self.queues.remove(&q) else {
            return;
        };
        let vm = qq.vm;
        if let Some(v) = self.vms.get_mut(&vm) {
            v.queues.remove(&q);
            if qq.state == QueueState::Running {
                charge(v, self.now, self.cfg.policy);
                v.running_n -= 1;
                if v.running_n == 0 {
                    v.bill_from = Nanos::MAX;
                }
            }
            if matches!(qq.state, QueueState::Running | QueueState::Preempting) {
                v.active -= 1;
                if v.active == 0 {
                    charge(v, self.now, self.cfg.policy);
                }
            }
            if matches!(
                qq.state,
                QueueState::Ready
                    | QueueState::Saved
                    | QueueState::Running
                    | QueueState::Preempting
            ) {
                v.busy -= 1;
            }
        }
        self.drop_vm_if_done(vm);
    }

    fn drop_vm_if_done(&mut self, vm: VmId) {
        self.sync_vt(vm);
        if self
            .vms
            .get(&vm)
            .is_some_and(|v| v.removed && v.queues.is_empty())
        {
            let v = self.vms.remove(&vm).unwrap();
            self.parts[v.partition as usize].vms -= 1;
            if let Some(k) = v.vt_key {
                self.parts[v.partition as usize].vt.remove(&(k, vm));
            }
            self.parts[v.partition as usize].woken.retain(|w| *w != vm);
            self.spatial.width.remove(&vm);
            self.spatial.occ.remove(&vm);
            for p in &mut self.parts {
                if p.owner.is_some_and(|o| o.vm == vm) {
                    p.owner = None;
                }
            }
        }
    }

    fn set_state(&mut self, q: QueueId, st: QueueState) {
        self.unindex(q);
        let now = self.now;
        let pol = self.cfg.policy;
        let qq = self.queues.get_mut(&q).unwrap();
        let old = qq.state;
        qq.state = st;
        qq.since = now;
        let vm = qq.vm;
        let active = |s| matches!(s, QueueState::Running | QueueState::Preempting);
        // Demand for the fairness clamp (a queue being dequeued still wants
        // the GPU back).
        let busy = |s| {
            matches!(
                s,
                QueueState::Ready
                    | QueueState::Saved
                    | QueueState::Running
                    | QueueState::Preempting
            )
        };
        let part = self.vms[&vm].partition;
        let mut floor = None;
        let brief = {
            let g = self.grace(vm);
            g > 0 && now.saturating_sub(self.vms[&vm].idle_at) <= g
        };
        if !busy(old) && busy(st) && self.vms[&vm].busy == 0 && !brief {
            // A VM that was idle does not bank credit (one idle no longer
            // than its anticipation grace, e.g. a closed loop between jobs,
            // counts as continuously demanding and keeps its virtual time):
            // start at the least
            // charged virtual time of the busy VMs of its partition.
            // Keys of running VMs lag (charged when they stop): walk the
            // index in key order until no later entry can be lower.
            let mut best: Option<u128> = None;
            for &(key, o) in &self.parts[part as usize].vt {
                if best.is_some_and(|b| key >= b) {
                    break;
                }
                let t = vtime_now(&self.vms[&o], now, pol);
                best = Some(best.map_or(t, |b| b.min(t)));
            }
            floor = best;
        }
        let restore = self.queues[&q].restore_ns;
        let saves_in_flight = self.parts[part as usize].freeing > 0;
        let v = self.vms.get_mut(&vm).unwrap();
        // Billing: only while a queue of the VM is Running, and not during
        // its own restore or another queue's save in flight at its map.
        let running = |s| s == QueueState::Running;
        if running(old) != running(st) {
            if v.active > 0 {
                charge(v, now, pol);
            }
            if running(st) {
                if v.running_n == 0 {
                    let from = if old == QueueState::Saved {
                        now.saturating_add(restore)
                    } else {
                        now
                    };
                    v.bill_from = from;
                    if saves_in_flight {
                        if !v.wait_save {
                            v.wait_save = true;
                            self.parts[part as usize].save_waiters.push(vm);
                        }
                    } else {
                        v.wait_save = false;
                    }
                }
                v.running_n += 1;
            } else {
                v.running_n -= 1;
                if v.running_n == 0 {
                    v.bill_from = Nanos::MAX;
                }
            }
        }
        let v = self.vms.get_mut(&vm).unwrap();
        if active(old) != active(st) {
            if active(st) {
                if v.active == 0 {
                    v.active_since = now;
                }
                v.active += 1;
            } else {
                v.active -= 1;
                if v.active == 0 {
                    charge(v, now, pol);
                }
            }
        }
        if busy(old) != busy(st) {
            if busy(st) {
                v.busy += 1;
            } else {
                v.busy -= 1;
            }
        }
        let mut woke = false;
        if !busy(old) && busy(st) && v.busy == 1 {
            v.entered = now;
            let gap = now.saturating_sub(v.idle_at);
            v.gap_ewma = (v.gap_ewma.saturating_mul(3) / 4).saturating_add(gap / 4);
            woke = true;
        }
        if busy(old) && !busy(st) && v.busy == 0 {
            v.idle_at = now;
        }
        if let Some(f) = floor {
            // Bounded lag: it may re-enter up to one slice of its level
            // (weighted) behind the least busy VM, no further, so a VM below
            // its share is served ahead of VMs above it (see `lag_waker`)
            // across a few jobs in a row, but cannot bank idle time.
            let slice = self.cfg.quantum_ns[v.params.priority.min(15) as usize];
            let allow = slice.max(self.cfg.min_run_ns) as u128 * SCALE / weight(v, pol);
            v.vtime = v.vtime.max(f.saturating_sub(allow));
        }
        if woke {
            let w = &mut self.parts[part as usize].woken;
            if !w.contains(&vm) {
                w.push(vm);
            }
        }
        self.sync_vt(vm);
        self.index(q);
    }

    /// Keeps the partition's virtual-time index in step with the VM.
    fn sync_vt(&mut self, vm: VmId) {
        let Some(v) = self.vms.get_mut(&vm) else {
            return;
        };
        let want = (v.busy > 0 && !v.paused).then_some(v.vtime);
        if v.vt_key == want {
            return;
        }
        let p = &mut self.parts[v.partition as usize];
        if let Some(k) = v.vt_key {
            p.vt.remove(&(k, vm));
        }
        if let Some(k) = want {
            p.vt.insert((k, vm));
        }
        v.vt_key = want;
    }

    fn rekey(&mut self, q: QueueId, f: impl FnOnce(&mut Queue)) {
        self.unindex(q);
        f(self.queues.get_mut(&q).unwrap());
        self.index(q);
    }

    fn rekey_vm(&mut self, vm: VmId, f: impl FnOnce(&mut Vm)) -> Result<(), SchedError> {
        let qs: Vec<QueueId> = self
            .vms
            .get(&vm)
            .ok_or(SchedError::NoVm(vm))?
            .queues
            .iter()
            .copied()
            .collect();
        for &q in &qs {
            self.unindex(q);
        }
        f(self.vms.get_mut(&vm).unwrap());
        for &q in &qs {
            self.index(q);
        }
        Ok(())
    }

    /// Index key of a queue: `level << 4 | queue priority`, where the level
    /// is its VM's priority ([`BOOST_LEVEL`] while aged). Levels order
    /// queues across VMs; the low bits only order queues of one VM.
    fn key_of(&self, q: &Queue) -> u16 {
        if !self.cfg.policy.uses_priority() {
            return 0;
        }
        let level = if q.boosted {
            BOOST_LEVEL
        } else {
            self.vms.get(&q.vm).map_or(0, |v| v.params.priority) as u16
        };
        (level << 4) | q.prio as u16
    }

    fn partition_of(&self, q: QueueId) -> Option<usize> {
        let vm = self.queues.get(&q)?.vm;
        self.vms.get(&vm).map(|v| v.partition as usize)
    }

    fn index(&mut self, q: QueueId) {
        let key = self.key_of(&self.queues[&q]);
        let level = lvl(key);
        let qq = self.queues.get_mut(&q).unwrap();
        qq.key = key;
        let (st, since, vm, boosted) = (qq.state, qq.since, qq.vm, qq.boosted);
        let v = self.vms.get_mut(&vm).unwrap();
        if v.paused && is_demand(st) {
            // A paused VM's demand is invisible to every decision.
            return;
        }
        let p = &mut self.parts[v.partition as usize];
        match st {
            QueueState::Ready | QueueState::Saved => {
                p.ready.insert((Reverse(level), since, q));
                v.ready.insert((Reverse(key), since, q));
                if !boosted && level < BOOST_LEVEL {
                    p.waiting[level as usize]
                        .insert((since.saturating_add(age_wait(&self.cfg, level)), q));
                }
            }
            QueueState::Running => {
                p.running.insert((level, since, q));
                v.running.insert((key, since, q));
            }
            QueueState::MappedIdle => {
                p.idle_mapped.insert((since, q));
            }
            QueueState::Preempting => p.freeing += 1,
            QueueState::Idle | QueueState::Error => {}
        }
        if matches!(
            st,
            QueueState::Ready | QueueState::Saved | QueueState::Running
        ) {
            *p.busy.entry(level).or_default().entry(vm).or_default() += 1;
        }
    }

    fn unindex(&mut self, q: QueueId) {
        let Some(qq) = self.queues.get(&q) else {
            return;
        };
        let (key, st, since, vm) = (qq.key, qq.state, qq.since, qq.vm);
        let level = lvl(key);
        let Some(v) = self.vms.get_mut(&vm) else {
            return;
        };
        if v.paused && is_demand(st) {
            return;
        }
        let p = &mut self.parts[v.partition as usize];
        match st {
            QueueState::Ready | QueueState::Saved => {
                p.ready.remove(&(Reverse(level), since, q));
                v.ready.remove(&(Reverse(key), since, q));
                if level < BOOST_LEVEL {
                    p.waiting[level as usize]
                        .remove(&(since.saturating_add(age_wait(&self.cfg, level)), q));
                }
            }
            QueueState::Running => {
                p.running.remove(&(level, since, q));
                v.running.remove(&(key, since, q));
            }
            QueueState::MappedIdle => {
                p.idle_mapped.remove(&(since, q));
            }
            QueueState::Preempting => p.freeing -= 1,
            QueueState::Idle | QueueState::Error => {}
        }
        if matches!(
            st,
            QueueState::Ready | QueueState::Saved | QueueState::Running
        ) {
            if let Some(m) = p.busy.get_mut(&level) {
                if let Some(c) = m.get_mut(&vm) {
                    *c -= 1;
                    if *c == 0 {
                        m.remove(&vm);
                    }
                }
                if m.is_empty() {
                    p.busy.remove(&level);
                }
            }
        }
    }

    fn sorted_queue_ids(&self) -> Vec<QueueId> {
        let mut v: Vec<QueueId> = self.queues.keys().copied().collect();
        v.sort();
        v
    }

    // ---- operator controls: pause, per-VM slice ------------------------

    /// Pauses (`true`) or resumes (`false`) a VM. A paused VM's queues are
    /// never picked; its mapped queues are unmapped at once with SaveWaves
    /// (CWSR: their work resumes exactly where it stopped, whatever the
    /// policy), idle mapped ones are drained. Doorbells are still recorded,
    /// so the work submitted meanwhile runs after [`resume`](Self::set_vm_paused).
    /// Resuming makes its waiting queues eligible again (their wait starts
    /// at the resume: time paused does not count towards aging) and applies
    /// at the next event. Setting the current state again changes nothing.
    pub fn set_vm_paused(&mut self, vm: VmId, paused: bool) -> Result<(), SchedError> {
        let v = self.vms.get(&vm).ok_or(SchedError::NoVm(vm))?;
        if v.paused == paused {
            return Ok(());
        }
        let qs: Vec<QueueId> = v.queues.iter().copied().collect();
        let part = v.partition as usize;
        for &q in &qs {
            self.unindex(q);
        }
        let now = self.now;
        self.vms.get_mut(&vm).unwrap().paused = paused;
        if !paused {
            for &q in &qs {
                let qq = self.queues.get_mut(&q).unwrap();
                if matches!(qq.state, QueueState::Ready | QueueState::Saved) {
                    qq.since = now;
                }
            }
        }
        for &q in &qs {
            self.index(q);
        }
        self.sync_vt(vm);
        if paused {
            let p = &mut self.parts[part];
            if p.owner.is_some_and(|o| o.vm == vm) {
                p.owner = None;
            }
            if p.parked.is_some_and(|k| k.vm == vm) {
                p.parked = None;
            }
            p.woken.retain(|w| *w != vm);
            for q in qs {
                match self.queues[&q].state {
                    QueueState::Running => self.unmap(
                        q,
                        DequeueMode::SaveWaves,
                        Reason::Preempt(DequeueMode::SaveWaves),
                    ),
                    QueueState::MappedIdle => self.evict(q),
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Is the VM paused (`None`: no such VM)?
    pub fn vm_paused(&self, vm: VmId) -> Option<bool> {
        self.vms.get(&vm).map(|v| v.paused)
    }

    /// Overrides the VM's slice length (`Some(ns)`, at least 1 ns; the
    /// minimum run still applies) or returns it to its level's quantum
    /// (`None`). Applies at the next event.
    pub fn set_vm_quantum(&mut self, vm: VmId, quantum: Option<Nanos>) -> Result<(), SchedError> {
        let v = self.vms.get_mut(&vm).ok_or(SchedError::NoVm(vm))?;
        v.quantum_ns = quantum.map(|q| q.max(1));
        Ok(())
    }

    /// The VM's slice override (`None`: the level's quantum, or no such VM).
    pub fn vm_quantum(&self, vm: VmId) -> Option<Nanos> {
        self.vms.get(&vm).and_then(|v| v.quantum_ns)
    }

    /// Slice length of `vm` at `level`: its override (not below the minimum
    /// run) or the level's quantum. Boosted queues keep the boost length.
    fn vm_slice(&self, vm: VmId, level: u16) -> Nanos {
        match self.vms.get(&vm).and_then(|v| v.quantum_ns) {
            Some(q) if level < BOOST_LEVEL => q.max(self.cfg.min_run_ns).max(1),
            _ => self.quantum(level),
        }
    }

    /// Round-robin slice of a running queue (fifo): its VM's override or
    /// the baseline quantum.
    fn queue_slice(&self, q: QueueId) -> Nanos {
        match self.queues.get(&q) {
            Some(qq) => self.vm_slice(qq.vm, 0),
            None => self.quantum(0),
        }
    }

    /// Forgets the write index last seen for `queue`, so that its next
    /// doorbell counts as new work even with the same write index. For a
    /// queue that went idle stalled (write index ahead of an unpublished
    /// packet): the guest publishes the packet and rings again with the same
    /// index. Unknown queues are ignored.
    pub fn forget_doorbell(&mut self, queue: QueueId) {
        if let Some(q) = self.queues.get_mut(&queue) {
            q.wptr = None;
        }
    }

    /// Like [`Scheduler::handle`], but a decision that preempts may stop
    /// right after queueing its unmap actions, before the preempted queues'
    /// state changes and the rest of the decision (mapping the winner, the
    /// timer): returns `true` then, and every action queued so far is one
    /// of those unmaps. The caller carries them out (e.g. hands the CWSR
    /// saves to the GPU) and then calls [`Scheduler::resume`], which
    /// queues the rest of the decision's actions; the actions and the
    /// resulting state are exactly those of [`Scheduler::handle`]. Only an
    /// exclusive decision of one partition whose CU sets do not change is
    /// split (a CU change is applied before a decision's unmaps).
    /// Call `resume` before any other call that changes the scheduler
    /// (`handle` and `handle_split` resume a pending decision first).
    pub fn handle_split(&mut self, ev: Event) -> bool {
        self.resume();
        if self.doorbell_fast_path(ev) {
            return true;
        }
        self.split = Some(None);
        self.handle_event(ev);
        match self.split.take() {
            Some(Some(rest)) => {
                self.split = Some(Some(rest));
                true
            }
            _ => false,
        }
    }

    /// Finishes a decision split by [`Scheduler::handle_split`] (nothing
    /// when none is pending).
    pub fn resume(&mut self) {
        match self.split.take() {
            Some(Some(Split::Tail(rest))) => {
                let p = rest.p;
                self.exclusive_tail(rest);
                self.spatial_sync(p);
                self.arm_timer();
            }
            Some(Some(Split::Doorbell { ev, early, mode })) => {
                let from = self.actions.len();
                self.handle_event(ev);
                for &(queue, slot) in &early {
                    let a = Action::Unmap { queue, slot, mode };
                    match self.actions.iter().skip(from).position(|x| *x == a) {
                        Some(i) => {
                            self.actions.remove(from + i);
                        }
                        None => self.adopt_unmap(queue, mode),
                    }
                }
                self.early_buf = early;
            }
            _ => {}
        }
    }

    /// Doorbell fast path counters.
    pub fn fast_stats(&self) -> FastStats {
        self.fast
    }

    /// An unmap of a mapped queue that the caller handed to the GPU but
    /// no decision queued (the doorbell fast path's, or a binding's armed
    /// doorbell whose decision did not agree; never expected, counted in
    /// [`FastStats::mismatched`]): the queue is being dequeued all the
    /// same, so the scheduler treats it as preempted (CWSR loses nothing;
    /// it runs again when chosen).
    pub fn adopt_unmap(&mut self, q: QueueId, mode: DequeueMode) {
        // Counted, not asserted: a debug-build panic here would take the
        // GPU from the VM whose doorbell it was (tests assert the count).
        self.fast.mismatched += 1;
        if self.queues.get(&q).is_some_and(|qq| {
            qq.slot.is_some() && matches!(qq.state, QueueState::Running | QueueState::MappedIdle)
        }) {
            self.unmap_state(q, Reason::Preempt(mode));
        }
    }

    /// The doorbell fast path of [`Scheduler::handle_split`]: see
    /// [`Scheduler::doorbell_plan`]. The unmaps are queued without handling
    /// the event (a handful of index reads on a cold cache, against the
    /// whole state change and choice); `resume` handles it. The split
    /// property tests check that the actions and state equal `handle`'s.
    fn doorbell_fast_path(&mut self, ev: Event) -> bool {
        let Event::Doorbell { queue, wptr, now } = ev else {
            return false;
        };
        let mut early = std::mem::take(&mut self.early_buf);
        match self.doorbell_plan(queue, now, &mut early) {
            Some(plan) if plan.seen_wptr != Some(wptr) => {
                for &(queue, slot) in &early {
                    self.actions.push_back(Action::Unmap {
                        queue,
                        slot,
                        mode: plan.mode,
                    });
                }
                self.fast.taken += 1;
                self.split = Some(Some(Split::Doorbell {
                    ev,
                    early,
                    mode: plan.mode,
                }));
                true
            }
            _ => {
                self.early_buf = early;
                false
            }
        }
    }

    /// What a doorbell of `queue` at `now` that moves its write index
    /// (anything but [`DoorbellPlan::seen_wptr`]) preempts, when that is
    /// known without handling it: the doorbell makes an idle queue Ready
    /// at a VM priority above every busy level (and above the slice
    /// owner's) of its partition, and nothing else can enter the
    /// exclusive decision (no idle queue due to give its slot back, no
    /// aging due, no CU reservation or co-residence possible, no action
    /// pending); that decision evicts every running queue of the
    /// partition. Fills `victims` (queue, slot) in the order their unmaps
    /// are queued. The answer holds for doorbells before
    /// [`DoorbellPlan::until`] as long as nothing else reaches the
    /// scheduler; a caller may hand the unmaps to the GPU before handling
    /// the doorbell (the decision then queues the same ones first).
    pub fn doorbell_plan(
        &self,
        queue: QueueId,
        now: Nanos,
        victims: &mut Vec<(QueueId, SlotId)>,
    ) -> Option<DoorbellPlan> {
        victims.clear();
        let now = now.max(self.now);
        if self.split.is_some()
            || !matches!(self.cfg.policy, Policy::Hqdmux | Policy::Reset)
            || !self.slices()
            || !self.actions.is_empty()
            || !self.spatial.changes.is_empty()
        {
            return None;
        }
        let q = self.queues.get(&queue)?;
        if q.state != QueueState::Idle || q.errored || q.boosted {
            return None;
        }
        let vm = q.vm;
        let v = self.vms.get(&vm)?;
        if v.paused || v.removed {
            return None;
        }
        let level = v.params.priority as u16;
        let p = v.partition as usize;
        let part = self.parts.get(p)?;
        // Time conditions: an idle mapped queue due to give its slot back,
        // or an aging batch due, would enter the decision.
        let idle_due = part.idle_mapped.first().map_or(Nanos::MAX, |&(since, _)| {
            since.saturating_add(self.cfg.idle_unmap_ns)
        });
        let wait_due = part.waiting[..(level as usize).min(16)]
            .iter()
            .filter_map(|w| w.first().map(|e| e.0))
            .min()
            .map_or(Nanos::MAX, |d| d.max(part.aging.next_batch));
        let until = idle_due.min(wait_due);
        if part.top().is_none_or(|t| t >= level)
            || part.owner.is_some_and(|o| o.vm == vm || o.level >= level)
            || part.aging.batch_since.is_some()
            || until <= now
            || part.running.is_empty()
        {
            return None;
        }
        if self.spatial.enabled() && self.spatial.res.get(p).copied().flatten().is_some() {
            return None;
        }
        if self.spatial_on() {
            let owner = SliceOwner {
                vm,
                level,
                since: now,
                drained: None,
            };
            if self.spatial_coreside(p, owner)
                || self
                    .spatial
                    .size(
                        vm,
                        1,
                        self.cfg.spatial_headroom_pct,
                        self.cfg.spatial_max_permille,
                    )
                    .is_some()
            {
                return None;
            }
        }
        for &(_, _, r) in &part.running {
            match self.queues.get(&r) {
                Some(rq) if rq.vm != vm && rq.slot.is_some() => victims.push((r, rq.slot?)),
                _ => {
                    victims.clear();
                    return None;
                }
            }
        }
        Some(DoorbellPlan {
            mode: self.preempt_mode(),
            seen_wptr: q.wptr,
            until,
        })
    }

    /// Can a dispatch width noted with [`Scheduler::note_dispatch_width`]
    /// change a decision under the current geometry and configuration?
    /// `false` when spatial sharing is off or no reservation can fit
    /// (`spatial_max_permille` of an XCC is less than one CU): the caller
    /// may then note widths after the doorbell's decision instead of before.
    pub fn dispatch_width_matters(&self) -> bool {
        let cap = u64::from(self.spatial.cus_per_xcc)
            * u64::from(self.cfg.spatial_max_permille.min(1000))
            / 1000;
        self.spatial.enabled()
            && self.cfg.policy == Policy::Hqdmux
            && self.slices()
            && self.cfg.spatial_max_permille > 0
            && cap >= 1
    }

    /// Checks the internal indexes against the queue states (tests).
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut held = BTreeMap::new();
        for (i, o) in self.slot_owner.iter().enumerate() {
            if let Some(q) = o {
                if held.insert(*q, i).is_some() {
                    return Err(format!("{q:?} holds two slots"));
                }
                let qq = self
                    .queues
                    .get(q)
                    .ok_or(format!("slot {i} held by unknown {q:?}"))?;
                if qq.slot != Some(SlotId(i as u32)) {
                    return Err(format!("slot {i} owner {q:?} thinks it has {:?}", qq.slot));
                }
            }
        }
        for (id, q) in &self.queues {
            let mapped = matches!(
                q.state,
                QueueState::Running | QueueState::MappedIdle | QueueState::Preempting
            );
            if mapped != q.slot.is_some() {
                return Err(format!("{id:?} in {:?} with slot {:?}", q.state, q.slot));
            }
            if mapped && !held.contains_key(id) {
                return Err(format!("{id:?} has a slot the table does not give it"));
            }
            if q.key != self.key_of(q)
                && q.state != QueueState::Idle
                && q.state != QueueState::Error
            {
                return Err(format!("{id:?} indexed under a stale key"));
            }
        }
        for (pi, p) in self.parts.iter().enumerate() {
            let in_part = || self.vms.values().filter(|v| v.partition as usize == pi);
            let ready: usize = in_part().map(|v| v.ready.len()).sum();
            let running: usize = in_part().map(|v| v.running.len()).sum();
            let busy = (ready + running) as u32;
            let pbusy: u32 = p.busy.values().flat_map(|m| m.values()).sum();
            if ready != p.ready.len() || running != p.running.len() || busy != pbusy {
                return Err(format!(
                    "partition {pi}: per-VM indexes ({ready} ready, {running} running, \
                     {busy} busy) disagree with the partition's ({}, {}, {pbusy})",
                    p.ready.len(),
                    p.running.len()
                ));
            }
            let free: usize = p.free.iter().map(|s| s.len()).sum();
            let used = self
                .slot_owner
                .iter()
                .enumerate()
                .filter(|(i, o)| o.is_some() && self.slots[*i].partition as usize == pi)
                .count();
            let total = self
                .slots
                .iter()
                .filter(|s| s.partition as usize == pi)
                .count();
            if free != p.nfree || free + used != total {
                return Err(format!(
                    "partition {pi}: {free} free + {used} used != {total}"
                ));
            }
        }
        Ok(())
    }
}

/// States in which a queue wants the GPU (indexed as ready or running).
fn is_demand(st: QueueState) -> bool {
    matches!(
        st,
        QueueState::Ready | QueueState::Saved | QueueState::Running
    )
}

fn check_params(p: &VmParams, parts: u32) -> Result<(), SchedError> {
    if p.priority > MAX_PRIORITY {
        return Err(SchedError::Priority(p.priority));
    }
    if !WEIGHT_RANGE.contains(&p.weight) {
        return Err(SchedError::Weight(p.weight));
    }
    match p.partition {
        Some(x) if x >= parts => Err(SchedError::Partition(x, parts)),
        _ => Ok(()),
    }
}

/// How long a ready queue of `level` (below the top busy level) waits
/// before it is due for a boost: `aging_ns x 2 / (level + 2)`, i.e.
/// `aging_ns` at level 0, half of it at level 2, an eighth at level 14.
/// The boost rate of a starved VM, `(level + 2) / (2 x aging_ns)`, grows by
/// the same step per level, so VMs starved by a higher one get their aged
/// service strictly in the order of their priorities.
fn age_wait(cfg: &SchedConfig, level: u16) -> Nanos {
    let l = level.min(15) as u64;
    (cfg.aging_ns.saturating_mul(2) / (l + 2)).max(1)
}

fn weight(v: &Vm, pol: Policy) -> u128 {
    if pol == Policy::Timeslice {
        1
    } else {
        v.params.weight.max(1) as u128
    }
}

/// Adds the running period since `active_since` to the VM's GPU time and
/// virtual time, and starts a new period.
///
/// Billing (`stats.gpu_ns`) follows the modelled GPU time of the VM's own
/// work: the part of the period after `bill_from` (see [`billable`]).
/// Virtual time (fairness) takes the same billed time: CWSR save and
/// restore are the scheduler's overhead, not the VM's use (a VM preempted
/// more often must not fall behind for it).
fn charge(v: &mut Vm, now: Nanos, pol: Policy) {
    let d = billable(v, now);
    v.stats.gpu_ns += d;
    v.vtime += d as u128 * SCALE / weight(v, pol);
    v.active_since = now;
}

/// Billed part of the running period `active_since..now`: from
/// `bill_from` on (not before `active_since`, nothing once past `now`).
fn billable(v: &Vm, now: Nanos) -> Nanos {
    if v.wait_save {
        return 0;
    }
    now.saturating_sub(v.active_since.max(v.bill_from).min(now))
}

fn vtime_now(v: &Vm, now: Nanos, pol: Policy) -> u128 {
    let mut t = v.vtime;
    if v.active > 0 {
        t += billable(v, now) as u128 * SCALE / weight(v, pol);
    }
    t
}

#[cfg(test)]
mod queue_hasher_tests {
    use super::*;
    use std::hash::BuildHasher;

    fn h(q: QueueId) -> u64 {
        BuildHasherDefault::<QueueIdHasher>::default().hash_one(q)
    }

    /// Dense ids and ids that differ only in their high half (a VM index
    /// in the upper bits) spread over the low bits the table uses.
    #[test]
    fn queue_ids_spread_over_low_bits() {
        for ids in [
            (0..4096u64).map(QueueId).collect::<Vec<_>>(),
            (0..4096u64).map(|v| QueueId(v << 32 | 3)).collect(),
        ] {
            let buckets: BTreeSet<u64> = ids.iter().map(|&q| h(q) & 0xfff).collect();
            assert!(buckets.len() > 2048, "{} of 4096 buckets", buckets.len());
            let full: BTreeSet<u64> = ids.iter().map(|&q| h(q)).collect();
            assert_eq!(full.len(), ids.len());
        }
    }

    /// The same id always hashes the same (runs are reproducible).
    #[test]
    fn hash_is_fixed() {
        assert_eq!(h(QueueId(77)), h(QueueId(77)));
        assert_ne!(h(QueueId(77)), h(QueueId(78)));
    }
}

#[cfg(test)]
#[path = "split_tests.rs"]
mod split_tests;
