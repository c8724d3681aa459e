//! The bounded, sans-IO timeline builder.

use crate::{Mark, Preemption, SlotRow, Span, SpanKind, Timeline, VmRow, Wait};
use std::collections::{BTreeMap, VecDeque};

/// How much history a [`Recorder`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLimits {
    /// Closed spans and preemptions that ended longer ago than this (ns,
    /// before the latest time the recorder saw) are dropped.
    pub window_ns: u64,
    /// At most this many closed spans (and this many preemptions) are kept;
    /// the oldest go first.
    pub max_events: usize,
}

impl RingLimits {
    /// No limit (a finite run recorded whole, e.g. `hqdmux sim`).
    pub const UNBOUNDED: RingLimits = RingLimits {
        window_ns: u64::MAX,
        max_events: usize::MAX,
    };
}

impl Default for RingLimits {
    /// The live fleet's ring: the last 120 s, at most 200,000 events.
    fn default() -> Self {
        RingLimits {
            window_ns: 120_000_000_000,
            max_events: 200_000,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Open {
    vm: u32,
    queue: u64,
    kind: SpanKind,
    start_ns: u64,
}

/// Builds a [`Timeline`] from what happens on HQD slots, keeping a bounded
/// ring of history. Spans on one slot never overlap: a span starts no
/// earlier than the previous one on its slot ended, whatever times the
/// caller passes.
#[derive(Clone, Debug)]
pub struct Recorder {
    limits: RingLimits,
    vms: BTreeMap<u32, VmRow>,
    slots: Vec<SlotRow>,
    open: Vec<Option<Open>>,
    last_end: Vec<u64>,
    /// Per partition: preemptions `(at_ns, slot)` still waiting for their `by_vm`.
    pending_by: BTreeMap<u32, Vec<(u64, u32)>>,
    spans: VecDeque<Span>,
    preemptions: VecDeque<Preemption>,
    /// Per VM: since when it has been waiting (ready, no queue on a slot).
    waiting: BTreeMap<u32, u64>,
    waits: VecDeque<Wait>,
    marks: VecDeque<Mark>,
    latest_ns: u64,
    /// Earliest time for which the history is complete.
    horizon_ns: u64,
}

impl Recorder {
    /// A recorder over `slots` (slot `i` of spans is `slots[i]`).
    pub fn new(slots: Vec<SlotRow>, limits: RingLimits) -> Self {
        let n = slots.len();
        Recorder {
            limits,
            vms: BTreeMap::new(),
            slots,
            open: vec![None; n],
            last_end: vec![0; n],
            pending_by: BTreeMap::new(),
            spans: VecDeque::new(),
            preemptions: VecDeque::new(),
            waiting: BTreeMap::new(),
            waits: VecDeque::new(),
            marks: VecDeque::new(),
            latest_ns: 0,
            horizon_ns: 0,
        }
    }

    /// Adds or updates a VM (name, priority, weight).
    pub fn set_vm(&mut self, row: VmRow) {
        self.vms.insert(row.id, row);
    }

    /// Forgets VM `id`'s row (an ended VM; spans of it still in the ring
    /// are then drawn under a plain `vm N` row).
    pub fn forget_vm(&mut self, id: u32) {
        self.vms.remove(&id);
    }

    /// The VM row of `id`, if known.
    pub fn vm(&self, id: u32) -> Option<&VmRow> {
        self.vms.get(&id)
    }

    /// The kind and queue of the span open on `slot`.
    pub fn open_on(&self, slot: u32) -> Option<(SpanKind, u64)> {
        self.open
            .get(slot as usize)
            .copied()
            .flatten()
            .map(|o| (o.kind, o.queue))
    }

    /// Slots with an open span of `kind`.
    pub fn slots_in(&self, kind: SpanKind) -> Vec<u32> {
        self.open
            .iter()
            .enumerate()
            .filter(|(_, o)| o.is_some_and(|o| o.kind == kind))
            .map(|(i, _)| i as u32)
            .collect()
    }

    fn see(&mut self, at: u64) {
        self.latest_ns = self.latest_ns.max(at);
    }

    /// Queue `queue` of VM `vm` starts `kind` on `slot` at `at` (ns); a span
    /// still open on the slot ends there. Unknown slots are ignored.
    pub fn begin(&mut self, at: u64, slot: u32, vm: u32, queue: u64, kind: SpanKind) {
        let s = slot as usize;
        if s >= self.slots.len() {
            return;
        }
        self.see(at);
        self.end(at, slot);
        let start_ns = at.max(self.last_end[s]);
        self.open[s] = Some(Open {
            vm,
            queue,
            kind,
            start_ns,
        });
        if kind == SpanKind::Run || kind == SpanKind::Restore {
            let part = self.slots[s].partition;
            // The first other VM to start a queue in the partition after a
            // preemption took its place.
            if let Some(pending) = self.pending_by.get_mut(&part) {
                let preemptions = &mut self.preemptions;
                pending.retain(|&(at, ps)| {
                    let Some(p) = preemptions
                        .iter_mut()
                        .rev()
                        .find(|p| p.slot == ps && p.at_ns == at)
                    else {
                        return false; // pruned
                    };
                    if p.vm == vm {
                        return true;
                    }
                    p.by_vm = Some(vm);
                    false
                });
            }
        }
    }

    /// Ends the span open on `slot` at `at` (ns); returns it.
    pub fn end(&mut self, at: u64, slot: u32) -> Option<Span> {
        let s = slot as usize;
        let o = self.open.get_mut(s)?.take()?;
        self.see(at);
        let span = Span {
            slot,
            vm: o.vm,
            queue: o.queue,
            kind: o.kind,
            start_ns: o.start_ns,
            end_ns: at.max(o.start_ns),
        };
        self.last_end[s] = span.end_ns;
        self.spans.push_back(span);
        self.prune();
        Some(span)
    }

    /// A dequeue on `slot` finished at `at` after `took_ns` (from the
    /// request): the open span ends at the request and a `kind` span (Save
    /// or Drain) covers the dequeue. Returns the dequeue's span.
    pub fn dequeued(&mut self, at: u64, slot: u32, took_ns: u64, kind: SpanKind) -> Option<Span> {
        let s = slot as usize;
        let o = self.open.get(s).copied().flatten()?;
        let req = at.saturating_sub(took_ns).max(o.start_ns);
        self.end(req, slot);
        self.begin(req, slot, o.vm, o.queue, kind);
        self.end(at, slot)
    }

    /// VM `vm` was preempted on `slot` at `at` (the dequeue request), by
    /// `by_vm` if the caller knows; if not, the first other VM to start a
    /// queue in the slot's partition from now on is taken as the preemptor.
    pub fn preempt(&mut self, at: u64, slot: u32, vm: u32, by_vm: Option<u32>) {
        let s = slot as usize;
        if s >= self.slots.len() {
            return;
        }
        self.see(at);
        let part = self.slots[s].partition;
        let by_vm = by_vm.filter(|b| *b != vm);
        self.preemptions.push_back(Preemption {
            at_ns: at,
            slot,
            vm,
            by_vm,
        });
        if by_vm.is_none() {
            let pending = self.pending_by.entry(part).or_default();
            pending.push((at, slot));
            // Bounded like the history.
            if pending.len() > self.limits.max_events.min(4096) {
                pending.remove(0);
            }
        }
        self.prune();
    }

    /// VM `vm` starts (`true`) or stops waiting at `at`: it has work ready
    /// but no queue on a slot. Repeating the current state changes nothing.
    pub fn set_waiting(&mut self, at: u64, vm: u32, waiting: bool) {
        self.see(at);
        match (waiting, self.waiting.get(&vm).copied()) {
            (true, None) => {
                self.waiting.insert(vm, at);
            }
            (false, Some(start)) => {
                self.waiting.remove(&vm);
                self.waits.push_back(Wait {
                    vm,
                    start_ns: start,
                    end_ns: at.max(start),
                });
                self.prune();
            }
            _ => {}
        }
    }

    /// Whether `vm` is waiting now (see [`Recorder::set_waiting`]).
    pub fn is_waiting(&self, vm: u32) -> bool {
        self.waiting.contains_key(&vm)
    }

    /// An operator change at `at`: the policy (`vm = None`) or a VM's
    /// priority or weight, described by `text`.
    pub fn mark(&mut self, at: u64, vm: Option<u32>, text: impl Into<String>) {
        self.see(at);
        self.marks.push_back(Mark {
            at_ns: at,
            vm,
            text: text.into(),
        });
        self.prune();
    }

    fn prune(&mut self) {
        let l = self.limits;
        let cutoff = self.latest_ns.saturating_sub(l.window_ns);
        while self
            .spans
            .front()
            .is_some_and(|sp| sp.end_ns < cutoff || self.spans.len() > l.max_events)
        {
            let sp = self.spans.pop_front().expect("front exists");
            self.horizon_ns = self.horizon_ns.max(sp.end_ns);
        }
        while self
            .preemptions
            .front()
            .is_some_and(|p| p.at_ns < cutoff || self.preemptions.len() > l.max_events)
        {
            let p = self.preemptions.pop_front().expect("front exists");
            self.horizon_ns = self.horizon_ns.max(p.at_ns);
        }
        while self
            .waits
            .front()
            .is_some_and(|w| w.end_ns < cutoff || self.waits.len() > l.max_events)
        {
            let w = self.waits.pop_front().expect("front exists");
            self.horizon_ns = self.horizon_ns.max(w.end_ns);
        }
        // Marks are few (operator actions) but bounded all the same; losing
        // one does not make the history incomplete.
        while self
            .marks
            .front()
            .is_some_and(|m| m.at_ns < cutoff || self.marks.len() > l.max_events.min(4096))
        {
            self.marks.pop_front();
        }
    }

    /// The history in `[now - window_ns, now]` (`window_ns = None`: all that
    /// is kept), spans clipped to it, open spans ending at `now`. The window
    /// never starts before the oldest complete history.
    pub fn snapshot(&self, now: u64, window_ns: Option<u64>) -> Timeline {
        let now = now.max(self.latest_ns);
        let start = window_ns
            .map_or(0, |w| now.saturating_sub(w))
            .max(self.horizon_ns);
        self.clip(start, now)
    }

    /// The history in `[from_ns, to_ns]`, spans clipped to it, open spans
    /// ending at `to_ns`.
    pub fn clip(&self, from_ns: u64, to_ns: u64) -> Timeline {
        let to_ns = to_ns.max(from_ns);
        let open = self.open.iter().enumerate().filter_map(|(i, o)| {
            o.map(|o| Span {
                slot: i as u32,
                vm: o.vm,
                queue: o.queue,
                kind: o.kind,
                start_ns: o.start_ns,
                end_ns: to_ns.max(o.start_ns),
            })
        });
        let mut spans: Vec<Span> = self
            .spans
            .iter()
            .copied()
            .chain(open)
            .filter(|s| s.end_ns > from_ns && s.start_ns < to_ns)
            .map(|s| Span {
                start_ns: s.start_ns.max(from_ns),
                end_ns: s.end_ns.min(to_ns),
                ..s
            })
            .collect();
        spans.sort_by_key(|s| (s.slot, s.start_ns));
        let preemptions: Vec<Preemption> = self
            .preemptions
            .iter()
            .filter(|p| p.at_ns >= from_ns && p.at_ns <= to_ns)
            .copied()
            .collect();
        let open_waits = self.waiting.iter().map(|(&vm, &start)| Wait {
            vm,
            start_ns: start,
            end_ns: to_ns.max(start),
        });
        let mut waits: Vec<Wait> = self
            .waits
            .iter()
            .copied()
            .chain(open_waits)
            .filter(|w| w.end_ns > from_ns && w.start_ns < to_ns)
            .map(|w| Wait {
                start_ns: w.start_ns.max(from_ns),
                end_ns: w.end_ns.min(to_ns),
                ..w
            })
            .collect();
        waits.sort_by_key(|w| (w.vm, w.start_ns));
        let marks: Vec<Mark> = self
            .marks
            .iter()
            .filter(|m| m.at_ns >= from_ns && m.at_ns <= to_ns)
            .cloned()
            .collect();
        let mut vms: BTreeMap<u32, VmRow> = self.vms.clone();
        // A VM no longer registered but still in the history keeps a row.
        for v in spans
            .iter()
            .map(|s| s.vm)
            .chain(
                preemptions
                    .iter()
                    .flat_map(|p| std::iter::once(p.vm).chain(p.by_vm)),
            )
            .chain(waits.iter().map(|w| w.vm))
            .chain(marks.iter().filter_map(|m| m.vm))
        {
            vms.entry(v).or_insert_with(|| VmRow {
                id: v,
                name: format!("vm{v}"),
                priority: 0,
                weight: 1,
            });
        }
        Timeline {
            gpu_id: None,
            start_ns: from_ns,
            end_ns: to_ns,
            vms: vms.into_values().collect(),
            slots: self.slots.clone(),
            spans,
            preemptions,
            waits,
            marks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn slots(n: u32) -> Vec<SlotRow> {
        (0..n)
            .map(|i| SlotRow {
                id: i,
                label: format!("P0 pipe0 q{i}"),
                partition: 0,
            })
            .collect()
    }

    #[test]
    fn dequeue_splits_run_and_save_and_names_the_preemptor() {
        let mut r = Recorder::new(slots(1), RingLimits::UNBOUNDED);
        r.begin(100, 0, 1, 10, SpanKind::Run);
        r.preempt(500, 0, 1, None);
        let save = r.dequeued(700, 0, 200, SpanKind::Save).unwrap();
        assert_eq!(
            (save.start_ns, save.end_ns, save.kind),
            (500, 700, SpanKind::Save)
        );
        r.begin(700, 0, 2, 20, SpanKind::Run);
        let t = r.snapshot(1000, None);
        t.check().unwrap();
        let kinds: Vec<_> = t
            .spans
            .iter()
            .map(|s| (s.vm, s.kind, s.start_ns, s.end_ns))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (1, SpanKind::Run, 100, 500),
                (1, SpanKind::Save, 500, 700),
                (2, SpanKind::Run, 700, 1000)
            ]
        );
        assert_eq!(t.preemptions[0].by_vm, Some(2));
    }

    #[test]
    fn waits_and_marks_are_kept_and_clipped() {
        let mut r = Recorder::new(slots(1), RingLimits::UNBOUNDED);
        r.set_vm(VmRow {
            id: 1,
            name: "a".into(),
            priority: 1,
            weight: 1,
        });
        r.set_waiting(100, 1, true);
        r.set_waiting(150, 1, true); // no change
        assert!(r.is_waiting(1));
        r.set_waiting(300, 1, false);
        r.set_waiting(400, 2, true); // still open at the snapshot
        r.mark(350, None, "policy fifo");
        r.mark(360, Some(2), "priority 3 -> 12");
        let t = r.snapshot(1000, None);
        t.check().unwrap();
        let w: Vec<_> = t
            .waits
            .iter()
            .map(|w| (w.vm, w.start_ns, w.end_ns))
            .collect();
        assert_eq!(w, vec![(1, 100, 300), (2, 400, 1000)]);
        assert_eq!(t.marks.len(), 2);
        // VM 2 is only known from its wait and mark: it still gets a row.
        assert!(t.vm(2).is_some());
        let c = r.clip(200, 355);
        c.check().unwrap();
        assert_eq!(c.waits.len(), 1);
        assert_eq!((c.waits[0].start_ns, c.waits[0].end_ns), (200, 300));
        assert_eq!(c.marks.len(), 1);
    }

    #[test]
    fn ring_drops_old_history_and_window_clips() {
        let mut r = Recorder::new(
            slots(1),
            RingLimits {
                window_ns: 1000,
                max_events: 3,
            },
        );
        for i in 0..10u64 {
            r.begin(i * 100, 0, (i % 2) as u32, i, SpanKind::Run);
        }
        let t = r.snapshot(1000, None);
        t.check().unwrap();
        // 3 closed spans kept plus the open one.
        assert_eq!(t.spans.len(), 4);
        assert_eq!(t.start_ns, 600);
        let w = r.snapshot(1000, Some(150));
        assert_eq!(w.start_ns, 850);
        assert_eq!(w.spans.first().map(|s| s.start_ns), Some(850));
    }

    proptest! {
        /// Whatever order and times the caller reports, spans on one slot
        /// never overlap and stay inside the window.
        #[test]
        fn spans_never_overlap(ops in proptest::collection::vec((0u8..6, 0u32..3, 0u32..3, 0u64..10_000, 0u64..3_000), 1..200)) {
            let mut r = Recorder::new(slots(3), RingLimits { window_ns: 5_000, max_events: 50 });
            let mut now = 0;
            for (op, slot, vm, dt, took) in ops {
                now += dt / 10;
                match op {
                    0 => r.begin(now, slot, vm, u64::from(vm), SpanKind::Run),
                    1 => { r.dequeued(now, slot, took, SpanKind::Save); }
                    2 => r.preempt(now.saturating_sub(took), slot, vm, Some((vm + 1) % 3).filter(|_| took % 2 == 0)),
                    3 => { r.end(now.saturating_sub(took), slot); }
                    4 => r.set_waiting(now.saturating_sub(took % 7), vm, took % 2 == 0),
                    _ => r.mark(now, Some(vm).filter(|_| took % 3 != 0), "priority 1 -> 2"),
                }
            }
            let t = r.snapshot(now, Some(4_000));
            prop_assert_eq!(t.check(), Ok(()));
            let all = r.snapshot(now, None);
            prop_assert_eq!(all.check(), Ok(()));
        }
    }
}
