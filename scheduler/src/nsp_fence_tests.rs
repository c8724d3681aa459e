//! A higher RT fenced off a lower VM's waves without a save point, per VM
//! (issue 18; `engine/nsp_fence.rs`): once a save of the lower VM waited
//! longer than the RT's switch budget for its own waves, the RT keeps a
//! reservation sized for its bound without a save through its gaps, the
//! flagged VM runs on the other CUs (never starved), and a lower VM whose
//! waves can be saved gets every CU in the RT's gaps. A bare scheduler
//! with a CU geometry, virtual time only.

use crate::*;

/// One partition of 4 slots, 38 CUs per XCC and 8 XCCs: an RT VM 1
/// (priority 12, queue 1, `rt_wgs` workgroups of 50 us) and a lower VM 2
/// (priority 2, queue 2, whole-partition kernels of 2 ms whole-CU
/// workgroups: no drain, no co-residence).
fn sched(rt_wgs: u64) -> Scheduler {
    let mut s = crate::tests::two_levels(&[2]);
    s.set_cu_geometry(38, 8);
    s.note_dispatch_width(QueueId(2), 304);
    s.note_dispatch_occupancy(QueueId(2), 2_000_000, false);
    s.note_dispatch_width(QueueId(1), rt_wgs);
    s.note_dispatch_occupancy(QueueId(1), 50_000, false);
    s
}

/// Handles `ev` as the save-wait tests do; returns whether the lower
/// queue was preempted with a save.
fn step(s: &mut Scheduler, ev: Event) -> bool {
    let saved = crate::tests::save_wait_tests::step(s, ev);
    while s.poll_cu_change().is_some() {}
    saved
}

/// Is queue `q` mapped and running?
fn running(s: &Scheduler, q: u64) -> bool {
    matches!(s.queue_state(QueueId(q)), Some((QueueState::Running, _)))
}

/// `periods` RT jobs of `rt_wgs` workgroups, one every `period` (or
/// after the last one's save and job, when those take longer), over the
/// busy lower VM; each save of the lower queue takes `wait` waiting for
/// its waves without a save point (reported by the backend) plus a 40 us
/// save. Returns per period whether the RT's arrival saved the lower
/// queue, and whether the lower queue ran in the gap after the job.
fn run(rt_wgs: u64, period: Nanos, wait: Nanos, periods: u64) -> Vec<(bool, bool)> {
    let mut s = sched(rt_wgs);
    let job = 50_000 * rt_wgs.div_ceil(304).max(1);
    let mut out = Vec::new();
    let mut t = 0;
    step(
        &mut s,
        Event::Doorbell {
            queue: QueueId(2),
            wptr: 1,
            now: t,
        },
    );
    t += 1_000_000;
    for i in 1..=periods {
        let saved = step(
            &mut s,
            Event::Doorbell {
                queue: QueueId(1),
                wptr: i,
                now: t,
            },
        );
        let mut end = t;
        if saved {
            let save = wait + 40_000;
            s.note_save_wait(QueueId(2), wait);
            end += save;
            step(
                &mut s,
                Event::Unmapped {
                    queue: QueueId(2),
                    has_work: true,
                    save_ns: save,
                    now: end,
                },
            );
        }
        end += job;
        step(
            &mut s,
            Event::QueueIdle {
                queue: QueueId(1),
                now: end,
            },
        );
        // A tick in the gap, before the next arrival.
        let next = (t + period).max(end + 10_000);
        step(
            &mut s,
            Event::Tick {
                now: end + (next - end) / 2,
            },
        );
        out.push((saved, running(&s, 2)));
        t = next;
    }
    out
}

/// RT rates of 200 Hz and 667 Hz, widths of 16-1216 workgroups, lower waves
/// whose saves wait 0.5-20 ms (longer than the gap or not): after the
/// first wait no arrival of the last 20 saves the lower work again, and
/// the flagged VM runs (beside the fence) in every one of those gaps: it
/// is never starved. With the fence disabled, the RT holds the whole
/// partition through its gaps (the lower VM's measured save makes a
/// switch dearer than the gap) and the flagged VM does not run. (At 5
/// kHz the rule still saves the lower work every 2-5 periods for a job
/// of 152 workgroups, and a job of 1216 workgroups, 200 us every 200 us,
/// is backlogged and fenced by nothing: docs/scheduling.md, "A fence per
/// VM".)
#[test]
fn a_flagged_lower_vm_runs_beside_a_fence_and_is_not_saved_again() {
    for period in [1_500_000, 5_000_000] {
        for rt_wgs in [16, 152, 1216] {
            for wait in [500_000, 1_900_000, 20_000_000] {
                let got = run(rt_wgs, period, wait, 40);
                let tail = &got[20..];
                if std::env::var_os("NSP_CASES").is_some() {
                    let c = |b: bool| if b { '1' } else { '0' };
                    eprintln!(
                        "CASE {period} {rt_wgs} {wait}: saved {} ran {}",
                        got.iter().map(|g| c(g.0)).collect::<String>(),
                        got.iter().map(|g| c(g.1)).collect::<String>()
                    );
                    continue;
                }
                assert!(
                    tail.iter().all(|&(saved, ran)| !saved && ran),
                    "{period} ns, {rt_wgs} workgroups, {wait} ns wait: {got:?}"
                );
            }
        }
    }
}

/// The control: saves that wait for nothing (clean 40 us saves) leave the
/// RT's reservation to the usual rules; the fence never applies.
#[test]
fn clean_saves_set_no_fence() {
    let mut s = sched(16);
    s.note_save_wait(QueueId(2), 0);
    assert!(!s.nsp_below(0, 12));
}
