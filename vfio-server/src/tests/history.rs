//! Issue 19: the vGPU's guard and hang escalation belong to the vGPU, not
//! to the connection: a VMM that reconnects after each hang is escalated
//! and quarantined as one that stays; only the operator starts it over.

use super::*;
use abi::vgpu::{error, hqd_state};

/// Loads a kernel on vHQD 0 that never reaches a save point and waits
/// until it is on an HQD.
fn hang(g: &mut Guest, seed: u32) {
    g.load(0);
    g.tvm.kernel_flags = abi::kernel::flags::NO_SAVE_POINT;
    let w = g.kernel(4, 60_000_000_000, seed);
    g.tvm.kernel_flags = 0;
    g.ring(0, w);
    wait("hung on an HQD", || {
        g.rd(hqd_reg(0, reg::CP_HQD_STATE)) == hqd_state::ON_HQD
    });
}

/// The high-priority guest runs a kernel (preempting the hung one) and the
/// hung one is reset with error 22.
fn preempt(hi: &mut Guest, g: &mut Guest, seed: u32) {
    hi.run_small(seed, "high-priority kernel");
    wait("error 22", || {
        g.rd(hqd_reg(0, reg::CP_HQD_ERROR)) == error::PREEMPTION_TIMEOUT
    });
}

fn reconnect(srv: &VgpuServer, g: Guest, a: &Arc<GpuArbiter>) -> (Guest, VmId) {
    let old = srv.handle();
    drop(g);
    wait("released", || srv.handle().is_none());
    let mut g = Guest::attach(srv.path(), a.topology());
    assert_eq!(g.rd(reg::VGPU_ID as u64), VGPU_ID_VALUE);
    let h = srv.handle().expect("registered");
    assert_ne!(Some(h), old);
    (g, h)
}

#[test]
fn hangs_are_escalated_and_quarantined_across_reconnects_until_the_operator_clears() {
    let a = tiny_arbiter();
    let mut sp = spec("rehang", 2);
    // 500 ms: one hang shows (500 / 4 > the escalation's 100 ms floor).
    sp.guard.max_resets = 1;
    let srv = serve_spec(&a, sp, ServerOptions::default());
    let hi_srv = serve(&a, "rehang-hi", 12, ServerOptions::default());
    let mut hi = Guest::attach(hi_srv.path(), a.topology());
    hi.load(0);

    // Hang 1, then the VMM disconnects and reconnects.
    let mut g = Guest::attach(srv.path(), a.topology());
    let base = a.effective_preempt_timeout(srv.handle().unwrap()).unwrap();
    assert_eq!(base, Duration::from_millis(500));
    hang(&mut g, 1);
    preempt(&mut hi, &mut g, 1);
    let escalated = a.effective_preempt_timeout(srv.handle().unwrap()).unwrap();
    assert!(escalated < base, "{escalated:?}");
    let (mut g, h) = reconnect(&srv, g, &a);
    assert_eq!(
        a.effective_preempt_timeout(h),
        Some(escalated),
        "the reconnected vGPU keeps its escalated timeout"
    );
    assert_eq!(a.guard_status(h).unwrap().resets, 1);
    assert!(srv.quarantined().is_none());

    // Hang 2 on the new connection: escalated further and past the guard's
    // limit of one reset, as it would have been without the disconnect.
    hang(&mut g, 2);
    preempt(&mut hi, &mut g, 2);
    assert!(a.effective_preempt_timeout(h).unwrap() < escalated);
    let trip = srv.quarantined().expect("quarantined");
    assert_eq!((trip.count, trip.limit), (2, 1));

    // The quarantine outlives the connection and a device reset.
    let (mut g, h) = reconnect(&srv, g, &a);
    assert!(srv.quarantined().is_some());
    g.client.reset().unwrap();
    assert!(srv.quarantined().is_some(), "a reset is no way out");
    g.load(0);
    // The load is refused by the arbiter's service thread.
    wait("load refused", || {
        g.rd(hqd_reg(0, reg::CP_HQD_ERROR)) == error::QUARANTINED
    });
    assert_eq!(g.rd(hqd_reg(0, reg::CP_HQD_ACTIVE)), 0);
    assert_ne!(srv.handle(), Some(h));
    drop(g);
    wait("released", || srv.handle().is_none());
    assert!(srv.quarantined().is_some(), "kept while idle");

    // The operator clears it while no client is connected: the next
    // client loads and runs kernels.
    assert!(srv.clear_quarantine());
    assert!(!srv.clear_quarantine());
    let mut g = Guest::attach(srv.path(), a.topology());
    g.load(0);
    g.run_small(3, "kernels after the clear");
    g.tvm.verify(&g.q).unwrap();
    assert_eq!(g.rd(hqd_reg(0, reg::CP_HQD_ERROR)), 0);
    srv.stop();
    hi_srv.stop();
}

/// Removing the vGPU and creating it again (a new server) is the
/// operator's other way to start it over: the new one has no history.
#[test]
fn a_new_server_of_the_same_name_starts_over() {
    let a = tiny_arbiter();
    let mut sp = spec("again", 2);
    sp.guard.max_queue_errors = 0;
    sp.guard.max_resets = 0;
    let srv = VgpuServer::bind(
        &sock("again"),
        sp.clone(),
        a.clone(),
        ServerOptions::default(),
    )
    .unwrap();
    let serving = srv.spawn().unwrap();
    let hi_srv = serve(&a, "again-hi", 12, ServerOptions::default());
    let mut hi = Guest::attach(hi_srv.path(), a.topology());
    hi.load(0);
    let mut g = Guest::attach(srv.path(), a.topology());
    hang(&mut g, 1);
    preempt(&mut hi, &mut g, 1);
    drop(g);
    srv.stop();
    wait("released", || srv.handle().is_none());
    // As the API's removal does: the serving thread (and its listener) is
    // gone before the same socket is bound again.
    serving.join().unwrap();
    drop(srv);
    let srv = VgpuServer::bind(&sock("again"), sp, a.clone(), ServerOptions::default()).unwrap();
    srv.spawn().unwrap();
    let mut g = Guest::attach(srv.path(), a.topology());
    assert_eq!(g.rd(reg::VGPU_ID as u64), VGPU_ID_VALUE);
    let h = srv.handle().unwrap();
    assert_eq!(
        a.effective_preempt_timeout(h),
        Some(Duration::from_millis(500))
    );
    assert_eq!(a.guard_status(h).unwrap().resets, 0);
    srv.stop();
    hi_srv.stop();
}

/// The VMM leaves while the preemption of its hung queue is still pending
/// (before the timeout): the timeout still counts for the vGPU, and the
/// next connection is escalated and counted as if it had stayed.
#[test]
fn a_vmm_leaving_mid_preemption_still_pays_for_the_hang() {
    let a = tiny_arbiter();
    let mut sp = spec("midhang", 2);
    sp.guard.max_resets = 1;
    let srv = serve_spec(&a, sp, ServerOptions::default());
    let hi_srv = serve(&a, "midhang-hi", 12, ServerOptions::default());
    let mut hi = Guest::attach(hi_srv.path(), a.topology());
    hi.load(0);
    let base = Duration::from_millis(500);
    for round in 1..=2u32 {
        let mut g = Guest::attach(srv.path(), a.topology());
        hang(&mut g, round);
        let before = a.stats().preempt_timeouts;
        let asked = a.stats().preemptions;
        let w = hi.kernel(4, 10_000, round);
        hi.ring(0, w);
        wait("preemption asked", || a.stats().preemptions > asked);
        drop(g); // gone before its queue's dequeue timed out
        wait("released", || srv.handle().is_none());
        wait("high-priority kernel", || hi.done());
        wait("timed out", || a.stats().preempt_timeouts > before);
    }
    let mut g = Guest::attach(srv.path(), a.topology());
    assert_eq!(g.rd(reg::VGPU_ID as u64), VGPU_ID_VALUE);
    let h = srv.handle().unwrap();
    assert!(
        a.effective_preempt_timeout(h).unwrap() < base / 4,
        "two hangs escalate the third connection's timeout"
    );
    let trip = srv.quarantined().expect("two resets past a limit of one");
    assert_eq!((trip.count, trip.limit), (2, 1));
    g.load(0);
    // The load is refused by the arbiter's service thread.
    wait("load refused", || {
        g.rd(hqd_reg(0, reg::CP_HQD_ERROR)) == error::QUARANTINED
    });
    assert_eq!(g.rd(hqd_reg(0, reg::CP_HQD_ACTIVE)), 0);
    // Both resets are in the vGPU's one series.
    let m = mdev::probe::exposition_series(&a.metrics_text());
    let resets: Vec<f64> = m
        .iter()
        .filter(|(k, _)| {
            k.starts_with("hqdmux_vm_guard_events_total{")
                && k.contains("vm=\"midhang\"")
                && k.contains("event=\"reset\"")
        })
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(resets, [2.0]);
}
