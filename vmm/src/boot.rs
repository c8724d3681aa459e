//! Guest boot: memory layout, page tables, GDT, boot-info block, ELF load and
//! the initial vCPU state (64-bit long mode). The protocol is in docs/boot.md.

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use linux_loader::loader::{elf::Elf, KernelLoader};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// GDT: null, 64-bit code (selector 0x08), data (selector 0x10).
pub const GDT_ADDR: u64 = 0x500;
/// PML4; PDPT at +0x1000; four page directories after it (identity map 0..4 GiB, 2 MiB pages).
pub const PML4_ADDR: u64 = 0x1000;
pub use abi::boot::{BOOT_INFO_ADDR, BOOT_MAGIC, BOOT_VERSION, MAX_DEVICES};
/// End of the boot structures (GDT, page tables, boot-info page) of a VM
/// whose RAM lies below the MMIO hole; with RAM above 4 GiB one page
/// directory per GiB follows ([`RamLayout::boot_end`]).
pub const BOOT_END: u64 = BOOT_INFO_ADDR + 0x1000;
/// The page directories of the identity map above 4 GiB, one 4 KiB page
/// per GiB, from here (right after the boot-info page).
pub const HIGH_PD_ADDR: u64 = BOOT_END;
/// Where images are loaded (their ELF physical addresses must be at or above).
pub const IMAGE_BASE: u64 = 0x10_0000;
/// Device MMIO hole `[3 GiB, 4 GiB)`: RAM below it ends here, the rest of
/// the RAM starts at [`MMIO_END`] (as on a PC).
pub const MMIO_BASE: u64 = 3 << 30;
/// End of the MMIO hole, where RAM beyond the first 3 GiB starts.
pub const MMIO_END: u64 = 4 << 30;
/// Most guest RAM: 64 GiB. A design limit, from two facts: the boot
/// identity map uses 2 MiB pages, so each GiB of address space above 4 GiB
/// takes one 4 KiB page directory in low memory after the boot-info block
/// (61 of them for 64 GiB of RAM, whose top is 65 GiB: `[0x9000, 0x46000)`,
/// well below the image at 1 MiB); and the top, 65 GiB, is below 2^39, the
/// narrowest guest physical-address width KVM offers on current x86-64
/// hosts (the guest CPUID's width is also checked when a VM is built).
pub const MAX_RAM_BYTES: u64 = 64 << 30;

/// Guest RAM split around the MMIO hole: `low` bytes at 0 (at most
/// [`MMIO_BASE`]) and `high` bytes from [`MMIO_END`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamLayout {
    /// RAM below the hole, `[0, low)`.
    pub low: u64,
    /// RAM above the hole, `[MMIO_END, MMIO_END + high)`.
    pub high: u64,
}

impl RamLayout {
    /// The layout of `mem_bytes` of RAM.
    pub fn new(mem_bytes: u64) -> Self {
        let low = mem_bytes.min(MMIO_BASE);
        RamLayout {
            low,
            high: mem_bytes - low,
        }
    }

    /// All RAM bytes.
    pub fn total(&self) -> u64 {
        self.low + self.high
    }

    /// The RAM ranges as (guest address, bytes), ascending, non-empty.
    pub fn regions(&self) -> impl Iterator<Item = (u64, u64)> {
        [(0, self.low), (MMIO_END, self.high)]
            .into_iter()
            .filter(|r| r.1 > 0)
    }

    /// One past the highest RAM address.
    pub fn top(&self) -> u64 {
        if self.high > 0 {
            MMIO_END.saturating_add(self.high)
        } else {
            self.low
        }
    }

    /// True when `gpa` is RAM.
    pub fn is_ram(&self, gpa: u64) -> bool {
        gpa < self.low || (gpa >= MMIO_END && gpa - MMIO_END < self.high)
    }

    /// GiB of address space the boot page tables identity-map: `[0, 4 GiB)`
    /// always (RAM, hole, LAPIC), then every GiB holding RAM.
    pub fn mapped_gib(&self) -> u64 {
        self.top().div_ceil(1 << 30).max(4)
    }

    /// End of the boot structures: the boot-info page, then the page
    /// directories for GiB 4 and up.
    pub fn boot_end(&self) -> u64 {
        HIGH_PD_ADDR + 0x1000 * (self.mapped_gib() - 4)
    }
}

// The page directories of the largest VM end below the image.
const _: () = assert!(HIGH_PD_ADDR + 0x1000 * ((MAX_RAM_BYTES + (1 << 30)) >> 30) <= IMAGE_BASE);

/// Device kinds in the boot-info device table.
pub use abi::boot::device_kind;
/// Byte offsets in the boot-info block (shared with the guests).
pub use abi::boot::offset as boot_info;

/// A device as described to the guest (the boot-info format's own entry).
pub use abi::boot::DeviceEntry;

/// What the guest is told at entry.
#[derive(Debug, Clone)]
pub struct BootParams<'a> {
    /// Fleet index.
    pub vm_id: u32,
    /// vCPU count.
    pub vcpus: u32,
    /// VM name.
    pub name: &'a str,
    /// Argument string.
    pub args: &'a str,
    /// Devices.
    pub devices: &'a [DeviceEntry],
}

/// Boot failures.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The ELF loader refused the image.
    #[error("cannot load ELF image: {0}")]
    Elf(#[from] linux_loader::loader::Error),
    /// The image's entry or its end (with .bss) lies outside the RAM
    /// between 1 MiB and the MMIO hole.
    #[error("image [entry {entry:#x}, end {end:#x}) does not fit in guest RAM [{IMAGE_BASE:#x}, {mem:#x})")]
    Entry {
        /// ELF entry.
        entry: u64,
        /// End of the loaded image including .bss.
        end: u64,
        /// End of the RAM below the MMIO hole.
        mem: u64,
    },
    /// Writing boot structures into guest memory failed.
    #[error("cannot write boot structures: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
    /// Too many devices, or a name/args too long.
    #[error("boot info: {0}")]
    Info(&'static str),
}

/// Loads `elf` at its physical addresses (>= 1 MiB, in the RAM below the
/// MMIO hole); returns (entry, image_end).
pub fn load_image(
    mem: &GuestMemoryMmap,
    elf: &[u8],
    mem_bytes: u64,
) -> Result<(u64, u64), BootError> {
    let res = Elf::load(
        mem,
        None,
        &mut std::io::Cursor::new(elf),
        Some(GuestAddress(IMAGE_BASE)),
    )?;
    let entry = res.kernel_load.0;
    let mem_end = elf_mem_end(elf).max(res.kernel_end);
    let low = RamLayout::new(mem_bytes).low;
    if !(IMAGE_BASE..low).contains(&entry) || mem_end > low {
        return Err(BootError::Entry {
            entry,
            end: mem_end,
            mem: low,
        });
    }
    let end = (mem_end + 0xfff) & !0xfff;
    Ok((entry, end))
}

/// Entry point and the `[p_paddr, p_paddr + p_memsz)` ranges of the
/// loadable segments of a little-endian ELF64 for x86_64; the error says
/// what is wrong with the header.
fn elf_loads(elf: &[u8]) -> Result<(u64, Vec<(u64, u64)>), String> {
    let rd = |off: usize, n: usize| -> Option<u64> {
        elf.get(off..off.checked_add(n)?)
            .map(|b| b.iter().rev().fold(0u64, |a, &x| (a << 8) | u64::from(x)))
    };
    if elf.get(0..4) != Some(b"\x7fELF".as_slice()) {
        return Err("not an ELF file (bad magic)".into());
    }
    if elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err("not a little-endian 64-bit ELF".into());
    }
    if rd(18, 2) != Some(62) {
        return Err(format!(
            "ELF machine {} is not x86_64 (62)",
            rd(18, 2).unwrap_or(0)
        ));
    }
    let short = || "truncated ELF header".to_string();
    let entry = rd(24, 8).ok_or_else(short)?;
    let (phoff, phentsize, phnum) = (
        rd(32, 8).ok_or_else(short)? as usize,
        rd(54, 2).ok_or_else(short)? as usize,
        rd(56, 2).ok_or_else(short)? as usize,
    );
    let mut loads = Vec::new();
    for i in 0..phnum {
        let ph = phoff.saturating_add(i.saturating_mul(phentsize));
        let p_type = rd(ph, 4).ok_or("program header beyond the end of the file")?;
        if p_type != 1 {
            continue; // not PT_LOAD
        }
        let paddr = rd(ph + 24, 8).ok_or("truncated program header")?;
        let memsz = rd(ph + 40, 8).ok_or("truncated program header")?;
        loads.push((paddr, paddr.saturating_add(memsz)));
    }
    Ok((entry, loads))
}

/// Checks that `elf` is an image this VMM can boot in `mem_bytes` of RAM: a
/// little-endian ELF64 for x86_64 whose entry and loadable segments lie in
/// `[1 MiB, end of the RAM below the MMIO hole)`. The error says why not
/// (config validation reports it as the VM's `image` field).
pub fn check_elf(elf: &[u8], mem_bytes: u64) -> Result<(), String> {
    let mem_bytes = RamLayout::new(mem_bytes).low;
    let (entry, loads) = elf_loads(elf)?;
    if loads.is_empty() {
        return Err("no loadable segment".into());
    }
    if let Some((paddr, end)) = loads
        .iter()
        .find(|(paddr, end)| *paddr < IMAGE_BASE || *end > mem_bytes)
    {
        return Err(format!(
            "loadable segment [{paddr:#x}, {end:#x}) is outside guest RAM [{IMAGE_BASE:#x}, {mem_bytes:#x})"
        ));
    }
    if !(IMAGE_BASE..mem_bytes).contains(&entry) {
        return Err(format!(
            "entry {entry:#x} is outside guest RAM [{IMAGE_BASE:#x}, {mem_bytes:#x})"
        ));
    }
    Ok(())
}

/// Highest `p_paddr + p_memsz` of the ELF's loadable segments (includes .bss).
fn elf_mem_end(elf: &[u8]) -> u64 {
    elf_loads(elf)
        .ok()
        .and_then(|(_, loads)| loads.iter().map(|l| l.1).max())
        .unwrap_or(0)
}

/// Guest address of the page directory that maps GiB `g` of the identity map.
pub fn page_directory_addr(g: u64) -> u64 {
    if g < 4 {
        PML4_ADDR + 0x1000 * (2 + g)
    } else {
        HIGH_PD_ADDR + 0x1000 * (g - 4)
    }
}

/// Writes GDT, identity-mapping page tables and the boot-info block.
pub fn write_boot_structures(
    mem: &GuestMemoryMmap,
    params: &BootParams<'_>,
    mem_bytes: u64,
    image_end: u64,
) -> Result<(), BootError> {
    for (i, entry) in gdt().iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(GDT_ADDR + 8 * i as u64))?;
    }
    // PML4[0] -> PDPT; PDPT[g] -> the page directory of GiB g (GiB 0..4 at
    // 0x3000.., GiB 4.. after the boot-info page); each maps 1 GiB in 2 MiB
    // pages.
    let layout = RamLayout::new(mem_bytes);
    let pdpt = PML4_ADDR + 0x1000;
    mem.write_obj(pdpt | 0x3, GuestAddress(PML4_ADDR))?;
    for g in 0..layout.mapped_gib() {
        let pd = page_directory_addr(g);
        mem.write_obj(pd | 0x3, GuestAddress(pdpt + 8 * g))?;
        let mut entries = [0u64; 512];
        for (i, e) in entries.iter_mut().enumerate() {
            let phys = (g << 30) | ((i as u64) << 21);
            // present | writable | 2 MiB page; uncached outside RAM (the
            // MMIO hole, and past the end of RAM).
            let cache = if layout.is_ram(phys) { 0 } else { 0x18 };
            *e = phys | 0x83 | cache;
        }
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        mem.write_slice(&bytes, GuestAddress(pd))?;
    }
    write_boot_info(mem, params, mem_bytes, image_end)
}

fn write_boot_info(
    mem: &GuestMemoryMmap,
    p: &BootParams<'_>,
    mem_bytes: u64,
    image_end: u64,
) -> Result<(), BootError> {
    use boot_info::*;
    if p.name.len() > abi::boot::NAME_BYTES || p.args.len() > abi::boot::ARGS_BYTES {
        return Err(BootError::Info("name or args too long"));
    }
    if p.devices.len() > MAX_DEVICES {
        return Err(BootError::Info("too many devices"));
    }
    let at = |off: usize| GuestAddress(BOOT_INFO_ADDR + off as u64);
    mem.write_slice(&[0u8; SIZE], at(0))?;
    mem.write_obj(BOOT_MAGIC, at(MAGIC))?;
    mem.write_obj(BOOT_VERSION, at(VERSION))?;
    mem.write_obj(p.vm_id, at(VM_ID))?;
    mem.write_obj(p.vcpus, at(VCPUS))?;
    mem.write_obj(mem_bytes, at(MEM_BYTES))?;
    mem.write_obj(image_end, at(IMAGE_END))?;
    mem.write_obj(p.name.len() as u32, at(NAME_LEN))?;
    mem.write_obj(p.args.len() as u32, at(ARGS_LEN))?;
    mem.write_obj(p.devices.len() as u32, at(DEV_COUNT))?;
    mem.write_slice(p.name.as_bytes(), at(NAME))?;
    mem.write_slice(p.args.as_bytes(), at(ARGS))?;
    for (i, d) in p.devices.iter().enumerate() {
        let base = DEVICES + std::mem::size_of::<abi::boot::DeviceEntry>() * i;
        mem.write_obj(d.kind, at(base))?;
        mem.write_obj(d.vector, at(base + 4))?;
        mem.write_obj(d.base, at(base + 8))?;
        mem.write_obj(d.size, at(base + 16))?;
    }
    let boot_end = RamLayout::new(mem_bytes).boot_end();
    let (map, n) = abi::boot::memory_map(
        mem_bytes, boot_end, IMAGE_BASE, image_end, MMIO_BASE, MMIO_END,
    );
    mem.write_obj(n as u32, at(MEM_MAP_COUNT))?;
    for (i, r) in map[..n].iter().enumerate() {
        let base = MEM_MAP + std::mem::size_of::<abi::boot::MemRegion>() * i;
        mem.write_obj(r.base, at(base))?;
        mem.write_obj(r.size, at(base + 8))?;
        mem.write_obj(r.kind, at(base + 16))?;
    }
    Ok(())
}

/// Flat 64-bit GDT: null, code (L=1), data.
fn gdt() -> [u64; 3] {
    [0, 0x00af_9b00_0000_ffff, 0x00cf_9300_0000_ffff]
}

fn segment(selector: u16, code: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: if code { 0xb } else { 0x3 },
        present: 1,
        dpl: 0,
        db: u8::from(!code),
        s: 1,
        l: u8::from(code),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Sets long mode, paging, segments and SSE enables (OSFXSR) on `sregs`.
pub fn setup_sregs(sregs: &mut kvm_sregs) {
    const CR0_PE: u64 = 1;
    const CR0_MP: u64 = 1 << 1;
    const CR0_ET: u64 = 1 << 4;
    const CR0_NE: u64 = 1 << 5;
    const CR0_WP: u64 = 1 << 16;
    const CR0_PG: u64 = 1 << 31;
    const CR4_PAE: u64 = 1 << 5;
    const CR4_OSFXSR: u64 = 1 << 9;
    const CR4_OSXMMEXCPT: u64 = 1 << 10;
    const EFER_LME: u64 = 1 << 8;
    const EFER_LMA: u64 = 1 << 10;

    sregs.cs = segment(0x08, true);
    let data = segment(0x10, false);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = 3 * 8 - 1;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.efer = EFER_LME | EFER_LMA;
}

/// General registers at entry: `rip` = entry, `rsi` = boot info, `rdi` = vCPU index.
pub fn entry_regs(entry: u64, vcpu_index: u64) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rsi: BOOT_INFO_ADDR,
        rdi: vcpu_index,
        rsp: BOOT_INFO_ADDR, // the runtime sets its own stack at once
        rflags: 0x2,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(mib: u64) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), (mib << 20) as usize)]).unwrap()
    }

    #[test]
    fn page_tables_identity_map_with_2mib_pages() {
        let m = mem(4);
        let p = BootParams {
            vm_id: 3,
            vcpus: 1,
            name: "vm",
            args: "a=1",
            devices: &[],
        };
        write_boot_structures(&m, &p, 4 << 20, IMAGE_BASE + 0x1000).unwrap();
        let pml4: u64 = m.read_obj(GuestAddress(PML4_ADDR)).unwrap();
        assert_eq!(pml4 & !0xfff, PML4_ADDR + 0x1000);
        // PD for GiB 3, entry 5 maps 3 GiB + 10 MiB, uncached (beyond RAM).
        let pde: u64 = m
            .read_obj(GuestAddress(PML4_ADDR + 0x1000 * 5 + 8 * 5))
            .unwrap();
        assert_eq!(pde & !0xfff, (3 << 30) | (5 << 21));
        assert_eq!(pde & 0x83, 0x83);
        assert_eq!(pde & 0x18, 0x18);
        let low: u64 = m.read_obj(GuestAddress(PML4_ADDR + 0x2000 + 8)).unwrap();
        assert_eq!(low, (1 << 21) | 0x83);
    }

    #[test]
    fn boot_info_layout() {
        let m = mem(4);
        let devs = [DeviceEntry {
            kind: device_kind::SERIAL,
            vector: 0,
            base: 0x3f8,
            size: 8,
            reserved: 0,
        }];
        let p = BootParams {
            vm_id: 7,
            vcpus: 2,
            name: "beta",
            args: "k=v",
            devices: &devs,
        };
        write_boot_structures(&m, &p, 4 << 20, 0x20_0000).unwrap();
        // Read the block back as the guest runtime sees it: the shared
        // `#[repr(C)]` struct, not the host's offsets.
        let mut raw = [0u8; boot_info::SIZE];
        m.read_slice(&mut raw, GuestAddress(BOOT_INFO_ADDR))
            .unwrap();
        // SAFETY: BootInfo is repr(C) plain integers and arrays; any bytes are valid.
        let info: abi::boot::BootInfo = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
        assert!(info.is_valid());
        assert_eq!((info.vm_id, info.vcpus), (7, 2));
        assert_eq!((info.mem_bytes, info.image_end), (4 << 20, 0x20_0000));
        assert_eq!((info.name(), info.args()), ("beta", "k=v"));
        assert_eq!(info.arg("k"), Some("v"));
        let d = info.device(device_kind::SERIAL).unwrap();
        assert_eq!((d.base, d.size), (0x3f8, 8));
        use abi::boot::region_kind::*;
        let map: Vec<(u64, u64, u32)> = info
            .regions()
            .iter()
            .map(|r| (r.base, r.size, r.kind))
            .collect();
        assert_eq!(
            map,
            vec![
                (0, BOOT_END, BOOT),
                (BOOT_END, IMAGE_BASE - BOOT_END, RAM),
                (IMAGE_BASE, 0x20_0000 - IMAGE_BASE, IMAGE),
                (0x20_0000, (4 << 20) - 0x20_0000, RAM),
                (MMIO_BASE, MMIO_END - MMIO_BASE, MMIO),
            ]
        );
        assert_eq!(
            info.largest_free_ram().map(|r| r.base),
            Some(0x20_0000),
            "the RAM after the image"
        );
        let long = "x".repeat(1025);
        let p = BootParams { args: &long, ..p };
        assert!(write_boot_structures(&m, &p, 4 << 20, 0).is_err());
    }

    /// Walks the boot page tables for `va`: (physical address, PDE flags).
    fn translate(m: &GuestMemoryMmap, va: u64) -> Option<(u64, u64)> {
        let pml4: u64 = m.read_obj(GuestAddress(PML4_ADDR + 8 * (va >> 39))).ok()?;
        if pml4 & 1 == 0 {
            return None;
        }
        let pdpte: u64 = m
            .read_obj(GuestAddress((pml4 & !0xfff) + 8 * ((va >> 30) & 511)))
            .ok()?;
        if pdpte & 1 == 0 {
            return None;
        }
        let pde: u64 = m
            .read_obj(GuestAddress((pdpte & !0xfff) + 8 * ((va >> 21) & 511)))
            .ok()?;
        (pde & 0x81 == 0x81).then_some((
            (pde & !0x1f_ffff & !(1 << 63)) | (va & 0x1f_ffff),
            pde & 0xfff,
        ))
    }

    #[test]
    fn ram_layout_around_the_mmio_hole_from_1_mib_to_the_maximum() {
        const G: u64 = 1 << 30;
        const M: u64 = 1 << 20;
        let image_end = IMAGE_BASE + 0x1000;
        for mem_bytes in [
            M,
            16 * M,
            3 * G - 2 * M,
            3 * G,
            3 * G + 2 * M,
            3 * G + G / 2,
            4 * G,
            16 * G,
            MAX_RAM_BYTES,
        ] {
            let l = RamLayout::new(mem_bytes);
            let what = format!("{} MiB", mem_bytes >> 20);
            assert_eq!(l.total(), mem_bytes, "{what}");
            assert_eq!(l.low, mem_bytes.min(MMIO_BASE), "{what}");
            assert_eq!(l.high, mem_bytes.saturating_sub(MMIO_BASE), "{what}");
            let regions: Vec<_> = l.regions().collect();
            if mem_bytes > MMIO_BASE {
                assert_eq!(
                    regions,
                    vec![(0, MMIO_BASE), (MMIO_END, mem_bytes - MMIO_BASE)]
                );
                assert_eq!(
                    l.top(),
                    mem_bytes + G,
                    "{what}: the hole moves RAM up by 1 GiB"
                );
            } else {
                assert_eq!(regions, vec![(0, mem_bytes)]);
                assert_eq!(l.top(), mem_bytes);
            }
            assert!(
                l.boot_end() <= IMAGE_BASE,
                "{what}: page directories below the image"
            );
            assert!(!l.is_ram(MMIO_BASE) && !l.is_ram(MMIO_END - 1) && !l.is_ram(l.top()));
            assert!(l.is_ram(0) && l.is_ram(l.top() - 1));

            // The guest memory has the same regions, backed by one memfd.
            let m = crate::vm::create_guest_memory("layout-test", mem_bytes).unwrap();
            use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
            let got: Vec<_> = m.iter().map(|r| (r.start_addr().0, r.len())).collect();
            assert_eq!(got, regions, "{what}");
            use std::os::fd::AsRawFd;
            let files: Vec<(i32, u64)> = m
                .iter()
                .map(|r| {
                    let f = r.file_offset().expect("memfd-backed");
                    (f.file().as_raw_fd(), f.start())
                })
                .collect();
            assert!(
                files.windows(2).all(|w| w[0].0 == w[1].0),
                "{what}: one memfd"
            );
            assert_eq!(
                files.get(1).map(|f| f.1),
                (l.high > 0).then_some(MMIO_BASE),
                "{what}: RAM above the hole is the memfd from 3 GiB"
            );
            m.write_obj(0xabcd_u64, GuestAddress(l.top() - 8)).unwrap();
            assert_eq!(
                m.read_obj::<u64>(GuestAddress(l.top() - 8)).unwrap(),
                0xabcd
            );
            assert!(
                m.read_obj::<u64>(GuestAddress(MMIO_BASE)).is_err(),
                "the hole is not RAM"
            );

            let p = BootParams {
                vm_id: 0,
                vcpus: 1,
                name: "big",
                args: "",
                devices: &[],
            };
            write_boot_structures(&m, &p, mem_bytes, image_end).unwrap();
            // Identity map: RAM cached, the hole (BARs, LAPIC) uncached.
            let mut probes = vec![
                0,
                IMAGE_BASE,
                l.low - 1,
                MMIO_BASE,
                0xFEE0_00B0,
                MMIO_END - 1,
            ];
            if l.high > 0 {
                probes.extend([MMIO_END, MMIO_END + l.high / 2, l.top() - 1]);
            }
            for va in probes {
                let (pa, flags) =
                    translate(&m, va).unwrap_or_else(|| panic!("{what}: {va:#x} unmapped"));
                assert_eq!(pa, va, "{what}: identity");
                // Cacheability is per 2 MiB page: that of the page's start.
                let page = va & !0x1f_ffff;
                assert_eq!(
                    flags & 0x18 == 0,
                    l.is_ram(page),
                    "{what}: {va:#x} cache {flags:#x}"
                );
            }
            // Nothing is mapped past the last GiB holding RAM (or 4 GiB).
            let first_unmapped = l.mapped_gib() * G;
            assert!(translate(&m, first_unmapped).is_none(), "{what}");
            assert_eq!(first_unmapped, l.top().div_ceil(G).max(4) * G);

            // The boot-info memory map says the same.
            let mut raw = [0u8; boot_info::SIZE];
            m.read_slice(&mut raw, GuestAddress(BOOT_INFO_ADDR))
                .unwrap();
            // SAFETY: BootInfo is repr(C) plain integers and arrays.
            let info: abi::boot::BootInfo =
                unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
            assert!(info.is_valid());
            assert_eq!(info.mem_bytes, mem_bytes);
            assert_eq!(info.ram_end(), l.top(), "{what}");
            use abi::boot::region_kind::*;
            let map = info.regions();
            assert_eq!(
                (map[0].kind, map[0].base, map[0].size),
                (BOOT, 0, l.boot_end().min(l.low))
            );
            let ram: u64 = map.iter().filter(|r| r.kind != MMIO).map(|r| r.size).sum();
            assert_eq!(ram, mem_bytes, "{what}: the map holds all the RAM");
            let high: Vec<_> = map.iter().filter(|r| r.base >= MMIO_END).collect();
            assert_eq!(high.len(), usize::from(l.high > 0), "{what}");
            if let Some(h) = high.first() {
                assert_eq!((h.kind, h.base, h.size), (RAM, MMIO_END, l.high));
            }
            // The high page directories are inside the boot region.
            if l.high > 0 {
                let last_pd = page_directory_addr(l.mapped_gib() - 1);
                assert!(last_pd + 0x1000 <= l.boot_end());
                assert!(l.mapped_gib() <= 65, "the maximum maps 65 GiB");
            }
        }
    }

    #[test]
    fn images_must_lie_below_the_hole() {
        let elf = images::builtin("hello").unwrap();
        assert!(check_elf(elf, 16 << 30).is_ok());
        let (_, loads) = elf_loads(elf).unwrap();
        let end = loads.iter().map(|l| l.1).max().unwrap();
        assert!(
            check_elf(elf, end - 1).is_err(),
            "RAM smaller than the image"
        );
    }

    #[test]
    fn builtin_image_loads_at_1mib() {
        let m = mem(4);
        let (entry, end) = load_image(&m, images::builtin("hello").unwrap(), 4 << 20).unwrap();
        assert_eq!(entry, IMAGE_BASE);
        assert!(end > IMAGE_BASE && end % 0x1000 == 0);
        assert!(load_image(&m, b"not an elf", 4 << 20).is_err());
    }
}
