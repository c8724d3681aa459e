//! Guest-side helpers for tests, benchmarks and the virtual-time harness: a VM
//! memory with a bump allocator, AQL queues built like a ROCr/KFD guest would
//! (MQD, ring, `amd_queue_t`, CWSR area), and built-in kernels with host-side
//! expected results.

use crate::backend::{GpuEvent, MapRequest, PhysGpu, SlotId};
use crate::mem::{DmaMemory, VecMemory};
use crate::topology::GpuTopology;
use abi::aql::{KernelDispatch, Packet};
use abi::kernel::{Kernarg, KernelDescriptor, KernelKind};
use abi::mqd::{AqlMqdBuilder, V9Mqd};
use abi::queue;
use std::sync::Arc;

/// A post-run check of one kernel's result.
#[derive(Clone, Debug)]
pub enum Check {
    /// u32 array must equal `expect`.
    U32s {
        /// Address.
        addr: u64,
        /// Expected values.
        expect: Vec<u32>,
    },
    /// u64 must equal `expect`.
    U64 {
        /// Address.
        addr: u64,
        /// Expected value.
        expect: u64,
    },
}

/// One guest queue.
#[derive(Clone, Debug)]
pub struct GuestQueue {
    /// Current MQD (updated from `Unmapped` events by the caller).
    pub mqd: V9Mqd,
    /// `amd_queue_t` address.
    pub amd_queue: u64,
    /// Ring address.
    pub ring: u64,
    /// Ring size in packets.
    pub ring_packets: u64,
    /// Write index (packets).
    pub wptr: u64,
    /// Completion signals of the submitted packets (each starts at 1).
    pub signals: Vec<u64>,
    /// Checks of the submitted kernels.
    pub checks: Vec<Check>,
    /// Workgroups submitted.
    pub wgs: u64,
}

/// A VM's memory with a bump allocator.
pub struct TestVm {
    /// Memory.
    pub mem: Arc<dyn DmaMemory>,
    next: u64,
    /// Kernel descriptor flags of the kernels [`TestVm::kernel`] submits
    /// (`abi::kernel::flags`; default 0).
    pub kernel_flags: u32,
    /// VGPRs per work-item of the kernels [`TestVm::kernel`] submits (0,
    /// the default: each workgroup occupies a whole CU; see
    /// `sim::occupancy`).
    pub kernel_vgprs: u16,
}

impl TestVm {
    /// `size` bytes of zeroed memory (lazily committed).
    pub fn new(size: usize) -> Self {
        TestVm {
            mem: Arc::new(VecMemory::new(size)),
            next: 0x1000,
            kernel_flags: 0,
            kernel_vgprs: 0,
        }
    }
    /// Use existing memory (e.g. a `GuestMemoryMmap`); allocation starts at `start`.
    pub fn with_memory(mem: Arc<dyn DmaMemory>, start: u64) -> Self {
        TestVm {
            mem,
            next: start,
            kernel_flags: 0,
            kernel_vgprs: 0,
        }
    }
    /// Allocate `size` bytes aligned to `align` (power of two).
    pub fn alloc(&mut self, size: u64, align: u64) -> u64 {
        let a = self.next.div_ceil(align) * align;
        self.next = a + size;
        assert!(self.next <= self.mem.size(), "TestVm out of memory");
        a
    }
    /// Memory as the trait object the GPU wants.
    pub fn dyn_mem(&self) -> Arc<dyn DmaMemory> {
        self.mem.clone()
    }
    /// A new AQL queue with a CWSR area sized for `topo`
    /// ([`GpuTopology::min_cwsr_area_bytes`]: save and debug areas).
    pub fn queue(&mut self, topo: &GpuTopology, ring_packets: u32, priority: u32) -> GuestQueue {
        let mqd_addr = self.alloc(2048, 4096);
        let amdq = self.alloc(256, 64);
        let ring = self.alloc(ring_packets as u64 * 64, 256);
        let eop = self.alloc(4096, 256);
        // Save areas of every XCC of the partition, then their debug areas.
        let ctx = self.alloc(topo.min_cwsr_area_bytes(), 4096);
        let mqd = AqlMqdBuilder {
            mqd_addr,
            ring_base: ring,
            ring_packets,
            amd_queue: amdq,
            eop_base: eop,
            priority,
            ..Default::default()
        }
        .cwsr_for(ctx, topo.cus_per_xcc, topo.ses_per_xcc)
        .build();
        self.mem
            .write(amdq, &queue::amd_queue_image(ring, ring_packets))
            .unwrap();
        GuestQueue {
            mqd,
            amd_queue: amdq,
            ring,
            ring_packets: ring_packets as u64,
            wptr: 0,
            signals: Vec::new(),
            checks: Vec::new(),
            wgs: 0,
        }
    }
    /// Write a packet (body first, header last), bump `write_dispatch_id`.
    /// Returns the new write index (ring the doorbell with it).
    pub fn push(&mut self, q: &mut GuestQueue, p: &Packet) -> u64 {
        let slot = q.ring + (q.wptr % q.ring_packets) * 64;
        let body = p.encode_body();
        self.mem.write(slot + 2, &body[2..]).unwrap();
        self.mem.write(slot, &p.header().to_le_bytes()).unwrap();
        q.wptr += 1;
        self.mem
            .write_u64(
                q.amd_queue + queue::AMD_QUEUE_WRITE_DISPATCH_ID as u64,
                q.wptr,
            )
            .unwrap();
        q.wptr
    }
    /// A signal with value 1.
    pub fn signal(&mut self) -> u64 {
        let s = self.alloc(64, 64);
        self.mem.write(s, &queue::amd_signal_image(1)).unwrap();
        s
    }
    fn u32s(&mut self, vals: &[u32]) -> u64 {
        let a = self.alloc(4 * vals.len().max(1) as u64, 64);
        let b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.mem.write(a, &b).unwrap();
        a
    }
    /// Submit a built-in kernel of `groups` workgroups x `wg_items` items, each
    /// workgroup costing `cost_ns`; `seed` varies the data. Records the check.
    /// Returns the new write index.
    #[allow(clippy::too_many_arguments)]
    pub fn kernel(
        &mut self,
        q: &mut GuestQueue,
        kind: KernelKind,
        groups: u32,
        wg_items: u16,
        cost_ns: u64,
        seed: u32,
        barrier: bool,
    ) -> u64 {
        let n = groups * wg_items as u32;
        let data = |k: u32| -> Vec<u32> {
            (0..n)
                .map(|i| {
                    i.wrapping_mul(2_654_435_761)
                        .wrapping_add(seed ^ k.wrapping_mul(0x9e37))
                })
                .collect()
        };
        let (args, check) = match kind {
            KernelKind::Fill => {
                let dst = self.u32s(&vec![0; n as usize]);
                let v = seed | 1;
                (
                    Kernarg::Fill { dst, n, value: v },
                    Some(Check::U32s {
                        addr: dst,
                        expect: vec![v; n as usize],
                    }),
                )
            }
            KernelKind::VecAdd => {
                let (av, bv) = (data(1), data(2));
                let a = self.u32s(&av);
                let b = self.u32s(&bv);
                let c = self.u32s(&vec![0; n as usize]);
                let e = av
                    .iter()
                    .zip(&bv)
                    .map(|(x, y)| x.wrapping_add(*y))
                    .collect();
                (
                    Kernarg::VecAdd { a, b, c, n },
                    Some(Check::U32s { addr: c, expect: e }),
                )
            }
            KernelKind::Saxpy => {
                let (xv, yv) = (data(3), data(4));
                let x = self.u32s(&xv);
                let y = self.u32s(&yv);
                let a = seed.wrapping_mul(7) | 3;
                let e = xv
                    .iter()
                    .zip(&yv)
                    .map(|(x, y)| a.wrapping_mul(*x).wrapping_add(*y))
                    .collect();
                (
                    Kernarg::Saxpy { x, y, n, a },
                    Some(Check::U32s { addr: y, expect: e }),
                )
            }
            KernelKind::Checksum => {
                let sv = data(5);
                let src = self.u32s(&sv);
                let out = self.alloc(8, 8);
                let e = sv.iter().fold(0u64, |s, v| s.wrapping_add(*v as u64));
                (
                    Kernarg::Checksum { src, out, n },
                    Some(Check::U64 {
                        addr: out,
                        expect: e,
                    }),
                )
            }
            KernelKind::Mark => {
                let c = self.u32s(&vec![0; groups as usize]);
                (
                    Kernarg::Mark {
                        counters: c,
                        n: groups,
                    },
                    Some(Check::U32s {
                        addr: c,
                        expect: vec![1; groups as usize],
                    }),
                )
            }
            KernelKind::Spin => (Kernarg::Spin { ns: 0 }, None),
        };
        let kd = self.alloc(64, 64);
        self.mem
            .write(
                kd,
                &KernelDescriptor::new(kind, cost_ns)
                    .with_flags(self.kernel_flags)
                    .with_vgprs(self.kernel_vgprs)
                    .encode(),
            )
            .unwrap();
        let (kb, len) = args.encode();
        let ka = self.alloc(32, 16);
        self.mem.write(ka, &kb[..len]).unwrap();
        let sig = self.signal();
        q.signals.push(sig);
        if let Some(c) = check {
            q.checks.push(c);
        }
        q.wgs += groups as u64;
        let d = KernelDispatch::one_d(kd, ka, wg_items, groups, sig);
        self.push(q, &Packet::dispatch(d, barrier))
    }
    /// Verify all checks and signals of `q`; returns a description of the first mismatch.
    pub fn verify(&self, q: &GuestQueue) -> Result<(), String> {
        for c in &q.checks {
            match c {
                Check::U32s { addr, expect } => {
                    let mut b = vec![0u8; expect.len() * 4];
                    self.mem.read(*addr, &mut b).unwrap();
                    for (i, e) in expect.iter().enumerate() {
                        let v = u32::from_le_bytes([
                            b[4 * i],
                            b[4 * i + 1],
                            b[4 * i + 2],
                            b[4 * i + 3],
                        ]);
                        if v != *e {
                            return Err(format!("u32 at {:#x}[{i}] = {v}, want {e}", addr));
                        }
                    }
                }
                Check::U64 { addr, expect } => {
                    let v = self.mem.read_u64(*addr).unwrap();
                    if v != *expect {
                        return Err(format!("u64 at {addr:#x} = {v}, want {expect}"));
                    }
                }
            }
        }
        for s in &q.signals {
            let v = self.mem.read_u64(s + 8).unwrap() as i64;
            if v != 0 {
                return Err(format!("signal {s:#x} = {v}, want 0"));
            }
        }
        Ok(())
    }
    /// `amd_queue_t.read_dispatch_id` as reported by the CP.
    pub fn read_index(&self, q: &GuestQueue) -> u64 {
        self.mem
            .read_u64(q.amd_queue + queue::AMD_QUEUE_READ_DISPATCH_ID as u64)
            .unwrap()
    }
}

/// 2 XCCs x 8 CUs, 2 shader engines per XCC, one partition: the small
/// GPU of the occupancy, packing and CU-mask tests.
pub fn two_xcc_topo() -> GpuTopology {
    GpuTopology {
        xccs: 2,
        cus_per_xcc: 8,
        ses_per_xcc: 2,
        ..Default::default()
    }
}

/// A simulated GPU on `t` with no workgroup floor
/// (`SimParams::wg_floor_ns` 0), arrival seed `seed`.
pub fn sim_no_floor(t: GpuTopology, seed: u64) -> super::SimGpu {
    let p = super::SimParams {
        wg_floor_ns: 0,
        ..Default::default()
    };
    super::SimGpu::with_params(t, p, seed).unwrap()
}

/// Completion time of each packet of queue `tag` in `ev`, in order.
pub fn completions(ev: &[GpuEvent], tag: u64) -> Vec<u64> {
    ev.iter()
        .filter_map(|e| match e {
            GpuEvent::PacketCompleted { tag: t, at, .. } if *t == tag => Some(*at),
            _ => None,
        })
        .collect()
}

/// Map request for a guest queue.
pub fn map_req(vm: &TestVm, q: &GuestQueue, slot: u32, tag: u64) -> MapRequest {
    MapRequest {
        slot: SlotId(slot),
        tag,
        mqd: q.mqd.clone(),
        mem: vm.dyn_mem(),
    }
}

/// Virtual time: advance to each deadline until none is left or `limit` is reached.
/// Returns the final time.
pub fn run_virtual(
    gpu: &mut dyn PhysGpu,
    mut now: u64,
    limit: u64,
    out: &mut Vec<GpuEvent>,
) -> u64 {
    while let Some(t) = gpu.next_deadline() {
        if t > limit {
            break;
        }
        now = now.max(t);
        gpu.advance(now, out);
    }
    now
}
