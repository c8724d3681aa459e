//! Port I/O: serial console, exit port and checkpoint port (docs/boot.md).
//! Under PVH boot in another VMM (`crate::pvh`) there is neither exit nor
//! checkpoint port: checkpoints are skipped and [`exit`] powers off.

use core::sync::atomic::{AtomicBool, Ordering};

/// Set once by the PVH entry; `.bss` (false) under hqdmux's own VMM.
static PVH: AtomicBool = AtomicBool::new(false);

/// Marks this boot as a PVH boot (no hqdmux exit or checkpoint port).
pub(crate) fn set_pvh() {
    PVH.store(true, Ordering::Relaxed);
}

/// True when the guest was started through its PVH entry.
pub fn is_pvh() -> bool {
    PVH.load(Ordering::Relaxed)
}

/// COM1 base port (16550 UART).
pub const SERIAL_PORT: u16 = 0x3f8;
/// A 32-bit write here ends the VM with that exit status.
pub const EXIT_PORT: u16 = 0xf4;
/// A 32-bit write here records a host-side timestamped checkpoint.
pub const CHECKPOINT_PORT: u16 = 0xf8;
/// Checkpoint written by the runtime on entry, before anything else.
pub const CHECKPOINT_ENTRY: u32 = 1;
/// Checkpoint `CHECKPOINT_SECONDARY_VCPU | index` is written by every vCPU
/// other than vCPU 0 when it starts, just before it halts.
pub const CHECKPOINT_SECONDARY_VCPU: u32 = 0x100;

/// Writes one byte to an I/O port.
#[inline]
pub fn outb(port: u16, value: u8) {
    // SAFETY: port I/O has no memory effects; the VMM traps it.
    unsafe {
        core::arch::asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
    }
}

/// Writes two bytes to an I/O port.
#[inline]
pub fn outw(port: u16, value: u16) {
    // SAFETY: as `outb`.
    unsafe {
        core::arch::asm!("out dx, ax", in("dx") port, in("ax") value, options(nomem, nostack, preserves_flags))
    }
}

/// Reads one byte from an I/O port.
#[inline]
pub fn inb(port: u16) -> u8 {
    let v: u8;
    // SAFETY: as `outb`.
    unsafe {
        core::arch::asm!("in al, dx", in("dx") port, out("al") v, options(nomem, nostack, preserves_flags))
    }
    v
}

/// Writes four bytes to an I/O port.
#[inline]
pub fn outl(port: u16, value: u32) {
    // SAFETY: as `outb`.
    unsafe {
        core::arch::asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack, preserves_flags))
    }
}

/// Reads four bytes from an I/O port.
#[inline]
pub fn inl(port: u16) -> u32 {
    let v: u32;
    // SAFETY: as `outb`.
    unsafe {
        core::arch::asm!("in eax, dx", in("dx") port, out("eax") v, options(nomem, nostack, preserves_flags))
    }
    v
}

/// Records a timestamped checkpoint on the host.
pub fn checkpoint(code: u32) {
    if is_pvh() {
        return;
    }
    outl(CHECKPOINT_PORT, code);
}

/// Ends the VM with `status` (0 = success). Never returns. Under PVH boot
/// the status is printed and the VM powers off ([`crate::pvh::power_off`]).
pub fn exit(status: u32) -> ! {
    if is_pvh() {
        crate::pvh::power_off(status);
    }
    outl(EXIT_PORT, status);
    loop {
        // SAFETY: only reached if the VMM ignored the exit write.
        unsafe { core::arch::asm!("cli; hlt", options(nomem, nostack)) }
    }
}

/// The serial console as a `core::fmt::Write` sink.
pub struct Console;

impl core::fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for b in s.bytes() {
            outb(SERIAL_PORT, b);
        }
        Ok(())
    }
}
