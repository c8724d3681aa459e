//! Prometheus text exposition (format 0.0.4) of the arbiter's telemetry.
//!
//! Names live in the `hqdmux_` namespace and follow the AMD
//! device-metrics-exporter's conventions: snake-case names, one metric
//! family per quantity, the exporter's device labels (`gpu_id`,
//! `gpu_compute_partition_type`, `hostname`, and `gpu_partition_id` where a
//! series is about one partition: [`MetricsInfo`]) plus the VM's name as
//! `vm`, so series join with the exporter's on those labels; counters end
//! in `_total`, times are seconds.
//! `docs/metrics.md` lists every family. The HTTP route `GET /metrics`
//! returns [`crate::arbiter::GpuArbiter::metrics_text`] with content type
//! [`CONTENT_TYPE`].

use crate::binding::Binding;
use crate::guard::{GuardEvent, Trip};
use crate::telemetry::Telemetry;
use crate::topology::PartitionMode;
use scheduler::{SlotId, VmId};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds (s) of the CWSR save/restore histograms' buckets.
pub const CWSR_BUCKETS: &[f64] = &[
    5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
];

/// Upper bounds (s) of the doorbell-to-preemption histogram's buckets.
pub const DOORBELL_BUCKETS: &[f64] = &[
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 1e-2,
];

/// Upper bounds (s) of the packet latency (doorbell to completion)
/// histogram's buckets.
pub const PACKET_LATENCY_BUCKETS: &[f64] = &[
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
];

/// A cumulative histogram of durations (seconds), Prometheus style.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative), plus one for `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over bucket upper bounds `bounds` (increasing).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one duration of `ns` nanoseconds.
    pub fn observe_ns(&mut self, ns: u64) {
        let s = ns as f64 / 1e9;
        let i = self
            .bounds
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += s;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of the observations (s).
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// `(upper bound, cumulative count)` per bucket, `+Inf` last.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        self.bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&self.counts)
            .map(|(b, c)| {
                acc += c;
                (b, acc)
            })
            .collect()
    }

    /// Estimated `q` quantile (0..=1) in seconds, interpolated linearly
    /// inside the bucket that holds it (the last finite bound for `+Inf`);
    /// `None` without observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count as f64;
        let mut below = 0u64;
        let mut lower = 0.0;
        for (i, &c) in self.counts.iter().enumerate() {
            let Some(&upper) = self.bounds.get(i) else {
                return Some(lower);
            };
            if c > 0 && (below + c) as f64 >= rank {
                let frac = ((rank - below as f64) / c as f64).clamp(0.0, 1.0);
                return Some(lower + (upper - lower) * frac);
            }
            below += c;
            lower = upper;
        }
        Some(lower)
    }
}

/// What the process knows beyond the GPU's telemetry: the device labels
/// every series carries and the figures only the VMM has (build, VM
/// states). The arbiter adds `gpu_compute_partition_type` from its
/// topology.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsInfo {
    /// `gpu_id`: the GPU's index on the host (its `[[gpu]] id`; 0 for one `[gpu]`).
    pub gpu_id: u32,
    /// `hostname`.
    pub hostname: String,
    /// `hqdmux_build_info{version}`.
    pub version: String,
    /// `hqdmux_build_info{commit}` (`unknown` when not built from git).
    pub commit: String,
    /// `hqdmux_vm_state`: each VM's life-cycle state (one of `states`) by
    /// its id at the arbiter (`VmId`'s number); VMs absent here get no
    /// state series.
    pub vm_states: BTreeMap<VmId, &'static str>,
    /// Every state `hqdmux_vm_state` enumerates (one series per state).
    pub states: &'static [&'static str],
    /// `hqdmux_vm_entitled_share` and `hqdmux_vm_received_share`: each
    /// VM's `(entitled, received)` fraction of its partition's compute over
    /// the VMM's last sample interval ([`crate::promise`]), by VM id; VMs
    /// absent here get no such series.
    pub promise: BTreeMap<VmId, (f64, f64)>,
}

impl MetricsInfo {
    /// GPU 0 of this host (its hostname; callers set `gpu_id`), this crate's version, commit
    /// `unknown`, no VM states.
    pub fn local() -> Self {
        MetricsInfo {
            gpu_id: 0,
            hostname: hostname(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            commit: "unknown".to_owned(),
            vm_states: BTreeMap::new(),
            states: &[],
            promise: BTreeMap::new(),
        }
    }
}

/// This host's name (`gethostname`), `unknown` if it cannot be read.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at
    // most that many bytes.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(s) if !s.is_empty() => s.to_owned(),
        _ => "unknown".into(),
    }
}

/// The `gpu_compute_partition_type` label of a partition mode, as AMD's
/// exporter writes it.
pub fn partition_type(mode: PartitionMode) -> &'static str {
    match mode {
        PartitionMode::Spx => "SPX",
        PartitionMode::Dpx => "DPX",
        PartitionMode::Qpx => "QPX",
        PartitionMode::Cpx => "CPX",
    }
}

/// Why a VM's vGPU is quarantined, as the `reason` label of
/// `hqdmux_vm_quarantined` (a small fixed set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuarantineReason {
    /// Not quarantined (`none`, value 0).
    None,
    /// The guard tripped on preemption-timeout resets (`guard_resets`).
    GuardResets,
    /// The guard tripped on queue errors (`guard_queue_errors`).
    GuardQueueErrors,
    /// The guard tripped on stale doorbells (`guard_stale_doorbells`).
    GuardStaleDoorbells,
    /// The guard tripped on save waits for the VM's own waves without a
    /// save point (`guard_save_waits`).
    GuardSaveWaits,
    /// A host bug while serving the VM (`host_bug`).
    HostBug,
}

impl QuarantineReason {
    /// From the arbiter's state: a host-bug quarantine first, then the
    /// guard's trip.
    pub fn of(host_bug: bool, trip: Option<Trip>) -> Self {
        match (host_bug, trip.map(|t| t.what)) {
            (true, _) => QuarantineReason::HostBug,
            (false, Some(GuardEvent::Reset)) => QuarantineReason::GuardResets,
            (false, Some(GuardEvent::QueueError)) => QuarantineReason::GuardQueueErrors,
            (false, Some(GuardEvent::StaleDoorbell)) => QuarantineReason::GuardStaleDoorbells,
            (false, Some(GuardEvent::SaveWait)) => QuarantineReason::GuardSaveWaits,
            (false, None) => QuarantineReason::None,
        }
    }

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            QuarantineReason::None => "none",
            QuarantineReason::GuardResets => "guard_resets",
            QuarantineReason::GuardQueueErrors => "guard_queue_errors",
            QuarantineReason::GuardStaleDoorbells => "guard_stale_doorbells",
            QuarantineReason::GuardSaveWaits => "guard_save_waits",
            QuarantineReason::HostBug => "host_bug",
        }
    }
}

/// What the arbiter knows of one VM beyond telemetry (by VM id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmGuardFigures {
    /// Quarantine and why.
    pub quarantine: QuarantineReason,
    /// Guard events since the VM was added: resets, queue errors, stale
    /// doorbells, save-wait ns (`GuardStatus::totals`).
    pub guard_totals: crate::guard::GuardTotals,
}

/// Everything [`render_with`] prints beyond telemetry and the binding.
#[derive(Clone, Debug)]
pub struct RenderContext<'a> {
    /// Device labels, build and VM states.
    pub info: &'a MetricsInfo,
    /// `gpu_compute_partition_type`.
    pub partition_type: &'static str,
    /// Per VM id: quarantine and guard counts (VMs absent: no such series).
    pub guard: &'a BTreeMap<VmId, VmGuardFigures>,
    /// Quarantines by the guard since start (the GPU's counter).
    pub guard_quarantines: u64,
}

/// Escapes a label value (backslash, double quote, line feed).
pub fn label_value(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

fn fmt_f64(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        // `{}` prints the shortest representation that round-trips.
        format!("{v}")
    }
}

/// Writes one family's `# HELP` and `# TYPE` lines.
fn family(b: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(b, "# HELP {name} {help}");
    let _ = writeln!(b, "# TYPE {name} {kind}");
}

/// Picks one histogram of a VM's telemetry.
type HistOf = fn(&crate::telemetry::VmTelemetry) -> &Histogram;

/// One VM's figures, as [`render`] prints them.
#[derive(Clone, Debug)]
pub struct VmFigures<'a> {
    /// `vm` label.
    pub name: &'a str,
    /// `gpu_partition_id` label.
    pub partition: u32,
    /// Priority (gauge; `None` once the VM is gone).
    pub priority: Option<u8>,
    /// Weight (gauge; `None` once the VM is gone).
    pub weight: Option<u32>,
    /// GPU busy time charged (ns).
    pub gpu_ns: u64,
    /// Preemptions of its queues.
    pub preemptions: u64,
    /// Guard event totals of earlier registrations of its name (added to
    /// the live guard's).
    pub carried_guard: crate::guard::GuardTotals,
}

/// [`render_with`] for GPU 0 of this host ([`MetricsInfo::local`]), the
/// partition type read from the slots' partitions, no guard figures.
pub fn render<O: Copy>(tele: &Telemetry, bind: &Binding<O>) -> String {
    let parts = tele
        .slot_partitions()
        .iter()
        .copied()
        .max()
        .map_or(1, |m| m + 1);
    let mode = match parts {
        2 => PartitionMode::Dpx,
        4 => PartitionMode::Qpx,
        8 => PartitionMode::Cpx,
        _ => PartitionMode::Spx,
    };
    render_with(
        tele,
        bind,
        &RenderContext {
            info: &MetricsInfo::local(),
            partition_type: partition_type(mode),
            guard: &BTreeMap::new(),
            guard_quarantines: 0,
        },
    )
}

/// Renders the exposition of `tele` plus the scheduler's live figures from
/// `bind` (VM ids are the binding's `VmId`s) and what `ctx` adds: device
/// labels on every series, `hqdmux_build_info`, `hqdmux_vm_state`,
/// `hqdmux_vm_quarantined` and the guard's counters.
pub fn render_with<O: Copy>(tele: &Telemetry, bind: &Binding<O>, ctx: &RenderContext) -> String {
    let info = ctx.info;
    // The exporter's device labels but the partition, on every series.
    let dev = format!(
        "gpu_id=\"{}\",gpu_compute_partition_type=\"{}\",hostname=\"{}\"",
        info.gpu_id,
        ctx.partition_type,
        label_value(&info.hostname)
    );
    let sched = bind.scheduler();
    let mut rows = Vec::new();
    for (id, v) in tele.vms() {
        let vm = *id;
        let live = sched.vm_params(vm).zip(sched.vm_stats(vm));
        let (gpu_ns, preemptions) = match (&live, v.final_figures) {
            (Some((_, s)), _) => (s.gpu_ns, s.preemptions),
            (None, Some(f)) => f,
            (None, None) => (0, 0),
        };
        // Earlier registrations of the name (one series across reconnects).
        let (gpu_ns, preemptions) = (
            gpu_ns.saturating_add(v.carried.0),
            preemptions.saturating_add(v.carried.1),
        );
        rows.push((
            *id,
            VmFigures {
                name: &v.name,
                partition: sched.vm_partition(vm).unwrap_or(v.partition),
                priority: live.map(|(p, _)| p.priority),
                weight: live.map(|(p, _)| p.weight),
                gpu_ns,
                preemptions,
                carried_guard: v.carried_guard,
            },
        ));
    }
    let labels = |f: &VmFigures| {
        format!(
            "vm=\"{}\",gpu_id=\"{}\",gpu_partition_id=\"{}\",gpu_compute_partition_type=\"{}\",hostname=\"{}\"",
            label_value(f.name),
            info.gpu_id,
            f.partition,
            ctx.partition_type,
            label_value(&info.hostname)
        )
    };
    let part_labels = |p: u32| {
        format!(
            "gpu_id=\"{}\",gpu_partition_id=\"{p}\",gpu_compute_partition_type=\"{}\",hostname=\"{}\"",
            info.gpu_id,
            ctx.partition_type,
            label_value(&info.hostname)
        )
    };
    let mut b = String::new();
    family(
        &mut b,
        "hqdmux_build_info",
        "gauge",
        "Always 1: the hqdmux version and git commit serving these metrics.",
    );
    let _ = writeln!(
        b,
        "hqdmux_build_info{{version=\"{}\",commit=\"{}\",{dev}}} 1",
        label_value(&info.version),
        label_value(&info.commit)
    );
    family(
        &mut b,
        "hqdmux_vm_gpu_busy_seconds_total",
        "counter",
        "GPU time charged to the VM: time with at least one of its queues on an HQD slot running or being dequeued (includes its CWSR save and restore).",
    );
    for (_, f) in &rows {
        let _ = writeln!(
            b,
            "hqdmux_vm_gpu_busy_seconds_total{{{}}} {}",
            labels(f),
            fmt_f64(f.gpu_ns as f64 / 1e9)
        );
    }
    family(
        &mut b,
        "hqdmux_vm_preemptions_total",
        "counter",
        "Dequeues of the VM's queues that interrupted running work (CWSR save or reset) to give the slot to another queue.",
    );
    for (_, f) in &rows {
        let _ = writeln!(
            b,
            "hqdmux_vm_preemptions_total{{{}}} {}",
            labels(f),
            f.preemptions
        );
    }
    let hists: [(&str, &str, HistOf); 4] = [
        (
            "hqdmux_vm_cwsr_save_seconds",
            "Time from a CWSR dequeue request of one of the VM's queues to the slot being free (wave save).",
            |v| &v.cwsr_save,
        ),
        (
            "hqdmux_vm_cwsr_restore_seconds",
            "Time from mapping one of the VM's queues with saved waves to its waves running again (CWSR restore).",
            |v| &v.cwsr_restore,
        ),
        (
            "hqdmux_vm_doorbell_to_preemption_seconds",
            "Host time from reading a doorbell of the VM to the binding returning with the preemption(s) it caused handed to the GPU.",
            |v| &v.doorbell_to_preemption,
        ),
        (
            "hqdmux_vm_packet_latency_seconds",
            "Time from the doorbell that published a packet of the VM to that packet's completion.",
            |v| &v.packet_latency,
        ),
    ];
    for (name, help, get) in hists {
        family(&mut b, name, "histogram", help);
        for ((_, f), v) in rows.iter().zip(tele.vms().map(|(_, v)| v)) {
            let h = get(v);
            let l = labels(f);
            for (le, c) in h.cumulative() {
                let _ = writeln!(b, "{name}_bucket{{{l},le=\"{}\"}} {c}", fmt_f64(le));
            }
            let _ = writeln!(b, "{name}_sum{{{l}}} {}", fmt_f64(h.sum()));
            let _ = writeln!(b, "{name}_count{{{l}}} {}", h.count());
        }
    }
    family(
        &mut b,
        "hqdmux_vm_queue_errors_total",
        "counter",
        "Queues of the VM stopped on bad input, by CP_HQD_ERROR code (docs/vgpu-abi.md).",
    );
    for ((_, f), v) in rows.iter().zip(tele.vms().map(|(_, v)| v)) {
        for (code, n) in &v.queue_errors {
            let _ = writeln!(
                b,
                "hqdmux_vm_queue_errors_total{{{},code=\"{code}\"}} {n}",
                labels(f)
            );
        }
    }
    family(
        &mut b,
        "hqdmux_vm_priority",
        "gauge",
        "The VM's scheduling priority (0..15, higher wins).",
    );
    for (_, f) in &rows {
        if let Some(p) = f.priority {
            let _ = writeln!(b, "hqdmux_vm_priority{{{}}} {p}", labels(f));
        }
    }
    family(
        &mut b,
        "hqdmux_vm_weight",
        "gauge",
        "The VM's weight among VMs of its priority.",
    );
    for (_, f) in &rows {
        if let Some(w) = f.weight {
            let _ = writeln!(b, "hqdmux_vm_weight{{{}}} {w}", labels(f));
        }
    }
    let mut total: BTreeMap<u32, u64> = BTreeMap::new();
    let mut used: BTreeMap<u32, u64> = BTreeMap::new();
    for (i, p) in tele.slot_partitions().iter().enumerate() {
        *total.entry(*p).or_default() += 1;
        let u = used.entry(*p).or_default();
        if bind.slot_queue(SlotId(i as u32)).is_some() {
            *u += 1;
        }
    }
    family(
        &mut b,
        "hqdmux_hqd_slots_in_use",
        "gauge",
        "User HQD slots of the partition holding a VM's queue.",
    );
    for (p, n) in &used {
        let _ = writeln!(b, "hqdmux_hqd_slots_in_use{{{}}} {n}", part_labels(*p));
    }
    family(
        &mut b,
        "hqdmux_hqd_slots",
        "gauge",
        "User HQD slots of the partition.",
    );
    for (p, n) in &total {
        let _ = writeln!(b, "hqdmux_hqd_slots{{{}}} {n}", part_labels(*p));
    }
    // The VMM's life-cycle state: one series per state, 1 for the current
    // one (a Prometheus enum).
    family(
        &mut b,
        "hqdmux_vm_state",
        "gauge",
        "The VM's life-cycle state: 1 for the series of its current state, 0 for the others.",
    );
    for (id, f) in &rows {
        let Some(cur) = info.vm_states.get(id) else {
            continue;
        };
        let l = labels(f);
        for st in info.states {
            let _ = writeln!(
                b,
                "hqdmux_vm_state{{{l},state=\"{st}\"}} {}",
                u8::from(st == cur)
            );
        }
    }
    family(
        &mut b,
        "hqdmux_vm_quarantined",
        "gauge",
        "1 while the VM's vGPU is quarantined (reason: guard_resets, guard_queue_errors, guard_stale_doorbells, guard_save_waits, host_bug), else 0 (reason none).",
    );
    for (id, f) in &rows {
        if let Some(g) = ctx.guard.get(id) {
            let q = g.quarantine;
            let _ = writeln!(
                b,
                "hqdmux_vm_quarantined{{{},reason=\"{}\"}} {}",
                labels(f),
                q.label(),
                u8::from(q != QuarantineReason::None)
            );
        }
    }
    family(
        &mut b,
        "hqdmux_vm_guard_events_total",
        "counter",
        "Events the misbehaving-VM guard counted for the VM since it was added, by event: reset (preemption-timeout resets), queue_error, stale_doorbell.",
    );
    for (id, f) in &rows {
        if let Some(g) = ctx.guard.get(id) {
            let l = labels(f);
            for (ev, n) in ["reset", "queue_error", "stale_doorbell"]
                .iter()
                .zip(g.guard_totals)
                .zip(f.carried_guard)
                .map(|((ev, n), c)| (ev, n.saturating_add(c)))
            {
                let _ = writeln!(b, "hqdmux_vm_guard_events_total{{{l},event=\"{ev}\"}} {n}");
            }
        }
    }
    family(
        &mut b,
        "hqdmux_vm_guard_save_wait_seconds_total",
        "counter",
        "Time the VM's saves waited for its own waves without a save point (partition time its waves held), as the misbehaving-VM guard counted it since the VM was added.",
    );
    for (id, f) in &rows {
        if let Some(g) = ctx.guard.get(id) {
            let ns = g.guard_totals[3].saturating_add(f.carried_guard[3]);
            let _ = writeln!(
                b,
                "hqdmux_vm_guard_save_wait_seconds_total{{{}}} {}",
                labels(f),
                fmt_f64(ns as f64 / 1e9)
            );
        }
    }
    family(
        &mut b,
        "hqdmux_guard_quarantines_total",
        "counter",
        "Quarantines made by the misbehaving-VM guard on this GPU since start.",
    );
    let _ = writeln!(
        b,
        "hqdmux_guard_quarantines_total{{{dev}}} {}",
        ctx.guard_quarantines
    );
    render_promise(&mut b, tele, bind, &rows, &labels, info);
    b
}

/// The promise's families (docs/scheduling.md, "The promise, live").
fn render_promise<O: Copy>(
    b: &mut String,
    tele: &Telemetry,
    bind: &Binding<O>,
    rows: &[(VmId, VmFigures)],
    labels: &dyn Fn(&VmFigures) -> String,
    info: &MetricsInfo,
) {
    let sched = bind.scheduler();
    let vms: BTreeMap<VmId, &crate::telemetry::VmTelemetry> =
        tele.vms().map(|(id, v)| (*id, v)).collect();
    let stats = |id: VmId| sched.vm_stats(id);
    type Pick = fn(&crate::telemetry::VmTelemetry, Option<scheduler::VmStats>) -> Option<f64>;
    let counters: [(&str, &str, Pick); 7] = [
        (
            "hqdmux_vm_cu_seconds_total",
            "Compute the VM received: CU time of its completed workgroups (CU x seconds), the measure of the promise.",
            |v, _| Some(v.promise.cu_ns as f64 / 1e9),
        ),
        (
            "hqdmux_vm_demanding_seconds_total",
            "Time the VM had work it could run (a queue ready, saved or running).",
            |v, _| Some(v.promise.demanding_ns as f64 / 1e9),
        ),
        (
            "hqdmux_vm_wait_seconds_total",
            "Time the VM had a queue ready or saved and none running: waiting for an HQD slot.",
            |v, _| Some(v.promise.wait_ns as f64 / 1e9),
        ),
        (
            "hqdmux_vm_cwsr_seconds_total",
            "Dequeue (CWSR save or drain) time of the VM's queues, charged to nobody.",
            |_, s| s.map(|s| s.save_ns as f64 / 1e9),
        ),
        (
            "hqdmux_vm_aging_boosts_total",
            "Times one of the VM's queues was boosted by aging above every priority.",
            |v, _| Some(v.promise.aging_boosts as f64),
        ),
        (
            "hqdmux_vm_preemptions_caused_total",
            "Preemptions of other VMs' queues the scheduler made for one of this VM's queues.",
            |v, _| Some(v.promise.preemptions_caused as f64),
        ),
        (
            "hqdmux_vm_preemptions_by_aging_total",
            "Preemptions of the VM's queues made for a queue boosted by aging.",
            |v, _| Some(v.promise.preempted_by_aging as f64),
        ),
    ];
    for (name, help, pick) in counters {
        family(b, name, "counter", help);
        for (id, f) in rows {
            let Some(v) = vms.get(id) else { continue };
            if let Some(x) = pick(v, stats(*id)) {
                let _ = writeln!(b, "{name}{{{}}} {}", labels(f), fmt_f64(x));
            }
        }
    }
    for (name, help, i) in [
        (
            "hqdmux_vm_entitled_share",
            "The VM's entitlement under the demands of the last sample interval: its fraction of its partition's compute by the water-filling of the promise (strict priority across levels, weighted max-min within).",
            0,
        ),
        (
            "hqdmux_vm_received_share",
            "The VM's fraction of its partition's compute (CU time) over the last sample interval.",
            1,
        ),
    ] {
        family(b, name, "gauge", help);
        for (id, f) in rows {
            if let Some(&(e, g)) = info.promise.get(id) {
                let x = if i == 0 { e } else { g };
                let _ = writeln!(b, "{name}{{{}}} {}", labels(f), fmt_f64(x));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_interpolates_inside_buckets() {
        let mut h = Histogram::new(&[1e-3, 2e-3]);
        assert_eq!(h.quantile(0.5), None);
        for _ in 0..2 {
            h.observe_ns(500_000); // bucket (0, 1 ms]
        }
        for _ in 0..2 {
            h.observe_ns(1_500_000); // bucket (1 ms, 2 ms]
        }
        let p50 = h.quantile(0.5).unwrap();
        assert!((p50 - 1e-3).abs() < 1e-12, "{p50}");
        let p75 = h.quantile(0.75).unwrap();
        assert!((p75 - 1.5e-3).abs() < 1e-12, "{p75}");
        h.observe_ns(9_000_000_000); // +Inf: reported as the last bound
        assert_eq!(h.quantile(1.0), Some(2e-3));
    }

    #[test]
    fn histogram_is_cumulative_with_inf_last() {
        let mut h = Histogram::new(&[1e-6, 1e-3]);
        h.observe_ns(500);
        h.observe_ns(1_000);
        h.observe_ns(2_000_000);
        assert_eq!(
            h.cumulative(),
            vec![(1e-6, 2), (1e-3, 2), (f64::INFINITY, 3)]
        );
        assert_eq!(h.count(), 3);
        assert!((h.sum() - 0.0020015).abs() < 1e-12);
        assert_eq!(fmt_f64(f64::INFINITY), "+Inf");
        assert_eq!(fmt_f64(0.0025), "0.0025");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
