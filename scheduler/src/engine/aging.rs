//! Aging (docs/scheduling.md, "Aging"): batches of overdue queues boosted
//! above every VM priority, under a budget of 1/32 of the partition, served
//! in stride order of weighted turns (weight `level + 2`).

use super::*;
use std::ops::Bound;

/// Waiting entries one event looks at while choosing an aging batch
/// ([`Scheduler::age`]): the choice spans `ceil(levels x slots / this)`
/// events, each of bounded cost whatever the vMQDs and slots.
pub(super) const AGING_SCAN_STEP: usize = 8;
/// Queues one event boosts: one re-index each.
pub(super) const AGING_BOOST_STEP: usize = 2;

/// The choice of a partition's next aging batch, in progress: a cursor
/// over the waiting entries of the levels below the top busy one, and the
/// candidates met so far.
#[derive(Clone, Debug, Default)]
pub(super) struct AgingScan {
    /// Top busy level when the choice started (levels below it are aged).
    top: u16,
    /// Level being looked at.
    level: u16,
    /// Last entry looked at in `level`.
    after: Option<(Nanos, QueueId)>,
    /// Entries taken from `level` so far (at most the slots).
    taken: usize,
    /// Candidates: (turn tag, level, boost deadline, queue).
    cand: Vec<(u128, Reverse<u16>, Nanos, QueueId)>,
}

#[cfg(test)]
thread_local! {
    /// Aging's index operations and waiting entries looked at (tests).
    static AGING_OPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
thread_local! {
    /// Re-indexes of the queues still boosted at a batch's end (tests).
    static END_OPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts one aging index operation (tests only).
fn count_aging_op() {
    #[cfg(test)]
    AGING_OPS.with(|c| c.set(c.get() + 1));
}

/// Counts one re-index at a batch's end (tests only).
fn count_end_op() {
    #[cfg(test)]
    END_OPS.with(|c| c.set(c.get() + 1));
}

impl Scheduler {
    /// Aging (priority policies): queues of levels below the top busy one
    /// that waited [`age_wait`] are boosted above every VM priority, the
    /// due ones together (a batch of at most the partition's slots, in
    /// stride order of their VMs' weighted aged service: [`Self::scan_step`]).
    /// The choice and the boosts each take a few events at the same
    /// virtual time ([`AGING_SCAN_STEP`] entries looked
    /// at or [`AGING_BOOST_STEP`] re-indexes per event; the next step is
    /// due 1 ns on, [`Self::aging_due`]). A boosted queue drops back to its
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
            if !part.aging.to_boost.is_empty() {
                // The batch's queues are still being boosted (a few per
                // event): neither its pause nor its end is looked at
                // before they all are.
                self.boost_step(p);
                return;
            }
            self.charge_beside(p);
            self.aging_yield(p);
            let part = &mut self.parts[p];
            let boosting = part.busy.contains_key(&BOOST_LEVEL);
            let end = start
                .saturating_add(AGING_BATCH_NS)
                .saturating_add(part.aging.yielded);
            if part.aging.paused_since.is_some() || (boosting && now < end) {
                return;
            }
            // The batch is over: charge it (with one save and restore of
            // the work it displaced) to the budget — its pauses included
            // (while paused, its queues may run beside the higher VM on
            // the CUs it leaves, taking them from a backlogged VM between
            // the two levels), so a batch costs at most `B + Y + 2 t_save`.
            let cost = now
                .saturating_sub(start)
                .saturating_add(part.aging.save_ns.saturating_mul(2));
            part.aging.next_batch = now.saturating_add(cost.saturating_mul(AGING_SHARE_INV - 1));
            part.aging.batch_since = None;
            part.aging.yielded = 0;
            let batch = std::mem::take(&mut part.aging.batch);
            let billed0 = std::mem::take(&mut part.aging.batch_billed);
            let (vclock, save) = (part.aging.vclock, part.aging.save_ns);
            // Each VM one of whose queues ran in the batch (a queue still
            // Ready/Saved since it was boosted did not run and keeps its
            // place) is charged what its turn cost the budget — the
            // partition time billed to it during the batch plus one save
            // and restore — divided by its weight.
            let mut served: Vec<VmId> = Vec::new();
            for &(q, since) in &batch {
                let Some(qq) = self.queues.get(&q) else {
                    continue;
                };
                let waited =
                    matches!(qq.state, QueueState::Ready | QueueState::Saved) && qq.since == since;
                if !waited && !served.contains(&qq.vm) {
                    served.push(qq.vm);
                }
            }
            for vm in served {
                if let Some(v) = self.vms.get_mut(&vm) {
                    let w = aging_weight(v.params.priority as u16);
                    let before = billed0
                        .iter()
                        .find(|e| e.0 == vm)
                        .map_or(v.stats.gpu_ns, |e| e.1);
                    let used = billed_now(v, now)
                        .saturating_sub(before)
                        .saturating_add(save.saturating_mul(2));
                    v.aged_tag = v
                        .aged_tag
                        .max(vclock)
                        .saturating_add(used as u128 * SCALE / w);
                }
            }
            // Its queues still boosted drop back together, in this event:
            // dropped a few per event, the decisions between would hand
            // the partition to the batch's other VMs for a few ns (maps
            // and saves for nothing). Most have dropped back already (a
            // boost ends when its ring drains); a batch ended by `B`
            // re-indexes the rest, at most the slots.
            for (q, _) in batch {
                if self.queues.get(&q).is_some_and(|q| q.boosted) {
                    count_end_op();
                    self.rekey(q, |q| q.boosted = false);
                }
            }
            return;
        }
        let part = &self.parts[p];
        if now < part.aging.next_batch {
            return;
        }
        if part.aging.scan.is_none() {
            let Some(top) = part.busy.range(..BOOST_LEVEL).next_back().map(|e| *e.0) else {
                return;
            };
            // Nothing due below the top busy level: no batch (one look at
            // the first entry of each level).
            if !part.waiting[..top as usize]
                .iter()
                .any(|w| w.first().is_some_and(|e| e.0 <= now))
            {
                return;
            }
            self.parts[p].aging.scan = Some(AgingScan {
                top,
                ..AgingScan::default()
            });
        }
        if !self.scan_step(p) {
            return;
        }
        // The choice is made: the batch starts now (its boosts follow, a
        // few per event, at once).
        let Some(scan) = self.parts[p].aging.scan.take() else {
            return;
        };
        let mut cand = scan.cand;
        let cap = self.parts[p].nslots.max(1);
        // A queue met twice (its VM changed level during the choice)
        // counts once.
        cand.sort_unstable_by_key(|e| e.3);
        cand.dedup_by_key(|e| e.3);
        if cand.is_empty() {
            return;
        }
        if cand.len() > cap {
            cand.select_nth_unstable(cap - 1);
            cand.truncate(cap);
        }
        cand.sort_unstable();
        let part = &mut self.parts[p];
        part.aging.vclock = part.aging.vclock.max(cand[0].0);
        part.aging.batch_since = Some(now);
        part.aging.beside_at = now;
        part.aging.batch.clear();
        part.aging.batch_billed.clear();
        part.aging.to_boost = cand.into_iter().rev().map(|e| e.3).collect();
        self.boost_step(p);
    }

    /// One step of the choice of partition `p`'s next batch: looks at up
    /// to [`AGING_SCAN_STEP`] more waiting entries (levels below the top
    /// busy one, due ones only, at most the partition's slots' worth per
    /// level). True when the choice is complete.
    ///
    /// At most one slot's worth of queues per batch (no more can run at
    /// once). Which ones: the aging server serves the due VMs in stride
    /// order of their weighted turns (`aged_tag`, weight `level + 2`), ties
    /// to the higher level, then the longest overdue. A turn is charged
    /// what it cost the budget (partition time + one save and restore)
    /// over the weight, so while the budget is saturated each starved VM's
    /// aged time follows `level + 2`, and a VM that becomes due is served
    /// before any other VM `x` has cost the budget more than `1 + w_x / w`
    /// batches (docs/scheduling.md, "Aging"). The choice spans a few
    /// events at the same virtual time (a few ns apart): the per-event
    /// cost stays bounded by [`AGING_SCAN_STEP`] whatever the vMQDs and
    /// slots (`tick` p99.9 at 4096 vMQDs was 87-99 us from one event
    /// scanning 15 levels x 24 entries, docs/benchmarks.md).
    fn scan_step(&mut self, p: usize) -> bool {
        let now = self.now;
        let Some(mut scan) = self.parts[p].aging.scan.take() else {
            return true;
        };
        let part = &self.parts[p];
        let cap = part.nslots.max(1);
        let vclock = part.aging.vclock;
        let mut budget = AGING_SCAN_STEP;
        while scan.level < scan.top && budget > 0 {
            let w = &part.waiting[scan.level as usize];
            let rest = match scan.after {
                None => w.range(..),
                Some(k) => w.range((Bound::Excluded(k), Bound::Unbounded)),
            };
            let mut level_done = true;
            for e in rest {
                if scan.taken >= cap || e.0 > now {
                    break;
                }
                if budget == 0 {
                    level_done = false;
                    break;
                }
                budget -= 1;
                count_aging_op();
                scan.taken += 1;
                scan.after = Some(*e);
                let tag = self
                    .queues
                    .get(&e.1)
                    .and_then(|q| self.vms.get(&q.vm))
                    .map_or(vclock, |v| v.aged_tag.max(vclock));
                scan.cand.push((tag, Reverse(scan.level), e.0, e.1));
            }
            if level_done {
                scan.level += 1;
                scan.after = None;
                scan.taken = 0;
            }
        }
        // Only the best `cap` can be chosen: the list stays within twice
        // that (the rest could never be taken).
        if scan.cand.len() > cap.saturating_mul(2) {
            scan.cand.select_nth_unstable(cap - 1);
            scan.cand.truncate(cap);
        }
        let done = scan.level >= scan.top;
        self.parts[p].aging.scan = Some(scan);
        done
    }

    /// Boosts up to [`AGING_BOOST_STEP`] more of the running batch's
    /// chosen queues of partition `p` (one re-index each, one notice per
    /// boost); a queue that left Ready/Saved since it was chosen is
    /// skipped. When the last is boosted, a demand-limited higher VM
    /// already busy pauses the batch at once (its yield allowance is
    /// charged as for any pause).
    fn boost_step(&mut self, p: usize) {
        let now = self.now;
        for _ in 0..AGING_BOOST_STEP {
            let Some(q) = self.parts[p].aging.to_boost.pop() else {
                break;
            };
            let Some(qq) = self.queues.get(&q) else {
                continue;
            };
            let (vm, since) = (qq.vm, qq.since);
            let fit = !qq.boosted
                && matches!(qq.state, QueueState::Ready | QueueState::Saved)
                && self.vms.get(&vm).is_some_and(|v| !v.paused);
            if !fit {
                continue;
            }
            let billed = self.vms.get(&vm).map_or(0, |v| billed_now(v, now));
            let part = &mut self.parts[p];
            part.aging.batch.push((q, since));
            if !part.aging.batch_billed.iter().any(|e| e.0 == vm) {
                part.aging.batch_billed.push((vm, billed));
            }
            self.stats.boosts += 1;
            if let Some(v) = self.vms.get_mut(&vm) {
                v.stats.aging_boosts += 1;
            }
            // Said where it is counted: one notice per boost.
            self.notice(SchedNotice::Aged { queue: q, vm });
            count_aging_op();
            self.rekey(q, |q| q.boosted = true);
        }
        if self.parts[p].aging.to_boost.is_empty() {
            self.aging_yield(p);
        }
    }

    /// Yielding to a demand-limited higher VM (docs/scheduling.md,
    /// "Aging"): pauses the running batch of partition `p` while the top
    /// busy level below the boost is above every level of the batch and
    /// each of its busy VMs is demand-limited ([`Self::yield_backlogged`]
    /// is false), and resumes it when that ends or the batch's pauses
    /// reach [`AGING_YIELD_NS`] (each counted as its time plus, if the
    /// batch's work was saved, one save and restore of it). A paused
    /// batch's queues are unboosted
    /// (the ordinary decision serves the higher VM, with CU sharing or a
    /// save of the batch's work) and boosted again when it resumes, if
    /// they still have work; the batch ends as much later as its pauses
    /// took, so each turn still runs its job for `B - 2 t_save`.
    fn aging_yield(&mut self, p: usize) {
        let now = self.now;
        let part = &self.parts[p];
        let switch = self.pause_switch(part);
        if let Some(ps) = part.aging.paused_since {
            // The pause so far: its time, plus one save and restore of the
            // batch's work if it was saved (its turn lost that progress).
            let saved = self.saves_of(&part.aging.paused) != part.aging.paused_saves;
            // A pause in which the batch's work kept running beside the
            // higher VM (off its reservation, `engine/batch_res.rs`) costs
            // the batch only the CUs it left.
            let paused_ns = now.saturating_sub(ps);
            let paused_ns = if saved || !self.batch_runs_beside(part) {
                paused_ns
            } else {
                self.unsaved_pause_cost(p, paused_ns)
            };
            let part = &self.parts[p];
            let spent = part
                .aging
                .yielded
                .saturating_add(paused_ns)
                .saturating_add(if saved { switch } else { 0 });
            // Ends when the higher VM is served, or before a save of the
            // batch's work would take the allowance past `Y`.
            if spent.saturating_add(if saved { 0 } else { switch }) < AGING_YIELD_NS
                && self.yield_wanted(p)
            {
                return;
            }
            let part = &mut self.parts[p];
            part.aging.yielded = spent.min(AGING_YIELD_NS);
            part.aging.paused_since = None;
            let qs = std::mem::take(&mut part.aging.paused);
            for q in qs {
                let work = self.queues.get(&q).is_some_and(|qq| {
                    !qq.boosted
                        && (is_demand(qq.state)
                            || (qq.state == QueueState::Preempting
                                && matches!(qq.reason, Some(Reason::Preempt(..)))))
                });
                if work {
                    count_aging_op();
                    self.rekey(q, |q| q.boosted = true);
                }
            }
            return;
        }
        if !part.busy.contains_key(&BOOST_LEVEL)
            || part.aging.yielded.saturating_add(switch) >= AGING_YIELD_NS
            || !self.yield_wanted(p)
        {
            return;
        }
        let boosted: Vec<QueueId> = part
            .aging
            .batch
            .iter()
            .map(|e| e.0)
            .filter(|q| self.queues.get(q).is_some_and(|qq| qq.boosted))
            .collect();
        for &q in &boosted {
            count_aging_op();
            self.rekey(q, |q| q.boosted = false);
        }
        let saves = self.saves_of(&boosted);
        let part = &mut self.parts[p];
        part.aging.paused_since = Some(now);
        part.aging.paused = boosted;
        part.aging.paused_saves = saves;
    }

    /// The highest level below `level` of the busy queues of partition
    /// `p`'s paused aging batch (`None`: no pause, or none busy).
    pub(super) fn paused_batch_level(&self, p: usize, level: u16) -> Option<u16> {
        let part = &self.parts[p];
        part.aging.paused_since?;
        part.aging
            .paused
            .iter()
            .filter_map(|q| self.queues.get(q))
            .filter(|q| q.wants)
            .filter_map(|q| self.vms.get(&q.vm))
            .map(|v| v.params.priority as u16)
            .filter(|&l| l < level)
            .max()
    }

    /// What a pause of partition `p`'s batch costs its work in a switch:
    /// one save and restore, the longer of the partition's last save and
    /// the last saves of the batch's own queues (a batch of long
    /// workgroups saves slowly: its pause must fit the allowance with
    /// that switch, not with a short save of other work seen last). The
    /// partition's last save counts without its wait for waves that have
    /// no save point: that wait was another VM's, billed to it (a lower
    /// VM's 685 us `no_save_point` workgroups made a batch of other work
    /// refuse a higher RT's reservation and the RT waited in the batch,
    /// fuzz seed 200058; docs/scheduling.md "A batch pause's switch
    /// without another guest's waits").
    pub(super) fn pause_switch(&self, p: &Partition) -> Nanos {
        p.aging
            .batch
            .iter()
            .filter_map(|e| self.queues.get(&e.0))
            .map(|q| q.restore_ns)
            .fold(p.aging.save_clean_ns, Nanos::max)
            .saturating_mul(2)
    }

    /// Preemptions suffered so far by the VMs of `queues` (each VM once).
    fn saves_of(&self, queues: &[QueueId]) -> u64 {
        let mut vms: Vec<VmId> = queues
            .iter()
            .filter_map(|q| self.queues.get(q).map(|qq| qq.vm))
            .collect();
        vms.sort_unstable();
        vms.dedup();
        vms.iter()
            .filter_map(|vm| self.vms.get(vm))
            .map(|v| v.stats.preemptions)
            .sum()
    }

    /// Should partition `p`'s running batch yield now: is the top busy
    /// level below the boost above every level of the batch's VMs, with
    /// every VM busy there demand-limited?
    fn yield_wanted(&self, p: usize) -> bool {
        let part = &self.parts[p];
        let Some((&level, vms)) = part.busy.range(..BOOST_LEVEL).next_back() else {
            return false;
        };
        let batch_top = part
            .aging
            .batch
            .iter()
            .filter_map(|e| self.queues.get(&e.0))
            .filter_map(|q| self.vms.get(&q.vm))
            .map(|v| v.params.priority as u16)
            .max();
        if batch_top.is_none_or(|b| level <= b) {
            return false;
        }
        vms.keys().all(|vm| !self.yield_backlogged(*vm))
    }

    /// Is `vm` backlogged for an aging batch's yield: demanding without a
    /// break longer than its anticipation grace (`Vm::demanding_since`,
    /// the notion co-residence uses) for more than [`AGING_YIELD_NS`]?
    /// Such a VM is what aging exists to bound: a batch never yields to it.
    pub(super) fn yield_backlogged(&self, vm: VmId) -> bool {
        self.vms.get(&vm).is_some_and(|v| {
            v.demand > 0 && self.now.saturating_sub(v.demanding_since) > AGING_YIELD_NS
        })
    }

    /// When partition `p`'s pause must end at the latest (its yield
    /// allowance runs out, or a VM it yields to becomes backlogged), for
    /// the timer.
    fn yield_due(&self, pi: usize, p: &Partition, paused_since: Nanos) -> Nanos {
        // One save and restore is kept in reserve whether or not the
        // batch's work was saved yet (see `aging_yield`).
        let switch = self.pause_switch(p);
        let left = AGING_YIELD_NS
            .saturating_sub(p.aging.yielded)
            .saturating_sub(switch);
        // An unsaved pause with the batch running beside costs it only the
        // reserved CUs' share (`engine/batch_res.rs`): it may last longer.
        let saved = self.saves_of(&p.aging.paused) != p.aging.paused_saves;
        let left = if saved || !self.batch_runs_beside(p) {
            left
        } else {
            self.unsaved_pause_for(pi, left)
        };
        let budget = paused_since.saturating_add(left);
        let backlogged = p
            .busy
            .range(..BOOST_LEVEL)
            .next_back()
            .and_then(|(_, vms)| {
                vms.keys()
                    .filter_map(|vm| self.vms.get(vm))
                    .filter(|v| v.demand > 0)
                    .map(|v| {
                        v.demanding_since
                            .saturating_add(AGING_YIELD_NS)
                            .saturating_add(1)
                    })
                    .min()
            })
            .unwrap_or(Nanos::MAX);
        budget.min(backlogged)
    }

    /// Earliest time aging has something to do in partition `p` (the end of
    /// the running batch or of its pause, or the next batch), for the
    /// timer.
    pub(super) fn aging_due(&self, pi: usize, p: &Partition) -> Option<Nanos> {
        if p.aging.scan.is_some() || !p.aging.to_boost.is_empty() {
            // A batch's choice or boosts in progress: the next step
            // follows at once (1 ns on), never as a timer in the past.
            return Some(self.now.saturating_add(1));
        }
        if let Some(start) = p.aging.batch_since {
            if let Some(ps) = p.aging.paused_since {
                return Some(self.yield_due(pi, p, ps));
            }
            let end = start
                .saturating_add(AGING_BATCH_NS)
                .saturating_add(p.aging.yielded);
            // Beside a kept reservation the end moves on as the batch
            // runs (`engine/batch_res.rs`): due when it is reached.
            return Some(self.beside_end(pi, end));
        }
        let top = p.busy.range(..BOOST_LEVEL).next_back().map(|e| *e.0)?;
        let due = p.waiting[..top as usize]
            .iter()
            .filter_map(|w| w.first().map(|e| e.0))
            .min()?;
        Some(due.max(p.aging.next_batch))
    }
}

/// Weight of a VM of priority `level` in the aging server's stride order:
/// `level + 2`, the same step per level as the boost rate of
/// [`age_wait`] (`(level + 2) / (2 x aging_ns)`).
pub(super) fn aging_weight(level: u16) -> u128 {
    level.min(15) as u128 + 2
}

/// GPU time billed to `v` up to `now` (its running period included).
fn billed_now(v: &Vm, now: Nanos) -> Nanos {
    let running = if v.active > 0 { billable(v, now) } else { 0 };
    v.stats.gpu_ns.saturating_add(running)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_mix::spx_slots as slots;

    const MS: Nanos = 1_000_000;

    /// A top VM (level 15) of 24 always-busy queues over `vms` lower VMs
    /// of 16 queues each at levels 0-14 (VM `i` at level `i % 15`), every
    /// queue rung at 0: 24 + 16 x `vms` vMQDs.
    fn flooded(vms: u32) -> Scheduler {
        let cfg = SchedConfig {
            policy: Policy::Hqdmux,
            aging_ns: 10 * MS,
            ..Default::default()
        };
        let mut s = Scheduler::new(cfg, slots()).unwrap();
        let add = |s: &mut Scheduler, vm: u32, priority: u8, n: u64, first: u64| {
            s.add_vm(
                VmId(vm),
                VmParams {
                    priority,
                    weight: 1,
                    partition: None,
                },
            )
            .unwrap();
            for q in first..first + n {
                s.add_queue(VmId(vm), QueueId(q), 0).unwrap();
            }
        };
        add(&mut s, 0, 15, 24, 0);
        for i in 0..vms {
            add(&mut s, i + 1, (i % 15) as u8, 16, 24 + 16 * i as u64);
        }
        s.record_notices(true);
        for q in 0..24 + 16 * vms as u64 {
            s.handle(Event::Doorbell {
                queue: QueueId(q),
                wptr: 1,
                now: 0,
            });
        }
        s
    }

    /// Drives `s` (every queue always has work; dequeues finish 100 us
    /// after they are asked for) until virtual time `until`, calling
    /// `each` with the aging operations of every event and the aged
    /// queues it noted.
    fn drive(s: &mut Scheduler, until: Nanos, mut each: impl FnMut(&Scheduler, u64, &[QueueId])) {
        let mut timer: Option<Nanos> = None;
        let mut unmaps: Vec<(Nanos, QueueId)> = Vec::new();
        let mut now = 0;
        let mut events = 0u64;
        loop {
            while let Some(a) = s.poll_action() {
                match a {
                    Action::ArmTimer { at } => {
                        assert!(at > now, "timer armed at {at}, not after {now}");
                        timer = Some(at);
                    }
                    Action::Unmap { queue, .. } => unmaps.push((now + 100_000, queue)),
                    Action::Map { .. } => {}
                }
            }
            unmaps.sort_unstable();
            let next_unmap = unmaps.first().map(|e| e.0);
            let tick_first = timer.is_some_and(|t| next_unmap.is_none_or(|u| t <= u));
            let ev = match (timer, next_unmap) {
                (Some(t), _) if tick_first => {
                    timer = None;
                    Event::Tick { now: t }
                }
                (_, Some(_)) => {
                    let (t, queue) = unmaps.remove(0);
                    Event::Unmapped {
                        queue,
                        has_work: true,
                        save_ns: 50_000,
                        now: t,
                    }
                }
                _ => break,
            };
            now = ev.now();
            if now > until {
                break;
            }
            AGING_OPS.with(|c| c.set(0));
            END_OPS.with(|c| c.set(0));
            s.handle(ev);
            let ops = AGING_OPS.with(|c| c.get());
            let end_ops = END_OPS.with(|c| c.get());
            assert!(
                end_ops <= s.parts[0].nslots as u64,
                "a batch's end re-indexed {end_ops} queues, more than one batch"
            );
            let mut aged = Vec::new();
            while let Some(n) = s.poll_notice() {
                if let SchedNotice::Aged { queue, .. } = n {
                    aged.push(queue);
                }
            }
            events += 1;
            if events.is_multiple_of(64) {
                s.check_invariants().unwrap();
            }
            each(s, ops, &aged);
        }
        s.check_invariants().unwrap();
    }

    /// Over 4096 vMQDs (255 starved VMs at 15 levels below a flood), every
    /// event does at most a step's worth of a batch's choice and boosts
    /// (waiting entries looked at and re-indexes), not a batch's, and
    /// batches still boost a whole slots' worth: one choice spans many
    /// events. (A batch's end re-indexes its queues still boosted at
    /// once, at most one batch: checked in `drive`.)
    #[test]
    fn an_aging_batch_costs_each_event_a_bounded_step() {
        let mut s = flooded(255);
        let bound = (AGING_SCAN_STEP + AGING_BOOST_STEP) as u64;
        let mut worst = 0;
        let mut busy_events = 0u64;
        drive(&mut s, 200 * MS, |_, ops, _| {
            worst = worst.max(ops);
            busy_events += u64::from(ops > 0);
        });
        assert!(
            worst <= bound,
            "an event did {worst} aging operations (bound {bound})"
        );
        let boosts = s.stats().boosts;
        assert!(
            boosts >= 2 * 24,
            "at least two batches of a slots' worth each: {boosts} boosts"
        );
        // A batch's choice over 15 levels x 24 entries could not fit in
        // one step: it spanned events.
        assert!(busy_events > 2 * (15 * 24 / AGING_SCAN_STEP) as u64);
    }

    /// The choice made in steps is the choice made at once: the first
    /// batch (every VM without aged turns) boosts the 24 longest-overdue
    /// queues of the highest level below the flood, in queue order
    /// (their boost deadlines are equal) — across step boundaries inside
    /// that level's 17 VMs x 16 queues.
    #[test]
    fn a_stepped_choice_boosts_the_batch_a_whole_choice_would() {
        let mut s = flooded(255);
        let mut first: Vec<QueueId> = Vec::new();
        drive(&mut s, 30 * MS, |_, _, aged| {
            if first.len() < 24 {
                first.extend_from_slice(aged);
            }
        });
        // VMs at level 14: i % 15 == 14, i.e. VM ids 15, 30, ...; their
        // queues in id order.
        let want: Vec<QueueId> = (0..255u64)
            .filter(|i| i % 15 == 14)
            .flat_map(|i| (24 + 16 * i..24 + 16 * (i + 1)).map(QueueId))
            .take(24)
            .collect();
        first.truncate(24);
        first.sort_unstable();
        assert_eq!(first, want);
    }
}
