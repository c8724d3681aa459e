//! A lower RT's switch budget counts the jobs of the periodic VMs above it
//! (`engine/rt_above.rs`; fuzz seed 300152: a 218 us RT sized to take
//! 470.7 us against its bound of 482, and 43 us more whenever a higher
//! RT's job came during it, 511-525 us). Virtual time only.

use super::rt_sizing_tests::two_lower;
use super::save_wait_tests::handle;
use super::*;

/// The RT rig's bound: 1.1 x its 50 us alone + the 240 us allowance.
const BOUND: Nanos = 55_000 + 240_000;

/// A save of a lower queue in the rig, and the partition's clean save.
const SAVE: Nanos = 20_000;

/// The RT's job (152 workgroups of 50 us) on `k` CUs per XCC (8 XCCs).
fn job_on(k: u32) -> Nanos {
    152u64.div_ceil(k as u64 * 8) * 50_000
}

/// Every lower queue `saved` by an event at `now` is dequeued `SAVE` later.
fn unmap(s: &mut Scheduler, saved: Vec<QueueId>, now: Nanos) {
    for q in saved {
        handle(
            s,
            Event::Unmapped {
                queue: q,
                has_work: true,
                save_ns: SAVE,
                now: now + SAVE,
            },
        );
    }
}

/// [`two_lower`] (an RT of 152 workgroups of 50 us at priority 12 over two
/// busy lower VMs) with VM 4 at priority 14 (queue 4, 16 workgroups of 20
/// us) waking every `period` for jobs of `job` (`None`: no VM 4), for 12
/// RT jobs 61 ms apart. VM 4's jobs from half a period before an RT job
/// to 300 us after it are left out (the rig does not run them during the
/// RT's job), so its measured period is its own again by the next. Returns
/// the RT's reservation (CUs per XCC) at its last arrival.
fn rt_size_below(higher: Option<(Nanos, Nanos)>) -> u32 {
    let mut s = two_lower();
    s.add_vm(
        VmId(4),
        VmParams {
            priority: 14,
            ..Default::default()
        },
    )
    .unwrap();
    s.add_queue(VmId(4), QueueId(4), 0).unwrap();
    s.note_dispatch_width(QueueId(4), 16);
    s.note_dispatch_occupancy(QueueId(4), 20_000, false);
    for q in [2, 3] {
        handle(
            &mut s,
            Event::Doorbell {
                queue: QueueId(q),
                wptr: 1,
                now: 0,
            },
        );
    }
    let (mut w4, mut k, mut at) = (0, 0, 0);
    for i in 1..=12 {
        let t = i * 61 * MS;
        if let Some((period, job)) = higher {
            while at + period / 2 <= t {
                w4 += 1;
                let saved = handle(
                    &mut s,
                    Event::Doorbell {
                        queue: QueueId(4),
                        wptr: w4,
                        now: at,
                    },
                );
                unmap(&mut s, saved, at);
                handle(
                    &mut s,
                    Event::QueueIdle {
                        queue: QueueId(4),
                        now: at + job,
                    },
                );
                at += period;
            }
            // Left out while the RT's job runs.
            while at < t + 300_000 {
                at += period;
            }
        }
        let saved = handle(
            &mut s,
            Event::Doorbell {
                queue: QueueId(1),
                wptr: i,
                now: t,
            },
        );
        k = s.cu_reservation(0).map_or(0, |(_, k)| k);
        unmap(&mut s, saved, t);
        handle(
            &mut s,
            Event::QueueIdle {
                queue: QueueId(1),
                now: t + SAVE + 200_000,
            },
        );
    }
    k
}

/// A higher VM of 40 us jobs every 1 ms can come once during the RT's job:
/// the RT's queue saved and restored (2 x 20 us) and 40 us of waiting.
/// Sized on the allowance less the save alone (4 CUs per XCC, 250 us:
/// 270 us with the save, within the bound by 25 us), the interrupted job
/// takes 350 us; with the higher jobs budgeted it meets the bound behind
/// one of them.
#[test]
fn a_lower_rt_budgets_the_jobs_of_a_higher_one() {
    let alone = rt_size_below(None);
    assert_eq!(alone, 4);
    assert!(SAVE + job_on(alone) <= BOUND);
    let k = rt_size_below(Some((MS, 40_000)));
    let interrupted = SAVE + job_on(k) + 40_000 + 2 * SAVE;
    assert!(
        interrupted <= BOUND,
        "{k} CUs per XCC: {} us",
        interrupted / 1000
    );
    assert!(SAVE + job_on(alone) + 40_000 + 2 * SAVE > BOUND);
    // Budget 240 - 20 - (1 x (40 + 2 x 20)) = 140 us: 3 rounds of 50 us,
    // 7 CUs per XCC (150 us; 250 us behind the save and one higher job).
    assert_eq!(k, 7);
}

/// A higher VM that comes many times per job of the RT (every 100 us,
/// three times in its 295 us window) takes more than the budget: no size
/// meets the bound behind it, and the RT keeps the size of the budget
/// without it (no reservation widened for nothing).
#[test]
fn a_higher_rt_beyond_the_budget_leaves_the_size() {
    assert_eq!(rt_size_below(Some((100_000, 40_000))), 4);
}
