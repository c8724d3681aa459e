//! Prints the VM's name and arguments, then exits 0 (or `exit=N`).
#![no_std]
#![no_main]

use rt::BootInfo;

fn main(boot: &'static BootInfo) -> u32 {
    rt::greet(boot);
    boot.arg_u64("exit").unwrap_or(0) as u32
}

rt::entry!(main);
