//! A save that waits for the queue's own waves without a save point
//! (issue 18, item 4) splits the partition in the wait: the waiting VM is
//! billed the partition time its waves held (`wait_held_ns`: CU-ns /
//! partition CUs), and the CUs its finishing waves gave back — on which
//! the VM mapped meanwhile ran — are billed to that VM
//! (`Scheduler::bill_free_wait`). Nobody is billed for another's waves,
//! and a wait nobody else ran in is billed to nobody beyond its holder.

use super::save_wait_tests::step;
use crate::*;

/// VM 1 (priority 12, queue 1) above VM 2 (priority 2, queues 2 and 3).
fn sched() -> Scheduler {
    super::two_levels(&[2, 3])
}

const T: Nanos = 1_000_000;

/// The low VM's `queues` run from 0; the top VM rings at `T` and preempts
/// them (its queue is mapped during their saves).
fn preempt(s: &mut Scheduler, queues: &[u64]) {
    for &q in queues {
        step(
            s,
            Event::Doorbell {
                queue: QueueId(q),
                wptr: 1,
                now: 0,
            },
        );
    }
    step(
        s,
        Event::Doorbell {
            queue: QueueId(1),
            wptr: 1,
            now: T,
        },
    );
    for &q in queues {
        assert_eq!(s.queue_state(QueueId(q)).unwrap().0, QueueState::Preempting);
    }
    assert_eq!(s.queue_state(QueueId(1)).unwrap().0, QueueState::Running);
}

/// Queue `q`'s dequeue (requested at `T`) ends at `T + save`, having
/// waited `wait` of which its waves held `held` of the partition's time.
fn unmapped(s: &mut Scheduler, q: u64, save: Nanos, wait: Nanos, held: Option<Nanos>) {
    s.note_save_wait(QueueId(q), wait);
    if let Some(h) = held {
        s.note_save_wait_held(QueueId(q), h);
    }
    step(
        s,
        Event::Unmapped {
            queue: QueueId(q),
            has_work: true,
            save_ns: save,
            now: T + save,
        },
    );
}

fn gpu(s: &Scheduler, vm: u32) -> Nanos {
    s.vm_stats(VmId(vm)).unwrap().gpu_ns
}

#[test]
fn a_wait_is_billed_by_the_partition_time_each_vm_held() {
    let mut s = sched();
    preempt(&mut s, &[2]);
    // 1 ms wait, its waves holding 40% of the CUs through it; the top
    // VM's waves had the other 60%.
    unmapped(&mut s, 2, T + 50_000, T, Some(400_000));
    let low = s.vm_stats(VmId(2)).unwrap();
    assert_eq!(low.save_wait_ns, 400_000);
    assert_eq!(low.gpu_ns, T + 400_000);
    assert_eq!(gpu(&s, 1), 600_000);
    // From the end of the saves in flight the top VM is billed in full.
    step(
        &mut s,
        Event::QueueIdle {
            queue: QueueId(1),
            now: 3 * T + 50_000,
        },
    );
    assert_eq!(gpu(&s, 1), 600_000 + T);
    assert_eq!(s.vm_stats(VmId(1)).unwrap().save_wait_ns, 0);
}

#[test]
fn free_cus_nobody_ran_on_are_billed_to_nobody() {
    let mut s = sched();
    preempt(&mut s, &[2]);
    // The top VM's job ended at once: nobody had the CUs given back.
    step(
        &mut s,
        Event::QueueIdle {
            queue: QueueId(1),
            now: T + 10,
        },
    );
    unmapped(&mut s, 2, T + 50_000, T, Some(250_000));
    assert_eq!(s.vm_stats(VmId(2)).unwrap().save_wait_ns, 250_000);
    // It ran 10 ns of the 1 ms wait: its part of those (3/4 free), no more.
    assert_eq!(gpu(&s, 1), 7);
}

#[test]
fn waits_of_one_preemption_split_their_span_once() {
    // Two queues of the low VM wait together from T: one 600 us (its
    // waves holding 200 us of the partition), one 1 ms (300 us). Their
    // CUs differ, so the VM held 500 us; the span is 1 ms, so the top VM
    // is billed the other 500 us — not the sum of each wait's rest
    // (400 + 700 us).
    let mut s = sched();
    preempt(&mut s, &[2, 3]);
    unmapped(&mut s, 3, 650_000, 600_000, Some(200_000));
    // Queue 2 still waits: the free time is not known yet.
    assert_eq!(gpu(&s, 1), 0);
    unmapped(&mut s, 2, T + 50_000, T, Some(300_000));
    assert_eq!(s.vm_stats(VmId(2)).unwrap().save_wait_ns, 500_000);
    assert_eq!(gpu(&s, 1), 500_000);
}

#[test]
fn a_wait_reported_first_does_not_bill_cus_a_later_one_held() {
    // Fuzz seed 200008's switch: two queues of the low VM wait together
    // the same 1 ms, each holding half the partition through it (saved
    // waves keep their CUs until the queue's save is written). The
    // partition was never free: the top VM, mapped meanwhile, had no CU
    // and is billed nothing. Billed as the first report made it seem
    // (span 1 ms less 500 us held), it paid 500 us for no CU time.
    let mut s = sched();
    preempt(&mut s, &[2, 3]);
    unmapped(&mut s, 3, T + 40_000, T, Some(T / 2));
    unmapped(&mut s, 2, T + 50_000, T, Some(T / 2));
    assert_eq!(s.vm_stats(VmId(2)).unwrap().save_wait_ns, T);
    assert_eq!(gpu(&s, 1), 0);
    // From the end of the saves in flight the top VM is billed in full.
    step(
        &mut s,
        Event::QueueIdle {
            queue: QueueId(1),
            now: 3 * T + 50_000,
        },
    );
    assert_eq!(gpu(&s, 1), T);
}

#[test]
fn the_free_time_is_split_among_the_vms_running_at_each_instant() {
    // Exact shares of a period (`FreeWait::shares`): a 1 ms span with
    // 600 us held leaves 400 us free, 0.4 per ns of the span. VM 7 runs
    // all of it, VM 8 only its second half (then both split it), VM 9
    // waited (never a taker), VM 10 ran only before the span.
    use crate::engine::free_wait::FreeWait;
    let mut fw = FreeWait::default();
    fw.add_wait(VmId(9), T, T, 600_000);
    fw.runs_from(VmId(7), T);
    fw.runs_from(VmId(8), T + T / 2);
    fw.runs_from(VmId(9), T);
    fw.runs_from(VmId(10), 0);
    fw.stops(VmId(10), T);
    let mut sh = fw.shares();
    sh.sort();
    assert_eq!(sh, vec![(VmId(7), 300_000), (VmId(8), 100_000)]);
    // A VM that stops and runs again in the period keeps one interval
    // from its first start (the list stays bounded by the VMs).
    fw.stops(VmId(7), T + T / 4);
    fw.runs_from(VmId(7), T + T / 2);
    let mut again = fw.shares();
    again.sort();
    assert_eq!(again, sh);
    // Nobody running: nothing billed; a held share beyond the wait
    // leaves nothing free.
    let mut idle = FreeWait::default();
    idle.add_wait(VmId(9), T, T, 100_000);
    assert!(idle.shares().is_empty());
    let mut full = FreeWait::default();
    full.add_wait(VmId(9), T, T, 5 * T);
    full.runs_from(VmId(7), 0);
    assert!(full.shares().is_empty());
}

#[test]
fn the_split_conserves_the_wait_and_trusts_no_report_beyond_it() {
    // Whatever share the backend reports, the waiting VM is billed at
    // most the wait, the two VMs together exactly the wait.
    for (wait, held) in [
        (1_000u64, 0u64),
        (1_000, 1_000),
        (T, 1),
        (T, 333_333),
        (20 * T, 7 * T),
        (100_000, 900_000),
    ] {
        let mut s = sched();
        preempt(&mut s, &[2]);
        let low0 = gpu(&s, 2);
        unmapped(&mut s, 2, wait + 50_000, wait, Some(held));
        let low = gpu(&s, 2) - low0;
        assert_eq!(low, held.min(wait), "wait {wait} held {held}");
        assert_eq!(low + gpu(&s, 1), wait, "wait {wait} held {held}");
    }
    // A share without a reported wait is ignored: nothing is billed for
    // an ordinary save.
    let mut s = sched();
    preempt(&mut s, &[2]);
    let low0 = gpu(&s, 2);
    s.note_save_wait_held(QueueId(2), 40_000);
    step(
        &mut s,
        Event::Unmapped {
            queue: QueueId(2),
            has_work: true,
            save_ns: 50_000,
            now: T + 50_000,
        },
    );
    assert_eq!(gpu(&s, 2), low0);
    assert_eq!(gpu(&s, 1), 0);
}
