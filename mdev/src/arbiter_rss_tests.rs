//! Queue-error counts (every error the guest sees is counted once) and the
//! lifetime of removed VMs' state (a fleet that adds and ends VMs
//! continuously stays bounded). Real-time arbiter over the simulated GPU;
//! waits have a generous deadline against hangs, nothing asserts on time.

use super::*;
use crate::probe::{
    add_guest, hqd_reg as hr, load_hqd, mqd_addr, tiny_arbiter, NoIrqs, RecordingIrqs,
};
use crate::telemetry::RETAINED_REMOVED_VMS;
use crate::vgpu::SIGNAL_EVENT_MAILBOX_PTR;
use abi::kernel::KernelKind;
use abi::vgpu::{error, reg, ERROR_VECTOR};

fn wait(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn errors_of(a: &GpuArbiter, h: VmId) -> std::collections::BTreeMap<String, u64> {
    a.vm_queue_errors(h).expect("the arbiter knows the VM")
}

/// A refused MQD (the path of `bad=ring`: the front end checks the MQD at
/// load) and a completion mailbox outside memory (`bad=mailbox`: found by
/// the front end at completion) were seen by the guest (`CP_HQD_ERROR`,
/// error vector) but not counted in the VM's queue errors.
#[test]
fn every_queue_error_the_guest_sees_is_counted_once_by_code() {
    let a = tiny_arbiter();
    let irqs = Arc::new(RecordingIrqs::new());
    let mut g = add_guest(&a, "hostile", 5, 1 << 32, 64, irqs.clone());
    // 1: MQD outside memory, refused by the front end.
    load_hqd(&g.fe, 1, 1 << 40);
    assert_eq!(g.fe.reg_read(hr(1, reg::CP_HQD_ERROR)), error::MQD_ADDRESS);
    // Counted by the time the guest can read the error (a VM that ends
    // right after still has it).
    assert_eq!(errors_of(&a, g.handle).values().sum::<u64>(), 1);
    // 2: a packet whose completion mailbox lies outside VM memory.
    let addr = mqd_addr(&g.q);
    load_hqd(&g.fe, 0, addr);
    g.tvm
        .kernel(&mut g.q, KernelKind::Mark, 2, 64, 1000, 0, true);
    let s = *g.q.signals.last().unwrap();
    g.tvm
        .mem
        .write_u64(s + SIGNAL_EVENT_MAILBOX_PTR, 1 << 40)
        .unwrap();
    g.fe.doorbell_eventfd(0).write(1).unwrap();
    wait("mailbox error", || irqs.count(ERROR_VECTOR as u16) == 2);
    assert_eq!(
        g.fe.reg_read(hr(0, reg::CP_HQD_ERROR)),
        error::SIGNAL_OUT_OF_RANGE
    );
    wait("mailbox error counted", || {
        errors_of(&a, g.handle).values().sum::<u64>() == 2
    });
    let by_code = errors_of(&a, g.handle);
    assert_eq!(by_code.get(&error::MQD_ADDRESS.to_string()), Some(&1));
    assert_eq!(
        by_code.get(&error::SIGNAL_OUT_OF_RANGE.to_string()),
        Some(&1)
    );
    // As many counted as the guest saw error vectors.
    assert_eq!(
        by_code.values().sum::<u64>(),
        irqs.count(ERROR_VECTOR as u16) as u64
    );
    // The same counts in `/metrics` (one series per code).
    let text = a.metrics_text();
    let exported: f64 = text
        .lines()
        .filter(|l| l.starts_with("hqdmux_vm_queue_errors_total{vm=\"hostile\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(exported, 2.0, "{text}");
    // The guard counted both; below its limits, no quarantine.
    let guard_errors = text
        .lines()
        .find(|l| {
            l.starts_with("hqdmux_vm_guard_events_total{vm=\"hostile\"")
                && l.contains("event=\"queue_error\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(guard_errors, Some(2.0), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("hqdmux_vm_quarantined{vm=\"hostile\"")
                && l.ends_with("reason=\"none\"} 0")),
        "{text}"
    );
    a.remove_vm(g.handle);
    a.shutdown();
}

/// A fleet that adds and ends VMs keeps the figures of the last
/// [`RETAINED_REMOVED_VMS`] ended ones only (and every live one).
#[test]
fn telemetry_of_removed_vms_is_bounded_and_live_vms_are_kept() {
    let a = tiny_arbiter();
    let irqs: Arc<dyn InterruptSink> = Arc::new(NoIrqs);
    let live = add_guest(&a, "live", 5, 1 << 24, 16, irqs.clone());
    let n = RETAINED_REMOVED_VMS + 300;
    let mut first = None;
    let mut last = None;
    for i in 0..n {
        let g = add_guest(&a, &format!("ended-{i}"), 5, 1 << 24, 16, irqs.clone());
        // An error, so the VM has figures worth keeping.
        load_hqd(&g.fe, 1, 1 << 40);
        first.get_or_insert(g.handle);
        last = Some(g.handle);
        a.remove_vm(g.handle);
        assert!(a.telemetry_vm_count() <= RETAINED_REMOVED_VMS + 1);
    }
    assert_eq!(a.telemetry_vm_count(), RETAINED_REMOVED_VMS + 1);
    // The live VM and the most recent ended ones answer; the oldest not.
    assert!(a.vm_queue_errors(live.handle).is_some());
    // Its refused load counted though it was removed right after.
    let last_errors = a.vm_queue_errors(last.unwrap()).unwrap();
    assert_eq!(
        last_errors.get(&error::MQD_ADDRESS.to_string()),
        Some(&1),
        "{last_errors:?}"
    );
    assert!(a.vm_queue_errors(first.unwrap()).is_none());
    let text = a.metrics_text();
    assert!(!text.contains("\"ended-0\""), "{text}");
    assert!(text.contains(&format!("\"ended-{}\"", n - 1)));
    assert!(text.contains("\"live\""));
    a.remove_vm(live.handle);
    a.shutdown();
}

/// A storm of VMs that register and go away (some with a queue loaded and
/// a kernel in flight) keeps the arbiter's VM table, the binding's and the
/// scheduler's per-VM entries bounded; handles are never reused, so a
/// stale one reaches no later VM.
#[test]
fn vm_tables_stay_bounded_over_many_add_remove_cycles() {
    let a = tiny_arbiter();
    let irqs: Arc<dyn InterruptSink> = Arc::new(NoIrqs);
    let live = add_guest(&a, "live", 5, 1 << 24, 16, irqs.clone());
    let base_entries = a.vm_entry_count();
    let n = RETAINED_REMOVED_VMS + 400;
    let mut seen = std::collections::HashSet::new();
    let mut first = None;
    let mut max_slots = 0;
    let mut max_entries = 0;
    for i in 0..n {
        let mut g = add_guest(&a, &format!("storm-{i}"), 5, 1 << 24, 16, irqs.clone());
        assert!(seen.insert(g.handle), "handle {:?} reused", g.handle);
        first.get_or_insert(g.handle);
        a.set_preempt_timeout(g.handle, Duration::from_millis(50))
            .unwrap();
        if i % 3 == 0 {
            // A queue with a kernel in flight: removed by a reset.
            let addr = mqd_addr(&g.q);
            load_hqd(&g.fe, 0, addr);
            g.tvm
                .kernel(&mut g.q, KernelKind::Mark, 2, 64, 1_000_000, 0, true);
            g.fe.doorbell_eventfd(0).write(1).unwrap();
        }
        a.remove_vm(g.handle);
        max_slots = max_slots.max(a.vm_slot_count());
        max_entries = max_entries.max(a.vm_entry_count());
    }
    // Live + the retained removed ones (+ the one just removed while its
    // queue drains).
    assert!(
        max_slots <= RETAINED_REMOVED_VMS + 2,
        "{max_slots} slots for 1 live VM after {n} cycles"
    );
    assert!(
        max_entries <= base_entries + 2 * 3,
        "{max_entries} per-VM entries (1 live VM: {base_entries})"
    );
    // The oldest handle is gone for good: steering it is refused.
    let old = first.unwrap();
    assert!(a.set_priority(old, 9).is_err());
    assert!(a.vm_status(old).is_none());
    // The live VM is untouched.
    assert_eq!(a.vm_status(live.handle).map(|(p, _)| p.priority), Some(5));
    a.remove_vm(live.handle);
    assert_eq!(a.vm_entry_count(), 0);
    a.shutdown();
}
