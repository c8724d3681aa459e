//! Dispatch and CU arbitration: free CUs handed to queues round robin,
//! guests beside another queue's workgroup (occupancy), the rebalance of
//! batches when a queue holds less than an equal split, single
//! workgroups (jitter, waves without a save point) and their completion.

use super::guest_pass::{GuestPass, SMALLEST_GUEST};
use super::want::{share_floor, WantCount};
use super::*;

impl SimGpu {
    /// Hand free CUs of partition `p` to active queues, round robin, priority blind.
    pub(super) fn dispatch(&mut self, p: u32) {
        let pi = p as usize;
        let n = self.parts[pi].slots.len();
        debug_assert_eq!(
            self.parts[pi].free_cus,
            self.parts[pi].free_mask.count(),
            "free CU count and free CU set disagree"
        );
        debug_assert!(
            (0..self.parts[pi].cu_owner.len()).all(|cu| {
                let part = &self.parts[pi];
                part.lanes.contains(cu as u32) == (part.cu_owner[cu] != 0 && part.cu_guest[cu] == 0)
            }),
            "guest lanes and CU owners disagree"
        );
        debug_assert!(
            (0..self.parts[pi].cu_owner.len()).all(|cu| {
                let part = &self.parts[pi];
                part.roomy.contains(cu as u32)
                    == (part.lanes.contains(cu as u32) && part.cu_fp[cu].fits_with(SMALLEST_GUEST))
            }),
            "roomy guest lanes and lane footprints disagree"
        );
        debug_assert!(
            (0..self.parts[pi].cu_owner.len()).all(|cu| {
                let part = &self.parts[pi];
                part.hosts.pair_of(cu as u32)
                    == part
                        .roomy
                        .contains(cu as u32)
                        .then(|| (part.cu_owner[cu], part.cu_fp[cu]))
            }),
            "host lanes and roomy lanes disagree"
        );
        self.unshare_left(pi);
        self.note_active_slots(pi);
        if n > 64 {
            self.dispatch_scan(pi, n);
        } else {
            self.dispatch_bits(pi, n);
        }
        // The guest pass's count of the queues that want CUs, if it made
        // one and placed nothing since: nothing between it and the
        // rebalance changes the partition.
        let counted = self.place_guests(p);
        if self.parts[pi].free_cus == 0 {
            self.rebalance(p, counted);
        }
        self.flush_batches();
    }

    /// Is the queue of `slot` able to take a free CU of partition `pi` now
    /// (active, a workgroup to launch, a free CU in its mask)?
    fn can_take_cu(&self, pi: usize, slot: u32) -> bool {
        self.slots[slot as usize].as_ref().is_some_and(|q| {
            q.state == HState::Active
                && self.dispatchable(q).is_some()
                && q.mask
                    .as_ref()
                    .is_none_or(|m| m.first_in(&self.parts[pi].free_mask).is_some())
        })
    }

    /// [`Self::dispatch`]'s round robin over up to 64 slots: a bit per
    /// position not yet found unable. Starting another queue's workgroups
    /// only takes CUs, so a slot found unable stays so until the pass
    /// ends and is not looked at again; the next able slot from `rr` on is
    /// the lowest set bit at or above `rr`, else the lowest. (A scan of
    /// every slot per start took a third of the promise fuzzer's host
    /// time.) Picks the same slots in the same order as
    /// [`Self::dispatch_scan`].
    fn dispatch_bits(&mut self, pi: usize, n: usize) {
        self.note_pass_grows(n);
        let all = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        // Only an active queue can take a CU (`can_take_cu`): the others
        // start found unable. `active_slots` holds for the whole pass.
        debug_assert!(self.active_slots_current(pi), "active slots out of date");
        let mut maybe = self
            .active_slots
            .iter()
            .fold(0u64, |m, &pos| m | (1u64 << pos));
        while self.parts[pi].free_cus > 0 && maybe != 0 {
            let rr = self.parts[pi].rr % n;
            let from_rr = maybe & (all << rr);
            let pos = if from_rr != 0 { from_rr } else { maybe }.trailing_zeros() as usize;
            if !self.give_cu(pi, pos, n) {
                maybe &= !(1u64 << pos);
            }
        }
    }

    /// [`Self::dispatch`]'s round robin over any number of slots: from `rr`
    /// on, the first slot able to take a CU starts a workgroup, until none
    /// is or no CU is free.
    fn dispatch_scan(&mut self, pi: usize, n: usize) {
        self.note_pass_grows(n);
        while self.parts[pi].free_cus > 0 {
            let rr = self.parts[pi].rr;
            if !(0..n)
                .map(|k| (rr + k) % n)
                .any(|pos| self.give_cu(pi, pos, n))
            {
                break;
            }
        }
    }

    /// Starts a pass's round robin over `n` slots: no queue's pending
    /// grow noted yet ([`super::grow`]).
    fn note_pass_grows(&mut self, n: usize) {
        // Only the positions the last pass noted hold a note: clearing
        // them spares a write per slot position per pass.
        while let Some(pos) = self.pass_grows_set.pop() {
            self.pass_grows[pos as usize] = None;
        }
        if self.pass_grows.len() < n {
            self.pass_grows.resize(n, None);
        }
        debug_assert!(self.pass_grows.iter().all(Option::is_none));
    }

    /// One turn of the round robin over partition `pi`'s `n` slots: if the
    /// queue at position `pos` can take a free CU (as
    /// [`Self::can_take_cu`]), it starts a workgroup there (as
    /// [`Self::start_one`]) and the round robin goes on after it. Returns
    /// whether it could. A queue whose CU grows a batch that has not
    /// started takes the noted grow ([`super::grow`]).
    fn give_cu(&mut self, pi: usize, pos: usize, n: usize) -> bool {
        let s = self.parts[pi].slots[pos];
        // No free CU in its mask: unable, whatever it would run.
        let Some(cu) = self.free_cu_for(pi, s) else {
            debug_assert!(!self.can_take_cu(pi, s));
            return false;
        };
        let noted = match self.pass_grows[pos] {
            Some(g) => Some(g),
            None => {
                // `can_take_cu` with one walk of the packet window: an
                // active queue with something to run.
                let Some(q) = self.slots[s as usize]
                    .as_ref()
                    .filter(|q| q.state == HState::Active)
                else {
                    return false;
                };
                let Some(what) = self.dispatchable(q) else {
                    return false;
                };
                what.and_then(|i| self.grow_of(q, i))
            }
        };
        debug_assert!(self.can_take_cu(pi, s));
        self.parts[pi].rr = (pos + 1) % n;
        if let Some(g) = noted {
            let left = self.grow_pending(pi, s, cu, g);
            if self.pass_grows[pos].is_none() {
                self.pass_grows_set.push(pos as u32);
            }
            self.pass_grows[pos] = (left.room > 0).then_some(left);
            return true;
        }
        self.start_one(s);
        true
    }

    /// Occupancy: a queue with a workgroup to launch and no free CU in its
    /// mask puts it beside another queue's workgroup, on a CU of its mask
    /// where both fit ([`Footprint::fits_with`]; at most one guest per CU),
    /// round robin over the slots. A queue's own further workgroups wait
    /// for its own CUs (its kernels run in lock-step rounds, one workgroup
    /// per CU), so a lone kernel runs as before.
    ///
    /// Returns the count of the queues that want CUs if a try made it and
    /// no try changed the partition after (it holds when the pass ends).
    pub(super) fn place_guests(&mut self, p: u32) -> Option<WantCount> {
        let pi = p as usize;
        // What the tries learn about the partition, kept until a guest is
        // placed (`try_guest` packing; a try that places nothing changes
        // nothing).
        let mut pass = GuestPass::default();
        // The slots in round-robin order from `rr`, those of active queues
        // only: a try of any other places nothing and changes nothing, and
        // no try changes a queue's state or `rr`, so the pass visits the
        // same queues in the same order as a visit of every slot. (Of a
        // partition's slots few are mapped; a pass per workgroup end went
        // through all of them, each round.) `active_slots`, noted by
        // `dispatch`, is ascending: the round robin from `rr` starts at the
        // first at or after it.
        debug_assert!(self.active_slots_current(pi), "active slots out of date");
        let len = self.active_slots.len();
        let rr = self.parts[pi].rr;
        let start = self
            .active_slots
            .partition_point(|&pos| (pos as usize) < rr);
        #[cfg(test)]
        if self.guest_pass_rounds {
            return self.place_guests_in_rounds(pi, start, pass);
        }
        // Round robin from `start` until every active queue has failed
        // once since the last placement ([`super::guest_pass`]: the same
        // guests as rounds of every queue until a round places nothing).
        let mut k = 0;
        let mut fails = 0;
        let mut check_room = true;
        while fails < len {
            // No CU with an owner and room for a guest: no try can place
            // one (each needs a host lane whose owner leaves room for it,
            // at least for the smallest guest), and none changes anything.
            // (Only a placed guest takes a lane.)
            if check_room && self.parts[pi].roomy.is_empty() {
                return pass.want;
            }
            let pos = self.active_slots[(start + k) % len] as usize;
            let s = self.parts[pi].slots[pos];
            let placed = self.try_guest(s, &mut pass);
            check_room = placed;
            fails = if placed { 0 } else { fails + 1 };
            k = (k + 1) % len;
        }
        pass.want
    }

    /// Test switch ([`SimGpu::guest_pass_rounds`]): [`Self::place_guests`]
    /// as whole rounds of every active queue from `start` until a round
    /// places nothing.
    #[cfg(test)]
    fn place_guests_in_rounds(
        &mut self,
        pi: usize,
        start: usize,
        mut pass: GuestPass,
    ) -> Option<WantCount> {
        let len = self.active_slots.len();
        loop {
            let mut placed = false;
            for k in 0..len {
                if (k == 0 || placed) && self.parts[pi].roomy.is_empty() {
                    return pass.want;
                }
                let pos = self.active_slots[(start + k) % len] as usize;
                let s = self.parts[pi].slots[pos];
                if self.try_guest(s, &mut pass) {
                    placed = true;
                }
            }
            if !placed {
                return pass.want;
            }
        }
    }

    /// Notes in `active_slots` the positions (in partition `pi`'s slot
    /// list) of the slots whose queue is active, ascending: the only
    /// queues a guest pass or the rebalance looks at. Nothing a dispatch
    /// pass does (workgroup and batch starts, guests, cuts) changes a
    /// queue's state, so the list holds for the whole pass.
    fn note_active_slots(&mut self, pi: usize) {
        self.active_slots.clear();
        for (pos, &s) in self.parts[pi].slots.iter().enumerate() {
            if self.slots[s as usize]
                .as_ref()
                .is_some_and(|q| q.state == HState::Active)
            {
                self.active_slots.push(pos as u32);
            }
        }
    }

    /// Debug check: `active_slots` is what [`Self::note_active_slots`]
    /// would note now.
    fn active_slots_current(&self, pi: usize) -> bool {
        let now: Vec<u32> = self.parts[pi]
            .slots
            .iter()
            .enumerate()
            .filter(|(_, &s)| {
                self.slots[s as usize]
                    .as_ref()
                    .is_some_and(|q| q.state == HState::Active)
            })
            .map(|(pos, _)| pos as u32)
            .collect();
        now == self.active_slots
    }

    /// Launches one workgroup of `slot` as a guest if it has one to launch,
    /// no free CU in its mask, and a CU of its mask has room beside its
    /// owner's workgroup. The two share the CU at half rate each
    /// ([`occupancy::share`]): the owner's workgroup (a batch: its
    /// lock-step rounds) is delayed by the CU time the guest takes from it.
    ///
    /// `pass`: what earlier tries of the same pass learnt about the
    /// partition (computed here when needed; forgotten once this call
    /// changes anything).
    pub(super) fn try_guest(&mut self, slot: u32, pass: &mut GuestPass) -> bool {
        #[cfg(test)]
        {
            self.guest_tries += 1;
        }
        let now = self.now;
        let p = self.slot_part[slot as usize] as usize;
        let Some(q) = self.slots[slot as usize].as_ref() else {
            return false;
        };
        if q.state != HState::Active {
            return false;
        }
        let part = &self.parts[p];
        let has_free = match q.mask.as_ref() {
            Some(m) => m.first_in(&part.free_mask).is_some(),
            None => part.free_cus > 0,
        };
        if has_free {
            return false;
        }
        // What it would launch next: a saved workgroup, else the next one
        // of the first packet that has one (as `start_one`), else the first
        // unstarted round of one of its running batches: a CU packs
        // workgroups wherever they fit, so a batch's later rounds are not
        // bound to its own CUs while another queue's CU has room (the
        // batch is cut at the end of its current round once a host is
        // found, below).
        let mut cut = None;
        let (id, fp, cost) = if let Some(sw) = q.resume.front() {
            (sw.id, packet_fp(q, sw.id), sw.remaining)
        } else if let Some(a) = q
            .active
            .iter()
            .find(|a| matches!(a.work, Work::Dispatch(d) if a.next_wg < d.total))
        {
            let Work::Dispatch(d) = a.work else {
                return false;
            };
            (a.id, d.fp, self.wg_cost(&d))
        } else {
            // Only below an equal split of the partition among the queues
            // that want CUs (as `rebalance` counts them): the occupancy
            // counterpart of the rebalance, which would otherwise make it
            // wait for the other queues' round ends. A queue holding its
            // split keeps its lock-step rounds. The count visits every
            // active queue's window: a try that finds it made checks the
            // split at once (most queues hold theirs); one that does not
            // first searches its own batches, and a queue with no round
            // left to move needs no count ([`super::guest_pass`]).
            let cus = self.topo.cus_per_partition();
            let holds_split = |w: WantCount| w.want < 2 || q.inflight >= cus / w.want;
            #[cfg(test)]
            if self.guest_pass_rounds {
                pass.want.get_or_insert_with(|| self.pass_want_count(p));
            }
            if pass.want.is_some_and(holds_split) {
                return false;
            }
            let qgen = q.gen;
            let Some((a, bi)) = q.active.iter().find_map(|a| {
                let bi = a.batch?;
                let b = &self.batches[bi as usize];
                (matches!(a.work, Work::Dispatch(_))
                    && b.live
                    && b.slot == slot
                    && b.qgen == qgen
                    && b.id == a.id
                    && now >= b.start
                    && !b.all_started(now))
                .then_some((a, bi))
            }) else {
                return false;
            };
            let Work::Dispatch(d) = a.work else {
                return false;
            };
            if d.fp == Footprint::WHOLE {
                return false;
            }
            if holds_split(*pass.want.get_or_insert_with(|| self.pass_want_count(p))) {
                return false;
            }
            cut = Some(bi);
            (a.id, d.fp, self.wg_cost(&d))
        };
        if fp == Footprint::WHOLE {
            return false;
        }
        // Round robin over CUs, as the dispatcher spreads workgroups: only
        // the roomy lanes of another queue whose owner leaves room for this
        // workgroup, in its mask (`host_lanes`: the lanes a visit of every
        // roomy lane did not skip, in the same order), and whose owner runs
        // a workgroup there (none: its waves are being saved, the CU is
        // not running).
        let mut words = std::mem::take(&mut self.host_words);
        let mut host = None;
        if part
            .hosts
            .hosts_for(slot + 1, fp, q.mask.as_ref().map(|m| m.words()), &mut words)
        {
            for cu in part.hosts.iter_from(&words, part.guest_rr as u32) {
                let hs = part.cu_owner[cu as usize].wrapping_sub(1);
                if let Some(bi) = self.batch_on(p, cu, hs) {
                    host = Some((cu, Ok(bi as u32)));
                    break;
                }
                let w = self
                    .wg_on(p, cu, false)
                    .filter(|&wi| self.wgs[wi].slot == hs);
                if let Some(wi) = w {
                    host = Some((cu, Err(wi as u32)));
                    break;
                }
            }
        }
        debug_assert_eq!(
            host.map(|h| h.0),
            self.host_by_visit(p, slot, fp),
            "the host lanes and a visit of every roomy lane disagree"
        );
        self.host_words = words;
        let Some((cu, h)) = host else {
            return false;
        };
        // From here on this call changes the partition.
        pass.changed();
        if let Some(bi) = cut {
            // The batch stops after its current round; its unstarted
            // workgroups go back to the packet (as a mask cut does), the
            // first of them launched here.
            let b = &mut self.batches[bi as usize];
            let started = b.started_by(now);
            b.cut_at(started);
            self.touch_batch(bi);
            let q = self.slots[slot as usize].as_mut().expect("slot");
            if let Some(a) = q.active.iter_mut().find(|a| a.id == id) {
                a.next_wg = a.next_wg.min(started);
            }
        }
        let (delay, wall) = match h {
            Ok(bi) => {
                // The batch's rounds end as late as its most delayed CU.
                let b = &mut self.batches[bi as usize];
                let (d, wall) = occupancy::share(cost, b.finish().saturating_sub(now));
                let debt = &mut self.parts[p].cu_debt[cu as usize];
                // Sharing at most halves the owner's rate: guests delay it
                // by at most its own solo length (a batch cut later, when
                // its rounds go to other CUs as guests, is shorter than the
                // stay this guest was placed against).
                *debt = debt.saturating_add(d).min(b.solo_len());
                if *debt > b.shifted {
                    b.shifted = *debt;
                    self.touch_batch(bi);
                }
                (d, wall)
            }
            Err(wi) => {
                // The owner runs at half rate while the guest shares its
                // CU: it is delayed by `d` over the window `[now, now +
                // 2d)`, kept so that a save or the guest's early leaving
                // sees its solo work left (not its stretched end).
                let w = &mut self.wgs[wi as usize];
                let left = occupancy::solo_left(now, w.end, w.shared_until);
                let (d, wall) = occupancy::share(cost, left);
                if d > 0 {
                    w.end = now.saturating_add(left).saturating_add(d);
                    w.shared_until = now.saturating_add(d.saturating_mul(2));
                    w.gen = w.gen.wrapping_add(1);
                    let (end, gen) = (w.end, w.gen);
                    self.arm(end, Timer::WgDone { idx: wi, gen });
                }
                (d, wall)
            }
        };
        let q = self.slots[slot as usize].as_mut().expect("slot");
        let wg = if q.resume.front().is_some_and(|sw| sw.id == id) {
            let sw = q.resume.pop_front().expect("front");
            sw.wg
        } else {
            let Some(a) = q.active.iter_mut().find(|a| a.id == id) else {
                return false;
            };
            let wg = a.next_wg;
            a.next_wg += 1;
            wg
        };
        if let Some(a) = q.active.iter_mut().find(|a| a.id == id) {
            a.inflight += 1;
        }
        q.inflight += 1;
        let qgen = q.gen;
        self.parts[p].cu_guest[cu as usize] = slot + 1;
        self.parts[p].lanes.remove(cu);
        self.parts[p].roomy.remove(cu);
        self.parts[p].hosts.remove(cu);
        self.parts[p].guest_rr = (cu as usize + 1) % self.parts[p].cu_guest.len();
        self.stats.coresident_wgs += 1;
        self.push_wg(Wg {
            slot,
            cu,
            qgen,
            id,
            wg,
            end: now.saturating_add(wall),
            gen: 0,
            live: true,
            guest: true,
            shared_until: now.saturating_add(delay.saturating_mul(2)),
            work: cost,
        });
        true
    }

    /// The owners of the CUs in partition `p`'s `left` list left them
    /// (their workgroup or batch round ended, or the CU was taken from the
    /// batch) while a guest ran there: each such guest still sharing runs
    /// on alone from now, ending after the solo work it has left. The
    /// guest's end was set at placement from the owner's expected stay (a
    /// batch's whole remaining rounds), which a batch cut at a round end
    /// or a mask change does not keep.
    pub(super) fn unshare_left(&mut self, p: usize) {
        if self.parts[p].left.is_empty() {
            return;
        }
        let now = self.now;
        let left = std::mem::take(&mut self.parts[p].left);
        for cu in left {
            let Some(wi) = self.wg_on(p, cu, true) else {
                continue;
            };
            if now >= self.wgs[wi].shared_until {
                continue;
            }
            self.run_alone(wi, now);
        }
    }

    /// Guest workgroup `wi` runs alone on its CU from `t`: its end moves to
    /// `t` plus the solo work it has left ([`occupancy::solo_left`]), and
    /// its completion timer is re-armed (the old one goes stale).
    fn run_alone(&mut self, wi: usize, t: Nanos) {
        let w = &mut self.wgs[wi];
        let left = occupancy::solo_left(t, w.end, w.shared_until);
        w.end = t.saturating_add(left);
        w.shared_until = t;
        w.gen = w.gen.wrapping_add(1);
        let (end, gen) = (w.end, w.gen);
        self.arm(
            end,
            Timer::WgDone {
                idx: wi as u32,
                gen,
            },
        );
    }

    /// Owners in partition `p` whose guest left before their shared window
    /// ended (saved, killed or failed) run on alone from `t`: their end
    /// moves up to `t` plus the solo work they have left. Without this an
    /// owner kept the delay of a guest that was saved at once, and a saved
    /// owner's remaining work counted that delay: a workgroup saved once
    /// per period beside a guest of its own VM's other queue grew its work
    /// each time and never ended.
    pub(super) fn unshare_owners(&mut self, p: usize, t: Nanos) {
        for wi in 0..self.wgs.len() {
            let w = &self.wgs[wi];
            if !w.live
                || w.guest
                || t >= w.shared_until
                || self.slot_part[w.slot as usize] as usize != p
                || self.parts[p].cu_guest.get(w.cu as usize) != Some(&0)
            {
                continue;
            }
            self.run_alone(wi, t);
        }
    }

    /// The waves of `slot` (partition `p`) left their CUs now, saved or
    /// killed: a guest of another queue that shares one of those CUs runs
    /// on alone at its solo rate once the trap has stopped them (`now +
    /// trap_ns`), so its end moves up to that instant plus the solo work it
    /// has left (`occupancy::solo_left`). Without this a guest placed
    /// beside an owner that is saved at once (a real-time queue ringing
    /// while the scheduler saves the lower queue off its CUs) would keep
    /// the doubled end of processor sharing: a whole extra round of its
    /// kernel. CUs where the slot's waves without a save point still run
    /// stay shared.
    pub(super) fn unshare_guests(&mut self, p: usize, slot: u32) {
        let t = self.now.saturating_add(self.topo.cwsr.trap_ns);
        let owner = slot + 1;
        let mut still = vec![false; self.parts[p].cu_owner.len()];
        for w in self.wgs.iter() {
            if w.live && !w.guest && w.slot == slot {
                if let Some(c) = still.get_mut(w.cu as usize) {
                    *c = true;
                }
            }
        }
        for wi in 0..self.wgs.len() {
            let w = &self.wgs[wi];
            let cu = w.cu as usize;
            if !w.live
                || !w.guest
                || w.slot == slot
                || self.slot_part[w.slot as usize] as usize != p
                || t >= w.shared_until
                || self.parts[p].cu_owner.get(cu) != Some(&owner)
                || still.get(cu).copied().unwrap_or(true)
            {
                continue;
            }
            self.run_alone(wi, t);
        }
    }

    /// CU round robin across batches: when a queue that wants CUs holds
    /// fewer than an equal split of the partition, the batches of queues
    /// holding more stop at the end of their current round, whose CUs the
    /// round robin then hands out again (as freed workgroups' CUs are).
    ///
    /// `counted`: the count of the queues that want CUs, if the pass made
    /// it and nothing changed since. Without it, the rebalance first looks
    /// for a batch it could cut at the least split it can compute
    /// ([`share_floor`]): with none it cuts nothing, and does not count
    /// (the count visits every active queue's packet window).
    pub(super) fn rebalance(&mut self, p: u32, counted: Option<WantCount>) {
        let pi = p as usize;
        // Only active queues count (`active_slots`, noted by `dispatch`).
        debug_assert!(self.active_slots_current(pi), "active slots out of date");
        let count = match counted {
            Some(c) => {
                debug_assert_eq!(c, self.want_count(pi), "the guest pass's count is stale");
                c
            }
            None => {
                let floor = share_floor(
                    self.topo.cus_per_partition(),
                    self.active_slots.len() as u32,
                );
                if !self.may_cut_above(pi, floor) {
                    debug_assert!(
                        {
                            let c = self.want_count(pi);
                            (c.want < 2 && c.min_held > 0)
                                || !self.may_cut_above(
                                    pi,
                                    self.topo.cus_per_partition() / c.want.max(1),
                                )
                        },
                        "the rebalance skipped a count that would cut"
                    );
                    return;
                }
                self.pass_want_count(pi)
            }
        };
        let WantCount { want, min_held } = count;
        if want < 2 && min_held > 0 {
            return;
        }
        let share = self.topo.cus_per_partition() / want.max(1);
        if min_held >= share {
            return;
        }
        let now = self.now;
        // The batches that may still be cut, in index order (the order
        // their timers are re-armed); those that never can again leave the
        // list. Nothing below creates a batch.
        debug_assert!(
            self.batches.iter().enumerate().all(|(i, b)| {
                !b.live
                    || self.slot_part[b.slot as usize] != p
                    || b.all_started(now)
                    || self.parts[pi].cuttable.binary_search(&(i as u32)).is_ok()
            }),
            "a batch that may be cut is missing from its partition's list"
        );
        let mut list = std::mem::take(&mut self.parts[pi].cuttable);
        let mut kept = 0;
        for r in 0..list.len() {
            let bi = list[r];
            let b = self.batches[bi as usize];
            if !b.live || self.slot_part[b.slot as usize] != p || b.all_started(now) {
                continue;
            }
            list[kept] = bi;
            kept += 1;
            let Some(q) = self.slots[b.slot as usize].as_mut() else {
                continue;
            };
            if q.inflight <= share || q.gen != b.qgen {
                continue;
            }
            // A batch that starts now runs one round; one that starts later
            // (the rest of a cut batch) is left alone: its predecessor's CUs
            // are about to be handed out anyway.
            if now < b.start {
                continue;
            }
            let started = b.started_by(now);
            if let Some(a) = q.active.iter_mut().find(|a| a.id == b.id) {
                a.next_wg = a.next_wg.min(started);
            }
            self.batches[bi as usize].cut_at(started);
            self.touch_batch(bi);
        }
        debug_assert!(self.parts[pi].cuttable.is_empty());
        list.truncate(kept);
        self.parts[pi].cuttable = list;
    }

    /// What a free CU given to queue `q` would run: `Some(None)` a saved
    /// workgroup, `Some(Some(i))` packet `i` of the window, `None` nothing.
    pub(super) fn dispatchable(&self, q: &Hqd) -> Option<Option<usize>> {
        if !q.resume.is_empty() {
            return Some(None);
        }
        let now = self.now;
        q.active
            .iter()
            .position(|a| match a.work {
                Work::Dispatch(d) => {
                    a.next_wg < d.total
                        || a.batch
                            .is_some_and(|i| self.batches[i as usize].joinable(now))
                }
                _ => false,
            })
            .map(Some)
    }

    /// Workgroup cost of a dispatch (ns): the descriptor's (a `spin`
    /// kernel's own), at least the modelled floor.
    pub(super) fn wg_cost(&self, d: &Dispatch) -> Nanos {
        super::wg_cost(&self.params, d)
    }

    /// Takes a free CU of `slot`'s partition inside the queue's effective
    /// mask for it (`dispatch` chose the queue because one exists).
    pub(super) fn take_cu(&mut self, slot: u32, fp: Footprint) -> u32 {
        let p = self.slot_part[slot as usize] as usize;
        let cu = self
            .free_cu_for(p, slot)
            .expect("dispatch chose a queue with a free CU in its mask");
        self.take_free_cu(p, slot, cu, fp);
        cu
    }

    /// The free CU `cu` of partition `p` becomes `slot`'s, running
    /// workgroups of footprint `fp` (its guest lane opens).
    pub(super) fn take_free_cu(&mut self, p: usize, slot: u32, cu: u32, fp: Footprint) {
        let part = &mut self.parts[p];
        part.free_mask.remove(cu);
        part.cu_owner[cu as usize] = slot + 1;
        part.cu_fp[cu as usize] = fp;
        set_lane(part, cu);
        part.cu_debt[cu as usize] = 0;
    }

    pub(super) fn start_one(&mut self, slot: u32) {
        let jitter = self.params.jitter_permille as u64;
        if jitter == 0 {
            let q = self.slots[slot as usize].as_ref().expect("slot");
            if let Some(Some(i)) = self.dispatchable(q) {
                // Waves without a save point keep running through a save
                // (the save waits for them): they run one by one.
                let preemptible = !matches!(
                    q.active[i].work,
                    Work::Dispatch(d) if !d.desc.preemptible()
                );
                if preemptible {
                    self.start_batched(slot, i);
                    return;
                }
            }
        }
        let floor = self.params.wg_floor_ns;
        let now = self.now;
        let p = self.slot_part[slot as usize] as usize;
        let q = self.slots[slot as usize].as_mut().expect("slot");
        let (id, wg, dur) = if let Some(sw) = q.resume.pop_front() {
            let Some(a) = q.active.iter_mut().find(|a| a.id == sw.id) else {
                return; // validated on restore; unreachable
            };
            a.inflight += 1;
            (sw.id, sw.wg, sw.remaining)
        } else {
            let Some(a) = q
                .active
                .iter_mut()
                .find(|a| matches!(a.work, Work::Dispatch(d) if a.next_wg < d.total))
            else {
                return;
            };
            let Work::Dispatch(d) = a.work else { return };
            let wg = a.next_wg;
            a.next_wg += 1;
            a.inflight += 1;
            let mut cost = d.desc.wg_cost_ns;
            if let Kernarg::Spin { ns } = d.args {
                if ns != 0 {
                    cost = ns;
                }
            }
            cost = cost.max(floor);
            if jitter > 0 && cost > 0 {
                let extra = self.rng.gen_range(0..=cost.saturating_mul(jitter) / 1000);
                cost = cost.saturating_add(extra);
            }
            (a.id, wg, cost.max(MIN_WG_NS))
        };
        q.inflight += 1;
        let qgen = q.gen;
        let part = &mut self.parts[p];
        let cu = match q.mask.as_ref() {
            Some(m) => m.first_in(&part.free_mask),
            None => part.free_mask.first_in(&part.free_mask),
        }
        .expect("dispatch chose a queue with a free CU in its mask");
        part.free_mask.remove(cu);
        part.cu_owner[cu as usize] = slot + 1;
        part.cu_fp[cu as usize] = packet_fp(q, id);
        set_lane(part, cu);
        self.parts[p].free_cus -= 1;
        let end = now.saturating_add(dur);
        self.push_wg(Wg {
            slot,
            cu,
            qgen,
            id,
            wg,
            end,
            gen: 0,
            live: true,
            guest: false,
            shared_until: 0,
            work: dur,
        });
    }

    /// The live single workgroup on `cu` of partition `p`: its owner's
    /// (`guest` false) or its guest's. A CU runs at most one of each, and
    /// `Part::cu_wg` holds the last one started there (debug builds check
    /// it against a scan of every workgroup).
    pub(super) fn wg_on(&self, p: usize, cu: u32, guest: bool) -> Option<usize> {
        let on = |w: &Wg| {
            w.live
                && w.guest == guest
                && w.cu == cu
                && self.slot_part[w.slot as usize] as usize == p
        };
        let hit = self.parts[p]
            .cu_wg
            .get(cu as usize)
            .and_then(|e| e[usize::from(guest)].checked_sub(1))
            .map(|i| i as usize)
            .filter(|&i| self.wgs.get(i).is_some_and(on));
        debug_assert_eq!(
            hit,
            self.wgs.iter().position(on),
            "CU {cu} of partition {p}: workgroup index out of date (guest {guest})"
        );
        hit
    }

    /// Debug check of [`Self::try_guest`]'s host search: the first CU a
    /// visit of every roomy lane of partition `p` from `guest_rr` finds
    /// for a workgroup of footprint `fp` of `slot` (the search before
    /// `host_lanes`).
    fn host_by_visit(&self, p: usize, slot: u32, fp: Footprint) -> Option<u32> {
        let part = &self.parts[p];
        let q = self.slots[slot as usize].as_ref()?;
        part.roomy.iter_from(part.guest_rr as u32).find(|&cu| {
            let c = cu as usize;
            let owner = part.cu_owner[c];
            if owner == 0
                || owner == slot + 1
                || part.cu_guest[c] != 0
                || !part.cu_fp[c].fits_with(fp)
                || q.mask.as_ref().is_some_and(|m| !m.contains(cu))
            {
                return false;
            }
            let hs = owner - 1;
            self.batch_on(p, cu, hs).is_some()
                || self
                    .wg_on(p, cu, false)
                    .is_some_and(|wi| self.wgs[wi].slot == hs)
        })
    }

    /// The live batch of `slot`'s queue running on `cu` of partition `p`
    /// ([`super::cu_batch::CuBatchIndex`]; debug builds check it against a scan
    /// of every batch's CU list).
    pub(super) fn batch_on(&self, p: usize, cu: u32, slot: u32) -> Option<usize> {
        let hit = self.parts[p]
            .cu_batch
            .holder(cu, &self.batch_cus)
            .filter(|&bi| {
                let b = &self.batches[bi];
                b.live && b.slot == slot
            });
        debug_assert_eq!(
            hit,
            (0..self.batches.len()).find(|&bi| {
                let b = &self.batches[bi];
                b.live && b.slot == slot && self.batch_cus[bi].contains(&cu)
            }),
            "CU {cu} of partition {p}: batch index out of date (slot {slot})"
        );
        hit
    }

    /// Registers a started workgroup and arms its completion.
    pub(super) fn push_wg(&mut self, w: Wg) {
        let (end, cu, guest) = (w.end, w.cu as usize, w.guest);
        let p = self.slot_part[w.slot as usize] as usize;
        let idx = if let Some(i) = self.free_wgs.pop() {
            let gen = self.wgs[i as usize].gen.wrapping_add(1);
            self.wgs[i as usize] = Wg { gen, ..w };
            i
        } else {
            self.wgs.push(w);
            (self.wgs.len() - 1) as u32
        };
        if let Some(e) = self.parts[p].cu_wg.get_mut(cu) {
            e[usize::from(guest)] = idx + 1;
        }
        let gen = self.wgs[idx as usize].gen;
        self.arm(end, Timer::WgDone { idx, gen });
    }

    pub(super) fn wg_done(&mut self, idx: u32, gen: u32) {
        let w = &self.wgs[idx as usize];
        if w.gen != gen {
            return;
        }
        let live = w.live;
        let (slot, id, wg, cu, work) = (w.slot, w.id, w.wg, w.cu, w.work);
        self.free_wgs.push(idx);
        self.wgs[idx as usize].live = false;
        if !live {
            return; // killed or saved; its CU was accounted for elsewhere
        }
        let p = self.slot_part[slot as usize];
        let part = &mut self.parts[p as usize];
        if self.wgs[idx as usize].guest {
            release_guest(part, cu, slot);
        } else if release_cu(part, cu) {
            part.free_cus += 1;
        }
        if let Some(q) = self.slots[slot as usize].as_ref() {
            super::credit(&mut self.cu_credit, q.tag, work);
        }
        let res = self.complete_wg(slot, id, wg);
        if let Err(e) = res {
            self.fail(slot, e);
        }
        self.after_release(slot, p);
    }

    pub(super) fn complete_wg(&mut self, slot: u32, id: u64, wg: u64) -> QResult<()> {
        let q = self.slots[slot as usize]
            .as_mut()
            .expect("wg of empty slot");
        let Some(i) = q.active.iter().position(|a| a.id == id) else {
            return Err(QueueErrorReason::BadSavedState(
                "workgroup of unknown packet",
            ));
        };
        q.inflight -= 1;
        let a = &mut q.active[i];
        a.inflight -= 1;
        a.done_wgs += 1;
        let Work::Dispatch(d) = a.work else {
            return Err(QueueErrorReason::BadSavedState(
                "workgroup of non-dispatch packet",
            ));
        };
        apply_effect(&*q.mem, &d, wg, &mut self.scratch, &mut self.scratch2)?;
        self.stats.wgs_completed += 1;
        self.complete_if_done(slot, i)
    }

    /// After CUs of `slot` came back: finish a drain, refetch, hand CUs out.
    pub(super) fn after_release(&mut self, slot: u32, p: u32) {
        if self.slots[slot as usize]
            .as_ref()
            .is_some_and(|q| q.save_waiting)
        {
            // Its finishing waves' CUs went to others from here.
            self.wait_cus_recount(slot);
        }
        let drain_done = self.slots[slot as usize].as_ref().is_some_and(|q| {
            matches!(
                q.state,
                HState::Unmapping {
                    mode: DequeueMode::DrainPipe,
                    ..
                }
            ) && q.inflight == 0
        });
        let save_ready = self.slots[slot as usize]
            .as_ref()
            .is_some_and(|q| q.save_waiting && q.inflight == 0);
        if drain_done {
            self.finish_unmap(slot);
        } else if save_ready {
            self.arm_save_done(slot);
        } else if self.slots[slot as usize]
            .as_ref()
            .is_some_and(|q| q.state == HState::Active)
        {
            self.pump(slot);
        }
        self.dispatch(p);
    }
}

/// Footprint of a workgroup of packet `id` of `q` (a whole CU if unknown).
pub(super) fn packet_fp(q: &Hqd, id: u64) -> Footprint {
    q.active
        .iter()
        .find(|a| a.id == id)
        .and_then(|a| match a.work {
            Work::Dispatch(d) => Some(d.fp),
            _ => None,
        })
        .unwrap_or(Footprint::WHOLE)
}

/// A workgroup ended before its time (saved or killed): it is no longer
/// live, its index is free at once, and its completion timer is stale (a
/// new generation), so the timer heap can drop it rather than hold it
/// until the time the workgroup would have ended.
pub(super) fn retire_wg(w: &mut Wg, idx: usize, free: &mut Vec<u32>) {
    w.live = false;
    w.gen = w.gen.wrapping_add(1);
    free.push(idx as u32);
}

/// `cu`'s guest lane is open exactly when it has an owner and no guest;
/// it is roomy when, besides, its owner's footprint (`cu_fp`, set before
/// this call) leaves room for the smallest guest.
fn set_lane(part: &mut Part, cu: u32) {
    let i = cu as usize;
    if part.cu_owner.get(i).is_some_and(|&o| o != 0) && part.cu_guest.get(i) == Some(&0) {
        part.lanes.insert(cu);
        if part
            .cu_fp
            .get(i)
            .is_some_and(|f| f.fits_with(SMALLEST_GUEST))
        {
            part.roomy.insert(cu);
            part.hosts.insert(cu, part.cu_owner[i], part.cu_fp[i]);
        } else {
            part.roomy.remove(cu);
            part.hosts.remove(cu);
        }
    } else {
        part.lanes.remove(cu);
        part.roomy.remove(cu);
        part.hosts.remove(cu);
    }
}

/// A live workgroup on `cu` finished: the CU is free, unless a guest
/// workgroup still runs on it (it becomes free when the guest leaves).
/// Returns whether it is free now (the caller counts it).
pub(super) fn release_cu(part: &mut Part, cu: u32) -> bool {
    if let Some(o) = part.cu_owner.get_mut(cu as usize) {
        *o = 0;
        part.lanes.remove(cu);
        part.roomy.remove(cu);
        part.hosts.remove(cu);
        if part.cu_guest.get(cu as usize).is_some_and(|&g| g != 0) {
            // Its guest runs on alone from now (`SimGpu::unshare_left`).
            part.left.push(cu);
            return false;
        }
        part.free_mask.insert(cu);
        return true;
    }
    false
}

/// Frees the CUs held by `slot`: all of them (`saved`: the waves a save
/// held until the dequeue finished), or those of workgroups just killed.
/// Returns how many are free now (a CU with a guest on it is not yet).
pub(super) fn release_cus(part: &mut Part, slot: u32, _saved: bool) -> u32 {
    let mut n = 0;
    for cu in 0..part.cu_owner.len() {
        if part.cu_owner[cu] == slot + 1 && release_cu(part, cu as u32) {
            n += 1;
        }
    }
    n
}

/// The guest workgroup of `slot` on `cu` left: its lane is free (unless
/// another queue's guest holds it: a lane is given back only by its own
/// guest), and a CU without an owner becomes free (counted here). Returns
/// whether it did.
pub(super) fn release_guest(part: &mut Part, cu: u32, slot: u32) -> bool {
    let Some(g) = part.cu_guest.get_mut(cu as usize) else {
        return false;
    };
    if *g != slot + 1 {
        return false;
    }
    *g = 0;
    set_lane(part, cu);
    if part.cu_owner[cu as usize] == 0 && !part.free_mask.contains(cu) {
        part.free_mask.insert(cu);
        part.free_cus += 1;
        return true;
    }
    false
}

/// Every guest lane `slot`'s workgroups hold (killed or saved) is given
/// back. Returns the CUs that became free.
pub(super) fn release_guests(part: &mut Part, slot: u32) -> u32 {
    let mut n = 0;
    for cu in 0..part.cu_guest.len() {
        if release_guest(part, cu as u32, slot) {
            n += 1;
        }
    }
    n
}
