//! Interrupts: an IDT with one handler per device vector, the local APIC
//! (xAPIC at 0xFEE00000), and [`halt`], the `sti; hlt` wait.
//!
//! Interrupts stay disabled (IF = 0) everywhere except inside [`halt`], so
//! a vector that arrives while the program runs stays pending in the LAPIC
//! and is taken at the next `sti; hlt`: check a condition, then [`halt`],
//! never misses a wake-up. The handlers only set the vector's bit in
//! [`pending`] and write the LAPIC EOI; they run on the current stack (no
//! TSS), which is safe because `halt`'s asm is not `nostack` (the compiler
//! keeps nothing in the red zone across it).

use core::ptr::addr_of_mut;
use core::sync::atomic::{AtomicU64, Ordering};

/// First IDT vector of the device handlers: device vector `i` (0..
/// [`MAX_VECTORS`]) is IDT vector `VECTOR_BASE + i`.
pub const VECTOR_BASE: u8 = 0x40;
/// Device vectors with a handler.
pub const MAX_VECTORS: usize = 16;
/// Spurious-interrupt vector programmed in the LAPIC SVR.
pub const SPURIOUS_VECTOR: u8 = 0xFF;
/// LAPIC registers (offsets from [`abi::pci::LAPIC_BASE`]).
pub mod lapic {
    /// APIC ID (bits 31:24).
    pub const ID: u64 = 0x20;
    /// Task priority.
    pub const TPR: u64 = 0x80;
    /// End of interrupt.
    pub const EOI: u64 = 0xB0;
    /// Spurious interrupt vector (bit 8: APIC software enable).
    pub const SVR: u64 = 0xF0;
    /// LVT LINT0 (the legacy 8259's ExtINT line in virtual-wire mode).
    pub const LVT_LINT0: u64 = 0x350;
    /// LVT LINT1 (NMI in virtual-wire mode).
    pub const LVT_LINT1: u64 = 0x360;
    /// LVT entry mask bit.
    pub const LVT_MASKED: u32 = 1 << 16;
}

/// Bit `i` set: device vector `i` arrived (set by the handler).
static PENDING: AtomicU64 = AtomicU64::new(0);

/// 256 16-byte gates (in .bss: zero = not present).
static mut IDT: [u64; 512] = [0; 512];

#[repr(C, packed)]
struct Idtr {
    limit: u16,
    base: u64,
}

static mut IDTR: Idtr = Idtr { limit: 0, base: 0 };

core::arch::global_asm!(
    r#"
    .section .text.hqd_irq, "ax"
    .balign 16
    .global hqd_irq_stubs
hqd_irq_stubs:
    .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
    .balign 16
    push rax
    mov eax, \n
    jmp hqd_irq_common
    .endr
    .balign 16
hqd_irq_common:
    lock bts qword ptr [rip + {pending}], rax
    push rdx
    movabs rdx, {eoi}
    mov dword ptr [rdx], 0
    pop rdx
    pop rax
    iretq
    .balign 16
    .global hqd_irq_spurious
hqd_irq_spurious:
    iretq
"#,
    pending = sym PENDING,
    eoi = const abi::pci::LAPIC_BASE + lapic::EOI,
);

extern "C" {
    fn hqd_irq_stubs();
    fn hqd_irq_spurious();
}

fn gate(vector: u8, handler: u64) {
    // Interrupt gate, present, DPL 0, selector 0x08 (the boot GDT's code segment).
    let lo = (handler & 0xFFFF) | 0x08 << 16 | 0x8E << 40 | ((handler >> 16) & 0xFFFF) << 48;
    let hi = handler >> 32;
    // SAFETY: single-threaded set-up on vCPU 0 with interrupts off; the IDT
    // is a static only this module touches.
    unsafe {
        let idt = addr_of_mut!(IDT) as *mut u64;
        core::ptr::write_volatile(idt.add(2 * vector as usize), lo);
        core::ptr::write_volatile(idt.add(2 * vector as usize + 1), hi);
    }
}

/// Writes the LAPIC register at `off` (absolute address loaded with
/// `movabs`: 0xFEE00000 does not fit a sign-extended 32-bit displacement).
pub fn lapic_write(off: u64, value: u32) {
    let addr = abi::pci::LAPIC_BASE + off;
    // SAFETY: the LAPIC page is identity mapped (uncached) by the VMM.
    unsafe {
        core::arch::asm!("mov dword ptr [{a}], {v:e}", a = in(reg) addr, v = in(reg) value, options(nostack, preserves_flags))
    }
}

/// Reads the LAPIC register at `off`.
pub fn lapic_read(off: u64) -> u32 {
    let addr = abi::pci::LAPIC_BASE + off;
    let v: u32;
    // SAFETY: as `lapic_write`.
    unsafe {
        core::arch::asm!("mov {v:e}, dword ptr [{a}]", a = in(reg) addr, v = out(reg) v, options(nostack, preserves_flags, readonly))
    }
    v
}

/// Loads the IDT (handlers for device vectors 0..[`MAX_VECTORS`] and the
/// spurious vector) and enables the local APIC (TPR 0, SVR enable).
/// LINT0 and LINT1 are masked: firmware (SeaBIOS before QEMU's PVH option
/// ROM) leaves the 8259 PIT tick wired to LINT0 as ExtINT at vector 8,
/// which has no gate here and would triple-fault at the first `sti`.
/// Interrupts stay disabled. Returns this vCPU's APIC id.
pub fn init() -> u8 {
    let stubs = hqd_irq_stubs as *const () as usize as u64;
    for i in 0..MAX_VECTORS as u8 {
        gate(VECTOR_BASE + i, stubs + 16 * u64::from(i));
    }
    gate(
        SPURIOUS_VECTOR,
        hqd_irq_spurious as *const () as usize as u64,
    );
    // SAFETY: IDTR is a static only this function writes; `lidt` reads it.
    unsafe {
        let r = addr_of_mut!(IDTR);
        core::ptr::write_volatile(addr_of_mut!((*r).limit), (512 * 8 - 1) as u16);
        core::ptr::write_volatile(addr_of_mut!((*r).base), addr_of_mut!(IDT) as u64);
        core::arch::asm!("cli", "lidt [{r}]", r = in(reg) r, options(nostack));
    }
    lapic_write(lapic::LVT_LINT0, lapic::LVT_MASKED);
    lapic_write(lapic::LVT_LINT1, lapic::LVT_MASKED);
    lapic_write(lapic::TPR, 0);
    lapic_write(lapic::SVR, 0x100 | u32::from(SPURIOUS_VECTOR));
    (lapic_read(lapic::ID) >> 24) as u8
}

/// Device vectors that arrived and were not taken yet.
pub fn pending() -> u64 {
    PENDING.load(Ordering::SeqCst)
}

/// Clears the bits of `mask` in [`pending`]; returns which of them were set.
pub fn take(mask: u64) -> u64 {
    PENDING.fetch_and(!mask, Ordering::SeqCst) & mask
}

/// `sti; hlt`: sleeps until an interrupt (handled before this returns),
/// then disables interrupts again. The vCPU stays in the host kernel.
pub fn halt() {
    // Not `nostack`: a handler pushes on this stack.
    // SAFETY: the IDT set up by `init` handles every vector the LAPIC can deliver.
    unsafe { core::arch::asm!("sti", "hlt", "cli") }
}
