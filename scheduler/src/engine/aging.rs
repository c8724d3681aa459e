//! Aging (docs/scheduling.md, "Aging"): batches of overdue queues boosted
//! above every VM priority, under a budget of 1/32 of the partition.

use super::*;

impl Scheduler {
    /// Aging (priority policies): queues of levels below the top busy one
    /// that waited [`age_wait`] are boosted above every VM priority, all
    /// the due ones together (a batch). A boosted queue drops back to its
    /// level when its ring drains (its job is done: `QueueIdle`); the batch
    /// ends when no boosted queue is busy or after [`AGING_BATCH_NS`]
    /// (queues still boosted then drop back; those that did not run keep
    /// their place), and the next batch waits `AGING_SHARE_INV - 1` times the
    /// batch's length plus one CWSR save and restore, so aging never takes
    /// more than `1 / AGING_SHARE_INV` of the partition. Queues of the top
    /// busy level are not aged: they are served by the weighted slices of
    /// their level (between VMs) and by their VM's own queue priorities
    /// (within it).
    pub(super) fn age(&mut self, p: usize) {
        let now = self.now;
        let part = &mut self.parts[p];
        if let Some(start) = part.aging.batch_since {
            let boosting = part.busy.contains_key(&BOOST_LEVEL);
            if boosting && now < start.saturating_add(AGING_BATCH_NS) {
                return;
            }
            // The batch is over: charge it (with one save and restore of
            // the work it displaced) to the budget.
            let cost = now
                .saturating_sub(start)
                .saturating_add(part.aging.save_ns.saturating_mul(2));
            part.aging.next_batch = now.saturating_add(cost.saturating_mul(AGING_SHARE_INV - 1));
            part.aging.batch_since = None;
            let batch = std::mem::take(&mut part.aging.batch);
            for q in batch {
                if self.queues.get(&q).is_some_and(|q| q.boosted) {
                    self.rekey(q, |q| q.boosted = false);
                }
            }
        }
        let part = &mut self.parts[p];
        if now < part.aging.next_batch {
            return;
        }
        let Some(top) = part.busy.range(..BOOST_LEVEL).next_back().map(|e| *e.0) else {
            return;
        };
        // At most one slot's worth of queues per batch, the longest
        // overdue first: no more can run at once, and the batch's cost
        // (one re-index per queue, at its start and its end) then stays
        // bounded by the slots, not by the starved queues (`tick` p99 at
        // 256 vMQDs was 44-48 us from batches of hundreds of queues).
        let cap = part.nslots.max(1);
        let mut cand: Vec<(Nanos, QueueId)> = Vec::new();
        for w in &part.waiting[..top as usize] {
            cand.extend(w.iter().take_while(|e| e.0 <= now).take(cap).copied());
        }
        if cand.is_empty() {
            return;
        }
        if cand.len() > cap {
            cand.select_nth_unstable(cap - 1);
            cand.truncate(cap);
        }
        let due: Vec<QueueId> = cand.into_iter().map(|e| e.1).collect();
        part.aging.batch_since = Some(now);
        part.aging.batch = due.clone();
        for q in due {
            self.stats.boosts += 1;
            if let Some(vm) = self.queues.get(&q).map(|r| r.vm) {
                if let Some(v) = self.vms.get_mut(&vm) {
                    v.stats.aging_boosts += 1;
                }
            }
            self.rekey(q, |q| q.boosted = true);
        }
    }

    /// Earliest time aging has something to do in partition `p` (the end of
    /// the running batch, or the next one), for the timer.
    pub(super) fn aging_due(&self, p: &Partition) -> Option<Nanos> {
        if let Some(start) = p.aging.batch_since {
            return Some(start.saturating_add(AGING_BATCH_NS));
        }
        let top = p.busy.range(..BOOST_LEVEL).next_back().map(|e| *e.0)?;
        let due = p.waiting[..top as usize]
            .iter()
            .filter_map(|w| w.first().map(|e| e.0))
            .min()?;
        Some(due.max(p.aging.next_batch))
    }
}
