//! `rt`: the bare-metal runtime every hqdmux guest program links.
//!
//! The VMM enters the image in 64-bit long mode at `_start` with paging on
//! (identity map of the low 4 GiB), `rsi` = guest physical address of the
//! boot-info block and `rdi` = vCPU index (see docs/boot.md). The runtime sets
//! the stack, zeroes `.bss`, and calls the program's `guest_main` on vCPU 0;
//! every other vCPU writes checkpoint `CHECKPOINT_SECONDARY_VCPU | index` and
//! halts with interrupts off. Output goes to the 16550 serial port at 0x3f8, and the
//! program's return value is written to the exit port, which ends the VM.
//!
//! The image also has a PVH entry (`pvh`) for Cloud Hypervisor and QEMU,
//! which builds the same boot-info block from `hvm_start_info`.
//!
//! Integer-only: the nested KVM here emulates guest instructions and has no
//! scalar SSE, so no `f32`/`f64` anywhere in guest code.
#![no_std]

pub mod boot;
pub mod gpu;
pub mod io;
pub mod irq;
mod mem;
pub mod num;
pub mod pci;
pub mod pvh;

pub use boot::BootInfo;

/// Prints the VM's greeting line: `hello from NAME (vm ID), args: [ARGS]`.
pub fn greet(boot: &BootInfo) {
    // Integers through `Dec`: core's integer formatting may use SSE, which the
    // nested KVM's instruction emulator cannot run (docs/boot.md).
    println!(
        "hello from {} (vm {}), args: [{}]",
        boot.name(),
        num::Dec(boot.vm_id as u64),
        boot.args()
    );
}

use core::fmt::Write;

core::arch::global_asm!(
    r#"
    .section .text._start, "ax"
    .global _start
_start:
    test rdi, rdi
    jnz 2f
    lea rsp, [rip + __stack_top]
    mov r12, rsi
    lea rdi, [rip + __bss_start]
    lea rcx, [rip + __bss_end]
    sub rcx, rdi
    xor eax, eax
    cld
    rep stosb
    mov rdi, r12
    call {entry}
    jmp 3f
2:
    mov eax, edi
    or eax, {secondary}
    mov dx, {port}
    out dx, eax
3:
    cli
    hlt
    jmp 3b
"#,
    entry = sym rt_entry,
    secondary = const io::CHECKPOINT_SECONDARY_VCPU,
    port = const io::CHECKPOINT_PORT,
);

extern "Rust" {
    /// Defined by [`entry!`] in the program.
    fn guest_main(boot: &'static BootInfo) -> u32;
}

/// First Rust code: checks the boot block, runs the program, exits with its status.
extern "C" fn rt_entry(boot: *const BootInfo) -> ! {
    io::checkpoint(io::CHECKPOINT_ENTRY);
    // SAFETY: the VMM places a valid boot-info block at this address; its
    // magic is checked before any other field is trusted.
    let boot = unsafe { &*boot };
    if !boot.is_valid() {
        let _ = writeln!(io::Console, "rt: bad boot-info block");
        io::exit(0xFD);
    }
    // SAFETY: guest_main is provided by the program through `entry!`.
    let status = unsafe { guest_main(boot) };
    io::exit(status)
}

/// Declares the program's main function: `fn(&'static BootInfo) -> u32`.
#[macro_export]
macro_rules! entry {
    ($main:path) => {
        #[no_mangle]
        fn guest_main(boot: &'static $crate::BootInfo) -> u32 {
            let f: fn(&'static $crate::BootInfo) -> u32 = $main;
            f(boot)
        }
    };
}

/// Prints to the serial console.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {{
        use core::fmt::Write as _;
        let _ = write!($crate::io::Console, $($arg)*);
    }};
}

/// Prints a line to the serial console.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => {{
        use core::fmt::Write as _;
        let _ = writeln!($crate::io::Console, $($arg)*);
    }};
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    // Not `{info}`: core formats the line number with SSE code the emulator
    // cannot run (see `num`).
    let _ = write!(io::Console, "guest panic: {}", info.message());
    if let Some(l) = info.location() {
        let _ = write!(
            io::Console,
            " at {}:{}",
            l.file(),
            num::Dec(l.line() as u64)
        );
    }
    let _ = writeln!(io::Console);
    io::exit(0xFE)
}

/// Referenced by precompiled `core` in unoptimised builds; never called (panic=abort).
#[no_mangle]
pub extern "C" fn rust_eh_personality() {}
