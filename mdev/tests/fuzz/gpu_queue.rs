//! Fuzz harnesses `aql_packet` and `kernel_descriptor`: hostile AQL packets,
//! kernel descriptors and kernargs decoded by `abi`, then run by a `SimGpu` on
//! a mapped queue of a small VM (virtual time, a bounded number of steps).
//! Shared by `fuzz/fuzz_targets/{aql_packet,kernel_descriptor}.rs` and
//! `mdev/tests/fuzz_corpus.rs`.
#![allow(dead_code)]

use abi::aql::{KernelDispatch, Packet, PACKET_SIZE};
use abi::kernel::{element_range, Kernarg, KernelDescriptor, KernelKind, KD_SIZE, KERNARG_MAX};
use abi::queue::AMD_QUEUE_WRITE_DISPATCH_ID;
use gpu::backend::{DequeueMode, GpuEvent, PhysGpu, SlotId};
use gpu::topology::GpuTopology;
use gpusim::sim::testkit::{map_req, GuestQueue, TestVm};
use gpusim::sim::SimGpu;

/// Ring size of the fuzzed queue, in packets.
pub const RING_PACKETS: u32 = 16;
/// Most model steps per input (bounds a hostile dispatch of 2^32 workgroups).
pub const MAX_STEPS: usize = 256;
/// VM memory size.
pub const MEM_BYTES: usize = 8 << 20;

/// A small VM with one queue and one valid `Mark` kernel (descriptor,
/// kernarg, completion signal) at fixed addresses the seeds refer to.
pub struct World {
    /// Simulated GPU (tiny topology).
    pub gpu: SimGpu,
    /// Guest memory and allocator.
    pub vm: TestVm,
    /// The queue.
    pub q: GuestQueue,
    /// Valid kernel descriptor address.
    pub kd: u64,
    /// Valid kernarg address.
    pub kernarg: u64,
    /// Completion signal address (value 1).
    pub signal: u64,
    /// Events seen.
    pub out: Vec<GpuEvent>,
}

impl World {
    /// Builds the world (deterministic addresses).
    pub fn new() -> World {
        let topo = GpuTopology::tiny();
        let gpu = SimGpu::new(topo.clone(), 0).expect("tiny topology is valid");
        let mut vm = TestVm::new(MEM_BYTES);
        let q = vm.queue(&topo, RING_PACKETS, 5);
        let kd = vm.alloc(KD_SIZE as u64, 64);
        vm.mem
            .write(kd, &KernelDescriptor::new(KernelKind::Mark, 1000).encode())
            .unwrap();
        let counters = vm.alloc(4 * 64, 64);
        let kernarg = vm.alloc(KERNARG_MAX as u64, 16);
        let (b, len) = Kernarg::Mark { counters, n: 64 }.encode();
        vm.mem.write(kernarg, &b[..len]).unwrap();
        let signal = vm.signal();
        World {
            gpu,
            vm,
            q,
            kd,
            kernarg,
            signal,
            out: Vec::new(),
        }
    }

    /// Writes `packets` into the ring from slot 0, publishes write index
    /// `wptr`, maps the queue on slot 0, rings its doorbell and runs the model
    /// a bounded number of steps, then dequeues it.
    pub fn run(&mut self, packets: &[[u8; PACKET_SIZE]], wptr: u64) {
        for (i, p) in packets.iter().take(RING_PACKETS as usize).enumerate() {
            let slot = self.q.ring + i as u64 * PACKET_SIZE as u64;
            self.vm.mem.write(slot, p).unwrap();
        }
        self.vm
            .mem
            .write_u64(self.q.amd_queue + AMD_QUEUE_WRITE_DISPATCH_ID as u64, wptr)
            .unwrap();
        if self.gpu.map(0, map_req(&self.vm, &self.q, 0, 1)).is_err() {
            return;
        }
        self.gpu.doorbell(0, SlotId(0), wptr);
        self.step(MAX_STEPS);
        let now = self.gpu.now();
        let _ = self.gpu.unmap(now, SlotId(0), DequeueMode::SaveWaves);
        self.step(MAX_STEPS);
    }

    fn step(&mut self, n: usize) {
        for _ in 0..n {
            let Some(t) = self.gpu.next_deadline() else {
                return;
            };
            let t = t.max(self.gpu.now());
            self.gpu.advance(t, &mut self.out);
        }
    }
}

impl Default for World {
    fn default() -> Self {
        World::new()
    }
}

/// Decodes one packet and checks what `abi` promises about it.
fn check_packet(b: &[u8; PACKET_SIZE]) {
    let p = Packet::decode(b);
    // A decoded packet re-encodes to bytes that decode to the same packet.
    assert_eq!(Packet::decode(&p.encode()), p);
    if let abi::aql::Body::KernelDispatch(d) = p.body {
        if let Ok(wgs) = d.validate() {
            assert!((1..=abi::aql::MAX_WORKGROUPS).contains(&wgs));
            assert!(d.workgroup_items() <= abi::aql::MAX_WORKGROUP_ITEMS);
        }
        let _ = d.workgroup_count();
    }
}

/// `aql_packet` input: byte 0 = write index (packets, 0..=255 so also past
/// the ring), then 64-byte packets for ring slots 0.. (at most the ring).
pub fn run_aql_packet(data: &[u8]) {
    let Some((&w, rest)) = data.split_first() else {
        return;
    };
    let packets: Vec<[u8; PACKET_SIZE]> = rest
        .chunks_exact(PACKET_SIZE)
        .map(|c| c.try_into().unwrap())
        .collect();
    for p in &packets {
        check_packet(p);
    }
    World::new().run(&packets, u64::from(w));
}

/// `kernel_descriptor` input: a 64-byte descriptor, a 32-byte kernarg, then
/// workgroup size (u16) and workgroup count (u16), all little endian. The
/// descriptor and kernarg replace the world's valid ones, and one 1-D
/// dispatch of them runs.
pub fn run_kernel_descriptor(data: &[u8]) {
    if data.len() < KD_SIZE + KERNARG_MAX + 4 {
        return;
    }
    let kd: &[u8; KD_SIZE] = data[..KD_SIZE].try_into().unwrap();
    let ka = &data[KD_SIZE..KD_SIZE + KERNARG_MAX];
    let g = &data[KD_SIZE + KERNARG_MAX..];
    let wg_items = u16::from_le_bytes([g[0], g[1]]);
    let groups = u32::from(u16::from_le_bytes([g[2], g[3]]));
    if let Ok(d) = KernelDescriptor::decode(kd) {
        assert_eq!(KernelDescriptor::decode(&d.encode()), Ok(d));
    }
    for k in 1..=6 {
        let kind = KernelKind::from_u16(k).unwrap();
        let a = Kernarg::decode(kind, ka).expect("32 bytes hold every kernarg");
        assert_eq!(a.kind(), kind);
        let (b, len) = a.encode();
        assert_eq!(len, kind.kernarg_size());
        assert_eq!(Kernarg::decode(kind, &b[..len]), Some(a));
        assert!(Kernarg::decode(kind, &ka[..len - 1]).is_none());
    }
    let n = u32::from_le_bytes([ka[8], ka[9], ka[10], ka[11]]);
    for wg in [0, 1, u64::from(groups), u64::MAX] {
        let (s, e) = element_range(wg, u64::from(wg_items), n);
        assert!(s <= e && e <= u64::from(n));
    }
    let mut w = World::new();
    w.vm.mem.write(w.kd, kd).unwrap();
    w.vm.mem.write(w.kernarg, ka).unwrap();
    let d = KernelDispatch::one_d(w.kd, w.kernarg, wg_items, groups, w.signal);
    w.run(&[Packet::dispatch(d, false).encode()], 1);
}

/// Named seed inputs of one target.
pub type Seeds = Vec<(String, Vec<u8>)>;

/// Seeds of both targets (`aql_packet`, `kernel_descriptor`).
pub fn seeds() -> (Seeds, Seeds) {
    let w = World::new();
    let mark = KernelDispatch::one_d(w.kd, w.kernarg, 4, 8, w.signal);
    let mut aql = Vec::new();
    let one = |pkts: &[Packet], wptr: u8| {
        let mut d = vec![wptr];
        for p in pkts {
            d.extend_from_slice(&p.encode());
        }
        d
    };
    aql.push(("dispatch".into(), one(&[Packet::dispatch(mark, false)], 1)));
    let bar = abi::aql::Barrier {
        dep_signal: [w.signal, 0, 0, 0, 0],
        completion_signal: 0,
    };
    aql.push((
        "dispatch-barrier-and".into(),
        one(
            &[Packet::dispatch(mark, true), Packet::barrier_and(bar, true)],
            2,
        ),
    ));
    aql.push((
        "barrier-or".into(),
        one(&[Packet::barrier_or(bar, false)], 1),
    ));
    let mut big = mark;
    big.grid_size = [u32::MAX, 3, 1];
    big.setup = 3;
    aql.push(("huge-grid".into(), one(&[Packet::dispatch(big, false)], 1)));
    aql.push((
        "wptr-past-ring".into(),
        one(&[Packet::dispatch(mark, false)], 40),
    ));
    let mut kd = Vec::new();
    let cases: [(KernelKind, Kernarg); 6] = [
        (
            KernelKind::Fill,
            Kernarg::Fill {
                dst: 0x40_0000,
                n: 64,
                value: 7,
            },
        ),
        (
            KernelKind::VecAdd,
            Kernarg::VecAdd {
                a: 0x40_0000,
                b: 0x41_0000,
                c: 0x42_0000,
                n: 64,
            },
        ),
        (
            KernelKind::Saxpy,
            Kernarg::Saxpy {
                x: 0x40_0000,
                y: 0x41_0000,
                n: 64,
                a: 3,
            },
        ),
        (
            KernelKind::Checksum,
            Kernarg::Checksum {
                src: 0x40_0000,
                out: 0x41_0000,
                n: 64,
            },
        ),
        (
            KernelKind::Mark,
            Kernarg::Mark {
                counters: 0x40_0000,
                n: 8,
            },
        ),
        (KernelKind::Spin, Kernarg::Spin { ns: 5000 }),
    ];
    for (kind, arg) in cases {
        let mut d = KernelDescriptor::new(kind, 1000).encode().to_vec();
        d.extend_from_slice(&arg.encode().0);
        d.extend_from_slice(&8u16.to_le_bytes());
        d.extend_from_slice(&8u16.to_le_bytes());
        kd.push((format!("{kind:?}").to_lowercase(), d));
    }
    (aql, kd)
}
