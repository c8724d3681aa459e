//! Sans-IO scheduler core: which virtual MQD (a guest's queue) holds which
//! physical HQD slot, and when one is preempted. See `docs/scheduling.md`.
//!
//! The [`Scheduler`] is a pure state machine. The caller feeds it
//! [`Event`]s (doorbells, idle queues, finished dequeues, queue errors, timer
//! ticks), each stamped with the caller's clock, and drains [`Action`]s with
//! [`Scheduler::poll_action`]: map a queue to a slot, unmap a slot with a
//! dequeue mode, arm the (single) timer. There are no threads, clocks or
//! devices inside; the same engine runs under the real-time VMM and the
//! virtual-time evaluation harness.
//!
//! Control operations (add/remove VMs and queues; VM priority, VM weight,
//! queue priority and policy changes) are methods rather than events so that
//! a bad one fails at once with a typed [`SchedError`]; they only change
//! state and take effect at the next decision, which a caller that wants them
//! applied at once triggers with an [`Event::Tick`]. (A doorbell that does not
//! move the write pointer is dropped without a decision, see
//! [`Event::Doorbell`].)
//!
//! Ranking: VM priority decides preemption between VMs and weights decide
//! the shares of VMs of equal priority; a queue's own priority (from the
//! guest's MQD) only orders and preempts queues of the same VM, so a guest
//! cannot raise itself above its equals.

mod engine;
pub mod event_mix;
mod policy;
mod spatial;
#[cfg(test)]
mod tests;

pub use engine::{DoorbellPlan, EngineStats, FastStats, Scheduler};
pub use policy::{Decision, Policy, PolicyOps, QuantumRule};
pub use spatial::{CuSet, SpatialStats};

use serde::Deserialize;

/// Nanoseconds on the caller's clock.
pub type Nanos = u64;

/// Highest VM or queue priority (KFD's queue priorities are 0..=15).
pub const MAX_PRIORITY: u8 = 15;
/// VM and queue priorities, higher wins. The scheduler refuses others;
/// config, API, CLI and scenarios check against this range.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<u8> = 0..=MAX_PRIORITY;
/// Weights among VMs of equal priority. The scheduler refuses others;
/// config, API, CLI and scenarios check against this range.
pub const WEIGHT_RANGE: std::ops::RangeInclusive<u32> = 1..=1000;

/// A VM (tenant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VmId(pub u32);

impl std::fmt::Display for VmId {
    /// The bare number, as logs and reports have always shown a VM.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A virtual queue (vMQD), unique across VMs; chosen by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId(pub u64);

/// A physical HQD slot: index into the slot list given to [`Scheduler::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(pub u32);

/// Where a physical slot is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotDesc {
    /// Partition (queues of one partition share its CUs).
    pub partition: u32,
    /// MEC pipe.
    pub pipe: u32,
    /// Queue within the pipe.
    pub queue: u32,
}

/// How a slot is unloaded: the HQD dequeue request (`CP_HQD_DEQUEUE_REQUEST`
/// values), chosen by the scheduler (or the guest) and carried out by the
/// GPU backend (`gpu::backend::PhysGpu::unmap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DequeueMode {
    /// DRAIN_PIPE: stop fetching, let in-flight workgroups finish, then go
    /// inactive (used for idle queues).
    DrainPipe = 1,
    /// RESET_WAVES: kill in-flight waves; the interrupted packets restart
    /// from scratch later.
    ResetWaves = 2,
    /// SAVE_WAVES: CWSR, save in-flight waves to the context save area;
    /// resume exactly later.
    SaveWaves = 3,
}

impl DequeueMode {
    /// From the register value.
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(DequeueMode::DrainPipe),
            2 => Some(DequeueMode::ResetWaves),
            3 => Some(DequeueMode::SaveWaves),
            _ => None,
        }
    }
}

/// Per-VM scheduling parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmParams {
    /// 0..=15, higher wins.
    pub priority: u8,
    /// Share among VMs of equal priority (>= 1).
    pub weight: u32,
    /// Partition the VM is pinned to; `None`: the least loaded at `add_vm`.
    pub partition: Option<u32>,
}

impl Default for VmParams {
    fn default() -> Self {
        VmParams {
            priority: 0,
            weight: 1,
            partition: None,
        }
    }
}

/// Engine tunables. Every time is in ns.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedConfig {
    /// Policy.
    pub policy: Policy,
    /// `true` (default): while queues of a higher level are busy in a
    /// partition, lower-level queues do not co-run on its CUs (they are
    /// preempted). `false`: lower levels fill slots the higher level leaves.
    pub exclusive: bool,
    /// `false` (default): one VM at a time holds a partition's top level
    /// (weighted slices). `true`: every busy queue of the top level co-runs
    /// (work-conserving when VMs cannot fill the GPU alone; shares among
    /// equals then follow the hardware's priority-blind arbitration, not
    /// weights). Lower levels stay excluded while `exclusive`.
    pub corun_equals: bool,
    /// Time slice among VMs of equal level, indexed by VM priority.
    pub quantum_ns: [u64; 16],
    /// Quantum of the `timeslice` baseline and of `fifo`'s round robin.
    pub baseline_quantum_ns: u64,
    /// A VM holding a partition is not preempted (by anyone) before it held it
    /// this long: bounds thrashing.
    pub min_run_ns: u64,
    /// A ready queue waiting this long is boosted above every priority until
    /// it goes idle or has run `min_run_ns` (starvation bound).
    pub aging_ns: u64,
    /// Anticipation cap: a slice owner whose queues all drain keeps the
    /// partition against its equals and lower levels for a grace of twice its
    /// recent re-ring gap (at least 10 us), when that is at most this long;
    /// against lower work only, it holds longer when its gap distribution
    /// makes a CWSR switch cost more than the idle time (the cost-aware
    /// hold, docs/scheduling.md). 0 disables both. Priority policies only.
    pub anticipation_ns: u64,
    /// A mapped queue idle this long gives its slot back (DRAIN).
    pub idle_unmap_ns: u64,
    /// Poll period of the `poll5ms` baseline.
    pub poll_ns: u64,
    /// Spatial sharing (`hqdmux` policy, exclusive slices, with a CU geometry
    /// from [`Scheduler::set_cu_geometry`]): the largest share of each XCC,
    /// in permille, that a high-priority VM may reserve beside lower work
    /// instead of preempting it; a wider demand falls back to CWSR
    /// preemption. 0 disables spatial sharing. Default 500: the promise's
    /// class of real-time tenants up to half the partition wide.
    pub spatial_max_permille: u32,
    /// Headroom (percent) over the widest recent dispatch when sizing a
    /// reservation.
    pub spatial_headroom_pct: u32,
    /// A reservation stays in place across its VM's idle gaps when its
    /// re-ring gap is at most this long (a 5 kHz tenant), so lower work never
    /// lands on its CUs; longer gaps release it when the VM goes idle.
    pub spatial_hold_ns: u64,
    /// Co-residence (occupancy): a higher-level owner whose recent
    /// dispatches each fit in half a CU, beside lower work whose dispatches
    /// do too, shares the lower work's CUs (no reservation, no save) when
    /// the delay sharing may cause its job, `2A - s` (its alone time `A`
    /// in rounds of its solo time `s`: docs/scheduling.md, "Co-residence
    /// admission on the job's rounds"), is at most this long, or at most
    /// the partition's measured save and restore if that is longer: a
    /// delay within the one save and restore the promise allows a higher
    /// VM. Default 240 us: the modelled MI300X
    /// save and restore of a whole partition (242 us). 0 disables
    /// co-residence. The same allowance decides a drained reservation:
    /// lower VMs whose solo time is at most this (or the measured save
    /// and restore) keep running while their workgroups on the reserved
    /// CUs end, instead of being saved.
    pub spatial_coreside_ns: u64,
}

impl SchedConfig {
    /// Checks the values: every quantum and period must be at least 1 ns.
    pub fn validate(&self) -> Result<(), SchedError> {
        let bad = |field: &'static str, reason: &str| {
            Err(SchedError::Config {
                field,
                reason: reason.into(),
            })
        };
        if let Some(i) = self.quantum_ns.iter().position(|q| *q == 0) {
            return Err(SchedError::Config {
                field: "quantum_ns",
                reason: format!("entry {i} (VM priority {i}) must be > 0"),
            });
        }
        if self.baseline_quantum_ns == 0 {
            return bad("baseline_quantum_ns", "must be > 0");
        }
        if self.aging_ns == 0 {
            return bad(
                "aging_ns",
                "must be > 0 (0 would boost every waiting queue at once)",
            );
        }
        if self.poll_ns == 0 {
            return bad("poll_ns", "must be > 0");
        }
        Ok(())
    }
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            policy: Policy::Hqdmux,
            exclusive: true,
            corun_equals: false,
            quantum_ns: [10_000_000; 16],
            baseline_quantum_ns: 10_000_000,
            min_run_ns: 500_000,
            aging_ns: 500_000_000,
            anticipation_ns: 100_000,
            idle_unmap_ns: 2_000_000,
            poll_ns: 5_000_000,
            spatial_max_permille: 500,
            spatial_headroom_pct: 25,
            spatial_hold_ns: 1_000_000,
            spatial_coreside_ns: 240_000,
        }
    }
}

/// Something that happened, at the caller's time `now` (never decreasing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The guest rang the queue's doorbell. A doorbell whose `wptr` equals
    /// the last one seen for the queue announces nothing new and is dropped
    /// without a decision (counted in `EngineStats::stale_doorbells`): the
    /// queue's state already reflects the work up to that pointer.
    Doorbell {
        /// Queue.
        queue: QueueId,
        /// Write pointer (AQL write index, packets) the doorbell carries.
        wptr: u64,
        /// Time.
        now: Nanos,
    },
    /// A mapped queue ran dry (read == write, nothing in flight).
    QueueIdle {
        /// Queue.
        queue: QueueId,
        /// Time.
        now: Nanos,
    },
    /// A dequeue requested by [`Action::Unmap`] finished; the slot is free.
    Unmapped {
        /// Queue.
        queue: QueueId,
        /// The queue still has work (saved waves or unread packets).
        has_work: bool,
        /// Modelled/measured dequeue time (accounted to the queue's VM).
        save_ns: Nanos,
        /// Time.
        now: Nanos,
    },
    /// The queue stopped on bad input; it keeps its slot until unmapped.
    QueueError {
        /// Queue.
        queue: QueueId,
        /// Time.
        now: Nanos,
    },
    /// The timer fired (or the caller wants control changes applied now).
    Tick {
        /// Time.
        now: Nanos,
    },
}

impl Event {
    /// Event time.
    pub fn now(&self) -> Nanos {
        match *self {
            Event::Doorbell { now, .. }
            | Event::QueueIdle { now, .. }
            | Event::Unmapped { now, .. }
            | Event::QueueError { now, .. }
            | Event::Tick { now } => now,
        }
    }
}

/// What the caller must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Load the queue's MQD into the slot.
    Map {
        /// Queue.
        queue: QueueId,
        /// Free slot.
        slot: SlotId,
    },
    /// Dequeue the slot; report [`Event::Unmapped`] when done.
    Unmap {
        /// Queue.
        queue: QueueId,
        /// Its slot.
        slot: SlotId,
        /// Dequeue mode.
        mode: DequeueMode,
    },
    /// Deliver [`Event::Tick`] at (or after) `at`; replaces any earlier timer.
    ArmTimer {
        /// Deadline.
        at: Nanos,
    },
}

/// Why the scheduler preempted a queue ([`SchedNotice::Preempted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PreemptReason {
    /// A VM of a higher priority level took the slot (or, in a co-running
    /// mode, lower work made room for a higher level).
    Priority,
    /// A queue boosted by aging took the slot (docs/scheduling.md,
    /// "Aging").
    Aging,
    /// An equal took its turn: its VM's slice came (quantum expiry, lag
    /// eligibility, the round robin of `fifo` and `timeslice`).
    Slice,
    /// A queue of higher queue priority of the same VM took the slot.
    QueuePriority,
    /// The operator paused the queue's VM.
    Paused,
    /// The caller dequeued the queue ahead of a decision that did not
    /// preempt it ([`Scheduler::adopt_unmap`]; never expected).
    Adopted,
}

impl PreemptReason {
    /// Lower-case name (`priority`, `aging`, `slice`, `queue_priority`,
    /// `paused`, `adopted`).
    pub fn name(self) -> &'static str {
        match self {
            PreemptReason::Priority => "priority",
            PreemptReason::Aging => "aging",
            PreemptReason::Slice => "slice",
            PreemptReason::QueuePriority => "queue_priority",
            PreemptReason::Paused => "paused",
            PreemptReason::Adopted => "adopted",
        }
    }
}

/// What the scheduler decided besides its [`Action`]s, said where it
/// decides it (drained with [`Scheduler::poll_notice`] once turned on with
/// [`Scheduler::record_notices`]). Exactly one `Preempted` per preemption
/// counted in [`EngineStats::preemptions`] and [`VmStats::preemptions`],
/// exactly one `Aged` per boost counted in [`VmStats::aging_boosts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedNotice {
    /// A running queue is being dequeued with its work left (its
    /// [`Action::Unmap`] is queued).
    Preempted {
        /// The preempted queue.
        queue: QueueId,
        /// Its VM.
        vm: VmId,
        /// The slot it leaves.
        slot: SlotId,
        /// The VM whose queue the slot is taken for, where one is: in the
        /// exclusive decision the partition's new holder, in a co-running
        /// mode the VM of the queue placed (or, when lower work makes room
        /// for a whole level, of the best queue of that level); `None`
        /// for `Paused` and `Adopted`.
        by: Option<VmId>,
        /// Why.
        reason: PreemptReason,
    },
    /// A queue was boosted by aging above every VM priority.
    Aged {
        /// The boosted queue.
        queue: QueueId,
        /// Its VM.
        vm: VmId,
    },
}

/// Life cycle of a virtual queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueState {
    /// Unmapped, nothing to do.
    Idle,
    /// Unmapped with work (no saved waves), waiting for a slot.
    Ready,
    /// Unmapped with CWSR state (saved waves) and work, waiting for a slot.
    Saved,
    /// Mapped and busy.
    Running,
    /// Mapped, ring empty (kept for `idle_unmap_ns`).
    MappedIdle,
    /// Dequeue requested, not finished; still holds its slot.
    Preempting,
    /// Stopped on bad input; ignores doorbells until removed.
    Error,
}

/// Per-VM accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmStats {
    /// GPU time charged: time with at least one queue running or being
    /// dequeued (includes its own CWSR save and restore).
    pub gpu_ns: Nanos,
    /// Dequeues of its queues that interrupted work (SAVE or RESET).
    pub preemptions: u64,
    /// Dequeue time of its queues.
    pub save_ns: Nanos,
    /// Maps of its queues.
    pub maps: u64,
    /// Time it held its partition idle against lower work (cost-aware
    /// hold, docs/scheduling.md); included in `gpu_ns`.
    pub held_ns: Nanos,
    /// Time its preempted queues' dequeues waited for their own
    /// non-preemptible waves (beyond a CWSR save); included in `gpu_ns`.
    pub save_wait_ns: Nanos,
    /// Times one of its queues was boosted by aging (docs/scheduling.md,
    /// "Aging").
    pub aging_boosts: u64,
}

/// Bad control operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    /// VM id already used.
    #[error("vm {0:?} already exists")]
    DuplicateVm(VmId),
    /// No such VM.
    #[error("no vm {0:?}")]
    NoVm(VmId),
    /// Queue id already used.
    #[error("queue {0:?} already exists")]
    DuplicateQueue(QueueId),
    /// No such queue.
    #[error("no queue {0:?}")]
    NoQueue(QueueId),
    /// Priority out of [`PRIORITY_RANGE`].
    #[error(
        "priority {0} is out of range {lo}..={hi}",
        lo = PRIORITY_RANGE.start(),
        hi = PRIORITY_RANGE.end()
    )]
    Priority(u8),
    /// Weight out of [`WEIGHT_RANGE`].
    #[error(
        "weight {0} is out of range {lo}..={hi}",
        lo = WEIGHT_RANGE.start(),
        hi = WEIGHT_RANGE.end()
    )]
    Weight(u32),
    /// Partition out of range.
    #[error("partition {0} does not exist ({1} partitions)")]
    Partition(u32, u32),
    /// The slot list is empty.
    #[error("no HQD slots")]
    NoSlots,
    /// A tunable out of range.
    #[error("field `{field}`: {reason}")]
    Config {
        /// `SchedConfig` field.
        field: &'static str,
        /// Why.
        reason: String,
    },
}
