//! A batch pause's switch without another guest's waits for waves that
//! have no save point (issue 18, branch `rtnsp`; `Scheduler::pause_switch`):
//! the partition's last save counts as the save itself, not the wait of the
//! preempted VM's non-preemptible waves, which is billed to that VM. A
//! lower VM's 685 us `no_save_point` workgroups made a 2 ms aging batch of
//! other work refuse a higher RT's reservation (its pause's switch, twice
//! the last save with the wait, 1.27 ms, past the batch's 1 ms yield
//! allowance) and the RT waited in the batch (fuzz seed 200058).

use crate::*;

use crate::tests::save_wait_tests::step;
use crate::tests::two_levels;

/// Two VMs (priority 12: queue 1; priority 2: queue 2) on one partition of
/// 4 slots; the lower queue runs, the higher one preempts it, and the save
/// takes `save` of which the backend reports `wait` spent waiting for the
/// lower VM's own waves. Returns the pause switch read after it.
fn switch_after(save: Nanos, wait: Nanos) -> Nanos {
    let mut s = two_levels(&[2]);
    let saved = step(
        &mut s,
        Event::Doorbell {
            queue: QueueId(2),
            wptr: 1,
            now: 0,
        },
    );
    assert!(!saved);
    let saved = step(
        &mut s,
        Event::Doorbell {
            queue: QueueId(1),
            wptr: 1,
            now: 1_000_000,
        },
    );
    assert!(saved, "the higher queue preempts the lower one");
    s.note_save_wait(QueueId(2), wait);
    step(
        &mut s,
        Event::Unmapped {
            queue: QueueId(2),
            has_work: true,
            save_ns: save,
            now: 1_000_000 + save,
        },
    );
    s.pause_switch(&s.parts[0])
}

#[test]
fn a_pause_switch_leaves_out_a_wait_for_waves_without_a_save_point() {
    // A 665 us dequeue of which 630 us waited for the lower guest's own
    // waves: the switch is twice the 35 us save, not twice the dequeue.
    assert_eq!(switch_after(665_000, 630_000), 70_000);
}

#[test]
fn a_clean_save_is_the_switch_as_before() {
    assert_eq!(switch_after(35_000, 0), 70_000);
}
