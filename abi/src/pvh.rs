//! PVH boot (docs/boot.md, "PVH boot"): the pieces of the guest runtime's
//! PVH entry that are plain data transformations, kept here so the host can
//! test them: the `hvm_start_info` constants, the translation of its memory
//! map into the boot-info memory map, and the `_S5_` sleep type of an ACPI
//! DSDT.

use crate::boot::{region_kind, MemRegion, MAX_MEM_REGIONS};

/// `hvm_start_info.magic` (`XEN_HVM_START_MAGIC_VALUE`).
pub const START_MAGIC: u32 = 0x336e_c578;
/// ELF note type of the 32-bit PVH entry point (`XEN_ELFNOTE_PHYS32_ENTRY`).
pub const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
/// E820 type of usable RAM.
pub const E820_RAM: u32 = 1;
/// Where the images are loaded (docs/boot.md).
pub const IMAGE_BASE: u64 = 0x10_0000;
/// RAM is mapped (and reported) up to here, as in hqdmux's own VMM.
pub const MAX_RAM_END: u64 = 64 << 30;

const GIB: u64 = 1 << 30;
const FOUR_GIB: u64 = 4 << 30;

/// One entry of the start info's memory map (`hvm_memmap_table_entry`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct E820Entry {
    /// Guest physical start.
    pub base: u64,
    /// Length in bytes.
    pub size: u64,
    /// E820 type (1 = RAM).
    pub kind: u32,
}

impl E820Entry {
    fn end(&self) -> u64 {
        self.base.saturating_add(self.size)
    }
}

/// GiBs above 4 GiB that hold RAM of `e820` (below [`MAX_RAM_END`]): one
/// page directory each.
pub fn high_gibs(e820: &[E820Entry]) -> u64 {
    let end = e820
        .iter()
        .filter(|e| e.kind == E820_RAM)
        .map(|e| e.end().min(MAX_RAM_END))
        .max()
        .unwrap_or(0);
    end.saturating_sub(FOUR_GIB).div_ceil(GIB)
}

/// What [`pvh_memory_map`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PvhMapInfo {
    /// Entries used.
    pub count: usize,
    /// Bytes of RAM in the map (boot, image and free).
    pub ram_bytes: u64,
    /// True when entries did not fit and were left out.
    pub truncated: bool,
}

/// Writes the boot-info memory map of a PVH boot into `out`: the RAM of
/// `e820` (up to [`MAX_RAM_END`]) split into boot structures below
/// [`IMAGE_BASE`], the image `[IMAGE_BASE, image_end)`, boot structures
/// `[image_end, tables_end)` (the page directories of the RAM above
/// 4 GiB), and free RAM; plus the MMIO hole from the end of the RAM below
/// 4 GiB (rounded up to 256 MiB, at least 2 GiB) to the next entry of
/// `e820` or 4 GiB. Ascending. `out` is written in place (a map built on
/// the guest's stack would be zeroed with SSE stores the emulator lacks).
pub fn pvh_memory_map(
    e820: &[E820Entry],
    image_end: u64,
    tables_end: u64,
    out: &mut [MemRegion; MAX_MEM_REGIONS],
) -> PvhMapInfo {
    let mut m = Out {
        out,
        count: 0,
        ram_bytes: 0,
        truncated: false,
    };
    let mut low_ram_end = 0;
    for e in e820.iter().filter(|e| e.kind == E820_RAM) {
        let (b, end) = (e.base, e.end().min(MAX_RAM_END));
        if b < FOUR_GIB {
            low_ram_end = low_ram_end.max(end.min(FOUR_GIB));
        }
        m.add(b, end.min(IMAGE_BASE), region_kind::BOOT);
        m.add(b.max(IMAGE_BASE), end.min(image_end), region_kind::IMAGE);
        m.add(b.max(image_end), end.min(tables_end), region_kind::BOOT);
        m.add(b.max(tables_end), end, region_kind::RAM);
    }
    let hole = (low_ram_end.saturating_add(0xFFF_FFFF) & !0xFFF_FFFF).max(2 * GIB);
    let hole_end = e820
        .iter()
        .map(|e| e.base)
        .filter(|&b| b >= hole && b < FOUR_GIB)
        .min()
        .unwrap_or(FOUR_GIB);
    m.add(hole, hole_end, region_kind::MMIO);
    // Insertion sort (no allocation; at most MAX_MEM_REGIONS entries).
    let n = m.count;
    for i in 1..n {
        let mut j = i;
        while j > 0 && m.out[j - 1].base > m.out[j].base {
            m.out.swap(j - 1, j);
            j -= 1;
        }
    }
    PvhMapInfo {
        count: m.count,
        ram_bytes: m.ram_bytes,
        truncated: m.truncated,
    }
}

/// The map being written; plain fields rather than a zeroed [`PvhMapInfo`]
/// (rustc zeroes such a struct with `xorps`, which the guest's instruction
/// emulator lacks: docs/boot.md).
struct Out<'a> {
    out: &'a mut [MemRegion; MAX_MEM_REGIONS],
    count: usize,
    ram_bytes: u64,
    truncated: bool,
}

impl Out<'_> {
    fn add(&mut self, base: u64, end: u64, kind: u32) {
        if end <= base {
            return;
        }
        let n = self.count;
        if n >= MAX_MEM_REGIONS {
            self.truncated = true;
            return;
        }
        if kind != region_kind::MMIO {
            self.ram_bytes += end - base;
        }
        let r = &mut self.out[n];
        r.base = base;
        r.size = end - base;
        r.kind = kind;
        r.reserved = 0;
        self.count = n + 1;
    }
}

/// `SLP_TYPa` of the `_S5_` package of an ACPI DSDT (`dsdt` = the whole
/// table): `Name(_S5_, Package() { N, ... })` with N a `ZeroOp`, `OneOp` or
/// `BytePrefix` constant. `None` if there is none in that form.
pub fn s5_sleep_type(dsdt: &[u8]) -> Option<u8> {
    let body = dsdt.get(36..)?;
    let at = body.windows(5).position(|w| w == b"_S5_\x12")?;
    // PackageOp, PkgLength (bits 7:6 of its lead byte = bytes that follow
    // it), NumElements, then the first element.
    let lead = *body.get(at + 5)?;
    let first = at + 6 + usize::from(lead >> 6) + 1;
    match *body.get(first)? {
        0x00 => Some(0),
        0x01 => Some(1),
        0x0A => body.get(first + 1).copied(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ram(base: u64, size: u64) -> E820Entry {
        E820Entry {
            base,
            size,
            kind: E820_RAM,
        }
    }

    fn map(
        e820: &[E820Entry],
        image_end: u64,
        tables_end: u64,
    ) -> ([MemRegion; MAX_MEM_REGIONS], PvhMapInfo) {
        let mut out = [MemRegion::default(); MAX_MEM_REGIONS];
        let info = pvh_memory_map(e820, image_end, tables_end, &mut out);
        (out, info)
    }

    fn region(base: u64, end: u64, kind: u32) -> MemRegion {
        MemRegion {
            base,
            size: end - base,
            kind,
            reserved: 0,
        }
    }

    #[test]
    fn cloud_hypervisor_512_mib() {
        // Cloud Hypervisor's PVH map: RAM below the EBDA, RAM from 1 MiB,
        // the PCI MMCONFIG window reserved.
        let e820 = [
            ram(0, 0xA0000),
            ram(0x10_0000, 0x1FF0_0000),
            E820Entry {
                base: 0xE800_0000,
                size: 0x1000_0000,
                kind: 2,
            },
        ];
        assert_eq!(high_gibs(&e820), 0);
        let (r, m) = map(&e820, 0x12_0000, 0x12_0000);
        assert_eq!(
            &r[..m.count],
            &[
                region(0, 0xA0000, region_kind::BOOT),
                region(0x10_0000, 0x12_0000, region_kind::IMAGE),
                region(0x12_0000, 0x2000_0000, region_kind::RAM),
                region(0x8000_0000, 0xE800_0000, region_kind::MMIO),
            ]
        );
        assert_eq!(m.ram_bytes, 0xA0000 + 0x1FF0_0000);
        assert!(!m.truncated);
    }

    #[test]
    fn ram_above_4_gib_gets_page_directories_reported_as_boot_structures() {
        // QEMU with 6 GiB: 3 GiB below the hole, 3 GiB from 4 GiB.
        let e820 = [
            ram(0, 0x9FC00),
            E820Entry {
                base: 0x9FC00,
                size: 0x400,
                kind: 2,
            },
            ram(0x10_0000, 0xBFF0_0000),
            ram(FOUR_GIB, 3 * GIB),
        ];
        assert_eq!(high_gibs(&e820), 3);
        let (r, m) = map(&e820, 0x12_0000, 0x12_3000);
        assert_eq!(
            &r[..m.count],
            &[
                region(0, 0x9FC00, region_kind::BOOT),
                region(0x10_0000, 0x12_0000, region_kind::IMAGE),
                region(0x12_0000, 0x12_3000, region_kind::BOOT),
                region(0x12_3000, 0xC000_0000, region_kind::RAM),
                region(0xC000_0000, FOUR_GIB, region_kind::MMIO),
                region(FOUR_GIB, 7 * GIB, region_kind::RAM),
            ]
        );
        assert_eq!(m.ram_bytes, 0x9FC00 + 0xBFF0_0000 + 3 * GIB);
    }

    #[test]
    fn ram_past_64_gib_is_left_out_and_a_long_map_is_truncated() {
        let e820 = [ram(0x10_0000, 0x100_0000), ram(FOUR_GIB, 100 * GIB)];
        assert_eq!(high_gibs(&e820), 60);
        let (r, m) = map(&e820, 0x20_0000, 0x20_0000 + 60 * 4096);
        let top = r[..m.count].iter().map(|r| r.base + r.size).max();
        assert_eq!(top, Some(MAX_RAM_END));
        let many: [E820Entry; 12] =
            core::array::from_fn(|i| ram(0x100_0000 * (i as u64 + 1), 0x10_0000));
        let (r, m) = map(&many, 0x20_0000, 0x20_0000);
        assert_eq!(m.count, MAX_MEM_REGIONS);
        assert!(m.truncated);
        let bases: [u64; MAX_MEM_REGIONS] = core::array::from_fn(|i| r[i].base);
        assert!(bases.windows(2).all(|w| w[0] < w[1]), "{bases:x?}");
    }

    #[test]
    fn no_ram_gives_only_the_hole() {
        let (r, m) = map(&[], 0x20_0000, 0x20_0000);
        assert_eq!(
            &r[..m.count],
            &[region(2 * GIB, FOUR_GIB, region_kind::MMIO)]
        );
        assert_eq!(m.ram_bytes, 0);
    }

    fn dsdt(aml: &[u8]) -> [u8; 64] {
        let mut t = [0u8; 64];
        t[..4].copy_from_slice(b"DSDT");
        t[36..36 + aml.len()].copy_from_slice(aml);
        t
    }

    #[test]
    fn s5_sleep_type_of_byte_zero_one_and_long_package_lengths() {
        // Cloud Hypervisor: Name(_S5_, Package(1){ 5 }) = 08 _S5_ 12 04 01 0A 05.
        assert_eq!(
            s5_sleep_type(&dsdt(b"\x08_S5_\x12\x04\x01\x0A\x05")),
            Some(5)
        );
        // QEMU PIIX: Package(4){ 0, 0, 0, 0 } (ZeroOp).
        assert_eq!(
            s5_sleep_type(&dsdt(b"\x08_S5_\x12\x06\x04\x00\x00\x00\x00")),
            Some(0)
        );
        assert_eq!(
            s5_sleep_type(&dsdt(b"\x08_S5_\x12\x06\x04\x01\x00\x00\x00")),
            Some(1)
        );
        // A two-byte PkgLength (lead byte 0x40 | low nibble).
        assert_eq!(
            s5_sleep_type(&dsdt(b"\x08_S5_\x12\x41\x00\x01\x0A\x07")),
            Some(7)
        );
        // No package, an unknown element encoding, a package cut short, no table.
        assert_eq!(s5_sleep_type(&dsdt(b"\x08_S4_\x12\x04\x01\x0A\x05")), None);
        assert_eq!(s5_sleep_type(&dsdt(b"\x08_S5_\x12\x04\x01\x0B\x05")), None);
        let mut cut = [0u8; 43];
        cut[36..].copy_from_slice(b"_S5_\x12\x04\x01");
        assert_eq!(s5_sleep_type(&cut), None);
        assert_eq!(s5_sleep_type(&[0u8; 10]), None);
    }
}
