//! Decision cost of the scheduler per event at 16, 256, 1024 and 4096 vMQDs
//! on MI300X SPX (24 user HQD slots), under a random mix of doorbells, idle
//! queues, finished dequeues and timer ticks. Every doorbell moves its
//! queue's write pointer; after each one the same doorbell is repeated
//! (unchanged write pointer) and timed separately (`stale` column).
//!
//! `cargo run --release -p hqdmux-scheduler --example decision_bench [EVENTS] [--no-aging] [--no-spatial] [--cpu-clock] [--policy NAME] [--vmqds N]`
//!
//! Spatial sharing is on (CU geometry of MI300X SPX, a random dispatch
//! width of 1..400 workgroups noted before every doorbell, CU-set changes
//! drained with the actions); `--no-spatial` runs without a CU geometry.
//!
//! `--cpu-clock` times each event by the bench thread's own CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`, less the median cost of reading that clock
//! twice) instead of the wall clock: time the thread spends descheduled
//! on a loaded machine is then not counted, so the tail measures the
//! decision, not the machine's load (host steal time under a hypervisor
//! still counts). `--policy NAME` and `--vmqds N` run one row.
//!
//! `--no-aging` sets `aging_ns` to 10^15 ns (aging never fires in the run),
//! to separate the cost of aging boosts from the rest.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use scheduler::event_mix::{add_fleet, spx_slots, Draw, EventMix};
use scheduler::*;
use std::time::Instant;

/// `rand`'s fast generator as the event mix's source.
struct Fast(SmallRng);

impl Draw for Fast {
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        self.0.gen_range(lo..hi.max(lo + 1))
    }
    fn coin(&mut self) -> bool {
        self.0.gen_bool(0.5)
    }
}

/// Costs of one run (ns).
struct Costs {
    /// (p50, p99, p99.9, mean) of the mix.
    all: (u64, u64, u64, f64),
    /// (p50, p99) of the repeated (stale) doorbells.
    stale: (u64, u64),
    /// (p99, p99.9) per event kind: doorbell, queue idle, unmapped, tick.
    kinds: [(u64, u64); 4],
}

fn bench(policy: Policy, nq: u64, events: usize, aging: bool) -> Costs {
    let mut s = Scheduler::new(
        SchedConfig {
            policy,
            aging_ns: if aging {
                SchedConfig::default().aging_ns
            } else {
                1_000_000_000_000_000
            },
            ..Default::default()
        },
        spx_slots(),
    )
    .unwrap();
    // MI300X SPX geometry, as the GPU binding sets it: spatial sharing on.
    if SPATIAL.load(std::sync::atomic::Ordering::Relaxed) {
        s.set_cu_geometry(38, 8);
    }
    add_fleet(&mut s, nq, |vm| VmParams {
        priority: (vm % 16) as u8,
        weight: 1 + vm % 3,
        partition: None,
    });
    let mut rng = Fast(SmallRng::seed_from_u64(nq));
    let mut mix = EventMix::new(nq);
    let mut cost = Vec::with_capacity(events);
    let mut stale = Vec::new();
    let mut kinds: [Vec<u64>; 4] = Default::default();
    let mut acts = Vec::new();
    for _ in 0..events {
        let ev = mix.next_event(&mut rng);
        let width = rng.0.gen_range(1..=400u64);
        let t0 = Clock::start();
        if let Event::Doorbell { queue, .. } = ev {
            // The binding notes the dispatch width before the doorbell.
            s.note_dispatch_width(queue, width);
        }
        let kind = match ev {
            Event::Doorbell { .. } => 0,
            Event::QueueIdle { .. } => 1,
            Event::Unmapped { .. } => 2,
            _ => 3,
        };
        match kind {
            0 => on_doorbell(&mut s, ev, &mut acts),
            1 => on_idle(&mut s, ev, &mut acts),
            2 => on_unmapped(&mut s, ev, &mut acts),
            _ => on_tick(&mut s, ev, &mut acts),
        }
        let ns = t0.elapsed_ns();
        cost.push(ns);
        kinds[kind].push(ns);
        if let Event::Doorbell { .. } = ev {
            let t0 = Clock::start();
            s.handle(ev);
            let none = s.poll_action().is_none();
            stale.push(t0.elapsed_ns());
            assert!(
                none,
                "a doorbell that does not move the wptr decides nothing"
            );
        }
        for a in acts.drain(..) {
            mix.note_action(&a);
        }
    }
    cost.sort_unstable();
    stale.sort_unstable();
    let pct = |v: &[u64], q: f64| {
        if v.is_empty() {
            return 0;
        }
        v[((q * v.len() as f64) as usize).min(v.len() - 1)]
    };
    let mean = cost.iter().sum::<u64>() as f64 / cost.len() as f64;
    Costs {
        all: (pct(&cost, 0.5), pct(&cost, 0.99), pct(&cost, 0.999), mean),
        stale: (pct(&stale, 0.5), pct(&stale, 0.99)),
        kinds: kinds.map(|mut k| {
            k.sort_unstable();
            (pct(&k, 0.99), pct(&k, 0.999))
        }),
    }
}

/// Handles one event and drains its actions and CU-set changes (the
/// timed work).
fn handle(s: &mut Scheduler, ev: Event, acts: &mut Vec<Action>) {
    s.handle(ev);
    while let Some(a) = s.poll_action() {
        acts.push(a);
    }
    while s.poll_cu_change().is_some() {}
}

// One function per event kind, never inlined (and not folded: each body
// differs), so that an instruction profile (`valgrind --tool=callgrind`)
// gives each kind's cost as the inclusive cost of its function.

/// [`handle`] of a doorbell.
#[inline(never)]
fn on_doorbell(s: &mut Scheduler, ev: Event, acts: &mut Vec<Action>) {
    // Distinct bodies: the linker may not fold the four into one.
    std::hint::black_box(0);
    handle(s, ev, acts)
}

/// [`handle`] of a queue going idle.
#[inline(never)]
fn on_idle(s: &mut Scheduler, ev: Event, acts: &mut Vec<Action>) {
    // Distinct bodies: the linker may not fold the four into one.
    std::hint::black_box(1);
    handle(s, ev, acts)
}

/// [`handle`] of a finished dequeue.
#[inline(never)]
fn on_unmapped(s: &mut Scheduler, ev: Event, acts: &mut Vec<Action>) {
    // Distinct bodies: the linker may not fold the four into one.
    std::hint::black_box(2);
    handle(s, ev, acts)
}

/// [`handle`] of a timer tick.
#[inline(never)]
fn on_tick(s: &mut Scheduler, ev: Event, acts: &mut Vec<Action>) {
    // Distinct bodies: the linker may not fold the four into one.
    std::hint::black_box(3);
    handle(s, ev, acts)
}

/// The start of one timed event: the wall clock, or with `--cpu-clock`
/// the thread's CPU time.
enum Clock {
    Wall(Instant),
    Cpu(u64),
}

impl Clock {
    fn start() -> Clock {
        if CPU_CLOCK.load(std::sync::atomic::Ordering::Relaxed) {
            Clock::Cpu(thread_cpu_ns())
        } else {
            Clock::Wall(Instant::now())
        }
    }
    /// Nanoseconds since `start` (CPU time less the clock's own read cost).
    fn elapsed_ns(&self) -> u64 {
        match self {
            Clock::Wall(t) => t.elapsed().as_nanos() as u64,
            Clock::Cpu(t0) => thread_cpu_ns()
                .saturating_sub(*t0)
                .saturating_sub(CPU_CLOCK_COST.load(std::sync::atomic::Ordering::Relaxed)),
        }
    }
}

/// The calling thread's CPU time (ns).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a
    // constant Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The median of 10001 back-to-back reads of the thread CPU clock (ns):
/// what [`Clock::elapsed_ns`] subtracts.
fn cpu_clock_cost() -> u64 {
    let mut v: Vec<u64> = (0..10_001)
        .map(|_| {
            let a = thread_cpu_ns();
            thread_cpu_ns() - a
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2]
}

/// `--cpu-clock` sets it.
static CPU_CLOCK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// [`cpu_clock_cost`], measured once at start with `--cpu-clock`.
static CPU_CLOCK_COST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `--no-spatial` clears it.
static SPATIAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--no-spatial") {
        SPATIAL.store(false, std::sync::atomic::Ordering::Relaxed);
    }
    let aging = !args.iter().any(|a| a == "--no-aging");
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let only_policy = value("--policy");
    let only_vmqds: Option<u64> = value("--vmqds").map(|v| v.parse().expect("--vmqds N"));
    let events: usize = args
        .iter()
        .enumerate()
        .filter(|(i, _)| *i == 0 || !matches!(args[i - 1].as_str(), "--policy" | "--vmqds"))
        .find_map(|(_, a)| a.parse().ok())
        .unwrap_or(200_000);
    if args.iter().any(|a| a == "--cpu-clock") {
        CPU_CLOCK.store(true, std::sync::atomic::Ordering::Relaxed);
        CPU_CLOCK_COST.store(cpu_clock_cost(), std::sync::atomic::Ordering::Relaxed);
    }
    println!(
        "scheduler decision cost per event (ns), {events} events, 24 HQD slots{}{}",
        if aging { "" } else { ", aging off" },
        if CPU_CLOCK.load(std::sync::atomic::Ordering::Relaxed) {
            format!(
                ", thread CPU time (clock read cost {} ns subtracted)",
                CPU_CLOCK_COST.load(std::sync::atomic::Ordering::Relaxed)
            )
        } else {
            String::new()
        }
    );
    println!(
        "{:<10} {:>6} {:>8} {:>8} {:>8} {:>8}   {:>9} {:>9}",
        "policy", "vMQDs", "p50", "p99", "p99.9", "mean", "stale p50", "stale p99"
    );
    let mut by_kind = Vec::new();
    for policy in [Policy::Hqdmux, Policy::Fifo, Policy::Timeslice] {
        for nq in [16, 256, 1024, 4096] {
            if only_policy.as_deref().is_some_and(|p| p != policy.name())
                || only_vmqds.is_some_and(|n| n != nq)
            {
                continue;
            }
            let c = bench(policy, nq, events, aging);
            let (p50, p99, p999, mean) = c.all;
            println!(
                "{:<10} {:>6} {:>8} {:>8} {:>8} {:>8.0}   {:>9} {:>9}",
                policy.name(),
                nq,
                p50,
                p99,
                p999,
                mean,
                c.stale.0,
                c.stale.1
            );
            if policy == Policy::Hqdmux {
                by_kind.push((nq, c.kinds));
            }
        }
    }
    println!("\nhqdmux p99 / p99.9 per event kind (ns)");
    println!(
        "{:>6} {:>15} {:>15} {:>15} {:>15}",
        "vMQDs", "doorbell", "idle", "unmapped", "tick"
    );
    for (nq, k) in by_kind {
        let cell = |(a, b): (u64, u64)| format!("{a} / {b}");
        println!(
            "{:>6} {:>15} {:>15} {:>15} {:>15}",
            nq,
            cell(k[0]),
            cell(k[1]),
            cell(k[2]),
            cell(k[3])
        );
    }
}
