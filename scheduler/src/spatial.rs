//! Spatial sharing with CU masks (docs/scheduling.md, "Spatial sharing").
//!
//! A high-priority VM whose dispatches fill only part of its partition gets
//! its own CUs (a [`CuSet::Top`] of each XCC) beside the lower work, which
//! keeps running restricted to the rest ([`CuSet::AllBut`]) instead of being
//! saved with CWSR. The engine decides *which* VM holds a reservation and how
//! large it is; this module holds the state and the sizing rule. The caller
//! (the GPU binding) turns a [`CuSet`] into the host half of the queue's CU
//! mask, which the GPU intersects with the guest's
//! `compute_static_thread_mgmt_se*` (docs/gpu-model.md).

use crate::{QueueId, SlotId, VmId};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Host CU set of a mapped queue, the same on every XCC of its partition.
/// CUs are numbered `0..cus_per_xcc` within an XCC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CuSet {
    /// Every CU (no spatial restriction).
    #[default]
    All,
    /// The highest `n` CUs of each XCC (a spatially shared high-priority VM).
    Top(u32),
    /// Every CU but the highest `n` of each XCC (lower work beside it).
    AllBut(u32),
    /// The `n` CUs of each XCC just below its highest `above`: a lower RT
    /// beside a higher RT's held reservation (`engine/rt_pair.rs`).
    Mid {
        /// Highest CUs of each XCC left to the higher RT.
        above: u32,
        /// CUs per XCC of this set.
        n: u32,
    },
}

impl CuSet {
    /// Is CU `cu` (index within its XCC) in the set, for `cus_per_xcc` CUs
    /// per XCC?
    pub fn contains(self, cu: u32, cus_per_xcc: u32) -> bool {
        if cu >= cus_per_xcc {
            return false;
        }
        let first_top = cus_per_xcc.saturating_sub(match self {
            CuSet::All => 0,
            CuSet::Top(n) | CuSet::AllBut(n) => n,
            CuSet::Mid { above, .. } => above,
        });
        match self {
            CuSet::All => true,
            CuSet::Top(_) => cu >= first_top,
            CuSet::AllBut(_) => cu < first_top,
            CuSet::Mid { n, .. } => cu < first_top && cu >= first_top.saturating_sub(n),
        }
    }

    /// Do the two sets share no CU (for `cus_per_xcc` CUs per XCC)?
    pub fn disjoint(self, other: CuSet, cus_per_xcc: u32) -> bool {
        (0..cus_per_xcc).all(|c| !(self.contains(c, cus_per_xcc) && other.contains(c, cus_per_xcc)))
    }
}

/// A partition's CU reservation for one VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// The VM holding it.
    pub vm: VmId,
    /// Its level when it was sized.
    pub level: u16,
    /// CUs per XCC it holds (`CuSet::Top(k)`); 0: co-residence, the VM
    /// shares every CU with the lower work (occupancy).
    pub k: u32,
    /// Established by draining: the lower work's workgroups on its CUs
    /// end (no save), because each is at most one save and restore long.
    /// Costs the lower work nothing to take again, so it is not held
    /// across its VM's idle gaps.
    pub drain: bool,
    /// Sized by the RT bound alone for a VM wider than the cap
    /// (`Spatial::size_wide`): it ends when the VM stays demanding past
    /// twice its job's time on it (backlogged, not a periodic job).
    pub wide: bool,
}

/// What a VM's recent dispatches need of a CU (from
/// [`crate::Scheduler::note_dispatch_occupancy`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Occupancy {
    /// Solo run time of the dispatches of its latest doorbell (sum of one
    /// workgroup's cost per kernel), decaying by 1/8 per shorter one.
    pub solo_ns: u64,
    /// Every workgroup of its latest doorbell's dispatches fits in half a
    /// CU.
    pub fits: bool,
    /// An occupancy was recorded ([`Spatial::note_occupancy`]): `fits`
    /// tells, rather than its default (a VM that rang only a queue's first
    /// doorbell, or only incomplete scans).
    pub noted: bool,
    /// CU time of its latest doorbell's dispatches (each kernel's
    /// workgroups times one workgroup's cost, summed), decaying by 1/8 per
    /// smaller one; 0: not reported. With `solo_ns` it bounds the job's
    /// time on `c` CUs kernel by kernel (`Spatial::size_for_latency`).
    pub work_ns: u64,
    /// When its last doorbell with new work came (`None`: none yet).
    pub last_arrival: Option<u64>,
    /// Moving average (1/8) of the time between its doorbells with new
    /// work, ns (0: fewer than two seen). A periodic tenant's period (its
    /// queues' jobs together): a reservation on which a job runs longer
    /// than this never drains its queue (`Spatial::size_for_latency`).
    pub interval_ns: u64,
    /// What a drain of its work waits for (`Spatial::drain_wait`): over its
    /// doorbells since its demand last ended, the longest workgroup that
    /// needs a whole CU, or twice the longest that fits half a CU (it may
    /// share its CU at half rate), whichever is longer. It never decays
    /// while the VM stays busy: a workgroup of an earlier doorbell may
    /// still be in flight behind any number of shorter ones. 0: not
    /// reported (`solo_ns` bounds it then); `u64::MAX`: a dispatch without
    /// an estimate (never drained).
    pub drain_ns: u64,
}

/// Counters of spatial sharing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpatialStats {
    /// Reservations established (each one preempts lower work that may sit
    /// on the reserved CUs once).
    pub established: u64,
    /// Host CU-set changes of mapped queues.
    pub mask_changes: u64,
    /// Decisions in which a high-priority owner's demand did not fit the
    /// spatial cap, so lower work was preempted instead.
    pub fallbacks: u64,
    /// Decisions in which a higher owner co-resides with lower work (no
    /// reservation, no save).
    pub coresidences: u64,
    /// Drains that overran: lower workgroups still on the reserved CUs
    /// at twice the wait the drain was set up with (each set the
    /// reservation up again with a save; `engine/drain_due.rs`).
    pub drains_overdue: u64,
}

/// Spatial-sharing state of the engine.
#[derive(Debug, Default)]
pub(crate) struct Spatial {
    /// CUs per XCC (0: spatial sharing off, the default of a bare scheduler).
    pub cus_per_xcc: u32,
    /// XCCs per partition.
    pub xccs: u32,
    /// Per VM: widest recent dispatch (workgroups), decaying by 1/8 per
    /// narrower dispatch.
    pub width: BTreeMap<VmId, u64>,
    /// Per partition: current reservation.
    pub res: Vec<Option<Reservation>>,
    /// Per slot: host CU set given to the queue on it.
    pub slot_cus: Vec<CuSet>,
    /// CU-set changes of mapped queues for the caller.
    pub changes: VecDeque<(QueueId, SlotId, CuSet)>,
    pub stats: SpatialStats,
    /// Per VM: occupancy of its recent dispatches.
    pub occ: BTreeMap<VmId, Occupancy>,
    /// Per VM: its last [`RECENT_WIDTHS`] dispatch widths (the lock-step
    /// rounds a reservation costs each of its kernels: `engine/res_hold.rs`).
    pub recent: BTreeMap<VmId, RecentWidths>,
    /// Per VM: its last [`RECENT_WIDTHS`] kernels' widths, each kernel of a
    /// doorbell apart (`recent` keeps a doorbell's widest): the last
    /// rounds its kernels leave partly free (`engine/coreside_places.rs`).
    pub kernels: BTreeMap<VmId, RecentWidths>,
    /// Per partition: the VMs that held its reservation and still hold it
    /// (in place or across their gaps), each with the size it was last
    /// given as owner (`engine/res_keep.rs`): the reservation does not
    /// shrink below another holder's.
    pub keep: Vec<Vec<Reservation>>,
    /// Per partition: when the drained reservation set up last must have
    /// drained, twice the wait it was set up with (`None`: no drain to
    /// check; `engine/drain_due.rs`).
    pub drain_due: Vec<Option<u64>>,
    /// Per partition: a drain overran ([`crate::Scheduler::drain_overdue`]):
    /// the next plan sets the reservation up again, with a save.
    pub overdue: Vec<bool>,
    /// Per VM: the longest of its queues' save records
    /// ([`Self::queue_saves`]): what a higher RT waits for when its
    /// reservation takes CUs from the VM (`Scheduler::rt_save_wait`).
    pub saves: BTreeMap<VmId, u64>,
    /// Per queue (keyed by its VM): its longest recent save without waits
    /// for waves that have no save point, decaying by 1/8 per shorter save
    /// of the same queue (`engine/queue_save.rs`).
    pub queue_saves: BTreeMap<(VmId, QueueId), u64>,
    /// [`Self::saves`] longest first, so the longest save among a few busy
    /// VMs is found without a lookup per busy VM
    /// (`Scheduler::rt_save_wait`). Kept by [`Self::note_save`],
    /// [`Self::forget_queue_save`] and [`Self::forget_saves`].
    pub saves_by_len: BTreeSet<(Reverse<u64>, VmId)>,
    /// Per VM whose saves waited for its own waves without a save point:
    /// its longest recent whole save, what a higher RT waits for
    /// (`engine/nsp_save.rs`).
    pub waited: crate::engine::WaitedSaves,
    /// Per partition: the lower VM's reservation a higher owner without
    /// one of its own took over (`engine/res_pass.rs`): it goes back to
    /// that VM, without a save, while it still holds.
    pub passed: Vec<Option<Reservation>>,
    /// Per partition: a lower RT's reservation on the CUs below a higher
    /// RT's held one, for the lower RT's job (`engine/rt_pair.rs`).
    pub pair: Vec<Option<RtPair>>,
    /// Per partition: the last reservation with CUs of its own, kept while
    /// its owner is idle between jobs: the owner's idle mapped queues keep
    /// those CUs as their set when no reservation is in place, so its next
    /// job's first kernel (placed at the doorbell, before the decision)
    /// lands on them (`engine/gap_home.rs`).
    pub home: Vec<Option<Reservation>>,
}

/// A lower RT on CUs of its own below a higher RT's held reservation
/// (`engine/rt_pair.rs`): `hi` on `CuSet::Top(hi.k)`, `lo` on
/// `CuSet::Mid { above: hi.k, n: lo.k }`, the lower work on the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RtPair {
    /// The higher RT's held reservation.
    pub hi: Reservation,
    /// The lower RT's part, below `hi`'s CUs.
    pub lo: Reservation,
}

impl RtPair {
    /// CUs per XCC of both parts (the partition's reservation).
    pub fn k(&self) -> u32 {
        self.hi.k.saturating_add(self.lo.k)
    }

    /// The CU set of `vm` when it is a member (`None`: not one).
    pub fn set_of(&self, vm: VmId) -> Option<CuSet> {
        if vm == self.hi.vm {
            Some(CuSet::Top(self.hi.k))
        } else if vm == self.lo.vm {
            Some(CuSet::Mid {
                above: self.hi.k,
                n: self.lo.k,
            })
        } else {
            None
        }
    }
}

/// How many of a VM's latest dispatch widths [`RecentWidths`] keeps.
pub(crate) const RECENT_WIDTHS: usize = 8;

/// A VM's latest dispatch widths, in a ring (0: no dispatch there yet).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RecentWidths {
    w: [u64; RECENT_WIDTHS],
    next: usize,
}

impl RecentWidths {
    /// Records one dispatch of `wgs` workgroups (0 is ignored).
    pub fn push(&mut self, wgs: u64) {
        if wgs == 0 {
            return;
        }
        self.w[self.next % RECENT_WIDTHS] = wgs;
        self.next = (self.next + 1) % RECENT_WIDTHS;
    }

    /// The widths recorded (at most [`RECENT_WIDTHS`], any order).
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.w.iter().copied().filter(|&w| w > 0)
    }
}

impl Spatial {
    /// Is spatial sharing possible (geometry known)?
    pub fn enabled(&self) -> bool {
        self.cus_per_xcc > 0 && self.xccs > 0
    }

    /// Records a dispatch of `wgs` workgroups by `vm`.
    pub fn note(&mut self, vm: VmId, wgs: u64) {
        let w = self.width.entry(vm).or_insert(0);
        *w = wgs.max(*w - *w / 8);
        self.recent.entry(vm).or_default().push(wgs);
    }

    /// Records one kernel of `wgs` workgroups dispatched by `vm`
    /// ([`Self::kernels`]).
    pub fn note_kernel(&mut self, vm: VmId, wgs: u64) {
        self.kernels.entry(vm).or_default().push(wgs);
    }

    /// Records the occupancy of a doorbell's dispatches by `vm`.
    pub fn note_occupancy(&mut self, vm: VmId, solo_ns: u64, fits: bool) {
        let o = self.occ.entry(vm).or_default();
        o.solo_ns = solo_ns.max(o.solo_ns - o.solo_ns / 8);
        o.fits = fits;
        o.noted = true;
    }

    /// Records a save of `save_ns` of `vm`'s queue `queue`
    /// ([`Self::queue_saves`]) and sets the VM's record ([`Self::saves`])
    /// to the longest of its queues' records (`engine/queue_save.rs`).
    pub fn note_save(&mut self, vm: VmId, queue: QueueId, save_ns: u64) {
        if save_ns == 0 {
            return;
        }
        let r = self.queue_saves.entry((vm, queue)).or_insert(0);
        *r = save_ns.max(*r - *r / 8);
        self.set_vm_save(vm);
    }

    /// Sets `vm`'s save record to the longest of its queues' records
    /// (none: no record).
    fn set_vm_save(&mut self, vm: VmId) {
        let longest = self
            .queue_saves
            .range((vm, QueueId(0))..=(vm, QueueId(u64::MAX)))
            .map(|(_, &r)| r)
            .max();
        if let Some(s) = self.saves.remove(&vm) {
            self.saves_by_len.remove(&(Reverse(s), vm));
        }
        if let Some(s) = longest {
            self.saves.insert(vm, s);
            self.saves_by_len.insert((Reverse(s), vm));
        }
    }

    /// Forgets the saves of `vm`'s queue `queue` (the queue is removed).
    pub fn forget_queue_save(&mut self, vm: VmId, queue: QueueId) {
        if self.queue_saves.remove(&(vm, queue)).is_some() {
            self.set_vm_save(vm);
        }
    }

    /// Forgets `vm`'s saves (the VM is removed).
    pub fn forget_saves(&mut self, vm: VmId) {
        if let Some(s) = self.saves.remove(&vm) {
            self.saves_by_len.remove(&(Reverse(s), vm));
        }
        let qs: Vec<_> = self
            .queue_saves
            .range((vm, QueueId(0))..=(vm, QueueId(u64::MAX)))
            .map(|(&k, _)| k)
            .collect();
        for k in qs {
            self.queue_saves.remove(&k);
        }
    }

    /// Records the CU time of a doorbell's dispatches by `vm`
    /// ([`Occupancy::work_ns`]). A VM whose occupancy is not known yet is
    /// not recorded (as [`Self::note_longest_wg`]).
    pub fn note_work(&mut self, vm: VmId, work_ns: u64) {
        if let Some(o) = self.occ.get_mut(&vm) {
            o.work_ns = work_ns.max(o.work_ns - o.work_ns / 8);
        }
    }

    /// Records a doorbell's dispatches by `vm` for its drain bound
    /// ([`Occupancy::drain_ns`]): `whole_ns` and `half_ns`, its longest
    /// workgroups that need a whole CU and that fit half a CU (0: none;
    /// `u64::MAX`: a dispatch without an estimate).
    /// A VM whose occupancy is not known yet ([`Self::note_occupancy`]: a
    /// complete scan of a doorbell) is not recorded: an entry would make it
    /// look known (solo time 0) to every other occupancy rule.
    pub fn note_longest_wg(&mut self, vm: VmId, whole_ns: u64, half_ns: u64) {
        if let Some(o) = self.occ.get_mut(&vm) {
            o.drain_ns = o.drain_ns.max(whole_ns).max(half_ns.saturating_mul(2));
        }
    }

    /// `vm`'s workgroups overran a drain: it is not drained again before
    /// its demand ends ([`Self::end_busy`]).
    pub fn never_drain(&mut self, vm: VmId) {
        if let Some(o) = self.occ.get_mut(&vm) {
            o.drain_ns = u64::MAX;
        }
    }

    /// `vm`'s demand ended (no workgroup of it in flight): its drain bound
    /// starts afresh with its next doorbell.
    pub fn end_busy(&mut self, vm: VmId) {
        if let Some(o) = self.occ.get_mut(&vm) {
            o.drain_ns = 0;
        }
    }

    /// Records a doorbell of `vm` with new work at `now` (the interval
    /// between its jobs: see [`Occupancy::interval_ns`]). Times that go
    /// backwards are ignored.
    pub fn note_arrival(&mut self, vm: VmId, now: u64) {
        let o = self.occ.entry(vm).or_default();
        if let Some(last) = o.last_arrival {
            let Some(gap) = now.checked_sub(last) else {
                return;
            };
            o.interval_ns = match o.interval_ns {
                0 => gap,
                e => e - e / 8 + gap / 8,
            };
        }
        o.last_arrival = Some(now);
    }

    /// Can `vm` (the higher owner, `queues` busy queues) share CUs with
    /// lower work of `lower` VMs: its workgroups and theirs each take at
    /// most half a CU, and the delay sharing may cause is at most `max_ns`.
    /// Sharing a CU halves the rate of each of the job's rounds, so the
    /// shared job takes up to twice its alone time `A` on the whole
    /// partition ([`Self::alone_ns`], an upper bound), against an isolated
    /// time of at least one round, its solo time `s`: the delay is at most
    /// `2A - s`, not one round. A job of 4 rounds of 46.5 us admitted on
    /// `s` alone ran 353 us against an isolated 88 us (fuzz seed 50113,
    /// docs/scheduling.md "Co-residence admission"). For a one-round job
    /// (`A = s`) this is the old `s <= max_ns`.
    pub fn can_coreside(
        &self,
        vm: VmId,
        queues: u32,
        lower: impl IntoIterator<Item = VmId>,
        max_ns: u64,
    ) -> bool {
        let ok = |v: &VmId| self.occ.get(v).is_some_and(|o| o.fits);
        let mut lower = lower.into_iter().peekable();
        max_ns > 0
            && lower.peek().is_some()
            && ok(&vm)
            && self.coreside_delay(vm, queues).is_some_and(|d| d <= max_ns)
            && lower.all(|v| ok(&v))
    }

    /// The most sharing every CU delays `vm`'s job on `queues` busy queues:
    /// `2A - s` (see [`Self::can_coreside`]; `None` without a width or a
    /// solo time).
    pub fn coreside_delay(&self, vm: VmId, queues: u32) -> Option<u64> {
        let a = self.alone_ns(vm, queues)?;
        let s = self.occ.get(&vm)?.solo_ns;
        Some(a.saturating_mul(2).saturating_sub(s))
    }

    /// How long `vm`'s job runs alone on the whole partition on `queues`
    /// busy queues: `ceil(need / N)` rounds (its widest dispatch on each
    /// queue, `N` CUs of the partition) of its solo time (one workgroup's
    /// cost per kernel, summed). An upper bound of the isolated time (the
    /// widest dispatch's rounds for every kernel). `None` without a width
    /// or a solo time.
    pub fn alone_ns(&self, vm: VmId, queues: u32) -> Option<u64> {
        let n = (self.cus_per_xcc.max(1) as u64).saturating_mul(self.xccs.max(1) as u64);
        self.time_on_cus(vm, queues, n)
    }

    /// How long a higher owner waits for the workgroups of the lower VMs
    /// `lower` to end on the CUs it takes, when that is at most `max_ns`
    /// (one save and restore: draining is then no slower for the owner
    /// than a save, and costs the lower work no save or restore). Each
    /// VM's bound is its recent longest workgroup (a drain waits only for
    /// the workgroups in flight on the reserved CUs: no new one starts
    /// there), or its recent solo time (one workgroup's cost per kernel,
    /// summed: at least its longest workgroup) when the longest is not
    /// reported. The solo time sums every packet of a doorbell: a lower
    /// closed loop of 4 jobs of 6 kernels of 33-50 us workgroups rings
    /// 1 ms of solo time, and was saved at every RT period instead of
    /// drained (fuzz seed 50129). `None`: a lower VM not seen yet, no lower
    /// VM, or one whose workgroups are longer.
    pub fn drain_wait(&self, lower: impl IntoIterator<Item = VmId>, max_ns: u64) -> Option<u64> {
        let mut wait = None;
        for v in lower {
            let o = self.occ.get(&v)?;
            // A workgroup that fits half a CU may share its CU (another
            // lower queue's, or the owner's guests placed beside it), each
            // at half rate: it ends within twice its cost (fuzz seed
            // 50142: four lower queues of 188 us half-CU workgroups, a
            // drain bounded by one cost made the RT wait past its bound,
            // p99 363 us against 295).
            let s = match o.drain_ns {
                0 => o.solo_ns,
                d => d,
            };
            if s == 0 || s > max_ns {
                return None;
            }
            wait = Some(wait.map_or(s, |w: u64| w.max(s)));
        }
        wait
    }

    /// CUs per XCC a VM needs for its widest recent dispatch on each of
    /// `queues` busy queues, with `headroom_pct` percent headroom clipped
    /// to the cap (`None`: no dispatch seen, or the need itself, without
    /// headroom, more than `max_permille` of the XCC).
    pub fn size(&self, vm: VmId, queues: u32, headroom_pct: u32, max_permille: u32) -> Option<u32> {
        let w = *self.width.get(&vm)?;
        if w == 0 {
            return None;
        }
        let need = w.saturating_mul(queues.max(1) as u64);
        let xccs = (self.xccs as u64).max(1);
        let base = need.div_ceil(xccs).max(1);
        let cap = self.cus_per_xcc as u64 * max_permille.min(1000) as u64 / 1000;
        if base > cap || base >= self.cus_per_xcc as u64 {
            return None;
        }
        let with_headroom = need
            .saturating_mul(100 + headroom_pct as u64)
            .div_ceil(100)
            .div_ceil(xccs);
        let k = with_headroom
            .min(cap)
            .min(self.cus_per_xcc as u64 - 1)
            .max(base);
        Some(k as u32)
    }

    /// CUs per XCC with which `vm`'s job still meets the promise's RT
    /// bound (1.1 x its isolated time + `switch_ns`, what the bound allows
    /// beyond it once the RT's own wait is paid) on `queues` busy queues.
    /// Two upper bounds of the job's time on `c` CUs, either enough: its
    /// widest dispatch runs `ceil(need / c)` rounds, each at most its solo
    /// time (one workgroup's cost per kernel, summed), against
    /// `ceil(need / N)` rounds on the whole partition's `N`; and, with its
    /// CU time `work` reported, kernel by kernel `sum ceil(W_i / c) x
    /// cost_i <= work / c + solo` (the first counts every kernel at the
    /// widest one's rounds: an RT of 53 and 32 workgroups of 23 us and 3 x
    /// 66 of 7.8 us was sized 9 CUs per XCC where 2 meet its bound, fuzz
    /// seed 97236), against an isolated time of at least `max(solo, work /
    /// N)`. The fewer CUs of the two. The bound holds only for a job that
    /// finds its queue empty: the job's time is also at most half the VM's
    /// measured interval between jobs less `wait_ns` (what each job waits
    /// before it runs there, e.g. a drain), so a job ends well before the
    /// next arrives and no backlog builds up on the reservation (a 8 kHz RT
    /// sized to one CU per XCC by latency alone ran each job longer than
    /// its period: p99 14 ms), nor does it outlast an aging batch's yield
    /// ([`Self::size_for_latency_whole`]: the whole interval, where no
    /// stall can come, `engine/rt_room.rs`).
    /// `None` without a solo time or a switch (nothing to size from: the
    /// width decides).
    pub fn size_for_latency(
        &self,
        vm: VmId,
        queues: u32,
        switch_ns: u64,
        wait_ns: u64,
    ) -> Option<u32> {
        self.size_for_latency_in(vm, queues, switch_ns, wait_ns, None)
    }

    /// [`Self::size_for_latency`] with the job held to the VM's whole
    /// measured interval less `gap_ns` and `wait_ns` instead of half of it
    /// (the job ends a gap of `gap_ns` before the next one arrives), for
    /// an owner no stall can reach (`engine/rt_room.rs`).
    pub fn size_for_latency_whole(
        &self,
        vm: VmId,
        queues: u32,
        switch_ns: u64,
        wait_ns: u64,
        gap_ns: u64,
    ) -> Option<u32> {
        let whole = self
            .interval_ns(vm)
            .filter(|&i| i > 0)
            .map(|i| i.saturating_sub(gap_ns));
        self.size_for_latency_in(vm, queues, switch_ns, wait_ns, whole)
    }

    /// The measured interval between `vm`'s jobs (0: not measured yet;
    /// `None`: no occupancy recorded).
    pub fn interval_ns(&self, vm: VmId) -> Option<u64> {
        self.occ.get(&vm).map(|o| o.interval_ns)
    }

    /// [`Self::size_for_latency`] with the job held to `within_ns` instead
    /// of half the VM's measured interval (`None`: half the interval):
    /// [`Self::size_wide`] gives the whole interval, its job's time being
    /// held by its own `max_time_ns`.
    fn size_for_latency_in(
        &self,
        vm: VmId,
        queues: u32,
        switch_ns: u64,
        wait_ns: u64,
        within_ns: Option<u64>,
    ) -> Option<u32> {
        let need = self.width.get(&vm)?.saturating_mul(queues.max(1) as u64);
        let o = self.occ.get(&vm)?;
        let solo = o.solo_ns;
        let xccs = (self.xccs as u64).max(1);
        let n = (self.cus_per_xcc as u64).saturating_mul(xccs);
        if need == 0 || solo == 0 || switch_ns == 0 || n == 0 {
            return None;
        }
        let alone_rounds = need.div_ceil(n);
        // Rounds allowed: floor((1.1 x alone_rounds x solo + switch) / solo).
        let by_bound = alone_rounds
            .saturating_mul(11)
            .saturating_mul(solo)
            .saturating_add(switch_ns.saturating_mul(10))
            / solo.saturating_mul(10);
        // ... and floor((interval / 2 - wait) / solo): the job ends within
        // half the interval (not fewer rounds than alone: a VM whose jobs
        // come faster than they run alone is backlogged anywhere). Half,
        // as an aging batch yields to a demand-limited VM for at most half
        // its length (`AGING_YIELD_NS`): a job filling its whole interval
        // (the bound's allowance spent on fewer CUs: 397 us jobs every 432
        // us, fuzz seed 97138) used the batch's yield up within a few jobs
        // and then waited for the rest of the batch (p99 2828 us against
        // 460). A wide reservation's job is held to half its period too.
        let room = match (within_ns, o.interval_ns) {
            (Some(t), _) => Some(t.saturating_sub(wait_ns)),
            (None, 0) => None,
            (None, i) => Some((i / 2).saturating_sub(wait_ns)),
        };
        let rounds = match room {
            None => by_bound,
            Some(r) => by_bound.min((r / solo).max(alone_rounds)),
        };
        let by_rounds = need.div_ceil(rounds.max(1));
        let c = match self.cus_by_work(o, queues, n, switch_ns, room) {
            Some(w) => by_rounds.min(w),
            None => by_rounds,
        };
        Some(c.div_ceil(xccs).max(1) as u32)
    }

    /// The fewest CUs `c` (at most `n`) with `work / c + solo` within the
    /// RT bound `1.1 x max(solo, work / n) + switch_ns` and within `room`
    /// (half the interval between jobs less the wait, if measured), for a VM of
    /// occupancy `o` on `queues` busy queues (`None`: no work reported, or
    /// no `c` fits).
    fn cus_by_work(
        &self,
        o: &Occupancy,
        queues: u32,
        n: u64,
        switch_ns: u64,
        room: Option<u64>,
    ) -> Option<u64> {
        let work = o.work_ns.saturating_mul(queues.max(1) as u64);
        let solo = o.solo_ns;
        if work == 0 {
            return None;
        }
        let alone = solo.max(work / n);
        let mut budget = (alone.saturating_mul(11) / 10).saturating_add(switch_ns);
        if let Some(r) = room {
            // (Below the bound's time on the whole partition, `c` exceeds
            // `n`: the rounds model decides.)
            budget = budget.min(r);
        }
        let left = budget.checked_sub(solo).filter(|&l| l > 0)?;
        let c = work.div_ceil(left).max(1);
        (c <= n).then_some(c)
    }

    /// CUs per XCC of a reservation for a VM whose width is above the cap
    /// (`size` gives `None`): the fewest with which its job meets the RT
    /// bound (`size_for_latency`, switch `switch_ns`) and runs in at most
    /// `max_time_ns` (`time_on`; kept across its gaps, it waits for no
    /// drain: `wait_ns` 0), when that fits `max_permille` of an XCC
    /// and leaves a CU per XCC; else `None` (the partition is preempted
    /// whole).
    pub fn size_wide(
        &self,
        vm: VmId,
        queues: u32,
        switch_ns: u64,
        max_time_ns: u64,
        max_permille: u32,
    ) -> Option<u32> {
        // The latency sizing's room is the whole measured interval (the
        // job's time is held to `max_time_ns` by the load below): half of
        // it would undo a kept wide reservation's whole period
        // (`engine/wide_fit.rs`), and `max_time_ns` itself sent fuzz seed
        // 50009's closed-loop top VM (38 us think time) from the half
        // period's sizing to the kept one: 0.791 of its alone CU time.
        let whole = self.occ.get(&vm).map(|o| o.interval_ns).filter(|&i| i > 0);
        let lat = self.size_for_latency_in(vm, queues, switch_ns, 0, whole)?;
        let need = self.width.get(&vm)?.saturating_mul(queues.max(1) as u64);
        let solo = self.occ.get(&vm)?.solo_ns;
        let xccs = (self.xccs as u64).max(1);
        let rounds = max_time_ns / solo.max(1);
        if rounds == 0 {
            return None;
        }
        let load = need.div_ceil(rounds).div_ceil(xccs).max(1);
        let k = (lat as u64).max(load);
        let cap = self.cus_per_xcc as u64 * max_permille.min(1000) as u64 / 1000;
        (k <= cap && k < self.cus_per_xcc as u64).then_some(k as u32)
    }

    /// How long `vm`'s job runs on `k` CUs per XCC on `queues` busy
    /// queues: `ceil(need / (k x XCCs))` rounds of its solo time (`None`
    /// without a width or a solo time).
    pub fn time_on(&self, vm: VmId, queues: u32, k: u32) -> Option<u64> {
        let c = (k as u64).saturating_mul(self.xccs.max(1) as u64);
        self.time_on_cus(vm, queues, c)
    }

    /// `ceil(need / c)` rounds of `vm`'s solo time on `c` CUs in all.
    pub fn time_on_cus(&self, vm: VmId, queues: u32, c: u64) -> Option<u64> {
        let need = self.width.get(&vm)?.saturating_mul(queues.max(1) as u64);
        let solo = self.occ.get(&vm)?.solo_ns;
        if need == 0 || solo == 0 || c == 0 {
            return None;
        }
        Some(need.div_ceil(c).saturating_mul(solo))
    }

    /// [`Self::set_for_with`] with the level given.
    #[cfg(test)]
    pub fn set_for(r: Option<Reservation>, vm: VmId, level: u16) -> CuSet {
        Self::set_for_with(r, vm, || level)
    }

    /// The set a queue of `vm` at level `level()` gets under reservation
    /// `r`: the holder's queues, and those of other VMs at its level or
    /// above (an equal's mapped queue that rings during the holder's
    /// anticipation runs at once), the reserved CUs; only lower work the
    /// rest. The level is asked only when the set depends on it (a
    /// reservation with CUs of another VM): the CU-set sync's pass over
    /// the mapped queues then looks nothing up for the others.
    pub fn set_for_with(r: Option<Reservation>, vm: VmId, level: impl FnOnce() -> u16) -> CuSet {
        match r {
            None => CuSet::All,
            Some(r) if r.k == 0 => CuSet::All,
            Some(r) if r.vm == vm || level() >= r.level => CuSet::Top(r.k),
            Some(r) => CuSet::AllBut(r.k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The longest-first index of the saves is the saves map, sorted,
        /// whatever the order of saves and removals.
        #[test]
        fn the_saves_index_follows_the_saves(
            ops in prop::collection::vec(
                (0u32..6, 0u64..300_000, 0u64..3, 0u8..4),
                0..80
            )
        ) {
            let mut s = Spatial::default();
            for (vm, ns, q, op) in ops {
                match op {
                    0 => s.forget_saves(VmId(vm)),
                    1 => s.forget_queue_save(VmId(vm), QueueId(q)),
                    _ => s.note_save(VmId(vm), QueueId(q), ns),
                }
                // A VM's record is the longest of its queues' records.
                for (&v, &r) in &s.saves {
                    let longest = s
                        .queue_saves
                        .iter()
                        .filter(|((qv, _), _)| *qv == v)
                        .map(|(_, &qr)| qr)
                        .max();
                    prop_assert_eq!(Some(r), longest);
                }
                let mut want: Vec<_> = s.saves.iter().map(|(v, n)| (Reverse(*n), *v)).collect();
                want.sort();
                let got: Vec<_> = s.saves_by_len.iter().copied().collect();
                prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn top_and_all_but_split_every_xcc() {
        for n in 0..=10 {
            for k in 0..=n {
                let top = CuSet::Top(k);
                let rest = CuSet::AllBut(k);
                assert!(top.disjoint(rest, n));
                let covered = (0..n).filter(|&c| top.contains(c, n) || rest.contains(c, n));
                assert_eq!(covered.count() as u32, n);
                assert_eq!((0..n).filter(|&c| top.contains(c, n)).count() as u32, k);
            }
        }
        assert!(!CuSet::All.contains(5, 5));
        assert!(!CuSet::All.disjoint(CuSet::Top(1), 4));
    }

    #[test]
    fn coresidence_needs_small_workgroups_on_both_sides_and_a_short_job() {
        let mut s = Spatial {
            cus_per_xcc: 38,
            xccs: 8,
            ..Default::default()
        };
        let (hi, lo, lo2) = (VmId(1), VmId(2), VmId(3));
        // Nothing seen: no.
        assert!(!s.can_coreside(hi, 1, [lo], 100_000));
        s.note_occupancy(hi, 5_000, true);
        s.note_occupancy(lo, 10_000_000, true);
        // No width seen: no alone time to admit on.
        assert!(!s.can_coreside(hi, 1, [lo], 100_000));
        s.note(hi, 304);
        assert!(s.can_coreside(hi, 1, [lo], 100_000));
        // Disabled, no lower work, or a lower VM not seen / too wide.
        assert!(!s.can_coreside(hi, 1, [lo], 0));
        assert!(!s.can_coreside(hi, 1, [], 100_000));
        assert!(!s.can_coreside(hi, 1, [lo, lo2], 100_000));
        s.note_occupancy(lo2, 1_000, false);
        assert!(!s.can_coreside(hi, 1, [lo, lo2], 100_000));
        // A job longer than the bound (12 kernels x 50 us): no.
        s.note_occupancy(hi, 600_000, true);
        assert!(!s.can_coreside(hi, 1, [lo], 100_000));
        // Decays by 1/8 per shorter doorbell.
        s.note_occupancy(hi, 5_000, true);
        assert_eq!(s.occ[&hi].solo_ns, 525_000);
        // Admission is on the job's rounds, not one round: 46.5 us of solo
        // time over 1216 workgroups (4 rounds of the 304 CUs) is at most a
        // 186 us job alone, up to 372 us shared, against at least 46.5 us
        // isolated: a delay of up to 325.5 us, above a 240 us bound. Busy
        // queues each add the width: 152 on 2 queues is one round
        // (delay 46.5 us), on 3 two rounds (delay 139.5 us).
        let mut s = Spatial {
            cus_per_xcc: 38,
            xccs: 8,
            ..Default::default()
        };
        s.note_occupancy(hi, 46_500, true);
        s.note_occupancy(lo, 1_728_000, true);
        s.note(hi, 1216);
        assert_eq!(s.alone_ns(hi, 1), Some(186_000));
        assert_eq!(s.coreside_delay(hi, 1), Some(325_500));
        assert!(!s.can_coreside(hi, 1, [lo], 240_000));
        assert!(s.can_coreside(hi, 1, [lo], 325_500));
        let mut s2 = Spatial {
            cus_per_xcc: 38,
            xccs: 8,
            ..Default::default()
        };
        s2.note_occupancy(hi, 46_500, true);
        s2.note_occupancy(lo, 1_728_000, true);
        s2.note(hi, 152);
        assert_eq!(s2.coreside_delay(hi, 2), Some(46_500));
        assert!(s2.can_coreside(hi, 2, [lo], 100_000));
        assert_eq!(s2.coreside_delay(hi, 3), Some(139_500));
        assert!(!s2.can_coreside(hi, 3, [lo], 100_000));
        // A co-residence gives both every CU.
        let r = Some(Reservation {
            vm: hi,
            level: 12,
            k: 0,
            drain: false,
            wide: false,
        });
        assert_eq!(Spatial::set_for(r, hi, 12), CuSet::All);
        assert_eq!(Spatial::set_for(r, lo, 2), CuSet::All);
    }

    #[test]
    fn only_lower_work_gets_the_rest_of_a_reservation() {
        let (hi, eq, lo) = (VmId(1), VmId(2), VmId(3));
        let r = Some(Reservation {
            vm: hi,
            level: 12,
            k: 3,
            drain: false,
            wide: false,
        });
        assert_eq!(Spatial::set_for(r, hi, 12), CuSet::Top(3));
        // An equal (or a higher VM) never lands on the lower work's CUs.
        assert_eq!(Spatial::set_for(r, eq, 12), CuSet::Top(3));
        assert_eq!(Spatial::set_for(r, eq, 13), CuSet::Top(3));
        assert_eq!(Spatial::set_for(r, lo, 11), CuSet::AllBut(3));
        assert_eq!(Spatial::set_for(None, lo, 11), CuSet::All);
    }

    #[test]
    fn latency_sizing_takes_the_fewest_cus_that_meet_the_rt_bound() {
        let mut s = Spatial {
            cus_per_xcc: 38,
            xccs: 8,
            ..Default::default()
        };
        let vm = VmId(1);
        // Nothing seen, or no switch measured: no sizing.
        assert_eq!(s.size_for_latency(vm, 1, 242_000, 0), None);
        s.note(vm, 152);
        assert_eq!(s.size_for_latency(vm, 1, 242_000, 0), None);
        // 152 workgroups of 100 us: 1 round alone; 1.1 x 100 + 242 = 352
        // us allows 3 rounds: 51 CUs, 7 per XCC (width alone: 24).
        s.note_occupancy(vm, 100_000, false);
        assert_eq!(s.size_for_latency(vm, 1, 242_000, 0), Some(7));
        assert_eq!(s.size_for_latency(vm, 1, 0, 0), None);
        // A long job gets no rounds to spare: its whole width.
        s.note_occupancy(VmId(2), 600_000, true);
        s.note(VmId(2), 40);
        assert_eq!(s.size_for_latency(VmId(2), 1, 68_000, 0), Some(5));
        // Short workgroups: many rounds fit, one CU per XCC.
        s.note_occupancy(VmId(3), 10_000, false);
        s.note(VmId(3), 71);
        assert_eq!(s.size_for_latency(VmId(3), 1, 242_000, 0), Some(1));
    }

    #[test]
    fn latency_sizing_keeps_up_with_the_interval_between_jobs() {
        let mut s = Spatial {
            cus_per_xcc: 38,
            xccs: 8,
            ..Default::default()
        };
        let vm = VmId(1);
        s.note(vm, 38);
        s.note_occupancy(vm, 35_000, true);
        // One arrival: no interval, the bound alone (8 rounds, 1 CU per
        // XCC: 8 rounds of 35 us = 280 us, longer than a 122 us period).
        s.note_arrival(vm, 1_000_000);
        assert_eq!(s.occ[&vm].interval_ns, 0);
        assert_eq!(s.size_for_latency(vm, 1, 242_000, 0), Some(1));
        // Every 244 us: 3 rounds fit in half of it, 13 CUs, 2 per XCC.
        for i in 1..=20 {
            s.note_arrival(vm, 1_000_000 + i * 244_000);
        }
        assert_eq!(s.occ[&vm].interval_ns, 244_000);
        assert_eq!(s.size_for_latency(vm, 1, 242_000, 0), Some(2));
        // A wait before each job (a drain) leaves fewer rounds: 2, 19 CUs.
        assert_eq!(s.size_for_latency(vm, 1, 242_000, 40_000), Some(3));
        // Jobs faster than their rounds alone: the alone rounds (its whole
        // width, the width sizing then caps it).
        assert_eq!(s.size_for_latency(vm, 1, 242_000, 200_000), Some(5));
        // A time that goes backwards is ignored.
        s.note_arrival(vm, 5);
        assert_eq!(s.occ[&vm].interval_ns, 244_000);
        // The interval moves by 1/8 per arrival.
        let last = s.occ[&vm].last_arrival.unwrap();
        s.note_arrival(vm, last + 1_244_000);
        assert_eq!(s.occ[&vm].interval_ns, 244_000 - 30_500 + 155_500);
    }

    #[test]
    fn recent_widths_keep_the_last_eight_dispatches() {
        let mut r = RecentWidths::default();
        assert_eq!(r.iter().count(), 0);
        r.push(0);
        assert_eq!(r.iter().count(), 0);
        for w in 1..=10u64 {
            r.push(w * 100);
        }
        let mut got: Vec<u64> = r.iter().collect();
        got.sort_unstable();
        assert_eq!(got, (3..=10u64).map(|w| w * 100).collect::<Vec<_>>());
        let mut s = Spatial::default();
        s.note(VmId(1), 304);
        s.note(VmId(1), 200);
        assert_eq!(s.width[&VmId(1)], 266);
        assert!(s.recent[&VmId(1)].iter().any(|w| w == 304));
    }

    #[test]
    fn size_follows_the_widest_recent_dispatch() {
        let mut s = Spatial {
            cus_per_xcc: 38,
            xccs: 8,
            ..Default::default()
        };
        let vm = VmId(1);
        assert_eq!(s.size(vm, 1, 25, 250), None);
        s.note(vm, 40);
        // 40 x 1.25 = 50 workgroups over 8 XCCs: 7 CUs per XCC.
        assert_eq!(s.size(vm, 1, 25, 250), Some(7));
        s.note(vm, 1);
        assert_eq!(s.width[&vm], 35);
        // Wider than a quarter of the XCC: no reservation.
        s.note(vm, 304);
        assert_eq!(s.size(vm, 1, 25, 250), None);
        // Headroom is clipped to the cap: 152 workgroups need 19 CUs per
        // XCC, 24 with headroom, clipped to half the XCC (19); 64 need 8,
        // 10 with headroom, clipped to a quarter (9).
        let half = VmId(4);
        s.note(half, 152);
        assert_eq!(s.size(half, 1, 25, 500), Some(19));
        assert_eq!(s.size(half, 1, 25, 250), None);
        s.note(VmId(5), 64);
        assert_eq!(s.size(VmId(5), 1, 25, 250), Some(9));
        assert_eq!(s.size(VmId(5), 1, 25, 500), Some(10));
        s.note(VmId(2), 1);
        assert_eq!(s.size(VmId(2), 1, 25, 250), Some(1));
        // Four busy queues of 8 workgroups: 40 with headroom, 5 per XCC.
        s.note(VmId(3), 8);
        assert_eq!(s.size(VmId(3), 4, 25, 250), Some(5));
    }

    #[test]
    fn drain_waits_for_the_longest_lower_workgroup_within_the_bound() {
        let mut s = Spatial::default();
        let (a, b) = (VmId(1), VmId(2));
        // Nothing lower, or a lower VM never seen: no drain.
        assert_eq!(s.drain_wait([], 240_000), None);
        assert_eq!(s.drain_wait([a], 240_000), None);
        s.note_occupancy(a, 138_000, false);
        s.note_occupancy(b, 30_000, true);
        // Whole-CU or not, the longest lower workgroup is the wait.
        assert_eq!(s.drain_wait([a, b], 240_000), Some(138_000));
        assert_eq!(s.drain_wait([b], 240_000), Some(30_000));
        // A workgroup longer than one save and restore: save instead.
        assert_eq!(s.drain_wait([a, b], 100_000), None);
        s.note_occupancy(b, 10_800_000, true);
        assert_eq!(s.drain_wait([a, b], 240_000), None);
    }

    #[test]
    fn drain_waits_for_the_longest_workgroup_not_the_doorbells_sum() {
        let mut s = Spatial::default();
        let a = VmId(1);
        // A doorbell of 4 jobs x (4 x 49.7 + 2 x 33.1 us): 1061 us of solo
        // time, whose longest workgroup is 49.7 us (whole-CU).
        s.note_occupancy(a, 1_060_800, false);
        assert_eq!(s.drain_wait([a], 240_000), None);
        s.note_longest_wg(a, 49_700, 0);
        assert_eq!(s.drain_wait([a], 240_000), Some(49_700));
        // A longer workgroup raises it at once; shorter ones behind it do
        // not lower it while the VM stays busy (it may still be in flight
        // behind any number of them), only the end of its demand does.
        s.note_longest_wg(a, 300_000, 0);
        assert_eq!(s.drain_wait([a], 240_000), None);
        for _ in 0..64 {
            s.note_longest_wg(a, 10_000, 0);
        }
        assert_eq!(s.drain_wait([a], 240_000), None);
        s.end_busy(a);
        s.note_longest_wg(a, 10_000, 0);
        assert_eq!(s.drain_wait([a], 240_000), Some(10_000));
        // Workgroups that fit half a CU may share it at half rate: twice
        // their cost (188 us: 376 us, beyond the allowance), whatever the
        // whole-CU ones of later doorbells are.
        let b = VmId(2);
        s.note_occupancy(b, 1_000_000, true);
        s.note_longest_wg(b, 0, 100_000);
        assert_eq!(s.drain_wait([b], 240_000), Some(200_000));
        s.note_longest_wg(b, 0, 188_000);
        assert_eq!(s.drain_wait([b], 240_000), None);
        s.note_occupancy(b, 5_000, false);
        s.note_longest_wg(b, 5_000, 0);
        assert_eq!(s.drain_wait([b], 240_000), None);
        // A dispatch without an estimate: never drained.
        let c = VmId(3);
        s.note_occupancy(c, 5_000, false);
        assert_eq!(s.drain_wait([c], 240_000), Some(5_000));
        s.note_longest_wg(c, u64::MAX, 0);
        assert_eq!(s.drain_wait([c], u64::MAX - 1), None);
    }
}
