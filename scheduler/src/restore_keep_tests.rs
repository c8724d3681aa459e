//! A queue saved during its own restore keeps that restore (issue 18,
//! branch `fresh8`, `engine/restore_keep.rs`): its VM is not billed the
//! next restore because the dequeue that cut the first one was short.

use super::save_wait_tests::step;
use crate::*;

/// The top queue (1) rings at `t`: the low queue (2) is saved; the top
/// drains at once; the low queue's dequeue takes `save` and it is mapped
/// again (from `Saved`, at once or at a later tick of 10 us). Returns the
/// time of that map.
fn preempt(s: &mut Scheduler, t: Nanos, wptr: u64, save: Nanos) -> Nanos {
    let saved = step(
        s,
        Event::Doorbell {
            queue: QueueId(1),
            wptr,
            now: t,
        },
    );
    assert!(saved, "the low queue was not preempted at {t}");
    step(
        s,
        Event::QueueIdle {
            queue: QueueId(1),
            now: t + 1,
        },
    );
    let t = t + save;
    step(
        s,
        Event::Unmapped {
            queue: QueueId(2),
            has_work: true,
            save_ns: save,
            now: t,
        },
    );
    // The top may hold the partition for a while after a short gap (the
    // cost-aware hold): tick until the low queue is mapped again.
    let mut t = t;
    for _ in 0..1000 {
        if s.queue_state(QueueId(2)).unwrap().0 == QueueState::Running {
            return t;
        }
        t += 10_000;
        step(s, Event::Tick { now: t });
    }
    panic!("the low queue was not mapped again by {t}");
}

#[test]
fn a_save_during_its_own_restore_keeps_the_restore() {
    let mut s = super::two_levels(&[2]);
    step(
        &mut s,
        Event::Doorbell {
            queue: QueueId(2),
            wptr: 1,
            now: 0,
        },
    );
    // A save of 100 us with work: the next map restores 100 us.
    let map = preempt(&mut s, 1_000_000, 1, 100_000);
    let before = s.vm_stats(VmId(2)).unwrap().gpu_ns;
    // The top rings again 40 us into that restore: the dequeue of waves
    // that have not run takes 5 us, and the record left is the first one.
    let map = preempt(&mut s, map + 40_000, 2, 5_000);
    assert_eq!(
        s.vm_stats(VmId(2)).unwrap().gpu_ns,
        before,
        "billed during a restore"
    );
    // The next map restores the whole record again (100 us, not 5): the
    // VM is billed its run after it, 1 ms less the restore.
    preempt(&mut s, map + 1_000_000, 3, 100_000);
    assert_eq!(
        s.vm_stats(VmId(2)).unwrap().gpu_ns - before,
        1_000_000 - 100_000
    );
}

#[test]
fn a_save_after_the_restore_takes_its_own_length() {
    // Waves that ran after their restore are saved anew: the next restore
    // is that save's, shorter or longer.
    let mut s = super::two_levels(&[2]);
    step(
        &mut s,
        Event::Doorbell {
            queue: QueueId(2),
            wptr: 1,
            now: 0,
        },
    );
    let map = preempt(&mut s, 1_000_000, 1, 100_000);
    let map = preempt(&mut s, map + 500_000, 2, 20_000);
    let before = s.vm_stats(VmId(2)).unwrap().gpu_ns;
    preempt(&mut s, map + 1_000_000, 3, 100_000);
    assert_eq!(
        s.vm_stats(VmId(2)).unwrap().gpu_ns - before,
        1_000_000 - 20_000
    );
}
