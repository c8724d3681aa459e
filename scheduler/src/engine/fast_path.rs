//! Split decisions and the doorbell fast path (`Scheduler::handle_split`):
//! a preempting decision hands its unmaps out before the rest of it runs.

use super::*;

impl Scheduler {
    /// Like [`Scheduler::handle`], but a decision that preempts may stop
    /// right after queueing its unmap actions, before the preempted queues'
    /// state changes and the rest of the decision (mapping the winner, the
    /// timer): returns `true` then, and every action queued so far is one
    /// of those unmaps. The caller carries them out (e.g. hands the CWSR
    /// saves to the GPU) and then calls [`Scheduler::resume`], which
    /// queues the rest of the decision's actions; the actions and the
    /// resulting state are exactly those of [`Scheduler::handle`]. Only an
    /// exclusive decision of one partition whose CU sets do not change is
    /// split (a CU change is applied before a decision's unmaps).
    /// Call `resume` before any other call that changes the scheduler
    /// (`handle` and `handle_split` resume a pending decision first).
    pub fn handle_split(&mut self, ev: Event) -> bool {
        self.resume();
        if self.doorbell_fast_path(ev) {
            return true;
        }
        self.split = Some(None);
        self.handle_event(ev);
        match self.split.take() {
            Some(Some(rest)) => {
                self.split = Some(Some(rest));
                true
            }
            _ => false,
        }
    }

    /// Finishes a decision split by [`Scheduler::handle_split`] (nothing
    /// when none is pending).
    pub fn resume(&mut self) {
        match self.split.take() {
            Some(Some(Split::Tail(rest))) => {
                let p = rest.p;
                self.exclusive_tail(rest);
                self.spatial_sync(p);
                self.arm_timer();
            }
            Some(Some(Split::Doorbell { ev, early, mode })) => {
                let from = self.actions.len();
                self.handle_event(ev);
                for &(queue, slot) in &early {
                    let a = Action::Unmap { queue, slot, mode };
                    match self.actions.iter().skip(from).position(|x| *x == a) {
                        Some(i) => {
                            self.actions.remove(from + i);
                        }
                        None => self.adopt_unmap(queue, mode),
                    }
                }
                self.early_buf = early;
            }
            _ => {}
        }
    }

    /// Doorbell fast path counters.
    pub fn fast_stats(&self) -> FastStats {
        self.fast
    }

    /// An unmap of a mapped queue that the caller handed to the GPU but
    /// no decision queued (the doorbell fast path's, or a binding's armed
    /// doorbell whose decision did not agree; never expected, counted in
    /// [`FastStats::mismatched`]): the queue is being dequeued all the
    /// same, so the scheduler treats it as preempted (CWSR loses nothing;
    /// it runs again when chosen).
    pub fn adopt_unmap(&mut self, q: QueueId, mode: DequeueMode) {
        // Counted, not asserted: a debug-build panic here would take the
        // GPU from the VM whose doorbell it was (tests assert the count).
        self.fast.mismatched += 1;
        if self.queues.get(&q).is_some_and(|qq| {
            qq.slot.is_some() && matches!(qq.state, QueueState::Running | QueueState::MappedIdle)
        }) {
            self.unmap_state(
                q,
                Reason::Preempt(mode, Cause::new(None, PreemptReason::Adopted)),
            );
        }
    }

    /// The doorbell fast path of [`Scheduler::handle_split`]: see
    /// [`Scheduler::doorbell_plan`]. The unmaps are queued without handling
    /// the event (a handful of index reads on a cold cache, against the
    /// whole state change and choice); `resume` handles it. The split
    /// property tests check that the actions and state equal `handle`'s.
    pub(super) fn doorbell_fast_path(&mut self, ev: Event) -> bool {
        let Event::Doorbell { queue, wptr, now } = ev else {
            return false;
        };
        let mut early = std::mem::take(&mut self.early_buf);
        match self.doorbell_plan(queue, now, &mut early) {
            Some(plan) if plan.seen_wptr != Some(wptr) => {
                for &(queue, slot) in &early {
                    self.actions.push_back(Action::Unmap {
                        queue,
                        slot,
                        mode: plan.mode,
                    });
                }
                self.fast.taken += 1;
                self.split = Some(Some(Split::Doorbell {
                    ev,
                    early,
                    mode: plan.mode,
                }));
                true
            }
            _ => {
                self.early_buf = early;
                false
            }
        }
    }

    /// What a doorbell of `queue` at `now` that moves its write index
    /// (anything but [`DoorbellPlan::seen_wptr`]) preempts, when that is
    /// known without handling it: the doorbell makes an idle queue Ready
    /// at a VM priority above every busy level (and above the slice
    /// owner's) of its partition, and nothing else can enter the
    /// exclusive decision (no idle queue due to give its slot back, no
    /// aging due, no CU reservation or co-residence possible (none is
    /// without a slot beside the running lower queues), no action
    /// pending); that decision evicts every running queue of the
    /// partition. Fills `victims` (queue, slot) in the order their unmaps
    /// are queued. The answer holds for doorbells before
    /// [`DoorbellPlan::until`] as long as nothing else reaches the
    /// scheduler; a caller may hand the unmaps to the GPU before handling
    /// the doorbell (the decision then queues the same ones first).
    pub fn doorbell_plan(
        &self,
        queue: QueueId,
        now: Nanos,
        victims: &mut Vec<(QueueId, SlotId)>,
    ) -> Option<DoorbellPlan> {
        victims.clear();
        let now = now.max(self.now);
        if self.split.is_some()
            || !self.ops().fast_path
            || !self.slices()
            || !self.actions.is_empty()
            || !self.spatial.changes.is_empty()
        {
            return None;
        }
        let q = self.queues.get(&queue)?;
        if q.state != QueueState::Idle || q.errored || q.boosted {
            return None;
        }
        let vm = q.vm;
        let v = self.vms.get(&vm)?;
        if v.paused || v.removed {
            return None;
        }
        let level = v.params.priority as u16;
        let p = v.partition as usize;
        let part = self.parts.get(p)?;
        // Time conditions: an idle mapped queue due to give its slot back,
        // or an aging batch due, would enter the decision.
        let idle_due = part.idle_mapped.first().map_or(Nanos::MAX, |&(since, _)| {
            since.saturating_add(self.cfg.idle_unmap_ns)
        });
        let wait_due = part.waiting[..(level as usize).min(16)]
            .iter()
            .filter_map(|w| w.first().map(|e| e.0))
            .min()
            .map_or(Nanos::MAX, |d| d.max(part.aging.next_batch));
        let until = idle_due.min(wait_due);
        if part.top().is_none_or(|t| t >= level)
            || part.owner.is_some_and(|o| o.vm == vm || o.level >= level)
            || part.aging.batch_since.is_some()
            || until <= now
            || part.running.is_empty()
        {
            return None;
        }
        // Without a slot beside the running lower queues no reservation or
        // co-residence serves the doorbell (`spatial_plan`): it preempts.
        let room = self.spatial_room(p, level);
        if self.spatial.enabled() && self.spatial.res.get(p).copied().flatten().is_some() {
            return None;
        }
        if room && self.spatial_on() {
            let owner = SliceOwner {
                vm,
                level,
                since: now,
                drained: None,
                hold: 0,
                cost_held: false,
            };
            if self.spatial_coreside(p, owner)
                || self
                    .spatial
                    .size(
                        vm,
                        1,
                        self.cfg.spatial_headroom_pct,
                        self.cfg.spatial_max_permille,
                    )
                    .is_some()
            {
                return None;
            }
        }
        for &(_, _, r) in &part.running {
            match self.queues.get(&r) {
                Some(rq) if rq.vm != vm && rq.slot.is_some() => victims.push((r, rq.slot?)),
                _ => {
                    victims.clear();
                    return None;
                }
            }
        }
        Some(DoorbellPlan {
            mode: self.preempt_mode(),
            seen_wptr: q.wptr,
            until,
        })
    }

    /// Can a dispatch width noted with [`Scheduler::note_dispatch_width`]
    /// change a decision under the current geometry and configuration?
    /// `false` when spatial sharing is off, no reservation can fit
    /// (`spatial_max_permille` of an XCC is less than one CU) or no
    /// partition has a second slot (nothing can run beside an owner): the caller
    /// may then note widths after the doorbell's decision instead of before.
    pub fn dispatch_width_matters(&self) -> bool {
        let cap = u64::from(self.spatial.cus_per_xcc)
            * u64::from(self.cfg.spatial_max_permille.min(1000))
            / 1000;
        self.spatial.enabled()
            && self.ops().spatial
            && self.slices()
            && self.cfg.spatial_max_permille > 0
            && cap >= 1
            && self.parts.iter().any(|p| p.nslots >= 2)
    }
}
