//! Aging (docs/scheduling.md, "Aging"): batches of overdue queues boosted
//! above every VM priority, under a budget of 1/32 of the partition, served
//! in stride order of weighted turns (weight `level + 2`).

use super::*;

impl Scheduler {
    /// Aging (priority policies): queues of levels below the top busy one
    /// that waited [`age_wait`] are boosted above every VM priority, the
    /// due ones together (a batch of at most the partition's slots, in
    /// stride order of their VMs' weighted aged service). A boosted queue drops back to its
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
            for (q, _) in batch {
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
        // At most one slot's worth of queues per batch (no more can run
        // at once, and the batch's cost — one re-index per queue at its
        // start and its end — stays bounded by the slots, not by the
        // starved queues: `tick` p99 at 256 vMQDs was 44-48 us from
        // batches of hundreds of queues). Which ones: the aging server
        // serves the due VMs in stride order of their weighted turns
        // (`aged_tag`, weight `level + 2`), ties to the higher level, then
        // the longest overdue. A turn is charged what it cost the budget
        // (partition time + one save and restore) over the weight, so
        // while the budget is saturated each starved VM's aged time
        // follows `level + 2`, and a VM that becomes due is served before
        // any other VM `x` has cost the budget more than `1 + w_x / w`
        // batches (docs/scheduling.md, "Aging").
        let cap = part.nslots.max(1);
        let vclock = part.aging.vclock;
        let mut cand: Vec<(u128, Reverse<u16>, Nanos, QueueId)> = Vec::new();
        for (level, w) in part.waiting[..top as usize].iter().enumerate() {
            for e in w.iter().take_while(|e| e.0 <= now).take(cap) {
                let tag = self
                    .queues
                    .get(&e.1)
                    .and_then(|q| self.vms.get(&q.vm))
                    .map_or(vclock, |v| v.aged_tag.max(vclock));
                cand.push((tag, Reverse(level as u16), e.0, e.1));
            }
        }
        if cand.is_empty() {
            return;
        }
        if cand.len() > cap {
            cand.select_nth_unstable(cap - 1);
            cand.truncate(cap);
        }
        cand.sort_unstable();
        self.parts[p].aging.vclock = vclock.max(cand[0].0);
        let due: Vec<(QueueId, Nanos)> = cand
            .into_iter()
            .map(|e| (e.3, self.queues.get(&e.3).map_or(now, |q| q.since)))
            .collect();
        let mut billed: Vec<(VmId, Nanos)> = Vec::new();
        for &(q, _) in &due {
            if let Some(v) = self.queues.get(&q).map(|q| q.vm) {
                if !billed.iter().any(|e| e.0 == v) {
                    billed.push((v, self.vms.get(&v).map_or(0, |vv| billed_now(vv, now))));
                }
            }
        }
        let part = &mut self.parts[p];
        part.aging.batch_since = Some(now);
        part.aging.batch = due.clone();
        part.aging.batch_billed = billed;
        for (q, _) in due {
            self.stats.boosts += 1;
            if let Some(vm) = self.queues.get(&q).map(|r| r.vm) {
                if let Some(v) = self.vms.get_mut(&vm) {
                    v.stats.aging_boosts += 1;
                    // Said where it is counted: one notice per boost.
                    self.notice(SchedNotice::Aged { queue: q, vm });
                }
            }
            self.rekey(q, |q| q.boosted = true);
        }
        // A demand-limited higher VM already busy: the batch pauses at once
        // (its yield allowance is charged as for any pause).
        self.aging_yield(p);
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
            let spent = part
                .aging
                .yielded
                .saturating_add(now.saturating_sub(ps))
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
    /// that switch, not with a short save of other work seen last).
    fn pause_switch(&self, p: &Partition) -> Nanos {
        p.aging
            .batch
            .iter()
            .filter_map(|e| self.queues.get(&e.0))
            .map(|q| q.restore_ns)
            .fold(p.aging.save_ns, Nanos::max)
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
    fn yield_backlogged(&self, vm: VmId) -> bool {
        self.vms.get(&vm).is_some_and(|v| {
            v.demand > 0 && self.now.saturating_sub(v.demanding_since) > AGING_YIELD_NS
        })
    }

    /// When partition `p`'s pause must end at the latest (its yield
    /// allowance runs out, or a VM it yields to becomes backlogged), for
    /// the timer.
    fn yield_due(&self, p: &Partition, paused_since: Nanos) -> Nanos {
        // One save and restore is kept in reserve whether or not the
        // batch's work was saved yet (see `aging_yield`).
        let switch = self.pause_switch(p);
        let left = AGING_YIELD_NS
            .saturating_sub(p.aging.yielded)
            .saturating_sub(switch);
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
    pub(super) fn aging_due(&self, p: &Partition) -> Option<Nanos> {
        if let Some(start) = p.aging.batch_since {
            if let Some(ps) = p.aging.paused_since {
                return Some(self.yield_due(p, ps));
            }
            return Some(
                start
                    .saturating_add(AGING_BATCH_NS)
                    .saturating_add(p.aging.yielded),
            );
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
