//! The exclusive decision (docs/scheduling.md, "Exclusive slices"): one
//! VM of the top busy level holds the partition, weighted slices and lag
//! eligibility among equals, displaced owners parked and resumed.

use super::*;

impl Scheduler {
    /// The current policy's row of behaviours.
    pub(super) fn ops(&self) -> &'static PolicyOps {
        self.cfg.policy.ops()
    }

    /// Exclusive per-VM slices at the top level (the default)?
    pub(super) fn slices(&self) -> bool {
        self.cfg.exclusive && !self.cfg.corun_equals
    }

    /// Slice length at a level (VM priority, or the boost level).
    pub(super) fn quantum(&self, level: u16) -> Nanos {
        let q = match self.ops().quantum {
            QuantumRule::Baseline => self.cfg.baseline_quantum_ns,
            // Boosted VMs take turns by whole jobs (the batch ends them).
            QuantumRule::PerLevel if level >= BOOST_LEVEL => AGING_BATCH_NS,
            QuantumRule::PerLevel => self.cfg.quantum_ns[level.min(15) as usize],
        };
        q.max(self.cfg.min_run_ns).max(1)
    }

    pub(super) fn preempt_mode(&self) -> DequeueMode {
        self.ops().preempt
    }

    /// Exclusive slices: one VM at the top busy level holds the partition;
    /// within it, only its highest busy queue priority runs.
    pub(super) fn decide_exclusive(&mut self, p: usize) {
        let now = self.now;
        let top = self.parts[p].top();
        let mut owner = self.parts[p].owner;
        // Anticipation: an owner whose queues drained keeps the partition
        // against its equals and lower levels for a short grace (its next
        // doorbell then needs no CWSR of someone else's work).
        if let Some(o) = owner.as_mut() {
            if self.vm_busy_at(p, o.vm, o.level) {
                self.end_hold(o);
                o.drained = None;
            } else if o.level < BOOST_LEVEL
                && self.vms.contains_key(&o.vm)
                && top.is_none_or(|t| t <= o.level)
            {
                if o.drained.is_none() {
                    o.drained = Some(now);
                    o.hold = self.owner_hold_at_drain(p, o.vm, o.level);
                    o.cost_held = false;
                }
                let d = o.drained.unwrap_or(now);
                let cost = self.cost_hold(p, o);
                if now < d.saturating_add(self.grace(o.vm).max(cost)) {
                    o.cost_held |= cost > 0;
                    self.parts[p].owner = owner;
                    return;
                }
                self.end_hold(o);
            } else if o.drained.is_some() {
                // A higher level ends the hold.
                self.end_hold(o);
            }
        }
        let Some(top) = top else {
            self.parts[p].owner = None;
            self.parts[p].woken.clear();
            return;
        };
        let pol = self.cfg.policy;
        let cands = &self.parts[p].busy[&top];
        let keep = match owner {
            Some(o) if cands.contains_key(&o.vm) => {
                // Same level (or its own level changed): slice until quantum
                // expiry when others wait, or until an equal that woke below
                // its share takes over after the owner's minimum run.
                cands.len() == 1
                    || (now < self.slice_end(p, o, top)
                        && !(now >= o.since.saturating_add(self.waker_hold(p, o, top))
                            && self.lag_waker(p, o, top)))
            }
            // A higher level (or a boost) never waits for a lower owner's
            // minimum run.
            _ => false,
        };
        let owner = if keep {
            let mut o = owner.unwrap();
            if cands.contains_key(&o.vm) {
                o.level = top;
            }
            o
        } else {
            // A lower owner still busy at its level is parked: it resumes
            // the rest of its slice when its level is the top again.
            if let Some(o) = owner {
                if o.level < top && self.vm_busy_at(p, o.vm, o.level) {
                    self.parts[p].parked = Some(Parked {
                        vm: o.vm,
                        level: o.level,
                        used: now.saturating_sub(o.since),
                    });
                }
            }
            let parked = self.parts[p].parked;
            let cands = &self.parts[p].busy[&top];
            let resume = parked.filter(|k| {
                k.level == top
                    && cands.contains_key(&k.vm)
                    && k.used < self.vm_slice(k.vm, top)
                    && !self.parts[p]
                        .woken
                        .iter()
                        .any(|w| *w != k.vm && cands.contains_key(w))
            });
            if parked.is_some_and(|k| k.level >= top) {
                self.parts[p].parked = None;
            }
            if let Some(k) = resume {
                SliceOwner {
                    vm: k.vm,
                    level: top,
                    since: now - k.used,
                    drained: None,
                    hold: 0,
                    cost_held: false,
                }
            } else {
                // Least weighted GPU time wins (stride scheduling). Ties: the
                // current holder loses (equals alternate), then the VM that
                // became busy last wins (one that was idle re-enters at the
                // least virtual time of the busy VMs, less one minimum run,
                // and goes first among them).
                let prev = owner.map(|o| o.vm);
                let prev_since = owner.map(|o| o.since);
                // Equals alternate: the previous holder yields to an equal
                // whose virtual time is within one CWSR save and restore of
                // its own (a few hundred us of CWSR, charged to whoever was
                // mapped, must not hand it a second slice in a row).
                let slack = self.parts[p].aging.save_ns.saturating_mul(2) as u128 * SCALE;
                let cands = &self.parts[p].busy[&top];
                // Boosted (aged) queues are served in the aging server's
                // stride order (least weighted turns, then the higher
                // level, then the oldest: `engine/aging.rs`), at most one
                // batch of them (the partition's slots).
                let oldest_boosted = (top == BOOST_LEVEL)
                    .then(|| {
                        let vclock = self.parts[p].aging.vclock;
                        self.parts[p]
                            .ready
                            .range((Reverse(BOOST_LEVEL), 0, QueueId(0))..)
                            .take_while(|e| e.0 .0 == BOOST_LEVEL)
                            .map(|e| {
                                let vm = self.queues[&e.2].vm;
                                let v = &self.vms[&vm];
                                (v.aged_tag.max(vclock), Reverse(v.params.priority), e.1, vm)
                            })
                            .min()
                            .map(|e| e.3)
                    })
                    .flatten();
                let vm = if let Some(vm) = oldest_boosted {
                    vm
                } else {
                    *cands
                        .keys()
                        .min_by_key(|v| {
                            let vv = &self.vms[v];
                            let held = Some(**v) == prev;
                            // Unweighted: the CWSR noise of a weight-1
                            // equal is as large as anyone's.
                            let slack = if held { slack } else { 0 };
                            // Virtual deadline (EEVDF): its virtual time
                            // plus its request, at most a slice (a VM
                            // whose busy periods are short goes before
                            // equals that would take a whole slice).
                            let q = self.vm_slice(**v, top);
                            let req = match vv.request_ewma {
                                0 => q,
                                r => r.min(q),
                            };
                            let deadline = req as u128 * SCALE / weight(vv, pol);
                            (
                                // A waker under its share by use rate
                                // goes first (it is why the slice ended).
                                !self.use_waker(p, **v, prev_since, top),
                                vtime_now(vv, now, pol)
                                    .saturating_add(slack)
                                    .saturating_add(deadline),
                                held,
                                Reverse(vv.entered),
                                **v,
                            )
                        })
                        .unwrap()
                };
                SliceOwner {
                    vm,
                    level: top,
                    since: now,
                    drained: None,
                    hold: 0,
                    cost_held: false,
                }
            }
        };
        if owner.since == now {
            // A new choice: the woken VMs had their chance.
            let part = &mut self.parts[p];
            part.woken.retain(|w| *w != owner.vm);
            let busy = &part.busy;
            part.woken
                .retain(|w| busy.get(&top).is_some_and(|m| m.contains_key(w)));
        }
        self.parts[p].owner = Some(owner);
        let prev_res = self.spatial.res.get(p).copied().flatten();
        let (res, establish) = self.spatial_plan(p, owner);
        // The one lower level that runs beside the owner, if any.
        let beside = self.spatial_beside_level(p, res, establish, owner);
        // The owner's highest busy queue priority at its level runs.
        let okey = self.vms[&owner.vm]
            .top_key_at(owner.level)
            .unwrap_or(owner.level << 4);
        // Boosted queues of the owner all run, whatever their queue
        // priorities: aging serves the queues that waited, and one of the
        // VM's own higher queues must not keep a boosted lower one waiting.
        let (klo, khi) = if owner.level == BOOST_LEVEL {
            level_keys(BOOST_LEVEL)
        } else {
            (okey, okey)
        };
        // Preempt every running queue that is not the owner's at that key.
        // (In a buffer kept between decisions: no allocation before the
        // preemptions are handed out.)
        let mut evict = std::mem::take(&mut self.evict_buf);
        evict.clear();
        evict.extend(
            self.parts[p]
                .running
                .iter()
                .filter(|(_, _, q)| {
                    let qq = &self.queues[q];
                    (qq.vm != owner.vm || qq.key < klo || qq.key > khi)
                        && !self.spatial_keeps(res, establish, owner, beside, *q)
                        && !self.batch_keeps_holder(res, owner, *q)
                        && !self.rt_pair_keeps(p, res, owner, *q)
                })
                .map(|e| e.2),
        );
        let mode = self.preempt_mode();
        // The preemptions' actions first; their state changes (which this
        // decision reads only through the partition's `freeing` count,
        // in `place` below) follow, here or, for a split decision, in
        // `resume` after the caller handed the unmaps to the GPU.
        for &q in &evict {
            self.unmap_action(q, mode);
        }
        let cont = ExclusiveTail {
            p,
            owner,
            res,
            beside,
            klo,
            khi,
            evict,
            mode,
        };
        // Split only when nothing but these unmaps is queued and the
        // decision changes no CU set (the caller applies CU changes before
        // the actions of a decision: an early unmap must not pass one).
        if self.split.is_some()
            && !cont.evict.is_empty()
            && self.actions.len() == cont.evict.len()
            && self.spatial.changes.is_empty()
            && (!self.spatial.enabled() || (res.is_none() && prev_res.is_none()))
        {
            self.split = Some(Some(Split::Tail(cont)));
            return;
        }
        self.exclusive_tail(cont);
    }

    /// The rest of an exclusive decision after its preemptions' actions
    /// were queued (see [`Scheduler::handle_split`]).
    pub(super) fn exclusive_tail(&mut self, cont: ExclusiveTail) {
        let ExclusiveTail {
            p,
            owner,
            res,
            beside,
            klo,
            khi,
            evict,
            mode,
        } = cont;
        for &q in &evict {
            let cause = self.exclusive_cause(q, owner);
            self.unmap_state(q, Reason::Preempt(mode, cause));
        }
        self.evict_buf = evict;
        // Idle queues of other VMs below the owner's level give their slots
        // back now: a doorbell on a mapped queue starts its work on the GPU
        // at once, and work that may not run would only be saved again
        // (a CWSR for nothing, e.g. a closed loop that re-rings after its
        // boosted job while the next boosted VM runs).
        let idle: Vec<QueueId> = self.parts[p]
            .idle_mapped
            .iter()
            .filter(|(_, q)| {
                let q = &self.queues[q];
                q.vm != owner.vm && lvl(q.key) < owner.level
            })
            .map(|e| e.1)
            .collect();
        for q in idle {
            self.evict(q);
        }
        // Map the owner's waiting queues at that key.
        let want: Vec<QueueId> = self.vms[&owner.vm]
            .ready_in(klo, khi)
            .map(|e| e.2)
            .collect();
        let mut left = want.len();
        for &q in &want {
            if !self.place(p, q, left) {
                break;
            }
            left -= 1;
        }
        self.spatial_beside(p, res, owner, beside);
    }

    /// Why the exclusive decision that gave the partition to `owner`
    /// preempts running queue `q`: a boosted holder is aging, the holder's
    /// own lower queue is queue priority, a lower level is priority, an
    /// equal is its slice.
    fn exclusive_cause(&self, q: QueueId, owner: SliceOwner) -> Cause {
        let why = match self.queues.get(&q) {
            _ if owner.level >= BOOST_LEVEL => PreemptReason::Aging,
            Some(qq) if qq.vm == owner.vm => PreemptReason::QueuePriority,
            Some(qq) if lvl(self.key_of(qq)) < owner.level => PreemptReason::Priority,
            _ => PreemptReason::Slice,
        };
        Cause::new(Some(owner.vm), why)
    }

    /// Maps `q` into a free slot of `p`; else asks an idle queue to give its
    /// slot back (when fewer slots are on their way than `wanted`).
    pub(super) fn place(&mut self, p: usize, q: QueueId, wanted: usize) -> bool {
        if let Some(slot) = self.parts[p].alloc() {
            self.map(q, slot);
            return true;
        }
        if self.parts[p].freeing.len() < wanted {
            if let Some(&(_, idle)) = self.parts[p].idle_mapped.first() {
                self.evict(idle);
            }
        }
        false
    }

    /// Lag-based eligibility among equals (in the style of EEVDF): is there
    /// a VM of the owner's level that woke during the owner's slice and is
    /// behind the owner by at least one minimum run of weighted GPU time?
    /// Such a VM uses less than its share; it takes the partition once the
    /// owner has held it [`Self::lag_hold`], instead of waiting for the
    /// quantum.
    /// (A VM that was idle re-enters at most one minimum run behind the
    /// least busy VM, so it cannot bank more than that; a closed loop that
    /// re-rings within its anticipation grace keeps its virtual time and is
    /// rarely that far behind, so slices among always-busy equals stay
    /// whole.)
    pub(super) fn lag_waker(&self, p: usize, o: SliceOwner, top: u16) -> bool {
        self.lag_ready_at(p, o, top).is_some_and(|t| t <= self.now)
    }

    /// How long an owner holds the partition against an eligible waker of
    /// its level: its minimum run, and at least a quarter of the level's
    /// slice, so wake preemptions cost at most one CWSR save and restore per
    /// quarter slice (a few percent of the partition), and an owner whose
    /// job is shorter than that finishes it first.
    pub(super) fn lag_hold(&self, level: u16) -> Nanos {
        (self.quantum(level) / 4).max(self.cfg.min_run_ns)
    }

    /// When the first woken VM becomes eligible against the owner (see
    /// [`Self::lag_waker`]): the owner's virtual time grows while it runs.
    /// `None`: no woken VM can be.
    pub(super) fn lag_ready_at(&self, p: usize, o: SliceOwner, top: u16) -> Option<Nanos> {
        if top >= BOOST_LEVEL || o.level != top || !self.ops().by_priority {
            return None;
        }
        let pol = self.cfg.policy;
        let now = self.now;
        let ov = self.vms.get(&o.vm)?;
        // Only an owner that has been demanding for a while: one that woke
        // recently is probably demand-limited itself (its job ends soon,
        // and preempting it would only add a CWSR to both).
        let owner_vt = vtime_now(ov, now, pol);
        let cands = self.parts[p].busy.get(&top)?;
        self.parts[p]
            .woken
            .iter()
            .filter(|w| **w != o.vm && cands.contains_key(*w))
            .filter_map(|w| {
                let v = self.vms.get(w)?;
                // Only a VM that woke during this slice, against an owner
                // that was already demanding when it went idle
                // (`waker_may_preempt`). (A waker under its share by use
                // rate that became busy in the same ns as the choice was
                // not passed over by it: the choice puts such a waker
                // first, `use_waker`.)
                if !waker_may_preempt(v, ov, o) {
                    return None;
                }
                let same_ns = v.entered == o.since;
                // Under its share by use rate (`use_rate.rs`): eligible
                // whatever its virtual time says.
                if self.under_share_by_use(p, *w, top) {
                    return Some(now);
                }
                if same_ns {
                    return None;
                }
                let allow = self.cfg.min_run_ns as u128 * SCALE / weight(v, pol);
                let need = vtime_now(v, now, pol).saturating_add(allow);
                if need <= owner_vt {
                    return Some(now);
                }
                if ov.active == 0 {
                    return None;
                }
                let ns = (need - owner_vt)
                    .saturating_mul(weight(ov, pol))
                    .div_ceil(SCALE);
                Some(now.saturating_add(ns.min(u64::MAX as u128) as u64))
            })
            .min()
    }

    /// How long owner `o` holds the partition against the eligible wakers
    /// of its level: [`Self::lag_hold`], or nothing against a waker under
    /// its share even with one switch per cycle counted as its use
    /// ([`Self::switch_waker`]).
    pub(super) fn waker_hold(&self, p: usize, o: SliceOwner, top: u16) -> Nanos {
        let hold = self.lag_hold(top);
        // Past the hold nothing is asked (no walk of the wakers).
        if self.now >= o.since.saturating_add(hold) || !self.switch_waker(p, o, top) {
            hold
        } else {
            0
        }
    }

    pub(super) fn vm_busy_at(&self, p: usize, vm: VmId, level: u16) -> bool {
        self.parts[p]
            .busy
            .get(&level)
            .is_some_and(|m| m.contains_key(&vm))
    }

    /// Slice length of `vm` at `level`: its override (not below the minimum
    /// run) or the level's quantum. Boosted queues keep the boost length.
    pub(super) fn vm_slice(&self, vm: VmId, level: u16) -> Nanos {
        match self.vms.get(&vm).and_then(|v| v.quantum_ns) {
            Some(q) if level < BOOST_LEVEL => q.max(self.cfg.min_run_ns).max(1),
            _ => self.quantum(level),
        }
    }

    /// Round-robin slice of a running queue (fifo): its VM's override or
    /// the baseline quantum.
    pub(super) fn queue_slice(&self, q: QueueId) -> Nanos {
        match self.queues.get(&q) {
            Some(qq) => self.vm_slice(qq.vm, 0),
            None => self.quantum(0),
        }
    }
}

/// May `v`, woken at the owner's level, preempt owner `ov`'s slice `o`?
/// Only a VM that woke during this slice (one that was already waiting
/// when the owner was chosen lost the choice fairly), and only against an
/// owner that was already demanding when the waker went idle: one that
/// became busy after that is as demand-limited as the waker (preempting it
/// would only add a CWSR to both). A closed loop re-ringing within its
/// grace has been demanding since its first job. A VM in its first busy
/// period never went idle (`idle_at` is no time of its): it has had no GPU
/// time at all, so it is below its share by definition against any owner
/// that has, and the virtual-time test decides (issue 18: the first job of
/// a light VM waited for the slice end of an equal that became busy a few
/// us after the light VM was added).
pub(super) fn waker_may_preempt(v: &Vm, ov: &Vm, o: SliceOwner) -> bool {
    v.entered >= o.since && !(v.demand_idle_at.is_some() && ov.demanding_since > v.idle_at)
}
