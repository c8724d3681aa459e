//! HSA AQL packets (HSA runtime `hsa.h`): 64 bytes each, little endian.
//!
//! Header (u16 at byte 0): bits 7:0 packet type, bit 8 barrier, bits 10:9 acquire
//! fence scope, bits 12:11 release fence scope.
//!
//! **Publication order.** A producer writes bytes 2..64 first and the u16 header
//! LAST (a single 16-bit store, after a release fence), then bumps the write index
//! and rings the doorbell. Until the header is valid the packet processor treats
//! the slot as INVALID. The consumer sets the header back to INVALID after the
//! packet completes. [`Packet::encode`] produces the full 64-byte image; producers
//! writing into shared memory should use [`Packet::encode_body`] + [`Packet::header`].

use crate::le::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};

/// Packet size in bytes.
pub const PACKET_SIZE: usize = 64;
/// `HSA_PACKET_TYPE_VENDOR_SPECIFIC`.
pub const TYPE_VENDOR_SPECIFIC: u8 = 0;
/// `HSA_PACKET_TYPE_INVALID`.
pub const TYPE_INVALID: u8 = 1;
/// `HSA_PACKET_TYPE_KERNEL_DISPATCH`.
pub const TYPE_KERNEL_DISPATCH: u8 = 2;
/// `HSA_PACKET_TYPE_BARRIER_AND`.
pub const TYPE_BARRIER_AND: u8 = 3;
/// `HSA_PACKET_TYPE_AGENT_DISPATCH`.
pub const TYPE_AGENT_DISPATCH: u8 = 4;
/// `HSA_PACKET_TYPE_BARRIER_OR`.
pub const TYPE_BARRIER_OR: u8 = 5;
/// Barrier bit (`HSA_PACKET_HEADER_BARRIER`).
pub const HEADER_BARRIER_BIT: u16 = 1 << 8;
/// Shift of the acquire fence scope.
pub const HEADER_ACQUIRE_SHIFT: u16 = 9;
/// Shift of the release fence scope.
pub const HEADER_RELEASE_SHIFT: u16 = 11;
/// `HSA_FENCE_SCOPE_SYSTEM`.
pub const FENCE_SCOPE_SYSTEM: u8 = 2;
/// The 16-bit header of an INVALID packet (what the consumer writes after use).
pub const INVALID_HEADER: u16 = TYPE_INVALID as u16;

/// Decoded packet header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Packet type (bits 7:0).
    pub typ: u8,
    /// Barrier bit: wait for all earlier packets to complete before launch.
    pub barrier: bool,
    /// Acquire fence scope (0..3).
    pub acquire: u8,
    /// Release fence scope (0..3).
    pub release: u8,
}

impl Header {
    /// Encode to the u16 header.
    pub const fn encode(&self) -> u16 {
        (self.typ as u16)
            | if self.barrier { HEADER_BARRIER_BIT } else { 0 }
            | (((self.acquire & 3) as u16) << HEADER_ACQUIRE_SHIFT)
            | (((self.release & 3) as u16) << HEADER_RELEASE_SHIFT)
    }
    /// Decode a u16 header.
    pub const fn decode(h: u16) -> Header {
        Header {
            typ: (h & 0xff) as u8,
            barrier: h & HEADER_BARRIER_BIT != 0,
            acquire: ((h >> HEADER_ACQUIRE_SHIFT) & 3) as u8,
            release: ((h >> HEADER_RELEASE_SHIFT) & 3) as u8,
        }
    }
    /// A header of type `typ` with system-scope fences.
    pub const fn system(typ: u8, barrier: bool) -> Header {
        Header {
            typ,
            barrier,
            acquire: FENCE_SCOPE_SYSTEM,
            release: FENCE_SCOPE_SYSTEM,
        }
    }
}

/// Most work-items in one workgroup on AMD GPUs (`hsa_agent_get_info`
/// `HSA_AGENT_INFO_WORKGROUP_MAX_SIZE` = 1024 on gfx9).
pub const MAX_WORKGROUP_ITEMS: u64 = 1024;
/// Most workgroups in one dispatch that hqdmux runs (2^32).
pub const MAX_WORKGROUPS: u64 = 1 << 32;

/// Why a kernel dispatch packet's geometry is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DispatchError {
    /// A workgroup dimension is 0 (`dim` 0 = x, 1 = y, 2 = z).
    ZeroWorkgroupSize {
        /// Dimension.
        dim: u8,
    },
    /// A grid dimension is 0 (HSA requires >= 1).
    ZeroGrid {
        /// Dimension.
        dim: u8,
    },
    /// More than [`MAX_WORKGROUP_ITEMS`] work-items per workgroup.
    WorkgroupTooLarge {
        /// `wg_x * wg_y * wg_z`.
        items: u64,
    },
    /// More than [`MAX_WORKGROUPS`] workgroups.
    TooManyWorkgroups {
        /// Grid size.
        grid: [u32; 3],
        /// Workgroup size.
        workgroup: [u16; 3],
    },
    /// The dispatch's modelled GPU time (workgroups x per-workgroup cost)
    /// overflows 64-bit nanoseconds, or one workgroup's cost exceeds the
    /// longest a workgroup may run (2^48 ns, about 3 days).
    CostOverflow {
        /// Workgroups of the dispatch.
        workgroups: u64,
        /// Per-workgroup cost from the kernel descriptor (ns).
        wg_cost_ns: u64,
    },
}

impl core::fmt::Display for DispatchError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DispatchError::ZeroWorkgroupSize { dim } => {
                write!(
                    f,
                    "workgroup size {} is 0",
                    ["x", "y", "z"][*dim as usize % 3]
                )
            }
            DispatchError::ZeroGrid { dim } => {
                write!(f, "grid size {} is 0", ["x", "y", "z"][*dim as usize % 3])
            }
            DispatchError::WorkgroupTooLarge { items } => write!(
                f,
                "{items} work-items per workgroup exceed {MAX_WORKGROUP_ITEMS}"
            ),
            DispatchError::TooManyWorkgroups { grid, workgroup } => write!(
                f,
                "grid {grid:?} / workgroup {workgroup:?} exceeds {MAX_WORKGROUPS} workgroups"
            ),
            DispatchError::CostOverflow {
                workgroups,
                wg_cost_ns,
            } => write!(
                f,
                "modelled cost of {workgroups} workgroups x {wg_cost_ns} ns overflows \
                 (at most 2^64 ns per dispatch, 2^48 ns per workgroup)"
            ),
        }
    }
}

/// `hsa_kernel_dispatch_packet_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KernelDispatch {
    /// Bits 1:0 dimensions (1..3).
    pub setup: u16,
    /// Workgroup size x/y/z (work-items), offsets 4/6/8.
    pub workgroup_size: [u16; 3],
    /// Grid size x/y/z (work-items), offsets 12/16/20.
    pub grid_size: [u32; 3],
    /// Private segment size, offset 24.
    pub private_segment_size: u32,
    /// Group segment size, offset 28.
    pub group_segment_size: u32,
    /// Kernel object (address of the kernel descriptor), offset 32.
    pub kernel_object: u64,
    /// Kernarg address, offset 40.
    pub kernarg_address: u64,
    /// Completion signal (address of an `amd_signal_t`, 0 = none), offset 56.
    pub completion_signal: u64,
}

impl KernelDispatch {
    /// Number of workgroups: product over dimensions of ceil(grid / wg size).
    /// Returns `None` if a workgroup size is zero or the count overflows u64.
    /// A zero grid dimension gives `Some(0)`; use [`KernelDispatch::validate`]
    /// to reject the dispatches a packet processor must not run.
    pub fn workgroup_count(&self) -> Option<u64> {
        let mut n: u64 = 1;
        for d in 0..3 {
            let wg = self.workgroup_size[d] as u64;
            if wg == 0 {
                return None;
            }
            let g = self.grid_size[d] as u64;
            n = n.checked_mul(g.div_ceil(wg))?;
        }
        Some(n)
    }
    /// Work-items per workgroup (`wg_x * wg_y * wg_z`, at most 65535^3).
    pub fn workgroup_items(&self) -> u64 {
        self.workgroup_size
            .iter()
            .fold(1u64, |n, &w| n.saturating_mul(w as u64))
    }
    /// Check the geometry as a packet processor must before running it and
    /// return the workgroup count. HSA requires every grid and workgroup
    /// dimension to be at least 1 (unused dimensions are 1); AMD GPUs allow at
    /// most [`MAX_WORKGROUP_ITEMS`] work-items per workgroup; hqdmux runs at
    /// most [`MAX_WORKGROUPS`] workgroups per dispatch.
    pub fn validate(&self) -> Result<u64, DispatchError> {
        for d in 0..3 {
            if self.workgroup_size[d] == 0 {
                return Err(DispatchError::ZeroWorkgroupSize { dim: d as u8 });
            }
            if self.grid_size[d] == 0 {
                return Err(DispatchError::ZeroGrid { dim: d as u8 });
            }
        }
        let items = self.workgroup_items();
        if items > MAX_WORKGROUP_ITEMS {
            return Err(DispatchError::WorkgroupTooLarge { items });
        }
        match self.workgroup_count() {
            Some(n) if n <= MAX_WORKGROUPS => Ok(n),
            _ => Err(DispatchError::TooManyWorkgroups {
                grid: self.grid_size,
                workgroup: self.workgroup_size,
            }),
        }
    }
    /// A 1-D dispatch of `groups` workgroups of `wg` work-items.
    pub fn one_d(
        kernel_object: u64,
        kernarg_address: u64,
        wg: u16,
        groups: u32,
        signal: u64,
    ) -> Self {
        KernelDispatch {
            setup: 1,
            workgroup_size: [wg, 1, 1],
            grid_size: [(wg as u32).saturating_mul(groups), 1, 1],
            kernel_object,
            kernarg_address,
            completion_signal: signal,
            ..Default::default()
        }
    }
}

/// `hsa_barrier_and_packet_t` / `hsa_barrier_or_packet_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Barrier {
    /// Dependency signals (0 = unused), offsets 8..48.
    pub dep_signal: [u64; 5],
    /// Completion signal, offset 56.
    pub completion_signal: u64,
}

/// Packet body by type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// Kernel dispatch.
    KernelDispatch(KernelDispatch),
    /// Barrier-AND: complete when all non-zero dep signals are 0.
    BarrierAnd(Barrier),
    /// Barrier-OR: complete when any non-zero dep signal is 0.
    BarrierOr(Barrier),
    /// INVALID (slot not yet published or already consumed).
    Invalid,
    /// Any other type (vendor specific, agent dispatch, reserved): not supported.
    Unsupported(u8),
}

/// A decoded AQL packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    /// Header (its type is consistent with `body` after `decode`).
    pub header: Header,
    /// Body.
    pub body: Body,
}

impl Packet {
    /// Kernel dispatch with system fences.
    pub fn dispatch(d: KernelDispatch, barrier: bool) -> Packet {
        Packet {
            header: Header::system(TYPE_KERNEL_DISPATCH, barrier),
            body: Body::KernelDispatch(d),
        }
    }
    /// Barrier-AND with system fences.
    pub fn barrier_and(b: Barrier, barrier: bool) -> Packet {
        Packet {
            header: Header::system(TYPE_BARRIER_AND, barrier),
            body: Body::BarrierAnd(b),
        }
    }
    /// Barrier-OR with system fences.
    pub fn barrier_or(b: Barrier, barrier: bool) -> Packet {
        Packet {
            header: Header::system(TYPE_BARRIER_OR, barrier),
            body: Body::BarrierOr(b),
        }
    }
    /// The u16 header to store last.
    pub fn header(&self) -> u16 {
        self.header.encode()
    }
    /// Bytes 2..64 of the packet (bytes 0..2 left zero): write these first.
    pub fn encode_body(&self) -> [u8; PACKET_SIZE] {
        let mut b = [0u8; PACKET_SIZE];
        match &self.body {
            Body::KernelDispatch(d) => {
                put_u16(&mut b, 2, d.setup);
                put_u16(&mut b, 4, d.workgroup_size[0]);
                put_u16(&mut b, 6, d.workgroup_size[1]);
                put_u16(&mut b, 8, d.workgroup_size[2]);
                put_u32(&mut b, 12, d.grid_size[0]);
                put_u32(&mut b, 16, d.grid_size[1]);
                put_u32(&mut b, 20, d.grid_size[2]);
                put_u32(&mut b, 24, d.private_segment_size);
                put_u32(&mut b, 28, d.group_segment_size);
                put_u64(&mut b, 32, d.kernel_object);
                put_u64(&mut b, 40, d.kernarg_address);
                put_u64(&mut b, 56, d.completion_signal);
            }
            Body::BarrierAnd(x) | Body::BarrierOr(x) => {
                for (i, s) in x.dep_signal.iter().enumerate() {
                    put_u64(&mut b, 8 + 8 * i, *s);
                }
                put_u64(&mut b, 56, x.completion_signal);
            }
            Body::Invalid | Body::Unsupported(_) => {}
        }
        b
    }
    /// Full 64-byte image including the header.
    pub fn encode(&self) -> [u8; PACKET_SIZE] {
        let mut b = self.encode_body();
        put_u16(&mut b, 0, self.header());
        b
    }
    /// Decode a 64-byte image. Never fails: unknown types become [`Body::Unsupported`].
    pub fn decode(b: &[u8; PACKET_SIZE]) -> Packet {
        let header = Header::decode(u16_at(b, 0));
        let barrier = || Barrier {
            dep_signal: [
                u64_at(b, 8),
                u64_at(b, 16),
                u64_at(b, 24),
                u64_at(b, 32),
                u64_at(b, 40),
            ],
            completion_signal: u64_at(b, 56),
        };
        let body = match header.typ {
            TYPE_KERNEL_DISPATCH => Body::KernelDispatch(KernelDispatch {
                setup: u16_at(b, 2),
                workgroup_size: [u16_at(b, 4), u16_at(b, 6), u16_at(b, 8)],
                grid_size: [u32_at(b, 12), u32_at(b, 16), u32_at(b, 20)],
                private_segment_size: u32_at(b, 24),
                group_segment_size: u32_at(b, 28),
                kernel_object: u64_at(b, 32),
                kernarg_address: u64_at(b, 40),
                completion_signal: u64_at(b, 56),
            }),
            TYPE_BARRIER_AND => Body::BarrierAnd(barrier()),
            TYPE_BARRIER_OR => Body::BarrierOr(barrier()),
            TYPE_INVALID => Body::Invalid,
            t => Body::Unsupported(t),
        };
        Packet { header, body }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_bits() {
        let h = Header {
            typ: TYPE_KERNEL_DISPATCH,
            barrier: true,
            acquire: 2,
            release: 1,
        };
        let e = h.encode();
        assert_eq!(e, 2 | 0x100 | (2 << 9) | (1 << 11));
        assert_eq!(Header::decode(e), h);
    }

    #[test]
    fn dispatch_round_trip() {
        let d = KernelDispatch {
            setup: 3,
            workgroup_size: [64, 2, 1],
            grid_size: [1024, 4, 3],
            private_segment_size: 7,
            group_segment_size: 9,
            kernel_object: 0x1122_3344_5566_7788,
            kernarg_address: 0xdead_beef,
            completion_signal: 0x4000,
        };
        let p = Packet::dispatch(d, false);
        let b = p.encode();
        assert_eq!(u16_at(&b, 4), 64);
        assert_eq!(u32_at(&b, 16), 4);
        assert_eq!(u64_at(&b, 32), 0x1122_3344_5566_7788);
        assert_eq!(u64_at(&b, 56), 0x4000);
        assert_eq!(Packet::decode(&b), p);
        assert_eq!(d.workgroup_count(), Some(16 * 2 * 3));
        let body = p.encode_body();
        assert_eq!(u16_at(&body, 0), 0);
        assert_eq!(&body[2..], &b[2..]);
    }

    #[test]
    fn barrier_round_trip() {
        let x = Barrier {
            dep_signal: [1, 2, 3, 4, 5],
            completion_signal: 6,
        };
        for p in [Packet::barrier_and(x, true), Packet::barrier_or(x, false)] {
            let b = p.encode();
            assert_eq!(u64_at(&b, 40), 5);
            assert_eq!(Packet::decode(&b), p);
        }
    }

    #[test]
    fn unknown_and_invalid() {
        let mut b = [0u8; 64];
        b[0] = 0x7f;
        assert_eq!(Packet::decode(&b).body, Body::Unsupported(0x7f));
        b[0] = 1;
        assert_eq!(Packet::decode(&b).body, Body::Invalid);
        let z = KernelDispatch::default();
        assert_eq!(z.workgroup_count(), None);
    }

    #[test]
    fn dispatch_validation() {
        let ok = KernelDispatch::one_d(0, 0, 64, 10, 0);
        assert_eq!(ok.validate(), Ok(10));
        let mut d = ok;
        d.grid_size[1] = 0;
        assert_eq!(d.workgroup_count(), Some(0));
        assert_eq!(d.validate(), Err(DispatchError::ZeroGrid { dim: 1 }));
        let mut d = ok;
        d.workgroup_size[2] = 0;
        assert_eq!(
            d.validate(),
            Err(DispatchError::ZeroWorkgroupSize { dim: 2 })
        );
        let mut d = ok;
        d.workgroup_size = [32, 33, 1];
        assert_eq!(
            d.validate(),
            Err(DispatchError::WorkgroupTooLarge { items: 1056 })
        );
        d.workgroup_size = [32, 32, 1];
        assert!(d.validate().is_ok());
        d.workgroup_size = [u16::MAX; 3];
        assert_eq!(
            d.validate(),
            Err(DispatchError::WorkgroupTooLarge {
                items: 65535u64 * 65535 * 65535
            })
        );
        let mut d = ok;
        d.workgroup_size = [1, 1, 1];
        d.grid_size = [65536, 65536, 1];
        assert_eq!(d.validate(), Ok(1 << 32));
        d.grid_size = [65536, 65537, 1];
        assert_eq!(
            d.validate(),
            Err(DispatchError::TooManyWorkgroups {
                grid: [65536, 65537, 1],
                workgroup: [1, 1, 1]
            })
        );
        d.grid_size = [u32::MAX; 3]; // overflows u64
        assert!(matches!(
            d.validate(),
            Err(DispatchError::TooManyWorkgroups { .. })
        ));
    }
}
