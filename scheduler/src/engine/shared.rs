//! The shared (co-running) decision: `corun_equals`, non-exclusive mode
//! and the fifo and poll5ms baselines (docs/scheduling.md).

use super::*;

impl Scheduler {
    /// Shared (co-running) mode: ready queues fill slots, by level and then
    /// age across VMs, by queue priority within a VM. With `preempt`,
    /// lower-level running queues make room for higher ones (and, in
    /// exclusive mode, do not co-run with them). `only_top`: map only queues
    /// of the top busy level, and of each VM only its highest busy queue
    /// priority (lower ones of that VM are preempted at once).
    pub(super) fn decide_shared(&mut self, p: usize, preempt: bool, only_top: bool) {
        let now = self.now;
        let mode = self.preempt_mode();
        let top = self.parts[p].top().unwrap_or(0);
        let prio = self.ops().by_priority;
        if preempt && self.cfg.exclusive {
            let low: Vec<QueueId> = self.parts[p]
                .running
                .iter()
                .filter(|&&(l, since, q)| {
                    (l < top && since + self.cfg.min_run_ns <= now)
                        || (only_top && prio && self.below_own_top(q))
                })
                .map(|e| e.2)
                .collect();
            for q in low {
                let cause = self.shared_cause(p, q, top);
                self.unmap(q, mode, Reason::Preempt(mode, cause));
            }
        }
        // At most this many can be placed or make a victim now.
        let reach = self.parts[p].nfree + self.parts[p].running.len() + 1;
        // (With `only_top`, queues below their VM's best busy queue wait
        // and do not count against `reach`.)
        let ready: Vec<(u16, QueueId)> = self.parts[p]
            .ready
            .iter()
            .map(|(l, _, q)| (l.0, *q))
            .take_while(|(l, _)| !only_top || *l >= top)
            .filter(|(_, q)| !(only_top && prio && self.below_own_top(*q)))
            .take(reach)
            .collect();
        let mut left = self.parts[p].ready.len();
        for (level, q) in ready {
            // The slot goes to this queue's VM; within the VM, to its best
            // ready queue at this level.
            let vm = self.queues[&q].vm;
            // (With `only_top`, the filter above left only VMs whose best
            // ready queue is at their top busy key; mapping one keeps it so.)
            let Some((key, q)) = self.vms[&vm].best_ready_at(level) else {
                continue;
            };
            if self.place(p, q, left) {
                left -= 1;
                continue;
            }
            if self.parts[p].freeing.len() >= left {
                break;
            }
            // No slot: take one from lower work (or, for fifo, round robin).
            let fifo = self.ops().decision == Decision::RoundRobin;
            let own_lower = self.vms[&vm]
                .running
                .first()
                .filter(|e| prio && e.0 < key)
                .map(|e| e.2);
            match self.parts[p].running.first().copied() {
                Some((l, since, v))
                    if preempt && l < level && since + self.cfg.min_run_ns <= now =>
                {
                    let why = if level >= BOOST_LEVEL {
                        PreemptReason::Aging
                    } else {
                        PreemptReason::Priority
                    };
                    self.unmap(v, mode, Reason::Preempt(mode, Cause::new(Some(vm), why)));
                }
                Some((_, since, v)) if fifo && since + self.queue_slice(v) <= now => {
                    let cause = Cause::new(Some(vm), PreemptReason::Slice);
                    self.unmap(v, mode, Reason::Preempt(mode, cause));
                }
                _ => match own_lower {
                    // Queue priority preempts within the VM, at once.
                    Some(v) if preempt => {
                        let cause = Cause::new(Some(vm), PreemptReason::QueuePriority);
                        self.unmap(v, mode, Reason::Preempt(mode, cause))
                    }
                    // This queue cannot take a slot from lower work, and no
                    // later one can (they rank no higher against the same
                    // lowest running queue), but a later one may still
                    // outrank a running queue of its own VM: go on (the
                    // list is bounded by `reach`).
                    _ => continue,
                },
            }
        }
    }

    /// Why running queue `q` of partition `p` makes room when the top busy
    /// level is `top`: below it, for the best queue of that level (aging
    /// when boosted); else for a higher queue of its own VM.
    fn shared_cause(&self, p: usize, q: QueueId, top: u16) -> Cause {
        let own = self.queues[&q].vm;
        if self.queue_level(q).is_some_and(|l| l >= top) {
            return Cause::new(Some(own), PreemptReason::QueuePriority);
        }
        let why = if top >= BOOST_LEVEL {
            PreemptReason::Aging
        } else {
            PreemptReason::Priority
        };
        // The best waiting queue of the top level, else the best running.
        let best = self.parts[p]
            .ready
            .first()
            .filter(|e| e.0 .0 >= top)
            .map(|e| e.2)
            .or_else(|| self.parts[p].running.last().map(|e| e.2));
        Cause::new(best.and_then(|b| self.queues.get(&b)).map(|b| b.vm), why)
    }

    /// Is a running queue below the highest busy queue priority of its VM?
    pub(super) fn below_own_top(&self, q: QueueId) -> bool {
        let q = &self.queues[&q];
        self.vms[&q.vm].top_key().is_some_and(|t| q.key < t)
    }
}
