//! Guest memory as the client shares it with DMA_MAP: a [`DmaMemory`] over
//! the mapped fds that follows every map and unmap.
//!
//! Each DMA_MAP is checked before anything is mapped: a fd of at least
//! `offset + size` bytes, a page-aligned offset and size, a guest range that
//! does not wrap and overlaps no other mapping, at most [`MAX_MAPPINGS`]
//! mappings. An access outside every mapping (or across a hole) fails with
//! [`MemError::OutOfRange`], which the front end turns into a queue error as
//! it does for an in-VMM guest. An unmapped region stays mapped in the
//! server until the last access that started before the unmap has ended
//! (each access holds a snapshot of the mapping set).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::{Arc, RwLock};

use gpu::mem::{DmaMemory, MemError};
use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap,
};

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
    /// Offset or size not a multiple of the page size.
    #[error("offset {offset:#x} or size {size:#x} is not page aligned")]
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
    /// No fd came with the map (DMA through messages is not supported).
    #[error("DMA_MAP without a file descriptor is not supported")]
    NoFd,
    /// An unmap that matches no mapping, or cuts one.
    #[error("no mapping of {size:#x} bytes at {address:#x} to unmap")]
    NotMapped {
        /// Guest address.
        address: u64,
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
            DmaError::TooMany => libc::ENOSPC as u32,
            DmaError::NoFd => libc::ENOTSUP as u32,
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

/// The mappings of one client; an empty set until the first DMA_MAP.
#[derive(Default)]
pub struct MappedMemory {
    set: RwLock<Set>,
}

/// The regions (sorted by address) and the memory made of them.
#[derive(Default)]
struct Set {
    regions: Vec<Arc<GuestRegionMmap<()>>>,
    mem: Arc<GuestMemoryMmap<()>>,
}

impl MappedMemory {
    /// No mappings.
    pub fn new() -> Self {
        Self::default()
    }

    fn snapshot(&self) -> Arc<GuestMemoryMmap<()>> {
        self.set
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .mem
            .clone()
    }

    /// Number of mappings.
    pub fn mappings(&self) -> usize {
        self.snapshot().num_regions()
    }

    /// DMA_MAP: guest `[address, address + size)` is `fd` from `offset`.
    pub fn map(
        &self,
        fd: Option<File>,
        offset: u64,
        address: u64,
        size: u64,
    ) -> Result<(), DmaError> {
        let fd = fd.ok_or(DmaError::NoFd)?;
        if size == 0 || address.checked_add(size - 1).is_none() || usize::try_from(size).is_err() {
            return Err(DmaError::BadRange { address, size });
        }
        let page = page_size();
        if !offset.is_multiple_of(page) || !size.is_multiple_of(page) {
            return Err(DmaError::Unaligned { offset, size });
        }
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
        if set.regions.len() >= MAX_MAPPINGS {
            return Err(DmaError::TooMany);
        }
        let last = address + (size - 1);
        if set
            .regions
            .iter()
            .any(|r| r.start_addr().0 <= last && address <= r.last_addr().0)
        {
            return Err(DmaError::Overlap { address, size });
        }
        let region = GuestRegionMmap::<()>::from_range(
            GuestAddress(address),
            size as usize,
            Some(FileOffset::new(fd, offset)),
        )
        .map_err(|e| DmaError::Mmap(e.to_string()))?;
        let mut regions = set.regions.clone();
        regions.push(Arc::new(region));
        regions.sort_by_key(|r| r.start_addr());
        let mem = GuestMemoryMmap::from_arc_regions(regions.clone())
            .map_err(|e| DmaError::Mmap(e.to_string()))?;
        *set = Set {
            regions,
            mem: Arc::new(mem),
        };
        Ok(())
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
        for r in &set.regions {
            let (s, e) = (r.start_addr().0, r.last_addr().0);
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
        let mem = Arc::new(rebuild(keep.clone()));
        *set = Set { regions: keep, mem };
        Ok(removed)
    }

    /// DMA_UNMAP with the "all" flag, and a client's end: no mappings left.
    pub fn unmap_all(&self) {
        *self.set.write().unwrap_or_else(|e| e.into_inner()) = Set::default();
    }
}

fn rebuild(regions: Vec<Arc<GuestRegionMmap<()>>>) -> GuestMemoryMmap<()> {
    if regions.is_empty() {
        return GuestMemoryMmap::default();
    }
    // The regions come from a valid, sorted set: they stay valid.
    GuestMemoryMmap::from_arc_regions(regions).unwrap_or_default()
}

impl DmaMemory for MappedMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.snapshot().read(gpa, buf)
    }
    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        self.snapshot().write(gpa, buf)
    }
    fn size(&self) -> u64 {
        DmaMemory::size(&*self.snapshot())
    }
    /// Inside one run of contiguous mappings (a hole is outside).
    fn contains(&self, gpa: u64, len: u64) -> bool {
        let Ok(n) = usize::try_from(len) else {
            return false;
        };
        let mem = self.snapshot();
        match gpa.checked_add(len) {
            None => false,
            Some(end) if n == 0 => end <= DmaMemory::size(&*mem),
            Some(_) => mem.check_range(GuestAddress(gpa), n),
        }
    }
    fn fetch_add_u64(&self, gpa: u64, delta: u64) -> Result<u64, MemError> {
        self.snapshot().fetch_add_u64(gpa, delta)
    }
    fn fetch_add_u32(&self, gpa: u64, delta: u32) -> Result<u32, MemError> {
        self.snapshot().fetch_add_u32(gpa, delta)
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
            m.map(g(), 0, 0x20_0000, 0),
            Err(DmaError::BadRange { .. })
        ));
        assert!(matches!(
            m.map(g(), 0, u64::MAX - 0xFFF, 0x2000),
            Err(DmaError::BadRange { .. })
        ));
        assert_eq!(m.map(None, 0, 0x20_0000, 0x1000), Err(DmaError::NoFd));
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
        let path = std::env::temp_dir().join(format!("vfio-ro-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let ro = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            m.map(Some(ro), 0, 0, 0x1000),
            Err(DmaError::Mmap(_))
        ));
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
}
