//! Slot bookkeeping: maps, unmaps and their completion, the billing of
//! saves (waits for non-preemptible waves, saves in flight) and queues and
//! VMs forgotten.

use super::*;

impl Scheduler {
    pub(super) fn map(&mut self, q: QueueId, slot: SlotId) {
        self.slot_owner[slot.0 as usize] = Some(q);
        self.spatial_on_map(slot);
        let qq = self.queues.get_mut(&q).unwrap();
        qq.slot = Some(slot);
        let vm = qq.vm;
        self.set_state(q, QueueState::Running);
        if let Some(v) = self.vms.get_mut(&vm) {
            v.stats.maps += 1;
        }
        self.stats.maps += 1;
        self.actions.push_back(Action::Map { queue: q, slot });
    }

    pub(super) fn evict(&mut self, q: QueueId) {
        self.stats.evictions += 1;
        self.unmap(q, DequeueMode::DrainPipe, Reason::Evict);
    }

    pub(super) fn unmap(&mut self, q: QueueId, mode: DequeueMode, reason: Reason) {
        self.unmap_action(q, mode);
        self.unmap_state(q, reason);
    }

    /// Queues the unmap action of a mapped queue (first half of
    /// [`Self::unmap`]; it reads nothing the state change writes, so the
    /// action list is the same whichever half runs first).
    pub(super) fn unmap_action(&mut self, q: QueueId, mode: DequeueMode) {
        let slot = self.queues[&q].slot.expect("unmap of an unmapped queue");
        self.actions.push_back(Action::Unmap {
            queue: q,
            slot,
            mode,
        });
    }

    /// The state change and counters of an unmap whose action is queued
    /// (second half of [`Self::unmap`]).
    pub(super) fn unmap_state(&mut self, q: QueueId, reason: Reason) {
        let qq = self.queues.get_mut(&q).unwrap();
        let interrupts = qq.state == QueueState::Running && matches!(reason, Reason::Preempt(..));
        qq.reason = Some(reason);
        qq.doorbell_while_unmapping = false;
        let vm = qq.vm;
        let slot = qq.slot;
        self.set_state(q, QueueState::Preempting);
        if interrupts {
            self.stats.preemptions += 1;
            if let Some(v) = self.vms.get_mut(&vm) {
                v.stats.preemptions += 1;
            }
            // Said here, where it is counted: one notice per preemption.
            if let (Reason::Preempt(_, cause), Some(slot)) = (reason, slot) {
                self.notice(SchedNotice::Preempted {
                    queue: q,
                    vm,
                    slot,
                    by: cause.by,
                    reason: cause.why,
                });
            }
        }
    }

    pub(super) fn finish_unmap(&mut self, q: QueueId, has_work: bool, save_ns: Nanos) {
        let qq = self.queues.get_mut(&q).unwrap();
        let slot = qq.slot.take().unwrap();
        let reason = qq.reason.take();
        let work = has_work || qq.doorbell_while_unmapping;
        let vm = qq.vm;
        let errored = qq.errored;
        self.slot_owner[slot.0 as usize] = None;
        let p = self.slots[slot.0 as usize].partition as usize;
        self.parts[p].free[self.slot_pipe[slot.0 as usize]].insert(slot);
        self.parts[p].nfree += 1;
        if let Some(v) = self.vms.get_mut(&vm) {
            v.stats.save_ns += save_ns;
        }
        // The save, and the restore of a queue with work (charged with the
        // waves still waiting from its last one: `engine/restore_charge.rs`),
        // spend the partition's CWSR budget (`engine/cwsr_budget.rs`).
        let cwsr = if work {
            save_ns.saturating_add(self.restore_charge(q, save_ns))
        } else {
            save_ns
        };
        let now = self.now;
        self.parts[p].cwsr_budget.spend(now, cwsr);
        let wait = if matches!(reason, Some(Reason::Preempt(..))) {
            self.save_wait(p, q, save_ns)
        } else {
            0
        };
        // A reported wait belongs to this dequeue only.
        if let Some(qq) = self.queues.get_mut(&q) {
            qq.save_wait = None;
        }
        if matches!(reason, Some(Reason::Preempt(..))) && has_work {
            let a = &mut self.parts[p].aging;
            a.save_ns = save_ns;
            a.save_clean_ns = save_ns.saturating_sub(wait);
            if save_ns > 0 {
                a.save_ewma = if a.save_ewma == 0 {
                    save_ns
                } else {
                    (a.save_ewma.saturating_mul(3) / 4).saturating_add(save_ns / 4)
                };
            }
        }
        let next = match reason {
            Some(Reason::Remove) => {
                self.set_state(q, QueueState::Idle);
                self.forget_queue(q);
                // A removal can end the last save in flight too: the VMs
                // mapped during it start being billed (else they run
                // unbilled until some later unmap of this partition).
                self.release_save_waiters(p);
                return;
            }
            _ if errored => QueueState::Error,
            Some(Reason::Error) => QueueState::Error,
            _ if !work => QueueState::Idle,
            Some(Reason::Preempt(DequeueMode::SaveWaves, _)) if has_work => QueueState::Saved,
            _ => QueueState::Ready,
        };
        if let Some(qq) = self.queues.get_mut(&q) {
            // The restore is a CWSR restore: as long as the save, without
            // the wait for non-preemptible waves.
            qq.restore_ns = if next == QueueState::Saved {
                save_ns - wait
            } else {
                0
            };
        }
        self.set_state(q, next);
        self.release_save_waiters(p);
    }

    /// A preemption's dequeue of `q` took `save_ns`: the part beyond
    /// [`SAVE_WAIT_FACTOR`] x the partition's typical CWSR save (and
    /// beyond [`SAVE_WAIT_FLOOR_NS`]) is a wait
    /// for the queue's own non-preemptible waves (kernels without a save
    /// point finish their in-flight workgroups first; the flag is
    /// guest-written). That wait is billed to the queue's VM (GPU time and
    /// virtual time, `VmStats::save_wait_ns`) — its waves ran on the GPU —
    /// and, when the VM is below the partition's top level (its work held
    /// higher work off), counted in the aging budget like a batch's cost
    /// (the next batch waits `AGING_SHARE_INV - 1` times it longer).
    /// Returns the wait. Saves within the factor update the typical save
    /// (moving average, 1/4); longer ones never do, so no guest can raise
    /// it by making its saves slow.
    ///
    /// When the backend reported the wait ([`Self::note_save_wait`]: the
    /// simulator does, exactly), that wait is billed whatever its length —
    /// a wait shorter than the threshold goes unbilled otherwise, and a
    /// `no_save_point` VM of small state (saves of a few us) computes in
    /// it unbilled — and the threshold applies to the rest of the dequeue.
    ///
    /// A VM is billed a wait once in wall time: the queues of one
    /// preemption wait together (their waits overlap), so only the part
    /// of a wait after the VM's last billed one is billed, and none while
    /// another of its queues runs (that time is billed already).
    pub(super) fn save_wait(&mut self, p: usize, q: QueueId, save_ns: Nanos) -> Nanos {
        let req = self.now.saturating_sub(save_ns);
        let (reported, held) = self
            .queues
            .get_mut(&q)
            .map(|qq| (qq.save_wait.take(), qq.save_wait_held.take()))
            .unwrap_or((None, None));
        let reported = reported.unwrap_or(0).min(save_ns);
        // What of the reported wait its own waves held of the partition
        // (`None`: the backend cannot tell, all of it, billed in wall time).
        let held = held.map(|h| h.min(reported));
        let whole_ns = save_ns;
        let save_ns = save_ns - reported;
        let a = &mut self.parts[p].aging;
        let typ = a.save_typ;
        let cap = typ.saturating_mul(SAVE_WAIT_FACTOR).max(SAVE_WAIT_FLOOR_NS);
        // The VM's own saves, recorded per queue (what a higher RT waits
        // for: `rt_save_wait`; `engine/queue_save.rs`).
        self.note_queue_save(q, save_ns.min(cap));
        if let Some(vm) = self.queues.get(&q).map(|qq| qq.vm) {
            // ... and the whole save, its waits for waves without a save
            // point included (`engine/nsp_save.rs`).
            self.spatial.waited.note(vm, whole_ns, save_ns.min(cap));
        }
        let a = &mut self.parts[p].aging;
        let beyond = if typ == 0 || save_ns <= cap {
            if save_ns > 0 {
                a.save_high = save_high_after(a.save_high, save_ns);
                a.save_typ = if typ == 0 {
                    save_ns
                } else {
                    (typ.saturating_mul(3) / 4).saturating_add(save_ns / 4)
                };
            }
            0
        } else {
            save_ns - cap
        };
        let wait = reported + beyond;
        if wait == 0 {
            return 0;
        }
        let Some(vm) = self.queues.get(&q).map(|qq| qq.vm) else {
            return wait;
        };
        // Billed in wall time (once, see above): the unreported excess, and
        // the reported wait when its held share is unknown.
        let wall = if held.is_some() { beyond } else { wait };
        let pol = self.cfg.policy;
        let mut below_top = false;
        let mut billed = 0;
        if let Some(v) = self.vms.get_mut(&vm) {
            let end = req.saturating_add(wall);
            if v.running_n == 0 {
                billed = end.saturating_sub(req.max(v.wait_billed_until));
                // Its waves' share of the partition in the wait: CU-ns of
                // different queues are disjoint, so these add up exactly.
                billed = billed.saturating_add(held.unwrap_or(0));
            }
            if wall > 0 {
                v.wait_billed_until = v.wait_billed_until.max(end);
            }
            v.stats.gpu_ns += billed;
            v.stats.save_wait_ns += billed;
            v.vtime += billed as u128 * SCALE / weight(v, pol);
            let level = v.params.priority as u16;
            below_top = self.parts[p].top().is_some_and(|t| t > level);
        }
        self.sync_vt(vm);
        if let Some(h) = held {
            self.bill_free_wait(p, vm, req, reported, h);
        }
        if below_top && self.ops().by_priority {
            let a = &mut self.parts[p].aging;
            a.next_batch = a
                .next_batch
                .max(self.now)
                .saturating_add(billed.saturating_mul(AGING_SHARE_INV - 1));
        }
        wait
    }

    /// The backend reports that the dequeue in flight of `queue` (a
    /// preemption's SaveWaves) waited `wait_ns` for the queue's own waves
    /// without a save point before their save began (call it before the
    /// [`Event::Unmapped`] it is part of; the binding does, from
    /// `GpuEvent::Unmapped::wait_ns`). That wait is billed to the queue's
    /// VM exactly (`VmStats::save_wait_ns`) and counted in the aging
    /// budget. Unknown queues and queues not being dequeued are ignored.
    pub fn note_save_wait(&mut self, queue: QueueId, wait_ns: Nanos) {
        if let Some(q) = self.queues.get_mut(&queue) {
            if q.state == QueueState::Preempting {
                q.save_wait = Some(wait_ns);
                q.save_wait_held = None;
            }
        }
    }

    /// With [`Self::note_save_wait`] (after it): of that wait, the
    /// partition time the queue's waves held (`GpuEvent::Unmapped::
    /// wait_held_ns`: the CU-ns its CUs were held / the partition's CUs).
    /// The VM is billed that share instead of the wait's wall time, and
    /// the rest — CUs its finishing waves gave back — is billed to the VMs
    /// mapped during the save, whose waves had them
    /// ([`Self::bill_free_wait`]). Ignored without a reported wait.
    pub fn note_save_wait_held(&mut self, queue: QueueId, held_ns: Nanos) {
        if let Some(q) = self.queues.get_mut(&queue) {
            if q.state == QueueState::Preempting && q.save_wait.is_some() {
                q.save_wait_held = Some(held_ns);
            }
        }
    }

    /// When no save is in flight in partition `p` any more, the VMs mapped
    /// during those saves start being billed (their waves had no CUs).
    pub(super) fn release_save_waiters(&mut self, p: usize) {
        if self.parts[p].freeing.is_empty() {
            // The period of saves in flight is over: every wait in it is
            // known, its free CUs are billed (`engine/free_wait.rs`).
            self.settle_free_wait(p);
        }
        if !self.parts[p].freeing.is_empty() || self.parts[p].save_waiters.is_empty() {
            return;
        }
        let now = self.now;
        let pol = self.cfg.policy;
        for vm in std::mem::take(&mut self.parts[p].save_waiters) {
            if let Some(v) = self.vms.get_mut(&vm) {
                if v.wait_save && v.active > 0 {
                    // Nothing billed up to now (its waves had no CUs).
                    charge(v, now, pol);
                }
                v.wait_save = false;
                if v.running_n > 0 {
                    v.bill_from = v.bill_from.max(now);
                }
            }
        }
    }

    pub(super) fn forget_queue(&mut self, q: QueueId) {
        self.unindex(q);
        let Some(qq) = self.queues.remove(&q) else {
            return;
        };
        let vm = qq.vm;
        self.spatial.forget_queue_save(vm, q);
        if let Some(v) = self.vms.get_mut(&vm) {
            v.queues.remove(&q);
            if qq.wants {
                v.demand -= 1;
                if v.demand == 0 {
                    v.demand_idle_at = Some(self.now);
                    self.spatial.end_busy(vm);
                }
            }
            if qq.state == QueueState::Running {
                charge(v, self.now, self.cfg.policy);
                v.running_n -= 1;
                if v.running_n == 0 {
                    v.bill_from = Nanos::MAX;
                    if v.wait_save {
                        let p = v.partition as usize;
                        self.parts[p].free_wait.stops(vm, self.now);
                    }
                }
            }
            if matches!(qq.state, QueueState::Running | QueueState::Preempting) {
                v.active -= 1;
                if v.active == 0 {
                    charge(v, self.now, self.cfg.policy);
                }
            }
            if matches!(
                qq.state,
                QueueState::Ready
                    | QueueState::Saved
                    | QueueState::Running
                    | QueueState::Preempting
            ) {
                v.busy -= 1;
            }
        }
        self.drop_vm_if_done(vm);
    }

    pub(super) fn drop_vm_if_done(&mut self, vm: VmId) {
        self.sync_vt(vm);
        if self
            .vms
            .get(&vm)
            .is_some_and(|v| v.removed && v.queues.is_empty())
        {
            let v = self.vms.remove(&vm).unwrap();
            self.parts[v.partition as usize].vms -= 1;
            if let Some(k) = v.vt_key {
                self.parts[v.partition as usize].vt.remove(&(k, vm));
            }
            self.parts[v.partition as usize].woken.retain(|w| *w != vm);
            self.spatial.width.remove(&vm);
            self.spatial.occ.remove(&vm);
            self.spatial.recent.remove(&vm);
            self.spatial.kernels.remove(&vm);
            self.spatial.kernel_costs.remove(&vm);
            self.spatial.forget_saves(vm);
            self.spatial.waited.forget(vm);
            for p in &mut self.parts {
                if p.owner.is_some_and(|o| o.vm == vm) {
                    p.owner = None;
                }
            }
        }
    }
}
