//! hqdmux kernel descriptor and built-in simulated kernels.
//!
//! The simulated GPU cannot run ISA, so `kernel_object` in a dispatch packet
//! points to a 64-byte **hqdmux kernel descriptor** (the same size as AMD's
//! `kernel_descriptor_t`, which it replaces):
//!
//! | offset | type | field |
//! |---|---|---|
//! | 0 | u32 | magic [`KD_MAGIC`] ("HQDK") |
//! | 4 | u16 | version ([`KD_VERSION`]) |
//! | 6 | u16 | kind ([`KernelKind`]) |
//! | 8 | u64 | cost of one workgroup on one CU, in ns |
//! | 16 | u32 | flags ([`flags`]; unknown bits are ignored) |
//! | 20 | u16 | VGPRs per work-item (0: not given, the workgroup occupies a whole CU; see [`KernelDescriptor::vgprs`]) |
//! | 22..64 | | reserved, zero |
//!
//! Work split: workgroup `i` (linear index over the grid, x fastest) covers
//! elements `[i*e, min((i+1)*e, n))` where `e` = work-items per workgroup
//! (`wg_x * wg_y * wg_z`) and `n` the element count in the kernarg. Elements are
//! u32, arithmetic wraps. A workgroup's effect is applied when it completes.
//!
//! Kernarg layouts (little endian):
//!
//! | kind | layout | effect of workgroup i |
//! |---|---|---|
//! | Fill | dst u64 @0, n u32 @8, value u32 @12 | `dst[k] = value` |
//! | VecAdd | a u64 @0, b u64 @8, c u64 @16, n u32 @24 | `c[k] = a[k] + b[k]` |
//! | Saxpy | x u64 @0, y u64 @8, n u32 @16, a u32 @20 | `y[k] = a*x[k] + y[k]` (in place: not idempotent) |
//! | Checksum | src u64 @0, out u64 @8, n u32 @16 | `*out += sum(src[k])`, u64 (atomic add: not idempotent) |
//! | Mark | counters u64 @0, n u32 @8 | `if i < n { counters[i] += 1 }`, u32 — the exactly-once probe |
//! | Spin | ns u64 @0 | none; the workgroup takes `ns` (0: the descriptor cost) |

use crate::le::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};

/// Descriptor size.
pub const KD_SIZE: usize = 64;
/// Descriptor magic, bytes "HQDK".
pub const KD_MAGIC: u32 = u32::from_le_bytes(*b"HQDK");
/// Descriptor version.
pub const KD_VERSION: u16 = 1;
/// Largest kernarg segment of a built-in kernel.
pub const KERNARG_MAX: usize = 32;

/// Kernel descriptor flag bits (offset 16).
pub mod flags {
    /// The kernel's waves never reach a CWSR save point (a kernel that
    /// masks the trap, or runs with it disabled): a SAVE dequeue cannot save
    /// its in-flight workgroups and waits until they finish, like a DRAIN.
    /// A long workgroup then holds the dequeue until the VM's preemption
    /// timeout resets the queue (`abi::vgpu::error::PREEMPTION_TIMEOUT`).
    pub const NO_SAVE_POINT: u32 = 1 << 0;
}

/// Built-in kernel kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum KernelKind {
    /// Fill a u32 array.
    Fill = 1,
    /// Integer vector add.
    VecAdd = 2,
    /// Integer a*x+y, in place.
    Saxpy = 3,
    /// Sum reduction into a u64.
    Checksum = 4,
    /// Increment `counter[workgroup]`.
    Mark = 5,
    /// Only take time.
    Spin = 6,
}

impl KernelKind {
    /// From the descriptor's u16.
    pub fn from_u16(v: u16) -> Option<KernelKind> {
        Some(match v {
            1 => KernelKind::Fill,
            2 => KernelKind::VecAdd,
            3 => KernelKind::Saxpy,
            4 => KernelKind::Checksum,
            5 => KernelKind::Mark,
            6 => KernelKind::Spin,
            _ => return None,
        })
    }
    /// Kernarg bytes this kind reads.
    pub fn kernarg_size(self) -> usize {
        match self {
            KernelKind::Fill => 16,
            KernelKind::VecAdd => 28,
            KernelKind::Saxpy => 24,
            KernelKind::Checksum => 20,
            KernelKind::Mark => 12,
            KernelKind::Spin => 8,
        }
    }
}

/// Decoded kernel descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelDescriptor {
    /// Kind.
    pub kind: KernelKind,
    /// Time one workgroup occupies one CU (ns).
    pub wg_cost_ns: u64,
    /// Flags ([`flags`]).
    pub flags: u32,
    /// VGPRs (arch + accumulation) one work-item uses, as a compiler reports
    /// them: with the workgroup size and the dispatch's group segment (LDS)
    /// they give the workgroup's share of a CU (occupancy, docs/gpu-model.md
    /// "Occupancy"). 0 = not given: the workgroup occupies a whole CU (the
    /// model before occupancy).
    pub vgprs: u16,
}

/// Why a descriptor did not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DescriptorError {
    /// Wrong magic.
    BadMagic(u32),
    /// Unsupported version.
    BadVersion(u16),
    /// Unknown kernel kind.
    UnknownKind(u16),
}

impl core::fmt::Display for DescriptorError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DescriptorError::BadMagic(m) => write!(f, "magic {m:#x} is not \"HQDK\""),
            DescriptorError::BadVersion(v) => write!(f, "version {v} is not {KD_VERSION}"),
            DescriptorError::UnknownKind(k) => write!(f, "unknown kernel kind {k}"),
        }
    }
}

impl KernelDescriptor {
    /// New descriptor.
    pub const fn new(kind: KernelKind, wg_cost_ns: u64) -> Self {
        KernelDescriptor {
            kind,
            wg_cost_ns,
            flags: 0,
            vgprs: 0,
        }
    }
    /// The same descriptor with `vgprs` VGPRs per work-item (0: whole CU).
    pub const fn with_vgprs(mut self, vgprs: u16) -> Self {
        self.vgprs = vgprs;
        self
    }
    /// The same descriptor with `flags` ([`flags`]) set.
    pub const fn with_flags(mut self, flags: u32) -> Self {
        self.flags = flags;
        self
    }
    /// Whether a SAVE dequeue can save this kernel's in-flight waves (no
    /// [`flags::NO_SAVE_POINT`]).
    pub const fn preemptible(&self) -> bool {
        self.flags & flags::NO_SAVE_POINT == 0
    }
    /// Encode to 64 bytes.
    pub fn encode(&self) -> [u8; KD_SIZE] {
        let mut b = [0u8; KD_SIZE];
        put_u32(&mut b, 0, KD_MAGIC);
        put_u16(&mut b, 4, KD_VERSION);
        put_u16(&mut b, 6, self.kind as u16);
        put_u64(&mut b, 8, self.wg_cost_ns);
        put_u32(&mut b, 16, self.flags);
        put_u16(&mut b, 20, self.vgprs);
        b
    }
    /// Decode 64 bytes.
    pub fn decode(b: &[u8; KD_SIZE]) -> Result<Self, DescriptorError> {
        let magic = u32_at(b, 0);
        if magic != KD_MAGIC {
            return Err(DescriptorError::BadMagic(magic));
        }
        let ver = u16_at(b, 4);
        if ver != KD_VERSION {
            return Err(DescriptorError::BadVersion(ver));
        }
        let k = u16_at(b, 6);
        let kind = KernelKind::from_u16(k).ok_or(DescriptorError::UnknownKind(k))?;
        Ok(KernelDescriptor {
            kind,
            wg_cost_ns: u64_at(b, 8),
            flags: u32_at(b, 16),
            vgprs: u16_at(b, 20),
        })
    }
}

/// Kernel arguments of the built-in kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernarg {
    /// `dst[k] = value`.
    Fill {
        /// u32 array.
        dst: u64,
        /// Elements.
        n: u32,
        /// Value.
        value: u32,
    },
    /// c = a + b.
    VecAdd {
        /// Input a.
        a: u64,
        /// Input b.
        b: u64,
        /// Output c.
        c: u64,
        /// Elements.
        n: u32,
    },
    /// y = a*x + y.
    Saxpy {
        /// Input x.
        x: u64,
        /// In/out y.
        y: u64,
        /// Elements.
        n: u32,
        /// Scalar a.
        a: u32,
    },
    /// *out += sum(src).
    Checksum {
        /// Input.
        src: u64,
        /// u64 accumulator.
        out: u64,
        /// Elements.
        n: u32,
    },
    /// `counters[i] += 1`.
    Mark {
        /// u32 counters, one per workgroup.
        counters: u64,
        /// Number of counters.
        n: u32,
    },
    /// Take `ns` per workgroup (0 = descriptor cost).
    Spin {
        /// Nanoseconds.
        ns: u64,
    },
}

impl Kernarg {
    /// The kernel kind these arguments belong to.
    pub fn kind(&self) -> KernelKind {
        match self {
            Kernarg::Fill { .. } => KernelKind::Fill,
            Kernarg::VecAdd { .. } => KernelKind::VecAdd,
            Kernarg::Saxpy { .. } => KernelKind::Saxpy,
            Kernarg::Checksum { .. } => KernelKind::Checksum,
            Kernarg::Mark { .. } => KernelKind::Mark,
            Kernarg::Spin { .. } => KernelKind::Spin,
        }
    }
    /// Encode; returns the buffer and the number of meaningful bytes.
    pub fn encode(&self) -> ([u8; KERNARG_MAX], usize) {
        let mut b = [0u8; KERNARG_MAX];
        match *self {
            Kernarg::Fill { dst, n, value } => {
                put_u64(&mut b, 0, dst);
                put_u32(&mut b, 8, n);
                put_u32(&mut b, 12, value);
            }
            Kernarg::VecAdd { a, b: bb, c, n } => {
                put_u64(&mut b, 0, a);
                put_u64(&mut b, 8, bb);
                put_u64(&mut b, 16, c);
                put_u32(&mut b, 24, n);
            }
            Kernarg::Saxpy { x, y, n, a } => {
                put_u64(&mut b, 0, x);
                put_u64(&mut b, 8, y);
                put_u32(&mut b, 16, n);
                put_u32(&mut b, 20, a);
            }
            Kernarg::Checksum { src, out, n } => {
                put_u64(&mut b, 0, src);
                put_u64(&mut b, 8, out);
                put_u32(&mut b, 16, n);
            }
            Kernarg::Mark { counters, n } => {
                put_u64(&mut b, 0, counters);
                put_u32(&mut b, 8, n);
            }
            Kernarg::Spin { ns } => put_u64(&mut b, 0, ns),
        }
        (b, self.kind().kernarg_size())
    }
    /// Decode for `kind`; `None` if `b` is shorter than the layout.
    pub fn decode(kind: KernelKind, b: &[u8]) -> Option<Kernarg> {
        if b.len() < kind.kernarg_size() {
            return None;
        }
        Some(match kind {
            KernelKind::Fill => Kernarg::Fill {
                dst: u64_at(b, 0),
                n: u32_at(b, 8),
                value: u32_at(b, 12),
            },
            KernelKind::VecAdd => Kernarg::VecAdd {
                a: u64_at(b, 0),
                b: u64_at(b, 8),
                c: u64_at(b, 16),
                n: u32_at(b, 24),
            },
            KernelKind::Saxpy => Kernarg::Saxpy {
                x: u64_at(b, 0),
                y: u64_at(b, 8),
                n: u32_at(b, 16),
                a: u32_at(b, 20),
            },
            KernelKind::Checksum => Kernarg::Checksum {
                src: u64_at(b, 0),
                out: u64_at(b, 8),
                n: u32_at(b, 16),
            },
            KernelKind::Mark => Kernarg::Mark {
                counters: u64_at(b, 0),
                n: u32_at(b, 8),
            },
            KernelKind::Spin => Kernarg::Spin { ns: u64_at(b, 0) },
        })
    }
}

/// Element range `[start, end)` of workgroup `wg` with `items_per_wg` work-items
/// over `n` elements (empty when past the end).
pub fn element_range(wg: u64, items_per_wg: u64, n: u32) -> (u64, u64) {
    let n = n as u64;
    let start = wg.saturating_mul(items_per_wg).min(n);
    let end = wg.saturating_add(1).saturating_mul(items_per_wg).min(n);
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_round_trip() {
        for k in 1..=6u16 {
            let d = KernelDescriptor::new(KernelKind::from_u16(k).unwrap(), 1234 * k as u64);
            let b = d.encode();
            assert_eq!(&b[0..4], b"HQDK");
            assert_eq!(KernelDescriptor::decode(&b), Ok(d));
        }
        let mut b = KernelDescriptor::new(KernelKind::Mark, 1).encode();
        b[6] = 99;
        assert_eq!(
            KernelDescriptor::decode(&b),
            Err(DescriptorError::UnknownKind(99))
        );
        b[0] = 0;
        assert!(matches!(
            KernelDescriptor::decode(&b),
            Err(DescriptorError::BadMagic(_))
        ));
    }

    #[test]
    fn vgprs_round_trip_at_offset_20() {
        let d = KernelDescriptor::new(KernelKind::Spin, 10);
        assert_eq!(d.vgprs, 0);
        let v = d.with_vgprs(96);
        let b = v.encode();
        assert_eq!(u16_at(&b, 20), 96);
        assert_eq!(KernelDescriptor::decode(&b), Ok(v));
        assert_eq!(u16_at(&d.encode(), 20), 0);
    }

    #[test]
    fn no_save_point_flag_round_trips_and_marks_the_kernel_non_preemptible() {
        let d = KernelDescriptor::new(KernelKind::Spin, 10);
        assert!(d.preemptible());
        let n = d.with_flags(flags::NO_SAVE_POINT);
        assert!(!n.preemptible());
        let b = n.encode();
        assert_eq!(u32_at(&b, 16), flags::NO_SAVE_POINT);
        assert_eq!(KernelDescriptor::decode(&b), Ok(n));
        // Unknown bits decode and leave the kernel preemptible.
        let other = d.with_flags(0x8000_0000);
        assert!(KernelDescriptor::decode(&other.encode())
            .unwrap()
            .preemptible());
    }

    #[test]
    fn kernarg_round_trip() {
        let all = [
            Kernarg::Fill {
                dst: 1,
                n: 2,
                value: 3,
            },
            Kernarg::VecAdd {
                a: 1,
                b: 2,
                c: 3,
                n: 4,
            },
            Kernarg::Saxpy {
                x: 1,
                y: 2,
                n: 3,
                a: 4,
            },
            Kernarg::Checksum {
                src: 1,
                out: 2,
                n: 3,
            },
            Kernarg::Mark {
                counters: 0x1000,
                n: 77,
            },
            Kernarg::Spin { ns: 5000 },
        ];
        for k in all {
            let (b, len) = k.encode();
            assert_eq!(Kernarg::decode(k.kind(), &b[..len]), Some(k));
            assert_eq!(Kernarg::decode(k.kind(), &b[..len - 1]), None);
        }
    }

    #[test]
    fn ranges() {
        assert_eq!(element_range(0, 64, 100), (0, 64));
        assert_eq!(element_range(1, 64, 100), (64, 100));
        assert_eq!(element_range(2, 64, 100), (100, 100));
        assert_eq!(element_range(u64::MAX, 64, 100), (100, 100));
    }
}
