//! The scheduler's promises (issue 9) as checks over runs of the built-in
//! scenarios: a higher-priority VM wins the GPU, VMs of equal priority share
//! it by weight, periodic real-time tenants keep their latency, and every
//! workgroup's effect lands exactly once.
//!
//! Each check is a pure function of reports / run outputs (so tests can
//! assert them) plus a runner ([`check_all`]) used by the `promises`
//! example. Shares are measured in CU time (the work a VM received), as the
//! figures of the issue were; the scheduler's own charge (`gpu_time_us`) is
//! printed beside them by the per-VM table.

use crate::driver::{evaluate_full, simulate, topology, EvalError, RunOutput, VmRun};
use crate::report::PolicyReport;
use crate::scenario::{Scenario, BUILTIN};
use gpu::topology::GpuTopology;
use scheduler::Policy;

/// Built-in variants of the periodic real-time scenarios (issue 9,
/// occupancy): other best-effort kernel shapes and RT rates and widths.
pub const RT_VARIANTS: &[&str] = &[
    "rt5k-wide",
    "rt5k-narrow",
    "rt5k-short",
    "rt5k-few",
    "rt1k-8wg",
    "rt200-1k",
];

/// Outcome of one promise over one or more seeds.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Target name (scenario: what).
    pub name: String,
    /// Measured figure per seed, formatted.
    pub measured: Vec<String>,
    /// The target, in words.
    pub target: String,
    /// Every seed met it.
    pub pass: bool,
    /// Reports of the failing seeds (for the per-VM table).
    pub failures: Vec<PolicyReport>,
}

/// One seed's figure for one promise.
#[derive(Debug, Clone)]
pub struct Figure {
    /// Formatted measurement.
    pub measured: String,
    /// Met the target.
    pub pass: bool,
}

impl Figure {
    fn new(measured: String, pass: bool) -> Self {
        Figure { measured, pass }
    }
}

/// One CWSR save plus one restore of a whole partition (every CU holding
/// one workgroup), from the topology's CWSR model (`[gpu.cwsr]`): per XCC,
/// in parallel, trap/start cost + (control stack + CUs per XCC x
/// `wg_state_bytes`) / bandwidth. This is the modelled worst case of one
/// preemption, not a measurement.
pub fn cwsr_save_restore_ns(topo: &GpuTopology) -> u64 {
    let c = &topo.cwsr;
    let bytes = (topo.ctl_stack_bytes_per_xcc() as u64)
        .saturating_add((topo.cus_per_xcc as u64).saturating_mul(c.wg_state_bytes));
    let per = |fixed: u64, bw: u64| fixed.saturating_add(bytes.saturating_mul(1000) / bw.max(1));
    per(c.trap_ns, c.save_bytes_per_us) + per(c.restore_ns, c.restore_bytes_per_us)
}

/// CU time (CU-us) of the VMs of `r` whose name is `name` or `name-i`
/// (one tenant entry's VMs).
pub(crate) fn cu_of(r: &PolicyReport, name: &str) -> f64 {
    r.vms
        .iter()
        .filter(|v| of_entry(&v.name, name))
        .map(|v| v.cu_time_us)
        .sum()
}

/// Whether VM `vm` is one of tenant entry `name`'s VMs (`name` itself, or
/// `name-i` for an entry of several).
fn of_entry(vm: &str, name: &str) -> bool {
    vm == name || vm.strip_prefix(name).is_some_and(|s| s.starts_with('-'))
}

/// CU time (CU-us) its workgroups received (`VmRun::cu_used_ns`: kernels
/// still in flight at the end included) of the VMs of `r` whose name is
/// `name` or `name-i` (one tenant entry's VMs). Unlike [`cu_of`] (completed
/// kernels) it does not depend on where the run's end cuts the VM's
/// kernels: a VM with `k` kernels of `c` CU-ns each in flight leaves up to
/// `k x c` out of `cu_of`, and a run shifted by a few ms (a lower VM's
/// aging batch) can move whole kernels across the end (docs/scheduling.md,
/// "The top's CU time with kernels in flight at the end").
pub(crate) fn cu_used_of(r: &RunOutput, name: &str) -> f64 {
    vms_named(r, name).map(|v| v.cu_used_ns as f64 / 1e3).sum()
}

/// The top VM keeps at least `min` of the CU time it gets alone:
/// `with` = the full run, `alone` = the run with only the top tenant.
pub fn keeps_alone_share(with: &PolicyReport, alone: &PolicyReport, top: &str, min: f64) -> Figure {
    let (w, a) = (cu_of(with, top), cu_of(alone, top));
    let ratio = if a > 0.0 { w / a } else { 0.0 };
    Figure::new(format!("{:.3} of alone", ratio), ratio >= min)
}

/// min / max of CU time / weight over the VMs whose names are in `names`
/// (all VMs when empty); 1.0 = exactly weighted.
pub fn weighted_min_max(r: &PolicyReport, names: &[&str]) -> f64 {
    let x: Vec<f64> = r
        .vms
        .iter()
        .filter(|v| {
            names.is_empty()
                || names.iter().any(|n| {
                    v.name == *n || v.name.strip_prefix(n).is_some_and(|s| s.starts_with('-'))
                })
        })
        .map(|v| v.cu_time_us / v.weight.max(1) as f64)
        .collect();
    let max = x.iter().cloned().fold(0.0, f64::max);
    let min = x.iter().cloned().fold(f64::INFINITY, f64::min);
    if max > 0.0 {
        min / max
    } else {
        0.0
    }
}

/// Equal weighted shares: min/max of CU time / weight >= `min`.
pub fn equal_shares(r: &PolicyReport, names: &[&str], min: f64) -> Figure {
    let m = weighted_min_max(r, names);
    Figure::new(format!("min/max {m:.3}"), m >= min)
}

/// Strict order by priority: every VM gets more CU time than every VM of
/// a lower priority, and the top VM at least `top_min` of all CU time.
pub fn strict_order(r: &PolicyReport, top_min: f64) -> Figure {
    let mut v: Vec<(u8, f64)> = r.vms.iter().map(|v| (v.priority, v.cu_time_us)).collect();
    v.sort_by_key(|x| std::cmp::Reverse(x.0));
    let pairs = v.windows(2).filter(|w| w[0].0 > w[1].0).count();
    let ordered = v
        .windows(2)
        .filter(|w| w[0].0 > w[1].0 && w[0].1 > w[1].1)
        .count();
    let total: f64 = v.iter().map(|x| x.1).sum();
    let top = if total > 0.0 { v[0].1 / total } else { 0.0 };
    Figure::new(
        format!("{ordered}/{pairs} levels ordered, top {:.1}%", top * 100.0),
        ordered == pairs && top >= top_min,
    )
}

/// Every job of every VM completed, or has waited by the end, no longer
/// than `factor` x the aging bound.
pub fn within_aging(run: &RunOutput, aging_ns: u64, factor: f64) -> Figure {
    let worst = run
        .vm_runs
        .iter()
        .max_by_key(|v| v.max_job_age_ns)
        .map(|v| (v.name.as_str(), v.max_job_age_ns))
        .unwrap_or(("-", 0));
    let bound = aging_ns as f64 * factor;
    Figure::new(
        format!(
            "worst job {:.0} ms ({}), bound {:.0} ms",
            worst.1 as f64 / 1e6,
            worst.0,
            bound / 1e6
        ),
        worst.1 as f64 <= bound,
    )
}

/// The aging bound per level and per job length of docs/scheduling.md
/// ("Aging", `scheduler::Scheduler::aging_bound_job_ns`) of every tenant
/// of the scenario below its top priority: the longest one of its jobs may
/// wait for its completion, by tenant name. The other VMs that compete for
/// aging turns are every VM below the top (the other VMs of a `count`
/// entry included); `save_ns` is the modelled save of the topology (half of
/// [`cwsr_save_restore_ns`]) and `S` its HQD slots per partition.
pub fn aging_bounds_of(sc: &Scenario, topo: &GpuTopology) -> Vec<(String, u64)> {
    let cfg = sc.scheduler.clone().unwrap_or_default();
    let Some(top) = sc.tenants.iter().map(|t| t.priority).max() else {
        return Vec::new();
    };
    let save = cwsr_save_restore_ns(topo) / 2;
    let cus = topo.cus_per_partition().max(1) as u64;
    let slots = (topo.user_queues_per_xcc() * topo.xccs_per_partition()).max(1) as usize;
    let job_ns = |t: &crate::scenario::Tenant| -> u64 {
        t.kernels
            .iter()
            .map(|k| {
                (k.workgroups as u64).div_ceil(cus)
                    * k.wg_cost_us.saturating_mul(1000)
                    * k.repeat.max(1) as u64
            })
            .sum()
    };
    let lower: Vec<_> = sc.tenants.iter().filter(|t| t.priority < top).collect();
    lower
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let others: Vec<(u8, u32)> = lower
                .iter()
                .enumerate()
                .flat_map(|(j, o)| {
                    let n = if i == j {
                        o.count.saturating_sub(1)
                    } else {
                        o.count
                    };
                    std::iter::repeat_n((o.priority, o.queues.max(1)), n as usize)
                })
                .collect();
            let bound = scheduler::Scheduler::aging_bound_job_ns(
                &cfg,
                t.priority,
                t.queues.max(1),
                &others,
                slots,
                save,
                // Its queues co-run in a turn: a job's partition time is
                // up to the queue count times its own.
                job_ns(t).saturating_mul(t.queues.max(1) as u64),
            );
            (t.name.clone(), bound)
        })
        .collect()
}

/// The longest of [`aging_bounds_of`] (`None` without VMs below the top).
pub fn aging_bound_of(sc: &Scenario, topo: &GpuTopology) -> Option<u64> {
    aging_bounds_of(sc, topo).into_iter().map(|e| e.1).max()
}

/// Every job completed, or has waited by the end, no longer than the
/// aging bound of its own tenant ([`aging_bounds_of`]: its level, its job
/// length, the VMs that compete with it) and than `factor` x `aging_ns`.
pub fn within_aging_bound(
    run: &RunOutput,
    bounds: &[(String, u64)],
    aging_ns: u64,
    factor: f64,
) -> Figure {
    let cap = aging_ns as f64 * factor;
    let bound_of = |name: &str| -> Option<u64> {
        bounds
            .iter()
            .find(|(t, _)| {
                name == t
                    || name
                        .strip_prefix(t.as_str())
                        .is_some_and(|s| s.starts_with('-'))
            })
            .map(|e| e.1)
    };
    let mut worst: (&str, u64, Option<u64>) = ("-", 0, None);
    let mut pass = true;
    for v in &run.vm_runs {
        let b = bound_of(&v.name);
        if b.is_some_and(|b| v.max_job_age_ns > b) || v.max_job_age_ns as f64 > cap {
            pass = false;
        }
        if v.max_job_age_ns > worst.1 {
            worst = (v.name.as_str(), v.max_job_age_ns, b);
        }
    }
    Figure::new(
        format!(
            "worst job {:.0} ms ({}, its aging bound {}), {factor} x aging_ns {:.0} ms",
            worst.1 as f64 / 1e6,
            worst.0,
            worst
                .2
                .map_or("-".to_string(), |b| format!("{:.0} ms", b as f64 / 1e6)),
            cap / 1e6
        ),
        pass,
    )
}

/// Hi p99 <= `factor` x isolated p99 + `extra_us`.
pub fn hi_p99_bound(r: &PolicyReport, factor: f64, extra_us: f64) -> Figure {
    match (r.hi_p99_us, r.hi_isolated_p99_us) {
        (Some(p), Some(iso)) => {
            let bound = factor * iso + extra_us;
            Figure::new(
                format!("p99 {p:.0} us, iso {iso:.0} us, bound {bound:.0} us"),
                p <= bound,
            )
        }
        _ => Figure::new("no hi jobs".into(), false),
    }
}

/// lo_throughput_retained >= `min`.
pub fn lo_retained(r: &PolicyReport, min: f64) -> Figure {
    match r.lo_throughput_retained {
        Some(x) => Figure::new(format!("{x:.3}"), x >= min),
        None => Figure::new("no lo VMs".into(), false),
    }
}

/// Modelled CWSR save + restore time <= `max` of the run.
pub fn cwsr_fraction(r: &PolicyReport, duration_ms: u64, max: f64) -> Figure {
    let f = r.save_restore_us_total / (duration_ms as f64 * 1000.0);
    Figure::new(
        format!(
            "{:.1}% ({:.0} ms)",
            f * 100.0,
            r.save_restore_us_total / 1000.0
        ),
        f <= max,
    )
}

/// Jain index >= `min`.
pub fn jain_at_least(r: &PolicyReport, min: f64) -> Figure {
    match r.jain_index {
        Some(j) => Figure::new(format!("jain {j:.4}"), j >= min),
        None => Figure::new("no jain".into(), false),
    }
}

/// The p50 and p99 job latency of VM `name` in `with` are both within
/// `factor` x its figures in `base` (the same VM next to legitimately busy
/// VMs).
pub fn neighbour_latency(
    with: &PolicyReport,
    base: &PolicyReport,
    name: &str,
    factor: f64,
) -> Figure {
    let vm = |r: &PolicyReport| r.vms.iter().find(|v| v.name == name).cloned();
    let (Some(w), Some(b)) = (vm(with), vm(base)) else {
        return Figure::new(format!("no VM {name}"), false);
    };
    let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if y > 0.0 => x / y,
        _ => f64::INFINITY,
    };
    let (r50, r99) = (ratio(w.p50_us, b.p50_us), ratio(w.p99_us, b.p99_us));
    Figure::new(
        format!(
            "p50 {:.0}/{:.0} us = {r50:.2}x, p99 {:.0}/{:.0} us = {r99:.2}x",
            w.p50_us.unwrap_or(0.0),
            b.p50_us.unwrap_or(0.0),
            w.p99_us.unwrap_or(0.0),
            b.p99_us.unwrap_or(0.0)
        ),
        r50 <= factor && r99 <= factor,
    )
}

/// The GPU time the scheduler billed VM `name` is within `tol` of its real
/// use: the time its completed kernels take alone on the partition
/// (`VmRun::work_ns`).
pub fn billed_vs_real(run: &RunOutput, name: &str, tol: f64) -> Figure {
    let Some(v) = run.vm_runs.iter().find(|v| v.name == name) else {
        return Figure::new(format!("no VM {name}"), false);
    };
    let (billed, real) = (v.gpu_ns as f64 / 1000.0, v.work_ns as f64 / 1000.0);
    let ratio = if real > 0.0 {
        billed / real
    } else {
        f64::INFINITY
    };
    Figure::new(
        format!("billed {billed:.0} us / real {real:.0} us = {ratio:.3}"),
        (ratio - 1.0).abs() <= tol,
    )
}

/// Lost / duplicated effects and queue errors all zero.
pub fn exactly_once(run: &RunOutput) -> bool {
    // A hung tenant's preemption-timeout resets are asked for (issue 11);
    // `corunners_exact` checks that nothing else was reset.
    run.lost_effects == 0 && run.duplicate_effects == 0 && run.queue_errors == run.preempt_timeouts
}

/// Which promises to run and how.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Arrival seeds.
    pub seeds: Vec<u64>,
    /// Policy under test.
    pub policy: Policy,
    /// Only targets whose name contains this.
    pub filter: Option<String>,
    /// Length of the exactly-once runs (every built-in, every policy but
    /// `reset`), ms; `None`: skip them.
    pub exactly_once_ms: Option<u64>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            seeds: vec![1, 2, 3],
            policy: Policy::Hqdmux,
            filter: None,
            exactly_once_ms: Some(500),
        }
    }
}

/// A promise: its name, its target in words, and the figure of one seed.
type Check<'a> = (String, String, Box<dyn Fn(&Ctx) -> Figure + 'a>);

/// One seed's run of a scenario: report, raw output, and the baseline of
/// its `top` or `light` tenant alone.
struct Ctx {
    report: PolicyReport,
    run: RunOutput,
    alone: Option<PolicyReport>,
    /// For isolation scenarios: the run with every hostile tenant replaced
    /// by a legitimately busy VM ([`Scenario::busy_baseline`]).
    base: Option<PolicyReport>,
}

/// Runs every promise over the built-in scenarios (see docs/scenarios.md
/// for the list and the targets).
pub fn check_all(opts: &CheckOptions) -> Result<Vec<Outcome>, EvalError> {
    let mut out = Vec::new();
    let wanted = |n: &str| opts.filter.as_deref().is_none_or(|f| n.contains(f));
    let builtin = |n: &str| Scenario::builtin(n).expect("built-in scenarios parse");
    let mut plan: Vec<(Scenario, Vec<Check>)> = Vec::new();
    // Priority: the top VM keeps >= 95% of its GPU time alone.
    for n in ["prio-inv", "prio-inv-long", "prio-inv-rev"] {
        for sc in builtin(n).expand() {
            let c: Check = (
                format!("{}: top CU time vs alone", sc.name),
                ">= 0.95".into(),
                Box::new(|c: &Ctx| {
                    keeps_alone_share(&c.report, c.alone.as_ref().unwrap(), "top", 0.95)
                }),
            );
            plan.push((sc, vec![c]));
        }
    }
    {
        let sc = builtin("ladder16");
        let aging = sc.scheduler.clone().unwrap_or_default().aging_ns;
        let bounds = aging_bounds_of(&sc, &topology(&sc)?);
        let checks: Vec<Check> = vec![
            (
                "ladder16: strict order".into(),
                "all levels ordered, top >= 90%".into(),
                Box::new(|c: &Ctx| strict_order(&c.report, 0.9)),
            ),
            (
                "ladder16: every VM served".into(),
                "every job <= its level's aging bound and <= 1.5 x aging_ns".into(),
                Box::new(move |c: &Ctx| within_aging_bound(&c.run, &bounds, aging, 1.5)),
            ),
        ];
        plan.push((sc, checks));
    }
    for n in ["equal-queues", "equal-depth", "equal-jobsize", "weights124"] {
        let c: Check = (
            format!("{n}: equal CU time / weight"),
            "min/max >= 0.95".into(),
            Box::new(|c: &Ctx| equal_shares(&c.report, &[], 0.95)),
        );
        plan.push((builtin(n), vec![c]));
    }
    {
        let checks: Vec<Check> = vec![
            (
                "undershare: light p99 vs isolated".into(),
                "<= 2x isolated".into(),
                Box::new(|c: &Ctx| hi_p99_bound(&c.report, 2.0, 0.0)),
            ),
            (
                "undershare: saturating VMs equal".into(),
                "min/max >= 0.95".into(),
                Box::new(|c: &Ctx| equal_shares(&c.report, &["sat"], 0.95)),
            ),
            (
                "undershare: light served in full".into(),
                ">= 0.95 of its CU time alone".into(),
                Box::new(|c: &Ctx| {
                    keeps_alone_share(&c.report, c.alone.as_ref().unwrap(), "light", 0.95)
                }),
            ),
        ];
        plan.push((builtin("undershare"), checks));
    }
    // Periodic real time beside best effort: the built-ins measure lo
    // retained; the issue 9 variants (occupancy: other best-effort shapes,
    // RT rates and widths) measure best effort against itself alone (a
    // narrow best-effort kernel cannot fill the GPU even alone).
    let rt_names = ["rt5k", "rt200"].iter().map(|n| (*n, false));
    for (n, variant) in rt_names.chain(RT_VARIANTS.iter().map(|n| (*n, true))) {
        let sc = builtin(n);
        let cwsr_us = cwsr_save_restore_ns(&topology(&sc)?) as f64 / 1000.0;
        let ms = sc.duration_ms;
        let throughput: Check = if variant {
            (
                format!("{n}: be CU time vs alone"),
                ">= 0.9".into(),
                Box::new(|c: &Ctx| {
                    keeps_alone_share(&c.report, c.alone.as_ref().unwrap(), "be", 0.9)
                }),
            )
        } else {
            (
                format!("{n}: lo retained"),
                ">= 0.9".into(),
                Box::new(|c: &Ctx| lo_retained(&c.report, 0.9)),
            )
        };
        let checks: Vec<Check> = vec![
            (
                format!("{n}: rt p99"),
                format!("<= 1.1x iso + {cwsr_us:.0} us (CWSR)"),
                Box::new(move |c: &Ctx| hi_p99_bound(&c.report, 1.1, cwsr_us)),
            ),
            throughput,
            (
                format!("{n}: CWSR time"),
                "<= 10% of the run".into(),
                Box::new(move |c: &Ctx| cwsr_fraction(&c.report, ms, 0.1)),
            ),
        ];
        plan.push((sc, checks));
    }
    {
        let sc = builtin("aging");
        let aging = sc.scheduler.clone().unwrap_or_default().aging_ns;
        let bounds = aging_bounds_of(&sc, &topology(&sc)?);
        let c: Check = (
            "aging: every job served".into(),
            "every job <= its level's aging bound and <= 1.5 x aging_ns".into(),
            Box::new(move |c: &Ctx| within_aging_bound(&c.run, &bounds, aging, 1.5)),
        );
        plan.push((sc, vec![c]));
    }
    // The existing built-ins' targets.
    {
        let c: Check = (
            "seed: hi p99".into(),
            "<= 1.05x isolated".into(),
            Box::new(|c: &Ctx| hi_p99_bound(&c.report, 1.05, 0.0)),
        );
        plan.push((builtin("seed"), vec![c]));
    }
    for n in ["disb-a", "disb-b", "disb-c", "disb-d", "disb-e"] {
        let sc = builtin(n);
        let cwsr_us = cwsr_save_restore_ns(&topology(&sc)?) as f64 / 1000.0;
        let checks: Vec<Check> = vec![
            (
                format!("{n}: hi p99"),
                format!("<= 1.05x iso + {cwsr_us:.0} us (CWSR)"),
                Box::new(move |c: &Ctx| hi_p99_bound(&c.report, 1.05, cwsr_us)),
            ),
            (
                format!("{n}: lo retained"),
                ">= 0.95".into(),
                Box::new(|c: &Ctx| lo_retained(&c.report, 0.95)),
            ),
        ];
        plan.push((sc, checks));
    }
    // Issue 11: hostile tenants beside a well-behaved VM ("good").
    for n in [
        "iso-stall",
        "iso-stall-hi",
        "iso-wgflood",
        "iso-dbflood",
        "iso-dbflood-hi",
        "iso-shapes",
        "iso-wgflood-w4",
        "iso-wgflood-2good",
        "iso-wgflood-cost",
    ] {
        for sc in builtin(n).expand() {
            let goods: &[&'static str] = if n == "iso-wgflood-2good" {
                &["good", "good2"]
            } else {
                &["good"]
            };
            let mut checks: Vec<Check> = Vec::new();
            for &g in goods {
                checks.push((
                    format!("{}: {g} p50/p99 vs +busy", sc.name),
                    "both <= 1.2x".into(),
                    Box::new(move |c: &Ctx| {
                        neighbour_latency(&c.report, c.base.as_ref().unwrap(), g, 1.2)
                    }),
                ));
                checks.push((
                    format!("{}: {g} billed vs real", sc.name),
                    "within 5%".into(),
                    Box::new(move |c: &Ctx| billed_vs_real(&c.run, g, 0.05)),
                ));
            }
            plan.push((sc, checks));
        }
    }
    {
        // The flooder does real work at a higher priority: it wins the GPU
        // by design; the neighbour runs by aging and is billed for its own.
        let sc = builtin("iso-wgflood-hi");
        let checks: Vec<Check> = vec![
            (
                "iso-wgflood-hi: good served".into(),
                ">= 1 job completed".into(),
                Box::new(|c: &Ctx| {
                    let n = c
                        .report
                        .vms
                        .iter()
                        .find(|v| v.name == "good")
                        .map_or(0, |v| v.jobs);
                    Figure::new(format!("{n} jobs"), n >= 1)
                }),
            ),
            (
                "iso-wgflood-hi: good billed vs real".into(),
                "within 5%".into(),
                Box::new(|c: &Ctx| billed_vs_real(&c.run, "good", 0.05)),
            ),
        ];
        plan.push((sc, checks));
    }
    {
        let c: Check = (
            "flood: jain".into(),
            ">= 0.99".into(),
            Box::new(|c: &Ctx| jain_at_least(&c.report, 0.99)),
        );
        plan.push((builtin("flood"), vec![c]));
    }

    for (sc, checks) in &plan {
        let checks: Vec<&Check> = checks.iter().filter(|c| wanted(&c.0)).collect();
        if checks.is_empty() {
            continue;
        }
        let mut outcomes: Vec<Outcome> = checks
            .iter()
            .map(|c| Outcome {
                name: c.0.clone(),
                measured: Vec::new(),
                target: c.1.clone(),
                pass: true,
                failures: Vec::new(),
            })
            .collect();
        for &seed in &opts.seeds {
            let (report, run) = evaluate_full(sc, opts.policy, seed)?;
            // The baseline of the tenant a check compares with itself alone.
            let alone_of = ["top", "light"]
                .into_iter()
                .chain(RT_VARIANTS.contains(&sc.name.as_str()).then_some("be"))
                .find(|n| sc.tenants.iter().any(|t| t.name == *n));
            let alone = match alone_of {
                Some(n) => Some(evaluate_full(&sc.only_tenants(&[n]), opts.policy, seed)?.0),
                None => None,
            };
            let base = if sc.tenants.iter().any(|t| t.behaviour.hostile()) {
                Some(evaluate_full(&sc.busy_baseline(), opts.policy, seed)?.0)
            } else {
                None
            };
            let ctx = Ctx {
                report,
                run,
                alone,
                base,
            };
            for (c, o) in checks.iter().zip(&mut outcomes) {
                let f = (c.2)(&ctx);
                o.measured.push(f.measured);
                if !f.pass {
                    o.pass = false;
                    o.failures.push(ctx.report.clone());
                }
            }
        }
        out.extend(outcomes);
    }
    if wanted("hung") {
        out.extend(hung_outcomes(&opts.seeds, opts.policy)?);
    }
    if let Some(ms) = opts.exactly_once_ms.filter(|_| wanted("exactly-once")) {
        out.push(exactly_once_all(&opts.seeds, ms)?);
    }
    Ok(out)
}

/// Every built-in (sweeps expanded), shortened to `ms`, under every policy
/// but `reset`, for every seed: no lost or duplicated effect, no queue error.
pub fn exactly_once_all(seeds: &[u64], ms: u64) -> Result<Outcome, EvalError> {
    let mut runs = 0;
    let mut bad = Vec::new();
    for (name, _) in BUILTIN {
        let mut s = Scenario::builtin(name).expect("built-in scenarios parse");
        s.duration_ms = s.duration_ms.min(ms);
        for sc in s.expand() {
            for p in Policy::ALL.iter().filter(|p| **p != Policy::Reset) {
                for &seed in seeds {
                    let r = simulate(&sc, *p, seed)?;
                    runs += 1;
                    if !exactly_once(&r) {
                        bad.push(format!(
                            "{} {} seed {seed}: lost {} dup {} errors {}",
                            sc.name,
                            p.name(),
                            r.lost_effects,
                            r.duplicate_effects,
                            r.queue_errors
                        ));
                    }
                }
            }
        }
    }
    Ok(Outcome {
        name: "exactly-once (all built-ins, all policies but reset)".into(),
        measured: vec![if bad.is_empty() {
            format!("{runs} runs clean")
        } else {
            bad.join("; ")
        }],
        target: format!("0 lost, 0 dup, 0 errors ({ms} ms runs)"),
        pass: bad.is_empty(),
        failures: Vec::new(),
    })
}

// ---- issue 11: hung tenants ---------------------------------------------

/// The VMs of `run` named `name` or `name-i`.
fn vms_named<'a>(run: &'a RunOutput, name: &'a str) -> impl Iterator<Item = &'a VmRun> + 'a {
    run.vm_runs.iter().filter(move |v| of_entry(&v.name, name))
}

/// Every VM of tenant `hung` had its queue reset after a preemption
/// timeout, within `[timeout_ns, timeout_ns + latest_ns]` of the start
/// (`latest_ns`: when the scheduler must have asked for the preemption:
/// the co-runner's first arrival plus a quantum, or aging for a higher
/// priority hung VM).
pub fn hung_reset(run: &RunOutput, hung: &str, timeout_ns: u64, latest_ns: u64) -> Figure {
    let mut ok = true;
    let mut at = Vec::new();
    for v in vms_named(run, hung) {
        match v.first_reset_ns {
            Some(t) => {
                at.push(format!("{:.1} ms", t as f64 / 1e6));
                ok &= t >= timeout_ns && t <= timeout_ns.saturating_add(latest_ns);
            }
            None => {
                at.push("no reset".into());
                ok = false;
            }
        }
    }
    Figure::new(format!("reset at {}", at.join(", ")), ok && !at.is_empty())
}

/// Nothing but tenant `hung` lost, duplicated or stopped anything: no lost
/// or duplicated effect, no queue error or reset on any other VM, and every
/// other VM completed at least one job.
pub fn corunners_exact(run: &RunOutput, hung: &str) -> Figure {
    let others: Vec<&VmRun> = run
        .vm_runs
        .iter()
        .filter(|v| !vms_named(run, hung).any(|h| h.name == v.name))
        .collect();
    let errs: u64 = others
        .iter()
        .map(|v| v.queue_errors + v.preempt_resets)
        .sum();
    let idle = others.iter().filter(|v| v.latency_ns.is_empty()).count();
    let jobs: usize = others.iter().map(|v| v.latency_ns.len()).sum();
    Figure::new(
        format!(
            "lost {} dup {} co-runner errors {errs}, {jobs} co-runner jobs",
            run.lost_effects, run.duplicate_effects
        ),
        run.lost_effects == 0 && run.duplicate_effects == 0 && errs == 0 && idle == 0,
    )
}

/// The built-in `hung` scenario with the hung tenant's timeout and
/// priority varied (ms, priority): each run must reset the hung queue in
/// its window and leave the co-runner exact.
pub fn hung_outcomes(seeds: &[u64], policy: Policy) -> Result<Vec<Outcome>, EvalError> {
    let base = Scenario::builtin("hung").expect("built-in scenarios parse");
    let cfg = base.scheduler.clone().unwrap_or_default();
    let mut out = Vec::new();
    for (timeout_ms, prio) in [(20u64, 8u8), (50, 8), (200, 8), (50, 4), (50, 12)] {
        let mut sc = base.clone();
        let h = sc
            .tenants
            .iter_mut()
            .find(|t| t.name == "hung")
            .expect("hung tenant");
        h.preempt_timeout_ms = Some(timeout_ms);
        h.priority = prio;
        let rt_prio = sc
            .tenants
            .iter()
            .find(|t| t.name == "rt")
            .map_or(0, |t| t.priority);
        // When the scheduler asks for the preemption at the latest: the
        // co-runner's first job (1 ms) plus a quantum; aging first when
        // the hung VM outranks it.
        let mut latest = 2_000_000 + cfg.quantum_ns[usize::from(prio.min(15))];
        if prio > rt_prio {
            latest += cfg.aging_ns;
        }
        let timeout_ns = timeout_ms * 1_000_000;
        let mut reset = Outcome {
            name: format!(
                "hung (timeout {timeout_ms} ms, priority {prio}): reset of the hung queue"
            ),
            measured: Vec::new(),
            target: format!(
                "error 22 within [{timeout_ms}, {:.0}] ms",
                (timeout_ns + latest) as f64 / 1e6
            ),
            pass: true,
            failures: Vec::new(),
        };
        let mut exact = Outcome {
            name: format!("hung (timeout {timeout_ms} ms, priority {prio}): co-runner exact"),
            measured: Vec::new(),
            target: "0 lost, 0 dup, 0 co-runner errors, jobs completed".into(),
            pass: true,
            failures: Vec::new(),
        };
        for &seed in seeds {
            let run = simulate(&sc, policy, seed)?;
            for (o, f) in [
                (&mut reset, hung_reset(&run, "hung", timeout_ns, latest)),
                (&mut exact, corunners_exact(&run, "hung")),
            ] {
                o.measured.push(f.measured);
                o.pass &= f.pass;
            }
        }
        out.push(reset);
        out.push(exact);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::VmGpuReport;

    fn vm(name: &str, priority: u8, weight: u32, cu: f64) -> VmGpuReport {
        VmGpuReport {
            name: name.into(),
            priority,
            weight,
            cu_time_us: cu,
            ..Default::default()
        }
    }

    fn report(vms: Vec<VmGpuReport>) -> PolicyReport {
        PolicyReport {
            vms,
            ..Default::default()
        }
    }

    #[test]
    fn cwsr_bound_follows_the_topology_model() {
        let t = GpuTopology::default();
        let one = cwsr_save_restore_ns(&t);
        // 38 CUs x 0x95000 bytes + control stack at 200 GB/s, twice, plus
        // trap and restore start.
        let bytes = t.ctl_stack_bytes_per_xcc() as u64 + 38 * 0x95000;
        assert_eq!(one, 2 * (5_000 + bytes * 1000 / 200_000));
        let mut slow = t.clone();
        slow.cwsr.save_bytes_per_us /= 2;
        assert!(cwsr_save_restore_ns(&slow) > one);
    }

    #[test]
    fn shares_compare_cu_time_per_weight_of_the_named_vms() {
        let r = report(vec![
            vm("w1", 6, 1, 100.0),
            vm("w2", 6, 2, 196.0),
            vm("sat-0", 6, 1, 50.0),
            vm("sat-1", 6, 1, 50.0),
            vm("saturn", 6, 1, 1.0),
        ]);
        assert!((weighted_min_max(&r, &["w1", "w2"]) - 0.98).abs() < 1e-9);
        assert_eq!(weighted_min_max(&r, &["sat"]), 1.0, "saturn is not sat-i");
        assert!(equal_shares(&r, &["w1", "w2"], 0.95).pass);
        assert!(!equal_shares(&r, &[], 0.95).pass);
    }

    #[test]
    fn aging_bound_follows_the_stated_formula() {
        let sc = Scenario::builtin("aging").unwrap();
        let topo = topology(&sc).unwrap();
        let save = cwsr_save_restore_ns(&topo) / 2;
        let slots = (topo.user_queues_per_xcc() * topo.xccs_per_partition()) as usize;
        // Two starved priority-1 VMs (one entry of count 2), one queue
        // each, 1 ms jobs (304 workgroups of 1 ms on 304 CUs), below
        // priority 10.
        let cfg = sc.scheduler.clone().unwrap_or_default();
        let want =
            scheduler::Scheduler::aging_bound_job_ns(&cfg, 1, 1, &[(1, 1)], slots, save, 1_000_000);
        let bounds = aging_bounds_of(&sc, &topo);
        assert_eq!(bounds.len(), 1);
        assert_eq!(bounds[0].1, want);
        assert_eq!(aging_bound_of(&sc, &topo), Some(want));
        // aging_ns x 2 / 3 for priority 1, then its own turn, at most
        // 1 + 3 / 3 turns of the other VM and one more for its queue of
        // the same level due first, one batch each per budget period,
        // then the batch that runs it (one turn: 1 ms < B - 2 x save).
        // A batch lasts at most B + Y (its pauses for demand-limited higher
        // VMs), one per budget period F x (B + Y + 2 x save).
        let wall = scheduler::Scheduler::AGING_BATCH_NS + scheduler::Scheduler::AGING_YIELD_NS;
        let period = 32 * (wall + 2 * save);
        assert_eq!(want, cfg.aging_ns * 2 / 3 + 4 * period + wall);
        // More starved VMs, a longer bound; a longer job, more turns.
        let mut more = sc.clone();
        more.tenants[1].count = 8;
        assert!(aging_bound_of(&more, &topo).unwrap() > want);
        let mut long = sc.clone();
        long.tenants[1].kernels[0].repeat = 20;
        let m = 20_000_000u64.div_ceil(scheduler::Scheduler::AGING_BATCH_NS - 2 * save);
        assert!(m > 10);
        assert_eq!(aging_bound_of(&long, &topo).unwrap(), m * want);
        // Each VM against its own bound.
        let mut run = RunOutput::default();
        assert!(within_aging_bound(&run, &bounds, cfg.aging_ns, 1.5).pass);
        run.vm_runs.push(crate::driver::VmRun {
            name: format!("{}-0", bounds[0].0),
            max_job_age_ns: want + 1,
            ..Default::default()
        });
        assert!(!within_aging_bound(&run, &bounds, cfg.aging_ns * 100, 1.5).pass);
        run.vm_runs[0].max_job_age_ns = want;
        assert!(within_aging_bound(&run, &bounds, cfg.aging_ns * 100, 1.5).pass);
    }

    #[test]
    fn strict_order_needs_every_level_above_the_next_and_a_dominant_top() {
        let ok = report(vec![
            vm("a", 15, 1, 950.0),
            vm("b", 14, 1, 30.0),
            vm("c", 0, 1, 20.0),
        ]);
        let f = strict_order(&ok, 0.9);
        assert!(f.pass, "{}", f.measured);
        assert!(
            f.measured.starts_with("2/2 levels ordered"),
            "{}",
            f.measured
        );
        let tie = report(vec![
            vm("a", 15, 1, 950.0),
            vm("b", 14, 1, 20.0),
            vm("c", 0, 1, 20.0),
        ]);
        assert!(!strict_order(&tie, 0.9).pass);
        let weak_top = report(vec![vm("a", 15, 1, 60.0), vm("b", 14, 1, 40.0)]);
        assert!(!strict_order(&weak_top, 0.9).pass);
    }

    #[test]
    fn alone_share_and_latency_bounds() {
        let with = report(vec![vm("top", 15, 1, 96.0), vm("under-0", 14, 1, 4.0)]);
        let alone = report(vec![vm("top", 15, 1, 100.0)]);
        assert!(keeps_alone_share(&with, &alone, "top", 0.95).pass);
        assert!(!keeps_alone_share(&with, &alone, "top", 0.97).pass);
        let r = PolicyReport {
            hi_p99_us: Some(1300.0),
            hi_isolated_p99_us: Some(1000.0),
            ..Default::default()
        };
        assert!(!hi_p99_bound(&r, 1.05, 0.0).pass);
        assert!(hi_p99_bound(&r, 1.05, 250.0).pass);
        assert!(!hi_p99_bound(&PolicyReport::default(), 2.0, 0.0).pass);
        let r = PolicyReport {
            save_restore_us_total: 150_000.0,
            ..Default::default()
        };
        assert!(!cwsr_fraction(&r, 1000, 0.1).pass);
        assert!(cwsr_fraction(&r, 2000, 0.1).pass);
    }
}

#[cfg(test)]
mod hung_tests {
    use super::*;

    #[test]
    fn a_hung_tenant_is_reset_after_its_timeout_and_the_corunner_stays_exact() {
        let outs = hung_outcomes(&[1, 2], Policy::Hqdmux).unwrap();
        assert_eq!(outs.len(), 10);
        for o in &outs {
            assert!(o.pass, "{}: {:?} (target {})", o.name, o.measured, o.target);
        }
    }

    #[test]
    fn the_reset_follows_the_timeout_and_without_a_hang_nothing_is_reset() {
        let base = Scenario::builtin("hung").unwrap();
        let reset_at = |ms: u64, hang: bool| {
            let mut sc = base.clone();
            let h = sc.tenants.iter_mut().find(|t| t.name == "hung").unwrap();
            h.preempt_timeout_ms = Some(ms);
            h.kernels[0].no_save_point = hang;
            let run = simulate(&sc, Policy::Hqdmux, 1).unwrap();
            let v = run.vm_runs.iter().find(|v| v.name == "hung").unwrap();
            (v.first_reset_ns, run)
        };
        let (a, _) = reset_at(20, true);
        let (b, _) = reset_at(200, true);
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(b - a, 180_000_000, "the reset moves with the timeout");
        // The same long kernel with a save point is preempted and saved,
        // never reset: the scheduler time-slices it with the co-runner.
        let (none, run) = reset_at(20, false);
        assert_eq!(none, None);
        assert_eq!(run.preempt_timeouts, 0);
        assert!(corunners_exact(&run, "hung").pass);
        assert!(exactly_once(&run));
    }
}
