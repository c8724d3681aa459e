//! PVH boot: how a built-in guest starts in a third-party VMM (Cloud
//! Hypervisor `--kernel`, QEMU `-kernel`) and how it powers off there
//! (docs/boot.md, "PVH boot").
//!
//! The image carries a `XEN_ELFNOTE_PHYS32_ENTRY` note naming `pvh_start32`.
//! The VMM enters there in 32-bit protected mode, paging off, interrupts off,
//! `ebx` = guest physical address of the `hvm_start_info` block. The stub
//! builds an identity map of the low 4 GiB (2 MiB pages) in `.pvh_tables`,
//! enters long mode with interrupts still off (this nested KVM does not
//! emulate a 32-bit `iret`, so no interrupt may arrive before), sets the
//! stack, zeroes `.bss` and calls [`rt_pvh_entry`]. That translates the start
//! info into the [`BootInfo`] block the runtime knows (memory map, command
//! line = the program's arguments), maps RAM above 4 GiB, and runs the
//! program as hqdmux's own VMM would. [`power_off`] ends the VM: QEMU's
//! `isa-debug-exit` port, then ACPI S5 as the firmware tables describe it.

use core::ptr::{addr_of_mut, read_unaligned, read_volatile, write_volatile};

use crate::boot::{device_kind, BootInfo, DeviceEntry, MemRegion};
use crate::io::{self, inb, outb, outw};

use abi::pvh::{E820Entry, E820_RAM};
pub use abi::pvh::{START_MAGIC, XEN_ELFNOTE_PHYS32_ENTRY};
/// QEMU `isa-debug-exit` default port: a write of `v` ends QEMU with
/// status `(v << 1) | 1`.
pub const ISA_DEBUG_EXIT_PORT: u16 = 0x501;
/// Cloud Hypervisor's ACPI sleep control port (its FADT names it; used only
/// when no FADT can be read).
pub const FALLBACK_SLEEP_PORT: u16 = 0x600;
/// Sleep type written for S5 when the DSDT has no `_S5_` package we can read
/// (Cloud Hypervisor's value).
pub const FALLBACK_S5_TYPE: u8 = 5;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// Uncached, present, writable, 2 MiB page.
const PDE_UC: u64 = 0x83 | 0x18;
/// Cached, present, writable, 2 MiB page.
const PDE_WB: u64 = 0x83;

extern "C" {
    static mut __pvh_tables: [u64; 6 * 512];
    static __image_end: u8;
}

core::arch::global_asm!(
    r#"
    .pushsection .note.Xen, "a", @note
    .p2align 2
    .long 4
    .long 8
    .long {note_type}
    .asciz "Xen"
    .p2align 2
    .quad pvh_start32
    .p2align 2
    .popsection

    .pushsection .rodata.pvh_gdt, "a"
    .p2align 4
pvh_gdt:
    .quad 0
    .quad 0x00af9b000000ffff
    .quad 0x00cf93000000ffff
pvh_gdt_end:
pvh_gdt_ptr:
    .word pvh_gdt_end - pvh_gdt - 1
    .long pvh_gdt
    .popsection

    .pushsection .text.pvh, "ax"
    .code32
    .global pvh_start32
pvh_start32:
    cli
    cld
    movl %ebx, %ebp
    movl $__pvh_tables, %edi
    movl $(6 * 1024), %ecx
    xorl %eax, %eax
    rep stosl
    movl $__pvh_tables, %edi
    leal 0x1003(%edi), %eax
    movl %eax, (%edi)
    leal 0x2003(%edi), %eax
    movl %eax, 0x1000(%edi)
    addl $0x1000, %eax
    movl %eax, 0x1008(%edi)
    addl $0x1000, %eax
    movl %eax, 0x1010(%edi)
    addl $0x1000, %eax
    movl %eax, 0x1018(%edi)
    addl $0x2000, %edi
    xorl %ecx, %ecx
1:
    movl %ecx, %eax
    shll $21, %eax
    orl $0x83, %eax
    cmpl $1536, %ecx
    jb 2f
    orl $0x18, %eax
2:
    movl %eax, (%edi,%ecx,8)
    incl %ecx
    cmpl $2048, %ecx
    jb 1b
    lgdt pvh_gdt_ptr
    movl $0x620, %eax
    movl %eax, %cr4
    movl $__pvh_tables, %eax
    movl %eax, %cr3
    movl $0xC0000080, %ecx
    rdmsr
    orl $0x100, %eax
    wrmsr
    movl $0x80010033, %eax
    movl %eax, %cr0
    ljmpl $0x08, $pvh_start64

    .code64
pvh_start64:
    movl $0x10, %eax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    movw %ax, %fs
    movw %ax, %gs
    leaq __stack_top(%rip), %rsp
    movl %ebp, %r12d
    leaq __bss_start(%rip), %rdi
    leaq __bss_end(%rip), %rcx
    subq %rdi, %rcx
    xorl %eax, %eax
    cld
    rep stosb
    movl %r12d, %edi
    call {entry}
3:
    cli
    hlt
    jmp 3b
    .popsection
"#,
    note_type = const XEN_ELFNOTE_PHYS32_ENTRY,
    entry = sym rt_pvh_entry,
    options(att_syntax),
);

/// The boot-info block built from `hvm_start_info` (zero until then).
static mut PVH_BOOT: BootInfo = BootInfo {
    magic: 0,
    version: 0,
    vm_id: 0,
    vcpus: 0,
    mem_bytes: 0,
    image_end: 0,
    name_len: 0,
    args_len: 0,
    dev_count: 0,
    mem_map_count: 0,
    name: [0; abi::boot::NAME_BYTES],
    args: [0; abi::boot::ARGS_BYTES],
    devices: [DeviceEntry {
        kind: 0,
        vector: 0,
        base: 0,
        size: 0,
        reserved: 0,
    }; crate::boot::MAX_DEVICES],
    mem_map: [MemRegion {
        base: 0,
        size: 0,
        kind: 0,
        reserved: 0,
    }; crate::boot::MAX_MEM_REGIONS],
};

/// Physical address of the RSDP from `hvm_start_info` (0 = none).
static mut RSDP: u64 = 0;

/// Reads a little-endian `u32` at guest physical `addr` (identity mapped).
fn rd32(addr: u64) -> u32 {
    // SAFETY: callers pass addresses inside tables the VMM placed in RAM
    // below 4 GiB, which the boot map covers.
    unsafe { read_unaligned(addr as *const u32) }
}

/// Reads a little-endian `u64` at `addr`.
fn rd64(addr: u64) -> u64 {
    // SAFETY: as `rd32`.
    unsafe { read_unaligned(addr as *const u64) }
}

/// Reads a byte at `addr`.
fn rd8(addr: u64) -> u8 {
    // SAFETY: as `rd32`.
    unsafe { read_volatile(addr as *const u8) }
}

/// Entries of the start-info memory map read (more are ignored).
const MAX_E820: usize = 32;

/// The start info's memory map, copied (in `.bss`: a table on the stack
/// would be zeroed with SSE stores the emulator lacks).
static mut E820: [E820Entry; MAX_E820] = [E820Entry {
    base: 0,
    size: 0,
    kind: 0,
}; MAX_E820];

/// Builds the boot-info block from `hvm_start_info` at `start_info` and runs
/// the program. Called by the PVH stub in long mode with a stack and `.bss`
/// zeroed.
#[no_mangle]
extern "C" fn rt_pvh_entry(start_info: u32) -> ! {
    io::set_pvh();
    let si = u64::from(start_info);
    if rd32(si) != START_MAGIC {
        crate::println!(
            "rt: PVH start info at {} has a bad magic",
            crate::num::Hex(si)
        );
        power_off(0xFD);
    }
    let version = rd32(si + 4);
    let cmdline = rd64(si + 24);
    if version >= 1 {
        // SAFETY: single-threaded boot; nothing else touches RSDP.
        unsafe { RSDP = rd64(si + 32) };
    }
    let (map, entries) = if version >= 1 {
        (rd64(si + 40), (rd32(si + 48) as usize).min(MAX_E820))
    } else {
        (0, 0)
    };
    if map == 0 || entries == 0 {
        crate::println!(
            "rt: PVH start info has no memory map (version {})",
            crate::num::Dec(version.into())
        );
        power_off(0xFD);
    }
    // SAFETY: E820 and PVH_BOOT are written only here, before the program
    // runs (single-threaded).
    let e820 = unsafe { &mut *addr_of_mut!(E820) };
    for (i, e) in e820.iter_mut().take(entries).enumerate() {
        let at = map + i as u64 * 24;
        e.base = rd64(at);
        e.size = rd64(at + 8);
        e.kind = rd32(at + 16);
    }
    // SAFETY: as above.
    let boot = unsafe { &mut *addr_of_mut!(PVH_BOOT) };
    build_boot_info(boot, cmdline, &e820[..entries]);
    crate::rt_entry(boot)
}

/// Fills `boot` from the start info's command line and memory map, and maps
/// the RAM above 4 GiB it lists (page directories right after the image).
fn build_boot_info(boot: &mut BootInfo, cmdline: u64, e820: &[E820Entry]) {
    boot.magic = crate::boot::BOOT_MAGIC;
    boot.version = crate::boot::BOOT_VERSION;
    boot.vcpus = 1;
    let name = b"pvh";
    boot.name[..name.len()].copy_from_slice(name);
    boot.name_len = name.len() as u32;
    if cmdline != 0 {
        let mut n = 0usize;
        while n < boot.args.len() {
            let b = rd8(cmdline + n as u64);
            if b == 0 {
                break;
            }
            boot.args[n] = b;
            n += 1;
        }
        // Keep the valid UTF-8 prefix only: a cut multibyte character or a
        // stray byte would make `args()` empty; the runtime's arguments are
        // ASCII `key=value` words.
        if let Err(e) = core::str::from_utf8(&boot.args[..n]) {
            n = e.valid_up_to();
        }
        boot.args_len = n as u32;
    }
    boot.devices[0] = DeviceEntry {
        kind: device_kind::SERIAL,
        vector: 0,
        base: u64::from(io::SERIAL_PORT),
        size: 8,
        reserved: 0,
    };
    boot.dev_count = 1;

    // The linker symbol marks the end of the image (stack and boot page
    // tables included).
    let last = core::ptr::addr_of!(__image_end) as u64;
    let image_end = (last + 0xFFF) & !0xFFF;
    // RAM above 4 GiB needs page directories: one per GiB, after the image.
    let high_gibs = abi::pvh::high_gibs(e820);
    let tables_end = image_end + high_gibs * 4096;
    boot.image_end = tables_end;
    set_page_tables(e820, image_end, high_gibs);
    let info = abi::pvh::pvh_memory_map(e820, image_end, tables_end, &mut boot.mem_map);
    if info.truncated {
        crate::println!("rt: PVH memory map too long; the rest is left unused");
    }
    boot.mem_map_count = info.count as u32;
    boot.mem_bytes = info.ram_bytes;
}

/// True when `[base, base + 2 MiB)` overlaps RAM of the start-info map.
fn is_ram(e820: &[E820Entry], base: u64) -> bool {
    e820.iter().any(|e| {
        e.kind == E820_RAM && e.base < base + 2 * MIB && base < e.base.saturating_add(e.size)
    })
}

/// Marks the low 4 GiB cached where RAM is and uncached elsewhere, adds the
/// page directories for `high_gibs` GiB from 4 GiB at `pd_base`, and reloads
/// `CR3`.
fn set_page_tables(e820: &[E820Entry], pd_base: u64, high_gibs: u64) {
    // SAFETY: the stub's tables: PML4, PDPT, four page directories; only
    // this single-threaded boot code touches them.
    let t = unsafe { &mut *addr_of_mut!(__pvh_tables) };
    for i in 0..2048u64 {
        let base = i * 2 * MIB;
        let flags = if is_ram(e820, base) { PDE_WB } else { PDE_UC };
        t[1024 + i as usize] = base | flags;
    }
    for g in 0..high_gibs {
        let pd = pd_base + g * 4096;
        for i in 0..512u64 {
            let base = (4 + g) * GIB + i * 2 * MIB;
            let flags = if is_ram(e820, base) { PDE_WB } else { PDE_UC };
            // SAFETY: the page directories lie in RAM after the image that the
            // memory map reports as boot structures; nothing else uses it.
            unsafe { write_volatile((pd + i * 8) as *mut u64, base | flags) };
        }
        t[512 + 4 + g as usize] = pd | 3;
    }
    let cr3 = t.as_ptr() as u64;
    // SAFETY: the tables identity-map everything this code runs from.
    unsafe { core::arch::asm!("mov cr3, {}", in(reg) cr3, options(nostack)) };
}

/// Where ACPI says S5 is entered.
enum SleepReg {
    /// Hardware-reduced ACPI: `SLEEP_CONTROL_REG` (8 bits, I/O port or MMIO).
    Control { io: bool, addr: u64 },
    /// Fixed hardware: `PM1a_CNT_BLK` I/O port (16 bits).
    Pm1a(u16),
}

/// Finds the table with `sig` through the RSDP's XSDT (or RSDT).
fn find_table(rsdp: u64, sig: &[u8; 4]) -> Option<u64> {
    if rsdp == 0 || rd64(rsdp) != u64::from_le_bytes(*b"RSD PTR ") {
        return None;
    }
    let want = u32::from_le_bytes(*sig);
    let (root, wide) = if rd8(rsdp + 15) >= 2 && rd64(rsdp + 24) != 0 {
        (rd64(rsdp + 24), true)
    } else {
        (u64::from(rd32(rsdp + 16)), false)
    };
    if root == 0 || root >= 4 * GIB {
        return None;
    }
    let len = u64::from(rd32(root + 4)).min(4096);
    let step = if wide { 8 } else { 4 };
    let mut off = 36;
    while off + step <= len {
        let t = if wide {
            rd64(root + off)
        } else {
            u64::from(rd32(root + off))
        };
        if t != 0 && t < 4 * GIB && rd32(t) == want {
            return Some(t);
        }
        off += step;
    }
    None
}

/// `SLP_TYPa` of the DSDT's `_S5_` package (`abi::pvh::s5_sleep_type`).
fn s5_type(dsdt: u64) -> Option<u8> {
    if dsdt == 0 || dsdt >= 4 * GIB || rd32(dsdt) != u32::from_le_bytes(*b"DSDT") {
        return None;
    }
    let len = u64::from(rd32(dsdt + 4)).clamp(36, 1 << 20);
    // SAFETY: the firmware's DSDT, below 4 GiB (identity mapped), `len`
    // bytes as its header says (capped at 1 MiB).
    let table = unsafe { core::slice::from_raw_parts(dsdt as *const u8, len as usize) };
    abi::pvh::s5_sleep_type(table)
}

/// The S5 register and sleep type from the ACPI tables, if readable.
fn acpi_s5() -> Option<(SleepReg, u8)> {
    // SAFETY: written once at boot.
    let rsdp = unsafe { RSDP };
    let facp = find_table(rsdp, b"FACP")?;
    let len = u64::from(rd32(facp + 4));
    let dsdt = if len >= 148 && rd64(facp + 140) != 0 {
        rd64(facp + 140)
    } else {
        u64::from(rd32(facp + 40))
    };
    let hw_reduced = len >= 116 && rd32(facp + 112) & (1 << 20) != 0;
    let reg = if hw_reduced {
        if len < 256 {
            return None;
        }
        let space = rd8(facp + 244);
        let addr = rd64(facp + 248);
        if addr == 0 || space > 1 {
            return None;
        }
        SleepReg::Control {
            io: space == 1,
            addr,
        }
    } else {
        let port = rd32(facp + 64);
        if port == 0 || port > 0xFFFF {
            return None;
        }
        SleepReg::Pm1a(port as u16)
    };
    Some((reg, s5_type(dsdt).unwrap_or(FALLBACK_S5_TYPE)))
}

/// Ends the VM: reports `status` on the console, writes it to QEMU's
/// `isa-debug-exit` port (QEMU then exits with `status * 2 + 1`; elsewhere
/// the write goes nowhere), then enters ACPI S5 (the sleep register the FADT
/// names, or Cloud Hypervisor's port 0x600 when there is no FADT).
pub fn power_off(status: u32) -> ! {
    crate::println!("rt: exit status {}", crate::num::Dec(status.into()));
    outb(ISA_DEBUG_EXIT_PORT, status as u8);
    match acpi_s5() {
        Some((SleepReg::Control { io: true, addr }, typ)) if addr <= 0xFFFF => {
            outb(addr as u16, (typ & 7) << 2 | 1 << 5)
        }
        Some((SleepReg::Control { io: false, addr }, typ)) => {
            // SAFETY: the FADT's sleep control register, an MMIO byte below
            // 4 GiB (identity mapped) or beyond the map (then a page fault
            // ends the VM all the same).
            unsafe { write_volatile(addr as *mut u8, (typ & 7) << 2 | 1 << 5) }
        }
        Some((SleepReg::Pm1a(port), typ)) => outw(port, u16::from(typ & 7) << 10 | 1 << 13),
        _ => outb(FALLBACK_SLEEP_PORT, FALLBACK_S5_TYPE << 2 | 1 << 5),
    }
    let _ = inb(FALLBACK_SLEEP_PORT);
    loop {
        // SAFETY: nothing left to do; sleep until the VMM tears the VM down.
        unsafe { core::arch::asm!("cli; hlt", options(nomem, nostack)) }
    }
}
