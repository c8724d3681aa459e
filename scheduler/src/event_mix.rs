//! A random fleet and event stream for measuring and checking decisions
//! without a GPU: the MI300X SPX slot table, fleets of VMs with 16 queues
//! each, and a mix of doorbells, idle queues, finished dequeues and timer
//! ticks that follows the scheduler's own actions (a queue it maps can go
//! idle, a queue it unmaps finishes its dequeue, its timer fires).
//!
//! `examples/decision_bench.rs` times this stream; property tests drive
//! it through debug assertions and [`Scheduler::check_invariants`]. The
//! randomness is the caller's ([`Draw`]), so a test can use a seeded
//! generator of its own and a benchmark a fast one.

use crate::{Action, Event, Nanos, QueueId, Scheduler, SlotDesc, VmId, VmParams};

/// The caller's source of random numbers.
pub trait Draw {
    /// A number in `lo..hi` (`lo` when the range is empty).
    fn range(&mut self, lo: u64, hi: u64) -> u64;
    /// A fair coin.
    fn coin(&mut self) -> bool;
}

/// Queues per VM in a [`add_fleet`] fleet (fewer when the fleet is smaller).
pub const QUEUES_PER_VM: u64 = 16;

/// The user HQD slots of an MI300X in SPX mode: 4 pipes x 6 queues
/// (queues 0 and 1 of each pipe are the kernel driver's).
pub fn spx_slots() -> Vec<SlotDesc> {
    (0..4)
        .flat_map(|pipe| {
            (2..8).map(move |queue| SlotDesc {
                partition: 0,
                pipe,
                queue,
            })
        })
        .collect()
}

/// Adds `nq` queues `0..nq` in VMs of [`QUEUES_PER_VM`] queues (VM ids from
/// 0, the last VM possibly smaller), each VM's parameters from `params`
/// (called once per VM, in order); queue `q` of a VM has priority `q % 4`.
pub fn add_fleet(s: &mut Scheduler, nq: u64, mut params: impl FnMut(u32) -> VmParams) {
    let per_vm = QUEUES_PER_VM.min(nq).max(1);
    for vm in 0..nq.div_ceil(per_vm) {
        let id = VmId(vm as u32);
        s.add_vm(id, params(id.0)).expect("a fresh VM id");
        for q in 0..per_vm {
            let queue = vm * per_vm + q;
            if queue < nq {
                s.add_queue(id, QueueId(queue), (q % 4) as u8)
                    .expect("a fresh queue id");
            }
        }
    }
}

/// The stream's view of the scheduler: which queues it mapped, which it is
/// unmapping, its armed timer, the clock and each queue's write pointer.
#[derive(Debug, Clone)]
pub struct EventMix {
    mapped: Vec<QueueId>,
    unmapping: Vec<QueueId>,
    timer: Option<Nanos>,
    now: Nanos,
    wptr: Vec<u64>,
}

impl EventMix {
    /// A stream over queues `0..nq` at time 0, nothing mapped.
    pub fn new(nq: u64) -> EventMix {
        EventMix {
            mapped: Vec::new(),
            unmapping: Vec::new(),
            timer: None,
            now: 0,
            wptr: vec![0; nq as usize],
        }
    }

    /// The next event, 1-20 us after the last: the timer's tick once it is
    /// due; else a finished dequeue of an unmapping queue (30%, with work
    /// left or not), a mapped queue going idle (25%), or a doorbell that
    /// moves a random queue's write pointer.
    pub fn next_event(&mut self, d: &mut impl Draw) -> Event {
        self.now += d.range(1_000, 20_000);
        let now = self.now;
        let r = d.range(0, 100);
        if self.timer.is_some_and(|t| t <= now) {
            self.timer = None;
            Event::Tick { now }
        } else if !self.unmapping.is_empty() && r < 30 {
            let i = d.range(0, self.unmapping.len() as u64) as usize;
            let queue = self.unmapping.swap_remove(i);
            self.mapped.retain(|m| *m != queue);
            Event::Unmapped {
                queue,
                has_work: d.coin(),
                save_ns: 100_000,
                now,
            }
        } else if !self.mapped.is_empty() && r < 55 {
            let queue = self.mapped[d.range(0, self.mapped.len() as u64) as usize];
            Event::QueueIdle { queue, now }
        } else {
            let q = d.range(0, self.wptr.len() as u64);
            self.wptr[q as usize] += 1;
            Event::Doorbell {
                queue: QueueId(q),
                wptr: self.wptr[q as usize],
                now,
            }
        }
    }

    /// Follows one of the scheduler's actions.
    pub fn note_action(&mut self, a: &Action) {
        match *a {
            Action::Map { queue, .. } => self.mapped.push(queue),
            Action::Unmap { queue, .. } => {
                if !self.unmapping.contains(&queue) {
                    self.unmapping.push(queue)
                }
            }
            Action::ArmTimer { at } => self.timer = Some(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Policy, SchedConfig};

    /// A counter as the source: every draw is its range's low end plus the
    /// number of draws so far, wrapped.
    struct Count(u64);

    impl Draw for Count {
        fn range(&mut self, lo: u64, hi: u64) -> u64 {
            self.0 += 1;
            lo + self.0 % (hi - lo).max(1)
        }
        fn coin(&mut self) -> bool {
            self.range(0, 2) == 0
        }
    }

    #[test]
    fn spx_has_24_user_slots_on_4_pipes() {
        let slots = spx_slots();
        assert_eq!(slots.len(), 24);
        assert!(slots
            .iter()
            .all(|s| s.pipe < 4 && (2..8).contains(&s.queue)));
    }

    #[test]
    fn fleets_split_into_vms_of_16_queues() {
        let mut s = Scheduler::new(SchedConfig::default(), spx_slots()).unwrap();
        let mut vms = Vec::new();
        add_fleet(&mut s, 40, |vm| {
            vms.push(vm);
            VmParams {
                priority: 3,
                weight: 1,
                partition: None,
            }
        });
        assert_eq!(vms, vec![0, 1, 2]);
        // Queue 39 is VM 2's; a 41st queue id is still free.
        assert!(s.add_queue(VmId(2), QueueId(39), 0).is_err());
        assert!(s.add_queue(VmId(2), QueueId(40), 0).is_ok());
    }

    #[test]
    fn the_stream_follows_maps_unmaps_and_the_timer() {
        let mut s = Scheduler::new(
            SchedConfig {
                policy: Policy::Hqdmux,
                ..Default::default()
            },
            spx_slots(),
        )
        .unwrap();
        add_fleet(&mut s, 32, |vm| VmParams {
            priority: (vm % 16) as u8,
            weight: 1,
            partition: None,
        });
        let mut mix = EventMix::new(32);
        let mut d = Count(7);
        let (mut ticks, mut unmapped, mut idle, mut last) = (0, 0, 0, 0);
        for _ in 0..2_000 {
            let ev = mix.next_event(&mut d);
            let now = match ev {
                Event::Tick { now } => {
                    ticks += 1;
                    now
                }
                Event::Unmapped { queue, now, .. } => {
                    assert!(
                        !mix.mapped.contains(&queue),
                        "a finished dequeue is unmapped"
                    );
                    unmapped += 1;
                    now
                }
                Event::QueueIdle { queue, now } => {
                    assert!(mix.mapped.contains(&queue), "only a mapped queue goes idle");
                    idle += 1;
                    now
                }
                Event::Doorbell { now, .. } => now,
                _ => unreachable!("the mix makes four kinds"),
            };
            assert!(now > last, "time moves forward");
            last = now;
            s.handle(ev);
            while let Some(a) = s.poll_action() {
                mix.note_action(&a);
            }
            s.check_invariants().unwrap();
        }
        assert!(
            ticks > 0 && unmapped > 0 && idle > 0,
            "{ticks} {unmapped} {idle}"
        );
    }
}
