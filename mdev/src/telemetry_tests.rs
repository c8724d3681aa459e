//! Telemetry and metrics over a binding and the simulated GPU in virtual
//! time: a low-priority VM runs long kernels, a high-priority VM's doorbell
//! preempts it (CWSR save), the low VM is restored afterwards.

use super::*;
use crate::mem::SparseMemory;
use crate::sim::testkit::{GuestQueue, TestVm};
use crate::sim::SimGpu;
use abi::kernel::KernelKind;
use scheduler::{QueueId, SchedConfig};
use std::collections::HashMap;
use std::sync::Arc;

struct Rig {
    gpu: SimGpu,
    b: Binding<u32>,
    tele: Telemetry,
    now: Nanos,
    timer: Option<Nanos>,
    /// Preemption and aging notices seen.
    said: Vec<Notice<u32>>,
}

impl Rig {
    fn new(topo: &GpuTopology) -> Rig {
        Rig::with_config(topo, SchedConfig::default())
    }

    fn with_config(topo: &GpuTopology, cfg: SchedConfig) -> Rig {
        Rig {
            gpu: SimGpu::new(topo.clone(), 7).unwrap(),
            b: Binding::new(topo, cfg).unwrap(),
            tele: Telemetry::new(topo, RingLimits::UNBOUNDED),
            now: 0,
            timer: None,
            said: Vec::new(),
        }
    }

    /// Owner = VM id.
    fn take(&mut self, out: Vec<Notice<u32>>) {
        for n in out {
            if let Notice::ArmTimer { at } = n {
                self.timer = Some(at);
            }
            if let Some(vm) = n.owner() {
                self.tele.notice(self.now, &n, VmId(vm), &self.gpu);
            }
            if matches!(n, Notice::Preempted { .. } | Notice::Aged { .. }) {
                self.said.push(n);
            }
        }
        self.tele.after(self.now, &self.b, &self.gpu);
    }

    fn vm(&mut self, id: u32, name: &str, prio: u8) -> TestVm {
        let p = VmParams {
            priority: prio,
            ..Default::default()
        };
        self.b.add_vm(VmId(id), p).unwrap();
        self.tele.vm_added(VmId(id), name, &p, 0);
        TestVm::with_memory(Arc::new(SparseMemory::new(1 << 32)), 0x10_0000)
    }

    fn doorbell(&mut self, q: QueueId, wptr: u64) {
        let mut out = Vec::new();
        self.b.doorbell(&mut self.gpu, self.now, q, wptr, &mut out);
        self.take(out);
    }

    fn run(&mut self, until: Nanos) {
        let mut evs = Vec::new();
        loop {
            let t = [self.gpu.next_deadline(), self.timer]
                .into_iter()
                .flatten()
                .min();
            let Some(t) = t.filter(|t| *t <= until) else {
                self.now = self.now.max(until.min(self.now.max(1)));
                return;
            };
            self.now = self.now.max(t);
            self.gpu.advance(self.now, &mut evs);
            let mut cu = Vec::new();
            self.gpu.take_cu_time(&mut cu);
            for (tag, ns) in cu {
                let vm = self.b.queue_vm(QueueId(tag)).expect("queue of a VM");
                self.tele.cu_time(vm, ns);
            }
            let mut out = Vec::new();
            for ev in evs.drain(..) {
                self.tele.gpu_event(&ev);
                self.b.gpu_event(&mut self.gpu, self.now, ev, &mut out);
            }
            if self.timer.is_some_and(|x| x <= self.now) {
                self.timer = None;
                self.b.tick(&mut self.gpu, self.now, &mut out);
            }
            self.take(out);
        }
    }
}

/// Parses the text format: `name{labels} value` samples, checking HELP/TYPE
/// lines precede each family's samples. Returns (name, labels, value).
fn parse(text: &str) -> Vec<(String, HashMap<String, String>, f64)> {
    let mut typed: HashMap<String, String> = HashMap::new();
    let mut helped = std::collections::HashSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(r) = line.strip_prefix("# HELP ") {
            let (name, help) = r.split_once(' ').expect("HELP name text");
            assert!(!help.is_empty());
            helped.insert(name.to_string());
            continue;
        }
        if let Some(r) = line.strip_prefix("# TYPE ") {
            let (name, kind) = r.split_once(' ').expect("TYPE name kind");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(helped.contains(name), "HELP before TYPE: {line}");
            assert!(
                typed.insert(name.into(), kind.into()).is_none(),
                "one TYPE per family"
            );
            continue;
        }
        assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
        let (series, value) = line.rsplit_once(' ').expect("sample value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value in {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let mut m = HashMap::new();
                // Label values here contain no ',' or escaped quotes.
                for kv in body.split(',') {
                    let (k, v) = kv.split_once('=').expect("label k=v");
                    let v = v
                        .strip_prefix('"')
                        .and_then(|v| v.strip_suffix('"'))
                        .expect("quoted");
                    m.insert(k.to_string(), v.to_string());
                }
                (n.to_string(), m)
            }
            None => (series.to_string(), HashMap::new()),
        };
        assert!(name.starts_with("hqdmux_"), "{name}");
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| typed.get(*f).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(&name);
        assert!(typed.contains_key(family), "sample before its TYPE: {line}");
        out.push((name, labels, value));
    }
    out
}

fn value(samples: &[(String, HashMap<String, String>, f64)], name: &str, vm: &str) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| n == name && l.get("vm").map(String::as_str) == Some(vm))
        .map(|(_, _, v)| *v)
        .sum()
}

fn scenario() -> (Rig, Vec<(TestVm, GuestQueue)>) {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::new(&topo);
    let mut train = rig.vm(0, "training", 2);
    let mut infer = rig.vm(1, "inference", 12);
    let mut gt = train.queue(&topo, 64, 0);
    let mut gi = infer.queue(&topo, 64, 0);
    rig.b
        .add_queue(VmId(0), QueueId(0), 0, 5, gt.mqd.clone(), train.dyn_mem())
        .unwrap();
    rig.b
        .add_queue(VmId(1), QueueId(1), 1, 5, gi.mqd.clone(), infer.dyn_mem())
        .unwrap();
    for k in 0..4 {
        train.kernel(&mut gt, KernelKind::Mark, 16, 64, 200_000, k, true);
    }
    for k in 0..2 {
        infer.kernel(&mut gi, KernelKind::Mark, 4, 64, 20_000, k, true);
    }
    (rig, vec![(train, gt), (infer, gi)])
}

/// Runs [`scenario`] to the end: training starts, inference's doorbell
/// 300 us later preempts it.
fn preempt_training(rig: &mut Rig, qs: &[(TestVm, GuestQueue)]) {
    rig.doorbell(QueueId(0), qs[0].1.wptr);
    rig.run(300_000);
    rig.doorbell(QueueId(1), qs[1].1.wptr);
    rig.run(u64::MAX);
}

/// [`scenario`] after [`preempt_training`].
fn inference_preempts_training() -> (Rig, Vec<(TestVm, GuestQueue)>) {
    let (mut rig, qs) = scenario();
    preempt_training(&mut rig, &qs);
    (rig, qs)
}

#[test]
fn preemption_save_and_restore_are_recorded_and_exposed() {
    let (mut rig, qs) = scenario();
    let before = parse(&crate::metrics::render(&rig.tele, &rig.b));
    assert_eq!(
        value(&before, "hqdmux_vm_preemptions_total", "training"),
        0.0
    );
    preempt_training(&mut rig, &qs);
    for (tvm, gq) in &qs {
        tvm.verify(gq).unwrap();
    }

    let t = rig.tele.timeline(rig.now, None, &rig.b);
    t.check().unwrap();
    let p = t
        .preemptions
        .iter()
        .find(|p| p.vm == 0)
        .expect("training preempted");
    assert_eq!(p.by_vm, Some(1), "by inference");
    let kinds = |vm: u32, k: SpanKind| t.spans.iter().filter(|s| s.vm == vm && s.kind == k).count();
    assert!(kinds(0, SpanKind::Save) >= 1);
    assert!(kinds(0, SpanKind::Restore) >= 1);
    assert!(kinds(1, SpanKind::Run) >= 1);
    // The save starts where training's run ended, at the preemption.
    let save = t
        .spans
        .iter()
        .find(|s| s.vm == 0 && s.kind == SpanKind::Save)
        .unwrap();
    assert_eq!(save.start_ns, p.at_ns);

    let m = parse(&crate::metrics::render(&rig.tele, &rig.b));
    assert!(value(&m, "hqdmux_vm_preemptions_total", "training") >= 1.0);
    assert!(value(&m, "hqdmux_vm_gpu_busy_seconds_total", "training") > 0.0);
    assert!(value(&m, "hqdmux_vm_gpu_busy_seconds_total", "inference") > 0.0);
    assert!(value(&m, "hqdmux_vm_cwsr_save_seconds_count", "training") >= 1.0);
    assert!(value(&m, "hqdmux_vm_cwsr_restore_seconds_count", "training") >= 1.0);
    assert!(value(&m, "hqdmux_vm_cwsr_restore_seconds_sum", "training") > 0.0);
    assert_eq!(value(&m, "hqdmux_vm_priority", "inference"), 12.0);
    // Histogram buckets are cumulative and end with +Inf = _count.
    let buckets: Vec<_> = m
        .iter()
        .filter(|(n, l, _)| n == "hqdmux_vm_cwsr_save_seconds_bucket" && l["vm"] == "training")
        .collect();
    assert!(buckets.windows(2).all(|w| w[0].2 <= w[1].2));
    assert_eq!(buckets.last().unwrap().1["le"], "+Inf");
    assert_eq!(
        buckets.last().unwrap().2,
        value(&m, "hqdmux_vm_cwsr_save_seconds_count", "training")
    );
    assert!(m
        .iter()
        .any(|(n, l, _)| n == "hqdmux_hqd_slots" && l["gpu_partition_id"] == "0"));
}

/// The promise's counters: CU time is exactly the completed workgroups x
/// their cost, demand covers the work, the preemption names its maker.
#[test]
fn promise_counters_cu_time_demand_and_who_preempted() {
    let (mut rig, _qs) = inference_preempts_training();
    rig.tele.sample_demand(rig.now, &rig.b, true);
    let of = |id: u32| {
        rig.tele
            .vms()
            .find(|(i, _)| **i == VmId(id))
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let (train, infer) = (of(0), of(1));
    // 4 kernels x 16 workgroups x 200 us; 2 x 4 x 20 us.
    assert_eq!(train.promise.cu_ns, 4 * 16 * 200_000);
    assert_eq!(infer.promise.cu_ns, 2 * 4 * 20_000);
    // Training had work for at least its run on the 4 CUs (sampled every
    // DEMAND_SAMPLE_NS), never more than the whole run; nothing is left.
    let work = 4 * 16 * 200_000 / 4;
    assert!(train.promise.demanding_ns + 2 * DEMAND_SAMPLE_NS >= work);
    assert!(train.promise.demanding_ns <= rig.now);
    assert!(train.promise.wait_ns <= train.promise.demanding_ns);
    assert!(!train.promise.demanding && !infer.promise.demanding);
    // Inference's start preempted training, not by aging.
    assert_eq!(train.preempted_by.get(&VmId(1)), Some(&1));
    assert_eq!(infer.promise.preemptions_caused, 1);
    assert_eq!(train.promise.preempted_by_aging, 0);
    let m = parse(&crate::metrics::render(&rig.tele, &rig.b));
    assert_eq!(value(&m, "hqdmux_vm_cu_seconds_total", "training"), 0.0128);
    assert_eq!(
        value(&m, "hqdmux_vm_preemptions_caused_total", "inference"),
        1.0
    );
    assert!(value(&m, "hqdmux_vm_demanding_seconds_total", "training") > 0.0);
    assert!(value(&m, "hqdmux_vm_cwsr_seconds_total", "training") > 0.0);
}

/// Aging in virtual time: a priority-0 VM starved by a priority-15 VM's
/// four busy queues. Its `/metrics` aging boosts are the [`Notice::Aged`]
/// the binding said (= the scheduler's count); the high VM's preemptions by
/// aging and the low VM's preemptions caused are the
/// [`Notice::Preempted`] with reason aging, each said once.
#[test]
fn aging_notices_are_what_the_metrics_count() {
    let topo = GpuTopology::tiny();
    let cfg = SchedConfig {
        aging_ns: 20_000_000,
        spatial_max_permille: 250,
        ..SchedConfig::default()
    };
    let mut rig = Rig::with_config(&topo, cfg);
    let mut hi = rig.vm(0, "flood", 15);
    let mut lo = rig.vm(1, "starved", 0);
    let mut qs = Vec::new();
    for i in 0..5u64 {
        let (tvm, vm, cost, n) = match i {
            4 => (&mut lo, 1, 1_000_000, 2),
            _ => (&mut hi, 0, 10_000_000, 8),
        };
        let mut gq = tvm.queue(&topo, 64, 0);
        rig.b
            .add_queue(VmId(vm), QueueId(i), vm, 5, gq.mqd.clone(), tvm.dyn_mem())
            .unwrap();
        for k in 0..n {
            tvm.kernel(&mut gq, KernelKind::Mark, 4, 64, cost, k, true);
        }
        qs.push(gq);
    }
    for (i, gq) in qs.iter().enumerate() {
        rig.doorbell(QueueId(i as u64), gq.wptr);
    }
    rig.run(u64::MAX);
    for (i, gq) in qs.iter().enumerate() {
        let tvm = if i == 4 { &lo } else { &hi };
        tvm.verify(gq).unwrap();
    }
    let aged = rig
        .said
        .iter()
        .filter(|n| matches!(n, Notice::Aged { owner: 1, .. }))
        .count() as f64;
    let by_aging = rig
        .said
        .iter()
        .filter(|n| {
            matches!(
                n,
                Notice::Preempted {
                    owner: 0,
                    by: Some(VmId(1)),
                    reason: PreemptReason::Aging,
                    ..
                }
            )
        })
        .count() as f64;
    assert!(aged >= 1.0 && by_aging >= 1.0, "{:?}", rig.said);
    let boosts = rig.b.scheduler().vm_stats(VmId(1)).unwrap().aging_boosts;
    assert_eq!(aged, boosts as f64);
    let m = parse(&crate::metrics::render(&rig.tele, &rig.b));
    assert_eq!(value(&m, "hqdmux_vm_aging_boosts_total", "starved"), aged);
    assert_eq!(value(&m, "hqdmux_vm_aging_boosts_total", "flood"), 0.0);
    assert_eq!(
        value(&m, "hqdmux_vm_preemptions_by_aging_total", "flood"),
        by_aging
    );
    assert_eq!(
        value(&m, "hqdmux_vm_preemptions_caused_total", "starved"),
        by_aging
    );
    let flood = rig.tele.vms().find(|(id, _)| **id == VmId(0)).unwrap().1;
    assert_eq!(
        flood.preempted_by.get(&VmId(1)).copied(),
        Some(by_aging as u64)
    );
    // Every preemption the scheduler counted was said once.
    let said = rig
        .said
        .iter()
        .filter(|n| matches!(n, Notice::Preempted { .. }))
        .count() as u64;
    assert_eq!(said, rig.b.scheduler().stats().preemptions);
}

#[test]
fn waits_and_operator_changes_are_on_the_timeline() {
    let (mut rig, qs) = scenario();
    rig.doorbell(QueueId(0), qs[0].1.wptr);
    rig.run(300_000);
    rig.doorbell(QueueId(1), qs[1].1.wptr);
    rig.run(400_000);
    rig.b.set_vm_priority(VmId(0), 7).unwrap();
    rig.b.set_vm_weight(VmId(1), 3).unwrap();
    rig.b.set_policy(scheduler::Policy::Fifo);
    rig.take(Vec::new());
    rig.run(u64::MAX);
    let t = rig.tele.timeline(rig.now, None, &rig.b);
    t.check().unwrap();
    // Training waited (saved waves, work left) while inference ran, and
    // not before its first map nor after everything finished.
    let p = t.preemptions.iter().find(|p| p.vm == 0).expect("preempted");
    let w = t.waits.iter().find(|w| w.vm == 0).expect("training waited");
    assert!(w.start_ns >= p.at_ns && w.end_ns > w.start_ns);
    assert!(t.waits.iter().all(|w| w.end_ns <= rig.now));
    assert!(!rig.tele.recorder().is_waiting(0) && !rig.tele.recorder().is_waiting(1));
    let marks: Vec<(Option<u32>, &str)> = t.marks.iter().map(|m| (m.vm, m.text.as_str())).collect();
    assert!(marks.contains(&(None, "policy fifo")), "{marks:?}");
    assert!(marks.contains(&(Some(0), "priority 2 -> 7")), "{marks:?}");
    assert!(marks.contains(&(Some(1), "weight 1 -> 3")), "{marks:?}");
    assert_eq!(marks.len(), 3, "each change marked once: {marks:?}");
}

#[test]
fn errors_by_code_doorbell_latency_and_removed_vms_keep_their_counters() {
    let (mut rig, _qs) = scenario();
    rig.tele.queue_error(
        VmId(1),
        &QueueErrorReason::WptrBeyondRing {
            wptr: 9,
            rptr: 0,
            size: 4,
        },
    );
    rig.tele.queue_error(VmId(1), &QueueErrorReason::NotAql);
    rig.tele.queue_error(VmId(1), &QueueErrorReason::NotAql);
    rig.tele.queue_error(VmId(99), &QueueErrorReason::NotAql); // unknown VM: ignored
    rig.tele.doorbell_preempted(VmId(1), 3_000);
    let m = parse(&crate::metrics::render(&rig.tele, &rig.b));
    let err = |code: u32| {
        m.iter()
            .filter(|(n, l, _)| {
                n == "hqdmux_vm_queue_errors_total" && l["code"] == code.to_string()
            })
            .map(|(_, _, v)| *v)
            .sum::<f64>()
    };
    assert_eq!(err(abi::vgpu::error::NOT_AQL), 2.0);
    assert_eq!(err(abi::vgpu::error::WPTR_BEYOND_RING), 1.0);
    assert_eq!(
        value(
            &m,
            "hqdmux_vm_doorbell_to_preemption_seconds_count",
            "inference"
        ),
        1.0
    );
    // A removed VM keeps its last figures; its gauges go.
    let stats = rig.b.scheduler().vm_stats(VmId(1)).map(|mut s| {
        s.preemptions = 4;
        s
    });
    rig.tele.vm_removed(VmId(1), stats);
    let mut out = Vec::new();
    rig.b
        .remove_vm(&mut rig.gpu, rig.now, VmId(1), &mut out)
        .unwrap();
    let m = parse(&crate::metrics::render(&rig.tele, &rig.b));
    assert_eq!(value(&m, "hqdmux_vm_preemptions_total", "inference"), 4.0);
    assert!(!m
        .iter()
        .any(|(n, l, _)| n == "hqdmux_vm_priority" && l["vm"] == "inference"));
}

/// Every series of an exposition: no two with the same name and label set
/// (Prometheus rejects a scrape with duplicates).
fn assert_unique_series(text: &str) {
    crate::probe::exposition_series(text);
}

/// A name registered again after its VM was removed (a vGPU whose VMM
/// reconnected) is one series whose counters keep counting: the earlier
/// registration's figures are carried, never printed beside the new one.
#[test]
fn a_re_registered_name_is_one_series_that_never_goes_backwards() {
    let (mut rig, _qs) = scenario();
    rig.tele.queue_error(VmId(1), &QueueErrorReason::NotAql);
    rig.tele.doorbell_preempted(VmId(1), 3_000);
    let mut total = 0.0;
    let mut errors = 1.0;
    for (round, id) in (1u32..5).enumerate() {
        // This registration's own preemptions, as the scheduler had them.
        let own = 4 + round as u64;
        let stats = rig.b.scheduler().vm_stats(VmId(id)).map(|mut s| {
            s.preemptions = own;
            s
        });
        rig.tele.vm_removed(VmId(id), stats);
        let mut out = Vec::new();
        rig.b
            .remove_vm(&mut rig.gpu, rig.now, VmId(id), &mut out)
            .unwrap();
        total += own as f64;
        let removed = crate::metrics::render(&rig.tele, &rig.b);
        assert_unique_series(&removed);
        let m = parse(&removed);
        assert_eq!(value(&m, "hqdmux_vm_preemptions_total", "inference"), total);
        // The same name comes back under a new id.
        let _vm = rig.vm(id + 1, "inference", 12);
        rig.tele
            .queue_error(VmId(id + 1), &QueueErrorReason::NotAql);
        errors += 1.0;
        let text = crate::metrics::render(&rig.tele, &rig.b);
        assert_unique_series(&text);
        let m = parse(&text);
        let rows = m
            .iter()
            .filter(|(n, l, _)| n == "hqdmux_vm_preemptions_total" && l["vm"] == "inference")
            .count();
        assert_eq!(rows, 1, "one series per name");
        assert_eq!(
            value(&m, "hqdmux_vm_preemptions_total", "inference"),
            total,
            "carried, not reset"
        );
        assert_eq!(
            value(&m, "hqdmux_vm_queue_errors_total", "inference"),
            errors
        );
        assert_eq!(
            value(
                &m,
                "hqdmux_vm_doorbell_to_preemption_seconds_count",
                "inference"
            ),
            1.0
        );
        assert_eq!(value(&m, "hqdmux_vm_priority", "inference"), 12.0);
    }
    // The other VM is untouched; only two names are kept.
    assert_eq!(rig.tele.vm_count(), 2);
}

/// Through the real-time arbiter: a doorbell of a high-priority VM preempts
/// a busy low-priority VM; `metrics_text` counters rise and `timeline`
/// shows the preemption. The low VM's kernel outlasts the test (its
/// workgroups take 600 s each), so it is on the GPU with work left when
/// the high VM's doorbell comes however late the test thread runs: the
/// preemption never depends on which thread is faster. (No timing is
/// asserted; waits have a generous deadline against hangs.)
#[test]
fn arbiter_metrics_text_and_timeline_after_a_preemption() {
    use crate::probe::NoIrqs;
    use abi::vgpu::{hqd_state, reg};
    use std::time::{Duration, Instant};

    let a = crate::probe::tiny_arbiter();
    let mut guests = Vec::new();
    for (name, prio, kernels, cost) in
        [("lo", 2u8, 1u32, 600_000_000_000u64), ("hi", 12, 2, 20_000)]
    {
        let g = crate::probe::add_guest(&a, name, prio, 1 << 32, 64, Arc::new(NoIrqs));
        guests.push((g.handle, g.fe, g.tvm, g.q, kernels, cost));
    }
    // Before any load: nothing preempted yet. (A queue loaded with packets
    // already published runs without a doorbell, so this is read first.)
    let m0 = parse(&a.metrics_text());
    assert_eq!(value(&m0, "hqdmux_vm_preemptions_total", "lo"), 0.0);
    let guests: Vec<_> = guests
        .into_iter()
        .map(|(h, fe, mut tvm, mut q, kernels, cost)| {
            crate::probe::load_hqd(&fe, 0, crate::probe::mqd_addr(&q));
            for k in 0..kernels {
                tvm.kernel(&mut q, KernelKind::Mark, 16, 64, cost, k, true);
            }
            (h, fe, tvm, q)
        })
        .collect();
    let signal = |tvm: &TestVm, s: u64| {
        tvm.mem
            .read_u64(s + abi::queue::AMD_SIGNAL_VALUE as u64)
            .unwrap() as i64
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    guests[0].1.doorbell_eventfd(0).write(1).unwrap();
    let on_hqd = |fe: &crate::vgpu::VgpuFrontEnd| {
        fe.reg_read(crate::probe::hqd_reg(0, reg::CP_HQD_STATE)) == hqd_state::ON_HQD
    };
    while !on_hqd(&guests[0].1) {
        assert!(Instant::now() < deadline, "lo mapped");
        std::thread::sleep(Duration::from_millis(1));
    }
    guests[1].1.doorbell_eventfd(0).write(1).unwrap();
    let (_, _, hi_vm, hi_q) = &guests[1];
    let last = *hi_q.signals.last().unwrap();
    while signal(hi_vm, last) > 0 {
        assert!(Instant::now() < deadline, "hi kernels complete");
        std::thread::sleep(Duration::from_millis(2));
    }
    hi_vm.verify(hi_q).unwrap();
    // The low VM's kernel is still running: it was preempted, not finished.
    let (_, _, lo_vm, lo_q) = &guests[0];
    assert!(signal(lo_vm, lo_q.signals[0]) > 0, "lo's work is left");
    let m = parse(&a.metrics_text());
    assert!(value(&m, "hqdmux_vm_preemptions_total", "lo") >= 1.0);
    assert!(
        value(&m, "hqdmux_vm_gpu_busy_seconds_total", "lo")
            > value(&m0, "hqdmux_vm_gpu_busy_seconds_total", "lo")
    );
    // hi's busy time is billed when the arbiter sees its queue go idle,
    // which may come after the guest sees its last signal: it must come.
    while value(
        &parse(&a.metrics_text()),
        "hqdmux_vm_gpu_busy_seconds_total",
        "hi",
    ) <= 0.0
    {
        assert!(Instant::now() < deadline, "hi's GPU time is billed");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(value(&m, "hqdmux_vm_cwsr_save_seconds_count", "lo") >= 1.0);
    assert!(value(&m, "hqdmux_vm_doorbell_to_preemption_seconds_count", "hi") >= 1.0);
    let t = a.timeline(Duration::from_secs(600));
    t.check().unwrap();
    assert!(
        t.preemptions
            .iter()
            .any(|p| p.vm == guests[0].0 .0 && p.by_vm == Some(guests[1].0 .0)),
        "{:?} {:?}",
        t.preemptions,
        t.spans
    );
    let j = crate::timeline::Timeline::from_json(&t.to_json()).unwrap();
    assert_eq!(j, t);
    for (h, ..) in &guests {
        a.remove_vm(*h);
    }
    a.shutdown();
}

/// Packet latency: each completion is timed from the doorbell whose write
/// index covers it; completions of unknown queues and stale doorbells (write
/// index not moved) record nothing; the histogram is exported.
#[test]
fn packet_latency_is_timed_from_the_covering_doorbell() {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::new(&topo);
    rig.vm(3, "lat", 5);
    let done = |rig: &mut Rig, now: Nanos, q: u64, id: u64| {
        let n = Notice::Completed {
            queue: QueueId(q),
            owner: 3u32,
            dispatch_id: id,
            signal: 0,
        };
        rig.tele.notice(now, &n, VmId(3), &rig.gpu);
    };
    // Doorbell at t=1000 publishes packets 0 and 1; at t=5000 packet 2.
    rig.tele.doorbell_published(VmId(3), 7, 2, 1_000);
    rig.tele.doorbell_published(VmId(3), 7, 2, 2_000); // write index unchanged
    rig.tele.doorbell_published(VmId(3), 7, 3, 5_000);
    done(&mut rig, 11_000, 7, 0); // 10 us
    done(&mut rig, 21_000, 7, 1); // 20 us
    done(&mut rig, 45_000, 7, 2); // 40 us
    done(&mut rig, 50_000, 9, 0); // unknown queue
    done(&mut rig, 60_000, 7, 3); // nothing published for it
    let (_, v) = rig.tele.vms().find(|(id, _)| **id == VmId(3)).unwrap();
    let h = &v.packet_latency;
    assert_eq!(h.count(), 3);
    assert!((h.sum() - 70e-6).abs() < 1e-12, "sum {}", h.sum());
    let p50 = h.quantile(0.5).unwrap();
    assert!((1e-5..=2.5e-5).contains(&p50), "p50 {p50}");
    let p99 = h.quantile(0.99).unwrap();
    assert!((2.5e-5..=5e-5).contains(&p99), "p99 {p99}");
    let m = parse(&crate::metrics::render(&rig.tele, &rig.b));
    assert_eq!(
        value(&m, "hqdmux_vm_packet_latency_seconds_count", "lat"),
        3.0
    );
    // A removed queue forgets its doorbells.
    rig.tele.doorbell_published(VmId(3), 7, 10, 70_000);
    let n = Notice::Removed {
        queue: QueueId(7),
        owner: 3u32,
        mqd: Box::default(),
    };
    rig.tele.notice(80_000, &n, VmId(3), &rig.gpu);
    done(&mut rig, 90_000, 7, 5);
    let (_, v) = rig.tele.vms().find(|(id, _)| **id == VmId(3)).unwrap();
    assert_eq!(v.packet_latency.count(), 3);
}

/// The published ring is bounded: past its capacity doorbells coalesce into
/// the newest entry (older time kept), so every packet still gets a latency.
#[test]
fn packet_latency_ring_is_bounded() {
    let topo = GpuTopology::tiny();
    let mut rig = Rig::new(&topo);
    rig.vm(3, "lat", 5);
    let n = crate::telemetry::PUBLISHED_RING as u64 + 10;
    for w in 1..=n {
        rig.tele.doorbell_published(VmId(3), 7, w, w * 100);
    }
    for id in 0..n {
        let c = Notice::Completed {
            queue: QueueId(7),
            owner: 3u32,
            dispatch_id: id,
            signal: 0,
        };
        rig.tele.notice(1_000_000, &c, VmId(3), &rig.gpu);
    }
    let (_, v) = rig.tele.vms().find(|(id, _)| **id == VmId(3)).unwrap();
    assert_eq!(v.packet_latency.count(), n);
}

/// Every series carries the labels AMD's device-metrics-exporter joins on;
/// build info, the VM state enum, quarantine and guard counters come from
/// the render context.
#[test]
fn series_join_the_exporter_labels_and_carry_state_quarantine_and_guard() {
    use crate::metrics::{
        render_with, MetricsInfo, QuarantineReason, RenderContext, VmGuardFigures,
    };
    let (rig, _qs) = scenario();
    let mut info = MetricsInfo::local();
    info.hostname = "node-7".into();
    info.version = "9.9.9".into();
    info.commit = "abc123".into();
    info.states = &["running", "paused", "stopped"];
    info.vm_states.insert(VmId(0), "paused");
    let mut guard = BTreeMap::new();
    guard.insert(
        VmId(0),
        VmGuardFigures {
            quarantine: QuarantineReason::None,
            guard_totals: [0, 0, 0, 0],
        },
    );
    guard.insert(
        VmId(1),
        VmGuardFigures {
            quarantine: QuarantineReason::GuardQueueErrors,
            guard_totals: [1, 5, 7, 2_500_000_000],
        },
    );
    let ctx = RenderContext {
        info: &info,
        partition_type: "CPX",
        guard: &guard,
        guard_quarantines: 1,
    };
    let m = parse(&render_with(&rig.tele, &rig.b, &ctx));
    for (n, l, _) in &m {
        assert_eq!(l.get("gpu_id").map(String::as_str), Some("0"), "{n}");
        assert_eq!(l.get("hostname").map(String::as_str), Some("node-7"), "{n}");
        assert_eq!(
            l.get("gpu_compute_partition_type").map(String::as_str),
            Some("CPX"),
            "{n}"
        );
        if n.starts_with("hqdmux_vm_") || n.starts_with("hqdmux_hqd_") {
            assert!(l.contains_key("gpu_partition_id"), "{n}");
        }
    }
    let build: Vec<_> = m
        .iter()
        .filter(|(n, _, _)| n == "hqdmux_build_info")
        .collect();
    assert_eq!(build.len(), 1);
    assert_eq!(build[0].1["version"], "9.9.9");
    assert_eq!(build[0].1["commit"], "abc123");
    assert_eq!(build[0].2, 1.0);
    // The state enum: one series per state, 1 for the current; none for a
    // VM without a known state.
    let states: Vec<_> = m
        .iter()
        .filter(|(n, _, _)| n == "hqdmux_vm_state")
        .map(|(_, l, v)| (l["vm"].clone(), l["state"].clone(), *v))
        .collect();
    assert_eq!(
        states,
        vec![
            ("training".into(), "running".into(), 0.0),
            ("training".into(), "paused".into(), 1.0),
            ("training".into(), "stopped".into(), 0.0),
        ]
    );
    let quarantined = |vm: &str| {
        m.iter()
            .filter(|(n, l, _)| n == "hqdmux_vm_quarantined" && l["vm"] == vm)
            .map(|(_, l, v)| (l["reason"].clone(), *v))
            .collect::<Vec<_>>()
    };
    assert_eq!(quarantined("training"), vec![("none".into(), 0.0)]);
    assert_eq!(
        quarantined("inference"),
        vec![("guard_queue_errors".into(), 1.0)]
    );
    let guard_event = |vm: &str, ev: &str| {
        m.iter()
            .find(|(n, l, _)| {
                n == "hqdmux_vm_guard_events_total" && l["vm"] == vm && l["event"] == ev
            })
            .map(|(_, _, v)| *v)
    };
    assert_eq!(guard_event("inference", "reset"), Some(1.0));
    assert_eq!(guard_event("inference", "queue_error"), Some(5.0));
    assert_eq!(guard_event("inference", "stale_doorbell"), Some(7.0));
    assert_eq!(guard_event("training", "queue_error"), Some(0.0));
    // Save waits as seconds, one series per VM.
    let waited = |vm: &str| {
        m.iter()
            .filter(|(n, l, _)| n == "hqdmux_vm_guard_save_wait_seconds_total" && l["vm"] == vm)
            .map(|(_, _, v)| *v)
            .collect::<Vec<_>>()
    };
    assert_eq!(waited("inference"), vec![2.5]);
    assert_eq!(waited("training"), vec![0.0]);
    assert!(m
        .iter()
        .any(|(n, _, v)| n == "hqdmux_guard_quarantines_total" && *v == 1.0));
    // Without a context (`render`): the partition type comes from the slots.
    let plain = parse(&crate::metrics::render(&rig.tele, &rig.b));
    assert!(plain
        .iter()
        .all(|(_, l, _)| l["gpu_compute_partition_type"] == "SPX"));
}

#[test]
fn quarantine_reasons_name_the_trip_and_host_bugs_first() {
    use crate::guard::{GuardEvent, Trip};
    use crate::metrics::QuarantineReason as Q;
    let trip = |what| Trip {
        what,
        count: 3,
        limit: 2,
        window_ms: 1000,
        at: 0,
    };
    assert_eq!(Q::of(false, None), Q::None);
    assert_eq!(Q::of(true, None), Q::HostBug);
    assert_eq!(Q::of(true, Some(trip(GuardEvent::Reset))), Q::HostBug);
    assert_eq!(Q::of(false, Some(trip(GuardEvent::Reset))), Q::GuardResets);
    assert_eq!(
        Q::of(false, Some(trip(GuardEvent::SaveWait))).label(),
        "guard_save_waits"
    );
    assert_eq!(
        Q::of(false, Some(trip(GuardEvent::StaleDoorbell))).label(),
        "guard_stale_doorbells"
    );
    assert_eq!(Q::None.label(), "none");
}

/// `promtool check metrics` (Debian's `prometheus` package) accepts the
/// exposition with every family present; skipped where promtool is not
/// installed.
#[test]
fn exposition_is_promtool_clean() {
    let (rig, _qs) = inference_preempts_training();
    let mut info = crate::metrics::MetricsInfo::local();
    info.states = &["running", "stopped"];
    info.vm_states.insert(VmId(0), "running");
    info.vm_states.insert(VmId(1), "stopped");
    info.promise.insert(VmId(0), (4.0 / 7.0, 0.5));
    info.promise.insert(VmId(1), (3.0 / 7.0, 0.5));
    let guard = [0u32, 1]
        .into_iter()
        .map(|id| {
            let f = crate::metrics::VmGuardFigures {
                quarantine: crate::metrics::QuarantineReason::HostBug,
                guard_totals: [id.into(), 2, 3, 0],
            };
            (VmId(id), f)
        })
        .collect();
    let text = crate::metrics::render_with(
        &rig.tele,
        &rig.b,
        &crate::metrics::RenderContext {
            info: &info,
            partition_type: "SPX",
            guard: &guard,
            guard_quarantines: 0,
        },
    );
    for fam in ["hqdmux_vm_entitled_share{", "hqdmux_vm_received_share{"] {
        assert_eq!(text.matches(fam).count(), 2, "{fam}");
    }
    crate::probe::promtool_check(&text);
}
