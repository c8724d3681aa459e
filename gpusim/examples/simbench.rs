//! Simulated GPU benchmark.
//!
//! `cargo run --release -p hqdmux-gpusim --example simbench [vms] [queues_per_vm]`
//!
//! 1. Virtual time: MI300X topology (SPX, 304 CUs, 24 user slots), `vms` x
//!    `queues_per_vm` queues (default 64 x 16) of 32 Mark/Spin kernels, a 1 ms
//!    round-robin time slice that preempts every mapped queue with SaveWaves and
//!    maps the next ones. Prints simulated workgroups per host second and checks
//!    every mark counter is exactly 1.
//! 2. Real time: `RealTimeDriver` on the same model, 8 queues of back-to-back
//!    100 us packets; prints lateness of completion delivery vs modelled time.

#![allow(clippy::needless_range_loop)]

use abi::kernel::KernelKind;
use gpu::backend::{DequeueMode, GpuEvent, PhysGpu, SlotId};
use gpu::topology::GpuTopology;
use gpusim::sim::testkit::{map_req, GuestQueue, TestVm};
use gpusim::sim::{RealTimeDriver, SimGpu};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

fn pct(v: &mut [u64], p: usize) -> u64 {
    v.sort_unstable();
    if v.is_empty() {
        return 0;
    }
    v[(v.len() * p / 100).min(v.len() - 1)]
}

fn virtual_time(vms: usize, qpv: usize) {
    let topo = GpuTopology::default();
    let mut gpu = SimGpu::new(topo.clone(), 1).unwrap();
    let nslots = topo.user_slots().len();
    let per_q = topo.min_cwsr_area_bytes() as usize;
    let mut vmv: Vec<TestVm> = Vec::new();
    let mut qs: Vec<(usize, GuestQueue)> = Vec::new();
    let kernels = 32u32;
    let groups = 64u32;
    for v in 0..vms {
        let mut vm = TestVm::new(qpv * (per_q + (1 << 20)) + (8 << 20));
        for i in 0..qpv {
            let mut q = vm.queue(&topo, 256, (i % 16) as u32);
            for k in 0..kernels {
                let kind = if k % 2 == 0 {
                    KernelKind::Mark
                } else {
                    KernelKind::Spin
                };
                vm.kernel(
                    &mut q,
                    kind,
                    groups,
                    64,
                    20_000 + 1000 * (k as u64 % 5),
                    k,
                    false,
                );
            }
            qs.push((v, q));
        }
        vmv.push(vm);
    }
    let nq = qs.len();
    let mut waiting: VecDeque<usize> = (0..nq).collect();
    let mut slot_q: Vec<Option<usize>> = vec![None; nslots];
    let mut unmapping = vec![false; nslots];
    let mut done = vec![false; nq];
    let slice = 1_000_000u64;
    let mut next_slice = slice;
    let mut now = 0u64;
    let mut ev = Vec::new();
    let mut events = 0u64;
    let t0 = Instant::now();
    loop {
        // Fill free slots.
        for s in 0..nslots {
            if slot_q[s].is_none() {
                if let Some(q) = waiting.pop_front() {
                    let (v, gq) = &qs[q];
                    gpu.map(now, map_req(&vmv[*v], gq, s as u32, q as u64))
                        .unwrap();
                    slot_q[s] = Some(q);
                }
            }
        }
        let dl = gpu.next_deadline();
        let t = match dl {
            Some(t) => t.min(next_slice),
            None if slot_q.iter().any(|s| s.is_some()) || !waiting.is_empty() => next_slice,
            None => break,
        };
        now = now.max(t);
        if now >= next_slice {
            next_slice += slice;
            if !waiting.is_empty() {
                for s in 0..nslots {
                    if slot_q[s].is_some() && !unmapping[s] {
                        unmapping[s] = true;
                        gpu.unmap(now, SlotId(s as u32), DequeueMode::SaveWaves)
                            .unwrap();
                    }
                }
            }
        }
        gpu.advance(now, &mut ev);
        for e in ev.drain(..) {
            events += 1;
            match e {
                GpuEvent::Unmapped {
                    slot,
                    tag,
                    mqd,
                    has_work,
                    ..
                } => {
                    let q = tag as usize;
                    qs[q].1.mqd = *mqd;
                    slot_q[slot.0 as usize] = None;
                    unmapping[slot.0 as usize] = false;
                    if has_work {
                        waiting.push_back(q);
                    } else {
                        done[q] = true;
                    }
                }
                GpuEvent::QueueIdle { slot, at, .. } => {
                    let s = slot.0 as usize;
                    if !unmapping[s] {
                        unmapping[s] = true;
                        gpu.unmap(at, slot, DequeueMode::DrainPipe).unwrap();
                    }
                }
                GpuEvent::QueueError { reason, .. } => panic!("queue error {reason}"),
                GpuEvent::PacketCompleted { .. } | GpuEvent::DequeueTimedOut { .. } => {}
            }
        }
    }
    let host = t0.elapsed();
    let st = gpu.stats().clone();
    for (v, q) in &qs {
        vmv[*v].verify(q).expect("functional check");
    }
    assert!(done.iter().all(|d| *d));
    assert_eq!(st.wgs_completed, nq as u64 * kernels as u64 * groups as u64);
    let wps = st.wgs_completed as f64 / host.as_secs_f64();
    println!(
        "virtual time: {vms} VMs x {qpv} queues on MI300X SPX ({} slots, 304 CUs), 1 ms slices",
        nslots
    );
    println!(
        "  simulated {:.2} ms in {:.3} s host: {} workgroups, {:.2} M wg/s host, {} events, {} saves ({} wgs saved), {} restores",
        now as f64 / 1e6,
        host.as_secs_f64(),
        st.wgs_completed,
        wps / 1e6,
        events,
        st.saves,
        st.saved_wgs,
        st.restores
    );
    println!(
        "  mean modelled save {:.1} us, restore {:.1} us; every mark counter exactly 1, every signal 0",
        st.save_ns_total as f64 / st.saves.max(1) as f64 / 1e3,
        st.restore_ns_total as f64 / st.restores.max(1) as f64 / 1e3
    );
}

fn real_time() {
    let topo = GpuTopology::default();
    let gpu = SimGpu::new(topo.clone(), 1).unwrap();
    let nq = 8usize;
    let packets = 1000u32;
    let cost = 100_000u64;
    let per_q = topo.min_cwsr_area_bytes() as usize;
    let mut vm = TestVm::new(nq * (per_q + (1 << 20)));
    let mut qs = Vec::new();
    for i in 0..nq {
        let mut q = vm.queue(&topo, 1024, 5);
        for k in 0..packets {
            // Barrier bit: packets of a queue run back to back; costs staggered per queue.
            vm.kernel(
                &mut q,
                KernelKind::Spin,
                4,
                64,
                cost + 7_000 * i as u64,
                k,
                true,
            );
        }
        qs.push(q);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let drv = RealTimeDriver::start(gpu, move |e| {
        let _ = tx.send((e, Instant::now()));
    });
    let epoch = drv.epoch();
    for (i, q) in qs.iter().enumerate() {
        let req = map_req(&vm, q, i as u32, i as u64);
        drv.with(|g, now| g.map(now, req).unwrap());
    }
    let mut late = Vec::new();
    let mut at_of = Vec::new();
    let total = nq * packets as usize;
    while late.len() < total {
        let (e, t) = rx.recv_timeout(Duration::from_secs(30)).expect("event");
        if let GpuEvent::PacketCompleted { at, .. } = e {
            let recv = t.duration_since(epoch).as_nanos() as u64;
            late.push(recv.saturating_sub(at));
            at_of.push(at);
        }
    }
    let gpu = drv.stop();
    if std::env::var("SIMBENCH_DEBUG").is_ok() {
        eprintln!("first {:?} last {:?}", &late[..8], &late[late.len() - 8..]);
    }
    // Steady state: completions modelled after the first 10 ms.
    let t_first = at_of.iter().copied().min().unwrap_or(0);
    let mut steady: Vec<u64> = late
        .iter()
        .zip(&at_of)
        .filter(|(_, a)| **a >= t_first + 10_000_000)
        .map(|(l, _)| *l)
        .collect();
    let floor = condvar_floor();
    let p50 = pct(&mut late, 50);
    let p99 = pct(&mut late, 99);
    let max = *late.last().unwrap();
    println!("real time: {nq} queues x {packets} packets of 4 x (100 + 7i) us workgroups, barrier bit ({} completions)", total);
    println!(
        "  completion lateness vs modelled time: p50 {:.1} us, p99 {:.1} us, max {:.1} us ({} wgs)",
        p50 as f64 / 1e3,
        p99 as f64 / 1e3,
        max as f64 / 1e3,
        gpu.stats().wgs_completed
    );
    println!(
        "  steady state (after the first 10 ms): p50 {:.1} us, p99 {:.1} us ({} completions); floor (condvar 100 us wait, same run): p50 {:.1} us, p99 {:.1} us",
        pct(&mut steady, 50) as f64 / 1e3,
        pct(&mut steady, 99) as f64 / 1e3,
        steady.len(),
        floor.0 as f64 / 1e3,
        floor.1 as f64 / 1e3
    );
}

/// Same-run floor: lateness of a plain condvar wait of 100 us on this host.
fn condvar_floor() -> (u64, u64) {
    let m = std::sync::Mutex::new(());
    let c = std::sync::Condvar::new();
    let mut v = Vec::new();
    for _ in 0..1000 {
        let g = m.lock().unwrap();
        let t = Instant::now();
        let _g = c.wait_timeout(g, Duration::from_micros(100)).unwrap();
        v.push((t.elapsed().as_nanos() as u64).saturating_sub(100_000));
    }
    (pct(&mut v, 50), pct(&mut v, 99))
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let vms = args.first().copied().unwrap_or(64);
    let qpv = args.get(1).copied().unwrap_or(16);
    virtual_time(vms, qpv);
    real_time();
}
