//! What best effort can keep beside periodic real-time tenants, computed
//! from the scenario alone (issue 18, promise item 3, `3-be-retained`).
//!
//! The checker's target was `0.9 x alone x (1 - RT CU share)`, which only
//! co-residence can reach: any other mechanism takes whole CUs (or the
//! whole partition) from the best effort, and a kernel of `W` workgroups
//! runs in `ceil(W / N)` lock-step rounds on `N` CUs (`docs/gpu-model.md`,
//! batches), so losing even one CU per XCC can cost it a whole round. The
//! bound here is the best figure any of the scheduler's four mechanisms
//! can give the shape (`docs/scheduling.md`, "The best-effort bound in
//! lock-step rounds"), never above the old target:
//!
//! * (a) **co-residence** — every RT and lower workgroup fits half a CU,
//!   every lower VM has one queue, and each RT's job alone `b` still meets
//!   its bound when sharing doubles it, `2b <= 1.1 x b + t_save +
//!   t_restore` (a CU shared with a lower workgroup runs each at half
//!   rate): `1 - RT CU share`, less the rounds the sharing stretches
//!   ([`coreside_delay`]: a lower workgroup that shares its CU with an
//!   RT job of `b` loses `b` of progress, and its lock-step round ends
//!   with it, so a lower round with no CU free for the RT's widest
//!   dispatch ends up to `b` later: `sum_RT b / P` of the lower's time
//!   in such rounds). Fuzz seed 50103's RT job of one round of
//!   405.6 us would take 811 us shared against a 688 us bound (measured
//!   before the simulator's `rtround` fix: p99 811 us), so the scheduler
//!   rightly saves or reserves instead (`Spatial::can_coreside`);
//! * (b) **reservation** — the smallest `k` CUs per XCC (within the width
//!   cap, a CU per XCC left) on which every RT job meets `1.1 x alone +
//!   t_save + t_restore` and ends before its next arrival; each lower kernel
//!   then runs on `N - k x XCCs` CUs: `ceil(W / n) / ceil(W / n')` of its
//!   time (`n`, `n'` the CUs per lower queue), weighted by each lower
//!   tenant's alone CU time;
//! * (c) **a save and restore per period** — `1 - sum (b + t_save +
//!   t_restore) / P` over the RTs (`b` the RT job alone), when the CWSR
//!   time `sum (t_save + t_restore) / P` stays within 10%;
//! * (d) **a drained reservation** — every lower workgroup ends within the
//!   drain allowance: the lower work loses the reserved CUs only while the
//!   RT runs and drains, `1 - u x (1 - f_b)`, `u = min(1, sum (r + w) /
//!   P)` (`r` the RT job on the reservation, `w` the longest lower
//!   workgroup, twice its cost when it fits half a CU and may share its CU
//!   at half rate, `f_b` the reservation's figure).
//!
//! When none applies (an RT whose job needs more than the width cap and
//! whose save per period costs more than 10% CWSR: outside the promise's
//! class of RTs up to half the partition, a conflict between the RT and
//! CWSR targets), the bound is (c)'s figure without the CWSR condition
//! (at least 0): the CWSR target is checked on its own (`3-cwsr-time`).

use gpusim::sim::occupancy::Footprint;

/// One kernel spec of a job, as the round model sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelShape {
    /// Workgroups per dispatch.
    pub workgroups: u64,
    /// Solo cost of one workgroup, ns.
    pub cost_ns: u64,
    /// Dispatches of it per job.
    pub repeat: u64,
    /// Its workgroup fits half a CU (`Footprint::at_most_half`).
    pub half_cu: bool,
    /// Its workgroups set `no_save_point` (a save waits for them to end).
    pub no_save_point: bool,
}

impl KernelShape {
    /// The shape of a scenario kernel spec.
    pub fn of(k: &crate::scenario::KernelSpec) -> KernelShape {
        KernelShape {
            workgroups: k.workgroups as u64,
            cost_ns: k.cost_ns().max(100),
            repeat: k.repeat.max(1) as u64,
            half_cu: Footprint::of(k.wg_items as u64, k.vgprs, k.lds_bytes).at_most_half(),
            no_save_point: k.no_save_point,
        }
    }

    /// The longest one of its workgroups in flight may take to end: its
    /// cost, twice that when it fits half a CU (it may share its CU, each
    /// at half rate).
    fn end_ns(&self) -> u64 {
        if self.half_cu {
            self.cost_ns.saturating_mul(2)
        } else {
            self.cost_ns
        }
    }
}

/// A tenant's job: its kernels and queues.
#[derive(Debug, Clone, PartialEq)]
pub struct JobShape {
    /// Kernels of one job.
    pub kernels: Vec<KernelShape>,
    /// Busy queues of one VM (they split its CUs round robin).
    pub queues: u64,
}

impl JobShape {
    /// The job of a scenario tenant.
    pub fn of(t: &crate::scenario::Tenant) -> JobShape {
        JobShape {
            kernels: t.kernels.iter().map(KernelShape::of).collect(),
            queues: t.queues.max(1) as u64,
        }
    }

    /// Time of one job of each queue on `cus` CUs: per kernel, rounds x
    /// cost x repeat. The `m` busy queues of one VM run their jobs in
    /// phase (a closed loop or a flood rings them together) and take free
    /// CUs round robin from one pool, not a split of the CUs each
    /// (docs/gpu-model.md, "Batches"): together one lock-step kernel of `m
    /// x W` equal workgroups, `ceil(m x W / cus)` rounds (the makespan of
    /// identical workgroups on `cus` CUs; two to a CU at half rate when
    /// they fit half a CU, the same time). The scheduler's model of the
    /// lower work in `engine/res_hold.rs`, measured on fuzz seed 50148
    /// (two queues of 304 half-CU workgroups: three rounds' time on 296
    /// CUs against two on 304). Fuzz seed 97100 (three queues of 1216
    /// whole-CU workgroups beside two reserved CUs per XCC) kept 0.833 of
    /// alone, `12 / 13` rounds x 0.9 = 0.831; a split of the CUs (101 and
    /// 96 per queue) gave 13 rounds on both, `f` = 1 (capped at 0.971).
    pub fn time_on(&self, cus: u64) -> u64 {
        let q = self.queues.max(1);
        self.kernels
            .iter()
            .map(|k| {
                k.workgroups
                    .saturating_mul(q)
                    .div_ceil(cus.max(1))
                    .saturating_mul(k.cost_ns)
                    .saturating_mul(k.repeat)
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Fraction of its throughput on `alone` CUs that the job keeps on
    /// `left` CUs (the lock-step round quantisation; 1 when every kernel
    /// needs as many rounds on both).
    pub fn lockstep_factor(&self, alone: u64, left: u64) -> f64 {
        let (a, l) = (self.time_on(alone), self.time_on(left));
        if l == 0 {
            return 1.0;
        }
        (a as f64 / l as f64).min(1.0)
    }

    /// Longest workgroup of the job, ns.
    pub fn longest_wg_ns(&self) -> u64 {
        self.kernels.iter().map(|k| k.cost_ns).max().unwrap_or(0)
    }

    /// The longest a workgroup of the job in flight may take to end: its
    /// cost, twice that when it fits half a CU (it may share its CU, each
    /// at half rate). What a drain of it waits for (`Spatial::drain_wait`).
    pub fn drain_ns(&self) -> u64 {
        self.kernels
            .iter()
            .map(KernelShape::end_ns)
            .max()
            .unwrap_or(0)
    }

    /// The longest a save of the job in flight may wait for its own
    /// `no_save_point` workgroups: the longest such workgroup's cost, twice
    /// that when it fits half a CU (it may share its CU at half rate, as
    /// [`JobShape::drain_ns`]); 0 when no kernel sets the flag.
    pub fn flagged_wait_ns(&self) -> u64 {
        self.kernels
            .iter()
            .filter(|k| k.no_save_point)
            .map(KernelShape::end_ns)
            .max()
            .unwrap_or(0)
    }

    /// Every workgroup fits half a CU.
    pub fn half_cu(&self) -> bool {
        self.kernels.iter().all(|k| k.half_cu)
    }
}

/// A periodic real-time tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct RtShape {
    /// Its job.
    pub job: JobShape,
    /// Its period (interval between job arrivals), ns.
    pub period_ns: u64,
}

/// A lower (best-effort) tenant: its job and its CU time alone (the
/// weight of its lock-step figure).
#[derive(Debug, Clone, PartialEq)]
pub struct BeShape {
    /// Its job.
    pub job: JobShape,
    /// Its CU time in the run of the best effort alone.
    pub alone_cu: f64,
}

/// The partition and the scheduler's constants the mechanisms use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Part {
    /// CUs of the partition.
    pub cus: u64,
    /// XCCs of the partition.
    pub xccs: u64,
    /// One save and one restore of the partition, ns.
    pub cwsr_ns: u64,
    /// Drain allowance (`spatial_coreside_ns`), ns.
    pub drain_ns: u64,
    /// Width cap of a reservation (`spatial_max_permille`).
    pub max_permille: u64,
}

/// Which mechanism set the bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BeCase {
    /// (a) co-residence.
    CoResidence,
    /// (b) a reservation of `k` CUs per XCC.
    Reservation {
        /// CUs per XCC.
        k: u64,
    },
    /// (c) a save and restore per RT period.
    SavePerPeriod,
    /// (d) a drained reservation of `k` CUs per XCC.
    Drain {
        /// CUs per XCC.
        k: u64,
    },
    /// None applies: (c)'s figure beyond the CWSR target.
    Conflict,
    /// Co-residence for the VMs that flag no workgroup longer than the
    /// allowance, the best of (b)-(d) for those that do
    /// ([`flags_beyond_allowance`]).
    FlaggedApart {
        /// The flagging VMs' share of the alone CU time.
        share: f64,
        /// Their factor (the best of (b)-(d) over them).
        factor: f64,
    },
}

impl std::fmt::Display for BeCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BeCase::CoResidence => write!(f, "co-residence"),
            BeCase::Reservation { k } => write!(f, "reservation k={k}/XCC"),
            BeCase::SavePerPeriod => write!(f, "save per period"),
            BeCase::Drain { k } => write!(f, "drained reservation k={k}/XCC"),
            BeCase::Conflict => write!(f, "none (save per period beyond 10% CWSR)"),
            BeCase::FlaggedApart { share, factor } => write!(
                f,
                "co-residence, but {factor:.3} for the VMs flagging waves beyond the allowance ({:.0}% of alone)",
                share * 100.0
            ),
        }
    }
}

/// The bound's factor (of the best effort's alone CU time, before the
/// 0.9) and the case that set it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BeBound {
    /// Fraction of alone the best mechanism gives (at most `1 - RT CU
    /// share`).
    pub factor: f64,
    /// Which case.
    pub case: BeCase,
}

/// CUs per XCC of the smallest reservation on which `rt`'s job meets
/// `1.1 x alone + t_save + t_restore` and ends before its next arrival,
/// if one fits the width cap and leaves a CU per XCC.
pub fn reservation_k(rt: &RtShape, p: &Part) -> Option<u64> {
    let xccs = p.xccs.max(1);
    let per_xcc = p.cus / xccs;
    let cap = (per_xcc * p.max_permille.min(1000) / 1000).min(per_xcc.saturating_sub(1));
    let alone = rt.job.time_on(p.cus);
    let bound = alone.saturating_mul(11) / 10 + p.cwsr_ns;
    (1..=cap).find(|&k| {
        let t = rt.job.time_on(k * xccs);
        t <= bound && t <= rt.period_ns
    })
}

/// Does `rt`'s job, doubled by sharing every CU with lower work (each
/// workgroup of a shared CU runs at half rate), still meet its bound
/// `1.1 x alone + t_save + t_restore`: `2b <= 1.1 x b + t_cwsr`, i.e.
/// `9b <= 10 x t_cwsr` (`b` its job alone on the whole partition)?
pub fn coreside_meets_rt_bound(rt: &RtShape, p: &Part) -> bool {
    let b = u128::from(rt.job.time_on(p.cus));
    b * 9 <= u128::from(p.cwsr_ns) * 10
}

/// Does `rt`'s job still meet its bound `1.1 x b + t_cwsr` when it comes
/// during the last round of a kernel of `lower` that leaves some CUs of
/// the partition free? A queue with free CUs of its mask runs its kernels
/// in lock-step rounds on them and goes beside other queues' workgroups
/// only when none is free (docs/gpu-model.md, "Occupancy"): a lower
/// kernel of `w` workgroups leaves `F = N - r` CUs free in its last round
/// of `r = w - N x (ceil(w / N) - 1)`, and the RT job takes `time_on(F)`
/// there. The scheduler's admission (`engine/coreside_places.rs`)
/// refuses co-residence on the same count. Fuzz seed 200117: 548
/// workgroups leave 60 of 304 CUs, the RT's 51.4 us job takes 300 us
/// there against 299.1 us.
pub fn coreside_places_meet_rt_bound(rt: &RtShape, lower: &[BeShape], p: &Part) -> bool {
    let n = p.cus.max(1);
    let b = rt.job.time_on(n);
    let bound = u128::from(b) * 11 / 10 + u128::from(p.cwsr_ns);
    lower
        .iter()
        .flat_map(|l| l.job.kernels.iter())
        .filter(|k| k.workgroups > 0)
        .map(|k| n - ((k.workgroups - 1) % n + 1))
        .filter(|&f| f > 0)
        .all(|f| u128::from(rt.job.time_on(f)) <= bound)
}

/// The share of the best effort's time that co-residence beside `rts`
/// stretches its lock-step rounds by (case (a)). A CU shared by an RT
/// workgroup and a lower one runs each at half rate, so over the RT job's
/// `2b` the lower workgroup progresses `b` less, and its round (which ends
/// with its last workgroup) ends up to `b` later. That happens in every
/// round of a lower kernel that leaves fewer CUs free than the RT's widest
/// dispatch needs (a full round leaves none; the last round of `w`
/// workgroups leaves `N - r`): per RT, `b / P` of the lower's time in such
/// rounds. Summed over the RTs, weighted over the lower VMs by their CU
/// time alone (each VM the same without it). Fuzz seed 900044: a 340 us
/// RT of 67 half-CU workgroups of 70 us over a lower VM whose every round
/// fills the 304 CUs keeps 0.750 of alone, `1 - 0.045 (RT CU share) -
/// 70 / 340 = 0.749`; the alternatives give less (0.575 with
/// co-residence off).
pub fn coreside_delay(rts: &[RtShape], be: &[BeShape], p: &Part) -> f64 {
    let n = p.cus.max(1);
    let of_vm = |b: &BeShape| -> f64 {
        let q = b.job.queues.max(1);
        rts.iter()
            .map(|r| {
                let rt_width = r
                    .job
                    .kernels
                    .iter()
                    .map(|k| k.workgroups.saturating_mul(r.job.queues.max(1)))
                    .max()
                    .unwrap_or(0);
                let (mut stretched, mut all) = (0u128, 0u128);
                for k in &b.job.kernels {
                    let w = k.workgroups.saturating_mul(q);
                    if w == 0 {
                        continue;
                    }
                    let rounds = w.div_ceil(n);
                    let last = w - n * (rounds - 1);
                    let full = if n - last < rt_width {
                        rounds
                    } else {
                        rounds - 1
                    };
                    let t = u128::from(k.cost_ns) * u128::from(k.repeat);
                    stretched += u128::from(full) * t;
                    all += u128::from(rounds) * t;
                }
                if all == 0 {
                    return 0.0;
                }
                let b_ns = r.job.time_on(n) as f64;
                b_ns / r.period_ns.max(1) as f64 * (stretched as f64 / all as f64)
            })
            .sum()
    };
    let total: f64 = be.iter().map(|b| b.alone_cu.max(0.0)).sum();
    if total > 0.0 {
        be.iter()
            .map(|b| b.alone_cu.max(0.0) * of_vm(b))
            .sum::<f64>()
            / total
    } else if be.is_empty() {
        0.0
    } else {
        be.iter().map(of_vm).sum::<f64>() / be.len() as f64
    }
}

/// Does `b` flag workgroups a save would wait for longer than the
/// co-residence allowance `A = max(drain_ns, t_save + t_restore)`
/// (`SchedConfig::spatial_wait_allowance`)? Co-residence beside such a VM
/// may not meet the RT bound: where its waves take every place of a CU
/// the RT shares, the RT's workgroups get one only as those waves end, and
/// the save the co-residence deadline asks for waits for them too (fuzz
/// seed 600053: 1.01 ms workgroups, RT jobs of 1054 us against 301 at
/// every flagged kernel; fuzz-1000's 1.77 ms waves, one per CU, leave the
/// RT a place and it meets its bound beside them).
pub fn flags_beyond_allowance(b: &BeShape, p: &Part) -> bool {
    b.job.flagged_wait_ns() > p.drain_ns.max(p.cwsr_ns)
}

/// The best figure of (a)-(d) for `be` beside `rts`, at most `today`
/// (`1 - RT CU share`, measured).
///
/// Where co-residence applies and some lower VMs flag workgroups longer
/// than the allowance ([`flags_beyond_allowance`]), the flagger bears the
/// cost of its flag: the scheduler may refuse to co-reside beside it
/// (the RT's bound is not met there where its waves take every place of
/// the CUs the RT shares), so its part of the bound is the best of
/// (b)-(d) over the flagging VMs alone, and the others keep (a)'s
/// figure over them, `f_a = today - coreside_delay(unflagged)`:
/// `(sum_{v unflagged} c_v x f_a + sum_{v flagged} c_v x f') / sum_v
/// c_v` (`c_v` each VM's CU time alone, `f'` the flagging VMs' bound
/// without (a)).
pub fn best_effort_bound(rts: &[RtShape], be: &[BeShape], p: &Part, today: f64) -> BeBound {
    let co = bound_of(rts, be, p, today, true);
    if co.case != BeCase::CoResidence {
        return co;
    }
    let (flagged, rest): (Vec<BeShape>, Vec<BeShape>) = be
        .iter()
        .cloned()
        .partition(|b| flags_beyond_allowance(b, p));
    if flagged.is_empty() {
        return co;
    }
    let without = bound_of(rts, &flagged, p, today, false);
    let weight = |s: &[BeShape]| s.iter().map(|b| b.alone_cu.max(0.0)).sum::<f64>();
    let (wf, wr) = (weight(&flagged), weight(&rest));
    // No alone CU time to weigh by: each VM counts the same.
    let (wf, wr) = if wf + wr > 0.0 {
        (wf, wr)
    } else {
        (flagged.len() as f64, rest.len() as f64)
    };
    // The unflagged VMs keep co-residence, less the rounds it stretches
    // of theirs.
    let rest_factor = (today.clamp(0.0, 1.0) - coreside_delay(rts, &rest, p)).max(0.0);
    BeBound {
        factor: (wr * rest_factor + wf * without.factor) / (wr + wf),
        case: BeCase::FlaggedApart {
            share: wf / (wr + wf),
            factor: without.factor,
        },
    }
}

/// The best figure of (a)-(d) (of (b)-(d) unless `coreside`) for `be`
/// beside `rts`, at most `today`.
fn bound_of(rts: &[RtShape], be: &[BeShape], p: &Part, today: f64, coreside: bool) -> BeBound {
    let today = today.clamp(0.0, 1.0);
    let mut best: Option<BeBound> = None;
    let mut offer = |factor: f64, case: BeCase| {
        let factor = factor.clamp(0.0, today);
        if best.is_none_or(|b| factor > b.factor) {
            best = Some(BeBound { factor, case });
        }
    };
    // (a) co-residence, when the RT jobs doubled by sharing meet the RT
    // bound.
    if coreside
        && rts.iter().all(|r| {
            r.job.half_cu()
                && coreside_meets_rt_bound(r, p)
                && coreside_places_meet_rt_bound(r, be, p)
        })
        && be.iter().all(|b| b.job.half_cu() && b.job.queues == 1)
    {
        offer(today - coreside_delay(rts, be, p), BeCase::CoResidence);
    }
    // (b) reservation: one per RT, side by side.
    let ks: Option<Vec<u64>> = rts.iter().map(|r| reservation_k(r, p)).collect();
    let per_xcc = p.cus / p.xccs.max(1);
    let cap = per_xcc * p.max_permille.min(1000) / 1000;
    if let Some(k) = ks
        .as_ref()
        .map(|ks| ks.iter().sum::<u64>())
        .filter(|&k| k > 0 && k <= cap && k < per_xcc)
    {
        let left = p.cus - k * p.xccs.max(1);
        let total: f64 = be.iter().map(|b| b.alone_cu).sum();
        let f_b = if total > 0.0 {
            be.iter()
                .map(|b| b.alone_cu * b.job.lockstep_factor(p.cus, left))
                .sum::<f64>()
                / total
        } else {
            be.iter()
                .map(|b| b.job.lockstep_factor(p.cus, left))
                .fold(1.0, f64::min)
        };
        offer(f_b, BeCase::Reservation { k });
        // (d) drained: the reserved CUs are lost only while each RT job
        // runs on them and waits for the drain. A workgroup that fits
        // half a CU may share its CU at half rate: it ends within twice
        // its cost.
        let w = be.iter().map(|b| b.job.drain_ns()).max().unwrap_or(0);
        if w <= p.drain_ns {
            let u: f64 = rts
                .iter()
                .zip(ks.iter().flatten())
                .map(|(r, &ki)| {
                    (r.job.time_on(ki * p.xccs.max(1)) + w) as f64 / r.period_ns.max(1) as f64
                })
                .sum::<f64>()
                .min(1.0);
            offer(1.0 - u * (1.0 - f_b), BeCase::Drain { k });
        }
    }
    // (c) a save and restore per period.
    let used: f64 = rts
        .iter()
        .map(|r| (r.job.time_on(p.cus) + p.cwsr_ns) as f64 / r.period_ns.max(1) as f64)
        .sum();
    let cwsr: f64 = rts
        .iter()
        .map(|r| p.cwsr_ns as f64 / r.period_ns.max(1) as f64)
        .sum();
    if cwsr <= 0.1 {
        offer(1.0 - used, BeCase::SavePerPeriod);
    }
    best.unwrap_or(BeBound {
        factor: (1.0 - used).clamp(0.0, today),
        case: BeCase::Conflict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MI300X SPX: 304 CUs, 8 XCCs; the default CWSR (~242 us) and drain.
    fn spx() -> Part {
        Part {
            cus: 304,
            xccs: 8,
            cwsr_ns: 242_000,
            drain_ns: 240_000,
            max_permille: 500,
        }
    }

    fn job(w: u64, cost_ns: u64, half_cu: bool, queues: u64) -> JobShape {
        JobShape {
            kernels: vec![KernelShape {
                workgroups: w,
                cost_ns,
                repeat: 1,
                half_cu,
                no_save_point: false,
            }],
            queues,
        }
    }

    /// A 1 kHz RT of 8 whole-CU workgroups of 50 us: one CU per XCC.
    fn narrow_rt(half_cu: bool) -> RtShape {
        RtShape {
            job: job(8, 50_000, half_cu, 1),
            period_ns: 1_000_000,
        }
    }

    /// An unflagged kernel of half-CU workgroups.
    fn half_cu_kernel(workgroups: u64, cost_ns: u64, repeat: u64) -> KernelShape {
        KernelShape {
            workgroups,
            cost_ns,
            repeat,
            half_cu: true,
            no_save_point: false,
        }
    }

    fn be(w: u64, cost_ns: u64, half_cu: bool, queues: u64) -> BeShape {
        BeShape {
            job: job(w, cost_ns, half_cu, queues),
            alone_cu: 1.0,
        }
    }

    #[test]
    fn the_lockstep_factor_is_the_round_ratio() {
        let j = job(1216, 1_000_000, false, 1);
        assert_eq!(j.lockstep_factor(304, 296), 4.0 / 5.0);
        assert_eq!(job(304, 1_000_000, false, 1).lockstep_factor(304, 296), 0.5);
        // A narrow kernel keeps every round.
        assert_eq!(job(100, 1_000_000, false, 1).lockstep_factor(304, 296), 1.0);
        // Two queues run in phase: 608 workgroups, 2 rounds on 304 CUs,
        // 3 on 296, whole-CU or half-CU.
        for half_cu in [false, true] {
            assert_eq!(
                job(304, 1_000_000, half_cu, 2).lockstep_factor(304, 296),
                2.0 / 3.0
            );
        }
        // Three queues of 1216 (fuzz seed 97100): one kernel of 3648, 12
        // rounds on 304 CUs and 13 on 288 (a split of the CUs, 101 and 96
        // per queue, would give 13 on both).
        assert_eq!(
            job(1216, 1_000_000, false, 3).lockstep_factor(304, 288),
            12.0 / 13.0
        );
        // A narrow kernel of several queues still fits the rest.
        assert_eq!(job(90, 1_000_000, false, 3).lockstep_factor(304, 288), 1.0);
    }

    #[test]
    fn the_smallest_reservation_meets_the_rt_bound_and_its_period() {
        let p = spx();
        assert_eq!(reservation_k(&narrow_rt(false), &p), Some(1));
        // 152 workgroups of 100 us every 1 ms: on 7 CUs per XCC (56 CUs)
        // 3 rounds, 300 us against 1.1 x 100 + 242 = 352 us.
        let rt = RtShape {
            job: job(152, 100_000, false, 1),
            period_ns: 1_000_000,
        };
        assert_eq!(reservation_k(&rt, &p), Some(7));
        // A period shorter than the job on the reservation: more CUs.
        let fast = RtShape {
            job: job(152, 100_000, false, 1),
            period_ns: 250_000,
        };
        assert_eq!(reservation_k(&fast, &p), Some(10));
        // 304 workgroups of 118 us every 328 us: 2 rounds on half the
        // partition (236 us) end before the next job.
        let wide = RtShape {
            job: job(304, 118_000, false, 1),
            period_ns: 328_000,
        };
        assert_eq!(reservation_k(&wide, &p), Some(19));
        // Every 200 us: only one round ends in time, which needs every
        // CU: none.
        let wider = RtShape {
            job: job(304, 118_000, false, 1),
            period_ns: 200_000,
        };
        assert_eq!(reservation_k(&wider, &p), None);
    }

    #[test]
    fn whole_cu_lockstep_work_beside_a_one_cu_reservation_keeps_four_fifths() {
        let b = best_effort_bound(
            &[narrow_rt(false)],
            &[be(1216, 5_000_000, false, 1)],
            &spx(),
            0.99,
        );
        assert_eq!(b.case, BeCase::Reservation { k: 1 });
        assert!((b.factor - 0.8).abs() < 1e-12, "{b:?}");
    }

    #[test]
    fn one_round_of_whole_cu_work_keeps_half() {
        let b = best_effort_bound(
            &[narrow_rt(false)],
            &[be(304, 5_000_000, false, 1)],
            &spx(),
            0.99,
        );
        assert_eq!(b.case, BeCase::Reservation { k: 1 });
        assert_eq!(b.factor, 0.5);
    }

    #[test]
    fn half_cu_workgroups_co_reside_less_the_rounds_sharing_stretches() {
        // One full round of 304: the RT's 50 us job every 1 ms stretches
        // every round it meets, 0.97 - 0.05.
        let b = best_effort_bound(
            &[narrow_rt(true)],
            &[be(304, 5_000_000, true, 1)],
            &spx(),
            0.97,
        );
        assert_eq!(b.case, BeCase::CoResidence);
        assert!((b.factor - 0.92).abs() < 1e-12, "{b:?}");
        // 296 workgroups leave 8 CUs, the RT's width: nothing stretched,
        // today's bound.
        let free = best_effort_bound(
            &[narrow_rt(true)],
            &[be(296, 5_000_000, true, 1)],
            &spx(),
            0.97,
        );
        assert_eq!(free.case, BeCase::CoResidence);
        assert_eq!(free.factor, 0.97);
        // Two lower queues take every CU's second place: no co-residence.
        let two = best_effort_bound(
            &[narrow_rt(true)],
            &[be(304, 5_000_000, true, 2)],
            &spx(),
            0.97,
        );
        assert_ne!(two.case, BeCase::CoResidence);
        assert!(two.factor < 0.97);
    }

    /// Fuzz seed 900044's shape: every lower round fills the partition,
    /// so each RT job stretches one; a narrow lower kernel leaves the RT
    /// CUs of its own; two lower VMs are weighed by their CU time alone.
    #[test]
    fn co_residence_delay_counts_the_rounds_with_no_room_for_the_rt() {
        let p = spx();
        let k = half_cu_kernel;
        let rt = RtShape {
            job: job(67, 70_013, true, 1),
            period_ns: 340_000,
        };
        let full = BeShape {
            job: JobShape {
                kernels: vec![k(912, 23_675, 3), k(304, 53_268, 4), k(912, 71_025, 1)],
                queues: 1,
            },
            alone_cu: 3.0,
        };
        let d = coreside_delay(std::slice::from_ref(&rt), std::slice::from_ref(&full), &p);
        assert!((d - 70_013.0 / 340_000.0).abs() < 1e-12, "{d}");
        // 200 workgroups leave 104 CUs for the RT's 67: no round stretched.
        let narrow = BeShape {
            job: job(200, 50_000, true, 1),
            alone_cu: 1.0,
        };
        let d0 = coreside_delay(std::slice::from_ref(&rt), std::slice::from_ref(&narrow), &p);
        assert_eq!(d0, 0.0);
        // 500 workgroups: a full round and a last one of 196 (108 free):
        // half the time stretched. Two queues of 250 are the same kernel.
        let half = BeShape {
            job: job(500, 50_000, true, 1),
            alone_cu: 1.0,
        };
        let dh = coreside_delay(std::slice::from_ref(&rt), std::slice::from_ref(&half), &p);
        assert!((dh - 0.5 * 70_013.0 / 340_000.0).abs() < 1e-12, "{dh}");
        let twin = BeShape {
            job: job(250, 50_000, true, 2),
            alone_cu: 1.0,
        };
        assert_eq!(dh, coreside_delay(std::slice::from_ref(&rt), &[twin], &p));
        // Weighted 3:1 by CU time alone.
        let both = coreside_delay(std::slice::from_ref(&rt), &[full, narrow], &p);
        assert!((both - 0.75 * d).abs() < 1e-12, "{both}");
        // Two RTs add up.
        let two = coreside_delay(&[rt.clone(), rt], &[half], &p);
        assert!((two - 2.0 * dh).abs() < 1e-12, "{two}");
    }

    /// A lower VM whose `no_save_point` workgroups outlast the allowance
    /// loses the co-residence case (the flagger bears the cost of its
    /// flag); a VM beside it that flags nothing keeps it.
    #[test]
    fn a_vm_flagging_waves_beyond_the_allowance_is_bounded_without_co_residence() {
        let p = spx();
        let mut flagged = be(304, 1_010_000, true, 1);
        flagged.job.kernels[0].no_save_point = true;
        assert!(flags_beyond_allowance(&flagged, &p));
        let alone = best_effort_bound(&[narrow_rt(true)], &[flagged.clone()], &p, 0.97);
        assert!(matches!(alone.case, BeCase::FlaggedApart { share, .. } if share == 1.0));
        let no_co = bound_of(&[narrow_rt(true)], &[flagged.clone()], &p, 0.97, false);
        assert_eq!(alone.factor, no_co.factor);
        assert!(alone.factor < 0.97);
        // Beside an unflagged VM of the same CU time alone: the mean.
        let both = best_effort_bound(
            &[narrow_rt(true)],
            &[flagged.clone(), be(304, 1_010_000, true, 1)],
            &p,
            0.97,
        );
        // (The unflagged VM's full round is stretched by the RT's 50 us
        // every 1 ms: 0.97 - 0.05.)
        assert!((both.factor - (0.92 + no_co.factor) / 2.0).abs() < 1e-9);
        // Short flagged waves (within the allowance) keep co-residence.
        let mut short = be(304, 100_000, true, 1);
        short.job.kernels[0].no_save_point = true;
        assert!(!flags_beyond_allowance(&short, &p));
        let b = best_effort_bound(&[narrow_rt(true)], &[short], &p, 0.97);
        assert_eq!(b.case, BeCase::CoResidence);
    }

    #[test]
    fn co_residence_needs_the_doubled_rt_job_within_its_bound() {
        let p = spx();
        // 9b <= 10 x 242 us: b up to 268.9 us co-resides.
        let rt = |cost_ns| RtShape {
            job: job(37, cost_ns, true, 1),
            period_ns: 1_862_000,
        };
        assert!(coreside_meets_rt_bound(&rt(268_000), &p));
        assert!(!coreside_meets_rt_bound(&rt(269_000), &p));
        // Fuzz seed 50103's shape: 37 half-CU workgroups of 405.6 us
        // every 1862 us; shared, 811 us against 1.1 x 405.6 + 242 = 688
        // us. Its lower kernel of 912 whole rounds on 304 CUs keeps 3 of 4
        // rounds beside a 5-CU-per-XCC reservation.
        let lower = be(912, 2_678_865, true, 1);
        let b = best_effort_bound(&[rt(405_641)], std::slice::from_ref(&lower), &p, 0.973);
        assert_eq!(b.case, BeCase::Reservation { k: 5 });
        assert!((b.factor - 0.75).abs() < 1e-12, "{b:?}");
        // The same RT of 50 us workgroups co-resides.
        let c = best_effort_bound(&[rt(50_000)], &[lower], &p, 0.973);
        assert_eq!(c.case, BeCase::CoResidence);
        // A multi-round job counts every round: 3 rounds of 100 us (912
        // workgroups on 304 CUs) double to 600 us against 572.
        let wide = RtShape {
            job: job(912, 100_000, true, 1),
            period_ns: 5_000_000,
        };
        assert!(!coreside_meets_rt_bound(&wide, &p));
    }

    #[test]
    fn co_residence_counts_the_cus_a_lower_last_round_leaves() {
        let p = spx();
        // Fuzz seed 200117's RT: 608 + 304 + 2 x 304 half-CU workgroups,
        // 51.4 us alone on 304 CUs (bound 1.1 x 51.4 + 242 = 298.6 us).
        let k = half_cu_kernel;
        let rt = RtShape {
            job: JobShape {
                kernels: vec![k(608, 8_572, 1), k(304, 17_144, 1), k(304, 8_572, 2)],
                queues: 1,
            },
            period_ns: 1_808_000,
        };
        assert!(coreside_meets_rt_bound(&rt, &p));
        // 548 lower workgroups leave 60 CUs in their last round: 11 + 6 +
        // 2 x 6 rounds, 300 us.
        let lds = be(548, 962_234, true, 1);
        assert!(!coreside_places_meet_rt_bound(
            &rt,
            std::slice::from_ref(&lds),
            &p
        ));
        let b = best_effort_bound(std::slice::from_ref(&rt), &[lds], &p, 0.972);
        assert_ne!(b.case, BeCase::CoResidence);
        // Whole rounds (1216 = 4 x 304) leave no CU free; a narrow RT (8
        // workgroups) fits whatever is left.
        let whole = be(1216, 481_117, true, 1);
        assert!(coreside_places_meet_rt_bound(
            &rt,
            std::slice::from_ref(&whole),
            &p
        ));
        let narrow = RtShape {
            job: job(8, 20_000, true, 1),
            period_ns: 1_000_000,
        };
        for w in [1u64, 100, 303, 305, 600, 911] {
            assert!(
                coreside_places_meet_rt_bound(&narrow, &[be(w, 1_000_000, true, 1)], &p),
                "{w}"
            );
        }
        // A last round of 250 leaves 54 CUs: 12 + 6 + 2 x 6 rounds, 309
        // us; one of 100 leaves 204: 3 + 2 + 2 x 2 rounds, 94 us.
        assert!(!coreside_places_meet_rt_bound(
            &rt,
            &[be(304 + 250, 1_000_000, true, 1)],
            &p
        ));
        assert!(coreside_places_meet_rt_bound(
            &rt,
            &[be(304 + 100, 1_000_000, true, 1)],
            &p
        ));
    }

    #[test]
    fn short_lower_workgroups_drain_and_lose_the_cus_only_while_the_rt_runs() {
        // 304 workgroups of 100 us: drained within 240 us. The RT's 50 us
        // job on its CU plus the 100 us drain is 15% of each 1 ms period:
        // 1 - 0.15 x (1 - 1/2) = 0.925.
        let b = best_effort_bound(
            &[narrow_rt(false)],
            &[be(304, 100_000, false, 1)],
            &spx(),
            0.99,
        );
        assert_eq!(b.case, BeCase::Drain { k: 1 });
        assert!((b.factor - 0.925).abs() < 1e-12, "{b:?}");
        // Half-CU workgroups of 150 us may share their CUs at half rate:
        // 300 us to end, beyond the allowance: no drain.
        let h = best_effort_bound(
            &[narrow_rt(false)],
            &[be(304, 150_000, true, 1)],
            &spx(),
            0.99,
        );
        assert_ne!(h.case, BeCase::Drain { k: 1 });
    }

    #[test]
    fn a_save_per_long_period_beats_a_costly_reservation() {
        // A 50 Hz RT of one 304-workgroup round of 100 us: a save and
        // restore per 20 ms period costs 1.2% CWSR and leaves
        // 1 - (100 + 242) / 20000 = 0.9829; a reservation (3 rounds on
        // 13 CUs per XCC meet 1.1 x 100 + 242 us) costs the whole-CU
        // lower round half.
        let rt = RtShape {
            job: job(304, 100_000, false, 1),
            period_ns: 20_000_000,
        };
        let b = best_effort_bound(&[rt], &[be(304, 5_000_000, false, 1)], &spx(), 0.995);
        assert_eq!(b.case, BeCase::SavePerPeriod);
        assert!((b.factor - (1.0 - 342.0 / 20_000.0)).abs() < 1e-12, "{b:?}");
    }

    #[test]
    fn never_above_todays_bound_and_a_conflict_when_nothing_applies() {
        // Narrow lower work keeps every round on a reservation: the bound
        // is still today's, not 1.
        let b = best_effort_bound(
            &[narrow_rt(false)],
            &[be(100, 5_000_000, false, 1)],
            &spx(),
            0.9,
        );
        assert_eq!(b.factor, 0.9);
        // 304 whole-CU workgroups of 118 us every 200 us: no reservation
        // fits, and a save per period would cost 121% CWSR.
        let rt = RtShape {
            job: job(304, 118_000, false, 1),
            period_ns: 200_000,
        };
        let c = best_effort_bound(&[rt], &[be(304, 5_000_000, false, 1)], &spx(), 0.41);
        assert_eq!(c.case, BeCase::Conflict);
        assert_eq!(c.factor, 0.0);
    }
}
