//! Bounds-checked DMA access to one VM's memory.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileMemory};

/// A guest memory access failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// `[gpa, gpa + len)` is not inside the memory.
    #[error("access of {len} bytes at {gpa:#x} is outside guest memory")]
    OutOfRange {
        /// Start address.
        gpa: u64,
        /// Length.
        len: u64,
    },
}

/// Memory a device can DMA into: one VM's guest-physical address space.
/// Every access is bounds checked; out of range returns [`MemError`], never panics.
pub trait DmaMemory: Send + Sync {
    /// Read `buf.len()` bytes at `gpa`.
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError>;
    /// Write `buf` at `gpa`.
    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError>;
    /// Size of the address space (highest valid address + 1).
    fn size(&self) -> u64;

    /// Is `[gpa, gpa + len)` inside the memory?
    fn contains(&self, gpa: u64, len: u64) -> bool {
        gpa.checked_add(len).is_some_and(|end| end <= self.size())
    }
    /// Read a little-endian u32.
    fn read_u32(&self, gpa: u64) -> Result<u32, MemError> {
        let mut b = [0u8; 4];
        self.read(gpa, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    /// Read a little-endian u64.
    fn read_u64(&self, gpa: u64) -> Result<u64, MemError> {
        let mut b = [0u8; 8];
        self.read(gpa, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    /// Write a little-endian u32.
    fn write_u32(&self, gpa: u64, v: u32) -> Result<(), MemError> {
        self.write(gpa, &v.to_le_bytes())
    }
    /// Write a little-endian u64.
    fn write_u64(&self, gpa: u64, v: u64) -> Result<(), MemError> {
        self.write(gpa, &v.to_le_bytes())
    }
    /// Add `delta` (wrapping) to the little-endian u64 at `gpa`; returns the old
    /// value. Implementations make this atomic against other accesses where
    /// they can (see each `impl`); this default is a read followed by a write.
    fn fetch_add_u64(&self, gpa: u64, delta: u64) -> Result<u64, MemError> {
        let v = self.read_u64(gpa)?;
        self.write_u64(gpa, v.wrapping_add(delta))?;
        Ok(v)
    }
    /// Add `delta` (wrapping) to the little-endian u32 at `gpa`; returns the old
    /// value. Atomicity as for [`DmaMemory::fetch_add_u64`].
    fn fetch_add_u32(&self, gpa: u64, delta: u32) -> Result<u32, MemError> {
        let v = self.read_u32(gpa)?;
        self.write_u32(gpa, v.wrapping_add(delta))?;
        Ok(v)
    }
    /// Add `delta` (wrapping) to the little-endian u32 at each address of
    /// `gpas`, in order, each as [`DmaMemory::fetch_add_u32`]. On the first
    /// that fails, stops and returns its index (the ones before it are
    /// done). Implementations may take one lock for the lot (see each
    /// `impl`).
    fn add_u32_each(&self, gpas: &[u64], delta: u32) -> Result<(), (usize, MemError)> {
        for (i, &gpa) in gpas.iter().enumerate() {
            self.fetch_add_u32(gpa, delta).map_err(|e| (i, e))?;
        }
        Ok(())
    }
}

fn check(size: u64, gpa: u64, len: usize) -> Result<(), MemError> {
    let len = len as u64;
    match gpa.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(MemError::OutOfRange { gpa, len }),
    }
}

/// Runs `f` on the host atomic of type `A` at `gpa` of `m` when `gpa` is
/// aligned to its size and the bytes lie in one region (the guest's vCPUs
/// see it as one locked read-modify-write); `None` otherwise, for the
/// caller's read-then-write fallback.
#[cfg(target_endian = "little")]
fn with_aligned_atomic<A: vm_memory::AtomicInteger, R>(
    m: &GuestMemoryMmap<()>,
    gpa: u64,
    f: impl FnOnce(&A) -> R,
) -> Option<R> {
    let n = std::mem::size_of::<A>();
    if !gpa.is_multiple_of(n as u64) {
        return None;
    }
    let slice = m.get_slice(GuestAddress(gpa), n).ok()?;
    let a = slice.get_atomic_ref::<A>(0).ok()?;
    Some(f(a))
}

impl DmaMemory for GuestMemoryMmap<()> {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        check(DmaMemory::size(self), gpa, buf.len())?;
        self.read_slice(buf, GuestAddress(gpa))
            .map_err(|_| MemError::OutOfRange {
                gpa,
                len: buf.len() as u64,
            })
    }
    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        check(DmaMemory::size(self), gpa, buf.len())?;
        self.write_slice(buf, GuestAddress(gpa))
            .map_err(|_| MemError::OutOfRange {
                gpa,
                len: buf.len() as u64,
            })
    }
    fn size(&self) -> u64 {
        if self.num_regions() == 0 {
            0
        } else {
            self.last_addr().0 + 1
        }
    }
    /// Inside one region or several adjacent ones: a range that touches a
    /// hole between regions (the MMIO hole of a VM with RAM above 4 GiB)
    /// is not memory.
    fn contains(&self, gpa: u64, len: u64) -> bool {
        gpa.checked_add(len)
            .is_some_and(|end| end <= DmaMemory::size(self))
            && (len == 0
                || usize::try_from(len).is_ok_and(|n| self.check_range(GuestAddress(gpa), n)))
    }
    /// A host atomic `fetch_add` when `gpa` is 8-byte aligned (the guest's
    /// vCPUs see it as one locked RMW); otherwise a read then a write.
    fn fetch_add_u64(&self, gpa: u64, delta: u64) -> Result<u64, MemError> {
        check(DmaMemory::size(self), gpa, 8)?;
        #[cfg(target_endian = "little")]
        if let Some(old) = with_aligned_atomic(self, gpa, |a: &AtomicU64| {
            a.fetch_add(delta, Ordering::SeqCst)
        }) {
            return Ok(old);
        }
        let v = self.read_u64(gpa)?;
        self.write_u64(gpa, v.wrapping_add(delta))?;
        Ok(v)
    }
    /// As [`DmaMemory::fetch_add_u64`], atomic when 4-byte aligned.
    fn fetch_add_u32(&self, gpa: u64, delta: u32) -> Result<u32, MemError> {
        check(DmaMemory::size(self), gpa, 4)?;
        #[cfg(target_endian = "little")]
        if let Some(old) = with_aligned_atomic(self, gpa, |a: &AtomicU32| {
            a.fetch_add(delta, Ordering::SeqCst)
        }) {
            return Ok(old);
        }
        let v = self.read_u32(gpa)?;
        self.write_u32(gpa, v.wrapping_add(delta))?;
        Ok(v)
    }
}

/// A memory whose every access takes one lock, so that a read-modify-write
/// under it is atomic against every other access.
trait LockedRmw {
    /// Replaces the `N` bytes at `gpa` by `f(old)` under the lock; returns `old`.
    fn rmw<const N: usize>(
        &self,
        gpa: u64,
        f: impl FnOnce([u8; N]) -> [u8; N],
    ) -> Result<[u8; N], MemError>;
}

/// [`DmaMemory::fetch_add_u64`] as one read-modify-write under the lock.
fn locked_fetch_add_u64(m: &impl LockedRmw, gpa: u64, delta: u64) -> Result<u64, MemError> {
    m.rmw(gpa, |b| {
        u64::from_le_bytes(b).wrapping_add(delta).to_le_bytes()
    })
    .map(u64::from_le_bytes)
}

/// [`DmaMemory::fetch_add_u32`] as one read-modify-write under the lock.
fn locked_fetch_add_u32(m: &impl LockedRmw, gpa: u64, delta: u32) -> Result<u32, MemError> {
    m.rmw(gpa, |b| {
        u32::from_le_bytes(b).wrapping_add(delta).to_le_bytes()
    })
    .map(u32::from_le_bytes)
}

/// Host-vector memory for tests and the virtual-time harness.
///
/// The vector is allocated zeroed (`calloc`), so untouched pages cost no RAM:
/// a VM model may declare gigabytes for CWSR areas it never fills.
pub struct VecMemory {
    data: Mutex<Vec<u8>>,
    size: u64,
}

impl VecMemory {
    /// Zeroed memory of `size` bytes.
    pub fn new(size: usize) -> Self {
        VecMemory {
            data: Mutex::new(vec![0u8; size]),
            size: size as u64,
        }
    }
    /// Run `f` over the whole buffer (for test set-up and checks).
    pub fn with<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut g = self.data.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }
}

impl LockedRmw for VecMemory {
    fn rmw<const N: usize>(
        &self,
        gpa: u64,
        f: impl FnOnce([u8; N]) -> [u8; N],
    ) -> Result<[u8; N], MemError> {
        check(self.size, gpa, N)?;
        let mut g = self.data.lock().unwrap_or_else(|e| e.into_inner());
        let s = gpa as usize;
        let b: &mut [u8; N] = (&mut g[s..s + N]).try_into().expect("N bytes");
        let old = *b;
        *b = f(old);
        Ok(old)
    }
}

impl DmaMemory for VecMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        check(self.size, gpa, buf.len())?;
        let g = self.data.lock().unwrap_or_else(|e| e.into_inner());
        let s = gpa as usize;
        buf.copy_from_slice(&g[s..s + buf.len()]);
        Ok(())
    }
    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        check(self.size, gpa, buf.len())?;
        let mut g = self.data.lock().unwrap_or_else(|e| e.into_inner());
        let s = gpa as usize;
        g[s..s + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
    /// Atomic against every other access to this memory (one lock).
    fn fetch_add_u64(&self, gpa: u64, delta: u64) -> Result<u64, MemError> {
        locked_fetch_add_u64(self, gpa, delta)
    }
    /// Atomic against every other access to this memory (one lock).
    fn fetch_add_u32(&self, gpa: u64, delta: u32) -> Result<u32, MemError> {
        locked_fetch_add_u32(self, gpa, delta)
    }
}

/// Sparse memory for the virtual-time harness: a large declared size, 4 KiB
/// pages allocated on first write (reads of untouched pages return zeros).
/// Models VMs whose queues declare hundreds of MiB of CWSR area each without
/// reserving host address space for it.
pub struct SparseMemory {
    pages: Mutex<Pages>,
    size: u64,
}

const SPARSE_PAGE: usize = 4096;

impl SparseMemory {
    /// Zeroed memory of `size` bytes.
    pub fn new(size: u64) -> Self {
        SparseMemory {
            pages: Mutex::new(Pages::default()),
            size,
        }
    }
    /// Pages written so far.
    pub fn resident_pages(&self) -> usize {
        self.pages.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

type Pages = std::collections::HashMap<
    u64,
    Box<[u8; SPARSE_PAGE]>,
    std::hash::BuildHasherDefault<PageHasher>,
>;

/// Hashes a page number with one multiply (Fibonacci hashing: the high
/// bits, which the table's control bytes take, mix every bit of the key).
/// SipHash, the default, took a fifth of the promise fuzzer's host time on
/// the workgroup-completion counters (`Kernarg::Mark`) alone. The keys are
/// page numbers of the virtual-time harness's own memory, so a keyed hash
/// buys nothing here.
#[derive(Default, Clone, Copy)]
struct PageHasher(u64);

impl std::hash::Hasher for PageHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

fn sparse_read(g: &Pages, gpa: u64, buf: &mut [u8]) {
    let mut done = 0;
    while done < buf.len() {
        let a = gpa + done as u64;
        let off = (a % SPARSE_PAGE as u64) as usize;
        let n = (SPARSE_PAGE - off).min(buf.len() - done);
        match g.get(&(a / SPARSE_PAGE as u64)) {
            Some(p) => buf[done..done + n].copy_from_slice(&p[off..off + n]),
            None => buf[done..done + n].fill(0),
        }
        done += n;
    }
}

fn sparse_write(g: &mut Pages, gpa: u64, buf: &[u8]) {
    let mut done = 0;
    while done < buf.len() {
        let a = gpa + done as u64;
        let off = (a % SPARSE_PAGE as u64) as usize;
        let n = (SPARSE_PAGE - off).min(buf.len() - done);
        let p = g
            .entry(a / SPARSE_PAGE as u64)
            .or_insert_with(|| Box::new([0u8; SPARSE_PAGE]));
        p[off..off + n].copy_from_slice(&buf[done..done + n]);
        done += n;
    }
}

impl LockedRmw for SparseMemory {
    fn rmw<const N: usize>(
        &self,
        gpa: u64,
        f: impl FnOnce([u8; N]) -> [u8; N],
    ) -> Result<[u8; N], MemError> {
        check(self.size, gpa, N)?;
        let mut g = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        Ok(sparse_rmw(&mut g, gpa, f))
    }
}

/// Replaces the `N` bytes at `gpa` by `f(old)`; returns `old`. Within one
/// page (any aligned access): one lookup, in place.
fn sparse_rmw<const N: usize>(
    g: &mut Pages,
    gpa: u64,
    f: impl FnOnce([u8; N]) -> [u8; N],
) -> [u8; N] {
    let mut old = [0u8; N];
    let off = (gpa % SPARSE_PAGE as u64) as usize;
    if off + N <= SPARSE_PAGE {
        let p = g
            .entry(gpa / SPARSE_PAGE as u64)
            .or_insert_with(|| Box::new([0u8; SPARSE_PAGE]));
        old.copy_from_slice(&p[off..off + N]);
        p[off..off + N].copy_from_slice(&f(old));
        return old;
    }
    sparse_read(g, gpa, &mut old);
    sparse_write(g, gpa, &f(old));
    old
}

impl DmaMemory for SparseMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        check(self.size, gpa, buf.len())?;
        let g = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        sparse_read(&g, gpa, buf);
        Ok(())
    }
    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        check(self.size, gpa, buf.len())?;
        let mut g = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        sparse_write(&mut g, gpa, buf);
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
    /// Atomic against every other access to this memory (one lock).
    fn fetch_add_u64(&self, gpa: u64, delta: u64) -> Result<u64, MemError> {
        locked_fetch_add_u64(self, gpa, delta)
    }
    /// Atomic against every other access to this memory (one lock).
    fn fetch_add_u32(&self, gpa: u64, delta: u32) -> Result<u32, MemError> {
        locked_fetch_add_u32(self, gpa, delta)
    }
    /// Under one lock for the lot: the lock per counter was a fifth of
    /// the promise fuzzer's host time (a `Kernarg::Mark` counter per
    /// workgroup).
    fn add_u32_each(&self, gpas: &[u64], delta: u32) -> Result<(), (usize, MemError)> {
        let mut g = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        for (i, &gpa) in gpas.iter().enumerate() {
            check(self.size, gpa, 4).map_err(|e| (i, e))?;
            sparse_rmw(&mut g, gpa, |b: [u8; 4]| {
                u32::from_le_bytes(b).wrapping_add(delta).to_le_bytes()
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RAM split around a hole, as a VM with RAM above 4 GiB has it (scaled
    /// down: 64 KiB, a 64 KiB hole, 64 KiB).
    #[test]
    fn guest_memory_with_a_hole_refuses_the_hole() {
        let m = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), 0x1_0000),
            (GuestAddress(0x2_0000), 0x1_0000),
        ])
        .unwrap();
        assert_eq!(DmaMemory::size(&m), 0x3_0000, "highest address + 1");
        for (gpa, len, inside) in [
            (0, 0x1_0000, true),
            (0xfff8, 8, true),
            (0xfffc, 8, false), // runs into the hole
            (0x1_0000, 8, false),
            (0x1_fff8, 16, false), // from the hole into high RAM
            (0x2_0000, 0x1_0000, true),
            (0x2_fff8, 8, true),
            (0x2_fffc, 8, false), // past the end
            (0, 0x3_0000, false), // across the hole
        ] {
            assert_eq!(
                DmaMemory::contains(&m, gpa, len),
                inside,
                "{gpa:#x}+{len:#x}"
            );
            let mut buf = vec![0u8; len as usize];
            assert_eq!(
                DmaMemory::read(&m, gpa, &mut buf).is_ok(),
                inside,
                "{gpa:#x}"
            );
            assert_eq!(DmaMemory::write(&m, gpa, &buf).is_ok(), inside, "{gpa:#x}");
        }
        m.write_u64(0x2_0008, 41).unwrap();
        assert_eq!(m.fetch_add_u64(0x2_0008, 1).unwrap(), 41);
        assert_eq!(m.read_u64(0x2_0008).unwrap(), 42, "high RAM is memory");
        assert!(m.fetch_add_u64(0x1_0008, 1).is_err(), "the hole is not");
        assert!(m.fetch_add_u32(0x1_0000, 1).is_err());
    }

    fn exercise(m: &dyn DmaMemory) {
        let sz = m.size();
        m.write_u64(0, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(m.read_u64(0).unwrap(), 0x1122_3344_5566_7788);
        assert_eq!(m.read_u32(4).unwrap(), 0x1122_3344);
        m.write_u32(sz - 4, 7).unwrap();
        assert_eq!(m.read_u32(sz - 4).unwrap(), 7);
        assert!(m.read_u32(sz - 3).is_err());
        assert!(m.write_u64(sz, 1).is_err());
        assert!(m.read_u64(u64::MAX - 2).is_err());
        assert!(m.write(u64::MAX, &[1]).is_err());
        assert!(m.contains(0, sz));
        assert!(!m.contains(1, sz));
        assert!(!m.contains(u64::MAX, 2));
        // fetch_add: aligned, unaligned (the fallback), at the end, out of range.
        for a in [64u64, 4093, sz - 8] {
            m.write_u64(a, 5).unwrap();
            assert_eq!(m.fetch_add_u64(a, u64::MAX).unwrap(), 5);
            assert_eq!(m.read_u64(a).unwrap(), 4);
            assert_eq!(m.fetch_add_u32(a, 3).unwrap(), 4);
            assert_eq!(m.read_u64(a).unwrap(), 7);
        }
        m.write_u32(sz - 4, u32::MAX).unwrap();
        assert_eq!(m.fetch_add_u32(sz - 4, 2).unwrap(), u32::MAX);
        assert_eq!(m.read_u32(sz - 4).unwrap(), 1);
        assert!(m.fetch_add_u64(sz - 7, 1).is_err());
        assert!(m.fetch_add_u32(u64::MAX - 1, 1).is_err());
    }

    #[test]
    fn guest_memory_fetch_add_is_atomic() {
        let gm = std::sync::Arc::new(
            GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 16)]).unwrap(),
        );
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let gm = gm.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        gm.fetch_add_u64(0x100, 1).unwrap();
                        gm.fetch_add_u32(0x200, 1).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(gm.read_u64(0x100).unwrap(), 40_000);
        assert_eq!(gm.read_u32(0x200).unwrap(), 40_000);
    }

    #[test]
    fn vec_memory() {
        exercise(&VecMemory::new(1 << 16));
    }

    #[test]
    fn sparse_memory() {
        let m = SparseMemory::new(1 << 40);
        exercise(&m);
        // A write across a page boundary reads back; untouched pages are zero.
        m.write(4090, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).unwrap();
        let mut b = [0u8; 12];
        m.read(4089, &mut b).unwrap();
        assert_eq!(b, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0]);
        assert_eq!(m.read_u64(1 << 39).unwrap(), 0);
        assert_eq!(m.resident_pages(), 3, "pages 0, 1 and the last one");
        // Read-modify-writes inside a page (on an untouched page too) and
        // across a page boundary agree with reads and writes.
        for gpa in [12286u64, 8188, 3 << 20] {
            m.write_u32(gpa, 0xffff_fffe).unwrap();
            assert_eq!(m.fetch_add_u32(gpa, 3).unwrap(), 0xffff_fffe, "{gpa}");
            assert_eq!(m.read_u32(gpa).unwrap(), 1, "{gpa}: wraps");
            assert_eq!(m.fetch_add_u64(gpa + 4, 7).unwrap(), 0, "{gpa}");
            assert_eq!(m.read_u64(gpa + 4).unwrap(), 7, "{gpa}");
        }
        assert_eq!(m.fetch_add_u32(5 << 30, 1).unwrap(), 0, "untouched page");
        assert_eq!(m.read_u32(5 << 30).unwrap(), 1);
        // Counters added under one lock, as one by one (an address twice,
        // one across a page boundary); the first address outside the
        // memory stops them.
        let (lot, each) = (SparseMemory::new(1 << 20), SparseMemory::new(1 << 20));
        let gpas = [0u64, 4, 4094, 4, (1 << 20) - 4, 1 << 20, 8];
        assert_eq!(lot.add_u32_each(&gpas, 3).map_err(|e| e.0), Err(5));
        for &g in &gpas[..5] {
            each.fetch_add_u32(g, 3).unwrap();
        }
        for &g in &gpas[..5] {
            assert_eq!(lot.read_u32(g).unwrap(), each.read_u32(g).unwrap(), "{g}");
        }
        assert_eq!(lot.read_u32(4).unwrap(), 6, "added twice");
        assert_eq!(
            lot.read_u32(8).unwrap(),
            0,
            "after the failing one: not done"
        );
    }

    #[test]
    fn guest_memory_mmap() {
        let gm = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 16)]).unwrap();
        assert_eq!(DmaMemory::size(&gm), 1 << 16);
        exercise(&gm);
    }
}
