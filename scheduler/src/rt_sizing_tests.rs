//! An RT's reservation is sized by what the promise's RT bound allows
//! (issue 18, `3-be-retained` beside small RTs; `Spatial::size_for_latency`
//! and the switch budget of `Scheduler::spatial_plan`). The bound allows
//! one save and restore beyond 1.1 x the RT's isolated time; the sizing
//! budgeted only the measured save and restore (2 x 16-41 us on the fuzz
//! seeds 97236, 50142, 50074), and counted every kernel of a multi-kernel
//! job at the widest one's rounds, so small RTs got 5-9 CUs per XCC where
//! 1-2 meet the bound, each a lock-step round of the lower work. Now the
//! budget is the allowance less the save the RT waits, and a job's CU time
//! (reported per doorbell) bounds its time kernel by kernel. Virtual time
//! only.

use super::save_wait_tests::handle;
use super::*;
use crate::spatial::Spatial;

/// MI300X-like geometry: 38 CUs per XCC, 8 XCCs per partition.
const CUS: u32 = 38;
const XCCS: u32 = 8;

/// One kernel of an RT job: workgroups, cost of one alone (ns), repeats.
type Kernel = (u64, Nanos, u64);

/// The job's time on `c` CUs, kernel by kernel, as the simulator runs a
/// lock-step kernel: `sum ceil(W / c) x cost x repeat`.
fn time_on(job: &[Kernel], c: u64) -> Nanos {
    job.iter()
        .map(|&(w, cost, r)| w.div_ceil(c) * cost * r)
        .sum()
}

/// What the binding reports of a doorbell carrying `job`: widest kernel,
/// solo time (one workgroup per kernel, summed) and CU time.
fn report(job: &[Kernel]) -> (u64, Nanos, Nanos) {
    let widest = job.iter().map(|k| k.0).max().unwrap_or(0);
    let solo = job.iter().map(|&(_, cost, r)| cost * r).sum();
    let work = job.iter().map(|&(w, cost, r)| w * cost * r).sum();
    (widest, solo, work)
}

/// A spatial state that saw `job` from VM 1 (with its CU time when
/// `work`), arriving every `interval` ns (0: one arrival).
fn seen(job: &[Kernel], work: bool, interval: Nanos) -> Spatial {
    let mut s = Spatial {
        cus_per_xcc: CUS,
        xccs: XCCS,
        ..Default::default()
    };
    let vm = VmId(1);
    let (widest, solo, cu) = report(job);
    s.note(vm, widest);
    s.note_occupancy(vm, solo, false);
    if work {
        s.note_work(vm, cu);
    }
    if interval > 0 {
        for i in 0..40 {
            s.note_arrival(vm, MS + i * interval);
        }
    }
    s
}

/// Fuzz seed 97236's RT (53 and 32 workgroups of 23.4 us, 3 x 66 of 7.8
/// us; 70 us isolated) with the budget of its run (240 us less an 18 us
/// save): 2 CUs per XCC by its kernels (a 257 us job against 299), where
/// the widest kernel's rounds for every kernel gave 3; with the old budget
/// (2 x 18 us) 9.
#[test]
fn a_multi_kernel_rt_is_sized_by_its_kernels() {
    let job = [(53, 23_356, 1), (32, 23_356, 1), (66, 7_785, 3)];
    let n = (CUS * XCCS) as u64;
    let iso = time_on(&job, n);
    assert_eq!(iso, 70_067);
    let with = seen(&job, true, 803_000);
    let without = seen(&job, false, 803_000);
    let vm = VmId(1);
    assert_eq!(with.size_for_latency(vm, 1, 222_000, 0), Some(2));
    assert!(time_on(&job, 16) <= iso * 11 / 10 + 222_000);
    assert_eq!(without.size_for_latency(vm, 1, 222_000, 0), Some(3));
    assert_eq!(without.size_for_latency(vm, 1, 36_000, 0), Some(9));
}

/// Over generated RT jobs (1-4 kernels of 1-300 workgroups of 2-200 us,
/// repeated 1-3 times), switches of 20-240 us and intervals from none to 8
/// x the job alone: the CU time never asks for more CUs than the widest
/// kernel's rounds did, and where it asks for fewer, the job's time on them
/// kernel by kernel meets the RT bound (1.1 x isolated + switch) and ends
/// within half the interval. It asks for fewer CUs on one case in 40 at
/// least.
#[test]
fn the_work_bound_meets_the_rt_bound_on_fewer_cus() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |m: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % m
    };
    let n = (CUS * XCCS) as u64;
    let vm = VmId(1);
    let (mut fewer, mut cases) = (0, 0);
    for _ in 0..3000 {
        let kernels = 1 + next(4);
        let job: Vec<Kernel> = (0..kernels)
            .map(|_| (1 + next(300), 2_000 + next(198_000), 1 + next(3)))
            .collect();
        let switch = 20_000 + next(220_000);
        let iso = time_on(&job, n);
        let interval = match next(3) {
            0 => 0,
            _ => iso + next(7 * iso + 1),
        };
        let new = seen(&job, true, interval).size_for_latency(vm, 1, switch, 0);
        let old = seen(&job, false, interval).size_for_latency(vm, 1, switch, 0);
        let (Some(new), Some(old)) = (new, old) else {
            panic!("no size for {job:?}");
        };
        cases += 1;
        assert!(new <= old, "{job:?}: {new} CUs per XCC > {old}");
        if new < old {
            fewer += 1;
            let t = time_on(&job, new as u64 * XCCS as u64);
            let at = format!("{job:?} switch {switch} interval {interval}: {new} per XCC");
            assert!(t <= iso * 11 / 10 + switch, "{at}: {t} ns past the bound");
            if interval > 0 {
                assert!(t <= interval / 2, "{at}: {t} ns past half the interval");
            }
        }
    }
    assert!(fewer * 40 >= cases, "fewer CUs in {fewer} of {cases}");
}

/// A world with the geometry and a busy lower VM (VM 0, priority 2) of
/// whole-CU 10 ms workgroups (no co-residence, no drain: its save is the
/// fake GPU's 50 us), and the RT (VM 1, priority 12). Returns (lower
/// queue, RT queue).
fn rig() -> (World, QueueId, QueueId) {
    lockstep_lower_and_owner(CUS)
}

/// The RT's reservation (CUs per XCC) during its 60th job, one job of
/// `job` every 1 ms, its CU time reported when `work`.
fn reservation_of(job: &[Kernel], work: bool) -> u32 {
    let (mut w, _lo, hi) = rig();
    let (widest, solo, cu) = report(job);
    let mut t = MS;
    let mut k = 0;
    for _ in 0..60 {
        w.s.note_dispatch_width(hi, widest);
        w.s.note_dispatch_occupancy(hi, solo, false);
        if work {
            w.s.note_dispatch_work(hi, cu);
        }
        w.submit(hi, solo);
        w.run_until(t + solo / 2);
        k = match w.s.cu_reservation(0) {
            Some((VmId(1), k)) => k,
            _ => 0,
        };
        t += MS;
        w.run_until(t);
    }
    k
}

/// In the engine: one kernel of 152 workgroups of 100 us above lower work
/// saved in 50 us gets the bound's allowance less that save (190 us:
/// 3 rounds, 7 CUs per XCC; 2 x 50 us gave 2 rounds, 10); a job of one
/// 150-wide kernel of 10 us and five of 5 workgroups of 40 us gets 2 CUs
/// per XCC by its CU time (300 us on 16 CUs against 1.1 x 210 + 190),
/// and 10 by the widest kernel's rounds without it.
#[test]
fn the_engine_sizes_by_the_allowance_and_the_jobs_cu_time() {
    assert_eq!(reservation_of(&[(152, 100_000, 1)], true), 7);
    assert_eq!(reservation_of(&[(152, 100_000, 1)], false), 7);
    let job = [(150, 10_000, 1), (5, 40_000, 5)];
    assert_eq!(time_on(&job, 16), 300_000);
    assert_eq!(reservation_of(&job, true), 2);
    assert_eq!(reservation_of(&job, false), 10);
}

/// A bare scheduler (one partition of 4 slots, the geometry): the RT, VM 1
/// at priority 12 (queue 1, one kernel of 152 workgroups of 50 us), above
/// two lower VMs at priority 2, VM 2 (queue 2) and VM 3 (queue 3), each of
/// whole-CU 10 ms workgroups (no drain).
pub(super) fn two_lower() -> Scheduler {
    let mut s = Scheduler::new(SchedConfig::default(), slots(1, 1, 4)).unwrap();
    for (vm, priority) in [(1, 12), (2, 2), (3, 2)] {
        s.add_vm(
            VmId(vm),
            VmParams {
                priority,
                ..Default::default()
            },
        )
        .unwrap();
        s.add_queue(VmId(vm), QueueId(vm as u64), 0).unwrap();
    }
    s.set_cu_geometry(CUS, XCCS);
    for q in [2, 3] {
        s.note_dispatch_width(QueueId(q), 1216);
        s.note_dispatch_occupancy(QueueId(q), 10 * MS, false);
    }
    s.note_dispatch_width(QueueId(1), 152);
    s.note_dispatch_occupancy(QueueId(1), 50_000, false);
    s
}

/// 24 RT jobs 61 ms apart (each sets the reservation up afresh) over both
/// busy lower VMs; a save of VM 2's queue takes 20 us, of VM 3's
/// `save3(i)` at the RT's `i`th job. Returns the RT's reservation (CUs per
/// XCC) at its last arrival.
fn rt_size_beside(save3: impl Fn(u64) -> Nanos) -> u32 {
    let sizes = rt_sizes_beside(|i| (save3(i), 0));
    *sizes.last().expect("24 jobs")
}

/// 24 RT jobs 61 ms apart over both busy lower VMs of [`two_lower`] (each
/// sets the reservation up afresh): a save of VM 2's queue takes 20 us;
/// at the RT's `i`th job `save3(i)` gives VM 3's save and the part of it
/// reported as a wait for its own waves without a save point (0: none).
/// Returns the RT's reservation (CUs per XCC) at each arrival.
pub(super) fn rt_sizes_beside(save3: impl Fn(u64) -> (Nanos, Nanos)) -> Vec<u32> {
    let mut s = two_lower();
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
    let mut t = 0;
    let mut ks = Vec::new();
    for i in 1..=24 {
        t += 61 * MS;
        let saved = handle(
            &mut s,
            Event::Doorbell {
                queue: QueueId(1),
                wptr: i,
                now: t,
            },
        );
        ks.push(s.cu_reservation(0).map_or(0, |(_, k)| k));
        let mut end = t;
        for q in saved {
            let (save, wait) = if q == QueueId(3) {
                save3(i)
            } else {
                (20_000, 0)
            };
            end = end.max(t + save);
            if wait > 0 {
                s.note_save_wait(q, wait);
            }
            handle(
                &mut s,
                Event::Unmapped {
                    queue: q,
                    has_work: true,
                    save_ns: save,
                    now: t + save,
                },
            );
        }
        handle(
            &mut s,
            Event::QueueIdle {
                queue: QueueId(1),
                now: end + 200_000,
            },
        );
    }
    ks
}

/// What the RT waits for is the save of the lower work on its CUs, not
/// the partition's typical save (fuzz seed 50069: one lower VM's whole-CU
/// waves took 106-121 us to save beside another's 10-40 us, and the RT
/// sized by the typical save missed its bound, p99 432 us against 356).
/// Lower saves alternating 120 and 10 us: the moving average (57-73 us)
/// gave a budget of 167-183 us, 4 rounds of 50 us on 5 CUs per XCC, 200
/// us plus a 120 us save past 1.1 x 50 + 240; the longest recent save
/// (105-120 us) gives 120-135 us, 3 rounds on 7 CUs per XCC (150 + 120
/// within it). With 20 us saves: 220 us, 5 rounds, 4 CUs per XCC.
#[test]
fn the_rt_budget_is_less_the_longest_recent_save_below_it() {
    assert_eq!(rt_size_beside(|_| 20_000), 4);
    let k = rt_size_beside(|i| if i % 2 == 0 { 120_000 } else { 10_000 });
    assert_eq!(k, 7);
    let bound = 55_000 + 240_000;
    assert!(152u64.div_ceil(7 * 8) * 50_000 + 120_000 <= bound);
    assert!(152u64.div_ceil(5 * 8) * 50_000 + 120_000 > bound);
}

/// Fuzz seed 97138's RT (27 workgroups of 99 us and 3 x 33 of 33 us, 199
/// us alone, every 432 us) above starved lower work: by the bound alone
/// (a 200 us budget) 3 CUs per XCC, a 397 us job filling its interval, and
/// each aging batch's yield ran out within a few jobs (p99 2828 us against
/// 460). Its job is held to half its interval: one round, 5 CUs per XCC
/// (199 us).
#[test]
fn an_rt_job_is_held_to_half_its_interval() {
    let job = [(27, 99_285, 1), (33, 33_095, 3)];
    let vm = VmId(1);
    assert_eq!(
        seen(&job, true, 0).size_for_latency(vm, 1, 200_000, 0),
        Some(3)
    );
    assert_eq!(time_on(&job, 24), 397_140);
    let k = seen(&job, true, 432_000).size_for_latency(vm, 1, 200_000, 0);
    assert_eq!(k, Some(5));
    assert!(time_on(&job, 40) <= 216_000);
}
