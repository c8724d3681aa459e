//! Map and unmap: the load of a queue (with the restore of its saved
//! state), the three dequeue modes (DrainPipe, SaveWaves, ResetWaves),
//! the modelled save time, and the write of the records when a dequeue
//! finishes. The record format is `cwsr.rs`.

use super::*;

impl SimGpu {
    /// Loads a queue ([`PhysGpu::map`]): admission, the write index at the
    /// poll address, the restore of saved state.
    pub(super) fn map_queue(&mut self, now: Nanos, req: MapRequest) -> Result<(), GpuError> {
        self.run_until(now);
        let now = self.now; // behind `now` only when over the event budget
        let s = req.slot.0;
        let slot = self
            .slots
            .get(s as usize)
            .ok_or(GpuError::NoSuchSlot(req.slot))?;
        if slot.is_some() {
            return Err(GpuError::SlotBusy(req.slot));
        }
        crate::admission::check_mqd(&self.topo, &req.mqd, &*req.mem).map_err(GpuError::BadMqd)?;
        let rptr = req
            .mqd
            .read_index()
            .ok_or(GpuError::BadMqd(QueueErrorReason::BadPointers))?;
        let gen = self.next_gen;
        self.next_gen += 1;
        self.stats.maps += 1;
        let mut q = Hqd {
            tag: req.tag,
            gen,
            ring_packets: req.mqd.ring_packets(),
            wptr: req.mqd.write_index(),
            rptr,
            mqd: req.mqd,
            mem: req.mem,
            state: HState::Active,
            active: VecDeque::new(),
            resume: VecDeque::new(),
            inflight: 0,
            held_cus: 0,
            poll_armed: false,
            idle_reported: false,
            blocked: false,
            stall_polls: 0,
            barrier_blocked: false,
            refused_at_map: false,
            unmap_req: None,
            save_waiting: false,
            save_wait_ns: 0,
            wait_cus: 0,
            wait_mark: 0,
            wait_cu_ns: 0,
            guest_mask: None,
            host_mask: self.next_map_mask.take(),
            mask: None,
            saved_guests: 0,
        };
        let cus = self.topo.cus_per_partition();
        let guest = CuMask::from_mqd(
            &q.mqd,
            self.topo.cus_per_xcc,
            self.topo.ses_per_xcc,
            self.topo.xccs_per_partition(),
        );
        q.guest_mask = (guest.count() < cus).then_some(guest);
        q.mask = effective_mask(q.guest_mask.as_ref(), q.host_mask.as_ref());
        q.mqd.dw[mqd::CP_HQD_ACTIVE] = 1;
        q.mqd.dw[mqd::CP_HQD_DEQUEUE_REQUEST] = 0;
        // Error checks that depend on guest memory contents: queue error, slot taken.
        let mut err = None;
        let pa = q.mqd.wptr_poll_addr();
        if pa != 0 {
            match q.mem.read_u64(pa) {
                Ok(w) if w >= q.wptr => q.wptr = w,
                Ok(w) => {
                    err = Some(QueueErrorReason::WptrBackwards {
                        old: q.wptr,
                        new: w,
                    })
                }
                Err(_) => err = Some(QueueErrorReason::PointerAddrOutOfRange { addr: pa }),
            }
        }
        if err.is_none() && q.wptr > wptr_limit(q.rptr, q.ring_packets) {
            err = Some(QueueErrorReason::WptrBeyondRing {
                wptr: q.wptr,
                rptr: q.rptr,
                size: q.ring_packets,
            });
        }
        let mut restore_ns = None;
        if err.is_none() && q.mqd.has_saved_state() {
            match cwsr::read_save(&mut q, &self.topo, &self.params) {
                Ok(ns) => {
                    self.stats.restores += 1;
                    restore_ns = ns;
                }
                Err(e) => err = Some(e),
            }
        }
        if restore_ns.is_some() {
            q.state = HState::Restoring;
        }
        q.refused_at_map = err.is_some();
        self.slots[s as usize] = Some(q);
        if let Some(e) = err {
            self.fail(s, e);
            return Ok(());
        }
        if let Some(ns) = restore_ns {
            self.stats.restore_ns_total = self.stats.restore_ns_total.saturating_add(ns);
            self.arm(now.saturating_add(ns), Timer::RestoreDone { slot: s, gen });
        } else {
            self.pump_and_dispatch(s);
        }
        Ok(())
    }

    /// Dequeues a queue ([`PhysGpu::unmap`]) in one of the three modes.
    pub(super) fn unmap_queue(
        &mut self,
        now: Nanos,
        slot: SlotId,
        mode: DequeueMode,
    ) -> Result<(), GpuError> {
        self.run_until(now);
        let now = self.now; // behind `now` only when over the event budget
        let s = slot.0;
        let q = self
            .slots
            .get_mut(s as usize)
            .ok_or(GpuError::NoSuchSlot(slot))?;
        let q = q.as_mut().ok_or(GpuError::NotMapped(slot))?;
        match q.state {
            // A reset ends a drain or save that does not finish (the
            // caller's preemption timeout): it kills the waves still running.
            HState::Unmapping { mode: m, .. }
                if mode == DequeueMode::ResetWaves && m != DequeueMode::ResetWaves =>
            {
                q.save_waiting = false;
                self.stats.escalated_resets += 1;
            }
            HState::Unmapping { .. } => return Err(GpuError::AlreadyUnmapping(slot)),
            HState::Error(_) => {
                q.unmap_req = Some((mode, now));
                q.active.clear();
                q.resume.clear();
                // A run-time error drops the queue's unread packets (the
                // write-back reads rptr = wptr). A load refused at the map
                // (the queue never ran: a record or write index changed
                // after the front end accepted the load) keeps the read
                // index and control-stack offset it was loaded with, so
                // that a repaired MQD reloads and loses no work.
                if !q.refused_at_map {
                    q.rptr = q.wptr;
                }
                self.finish_unmap(s);
                return Ok(());
            }
            HState::Active | HState::Restoring => {}
        }
        q.mqd.dw[mqd::CP_HQD_DEQUEUE_REQUEST] = mode as u32;
        q.state = HState::Unmapping { mode, since: now };
        q.unmap_req = Some((mode, now));
        let gen = q.gen;
        let p = self.slot_part[s as usize] as usize;
        match mode {
            DequeueMode::DrainPipe => {
                self.stats.drains += 1;
                self.drain_batches(s, gen);
                let q = self.slots[s as usize].as_mut().expect("slot");
                if q.inflight == 0 {
                    self.finish_unmap(s);
                }
            }
            DequeueMode::SaveWaves => {
                self.stats.saves += 1;
                // Batches first: their finished rounds apply, the round in
                // flight becomes saved waves.
                let batch_saved = match self.save_batches(s, gen) {
                    Ok(v) => v,
                    Err(e) => {
                        self.fail(s, e);
                        return Ok(());
                    }
                };
                let q = self.slots[s as usize].as_mut().expect("slot");
                // No allocation and no guest-memory write at the request
                // (the doorbell -> preemption path) beyond the batches' saved
                // list: saved waves go to the front of the restore list in
                // order; the control records are written when the dequeue
                // finishes (`finish_unmap`).
                let mut n = 0u32;
                let mut unsaved = 0u32;
                let mut guests = 0u32;
                for (wi, w) in self.wgs.iter_mut().enumerate() {
                    if w.live && w.slot == s && w.qgen == gen {
                        // Waves of a kernel without a save point keep
                        // running; the save waits for them.
                        let preemptible = q.active.iter().find(|a| a.id == w.id).is_none_or(
                            |a| !matches!(a.work, Work::Dispatch(d) if !d.desc.preemptible()),
                        );
                        if !preemptible {
                            unsaved += 1;
                            continue;
                        }
                        retire_wg(w, wi, &mut self.free_wgs);
                        n += 1;
                        if let Some(a) = q.active.iter_mut().find(|a| a.id == w.id) {
                            a.inflight -= 1;
                        }
                        // A saved guest gives its lane back (only the saved
                        // ones: a guest without a save point keeps running
                        // in its lane, freed when it ends); its waves are
                        // saved with the rest (the work it has left, at its
                        // solo rate).
                        // The work it has left at its solo rate (an owner
                        // beside a guest, or a guest, runs at half rate
                        // until its `shared_until`).
                        if w.guest {
                            guests += 1;
                            release_guest(&mut self.parts[p], w.cu, s);
                        }
                        let remaining = occupancy::solo_left(now, w.end, w.shared_until);
                        let remaining = remaining.max(MIN_WG_NS);
                        // The part done is CU time received (the rest is
                        // credited when the restored workgroup completes).
                        super::credit(&mut self.cu_credit, q.tag, w.work.saturating_sub(remaining));
                        q.resume.push_front(SavedWg {
                            id: w.id,
                            wg: w.wg,
                            remaining,
                        });
                    }
                }
                for sw in batch_saved.into_iter().rev() {
                    q.resume.push_front(sw);
                    n += 1;
                }
                q.resume.make_contiguous()[..n as usize].sort_unstable();
                q.inflight = unsaved;
                // Saved guests held no CU of their own (their lanes are free).
                q.held_cus = n - guests;
                q.saved_guests = guests;
                self.stats.saved_wgs += n as u64;
                if unsaved > 0 {
                    q.save_waiting = true;
                    q.wait_cu_ns = 0;
                    q.wait_mark = now;
                    self.stats.saves_waiting += 1;
                    self.wait_cus_recount(s);
                }
                // Guests beside the saved waves run on alone, and so do
                // owners beside its saved guests.
                self.unshare_guests(p, s);
                self.unshare_owners(p, now.saturating_add(self.topo.cwsr.trap_ns));
                if unsaved > 0 {
                    return Ok(());
                }
                self.arm_save_done(s);
            }
            DequeueMode::ResetWaves => {
                self.stats.resets += 1;
                let mut killed = 0u32;
                // Finished rounds of batches have had their effect.
                for bi in self.slot_batches(s, gen) {
                    let b = self.batches[bi as usize];
                    self.batches[bi as usize].live = false;
                    self.free_batches.push(bi);
                    killed += b.held;
                    let (done, _, _) = b.progress(now);
                    if let Err(e) = self.batch_effects(s, b.id, b.first, b.first + done) {
                        // `fail` frees every CU the slot holds.
                        self.fail(s, e);
                        return Ok(());
                    }
                }
                for (wi, w) in self.wgs.iter_mut().enumerate() {
                    if w.live && w.slot == s && w.qgen == gen {
                        retire_wg(w, wi, &mut self.free_wgs);
                        killed += 1;
                    }
                }
                self.stats.killed_wgs += killed as u64;
                let q = self.slots[s as usize].as_mut().expect("slot");
                // Their CUs are free now: guests beside the killed waves
                // run on alone from now (`unshare_left`, at the dispatch).
                let freed = release_cus(&mut self.parts[p], s, false);
                release_guests(&mut self.parts[p], s);
                // Packets that completed out of order (signal decremented, header
                // INVALID) stay complete: they are kept as Done records, or the
                // CP would refetch an INVALID header at the next map and wait
                // forever. Incomplete dispatches restart from workgroup 0 at the
                // next map; the effects of their finished workgroups apply again.
                let mut dup = 0u64;
                for a in q.active.iter_mut() {
                    a.inflight = 0;
                    a.batch = None;
                    if !a.complete && matches!(a.work, Work::Dispatch(_)) {
                        dup = dup.saturating_add(a.done_wgs);
                        a.next_wg = 0;
                        a.done_wgs = 0;
                    }
                }
                self.stats.duplicate_effects += dup;
                q.resume.clear();
                q.inflight = 0;
                // `release_cus` freed every CU of the slot: those of the
                // killed waves and those a save (escalated to this reset)
                // held for its saved waves.
                q.held_cus = 0;
                self.parts[p].free_cus += freed;
                // Owners beside its killed guests run on alone.
                self.unshare_owners(p, now);
                let t = self.topo.cwsr.trap_ns;
                // The records are written when the dequeue finishes.
                self.arm(now.saturating_add(t), Timer::UnmapDone { slot: s, gen });
                self.dispatch(p as u32);
            }
        }
        Ok(())
    }

    /// SaveWaves: all in-flight waves are saved (or, without a save point,
    /// finished): write the CWSR records and finish after the modelled
    /// save latency.
    pub(super) fn arm_save_done(&mut self, s: u32) {
        let now = self.now;
        let Some(q) = self.slots[s as usize].as_mut() else {
            return;
        };
        if q.save_waiting {
            // The CUs it held up to here (its saved waves' until now).
            q.integrate_wait(now);
        } else {
            q.wait_cu_ns = 0;
        }
        q.save_waiting = false;
        // The wait for waves without a save point, if any, ends here.
        q.save_wait_ns = q
            .unmap_req
            .map_or(0, |(_, since)| now.saturating_sub(since));
        // Every saved workgroup's waves are written, guests' too.
        let (n, gen) = (q.held_cus + std::mem::take(&mut q.saved_guests), q.gen);
        // Sized now, written when the dequeue finishes (`finish_unmap`).
        let bytes = cwsr::save_bytes(q);
        let xccs = self.topo.xccs_per_partition() as u64;
        let busiest = (n as u64).div_ceil(xccs);
        let c = &self.topo.cwsr;
        // Each saved workgroup writes its share of a CU's state (occupancy);
        // the busiest XCC saves ceil(n / XCCs) of the largest.
        let per_wg = saved_state_bytes(q, n as usize, c.wg_state_bytes);
        let live = bytes.saturating_add(busiest.saturating_mul(per_wg));
        let save_ns = c
            .trap_ns
            .saturating_add(live.saturating_mul(1000) / c.save_bytes_per_us);
        self.stats.save_ns_total = self.stats.save_ns_total.saturating_add(save_ns);
        self.arm(
            now.saturating_add(save_ns),
            Timer::UnmapDone { slot: s, gen },
        );
    }

    /// A SaveWaves dequeue of `s` waits for waves without a save point:
    /// integrates the CUs the slot held up to now and counts them again
    /// (called when the wait starts and whenever the slot's CUs come back).
    pub(super) fn wait_cus_recount(&mut self, s: u32) {
        let now = self.now;
        let p = self.slot_part[s as usize] as usize;
        let owned = self.parts[p]
            .cu_owner
            .iter()
            .filter(|&&o| o == s + 1)
            .count() as u32;
        let Some(q) = self.slots[s as usize].as_mut() else {
            return;
        };
        if !q.save_waiting {
            return;
        }
        q.integrate_wait(now);
        q.wait_cus = owned;
    }

    /// The timeout of a dequeue requested with [`PhysGpu::unmap_within`]
    /// came: if it has not finished (and is not already a reset), report it.
    pub(super) fn dequeue_timeout(&mut self, slot: u32, gen: u64) {
        let now = self.now;
        let Some(q) = self.slots[slot as usize].as_ref() else {
            return;
        };
        if q.gen != gen {
            return;
        }
        if let HState::Unmapping { mode, since } = q.state {
            if mode != DequeueMode::ResetWaves {
                self.stats.dequeue_timeouts += 1;
                log::debug!(
                    "queue tag {} slot {slot}: {mode:?} dequeue not finished after {} ns",
                    q.tag,
                    now.saturating_sub(since)
                );
                self.pending.push(GpuEvent::DequeueTimedOut {
                    slot: SlotId(slot),
                    tag: q.tag,
                    mode,
                    waited_ns: now.saturating_sub(since),
                    at: now,
                });
            }
        }
    }

    /// DrainPipe: batches stop at the end of their current round (one not
    /// started gives its CUs back); the rest goes back to the packet.
    ///
    /// A batch below workgroups handed out after it (not its packet's tail)
    /// runs to its end: its workgroups cannot go back to the packet.
    pub(super) fn drain_batches(&mut self, slot: u32, qgen: u64) {
        let now = self.now;
        let p = self.slot_part[slot as usize] as usize;
        let batches = self.slot_batches(slot, qgen);
        let tails = self.tail_flags(slot, &batches);
        for (bi, tail) in batches.into_iter().zip(tails) {
            if !tail {
                continue;
            }
            let b = self.batches[bi as usize];
            let (_, started, _) = b.progress(now);
            let q = self.slots[slot as usize].as_mut().expect("slot");
            let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) else {
                continue;
            };
            if started < b.end {
                a.next_wg = a.next_wg.min(started);
            }
            if now <= b.start {
                a.inflight -= b.held;
                if a.batch == Some(bi) {
                    a.batch = None;
                }
                q.inflight -= b.held;
                let freed = self.release_batch_cus(bi, b.held);
                self.parts[p].free_cus += freed;
                self.batches[bi as usize].live = false;
                self.free_batches.push(bi);
            } else if started < b.end {
                self.batches[bi as usize].cut_at(started);
                self.touch_batch(bi);
            }
        }
        self.flush_batches();
    }

    /// SaveWaves: finished rounds apply their effects; the current round's
    /// workgroups become saved waves (returned); unstarted workgroups go back
    /// to the packet; CUs not running a saved wave are freed at once.
    ///
    /// Unstarted workgroups go back to the packet (its `next_wg` lowered)
    /// only from the packet's tail batches ([`Self::tail_flags`]): a batch
    /// below workgroups handed out after it (the first round of a batch
    /// cut at its start instant, followed by a guest's workgroup and a
    /// later batch) saves them as waves that have not run yet (`remaining`
    /// = a whole workgroup), or the restore would find a saved wave at or
    /// past `next_wg`.
    pub(super) fn save_batches(&mut self, slot: u32, qgen: u64) -> QResult<Vec<SavedWg>> {
        let now = self.now;
        let p = self.slot_part[slot as usize] as usize;
        let mut saved = Vec::new();
        let mut freed = 0;
        let batches = self.slot_batches(slot, qgen);
        let tails = self.tail_flags(slot, &batches);
        for (bi, tail) in batches.into_iter().zip(tails) {
            let b = self.batches[bi as usize];
            self.batches[bi as usize].live = false;
            self.free_batches.push(bi);
            let (done, mut started, into) = b.progress(now);
            let mut unrun = 0;
            if !tail && started < b.end {
                unrun = b.end - started;
                started = b.end;
            }
            let running = (started - b.first - done).min(b.held as u64);
            if let Err(e) = self.batch_effects(slot, b.id, b.first, b.first + done) {
                // `fail` frees the CUs still held by the slot.
                self.parts[p].free_cus += freed;
                return Err(e);
            }
            // The current round's part done is CU time received.
            if let Some(q) = self.slots[slot as usize].as_ref() {
                super::credit(&mut self.cu_credit, q.tag, running.saturating_mul(into));
            }
            // The CUs of the saved waves stay held (by the slot) until the
            // dequeue finishes (`finish_unmap`).
            freed += self.release_batch_cus(bi, b.held - running as u32);
            let q = self.slots[slot as usize].as_mut().expect("slot");
            q.inflight -= b.held;
            if let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) {
                a.inflight -= b.held;
                if started < b.end {
                    // Only the packet's last batch has unstarted workgroups.
                    a.next_wg = a.next_wg.min(started);
                }
                if a.batch == Some(bi) {
                    a.batch = None;
                }
            }
            for wg in b.first + done..started {
                let whole = wg >= started - unrun;
                saved.push(SavedWg {
                    id: b.id,
                    wg,
                    remaining: if whole { b.cost } else { b.cost - into },
                });
            }
        }
        self.parts[p].free_cus += freed;
        Ok(saved)
    }

    pub(super) fn finish_unmap(&mut self, slot: u32) {
        let now = self.now;
        let p = self.slot_part[slot as usize] as usize;
        let Some(mut q) = self.slots[slot as usize].take() else {
            return;
        };
        let freed = release_cus(&mut self.parts[p], slot, true);
        self.parts[p].free_cus += freed;
        let (mode, since) = q.unmap_req.unwrap_or((DequeueMode::DrainPipe, now));
        // The wait's CU-ns as partition time (what its waves held of it).
        let cus = self.parts[p].cu_owner.len().max(1) as u128;
        let held_ns = if q.save_wait_ns > 0 {
            u64::try_from(q.wait_cu_ns / cus).unwrap_or(u64::MAX)
        } else {
            0
        };
        // Before the records trim the window: an unmet barrier at its tail
        // (dropped from the records, refetched at the next map) is no work.
        let had_work = q.has_work();
        if !matches!(q.state, HState::Error(_)) {
            // DrainPipe: partially dispatched packets are kept as control
            // records. ResetWaves: packets that completed out of order are.
            // SaveWaves: the saved waves too (sized at the request).
            if let Err(e) = cwsr::write_save(&mut q, &self.topo) {
                // Cannot happen for a validated topology and MQD unless the
                // memory itself fails; the progress is lost: a queue error.
                log::warn!(
                    "queue tag {} slot {slot} error: writing dequeue records failed: {e}",
                    q.tag
                );
                q.state = HState::Error(e);
                q.mqd.dw[mqd::CP_HQD_CNTL_STACK_OFFSET] = q.mqd.cntl_stack_size();
                self.report_queue_error(slot, q.tag, e);
            }
        }
        q.mqd.dw[mqd::CP_HQD_ACTIVE] = 0;
        q.mqd.dw[mqd::CP_HQD_DEQUEUE_REQUEST] = 0;
        q.mqd.set_read_index(q.rptr);
        q.mqd.set_write_index(q.wptr);
        let has_work = !matches!(q.state, HState::Error(_)) && had_work;
        self.pending.push(GpuEvent::Unmapped {
            slot: SlotId(slot),
            tag: q.tag,
            mode,
            mqd: Box::new(q.mqd.clone()),
            has_work,
            save_ns: now.saturating_sub(since),
            wait_ns: q.save_wait_ns.min(now.saturating_sub(since)),
            wait_held_ns: held_ns.min(q.save_wait_ns.min(now.saturating_sub(since))),
            at: now,
        });
        self.dispatch(p as u32);
    }
}

/// CWSR state bytes of the largest of the first `n` saved workgroups of
/// `q` (`whole`: a whole CU's).
pub(super) fn saved_state_bytes(q: &Hqd, n: usize, whole: u64) -> u64 {
    q.resume
        .iter()
        .take(n)
        .map(|sw| packet_fp(q, sw.id).state_bytes(whole))
        .max()
        .unwrap_or(whole)
}

/// Everything [`SimGpu`]'s `map` refuses a queue for at once, checked
/// without a slot (the front end's load check, [`PhysGpu::load_check`]):
/// the admission rules, the write index at the poll address (readable, not
/// behind the MQD's, at most one ring ahead of the read index: errors 5, 8,
/// 7) and, if the MQD has saved state, its control record (error 18 and the
/// layout errors), read and validated as the restore will.
pub fn validate_load(
    topo: &GpuTopology,
    params: &SimParams,
    m: &V9Mqd,
    mem: &dyn DmaMemory,
) -> Result<(), QueueErrorReason> {
    crate::admission::check_mqd(topo, m, mem)?;
    let rptr = m.read_index().ok_or(QueueErrorReason::BadPointers)?;
    let mut wptr = m.write_index();
    let pa = m.wptr_poll_addr();
    if pa != 0 {
        match mem.read_u64(pa) {
            Ok(w) if w >= wptr => wptr = w,
            Ok(w) => return Err(QueueErrorReason::WptrBackwards { old: wptr, new: w }),
            Err(_) => return Err(QueueErrorReason::PointerAddrOutOfRange { addr: pa }),
        }
    }
    let ring_packets = m.ring_packets();
    if wptr > wptr_limit(rptr, ring_packets) {
        return Err(QueueErrorReason::WptrBeyondRing {
            wptr,
            rptr,
            size: ring_packets,
        });
    }
    if m.has_saved_state() {
        cwsr::parse_save(m, mem, topo, params, rptr, wptr)?;
    }
    Ok(())
}
