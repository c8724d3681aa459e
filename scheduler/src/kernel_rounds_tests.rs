//! An RT's job timed kernel by kernel in its latency sizing (issue 18,
//! `engine/kernel_rounds.rs`): fuzz seed 800037's RT (kernels of 44 and 76
//! workgroups of 51 us every 221 us) runs in 153 us on 6 CUs per XCC, but
//! the rounds model (every kernel at the widest one's 2 rounds: 204 us)
//! refused that size within its interval less the gap (171 us) and kept
//! 10 CUs per XCC (best effort 0.729 of alone against 0.764).

use super::*;

/// CUs per XCC (8 XCCs).
const CUS: u32 = 38;
/// The RT's kernels (workgroups, one workgroup's cost) and period.
const KERNELS: [(u64, Nanos); 2] = [(44, 51_210), (76, 51_210)];
const PERIOD: Nanos = 221_000;
/// Its solo time (one workgroup per kernel) and its job on 10 CUs per XCC.
const SOLO: Nanos = 2 * 51_210;

/// The RT (VM 1, priority 12) over a busy lower VM (VM 0, priority 2,
/// whole-CU 10 ms workgroups) that never waits for a boost.
fn world() -> (World, QueueId) {
    super::rt_room_tests::world(500 * MS, |_| {})
}

/// Rings `n` RT jobs `PERIOD` apart as the binding reports them (`kernels`:
/// what `note_dispatch_kernel_costs` is told of each, `None`: nothing);
/// returns the RT's reservation (CUs per XCC, 0: none) halfway through
/// each job's first round.
fn jobs(
    w: &mut World,
    hi: QueueId,
    n: u64,
    kernels: impl Fn(u64) -> Option<Vec<(u64, Nanos)>>,
) -> Vec<u32> {
    let mut t = w.now;
    let mut ks = Vec::new();
    let work: Nanos = KERNELS.iter().map(|&(n, c)| n * c).sum();
    for i in 0..n {
        w.s.note_dispatch_width(hi, 76);
        w.s.note_dispatch_occupancy(hi, SOLO, true);
        w.s.note_dispatch_work(hi, work);
        if let Some(k) = kernels(i) {
            w.s.note_dispatch_kernel_costs(hi, &k);
        }
        // On 6 CUs per XCC: one round of the first kernel, two of the
        // second.
        w.submit(hi, 3 * 51_210);
        w.run_until(t + 51_210 / 2);
        ks.push(match w.s.cu_reservation(0) {
            Some((VmId(1), k)) => k,
            _ => 0,
        });
        t += PERIOD;
        w.run_until(t);
    }
    ks
}

/// With its kernels known, the job is timed kernel by kernel: 153 us on 6
/// CUs per XCC, within the interval less the gap (171 us): 6 CUs per XCC
/// (fails without the kernel-by-kernel time: 10).
#[test]
fn an_rt_of_kernels_of_different_widths_is_sized_kernel_by_kernel() {
    let (mut w, hi) = world();
    let ks = jobs(&mut w, hi, 40, |_| Some(KERNELS.to_vec()));
    assert!(ks[2..].iter().all(|&k| k == 6), "{ks:?}");
}

/// Without its kernels (a backend without estimates), the rounds model
/// decides: two rounds of both kernels (204 us) leave no gap that breaks
/// the RT's demand, so one round: 76 CUs, 10 per XCC.
#[test]
fn without_its_kernels_the_rounds_model_decides() {
    let (mut w, hi) = world();
    let ks = jobs(&mut w, hi, 40, |_| None);
    assert!(ks[2..].iter().all(|&k| k == 10), "{ks:?}");
}

/// Kernels that are not those the VM's aggregates hold (a latest doorbell
/// narrower than its widest recent one) are not used: 10 CUs per XCC.
#[test]
fn kernels_other_than_the_aggregates_are_not_used() {
    let (mut w, hi) = world();
    let ks = jobs(&mut w, hi, 40, |_| Some(vec![(44, 51_210), (40, 51_210)]));
    assert!(ks[2..].iter().all(|&k| k == 10), "{ks:?}");
}

/// The time kernel by kernel on `c` CUs in all: `sum ceil(q x W_i / c) x
/// cost_i`, and the fewest CUs within a budget.
#[test]
fn the_time_kernel_by_kernel() {
    let mut s = crate::spatial::Spatial {
        cus_per_xcc: CUS,
        xccs: 8,
        ..Default::default()
    };
    let vm = VmId(1);
    s.note(vm, 76);
    s.note_occupancy(vm, SOLO, true);
    s.note_work(vm, KERNELS.iter().map(|&(n, c)| n * c).sum());
    assert_eq!(s.kernel_time_on_cus(vm, 1, 48), None, "no kernels yet");
    s.note_kernel_costs(vm, &KERNELS);
    assert_eq!(s.kernel_time_on_cus(vm, 1, 40), Some(4 * 51_210));
    assert_eq!(s.kernel_time_on_cus(vm, 1, 48), Some(3 * 51_210));
    assert_eq!(s.kernel_time_on_cus(vm, 1, 76), Some(2 * 51_210));
    // Two busy queues: 88 and 152 workgroups.
    assert_eq!(s.kernel_time_on_cus(vm, 2, 88), Some(3 * 51_210));
    // Within 171 us: 44 CUs, 6 per XCC.
    assert_eq!(s.cus_by_kernels(vm, 1, 304, 171_000), Some(44));
    // Within its time alone (below it: its time alone): 76.
    assert_eq!(s.cus_by_kernels(vm, 1, 304, 50_000), Some(76));
    // Forgotten with an empty doorbell's record.
    s.note_kernel_costs(vm, &[]);
    assert_eq!(s.kernel_time_on_cus(vm, 1, 48), None);
}
