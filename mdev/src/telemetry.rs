//! Per-VM telemetry of the shared GPU, sans-IO: fed with the binding's
//! [`Notice`]s, the GPU's [`GpuEvent`]s and a few arbiter observations, at
//! model times (ns). It keeps
//!
//! * histograms per VM: CWSR save time, CWSR restore time, host time from a
//!   doorbell read to the preemption it caused being handed to the GPU;
//! * per VM, packet latency: from the doorbell that published a packet
//!   (its write index) to the packet's completion, via a bounded ring of
//!   `(write index, doorbell time)` per queue ([`Telemetry::doorbell_published`]);
//! * queue errors per VM by `CP_HQD_ERROR` code;
//! * the final GPU time and preemptions of VMs that are gone;
//! * a [`timeline::Recorder`]: spans of queues running, being saved and
//!   restored on each HQD slot, and preemption marks.
//!
//! Counters the scheduler already keeps (GPU busy time, preemptions, HQD
//! slots in use, priority, weight) are read from the binding when rendering
//! ([`crate::metrics::render`]). Both the GPU arbiter and eval's
//! virtual-time driver feed one; the calls are the same:
//!
//! 1. [`Telemetry::vm_added`] / [`Telemetry::vm_removed`];
//! 2. [`Telemetry::gpu_event`] for every GPU event, before the binding sees it;
//! 3. [`Telemetry::notice`] for every binding notice (preemptions, with
//!    whom they were for and why, and aging boosts are notices too: what
//!    the scheduler decided, not inferred from its counters);
//! 4. [`Telemetry::after`] after each batch of binding calls and after the
//!    GPU advanced (finds finished restores, parameter changes and waits).

use crate::backend::{DequeueMode, GpuEvent, PhysGpu, QueueErrorReason, SlotId, SlotState};
use crate::binding::{Binding, Notice, PreemptReason};
use crate::metrics::{Histogram, CWSR_BUCKETS, DOORBELL_BUCKETS, PACKET_LATENCY_BUCKETS};
use crate::topology::GpuTopology;
use scheduler::{Nanos, VmId, VmParams, VmStats};
use std::collections::{BTreeMap, HashMap, VecDeque};
use timeline::{Recorder, RingLimits, SlotRow, SpanKind, Timeline, VmRow};

/// The largest latency [`LatencySketch`] resolves: 30 days, the longest run
/// timeout (`vmm::config::TIMEOUT_MS_RANGE`). A longer one is reported as
/// this (read "at least").
pub const LATENCY_LIMIT_NS: u64 = 30 * 24 * 3600 * 1_000_000_000;

/// Latency quantiles without the Prometheus histogram's top bucket (5 s):
/// an HDR histogram with two significant digits (1% precision) from 1 ns
/// to [`LATENCY_LIMIT_NS`], growing with the largest latency seen (a few
/// KiB for latencies up to seconds).
#[derive(Clone, Debug)]
pub struct LatencySketch {
    h: hdrhistogram::Histogram<u64>,
    /// Observations past [`LATENCY_LIMIT_NS`].
    over: u64,
}

impl Default for LatencySketch {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencySketch {
    /// An empty sketch.
    pub fn new() -> Self {
        LatencySketch {
            // Two significant digits is a valid precision: this cannot fail.
            h: hdrhistogram::Histogram::new(2).expect("sigfig 2 is valid"),
            over: 0,
        }
    }

    /// Records one latency.
    pub fn record_ns(&mut self, ns: u64) {
        if ns > LATENCY_LIMIT_NS {
            self.over += 1;
        }
        // Clamped into the range, so the (auto-resizing) record succeeds.
        let _ = self.h.record(ns.clamp(1, LATENCY_LIMIT_NS));
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.h.len()
    }

    /// The `q` quantile in seconds (`None` without observations); a
    /// quantile past [`LATENCY_LIMIT_NS`] is that limit.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let n = self.h.len();
        if n == 0 {
            return None;
        }
        let q = q.clamp(0.0, 1.0);
        if self.over > 0 && q * n as f64 > (n - self.over) as f64 {
            return Some(LATENCY_LIMIT_NS as f64 / 1e9);
        }
        let ns = self.h.value_at_quantile(q).min(LATENCY_LIMIT_NS);
        Some(ns as f64 / 1e9)
    }
}

#[cfg(test)]
mod sketch_tests {
    use super::*;

    /// The case: p50 17.6 s was shown as 5000 ms by the buckets.
    #[test]
    fn quantiles_past_the_buckets_are_kept_and_past_the_limit_said() {
        let mut s = LatencySketch::new();
        assert_eq!(s.quantile(0.5), None);
        let mut h = Histogram::new(PACKET_LATENCY_BUCKETS);
        for ns in [17_600_000_000u64, 17_600_000_000, 17_600_000_000, 1_000_000] {
            s.record_ns(ns);
            h.observe_ns(ns);
        }
        assert_eq!(h.quantile(0.5), Some(5.0), "the buckets stop at 5 s");
        let p50 = s.quantile(0.5).unwrap();
        assert!((p50 - 17.6).abs() <= 17.6 * 0.01, "{p50}");
        let p0 = s.quantile(0.0).unwrap();
        assert!((p0 - 1e-3).abs() <= 1e-5, "{p0}");
        // Past the limit: reported as the limit, below it unchanged.
        for _ in 0..4 {
            s.record_ns(LATENCY_LIMIT_NS + 1);
        }
        let limit = LATENCY_LIMIT_NS as f64 / 1e9;
        assert_eq!(s.quantile(0.99), Some(limit));
        assert!(s.quantile(0.25).unwrap() < limit);
        assert_eq!(s.count(), 8);
        s.record_ns(0);
        assert_eq!(s.count(), 9, "0 ns counts (as 1 ns)");
    }
}

/// The promise's counters of one VM (docs/scheduling.md, "The promise"),
/// cumulative since it was added; `hqdmux promise` and the API's
/// `entitled vs got` take their differences over a window
/// ([`crate::promise::check_window`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromiseCounters {
    /// Compute received: CU time of its completed workgroups (CU x ns,
    /// [`crate::backend::PhysGpu::take_cu_time`]).
    pub cu_ns: u64,
    /// Time it was demanding (a queue with work it could run).
    pub demanding_ns: u64,
    /// Time it had a queue ready or saved and none running (waiting for a
    /// slot).
    pub wait_ns: u64,
    /// Preemptions of other VMs' queues made for one of its queues
    /// ([`Notice::Preempted`] naming it as `by`).
    pub preemptions_caused: u64,
    /// Preemptions of its queues made for a queue boosted by aging
    /// ([`Notice::Preempted`] with [`PreemptReason::Aging`]).
    pub preempted_by_aging: u64,
    /// Aging boosts of its queues ([`Notice::Aged`]).
    pub aging_boosts: u64,
    /// Demanding at the last sample.
    pub demanding: bool,
    /// Waiting at the last sample.
    pub waiting: bool,
}

/// Demand states are sampled at most this often (ns) on the event path
/// (a scan of the binding's queues); reads settle them to the moment.
pub const DEMAND_SAMPLE_NS: Nanos = 250_000;

/// What telemetry keeps for one VM.
#[derive(Clone, Debug)]
pub struct VmTelemetry {
    /// Name (`vm` label, legend).
    pub name: String,
    /// Partition at registration (the scheduler's is used while it lives).
    pub partition: u32,
    /// CWSR save (dequeue with `SaveWaves`) durations.
    pub cwsr_save: Histogram,
    /// CWSR restore durations.
    pub cwsr_restore: Histogram,
    /// Host time from a doorbell read to the binding returning with a
    /// preemption it caused.
    pub doorbell_to_preemption: Histogram,
    /// Time from the doorbell that published a packet of the VM to that
    /// packet's completion.
    pub packet_latency: Histogram,
    /// The same latencies for quantiles without a top bucket.
    pub packet_latency_sketch: LatencySketch,
    /// Queue errors by code (`CP_HQD_ERROR` number, or `map_refused`).
    pub queue_errors: BTreeMap<String, u64>,
    /// `(gpu_ns, preemptions)` when the VM was removed.
    pub final_figures: Option<(u64, u64)>,
    /// `(gpu_ns, preemptions)` of earlier registrations of the same name
    /// (a vGPU whose VMM reconnected, a VM re-created under its name): added
    /// to this registration's figures so that one name is one series whose
    /// counters never go backwards.
    pub carried: (u64, u64),
    /// The guard's totals (reset, queue_error, stale_doorbell, save-wait ns) when
    /// the VM was removed ([`Telemetry::vm_guard_final`]).
    pub final_guard: Option<crate::guard::GuardTotals>,
    /// The guard totals of earlier registrations of the same name (added
    /// to this one's, as `carried`).
    pub carried_guard: crate::guard::GuardTotals,
    /// The promise's counters.
    pub promise: PromiseCounters,
    /// Preemptions of its queues by preempting VM (telemetry id), where
    /// the scheduler names another VM.
    pub preempted_by: BTreeMap<VmId, u64>,
    /// `(priority, weight)` last seen (changes are marked on the timeline).
    seen_params: (u8, u32),
}

/// Per-fleet telemetry (see the module docs for the calls).
#[derive(Debug)]
pub struct Telemetry {
    rec: Recorder,
    slot_part: Vec<u32>,
    vms: BTreeMap<VmId, VmTelemetry>,
    /// Per slot: (queue tag, vm) loaded there.
    on_slot: Vec<Option<(u64, VmId)>>,
    /// Per slot: when the restore of the loaded queue started.
    restore_start: Vec<Option<Nanos>>,
    /// Per slot: the queue whose current dequeue is a preemption, and the
    /// other VM it was preempted for (if one); the mark is placed at the
    /// dequeue request when the dequeue finishes.
    marked: Vec<Option<(u64, Option<VmId>)>>,
    /// When demand states were last sampled.
    demand_at: Option<Nanos>,
    /// Reused by the demand sampling.
    demand_buf: BTreeMap<VmId, (bool, bool)>,
    /// Per queue tag: published packets not yet completed.
    published: HashMap<u64, Published>,
    /// Removed VMs whose figures are still kept, oldest first (at most
    /// [`RETAINED_REMOVED_VMS`]).
    removed: VecDeque<VmId>,
    /// The scheduling policy last seen (changes are marked on the timeline).
    seen_policy: Option<scheduler::Policy>,
}

/// Removed VMs whose figures (histograms, queue errors, `/metrics` series)
/// telemetry keeps; an older removed VM is forgotten (a long-running fleet
/// that launches VMs continuously stays bounded).
pub const RETAINED_REMOVED_VMS: usize = 256;

/// Most doorbells remembered per queue (older ones are coalesced).
pub const PUBLISHED_RING: usize = 256;

/// Doorbells of one queue whose packets have not all completed: `(write
/// index read at the doorbell, time of the doorbell)`, write index increasing.
#[derive(Debug)]
struct Published {
    vm: VmId,
    ring: VecDeque<(u64, Nanos)>,
    /// Highest write index pushed.
    last_wptr: u64,
}

impl Telemetry {
    /// Telemetry over `topo`'s user HQD slots, keeping `limits` of timeline
    /// history.
    pub fn new(topo: &GpuTopology, limits: RingLimits) -> Self {
        let slots = topo.user_slots();
        let rows = slots
            .iter()
            .enumerate()
            .map(|(i, s)| SlotRow {
                id: i as u32,
                label: format!("P{} pipe{} q{}", s.partition, s.pipe, s.queue),
                partition: s.partition,
            })
            .collect();
        let n = slots.len();
        Telemetry {
            rec: Recorder::new(rows, limits),
            slot_part: slots.iter().map(|s| s.partition).collect(),
            vms: BTreeMap::new(),
            on_slot: vec![None; n],
            restore_start: vec![None; n],
            marked: vec![None; n],
            demand_at: None,
            demand_buf: BTreeMap::new(),
            published: HashMap::new(),
            removed: VecDeque::new(),
            seen_policy: None,
        }
    }

    /// A VM was registered (id = the binding's `VmId`).
    ///
    /// A removed VM of the same name still kept is absorbed: its figures
    /// (counters, histograms, queue errors) continue in the new one, so
    /// `/metrics` has one series per name across re-registrations.
    pub fn vm_added(&mut self, vm: VmId, name: &str, params: &VmParams, partition: u32) {
        let earlier = self
            .removed
            .iter()
            .copied()
            .find(|id| *id != vm && self.vms.get(id).is_some_and(|v| v.name == name));
        if let Some(old) = earlier.and_then(|id| self.vms.remove(&id).map(|v| (id, v))) {
            let (old_id, mut v) = old;
            let (g, p) = v.final_figures.take().unwrap_or((0, 0));
            v.carried = (v.carried.0.saturating_add(g), v.carried.1.saturating_add(p));
            let guard = v.final_guard.take().unwrap_or_default();
            for (c, n) in v.carried_guard.iter_mut().zip(guard) {
                *c = c.saturating_add(n);
            }
            v.partition = partition;
            v.seen_params = (params.priority, params.weight);
            // Who the old registration preempted now names the new one.
            for other in self.vms.values_mut() {
                if let Some(n) = other.preempted_by.remove(&old_id) {
                    *other.preempted_by.entry(vm).or_insert(0) += n;
                }
            }
            if let Some(n) = v.preempted_by.remove(&old_id) {
                *v.preempted_by.entry(vm).or_insert(0) += n;
            }
            // The old id stays in `removed` (its timeline row is forgotten
            // when it leaves the retention window).
            self.vms.insert(vm, v);
        } else {
            self.vms.insert(
                vm,
                VmTelemetry {
                    name: name.to_string(),
                    partition,
                    cwsr_save: Histogram::new(CWSR_BUCKETS),
                    cwsr_restore: Histogram::new(CWSR_BUCKETS),
                    doorbell_to_preemption: Histogram::new(DOORBELL_BUCKETS),
                    packet_latency: Histogram::new(PACKET_LATENCY_BUCKETS),
                    packet_latency_sketch: LatencySketch::new(),
                    queue_errors: BTreeMap::new(),
                    final_figures: None,
                    carried: (0, 0),
                    final_guard: None,
                    carried_guard: [0; 4],
                    promise: PromiseCounters::default(),
                    preempted_by: BTreeMap::new(),
                    seen_params: (params.priority, params.weight),
                },
            );
        }
        self.rec.set_vm(VmRow {
            id: vm.0,
            name: name.to_string(),
            priority: params.priority,
            weight: params.weight,
        });
    }

    /// A VM is being removed; `stats` are its last scheduler figures (kept
    /// so its counters do not go back to 0).
    pub fn vm_removed(&mut self, vm: VmId, stats: Option<VmStats>) {
        if let (Some(v), Some(s)) = (self.vms.get_mut(&vm), stats) {
            v.final_figures = Some((s.gpu_ns, s.preemptions));
        }
        self.published.retain(|_, p| p.vm != vm);
        if self.vms.contains_key(&vm) && !self.removed.contains(&vm) {
            self.removed.push_back(vm);
        }
        while self.removed.len() > RETAINED_REMOVED_VMS {
            if let Some(old) = self.removed.pop_front() {
                self.vms.remove(&old);
                self.rec.forget_vm(old.0);
            }
        }
    }

    /// The guard's event totals of VM `vm` as it is removed (carried into a
    /// later registration of its name, as its scheduler figures are).
    pub fn vm_guard_final(&mut self, vm: VmId, totals: crate::guard::GuardTotals) {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.final_guard = Some(totals);
        }
    }

    /// VMs whose figures are kept: live ones and at most
    /// [`RETAINED_REMOVED_VMS`] removed ones.
    pub fn vm_count(&self) -> usize {
        self.vms.len()
    }

    /// A queue error of `vm` found outside the binding's notices (a bad
    /// completion signal or write-pointer address).
    pub fn queue_error(&mut self, vm: VmId, reason: &QueueErrorReason) {
        self.count_error(vm, crate::vgpu::error_code(reason).to_string());
    }

    /// A load of `vm` refused by its front end (bad MQD) with
    /// `CP_HQD_ERROR` `code`: the guest saw a queue error the binding never
    /// did; `n` such refusals at once.
    pub fn load_refused(&mut self, vm: VmId, code: u32, n: u64) {
        if let Some(v) = self.vms.get_mut(&vm) {
            *v.queue_errors.entry(code.to_string()).or_insert(0) += n;
        }
    }

    fn count_error(&mut self, vm: VmId, code: String) {
        if let Some(v) = self.vms.get_mut(&vm) {
            *v.queue_errors.entry(code).or_insert(0) += 1;
        }
    }

    /// A doorbell of `vm` caused a preemption; `ns` from reading it to the
    /// binding returning.
    pub fn doorbell_preempted(&mut self, vm: VmId, ns: u64) {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.doorbell_to_preemption.observe_ns(ns);
        }
    }

    /// A GPU event, before the binding handles it.
    pub fn gpu_event(&mut self, ev: &GpuEvent) {
        if let GpuEvent::Unmapped {
            slot,
            tag,
            mode,
            save_ns,
            at,
            ..
        } = ev
        {
            let s = slot.0 as usize;
            let Some((q, vm)) = self.on_slot.get(s).copied().flatten() else {
                return;
            };
            if q != *tag {
                return;
            }
            let kind = if *mode == DequeueMode::SaveWaves {
                if let Some(v) = self.vms.get_mut(&vm) {
                    v.cwsr_save.observe_ns(*save_ns);
                }
                SpanKind::Save
            } else {
                SpanKind::Drain
            };
            let d = self.rec.dequeued(*at, slot.0, *save_ns, kind);
            if let (Some((mq, by)), Some(d)) = (self.marked[s], d) {
                if mq == q {
                    self.rec.preempt(d.start_ns, slot.0, vm.0, by.map(|b| b.0));
                }
            }
            self.on_slot[s] = None;
            self.restore_start[s] = None;
            self.marked[s] = None;
        }
    }

    /// A binding notice about a queue of `vm`, at `now`.
    pub fn notice<O: Copy>(&mut self, now: Nanos, n: &Notice<O>, vm: VmId, gpu: &dyn PhysGpu) {
        match n {
            Notice::Mapped { queue, slot, .. } => {
                let s = slot.0 as usize;
                if s >= self.on_slot.len() {
                    return;
                }
                self.on_slot[s] = Some((queue.0, vm));
                self.marked[s] = None;
                let restoring = gpu
                    .query(*slot)
                    .is_some_and(|st| st.tag == queue.0 && st.state == SlotState::Restoring);
                let kind = if restoring {
                    self.restore_start[s] = Some(now);
                    SpanKind::Restore
                } else {
                    self.restore_start[s] = None;
                    SpanKind::Run
                };
                self.rec.begin(now, slot.0, vm.0, queue.0, kind);
            }
            Notice::Completed {
                queue, dispatch_id, ..
            } => self.packet_completed(now, queue.0, *dispatch_id),
            Notice::Removed { queue, .. } => {
                self.published.remove(&queue.0);
            }
            Notice::QueueError { reason, .. } => self.queue_error(vm, reason),
            Notice::MapRefused { .. } => self.count_error(vm, "map_refused".into()),
            Notice::Preempted {
                queue,
                slot,
                by,
                reason,
                ..
            } => self.preempted(vm, queue.0, *slot, *by, *reason),
            Notice::Aged { .. } => {
                if let Some(v) = self.vms.get_mut(&vm) {
                    v.promise.aging_boosts += 1;
                }
            }
            Notice::ArmTimer { .. } | Notice::Unmapped { .. } => {}
        }
    }

    /// Queue `queue` of `vm` on `slot` is preempted for VM `by` (if one),
    /// for `reason`: counted for both VMs, and marked on the timeline when
    /// its dequeue finishes.
    fn preempted(
        &mut self,
        vm: VmId,
        queue: u64,
        slot: SlotId,
        by: Option<VmId>,
        reason: PreemptReason,
    ) {
        let other = by.filter(|b| *b != vm);
        if let Some(m) = self.marked.get_mut(slot.0 as usize) {
            *m = Some((queue, other));
        }
        if let Some(v) = self.vms.get_mut(&vm) {
            if reason == PreemptReason::Aging {
                v.promise.preempted_by_aging += 1;
            }
            if let Some(b) = other {
                *v.preempted_by.entry(b).or_insert(0) += 1;
            }
        }
        if let Some(b) = other.and_then(|b| self.vms.get_mut(&b)) {
            b.promise.preemptions_caused += 1;
        }
    }

    /// `ns` of CU time of `vm`'s completed workgroups.
    pub fn cu_time(&mut self, vm: VmId, ns: u64) {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.promise.cu_ns = v.promise.cu_ns.saturating_add(ns);
        }
    }

    /// Brings the demand counters to `now` (each VM's state since the last
    /// sample counts up to `now`) and samples the states anew from `bind`;
    /// unless `force`, only when [`DEMAND_SAMPLE_NS`] passed since the last
    /// sample.
    pub fn sample_demand<O: Copy>(&mut self, now: Nanos, bind: &Binding<O>, force: bool) {
        let dt = match self.demand_at {
            Some(t) if !force && now < t.saturating_add(DEMAND_SAMPLE_NS) => return,
            Some(t) => now.saturating_sub(t),
            None => 0,
        };
        self.demand_at = Some(now);
        bind.demand_states(&mut self.demand_buf);
        for (id, v) in self.vms.iter_mut() {
            let p = &mut v.promise;
            if p.demanding {
                p.demanding_ns = p.demanding_ns.saturating_add(dt);
            }
            if p.waiting {
                p.wait_ns = p.wait_ns.saturating_add(dt);
            }
            let (d, w) = if v.final_figures.is_some() {
                (false, false)
            } else {
                self.demand_buf.get(id).copied().unwrap_or((false, false))
            };
            p.demanding = d;
            p.waiting = w;
        }
    }

    /// After binding calls or a GPU advance, at `now`: ends finished
    /// restores, marks policy, priority and weight changes and waits, and
    /// samples demand ([`Telemetry::sample_demand`]).
    pub fn after<O: Copy>(&mut self, now: Nanos, bind: &Binding<O>, gpu: &dyn PhysGpu) {
        self.sample_demand(now, bind, false);
        for s in 0..self.restore_start.len() {
            let Some(t0) = self.restore_start[s] else {
                continue;
            };
            let Some((q, vm)) = self.on_slot[s] else {
                self.restore_start[s] = None;
                continue;
            };
            let still = gpu
                .query(SlotId(s as u32))
                .is_some_and(|st| st.tag == q && st.state == SlotState::Restoring);
            if !still {
                self.restore_start[s] = None;
                if let Some(v) = self.vms.get_mut(&vm) {
                    v.cwsr_restore.observe_ns(now.saturating_sub(t0));
                }
                if self.rec.open_on(s as u32) == Some((SpanKind::Restore, q)) {
                    self.rec.begin(now, s as u32, vm.0, q, SpanKind::Run);
                }
            }
        }
        self.note_changes_and_waits(now, bind.scheduler());
    }

    /// Marks policy, priority and weight changes on the timeline and
    /// records which VMs wait (work ready, no queue on a slot, not paused).
    fn note_changes_and_waits(&mut self, now: Nanos, sched: &scheduler::Scheduler) {
        let policy = sched.config().policy;
        if self.seen_policy.is_some_and(|p| p != policy) {
            self.rec
                .mark(now, None, format!("policy {}", policy.name()));
        }
        self.seen_policy = Some(policy);
        for (&vm, v) in self.vms.iter_mut() {
            let id = vm;
            let Some(p) = sched.vm_params(id) else {
                // Gone: a wait still open ends now.
                self.rec.set_waiting(now, vm.0, false);
                continue;
            };
            let (prio, weight) = v.seen_params;
            if p.priority != prio {
                self.rec.mark(
                    now,
                    Some(vm.0),
                    format!("priority {prio} -> {}", p.priority),
                );
            }
            if p.weight != weight {
                self.rec
                    .mark(now, Some(vm.0), format!("weight {weight} -> {}", p.weight));
            }
            v.seen_params = (p.priority, p.weight);
            let waiting =
                sched.vm_waiting(id).unwrap_or(false) && !sched.vm_paused(id).unwrap_or(false);
            self.rec.set_waiting(now, vm.0, waiting);
        }
    }

    /// Per-VM telemetry by VM id.
    pub fn vms(&self) -> impl Iterator<Item = (&VmId, &VmTelemetry)> {
        self.vms.iter()
    }

    /// Partition of each user HQD slot (slot id order).
    pub fn slot_partitions(&self) -> &[u32] {
        &self.slot_part
    }

    /// A doorbell of `vm`'s queue `queue` (tag) read write index `wptr` at
    /// `now`. Remembered when the write index moved; the ring keeps at most
    /// [`PUBLISHED_RING`] doorbells per queue (when full, the newest entry
    /// takes the new write index and keeps its older time, so latency is
    /// over- rather than under-estimated). Allocates only on a queue's first
    /// doorbell.
    pub fn doorbell_published(&mut self, vm: VmId, queue: u64, wptr: u64, now: Nanos) {
        let p = self.published.entry(queue).or_insert_with(|| Published {
            vm,
            ring: VecDeque::with_capacity(PUBLISHED_RING),
            last_wptr: 0,
        });
        if p.vm != vm || wptr <= p.last_wptr {
            return;
        }
        p.last_wptr = wptr;
        if p.ring.len() >= PUBLISHED_RING {
            if let Some(back) = p.ring.back_mut() {
                back.0 = wptr;
            }
        } else {
            p.ring.push_back((wptr, now));
        }
    }

    /// Packet `index` of queue `queue` (tag) completed at `now`: records the
    /// latency from the doorbell covering it (the oldest remembered one whose
    /// write index is past `index`) and forgets doorbells fully completed.
    fn packet_completed(&mut self, now: Nanos, queue: u64, index: u64) {
        let Some(p) = self.published.get_mut(&queue) else {
            return;
        };
        let end = index.saturating_add(1);
        while p.ring.front().is_some_and(|(w, _)| *w < end) {
            p.ring.pop_front();
        }
        let Some(&(w, at)) = p.ring.front() else {
            return;
        };
        if w == end {
            p.ring.pop_front();
        }
        if let Some(v) = self.vms.get_mut(&p.vm) {
            v.packet_latency.observe_ns(now.saturating_sub(at));
            v.packet_latency_sketch.record_ns(now.saturating_sub(at));
        }
    }

    /// The timeline recorder.
    pub fn recorder(&self) -> &Recorder {
        &self.rec
    }

    /// The last `window_ns` (all kept history if `None`) up to `now`, with
    /// the VMs' current priority and weight from `bind`.
    pub fn timeline<O: Copy>(
        &self,
        now: Nanos,
        window_ns: Option<Nanos>,
        bind: &Binding<O>,
    ) -> Timeline {
        let mut t = self.rec.snapshot(now, window_ns);
        Self::refresh_rows(&mut t, bind);
        t
    }

    /// The history in `[from_ns, to_ns]` (e.g. part of a finished `hqdmux
    /// sim` run).
    pub fn timeline_between<O: Copy>(
        &self,
        from_ns: Nanos,
        to_ns: Nanos,
        bind: &Binding<O>,
    ) -> Timeline {
        let mut t = self.rec.clip(from_ns, to_ns);
        Self::refresh_rows(&mut t, bind);
        t
    }

    fn refresh_rows<O: Copy>(t: &mut Timeline, bind: &Binding<O>) {
        for row in &mut t.vms {
            if let Some(p) = bind.scheduler().vm_params(VmId(row.id)) {
                row.priority = p.priority;
                row.weight = p.weight;
            }
        }
    }
}

#[cfg(test)]
#[path = "telemetry_tests.rs"]
mod tests;
