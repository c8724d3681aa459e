//! Hostile guest for `tests/tests/hostile.rs`: attacks its own vGPU the way a
//! malicious or broken driver would and checks that every attack gets what
//! docs/vgpu-abi.md promises (a read of all ones, an ignored write, a
//! refused load with the right `CP_HQD_ERROR`, a queue error with the right
//! code), then that the vGPU still runs a correct kernel for it.
//!
//! In order:
//! 1. PCI: absent bus / function / device numbers read all ones; every dword
//!    of the vGPU's configuration space written with all ones (BARs overlap
//!    at the top of the 4 GiB hole, MSI-X enabled and masked), then the
//!    read-only fields are checked and the space is reset and probed again.
//! 2. Registers: every register offset of BAR0 written with all ones; the
//!    identification registers must not change, every vHQD must read a
//!    refused load (error 19, the MQD at `0xFFFF_FFFF_FFFF_FFFF`); a BAR2
//!    sweep of 1-, 2-, 4- and 8-byte writes at every offset while no queue is
//!    loaded; the PBA written.
//! 3. MQD admission: one valid queue on vHQD 1 is unloaded, and its MQD is
//!    reloaded with one field broken at a time (header, AQL, ring size, ring
//!    at the end of RAM / in MMIO / wrapping, pointer addresses, CWSR sizes,
//!    layout and range, read pointer, CU mask, MQD in MMIO / straddling the
//!    end of RAM / wrapping): each must be refused with its code.
//! 4. Packets: the queue reloaded fresh for each: every unsupported header
//!    type, barrier-AND/OR with bad dependency signals, dispatches with a bad
//!    geometry, kernel object, kernarg, data or completion signal at the end
//!    of RAM or in MMIO, a write index beyond the ring: each must end in a
//!    queue error with its code. Also a load while loaded and a dequeue
//!    request written right after the load.
//! 5. A fresh load of the unmodified MQD runs a `mark` kernel exactly once
//!    per workgroup.
//! 6. With a queue loaded and a kernel published, memory decoding is turned
//!    off and on and both BARs are moved; the registers answer at the new
//!    BAR0, a 4-byte store to the new doorbell runs the kernel exactly.
//! 7. A kernel is SAVE-dequeued with waves in flight; a reload after one
//!    byte of its control record was altered must fail with error 18, a
//!    reload of the unaltered record must resume.
//! 8. The MSI-X table: every vector masked, then bad widths, an unaligned
//!    8-byte write, garbage messages and a write past the table.
//!
//! With `mode=flood` it instead floods its console and the checkpoint port
//! ([`flood`]); with `mode=barrier` it blocks queues on barriers nobody
//! meets for a while, then meets them itself ([`barrier`], issue 21); with
//! `mode=rehang` it re-submits an unpreemptable kernel after every
//! preemption-timeout reset ([`rehang`], issue 21).
//!
//! Every failed expectation prints `hostile: FAIL ...`. Exit status: 0 all
//! held, 1 some failed, 3 no vGPU, 4 set-up failed.
#![no_std]
#![no_main]

use abi::aql::{TYPE_BARRIER_AND, TYPE_BARRIER_OR, TYPE_INVALID, TYPE_KERNEL_DISPATCH};
use abi::kernel::{KernelDescriptor, KernelKind};
use abi::pci::{cfg, config_address, CONFIG_ADDRESS_PORT, CONFIG_DATA_PORT};
use abi::vgpu::{error, reg};
use core::ptr::{read_volatile, write_volatile};
use rt::gpu::{Alloc, Vgpu, MARK_WG_SIZE};
use rt::io::{inl, outl};
use rt::num::{Dec, Hex};
use rt::{println, BootInfo};

/// The vHQD the MQD and packet attacks use.
const Q: u32 = 1;
/// Ring of the attacked queue (packets).
const RING: u32 = 64;
/// `amd_queue_t.write_dispatch_id` / `read_dispatch_id`.
const WRITE_ID: u64 = 0x38;
const READ_ID: u64 = 0x80;
/// Polls of `CP_HQD_ERROR` before giving up on an expected queue error.
const POLLS: u32 = 100_000;

fn r32(a: u64) -> u32 {
    // SAFETY: `a` is RAM of this program or a register of an assigned BAR,
    // both identity mapped; 4-byte aligned.
    unsafe { read_volatile(a as *const u32) }
}
fn w32(a: u64, v: u32) {
    // SAFETY: as `r32`.
    unsafe { write_volatile(a as *mut u32, v) }
}
fn r64(a: u64) -> u64 {
    // SAFETY: as `r32`, 8-byte aligned.
    unsafe { read_volatile(a as *const u64) }
}
fn w64(a: u64, v: u64) {
    // SAFETY: as `r32`, 8-byte aligned.
    unsafe { write_volatile(a as *mut u64, v) }
}
fn w16(a: u64, v: u16) {
    // SAFETY: as `r32`, 2-byte aligned.
    unsafe { write_volatile(a as *mut u16, v) }
}
fn w8(a: u64, v: u8) {
    // SAFETY: as `r32`.
    unsafe { write_volatile(a as *mut u8, v) }
}

fn cfg_read(bus: u8, dev: u8, func: u8, off: u8) -> u32 {
    outl(CONFIG_ADDRESS_PORT, config_address(bus, dev, func, off));
    inl(CONFIG_DATA_PORT)
}
fn cfg_write(dev: u8, off: u8, v: u32) {
    outl(CONFIG_ADDRESS_PORT, config_address(0, dev, 0, off));
    outl(CONFIG_DATA_PORT, v);
}

struct Checks {
    fails: u32,
}

impl Checks {
    fn eq(&mut self, what: &str, got: u64, want: u64) {
        if got != want {
            println!("hostile: FAIL {what}: got {} want {}", Hex(got), Hex(want));
            self.fails += 1;
        }
    }
}

/// The attacked queue: addresses of a valid MQD set-up and its pristine copy.
#[derive(Clone, Copy)]
struct Target {
    regs: u64,
    doorbell: u64,
    mqd: u64,
    pristine: u64,
    amd_queue: u64,
    ring: u64,
}

impl Target {
    fn reg(&self, r: usize) -> u64 {
        self.regs + (reg::HQD_BASE + reg::HQD_STRIDE * Q as usize + r) as u64
    }
    fn error(&self) -> u32 {
        r32(self.reg(reg::CP_HQD_ERROR))
    }
    fn active(&self) -> bool {
        r32(self.reg(reg::CP_HQD_ACTIVE)) & 1 == 1
    }
    /// Unloads (drain) if loaded, waits, then clears the sticky error.
    fn unload(&self) -> bool {
        if self.active() {
            w32(self.reg(reg::CP_HQD_DEQUEUE_REQUEST), 1);
            let mut n = 0u32;
            while self.active() {
                n += 1;
                if n > POLLS {
                    return false;
                }
            }
        }
        w32(self.reg(reg::CP_HQD_DEQUEUE_REQUEST), 1);
        true
    }
    /// Restores the pristine MQD, an empty ring and zero indexes, applies
    /// `edits` (dword, value), points the vHQD at `at` (the MQD if None) and
    /// loads. Returns `CP_HQD_ERROR` right after the load.
    fn load(&self, edits: &[(usize, u32)], at: Option<u64>) -> u32 {
        for d in 0..512u64 {
            w32(self.mqd + 4 * d, r32(self.pristine + 4 * d));
        }
        for s in 0..u64::from(RING) {
            w32(self.ring + 64 * s, u32::from(TYPE_INVALID));
        }
        w64(self.amd_queue + WRITE_ID, 0);
        w64(self.amd_queue + READ_ID, 0);
        for &(d, v) in edits {
            w32(self.mqd + 4 * d as u64, v);
        }
        let a = at.unwrap_or(self.mqd);
        w32(self.reg(reg::CP_MQD_BASE_ADDR), a as u32);
        w32(self.reg(reg::CP_MQD_BASE_ADDR_HI), (a >> 32) as u32);
        w32(self.reg(reg::CP_HQD_ACTIVE), 1);
        self.error()
    }
    /// Loads the MQD as it is in memory (no restore, no edits).
    fn reload(&self) -> u32 {
        w32(self.reg(reg::CP_MQD_BASE_ADDR), self.mqd as u32);
        w32(self.reg(reg::CP_MQD_BASE_ADDR_HI), (self.mqd >> 32) as u32);
        w32(self.reg(reg::CP_HQD_ACTIVE), 1);
        self.error()
    }
    /// Waits until the queue is on a physical HQD (false if it never is).
    fn wait_on_hqd(&self) -> bool {
        (0..POLLS).any(|_| r32(self.reg(reg::CP_HQD_STATE)) == abi::vgpu::hqd_state::ON_HQD)
    }
    /// Publishes packet 0 (body already in slot 0) with `header`, moves the
    /// write index to `wptr` and rings.
    fn publish(&self, header: u16, setup: u16, wptr: u64) {
        w32(self.ring, u32::from(header) | u32::from(setup) << 16);
        w64(self.amd_queue + WRITE_ID, wptr);
        w64(self.doorbell, wptr);
    }
    /// Waits for a queue error; 0 if none came.
    fn wait_error(&self) -> u32 {
        for _ in 0..POLLS {
            let e = self.error();
            if e != 0 {
                return e;
            }
        }
        0
    }
}

/// LAPIC timer vector: the last of `rt::irq`'s 16 vectors (the vGPU uses
/// the first `NUM_VECTORS`).
const TIMER_VECTOR: u8 = rt::irq::VECTOR_BASE + 15;

/// Sleeps about `ms` milliseconds in `hlt` (no host CPU): the LAPIC timer,
/// one-shot, divide by 1, in chunks of at most 1 s (it counts at 1 GHz
/// under KVM, docs/boot.md).
fn sleep_ms(ms: u64) {
    let bit = 1u64 << (TIMER_VECTOR - rt::irq::VECTOR_BASE);
    let mut left = ms;
    while left > 0 {
        let chunk = left.min(1000);
        left -= chunk;
        rt::irq::take(bit);
        rt::irq::lapic_write(0x3E0, 0xB); // divide by 1
        rt::irq::lapic_write(0x320, u32::from(TIMER_VECTOR)); // one-shot, unmasked
        rt::irq::lapic_write(0x380, (chunk * 1_000_000) as u32);
        while rt::irq::take(bit) == 0 {
            rt::irq::halt();
        }
    }
}

/// `mode=barrier` (issue 21): loads `queues=N` (1..=8, default 1) vHQDs,
/// each with a barrier-AND on a signal of its own (value 1) followed by a
/// `mark` kernel of `wgs=W` (304) workgroups, and rings them; nobody meets
/// the barriers for `ms=M` (5000) milliseconds, while the vCPU sleeps. Then
/// the CPU meets them (stores 0, rings no doorbell: the host's re-check
/// must find it; checkpoint 0x21 when blocked, 0x22 when released), waits for every kernel by interrupt and checks that each
/// workgroup ran exactly once. Prints `hostile: barrier ok`; exit 0, 1 a
/// kernel wrong or a queue error, 3 no vGPU, 4 set-up failed.
fn barrier(boot: &BootInfo) -> u32 {
    let n = boot.arg_u64("queues").unwrap_or(1).clamp(1, 8) as u32;
    let wgs = boot.arg_u64("wgs").unwrap_or(304).clamp(1, 1 << 20) as u32;
    let ms = boot.arg_u64("ms").unwrap_or(5000);
    let Some(mut gpu) = Vgpu::probe(boot) else {
        println!("hostile: no vGPU");
        return 3;
    };
    let mut alloc = Alloc::new(boot);
    let Ok(kd) =
        Vgpu::write_kernel_descriptor(&mut alloc, &KernelDescriptor::new(KernelKind::Mark, 1000))
    else {
        return 4;
    };
    // Per queue: dependency, completion signal and counters addresses, in
    // fresh (zero) RAM: no table on the stack (docs/boot.md, SSE).
    let Ok(table) = alloc.alloc(3 * 8 * 8, 64) else {
        return 4;
    };
    let at = |k: u64, i: u32| table + 64 * k + 8 * u64::from(i);
    for i in 0..n {
        let Ok(mut q) = gpu.create_queue(&mut alloc, i, 64, 0) else {
            println!("hostile: cannot create queue {}", Dec(i.into()));
            return 4;
        };
        let Ok(dep) = Vgpu::new_signal(&mut alloc, 1) else {
            return 4;
        };
        // The barrier-AND packet: body first (every byte), then the header.
        let idx = q.write_index();
        let slot = q.ring_addr() + (idx % u64::from(q.ring_packets())) * 64;
        w32(slot + 4, 0);
        w64(slot + 8, dep);
        let mut off = 16;
        while off < 64 {
            w64(slot + off, 0);
            off += 8;
        }
        w32(slot, u32::from(header(TYPE_BARRIER_AND)));
        q.set_write_index(idx + 1);
        let Ok((signal, counters)) = q.submit_mark(&mut alloc, kd, wgs, false) else {
            return 4;
        };
        q.ring();
        w64(at(0, i), dep);
        w64(at(1, i), signal);
        w64(at(2, i), counters);
    }
    println!(
        "hostile: {} queues blocked on barriers for {} ms",
        Dec(n.into()),
        Dec(ms)
    );
    rt::io::checkpoint(0x21);
    sleep_ms(ms);
    rt::io::checkpoint(0x22);
    let mut fails = 0;
    for i in 0..n {
        // The dependency's value (+8) to 0: a plain CPU store, no doorbell.
        w64(r64(at(0, i)) + 8, 0);
    }
    for i in 0..n {
        let (signal, counters) = (r64(at(1, i)), r64(at(2, i)));
        // SAFETY: `signal` comes from submit_mark.
        if unsafe { gpu.wait(i, signal) } != rt::gpu::WaitResult::Done {
            println!(
                "hostile: FAIL queue {} error {}",
                Dec(i.into()),
                Dec(gpu.hqd_error(i).into())
            );
            fails += 1;
            continue;
        }
        // SAFETY: `counters` holds `wgs` u32 counters of this program.
        let wrong = unsafe { Vgpu::counters_differing(counters, wgs, 1) };
        if wrong != 0 {
            println!(
                "hostile: FAIL queue {}: {} workgroups not run exactly once",
                Dec(i.into()),
                Dec(wrong.into())
            );
            fails += 1;
        }
    }
    if fails == 0 {
        println!("hostile: barrier ok");
        0
    } else {
        1
    }
}

/// `mode=rehang` (issue 21): loads vHQD 0 with a `mark` kernel of `wgs=W`
/// (304) workgroups of an hour each whose waves have no save point, and
/// every time the host resets it (error 22: a preemption timed out)
/// dequeues and reloads the written-back MQD, which restarts the kernel: it
/// hangs again. After `ms=M` (10000) milliseconds, or when a reload is
/// refused with 23 (the guard's quarantine), it stops: a RESET dequeue if
/// loaded, then `hostile: rehang N resets, quarantined Q` and exit 0; exit 1
/// on any other error code, 3 no vGPU, 4 set-up failed.
fn rehang(boot: &BootInfo) -> u32 {
    let wgs = boot.arg_u64("wgs").unwrap_or(304).clamp(1, 1 << 20) as u32;
    let ms = boot.arg_u64("ms").unwrap_or(10_000);
    let Some(mut gpu) = Vgpu::probe(boot) else {
        println!("hostile: no vGPU");
        return 3;
    };
    let mut alloc = Alloc::new(boot);
    let hour = 3_600_000_000_000;
    let Ok(kd) = Vgpu::write_kernel_descriptor(
        &mut alloc,
        &KernelDescriptor::new(KernelKind::Mark, hour)
            .with_flags(abi::kernel::flags::NO_SAVE_POINT),
    ) else {
        return 4;
    };
    let Ok(mut q) = gpu.create_queue(&mut alloc, 0, 64, 0) else {
        return 4;
    };
    if q.submit_mark(&mut alloc, kd, wgs, false).is_err() {
        return 4;
    }
    q.ring();
    let mqd = q.mqd_addr();
    let regs = gpu.regs_base();
    let hqd = |r: usize| regs + (reg::HQD_BASE + r) as u64;
    let err_bit = 1u64 << abi::vgpu::ERROR_VECTOR;
    let timer_bit = 1u64 << (TIMER_VECTOR - rt::irq::VECTOR_BASE);
    // The deadline: one LAPIC timer chunk after another (at most 1 s each).
    let mut left = ms;
    let arm = |left: &mut u64| {
        let chunk = (*left).min(1000);
        *left -= chunk;
        rt::irq::lapic_write(0x3E0, 0xB);
        rt::irq::lapic_write(0x320, u32::from(TIMER_VECTOR));
        rt::irq::lapic_write(0x380, (chunk * 1_000_000) as u32);
    };
    arm(&mut left);
    let (mut resets, mut quarantined) = (0u64, false);
    loop {
        if rt::irq::take(timer_bit) != 0 {
            if left == 0 {
                break;
            }
            arm(&mut left);
        }
        if rt::irq::take(err_bit) != 0 {
            let e = r32(hqd(reg::CP_HQD_ERROR));
            if e == 0 {
                continue;
            }
            if e == error::QUARANTINED {
                // A reload refused by the guard (after the vCPU's write).
                quarantined = true;
                break;
            }
            if e != error::PREEMPTION_TIMEOUT {
                println!("hostile: FAIL rehang: error {}", Dec(e.into()));
                return 1;
            }
            resets += 1;
            // Dequeue the stopped queue (at once), clear the error, reload.
            w32(hqd(reg::CP_HQD_DEQUEUE_REQUEST), 1);
            while r32(hqd(reg::CP_HQD_ACTIVE)) & 1 == 1 {
                core::hint::spin_loop();
            }
            w32(hqd(reg::CP_HQD_DEQUEUE_REQUEST), 1);
            w32(hqd(reg::CP_MQD_BASE_ADDR), mqd as u32);
            w32(hqd(reg::CP_MQD_BASE_ADDR_HI), (mqd >> 32) as u32);
            w32(hqd(reg::CP_HQD_ACTIVE), 1);
            continue;
        }
        rt::irq::halt();
    }
    if r32(hqd(reg::CP_HQD_ACTIVE)) & 1 == 1 {
        w32(hqd(reg::CP_HQD_DEQUEUE_REQUEST), 2);
        while r32(hqd(reg::CP_HQD_ACTIVE)) & 1 == 1 {
            core::hint::spin_loop();
        }
    }
    println!(
        "hostile: rehang {} resets, quarantined {}",
        Dec(resets),
        Dec(quarantined.into())
    );
    0
}

/// `mode=flood`: `lines=N` (100000) empty console lines and `marks=M`
/// (100000) checkpoints as fast as the vCPU can write them, then one line
/// `hostile: flood done`; the host must keep bounded memory for both.
fn flood(boot: &BootInfo) -> u32 {
    let lines = boot.arg_u64("lines").unwrap_or(100_000);
    let marks = boot.arg_u64("marks").unwrap_or(100_000);
    for _ in 0..lines {
        rt::io::outb(rt::io::SERIAL_PORT, b'\n');
    }
    for i in 0..marks {
        rt::io::checkpoint(0x1000 | i as u32);
    }
    println!("hostile: flood done");
    0
}

/// (what, MQD dword edits, expected `CP_HQD_ERROR`).
type MqdCase = (&'static str, [(usize, u32); 2], u32);
/// (what, header type, body edits (byte offset, value), write index,
/// expected `CP_HQD_ERROR`).
type PacketCase = (&'static str, u8, [(u64, u64); 2], u64, u32);

fn header(typ: u8) -> u16 {
    // Barrier bit, system-scope acquire and release fences.
    u16::from(typ) | 1 << 8 | 2 << 9 | 2 << 11
}

fn main(boot: &'static BootInfo) -> u32 {
    rt::greet(boot);
    if boot.arg("mode") == Some("flood") {
        return flood(boot);
    }
    if boot.arg("mode") == Some("barrier") {
        return barrier(boot);
    }
    if boot.arg("mode") == Some("rehang") {
        return rehang(boot);
    }
    let mut c = Checks { fails: 0 };
    let ram_end = boot.ram_end();

    // ---- 1. PCI configuration space ----------------------------------
    let Some(dev) = (0..32u8).find(|&d| {
        cfg_read(0, d, 0, 0)
            == u32::from(abi::pci::VENDOR_ID) | u32::from(abi::pci::DEVICE_ID) << 16
    }) else {
        println!("hostile: no vGPU on bus 0");
        return 3;
    };
    c.eq(
        "bus 1 reads all ones",
        cfg_read(1, dev, 0, 0).into(),
        0xFFFF_FFFF,
    );
    c.eq(
        "function 1 reads all ones",
        cfg_read(0, dev, 1, 0).into(),
        0xFFFF_FFFF,
    );
    c.eq(
        "function 7 of bus 255 reads all ones",
        cfg_read(255, 31, 7, 0).into(),
        0xFFFF_FFFF,
    );
    c.eq(
        "empty device 31 reads all ones",
        cfg_read(0, 31, 0, 0).into(),
        0xFFFF_FFFF,
    );
    let before_id = cfg_read(0, dev, 0, 0);
    let before_class = cfg_read(0, dev, 0, cfg::REVISION as u8);
    let before_cap = cfg_read(0, dev, 0, 0x44);
    for off in (0..=0xFCu8).step_by(4) {
        cfg_write(dev, off, 0xFFFF_FFFF);
    }
    c.eq(
        "ids after all-ones writes",
        cfg_read(0, dev, 0, 0).into(),
        before_id.into(),
    );
    c.eq(
        "class after all-ones writes",
        cfg_read(0, dev, 0, cfg::REVISION as u8).into(),
        before_class.into(),
    );
    c.eq(
        "MSI-X table offset after all-ones writes",
        cfg_read(0, dev, 0, 0x44).into(),
        before_cap.into(),
    );
    c.eq(
        "BAR0 mask",
        cfg_read(0, dev, 0, cfg::BAR0 as u8).into(),
        0xFFFF_C000,
    );
    c.eq(
        "BAR1 unimplemented",
        cfg_read(0, dev, 0, cfg::BAR0 as u8 + 4).into(),
        0,
    );
    c.eq(
        "BAR2 mask",
        cfg_read(0, dev, 0, cfg::BAR0 as u8 + 8).into(),
        0xFFFF_F000,
    );
    // 1- and 2-byte writes that straddle nothing, then reset everything the
    // guest can write.
    outl(CONFIG_ADDRESS_PORT, config_address(0, dev, 0, 0));
    // SAFETY: port I/O to CONFIG_DATA + 1 / + 2 (1 and 2 bytes).
    unsafe {
        core::arch::asm!("out dx, al", in("dx") CONFIG_DATA_PORT + 1, in("al") 0u8, options(nostack));
        core::arch::asm!("out dx, ax", in("dx") CONFIG_DATA_PORT + 2, in("ax") 0u16, options(nostack));
    }
    c.eq(
        "ids after byte writes",
        cfg_read(0, dev, 0, 0).into(),
        before_id.into(),
    );
    for off in [
        cfg::COMMAND as u8,
        cfg::BAR0 as u8,
        cfg::BAR0 as u8 + 8,
        0x40,
    ] {
        cfg_write(dev, off, 0);
    }

    // ---- 2. registers, doorbells, PBA ----------------------------------
    let Some(gpu) = Vgpu::probe(boot) else {
        println!("hostile: vGPU probe failed after the configuration-space attack");
        return 3;
    };
    let regs = gpu.regs_base();
    let bar2 = gpu.doorbell_base();
    let id_regs: [usize; 5] = [
        reg::VGPU_ID,
        reg::VGPU_VERSION,
        reg::NUM_VHQD,
        reg::NUM_XCC,
        reg::CWSR_SIZE,
    ];
    let mut ids = [0u32; 5];
    for (i, r) in id_regs.iter().enumerate() {
        ids[i] = r32(regs + *r as u64);
    }
    for off in (0..0x1000u64).step_by(4) {
        w32(regs + off, 0xFFFF_FFFF);
    }
    for (i, r) in id_regs.iter().enumerate() {
        c.eq(
            "identification register after all-ones writes",
            r32(regs + *r as u64).into(),
            ids[i].into(),
        );
    }
    for v in 0..gpu.num_vhqd {
        c.eq(
            "vHQD error after an all-ones MQD address",
            gpu.hqd_error(v).into(),
            error::MQD_ADDRESS.into(),
        );
        c.eq(
            "vHQD active after a refused load",
            gpu.hqd_active(v).into(),
            0,
        );
        gpu.hqd_dequeue(v);
        c.eq(
            "error cleared by a dequeue request",
            gpu.hqd_error(v).into(),
            0,
        );
    }
    for off in (0..0x1000u64).step_by(8) {
        w64(bar2 + off, 0xFFFF_FFFF_FFFF_FFFF);
        w8(bar2 + off + 1, 0xFF);
        w16(bar2 + off + 2, 0xFFFF);
        w32(bar2 + off + 4, 0xFFFF_FFFF);
    }
    c.eq("BAR2 reads 0", r32(bar2 + 8).into(), 0);
    w64(
        regs - abi::pci::REGS_OFFSET + abi::pci::MSIX_PBA_OFFSET,
        u64::MAX,
    );

    // ---- 3. MQD admission ---------------------------------------------
    let mut gpu = gpu;
    let mut alloc = Alloc::new(boot);
    let Ok(kd) =
        Vgpu::write_kernel_descriptor(&mut alloc, &KernelDescriptor::new(KernelKind::Mark, 10))
    else {
        return 4;
    };
    let mut q = match gpu.create_queue(&mut alloc, Q, RING, 0) {
        Ok(q) => q,
        Err(e) => {
            println!("hostile: creating the queue: {e}");
            return 4;
        }
    };
    q.destroy();
    let Ok(pristine) = alloc.alloc(2048, 4096) else {
        return 4;
    };
    for d in 0..512u64 {
        w32(pristine + 4 * d, r32(q.mqd_addr() + 4 * d));
    }
    let t = Target {
        regs,
        doorbell: bar2 + 8 * u64::from(Q),
        mqd: q.mqd_addr(),
        pristine,
        amd_queue: q.amd_queue_addr(),
        ring: q.ring_addr(),
    };
    let p = |d: usize| r32(pristine + 4 * d as u64);
    let bar0 = regs - abi::pci::REGS_OFFSET;
    // An address `back` bytes before the end of RAM, as MQD lo and hi dwords
    // (RAM may end above 4 GiB).
    let end_lo = |back: u64| (ram_end - back) as u32;
    let end_hi = |back: u64| ((ram_end - back) >> 32) as u32;
    let mqd_cases: [MqdCase; 24] = [
        ("bad header", [(0, 0), (0, 0)], error::BAD_MQD_HEADER),
        ("not AQL", [(181, 0), (181, 0)], error::NOT_AQL),
        (
            "ring size 6",
            [(145, p(145) & !0x3F | 6), (145, p(145) & !0x3F | 6)],
            error::RING_SIZE,
        ),
        (
            "ring size 29",
            [(145, p(145) & !0x3F | 29), (145, p(145) & !0x3F | 29)],
            error::RING_SIZE,
        ),
        (
            "ring size 63",
            [(145, p(145) | 0x3F), (145, p(145) | 0x3F)],
            error::RING_SIZE,
        ),
        (
            "ring straddling the end of RAM",
            [(136, ((ram_end - 256) >> 8) as u32), (137, 0)],
            error::RING_OUT_OF_RANGE,
        ),
        (
            "ring in MMIO",
            [(136, (bar0 >> 8) as u32), (137, 0)],
            error::RING_OUT_OF_RANGE,
        ),
        (
            "ring at the top of the address space",
            [(136, u32::MAX), (137, u32::MAX)],
            error::RING_OUT_OF_RANGE,
        ),
        (
            "wptr poll address past RAM",
            [(141, end_lo(4)), (142, end_hi(4))],
            error::POINTER_ADDR_OUT_OF_RANGE,
        ),
        (
            "wptr poll address wrapping",
            [(141, 0xFFFF_FFFC), (142, u32::MAX)],
            error::POINTER_ADDR_OUT_OF_RANGE,
        ),
        (
            "rptr report address in MMIO",
            [(139, bar0 as u32), (140, 0)],
            error::POINTER_ADDR_OUT_OF_RANGE,
        ),
        (
            "ctx save size 0",
            [(177, 0), (177, 0)],
            error::CWSR_TOO_SMALL,
        ),
        (
            "control stack size 0",
            [(175, 0), (175, 0)],
            error::CWSR_TOO_SMALL,
        ),
        (
            "control stack offset past its size",
            [(174, p(175) + 4), (174, p(175) + 4)],
            error::BAD_CWSR_LAYOUT,
        ),
        (
            "control stack larger than the save area",
            [(175, p(177) + 4096), (174, p(177) + 4096)],
            error::BAD_CWSR_LAYOUT,
        ),
        (
            "CWSR area straddling the end of RAM",
            [(171, end_lo(4096)), (172, end_hi(4096))],
            error::CWSR_OUT_OF_RANGE,
        ),
        (
            "CWSR area wrapping",
            [(171, 0xFFFF_F000), (172, u32::MAX)],
            error::CWSR_OUT_OF_RANGE,
        ),
        (
            "rptr not packet aligned",
            [(138, 1), (138, 1)],
            error::BAD_POINTERS,
        ),
        (
            "rptr ahead of wptr",
            [(138, 16 * 5), (182, 0)],
            error::BAD_POINTERS,
        ),
        (
            "rptr more than a ring behind wptr",
            [(138, 0), (182, 16 * 200)],
            error::BAD_POINTERS,
        ),
        ("empty CU mask", [(23, 0), (24, 0)], error::EMPTY_CU_MASK),
        ("MQD in MMIO", [(0, p(0)), (0, p(0))], error::MQD_ADDRESS),
        (
            "MQD straddling the end of RAM",
            [(0, p(0)), (0, p(0))],
            error::MQD_ADDRESS,
        ),
        (
            "MQD at the top of the address space",
            [(0, p(0)), (0, p(0))],
            error::MQD_ADDRESS,
        ),
    ];
    for (i, (what, edits, want)) in mqd_cases.iter().enumerate() {
        let at = match i {
            21 => Some(bar0),
            22 => Some(ram_end - 1024),
            23 => Some(u64::MAX - 255),
            _ => None,
        };
        // Every shader engine's dword of the CU mask.
        let no_cu: [(usize, u32); 4] = [(23, 0), (24, 0), (26, 0), (27, 0)];
        let e: &[(usize, u32)] = if i == 20 { &no_cu } else { &edits[..] };
        let got = t.load(e, at);
        c.eq(what, got.into(), (*want).into());
        if !t.unload() {
            println!("hostile: FAIL {what}: a refused load would not unload");
            c.fails += 1;
        }
    }

    // ---- 4. packets ----------------------------------------------------
    let signal = match Vgpu::new_signal(&mut alloc, 1) {
        Ok(s) => s,
        Err(_) => return 4,
    };
    let Ok(kernarg) = alloc.alloc(64, 64) else {
        return 4;
    };
    let Ok(counters) = alloc.alloc(4 * 64, 64) else {
        return 4;
    };
    w64(kernarg, counters);
    w32(kernarg + 8, 4);
    // A valid 4-workgroup mark dispatch body in slot 0; `edits` (byte
    // offset, u64) change it.
    let dispatch = |edits: &[(u64, u64)]| {
        let s = t.ring;
        w32(s + 4, u32::from(MARK_WG_SIZE) | 1 << 16);
        w32(s + 8, 1);
        w32(s + 12, u32::from(MARK_WG_SIZE) * 4);
        w32(s + 16, 1);
        w32(s + 20, 1);
        w64(s + 24, 0);
        w64(s + 32, kd);
        w64(s + 40, kernarg);
        w64(s + 48, 0);
        w64(s + 56, 0);
        for &(off, v) in edits {
            if off % 8 == 0 {
                w64(s + off, v);
            } else {
                w32(s + off, v as u32);
            }
        }
    };
    let bad_types: [u8; 6] = [0, 4, 6, 7, 128, 255];
    for typ in bad_types {
        if t.load(&[], None) != 0 {
            c.eq("fresh load", 1, 0);
            continue;
        }
        dispatch(&[]);
        t.publish(header(typ), 1, 1);
        let got = t.wait_error();
        if got != error::UNSUPPORTED_PACKET {
            println!(
                "hostile: FAIL header type {}: error {}",
                Dec(typ.into()),
                Dec(got.into())
            );
            c.fails += 1;
        }
        t.unload();
    }
    // (what, header type, body edits, write index, expected error)
    let far = ram_end - 8;
    let packet_cases: [PacketCase; 14] = [
        (
            "barrier-AND, dependency signal wrapping",
            TYPE_BARRIER_AND,
            [(8, u64::MAX - 63), (56, 0)],
            1,
            error::SIGNAL_OUT_OF_RANGE,
        ),
        (
            "barrier-AND, dependency signal in MMIO",
            TYPE_BARRIER_AND,
            [(8, bar0), (56, 0)],
            1,
            error::SIGNAL_OUT_OF_RANGE,
        ),
        (
            "barrier-OR, dependency signal past RAM",
            TYPE_BARRIER_OR,
            [(40, far), (56, 0)],
            1,
            error::SIGNAL_OUT_OF_RANGE,
        ),
        (
            "barrier-AND, completion signal past RAM",
            TYPE_BARRIER_AND,
            [(8, 0), (56, far)],
            1,
            error::SIGNAL_OUT_OF_RANGE,
        ),
        (
            "dispatch, zero grid",
            TYPE_KERNEL_DISPATCH,
            [(12, 0), (12, 0)],
            1,
            error::BAD_DISPATCH,
        ),
        (
            "dispatch, zero workgroup",
            TYPE_KERNEL_DISPATCH,
            [(4, 0), (4, 0)],
            1,
            error::BAD_DISPATCH,
        ),
        (
            "dispatch, 2048 work-items per workgroup",
            TYPE_KERNEL_DISPATCH,
            [(4, 1024 | 2 << 16), (4, 1024 | 2 << 16)],
            1,
            error::BAD_DISPATCH,
        ),
        (
            "dispatch, kernel object at the end of RAM",
            TYPE_KERNEL_DISPATCH,
            [(32, ram_end - 16), (32, ram_end - 16)],
            1,
            error::DESCRIPTOR_OUT_OF_RANGE,
        ),
        (
            "dispatch, kernel object wrapping",
            TYPE_KERNEL_DISPATCH,
            [(32, u64::MAX - 15), (32, u64::MAX - 15)],
            1,
            error::DESCRIPTOR_OUT_OF_RANGE,
        ),
        (
            "dispatch, kernel object in MMIO",
            TYPE_KERNEL_DISPATCH,
            [(32, bar0), (32, bar0)],
            1,
            error::DESCRIPTOR_OUT_OF_RANGE,
        ),
        (
            "dispatch, kernarg at the end of RAM",
            TYPE_KERNEL_DISPATCH,
            [(40, far), (40, far)],
            1,
            error::KERNARG_OUT_OF_RANGE,
        ),
        (
            "dispatch, kernarg in MMIO",
            TYPE_KERNEL_DISPATCH,
            [(40, bar0), (40, bar0)],
            1,
            error::KERNARG_OUT_OF_RANGE,
        ),
        (
            "dispatch, completion signal wrapping",
            TYPE_KERNEL_DISPATCH,
            [(56, u64::MAX - 7), (56, u64::MAX - 7)],
            1,
            error::SIGNAL_OUT_OF_RANGE,
        ),
        (
            "write index beyond the ring",
            TYPE_KERNEL_DISPATCH,
            [(56, 0), (56, 0)],
            1000,
            error::WPTR_BEYOND_RING,
        ),
    ];
    for (what, typ, edits, wptr, want) in packet_cases.iter() {
        if t.load(&[], None) != 0 {
            c.eq("fresh load", 1, 0);
            continue;
        }
        if *typ == TYPE_KERNEL_DISPATCH {
            dispatch(edits);
        } else {
            // Barrier body: reserved, five dependency signals, completion.
            for off in (8..64u64).step_by(8) {
                w64(t.ring + off, 0);
            }
            w32(t.ring + 4, 0);
            for &(off, v) in edits {
                w64(t.ring + off, v);
            }
        }
        t.publish(
            header(*typ),
            if *typ == TYPE_KERNEL_DISPATCH { 1 } else { 0 },
            *wptr,
        );
        let got = t.wait_error();
        c.eq(what, got.into(), (*want).into());
        t.unload();
    }
    // Kernarg names counters past RAM: a data error.
    w64(kernarg, ram_end - 8);
    if t.load(&[], None) == 0 {
        dispatch(&[]);
        t.publish(header(TYPE_KERNEL_DISPATCH), 1, 1);
        c.eq(
            "mark counters past RAM",
            t.wait_error().into(),
            error::DATA_OUT_OF_RANGE.into(),
        );
        t.unload();
    }
    w64(kernarg, counters);
    // A second load while loaded is ignored; a dequeue written at once after
    // a load completes.
    if t.load(&[], None) == 0 {
        w32(t.reg(reg::CP_HQD_ACTIVE), 1);
        c.eq("load while loaded", t.error().into(), 0);
        w32(t.reg(reg::CP_HQD_DEQUEUE_REQUEST), 2);
        c.eq("dequeue after load unloads", t.unload().into(), 1);
    }

    // ---- 5. the vGPU still works for this VM ----------------------------
    for i in 0..64 {
        w32(counters + 4 * i, 0);
    }
    w32(kernarg + 8, 64);
    if t.load(&[], None) != 0 {
        println!("hostile: FAIL the unmodified MQD is refused at the end");
        return 1;
    }
    dispatch(&[(12, u64::from(MARK_WG_SIZE) * 64), (56, signal)]);
    t.publish(header(TYPE_KERNEL_DISPATCH), 1, 1);
    let mut n = 0u32;
    // SAFETY: `signal` is an amd_signal_t from new_signal.
    while unsafe { Vgpu::signal_value(signal) } > 0 && t.error() == 0 && n < 10 * POLLS {
        n += 1;
    }
    c.eq("final kernel error", t.error().into(), 0);
    // SAFETY: counters hold 64 u32s written by the host.
    let wrong = unsafe { Vgpu::counters_differing(counters, 64, 1) };
    c.eq("final kernel counters not exactly 1", wrong.into(), 0);
    t.unload();

    // ---- 6. BARs moved and decoding toggled while a queue is loaded ----
    let new_bar0 = 0xD000_0000u64;
    let new_bar2 = 0xD010_0000u64;
    let Ok(signal2) = Vgpu::new_signal(&mut alloc, 1) else {
        return 4;
    };
    for i in 0..64 {
        w32(counters + 4 * i, 0);
    }
    if t.load(&[], None) != 0 {
        println!("hostile: FAIL the unmodified MQD is refused before the BAR moves");
        return 1;
    }
    dispatch(&[(12, u64::from(MARK_WG_SIZE) * 64), (56, signal2)]);
    w32(t.ring, u32::from(header(TYPE_KERNEL_DISPATCH)) | 1 << 16);
    w64(t.amd_queue + WRITE_ID, 1);
    // Decoding off and on, then both BARs moved, all while loaded.
    let cmd = cfg_read(0, dev, 0, cfg::COMMAND as u8) & 0xFFFF;
    cfg_write(dev, cfg::COMMAND as u8, 0);
    cfg_write(dev, cfg::COMMAND as u8, cmd);
    cfg_write(dev, cfg::BAR0 as u8, new_bar0 as u32);
    cfg_write(dev, cfg::BAR0 as u8 + 8, new_bar2 as u32);
    let moved = Target {
        regs: new_bar0 + abi::pci::REGS_OFFSET,
        doorbell: new_bar2 + 8 * u64::from(Q),
        ..t
    };
    c.eq(
        "VGPU_ID at the moved BAR0",
        r32(moved.regs + reg::VGPU_ID as u64).into(),
        abi::vgpu::VGPU_ID_VALUE.into(),
    );
    c.eq("still loaded after the moves", moved.active().into(), 1);
    // The old doorbell is gone (an unclaimed write); a 4-byte store to the
    // new one rings (any width matches).
    w64(bar2 + 8 * u64::from(Q), 1);
    w32(moved.doorbell, 1);
    let mut n = 0u32;
    // SAFETY: `signal2` is an amd_signal_t from new_signal.
    while unsafe { Vgpu::signal_value(signal2) } > 0 && moved.error() == 0 && n < 10 * POLLS {
        n += 1;
    }
    c.eq("kernel error after the BAR moves", moved.error().into(), 0);
    // SAFETY: as above.
    let wrong = unsafe { Vgpu::counters_differing(counters, 64, 1) };
    c.eq("kernel counters after the BAR moves", wrong.into(), 0);
    c.eq("unload after the BAR moves", moved.unload().into(), 1);

    // ---- 7. a saved control record altered before the reload ------------
    let Ok(kd_long) = Vgpu::write_kernel_descriptor(
        &mut alloc,
        &KernelDescriptor::new(KernelKind::Mark, 1_000_000_000),
    ) else {
        return 4;
    };
    let Ok(saved) = alloc.alloc(2048, 4096) else {
        return 4;
    };
    let (cwsr, _) = q.cwsr_area();
    if moved.load(&[], None) == 0 {
        dispatch(&[(32, kd_long), (56, 0)]);
        moved.publish(header(TYPE_KERNEL_DISPATCH), 1, 1);
        c.eq("long kernel on an HQD", moved.wait_on_hqd().into(), 1);
        w32(moved.reg(reg::CP_HQD_DEQUEUE_REQUEST), 3);
        c.eq("SAVE dequeue finishes", moved.unload().into(), 1);
        let off = r32(t.mqd + 4 * 174);
        let size = r32(t.mqd + 4 * 175);
        c.eq("a control record was written", (off < size).into(), 1);
        for d in 0..512u64 {
            w32(saved + 4 * d, r32(t.mqd + 4 * d));
        }
        // One byte of the first packet record (its dispatch id) altered.
        let at = cwsr + u64::from(off) + 32;
        let orig = r32(at);
        w32(at, orig ^ 0xFF);
        let e = moved.reload();
        let got = if e != 0 { e } else { moved.wait_error() };
        c.eq("altered record", got.into(), error::BAD_SAVED_STATE.into());
        moved.unload();
        // The unaltered record and MQD resume the saved kernel.
        w32(at, orig);
        for d in 0..512u64 {
            w32(t.mqd + 4 * d, r32(saved + 4 * d));
        }
        c.eq("unaltered record reload", moved.reload().into(), 0);
        c.eq("resumed kernel on an HQD", moved.wait_on_hqd().into(), 1);
        c.eq("resumed kernel error", moved.error().into(), 0);
        w32(moved.reg(reg::CP_HQD_DEQUEUE_REQUEST), 2);
        c.eq("RESET dequeue finishes", moved.unload().into(), 1);
    } else {
        c.eq("fresh load before the save", 1, 0);
    }
    // ---- 8. MSI-X table abuse (every vector masked first) --------------
    let table = new_bar0 + abi::pci::MSIX_TABLE_OFFSET;
    let entry = |v: u64, off: u64| table + 16 * v + off;
    for v in 0..abi::vgpu::NUM_VECTORS as u64 {
        w32(entry(v, 12), 0xFFFF_FFFF);
    }
    c.eq(
        "vector control reads bit 0 only",
        r32(entry(3, 12)).into(),
        1,
    );
    let data = r32(entry(3, 8));
    w16(entry(3, 8), 0xBEEF);
    w8(entry(3, 9), 0xAA);
    c.eq(
        "1- and 2-byte table writes are ignored",
        r32(entry(3, 8)).into(),
        data.into(),
    );
    let hi = r32(entry(3, 4));
    w64(entry(3, 4), u64::MAX);
    c.eq(
        "an unaligned 8-byte table write is ignored",
        r32(entry(3, 4)).into(),
        hi.into(),
    );
    // Garbage messages (non-xAPIC address, INIT delivery mode, vector 2) on
    // masked vectors are stored, never sent.
    for v in 0..abi::vgpu::NUM_VECTORS as u64 {
        w64(entry(v, 0), 0xFFFF_FFFF_DEAD_0000);
        w32(entry(v, 8), 0x0000_0502);
    }
    c.eq(
        "garbage address reads back",
        r32(entry(5, 0)).into(),
        0xDEAD_0000,
    );
    w32(entry(abi::vgpu::NUM_VECTORS as u64, 0), 1);
    c.eq(
        "past the table reads 0",
        r32(entry(abi::vgpu::NUM_VECTORS as u64, 0)).into(),
        0,
    );

    if c.fails == 0 {
        println!("hostile: every attack got the documented answer");
        0
    } else {
        println!("hostile: {} expectations failed", Dec(c.fails.into()));
        1
    }
}

rt::entry!(main);
