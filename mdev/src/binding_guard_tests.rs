//! The misbehaving-VM guard against saves that wait for a VM's own
//! non-preemptible waves (issue 18 item 4), over the binding and the
//! simulated GPU in virtual time: the guard is fed as the arbiter feeds it
//! (`Notice::Unmapped::save_wait_ns` of each VM's queues).

use super::*;
use crate::guard::{GuardConfig, GuardEvent, VmGuard};

const MS: Nanos = 1_000_000;

/// What a run of [`pair`] shows.
struct Outcome {
    /// Each VM's guard (VM 0: the good one, VM 1: the other).
    guards: [VmGuard; 2],
    /// CU-ns of completed work per VM (groups x workgroup cost).
    work: [u64; 2],
    /// Billed GPU time per VM (`VmStats::gpu_ns`).
    billed: [Nanos; 2],
    /// The virtual time the run lasted.
    run: Nanos,
}

/// Two equal VMs (priority 8, weight 1) on [`GpuTopology::tiny`] (4 CUs)
/// for `run` ns of virtual time: VM 0 always busy with full-width kernels
/// of 2 ms workgroups that have save points; VM 1 with what `other`
/// submits (kernels of `(groups, workgroup ns)`, with `NO_SAVE_POINT` when
/// the flag says so). Both guards have `cfg`.
fn pair(cfg: GuardConfig, other: &[(bool, u32, u64)], run: Nanos) -> Outcome {
    pair_at(8, cfg, other, run)
}

/// [`pair`] with VM 1 at priority `other_prio`.
fn pair_at(other_prio: u8, cfg: GuardConfig, other: &[(bool, u32, u64)], run: Nanos) -> Outcome {
    let (mut rig, topo) = Rig::tiny();
    let mut good_vm = vm(&mut rig, 0, 8);
    let mut other_vm = vm(&mut rig, 1, other_prio);
    let mut good = rig.queue(&topo, &mut good_vm, 0, 0, 0, 4096);
    let good_wg = 2 * MS;
    let good_kernels = (run / good_wg + 16) as u32;
    for k in 0..good_kernels {
        good_vm.kernel(&mut good, KernelKind::Spin, 4, 64, good_wg, k, false);
    }
    let mut q = rig.queue(&topo, &mut other_vm, 1, 1, 1, 4096);
    let mut cost = Vec::new();
    for (k, &(nsp, groups, wg)) in other.iter().enumerate() {
        other_vm.kernel_flags = if nsp {
            abi::kernel::flags::NO_SAVE_POINT
        } else {
            0
        };
        other_vm.kernel(&mut q, KernelKind::Spin, groups, 64, wg, k as u32, false);
        cost.push(u64::from(groups) * wg);
    }
    rig.doorbell(QueueId(0), good.wptr);
    rig.doorbell(QueueId(1), q.wptr);
    let mut guards = [VmGuard::new(cfg), VmGuard::new(cfg)];
    let mut work = [0u64; 2];
    let mut seen = 0;
    while rig.step(run, |_| ()).is_some() {
        for n in &rig.log[seen..] {
            match *n {
                Notice::Unmapped {
                    owner,
                    save_wait_ns,
                    ..
                } if save_wait_ns > 0 => {
                    guards[owner].record(rig.now, GuardEvent::SaveWait, save_wait_ns);
                }
                Notice::Completed {
                    owner, dispatch_id, ..
                } => {
                    work[owner] += if owner == 0 {
                        4 * good_wg
                    } else {
                        cost[dispatch_id as usize]
                    };
                }
                _ => {}
            }
        }
        seen = rig.log.len();
        if seen > 100_000 {
            rig.log.clear();
            seen = 0;
        }
    }
    let billed = |v: u32| rig.b.scheduler().vm_stats(VmId(v)).unwrap().gpu_ns;
    Outcome {
        billed: [billed(0), billed(1)],
        guards,
        work,
        run: rig.now,
    }
}

/// A guest that sets `NO_SAVE_POINT` on every kernel (20 ms workgroups,
/// full width: every preemption of it waits for them) beside an equal:
/// each of its saves waits, it is billed those waits, so it gets no more
/// CU time than its share and its neighbour keeps its own; the guard
/// quarantines it within its first window, and never blames the neighbour
/// (whose waves waited on its behalf, and whose own saves never wait).
#[test]
fn a_guest_that_never_reaches_a_save_point_gets_no_more_than_its_share_and_is_quarantined() {
    let cfg = GuardConfig {
        window_ms: 1000,
        ..GuardConfig::default()
    };
    let hostile = vec![(true, 4, 20 * MS); 200];
    let run = 3000 * MS;
    let o = pair(cfg, &hostile, run);
    let capacity = 4 * o.run;
    let [mut good, mut bad] = o.guards;
    let (g, b) = (good.status(o.run), bad.status(o.run));
    println!(
        "work good {} bad {} of {capacity} CU-ns; billed {:?}; bad waited {} ns, trip {:?}",
        o.work[0], o.work[1], o.billed, b.totals[3], b.quarantined
    );
    let t = b.quarantined.expect("the hostile VM is quarantined");
    assert_eq!(t.what, GuardEvent::SaveWait);
    assert!(
        t.at <= 1000 * MS + 1000 * MS / 16,
        "within its first window: {}",
        t.at
    );
    assert!(t.count > cfg.save_wait_allowance_ns());
    // The neighbour: no wait counted, never quarantined.
    assert_eq!(g.totals[3], 0);
    assert!(g.quarantined.is_none());
    // Its waits are billed: equals split the GPU within 5% (plus a 20 ms
    // kernel in flight at the end of each side), CU time and billed time.
    let slack = capacity / 20 + 4 * 20 * MS;
    assert!(
        o.work[1] <= capacity / 2 + slack,
        "the hostile VM got {} of {capacity}",
        o.work[1]
    );
    assert!(
        o.work[0] + slack >= capacity / 2,
        "the neighbour kept {} of {capacity}",
        o.work[0]
    );
    assert!(o.billed[1] >= o.work[1] / 4, "billed {:?}", o.billed);
}

/// One long non-preemptible kernel (500 ms workgroups, half the window)
/// then ordinary kernels: its one save wait is a long kernel, not
/// misbehaviour — the guard counts it and does not quarantine.
#[test]
fn a_single_long_non_preemptible_kernel_is_not_quarantined() {
    let cfg = GuardConfig {
        window_ms: 1000,
        ..GuardConfig::default()
    };
    let mut k = vec![(true, 4, 500 * MS)];
    k.extend(vec![(false, 4, 2 * MS); 1000]);
    let o = pair(cfg, &k, 3000 * MS);
    let [mut good, mut other] = o.guards;
    let st = other.status(o.run);
    println!("waited {} ns, work {:?}", st.totals[3], o.work);
    assert!(st.totals[3] > 100 * MS, "the long kernel's save waited");
    assert!(st.quarantined.is_none(), "{:?}", st.quarantined);
    assert!(good.status(o.run).quarantined.is_none());
    assert_eq!(good.totals()[3], 0);
}

/// The same guest below the top level (priority 5 under 8) runs only in
/// aging batches, whose budget (1/32 of the partition) counts its save
/// waits: its waits stay within that share, below the default 5%, so the
/// default guard leaves it alone and the top VM keeps at least 95% of
/// the GPU; an operator who wants such a VM out sets a lower limit
/// (1%), which trips.
#[test]
fn a_lower_vm_whose_waits_stay_within_its_aging_share_trips_only_a_stricter_limit() {
    let hostile = vec![(true, 4, 20 * MS); 200];
    let run = 3000 * MS;
    for (permille, trips) in [(50, false), (10, true)] {
        let cfg = GuardConfig {
            window_ms: 1000,
            max_save_wait_permille: permille,
            ..GuardConfig::default()
        };
        let o = pair_at(5, cfg, &hostile, run);
        let [_, mut bad] = o.guards;
        let b = bad.status(o.run);
        println!(
            "limit {permille}: work {:?} of {} CU-ns, billed {:?}, waited {} ns, trip {:?}",
            o.work,
            4 * o.run,
            o.billed,
            b.totals[3],
            b.quarantined
        );
        assert!(b.totals[3] > 0, "its aging batches' saves waited");
        assert_eq!(b.quarantined.is_some(), trips, "limit {permille}");
        assert!(o.work[0] * 100 >= 95 * 4 * o.run, "top kept {:?}", o.work);
    }
}
