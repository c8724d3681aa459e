//! Guest memory as the client shares it with DMA_MAP: a [`DmaMemory`] over
//! the mapped fds that follows every map and unmap.
//!
//! A DMA_MAP without a fd (QEMU maps its ROMs and other memory that is not
//! fd-backed this way, expecting DMA_READ/DMA_WRITE messages for it) is
//! accepted as a range the GPU cannot reach: it is tracked (it counts
//! against [`MAX_MAPPINGS`], overlaps are refused, its DMA_UNMAP succeeds),
//! but any access inside it fails with [`MemError::OutOfRange`] exactly as
//! an access outside every mapping does (a queue error for that vGPU).
//!
//! Each DMA_MAP is checked before anything is mapped: a shmem or
//! hugetlbfs fd (memfd, /dev/shm, hugetlbfs; anything else is refused) of
//! at least `offset + size` bytes, a page-aligned offset and size, a guest range that
//! does not wrap and overlaps no other mapping, at most [`MAX_MAPPINGS`]
//! mappings. An access outside every mapping (or across a hole) fails with
//! [`MemError::OutOfRange`], which the front end turns into a queue error as
//! it does for an in-VMM guest. An unmapped region stays mapped in the
//! server until the last access that started before the unmap has ended
//! (each access holds a snapshot of the mapping set).
//!
//! A fd sealed with `F_SEAL_SHRINK` (QEMU's memory-backend-memfd seals by
//! default) is mmapped into the server. An unsealed one (Cloud Hypervisor
//! creates its guest RAM memfd without `MFD_ALLOW_SEALING`) is read and
//! written with `pread`/`pwrite`: the client could shrink it at any time,
//! and a mapping of a shrunk fd kills the server with SIGBUS on the next
//! access; through the fd, an access past its end is a [`MemError`] (a
//! queue error for that vGPU). Atomics on such a mapping are atomic
//! against the GPU, not against the client's own CPU writes.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use gpu::mem::{DmaMemory, MemError};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// Most bytes of guest memory mapped into this process at once, all
/// clients together: a quarter of x86-64's 128 TiB user address space, so
/// that the daemon's own stacks, heap and other mappings always have room.
/// A sealed fd past it (or past its client's [`MappedMemory::budget`]) is
/// reached with `pread`/`pwrite` instead, as an unsealed one is.
pub const MAX_MAPPED_BYTES: u64 = 1 << 45;

/// Bytes of guest memory mapped into this process now (all clients).
static MAPPED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Takes `size` bytes of [`MAX_MAPPED_BYTES`]; false if they are not left.
fn reserve_mapped(size: u64) -> bool {
    MAPPED_BYTES
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(size).filter(|u| *u <= MAX_MAPPED_BYTES)
        })
        .is_ok()
}

/// Bytes of guest memory mapped into this process now, all clients
/// together (at most [`MAX_MAPPED_BYTES`]).
pub fn mapped_bytes() -> u64 {
    MAPPED_BYTES.load(Ordering::Acquire)
}

/// The host's RAM in bytes (the default [`MappedMemory::budget`]): a VMM's
/// guest RAM larger than that is reached through the fd.
fn host_ram() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    u64::try_from(pages)
        .unwrap_or(0)
        .saturating_mul(page_size())
        .max(1 << 30)
}

/// Most DMA mappings one client may hold.
pub const MAX_MAPPINGS: usize = 256;

/// A DMA_MAP or DMA_UNMAP the server refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DmaError {
    /// Zero size, or the guest range wraps.
    #[error("bad range: {size:#x} bytes at {address:#x}")]
    BadRange {
        /// Guest address.
        address: u64,
        /// Size.
        size: u64,
    },
    /// Offset, size or guest address not a multiple of the page size.
    #[error("offset {offset:#x}, size {size:#x} or the address is not page aligned")]
    Unaligned {
        /// File offset.
        offset: u64,
        /// Size.
        size: u64,
    },
    /// The fd is shorter than `offset + size` (or cannot be measured).
    #[error("fd of {len} bytes cannot back {size:#x} bytes at offset {offset:#x}")]
    PastEnd {
        /// File length.
        len: u64,
        /// File offset.
        offset: u64,
        /// Size.
        size: u64,
    },
    /// The range overlaps a mapping.
    #[error("{size:#x} bytes at {address:#x} overlap an existing mapping")]
    Overlap {
        /// Guest address.
        address: u64,
        /// Size.
        size: u64,
    },
    /// [`MAX_MAPPINGS`] reached.
    #[error("too many DMA mappings (at most {MAX_MAPPINGS})")]
    TooMany,
    /// An unmap that matches no mapping, or cuts one.
    #[error("no mapping of {size:#x} bytes at {address:#x} to unmap")]
    NotMapped {
        /// Guest address.
        address: u64,
        /// Size.
        size: u64,
    },
    /// The fd is not shmem or hugetlbfs (memfd, a file on /dev/shm or
    /// hugetlbfs): one whose pages could wait on I/O is refused.
    #[error("the fd is not a memfd, tmpfs or hugetlbfs file")]
    NotShmem,
    /// A hugetlbfs fd not sealed against shrinking: it could not be mapped
    /// safely, and hugetlbfs has no `pwrite`.
    #[error("a hugetlbfs fd must be sealed with F_SEAL_SHRINK")]
    UnsealedHugetlb,
    /// A sealed hugetlbfs fd past the client's or the daemon's budget of
    /// mapped bytes ([`MappedMemory::with_budget`]): it cannot be reached
    /// through the fd instead (hugetlbfs has no `pwrite`).
    #[error("{size:#x} bytes of hugetlbfs past the budget of memory mapped into the daemon")]
    AddressSpace {
        /// Size.
        size: u64,
    },
    /// mmap failed (e.g. a read-only fd).
    #[error("mmap: {0}")]
    Mmap(String),
}

impl DmaError {
    /// The errno a vfio-user error reply carries for this refusal.
    pub fn errno(&self) -> u32 {
        match self {
            DmaError::TooMany | DmaError::AddressSpace { .. } => libc::ENOSPC as u32,
            DmaError::Overlap { .. } => libc::EEXIST as u32,
            DmaError::NotMapped { .. } => libc::ENOENT as u32,
            _ => libc::EINVAL as u32,
        }
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// `F_SEAL_SHRINK` (the fd cannot get shorter).
const SEAL_SHRINK: i32 = 0x0002;

/// The seals of `f`; `None` if it cannot carry any (not shmem/hugetlbfs).
fn seals(f: &File) -> Option<i32> {
    // SAFETY: fcntl on an fd we own; no pointers.
    let s = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) };
    (s >= 0).then_some(s)
}

/// Is `f` on hugetlbfs?
fn is_hugetlbfs(f: &File) -> bool {
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    // SAFETY: fstatfs writes a statfs struct we own; the fd is open.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::fstatfs(f.as_raw_fd(), &mut st) == 0 && st.f_type as i64 == HUGETLBFS_MAGIC
    }
}

/// How one mapping is reached.
enum Backing {
    /// Mapped into the server (the fd is sealed against shrinking, so a
    /// page of the mapping can never vanish): a memory of this one region.
    Mapped(GuestMemoryMmap<()>),
    /// Read and written with `pread`/`pwrite` (the client may shrink the
    /// fd: a mapping of it would SIGBUS the server; a short read is a
    /// [`MemError`] instead). Atomics take `lock`.
    File {
        file: File,
        offset: u64,
        lock: std::sync::Mutex<()>,
    },
    /// Mapped without a fd: tracked, never reached (every access is
    /// [`MemError::OutOfRange`], as outside every mapping).
    Unreachable,
}

/// One DMA mapping: guest `[start, start + len)`.
struct Region {
    start: u64,
    len: u64,
    backing: Backing,
}

impl Drop for Region {
    fn drop(&mut self) {
        // The last snapshot holding it is gone: its mapping goes now.
        if matches!(self.backing, Backing::Mapped(_)) {
            MAPPED_BYTES.fetch_sub(self.len, Ordering::AcqRel);
        }
    }
}

impl Region {
    fn last(&self) -> u64 {
        self.start + (self.len - 1)
    }

    fn has(&self, gpa: u64) -> bool {
        self.start <= gpa && gpa <= self.last()
    }

    /// Can the GPU reach it (a fd backs it)?
    fn reachable(&self) -> bool {
        !matches!(self.backing, Backing::Unreachable)
    }

    /// Holds `gpa` and can be reached there (an unreachable mapping is a
    /// hole to every access).
    fn serves(&self, gpa: u64) -> bool {
        self.reachable() && self.has(gpa)
    }

    /// Bytes from `gpa` to the region's end (`gpa` inside).
    fn room(&self, gpa: u64) -> u64 {
        self.last() - gpa + 1
    }

    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        match &self.backing {
            Backing::Mapped(m) => m.read(gpa, buf),
            Backing::Unreachable => Err(MemError::OutOfRange {
                gpa,
                len: buf.len() as u64,
            }),
            Backing::File { file, offset, .. } => {
                use std::os::unix::fs::FileExt;
                file.read_exact_at(buf, offset + (gpa - self.start))
                    .map_err(|_| MemError::OutOfRange {
                        gpa,
                        len: buf.len() as u64,
                    })
            }
        }
    }

    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        match &self.backing {
            Backing::Mapped(m) => m.write(gpa, buf),
            Backing::Unreachable => Err(MemError::OutOfRange {
                gpa,
                len: buf.len() as u64,
            }),
            Backing::File { file, offset, .. } => {
                let at = offset + (gpa - self.start);
                // Never grow the fd: a write past its (shrunk) end fails.
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                let err = MemError::OutOfRange {
                    gpa,
                    len: buf.len() as u64,
                };
                if at.checked_add(buf.len() as u64).is_none_or(|e| e > len) {
                    return Err(err);
                }
                use std::os::unix::fs::FileExt;
                file.write_all_at(buf, at).map_err(|_| err)
            }
        }
    }
}

/// The mappings of one client; an empty set until the first DMA_MAP.
pub struct MappedMemory {
    set: RwLock<Arc<Vec<Arc<Region>>>>,
    /// Most bytes of this client's sealed fds mapped into the process.
    budget: u64,
}

type Snapshot = Arc<Vec<Arc<Region>>>;

impl Default for MappedMemory {
    fn default() -> Self {
        Self::with_budget(host_ram())
    }
}

impl MappedMemory {
    /// No mappings; at most the host's RAM of sealed fds mapped into the
    /// process (the rest through the fd).
    pub fn new() -> Self {
        Self::default()
    }

    /// No mappings; at most `budget` bytes of sealed fds mapped into the
    /// process, and only while all clients together stay under
    /// [`MAX_MAPPED_BYTES`]: a DMA_MAP past either is reached with
    /// `pread`/`pwrite` (a hugetlbfs one, which has no `pwrite`, is refused).
    /// A client cannot fill the daemon's address space with mappings of a
    /// huge sparse memfd.
    pub fn with_budget(budget: u64) -> Self {
        MappedMemory {
            set: RwLock::default(),
            budget,
        }
    }

    /// Bytes of this client's mappings mapped into the process.
    pub fn mapped_bytes(&self) -> u64 {
        Self::mapped_in(&self.snapshot())
    }

    fn mapped_in(set: &[Arc<Region>]) -> u64 {
        set.iter()
            .filter(|r| matches!(r.backing, Backing::Mapped(_)))
            .map(|r| r.len)
            .sum()
    }

    fn snapshot(&self) -> Snapshot {
        self.set.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Number of mappings.
    pub fn mappings(&self) -> usize {
        self.snapshot().len()
    }

    /// Number of mappings reached with `pread`/`pwrite` (their fd is not
    /// sealed against shrinking, or the address-space budget was spent).
    pub fn unsealed_mappings(&self) -> usize {
        self.snapshot()
            .iter()
            .filter(|r| matches!(r.backing, Backing::File { .. }))
            .count()
    }

    /// Number of mappings made without a fd (the GPU cannot reach them).
    pub fn unreachable_mappings(&self) -> usize {
        self.snapshot().iter().filter(|r| !r.reachable()).count()
    }

    /// DMA_MAP: guest `[address, address + size)` is `fd` from `offset`;
    /// without a fd, a tracked range the GPU cannot reach (`offset` refers
    /// to no file and is not checked).
    pub fn map(
        &self,
        fd: Option<File>,
        offset: u64,
        address: u64,
        size: u64,
    ) -> Result<(), DmaError> {
        let Some(fd) = fd else {
            return self.map_unreachable(address, size);
        };
        if size == 0 || address.checked_add(size - 1).is_none() || usize::try_from(size).is_err() {
            return Err(DmaError::BadRange { address, size });
        }
        let page = page_size();
        if !offset.is_multiple_of(page)
            || !size.is_multiple_of(page)
            || !address.is_multiple_of(page)
        {
            return Err(DmaError::Unaligned { offset, size });
        }
        // Only shmem/hugetlbfs (memfd, /dev/shm, hugetlbfs files): their
        // pages never wait on I/O another process controls (a FUSE file
        // would let the client stall the arbiter thread on a page fault).
        let Some(seals) = seals(&fd) else {
            return Err(DmaError::NotShmem);
        };
        // SAFETY: fstat writes a stat struct we own; the fd is open.
        let len = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
                0
            } else {
                u64::try_from(st.st_size).unwrap_or(0)
            }
        };
        if offset.checked_add(size).is_none_or(|end| end > len) {
            return Err(DmaError::PastEnd { len, offset, size });
        }
        let mut set = self.set.write().unwrap_or_else(|e| e.into_inner());
        Self::room_for(&set, address, size)?;
        let sealed = seals & SEAL_SHRINK != 0;
        let in_budget = sealed
            && Self::mapped_in(&set)
                .checked_add(size)
                .is_some_and(|b| b <= self.budget)
            && reserve_mapped(size);
        let backing = if in_budget {
            let mapped = GuestRegionMmap::<()>::from_range(
                GuestAddress(address),
                size as usize,
                Some(FileOffset::new(fd, offset)),
            )
            .map_err(|e| DmaError::Mmap(e.to_string()))
            .and_then(|region| {
                GuestMemoryMmap::from_regions(vec![region])
                    .map_err(|e| DmaError::Mmap(e.to_string()))
            });
            match mapped {
                Ok(mem) => Backing::Mapped(mem),
                Err(e) => {
                    MAPPED_BYTES.fetch_sub(size, Ordering::AcqRel);
                    return Err(e);
                }
            }
        } else {
            if is_hugetlbfs(&fd) {
                return Err(if sealed {
                    DmaError::AddressSpace { size }
                } else {
                    DmaError::UnsealedHugetlb
                });
            }
            // SAFETY: fcntl on an fd we own; no pointers.
            let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
            if fl < 0 || fl & libc::O_ACCMODE != libc::O_RDWR {
                return Err(DmaError::Mmap("the fd is not open read-write".into()));
            }
            Backing::File {
                file: fd,
                offset,
                lock: std::sync::Mutex::new(()),
            }
        };
        Self::insert(&mut set, address, size, backing);
        Ok(())
    }

    /// An fd-less DMA_MAP: the same range, alignment, count and overlap
    /// checks as a mapping with a fd; nothing is mapped.
    fn map_unreachable(&self, address: u64, size: u64) -> Result<(), DmaError> {
        if size == 0 || address.checked_add(size - 1).is_none() {
            return Err(DmaError::BadRange { address, size });
        }
        let page = page_size();
        if !size.is_multiple_of(page) || !address.is_multiple_of(page) {
            return Err(DmaError::Unaligned { offset: 0, size });
        }
        let mut set = self.set.write().unwrap_or_else(|e| e.into_inner());
        Self::room_for(&set, address, size)?;
        Self::insert(&mut set, address, size, Backing::Unreachable);
        Ok(())
    }

    /// Refuses a new mapping past [`MAX_MAPPINGS`] or over another one
    /// (`address + size - 1` was checked not to wrap).
    fn room_for(set: &[Arc<Region>], address: u64, size: u64) -> Result<(), DmaError> {
        if set.len() >= MAX_MAPPINGS {
            return Err(DmaError::TooMany);
        }
        let last = address + (size - 1);
        if set.iter().any(|r| r.start <= last && address <= r.last()) {
            return Err(DmaError::Overlap { address, size });
        }
        Ok(())
    }

    fn insert(set: &mut Snapshot, address: u64, size: u64, backing: Backing) {
        let mut regions: Vec<Arc<Region>> = set.iter().cloned().collect();
        regions.push(Arc::new(Region {
            start: address,
            len: size,
            backing,
        }));
        regions.sort_by_key(|r| r.start);
        *set = Arc::new(regions);
    }

    /// DMA_UNMAP: removes every mapping inside `[address, address + size)`;
    /// refused (nothing removed) if none is, or if the range cuts one.
    pub fn unmap(&self, address: u64, size: u64) -> Result<usize, DmaError> {
        let nm = DmaError::NotMapped { address, size };
        let last = size
            .checked_sub(1)
            .and_then(|s| address.checked_add(s))
            .ok_or(nm.clone())?;
        let mut set = self.set.write().unwrap_or_else(|e| e.into_inner());
        let mut keep = Vec::new();
        let mut removed = 0;
        for r in set.iter() {
            let (s, e) = (r.start, r.last());
            if s >= address && e <= last {
                removed += 1;
            } else if s <= last && address <= e {
                return Err(nm);
            } else {
                keep.push(r.clone());
            }
        }
        if removed == 0 {
            return Err(nm);
        }
        *set = Arc::new(keep);
        Ok(removed)
    }

    /// DMA_UNMAP with the "all" flag, and a client's end: no mappings left.
    pub fn unmap_all(&self) {
        *self.set.write().unwrap_or_else(|e| e.into_inner()) = Arc::default();
    }
}

/// Walks `[gpa, gpa + len)` over contiguous mappings of `set`: calls `f`
/// with each piece (region, address, offset in the access, length).
fn walk(
    set: &[Arc<Region>],
    gpa: u64,
    len: usize,
    mut f: impl FnMut(&Region, u64, usize, usize) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let oor = MemError::OutOfRange {
        gpa,
        len: len as u64,
    };
    if len == 0 {
        return if gpa <= size_of(set) {
            Ok(())
        } else {
            Err(oor)
        };
    }
    gpa.checked_add(len as u64 - 1).ok_or(oor)?;
    let mut done = 0usize;
    while done < len {
        let at = gpa + done as u64;
        let r = set.iter().find(|r| r.serves(at)).ok_or(oor)?;
        let n = usize::try_from(r.room(at))
            .unwrap_or(usize::MAX)
            .min(len - done);
        f(r, at, done, n).map_err(|_| oor)?;
        done += n;
    }
    Ok(())
}

/// End of the highest mapping the GPU can reach.
fn size_of(set: &[Arc<Region>]) -> u64 {
    set.iter()
        .rev()
        .find(|r| r.reachable())
        .map_or(0, |r| r.last() + 1)
}

impl MappedMemory {
    /// The region holding all of `[gpa, gpa + n)` (atomics cannot span two).
    fn one(set: &[Arc<Region>], gpa: u64, n: u64) -> Result<Arc<Region>, MemError> {
        set.iter()
            .find(|r| r.serves(gpa) && r.room(gpa) >= n)
            .cloned()
            .ok_or(MemError::OutOfRange { gpa, len: n })
    }
}

impl DmaMemory for MappedMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let set = self.snapshot();
        walk(&set, gpa, buf.len(), |r, at, off, n| {
            r.read(at, &mut buf[off..off + n])
        })
    }
    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        let set = self.snapshot();
        walk(&set, gpa, buf.len(), |r, at, off, n| {
            r.write(at, &buf[off..off + n])
        })
    }
    fn size(&self) -> u64 {
        size_of(&self.snapshot())
    }
    /// Inside one run of contiguous mappings (a hole is outside).
    fn contains(&self, gpa: u64, len: u64) -> bool {
        let Ok(n) = usize::try_from(len) else {
            return false;
        };
        walk(&self.snapshot(), gpa, n, |_, _, _, _| Ok(())).is_ok()
    }
    fn fetch_add_u64(&self, gpa: u64, delta: u64) -> Result<u64, MemError> {
        let r = Self::one(&self.snapshot(), gpa, 8)?;
        match &r.backing {
            Backing::Mapped(m) => m.fetch_add_u64(gpa, delta),
            Backing::Unreachable => Err(MemError::OutOfRange { gpa, len: 8 }),
            Backing::File { lock, .. } => {
                let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
                let mut b = [0u8; 8];
                r.read(gpa, &mut b)?;
                let v = u64::from_le_bytes(b);
                r.write(gpa, &v.wrapping_add(delta).to_le_bytes())?;
                Ok(v)
            }
        }
    }
    fn fetch_add_u32(&self, gpa: u64, delta: u32) -> Result<u32, MemError> {
        let r = Self::one(&self.snapshot(), gpa, 4)?;
        match &r.backing {
            Backing::Mapped(m) => m.fetch_add_u32(gpa, delta),
            Backing::Unreachable => Err(MemError::OutOfRange { gpa, len: 4 }),
            Backing::File { lock, .. } => {
                let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
                let mut b = [0u8; 4];
                r.read(gpa, &mut b)?;
                let v = u32::from_le_bytes(b);
                r.write(gpa, &v.wrapping_add(delta).to_le_bytes())?;
                Ok(v)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memfd of `len` bytes.
    pub(crate) fn memfd(len: u64) -> File {
        // SAFETY: the name is a valid C string; the fd returned is ours.
        let fd = unsafe { libc::memfd_create(c"t".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: fd is a fresh, owned descriptor.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    #[test]
    fn maps_follow_map_and_unmap_and_refuse_hostile_ranges() {
        let m = MappedMemory::new();
        assert!(m.read_u32(0).is_err(), "nothing mapped");
        assert!(!m.contains(0, 4));
        let f = memfd(0x4000);
        m.map(Some(f.try_clone().unwrap()), 0, 0x10_0000, 0x2000)
            .unwrap();
        m.map(Some(f.try_clone().unwrap()), 0x2000, 0x10_2000, 0x2000)
            .unwrap();
        // Contiguous mappings read across their seam.
        m.write_u64(0x10_1FFC, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(m.read_u64(0x10_1FFC).unwrap(), 0x1122_3344_5566_7788);
        assert!(m.contains(0x10_0000, 0x4000));
        assert!(!m.contains(0x10_0000, 0x4001));
        assert!(!m.contains(u64::MAX, 2));
        assert!(m.contains(0x10_4000, 0), "an empty range at the end");
        assert!(!m.contains(0x10_4001, 0), "an empty range past the end");
        // The fd sees the guest's bytes (offset 0x2000 backs 0x10_2000).
        m.write_u32(0x10_2000, 7).unwrap();
        let mut b = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, 0x2000).unwrap();
        assert_eq!(u32::from_le_bytes(b), 7);
        assert_eq!(m.fetch_add_u32(0x10_2000, 1).unwrap(), 7);
        // Hostile maps.
        let g = || Some(f.try_clone().unwrap());
        assert!(matches!(
            m.map(g(), 0, 0x10_1000, 0x1000),
            Err(DmaError::Overlap { .. })
        ));
        assert!(matches!(
            m.map(g(), 0x2000, 0x20_0000, 0x4000),
            Err(DmaError::PastEnd { .. })
        ));
        assert!(matches!(
            m.map(g(), u64::MAX - 0xFFF, 0x20_0000, 0x1000),
            Err(DmaError::PastEnd { .. })
        ));
        assert!(matches!(
            m.map(g(), 1, 0x20_0000, 0x1000),
            Err(DmaError::Unaligned { .. })
        ));
        assert!(matches!(
            m.map(g(), 0, 0x20_0800, 0x1000),
            Err(DmaError::Unaligned { .. })
        ));
        assert!(matches!(
            m.map(g(), 0, 0x20_0000, 0),
            Err(DmaError::BadRange { .. })
        ));
        assert!(matches!(
            m.map(g(), 0, u64::MAX - 0xFFF, 0x2000),
            Err(DmaError::BadRange { .. })
        ));
        assert_eq!(m.mappings(), 2, "refusals map nothing");
        // Unmap: a cut or a miss is refused; an exact one goes.
        assert!(matches!(
            m.unmap(0x10_0000, 0x1000),
            Err(DmaError::NotMapped { .. })
        ));
        assert!(matches!(
            m.unmap(0x30_0000, 0x1000),
            Err(DmaError::NotMapped { .. })
        ));
        assert!(matches!(
            m.unmap(u64::MAX, 2),
            Err(DmaError::NotMapped { .. })
        ));
        assert_eq!(m.unmap(0x10_0000, 0x2000), Ok(1));
        // An address outside every mapping (now a hole) fails, as in a VM.
        assert_eq!(
            m.read_u32(0x10_0000),
            Err(MemError::OutOfRange {
                gpa: 0x10_0000,
                len: 4
            })
        );
        assert!(!m.contains(0x10_1FFC, 8));
        assert_eq!(m.read_u32(0x10_2000).unwrap(), 8);
        m.unmap_all();
        assert!(m.read_u32(0x10_2000).is_err());
        // A read-only fd cannot back a writable mapping.
        let ro = File::open(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
        assert!(matches!(
            m.map(Some(ro), 0, 0, 0x1000),
            Err(DmaError::Mmap(_))
        ));
        // Neither can anything that is not shmem: a pipe, a directory.
        let mut p = [0i32; 2];
        // SAFETY: pipe writes two fds into `p`.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: both fds are fresh and owned here.
        let (r, w) = unsafe {
            (
                <File as std::os::fd::FromRawFd>::from_raw_fd(p[0]),
                <File as std::os::fd::FromRawFd>::from_raw_fd(p[1]),
            )
        };
        assert_eq!(m.map(Some(r), 0, 0, 0x1000), Err(DmaError::NotShmem));
        drop(w);
        let dir = File::open("/").unwrap();
        assert_eq!(m.map(Some(dir), 0, 0, 0x1000), Err(DmaError::NotShmem));
        assert_eq!(m.mappings(), 0);
    }

    /// A memfd of `len` bytes sealed against shrinking.
    fn sealed_memfd(len: u64) -> File {
        // SAFETY: the name is a valid C string; the fd returned is ours.
        let fd = unsafe { libc::memfd_create(c"s".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(fd >= 0);
        // SAFETY: fd is a fresh, owned descriptor.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        // SAFETY: fcntl on an fd we own.
        assert_eq!(
            unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) },
            0
        );
        f
    }

    #[test]
    fn a_shrunk_fd_is_a_mem_error_not_a_sigbus() {
        let m = MappedMemory::new();
        let f = memfd(0x4000);
        m.map(Some(f.try_clone().unwrap()), 0, 0x10_0000, 0x4000)
            .unwrap();
        assert_eq!(m.unsealed_mappings(), 1, "unsealed: pread/pwrite");
        m.write_u64(0x10_3000, 5).unwrap();
        assert_eq!(m.fetch_add_u64(0x10_3000, 2).unwrap(), 5);
        assert_eq!(m.read_u64(0x10_3000).unwrap(), 7);
        // The client shrinks its fd under the mapping.
        f.set_len(0x1000).unwrap();
        let oor = |gpa, len| MemError::OutOfRange { gpa, len };
        assert_eq!(m.read_u64(0x10_3000), Err(oor(0x10_3000, 8)));
        assert_eq!(m.write_u64(0x10_3000, 1), Err(oor(0x10_3000, 8)));
        assert_eq!(m.fetch_add_u32(0x10_3000, 1), Err(oor(0x10_3000, 4)));
        assert_eq!(
            f.metadata().unwrap().len(),
            0x1000,
            "a write never grows it"
        );
        m.write_u32(0x10_0000, 9).unwrap();
        assert_eq!(
            m.read_u32(0x10_0000).unwrap(),
            9,
            "what is left still works"
        );
        // A sealed fd is mapped, and cannot be shrunk at all.
        let s = sealed_memfd(0x2000);
        m.map(Some(s.try_clone().unwrap()), 0, 0x20_0000, 0x2000)
            .unwrap();
        assert_eq!((m.mappings(), m.unsealed_mappings()), (2, 1));
        assert!(s.set_len(0x1000).is_err());
        m.write_u64(0x20_1FF8, 3).unwrap();
        assert_eq!(m.fetch_add_u64(0x20_1FF8, 1).unwrap(), 3);
        // An atomic across two mappings is refused.
        assert!(m.fetch_add_u64(0x10_3FFC, 1).is_err());
    }

    #[test]
    fn sealed_fds_past_the_budget_are_reached_through_the_fd() {
        let m = MappedMemory::with_budget(0x2000);
        let s = sealed_memfd(0x1_0000);
        let g = || Some(s.try_clone().unwrap());
        m.map(g(), 0, 0x10_0000, 0x2000).unwrap();
        assert_eq!((m.mapped_bytes(), m.unsealed_mappings()), (0x2000, 0));
        // Past the budget: accepted, reached with pread/pwrite.
        m.map(g(), 0x2000, 0x10_2000, 0x4000).unwrap();
        m.map(g(), 0x8000, 1 << 46, 0x8000).unwrap();
        assert_eq!((m.mapped_bytes(), m.unsealed_mappings()), (0x2000, 2));
        m.write_u64(0x10_1FFC, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(m.read_u64(0x10_1FFC).unwrap(), 0x1122_3344_5566_7788);
        assert_eq!(m.fetch_add_u64((1 << 46) + 8, 3).unwrap(), 0);
        let mut b = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(&s, &mut b, 0x8008).unwrap();
        assert_eq!(u64::from_le_bytes(b), 3, "the fd sees the write");
        // Unmapping the mapped one frees its budget for the next map.
        assert_eq!(m.unmap(0x10_0000, 0x2000), Ok(1));
        assert_eq!(m.mapped_bytes(), 0);
        m.map(g(), 0xA000, 0x20_0000, 0x2000).unwrap();
        assert_eq!((m.mapped_bytes(), m.unsealed_mappings()), (0x2000, 2));
        assert!(mapped_bytes() <= MAX_MAPPED_BYTES);
        // A client cannot map more than the daemon-wide ceiling either.
        let huge = sealed_memfd(MAX_MAPPED_BYTES + 0x1000);
        let m = MappedMemory::with_budget(u64::MAX);
        m.map(Some(huge), 0, 0, MAX_MAPPED_BYTES + 0x1000).unwrap();
        assert_eq!((m.mapped_bytes(), m.unsealed_mappings()), (0, 1));
    }

    #[test]
    fn an_unsealed_hugetlbfs_fd_is_refused() {
        // SAFETY: the name is a valid C string; the fd returned is ours.
        let fd = unsafe { libc::memfd_create(c"h".as_ptr(), libc::MFD_HUGETLB) };
        if fd < 0 {
            eprintln!("no hugetlbfs memfd here: skipped");
            return;
        }
        // SAFETY: fd is a fresh, owned descriptor.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        if f.set_len(2 << 20).is_err() {
            eprintln!("hugetlbfs memfd cannot be sized here: skipped");
            return;
        }
        let m = MappedMemory::new();
        assert_eq!(
            m.map(Some(f), 0, 0, 2 << 20),
            Err(DmaError::UnsealedHugetlb)
        );
    }

    #[test]
    fn at_most_max_mappings() {
        let m = MappedMemory::new();
        let f = memfd(0x1000);
        for i in 0..MAX_MAPPINGS as u64 {
            m.map(Some(f.try_clone().unwrap()), 0, i * 0x2000, 0x1000)
                .unwrap();
        }
        assert_eq!(
            m.map(Some(f.try_clone().unwrap()), 0, 1 << 40, 0x1000),
            Err(DmaError::TooMany)
        );
    }

    #[test]
    fn an_fd_less_map_is_tracked_but_never_reached() {
        let m = MappedMemory::new();
        let f = memfd(0x2000);
        m.map(Some(f.try_clone().unwrap()), 0, 0x10_0000, 0x2000)
            .unwrap();
        // QEMU's ROMs: no fd, right after the RAM and far above it.
        m.map(None, 0, 0x10_2000, 0x1000).unwrap();
        m.map(None, 0x1234, 0xFFFC_0000, 0x4_0000).unwrap();
        assert_eq!((m.mappings(), m.unreachable_mappings()), (3, 2));
        let oor = |gpa, len| MemError::OutOfRange { gpa, len };
        // Inside it: the same error as outside every mapping.
        assert_eq!(m.read_u32(0x10_2000), Err(oor(0x10_2000, 4)));
        assert_eq!(m.read_u32(0x20_0000), Err(oor(0x20_0000, 4)));
        assert_eq!(m.write_u64(0xFFFC_0008, 1), Err(oor(0xFFFC_0008, 8)));
        assert_eq!(m.fetch_add_u32(0x10_2000, 1), Err(oor(0x10_2000, 4)));
        assert_eq!(m.fetch_add_u64(0xFFFC_0000, 1), Err(oor(0xFFFC_0000, 8)));
        assert_eq!(m.read_u64(0x10_1FFC), Err(oor(0x10_1FFC, 8)), "RAM into it");
        assert!(!m.contains(0x10_2000, 4));
        assert!(!m.contains(0x10_1000, 0x2000));
        assert!(m.contains(0x10_0000, 0x2000));
        assert_eq!(m.size(), 0x10_2000, "only reachable memory has a size");
        m.write_u32(0x10_1FFC, 5).unwrap();
        assert_eq!(m.read_u32(0x10_1FFC).unwrap(), 5);
        // Every check of a map with a fd still applies.
        assert!(matches!(
            m.map(None, 0, 0x10_1000, 0x2000),
            Err(DmaError::Overlap { .. })
        ));
        assert!(matches!(
            m.map(Some(f.try_clone().unwrap()), 0, 0x10_2000, 0x1000),
            Err(DmaError::Overlap { .. })
        ));
        assert!(matches!(
            m.map(None, 0, 0x30_0800, 0x1000),
            Err(DmaError::Unaligned { .. })
        ));
        assert!(matches!(
            m.map(None, 0, 0x30_0000, 0x800),
            Err(DmaError::Unaligned { .. })
        ));
        assert!(matches!(
            m.map(None, 0, 0x30_0000, 0),
            Err(DmaError::BadRange { .. })
        ));
        assert!(matches!(
            m.map(None, 0, u64::MAX - 0xFFF, 0x2000),
            Err(DmaError::BadRange { .. })
        ));
        assert_eq!(m.mappings(), 3, "refusals map nothing");
        // Its unmap succeeds (a cut is refused, as for any mapping).
        assert!(matches!(
            m.unmap(0xFFFC_0000, 0x1000),
            Err(DmaError::NotMapped { .. })
        ));
        assert_eq!(m.unmap(0xFFFC_0000, 0x4_0000), Ok(1));
        assert_eq!(m.unmap(0x10_2000, 0x1000), Ok(1));
        assert_eq!((m.mappings(), m.unreachable_mappings()), (1, 0));
        // Fd-less maps count against the limit.
        for i in 1..MAX_MAPPINGS as u64 {
            m.map(None, 0, i << 24, 0x1000).unwrap();
        }
        assert_eq!(m.map(None, 0, 1 << 40, 0x1000), Err(DmaError::TooMany));
        m.unmap_all();
        assert_eq!(m.mappings(), 0);
    }
}
