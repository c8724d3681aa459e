//! A short run of the promise fuzzer (issue 18, `eval::fuzz`) in the test
//! suite: a fixed set of generated scenarios — the first seeds, from 1,
//! whose scenarios fall in none of the classes the scheduler is known to
//! fail today (`eval::fuzz::KNOWN_FAILING`; the classes are a function of
//! the generated scenario, not of a run) — must keep every promise item
//! that applies to their shape, exactly-once and the decision-cost bound
//! (virtual: decisions per virtual ms; no host timing). The known-failing
//! classes have their own `#[ignore]` test until the scheduler work of
//! issue 18 lands. Long runs: `cargo run --release -p hqdmux-eval
//! --example promise_fuzz -- --count 10000 --seed S` (docs/benchmarks.md).

use eval::fuzz::{
    check, classes, generate, shrink, to_toml, Family, FuzzOptions, Generated, KNOWN_FAILING,
};
use eval::scenario::Scenario;

/// Scenarios of one check at most this many VM x virtual ms (keeps the
/// run near a minute on 2 cores; a property of the scenario, not of time).
const MAX_VM_MS: u64 = 6_000;

/// Per family, the first `n` seeds from 1 whose scenarios (of that
/// family) satisfy `keep` and cost at most [`MAX_VM_MS`].
fn seeds(n: usize, keep: impl Fn(&[&str]) -> bool) -> Vec<Generated> {
    Family::ALL
        .iter()
        .flat_map(|&f| {
            (1..5000u64)
                .map(move |s| generate(s, Some(f)))
                .filter(|g| {
                    keep(&classes(g))
                        && u64::from(g.scenario.vm_count()) * g.scenario.duration_ms <= MAX_VM_MS
                })
                .take(n)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn known(c: &[&str]) -> bool {
    c.iter().any(|c| KNOWN_FAILING.contains(c))
}

fn assert_kept(gs: &[Generated]) {
    let opts = FuzzOptions::default();
    let mut bad = Vec::new();
    for g in gs {
        let v = check(g, &opts).unwrap_or_else(|e| panic!("seed {}: {e}", g.seed));
        eprintln!(
            "seed {} {} {:?}: {} violations",
            g.seed,
            g.family.name(),
            v.classes,
            v.violations.len()
        );
        if !v.violations.is_empty() {
            bad.push(format!(
                "seed {} ({}, classes {:?}): {:?}\n{}",
                g.seed,
                g.family.name(),
                v.classes,
                v.violations,
                to_toml(&g.scenario)
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn fuzzed_scenarios_outside_the_known_failing_classes_keep_every_promise() {
    let gs = seeds(3, |c| !known(c));
    // Every family has scenarios outside the known-failing classes.
    assert_eq!(gs.len(), 3 * Family::ALL.len());
    assert_kept(&gs);
}

#[test]
#[ignore = "classes issue 18 lists as failing today (think times, co-residence, no_save_point, \
            latency edges, many VMs, aging, weights, wide RT, strict order of unlike shapes): \
            fixed by the scheduler work on branch `sched`; run with --ignored"]
fn fuzzed_scenarios_in_the_known_failing_classes_keep_every_promise() {
    assert_kept(&seeds(3, known));
}

/// Checks one regression file: its first line names its family ("#
/// promise fuzzer seed S (family F), shrunk: breaks `ITEM`"), whose items
/// are checked; without one, exactly-once and the decision-cost bound.
/// Items in `known` (still failing there for a documented reason) are
/// left out. `Some(reason)` when it fails.
fn regression_fails(f: &std::path::Path, known: &[&str]) -> Option<String> {
    let text = std::fs::read_to_string(f).unwrap();
    let sc = Scenario::load(f).unwrap_or_else(|e| panic!("{e}"));
    let family = text.lines().next().and_then(|l| {
        Family::ALL
            .into_iter()
            .find(|fam| l.contains(&format!("(family {})", fam.name())))
    });
    match family {
        Some(family) => {
            let g = Generated {
                seed: sc.seed,
                family,
                scenario: sc,
            };
            let v = check(&g, &FuzzOptions::default()).unwrap();
            // Host cost is a property of the loaded machine, not of the
            // scenario's promise (the fuzzer's `--host-bound`).
            let v: Vec<_> = v
                .violations
                .iter()
                .filter(|v| v.item != "cost-host" && !known.contains(&v.item))
                .collect();
            (!v.is_empty()).then(|| format!("{}: {:?}", f.display(), v))
        }
        None => {
            let r = eval::driver::simulate(&sc, scheduler::Policy::Hqdmux, sc.seed).unwrap();
            let dpm = eval::driver::per_virtual_ms(r.decision_ns.len() as f64, r.duration_ns);
            (!eval::promises::exactly_once(&r) || dpm > eval::fuzz::MAX_DECISIONS_PER_VIRTUAL_MS)
                .then(|| format!("{}: exactly-once or {dpm:.0} decisions/ms", f.display()))
        }
    }
}

fn regress_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/fuzz-regress")
}

/// Regressions of `eval/scenarios/fuzz-regress/` that pass now and are
/// cheap enough for the test suite (the others that pass, `fuzz-1036`,
/// `fuzz-20015` and `fuzz-20081`, take minutes in a debug build; the
/// ignored test below runs every file).
const FIXED_REGRESSIONS: &[&str] = &[
    "fuzz-1081-2-weights.toml",
    "fuzz-20011-3-undershare-latency.toml",
    "fuzz-20121-1-top-share.toml",
    "fuzz-50061-1-top-share-short.toml",
    "fuzz-61006-3-undershare-latency.toml",
    "fuzz-50067-3-undershare-latency.toml",
    "fuzz-50265-3-undershare-latency.toml",
    "fuzz-50290-3-undershare-latency.toml",
    "fuzz-50054-3-light-served.toml",
    "fuzz-94011-3-undershare-latency.toml",
    "fuzz-94021-3-undershare-latency.toml",
    "share-light-short.toml",
    "fuzz-50119-2-weights.toml",
    "fuzz-96069-2-weights.toml",
    // Closed-loop top VMs the merges of stop 31 gave a lower RT's or a
    // wide reservation at every job (docs/scheduling.md, "Stop 31's
    // merges").
    "fuzz-50009-1-top-share.toml",
    "fuzz-50130-1-top-share.toml",
    // A light VM's switch test at a wake and at the measured price
    // (docs/scheduling.md, "A light VM's switch test", branch `light3`).
    "fuzz-400123-3-light-served.toml",
    // Item 1's top share by the CU time received, kernels in flight at
    // the end included (docs/scheduling.md, "The top's CU time with
    // kernels in flight at the end", branch `fresh6`).
    "fuzz-600013-1-top-share.toml",
    // An RT's first kernel placed on its gap set before its reservation
    // narrows it (docs/scheduling.md, "An owner's reserved CUs kept
    // through its gap", branch `fresh7`).
    "fuzz-700010-3-rt-latency.toml",
    // Co-residence beside a starved lower VM whose occupancy was never
    // recorded (docs/scheduling.md, "Co-residence counts the lower VMs
    // that may run beside the owner", branch `coside9`).
    "fuzz-600002-3-be-retained.toml",
    // A change inside an aging batch kept the scheduler's timer (the eval
    // driver's, branch `fresh7`).
    "fuzz-700078-1-top-share.toml",
    // A reservation kept through its set-up save (docs/scheduling.md,
    // "A reservation kept through its set-up save", branch `rtlat9`).
    "fuzz-800135-3-rt-latency.toml",
    // Co-residence's bound counts the lower rounds the RT's sharing
    // stretches (docs/scheduling.md, "Co-residence's bound counts the
    // rounds it stretches", stop 40).
    "fuzz-900044-3-be-retained.toml",
    // An RT's first job waits once for a lower guest's waves without a
    // save point, item 4's one wait (docs/scheduling.md, "An RT job may
    // wait once for waves without a save point", stop 40).
    "fuzz-1000012-3-rt-latency.toml",
    // An RT's job held to half its interval only where a stall can come
    // (docs/scheduling.md, "An RT's job held to half its interval where
    // a stall can come", branch `behalf10`; fresh seed, stop 40).
    "fuzz-1000094-3-be-retained.toml",
    // A VM's save record kept per queue: the short saves of its other
    // queues do not lower the record below the long save an RT's set-up
    // waits for (docs/scheduling.md, "A VM's save record kept per queue",
    // branch `rtlat10`).
    "fuzz-800120-3-rt-latency.toml",
];

#[test]
fn fixed_fuzz_regressions_keep_every_promise() {
    let bad: Vec<String> = FIXED_REGRESSIONS
        .iter()
        .filter_map(|n| regression_fails(&regress_dir().join(n), &[]))
        .collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
#[ignore = "issue 18's shrunk regressions (eval/scenarios/fuzz-regress/) fail today; run with --ignored"]
fn fuzz_regression_scenarios_keep_every_promise() {
    let mut bad = Vec::new();
    for e in std::fs::read_dir(regress_dir()).unwrap() {
        let f = e.unwrap().path();
        if f.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        bad.extend(regression_fails(&f, &[]));
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The aging regressions fixed by the weighted aging server and the bound
/// per level and per job length (issue 18): the aging bound of each VM's
/// own level, strict order across levels by partition time, and the top
/// level's share of its alone CU time (`fuzz-20049`'s top had 51% of it
/// beside lower VGPR-declaring work that co-resided after each aging turn,
/// the class of `fuzz-30101`; 97% since co-residence ends for a backlogged
/// owner, `Scheduler::coreside_backlogged`).
#[test]
fn aging_and_strict_order_regressions_keep_every_promise() {
    let bad: Vec<String> = [
        "fuzz-20000-4-aging-bound.toml",
        "fuzz-20049-1-strict-order.toml",
    ]
    .iter()
    .filter_map(|n| regression_fails(&regress_dir().join(n), &[]))
    .collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn fuzz_regression_files_are_valid_scenarios() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/fuzz-regress");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let f = e.unwrap().path();
        if f.extension().is_some_and(|x| x == "toml") {
            Scenario::load(&f).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n > 0);
}

#[test]
fn a_failing_scenario_shrinks_to_a_file_that_still_fails() {
    // A regression the fuzzer found (best effort below 0.9 of alone beside
    // an RT tenant); once a mechanism fixes it there is nothing to shrink
    // and the test says so by returning.
    let f = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios/fuzz-regress/fuzz-20225-3-cwsr-time.toml");
    let sc = Scenario::load(&f).unwrap();
    let g = Generated {
        seed: sc.seed,
        family: Family::Rt,
        scenario: sc,
    };
    let opts = FuzzOptions::default();
    // Best effort of whole-CU lock-step kernels beside an RT tenant loses
    // a round to any CU taken (docs/scheduling.md, "Best effort beside
    // RT, measured"): still failing, so it still shrinks.
    let item = "3-be-retained";
    if !check(&g, &opts)
        .unwrap()
        .violations
        .iter()
        .any(|x| x.item == item)
    {
        eprintln!("{item} holds now: nothing to shrink");
        return;
    }
    let (small, sv) = shrink(&g, item, &opts, 8).unwrap();
    eprintln!("shrunk:\n{}", to_toml(&small.scenario));
    assert!(sv.violations.iter().any(|x| x.item == item));
    assert!(small.scenario.duration_ms <= g.scenario.duration_ms);
    assert!(small.scenario.vm_count() <= g.scenario.vm_count());
    assert_eq!(small.scenario.name, format!("fuzz-{}-{item}", g.seed));
    let file = to_toml(&small.scenario);
    let back = Scenario::parse(&file, "shrunk.toml").unwrap();
    assert_eq!(to_toml(&back), file);
}

/// RT regressions the reservation and co-residence work of issue 18 fixed
/// (docs/scheduling.md, "Best effort beside RT, measured"): each file with
/// the items it must keep now (`None`: every item of its family). The
/// items still broken there are physics of lock-step kernels, stated in
/// the docs.
#[test]
fn rt_regressions_fixed_by_reservations_keep_their_items() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/fuzz-regress");
    let cases: &[(&str, Option<&[&str]>)] = &[
        ("fuzz-1000-3-rt-latency.toml", None),
        ("fuzz-20048-3-be-retained.toml", None),
        ("fuzz-20023-3-rt-latency.toml", None),
        // Drained reservations: lower workgroups within one save and
        // restore end on the RT's CUs instead of being saved.
        ("fuzz-20019-3-be-retained.toml", None),
        ("fuzz-60021-3-be-retained.toml", None),
        // An aging batch pauses for a demand-limited higher VM (the RT
        // waited for batches of starved 10.8 ms whole-CU workgroups).
        ("fuzz-60024-3-rt-latency.toml", None),
        // A reservation sized by latency also fits the interval between
        // the RT's jobs (an 8 kHz RT on one CU per XCC never drained).
        ("fuzz-50032-3-rt-latency.toml", None),
        ("fuzz-60054-3-rt-latency.toml", None),
        // A wide periodic RT whose gaps the cost-aware hold held the whole
        // partition through keeps a reservation sized by its RT bound and
        // load instead (best effort 0.000 -> 0.82 of alone).
        ("fuzz-50257-3-be-retained.toml", None),
        // ... and one whose job needs more than half its period on any
        // reservation within the cap keeps one sized by the promise's
        // switch allowance over its whole period (best effort 0.000 of
        // alone -> above its 0.450 bound).
        ("fuzz-50211-3-be-retained.toml", None),
        // A narrow periodic RT keeps its reservation through gaps longer
        // than `spatial_hold_ns` while that costs the lower work (three
        // queues: only the reserved CUs) less than a lapse's saves of every
        // lower queue (CWSR 13.2% -> 0.5% of the run).
        ("fuzz-50079-3-cwsr-time.toml", None),
        // A wide periodic RT whose gaps the whole partition's hold gives
        // away keeps a reservation where that costs the lower work less
        // than a save of its queues per period (CWSR 12.9% -> 0.3%).
        ("fuzz-97202-3-cwsr-time.toml", None),
        (
            "fuzz-20225-3-cwsr-time.toml",
            Some(&["3-rt-latency", "3-cwsr-time"]),
        ),
        // The simulator: an RT workgroup placed beside lower waves that
        // are saved at once runs on alone from the trap (it kept the
        // doubled end of sharing: a whole extra round, 811 us against
        // 688). Its best effort keeps lock-step rounds beside the
        // reservation (a stated conflict).
        (
            "fuzz-50103-3-rt-latency.toml",
            Some(&["3-rt-latency", "3-cwsr-time"]),
        ),
        // The simulator: an owner beside a guest that leaves keeps only
        // the delay the guest caused (a lower VM's two queues, saved once
        // per RT period, grew their workgroups' work each save and ended
        // no job). Its RT's start-up tail is open (3-rt-latency).
        ("fuzz-50148-3-be-retained.toml", Some(&["3-be-retained"])),
        (
            "fuzz-20181-exactly-once.toml",
            Some(&["3-rt-latency", "3-cwsr-time"]),
        ),
        // Co-residence admission on the job's rounds: a 4-round RT job
        // admitted on one round's solo time ran up to 4x isolated.
        ("fuzz-50113-3-rt-latency.toml", None),
        // Co-residence or reservation by the lower work's rounds: a 716 us
        // RT of 3 workgroups co-resident with 443 lock-step workgroups of
        // 679 us delayed every full lower round (0.868 of alone); one
        // reserved CU per XCC leaves its two rounds two.
        ("fuzz-50115-3-be-retained.toml", None),
        // The simulator: a queue below its equal split packs its later
        // rounds beside the other queue's workgroups (a whole-partition RT
        // ran each kernel on fewer and fewer CUs), and a batch's guest delay
        // is at most its own length alone. 50215's best effort is open.
        ("fuzz-50183-3-rt-latency.toml", None),
        (
            "fuzz-50215-3-rt-latency.toml",
            Some(&["3-rt-latency", "3-cwsr-time"]),
        ),
        ("fuzz-50281-3-rt-latency.toml", None),
        // A drain waits for the lower VM's longest workgroup, not a
        // doorbell's sum of packets (50129: 1 ms of solo time, 50 us
        // workgroups): no save, every CU back in the gaps.
        ("fuzz-50129-3-be-retained.toml", None),
        // Two RTs at different levels pass one reservation: it keeps the
        // largest size a VM still holding it needed instead of shrinking to
        // the holder's and growing again with a save of the lower work per
        // period (CWSR 45.7% -> within 10% of the cut run). (Its lower RT
        // waited for a drain with the higher RT's jobs in between, 292 us
        // against 277, until a drain waited for the starved work an aging batch may run.)
        ("fuzz-97117-3-cwsr-time.toml", None),
        // An aging batch keeps a higher RT's held CU reservation: its
        // queues run on the other CUs and a pause for the RT saves nothing
        // (97138: a 46%-duty RT used the yield allowance up in two saved
        // pauses and waited 2 ms for the batch; 97032: each pause waited
        // for the batch's 4.85 ms `no_save_point` waves).
        ("fuzz-97138-3-rt-latency.toml", None),
        ("fuzz-97032-3-rt-latency.toml", None),
        // An RT's reservation sized by the RT bound's allowance less the
        // longest save below it, kernel by kernel by its job's CU time
        // (97236: 9 CUs per XCC where 2 meet the bound, 0.760 of alone;
        // 50142: 6 where 2 do, 0.829).
        ("fuzz-97236-3-be-retained.toml", None),
        ("fuzz-50142-3-be-retained.toml", None),
        // ... the longest save counted whole, its wait for the lower
        // guest's waves without a save point included, when the allowance
        // can absorb it (300129: a 169 us save, 84 us of it for flagged
        // waves, before a job sized for 85 us: p99 293 us against 273).
        ("fuzz-300129-3-rt-latency.toml", None),
        // Two RTs at different levels: a higher one with no reservation
        // of its own runs on the lower one's held reservation, which goes
        // back to it without a save; a reservation that changes owner
        // without growing saves nothing (CWSR 35.2% and 16.2% of the cut
        // runs before). Their best effort stays under its bound (the
        // lower RT's wide reservation sized 13-19 CUs per XCC against the
        // bound's 5; 97077's higher RT grows it with a save per period).
        (
            "fuzz-97092-3-cwsr-time.toml",
            Some(&["3-rt-latency", "3-cwsr-time"]),
        ),
        (
            "fuzz-97077-3-cwsr-time.toml",
            Some(&["3-rt-latency", "3-cwsr-time"]),
        ),
        // A wide lower RT's size is recorded too: a narrow higher RT that
        // takes its reservation over keeps it while it holds. (Its CWSR
        // time, met on branch `rttwo`, is 10.0% of the run on the merged
        // tree, at the bound: docs/scheduling.md, "Stop 31's merges".)
        ("fuzz-97041-3-cwsr-time.toml", Some(&["3-rt-latency"])),
        // A wide higher RT keeps the lower RT's larger reservation it took
        // over: the CUs are not handed to an aging batch beside it and
        // taken back with a save that spends the batch's yield allowance
        // (RT p99 2838 us on the cut run before; its best effort, 0.665
        // of alone against 0.720, stays under its bound).
        (
            "fuzz-97092-3-rt-latency.toml",
            Some(&["3-rt-latency", "3-cwsr-time"]),
        ),
        // An aging batch keeps a higher RT's reservation although the
        // partition's last save waited for another guest's waves without
        // a save point: a pause's switch counts the save, not that wait
        // (200058: the batch took the partition and the RT waited in it).
        ("fuzz-200058-3-rt-latency.toml", None),
        // A wide reservation is drained where its job and the drain fit
        // half the owner's period (best effort 0.705 -> 0.99 of alone).
        ("fuzz-97101-3-be-retained.toml", None),
        // A higher RT that may co-reside keeps a lower RT's held
        // reservation instead: the lower work is not handed the reserved
        // CUs at each of its jobs and saved at the lower RT's next one
        // (best effort 0.411 -> 0.609 of alone, CWSR 29.2% -> 3.3%).
        ("fuzz-300016-3-be-retained.toml", None),
        // An RT's job held to half its interval only where a stall can
        // come (an aging batch running or due, a backlog, a VM above it):
        // a lone RT of 62 us rounds every 183 us gets 5 CUs per XCC, not 9
        // (best effort 0.621 -> 0.687 of alone, bound 0.627).
        ("fuzz-700147-3-be-retained.toml", None),
        // A narrow RT's job timed kernel by kernel in its whole-interval
        // sizing: kernels of 44 and 76 workgroups of 51 us every 221 us
        // take 153 us on 6 CUs per XCC, not the rounds model's 204 us
        // (best effort 0.729 -> 0.836 of alone, bound 0.764).
        ("fuzz-800037-3-be-retained.toml", None),
        // A wide RT's gaps are given from the partition's CWSR budget,
        // which every save spends, not a fixed 8% of the run for the
        // gives alone (best effort 0.559 -> above its 0.579 bound; a
        // save per period is 9.7% of it, CWSR within 10%).
        ("fuzz-300111-3-be-retained.toml", None),
        // An RT co-resident above a lower kernel whose last round leaves
        // few CUs free ran lock-step on them; co-residence now counts
        // those CUs (RT p99 701 -> 257 us against 299).
        ("fuzz-200117-3-rt-latency.toml", None),
        // A wide RT's gap is priced by the saves of the VMs that run in
        // it, not by the partition's average of every save, which one
        // 3.5 ms save of a flagged VM below them kept at 683 us while
        // nothing was saved again (best effort 0.021 -> passes).
        ("fuzz-400058-3-be-retained.toml", None),
        // A periodic RT whose doubled co-resident job leaves gaps inside
        // its anticipation grace is not taken for backlogged: it keeps
        // its co-residence (best effort 0.479 -> 0.652 of alone against
        // 0.621, CWSR 7.6% -> 0.7%).
        ("fuzz-400052-3-be-retained.toml", None),
        // A wide RT whose drain of the lower workgroups leaves it no
        // reservation within the cap sets one up with a save and keeps it
        // through its gaps, where every job saved the three lower queues
        // (CWSR 21.2% of the run -> within 10%).
        ("fuzz-500045-3-cwsr-time.toml", None),
        // The RT a paused aging batch yields to keeps its reservation
        // rather than trade it for a co-residence the pause's save made
        // possible: the batch keeps it and a pause saves nothing (RT p99
        // 2131 -> 110 us against 269; docs/scheduling.md, "A paused
        // batch's RT keeps its reservation").
        ("fuzz-400110-3-rt-latency.toml", None),
        // A lower RT with no reservation of its own takes a higher RT's
        // held in the higher one's gap, instead of running on the other
        // CUs and saving the best effort at each of its jobs (146 of 191
        // preemptions; best effort 0.551 of alone against 0.566).
        ("fuzz-97041-3-be-retained.toml", None),
        // A wide RT keeps the fewest CUs that carry its job over its whole
        // period after the partition's high mark of saves, with a gap that
        // is a break, where it held its half-period size (8 CUs per XCC
        // where 6-7 do; best effort 0.653 of alone against 0.720;
        // docs/scheduling.md, "A kept wide reservation at its fewest CUs,
        // against the saves' high mark").
        ("fuzz-97092-3-be-retained.toml", None),
        // A wide RT's reservation is drained where its job fits half its
        // period and, after the lower work's drain, leaves a gap that is a
        // break (19 CUs per XCC kept through 59 us gaps: best effort 0.489
        // of alone against 0.629; docs/scheduling.md, "A wide reservation
        // drained beyond half its period").
        ("fuzz-900112-3-be-retained.toml", None),
        // A lower RT's job gets CUs of its own below a higher RT's held
        // reservation, where it sat on the higher RT's CUs and was saved
        // at each of its jobs (RT p99 1353 -> 1022 us against 1196).
        ("fuzz-600008-3-rt-latency.toml", None),
        // Co-residence priced with the RT's guests spread round robin over
        // the CUs (a CU hosts one every `N / w` jobs): 16 workgroups of
        // 97.6 us every 199 us delay a 502 us lower round by one of them,
        // 0.16, not `A / I` = 0.49; the reservation it replaces cost the
        // flagged lower kernel of 3 whole rounds a fourth (best effort
        // 0.749 -> 0.930 of alone against 0.877).
        ("fuzz-400136-3-be-retained.toml", None),
    ];
    let mut bad = Vec::new();
    for (file, items) in cases {
        let sc = Scenario::load(&dir.join(file)).unwrap_or_else(|e| panic!("{e}"));
        let g = Generated {
            seed: sc.seed,
            family: Family::Rt,
            scenario: sc,
        };
        let v = check(&g, &FuzzOptions::default()).unwrap();
        for x in &v.violations {
            if items.is_none_or(|i| i.contains(&x.item)) {
                bad.push(format!("{file}: {x:?}"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
