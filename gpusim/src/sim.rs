//! Simulated MI300-class GPU: one discrete-event model, two clocks.
//!
//! [`SimGpu`] is a state machine driven by [`PhysGpu::advance`]: it processes its
//! internal timers (workgroup completions, save/restore completions, barrier
//! polls) in time order up to `now`. Virtual time = the caller jumps `now` to
//! [`PhysGpu::next_deadline`]; real time = [`RealTimeDriver`] calls `advance`
//! with the monotonic clock and sleeps until the next deadline or a kick.
//!
//! See `docs/gpu-model.md` for the model, its constants and their sources.
//!
//! This file holds the state (queues, workgroups, batches, partitions), the
//! event loop, queue errors and the [`PhysGpu`] impl, which delegates to one
//! file per concern: `packet` (CP fetch, barriers, doorbell, decode,
//! completion, effects), `dispatch` (CU arbitration, guests, single
//! workgroups), `batch` (lock-step batches), `unmap` (map with restore,
//! dequeue modes, save time), `cwsr` (the control record) and `mask` (CU
//! masks).

mod batch;
mod cu_batch;
mod cwsr;
mod dispatch;
mod grow;
mod guest_pass;
mod host_lanes;
mod mask;
pub mod occupancy;
mod packet;
mod realtime;
mod running;
pub mod testkit;
mod unmap;
mod want;

pub use cwsr::{SAVE_MAGIC, SAVE_VERSION};
pub use realtime::RealTimeDriver;
pub use unmap::validate_load;

use dispatch::*;
use mask::*;
use packet::*;

use crate::backend::*;
use crate::mem::DmaMemory;
use crate::params::SimParams;
use crate::topology::{GpuTopology, TopologyError};
use abi::aql::{self, Barrier, Body, Packet};
use abi::kernel::{element_range, Kernarg, KernelDescriptor};
use abi::le::{put_u32, u32_at};
use abi::mqd::{self, V9Mqd};
use abi::queue::AMD_SIGNAL_VALUE;
use occupancy::Footprint;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

/// Smallest accepted ring, in packets (`abi::mqd::MIN_RING_BYTES` / 64 = 16).
pub const MIN_RING_PACKETS: u64 = mqd::MIN_RING_BYTES / aql::PACKET_SIZE as u64;
/// Largest accepted ring, in packets (`abi::mqd::MAX_RING_BYTES` / 64 = 2^25).
pub const MAX_RING_PACKETS: u64 = mqd::MAX_RING_BYTES / aql::PACKET_SIZE as u64;
/// Largest accepted workgroup count of one dispatch.
pub const MAX_WORKGROUPS: u64 = aql::MAX_WORKGROUPS;
/// Largest accepted work-items per workgroup (AMD's limit).
pub const MAX_WORKGROUP_ITEMS: u64 = aql::MAX_WORKGROUP_ITEMS;
/// Largest write index whose dword position (x16) fits the 64-bit `CP_HQD_PQ_WPTR`.
const MAX_INDEX: u64 = u64::MAX / mqd::DWORDS_PER_PACKET;
/// Shortest workgroup (ns): a zero cost would let one dispatch run unboundedly
/// many workgroups at a single model instant.
pub const MIN_WG_NS: u64 = 1;
/// Longest modelled workgroup (ns, 2^48 ~ 3 days): a kernel descriptor asking
/// for more is refused at dispatch (`DispatchError::CostOverflow`), as is a
/// dispatch whose workgroups x cost overflows 64-bit nanoseconds.
pub const MAX_WG_COST_NS: u64 = 1 << 48;

/// Counters of a [`SimGpu`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Workgroups that ran to completion (each applied its effect once).
    pub wgs_completed: u64,
    /// Packets completed.
    pub packets_completed: u64,
    /// Maps.
    pub maps: u64,
    /// Maps that restored saved state.
    pub restores: u64,
    /// SaveWaves dequeues.
    pub saves: u64,
    /// Workgroups saved mid-flight by SaveWaves.
    pub saved_wgs: u64,
    /// DrainPipe dequeues.
    pub drains: u64,
    /// ResetWaves dequeues.
    pub resets: u64,
    /// Workgroups killed by ResetWaves.
    pub killed_wgs: u64,
    /// Already-applied workgroup effects that ResetWaves will apply again (the
    /// interrupted packets restart from workgroup 0 at the next map).
    pub duplicate_effects: u64,
    /// Queue errors.
    pub queue_errors: u64,
    /// Sum of modelled save latencies (ns).
    pub save_ns_total: u64,
    /// Sum of modelled restore latencies (ns).
    pub restore_ns_total: u64,
    /// Calls that stopped at the event budget with the model behind the
    /// caller's clock (real time only; see [`SimGpu::set_event_budget`]).
    pub lagging_calls: u64,
    /// SaveWaves dequeues that had to wait for waves without a save point.
    pub saves_waiting: u64,
    /// Dequeues reported as not finished within their timeout.
    pub dequeue_timeouts: u64,
    /// ResetWaves requests that ended an unfinished drain or save.
    pub escalated_resets: u64,
    /// Host CU-mask changes of mapped slots ([`PhysGpu::set_cu_mask`]).
    pub cu_mask_changes: u64,
    /// Workgroups launched beside another queue's workgroup on a CU
    /// (occupancy: both fit the CU and share its throughput).
    pub coresident_wgs: u64,
    /// Re-checks of a blocked queue (an unmet barrier or an unpublished
    /// header with nothing else to run): backed off, so their number over a
    /// block grows with the logarithm of its length up to the cap
    /// ([`BLOCKED_POLL_MAX_SHIFT`]), then by one per capped interval.
    pub blocked_polls: u64,
    /// Blocked queues re-checked at once because another queue's
    /// completion wrote a signal ([`SimGpu`] wakes barrier waiters).
    pub barrier_wakes: u64,
    /// Completion signals decremented.
    pub signals_decremented: u64,
}

/// Smallest heap length at which stale timers are dropped from the whole
/// heap (below it, dropping them from the top as they come is cheap). A
/// drop of `n` timers follows at least `n / 2` arms (the heap doubled its
/// live length), so it costs O(1) per timer at any floor; the floor only
/// spares tiny heaps. Every pop pays for the stale timers still in the
/// heap (its depth, and 32 bytes each of cache): a flood of short guests
/// re-arms its hosts' batches at every placement, leaving a stale timer
/// each, which below the floor stays until it reaches the top.
const MIN_HEAP_COMPACT: usize = 512;

/// A blocked queue's re-check interval doubles from `barrier_poll_ns` up to
/// `barrier_poll_ns << BLOCKED_POLL_MAX_SHIFT` (512x: 1.024 ms by default).
pub const BLOCKED_POLL_MAX_SHIFT: u32 = 9;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    WgDone {
        idx: u32,
        gen: u32,
    },
    RestoreDone {
        slot: u32,
        gen: u64,
    },
    UnmapDone {
        slot: u32,
        gen: u64,
    },
    Poll {
        slot: u32,
        gen: u64,
    },
    /// A dequeue requested with a timeout ([`PhysGpu::unmap_within`]).
    DequeueTimeout {
        slot: u32,
        gen: u64,
    },
    BatchDone {
        idx: u32,
        gen: u32,
    },
    BatchShrink {
        idx: u32,
        gen: u32,
    },
}

#[derive(Clone, Copy, Debug)]
struct Dispatch {
    desc: KernelDescriptor,
    args: Kernarg,
    total: u64,
    items_per_wg: u64,
    /// One workgroup's share of a CU (occupancy).
    fp: Footprint,
}

#[derive(Clone, Copy, Debug)]
enum Work {
    Dispatch(Dispatch),
    And(Barrier),
    Or(Barrier),
    /// Completed before a save; body no longer needed.
    Done,
}

#[derive(Clone, Debug)]
struct Active {
    id: u64,
    work: Work,
    signal: u64,
    next_wg: u64,
    done_wgs: u64,
    inflight: u32,
    complete: bool,
    /// The batch that holds the packet's last workgroups (see [`Batch`]).
    batch: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SavedWg {
    id: u64,
    wg: u64,
    remaining: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HState {
    Active,
    Restoring,
    Unmapping { mode: DequeueMode, since: Nanos },
    Error(QueueErrorReason),
}

struct Hqd {
    tag: u64,
    gen: u64,
    mqd: V9Mqd,
    mem: Arc<dyn DmaMemory>,
    state: HState,
    ring_packets: u64,
    rptr: u64,
    wptr: u64,
    active: VecDeque<Active>,
    resume: VecDeque<SavedWg>,
    inflight: u32,
    held_cus: u32,
    poll_armed: bool,
    idle_reported: bool,
    /// The packet at the fetch index is not published (INVALID header): the
    /// CP waits on it. With nothing launched the queue is not consuming CUs
    /// and counts as idle (progress-based busy).
    blocked: bool,
    /// An unmet barrier-AND/OR holds back the rest of the ring (as of the
    /// last pump; kept while a dequeue trims the barrier from the window).
    barrier_blocked: bool,
    /// `map` refused it (a load-class error): it never ran.
    refused_at_map: bool,
    /// Re-checks since the queue blocked (an unpublished header or an unmet
    /// barrier with nothing else to run): the poll backs off.
    stall_polls: u32,
    /// Dequeue requested: mode and request time.
    unmap_req: Option<(DequeueMode, Nanos)>,
    /// A SaveWaves dequeue waits for in-flight workgroups of kernels
    /// without a save point (`abi::kernel::flags::NO_SAVE_POINT`): the save
    /// is written when `inflight` reaches 0.
    save_waiting: bool,
    /// Time the pending SaveWaves waited for waves without a save point
    /// (from the request to the start of the save), ns.
    save_wait_ns: Nanos,
    /// While `save_waiting`: CUs the slot holds (its saved waves' and its
    /// finishing ones'), since `wait_mark`; `wait_cu_ns` integrates them
    /// over the wait (`GpuEvent::Unmapped::wait_held_ns`).
    wait_cus: u32,
    wait_mark: Nanos,
    wait_cu_ns: u128,
    /// CU masks: the guest MQD's (`None`: every CU), the host's, and the
    /// CUs its workgroups may launch on (their intersection; `None`: all).
    guest_mask: Option<CuMask>,
    host_mask: Option<CuMask>,
    mask: Option<CuMask>,
    /// Guest workgroups (occupancy) saved by the pending SaveWaves: their
    /// state is written with the others; they held no CU of their own.
    saved_guests: u32,
}

impl Hqd {
    /// While a save waits for waves without a save point: adds the CUs
    /// held since `wait_mark` (`wait_cus` of them) to `wait_cu_ns` and
    /// moves the mark to `now`.
    fn integrate_wait(&mut self, now: Nanos) {
        let d = now.saturating_sub(self.wait_mark) as u128;
        self.wait_cu_ns = self.wait_cu_ns.saturating_add(self.wait_cus as u128 * d);
        self.wait_mark = now;
    }

    fn fetch(&self) -> u64 {
        self.rptr + self.active.len() as u64
    }
    /// Work the CP can make progress on: launched dispatches not finished,
    /// saved waves, workgroups in flight, or unread packets whose header is
    /// published and not held back by a barrier packet. A queue blocked on
    /// an INVALID header or on an unmet barrier-AND/OR, with nothing else
    /// launched, has none (progress-based busy, issue 21).
    fn has_work(&self) -> bool {
        !self.resume.is_empty()
            || self.inflight > 0
            || self
                .active
                .iter()
                .any(|a| !a.complete && !matches!(a.work, Work::And(_) | Work::Or(_)))
            || (self.fetch() != self.wptr && !self.blocked && !self.barrier_blocked)
    }

    /// A barrier packet of the window is not complete: later packets wait.
    fn barrier_pending(&self) -> bool {
        self.active
            .iter()
            .any(|a| !a.complete && matches!(a.work, Work::And(_) | Work::Or(_)))
    }
}

/// Uniform workgroups of one packet run in lock-step rounds on `width` CUs:
/// round r runs workgroups `first + r * width ..` and ends at
/// `start + (r + 1) * cost`. One batch costs the host O(1) events however
/// many workgroups it covers (the last round's unused CUs are released at
/// its start; a CU joining a running batch starts at its next round).
/// Only a packet's last batch has workgroups not yet started.
#[derive(Clone, Copy, Debug)]
struct Batch {
    slot: u32,
    qgen: u64,
    id: u64,
    first: u64,
    end: u64,
    width: u32,
    /// CUs held: `width`, or the last round's workgroups after the shrink.
    held: u32,
    start: Nanos,
    cost: Nanos,
    gen: u32,
    live: bool,
    armed: bool,
    /// How far guests (occupancy) have delayed its end: the largest CU
    /// time guests took from one of its CUs (`Part::cu_debt`); the batch
    /// (a kernel's barrier) ends as late as its most delayed CU.
    shifted: Nanos,
}

struct Wg {
    slot: u32,
    /// CU it runs on (partition numbering).
    cu: u32,
    qgen: u64,
    id: u64,
    wg: u64,
    end: Nanos,
    gen: u32,
    live: bool,
    /// Runs beside another queue's workgroup on `cu` (occupancy).
    guest: bool,
    /// Shares its CU at half rate until then (a guest, or an owner beside
    /// one; 0 or past: runs alone).
    shared_until: Nanos,
    /// The work (ns at its solo rate) it started with: its cost, or what a
    /// saved workgroup had left. Credited as CU time when it completes; a
    /// save credits the part done ([`PhysGpu::take_cu_time`]).
    work: Nanos,
}

struct Part {
    free_cus: u32,
    /// Free CUs by identity (the count above is their number).
    free_mask: CuMask,
    /// Per CU: slot + 1 of the queue holding it (0: free).
    cu_owner: Vec<u32>,
    slots: Vec<u32>,
    rr: usize,
    /// Per CU: slot + 1 of the queue whose workgroup runs there beside the
    /// owner's (0: none; occupancy, at most one guest per CU).
    cu_guest: Vec<u32>,
    /// Per CU: footprint of the owner's workgroup.
    cu_fp: Vec<Footprint>,
    /// CUs with an owner and no guest: where a guest may go. Kept with
    /// `cu_owner` and `cu_guest` so a guest search visits only these.
    lanes: CuMask,
    /// The guest lanes whose owner's workgroup leaves room for the smallest
    /// guest ([`guest_pass::SMALLEST_GUEST`]): the only CUs a guest can
    /// go to. Kept with `lanes` and `cu_fp`; a pass over a partition whose
    /// lanes all run whole-CU workgroups ends at once.
    roomy: CuMask,
    /// The roomy lanes by (owner, owner footprint): what a guest search
    /// visits (`host_lanes`). Kept with `roomy`.
    hosts: host_lanes::HostLanes,
    /// Per CU: CU time guests took from the owner's batch on it.
    cu_debt: Vec<Nanos>,
    /// Where the next guest search starts (round robin over CUs).
    guest_rr: usize,
    /// CUs whose owner left while a guest ran there: the guest runs on
    /// alone (`SimGpu::unshare_left`, at the next dispatch).
    left: Vec<u32>,
    /// Per CU: index + 1 in `SimGpu::wgs` of the single workgroup last
    /// started there by its owner (`[0]`) and as a guest (`[1]`); 0: none.
    /// Written when a workgroup starts, never cleared: a reader checks the
    /// workgroup is still live there (`SimGpu::wg_on`). Spares a scan of
    /// every workgroup per CU looked at.
    cu_wg: Vec<[u32; 2]>,
    /// Per CU: the batch whose CU list (`SimGpu::batch_cus`) it was last
    /// pushed to, and where ([`cu_batch::CuBatchIndex`]): spares the guest
    /// search a scan of every batch's list per lane looked at.
    cu_batch: cu_batch::CuBatchIndex,
    /// Indices of batches the rebalance may still cut, ascending, no
    /// repeats: every live batch of the partition not yet in its last
    /// round ([`Batch::all_started`], which stays true for a live batch
    /// as time passes and as it is cut or grown), and stale entries the
    /// rebalance drops when it meets them (dead, another partition's, all
    /// started). Spares the rebalance a visit of every batch index.
    cuttable: Vec<u32>,
}

/// The simulated GPU. See the module docs.
pub struct SimGpu {
    topo: GpuTopology,
    params: SimParams,
    slot_part: Vec<u32>,
    slots: Vec<Option<Hqd>>,
    parts: Vec<Part>,
    wgs: Vec<Wg>,
    free_wgs: Vec<u32>,
    heap: BinaryHeap<Reverse<(Nanos, u64, Timer)>>,
    /// Heap length at which stale timers are dropped from the whole heap
    /// (twice its live length after the last drop): a batch re-armed or
    /// ended leaves its old timer behind, and a run of preemptions can
    /// leave far more stale timers than live ones.
    heap_compact_at: usize,
    seq: u64,
    next_gen: u64,
    now: Nanos,
    pending: Vec<GpuEvent>,
    stats: SimStats,
    rng: SmallRng,
    scratch: Vec<u8>,
    scratch2: Vec<u8>,
    /// Scratch: the counter addresses of a batch of `Mark` workgroups.
    scratch_gpas: Vec<u64>,
    /// The positions (in its partition's slot list) of the active queues'
    /// slots of the partition a dispatch pass runs over, ascending
    /// (`SimGpu::note_active_slots`; read only within that pass).
    active_slots: Vec<u32>,
    /// A guest search's candidate host CUs (`HostLanes::hosts_for`; kept
    /// to reuse its allocation).
    host_words: Vec<u64>,
    /// Per slot position of the partition a dispatch pass's round robin
    /// runs over: the batch a CU given to that queue grows, once noted
    /// in the pass ([`grow::PendingGrow`]; read only within that pass).
    pass_grows: Vec<Option<grow::PendingGrow>>,
    /// The positions of `pass_grows` the last pass wrote (the only ones
    /// that may hold a note).
    pass_grows_set: Vec<u32>,
    /// Test switch: dispatch passes note no pending grow (every CU takes
    /// the general path).
    #[cfg(test)]
    grow_notes_off: bool,
    /// Test count: CUs given by a pending grow.
    #[cfg(test)]
    grows_taken: u64,
    /// Test switch: guest passes run in whole rounds of every active queue
    /// until a round places nothing, and a try that may move a round of
    /// its batch counts the queues that want CUs before searching its
    /// batches (the pass before [`guest_pass`]'s cuts).
    #[cfg(test)]
    guest_pass_rounds: bool,
    /// Test count: guest tries ([`SimGpu::try_guest`] calls).
    #[cfg(test)]
    guest_tries: u64,
    /// Test count: counts of the queues that want CUs
    /// ([`SimGpu::want_count`] calls).
    #[cfg(test)]
    want_counts: std::cell::Cell<u64>,
    event_budget: Option<usize>,
    /// Host CU mask of the map in progress ([`PhysGpu::map_with_cu_mask`]).
    next_map_mask: Option<CuMask>,
    batches: Vec<Batch>,
    free_batches: Vec<u32>,
    /// Batches changed since their timers were armed.
    dirty_batches: Vec<u32>,
    /// Per batch: the identified CUs it holds (`held` of them while live;
    /// a dead batch's list is stale until the index is reused).
    batch_cus: Vec<Vec<u32>>,
    /// CU time of completed workgroups per tag, not yet taken
    /// ([`PhysGpu::take_cu_time`]); bounded by the tags mapped.
    cu_credit: std::collections::HashMap<u64, u64>,
}

type QResult<T> = Result<T, QueueErrorReason>;

impl SimGpu {
    /// A simulated GPU for `topo` with the default [`SimParams`]; `seed`
    /// drives the optional workgroup jitter.
    pub fn new(topo: GpuTopology, seed: u64) -> Result<Self, TopologyError> {
        Self::with_params(topo, SimParams::default(), seed)
    }

    /// A simulated GPU for `topo` with the simulator knobs `params`.
    pub fn with_params(
        topo: GpuTopology,
        params: SimParams,
        seed: u64,
    ) -> Result<Self, TopologyError> {
        topo.validate()?;
        params.validate(&topo)?;
        let slots = topo.user_slots();
        let mut parts: Vec<Part> = (0..topo.partitions())
            .map(|_| Part {
                free_cus: topo.cus_per_partition(),
                free_mask: CuMask::all(topo.cus_per_partition()),
                cu_owner: vec![0; topo.cus_per_partition() as usize],
                slots: Vec::new(),
                rr: 0,
                cu_guest: vec![0; topo.cus_per_partition() as usize],
                cu_fp: vec![Footprint::WHOLE; topo.cus_per_partition() as usize],
                lanes: CuMask::none(topo.cus_per_partition()),
                roomy: CuMask::none(topo.cus_per_partition()),
                hosts: host_lanes::HostLanes::new(topo.cus_per_partition()),
                cu_debt: vec![0; topo.cus_per_partition() as usize],
                guest_rr: 0,
                left: Vec::new(),
                cu_wg: vec![[0; 2]; topo.cus_per_partition() as usize],
                cu_batch: cu_batch::CuBatchIndex::new(topo.cus_per_partition()),
                cuttable: Vec::new(),
            })
            .collect();
        for (i, s) in slots.iter().enumerate() {
            parts[s.partition as usize].slots.push(i as u32);
        }
        Ok(SimGpu {
            slot_part: slots.iter().map(|s| s.partition).collect(),
            slots: slots.iter().map(|_| None).collect(),
            parts,
            topo,
            params,
            wgs: Vec::new(),
            free_wgs: Vec::new(),
            heap: BinaryHeap::new(),
            heap_compact_at: MIN_HEAP_COMPACT,
            seq: 0,
            next_gen: 1,
            now: 0,
            pending: Vec::new(),
            stats: SimStats::default(),
            rng: SmallRng::seed_from_u64(seed),
            scratch: Vec::new(),
            scratch2: Vec::new(),
            scratch_gpas: Vec::new(),
            active_slots: Vec::new(),
            host_words: Vec::new(),
            pass_grows: Vec::new(),
            pass_grows_set: Vec::new(),
            #[cfg(test)]
            grow_notes_off: false,
            #[cfg(test)]
            grows_taken: 0,
            #[cfg(test)]
            guest_pass_rounds: false,
            #[cfg(test)]
            guest_tries: 0,
            #[cfg(test)]
            want_counts: std::cell::Cell::new(0),
            event_budget: None,
            next_map_mask: None,
            batches: Vec::new(),
            free_batches: Vec::new(),
            dirty_batches: Vec::new(),
            batch_cus: Vec::new(),
            cu_credit: std::collections::HashMap::new(),
        })
    }

    /// The simulator knobs.
    pub fn params(&self) -> &SimParams {
        &self.params
    }

    /// Counters.
    pub fn stats(&self) -> &SimStats {
        &self.stats
    }

    /// Current model time.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Free CUs of a partition (for tests and reports).
    pub fn free_cus(&self, partition: u32) -> u32 {
        self.parts.get(partition as usize).map_or(0, |p| p.free_cus)
    }

    fn arm(&mut self, at: Nanos, t: Timer) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, t)));
        if self.heap.len() >= self.heap_compact_at {
            self.drop_stale_timers();
        }
    }

    /// Drops every stale timer from the heap (not only from its top, as
    /// [`Self::purge_stale`]): amortised O(1) per armed timer, as the next
    /// drop waits for the heap to double. A stale timer fires nothing, so
    /// dropping it early changes no run.
    fn drop_stale_timers(&mut self) {
        let mut v = std::mem::take(&mut self.heap).into_vec();
        v.retain(|Reverse((_, _, t))| !self.timer_stale(t));
        self.heap = BinaryHeap::from(v);
        self.heap_compact_at = self.heap.len().saturating_mul(2).max(MIN_HEAP_COMPACT);
    }

    /// Processes internal timers up to `t`. With an event budget (real time)
    /// at most that many per call: if the model is further behind, `now`
    /// stays at the last processed event and the caller's operation applies
    /// at that model time; the next calls catch up.
    fn run_until(&mut self, t: Nanos) {
        let mut budget = self.event_budget.unwrap_or(usize::MAX);
        while let Some(Reverse((at, _, _))) = self.heap.peek() {
            if *at > t {
                break;
            }
            if budget == 0 {
                self.stats.lagging_calls += 1;
                return;
            }
            budget -= 1;
            let Reverse((at, _, timer)) = self.heap.pop().expect("peeked");
            if self.timer_stale(&timer) {
                continue; // a re-armed batch's old timer: no model time passes
            }
            self.now = self.now.max(at);
            let written = self.stats.signals_decremented;
            self.fire(timer);
            if self.stats.signals_decremented != written {
                self.wake_barrier_waiters();
            }
        }
        self.now = self.now.max(t);
    }

    /// Bounds the internal events processed per call (map, unmap, doorbell,
    /// advance) to `budget`; `None` (the default) = unbounded. The real-time
    /// driver's callers set it so that a burst of short workgroups cannot hold
    /// the model's lock (and with it other VMs' register accesses) for long:
    /// the model then lags wall time instead. Virtual time leaves it unbounded.
    pub fn set_event_budget(&mut self, budget: Option<usize>) {
        self.event_budget = budget;
    }

    /// Drops stale timers from the top of the heap, so that
    /// [`PhysGpu::next_deadline`] names a real event.
    fn purge_stale(&mut self) {
        while let Some(Reverse((_, _, t))) = self.heap.peek() {
            if !self.timer_stale(t) {
                break;
            }
            self.heap.pop();
        }
    }

    fn timer_stale(&self, timer: &Timer) -> bool {
        match *timer {
            Timer::BatchDone { idx, gen } | Timer::BatchShrink { idx, gen } => {
                let b = &self.batches[idx as usize];
                !b.live || b.gen != gen
            }
            // A saved or killed workgroup's timer ([`dispatch::retire_wg`]).
            Timer::WgDone { idx, gen } => self.wgs[idx as usize].gen != gen,
            _ => false,
        }
    }

    fn fire(&mut self, timer: Timer) {
        match timer {
            Timer::WgDone { idx, gen } => self.wg_done(idx, gen),
            Timer::RestoreDone { slot, gen } => {
                if let Some(q) = self.slots[slot as usize].as_mut() {
                    if q.gen == gen && q.state == HState::Restoring {
                        q.state = HState::Active;
                        self.pump_and_dispatch(slot);
                    }
                }
            }
            Timer::UnmapDone { slot, gen } => {
                if self.slots[slot as usize]
                    .as_ref()
                    .is_some_and(|q| q.gen == gen)
                {
                    self.finish_unmap(slot);
                }
            }
            Timer::DequeueTimeout { slot, gen } => self.dequeue_timeout(slot, gen),
            Timer::BatchDone { idx, gen } => self.batch_done(idx, gen),
            Timer::BatchShrink { idx, gen } => self.batch_shrink(idx, gen),
            Timer::Poll { slot, gen } => {
                if let Some(q) = self.slots[slot as usize].as_mut() {
                    if q.gen == gen {
                        q.poll_armed = false;
                        if q.state == HState::Active {
                            self.pump_and_dispatch(slot);
                        }
                    }
                }
            }
        }
    }

    /// Counts a queue error and emits its event (the caller has logged it
    /// and put the queue in `HState::Error`).
    fn report_queue_error(&mut self, slot: u32, tag: u64, reason: QueueErrorReason) {
        self.stats.queue_errors += 1;
        self.pending.push(GpuEvent::QueueError {
            slot: SlotId(slot),
            tag,
            reason,
            at: self.now,
        });
    }

    fn fail(&mut self, slot: u32, reason: QueueErrorReason) {
        let p = self.slot_part[slot as usize] as usize;
        let Some(q) = self.slots[slot as usize].as_mut() else {
            return;
        };
        if matches!(q.state, HState::Error(_)) {
            return;
        }
        let was_unmapping = matches!(q.state, HState::Unmapping { .. });
        // Debug only: the caller reports the error to its owner (the
        // arbiter through the VM's rate-limited front-end log, naming the
        // VM), so a guest looping on bad packets cannot flood the host log.
        log::debug!("queue tag {} slot {} error: {}", q.tag, slot, reason);
        // Kill its in-flight workgroups and batches; free every CU the slot
        // holds (theirs, a save's held waves, a batch cut short by an error).
        if q.inflight > 0 {
            for (wi, w) in self.wgs.iter_mut().enumerate() {
                if w.live && w.slot == slot && w.qgen == q.gen {
                    dispatch::retire_wg(w, wi, &mut self.free_wgs);
                }
            }
        }
        for (bi, b) in self.batches.iter_mut().enumerate() {
            if b.live && b.slot == slot && b.qgen == q.gen {
                b.live = false;
                self.free_batches.push(bi as u32);
            }
        }
        q.held_cus = 0;
        let freed = release_cus(&mut self.parts[p], slot, false);
        self.parts[p].free_cus += freed;
        let freed = freed + release_guests(&mut self.parts[p], slot);
        q.inflight = 0;
        q.active.clear();
        q.resume.clear();
        q.state = HState::Error(reason);
        let tag = q.tag;
        // Owners beside its dropped guests run on alone.
        self.unshare_owners(p, self.now);
        self.report_queue_error(slot, tag, reason);
        if was_unmapping {
            // The dequeue completes at once; the queue's state is lost.
            self.finish_unmap(slot);
        } else if freed > 0 {
            self.dispatch(p as u32);
        }
    }
}

impl PhysGpu for SimGpu {
    fn load_check(&self) -> crate::backend::LoadCheck {
        let params = self.params.clone();
        std::sync::Arc::new(move |topo, m, mem| validate_load(topo, &params, m, mem))
    }

    fn topology(&self) -> &GpuTopology {
        &self.topo
    }

    /// Workgroups x their modelled cost (the descriptor's, as
    /// [`SimGpu`] runs them without jitter), credited as they complete.
    fn take_cu_time(&mut self, out: &mut Vec<(u64, u64)>) {
        out.extend(self.cu_credit.drain());
    }

    /// From the kernel descriptor (its modelled workgroup cost and
    /// `vgprs`) and the packet's workgroup size and LDS, as the model
    /// runs it (`sim/occupancy.rs`); `None` when the descriptor is
    /// unreadable or malformed (the dispatch errs when it runs).
    fn dispatch_estimate(
        &self,
        mem: &dyn DmaMemory,
        d: &abi::aql::KernelDispatch,
    ) -> Option<crate::backend::DispatchEstimate> {
        let kd = occupancy::read_descriptor(mem, d.kernel_object)?;
        Some(crate::backend::DispatchEstimate {
            wg_ns: kd.wg_cost_ns,
            half_cu: occupancy::Footprint::of(d.workgroup_items(), kd.vgprs, d.group_segment_size)
                .at_most_half(),
        })
    }

    fn map(&mut self, now: Nanos, req: MapRequest) -> Result<(), GpuError> {
        self.map_queue(now, req)
    }

    fn unmap(&mut self, now: Nanos, slot: SlotId, mode: DequeueMode) -> Result<(), GpuError> {
        self.unmap_queue(now, slot, mode)
    }

    fn unmap_within(
        &mut self,
        now: Nanos,
        slot: SlotId,
        mode: DequeueMode,
        timeout: Option<Nanos>,
    ) -> Result<(), GpuError> {
        self.unmap(now, slot, mode)?;
        let now = self.now;
        if let (Some(t), Some(Some(q))) = (timeout, self.slots.get(slot.0 as usize)) {
            if matches!(q.state, HState::Unmapping { mode: m, .. } if m == mode) {
                let gen = q.gen;
                self.arm(
                    now.saturating_add(t.max(1)),
                    Timer::DequeueTimeout { slot: slot.0, gen },
                );
            }
        }
        Ok(())
    }

    fn doorbell(&mut self, now: Nanos, slot: SlotId, wptr: u64) {
        self.ring_doorbell(now, slot, wptr)
    }

    fn query(&self, slot: SlotId) -> Option<SlotStatus> {
        let q = self.slots.get(slot.0 as usize)?.as_ref()?;
        let state = match q.state {
            HState::Active => SlotState::Active,
            HState::Restoring => SlotState::Restoring,
            HState::Unmapping { mode, .. } => SlotState::Unmapping(mode),
            HState::Error(e) => SlotState::Error(e),
        };
        Some(SlotStatus {
            tag: q.tag,
            state,
            rptr: q.rptr,
            wptr: q.wptr,
            inflight_wgs: q.inflight,
        })
    }

    fn advance(&mut self, now: Nanos, out: &mut Vec<GpuEvent>) {
        out.append(&mut self.pending);
        self.run_until(now);
        self.purge_stale();
        out.append(&mut self.pending);
    }

    fn next_deadline(&self) -> Option<Nanos> {
        if !self.pending.is_empty() {
            return Some(self.now);
        }
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    fn set_cu_mask(&mut self, now: Nanos, slot: SlotId, mask: &CuMask) -> Result<(), GpuError> {
        self.set_host_mask(now, slot, mask)
    }

    fn wgs_outside_mask(&self, slot: SlotId) -> Option<bool> {
        let mask = self.cu_mask(slot)?;
        Some(
            self.running_cus(slot)
                .into_iter()
                .any(|c| !mask.contains(c)),
        )
    }

    fn map_with_cu_mask(
        &mut self,
        now: Nanos,
        req: MapRequest,
        mask: Option<&CuMask>,
    ) -> Result<(), GpuError> {
        let cus = self.topo.cus_per_partition();
        self.next_map_mask = mask
            .filter(|m| m.count() < cus || m.len() < cus)
            .map(|m| m.and(&CuMask::all(cus)));
        let r = self.map(now, req);
        self.next_map_mask = None;
        r
    }
}

impl SimGpu {}

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod preempt_tests;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod cu_batch_tests;
#[cfg(test)]
mod cu_mask_tests;
#[cfg(test)]
mod grow_tests;
#[cfg(test)]
mod guest_pass_tests;
#[cfg(test)]
mod host_lanes_tests;
#[cfg(test)]
mod want_tests;

#[cfg(test)]
mod occupancy_tests;
#[cfg(test)]
mod pack_tests;

#[cfg(test)]
mod review_tests;

/// Workgroup cost of a dispatch (ns): the descriptor's (a `spin`
/// kernel's own), at least the modelled floor.
fn wg_cost(params: &SimParams, d: &Dispatch) -> Nanos {
    let mut cost = d.desc.wg_cost_ns;
    if let Kernarg::Spin { ns } = d.args {
        if ns != 0 {
            cost = ns;
        }
    }
    cost.max(params.wg_floor_ns).max(MIN_WG_NS)
}

/// Adds `ns` of CU time to `tag`'s credit.
fn credit(c: &mut std::collections::HashMap<u64, u64>, tag: u64, ns: u64) {
    let e = c.entry(tag).or_insert(0);
    *e = e.saturating_add(ns);
}
