//! Control operations (docs/scheduling.md): VMs and queues added and
//! removed, live priority, weight, policy and tunable changes, operator
//! pause and per-VM slices. They only change state; decisions follow at the
//! next event.

use super::*;

impl Scheduler {
    /// Adds a VM; returns its partition.
    pub fn add_vm(&mut self, vm: VmId, params: VmParams) -> Result<u32, SchedError> {
        if self.vms.contains_key(&vm) {
            return Err(SchedError::DuplicateVm(vm));
        }
        check_params(&params, self.partitions())?;
        let partition = params.partition.unwrap_or_else(|| {
            (0..self.parts.len())
                .min_by_key(|&i| (self.parts[i].vms, i))
                .unwrap_or(0) as u32
        });
        self.parts[partition as usize].vms += 1;
        self.vms.insert(
            vm,
            Vm {
                params,
                partition,
                queues: BTreeSet::new(),
                stats: VmStats::default(),
                active: 0,
                active_since: 0,
                busy: 0,
                vtime: VT_BASE,
                vt_key: None,
                entered: 0,
                idle_at: 0,
                gap_ewma: 0,
                wake: Default::default(),
                demanding_since: 0,
                request_ewma: 0,
                gpu_at_wake: 0,
                cycle_use: Default::default(),
                gaps: Default::default(),
                demand: 0,
                demand_idle_at: None,
                added_at: self.now,
                removed: false,
                ready: BTreeSet::new(),
                running: BTreeSet::new(),
                paused: false,
                quantum_ns: None,
                running_n: 0,
                aged_tag: 0,
                bill_from: Nanos::MAX,
                wait_save: false,
                wait_billed_until: 0,
            },
        );
        Ok(partition)
    }

    /// Removes a VM and all its queues (mapped ones are reset-unmapped; the
    /// VM is gone once they are).
    pub fn remove_vm(&mut self, vm: VmId) -> Result<(), SchedError> {
        let v = self.vms.get_mut(&vm).ok_or(SchedError::NoVm(vm))?;
        v.removed = true;
        let qs: Vec<QueueId> = v.queues.iter().copied().collect();
        for q in qs {
            self.remove_queue(q)?;
        }
        self.drop_vm_if_done(vm);
        Ok(())
    }

    /// Adds an idle queue of `vm` with queue priority `prio` (0..=15, KFD's
    /// queue priority). It orders (and preempts) queues of the same VM only:
    /// between VMs, VM priority and weight decide.
    pub fn add_queue(&mut self, vm: VmId, queue: QueueId, prio: u8) -> Result<(), SchedError> {
        if prio > MAX_PRIORITY {
            return Err(SchedError::Priority(prio));
        }
        if self.queues.contains_key(&queue) {
            return Err(SchedError::DuplicateQueue(queue));
        }
        let v = self
            .vms
            .get_mut(&vm)
            .filter(|v| !v.removed)
            .ok_or(SchedError::NoVm(vm))?;
        v.queues.insert(queue);
        self.queues.insert(
            queue,
            Queue {
                vm,
                prio,
                state: QueueState::Idle,
                since: self.now,
                slot: None,
                key: 0,
                wptr: None,
                boosted: false,
                doorbell_while_unmapping: false,
                save_wait: None,
                save_wait_held: None,
                reason: None,
                errored: false,
                restore_ns: 0,
                wants: false,
            },
        );
        Ok(())
    }

    /// Removes a queue. A mapped queue is first dequeued (RESET_WAVES: its
    /// work is abandoned); it disappears at its `Unmapped` event.
    pub fn remove_queue(&mut self, queue: QueueId) -> Result<(), SchedError> {
        let q = self.queues.get(&queue).ok_or(SchedError::NoQueue(queue))?;
        match q.state {
            QueueState::Running | QueueState::MappedIdle => {
                self.unmap(queue, DequeueMode::ResetWaves, Reason::Remove);
            }
            QueueState::Preempting => {
                self.queues.get_mut(&queue).unwrap().reason = Some(Reason::Remove);
            }
            _ => self.forget_queue(queue),
        }
        Ok(())
    }

    /// Changes a VM's priority (applies at the next event).
    pub fn set_vm_priority(&mut self, vm: VmId, priority: u8) -> Result<(), SchedError> {
        if priority > MAX_PRIORITY {
            return Err(SchedError::Priority(priority));
        }
        self.rekey_vm(vm, |v| v.params.priority = priority)
    }

    /// Changes a queue's own priority (0..=15; orders queues within its VM;
    /// applies at the next event). KFD's UPDATE_QUEUE does this on bare metal.
    pub fn set_queue_priority(&mut self, queue: QueueId, prio: u8) -> Result<(), SchedError> {
        if prio > MAX_PRIORITY {
            return Err(SchedError::Priority(prio));
        }
        if !self.queues.contains_key(&queue) {
            return Err(SchedError::NoQueue(queue));
        }
        self.rekey(queue, |q| q.prio = prio);
        Ok(())
    }

    /// Changes a VM's weight (applies at the next event).
    pub fn set_vm_weight(&mut self, vm: VmId, weight: u32) -> Result<(), SchedError> {
        if !WEIGHT_RANGE.contains(&weight) {
            return Err(SchedError::Weight(weight));
        }
        let now = self.now;
        let v = self.vms.get_mut(&vm).ok_or(SchedError::NoVm(vm))?;
        if v.active > 0 {
            charge(v, now, self.cfg.policy);
        }
        let old = v.params.weight.max(1) as i128;
        v.params.weight = weight;
        // The busy levels' weight sums follow the VM's weight.
        let p = &mut self.parts[v.partition as usize];
        let levels: Vec<u16> = p
            .busy
            .iter()
            .filter(|(_, m)| m.contains_key(&vm))
            .map(|(l, _)| *l)
            .collect();
        for l in levels {
            p.busy.add_weight(l, weight.max(1) as i128 - old);
        }
        self.sync_vt(vm);
        Ok(())
    }

    /// Changes the policy (applies at the next event; mapped queues stay
    /// mapped until the new policy decides otherwise).
    pub fn set_policy(&mut self, policy: Policy) {
        let ids: Vec<QueueId> = self.sorted_queue_ids();
        for &q in &ids {
            self.unindex(q);
        }
        self.cfg.policy = policy;
        for p in &mut self.parts {
            p.owner = None;
        }
        for &q in &ids {
            self.index(q);
        }
    }

    /// Replaces the tunables (applies at the next event).
    pub fn set_config(&mut self, cfg: SchedConfig) -> Result<(), SchedError> {
        cfg.validate()?;
        let policy = cfg.policy;
        // Boost deadlines in the aging index depend on `aging_ns`.
        let ids: Vec<QueueId> = self.sorted_queue_ids();
        for &q in &ids {
            self.unindex(q);
        }
        self.cfg = SchedConfig {
            policy: self.cfg.policy,
            ..cfg
        };
        for &q in &ids {
            self.index(q);
        }
        if policy != self.cfg.policy {
            self.set_policy(policy);
        }
        Ok(())
    }

    /// Pauses (`true`) or resumes (`false`) a VM. A paused VM's queues are
    /// never picked; its mapped queues are unmapped at once with SaveWaves
    /// (CWSR: their work resumes exactly where it stopped, whatever the
    /// policy), idle mapped ones are drained. Doorbells are still recorded,
    /// so the work submitted meanwhile runs after [`resume`](Self::set_vm_paused).
    /// Resuming makes its waiting queues eligible again (their wait starts
    /// at the resume: time paused does not count towards aging) and applies
    /// at the next event. Setting the current state again changes nothing.
    pub fn set_vm_paused(&mut self, vm: VmId, paused: bool) -> Result<(), SchedError> {
        let v = self.vms.get(&vm).ok_or(SchedError::NoVm(vm))?;
        if v.paused == paused {
            return Ok(());
        }
        let qs: Vec<QueueId> = v.queues.iter().copied().collect();
        let part = v.partition as usize;
        for &q in &qs {
            self.unindex(q);
        }
        let now = self.now;
        self.vms.get_mut(&vm).unwrap().paused = paused;
        if !paused {
            for &q in &qs {
                let qq = self.queues.get_mut(&q).unwrap();
                if matches!(qq.state, QueueState::Ready | QueueState::Saved) {
                    qq.since = now;
                }
            }
        }
        for &q in &qs {
            self.index(q);
        }
        self.sync_vt(vm);
        if paused {
            let p = &mut self.parts[part];
            if p.owner.is_some_and(|o| o.vm == vm) {
                p.owner = None;
            }
            if p.parked.is_some_and(|k| k.vm == vm) {
                p.parked = None;
            }
            p.woken.retain(|w| *w != vm);
            for q in qs {
                match self.queues[&q].state {
                    QueueState::Running => self.unmap(
                        q,
                        DequeueMode::SaveWaves,
                        Reason::Preempt(
                            DequeueMode::SaveWaves,
                            Cause::new(None, PreemptReason::Paused),
                        ),
                    ),
                    QueueState::MappedIdle => self.evict(q),
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Is the VM paused (`None`: no such VM)?
    pub fn vm_paused(&self, vm: VmId) -> Option<bool> {
        self.vms.get(&vm).map(|v| v.paused)
    }

    /// Overrides the VM's slice length (`Some(ns)`, at least 1 ns; the
    /// minimum run still applies) or returns it to its level's quantum
    /// (`None`). Applies at the next event.
    pub fn set_vm_quantum(&mut self, vm: VmId, quantum: Option<Nanos>) -> Result<(), SchedError> {
        let v = self.vms.get_mut(&vm).ok_or(SchedError::NoVm(vm))?;
        v.quantum_ns = quantum.map(|q| q.max(1));
        Ok(())
    }

    /// The VM's slice override (`None`: the level's quantum, or no such VM).
    pub fn vm_quantum(&self, vm: VmId) -> Option<Nanos> {
        self.vms.get(&vm).and_then(|v| v.quantum_ns)
    }

    /// Forgets the write index last seen for `queue`, so that its next
    /// doorbell counts as new work even with the same write index. For a
    /// queue that went idle stalled (write index ahead of an unpublished
    /// packet): the guest publishes the packet and rings again with the same
    /// index. Unknown queues are ignored.
    pub fn forget_doorbell(&mut self, queue: QueueId) {
        if let Some(q) = self.queues.get_mut(&queue) {
            q.wptr = None;
        }
    }
}
