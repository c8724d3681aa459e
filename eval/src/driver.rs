//! The virtual-time run: tenants write real AQL packets (hqdmux `mark`
//! kernels, one counter per workgroup) into their VMs' memory and ring
//! doorbells; the scheduler decides which queue holds which HQD slot; the
//! simulated GPU executes, saves and restores. Every completed kernel's
//! counters are checked: 0 = a lost effect, >1 = a duplicated one.

use crate::report::{jain, percentile, PolicyReport, VmGpuReport};
use crate::scenario::{Arrival, Behaviour, Class, Scenario, ThinkDist};
use abi::aql::{KernelDispatch, Packet};
use abi::kernel::{Kernarg, KernelDescriptor, KernelKind};
use gpu::backend::{GpuEvent, PhysGpu};
use gpu::mem::{DmaMemory, SparseMemory};
use gpu::topology::GpuTopology;
use gpusim::sim::testkit::{GuestQueue, TestVm};
use gpusim::SimGpu;
use mdev::binding::{ArmedDoorbell, Binding, Notice};
use mdev::telemetry::Telemetry;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use scheduler::{Nanos, Policy, QueueId, SchedConfig, VmId, VmParams};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// Ring size of every modelled queue (packets).
const RING_PACKETS: u32 = 512;
/// Declared memory of one modelled VM (sparse).
const VM_BYTES: u64 = 1 << 44;
/// Work-items per workgroup (informational for the model).
const WG_ITEMS: u16 = 64;
/// Most `mark` counters of one kernel: workgroups past them have no effect
/// (a 2^31-workgroup flood checks its first 4096).
const MAX_COUNTERS: u32 = 4096;

/// The run could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// GPU override invalid.
    #[error("scenario '{0}': [gpu]: {1}")]
    Gpu(String, String),
    /// Scheduler refused the set-up.
    #[error("scenario '{0}': scheduler: {1}")]
    Sched(String, scheduler::SchedError),
    /// More jobs arrived than one run records ([`MAX_JOBS`]): an open-loop
    /// arrival rate far above what the GPU serves, over a long run.
    #[error(
        "scenario '{0}': more than {1} jobs arrived (each is recorded): shorten `duration_ms` \
         or lower the arrival rate"
    )]
    TooManyJobs(String, usize),
}

/// Most jobs one run records (every arrived job is kept in `RunOutput::jobs`).
pub const MAX_JOBS: usize = 4_000_000;

/// Raw results of one simulation.
#[derive(Debug, Default, Clone)]
pub struct RunOutput {
    /// Latencies of completed hi jobs (ns).
    pub hi_latency_ns: Vec<u64>,
    /// Hi jobs that missed their SLA (completed late, or unfinished and already late).
    pub hi_sla_misses: u64,
    /// Hi jobs counted (completed, plus unfinished ones already past their SLA).
    pub hi_jobs_counted: u64,
    /// Per VM: (tenant index, priority, weight, class, CU-ns of completed kernels).
    pub vms: Vec<(usize, u8, u32, Class, u128)>,
    /// Every job that arrived, in arrival order.
    pub jobs: Vec<JobRecord>,
    /// Mark counters left at 0 in completed kernels.
    pub lost_effects: u64,
    /// Extra increments seen in completed kernels and, at the end, in
    /// kernels still in flight.
    pub duplicate_effects: u64,
    /// Queue errors.
    pub queue_errors: u64,
    /// Preemptions issued by the scheduler (its counter).
    pub preemptions: u64,
    /// Preemptions the binding said ([`Notice::Preempted`]); equal to
    /// `preemptions` (each is said exactly once).
    pub preempted_notices: u64,
    /// Of those, preemptions for a queue boosted by aging.
    pub preempted_by_aging: u64,
    /// Aging boosts the scheduler counted (`VmStats::aging_boosts`, all VMs).
    pub aging_boosts: u64,
    /// Aging boosts the binding said ([`Notice::Aged`]); equal to
    /// `aging_boosts`.
    pub aged_notices: u64,
    /// Queues reset after a preemption timeout (also in `queue_errors`).
    pub preempt_timeouts: u64,
    /// Modelled save + restore ns.
    pub save_restore_ns: u64,
    /// Slot-occupancy integral / (slots x duration).
    pub hqd_utilisation: f64,
    /// Workgroups the GPU completed.
    pub workgroups: u64,
    /// Host ns per scheduler event (handle + action collection).
    pub decision_ns: Vec<u64>,
    /// Total CUs.
    pub cus: u64,
    /// Simulated duration (ns).
    pub duration_ns: u64,
    /// The simulator's own counters.
    pub gpu: gpusim::SimStats,
    /// Per VM, in VM order (tenant entries in file order, `count` each).
    pub vm_runs: Vec<VmRun>,
    /// Host wall time of this simulation alone (set-up, run and figures;
    /// not the isolated baselines `evaluate` adds), ns.
    pub host_ns: u64,
    /// Host CPU time of the same (the simulating thread's), ns: the cost
    /// without the time a loaded machine kept the thread waiting.
    pub host_cpu_ns: u64,
    /// Timer expiries the driver delivered to the binding (`Tick` events
    /// for an armed deadline; live changes not counted).
    pub timer_ticks: u64,
}

/// What one VM got in a run.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct VmRun {
    /// `NAME`, or `NAME-i` for the i-th (from 0) VM of an entry with `count` > 1.
    pub name: String,
    /// Tenant entry index.
    pub tenant: usize,
    /// Metric class of its entry.
    pub class: Option<Class>,
    /// VM priority at the end of the run (live changes applied).
    pub priority: u8,
    /// VM weight at the end of the run.
    pub weight: u32,
    /// GPU time the scheduler charged it (`VmStats::gpu_ns`), ns.
    pub gpu_ns: u64,
    /// Part of `gpu_ns` its preempted queues' dequeues spent waiting for
    /// their own non-preemptible waves (`VmStats::save_wait_ns`), ns.
    pub save_wait_ns: u64,
    /// CU-ns of its completed kernels.
    pub cu_ns: u128,
    /// CU-ns its workgroups received up to the end of the run, as the
    /// backend credits them ([`PhysGpu::take_cu_time`]: completed
    /// workgroups, and the part done of those a save cut), whether or not
    /// their kernel completed. Unlike `cu_ns` it does not leave out the
    /// work of kernels still in flight at the end (a VM of many queues or
    /// a deep backlog can have several ms of partition time in them); the
    /// part done of workgroups running at the end is in it
    /// (`SimGpu::running_cu_time`).
    pub cu_used_ns: u128,
    /// GPU time its completed kernels take alone on the partition (per
    /// kernel: workgroup rounds x modelled workgroup cost), ns: its real use.
    pub work_ns: u64,
    /// When its last kernel completed (virtual ns; 0: none did): `cu_ns`
    /// is its CU time up to then, with no kernel cut by the run's end.
    pub last_done_ns: Nanos,
    /// Latencies of its completed jobs, ns, in completion order.
    pub latency_ns: Vec<u64>,
    /// Dequeues of its queues that interrupted work (`VmStats::preemptions`):
    /// the switches its shape paid for.
    pub preemptions: u64,
    /// Longest time one of its queues had work without holding a slot, ns.
    pub max_wait_ns: u64,
    /// Longest a job of this VM took from arrival to completion, or has
    /// waited by the end of the run if still unfinished, ns.
    pub max_job_age_ns: u64,
    /// Its queues reset after a preemption timeout (error 22).
    pub preempt_resets: u64,
    /// When its first such reset was reported (virtual ns).
    pub first_reset_ns: Option<Nanos>,
    /// Its other queue errors.
    pub queue_errors: u64,
    /// The partition the scheduler placed it in.
    pub partition: u32,
}

/// Per-queue readiness (work seen, no slot) and per-VM latencies, fed from
/// the driver's events and actions; kept apart from the scheduler<->GPU glue.
#[derive(Debug, Default)]
struct VmTracker {
    /// Per stream: since when it has work without a slot.
    ready_since: Vec<Option<Nanos>>,
    /// Per stream: longest such interval so far.
    max_wait: Vec<Nanos>,
    /// Per stream: stopped on an error (no longer waits).
    dead: Vec<bool>,
    /// Per VM: completed job latencies.
    latency: Vec<Vec<u64>>,
    /// Per VM: (preemption-timeout resets, first reset time, other queue errors).
    errors: Vec<(u64, Option<Nanos>, u64)>,
}

impl VmTracker {
    fn new(streams: usize, vms: usize) -> Self {
        VmTracker {
            ready_since: vec![None; streams],
            max_wait: vec![0; streams],
            dead: vec![false; streams],
            latency: vec![Vec::new(); vms],
            errors: vec![(0, None, 0); vms],
        }
    }

    /// Stream `s` has (new) work; `mapped`: it holds a slot.
    fn work(&mut self, s: usize, mapped: bool, now: Nanos) {
        if !mapped && !self.dead[s] && self.ready_since[s].is_none() {
            self.ready_since[s] = Some(now);
        }
    }

    /// Stream `s` got a slot.
    fn mapped(&mut self, s: usize, now: Nanos) {
        if let Some(t) = self.ready_since[s].take() {
            self.max_wait[s] = self.max_wait[s].max(now.saturating_sub(t));
        }
    }

    /// Stream `s` lost its slot, with or without work left.
    fn unmapped(&mut self, s: usize, has_work: bool, now: Nanos) {
        if has_work {
            self.work(s, false, now);
        }
    }

    /// Stream `s` stopped on an error: it waits no more.
    fn stopped(&mut self, s: usize, now: Nanos) {
        self.mapped(s, now);
        self.dead[s] = true;
    }

    /// Closes the open intervals at the end of the run.
    fn finish(&mut self, now: Nanos) {
        for s in 0..self.ready_since.len() {
            self.mapped(s, now);
        }
    }
}

/// One job of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobRecord {
    /// Tenant entry index.
    pub tenant: usize,
    /// Stream (queue) index over the whole run.
    pub stream: usize,
    /// VM index (VM order, as `RunOutput::vm_runs`).
    pub vm: usize,
    /// Arrival time (virtual ns).
    pub arrival_ns: Nanos,
    /// Arrival to completion of its last kernel (`None`: unfinished).
    pub latency_ns: Option<Nanos>,
}

struct Stream {
    vm: usize,
    tenant: usize,
    queue: QueueId,
    gq: GuestQueue,
    rng: SmallRng,
    trace_idx: usize,
    /// Shift of this stream's trace times (ns).
    trace_shift: Nanos,
    backlog: VecDeque<u64>,
}

struct VmModel {
    tvm: TestVm,
    tenant: usize,
    /// Kernel descriptor per kernel spec of the tenant.
    kds: Vec<u64>,
    cu_ns: u128,
    work_ns: u64,
    last_done_ns: Nanos,
}

struct Job {
    stream: usize,
    arrival: Nanos,
    kernels_left: u32,
}

struct Kern {
    job: u64,
    block: u64,
    /// Counters (checked workgroups).
    n: u32,
    /// Workgroups.
    groups: u32,
    cost_ns: u64,
}

struct Sim<'a> {
    sc: &'a Scenario,
    now: Nanos,
    gpu: SimGpu,
    /// The scheduler <-> GPU binding the VMM's arbiter runs too (owner:
    /// stream index).
    bind: Binding<usize>,
    /// A doorbell's preemption prepared before it is rung, as the VMM's
    /// arbiter does for recently rung vHQDs (see [`Sim::ring`]).
    armed: ArmedDoorbell,
    vms: Vec<VmModel>,
    streams: Vec<Stream>,
    arrivals: BinaryHeap<Reverse<(Nanos, usize)>>,
    timer: Option<Nanos>,
    jobs: BTreeMap<u64, Job>,
    kernels: HashMap<(usize, u64), Kern>,
    free_blocks: HashMap<(usize, u32), Vec<u64>>,
    occ_area: u128,
    occ_t: Nanos,
    notices: Vec<Notice<usize>>,
    /// Pending live changes, earliest last.
    changes: Vec<crate::scenario::Change>,
    /// Per-VM figures.
    track: VmTracker,
    out: RunOutput,
    /// Timeline recording (`hqdmux sim --timeline`), off by default.
    tele: Option<Telemetry>,
    /// The run stopped at [`MAX_JOBS`].
    too_many_jobs: bool,
}

/// Topology of a scenario: MI300X defaults with its overrides.
pub fn topology(sc: &Scenario) -> Result<GpuTopology, EvalError> {
    sc.topology()
        .map_err(|(field, reason)| EvalError::Gpu(sc.name.clone(), format!("{field}: {reason}")))
}

/// Simulates `sc` under `policy` with arrival seed `seed`.
pub fn simulate(sc: &Scenario, policy: Policy, seed: u64) -> Result<RunOutput, EvalError> {
    simulate_inner(sc, policy, seed, false).map(|(r, _)| r)
}

/// [`simulate`], also recording the whole run's HQD-slot timeline (spans
/// of each VM's queues running, being saved and restored per slot, and
/// preemptions; times in virtual ns from the start of the run).
pub fn simulate_timeline(
    sc: &Scenario,
    policy: Policy,
    seed: u64,
) -> Result<(RunOutput, timeline::Timeline), EvalError> {
    simulate_inner(sc, policy, seed, true).map(|(r, t)| (r, t.expect("recording was asked for")))
}

fn simulate_inner(
    sc: &Scenario,
    policy: Policy,
    seed: u64,
    record: bool,
) -> Result<(RunOutput, Option<timeline::Timeline>), EvalError> {
    let started = Instant::now();
    let cpu_started = thread_cpu_ns();
    let topo = topology(sc)?;
    let cfg = SchedConfig {
        policy,
        ..sc.scheduler.clone().unwrap_or_default()
    };
    let err = |e| EvalError::Sched(sc.name.clone(), e);
    let mut bind: Binding<usize> = Binding::new(&topo, cfg).map_err(err)?;
    bind.set_decision_clock(Some({
        let t0 = Instant::now();
        Box::new(move || t0.elapsed().as_nanos() as u64)
    }));
    let gpu = SimGpu::new(topo.clone(), seed)
        .map_err(|e| EvalError::Gpu(sc.name.clone(), e.to_string()))?;
    let mut vms = Vec::new();
    let mut streams = Vec::new();
    for (ti, t) in sc.tenants.iter().enumerate() {
        for _ in 0..t.count {
            let vm_idx = vms.len();
            bind.add_vm(
                VmId(vm_idx as u32),
                VmParams {
                    priority: t.priority,
                    weight: t.weight,
                    partition: None,
                },
            )
            .map_err(err)?;
            if let Some(ms) = t.preempt_timeout_ms {
                bind.set_preempt_timeout(VmId(vm_idx as u32), ms.saturating_mul(1_000_000))
                    .map_err(err)?;
            }
            let mem: Arc<dyn DmaMemory> = Arc::new(SparseMemory::new(VM_BYTES));
            let mut tvm = TestVm::with_memory(mem.clone(), 0x1000);
            let kds = t
                .kernels
                .iter()
                .map(|k| {
                    let kd = tvm.alloc(64, 64);
                    mem.write(
                        kd,
                        &KernelDescriptor::new(KernelKind::Mark, k.cost_ns())
                            .with_vgprs(k.vgprs)
                            .with_flags(if k.no_save_point {
                                abi::kernel::flags::NO_SAVE_POINT
                            } else {
                                0
                            })
                            .encode(),
                    )
                    .expect("descriptor inside VM memory");
                    kd
                })
                .collect();
            for _ in 0..t.queues {
                // The queue priority lives in the guest's MQD, as the
                // mediator reads it.
                let gq = tvm.queue(&topo, RING_PACKETS, t.queue_priority as u32);
                let queue = QueueId(streams.len() as u64);
                let qprio = gq.mqd.queue_priority().min(15) as u8;
                bind.add_queue(
                    VmId(vm_idx as u32),
                    queue,
                    streams.len(),
                    qprio,
                    gq.mqd.clone(),
                    mem.clone(),
                )
                .map_err(err)?;
                let sidx = streams.len() as u64;
                streams.push(Stream {
                    vm: vm_idx,
                    tenant: ti,
                    queue,
                    gq,
                    rng: SmallRng::seed_from_u64(
                        seed ^ (sidx + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    ),
                    trace_idx: 0,
                    trace_shift: 0,
                    backlog: VecDeque::new(),
                });
            }
            vms.push(VmModel {
                tvm,
                tenant: ti,
                kds,
                cu_ns: 0,
                work_ns: 0,
                last_done_ns: 0,
            });
        }
    }
    let (streams_len, vms_len) = (streams.len(), vms.len());
    let mut sim = Sim {
        sc,
        now: 0,
        gpu,
        bind,
        armed: ArmedDoorbell::default(),
        vms,
        streams,
        arrivals: BinaryHeap::new(),
        timer: None,
        jobs: BTreeMap::new(),
        kernels: HashMap::new(),
        free_blocks: HashMap::new(),
        occ_area: 0,
        occ_t: 0,
        notices: Vec::new(),
        changes: {
            let mut c = sc.changes.clone();
            c.sort_by_key(|c| std::cmp::Reverse(c.at_ms));
            c
        },
        track: VmTracker::new(streams_len, vms_len),
        out: RunOutput::default(),
        tele: record.then(|| Telemetry::new(&topo, timeline::RingLimits::UNBOUNDED)),
        too_many_jobs: false,
    };
    if let Some(t) = &mut sim.tele {
        for (i, name) in sc.vm_names().iter().enumerate() {
            let id = VmId(i as u32);
            let s = sim.bind.scheduler();
            if let (Some(p), Some(part)) = (s.vm_params(id), s.vm_partition(id)) {
                t.vm_added(VmId(i as u32), name, &p, part);
            }
        }
    }
    sim.first_arrivals();
    sim.run();
    if sim.too_many_jobs {
        return Err(EvalError::TooManyJobs(sc.name.clone(), MAX_JOBS));
    }
    let tl = sim
        .tele
        .as_ref()
        .map(|t| t.timeline(sim.now, None, &sim.bind));
    let mut out = sim.finish(&topo);
    out.host_ns = started.elapsed().as_nanos() as u64;
    out.host_cpu_ns = thread_cpu_ns().saturating_sub(cpu_started);
    Ok((out, tl))
}

/// CPU time the calling thread has used, ns (0 if the clock is not
/// available).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call writes only it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

impl Sim<'_> {
    fn first_arrivals(&mut self) {
        // Index of each stream among the streams of its tenant entry.
        let mut per_tenant: HashMap<usize, u64> = HashMap::new();
        for i in 0..self.streams.len() {
            let t = &self.sc.tenants[self.streams[i].tenant];
            let k = per_tenant.entry(self.streams[i].tenant).or_default();
            let idx = *k;
            *k += 1;
            let n = (t.count * t.queues) as u64;
            match &t.arrival {
                Arrival::Uniform {
                    period_us,
                    offset_us,
                } => self.arrive_at((offset_us + idx * period_us / n) * 1000, i),
                Arrival::Poisson { .. } => {
                    let t0 = self.next_gap(i);
                    self.arrive_at(t0, i)
                }
                Arrival::Closed { outstanding, .. } => {
                    for _ in 0..*outstanding {
                        self.arrive_at(idx * 1000, i);
                    }
                }
                Arrival::Flood { depth } => {
                    for _ in 0..*depth {
                        self.arrive_at(idx * 1000, i);
                    }
                }
                // One heap entry per burst (the arrival makes `jobs` jobs).
                Arrival::Bursty { offset_us, .. } => self.arrive_at(offset_us * 1000, i),
                Arrival::Trace {
                    times_us,
                    queue_offset_us,
                } => {
                    let shift = idx * queue_offset_us * 1000;
                    self.streams[i].trace_shift = shift;
                    if let Some(t0) = times_us.first() {
                        self.streams[i].trace_idx = 1;
                        self.arrive_at(t0 * 1000 + shift, i);
                    }
                }
            }
        }
    }

    fn arrive_at(&mut self, at: Nanos, stream: usize) {
        self.arrivals.push(Reverse((at, stream)));
    }

    /// Next open-loop gap of a Poisson stream (ns).
    fn next_gap(&mut self, i: usize) -> Nanos {
        let t = &self.sc.tenants[self.streams[i].tenant];
        let Arrival::Poisson { mean_us } = t.arrival else {
            return 0;
        };
        self.exponential(i, mean_us)
    }

    /// An exponential draw of mean `mean_us` from stream `i`'s generator (ns).
    fn exponential(&mut self, i: usize, mean_us: u64) -> Nanos {
        let u: f64 = self.streams[i].rng.gen::<f64>();
        (-(1.0 - u).ln() * mean_us as f64 * 1000.0) as Nanos
    }

    fn run(&mut self) {
        let end = self.sc.duration_ms * 1_000_000;
        let mut evs = Vec::new();
        loop {
            let mut t = u64::MAX;
            if let Some(d) = self.gpu.next_deadline() {
                t = t.min(d);
            }
            if let Some(Reverse((a, _))) = self.arrivals.peek() {
                t = t.min(*a);
            }
            if let Some(tm) = self.timer {
                t = t.min(tm);
            }
            if let Some(c) = self.changes.last() {
                t = t.min(c.at_ms * 1_000_000);
            }
            if t > end {
                break;
            }
            self.now = self.now.max(t);
            self.account_occupancy();
            evs.clear();
            self.gpu.advance(self.now, &mut evs);
            for ev in evs.drain(..) {
                self.gpu_event(ev);
            }
            if let Some(t) = &mut self.tele {
                // Restores the GPU finished while advancing.
                t.after(self.now, &self.bind, &self.gpu);
            }
            while let Some(&Reverse((a, s))) = self.arrivals.peek() {
                if a > self.now {
                    break;
                }
                self.arrivals.pop();
                self.arrival(s);
            }
            if self.out.jobs.len() > MAX_JOBS {
                self.too_many_jobs = true;
                return;
            }
            let mut tick = self.timer.is_some_and(|tm| tm <= self.now);
            if tick {
                self.out.timer_ticks += 1;
            }
            while self
                .changes
                .last()
                .is_some_and(|c| c.at_ms * 1_000_000 <= self.now)
            {
                let c = self.changes.pop().unwrap();
                self.apply_change(&c);
                tick = true;
            }
            if tick {
                // Only a timer that fired is spent: a change's tick leaves
                // one still to come armed (the binding hands a deadline
                // out once, `Notice::ArmTimer`, and does not again for the
                // same one: dropped here, the scheduler's next deadline
                // was lost until some GPU event came, e.g. an aging batch
                // of 2 ms that ran 185 ms, fuzz seed 700078).
                if self.timer.is_some_and(|tm| tm <= self.now) {
                    self.timer = None;
                }
                self.bind.tick(&mut self.gpu, self.now, &mut self.notices);
                self.handle_notices();
            }
        }
        self.now = end;
        self.account_occupancy();
    }

    /// Operator steering: new priority/weight for every VM of a tenant
    /// entry, and/or a new policy (take effect at the tick that follows).
    fn apply_change(&mut self, c: &crate::scenario::Change) {
        if let Some(p) = c.policy {
            self.bind.set_policy(p);
            log::debug!("t={} ns: policy {}", self.now, p.name());
        }
        let Some(name) = &c.tenant else { return };
        for (i, v) in self.vms.iter().enumerate() {
            if &self.sc.tenants[v.tenant].name != name {
                continue;
            }
            let vm = VmId(i as u32);
            if let Some(p) = c.priority {
                self.bind.set_vm_priority(vm, p).expect("validated change");
            }
            if let Some(w) = c.weight {
                self.bind.set_vm_weight(vm, w).expect("validated change");
            }
            log::debug!("t={} ns: vm {i} ({name}) changed", self.now);
        }
    }

    /// Integrates slot occupancy up to `now` (occupancy only changes at
    /// event times, and this runs before any event of a new time).
    fn account_occupancy(&mut self) {
        self.occ_area += self.bind.occupied() as u128 * (self.now - self.occ_t) as u128;
        self.occ_t = self.now;
    }

    /// A job (a burst of jobs for `bursty`) arrives on stream `s`:
    /// open-loop streams schedule the next one.
    fn arrival(&mut self, s: usize) {
        let t = &self.sc.tenants[self.streams[s].tenant];
        let mut n = 1;
        match &t.arrival {
            Arrival::Bursty {
                jobs, period_us, ..
            } => {
                n = *jobs;
                self.arrive_at(self.now + period_us * 1000, s)
            }
            Arrival::Uniform { period_us, .. } => self.arrive_at(self.now + period_us * 1000, s),
            Arrival::Poisson { .. } => {
                let g = self.next_gap(s);
                self.arrive_at(self.now + g.max(1), s)
            }
            Arrival::Trace { times_us, .. } => {
                let i = self.streams[s].trace_idx;
                if let Some(&at) = times_us.get(i) {
                    self.streams[s].trace_idx += 1;
                    let at = at * 1000 + self.streams[s].trace_shift;
                    self.arrive_at(at.max(self.now), s);
                }
            }
            Arrival::Closed { .. } | Arrival::Flood { .. } => {}
        }
        if t.behaviour == Behaviour::Dbflood {
            // Rings without work: the doorbell carries the unchanged index.
            let st = &self.streams[s];
            let (queue, wptr) = (st.queue, st.gq.wptr);
            self.ring(queue, wptr);
            return;
        }
        for _ in 0..n {
            self.new_job(s);
        }
        self.submit_backlog(s);
    }

    /// Records a job of stream `s` and puts it in the stream's backlog.
    fn new_job(&mut self, s: usize) {
        let t = &self.sc.tenants[self.streams[s].tenant];
        let kernels: u32 = t.kernels.iter().map(|k| k.repeat).sum();
        // A job's id is its index in `RunOutput::jobs`.
        let id = self.out.jobs.len() as u64;
        self.out.jobs.push(JobRecord {
            tenant: self.streams[s].tenant,
            stream: s,
            vm: self.streams[s].vm,
            arrival_ns: self.now,
            latency_ns: None,
        });
        self.jobs.insert(
            id,
            Job {
                stream: s,
                arrival: self.now,
                kernels_left: kernels,
            },
        );
        self.streams[s].backlog.push_back(id);
    }

    /// Writes backlogged jobs into the ring while they fit, then rings the doorbell.
    fn submit_backlog(&mut self, s: usize) {
        let mut rang = false;
        while let Some(&job) = self.streams[s].backlog.front() {
            let st = &self.streams[s];
            let t = &self.sc.tenants[st.tenant];
            let need: u64 = t.kernels.iter().map(|k| k.repeat as u64).sum();
            let vm = st.vm;
            let read = self.vms[vm].tvm.read_index(&st.gq);
            let used = st.gq.wptr.saturating_sub(read);
            if used + need > st.gq.ring_packets {
                break;
            }
            self.streams[s].backlog.pop_front();
            for (ki, k) in t.kernels.iter().enumerate() {
                for _ in 0..k.repeat {
                    self.push_kernel(s, job, ki, k.workgroups, k.cost_ns());
                }
            }
            rang = true;
        }
        if rang {
            let st = &self.streams[s];
            let (queue, wptr) = (st.queue, st.gq.wptr);
            let on_gpu = self.bind.on_gpu(queue);
            self.track.work(s, on_gpu, self.now);
            self.ring(queue, wptr);
        }
    }

    /// A doorbell of `queue` with write index `wptr`, the way the VMM's
    /// arbiter serves one: the preemption prepared for it (armed) goes to
    /// the GPU first, then the binding decides. (In virtual time the
    /// preparation is made right before; the VMM makes it at the end of
    /// its previous turn, with nothing changed since.)
    fn ring(&mut self, queue: QueueId, wptr: u64) {
        if self.bind.arm_doorbell(queue, self.now, &mut self.armed) {
            self.bind
                .fire_armed(&mut self.gpu, self.now, &self.armed, wptr);
        }
        self.bind
            .doorbell(&mut self.gpu, self.now, queue, wptr, &mut self.notices);
        self.handle_notices();
    }

    fn push_kernel(&mut self, s: usize, job: u64, spec: usize, groups: u32, cost_ns: u64) {
        let n = groups.min(MAX_COUNTERS);
        let vm = self.streams[s].vm;
        let block = match self.free_blocks.get_mut(&(vm, n)).and_then(|v| v.pop()) {
            Some(b) => b,
            None => self.vms[vm].tvm.alloc(64 + 4 * n as u64, 64),
        };
        let v = &mut self.vms[vm];
        let (ka, len) = Kernarg::Mark {
            counters: block + 64,
            n,
        }
        .encode();
        v.tvm
            .mem
            .write(block, &ka[..len])
            .expect("kernarg inside VM memory");
        let (wg_items, lds) = self.sc.tenants[self.streams[s].tenant]
            .kernels
            .get(spec)
            .map_or((WG_ITEMS, 0), |k| (k.wg_items, k.lds_bytes));
        // 1-item workgroups for grids past the 32-bit work-item limit.
        let items = if groups as u64 * wg_items as u64 > u32::MAX as u64 {
            1
        } else {
            wg_items
        };
        let mut d = KernelDispatch::one_d(v.kds[spec], block, items, groups, 0);
        d.group_segment_size = lds;
        // Kernels of a job depend on each other: barrier bit set (in order).
        let wptr = v
            .tvm
            .push(&mut self.streams[s].gq, &Packet::dispatch(d, true));
        if self.sc.tenants[self.streams[s].tenant].behaviour == Behaviour::Stall {
            // The body is written, the header never published.
            let slot =
                self.streams[s].gq.ring + ((wptr - 1) % self.streams[s].gq.ring_packets) * 64;
            v.tvm
                .mem
                .write(slot, &abi::aql::INVALID_HEADER.to_le_bytes())
                .expect("ring inside VM memory");
        }
        self.kernels.insert(
            (s, wptr - 1),
            Kern {
                job,
                block,
                n,
                groups,
                cost_ns: cost_ns.max(self.gpu.params().wg_floor_ns),
            },
        );
    }

    fn gpu_event(&mut self, ev: GpuEvent) {
        if let Some(t) = &mut self.tele {
            t.gpu_event(&ev);
        }
        self.bind
            .gpu_event(&mut self.gpu, self.now, ev, &mut self.notices);
        self.handle_notices();
    }

    /// Carries out what the binding asked for (in order).
    fn handle_notices(&mut self) {
        let mut notices = std::mem::take(&mut self.notices);
        for n in notices.drain(..) {
            if let (Some(t), Some(o)) = (&mut self.tele, n.owner()) {
                t.notice(self.now, &n, VmId(self.streams[o].vm as u32), &self.gpu);
            }
            match n {
                Notice::ArmTimer { at } => self.timer = Some(at),
                Notice::Completed {
                    owner, dispatch_id, ..
                } => self.completed(owner, dispatch_id),
                Notice::QueueError { owner, reason, .. } => {
                    log::warn!("scenario {}: queue {owner}: {reason}", self.sc.name);
                    self.out.queue_errors += 1;
                    self.track.stopped(owner, self.now);
                    self.note_error(owner, &reason);
                }
                Notice::MapRefused { owner, error, .. } => {
                    log::warn!(
                        "scenario {}: map of queue {owner} refused: {error}",
                        self.sc.name
                    );
                    self.out.queue_errors += 1;
                    self.track.stopped(owner, self.now);
                }
                Notice::Mapped { owner, .. } => self.track.mapped(owner, self.now),
                Notice::Unmapped {
                    owner, has_work, ..
                } => self.track.unmapped(owner, has_work, self.now),
                Notice::Preempted { reason, .. } => {
                    self.out.preempted_notices += 1;
                    if reason == mdev::binding::PreemptReason::Aging {
                        self.out.preempted_by_aging += 1;
                    }
                }
                Notice::Aged { .. } => self.out.aged_notices += 1,
                Notice::Removed { .. } => {}
            }
        }
        if let Some(t) = &mut self.tele {
            t.after(self.now, &self.bind, &self.gpu);
        }
        // Reuse the allocation (a completion may have queued more notices).
        if self.notices.is_empty() {
            self.notices = notices;
        }
    }

    fn completed(&mut self, s: usize, dispatch_id: u64) {
        let Some(k) = self.kernels.remove(&(s, dispatch_id)) else {
            return;
        };
        let vm = self.streams[s].vm;
        let mem = self.vms[vm].tvm.mem.clone();
        for x in read_counters(mem.as_ref(), &k) {
            match x {
                0 => self.out.lost_effects += 1,
                1 => {}
                x => self.out.duplicate_effects += x as u64 - 1,
            }
        }
        mem.write(k.block + 64, &vec![0u8; 4 * k.n as usize])
            .expect("counters inside VM memory");
        self.free_blocks.entry((vm, k.n)).or_default().push(k.block);
        self.vms[vm].cu_ns += k.groups as u128 * k.cost_ns as u128;
        self.vms[vm].last_done_ns = self.now;
        let cus = self.gpu.topology().cus_per_partition().max(1) as u64;
        let rounds = (k.groups as u64).div_ceil(cus);
        self.vms[vm].work_ns = self.vms[vm]
            .work_ns
            .saturating_add(rounds.saturating_mul(k.cost_ns));
        let job = self.jobs.get_mut(&k.job).expect("job of a kernel");
        job.kernels_left -= 1;
        if job.kernels_left == 0 {
            let job = self.jobs.remove(&k.job).unwrap();
            let t = &self.sc.tenants[self.streams[job.stream].tenant];
            let lat = self.now - job.arrival;
            self.out.jobs[k.job as usize].latency_ns = Some(lat);
            self.track.latency[vm].push(lat);
            if t.class == Class::Hi {
                self.out.hi_latency_ns.push(lat);
                self.out.hi_jobs_counted += 1;
                if lat > t.sla_ns().unwrap_or(u64::MAX) {
                    self.out.hi_sla_misses += 1;
                }
            }
            match t.arrival {
                Arrival::Closed {
                    think_us,
                    think_dist,
                    ..
                } => {
                    let think = match think_dist {
                        ThinkDist::Fixed => think_us * 1000,
                        ThinkDist::Exponential => self.exponential(s, think_us),
                    };
                    self.arrive_at(self.now + think, s)
                }
                Arrival::Flood { .. } => self.arrive_at(self.now, s),
                _ => {}
            }
        }
        self.submit_backlog(s);
    }

    fn finish(mut self, topo: &GpuTopology) -> RunOutput {
        let end = self.now;
        // Kernels still in flight: an effect applied twice already counts
        // (a 0 is not lost yet).
        for (&(s, _), k) in &self.kernels {
            let mem = &self.vms[self.streams[s].vm].tvm.mem;
            for x in read_counters(mem.as_ref(), k) {
                self.out.duplicate_effects += x.saturating_sub(1) as u64;
            }
        }
        // Unfinished hi jobs already past their SLA are misses.
        for job in self.jobs.values() {
            let t = &self.sc.tenants[self.streams[job.stream].tenant];
            if t.class == Class::Hi {
                let sla = t.sla_ns().unwrap_or(0);
                if end - job.arrival > sla {
                    self.out.hi_sla_misses += 1;
                    self.out.hi_jobs_counted += 1;
                }
            }
        }
        for (i, v) in self.vms.iter().enumerate() {
            let t = &self.sc.tenants[v.tenant];
            let _ = i;
            self.out
                .vms
                .push((v.tenant, t.priority, t.weight, t.class, v.cu_ns));
        }
        // Before `vm_runs`' closing tick (whose actions are not carried out).
        self.out.preemptions = self.bind.scheduler().stats().preemptions;
        self.out.aging_boosts = (0..self.vms.len() as u32)
            .filter_map(|i| self.bind.scheduler().vm_stats(VmId(i)))
            .map(|s| s.aging_boosts)
            .sum();
        self.out.preempt_timeouts = self.bind.stats().preempt_timeouts;
        self.out.vm_runs = self.vm_runs(end);
        let st = self.gpu.stats();
        self.out.gpu = st.clone();
        self.out.decision_ns = self.bind.decision_ns().to_vec();
        self.out.save_restore_ns = st.save_ns_total + st.restore_ns_total;
        self.out.workgroups = st.wgs_completed;
        self.out.cus = (topo.cus_per_xcc * topo.xccs) as u64;
        self.out.duration_ns = end;
        let nslots = topo.user_slots().len() as u128;
        self.out.hqd_utilisation = if end == 0 {
            0.0
        } else {
            self.occ_area as f64 / (nslots * end as u128) as f64
        };
        self.out
    }
}

impl Sim<'_> {
    /// Per-VM figures at the end of the run. A last tick brings the
    /// scheduler's GPU-time accounting up to `end` (its actions are not
    /// carried out: the run is over).
    fn vm_runs(&mut self, end: Nanos) -> Vec<VmRun> {
        self.bind.close_books(end);
        self.track.finish(end);
        let mut max_wait = vec![0; self.vms.len()];
        for (s, st) in self.streams.iter().enumerate() {
            max_wait[st.vm] = max_wait[st.vm].max(self.track.max_wait[s]);
        }
        let names = self.sc.vm_names();
        let mut used = vec![0u128; self.vms.len()];
        // The model's clock stands at its last event, which may be long
        // before the end (a partition of long workgroups has none until
        // they end): bring it to the end, so that the part done of the
        // workgroups running then is read at the end of the run. Every
        // event up to `end` has been processed (`run` stops at the first
        // one after it), so this fires none.
        let mut evs = Vec::new();
        self.gpu.advance(end, &mut evs);
        debug_assert!(evs.is_empty(), "events at the end: {evs:?}");
        let mut credit = Vec::new();
        self.gpu.take_cu_time(&mut credit);
        // With the part done of the workgroups running at the end (the
        // queue that holds the partition then would lose up to a slice).
        self.gpu.running_cu_time(&mut credit);
        for (tag, ns) in credit {
            if let Some(vm) = self.bind.queue_vm(QueueId(tag)) {
                if let Some(u) = used.get_mut(vm.0 as usize) {
                    *u = u.saturating_add(ns as u128);
                }
            }
        }
        let mut age = vec![0; self.vms.len()];
        for j in &self.out.jobs {
            let vm = self.streams[j.stream].vm;
            let a = j.latency_ns.unwrap_or(end.saturating_sub(j.arrival_ns));
            age[vm] = age[vm].max(a);
        }
        self.vms
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let t = &self.sc.tenants[v.tenant];
                let id = VmId(i as u32);
                let params = self.bind.scheduler().vm_params(id).unwrap_or(VmParams {
                    priority: t.priority,
                    weight: t.weight,
                    partition: None,
                });
                VmRun {
                    name: names[i].clone(),
                    tenant: v.tenant,
                    class: Some(t.class),
                    priority: params.priority,
                    weight: params.weight,
                    gpu_ns: self.bind.scheduler().vm_stats(id).map_or(0, |s| s.gpu_ns),
                    save_wait_ns: self
                        .bind
                        .scheduler()
                        .vm_stats(id)
                        .map_or(0, |s| s.save_wait_ns),
                    cu_ns: v.cu_ns,
                    cu_used_ns: used[i],
                    preemptions: self
                        .bind
                        .scheduler()
                        .vm_stats(id)
                        .map_or(0, |s| s.preemptions),
                    work_ns: v.work_ns,
                    last_done_ns: v.last_done_ns,
                    latency_ns: std::mem::take(&mut self.track.latency[i]),
                    max_wait_ns: max_wait[i],
                    max_job_age_ns: age[i],
                    preempt_resets: self.track.errors.get(i).map_or(0, |e| e.0),
                    first_reset_ns: self.track.errors.get(i).and_then(|e| e.1),
                    queue_errors: self.track.errors.get(i).map_or(0, |e| e.2),
                    partition: self.bind.scheduler().vm_partition(id).unwrap_or(0),
                }
            })
            .collect()
    }
}

impl Sim<'_> {
    /// Per-VM error counts (issue 11): resets after a preemption timeout
    /// apart from other queue errors.
    fn note_error(&mut self, stream: usize, reason: &gpu::backend::QueueErrorReason) {
        let vm = self.streams[stream].vm;
        let e = &mut self.track.errors;
        if e.len() <= vm {
            e.resize(vm + 1, (0, None, 0));
        }
        match reason {
            gpu::backend::QueueErrorReason::PreemptionTimeout { .. } => {
                e[vm].0 += 1;
                e[vm].1.get_or_insert(self.now);
            }
            _ => e[vm].2 += 1,
        }
    }
}

/// The per-VM rows and the Jain index per priority level of a run (over
/// CU time / weight of every VM at the level, as `jain_index`: the work a VM
/// received, whatever the scheduler charged).
pub fn vm_reports(run: &RunOutput) -> (Vec<VmGpuReport>, BTreeMap<u8, Option<f64>>) {
    let total: f64 = run.vm_runs.iter().map(|v| v.gpu_ns as f64).sum();
    let us = |ns: u64| ns as f64 / 1000.0;
    let rows = run
        .vm_runs
        .iter()
        .map(|v| {
            let mut lat = v.latency_ns.clone();
            lat.sort_unstable();
            VmGpuReport {
                name: v.name.clone(),
                priority: v.priority,
                weight: v.weight,
                gpu_time_us: us(v.gpu_ns),
                cu_time_us: v.cu_ns as f64 / 1000.0,
                share: if total > 0.0 {
                    v.gpu_ns as f64 / total
                } else {
                    0.0
                },
                jobs: lat.len() as u64,
                p50_us: percentile(&lat, 0.5).map(us),
                p99_us: percentile(&lat, 0.99).map(us),
                max_wait_us: us(v.max_wait_ns),
            }
        })
        .collect();
    let mut levels: BTreeMap<u8, Vec<f64>> = BTreeMap::new();
    for v in &run.vm_runs {
        levels
            .entry(v.priority)
            .or_default()
            .push(v.cu_ns as f64 / v.weight.max(1) as f64);
    }
    let jain_by_level = levels.into_iter().map(|(p, x)| (p, jain(&x))).collect();
    (rows, jain_by_level)
}

/// The `mark` counters of a kernel.
fn read_counters(mem: &dyn DmaMemory, k: &Kern) -> Vec<u32> {
    let mut b = vec![0u8; 4 * k.n as usize];
    mem.read(k.block + 64, &mut b)
        .expect("counters inside VM memory");
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `x` per millisecond of a run of `duration_ns` virtual ns (0 for an
/// empty run).
pub fn per_virtual_ms(x: f64, duration_ns: u64) -> f64 {
    if duration_ns == 0 {
        0.0
    } else {
        x / (duration_ns as f64 / 1e6)
    }
}

/// Runs `sc` under `policy` (and its hi tenants alone, for the isolated
/// baseline) and computes the report row.
pub fn evaluate(sc: &Scenario, policy: Policy, seed: u64) -> Result<PolicyReport, EvalError> {
    evaluate_full(sc, policy, seed).map(|(r, _)| r)
}

/// [`evaluate`], also returning the raw output of the (full) run.
pub fn evaluate_full(
    sc: &Scenario,
    policy: Policy,
    seed: u64,
) -> Result<(PolicyReport, RunOutput), EvalError> {
    evaluate_with(sc, policy, seed, true)
}

/// [`evaluate_full`], running the isolated baseline (the hi tenants
/// alone) only when `isolated`. Without it a scenario with both classes
/// reports no `hi_isolated_p99_us` (`None`) and every other field is the
/// same: callers that do not read it (the promise fuzzer's alone runs and
/// families without an RT latency item) save a whole run.
pub fn evaluate_with(
    sc: &Scenario,
    policy: Policy,
    seed: u64,
    isolated: bool,
) -> Result<(PolicyReport, RunOutput), EvalError> {
    let t0 = Instant::now();
    let run = simulate(sc, policy, seed)?;
    let has_hi = sc.tenants.iter().any(|t| t.class == Class::Hi);
    let has_lo = sc.tenants.iter().any(|t| t.class == Class::Lo);
    let mut hi = run.hi_latency_ns.clone();
    hi.sort_unstable();
    let iso_p99 = if has_hi && has_lo && !isolated {
        None
    } else if has_hi && has_lo {
        let mut iso = simulate(&sc.only(Class::Hi), policy, seed)?.hi_latency_ns;
        iso.sort_unstable();
        percentile(&iso, 0.99)
    } else {
        percentile(&hi, 0.99)
    };
    let us = |ns: u64| ns as f64 / 1000.0;
    let capacity = run.cus as f64 * run.duration_ns as f64;
    let cu_of = |c: Class| -> f64 {
        run.vms
            .iter()
            .filter(|v| v.3 == c)
            .map(|v| v.4 as f64)
            .sum()
    };
    let (hi_cu, lo_cu) = (cu_of(Class::Hi), cu_of(Class::Lo));
    let lo_ret = (has_lo && capacity > hi_cu).then(|| lo_cu / (capacity - hi_cu));
    // Jain over the lo VMs of the priority level with the most lo VMs
    // (ties: the lower level).
    let mut by_prio: BTreeMap<u8, Vec<f64>> = BTreeMap::new();
    for v in run.vms.iter().filter(|v| v.3 == Class::Lo) {
        by_prio
            .entry(v.1)
            .or_default()
            .push(v.4 as f64 / v.2 as f64);
    }
    let level = by_prio
        .iter()
        .max_by_key(|(p, xs)| (xs.len(), Reverse(**p)))
        .map(|(_, xs)| xs.clone())
        .unwrap_or_default();
    let mut dec = run.decision_ns.clone();
    dec.sort_unstable();
    let (vms, jain_by_level) = vm_reports(&run);
    let report = PolicyReport {
        scenario: sc.name.clone(),
        policy: policy.name().into(),
        seed,
        hi_p50_us: percentile(&hi, 0.5).map(us),
        hi_p99_us: percentile(&hi, 0.99).map(us),
        hi_p999_us: percentile(&hi, 0.999).map(us),
        hi_isolated_p99_us: iso_p99.map(us),
        hi_sla_miss_rate: (run.hi_jobs_counted > 0)
            .then(|| run.hi_sla_misses as f64 / run.hi_jobs_counted as f64),
        hi_jobs: hi.len() as u64,
        lo_throughput_retained: lo_ret,
        jain_index: jain(&level),
        preemptions: run.preemptions,
        save_restore_us_total: us(run.save_restore_ns),
        hqd_utilisation: run.hqd_utilisation,
        lost_effects: run.lost_effects,
        duplicate_effects: run.duplicate_effects,
        queue_errors: run.queue_errors,
        workgroups: run.workgroups,
        decision_p99_ns: percentile(&dec, 0.99).unwrap_or(0) as f64,
        host_ms: t0.elapsed().as_secs_f64() * 1000.0,
        host_ms_per_virtual_ms: per_virtual_ms(run.host_ns as f64 / 1e6, run.duration_ns),
        host_cpu_ms_per_virtual_ms: per_virtual_ms(run.host_cpu_ns as f64 / 1e6, run.duration_ns),
        decisions_per_virtual_ms: per_virtual_ms(run.decision_ns.len() as f64, run.duration_ns),
        vms,
        jain_by_level,
    };
    Ok((report, run))
}

#[cfg(test)]
mod notice_tests {
    use super::*;

    /// The built-in `aging` scenario (two priority-1 VMs starved by two
    /// always-busy priority-10 VMs), in virtual time: the scheduler ages
    /// and preempts for aging, and the binding says each preemption and
    /// each boost exactly once (its notices = the scheduler's counters),
    /// while every workgroup's effect lands exactly once.
    #[test]
    fn aging_scenario_says_each_preemption_and_boost_once() {
        let sc = Scenario::builtin("aging").unwrap();
        let out = simulate(&sc, Policy::Hqdmux, 1).unwrap();
        assert_eq!((out.lost_effects, out.duplicate_effects), (0, 0));
        assert!(
            out.aging_boosts > 0 && out.preempted_by_aging > 0,
            "{out:?}"
        );
        assert_eq!(out.aged_notices, out.aging_boosts);
        assert_eq!(out.preempted_notices, out.preemptions);
    }
}

#[cfg(test)]
mod cu_used_tests {
    use super::*;

    /// Two equal VMs slicing the partition in 1 ms quanta, every
    /// workgroup 50 ms long: no kernel completes in the 20 ms run, so
    /// completed kernels say neither did any work, while the backend
    /// credits what each received (the part done of its saved waves).
    /// That CU time is bounded by the partition time each was billed and
    /// close to it (one ns of partition per CU-ns but the saves and
    /// restores), and the two VMs received the same.
    #[test]
    fn cu_used_counts_the_work_of_kernels_cut_by_the_end() {
        let sc = Scenario::parse(
            "name = \"cut\"\nduration_ms = 20\nseed = 1\n\
             [scheduler]\nquantum_ns = [1000000, 1000000, 1000000, 1000000, \
             1000000, 1000000, 1000000, 1000000, 1000000, 1000000, 1000000, \
             1000000, 1000000, 1000000, 1000000, 1000000]\n\
             [[tenant]]\nname = \"eq\"\npriority = 4\nclass = \"lo\"\ncount = 2\n\
             arrival = { kind = \"flood\", depth = 1 }\n\
             [[tenant.kernel]]\nworkgroups = 304\nwg_cost_us = 50000\n",
            "cut.toml",
        )
        .unwrap();
        let out = simulate(&sc, Policy::Hqdmux, 1).unwrap();
        assert_eq!(out.vm_runs.len(), 2);
        let cus = out.cus as u128;
        for v in &out.vm_runs {
            assert_eq!(v.cu_ns, 0, "{}: no kernel completes", v.name);
            let held = v.gpu_ns as u128 * cus;
            assert!(
                v.cu_used_ns <= held,
                "{}: {} > {held}",
                v.name,
                v.cu_used_ns
            );
            assert!(
                v.cu_used_ns * 10 >= held * 7,
                "{}: {} of {held}",
                v.name,
                v.cu_used_ns
            );
        }
        let (a, b) = (out.vm_runs[0].cu_used_ns, out.vm_runs[1].cu_used_ns);
        assert!(a.abs_diff(b) * 10 <= a.max(b), "{a} {b}");
    }

    /// One VM, one kernel of a whole partition of 10 ms workgroups, a 5 ms
    /// run: the model's last event is the dispatch at 0, and the part done
    /// of the running workgroups is read at the end of the run (5 ms of
    /// every CU), not at that last event (nothing).
    #[test]
    fn cu_used_reads_the_running_workgroups_at_the_end_of_the_run() {
        let sc = Scenario::parse(
            "name = \"long\"\nduration_ms = 5\nseed = 1\n\
             [[tenant]]\nname = \"top\"\npriority = 4\nclass = \"lo\"\n\
             arrival = { kind = \"flood\", depth = 1 }\n\
             [[tenant.kernel]]\nworkgroups = 304\nwg_cost_us = 10000\n",
            "long.toml",
        )
        .unwrap();
        let out = simulate(&sc, Policy::Hqdmux, 1).unwrap();
        let v = &out.vm_runs[0];
        assert_eq!(v.cu_ns, 0, "no kernel completes");
        let whole = out.cus as u128 * 5_000_000;
        assert!(
            v.cu_used_ns * 100 >= whole * 99 && v.cu_used_ns <= whole,
            "{} of {whole}",
            v.cu_used_ns
        );
    }
}

#[cfg(test)]
mod evaluate_with_tests {
    use super::*;

    /// Without its isolated baseline a run of both classes reports no
    /// isolated p99 and every other field as with it (host time aside).
    #[test]
    fn skipping_the_isolated_run_changes_only_its_field() {
        let mut sc = Scenario::builtin("prio-inv").unwrap();
        sc.duration_ms = 40;
        let (mut with, run_with) = evaluate_full(&sc, Policy::Hqdmux, 1).unwrap();
        let (mut without, run_without) = evaluate_with(&sc, Policy::Hqdmux, 1, false).unwrap();
        assert!(with.hi_jobs > 0, "the hi tenant completes jobs: {with:?}");
        assert!(with.hi_isolated_p99_us.is_some());
        assert_eq!(without.hi_isolated_p99_us, None);
        for r in [&mut with, &mut without] {
            r.hi_isolated_p99_us = None;
            r.host_ms = 0.0;
            r.host_ms_per_virtual_ms = 0.0;
            r.host_cpu_ms_per_virtual_ms = 0.0;
            r.decision_p99_ns = 0.0;
        }
        assert_eq!(with, without);
        assert_eq!(run_with.hi_latency_ns, run_without.hi_latency_ns);
    }
}

#[cfg(test)]
mod change_timer_tests {
    use super::*;

    /// Two equal VMs of one level, each a flood of one kernel of 100 ms
    /// whole-partition workgroups (nothing completes in the run), and a
    /// weight change to the same value at 1 ms: the slices go round by the
    /// scheduler's timer alone. The change's tick dropped the driver's
    /// timer while the binding, whose deadline was unchanged, armed none
    /// again, so the VM mapped first kept the partition for the whole run
    /// (the other got 0 ns).
    #[test]
    fn a_change_keeps_the_schedulers_timer() {
        let sc = Scenario::parse(
            "name = \"chg\"\nduration_ms = 60\nseed = 1\n\
             [[tenant]]\nname = \"a\"\npriority = 4\nclass = \"lo\"\n\
             arrival = { kind = \"flood\", depth = 1 }\n\
             [[tenant.kernel]]\nworkgroups = 304\nwg_cost_us = 100000\n\
             [[tenant]]\nname = \"b\"\npriority = 4\nclass = \"lo\"\n\
             arrival = { kind = \"flood\", depth = 1 }\n\
             [[tenant.kernel]]\nworkgroups = 304\nwg_cost_us = 100000\n\
             [[change]]\nat_ms = 1\ntenant = \"a\"\nweight = 1\n",
            "chg.toml",
        )
        .unwrap();
        let out = simulate(&sc, Policy::Hqdmux, 1).unwrap();
        let (a, b) = (out.vm_runs[0].gpu_ns, out.vm_runs[1].gpu_ns);
        assert!(
            a >= 20_000_000 && b >= 20_000_000,
            "billed a {a} ns, b {b} ns of a 60 ms run"
        );
    }
}
