//! The boot-info block the VMM writes into guest memory before entry, shared
//! by the host (`vmm/src/boot.rs`, which writes it) and the guest runtime
//! (`guest-tools/src/boot.rs`, which reads it). Layout in docs/boot.md; the
//! byte offsets in [`offset`] are derived from the `#[repr(C)]` struct so the
//! two sides cannot disagree.

/// Guest physical address of the block.
pub const BOOT_INFO_ADDR: u64 = 0x8000;
/// `"HQDB"` little-endian.
pub const BOOT_MAGIC: u32 = 0x4244_5148;
/// Layout version (2: adds the memory map).
pub const BOOT_VERSION: u32 = 2;
/// Device entries in the block.
pub const MAX_DEVICES: usize = 16;
/// Memory-map entries in the block.
pub const MAX_MEM_REGIONS: usize = 8;
/// Bytes of the VM name field.
pub const NAME_BYTES: usize = 64;
/// Bytes of the argument string field.
pub const ARGS_BYTES: usize = 1024;

/// Kinds of entries in [`BootInfo::devices`].
pub mod device_kind {
    /// 16550 UART; `base` is the I/O port.
    pub const SERIAL: u32 = 1;
    /// Exit port; `base` is the I/O port (32-bit write = exit status).
    pub const EXIT: u32 = 2;
    /// Checkpoint port; `base` is the I/O port (32-bit write = host timestamp).
    pub const CHECKPOINT: u32 = 3;
    /// Reserved: the vGPU register window of ABI v1. No longer listed: the
    /// vGPU is a PCI function (docs/vgpu-abi.md, "Finding the device").
    pub const VGPU_REGS: u32 = 4;
    /// Reserved: the vGPU doorbell window of ABI v1 (now BAR2 of the PCI function).
    pub const VGPU_DOORBELLS: u32 = 5;
}

/// Kinds of entries in [`BootInfo::mem_map`].
pub mod region_kind {
    /// RAM free for the program.
    pub const RAM: u32 = 1;
    /// RAM holding the VMM's boot structures (GDT, page tables, this block).
    pub const BOOT: u32 = 2;
    /// RAM holding the loaded image (with its `.bss` and stack).
    pub const IMAGE: u32 = 3;
    /// Device MMIO hole: not RAM.
    pub const MMIO: u32 = 4;
}

/// One device entry (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceEntry {
    /// A [`device_kind`] value.
    pub kind: u32,
    /// Interrupt vector (0 = none).
    pub vector: u32,
    /// MMIO guest physical address or I/O port.
    pub base: u64,
    /// Size in bytes of the register window.
    pub size: u64,
    /// Reserved, zero.
    pub reserved: u64,
}

/// One memory-map entry (24 bytes): `[base, base + size)` of `kind`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemRegion {
    /// Guest physical start.
    pub base: u64,
    /// Length in bytes.
    pub size: u64,
    /// A [`region_kind`] value.
    pub kind: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// The boot-info block (at [`BOOT_INFO_ADDR`], also passed in `rsi`).
#[repr(C)]
pub struct BootInfo {
    /// [`BOOT_MAGIC`].
    pub magic: u32,
    /// [`BOOT_VERSION`].
    pub version: u32,
    /// Index of the VM in the fleet (0-based).
    pub vm_id: u32,
    /// Number of vCPUs.
    pub vcpus: u32,
    /// Guest RAM size in bytes (all of it, both sides of the MMIO hole). Up
    /// to 3 GiB it spans `[0, mem_bytes)`; a bigger RAM ends at 3 GiB and
    /// goes on from 4 GiB: the memory map says where it is.
    pub mem_bytes: u64,
    /// First free, page-aligned address after the loaded image.
    pub image_end: u64,
    /// Bytes used in `name`.
    pub name_len: u32,
    /// Bytes used in `args`.
    pub args_len: u32,
    /// Entries used in `devices`.
    pub dev_count: u32,
    /// Entries used in `mem_map`.
    pub mem_map_count: u32,
    /// VM name, UTF-8.
    pub name: [u8; NAME_BYTES],
    /// Argument string, UTF-8.
    pub args: [u8; ARGS_BYTES],
    /// Devices.
    pub devices: [DeviceEntry; MAX_DEVICES],
    /// Memory map, ascending and non-overlapping.
    pub mem_map: [MemRegion; MAX_MEM_REGIONS],
}

/// Byte offsets of the fields in the block (for a host writing raw bytes).
pub mod offset {
    use super::BootInfo;
    use core::mem::offset_of;
    /// u32 magic.
    pub const MAGIC: usize = offset_of!(BootInfo, magic);
    /// u32 version.
    pub const VERSION: usize = offset_of!(BootInfo, version);
    /// u32 VM index.
    pub const VM_ID: usize = offset_of!(BootInfo, vm_id);
    /// u32 vCPU count.
    pub const VCPUS: usize = offset_of!(BootInfo, vcpus);
    /// u64 RAM bytes.
    pub const MEM_BYTES: usize = offset_of!(BootInfo, mem_bytes);
    /// u64 first free page after the image.
    pub const IMAGE_END: usize = offset_of!(BootInfo, image_end);
    /// u32 name length.
    pub const NAME_LEN: usize = offset_of!(BootInfo, name_len);
    /// u32 args length.
    pub const ARGS_LEN: usize = offset_of!(BootInfo, args_len);
    /// u32 device count.
    pub const DEV_COUNT: usize = offset_of!(BootInfo, dev_count);
    /// u32 memory-map entry count.
    pub const MEM_MAP_COUNT: usize = offset_of!(BootInfo, mem_map_count);
    /// Name bytes.
    pub const NAME: usize = offset_of!(BootInfo, name);
    /// Argument bytes.
    pub const ARGS: usize = offset_of!(BootInfo, args);
    /// Device table (32-byte entries).
    pub const DEVICES: usize = offset_of!(BootInfo, devices);
    /// Memory map (24-byte entries).
    pub const MEM_MAP: usize = offset_of!(BootInfo, mem_map);
    /// Total size.
    pub const SIZE: usize = core::mem::size_of::<BootInfo>();
}

// The documented layout (docs/boot.md).
const _: () = {
    assert!(offset::NAME == 48);
    assert!(offset::ARGS == 112);
    assert!(offset::DEVICES == 1136);
    assert!(offset::MEM_MAP == 1648);
    assert!(offset::SIZE == 1840);
    assert!(core::mem::size_of::<DeviceEntry>() == 32);
    assert!(core::mem::size_of::<MemRegion>() == 24);
};

impl BootInfo {
    /// True when magic and version match and every count is in range.
    pub fn is_valid(&self) -> bool {
        self.magic == BOOT_MAGIC
            && self.version == BOOT_VERSION
            && self.name_len as usize <= NAME_BYTES
            && self.args_len as usize <= ARGS_BYTES
            && self.dev_count as usize <= MAX_DEVICES
            && self.mem_map_count as usize <= MAX_MEM_REGIONS
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        let n = (self.name_len as usize).min(NAME_BYTES);
        core::str::from_utf8(&self.name[..n]).unwrap_or("?")
    }

    /// The argument string.
    pub fn args(&self) -> &str {
        let n = (self.args_len as usize).min(ARGS_BYTES);
        core::str::from_utf8(&self.args[..n]).unwrap_or("")
    }

    /// Value of `key=value` among whitespace-separated args.
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.args().split_ascii_whitespace().find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == key).then_some(v)
        })
    }

    /// Integer value of `key=value` (decimal or 0x hex).
    pub fn arg_u64(&self, key: &str) -> Option<u64> {
        parse_u64(self.arg(key)?)
    }

    /// The used device entries.
    pub fn devices(&self) -> &[DeviceEntry] {
        &self.devices[..(self.dev_count as usize).min(MAX_DEVICES)]
    }

    /// The first device of `kind`.
    pub fn device(&self, kind: u32) -> Option<&DeviceEntry> {
        self.devices().iter().find(|d| d.kind == kind)
    }

    /// The used memory-map entries.
    pub fn regions(&self) -> &[MemRegion] {
        &self.mem_map[..(self.mem_map_count as usize).min(MAX_MEM_REGIONS)]
    }

    /// End of the highest RAM region of the map (free, boot or image; the
    /// MMIO hole is not RAM): `mem_bytes` when all RAM lies below the hole,
    /// `4 GiB + mem_bytes - 3 GiB` when part of it lies above (docs/boot.md).
    pub fn ram_end(&self) -> u64 {
        self.regions()
            .iter()
            .filter(|r| r.kind != region_kind::MMIO)
            .map(|r| r.base.saturating_add(r.size))
            .max()
            .unwrap_or(self.mem_bytes)
    }

    /// The largest free RAM region (`region_kind::RAM`), if any.
    pub fn largest_free_ram(&self) -> Option<MemRegion> {
        self.regions()
            .iter()
            .filter(|r| r.kind == region_kind::RAM)
            .max_by_key(|r| r.size)
            .copied()
    }
}

/// The memory map of a VM with `mem_bytes` of RAM and an image loaded at
/// `image_base..image_end`, RAM split around the MMIO hole `[mmio_base,
/// mmio_end)` as on a PC: the first `min(mem_bytes, mmio_base)` bytes at 0
/// (boot structures below `boot_end`, the image, free RAM after it), the
/// hole, and the rest of the RAM (if any) from `mmio_end` up. Returns the
/// entries (ascending, non-overlapping) and their count.
pub fn memory_map(
    mem_bytes: u64,
    boot_end: u64,
    image_base: u64,
    image_end: u64,
    mmio_base: u64,
    mmio_end: u64,
) -> ([MemRegion; MAX_MEM_REGIONS], usize) {
    let mut map = [MemRegion::default(); MAX_MEM_REGIONS];
    let mut n = 0;
    let mut push = |base: u64, end: u64, kind: u32| {
        if end > base && n < MAX_MEM_REGIONS {
            map[n] = MemRegion {
                base,
                size: end - base,
                kind,
                reserved: 0,
            };
            n += 1;
        }
    };
    let low = mem_bytes.min(mmio_base);
    push(0, boot_end.min(low), region_kind::BOOT);
    push(boot_end, image_base.min(low), region_kind::RAM);
    push(image_base, image_end.min(low), region_kind::IMAGE);
    push(image_end.max(image_base), low, region_kind::RAM);
    push(mmio_base, mmio_end, region_kind::MMIO);
    let high = mem_bytes - low;
    push(mmio_end, mmio_end.saturating_add(high), region_kind::RAM);
    (map, n)
}

/// Parses decimal or `0x` hexadecimal.
pub fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_map_covers_ram_in_order_without_overlap() {
        let mem = 16 << 20;
        let (map, n) = memory_map(mem, 0x9000, 0x10_0000, 0x14_0000, 3 << 30, 4 << 30);
        let kinds: [u32; 5] = core::array::from_fn(|i| map[i].kind);
        assert_eq!(
            kinds,
            [
                region_kind::BOOT,
                region_kind::RAM,
                region_kind::IMAGE,
                region_kind::RAM,
                region_kind::MMIO
            ]
        );
        assert_eq!(n, 5);
        let ram_total: u64 = map[..4].iter().map(|r| r.size).sum();
        assert_eq!(ram_total, mem, "the RAM regions tile [0, mem)");
        for w in map[..n].windows(2) {
            assert!(w[0].base + w[0].size <= w[1].base, "{w:?}");
        }
        assert_eq!((map[3].base, map[3].size), (0x14_0000, mem - 0x14_0000));
    }

    #[test]
    fn ram_is_split_around_the_mmio_hole() {
        extern crate std;
        use std::vec::Vec;
        const G: u64 = 1 << 30;
        const M: u64 = 1 << 20;
        let (hole, hole_end) = (3 * G, 4 * G);
        let image_end = 0x14_0000;
        for mem in [
            M,
            3 * G - M,
            3 * G,
            3 * G + M,
            3 * G + G / 2,
            4 * G,
            16 * G,
            64 * G,
        ] {
            let (map, n) = memory_map(mem, 0x9000, 0x10_0000, image_end, hole, hole_end);
            let map = &map[..n];
            let ram: Vec<_> = map.iter().filter(|r| r.kind != region_kind::MMIO).collect();
            let total: u64 = ram.iter().map(|r| r.size).sum();
            assert_eq!(total, mem, "{mem:#x}: the RAM regions hold all the RAM");
            for w in map.windows(2) {
                assert!(w[0].base + w[0].size <= w[1].base, "{mem:#x}: {w:?}");
            }
            for r in &ram {
                let end = r.base + r.size;
                assert!(
                    end <= hole || r.base >= hole_end,
                    "{mem:#x}: {r:?} in the hole"
                );
            }
            let low_end = ram
                .iter()
                .filter(|r| r.base < hole)
                .map(|r| r.base + r.size)
                .max();
            assert_eq!(low_end, Some(mem.min(hole)), "{mem:#x}");
            let high: Vec<_> = ram.iter().filter(|r| r.base >= hole_end).collect();
            if mem > hole {
                assert_eq!(high.len(), 1, "{mem:#x}");
                assert_eq!((high[0].base, high[0].size), (hole_end, mem - hole));
                assert_eq!(high[0].kind, region_kind::RAM);
            } else {
                assert!(high.is_empty(), "{mem:#x}: nothing above the hole");
            }
            let mmio: Vec<_> = map.iter().filter(|r| r.kind == region_kind::MMIO).collect();
            assert_eq!(mmio.len(), 1);
            assert_eq!((mmio[0].base, mmio[0].size), (hole, G));
            let mut b: BootInfo = unsafe { core::mem::zeroed() };
            b.mem_bytes = mem;
            b.mem_map[..n].copy_from_slice(map);
            b.mem_map_count = n as u32;
            let want_end = if mem > hole { mem + G } else { mem };
            assert_eq!(b.ram_end(), want_end, "{mem:#x}");
            let largest = b.largest_free_ram().unwrap();
            if mem > 4 * G {
                assert_eq!(
                    largest.base, hole_end,
                    "{mem:#x}: the big RAM is above the hole"
                );
            } else if mem > 2 * M {
                assert_eq!(largest.base, image_end, "{mem:#x}: the RAM after the image");
            }
        }
    }

    #[test]
    fn arguments_parse_and_counts_are_clamped() {
        let mut b: BootInfo = unsafe { core::mem::zeroed() };
        b.magic = BOOT_MAGIC;
        b.version = BOOT_VERSION;
        let a = b"x=5 y=0x10 z=no";
        b.args[..a.len()].copy_from_slice(a);
        b.args_len = a.len() as u32;
        assert!(b.is_valid());
        assert_eq!(b.arg_u64("x"), Some(5));
        assert_eq!(b.arg_u64("y"), Some(16));
        assert_eq!(b.arg("z"), Some("no"));
        assert_eq!(b.arg_u64("z"), None);
        b.dev_count = 99;
        assert!(!b.is_valid());
        assert_eq!(
            b.devices().len(),
            MAX_DEVICES,
            "never indexes past the table"
        );
        b.version = 1;
        b.dev_count = 0;
        assert!(!b.is_valid(), "version 1 blocks are refused");
    }
}
