//! Queue states and the indexes every decision reads: per partition and
//! per VM, ready, running and idle-mapped queues, busy counts per level,
//! virtual time, demand and re-ring gaps.

use super::*;

impl Scheduler {
    pub(super) fn set_state(&mut self, q: QueueId, st: QueueState) {
        self.unindex(q);
        let now = self.now;
        let pol = self.cfg.policy;
        let qq = self.queues.get_mut(&q).unwrap();
        let old = qq.state;
        qq.state = st;
        qq.since = now;
        let vm = qq.vm;
        let wants = is_demand(st)
            || (st == QueueState::Preempting && matches!(qq.reason, Some(Reason::Preempt(..))));
        let wanted = std::mem::replace(&mut qq.wants, wants);
        if wants != wanted {
            let g = self.grace(vm);
            let wide = wants && self.holds_wide(vm);
            let co = wants && self.holds_coresidence(vm);
            if let Some(v) = self.vms.get_mut(&vm) {
                if wants {
                    v.demand += 1;
                    if v.demand == 1 {
                        let gap = v.demand_idle_at.map_or(0, |t| now.saturating_sub(t));
                        v.wake.wake(now, gap, wide, co);
                        if let Some(t) = v.demand_idle_at {
                            v.gaps.note(now.saturating_sub(t));
                            v.cycle_use.gap(now.saturating_sub(t));
                        } else {
                            // Its first demand: the idle since it was added
                            // is idle of its first cycle, as its equals'
                            // use meanwhile was theirs (docs/scheduling.md,
                            // "Idle before the first demand").
                            v.cycle_use.gap(now.saturating_sub(v.added_at));
                        }
                        if v.demand_idle_at.is_none_or(|t| now.saturating_sub(t) > g) {
                            // A new busy period (demand after more than its
                            // grace): the last one, brief gaps included, was
                            // one request, billed since the last such wake
                            // (it was billed nothing while idle, and charges
                            // settled after its demand ended still count).
                            // The first has none behind it.
                            let used = v.stats.gpu_ns.saturating_sub(v.gpu_at_wake);
                            if v.demand_idle_at.is_some() {
                                // A cycle ended (use rate, `use_rate.rs`).
                                v.cycle_use.close(used);
                            }
                            v.demanding_since = now;
                            v.request_ewma = if v.request_ewma == 0 {
                                used
                            } else {
                                (v.request_ewma.saturating_mul(3) / 4).saturating_add(used / 4)
                            };
                            v.gpu_at_wake = v.stats.gpu_ns;
                        }
                    }
                } else {
                    v.demand -= 1;
                    if v.demand == 0 {
                        v.demand_idle_at = Some(now);
                        // Nothing of it in flight: its drain bound starts
                        // afresh.
                        self.spatial.end_busy(vm);
                    }
                }
            }
        }
        let active = |s| matches!(s, QueueState::Running | QueueState::Preempting);
        // Demand for the fairness clamp (a queue being dequeued still wants
        // the GPU back).
        let busy = |s| {
            matches!(
                s,
                QueueState::Ready
                    | QueueState::Saved
                    | QueueState::Running
                    | QueueState::Preempting
            )
        };
        let part = self.vms[&vm].partition;
        let mut floor = None;
        let brief = {
            let g = self.grace(vm);
            g > 0 && now.saturating_sub(self.vms[&vm].idle_at) <= g
        };
        if !busy(old) && busy(st) && self.vms[&vm].busy == 0 && !brief {
            // A VM that was idle does not bank credit (one idle no longer
            // than its anticipation grace, e.g. a closed loop between jobs,
            // counts as continuously demanding and keeps its virtual time):
            // start at the least
            // charged virtual time of the busy VMs of its partition.
            // Keys of running VMs lag (charged when they stop): walk the
            // index in key order until no later entry can be lower.
            let mut best: Option<u128> = None;
            for &(key, o) in &self.parts[part as usize].vt {
                if best.is_some_and(|b| key >= b) {
                    break;
                }
                let t = vtime_now(&self.vms[&o], now, pol);
                best = Some(best.map_or(t, |b| b.min(t)));
            }
            floor = best;
        }
        let restore = self.queues[&q].restore_ns;
        let saves_in_flight = !self.parts[part as usize].freeing.is_empty();
        let v = self.vms.get_mut(&vm).unwrap();
        // Billing: only while a queue of the VM is Running, and not during
        // its own restore or another queue's save in flight at its map.
        let running = |s| s == QueueState::Running;
        if running(old) != running(st) {
            if v.active > 0 {
                charge(v, now, pol);
            }
            if running(st) {
                if v.running_n == 0 {
                    let from = if old == QueueState::Saved {
                        now.saturating_add(restore)
                    } else {
                        now
                    };
                    v.bill_from = from;
                    if saves_in_flight {
                        if !v.wait_save {
                            v.wait_save = true;
                            self.parts[part as usize].save_waiters.push(vm);
                        }
                        // Its waves may take the CUs the saves' waits free.
                        self.parts[part as usize].free_wait.runs_from(vm, from);
                    } else {
                        v.wait_save = false;
                    }
                }
                v.running_n += 1;
            } else {
                v.running_n -= 1;
                if v.running_n == 0 {
                    v.bill_from = Nanos::MAX;
                    if v.wait_save {
                        self.parts[part as usize].free_wait.stops(vm, now);
                    }
                }
            }
        }
        let v = self.vms.get_mut(&vm).unwrap();
        if active(old) != active(st) {
            if active(st) {
                if v.active == 0 {
                    v.active_since = now;
                }
                v.active += 1;
            } else {
                v.active -= 1;
                if v.active == 0 {
                    charge(v, now, pol);
                }
            }
        }
        if busy(old) != busy(st) {
            if busy(st) {
                v.busy += 1;
            } else {
                v.busy -= 1;
            }
        }
        let mut woke = false;
        if !busy(old) && busy(st) && v.busy == 1 {
            v.entered = now;
            let gap = now.saturating_sub(v.idle_at);
            v.gap_ewma = (v.gap_ewma.saturating_mul(3) / 4).saturating_add(gap / 4);
            woke = true;
        }
        if busy(old) && !busy(st) && v.busy == 0 {
            v.idle_at = now;
        }
        if let Some(f) = floor {
            // Bounded lag (EEVDF-style, request-sized): it may re-enter
            // behind the least busy VM by one slice of its level, or, when
            // longer, by twice its request (its usual busy period) plus one
            // minimum run — `MAX_LAG_NS` before it has a request, and never
            // more — and never by more than its own virtual time lags (what
            // it did not use of its share so far). So a VM below its share
            // is served ahead of VMs above it (see `lag_waker`) for one
            // whole request, whatever its job size against the quantum, and
            // cannot bank idle time beyond that.
            let slice = self.cfg.quantum_ns[v.params.priority.min(15) as usize];
            let cap = if v.request_ewma == 0 {
                MAX_LAG_NS
            } else {
                v.request_ewma
                    .saturating_mul(2)
                    .saturating_add(self.cfg.min_run_ns)
                    .min(MAX_LAG_NS)
            };
            let allow = slice.max(self.cfg.min_run_ns).max(cap) as u128 * SCALE / weight(v, pol);
            v.vtime = v.vtime.max(f.saturating_sub(allow));
        }
        if woke {
            let w = &mut self.parts[part as usize].woken;
            if !w.contains(&vm) {
                w.push(vm);
            }
        }
        self.sync_vt(vm);
        self.index(q);
    }

    /// Keeps the partition's virtual-time index in step with the VM.
    pub(super) fn sync_vt(&mut self, vm: VmId) {
        let Some(v) = self.vms.get_mut(&vm) else {
            return;
        };
        let want = (v.busy > 0 && !v.paused).then_some(v.vtime);
        if v.vt_key == want {
            return;
        }
        let p = &mut self.parts[v.partition as usize];
        if let Some(k) = v.vt_key {
            p.vt.remove(&(k, vm));
        }
        if let Some(k) = want {
            p.vt.insert((k, vm));
        }
        v.vt_key = want;
    }

    pub(super) fn rekey(&mut self, q: QueueId, f: impl FnOnce(&mut Queue)) {
        self.unindex(q);
        f(self.queues.get_mut(&q).unwrap());
        self.index(q);
    }

    pub(super) fn rekey_vm(&mut self, vm: VmId, f: impl FnOnce(&mut Vm)) -> Result<(), SchedError> {
        let qs: Vec<QueueId> = self
            .vms
            .get(&vm)
            .ok_or(SchedError::NoVm(vm))?
            .queues
            .iter()
            .copied()
            .collect();
        for &q in &qs {
            self.unindex(q);
        }
        f(self.vms.get_mut(&vm).unwrap());
        for &q in &qs {
            self.index(q);
        }
        Ok(())
    }

    /// Index key of a queue: `level << 4 | queue priority`, where the level
    /// is its VM's priority ([`BOOST_LEVEL`] while aged). Levels order
    /// queues across VMs; the low bits only order queues of one VM.
    pub(super) fn key_of(&self, q: &Queue) -> u16 {
        if !self.ops().by_priority {
            return 0;
        }
        let level = if q.boosted {
            BOOST_LEVEL
        } else {
            self.vms.get(&q.vm).map_or(0, |v| v.params.priority) as u16
        };
        (level << 4) | q.prio as u16
    }

    pub(super) fn partition_of(&self, q: QueueId) -> Option<usize> {
        let vm = self.queues.get(&q)?.vm;
        self.vms.get(&vm).map(|v| v.partition as usize)
    }

    pub(super) fn index(&mut self, q: QueueId) {
        let key = self.key_of(&self.queues[&q]);
        let level = lvl(key);
        let qq = self.queues.get_mut(&q).unwrap();
        qq.key = key;
        let (st, since, vm, boosted) = (qq.state, qq.since, qq.vm, qq.boosted);
        let v = self.vms.get_mut(&vm).unwrap();
        if v.paused && is_demand(st) {
            // A paused VM's demand is invisible to every decision.
            return;
        }
        let p = &mut self.parts[v.partition as usize];
        match st {
            QueueState::Ready | QueueState::Saved => {
                p.ready.insert((Reverse(level), since, q));
                v.ready.insert((Reverse(key), since, q));
                if !boosted && level < BOOST_LEVEL {
                    p.waiting[level as usize]
                        .insert((since.saturating_add(age_wait(&self.cfg, level)), q));
                }
            }
            QueueState::Running => {
                p.running.insert((level, since, q));
                v.running.insert((key, since, q));
            }
            QueueState::MappedIdle => {
                p.idle_mapped.insert((since, q));
            }
            QueueState::Preempting => {
                p.freeing.insert(q);
            }
            QueueState::Idle | QueueState::Error => {}
        }
        if matches!(
            st,
            QueueState::Ready | QueueState::Saved | QueueState::Running
        ) {
            let c = p.busy.entry(level).or_default().entry(vm).or_default();
            *c += 1;
            if *c == 1 {
                p.busy.add_weight(level, v.params.weight.max(1) as i128);
            }
        }
    }

    pub(super) fn unindex(&mut self, q: QueueId) {
        let Some(qq) = self.queues.get(&q) else {
            return;
        };
        let (key, st, since, vm) = (qq.key, qq.state, qq.since, qq.vm);
        let level = lvl(key);
        let Some(v) = self.vms.get_mut(&vm) else {
            return;
        };
        if v.paused && is_demand(st) {
            return;
        }
        let p = &mut self.parts[v.partition as usize];
        match st {
            QueueState::Ready | QueueState::Saved => {
                p.ready.remove(&(Reverse(level), since, q));
                v.ready.remove(&(Reverse(key), since, q));
                if level < BOOST_LEVEL {
                    p.waiting[level as usize]
                        .remove(&(since.saturating_add(age_wait(&self.cfg, level)), q));
                }
            }
            QueueState::Running => {
                p.running.remove(&(level, since, q));
                v.running.remove(&(key, since, q));
            }
            QueueState::MappedIdle => {
                p.idle_mapped.remove(&(since, q));
            }
            QueueState::Preempting => {
                p.freeing.remove(&q);
            }
            QueueState::Idle | QueueState::Error => {}
        }
        if matches!(
            st,
            QueueState::Ready | QueueState::Saved | QueueState::Running
        ) {
            let mut left = false;
            if let Some(m) = p.busy.get_mut(&level) {
                if let Some(c) = m.get_mut(&vm) {
                    *c -= 1;
                    if *c == 0 {
                        m.remove(&vm);
                        left = true;
                    }
                }
                if m.is_empty() {
                    p.busy.remove(&level);
                }
            }
            if left {
                p.busy.add_weight(level, -(v.params.weight.max(1) as i128));
            }
        }
    }

    pub(super) fn sorted_queue_ids(&self) -> Vec<QueueId> {
        let mut v: Vec<QueueId> = self.queues.keys().copied().collect();
        v.sort();
        v
    }
}
