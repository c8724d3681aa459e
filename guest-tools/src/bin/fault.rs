//! Misbehaving guest for tests: `mode=triple` loads an empty IDT and raises
//! an exception (a triple fault); `mode=panic` panics; `mode=hang` never
//! exits (for run-timeout tests); `mode=exit code=N` exits with N.
#![no_std]
#![no_main]

use rt::{println, BootInfo};

fn main(boot: &'static BootInfo) -> u32 {
    let mode = boot.arg("mode").unwrap_or("triple");
    println!("fault: {} mode {}", boot.name(), mode);
    match mode {
        "triple" => {
            let idt = [0u16; 5]; // limit 0, base 0: every vector faults
                                 // SAFETY: deliberately faults; the VMM reports a triple fault.
            unsafe {
                core::arch::asm!("lidt [{0}]", "ud2", in(reg) idt.as_ptr(), options(noreturn));
            }
        }
        "panic" => panic!("requested by args"),
        "hang" => loop {
            core::hint::spin_loop();
        },
        _ => boot.arg_u64("code").unwrap_or(1) as u32,
    }
}

rt::entry!(main);
