//! Simulated MI300-class GPU: one discrete-event model, two clocks.
//!
//! [`SimGpu`] is a state machine driven by [`PhysGpu::advance`]: it processes its
//! internal timers (workgroup completions, save/restore completions, barrier
//! polls) in time order up to `now`. Virtual time = the caller jumps `now` to
//! [`PhysGpu::next_deadline`]; real time = [`RealTimeDriver`] calls `advance`
//! with the monotonic clock and sleeps until the next deadline or a kick.
//!
//! See `docs/gpu-model.md` for the model, its constants and their sources.

mod cwsr;
pub mod occupancy;
mod realtime;
pub mod testkit;

pub use cwsr::{SAVE_MAGIC, SAVE_VERSION};
pub use realtime::RealTimeDriver;

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
/// Workgroups at least this long (ns): a CU handed to a running batch starts
/// at once instead of at the batch's next round boundary.
const JOIN_NOW_NS: u64 = 10_000;

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

impl Batch {
    fn len(&self) -> u64 {
        self.end - self.first
    }
    fn rounds(&self) -> u64 {
        self.len().div_ceil(self.width.max(1) as u64)
    }
    /// When its last round ends: its rounds, then the delay guests caused
    /// (`shifted`; which workgroups have started stays as the rounds say).
    fn finish(&self) -> Nanos {
        self.start
            .saturating_add(self.rounds().saturating_mul(self.cost))
            .saturating_add(self.shifted)
    }
    /// Workgroups of the last round.
    fn last_round(&self) -> u64 {
        self.len() - (self.rounds() - 1) * self.width as u64
    }
    /// The first workgroup not started once the round under way at `now`
    /// has launched (at or before `start`: the first round's workgroups).
    fn started_by(&self, now: Nanos) -> u64 {
        if now <= self.start {
            self.first + (self.width as u64).min(self.len())
        } else {
            self.progress(now).1
        }
    }

    /// At `now`: (workgroups finished, first workgroup not started, ns into
    /// the current round). Nothing has started while `now <= start`.
    fn progress(&self, now: Nanos) -> (u64, u64, Nanos) {
        if now <= self.start {
            return (0, self.first, 0);
        }
        let mut el = now - self.start;
        // Guests' delay (`shifted`) stretches the last round: it ends at
        // `finish()`, and its workgroups count as running until then.
        let last = self
            .rounds()
            .saturating_sub(1)
            .saturating_mul(self.cost.max(1));
        if self.shifted > 0 && el > last {
            let span = self.cost.max(1).saturating_add(self.shifted);
            let x = (el - last).min(span);
            el = last + (x as u128 * self.cost.max(1) as u128 / span as u128) as u64;
        }
        let d = el / self.cost.max(1);
        let w = self.width as u64;
        let done = d.saturating_mul(w).min(self.len());
        let started = d.saturating_add(1).saturating_mul(w).min(self.len());
        (done, self.first + started, el % self.cost.max(1))
    }
    /// A CU given to this batch's packet at `now` can join it.
    fn joinable(&self, now: Nanos) -> bool {
        if !self.live {
            return false;
        }
        if now <= self.start {
            self.held == self.width && self.len() > self.width as u64
        } else {
            self.progress(now).1 < self.end
        }
    }
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
    /// Runs beside another queue's workgroup on `cu` (occupancy), sharing
    /// it until `shared_until`.
    guest: bool,
    shared_until: Nanos,
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
    /// Per CU: CU time guests took from the owner's batch on it.
    cu_debt: Vec<Nanos>,
    /// Where the next guest search starts (round robin over CUs).
    guest_rr: usize,
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
    seq: u64,
    next_gen: u64,
    now: Nanos,
    pending: Vec<GpuEvent>,
    stats: SimStats,
    rng: SmallRng,
    scratch: Vec<u8>,
    scratch2: Vec<u8>,
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
                cu_debt: vec![0; topo.cus_per_partition() as usize],
                guest_rr: 0,
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
            seq: 0,
            next_gen: 1,
            now: 0,
            pending: Vec::new(),
            stats: SimStats::default(),
            rng: SmallRng::seed_from_u64(seed),
            scratch: Vec::new(),
            scratch2: Vec::new(),
            event_budget: None,
            next_map_mask: None,
            batches: Vec::new(),
            free_batches: Vec::new(),
            dirty_batches: Vec::new(),
            batch_cus: Vec::new(),
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
                        self.pump(slot);
                        let p = self.slot_part[slot as usize];
                        self.dispatch(p);
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
                            self.pump(slot);
                            let p = self.slot_part[slot as usize];
                            self.dispatch(p);
                        }
                    }
                }
            }
        }
    }

    // ---------------------------------------------------------------- errors

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
            for w in self.wgs.iter_mut() {
                if w.live && w.slot == slot && w.qgen == q.gen {
                    w.live = false;
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
        self.report_queue_error(slot, tag, reason);
        if was_unmapping {
            // The dequeue completes at once; the queue's state is lost.
            self.finish_unmap(slot);
        } else if freed > 0 {
            self.dispatch(p as u32);
        }
    }

    // ---------------------------------------------------------------- CP

    /// Fetch and launch packets of an active queue; resolve barrier packets.
    fn pump(&mut self, slot: u32) {
        if let Err(e) = self.pump_inner(slot) {
            self.fail(slot, e);
        }
    }

    fn pump_inner(&mut self, slot: u32) -> QResult<()> {
        let max_active = self.params.max_active_packets as usize;
        let poll_ns = self.params.barrier_poll_ns;
        let now = self.now;
        let mut need_poll = false;
        {
            let q = self.slots[slot as usize]
                .as_mut()
                .expect("pump on empty slot");
            if q.state != HState::Active {
                return Ok(());
            }
            loop {
                // Resolve barrier packets at the tail of the window.
                let mut i = 0;
                while i < q.active.len() {
                    let a = &q.active[i];
                    if !a.complete {
                        if let Work::And(b) | Work::Or(b) = a.work {
                            let is_and = matches!(a.work, Work::And(_));
                            if barrier_satisfied(&*q.mem, &b, is_and)? {
                                q.stall_polls = 0;
                                complete_packet(
                                    q,
                                    i,
                                    now,
                                    &mut self.pending,
                                    &mut self.stats,
                                    SlotId(slot),
                                )?;
                            } else {
                                need_poll = true;
                            }
                        }
                    }
                    i += 1;
                }
                retire(q, SlotId(slot))?;
                if q.active.len() >= max_active || q.fetch() == q.wptr {
                    break;
                }
                // A pending barrier packet blocks further launches.
                if q.active
                    .iter()
                    .any(|a| !a.complete && matches!(a.work, Work::And(_) | Work::Or(_)))
                {
                    break;
                }
                let idx = q.fetch();
                let addr = q.mqd.packet_addr(idx);
                let mut raw = [0u8; aql::PACKET_SIZE];
                q.mem
                    .read(addr, &mut raw)
                    .map_err(|_| QueueErrorReason::RingOutOfRange { addr })?;
                let pkt = Packet::decode(&raw);
                if pkt.body == Body::Invalid {
                    // Not published yet: the packet processor waits on the header.
                    need_poll = true;
                    q.blocked = true;
                    break;
                }
                q.blocked = false;
                q.stall_polls = 0;
                if pkt.header.barrier && q.active.iter().any(|a| !a.complete) {
                    break; // re-pumped when earlier packets complete
                }
                let act = decode_work(&*q.mem, idx, &pkt)?;
                q.active.push_back(act);
            }
        }
        {
            let q = self.slots[slot as usize].as_mut().expect("slot");
            q.barrier_blocked = q.barrier_pending();
        }
        if need_poll {
            let q = self.slots[slot as usize].as_mut().expect("slot");
            if !q.poll_armed {
                q.poll_armed = true;
                let gen = q.gen;
                // A blocked queue (waiting only on an unpublished header or
                // an unmet barrier) re-reads with a backoff (2^n x
                // barrier_poll_ns, at most 512x): watching it costs the
                // host little however long it blocks; a doorbell, or a
                // completion of another queue that writes a signal,
                // re-reads at once.
                let mut ns = poll_ns;
                if !q.has_work() {
                    ns = poll_ns.saturating_mul(1 << q.stall_polls.min(BLOCKED_POLL_MAX_SHIFT));
                    q.stall_polls = q.stall_polls.saturating_add(1);
                    self.stats.blocked_polls += 1;
                }
                self.arm(now.saturating_add(ns), Timer::Poll { slot, gen });
            }
        }
        self.check_idle(slot);
        Ok(())
    }

    /// A completion wrote a signal: re-check at once every active queue
    /// waiting on a barrier (its dependency may be that signal) instead of
    /// at its backed-off poll. Barriers completed here write signals too:
    /// repeat while they do (each round completes at least one packet).
    fn wake_barrier_waiters(&mut self) {
        for _ in 0..64 {
            let written = self.stats.signals_decremented;
            for slot in 0..self.slots.len() as u32 {
                let waiting = self.slots[slot as usize]
                    .as_ref()
                    .is_some_and(|q| q.state == HState::Active && q.barrier_pending());
                if waiting {
                    self.stats.barrier_wakes += 1;
                    self.pump(slot);
                    let p = self.slot_part[slot as usize];
                    self.dispatch(p);
                }
            }
            if self.stats.signals_decremented == written {
                break;
            }
        }
    }

    fn check_idle(&mut self, slot: u32) {
        let now = self.now;
        if let Some(q) = self.slots[slot as usize].as_mut() {
            if q.state == HState::Active && q.has_work() {
                q.idle_reported = false;
            } else if q.state == HState::Active && !q.has_work() && !q.idle_reported {
                q.idle_reported = true;
                self.pending.push(GpuEvent::QueueIdle {
                    slot: SlotId(slot),
                    tag: q.tag,
                    at: now,
                });
            }
        }
    }

    /// Hand free CUs of partition `p` to active queues, round robin, priority blind.
    fn dispatch(&mut self, p: u32) {
        let pi = p as usize;
        let n = self.parts[pi].slots.len();
        debug_assert_eq!(
            self.parts[pi].free_cus,
            self.parts[pi].free_mask.count(),
            "free CU count and free CU set disagree"
        );
        while self.parts[pi].free_cus > 0 {
            let mut chosen = None;
            for k in 0..n {
                let pos = (self.parts[pi].rr + k) % n;
                let s = self.parts[pi].slots[pos];
                if let Some(q) = self.slots[s as usize].as_ref() {
                    if q.state == HState::Active
                        && self.dispatchable(q).is_some()
                        && q.mask
                            .as_ref()
                            .is_none_or(|m| m.first_in(&self.parts[pi].free_mask).is_some())
                    {
                        chosen = Some((pos, s));
                        break;
                    }
                }
            }
            let Some((pos, s)) = chosen else { break };
            self.parts[pi].rr = (pos + 1) % n;
            self.start_one(s);
        }
        self.place_guests(p);
        if self.parts[pi].free_cus == 0 {
            self.rebalance(p);
        }
        self.flush_batches();
    }

    /// Occupancy: a queue with a workgroup to launch and no free CU in its
    /// mask puts it beside another queue's workgroup, on a CU of its mask
    /// where both fit ([`Footprint::fits_with`]; at most one guest per CU),
    /// round robin over the slots. A queue's own further workgroups wait
    /// for its own CUs (its kernels run in lock-step rounds, one workgroup
    /// per CU), so a lone kernel runs as before.
    fn place_guests(&mut self, p: u32) {
        let pi = p as usize;
        let n = self.parts[pi].slots.len();
        loop {
            let mut placed = false;
            for k in 0..n {
                let pos = (self.parts[pi].rr + k) % n;
                let s = self.parts[pi].slots[pos];
                if self.try_guest(s) {
                    placed = true;
                }
            }
            if !placed {
                break;
            }
        }
    }

    /// Launches one workgroup of `slot` as a guest if it has one to launch,
    /// no free CU in its mask, and a CU of its mask has room beside its
    /// owner's workgroup. The two share the CU at half rate each
    /// ([`occupancy::share`]): the owner's workgroup (a batch: its
    /// lock-step rounds) is delayed by the CU time the guest takes from it.
    fn try_guest(&mut self, slot: u32) -> bool {
        let now = self.now;
        let p = self.slot_part[slot as usize] as usize;
        let Some(q) = self.slots[slot as usize].as_ref() else {
            return false;
        };
        if q.state != HState::Active {
            return false;
        }
        let part = &self.parts[p];
        let has_free = match q.mask.as_ref() {
            Some(m) => m.first_in(&part.free_mask).is_some(),
            None => part.free_cus > 0,
        };
        if has_free {
            return false;
        }
        // What it would launch next: a saved workgroup, else the next one
        // of the first packet that has one (as `start_one`).
        let (id, fp, cost) = if let Some(sw) = q.resume.front() {
            (sw.id, packet_fp(q, sw.id), sw.remaining)
        } else {
            let Some(a) = q
                .active
                .iter()
                .find(|a| matches!(a.work, Work::Dispatch(d) if a.next_wg < d.total))
            else {
                return false;
            };
            let Work::Dispatch(d) = a.work else {
                return false;
            };
            (a.id, d.fp, self.wg_cost(&d))
        };
        if fp == Footprint::WHOLE {
            return false;
        }
        let mut host = None;
        let ncu = part.cu_owner.len();
        for k in 0..ncu {
            // Round robin over CUs, as the dispatcher spreads workgroups.
            let cu = (part.guest_rr + k) % ncu;
            let owner = part.cu_owner[cu];
            if owner == 0
                || owner == slot + 1
                || part.cu_guest[cu] != 0
                || !part.cu_fp[cu].fits_with(fp)
                || q.mask.as_ref().is_some_and(|m| !m.contains(cu as u32))
            {
                continue;
            }
            // The owner's running workgroup on it (none: its waves are
            // being saved, the CU is not running).
            let hs = owner - 1;
            let b = (0..self.batches.len()).find(|&bi| {
                let b = &self.batches[bi];
                b.live && b.slot == hs && self.batch_cus[bi].contains(&(cu as u32))
            });
            if let Some(bi) = b {
                host = Some((cu as u32, Ok(bi as u32)));
                break;
            }
            let w = self
                .wgs
                .iter()
                .position(|w| w.live && !w.guest && w.slot == hs && w.cu == cu as u32);
            if let Some(wi) = w {
                host = Some((cu as u32, Err(wi as u32)));
                break;
            }
        }
        let Some((cu, h)) = host else {
            return false;
        };
        let (delay, wall) = match h {
            Ok(bi) => {
                // The batch's rounds end as late as its most delayed CU.
                let b = &mut self.batches[bi as usize];
                let (d, wall) = occupancy::share(cost, b.finish().saturating_sub(now));
                let debt = &mut self.parts[p].cu_debt[cu as usize];
                *debt = debt.saturating_add(d);
                if *debt > b.shifted {
                    b.shifted = *debt;
                    self.touch_batch(bi);
                }
                (d, wall)
            }
            Err(wi) => {
                let w = &mut self.wgs[wi as usize];
                let (d, wall) = occupancy::share(cost, w.end.saturating_sub(now));
                if d > 0 {
                    w.end = w.end.saturating_add(d);
                    w.gen = w.gen.wrapping_add(1);
                    let (end, gen) = (w.end, w.gen);
                    self.arm(end, Timer::WgDone { idx: wi, gen });
                }
                (d, wall)
            }
        };
        let q = self.slots[slot as usize].as_mut().expect("slot");
        let wg = if q.resume.front().is_some_and(|sw| sw.id == id) {
            let sw = q.resume.pop_front().expect("front");
            sw.wg
        } else {
            let Some(a) = q.active.iter_mut().find(|a| a.id == id) else {
                return false;
            };
            let wg = a.next_wg;
            a.next_wg += 1;
            wg
        };
        if let Some(a) = q.active.iter_mut().find(|a| a.id == id) {
            a.inflight += 1;
        }
        q.inflight += 1;
        let qgen = q.gen;
        self.parts[p].cu_guest[cu as usize] = slot + 1;
        self.parts[p].guest_rr = (cu as usize + 1) % self.parts[p].cu_guest.len();
        self.stats.coresident_wgs += 1;
        self.push_wg(Wg {
            slot,
            cu,
            qgen,
            id,
            wg,
            end: now.saturating_add(wall),
            gen: 0,
            live: true,
            guest: true,
            shared_until: now.saturating_add(delay.saturating_mul(2)),
        });
        true
    }

    /// CU round robin across batches: when a queue that wants CUs holds
    /// fewer than an equal split of the partition, the batches of queues
    /// holding more stop at the end of their current round, whose CUs the
    /// round robin then hands out again (as freed workgroups' CUs are).
    fn rebalance(&mut self, p: u32) {
        let pi = p as usize;
        let mut want = 0u32;
        let mut min_held = u32::MAX;
        for &s in &self.parts[pi].slots {
            if let Some(q) = self.slots[s as usize].as_ref() {
                if q.state == HState::Active && self.dispatchable(q).is_some() {
                    want += 1;
                    min_held = min_held.min(q.inflight);
                }
            }
        }
        if want < 2 && min_held > 0 {
            return;
        }
        let share = self.topo.cus_per_partition() / want.max(1);
        if min_held >= share {
            return;
        }
        let now = self.now;
        for bi in 0..self.batches.len() as u32 {
            let b = self.batches[bi as usize];
            if !b.live || self.slot_part[b.slot as usize] != p {
                continue;
            }
            let Some(q) = self.slots[b.slot as usize].as_mut() else {
                continue;
            };
            if q.inflight <= share || q.gen != b.qgen {
                continue;
            }
            // A batch that starts now runs one round; one that starts later
            // (the rest of a cut batch) is left alone: its predecessor's CUs
            // are about to be handed out anyway.
            if now < b.start {
                continue;
            }
            let started = b.started_by(now);
            if started >= b.end {
                continue;
            }
            if let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) {
                a.next_wg = a.next_wg.min(started);
            }
            self.batches[bi as usize].end = started;
            self.touch_batch(bi);
        }
    }

    /// What a free CU given to queue `q` would run: `Some(None)` a saved
    /// workgroup, `Some(Some(i))` packet `i` of the window, `None` nothing.
    fn dispatchable(&self, q: &Hqd) -> Option<Option<usize>> {
        if !q.resume.is_empty() {
            return Some(None);
        }
        let now = self.now;
        q.active
            .iter()
            .position(|a| match a.work {
                Work::Dispatch(d) => {
                    a.next_wg < d.total
                        || a.batch
                            .is_some_and(|i| self.batches[i as usize].joinable(now))
                }
                _ => false,
            })
            .map(Some)
    }

    /// Workgroup cost of a dispatch (ns): the descriptor's (a `spin`
    /// kernel's own), at least the modelled floor.
    fn wg_cost(&self, d: &Dispatch) -> Nanos {
        let mut cost = d.desc.wg_cost_ns;
        if let Kernarg::Spin { ns } = d.args {
            if ns != 0 {
                cost = ns;
            }
        }
        cost.max(self.params.wg_floor_ns).max(MIN_WG_NS)
    }

    /// Marks batch `idx` changed: its timers are re-armed by `flush_batches`
    /// (a batch grown by many CUs in one dispatch pass is armed once).
    fn touch_batch(&mut self, idx: u32) {
        let b = &mut self.batches[idx as usize];
        b.gen = b.gen.wrapping_add(1); // stale timers now miss
        if b.armed {
            b.armed = false;
            self.dirty_batches.push(idx);
        }
    }

    fn flush_batches(&mut self) {
        while let Some(idx) = self.dirty_batches.pop() {
            let b = self.batches[idx as usize];
            if !b.live || b.armed {
                continue;
            }
            self.batches[idx as usize].armed = true;
            self.arm(b.finish(), Timer::BatchDone { idx, gen: b.gen });
            if b.last_round() < b.held as u64 {
                let at = b
                    .start
                    .saturating_add((b.rounds() - 1).saturating_mul(b.cost));
                self.arm(at, Timer::BatchShrink { idx, gen: b.gen });
            }
        }
    }

    fn new_batch(&mut self, b: Batch) -> u32 {
        let idx = if let Some(i) = self.free_batches.pop() {
            let gen = self.batches[i as usize].gen;
            self.batches[i as usize] = Batch { gen, ..b };
            self.batch_cus[i as usize].clear();
            i
        } else {
            self.batches.push(b);
            self.batch_cus.push(Vec::new());
            (self.batches.len() - 1) as u32
        };
        self.touch_batch(idx);
        idx
    }

    /// Takes a free CU of `slot`'s partition inside the queue's effective
    /// mask for it (`dispatch` chose the queue because one exists).
    fn take_cu(&mut self, slot: u32, fp: Footprint) -> u32 {
        let p = self.slot_part[slot as usize] as usize;
        let part = &mut self.parts[p];
        let q = self.slots[slot as usize].as_ref().expect("slot");
        let cu = match q.mask.as_ref() {
            Some(m) => m.first_in(&part.free_mask),
            None => part.free_mask.first_in(&part.free_mask),
        }
        .expect("dispatch chose a queue with a free CU in its mask");
        part.free_mask.remove(cu);
        part.cu_owner[cu as usize] = slot + 1;
        part.cu_fp[cu as usize] = fp;
        part.cu_debt[cu as usize] = 0;
        cu
    }

    /// Frees `n` of the identified CUs batch `idx` holds (any `n`: its
    /// workgroups run in lock-step, so which CUs go back does not matter).
    /// Returns how many are free now (not those with a guest on them).
    fn release_batch_cus(&mut self, idx: u32, n: u32) -> u32 {
        let p = self.slot_part[self.batches[idx as usize].slot as usize] as usize;
        let cus = &mut self.batch_cus[idx as usize];
        let mut freed = 0;
        for _ in 0..n {
            if let Some(cu) = cus.pop() {
                if release_cu(&mut self.parts[p], cu) {
                    freed += 1;
                }
            }
        }
        freed
    }

    /// Gives one free CU to packet `i` of `slot` as part of a batch: starts
    /// one, grows one that has not started, or cuts a running one at the end
    /// of its current round and starts the rest then with this CU.
    fn start_batched(&mut self, slot: u32, i: usize) {
        let is_dispatch = self.slots[slot as usize]
            .as_ref()
            .and_then(|q| q.active.get(i))
            .is_some_and(|a| matches!(a.work, Work::Dispatch(_)));
        let Some(fp) = self.slots[slot as usize]
            .as_ref()
            .and_then(|q| q.active.get(i))
            .and_then(|a| match a.work {
                Work::Dispatch(d) => Some(d.fp),
                _ => None,
            })
        else {
            return;
        };
        if !is_dispatch {
            return;
        }
        let cu = self.take_cu(slot, fp);
        let now = self.now;
        let p = self.slot_part[slot as usize] as usize;
        let q = self.slots[slot as usize].as_mut().expect("slot");
        let qgen = q.gen;
        let a = &mut q.active[i];
        let Work::Dispatch(d) = a.work else { return };
        let id = a.id;
        let tail = a.batch.filter(|&b| self.batches[b as usize].joinable(now));
        let created = match tail {
            None => {
                let first = a.next_wg;
                a.next_wg = d.total;
                Some(Batch {
                    slot,
                    qgen,
                    id,
                    first,
                    end: d.total,
                    width: 1,
                    held: 1,
                    start: now,
                    cost: 0, // set below
                    gen: 0,
                    live: true,
                    armed: true,
                    shifted: 0,
                })
            }
            Some(bi) => {
                let b = &mut self.batches[bi as usize];
                if now <= b.start && b.held == b.width {
                    b.width += 1;
                    b.held += 1;
                    None
                } else {
                    let (_, started, into) = b.progress(now);
                    // Long workgroups: the CU starts at once (the batches
                    // then run out of phase: at most two events per round).
                    // Short ones: it waits for the round end (phases stay
                    // aligned, one event per join).
                    let round_end = if b.cost >= JOIN_NOW_NS {
                        now
                    } else {
                        now.saturating_add(b.cost - into)
                    };
                    let old_end = b.end;
                    b.end = started;
                    let cost = b.cost;
                    Some(Batch {
                        slot,
                        qgen,
                        id,
                        first: started,
                        end: old_end,
                        width: 1,
                        held: 1,
                        start: round_end,
                        cost,
                        gen: 0,
                        live: true,
                        armed: true,
                        shifted: 0,
                    })
                }
            }
        };
        a.inflight += 1;
        q.inflight += 1;
        self.parts[p].free_cus -= 1;
        if let Some(bi) = tail {
            self.touch_batch(bi);
        }
        let holder = if let Some(mut b) = created {
            if b.cost == 0 {
                b.cost = self.wg_cost(&d);
            }
            let idx = self.new_batch(b);
            let q = self.slots[slot as usize].as_mut().expect("slot");
            q.active[i].batch = Some(idx);
            idx
        } else {
            tail.expect("a batch grown without a tail")
        };
        self.batch_cus[holder as usize].push(cu);
    }

    /// Workgroups of a batch with a memory effect (those past the kernel's
    /// elements touch nothing): the host applies effects in O(elements).
    fn effect_wgs(d: &Dispatch) -> u64 {
        let per = d.items_per_wg.max(1);
        match d.args {
            Kernarg::Mark { n, .. } => n as u64,
            Kernarg::Spin { .. } => 0,
            Kernarg::Fill { n, .. }
            | Kernarg::VecAdd { n, .. }
            | Kernarg::Saxpy { n, .. }
            | Kernarg::Checksum { n, .. } => (n as u64).div_ceil(per),
        }
    }

    /// Applies the effects of workgroups `from..to` of packet `id` of `slot`
    /// and counts them done.
    fn batch_effects(&mut self, slot: u32, id: u64, from: u64, to: u64) -> QResult<()> {
        let q = self.slots[slot as usize].as_mut().expect("batch slot");
        let Some(a) = q.active.iter_mut().find(|a| a.id == id) else {
            return Err(QueueErrorReason::BadSavedState("batch of unknown packet"));
        };
        let Work::Dispatch(d) = a.work else {
            return Err(QueueErrorReason::BadSavedState(
                "batch of non-dispatch packet",
            ));
        };
        a.done_wgs += to - from;
        self.stats.wgs_completed += to - from;
        let lim = Self::effect_wgs(&d).min(to);
        for wg in from..lim {
            apply_effect(&*q.mem, &d, wg, &mut self.scratch, &mut self.scratch2)?;
        }
        Ok(())
    }

    fn batch_done(&mut self, idx: u32, gen: u32) {
        let b = self.batches[idx as usize];
        if b.gen != gen || !b.live {
            return;
        }
        self.batches[idx as usize].live = false;
        self.free_batches.push(idx);
        let slot = b.slot;
        let p = self.slot_part[slot as usize];
        let freed = self.release_batch_cus(idx, b.held);
        self.parts[p as usize].free_cus += freed;
        let res = (|| {
            let q = self.slots[slot as usize]
                .as_mut()
                .filter(|q| q.gen == b.qgen)
                .ok_or(QueueErrorReason::BadSavedState("batch of a gone queue"))?;
            q.inflight -= b.held;
            if let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) {
                a.inflight -= b.held;
                if a.batch == Some(idx) {
                    a.batch = None;
                }
            }
            self.batch_effects(slot, b.id, b.first, b.end)?;
            let now = self.now;
            let q = self.slots[slot as usize].as_mut().expect("slot");
            if let Some(i) = q.active.iter().position(|a| a.id == b.id) {
                let a = &q.active[i];
                if let Work::Dispatch(d) = a.work {
                    if a.done_wgs == d.total && a.next_wg == d.total {
                        complete_packet(
                            q,
                            i,
                            now,
                            &mut self.pending,
                            &mut self.stats,
                            SlotId(slot),
                        )?;
                        retire(q, SlotId(slot))?;
                    }
                }
            }
            Ok(())
        })();
        if let Err(e) = res {
            self.fail(slot, e);
        }
        self.after_release(slot, p);
    }

    /// After CUs of `slot` came back: finish a drain, refetch, hand CUs out.
    fn after_release(&mut self, slot: u32, p: u32) {
        let drain_done = self.slots[slot as usize].as_ref().is_some_and(|q| {
            matches!(
                q.state,
                HState::Unmapping {
                    mode: DequeueMode::DrainPipe,
                    ..
                }
            ) && q.inflight == 0
        });
        let save_ready = self.slots[slot as usize]
            .as_ref()
            .is_some_and(|q| q.save_waiting && q.inflight == 0);
        if drain_done {
            self.finish_unmap(slot);
        } else if save_ready {
            self.arm_save_done(slot);
        } else if self.slots[slot as usize]
            .as_ref()
            .is_some_and(|q| q.state == HState::Active)
        {
            self.pump(slot);
        }
        self.dispatch(p);
    }

    /// The last round of a batch starts: its unused CUs go back.
    fn batch_shrink(&mut self, idx: u32, gen: u32) {
        let b = self.batches[idx as usize];
        if b.gen != gen || !b.live {
            return;
        }
        let keep = b.last_round().min(b.held as u64) as u32;
        let r = b.held - keep;
        if r == 0 {
            return;
        }
        self.batches[idx as usize].held = keep;
        let p = self.slot_part[b.slot as usize];
        let freed = self.release_batch_cus(idx, r);
        self.parts[p as usize].free_cus += freed;
        if let Some(q) = self.slots[b.slot as usize].as_mut() {
            q.inflight -= r;
            if let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) {
                a.inflight -= r;
            }
        }
        self.dispatch(p);
    }

    /// For each of `batches` (of `slot`'s queue): whether it ends where its
    /// packet's handed-out workgroups end (`next_wg`), i.e. whether its
    /// unstarted workgroups may go back to the packet.
    fn tail_flags(&self, slot: u32, batches: &[u32]) -> Vec<bool> {
        let q = self.slots[slot as usize].as_ref().expect("slot");
        batches
            .iter()
            .map(|&bi| {
                let b = &self.batches[bi as usize];
                q.active
                    .iter()
                    .find(|a| a.id == b.id)
                    .is_none_or(|a| b.end >= a.next_wg)
            })
            .collect()
    }

    /// Live batches of the queue in `slot`.
    fn slot_batches(&self, slot: u32, qgen: u64) -> Vec<u32> {
        (0..self.batches.len() as u32)
            .filter(|&i| {
                let b = &self.batches[i as usize];
                b.live && b.slot == slot && b.qgen == qgen
            })
            .collect()
    }

    fn start_one(&mut self, slot: u32) {
        let jitter = self.params.jitter_permille as u64;
        if jitter == 0 {
            let q = self.slots[slot as usize].as_ref().expect("slot");
            if let Some(Some(i)) = self.dispatchable(q) {
                // Waves without a save point keep running through a save
                // (the save waits for them): they run one by one.
                let preemptible = !matches!(
                    q.active[i].work,
                    Work::Dispatch(d) if !d.desc.preemptible()
                );
                if preemptible {
                    self.start_batched(slot, i);
                    return;
                }
            }
        }
        let floor = self.params.wg_floor_ns;
        let now = self.now;
        let p = self.slot_part[slot as usize] as usize;
        let q = self.slots[slot as usize].as_mut().expect("slot");
        let (id, wg, dur) = if let Some(sw) = q.resume.pop_front() {
            let Some(a) = q.active.iter_mut().find(|a| a.id == sw.id) else {
                return; // validated on restore; unreachable
            };
            a.inflight += 1;
            (sw.id, sw.wg, sw.remaining)
        } else {
            let Some(a) = q
                .active
                .iter_mut()
                .find(|a| matches!(a.work, Work::Dispatch(d) if a.next_wg < d.total))
            else {
                return;
            };
            let Work::Dispatch(d) = a.work else { return };
            let wg = a.next_wg;
            a.next_wg += 1;
            a.inflight += 1;
            let mut cost = d.desc.wg_cost_ns;
            if let Kernarg::Spin { ns } = d.args {
                if ns != 0 {
                    cost = ns;
                }
            }
            cost = cost.max(floor);
            if jitter > 0 && cost > 0 {
                let extra = self.rng.gen_range(0..=cost.saturating_mul(jitter) / 1000);
                cost = cost.saturating_add(extra);
            }
            (a.id, wg, cost.max(MIN_WG_NS))
        };
        q.inflight += 1;
        let qgen = q.gen;
        let part = &mut self.parts[p];
        let cu = match q.mask.as_ref() {
            Some(m) => m.first_in(&part.free_mask),
            None => part.free_mask.first_in(&part.free_mask),
        }
        .expect("dispatch chose a queue with a free CU in its mask");
        part.free_mask.remove(cu);
        part.cu_owner[cu as usize] = slot + 1;
        part.cu_fp[cu as usize] = packet_fp(q, id);
        self.parts[p].free_cus -= 1;
        let end = now.saturating_add(dur);
        self.push_wg(Wg {
            slot,
            cu,
            qgen,
            id,
            wg,
            end,
            gen: 0,
            live: true,
            guest: false,
            shared_until: 0,
        });
    }

    /// Registers a started workgroup and arms its completion.
    fn push_wg(&mut self, w: Wg) {
        let end = w.end;
        let idx = if let Some(i) = self.free_wgs.pop() {
            let gen = self.wgs[i as usize].gen.wrapping_add(1);
            self.wgs[i as usize] = Wg { gen, ..w };
            i
        } else {
            self.wgs.push(w);
            (self.wgs.len() - 1) as u32
        };
        let gen = self.wgs[idx as usize].gen;
        self.arm(end, Timer::WgDone { idx, gen });
    }

    fn wg_done(&mut self, idx: u32, gen: u32) {
        let w = &self.wgs[idx as usize];
        if w.gen != gen {
            return;
        }
        let live = w.live;
        let (slot, id, wg, cu) = (w.slot, w.id, w.wg, w.cu);
        self.free_wgs.push(idx);
        self.wgs[idx as usize].live = false;
        if !live {
            return; // killed or saved; its CU was accounted for elsewhere
        }
        let p = self.slot_part[slot as usize];
        let part = &mut self.parts[p as usize];
        if self.wgs[idx as usize].guest {
            release_guest(part, cu, slot);
        } else if release_cu(part, cu) {
            part.free_cus += 1;
        }
        let res = self.complete_wg(slot, id, wg);
        if let Err(e) = res {
            self.fail(slot, e);
        }
        self.after_release(slot, p);
    }

    fn complete_wg(&mut self, slot: u32, id: u64, wg: u64) -> QResult<()> {
        let now = self.now;
        let q = self.slots[slot as usize]
            .as_mut()
            .expect("wg of empty slot");
        let Some(i) = q.active.iter().position(|a| a.id == id) else {
            return Err(QueueErrorReason::BadSavedState(
                "workgroup of unknown packet",
            ));
        };
        q.inflight -= 1;
        let a = &mut q.active[i];
        a.inflight -= 1;
        a.done_wgs += 1;
        let Work::Dispatch(d) = a.work else {
            return Err(QueueErrorReason::BadSavedState(
                "workgroup of non-dispatch packet",
            ));
        };
        apply_effect(&*q.mem, &d, wg, &mut self.scratch, &mut self.scratch2)?;
        self.stats.wgs_completed += 1;
        if a.done_wgs == d.total && a.next_wg == d.total {
            complete_packet(q, i, now, &mut self.pending, &mut self.stats, SlotId(slot))?;
            retire(q, SlotId(slot))?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------- unmap

    /// SaveWaves: all in-flight waves are saved (or, without a save point,
    /// finished): write the CWSR records and finish after the modelled
    /// save latency.
    fn arm_save_done(&mut self, s: u32) {
        let now = self.now;
        let Some(q) = self.slots[s as usize].as_mut() else {
            return;
        };
        q.save_waiting = false;
        // Every saved workgroup's waves are written, guests' too.
        let (n, gen) = (q.held_cus + std::mem::take(&mut q.saved_guests), q.gen);
        // Sized now, written when the dequeue finishes (`finish_unmap`).
        let bytes = cwsr::save_bytes(q);
        let xccs = self.topo.xccs_per_partition() as u64;
        let busiest = (n as u64).div_ceil(xccs);
        let c = &self.topo.cwsr;
        // Each saved workgroup writes its share of a CU's state (occupancy);
        // the busiest XCC saves ceil(n / XCCs) of the largest.
        let per_wg = saved_state_bytes(q, n as usize, c.wg_state_bytes);
        let live = bytes.saturating_add(busiest.saturating_mul(per_wg));
        let save_ns = c
            .trap_ns
            .saturating_add(live.saturating_mul(1000) / c.save_bytes_per_us);
        self.stats.save_ns_total = self.stats.save_ns_total.saturating_add(save_ns);
        self.arm(
            now.saturating_add(save_ns),
            Timer::UnmapDone { slot: s, gen },
        );
    }

    /// The timeout of a dequeue requested with [`PhysGpu::unmap_within`]
    /// came: if it has not finished (and is not already a reset), report it.
    fn dequeue_timeout(&mut self, slot: u32, gen: u64) {
        let now = self.now;
        let Some(q) = self.slots[slot as usize].as_ref() else {
            return;
        };
        if q.gen != gen {
            return;
        }
        if let HState::Unmapping { mode, since } = q.state {
            if mode != DequeueMode::ResetWaves {
                self.stats.dequeue_timeouts += 1;
                log::debug!(
                    "queue tag {} slot {slot}: {mode:?} dequeue not finished after {} ns",
                    q.tag,
                    now.saturating_sub(since)
                );
                self.pending.push(GpuEvent::DequeueTimedOut {
                    slot: SlotId(slot),
                    tag: q.tag,
                    mode,
                    waited_ns: now.saturating_sub(since),
                    at: now,
                });
            }
        }
    }

    /// DrainPipe: batches stop at the end of their current round (one not
    /// started gives its CUs back); the rest goes back to the packet.
    ///
    /// A batch below workgroups handed out after it (not its packet's tail)
    /// runs to its end: its workgroups cannot go back to the packet.
    fn drain_batches(&mut self, slot: u32, qgen: u64) {
        let now = self.now;
        let p = self.slot_part[slot as usize] as usize;
        let batches = self.slot_batches(slot, qgen);
        let tails = self.tail_flags(slot, &batches);
        for (bi, tail) in batches.into_iter().zip(tails) {
            if !tail {
                continue;
            }
            let b = self.batches[bi as usize];
            let (_, started, _) = b.progress(now);
            let q = self.slots[slot as usize].as_mut().expect("slot");
            let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) else {
                continue;
            };
            if started < b.end {
                a.next_wg = a.next_wg.min(started);
            }
            if now <= b.start {
                a.inflight -= b.held;
                if a.batch == Some(bi) {
                    a.batch = None;
                }
                q.inflight -= b.held;
                let freed = self.release_batch_cus(bi, b.held);
                self.parts[p].free_cus += freed;
                self.batches[bi as usize].live = false;
                self.free_batches.push(bi);
            } else if started < b.end {
                self.batches[bi as usize].end = started;
                self.touch_batch(bi);
            }
        }
        self.flush_batches();
    }

    /// SaveWaves: finished rounds apply their effects; the current round's
    /// workgroups become saved waves (returned); unstarted workgroups go back
    /// to the packet; CUs not running a saved wave are freed at once.
    ///
    /// Unstarted workgroups go back to the packet (its `next_wg` lowered)
    /// only from the packet's tail batch: a batch below workgroups handed
    /// out after it (the first round of a batch cut at its start instant,
    /// followed by a guest's workgroup and a later batch) saves them as
    /// waves that have not run yet (`remaining` = a whole workgroup), or
    /// the restore would find a saved wave at or past `next_wg`.
    fn save_batches(&mut self, slot: u32, qgen: u64) -> QResult<Vec<SavedWg>> {
        let now = self.now;
        let p = self.slot_part[slot as usize] as usize;
        let mut saved = Vec::new();
        let mut freed = 0;
        let batches = self.slot_batches(slot, qgen);
        let tails = self.tail_flags(slot, &batches);
        for (bi, tail) in batches.into_iter().zip(tails) {
            let b = self.batches[bi as usize];
            self.batches[bi as usize].live = false;
            self.free_batches.push(bi);
            let (done, mut started, into) = b.progress(now);
            let mut unrun = 0;
            if !tail && started < b.end {
                unrun = b.end - started;
                started = b.end;
            }
            let running = (started - b.first - done).min(b.held as u64);
            if let Err(e) = self.batch_effects(slot, b.id, b.first, b.first + done) {
                // `fail` frees the CUs still held by the slot.
                self.parts[p].free_cus += freed;
                return Err(e);
            }
            // The CUs of the saved waves stay held (by the slot) until the
            // dequeue finishes (`finish_unmap`).
            freed += self.release_batch_cus(bi, b.held - running as u32);
            let q = self.slots[slot as usize].as_mut().expect("slot");
            q.inflight -= b.held;
            if let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) {
                a.inflight -= b.held;
                if started < b.end {
                    // Only the packet's last batch has unstarted workgroups.
                    a.next_wg = a.next_wg.min(started);
                }
                if a.batch == Some(bi) {
                    a.batch = None;
                }
            }
            for wg in b.first + done..started {
                let whole = wg >= started - unrun;
                saved.push(SavedWg {
                    id: b.id,
                    wg,
                    remaining: if whole { b.cost } else { b.cost - into },
                });
            }
        }
        self.parts[p].free_cus += freed;
        Ok(saved)
    }

    fn finish_unmap(&mut self, slot: u32) {
        let now = self.now;
        let p = self.slot_part[slot as usize] as usize;
        let Some(mut q) = self.slots[slot as usize].take() else {
            return;
        };
        let freed = release_cus(&mut self.parts[p], slot, true);
        self.parts[p].free_cus += freed;
        let (mode, since) = q.unmap_req.unwrap_or((DequeueMode::DrainPipe, now));
        // Before the records trim the window: an unmet barrier at its tail
        // (dropped from the records, refetched at the next map) is no work.
        let had_work = q.has_work();
        if !matches!(q.state, HState::Error(_)) {
            // DrainPipe: partially dispatched packets are kept as control
            // records. ResetWaves: packets that completed out of order are.
            // SaveWaves: the saved waves too (sized at the request).
            if let Err(e) = cwsr::write_save(&mut q, &self.topo) {
                // Cannot happen for a validated topology and MQD unless the
                // memory itself fails; the progress is lost: a queue error.
                log::warn!(
                    "queue tag {} slot {slot} error: writing dequeue records failed: {e}",
                    q.tag
                );
                q.state = HState::Error(e);
                q.mqd.dw[mqd::CP_HQD_CNTL_STACK_OFFSET] = q.mqd.cntl_stack_size();
                self.report_queue_error(slot, q.tag, e);
            }
        }
        q.mqd.dw[mqd::CP_HQD_ACTIVE] = 0;
        q.mqd.dw[mqd::CP_HQD_DEQUEUE_REQUEST] = 0;
        q.mqd.set_read_index(q.rptr);
        q.mqd.set_write_index(q.wptr);
        let has_work = !matches!(q.state, HState::Error(_)) && had_work;
        self.pending.push(GpuEvent::Unmapped {
            slot: SlotId(slot),
            tag: q.tag,
            mode,
            mqd: Box::new(q.mqd.clone()),
            has_work,
            save_ns: now.saturating_sub(since),
            at: now,
        });
        self.dispatch(p as u32);
    }
}

// -------------------------------------------------------------------- helpers

/// Highest write index a queue may publish: one ring ahead of the read index,
/// and never past a dword position that overflows `CP_HQD_PQ_WPTR`.
fn wptr_limit(rptr: u64, ring_packets: u64) -> u64 {
    rptr.saturating_add(ring_packets).min(MAX_INDEX)
}

/// `addr + off` for a guest address, or `err` if it wraps.
fn addr_add(addr: u64, off: u64, err: QueueErrorReason) -> QResult<u64> {
    addr.checked_add(off).ok_or(err)
}

fn sig_check(mem: &dyn DmaMemory, addr: u64) -> QResult<()> {
    if addr != 0 && !mem.contains(addr, abi::queue::AMD_SIGNAL_SIZE as u64) {
        return Err(QueueErrorReason::SignalOutOfRange { addr });
    }
    Ok(())
}

fn barrier_satisfied(mem: &dyn DmaMemory, b: &Barrier, is_and: bool) -> QResult<bool> {
    let mut any = false;
    let mut all = true;
    let mut deps = 0;
    for &s in b.dep_signal.iter().filter(|s| **s != 0) {
        deps += 1;
        let err = QueueErrorReason::SignalOutOfRange { addr: s };
        let v = mem
            .read_u64(addr_add(s, AMD_SIGNAL_VALUE as u64, err)?)
            .map_err(|_| err)? as i64;
        if v == 0 {
            any = true;
        } else {
            all = false;
        }
    }
    Ok(if is_and { all } else { deps == 0 || any })
}

fn data_check(mem: &dyn DmaMemory, addr: u64, len: u64) -> QResult<()> {
    if len > 0 && !mem.contains(addr, len) {
        return Err(QueueErrorReason::DataOutOfRange { addr, len });
    }
    Ok(())
}

/// Validate a fetched packet and turn it into launched work.
fn decode_work(mem: &dyn DmaMemory, id: u64, pkt: &Packet) -> QResult<Active> {
    let (work, signal) = match pkt.body {
        Body::KernelDispatch(d) => {
            let total = d
                .validate()
                .map_err(|why| QueueErrorReason::BadDispatch { why })?;
            let items_per_wg = d.workgroup_items(); // <= MAX_WORKGROUP_ITEMS
            let ko = d.kernel_object;
            let mut kd = [0u8; abi::kernel::KD_SIZE];
            mem.read(ko, &mut kd)
                .map_err(|_| QueueErrorReason::DescriptorOutOfRange { addr: ko })?;
            let desc = KernelDescriptor::decode(&kd)
                .map_err(|why| QueueErrorReason::BadDescriptor { addr: ko, why })?;
            let ka = d.kernarg_address;
            let mut kb = [0u8; abi::kernel::KERNARG_MAX];
            let klen = desc.kind.kernarg_size();
            mem.read(ka, &mut kb[..klen])
                .map_err(|_| QueueErrorReason::KernargOutOfRange { addr: ka })?;
            let args = Kernarg::decode(desc.kind, &kb[..klen])
                .ok_or(QueueErrorReason::KernargOutOfRange { addr: ka })?;
            match args {
                Kernarg::Fill { dst, n, .. } => data_check(mem, dst, 4 * n as u64)?,
                Kernarg::VecAdd { a, b, c, n } => {
                    for x in [a, b, c] {
                        data_check(mem, x, 4 * n as u64)?;
                    }
                }
                Kernarg::Saxpy { x, y, n, .. } => {
                    data_check(mem, x, 4 * n as u64)?;
                    data_check(mem, y, 4 * n as u64)?;
                }
                Kernarg::Checksum { src, out, n } => {
                    data_check(mem, src, 4 * n as u64)?;
                    data_check(mem, out, 8)?;
                }
                Kernarg::Mark { counters, n } => data_check(mem, counters, 4 * n as u64)?,
                Kernarg::Spin { .. } => {}
            }
            sig_check(mem, d.completion_signal)?;
            let cost = match args {
                Kernarg::Spin { ns } if ns != 0 => ns,
                _ => desc.wg_cost_ns,
            };
            if cost > MAX_WG_COST_NS || total.checked_mul(cost.max(MIN_WG_NS)).is_none() {
                return Err(QueueErrorReason::BadDispatch {
                    why: aql::DispatchError::CostOverflow {
                        workgroups: total,
                        wg_cost_ns: cost,
                    },
                });
            }
            (
                Work::Dispatch(Dispatch {
                    desc,
                    args,
                    total,
                    items_per_wg,
                    fp: Footprint::of(items_per_wg, desc.vgprs, d.group_segment_size),
                }),
                d.completion_signal,
            )
        }
        Body::BarrierAnd(b) | Body::BarrierOr(b) => {
            for s in b.dep_signal {
                sig_check(mem, s)?;
            }
            sig_check(mem, b.completion_signal)?;
            let w = if matches!(pkt.body, Body::BarrierAnd(_)) {
                Work::And(b)
            } else {
                Work::Or(b)
            };
            (w, b.completion_signal)
        }
        Body::Invalid => return Err(QueueErrorReason::UnsupportedPacket(aql::TYPE_INVALID)),
        Body::Unsupported(t) => return Err(QueueErrorReason::UnsupportedPacket(t)),
    };
    Ok(Active {
        id,
        work,
        signal,
        next_wg: 0,
        done_wgs: 0,
        inflight: 0,
        complete: false,
        batch: None,
    })
}

/// Mark packet `i` complete: decrement its signal, invalidate its header, emit.
fn complete_packet(
    q: &mut Hqd,
    i: usize,
    now: Nanos,
    pending: &mut Vec<GpuEvent>,
    stats: &mut SimStats,
    slot: SlotId,
) -> QResult<()> {
    let a = &mut q.active[i];
    if a.complete {
        return Ok(());
    }
    a.complete = true;
    a.work = Work::Done;
    let id = a.id;
    if a.signal != 0 {
        // Atomic decrement where the memory supports it (see `DmaMemory`).
        let err = QueueErrorReason::SignalOutOfRange { addr: a.signal };
        let va = addr_add(a.signal, AMD_SIGNAL_VALUE as u64, err)?;
        q.mem.fetch_add_u64(va, u64::MAX).map_err(|_| err)?;
        stats.signals_decremented += 1;
    }
    let addr = q.mqd.packet_addr(id);
    q.mem
        .write(addr, &aql::INVALID_HEADER.to_le_bytes())
        .map_err(|_| QueueErrorReason::RingOutOfRange { addr })?;
    stats.packets_completed += 1;
    pending.push(GpuEvent::PacketCompleted {
        slot,
        tag: q.tag,
        dispatch_id: id,
        signal: a.signal,
        at: now,
    });
    Ok(())
}

/// Pop completed packets from the front; advance and report the read index.
fn retire(q: &mut Hqd, _slot: SlotId) -> QResult<()> {
    let mut moved = false;
    while q.active.front().is_some_and(|a| a.complete) {
        q.active.pop_front();
        q.rptr += 1;
        moved = true;
    }
    if moved {
        q.mqd.set_read_index(q.rptr);
        let ra = q.mqd.rptr_report_addr();
        if ra != 0 {
            q.mem
                .write_u64(ra, q.rptr)
                .map_err(|_| QueueErrorReason::PointerAddrOutOfRange { addr: ra })?;
        }
    }
    Ok(())
}

/// Read `n` u32s at `addr` into `buf`.
fn read_u32s(mem: &dyn DmaMemory, addr: u64, n: u64, buf: &mut Vec<u8>) -> QResult<()> {
    buf.resize((n * 4) as usize, 0);
    mem.read(addr, buf)
        .map_err(|_| QueueErrorReason::DataOutOfRange { addr, len: n * 4 })
}

/// Apply one workgroup's memory effect. Buffer ranges were validated when the
/// packet was fetched; every address is still computed with checked arithmetic
/// and every access bounds-checked.
fn apply_effect(
    mem: &dyn DmaMemory,
    d: &Dispatch,
    wg: u64,
    s1: &mut Vec<u8>,
    s2: &mut Vec<u8>,
) -> QResult<()> {
    let range = |n: u32| element_range(wg, d.items_per_wg, n);
    let werr = |addr: u64, len: u64| QueueErrorReason::DataOutOfRange { addr, len };
    // Address of element `k` of the u32 array at `base` with `n` elements.
    let elem = |base: u64, k: u64, n: u32| addr_add(base, 4 * k, werr(base, 4 * n as u64));
    // A workgroup's element range holds at most `MAX_WORKGROUP_ITEMS` (1024)
    // elements (`KernelDispatch::validate` at fetch), so host buffers stay
    // bounded whatever the guest asks for.
    let range = |n: u32| {
        let (s, e) = range(n);
        debug_assert!(e - s <= MAX_WORKGROUP_ITEMS);
        (s, e - s)
    };
    match d.args {
        Kernarg::Fill { dst, n, value } => {
            let (k, m) = range(n);
            s1.clear();
            for _ in 0..m {
                s1.extend_from_slice(&value.to_le_bytes());
            }
            mem.write(elem(dst, k, n)?, s1)
                .map_err(|_| werr(dst, 4 * n as u64))?;
        }
        Kernarg::VecAdd { a, b, c, n } => {
            let (k, m) = range(n);
            read_u32s(mem, elem(a, k, n)?, m, s1)?;
            read_u32s(mem, elem(b, k, n)?, m, s2)?;
            for i in 0..m as usize {
                let v = u32_at(s1, 4 * i).wrapping_add(u32_at(s2, 4 * i));
                put_u32(s1, 4 * i, v);
            }
            mem.write(elem(c, k, n)?, s1)
                .map_err(|_| werr(c, 4 * n as u64))?;
        }
        Kernarg::Saxpy { x, y, n, a } => {
            let (k, m) = range(n);
            read_u32s(mem, elem(x, k, n)?, m, s1)?;
            read_u32s(mem, elem(y, k, n)?, m, s2)?;
            for i in 0..m as usize {
                let v = a
                    .wrapping_mul(u32_at(s1, 4 * i))
                    .wrapping_add(u32_at(s2, 4 * i));
                put_u32(s1, 4 * i, v);
            }
            mem.write(elem(y, k, n)?, s1)
                .map_err(|_| werr(y, 4 * n as u64))?;
        }
        Kernarg::Checksum { src, out, n } => {
            let (k, m) = range(n);
            read_u32s(mem, elem(src, k, n)?, m, s1)?;
            let sum =
                (0..m as usize).fold(0u64, |acc, i| acc.wrapping_add(u32_at(s1, 4 * i) as u64));
            // Atomic add where the memory supports it (see `DmaMemory`).
            mem.fetch_add_u64(out, sum).map_err(|_| werr(out, 8))?;
        }
        Kernarg::Mark { counters, n } => {
            if wg < n as u64 {
                let addr = elem(counters, wg, n)?;
                mem.fetch_add_u32(addr, 1).map_err(|_| werr(addr, 4))?;
            }
        }
        Kernarg::Spin { .. } => {}
    }
    Ok(())
}

/// Everything [`SimGpu`]'s `map` refuses a queue for at once, checked
/// without a slot (the front end's load check, [`PhysGpu::load_check`]):
/// the admission rules, the write index at the poll address (readable, not
/// behind the MQD's, at most one ring ahead of the read index: errors 5, 8,
/// 7) and, if the MQD has saved state, its control record (error 18 and the
/// layout errors), read and validated as the restore will.
pub fn validate_load(
    topo: &GpuTopology,
    params: &SimParams,
    m: &V9Mqd,
    mem: &dyn DmaMemory,
) -> Result<(), QueueErrorReason> {
    crate::admission::check_mqd(topo, m, mem)?;
    let rptr = m.read_index().ok_or(QueueErrorReason::BadPointers)?;
    let mut wptr = m.write_index();
    let pa = m.wptr_poll_addr();
    if pa != 0 {
        match mem.read_u64(pa) {
            Ok(w) if w >= wptr => wptr = w,
            Ok(w) => return Err(QueueErrorReason::WptrBackwards { old: wptr, new: w }),
            Err(_) => return Err(QueueErrorReason::PointerAddrOutOfRange { addr: pa }),
        }
    }
    let ring_packets = m.ring_packets();
    if wptr > wptr_limit(rptr, ring_packets) {
        return Err(QueueErrorReason::WptrBeyondRing {
            wptr,
            rptr,
            size: ring_packets,
        });
    }
    if m.has_saved_state() {
        cwsr::parse_save(m, mem, topo, params, rptr, wptr)?;
    }
    Ok(())
}

impl PhysGpu for SimGpu {
    fn load_check(&self) -> crate::backend::LoadCheck {
        let params = self.params.clone();
        std::sync::Arc::new(move |topo, m, mem| validate_load(topo, &params, m, mem))
    }

    fn topology(&self) -> &GpuTopology {
        &self.topo
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
        self.run_until(now);
        let now = self.now; // behind `now` only when over the event budget
        let s = req.slot.0;
        let slot = self
            .slots
            .get(s as usize)
            .ok_or(GpuError::NoSuchSlot(req.slot))?;
        if slot.is_some() {
            return Err(GpuError::SlotBusy(req.slot));
        }
        crate::admission::check_mqd(&self.topo, &req.mqd, &*req.mem).map_err(GpuError::BadMqd)?;
        let rptr = req
            .mqd
            .read_index()
            .ok_or(GpuError::BadMqd(QueueErrorReason::BadPointers))?;
        let gen = self.next_gen;
        self.next_gen += 1;
        self.stats.maps += 1;
        let mut q = Hqd {
            tag: req.tag,
            gen,
            ring_packets: req.mqd.ring_packets(),
            wptr: req.mqd.write_index(),
            rptr,
            mqd: req.mqd,
            mem: req.mem,
            state: HState::Active,
            active: VecDeque::new(),
            resume: VecDeque::new(),
            inflight: 0,
            held_cus: 0,
            poll_armed: false,
            idle_reported: false,
            blocked: false,
            stall_polls: 0,
            barrier_blocked: false,
            refused_at_map: false,
            unmap_req: None,
            save_waiting: false,
            guest_mask: None,
            host_mask: self.next_map_mask.take(),
            mask: None,
            saved_guests: 0,
        };
        let cus = self.topo.cus_per_partition();
        let guest = CuMask::from_mqd(
            &q.mqd,
            self.topo.cus_per_xcc,
            self.topo.ses_per_xcc,
            self.topo.xccs_per_partition(),
        );
        q.guest_mask = (guest.count() < cus).then_some(guest);
        q.mask = effective_mask(q.guest_mask.as_ref(), q.host_mask.as_ref());
        q.mqd.dw[mqd::CP_HQD_ACTIVE] = 1;
        q.mqd.dw[mqd::CP_HQD_DEQUEUE_REQUEST] = 0;
        // Error checks that depend on guest memory contents: queue error, slot taken.
        let mut err = None;
        let pa = q.mqd.wptr_poll_addr();
        if pa != 0 {
            match q.mem.read_u64(pa) {
                Ok(w) if w >= q.wptr => q.wptr = w,
                Ok(w) => {
                    err = Some(QueueErrorReason::WptrBackwards {
                        old: q.wptr,
                        new: w,
                    })
                }
                Err(_) => err = Some(QueueErrorReason::PointerAddrOutOfRange { addr: pa }),
            }
        }
        if err.is_none() && q.wptr > wptr_limit(q.rptr, q.ring_packets) {
            err = Some(QueueErrorReason::WptrBeyondRing {
                wptr: q.wptr,
                rptr: q.rptr,
                size: q.ring_packets,
            });
        }
        let mut restore_ns = None;
        if err.is_none() && q.mqd.has_saved_state() {
            match cwsr::read_save(&mut q, &self.topo, &self.params) {
                Ok(ns) => {
                    self.stats.restores += 1;
                    restore_ns = ns;
                }
                Err(e) => err = Some(e),
            }
        }
        if restore_ns.is_some() {
            q.state = HState::Restoring;
        }
        q.refused_at_map = err.is_some();
        self.slots[s as usize] = Some(q);
        if let Some(e) = err {
            self.fail(s, e);
            return Ok(());
        }
        if let Some(ns) = restore_ns {
            self.stats.restore_ns_total = self.stats.restore_ns_total.saturating_add(ns);
            self.arm(now.saturating_add(ns), Timer::RestoreDone { slot: s, gen });
        } else {
            self.pump(s);
            let p = self.slot_part[s as usize];
            self.dispatch(p);
        }
        Ok(())
    }

    fn unmap(&mut self, now: Nanos, slot: SlotId, mode: DequeueMode) -> Result<(), GpuError> {
        self.run_until(now);
        let now = self.now; // behind `now` only when over the event budget
        let s = slot.0;
        let q = self
            .slots
            .get_mut(s as usize)
            .ok_or(GpuError::NoSuchSlot(slot))?;
        let q = q.as_mut().ok_or(GpuError::NotMapped(slot))?;
        match q.state {
            // A reset ends a drain or save that does not finish (the
            // caller's preemption timeout): it kills the waves still running.
            HState::Unmapping { mode: m, .. }
                if mode == DequeueMode::ResetWaves && m != DequeueMode::ResetWaves =>
            {
                q.save_waiting = false;
                self.stats.escalated_resets += 1;
            }
            HState::Unmapping { .. } => return Err(GpuError::AlreadyUnmapping(slot)),
            HState::Error(_) => {
                q.unmap_req = Some((mode, now));
                q.active.clear();
                q.resume.clear();
                // A run-time error drops the queue's unread packets (the
                // write-back reads rptr = wptr). A load refused at the map
                // (the queue never ran: a record or write index changed
                // after the front end accepted the load) keeps the read
                // index and control-stack offset it was loaded with, so
                // that a repaired MQD reloads and loses no work.
                if !q.refused_at_map {
                    q.rptr = q.wptr;
                }
                self.finish_unmap(s);
                return Ok(());
            }
            HState::Active | HState::Restoring => {}
        }
        q.mqd.dw[mqd::CP_HQD_DEQUEUE_REQUEST] = mode as u32;
        q.state = HState::Unmapping { mode, since: now };
        q.unmap_req = Some((mode, now));
        let gen = q.gen;
        let p = self.slot_part[s as usize] as usize;
        match mode {
            DequeueMode::DrainPipe => {
                self.stats.drains += 1;
                self.drain_batches(s, gen);
                let q = self.slots[s as usize].as_mut().expect("slot");
                if q.inflight == 0 {
                    self.finish_unmap(s);
                }
            }
            DequeueMode::SaveWaves => {
                self.stats.saves += 1;
                // Batches first: their finished rounds apply, the round in
                // flight becomes saved waves.
                let batch_saved = match self.save_batches(s, gen) {
                    Ok(v) => v,
                    Err(e) => {
                        self.fail(s, e);
                        return Ok(());
                    }
                };
                let q = self.slots[s as usize].as_mut().expect("slot");
                // No allocation and no guest-memory write at the request
                // (the doorbell -> preemption path) beyond the batches' saved
                // list: saved waves go to the front of the restore list in
                // order; the control records are written when the dequeue
                // finishes (`finish_unmap`).
                let mut n = 0u32;
                let mut unsaved = 0u32;
                let mut guests = 0u32;
                for w in self.wgs.iter_mut() {
                    if w.live && w.slot == s && w.qgen == gen {
                        // Waves of a kernel without a save point keep
                        // running; the save waits for them.
                        let preemptible = q.active.iter().find(|a| a.id == w.id).is_none_or(
                            |a| !matches!(a.work, Work::Dispatch(d) if !d.desc.preemptible()),
                        );
                        if !preemptible {
                            unsaved += 1;
                            continue;
                        }
                        w.live = false;
                        n += 1;
                        if let Some(a) = q.active.iter_mut().find(|a| a.id == w.id) {
                            a.inflight -= 1;
                        }
                        // A saved guest gives its lane back (only the saved
                        // ones: a guest without a save point keeps running
                        // in its lane, freed when it ends); its waves are
                        // saved with the rest (the work it has left, at its
                        // solo rate).
                        let remaining = if w.guest {
                            guests += 1;
                            release_guest(&mut self.parts[p], w.cu, s);
                            occupancy::guest_left(now, w.end, w.shared_until)
                        } else {
                            w.end.saturating_sub(now)
                        };
                        q.resume.push_front(SavedWg {
                            id: w.id,
                            wg: w.wg,
                            remaining: remaining.max(MIN_WG_NS),
                        });
                    }
                }
                for sw in batch_saved.into_iter().rev() {
                    q.resume.push_front(sw);
                    n += 1;
                }
                q.resume.make_contiguous()[..n as usize].sort_unstable();
                q.inflight = unsaved;
                // Saved guests held no CU of their own (their lanes are free).
                q.held_cus = n - guests;
                q.saved_guests = guests;
                self.stats.saved_wgs += n as u64;
                if unsaved > 0 {
                    q.save_waiting = true;
                    self.stats.saves_waiting += 1;
                    return Ok(());
                }
                self.arm_save_done(s);
            }
            DequeueMode::ResetWaves => {
                self.stats.resets += 1;
                let mut killed = 0u32;
                // Finished rounds of batches have had their effect.
                for bi in self.slot_batches(s, gen) {
                    let b = self.batches[bi as usize];
                    self.batches[bi as usize].live = false;
                    self.free_batches.push(bi);
                    killed += b.held;
                    let (done, _, _) = b.progress(now);
                    if let Err(e) = self.batch_effects(s, b.id, b.first, b.first + done) {
                        // `fail` frees every CU the slot holds.
                        self.fail(s, e);
                        return Ok(());
                    }
                }
                let q = self.slots[s as usize].as_mut().expect("slot");
                for w in self.wgs.iter_mut() {
                    if w.live && w.slot == s && w.qgen == gen {
                        w.live = false;
                        killed += 1;
                    }
                }
                self.stats.killed_wgs += killed as u64;
                let freed = release_cus(&mut self.parts[p], s, false);
                release_guests(&mut self.parts[p], s);
                // Packets that completed out of order (signal decremented, header
                // INVALID) stay complete: they are kept as Done records, or the
                // CP would refetch an INVALID header at the next map and wait
                // forever. Incomplete dispatches restart from workgroup 0 at the
                // next map; the effects of their finished workgroups apply again.
                let mut dup = 0u64;
                for a in q.active.iter_mut() {
                    a.inflight = 0;
                    a.batch = None;
                    if !a.complete && matches!(a.work, Work::Dispatch(_)) {
                        dup = dup.saturating_add(a.done_wgs);
                        a.next_wg = 0;
                        a.done_wgs = 0;
                    }
                }
                self.stats.duplicate_effects += dup;
                q.resume.clear();
                q.inflight = 0;
                // `release_cus` freed every CU of the slot: those of the
                // killed waves and those a save (escalated to this reset)
                // held for its saved waves.
                q.held_cus = 0;
                self.parts[p].free_cus += freed;
                let t = self.topo.cwsr.trap_ns;
                // The records are written when the dequeue finishes.
                self.arm(now.saturating_add(t), Timer::UnmapDone { slot: s, gen });
                self.dispatch(p as u32);
            }
        }
        Ok(())
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
        self.run_until(now);
        let s = slot.0;
        let Some(Some(q)) = self.slots.get_mut(s as usize) else {
            log::debug!("doorbell on unmapped slot {}", s);
            return;
        };
        if matches!(q.state, HState::Error(_)) {
            return;
        }
        if wptr < q.wptr {
            let old = q.wptr;
            self.fail(s, QueueErrorReason::WptrBackwards { old, new: wptr });
            return;
        }
        if wptr > wptr_limit(q.rptr, q.ring_packets) {
            let (rptr, size) = (q.rptr, q.ring_packets);
            self.fail(s, QueueErrorReason::WptrBeyondRing { wptr, rptr, size });
            return;
        }
        if wptr > q.wptr {
            q.idle_reported = false;
        }
        q.wptr = wptr;
        q.mqd.set_write_index(wptr);
        if q.state == HState::Active {
            // A doorbell re-reads a blocked queue at once, with a fresh backoff.
            q.stall_polls = 0;
            let written = self.stats.signals_decremented;
            self.pump(s);
            let p = self.slot_part[s as usize];
            self.dispatch(p);
            if self.stats.signals_decremented != written {
                self.wake_barrier_waiters();
            }
        }
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
        self.run_until(now);
        let cus = self.topo.cus_per_partition();
        let q = self
            .slots
            .get_mut(slot.0 as usize)
            .ok_or(GpuError::NoSuchSlot(slot))?
            .as_mut()
            .ok_or(GpuError::NotMapped(slot))?;
        let host = (mask.count() < cus || mask.len() < cus).then(|| mask.and(&CuMask::all(cus)));
        if q.host_mask == host {
            return Ok(());
        }
        q.host_mask = host;
        q.mask = effective_mask(q.guest_mask.as_ref(), q.host_mask.as_ref());
        self.stats.cu_mask_changes += 1;
        self.cut_batches_outside_mask(slot.0);
        let p = self.slot_part[slot.0 as usize];
        self.dispatch(p);
        Ok(())
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

impl SimGpu {
    /// The CUs a mapped slot's workgroups may launch on (`None`: not mapped).
    pub fn cu_mask(&self, slot: SlotId) -> Option<CuMask> {
        let q = self.slots.get(slot.0 as usize)?.as_ref()?;
        let all = CuMask::all(self.topo.cus_per_partition());
        Some(q.mask.clone().unwrap_or(all))
    }

    /// CUs (partition numbering) running a live workgroup of `slot`'s queue.
    pub fn running_cus(&self, slot: SlotId) -> Vec<u32> {
        let Some(Some(q)) = self.slots.get(slot.0 as usize) else {
            return Vec::new();
        };
        self.wgs
            .iter()
            .filter(|w| w.live && w.slot == slot.0 && w.qgen == q.gen)
            .map(|w| w.cu)
            .chain(
                self.slot_batches(slot.0, q.gen)
                    .into_iter()
                    .flat_map(|bi| self.batch_cus[bi as usize].iter().copied()),
            )
            .collect()
    }

    /// The queue in `slot` has a new mask: its batches holding a CU outside
    /// it stop at the end of their current round (as in `rebalance`); the
    /// round robin then hands their workgroups out again inside the mask.
    /// A batch that starts later (the rest of a cut batch, waiting for its
    /// predecessor's round end) gives all its workgroups and CUs back at
    /// once: kept, its first round would start after workgroups handed out
    /// now, and a save in between would find an unstarted workgroup below
    /// a running one (a saved wave past `next_wg`, refused on restore).
    fn cut_batches_outside_mask(&mut self, slot: u32) {
        let now = self.now;
        let Some(q) = self.slots[slot as usize].as_ref() else {
            return;
        };
        let (qgen, mask) = (q.gen, q.mask.clone());
        let Some(mask) = mask else { return };
        let p = self.slot_part[slot as usize] as usize;
        for bi in self.slot_batches(slot, qgen) {
            if self.batch_cus[bi as usize]
                .iter()
                .all(|&cu| mask.contains(cu))
            {
                continue;
            }
            let b = self.batches[bi as usize];
            if now < b.start {
                let q = self.slots[slot as usize].as_mut().expect("slot");
                q.inflight -= b.held;
                if let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) {
                    a.next_wg = a.next_wg.min(b.first);
                    a.inflight -= b.held;
                    if a.batch == Some(bi) {
                        a.batch = None;
                    }
                }
                let freed = self.release_batch_cus(bi, b.held);
                self.parts[p].free_cus += freed;
                self.batches[bi as usize].live = false;
                self.free_batches.push(bi);
                continue;
            }
            let started = b.started_by(now);
            if started >= b.end {
                continue;
            }
            let q = self.slots[slot as usize].as_mut().expect("slot");
            if let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) {
                a.next_wg = a.next_wg.min(started);
            }
            self.batches[bi as usize].end = started;
            self.touch_batch(bi);
        }
        self.flush_batches();
    }
}

/// CUs a queue may launch on: guest mask ∩ host mask (`None`: all).
fn effective_mask(guest: Option<&CuMask>, host: Option<&CuMask>) -> Option<CuMask> {
    match (guest, host) {
        (None, None) => None,
        (Some(m), None) | (None, Some(m)) => Some(m.clone()),
        (Some(a), Some(b)) => Some(a.and(b)),
    }
}

/// CWSR state bytes of the largest of the first `n` saved workgroups of
/// `q` (`whole`: a whole CU's).
fn saved_state_bytes(q: &Hqd, n: usize, whole: u64) -> u64 {
    q.resume
        .iter()
        .take(n)
        .map(|sw| packet_fp(q, sw.id).state_bytes(whole))
        .max()
        .unwrap_or(whole)
}

/// Footprint of a workgroup of packet `id` of `q` (a whole CU if unknown).
fn packet_fp(q: &Hqd, id: u64) -> Footprint {
    q.active
        .iter()
        .find(|a| a.id == id)
        .and_then(|a| match a.work {
            Work::Dispatch(d) => Some(d.fp),
            _ => None,
        })
        .unwrap_or(Footprint::WHOLE)
}

/// A live workgroup on `cu` finished: the CU is free, unless a guest
/// workgroup still runs on it (it becomes free when the guest leaves).
/// Returns whether it is free now (the caller counts it).
fn release_cu(part: &mut Part, cu: u32) -> bool {
    if let Some(o) = part.cu_owner.get_mut(cu as usize) {
        *o = 0;
        if part.cu_guest.get(cu as usize).is_some_and(|&g| g != 0) {
            return false;
        }
        part.free_mask.insert(cu);
        return true;
    }
    false
}

/// Frees the CUs held by `slot`: all of them (`saved`: the waves a save
/// held until the dequeue finished), or those of workgroups just killed.
/// Returns how many are free now (a CU with a guest on it is not yet).
fn release_cus(part: &mut Part, slot: u32, _saved: bool) -> u32 {
    let mut n = 0;
    for cu in 0..part.cu_owner.len() {
        if part.cu_owner[cu] == slot + 1 && release_cu(part, cu as u32) {
            n += 1;
        }
    }
    n
}

/// The guest workgroup of `slot` on `cu` left: its lane is free (unless
/// another queue's guest holds it: a lane is given back only by its own
/// guest), and a CU without an owner becomes free (counted here). Returns
/// whether it did.
fn release_guest(part: &mut Part, cu: u32, slot: u32) -> bool {
    let Some(g) = part.cu_guest.get_mut(cu as usize) else {
        return false;
    };
    if *g != slot + 1 {
        return false;
    }
    *g = 0;
    if part.cu_owner[cu as usize] == 0 && !part.free_mask.contains(cu) {
        part.free_mask.insert(cu);
        part.free_cus += 1;
        return true;
    }
    false
}

/// Every guest lane `slot`'s workgroups hold (killed or saved) is given
/// back. Returns the CUs that became free.
fn release_guests(part: &mut Part, slot: u32) -> u32 {
    let mut n = 0;
    for cu in 0..part.cu_guest.len() {
        if release_guest(part, cu as u32, slot) {
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod preempt_tests;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod cu_mask_tests;

#[cfg(test)]
mod occupancy_tests;

#[cfg(test)]
mod review_tests;
