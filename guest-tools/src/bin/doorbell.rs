//! Doorbell cost probe for `vmm/examples/doorbell_bench.rs`: finds the vGPU
//! on PCI, loads queue 0 and runs one kernel (so its doorbell is live), then
//! `rounds` times: checkpoint 10, `n` 64-bit writes to the bare ioeventfd
//! at `bare=ADDR` (registered by the bench), checkpoint 11, checkpoint 12,
//! `n` writes of queue 0's write index to its doorbell (BAR2 + 0: the host
//! reads the write pointer and drops them as stale), checkpoint 13. Both
//! loops are the same code ([`write_n`]), so the spans differ only by what
//! the host does per write: under PVM every guest instruction is emulated
//! (~0.5 us each), so a different loop body would dominate the difference.
//!
//! Args: `bare=ADDR` (in the MMIO hole), `n=N` (5000), `rounds=R` (5).
//!
//! With `detect=J` instead (no `bare`): J jobs of one `mark` kernel of
//! `wgs=W` (304) workgroups x `cost_us=C` (500): publish the packet, then
//! checkpoint 2 and the doorbell store back to back ([`checkpoint_then_ring`]:
//! the store is the first instruction after the checkpoint's port write),
//! then wait by interrupt. The host times checkpoint 2 -> preemption issued.
//!
//! Exit status 0 ok, 2 queue error, 3 no vGPU, 4 bad arguments or set-up.
#![no_std]
#![no_main]

use abi::kernel::{KernelDescriptor, KernelKind};
use rt::gpu::{Alloc, Vgpu, WaitResult};
use rt::{io, println, BootInfo};

fn main(boot: &'static BootInfo) -> u32 {
    rt::greet(boot);
    if let Some(jobs) = boot.arg_u64("detect") {
        return detect(boot, jobs);
    }
    let (Some(bare), n, rounds) = (
        boot.arg_u64("bare"),
        boot.arg_u64("n").unwrap_or(5000),
        boot.arg_u64("rounds").unwrap_or(5),
    ) else {
        println!("doorbell: bare=ADDR is required");
        return 4;
    };
    let Some(mut gpu) = Vgpu::probe(boot) else {
        println!("doorbell: no vGPU");
        return 3;
    };
    let mut alloc = Alloc::new(boot);
    let Ok(kd) =
        Vgpu::write_kernel_descriptor(&mut alloc, &KernelDescriptor::new(KernelKind::Mark, 1000))
    else {
        return 4;
    };
    let Ok(mut q) = gpu.create_queue(&mut alloc, 0, 64, 7) else {
        println!("doorbell: cannot create queue 0");
        return 4;
    };
    let Ok((signal, _)) = q.submit_mark(&mut alloc, kd, 1, true) else {
        return 4;
    };
    q.ring();
    // SAFETY: `signal` comes from submit_mark.
    if unsafe { gpu.wait(0, signal) } != WaitResult::Done {
        println!("doorbell: queue error");
        return 4;
    }
    let doorbell = gpu.doorbell_base();
    let wptr = q.write_index();
    for _ in 0..rounds {
        io::checkpoint(10);
        write_n(bare, wptr, n);
        io::checkpoint(11);
        io::checkpoint(12);
        write_n(doorbell, wptr, n);
        io::checkpoint(13);
    }
    q.destroy();
    println!("doorbell: ok");
    0
}

/// Writes checkpoint `code`, then stores `wptr` to `doorbell` as the very
/// next instruction.
fn checkpoint_then_ring(code: u32, doorbell: u64, wptr: u64) {
    // SAFETY: port I/O to the checkpoint port, then one 64-bit store to a
    // doorbell in BAR2 (identity-mapped MMIO hole, an ioeventfd).
    unsafe {
        core::arch::asm!(
            "out dx, eax",
            "mov qword ptr [{db}], {w}",
            db = in(reg) doorbell,
            w = in(reg) wptr,
            in("dx") io::CHECKPOINT_PORT,
            in("eax") code,
            options(nostack, preserves_flags),
        )
    }
}

fn detect(boot: &'static BootInfo, jobs: u64) -> u32 {
    let wgs = boot.arg_u64("wgs").unwrap_or(304) as u32;
    let cost_ns = boot.arg_u64("cost_us").unwrap_or(500) * 1000;
    let Some(mut gpu) = Vgpu::probe(boot) else {
        println!("doorbell: no vGPU");
        return 3;
    };
    let mut alloc = Alloc::new(boot);
    let Ok(kd) = Vgpu::write_kernel_descriptor(
        &mut alloc,
        &KernelDescriptor::new(KernelKind::Mark, cost_ns),
    ) else {
        return 4;
    };
    let Ok(mut q) = gpu.create_queue(&mut alloc, 0, 64, 7) else {
        println!("doorbell: cannot create queue 0");
        return 4;
    };
    let doorbell = gpu.doorbell_base();
    for _ in 0..jobs {
        let Ok((signal, _)) = q.submit_mark(&mut alloc, kd, wgs, true) else {
            return 4;
        };
        checkpoint_then_ring(2, doorbell, q.write_index());
        // SAFETY: `signal` comes from submit_mark.
        if unsafe { gpu.wait(0, signal) } != WaitResult::Done {
            println!("doorbell: queue error {}", rt::num::Dec(q.error() as u64));
            return 2;
        }
        io::checkpoint(3);
    }
    q.destroy();
    println!("doorbell: {} jobs ok", rt::num::Dec(jobs));
    0
}

/// `n` 64-bit stores of `value` to `addr` (an ioeventfd: never memory).
#[inline(never)]
fn write_n(addr: u64, value: u64, n: u64) {
    for _ in 0..n {
        // SAFETY: `addr` is an ioeventfd address in the identity-mapped MMIO
        // hole (the bare one, or a doorbell in BAR2); no memory is written.
        unsafe { core::ptr::write_volatile(addr as *mut u64, value) };
    }
}

rt::entry!(main);
