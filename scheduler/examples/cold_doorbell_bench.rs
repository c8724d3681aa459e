//! Cost of the scheduler's decision for a high-priority doorbell that
//! preempts lower-priority work, with a cold cache (the arbiter's service
//! thread sleeps between doorbells, so its data and code have left the
//! caches when the doorbell comes) and, for comparison, warm.
//!
//! Set-up per run: MI300X SPX (24 user HQD slots), `vMQDs - 1` queues of
//! priority-2 VMs (16 queues per VM) that always have work, and one queue of
//! a priority-12 VM. One sample: the high-priority queue is idle and unmapped,
//! the low-priority queues hold the slots; the caches are evicted (a 32 MiB
//! buffer is written and read, the timed thread sleeps `SLEEP_US`); then
//! `Scheduler::handle(Event::Doorbell)` for the high-priority queue plus
//! draining its actions is timed. A sample counts when it issues an unmap (the
//! preemption; doorbells that do not preempt, when aging boosted a waiting
//! low-priority queue above it, are not counted: `n`). Between samples an untimed backend model answers the actions
//! (unmaps finish, the high-priority job runs 200 us and goes idle, its slot
//! is given back, the low-priority queues are mapped again).
//!
//! `cargo run --release -p hqdmux-scheduler --example cold_doorbell_bench [SAMPLES=2000] [SLEEP_US=0] [EVICT_MIB=32]`
//!
//! `EVICT_MIB=0` with `SLEEP_US=1000`: cold by sleeping only, as the
//! arbiter's service thread is between doorbells.
//!
//! The doorbell is handled as the binding does (`Scheduler::handle_split`,
//! then `resume`): the table times the whole decision, a second table the
//! part up to the preemptions' unmaps being queued (what the backend waits
//! for).
//!
//! Prints p50/p90/p99 (ns) per vMQD count, cold and warm; then the same for
//! a doorbell that moves the write index of a running low-priority queue
//! (no state change, no action).

use scheduler::*;
use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

fn slots() -> Vec<SlotDesc> {
    let mut v = Vec::new();
    for pipe in 0..4 {
        for queue in 2..8 {
            v.push(SlotDesc {
                partition: 0,
                pipe,
                queue,
            });
        }
    }
    v
}

/// The high-priority queue.
const HIGH: QueueId = QueueId(1 << 40);

/// Untimed backend model: answers actions until the high-priority queue is
/// idle and unmapped again and nothing is pending.
struct Model {
    now: Nanos,
    timer: Option<Nanos>,
    /// (when, event) answers of the model, in time order of insertion.
    due: VecDeque<(Nanos, Event)>,
    wptr: u64,
}

impl Model {
    fn absorb(&mut self, s: &mut Scheduler, acts: &mut Vec<Action>) -> usize {
        let mut unmaps = 0;
        for a in acts.drain(..) {
            match a {
                Action::Map { queue, .. } => {
                    if queue == HIGH {
                        // The high-priority job: 200 us, then idle.
                        self.due.push_back((
                            self.now + 200_000,
                            Event::QueueIdle {
                                queue,
                                now: self.now + 200_000,
                            },
                        ));
                    }
                }
                Action::Unmap { queue, .. } => {
                    unmaps += 1;
                    let at = self.now + 20_000;
                    self.due.push_back((
                        at,
                        Event::Unmapped {
                            queue,
                            has_work: queue != HIGH,
                            save_ns: 20_000,
                            now: at,
                        },
                    ));
                }
                Action::ArmTimer { at } => self.timer = Some(at),
            }
        }
        let _ = s;
        unmaps
    }

    /// Runs the model until the high-priority queue is back to idle and no
    /// answer is pending (then waits out the low VMs' minimum run).
    fn settle(&mut self, s: &mut Scheduler, acts: &mut Vec<Action>) {
        for _ in 0..100_000 {
            let next_due = self.due.iter().map(|d| d.0).min();
            let ev = match (next_due, self.timer) {
                (Some(d), t) if t.is_none_or(|t| d <= t) => {
                    let i = self.due.iter().position(|e| e.0 == d).unwrap();
                    let (at, ev) = self.due.remove(i).unwrap();
                    self.now = self.now.max(at);
                    ev
                }
                (_, Some(t)) => {
                    self.timer = None;
                    self.now = self.now.max(t);
                    Event::Tick { now: self.now }
                }
                (None, None) => break,
                _ => unreachable!(),
            };
            s.handle(ev);
            while let Some(a) = s.poll_action() {
                acts.push(a);
            }
            self.absorb(s, acts);
            let idle = matches!(s.queue_state(HIGH), Some((QueueState::Idle, None)));
            if idle && self.due.is_empty() {
                break;
            }
        }
        // Past every minimum run and anticipation grace.
        self.now += 5_000_000;
        self.timer = None;
        s.handle(Event::Tick { now: self.now });
        while let Some(a) = s.poll_action() {
            acts.push(a);
        }
        self.absorb(s, acts);
    }
}

fn evict(buf: &mut [u64]) -> u64 {
    let mut sum = 0u64;
    for (i, x) in buf.iter_mut().enumerate().step_by(8) {
        *x = x.wrapping_add(i as u64);
    }
    for x in buf.iter().step_by(8) {
        sum = sum.wrapping_add(*x);
    }
    sum
}

fn run(nq: u64, samples: usize, cold: bool, mode: Mode, sleep: Duration, buf: &mut [u64]) -> Stats {
    let mut s = Scheduler::new(SchedConfig::default(), slots()).unwrap();
    let low = nq - 1;
    let per_vm = 16.min(low.max(1));
    for vm in 0..low.div_ceil(per_vm) {
        s.add_vm(
            VmId(vm as u32),
            VmParams {
                priority: 2,
                weight: 1,
                partition: None,
            },
        )
        .unwrap();
        for q in 0..per_vm {
            let id = vm * per_vm + q;
            if id < low {
                s.add_queue(VmId(vm as u32), QueueId(id), 0).unwrap();
            }
        }
    }
    let hv = VmId(1_000_000);
    s.add_vm(
        hv,
        VmParams {
            priority: 12,
            weight: 1,
            partition: None,
        },
    )
    .unwrap();
    s.add_queue(hv, HIGH, 0).unwrap();
    let mut m = Model {
        now: 1_000,
        timer: None,
        due: VecDeque::new(),
        wptr: 0,
    };
    let mut acts = Vec::new();
    // Every low queue has work.
    for q in 0..low {
        m.now += 1;
        s.handle(Event::Doorbell {
            queue: QueueId(q),
            wptr: 1,
            now: m.now,
        });
        while let Some(a) = s.poll_action() {
            acts.push(a);
        }
        m.absorb(&mut s, &mut acts);
    }
    m.settle(&mut s, &mut acts);
    let mut cost = Vec::with_capacity(samples);
    let mut to_unmaps = Vec::with_capacity(samples);
    let mut sink = 0u64;
    for _ in 0..samples {
        if cold {
            sink = sink.wrapping_add(evict(buf));
            if !sleep.is_zero() {
                std::thread::sleep(sleep);
            }
        }
        if mode == Mode::Floor {
            // The measurement's own cold cost: the clock reads around one
            // scheduler call that touches little (its counters).
            let t0 = Instant::now();
            black_box(s.stats());
            cost.push(t0.elapsed().as_nanos() as u64);
            continue;
        }
        if mode == Mode::Mapped {
            // A doorbell that moves the write index of a queue that runs:
            // no state change, no action expected.
            let q = s.slot_owner(SlotId(0)).expect("slot 0 held");
            m.wptr += 1;
            let ev = Event::Doorbell {
                queue: q,
                wptr: 1 + m.wptr,
                now: m.now,
            };
            let t0 = Instant::now();
            s.handle(ev);
            while let Some(a) = s.poll_action() {
                acts.push(a);
            }
            cost.push(t0.elapsed().as_nanos() as u64);
            m.absorb(&mut s, &mut acts);
            continue;
        }
        m.wptr += 1;
        let ev = Event::Doorbell {
            queue: HIGH,
            wptr: m.wptr,
            now: m.now,
        };
        let t0 = Instant::now();
        // As the binding does: a split decision hands out its unmaps first.
        let split = s.handle_split(ev);
        while let Some(a) = s.poll_action() {
            acts.push(a);
        }
        let first = t0.elapsed().as_nanos() as u64;
        if split {
            s.resume();
            while let Some(a) = s.poll_action() {
                acts.push(a);
            }
        }
        let ns = t0.elapsed().as_nanos() as u64;
        // Only doorbells that preempted count (with many low queues
        // waiting, aging sometimes boosts one above the high VM's level).
        if m.absorb(&mut s, &mut acts) > 0 {
            cost.push(ns);
            to_unmaps.push(first);
        }
        m.settle(&mut s, &mut acts);
    }
    black_box(sink);
    assert!(!cost.is_empty(), "no high-priority doorbell preempted");
    cost.sort_unstable();
    to_unmaps.sort_unstable();
    let pct = |v: &[u64], q: f64| {
        v.get(((q * v.len() as f64) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    Stats {
        p50: pct(&cost, 0.5),
        p90: pct(&cost, 0.9),
        p99: pct(&cost, 0.99),
        n: cost.len(),
        unmaps: [
            pct(&to_unmaps, 0.5),
            pct(&to_unmaps, 0.9),
            pct(&to_unmaps, 0.99),
        ],
    }
}

/// What one sample times.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The high-priority doorbell that preempts.
    Preempt,
    /// A doorbell on a running low-priority queue (no state change).
    Mapped,
    /// Only the clock reads.
    Floor,
}

/// Percentiles (ns) of the preempting doorbells, and their count.
struct Stats {
    p50: u64,
    p90: u64,
    p99: u64,
    n: usize,
    /// p50/p90/p99 to the preemptions' unmaps being queued (the split
    /// decision's first half; 0 outside `Mode::Preempt`).
    unmaps: [u64; 3],
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let samples = args.first().copied().unwrap_or(2000) as usize;
    let sleep = Duration::from_micros(args.get(1).copied().unwrap_or(0));
    let mib = args.get(2).copied().unwrap_or(32) as usize;
    let mut buf = vec![1u64; mib << 20 >> 3];
    println!(
        "high-priority doorbell -> preemption decided (Scheduler::handle + actions), ns, {samples} samples, cold = {mib} MiB evicted{}",
        if sleep.is_zero() {
            String::new()
        } else {
            format!(" + {} us sleep", sleep.as_micros())
        }
    );
    println!(
        "{:>6} {:>9} {:>9} {:>9} {:>6}   {:>9} {:>9} {:>9}",
        "vMQDs", "cold p50", "cold p90", "cold p99", "n", "warm p50", "warm p90", "warm p99"
    );
    let f = run(4, samples, true, Mode::Floor, sleep, &mut buf);
    println!(
        "{:>6} {:>9} {:>9} {:>9} {:>6}   (clock reads around a call that touches only the counters)",
        "floor", f.p50, f.p90, f.p99, f.n
    );
    let mut split = Vec::new();
    for nq in [4, 64, 1024] {
        let c = run(nq, samples, true, Mode::Preempt, sleep, &mut buf);
        let w = run(nq, samples, false, Mode::Preempt, sleep, &mut buf);
        println!(
            "{nq:>6} {:>9} {:>9} {:>9} {:>6}   {:>9} {:>9} {:>9}",
            c.p50, c.p90, c.p99, c.n, w.p50, w.p90, w.p99
        );
        split.push((nq, c.unmaps, w.unmaps));
    }
    println!("same doorbells, to the preemptions' unmaps queued (first half of the split decision, Scheduler::handle_split)");
    for (nq, c, w) in split {
        println!(
            "{nq:>6} {:>9} {:>9} {:>9} {:>6}   {:>9} {:>9} {:>9}",
            c[0], c[1], c[2], "", w[0], w[1], w[2]
        );
    }
    println!("doorbell on a running queue (write index moves, no state change)");
    for nq in [4, 64, 1024] {
        let c = run(nq, samples, true, Mode::Mapped, sleep, &mut buf);
        let w = run(nq, samples, false, Mode::Mapped, sleep, &mut buf);
        println!(
            "{nq:>6} {:>9} {:>9} {:>9} {:>6}   {:>9} {:>9} {:>9}",
            c.p50, c.p90, c.p99, c.n, w.p50, w.p90, w.p99
        );
    }
}
