//! Fuzz harness `vgpu_regs`: a hostile sequence of vGPU register reads and
//! writes, doorbells and guest memory writes against the front end of one VM
//! (today `mdev::mediator::Mediator`; to be ported to the per-VM
//! `VgpuFrontEnd`). Shared by `fuzz/fuzz_targets/vgpu_regs.rs` and
//! `mdev/tests/fuzz_corpus.rs`.
//!
//! Input: 8-byte ops `[op, a, b0, b1, v0, v1, v2, v3]` (`b` = u16 register or
//! doorbell offset, `v` = u32 value, little endian), at most [`MAX_OPS`]:
//!
//! | op % 7 | action |
//! |---|---|
//! | 0 | `reg_write(b, v)` |
//! | 1 | `reg_read(b)` |
//! | 2 | `doorbell(b)` |
//! | 3 | load the prepared MQD on vHQD `a % 8` (MQD base lo/hi, ACTIVE = 1) |
//! | 4 | submit a valid `Mark` kernel on the prepared queue; doorbell vHQD `a % 8` |
//! | 5 | guest write of `v` into the prepared MQD at dword `b % 512` |
//! | 6 | wait on the last submitted signal (only once it is done: a wait on a live signal blocks up to 10 s) |
//!
//! Writes of `WAIT_SIGNAL_HI` are done only where the wait would not block.
//! After the sequence every vHQD's state and error registers hold defined
//! values, and a second VM loads a queue and runs a kernel to completion.
#![allow(dead_code)]

use abi::mqd::{CP_MQD_BASE_ADDR_HI, CP_MQD_BASE_ADDR_LO, MQD_BYTES};
use abi::queue::AMD_SIGNAL_VALUE;
use abi::vgpu::{reg, NUM_VHQD};
use mdev::mediator::{Mediator, VgpuHandle};
use mdev::sim::testkit::TestVm;
use mdev::topology::GpuTopology;
use scheduler::{SchedConfig, VmParams};

/// Most ops per input.
pub const MAX_OPS: usize = 64;
const OP_BYTES: usize = 8;

struct Guest<'a> {
    m: &'a Mediator,
    h: VgpuHandle,
    vm: TestVm,
    mqd_addr: u64,
    wait_lo: u32,
    last_signal: Option<u64>,
}

impl Guest<'_> {
    fn wait_would_block(&self, addr: u64) -> bool {
        match self
            .vm
            .mem
            .read_u64(addr.wrapping_add(AMD_SIGNAL_VALUE as u64))
        {
            Ok(v) => (v as i64) > 0,
            Err(_) => false,
        }
    }
    fn write(&mut self, off: u64, v: u32) {
        if off == reg::WAIT_SIGNAL_LO as u64 {
            self.wait_lo = v;
        }
        if off == reg::WAIT_SIGNAL_HI as u64 {
            let addr = (u64::from(v) << 32) | u64::from(self.wait_lo);
            if self.wait_would_block(addr) {
                return;
            }
        }
        self.m.reg_write(self.h, off, v);
    }
}

/// Runs one input; panics only on a host bug.
pub fn run(data: &[u8]) {
    let topo = GpuTopology::tiny();
    let m = Mediator::start(topo.clone(), SchedConfig::default(), 0).expect("mediator");
    let mut vm = TestVm::new(8 << 20);
    let mut q = vm.queue(&topo, 16, 5);
    let mqd_addr = q.mqd.get64(CP_MQD_BASE_ADDR_LO, CP_MQD_BASE_ADDR_HI);
    vm.mem.write(mqd_addr, &q.mqd.to_bytes()).unwrap();
    let h = m
        .add_vm(
            "fuzz",
            vm.dyn_mem(),
            VmParams {
                priority: 5,
                weight: 1,
                partition: None,
            },
        )
        .expect("add_vm");
    let mut g = Guest {
        m: &m,
        h,
        vm,
        mqd_addr,
        wait_lo: 0,
        last_signal: None,
    };
    for op in data.chunks_exact(OP_BYTES).take(MAX_OPS) {
        let a = op[1];
        let b = u64::from(u16::from_le_bytes([op[2], op[3]]));
        let v = u32::from_le_bytes([op[4], op[5], op[6], op[7]]);
        let hqd = (reg::HQD_BASE + reg::HQD_STRIDE * (a as usize % NUM_VHQD)) as u64;
        match op[0] % 7 {
            0 => g.write(b, v),
            1 => {
                let _ = g.m.reg_read(g.h, b);
            }
            2 => g.m.doorbell(g.h, b),
            3 => {
                g.write(hqd + reg::CP_MQD_BASE_ADDR as u64, g.mqd_addr as u32);
                g.write(
                    hqd + reg::CP_MQD_BASE_ADDR_HI as u64,
                    (g.mqd_addr >> 32) as u32,
                );
                g.write(hqd + reg::CP_HQD_ACTIVE as u64, 1);
            }
            4 => {
                g.vm.kernel(&mut q, abi::kernel::KernelKind::Mark, 2, 4, 500, 1, false);
                g.last_signal = q.signals.last().copied();
                let db = (a as usize % NUM_VHQD) * abi::vgpu::DOORBELL_STRIDE;
                g.m.doorbell(g.h, db as u64);
            }
            5 => {
                let off = (b as usize % (MQD_BYTES / 4)) * 4;
                g.vm.mem.write_u32(g.mqd_addr + off as u64, v).unwrap();
            }
            _ => {
                if let Some(s) = g.last_signal {
                    g.write(reg::WAIT_SIGNAL_LO as u64, s as u32);
                    g.write(reg::WAIT_SIGNAL_HI as u64, (s >> 32) as u32);
                }
            }
        }
    }
    // Every register stays readable after any sequence, with a defined value.
    for i in 0..NUM_VHQD {
        let hqd = (reg::HQD_BASE + reg::HQD_STRIDE * i) as u64;
        assert!(m.reg_read(h, hqd + reg::CP_HQD_STATE as u64) <= 2);
        assert!(m.reg_read(h, hqd + reg::CP_HQD_ERROR as u64) <= MAX_ERROR_CODE);
    }
    // Another VM is unaffected: its kernel runs to completion.
    let mut b = TestVm::new(8 << 20);
    let mut bq = b.queue(&topo, 16, 15);
    let b_mqd = bq.mqd.get64(CP_MQD_BASE_ADDR_LO, CP_MQD_BASE_ADDR_HI);
    b.mem.write(b_mqd, &bq.mqd.to_bytes()).unwrap();
    let hb = m
        .add_vm(
            "bystander",
            b.dyn_mem(),
            VmParams {
                priority: 15,
                weight: 1,
                partition: None,
            },
        )
        .expect("add_vm");
    let hqd = reg::HQD_BASE as u64;
    m.reg_write(hb, hqd + reg::CP_MQD_BASE_ADDR as u64, b_mqd as u32);
    m.reg_write(
        hb,
        hqd + reg::CP_MQD_BASE_ADDR_HI as u64,
        (b_mqd >> 32) as u32,
    );
    m.reg_write(hb, hqd + reg::CP_HQD_ACTIVE as u64, 1);
    assert_eq!(m.reg_read(hb, hqd + reg::CP_HQD_ERROR as u64), 0);
    b.kernel(&mut bq, abi::kernel::KernelKind::Mark, 2, 4, 500, 1, false);
    m.doorbell(hb, 0);
    let s = *bq.signals.last().unwrap();
    m.reg_write(hb, reg::WAIT_SIGNAL_LO as u64, s as u32);
    m.reg_write(hb, reg::WAIT_SIGNAL_HI as u64, (s >> 32) as u32);
    assert_eq!(
        m.reg_read(hb, reg::WAIT_RESULT as u64),
        abi::vgpu::wait_result::DONE
    );
    assert_eq!(b.verify(&bq), Ok(()));
    m.remove_vm(h);
    m.remove_vm(hb);
    m.shutdown();
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
    let dq = reg::HQD_BASE as u16 + reg::CP_HQD_DEQUEUE_REQUEST as u16;
    let err = reg::HQD_BASE as u16 + reg::CP_HQD_ERROR as u16;
    vec![
        (
            "probe".into(),
            cat((0..0x30u16).step_by(4).map(|o| op(1, 0, o, 0)).collect()),
        ),
        (
            "load-submit-wait-dequeue".into(),
            cat(vec![
                op(3, 0, 0, 0),
                op(4, 0, 0, 0),
                op(4, 0, 0, 0),
                op(6, 0, 0, 0),
                op(1, 0, err, 0),
                op(0, 0, dq, 1),
            ]),
        ),
        (
            "bad-mqd-then-load".into(),
            cat(vec![
                op(5, 0, 0, 0xdead_beef),
                op(3, 1, 0, 0),
                op(1, 1, err + 0x40, 0),
            ]),
        ),
        (
            "stray-doorbells".into(),
            cat(vec![
                op(2, 0, 0, 0),
                op(2, 0, 4095, 0),
                op(3, 0, 0, 0),
                op(2, 0, 8, 0),
            ]),
        ),
        (
            "wait-bad-signal".into(),
            cat(vec![
                op(0, 0, reg::WAIT_SIGNAL_LO as u16, 0xFFFF_FFF0),
                op(0, 0, reg::WAIT_SIGNAL_HI as u16, 0xFFFF_FFFF),
                op(1, 0, reg::WAIT_RESULT as u16, 0),
            ]),
        ),
    ]
}
