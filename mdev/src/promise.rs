//! The promise of `docs/scheduling.md` as arithmetic, pure and sans-IO:
//! the **water-filling** that says what each VM is entitled to under the
//! current demands (strict priority across levels, weighted max-min within
//! a level, a demand-limited VM gets its whole demand and the rest is
//! redistributed), and the **per-window check** that compares it with what
//! each VM received. The API's `entitled vs got` figures
//! (`vmm::api`), the `hqdmux_vm_entitled_share` metric and `hqdmux promise`
//! all come from here, so the live check is the same arithmetic everywhere.
//!
//! Everything is per compute partition of one GPU: a VM only ever uses
//! its partition, whose capacity is 1. Shares are fractions of the compute the partition's
//! VMs received in the window (CU time, see [`WindowSample::cu_ns`]), so
//! CWSR save and restore, charged to nobody, do not count against anyone.

use std::collections::BTreeMap;

/// A VM demanding for at least this fraction of a window is **backlogged**
/// (it wanted more than it got the whole window; closed-loop tenants leave
/// short gaps between a completion and their next doorbell). Below it the
/// VM is **demand-limited**: it went without work for part of the window,
/// so it received its whole demand.
pub const BACKLOG_FRACTION: f64 = 0.9;

/// Relative tolerance of an entitlement (docs/scheduling.md, item 2).
pub const SHARE_TOLERANCE: f64 = 0.05;

/// The most of a partition's time aging may give to boosted lower work
/// (docs/scheduling.md, item 4: 1/32).
pub const AGING_LIMIT: f64 = 1.0 / 32.0;

/// What a VM asks of its partition.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Claim {
    /// The GPU (`gpu_id`).
    pub gpu: u32,
    /// Compute partition.
    pub partition: u32,
    /// VM priority (higher first).
    pub priority: u8,
    /// Weight within the level (0 is read as 1).
    pub weight: u32,
    /// Demand as a fraction of the partition: `None` = unlimited (it keeps
    /// demanding), `Some(0.0)` = not demanding.
    pub demand: Option<f64>,
}

/// The entitlement of each claim (same order), a fraction of its
/// partition: per partition, levels from the highest priority down; within
/// a level, weighted max-min (water filling): a claim whose demand is below
/// its weighted share of what is left gets its demand, the rest is split by
/// weight among the others. The entitlements of a partition sum to
/// `min(1, total demand)`.
pub fn water_fill(claims: &[Claim]) -> Vec<f64> {
    let mut out = vec![0.0; claims.len()];
    let mut by_part: BTreeMap<(u32, u32), BTreeMap<u8, Vec<usize>>> = BTreeMap::new();
    for (i, c) in claims.iter().enumerate() {
        by_part
            .entry((c.gpu, c.partition))
            .or_default()
            .entry(c.priority)
            .or_default()
            .push(i);
    }
    for levels in by_part.values() {
        let mut left = 1.0f64;
        for members in levels.values().rev() {
            if left <= 0.0 {
                break;
            }
            left -= fill_level(claims, members, left, &mut out);
        }
    }
    out
}

/// Water filling of one level with `cap` left: writes the members'
/// entitlements into `out` and returns what they took.
fn fill_level(claims: &[Claim], members: &[usize], cap: f64, out: &mut [f64]) -> f64 {
    let demand = |i: usize| claims[i].demand.map(|d| d.clamp(0.0, 1.0));
    let weight = |i: usize| f64::from(claims[i].weight.max(1));
    let mut open: Vec<usize> = members
        .iter()
        .copied()
        .filter(|&i| demand(i) != Some(0.0))
        .collect();
    let mut left = cap;
    loop {
        let w: f64 = open.iter().map(|&i| weight(i)).sum();
        if open.is_empty() || w == 0.0 {
            break;
        }
        // Every claim whose demand is below its fair share is satisfied at
        // once; if none is, the rest split what is left by weight.
        let limited: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&i| demand(i).is_some_and(|d| d <= weight(i) / w * left))
            .collect();
        if limited.is_empty() {
            for &i in &open {
                out[i] = weight(i) / w * left;
            }
            left = 0.0;
            break;
        }
        for &i in &limited {
            let d = demand(i).unwrap_or(0.0);
            out[i] = d;
            left -= d;
        }
        open.retain(|i| !limited.contains(i));
    }
    cap - left.max(0.0)
}

/// What one VM did over a window (differences of its cumulative counters).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowSample {
    /// VM name.
    pub name: String,
    /// The GPU (`gpu_id`).
    pub gpu: u32,
    /// Compute partition.
    pub partition: u32,
    /// Priority at the end of the window.
    pub priority: u8,
    /// Weight at the end of the window.
    pub weight: u32,
    /// Its level's slice (ns): the granularity of weighted sharing.
    pub quantum_ns: u64,
    /// Length of the window (ns).
    pub window_ns: u64,
    /// Time it had work it could run (a queue ready, saved or running).
    pub demanding_ns: u64,
    /// Time it had a queue ready or saved and none of them on a slot.
    pub wait_ns: u64,
    /// Compute received: CU time (CU x ns of completed workgroups).
    pub cu_ns: u64,
    /// Slot time charged (`VmStats::gpu_ns`), reported apart.
    pub gpu_ns: u64,
}

/// How a VM demanded over a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Demand {
    /// Demanding for less than a moment (nothing to check).
    Idle,
    /// Demanding part of the window: entitled to what it asked for, which it
    /// got (it went without work for the rest).
    Limited,
    /// Demanding (almost) the whole window: entitled to its water-filled
    /// share.
    Backlogged,
}

impl Demand {
    /// Name in tables and the API.
    pub fn name(self) -> &'static str {
        match self {
            Demand::Idle => "idle",
            Demand::Limited => "limited",
            Demand::Backlogged => "backlogged",
        }
    }

    /// Classifies `demanding_ns` of `window_ns`.
    pub fn of(demanding_ns: u64, window_ns: u64) -> Demand {
        if demanding_ns == 0 || window_ns == 0 {
            Demand::Idle
        } else if demanding_ns as f64 >= BACKLOG_FRACTION * window_ns as f64 {
            Demand::Backlogged
        } else {
            Demand::Limited
        }
    }
}

/// The check of one VM over a window.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// VM name.
    pub name: String,
    /// The GPU (`gpu_id`).
    pub gpu: u32,
    /// Compute partition.
    pub partition: u32,
    /// How it demanded.
    pub demand: Demand,
    /// Fraction of the window it was demanding.
    pub demanding: f64,
    /// Entitlement (fraction of its partition's compute).
    pub entitled: f64,
    /// Received (fraction of its partition's compute).
    pub got: f64,
    /// Fraction of the partition's slot time it was charged (apart).
    pub got_slot: f64,
    /// Shortfall allowed: 5% of the entitlement, one slice of its level
    /// over the window, and the aging given to lower VMs (at most 1/32).
    pub tolerance: f64,
    /// The promise held for it.
    pub held: bool,
    /// Why (one line).
    pub why: String,
}

/// Entitlement of every sample under the demands seen in the window, and
/// whether each VM got it. A backlogged VM holds its promise when it got at
/// least its entitlement minus [`Verdict::tolerance`] of the compute (CU
/// time), or of the slot time (the promise's own unit: a VM whose kernels
/// are narrower than its partition is width-limited); a demand-limited or
/// idle VM got what it asked for by definition (its latency is item 3, not
/// checked here). Receiving more than the entitlement breaks no promise of
/// that VM (another VM's shortfall shows it).
pub fn check_window(samples: &[WindowSample]) -> Vec<Verdict> {
    let mut cu_total: BTreeMap<(u32, u32), u128> = BTreeMap::new();
    let mut slot_total: BTreeMap<(u32, u32), u128> = BTreeMap::new();
    for s in samples {
        *cu_total.entry((s.gpu, s.partition)).or_default() += u128::from(s.cu_ns);
        *slot_total.entry((s.gpu, s.partition)).or_default() += u128::from(s.gpu_ns);
    }
    let frac = |x: u64, tot: Option<&u128>| match tot {
        Some(&t) if t > 0 => x as f64 / t as f64,
        _ => 0.0,
    };
    let got: Vec<f64> = samples
        .iter()
        .map(|s| frac(s.cu_ns, cu_total.get(&(s.gpu, s.partition))))
        .collect();
    let demand: Vec<Demand> = samples
        .iter()
        .map(|s| Demand::of(s.demanding_ns, s.window_ns))
        .collect();
    let claims: Vec<Claim> = samples
        .iter()
        .zip(&got)
        .zip(&demand)
        .map(|((s, &g), d)| Claim {
            gpu: s.gpu,
            partition: s.partition,
            priority: s.priority,
            weight: s.weight,
            demand: match d {
                Demand::Backlogged => None,
                Demand::Limited => Some(g),
                Demand::Idle => Some(0.0),
            },
        })
        .collect();
    let entitled = water_fill(&claims);
    samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            // Compute lower VMs of the partition got beyond their
            // entitlement: aging (bounded by AGING_LIMIT) or a gap above.
            let excess_below: f64 = samples
                .iter()
                .enumerate()
                .filter(|(j, o)| {
                    (o.gpu, o.partition) == (s.gpu, s.partition)
                        && o.priority < s.priority
                        && *j != i
                })
                .map(|(j, _)| (got[j] - entitled[j]).max(0.0))
                .sum();
            let slice = if s.window_ns > 0 {
                s.quantum_ns as f64 / s.window_ns as f64
            } else {
                0.0
            };
            let e = entitled[i];
            let tolerance =
                SHARE_TOLERANCE * e + slice.min(e) + e * excess_below.min(AGING_LIMIT);
            let demanding = if s.window_ns > 0 {
                s.demanding_ns as f64 / s.window_ns as f64
            } else {
                0.0
            };
            let got_slot = frac(s.gpu_ns, slot_total.get(&(s.gpu, s.partition)));
            let (held, why) = match demand[i] {
                Demand::Idle => (true, "idle: nothing to run".to_owned()),
                Demand::Limited => (
                    true,
                    format!(
                        "demand-limited: demanding {:.0}% of the window, got all it asked ({:.3})",
                        demanding * 100.0,
                        got[i]
                    ),
                ),
                Demand::Backlogged if got[i] + tolerance >= e => (
                    true,
                    format!(
                        "got {:.3} of partition {}, entitled {:.3}",
                        got[i], s.partition, e
                    ),
                ),
                // The promise is in charged GPU (slot) time
                // (docs/scheduling.md): a VM whose kernels are narrower
                // than its partition got its time even though it used
                // fewer CUs with it.
                Demand::Backlogged if got_slot + tolerance >= e => (
                    true,
                    format!(
                        "width-limited: got {:.3} of partition {}'s slot time, entitled {:.3}; its kernels used {:.3} of the compute",
                        got_slot, s.partition, e, got[i]
                    ),
                ),
                Demand::Backlogged => (
                    false,
                    format!(
                        "short: got {:.3} of partition {}, entitled {:.3} (tolerance {:.3}); waited {:.0}% of the window for a slot",
                        got[i],
                        s.partition,
                        e,
                        tolerance,
                        if s.window_ns > 0 { s.wait_ns as f64 * 100.0 / s.window_ns as f64 } else { 0.0 }
                    ),
                ),
            };
            Verdict {
                name: s.name.clone(),
                gpu: s.gpu,
                partition: s.partition,
                demand: demand[i],
                demanding,
                entitled: e,
                got: got[i],
                got_slot,
                tolerance,
                held,
                why,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn claim(partition: u32, priority: u8, weight: u32, demand: Option<f64>) -> Claim {
        Claim {
            gpu: 0,
            partition,
            priority,
            weight,
            demand,
        }
    }

    #[test]
    fn weights_one_two_four_and_a_level_below() {
        let c = [
            claim(0, 4, 1, None),
            claim(0, 4, 2, None),
            claim(0, 4, 4, None),
            claim(0, 2, 1, None),
        ];
        let e = water_fill(&c);
        assert!((e[0] - 1.0 / 7.0).abs() < 1e-12);
        assert!((e[1] - 2.0 / 7.0).abs() < 1e-12);
        assert!((e[2] - 4.0 / 7.0).abs() < 1e-12);
        assert_eq!(e[3], 0.0, "strict priority: the level below gets nothing");
    }

    #[test]
    fn a_demand_limited_vm_gets_its_demand_and_the_rest_is_redistributed() {
        // Weights 1:1:2, the heavy one asks for 0.1 only.
        let c = [
            claim(0, 0, 1, None),
            claim(0, 0, 1, None),
            claim(0, 0, 2, Some(0.1)),
        ];
        let e = water_fill(&c);
        assert!((e[2] - 0.1).abs() < 1e-12);
        assert!((e[0] - 0.45).abs() < 1e-12 && (e[1] - 0.45).abs() < 1e-12);
        // A limited VM above leaves its unused share to the level below.
        let c = [claim(0, 9, 1, Some(0.3)), claim(0, 1, 1, None)];
        let e = water_fill(&c);
        assert!((e[0] - 0.3).abs() < 1e-12 && (e[1] - 0.7).abs() < 1e-12);
        // Partitions are independent, and so are GPUs.
        let c = [claim(0, 9, 1, None), claim(1, 1, 1, None)];
        assert_eq!(water_fill(&c), vec![1.0, 1.0]);
        let mut other = claim(0, 1, 1, None);
        other.gpu = 1;
        assert_eq!(water_fill(&[claim(0, 9, 1, None), other]), vec![1.0, 1.0]);
    }

    fn sample(name: &str, prio: u8, weight: u32, demanding: u64, cu: u64) -> WindowSample {
        WindowSample {
            name: name.into(),
            gpu: 0,
            partition: 0,
            priority: prio,
            weight,
            quantum_ns: 10_000_000,
            window_ns: 10_000_000_000,
            demanding_ns: demanding,
            wait_ns: 0,
            cu_ns: cu,
            gpu_ns: cu,
        }
    }

    #[test]
    fn the_window_check_says_who_is_short_and_who_is_limited() {
        const W: u64 = 10_000_000_000;
        // 1:2:4 backlogged, received 1:2:4 exactly: every promise held.
        let ok = [
            sample("a", 4, 1, W, 100),
            sample("b", 4, 2, W, 200),
            sample("c", 4, 4, W, 400),
        ];
        assert!(check_window(&ok).iter().all(|v| v.held));
        // Received 1:1:1 instead: "c" is short (got 1/3, entitled 4/7).
        let bad = [
            sample("a", 4, 1, W, 100),
            sample("b", 4, 2, W, 100),
            sample("c", 4, 4, W, 100),
        ];
        let v = check_window(&bad);
        assert!(v[0].held && !v[2].held, "{v:?}");
        assert!(v[2].why.starts_with("short"), "{}", v[2].why);
        // A VM demanding half the window is demand-limited: it holds and is
        // entitled to what it got; the others split the rest 1:2.
        let lim = [
            sample("a", 4, 1, W, 300),
            sample("b", 4, 2, W, 600),
            sample("c", 4, 4, W / 2, 100),
        ];
        let v = check_window(&lim);
        assert_eq!(v[2].demand, Demand::Limited);
        assert!((v[2].entitled - 0.1).abs() < 1e-12);
        assert!((v[0].entitled - 0.3).abs() < 1e-12 && (v[1].entitled - 0.6).abs() < 1e-12);
        assert!(v.iter().all(|v| v.held), "{v:?}");
        // A lower VM that got time by aging: the VM above is excused up to
        // 1/32 of its entitlement, not more.
        let aged = [sample("hi", 5, 1, W, 970), sample("lo", 1, 1, W, 30)];
        let v = check_window(&aged);
        assert!(v[0].held && v[1].held, "{v:?}");
        assert_eq!(v[1].entitled, 0.0);
        let robbed = [sample("hi", 5, 1, W, 800), sample("lo", 1, 1, W, 200)];
        assert!(!check_window(&robbed)[0].held);
        // Two GPUs are two capacities: partition 0 of each is its own.
        let mut other = sample("b", 4, 1, W, 100);
        other.gpu = 1;
        let v = check_window(&[sample("a", 4, 1, W, 300), other]);
        assert_eq!((v[0].entitled, v[1].entitled), (1.0, 1.0));
        assert_eq!((v[0].got, v[1].got), (1.0, 1.0));
        // Equal weights, equal slot time, but one VM's kernels cover an
        // eighth of the partition's CUs: it got its time (width-limited),
        // not short; with less slot time too it is short.
        let mut narrow = sample("narrow", 4, 1, W, 125);
        narrow.gpu_ns = 1000;
        let mut wide = sample("wide", 4, 1, W, 1000);
        wide.gpu_ns = 1000;
        let v = check_window(&[wide.clone(), narrow.clone()]);
        assert!(v[0].held && v[1].held, "{v:?}");
        assert!(v[1].why.starts_with("width-limited"), "{}", v[1].why);
        assert!((v[1].got_slot - 0.5).abs() < 1e-12);
        narrow.gpu_ns = 500;
        wide.gpu_ns = 1500;
        let v = check_window(&[wide, narrow]);
        assert!(!v[1].held && v[1].why.starts_with("short"), "{v:?}");
    }

    fn claims() -> impl Strategy<Value = Vec<Claim>> {
        prop::collection::vec(
            (
                0u32..2,
                0u8..4,
                1u32..9,
                prop::option::weighted(0.5, 0.0f64..0.6),
            )
                .prop_map(|(p, pr, w, d)| claim(p, pr, w, d)),
            1..12,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Sum = min(1, demand) per partition; nobody above its demand.
        #[test]
        fn entitlements_fill_the_partition_and_respect_demands(c in claims()) {
            let e = water_fill(&c);
            for p in 0..2u32 {
                let idx: Vec<usize> = (0..c.len()).filter(|&i| c[i].partition == p).collect();
                if idx.is_empty() { continue; }
                let sum: f64 = idx.iter().map(|&i| e[i]).sum();
                let unlimited = idx.iter().any(|&i| c[i].demand.is_none());
                let demand: f64 = idx.iter().map(|&i| c[i].demand.unwrap_or(1.0)).sum();
                let want = if unlimited { 1.0 } else { demand.min(1.0) };
                prop_assert!((sum - want).abs() < 1e-9, "sum {} want {}", sum, want);
            }
            for (i, x) in e.iter().enumerate() {
                prop_assert!(*x >= -1e-12);
                if let Some(d) = c[i].demand {
                    prop_assert!(*x <= d + 1e-12, "{} above demand {}", x, d);
                }
            }
        }

        /// Strict priority: a VM below an unlimited VM of its partition gets
        /// nothing; weights within a level: two VMs not held by their
        /// demand split in proportion to their weights, and a limited VM
        /// never gets more per weight than an unlimited one.
        #[test]
        fn strict_priority_and_weights_within_a_level(c in claims()) {
            let e = water_fill(&c);
            for i in 0..c.len() {
                for j in 0..c.len() {
                    if i == j || c[i].partition != c[j].partition { continue; }
                    if c[j].priority > c[i].priority && c[j].demand.is_none() {
                        prop_assert_eq!(e[i], 0.0);
                    }
                    if c[i].priority == c[j].priority {
                        let (wi, wj) = (f64::from(c[i].weight), f64::from(c[j].weight));
                        let satisfied = |k: usize| c[k].demand.is_some_and(|d| (e[k] - d).abs() < 1e-12);
                        if !satisfied(i) && !satisfied(j) {
                            prop_assert!((e[i] / wi - e[j] / wj).abs() < 1e-9);
                        }
                        if c[j].demand.is_none() {
                            prop_assert!(e[i] / wi <= e[j] / wj + 1e-9);
                        }
                    }
                }
            }
        }
    }
}
