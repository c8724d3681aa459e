//! An RT's switch budget counts the lower saves' waits for waves without a
//! save point (`engine/nsp_save.rs`; fuzz seed 300129: a 169 us save, 84
//! us of it waiting for flagged waves, before an RT job sized for an 85 us
//! save, 307 us against its bound of 273). Virtual time only.

use super::rt_sizing_tests::rt_sizes_beside;
use super::*;

/// The RT rig's bound: 1.1 x its 50 us alone + the 240 us allowance.
const BOUND: Nanos = 55_000 + 240_000;

/// 24 RT jobs over both busy lower VMs of `two_lower`
/// (`rt_sizing_tests::rt_sizes_beside`): a save of either lower queue is
/// 20 us, VM 3's after a reported wait of `wait3(i)` for its own waves
/// without a save point at the RT's `i`th job. Returns the RT's
/// reservation (CUs per XCC) at each arrival.
fn sizes_beside_waits(wait3: impl Fn(u64) -> Nanos) -> Vec<u32> {
    rt_sizes_beside(|i| {
        let wait = wait3(i);
        (wait + 20_000, wait)
    })
}

/// The RT's job (152 workgroups of 50 us) on `k` CUs per XCC (8 XCCs).
fn job_on(k: u32) -> Nanos {
    152u64.div_ceil(k as u64 * 8) * 50_000
}

/// Waits of 20-200 us before a 20 us save: the RT sized on the clean save
/// alone gets 4 CUs per XCC (a 250 us job, past the bound after any wait
/// of more than 25 us); budgeting the whole save, each job after the
/// first wait meets the bound behind it. A wait the allowance cannot
/// absorb (220 us and more, with the save) leaves the clean budget.
#[test]
fn the_rt_budget_is_less_the_whole_save_with_its_wait() {
    let clean = *sizes_beside_waits(|_| 0).last().unwrap();
    assert_eq!(clean, 4);
    assert!(job_on(clean) + 20_000 <= BOUND);
    for wait in (20_000..=260_000).step_by(20_000) {
        let ks = sizes_beside_waits(|_| wait);
        let k = *ks.last().unwrap();
        if wait + 20_000 < 240_000 {
            assert!(
                job_on(k) + wait + 20_000 <= BOUND,
                "wait {wait}: {k} CUs per XCC, job {} us",
                job_on(k) / 1000
            );
        } else {
            assert_eq!(k, clean, "wait {wait}");
        }
    }
    // 300129's figures, scaled: an 80 us wait needs 7 CUs per XCC (3
    // rounds), where the clean save gave 4 (5 rounds, 350 us in all).
    assert_eq!(*sizes_beside_waits(|_| 80_000).last().unwrap(), 7);
    assert!(job_on(4) + 100_000 > BOUND);
}

/// Once the VM's saves stop waiting, its whole save decays by 1/8 per
/// save to the clean one and the RT's reservation shrinks back (no guest
/// keeps it wide with waits long gone).
#[test]
fn the_whole_save_decays_once_the_waits_stop() {
    let ks = sizes_beside_waits(|i| if i <= 4 { 100_000 } else { 0 });
    assert_eq!(ks[5], 7);
    assert_eq!(*ks.last().unwrap(), 4);
}
