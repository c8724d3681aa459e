//! Fuzz harness `vgpu_regs`: a hostile sequence of vGPU register reads and
//! writes, doorbells, dequeues and guest memory writes against the
//! [`VgpuFrontEnd`] of one VM on a running [`GpuArbiter`] (vGPU ABI v2).
//! Shared by `fuzz/fuzz_targets/vgpu_regs.rs` and `mdev/tests/fuzz_corpus.rs`.
//!
//! Input: 8-byte ops `[op, a, b0, b1, v0, v1, v2, v3]` (`b` = u16 register or
//! doorbell offset, `v` = u32 value, little endian), at most [`MAX_OPS`]:
//!
//! | op % 8 | action |
//! |---|---|
//! | 0 | `reg_write(b, v)` |
//! | 1 | `reg_read(b)` |
//! | 2 | `doorbell_write(b)` (a doorbell the VMM saw itself) |
//! | 3 | load the prepared MQD on vHQD `a % 8` (MQD base lo/hi, ACTIVE = 1) |
//! | 4 | submit a valid `Mark` kernel (interrupt signal) on the prepared queue; ring vHQD `a % 8`'s doorbell eventfd |
//! | 5 | guest write of `v` into the prepared MQD at dword `b % 512` |
//! | 6 | wait for the last submitted signal: completion interrupt or signal value 0, bounded |
//! | 7 | `CP_HQD_DEQUEUE_REQUEST` of vHQD `a % 8` = `v % 5` (0, DRAIN, RESET, SAVE, invalid); if `b` is odd, poll `CP_HQD_ACTIVE` until 0, bounded |
//!
//! Waits share one budget of [`WAIT_BUDGET`] per input, so a hostile input
//! (waits on queues that can never run) stays fast ([`run_outcome`] takes
//! another budget for tests). After the sequence every
//! vHQD's state, active and error registers hold defined values, and a second
//! VM (priority 15) loads a queue and completes a kernel (its completion
//! interrupt arrives within [`BYSTANDER_DEADLINE`]).
#![allow(dead_code)]

use abi::mqd::MQD_BYTES;
use abi::queue::AMD_SIGNAL_VALUE;
use abi::vgpu::{hqd_state, reg, NUM_VHQD};
use gpu::topology::GpuTopology;
use gpusim::sim::testkit::{GuestQueue, TestVm};
use mdev::arbiter::GpuArbiter;
use mdev::probe::{hqd_reg as hr, interrupt_signal, load_hqd as load, mqd_addr, RecordingIrqs};
use scheduler::{SchedConfig, VmParams};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most ops per input.
pub const MAX_OPS: usize = 64;
const OP_BYTES: usize = 8;
/// Total time one input may spend in waits (ops 6 and 7).
pub const WAIT_BUDGET: Duration = Duration::from_millis(50);
/// Deadline of the bystander's kernel (a hang is a host bug, not slowness).
pub const BYSTANDER_DEADLINE: Duration = Duration::from_secs(20);

/// A `Mark` kernel whose completion signal carries an event mailbox (so it
/// raises the vHQD's vector); returns the signal.
fn kernel(vm: &mut TestVm, q: &mut GuestQueue, mailbox: u64, id: u32) -> u64 {
    vm.kernel(q, abi::kernel::KernelKind::Mark, 2, 4, 500, id, false);
    let s = *q.signals.last().expect("kernel pushed a signal");
    interrupt_signal(&*vm.mem, s, mailbox, id).expect("signal in memory");
    s
}

fn signal_done(vm: &TestVm, s: u64) -> bool {
    vm.mem
        .read_u64(s + AMD_SIGNAL_VALUE as u64)
        .is_ok_and(|v| (v as i64) <= 0)
}

/// What the guest saw during one input (for tests that the seeds reach
/// the deep paths).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Op-6 waits whose signal completed.
    pub completed_waits: u32,
    /// Op-7 polls that saw `CP_HQD_ACTIVE` drop to 0.
    pub finished_dequeues: u32,
}

/// Runs one input; panics only on a host bug.
pub fn run(data: &[u8]) {
    run_outcome(data, WAIT_BUDGET);
}

/// [`run`] with a wait budget of `budget` (instead of [`WAIT_BUDGET`]),
/// returning what the guest saw.
pub fn run_outcome(data: &[u8], budget: Duration) -> Outcome {
    let mut out = Outcome::default();
    let topo = GpuTopology::tiny();
    let gpu = gpusim::realtime_backend(&topo, &gpusim::SimParams::default(), 0).expect("backend");
    let arb = GpuArbiter::start(topo.clone(), SchedConfig::default(), gpu).expect("arbiter");
    let mut vm = TestVm::new(8 << 20);
    let mut q = vm.queue(&topo, 16, 5);
    let mqd_at = mqd_addr(&q);
    vm.mem.write(mqd_at, &q.mqd.to_bytes()).unwrap();
    let mailbox = vm.alloc(8, 8);
    let irqs = Arc::new(RecordingIrqs::new());
    let (h, fe) = arb
        .add_vm(
            "fuzz",
            vm.dyn_mem(),
            VmParams {
                priority: 5,
                weight: 1,
                partition: None,
            },
            irqs.clone(),
        )
        .expect("add_vm");
    let budget_end = Instant::now() + budget;
    let mut last_signal = None;
    let mut id = 0u32;
    for op in data.chunks_exact(OP_BYTES).take(MAX_OPS) {
        let a = op[1] as usize % NUM_VHQD;
        let b = u64::from(u16::from_le_bytes([op[2], op[3]]));
        let v = u32::from_le_bytes([op[4], op[5], op[6], op[7]]);
        match op[0] % 8 {
            0 => fe.reg_write(b, v),
            1 => {
                let _ = fe.reg_read(b);
            }
            2 => fe.doorbell_write(b),
            3 => load(&fe, a, mqd_at),
            4 => {
                id = id.wrapping_add(1);
                last_signal = Some(kernel(&mut vm, &mut q, mailbox, id));
                // What KVM does for an ioeventfd doorbell.
                fe.doorbell_eventfd(a).write(1).expect("eventfd");
            }
            5 => {
                let off = (b as usize % (MQD_BYTES / 4)) * 4;
                vm.mem.write_u32(mqd_at + off as u64, v).unwrap();
            }
            6 => {
                if let Some(s) = last_signal.take() {
                    if irqs.wait_until(budget_end, || signal_done(&vm, s)) {
                        out.completed_waits += 1;
                    }
                }
            }
            _ => {
                fe.reg_write(hr(a, reg::CP_HQD_DEQUEUE_REQUEST), v % 5);
                if b & 1 == 1
                    && irqs.wait_until(budget_end, || fe.reg_read(hr(a, reg::CP_HQD_ACTIVE)) == 0)
                {
                    out.finished_dequeues += 1;
                }
            }
        }
    }
    // Every register stays readable after any sequence, with a defined value.
    for i in 0..NUM_VHQD {
        let state = fe.reg_read(hr(i, reg::CP_HQD_STATE));
        assert!(state <= hqd_state::DEQUEUING, "vHQD {i}: state {state}");
        let active = fe.reg_read(hr(i, reg::CP_HQD_ACTIVE));
        assert_eq!(active, (state != hqd_state::UNLOADED) as u32, "vHQD {i}");
        let err = fe.reg_read(hr(i, reg::CP_HQD_ERROR));
        assert!(err <= MAX_ERROR_CODE, "vHQD {i}: error {err}");
        let dq = fe.reg_read(hr(i, reg::CP_HQD_DEQUEUE_REQUEST));
        assert!(dq <= abi::vgpu::dequeue::SAVE, "vHQD {i}: dequeue {dq}");
    }
    assert!(!fe.quarantined(), "a guest input is not a host bug");
    // Another VM is unaffected: its kernel runs to completion.
    let mut bvm = TestVm::new(8 << 20);
    let mut bq = bvm.queue(&topo, 16, 15);
    let b_mqd = mqd_addr(&bq);
    bvm.mem.write(b_mqd, &bq.mqd.to_bytes()).unwrap();
    let b_mailbox = bvm.alloc(8, 8);
    let b_irqs = Arc::new(RecordingIrqs::new());
    let (hb, bfe) = arb
        .add_vm(
            "bystander",
            bvm.dyn_mem(),
            VmParams {
                priority: 15,
                weight: 1,
                partition: None,
            },
            b_irqs.clone(),
        )
        .expect("add_vm");
    load(&bfe, 0, b_mqd);
    assert_eq!(bfe.reg_read(hr(0, reg::CP_HQD_ERROR)), 0);
    let s = kernel(&mut bvm, &mut bq, b_mailbox, 7);
    bfe.doorbell_eventfd(0).write(1).expect("eventfd");
    let done = b_irqs.wait_until(Instant::now() + BYSTANDER_DEADLINE, || {
        signal_done(&bvm, s) && bvm.mem.read_u64(b_mailbox).is_ok_and(|m| m as u32 == 7)
    });
    assert!(done, "bystander kernel did not complete");
    assert_eq!(bvm.verify(&bq), Ok(()));
    assert_eq!(bfe.reg_read(hr(0, reg::CP_HQD_ERROR)), 0);
    arb.remove_vm(h);
    arb.remove_vm(hb);
    arb.shutdown();
    out
}

/// Largest `CP_HQD_ERROR` code of the vGPU ABI (`abi::vgpu::error`).
const MAX_ERROR_CODE: u32 = abi::vgpu::error::BAD_CWSR_LAYOUT;

fn op(code: u8, a: u8, b: u16, v: u32) -> Vec<u8> {
    let mut o = vec![code, a];
    o.extend_from_slice(&b.to_le_bytes());
    o.extend_from_slice(&v.to_le_bytes());
    o
}

/// Seed inputs: the register sequences a driver uses, and a few hostile ones.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let cat = |ops: Vec<Vec<u8>>| ops.concat();
    let hq = |i: u16, r: usize| reg::HQD_BASE as u16 + reg::HQD_STRIDE as u16 * i + r as u16;
    let err = hq(0, reg::CP_HQD_ERROR);
    vec![
        (
            "probe".into(),
            cat((0..0x40u16).step_by(4).map(|o| op(1, 0, o, 0)).collect()),
        ),
        (
            "load-submit-wait-drain".into(),
            cat(vec![
                op(3, 0, 0, 0),
                op(4, 0, 0, 0),
                op(4, 0, 0, 0),
                op(6, 0, 0, 0),
                op(1, 0, err, 0),
                op(7, 0, 1, 1),
                op(1, 0, hq(0, reg::CP_HQD_STATE), 0),
                op(1, 0, reg::INT_STATUS as u16, 0),
                op(0, 0, reg::INT_STATUS as u16, 0xFFFF_FFFF),
            ]),
        ),
        (
            "submit-save-reload".into(),
            cat(vec![
                op(3, 2, 0, 0),
                op(4, 2, 0, 0),
                op(7, 2, 1, 3),
                op(3, 2, 0, 0),
                op(4, 2, 0, 0),
                op(6, 0, 0, 0),
                op(7, 2, 0, 2),
                op(7, 2, 1, 2),
            ]),
        ),
        (
            "double-load-dequeue-pending".into(),
            cat(vec![
                op(3, 1, 0, 0),
                op(3, 3, 0, 0),
                op(4, 1, 0, 0),
                op(7, 1, 0, 3),
                op(7, 1, 0, 1),
                op(1, 1, hq(1, reg::CP_HQD_DEQUEUE_REQUEST), 0),
                op(7, 3, 0, 4),
                op(7, 3, 1, 2),
            ]),
        ),
        (
            "bad-mqd-then-load".into(),
            cat(vec![
                op(5, 0, 0, 0xdead_beef),
                op(3, 1, 0, 0),
                op(1, 1, hq(1, reg::CP_HQD_ERROR), 0),
                op(7, 1, 0, 1),
            ]),
        ),
        (
            "stray-doorbells".into(),
            cat(vec![
                op(2, 0, 0, 0),
                op(2, 0, 4095, 0),
                op(3, 0, 0, 0),
                op(2, 0, 8, 0),
                op(2, 0, 0, 0),
            ]),
        ),
        (
            "v1-wait-registers".into(),
            cat(vec![
                op(0, 0, 0x020, 0xFFFF_FFF0),
                op(0, 0, 0x024, 0xFFFF_FFFF),
                op(1, 0, 0x028, 0),
                op(0, 0, hq(0, reg::CP_MQD_BASE_ADDR), 0xFFFF_FF00),
                op(0, 0, hq(0, reg::CP_MQD_BASE_ADDR_HI), 0xFFFF_FFFF),
                op(0, 0, hq(0, reg::CP_HQD_ACTIVE), 1),
            ]),
        ),
    ]
}
