//! Batches: a packet's uniform workgroups run in lock-step rounds on
//! a set of CUs at O(1) host events per batch; their start, growth,
//! cut, last-round shrink and completion.

use super::*;

/// Workgroups at least this long (ns): a CU handed to a running batch starts
/// at once instead of at the batch's next round boundary.
const JOIN_NOW_NS: u64 = 10_000;

impl Batch {
    pub(super) fn len(&self) -> u64 {
        self.end - self.first
    }
    pub(super) fn rounds(&self) -> u64 {
        self.len().div_ceil(self.width.max(1) as u64)
    }
    /// Its rounds' length alone (ns): the most guests can delay it
    /// (sharing at most halves its rate).
    pub(super) fn solo_len(&self) -> Nanos {
        self.rounds().saturating_mul(self.cost)
    }
    /// Stops it after workgroup `started` (the end of its current round),
    /// its rest leaving its CUs (guests elsewhere, a mask, the rebalance,
    /// an unmap): the delay guests caused is kept up to its new length
    /// alone, the most sharing can cost it.
    pub(super) fn cut_at(&mut self, started: u64) {
        self.end = started;
        self.shifted = self.shifted.min(self.solo_len());
    }
    /// When its last round ends: its rounds, then the delay guests caused
    /// (`shifted`; which workgroups have started stays as the rounds say).
    pub(super) fn finish(&self) -> Nanos {
        self.start
            .saturating_add(self.rounds().saturating_mul(self.cost))
            .saturating_add(self.shifted)
    }
    /// Workgroups of the last round.
    pub(super) fn last_round(&self) -> u64 {
        self.len() - (self.rounds() - 1) * self.width as u64
    }
    /// The first workgroup not started once the round under way at `now`
    /// has launched (at or before `start`: the first round's workgroups).
    pub(super) fn started_by(&self, now: Nanos) -> u64 {
        if now <= self.start {
            self.first + (self.width as u64).min(self.len())
        } else {
            self.progress(now).1
        }
    }

    /// At `now`: (workgroups finished, first workgroup not started, ns into
    /// the current round). Nothing has started while `now <= start`.
    pub(super) fn progress(&self, now: Nanos) -> (u64, u64, Nanos) {
        if now <= self.start {
            return (0, self.first, 0);
        }
        let mut el = now - self.start;
        // Guests' delay (`shifted`) stretches the last round: it ends at
        // `finish()`, and its workgroups count as running until then.
        let last = self
            .rounds()
            .saturating_sub(1)
            .saturating_mul(self.cost.max(1));
        if self.shifted > 0 && el > last {
            let span = self.cost.max(1).saturating_add(self.shifted);
            let x = (el - last).min(span);
            let c = self.cost.max(1);
            // In u64 where the product fits (the same quotient).
            el = last
                + match x.checked_mul(c) {
                    Some(m) => m / span,
                    None => (x as u128 * c as u128 / span as u128) as u64,
                };
        }
        let d = el / self.cost.max(1);
        let w = self.width as u64;
        let done = d.saturating_mul(w).min(self.len());
        let started = d.saturating_add(1).saturating_mul(w).min(self.len());
        (done, self.first + started, el % self.cost.max(1))
    }
    /// Whether every workgroup has started at `now` once the round under
    /// way has launched: `started_by(now) >= end`, with one division in
    /// place of [`Self::progress`]'s. Past its start the last round is
    /// under way exactly when `(now - start) / cost + 1` rounds of `width`
    /// cover the batch (guests' delay only stretches the last round), so
    /// the answer is the same.
    pub(super) fn all_started(&self, now: Nanos) -> bool {
        let w = self.width as u64;
        if now <= self.start || w == 0 {
            return self.started_by(now) >= self.end;
        }
        let k = (now - self.start) / self.cost.max(1);
        match k.checked_add(1).and_then(|r| r.checked_mul(w)) {
            Some(n) => n >= self.len(),
            None => self.started_by(now) >= self.end,
        }
    }
    /// A CU given to this batch's packet at `now` can join it.
    pub(super) fn joinable(&self, now: Nanos) -> bool {
        if !self.live {
            return false;
        }
        if now <= self.start {
            self.held == self.width && self.len() > self.width as u64
        } else {
            !self.all_started(now)
        }
    }
}

impl SimGpu {
    /// Marks batch `idx` changed: its timers are re-armed by `flush_batches`
    /// (a batch grown by many CUs in one dispatch pass is armed once).
    pub(super) fn touch_batch(&mut self, idx: u32) {
        let b = &mut self.batches[idx as usize];
        b.gen = b.gen.wrapping_add(1); // stale timers now miss
        if b.armed {
            b.armed = false;
            self.dirty_batches.push(idx);
        }
    }

    pub(super) fn flush_batches(&mut self) {
        while let Some(idx) = self.dirty_batches.pop() {
            let b = self.batches[idx as usize];
            if !b.live || b.armed {
                continue;
            }
            self.batches[idx as usize].armed = true;
            self.arm(b.finish(), Timer::BatchDone { idx, gen: b.gen });
            if b.last_round() < b.held as u64 {
                let at = b
                    .start
                    .saturating_add((b.rounds() - 1).saturating_mul(b.cost));
                self.arm(at, Timer::BatchShrink { idx, gen: b.gen });
            }
        }
    }

    pub(super) fn new_batch(&mut self, b: Batch) -> u32 {
        let idx = if let Some(i) = self.free_batches.pop() {
            let gen = self.batches[i as usize].gen;
            self.batches[i as usize] = Batch { gen, ..b };
            self.batch_cus[i as usize].clear();
            i
        } else {
            self.batches.push(b);
            self.batch_cus.push(Vec::new());
            (self.batches.len() - 1) as u32
        };
        if b.live {
            let p = self.slot_part[b.slot as usize] as usize;
            let l = &mut self.parts[p].cuttable;
            if let Err(at) = l.binary_search(&idx) {
                l.insert(at, idx);
            }
        }
        self.touch_batch(idx);
        idx
    }

    /// Frees `n` of the identified CUs batch `idx` holds (any `n`: its
    /// workgroups run in lock-step, so which CUs go back does not matter).
    /// Returns how many are free now (not those with a guest on them).
    pub(super) fn release_batch_cus(&mut self, idx: u32, n: u32) -> u32 {
        let p = self.slot_part[self.batches[idx as usize].slot as usize] as usize;
        let cus = &mut self.batch_cus[idx as usize];
        let mut freed = 0;
        for _ in 0..n {
            if let Some(cu) = cus.pop() {
                if release_cu(&mut self.parts[p], cu) {
                    freed += 1;
                }
            }
        }
        freed
    }

    /// Gives one free CU to packet `i` of `slot` as part of a batch: starts
    /// one, grows one that has not started, or cuts a running one at the end
    /// of its current round and starts the rest then with this CU.
    pub(super) fn start_batched(&mut self, slot: u32, i: usize) {
        let is_dispatch = self.slots[slot as usize]
            .as_ref()
            .and_then(|q| q.active.get(i))
            .is_some_and(|a| matches!(a.work, Work::Dispatch(_)));
        let Some(fp) = self.slots[slot as usize]
            .as_ref()
            .and_then(|q| q.active.get(i))
            .and_then(|a| match a.work {
                Work::Dispatch(d) => Some(d.fp),
                _ => None,
            })
        else {
            return;
        };
        if !is_dispatch {
            return;
        }
        let cu = self.take_cu(slot, fp);
        let now = self.now;
        let p = self.slot_part[slot as usize] as usize;
        let q = self.slots[slot as usize].as_mut().expect("slot");
        let qgen = q.gen;
        let a = &mut q.active[i];
        let Work::Dispatch(d) = a.work else { return };
        let id = a.id;
        let tail = a.batch.filter(|&b| self.batches[b as usize].joinable(now));
        let created = match tail {
            None => {
                let first = a.next_wg;
                a.next_wg = d.total;
                Some(Batch {
                    slot,
                    qgen,
                    id,
                    first,
                    end: d.total,
                    width: 1,
                    held: 1,
                    start: now,
                    cost: 0, // set below
                    gen: 0,
                    live: true,
                    armed: true,
                    shifted: 0,
                })
            }
            Some(bi) => {
                let b = &mut self.batches[bi as usize];
                if now <= b.start && b.held == b.width {
                    b.width += 1;
                    b.held += 1;
                    None
                } else {
                    let (_, started, into) = b.progress(now);
                    // Long workgroups: the CU starts at once (the batches
                    // then run out of phase: at most two events per round).
                    // Short ones: it waits for the round end (phases stay
                    // aligned, one event per join).
                    let round_end = if b.cost >= JOIN_NOW_NS {
                        now
                    } else {
                        now.saturating_add(b.cost - into)
                    };
                    let old_end = b.end;
                    // The rest runs on as a new batch on the same CUs
                    // (and the one joining), beside the same guests: the
                    // delay they caused stays with this batch, not cut.
                    b.end = started;
                    let cost = b.cost;
                    Some(Batch {
                        slot,
                        qgen,
                        id,
                        first: started,
                        end: old_end,
                        width: 1,
                        held: 1,
                        start: round_end,
                        cost,
                        gen: 0,
                        live: true,
                        armed: true,
                        shifted: 0,
                    })
                }
            }
        };
        a.inflight += 1;
        q.inflight += 1;
        self.parts[p].free_cus -= 1;
        if let Some(bi) = tail {
            self.touch_batch(bi);
        }
        let holder = if let Some(mut b) = created {
            if b.cost == 0 {
                b.cost = self.wg_cost(&d);
            }
            let idx = self.new_batch(b);
            let q = self.slots[slot as usize].as_mut().expect("slot");
            q.active[i].batch = Some(idx);
            idx
        } else {
            tail.expect("a batch grown without a tail")
        };
        let list = &mut self.batch_cus[holder as usize];
        self.parts[p].cu_batch.note(cu, holder, list.len());
        list.push(cu);
    }

    /// Workgroups of a batch with a memory effect (those past the kernel's
    /// elements touch nothing): the host applies effects in O(elements).
    pub(super) fn effect_wgs(d: &Dispatch) -> u64 {
        let per = d.items_per_wg.max(1);
        match d.args {
            Kernarg::Mark { n, .. } => n as u64,
            Kernarg::Spin { .. } => 0,
            Kernarg::Fill { n, .. }
            | Kernarg::VecAdd { n, .. }
            | Kernarg::Saxpy { n, .. }
            | Kernarg::Checksum { n, .. } => (n as u64).div_ceil(per),
        }
    }

    /// Applies the effects of workgroups `from..to` of packet `id` of `slot`
    /// and counts them done.
    pub(super) fn batch_effects(&mut self, slot: u32, id: u64, from: u64, to: u64) -> QResult<()> {
        let q = self.slots[slot as usize].as_mut().expect("batch slot");
        let Some(a) = q.active.iter_mut().find(|a| a.id == id) else {
            return Err(QueueErrorReason::BadSavedState("batch of unknown packet"));
        };
        let Work::Dispatch(d) = a.work else {
            return Err(QueueErrorReason::BadSavedState(
                "batch of non-dispatch packet",
            ));
        };
        a.done_wgs += to - from;
        self.stats.wgs_completed += to - from;
        let (tag, cost) = (q.tag, super::wg_cost(&self.params, &d));
        super::credit(&mut self.cu_credit, tag, (to - from).saturating_mul(cost));
        let lim = Self::effect_wgs(&d).min(to);
        apply_effects(
            &*q.mem,
            &d,
            from,
            lim,
            &mut self.scratch_gpas,
            &mut self.scratch,
            &mut self.scratch2,
        )
    }

    pub(super) fn batch_done(&mut self, idx: u32, gen: u32) {
        let b = self.batches[idx as usize];
        if b.gen != gen || !b.live {
            return;
        }
        self.batches[idx as usize].live = false;
        self.free_batches.push(idx);
        let slot = b.slot;
        let p = self.slot_part[slot as usize];
        let freed = self.release_batch_cus(idx, b.held);
        self.parts[p as usize].free_cus += freed;
        let res = (|| {
            let q = self.slots[slot as usize]
                .as_mut()
                .filter(|q| q.gen == b.qgen)
                .ok_or(QueueErrorReason::BadSavedState("batch of a gone queue"))?;
            q.inflight -= b.held;
            if let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) {
                a.inflight -= b.held;
                if a.batch == Some(idx) {
                    a.batch = None;
                }
            }
            self.batch_effects(slot, b.id, b.first, b.end)?;
            let q = self.slots[slot as usize].as_ref().expect("slot");
            match q.active.iter().position(|a| a.id == b.id) {
                Some(i) => self.complete_if_done(slot, i),
                None => Ok(()),
            }
        })();
        if let Err(e) = res {
            self.fail(slot, e);
        }
        self.after_release(slot, p);
    }

    /// The last round of a batch starts: its unused CUs go back.
    pub(super) fn batch_shrink(&mut self, idx: u32, gen: u32) {
        let b = self.batches[idx as usize];
        if b.gen != gen || !b.live {
            return;
        }
        let keep = b.last_round().min(b.held as u64) as u32;
        let r = b.held - keep;
        if r == 0 {
            return;
        }
        self.batches[idx as usize].held = keep;
        let p = self.slot_part[b.slot as usize];
        let freed = self.release_batch_cus(idx, r);
        self.parts[p as usize].free_cus += freed;
        if let Some(q) = self.slots[b.slot as usize].as_mut() {
            q.inflight -= r;
            if let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) {
                a.inflight -= r;
            }
        }
        self.dispatch(p);
    }

    /// For each of `batches` (of `slot`'s queue): whether its unstarted
    /// workgroups may go back to the packet, i.e. whether every workgroup
    /// from its end up to the packet's `next_wg` goes back too: the batch
    /// ending at `next_wg`, then, while a batch has not started any, the
    /// batch ending at its first, and so on. A batch outside that chain
    /// lies below workgroups handed out after it (a guest's, one already
    /// running).
    pub(super) fn tail_flags(&self, slot: u32, batches: &[u32]) -> Vec<bool> {
        let now = self.now;
        let q = self.slots[slot as usize].as_ref().expect("slot");
        let mut tail = vec![false; batches.len()];
        for k in 0..batches.len() {
            let id = self.batches[batches[k] as usize].id;
            if batches[..k]
                .iter()
                .any(|&o| self.batches[o as usize].id == id)
            {
                continue; // its packet's chain is done
            }
            let Some(a) = q.active.iter().find(|a| a.id == id) else {
                tail[k] = true;
                continue;
            };
            let mut hi = a.next_wg;
            while let Some(j) = (0..batches.len()).find(|&j| {
                let b = &self.batches[batches[j] as usize];
                !tail[j] && b.id == id && b.end == hi
            }) {
                tail[j] = true;
                let b = &self.batches[batches[j] as usize];
                if b.progress(now).1 > b.first {
                    break; // workgroups below it are running
                }
                hi = b.first;
            }
        }
        tail
    }

    /// Live batches of the queue in `slot`.
    pub(super) fn slot_batches(&self, slot: u32, qgen: u64) -> Vec<u32> {
        (0..self.batches.len() as u32)
            .filter(|&i| {
                let b = &self.batches[i as usize];
                b.live && b.slot == slot && b.qgen == qgen
            })
            .collect()
    }
}
