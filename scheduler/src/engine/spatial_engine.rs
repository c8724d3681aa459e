//! The engine's spatial-sharing decisions (docs/scheduling.md, "Spatial
//! sharing"): which VM of a partition holds a CU reservation, which lower
//! queues keep running beside it, and the host CU set of every mapped queue.

use super::rt_pair::PairAsk;
use super::{lvl, Scheduler, SliceOwner, BOOST_LEVEL};
use crate::spatial::{Reservation, Spatial};
use crate::{CuSet, Nanos, QueueId, SlotId, SpatialStats, VmId};
use std::cmp::Reverse;

impl Scheduler {
    /// Enables spatial sharing for a GPU with `cus_per_xcc` CUs per XCC and
    /// `xccs_per_partition` XCCs per partition (0 for either disables it).
    /// A bare scheduler has no geometry and never restricts CUs.
    pub fn set_cu_geometry(&mut self, cus_per_xcc: u32, xccs_per_partition: u32) {
        self.spatial.cus_per_xcc = cus_per_xcc;
        self.spatial.xccs = xccs_per_partition;
        self.spatial.res = vec![None; self.parts.len()];
        self.spatial.keep = vec![Vec::new(); self.parts.len()];
        self.spatial.drain_due = vec![None; self.parts.len()];
        self.spatial.overdue = vec![false; self.parts.len()];
        self.spatial.passed = vec![None; self.parts.len()];
        self.spatial.pair = vec![None; self.parts.len()];
        self.spatial.home = vec![None; self.parts.len()];
        self.spatial.slot_cus = vec![CuSet::All; self.slots.len()];
    }

    /// The caller saw `workgroups` workgroups in a kernel dispatch newly
    /// written to `queue`'s ring (call it before the doorbell event): the
    /// demand that sizes the VM's CU reservation. Unknown queues are ignored.
    pub fn note_dispatch_width(&mut self, queue: QueueId, workgroups: u64) {
        if let Some(q) = self.queues.get(&queue) {
            let vm = q.vm;
            self.spatial.note(vm, workgroups);
        }
    }

    /// The caller saw one kernel dispatch of `workgroups` workgroups newly
    /// written to `queue`'s ring (call it for each, with
    /// [`Scheduler::note_dispatch_width`] for the doorbell's widest): a
    /// kernel wider than the partition by a part of a round leaves CUs
    /// free in its last round, where a higher VM that co-resides runs on
    /// those CUs alone (`engine/coreside_places.rs`). Unknown queues are
    /// ignored.
    pub fn note_dispatch_kernel(&mut self, queue: QueueId, workgroups: u64) {
        if let Some(q) = self.queues.get(&queue) {
            let vm = q.vm;
            self.spatial.note_kernel(vm, workgroups);
        }
    }

    /// The caller read the dispatches newly written to `queue`'s ring (call
    /// it with [`Scheduler::note_dispatch_width`]): `solo_ns`, their run
    /// time alone (one workgroup's cost per kernel, summed), and `fits`,
    /// whether each of their workgroups takes at most half a CU (docs/
    /// gpu-model.md, "Occupancy"). It decides co-residence. Unknown queues
    /// are ignored.
    pub fn note_dispatch_occupancy(&mut self, queue: QueueId, solo_ns: u64, fits: bool) {
        if let Some(q) = self.queues.get(&queue) {
            let vm = q.vm;
            self.spatial.note_occupancy(vm, solo_ns, fits);
        }
    }

    /// The caller read the dispatches newly written to `queue`'s ring (call
    /// it with [`Scheduler::note_dispatch_occupancy`], for a complete scan):
    /// `work_ns`, their CU time (each kernel's workgroups times one
    /// workgroup's cost alone, summed). It sizes an RT's reservation kernel
    /// by kernel (`Spatial::size_for_latency`). Unknown queues are ignored.
    pub fn note_dispatch_work(&mut self, queue: QueueId, work_ns: u64) {
        if let Some(q) = self.queues.get(&queue) {
            let vm = q.vm;
            self.spatial.note_work(vm, work_ns);
        }
    }

    /// The caller read dispatches newly written to `queue`'s ring (all of
    /// them or some): `whole_ns` and `half_ns`, the longest cost alone of
    /// one of their workgroups that needs a whole CU and that fits half a
    /// CU (0: none; `u64::MAX`: a dispatch without an estimate). Over the
    /// VM's busy period they bound what a drain of its work waits for (a
    /// drained reservation, docs/scheduling.md "A drain waits for the
    /// longest workgroup"). Unknown queues are ignored.
    pub fn note_dispatch_longest_wg(&mut self, queue: QueueId, whole_ns: u64, half_ns: u64) {
        if let Some(q) = self.queues.get(&queue) {
            let vm = q.vm;
            self.spatial.note_longest_wg(vm, whole_ns, half_ns);
        }
    }

    /// Host CU set of the queue on `slot` (what a map of it must carry).
    pub fn slot_cu_set(&self, slot: SlotId) -> CuSet {
        self.spatial
            .slot_cus
            .get(slot.0 as usize)
            .copied()
            .unwrap_or_default()
    }

    /// Next CU-set change of a mapped queue, in decision order. The caller
    /// applies it to the GPU (a queue mapped in the same decision already
    /// carries its set: see [`Scheduler::slot_cu_set`]).
    pub fn poll_cu_change(&mut self) -> Option<(QueueId, SlotId, CuSet)> {
        self.spatial.changes.pop_front()
    }

    /// Spatial-sharing counters.
    pub fn spatial_stats(&self) -> SpatialStats {
        self.spatial.stats
    }

    /// The VM holding partition `p`'s CU reservation and its CUs per XCC.
    pub fn cu_reservation(&self, p: u32) -> Option<(VmId, u32)> {
        self.spatial
            .res
            .get(p as usize)
            .copied()
            .flatten()
            .map(|r| (r.vm, r.k))
    }

    pub(super) fn spatial_on(&self) -> bool {
        self.spatial.enabled()
            && self.ops().spatial
            && self.slices()
            && self.cfg.spatial_max_permille > 0
    }

    /// Chooses partition `p`'s reservation for slice owner `owner`: the
    /// owner's own when its demand fits, else a higher VM's that is held
    /// across its short idle gaps. Returns it and whether it is new (lower
    /// work may sit on its CUs: it is saved once).
    pub(super) fn spatial_plan(
        &mut self,
        p: usize,
        owner: SliceOwner,
    ) -> (Option<Reservation>, bool) {
        if !self.spatial_on() {
            if let Some(r) = self.spatial.res.get_mut(p) {
                *r = None;
            }
            self.res_keep_end(p, None);
            self.res_pass_note(p, None, None, false);
            return (None, false);
        }
        let prev = self.spatial.res[p];
        // An aging batch keeps a higher VM's held reservation: its queues
        // run on the other CUs (`engine/batch_res.rs`).
        if owner.level == BOOST_LEVEL {
            if let Some(r) = self.batch_keeps_reservation(p, prev) {
                return (Some(r), false);
            }
        }
        // Lower work to share the partition with, and a slot for the owner
        // beside the lower queues that would keep running? (Without one,
        // keeping them would leave the owner waiting for a slot: the
        // partition is preempted as a whole.)
        if !self.spatial_room(p, owner.level) {
            self.res_keep_end(p, None);
            self.res_pass_note(p, None, None, false);
            self.spatial.res[p] = None;
            if let Some(pair) = self.spatial.pair.get_mut(p) {
                *pair = None;
            }
            return (None, false);
        }
        let lower = self.parts[p].busy.range(..owner.level).next().is_some();
        // The wait of a drained reservation (its deadline: `drain_due.rs`).
        let mut drain_wait = None;
        // The owner's busy queues and latency size, when it is sized.
        let mut need: Option<(u32, Option<u32>)> = None;
        // Co-residence unless a reservation costs the lower lock-step work
        // less (`engine/lockstep.rs`).
        let cand = if owner.level < BOOST_LEVEL
            && lower
            && self.spatial_coreside(p, owner)
            && !self.lockstep_prefers_reservation(p, owner)
            && !self.pause_keeps_reservation(p, owner, prev)
        {
            // Its latency size, for taking a lower RT's held reservation
            // over instead (`res_pass.rs`, `coreside_keeps_held`).
            let queues = self.owner_queues(p, owner);
            let switch = self.rt_switch_budget(p, owner.level);
            need = Some((
                queues,
                self.spatial.size_for_latency(owner.vm, queues, switch, 0),
            ));
            Some(Reservation {
                vm: owner.vm,
                level: owner.level,
                k: 0,
                drain: false,
                wide: false,
            })
        } else if owner.level < BOOST_LEVEL && lower {
            // Its busy queues at its level may each dispatch that wide.
            let queues = self.owner_queues(p, owner);
            // Lower workgroups no longer than one save and restore are
            // left to end on the reserved CUs (no save): the owner's wait
            // for them takes the place of the switch in its RT bound.
            let allowance = self.spatial_wait_allowance(p);
            let mut drain = self.spatial_drain_wait(p, owner.level, allowance);
            drain_wait = drain;
            // Sized to the fewest CUs with which its job still meets the
            // RT bound, when its solo time and the switch are measured: the
            // bound allows one save and restore beyond 1.1 x its isolated
            // time, less what the owner waits before it runs: the drain,
            // or the save of the lower work on its CUs (`rt_save_wait`).
            // Budgeting the measured save and restore (2 x 16-41 us) sized
            // small RTs 5-9 CUs per XCC where 1-2 meet the bound (fuzz
            // seeds 97236, 50142, 50074; docs/scheduling.md "An RT's
            // reservation sized by the bound's allowance").
            // (The save's waits for the lower guests' waves without a
            // save point included, when the allowance can absorb them:
            // `engine/nsp_save.rs`.)
            let switch = match drain {
                Some(wait) => allowance.saturating_sub(wait),
                None => self.rt_switch_budget(p, owner.level),
            };
            // Held to half its interval only where a stall can come
            // (`rt_room.rs`).
            let wait = drain.unwrap_or(0);
            // (The condition is asked only where the whole interval
            // gives fewer CUs.)
            let half = self
                .spatial
                .size_for_latency(owner.vm, queues, switch, wait);
            // Timed kernel by kernel for a narrow owner only (a wide
            // one's size is `spatial_wide`'s: `engine/kernel_rounds.rs`).
            let width_k = self.spatial.size(
                owner.vm,
                queues,
                self.cfg.spatial_headroom_pct,
                self.cfg.spatial_max_permille,
            );
            let narrow = width_k.is_some();
            let whole = self.spatial.size_for_latency_whole(
                owner.vm,
                queues,
                switch,
                wait,
                self.rt_room_gap(),
                narrow,
            );
            let mut by_latency = match (half, whole) {
                (Some(h), Some(w)) if w < h && !self.rt_room_halved(p, owner.vm, owner.level) => {
                    Some(w)
                }
                _ => half,
            };
            let mut k = width_k
                .map(|k| (by_latency.map_or(k, |l| k.min(l)), false))
                .or_else(|| {
                    self.spatial_wide(p, owner.vm, owner.level, queues, switch, drain)
                        .map(|k| (k, true))
                });
            // A drain that leaves a wide owner no reservation: a save,
            // when its budget leaves one (`wide_save.rs`).
            if k.is_none() && drain.is_some() {
                if let Some((kw, sw)) = self.wide_by_save(p, owner.vm, owner.level, queues) {
                    k = Some((kw, true));
                    drain = None;
                    drain_wait = None;
                    by_latency = self.spatial.size_for_latency(owner.vm, queues, sw, 0);
                }
            }
            need = Some((queues, by_latency));
            if k.is_none() && self.lower_running(p, owner.level) {
                self.spatial.stats.fallbacks += 1;
            }
            // A wide reservation is set up with a save and held across
            // the owner's gaps (it takes the place of holding the whole
            // partition), unless its job takes at most half the owner's
            // period and, after the drain, meets its RT bound and leaves
            // a gap that is a break: then it is drained, and the lower
            // work gets the CUs back in each gap (`wide_drain.rs`). (Draining every wide one was tried: fuzz
            // seed 97101's best effort 0.706 -> 0.991 of alone, but
            // 50257's wide 7 kHz RT then lost its kept reservation, 0.773
            // against 0.818, and 50273's RT p99 335 us against 248:
            // docs/scheduling.md, branch `rtbe`.)
            k.map(|(k, wide)| Reservation {
                vm: owner.vm,
                level: owner.level,
                k,
                drain: drain.is_some_and(|w| !wide || self.wide_drains(p, owner.vm, queues, k, w)),
                wide,
            })
        } else {
            None
        };
        // A reservation in place does not shrink below what a VM still
        // holding it needed (`res_keep.rs`): growing it back saves the
        // lower work.
        let cand = cand.map(|c| self.res_keep(p, c));
        // Without one of its own, a lower RT's held reservation when its
        // job meets its bound there (`res_pass.rs`): nothing is saved.
        // With a co-residence of its own, the same held reservation of a
        // lower RT: co-residing would give the lower work its CUs, and the
        // lower RT's next job would take them back with a save
        // (`res_pass.rs`, "A co-residence keeps a lower RT's reservation").
        let passed = match (cand, need) {
            // A higher RT's held reservation in its gap, when the owner's
            // job meets its bound there (`res_down.rs`): the owner would
            // otherwise get the other CUs and save the lower work on them.
            (None, Some((queues, lat))) => self
                .res_pass_up(p, owner, prev, queues, lat)
                .or_else(|| self.res_pass_down(p, owner, prev, queues, lat)),
            (Some(c), Some((queues, lat))) if c.k == 0 => {
                self.coreside_keeps_held(p, owner, prev, queues, lat)
            }
            _ => None,
        };
        let cand = match passed {
            Some(r) => Some(self.res_keep(p, r)),
            None => cand,
        };
        if cand.is_some_and(|c| c.k == 0 && c.vm == owner.vm) {
            self.spatial.stats.coresidences += 1;
        }
        // A reservation another higher VM still holds across its gaps (two
        // RT tenants at different levels) passes to the owner without
        // shrinking: the lower work is on the other CUs already, and
        // trading one reservation between two VMs would save it at every
        // switch. (A queue of that VM still running here, a holder the
        // owner displaced, sits on the reserved CUs: it is saved, see
        // `spatial_keeps`.)
        let mut kept = false;
        let cand = cand.map(|c| match prev {
            Some(pr)
                if c.k > 0
                    && pr.k > 0
                    && pr.vm != owner.vm
                    && pr.level != owner.level
                    && self.spatial_held(p, pr) =>
            {
                kept = true;
                Reservation {
                    k: c.k.max(pr.k),
                    ..c
                }
            }
            _ => c,
        });
        let r = cand.or_else(|| {
            // The owner's own reservation while its set-up save is in
            // flight (`setup_keep.rs`): the lower work it saves is not
            // busy until that save ends.
            self.setup_keeps(p, owner, prev, lower).or_else(|| {
                prev.filter(|r| {
                    r.vm != owner.vm
                        && r.level > owner.level
                        && !r.drain
                        && self.spatial_held(p, *r)
                        && (r.k > 0 || self.coreside_still(p, *r))
                })
                .or_else(|| self.res_pass_back(p, owner.level, prev))
            })
        });
        // A co-residence takes no CU from the lower work: nothing to save.
        let establish = match (r, prev) {
            (Some(r), _) if r.k == 0 => false,
            (Some(r), Some(pr)) => {
                (pr.vm != r.vm && !kept && !Self::res_in_place(r, prev)) || r.k > pr.k || pr.k == 0
            }
            (Some(_), None) => true,
            _ => false,
        };
        // A lower RT's job on CUs of its own below a higher RT's held
        // reservation (`rt_pair.rs`).
        let (r, establish) = self.rt_pair_plan(
            p,
            PairAsk {
                owner,
                prev,
                r,
                establish,
                queues: need.map_or(0, |n| n.0),
                lat: need.and_then(|n| n.1),
            },
        );
        // A drain that overran is set up again, with a save.
        let establish = establish || self.drain_overdue_take(p, r);
        self.drain_due_note(p, r, establish, drain_wait);
        if establish {
            self.spatial.stats.established += 1;
        }
        self.res_keep_end(p, r);
        self.res_pass_note(p, prev, r, passed.is_some());
        self.spatial.res[p] = r;
        (r, establish)
    }

    /// Is there a slot of `p` for an owner at `level` beside the lower
    /// queues that would hold slots there (running or being saved, or the
    /// parked VM's busy queues that map back beside it: what a reservation
    /// or a co-residence keeps)? A partition whose slots all go to lower
    /// queues (e.g. a single slot) has none: only a preemption serves the
    /// owner.
    pub(super) fn spatial_room(&self, p: usize, level: u16) -> bool {
        self.parts[p].nslots > self.lower_resident_queues(p, level)
    }

    /// Co-residence (occupancy): may `owner` share partition `p`'s CUs with
    /// the lower work there (its VMs' busy queues below its level)?
    pub(super) fn spatial_coreside(&self, p: usize, owner: SliceOwner) -> bool {
        let max = self.cfg.spatial_coreside_ns;
        if max == 0 {
            return false;
        }
        // A CU holds two workgroups when both fit: with two lower queues
        // resident at once (running, or a parked owner's busy queues that
        // map back beside it) each CU's second place may already be taken,
        // and the owner would wait for lower workgroups to end.
        if self.lower_resident_queues(p, owner.level) >= 2 {
            return false;
        }
        // Sharing a CU at most doubles the owner's job, a delay of at most
        // its solo time `s`; the promise lets a higher VM wait one save and
        // restore of the work it displaces: `s <= t_save + t_restore`, with
        // the partition's measured save when that is longer.
        let max = self.spatial_wait_allowance(p);
        // Only for a VM that is not backlogged: the one delay of its solo
        // time is the promise's allowance per wake (one save and restore
        // of the work it displaces). A VM demanding without a break for
        // longer than one doubled job has more work than that job, and
        // sharing its CUs would halve its throughput for as long as it
        // stays demanding: lower work would take what the top level uses
        // (item 1, `fuzz-30101`: 39% of its CU time alone). It gets the
        // partition (or a reservation) instead. A periodic owner whose job
        // ends before its next one comes is not backlogged by the grace
        // that joins its gaps (`coreside_periodic.rs`).
        if self.coreside_owner_backlogged(owner.vm, max) {
            return false;
        }
        // Only the lower VMs that may hold CUs beside the owner
        // (`coreside_lower.rs`).
        let lower = self.coreside_lower_vms(p, owner);
        self.spatial
            .can_coreside(owner.vm, self.owner_queues(p, owner), lower, max)
            // ... and beside a lower kernel's last round, which leaves the
            // owner only its free CUs (`coreside_places.rs`).
            && self.coreside_places_meet(p, owner, max)
    }

    /// The owner's busy queues at its level on `p` (at least 1): each may
    /// dispatch its widest recent width at once.
    pub(super) fn owner_queues(&self, p: usize, owner: SliceOwner) -> u32 {
        self.parts[p]
            .busy
            .get(&owner.level)
            .and_then(|m| m.get(&owner.vm))
            .copied()
            .unwrap_or(1)
            .max(1)
    }

    /// Has `vm` been demanding without a break longer than its anticipation
    /// grace (`Vm::demanding_since`) for more than twice the co-residence
    /// bound `max_ns` (the longest a co-resident job may take)? Such a VM is
    /// backlogged, not a short job: co-residence would cost it throughput,
    /// not one bounded delay. An idle VM is not.
    pub(super) fn coreside_backlogged(&self, vm: VmId, max_ns: Nanos) -> bool {
        self.vms.get(&vm).is_some_and(|v| {
            v.demand > 0 && self.now.saturating_sub(v.demanding_since) > max_ns.saturating_mul(2)
        })
    }

    /// When the co-residence of partition `p`'s busy owner ends because the
    /// owner stays demanding past twice the bound (see
    /// [`Self::coreside_backlogged`]; for the timer): its next decision
    /// saves the lower work or gives the owner a reservation.
    pub(super) fn coreside_deadline(&self, p: usize) -> Option<Nanos> {
        let r = self.spatial.res.get(p).copied().flatten()?;
        if r.k != 0 {
            return None;
        }
        let v = self.vms.get(&r.vm)?;
        if v.demand == 0 {
            return None;
        }
        let max = self.spatial_wait_allowance(p);
        let backlogged = v.demanding_since.saturating_add(max.saturating_mul(2));
        // A periodic owner's job co-resides until it outlasts twice the
        // allowance (`coreside_periodic.rs`).
        let periodic = self.coreside_periodic_until(r.vm, max).unwrap_or(0);
        Some(backlogged.max(periodic).saturating_add(1))
    }

    /// How long the promise lets a higher owner of `p` wait for the lower
    /// work it displaces: one save and restore of it
    /// (`spatial_coreside_ns`, the modelled save and restore of a whole
    /// partition, or the partition's measured typical one without the waits
    /// for waves that have no save point, when that is longer).
    pub(super) fn spatial_wait_allowance(&self, p: usize) -> Nanos {
        self.cfg.spatial_coreside_ns.max(self.measured_switch(p))
    }

    /// Partition `p`'s typical CWSR save without the waits for waves that
    /// have no save point (`save_typ`, see [`Scheduler::save_wait`]): what
    /// a save of the lower work costs whatever the guests flag. (The
    /// moving average of every save, `save_ewma`, grows with those waits:
    /// as the allowance it let a lower guest's `no_save_point` kernels of
    /// 736 us workgroups raise the drain a higher RT waits for to 1.2 ms
    /// at every period, fuzz seed 50074: RT p99 700 us against 324.)
    pub(super) fn clean_save(&self, p: usize) -> Nanos {
        self.parts[p].aging.save_typ
    }

    /// A switch of partition `p` at its measured price, `t_sw`: a save of
    /// the lower work and its restore, twice [`Scheduler::clean_save`]
    /// (0: nothing measured yet).
    pub(super) fn measured_switch(&self, p: usize) -> Nanos {
        self.clean_save(p).saturating_mul(2)
    }

    /// Drain instead of save: the longest time an owner at `level` waits
    /// for the workgroups of `p`'s running lower queues to end on the CUs
    /// it reserves, when each lower VM's workgroups are at most
    /// `allowance` long (`None`: save them, or nothing lower runs). The
    /// queues being saved already free their CUs within a save.
    fn spatial_drain_wait(&self, p: usize, level: u16, allowance: Nanos) -> Option<Nanos> {
        let part = &self.parts[p];
        // The lower work on the CUs when a job of the owner comes: what
        // runs below it now, and what waits below it, which an aging batch
        // may run in the owner's gaps (a drain hands the CUs back in each
        // gap; docs/scheduling.md "A drain waits for every lower VM that
        // may hold the CUs").
        // (A VM met twice counts once: the wait is the longest; the first
        // VM that cannot drain ends the walk.)
        let running = part.running.iter().take_while(|e| e.0 < level).map(|e| e.2);
        let waiting = part.waiting[..(level as usize).min(part.waiting.len())]
            .iter()
            .flat_map(|w| w.iter().map(|e| e.1));
        let lower = running
            .chain(waiting)
            .filter_map(|q| self.queues.get(&q).map(|q| q.vm));
        self.spatial.drain_wait(lower, allowance)
    }

    /// What an owner at `level` of partition `p` waits for when its
    /// reservation saves the lower work on its CUs: the longest recent save
    /// (`Spatial::saves`) of the VMs below it that run or wait (an aging
    /// batch may run the latter in its gaps, as `spatial_drain_wait`), the
    /// partition's typical save for a VM not saved yet, and never less than
    /// that. Not the typical
    /// save alone: beside 10-40 us saves of one lower VM, another's whole-
    /// CU waves took 106-121 us to save (fuzz seed 50069, RT p99 432 us
    /// against 356 with the typical save budgeted). 0: nothing measured.
    pub(super) fn rt_save_wait(&self, p: usize, level: u16) -> Nanos {
        let typ = self.clean_save(p);
        let busy = &self.parts[p].busy;
        let busy_below = |vm: &VmId| busy.range(..level).any(|(_, vms)| vms.contains_key(vm));
        // The longest saves first: the first busy VM below `level` among
        // those longer than the typical save has the answer, usually after
        // a step or two. A lookup per busy VM cost 2-5 us per decision at
        // 4096 vMQDs (`decision_bench`); the walk of the longest saves is
        // cut at as many steps as there are busy VMs below `level`, after
        // which that lookup per busy VM is the cheaper one.
        let n_busy: usize = busy.range(..level).map(|(_, vms)| vms.len()).sum();
        for &(Reverse(s), vm) in self.spatial.saves_by_len.iter().take(n_busy) {
            if s <= typ {
                return typ;
            }
            if busy_below(&vm) {
                return s;
            }
        }
        if self.spatial.saves_by_len.len() <= n_busy {
            return typ;
        }
        busy.range(..level)
            .flat_map(|(_, vms)| vms.keys())
            .map(|vm| self.spatial.saves.get(vm).copied().unwrap_or(typ))
            .fold(typ, Nanos::max)
    }

    /// How many queues below `level` may hold CUs of `p` at once beside an
    /// owner at `level`: the lower queues running now plus the queues being
    /// saved (their workgroups keep their CUs until the save completes, and
    /// the queue replacing them takes each CU's second place meanwhile), or
    /// the busy queues of the parked (displaced) owner, which map back
    /// beside it, whichever is more.
    fn lower_resident_queues(&self, p: usize, level: u16) -> usize {
        let part = &self.parts[p];
        let running = part.running.iter().take_while(|e| e.0 < level).count() + part.freeing.len();
        let parked = part
            .parked
            .filter(|k| k.level < level)
            .and_then(|k| part.busy.get(&k.level).and_then(|m| m.get(&k.vm)))
            .map_or(0, |&n| n as usize);
        running.max(parked)
    }

    /// Does a held co-residence of an idle higher VM still hold under the
    /// lower work now in `p` (a slice switch below it may have put two
    /// lower queues on every CU)? If not it ends, and the VM's next
    /// doorbell decides afresh (a reservation or a save).
    fn coreside_still(&self, p: usize, r: Reservation) -> bool {
        let owner = SliceOwner {
            vm: r.vm,
            level: r.level,
            since: self.now,
            drained: None,
            hold: 0,
            cost_held: false,
        };
        self.spatial_coreside(p, owner)
    }

    /// Is running queue `q` off the CUs reservation `r` takes (its
    /// workgroups already on the rest, or `r` a co-residence)? A queue on
    /// them (e.g. of the VM that held the reservation before: `Top`) must
    /// be saved before the owner's workgroups can have them.
    fn off_reserved(&self, r: Reservation, q: QueueId) -> bool {
        let Some(slot) = self.queues.get(&q).and_then(|qq| qq.slot) else {
            return false;
        };
        match self.slot_cu_set(slot) {
            _ if r.k == 0 => true,
            CuSet::AllBut(j) => j >= r.k,
            _ => false,
        }
    }

    /// The one level of lower work that runs beside `owner` under the
    /// partition's reservation or co-residence `r` (`None`: none does).
    /// Every lower queue beside the owner gets the same CUs (the
    /// complement of the reservation, or every CU under a co-residence),
    /// so queues of two lower levels would share CUs: only one lower level
    /// runs beside. The highest level of the lower queues that keep
    /// running without a save (of other VMs, already off the reserved
    /// CUs; none when the reservation is new), else the parked owner's
    /// level while it is busy there (its queues map back beside).
    pub(super) fn spatial_beside_level(
        &self,
        p: usize,
        r: Option<Reservation>,
        establish: bool,
        owner: SliceOwner,
    ) -> Option<u16> {
        let r = r.filter(|r| r.vm == owner.vm)?;
        // An aging batch paused for this owner: its queues are the lower
        // work that runs beside it (the pause is the batch's time; another
        // lower level there would take it and save the batch's work).
        if let Some(l) = self.paused_batch_level(p, owner.level) {
            return Some(l);
        }
        let part = &self.parts[p];
        let running = if establish && r.k > 0 {
            None
        } else {
            part.running
                .iter()
                .filter(|e| e.0 < owner.level)
                .filter(|e| self.queues.get(&e.2).is_some_and(|q| q.vm != owner.vm))
                .filter(|e| self.off_reserved(r, e.2))
                .map(|e| e.0)
                .max()
        };
        if running.is_some() {
            return running;
        }
        part.parked
            .filter(|k| k.level < owner.level && k.vm != owner.vm)
            .filter(|k| self.vm_busy_at(p, k.vm, k.level))
            .map(|k| k.level)
    }

    /// Is a lower-level queue running in `p`?
    fn lower_running(&self, p: usize, level: u16) -> bool {
        self.parts[p]
            .running
            .first()
            .is_some_and(|&(l, _, _)| l < level)
    }

    /// How long reservation `r` in `p` outlives its VM's idle gaps: at
    /// least `spatial_hold_ns`, and as long as keeping its CUs costs the
    /// lower work less than a lapse would (`Scheduler::reservation_hold`:
    /// never shorter than the whole partition's cost-aware hold).
    fn spatial_hold_for(&self, p: usize, r: Reservation) -> Nanos {
        self.cfg.spatial_hold_ns.max(self.reservation_hold(p, r))
    }

    /// Does a reservation outlive its VM's idle gap (short re-ring gap or
    /// a gap the cost-aware hold would hold through, idle not longer than
    /// [`Scheduler::spatial_hold_for`], same level)?
    pub(super) fn spatial_held(&self, p: usize, r: Reservation) -> bool {
        let cost = self.reservation_hold(p, r);
        let hold = self.cfg.spatial_hold_ns.max(cost);
        self.vms.get(&r.vm).is_some_and(|v| {
            !v.removed
                && v.params.priority as u16 == r.level
                && (v.gap_ewma <= self.cfg.spatial_hold_ns || cost > 0)
                && (v.busy > 0 || self.now.saturating_sub(v.idle_at) <= hold)
        })
    }

    /// When a held reservation of an idle VM lapses (for the timer).
    pub(super) fn spatial_deadline(&self) -> Option<Nanos> {
        if !self.spatial.enabled() {
            return None;
        }
        self.spatial
            .res
            .iter()
            .enumerate()
            .filter_map(|(p, r)| r.map(|r| (p, r)))
            .filter_map(|(p, r)| self.vms.get(&r.vm).map(|v| (p, r, v)))
            .filter(|(_, _, v)| v.busy == 0)
            .map(|(p, r, v)| {
                v.idle_at
                    .saturating_add(self.spatial_hold_for(p, r))
                    .saturating_add(1)
            })
            .filter(|&t| t > self.now)
            .min()
    }

    /// With a reservation of the owner, a running queue of a lower level
    /// keeps running beside it (restricted to the other CUs) unless the
    /// reservation is new and not drained (a drained one keeps it: its
    /// workgroups on the reserved CUs end, no new ones start there) or its
    /// workgroups sit on the reserved CUs of a reservation that is not
    /// drained, and only at the one level `beside`
    /// ([`Scheduler::spatial_beside_level`]).
    pub(super) fn spatial_keeps(
        &self,
        r: Option<Reservation>,
        establish: bool,
        owner: SliceOwner,
        beside: Option<u16>,
        id: QueueId,
    ) -> bool {
        let q = &self.queues[&id];
        matches!(r, Some(r) if r.vm == owner.vm)
            && (!establish || r.is_some_and(|r| r.k == 0 || r.drain))
            && q.vm != owner.vm
            && lvl(q.key) < owner.level
            && beside == Some(lvl(q.key))
            && r.is_some_and(|r| r.drain || self.off_reserved(r, id))
    }

    /// With a reservation of the owner, the VM it displaced (parked) maps
    /// its waiting queues of its top key again, beside the owner, when its
    /// level is the one level `beside` ([`Scheduler::spatial_beside_level`]).
    pub(super) fn spatial_beside(
        &mut self,
        p: usize,
        r: Option<Reservation>,
        owner: SliceOwner,
        beside: Option<u16>,
    ) {
        let Some(r) = r.filter(|r| r.vm == owner.vm) else {
            return;
        };
        let Some(k) = self.parts[p]
            .parked
            .filter(|k| k.level < r.level && beside == Some(k.level))
        else {
            return;
        };
        let Some(key) = self.vms.get(&k.vm).and_then(|v| v.top_key_at(k.level)) else {
            return;
        };
        let want: Vec<QueueId> = self.vms[&k.vm].ready_in(key, key).map(|e| e.2).collect();
        let mut left = want.len();
        for q in want {
            if !self.place(p, q, left) {
                break;
            }
            left -= 1;
        }
    }

    /// A new map starts with every CU (the caller maps with
    /// [`Scheduler::slot_cu_set`], set by the sync that follows).
    pub(super) fn spatial_on_map(&mut self, slot: SlotId) {
        if let Some(s) = self.spatial.slot_cus.get_mut(slot.0 as usize) {
            *s = CuSet::All;
        }
    }

    /// Gives every mapped queue of `p` (running or idle-mapped) the CU set
    /// of the partition's reservation; queues a change for the caller.
    pub(super) fn spatial_sync(&mut self, p: usize) {
        if !self.spatial.enabled() {
            return;
        }
        if !self.spatial_on() {
            self.spatial.res[p] = None;
            self.res_keep_end(p, None);
            self.res_pass_note(p, None, None, false);
        }
        let r = self.spatial.res[p];
        self.gap_home_note(p, r);
        let part = &self.parts[p];
        if r.is_none() && part.running.is_empty() && part.idle_mapped.is_empty() {
            return;
        }
        let mapped = part
            .running
            .iter()
            .map(|e| (e.2, false))
            .chain(part.idle_mapped.iter().map(|e| (e.1, true)));
        for (q, idle) in mapped {
            let qq = &self.queues[&q];
            let Some(slot) = qq.slot else { continue };
            let home = idle.then(|| self.gap_home_set(p, r, qq.vm)).flatten();
            let pair = self.rt_pair_set(p, r, qq.vm);
            let want = pair.or(home).unwrap_or_else(|| {
                Spatial::set_for_with(r, qq.vm, || self.mapped_cu_set_level(qq))
            });
            // The set the full look-up gives (the sync before it read the
            // level from the key): every debug run compares the two.
            debug_assert!(
                (pair.is_none() && home.is_some())
                    || want
                        == pair.unwrap_or_else(|| {
                            Spatial::set_for_with(r, qq.vm, || self.cu_set_level(qq))
                        }),
                "{q:?}: the CU set from the indexed key differs from the look-up's"
            );
            let cur = &mut self.spatial.slot_cus[slot.0 as usize];
            if *cur != want {
                *cur = want;
                self.spatial.stats.mask_changes += 1;
                self.spatial.changes.push_back((q, slot, want));
            }
        }
    }
}
