//! Exercises the virtual GPU (docs/vgpu-abi.md) through the `rt::gpu` driver:
//! creates `queues` AQL queues, submits `kernels` mark kernels of `wgs`
//! workgroups to each (barrier bit set, so each queue runs them in order),
//! rings every doorbell once, waits (by interrupt: `sti; hlt` until the
//! queue's MSI-X vector or the error vector) for each queue's last
//! completion signal and checks that every workgroup counter of every kernel
//! is exactly 1.
//!
//! Args (`key=value`): `queues=Q` (1, at most `NUM_VHQD`), `kernels=N` (4),
//! `wgs=W` (304), `cost_us=C` (100, per workgroup), `loops=L` (1: repeat the
//! submit/wait/verify cycle on the same queues), `priority=P` (7, 0..15),
//! `verbose=1` (print the device geometry first), and for hostile-input tests
//! `bad=ring` (queue 0's ring is at 0xF000_0000_0000), `bad=kernarg` (queue 0
//! also gets a dispatch whose kernarg is there), `bad=wptr` (queue 0's
//! `write_dispatch_id` is set beyond read index + ring size before ringing),
//! `bad=signal` (queue 0 also gets a dispatch whose completion signal is at
//! 0xFFFF_FFFF_FFFF_FFC0, so signal + 8 and + 16 wrap) and `bad=mailbox`
//! (queue 0 also gets a dispatch whose signal's `event_mailbox_ptr` is
//! 0xFFFF_FFFF_FFFF_FFFC: the 4-byte mailbox write would wrap).
//! `bad=hang` (issue 11): queue 0 also gets, after its mark kernels, a
//! kernel without a CWSR save point (`abi::kernel::flags::NO_SAVE_POINT`)
//! whose workgroups take an hour; after the mark kernels of every queue
//! completed (and were verified) the guest asks for a SAVE dequeue of queue
//! 0, which cannot finish: the host resets the queue after the VM's
//! `preempt_timeout_ms`, `CP_HQD_ERROR` reads 22 and the error vector
//! arrives (the line `gpu: error interrupt` is printed when it does).
//! `bad=stall` (issue 11): after the loops, queue 0 publishes a write index
//! one past its last packet whose slot holds an INVALID header (the packet
//! is never written), rings, and polls `CP_HQD_PQ_RPTR` `hold=H` times
//! (1000; one MMIO exit each, ~10 us here): the read index must not move
//! past the unpublished packet (else `gpu: stall consumed` and exit 1);
//! checkpoint 4 when the polling ends.
//! `bad=dbflood`: after the loops, queue 0's doorbell is rung `hold=H` times
//! with its current (stale) write index, one MMIO poll every 64 rings.
//! `bad=wgflood`: queue 0 also gets, after its mark kernels, one `Spin`
//! kernel of 2^31 workgroups of 1 ns (the host's per-workgroup floor makes
//! it a long kernel) whose completion is waited for with the marks.
//! Modes that expect a queue error poll `CP_HQD_ERROR` up to `hold` times
//! for one that comes after the last completion signal.
//! These three modes expect no queue error: `...: ok` and exit 0 when the
//! host neither consumed the stalled slot nor lost a completion.
//! In `bad=` modes the other queues run normally and are verified too.
//! On wrong counters the line also says `(lost L, dup D)`: counters left at
//! 0 and counters above 1.
//! `die=triple|exit|hang|idle` (issue 11): after ringing the doorbells
//! (checkpoint 2) the guest dies with its GPU work in flight: a triple
//! fault, an exit with status 5 without unloading its queues, a spin until
//! the host stops it, or (`idle`) halts with interrupts on until stopped
//! (no CPU used: an anchor VM that keeps a fleet running).
//! `flood=F` first writes F times to a doorbell that does not exist (BAR2 +
//! 0x800) and F times to a BAR0 offset with no register (0x1800), then runs
//! as usual (the host logs a few lines and counts the rest).
//!
//! Checkpoints: 2 after all packets of a cycle are written, just before the
//! doorbells are rung; 3 after the last wait of the cycle (before verifying);
//! 4 (`bad=stall`) when the stall polling ends.
//!
//! Output: the greeting `hello from NAME (vm ID), args: [ARGS]`, then one
//! line `gpu: Q queues x N kernels x W wgs[ x L loops]: ok` or
//! `...: FAILED: M counters wrong`; on a queue error one line per failed
//! queue `gpu: queue I error CODE` (then `gpu: other K queues: ok|FAILED: ...`
//! if other queues ran). Exit status: 0 ok, 1 wrong counters (or a `bad=`
//! mode that caused no queue error), 2 queue error or failed wait, 3 no vGPU,
//! 4 bad arguments or not enough guest RAM.
#![no_std]
#![no_main]

use abi::kernel::{KernelDescriptor, KernelKind};
use rt::gpu::{Alloc, Error, Queue, Vgpu, WaitResult, MARK_WG_SIZE, MAX_VHQD};
use rt::num::{Dec, Hex};
use rt::{io, print, println, BootInfo};

const EXIT_OK: u32 = 0;
const EXIT_WRONG: u32 = 1;
const EXIT_QUEUE_ERROR: u32 = 2;
const EXIT_NO_DEVICE: u32 = 3;
const EXIT_SETUP: u32 = 4;

/// Outside every VM's RAM (and outside the guest's identity map: never touched).
const BAD_ADDR: u64 = 0xF000_0000_0000;

const CHECKPOINT_SUBMITTED: u32 = 2;
const CHECKPOINT_DONE: u32 = 3;
const CHECKPOINT_STALL_END: u32 = 4;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Bad {
    None,
    Ring,
    Kernarg,
    Wptr,
    Signal,
    Mailbox,
    Hang,
    Stall,
    DbFlood,
    WgFlood,
}

impl Bad {
    /// Modes whose hostile input is legal AQL: no queue error is expected.
    fn expects_error(self) -> bool {
        !matches!(self, Bad::None | Bad::Stall | Bad::DbFlood | Bad::WgFlood)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Die {
    No,
    Triple,
    Exit,
    Spin,
    Idle,
}

/// Exit status of `die=exit`.
const EXIT_DIED: u32 = 5;
/// Workgroup cost of the `bad=hang` kernel: one hour.
const HANG_WG_NS: u64 = 3_600_000_000_000;

/// Workgroups of the `bad=wgflood` kernel (2^31).
const FLOOD_WGS: u32 = 1 << 31;
/// AQL header of an INVALID packet (type 1).
const INVALID_HEADER: u32 = 1;
/// Bytes per AQL packet.
const PACKET_BYTES: u64 = 64;

/// A completion signal address whose fields wrap the address space.
const WRAPPING_SIGNAL: u64 = 0xFFFF_FFFF_FFFF_FFC0;
/// A mailbox address whose 4-byte write wraps the address space.
const WRAPPING_MAILBOX: u64 = 0xFFFF_FFFF_FFFF_FFFC;

struct Args {
    queues: u32,
    kernels: u32,
    wgs: u32,
    cost_ns: u64,
    loops: u32,
    priority: u32,
    verbose: bool,
    bad: Bad,
    flood: u32,
    die: Die,
    hold: u32,
}

/// `key=value` as an integer in `[min, max]`, `default` if absent.
fn num(
    boot: &BootInfo,
    key: &'static str,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, &'static str> {
    match boot.arg(key) {
        None => Ok(default),
        Some(_) => match boot.arg_u64(key) {
            Some(v) if v >= min && v <= max => Ok(v),
            _ => Err(key),
        },
    }
}

impl Args {
    fn parse(boot: &BootInfo) -> Result<Args, &'static str> {
        let bad = match boot.arg("bad") {
            None => Bad::None,
            Some("ring") => Bad::Ring,
            Some("kernarg") => Bad::Kernarg,
            Some("wptr") => Bad::Wptr,
            Some("signal") => Bad::Signal,
            Some("mailbox") => Bad::Mailbox,
            Some("hang") => Bad::Hang,
            Some("stall") => Bad::Stall,
            Some("dbflood") => Bad::DbFlood,
            Some("wgflood") => Bad::WgFlood,
            Some(_) => return Err("bad"),
        };
        let die = match boot.arg("die") {
            None => Die::No,
            Some("triple") => Die::Triple,
            Some("exit") => Die::Exit,
            Some("hang") => Die::Spin,
            Some("idle") => Die::Idle,
            Some(_) => return Err("die"),
        };
        Ok(Args {
            queues: num(boot, "queues", 1, 1, MAX_VHQD as u64)? as u32,
            kernels: num(boot, "kernels", 4, 1, 1 << 16)? as u32,
            wgs: num(boot, "wgs", 304, 1, 1 << 20)? as u32,
            cost_ns: num(boot, "cost_us", 100, 0, 1 << 30)? * 1000,
            loops: num(boot, "loops", 1, 1, 1 << 20)? as u32,
            priority: num(boot, "priority", 7, 0, 15)? as u32,
            verbose: num(boot, "verbose", 0, 0, 1)? == 1,
            bad,
            flood: num(boot, "flood", 0, 0, 1 << 24)? as u32,
            die,
            hold: num(boot, "hold", 1000, 1, 1 << 30)? as u32,
        })
    }
}

/// Outcome counters of the run.
/// Lives in fresh RAM ([`Alloc::zeroed`]).
struct Tally {
    /// Queues that reported a `CP_HQD_ERROR` (at load or later).
    queue_errors: u32,
    /// Waits that timed out or failed otherwise.
    wait_failures: u32,
    /// Counters != 1.
    wrong: u64,
    /// Counters left at 0 (lost effects).
    lost: u64,
    /// Counters above 1 (duplicated effects).
    dup: u64,
    /// `bad=stall`: the read index moved past the unpublished packet.
    stall_consumed: bool,
}

/// Reads `CP_HQD_ERROR` of every live queue; prints, unloads and forgets
/// those in error (which also lets waits on the other queues proceed).
/// Returns how many were found.
fn reap_errors(queues: &mut [Option<Queue>], tally: &mut Tally) -> u32 {
    let mut found = 0;
    for slot in queues.iter_mut() {
        if let Some(q) = slot {
            let code = q.error();
            if code != 0 {
                println!(
                    "gpu: queue {} error {}",
                    Dec(q.index() as u64),
                    Dec(code as u64)
                );
                q.destroy();
                *slot = None;
                found += 1;
            }
        }
    }
    tally.queue_errors += found;
    found
}

fn destroy_all(queues: &mut [Option<Queue>]) {
    for q in queues.iter_mut().flatten() {
        q.destroy();
    }
}

fn main(boot: &'static BootInfo) -> u32 {
    rt::greet(boot);
    let args = match Args::parse(boot) {
        Ok(a) => a,
        Err(key) => {
            println!("gpu: bad argument {key}= in [{}]", boot.args());
            return EXIT_SETUP;
        }
    };
    let mut gpu = match Vgpu::probe_detailed(boot) {
        Ok(g) => g,
        Err(e) => {
            println!("gpu: no vGPU ({e})");
            return EXIT_NO_DEVICE;
        }
    };
    if args.queues > gpu.num_vhqd {
        println!(
            "gpu: queues={} but the vGPU has {} virtual HQDs",
            Dec(args.queues as u64),
            Dec(gpu.num_vhqd as u64)
        );
        return EXIT_SETUP;
    }
    for _ in 0..args.flood {
        // SAFETY: both addresses lie in BARs probe assigned (identity-mapped
        // MMIO hole); the host refuses the writes.
        unsafe {
            core::ptr::write_volatile((gpu.doorbell_base() + 0x800) as *mut u64, 1);
            core::ptr::write_volatile((gpu.regs_base() + 0x1800) as *mut u32, 1);
        }
    }
    let nq = args.queues as usize;
    let n = args.kernels as usize;
    let w = args.wgs;
    // Room for a whole cycle (+1 for the bad=kernarg packet).
    let ring_packets = (args.kernels + 1).next_power_of_two().max(64);

    let mut alloc = Alloc::new(boot);
    let need = gpu.queue_bytes(ring_packets) * args.queues as u64;
    if args.verbose {
        println!(
            "gpu: vGPU at PCI 00:{}.0: {} vhqds, {} xccs x {} cus x {} ses, cwsr {} KiB/queue, need {} MiB of {} MiB free from {}",
            Dec(gpu.pci_device as u64),
            Dec(gpu.num_vhqd as u64),
            Dec(gpu.xccs as u64),
            Dec(gpu.cus_per_xcc as u64),
            Dec(gpu.ses_per_xcc as u64),
            Dec(gpu.cwsr_bytes() >> 10),
            Dec(need >> 20),
            Dec(alloc.remaining() >> 20),
            Hex(alloc.next())
        );
    }
    if need > alloc.remaining() {
        println!(
            "gpu: {} queues need {} MiB of guest RAM (CWSR {} MiB each), {} MiB free",
            Dec(args.queues as u64),
            Dec(need >> 20),
            Dec(gpu.cwsr_bytes() >> 20),
            Dec(alloc.remaining() >> 20)
        );
        return EXIT_SETUP;
    }

    let kd = match Vgpu::write_kernel_descriptor(
        &mut alloc,
        &KernelDescriptor::new(KernelKind::Mark, args.cost_ns),
    ) {
        Ok(a) => a,
        Err(e) => {
            println!("gpu: {e}");
            return EXIT_SETUP;
        }
    };

    // SAFETY: zero is a valid Tally (integers); in RAM, not zeroed on the stack.
    let tally: &mut Tally = match unsafe { alloc.zeroed::<Tally>(1) } {
        Ok(t) => &mut t[0],
        Err(e) => {
            println!("gpu: {}", Error::OutOfMemory(e));
            return EXIT_SETUP;
        }
    };
    let mut queues: [Option<Queue>; MAX_VHQD] = [const { None }; MAX_VHQD];
    for i in 0..args.queues {
        let ring = (args.bad == Bad::Ring && i == 0).then_some(BAD_ADDR);
        match gpu.create_queue_with(&mut alloc, i, ring_packets, args.priority, ring) {
            Ok(q) => queues[i as usize] = Some(q),
            Err(Error::Queue { vhqd, code }) => {
                println!("gpu: queue {} error {}", Dec(vhqd as u64), Dec(code as u64));
                tally.queue_errors += 1;
            }
            Err(e) => {
                println!("gpu: creating queue {}: {e}", Dec(i as u64));
                destroy_all(&mut queues);
                return EXIT_SETUP;
            }
        }
    }

    let mut verified_queues = 0;
    for _ in 0..args.loops {
        match cycle(&gpu, &mut alloc, &mut queues[..nq], kd, n, w, &args, tally) {
            Ok(v) => verified_queues = v,
            Err(e) => {
                println!("gpu: submitting: {e}");
                destroy_all(&mut queues);
                return EXIT_SETUP;
            }
        }
        if tally.queue_errors != 0 || tally.wait_failures != 0 || tally.wrong != 0 {
            break;
        }
    }
    if args.bad == Bad::Hang {
        if let Some(q) = queues[0].as_mut() {
            hang_end(q);
        }
    }
    if failed_so_far(tally) {
        // Nothing more to try.
    } else if args.bad == Bad::Stall {
        if let Some(q) = queues[0].as_mut() {
            stall(q, args.hold, tally);
        }
    } else if args.bad == Bad::DbFlood {
        if let Some(q) = queues[0].as_ref() {
            doorbell_flood(q, args.hold);
        }
    }
    // A late error (after the last signal) still counts. The host checks
    // the doorbell on its own thread: a queue whose packets ran from a map
    // (e.g. an operator's resume) before the hostile doorbell gets its
    // error a little after the last signal. Poll for it (bounded).
    reap_errors(&mut queues[..nq], tally);
    if args.bad.expects_error() && tally.queue_errors == 0 && !failed_so_far(tally) {
        for _ in 0..args.hold {
            if reap_errors(&mut queues[..nq], tally) != 0 {
                break;
            }
        }
    }
    destroy_all(&mut queues);

    let failed = tally.queue_errors != 0 || tally.wait_failures != 0;
    if !failed {
        print!(
            "gpu: {} queues x {} kernels x {} wgs",
            Dec(args.queues as u64),
            Dec(n as u64),
            Dec(w as u64)
        );
        if args.loops > 1 {
            print!(" x {} loops", Dec(args.loops as u64));
        }
        if tally.wrong != 0 {
            print_wrong(tally);
            EXIT_WRONG
        } else if tally.stall_consumed {
            println!(": FAILED: stall consumed");
            EXIT_WRONG
        } else if args.bad.expects_error() {
            println!(": FAILED: bad= input caused no queue error");
            EXIT_WRONG
        } else {
            println!(": ok");
            EXIT_OK
        }
    } else {
        if verified_queues > 0 {
            print!("gpu: other {} queues", Dec(verified_queues as u64));
            if tally.wrong != 0 {
                print_wrong(tally);
            } else {
                println!(": ok");
            }
        }
        if tally.wrong != 0 {
            EXIT_WRONG
        } else {
            EXIT_QUEUE_ERROR
        }
    }
}

/// One submit / ring / wait / verify cycle over the live queues. Returns how
/// many queues were verified.
#[allow(clippy::too_many_arguments)]
fn cycle(
    gpu: &Vgpu,
    alloc: &mut Alloc,
    queues: &mut [Option<Queue>],
    kd: u64,
    n: usize,
    w: u32,
    args: &Args,
    tally: &mut Tally,
) -> Result<u32, Error> {
    let nq = queues.len();
    // Tables in fresh RAM, not on the stack: zeroing stack arrays takes SSE
    // instructions the emulator lacks. Counter addresses [queue][kernel] and
    // the last completion signal of each queue.
    // SAFETY: zero is a valid u64.
    let tab: &mut [u64] = unsafe { alloc.zeroed(nq * n)? };
    // SAFETY: as above.
    let last: &mut [u64] = unsafe { alloc.zeroed(nq)? };

    for (i, slot) in queues.iter_mut().enumerate() {
        let Some(q) = slot else { continue };
        if args.bad == Bad::Ring && i == 0 {
            // The ring is not ours: publish a write index without packets.
            last[i] = Vgpu::new_signal(alloc, 1)?;
            let wi = q.write_index() + 1;
            q.set_write_index(wi);
            continue;
        }
        for (k, t) in tab[i * n..(i + 1) * n].iter_mut().enumerate() {
            let (signal, counters) = q.submit_mark(alloc, kd, w, true)?;
            *t = counters;
            if k + 1 == n {
                last[i] = signal;
            }
        }
        if i == 0 && args.bad == Bad::Kernarg {
            let signal = Vgpu::new_signal(alloc, 1)?;
            q.submit_one_d(kd, BAD_ADDR, MARK_WG_SIZE, w, signal, true)?;
            last[i] = signal;
        }
        if i == 0 && matches!(args.bad, Bad::Signal | Bad::Mailbox) {
            // A valid mark dispatch whose completion signal is hostile; the
            // wait is on a good signal that only the error vector ends.
            let good = Vgpu::new_signal(alloc, 1)?;
            let signal = if args.bad == Bad::Signal {
                WRAPPING_SIGNAL
            } else {
                let s = Vgpu::new_signal(alloc, 1)?;
                // SAFETY: `s` is a fresh signal in RAM from new_signal.
                unsafe {
                    core::ptr::write_volatile(
                        (s + rt::gpu::SIGNAL_EVENT_MAILBOX_PTR) as *mut u64,
                        WRAPPING_MAILBOX,
                    )
                };
                s
            };
            let kernarg = alloc.alloc(64, 64)?;
            let counters = alloc.alloc(4 * w as u64, 64)?;
            // SAFETY: fresh RAM from the allocator (Kernarg::Mark layout).
            unsafe {
                core::ptr::write_volatile(kernarg as *mut u64, counters);
                core::ptr::write_volatile((kernarg + 8) as *mut u32, w);
            }
            q.submit_one_d(kd, kernarg, MARK_WG_SIZE, w, signal, true)?;
            last[i] = good;
        }
        if i == 0 && args.bad == Bad::Hang {
            // After the mark kernels (barrier bit): a kernel whose waves
            // never reach a save point, and take an hour each.
            let hung = Vgpu::write_kernel_descriptor(
                alloc,
                &KernelDescriptor::new(KernelKind::Mark, HANG_WG_NS)
                    .with_flags(abi::kernel::flags::NO_SAVE_POINT),
            )?;
            let signal = Vgpu::new_signal(alloc, 1)?;
            let kernarg = alloc.alloc(64, 64)?;
            let counters = alloc.alloc(4 * w as u64, 64)?;
            // SAFETY: fresh RAM from the allocator (Kernarg::Mark layout).
            unsafe {
                core::ptr::write_volatile(kernarg as *mut u64, counters);
                core::ptr::write_volatile((kernarg + 8) as *mut u32, w);
            }
            q.submit_one_d(hung, kernarg, MARK_WG_SIZE, w, signal, true)?;
        }
        if i == 0 && args.bad == Bad::WgFlood {
            // After the marks (barrier bit): 2^31 one-ns workgroups, waited
            // for as the queue's last completion.
            let spin =
                Vgpu::write_kernel_descriptor(alloc, &KernelDescriptor::new(KernelKind::Spin, 1))?;
            let signal = Vgpu::new_signal(alloc, 1)?;
            let kernarg = alloc.alloc(64, 64)?;
            // SAFETY: fresh RAM from the allocator (Kernarg::Spin: ns u64 @0,
            // 0 = the descriptor's cost).
            unsafe { core::ptr::write_volatile(kernarg as *mut u64, 0) };
            q.submit_one_d(spin, kernarg, 1, FLOOD_WGS, signal, true)?;
            last[i] = signal;
        }
        if i == 0 && args.bad == Bad::Wptr {
            // From the write index, not the read index: the host may
            // already have consumed published packets (so a read index read
            // here can be stale), and no read index exceeds the write index.
            let beyond = q.write_index() + q.ring_packets() as u64 + 1;
            q.set_write_index(beyond);
        }
    }

    io::checkpoint(CHECKPOINT_SUBMITTED);
    for q in queues.iter().flatten() {
        q.ring();
    }
    die(args.die);

    let mut unverified: u64 = 0; // bit i: queue i not verified
    for i in 0..nq {
        // Each retry follows the unloading of at least one failed queue.
        let mut done = false;
        for _ in 0..=nq {
            if queues[i].is_none() {
                done = true; // failed and reaped: not verified
                break;
            }
            // SAFETY: `last[i]` is a signal this cycle allocated.
            match unsafe { gpu.wait(i as u32, last[i]) } {
                WaitResult::Done => {
                    done = true;
                    break;
                }
                WaitResult::QueueError => {
                    println!("gpu: error interrupt");
                    if reap_errors(queues, tally) == 0 {
                        println!(
                            "gpu: queue {} wait: queue error reported, none of the live queues has one",
                            Dec(i as u64)
                        );
                        // Diagnostics: a vHQD that is not (or no longer) ours.
                        for j in 0..gpu.num_vhqd {
                            let code = gpu.hqd_error(j);
                            if code != 0 {
                                println!(
                                    "gpu: vHQD {} still reports error {}",
                                    Dec(j as u64),
                                    Dec(code as u64)
                                );
                            }
                        }
                        break;
                    }
                }
            }
        }
        if !done {
            tally.wait_failures += 1;
            unverified |= 1 << i;
        }
    }
    io::checkpoint(CHECKPOINT_DONE);

    let mut verified = 0;
    for (i, slot) in queues.iter().enumerate() {
        if slot.is_none() || unverified & (1 << i) != 0 {
            continue;
        }
        for &counters in &tab[i * n..(i + 1) * n] {
            // SAFETY: `counters` holds `w` u32 counters from `submit_mark`.
            let wrong = unsafe { Vgpu::counters_differing(counters, w, 1) } as u64;
            if wrong != 0 {
                tally.wrong += wrong;
                for k in 0..w as u64 {
                    // SAFETY: as above, k < w.
                    let c = unsafe { core::ptr::read_volatile((counters + 4 * k) as *const u32) };
                    if c == 0 {
                        tally.lost += 1;
                    } else if c > 1 {
                        tally.dup += 1;
                    }
                }
            }
        }
        verified += 1;
    }
    Ok(verified)
}

/// `bad=hang`: asks for a SAVE dequeue of the hung queue and waits until
/// the host ends it (by a reset after the preemption timeout), then for the
/// error vector; prints `gpu: error interrupt` when it arrives.
fn hang_end(q: &Queue) {
    q.request_dequeue(abi::vgpu::dequeue::SAVE);
    while q.active() {
        rt::irq::halt();
    }
    let err = 1u64 << rt::gpu::ERROR_VECTOR;
    while rt::irq::take(err) == 0 {
        rt::irq::halt();
    }
    println!("gpu: error interrupt");
}

/// Any failure recorded so far?
fn failed_so_far(tally: &Tally) -> bool {
    tally.queue_errors != 0 || tally.wait_failures != 0 || tally.wrong != 0
}

/// Ends a verification line with the wrong-counter figures.
fn print_wrong(tally: &Tally) {
    println!(
        ": FAILED: {} counters wrong (lost {}, dup {})",
        Dec(tally.wrong),
        Dec(tally.lost),
        Dec(tally.dup)
    );
}

/// `bad=stall`: publishes a write index one past the last packet, whose
/// slot holds an INVALID header, rings, and polls the read index `hold`
/// times; it must never pass the unpublished packet.
fn stall(q: &mut Queue, hold: u32, tally: &mut Tally) {
    let wi = q.write_index();
    let slot = q.ring_addr() + (wi & (q.ring_packets() as u64 - 1)) * PACKET_BYTES;
    // SAFETY: `slot` is a slot of the queue's own ring (guest RAM).
    unsafe { core::ptr::write_volatile(slot as *mut u32, INVALID_HEADER) };
    q.set_write_index(wi + 1);
    q.ring();
    for _ in 0..hold {
        if q.rptr_reg() as u64 > (wi & 0xFFFF_FFFF) || q.error() != 0 {
            break;
        }
    }
    io::checkpoint(CHECKPOINT_STALL_END);
    let rptr = q.rptr_reg() as u64;
    if rptr > (wi & 0xFFFF_FFFF) {
        println!(
            "gpu: stall consumed: read index {} > {}",
            Dec(rptr),
            Dec(wi)
        );
        tally.stall_consumed = true;
    }
}

/// `bad=dbflood`: rings the queue's doorbell `hold` times with its current
/// write index (nothing new), polling the read index every 64 rings.
fn doorbell_flood(q: &Queue, hold: u32) {
    for i in 0..hold {
        q.ring();
        if i % 64 == 63 {
            let _ = q.rptr_reg();
        }
    }
}

/// `die=`: ends the guest with its GPU work in flight.
fn die(how: Die) {
    match how {
        Die::No => {}
        Die::Triple => {
            println!("gpu: dying (triple fault)");
            let idt = [0u16; 5]; // limit 0, base 0: every vector faults
                                 // SAFETY: deliberately faults; the VMM reports a triple fault.
            unsafe {
                core::arch::asm!("lidt [{0}]", "ud2", in(reg) idt.as_ptr(), options(noreturn));
            }
        }
        Die::Exit => {
            println!("gpu: dying (exit without unloading)");
            io::exit(EXIT_DIED);
        }
        Die::Spin => {
            println!("gpu: dying (spinning until stopped)");
            loop {
                core::hint::spin_loop();
            }
        }
        Die::Idle => {
            println!("gpu: idling until stopped");
            loop {
                rt::irq::halt();
            }
        }
    }
}

rt::entry!(main);
