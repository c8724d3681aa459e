//! Non-preemptible waves (issue 18): a preemption's dequeue that waits for
//! the queue's own waves (kernels without a save point) is billed to its
//! VM, beyond a typical CWSR save, and a guest cannot raise the typical
//! save by making its saves slow.

use crate::*;

fn sched() -> Scheduler {
    super::two_levels(&[2])
}

/// Handles `ev`, answering drains of idle queues at once, and returns the
/// queues it saves (CU-set changes are taken and dropped).
pub(crate) fn handle(s: &mut Scheduler, ev: Event) -> Vec<QueueId> {
    s.handle(ev);
    let mut saved = Vec::new();
    while let Some(a) = s.poll_action() {
        match a {
            Action::Unmap {
                queue,
                mode: DequeueMode::DrainPipe,
                ..
            } => s.handle(Event::Unmapped {
                queue,
                has_work: false,
                save_ns: 0,
                now: ev.now(),
            }),
            Action::Unmap {
                queue,
                mode: DequeueMode::SaveWaves,
                ..
            } => saved.push(queue),
            _ => {}
        }
    }
    while s.poll_cu_change().is_some() {}
    saved
}

/// [`handle`]: was the low queue (2) preempted with a save?
pub(crate) fn step(s: &mut Scheduler, ev: Event) -> bool {
    handle(s, ev).contains(&QueueId(2))
}

/// The low queue runs from `t`; the top one preempts it at `t + 1 ms`; its
/// dequeue takes `save`; the top drains at once. Returns the time after.
fn cycle(s: &mut Scheduler, t: Nanos, wptr: u64, save: Nanos) -> Nanos {
    cycle_wait(s, t, wptr, save, None)
}

/// As [`cycle`], the backend reporting that the dequeue waited `wait` for
/// waves without a save point (`None`: no report).
fn cycle_wait(s: &mut Scheduler, t: Nanos, wptr: u64, save: Nanos, wait: Option<Nanos>) -> Nanos {
    let queue = QueueId(2);
    step(
        s,
        Event::Doorbell {
            queue,
            wptr,
            now: t,
        },
    );
    let t = t + 1_000_000;
    let queue = QueueId(1);
    let saved = step(
        s,
        Event::Doorbell {
            queue,
            wptr,
            now: t,
        },
    );
    assert!(saved, "the low queue was not preempted at {t}");
    step(s, Event::QueueIdle { queue, now: t + 10 });
    let t = t + save;
    let queue = QueueId(2);
    if let Some(w) = wait {
        s.note_save_wait(queue, w);
    }
    let (has_work, save_ns) = (false, save);
    step(
        s,
        Event::Unmapped {
            queue,
            has_work,
            save_ns,
            now: t,
        },
    );
    t + 5_000_000
}

#[test]
fn a_save_that_waits_for_its_own_waves_is_billed() {
    let mut s = sched();
    // Ten ordinary saves of 100 us: the typical save.
    let mut t = 0;
    for i in 1..=10 {
        t = cycle(&mut s, t, i, 100_000);
    }
    let before = s.vm_stats(VmId(2)).unwrap();
    assert_eq!(before.save_wait_ns, 0);
    // A 20 ms dequeue: the part beyond 8 typical saves (at least 1 ms) is
    // a wait.
    t = cycle(&mut s, t, 11, 20_000_000);
    let after = s.vm_stats(VmId(2)).unwrap();
    assert_eq!(after.save_wait_ns, 20_000_000 - 1_000_000);
    assert!(after.gpu_ns >= before.gpu_ns + after.save_wait_ns);
    // Many slow saves do not make slow saves typical: each one is billed.
    for i in 12..=40 {
        t = cycle(&mut s, t, i, 20_000_000);
    }
    let last = s.vm_stats(VmId(2)).unwrap();
    assert_eq!(last.save_wait_ns, 30 * (20_000_000 - 1_000_000));
    // An ordinary save of another kind of work, a few times the typical
    // one but under the floor, is not a wait.
    cycle(&mut s, t, 41, 600_000);
    assert_eq!(s.vm_stats(VmId(2)).unwrap().save_wait_ns, last.save_wait_ns);
    // The top VM is never billed for the low VM's waits.
    assert_eq!(s.vm_stats(VmId(1)).unwrap().save_wait_ns, 0);
}

#[test]
fn a_reported_wait_is_billed_exactly() {
    // The backend reports the wait (the simulator does): every reported
    // ns is billed, however short (a `no_save_point` VM of small state
    // waits 20-60 us in saves of a few us, all under the threshold), and
    // the rest of the dequeue is a save, billed to nobody.
    let mut s = sched();
    let mut t = 0;
    for i in 1..=10 {
        t = cycle(&mut s, t, i, 100_000);
    }
    t = cycle_wait(&mut s, t, 11, 45_000, Some(40_000));
    assert_eq!(s.vm_stats(VmId(2)).unwrap().save_wait_ns, 40_000);
    // A long reported wait: billed exactly, not less the threshold.
    t = cycle_wait(&mut s, t, 12, 20_100_000, Some(20_000_000));
    assert_eq!(s.vm_stats(VmId(2)).unwrap().save_wait_ns, 20_040_000);
    // A report of 0 and an ordinary save: nothing more billed; a report
    // never exceeds its dequeue.
    t = cycle_wait(&mut s, t, 13, 100_000, Some(0));
    t = cycle_wait(&mut s, t, 14, 30_000, Some(90_000));
    assert_eq!(s.vm_stats(VmId(2)).unwrap().save_wait_ns, 20_070_000);
    // A report is for its dequeue only: the next unreported save is not
    // billed.
    cycle(&mut s, t, 15, 100_000);
    assert_eq!(s.vm_stats(VmId(2)).unwrap().save_wait_ns, 20_070_000);
    assert_eq!(s.vm_stats(VmId(1)).unwrap().save_wait_ns, 0);
}

#[test]
fn the_queues_of_one_preemption_are_billed_their_wait_once() {
    // Two queues of the low VM are saved by one preemption and both wait
    // 40 us for their waves without a save point: in wall time the VM's
    // waves ran 40 us, not 80 (before: each queue's wait was billed, and
    // a VM of 6 such queues was billed up to 6 times its waits — equals
    // seed 62010, eq2 -23% of its share).
    let mut s = sched();
    s.add_queue(VmId(2), QueueId(3), 0).unwrap();
    for q in [2, 3] {
        step(
            &mut s,
            Event::Doorbell {
                queue: QueueId(q),
                wptr: 1,
                now: 0,
            },
        );
    }
    let t = 1_000_000;
    step(
        &mut s,
        Event::Doorbell {
            queue: QueueId(1),
            wptr: 1,
            now: t,
        },
    );
    for q in [2, 3] {
        assert_eq!(s.queue_state(QueueId(q)).unwrap().0, QueueState::Preempting);
    }
    for q in [2, 3] {
        s.note_save_wait(QueueId(q), 40_000);
        step(
            &mut s,
            Event::Unmapped {
                queue: QueueId(q),
                has_work: true,
                save_ns: 45_000,
                now: t + 45_000,
            },
        );
    }
    assert_eq!(s.vm_stats(VmId(2)).unwrap().save_wait_ns, 40_000);
}
