//! The scheduling engine (policy in docs/scheduling.md).

use crate::*;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::BuildHasherDefault;

mod aging;
mod batch_res;
mod busy;
mod control;
mod coreside_lower;
mod coreside_periodic;
mod coreside_places;
mod cwsr_budget;
mod drain_due;
mod exclusive;
mod fast_path;
pub(crate) mod free_wait;
mod gap_home;
mod gap_price;
mod gaps;
mod give;
mod hold;
mod index;
pub(crate) mod kernel_rounds;
mod lockstep;
mod nsp_save;
mod queue_save;
mod res_down;
mod res_hold;
mod res_keep;
mod res_pass;
mod restore_charge;
mod rt_pair;
mod rt_room;
mod setup_keep;
mod shared;
mod slots;
mod spatial_engine;
mod stretch_alone;
mod switch_price;
mod timers;
mod use_rate;
mod wide;
mod wide_drain;
mod wide_fit;
mod wide_keep;
mod wide_least;
mod wide_save;

pub(crate) use nsp_save::WaitedSaves;
use timers::Deadline;
#[cfg(test)]
pub(crate) use wide_drain::drained_gap_breaks;
pub(crate) use wide_least::save_high_after;

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

/// Cost-aware hold: a switch (CWSR save of the lower work that takes the
/// partition, and its restore) is worth this many times its duration in
/// idle GPU time. Giving the partition away at every gap of a closed loop
/// costs one save and restore per cycle (CWSR time) and delays the owner's
/// next job by one save: CWSR <= 10% of the run and the owner >= 95% of
/// its time alone both need a cycle of at least 10 x (save + restore)
/// (docs/scheduling.md, "Cost-aware hold").
const HOLD_SWITCH_FACTOR: u64 = 10;

/// Aging budget: boosted (aged) work, plus the CWSR it causes, takes at most
/// `1 / AGING_SHARE_INV` of a partition's time (a batch of boosts lasting
/// `b` is followed by `(b + save and restore) x (AGING_SHARE_INV - 1)` of
/// no boosts), so that a top-level VM keeps more than 95% of its GPU time
/// whatever the number of starved VMs below it.
const AGING_SHARE_INV: u64 = 32;

/// A preemption's dequeue longer than this many typical CWSR saves of its
/// partition waited for non-preemptible waves: the excess is billed to the
/// VM and counted in the aging budget ([`Scheduler::save_wait`]). A save's
/// own time varies with the state saved (a quarter-CU workgroup writes a
/// quarter of a CU's state, 68 vs 242 us for save and restore in the
/// simulator), well within the factor.
const SAVE_WAIT_FACTOR: u64 = 8;

/// A dequeue no longer than this is never taken for a wait: four times the
/// longest CWSR save and restore the simulator models (242 us for a whole
/// partition of full-CU workgroups). Saves of different VMs' work differ
/// (a VM of 1-ns workgroups saves in a few us, one of full-CU workgroups
/// in ~121 us), so the typical save of the partition alone would take
/// the second's ordinary saves for waits. A wait shorter than this goes
/// unbilled: at most this much per preemption, whose rate the policy
/// bounds (slices, lag holds, aging batches).
const SAVE_WAIT_FLOOR_NS: Nanos = 1_000_000;

/// Longest aging batch: boosted queues run at most this long in a row.
const AGING_BATCH_NS: Nanos = 2_000_000;
/// Yield allowance of an aging batch (docs/scheduling.md, "Aging",
/// "Yielding to a demand-limited higher VM"): a batch pauses for a
/// higher-level VM that is demand-limited (busy for at most this long
/// without a break longer than its anticipation grace) and resumes when
/// it drains; the pauses of one batch, each counted as its time plus one
/// save and restore of the batch's work when that work was saved, take at
/// most this, and the batch ends that much later. Half a batch: a higher VM's busy period longer
/// than this is backlogged, not a short job, and the aging bound grows by
/// `B / 2` per turn.
const AGING_YIELD_NS: Nanos = AGING_BATCH_NS / 2;
/// The most lag (GPU time ahead of its busy equals) a VM may re-enter
/// with after an idle time (`engine/index.rs`): above the longest job of
/// the documented range (50 ms, docs/scenarios.md), so an under-share VM's
/// job is not sliced with its equals whatever its size.
pub(crate) const MAX_LAG_NS: Nanos = 64_000_000;
/// Virtual time a new VM starts at: far enough from 0 that the lag a VM
/// re-enters with (`floor - allow`) never saturates at 0 while the VMs of
/// a partition are young (it would erase the lag of a VM waking among
/// VMs that have not run yet).
const VT_BASE: u128 = 1 << 64;

/// Why a queue is being dequeued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    /// Preempted with work left, for the given cause.
    Preempt(DequeueMode, Cause),
    /// Idle queue gives its slot back.
    Evict,
    /// Queue error: the slot is reclaimed, the queue stays in error.
    Error,
    /// Queue removed by the operator.
    Remove,
}

/// For whom and why a queue is preempted (its [`SchedNotice::Preempted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cause {
    by: Option<VmId>,
    why: PreemptReason,
}

impl Cause {
    fn new(by: Option<VmId>, why: PreemptReason) -> Cause {
        Cause { by, why }
    }
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
    /// Counted in its VM's `demand` (Ready, Saved, Running, or being
    /// preempted with work; not an idle queue giving its slot back).
    wants: bool,
    /// The backend's report of its dequeue in flight: time its save waited
    /// for its own waves without a save point
    /// ([`Scheduler::note_save_wait`]; `None`: not reported).
    save_wait: Option<Nanos>,
    /// Of that wait, the partition time its waves held
    /// ([`Scheduler::note_save_wait_held`]; `None`: all of it).
    save_wait_held: Option<Nanos>,
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
    /// When it last became busy after an idle time longer than its
    /// anticipation grace: a closed loop that re-rings within the grace
    /// has been demanding since its first job (lag eligibility).
    demanding_since: Nanos,
    /// Its request: moving average (1/4) of the GPU time billed over its
    /// busy periods (from a wake after more than its grace to the next
    /// such wake), ns. Sizes the lag it may re-enter
    /// with (see `index.rs`).
    request_ewma: Nanos,
    /// `stats.gpu_ns` at its last wake after more than its grace.
    gpu_at_wake: Nanos,
    /// Its use rate over its recent busy-period cycles (`use_rate.rs`; a
    /// cycle runs from a wake after more than its grace to the next such
    /// wake): billed GPU time and time without demand per cycle.
    cycle_use: use_rate::CycleUse,
    /// Distribution of its re-ring gaps (cost-aware hold, `gaps.rs`):
    /// from the end of its demand (no queue Ready, Saved, Running or
    /// being preempted with work) to its next demand. (`gap_ewma` also
    /// counts an idle queue's slot hand-back as demand.)
    gaps: gaps::GapHist,
    /// Its wake periods on the whole partition and under a wide
    /// reservation (`wide.rs`).
    wake: wide::WakePeriods,
    /// Queues counted as demand (see `Queue::wants`).
    demand: u32,
    /// When its demand last ended (`None`: never had any).
    demand_idle_at: Option<Nanos>,
    /// When it was added: the idle before its first demand counts as idle
    /// of its first cycle (`use_rate.rs`).
    added_at: Nanos,
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
    /// End of the last save wait billed to it (waits of its queues saved
    /// together overlap and are billed once, `save_wait`).
    wait_billed_until: Nanos,
    /// Aging service received, weighted: per batch in which one of its
    /// queues ran boosted, `(billed partition time + 2 x save) x SCALE /
    /// (level + 2)` (stride order of the aging server, `engine/aging.rs`).
    aged_tag: u128,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SliceOwner {
    vm: VmId,
    level: u16,
    since: Nanos,
    /// Since when the owner has had no busy queue at its level
    /// (anticipation grace running).
    drained: Option<Nanos>,
    /// Cost-aware hold computed when it drained (from its gap
    /// distribution and the partition's switch cost), ns.
    hold: Nanos,
    /// The hold held lower work off (billed to the owner when it ends).
    cost_held: bool,
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
    /// Slots of the partition (the most queues that run at once; the
    /// largest aging batch).
    nslots: usize,
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
    freeing: BTreeSet<QueueId>,
    /// Busy VMs by charged virtual time (fairness floor).
    vt: BTreeSet<(u128, VmId)>,
    /// VM holding the partition's exclusive slice.
    owner: Option<SliceOwner>,
    /// Owner displaced by a higher level.
    parked: Option<Parked>,
    /// VMs that became busy since the last owner choice (a parked owner
    /// does not resume ahead of an equal that woke meanwhile).
    woken: Vec<VmId>,
    vms: usize,
    /// Aging batches and their budget.
    aging: AgingBudget,
    /// VMs whose billing waits for the partition's saves in flight.
    save_waiters: Vec<VmId>,
    /// The CUs other queues' `no_save_point` waits left free during the
    /// partition's saves in flight, billed to the VMs mapped meanwhile
    /// (`engine/free_wait.rs`, [`free_wait::FreeWait`]).
    free_wait: free_wait::FreeWait,
    /// The partition's running CWSR share: a reservation's lapse it cannot
    /// pay for is not made (`engine/cwsr_budget.rs`).
    cwsr_budget: cwsr_budget::CwsrBudget,
}

/// Aging batches of a partition: the queues due for a boost are boosted
/// together (one batch), and the next batch waits until the batch's cost
/// is at most [`AGING_SHARE_INV`]`^-1` of the time since it started.
#[derive(Clone, Debug, Default)]
struct AgingBudget {
    /// Start of the running batch.
    batch_since: Option<Nanos>,
    /// Queues boosted by the running batch, with their `since` when
    /// boosted (a queue whose state and `since` are unchanged at the end
    /// did not run).
    batch: Vec<(QueueId, Nanos)>,
    /// GPU time billed to each VM of the running batch when it started.
    batch_billed: Vec<(VmId, Nanos)>,
    /// Virtual clock of the aging server: the weighted turn tag of the
    /// last VM served first in a batch. A VM that becomes due enters at
    /// no less than it (no credit for turns it did not ask for).
    vclock: u128,
    /// No batch starts before this.
    next_batch: Nanos,
    /// Last dequeue (CWSR save) time seen in the partition: a batch is
    /// charged one save and one restore of the work it displaced.
    save_ns: Nanos,
    /// `save_ns` without its wait for waves that have no save point (the
    /// save itself; the wait is billed to the waves' VM): a pause's switch
    /// (`Scheduler::pause_switch`).
    save_clean_ns: Nanos,
    /// Moving average (1/4) of the partition's CWSR saves that saved
    /// something (> 0 ns): the switch cost of the cost-aware hold.
    save_ewma: Nanos,
    /// Typical CWSR save of the partition: moving average (1/4) of the
    /// preemptions' dequeues no longer than [`SAVE_WAIT_FACTOR`] times it
    /// (see [`Scheduler::save_wait`]).
    save_typ: Nanos,
    /// The partition's clean saves' high mark: raised at once by a longer
    /// save (one counted in `save_typ`), lowered by 1/8 of the difference
    /// by each shorter one. What a kept wide reservation's size subtracts
    /// for its setup save (`wide_least.rs`): a size shrinks only after
    /// many saves agree.
    save_high: Nanos,
    /// The running batch is paused for a demand-limited higher VM since
    /// this time (`engine/aging.rs`, [`AGING_YIELD_NS`]).
    paused_since: Option<Nanos>,
    /// The batch's queues unboosted by the pause (re-boosted when it ends,
    /// if they still have work).
    paused: Vec<QueueId>,
    /// Preemptions of their VMs when the pause started: a pause in which
    /// none of them was saved (the higher VM ran beside them: co-residence,
    /// a drained or existing reservation) cost the batch no switch.
    paused_saves: u64,
    /// The running batch's pauses so far, each its time plus one save and
    /// restore if the batch's work was saved (at most
    /// [`AGING_YIELD_NS`]): the batch ends this much later.
    yielded: Nanos,
    /// Last time the running batch's run beside a kept reservation of a
    /// higher VM was charged to `yielded` (`engine/batch_res.rs`).
    beside_at: Nanos,
    /// The next batch's choice in progress, a few waiting entries per
    /// event (`engine/aging.rs`, [`aging::AGING_SCAN_STEP`]).
    scan: Option<aging::AgingScan>,
    /// Queues chosen for the running batch not boosted yet, last first
    /// (a few per event, [`aging::AGING_BOOST_STEP`]).
    to_boost: Vec<QueueId>,
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
    /// Partitions decided again because a deadline of theirs was at or
    /// before the event's time (handled now instead of arming the past).
    pub past_deadlines: u64,
    /// Deadlines still due after that decision (they wait for an event,
    /// e.g. a dequeue in flight): not armed.
    pub stale_deadlines: u64,
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
    /// What was decided besides the actions, while `record` is on
    /// ([`Scheduler::record_notices`]).
    notices: VecDeque<SchedNotice>,
    record: bool,
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
    /// The timer table, reused between events.
    timer_buf: Vec<Deadline>,
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
    /// The one lower level running beside the owner, if any.
    beside: Option<u16>,
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
            part.nslots += 1;
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
            notices: VecDeque::new(),
            record: false,
            armed: None,
            next_poll: 0,
            now: 0,
            stats: EngineStats::default(),
            spatial: Default::default(),
            split: None,
            evict_buf: Vec::new(),
            early_buf: Vec::new(),
            fast: FastStats::default(),
            timer_buf: Vec::new(),
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
    /// `min(job, B) + save_ns` — and `save_ns` the longest CWSR save.
    ///
    /// This bound assumed the oldest-first aging order the engine had
    /// before the weighted aging server (issue 18) and jobs of at most `B`;
    /// the engine's bound, per level and per job length, is
    /// [`Scheduler::aging_bound_job_ns`].
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

    /// The aging bound per level and per job length (docs/scheduling.md,
    /// "Aging"): the longest a job of `job_ns` of partition time, of a VM
    /// of priority `level` with `queues` queues below the top busy level of
    /// its partition, waits for its completion under a priority policy,
    /// given the other VMs below the top level (`others`: their priority
    /// and queue count), `slots` HQD slots in the partition and `save_ns`
    /// the longest CWSR save (dequeue):
    ///
    /// `m x (age_wait(level) + T x F x (B + Y + 2 x save_ns) + B + Y)`
    ///
    /// with `w(l) = l + 2` the aging weight, `T = ceil(queues / S) +
    /// (queues - 1) + sum over others x of (ceil(q_x / S) x (1 + w(l_x) /
    /// w(level)) + [l_x = level] x q_x)` the budget periods that can come
    /// before its own turn (queues of one level are looked at in due
    /// order, the first `S` due of each level, so a queue of its own level
    /// due before it can take a batch first; across levels the stride order
    /// charges each turn its cost to the budget over the VM's weight, so
    /// another VM costs the budget at most `1 + w_x / w` batches per turn
    /// of this one, and a VM whose queues outnumber the slots takes
    /// `ceil(q / S)` batches), `F` = 32 (one batch per budget period `F x (B + Y + 2 x
    /// save_ns)`), `B` the aging batch, `Y` its yield allowance (a batch
    /// pauses for demand-limited higher VMs for at most `Y`, counting a
    /// save and restore per pause, and ends that much later), and `m = ceil(job_ns / (B - 2 x
    /// save_ns))` the turns the job needs (each turn runs it for the batch
    /// less a save of the work it displaces and its own restore; CWSR keeps
    /// its progress between turns, and after a turn it waits `age_wait`
    /// again).
    pub fn aging_bound_job_ns(
        cfg: &SchedConfig,
        level: u8,
        queues: u32,
        others: &[(u8, u32)],
        slots: usize,
        save_ns: Nanos,
        job_ns: Nanos,
    ) -> Nanos {
        let s = slots.max(1) as u64;
        let w = aging::aging_weight(level as u16) as u64;
        // Batches before its own, in units of 1 / w. Queues of one level
        // are looked at in due order (the first S due of each level), so
        // each queue of its own level due before it can add a batch.
        let turns_w = others.iter().fold(
            (queues.max(1) as u64)
                .div_ceil(s)
                .saturating_add(queues.max(1) as u64 - 1)
                .saturating_mul(w),
            |t, &(l, q)| {
                let wx = aging::aging_weight(l as u16) as u64;
                let same = if l == level { q.max(1) as u64 } else { 0 };
                t.saturating_add(
                    (q.max(1) as u64)
                        .div_ceil(s)
                        .saturating_mul(w + wx)
                        .saturating_add(same.saturating_mul(w)),
                )
            },
        );
        // A batch lasts at most `B + Y` (its pauses for demand-limited
        // higher VMs, `Y` in all, make it end that much later) and costs
        // the budget at most that plus one save and restore.
        let wall = AGING_BATCH_NS.saturating_add(AGING_YIELD_NS);
        let per = wall.saturating_add(save_ns.saturating_mul(2));
        let turn = age_wait(cfg, level as u16)
            .saturating_add(
                turns_w
                    .saturating_mul(AGING_SHARE_INV)
                    .saturating_mul(per)
                    .div_ceil(w),
            )
            .saturating_add(wall);
        let run = AGING_BATCH_NS
            .saturating_sub(save_ns.saturating_mul(2))
            .max(1);
        job_ns.div_ceil(run).max(1).saturating_mul(turn)
    }

    /// Longest aging batch, ns: boosted queues run at most this long in a
    /// row (`B` in [`Scheduler::aging_bound_job_ns`]).
    pub const AGING_BATCH_NS: Nanos = AGING_BATCH_NS;

    /// Yield allowance of an aging batch, ns (`Y` in
    /// [`Scheduler::aging_bound_job_ns`]): the batch's pauses for
    /// demand-limited higher VMs, each counted with one save and restore
    /// when the batch's work was saved, take at most this; the batch then
    /// ends as much later.
    pub const AGING_YIELD_NS: Nanos = AGING_YIELD_NS;

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

    /// The write index of the last doorbell seen for `queue`: another
    /// doorbell with it is stale (dropped without a decision, see
    /// [`Event::Doorbell`]).
    pub fn seen_wptr(&self, queue: QueueId) -> Option<u64> {
        self.queues.get(&queue).and_then(|q| q.wptr)
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

    /// VMs the scheduler holds: live ones and removed ones whose queues
    /// are not all gone yet.
    pub fn vm_count(&self) -> usize {
        self.vms.len()
    }

    /// Whether a VM is waiting: it has a queue with work (Ready or Saved)
    /// and none running or being preempted (the timeline's "waiting", as
    /// opposed to idle).
    pub fn vm_waiting(&self, vm: VmId) -> Option<bool> {
        self.vms
            .get(&vm)
            .map(|v| v.busy > v.active && v.active == 0)
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

    /// Turns the recording of [`SchedNotice`]s on or off (off by default:
    /// a caller that never polls them keeps none). Turning it off drops
    /// those not polled.
    pub fn record_notices(&mut self, on: bool) {
        self.record = on;
        if !on {
            self.notices.clear();
        }
    }

    /// Next notice of what the scheduler decided (preemptions with their
    /// cause, aging boosts), in the order decided; `None` while recording
    /// is off.
    pub fn poll_notice(&mut self) -> Option<SchedNotice> {
        self.notices.pop_front()
    }

    /// Records a notice (when recording is on).
    fn notice(&mut self, n: SchedNotice) {
        if self.record {
            self.notices.push_back(n);
        }
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
                    // The interval between the VM's jobs (reservation
                    // sizing, `spatial.rs`).
                    self.spatial.note_arrival(q.vm, now);
                    // One job per cycle? (`coreside_periodic.rs`.)
                    if let Some(v) = self.vms.get_mut(&q.vm) {
                        v.wake.arrival();
                    }
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
        let poll = self.ops().decision == Decision::PollFix && now >= self.next_poll;
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
        if self.ops().by_priority {
            self.age(p);
        }
        match self.ops().decision {
            Decision::Priority if self.slices() => self.decide_exclusive(p),
            Decision::Priority => self.decide_shared(p, true, self.cfg.exclusive),
            Decision::Timeslice => self.decide_exclusive(p),
            Decision::PollFix => self.decide_shared(p, poll, true),
            Decision::RoundRobin => self.decide_shared(p, false, false),
        }
        if matches!(self.split, Some(Some(_))) {
            return;
        }
        self.spatial_sync(p);
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
    if !pol.ops().weighted {
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

#[cfg(test)]
#[path = "pause_switch_tests.rs"]
mod pause_switch_tests;
